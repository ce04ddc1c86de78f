//! Invariant 1, one deliverer per sender: loom models of `cohort::internals::deliver::MemberQueue` and
//! its RUNNING | NOTIFIED state word, with the code that ships.
//!
//! The pool is modelled by its contract: whichever thread's `push` returns `true` owns the
//! queue and must `run` it until `Idle` (re-running it after every `Yield`). Checked:
//!
//! - every message is delivered exactly once, in order per producer;
//! - never two deliverers at once: the handler appends to a `loom::cell::UnsafeCell` with no
//!   lock, so loom reports any two handler calls not ordered by happens-before (concurrent,
//!   or racing on memory), and a counter of threads inside the handler never exceeds 1;
//! - nothing stranded: at the end the queue is empty, its state is not `RUNNING`, every
//!   message was delivered, and the credit reported adds up to `cost(len)` per message.
//!
//! The `journalling_*` models run the same shapes with a sink whose `tracks_progress()` is
//! true (a journalling receiver's `PeerCreditSink` feeds `Progress` with it): messages
//! carry distinct sequence numbers, one of them is unreliable, and the sink checks every
//! report as it is made, against what the handler has run:
//!
//! - `handled` names only messages the handler has run, and each sequence number once;
//! - `consumed` never covers a reliable message before `handled` named it (the journal
//!   records the credit with the count: credit for a message it does not count would be
//!   given twice after a restart), nor an unreliable one before the handler ran it;
//! - `handled_unreliable` never counts bytes whose credit `consumed` has not reported;
//!
//! and at the end every sequence number was reported, in each producer's order, and the
//! unreliable bytes add up — across budgets that end runs with `Yield` and producers that
//! find the state `RUNNING` (and set `NOTIFIED`) or idle.
#![cfg(loom)]

use bytes::{Bytes, BytesMut};
use cohort::internals::deliver::{CreditSink, Lending, MemberQueue, ReadBuffers, Run, RunOutcome};
use cohort::internals::flow::cost;
use cohort::internals::wire;
use cohort::{Delivery, DeliveryRef};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

/// Messages each producer sends.
const PER_PRODUCER: u8 = 2;

/// Whether the receiver journals (its sink tracks progress).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Plain,
    Journalling,
}

/// The sequence number of message `i` of producer `p`. Plain: `i + 1` (the models check
/// the order per producer). Journalling: distinct numbers (producer 0: 1, 2; producer 1: 11),
/// and producer 1's second message is unreliable.
fn seq(mode: Mode, p: u8, i: u8) -> Option<u64> {
    match mode {
        Mode::Plain => Some(u64::from(i) + 1),
        Mode::Journalling => (p == 0 || i == 0).then(|| u64::from(p) * 10 + u64::from(i) + 1),
    }
}

/// The window cost of message `i` of producer `p`.
fn cost_of(p: u8, i: u8) -> u64 {
    cost(payload_len(p, i))
}

/// The credit sink: adds up what the deliverer reports; journalling, checks each report.
#[derive(Default)]
struct Credit {
    consumed: AtomicU64,
    idles: AtomicUsize,
    /// What a journalling sink was told, touched by the deliverer only (like the handler's
    /// log, and checked the same way).
    journal: UnsafeCell<Journal>,
}

// SAFETY: `journal` is only touched inside the sink's calls, which the member queue makes
// from its one deliverer at a time; loom's `UnsafeCell` checks it.
unsafe impl Sync for Credit {}

/// What `handled`, `consumed` and `handled_unreliable` reported so far.
#[derive(Debug, Default)]
struct Journal {
    /// Sequence numbers reported handled, in order.
    handled: Vec<u64>,
    /// Window bytes of the messages reported handled.
    handled_cost: u64,
    consumed: u64,
    unreliable: u64,
}

