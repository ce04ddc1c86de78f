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
//!
//! The queue holds [`Queued`] items: a message, or a [`Run`] of the regular messages one
//! read brought, which shares the read's bytes; the deliverer hands its messages one by one
//! to a [`Recipient`], lent where they lie (so the IO thread touches the read's reference
//! count once, not once per message, and a lending recipient never does).

use std::collections::VecDeque;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};

use bytes::Bytes;

use super::{Delivery, DeliveryRef, Owning, ReadBuffers, Recipient};
use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use crate::sync::{Arc, Mutex, SharedStr};
use crate::wire;

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

/// What [`MemberQueue::run`] ended with.
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

/// Regular messages of one sender, of one stream epoch, in order, that one read brought:
/// their data frames as they came, taken off the read buffer once. The IO thread checks and
/// counts the frames; the deliverer finds each message in them ([`wire::read_regular`]) and
/// lends its payload where it lies.
#[derive(Debug)]
pub struct Run {
    /// `count` regular data frames, back to back, from `at` on (before it: those already
    /// delivered).
    frames: Bytes,
    at: usize,
    epoch: u32,
    count: usize,
    /// Payload bytes of the messages.
    bytes: u64,
    /// Where its read buffer goes when this run drops its last view of it.
    home: Option<Arc<ReadBuffers>>,
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            // Unique only when every other run of the buffer, every origin (so every
            // delivery of a run) and payload slice of it, and the IO thread's own view of
            // it are gone.
            home.give_if_last(std::mem::take(&mut self.frames));
        }
    }
}

impl Run {
    /// The `count` messages (`payload_bytes` bytes of payload) whose regular data frames
    /// (each one that [`wire::peek_regular`] finds) lie back to back in `frames`, of stream
    /// epoch `epoch`.
    ///
    /// # Panics
    /// In debug builds, if `frames` does not hold exactly that.
    pub fn new(frames: Bytes, epoch: u32, count: usize, payload_bytes: u64) -> Run {
        let run = Run {
            frames,
            at: 0,
            epoch,
            count,
            bytes: payload_bytes,
            home: None,
        };
        debug_assert_eq!(
            {
                let (mut n, mut at, mut bytes) = (0, 0, 0);
                while let Some(r) = wire::peek_regular(&run.frames[at..], usize::MAX) {
                    (n, at, bytes) = (n + 1, at + r.total, bytes + (r.total - r.header) as u64);
                }
                (n, at, bytes)
            },
            (count, run.frames.len(), payload_bytes),
            "a run's frames are exactly its messages' regular data frames"
        );
        run
    }

    /// The run gives its read buffer to `home` when it drops the last view of it.
    pub fn returning_to(mut self, home: &Arc<ReadBuffers>) -> Run {
        self.home = Some(Arc::clone(home));
        self
    }

    /// Messages in the run.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the run holds no message.
    #[cfg(any(test, cohort_internals))]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Payload bytes of its messages.
    pub fn payload_bytes(&self) -> u64 {
        self.bytes
    }

    /// Takes its first message off: where its payload lies in the run's bytes, and its
    /// sequence number. `None` once it is empty.
    #[inline]
    fn pop_front(&mut self) -> Option<(Range<usize>, Option<u64>)> {
        if self.count == 0 {
            return None;
        }
        // Checked as they were read (`wire::peek_regular`): every frame is found.
        let r = wire::read_regular(&self.frames[self.at..]);
        debug_assert!(r.is_some(), "a run's frame lies within its bytes");
        let r = r?;
        let payload = self.at + r.header..self.at + r.total;
        self.at += r.total;
        self.count -= 1;
        self.bytes -= (r.total - r.header) as u64;
        Some((payload, r.seq))
    }
}

/// A run the deliverer took off its queue, `owed` of its messages counted as taken (no
/// longer in the queue's count) and not yet delivered. What is left of it when this goes —
/// delivered in part because it crossed the budget, or a panic on the way — goes back to
/// the front of the queue, where it was (only the deliverer takes from the queue, and the
/// IO thread only appends), and what was counted as taken of it is counted back.
struct Taken<'a> {
    queue: &'a Mutex<Items>,
    run: Run,
    owed: usize,
}

