//! The durable outbox across restarts and failures, over real TCP on 127.0.0.1: what a
//! journalling member promises its peer (credit, unreliable bytes, acks, the handshake's
//! counts) stays true when it or its peer restarts, when the peer is down, when the journal
//! loses its tail or fails to write.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use cohort::{Delivery, Node};
use support::*;

/// A gate a handler can wait on until the test opens it.
#[derive(Default)]
struct Gate(Mutex<bool>, Condvar);
impl Gate {
    fn wait(&self) {
        let mut g = self.0.lock().unwrap();
        while !*g {
            g = self.1.wait(g).unwrap();
        }
    }
    fn open(&self) {
        *self.0.lock().unwrap() = true;
        self.1.notify_all();
    }
}

/// Member "b" of `cluster` listening on `listen`, admitting any member, counting the
/// messages it handles in `got`.
fn counting_receiver(
    cluster: &str,
    listen: impl std::net::ToSocketAddrs,
    got: &Arc<AtomicU64>,
) -> Node {
    let g = got.clone();
    Node::builder("b")
        .cluster(cluster)
        .listen(listen)
        .allow_unknown_members(true)
        .on_message(move |_d: Delivery| {
            g.fetch_add(1, Ordering::SeqCst);
        })
        .start()
        .expect("b starts")
}

