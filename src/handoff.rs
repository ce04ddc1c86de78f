//! The hand-off from application and pool threads to the IO thread: the lists of peers it
//! must look at, and one wake-up per batch of requests.
//!
//! - A sender pushes to a peer's outbox, then [`Handoff::schedule`]s the peer: unless its
//!   [`Scheduled`] flag is already set, the peer goes on the ready list and the doorbell
//!   rings. The IO thread, woken, [`take_wake`](Handoff::take_wake)s, takes the list
//!   ([`take_ready`](Handoff::take_ready)), and for each peer clears the flag *before* it
//!   takes the outbox ([`Scheduled::clear_then`], in `Remote::publish`). So a message pushed
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
//! - While the IO thread blocks in its poll ([`park`](Handoff::park) to
//!   [`unpark`](Handoff::unpark)), the doorbell first asks the waker to run the IO
//!   thread's turn on the requester's own thread ([`Wake::drive`]): the requester takes
//!   the IO thread's state ([`Parking`]) if nobody holds it, and the turn takes the
//!   wake-up and the lists as the IO thread's would. A send then leaves on the sending
//!   thread, with no hand-off to the IO thread (see `IoCore::drive` in `net/io.rs`). Where
//!   the waker declines, the doorbell wakes the IO thread as before; a driven turn that
//!   leaves the IO thread work wakes it after, with a wake-up left pending
//!   ([`pend`](Handoff::pend)).
//!
//! Invariants (loom model: `loom-tests/tests/handoff.rs`): a request pushed to a list is
//! taken by a turn of the IO thread that a wake-up or a spin started, or by a turn a
//! requester drove — never stranded — and a requester's ring wakes the IO thread at most
//! once per [`take_wake`](Handoff::take_wake) that finds a wake-up pending; a driven turn
//! that wakes it after, and [`ring_io`](Handoff::ring_io), may add a call each.
//!
//! Public so that the loom models check this code rather than a copy; it is not meant for
//! applications.

use std::time::Instant;

use crate::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use crate::sync::{wait_until, Condvar, Mutex, MutexGuard};

/// Wakes the thread that takes a [`Handoff`]'s lists: the IO thread's mio `Waker` (a
/// model's stand-in under loom).
pub trait Wake: Send + Sync {
    /// Makes the IO thread's next (or current) poll return.
    fn wake(&self) -> std::io::Result<()>;

    /// The IO thread is parked: runs one turn of it on the calling thread if that may be
    /// done now (nobody holds its state, and the waker's own rules allow it). Returns
    /// whether a turn ran: one that took the pending wake-up
    /// ([`take_wake`](Handoff::take_wake)) and then the lists, and left what it did not
    /// take (commands) to the IO thread with a wake-up pending ([`pend`](Handoff::pend))
    /// and the IO thread woken; so every request pushed before the call is taken.
    /// `false` (the default) leaves the wake-up to [`wake`](Wake::wake). Never blocks: a
    /// turn that cannot start at once does not run.
    fn drive(&self) -> bool {
        false
    }
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

    /// Whether the flag is set: while it is, a sender's push neither lists the peer nor
    /// rings (the IO thread's tick looks at such a peer itself).
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
/// [`Handoff::doorbell`]: the IO thread blocks in its poll, its state free for a requester
/// to drive a turn ([`Wake::drive`]).
const PARKED: u8 = 4;

/// The IO thread's request lists (peers with new messages, peers whose credit should go
/// back now) and its doorbell.
pub struct Handoff {
    waker: Box<dyn Wake>,
    /// [`PENDING`], [`SPINNING`] and [`PARKED`], in one word so that every change to any
    /// is a read-modify-write in one modification order: a requester's `ring` and the IO
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

    /// Wakes the IO thread unless a wake-up is already pending or the IO thread spins;
    /// where the IO thread is parked, the waker may drive its turn here instead
    /// ([`Wake::drive`]). Call after pushing the request (a list push) and letting go of
    /// its lock.
    pub fn ring(&self) {
        self.ring_with(true);
    }

