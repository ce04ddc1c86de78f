//! Sends that find their node's IO thread parked in its poll run its turn themselves
//! (`IdleStats::driven_turns`), over real TCP on 127.0.0.1, under `IdleStrategy::Block`
//! (the IO thread parks whenever it is idle): the message leaves on the sending thread; a
//! write the socket cannot take whole is finished by the IO thread; driven turns and the IO
//! thread's own keep each sender's order, both ways at once, with mixed sizes; the
//! application's undelivered hook still runs on the IO thread only; commands and sends
//! that ring under the peer map's lock never drive a turn; with a journal, under every
//! fsync policy, a message a driven turn publishes reaches the peer only once its record
//! is in the journal files.
//!
//! Each send meant to find the IO thread parked first moves the node's clock past the
//! spacing between driven turns (`Node::advance_clock`) and waits until the thread is
//! parked (`Node::io_parked`); the thread may still wake in between (a timer, an
//! acknowledgement read), so the tests ask for at least one driven turn, never for all.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cohort::{Builder, Bytes, FsyncPolicy, IdleStrategy, Node, SendOptions};
use support::*;

/// Sends made one at a time, each after waiting for the IO thread to park.
const ROUNDS: u64 = 40;

/// Far more than the spacing between driven turns, on the node's clock.
const PAST_THE_GAP: Duration = Duration::from_millis(1);

fn blocking(name: &str, cluster: &str) -> Builder {
    Node::builder(name)
        .cluster(cluster)
        .idle_strategy(IdleStrategy::Block)
}

/// Moves `node`'s clock past the spacing between driven turns, then waits until its IO
/// thread is parked in its poll.
fn park(node: &Node) {
    node.advance_clock(PAST_THE_GAP);
    wait_until_or(
        PATIENCE,
        || node.io_parked(),
        || format!("{}'s IO thread parked:\n{}", node.name(), node.stats()),
    );
}

/// Waits until `got` has `n` messages from `a` (to `b`).
fn wait_delivered(got: &OrderCheck, n: u64, a: &Node, b: &Node) {
    wait_until_or(
        PATIENCE,
        || got.count_from("a") == n,
        || format!("{n} messages delivered:\n{}\n{}", a.stats(), b.stats()),
    );
}

/// `node`'s driven turns so far.
fn driven(node: &Node) -> u64 {
    node.idle_stats().driven_turns
}

/// Each send finds the IO thread parked (but where a timer or an acknowledgement woke it
/// first) and writes its message on the sending thread: every message arrives, in order,
/// and sends drove turns, at most one each (nothing else on `a` rings its doorbell).
#[test]
fn a_send_that_finds_the_io_thread_parked_leaves_on_the_sending_thread() {
    let got = OrderCheck::new();
    let [a, b] = connected([
        blocking("a", "t-driven-one"),
        blocking("b", "t-driven-one").on_message(got.handler()),
    ]);
    let before = driven(&a);
    for i in 0..ROUNDS {
        park(&a);
        a.send_slice("b", &payload(i, 64)).expect("send");
        wait_delivered(&got, i + 1, &a, &b);
    }
    got.assert_got_exactly("b", &["a"], ROUNDS);
    let turns = driven(&a) - before;
    assert!(
        (1..=ROUNDS).contains(&turns),
        "{turns} driven turns for {ROUNDS} sends that found the IO thread parked:\n{}",
        a.stats()
    );
    wait_window_whole(&a, "b");
    shutdown_all(&[a, b]);
}

/// A send by name that finds its peer in the node's map (the first on its thread) rings
/// under the map's read lock: that ring never drives a turn (what the turn drops or runs
/// could take the lock again, and parking_lot's locks are not reentrant); the thread's
/// next send, which finds the peer remembered, may. Each on a fresh thread.
#[test]
fn a_send_that_rings_under_the_peer_maps_lock_never_drives() {
    let got = OrderCheck::new();
    let [a, b] = connected([
        blocking("a", "t-driven-map"),
        blocking("b", "t-driven-map").on_message(got.handler()),
    ]);
    let delivered = |n: u64| wait_delivered(&got, n, &a, &b);
    let (mut under_lock, mut remembered) = (0, 0);
    for i in 0..ROUNDS / 2 {
        std::thread::scope(|s| {
            s.spawn(|| {
                park(&a);
                let before = driven(&a);
                a.send_slice("b", &payload(2 * i, 64)).expect("send");
                under_lock += driven(&a) - before;
                delivered(2 * i + 1);
                park(&a);
                let before = driven(&a);
                a.send_slice("b", &payload(2 * i + 1, 64)).expect("send");
                remembered += driven(&a) - before;
                delivered(2 * i + 2);
            });
        });
    }
    got.assert_got_exactly("b", &["a"], ROUNDS);
    assert_eq!(under_lock, 0, "a send under the map's lock drove a turn");
    assert!(remembered > 0, "no send of a remembered peer drove a turn");
    shutdown_all(&[a, b]);
}

