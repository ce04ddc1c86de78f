//! The durable outbox end to end, over real TCP on 127.0.0.1: messages and delivery progress
//! survive restarts of the sender and of the receiver; acks wait for what the journal holds;
//! restarts never grow the journal; a journal write that fails stops the node, fails its
//! syncs and lets nothing of the failed batch out; unreliable and ttl messages for a
//! disconnected peer fail as they would without a journal. (What the two members promise
//! each other across restarts: `journal_restarts.rs`.)

mod support;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cohort::{Delivery, FsyncPolicy, Node};
use support::*;

/// Every delivery a receiver saw: (sender's counter, seq), in order.
type Log = Arc<Mutex<Vec<(u64, u64)>>>;

fn logging(log: &Log) -> impl Fn(Delivery) + Send + Sync + 'static {
    let log = log.clone();
    move |d: Delivery| {
        let n = counter_of(d.payload()).expect("intact payload");
        log.lock()
            .unwrap()
            .push((n, d.seq().expect("reliable message")));
    }
}

#[test]
fn unacked_messages_survive_a_sender_restart_and_arrive_in_order() {
    let dir = TempDir::new("sender-restart");
    // b is down at first: nothing listens at its address until it starts.
    let b_addr = HeldAddr::new();
    let sender = |dir: &Path| {
        journalled_a("j-sender", dir, b_addr.addr())
            .journal_segment_size(256 << 10)
            .redial_quickly()
            .start()
            .expect("a starts")
    };
    // b is down: everything a sends waits in its journal.
    let a = sender(dir.path());
    for i in 0..300 {
        a.send("b", payload(i, 200)).expect("send");
    }
    a.sync_journal(PATIENCE).expect("journal synced");
    let s = a.stats();
    assert_eq!(s.peer("b").unwrap().sent, 300, "published to the journal");
    let report = a.shutdown(SHUTDOWN).expect("shutdown");
    assert_eq!(
        report.undelivered, 0,
        "kept in the journal, not undelivered"
    );
    drop(a);

    // b comes up; a restarts from its journal and goes on sending.
    let log: Log = Arc::default();
    let b = receiver_b("j-sender", b_addr.addr())
        .on_message(logging(&log))
        .start()
        .expect("b starts");
    let a = sender(dir.path());
    for i in 300..600 {
        send_patiently(&a.sender(), "b", payload(i, 200));
    }
    wait_until_or(
        PATIENCE,
        || log.lock().unwrap().len() >= 600,
        || format!("600 deliveries; stats:\n{}\n{}", a.stats(), b.stats()),
    );
    let got = log.lock().unwrap().clone();
    let want: Vec<(u64, u64)> = (0..600).map(|i| (i, i + 1)).collect();
    assert_eq!(got, want, "every message once, in order, seq continuing");
    assert_eq!(b.stats().peer("a").unwrap().duplicates, 0);
    // The restored messages were charged to the restarted sender's window and b's credit
    // released them: once b is idle, the whole window is back, no more (a debug build
    // panics on an over-release) and no less.
    wait_window_whole(&a, "b");
    // A clean shutdown waits for b's acks, and the journal records them: a restarted `a`
    // resends nothing, and its stream goes on at seq 601.
    a.shutdown(SHUTDOWN).expect("shutdown");
    drop(a);
    let a = sender(dir.path());
    send_patiently(&a.sender(), "b", payload(600, 200));
    wait_until("the next message", PATIENCE, || {
        log.lock().unwrap().len() >= 601
    });
    assert_eq!(log.lock().unwrap()[600], (600, 601));
    assert_eq!(log.lock().unwrap().len(), 601);
    assert_eq!(b.stats().peer("a").unwrap().duplicates, 0, "nothing resent");
    shutdown_all(&[a, b]);
}

