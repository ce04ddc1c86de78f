//! A handler that borrows each message (`Builder::on_message_ref`): the messages of runs
//! lent straight out of the bytes they came in, the others out of their deliveries, with the
//! guarantees of `on_message` — every message once, in each sender's order, credit returned,
//! panics caught, requests answered — and what the application keeps of a message intact
//! after the call.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

use cohort::{Bytes, Delivery, Error, Node, ReplyFailure, SendOptions};
use support::*;

/// Sizes from a few bytes to several reads' worth, mixed so that a read brings runs of
/// small messages, the head or the tail of a large one, and both.
fn mixed_size(i: u64) -> usize {
    match i % 16 {
        0 => 200 * 1024,
        1..=3 => 8 + (i as usize * 37) % 4000,
        4 => 40 * 1024,
        _ => 8 + (i as usize) % 64,
    }
}

/// Three senders send mixed sizes from the first instant, one by one and in batches, while
/// the receiver sends back to each of them: the lent handler sees every message once,
/// complete, in each sender's order with increasing sequence numbers, and every window is
/// whole at the end (credit returned for each lent message).
#[test]
fn lent_messages_arrive_complete_and_in_order_from_every_sender() {
    const COUNT: u64 = 3_000;
    let check = OrderCheck::new();
    // One per sender: each checks what rx sent it.
    let back = [OrderCheck::new(), OrderCheck::new(), OrderCheck::new()];
    let rx = Node::builder("rx")
        .cluster("t-lent-order")
        .pool_threads(3)
        .on_message_ref(check.lent_handler());
    let [s0, s1, s2] = [0, 1, 2].map(|i| {
        Node::builder(&format!("s{i}"))
            .cluster("t-lent-order")
            .on_message_ref(back[i].lent_handler())
    });
    let [rx, s0, s1, s2] = connected([rx, s0, s1, s2]);
    thread::scope(|scope| {
        for s in [&s0, &s1, &s2] {
            scope.spawn(move || {
                let mut i = 0;
                while i < COUNT {
                    if i % 7 == 0 {
                        // A batch: one run on the wire when it fits.
                        let batch: Vec<Vec<u8>> = (i..(i + 5).min(COUNT))
                            .map(|k| payload(k, 8 + (k as usize % 48)))
                            .collect();
                        i += batch.len() as u64;
                        s.send_batch("rx", batch).expect("batch sent");
                    } else {
                        s.send("rx", payload(i, mixed_size(i))).expect("sent");
                        i += 1;
                    }
                }
            });
        }
        scope.spawn(|| {
            for i in 0..COUNT / 10 {
                for to in ["s0", "s1", "s2"] {
                    rx.send(to, payload(i, mixed_size(i))).expect("sent back");
                }
            }
        });
    });
    wait_until("every message lent to rx", PATIENCE, || {
        check.total() == 3 * COUNT
    });
    wait_until("every message lent back", PATIENCE, || {
        back.iter().all(|b| b.total() == COUNT / 10)
    });
    check.assert_got_exactly("rx", &["s0", "s1", "s2"], COUNT);
    for (i, b) in back.iter().enumerate() {
        b.assert_got_exactly(&format!("s{i}"), &["rx"], COUNT / 10);
    }
    let nodes = [rx, s0, s1, s2];
    wait_windows_whole(&nodes);
    shutdown_all(&nodes);
}