/// A message far larger than the sender's socket buffer, sent by a driven turn: the turn
/// writes what the socket takes and leaves the rest, with the socket's writable interest
/// armed, to the IO thread, which finishes it. Every message arrives whole.
#[test]
fn a_driven_write_the_socket_cannot_take_whole_is_finished_by_the_io_thread() {
    // A tiny send buffer on loopback is slow in itself (the kernel's: about 600 ms per MiB
    // here, raw sockets alike), so the messages are a quarter of that.
    const LARGE: usize = 256 * 1024;
    const COUNT: u64 = 6;
    let got = OrderCheck::new();
    let [a, b] = connected([
        blocking("a", "t-driven-large").socket_buffers(Some(8 * 1024), None),
        blocking("b", "t-driven-large").on_message(got.handler()),
    ]);
    let before = driven(&a);
    for i in 0..COUNT {
        park(&a);
        a.send("b", payload(i, LARGE)).expect("send");
        wait_delivered(&got, i + 1, &a, &b);
    }
    got.assert_got_exactly("b", &["a"], COUNT);
    assert!(driven(&a) > before, "no send drove a turn:\n{}", a.stats());
    wait_window_whole(&a, "b");
    shutdown_all(&[a, b]);
}

/// Message `i`'s size: small ones framed by their sender, a mid-size one, and ones
/// larger than a sender frames (queued whole), in turn.
fn mixed(i: u64) -> usize {
    [8, 700, 5_000, 70_000][(i % 4) as usize]
}

/// Both members stream to each other from the first instant, with mixed sizes, and each
/// sender pauses now and then until its IO thread parks, so that its next send drives a
/// turn while the other side's stream goes on: driven turns and the IO threads' own
/// publish one stream each way, and every message arrives once, in order, with every
/// permit back.
#[test]
fn driven_and_io_thread_turns_keep_each_senders_order_both_ways() {
    const COUNT: u64 = 3_000;
    let checks = [OrderCheck::new(), OrderCheck::new()];
    let nodes = connected([
        blocking("a", "t-driven-both").on_message(checks[0].handler()),
        blocking("b", "t-driven-both").on_message(checks[1].handler()),
    ]);
    let before = nodes.each_ref().map(driven);
    std::thread::scope(|s| {
        for (me, to) in [(0, "b"), (1, "a")] {
            let node = &nodes[me];
            s.spawn(move || {
                let sender = node.sender();
                for i in 0..COUNT {
                    if i % 97 == 0 {
                        // A pause the IO thread may park in (it may not: the other
                        // stream keeps it busy); the send after it drives a turn if so.
                        node.advance_clock(PAST_THE_GAP);
                        poll_until(Duration::from_millis(200), || node.io_parked());
                    }
                    let p = payload(i, mixed(i));
                    if i % 2 == 0 {
                        send_patiently(&sender, to, p);
                    } else {
                        sender.send_slice(to, &p).expect("send_slice");
                    }
                }
            });
        }
    });
    for (check, (me, from)) in checks.iter().zip([("a", "b"), ("b", "a")]) {
        wait_until_or(
            PATIENCE,
            || check.count_from(from) == COUNT,
            || format!("{me} got every message:\n{}", all_stats(&nodes)),
        );
        check.assert_got_exactly(me, &[from], COUNT);
    }
    let turns: Vec<u64> = (0..2).map(|i| driven(&nodes[i]) - before[i]).collect();
    assert!(
        turns.iter().sum::<u64>() > 0,
        "no send drove a turn ({turns:?}):\n{}",
        all_stats(&nodes)
    );
    wait_windows_whole(&nodes);
    shutdown_all(&nodes);
}

/// A message that expires before it leaves, found so by a driven turn, is reported to the
/// application's undelivered hook on the IO thread, never inside the send that drove the
/// turn (the hook is the application's code; the sending thread may hold its locks). A
/// turn of the IO thread's own may take a send first (a timer woke it) and find it not yet
/// expired, and send it: each message is reported or delivered.
#[test]
fn an_expiry_a_driven_turn_finds_is_reported_on_the_io_thread() {
    let reports: Arc<Mutex<Vec<(String, usize)>>> = Arc::default();
    let r = reports.clone();
    let got = Counter::new();
    let [a, b] = connected([
        blocking("a", "t-driven-hook").on_undelivered(move |_peer, msgs: Vec<Bytes>| {
            let thread = std::thread::current().name().unwrap_or("").to_owned();
            r.lock().expect("reports").push((thread, msgs.len()));
        }),
        blocking("b", "t-driven-hook").on_message(got.handler()),
    ]);
    let reported = || -> u64 {
        let reports = reports.lock().expect("reports");
        reports.iter().map(|r| r.1 as u64).sum()
    };
    let before = driven(&a);
    let mut sent = 0;
    while sent < ROUNDS && driven(&a) == before {
        park(&a);
        a.send_with(
            "b",
            payload(sent, 64),
            SendOptions::new().ttl(Duration::ZERO),
        )
        .expect("send");
        sent += 1;
        wait_until_or(
            PATIENCE,
            || reported() + got.get() == sent,
            || format!("message {sent} reported or delivered:\n{}", a.stats()),
        );
    }
    assert!(
        driven(&a) > before,
        "no send drove a turn in {sent} tries:\n{}",
        a.stats()
    );
    // The driven turn's `now` comes after the send's deadline: its message expired.
    assert!(reported() > 0, "nothing reported in {sent} tries");
    for (thread, _) in reports.lock().expect("reports").iter() {
        assert_eq!(thread, "a-io", "the undelivered hook ran on {thread:?}");
    }
    shutdown_all(&[a, b]);
}

