//! The journal's writer thread: loom models of `cohort::internals::journal::JournalWriter`
//! (its `submit`, `sync`, `marks`, the wake-up it calls, `stop`), the code that ships, on a
//! `Store` that stands in for the journal's files and records what was written and synced.
//!
//! The IO thread (`IoThread::drain` on `Output::Journal`, `journal_progress`, the `SyncJournal`
//! command, `finish`) hands numbered batches over, may ask for a sync, reads the marks each
//! time the writer wakes it, lets bytes leave only once their batch's mark says so, and
//! stops the writer as it exits. The model's IO thread is the main thread; the writer is
//! the thread `JournalWriter::start` spawns.
//!
//! Checked in every execution:
//!
//! - a mark is never published before its batch is written: whenever the IO thread reads
//!   `appended ≥ n` the store holds batch `n`, and `synced ≥ n` means it is synced;
//! - the IO thread is woken after every step that moves a mark: it waits for the marks it
//!   needs only through the wake-up (a mark moved without one leaves it waiting for ever,
//!   which loom reports as a deadlock), and a sync asked for is done;
//! - the stop hands the store back with everything appended and synced;
//! - a failed append sets `failed` (the batch never marked) and wakes the IO thread; the
//!   stop then hands nothing back;
//! - a batch the IO thread appends itself (`submit` returning `true`: `Never` and
//!   `Interval`, the writer not in a step, nothing queued ahead) is appended in order with
//!   the ones handed over (the store checks the order), its mark is already published
//!   when `submit` returns, and a batch the journal is busy for or refuses (a full
//!   segment) is handed over, never lost; an inline append that fails sets `failed` and
//!   the writer stops without appending anything more;
//! - a sync runs outside the journal's lock while the IO thread appends: the `synced` mark
//!   it publishes covers only what was appended when it began, and what was appended while
//!   it ran is synced by a later one;
//! - batches handed over by turns on two threads, one after another (a requester driving
//!   the IO thread's turn, then the IO thread), land in order;
//! - after the writer's append fails, no batch is appended inline behind the hole (the
//!   store checks the order); a failed sync sets `failed`, wakes the IO thread and never
//!   moves `synced`.
#![cfg(loom)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use cohort::internals::journal::{
    FsyncPolicy, JournalError, JournalStats, JournalWriter, Record, Store, WriterMarks,
};
use loom::sync::{Condvar, Mutex};
use std::sync::Arc;

/// What the model's store holds: the last batch written, the last synced, and the last a
/// sync begun (perhaps still running) covers.
#[derive(Debug, Default)]
struct Written {
    appended: u64,
    synced: u64,
    syncing: u64,
}

/// The journal's stand-in: batch `n` is one record with sequence number `n`. With
/// `fail_at`, appending that batch fails (a full disk); batches in `not_inline` are refused
/// by `append_inline` (as a batch that would roll a segment is); with `fail_sync`, every
/// sync fails (the disk reports an error at fsync). With `due`, the interval
/// has always passed (an `Interval` store's sync is due as soon as anything is unsynced).
/// A sync covers what was appended when it began; it reaches the disk while it runs,
/// outside the journal's lock, as appends go on.
struct ModelStore {
    policy: FsyncPolicy,
    written: Arc<Mutex<Written>>,
    fail_at: Option<u64>,
    not_inline: &'static [u64],
    fail_sync: bool,
    due: bool,
}

impl ModelStore {
    fn new(policy: FsyncPolicy, written: &Arc<Mutex<Written>>) -> ModelStore {
        ModelStore {
            policy,
            written: written.clone(),
            fail_at: None,
            not_inline: &[],
            fail_sync: false,
            due: false,
        }
    }
}

impl Store for ModelStore {
    /// The store, the last batch the sync covers, and whether it fails.
    type Pending = (Arc<Mutex<Written>>, u64, bool);