impl Taken<'_> {
    /// Its next message, one of those counted as taken: where its payload lies in
    /// `self.run.frames`, and its sequence number.
    #[inline]
    fn next(&mut self) -> Option<(Range<usize>, Option<u64>)> {
        if self.owed == 0 {
            return None;
        }
        let m = self.run.pop_front()?;
        self.owed -= 1;
        Some(m)
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if self.run.count > 0 {
            let rest = std::mem::replace(
                &mut self.run,
                Run {
                    frames: Bytes::new(),
                    at: 0,
                    epoch: 0,
                    count: 0,
                    bytes: 0,
                    home: None,
                },
            );
            let mut q = self.queue.lock();
            q.messages += self.owed;
            q.items.push_front(Queued::Run(rest));
        }
    }
}

/// One item of a member queue: a message, or a run of messages from one read.
#[derive(Debug)]
pub enum Queued {
    /// One message.
    One(Delivery),
    /// Messages from one read.
    Run(Run),
}

impl Queued {
    fn len(&self) -> usize {
        match self {
            Queued::One(_) => 1,
            Queued::Run(r) => r.len(),
        }
    }

    fn payload_bytes(&self) -> u64 {
        match self {
            Queued::One(d) => d.payload().len() as u64,
            Queued::Run(r) => r.payload_bytes(),
        }
    }
}

impl From<Delivery> for Queued {
    fn from(d: Delivery) -> Queued {
        Queued::One(d)
    }
}

impl From<Run> for Queued {
    fn from(r: Run) -> Queued {
        Queued::Run(r)
    }
}

/// The queue behind a member queue's lock: its items and how many messages they hold.
#[derive(Default)]
struct Items {
    items: VecDeque<Queued>,
    messages: usize,
}

/// A sender's batch queue plus its delivering state word.
pub struct MemberQueue {
    name: SharedStr,
    queue: Mutex<Items>,
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

impl std::fmt::Debug for MemberQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberQueue")
            .field("name", &self.name)
            .field("state", &self.state.load(Ordering::Relaxed))
            .field("queued_bytes", &self.queued_bytes.load(Ordering::Relaxed))
            .field("delivered", &self.delivered.load(Ordering::Relaxed))
            .finish()
    }
}

