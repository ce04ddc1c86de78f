//! Pull-style receive racing shutdown: loom models of `cohort::Inbox` on a pool without
//! workers (`cohort::internals::deliver::{inbox, Pool, MemberQueue, Task}`), the code that
//! ships.
//!
//! The IO thread queues a sender's messages (`MemberQueue::push`) and, when the push says so,
//! submits the sender's task (`IoThread::submit_tasks` → `Pool::submit`; a refused task is
//! reported there, logged as dropped). `Node::shutdown` stops the pool (`Pool::stop`) once
//! the IO thread has stopped, or at its deadline if it has not. The application takes the
//! messages with `Inbox::recv` until it returns `Closed`; each `recv` runs the next task
//! (`Pool::run_next`), a batch of at most `budget` messages, and a task that yielded goes to
//! the back of the queue even while the pool stops.
//!
//! Checked in every execution: the inbox's `recv` returns (a consumer parked for ever is a
//! deadlock loom reports); it hands out each message at most once, in the sender's order;
//! every message is handed out before `Closed`, unless the IO thread's submit of its task
//! was refused (reported) — and then the message is still in the sender's queue, not lost
//! in between.
#![cfg(loom)]

use bytes::Bytes;
use cohort::internals::deliver::{self, CreditSink, MemberQueue, Task};
use cohort::{Delivery, RecvError};
use loom::thread;
use std::sync::Arc;

/// A receiver without flow control to report to.
struct NoCredit;

impl CreditSink for NoCredit {
    fn consumed(&self, _epoch: u32, _cost: u64) {}
    fn idle(&self) {}
}

fn message(i: u8) -> Delivery {
    Delivery::new("a".into(), Bytes::from(vec![i]), Some(u64::from(i)), false)
}

/// The IO thread pushes `count` messages one by one (submitting the task when a push says
/// so) while the node stops the pool; the inbox takes until `Closed`.
fn model(count: u8, budget: usize, stop_early: bool) {
    let (pool, inbox) = deliver::inbox(budget).expect("inbox");
    let queue = Arc::new(MemberQueue::new("a".into(), Box::new(NoCredit)));
    let io = {
        let (pool, queue) = (pool.clone(), queue.clone());
        thread::spawn(move || {
            let mut refused = 0;
            for i in 0..count {
                if queue.push([message(i)]) && !pool.submit(Task::Member(queue.clone())) {
                    refused += 1;
                }
            }
            refused
        })
    };
    let mut stopper = Some({
        let pool = pool.clone();
        thread::spawn(move || pool.stop())
    });
    if stop_early {
        stopper.take().unwrap().join().unwrap();
    }
    let mut got = Vec::new();
    loop {
        match inbox.recv() {
            Ok(d) => got.push(d.payload()[0]),
            Err(RecvError::Closed) => break,
            Err(e) => panic!("recv failed with {e:?}"),
        }
    }
    let refused = io.join().unwrap();
    if let Some(stopper) = stopper {
        stopper.join().unwrap();
    }
    let expected: Vec<u8> = (0..count).collect();
    assert_eq!(
        got[..],
        expected[..got.len()],
        "in order, each once: {got:?}"
    );
    let left = usize::from(count) - got.len();
    if refused == 0 {
        assert_eq!(
            left, 0,
            "messages stranded though every task was taken: {got:?}"
        );
    } else {
        assert_eq!(
            queue.queued(),
            left,
            "a message neither handed out nor left in its queue behind the refused task"
        );
    }
    assert!(pool.stats().queue_depth == 0, "a task left queued");
}

/// Two messages, a batch of one each (the task yields and goes back to the queue), racing
/// the pool's stop.
#[test]
fn two_messages_race_the_stop() {
    loom_tests::model("inbox/two_messages_race_the_stop", || {
        model(2, 1, false);
    });
}

/// Two messages in one batch while the pool has already stopped before the inbox looks: the
/// inbox still drains what was queued before the stop, and returns `Closed`.
#[test]
fn two_messages_after_an_early_stop() {
    loom_tests::model("inbox/two_messages_after_an_early_stop", || {
        model(2, 2, true);
    });
}