    fn fsync_policy(&self) -> FsyncPolicy {
        self.policy
    }
    fn append_at(&mut self, records: &[Record], _now: Instant) -> Result<(), JournalError> {
        let mut w = self.written.lock().unwrap();
        for r in records {
            let Record::Message { seq, .. } = r else {
                panic!("the model hands over messages only");
            };
            assert_eq!(*seq, w.appended + 1, "batches appended in order, once");
            if self.fail_at == Some(*seq) {
                return Err(JournalError::Io {
                    path: "model".into(),
                    source: std::io::Error::other("disk full"),
                });
            }
            w.appended = *seq;
        }
        if self.policy == FsyncPolicy::EveryBatch {
            w.synced = w.appended;
            w.syncing = w.appended;
        }
        Ok(())
    }
    fn append_inline(&mut self, records: &[Record]) -> Result<bool, JournalError> {
        let refused = records
            .iter()
            .any(|r| matches!(r, Record::Message { seq, .. } if self.not_inline.contains(seq)));
        if self.policy == FsyncPolicy::EveryBatch || refused {
            return Ok(false);
        }
        self.append_at(records, Instant::now()).map(|()| true)
    }
    fn begin_sync(&mut self, _now: Instant) -> Self::Pending {
        let mut w = self.written.lock().unwrap();
        w.syncing = w.appended;
        (self.written.clone(), w.appended, self.fail_sync)
    }
    fn run_sync((written, covered, fails): &Self::Pending) -> Result<(), JournalError> {
        if *fails {
            return Err(JournalError::Io {
                path: "model".into(),
                source: std::io::Error::other("fsync failed"),
            });
        }
        let mut w = written.lock().unwrap();
        w.synced = w.synced.max(*covered);
        Ok(())
    }
    fn finish_sync(&mut self, (_, covered, _): Self::Pending) {
        assert!(
            self.written.lock().unwrap().synced >= covered,
            "finished before it ran"
        );
    }
    fn unsynced(&self) -> bool {
        let w = self.written.lock().unwrap();
        w.appended > w.synced.max(w.syncing)
    }
    fn since_sync(&self) -> Duration {
        if self.due {
            Duration::from_secs(3600)
        } else {
            Duration::ZERO
        }
    }
    fn stats(&self) -> JournalStats {
        JournalStats::default()
    }
}

/// The IO thread's wake-up as the writer calls it: a flag and a condvar.
#[derive(Default)]
struct Wake {
    woken: Mutex<bool>,
    cv: Condvar,
}

impl Wake {
    fn wait(&self) {
        let mut g = self.woken.lock().unwrap();
        while !*g {
            g = self.cv.wait(g).unwrap();
        }
        *g = false;
    }
}

/// Starts the writer on `store`, its wake-up setting the returned [`Wake`].
fn start(store: ModelStore) -> (JournalWriter<ModelStore>, Arc<Wake>) {
    let wake = Arc::new(Wake::default());
    let w = wake.clone();
    let writer = JournalWriter::start(
        "model",
        store,
        Box::new(move || {
            *w.woken.lock().unwrap() = true;
            w.cv.notify_one();
        }),
    )
    .expect("start");
    (writer, wake)
}

/// Waits through the wake-ups until the marks say `failed`, checking each reading with
/// `check`, then stops the writer, which hands nothing back.
fn fails_and_stops(
    writer: JournalWriter<ModelStore>,
    wake: &Wake,
    written: &Mutex<Written>,
    check: impl Fn(WriterMarks),
) {
    loop {
        let m = checked(&writer, written);
        check(m);
        if m.failed {
            break;
        }
        wake.wait();
    }
    assert!(
        writer.stop().is_none(),
        "a failed writer hands nothing back"
    );
}

fn batch(n: u64) -> Vec<Record> {
    vec![Record::Message {
        peer: "p".into(),
        seq: n,
        flags: 1,
        payload: Bytes::from_static(b"m"),
    }]
}

