//! `Sender::to`: a send handle bound to one peer delivers like the by-name API, in order, and
//! fails with `Closed` once that peer is removed (a re-added peer needs a new handle).

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cohort::{Error, Node};
use support::*;

#[test]
fn a_bound_handle_delivers_in_order_and_closes_with_its_peer() {
    let next = Arc::new(AtomicU64::new(0));
    let disorder = Arc::new(AtomicU64::new(0));
    let (n, d) = (next.clone(), disorder.clone());
    let b = Node::builder("ps-b")
        .cluster("t-ps")
        .on_message(move |m| {
            let i = counter_of(m.payload()).expect("counter");
            if n.swap(i + 1, Ordering::SeqCst) != i {
                d.fetch_add(1, Ordering::SeqCst);
            }
        })
        .start()
        .expect("start b");
    let a = Node::builder("ps-a")
        .cluster("t-ps")
        .peer("ps-b", b.local_addr())
        .start()
        .expect("start a");
    b.add_peer("ps-a", a.local_addr()).expect("add_peer");

    assert!(matches!(
        a.sender().to("nobody"),
        Err(Error::UnknownPeer(_))
    ));
    let to_b = a.sender().to("ps-b").expect("bound handle");
    assert_eq!(to_b.peer(), "ps-b");
    for i in 0..5_000 {
        to_b.send(payload(i, 32)).expect("send");
    }
    wait_until("everything delivered", PATIENCE, || {
        next.load(Ordering::SeqCst) == 5_000
    });
    assert_eq!(disorder.load(Ordering::SeqCst), 0, "in order");

    a.remove_peer("ps-b").expect("remove");
    assert!(matches!(
        to_b.send(payload(0, 8)).map_err(Error::from),
        Err(Error::Closed)
    ));
    assert!(to_b.try_send(payload(0, 8)).is_err());
    a.shutdown(Duration::from_secs(5)).expect("shutdown a");
    b.shutdown(Duration::from_secs(5)).expect("shutdown b");
}
