//! One peer's requests in flight: loom models of `cohort::internals::peer::Requests` and its
//! `Slot`, with the code that ships.
//!
//! A requester (`Sender::send_request`) registers a slot (`Requests::register`, parking
//! while the peer's cap is reached) and waits on it (`PendingReply::wait` →
//! `Requests::wait`: the slot until the deadline, then the request is given up). The IO
//! thread answers it when the reply arrives (`Requests::answer`), fails it
//! (`Requests::fail`), or the node fails them all as it shuts down or the peer is removed
//! (`Requests::close`).
//!
//! Under loom a deadline in the future never passes (the facade's `wait_timeout` never times
//! out), so the models give a requester a deadline that has already passed to run the
//! timeout path: it looks once, then gives up.
//!
//! Checked in every execution:
//!
//! - a reply racing the timeout is returned to the requester or counted late, never lost
//!   (answered, yet the requester saw no reply) and never both;
//! - a reply racing a close: the requester gets exactly one outcome, the reply or
//!   `Closed`; the reply is answered or late accordingly;
//! - a requester parked at the cap gets a slot once another request is answered, or
//!   `Closed` (no requester left parked: loom reports that as a deadlock).
#![cfg(loom)]

use std::time::Instant;

use bytes::Bytes;
use cohort::internals::peer::{Failure, Requests};
use loom::thread;
use std::sync::Arc;

fn reply() -> Bytes {
    Bytes::from_static(b"r")
}

/// The IO thread's reply races the requester's timeout.
#[test]
fn reply_races_the_timeout() {
    loom_tests::model("requests/reply_races_the_timeout", || {
        let r = Arc::new(Requests::new(1));
        let (id, slot) = r.register(None).expect("room");
        let io = {
            let r = r.clone();
            thread::spawn(move || r.answer(id, Ok(reply())))
        };
        // The deadline has passed: one look, then the request is given up.
        let got = r.wait(id, &slot, Some(Instant::now()));
        let answered = io.join().unwrap();
        match got {
            Some(Ok(b)) => {
                assert_eq!(b, reply());
                assert!(answered, "returned, yet counted late");
                assert_eq!((r.answered(), r.late()), (1, 0));
            }
            None => {
                assert!(!answered, "the reply was answered but never returned: lost");
                assert_eq!((r.answered(), r.late()), (0, 1));
            }
            Some(Err(f)) => panic!("the request failed with {f:?}"),
        }
        assert_eq!(r.in_flight(), 0);
        assert!(slot.try_take().is_none(), "an outcome left in the slot");
    });
}

/// The reply races the close (shutdown, or the peer removed) while the requester waits
/// without a deadline, and a second requester parks at the cap of one.
#[test]
fn reply_races_the_close_and_a_parked_requester() {
    loom_tests::model(
        "requests/reply_races_the_close_and_a_parked_requester",
        || {
            let r = Arc::new(Requests::new(1));
            let (id, slot) = r.register(None).expect("room");
            let second = {
                let r = r.clone();
                thread::spawn(move || match r.register(None) {
                    // Room came: the first request was answered or failed. Closed later, or
                    // not: the close below fails it if it is still waiting.
                    Ok((id2, slot2)) => Some((id2, slot2)),
                    Err(Failure::Closed) => None,
                    Err(f) => panic!("register failed with {f:?}"),
                })
            };
            let io = {
                let r = r.clone();
                thread::spawn(move || r.answer(id, Ok(reply())))
            };
            // The node shuts down.
            r.close();
            let got = r.wait(id, &slot, None);
            let answered = io.join().unwrap();
            match got {
                Some(Ok(b)) => {
                    assert_eq!(b, reply());
                    assert!(answered, "returned, yet counted late");
                }
                Some(Err(Failure::Closed)) => assert!(!answered, "answered and closed"),
                other => panic!("unexpected outcome {other:?}"),
            }
            assert_eq!(r.answered() + r.late(), 1, "the reply counted once");
            if let Some((id2, slot2)) = second.join().unwrap() {
                // Registered before the close, which failed it.
                assert_eq!(r.wait(id2, &slot2, None), Some(Err(Failure::Closed)));
            }
            assert_eq!(r.in_flight(), 0);
        },
    );
}
