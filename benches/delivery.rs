//! The delivery pool alone, no sockets: 4 senders × 10, × 100 and × 1000 messages through
//! `cohort::internals::deliver::Pool` (4 threads), two ways.
//!
//! - `member_queue`: one-deliverer-per-sender, as the IO thread does it: each sender's batch
//!   is pushed to that sender's `MemberQueue`, and `Task::Member` is submitted only when the
//!   push reports the queue idle. At most one pool thread runs a sender's messages at once.
//! - `oob_queue`: the out-of-band path: each sender's batch is pushed to that sender's
//!   `OobQueue`, drained by at most its fair share of the pool (half of it, here 2 threads)
//!   at once, in any order.
//!
//! One iteration submits the 4 senders' batches from the bench thread (standing in for the
//! IO thread) and waits until the handler has seen every message; criterion reports time
//! and messages per second. Once per case, the number of distinct pool threads that ran
//! deliveries (per batch on average, and over the whole run) is printed to stderr.
//!
//! `cargo bench --bench delivery`; `cargo test --benches` runs each case once.

mod common;

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use cohort::internals::deliver::{CreditSink, Handler, MemberQueue, OobQueue, Pool, Task};
use cohort::{Bytes, Delivery};
use common::{Progress, Samples};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// Pool threads (one per sender, so the per-message path could spread over all of them).
const POOL_THREADS: usize = 4;

/// Senders, each with its own batch per iteration.
const SENDERS: usize = 4;

/// Messages per sender per iteration.
const BATCHES: [u64; 3] = [10, 100, 1000];

/// Messages a sender's deliverer runs before yielding its thread (the builder's default).
const DELIVERY_BUDGET: usize = 256;

/// Longest wait for one iteration's deliveries before the bench fails.
const BATCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Credit goes nowhere: there is no sender window behind these queues.
struct NoCredit;

impl CreditSink for NoCredit {
    fn consumed(&self, _epoch: u32, _cost: u64) {}
    fn idle(&self) {}
}

thread_local! {
    /// The last batch in which this thread ran a delivery.
    static LAST_BATCH: Cell<u64> = const { Cell::new(0) };
}

/// Counts the distinct threads that ran deliveries, per batch and over a whole case.
/// A handler pays one atomic load and a thread-local read per message; the lock is taken
/// once per thread per batch.
#[derive(Debug, Default)]
struct ThreadTally {
    /// The current batch, from 1.
    batch: AtomicU64,
    /// Distinct threads seen in the current batch.
    in_batch: AtomicU64,
    /// Sum of `in_batch` over finished batches, and their number.
    sum: AtomicU64,
    batches: AtomicU64,
    most: AtomicU64,
    all: Mutex<HashSet<ThreadId>>,
}

impl ThreadTally {
    fn begin_batch(&self) {
        self.in_batch.store(0, Ordering::SeqCst);
        self.batch.fetch_add(1, Ordering::SeqCst);
    }

    /// Called by the handler on every delivery.
    fn note(&self) {
        let batch = self.batch.load(Ordering::Relaxed);
        if LAST_BATCH.get() != batch {
            LAST_BATCH.set(batch);
            self.in_batch.fetch_add(1, Ordering::Relaxed);
            self.all
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(thread::current().id());
        }
    }

    /// Call once every delivery of the batch has been counted (they happen before).
    fn end_batch(&self) {
        let n = self.in_batch.load(Ordering::SeqCst);
        self.sum.fetch_add(n, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.most.fetch_max(n, Ordering::Relaxed);
    }

    fn report(&self, case: &str) {
        let batches = self.batches.load(Ordering::Relaxed).max(1);
        let all = self.all.lock().unwrap_or_else(|e| e.into_inner()).len();
        eprintln!(
            "{case}: deliveries ran on {:.2} distinct pool threads per batch on average \
             (most {}), {all} over the run, pool of {POOL_THREADS}",
            self.sum.load(Ordering::Relaxed) as f64 / batches as f64,
            self.most.load(Ordering::Relaxed),
        );
    }
}

/// How each message reaches the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Push to the sender's `MemberQueue`; submit `Task::Member` when it was idle.
    MemberQueue,
    /// Push to the sender's `OobQueue`; submit the `Task::Oob` drainers it asks for.
    OobQueue,
}

/// A pool of [`POOL_THREADS`] whose handler counts deliveries and the threads running them.
struct Rig {
    pool: Pool,
    queues: Vec<Arc<MemberQueue>>,
    oob: Vec<Arc<OobQueue>>,
    names: Vec<Arc<str>>,
    delivered: Arc<Progress>,
    threads: Arc<ThreadTally>,
    payload: Bytes,
}

