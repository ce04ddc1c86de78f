//! The durable outbox across restarts, over real TCP on 127.0.0.1: what a journalling member
//! and its peer promise each other — credit, unreliable bytes, the handshake's counts, the
//! stream's sequence numbers — stays true when the sender restarts, when the receiver
//! restarts, when the peer comes back as a new incarnation, and when the sender's journal
//! lost its unsynced tail.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cohort::{Delivery, Node};
use support::*;

/// Member `b` of `cluster` listening on `listen`, admitting any member, counting the
/// messages it handles in `got`.
fn counting_receiver(
    cluster: &str,
    listen: impl std::net::ToSocketAddrs,
    got: &Arc<Counter>,
) -> Node {
    receiver_b(cluster, listen)
        .on_message(got.handler())
        .start()
        .expect("b starts")
}

/// A journalling sender restarts with the same launch id, so its peer keeps returning
/// credit for messages of the previous process. Messages that were acknowledged but not yet
/// credited at the restart must be charged to the new window, like the unacked ones
/// restored from the journal: otherwise their late credit releases permits of *new*
/// messages that the receiver has not consumed, and the receiver ends up holding two
/// windows.
#[test]
fn credit_for_acked_messages_of_the_previous_process_never_over_releases_the_window() {
    const WINDOW: u64 = 64 << 10;
    let dir = TempDir::new("credit-restart");
    let old_gate = Gate::new();
    let new_gate = Gate::new();
    let old_done = Arc::new(AtomicU64::new(0));
    let (og, ng, od) = (old_gate.clone(), new_gate.clone(), old_done.clone());
    // b does not journal: it acks on receipt and returns credit once handled.
    let b = receiver_b("credit-restart", "127.0.0.1:0")
        .window_bytes(WINDOW)
        .on_message(move |d: Delivery| {
            let n = counter_of(d.payload()).unwrap();
            if n < 1000 {
                og.pass();
                od.fetch_add(1, Ordering::SeqCst);
            } else {
                ng.pass();
            }
        })
        .start()
        .expect("b starts");
    let sender = || {
        journalled_a("credit-restart", dir.path(), b.local_addr())
            .window_bytes(WINDOW)
            .redial_quickly()
            .start()
            .expect("a starts")
    };
    let a = sender();
    let tx = a.sender();
    wait_until("a connected", PATIENCE, || is_connected(&a, "b"));
    let old = fill_window(&tx, "b", 0, 1000);
    assert_eq!(old, WINDOW / 1016, "one window of old messages");
    // A clean shutdown waits for b's acks (b acks on receipt; its handler is blocked, so
    // no credit has come back).
    wait_until("b received the old messages", PATIENCE, || {
        peer_stats(&b, "a").received == old
    });
    let report = a.shutdown(SHUTDOWN).expect("a stops");
    assert_eq!(report.undelivered, 0);
    drop((tx, a));

    let a = sender();
    let tx = a.sender();
    wait_until("a reconnected", PATIENCE, || is_connected(&a, "b"));
    let first = fill_window(&tx, "b", 1000, 1000);
    // b handles the old messages: their credit goes back to the restarted a.
    old_gate.open();
    wait_until("old messages handled", PATIENCE, || {
        old_done.load(Ordering::SeqCst) == old
    });
    // The old credit back at a.
    wait_window_whole(&a, "b");
    let second = fill_window(&tx, "b", 1000 + first, 1000);
    let held = first + second;
    eprintln!("first {first} second {second} stats:\n{}", a.stats());
    let b_queued = peer_stats(&b, "a").delivery_queued_bytes;
    new_gate.open();
    assert!(
        held <= WINDOW / 1016,
        "b has consumed none of the new messages, yet a was let send {held} of them \
         ({first} + {second}; b holds {b_queued} bytes for a): more than one window"
    );
    shutdown_all(&[a, b]);
}