/// The marks read now, checked against what the store holds.
fn checked(writer: &JournalWriter<ModelStore>, written: &Mutex<Written>) -> WriterMarks {
    let m = writer.marks();
    let w = written.lock().unwrap();
    assert!(
        m.appended <= w.appended,
        "mark {m:?} published before its batch was written ({:?})",
        *w
    );
    assert!(
        m.synced <= w.synced,
        "mark {m:?} published before its batch was synced ({:?})",
        *w
    );
    assert!(m.synced <= m.appended, "{m:?}");
    m
}

/// Hands `batches` batches over (reading the marks between them), asks for a sync after
/// each batch in `sync_after`, waits through the wake-ups until the marks say they are
/// appended (and synced, where a sync was asked, the policy syncs every batch or the
/// store's interval is `due`), then stops the writer. Batches in `not_inline` are refused
/// by the store's inline append.
fn model(
    policy: FsyncPolicy,
    batches: u64,
    sync_after: &[u64],
    not_inline: &'static [u64],
    due: bool,
) {
    let written = Arc::new(Mutex::new(Written::default()));
    let store = ModelStore {
        not_inline,
        due,
        ..ModelStore::new(policy, &written)
    };
    let (writer, wake) = start(store);
    for n in 1..=batches {
        let inline = writer.submit(n, batch(n));
        let m = checked(&writer, &written);
        if inline {
            assert!(m.appended >= n, "appended inline, yet not marked: {m:?}");
        }
        assert!(
            policy != FsyncPolicy::EveryBatch || !inline,
            "EveryBatch never inline"
        );
        assert!(
            !not_inline.contains(&n) || !inline,
            "a refused batch appended inline"
        );
        if sync_after.contains(&n) {
            writer.sync(n);
        }
    }
    let synced_wanted = sync_after.contains(&batches)
        || policy == FsyncPolicy::EveryBatch
        || (due && matches!(policy, FsyncPolicy::Interval(_)));
    loop {
        let m = checked(&writer, &written);
        assert!(!m.failed);
        if m.appended == batches && (!synced_wanted || m.synced == batches) {
            break;
        }
        wake.wait();
    }
    let store = writer.stop().expect("the store back");
    let w = store.written.lock().unwrap();
    assert_eq!(
        (w.appended, w.synced),
        (batches, batches),
        "the stop appends and syncs everything handed over"
    );
}

/// Two batches under `Never`, then a sync (`Node::sync_journal`): the marks move in the
/// writer's steps, each followed by a wake-up, and the sync is done.
#[test]
fn never_two_batches_then_a_sync() {
    loom_tests::model("journal_writer/never_two_batches_then_a_sync", || {
        model(FsyncPolicy::Never, 2, &[2], &[], false);
    });
}

/// Two batches under `EveryBatch`: both marks move in one step, in one wake-up or two.
#[test]
fn every_batch_two_batches() {
    loom_tests::model("journal_writer/every_batch_two_batches", || {
        model(FsyncPolicy::EveryBatch, 2, &[], &[], false);
    });
}

/// One batch under `Never`, no sync asked: the stop syncs it.
#[test]
fn never_one_batch_synced_by_the_stop() {
    loom_tests::model("journal_writer/never_one_batch_synced_by_the_stop", || {
        model(FsyncPolicy::Never, 1, &[], &[], false);
    });
}

/// The second of two batches fails to append: the writer sets `failed` and wakes the IO
/// thread, which sees it through the wake-up alone; the first batch's mark is never taken
/// for the second's, and the stop hands nothing back.
#[test]
fn a_failed_append_is_reported_by_a_wake_up() {
    loom_tests::model(
        "journal_writer/a_failed_append_is_reported_by_a_wake_up",
        || {
            let written = Arc::new(Mutex::new(Written::default()));
            let store = ModelStore {
                fail_at: Some(2),
                not_inline: &[1, 2],
                ..ModelStore::new(FsyncPolicy::Never, &written)
            };
            let (writer, wake) = start(store);
            writer.submit(1, batch(1));
            writer.submit(2, batch(2));
            fails_and_stops(writer, &wake, &written, |m| {
                assert!(m.appended < 2, "the failed batch marked appended: {m:?}")
            });
        },
    );
}