fn fill(tx: &cohort::Sender, to: &str, from: u64) -> u64 {
    let mut n = 0;
    while tx.try_send(to, payload(from + n, 1000)).is_ok() {
        n += 1;
    }
    n
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
    let b_addr = reserve_addr();
    let old_gate = Arc::new(Gate::default());
    let new_gate = Arc::new(Gate::default());
    let old_done = Arc::new(AtomicU64::new(0));
    let (og, ng, od) = (old_gate.clone(), new_gate.clone(), old_done.clone());
    // b does not journal: it acks on receipt and returns credit once handled.
    let b = Node::builder("b")
        .cluster("credit-restart")
        .listen(b_addr)
        .window_bytes(WINDOW)
        .allow_unknown_members(true)
        .on_message(move |d: Delivery| {
            let n = counter_of(d.payload()).unwrap();
            if n < 1000 {
                og.wait();
                od.fetch_add(1, Ordering::SeqCst);
            } else {
                ng.wait();
            }
        })
        .start()
        .expect("b starts");
    let sender = || {
        Node::builder("a")
            .cluster("credit-restart")
            .window_bytes(WINDOW)
            .journal(dir.path())
            .peer("b", b_addr)
            .reconnect_backoff(Duration::from_millis(5), Duration::from_millis(50))
            .start()
            .expect("a starts")
    };
    let a = sender();
    let tx = a.sender();
    wait_until("a connected", PATIENCE, || is_connected(&a, "b"));
    let old = fill(&tx, "b", 0);
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
    let first = fill(&tx, "b", 1000);
    // b handles the old messages: their credit goes back to the restarted a.
    old_gate.open();
    wait_until("old messages handled", PATIENCE, || {
        old_done.load(Ordering::SeqCst) == old
    });
    wait_until_or(
        PATIENCE,
        || {
            let p = peer_stats(&a, "b");
            p.available == p.window
        },
        || format!("old credit back at a:\n{}", a.stats()),
    );
    let second = fill(&tx, "b", 1000 + first);
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
    let b_addr = reserve_addr();
    let handled = Arc::new(AtomicU64::new(0));
    let gate = Arc::new(Gate::default());
    let receiver = |block: bool| {
        let (h, g) = (handled.clone(), gate.clone());
        Node::builder("b")
            .cluster("unreliable-restart")
            .listen(b_addr)
            .window_bytes(WINDOW)
            .journal(b_dir.path())
            .allow_unknown_members(true)
            .on_message(move |_d: Delivery| {
                if block {
                    g.wait();
                }
                h.fetch_add(1, Ordering::SeqCst);
            })
            .start()
            .expect("b starts")
    };
    let b = receiver(false);
    let a = Node::builder("a")
        .cluster("unreliable-restart")
        .window_bytes(WINDOW)
        .journal(a_dir.path())
        .peer("b", b_addr)
        .reconnect_backoff(Duration::from_millis(5), Duration::from_millis(50))
        .start()
        .expect("a starts");
    wait_until("a connected", PATIENCE, || is_connected(&a, "b"));
    // 32 unreliable messages, delivered and credited.
    let opts = cohort::SendOptions::new().unreliable();
    for i in 0..32 {
        a.send_with("b", payload(i, 1000), opts).expect("send");
    }
    wait_until("unreliable ones handled", PATIENCE, || {
        handled.load(Ordering::SeqCst) == 32
    });
    wait_until_or(
        PATIENCE,
        || {
            let p = peer_stats(&a, "b");
            p.available == p.window
        },
        || format!("a's window whole:\n{}", a.stats()),
    );
    b.shutdown(SHUTDOWN).expect("b stops");
    drop(b);
    wait_until("a sees b gone", PATIENCE, || !is_connected(&a, "b"));
    // b is down: a journals a window of reliable messages.
    let tx = a.sender();
    let first = fill(&tx, "b", 100);
    assert_eq!(first, WINDOW / 1016);
    // b comes back (same launch id, from its journal) with a handler that holds everything.
    let b = receiver(true);
    wait_until("b received the reliable ones", PATIENCE, || {
        b.stats().peer("a").is_some_and(|p| p.received >= first)
    });
    let second = fill(&tx, "b", 100 + first);
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
    let b_addr = reserve_addr();
    let got = Arc::new(AtomicU64::new(0));
    let receiver = || counting_receiver(cluster, b_addr, &got);
    let b = receiver();
    let mut ab = Node::builder("a")
        .cluster(cluster)
        .peer("b", b_addr)
        .reconnect_backoff(Duration::from_millis(5), Duration::from_millis(50));
    if let Some(dir) = journal {
        ab = ab.journal(dir);
    }
    let a = ab.start().expect("a starts");
    send_patiently(&a.sender(), "b", payload(0, 100));
    wait_until("first delivered", PATIENCE, || {
        got.load(Ordering::SeqCst) == 1
    });
    // Credit comes back in an ack, which also acknowledges the message.
    wait_until("credited and acked", PATIENCE, || {
        let p = peer_stats(&a, "b");
        p.available == p.window
    });
    b.shutdown(SHUTDOWN).expect("b stops");
    drop(b);
    wait_until("a sees b gone", PATIENCE, || !is_connected(&a, "b"));
    for i in 1..=10 {
        send_patiently(&a.sender(), "b", payload(i, 100));
    }
    if journal.is_some() {
        a.sync_journal(PATIENCE).expect("synced");
    }
    got.store(0, Ordering::SeqCst);
    let b = receiver();
    wait_until_or(
        PATIENCE,
        || {
            let p = peer_stats(&a, "b");
            got.load(Ordering::SeqCst) + p.undelivered >= 10
        },
        || format!("the 10 delivered or undelivered:\n{}", a.stats()),
    );
    let r = (got.load(Ordering::SeqCst), peer_stats(&a, "b").undelivered);
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

/// With a journal, an ack triggered by `ack_threshold` (`after_data` -> `send_ack`) usually
/// finds the handler not done yet and writes nothing; it must be tried again, since nothing
/// else asks unless credit crosses half a window or the idle-credit tick fires: with
/// `credit_on_idle(false)` a handled message would never be acknowledged, and the sender's
/// shutdown would report it undelivered.
#[test]
fn a_threshold_ack_that_finds_the_handler_behind_is_retried() {
    let dir = TempDir::new("threshold-ack");
    let got = Arc::new(AtomicU64::new(0));
    let g = got.clone();
    let b = Node::builder("b")
        .cluster("threshold-ack")
        .journal(dir.path())
        .ack_threshold(1)
        .credit_on_idle(false)
        .allow_unknown_members(true)
        .on_message(move |_d: Delivery| {
            g.fetch_add(1, Ordering::SeqCst);
        })
        .start()
        .expect("b starts");
    let a = Node::builder("a")
        .cluster("threshold-ack")
        .peer("b", b.local_addr())
        .start()
        .expect("a starts");
    send_patiently(&a.sender(), "b", payload(0, 100));
    wait_until("delivered", PATIENCE, || got.load(Ordering::SeqCst) == 1);
    let report = a.shutdown(Duration::from_secs(3)).expect("a stops");
    assert_eq!(
        report.undelivered, 0,
        "b handled the message (and its journal recorded it) but never acknowledged it"
    );
    b.shutdown(SHUTDOWN).expect("b stops");
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
    let b_addr = reserve_addr();
    let gate = Arc::new(Gate::default());
    let first_b = Arc::new(AtomicU64::new(0));
    let second_b = Arc::new(AtomicU64::new(0));
    let receiver = |count: Arc<AtomicU64>, gate: Option<Arc<Gate>>| {
        Node::builder("b")
            .cluster("handshake-durable")
            .listen(b_addr)
            .journal(dir.path())
            .allow_unknown_members(true)
            .on_message(move |d: Delivery| {
                if let Some(g) = &gate {
                    g.wait();
                }
                count.fetch_add(1, Ordering::SeqCst);
                let _ = d;
            })
            .start()
            .expect("b starts")
    };
    let b = receiver(first_b.clone(), Some(gate.clone()));
    let a = Node::builder("a")
        .cluster("handshake-durable")
        .peer("b", b_addr)
        .reconnect_backoff(Duration::from_millis(5), Duration::from_millis(50))
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
        || second_b.load(Ordering::SeqCst) >= 1,
        || format!("the marker delivered:\n{}\n{}", a.stats(), b.stats()),
    );
    wait_until("quiet", PATIENCE, || {
        b.stats()
            .peer("a")
            .is_some_and(|p| p.delivery_queued_bytes == 0)
    });
    let delivered_by_first = first_b.load(Ordering::SeqCst);
    let delivered_by_second = second_b.load(Ordering::SeqCst);
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

/// Runs: b down, `a` sends one message with a 50 ms ttl, the ttl passes, b comes up.
/// Returns (delivered at b, expired at a).
fn ttl_while_peer_is_down(journal: Option<&std::path::Path>, cluster: &str) -> (u64, u64) {
    let b_addr = reserve_addr();
    let mut ab = Node::builder("a")
        .cluster(cluster)
        .peer("b", b_addr)
        .reconnect_backoff(Duration::from_millis(5), Duration::from_millis(50));
    if let Some(dir) = journal {
        ab = ab.journal(dir);
    }
    let a = ab.start().expect("a starts");
    let ttl = Duration::from_millis(50);
    let sent_at = std::time::Instant::now();
    a.send_with("b", payload(0, 100), cohort::SendOptions::new().ttl(ttl))
        .expect("accepted");
    // The deadline passing is the event waited for.
    wait_until("the ttl passed", PATIENCE, || sent_at.elapsed() > ttl * 4);
    let got = Arc::new(AtomicU64::new(0));
    let b = counting_receiver(cluster, b_addr, &got);
    wait_until_or(
        PATIENCE,
        || {
            let p = peer_stats(&a, "b");
            got.load(Ordering::SeqCst) + p.expired >= 1
        },
        || format!("delivered or expired:\n{}", a.stats()),
    );
    let r = (got.load(Ordering::SeqCst), peer_stats(&a, "b").expired);
    shutdown_all(&[a, b]);
    r
}

/// `SendOptions::ttl` promises to fail a message not published within its ttl, "for
/// instance because the peer is disconnected". It holds with a journal too: a message with
/// a ttl for a disconnected peer is not journalled (published) at once, so it expires
/// rather than being delivered however late the peer comes back.
#[test]
fn a_ttl_message_for_a_disconnected_peer_still_expires_with_a_journal() {
    let control = ttl_while_peer_is_down(None, "ttl-down-plain");
    assert_eq!(control, (0, 1), "without a journal: expired, not delivered");
    let dir = TempDir::new("ttl-down");
    let journalled = ttl_while_peer_is_down(Some(dir.path()), "ttl-down-journal");
    assert_eq!(journalled, (0, 1), "with a journal: (delivered, expired)");
}

/// When a journal append fails, nothing of the connection's write buffer may leave: it
/// holds the messages of the batch that could not be journalled. The peer would then hold
/// messages the journal lacks, and after a restart their sequence numbers would be given to
/// other messages, which the peer drops as duplicates. Here the journal's directory is
/// removed (as in
/// `sync_journal_never_reports_success_after_a_journal_write_failed`): its 8 KiB segment
/// holds at most 8 messages of 1 KiB, so b may receive no more than that.
#[test]
fn messages_whose_journal_write_failed_never_reach_the_peer() {
    let dir = TempDir::new("journal-write-failed");
    let got = Arc::new(AtomicU64::new(0));
    let b = counting_receiver("journal-write-failed", "127.0.0.1:0", &got);
    let a = Node::builder("a")
        .cluster("journal-write-failed")
        .journal(dir.path())
        .journal_segment_size(8 << 10)
        .peer("b", b.local_addr())
        .start()
        .expect("a starts");
    wait_until("a connected to b", PATIENCE, || is_connected(&a, "b"));
    // The IO thread may be creating a file meanwhile (a segment, in the pool's absence):
    // removal can then find the directory not empty; it succeeds on a later try.
    wait_until("the journal directory removed", PATIENCE, || {
        std::fs::remove_dir_all(dir.path()).is_ok()
    });
    let tx = a.sender();
    let mut accepted = 0u64;
    for i in 0..50 {
        if tx.send_timeout("b", payload(i, 1024), PATIENCE).is_err() {
            break; // the node stopped
        }
        accepted += 1;
    }
    let _ = a.sync_journal(PATIENCE);
    wait_until("a stopped", PATIENCE, || a.stats().journal_failures == 1);
    let _ = a.shutdown(SHUTDOWN);
    let js = a.stats().journal;
    wait_until("b quiet", PATIENCE, || {
        b.stats()
            .peer("a")
            .is_none_or(|p| p.delivery_queued_bytes == 0)
    });
    let received = b.stats().peer("a").map_or(0, |p| p.received);
    b.shutdown(SHUTDOWN).expect("b stops");
    assert!(
        received <= 8,
        "b received {received} of the {accepted} messages accepted, but a's journal could hold \
         at most 8 of them before its write failed (journal stats after the last successful \
         append: {js:?})"
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
    let got = Arc::new(AtomicU64::new(0));
    let b = counting_receiver("lost-tail", "127.0.0.1:0", &got);
    let sender = || {
        Node::builder("a")
            .cluster("lost-tail")
            .journal(dir.path())
            .journal_fsync(cohort::FsyncPolicy::Never)
            .peer("b", b.local_addr())
            .reconnect_backoff(Duration::from_millis(5), Duration::from_millis(20))
            .start()
            .expect("a starts")
    };
    let a = sender();
    for i in 0..20 {
        send_patiently(&a.sender(), "b", payload(i, 200));
    }
    wait_until("b got 20", PATIENCE, || got.load(Ordering::SeqCst) == 20);
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
        || got.load(Ordering::SeqCst) > 20 || a.stats().connections.protocol_errors >= 5,
        || format!("new message or protocol errors:\n{}", a.stats()),
    );
    let (delivered, errors) = (
        got.load(Ordering::SeqCst),
        a.stats().connections.protocol_errors,
    );
    shutdown_all(&[a, b]);
    assert!(
        delivered > 20,
        "after losing its journal's tail a never reaches b again: {errors} protocol errors"
    );
}
