//! Receiver-side credit: loom models of `cohort::internals::flow::RecvCredit`, with the code that
//! ships.
//!
//! Pool threads call `consumed` (after the handler returns) and, when it says half the
//! sender's window has built up or their queue went idle with credit pending, make a flush
//! request; a request whose `request_flush()` returns `true` is handed to the IO thread,
//! which answers it with a `take` (an ack carrying the credit). The IO thread also takes on
//! its own (acks it writes anyway) and answers a probe with `request_flush` + `take`. This
//! mirrors `PeerCreditSink` (`src/net/mod.rs`) and `send_ack` / the probe arm of
//! `on_frame` (`src/net/io.rs`).
//!
//! Checked, after every thread is joined and every handed-over request answered:
//!
//! - every byte is taken exactly once: sum of takes + final pending == sum consumed;
//! - no byte is left behind (a pool thread that saw credit pending either handed over a
//!   request or found one in flight that a later take answered): pending == 0;
//! - the flush flag is not stuck: a request made after the last take is granted
//!   (`request_flush()` returns `true`), so the next burst's credit is not lost.
//!
//! ## A loom limitation these models ran into
//!
//! loom 0.7 lets a plain `store` slip between the read and the write of a concurrent
//! read-modify-write on the same atomic (tokio-rs/loom#254, #389), so it explores executions
//! the memory model forbids. `RecvCredit::take` therefore clears the flush flag with
//! `swap(false, AcqRel)` rather than `store(false)` (equivalent under the memory model, and
//! checkable by loom), which lets the `*_no_request_lost` models check everything.
#![cfg(loom)]

use cohort::internals::flow::RecvCredit;
use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

struct Shared {
    credit: RecvCredit,
    /// Requests handed to the IO thread (its `credit_flush` list, reduced to a count).
    handed_over: AtomicUsize,
    /// Bytes consumed, summed.
    consumed: AtomicU64,
}

impl Shared {
    fn new(window: u64) -> Arc<Shared> {
        let credit = RecvCredit::new();
        credit.set_window(window);
        // What the consumers below will consume was received first (the IO thread counts
        // it held before any pool thread sees it).
        credit.received(16);
        Arc::new(Shared {
            credit,
            handed_over: AtomicUsize::new(0),
            consumed: AtomicU64::new(0),
        })
    }

    /// `PeerCreditSink::request`.
    fn request(&self) {
        if self.credit.request_flush() {
            self.handed_over.fetch_add(1, Ordering::Release);
        }
    }

    /// `PeerCreditSink::consumed`.
    fn consumed(&self, bytes: u64) {
        self.consumed.fetch_add(bytes, Ordering::Relaxed);
        if self.credit.consumed(0, bytes) {
            self.request();
        }
    }

    /// `PeerCreditSink::idle`.
    fn idle(&self) {
        if self.credit.pending() > 0 {
            self.request();
        }
    }
}

/// The IO thread's side: answers handed-over requests with a take.
struct Io {
    answered: usize,
    taken: u64,
}

impl Io {
    fn answer_requests(&mut self, s: &Shared) {
        let n = s.handed_over.load(Ordering::Acquire);
        while self.answered < n {
            self.taken += s.credit.take();
            self.answered += 1;
        }
    }
}

/// What the model checks at the end: bytes only, or bytes and the flush flag.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Checks {
    /// Every byte taken exactly once.
    Bytes,
    /// Also: nothing left pending, and the flag not stuck (see the module doc).
    All,
}

fn check(s: &Shared, io: &Io, checks: Checks) {
    let consumed = s.consumed.load(Ordering::Relaxed);
    let pending = s.credit.pending();
    assert_eq!(
        io.taken + pending,
        consumed,
        "bytes lost or taken twice: taken {} + pending {pending} != consumed {consumed}",
        io.taken
    );
    if checks == Checks::Bytes {
        return;
    }
    assert_eq!(
        pending, 0,
        "credit left pending with no flush request in flight"
    );
    assert!(
        s.credit.request_flush(),
        "flush flag stuck: a request after the last take would be lost"
    );
}

fn consumer(s: &Arc<Shared>, bursts: &'static [u64]) -> thread::JoinHandle<()> {
    let s = s.clone();
    thread::spawn(move || {
        for &b in bursts {
            s.consumed(b);
        }
        s.idle();
    })
}

