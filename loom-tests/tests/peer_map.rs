//! The node's peer map racing its senders: loom models of the IO thread's `peer::admit` and
//! `peer::forget` (through `cohort::internals::peer::Map`), with the outbox steps that
//! retire a peer (`Outbox::fail_queued`, `Outbox::retire`), the code that ships.
//!
//! A sender (`SendCore::enqueue_named`) looks the peer up by name under the map's read
//! lock, takes its permits (`SendWindow::try_acquire`) and queues the message
//! (`Outbox::admit`). The IO thread forgets a member admitted at run time that stayed away
//! (`Endpoint::forget_peer`): it retires the peer first (`Remote::retire`: fails what is
//! queued, closing the outbox; gives back the ledger and closes the window), then drops it
//! from the map (`Event::Forget` → `peer::forget`); the member may dial in again and be
//! admitted as a new peer under the same name (`Event::Admitted` → `peer::admit`).
//!
//! Checked in every execution: a send racing the forget either fails (the window or the
//! outbox is closed: its permits come back; it found no peer; or it was queued and then
//! failed by the retirement, reported like every failed message) or is queued on the live
//! peer — never left queued on the forgotten one; the forgotten peer's window is whole.
//! The same with the peer the sender's thread found last remembered (`Peers::with_found`,
//! taken without the lock while the map's generation is unchanged), and: a send ordered
//! after a change of the map never takes the peer remembered from before it.
#![cfg(loom)]

use std::collections::VecDeque;

use bytes::Bytes;
use cohort::internals::flow::{cost, AcquireError};
use cohort::internals::peer::{self, Found, Ledger, Map, PeerShared, Return};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;
use std::sync::Arc;

/// What the sender's send came to.
#[derive(Debug)]
enum Sent {
    /// No peer by that name.
    Unknown,
    /// The window was closed: no permit taken.
    Closed,
    /// The outbox was closed: refused, its permits back.
    Refused,
    /// Queued on this peer.
    Queued(Arc<PeerShared>),
}

/// `enqueue_named` with `Wait::No` and no look-up remembered: lookup, permits, admit,
/// under the map's read lock.
fn send(map: &Map) -> Sent {
    map.with("x", |p| match p {
        Some(p) => queue_one(p),
        None => Sent::Unknown,
    })
}

/// `enqueue_named` with `Wait::No` and the sending thread's remembered look-up `last`:
/// permits and admit on the peer `last` holds while the map is unchanged, else as `send`.
fn send_found(map: &Map, last: &mut Option<Found>) -> Sent {
    map.with_found("x", last, queue_one)
        .unwrap_or(Sent::Unknown)
}

/// Permits, then admit, on `p`.
fn queue_one(p: &Arc<PeerShared>) -> Sent {
    let ob = peer::outbox(p);
    let permit = match ob.window().try_acquire(cost(1)) {
        Ok(permit) => permit,
        Err(AcquireError::Closed) => return Sent::Closed,
        Err(e) => panic!("acquire failed with {e:?}"),
    };
    match ob.admit(peer::outgoing(
        Bytes::from_static(b"m"),
        false,
        None,
        permit,
    )) {
        Ok(()) => Sent::Queued(p.clone()),
        Err(_) => Sent::Refused,
    }
}