impl MemberQueue {
    /// An empty, idle queue for sender `name`, reporting consumption to `credit`.
    pub fn new(name: SharedStr, credit: Box<dyn CreditSink>) -> MemberQueue {
        MemberQueue {
            name,
            queue: Mutex::new(Items::default()),
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

    /// Appends messages (or runs of them) in order. Returns `true` when the caller must
    /// schedule a deliverer (the state went from idle to `RUNNING`); `false` when one is
    /// already on it.
    pub fn push<I>(&self, batch: I) -> bool
    where
        I: IntoIterator,
        I::Item: Into<Queued>,
    {
        let mut bytes = 0u64;
        {
            let mut q = self.queue.lock();
            for item in batch {
                let item = item.into();
                bytes += item.payload_bytes();
                q.messages += item.len();
                q.items.push_back(item);
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
    #[cfg(any(test, cohort_internals))]
    pub fn run(&self, budget: usize, handler: impl FnMut(Delivery)) -> RunOutcome {
        self.run_to(budget, &mut Owning::new(None, handler))
    }

    /// [`run`](MemberQueue::run), each message handed over to `to` as it lies: a message
    /// of a run lent out of the run's bytes, a message that came alone as its delivery.
    pub fn run_to(&self, budget: usize, to: &mut impl Recipient) -> RunOutcome {
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
            // When the batch's last item is a run that crosses the budget: how many of its
            // messages to deliver now (the rest goes back, still counted: `Taken`).
            let mut last_take = None;
            let n = {
                let mut q = self.queue.lock();
                let room = budget - done;
                if q.messages <= room {
                    std::mem::swap(&mut q.items, &mut batch);
                    std::mem::take(&mut q.messages)
                } else {
                    // Whole items up to the budget, and the run that crosses it.
                    let mut taken = 0;
                    while taken < room {
                        let Some(item) = q.items.pop_front() else {
                            break;
                        };
                        if item.len() > room - taken {
                            last_take = Some(room - taken);
                            taken = room;
                        } else {
                            taken += item.len();
                        }
                        batch.push_back(item);
                    }
                    // The rest of a split run stays counted: it goes back.
                    q.messages -= taken;
                    taken
                }
            };
            let mut bytes = 0u64;
            let track = n > 0 && self.credit.tracks_progress();
            // What the batch consumed, reported per stream epoch (a batch spans two epochs
            // only right after the sender's stream restarted).
            let mut seg = Segment::default();
            // Counts one message about to be handed over: `len` payload bytes, `cost` window
            // bytes, of stream epoch `epoch`, reliable with sequence number `seq` or not.
            // (Reported once the batch is through, or before a message of another epoch:
            // after the handler returned.)
            let mut count = |epoch: u32, len: usize, cost: u64, seq: Option<u64>| {
                if epoch != seg.epoch && !seg.is_empty() {
                    seg.report(&*self.credit, &mut seqs);
                }
                seg.epoch = epoch;
                bytes += len as u64;
                seg.cost += cost;
                match seq {
                    Some(seq) if track => seqs.push(seq),
                    None if track => seg.unreliable += cost,
                    _ => {}
                }
            };
            let last = batch.len().wrapping_sub(1);
            for (i, item) in batch.drain(..).enumerate() {
                match item {
                    Queued::One(mut d) => {
                        if !d.is_named() {
                            d.name_as(&self.name);
                        }
                        count(d.epoch(), d.payload().len(), d.cost(), d.seq());
                        self.guarded(|| to.take(d));
                    }
                    // Each payload lent where it lies in the run's bytes.
                    Queued::Run(run) => {
                        let epoch = run.epoch;
                        let take = last_take.filter(|_| i == last).unwrap_or(run.len());
                        let mut run = Taken {
                            queue: &self.queue,
                            run,
                            owed: take,
                        };
                        while let Some((span, seq)) = run.next() {
                            let more = run.owed > 0;
                            count(epoch, span.len(), crate::flow::cost(span.len()), seq);
                            let (frames, home) = (&run.run.frames, run.run.home.as_ref());
                            let msg =
                                DeliveryRef::of_run(&self.name, frames, home, span, seq, epoch);
                            self.guarded(|| to.lend(msg, more));
                        }
                    }
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

    /// Runs `hand` (a message handed to the application), catching, counting and logging
    /// a panic in it: the next message is delivered.
    #[inline]
    fn guarded(&self, hand: impl FnOnce()) {
        if catch_unwind(AssertUnwindSafe(hand)).is_err() {
            self.panics.fetch_add(1, Ordering::Relaxed);
            log::error!(
                "message handler panicked on a message from '{}'; continuing",
                self.name
            );
        }
    }

    /// Payload bytes queued and not yet delivered.
    pub fn queued_bytes(&self) -> u64 {
        self.queued_bytes.load(Ordering::Relaxed)
    }
    /// Messages queued and not yet delivered.
    #[cfg(any(test, cohort_internals))]
    pub fn queued(&self) -> usize {
        self.queue.lock().messages
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::deliver::Lending;
    use crate::sync::Arc;

    /// Adds up the credit reported, per epoch.
    #[derive(Default)]
    struct Tally(Mutex<Vec<(u32, u64)>>);

    impl CreditSink for Arc<Tally> {
        fn consumed(&self, epoch: u32, cost: u64) {
            self.0.lock().push((epoch, cost));
        }
        fn idle(&self) {}
    }

    /// `n` payloads of 1..=n bytes, each holding its sequence number, in reliable data
    /// frames in one buffer, as a run of epoch `epoch` with sequence numbers from `first`.
    fn run(n: usize, first: u64, epoch: u32) -> Run {
        let mut buf = Vec::new();
        for i in 0..n {
            let seq = first + i as u64;
            let payload = vec![seq as u8; i + 1];
            wire::encode_data(&mut buf, wire::FLAG_RELIABLE, Some(seq), &payload);
        }
        Run::new(Bytes::from(buf), epoch, n, (n * (n + 1) / 2) as u64)
    }

    /// A credit sink that panics at its first report, as a broken one would.
    struct PanicsOnce(std::sync::atomic::AtomicBool);

    impl CreditSink for Arc<PanicsOnce> {
        fn consumed(&self, _epoch: u32, _cost: u64) {
            if !self.0.swap(true, std::sync::atomic::Ordering::Relaxed) {
                panic!("the credit sink fails");
            }
        }
        fn idle(&self) {}
    }

    /// A panic outside the handler, while a run that crossed the budget is being delivered,
    /// leaves the rest of that run at the front of the queue and counted: the message in
    /// hand is lost with the panic, nothing else.
    #[test]
    fn a_panic_while_a_split_run_is_delivered_leaves_its_rest_queued_and_counted() {
        let sink = Arc::new(PanicsOnce(std::sync::atomic::AtomicBool::new(false)));
        let q = MemberQueue::new("a".into(), Box::new(sink));
        let single = Delivery::unnamed(Bytes::from_static(&[4; 4]), Some(4)).into();
        // The run's first message, of another epoch, reports the single message's credit.
        assert!(q.push([single, Queued::Run(run(5, 5, 8))]));
        let mut seen = Vec::new();
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            q.run(3, |d| seen.push(d.seq().expect("reliable")))
        }));
        assert!(panicked.is_err());
        assert_eq!(seen, vec![4]);
        assert_eq!(q.queued(), 4, "messages 6 to 9 are still queued");
        // The deliverer still holds RUNNING: run again, as a re-submission would.
        assert_eq!(
            q.run(64, |d| seen.push(d.seq().expect("reliable"))),
            RunOutcome::Idle
        );
        assert_eq!(seen, vec![4, 6, 7, 8, 9]);
        assert_eq!(q.queued(), 0);
    }

    /// A lent message says what the delivery made of it says, run or single message,
    /// wherever the budget splits a run, its kept bytes included; and the credit adds up as
    /// for deliveries.
    #[test]
    fn lent_messages_say_what_their_deliveries_say_across_budgets() {
        type Seen = (String, Option<u64>, Vec<u8>, bool, bool);
        // What a handler can see of a message, a `Delivery` or a `DeliveryRef` alike.
        macro_rules! seen {
            ($m:expr) => {
                (
                    $m.from().to_owned(),
                    $m.seq(),
                    $m.payload().to_vec(),
                    $m.is_oob(),
                    $m.is_request(),
                )
            };
        }
        fn queue(tally: &Arc<Tally>) -> MemberQueue {
            let q = MemberQueue::new("a".into(), Box::new(tally.clone()));
            let single = Delivery::unnamed(Bytes::from_static(&[4; 4]), Some(4)).into();
            assert!(q.push([Queued::Run(run(3, 1, 7)), single]));
            assert!(!q.push([run(4, 5, 8)]));
            q
        }
        for budget in [1, 2, 3, 5, 64] {
            let (owned_tally, lent_tally) =
                (Arc::new(Tally::default()), Arc::new(Tally::default()));
            let (owned, lent) = (queue(&owned_tally), queue(&lent_tally));
            let mut want: Vec<Seen> = Vec::new();
            while owned.run(budget, |d| want.push(seen!(d))) == RunOutcome::Yield {}
            let mut got: Vec<Seen> = Vec::new();
            let lend = |m: DeliveryRef<'_>| {
                assert_eq!(m.payload_bytes(), m.payload(), "kept bytes");
                assert_eq!(
                    m.to_delivery().payload(),
                    m.payload(),
                    "a delivery of its own"
                );
                got.push(seen!(m));
            };
            let mut lending = Lending::new(None, lend);
            while lent.run_to(budget, &mut lending) == RunOutcome::Yield {}
            assert_eq!(got, want, "budget {budget}");
            assert_eq!(got.len(), 8);
            assert_eq!(
                *lent_tally.0.lock(),
                *owned_tally.0.lock(),
                "credit, budget {budget}"
            );
            assert_eq!((lent.queued(), lent.queued_bytes()), (0, 0));
        }
    }

    /// Runs, split by the budget wherever it falls, and single messages between them come
    /// out in the order they were queued, each payload where it lies in its run's bytes,
    /// and the credit adds up per epoch.
    #[test]
    fn runs_and_messages_are_delivered_in_order_across_budgets() {
        for budget in [1, 2, 3, 5, 64] {
            let tally = Arc::new(Tally::default());
            let q = MemberQueue::new("a".into(), Box::new(tally.clone()));
            let single = Delivery::unnamed(Bytes::from_static(&[4; 4]), Some(4)).into();
            assert!(q.push([Queued::Run(run(3, 1, 7)), single]));
            assert!(!q.push([run(4, 5, 8)]));
            assert_eq!(q.queued(), 8);
            assert_eq!(q.queued_bytes(), (1 + 2 + 3) + 4 + (1 + 2 + 3 + 4));
            let mut seen = Vec::new();
            let mut runs = 0;
            loop {
                runs += 1;
                let outcome = q.run(budget, |d| {
                    assert_eq!(d.from(), "a");
                    let seq = d.seq().expect("reliable");
                    assert!(d.payload().iter().all(|&b| u64::from(b) == seq));
                    seen.push((seq, d.payload().len(), d.epoch()));
                });
                if outcome == RunOutcome::Idle {
                    break;
                }
            }
            let want = vec![
                (1, 1, 7),
                (2, 2, 7),
                (3, 3, 7),
                (4, 4, 0),
                (5, 1, 8),
                (6, 2, 8),
                (7, 3, 8),
                (8, 4, 8),
            ];
            assert_eq!(seen, want, "budget {budget}");
            assert_eq!(runs, 8usize.div_ceil(budget) + usize::from(8 % budget == 0));
            assert_eq!((q.queued(), q.queued_bytes(), q.delivered()), (0, 0, 8));
            let mut per_epoch = std::collections::BTreeMap::new();
            for (epoch, cost) in tally.0.lock().iter() {
                *per_epoch.entry(*epoch).or_insert(0) += cost;
            }
            let cost = crate::flow::cost;
            let want = [
                (0, cost(4)),
                (7, cost(1) + cost(2) + cost(3)),
                (8, cost(1) + cost(2) + cost(3) + cost(4)),
            ];
            assert_eq!(per_epoch.into_iter().collect::<Vec<_>>(), want);
        }
    }

    /// The deliveries of a run handed over in one turn share its bytes, and each still
    /// gives its own payload, name and sequence number however it is read or taken; the
    /// run's first and last, and a run of one, alike.
    #[test]
    fn deliveries_of_a_run_read_and_take_their_own_bytes() {
        let q = MemberQueue::new("a".into(), Box::new(Arc::new(Tally::default())));
        assert!(q.push([Queued::Run(run(3, 10, 0)), Queued::Run(run(1, 13, 0))]));
        let mut got = Vec::new();
        assert_eq!(q.run(64, |d| got.push(d)), RunOutcome::Idle);
        assert_eq!(got.len(), 4);
        for (i, d) in got.into_iter().enumerate() {
            let seq = 10 + i as u64;
            let want = if i < 3 {
                vec![seq as u8; i + 1]
            } else {
                vec![13]
            };
            assert_eq!(
                (d.from(), d.seq(), d.payload()),
                ("a", Some(seq), &want[..])
            );
            assert_eq!(d.payload_bytes(), want);
            let shown = format!("{d:?}");
            assert!(shown.contains(&format!("len: {}", want.len())), "{shown}");
            assert_eq!(d.clone().into_payload(), want);
            assert_eq!(d.into_parts(), ("a".to_owned(), Bytes::from(want)));
        }
    }

    /// Two runs cut from one read buffer: the buffer goes back for the next reads once the
    /// last view of it goes — the later run delivered after the IO thread moved on, or a
    /// delivery kept past its run — and not while anything still reads it.
    #[test]
    fn a_read_buffer_goes_back_when_its_last_view_is_delivered() {
        const CHUNK: usize = 64 * 1024;
        let frames = |n: usize| {
            let mut buf = Vec::new();
            for seq in 1..=n as u64 {
                wire::encode_data(&mut buf, wire::FLAG_RELIABLE, Some(seq), &[seq as u8; 3]);
            }
            buf
        };
        for keep_one in [false, true] {
            let home = Arc::new(ReadBuffers::new(CHUNK));
            let mut rbuf = bytes::BytesMut::with_capacity(CHUNK);
            rbuf.extend_from_slice(&frames(2));
            rbuf.extend_from_slice(&frames(3));
            rbuf.extend_from_slice(b"partial");
            let len = frames(2).len();
            let first = Run::new(rbuf.split_to(len).freeze(), 0, 2, 6).returning_to(&home);
            let len = frames(3).len();
            let second = Run::new(rbuf.split_to(len).freeze(), 0, 3, 9).returning_to(&home);
            let q = MemberQueue::new("a".into(), Box::new(Arc::new(Tally::default())));
            assert!(q.push([Queued::Run(first)]));
            let mut kept = None;
            let outcome = q.run(64, |d| kept = kept.take().or(Some(d)).filter(|_| keep_one));
            assert_eq!(outcome, RunOutcome::Idle);
            assert_eq!(home.kept(), 0, "the IO thread still reads into it");
            // The IO thread moves on to another buffer.
            drop(rbuf);
            assert_eq!(home.kept(), 0, "the second run is not delivered yet");
            assert!(q.push([Queued::Run(second)]));
            assert_eq!(q.run(64, |_| {}), RunOutcome::Idle);
            if keep_one {
                assert_eq!(home.kept(), 0, "a delivery kept by the handler reads it");
                drop(kept);
                assert_eq!(home.kept(), 1, "given back by the kept delivery's drop");
            } else {
                assert_eq!(home.kept(), 1, "given back by the last run's drop");
                let buf = home.take().expect("kept");
                assert!(buf.is_empty() && buf.capacity() >= CHUNK);
            }
        }
    }
}
