//! What tests send and what their handlers do with it: numbered payloads, a handler that
//! checks each sender's order, one that counts, one that checks a journalling sender's
//! records came first, and a gate a handler can be held on.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use cohort::{Delivery, DeliveryRef, RecordKind};

/// A test payload: `counter` as 8 little-endian bytes, padded with a byte pattern derived
/// from the counter to `size` bytes (at least 8).
pub(crate) fn payload(counter: u64, size: usize) -> Vec<u8> {
    let mut v = vec![(counter % 251) as u8; size.max(8)];
    v[..8].copy_from_slice(&counter.to_le_bytes());
    v
}

/// The counter of a [`payload`], after checking the padding is intact.
pub(crate) fn counter_of(bytes: &[u8]) -> Result<u64, String> {
    if bytes.len() < 8 {
        return Err(format!("payload of {} bytes has no counter", bytes.len()));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if bytes[8..].iter().any(|&b| b != (n % 251) as u8) {
        return Err(format!("payload {n} is corrupt"));
    }
    Ok(n)
}

/// What one receiver saw from one sender.
#[derive(Debug, Default, Clone)]
struct Track {
    /// The counter expected next.
    next: u64,
    /// Sequence number of the last regular message.
    last_seq: u64,
}

/// Checks, inside a handler, that each sender's regular messages arrive complete and in
/// order: payload counters 0, 1, 2, … and `Delivery::seq()` 1, 2, 3, … (one more per regular
/// message). Violations are recorded, not panicked on (a panic in a handler is caught by the
/// pool), and asserted by [`OrderCheck::assert_ok`].
#[derive(Debug, Default)]
pub(crate) struct OrderCheck {
    per_sender: Mutex<HashMap<String, Track>>,
    errors: Mutex<Vec<String>>,
    total: AtomicU64,
}

impl OrderCheck {
    /// A fresh, shareable checker.
    pub(crate) fn new() -> Arc<OrderCheck> {
        Arc::new(OrderCheck::default())
    }

    /// A handler that records every delivery: `builder.on_message(check.handler())`.
    pub(crate) fn handler(self: &Arc<Self>) -> impl Fn(Delivery) + Send + Sync + 'static {
        let check = self.clone();
        move |d: Delivery| check.record(&d)
    }

    /// A handler that records every message, lent:
    /// `builder.on_message_ref(check.lent_handler())`.
    pub(crate) fn lent_handler(
        self: &Arc<Self>,
    ) -> impl Fn(DeliveryRef<'_>) + Send + Sync + 'static {
        let check = self.clone();
        move |m: DeliveryRef<'_>| check.record_parts(m.from(), m.payload(), m.seq(), m.is_oob())
    }

    /// Records one delivery.
    pub(crate) fn record(&self, d: &Delivery) {
        self.record_parts(d.from(), d.payload(), d.seq(), d.is_oob());
    }

    /// Records one message: from `from`, `payload`, sequence number `seq`, out of band or
    /// not.
    pub(crate) fn record_parts(&self, from: &str, payload: &[u8], seq: Option<u64>, oob: bool) {
        let mut map = self.per_sender.lock().unwrap();
        let t = map.entry(from.to_owned()).or_default();
        let problem = match counter_of(payload) {
            Err(e) => Some(format!("from {from}: {e}")),
            Ok(_) if oob => Some(format!("from {from}: unexpected OOB message")),
            Ok(n) if n != t.next => Some(format!(
                "from {from}: counter {n}, expected {} (out of order, lost or duplicated)",
                t.next
            )),
            Ok(n) if seq != Some(t.last_seq + 1) => Some(format!(
                "from {from}: message {n} has seq {seq:?}, expected Some({})",
                t.last_seq + 1
            )),
            Ok(_) => None,
        };
        if let Ok(n) = counter_of(payload) {
            t.next = n + 1;
        }
        if let Some(s) = seq {
            t.last_seq = s;
        }
        // Counted, and its problem noted, before the sender's entry is let go (`map` lives
        // to the end): whoever reads that entry's count (`count_from`) and then `total` or
        // the problems finds this message in each.
        self.total.fetch_add(1, Ordering::SeqCst);
        if let Some(p) = problem {
            let mut errors = self.errors.lock().unwrap();
            if errors.len() < 20 {
                errors.push(p);
            }
        }
    }

    /// Messages recorded so far, all senders.
    pub(crate) fn total(&self) -> u64 {
        self.total.load(Ordering::SeqCst)
    }

    /// Messages recorded from `sender` (the next counter expected from it).
    pub(crate) fn count_from(&self, sender: &str) -> u64 {
        self.per_sender
            .lock()
            .unwrap()
            .get(sender)
            .map_or(0, |t| t.next)
    }

    /// Panics if any delivery was out of order, lost, duplicated or corrupt.
    pub(crate) fn assert_ok(&self) {
        let errors = self.errors.lock().unwrap();
        assert!(errors.is_empty(), "order violations: {errors:#?}");
    }

    /// Asserts that this receiver (`me`) got exactly `count` messages from each of
    /// `senders`, complete and in order, and nothing else: none lost, none twice.
    pub(crate) fn assert_got_exactly(&self, me: &str, senders: &[&str], count: u64) {
        self.assert_ok();
        for from in senders {
            assert_eq!(self.count_from(from), count, "{me} from {from}");
        }
        assert_eq!(
            self.total(),
            count * senders.len() as u64,
            "{me}: nothing extra, nothing twice"
        );
    }
}

/// Counts the messages a handler is given.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// A fresh, shareable counter at zero.
    pub(crate) fn new() -> Arc<Counter> {
        Arc::new(Counter::default())
    }

    /// A handler that counts every delivery: `builder.on_message(got.handler())`.
    pub(crate) fn handler(self: &Arc<Self>) -> impl Fn(Delivery) + Send + Sync + 'static {
        let counter = self.clone();
        move |_: Delivery| counter.add()
    }

    /// Counts one.
    pub(crate) fn add(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    /// The count so far.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Back to zero.
    pub(crate) fn reset(&self) {
        self.0.store(0, Ordering::SeqCst);
    }
}

