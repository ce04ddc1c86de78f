//! Credit flow control: the sender's [`SendWindow`] (a byte semaphore) and the receiver's
//! [`RecvCredit`] (bytes consumed by the application, returned in halves of the sender's
//! window).
//!
//! Permits are conserved: every byte taken from a window is given back exactly once,
//! whatever becomes of the message. At quiescence `available() == capacity()`.

use std::time::{Duration, Instant};

use crate::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crate::sync::{wait_until, CachePadded, Condvar, Mutex};

/// Bytes of window a message costs besides its payload, so that empty messages are
/// flow-controlled too and the window bounds the memory their bookkeeping takes.
pub const MESSAGE_OVERHEAD: u64 = 16;

/// Window bytes a message of `payload_len` bytes takes: its payload plus
/// [`MESSAGE_OVERHEAD`]. Sender and receiver use the same rule, so credit matches permits.
#[inline]
pub fn cost(payload_len: usize) -> u64 {
    payload_len as u64 + MESSAGE_OVERHEAD
}

/// Window bytes a data frame with wire `flags` and `payload` (as on the wire, with the
/// transport's header) takes: its [`cost`]; for a request, also the room it reserves for
/// its reply; for a reply, nothing — its room was reserved in its request's cost, so it
/// travels outside flow control.
#[inline]
pub fn frame_cost(flags: u8, payload: &[u8]) -> u64 {
    if flags & crate::wire::FLAG_REPLY != 0 {
        0
    } else if flags & crate::wire::FLAG_REQUEST != 0 {
        cost(payload.len()) + u64::from(crate::wire::request_room(payload).unwrap_or(0))
    } else {
        cost(payload.len())
    }
}

/// Window bytes taken from a [`SendWindow`]: only the window creates one (an acquire, or the
/// charge for messages restored from a journal), a message carries it through the outbox
/// and the IO thread's ledger, and it is consumed only by giving it back
/// ([`SendWindow::release`], through `Outbox::give_back` with a reason). So "every permit
/// taken comes back exactly once" is a property of the types: a permit cannot be copied, and
/// one dropped without being given back is a bug — caught in debug builds, where the drop
/// panics.
///
/// ```
/// use cohort::internals::flow::SendWindow;
/// let w = SendWindow::new(100);
/// let mut p = w.try_acquire(60).unwrap();
/// let part = p.take(20); // 20 of the 60 bytes, e.g. credited back first
/// w.release(part);
/// w.release(p);
/// assert_eq!(w.available(), 100);
/// ```
#[must_use = "permits are window bytes: give them back, or the window shrinks for ever"]
#[derive(Debug)]
pub struct Permit {
    bytes: u64,
}

impl Permit {
    /// A permit for no bytes, to gather others into ([`absorb`](Permit::absorb)).
    pub fn none() -> Permit {
        Permit { bytes: 0 }
    }

    /// The window bytes it holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Splits off a permit for `n` of its bytes (all of them if it holds fewer).
    pub fn take(&mut self, n: u64) -> Permit {
        let n = n.min(self.bytes);
        self.bytes -= n;
        Permit { bytes: n }
    }

    /// Takes `other`'s bytes into this one.
    pub fn absorb(&mut self, mut other: Permit) {
        self.bytes += std::mem::take(&mut other.bytes);
    }
}

#[cfg(all(any(test, cohort_internals), not(loom)))]
std::thread_local! {
    /// Permits dropped on this thread are not checked (see [`dropping_unchecked`]).
    static UNCHECKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the drop check of permits off on this thread: the simulation drops a
/// process that ended (or one whose peer ended) with its messages, whose permits can never
/// come back, and must not take that for a leak. Only for the tests and the fuzz target.
#[cfg(all(any(test, cohort_internals), not(loom)))]
pub(crate) fn dropping_unchecked<R>(f: impl FnOnce() -> R) -> R {
    UNCHECKED.with(|u| u.set(true));
    let r = f();
    UNCHECKED.with(|u| u.set(false));
    r
}

/// Whether the drop check of permits is off on this thread.
fn unchecked() -> bool {
    #[cfg(all(any(test, cohort_internals), not(loom)))]
    return UNCHECKED.with(|u| u.get());
    #[cfg(not(all(any(test, cohort_internals), not(loom))))]
    false
}

impl Drop for Permit {
    fn drop(&mut self) {
        if cfg!(debug_assertions) && self.bytes > 0 && !std::thread::panicking() && !unchecked() {
            panic!(
                "a permit of {} window bytes was dropped without being given back",
                self.bytes
            );
        }
    }
}

/// Why a window acquire did not take its permits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireError {
    /// The window has no room now (`try_acquire` only).
    Full,
    /// The deadline passed before room was made.
    TimedOut,
    /// The window was closed (the peer was removed or the node shut down).
    Closed,
    /// The request is larger than the whole window and could never succeed.
    TooLarge,
}