/// Three batches under `Never`, the second refused inline (it would roll a segment): the
/// first is appended by the IO thread, the second by the writer, the third by whichever
/// finds the journal first (queued behind the second while it waits or while the writer
/// holds the journal); the store checks that they land in order, once each; a sync
/// follows.
#[test]
fn never_inline_and_handed_over_batches_stay_in_order() {
    loom_tests::model(
        "journal_writer/never_inline_and_handed_over_batches_stay_in_order",
        || {
            model(FsyncPolicy::Never, 3, &[3], &[2], false);
        },
    );
}

/// Two batches under `Interval`: the writer's wait reads the journal (when its sync is
/// due), so the IO thread may find it busy and hand a batch over; a batch appended inline
/// into a synced journal wakes the writer, which owes it a sync; the stop syncs it all.
#[test]
fn interval_inline_appends_and_a_busy_journal() {
    loom_tests::model(
        "journal_writer/interval_inline_appends_and_a_busy_journal",
        || {
            model(
                FsyncPolicy::Interval(Duration::from_millis(5)),
                2,
                &[],
                &[],
                false,
            );
        },
    );
}

/// The IO thread's own append of batch 1 fails: `submit` says the marks moved, they say
/// `failed` (batch 1 never marked); batch 2 then goes to the writer, which appends nothing
/// more and stops with nothing to hand back.
#[test]
fn a_failed_inline_append_stops_the_writer() {
    loom_tests::model(
        "journal_writer/a_failed_inline_append_stops_the_writer",
        || {
            let written = Arc::new(Mutex::new(Written::default()));
            let store = ModelStore {
                fail_at: Some(1),
                ..ModelStore::new(FsyncPolicy::Never, &written)
            };
            let writer = JournalWriter::start("model", store, Box::new(|| {})).expect("start");
            if writer.submit(1, batch(1)) {
                let m = checked(&writer, &written);
                assert!(m.failed && m.appended == 0, "{m:?}");
            }
            writer.submit(2, batch(2));
            assert!(
                writer.stop().is_none(),
                "a failed journal hands nothing back"
            );
            assert_eq!(
                written.lock().unwrap().appended,
                0,
                "nothing after the failure"
            );
        },
    );
}

/// Under `Never`, a sync is asked for after each of two batches: the IO thread's inline
/// append of batch 2 may land while the writer's sync of batch 1 runs outside the
/// journal's lock. That sync never publishes `synced` past what it covered (the store
/// checks the mark against what reached the disk), and batch 2 gets a sync of its own.
#[test]
fn never_an_inline_append_races_a_sync_in_flight() {
    loom_tests::model(
        "journal_writer/never_an_inline_append_races_a_sync_in_flight",
        || {
            model(FsyncPolicy::Never, 2, &[1, 2], &[], false);
        },
    );
}

/// Under `Interval` with the interval always passed: each batch appended inline into a
/// synced journal wakes the writer, which syncs it outside the lock while the next one may
/// be appended; every batch ends up synced without a request.
#[test]
fn interval_due_syncs_run_while_the_io_thread_appends() {
    loom_tests::model(
        "journal_writer/interval_due_syncs_run_while_the_io_thread_appends",
        || {
            model(
                FsyncPolicy::Interval(Duration::from_millis(5)),
                2,
                &[],
                &[],
                true,
            );
        },
    );
}

