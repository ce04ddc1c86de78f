//! No peer can hurt another (design invariant 9), over real TCP on 127.0.0.1:
//!
//! - a peer that ignores credit is closed when it passes its window, and what the receiver
//!   held for it never exceeded that window;
//! - a peer with a larger window than the receiver holds is read only while it holds less
//!   (its connection paused, TCP pushing back), and loses nothing;
//! - members with different windows exchange everything, each holding at most its own;
//! - one sender's out-of-band flood into a slow handler takes only its share of the pool:
//!   another sender's stream goes through while the flood is still queued;
//! - a handler blocked for longer than the idle timeout stalls only its own sender, and
//!   neither connection is closed for silence.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use cohort::internals::flow::cost;
use cohort::internals::wire::{self, CloseCode};
use cohort::{Delivery, Node};
use support::*;

const CLUSTER: &str = "t-isolation";

/// Writes `count` reliable data frames of `size` bytes, numbered from 1, as fast as the
/// socket takes them, ignoring credit; returns how many were written before the receiver
/// closed the connection (if it did).
fn flood(mut s: TcpStream, count: u64, size: usize) -> JoinHandle<u64> {
    thread::spawn(move || {
        let mut frame = Vec::new();
        for seq in 1..=count {
            frame.clear();
            wire::encode_data(
                &mut frame,
                wire::FLAG_RELIABLE,
                Some(seq),
                &payload(seq - 1, size),
            );
            if s.write_all(&frame).is_err() {
                return seq - 1;
            }
        }
        count
    })
}

/// A receiver that admits unknown members, blocks its handler on `gate` for messages from
/// `blocked_sender`, and checks the order of everyone else's.
fn receiver(
    name: &str,
    gate: &Arc<Gate>,
    blocked_sender: &str,
) -> (cohort::Builder, Arc<OrderCheck>) {
    let blocked_sender = blocked_sender.to_owned();
    let check = OrderCheck::new();
    let (g, c) = (gate.clone(), check.clone());
    let b = Node::builder(name)
        .cluster(CLUSTER)
        .allow_unknown_members(true)
        .on_message(move |d: Delivery| {
            if d.from() == blocked_sender {
                g.pass();
            }
            c.record(&d);
        });
    (b, check)
}

/// A good member streaming `n` messages to `to`, from another thread.
fn stream_from(a: &Node, to: &str, first: u64, n: u64) -> JoinHandle<()> {
    let (s, to) = (a.sender(), to.to_owned());
    thread::spawn(move || {
        for i in first..first + n {
            send_patiently(&s, &to, payload(i, 100));
        }
    })
}

#[test]
fn a_peer_that_ignores_credit_is_closed_and_never_held_past_its_window() {
    const PEER_WINDOW: u64 = 256 * 1024;
    const SIZE: usize = 64 * 1024;
    let gate = Gate::new();
    let (b, got) = receiver("ignores-b", &gate, "ignores-credit");
    let b = b.window_bytes(1 << 20).start().expect("start b");
    let a = Node::builder("ignores-a")
        .cluster(CLUSTER)
        .peer(b.name(), b.local_addr())
        .start()
        .expect("start a");
    let good = stream_from(&a, b.name(), 0, 2_000);
    let me = raw::identity(CLUSTER, "ignores-credit", PEER_WINDOW, None);
    let mut s = raw::dial(b.local_addr(), me, b.name(), PATIENCE);
    // Its handler is blocked: no credit ever comes back, and it sends 100 messages of
    // 64 KiB (6.4 MiB) on a window of 256 KiB.
    let writer = flood(s.try_clone().expect("clone"), 100, SIZE);
    assert_eq!(raw::closed_with(&mut s), Some(CloseCode::Protocol));
    let written = writer.join().expect("writer");
    good.join().expect("good sender");
    wait_until("the good member's stream delivered", PATIENCE, || {
        got.count_from(a.name()) == 2_000
    });
    let st = b.stats();
    assert_eq!(st.connections.window_violations, 1, "{st}");
    let p = peer_stats(&b, "ignores-credit");
    assert!(
        p.unconsumed_peak <= PEER_WINDOW,
        "held {} bytes for a peer whose window is {PEER_WINDOW}:\n{st}",
        p.unconsumed_peak
    );
    // Three messages fit in its window; the fourth broke it.
    assert_eq!(p.received, PEER_WINDOW / cost(SIZE), "{st}");
    assert!(written >= 4, "the flood stopped early: {written}");
    let pa = peer_stats(&b, a.name());
    assert_eq!(
        (pa.connects, pa.disconnects),
        (1, 0),
        "a undisturbed:\n{st}"
    );
    got.assert_ok();
    gate.open();
    shutdown_all(&[a, b]);
}