    /// [`ring`](Handoff::ring), but never a driven turn: for a request only the IO thread's
    /// own turn takes (a command).
    pub fn ring_undriven(&self) {
        self.ring_with(false);
    }

    fn ring_with(&self, drive: bool) {
        // AcqRel: our push happens-before the IO thread's take of the lists that follows a
        // `take_wake` reading this value. (The lists' lock already orders it: the doorbell's
        // read-modify-writes are totally ordered, so a take whose lock came before our
        // push's also came before our `fetch_or`, which then reads no PENDING and wakes, or
        // reads SPINNING, and the spinner's next `take_wake` or `spin_end` reads our
        // PENDING. The model passes with Relaxed.)
        let was = self.doorbell.fetch_or(PENDING, Ordering::AcqRel);
        if was & (PENDING | SPINNING) == 0 {
            // A driven turn takes the wake-up we just set, after our push: it takes our
            // request, or leaves it (a command) to the IO thread with a wake-up pending and
            // the thread woken. One that does not run leaves it to the IO thread, woken
            // here. A requester that rings while a driven turn runs either finds our
            // PENDING (the turn's `take_wake` comes after its push: the turn takes it) or
            // finds it taken, fails to drive (the state is held) and wakes the IO thread.
            if drive && was & PARKED != 0 && may_drive() && self.waker.drive() {
                return;
            }
            self.wake_io();
        }
    }

    /// Calls the waker; a failure is logged (the IO thread then sees the request at its
    /// next timer or event).
    fn wake_io(&self) {
        if let Err(e) = self.waker.wake() {
            log::error!("cannot wake the IO thread: {e}");
        }
    }

    /// [`ring`](Handoff::ring), but for what only a turn of the IO thread's own does (the
    /// journal writer's marks, a test's clock moved forward: timeouts to judge): never a
    /// driven turn, and a wake-up call even where one is pending (the turn a pending
    /// wake-up promises may be a requester's), unless the IO thread spins.
    pub fn ring_io(&self) {
        // AcqRel: as `ring`.
        let was = self.doorbell.fetch_or(PENDING, Ordering::AcqRel);
        if was & SPINNING == 0 {
            self.wake_io();
        }
    }

    /// A driven turn that will wake the IO thread once it has let the state go: leaves a
    /// wake-up pending, so that the IO thread's turn takes the requests the driven one left
    /// (commands) and whatever came meanwhile (a requester that finds it pending neither
    /// drives nor wakes: the wake-up that follows covers it).
    pub fn pend(&self) {
        // AcqRel: as `ring`.
        self.doorbell.fetch_or(PENDING, Ordering::AcqRel);
    }

    /// Whether the IO thread blocks in its poll now with no wake-up pending, so that a
    /// request would ask for a driven turn (a test waits for it before a send it means to
    /// see driven).
    #[cfg(cohort_internals)]
    pub fn is_parked(&self) -> bool {
        // Relaxed: a test's hint, read on its own.
        self.doorbell.load(Ordering::Relaxed) & (PARKED | PENDING | SPINNING) == PARKED
    }

    /// The IO thread is about to block in its poll, its state free for a requester to
    /// drive a turn (the caller lets go of it right after).
    pub fn park(&self) {
        // Relaxed: a requester that reads PARKED takes the IO thread's state through its
        // lock (`Wake::drive`), which orders everything the IO thread did before; one that
        // misses it wakes the thread, a call driving would have saved.
        self.doorbell.fetch_or(PARKED, Ordering::Relaxed);
    }

