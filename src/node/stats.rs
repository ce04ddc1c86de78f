//! Counters a user can read and check: per peer they add up
//! (`accepted == sent + filtered + failed + queued`), and at quiescence `available == window`.

use std::fmt;
use std::time::Duration;

use crate::deliver::PoolStats;
use crate::peer::PeerState;

/// One peer's counters at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct PeerStats {
    /// Member name.
    pub name: String,
    /// Lifecycle state.
    pub state: PeerState,
    /// Messages taken by `send*` (permits acquired, queued), replies included.
    pub accepted: u64,
    /// Their transport payload bytes: the application's payload, plus a request's 12-byte
    /// header (its id and reply room) and a reply's 8-byte request id. Every `*_bytes`
    /// counter of the send side and `received_bytes` use this measure (so the counts add
    /// up in bytes too); [`delivered_bytes`](PeerStats::delivered_bytes) counts what the
    /// application is handed, without the request's header.
    pub accepted_bytes: u64,
    /// Messages published to a connection (sequence number assigned).
    pub sent: u64,
    /// Their transport payload bytes (as [`accepted_bytes`](PeerStats::accepted_bytes)).
    pub sent_bytes: u64,
    /// Messages dropped at publish time on the application's word (permits returned, never
    /// sent, not reported to `on_undelivered`): refused by the outbound filter, or
    /// [`withdrawn`](PeerStats::withdrawn).
    pub filtered: u64,
    /// Their transport payload bytes (as [`accepted_bytes`](PeerStats::accepted_bytes)).
    pub filtered_bytes: u64,
    /// ... of which requests withdrawn: given up by their requester (timed out, or the
    /// `PendingReply` dropped) before they left, so never sent and never run by the peer.
    pub withdrawn: u64,
    /// Messages that failed before publication (peer removed, node shut down, expired, too
    /// large for the peer, unreliable without a connection): each reported to
    /// [`Builder::on_undelivered`](crate::Builder::on_undelivered) (but replies).
    pub failed: u64,
    /// Their transport payload bytes (as [`accepted_bytes`](PeerStats::accepted_bytes)).
    pub failed_bytes: u64,
    /// ... of which expired while queued (`SendOptions::ttl`).
    pub expired: u64,
    /// Messages accepted and not yet published: `accepted - sent - filtered - failed`.
    pub queued: u64,
    /// Their transport payload bytes (as [`accepted_bytes`](PeerStats::accepted_bytes)).
    pub queued_bytes: u64,
    /// Messages received from this peer (duplicates excluded).
    pub received: u64,
    /// Their transport payload bytes: a request's 12-byte header and a reply's 8-byte
    /// request id included (as [`accepted_bytes`](PeerStats::accepted_bytes)).
    pub received_bytes: u64,
    /// Regular messages from this peer delivered to the handler.
    pub delivered: u64,
    /// Their application payload bytes: what the handler is handed, a request's header
    /// removed (so 50 requests of 10 bytes are 500 bytes here and 1,100 in
    /// [`received_bytes`](PeerStats::received_bytes)).
    pub delivered_bytes: u64,
    /// Payload bytes received from this peer waiting for its deliverer.
    pub delivery_queued_bytes: u64,
    /// Window bytes of this peer's messages (regular and out-of-band, at their window cost)
    /// received and not yet handled by the application: what this node holds for it now.
    /// Bounded by the peer's window, which is enforced.
    pub unconsumed_bytes: u64,
    /// The most [`unconsumed_bytes`](PeerStats::unconsumed_bytes) ever reached: at most
    /// the peer's window plus one message.
    pub unconsumed_peak: u64,
    /// Out-of-band messages from this peer delivered to the handler.
    pub oob_delivered: u64,
    /// Duplicate messages dropped (seen again after a reconnect).
    pub duplicates: u64,
    /// Messages resent after reconnects: reliable messages published on a connection that
    /// broke before the peer acknowledged them, published again on the next one. As a rate,
    /// read it with [`sent`](PeerStats::sent) at two instants: `Δresent / Δsent` over the
    /// interval is the share of the traffic that had to go twice (resends are not counted
    /// in `sent`, so the ratio can pass 1 on a connection that keeps breaking).
    pub resent: u64,
    /// Handshakes completed with this peer.
    pub connects: u64,
    /// Established connections lost.
    pub disconnects: u64,
    /// Messages published but never acknowledged (peer restarted, removed, or shutdown),
    /// replies included. [`Builder::on_undelivered`](crate::Builder::on_undelivered) is
    /// given these less the replies, which it is never handed: what it receives for a peer
    /// adds up to `failed + undelivered` less the replies among them.
    pub undelivered: u64,
    /// Send window, bytes.
    pub window: u64,
    /// Window bytes available now.
    pub available: u64,
    /// Window bytes taken: `window - available`.
    pub in_flight: u64,
    /// Total time at least one sender was parked on this peer's window (counted once
    /// however many were), a stall in progress included; it never decreases.
    pub blocked: Duration,
    /// Window bytes of unreliable messages to this peer that broken connections swallowed
    /// (permits given back at the next handshake).
    pub unreliable_lost_bytes: u64,
    /// Credit probes sent to this peer (a sender was parked for a probe interval).
    pub probes: u64,
    /// The most pool threads ever seen delivering this peer's regular messages at once
    /// (must be at most 1).
    pub max_concurrent_deliverers: usize,
    /// The most pool threads ever seen delivering this peer's out-of-band messages at once
    /// (at most its fair share, `Builder::oob_concurrency`).
    pub max_concurrent_oob: usize,
    /// Reliable messages published to the peer and not yet acknowledged by it (kept for
    /// resend), as of the IO thread's last publish or ack.
    pub unacked: u64,
    /// Round-trip time to the peer, smoothed (`srtt = 7/8 srtt + 1/8 sample`, as TCP's):
    /// the time from a probe this node sends to the ack that answers it, the two IO
    /// threads' turns included. Sampled at most once per heartbeat interval, and only while
    /// the peer owes this node no ack and no credit (so the ack can be nothing but the
    /// answer): while messages stream to the peer without pause it keeps its last value.
    /// `None` until the first sample.
    pub rtt: Option<std::time::Duration>,
    /// The last round-trip sample (see [`rtt`](PeerStats::rtt)). `None` until the first.
    pub rtt_last: Option<std::time::Duration>,
    /// Time since bytes last arrived from the peer on an established connection (any
    /// frame: data, acks, probes, heartbeats — a connected peer is heard from at least every
    /// heartbeat interval, 1 s by default), as of this snapshot. Kept across disconnects;
    /// `None` if the peer was never heard from.
    pub last_heard: Option<std::time::Duration>,
    /// This node's requests to the peer waiting for their reply now.
    pub requests_in_flight: usize,
    /// Replies from the peer that reached their request, counting the peer's word that it
    /// cannot answer one (a reply status: [`Error::ReplyFailed`](crate::Error::ReplyFailed)).
    pub replies: u64,
    /// Replies from the peer that came after their request was given up (timed out,
    /// dropped, failed), or answered a request twice: dropped.
    pub late_replies: u64,
}

