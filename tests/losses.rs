//! Every loss told as early as it can be known, over real sockets:
//!
//! - a message larger than the peer accepts fails its send with `TooLarge` (payload back)
//!   once the peer's handshake told its limit, also while the peer is away; one queued
//!   before the limit was known goes to `on_undelivered` when it is found at publish;
//! - a message whose ttl passes while it waits goes to `on_undelivered`;
//! - `connected_only` sends and requests fail at once with `NotConnected` when the peer has
//!   no established connection, instead of queueing;
//! - a request given up before it left (timed out, or its handle dropped) is withdrawn:
//!   the peer's handler never runs it.
//!
//! In each, what the application sent adds up: delivered + reported (to `on_undelivered`,
//! or by the call that failed) = sent.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cohort::{Bytes, Error, Node, RequestOptions, SendOptions};
use support::*;

/// What `on_undelivered` was given, per call: the peer and the payloads.
type Reports = Arc<Mutex<Vec<(String, Vec<Bytes>)>>>;

fn reported(r: &Reports) -> Vec<Bytes> {
    r.lock()
        .expect("reports")
        .iter()
        .flat_map(|(_, msgs)| msgs.iter().cloned())
        .collect()
}

/// The receiver's limit.
const LIMIT: usize = 1024;
const LARGE: usize = 2 * LIMIT;
const SMALL: usize = LIMIT / 2;

/// Message `i` of the interleaved stream: even ones are small, odd ones larger than the
/// receiver accepts.
fn interleaved(i: u64) -> Vec<u8> {
    payload(i, if i % 2 == 0 { SMALL } else { LARGE })
}

/// With the receiver's limit known (it came in its handshake), each message larger than it
/// fails its send with `TooLarge` at once, its payload handed back; the others are
/// delivered. Nothing is accepted that cannot be delivered: delivered + refused = sent,
/// nothing failed later.
#[test]
fn a_message_larger_than_the_peer_accepts_fails_its_send_once_the_limit_is_known() {
    let delivered = Counter::new();
    let reports: Reports = Arc::default();
    let r = reports.clone();
    let [a, b] = connected([
        Node::builder("a")
            .cluster("t-losses-large")
            .on_undelivered(move |peer, msgs| {
                r.lock().expect("reports").push((peer.to_owned(), msgs))
            }),
        Node::builder("b")
            .cluster("t-losses-large")
            .max_message(LIMIT)
            .on_message(delivered.handler()),
    ]);
    let mut refused = 0u64;
    for i in 0..200u64 {
        let p = interleaved(i);
        match a.send("b", p.clone()) {
            Ok(()) => assert!(
                p.len() <= LIMIT,
                "message {i} of {} bytes accepted",
                p.len()
            ),
            Err(e) => {
                assert!(
                    matches!(e.error(), Error::TooLarge { len, max } if *len == LARGE && *max == LIMIT),
                    "message {i}: {e}"
                );
                assert_eq!(&e.into_inner()[..], &p[..], "the payload comes back");
                refused += 1;
            }
        }
    }
    wait_until_or(
        PATIENCE,
        || delivered.get() == 100,
        || format!("100 small messages delivered:\n{}", a.stats()),
    );
    wait_window_whole(&a, "b");
    let s = peer_stats(&a, "b");
    println!(
        "sent 200: refused at send {refused}, delivered {}, reported {}, accepted {}, failed {}",
        delivered.get(),
        reported(&reports).len(),
        s.accepted,
        s.failed
    );
    assert_eq!(refused, 100);
    assert_eq!((s.accepted, s.sent, s.failed), (100, 100, 0));
    assert!(reported(&reports).is_empty());
    assert_eq!(delivered.get() + refused, 200);
    shutdown_all(&[a, b]);
}

/// Messages queued while the receiver is not up yet (its limit unknown) are accepted; the
/// ones larger than its handshake then says it accepts are found at publish and reported
/// to `on_undelivered`, in send order, while the others are delivered. From then on the
/// limit is known, and kept while the receiver is away: a larger send fails at once.
#[test]
fn a_message_queued_before_the_handshake_and_larger_than_the_peer_accepts_is_reported() {
    queued_before_the_handshake("t-losses-queued-large", LIMIT);
}

/// The same with every message small enough for its sender to encode it into the
/// outbox's runs: the run holding the large ones is taken apart at publish, its large
/// messages reported in send order and the small ones delivered, each once.
#[test]
fn a_message_encoded_at_send_and_larger_than_the_peer_accepts_is_reported() {
    queued_before_the_handshake("t-losses-queued-large-framed", 256);
}

