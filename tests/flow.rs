//! Credit flow control end to end: a receiver whose handler blocks makes the sender's window
//! run dry, and everything flows again, in order, once it is released; message and window
//! size limits.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cohort::internals::flow::{cost, MESSAGE_OVERHEAD};
use cohort::{Bytes, ConfigError, Error, Node, SendError, TrySendError};
use support::*;

const WINDOW: u64 = 64 * 1024;
const SIZE: usize = 1024;

/// Back-pressure (invariant 2 and the flow-control contract): while the receiver's handler
/// is blocked, the sender's window runs dry — `try_send` hands the payload back in
/// `TrySendError::Full`, `send_timeout` fails with `Error::TimedOut`, a blocking `send` parks
/// — and what is held stays bounded by the window on both sides (stats, not RSS). Once the
/// handler is released every message is delivered in order and the window is whole again.
#[test]
fn blocked_handler_runs_the_window_dry_then_everything_flows() {
    let gate = Gate::new();
    let entered = Arc::new(AtomicBool::new(false));
    let check = OrderCheck::new();
    let (g, e, k) = (gate.clone(), entered.clone(), check.clone());
    let receiver = Node::builder("bp-rx")
        .cluster("t-backpressure")
        .pool_threads(2)
        .window_bytes(WINDOW)
        .on_message(move |d| {
            e.store(true, Ordering::SeqCst);
            g.pass();
            k.record(&d);
        });
    let sender = Node::builder("bp-tx")
        .cluster("t-backpressure")
        .pool_threads(1)
        .window_bytes(WINDOW);
    let nodes = connected([sender, receiver]);
    let [sender, receiver] = &nodes;

    // Fill the window with try_send until it refuses. It must refuse: the handler consumes
    // nothing, so no credit can come back. The bound only turns a bug into a failure.
    let max_fit = WINDOW / cost(SIZE);
    let mut accepted = 0u64;
    loop {
        let msg = payload(accepted, SIZE);
        match sender.try_send("bp-rx", msg.clone()) {
            Ok(()) => accepted += 1,
            Err(TrySendError::Full(back)) => {
                assert_eq!(&back[..], &msg[..], "Full hands the very payload back");
                break;
            }
            Err(e) => panic!("try_send failed: {e}"),
        }
        assert!(
            accepted <= max_fit,
            "accepted {accepted} messages of {SIZE} B into a {WINDOW} B window whose \
             receiver consumes nothing; stats:\n{}",
            all_stats(&nodes)
        );
    }
    assert_eq!(accepted, max_fit, "the window holds exactly this many");
    wait_until("the handler to be entered", PATIENCE, || {
        entered.load(Ordering::SeqCst)
    });

    // send_timeout waits, then times out; the payload is not taken.
    match sender.send_timeout("bp-rx", payload(accepted, SIZE), Duration::from_millis(50)) {
        Err(e) if matches!(e.error(), Error::TimedOut(_)) => {
            assert!(
                matches!(e.error(), Error::TimedOut(d) if *d == Duration::from_millis(50)),
                "{e:?}"
            );
            assert_eq!(
                e.into_inner(),
                payload(accepted, SIZE),
                "the payload is handed back"
            );
        }
        other => panic!("send_timeout on a dry window: {other:?}"),
    }
    // Still full: a failed try_send or send_timeout takes no permit and leaks none.
    assert!(sender
        .try_send("bp-rx", payload(accepted, SIZE))
        .unwrap_err()
        .is_full());

    // A blocking sender parks meanwhile and finishes once credit flows again.
    const MORE: u64 = 300;
    let blocked_sender = sender.sender();
    let first_more = accepted;
    let more = Watched::spawn("blocking-sender", move || {
        for n in first_more..first_more + MORE {
            blocked_sender
                .send("bp-rx", payload(n, SIZE))
                .expect("blocking send");
        }
    });

    // Let the sender's IO thread publish what it can: everything accepted reaches the
    // receiver (its socket buffers are far larger than the window), none is consumed.
    wait_until_or(
        PATIENCE,
        || peer_stats(receiver, "bp-tx").received >= accepted,
        || {
            format!(
                "the window's worth to arrive; stats:\n{}",
                all_stats(&nodes)
            )
        },
    );
    // Memory is bounded by the window on both sides.
    let tx = peer_stats(sender, "bp-rx");
    let rx = peer_stats(receiver, "bp-tx");
    assert!(tx.in_flight <= tx.window, "{tx:?}");
    assert!(tx.available < cost(SIZE), "the window is dry: {tx:?}");
    assert_eq!(tx.in_flight + tx.available, tx.window, "{tx:?}");
    assert_eq!(
        tx.accepted,
        tx.sent + tx.filtered + tx.failed + tx.queued,
        "{tx:?}"
    );
    assert_eq!(tx.accepted, max_fit, "{tx:?}");
    assert_eq!(rx.received, max_fit, "{rx:?}");
    assert!(
        rx.delivered == 0,
        "the handler has not returned yet: {rx:?}"
    );
    assert!(rx.delivery_queued_bytes <= WINDOW, "{rx:?}");
    // The blocking sender parks (sleeps in the kernel) on the dry window.
    more.wait_parked("the blocking sender to park");
    assert!(
        !more.is_finished(),
        "a blocking send got through a dry window"
    );
    assert_eq!(peer_stats(sender, "bp-rx").accepted, max_fit);

    gate.open();
    join_within(
        "the blocking sender to finish once credit flows",
        &nodes,
        more.into_handle(),
    );
    let total = accepted + MORE;
    wait_until_or(
        PATIENCE,
        || check.total() >= total,
        || format!("all deliveries; stats:\n{}", all_stats(&nodes)),
    );
    check.assert_ok();
    assert_eq!(check.count_from("bp-tx"), total);
    wait_until_or(
        PATIENCE,
        || {
            let p = peer_stats(sender, "bp-rx");
            p.available == p.window && p.in_flight == 0
        },
        || format!("the window whole again; stats:\n{}", sender.stats()),
    );
    let tx = peer_stats(sender, "bp-rx");
    assert_eq!(tx.accepted, total, "{tx:?}");
    assert_eq!(tx.sent, total, "{tx:?}");
    assert_eq!(
        tx.accepted,
        tx.sent + tx.filtered + tx.failed + tx.queued,
        "{tx:?}"
    );
    assert!(
        tx.blocked > Duration::ZERO,
        "the blocking sender was parked: {tx:?}"
    );
    let rx = peer_stats(receiver, "bp-tx");
    assert_eq!(rx.delivered, total, "{rx:?}");
    assert_eq!(rx.delivery_queued_bytes, 0, "{rx:?}");
    shutdown_all(&nodes);
}

