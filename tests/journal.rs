//! The durable outbox end to end, over real TCP on 127.0.0.1: messages and delivery progress
//! survive restarts of the sender and of the receiver.

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
    let b_addr = reserve_addr();
    let sender = |dir: &Path| {
        Node::builder("a")
            .cluster("j-sender")
            .journal(dir)
            .journal_segment_size(256 << 10)
            .peer("b", b_addr)
            .reconnect_backoff(
                std::time::Duration::from_millis(5),
                std::time::Duration::from_millis(50),
            )
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
    let b = Node::builder("b")
        .cluster("j-sender")
        .listen(b_addr)
        .allow_unknown_members(true)
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
    wait_until_or(
        PATIENCE,
        || {
            let p = peer_stats(&a, "b");
            p.available == p.window
        },
        || format!("a's window whole again:\n{}", a.stats()),
    );
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
    let b_addr = reserve_addr();
    let log: Log = Arc::default();
    let receiver = |log: &Log| {
        Node::builder("b")
            .cluster("j-receiver")
            .listen(b_addr)
            .journal(dir.path())
            .journal_fsync(FsyncPolicy::Never)
            .allow_unknown_members(true)
            .on_message(logging(log))
            .start()
            .expect("b starts")
    };
    let a = Node::builder("a")
        .cluster("j-receiver")
        .peer("b", b_addr)
        .reconnect_backoff(
            std::time::Duration::from_millis(5),
            std::time::Duration::from_millis(50),
        )
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
    let got = Arc::new(AtomicU64::new(0));
    let g = got.clone();
    let builders = vec![
        // No journal on a: what b never acknowledges is undelivered at a's shutdown.
        Node::builder("a").cluster("j-interval"),
        Node::builder("b")
            .cluster("j-interval")
            .journal(dir.path())
            .journal_fsync(FsyncPolicy::Interval(std::time::Duration::from_millis(20)))
            .on_message(move |_d: Delivery| {
                g.fetch_add(1, Ordering::SeqCst);
            }),
    ];
    let nodes = start_mesh(builders);
    wait_mesh_connected(&nodes);
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
    wait_until("every delivery", PATIENCE, || {
        got.load(Ordering::SeqCst) >= N
    });
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

#[test]
fn sync_journal_without_a_journal_is_a_config_error() {
    let node = Node::builder("solo").start().expect("start");
    match node.sync_journal(SHUTDOWN) {
        Err(cohort::Error::Config(msg)) => assert!(msg.contains("Builder::journal"), "{msg}"),
        other => panic!("expected a config error, got {other:?}"),
    }
    let dir = TempDir::new("fsync-without-dir");
    let _ = dir.path();
    let err = Node::builder("solo2")
        .journal_fsync(FsyncPolicy::Never)
        .start()
        .expect_err("refused");
    assert!(err.to_string().contains("journal directory"), "{err}");
    node.shutdown(SHUTDOWN).expect("stops");
}

#[test]
fn another_members_journal_is_refused_with_a_clear_error() {
    let dir = TempDir::new("foreign");
    let a = Node::builder("a")
        .cluster("j-foreign")
        .journal(dir.path())
        .journal_segment_size(64 << 10)
        .peer("b", reserve_addr())
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
    let b_addr = reserve_addr();
    let log: Log = Arc::default();
    let b = Node::builder("b")
        .cluster("j-restarts")
        .listen(b_addr)
        .allow_unknown_members(true)
        .on_message(logging(&log))
        .start()
        .expect("b starts");
    let mut files = Vec::new();
    let mut next = 0u64;
    let start_a = |round: usize| {
        Node::builder("a")
            .cluster("j-restarts")
            .journal(dir.path())
            .journal_segment_size(64 << 10)
            .peer("b", b_addr)
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
        let seen = cohort::journal::inspect(dir.path()).expect("inspect");
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
    let settled = cohort::journal::inspect(dir.path()).expect("inspect");
    for round in 21..31 {
        start_a(round).shutdown(SHUTDOWN).expect("a stops");
        let now = cohort::journal::inspect(dir.path()).expect("inspect");
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
    let b = Node::builder("b")
        .cluster("j-sync")
        .listen("127.0.0.1:0")
        .allow_unknown_members(true)
        .on_message(logging(&log))
        .start()
        .expect("b starts");
    let a = Node::builder("a")
        .cluster("j-sync")
        .journal(dir.path())
        .journal_segment_size(256 << 10)
        .write_buffer(1024)
        .peer("b", b.local_addr())
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

#[test]
fn sync_journal_never_reports_success_after_a_journal_write_failed() {
    // A disk failure stands in for ENOSPC or EIO: the journal's directory is removed, so
    // the next segment cannot be created. The sync that hits it (or follows it) must fail;
    // the node stops (fail-stop) and counts the failure.
    let dir = TempDir::new("sync-failed");
    let b = Node::builder("b")
        .cluster("j-fail")
        .listen("127.0.0.1:0")
        .allow_unknown_members(true)
        .on_message(|_| {})
        .start()
        .expect("b starts");
    let a = Node::builder("a")
        .cluster("j-fail")
        .journal(dir.path())
        .journal_segment_size(8 << 10)
        .write_buffer(1024)
        .peer("b", b.local_addr())
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

#[test]
fn restarts_while_the_peer_is_down_keep_at_most_one_window() {
    // Restored messages are charged to the window: a member that restarts again and again
    // while its peer is down cannot pile up a window's worth of messages per restart.
    let dir = TempDir::new("bounded");
    let down = reserve_addr();
    const WINDOW: u64 = 64 << 10;
    let mut accepted = Vec::new();
    for round in 0..4 {
        let a = Node::builder("a")
            .cluster("j-bounded")
            .window_bytes(WINDOW)
            .journal(dir.path())
            .peer("b", down)
            .start()
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let tx = a.sender();
        let mut n = 0u64;
        while tx.try_send("b", payload(n, 1000)).is_ok() {
            n += 1;
        }
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
    let a = Node::builder("a")
        .cluster("j-unreliable")
        .journal(dir.path())
        .peer("b", reserve_addr())
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
