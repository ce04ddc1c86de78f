//! The requests a node has in flight to one peer: each waits in a slot for its reply.
//!
//! A requester registers a slot (waiting while the peer's cap of requests in flight is
//! reached), sends the request with the slot's id, and waits on the slot. The IO thread
//! fills it when the reply arrives, or fails it when the peer can no longer answer (removed,
//! node shut down, restarted as a new incarnation), or when the peer says it cannot answer
//! (a reply carrying a [`ReplyStatus`] instead of a payload); whichever thread fills the
//! slot also wakes the task of a future polling it (`PendingReply` is a `Future`, with no
//! runtime of ours behind it). A reply whose slot is gone
//! (timed out, dropped, already answered) is dropped and counted late.
//!
//! The cap bounds how many requests one requester keeps waiting; what bounds the replies
//! themselves is the room each request reserves in the window (`deliver::ReplyRoom`).

use std::collections::HashMap;
use std::task::Waker;
use std::time::Instant;

use bytes::Bytes;

use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{wait_until, Arc, Condvar, Mutex};
use crate::wire::ReplyStatus;

/// Why a request got no reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The peer was removed or the node shut down.
    Closed,
    /// The peer restarted as a new incarnation, which cannot answer the old one's requests.
    Restarted,
    /// No reply (or no room to send the request) before the deadline.
    TimedOut,
    /// The peer answered that it cannot reply, and why.
    Refused(ReplyStatus),
    /// The request (`len` bytes of payload) is larger than the peer accepts (`max` bytes
    /// of payload), as learnt from its handshake after the request was queued: never sent.
    TooLarge {
        /// The request's payload length.
        len: usize,
        /// The largest request payload the peer accepts.
        max: usize,
    },
}

/// What a slot holds: the outcome once there is one, and the waker of a future waiting
/// for it.
#[derive(Debug, Default)]
struct SlotState {
    outcome: Option<Result<Bytes, Failure>>,
    /// Set by [`Slot::poll_peek`] while the outcome is not there; woken by the thread that
    /// fills the slot.
    waker: Option<Waker>,
}

/// Where one request's reply lands.
#[derive(Debug, Default)]
pub struct Slot {
    state: Mutex<SlotState>,
    filled: Condvar,
}

impl Slot {
    fn fill(&self, r: Result<Bytes, Failure>) {
        let waker = {
            let mut s = self.state.lock();
            if s.outcome.is_some() {
                return;
            }
            s.outcome = Some(r);
            self.filled.notify_all();
            s.waker.take()
        };
        // Woken outside the lock: the task may run at once, on another thread, and poll.
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The outcome if there is one now, taken.
    #[cfg(any(test, cohort_internals))]
    pub fn try_take(&self) -> Option<Result<Bytes, Failure>> {
        self.state.lock().outcome.take()
    }

    /// Whether the outcome is there (not taken).
    pub fn is_filled(&self) -> bool {
        self.state.lock().outcome.is_some()
    }

    /// A future's look: the outcome if it is there (left in place: polling again returns
    /// it again), else `waker` is kept to be woken when it comes.
    pub fn poll_peek(&self, waker: &Waker) -> Option<Result<Bytes, Failure>> {
        let mut s = self.state.lock();
        if let Some(r) = &s.outcome {
            return Some(r.clone());
        }
        match &mut s.waker {
            Some(w) if w.will_wake(waker) => {}
            w => *w = Some(waker.clone()),
        }
        None
    }

    /// Waits for the outcome until `deadline`; `None` if it did not come in time.
    pub fn take_until(&self, deadline: Option<Instant>) -> Option<Result<Bytes, Failure>> {
        let mut s = self.state.lock();
        loop {
            if let Some(r) = s.outcome.take() {
                return Some(r);
            }
            if !wait_until(&self.filled, &mut s, deadline) {
                return None;
            }
        }
    }
}

/// A request waiting for its reply.
struct Waiting {
    slot: Arc<Slot>,
    /// Published to the peer's current incarnation (the IO thread marks it).
    sent: bool,
}

struct Table {
    slots: HashMap<u64, Waiting>,
    /// Refuses new requests once the peer is removed or the node is shutting down.
    closed: bool,
}

/// One peer's requests in flight.
pub struct Requests {
    // A mutex: taken once when a request is sent and once when its reply lands (or it is
    // given up), never per byte; the condvar parks requesters at the cap.
    table: Mutex<Table>,
    room: Condvar,
    cap: usize,
    next_id: AtomicU64,
    late: AtomicU64,
    answered: AtomicU64,
}

impl std::fmt::Debug for Requests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requests")
            .field("in_flight", &self.in_flight())
            .field("cap", &self.cap)
            .finish()
    }
}