#[test]
fn a_receiver_restart_resumes_where_its_journal_says_it_delivered() {
    let dir = TempDir::new("receiver-restart");
    // Both incarnations of b listen here.
    let b_addr = HeldAddr::new();
    let log: Log = Arc::default();
    let receiver = |log: &Log| {
        receiver_b("j-receiver", b_addr.addr())
            .journal(dir.path())
            .journal_fsync(FsyncPolicy::Never)
            .on_message(logging(log))
            .start()
            .expect("b starts")
    };
    let a = sender_a("j-receiver", b_addr.addr(), None)
        .redial_quickly()
        .start()
        .expect("a starts");
    let b = receiver(&log);
    let tx = a.sender();
    const N: u64 = 20_000;
    for i in 0..N / 2 {
        send_patiently(&tx, "b", payload(i, 64));
    }
    wait_until("some deliveries", PATIENCE, || {
        log.lock().unwrap().len() >= 1_000
    });
    // A clean stop records how far the handler got; `a` keeps the rest unacked.
    b.shutdown(SHUTDOWN).expect("b stops");
    drop(b);
    let before = log.lock().unwrap().len();
    eprintln!("{before} delivered before the restart");
    for i in N / 2..N {
        send_patiently(&tx, "b", payload(i, 64));
    }
    // The same launch id (kept in b's journal): `a` continues its stream, resending from
    // what b recorded as delivered.
    let b = receiver(&log);
    wait_until_or(
        PATIENCE,
        || log.lock().unwrap().len() as u64 >= N,
        || format!("every message; stats:\n{}\n{}", a.stats(), b.stats()),
    );
    let got = log.lock().unwrap().clone();
    let want: Vec<(u64, u64)> = (0..N).map(|i| (i, i + 1)).collect();
    assert_eq!(
        got.len(),
        want.len(),
        "{before} delivered before the restart"
    );
    assert!(
        got == want,
        "every message once and in order across the restart"
    );
    assert_eq!(a.stats().peer("b").unwrap().undelivered, 0);
    shutdown_all(&[a, b]);
}

#[test]
fn interval_fsync_acks_once_synced_and_oob_progress_counts() {
    let dir = TempDir::new("interval-b");
    let got = Counter::new();
    let nodes = connected([
        // No journal on a: what b never acknowledges is undelivered at a's shutdown.
        Node::builder("a").cluster("j-interval"),
        Node::builder("b")
            .cluster("j-interval")
            .journal(dir.path())
            .journal_fsync(FsyncPolicy::Interval(Duration::from_millis(20)))
            .on_message(got.handler()),
    ]);
    let tx = nodes[0].sender();
    const N: u64 = 5_000;
    for i in 0..N {
        if i % 10 == 0 {
            while tx.send_oob("b", payload(i, 100)).is_err() {
                std::thread::yield_now();
            }
        } else {
            send_patiently(&tx, "b", payload(i, 100));
        }
    }
    wait_until("every delivery", PATIENCE, || got.get() >= N);
    // Acks (and so the sender's shutdown) wait for b's journal to sync what it delivered,
    // OOB messages included: a shutdown that flushes finds everything acknowledged.
    let report = nodes[0].shutdown(SHUTDOWN).expect("a stops");
    assert_eq!(report.undelivered, 0);
    let js = nodes[1].stats().journal.expect("b journals");
    assert!(js.fsyncs > 0, "the interval policy synced: {js:?}");
    let a = &nodes[0].stats();
    assert_eq!(a.peer("b").unwrap().sent, N);
    nodes[1].shutdown(SHUTDOWN).expect("b stops");
}

/// With a journal, an ack triggered by `ack_threshold` (`after_data` -> `send_ack`) usually
/// finds the handler not done yet and writes nothing; it must be tried again, since nothing
/// else asks unless credit crosses half a window or the idle-credit tick fires: with
/// `credit_on_idle(false)` a handled message would never be acknowledged, and the sender's
/// shutdown would report it undelivered.
#[test]
fn a_threshold_ack_that_finds_the_handler_behind_is_retried() {
    let dir = TempDir::new("threshold-ack");
    let got = Counter::new();
    let b = receiver_b("threshold-ack", "127.0.0.1:0")
        .journal(dir.path())
        .ack_threshold(1)
        .credit_on_idle(false)
        .on_message(got.handler())
        .start()
        .expect("b starts");
    let a = sender_a("threshold-ack", b.local_addr(), None)
        .start()
        .expect("a starts");
    send_patiently(&a.sender(), "b", payload(0, 100));
    wait_until("delivered", PATIENCE, || got.get() == 1);
    let report = a.shutdown(Duration::from_secs(3)).expect("a stops");
    assert_eq!(
        report.undelivered, 0,
        "b handled the message (and its journal recorded it) but never acknowledged it"
    );
    b.shutdown(SHUTDOWN).expect("b stops");
}

