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
//! | `Interval(d)` | at once | at the first sync `d` after the last one began |
//! | `Never` | at once | only when asked (`sync`, shutdown) |
//!
//! A failed write or sync stops the writer: it sets [`failed`](WriterMarks::failed), wakes
//! the IO thread (which stops the node), and appends nothing more.
//!
//! **Syncs outside the lock.** Under `Never` and `Interval` the writer publishes (and wakes
//! the IO thread for) what it appended before it syncs, and runs the fsync without the
//! journal's lock ([`Store::begin_sync`] under it, [`Store::run_sync`] without it): the
//! sync covers what was appended when it began, and the `synced` mark it publishes says no
//! more; what is appended while it runs is owed the next one. An fsync takes milliseconds
//! on many disks: the IO thread's appends go on meanwhile.
//!
//! **Inline appends.** Under `Never` and `Interval` a round trip's batch is a few records
//! and the writer is usually idle: handing it over would cost a wake-up of the writer and
//! one of the IO thread, on each node, for each message. So [`submit`](JournalWriter::submit)
//! appends a batch on the caller's thread (the IO thread, or a sending thread driving its
//! turn while it is parked) when that is one small write and nothing else
//! ([`Store::append_inline`]: no segment to seal or create, no sync, at most `INLINE_MAX`
//! bytes), nothing is queued ahead of it, and the writer is not in a step under the lock
//! (the journal's lock, taken with `try_lock`: a turn never waits for a segment
//! or an fsync; under these policies the writer syncs under the lock only as it seals a
//! segment). Everything else still goes to the writer. Order holds because the writer
//! takes batches off the queue only while holding the journal, and only the IO thread's
//! turn queues them (its own, or one a sending thread drives while the IO thread is
//! parked: the turns hold the IO thread's state one at a time, so they submit one after
//! another). A batch appended inline into a synced journal under `Interval` wakes the
//! writer, which owes it a sync once the interval has passed.
//!
//! Invariants (loom model: `loom-tests/tests/journal_writer.rs`, on a [`Store`] that stands
//! in for the journal): a mark is never published before its batch is written (appended,
//! or synced — a sync run outside the lock publishes only what it covered), every step of
//! the writer that moves a mark wakes the IO thread after it, a sync asked for is done,
//! batches are appended in order whoever appends them, and the stop appends and syncs
//! everything handed over.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{FsyncPolicy, Journal, JournalError, JournalStats, PendingSync, Record};
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
    /// A sync begun under the journal's lock, run outside it ([`PendingSync`]).
    type Pending: Send;
    /// When the store syncs on its own ([`Journal::fsync_policy`]).
    fn fsync_policy(&self) -> FsyncPolicy;
    /// Appends `records`; under [`FsyncPolicy::EveryBatch`] this syncs them too, under the
    /// other policies never (the writer syncs outside the lock).
    fn append_at(&mut self, records: &[Record], now: Instant) -> Result<(), JournalError>;
    /// Appends `records` only if that takes one small write and nothing else
    /// ([`Journal::append_inline`]); `Ok(false)`, nothing written, otherwise.
    fn append_inline(&mut self, records: &[Record]) -> Result<bool, JournalError>;
    /// Starts a sync of everything appended so far; what is appended after it is owed the
    /// next one ([`Journal::begin_sync`]).
    fn begin_sync(&mut self, now: Instant) -> Self::Pending;
    /// Runs a sync begun by [`begin_sync`](Self::begin_sync), without the journal's lock
    /// ([`PendingSync::run`]).
    fn run_sync(pending: &Self::Pending) -> Result<(), JournalError>;
    /// Counts a sync done ([`Journal::finish_sync`]).
    fn finish_sync(&mut self, done: Self::Pending);
    /// Whether records are appended and not covered by a sync begun since
    /// ([`Journal::unsynced`]).
    fn unsynced(&self) -> bool;
    /// Time since the last sync began ([`Journal::since_sync`]).
    fn since_sync(&self) -> Duration;
    /// The counters now ([`Journal::stats`]).
    fn stats(&self) -> JournalStats;
}

