//! Timers of the IO thread: one binary heap polled by the event loop, no thread per timer.
//! A fired entry whose target has moved on (a newer reconnect generation, an ack no longer
//! owed) is ignored, so most timers need no cancelling; the timers of what is gone for good
//! (a closed link's handshake deadline, a removed peer's reconnect and ack timers) are
//! removed at once with [`Timers::cancel`], so nothing of them is left behind.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use super::LinkId;

/// What a timer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TimerKind {
    /// Dial peer `peer` again if its reconnect generation is still `gen`.
    Reconnect { peer: usize, gen: u64 },
    /// Close link `link` if it is still connecting or handshaking.
    Handshake { link: LinkId },
    /// Send an ack to `peer` if one is still owed.
    AckDelay { peer: usize },
    /// Periodic housekeeping: probes, block warnings, residual credit, expiry.
    Tick,
    /// Shutdown's deadline.
    Deadline,
    /// Forget peer `peer` (admitted at run time) if its generation is still `gen`: it
    /// stayed disconnected since.
    Forget { peer: usize, gen: u64 },
    /// Dial seed `seed` again if its generation is still `gen` and the node reaches nobody.
    Seed { seed: usize, gen: u64 },
    /// Resolve seed name `name` again if its generation is still `gen` and the node
    /// reaches nobody.
    Resolve { name: usize, gen: u64 },
}

#[derive(Debug, Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u64, TimerKind)>>,
    seq: u64,
}

impl Timers {
    pub(crate) fn add(&mut self, at: Instant, kind: TimerKind) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, kind)));
    }

    /// When the next timer is due, or `None` when there is none.
    pub(crate) fn next_at(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Pops one timer due at `now`, with the instant it was due.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(Instant, TimerKind)> {
        match self.heap.peek() {
            Some(Reverse((at, _, _))) if *at <= now => {
                self.heap.pop().map(|Reverse((at, _, k))| (at, k))
            }
            _ => None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    /// How many timers `which` picks, for tests.
    #[cfg(test)]
    pub(crate) fn count(&self, which: impl Fn(&TimerKind) -> bool) -> usize {
        self.heap
            .iter()
            .filter(|Reverse((_, _, k))| which(k))
            .count()
    }

    /// Removes every timer `doomed` says is dead (a removed peer's, a closed connection's),
    /// so nothing of them is left behind.
    pub(crate) fn cancel(&mut self, doomed: impl Fn(&TimerKind) -> bool) {
        self.heap.retain(|Reverse((_, _, k))| !doomed(k));
    }
}

/// Jittered exponential backoff: `min · 2^attempt`, capped at `max`, then a uniform draw in
/// `[d/2, d]` so members that lost each other at once do not redial in lockstep.
#[derive(Debug)]
pub(crate) struct Backoff {
    rng: u64,
}

impl Backoff {
    pub(crate) fn new(seed: u64) -> Backoff {
        Backoff { rng: seed | 1 }
    }

    fn next_u64(&mut self) -> u64 {
        // xorshift64*: plenty for jitter.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(crate) fn delay(&mut self, attempt: u32, min: Duration, max: Duration) -> Duration {
        let exp = min.saturating_mul(1u32 << attempt.min(16));
        let d = exp.min(max).max(min);
        let half = d / 2;
        let span = (d - half).as_nanos().max(1) as u64;
        half + Duration::from_nanos(self.next_u64() % span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_pop_in_order() {
        let mut t = Timers::default();
        let now = Instant::now();
        t.add(now + Duration::from_millis(5), TimerKind::Deadline);
        t.add(now, TimerKind::AckDelay { peer: 1 });
        assert_eq!(t.pop_due(now), Some((now, TimerKind::AckDelay { peer: 1 })));
        assert_eq!(t.pop_due(now), None);
        assert!(t.next_at().unwrap() <= now + Duration::from_millis(5));
        assert_eq!(
            t.pop_due(now + Duration::from_millis(5)),
            Some((now + Duration::from_millis(5), TimerKind::Deadline))
        );
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn backoff_grows_with_jitter_and_caps() {
        let mut b = Backoff::new(42);
        let (min, max) = (Duration::from_millis(10), Duration::from_millis(1000));
        for attempt in 0..30 {
            let d = b.delay(attempt, min, max);
            let cap = min.saturating_mul(1 << attempt.min(16)).min(max);
            assert!(
                d >= cap / 2 && d <= cap,
                "attempt {attempt}: {d:?} vs cap {cap:?}"
            );
        }
    }
}