/// One sender races the IO thread's forget of peer 0 ("x"), followed, with `readmit`, by
/// the admission of peer 1 under the same name. With `remembered`, the sender's thread
/// found peer 0 before the race and remembers it.
fn model(readmit: bool, remembered: bool) {
    let map = Arc::new(Map::new());
    let old = peer::shared(0, "x", 1 << 10);
    map.admit(old.clone());
    let mut last = None;
    if remembered {
        map.with_found("x", &mut last, |_| ());
    }
    let sender = {
        let map = map.clone();
        thread::spawn(move || {
            if remembered {
                send_found(&map, &mut last)
            } else {
                send(&map)
            }
        })
    };

    // The IO thread: retire, then forget; perhaps admit the member again.
    let ob = peer::outbox(&old);
    let failed = ob.fail_queued(&mut VecDeque::new());
    ob.retire(&mut Ledger::default());
    assert!(map.forget(&old), "forgotten");
    let new = readmit.then(|| {
        let new = peer::shared(1, "x", 1 << 10);
        map.admit(new.clone());
        new
    });

    let sent = sender.join().unwrap();
    let on_old = matches!(&sent, Sent::Queued(p) if Arc::ptr_eq(p, &old));
    match &sent {
        Sent::Queued(_) if on_old => assert_eq!(
            failed.len(),
            1,
            "queued on the forgotten peer and not failed by its retirement"
        ),
        Sent::Queued(p) => {
            let new = new.as_ref().expect("readmitted");
            assert!(Arc::ptr_eq(p, new), "queued on a peer never admitted");
            assert!(!peer::outbox(new).is_empty(), "queued on the live peer");
        }
        Sent::Unknown => assert!(!readmit || failed.is_empty()),
        Sent::Closed | Sent::Refused => assert!(failed.is_empty()),
    }
    assert!(ob.is_empty(), "a message left queued on the forgotten peer");
    assert!(ob.is_closed());
    let w = ob.window();
    assert_eq!(
        w.available(),
        w.capacity(),
        "permits not all back: {sent:?}"
    );
    assert_eq!(
        ob.returned(Return::Failed) + ob.returned(Return::Refused),
        if on_old || matches!(sent, Sent::Refused) {
            cost(1)
        } else {
            0
        }
    );
}

/// A send races the forget of the peer it names.
#[test]
fn a_send_races_the_forget() {
    loom_tests::model("peer_map/a_send_races_the_forget", || model(false, false));
}

/// A send races the forget and the admission of the member again under its name.
#[test]
fn a_send_races_the_forget_and_a_readmission() {
    loom_tests::model("peer_map/a_send_races_the_forget_and_a_readmission", || {
        model(true, false)
    });
}

/// A send taking the peer its thread remembers races the forget and the admission of the
/// member again: the remembered peer is taken only while the map is unchanged, so the send
/// is one that could have looked it up then.
#[test]
fn a_remembered_send_races_the_forget_and_a_readmission() {
    loom_tests::model(
        "peer_map/a_remembered_send_races_the_forget_and_a_readmission",
        || model(true, true),
    );
}

/// A send ordered after the map changed (here through a flag the IO thread sets once it
/// readmitted the member) never takes the peer its thread remembered from before: it goes
/// to the member admitted again.
#[test]
fn a_send_after_a_change_never_takes_the_remembered_peer() {
    loom_tests::model(
        "peer_map/a_send_after_a_change_never_takes_the_remembered_peer",
        || {
            let map = Arc::new(Map::new());
            let old = peer::shared(0, "x", 1 << 10);
            map.admit(old.clone());
            let mut last = None;
            map.with_found("x", &mut last, |_| ());
            let changed = Arc::new(AtomicBool::new(false));
            let io = {
                let (map, changed) = (map.clone(), changed.clone());
                thread::spawn(move || {
                    let ob = peer::outbox(&old);
                    ob.fail_queued(&mut VecDeque::new());
                    ob.retire(&mut Ledger::default());
                    assert!(map.forget(&old), "forgotten");
                    let new = peer::shared(1, "x", 1 << 10);
                    map.admit(new.clone());
                    changed.store(true, Ordering::Release);
                    new
                })
            };
            let after = changed.load(Ordering::Acquire);
            let sent = send_found(&map, &mut last);
            let new = io.join().unwrap();
            if after {
                assert!(
                    matches!(&sent, Sent::Queued(p) if Arc::ptr_eq(p, &new)),
                    "a send after the change went elsewhere: {sent:?}"
                );
            }
            // Whatever the interleaving, the next send goes to the member admitted again.
            assert!(
                matches!(send_found(&map, &mut last), Sent::Queued(p) if Arc::ptr_eq(&p, &new))
            );
        },
    );
}