impl Store for Journal {
    type Pending = PendingSync;
    fn fsync_policy(&self) -> FsyncPolicy {
        Journal::fsync_policy(self)
    }
    fn append_at(&mut self, records: &[Record], now: Instant) -> Result<(), JournalError> {
        Journal::append_batch(self, records, now)
    }
    fn append_inline(&mut self, records: &[Record]) -> Result<bool, JournalError> {
        Journal::append_inline(self, records)
    }
    fn begin_sync(&mut self, now: Instant) -> PendingSync {
        Journal::begin_sync(self, now)
    }
    fn run_sync(pending: &PendingSync) -> Result<(), JournalError> {
        pending.run()
    }
    fn finish_sync(&mut self, done: PendingSync) {
        Journal::finish_sync(self, done)
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

struct Shared<S> {
    queue: Mutex<Queue>,
    /// The writer waits here for work.
    work: Condvar,
    /// The journal. The writer holds it for each of its steps (an append, the marks it
    /// moves, the start of a sync; not the fsync itself, except under `EveryBatch` and for
    /// a segment sealed) and takes the batches waiting only while holding it; the IO
    /// thread's turn (its own, or a driven one) takes it only with `try_lock`, never
    /// waiting for a step.
    /// Lock order: `queue` before `journal` (the writer's wait); a turn never holds one
    /// while it waits for the other. `None` once the writer has stopped.
    journal: Mutex<Option<S>>,
    /// The journal's policy: the IO thread's turn may append a small batch itself under
    /// `Never` and `Interval`.
    policy: FsyncPolicy,
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
    shared: Arc<Shared<S>>,
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
    /// step of the writer that moved a mark (or a failure).
    pub fn start(
        name: &str,
        journal: S,
        wake: Box<dyn Fn() + Send + Sync>,
    ) -> std::io::Result<JournalWriter<S>> {
        let policy = journal.fsync_policy();
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                batches: VecDeque::new(),
                sync_upto: 0,
                stop: false,
            }),
            work: Condvar::new(),
            stats: Mutex::new(Some(journal.stats())),
            journal: Mutex::new(Some(journal)),
            policy,
            appended: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            wake,
        });
        let s = shared.clone();
        let handle = thread::Builder::new()
            .name(format!("{name}-journal"))
            .spawn(move || run(&s, policy))?;
        Ok(JournalWriter {
            shared,
            handle: Some(handle),
        })
    }

    /// Hands batch `n` over (numbers strictly increase). Under `Never` and `Interval`, a
    /// small batch is appended here, on the caller's thread, when nothing is waiting ahead
    /// of it and the writer is not in a step ([`Store::append_inline`]: one write, no
    /// segment rolled, no sync). Returns `true` when the marks moved here (the batch is
    /// appended, or its write failed): no wake-up comes for it, the caller reads them now.
    /// Otherwise the writer appends it, and wakes the caller once it has.
    pub fn submit(&self, n: u64, records: Vec<Record>) -> bool {
        let s = &*self.shared;
        let mut q = s.queue.lock();
        if s.policy != FsyncPolicy::EveryBatch && q.batches.is_empty() && !q.stop {
            // Only the IO thread's turn hands batches over (its own, or one a requester
            // drives: they hold its state one at a time), so the queue stays empty:
            // nothing can come before this batch once the journal is ours (the writer
            // takes batches only while it holds the journal).
            drop(q);
            match self.append_inline(n, &records) {
                Some(true) => return true,
                Some(false) => {}
                // Failed: the marks say so; the batch is never appended.
                None => return true,
            }
            q = s.queue.lock();
        }
        q.batches.push_back((n, records));
        drop(q);
        s.work.notify_one();
        false
    }

    /// The inline append: `Some(true)` if batch `n` is appended (its mark moved),
    /// `Some(false)` if the journal is busy or the batch takes more than one small write,
    /// `None` if the write failed (`failed` set, the writer stops at its next step).
    fn append_inline(&self, n: u64, records: &[Record]) -> Option<bool> {
        let s = &*self.shared;
        let Some(mut guard) = s.journal.try_lock() else {
            return Some(false); // the writer is in a step: never wait for it
        };
        let journal = match guard.as_mut() {
            Some(j) if !s.failed.load(Ordering::Relaxed) => j,
            _ => return Some(false),
        };
        let was_unsynced = journal.unsynced();
        match journal.append_inline(records) {
            Ok(false) => return Some(false),
            Ok(true) => {}
            Err(e) => {
                log::error!("journal write failed: {}", crate::util::Chain(&e));
                // Release: pairs with the IO thread's Acquire in `marks`.
                s.failed.store(true, Ordering::Release);
                return None;
            }
        }
        // Release: a reader of the mark finds the batch written. Stored under the
        // journal's lock, so the writer's marks and these never go back.
        s.appended.store(n, Ordering::Release);
        *s.stats.lock() = Some(journal.stats());
        drop(guard);
        if !was_unsynced && matches!(s.policy, FsyncPolicy::Interval(_)) {
            // The writer may be waiting with nothing to sync: it owes this batch a sync
            // once the interval has passed. Taken after the append, so either its check
            // (under the queue's lock) sees the batch, or it already waits and is woken.
            drop(s.queue.lock());
            s.work.notify_one();
        }
        Some(true)
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
/// synced, `None` after a failure (its own, or an inline append's).
fn run<S: Store>(s: &Shared<S>, policy: FsyncPolicy) -> Option<S> {
    let mut records = Vec::new();
    loop {
        {
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
                // Lock order: the queue, then the journal (an inline append in progress
                // ends without taking the queue).
                let due = match policy {
                    FsyncPolicy::Interval(_) => s
                        .journal
                        .lock()
                        .as_ref()
                        .and_then(|j| sync_due_in(policy, j)),
                    FsyncPolicy::EveryBatch | FsyncPolicy::Never => None,
                };
                match due {
                    // Unsynced records under an interval policy: wake for their sync.
                    Some(d) if d.is_zero() => break,
                    Some(d) => {
                        wait_timeout(&s.work, &mut q, d);
                    }
                    None => s.work.wait(&mut q),
                }
            }
        }
        let mut guard = s.journal.lock();
        let journal = match guard.as_mut() {
            Some(j) if !s.failed.load(Ordering::Relaxed) => j,
            // An inline append failed: the IO thread has the failure from the marks.
            _ => return None,
        };
        // The batches waiting are taken while the journal is held: an inline append
        // cannot come between their hand-over and their append.
        let (last, sync_upto, stop) = {
            let mut q = s.queue.lock();
            let mut last = None;
            // Group commit: every batch waiting goes into one append.
            while let Some((n, batch)) = q.batches.pop_front() {
                records.extend(batch);
                last = Some(n);
            }
            (last, q.sync_upto, q.stop)
        };
        let synced = s.synced.load(Ordering::Relaxed);
        let sync = match step(s, journal, &mut records, last, sync_upto, stop) {
            Ok(sync) => sync,
            Err(e) => return fail(s, guard, &e),
        };
        *s.stats.lock() = Some(journal.stats());
        drop(guard);
        if last.is_some() || s.synced.load(Ordering::Relaxed) != synced {
            (s.wake)();
        }
        if let Some((pending, covered)) = sync {
            // The fsync, without the journal's lock: the IO thread appends meanwhile
            // (its batches are owed the next sync), never waiting for the disk.
            if let Err(e) = S::run_sync(&pending) {
                return fail(s, s.journal.lock(), &e);
            }
            if let Some(journal) = s.journal.lock().as_mut() {
                journal.finish_sync(pending);
                *s.stats.lock() = Some(journal.stats());
            }
            // Release: a reader of the mark finds the batches up to `covered` on disk.
            s.synced.store(covered, Ordering::Release);
            (s.wake)();
        }
        if stop
            && s.queue.lock().batches.is_empty()
            && s.synced.load(Ordering::Relaxed) >= s.appended.load(Ordering::Relaxed)
        {
            return s.journal.lock().take();
        }
    }
}