/// A journalling receiver restarts with the same launch id, and must not count the
/// unreliable window bytes it received from zero again: at the handshake the sender would
/// take every unreliable byte it ever sent to that incarnation for lost with the connection
/// and give the permits back (`Descriptor::unreliable_lost` / `Ledger::forget`), although
/// those messages were delivered and their credit already returned; the release would be
/// taken from the reliable messages outstanding, and the sender could exceed its window.
#[test]
fn a_receiver_restart_never_gives_back_permits_of_unreliable_messages_already_credited() {
    const WINDOW: u64 = 64 << 10;
    let a_dir = TempDir::new("unreliable-restart-a");
    let b_dir = TempDir::new("unreliable-restart-b");
    // Both incarnations of b listen here.
    let b_addr = HeldAddr::new();
    let handled = Counter::new();
    let gate = Gate::new();
    let receiver = |block: bool| {
        let (h, g) = (handled.clone(), gate.clone());
        receiver_b("unreliable-restart", b_addr.addr())
            .window_bytes(WINDOW)
            .journal(b_dir.path())
            .on_message(move |_d: Delivery| {
                if block {
                    g.pass();
                }
                h.add();
            })
            .start()
            .expect("b starts")
    };
    let b = receiver(false);
    let a = journalled_a("unreliable-restart", a_dir.path(), b_addr.addr())
        .window_bytes(WINDOW)
        .redial_quickly()
        .start()
        .expect("a starts");
    wait_until("a connected", PATIENCE, || is_connected(&a, "b"));
    // 32 unreliable messages, delivered and credited.
    let opts = cohort::SendOptions::new().unreliable();
    for i in 0..32 {
        a.send_with("b", payload(i, 1000), opts).expect("send");
    }
    wait_until("unreliable ones handled", PATIENCE, || handled.get() == 32);
    wait_window_whole(&a, "b");
    b.shutdown(SHUTDOWN).expect("b stops");
    drop(b);
    wait_until("a sees b gone", PATIENCE, || !is_connected(&a, "b"));
    // b is down: a journals a window of reliable messages.
    let tx = a.sender();
    let first = fill_window(&tx, "b", 100, 1000);
    assert_eq!(first, WINDOW / 1016);
    // b comes back (same launch id, from its journal) with a handler that holds everything.
    let b = receiver(true);
    wait_until("b received the reliable ones", PATIENCE, || {
        b.stats().peer("a").is_some_and(|p| p.received >= first)
    });
    let second = fill_window(&tx, "b", 100 + first, 1000);
    let p = peer_stats(&a, "b");
    gate.open();
    assert_eq!(
        second, 0,
        "b has handled none of the {first} reliable messages, yet a could send {second} more \
         (a: window {} available {} in flight {}, unreliable lost bytes {})",
        p.window, p.available, p.in_flight, p.unreliable_lost_bytes
    );
    shutdown_all(&[a, b]);
}

/// Runs: b up, one message a -> b delivered, b down, `a` sends 10 while b is down, b comes
/// back as a new incarnation (no journal on b: new launch id). Returns (delivered to the
/// new b, undelivered at a).
fn sends_while_peer_is_down(journal: Option<&std::path::Path>, cluster: &str) -> (u64, u64) {
    // Both incarnations of b listen here.
    let b_addr = HeldAddr::new();
    let got = Counter::new();
    let receiver = || counting_receiver(cluster, b_addr.addr(), &got);
    let b = receiver();
    let a = sender_a(cluster, b_addr.addr(), journal)
        .redial_quickly()
        .start()
        .expect("a starts");
    send_patiently(&a.sender(), "b", payload(0, 100));
    wait_until("first delivered", PATIENCE, || got.get() == 1);
    // Credit comes back in an ack, which also acknowledges the message.
    wait_window_whole(&a, "b");
    b.shutdown(SHUTDOWN).expect("b stops");
    drop(b);
    wait_until("a sees b gone", PATIENCE, || !is_connected(&a, "b"));
    for i in 1..=10 {
        send_patiently(&a.sender(), "b", payload(i, 100));
    }
    if journal.is_some() {
        a.sync_journal(PATIENCE).expect("synced");
    }
    got.reset();
    let b = receiver();
    wait_until_or(
        PATIENCE,
        || got.get() + peer_stats(&a, "b").undelivered >= 10,
        || format!("the 10 delivered or undelivered:\n{}", a.stats()),
    );
    let r = (got.get(), peer_stats(&a, "b").undelivered);
    shutdown_all(&[a, b]);
    r
}

/// Messages sent while the peer is down never left this node: when the peer comes back as
/// a new incarnation they are not "unacknowledged messages to its old incarnation" to
/// retire (`bind_incarnation`), even though a journalling sender may have sequenced them
/// already. Without a journal they wait in the queue and reach the new incarnation; turning
/// the journal on must not lose them.
#[test]
fn messages_sent_while_the_peer_is_down_reach_its_next_incarnation() {
    let control = sends_while_peer_is_down(None, "peer-down-plain");
    assert_eq!(control, (10, 0), "without a journal: all delivered");
    let dir = TempDir::new("peer-down");
    let journalled = sends_while_peer_is_down(Some(dir.path()), "peer-down-journal");
    assert_eq!(
        journalled,
        (10, 0),
        "with a journal: (delivered, undelivered) to b's new incarnation"
    );
}