/// What the application keeps of a lent message — its bytes (`payload_bytes`) and a
/// delivery of its own (`to_delivery`) — stays intact after the call, while the buffers the
/// messages came in are long reused by later reads; the kept delivery says the same as the
/// lent message did.
#[test]
fn what_is_kept_of_a_lent_message_outlives_the_call() {
    const COUNT: u64 = 2_000;
    type Kept = (Bytes, Delivery, String, Option<u64>);
    let kept: Arc<Mutex<Vec<Kept>>> = Arc::new(Mutex::new(Vec::new()));
    let keep = kept.clone();
    let rx = Node::builder("rx")
        .cluster("t-lent-keep")
        .on_message_ref(move |m| {
            let seen = (
                m.payload_bytes(),
                m.to_delivery(),
                m.from().to_owned(),
                m.seq(),
            );
            keep.lock().unwrap().push(seen);
        });
    let tx = Node::builder("tx").cluster("t-lent-keep");
    let [rx, tx] = connected([rx, tx]);
    for i in 0..COUNT {
        tx.send("rx", payload(i, 8 + (i as usize * 13) % 300))
            .expect("sent");
    }
    wait_until("every message kept", PATIENCE, || {
        kept.lock().unwrap().len() as u64 == COUNT
    });
    // More traffic through the same buffers before the kept bytes are read.
    for i in COUNT..2 * COUNT {
        tx.send("rx", payload(i, 64)).expect("sent");
    }
    wait_until("the later messages kept", PATIENCE, || {
        kept.lock().unwrap().len() as u64 == 2 * COUNT
    });
    let kept = kept.lock().unwrap();
    for (i, (bytes, d, from, seq)) in kept.iter().enumerate() {
        assert_eq!(counter_of(bytes), Ok(i as u64), "kept bytes of message {i}");
        assert_eq!(
            d.payload(),
            bytes,
            "the kept delivery's bytes of message {i}"
        );
        assert_eq!((d.from(), d.seq()), (from.as_str(), *seq), "message {i}");
        assert_eq!(d.from(), "tx");
        assert_eq!(*seq, Some(i as u64 + 1), "message {i}'s sequence number");
        assert!(
            d.sender().is_some(),
            "a kept delivery carries the node's send handle"
        );
    }
    drop(kept);
    shutdown_all(&[rx, tx]);
}

/// Requests lent to the handler: one answered in the call, one kept as a delivery and
/// answered later from another thread, one left unanswered (its requester fails at once,
/// told it went unanswered), and a plain message the handler answers through the lent
/// message's send handle.
#[test]
fn lent_requests_are_answered_in_the_call_later_or_told_unanswered() {
    let (later_tx, later_rx) = mpsc::channel::<Delivery>();
    let later_tx = Mutex::new(later_tx);
    let server = Node::builder("server")
        .cluster("t-lent-request")
        .on_message_ref(move |m| match m.payload() {
            b"now" => {
                assert!(m.is_request() && m.reply_room().is_some());
                m.reply(b"answered now".to_vec()).expect("replied");
            }
            b"later" => later_tx
                .lock()
                .unwrap()
                .send(m.to_delivery())
                .expect("kept"),
            b"never" => {}
            b"echo" => {
                assert!(!m.is_request() && m.reply_room().is_none());
                let refused = m.reply(b"no".to_vec()).expect_err("not a request");
                assert!(matches!(refused.error(), Error::NotARequest), "{refused}");
                let node = m.sender().expect("a lent message carries the send handle");
                node.try_send(m.from(), b"echoed".to_vec()).expect("echoed");
            }
            other => panic!("unexpected {other:?}"),
        });
    let echoes = Arc::new(AtomicU64::new(0));
    let heard = echoes.clone();
    let client = Node::builder("client")
        .cluster("t-lent-request")
        .on_message_ref(move |m| {
            assert_eq!(m.payload(), b"echoed");
            heard.fetch_add(1, Ordering::SeqCst);
        });
    let [server, client] = connected([server, client]);
    let answer = thread::spawn(move || {
        let d = later_rx.recv_timeout(PATIENCE).expect("the kept request");
        d.reply(b"answered later".to_vec()).expect("replied later");
    });
    let timeout = Duration::from_secs(20);
    assert_eq!(
        client
            .request("server", b"now".to_vec(), timeout)
            .expect("reply"),
        Bytes::from_static(b"answered now")
    );
    assert_eq!(
        client
            .request("server", b"later".to_vec(), timeout)
            .expect("reply"),
        Bytes::from_static(b"answered later")
    );
    answer.join().expect("answered");
    match client.request("server", b"never".to_vec(), timeout) {
        Err(e) => assert!(
            matches!(
                e.error(),
                Error::ReplyFailed {
                    reason: ReplyFailure::Unanswered,
                    ..
                }
            ),
            "{e}"
        ),
        Ok(r) => panic!("an unanswered request got {r:?}"),
    }
    client.send("server", b"echo".to_vec()).expect("sent");
    wait_until("the echo", PATIENCE, || echoes.load(Ordering::SeqCst) == 1);
    shutdown_all(&[server, client]);
}