/// Batch 2 fails in the writer (it is refused inline) while the IO thread goes on to batch
/// 3, which it would append inline if the journal looked healthy: `failed` is set before
/// the writer lets go of the journal, so batch 3 never lands behind the hole (the store's
/// order check) and `appended` never passes batch 1.
#[test]
fn no_inline_append_lands_after_a_failed_append() {
    loom_tests::model(
        "journal_writer/no_inline_append_lands_after_a_failed_append",
        || {
            let written = Arc::new(Mutex::new(Written::default()));
            let store = ModelStore {
                fail_at: Some(2),
                not_inline: &[2],
                ..ModelStore::new(FsyncPolicy::Never, &written)
            };
            let (writer, wake) = start(store);
            for n in 1..=3 {
                writer.submit(n, batch(n));
                let m = checked(&writer, &written);
                assert!(m.appended < 2, "a batch marked past the failed one: {m:?}");
            }
            fails_and_stops(writer, &wake, &written, |m| {
                assert!(m.appended < 2, "a batch marked past the failed one: {m:?}")
            });
        },
    );
}

/// Under `Never`, a sync is asked for batch 1 and fails (outside the journal's lock),
/// while the IO thread may append batch 2 inline: the writer sets `failed` and wakes the
/// IO thread, `synced` never moves, and the stop hands nothing back.
#[test]
fn a_failed_sync_is_reported_and_never_marked() {
    loom_tests::model(
        "journal_writer/a_failed_sync_is_reported_and_never_marked",
        || {
            let written = Arc::new(Mutex::new(Written::default()));
            let store = ModelStore {
                fail_sync: true,
                ..ModelStore::new(FsyncPolicy::Never, &written)
            };
            let (writer, wake) = start(store);
            writer.submit(1, batch(1));
            writer.sync(1);
            writer.submit(2, batch(2));
            fails_and_stops(writer, &wake, &written, |m| {
                assert_eq!(m.synced, 0, "a failed sync marked: {m:?}")
            });
        },
    );
}

/// The IO thread's state as the model's turns see it: the writer, and the number the next
/// batch gets.
type Turns = Mutex<(JournalWriter<ModelStore>, u64)>;

/// One turn: takes the state (as a turn holds the IO thread's state, alone), cuts the next
/// batch and submits it, and checks the marks it reads.
fn turn(state: &Turns, written: &Mutex<Written>) {
    let mut s = state.lock().unwrap();
    let n = s.1;
    s.1 += 1;
    let inline = s.0.submit(n, batch(n));
    let m = checked(&s.0, written);
    if inline {
        assert!(m.appended >= n, "appended inline, yet not marked: {m:?}");
    }
}

/// Under `Never`, a requester's driven turn and the IO thread's own turn each cut a batch:
/// they hold the IO thread's state one after the other (a mutex stands for the shipping
/// `Parking` here, whose hand-over `handoff.rs` models), so the writer is handed batches
/// from two threads in turn. What this checks is `submit`'s side: nothing in it assumes
/// one calling thread, given turns that do not overlap. Batch 1, whoever cuts it, is refused inline (it would roll a
/// segment) and goes to the writer; batch 2, from the other thread, is appended inline only
/// once batch 1 is (the store checks the order), and every mark reaches the IO thread.
#[test]
fn turns_on_two_threads_submit_in_order() {
    loom_tests::model(
        "journal_writer/turns_on_two_threads_submit_in_order",
        || {
            let written = Arc::new(Mutex::new(Written::default()));
            let store = ModelStore {
                not_inline: &[1],
                ..ModelStore::new(FsyncPolicy::Never, &written)
            };
            let (writer, wake) = start(store);
            let state: Arc<Turns> = Arc::new(Mutex::new((writer, 1)));
            let requester = {
                let (state, written) = (state.clone(), written.clone());
                loom::thread::spawn(move || turn(&state, &written))
            };
            turn(&state, &written);
            requester.join().unwrap();
            loop {
                let m = checked(&state.lock().unwrap().0, &written);
                assert!(!m.failed);
                if m.appended == 2 {
                    break;
                }
                wake.wait();
            }
            let Ok(state) = Arc::try_unwrap(state) else {
                panic!("the requester's turn has ended");
            };
            let (writer, _) = state.into_inner().unwrap();
            let store = writer.stop().expect("the store back");
            let w = store.written.lock().unwrap();
            assert_eq!(
                (w.appended, w.synced),
                (2, 2),
                "the stop appends and syncs all"
            );
        },
    );
}
