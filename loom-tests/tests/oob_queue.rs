//! A sender's out-of-band queue, `cohort::internals::deliver::OobQueue`, with the code that ships:
//! at most `limit` drainers run it at once (its fair share of the pool), and nothing is
//! stranded: every message pushed is delivered exactly once, whichever drainer takes it.
//!
//! The pool is modelled by its contract: a producer schedules as many drainers as `push`
//! returns, each runs the queue until `Idle` (again after every `Yield`).
#![cfg(loom)]

use bytes::Bytes;
use cohort::internals::deliver::{CreditSink, OobQueue, RunOutcome};
use cohort::Delivery;
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

#[derive(Default)]
struct Credit {
    consumed: AtomicU64,
}

struct Sink(Arc<Credit>);

impl CreditSink for Sink {
    fn consumed(&self, _epoch: u32, cost: u64) {
        self.0.consumed.fetch_add(cost, Ordering::Relaxed);
    }
    fn idle(&self) {}
}

/// What the handler saw: a bit per message, and how many drainers were inside at once.
#[derive(Default)]
struct Seen {
    bits: AtomicU64,
    inside: AtomicUsize,
    most_inside: AtomicUsize,
}

fn message(i: u8) -> Delivery {
    Delivery::new(std::sync::Arc::from("p"), Bytes::from(vec![i]), None, true)
}

/// Runs one drainer until it leaves.
fn drain(q: &OobQueue, budget: usize, seen: &Arc<Seen>) {
    let s = seen.clone();
    let h = move |d: Delivery| {
        let now = s.inside.fetch_add(1, Ordering::Relaxed) + 1;
        s.most_inside.fetch_max(now, Ordering::Relaxed);
        let bit = 1u64 << d.payload()[0];
        let before = s.bits.fetch_or(bit, Ordering::Relaxed);
        assert_eq!(
            before & bit,
            0,
            "message {} delivered twice",
            d.payload()[0]
        );
        s.inside.fetch_sub(1, Ordering::Relaxed);
    };
    while q.run(budget, &h).outcome == RunOutcome::Yield {}
}

/// Two producers push two messages each, one at a time, and run every drainer their push
/// asks for themselves.
fn two_producers(limit: usize, budget: usize) {
    let credit = Arc::new(Credit::default());
    let q = Arc::new(OobQueue::new(
        std::sync::Arc::from("p"),
        limit,
        std::sync::Arc::new(Sink(credit.clone())),
    ));
    let seen = Arc::new(Seen::default());
    let threads: Vec<_> = (0..2u8)
        .map(|p| {
            let (q, seen) = (q.clone(), seen.clone());
            thread::spawn(move || {
                for i in 0..2u8 {
                    for _ in 0..q.push([message(p * 2 + i)]) {
                        drain(&q, budget, &seen);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        seen.bits.load(Ordering::Relaxed),
        0b1111,
        "a message stranded"
    );
    assert_eq!(q.queued(), 0);
    assert_eq!(q.delivered(), 4);
    assert!(q.max_concurrent() <= limit, "more drainers than the limit");
    assert!(seen.most_inside.load(Ordering::Relaxed) <= limit);
    assert_eq!(
        credit.consumed.load(Ordering::Relaxed),
        4 * cohort::internals::flow::cost(1)
    );
    // The drainer count went back to zero: the next push schedules one again.
    assert_eq!(q.push([message(9)]), 1, "drainer count leaked");
}

#[test]
fn limit_1_one_drainer_at_a_time_nothing_stranded() {
    loom_tests::model(
        "oob_queue/limit_1_one_drainer_at_a_time_nothing_stranded",
        || two_producers(1, 8),
    );
}

#[test]
fn limit_2_budget_1_yields_and_nothing_stranded() {
    loom_tests::model(
        "oob_queue/limit_2_budget_1_yields_and_nothing_stranded",
        || two_producers(2, 1),
    );
}
