//! Receiver-side credit: loom models of `cohort::internals::flow::RecvCredit` and of the path a flush
//! request takes to the IO thread — `cohort::internals::deliver::PeerCreditSink` and
//! `cohort::internals::handoff::Handoff` — with the code that ships.
//!
//! Pool threads report what the application consumed to their queue's `PeerCreditSink` (a
//! peer's member queue and its out-of-band queue each have one, sharing the peer's
//! `RecvCredit` and the node's `Handoff`). When `RecvCredit::consumed` says half the
//! window has built up (or a paused sender is back within it), the sink makes a flush
//! request: `request_flush` de-duplicates it, the peer goes on the credit list, the
//! doorbell rings. Below half nothing is requested (`idle` does nothing): that credit goes
//! back with the IO thread's next ack, probe answer or tick.
//!
//! The IO thread is `loom_tests::io_loop` (poll; if a wake-up is pending, take the lists):
//! it answers each request on the credit list the way `Endpoint::flush_credit` →
//! `Remote::ack` → `Remote::write_ack` does when it writes an ack, with `RecvCredit::take`,
//! and `resume` for a paused peer. Before polling it writes an ack of its own (a `take`)
//! and answers a probe (`Remote::ack` with `force` → `Remote::write_ack`: a `take` if credit is
//! pending, nothing otherwise); after the loop, the housekeeping tick returns residual credit
//! (`Remote::tick`: a `take` when credit is pending).
//!
//! Checked, once the pool threads are done and the IO thread's loop has seen every
//! wake-up:
//!
//! - every byte is taken exactly once: sum of takes + pending == sum consumed; what is
//!   left pending is below half the window (more would have been asked for), and after the
//!   tick nothing is;
//! - no flush request is stranded: the credit list is empty, no wake-up is left pending,
//!   and the flush flag is not stuck (a request after the last take is granted:
//!   `request_flush()` returns `true`), so the next burst's credit is not held back;
//! - the IO thread is woken at most once per batch: every `wake` call is answered by one
//!   turn that found it pending.
//!
//! ## A loom limitation these models ran into
//!
//! loom 0.7 lets a plain `store` slip between the read and the write of a concurrent
//! read-modify-write on the same atomic (tokio-rs/loom#254, #389), so it explores executions
//! the memory model forbids. `RecvCredit::take` therefore clears the flush flag with
//! `swap(false, AcqRel)` rather than `store(false)` (equivalent under the memory model, and
//! checkable by loom).
#![cfg(loom)]

use cohort::internals::deliver::{CreditSink, PeerCreditSink};
use cohort::internals::flow::RecvCredit;
use cohort::internals::handoff::Handoff;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use loom_tests::{io_loop, ModelWaker, Requesters};
use std::sync::Arc;

/// The peer's id on the credit list.
const PEER: usize = 7;

/// One peer's receiving side: its credit, its two queues' sinks, and what they consumed.
struct Receiver {
    credit: Arc<RecvCredit>,
    handoff: Arc<Handoff>,
    /// The member queue's sink and the out-of-band queue's (as `IoShared::new_peer` makes
    /// them).
    sinks: [PeerCreditSink; 2],
    /// Bytes consumed, summed (the model's tally).
    consumed: AtomicU64,
}

impl Receiver {
    /// A receive window of `window` bytes, with `held` bytes received (the IO thread counts
    /// them held before any pool thread sees them).
    fn new(waker: &Arc<ModelWaker>, window: u64, held: u64) -> Arc<Receiver> {
        let credit = Arc::new(RecvCredit::new());
        credit.set_window(window);
        credit.received(held);
        let handoff = Arc::new(Handoff::new(waker.waker()));
        let sink = || PeerCreditSink::new(PEER, credit.clone(), None, handoff.clone());
        Arc::new(Receiver {
            sinks: [sink(), sink()],
            credit,
            handoff,
            consumed: AtomicU64::new(0),
        })
    }
}

/// A pool thread running queue `q` (0: member, 1: out-of-band): reports each burst the
/// application consumed, then goes idle.
fn consumer(
    r: &Arc<Receiver>,
    done: &Arc<Requesters>,
    q: usize,
    bursts: &'static [u64],
) -> thread::JoinHandle<()> {
    let (r, done) = (r.clone(), done.clone());
    thread::spawn(move || {
        for &b in bursts {
            // Relaxed: the model's tally, read after the join.
            r.consumed.fetch_add(b, Ordering::Relaxed);
            r.sinks[q].consumed(0, b);
        }
        r.sinks[q].idle();
        done.done();
    })
}

/// The IO thread's side.
#[derive(Default)]
struct Io {
    taken: u64,
    answered: usize,
}

impl Io {
    /// One turn's credit list: an ack for each peer on it (and a resume).
    fn answer(&mut self, r: &Receiver) {
        for id in r.handoff.take_credit_flush() {
            assert_eq!(id, PEER);
            self.answered += 1;
            self.taken += r.credit.take();
            r.credit.resume();
        }
    }
}

