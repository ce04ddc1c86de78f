//! One sender's queue of regular messages and its state word: at most one pool thread
//! delivers a given sender's messages at any moment, in the sender's order.
//!
//! The state word has the shape of tokio's task state:
//!
//! | bits       | meaning                                                              |
//! |------------|----------------------------------------------------------------------|
//! | `0`        | idle: no deliverer; the next producer schedules one                  |
//! | `RUNNING`  | a deliverer is scheduled or running; producers do not schedule       |
//! | `NOTIFIED` | set by a producer that found `RUNNING`: the deliverer must go round  |
//! |            | again before it may go idle                                          |
//!
//! Invariant: a message pushed to the queue is either seen by the deliverer's next drain,
//! or its producer sets `NOTIFIED` after the deliverer cleared it, which makes the
//! deliverer's `RUNNING → idle` transition fail. Nothing is stranded.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::Delivery;
use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use crate::sync::{Mutex, SharedStr};

const RUNNING: usize = 0b01;
const NOTIFIED: usize = 0b10;

/// Where a deliverer reports what the application consumed, so the receiver can return
/// credit to the sender.
pub trait CreditSink: Send + Sync {
    /// Messages of stream epoch `epoch` costing `cost` window bytes (see
    /// [`crate::flow::cost`]) were handled by the application.
    fn consumed(&self, epoch: u32, cost: u64);
    /// The sender's queue went idle (end of a burst): flush whatever credit is pending.
    fn idle(&self);
    /// Whether [`handled`](CreditSink::handled) wants the sequence numbers of handled
    /// messages (only a journalling receiver does; others skip collecting them).
    fn tracks_progress(&self) -> bool {
        false
    }
    /// Reliable messages of stream epoch `epoch` with these sequence numbers were handled
    /// (the handler returned). Called before [`consumed`](CreditSink::consumed) for them.
    fn handled(&self, _epoch: u32, _seqs: &[u64]) {}
    /// Unreliable messages of stream epoch `epoch` costing `cost` window bytes were handled.
    /// Called after [`consumed`](CreditSink::consumed) for them, so that whoever reads this
    /// count before taking the credit never counts bytes whose credit it has not taken.
    fn handled_unreliable(&self, _epoch: u32, _cost: u64) {}
}

/// What [`SenderQueue::run`] ended with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum RunOutcome {
    /// Queue empty, state idle: the next push schedules a new deliverer.
    Idle,
    /// The batch budget ran out with the state still `RUNNING`: the caller must submit the
    /// queue to the pool again (to the back, so other senders get their turn).
    Yield,
}

/// What a deliverer consumed of one stream epoch, reported to the [`CreditSink`] in the
/// order its contract asks: handled sequence numbers, then the credit, then the unreliable
/// bytes.
#[derive(Default)]
struct Segment {
    epoch: u32,
    cost: u64,
    unreliable: u64,
}

impl Segment {
    fn is_empty(&self) -> bool {
        self.cost == 0
    }

    fn report(&mut self, sink: &dyn CreditSink, seqs: &mut Vec<u64>) {
        if !seqs.is_empty() {
            sink.handled(self.epoch, seqs);
            seqs.clear();
        }
        if self.cost > 0 {
            sink.consumed(self.epoch, self.cost);
        }
        if self.unreliable > 0 {
            sink.handled_unreliable(self.epoch, self.unreliable);
        }
        *self = Segment::default();
    }
}

/// A sender's batch queue plus its delivering state word.
pub struct SenderQueue {
    name: SharedStr,
    queue: Mutex<VecDeque<Delivery>>,
    state: AtomicUsize,
    credit: Box<dyn CreditSink>,
    queued_bytes: AtomicU64,
    delivered: AtomicU64,
    delivered_bytes: AtomicU64,
    panics: AtomicU64,
    /// Deliverers inside `run` right now (must never exceed 1).
    active: AtomicUsize,
    /// The most ever seen in `active`.
    max_active: AtomicUsize,
}

impl std::fmt::Debug for SenderQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SenderQueue")
            .field("name", &self.name)
            .field("state", &self.state.load(Ordering::Relaxed))
            .field("queued_bytes", &self.queued_bytes.load(Ordering::Relaxed))
            .field("delivered", &self.delivered.load(Ordering::Relaxed))
            .finish()
    }
}

impl SenderQueue {
    /// An empty, idle queue for sender `name`, reporting consumption to `credit`.
    pub fn new(name: SharedStr, credit: Box<dyn CreditSink>) -> SenderQueue {
        SenderQueue {
            name,
            queue: Mutex::new(VecDeque::new()),
            state: AtomicUsize::new(0),
            credit,
            queued_bytes: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            delivered_bytes: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            max_active: AtomicUsize::new(0),
        }
    }

    /// The sender's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Appends messages in order. Returns `true` when the caller must schedule a deliverer
    /// (the state went from idle to `RUNNING`); `false` when one is already on it.
    pub fn push<I: IntoIterator<Item = Delivery>>(&self, batch: I) -> bool {
        let mut bytes = 0u64;
        {
            let mut q = self.queue.lock();
            for d in batch {
                bytes += d.payload().len() as u64;
                q.push_back(d);
            }
        }
        self.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.notify()
    }