/// A write or sync failed: nothing more is appended; the IO thread learns it from the
/// marks, through a wake-up. `failed` is set while `journal` (the journal's guard) is
/// held, so no inline append lands after the failure: one would move `appended` past a
/// batch that was never written.
fn fail<S: Store>(
    s: &Shared<S>,
    journal: crate::sync::MutexGuard<'_, Option<S>>,
    e: &JournalError,
) -> Option<S> {
    // Release: pairs with the IO thread's Acquire in `marks`.
    s.failed.store(true, Ordering::Release);
    drop(journal);
    log::error!("journal write failed: {}", crate::util::Chain(e));
    (s.wake)();
    None
}

/// One round of the writer under the journal's lock: appends `records` (batches up to
/// `last`; under `EveryBatch` the append syncs them), moves the marks, and begins the sync
/// that a request, the interval or a stop asks for. Returns that sync, to run without the
/// lock, with the last batch it covers.
fn step<S: Store>(
    s: &Shared<S>,
    journal: &mut S,
    records: &mut Vec<Record>,
    last: Option<u64>,
    sync_upto: u64,
    stop: bool,
) -> Result<Option<(S::Pending, u64)>, JournalError> {
    if let Some(n) = last {
        journal.append_at(records, Instant::now())?;
        records.clear();
        // Release: a reader of the mark finds the batch written.
        s.appended.store(n, Ordering::Release);
    }
    let appended = s.appended.load(Ordering::Relaxed);
    let synced = s.synced.load(Ordering::Relaxed);
    if !journal.unsynced() {
        // Synced by the append itself (every batch, or a segment sealed), and no sync is
        // running (only this thread begins one): nothing appended waits for the disk.
        if synced < appended {
            // Release: a reader of the mark finds the batches on disk.
            s.synced.store(appended, Ordering::Release);
        }
        return Ok(None);
    }
    // Records wait for the disk (batches handed over, or appended before the writer
    // started): sync them when asked, at a stop, or once the interval has passed.
    let due = sync_due_in(journal.fsync_policy(), journal).is_some_and(|d| d.is_zero());
    if (sync_upto > synced && synced < appended) || stop || due {
        // Everything up to `appended` is written (inline appends store their mark under
        // this lock too), so the sync begun now covers it.
        return Ok(Some((journal.begin_sync(Instant::now()), appended)));
    }
    Ok(None)
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