/// A command rung while the IO thread is parked is left to the IO thread's own turn, so
/// what the command promises its caller holds: `remove_peer` returns only once the removed
/// member's queued messages were reported to the undelivered hook (the report runs on the
/// IO thread, which a driven turn leaves it to). Several members, each down for good (its
/// address held, so dials to it are refused), each removed while the IO thread is parked.
#[test]
fn remove_peer_on_a_parked_io_thread_reports_before_it_returns() {
    const QUEUED: u64 = 5;
    const MEMBERS: u64 = 8;
    let reported = Counter::new();
    let r = reported.clone();
    let a = blocking("a", "t-driven-remove")
        .on_undelivered(move |_peer, msgs: Vec<Bytes>| {
            for _ in msgs {
                r.add();
            }
        })
        .start()
        .expect("a starts");
    let down = HeldAddr::new();
    for m in 0..MEMBERS {
        let name = format!("down-{m}");
        a.add_peer(&name, down.addr())
            .expect("add a member that is down");
        for i in 0..QUEUED {
            a.send_slice(&name, &payload(i, 64)).expect("queued");
        }
        park(&a);
        a.remove_peer(&name).expect("remove");
        assert_eq!(
            reported.get(),
            (m + 1) * QUEUED,
            "remove_peer of {name} returned before its report:\n{}",
            a.stats()
        );
    }
    a.shutdown(SHUTDOWN).expect("a shuts down");
}

/// A journalling node's turns are driven too: each message's record is appended by the turn
/// that publishes it (inline, on the sending thread, under `Never` and `Interval`; by the
/// writer thread under `EveryBatch`, whose marks wake the IO thread to write the bytes they
/// release), and the message reaches the peer only once its record is in the journal
/// files: the receiver's handler reads the sender's journal as each message arrives, one
/// in flight at a time, each sent after the sender's IO thread parked. Every other message
/// is 20 000 bytes (written from where it lies, behind the same gate).
#[test]
fn a_journalled_message_a_driven_turn_publishes_leaves_once_its_record_is_in_the_journal() {
    for (policy, name) in [
        (FsyncPolicy::Never, "never"),
        (FsyncPolicy::Interval(Duration::from_millis(5)), "interval"),
        (FsyncPolicy::EveryBatch, "every"),
    ] {
        let dir = TempDir::new(&format!("driven-journal-{name}"));
        let check = RecordsFirst::new();
        let cluster = format!("t-driven-journal-{name}");
        let b = receiver_b(&cluster, "127.0.0.1:0")
            .idle_strategy(IdleStrategy::Block)
            .on_message(check.handler(dir.path()))
            .start()
            .expect("b starts");
        let a = journalled_a(&cluster, dir.path(), b.local_addr())
            .idle_strategy(IdleStrategy::Block)
            .journal_fsync(policy)
            .start()
            .expect("a starts");
        wait_until("a connected", PATIENCE, || is_connected(&a, "b"));
        let before = driven(&a);
        // From a thread of its own: a thread remembers the peer its sends found in the
        // last node's map for a while, and sends that look a peer up never drive.
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 1..=ROUNDS {
                    let len = if i % 2 == 0 { 20_000 } else { 100 };
                    park(&a);
                    a.send_slice("b", &payload(i, len)).expect("send");
                    wait_until_or(
                        PATIENCE,
                        || check.got() >= i,
                        || format!("{name}: message {i} at b:\n{}\n{}", a.stats(), b.stats()),
                    );
                }
            });
        });
        let turns = driven(&a) - before;
        assert!(
            turns > 0,
            "{name}: no send drove a turn of the journalling node:\n{}",
            a.stats()
        );
        wait_window_whole(&a, "b");
        shutdown_all(&[a, b]);
        check.assert_records_first(name);
        assert_eq!(check.got(), ROUNDS, "{name}: every message once");
    }
}