impl Requests {
    /// No requests in flight; at most `cap` (at least one) at once.
    pub fn new(cap: usize) -> Requests {
        Requests {
            table: Mutex::new(Table {
                slots: HashMap::new(),
                closed: false,
            }),
            room: Condvar::new(),
            cap: cap.max(1),
            // A random start: a stale reply meant for an earlier process under this name
            // (whatever slipped past the drop of replies to a restarted peer) never
            // matches one of ours.
            next_id: AtomicU64::new(crate::util::random_nonzero_u64() >> 1),
            late: AtomicU64::new(0),
            answered: AtomicU64::new(0),
        }
    }

    /// A slot for a new request, and its id; waits until `deadline` (forever if `None`)
    /// while the cap is reached.
    pub fn register(&self, deadline: Option<Instant>) -> Result<(u64, Arc<Slot>), Failure> {
        let mut t = self.table.lock();
        loop {
            if t.closed {
                return Err(Failure::Closed);
            }
            if t.slots.len() < self.cap {
                break;
            }
            if !wait_until(&self.room, &mut t, deadline) {
                return Err(Failure::TimedOut);
            }
        }
        // Relaxed: uniqueness only; the table's lock orders the slot's publication.
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot::default());
        t.slots.insert(
            id,
            Waiting {
                slot: slot.clone(),
                sent: false,
            },
        );
        Ok((id, slot))
    }

    /// Gives up request `id` (timed out, failed to send, its handle dropped): a reply that
    /// comes later is counted late. `false` if it was no longer waiting (answered or failed
    /// meanwhile: its slot holds the outcome).
    pub fn forget(&self, id: u64) -> bool {
        let waiting = self.table.lock().slots.remove(&id).is_some();
        if waiting {
            self.room.notify_one();
        }
        waiting
    }

    /// The requester of `id` waits for its outcome in `slot` until `deadline` (forever if
    /// `None`). `None` if none came: the request is then given up (no longer waiting; a
    /// reply that comes later is counted late). A reply racing the deadline is returned or
    /// counted late, never lost and never both.
    pub fn wait(
        &self,
        id: u64,
        slot: &Slot,
        deadline: Option<Instant>,
    ) -> Option<Result<Bytes, Failure>> {
        if let Some(r) = slot.take_until(deadline) {
            return Some(r);
        }
        if self.forget(id) {
            return None;
        }
        // No longer waiting: a reply or a failure took it out of the table, and fills the
        // slot right after (outside the table's lock). Wait for that, however briefly: a
        // look now could miss it, and the reply, counted answered, would be lost.
        slot.take_until(None)
    }

    /// Whether request `id` still waits for its reply: `false` once it was answered, failed
    /// or given up (timed out, its handle dropped). The IO thread withdraws a queued
    /// request that no longer waits instead of sending it.
    pub fn is_waiting(&self, id: u64) -> bool {
        self.table.lock().slots.contains_key(&id)
    }

    /// Fails request `id` with `why` now (the IO thread found it cannot be sent). `false`
    /// if it no longer waited.
    pub fn fail(&self, id: u64, why: Failure) -> bool {
        let slot = self.table.lock().slots.remove(&id);
        match slot {
            Some(w) => {
                self.room.notify_one();
                w.slot.fill(Err(why));
                true
            }
            None => false,
        }
    }

    /// The IO thread published request `id`: from now on only the incarnation it went to
    /// can answer it.
    pub fn mark_sent(&self, id: u64) {
        if let Some(w) = self.table.lock().slots.get_mut(&id) {
            w.sent = true;
        }
    }

    /// The IO thread: the reply to request `id` arrived (a payload, or the peer's word
    /// that it cannot answer). `false` if nobody waits for it any more (counted late).
    pub fn answer(&self, id: u64, reply: Result<Bytes, Failure>) -> bool {
        let slot = self.table.lock().slots.remove(&id);
        match slot.map(|w| w.slot) {
            Some(slot) => {
                self.room.notify_one();
                // Counted before the waiter can see its reply, so that a requester reading
                // the stats after its last reply sees every one counted. (Relaxed: the
                // slot's lock orders it before the waiter's wake-up.)
                self.answered.fetch_add(1, Ordering::Relaxed);
                slot.fill(reply);
                true
            }
            None => {
                // Relaxed: a counter.
                self.late.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// The peer restarted: fails with `why` every request published to it, but those in
    /// `keep` (published while it was away and never written, which go to the new
    /// incarnation). Requests not published yet still wait: the new incarnation gets them.
    pub fn fail_sent_but(&self, keep: &[u64], why: Failure) -> usize {
        let failed: Vec<Arc<Slot>> = {
            let mut t = self.table.lock();
            let ids: Vec<u64> = t
                .slots
                .iter()
                .filter(|(id, w)| w.sent && !keep.contains(id))
                .map(|(id, _)| *id)
                .collect();
            ids.iter()
                .filter_map(|id| t.slots.remove(id))
                .map(|w| w.slot)
                .collect()
        };
        if !failed.is_empty() {
            self.room.notify_all();
        }
        for s in &failed {
            s.fill(Err(why));
        }
        failed.len()
    }

    /// Fails every request in flight with [`Failure::Closed`] and refuses new ones: the
    /// peer is removed or the node is shutting down.
    pub fn close(&self) {
        let failed: Vec<Arc<Slot>> = {
            let mut t = self.table.lock();
            t.closed = true;
            t.slots.drain().map(|(_, w)| w.slot).collect()
        };
        self.room.notify_all();
        for s in failed {
            s.fill(Err(Failure::Closed));
        }
    }

    /// Requests waiting for their reply now.
    pub fn in_flight(&self) -> usize {
        self.table.lock().slots.len()
    }

    /// Replies that came after their request was given up.
    pub fn late(&self) -> u64 {
        self.late.load(Ordering::Relaxed)
    }

    /// Replies that reached their request.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A requester whose deadline passes as the reply lands gets the reply: its request
    /// is out of the table (the reply took it out) and the slot is filled only after, so
    /// a look at the slot alone would miss the reply, answered and then lost.
    #[test]
    fn a_reply_landing_as_the_deadline_passes_is_returned() {
        let r = Arc::new(Requests::new(4));
        let (id, slot) = r.register(None).expect("room");
        // The reply's first half: out of the table (`answer`, before it fills the slot).
        let taken = r.table.lock().slots.remove(&id).expect("waiting").slot;
        let (tx, rx) = std::sync::mpsc::channel();
        let (r2, slot2) = (r.clone(), slot.clone());
        let requester = std::thread::spawn(move || {
            // The deadline has passed: one look, then the request is given up.
            let _ = tx.send(r2.wait(id, &slot2, Some(Instant::now())));
        });
        // A requester that gave up without the reply answers at once: it must not.
        if let Ok(got) = rx.recv_timeout(Duration::from_millis(200)) {
            panic!("the requester returned {got:?} before the reply was in its slot");
        }
        // The reply's second half.
        taken.fill(Ok(Bytes::from_static(b"yes")));
        let got = rx.recv_timeout(Duration::from_secs(10)).expect("returned");
        assert_eq!(got, Some(Ok(Bytes::from_static(b"yes"))));
        requester.join().expect("requester");
    }

    #[test]
    fn a_reply_reaches_its_slot_and_a_late_one_is_counted() {
        let r = Requests::new(4);
        let (id, slot) = r.register(None).expect("room");
        assert!(slot.try_take().is_none());
        assert!(r.answer(id, Ok(Bytes::from_static(b"yes"))));
        assert_eq!(slot.take_until(None), Some(Ok(Bytes::from_static(b"yes"))));
        assert!(
            !r.answer(id, Ok(Bytes::from_static(b"again"))),
            "answered once"
        );
        assert_eq!((r.answered(), r.late(), r.in_flight()), (1, 1, 0));
    }

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn the_thread_that_fills_a_slot_wakes_the_future_polling_it() {
        let r = Requests::new(4);
        let count = std::sync::Arc::new(Count::default());
        let waker = Waker::from(count.clone());
        let woken = || count.0.load(std::sync::atomic::Ordering::SeqCst);
        let (a, sa) = r.register(None).expect("room");
        assert_eq!(sa.poll_peek(&waker), None);
        assert_eq!(sa.poll_peek(&waker), None, "the same waker, kept once");
        assert!(r.answer(a, Ok(Bytes::from_static(b"yes"))));
        assert_eq!(woken(), 1);
        let got = Some(Ok(Bytes::from_static(b"yes")));
        assert_eq!(sa.poll_peek(&waker), got, "ready");
        assert_eq!(sa.poll_peek(&waker), got, "and again: left in place");
        let (b, sb) = r.register(None).expect("room");
        assert_eq!(sb.poll_peek(&waker), None);
        assert!(r.fail(b, Failure::TooLarge { len: 2, max: 1 }));
        assert_eq!(woken(), 2, "a failure wakes too");
        let (_c, sc) = r.register(None).expect("room");
        assert_eq!(sc.poll_peek(&waker), None);
        r.close();
        assert_eq!(woken(), 3, "and a close");
        assert_eq!(sc.poll_peek(&waker), Some(Err(Failure::Closed)));
    }

    #[test]
    fn a_refusal_reaches_its_slot_as_a_failure() {
        let r = Requests::new(4);
        let (id, slot) = r.register(None).expect("room");
        let why = Failure::Refused(ReplyStatus::Unanswered);
        assert!(r.answer(id, Err(why)));
        assert_eq!(slot.try_take(), Some(Err(why)));
        assert_eq!((r.answered(), r.in_flight()), (1, 0));
    }

    #[test]
    fn the_cap_holds_requesters_until_room_comes_back() {
        let r = Requests::new(2);
        let (a, _sa) = r.register(None).expect("room");
        let (_b, _sb) = r.register(None).expect("room");
        let soon = Some(Instant::now() + Duration::from_millis(5));
        assert_eq!(r.register(soon).map(|_| ()), Err(Failure::TimedOut));
        r.forget(a);
        assert!(r.register(soon).is_ok(), "room came back");
    }

    #[test]
    fn a_restart_fails_what_was_sent_and_closing_refuses_new_requests() {
        let r = Requests::new(8);
        let (a, sa) = r.register(None).expect("room");
        let (b, sb) = r.register(None).expect("room");
        let (_c, sc) = r.register(None).expect("room");
        r.mark_sent(a);
        r.mark_sent(b);
        assert_eq!(r.fail_sent_but(&[b], Failure::Restarted), 1);
        assert_eq!(sa.try_take(), Some(Err(Failure::Restarted)));
        assert!(sb.try_take().is_none(), "a kept request still waits");
        assert!(sc.try_take().is_none(), "an unsent request still waits");
        assert!(
            !r.answer(a, Ok(Bytes::new())),
            "a failed request's reply is late"
        );
        r.close();
        assert_eq!(sb.try_take(), Some(Err(Failure::Closed)));
        assert_eq!(sc.try_take(), Some(Err(Failure::Closed)));
        assert_eq!(r.register(None).map(|_| ()), Err(Failure::Closed));
    }

    #[test]
    fn a_request_failed_by_the_io_thread_no_longer_waits() {
        let r = Requests::new(4);
        let (a, sa) = r.register(None).expect("room");
        let (b, _sb) = r.register(None).expect("room");
        assert!(r.is_waiting(a) && r.is_waiting(b));
        let why = Failure::TooLarge { len: 10, max: 5 };
        assert!(r.fail(a, why));
        assert_eq!(sa.try_take(), Some(Err(why)));
        assert!(!r.is_waiting(a) && !r.fail(a, why), "failed once");
        assert!(r.forget(b));
        assert!(!r.is_waiting(b), "given up: withdrawn if still queued");
    }
}