#[test]
fn a_peer_with_a_larger_window_is_read_only_within_the_receive_window() {
    // 3 MiB in 48 messages: a pause falls between messages.
    read_only_within_the_receive_window("larger", 64 * 1024, 48);
}

#[test]
fn a_peer_with_a_larger_window_is_paused_inside_a_read_of_small_messages() {
    // 3 MiB in 32 768 messages, hundreds to a read: a pause falls inside a run.
    read_only_within_the_receive_window("larger-small", 84, 32 * 1024);
}

/// A peer (named `{name}-window`) that declares a 1 GiB window floods the receiver with
/// `count` messages of `size` bytes while its handler is blocked: the receiver holds at most
/// its receive window of them (and the message that crossed it), reads nothing more until
/// the handler catches up, and delivers every one in order once it does, while another
/// member's stream goes through meanwhile.
fn read_only_within_the_receive_window(name: &str, size: usize, count: u64) {
    const RECV_WINDOW: u64 = 256 * 1024;
    let raw_name = &format!("{name}-window");
    let gate = Gate::new();
    let (b, got) = receiver(&format!("{name}-b"), &gate, raw_name);
    let b = b.recv_window(RECV_WINDOW).start().expect("start b");
    let a = Node::builder(&format!("{name}-a"))
        .cluster(CLUSTER)
        .peer(b.name(), b.local_addr())
        .start()
        .expect("start a");
    // It declares a 1 GiB window: honest about it, it may send that much. The receiver
    // holds only its receive window of it and leaves the rest in the kernel.
    let me = raw::identity(CLUSTER, raw_name, 1 << 30, None);
    let s = raw::dial(b.local_addr(), me, b.name(), PATIENCE);
    let writer = flood(s.try_clone().expect("clone"), count, size);
    wait_until_or(
        PATIENCE,
        || b.stats().connections.read_pauses > 0,
        || format!("b paused reading the peer:\n{}", b.stats()),
    );
    // Everyone else goes on.
    stream_from(&a, b.name(), 0, 2_000)
        .join()
        .expect("good sender");
    wait_until("the good member's stream delivered", PATIENCE, || {
        got.count_from(a.name()) == 2_000
    });
    let held = peer_stats(&b, raw_name);
    assert!(
        held.unconsumed_peak <= RECV_WINDOW + cost(size),
        "held {} bytes with a receive window of {RECV_WINDOW}:\n{}",
        held.unconsumed_peak,
        b.stats()
    );
    gate.open();
    wait_until_or(
        PATIENCE,
        || got.count_from(raw_name) == count,
        || format!("every message of the paused peer:\n{}", b.stats()),
    );
    assert_eq!(writer.join().expect("writer"), count);
    let st = b.stats();
    assert_eq!(st.connections.protocol_errors, 0, "{st}");
    assert_eq!(st.connections.idle_timeouts, 0, "{st}");
    let p = peer_stats(&b, raw_name);
    assert_eq!((p.connects, p.disconnects), (1, 0), "{st}");
    assert!(p.unconsumed_peak <= RECV_WINDOW + cost(size), "{st}");
    got.assert_ok();
    drop(s);
    shutdown_all(&[a, b]);
}

