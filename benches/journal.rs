//! Journalled throughput: 1→1 at 64 B and 1 KiB payloads, for each fsync policy of the
//! durable outbox against the same run without a journal, in one process, so the cost of
//! each policy is read off one report.
//!
//! A `source` node `send`s (blocking on the window) to a `sink` node on 127.0.0.1 whose
//! handler counts messages, as in `benches/throughput.rs` (1→1, reliable). The source runs
//! without a journal (`no_journal`), then with one under `FsyncPolicy::Never`,
//! `Interval(5 ms)` and `EveryBatch`, each in a fresh directory under the system temp dir
//! (default 16 MiB segments). The sink never journals: this measures the sender's outbox.
//!
//! One iteration sends a batch of messages and waits until the sink has counted all of
//! them; criterion reports messages per second. Nodes are set up once per benchmark
//! function. After each group a line gives every median and its ratio to `no_journal`.
//!
//! `cargo bench --bench journal` (add `-- 1KiB` to run one group);
//! `cargo test --benches` runs each case once with small batches.

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cohort::{Bytes, FsyncPolicy, Node};
use common::{Progress, Samples};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// Payload sizes measured, with the label used in group names.
const SIZES: [(usize, &str); 2] = [(64, "64B"), (1024, "1KiB")];

/// The cases: a label and the source's fsync policy (`None`: no journal).
const POLICIES: [(&str, Option<FsyncPolicy>); 4] = [
    ("no_journal", None),
    ("never", Some(FsyncPolicy::Never)),
    (
        "interval_5ms",
        Some(FsyncPolicy::Interval(Duration::from_millis(5))),
    ),
    ("every_batch", Some(FsyncPolicy::EveryBatch)),
];

/// Longest wait for one batch to be counted before the bench fails.
const BATCH_TIMEOUT: Duration = Duration::from_secs(60);

/// Messages per iteration: tens of milliseconds of traffic without a journal on a 2-core
/// machine, the same for every policy so the iterations compare; tiny in test mode, where
/// the code is unoptimised and runs once.
fn batch_len(size: usize) -> u64 {
    match (common::test_mode(), size <= 64) {
        (true, _) => 1_000,
        (false, true) => 100_000,
        (false, false) => 40_000,
    }
}

/// A directory under the system temp dir for one journal, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "cohort-bench-journal-{label}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("removing {}: {e}", self.0.display());
        }
    }
}

/// A `source` node (journalled or not) sending to a `sink` node that counts what its
/// handler sees.
struct Pair {
    sink: Node,
    source: Node,
    received: Arc<Progress>,
    /// Kept until the nodes are shut down.
    _dir: Option<TempDir>,
}

impl Pair {
    fn start(label: &str, policy: Option<FsyncPolicy>) -> Result<Pair, cohort::Error> {
        let received = Arc::new(Progress::default());
        let counter = received.clone();
        let sink = Node::builder("sink")
            .cluster("bench-journal")
            .on_message(move |_| counter.add(1))
            .start()?;
        let mut source = Node::builder("source")
            .cluster("bench-journal")
            .peer("sink", sink.local_addr());
        let dir = policy.map(|_| TempDir::new(label));
        if let (Some(dir), Some(policy)) = (&dir, policy) {
            source = source.journal(&dir.0).journal_fsync(policy);
        }
        let source = source.start()?;
        sink.add_peer(source.name(), source.local_addr())?;
        let pair = Pair {
            sink,
            source,
            received,
            _dir: dir,
        };
        // One message first: the connection is up before measuring.
        let target = pair.received.expect(1);
        pair.source.send("sink", Bytes::from_static(b"hello"))?;
        pair.received
            .wait_for(target, BATCH_TIMEOUT, "connecting the source");
        Ok(pair)
    }

    /// Sends `n` messages and waits until all are counted.
    fn run_batch(&self, n: u64, payload: &Bytes) {
        let target = self.received.expect(n);
        for _ in 0..n {
            self.source
                .send("sink", payload.clone())
                .expect("send to the sink");
        }
        self.received
            .wait_for(target, BATCH_TIMEOUT, "sink counting a batch");
    }

    /// Shuts both nodes down; returns the source's journal counters for the report.
    fn shutdown(self) -> Option<cohort::JournalStats> {
        let journal = self.source.stats().journal;
        for node in [&self.source, &self.sink] {
            if let Err(e) = node.shutdown(Duration::from_secs(5)) {
                eprintln!("{}: shutdown failed: {e}", node.name());
            }
        }
        journal
    }
}

/// Times `iters` batches with `run`, recording the call in `samples`.
fn time_batches(iters: u64, samples: &Samples, mut run: impl FnMut()) -> Duration {
    let started = Instant::now();
    for _ in 0..iters {
        run();
    }
    let elapsed = started.elapsed();
    samples.record(iters, elapsed);
    elapsed
}

fn one_to_one(c: &mut Criterion) {
    for (size, label) in SIZES {
        let payload = Bytes::from(vec![0xA5; size]);
        let name = format!("journal_1to1_{label}");
        let mut group = c.benchmark_group(&name);
        let n = batch_len(size);
        group.throughput(Throughput::Elements(n));
        let mut results = Vec::new();
        for (case, policy) in POLICIES {
            let samples = Samples::new(n);
            let pair = Pair::start(case, policy).expect("start the nodes");
            group.bench_function(case, |b| {
                b.iter_custom(|iters| time_batches(iters, &samples, || pair.run_batch(n, &payload)))
            });
            let journal = pair.shutdown();
            results.push((case, samples, journal));
        }
        group.finish();
        if !common::test_mode() {
            summarize(&name, &results);
        }
    }
}

/// Prints each case's median (messages per second), its ratio to `no_journal`, and what
/// the journal did per batch.
fn summarize(name: &str, results: &[(&str, Samples, Option<cohort::JournalStats>)]) {
    let Some(base) = results.first().and_then(|(_, s, _)| s.median_rate()) else {
        return; // filtered out
    };
    let mut line = format!("summary {name}:");
    for (case, samples, journal) in results {
        let Some(rate) = samples.median_rate() else {
            continue;
        };
        line.push_str(&format!(
            " {case} {} ({:.2})",
            common::rate(rate),
            rate / base
        ));
        if let Some(j) = journal.filter(|j| j.records > 0) {
            let per_fsync = match j.fsyncs {
                0 => "no fsync".to_owned(),
                f => format!("{:.0} per fsync", j.records as f64 / f as f64),
            };
            line.push_str(&format!(
                " [{:.0} records per append, {per_fsync}]",
                j.records as f64 / j.appends.max(1) as f64,
            ));
        }
        line.push(';');
    }
    println!("{line}\n");
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = one_to_one
}
criterion_main!(benches);
