//! Every permit comes back (invariants 2 and 3), end to end over real TCP:
//!
//! - an outbound filter that drops 60% of 20 windows' worth of messages: the run completes,
//!   the receiver gets exactly the kept messages in order with consecutive sequence numbers,
//!   `filtered` counts the drops, `sent` what the receiver got, and the window ends whole;
//! - every other exit path ends with the window whole: too large (locally: no permit taken;
//!   for the peer: failed at publish, permit back), expired while queued, failed at
//!   shutdown, and a sender blocked on a removed peer wakes with `Error::Closed`;
//! - a credit probe returns credit stranded below half a window that a blocked sender needs;
//! - `broadcast` with one stalled peer: only that peer is refused (`Error::Full`), the
//!   others keep receiving;
//! - the stats add up at every instant they are read while traffic flows.
//!
//! No test sleeps to wait for an event: each waits on a condition with a deadline.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cohort::internals::flow::{cost, MESSAGE_OVERHEAD};
use cohort::{Bytes, Error, Node, PeerState, PeerStats, SendError, SendOptions, TrySendError};
use support::*;

/// The send window of the tests, bytes.
const W: u64 = 64 * 1024;

/// A deterministic xorshift64 generator, seeded by the test.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform-ish in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

/// The counters add up: `accepted == sent + filtered + failed + queued` (messages and
/// bytes), the window is never over-committed, and `expired` is part of `failed`.
fn assert_adds_up(p: &PeerStats) {
    assert_eq!(
        p.accepted,
        p.sent + p.filtered + p.failed + p.queued,
        "accepted == sent + filtered + failed + queued: {p:?}"
    );
    assert_eq!(
        p.accepted_bytes,
        p.sent_bytes + p.filtered_bytes + p.failed_bytes + p.queued_bytes,
        "the same in bytes: {p:?}"
    );
    assert!(p.in_flight <= p.window, "window over-committed: {p:?}");
    assert!(p.available <= p.window, "window over-released: {p:?}");
    assert!(p.expired <= p.failed, "expired is part of failed: {p:?}");
}

/// Waits until `node`'s window to `peer` is whole (`available == window`, nothing in
/// flight, nothing queued).
fn wait_window_whole_and_idle(nodes: &[Node], node: &Node, peer: &str) {
    wait_until_or(
        PATIENCE,
        || {
            let p = peer_stats(node, peer);
            p.available == p.window && p.in_flight == 0 && p.queued == 0
        },
        || {
            format!(
                "{}'s window to {peer} to be whole again; stats:\n{}",
                node.name(),
                all_stats(nodes)
            )
        },
    );
}

/// One message the receiver got: payload counter, `seq()`, payload length.
type Got = Arc<Mutex<Vec<(u64, Option<u64>, usize)>>>;

fn recorder(got: &Got) -> impl Fn(cohort::Delivery) + Send + Sync + 'static {
    let got = got.clone();
    move |d: cohort::Delivery| {
        let n = counter_of(d.payload()).unwrap_or(u64::MAX);
        got.lock().unwrap().push((n, d.seq(), d.payload().len()));
    }
}

