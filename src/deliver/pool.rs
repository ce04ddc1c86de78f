//! The delivery pool: a fixed number of threads fed by one task queue.
//!
//! The queue needs no bound of its own: every task is a sender's queue, never a message.
//! A sender has at most one [`Task::Member`] (its regular messages, one deliverer at a
//! time) and at most its out-of-band limit of [`Task::Oob`] drainers in the pool at once,
//! so the queue holds at most `senders × (1 + limit)` tasks, whatever they send; what they
//! send is bounded by their windows. A full pool therefore never makes the IO thread stop
//! reading: a slow handler backs up only its own sender, through credit. Besides, the node's
//! membership events have at most one [`Task::Events`] at once.

use std::collections::VecDeque;
use std::task::Waker;
use std::time::{Duration, Instant};

use super::member::{MemberQueue, RunOutcome};
use super::oob::OobQueue;
use super::{Delivery, DeliveryRef, Lending, NodeRef, Owning, Recipient};
use crate::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crate::sync::{thread, wait_timeout, wait_until, Arc, Condvar, Mutex};

/// The application's message handler: one that takes each message as a [`Delivery`] of
/// its own ([`Builder::on_message`](crate::Builder::on_message)), or one each message is
/// lent to for the call ([`Builder::on_message_ref`](crate::Builder::on_message_ref)).
#[derive(Clone)]
pub enum Handler {
    /// Takes each message.
    Owned(Arc<dyn Fn(Delivery) + Send + Sync>),
    /// Borrows each message.
    Lent(Arc<dyn Fn(DeliveryRef<'_>) + Send + Sync>),
}

impl Handler {
    /// A handler that takes each message.
    pub fn owned(f: impl Fn(Delivery) + Send + Sync + 'static) -> Handler {
        Handler::Owned(Arc::new(f))
    }
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Handler::Owned(_) => "Handler::Owned",
            Handler::Lent(_) => "Handler::Lent",
        })
    }
}

/// A unit of work for the pool.
pub enum Task {
    /// Run a sender's queue (the holder of its `RUNNING` bit).
    Member(Arc<MemberQueue>),
    /// Drain a sender's out-of-band queue (one of its at most `limit` drainers).
    Oob(Arc<OobQueue>),
    /// Hand the node's membership events to the application (the one deliverer of the
    /// events queue, so they arrive in order).
    Events(Arc<crate::events::EventQueue>),
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Task::Member(m) => f.debug_tuple("Sender").field(&m.name()).finish(),
            Task::Oob(q) => f.debug_tuple("Oob").field(&q.name()).finish(),
            Task::Events(_) => f.write_str("Events"),
        }
    }
}

/// What [`TaskQueue::next_until`] found.
#[derive(Debug)]
pub enum Next<T> {
    /// The next task, in order.
    Task(T),
    /// The queue is stopping and empty: no task will come.
    Stopped,
    /// The deadline passed with nothing queued.
    TimedOut,
}

struct Queue<T> {
    tasks: VecDeque<T>,
    stopping: bool,
    /// A future waiting for a task (`Inbox::recv_async`), woken by the next submit or the
    /// stop.
    waker: Option<Waker>,
}

/// The pool's task queue and its wake-up rule: workers take tasks in order, park on a
/// condvar when there are none, and may first spin for a while (one at a time: a worker
/// that finds another spinning parks at once); a submitter skips the wake-up (a futex
/// call) while enough workers spin for what is queued.
///
/// Nothing is stranded: a task is never left queued while every worker is parked. The
/// queue's lock carries this, not the atomics' orderings — a spinning worker leaves the
/// `spinning` count before it looks at the queue again under the lock, and parks only
/// after that look; a submitter reads `spinning` after its push under the lock. So a
/// submitter that still counts the spinner pushed before the spinner's look, which finds
/// the task; one that pushed after it sees the count without the spinner (the lock orders
/// the decrement before its read) and wakes a worker. (Loom model:
/// `loom-tests/tests/pool.rs`; it passes with every ordering here made `Relaxed`.)
///
/// Generic over the task so that the model can queue plain values; the pool queues
/// [`Task`]s.
pub struct TaskQueue<T> {
    // A mutex (and a condvar to park on): a task is a sender's queue, taken once per
    // batch of its messages, so the lock is not per message.
    queue: Mutex<Queue<T>>,
    /// Workers wait here for tasks.
    work: Condvar,
    /// Tasks in `queue`, readable without the lock (for spinning workers).
    queued: AtomicUsize,
    /// Workers spinning for a task before they park; a submitter skips the wake-up then.
    spinning: AtomicUsize,
}

