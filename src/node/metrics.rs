//! Feature `metrics`: the node's counters and gauges published through the `metrics`
//! facade. The IO thread runs [`publisher`]'s work between two turns every
//! `Builder::metrics_interval`: it takes a [`Stats`] snapshot and sets each metric to its
//! value (`Counter::absolute`, `Gauge::set`). Nothing is counted per message here: the
//! counters are the ones `Node::stats` reads. Every metric below is documented in
//! `docs/metrics.md` (a test checks that the two agree).

use std::time::Duration;

use metrics::{Label, SharedString, Unit};

use super::stats::{PeerStats, Stats};
use super::StatsSources;
use crate::net::Periodic;
use crate::peer::PeerState;

/// A per-peer counter: name, unit, description, value.
type PeerCounter = (&'static str, Unit, &'static str, fn(&PeerStats) -> u64);
/// A per-peer gauge (`None`: not set, nothing measured yet).
type PeerGauge = (
    &'static str,
    Unit,
    &'static str,
    fn(&PeerStats) -> Option<f64>,
);
/// A node-wide counter (`None`: not set, e.g. journal counters without a journal).
type NodeCounter = (&'static str, Unit, &'static str, fn(&Stats) -> Option<u64>);
/// A node-wide gauge.
type NodeGauge = (&'static str, Unit, &'static str, fn(&Stats) -> Option<f64>);