/// Filtered messages give their permits back (invariants 2 and 3). An outbound filter drops
/// 60% of the messages at random (a seeded PRNG, so the run is reproducible), with a window
/// of W bytes and 20×W bytes sent in messages of a few hundred bytes, by one thread calling
/// the blocking `send`. The run completes — with the filter's permits leaking, the window
/// would run dry after about W of drops and the sender would park for good — and:
///
/// - the filter is consulted once per message, in send order, with the peer as it is;
/// - the receiver got exactly the kept messages, in order, with seq 1, 2, 3, … (a filtered
///   message gets no sequence number);
/// - `filtered` (and `filtered_bytes`) equal what the filter dropped, `sent` what the
///   receiver got, nothing failed, and the counters add up;
/// - the window is whole at the end.
#[test]
fn filter_drops_60_percent_of_20_windows_and_every_permit_comes_back() {
    const SEED: u64 = 0x9e37_79b9_7f4a_7c15;
    const DROP_PERCENT: u64 = 60;

    // (counter, payload length, kept) in the order the filter saw them.
    let decisions: Arc<Mutex<Vec<(u64, usize, bool)>>> = Arc::default();
    let dropped = Arc::new(AtomicU64::new(0));
    let filter_errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let got: Got = Arc::default();

    let receiver = Node::builder("fl-rx")
        .cluster("t-permits-filter")
        .pool_threads(2)
        .on_message(recorder(&got))
        .start()
        .expect("start");
    let rx_launch = receiver.launch_id();
    let rng = Mutex::new(Rng::new(SEED));
    let (dec, drp, errs) = (decisions.clone(), dropped.clone(), filter_errors.clone());
    let sender = Node::builder("fl-tx")
        .cluster("t-permits-filter")
        .pool_threads(1)
        .window_bytes(W)
        .outbound_filter(move |peer, msg| {
            if peer.name != "fl-rx"
                || peer.state != PeerState::Connected
                || peer.launch_id != Some(rx_launch)
            {
                errs.lock().unwrap().push(format!("filter saw {peer:?}"));
            }
            let keep = rng.lock().unwrap().next() % 100 >= DROP_PERCENT;
            if !keep {
                drp.fetch_add(1, Ordering::SeqCst);
            }
            let n = counter_of(msg.payload()).unwrap_or(u64::MAX);
            dec.lock().unwrap().push((n, msg.payload().len(), keep));
            keep
        })
        .start()
        .expect("start");
    let nodes = [sender, receiver];
    introduce(&nodes);
    wait_mesh_connected(&nodes);
    let [sender, receiver] = &nodes;

    // 20 windows' worth of payload, a few hundred bytes a message, sizes from a PRNG.
    let mut sizes = Vec::new();
    let mut size_rng = Rng::new(SEED ^ 0xabcd);
    let mut total = 0u64;
    while total < 20 * W {
        let s = size_rng.range(100, 700);
        total += s as u64;
        sizes.push(s);
    }
    let n = sizes.len() as u64;
    let tx = sender.sender();
    let sizes_for_thread = sizes.clone();
    let sending = std::thread::spawn(move || {
        for (i, s) in sizes_for_thread.into_iter().enumerate() {
            tx.send("fl-rx", payload(i as u64, s))?;
        }
        Ok::<(), Error>(())
    });
    join_within(
        "the sender to get 20 windows through a filter dropping 60% (a stall here means \
         filtered messages leak their permits)",
        &nodes,
        sending,
    )
    .expect("every send succeeds");

    // Everything is published or filtered, everything published is delivered, and every
    // permit comes back.
    wait_until_or(
        PATIENCE,
        || {
            let tx = peer_stats(sender, "fl-rx");
            tx.queued == 0
                && got.lock().unwrap().len() as u64 == tx.sent
                && peer_stats(receiver, "fl-tx").delivered == tx.sent
        },
        || {
            format!(
                "every kept message delivered; stats:\n{}",
                all_stats(&nodes)
            )
        },
    );
    wait_window_whole_and_idle(&nodes, sender, "fl-rx");

    let filter_errors = filter_errors.lock().unwrap();
    assert!(filter_errors.is_empty(), "{filter_errors:?}");
    let decisions = decisions.lock().unwrap().clone();
    assert_eq!(
        decisions.iter().map(|d| d.0).collect::<Vec<_>>(),
        (0..n).collect::<Vec<_>>(),
        "the filter is consulted exactly once per message, in send order"
    );
    let kept: Vec<u64> = decisions.iter().filter(|d| d.2).map(|d| d.0).collect();
    let n_dropped = dropped.load(Ordering::SeqCst);
    let dropped_bytes: u64 = decisions.iter().filter(|d| !d.2).map(|d| d.1 as u64).sum();
    assert_eq!(n_dropped + kept.len() as u64, n);
    // The test is only worth something if the filter dropped well over a window's worth.
    assert!(
        n_dropped * 100 >= n * 55 && dropped_bytes + n_dropped * MESSAGE_OVERHEAD > 10 * W,
        "dropped {n_dropped} of {n} ({dropped_bytes} bytes)"
    );

    let got = got.lock().unwrap().clone();
    assert_eq!(
        got.iter().map(|g| g.0).collect::<Vec<_>>(),
        kept,
        "the receiver got exactly the messages the filter kept, in order"
    );
    assert_eq!(
        got.iter().map(|g| g.1).collect::<Vec<_>>(),
        (1..=kept.len() as u64).map(Some).collect::<Vec<_>>(),
        "sequence numbers are assigned at publish: consecutive, none for filtered messages"
    );
    for &(c, _, len) in &got {
        assert_eq!(len, sizes[c as usize], "message {c} arrived whole");
    }

    let tx = peer_stats(sender, "fl-rx");
    assert_adds_up(&tx);
    assert_eq!(tx.accepted, n, "{tx:?}");
    assert_eq!(tx.accepted_bytes, total, "{tx:?}");
    assert_eq!(
        tx.filtered, n_dropped,
        "filtered == what the filter dropped: {tx:?}"
    );
    assert_eq!(tx.filtered_bytes, dropped_bytes, "{tx:?}");
    assert_eq!(
        tx.sent,
        got.len() as u64,
        "sent == what the receiver got: {tx:?}"
    );
    assert_eq!(tx.sent_bytes, total - dropped_bytes, "{tx:?}");
    assert_eq!((tx.failed, tx.expired, tx.queued), (0, 0, 0), "{tx:?}");
    assert_eq!((tx.available, tx.in_flight), (W, 0), "window whole: {tx:?}");

    let rx = peer_stats(receiver, "fl-tx");
    assert_eq!(rx.received, tx.sent, "{rx:?}");
    assert_eq!(rx.received_bytes, tx.sent_bytes, "{rx:?}");
    assert_eq!(rx.delivered, tx.sent, "{rx:?}");
    assert_eq!(rx.duplicates, 0, "{rx:?}");
    shutdown_all(&nodes);
}