impl Journal {
    fn handled(&mut self, seqs: &[u64], rec: &Record) {
        let ran = rec.ran();
        for &s in seqs {
            assert!(
                !self.handled.contains(&s),
                "seq {s} reported handled twice ({:?})",
                self.handled
            );
            let &(p, i) = ran
                .iter()
                .find(|&&(p, i)| seq(rec.mode, p, i) == Some(s))
                .unwrap_or_else(|| panic!("seq {s} reported handled before the handler ran it"));
            self.handled.push(s);
            self.handled_cost += cost_of(p, i);
        }
    }

    fn consumed(&mut self, cost: u64, rec: &Record) {
        self.consumed += cost;
        let unreliable_ran: u64 = rec
            .ran()
            .iter()
            .filter(|&&(p, i)| seq(rec.mode, p, i).is_none())
            .map(|&(p, i)| cost_of(p, i))
            .sum();
        assert!(
            self.consumed <= self.handled_cost + unreliable_ran,
            "credit reported before the messages were reported handled: consumed {} > \
             handled {} + unreliable run {unreliable_ran}",
            self.consumed,
            self.handled_cost
        );
    }

    fn handled_unreliable(&mut self, cost: u64) {
        self.unreliable += cost;
        assert!(
            self.unreliable <= self.consumed.saturating_sub(self.handled_cost),
            "unreliable bytes reported before their credit: {self:?}"
        );
    }
}

struct Sink {
    credit: Arc<Credit>,
    rec: Arc<Record>,
}

impl Sink {
    fn journal(&self, f: impl FnOnce(&mut Journal)) {
        self.credit.journal.with_mut(|j| f(unsafe { &mut *j }));
    }
}

impl CreditSink for Sink {
    fn consumed(&self, _epoch: u32, cost: u64) {
        self.credit.consumed.fetch_add(cost, Ordering::Relaxed);
        if self.rec.mode == Mode::Journalling {
            self.journal(|j| j.consumed(cost, &self.rec));
        }
    }
    fn idle(&self) {
        self.credit.idles.fetch_add(1, Ordering::Relaxed);
    }
    fn tracks_progress(&self) -> bool {
        self.rec.mode == Mode::Journalling
    }
    fn handled(&self, _epoch: u32, seqs: &[u64]) {
        assert_eq!(self.rec.mode, Mode::Journalling, "progress not tracked");
        self.journal(|j| j.handled(seqs, &self.rec));
    }
    fn handled_unreliable(&self, _epoch: u32, cost: u64) {
        assert_eq!(self.rec.mode, Mode::Journalling, "progress not tracked");
        self.journal(|j| j.handled_unreliable(cost));
    }
}

/// What the handler saw. `log` is deliberately unsynchronized: loom flags any two handler
/// calls that are not ordered by happens-before.
struct Record {
    mode: Mode,
    log: UnsafeCell<Vec<(u8, u8)>>,
    in_handler: AtomicUsize,
    max_in_handler: AtomicUsize,
}

// SAFETY: `log` is only touched inside the handler (and the sink, called by the same
// deliverer), which the member queue runs on one thread at a time; that is exactly what
// the model checks (loom's `UnsafeCell` panics on any access not ordered by
// happens-before).
unsafe impl Sync for Record {}

impl Record {
    fn new(mode: Mode) -> Record {
        Record {
            mode,
            log: UnsafeCell::new(Vec::new()),
            in_handler: AtomicUsize::new(0),
            max_in_handler: AtomicUsize::new(0),
        }
    }

    /// The messages the handler has run, in order.
    fn ran(&self) -> Vec<(u8, u8)> {
        self.log.with(|log| unsafe { (*log).clone() })
    }
}

type Handler = Box<dyn Fn(Delivery) + Send + Sync>;

fn handler(rec: Arc<Record>) -> Handler {
    Box::new(move |d: Delivery| handle(&rec, d.payload(), d.seq()))
}