fn secs(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

/// Per-peer counters, labelled `node` and `peer`.
#[rustfmt::skip]
pub(super) const PEER_COUNTERS: &[PeerCounter] = &[
    ("cohort_messages_accepted_total", Unit::Count, "Messages taken by send* for the peer.", |p| p.accepted),
    ("cohort_accepted_bytes_total", Unit::Bytes, "Transport payload bytes of the messages taken by send* for the peer (a request's 12-byte header, a reply's 8-byte id included).", |p| p.accepted_bytes),
    ("cohort_messages_sent_total", Unit::Count, "Messages published to the peer's connection (resends not counted).", |p| p.sent),
    ("cohort_sent_bytes_total", Unit::Bytes, "Transport payload bytes of the messages published to the peer (headers as in accepted).", |p| p.sent_bytes),
    ("cohort_messages_filtered_total", Unit::Count, "Messages dropped at publication on the application's word: the outbound filter, or requests withdrawn.", |p| p.filtered),
    ("cohort_requests_withdrawn_total", Unit::Count, "Requests given up (timed out, handle dropped) before they left, never sent; part of filtered.", |p| p.withdrawn),
    ("cohort_messages_failed_total", Unit::Count, "Messages that failed before publication (removed, shut down, expired, too large), each reported to on_undelivered.", |p| p.failed),
    ("cohort_messages_expired_total", Unit::Count, "Messages that expired while queued (SendOptions::ttl); part of failed.", |p| p.expired),
    ("cohort_messages_resent_total", Unit::Count, "Messages published again after a reconnect.", |p| p.resent),
    ("cohort_messages_undelivered_total", Unit::Count, "Messages published and never acknowledged (peer restarted, removed, shutdown).", |p| p.undelivered),
    ("cohort_messages_received_total", Unit::Count, "Messages received from the peer, duplicates excluded.", |p| p.received),
    ("cohort_received_bytes_total", Unit::Bytes, "Transport payload bytes received from the peer (a request's 12-byte header, a reply's 8-byte id included).", |p| p.received_bytes),
    ("cohort_messages_delivered_total", Unit::Count, "Regular messages from the peer handed to the application.", |p| p.delivered),
    ("cohort_delivered_bytes_total", Unit::Bytes, "Application payload bytes of the regular messages from the peer handed to the application (a request's header removed).", |p| p.delivered_bytes),
    ("cohort_oob_delivered_total", Unit::Count, "Out-of-band messages from the peer handed to the application.", |p| p.oob_delivered),
    ("cohort_duplicates_total", Unit::Count, "Duplicate messages from the peer dropped after a reconnect.", |p| p.duplicates),
    ("cohort_connects_total", Unit::Count, "Handshakes completed with the peer.", |p| p.connects),
    ("cohort_disconnects_total", Unit::Count, "Established connections to the peer lost.", |p| p.disconnects),
    ("cohort_credit_probes_total", Unit::Count, "Credit probes sent to the peer (a sender parked for a probe interval).", |p| p.probes),
    ("cohort_send_blocked_microseconds_total", Unit::Microseconds, "Time at least one sender was parked on the peer's send window (counted once however many were).", |p| u64::try_from(p.blocked.as_micros()).unwrap_or(u64::MAX)),
    ("cohort_unreliable_lost_bytes_total", Unit::Bytes, "Window bytes of unreliable messages to the peer lost with broken connections.", |p| p.unreliable_lost_bytes),
    ("cohort_replies_total", Unit::Count, "Replies from the peer that reached their request.", |p| p.replies),
    ("cohort_late_replies_total", Unit::Count, "Replies from the peer that came after their request was given up, dropped.", |p| p.late_replies),
];

/// Per-peer gauges, labelled `node` and `peer`.
#[rustfmt::skip]
pub(super) const PEER_GAUGES: &[PeerGauge] = &[
    ("cohort_peer_connected", Unit::Count, "1 while the peer is connected (handshake done), else 0.", |p| Some(if p.state == PeerState::Connected { 1.0 } else { 0.0 })),
    ("cohort_queued_messages", Unit::Count, "Messages accepted for the peer and not yet published.", |p| Some(p.queued as f64)),
    ("cohort_queued_bytes", Unit::Bytes, "Transport payload bytes of the messages accepted for the peer and not yet published.", |p| Some(p.queued_bytes as f64)),
    ("cohort_unacked_messages", Unit::Count, "Reliable messages published to the peer and not yet acknowledged.", |p| Some(p.unacked as f64)),
    ("cohort_window_bytes", Unit::Bytes, "The peer's send window.", |p| Some(p.window as f64)),
    ("cohort_window_available_bytes", Unit::Bytes, "Send window bytes available now.", |p| Some(p.available as f64)),
    ("cohort_window_in_flight_bytes", Unit::Bytes, "Send window bytes taken now (window - available).", |p| Some(p.in_flight as f64)),
    ("cohort_delivery_queued_bytes", Unit::Bytes, "Payload bytes received from the peer waiting for their deliverer.", |p| Some(p.delivery_queued_bytes as f64)),
    ("cohort_unconsumed_bytes", Unit::Bytes, "Window bytes of the peer's messages received and not yet handled by the application.", |p| Some(p.unconsumed_bytes as f64)),
    ("cohort_requests_in_flight", Unit::Count, "Requests to the peer waiting for their reply.", |p| Some(p.requests_in_flight as f64)),
    ("cohort_rtt_seconds", Unit::Seconds, "Smoothed round-trip time to the peer (probe to ack; EWMA 1/8).", |p| secs(p.rtt)),
    ("cohort_rtt_last_seconds", Unit::Seconds, "The last round-trip sample to the peer.", |p| secs(p.rtt_last)),
    ("cohort_last_heard_seconds", Unit::Seconds, "Time since bytes last arrived from the peer on an established connection.", |p| secs(p.last_heard)),
];

/// Node-wide counters, labelled `node`.
#[rustfmt::skip]
pub(super) const NODE_COUNTERS: &[NodeCounter] = &[
    ("cohort_pool_tasks_total", Unit::Count, "Delivery pool tasks run.", |s| Some(s.pool.tasks_run)),
    ("cohort_pool_panics_total", Unit::Count, "Handler panics caught by the delivery pool.", |s| Some(s.pool.panics)),
    ("cohort_connections_accepted_total", Unit::Count, "Connections accepted by the listener.", |s| Some(s.connections.accepted)),
    ("cohort_dials_total", Unit::Count, "Dials started.", |s| Some(s.connections.dialled)),
    ("cohort_dial_failures_total", Unit::Count, "Dials that failed to connect.", |s| Some(s.connections.dial_failures)),
    ("cohort_handshakes_total", Unit::Count, "Handshakes completed.", |s| Some(s.connections.handshakes)),
    ("cohort_handshakes_refused_total", Unit::Count, "Handshakes refused, all reasons, by either side.", |s| Some(s.connections.refused)),
    ("cohort_name_conflicts_total", Unit::Count, "Handshakes refused because another live process claims the same member name.", |s| Some(s.connections.name_conflicts)),
    ("cohort_auth_failures_total", Unit::Count, "Handshakes refused for failed authentication.", |s| Some(s.connections.auth_failures)),
    ("cohort_handshake_timeouts_total", Unit::Count, "Handshakes that did not complete in time.", |s| Some(s.connections.handshake_timeouts)),
    ("cohort_connections_shed_total", Unit::Count, "Accepted connections dropped by the connection limits (refused or displaced).", |s| Some(s.connections.refused_limit + s.connections.displaced)),
    ("cohort_idle_timeouts_total", Unit::Count, "Connections closed because nothing arrived for the idle timeout.", |s| Some(s.connections.idle_timeouts)),
    ("cohort_protocol_errors_total", Unit::Count, "Connections closed for a protocol error.", |s| Some(s.connections.protocol_errors)),
    ("cohort_tie_breaks_total", Unit::Count, "Duplicate connections resolved.", |s| Some(s.connections.tie_breaks)),
    ("cohort_read_pauses_total", Unit::Count, "Times reading a connection was paused for a peer over the receive window (its unhandled messages and the replies owed to it).", |s| Some(s.connections.read_pauses)),
    ("cohort_tls_failures_total", Unit::Count, "Connections closed for a TLS failure.", |s| Some(s.connections.tls_failures)),
    ("cohort_spin_stood_down_loaded_total", Unit::Count, "Times the adaptive idle spin stood down because the IO thread worked more than half of a 2 ms window.", |s| Some(s.idle.stood_down_loaded)),
    ("cohort_spin_stood_down_contended_total", Unit::Count, "Times the adaptive idle spin stood down because its yields gave the core to other threads for more than 200 µs of a window.", |s| Some(s.idle.stood_down_contended)),
    ("cohort_driven_turns_total", Unit::Count, "Turns of the IO thread that another thread (a send, a reply, returned credit) ran itself, finding the IO thread parked: what they published was written with no hand-off to the IO thread.", |s| Some(s.idle.driven_turns)),
    ("cohort_events_dropped_total", Unit::Count, "Membership events dropped because the event queue was full.", |s| Some(s.events_dropped)),
    ("cohort_event_panics_total", Unit::Count, "Panics of the on_event callback, caught.", |s| Some(s.event_panics)),
    ("cohort_journal_failures_total", Unit::Count, "Journal writes or syncs that failed (each stops the node).", |s| Some(s.journal_failures)),
    ("cohort_journal_appends_total", Unit::Count, "Journal batches written.", |s| s.journal.map(|j| j.appends)),
    ("cohort_journal_records_total", Unit::Count, "Journal records appended.", |s| s.journal.map(|j| j.records)),
    ("cohort_journal_written_bytes_total", Unit::Bytes, "Journal record bytes written.", |s| s.journal.map(|j| j.bytes_written)),
    ("cohort_journal_fsyncs_total", Unit::Count, "fsync calls on journal segment files.", |s| s.journal.map(|j| j.fsyncs)),
    ("cohort_journal_segments_created_total", Unit::Count, "Journal segment files created.", |s| s.journal.map(|j| j.segments_created)),
];

/// Node-wide gauges, labelled `node`.
#[rustfmt::skip]
pub(super) const NODE_GAUGES: &[NodeGauge] = &[
    ("cohort_pool_threads", Unit::Count, "Delivery pool worker threads.", |s| Some(s.pool.threads as f64)),
    ("cohort_pool_queue_depth", Unit::Count, "Delivery pool tasks waiting in the queue.", |s| Some(s.pool.queue_depth as f64)),
    ("cohort_pool_busy", Unit::Count, "Delivery pool workers running a task.", |s| Some(s.pool.busy as f64)),
    ("cohort_spinning", Unit::Count, "1 while the IO thread spins after work (the idle strategy), else 0.", |s| Some(if s.idle.spinning { 1.0 } else { 0.0 })),
    ("cohort_connections_open", Unit::Count, "Connections open, in any state.", |s| Some(s.connections.open as f64)),
    ("cohort_connections_established", Unit::Count, "Connections established (handshake done).", |s| Some(s.connections.established as f64)),
    ("cohort_connections_pending", Unit::Count, "Accepted connections in their handshake.", |s| Some(s.connections.pending as f64)),
    ("cohort_journal_live_segments", Unit::Count, "Journal segments holding live records.", |s| s.journal.map(|j| j.live_segments as f64)),
    ("cohort_journal_pooled_segments", Unit::Count, "Empty journal segments in the pool.", |s| s.journal.map(|j| j.pool as f64)),
];

/// The IO thread's periodic work for `every` (none when zero).
pub(super) fn publisher(every: Duration, sources: StatsSources) -> Option<Periodic> {
    if every.is_zero() {
        return None;
    }
    Some(Periodic {
        every,
        run: Box::new(move || publish(&sources.collect())),
    })
}

/// Sets every metric to its value in `stats`, describing them first. The recorder is looked
/// up at each call, so one installed after the node started is fed from then on.
pub(super) fn publish(stats: &Stats) {
    describe();
    let node = SharedString::from(stats.node.clone());
    let node_labels = [Label::new("node", node.clone())];
    for &(name, _, _, value) in NODE_COUNTERS {
        if let Some(v) = value(stats) {
            metrics::counter!(name, node_labels.iter()).absolute(v);
        }
    }
    for &(name, _, _, value) in NODE_GAUGES {
        if let Some(v) = value(stats) {
            metrics::gauge!(name, node_labels.iter()).set(v);
        }
    }
    for p in &stats.peers {
        let labels = [
            Label::new("node", node.clone()),
            Label::new("peer", p.name.clone()),
        ];
        for &(name, _, _, value) in PEER_COUNTERS {
            metrics::counter!(name, labels.iter()).absolute(value(p));
        }
        for &(name, _, _, value) in PEER_GAUGES {
            if let Some(v) = value(p) {
                metrics::gauge!(name, labels.iter()).set(v);
            }
        }
    }
}

fn describe() {
    for &(name, unit, text, _) in PEER_COUNTERS {
        metrics::describe_counter!(name, unit, text);
    }
    for &(name, unit, text, _) in NODE_COUNTERS {
        metrics::describe_counter!(name, unit, text);
    }
    for &(name, unit, text, _) in PEER_GAUGES {
        metrics::describe_gauge!(name, unit, text);
    }
    for &(name, unit, text, _) in NODE_GAUGES {
        metrics::describe_gauge!(name, unit, text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric is in `docs/metrics.md`, on a table row with its kind, its unit and its
    /// labels; and the table names no metric that is not published.
    #[test]
    fn metrics_match_their_documentation() {
        let doc = include_str!("../../docs/metrics.md");
        let rows: Vec<Vec<String>> = doc
            .lines()
            .filter(|l| l.starts_with("| `cohort_"))
            .map(|l| {
                l.trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().trim_matches('`').to_string())
                    .collect()
            })
            .collect();
        let mut published = Vec::new();
        let mut check = |name: &str, kind: &str, unit: Unit, labels: &str| {
            published.push(name.to_string());
            let row = rows
                .iter()
                .find(|r| r[0] == name)
                .unwrap_or_else(|| panic!("{name} is not in docs/metrics.md"));
            assert_eq!(row[1], kind, "{name}: kind");
            assert_eq!(row[2], unit.as_str(), "{name}: unit");
            assert_eq!(row[3], labels, "{name}: labels");
        };
        for &(name, unit, _, _) in PEER_COUNTERS {
            check(name, "counter", unit, "node, peer");
        }
        for &(name, unit, _, _) in PEER_GAUGES {
            check(name, "gauge", unit, "node, peer");
        }
        for &(name, unit, _, _) in NODE_COUNTERS {
            check(name, "counter", unit, "node");
        }
        for &(name, unit, _, _) in NODE_GAUGES {
            check(name, "gauge", unit, "node");
        }
        for r in &rows {
            assert!(
                published.contains(&r[0]),
                "{} is documented, not published",
                r[0]
            );
        }
        let mut unique = published.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), published.len(), "a metric name is used twice");
    }
}