/// Exit path "too large", both kinds (invariant 2). Over this node's `max_message`: every
/// send variant refuses with `Error::TooLarge` before taking a permit (the window stays
/// whole, nothing is accepted). Over the *peer's* maximum (announced in its handshake,
/// known here since the pair is connected): refused the same way, the error naming the
/// peer's maximum; the messages around it are delivered in order, numbered without gaps.
/// (One accepted before the peer's limit was known fails at publish time, its permit given
/// back: `tests/losses.rs`.)
#[test]
fn too_large_takes_no_permit_and_too_large_for_the_peer_gives_it_back() {
    let got: Got = Arc::default();
    let nodes = connected([
        Node::builder("tl-tx")
            .cluster("t-permits-large")
            .pool_threads(1)
            .window_bytes(W)
            .max_message(8000),
        Node::builder("tl-rx")
            .cluster("t-permits-large")
            .pool_threads(1)
            .max_message(1000)
            .on_message(recorder(&got)),
    ]);
    let (sender, receiver) = (&nodes[0], &nodes[1]);

    let too_large = |what: &str, r: Result<(), SendError<Bytes>>| match r {
        Err(e)
            if matches!(
                e.error(),
                Error::TooLarge {
                    len: 8001,
                    max: 1000,
                }
            ) =>
        {
            assert_eq!(
                e.into_inner().len(),
                8001,
                "{what}: the payload is handed back"
            )
        }
        other => panic!("{what}: expected TooLarge {{ 8001, 1000 }}, got {other:?}"),
    };
    too_large("send", sender.send("tl-rx", vec![1u8; 8001]));
    too_large(
        "send_timeout",
        sender.send_timeout("tl-rx", vec![1u8; 8001], Duration::from_secs(1)),
    );
    too_large("send_oob", sender.send_oob("tl-rx", vec![1u8; 8001]));
    too_large(
        "send_with",
        sender.send_with(
            "tl-rx",
            vec![1u8; 8001],
            SendOptions::new().oob().ttl(Duration::from_secs(60)),
        ),
    );
    match sender.try_send("tl-rx", vec![7u8; 8001]) {
        Err(TrySendError::Failed(back, Error::TooLarge { .. })) => {
            assert_eq!(&back[..], &[7u8; 8001][..], "the payload is handed back")
        }
        other => panic!("try_send: expected Failed(_, TooLarge), got {other:?}"),
    }
    let results = sender.broadcast(vec![1u8; 8001]);
    assert_eq!(results.len(), 1, "{results:?}");
    match results
        .into_iter()
        .next()
        .map(|(_, r)| r.map_err(|e| e.into_parts()))
    {
        Some(Err((
            back,
            Error::TooLarge {
                len: 8001,
                max: 1000,
            },
        ))) => assert_eq!(&back[..], &[1u8; 8001][..], "the payload is handed back"),
        other => panic!("broadcast: expected TooLarge {{ 8001, 1000 }}, got {other:?}"),
    }
    let p = peer_stats(sender, "tl-rx");
    assert_eq!(
        (p.accepted, p.failed),
        (0, 0),
        "refused, not accepted: {p:?}"
    );
    assert_eq!((p.available, p.in_flight), (W, 0), "no permit taken: {p:?}");

    // Over the peer's maximum of 1000 bytes (it told us in the handshake), within ours.
    let sizes = [2000usize, 1000, 1500, 10, 1001, 999];
    for (i, &s) in sizes.iter().enumerate() {
        match sender.send("tl-rx", payload(i as u64, s)) {
            Ok(()) => assert!(s <= 1000, "{s} bytes accepted"),
            Err(e) => assert!(
                s > 1000 && matches!(e.error(), Error::TooLarge { len, max: 1000 } if *len == s),
                "{s} bytes: {e}"
            ),
        }
    }
    let fits: Vec<u64> = (0..sizes.len() as u64)
        .filter(|&i| sizes[i as usize] <= 1000)
        .collect();
    wait_until_or(
        PATIENCE,
        || peer_stats(sender, "tl-rx").queued == 0 && got.lock().unwrap().len() == fits.len(),
        || {
            format!(
                "the fitting messages delivered; stats:\n{}",
                all_stats(&nodes)
            )
        },
    );
    wait_window_whole_and_idle(&nodes, sender, "tl-rx");
    let p = peer_stats(sender, "tl-rx");
    assert_adds_up(&p);
    assert_eq!(
        (p.accepted, p.sent, p.failed, p.filtered, p.expired),
        (3, 3, 0, 0, 0),
        "{p:?}"
    );
    let got = got.lock().unwrap().clone();
    assert_eq!(
        got.iter().map(|g| (g.0, g.1)).collect::<Vec<_>>(),
        vec![(1, Some(1)), (3, Some(2)), (5, Some(3))],
        "only the fitting messages, in order, numbered at publish"
    );
    let rx = peer_stats(receiver, "tl-tx");
    assert_eq!((rx.received, rx.delivered), (3, 3), "{rx:?}");
    shutdown_all(&nodes);
}