/// What the handlers do with a message: `payload`, with sequence number `seq`.
fn handle(rec: &Record, payload: &[u8], got: Option<u64>) {
    // Relaxed on purpose: these counters must not create happens-before edges of their
    // own, or they would hide a missing Acquire/Release in the queue from the
    // `UnsafeCell` check. (A read-modify-write still sees the latest value, so an
    // overlap is counted whatever the ordering.)
    let now = rec.in_handler.fetch_add(1, Ordering::Relaxed) + 1;
    rec.max_in_handler.fetch_max(now, Ordering::Relaxed);
    let entry = (payload[0], payload[1]);
    assert_eq!(got, seq(rec.mode, entry.0, entry.1));
    rec.log.with_mut(|log| unsafe { (*log).push(entry) });
    rec.in_handler.fetch_sub(1, Ordering::Relaxed);
}

/// Message `i` of producer `p`: `[p, i]` padded to a length that differs per message, so
/// the credit check sees distinct costs.
fn payload_len(p: u8, i: u8) -> usize {
    2 + usize::from(p) * 3 + usize::from(i)
}

fn message(mode: Mode, p: u8, i: u8) -> Delivery {
    let mut v = vec![p, i];
    v.resize(payload_len(p, i), 0xAB);
    Delivery::new(
        std::sync::Arc::from(format!("p{p}")),
        Bytes::from(v),
        seq(mode, p, i),
        false,
    )
}

fn new_queue(mode: Mode) -> (Arc<MemberQueue>, Arc<Credit>, Arc<Record>) {
    let credit = Arc::new(Credit::default());
    let rec = Arc::new(Record::new(mode));
    let sink = Sink {
        credit: credit.clone(),
        rec: rec.clone(),
    };
    let q = MemberQueue::new(std::sync::Arc::from("sender"), Box::new(sink));
    (Arc::new(q), credit, rec)
}

/// The owner's duty: run the queue until it goes idle. Returns the number of `run` calls.
fn drive(q: &MemberQueue, budget: usize, h: &(dyn Fn(Delivery) + Send + Sync)) -> usize {
    let mut runs = 0;
    loop {
        runs += 1;
        match q.run(budget, h) {
            RunOutcome::Idle => return runs,
            RunOutcome::Yield => continue,
        }
    }
}

/// The end-of-model checks, after every thread has been joined.
fn check_quiescent(q: &MemberQueue, rec: &Record, credit: &Credit, producers: u8) {
    let log = rec.log.with(|log| unsafe { (*log).clone() });
    for p in 0..producers {
        let mine: Vec<u8> = log.iter().filter(|e| e.0 == p).map(|e| e.1).collect();
        let want: Vec<u8> = (0..PER_PRODUCER).collect();
        assert_eq!(mine, want, "producer {p}: delivered {mine:?}; log {log:?}");
    }
    let total = usize::from(producers) * usize::from(PER_PRODUCER);
    assert_eq!(log.len(), total, "log {log:?}");
    assert_eq!(rec.max_in_handler.load(Ordering::Acquire), 1);
    assert_eq!(q.queued(), 0, "stranded messages");
    assert_eq!(q.queued_bytes(), 0);
    assert!(!q.is_running(), "state left RUNNING with nobody to run it");
    assert_eq!(q.delivered(), total as u64);
    assert_eq!(q.panics(), 0);
    let bytes: usize = (0..producers)
        .flat_map(|p| (0..PER_PRODUCER).map(move |i| payload_len(p, i)))
        .sum();
    assert_eq!(q.delivered_bytes(), bytes as u64);
    let want_cost: u64 = (0..producers)
        .flat_map(|p| (0..PER_PRODUCER).map(move |i| cost(payload_len(p, i))))
        .sum();
    assert_eq!(credit.consumed.load(Ordering::Acquire), want_cost);
    assert!(credit.idles.load(Ordering::Acquire) >= 1, "never went idle");
    if rec.mode == Mode::Journalling {
        let j = credit
            .journal
            .with_mut(|j| unsafe { std::mem::take(&mut *j) });
        for p in 0..producers {
            let mine: Vec<u64> = (0..PER_PRODUCER)
                .filter_map(|i| seq(rec.mode, p, i))
                .collect();
            let reported: Vec<u64> = j
                .handled
                .iter()
                .copied()
                .filter(|s| mine.contains(s))
                .collect();
            assert_eq!(
                reported, mine,
                "producer {p}: seqs reported handled; all: {j:?}"
            );
        }
        let reliable: usize = (0..producers)
            .flat_map(|p| (0..PER_PRODUCER).filter_map(move |i| seq(rec.mode, p, i)))
            .count();
        assert_eq!(
            j.handled.len(),
            reliable,
            "seqs lost or reported twice: {j:?}"
        );
        let unreliable: u64 = (0..producers)
            .flat_map(|p| (0..PER_PRODUCER).map(move |i| (p, i)))
            .filter(|&(p, i)| seq(rec.mode, p, i).is_none())
            .map(|(p, i)| cost_of(p, i))
            .sum();
        assert_eq!(j.unreliable, unreliable, "unreliable bytes: {j:?}");
        assert_eq!(j.consumed, want_cost);
    }
}