/// Messages alternately `limit / 2` and `2 * limit` bytes queued before the receiver,
/// whose limit is `limit`, is up; see the tests above.
fn queued_before_the_handshake(cluster: &str, limit: usize) {
    const N: u64 = 20;
    let (small, large) = (limit / 2, 2 * limit);
    let interleaved = |i: u64| payload(i, if i % 2 == 0 { small } else { large });
    let held = HeldAddr::new();
    let reports: Reports = Arc::default();
    let r = reports.clone();
    let a = Node::builder("a")
        .cluster(cluster)
        .peer("b", held.addr())
        .redial_quickly()
        .on_undelivered(move |peer, msgs| r.lock().expect("reports").push((peer.to_owned(), msgs)))
        .start()
        .expect("a starts");
    for i in 0..N {
        a.send("b", interleaved(i))
            .expect("queued: the limit is not known yet");
    }
    let delivered = Counter::new();
    let b = receiver_b(cluster, held.addr())
        .max_message(limit)
        .on_message(delivered.handler())
        .start()
        .expect("b starts");
    wait_until_or(
        PATIENCE,
        || delivered.get() == N / 2 && reported(&reports).len() as u64 == N / 2,
        || {
            format!(
                "{} delivered and {} reported (of {N}):\n{}",
                delivered.get(),
                reported(&reports).len(),
                a.stats()
            )
        },
    );
    let lost = reported(&reports);
    let expected: Vec<Vec<u8>> = (0..N).filter(|i| i % 2 == 1).map(interleaved).collect();
    assert!(
        lost.iter().map(|b| b.to_vec()).eq(expected),
        "the large messages, in send order"
    );
    assert!(reports
        .lock()
        .expect("reports")
        .iter()
        .all(|(peer, _)| peer == "b"));
    wait_window_whole(&a, "b");
    let s = peer_stats(&a, "b");
    assert_eq!((s.accepted, s.sent, s.failed), (N, N / 2, N / 2));
    assert_eq!(delivered.get() + lost.len() as u64, N);
    // The limit is known now, and kept while b is away.
    let e = a.send("b", payload(N, large)).expect_err("too large for b");
    assert!(
        matches!(e.error(), Error::TooLarge { max, .. } if *max == limit),
        "{e}"
    );
    b.shutdown(SHUTDOWN).expect("b shuts down");
    wait_until("a sees b gone", PATIENCE, || !is_connected(&a, "b"));
    let e = a
        .send("b", payload(N + 1, large))
        .expect_err("still too large");
    assert!(matches!(e.error(), Error::TooLarge { .. }), "{e}");
    assert_eq!(&e.into_inner()[..], &payload(N + 1, large)[..]);
    a.send("b", payload(N + 2, small))
        .expect("a small one is queued for b's return");
    a.shutdown(SHUTDOWN).expect("a shuts down");
    assert_eq!(
        reported(&reports).last().map(|b| b.to_vec()),
        Some(payload(N + 2, small)),
        "the message still queued at shutdown is reported too"
    );
}

/// A request queued before the receiver's limit was known, and larger than it, fails its
/// `PendingReply` with `TooLarge` as soon as it is found at publish — not at its timeout —
/// and the receiver's handler never sees it; a request that fits is answered.
#[test]
fn a_request_larger_than_the_peer_accepts_fails_its_reply_at_once() {
    let held = HeldAddr::new();
    let a = Node::builder("a")
        .cluster("t-losses-large-request")
        .peer("b", held.addr())
        .redial_quickly()
        .start()
        .expect("a starts");
    let big = a
        .send_request("b", payload(0, LARGE))
        .expect("queued: the limit is not known yet");
    let small = a.send_request("b", payload(1, SMALL)).expect("queued");
    let ran = Arc::new(AtomicU64::new(0));
    let r = ran.clone();
    let b = receiver_b("t-losses-large-request", held.addr())
        .max_message(LIMIT)
        .on_message(move |m| {
            r.fetch_add(1, Ordering::SeqCst);
            let _ = m.reply(&b"ok"[..]);
        })
        .start()
        .expect("b starts");
    let t = Instant::now();
    let e = big.wait(PATIENCE).expect_err("too large for b");
    println!(
        "the oversized request failed {:?} after b started",
        t.elapsed()
    );
    assert!(
        matches!(e, Error::TooLarge { len, max } if len == LARGE && max < LIMIT),
        "{e}"
    );
    assert!(
        t.elapsed() < PATIENCE / 2,
        "failed at once, not at a timeout"
    );
    assert_eq!(&small.wait(PATIENCE).expect("answered")[..], b"ok");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "only the request that fits ran"
    );
    // Known now: the next one fails its send at once.
    let e = a
        .send_request("b", payload(2, LARGE))
        .expect_err("too large");
    assert!(matches!(e.error(), Error::TooLarge { .. }), "{e}");
    assert_eq!(e.into_inner().len(), LARGE, "the payload is handed back");
    shutdown_all(&[a, b]);
}