/// Exit paths "expired while queued", "send timed out" and "node shut down with messages
/// queued" (invariant 2), to a peer that is not up (nothing listens at its address).
/// Messages with a short `ttl` fail as `expired` and give their permits back while the
/// others stay queued and keep theirs; `send_timeout` on the dry window takes nothing; a
/// sender parked on the window wakes with `Error::Closed` at shutdown; the report counts
/// every message that was never published; and the window ends whole.
#[test]
fn queued_to_a_down_peer_expire_or_fail_at_shutdown_with_every_permit_back() {
    const SIZE: usize = 300;
    let down = HeldAddr::new();
    let node = Node::builder("dn-tx")
        .cluster("t-permits-down")
        .pool_threads(1)
        .window_bytes(W)
        .peer("dn-down", down.addr())
        .start()
        .expect("start");
    let nodes = std::slice::from_ref(&node);
    let ttl = SendOptions::new().ttl(Duration::from_millis(20));
    for i in 0..5u64 {
        if i % 2 == 0 {
            node.send_with("dn-down", payload(i, SIZE), ttl)
                .expect("send_with ttl");
        } else {
            node.send("dn-down", payload(i, SIZE)).expect("send");
        }
    }
    wait_until_or(
        PATIENCE,
        || {
            let p = peer_stats(&node, "dn-down");
            p.expired == 3 && p.available == W - 2 * cost(SIZE)
        },
        || {
            format!(
                "the 3 ttl'd messages to expire; stats:\n{}",
                all_stats(nodes)
            )
        },
    );
    let p = peer_stats(&node, "dn-down");
    assert_ne!(p.state, PeerState::Connected, "{p:?}");
    assert_adds_up(&p);
    assert_eq!(
        (p.accepted, p.sent, p.failed, p.expired, p.queued),
        (5, 0, 3, 3, 2),
        "{p:?}"
    );
    assert_eq!(p.failed_bytes, 3 * SIZE as u64, "{p:?}");
    assert_eq!(
        p.in_flight,
        2 * cost(SIZE),
        "only the queued hold permits: {p:?}"
    );

    // Fill the window; a timed-out send takes nothing.
    let mut more = 0u64;
    loop {
        match node.try_send("dn-down", payload(5 + more, SIZE)) {
            Ok(()) => more += 1,
            Err(e) if e.is_full() => break,
            Err(e) => panic!("try_send: {e}"),
        }
        assert!(more <= W / cost(SIZE), "the window never filled");
    }
    assert_eq!(2 + more, W / cost(SIZE));
    match node.send_timeout("dn-down", payload(0, SIZE), Duration::from_millis(10)) {
        Err(e) if matches!(e.error(), Error::TimedOut(_)) => {
            assert_eq!(
                e.into_inner(),
                payload(0, SIZE),
                "the payload is handed back"
            )
        }
        other => panic!("send_timeout on a dry window: {other:?}"),
    }
    let p = peer_stats(&node, "dn-down");
    assert_adds_up(&p);
    assert_eq!((p.accepted, p.queued), (5 + more, 2 + more), "{p:?}");
    assert_eq!(p.in_flight, (2 + more) * cost(SIZE), "{p:?}");

    let blocked = blocked_sender(node.sender(), "dn-down", SIZE);
    let report = node.shutdown(SHUTDOWN).expect("shutdown");
    match blocked.join().expect("sender thread") {
        // The payload comes back: the send still held it while it waited.
        Err(e) if matches!(e.error(), Error::Closed) => assert_eq!(e.into_inner().len(), SIZE),
        other => panic!("a sender blocked at shutdown wakes with Closed: {other:?}"),
    }
    assert_eq!(
        report.failed,
        5 + more,
        "expired + failed at shutdown: {report:?}"
    );
    assert_eq!(report.undelivered, 0, "{report:?}");
    let p = peer_stats(&node, "dn-down");
    assert_eq!(p.state, PeerState::Closed, "{p:?}");
    assert_adds_up(&p);
    assert_eq!(
        (p.accepted, p.sent, p.failed, p.expired, p.queued),
        (5 + more, 0, 5 + more, 3, 0),
        "{p:?}"
    );
    assert_eq!((p.available, p.in_flight), (W, 0), "window whole: {p:?}");
}

