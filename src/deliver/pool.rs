//! The delivery pool: a fixed number of threads fed by one task queue.
//!
//! The queue needs no bound of its own: every task is a sender's queue, never a message.
//! A sender has at most one [`Task::Member`] (its regular messages, one deliverer at a
//! time) and at most its out-of-band limit of [`Task::Oob`] drainers in the pool at once,
//! so the queue holds at most `senders × (1 + limit)` tasks, whatever they send; what they
//! send is bounded by their windows. A full pool therefore never makes the IO thread stop
//! reading: a slow handler backs up only its own sender, through credit.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::member::{MemberQueue, RunOutcome};
use super::oob::OobQueue;
use super::Delivery;
use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use crate::sync::{thread, wait_timeout, Arc, Condvar, Mutex};

/// The application's message handler.
pub type Handler = Arc<dyn Fn(Delivery) + Send + Sync>;

/// A unit of work for the pool.
pub enum Task {
    /// Run a sender's queue (the holder of its `RUNNING` bit).
    Member(Arc<MemberQueue>),
    /// Drain a sender's out-of-band queue (one of its at most `limit` drainers).
    Oob(Arc<OobQueue>),
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Task::Member(m) => f.debug_tuple("Member").field(&m.name()).finish(),
            Task::Oob(q) => f.debug_tuple("Oob").field(&q.name()).finish(),
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
    budget: usize,
    handler: Handler,
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
            .finish()
    }
}

/// Pool counters at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
    /// Handler panics caught in OOB deliveries.
    pub panics: u64,
}

impl Pool {
    /// Starts `threads` workers (at least one) named `{name}-deliver-{i}`. `budget` is the
    /// most messages one task handles before it yields its thread (re-submitted to the back
    /// of the queue, so one hot sender cannot starve others).
    pub fn start(
        name: &str,
        threads: usize,
        budget: usize,
        handler: Handler,
    ) -> std::io::Result<Pool> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                tasks: VecDeque::new(),
                stopping: false,
            }),
            work: Condvar::new(),
            budget: budget.max(1),
            handler,
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

    /// Queues `task`. Returns `false` (dropping it) only once the pool is stopping.
    pub fn submit(&self, task: Task) -> bool {
        let mut q = self.shared.queue.lock();
        if q.stopping {
            return false;
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
        true
    }

    /// How long an idle worker spins, yielding its core, before it parks (default zero).
    /// A short spin saves a wake-up per hand-off when messages arrive less than that far
    /// apart (request/response), at the price of some CPU while idle.
    pub fn set_spin(&self, spin: Duration) {
        let nanos = spin.as_nanos().min(u64::MAX as u128) as u64;
        self.shared.spin_nanos.store(nanos, Ordering::Relaxed);
    }

    /// Counters now.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            threads: self.threads,
            queue_depth: self.shared.queue.lock().tasks.len(),
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
        s.busy.fetch_add(1, Ordering::Relaxed);
        let again = match task {
            Task::Member(m) => match m.run(s.budget, &*s.handler) {
                RunOutcome::Yield => Some(Task::Member(m)),
                RunOutcome::Idle => None,
            },
            Task::Oob(q) => {
                let run = q.run(s.budget, &*s.handler);
                s.oob_delivered.fetch_add(run.delivered, Ordering::Relaxed);
                s.oob_bytes.fetch_add(run.bytes, Ordering::Relaxed);
                s.panics.fetch_add(run.panics, Ordering::Relaxed);
                match run.outcome {
                    RunOutcome::Yield => Some(Task::Oob(q)),
                    RunOutcome::Idle => None,
                }
            }
        };
        if let Some(task) = again {
            // Back of the queue: the sender keeps its place (no new task), others get their
            // turn first.
            let mut q = s.queue.lock();
            q.tasks.push_back(task);
            s.queued.store(q.tasks.len(), Ordering::Release);
            drop(q);
            s.work.notify_one();
        }
        s.busy.fetch_sub(1, Ordering::Relaxed);
        s.tasks_run.fetch_add(1, Ordering::Relaxed);
    }
    let mut live = s.live.lock();
    *live -= 1;
    s.exited.notify_all();
}
