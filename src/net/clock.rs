//! The node's clock: where the IO thread, and what hands it instants (the shutdown's
//! deadline, a message's time to live, the stats' `last_heard`), read the time.
//!
//! In the application's build it is `Instant::now()` and nothing else: a zero-sized type
//! whose methods inline to the call (or to nothing). In cohort's own builds (`--cfg
//! cohort_internals`, and the crate's unit tests) a test can move it forward: the reading
//! is `Instant::now()` plus an offset that only grows, so time keeps running at its real
//! pace and a test makes time pass — three idle timeouts while the IO thread is held, a
//! handshake deadline — without sleeping through it. Everything else (the application's
//! waits, the journal's fsync interval, the pool) stays on the real clock.

#[cfg(not(any(test, cohort_internals)))]
mod imp {
    use std::time::Instant;

    /// The real clock, and nothing more.
    #[derive(Debug)]
    pub(crate) struct Clock;

    // Nothing to load, nothing to share: the IO thread's readings are `Instant::now()`.
    const _: () = assert!(std::mem::size_of::<Clock>() == 0);

    impl Clock {
        /// The real clock.
        pub(crate) fn new() -> Clock {
            Clock
        }

        /// The time now.
        #[inline(always)]
        pub(crate) fn now(&self) -> Instant {
            Instant::now()
        }

        /// The IO thread judged its timeouts as of `at` (only a test's clock keeps it).
        #[inline(always)]
        pub(crate) fn judged(&self, _at: Instant) {}
    }
}

#[cfg(any(test, cohort_internals))]
mod imp {
    use std::time::{Duration, Instant};

    use crate::sync::atomic::{AtomicU64, Ordering};

    /// The real clock plus an offset a test moves forward.
    #[derive(Debug)]
    pub(crate) struct Clock {
        /// Where [`Clock::judged`]'s instants are counted from.
        epoch: Instant,
        /// Nanoseconds added to `Instant::now()`; only grows.
        offset: AtomicU64,
        /// Nanoseconds past `epoch`, plus one, of the latest instant the IO thread judged
        /// its timeouts at (0: none yet).
        judged: AtomicU64,
    }

    impl Clock {
        /// The real clock, until a test moves it.
        pub(crate) fn new() -> Clock {
            Clock {
                epoch: Instant::now(),
                offset: AtomicU64::new(0),
                judged: AtomicU64::new(0),
            }
        }

        /// The time now: the real time plus the offset.
        #[inline]
        pub(crate) fn now(&self) -> Instant {
            // Relaxed: a reader that misses a moment-old advance reads the time as of a
            // moment before it; the test orders its advance before what it then asks of
            // the node through the node's own hand-offs (commands, the waker).
            Instant::now() + Duration::from_nanos(self.offset.load(Ordering::Relaxed))
        }

        /// The IO thread judged its timeouts as of `at`.
        #[inline]
        pub(crate) fn judged(&self, at: Instant) {
            let ns = at.saturating_duration_since(self.epoch).as_nanos();
            let ns = u64::try_from(ns).unwrap_or(u64::MAX - 1) + 1;
            // Relaxed: a gauge the IO thread writes (its instants only grow), a test polls.
            self.judged.store(ns, Ordering::Relaxed);
        }

        /// Moves the clock forward by `by`; returns its reading just after.
        pub(crate) fn advance(&self, by: Duration) -> Instant {
            let ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
            // Relaxed: see `now`.
            self.offset.fetch_add(ns, Ordering::Relaxed);
            self.now()
        }

        /// The latest instant the IO thread judged its timeouts at, if any.
        pub(crate) fn judged_at(&self) -> Option<Instant> {
            // Relaxed: see `judged`.
            match self.judged.load(Ordering::Relaxed) {
                0 => None,
                ns => Some(self.epoch + Duration::from_nanos(ns - 1)),
            }
        }
    }
}

pub(crate) use imp::Clock;

#[cfg(test)]
mod tests {
    use super::Clock;
    use std::time::Duration;

    #[test]
    fn an_advance_moves_every_later_reading_forward() {
        let clock = Clock::new();
        assert_eq!(clock.judged_at(), None);
        let before = clock.now();
        let after = clock.advance(Duration::from_secs(3600));
        assert!(after >= before + Duration::from_secs(3600));
        assert!(clock.now() >= after);
        clock.judged(before);
        clock.judged(after);
        assert_eq!(clock.judged_at(), Some(after));
    }
}