/// Node-wide connection counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct ConnStats {
    /// Connections accepted by the listener.
    pub accepted: u64,
    /// Dials started.
    pub dialled: u64,
    /// Dials that failed to connect.
    pub dial_failures: u64,
    /// Handshakes completed.
    pub handshakes: u64,
    /// Handshakes refused, all reasons (by us or by the peer).
    pub refused: u64,
    /// ... of which for a wrong cluster name.
    pub refused_cluster: u64,
    /// ... of which for an unknown member.
    pub refused_unknown: u64,
    /// ... of which for a protocol version mismatch.
    pub refused_version: u64,
    /// ... of which because another live process claims the same member name (see
    /// [`RefuseReason::NameInUse`](crate::RefuseReason::NameInUse)): on the side holding
    /// the name, each second process refused; on that process, each refusal it received.
    pub name_conflicts: u64,
    /// ... of which for failed authentication (`Builder::secret`): no secret, another
    /// secret, a replayed or altered handshake, or a secret the peer has and we lack.
    pub auth_failures: u64,
    /// Handshakes that did not complete in time.
    pub handshake_timeouts: u64,
    /// ... of which accepted connections closed before `handshake_timeout` because the
    /// pending table was over half full: the deadline shrinks under pressure (see
    /// [`Builder::connection_limits`](crate::Builder::connection_limits)).
    pub pressure_timeouts: u64,
    /// Duplicate connections resolved (simultaneous dial or reconnect).
    pub tie_breaks: u64,
    /// Connections closed for a malformed or unexpected frame, a sequence gap, or a peer
    /// that sent past its window.
    pub protocol_errors: u64,
    /// ... of which because the peer sent past its window (it ignores flow control): what
    /// a peer makes this node hold is bounded by its window, whatever it sends.
    pub window_violations: u64,
    /// Times reading a connection was paused because what its peer makes this node hold
    /// exceeded the receive window ([`Builder::recv_window`](crate::Builder::recv_window)):
    /// its messages received and not yet handled, plus the replies this node owes it
    /// (queued, not yet sent: each request's reply counts as held for the requester until
    /// it leaves). Its bytes wait in the kernel (TCP pushes back on the peer) and reading
    /// resumes as soon as the handler or the reply queue brings it back within; the idle
    /// timeout does not count the pause. Pauses are flow control at work, not a fault,
    /// and can be frequent and brief:
    ///
    /// - a peer whose send window ([`Builder::window_bytes`](crate::Builder::window_bytes))
    ///   is larger than this node's receive window pauses each time it sends past it;
    /// - under request traffic, a requester credited back for requests already handled
    ///   sends new ones while their replies still wait in this node's queue (tens of
    ///   thousands of pauses in a busy request/reply run are normal);
    /// - a peer that restarted (a new incarnation) while its previous stream's messages
    ///   were still being handled holds both streams' messages at once.
    pub read_pauses: u64,
    /// Connections closed because nothing arrived for the idle timeout.
    pub idle_timeouts: u64,
    /// Accepted connections dropped at once by the limits on what strangers can make us
    /// hold ([`Builder::connection_limits`](crate::Builder::connection_limits)): the node was
    /// at its limit of open connections with no pending connection to displace, or ...
    pub refused_limit: u64,
    /// ... of which because their source address already held its share of pending
    /// connections ([`Builder::pending_per_source`](crate::Builder::pending_per_source)),
    /// every one of them accepted in the same burst as the refused one (taken in at the
    /// same instant): none had had its chance to answer, so none was displaced for it.
    pub refused_per_source: u64,
    /// Accepted connections still in their handshake (unauthenticated, with a secret) that
    /// were closed to make room for a newer connection: the oldest of the source address
    /// holding the most pending connections when the pending table or the node was full,
    /// or ...
    pub displaced: u64,
    /// ... of which the oldest of the newer connection's own source address, which held
    /// its share of pending connections
    /// ([`Builder::pending_per_source`](crate::Builder::pending_per_source)): strangers
    /// sharing a member's address make room for the member instead of keeping it out.
    pub displaced_per_source: u64,
    /// Connections closed for a TLS failure: a failed TLS handshake (unknown CA, bad or
    /// expired certificate, a peer that does not speak TLS), or a certificate not valid for
    /// the member name claimed. Always 0 without the `tls` feature.
    pub tls_failures: u64,
    /// Timers pending in the IO thread now (the housekeeping tick is always one).
    pub timers: u64,
    /// Connections open now, in any state (steady state: one per connected peer).
    pub open: u64,
    /// Connections established now (handshake done).
    pub established: u64,
    /// Accepted connections in their handshake now (with a secret: not yet
    /// authenticated); at most the `pending` of `Builder::connection_limits`.
    pub pending: u64,
}