impl<T> std::fmt::Debug for TaskQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskQueue")
            .field("queued", &self.queued.load(Ordering::Relaxed))
            .field("spinning", &self.spinning.load(Ordering::Relaxed))
            .finish()
    }
}

impl<T> Default for TaskQueue<T> {
    fn default() -> Self {
        TaskQueue::new()
    }
}

impl<T> TaskQueue<T> {
    /// An empty queue.
    pub fn new() -> TaskQueue<T> {
        TaskQueue {
            queue: Mutex::new(Queue {
                tasks: VecDeque::new(),
                stopping: false,
                waker: None,
            }),
            work: Condvar::new(),
            queued: AtomicUsize::new(0),
            spinning: AtomicUsize::new(0),
        }
    }

    /// Queues `task` at the back, waking a parked worker unless enough workers spin for
    /// what is queued. Gives the task back once the queue is stopping.
    pub fn submit(&self, task: T) -> Result<(), T> {
        let mut q = self.queue.lock();
        if q.stopping {
            return Err(task);
        }
        q.tasks.push_back(task);
        let queued = q.tasks.len();
        // Release: pairs with a spinner's Acquire; only a hint to stop spinning (the lock
        // hands the task over).
        self.queued.store(queued, Ordering::Release);
        let waker = q.waker.take();
        drop(q);
        if let Some(w) = waker {
            w.wake();
        }
        // Spinning workers see queued tasks (each looks again under the lock before
        // parking); waking a parked one as well, while there are enough spinners for what
        // is queued, would cost a futex call for nothing. After the push, under the lock's
        // order: see the type's doc. SeqCst, with the spinner's increment: not needed for
        // that (the model passes with Relaxed); the orderings the pool has always had.
        if self.spinning.load(Ordering::SeqCst) < queued {
            self.work.notify_one();
        }
        Ok(())
    }