/// Exit path "peer removed with messages queued" (invariant 2), as far as the public API
/// can see it: before the removal the stats show the queued messages holding their permits;
/// `remove_peer` wakes a sender parked on the dry window with `Error::Closed`; the removed
/// name is unknown afterwards and comes back, when added again, with a whole window; and
/// another peer of the same node is not disturbed — it receives everything, in order, and
/// its window ends whole. (The removed peer's own window goes with it, so its permits are
/// checked by the loom model `loom-tests/tests/writer.rs` and the proptest in
/// `src/peer/outbox.rs`, not here.)
#[test]
fn removing_a_peer_with_queued_messages_wakes_its_blocked_sender_with_closed() {
    const SIZE: usize = 400;
    let check = OrderCheck::new();
    let nodes = connected([
        Node::builder("rm-tx")
            .cluster("t-permits-remove")
            .pool_threads(1)
            .window_bytes(W),
        Node::builder("rm-rx")
            .cluster("t-permits-remove")
            .pool_threads(1)
            .on_message(check.handler()),
    ]);
    let (sender, receiver) = (&nodes[0], &nodes[1]);
    let gone = HeldAddr::new();
    sender.add_peer("rm-gone", gone.addr()).expect("add_peer");

    let mut queued = 0u64;
    while sender.try_send("rm-gone", payload(queued, SIZE)).is_ok() {
        queued += 1;
        sender
            .send("rm-rx", payload(queued - 1, SIZE))
            .expect("send to the live peer");
    }
    assert_eq!(queued, W / cost(SIZE));
    let p = peer_stats(sender, "rm-gone");
    assert_adds_up(&p);
    assert_eq!((p.accepted, p.queued, p.sent), (queued, queued, 0), "{p:?}");
    assert_eq!(p.in_flight, queued * cost(SIZE), "{p:?}");

    let blocked = blocked_sender(sender.sender(), "rm-gone", SIZE);
    sender.remove_peer("rm-gone").expect("remove_peer");
    match join_within("the blocked sender to wake", &nodes, blocked) {
        Err(e) if matches!(e.error(), Error::Closed) => assert_eq!(e.into_inner().len(), SIZE),
        other => panic!("a sender blocked on a removed peer wakes with Closed: {other:?}"),
    }
    assert!(sender.stats().peer("rm-gone").is_none());
    match sender.try_send("rm-gone", payload(0, SIZE)) {
        Err(TrySendError::Failed(_, Error::UnknownPeer(name))) => assert_eq!(name, "rm-gone"),
        other => panic!("expected UnknownPeer, got {other:?}"),
    }
    sender
        .add_peer("rm-gone", gone.addr())
        .expect("added again");
    let p = peer_stats(sender, "rm-gone");
    assert_eq!((p.accepted, p.available, p.in_flight), (0, W, 0), "{p:?}");

    // The other peer carried on.
    for i in queued..queued + 100 {
        sender.send("rm-rx", payload(i, SIZE)).expect("send");
    }
    wait_until_or(
        PATIENCE,
        || check.count_from("rm-tx") == queued + 100,
        || {
            format!(
                "the live peer to get everything; stats:\n{}",
                all_stats(&nodes)
            )
        },
    );
    check.assert_ok();
    wait_window_whole_and_idle(&nodes, sender, "rm-rx");
    let p = peer_stats(sender, "rm-rx");
    assert_adds_up(&p);
    assert_eq!((p.accepted, p.sent), (queued + 100, queued + 100), "{p:?}");
    let rx = peer_stats(receiver, "rm-tx");
    assert_eq!(rx.delivered, queued + 100, "{rx:?}");

    let report = sender.shutdown(SHUTDOWN).expect("shutdown");
    assert_eq!(
        report.failed, 0,
        "the removed peer's messages are not counted again: {report:?}"
    );
    receiver.shutdown(SHUTDOWN).expect("shutdown");
}

