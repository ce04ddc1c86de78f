//! Loom models of cohort's concurrency invariants. The models live in `tests/`; this crate
//! only holds what they share.
//!
//! Run them with
//!
//! ```text
//! RUSTFLAGS="--cfg loom --cfg cohort_internals" LOOM_MAX_PREEMPTIONS=2 cargo test -p loom-tests --release
//! ```
//!
//! Under `--cfg loom` the `cohort` dependency is built on loom's primitives (its
//! `src/sync` facade swaps them in), so the models check the code that ships. Without the
//! cfg every test file compiles to nothing.
//!
//! | model | shipping code |
//! |---|---|
//! | `member_queue.rs` | `deliver::MemberQueue`, with a plain and a journalling sink |
//! | `oob_queue.rs` | `deliver::OobQueue` |
//! | `pool.rs` | `deliver::TaskQueue`, `deliver::Pool` |
//! | `handoff.rs` | `handoff::{Handoff, Scheduled, SpinGate, Parking}`, `peer::Outbox` |
//! | `recv_credit.rs` | `flow::RecvCredit`, `deliver::PeerCreditSink`, `handoff::Handoff` |
//! | `progress.rs` | `deliver::Progress` |
//! | `window.rs` | `flow::SendWindow` |
//! | `writer.rs` | `peer::{Outbox, Ledger}`, `flow::SendWindow` |
//! | `commands.rs` | `handoff::{Commands, Completion}` |
//! | `requests.rs` | `peer::Requests` |
//! | `journal_writer.rs` | `journal::JournalWriter` (on a model `Store`) |
//! | `inbox.rs` | `deliver::{Inbox, Pool, MemberQueue}` |
//! | `peer_map.rs` | `peer::{admit, forget}` (through `internals::peer::Map`), `peer::Outbox` |
//!
//! Shared here: `model` (runs a model and prints its iteration count), and the IO thread
//! as the hand-off models see it — `ModelWaker` (its waker and poll), `io_loop` and
//! `io_loop_spinning` (its loop: `SpinGate::before_poll`, poll, `take_wake`, a turn) and
//! `Requesters` (the last requester stops the loop). The loop's steps are the shipping
//! ones (`cohort::internals::handoff::{Handoff, SpinGate}`, as `IoThread::run` and its
//! `Spin` call them); only the poll is the model's.

/// Runs `f` under [`loom::model`], counting the interleavings loom explores.
///
/// The preemption bound comes from `LOOM_MAX_PREEMPTIONS`; when it is unset it defaults to
/// 2 (what CI uses) rather than loom's unbounded search, so a bare `cargo test` under
/// `--cfg loom` finishes. Prints `loom model NAME: N iterations` (visible with
/// `--nocapture`) and returns the count; panics if loom explored nothing.
#[cfg(loom)]
pub fn model<F>(name: &str, f: F) -> usize
where
    F: Fn() + Sync + Send + 'static,
{
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let iterations = Arc::new(AtomicUsize::new(0));
    let counter = iterations.clone();
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    let started = std::time::Instant::now();
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f();
    });
    let n = iterations.load(Ordering::Relaxed);
    println!(
        "loom model {name}: {n} iterations in {:.2?} (preemption bound {:?})",
        started.elapsed(),
        builder.preemption_bound
    );
    assert!(n > 0, "loom model {name} explored no interleaving");
    n
}

/// The IO thread's mio `Waker` and `poll`, as a model sees them: a `wake` makes the next
/// (or current) [`poll`](ModelWaker::poll) return, several wakes before a poll make it
/// return once (an eventfd), and nothing else does — no timeout, no socket — so a request
/// that relies on anything but its own wake-up to be seen is stranded, and the model says
/// so. [`stop`](ModelWaker::stop) ends the IO thread's loop once every requester is done.
#[cfg(loom)]
#[derive(Debug, Default)]
pub struct ModelWaker {
    state: loom::sync::Mutex<WakerState>,
    cv: loom::sync::Condvar,
}

#[cfg(loom)]
#[derive(Debug, Default)]
struct WakerState {
    woken: bool,
    stopped: bool,
    /// `wake` calls so far.
    calls: usize,
}

/// What [`ModelWaker::poll`] returned.
#[cfg(loom)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Polled {
    /// A `wake` since the last poll.
    Woken,
    /// No wake, and the model stopped the loop.
    Stopped,
}

#[cfg(loom)]
impl ModelWaker {
    /// Not woken, not stopped.
    pub fn new() -> std::sync::Arc<ModelWaker> {
        std::sync::Arc::new(ModelWaker::default())
    }

    /// The waker to hand to `cohort::internals::handoff::Handoff::new`.
    pub fn waker(self: &std::sync::Arc<Self>) -> Box<dyn cohort::internals::handoff::Wake> {
        Box::new(WakerHandle(self.clone()))
    }