/// A message whose ttl passes while its peer is not connected fails (counted `expired` and
/// `failed`, permits back) and is reported to `on_undelivered`.
#[test]
fn an_expired_message_is_reported_to_on_undelivered() {
    let held = HeldAddr::new(); // nothing ever listens: the peer is down for the test
    let reports: Reports = Arc::default();
    let r = reports.clone();
    let a = Node::builder("a")
        .cluster("t-losses-expired")
        .peer("b", held.addr())
        .on_undelivered(move |peer, msgs| r.lock().expect("reports").push((peer.to_owned(), msgs)))
        .start()
        .expect("a starts");
    let ttl = SendOptions::new().ttl(Duration::from_millis(20));
    let sent_at = Instant::now();
    a.send_with("b", payload(7, 100), ttl).expect("queued");
    a.send_with("b", payload(8, 100), ttl.oob())
        .expect("queued");
    wait_until_or(
        PATIENCE,
        || reported(&reports).len() == 2,
        || format!("both expired messages reported:\n{}", a.stats()),
    );
    println!("reported {:?} after sending", sent_at.elapsed());
    let lost: Vec<Vec<u8>> = reported(&reports).iter().map(|b| b.to_vec()).collect();
    assert_eq!(lost, vec![payload(7, 100), payload(8, 100)]);
    let s = peer_stats(&a, "b");
    assert_eq!((s.accepted, s.expired, s.failed, s.queued), (2, 2, 2, 0));
    assert_eq!(s.available, s.window, "permits back");
    a.shutdown(SHUTDOWN).expect("a shuts down");
}

/// Messages sent one after another to a peer that stays down each expire when their ttl
/// passes, however quiet the node is between them. With heartbeats and redials a minute
/// and more apart nothing else wakes the node, and the sends after the first ring nobody
/// (the peer stays scheduled while it is away): the housekeeping tick must not be put off
/// while such a send may come.
#[test]
fn messages_to_a_peer_that_stays_down_expire_one_after_another() {
    let held = HeldAddr::new();
    let reports: Reports = Arc::default();
    let r = reports.clone();
    let a = Node::builder("a")
        .cluster("t-losses-expired-quiet")
        .peer("b", held.addr())
        .heartbeat(Duration::from_secs(120), Duration::from_secs(600))
        .reconnect_backoff(Duration::from_secs(120), Duration::from_secs(120))
        .on_undelivered(move |peer, msgs| r.lock().expect("reports").push((peer.to_owned(), msgs)))
        .start()
        .expect("a starts");
    let ttl = SendOptions::new().ttl(Duration::from_millis(20));
    for i in 0..3u64 {
        a.send_with("b", payload(i, 100), ttl).expect("queued");
        wait_until_or(
            PATIENCE,
            || reported(&reports).len() as u64 == i + 1,
            || format!("message {i} expired and reported:\n{}", a.stats()),
        );
    }
    let s = peer_stats(&a, "b");
    assert_eq!((s.accepted, s.expired, s.queued), (3, 3, 0));
    assert_eq!(s.available, s.window, "permits back");
    a.shutdown(SHUTDOWN).expect("a shuts down");
}