/// The credit probe (invariant 2: nothing waits on a permit that cannot come back). The
/// receiver returns credit only in halves of the sender's window and in answer to probes:
/// `credit_on_idle(false)`, and its acks are held back (huge `ack_threshold`/`ack_delay`) so
/// that no ack carries credit by chance. Its own window is the default 4 MiB: the halves
/// are computed from the *sender's* window, learned in the handshake.
///
/// 1. Messages of varying sizes worth R < W/2 are sent and consumed: R is stranded at the
///    receiver (the sender's `in_flight` stays R).
/// 2. A "plug" of exactly W/2 is sent; its handler blocks, so it is never consumed.
/// 3. A last message that does not fit in W - R - W/2 but fits in W - W/2 is sent: it can
///    only go once R comes back, and only a probe can bring it. It does, while the plug
///    is still blocked: `probes > 0`.
///
/// Then the plug is released and a closing message of W/2 makes the receiver cross half a
/// window, so the window ends whole.
#[test]
fn probe_returns_credit_stranded_below_half_a_window() {
    const HALF: u64 = W / 2;
    let max = (HALF - MESSAGE_OVERHEAD) as usize; // cost(max) == HALF
    let gate = Gate::new();
    let check = OrderCheck::new();
    let plug_entered = Arc::new(AtomicBool::new(false));
    let plug = Arc::new(AtomicU64::new(u64::MAX));
    let (g, k, e, pl) = (
        gate.clone(),
        check.clone(),
        plug_entered.clone(),
        plug.clone(),
    );
    let nodes = connected([
        Node::builder("pr-tx")
            .cluster("t-permits-probe")
            .pool_threads(1)
            .window_bytes(W)
            .probe_interval(Duration::from_millis(20))
            .block_warning(Duration::from_millis(40)),
        Node::builder("pr-rx")
            .cluster("t-permits-probe")
            .pool_threads(2)
            .credit_on_idle(false)
            .ack_threshold(u64::MAX)
            .ack_delay(Duration::from_secs(3600))
            .on_message(move |d| {
                if counter_of(d.payload()) == Ok(pl.load(Ordering::SeqCst)) {
                    e.store(true, Ordering::SeqCst);
                    g.pass();
                }
                k.record(&d);
            }),
    ]);
    let (sender, receiver) = (&nodes[0], &nodes[1]);

    // 1. The residue: varying sizes, R < W/2 in total (with a margin of at least 600).
    let mut rng = Rng::new(0x5eed_0fc0_ffee);
    let (mut n, mut residue) = (0u64, 0u64);
    loop {
        let s = rng.range(100, 900);
        if residue + cost(s) > HALF - 600 {
            break;
        }
        sender.send("pr-rx", payload(n, s)).expect("send");
        residue += cost(s);
        n += 1;
    }
    assert!(
        residue < HALF && residue > HALF - 600 - cost(900),
        "{residue}"
    );
    wait_until_or(
        PATIENCE,
        || check.total() == n,
        || format!("the residue consumed; stats:\n{}", all_stats(&nodes)),
    );
    let p = peer_stats(sender, "pr-rx");
    assert_eq!(
        p.in_flight, residue,
        "below half a window, consumed credit is not returned by itself: {p:?}"
    );

    // 2. The plug: exactly half a window, blocked in the handler.
    plug.store(n, Ordering::SeqCst);
    sender
        .send("pr-rx", payload(n, max))
        .expect("send the plug");
    n += 1;
    wait_until("the plug to block its handler", PATIENCE, || {
        plug_entered.load(Ordering::SeqCst)
    });

    // 3. Needs the residue: W - R - W/2 < 4016 <= W - W/2.
    const LAST: usize = 4000;
    assert!(W - residue - HALF < cost(LAST) && cost(LAST) <= W - HALF);
    let tx = sender.sender();
    let last = std::thread::spawn(move || tx.send("pr-rx", payload(n, LAST)));
    let result = join_within(
        "the probe to bring back the stranded credit (the sender is parked on it)",
        &nodes,
        last,
    );
    result.expect("the last send completes");
    n += 1;
    assert_eq!(check.total(), n - 2, "the plug is still blocked");
    let p = peer_stats(sender, "pr-rx");
    assert!(p.probes > 0, "it completed because of a probe: {p:?}");
    assert!(p.blocked > Duration::ZERO, "the sender was parked: {p:?}");
    assert_eq!(
        p.in_flight,
        HALF + cost(LAST),
        "plug and last in flight: {p:?}"
    );

    // Release the plug; a closing message of half a window makes the receiver cross half,
    // returning everything it holds.
    gate.open();
    sender
        .send_timeout("pr-rx", payload(n, max), PATIENCE)
        .expect("closing send");
    n += 1;
    wait_until_or(
        PATIENCE,
        || check.total() == n,
        || format!("everything delivered; stats:\n{}", all_stats(&nodes)),
    );
    check.assert_ok();
    wait_window_whole_and_idle(&nodes, sender, "pr-rx");
    let p = peer_stats(sender, "pr-rx");
    assert_adds_up(&p);
    assert_eq!((p.accepted, p.sent), (n, n), "{p:?}");
    let rx = peer_stats(receiver, "pr-tx");
    assert_eq!((rx.received, rx.delivered), (n, n), "{rx:?}");
    shutdown_all(&nodes);
}

