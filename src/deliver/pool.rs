//! The bounded delivery pool: a fixed number of threads fed by a bounded task queue.
//!
//! Producers outside the pool (the IO thread) use [`Pool::try_submit`], which refuses when
//! the queue is full: the IO thread then stops reading sockets until the pool calls its
//! `on_space` hook, so TCP back-pressure reaches the sender and nothing is dropped.
//! A deliverer that yields after its batch budget re-submits itself past the bound: there is
//! at most one such task per sender, so the excess is bounded by the number of senders.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use super::member::{CreditSink, MemberQueue, RunOutcome};
use super::Delivery;
use crate::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crate::sync::{thread, wait_timeout, Arc, Condvar, Mutex};

/// The application's message handler.
pub type Handler = Arc<dyn Fn(Delivery) + Send + Sync>;

/// A unit of work for the pool.
pub enum Task {
    /// Run a sender's queue (the holder of its `RUNNING` bit).
    Member(Arc<MemberQueue>),
    /// Deliver one out-of-band message, then report its bytes to the sink.
    Oob(Delivery, Arc<dyn CreditSink>),
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Task::Member(m) => f.debug_tuple("Member").field(&m.name()).finish(),
            Task::Oob(d, _) => f.debug_tuple("Oob").field(&d.from()).finish(),
        }
    }
}

struct Queue {
    tasks: VecDeque<Task>,
    stopping: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Workers wait here for tasks.
    work: Condvar,
    capacity: usize,
    budget: usize,
    handler: Handler,
    /// Set when `try_submit` refused; cleared (and `on_space` called) once the queue has
    /// drained to half.
    full: AtomicBool,
    on_space: Box<dyn Fn() + Send + Sync>,
    /// Workers still running; shutdown waits on `exited` for it to reach zero.
    live: Mutex<usize>,
    exited: Condvar,
    busy: AtomicUsize,
    /// Tasks in `queue`, readable without the lock (for spinning workers).
    queued: AtomicUsize,
    /// Workers spinning for a task before they park; a submitter skips the wake-up then.
    spinning: AtomicUsize,
    /// How long an idle worker spins (yielding) before it parks, in nanoseconds.
    spin_nanos: AtomicU64,
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
            .field("capacity", &self.shared.capacity)
            .finish()
    }
}

/// Pool counters at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Worker threads.
    pub threads: usize,
    /// Tasks waiting in the queue.
    pub queue_depth: usize,
    /// Queue bound for outside submitters.
    pub queue_capacity: usize,
    /// Workers running a task now.
    pub busy: usize,
    /// Tasks run so far (sender batches and OOB messages).
    pub tasks_run: u64,
    /// Handler panics caught in OOB deliveries.
    pub panics: u64,
}

