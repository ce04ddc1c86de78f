//! Invariant 2, permits are conserved: loom models of `cohort::flow::SendWindow` (the
//! per-peer byte semaphore), with the code that ships.
//!
//! A waiter that never wakes is a deadlock, which loom reports (every thread blocked). At the
//! end of every model the window is whole again (`available() == capacity()`) and nobody is
//! left registered as a waiter.
//!
//! loom's `Condvar::wait_timeout` never times out (the facade makes it a plain wait), so
//! `acquire_timeout` is modelled on its notify path only; its timeout path is a unit test
//! in `src/flow`.
//!
//! ## The lost wake-up these models found
//!
//! `acquire_until` announces itself (`waiters.fetch_add`) and then re-checks `available`;
//! `release` adds to `available` and then loads `waiters` to decide whether to notify. That
//! is a store-buffering (Dekker) pair, and with the `available` re-check an `Acquire` load
//! the memory model allowed both loads to miss the other side's write: `release` saw
//! `waiters == 0` and notified nobody, `acquire` saw the old `available` and parked for good
//! (x86 cannot do this; ARMv8.3+ with RCpc `ldapr` acquire loads can). A `fence(SeqCst)`
//! after each side's write now orders the pair, and the four models where a release must
//! wake a parked sender pass.
#![cfg(loom)]

use std::time::Duration;

use cohort::flow::{AcquireError, Permit, SendWindow};
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

/// A window of `capacity` with all of it held by the returned permit.
fn full_window(capacity: u64) -> (Arc<SendWindow>, Permit) {
    let w = Arc::new(SendWindow::new(capacity));
    let held = w.try_acquire(capacity).unwrap();
    assert_eq!(w.try_acquire(1).err(), Some(AcquireError::Full));
    (w, held)
}

/// A sender's permit, checked to hold `n` bytes.
fn granted(r: Result<Permit, AcquireError>, n: u64) -> Permit {
    let p = r.expect("the sender got its permits");
    assert_eq!(p.bytes(), n);
    p
}

fn assert_whole(w: &SendWindow) {
    assert_eq!(w.available(), w.capacity(), "permits not conserved");
    assert_eq!(w.in_flight(), 0);
    assert_eq!(w.waiters(), 0, "a waiter left registered");
}

/// Concurrent takers and givers on the fast path (nobody parks: the window of 3 always has
/// room for the 1-unit `acquire`): permits are never over-committed and all come back.
#[test]
fn fast_path_acquire_and_release_conserve_permits() {
    loom_tests::model(
        "window/fast_path_acquire_and_release_conserve_permits",
        || {
            let w = Arc::new(SendWindow::new(3));
            let held = Arc::new(AtomicU64::new(0));
            let take_twice = {
                let (w, held) = (w.clone(), held.clone());
                thread::spawn(move || {
                    for _ in 0..2 {
                        if let Ok(p) = w.try_acquire(2) {
                            let now = held.fetch_add(2, Ordering::Relaxed) + 2;
                            assert!(now <= 3, "window over-committed: {now} held");
                            held.fetch_sub(2, Ordering::Relaxed);
                            w.release(p);
                        }
                    }
                })
            };
            let p = w.acquire(1).unwrap();
            let now = held.fetch_add(1, Ordering::Relaxed) + 1;
            assert!(now <= 3, "window over-committed: {now} held");
            held.fetch_sub(1, Ordering::Relaxed);
            w.release(p);
            take_twice.join().unwrap();
            assert_whole(&w);
        },
    );
}

/// A sender blocked on a full window of 2 wants both units; the main thread gives them
/// back one at a time, so the first wake-up is not enough and the sender must park again.
#[test]
fn acquire_wakes_on_releases_in_halves() {
    loom_tests::model("window/acquire_wakes_on_releases_in_halves", || {
        let (w, mut held) = full_window(2);
        let sender = {
            let w = w.clone();
            thread::spawn(move || w.acquire(2))
        };
        w.release(held.take(1));
        w.release(held);
        let p = granted(sender.join().unwrap(), 2);
        assert_eq!(w.available(), 0);
        w.release(p);
        assert_whole(&w);
    });
}