/// `connected_only` fails a send or a request at once with `NotConnected` (the payload
/// handed back, nothing queued) while the peer has no established connection; once it is
/// connected, they go through.
#[test]
fn connected_only_fails_fast_while_the_peer_is_not_connected() {
    let held = HeldAddr::new();
    let a = Node::builder("a")
        .cluster("t-losses-connected-only")
        .peer("b", held.addr())
        .redial_quickly()
        .start()
        .expect("a starts");
    let now_only = SendOptions::new().connected_only();
    let t = Instant::now();
    let e = a
        .send_with("b", payload(0, 64), now_only)
        .expect_err("b is down");
    let send_took = t.elapsed();
    assert!(
        matches!(e.error(), Error::NotConnected(p) if p == "b"),
        "{e}"
    );
    assert_eq!(
        &e.into_inner()[..],
        &payload(0, 64)[..],
        "the payload comes back"
    );
    let to_b = a.sender().to("b").expect("a peer");
    let e = to_b
        .send_with(payload(1, 64), now_only.oob())
        .expect_err("b is down");
    assert!(matches!(e.error(), Error::NotConnected(_)), "{e}");
    let t = Instant::now();
    let r = a.request_with(
        "b",
        payload(2, 64),
        Duration::from_secs(2),
        RequestOptions::new().connected_only(),
    );
    let request_took = t.elapsed();
    let (back, e) = r.expect_err("not connected").into_parts();
    assert!(matches!(e, Error::NotConnected(_)), "{e}");
    assert_eq!(
        back.as_deref(),
        Some(&payload(2, 64)[..]),
        "never queued: handed back"
    );
    let r = to_b.send_request_with(payload(3, 64), RequestOptions::new().connected_only());
    let (back, e) = r.expect_err("not connected").into_parts();
    assert!(matches!(e, Error::NotConnected(_)), "{e}");
    assert_eq!(&back[..], &payload(3, 64)[..], "the payload is handed back");
    println!("send_with(connected_only) failed in {send_took:?}, request_with(connected_only, 2 s) in {request_took:?}");
    assert!(send_took < Duration::from_millis(100), "{send_took:?}");
    assert!(
        request_took < Duration::from_millis(100),
        "{request_took:?}"
    );
    let s = peer_stats(&a, "b");
    assert_eq!((s.accepted, s.requests_in_flight), (0, 0), "nothing queued");
    assert_eq!(s.available, s.window);

    // Once b is up and connected, the same options go through.
    let delivered = Counter::new();
    let d = delivered.clone();
    let b = receiver_b("t-losses-connected-only", held.addr())
        .on_message(move |m| {
            if m.is_request() {
                let _ = m.reply(m.payload().to_vec());
            } else {
                d.add();
            }
        })
        .start()
        .expect("b starts");
    wait_until("a connected to b", PATIENCE, || is_connected(&a, "b"));
    a.send_with("b", payload(4, 64), now_only)
        .expect("connected: accepted");
    let reply = a
        .request_with(
            "b",
            payload(5, 64),
            PATIENCE,
            RequestOptions::new().connected_only(),
        )
        .expect("connected: answered");
    assert_eq!(&reply[..], &payload(5, 64)[..]);
    wait_until("the message delivered", PATIENCE, || delivered.get() == 1);
    shutdown_all(&[a, b]);
}

/// Requests queued for a peer that is down and given up before it comes back — one timed
/// out, one with a zero timeout, one whose `PendingReply` was dropped — are withdrawn:
/// their permits come back while the peer is still down, and once it is up its handler
/// never sees them, while a later request is answered.
#[test]
fn a_request_given_up_before_it_left_is_never_run() {
    let held = HeldAddr::new();
    let a = Node::builder("a")
        .cluster("t-losses-withdrawn")
        .peer("b", held.addr())
        .redial_quickly()
        .start()
        .expect("a starts");
    let stale: Vec<Vec<u8>> = (0..3u64).map(|i| payload(i, 32)).collect();
    let t = Instant::now();
    let r = a.request("b", stale[0].clone(), Duration::from_millis(50));
    assert!(
        matches!(r.as_ref().map_err(|e| e.error()), Err(Error::NoReply(_))),
        "{r:?}"
    );
    assert!(t.elapsed() >= Duration::from_millis(50));
    let r = a.request("b", stale[1].clone(), Duration::ZERO);
    assert!(
        matches!(r.as_ref().map_err(|e| e.error()), Err(Error::NoReply(_))),
        "{r:?}"
    );
    drop(a.send_request("b", stale[2].clone()).expect("queued"));
    // Withdrawn while b is away: the window is whole again before b is up.
    wait_until_or(
        PATIENCE,
        || {
            let s = peer_stats(&a, "b");
            s.withdrawn == 3 && s.available == s.window
        },
        || format!("three requests withdrawn:\n{}", a.stats()),
    );

    let ran: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let seen = ran.clone();
    let b = receiver_b("t-losses-withdrawn", held.addr())
        .on_message(move |m| {
            seen.lock().expect("log").push(m.payload().to_vec());
            let _ = m.reply(&b"done"[..]);
        })
        .start()
        .expect("b starts");
    let fresh = payload(9, 32);
    let reply = a
        .request("b", fresh.clone(), PATIENCE)
        .expect("a later request is answered");
    assert_eq!(&reply[..], b"done");
    // In order: whatever came before the fresh request has been handled by now.
    let ran = ran.lock().expect("log").clone();
    let stale_runs = ran.iter().filter(|p| stale.contains(p)).count();
    println!(
        "handler ran {stale_runs} of the 3 given-up requests, {} in all",
        ran.len()
    );
    assert_eq!(stale_runs, 0, "a given-up request ran");
    assert_eq!(ran, vec![fresh]);
    let s = peer_stats(&a, "b");
    assert_eq!((s.accepted, s.sent, s.filtered, s.withdrawn), (4, 1, 3, 3));
    assert_eq!(s.late_replies, 0);
    shutdown_all(&[a, b]);
}

