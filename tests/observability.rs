//! What an operator reads off a running pair over real TCP on 127.0.0.1: the per-peer
//! round-trip time and time since last heard, the stats table, and (feature `serde`) a
//! `Stats` snapshot that survives a trip through JSON unchanged.
#![cfg(feature = "serde")]

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// A forwarder that delays every byte by `one_way` in each direction (a link with that
/// propagation delay), for every connection it accepts; `cut_all` breaks those open.
struct DelayLink {
    addr: std::net::SocketAddr,
    sockets: Arc<Mutex<Vec<TcpStream>>>,
    /// While set, connections are closed as soon as accepted.
    refusing: Arc<AtomicBool>,
}

impl DelayLink {
    fn start(target: std::net::SocketAddr, one_way: Duration) -> DelayLink {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the delay link");
        let addr = listener.local_addr().expect("its address");
        let sockets: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let refusing = Arc::new(AtomicBool::new(false));
        let (kept, refuse) = (sockets.clone(), refusing.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                if refuse.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let mut open = kept.lock().unwrap();
                for s in [&client, &server] {
                    open.push(s.try_clone().expect("clone"));
                }
                drop(open);
                for (from, to) in [
                    (
                        client.try_clone().expect("clone"),
                        server.try_clone().expect("clone"),
                    ),
                    (server, client),
                ] {
                    delay_one_way(from, to, one_way);
                }
            }
        });
        DelayLink {
            addr,
            sockets,
            refusing,
        }
    }

    fn refuse(&self, on: bool) {
        self.refusing.store(on, Ordering::SeqCst);
    }

    fn cut_all(&self) {
        for s in self.sockets.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Copies `from` to `to`, each chunk leaving `delay` after it arrived (the sleep paces the
/// simulated link; nothing waits on it for an event).
fn delay_one_way(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0
                || tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for (due, bytes) in rx {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// Over a link with 30 ms each way, no round-trip sample is shorter than 60 ms — before and
/// after a reconnect, where the dialler's ack on the handshake's last frame (it acks
/// whenever it has ever returned credit) is on its way when the acceptor may probe, and
/// must not be taken for the probe's answer.
#[test]
fn round_trip_samples_are_never_shorter_than_the_link() {
    const ONE_WAY: Duration = Duration::from_millis(30);
    let a_got = Counter::new();
    let b = Node::builder("b")
        .cluster("t-obs-delay")
        .allow_unknown_members(true)
        .heartbeat(Duration::from_millis(200), Duration::from_secs(10))
        .start()
        .expect("start b");
    let link = DelayLink::start(b.local_addr(), ONE_WAY);
    let a = Node::builder("a")
        .cluster("t-obs-delay")
        .peer("b", link.addr)
        .heartbeat(Duration::from_millis(200), Duration::from_secs(10))
        .on_message(a_got.handler())
        .start()
        .expect("start a");
    wait_until("a connected to b", PATIENCE, || is_connected(&a, "b"));
    wait_until("b to know a", PATIENCE, || is_connected(&b, "a"));
    // b sends to a, and a returns the credit: the dialler will ack on the next handshake.
    for i in 0..5 {
        send_patiently(&b.sender(), "a", payload(i, 64));
    }
    wait_until("a to take b's messages", PATIENCE, || a_got.get() == 5);
    wait_window_whole(&b, "a");

    let mut samples: Vec<Duration> = Vec::new();
    let mut watch = |until: &dyn Fn(&[Duration]) -> bool, what: &str| {
        let reached = poll_until(PATIENCE, || {
            let last = peer_stats(&b, "a").rtt_last;
            if let Some(d) = last.filter(|d| samples.last() != Some(d)) {
                samples.push(d);
            }
            until(&samples)
        });
        assert!(
            reached,
            "timed out waiting for {what}; samples so far {samples:?}"
        );
        samples.clone()
    };
    let before = watch(&|s| !s.is_empty(), "a first sample at b").len();
    // Cut, and keep a away for two heartbeats, so that b may probe as soon as the new
    // connection is established.
    let connects = peer_stats(&a, "b").connects;
    link.refuse(true);
    link.cut_all();
    wait_until("b not to hear from a for two heartbeats", PATIENCE, || {
        peer_stats(&b, "a")
            .last_heard
            .is_some_and(|d| d >= Duration::from_millis(400))
    });
    link.refuse(false);
    wait_until("a to reconnect to b", PATIENCE, || {
        peer_stats(&a, "b").connects > connects && is_connected(&a, "b")
    });
    let samples = watch(
        &|s| s.len() >= before + 3,
        "three samples at b after the reconnect",
    );
    assert!(
        samples.iter().all(|d| *d >= 2 * ONE_WAY),
        "a sample shorter than the link's round trip ({:?}): {samples:?}",
        2 * ONE_WAY
    );
    shutdown_all(&[a, b]);
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
