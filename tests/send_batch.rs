//! `send_batch`: many messages per call, through each handle that sends (`Sender`,
//! `PeerSender`, `Node`), delivered as the same `send`s one by one would be — in order with
//! the sender's other messages, exactly once, every permit back — and, when the batch
//! cannot go, its payloads handed back.

mod support;

use cohort::{Bytes, Error, Node};
use support::*;

/// Payloads `first..first + n`, numbered for `OrderCheck`.
fn numbered(first: u64, n: u64, size: usize) -> Vec<Vec<u8>> {
    (first..first + n).map(|i| payload(i, size)).collect()
}

#[test]
fn batches_are_delivered_in_order_with_single_sends_and_give_every_permit_back() {
    let check = OrderCheck::new();
    // A window of 8 KiB: a batch goes out in chunks of at most 2 KiB, each waiting for room.
    let [a, b] = connected([
        Node::builder("batch-a")
            .cluster("t-batch")
            .window_bytes(8 * 1024),
        Node::builder("batch-b")
            .cluster("t-batch")
            .on_message(check.handler()),
    ]);
    a.send("batch-b", payload(0, 40)).expect("send");
    a.sender()
        .send_batch("batch-b", numbered(1, 3_000, 40))
        .expect("Sender::send_batch");
    a.send("batch-b", payload(3_001, 40)).expect("send");
    let to_b = a.to("batch-b").expect("bound handle");
    to_b.send_batch(numbered(3_002, 2_000, 100))
        .expect("PeerSender::send_batch");
    a.send_batch("batch-b", numbered(5_002, 1_000, 8))
        .expect("Node::send_batch");
    a.send_batch("batch-b", Vec::<Bytes>::new())
        .expect("an empty batch");
    wait_until("every message delivered", PATIENCE, || {
        check.total() == 6_002
    });
    check.assert_ok();
    let p = peer_stats(&a, "batch-b");
    assert_eq!(p.accepted, 6_002, "each message counted accepted once");
    wait_window_whole(&a, "batch-b");
    shutdown_all(&[a, b]);
}

#[test]
fn a_batch_that_cannot_go_hands_its_payloads_back() {
    let [a, b] = connected([
        Node::builder("batch-c")
            .cluster("t-batch-fail")
            .max_message(1_000),
        Node::builder("batch-d").cluster("t-batch-fail"),
    ]);
    let batch = || numbered(0, 3, 16);

    let e = a.send_batch("nobody", batch()).expect_err("unknown peer");
    assert!(matches!(e.error(), Error::UnknownPeer(_)), "{e:?}");
    assert_eq!(e.into_inner(), batch(), "every payload back, in order");

    // One payload too large: nothing is queued.
    let mut too_large = batch();
    too_large.insert(1, vec![0; 1_001]);
    let e = a
        .send_batch("batch-d", too_large.clone())
        .expect_err("too large");
    assert!(
        matches!(e.error(), Error::TooLarge { len: 1_001, .. }),
        "{e:?}"
    );
    assert_eq!(e.into_inner(), too_large);
    assert_eq!(peer_stats(&a, "batch-d").accepted, 0, "nothing queued");

    let to_d = a.to("batch-d").expect("bound handle");
    a.remove_peer("batch-d").expect("remove");
    let e = to_d.send_batch(batch()).expect_err("removed peer");
    assert!(matches!(e.error(), Error::Closed), "{e:?}");
    assert_eq!(e.into_inner(), batch());

    shutdown_all(&[a, b]);
}