/// A gate a handler can wait on until the test opens it.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    open: Mutex<bool>,
    cond: Condvar,
}

impl Gate {
    /// A closed gate.
    pub(crate) fn new() -> Arc<Gate> {
        Arc::new(Gate::default())
    }

    /// Blocks until the gate is open.
    pub(crate) fn pass(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cond.wait(open).unwrap();
        }
    }

    /// Opens the gate for good.
    pub(crate) fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cond.notify_all();
    }
}

/// A receiver's check that each reliable message of a journalling sender reaches it only
/// once the sender's journal files hold its record: its handler reads the journal at each
/// delivery (meant for one message in flight at a time) and notes every message that came
/// before its record, and counts the deliveries.
#[derive(Debug, Default)]
pub(crate) struct RecordsFirst {
    early: Mutex<Vec<String>>,
    got: AtomicU64,
}

impl RecordsFirst {
    /// No delivery yet.
    pub(crate) fn new() -> Arc<RecordsFirst> {
        Arc::new(RecordsFirst::default())
    }

    /// The receiver's handler, reading the sender's journal in `dir`.
    pub(crate) fn handler(
        self: &Arc<Self>,
        dir: &Path,
    ) -> impl Fn(Delivery) + Send + Sync + 'static {
        let (check, dir): (Arc<Self>, PathBuf) = (self.clone(), dir.to_path_buf());
        move |d: Delivery| {
            let seq = d.seq().expect("reliable message");
            match cohort::inspect_journal(&dir) {
                Ok(report) => {
                    let held: u64 = report
                        .segments
                        .iter()
                        .filter_map(|s| s.records.get(&RecordKind::Message))
                        .sum();
                    if held < seq {
                        check.early(format!("message {seq} arrived with {held} in the journal"));
                    }
                }
                Err(e) => check.early(format!("message {seq}: inspect: {e}")),
            }
            check.got.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn early(&self, what: String) {
        self.early.lock().unwrap().push(what);
    }

    /// Deliveries so far.
    pub(crate) fn got(&self) -> u64 {
        self.got.load(Ordering::SeqCst)
    }

    /// Panics, naming `case`, if a message came before its record.
    pub(crate) fn assert_records_first(&self, case: &str) {
        let early = self.early.lock().unwrap();
        assert!(early.is_empty(), "{case}: {early:?}");
    }
}