/// A journalling receiver records its delivery progress as the handler goes, and its acks
/// (which wait for the record to be durable) go out without waiting for other traffic to
/// carry the journal write along: with heartbeats a minute apart, the sender's window still
/// comes back whole, and the journal holds the progress before the receiver stops.
#[test]
fn delivery_progress_is_journalled_and_acknowledged_without_other_traffic() {
    let dir = TempDir::new("progress-alone");
    let quiet = Duration::from_secs(60);
    let got = Counter::new();
    let b = receiver_b("progress-alone", "127.0.0.1:0")
        .journal(dir.path())
        .heartbeat(quiet, quiet)
        .on_message(got.handler())
        .start()
        .expect("b starts");
    let a = sender_a("progress-alone", b.local_addr(), None)
        .heartbeat(quiet, quiet)
        .start()
        .expect("a starts");
    for i in 0..100 {
        send_patiently(&a.sender(), "b", payload(i, 100));
    }
    wait_until("delivered", PATIENCE, || got.get() == 100);
    wait_window_whole(&a, "b");
    let j = b.stats().journal.expect("journal stats");
    assert!(
        j.records >= 2,
        "the binding and the delivery progress journalled while running: {j:?}"
    );
    assert_eq!(a.stats().peer("b").expect("peer").undelivered, 0);
    shutdown_all(&[a, b]);
}

#[test]
fn sync_journal_without_a_journal_is_a_config_error() {
    let node = Node::builder("solo").start().expect("start");
    match node.sync_journal(SHUTDOWN) {
        Err(cohort::Error::Config(e @ cohort::ConfigError::NoJournal { .. })) => {
            assert_eq!(e.setting(), "sync_journal");
            assert!(e.to_string().contains("Builder::journal"), "{e}");
        }
        other => panic!("expected a config error, got {other:?}"),
    }
    let dir = TempDir::new("fsync-without-dir");
    let _ = dir.path();
    let err = Node::builder("solo2")
        .journal_fsync(FsyncPolicy::Never)
        .start()
        .expect_err("refused");
    assert!(
        matches!(
            err,
            cohort::Error::Config(cohort::ConfigError::NoJournal { .. })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("journal directory"), "{err}");
    node.shutdown(SHUTDOWN).expect("stops");
}

#[test]
fn another_members_journal_is_refused_with_a_clear_error() {
    let dir = TempDir::new("foreign");
    let b_addr = HeldAddr::new();
    let a = journalled_a("j-foreign", dir.path(), b_addr.addr())
        .journal_segment_size(64 << 10)
        .start()
        .expect("a starts");
    a.send("b", payload(0, 10)).expect("send");
    a.sync_journal(PATIENCE).expect("synced");
    a.shutdown(SHUTDOWN).expect("a stops");
    let err = Node::builder("x")
        .cluster("j-foreign")
        .journal(dir.path())
        .start()
        .expect_err("x must not adopt a's journal");
    let msg = err.to_string();
    assert!(matches!(err, cohort::Error::Journal(_)), "{err:?}");
    assert!(
        msg.contains("belongs to member") && msg.contains("j-foreign/a"),
        "{msg}"
    );
    let err = Node::builder("a")
        .cluster("another")
        .journal(dir.path())
        .start()
        .expect_err("another cluster");
    assert!(matches!(err, cohort::Error::Journal(_)), "{err:?}");
}

#[test]
fn restarts_under_traffic_never_grow_the_journal() {
    let dir = TempDir::new("restarts");
    let log: Log = Arc::default();
    let b = receiver_b("j-restarts", "127.0.0.1:0")
        .on_message(logging(&log))
        .start()
        .expect("b starts");
    let mut files = Vec::new();
    let mut next = 0u64;
    let start_a = |round: usize| {
        journalled_a("j-restarts", dir.path(), b.local_addr())
            .journal_segment_size(64 << 10)
            .start()
            .unwrap_or_else(|e| panic!("round {round}: a starts: {e}"))
    };
    for round in 0..20 {
        let a = start_a(round);
        // About 1.5 segments per round, so segments fill, rotate and retire.
        for _ in 0..100 {
            send_patiently(&a.sender(), "b", payload(next, 1000));
            next += 1;
        }
        if round % 2 == 0 {
            // Even rounds stop once b has everything (a clean shutdown then waits for the
            // acks that retire the journal); odd rounds stop at once, mid-stream.
            wait_until(format!("round {round}: b has {next}"), PATIENCE, || {
                log.lock().unwrap().len() as u64 >= next
            });
        }
        a.shutdown(SHUTDOWN).expect("a stops");
        drop(a);
        let seen = cohort::inspect_journal(dir.path()).expect("inspect");
        files.push(seen.segments.len());
    }
    let a = start_a(20);
    wait_until_or(
        PATIENCE,
        || log.lock().unwrap().len() as u64 >= next,
        || {
            let got = log.lock().unwrap();
            format!(
                "every message: {} of {next}, last {:?}, files {files:?}; b:\n{}",
                got.len(),
                got.last(),
                b.stats()
            )
        },
    );
    a.shutdown(SHUTDOWN).expect("a stops");
    let got = log.lock().unwrap().clone();
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, &(n, s))| n == i as u64 && s == n + 1),
        "in order, once each"
    );
    eprintln!("segment files after each restart: {files:?}");
    // Files are the high-water mark of segments in use: a few, whatever the rounds.
    let max = *files.iter().max().expect("rounds");
    assert!(max <= 6, "segment files per round: {files:?}");
    // And restarting alone never adds a file (the Qpid bug): ten bare restarts.
    let settled = cohort::inspect_journal(dir.path()).expect("inspect");
    for round in 21..31 {
        start_a(round).shutdown(SHUTDOWN).expect("a stops");
        let now = cohort::inspect_journal(dir.path()).expect("inspect");
        assert_eq!(
            now.segments.len(),
            settled.segments.len(),
            "restart {round} changed the file count"
        );
        assert!(now.temp_files.is_empty());
    }
    b.shutdown(SHUTDOWN).expect("b stops");
}

