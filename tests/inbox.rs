//! Pull-style receive (`Builder::start_with_inbox`): the application takes messages on its
//! own thread, in each sender's order, with flow control holding end to end (credit goes
//! back only as messages are taken), and a closed inbox once the node is shut down and
//! drained. Also: a delivery carries the receiving node's send handle.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cohort::{ConfigError, Error, Node, RecvError};
use support::*;

/// Three senders stream mixed sizes (8 B to 64 KiB) at once into one inbox through small
/// windows: every message arrives once, each sender's in its order, and the windows come
/// back whole.
#[test]
fn an_inbox_keeps_each_senders_order_and_loses_nothing() {
    const EACH: u64 = 3_000;
    let (b, inbox) = Node::builder("ib-b")
        .cluster("t-ib")
        .window_bytes(256 * 1024)
        .start_with_inbox()
        .expect("start b");
    let senders: Vec<Node> = ["ib-a1", "ib-a2", "ib-a3"]
        .iter()
        .map(|name| {
            Node::builder(name)
                .cluster("t-ib")
                .window_bytes(256 * 1024)
                .peer("ib-b", b.local_addr())
                .start()
                .expect("start a sender")
        })
        .collect();
    for a in &senders {
        b.add_peer(a.name(), a.local_addr()).expect("add_peer");
    }
    let threads: Vec<_> = senders
        .iter()
        .enumerate()
        .map(|(k, a)| {
            let s = a.sender();
            std::thread::spawn(move || {
                for i in 0..EACH {
                    let size = match (i + k as u64) % 4 {
                        0 => 8,
                        1 => 1000,
                        2 => 4096,
                        _ => 64 * 1024,
                    };
                    s.send("ib-b", payload(i, size)).expect("send");
                }
            })
        })
        .collect();
    let check = OrderCheck::new();
    let deadline = Instant::now() + PATIENCE;
    while check.total() < 3 * EACH {
        match inbox.recv_deadline(deadline) {
            Ok(d) => {
                assert!(d.sender().is_some(), "an inbox delivery carries the node");
                check.record(&d);
            }
            Err(e) => panic!("after {} messages: {e}\n{}", check.total(), b.stats()),
        }
    }
    for t in threads {
        t.join().expect("sender thread");
    }
    check.assert_got_exactly("ib-b", &["ib-a1", "ib-a2", "ib-a3"], EACH);
    assert_eq!(inbox.try_recv().unwrap_err(), RecvError::Empty);
    wait_windows_whole(&senders);
    shutdown_all(&senders);
    b.shutdown(SHUTDOWN).expect("shutdown b");
}

/// A consumer that stops taking stalls its sender after one window: the receiver holds
/// what arrived, and no credit goes back until the application takes; taking again frees
/// the window and the sender resumes.
#[test]
fn an_inbox_that_is_not_read_stalls_its_sender_and_taking_resumes_it() {
    const WINDOW: u64 = 64 * 1024;
    const SIZE: usize = 1000;
    let (b, inbox) = Node::builder("ibs-b")
        .cluster("t-ibs")
        .window_bytes(WINDOW)
        .credit_on_idle(false)
        .start_with_inbox()
        .expect("start b");
    let a = Node::builder("ibs-a")
        .cluster("t-ibs")
        .window_bytes(WINDOW)
        .peer("ibs-b", b.local_addr())
        .start()
        .expect("start a");
    b.add_peer("ibs-a", a.local_addr()).expect("add_peer");
    wait_until("connected", PATIENCE, || is_connected(&a, "ibs-b"));

    let first = fill_window(&a.sender(), "ibs-b", 0, SIZE);
    assert!(first > 0, "the window took some messages");
    // Everything sent arrives at b and waits there, untaken.
    wait_until_or(
        PATIENCE,
        || peer_stats(&b, "ibs-a").received == first,
        || format!("b received {first}:\n{}", b.stats()),
    );
    let held = peer_stats(&b, "ibs-a");
    assert_eq!(held.delivered, 0, "nothing taken yet");
    assert!(held.unconsumed_bytes > 0, "b holds what arrived");
    // No credit comes back while nobody takes: the sender stays stalled. (A bounded look,
    // not a wait for an event: credit would come back within a few round trips.)
    let stalled_until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < stalled_until {
        assert!(
            matches!(
                a.try_send("ibs-b", payload(first, SIZE)),
                Err(cohort::TrySendError::Full(_))
            ),
            "credit came back although nothing was taken:\n{}",
            a.stats()
        );
        std::thread::yield_now();
    }

    // Take everything: the window comes back and the sender resumes where it stopped.
    let check = OrderCheck::new();
    for _ in 0..first {
        let d = inbox.recv_timeout(PATIENCE).expect("a waiting message");
        check.record(&d);
    }
    wait_window_whole(&a, "ibs-b");
    let second = fill_window(&a.sender(), "ibs-b", first, SIZE);
    assert!(second > 0, "the sender resumed");
    for _ in 0..second {
        let d = inbox
            .recv_timeout(PATIENCE)
            .expect("a message after the resume");
        check.record(&d);
    }
    check.assert_got_exactly("ibs-b", &["ibs-a"], first + second);
    a.shutdown(SHUTDOWN).expect("shutdown a");
    b.shutdown(SHUTDOWN).expect("shutdown b");
}

