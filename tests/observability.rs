//! What an operator reads off a running pair over real TCP on 127.0.0.1: the per-peer
//! round-trip time and time since last heard, the stats table, and (feature `serde`) a
//! `Stats` snapshot that survives a trip through JSON unchanged.
#![cfg(feature = "serde")]

mod support;

use std::time::Duration;

use cohort::{Node, PeerStats, Stats};
use support::*;

const MESSAGES: u64 = 300;

fn pair(
    cluster: &str,
    a_got: &std::sync::Arc<Counter>,
    b_got: &std::sync::Arc<Counter>,
) -> [Node; 2] {
    connected([
        Node::builder("a")
            .cluster(cluster)
            .pool_threads(2)
            .on_message(a_got.handler()),
        Node::builder("b")
            .cluster(cluster)
            .pool_threads(2)
            .on_message(b_got.handler()),
    ])
}

/// Both ways: `MESSAGES` from a to b, a third of that back.
fn exchange(nodes: &[Node; 2], a_got: &Counter, b_got: &Counter) {
    for i in 0..MESSAGES {
        send_patiently(&nodes[0].sender(), "b", payload(i, 64));
        if i % 3 == 0 {
            send_patiently(&nodes[1].sender(), "a", payload(i, 32));
        }
    }
    wait_until_or(
        PATIENCE,
        || b_got.get() == MESSAGES && a_got.get() == MESSAGES.div_ceil(3),
        || format!("every message delivered; stats:\n{}", all_stats(nodes)),
    );
}

fn measured(p: &PeerStats) -> bool {
    p.rtt.is_some() && p.rtt_last.is_some() && p.last_heard.is_some()
}

/// A `Stats` taken from a pair that exchanged messages (so every counter, the round trip
/// and the last-heard figures have values) serialises to JSON and reads back equal.
#[test]
fn stats_of_a_running_pair_round_trip_through_json() {
    let (a_got, b_got) = (Counter::new(), Counter::new());
    let nodes = pair("t-obs-json", &a_got, &b_got);
    exchange(&nodes, &a_got, &b_got);
    wait_windows_whole(&nodes);
    wait_until_or(
        PATIENCE,
        || nodes.iter().all(|n| n.stats().peers.iter().all(measured)),
        || {
            format!(
                "a round trip measured both ways; stats:\n{}",
                all_stats(&nodes)
            )
        },
    );

    for node in &nodes {
        let stats = node.stats();
        let p = &stats.peers[0];
        assert!(p.sent > 0 && p.received > 0 && p.connects == 1, "{stats}");
        let json = serde_json::to_string_pretty(&stats).expect("stats serialise");
        // Durations as serde writes them by default.
        assert!(json.contains("\"rtt\": {"), "{json}");
        assert!(
            json.contains("\"secs\"") && json.contains("\"nanos\""),
            "{json}"
        );
        assert!(json.contains("\"state\": \"Connected\""), "{json}");
        let back: Stats = serde_json::from_str(&json).expect("stats deserialise");
        assert_eq!(back, stats);
        // Unmeasured figures are `null` and come back as `None`.
        let mut fresh = stats.clone();
        fresh.peers[0].rtt = None;
        fresh.peers[0].last_heard = None;
        let json = serde_json::to_string(&fresh).expect("stats serialise");
        assert!(json.contains("\"rtt\":null"), "{json}");
        assert_eq!(
            serde_json::from_str::<Stats>(&json).expect("deserialise"),
            fresh
        );
    }
    shutdown_all(&nodes);
}