/// A snapshot of a node's counters. `Display` prints it as a table.
///
/// ```
/// # fn main() -> Result<(), cohort::Error> {
/// let node = cohort::Node::builder("alpha")
///     .cluster("docs")
///     .peer("beta", "127.0.0.1:9") // not up: what is sent stays queued
///     .start()?;
/// node.send("beta", &b"queued"[..])?;
/// let stats = node.stats();
/// let beta = stats.peer("beta").expect("a configured peer");
/// // Every message accepted is sent, filtered, failed or still queued.
/// assert_eq!(beta.accepted, 1);
/// assert_eq!(beta.accepted, beta.sent + beta.filtered + beta.failed + beta.queued);
/// println!("{stats}");
/// # node.shutdown(std::time::Duration::from_secs(1))?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Stats {
    /// This member's name.
    pub node: String,
    /// Per peer, sorted by name.
    pub peers: Vec<PeerStats>,
    /// The delivery pool.
    pub pool: PoolStats,
    /// Connection counters.
    pub connections: ConnStats,
    /// Out-of-band messages delivered.
    pub oob_delivered: u64,
    /// The most pool threads ever seen delivering one sender's messages at once, over all
    /// senders (1 when the invariant holds and anything was delivered).
    pub max_concurrent_deliverers: usize,
    /// The journal's counters as of its last write (`None` without a journal, or before
    /// its first write).
    pub journal: Option<crate::journal::JournalStats>,
    /// Journal writes or syncs that failed (each stops the node).
    pub journal_failures: u64,
    /// Membership events dropped because [`event_capacity`](crate::Builder::event_capacity)
    /// of them were already waiting for the [`on_event`](crate::Builder::on_event) callback.
    pub events_dropped: u64,
    /// Panics of the [`on_event`](crate::Builder::on_event) callback, caught (each one
    /// logged; the event counts as handled and the next one is delivered). Handler panics
    /// are [`PoolStats::panics`](crate::PoolStats::panics).
    pub event_panics: u64,
    /// What the idle strategy did: whether the IO thread spins after work now, and how
    /// often an adaptive spin stood down.
    pub idle: crate::IdleStats,
}