#[test]
fn sync_journal_journals_messages_queued_behind_a_backed_up_connection() {
    // `sync_journal` promises that every message accepted before it is in the journal. With
    // a small write buffer, publishing to a connected peer pauses after a few messages until
    // the socket takes them; a sync must journal the rest anyway, not leave them queued in
    // memory (where a crash would lose what the sync reported durable).
    let dir = TempDir::new("sync-backed-up");
    let log: Log = Arc::default();
    let b = receiver_b("j-sync", "127.0.0.1:0")
        .on_message(logging(&log))
        .start()
        .expect("b starts");
    let a = journalled_a("j-sync", dir.path(), b.local_addr())
        .journal_segment_size(256 << 10)
        .write_buffer(1024)
        .start()
        .expect("a starts");
    send_patiently(&a.sender(), "b", payload(0, 1024));
    wait_until("a connected to b", PATIENCE, || is_connected(&a, "b"));
    const N: u64 = 2_000;
    for round in 0..5 {
        for i in 1..=N {
            send_patiently(&a.sender(), "b", payload(round * N + i, 1024));
        }
        a.sync_journal(PATIENCE).expect("sync_journal");
        let s = peer_stats(&a, "b");
        assert_eq!(
            (s.queued, s.sent),
            (0, s.accepted),
            "round {round}: sync_journal returned with messages not journalled: {s:?}"
        );
    }
    wait_until("every message at b", PATIENCE, || {
        log.lock().unwrap().len() as u64 > 5 * N
    });
    shutdown_all(&[a, b]);
}