impl Rig {
    fn start() -> std::io::Result<Rig> {
        let delivered = Arc::new(Progress::default());
        let threads = Arc::new(ThreadTally::default());
        let (count, tally) = (delivered.clone(), threads.clone());
        let pool = Pool::start(
            "bench",
            POOL_THREADS,
            DELIVERY_BUDGET,
            Handler::owned(move |_: Delivery| {
                tally.note();
                count.add(1);
            }),
            None,
        )?;
        let names: Vec<Arc<str>> = (0..SENDERS).map(|i| format!("sender-{i}").into()).collect();
        let queues = names
            .iter()
            .map(|name| Arc::new(MemberQueue::new(name.clone(), Box::new(NoCredit))))
            .collect();
        let oob = names
            .iter()
            .map(|name| {
                Arc::new(OobQueue::new(
                    name.clone(),
                    POOL_THREADS / 2,
                    Arc::new(NoCredit),
                ))
            })
            .collect();
        Ok(Rig {
            pool,
            queues,
            oob,
            names,
            delivered,
            threads,
            payload: Bytes::from(vec![0x42; 64]),
        })
    }

    fn submit(&self, task: Task) {
        assert!(self.pool.submit(task), "the pool stopped");
    }

    /// Hands `per_sender` messages from each sender to the pool and waits until all ran.
    fn run_batch(&self, mode: Mode, per_sender: u64) {
        let target = self.delivered.expect(per_sender * SENDERS as u64);
        self.threads.begin_batch();
        for ((queue, oob), name) in self.queues.iter().zip(&self.oob).zip(&self.names) {
            match mode {
                Mode::MemberQueue => {
                    let batch = (1..=per_sender).map(|seq| {
                        Delivery::new(name.clone(), self.payload.clone(), Some(seq), false)
                    });
                    if queue.push(batch) {
                        self.submit(Task::Member(queue.clone()));
                    }
                }
                Mode::OobQueue => {
                    let batch = (0..per_sender)
                        .map(|_| Delivery::new(name.clone(), self.payload.clone(), None, true));
                    for _ in 0..oob.push(batch) {
                        self.submit(Task::Oob(oob.clone()));
                    }
                }
            }
        }
        self.delivered
            .wait_for(target, BATCH_TIMEOUT, "delivery pool: running a batch");
        self.threads.end_batch();
    }

    fn shutdown(self) {
        self.pool.stop();
        let left = self
            .pool
            .join_until(Instant::now() + Duration::from_secs(5));
        if left > 0 {
            eprintln!("delivery pool: {left} thread(s) still running after 5 s");
        }
        let most = self.queues.iter().map(|q| q.max_concurrent()).max();
        assert!(
            most <= Some(1),
            "one deliverer per sender broke: {most:?} at once"
        );
        let most = self.oob.iter().map(|q| q.max_concurrent()).max();
        assert!(
            most <= Some(POOL_THREADS / 2),
            "a sender's OOB share broke: {most:?} drainers at once"
        );
    }
}

fn delivery(c: &mut Criterion) {
    for per_sender in BATCHES {
        let name = format!("delivery_{SENDERS}x{per_sender}");
        let mut group = c.benchmark_group(&name);
        group.throughput(Throughput::Elements(per_sender * SENDERS as u64));
        let mut medians = Vec::new();
        for (mode, label) in [
            (Mode::MemberQueue, "member_queue"),
            (Mode::OobQueue, "oob_queue"),
        ] {
            let samples = Samples::new(per_sender * SENDERS as u64);
            let rig = Rig::start().expect("start the delivery pool");
            group.bench_function(label, |b| {
                b.iter_custom(|iters| {
                    let started = Instant::now();
                    for _ in 0..iters {
                        rig.run_batch(mode, per_sender);
                    }
                    let elapsed = started.elapsed();
                    samples.record(iters, elapsed);
                    elapsed
                })
            });
            rig.threads.report(&format!("{name}/{label}"));
            rig.shutdown();
            medians.push((label, samples.median_per_iter()));
        }
        group.finish();
        if !common::test_mode() {
            if let [(a, Some(ta)), (b, Some(tb))] = medians.as_slice() {
                println!(
                    "summary {name}: {a} {:.1} µs, {b} {:.1} µs per batch, {a}/{b} = {:.2}\n",
                    ta.as_secs_f64() * 1e6,
                    tb.as_secs_f64() * 1e6,
                    ta.as_secs_f64() / tb.as_secs_f64()
                );
            }
        }
    }
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = delivery
}
criterion_main!(benches);
