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
#![cfg(loom)]

use bytes::Bytes;
use cohort::internals::deliver::{CreditSink, MemberQueue, RunOutcome};
use cohort::internals::flow::cost;
use cohort::Delivery;
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

/// Messages each producer sends.
const PER_PRODUCER: u8 = 2;

/// The credit sink: adds up what the deliverer reports.
#[derive(Default)]
struct Credit {
    consumed: AtomicU64,
    idles: AtomicUsize,
}

struct Sink(Arc<Credit>);

impl CreditSink for Sink {
    fn consumed(&self, _epoch: u32, cost: u64) {
        self.0.consumed.fetch_add(cost, Ordering::Relaxed);
    }
    fn idle(&self) {
        self.0.idles.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the handler saw. `log` is deliberately unsynchronized: loom flags any two handler
/// calls that are not ordered by happens-before.
struct Record {
    log: UnsafeCell<Vec<(u8, u8)>>,
    in_handler: AtomicUsize,
    max_in_handler: AtomicUsize,
}

// SAFETY: `log` is only touched inside the handler, which the member queue runs on one
// thread at a time; that is exactly what the model checks (loom's `UnsafeCell` panics on
// any access not ordered by happens-before).
unsafe impl Sync for Record {}

impl Record {
    fn new() -> Record {
        Record {
            log: UnsafeCell::new(Vec::new()),
            in_handler: AtomicUsize::new(0),
            max_in_handler: AtomicUsize::new(0),
        }
    }
}

type Handler = Box<dyn Fn(Delivery) + Send + Sync>;

fn handler(rec: Arc<Record>) -> Handler {
    Box::new(move |d: Delivery| {
        // Relaxed on purpose: these counters must not create happens-before edges of their
        // own, or they would hide a missing Acquire/Release in the queue from the
        // `UnsafeCell` check. (A read-modify-write still sees the latest value, so an
        // overlap is counted whatever the ordering.)
        let now = rec.in_handler.fetch_add(1, Ordering::Relaxed) + 1;
        rec.max_in_handler.fetch_max(now, Ordering::Relaxed);
        let p = d.payload();
        let entry = (p[0], p[1]);
        assert_eq!(d.seq(), Some(u64::from(entry.1)));
        rec.log.with_mut(|log| unsafe { (*log).push(entry) });
        rec.in_handler.fetch_sub(1, Ordering::Relaxed);
    })
}

/// Message `i` of producer `p`: `[p, i]` padded to a length that differs per message, so
/// the credit check sees distinct costs.
fn payload_len(p: u8, i: u8) -> usize {
    2 + usize::from(p) * 3 + usize::from(i)
}

fn message(p: u8, i: u8) -> Delivery {
    let mut v = vec![p, i];
    v.resize(payload_len(p, i), 0xAB);
    Delivery::new(
        std::sync::Arc::from(format!("p{p}")),
        Bytes::from(v),
        Some(u64::from(i)),
        false,
    )
}

fn new_queue() -> (Arc<MemberQueue>, Arc<Credit>) {
    let credit = Arc::new(Credit::default());
    let q = MemberQueue::new(
        std::sync::Arc::from("sender"),
        Box::new(Sink(credit.clone())),
    );
    (Arc::new(q), credit)
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
}

/// Two producers, each pushing its messages one at a time and running the queue itself
/// whenever its `push` says so (the deliverer is whichever producer won the idle → RUNNING
/// transition).
fn producers_deliver_themselves(budget: usize) -> Arc<MemberQueue> {
    let (q, credit) = new_queue();
    let rec = Arc::new(Record::new());
    let threads: Vec<_> = (0..2u8)
        .map(|p| {
            let q = q.clone();
            let h = handler(rec.clone());
            thread::spawn(move || {
                for i in 0..PER_PRODUCER {
                    if q.push([message(p, i)]) {
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
        producers_deliver_themselves(1);
    });
}

/// Budget larger than anything queued: a deliverer goes idle straight after its last
/// handler call, so the only thing ordering that call before the next deliverer's is the
/// state word's Release (idle transition) / Acquire (next producer's idle → RUNNING).
/// With budget 1 the extra empty round's queue lock would hide a missing ordering.
#[test]
fn producers_deliver_themselves_budget_8() {
    loom_tests::model("member_queue/producers_deliver_themselves_budget_8", || {
        producers_deliver_themselves(8);
    });
}

/// Each producer pushes its messages as one batch; budget 3, so a deliverer that finds
/// the other producer's batch too drains it only partly, yields, and finishes it in the
/// next run.
#[test]
fn producers_push_batches_budget_3() {
    loom_tests::model("member_queue/producers_push_batches_budget_3", || {
        let (q, credit) = new_queue();
        let rec = Arc::new(Record::new());
        let threads: Vec<_> = (0..2u8)
            .map(|p| {
                let q = q.clone();
                let h = handler(rec.clone());
                thread::spawn(move || {
                    if q.push((0..PER_PRODUCER).map(|i| message(p, i))) {
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
#[test]
fn dedicated_deliverer_budget_1() {
    loom_tests::model("member_queue/dedicated_deliverer_budget_1", || {
        let (q, credit) = new_queue();
        let rec = Arc::new(Record::new());
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
        let produce = |p: u8, q: &MemberQueue, sched: &Sched| {
            for i in 0..PER_PRODUCER {
                if q.push([message(p, i)]) {
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
                let q = producers_deliver_themselves(budget);
                assert_eq!(
                    q.max_concurrent(),
                    1,
                    "two deliverers counted in run at once"
                );
            },
        );
    }
}