    /// Queues a task a worker yielded at the back (even while stopping: the workers finish
    /// what is queued), and wakes a worker.
    pub fn resubmit(&self, task: T) {
        let mut q = self.queue.lock();
        q.tasks.push_back(task);
        // Release: as in `submit`.
        self.queued.store(q.tasks.len(), Ordering::Release);
        let waker = q.waker.take();
        drop(q);
        self.work.notify_one();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// A worker's next task, in order; `None` once the queue is stopping and empty. When
    /// there is none, the worker asks `spin` whether to spin first: `None` parks at once,
    /// `Some(keep)` spins (yielding the core each round) while `keep()` says so and nothing
    /// is queued, then looks again before it parks. `spin` is asked again after each
    /// wake-up that found nothing.
    pub fn next<S, K>(&self, spin: S) -> Option<T>
    where
        S: FnMut() -> Option<K>,
        K: FnMut() -> bool,
    {
        match self.next_until(spin, None) {
            Next::Task(t) => Some(t),
            Next::Stopped | Next::TimedOut => None,
        }
    }

    /// Like [`next`](TaskQueue::next), but gives up at `deadline` (if any) with
    /// [`Next::TimedOut`]; a deadline already past looks once without waiting.
    pub fn next_until<S, K>(&self, mut spin: S, deadline: Option<Instant>) -> Next<T>
    where
        S: FnMut() -> Option<K>,
        K: FnMut() -> bool,
    {
        let mut q = self.queue.lock();
        let mut spun = false;
        loop {
            if let Some(t) = q.tasks.pop_front() {
                // Release: as in `submit` (a spinner reading 0 keeps spinning).
                self.queued.store(q.tasks.len(), Ordering::Release);
                return Next::Task(t);
            }
            if q.stopping {
                return Next::Stopped;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Next::TimedOut;
            }
            // One spinner is enough to take the next task without a wake-up; more would
            // only take cores from the threads producing the work. (Relaxed: a hint; two
            // workers that both read 0 both spin, which is merely wasteful.)
            if !spun && self.spinning.load(Ordering::Relaxed) == 0 {
                if let Some(mut keep) = spin() {
                    spun = true;
                    drop(q);
                    self.spin_while(|| keep() && deadline.is_none_or(|d| Instant::now() < d));
                    // Look again under the lock before parking: a submitter that counted
                    // us spinning did not wake anyone.
                    q = self.queue.lock();
                    continue;
                }
            }
            if !wait_until(&self.work, &mut q, deadline) {
                return Next::TimedOut;
            }
            spun = false;
        }
    }

    /// Spins (yielding the core each round) while nothing is queued and `keep()` says so.
    /// While it spins, submitters skip their wake-up call.
    fn spin_while(&self, mut keep: impl FnMut() -> bool) {
        // SeqCst: with the submitter's load (see there). Leaving the count before the
        // caller looks again under the lock is what makes a skipped wake-up safe.
        self.spinning.fetch_add(1, Ordering::SeqCst);
        // Acquire: pairs with the Release stores of `queued` (a hint; see `submit`).
        while self.queued.load(Ordering::Acquire) == 0 && keep() {
            thread::yield_now();
        }
        self.spinning.fetch_sub(1, Ordering::SeqCst);
    }

    /// Tells the workers to finish the queued tasks and stop; later submits are refused.
    pub fn stop(&self) {
        let waker = {
            let mut q = self.queue.lock();
            q.stopping = true;
            q.waker.take()
        };
        self.work.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// A future's look (the one consumer of a queue without workers): `true` if a task is
    /// queued or the queue is stopping, else `waker` is kept, under the lock that `submit`
    /// and `stop` take it under, to be woken by the next of them (so none is missed).
    pub fn ready_or_wake(&self, waker: &Waker) -> bool {
        let mut q = self.queue.lock();
        if !q.tasks.is_empty() || q.stopping {
            return true;
        }
        match &mut q.waker {
            Some(w) if w.will_wake(waker) => {}
            w => *w = Some(waker.clone()),
        }
        false
    }

    /// Tasks queued now.
    pub fn len(&self) -> usize {
        self.queue.lock().tasks.len()
    }

    /// Whether no task is queued now.
    #[cfg(any(test, cohort_internals))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

struct Shared {
    tasks: TaskQueue<Task>,
    budget: usize,
    handler: Handler,
    /// The node's send handle, given to every delivery (`Delivery::sender`).
    node: Option<NodeRef>,
    /// Workers still running; shutdown waits on `exited` for it to reach zero.
    live: Mutex<usize>,
    exited: Condvar,
    busy: AtomicUsize,
    /// How long an idle worker spins (yielding) before it parks, in nanoseconds.
    spin_nanos: AtomicU64,
    /// Whether idle workers may spin now (an adaptive spin turns it off under load).
    spin_allowed: AtomicBool,
    tasks_run: AtomicU64,
    oob_delivered: AtomicU64,
    oob_bytes: AtomicU64,
    panics: AtomicU64,
}

/// The delivery pool.
pub struct Pool {
    shared: Arc<Shared>,
    threads: usize,
    handles: Mutex<Vec<thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.threads)
            .finish()
    }
}

/// Pool counters at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct PoolStats {
    /// Worker threads.
    pub threads: usize,
    /// Tasks waiting in the queue (each one a sender's queue: at most one per sender for
    /// its regular messages, its out-of-band limit for the others).
    pub queue_depth: usize,
    /// Workers running a task now.
    pub busy: usize,
    /// Tasks run so far (batches of a sender's regular or out-of-band messages).
    pub tasks_run: u64,
    /// Handler panics caught, in regular and out-of-band deliveries (each one logged; the
    /// message counts as handled).
    pub panics: u64,
}