#[test]
fn members_with_different_windows_exchange_everything_each_holding_at_most_its_own() {
    const SMALL: u64 = 128 * 1024;
    const N: u64 = 3_000;
    let (got_a, got_b) = (OrderCheck::new(), OrderCheck::new());
    let gb = got_b.clone();
    let b = Node::builder("windows-b")
        .cluster(CLUSTER)
        .window_bytes(SMALL)
        .on_message(move |d: Delivery| {
            gb.record(&d);
            // A handler slower than the sender, so the sender's larger window fills.
            std::thread::sleep(Duration::from_micros(20));
        })
        .start()
        .expect("start b");
    let a = Node::builder("windows-a")
        .cluster(CLUSTER)
        .window_bytes(4 << 20)
        .peer(b.name(), b.local_addr())
        .on_message(got_a.handler())
        .start()
        .expect("start a");
    b.add_peer(a.name(), a.local_addr()).expect("add_peer");
    let size = |i: u64| 8 + (i as usize * 7919) % 20_000;
    let (sa, sb) = (a.sender(), b.sender());
    let (an, bn) = (a.name().to_owned(), b.name().to_owned());
    let to_b = thread::spawn(move || {
        for i in 0..N {
            send_patiently(&sa, &bn, payload(i, size(i)));
        }
    });
    let to_a = thread::spawn(move || {
        for i in 0..N {
            send_patiently(&sb, &an, payload(i, size(i)));
        }
    });
    to_b.join().expect("a's sender");
    to_a.join().expect("b's sender");
    let nodes = [a, b];
    wait_until_or(
        PATIENCE,
        || got_a.total() == N && got_b.total() == N,
        || format!("both streams delivered:\n{}", all_stats(&nodes)),
    );
    got_a.assert_ok();
    got_b.assert_ok();
    let held_at_b = peer_stats(&nodes[1], nodes[0].name()).unconsumed_peak;
    assert!(
        held_at_b <= SMALL + cost(20_008),
        "b held {held_at_b} bytes for a with a window of {SMALL}"
    );
    for n in &nodes {
        let s = n.stats();
        assert_eq!(s.connections.protocol_errors, 0, "{s}");
        assert!(s.peers.iter().all(|p| p.disconnects == 0), "{s}");
    }
    shutdown_all(&nodes);
}

/// Rate of `n` messages from `from` to `to`'s handler, in messages per second.
fn timed_stream(from: &Node, to: &Node, check: &OrderCheck, first: u64, n: u64) -> f64 {
    let started = Instant::now();
    stream_from(from, to.name(), first, n)
        .join()
        .expect("sender");
    wait_until_or(
        PATIENCE,
        || check.count_from(from.name()) >= first + n,
        || {
            format!(
                "{} messages from {}:\n{}",
                first + n,
                from.name(),
                to.stats()
            )
        },
    );
    n as f64 / started.elapsed().as_secs_f64()
}

#[test]
fn an_oob_flood_into_a_slow_handler_leaves_another_sender_its_share_of_the_pool() {
    const FLOOD: u64 = 10_000;
    const STREAM: u64 = 20_000;
    let flooded = Arc::new(AtomicU64::new(0));
    let (check, f) = (OrderCheck::new(), flooded.clone());
    let c = check.clone();
    let b = Node::builder("share-b")
        .cluster(CLUSTER)
        .allow_unknown_members(true)
        .pool_threads(2)
        .on_message(move |d: Delivery| {
            if d.is_oob() {
                // A slow handler for the flooding sender's messages: 200 µs of work each.
                std::thread::sleep(Duration::from_micros(200));
                f.fetch_add(1, Ordering::SeqCst);
            } else {
                c.record(&d);
            }
        })
        .start()
        .expect("start b");
    let flooder = Node::builder("share-flooder")
        .cluster(CLUSTER)
        .peer(b.name(), b.local_addr())
        .start()
        .expect("start flooder");
    let streamer = Node::builder("share-streamer")
        .cluster(CLUSTER)
        .peer(b.name(), b.local_addr())
        .start()
        .expect("start streamer");
    let alone = timed_stream(&streamer, &b, &check, 0, STREAM);
    // 10,000 empty OOB messages at 200 µs each: 2 s of one thread's time, well within the
    // flooder's window (16 window bytes each).
    let fs = flooder.sender();
    let to = b.name().to_owned();
    let flood = thread::spawn(move || {
        for _ in 0..FLOOD {
            fs.send_oob(&to, Vec::new()).expect("send_oob");
        }
    });
    wait_until("the flood reached the handler", PATIENCE, || {
        flooded.load(Ordering::SeqCst) > 0
    });
    let beside = timed_stream(&streamer, &b, &check, STREAM, STREAM);
    let flooded_meanwhile = flooded.load(Ordering::SeqCst);
    println!(
        "stream alone {alone:.0} msg/s, beside the OOB flood {beside:.0} msg/s ({:.2}x); {flooded_meanwhile} of {FLOOD} flood messages handled meanwhile",
        beside / alone
    );
    assert!(
        flooded_meanwhile < FLOOD,
        "the stream waited for the whole flood: {flooded_meanwhile} of {FLOOD} handled first"
    );
    flood.join().expect("flooder");
    wait_until_or(
        PATIENCE,
        || flooded.load(Ordering::SeqCst) == FLOOD,
        || format!("the whole flood handled:\n{}", b.stats()),
    );
    let st = b.stats();
    let p = peer_stats(&b, flooder.name());
    assert!(
        p.max_concurrent_oob <= 1,
        "the flooder took more than its share (1 of 2 threads): {}\n{st}",
        p.max_concurrent_oob
    );
    assert_eq!(p.oob_delivered, FLOOD, "{st}");
    let s = peer_stats(&b, streamer.name());
    assert_eq!((s.connects, s.disconnects), (1, 0), "{st}");
    assert_eq!(st.connections.idle_timeouts, 0, "{st}");
    check.assert_ok();
    shutdown_all(&[flooder, streamer, b]);
}

