//! The journal on a thread of its own (`{name}-journal`): group commit off the IO thread,
//! so no connection's latency depends on the disk.
//!
//! The IO thread hands over numbered batches of records ([`JournalWriter::submit`]) and
//! goes on; the writer appends every batch waiting at once (one write, and under
//! [`FsyncPolicy::EveryBatch`] one fsync, for all of them), syncs when the policy or a
//! [`sync`](JournalWriter::sync) request asks, and publishes two marks — the last batch
//! *appended* (in the page cache: it survives a crash of the process) and the last batch
//! *synced* (on disk: it survives a crash of the machine) — then calls the wake-up it was
//! given. The IO thread lets a message's bytes leave, and an ack carry delivery progress,
//! only once the batch holding their records has reached the mark its policy requires.
//!
//! | policy | a batch appended | a batch synced |
//! |---|---|---|
//! | `EveryBatch` | with its fsync: both marks move in one step | with its append |
//! | `Interval(d)` | at once | at the first sync `d` after the last one |
//! | `Never` | at once | only when asked (`sync`, shutdown) |
//!
//! A failed write or sync stops the writer: it sets [`failed`](WriterMarks::failed), wakes
//! the IO thread (which stops the node), and appends nothing more.
//!
//! Invariants (loom model: `loom-tests/tests/journal_writer.rs`, on a [`Store`] that stands
//! in for the journal): a mark is never published before its batch is written (appended,
//! or synced), every step that moves a mark wakes the IO thread after it, a sync asked for
//! is done, and the stop appends and syncs everything handed over.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{FsyncPolicy, Journal, JournalError, JournalStats, Record};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{thread, wait_timeout, Arc, Condvar, Mutex};

/// What the writer has done, as the IO thread reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterMarks {
    /// The last batch appended (written to the journal's files).
    pub appended: u64,
    /// The last batch on disk (fsynced).
    pub synced: u64,
    /// A write or sync failed: nothing more is appended.
    pub failed: bool,
}

/// What the writer thread writes to: the [`Journal`] (a model's stand-in under loom).
pub trait Store: Send + 'static {
    /// When the store syncs on its own ([`Journal::fsync_policy`]).
    fn fsync_policy(&self) -> FsyncPolicy;
    /// Appends `records` ([`Journal::append_at`]); under [`FsyncPolicy::EveryBatch`] this
    /// syncs them too.
    fn append_at(&mut self, records: &[Record], now: Instant) -> Result<(), JournalError>;
    /// Forces what is appended to disk ([`Journal::sync`]).
    fn sync(&mut self) -> Result<(), JournalError>;
    /// Whether records are appended and not yet synced ([`Journal::unsynced`]).
    fn unsynced(&self) -> bool;
    /// Time since the last sync ([`Journal::since_sync`]).
    fn since_sync(&self) -> Duration;
    /// The counters now ([`Journal::stats`]).
    fn stats(&self) -> JournalStats;
}

impl Store for Journal {
    fn fsync_policy(&self) -> FsyncPolicy {
        Journal::fsync_policy(self)
    }
    fn append_at(&mut self, records: &[Record], now: Instant) -> Result<(), JournalError> {
        Journal::append_at(self, records, now)
    }
    fn sync(&mut self) -> Result<(), JournalError> {
        Journal::sync(self)
    }
    fn unsynced(&self) -> bool {
        Journal::unsynced(self)
    }
    fn since_sync(&self) -> Duration {
        Journal::since_sync(self)
    }
    fn stats(&self) -> JournalStats {
        Journal::stats(self)
    }
}

struct Queue {
    /// Batches handed over and not yet appended, in order.
    batches: VecDeque<(u64, Vec<Record>)>,
    /// A sync of everything up to this batch is wanted.
    sync_upto: u64,
    /// Stop once everything handed over is appended (and synced).
    stop: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// The writer waits here for work.
    work: Condvar,
    appended: AtomicU64,
    synced: AtomicU64,
    failed: AtomicBool,
    /// The journal's counters as of its last write.
    stats: Mutex<Option<JournalStats>>,
    wake: Box<dyn Fn() + Send + Sync>,
}

/// The IO thread's handle on the writer thread, writing to a [`Journal`] (or, in a model,
/// another [`Store`]).
pub struct JournalWriter<S: Store = Journal> {
    shared: Arc<Shared>,
    handle: Option<thread::JoinHandle<Option<S>>>,
}