impl Pool {
    /// Starts `threads` workers (at least one) named `{name}-deliver-{i}`. `budget` is the
    /// most messages one task handles before it yields its thread (re-submitted to the back
    /// of the queue, so one hot sender cannot starve others). Deliveries carry `node`, the
    /// node's send handle, when there is one.
    pub fn start(
        name: &str,
        threads: usize,
        budget: usize,
        handler: Handler,
        node: Option<NodeRef>,
    ) -> std::io::Result<Pool> {
        Pool::spawn(name, threads.max(1), budget, handler, node)
    }

    /// A pool without worker threads, whose tasks an [`Inbox`](super::Inbox) runs on the
    /// application's thread.
    pub(crate) fn without_workers(budget: usize, node: Option<NodeRef>) -> std::io::Result<Pool> {
        let unused = Handler::owned(|_| {});
        Pool::spawn("", 0, budget, unused, node)
    }

    fn spawn(
        name: &str,
        threads: usize,
        budget: usize,
        handler: Handler,
        node: Option<NodeRef>,
    ) -> std::io::Result<Pool> {
        let shared = Arc::new(Shared {
            tasks: TaskQueue::new(),
            budget: budget.max(1),
            handler,
            node,
            live: Mutex::new(0),
            exited: Condvar::new(),
            busy: AtomicUsize::new(0),
            spin_nanos: AtomicU64::new(0),
            spin_allowed: AtomicBool::new(true),
            tasks_run: AtomicU64::new(0),
            oob_delivered: AtomicU64::new(0),
            oob_bytes: AtomicU64::new(0),
            panics: AtomicU64::new(0),
        });
        let pool = Pool {
            shared: shared.clone(),
            threads,
            handles: Mutex::new(Vec::with_capacity(threads)),
        };
        for i in 0..threads {
            let s = shared.clone();
            *shared.live.lock() += 1;
            let spawned = thread::Builder::new()
                .name(format!("{name}-deliver-{i}"))
                .spawn(move || worker(s));
            match spawned {
                Ok(h) => pool.handles.lock().push(h),
                Err(e) => {
                    *shared.live.lock() -= 1;
                    pool.stop();
                    return Err(e);
                }
            }
        }
        Ok(pool)
    }

    /// Queues `task`. Returns `false` (dropping it) only once the pool is stopping.
    pub fn submit(&self, task: Task) -> bool {
        self.shared.tasks.submit(task).is_ok()
    }

    /// How long an idle worker spins, yielding its core, before it parks (default zero).
    /// A short spin saves a wake-up per hand-off when messages arrive less than that far
    /// apart (request/response), at the price of some CPU while idle.
    pub fn set_spin(&self, spin: Duration) {
        let nanos = spin.as_nanos().min(u64::MAX as u128) as u64;
        self.shared.spin_nanos.store(nanos, Ordering::Relaxed);
    }

    /// Lets idle workers spin (their configured spin) or not: the IO thread's adaptive
    /// spin turns it off while the node is loaded.
    pub fn allow_spin(&self, allowed: bool) {
        // Relaxed: a hint; a worker that sees it late spins once more or once less.
        self.shared.spin_allowed.store(allowed, Ordering::Relaxed);
    }