    /// The IO thread's poll returned: requesters wake it again (it takes its state back
    /// right after, waiting for a driven turn that holds it to end).
    pub fn unpark(&self) {
        // Relaxed: as `park`: a requester that still reads PARKED finds the state held, or
        // drives a turn before the IO thread takes it back; either is right.
        self.doorbell.fetch_and(!PARKED, Ordering::Relaxed);
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

std::thread_local! {
    /// Set while this thread holds a lock that a driven turn, or the application's code
    /// it may run, could take (the peer map's, in a look-up): its rings wake the IO thread
    /// instead of driving a turn ([`undriven`]).
    static UNDRIVEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with this thread's rings never driving a turn of the IO thread: for code that
/// holds a lock a driven turn could take (parking_lot's locks are not reentrant).
pub fn undriven<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            let was = self.0;
            let _ = UNDRIVEN.try_with(|u| u.set(was));
        }
    }
    let _restore = Restore(UNDRIVEN.try_with(|u| u.replace(true)).unwrap_or(false));
    f()
}

/// Whether this thread's rings may drive a turn (not inside [`undriven`]; a thread whose
/// thread-locals are gone does not).
fn may_drive() -> bool {
    UNDRIVEN.try_with(|u| !u.get()).unwrap_or(false)
}

/// Where the IO thread keeps its state (`T`: `net::IoCore`): in its loop's hands while it
/// turns, free while it blocks in its poll ([`Held::park`]), when a requester whose
/// doorbell finds it parked may take it for one turn of its own ([`Parking::drive`], what
/// [`Wake::drive`] calls). Empty before the IO thread puts its state in
/// ([`hold`](Parking::hold)) and once it has taken it out to stop ([`Held::take`]).
///
/// A driven turn and the IO thread's own never overlap (the lock), and a driven turn runs
/// only between [`Held::park`]'s letting go and its taking back: the IO thread's loop never
/// finds its state changed under it in the middle of a turn. Loom model:
/// `loom-tests/tests/handoff.rs`, the `driven_*` models.
#[derive(Debug)]
pub struct Parking<T> {
    slot: Mutex<Slot<T>>,
}

#[derive(Debug)]
struct Slot<T> {
    state: Option<T>,
    /// The IO thread blocks in its poll (set and cleared under the lock, by [`Held::park`]).
    parked: bool,
}

impl<T> Default for Parking<T> {
    fn default() -> Self {
        Parking::new()
    }
}

impl<T> Parking<T> {
    /// Empty.
    pub fn new() -> Parking<T> {
        Parking {
            slot: Mutex::new(Slot {
                state: None,
                parked: false,
            }),
        }
    }

    /// The IO thread, as it starts: puts `state` in and holds it.
    pub fn hold(&self, state: T) -> Held<'_, T> {
        let mut slot = self.slot.lock();
        slot.state = Some(state);
        slot.parked = false;
        Held {
            parking: self,
            slot: Some(slot),
        }
    }

    /// A requester: runs `turn` on the state if the IO thread is parked and nobody else
    /// holds the state now; returns what `turn` returned, or `None` where it did not run.
    /// Never blocks; the state is let go before this returns.
    pub fn drive<R>(&self, turn: impl FnOnce(&mut T) -> R) -> Option<R> {
        // The IO thread's (back from its poll), or another's turn: `None`.
        let mut slot = self.slot.try_lock()?;
        if !slot.parked {
            return None;
        }
        slot.state.as_mut().map(turn)
    }
}

/// The IO thread's hold on its state ([`Parking::hold`]).
#[derive(Debug)]
pub struct Held<'a, T> {
    parking: &'a Parking<T>,
    /// `None` only inside [`park`](Held::park).
    slot: Option<MutexGuard<'a, Slot<T>>>,
}

