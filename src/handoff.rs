//! The hand-off from application and pool threads to the IO thread: the lists of peers it
//! must look at, and one wake-up per batch of requests.
//!
//! - A sender pushes to a peer's outbox, then [`Handoff::schedule`]s the peer: unless its
//!   [`Scheduled`] flag is already set, the peer goes on the ready list and the doorbell
//!   rings. The IO thread, woken, [`take_wake`](Handoff::take_wake)s, takes the list
//!   ([`take_ready`](Handoff::take_ready)), and for each peer clears the flag *before* it
//!   takes the outbox ([`Scheduled::clear_then`], in `Peer::publish`). So a message pushed
//!   to the outbox is either taken by that drain, or its sender finds the flag cleared and
//!   schedules the peer again.
//! - A pool thread whose consumption crossed half a receive window (or brought a paused
//!   sender back within it) asks for the credit to go back through its queue's
//!   [`PeerCreditSink`](crate::deliver::PeerCreditSink): `RecvCredit::request_flush`
//!   de-duplicates the request, the peer goes on the credit list
//!   ([`request_credit`](Handoff::request_credit)), the doorbell rings.
//! - The doorbell ([`Handoff::ring`]) wakes the IO thread (its mio `Waker`, behind the
//!   [`Wake`] trait so that a model can stand in for it) only when no wake-up is pending
//!   since the IO thread last took one: one `wake` call (a syscall) per batch of requests,
//!   not per message. While the IO thread spins (it polls without blocking for a while
//!   after some work, when the node is set to: [`spin_begin`](Handoff::spin_begin) to
//!   [`spin_end`](Handoff::spin_end)) the doorbell makes no call at all: the spinning
//!   thread sees the pending wake-up at its next turn.
//!
//! Invariants (loom model: `loom-tests/tests/handoff.rs`): a request pushed to a list is
//! taken by a turn of the IO thread that a wake-up or a spin started — never stranded —
//! and the IO thread is woken at most once per [`take_wake`](Handoff::take_wake) that
//! finds a wake-up pending.
//!
//! Public so that the loom models check this code rather than a copy; it is not meant for
//! applications.

use crate::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use crate::sync::Mutex;

/// Wakes the thread that takes a [`Handoff`]'s lists: the IO thread's mio `Waker` (a
/// model's stand-in under loom).
pub trait Wake: Send + Sync {
    /// Makes the IO thread's next (or current) poll return.
    fn wake(&self) -> std::io::Result<()>;
}

impl Wake for mio::Waker {
    fn wake(&self) -> std::io::Result<()> {
        mio::Waker::wake(self)
    }
}

/// Set while a peer is on the IO thread's ready list, or the IO thread holds it back
/// (socket backed up: its writable event resumes the peer): senders then do not schedule
/// it again.
#[derive(Debug, Default)]
pub struct Scheduled(AtomicBool);

impl Scheduled {
    /// Not scheduled.
    pub fn new() -> Scheduled {
        Scheduled(AtomicBool::new(false))
    }

    /// A sender, after its push to the outbox: whether it set the flag (and so must put the
    /// peer on the ready list).
    #[inline]
    fn claim(&self) -> bool {
        // Load first: the common case (flag already set) makes no contended write. A
        // compare-exchange, not a swap: it writes nothing when it fails (and loom 0.7 lets
        // a plain store slip inside a swap, tokio-rs/loom#254). What strands nothing is the
        // outbox's lock, not these orderings: the IO thread clears the flag before it locks
        // the outbox, so a push its take missed comes after the clear and this load sees
        // it (coherence). Acquire/AcqRel are more than that needs (the loom model passes
        // with Relaxed); they are the orderings the flag has always had.
        !self.0.load(Ordering::Acquire)
            && self
                .0
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// The IO thread takes what senders pushed (`take`: the peer's outbox), clearing the
    /// flag first: a push that `take` does not see finds the flag clear and schedules the
    /// peer again.
    #[inline]
    pub fn clear_then<R>(&self, take: impl FnOnce() -> R) -> R {
        // Release: more than needed (see `claim`): the lock `take` takes is what orders
        // this store before any push `take` misses.
        self.0.store(false, Ordering::Release);
        take()
    }

    /// The IO thread keeps the peer marked scheduled without listing it (its socket is
    /// backed up; the writable event resumes it), so senders do not wake it for nothing.
    #[inline]
    pub fn hold(&self) {
        // Release: as `clear_then`.
        self.0.store(true, Ordering::Release);
    }

    /// Whether the flag is set.
    #[cfg(any(test, cohort_internals))]
    pub fn is_set(&self) -> bool {
        // Acquire: as `claim`'s load.
        self.0.load(Ordering::Acquire)
    }
}

/// [`Handoff::doorbell`]: a wake-up was requested since the IO thread last took one. Set by
/// the first requester after the IO thread last looked; the IO thread clears it before
/// taking the lists, so a request is either taken or wakes it again.
const PENDING: u8 = 1;
/// [`Handoff::doorbell`]: the IO thread spins (polls without blocking) and looks at
/// [`PENDING`] at every turn, so a requester need not wake it.
const SPINNING: u8 = 2;

/// The IO thread's request lists (peers with new messages, peers whose credit should go
/// back now) and its doorbell.
pub struct Handoff {
    waker: Box<dyn Wake>,
    /// [`PENDING`] and [`SPINNING`], in one word so that every change to either is a
    /// read-modify-write in one modification order: a requester's `ring` and the IO
    /// thread's `spin_end` cannot both miss the other (which two flags would need SeqCst
    /// for, a fence loom does not model).
    doorbell: AtomicU8,
    /// Peers with newly accepted messages.
    // A mutex: pushes are one per peer per batch (the `Scheduled` flag), and the IO thread
    // takes the whole list at once.
    ready: Mutex<Vec<usize>>,
    /// Peers whose receive credit should be returned now.
    // A mutex: one push per flush request (`RecvCredit::request_flush` de-duplicates).
    credit_flush: Mutex<Vec<usize>>,
}

impl std::fmt::Debug for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handoff").finish_non_exhaustive()
    }
}