/// A node shut down with requests its callers gave up (timed out, or a dropped
/// `PendingReply`) still queued for a peer that is down: they are withdrawn, as at publish
/// — their callers were told already — and neither failed nor reported; a plain message
/// queued beside them fails and is reported.
#[test]
fn a_request_given_up_before_it_left_is_not_reported_at_shutdown() {
    let held = HeldAddr::new();
    let reports: Reports = Arc::default();
    let r = reports.clone();
    let a = Node::builder("a")
        .cluster("t-losses-withdrawn-at-stop")
        .peer("b", held.addr())
        .on_undelivered(move |peer, msgs| r.lock().expect("reports").push((peer.to_owned(), msgs)))
        .start()
        .expect("a starts");
    let r = a.request("b", payload(0, 32), Duration::ZERO);
    assert!(
        matches!(r.as_ref().map_err(|e| e.error()), Err(Error::NoReply(_))),
        "{r:?}"
    );
    drop(a.send_request("b", payload(1, 32)).expect("queued"));
    a.send("b", payload(2, 32)).expect("queued");
    // At once: before the housekeeping tick would have withdrawn them.
    let report = a.shutdown(SHUTDOWN).expect("a stops");
    let reports = reports.lock().expect("reports").clone();
    let reported: Vec<Bytes> = reports.into_iter().flat_map(|(_, m)| m).collect();
    assert_eq!(
        reported,
        vec![Bytes::from(payload(2, 32))],
        "only the plain message is reported\n{report:?}"
    );
    let s = peer_stats(&a, "b");
    assert_eq!(
        (s.accepted, s.failed, s.filtered, s.withdrawn),
        (3, 1, 2, 2),
        "{}",
        a.stats()
    );
}

/// The counters and the callback agree: of the messages accepted for a peer, each is
/// delivered or reported (here: some expire while the peer is down, the rest are delivered
/// once it is up), and `on_undelivered` got exactly `failed + undelivered` of them.
#[test]
fn what_is_accepted_is_delivered_or_reported() {
    const N: u64 = 40;
    let held = HeldAddr::new();
    let reports: Reports = Arc::default();
    let r = reports.clone();
    let a = Node::builder("a")
        .cluster("t-losses-books")
        .peer("b", held.addr())
        .redial_quickly()
        .on_undelivered(move |peer, msgs| r.lock().expect("reports").push((peer.to_owned(), msgs)))
        .start()
        .expect("a starts");
    let short = SendOptions::new().ttl(Duration::from_millis(10));
    for i in 0..N {
        if i % 4 == 0 {
            a.send_with("b", payload(i, 64), short).expect("queued");
        } else {
            a.send("b", payload(i, 64)).expect("queued");
        }
    }
    wait_until_or(
        PATIENCE,
        || peer_stats(&a, "b").expired == N / 4,
        || format!("{} expired:\n{}", N / 4, a.stats()),
    );
    let delivered = Arc::new(AtomicU64::new(0));
    let d = delivered.clone();
    let b = receiver_b("t-losses-books", held.addr())
        .on_message(move |_| {
            d.fetch_add(1, Ordering::SeqCst);
        })
        .start()
        .expect("b starts");
    wait_until_or(
        PATIENCE,
        || delivered.load(Ordering::SeqCst) == N - N / 4,
        || format!("the rest delivered:\n{}", a.stats()),
    );
    let s = peer_stats(&a, "b");
    let told = reported(&reports).len() as u64;
    assert_eq!(delivered.load(Ordering::SeqCst) + told, s.accepted);
    assert_eq!(told, s.failed + s.undelivered);
    shutdown_all(&[a, b]);
}