/// Window 8 (half 4): two pool threads consume 3 bytes each (the second crosses half
/// unless a take intervened), while the IO thread writes an ack (take) and answers a probe
/// (request_flush + take).
fn consumers_race_ack_and_probe(checks: Checks) {
    let s = Shared::new(8);
    let a = consumer(&s, &[3]);
    let b = consumer(&s, &[3]);
    let mut io = Io {
        answered: 0,
        taken: 0,
    };
    // An ack written for received data carries whatever credit is pending.
    io.taken += s.credit.take();
    io.answer_requests(&s);
    // A probe: answer with every byte held, even below half a window.
    s.credit.request_flush();
    io.taken += s.credit.take();
    a.join().unwrap();
    b.join().unwrap();
    io.answer_requests(&s);
    check(&s, &io, checks);
}

/// Window 2 (half 1): every `consumed` after a take crosses the threshold, so flush
/// requests race the IO thread's takes on every message; one pool thread consumes twice.
fn every_consume_requests_a_flush(checks: Checks) {
    let s = Shared::new(2);
    let a = consumer(&s, &[1, 2]);
    let b = consumer(&s, &[4]);
    let mut io = Io {
        answered: 0,
        taken: 0,
    };
    io.answer_requests(&s);
    io.taken += s.credit.take();
    io.answer_requests(&s);
    a.join().unwrap();
    b.join().unwrap();
    io.answer_requests(&s);
    check(&s, &io, checks);
}

#[test]
fn consumers_race_ack_and_probe_bytes_conserved() {
    loom_tests::model(
        "recv_credit/consumers_race_ack_and_probe_bytes_conserved",
        || consumers_race_ack_and_probe(Checks::Bytes),
    );
}

#[test]
fn every_consume_requests_a_flush_bytes_conserved() {
    loom_tests::model(
        "recv_credit/every_consume_requests_a_flush_bytes_conserved",
        || every_consume_requests_a_flush(Checks::Bytes),
    );
}

#[test]
fn consumers_race_ack_and_probe_no_request_lost() {
    loom_tests::model(
        "recv_credit/consumers_race_ack_and_probe_no_request_lost",
        || consumers_race_ack_and_probe(Checks::All),
    );
}

#[test]
fn every_consume_requests_a_flush_no_request_lost() {
    loom_tests::model(
        "recv_credit/every_consume_requests_a_flush_no_request_lost",
        || every_consume_requests_a_flush(Checks::All),
    );
}

/// A pool thread consumes a message of epoch 0 while the IO thread restarts the stream as
/// epoch 1 (a new incarnation): the old message's credit is either taken before the
/// restart, dropped by it, or refused — never credited to epoch 1, whose window it would
/// over-release.
#[test]
fn a_restart_never_credits_the_new_stream_with_old_messages() {
    loom_tests::model(
        "recv_credit/a_restart_never_credits_the_new_stream_with_old_messages",
        || {
            let credit = Arc::new(RecvCredit::new());
            credit.set_window(8);
            credit.received(5);
            let c = credit.clone();
            let pool = thread::spawn(move || {
                c.consumed(0, 5);
            });
            let before = credit.take();
            let dropped = credit.restart(1);
            pool.join().unwrap();
            let after = credit.take();
            assert_eq!(after, 0, "epoch 1 credited with an epoch-0 message");
            assert!(
                before + dropped <= 5,
                "credit made up: {before} + {dropped}"
            );
            assert_eq!(credit.held(), 0, "the message is no longer held either way");
        },
    );
}

/// The IO thread pauses reading (the sender holds more than its receive window) while a
/// pool thread's consumption brings it back within: the pause and the held count are a
/// Dekker pair, so either the pause sees the consumption (and does not pause), or the
/// consumption sees the pause (and asks to resume, which then succeeds). A connection is
/// never left paused with nothing to resume it.
#[test]
fn a_pause_racing_the_last_consumption_is_always_resumed() {
    loom_tests::model(
        "recv_credit/a_pause_racing_the_last_consumption_is_always_resumed",
        || {
            let credit = Arc::new(RecvCredit::new());
            credit.set_window(8);
            credit.received(10); // 2 over the window
            let c = credit.clone();
            let pool = thread::spawn(move || c.consumed(0, 4));
            let paused = credit.pause();
            let asked = pool.join().unwrap();
            if paused {
                assert!(
                    asked,
                    "paused, back within the window, and nobody asked to resume"
                );
                assert!(credit.resume(), "asked to resume, but resume failed");
            }
            assert!(!credit.is_paused(), "left paused within the window");
        },
    );
}