impl<S: Store> std::fmt::Debug for JournalWriter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalWriter")
            .field("marks", &self.marks())
            .finish_non_exhaustive()
    }
}

impl<S: Store> JournalWriter<S> {
    /// Starts the writer thread `{name}-journal` on `journal`; `wake` is called after every
    /// step that moved a mark (or a failure).
    pub fn start(
        name: &str,
        journal: S,
        wake: Box<dyn Fn() + Send + Sync>,
    ) -> std::io::Result<JournalWriter<S>> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                batches: VecDeque::new(),
                sync_upto: 0,
                stop: false,
            }),
            work: Condvar::new(),
            appended: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            stats: Mutex::new(Some(journal.stats())),
            wake,
        });
        let s = shared.clone();
        let handle = thread::Builder::new()
            .name(format!("{name}-journal"))
            .spawn(move || run(&s, journal))?;
        Ok(JournalWriter {
            shared,
            handle: Some(handle),
        })
    }

    /// Hands batch `n` over (numbers strictly increase).
    pub fn submit(&self, n: u64, records: Vec<Record>) {
        let mut q = self.shared.queue.lock();
        q.batches.push_back((n, records));
        drop(q);
        self.shared.work.notify_one();
    }

    /// Asks for everything up to batch `n` to be synced (the `synced` mark reaches it).
    pub fn sync(&self, n: u64) {
        let mut q = self.shared.queue.lock();
        q.sync_upto = q.sync_upto.max(n);
        drop(q);
        self.shared.work.notify_one();
    }

    /// The marks now.
    pub fn marks(&self) -> WriterMarks {
        // Acquire: pairs with the writer's Release, so the batch behind a mark is on its
        // way to disk before the IO thread acts on the mark. `synced` first: the writer
        // stores it after `appended`, so the snapshot never has `synced > appended` (both
        // would be true, but one read between a step's two stores would look torn).
        let synced = self.shared.synced.load(Ordering::Acquire);
        WriterMarks {
            appended: self.shared.appended.load(Ordering::Acquire),
            synced,
            failed: self.shared.failed.load(Ordering::Acquire),
        }
    }

    /// The journal's counters as of its last write.
    pub fn stats(&self) -> Option<JournalStats> {
        *self.shared.stats.lock()
    }

    /// Appends and syncs everything handed over, stops the thread and returns the journal
    /// (`None` if a write failed, or the thread panicked).
    pub fn stop(mut self) -> Option<S> {
        self.stop_thread()
    }

    fn stop_thread(&mut self) -> Option<S> {
        let handle = self.handle.take()?;
        {
            let mut q = self.shared.queue.lock();
            q.stop = true;
        }
        self.shared.work.notify_one();
        match handle.join() {
            Ok(journal) => journal,
            Err(_) => {
                log::error!("the journal writer thread panicked");
                None
            }
        }
    }
}

impl<S: Store> Drop for JournalWriter<S> {
    fn drop(&mut self) {
        let _ = self.stop_thread();
    }
}

/// The writer thread's loop: returns the journal once stopped with everything appended and
/// synced, `None` after a failure.
fn run<S: Store>(s: &Shared, mut journal: S) -> Option<S> {
    let policy = journal.fsync_policy();
    let mut records = Vec::new();
    loop {
        let (last, sync_upto, stop) = {
            let mut q = s.queue.lock();
            loop {
                let unsynced =
                    s.synced.load(Ordering::Relaxed) < s.appended.load(Ordering::Relaxed);
                if !q.batches.is_empty()
                    || q.stop
                    || (unsynced && q.sync_upto > s.synced.load(Ordering::Relaxed))
                {
                    break;
                }
                match sync_due_in(policy, &journal) {
                    // Unsynced records under an interval policy: wake for their sync.
                    Some(d) if d.is_zero() => break,
                    Some(d) => {
                        wait_timeout(&s.work, &mut q, d);
                    }
                    None => s.work.wait(&mut q),
                }
            }
            let mut last = None;
            // Group commit: every batch waiting goes into one append.
            while let Some((n, batch)) = q.batches.pop_front() {
                records.extend(batch);
                last = Some(n);
            }
            (last, q.sync_upto, q.stop)
        };
        if let Err(e) = step(s, &mut journal, &mut records, last, sync_upto, stop) {
            log::error!("journal write failed: {e}");
            s.failed.store(true, Ordering::Release);
            (s.wake)();
            return None;
        }
        *s.stats.lock() = Some(journal.stats());
        (s.wake)();
        if stop && s.queue.lock().batches.is_empty() {
            return Some(journal);
        }
    }
}

