//! Connection state from the application's side: `is_connected` and `wait_connected` (a
//! thread parks until the IO thread says the peer is up, fails with its own error when the
//! peer never comes, at once for a stranger, and wakes when the peer is removed or the node
//! shuts down), and an event callback that sends through the node's handle.

mod support;

use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cohort::{Error, Event, Node};
use support::*;

/// What a waiter is given: far longer than the test waits for it to return (`PATIENCE`),
/// so a waiter that is not woken (and returns at its timeout) fails the test.
const LONG: Duration = Duration::from_secs(600);

#[test]
fn wait_connected_returns_once_a_peer_that_starts_later_connects() {
    let b_addr = HeldAddr::new();
    let a = Node::builder("a")
        .cluster("conn-later")
        .peer("b", b_addr.addr())
        .redial_quickly()
        .start()
        .expect("a starts");
    assert!(!a.is_connected("b"), "nothing listens for b yet");
    assert!(!a.to("b").expect("b").is_connected());
    let waiter = {
        let tx = a.sender();
        Watched::spawn("wait-b", move || tx.wait_connected("b", LONG))
    };
    waiter.wait_parked("the waiter parks: b is not up");
    assert!(!waiter.is_finished());
    // Start b now.
    let b = receiver_b("conn-later", b_addr.addr())
        .start()
        .expect("b starts");
    let waited = join_within("the waiter returns", &[], waiter.into_handle());
    waited.expect("b connected");
    assert!(a.is_connected("b") && a.sender().is_connected("b"));
    assert!(a.to("b").expect("b").is_connected());
    // Already connected: at once, on every handle.
    a.wait_connected("b", Duration::ZERO).expect("connected");
    a.to("b")
        .expect("b")
        .wait_connected(Duration::ZERO)
        .expect("connected");
    a.shutdown(SHUTDOWN).expect("a shuts down");
    assert!(!a.is_connected("b"), "a shut-down node has no connection");
    assert!(matches!(
        a.wait_connected("b", PATIENCE),
        Err(Error::Closed)
    ));
    b.shutdown(SHUTDOWN).expect("b shuts down");
}

#[test]
fn wait_connected_fails_with_its_own_error_for_a_peer_that_never_comes() {
    let nobody = HeldAddr::new(); // a dial there is refused
    let a = Node::builder("a")
        .cluster("conn-never")
        .peer("b", nobody.addr())
        .redial_quickly()
        .start()
        .expect("a starts");
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    match a.wait_connected("b", timeout) {
        Err(Error::ConnectTimedOut { peer, timeout: t }) => {
            assert_eq!((peer.as_str(), t), ("b", timeout));
        }
        other => panic!("expected ConnectTimedOut, got {other:?}"),
    }
    assert!(started.elapsed() >= timeout, "it waited the whole timeout");
    let e = a
        .to("b")
        .expect("b")
        .wait_connected(Duration::from_millis(1))
        .expect_err("still not up");
    assert!(e.to_string().contains("did not connect within"), "{e}");
    assert!(a.peers().contains(&"b".to_owned()), "b stays configured");
    a.shutdown(SHUTDOWN).expect("shutdown");
}

#[test]
fn wait_connected_refuses_a_stranger_at_once() {
    let a = Node::builder("a")
        .cluster("conn-unknown")
        .start()
        .expect("a starts");
    let started = Instant::now();
    match a.wait_connected("nobody", PATIENCE) {
        Err(Error::UnknownPeer(p)) => assert_eq!(p, "nobody"),
        other => panic!("expected UnknownPeer, got {other:?}"),
    }
    assert!(matches!(
        a.sender().wait_connected("nobody", PATIENCE),
        Err(Error::UnknownPeer(_))
    ));
    assert!(started.elapsed() < PATIENCE, "not after the timeout");
    assert!(!a.is_connected("nobody"));
    a.shutdown(SHUTDOWN).expect("shutdown");
}

#[test]
fn a_waiter_wakes_with_closed_when_its_peer_is_removed() {
    let nobody = HeldAddr::new();
    let a = Node::builder("a")
        .cluster("conn-removed")
        .peer("b", nobody.addr())
        .start()
        .expect("a starts");
    let to_b = a.to("b").expect("b");
    let waiter = Watched::spawn("wait-b", move || to_b.wait_connected(LONG));
    waiter.wait_parked("the waiter parks: b is down");
    a.remove_peer("b").expect("removed");
    let waited = join_within("the waiter returns", &[], waiter.into_handle());
    assert!(matches!(waited, Err(Error::Closed)), "{waited:?}");
    a.shutdown(SHUTDOWN).expect("shutdown");
}

#[test]
fn an_event_callback_greets_every_member_that_connects() {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let host = Node::builder("host")
        .cluster("conn-greet")
        .allow_unknown_members(true)
        .on_event_with(|e, node| {
            if let Event::Connected { peer, .. } = e {
                node.try_send(&peer, format!("welcome {peer}, from {}", node.name()))
                    .expect("the greeting is queued");
            }
        })
        .start()
        .expect("host starts");
    let guests: Vec<Node> = ["g1", "g2", "g3"]
        .iter()
        .map(|name| {
            let tx = Mutex::new(tx.lock().expect("channel").clone());
            Node::builder(name)
                .cluster("conn-greet")
                .peer("host", host.local_addr())
                .on_message(move |d| {
                    let text = String::from_utf8_lossy(d.payload()).into_owned();
                    let _ = tx
                        .lock()
                        .expect("channel")
                        .send((d.from().to_owned(), text));
                })
                .start()
                .expect("a guest starts")
        })
        .collect();
    let mut greeted: Vec<String> = (0..3)
        .map(|_| {
            let (from, text) = rx.recv_timeout(PATIENCE).expect("a greeting");
            assert_eq!(from, "host");
            text
        })
        .collect();
    greeted.sort();
    assert_eq!(
        greeted,
        [
            "welcome g1, from host",
            "welcome g2, from host",
            "welcome g3, from host"
        ]
    );
    shutdown_all(&guests);
    host.shutdown(SHUTDOWN).expect("shutdown");
}