/// A lent handler that panics on some messages: the panics are caught and counted, every
/// other message is lent once and in order, out-of-band messages are lent too, and the
/// window is whole at the end (a message whose handler panicked returns its credit).
#[test]
fn a_panicking_lent_handler_loses_nothing_else() {
    const COUNT: u64 = 2_000;
    const OOB: u64 = 50;
    let next = Arc::new(Mutex::new((0u64, Vec::<String>::new())));
    let oob = Arc::new(AtomicU64::new(0));
    let (seen, oob_seen) = (next.clone(), oob.clone());
    let rx = Node::builder("rx")
        .cluster("t-lent-panic")
        .on_message_ref(move |m| {
            if m.is_oob() {
                oob_seen.fetch_add(1, Ordering::SeqCst);
                return;
            }
            let n = counter_of(m.payload()).expect("a whole payload");
            {
                let mut s = seen.lock().unwrap();
                if n != s.0 {
                    let e = format!("{n} after {}", s.0);
                    s.1.push(e);
                }
                s.0 = n + 1;
            }
            if n % 10 == 3 {
                panic!("deliberate panic on message {n}");
            }
        });
    let tx = Node::builder("tx").cluster("t-lent-panic");
    let [rx, tx] = connected([rx, tx]);
    for i in 0..COUNT {
        tx.send("rx", payload(i, 8 + (i as usize) % 100))
            .expect("sent");
        if i % (COUNT / OOB) == 0 {
            tx.send_with("rx", payload(i, 16), SendOptions::new().oob())
                .expect("sent out of band");
        }
    }
    wait_until("every message lent", PATIENCE, || {
        next.lock().unwrap().0 == COUNT && oob.load(Ordering::SeqCst) == OOB
    });
    let errors = next.lock().unwrap().1.clone();
    assert!(errors.is_empty(), "out of order: {errors:?}");
    assert_eq!(
        rx.stats().pool.panics,
        COUNT / 10,
        "every panic caught and counted"
    );
    let nodes = [rx, tx];
    wait_windows_whole(&nodes);
    shutdown_all(&nodes);
}

/// A journalling receiver with a lent handler: what it handled is recorded as delivered
/// (its progress) only after the handler returned, and acknowledged, so the sender's window
/// comes back whole and every message is lent once, in order; a restart of the receiver on
/// its journal redelivers nothing it handled.
#[test]
fn a_journalling_receiver_lends_each_message_once() {
    const COUNT: u64 = 1_000;
    let dir = TempDir::new("lent-journal");
    let check = OrderCheck::new();
    let rx = Node::builder("rx")
        .cluster("t-lent-journal")
        .journal(dir.path())
        .on_message_ref(check.lent_handler());
    let tx = Node::builder("tx").cluster("t-lent-journal");
    let [rx, tx] = connected([rx, tx]);
    for i in 0..COUNT {
        tx.send("rx", payload(i, 8 + (i as usize * 7) % 200))
            .expect("sent");
    }
    wait_until("every message lent", PATIENCE, || check.total() == COUNT);
    let nodes = [rx, tx];
    wait_windows_whole(&nodes);
    let [rx, tx] = nodes;
    let addr = rx.local_addr();
    rx.shutdown(SHUTDOWN).expect("rx shuts down");
    // The same member on its journal: what was handled stays handled.
    let again = OrderCheck::new();
    let rx = Node::builder("rx")
        .cluster("t-lent-journal")
        .listen(addr)
        .journal(dir.path())
        .on_message_ref(again.lent_handler())
        .start()
        .expect("rx restarts on its journal");
    rx.add_peer("tx", tx.local_addr()).expect("tx known");
    // The marker comes after anything redelivered: wait for it, then count.
    tx.send("rx", payload(COUNT, 8))
        .expect("sent after the restart");
    wait_until("the message after the restart", PATIENCE, || {
        again.count_from("tx") == COUNT + 1
    });
    assert_eq!(
        again.total(),
        1,
        "nothing handled before the restart came again"
    );
    check.assert_got_exactly("rx", &["tx"], COUNT);
    shutdown_all(&[rx, tx]);
}