    /// Producer half of the state protocol: schedule if idle, else make the running
    /// deliverer go round again.
    fn notify(&self) -> bool {
        // AcqRel: Release publishes our push to the deliverer that clears NOTIFIED with
        // Acquire; Acquire orders us after a deliverer's idle transition.
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            if cur & RUNNING != 0 {
                if cur & NOTIFIED != 0 {
                    return false; // already notified; our push is before its next drain
                }
                match self.state.compare_exchange_weak(
                    cur,
                    cur | NOTIFIED,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return false,
                    Err(now) => cur = now,
                }
            } else {
                match self.state.compare_exchange_weak(
                    cur,
                    RUNNING,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return true,
                    Err(now) => cur = now,
                }
            }
        }
    }

    /// Delivers up to `budget` messages to `handler`, in order. Must be called only by the
    /// holder of `RUNNING` (the task a `push` returning `true` scheduled, or a re-submission
    /// after [`RunOutcome::Yield`]).
    pub fn run(&self, budget: usize, mut handler: impl FnMut(Delivery)) -> RunOutcome {
        let now_active = self.active.fetch_add(1, Ordering::AcqRel) + 1;
        self.max_active.fetch_max(now_active, Ordering::AcqRel);
        let budget = budget.max(1);
        let mut done = 0usize;
        let mut batch = VecDeque::new();
        // Sequence numbers handled, for a journalling receiver's progress.
        let mut seqs = Vec::new();
        let outcome = loop {
            // Clear NOTIFIED before draining: any push not seen by this drain sets it again
            // afterwards, and the idle transition below fails. Acquire pairs with the
            // producers' Release.
            self.state.fetch_and(!NOTIFIED, Ordering::AcqRel);
            {
                let mut q = self.queue.lock();
                let room = budget - done;
                if q.len() <= room {
                    std::mem::swap(&mut *q, &mut batch);
                } else {
                    batch.extend(q.drain(..room));
                }
            }
            let mut bytes = 0u64;
            let n = batch.len();
            let track = n > 0 && self.credit.tracks_progress();
            // What the batch consumed, reported per stream epoch (a batch spans two epochs
            // only right after the sender's stream restarted).
            let mut seg = Segment::default();
            for mut d in batch.drain(..) {
                if !d.is_named() {
                    d.name_as(&self.name);
                }
                if d.epoch() != seg.epoch && !seg.is_empty() {
                    seg.report(&*self.credit, &mut seqs);
                }
                seg.epoch = d.epoch();
                let len = d.payload().len();
                bytes += len as u64;
                let cost = d.cost();
                seg.cost += cost;
                let seq = d.seq();
                if track && seq.is_none() {
                    seg.unreliable += cost;
                }
                if catch_unwind(AssertUnwindSafe(|| handler(d))).is_err() {
                    self.panics.fetch_add(1, Ordering::Relaxed);
                    log::error!(
                        "message handler panicked on a message from '{}'; continuing",
                        self.name
                    );
                }
                if let Some(seq) = seq.filter(|_| track) {
                    seqs.push(seq);
                }
            }
            if n > 0 {
                self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
                self.delivered.fetch_add(n as u64, Ordering::Relaxed);
                self.delivered_bytes.fetch_add(bytes, Ordering::Relaxed);
                seg.report(&*self.credit, &mut seqs);
            }
            done += n;
            if done >= budget {
                self.active.fetch_sub(1, Ordering::AcqRel);
                break RunOutcome::Yield;
            }
            // Leave the active count before giving up RUNNING: once the state is idle the
            // next producer may start a deliverer at once (loom caught the count reading 2).
            self.active.fetch_sub(1, Ordering::AcqRel);
            // Go idle unless a producer notified us meanwhile.
            if self
                .state
                .compare_exchange(RUNNING, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                break RunOutcome::Idle;
            }
            let again = self.active.fetch_add(1, Ordering::AcqRel) + 1;
            self.max_active.fetch_max(again, Ordering::AcqRel);
        };
        if outcome == RunOutcome::Idle {
            self.credit.idle();
        }
        outcome
    }

    /// Payload bytes queued and not yet delivered.
    pub fn queued_bytes(&self) -> u64 {
        self.queued_bytes.load(Ordering::Relaxed)
    }
    /// Messages queued and not yet delivered.
    #[cfg(any(test, cohort_internals))]
    pub fn queued(&self) -> usize {
        self.queue.lock().len()
    }
    /// Messages delivered (handler returned or panicked).
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }
    /// Payload bytes delivered.
    pub fn delivered_bytes(&self) -> u64 {
        self.delivered_bytes.load(Ordering::Relaxed)
    }
    /// Handler panics caught.
    pub fn panics(&self) -> u64 {
        self.panics.load(Ordering::Relaxed)
    }
    /// The most deliverers ever seen running this queue at once (1 unless the invariant
    /// broke).
    pub fn max_concurrent(&self) -> usize {
        self.max_active.load(Ordering::Relaxed)
    }
    /// Whether a deliverer is scheduled or running.
    pub fn is_running(&self) -> bool {
        self.state.load(Ordering::Acquire) & RUNNING != 0
    }
}