/// No silent stall (invariant 2: the stats show blocked time per peer): while a
/// sender is parked on a dry window, the peer's `blocked` time shows it — a stall in
/// progress is exactly what a monitor polling `stats()` needs to see, not only stalls that
/// have already ended.
#[test]
fn blocked_time_shows_a_sender_parked_now() {
    const SIZE: usize = 1000;
    let down = HeldAddr::new();
    let node = Node::builder("bt-tx")
        .cluster("t-permits-blocked")
        .pool_threads(1)
        .window_bytes(W)
        .peer("bt-down", down.addr())
        .start()
        .expect("start");
    let n = fill_window(&node.sender(), "bt-down", 0, SIZE);
    assert_eq!(n, W / cost(SIZE));
    assert_eq!(peer_stats(&node, "bt-down").blocked, Duration::ZERO);
    let blocked = blocked_sender(node.sender(), "bt-down", SIZE);
    wait_until_or(
        PATIENCE,
        || peer_stats(&node, "bt-down").blocked > Duration::ZERO,
        || {
            format!(
                "stats to show the parked sender's blocked time (still parked: {}); stats:\n{:?}",
                !blocked.is_finished(),
                peer_stats(&node, "bt-down")
            )
        },
    );
    assert!(!blocked.is_finished(), "the sender is still parked");
    node.shutdown(SHUTDOWN).expect("shutdown");
    match blocked.join().expect("sender thread") {
        // The payload comes back: the send still held it while it waited.
        Err(e) if matches!(e.error(), Error::Closed) => assert_eq!(e.into_inner().len(), SIZE),
        other => panic!("a sender blocked at shutdown wakes with Closed: {other:?}"),
    }
    let p = peer_stats(&node, "bt-down");
    assert_eq!((p.available, p.failed), (W, n), "{p:?}");
}

/// Slow-peer isolation (invariant 2): `broadcast` to three peers, one of which has
/// its handler stalled on a gate. Once the stalled peer's window is full, only it is
/// refused (`Error::Full`, never anything else); the other two are never refused and keep
/// receiving — each gets N more messages after the stalled one's window filled. When the
/// gate opens, the stalled peer gets everything it accepted, in order, and every window is
/// whole again.
#[test]
fn broadcast_with_a_stalled_peer_refuses_only_that_peer() {
    const SIZE: usize = 200;
    const WINDOW: u64 = 32 * 1024;
    const N: u64 = 300;
    let gate = Gate::new();
    let checks: [Arc<OrderCheck>; 3] = Default::default();
    let names = ["iso-a", "iso-b", "iso-c"];
    let receiver = |i: usize| {
        let (k, g) = (checks[i].clone(), gate.clone());
        let stalled = names[i] == "iso-c";
        Node::builder(names[i])
            .cluster("t-permits-iso")
            .pool_threads(1)
            .on_message(move |d| {
                if stalled {
                    g.pass();
                }
                k.record(&d);
            })
    };
    let nodes = connected([
        Node::builder("iso-tx")
            .cluster("t-permits-iso")
            .pool_threads(1)
            .window_bytes(WINDOW),
        receiver(0),
        receiver(1),
        receiver(2),
    ]);
    let sender = &nodes[0];
    let room = |name: &str| peer_stats(sender, name).available >= cost(SIZE);

    let mut i = 0u64;
    let mut c_accepted = 0u64;
    let mut since_full = 0u64;
    while since_full < N {
        let results = sender.broadcast(payload(i, SIZE));
        let got: Vec<&str> = results.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(got, names, "one result per peer, sorted by name");
        for (name, r) in &results {
            match (name.as_str(), r) {
                ("iso-c", Ok(())) => {
                    assert_eq!(since_full, 0, "the stalled peer took a message after Full");
                    c_accepted += 1;
                }
                ("iso-c", Err(e)) if matches!(e.error(), Error::Full) => {}
                (other, r) => {
                    assert!(r.is_ok(), "broadcast {i} refused {other}: {r:?}");
                }
            }
        }
        if matches!(&results[2].1, Err(e) if matches!(e.error(), Error::Full)) {
            since_full += 1;
        }
        assert!(
            c_accepted <= WINDOW / cost(SIZE),
            "the stalled peer accepted more than its window: {c_accepted}"
        );
        i += 1;
        // The others keep receiving: each message arrives, and their windows have room.
        wait_until_or(
            PATIENCE,
            || {
                checks[0].count_from("iso-tx") == i
                    && checks[1].count_from("iso-tx") == i
                    && room("iso-a")
                    && room("iso-b")
            },
            || {
                format!(
                    "broadcast {} to reach iso-a and iso-b; stats:\n{}",
                    i - 1,
                    all_stats(&nodes)
                )
            },
        );
    }
    assert_eq!(
        c_accepted,
        WINDOW / cost(SIZE),
        "the stalled peer's window filled"
    );
    assert_eq!(i, c_accepted + N);
    let c = peer_stats(sender, "iso-c");
    assert_adds_up(&c);
    assert_eq!(c.accepted, c_accepted, "{c:?}");
    assert!(c.available < cost(SIZE), "{c:?}");
    for name in ["iso-a", "iso-b"] {
        let p = peer_stats(sender, name);
        assert_adds_up(&p);
        assert_eq!((p.accepted, p.failed, p.filtered), (i, 0, 0), "{p:?}");
    }

    gate.open();
    wait_until_or(
        PATIENCE,
        || checks[2].count_from("iso-tx") == c_accepted,
        || {
            format!(
                "the stalled peer to catch up; stats:\n{}",
                all_stats(&nodes)
            )
        },
    );
    for k in &checks {
        k.assert_ok();
    }
    for name in names {
        wait_window_whole_and_idle(&nodes, sender, name);
    }
    let c = peer_stats(sender, "iso-c");
    assert_eq!((c.accepted, c.sent), (c_accepted, c_accepted), "{c:?}");
    assert_eq!(checks[2].total(), c_accepted);
    assert_eq!(checks[0].total(), i);
    assert_eq!(checks[1].total(), i);
    shutdown_all(&nodes);
}