/// One round of the writer: appends `records` (batches up to `last`; the policy may sync
/// them as part of the append), syncs what is appended if a request, the interval or a stop
/// asks, and moves the marks.
fn step<S: Store>(
    s: &Shared,
    journal: &mut S,
    records: &mut Vec<Record>,
    last: Option<u64>,
    sync_upto: u64,
    stop: bool,
) -> Result<(), JournalError> {
    if let Some(n) = last {
        journal.append_at(records, Instant::now())?;
        records.clear();
        // Release: a reader of the mark finds the batch written.
        s.appended.store(n, Ordering::Release);
    }
    let appended = s.appended.load(Ordering::Relaxed);
    let synced = s.synced.load(Ordering::Relaxed);
    if synced < appended {
        let due = sync_due_in(journal.fsync_policy(), journal).is_some_and(|d| d.is_zero());
        if journal.unsynced() && (sync_upto > synced || stop || due) {
            journal.sync()?;
        }
        if !journal.unsynced() {
            // Synced by this round, or by the append itself (every batch, or an interval
            // that had passed).
            s.synced.store(appended, Ordering::Release);
        }
    }
    Ok(())
}

/// Under an interval policy with unsynced records: how long until their sync is due.
fn sync_due_in<S: Store>(policy: FsyncPolicy, journal: &S) -> Option<Duration> {
    match policy {
        FsyncPolicy::Interval(every) if journal.unsynced() => {
            Some(every.saturating_sub(journal.since_sync()))
        }
        _ => None,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::journal::JournalConfig;
    use std::sync::atomic::AtomicUsize;

    fn open(dir: &std::path::Path, policy: FsyncPolicy) -> Journal {
        let config = JournalConfig::new(dir, "w").fsync(policy);
        Journal::open(config).expect("open").0
    }

    fn record(seq: u64) -> Record {
        Record::Message {
            peer: "p".into(),
            seq,
            flags: crate::wire::FLAG_RELIABLE,
            payload: bytes::Bytes::from_static(b"hello"),
        }
    }

    fn wait_for(w: &JournalWriter, what: &str, cond: impl Fn(WriterMarks) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond(w.marks()) {
            assert!(Instant::now() < deadline, "{what}: marks {:?}", w.marks());
            std::thread::yield_now();
        }
    }

    #[test]
    fn marks_follow_each_policy() {
        for policy in [
            FsyncPolicy::EveryBatch,
            FsyncPolicy::Never,
            FsyncPolicy::Interval(Duration::from_millis(20)),
        ] {
            let dir = std::env::temp_dir()
                .join(format!("cohort-writer-{}-{policy:?}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let wakes = Arc::new(AtomicUsize::new(0));
            let w2 = wakes.clone();
            let w = JournalWriter::start(
                "t",
                open(&dir, policy),
                Box::new(move || {
                    w2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }),
            )
            .expect("start");
            w.submit(1, vec![record(1)]);
            w.submit(2, vec![record(2)]);
            wait_for(&w, "appended", |m| m.appended == 2);
            match policy {
                // Both marks move in the same step, before its wake-up: `synced` is
                // stored just after `appended`.
                FsyncPolicy::EveryBatch => {
                    wait_for(&w, "synced with the append", |m| m.synced == 2)
                }
                // An interval passes: the writer syncs on its own.
                FsyncPolicy::Interval(_) => {
                    wait_for(&w, "synced by the interval", |m| m.synced == 2)
                }
                FsyncPolicy::Never => {
                    assert_eq!(w.marks().synced, 0, "never syncs unasked");
                    w.sync(2);
                    wait_for(&w, "synced on request", |m| m.synced == 2);
                }
            }
            // The marks are published before the wake-up is called: wait for it.
            let deadline = Instant::now() + Duration::from_secs(10);
            while wakes.load(std::sync::atomic::Ordering::Relaxed) == 0 {
                assert!(Instant::now() < deadline, "the IO thread was never woken");
                std::thread::yield_now();
            }
            w.submit(3, vec![record(3)]);
            let journal = w.stop().expect("the journal back");
            assert!(!journal.unsynced(), "stop syncs what was handed over");
            assert_eq!(journal.stats().records, 3);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
