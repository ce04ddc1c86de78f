//! The concurrency facade: the only module that names `std::sync`, `parking_lot`,
//! `crossbeam` or `std::thread`.
//!
//! Every other module imports its primitives from here, so that under
//! `RUSTFLAGS="--cfg loom"` the models in `loom-tests/` check the code that ships, not a
//! copy. Outside loom the fast implementations are used: `parking_lot` locks, std atomics,
//! std threads. Under loom, `loom`'s types stand in (parking_lot has no loom support, so a
//! thin adapter gives loom's `Mutex`/`Condvar` the parking_lot-style API used here).
//!
//! The API is parking_lot's: `lock()` returns the guard directly (no poisoning: a panic in a
//! user handler is caught before it can poison anything of ours), and `Condvar::wait` takes
//! `&mut guard`.

#[cfg(not(loom))]
mod imp {
    pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
    pub(crate) use std::sync::{Arc, Weak};

    /// Atomics (std outside loom).
    pub(crate) mod atomic {
        pub(crate) use std::sync::atomic::{
            fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering,
        };
    }

    /// Threads (std outside loom).
    pub(crate) mod thread {
        pub(crate) use std::thread::{yield_now, Builder, JoinHandle};
    }

    /// Waits on `cv` until woken or `timeout` elapses; returns `true` if it timed out.
    pub(crate) fn wait_timeout<T>(
        cv: &Condvar,
        guard: &mut MutexGuard<'_, T>,
        timeout: std::time::Duration,
    ) -> bool {
        cv.wait_for(guard, timeout).timed_out()
    }
}

#[cfg(loom)]
mod imp {
    // std's `Arc` even under loom: loom's `Arc` cannot coerce to `Arc<dyn Trait>` nor be a
    // `self` receiver, and the shared state inside is loom's (atomics, locks) either way.
    pub(crate) use std::sync::{Arc, Weak};

    /// Atomics (loom's under `cfg(loom)`).
    pub(crate) mod atomic {
        pub(crate) use loom::sync::atomic::{
            fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering,
        };
    }

    /// Threads (loom's under `cfg(loom)`).
    pub(crate) mod thread {
        pub(crate) use loom::thread::{yield_now, Builder, JoinHandle};
    }

    /// loom's `Mutex` with parking_lot's API.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    /// Guard of [`Mutex`]; an `Option` so that `Condvar::wait(&mut guard)` can move the
    /// inner loom guard through loom's by-value `wait`.
    #[derive(Debug)]
    pub(crate) struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            // Poisoning cannot happen in a model that does not panic while holding a lock.
            MutexGuard(Some(self.0.lock().expect("loom mutex poisoned")))
        }
        #[allow(dead_code)] // parking_lot's API; not every build calls it
        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock().ok().map(|g| MutexGuard(Some(g)))
        }
    }

    impl<T> std::ops::Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().expect("guard present outside wait")
        }
    }
    impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().expect("guard present outside wait")
        }
    }

    /// loom's `Condvar` with parking_lot's API.
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(loom::sync::Condvar::new())
        }
        pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let inner = guard.0.take().expect("guard present");
            guard.0 = Some(self.0.wait(inner).expect("loom mutex poisoned"));
        }
        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }
        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    /// loom's `RwLock` with parking_lot's API.
    #[derive(Debug)]
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            RwLock(loom::sync::RwLock::new(value))
        }
        pub(crate) fn read(&self) -> loom::sync::RwLockReadGuard<'_, T> {
            self.0.read().expect("loom rwlock poisoned")
        }
        pub(crate) fn write(&self) -> loom::sync::RwLockWriteGuard<'_, T> {
            self.0.write().expect("loom rwlock poisoned")
        }
    }

    /// loom's `Condvar::wait_timeout` never times out: the notify path is what loom models;
    /// the timeout path is covered by plain unit tests.
    pub(crate) fn wait_timeout<T>(
        cv: &Condvar,
        guard: &mut MutexGuard<'_, T>,
        _timeout: std::time::Duration,
    ) -> bool {
        cv.wait(guard);
        false
    }
}

pub(crate) use imp::*;

/// Waits on `cv` until woken or `deadline` passes (no limit with `None`). Returns `false`,
/// without waiting, if the deadline has already passed: the caller's loop gives up then.
pub(crate) fn wait_until<T>(
    cv: &Condvar,
    guard: &mut MutexGuard<'_, T>,
    deadline: Option<std::time::Instant>,
) -> bool {
    match deadline {
        None => cv.wait(guard),
        Some(d) => {
            let now = std::time::Instant::now();
            if now >= d {
                return false;
            }
            wait_timeout(cv, guard, d - now);
        }
    }
    true
}

/// Pads a hot value to its own cache line (crossbeam's, in every build).
pub(crate) use crossbeam_utils::CachePadded;

/// An immutable shared string (member names). Not concurrency state, so it stays std's
/// `Arc` even under loom.
pub(crate) type SharedStr = std::sync::Arc<str>;