/// The pool threads' bursts race the IO thread's own ack and probe answer; then the IO
/// thread answers flush requests until the pool is done.
fn run(window: u64, bursts: [&'static [u64]; 2]) {
    let held: u64 = bursts.iter().flat_map(|b| b.iter()).sum();
    let waker = ModelWaker::new();
    let r = Receiver::new(&waker, window, held);
    let done = Requesters::new(2, &waker);
    let pool = [
        consumer(&r, &done, 0, bursts[0]),
        consumer(&r, &done, 1, bursts[1]),
    ];
    let mut io = Io::default();
    // An ack written for received data carries whatever credit is pending.
    io.taken += r.credit.take();
    // A probe: answered with every byte held, even below half a window; with nothing
    // held, nothing is written and nothing taken (`Remote::write_ack`).
    if r.credit.pending() > 0 {
        io.taken += r.credit.take();
    }
    let turns = io_loop(&r.handoff, &waker, || io.answer(&r));
    for t in pool {
        t.join().unwrap();
    }

    let consumed = r.consumed.load(Ordering::Relaxed);
    let pending = r.credit.pending();
    assert_eq!(
        io.taken + pending,
        consumed,
        "bytes lost or taken twice: taken {} + pending {pending} != consumed {consumed}",
        io.taken
    );
    assert!(
        r.handoff.take_credit_flush().is_empty(),
        "a flush request stranded on the credit list"
    );
    assert!(!r.handoff.take_wake(), "a wake-up left pending");
    assert_eq!(
        waker.calls(),
        turns,
        "the IO thread was woken {} times for {turns} batches",
        waker.calls()
    );
    assert!(
        pending < (window / 2).max(1),
        "{pending} bytes of credit (half the window or more) left with no flush request"
    );
    assert!(
        r.credit.request_flush(),
        "flush flag stuck: a request after the last take would be lost"
    );
    // The tick: residual credit of an idle sender.
    if r.credit.pending() > 0 {
        io.taken += r.credit.take();
    }
    assert_eq!(io.taken, consumed, "credit left behind after the tick");
}

/// Window 8 (half 4): the member queue's and the out-of-band queue's deliverers consume 3
/// bytes each (the second crosses half unless a take intervened).
#[test]
fn two_queues_cross_half_the_window() {
    loom_tests::model("recv_credit/two_queues_cross_half_the_window", || {
        run(8, [&[3], &[3]]);
    });
}

/// Window 2 (half 1): every consumption after a take crosses the threshold, so flush
/// requests race the IO thread's takes on every message; the member queue consumes twice.
#[test]
fn every_consumption_requests_a_flush() {
    loom_tests::model("recv_credit/every_consumption_requests_a_flush", || {
        run(2, [&[1, 2], &[4]]);
    });
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
/// pool thread's consumption, reported to the shipping sink, brings it back within: the
/// pause and the held count are a Dekker pair, so either the pause sees the consumption
/// (and does not pause), or the consumption sees the pause and asks, through the credit
/// list and the doorbell, to resume — which the IO thread's turn does. A connection is
/// never left paused with nothing to resume it.
#[test]
fn a_pause_racing_the_last_consumption_is_always_resumed() {
    loom_tests::model(
        "recv_credit/a_pause_racing_the_last_consumption_is_always_resumed",
        || {
            let waker = ModelWaker::new();
            // 2 over the window; consuming 3 brings it back within without crossing half
            // the window (4), so only the pause makes the sink ask.
            let r = Receiver::new(&waker, 8, 10);
            let done = Requesters::new(1, &waker);
            let pool = {
                let r = r.clone();
                thread::spawn(move || {
                    r.sinks[0].consumed(0, 3);
                    done.done();
                })
            };
            let _paused = r.credit.pause();
            let mut io = Io::default();
            io_loop(&r.handoff, &waker, || io.answer(&r));
            pool.join().unwrap();
            assert!(
                !r.credit.is_paused(),
                "left paused within the window, nobody asked to resume"
            );
        },
    );
}

/// The housekeeping tick's quiet check (`RecvCredit::settled`, in `Remote::is_quiet`)
/// racing two pool threads' last consumption, through the shipping sinks: a check that
/// finds nothing held and nothing pending is never followed by credit appearing, so a tick
/// put off on its word owes no residual credit. (With the held count taken from before the
/// credit was added, loom finds the check reading `held` 0 and `pending` 0 between the
/// two.)
#[test]
fn a_settled_check_never_misses_consumed_credit() {
    loom_tests::model(
        "recv_credit/a_settled_check_never_misses_consumed_credit",
        || {
            let waker = ModelWaker::new();
            // Below half the window (8): no flush is asked for, only the tick returns it.
            let r = Receiver::new(&waker, 16, 3);
            let pools: Vec<_> = [(0, 1), (1, 2)]
                .into_iter()
                .map(|(sink, bytes)| {
                    let r = r.clone();
                    thread::spawn(move || {
                        r.sinks[sink].consumed(0, bytes);
                    })
                })
                .collect();
            let settled = r.credit.settled();
            for p in pools {
                p.join().unwrap();
            }
            assert_eq!(r.credit.held(), 0);
            if settled {
                assert_eq!(
                    r.credit.pending(),
                    0,
                    "found settled, then credit appeared that no tick will return"
                );
            }
        },
    );
}