impl<T> Held<'_, T> {
    /// The state, while it is in (`None` once taken out).
    pub fn state(&mut self) -> Option<&mut T> {
        self.slot.as_mut().and_then(|s| s.state.as_mut())
    }

    /// Blocks in `poll` with the state free for requesters' turns: marks it parked, and
    /// the doorbell ([`Handoff::park`]), lets it go, polls, then takes it back, waiting for
    /// a driven turn that holds it to end.
    pub fn park<R>(&mut self, handoff: &Handoff, poll: impl FnOnce() -> R) -> R {
        if let Some(slot) = self.slot.as_mut() {
            slot.parked = true;
        }
        handoff.park();
        drop(self.slot.take());
        let polled = poll();
        handoff.unpark();
        let mut slot = self.parking.slot.lock();
        slot.parked = false;
        self.slot = Some(slot);
        polled
    }

    /// The IO thread, as it stops: takes the state out, so that no requester drives a turn
    /// of a stopped node.
    pub fn take(mut self) -> Option<T> {
        self.slot.as_mut().and_then(|s| s.state.take())
    }
}

/// The IO thread's side of its spin ([`Handoff::spin_begin`] to [`Handoff::spin_end`]):
/// before each poll it says whether it means to spin, and learns whether that poll must not
/// block. Used by the IO thread's idle strategy (`Spin` in `net/io.rs`) and by the loom
/// models' IO thread, so both run this code.
#[derive(Debug, Default)]
pub struct SpinGate {
    /// The doorbell knows we spin.
    spinning: bool,
}

impl SpinGate {
    /// Not spinning.
    pub fn new() -> SpinGate {
        SpinGate::default()
    }

    /// Before a poll: `spin` says whether the IO thread spins now (polls without blocking).
    /// Returns whether the poll must not block: it spins, or it has just stopped and a
    /// request came in meanwhile without a wake-up call (its next
    /// [`take_wake`](Handoff::take_wake) finds it pending).
    pub fn before_poll(&mut self, handoff: &Handoff, spin: bool) -> bool {
        if spin {
            if !self.spinning {
                handoff.spin_begin();
                self.spinning = true;
            }
            true
        } else if self.spinning {
            self.spinning = false;
            handoff.spin_end()
        } else {
            false
        }
    }

    /// Whether the doorbell was told the IO thread spins.
    pub fn is_spinning(&self) -> bool {
        self.spinning
    }
}

/// The commands other threads hand the IO thread (`net::Command`: add or remove a peer, a
/// barrier, a journal sync, shutdown), in order. The IO thread takes them after a wake-up
/// ([`take`](Commands::take)) and, as it stops, closes the queue ([`close`](Commands::close)):
/// it gets back what is left, which no turn will handle, and every later
/// [`push`](Commands::push) is refused. So a command is handled by a turn, handed back by
/// the close, or refused at its push — exactly one of the three — and a caller waiting on
/// its [`Completion`] is woken once whichever it is (loom model:
/// `loom-tests/tests/commands.rs`).
///
/// Generic over the command so that the model can queue plain completions.
#[derive(Debug)]
pub struct Commands<C> {
    // A mutex: commands are rare (membership changes, syncs, barriers), never per message.
    queue: Mutex<CommandQueue<C>>,
}

#[derive(Debug)]
struct CommandQueue<C> {
    list: Vec<C>,
    /// The IO thread stopped taking commands.
    closed: bool,
}

impl<C> Default for Commands<C> {
    fn default() -> Self {
        Commands::new()
    }
}

impl<C> Commands<C> {
    /// Empty and open.
    pub fn new() -> Commands<C> {
        Commands {
            queue: Mutex::new(CommandQueue {
                list: Vec::new(),
                closed: false,
            }),
        }
    }

    /// Queues `c` for the IO thread (then ring its [`Handoff`]); gives it back once the IO
    /// thread has stopped taking commands.
    pub fn push(&self, c: C) -> Result<(), C> {
        let mut q = self.queue.lock();
        if q.closed {
            return Err(c);
        }
        q.list.push(c);
        Ok(())
    }

    /// Whether no command waits (a driven turn leaves commands to the IO thread).
    pub fn is_empty(&self) -> bool {
        self.queue.lock().list.is_empty()
    }

    /// The IO thread: the commands pushed since the last call, in order.
    pub fn take(&self) -> Vec<C> {
        std::mem::take(&mut self.queue.lock().list)
    }