/// A byte semaphore bounding what one sender may have in flight to one peer.
///
/// The fast path is a single compare-and-swap on `available`; a sender that finds too
/// little room parks on a condition variable (never spins) until [`release`] makes room or
/// the window is [`close`]d.
///
/// ```
/// use cohort::internals::flow::SendWindow;
/// let w = SendWindow::new(100);
/// let permit = w.try_acquire(60).unwrap();
/// assert!(w.try_acquire(60).is_err());
/// w.release(permit);
/// assert_eq!(w.available(), 100);
/// ```
///
/// [`release`]: SendWindow::release
/// [`close`]: SendWindow::close
#[derive(Debug)]
pub struct SendWindow {
    capacity: u64,
    available: CachePadded<AtomicU64>,
    /// Acquirers parked (or about to park) on `cond`.
    waiters: AtomicUsize,
    closed: AtomicBool,
    lock: Mutex<Blocked>,
    cond: Condvar,
}

/// The current blocked episode (from the first sender parking to the last one leaving) and
/// the time the episodes that ended lasted, in one place so that a reader sees both at
/// once: their sum only grows.
#[derive(Debug, Default)]
struct Blocked {
    since: Option<Instant>,
    episode: u64,
    ended: Duration,
}

impl SendWindow {
    /// A window of `capacity` bytes, all available.
    pub fn new(capacity: u64) -> SendWindow {
        SendWindow {
            capacity,
            available: CachePadded::new(AtomicU64::new(capacity)),
            waiters: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            lock: Mutex::new(Blocked::default()),
            cond: Condvar::new(),
        }
    }

    /// Total bytes of the window.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes that may be acquired now.
    pub fn available(&self) -> u64 {
        self.available.load(Ordering::Acquire)
    }

    /// Bytes taken and not yet given back.
    pub fn in_flight(&self) -> u64 {
        self.capacity.saturating_sub(self.available())
    }

    /// Whether the window was closed.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Total time at least one sender was parked on this window, including a stall still
    /// going on (counted once however many senders share it), so a monitor sees a permanent
    /// stall grow rather than a frozen figure. It never decreases (it is published as a
    /// counter).
    pub fn blocked_time(&self) -> Duration {
        let b = self.lock.lock();
        match b.since {
            Some(since) => b.ended + since.elapsed(),
            None => b.ended,
        }
    }

    /// Takes `n` bytes if they are available now.
    pub fn try_acquire(&self, n: u64) -> Result<Permit, AcquireError> {
        if n > self.capacity {
            return Err(AcquireError::TooLarge);
        }
        if self.is_closed() {
            return Err(AcquireError::Closed);
        }
        if self.take(n) {
            Ok(Permit { bytes: n })
        } else {
            Err(AcquireError::Full)
        }
    }

    /// Takes `n` bytes, parking until they are available or the window is closed.
    pub fn acquire(&self, n: u64) -> Result<Permit, AcquireError> {
        self.acquire_until(n, None)
    }

    /// Takes `n` bytes, parking at most `timeout`.
    pub fn acquire_timeout(&self, n: u64, timeout: Duration) -> Result<Permit, AcquireError> {
        self.acquire_until(n, Some(Instant::now() + timeout))
    }