/// The node's journal stats show what `sync_journal` did once it returns: under
/// `FsyncPolicy::Never` nothing else syncs, so the fsync counted is the sync's own. (The
/// journal is synced without being appended to: the message was journalled as it was
/// published, to its peer that is down.)
#[test]
fn the_journal_stats_count_a_sync_when_it_returns() {
    let dir = TempDir::new("sync-stats");
    let b_addr = HeldAddr::new();
    let a = journalled_a("j-sync-stats", dir.path(), b_addr.addr())
        .journal_fsync(FsyncPolicy::Never)
        .start()
        .expect("a starts");
    a.send("b", payload(0, 100)).expect("send");
    wait_until("the message journalled", PATIENCE, || {
        a.stats().journal.is_some_and(|j| j.records >= 1)
    });
    let before = a.stats().journal.expect("journal stats");
    assert_eq!(before.fsyncs, 0, "nothing synced yet: {before:?}");
    a.sync_journal(PATIENCE).expect("sync_journal");
    let after = a.stats().journal.expect("journal stats");
    assert!(
        after.fsyncs > before.fsyncs,
        "the sync is counted when sync_journal returns: {after:?}"
    );
    a.shutdown(SHUTDOWN).expect("a stops");
}

#[test]
fn sync_journal_never_reports_success_after_a_journal_write_failed() {
    // A disk failure stands in for ENOSPC or EIO: the journal's directory is removed, so
    // the next segment cannot be created. The sync that hits it (or follows it) must fail;
    // the node stops (fail-stop) and counts the failure.
    let dir = TempDir::new("sync-failed");
    let b = receiver_b("j-fail", "127.0.0.1:0")
        .on_message(|_| {})
        .start()
        .expect("b starts");
    let a = journalled_a("j-fail", dir.path(), b.local_addr())
        .journal_segment_size(8 << 10)
        .write_buffer(1024)
        .start()
        .expect("a starts");
    send_patiently(&a.sender(), "b", payload(0, 100));
    a.sync_journal(PATIENCE).expect("the first sync succeeds");
    wait_until("a connected to b", PATIENCE, || is_connected(&a, "b"));
    // The IO thread may be creating a file meanwhile (a segment, in the pool's absence):
    // removal can then find the directory not empty; it succeeds on a later try.
    wait_until("the journal directory removed", PATIENCE, || {
        std::fs::remove_dir_all(dir.path()).is_ok()
    });
    // More than a segment: publishing them needs a new segment file.
    for i in 1..=50 {
        send_patiently(&a.sender(), "b", payload(i, 1024));
    }
    let result = a.sync_journal(PATIENCE);
    assert!(
        matches!(result, Err(cohort::Error::Closed)),
        "sync_journal after a failed journal write: {result:?}"
    );
    assert_eq!(a.stats().journal_failures, 1, "the failure is counted");
    shutdown_all(&[a, b]);
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
    // 1 KiB messages are copied into the link's buffer; 5 000-byte ones are written from
    // where their payloads lie: both wait behind the journal.
    for len in [1024, 5000] {
        messages_lost_with_the_journal_never_reach_the_peer(len);
    }
}