/// Acks follow the disk, and so must the handshake. On a reconnect a journalling receiver
/// tells the sender what its journal holds as delivered, not its raw received count
/// (`adopt` / `answer_hello`): the sender retires at `resume` what that count covers. If
/// the receiver then stops before handling them (a crash; here a shutdown whose pool is
/// stuck, so no final record), its journal says "delivered 0", and messages the sender
/// retired on the raw count would be lost.
#[test]
fn the_handshake_does_not_acknowledge_what_the_receivers_journal_lacks() {
    let dir = TempDir::new("handshake-durable");
    // Both incarnations of b listen here.
    let b_addr = HeldAddr::new();
    let gate = Gate::new();
    let first_b = Counter::new();
    let second_b = Counter::new();
    let receiver = |count: Arc<Counter>, gate: Option<Arc<Gate>>| {
        receiver_b("handshake-durable", b_addr.addr())
            .journal(dir.path())
            .on_message(move |_d: Delivery| {
                if let Some(g) = &gate {
                    g.pass();
                }
                count.add();
            })
            .start()
            .expect("b starts")
    };
    let b = receiver(first_b.clone(), Some(gate.clone()));
    let a = sender_a("handshake-durable", b_addr.addr(), None)
        .redial_quickly()
        .start()
        .expect("a starts");
    for i in 0..10 {
        send_patiently(&a.sender(), "b", payload(i, 100));
    }
    wait_until("b received all 10", PATIENCE, || {
        b.stats().peer("a").is_some_and(|p| p.received == 10)
    });
    // The handler is stuck on the first one: nothing is recorded, nothing acknowledged.
    a.disconnect("b").expect("disconnect");
    wait_until("a reconnected", PATIENCE, || {
        let p = peer_stats(&a, "b");
        p.connects >= 2 && is_connected(&a, "b")
    });
    // b stops before its handler got anywhere (as a crash would).
    let _ = b.shutdown(Duration::from_millis(200));
    gate.open();
    drop(b);
    let b = receiver(second_b.clone(), None);
    send_patiently(&a.sender(), "b", payload(10, 100));
    wait_until_or(
        PATIENCE,
        || second_b.get() >= 1,
        || format!("the marker delivered:\n{}\n{}", a.stats(), b.stats()),
    );
    // Everything a sent is acknowledged: b's journal recorded it as handled. (A quiet
    // moment at b is not enough: a writes its resends with the handshake, and the marker
    // queued meanwhile only after, so b may have handled the resends before the marker
    // arrives.)
    wait_window_whole(&a, "b");
    let delivered_by_first = first_b.get();
    let delivered_by_second = second_b.get();
    let undelivered = peer_stats(&a, "b").undelivered;
    shutdown_all(&[a, b]);
    assert_eq!(
        delivered_by_second, 11,
        "b's journal recorded none of the 10 as delivered (the stopped b's stuck handler ran \
         {delivered_by_first} only after its journal was gone; a crash would not have), so \
         the restarted b must get them again; a retired them at the reconnect's handshake \
         ({undelivered} undelivered)"
    );
}

/// With `FsyncPolicy::Never` or `Interval`, a machine crash can take the journal's unsynced
/// tail while the peer already holds those messages (they leave after the append, before
/// the sync). Here the tail is cut by damaging the record of message 14, seq 15 (recovery
/// cuts the journal there): the restarted sender resumes at seq 15 while the peer has
/// received 20. Were that (`AckBeyondSent` at `resume`) a protocol error, the connection
/// would be closed, redialled and fail again for ever, and nothing would reach the peer any
/// more: the sender must get past it.
#[test]
fn a_sender_whose_journal_lost_its_tail_can_still_talk_to_its_peer() {
    let dir = TempDir::new("lost-tail");
    let got = Counter::new();
    let b = counting_receiver("lost-tail", "127.0.0.1:0", &got);
    let sender = || {
        journalled_a("lost-tail", dir.path(), b.local_addr())
            .journal_fsync(cohort::FsyncPolicy::Never)
            .reconnect_backoff(Duration::from_millis(5), Duration::from_millis(20))
            .start()
            .expect("a starts")
    };
    let a = sender();
    for i in 0..20 {
        send_patiently(&a.sender(), "b", payload(i, 200));
    }
    wait_until("b got 20", PATIENCE, || got.get() == 20);
    a.shutdown(SHUTDOWN).expect("a stops");
    drop(a);
    // Damage message 14's record (its payload in the segment file): recovery cuts there.
    let needle = payload(14, 200);
    let mut hit = false;
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let path = e.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        if let Some(pos) = bytes
            .windows(needle.len())
            .position(|w| w == needle.as_slice())
        {
            bytes[pos + 100] ^= 0xff;
            std::fs::write(&path, &bytes).unwrap();
            hit = true;
        }
    }
    assert!(hit, "message 14 found in the journal");
    let a = sender();
    send_patiently(&a.sender(), "b", payload(20, 200));
    wait_until_or(
        PATIENCE,
        || got.get() > 20 || a.stats().connections.protocol_errors >= 5,
        || format!("new message or protocol errors:\n{}", a.stats()),
    );
    let (delivered, errors) = (got.get(), a.stats().connections.protocol_errors);
    shutdown_all(&[a, b]);
    assert!(
        delivered > 20,
        "after losing its journal's tail a never reaches b again: {errors} protocol errors"
    );
}