impl Pool {
    /// Starts `threads` workers (at least one) named `{name}-deliver-{i}`. `capacity` bounds
    /// the queue for [`try_submit`](Pool::try_submit); `budget` is the most messages one
    /// sender's deliverer handles before yielding its thread. `on_space` is called (from a
    /// worker) when a refused submitter may try again.
    pub fn start(
        name: &str,
        threads: usize,
        capacity: usize,
        budget: usize,
        handler: Handler,
        on_space: Box<dyn Fn() + Send + Sync>,
    ) -> std::io::Result<Pool> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                tasks: VecDeque::with_capacity(capacity.min(4096)),
                stopping: false,
            }),
            work: Condvar::new(),
            capacity: capacity.max(1),
            budget: budget.max(1),
            handler,
            full: AtomicBool::new(false),
            on_space,
            live: Mutex::new(0),
            exited: Condvar::new(),
            busy: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            spinning: AtomicUsize::new(0),
            spin_nanos: AtomicU64::new(0),
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

    /// Queues `task` unless the queue is at capacity, in which case it is handed back and
    /// `on_space` will be called once there is room again.
    pub fn try_submit(&self, task: Task) -> Result<(), Task> {
        let mut q = self.shared.queue.lock();
        if q.stopping {
            return Err(task);
        }
        if q.tasks.len() >= self.shared.capacity {
            self.shared.full.store(true, Ordering::Release);
            return Err(task);
        }
        q.tasks.push_back(task);
        let queued = q.tasks.len();
        self.shared.queued.store(queued, Ordering::Release);
        drop(q);
        // Spinning workers see queued tasks (each re-checks under the lock before parking);
        // waking a parked one as well, while there are enough spinners for what is queued,
        // would cost a futex call for nothing.
        if self.shared.spinning.load(Ordering::SeqCst) < queued {
            self.shared.work.notify_one();
        }
        Ok(())
    }

    /// How long an idle worker spins, yielding its core, before it parks (default zero).
    /// A short spin saves a wake-up per hand-off when messages arrive less than that far
    /// apart (request/response), at the price of some CPU while idle.
    pub fn set_spin(&self, spin: Duration) {
        let nanos = spin.as_nanos().min(u64::MAX as u128) as u64;
        self.shared.spin_nanos.store(nanos, Ordering::Relaxed);
    }

    /// Whether the pool refused a task and has not yet signalled room.
    pub fn is_full(&self) -> bool {
        self.shared.full.load(Ordering::Acquire)
    }

    /// Counters now.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            threads: self.threads,
            queue_depth: self.shared.queue.lock().tasks.len(),
            queue_capacity: self.shared.capacity,
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

    /// Tells the workers to finish the queued tasks and exit. Does not wait.
    pub fn stop(&self) {
        self.shared.queue.lock().stopping = true;
        self.shared.work.notify_all();
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

/// Spins (yielding the core each round) until a task is queued, the pool stops, or `spin`
/// has passed. While it spins, submitters skip their wake-up call.
fn spin_for_task(s: &Shared, spin: Duration) {
    // SeqCst pairs with the submitter's load of `spinning` after its push: either it sees us
    // spinning (and we see `queued`), or we are past the spin and re-check under the lock.
    s.spinning.fetch_add(1, Ordering::SeqCst);
    let started = Instant::now();
    while s.queued.load(Ordering::Acquire) == 0 && started.elapsed() < spin {
        thread::yield_now();
    }
    s.spinning.fetch_sub(1, Ordering::SeqCst);
}

fn worker(s: Arc<Shared>) {
    loop {
        let task = {
            let mut q = s.queue.lock();
            let mut spun = false;
            loop {
                if let Some(t) = q.tasks.pop_front() {
                    s.queued.store(q.tasks.len(), Ordering::Release);
                    break Some(t);
                }
                if q.stopping {
                    break None;
                }
                let spin = Duration::from_nanos(s.spin_nanos.load(Ordering::Relaxed));
                if !spun && !spin.is_zero() {
                    spun = true;
                    drop(q);
                    spin_for_task(&s, spin);
                    q = s.queue.lock();
                    continue;
                }
                s.work.wait(&mut q);
                spun = false;
            }
        };
        let Some(task) = task else { break };
        if s.full.load(Ordering::Acquire) && s.queue.lock().tasks.len() <= s.capacity / 2 {
            // Only one worker calls on_space per full episode.
            if s.full.swap(false, Ordering::AcqRel) {
                (s.on_space)();
            }
        }
        s.busy.fetch_add(1, Ordering::Relaxed);
        match task {
            Task::Member(m) => {
                if m.run(s.budget, &*s.handler) == RunOutcome::Yield {
                    // Back of the queue, past the bound (at most one task per sender).
                    let mut q = s.queue.lock();
                    q.tasks.push_back(Task::Member(m));
                    s.queued.store(q.tasks.len(), Ordering::Release);
                    drop(q);
                    s.work.notify_one();
                }
            }
            Task::Oob(d, sink) => {
                let bytes = d.payload().len() as u64;
                let done = d.seq().map(|seq| (d.epoch(), seq));
                let epoch = d.epoch();
                if catch_unwind(AssertUnwindSafe(|| (s.handler)(d))).is_err() {
                    s.panics.fetch_add(1, Ordering::Relaxed);
                    log::error!("message handler panicked on an out-of-band message; continuing");
                }
                if let Some((epoch, seq)) = done.filter(|_| sink.tracks_progress()) {
                    sink.handled(epoch, &[seq]);
                }
                s.oob_delivered.fetch_add(1, Ordering::Relaxed);
                s.oob_bytes.fetch_add(bytes, Ordering::Relaxed);
                sink.consumed(crate::flow::cost(bytes as usize));
                if done.is_none() && sink.tracks_progress() {
                    sink.handled_unreliable(epoch, crate::flow::cost(bytes as usize));
                }
                sink.idle();
            }
        }
        s.busy.fetch_sub(1, Ordering::Relaxed);
        s.tasks_run.fetch_add(1, Ordering::Relaxed);
    }
    let mut live = s.live.lock();
    *live -= 1;
    s.exited.notify_all();
}