/// `try_recv` and `recv_timeout` report an empty inbox; out-of-band messages come through
/// it too; once the node is shut down the inbox hands out what had arrived, then reports
/// `Closed`.
#[test]
fn an_inbox_reports_empty_and_timeout_and_drains_before_closing() {
    let (b, inbox) = Node::builder("ibc-b")
        .cluster("t-ibc")
        .start_with_inbox()
        .expect("start b");
    let a = Node::builder("ibc-a")
        .cluster("t-ibc")
        .peer("ibc-b", b.local_addr())
        .start()
        .expect("start a");
    b.add_peer("ibc-a", a.local_addr()).expect("add_peer");
    assert_eq!(inbox.try_recv().unwrap_err(), RecvError::Empty);
    assert_eq!(
        inbox.recv_timeout(Duration::from_millis(20)).unwrap_err(),
        RecvError::Timeout
    );
    assert_eq!(inbox.try_iter().count(), 0);

    for i in 0..100u64 {
        a.send_oob("ibc-b", payload(i, 64)).expect("send_oob");
    }
    let mut oob = Vec::new();
    while oob.len() < 100 {
        let d = inbox.recv_timeout(PATIENCE).expect("an OOB message");
        assert!(d.is_oob());
        oob.push(counter_of(d.payload()).expect("counter"));
    }
    oob.sort_unstable();
    assert_eq!(oob, (0..100).collect::<Vec<_>>(), "every OOB message once");

    for i in 0..50u64 {
        a.send("ibc-b", payload(i, 64)).expect("send");
    }
    wait_until("b received the 50", PATIENCE, || {
        peer_stats(&b, "ibc-a").received == 150
    });
    a.shutdown(SHUTDOWN).expect("shutdown a");
    b.shutdown(SHUTDOWN).expect("shutdown b");
    // What arrived before the shutdown is still there to take, in order, then the inbox
    // closes. (Sequence numbers count the OOB messages too: check the counters.)
    let regular: Vec<u64> = inbox
        .iter()
        .map(|d| {
            assert!(!d.is_oob());
            counter_of(d.payload()).expect("counter")
        })
        .collect();
    assert_eq!(regular, (0..50).collect::<Vec<_>>());
    assert_eq!(inbox.recv().unwrap_err(), RecvError::Closed);
    assert_eq!(inbox.try_recv().unwrap_err(), RecvError::Closed);
}

#[test]
fn an_inbox_and_a_handler_cannot_both_receive() {
    let r = Node::builder("ibh").on_message(|_| {}).start_with_inbox();
    assert!(
        matches!(r, Err(Error::Config(ConfigError::InboxWithHandler))),
        "{r:?}"
    );
}

/// A handler answers through the node handle its delivery carries, from the very first
/// message (no handle smuggled in after `start`), and its answers arrive.
#[test]
fn a_handler_answers_through_the_node_its_delivery_carries() {
    const N: u64 = 2_000;
    let echo = Node::builder("ibe-echo")
        .cluster("t-ibe")
        .on_message(|d| {
            let node = d
                .sender()
                .cloned()
                .expect("a node's delivery carries its sender");
            assert_eq!(node.name(), "ibe-echo");
            // Answer without blocking the handler: a full window hands the payload back.
            let (from, mut answer) = d.into_parts();
            while let Err(cohort::TrySendError::Full(back)) = node.try_send(&from, answer) {
                answer = back;
                std::thread::yield_now();
            }
        })
        .start()
        .expect("start echo");
    let echoed = Arc::new(AtomicU64::new(0));
    let e = echoed.clone();
    let client = Node::builder("ibe-client")
        .cluster("t-ibe")
        .peer("ibe-echo", echo.local_addr())
        .on_message(move |_| {
            e.fetch_add(1, Ordering::SeqCst);
        })
        .start()
        .expect("start client");
    echo.add_peer("ibe-client", client.local_addr())
        .expect("add_peer");
    for i in 0..N {
        client.send("ibe-echo", payload(i, 100)).expect("send");
    }
    wait_until_or(
        PATIENCE,
        || echoed.load(Ordering::SeqCst) == N,
        || {
            format!(
                "{} of {N} answered:\n{}\n{}",
                echoed.load(Ordering::SeqCst),
                client.stats(),
                echo.stats()
            )
        },
    );
    client.shutdown(SHUTDOWN).expect("shutdown client");
    echo.shutdown(SHUTDOWN).expect("shutdown echo");
}