/// The stats add up at every instant they are read (invariant 3): while one thread sends
/// (blocking sends, `try_send`s and `send_with` a ttl, through a filter dropping about a
/// third) another samples both nodes' stats in a loop. Every sample has
/// `accepted == sent + filtered + failed + queued` (messages and bytes), `in_flight <= window`,
/// counters that never go backwards, and a receiver that never got more than the sender had
/// counted as sent (a message is counted sent before it is written).
#[test]
fn stats_add_up_at_every_instant_while_traffic_flows() {
    const MESSAGES: u64 = 20_000;
    const WINDOW: u64 = 32 * 1024;
    let rng = Mutex::new(Rng::new(0x0dd_ba11));
    let nodes = connected([
        Node::builder("st-tx")
            .cluster("t-permits-stats")
            .pool_threads(1)
            .window_bytes(WINDOW)
            .outbound_filter(move |_, _| rng.lock().unwrap().next() % 3 != 0),
        Node::builder("st-rx")
            .cluster("t-permits-stats")
            .pool_threads(2),
    ]);
    let (sender, receiver) = (&nodes[0], &nodes[1]);
    let done = AtomicBool::new(false);

    let (samples, busy) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let (mut samples, mut busy) = (0u64, 0u64);
            let mut last: Option<PeerStats> = None;
            loop {
                let finished = done.load(Ordering::SeqCst);
                // A snapshot is not atomic across counters, so cross-counter checks read
                // the smaller side first: whatever the receiver got was counted sent before
                // it was written, and whatever it delivered it had received.
                let rx = peer_stats(receiver, "st-tx");
                let tx = peer_stats(sender, "st-rx");
                let rx_after = peer_stats(receiver, "st-tx");
                assert_adds_up(&tx);
                assert!(
                    rx.received <= tx.sent,
                    "received before counted sent: {rx:?} {tx:?}"
                );
                assert!(
                    rx.delivered <= rx_after.received,
                    "delivered before received: {rx:?} then {rx_after:?}"
                );
                if let Some(l) = &last {
                    for (name, before, now) in [
                        ("accepted", l.accepted, tx.accepted),
                        ("sent", l.sent, tx.sent),
                        ("filtered", l.filtered, tx.filtered),
                        ("failed", l.failed, tx.failed),
                        ("probes", l.probes, tx.probes),
                    ] {
                        assert!(now >= before, "{name} went backwards: {l:?} then {tx:?}");
                    }
                }
                if tx.queued > 0 || tx.in_flight > 0 {
                    busy += 1;
                }
                samples += 1;
                last = Some(tx);
                if finished {
                    return (samples, busy);
                }
            }
        });
        let mut rng = Rng::new(0xfeed);
        for i in 0..MESSAGES {
            let m = payload(i, rng.range(8, 600));
            match i % 10 {
                0 => {
                    // Back-pressure is fine here; anything else is not.
                    if let Err(e) = sender.try_send("st-rx", m) {
                        assert!(e.is_full(), "try_send: {e}");
                    }
                }
                1 => sender
                    .send_with("st-rx", m, SendOptions::new().ttl(Duration::from_secs(60)))
                    .expect("send_with"),
                _ => sender.send("st-rx", m).expect("send"),
            }
        }
        wait_until_or(
            PATIENCE,
            || {
                let tx = peer_stats(sender, "st-rx");
                tx.queued == 0 && peer_stats(receiver, "st-tx").delivered == tx.sent
            },
            || format!("the traffic to drain; stats:\n{}", all_stats(&nodes)),
        );
        done.store(true, Ordering::SeqCst);
        sampler.join().expect("sampler")
    });
    assert!(
        busy > 0,
        "sampled {samples} times, {busy} of them mid-traffic"
    );
    wait_window_whole_and_idle(&nodes, sender, "st-rx");
    let tx = peer_stats(sender, "st-rx");
    assert_adds_up(&tx);
    assert!(tx.filtered > 0 && tx.sent > 0, "{tx:?}");
    assert_eq!(tx.failed, 0, "{tx:?}");
    let rx = peer_stats(receiver, "st-tx");
    assert_eq!((rx.received, rx.delivered), (tx.sent, tx.sent), "{rx:?}");
    shutdown_all(&nodes);
}