impl Stats {
    /// The stats of one peer.
    pub fn peer(&self, name: &str) -> Option<&PeerStats> {
        self.peers.iter().find(|p| p.name == name)
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "node {}", self.node)?;
        // The name column fits the longest name, so every row lines up.
        let w = self
            .peers
            .iter()
            .map(|p| p.name.chars().count())
            .max()
            .unwrap_or(0)
            .max(4);
        writeln!(
            f,
            "{:<w$} {:<11} {:>10} {:>10} {:>8} {:>7} {:>8} {:>10} {:>10} {:>6} {:>6} {:>10} {:>10} {:>8} {:>8} {:>8}",
            "peer",
            "state",
            "accepted",
            "sent",
            "filtered",
            "failed",
            "queued",
            "received",
            "delivered",
            "dups",
            "resent",
            "window",
            "available",
            "blocked",
            "rtt",
            "heard"
        )?;
        for p in &self.peers {
            writeln!(
                f,
                "{:<w$} {:<11} {:>10} {:>10} {:>8} {:>7} {:>8} {:>10} {:>10} {:>6} {:>6} {:>10} {:>10} {:>8} {:>8} {:>8}",
                p.name,
                p.state,
                p.accepted,
                p.sent,
                p.filtered,
                p.failed,
                p.queued,
                p.received,
                p.delivered,
                p.duplicates,
                p.resent,
                p.window,
                p.available,
                Short(Some(p.blocked)),
                Short(p.rtt),
                Short(p.last_heard)
            )?;
        }
        writeln!(
            f,
            "pool: {} threads, {} tasks queued, {} busy, {} tasks run, {} OOB delivered, {} handler panics, max concurrent deliverers per sender {}",
            self.pool.threads,
            self.pool.queue_depth,
            self.pool.busy,
            self.pool.tasks_run,
            self.oob_delivered,
            self.pool.panics,
            self.max_concurrent_deliverers
        )?;
        let c = &self.connections;
        write!(
            f,
            "connections: {} open, {} established, {} pending, {} accepted, {} dialled ({} failed), {} handshakes, {} refused ({} cluster, {} unknown, {} version, {} name in use, {} auth), {} shed by limits ({} refused per source, {} displaced, {} of them by their own address), {} handshake timeouts ({} under pressure), {} idle timeouts, {} tie-breaks, {} protocol errors ({} past the window), {} read pauses, {} TLS failures",
            c.open,
            c.established,
            c.pending,
            c.accepted,
            c.dialled,
            c.dial_failures,
            c.handshakes,
            c.refused,
            c.refused_cluster,
            c.refused_unknown,
            c.refused_version,
            c.name_conflicts,
            c.auth_failures,
            c.refused_limit + c.displaced,
            c.refused_per_source,
            c.displaced,
            c.displaced_per_source,
            c.handshake_timeouts,
            c.pressure_timeouts,
            c.idle_timeouts,
            c.tie_breaks,
            c.protocol_errors,
            c.window_violations,
            c.read_pauses,
            c.tls_failures
        )?;
        if let Some(j) = &self.journal {
            write!(
                f,
                "\njournal: {} appends, {} records, {} bytes written, {} fsyncs, {} live segments, {} pooled, {} created, {} failures",
                j.appends,
                j.records,
                j.bytes_written,
                j.fsyncs,
                j.live_segments,
                j.pool,
                j.segments_created,
                self.journal_failures
            )?;
        } else if self.journal_failures > 0 {
            write!(f, "\njournal: {} failures", self.journal_failures)?;
        }
        let i = &self.idle;
        write!(
            f,
            "\nidle: {}, stood down {} times for load, {} for contended cores, {} turns \
             driven by senders",
            if i.spinning {
                "spinning after work"
            } else {
                "blocking when idle"
            },
            i.stood_down_loaded,
            i.stood_down_contended,
            i.driven_turns
        )?;
        if self.events_dropped > 0 {
            write!(f, "\nevents dropped: {}", self.events_dropped)?;
        }
        if self.event_panics > 0 {
            write!(f, "\non_event panics: {}", self.event_panics)?;
        }
        Ok(())
    }
}