    /// Blocks until woken (preferred) or stopped.
    pub fn poll(&self) -> Polled {
        let mut g = self.state.lock().unwrap();
        while !g.woken && !g.stopped {
            g = self.cv.wait(g).unwrap();
        }
        if std::mem::take(&mut g.woken) {
            Polled::Woken
        } else {
            Polled::Stopped
        }
    }

    /// A poll that does not block (the IO thread spins): whether a `wake` came since the
    /// last poll (and clears it, as a poll drains the eventfd).
    pub fn poll_now(&self) -> bool {
        std::mem::take(&mut self.state.lock().unwrap().woken)
    }

    /// Ends the IO thread's loop at its next poll that finds no wake-up.
    pub fn stop(&self) {
        self.state.lock().unwrap().stopped = true;
        self.cv.notify_one();
    }

    /// `wake` calls so far.
    pub fn calls(&self) -> usize {
        self.state.lock().unwrap().calls
    }
}

#[cfg(loom)]
struct WakerHandle(std::sync::Arc<ModelWaker>);

#[cfg(loom)]
impl cohort::internals::handoff::Wake for WakerHandle {
    fn wake(&self) -> std::io::Result<()> {
        let mut g = self.0.state.lock().unwrap();
        g.calls += 1;
        g.woken = true;
        drop(g);
        self.0.cv.notify_one();
        Ok(())
    }
}

/// The IO thread's loop (`IoThread::run` in `src/net/io.rs`) reduced to its requests,
/// without a spin: poll (blocking); if [`take_wake`](cohort::internals::handoff::Handoff::take_wake)
/// finds a wake-up pending, run `turn` (take the lists and answer them); until the waker is
/// stopped. Returns how many turns ran.
#[cfg(loom)]
pub fn io_loop(
    handoff: &cohort::internals::handoff::Handoff,
    waker: &ModelWaker,
    turn: impl FnMut(),
) -> usize {
    io_loop_spinning(handoff, waker, 0, turn)
}

/// The IO thread's loop with its spin, reduced to its requests: before each poll the
/// shipping [`SpinGate::before_poll`](cohort::internals::handoff::SpinGate::before_poll)
/// (as `Spin::keep` calls it) is told whether the thread spins and says whether the poll
/// must not block; then the poll (the model's: [`ModelWaker::poll_now`] or
/// [`ModelWaker::poll`]); then a turn if
/// [`take_wake`](cohort::internals::handoff::Handoff::take_wake) finds a wake-up pending.
/// The thread spins for `episodes` episodes of one poll each, as the IO thread does: the
/// first before its first poll, each later one after a turn that found work (`Spin::active`).
/// Ends when a blocking poll finds the waker stopped. Returns how many turns ran.
#[cfg(loom)]
pub fn io_loop_spinning(
    handoff: &cohort::internals::handoff::Handoff,
    waker: &ModelWaker,
    mut episodes: usize,
    mut turn: impl FnMut(),
) -> usize {
    let mut gate = cohort::internals::handoff::SpinGate::new();
    let mut turns = 0;
    // Whether the IO thread would spin now: at the start, and after a turn with work.
    let mut active = true;
    loop {
        let was_spinning = gate.is_spinning();
        // One poll per episode: an episode in progress ends at the next poll.
        let spin = !was_spinning && active && episodes > 0;
        if spin {
            episodes -= 1;
        }
        let nonblocking = gate.before_poll(handoff, spin);
        if nonblocking {
            waker.poll_now();
        } else if waker.poll() == Polled::Stopped {
            return turns;
        }
        let woken = handoff.take_wake();
        if was_spinning && !spin && nonblocking {
            // `spin_end` reported a request, and only this thread clears the pending bit.
            assert!(woken, "spin_end saw a request take_wake missed");
        }
        active = woken;
        if woken {
            turns += 1;
            turn();
        }
    }
}

/// The requesters of a model (senders, pool threads): each calls
/// [`done`](Requesters::done) when it has made its last request; the last one stops the IO
/// thread's loop (every wake-up they made came before the stop, so the loop sees them all).
/// No thread of its own, so no interleavings of its own.
#[cfg(loom)]
#[derive(Debug)]
pub struct Requesters {
    left: loom::sync::atomic::AtomicUsize,
    waker: std::sync::Arc<ModelWaker>,
}

#[cfg(loom)]
impl Requesters {
    /// `n` requesters, stopping `waker` when all are done.
    pub fn new(n: usize, waker: &std::sync::Arc<ModelWaker>) -> std::sync::Arc<Requesters> {
        std::sync::Arc::new(Requesters {
            left: loom::sync::atomic::AtomicUsize::new(n),
            waker: waker.clone(),
        })
    }

    /// This requester has made its last request.
    pub fn done(&self) {
        // AcqRel: every requester's wake-ups happen-before the last one's stop.
        if self.left.fetch_sub(1, loom::sync::atomic::Ordering::AcqRel) == 1 {
            self.waker.stop();
        }
    }
}