/// The round trip is measured again and again on a quiet connection (probes answered by
/// acks), the probes it takes are not counted as credit probes, a connected peer is heard
/// from, and the table shows the figures.
#[test]
fn round_trip_is_sampled_on_a_quiet_connection() {
    let (a_got, b_got) = (Counter::new(), Counter::new());
    let nodes = connected([
        Node::builder("a")
            .cluster("t-obs-rtt")
            .heartbeat(Duration::from_millis(20), Duration::from_secs(10))
            .on_message(a_got.handler()),
        Node::builder("b")
            .cluster("t-obs-rtt")
            .heartbeat(Duration::from_millis(20), Duration::from_secs(10))
            .on_message(b_got.handler()),
    ]);
    exchange(&nodes, &a_got, &b_got);
    let rtt_last = |n: &Node| peer_stats(n, if n.name() == "a" { "b" } else { "a" }).rtt_last;
    let mut first = Vec::new();
    for node in &nodes {
        wait_until_or(
            PATIENCE,
            || rtt_last(node).is_some(),
            || format!("a first sample; stats:\n{}", all_stats(&nodes)),
        );
        first.push(rtt_last(node));
    }
    // A sample is a measured duration: two in a row being equal to the nanosecond is not
    // what a second probe gives.
    for (node, first) in nodes.iter().zip(first) {
        wait_until_or(
            PATIENCE,
            || rtt_last(node) != first,
            || {
                format!(
                    "a second sample at {}; stats:\n{}",
                    node.name(),
                    all_stats(&nodes)
                )
            },
        );
    }
    for node in &nodes {
        let stats = node.stats();
        let p = &stats.peers[0];
        assert_eq!(p.probes, 0, "no sender was blocked: {stats}");
        assert!(measured(p), "{stats}");
        let table = stats.to_string();
        assert!(
            table.contains(" rtt ") && table.contains(" heard"),
            "{table}"
        );
        assert!(!table.contains("0.0ns"), "{table}");
        assert!(table.contains("handler panics"), "{table}");
    }
    shutdown_all(&nodes);
}

/// Before any connection, nothing is measured: the figures are `None` and the table shows
/// `-` for them.
#[test]
fn nothing_is_measured_before_a_connection() {
    let held = HeldAddr::new();
    let a = Node::builder("a")
        .cluster("t-obs-none")
        .peer("b", held.addr())
        .start()
        .expect("node starts");
    let stats = a.stats();
    let p = stats.peer("b").expect("b is a peer");
    assert_eq!(
        (p.rtt, p.rtt_last, p.last_heard),
        (None, None, None),
        "{stats}"
    );
    let row = stats
        .to_string()
        .lines()
        .find(|l| l.starts_with("b "))
        .map(str::to_string)
        .expect("a row for b");
    assert!(row.trim_end().ends_with("0        -        -"), "{row}");
    let back: Stats =
        serde_json::from_str(&serde_json::to_string(&stats).expect("serialise")).expect("read");
    assert_eq!(back, stats);
    a.shutdown(SHUTDOWN).expect("shutdown");
}

/// A handler that panics is counted in `PoolStats::panics` whether the message was regular
/// or out-of-band, and the table shows the count.
#[test]
fn handler_panics_are_counted_for_regular_and_oob_messages() {
    let seen = Counter::new();
    let b_seen = seen.clone();
    let nodes = connected([
        Node::builder("a").cluster("t-obs-panics"),
        Node::builder("b")
            .cluster("t-obs-panics")
            .on_message(move |d| {
                b_seen.add();
                if d.payload().starts_with(b"boom") {
                    panic!("a handler that fails on purpose");
                }
            }),
    ]);
    nodes[0].send("b", &b"boom: regular"[..]).expect("send");
    nodes[0]
        .send_oob("b", &b"boom: out of band"[..])
        .expect("send");
    nodes[0].send("b", &b"fine"[..]).expect("send");
    wait_until_or(
        PATIENCE,
        || seen.get() == 3 && nodes[1].stats().pool.panics == 2,
        || format!("two panics counted; stats:\n{}", all_stats(&nodes)),
    );
    assert!(nodes[1].stats().to_string().contains("2 handler panics"));
    shutdown_all(&nodes);
}