/// Makes `span` pass on the clocks of `nodes` (`Node::advance_clock`), `step` at a time:
/// after each step every node has judged its timeouts as of its new time and heard from
/// each of its peers since the step, before the next. The time passes with every loop
/// running (one jump of the whole span would be a loop that did not look for that long,
/// the fault of `tests/held_loop.rs`); a step well short of the idle timeout leaves room
/// for a peer's heartbeats as between two ticks. Stops early once a node has closed a
/// connection for silence (the caller's checks then say so).
fn pass_time(nodes: &[&Node], span: Duration, step: Duration) {
    let mut passed = Duration::ZERO;
    while passed < span {
        let moved: Vec<Instant> = nodes.iter().map(|n| n.advance_clock(step)).collect();
        for (n, at) in nodes.iter().zip(moved) {
            wait_until_or(
                PATIENCE,
                || {
                    let st = n.stats();
                    let heard = st
                        .peers
                        .iter()
                        .all(|p| p.last_heard.is_some_and(|h| h < step));
                    n.timeouts_judged_at().is_some_and(|j| j >= at)
                        && (heard || st.connections.idle_timeouts > 0)
                },
                || {
                    format!(
                        "{} judged, and heard from every peer:\n{}",
                        n.name(),
                        n.stats()
                    )
                },
            );
        }
        if nodes
            .iter()
            .any(|n| n.stats().connections.idle_timeouts > 0)
        {
            return;
        }
        passed += step;
    }
}

