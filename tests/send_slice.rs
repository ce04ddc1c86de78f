//! `send_slice`: a message copied from the caller's buffer, through each handle that sends
//! (`Sender`, `PeerSender`, `Node`), delivered as `send` would deliver it — in order with
//! the sender's other messages, exactly once, every permit back — whether it went straight
//! into its frame or took the general path (larger than a sender encodes, a full window, a
//! journalling node), and failing as `send` fails.

mod support;

use cohort::{Error, Node};
use support::*;

/// Writes payload `counter` of `size` bytes into `buf`, reusing its allocation.
fn fill(buf: &mut Vec<u8>, counter: u64, size: usize) {
    buf.clear();
    buf.extend_from_slice(&payload(counter, size));
}

#[test]
fn slices_are_delivered_in_order_with_other_sends_at_every_size() {
    let check = OrderCheck::new();
    // A window of 64 KiB: the larger messages fill it, so that some slices find it full and
    // wait on the general path.
    let [a, b] = connected([
        Node::builder("slice-a")
            .cluster("t-slice")
            .window_bytes(64 * 1024),
        Node::builder("slice-b")
            .cluster("t-slice")
            .on_message(check.handler()),
    ]);
    let to_b = a.to("slice-b").expect("bound handle");
    let sender = a.sender();
    // Around the size up to which a sender encodes its own frames, and far past it.
    let sizes = [8, 40, 1_024, 4_095, 4_096, 4_097, 20_000];
    let mut buf = Vec::new();
    let mut n = 0u64;
    for round in 0..300 {
        for (i, &size) in sizes.iter().enumerate() {
            fill(&mut buf, n, size);
            match (round + i) % 4 {
                0 => a.send_slice("slice-b", &buf).expect("Node::send_slice"),
                1 => sender
                    .send_slice("slice-b", &buf)
                    .expect("Sender::send_slice"),
                2 => to_b.send_slice(&buf).expect("PeerSender::send_slice"),
                _ => a.send("slice-b", buf.clone()).expect("send"),
            }
            n += 1;
            // The buffer is the caller's again at once: what was sent was copied.
            buf.fill(0xEE);
        }
    }
    wait_until("every message delivered", PATIENCE, || check.total() == n);
    check.assert_ok();
    assert_eq!(peer_stats(&a, "slice-b").accepted, n, "each counted once");
    wait_window_whole(&a, "slice-b");
    shutdown_all(&[a, b]);
}

#[test]
fn a_journalling_node_sends_slices_through_its_journal() {
    let dir = TempDir::new("slice-journal");
    let check = OrderCheck::new();
    let [a, b] = connected([
        Node::builder("slice-j")
            .cluster("t-slice-j")
            .journal(dir.path()),
        Node::builder("slice-k")
            .cluster("t-slice-j")
            .on_message(check.handler()),
    ]);
    let mut buf = Vec::new();
    for n in 0..500u64 {
        fill(&mut buf, n, 8 + (n as usize * 37) % 6_000);
        a.send_slice("slice-k", &buf).expect("send_slice");
    }
    wait_until("every message delivered", PATIENCE, || check.total() == 500);
    check.assert_ok();
    wait_window_whole(&a, "slice-k");
    shutdown_all(&[a, b]);
}

#[test]
fn a_slice_that_cannot_go_fails_as_send_does() {
    let [a, b] = connected([
        Node::builder("slice-c")
            .cluster("t-slice-fail")
            .max_message(1_000),
        Node::builder("slice-d").cluster("t-slice-fail"),
    ]);
    let e = a.send_slice("nobody", b"hello").expect_err("unknown peer");
    assert!(matches!(e, Error::UnknownPeer(_)), "{e:?}");
    let e = a.send_slice("slice-d", &[0; 1_001]).expect_err("too large");
    assert!(matches!(e, Error::TooLarge { len: 1_001, .. }), "{e:?}");
    assert_eq!(peer_stats(&a, "slice-d").accepted, 0, "nothing queued");

    let to_d = a.to("slice-d").expect("bound handle");
    a.remove_peer("slice-d").expect("remove");
    let e = to_d.send_slice(b"late").expect_err("removed peer");
    assert!(matches!(e, Error::Closed), "{e:?}");
    shutdown_all(&[a, b]);
}