    /// Counters now.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            threads: self.threads,
            queue_depth: self.shared.tasks.len(),
            busy: self.shared.busy.load(Ordering::Relaxed),
            tasks_run: self.shared.tasks_run.load(Ordering::Relaxed),
            panics: self.shared.panics.load(Ordering::Relaxed),
        }
    }

    /// OOB messages and bytes delivered.
    pub fn oob_delivered(&self) -> (u64, u64) {
        (
            self.shared.oob_delivered.load(Ordering::Relaxed),
            self.shared.oob_bytes.load(Ordering::Relaxed),
        )
    }

    /// Runs the next task on the calling thread (an inbox's), waiting for one until
    /// `deadline` (forever if `None`; a deadline already past looks once), spinning first as
    /// the workers would. Each delivery, carrying `node`, goes to `handler`.
    pub(crate) fn run_next(
        &self,
        deadline: Option<Instant>,
        node: Option<&NodeRef>,
        mut handler: impl FnMut(Delivery),
    ) -> Next<()> {
        let s = &*self.shared;
        match s.tasks.next_until(|| spin_episode(s), deadline) {
            Next::Task(task) => {
                run_task(s, task, &mut Owning::new(node, &mut handler));
                Next::Task(())
            }
            Next::Stopped => Next::Stopped,
            Next::TimedOut => Next::TimedOut,
        }
    }

    /// For an inbox's future: `true` if a task waits or the pool is stopping, else `waker`
    /// is woken by the next task queued, or the stop.
    pub(crate) fn ready_or_wake(&self, waker: &Waker) -> bool {
        self.shared.tasks.ready_or_wake(waker)
    }

    /// The node's send handle the deliveries carry, if any.
    pub(crate) fn node(&self) -> Option<&NodeRef> {
        self.shared.node.as_ref()
    }

    /// Tells the workers to finish the queued tasks and exit. Does not wait.
    pub fn stop(&self) {
        self.shared.tasks.stop();
    }

    /// Waits until every worker has exited or `deadline` passes; joins them if they all
    /// exited. Returns the number of workers still running (0 on success).
    pub fn join_until(&self, deadline: Instant) -> usize {
        let mut live = self.shared.live.lock();
        while *live > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            wait_timeout(&self.shared.exited, &mut live, deadline - now);
        }
        let left = *live;
        drop(live);
        if left == 0 {
            for h in self.handles.lock().drain(..) {
                let _ = h.join();
            }
        }
        left
    }
}

/// The worker's spin before it parks: as long as the pool's spin setting, on the wall
/// clock; none when it is zero.
fn spin_episode(s: &Shared) -> Option<impl FnMut() -> bool> {
    // Relaxed: a setting; a worker that sees a change late spins the old time once more.
    let spin = Duration::from_nanos(s.spin_nanos.load(Ordering::Relaxed));
    // Relaxed: as in `allow_spin`.
    if spin.is_zero() || !s.spin_allowed.load(Ordering::Relaxed) {
        return None;
    }
    let started = Instant::now();
    Some(move || started.elapsed() < spin)
}

