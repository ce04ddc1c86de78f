//! One sender's out-of-band messages: a queue drained by at most `limit` pool threads at
//! once, in no particular order. The limit is the sender's fair share of the pool: an OOB
//! flood, or a handler that blocks on one sender's OOB messages, occupies at most `limit`
//! threads, and the pool's task queue holds at most `limit` tasks for it, however many
//! messages it sends (what it sends is bounded by its window).
//!
//! The count of drainers lives under the queue's lock, so "a message is queued" and "a
//! drainer will see it" cannot come apart: a producer that finds `limit` drainers running
//! leaves the message to them, and a drainer only leaves (decrementing the count) after it
//! found the queue empty under the same lock.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::{CreditSink, Delivery, RunOutcome};
use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use crate::sync::{Arc, Mutex, SharedStr};

/// Messages a drainer takes per lock of the queue.
const CHUNK: usize = 32;

struct Inner {
    queue: VecDeque<Delivery>,
    /// Drainers scheduled or running (at most `limit`).
    running: usize,
}

/// What one [`OobQueue::run`] did, for the pool's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct OobRun {
    /// How the run ended.
    pub outcome: RunOutcome,
    /// Messages delivered.
    pub delivered: u64,
    /// Their payload bytes.
    pub bytes: u64,
    /// Handler panics caught.
    pub panics: u64,
}

/// A sender's out-of-band queue with a cap on concurrent drainers.
///
/// ```
/// use std::sync::Arc;
/// use cohort::internals::deliver::{CreditSink, Delivery, OobQueue, RunOutcome};
/// struct NoCredit;
/// impl CreditSink for NoCredit {
///     fn consumed(&self, _epoch: u32, _cost: u64) {}
///     fn idle(&self) {}
/// }
/// let q = OobQueue::new("alpha".into(), 1, Arc::new(NoCredit));
/// let d = |i: u8| Delivery::new("alpha".into(), cohort::Bytes::from(vec![i]), None, true);
/// assert_eq!(q.push([d(1), d(2)]), 1, "one drainer to schedule");
/// assert_eq!(q.push([d(3)]), 0, "the limit (1) is running");
/// let run = q.run(10, &|_d| {});
/// assert_eq!((run.outcome, run.delivered), (RunOutcome::Idle, 3));
/// ```
pub struct OobQueue {
    name: SharedStr,
    limit: usize,
    inner: Mutex<Inner>,
    credit: Arc<dyn CreditSink>,
    /// Drainers inside `run` right now, and the most ever seen (never above `limit`).
    active: AtomicUsize,
    max_active: AtomicUsize,
    delivered: AtomicU64,
}

impl std::fmt::Debug for OobQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OobQueue")
            .field("name", &self.name)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl OobQueue {
    /// An empty queue for sender `name`, drained by at most `limit` threads at once (at
    /// least one), reporting consumption to `credit`.
    pub fn new(name: SharedStr, limit: usize, credit: Arc<dyn CreditSink>) -> OobQueue {
        OobQueue {
            name,
            limit: limit.max(1),
            inner: Mutex::new(Inner {
                queue: VecDeque::new(),
                running: 0,
            }),
            credit,
            active: AtomicUsize::new(0),
            max_active: AtomicUsize::new(0),
            delivered: AtomicU64::new(0),
        }
    }

    /// The sender's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Appends messages. Returns how many drainers the caller must schedule (each one a
    /// pool task running [`run`](OobQueue::run)): enough to reach the limit, never more than
    /// there are messages.
    pub fn push<I: IntoIterator<Item = Delivery>>(&self, batch: I) -> usize {
        let mut g = self.inner.lock();
        g.queue.extend(batch);
        let start = (self.limit - g.running).min(g.queue.len());
        g.running += start;
        start
    }

    /// Delivers messages to `handler` until the queue is empty (the drainer leaves:
    /// [`RunOutcome::Idle`]) or `budget` messages were delivered (it keeps its place:
    /// [`RunOutcome::Yield`], the caller re-submits it to the back of the pool). Must be
    /// called only by a drainer [`push`](OobQueue::push) asked for, or a re-submission.
    pub fn run(&self, budget: usize, mut handler: impl FnMut(Delivery)) -> OobRun {
        let now = self.active.fetch_add(1, Ordering::AcqRel) + 1;
        self.max_active.fetch_max(now, Ordering::AcqRel);
        let budget = budget.max(1);
        let track = self.credit.tracks_progress();
        let (mut delivered, mut bytes, mut panics) = (0u64, 0u64, 0u64);
        let mut batch = VecDeque::with_capacity(CHUNK);
        let outcome = loop {
            {
                let mut g = self.inner.lock();
                if g.queue.is_empty() {
                    // Leave the active count before the slot: once the slot is free a
                    // producer may start another drainer at once.
                    self.active.fetch_sub(1, Ordering::AcqRel);
                    g.running -= 1;
                    break RunOutcome::Idle;
                }
                let n = g.queue.len().min(CHUNK).min(budget - delivered as usize);
                batch.extend(g.queue.drain(..n));
            }
            for d in batch.drain(..) {
                let len = d.payload().len();
                let (epoch, seq, cost) = (d.epoch(), d.seq(), d.cost());
                if catch_unwind(AssertUnwindSafe(|| handler(d))).is_err() {
                    panics += 1;
                    log::error!(
                        "message handler panicked on an out-of-band message from '{}'; continuing",
                        self.name
                    );
                }
                match seq {
                    Some(seq) if track => self.credit.handled(epoch, &[seq]),
                    _ => {}
                }
                self.credit.consumed(epoch, cost);
                if seq.is_none() && track {
                    self.credit.handled_unreliable(epoch, cost);
                }
                delivered += 1;
                bytes += len as u64;
            }
            if delivered as usize >= budget {
                break RunOutcome::Yield;
            }
        };
        if outcome == RunOutcome::Yield {
            self.active.fetch_sub(1, Ordering::AcqRel);
        }
        self.delivered.fetch_add(delivered, Ordering::Relaxed);
        if outcome == RunOutcome::Idle {
            self.credit.idle();
        }
        OobRun {
            outcome,
            delivered,
            bytes,
            panics,
        }
    }

    /// Messages queued and not yet taken by a drainer.
    #[cfg(any(test, cohort_internals))]
    pub fn queued(&self) -> usize {
        self.inner.lock().queue.len()
    }

    /// Out-of-band messages of this sender delivered.
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// The most drainers ever seen running at once (at most the limit unless the
    /// invariant broke).
    pub fn max_concurrent(&self) -> usize {
        self.max_active.load(Ordering::Relaxed)
    }
}