/// Thread A acquires the whole window (blocking) while thread B releases what the main
/// thread took; A then gives it back.
#[test]
fn acquire_races_release_from_another_thread() {
    loom_tests::model("window/acquire_races_release_from_another_thread", || {
        let (w, held) = full_window(2);
        let a = {
            let w = w.clone();
            thread::spawn(move || {
                let p = w.acquire(2).unwrap();
                w.release(p);
            })
        };
        let b = {
            let w = w.clone();
            thread::spawn(move || w.release(held))
        };
        a.join().unwrap();
        b.join().unwrap();
        assert_whole(&w);
    });
}

/// Two senders blocked for one unit each; the main thread releases one unit twice. Both
/// must get through (a release that wakes only one, or wakes one that cannot proceed, would
/// strand the other).
#[test]
fn two_blocked_senders_both_wake() {
    loom_tests::model("window/two_blocked_senders_both_wake", || {
        let (w, mut held) = full_window(2);
        let senders: Vec<_> = (0..2)
            .map(|_| {
                let w = w.clone();
                thread::spawn(move || w.acquire(1))
            })
            .collect();
        w.release(held.take(1));
        w.release(held);
        let mut got = Permit::none();
        for s in senders {
            got.absorb(granted(s.join().unwrap(), 1));
        }
        assert_eq!(w.available(), 0);
        w.release(got);
        assert_whole(&w);
    });
}

/// `acquire_timeout` on its notify path (the timeout never fires under loom): the release
/// wakes it before its (long) deadline.
#[test]
fn acquire_timeout_woken_by_release() {
    loom_tests::model("window/acquire_timeout_woken_by_release", || {
        let (w, held) = full_window(2);
        let sender = {
            let w = w.clone();
            thread::spawn(move || w.acquire_timeout(2, Duration::from_secs(3600)))
        };
        w.release(held);
        let p = granted(sender.join().unwrap(), 2);
        w.release(p);
        assert_whole(&w);
    });
}

/// `close()` racing two blocked acquirers (`acquire` and `acquire_timeout`): with no
/// permits coming back, both must return `Err(Closed)` (a hang is a loom deadlock), and
/// releases after the close still count.
#[test]
fn close_wakes_blocked_acquirers() {
    loom_tests::model("window/close_wakes_blocked_acquirers", || {
        let (w, held) = full_window(2);
        let a = {
            let w = w.clone();
            thread::spawn(move || w.acquire(1).err())
        };
        let b = {
            let w = w.clone();
            thread::spawn(move || w.acquire_timeout(2, Duration::from_secs(3600)).err())
        };
        w.close();
        assert_eq!(a.join().unwrap(), Some(AcquireError::Closed));
        assert_eq!(b.join().unwrap(), Some(AcquireError::Closed));
        assert!(w.is_closed());
        assert_eq!(w.try_acquire(1).err(), Some(AcquireError::Closed));
        w.release(held);
        assert_whole(&w);
    });
}

/// `close()` and `release()` racing a blocked `acquire`: the acquirer either gets its
/// permits (and gives them back) or fails with `Closed`; either way it returns and the
/// window ends whole.
#[test]
fn close_and_release_race_a_blocked_acquire() {
    loom_tests::model("window/close_and_release_race_a_blocked_acquire", || {
        let (w, held) = full_window(2);
        let sender = {
            let w = w.clone();
            thread::spawn(move || match w.acquire(2) {
                Ok(p) => {
                    w.release(p);
                    true
                }
                Err(AcquireError::Closed) => false,
                Err(e) => panic!("unexpected {e:?}"),
            })
        };
        let releaser = {
            let w = w.clone();
            thread::spawn(move || w.release(held))
        };
        w.close();
        let _got = sender.join().unwrap();
        releaser.join().unwrap();
        assert_whole(&w);
    });
}