    /// The IO thread, as it stops: refuses every later push and returns the commands no
    /// turn took (their callers must be told).
    pub fn close(&self) -> Vec<C> {
        let mut q = self.queue.lock();
        q.closed = true;
        std::mem::take(&mut q.list)
    }
}

/// A command whose caller may wait for it: told when the IO thread will never handle it.
pub trait Abandon {
    /// The IO thread stopped before handling this command: settle its caller's
    /// [`Completion`], if it has one, as [`Abandoned`](Outcome::Abandoned).
    fn abandon(self);
}

impl<C: Abandon> Commands<C> {
    /// A caller hands `c` to the IO thread: queued and the doorbell rung, or, once the IO
    /// thread has stopped, abandoned at once.
    pub fn send(&self, c: C, handoff: &Handoff) {
        match self.push(c) {
            // Never driven: a driven turn leaves commands to the IO thread.
            Ok(()) => handoff.ring_undriven(),
            Err(c) => c.abandon(),
        }
    }

    /// The IO thread has left its loop (finished, or panicked): abandons the commands it
    /// did not take, and every later one.
    pub fn stop(&self) {
        for c in self.close() {
            c.abandon();
        }
    }
}

/// What became of the command a caller waits on ([`Completion::wait_until`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Outcome {
    /// Neither yet (the wait reached its deadline).
    #[default]
    Pending,
    /// The IO thread did it.
    Done,
    /// The IO thread stopped before it could: the command was handed back by
    /// [`Commands::close`] or refused by [`Commands::push`].
    Abandoned,
}

/// A one-shot signal for a caller that waits on a command: settled once, as
/// [`Done`](Outcome::Done) or [`Abandoned`](Outcome::Abandoned).
#[derive(Debug, Default)]
pub struct Completion {
    state: Mutex<Outcome>,
    cv: Condvar,
}

impl Completion {
    /// The command was done: wakes the caller. `false` (and nothing changes) if it was
    /// settled already.
    pub fn complete(&self) -> bool {
        self.settle(Outcome::Done)
    }

    /// The command will never be done (the IO thread stopped): wakes the caller. `false`
    /// (and nothing changes) if it was settled already.
    pub fn abandon(&self) -> bool {
        self.settle(Outcome::Abandoned)
    }

    fn settle(&self, to: Outcome) -> bool {
        let mut s = self.state.lock();
        if *s != Outcome::Pending {
            return false;
        }
        *s = to;
        self.cv.notify_all();
        true
    }

    /// The outcome now.
    pub fn outcome(&self) -> Outcome {
        *self.state.lock()
    }

    /// Waits until settled or `deadline` (forever if `None`); returns the outcome,
    /// [`Pending`](Outcome::Pending) if the deadline came first.
    pub fn wait_until(&self, deadline: Option<Instant>) -> Outcome {
        let mut s = self.state.lock();
        while *s == Outcome::Pending {
            if !wait_until(&self.cv, &mut s, deadline) {
                break;
            }
        }
        *s
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A command is taken by a turn, handed back by the close, or refused at its push; a
    /// completion is settled once, and its waiter sees how.
    #[test]
    fn commands_are_taken_handed_back_or_refused_and_settled_once() {
        let q: Commands<u8> = Commands::new();
        q.push(1).expect("open");
        assert_eq!(q.take(), vec![1]);
        q.push(2).expect("open");
        assert_eq!(q.close(), vec![2], "what no turn took comes back");
        assert_eq!(q.push(3), Err(3), "refused once closed");
        assert!(q.take().is_empty());

        let c = Completion::default();
        let deadline = Some(Instant::now());
        assert_eq!(c.wait_until(deadline), Outcome::Pending);
        assert!(c.abandon());
        assert!(!c.complete(), "settled once");
        assert_eq!(c.wait_until(None), Outcome::Abandoned);
        let c = Completion::default();
        assert!(c.complete());
        assert!(!c.abandon());
        assert_eq!(c.outcome(), Outcome::Done);
    }
}