/// A duration for the table: `-` for none, `0` for zero, otherwise three significant
/// figures or so in the unit that fits (`ns`, `µs`, `ms`, `s`). Honours width and
/// alignment.
struct Short(Option<Duration>);

impl fmt::Display for Short {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self.0 {
            None => "-".to_string(),
            Some(d) if d.is_zero() => "0".to_string(),
            Some(d) if d < Duration::from_micros(1) => format!("{}ns", d.as_nanos()),
            Some(d) if d < Duration::from_millis(1) => format!("{:.1}µs", d.as_secs_f64() * 1e6),
            Some(d) if d < Duration::from_secs(1) => format!("{:.1}ms", d.as_secs_f64() * 1e3),
            Some(d) if d < Duration::from_secs(100) => format!("{:.2}s", d.as_secs_f64()),
            Some(d) => format!("{}s", d.as_secs()),
        };
        f.pad(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IdleStats;

    fn peer(name: &str) -> PeerStats {
        PeerStats {
            name: name.to_string(),
            state: PeerState::Connected,
            accepted: 3,
            accepted_bytes: 30,
            sent: 3,
            sent_bytes: 30,
            filtered: 0,
            filtered_bytes: 0,
            withdrawn: 0,
            failed: 0,
            failed_bytes: 0,
            expired: 0,
            queued: 0,
            queued_bytes: 0,
            received: 2,
            received_bytes: 20,
            delivered: 2,
            delivered_bytes: 20,
            delivery_queued_bytes: 0,
            unconsumed_bytes: 0,
            unconsumed_peak: 0,
            oob_delivered: 0,
            duplicates: 0,
            resent: 1,
            connects: 1,
            disconnects: 0,
            undelivered: 0,
            window: 1 << 20,
            available: 1 << 20,
            in_flight: 0,
            blocked: Duration::ZERO,
            unreliable_lost_bytes: 0,
            probes: 0,
            max_concurrent_deliverers: 1,
            max_concurrent_oob: 0,
            unacked: 0,
            rtt: None,
            rtt_last: None,
            last_heard: None,
            requests_in_flight: 0,
            replies: 0,
            late_replies: 0,
        }
    }

    fn stats() -> Stats {
        let mut a = peer("a");
        a.rtt = Some(Duration::from_micros(153));
        a.rtt_last = a.rtt;
        a.last_heard = Some(Duration::from_millis(420));
        a.blocked = Duration::from_millis(2500);
        let mut long = peer("a-member-with-a-long-name");
        long.state = PeerState::Backoff;
        Stats {
            node: "n".to_string(),
            peers: vec![a, long],
            pool: PoolStats {
                threads: 4,
                queue_depth: 0,
                busy: 0,
                tasks_run: 9,
                panics: 7,
            },
            connections: ConnStats::default(),
            oob_delivered: 0,
            max_concurrent_deliverers: 1,
            journal: None,
            journal_failures: 0,
            events_dropped: 0,
            event_panics: 0,
            idle: IdleStats {
                spinning: false,
                stood_down_loaded: 3,
                stood_down_contended: 11,
                driven_turns: 5,
            },
        }
    }

    #[test]
    fn stats_table_prints_durations_readably() {
        assert_eq!(Short(None).to_string(), "-");
        assert_eq!(Short(Some(Duration::ZERO)).to_string(), "0");
        assert_eq!(Short(Some(Duration::from_nanos(40))).to_string(), "40ns");
        assert_eq!(
            Short(Some(Duration::from_micros(153))).to_string(),
            "153.0µs"
        );
        assert_eq!(
            Short(Some(Duration::from_millis(420))).to_string(),
            "420.0ms"
        );
        assert_eq!(
            Short(Some(Duration::from_millis(2500))).to_string(),
            "2.50s"
        );
        assert_eq!(Short(Some(Duration::from_secs(3600))).to_string(), "3600s");
        assert_eq!(format!("{:>6}", Short(None)), "     -");
        let table = stats().to_string();
        assert!(!table.contains("0.0ns"), "{table}");
        assert!(
            table.contains("153.0µs") && table.contains("420.0ms"),
            "{table}"
        );
    }

    #[test]
    fn stats_table_shows_panics_and_lines_up() {
        let table = stats().to_string();
        assert!(table.contains("7 handler panics"), "{table}");
        assert!(
            table.contains(
                "idle: blocking when idle, stood down 3 times for load, 11 for contended \
                 cores, 5 turns driven by senders"
            ),
            "{table}"
        );
        let rows: Vec<&str> = table.lines().skip(1).take(3).collect();
        let widths: Vec<usize> = rows.iter().map(|r| r.chars().count()).collect();
        assert!(widths.iter().all(|&w| w == widths[0]), "{table}");
        // Right-aligned columns end at the same character in every row.
        let end_of = |row: &str, col: usize| {
            let chars: Vec<char> = row.chars().collect();
            let mut ends = Vec::new();
            for i in 0..chars.len() {
                if chars[i] != ' ' && (i + 1 == chars.len() || chars[i + 1] == ' ') {
                    ends.push(i);
                }
            }
            ends[col]
        };
        for col in 2..16 {
            let e = end_of(rows[0], col);
            assert!(
                rows.iter().all(|r| end_of(r, col) == e),
                "column {col}: {table}"
            );
        }
    }
}
