//! The delivery pool's task queue: loom models of `cohort::internals::deliver::TaskQueue` (the queue,
//! its `spinning` / `queued` pair and its wake-up rule) and of `cohort::internals::deliver::Pool`
//! (which runs its workers on it), with the code that ships.
//!
//! A submitter skips the wake-up (`notify_one`) while at least as many workers spin as
//! there are tasks queued; a spinning worker watches `queued`, leaves the `spinning` count
//! and looks again under the queue's lock before it parks. The pool ends a spin on the wall
//! clock (`Builder::pool_spin`); the models hand `TaskQueue::next` a spin that lasts a
//! given number of rounds instead, so that loom explores a spin that ends before, while and
//! after a task arrives.
//!
//! A task left queued while every worker is parked is never run: the main thread, waiting
//! for every task to have run before it stops the queue, waits for ever, and loom reports
//! the deadlock (every thread blocked). Also checked: every task runs exactly once (a task
//! that yields is run again after its re-submission, once); no worker is left counted as
//! spinning.
#![cfg(loom)]

use bytes::Bytes;
use cohort::internals::deliver::{CreditSink, Handler, MemberQueue, Pool, Task, TaskQueue};
use cohort::Delivery;
use loom::sync::{Condvar, Mutex};
use loom::thread;
use std::sync::Arc;

/// A spin of `rounds` rounds (`None`: park at once), as `TaskQueue::next` asks for it.
fn spin(rounds: Option<usize>) -> impl FnMut() -> Option<Box<dyn FnMut() -> bool>> {
    move || {
        rounds.map(|n| {
            let mut left = n;
            Box::new(move || {
                let keep = left > 0;
                left = left.saturating_sub(1);
                keep
            }) as Box<dyn FnMut() -> bool>
        })
    }
}

/// Tasks run so far, by task; the main thread waits on it.
struct Ran {
    counts: Mutex<Vec<usize>>,
    cv: Condvar,
}

impl Ran {
    fn new(tasks: usize) -> Arc<Ran> {
        Arc::new(Ran {
            counts: Mutex::new(vec![0; tasks]),
            cv: Condvar::new(),
        })
    }

    fn ran(&self, task: usize) {
        self.counts.lock().unwrap()[task] += 1;
        self.cv.notify_all();
    }

    /// Waits until every task ran `want[task]` times (for ever if one was stranded: loom
    /// then reports the deadlock).
    fn wait_for(&self, want: &[usize]) {
        let mut g = self.counts.lock().unwrap();
        while g.iter().zip(want).any(|(got, want)| got < want) {
            g = self.cv.wait(g).unwrap();
        }
    }

    fn counts(&self) -> Vec<usize> {
        self.counts.lock().unwrap().clone()
    }
}

/// A task: its number, and how many more times it yields (re-submits itself) before it is
/// done.
#[derive(Debug)]
struct Job {
    id: usize,
    yields: usize,
}

/// A worker (the pool's `worker` loop, the task reduced to its bookkeeping): runs tasks
/// until the queue stops, re-submitting a task that yields.
fn worker(
    q: &Arc<TaskQueue<Job>>,
    ran: &Arc<Ran>,
    rounds: Option<usize>,
) -> thread::JoinHandle<()> {
    let (q, ran) = (q.clone(), ran.clone());
    thread::spawn(move || {
        while let Some(mut job) = q.next(spin(rounds)) {
            ran.ran(job.id);
            if job.yields > 0 {
                job.yields -= 1;
                q.resubmit(job);
            }
        }
    })
}

/// `workers` (each spinning that many rounds, or not at all) run `jobs`, submitted by the
/// main thread one by one; the main thread waits until each has run, then stops the queue.
fn run_queue(workers: &[Option<usize>], jobs: &[usize]) {
    let q = Arc::new(TaskQueue::new());
    let ran = Ran::new(jobs.len());
    let threads: Vec<_> = workers.iter().map(|&r| worker(&q, &ran, r)).collect();
    for (id, &yields) in jobs.iter().enumerate() {
        q.submit(Job { id, yields }).expect("the queue is open");
    }
    let want: Vec<usize> = jobs.iter().map(|&y| y + 1).collect();
    ran.wait_for(&want);
    q.stop();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        ran.counts(),
        want,
        "a task ran more often than it was queued"
    );
    assert!(q.is_empty());
    let left = format!("{q:?}");
    assert!(
        left.contains("spinning: 0"),
        "left counted as spinning: {left}"
    );
}

/// One worker spinning one round, two tasks: the second submit may find the worker
/// counted as spinning and skip the wake-up, whether the worker's spin then sees the task,
/// runs out, or has already run out.
#[test]
fn one_spinning_worker_two_tasks() {
    loom_tests::model("pool/one_spinning_worker_two_tasks", || {
        run_queue(&[Some(1)], &[0, 0]);
    });
}

/// Two workers, one spinning two rounds and one that parks at once, and a task that yields
/// once (its re-submission wakes a worker too): a skipped wake-up must not leave the task
/// to the worker that parked.
#[test]
fn a_spinner_and_a_parker_share_a_yielding_task() {
    loom_tests::model("pool/a_spinner_and_a_parker_share_a_yielding_task", || {
        run_queue(&[Some(2), None], &[1]);
    });
}

/// Two spinning workers, two tasks: each submit may count a spinner, and the spinners race
/// each other for the tasks (one may find its task taken and park).
#[test]
fn two_spinning_workers_two_tasks() {
    loom_tests::model("pool/two_spinning_workers_two_tasks", || {
        run_queue(&[Some(1), Some(1)], &[0, 0]);
    });
}

struct NoCredit;

impl CreditSink for NoCredit {
    fn consumed(&self, _epoch: u32, _cost: u64) {}
    fn idle(&self) {}
}

/// The pool itself: one worker thread (`Pool::start`, threads through the `sync` facade),
/// one `MemberQueue` with two messages and a batch budget of one, so the worker runs the
/// task, it yields, the worker re-submits it and runs it again (three runs in all); the
/// main thread waits for both messages, then stops and joins the pool. (No spin here: the
/// pool's spin runs on the wall clock; the queue models above cover it.)
#[test]
fn the_pool_runs_a_yielding_sender_task() {
    loom_tests::model("pool/the_pool_runs_a_yielding_sender_task", || {
        let ran = Ran::new(2);
        let handler = {
            let ran = ran.clone();
            Handler::owned(move |d: Delivery| ran.ran(usize::from(d.payload()[0])))
        };
        let pool = Pool::start("model", 1, 1, handler, None).expect("pool started");
        let member = Arc::new(MemberQueue::new(Arc::from("sender"), Box::new(NoCredit)));
        let batch =
            (0..2u8).map(|i| Delivery::new(Arc::from("sender"), Bytes::from(vec![i]), None, false));
        if member.push(batch) {
            assert!(pool.submit(Task::Member(member.clone())));
        }
        ran.wait_for(&[1, 1]);
        pool.stop();
        assert_eq!(
            pool.join_until(std::time::Instant::now() + std::time::Duration::from_secs(3600)),
            0
        );
        assert_eq!(ran.counts(), [1, 1]);
        // Budget 1: each message's run ends at the budget and yields; a third, empty run
        // finds nothing and goes idle.
        assert_eq!(pool.stats().tasks_run, 3);
        assert!(!member.is_running());
    });
}