impl Handoff {
    /// Empty lists, no wake-up pending; `waker` wakes the IO thread.
    pub fn new(waker: Box<dyn Wake>) -> Handoff {
        Handoff {
            waker,
            doorbell: AtomicU8::new(0),
            ready: Mutex::new(Vec::new()),
            credit_flush: Mutex::new(Vec::new()),
        }
    }

    /// Wakes the IO thread unless a wake-up is already pending or the IO thread spins.
    /// Call after pushing the request (a list push, a command, the journal writer's marks).
    pub fn ring(&self) {
        // AcqRel: our push happens-before the IO thread's take of the lists that follows a
        // `take_wake` reading this value. (The lists' lock already orders it: the doorbell's
        // read-modify-writes are totally ordered, so a take whose lock came before our
        // push's also came before our `fetch_or`, which then reads no PENDING and wakes, or
        // reads SPINNING, and the spinner's next `take_wake` or `spin_end` reads our
        // PENDING. The model passes with Relaxed.)
        let was = self.doorbell.fetch_or(PENDING, Ordering::AcqRel);
        if was & (PENDING | SPINNING) == 0 {
            if let Err(e) = self.waker.wake() {
                log::error!("cannot wake the IO thread: {e}");
            }
        }
    }

    /// The IO thread: whether a wake-up was requested since the last call (and clears it).
    /// Call before taking the lists.
    pub fn take_wake(&self) -> bool {
        // AcqRel: Acquire pairs with `ring`'s Release (see there); Release is for the next
        // `ring`, which must find this clear if its push comes after our take.
        self.doorbell.fetch_and(!PENDING, Ordering::AcqRel) & PENDING != 0
    }

    /// The IO thread is about to spin: it polls without blocking and calls
    /// [`take_wake`](Handoff::take_wake) at every turn, so requesters skip the wake-up call
    /// until [`spin_end`](Handoff::spin_end).
    pub fn spin_begin(&self) {
        // Relaxed: only this thread clears the bit, and a requester that misses it wakes
        // the thread, which is merely a call the spin would have saved.
        self.doorbell.fetch_or(SPINNING, Ordering::Relaxed);
    }

    /// The IO thread stops spinning and is about to block: whether a request came in since
    /// its last [`take_wake`](Handoff::take_wake) without waking it — then it must not
    /// block, but take it (its next `take_wake` finds it pending).
    pub fn spin_end(&self) -> bool {
        // AcqRel: as `take_wake`. A `ring` ordered before this read-modify-write saw
        // SPINNING and did not wake: this reads its PENDING; one ordered after it sees no
        // SPINNING and wakes.
        self.doorbell.fetch_and(!SPINNING, Ordering::AcqRel) & PENDING != 0
    }

    /// A sender pushed to peer `id`'s outbox: puts the peer on the ready list and rings,
    /// unless `flag` says it is listed (or held by the IO thread) already.
    #[inline]
    pub fn schedule(&self, id: usize, flag: &Scheduled) {
        if flag.claim() {
            self.ready.lock().push(id);
            self.ring();
        }
    }

    /// Puts peer `id` on the credit list and rings (the caller de-duplicates).
    pub fn request_credit(&self, id: usize) {
        self.credit_flush.lock().push(id);
        self.ring();
    }

    /// The IO thread: the peers scheduled since the last call.
    pub fn take_ready(&self) -> Vec<usize> {
        std::mem::take(&mut *self.ready.lock())
    }

    /// The IO thread: the peers whose credit should go back now.
    pub fn take_credit_flush(&self) -> Vec<usize> {
        std::mem::take(&mut *self.credit_flush.lock())
    }
}