/// Sends messages of `len` bytes from a member whose journal directory is removed under
/// it, so that its journal write fails once its first 8 KiB segment is full: the peer gets
/// at most the messages that segment could hold.
fn messages_lost_with_the_journal_never_reach_the_peer(len: usize) {
    let name = format!("journal-write-failed-{len}");
    let dir = TempDir::new(&name);
    let got = Counter::new();
    let b = receiver_b(&name, "127.0.0.1:0")
        .on_message(got.handler())
        .start()
        .expect("b starts");
    let a = journalled_a(&name, dir.path(), b.local_addr())
        .journal_segment_size(8 << 10)
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
        if tx.send_timeout("b", payload(i, len), PATIENCE).is_err() {
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
    let most = (8 << 10) / len as u64;
    assert!(
        received <= most,
        "{len} B: b received {received} of the {accepted} messages accepted, but a's journal \
         could hold at most {most} of them before its write failed (journal stats after the \
         last successful append: {js:?})"
    );
}

#[test]
fn restarts_while_the_peer_is_down_keep_at_most_one_window() {
    // Restored messages are charged to the window: a member that restarts again and again
    // while its peer is down cannot pile up a window's worth of messages per restart.
    let dir = TempDir::new("bounded");
    let down = HeldAddr::new();
    const WINDOW: u64 = 64 << 10;
    let mut accepted = Vec::new();
    for round in 0..4 {
        let a = journalled_a("j-bounded", dir.path(), down.addr())
            .window_bytes(WINDOW)
            .start()
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let n = fill_window(&a.sender(), "b", 0, 1000);
        a.sync_journal(PATIENCE).expect("synced");
        let p = peer_stats(&a, "b");
        assert_eq!(p.queued, 0, "round {round}: everything journalled");
        accepted.push(n);
        a.shutdown(SHUTDOWN).expect("stops");
    }
    let per_window = WINDOW / 1016;
    assert_eq!(accepted[0], per_window, "the first start fills the window");
    assert!(
        accepted[1..].iter().all(|&n| n == 0),
        "later starts find the window charged with what is journalled: {accepted:?}"
    );
}

#[test]
fn an_unreliable_message_for_a_disconnected_peer_fails_and_holds_nothing_back() {
    let dir = TempDir::new("unreliable");
    let down = HeldAddr::new();
    let a = journalled_a("j-unreliable", dir.path(), down.addr())
        .start()
        .expect("a starts");
    let opts = cohort::SendOptions::new().unreliable();
    a.send_with("b", payload(0, 50), opts).expect("accepted");
    for i in 1..=10 {
        a.send("b", payload(i, 50)).expect("send");
    }
    a.sync_journal(PATIENCE).expect("synced");
    let p = peer_stats(&a, "b");
    assert_eq!(
        (p.accepted, p.sent, p.failed, p.queued),
        (11, 10, 1, 0),
        "the reliable ones journalled, the unreliable one failed: {p:?}"
    );
    a.shutdown(SHUTDOWN).expect("stops");
}

/// Runs: b down, `a` sends one message with a 50 ms ttl, the ttl passes, b comes up.
/// Returns (delivered at b, expired at a).
fn ttl_while_peer_is_down(journal: Option<&std::path::Path>, cluster: &str) -> (u64, u64) {
    // b is down: nothing listens at its address until it starts.
    let b_addr = HeldAddr::new();
    let a = sender_a(cluster, b_addr.addr(), journal)
        .redial_quickly()
        .start()
        .expect("a starts");
    let ttl = Duration::from_millis(50);
    let sent_at = std::time::Instant::now();
    a.send_with("b", payload(0, 100), cohort::SendOptions::new().ttl(ttl))
        .expect("accepted");
    // The deadline passing is the event waited for.
    wait_until("the ttl passed", PATIENCE, || sent_at.elapsed() > ttl * 4);
    let got = Counter::new();
    let b = receiver_b(cluster, b_addr.addr())
        .on_message(got.handler())
        .start()
        .expect("b starts");
    wait_until_or(
        PATIENCE,
        || got.get() + peer_stats(&a, "b").expired >= 1,
        || format!("delivered or expired:\n{}", a.stats()),
    );
    let r = (got.get(), peer_stats(&a, "b").expired);
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

/// Under the policies that need no fsync, the IO thread appends a round trip's small batch
/// itself when the journal's writer is idle (no hand-over to the writer thread and back);
/// either way a message may reach the peer only once its record is in the journal. The
/// receiver's handler reads the sender's journal files as each message arrives, one message
/// in flight at a time (a round trip, the case the inline append serves): the journal
/// already holds at least that many messages. Every other message is 20 000 bytes: its
/// payload is written from where it lies (not copied into the link's buffer), behind the
/// same journal gate as the frames around it.
#[test]
fn a_message_reaches_the_peer_only_once_its_record_is_in_the_journal_files() {
    for (policy, name) in [
        (FsyncPolicy::Never, "never"),
        (FsyncPolicy::Interval(Duration::from_millis(5)), "interval"),
    ] {
        let dir = TempDir::new(&format!("record-before-bytes-{name}"));
        let check = RecordsFirst::new();
        let cluster = format!("record-before-bytes-{name}");
        let b = receiver_b(&cluster, "127.0.0.1:0")
            .on_message(check.handler(dir.path()))
            .start()
            .expect("b starts");
        let a = journalled_a(&cluster, dir.path(), b.local_addr())
            .journal_fsync(policy)
            .start()
            .expect("a starts");
        for i in 1..=50u64 {
            let len = if i % 2 == 0 { 20_000 } else { 100 };
            send_patiently(&a.sender(), "b", payload(i, len));
            wait_until(format!("message {i} at b ({name})"), PATIENCE, || {
                check.got() >= i
            });
        }
        shutdown_all(&[a, b]);
        check.assert_records_first(name);
    }
}