    /// One CAS loop: takes `n` if at least `n` is available.
    #[inline]
    fn take(&self, n: u64) -> bool {
        // Acquire pairs with the Release in `release`: bytes given back happen-before the
        // acquirer that reuses them. SeqCst on success orders this against the `waiters`
        // protocol in `acquire_until` (see `release`).
        let mut cur = self.available.load(Ordering::Acquire);
        loop {
            if cur < n {
                return false;
            }
            match self.available.compare_exchange_weak(
                cur,
                cur - n,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    fn acquire_until(&self, n: u64, deadline: Option<Instant>) -> Result<Permit, AcquireError> {
        match self.try_acquire(n) {
            Err(AcquireError::Full) => {}
            other => return other,
        }
        let started = Instant::now();
        let mut guard = self.lock.lock();
        // Announce ourselves before the last check: a releaser that adds permits after this
        // increment sees `waiters > 0` and notifies under the lock (SeqCst on both sides, a
        // Dekker pair with `release`), so the wake-up cannot be lost.
        if self.waiters.fetch_add(1, Ordering::SeqCst) == 0 {
            guard.since = Some(started);
            guard.episode += 1;
        }
        // The fence pairs with the one in `release` (store `waiters` / load `available` here,
        // store `available` / load `waiters` there): at least one side sees the other's
        // store. SeqCst on the accesses alone is not enough under the C++ model once the
        // `available` load is Acquire; loom found the lost wake-up.
        fence(Ordering::SeqCst);
        let result = loop {
            if self.is_closed() {
                break Err(AcquireError::Closed);
            }
            if self.take(n) {
                break Ok(Permit { bytes: n });
            }
            if !wait_until(&self.cond, &mut guard, deadline) {
                break Err(AcquireError::TimedOut);
            }
        };
        if self.waiters.fetch_sub(1, Ordering::SeqCst) == 1 {
            // The last one out ends the episode; counted under the lock, as it started.
            if let Some(since) = guard.since.take() {
                guard.ended += since.elapsed();
            }
        }
        drop(guard);
        result
    }

    /// Takes up to `n` bytes without waiting (as many as are available). For charging the
    /// window with messages that hold no permits yet (restored from a journal after a
    /// restart).
    pub fn take_up_to(&self, n: u64) -> Permit {
        // Same orderings as `take`.
        let mut cur = self.available.load(Ordering::Acquire);
        loop {
            let t = cur.min(n);
            if t == 0 {
                return Permit::none();
            }
            match self.available.compare_exchange_weak(
                cur,
                cur - t,
                Ordering::SeqCst,
                Ordering::Acquire,
            ) {
                Ok(_) => return Permit { bytes: t },
                Err(now) => cur = now,
            }
        }
    }

    /// Gives a permit's bytes back and wakes parked senders.
    ///
    /// # Panics
    /// In debug builds, if more is given back than was taken (a permit of another window).
    pub fn release(&self, mut permit: Permit) {
        let n = std::mem::take(&mut permit.bytes);
        if n == 0 {
            return;
        }
        let prev = self.available.fetch_add(n, Ordering::SeqCst);
        // Pairs with the fence in `acquire_until` (see there).
        fence(Ordering::SeqCst);
        if cfg!(any(debug_assertions, loom)) {
            assert!(
                prev + n <= self.capacity,
                "window over-released: {prev} + {n} > {}",
                self.capacity
            );
        }
        if self.waiters.load(Ordering::SeqCst) > 0 {
            // Taking the lock orders us after a waiter's last check: it is either parked
            // (and gets the notify) or has not yet checked (and sees the new permits).
            let _g = self.lock.lock();
            self.cond.notify_all();
        }
    }

    /// Closes the window: parked and future acquirers fail with [`AcquireError::Closed`].
    /// Releases still count, so permits stay conserved.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _g = self.lock.lock();
        self.cond.notify_all();
    }

    /// Reopens a closed window.
    #[cfg(any(test, cohort_internals))]
    pub fn reopen(&self) {
        self.closed.store(false, Ordering::SeqCst);
    }

    /// Since when senders have been parked without interruption, and a number that
    /// identifies this blocked episode; `None` when no sender is parked.
    pub fn blocked_since(&self) -> Option<(Instant, u64)> {
        let b = self.lock.lock();
        b.since.map(|s| (s, b.episode))
    }

    /// Senders parked now.
    #[cfg(any(test, cohort_internals))]
    pub fn waiters(&self) -> usize {
        self.waiters.load(Ordering::Relaxed)
    }
}

/// Bits of [`RecvCredit`]'s pending word that count bytes; the bits above carry the epoch.
const CREDIT_BYTES_BITS: u32 = 40;
const CREDIT_BYTES: u64 = (1 << CREDIT_BYTES_BITS) - 1;

/// The largest window a receiver accounts for (1 TiB): credit pending for one sender is
/// counted in 40 bits. Windows are validated against it at start.
pub const MAX_WINDOW: u64 = CREDIT_BYTES;

/// Receiver side of flow control for one sender: the window bytes of its messages received
/// and not yet consumed (what the receiver holds for it), and the bytes the application has
/// consumed that have not yet been returned as credit.
///
/// Pool threads add to the credit after the handler returns; the IO thread takes it when it
/// writes an ack. [`consumed`](RecvCredit::consumed) says when half of the receive window
/// has accumulated, so credit returns in halves and never one message at a time.
///
/// The receive window (the smaller of the sender's window and the receiver's own bound)
/// also bounds what is held: past it, the IO thread [`pause`](RecvCredit::pause)s reading
/// the sender's connection, and the consumption that brings it back within the window
/// asks the IO thread to resume. The pause flag and the held count form a Dekker pair
/// (each side writes one and then reads the other, sequentially consistent), so a pause
/// racing the last consumption is always resumed by one side or the other.
///
/// Credit belongs to one **epoch** of the sender's stream: when the stream restarts (the
/// sender is a new incarnation, or the relationship was reset) the IO thread calls
/// [`restart`](RecvCredit::restart), and messages of the old stream still being handled no
/// longer earn credit: the new stream's window is not over-released by them. The epoch and
/// the byte count share one atomic word, so a consumption racing a restart is either
/// credited to the old epoch (and dropped by the restart) or refused.
///
/// ```
/// use cohort::internals::flow::RecvCredit;
/// let c = RecvCredit::new();
/// c.set_window(100);
/// c.received(60);
/// assert!(c.consumed(0, 60)); // crossed half the window: return credit now
/// assert_eq!(c.take(), 60);
/// c.received(10);
/// c.restart(1); // the sender restarted
/// assert!(!c.consumed(0, 10)); // a message of the old stream: no credit
/// assert_eq!((c.pending(), c.held()), (0, 0));
/// ```
#[derive(Debug)]
pub struct RecvCredit {
    /// Consumed bytes not yet returned (low 40 bits) and the stream epoch (high 24 bits).
    pending: CachePadded<AtomicU64>,
    /// Window bytes received (regular and out-of-band, reliable and unreliable) and not
    /// yet consumed, all epochs together: what this sender makes the receiver hold.
    held: AtomicU64,
    /// The receive window: held bytes above it pause reading; set at the handshake.
    limit: AtomicU64,
    /// Half of the receive window: credit goes back when this much is pending.
    half: AtomicU64,
    /// Set while a flush request is with the IO thread, so requests are not duplicated.
    flush_requested: AtomicBool,
    /// Set by the IO thread while it does not read the sender's connection.
    paused: AtomicBool,
}

impl Default for RecvCredit {
    fn default() -> Self {
        RecvCredit::new()
    }
}

fn epoch_tag(epoch: u32) -> u64 {
    u64::from(epoch) << CREDIT_BYTES_BITS
}

impl RecvCredit {
    /// No credit pending, nothing held, epoch 0; threshold unknown until
    /// [`set_window`](RecvCredit::set_window).
    pub fn new() -> RecvCredit {
        RecvCredit {
            pending: CachePadded::new(AtomicU64::new(0)),
            held: AtomicU64::new(0),
            limit: AtomicU64::new(u64::MAX),
            half: AtomicU64::new(u64::MAX),
            flush_requested: AtomicBool::new(false),
            paused: AtomicBool::new(false),
        }
    }

    /// Sets the receive window (at the handshake: the smaller of the sender's window and
    /// the receiver's bound): credit returns in halves of it, and reading pauses past it.
    pub fn set_window(&self, window: u64) {
        self.limit.store(window, Ordering::Relaxed);
        self.half.store((window / 2).max(1), Ordering::Relaxed);
    }

    /// The receive window (`u64::MAX` before the first handshake).
    pub fn window(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// The IO thread received a message costing `bytes` window bytes (handed to delivery).
    /// Returns what is held now.
    pub fn received(&self, bytes: u64) -> u64 {
        // The pool's subtraction of these bytes comes after the message reached it through
        // a queue's lock, so the count never underflows.
        self.held.fetch_add(bytes, Ordering::SeqCst) + bytes
    }

    /// Window bytes received and not yet consumed (all epochs).
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }

    /// The IO thread stops reading the sender's connection because it holds more than the
    /// receive window. Returns `false` if consumption brought it back within the window
    /// meanwhile: then nothing is paused (and nobody would resume it).
    pub fn pause(&self) -> bool {
        // SeqCst, with `consumed`'s: either its load of `paused` sees this store (and it
        // asks to resume), or this load of `held` sees its subtraction.
        self.paused.store(true, Ordering::SeqCst);
        // The SeqCst accesses make the pair correct; the fence (paired with `consumed`'s)
        // makes it checkable: loom treats SeqCst accesses as AcqRel, fences as SeqCst.
        fence(Ordering::SeqCst);
        if self.held.load(Ordering::SeqCst) > self.window() {
            return true;
        }
        self.paused.store(false, Ordering::SeqCst);
        false
    }

    /// The IO thread: resumes reading if it was paused and the held bytes are back within
    /// the window. Returns whether it resumed.
    pub fn resume(&self) -> bool {
        self.held() <= self.window() && self.paused.swap(false, Ordering::AcqRel)
    }

    /// Whether reading is paused.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// The IO thread: the paused connection is gone; nothing is paused any more.
    pub fn unpause(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Records `bytes` consumed by the application from a message of stream epoch
    /// `epoch`. Returns `true` when the caller should ask the IO thread to act now: this
    /// crossed half the receive window (credit to return), or brought a paused sender
    /// back within it (reading to resume). Credit of an epoch that has since restarted is
    /// dropped (the bytes are no longer held all the same).
    pub fn consumed(&self, epoch: u32, bytes: u64) -> bool {
        // The credit first, then the held count: a reader that sees these bytes leave
        // `held` sees their credit pending ([`settled`](RecvCredit::settled)).
        let flush = self.credit(epoch, bytes);
        let before = self.held.fetch_sub(bytes, Ordering::SeqCst);
        debug_assert!(before >= bytes, "consumed more than was received");
        let held = before.saturating_sub(bytes);
        // Pairs with the fence in `pause` (see there).
        fence(Ordering::SeqCst);
        let resume = held <= self.window() && self.paused.load(Ordering::SeqCst);
        flush || resume
    }

    /// Whether nothing of this sender's is held here and no consumed credit waits to go
    /// back: until more is received, no credit will be pending (the IO thread's tick owes
    /// this sender nothing). Reads `held` before `pending`: `consumed` adds to `pending`
    /// before it takes from `held` (a release, read here by a `SeqCst` load), so the read
    /// that sees the last bytes leave `held` is followed by one that sees their credit.
    pub fn settled(&self) -> bool {
        self.held() == 0 && self.pending() == 0
    }

    /// Adds `bytes` of epoch `epoch` to the pending credit; whether it crossed half.
    fn credit(&self, epoch: u32, bytes: u64) -> bool {
        let tag = epoch_tag(epoch);
        let half = self.half.load(Ordering::Relaxed);
        // AcqRel: the IO thread's `take` must see every byte added before a flush request.
        let mut cur = self.pending.load(Ordering::Acquire);
        loop {
            if cur & !CREDIT_BYTES != tag {
                return false; // the stream restarted: no credit for its old messages
            }
            let prev = cur & CREDIT_BYTES;
            let next = (prev + bytes).min(CREDIT_BYTES);
            match self.pending.compare_exchange_weak(
                cur,
                tag | next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return prev < half && next >= half,
                Err(now) => cur = now,
            }
        }
    }

    /// A reply this receiver owes the sender was queued: its `bytes` count as held for
    /// the sender until it leaves the queue ([`repaid`](RecvCredit::repaid)), so the
    /// sender's connection is not read while what it makes us hold, replies it asked for
    /// included, exceeds the window. Earns no credit: the request's room paid for it.
    pub fn owe(&self, bytes: u64) {
        // SeqCst: as in `received`.
        self.held.fetch_add(bytes, Ordering::SeqCst);
    }

    /// An owed reply of `bytes` left the queue (published or dropped). Returns `true` when
    /// the caller should ask the IO thread to resume a paused sender (as in `consumed`).
    pub fn repaid(&self, bytes: u64) -> bool {
        let before = self.held.fetch_sub(bytes, Ordering::SeqCst);
        debug_assert!(before >= bytes, "repaid more than was owed");
        // Pairs with the fence in `pause` (see there).
        fence(Ordering::SeqCst);
        before.saturating_sub(bytes) <= self.window() && self.paused.load(Ordering::SeqCst)
    }

    /// Bytes consumed and not yet returned.
    pub fn pending(&self) -> u64 {
        self.pending.load(Ordering::Acquire) & CREDIT_BYTES
    }

    /// Marks a flush as requested; `true` if it was not already.
    pub fn request_flush(&self) -> bool {
        !self.flush_requested.swap(true, Ordering::AcqRel)
    }

    /// Takes all pending credit (the IO thread, writing an ack). Clears the flush request
    /// first so a request made after this take is not lost.
    pub fn take(&self) -> u64 {
        // A swap, not a store: the same meaning, but loom 0.7 mis-orders a plain store
        // against a concurrent swap (tokio-rs/loom#254) and reports a lost request.
        self.flush_requested.swap(false, Ordering::AcqRel);
        self.pending.fetch_and(!CREDIT_BYTES, Ordering::AcqRel) & CREDIT_BYTES
    }

    /// The sender's stream restarts as epoch `epoch` (the IO thread, binding a new
    /// incarnation or resetting the relationship): credit still pending for the old one is
    /// dropped and returned, and consumption of its messages no longer earns any.
    pub fn restart(&self, epoch: u32) -> u64 {
        self.flush_requested.swap(false, Ordering::AcqRel);
        self.pending.swap(epoch_tag(epoch), Ordering::AcqRel) & CREDIT_BYTES
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn try_acquire_and_release_conserve() {
        let w = SendWindow::new(10);
        assert_eq!(w.try_acquire(11).err(), Some(AcquireError::TooLarge));
        let mut p = w.try_acquire(4).unwrap();
        p.absorb(w.try_acquire(6).unwrap());
        assert_eq!(p.bytes(), 10);
        assert_eq!(w.try_acquire(1).err(), Some(AcquireError::Full));
        assert_eq!(w.in_flight(), 10);
        w.release(p);
        assert_eq!(w.available(), 10);
    }

    #[test]
    fn take_up_to_charges_only_what_is_free() {
        let w = SendWindow::new(10);
        let held = w.try_acquire(7).unwrap();
        let charged = w.take_up_to(5);
        assert_eq!(charged.bytes(), 3);
        assert_eq!(w.take_up_to(5).bytes(), 0);
        w.release(charged);
        w.release(held);
        assert_eq!(w.available(), 10);
    }

    #[test]
    fn timeout_path_times_out() {
        let w = SendWindow::new(10);
        let held = w.try_acquire(10).unwrap();
        let t = Instant::now();
        assert_eq!(
            w.acquire_timeout(1, Duration::from_millis(30)).err(),
            Some(AcquireError::TimedOut)
        );
        assert!(t.elapsed() >= Duration::from_millis(30));
        assert_eq!(w.waiters(), 0);
        assert!(w.blocked_time() >= Duration::from_millis(30));
        w.release(held);
    }

    #[test]
    fn release_wakes_a_parked_sender() {
        let w = Arc::new(SendWindow::new(10));
        let held = w.try_acquire(10).unwrap();
        let w2 = w.clone();
        let t = std::thread::spawn(move || {
            w2.acquire(7).map(|p| {
                let n = p.bytes();
                w2.release(p);
                n
            })
        });
        // Wait (with a deadline) until the sender is parked, then release.
        let deadline = Instant::now() + Duration::from_secs(10);
        while w.waiters() == 0 {
            assert!(Instant::now() < deadline, "sender never parked");
            std::thread::yield_now();
        }
        w.release(held);
        let taken = t.join().unwrap();
        assert_eq!(taken, Ok(7));
        assert_eq!(w.available(), 10);
    }

    /// Two senders parked with overlapping waits: the blocked time counts the episode once
    /// (no more than the wall time since the first parked) and never decreases, read
    /// between the first leaving and the second, and after (it is published as a counter).
    #[test]
    fn blocked_time_counts_an_episode_once_and_never_decreases() {
        let w = Arc::new(SendWindow::new(10));
        let held = w.try_acquire(10).unwrap();
        let first_parked = Instant::now();
        let (through, taken) = std::sync::mpsc::channel();
        let park = || {
            let (w, through) = (w.clone(), through.clone());
            std::thread::spawn(move || through.send(w.acquire(10)).unwrap())
        };
        let wait = |what: &str, cond: &dyn Fn() -> bool| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !cond() {
                assert!(Instant::now() < deadline, "{what}");
                std::thread::yield_now();
            }
        };
        let a = park();
        wait("a parked for a while", &|| {
            w.waiters() == 1 && w.blocked_time() >= Duration::from_millis(20)
        });
        let b = park();
        wait("b parked", &|| w.waiters() == 2);
        // One goes through with the bytes; the other stays parked until they come back.
        w.release(held);
        let first = taken.recv().unwrap().unwrap();
        assert_eq!(w.waiters(), 1);
        let while_one_waits = w.blocked_time();
        w.release(first);
        let second = taken.recv().unwrap().unwrap();
        let after = w.blocked_time();
        assert!(
            after >= while_one_waits,
            "blocked time went back from {while_one_waits:?} to {after:?}"
        );
        assert!(
            after <= first_parked.elapsed(),
            "{after:?} counts an overlap twice"
        );
        assert_eq!(w.blocked_time(), after, "no episode open");
        w.release(second);
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(w.available(), 10);
    }

    #[test]
    fn close_wakes_with_closed() {
        let w = Arc::new(SendWindow::new(10));
        let held = w.try_acquire(10).unwrap();
        let w2 = w.clone();
        let t = std::thread::spawn(move || w2.acquire(1).map(|p| w2.release(p)));
        let deadline = Instant::now() + Duration::from_secs(10);
        while w.waiters() == 0 {
            assert!(Instant::now() < deadline, "sender never parked");
            std::thread::yield_now();
        }
        w.close();
        assert_eq!(t.join().unwrap(), Err(AcquireError::Closed));
        w.release(held);
        assert_eq!(w.available(), 10);
    }

    #[test]
    fn credit_crosses_half_once() {
        let c = RecvCredit::new();
        c.set_window(100);
        c.received(90);
        assert!(!c.consumed(0, 30));
        assert!(c.consumed(0, 30));
        assert!(!c.consumed(0, 30));
        assert_eq!(c.held(), 0);
        assert_eq!(c.take(), 90);
        assert!(c.request_flush());
        assert!(!c.request_flush());
        assert_eq!(c.take(), 0);
        assert!(c.request_flush());
    }

    #[test]
    fn credit_of_a_restarted_stream_is_dropped() {
        let c = RecvCredit::new();
        c.set_window(100);
        c.received(40);
        assert!(!c.consumed(0, 10));
        assert_eq!(
            c.restart(1),
            10,
            "the old epoch's pending credit is dropped"
        );
        assert!(!c.consumed(0, 30), "old messages earn nothing");
        assert_eq!((c.pending(), c.held()), (0, 0));
        c.received(60);
        assert!(c.consumed(1, 60));
        assert_eq!(c.take(), 60);
        // Epochs are compared modulo 2^24: a stream 2^24 restarts old is the only one
        // mistaken for the current one.
        assert_eq!(epoch_tag(1 << 24), epoch_tag(0));
    }
}