#[test]
fn a_handler_blocked_past_the_idle_timeout_stalls_only_its_sender_and_is_not_silence() {
    const BLOCKED: u64 = 5_000;
    const STREAM: u64 = 5_000;
    let gate = Gate::new();
    let blocked = Arc::new(AtomicU64::new(0));
    let (check, g, bl) = (OrderCheck::new(), gate.clone(), blocked.clone());
    let c = check.clone();
    let heartbeat = Duration::from_millis(20);
    let idle = Duration::from_millis(150);
    // The default pool (at least 4 threads): `a` takes at most 1 + 2 of them.
    let b = Node::builder("blocked-b")
        .cluster(CLUSTER)
        .allow_unknown_members(true)
        .heartbeat(heartbeat, idle)
        .on_message(move |d: Delivery| {
            if d.from() == "blocked-a" {
                g.pass();
                bl.fetch_add(1, Ordering::SeqCst);
            } else {
                c.record(&d);
            }
        })
        .start()
        .expect("start b");
    let member = |name: &str| {
        Node::builder(name)
            .cluster(CLUSTER)
            .heartbeat(heartbeat, idle)
            .window_bytes(64 * 1024)
            .peer(b.name(), b.local_addr())
            .start()
            .expect("start a member")
    };
    let a = member("blocked-a");
    let other = member("blocked-other");
    // `a`'s regular and out-of-band messages: its handler blocks on the first of each, its
    // window fills, and its sends park.
    let (sa, to) = (a.sender(), b.name().to_owned());
    let from_a = thread::spawn(move || {
        for i in 0..BLOCKED {
            let r = if i % 2 == 0 {
                sa.send_timeout(&to, payload(i, 100), PATIENCE)
            } else {
                sa.send_oob(&to, payload(i, 100))
            };
            r.expect("a's send");
        }
    });
    stream_from(&other, b.name(), 0, STREAM)
        .join()
        .expect("other's sender");
    wait_until("the other member's stream delivered", PATIENCE, || {
        check.count_from(other.name()) == STREAM
    });
    // Blocked for four idle timeouts, on every member's clock: acks, credit probes and
    // heartbeats keep both connections alive while nothing of `a`'s is handled.
    pass_time(&[&a, &other, &b], idle * 4, idle / 4);
    let st = b.stats();
    assert_eq!(blocked.load(Ordering::SeqCst), 0, "the gate held:\n{st}");
    assert_eq!(st.connections.idle_timeouts, 0, "{st}");
    assert!(!from_a.is_finished(), "a's window never filled:\n{st}");
    gate.open();
    from_a.join().expect("a's sender");
    wait_until_or(
        PATIENCE,
        || blocked.load(Ordering::SeqCst) == BLOCKED,
        || format!("every message of a:\n{}", b.stats()),
    );
    let st = b.stats();
    for name in [a.name(), other.name()] {
        let p = peer_stats(&b, name);
        assert_eq!((p.connects, p.disconnects), (1, 0), "{name}:\n{st}");
    }
    assert_eq!(st.connections.idle_timeouts, 0, "{st}");
    let sa = a.stats();
    assert_eq!(sa.connections.idle_timeouts, 0, "{sa}");
    check.assert_ok();
    shutdown_all(&[a, other, b]);
}

/// The frames one read brings are admitted as one run up to whatever is not the next
/// message: a duplicate among them is counted and dropped, an unreliable message keeps its
/// place, and a gap closes the connection with what came before it delivered once, in
/// order.
#[test]
fn a_duplicate_inside_a_read_is_dropped_and_a_gap_closes_after_what_came_before() {
    let got = Arc::new(std::sync::Mutex::new(Vec::new()));
    let g = got.clone();
    let b = Node::builder("runs-b")
        .cluster(CLUSTER)
        .allow_unknown_members(true)
        .on_message(move |d: Delivery| {
            let mut g = g.lock().expect("not poisoned");
            g.push((d.seq(), d.payload().to_vec()));
        })
        .start()
        .expect("start b");
    let me = raw::identity(CLUSTER, "runs-raw", 1 << 20, None);
    let mut s = raw::dial(b.local_addr(), me, b.name(), PATIENCE);
    // (sequence number, payload) in the order written; `None`: unreliable.
    let frames: [(Option<u64>, &[u8]); 9] = [
        (Some(1), b"one"),
        (Some(2), b"two"),
        (Some(3), b"three"),
        (Some(2), b"two again"),
        (None, b"unreliable"),
        (Some(4), b"four"),
        (Some(5), b"five"),
        (Some(7), b"seven, after a gap"),
        (Some(8), b"eight"),
    ];
    let mut buf = Vec::new();
    for (seq, payload) in frames {
        let flags = if seq.is_some() {
            wire::FLAG_RELIABLE
        } else {
            0
        };
        wire::encode_data(&mut buf, flags, seq, payload);
    }
    s.write_all(&buf).expect("write the frames at once");
    assert_eq!(raw::closed_with(&mut s), Some(CloseCode::Protocol));
    let want: Vec<(Option<u64>, Vec<u8>)> = [
        (Some(1), &b"one"[..]),
        (Some(2), b"two"),
        (Some(3), b"three"),
        (None, b"unreliable"),
        (Some(4), b"four"),
        (Some(5), b"five"),
    ]
    .into_iter()
    .map(|(s, p)| (s, p.to_vec()))
    .collect();
    wait_until("the messages before the gap delivered", PATIENCE, || {
        got.lock().expect("not poisoned").len() >= want.len()
    });
    assert_eq!(*got.lock().expect("not poisoned"), want);
    let p = peer_stats(&b, "runs-raw");
    assert_eq!((p.received, p.duplicates), (6, 1), "{}", b.stats());
    assert_eq!(b.stats().connections.protocol_errors, 1, "{}", b.stats());
    shutdown_all(&[b]);
}