std::thread_local! {
    /// Whether this thread is one of a pool's workers (see [`on_pool_thread`]).
    static POOL_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is a delivery pool's worker: a handler's thread, which a
/// send blocked on a full window keeps from delivering (and so from returning credit).
pub(crate) fn on_pool_thread() -> bool {
    POOL_WORKER.with(|w| w.get())
}

/// Marks the calling thread as one that delivers (an inbox's, as it takes messages): a
/// send it blocks on a full window returns no credit either.
pub(crate) fn mark_delivering_thread() {
    POOL_WORKER.with(|w| w.set(true));
}

fn worker(s: Arc<Shared>) {
    mark_delivering_thread();
    // Each worker its own handle: the deliveries' clones of it then touch a reference count
    // no other worker touches.
    let node = s.node.as_ref().map(|n| n.fork());
    let node = node.as_ref();
    while let Some(task) = s.tasks.next(|| spin_episode(&s)) {
        match &s.handler {
            // One per task: a task is one sender's.
            Handler::Owned(h) => run_task(&s, task, &mut Owning::new(node, &**h)),
            Handler::Lent(h) => run_task(&s, task, &mut Lending::new(node, &**h)),
        }
    }
    let mut live = s.live.lock();
    *live -= 1;
    s.exited.notify_all();
}

/// Runs one task on the calling thread, handing each message over to `to`; a task that
/// yielded goes to the back of the queue again.
fn run_task(s: &Shared, task: Task, to: &mut impl Recipient) {
    s.busy.fetch_add(1, Ordering::Relaxed);
    let again = match task {
        Task::Member(m) => {
            let before = m.panics();
            let outcome = m.run_to(s.budget, to);
            // One deliverer at a time runs a sender's queue: what its count gained since
            // `before` was caught in this run. Two loads per task, none per message.
            let caught = m.panics().saturating_sub(before);
            if caught > 0 {
                s.panics.fetch_add(caught, Ordering::Relaxed);
            }
            match outcome {
                RunOutcome::Yield => Some(Task::Member(m)),
                RunOutcome::Idle => None,
            }
        }
        Task::Oob(q) => {
            let run = q.run(s.budget, |d| to.take(d));
            s.oob_delivered.fetch_add(run.delivered, Ordering::Relaxed);
            s.oob_bytes.fetch_add(run.bytes, Ordering::Relaxed);
            s.panics.fetch_add(run.panics, Ordering::Relaxed);
            match run.outcome {
                RunOutcome::Yield => Some(Task::Oob(q)),
                RunOutcome::Idle => None,
            }
        }
        Task::Events(q) => q.run(s.budget).then_some(Task::Events(q)),
    };
    if let Some(task) = again {
        // Back of the queue: the sender keeps its place (no new task), others get their
        // turn first.
        s.tasks.resubmit(task);
    }
    s.busy.fetch_sub(1, Ordering::Relaxed);
    s.tasks_run.fetch_add(1, Ordering::Relaxed);
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize as StdAtomicUsize;

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Count(StdAtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn a_waiting_future_is_woken_by_the_next_submit_and_by_the_stop() {
        let q = TaskQueue::new();
        let count = std::sync::Arc::new(Count::default());
        let waker = Waker::from(count.clone());
        let woken = || count.0.load(std::sync::atomic::Ordering::SeqCst);
        assert!(!q.ready_or_wake(&waker), "nothing queued: kept");
        q.submit(1).expect("queued");
        assert_eq!(woken(), 1);
        assert!(q.ready_or_wake(&waker), "a task waits");
        q.submit(2).expect("queued");
        assert_eq!(woken(), 1, "woken once per registration");
        assert!(matches!(
            q.next_until(|| None::<fn() -> bool>, None),
            Next::Task(1)
        ));
        assert!(matches!(
            q.next_until(|| None::<fn() -> bool>, None),
            Next::Task(2)
        ));
        assert!(!q.ready_or_wake(&waker));
        q.stop();
        assert_eq!(woken(), 2, "the stop wakes it");
        assert!(q.ready_or_wake(&waker), "stopping: ready (to say closed)");
    }

    /// Workers that spin (on the wall clock, as the pool's do) and workers that park at
    /// once take every task, whether a submit finds them spinning (and skips its wake-up)
    /// or parked.
    #[test]
    fn spinning_and_parking_workers_take_every_task() {
        const TASKS: usize = 2000;
        let q = std::sync::Arc::new(TaskQueue::new());
        let ran = std::sync::Arc::new(StdAtomicUsize::new(0));
        let workers: Vec<_> = [Some(Duration::from_micros(50)), None]
            .into_iter()
            .map(|spin| {
                let (q, ran) = (q.clone(), ran.clone());
                std::thread::spawn(move || {
                    let spin = || {
                        spin.map(|spin| {
                            let started = Instant::now();
                            move || started.elapsed() < spin
                        })
                    };
                    while let Some(t) = q.next(spin) {
                        let t: usize = t;
                        ran.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if t % 7 == 0 {
                            q.resubmit(t + 1);
                        }
                    }
                })
            })
            .collect();
        let mut want = 0;
        for t in 0..TASKS {
            q.submit(t * 7 + (t % 2)).expect("open");
            want += if t % 2 == 0 { 2 } else { 1 };
            if t % 16 == 0 {
                // Let the workers run dry now and then, so that some submits find them
                // spinning and some find them parked.
                let deadline = Instant::now() + Duration::from_secs(10);
                while ran.load(std::sync::atomic::Ordering::Relaxed) < want {
                    assert!(Instant::now() < deadline, "a task was stranded");
                    std::thread::yield_now();
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while ran.load(std::sync::atomic::Ordering::Relaxed) < want {
            assert!(Instant::now() < deadline, "a task was stranded");
            std::thread::yield_now();
        }
        q.stop();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(ran.load(std::sync::atomic::Ordering::Relaxed), want);
        assert!(q.submit(0).is_err(), "a stopped queue refuses tasks");
    }
}