/// A message over `max_message` is refused with `Error::TooLarge` (by every send variant,
/// handing the payload back from `try_send`) and takes no permit; one of exactly
/// `max_message` bytes is accepted.
#[test]
fn message_over_max_message_is_too_large() {
    let absent = HeldAddr::new();
    let node = Node::builder("big")
        .cluster("t-limits")
        .pool_threads(1)
        .window_bytes(WINDOW)
        .max_message(1000)
        .peer("absent", absent.addr())
        .start()
        .expect("start");
    let too_large = |r: Result<(), SendError<Bytes>>| match r.map_err(Error::from) {
        Err(Error::TooLarge {
            len: 1001,
            max: 1000,
        }) => {}
        other => panic!("expected TooLarge {{ len: 1001, max: 1000 }}, got {other:?}"),
    };
    too_large(node.send("absent", vec![0u8; 1001]));
    too_large(node.send_timeout("absent", vec![0u8; 1001], Duration::from_millis(1)));
    too_large(node.send_oob("absent", vec![0u8; 1001]));
    match node.try_send("absent", vec![7u8; 1001]) {
        Err(TrySendError::Failed(
            back,
            Error::TooLarge {
                len: 1001,
                max: 1000,
            },
        )) => {
            assert_eq!(back.len(), 1001);
        }
        other => panic!("expected Failed(_, TooLarge), got {other:?}"),
    }
    let p = peer_stats(&node, "absent");
    assert_eq!(p.accepted, 0, "{p:?}");
    assert_eq!(
        p.available, p.window,
        "a refused message takes no permit: {p:?}"
    );

    node.send("absent", vec![0u8; 1000])
        .expect("exactly max_message is fine");
    let p = peer_stats(&node, "absent");
    assert_eq!(p.accepted, 1, "{p:?}");
    assert_eq!(p.in_flight, 1000 + MESSAGE_OVERHEAD, "{p:?}");
    node.shutdown(SHUTDOWN).expect("shutdown");
}

/// The builder refuses a `max_message` that does not fit in half the window (such a
/// message could never be sent) with `Error::Config`, and accepts the largest that fits.
#[test]
fn builder_refuses_max_message_over_half_the_window() {
    let half_payload = (WINDOW / 2 - MESSAGE_OVERHEAD) as usize;
    match Node::builder("cfg")
        .window_bytes(WINDOW)
        .max_message(half_payload + 1)
        .start()
    {
        Err(Error::Config(
            e @ ConfigError::OutOfRange {
                setting: "max_message",
                ..
            },
        )) => {
            let msg = e.to_string();
            assert!(msg.contains("max_message"), "{msg}");
            assert!(
                msg.contains(&format!("to {half_payload} bytes")),
                "says the largest that fits: {msg}"
            );
        }
        other => panic!("expected Error::Config, got {other:?}"),
    }
    match Node::builder("cfg")
        .window_bytes(WINDOW)
        .max_message(40_000)
        .start()
    {
        Err(Error::Config(ConfigError::OutOfRange {
            setting: "max_message",
            value: 40_000,
            ..
        })) => {}
        other => panic!("expected Error::Config, got {other:?}"),
    }
    let node = Node::builder("cfg")
        .window_bytes(WINDOW)
        .max_message(half_payload)
        .start()
        .expect("max_message of exactly half the window (less overhead) is fine");
    node.shutdown(SHUTDOWN).expect("shutdown");
}