/// Two producers, each pushing its messages one at a time and running the queue itself
/// whenever its `push` says so (the deliverer is whichever producer won the idle → RUNNING
/// transition).
fn producers_deliver_themselves(budget: usize, mode: Mode) -> Arc<MemberQueue> {
    let (q, credit, rec) = new_queue(mode);
    let threads: Vec<_> = (0..2u8)
        .map(|p| {
            let q = q.clone();
            let h = handler(rec.clone());
            thread::spawn(move || {
                for i in 0..PER_PRODUCER {
                    if q.push([message(mode, p, i)]) {
                        drive(&q, budget, &*h);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    check_quiescent(&q, &rec, &credit, 2);
    q
}

/// Budget 1: every delivery ends its run with `Yield`, and the owner runs the queue again
/// (the re-submission path).
#[test]
fn producers_deliver_themselves_budget_1() {
    loom_tests::model("member_queue/producers_deliver_themselves_budget_1", || {
        producers_deliver_themselves(1, Mode::Plain);
    });
}

/// Budget larger than anything queued: a deliverer goes idle straight after its last
/// handler call, so the only thing ordering that call before the next deliverer's is the
/// state word's Release (idle transition) / Acquire (next producer's idle → RUNNING).
/// With budget 1 the extra empty round's queue lock would hide a missing ordering.
#[test]
fn producers_deliver_themselves_budget_8() {
    loom_tests::model("member_queue/producers_deliver_themselves_budget_8", || {
        producers_deliver_themselves(8, Mode::Plain);
    });
}

/// Each producer pushes its messages as one batch; budget 3, so a deliverer that finds
/// the other producer's batch too drains it only partly, yields, and finishes it in the
/// next run.
#[test]
fn producers_push_batches_budget_3() {
    loom_tests::model("member_queue/producers_push_batches_budget_3", || {
        let (q, credit, rec) = new_queue(Mode::Plain);
        let threads: Vec<_> = (0..2u8)
            .map(|p| {
                let q = q.clone();
                let h = handler(rec.clone());
                thread::spawn(move || {
                    if q.push((0..PER_PRODUCER).map(|i| message(Mode::Plain, p, i))) {
                        drive(&q, 3, &*h);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        check_quiescent(&q, &rec, &credit, 2);
    });
}

/// Producer `p`'s messages as one [`Run`], as the IO thread queues the regular messages of
/// one read: their data frames, back to back in one buffer.
fn run_of(mode: Mode, p: u8) -> Run {
    let (buf, bytes) = frames_of(mode, p);
    Run::new(Bytes::from(buf), 0, usize::from(PER_PRODUCER), bytes)
}

/// Producer `p`'s messages as data frames back to back, and their payload bytes.
fn frames_of(mode: Mode, p: u8) -> (Vec<u8>, u64) {
    let mut buf = Vec::new();
    let mut bytes = 0;
    for i in 0..PER_PRODUCER {
        let seq = seq(mode, p, i);
        let flags = if seq.is_some() {
            wire::FLAG_RELIABLE
        } else {
            0
        };
        wire::encode_data(&mut buf, flags, seq, message(mode, p, i).payload());
        bytes += payload_len(p, i) as u64;
    }
    (buf, bytes)
}

/// How the deliverer hands a run's messages over.
#[derive(Clone, Copy)]
enum Hand {
    /// As deliveries of their own (`on_message`, the inbox).
    Owned,
    /// Lent where they lie in the run's bytes (`Lending`, as `on_message_ref` gets them).
    Lent,
}

/// Each producer pushes its messages as one run (the IO thread's item for the messages of
/// one read); the deliverer hands them over one by one, as `hand` says. Budget 1 splits
/// every run, leaving its rest at the front of the queue for the next run of the deliverer;
/// budget 3 splits the second producer's run when the first's is in the same drain.
fn producers_push_runs(budget: usize, mode: Mode, hand: Hand) {
    let (q, credit, rec) = new_queue(mode);
    let threads: Vec<_> = (0..2u8)
        .map(|p| {
            let (q, rec) = (q.clone(), rec.clone());
            thread::spawn(move || {
                if !q.push([run_of(mode, p)]) {
                    return;
                }
                match hand {
                    Hand::Owned => {
                        drive(&q, budget, &*handler(rec));
                    }
                    Hand::Lent => {
                        let mut lending = Lending::new(None, |m: DeliveryRef<'_>| {
                            handle(&rec, m.payload(), m.seq())
                        });
                        while q.run_to(budget, &mut lending) == RunOutcome::Yield {}
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    check_quiescent(&q, &rec, &credit, 2);
}

/// A read buffer's way back: the IO thread cuts two runs off one read buffer (each giving
/// the buffer back to `ReadBuffers` when it drops the last view of it), pushes them, moves
/// on to another buffer and reads into whatever `make_room` gives it, while deliverers
/// (one per push that found the queue idle, as the pool runs it) deliver the runs with a
/// budget of one. Checked, besides the queue's own invariants: the handler never sees a
/// payload the IO thread overwrote (a buffer is reused only once nothing reads it), and
/// the buffer ends up exactly once in one place — reused by the IO thread, kept for the
/// next read, or freed by whichever drop came last while the IO thread still held it.
/// (The test of uniqueness is `bytes`' reference count, on std atomics that loom does not
/// explore: the model covers the interleavings of the deliverers, `ReadBuffers`' lock and
/// the IO thread, not that count's ordering.)
#[test]
fn a_read_buffer_is_reused_only_once_its_runs_are_delivered() {
    loom_tests::model("member_queue/read_buffer_reuse", || {
        read_buffer_reuse(1, false);
    });
}

/// The same with a budget that hands both runs over in one turn when both are queued, so
/// a run's deliveries share its bytes through one origin (and the second run gets one of
/// its own), and a handler that keeps every delivery for the application's thread, which
/// drops them while the deliverers and the IO thread go on: the last view dropped,
/// wherever, gives the buffer back, and no delivery reads bytes the IO thread reused.
/// (The handler's lock on the kept deliveries orders the handlers' calls, so the
/// one-deliverer check is the budget-1 model's.)
#[test]
fn a_read_buffer_kept_by_deliveries_goes_back_from_the_thread_that_drops_them() {
    loom_tests::model("member_queue/read_buffer_kept_by_deliveries", || {
        read_buffer_reuse(2 * usize::from(PER_PRODUCER), true);
    });
}

fn read_buffer_reuse(budget: usize, keep: bool) {
    const CHUNK: usize = 1024;
    let (q, credit, rec) = new_queue(Mode::Plain);
    let home = std::sync::Arc::new(ReadBuffers::new(CHUNK));
    let mut rbuf = BytesMut::with_capacity(CHUNK);
    let base = rbuf.as_ptr();
    // Deliveries the handler kept, for the application's thread.
    let kept: Arc<Mutex<Vec<Delivery>>> = Arc::new(Mutex::new(Vec::new()));
    let mut deliverers = Vec::new();
    for p in 0..2u8 {
        let (frames, bytes) = frames_of(Mode::Plain, p);
        rbuf.extend_from_slice(&frames);
        let cut = rbuf.split_to(frames.len()).freeze();
        let run = Run::new(cut, 0, usize::from(PER_PRODUCER), bytes).returning_to(&home);
        if q.push([run]) {
            let (q, rec, kept) = (q.clone(), rec.clone(), kept.clone());
            deliverers.push(thread::spawn(move || {
                let h = handler(rec);
                drive(&q, budget, &move |d: Delivery| {
                    if keep {
                        kept.lock().unwrap().push(d.clone());
                    }
                    h(d);
                });
            }));
        }
    }
    // The IO thread moves on to another buffer: from here on the last view of the first is
    // a run's or a delivery's.
    drop(rbuf);
    // The application drops what it kept so far, reading each first.
    let application = keep.then(|| {
        let kept = kept.clone();
        thread::spawn(move || {
            let taken = std::mem::take(&mut *kept.lock().unwrap());
            taken.iter().for_each(check_kept);
        })
    });
    // The next read's room, and the read itself.
    let mut next = BytesMut::new();
    home.make_room(&mut next);
    let reused = next.as_ptr() == base;
    let room = next.capacity() - next.len();
    next.extend_from_slice(&vec![0xFF; room]);
    for t in deliverers.into_iter().chain(application) {
        t.join().unwrap();
    }
    let rest = std::mem::take(&mut *kept.lock().unwrap());
    rest.iter().for_each(check_kept);
    drop(rest);
    check_quiescent(&q, &rec, &credit, 2);
    let kept = home.kept();
    assert!(kept <= 1);
    assert!(!(reused && kept == 1), "one buffer in two places");
    if keep && !reused {
        assert_eq!(kept, 1, "the last delivery dropped gave the buffer back");
    }
}

/// A kept delivery still reads what was sent: its bytes were not reused under it.
fn check_kept(d: &Delivery) {
    let (p, i) = (d.payload()[0], d.payload()[1]);
    assert!(
        p < 2 && i < PER_PRODUCER,
        "a kept delivery reads reused bytes: {d:?}"
    );
}

#[test]
fn producers_push_runs_budget_1() {
    loom_tests::model("member_queue/producers_push_runs_budget_1", || {
        producers_push_runs(1, Mode::Plain, Hand::Owned);
    });
}

#[test]
fn producers_push_runs_budget_3() {
    loom_tests::model("member_queue/producers_push_runs_budget_3", || {
        producers_push_runs(3, Mode::Plain, Hand::Owned);
    });
}

/// `producers_push_runs` with the messages lent to the handler where they lie in their
/// run's bytes, budget 1: every run split, its rest back at the front while the other
/// producer pushes.
#[test]
fn producers_push_runs_lent_budget_1() {
    loom_tests::model("member_queue/producers_push_runs_lent_budget_1", || {
        producers_push_runs(1, Mode::Plain, Hand::Lent);
    });
}

/// The same with a journalling sink: lent messages' sequence numbers reported handled
/// before their credit, each once, across split runs.
#[test]
fn journalling_producers_push_runs_lent_budget_1() {
    loom_tests::model(
        "member_queue/journalling_producers_push_runs_lent_budget_1",
        || producers_push_runs(1, Mode::Journalling, Hand::Lent),
    );
}

/// Runs with a journalling sink: sequence numbers of a run's messages, one unreliable,
/// reported handled in order across split runs.
#[test]
fn journalling_producers_push_runs_budget_1() {
    loom_tests::model(
        "member_queue/journalling_producers_push_runs_budget_1",
        || {
            producers_push_runs(1, Mode::Journalling, Hand::Owned);
        },
    );
}

/// The pool's run queue, reduced to one sender: how many tasks for it are queued.
struct Sched {
    state: Mutex<(usize, bool)>, // (queued tasks, producers done)
    cv: Condvar,
}

impl Sched {
    fn submit(&self) {
        let mut g = self.state.lock().unwrap();
        // At most one task per sender is ever scheduled.
        assert_eq!(g.0, 0, "a second task scheduled for one sender");
        g.0 += 1;
        drop(g);
        self.cv.notify_one();
    }
}

/// Two producers (the main thread and one more) and a dedicated deliverer thread, as in the
/// pool: a producer whose `push` returns `true` submits a task; the deliverer runs it with
/// budget 1 and re-submits it to the back of the run queue on `Yield`.
fn dedicated_deliverer(mode: Mode) {
    let (q, credit, rec) = new_queue(mode);
    let sched = Arc::new(Sched {
        state: Mutex::new((0, false)),
        cv: Condvar::new(),
    });

    let deliverer = {
        let q = q.clone();
        let sched = sched.clone();
        let h = handler(rec.clone());
        thread::spawn(move || loop {
            {
                let mut g = sched.state.lock().unwrap();
                while g.0 == 0 && !g.1 {
                    g = sched.cv.wait(g).unwrap();
                }
                if g.0 == 0 {
                    return; // producers done, nothing scheduled
                }
                g.0 -= 1;
            }
            if q.run(1, &*h) == RunOutcome::Yield {
                sched.submit();
            }
        })
    };
    let produce = move |p: u8, q: &MemberQueue, sched: &Sched| {
        for i in 0..PER_PRODUCER {
            if q.push([message(mode, p, i)]) {
                sched.submit();
            }
        }
    };
    let other = {
        let q = q.clone();
        let sched = sched.clone();
        thread::spawn(move || produce(1, &q, &sched))
    };
    produce(0, &q, &sched);
    other.join().unwrap();
    sched.state.lock().unwrap().1 = true;
    sched.cv.notify_all();
    deliverer.join().unwrap();
    check_quiescent(&q, &rec, &credit, 2);
}

#[test]
fn dedicated_deliverer_budget_1() {
    loom_tests::model("member_queue/dedicated_deliverer_budget_1", || {
        dedicated_deliverer(Mode::Plain);
    });
}

/// `MemberQueue::max_concurrent()` (what `stats()` reports as the most concurrent
/// deliverers for one sender, and what `tests/delivery.rs` and the cluster example assert
/// is 1) must stay 1 under the same protocol.
///
/// This model found that `run` used to decrement its `active` counter only *after* the
/// `RUNNING → idle` compare-exchange, so a producer whose `push` won the next idle → RUNNING
/// transition could enter `run` and count 2 while the previous owner was still between that
/// CAS and its decrement. `run` now leaves the count before giving up `RUNNING`.
#[test]
fn max_concurrent_counts_one_deliverer() {
    for budget in [1, 8] {
        loom_tests::model(
            &format!("member_queue/max_concurrent_counts_one_deliverer_budget_{budget}"),
            move || {
                let q = producers_deliver_themselves(budget, Mode::Plain);
                assert_eq!(
                    q.max_concurrent(),
                    1,
                    "two deliverers counted in run at once"
                );
            },
        );
    }
}

/// Journalling, budget 1: every run reports one message and yields; producers find the
/// state `RUNNING` (and set `NOTIFIED`) or idle.
#[test]
fn journalling_producers_deliver_themselves_budget_1() {
    loom_tests::model(
        "member_queue/journalling_producers_deliver_themselves_budget_1",
        || {
            producers_deliver_themselves(1, Mode::Journalling);
        },
    );
}

/// Journalling, budget 8: a run reports everything it found in one segment, then goes
/// idle, or goes round again when a producer notified it.
#[test]
fn journalling_producers_deliver_themselves_budget_8() {
    loom_tests::model(
        "member_queue/journalling_producers_deliver_themselves_budget_8",
        || {
            producers_deliver_themselves(8, Mode::Journalling);
        },
    );
}

/// Journalling, with the pool's shape: a dedicated deliverer runs the queue with budget 1
/// and re-submits it on `Yield`, while two producers push.
#[test]
fn journalling_dedicated_deliverer_budget_1() {
    loom_tests::model(
        "member_queue/journalling_dedicated_deliverer_budget_1",
        || {
            dedicated_deliverer(Mode::Journalling);
        },
    );
}
