//! A peer's outbox: its send window, the queue of accepted messages, and the one place where
//! permits go back to the window.
//!
//! Permits are conserved by the types. A sender takes `cost(len)` bytes of window as a
//! [`Permit`] (`SendCore::enqueue_to`, `src/node/send.rs`: the only place a send takes one,
//! but for `SendCore::enqueue_batch`, which takes one for a chunk of messages and splits it
//! among them with `Permit::take`; a journal restore charges the window with
//! `SendWindow::take_up_to`); the message carries it
//! ([`Outgoing`]) into the outbox and, once published, into the IO thread's [`Ledger`]; and
//! it goes back exactly once, through [`Outbox::give_back`], naming why ([`Return`]):
//!
//! | path | where | [`Return`] |
//! |---|---|---|
//! | outbox closed when the message arrived | `admit` | `Refused` |
//! | outbox closed when a batch's chunk arrived (each of its messages) | `admit_all` | `Refused` |
//! | the outbound filter dropped it at publish time | IO thread, `proto::Remote::publish` | `Filtered` |
//! | its deadline passed while it was queued | IO thread, `Remote::publish` / `Remote::sweep_queued` (tick) | `Expired` |
//! | the peer cannot take a message that large | IO thread, `Remote::publish` | `Failed` |
//! | a request its requester gave up (timed out, handle dropped) before it left | IO thread, `Remote::publish` / `Remote::sweep_queued` (tick) | `Withdrawn` |
//! | a `connected_only` send whose peer disconnected while it waited for the window | `SendCore::enqueue_to` | `Refused` |
//! | unreliable, for a disconnected peer of a journalling node | IO thread, `Remote::publish` | `Failed` |
//! | the peer was removed / the node shut down with it queued | IO thread, `Remote::retire` | `Failed` |
//! | published, then credited back by the receiver | IO thread, `Remote::on_ack` via [`Ledger::credit`] | `Credited` |
//! | published, then the peer restarted, forgot us or was removed | IO thread, `Remote::bind` / `Remote::forget` / `Remote::retire` via [`Ledger::retire`] | `Retired` |
//! | published unreliable, then lost with its connection | IO thread, `Remote::establish` (handshake counts) via [`Ledger::forget`] | `Lost` |
//!
//! A permit cannot be copied, and dropping one that holds bytes panics in debug builds, so a
//! path that forgets to give one back fails its tests. At every instant
//! `window.in_flight() == cost(queued) + ledger.uncredited()`.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

use crate::flow::{cost, Permit, RecvCredit, SendWindow};
use crate::handoff::{Handoff, Scheduled};
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{Arc, Mutex};
use crate::wire;

/// A message accepted by `send*` and not yet published, with the window bytes it holds.
/// The outbound filter sees it.
#[derive(Debug)]
pub struct Outgoing {
    pub(crate) payload: Bytes,
    pub(crate) flags: u8,
    pub(crate) deadline: Option<Instant>,
    /// Its window bytes, given back when it is filtered, expires or fails, or moved into the
    /// ledger when it is published.
    pub(crate) permit: Permit,
    /// A reply's bytes, counted as held for its requester until this message leaves the
    /// queue, whichever way: only its drop is used.
    // Boxed: only replies have one, and a message stays small in the queues.
    #[allow(dead_code)]
    owed: Option<Box<Owed>>,
}

/// A queued reply's bytes, counted as held for the requester it answers (see
/// [`RecvCredit::owe`]) until dropped — which happens wherever the reply leaves the queue:
/// published, failed, filtered, or refused.
pub(crate) struct Owed {
    credit: Arc<RecvCredit>,
    handoff: Arc<Handoff>,
    peer: usize,
    bytes: u64,
}

impl Owed {
    /// Owes peer `peer` (whose receive credit is `credit`) `bytes`.
    pub(crate) fn new(
        credit: Arc<RecvCredit>,
        handoff: Arc<Handoff>,
        peer: usize,
        bytes: u64,
    ) -> Owed {
        credit.owe(bytes);
        Owed {
            credit,
            handoff,
            peer,
            bytes,
        }
    }
}

impl Drop for Owed {
    fn drop(&mut self) {
        // Back within the window: ask the IO thread to resume reading the requester.
        if self.credit.repaid(self.bytes) && self.credit.request_flush() {
            self.handoff.request_credit(self.peer);
        }
    }
}

impl std::fmt::Debug for Owed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owed").field("bytes", &self.bytes).finish()
    }
}

impl Outgoing {
    /// A reliable regular (`oob == false`) or out-of-band message holding `permit` (its
    /// [`cost`](Outgoing::cost), taken from the peer's window), optionally expiring at
    /// `deadline` if it has not been published by then.
    pub(crate) fn new(
        payload: Bytes,
        oob: bool,
        deadline: Option<Instant>,
        permit: Permit,
    ) -> Outgoing {
        debug_assert_eq!(
            permit.bytes(),
            cost(payload.len()),
            "a message holds its cost"
        );
        let flags = if oob { wire::FLAG_OOB } else { 0 } | wire::FLAG_RELIABLE;
        Outgoing {
            payload,
            flags,
            deadline,
            permit,
            owed: None,
        }
    }

    /// A request with id `id`, reserving `room` bytes for its reply: `payload` goes behind
    /// the request header, and `permit` covers both (see [`Outgoing::request_cost`]).
    pub(crate) fn request(
        id: u64,
        room: u32,
        payload: &[u8],
        oob: bool,
        deadline: Option<Instant>,
        permit: Permit,
    ) -> Outgoing {
        let mut header = [0u8; wire::REQUEST_HEADER_BYTES];
        header[..wire::REQUEST_ID_BYTES].copy_from_slice(&id.to_le_bytes());
        header[wire::REQUEST_ID_BYTES..].copy_from_slice(&room.to_le_bytes());
        let flags = if oob { wire::FLAG_OOB } else { 0 } | wire::FLAG_RELIABLE | wire::FLAG_REQUEST;
        let m = Outgoing {
            payload: tagged(&header, payload),
            flags,
            deadline,
            permit,
            owed: None,
        };
        debug_assert_eq!(m.permit.bytes(), m.cost(), "a request holds its cost");
        m
    }

    /// The reply to request `id`: reliable, with no permit of its own (its request's room
    /// paid for it); `owed` counts it as held for its requester until it leaves the queue.
    pub(crate) fn reply(id: u64, payload: &[u8], owed: Owed) -> Outgoing {
        Outgoing {
            payload: tagged(&id.to_le_bytes(), payload),
            flags: wire::FLAG_RELIABLE | wire::FLAG_REPLY,
            deadline: None,
            permit: Permit::none(),
            owed: Some(Box::new(owed)),
        }
    }

    /// The word to request `id` that it cannot be answered, and why: a reply carrying
    /// `status` instead of a payload ([`wire::FLAG_STATUS`]), queued, sent and counted
    /// exactly like a reply.
    pub(crate) fn reply_status(id: u64, status: wire::ReplyStatus, owed: Owed) -> Outgoing {
        let mut m = Outgoing::reply(id, &wire::encode_reply_status(status), owed);
        m.flags |= wire::FLAG_STATUS;
        m
    }

    /// This reply turned into the word that it could not be sent, and why (`status`): same
    /// request id, same place in the queue, the same bytes held for the requester.
    pub(crate) fn into_status(self, status: wire::ReplyStatus) -> Outgoing {
        debug_assert!(self.is_reply(), "only a reply becomes a status");
        let id = wire::request_id(&self.payload).unwrap_or_default();
        Outgoing {
            payload: tagged(&id.to_le_bytes(), &wire::encode_reply_status(status)),
            flags: self.flags | wire::FLAG_STATUS,
            ..self
        }
    }

    /// Window bytes a request of `payload_len` bytes reserving `room` for its reply takes.
    pub(crate) fn request_cost(payload_len: usize, room: u32) -> u64 {
        cost(payload_len + wire::REQUEST_HEADER_BYTES) + u64::from(room)
    }

    /// The same message sent unreliably: no sequence number, no ack, no resend; lost if its
    /// connection breaks.
    pub(crate) fn unreliable(mut self) -> Outgoing {
        self.flags &= !wire::FLAG_RELIABLE;
        self
    }

    /// Whether it is sent reliably (sequence number, acked, resent across reconnects).
    pub fn is_reliable(&self) -> bool {
        self.flags & wire::FLAG_RELIABLE != 0
    }
    /// The message bytes (of a request or a reply: without the id the transport adds).
    pub fn payload(&self) -> &[u8] {
        self.payload
            .get(wire::tag_bytes(self.flags)..)
            .unwrap_or_default()
    }
    /// Whether it is a request (sent with `Sender::request` or `send_request`).
    pub fn is_request(&self) -> bool {
        self.flags & wire::FLAG_REQUEST != 0
    }
    /// Whether it is the reply to a request (`Delivery::reply`).
    pub fn is_reply(&self) -> bool {
        self.flags & wire::FLAG_REPLY != 0
    }
    /// Whether it is a reply that says why its request cannot be answered instead of
    /// carrying a payload (its [`payload`](Outgoing::payload) is the encoded status).
    pub fn is_status(&self) -> bool {
        self.flags & wire::FLAG_STATUS != 0
    }
    /// Whether it was sent out of band.
    pub fn is_oob(&self) -> bool {
        self.flags & wire::FLAG_OOB != 0
    }
    /// When it expires if still queued.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
    /// Window bytes it holds: its length plus 16.
    pub fn cost(&self) -> u64 {
        crate::flow::frame_cost(self.flags, &self.payload)
    }

    /// Gives up the message for its permit (to give back, or to enter the ledger).
    pub(crate) fn into_permit(self) -> Permit {
        self.permit
    }

    /// The message taken apart to be published: its payload, flags and permit. A reply's
    /// hold on its requester's credit ends here.
    // Inlined, and `owed` dropped only where there is one: once per message on the IO
    // thread, where an out-of-line drop of the (nearly always empty) box cost a call.
    #[inline]
    pub(crate) fn into_parts(self) -> (Bytes, u8, Permit) {
        let Outgoing {
            payload,
            flags,
            permit,
            owed,
            ..
        } = self;
        if let Some(owed) = owed {
            drop(owed);
        }
        (payload, flags, permit)
    }
}

/// `payload` behind `header` (a request's header, a reply's id), as they travel.
fn tagged(header: &[u8], payload: &[u8]) -> Bytes {
    let mut b = bytes::BytesMut::with_capacity(header.len() + payload.len());
    b.extend_from_slice(header);
    b.extend_from_slice(payload);
    b.freeze()
}

/// Why permits went back to a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Return {
    /// The receiver consumed the message and returned credit.
    Credited = 0,
    /// The outbound filter dropped the message at publish time.
    Filtered = 1,
    /// The message's deadline passed while it was queued.
    Expired = 2,
    /// The message failed before publication (peer removed, node shut down, too large for
    /// the peer).
    Failed = 3,
    /// The outbox was already closed when the message arrived (or a `connected_only` send
    /// found its peer disconnected once it had its permits).
    Refused = 4,
    /// Published, but its credit can never come back (the peer restarted or was removed).
    Retired = 5,
    /// An unreliable message a broken connection swallowed (found at the next handshake).
    Lost = 6,
    /// A request its requester gave up (timed out, or its handle dropped) before it left
    /// the queue: withdrawn, never sent.
    Withdrawn = 7,
}

const RETURNS: usize = 8;

#[derive(Debug, Default)]
struct Queue {
    msgs: VecDeque<Outgoing>,
    closed: bool,
    /// Messages and payload bytes ever admitted: counted under the lock that admits them
    /// (no extra atomic on the send path, and never behind what the IO thread has taken).
    accepted: u64,
    accepted_bytes: u64,
}

/// A peer's send window and queue of accepted, unpublished messages.
///
/// ```
/// use cohort::internals::flow::cost;
/// use cohort::internals::peer::{self, Outbox, Return};
/// let ob = Outbox::new(1024);
/// let payload = cohort::Bytes::from_static(b"hi");
/// let permit = ob.window().try_acquire(cost(payload.len())).unwrap();
/// ob.admit(peer::outgoing(payload, false, None, permit)).unwrap();
/// let mut taken = std::collections::VecDeque::new();
/// ob.take_into(&mut taken);
/// let m = taken.pop_front().unwrap();
/// let cost = m.cost();
/// ob.give_back(Return::Filtered, peer::into_permit(m));
/// assert_eq!(ob.window().available(), 1024);
/// assert_eq!(ob.returned(Return::Filtered), cost);
/// ```
#[derive(Debug)]
pub struct Outbox {
    window: SendWindow,
    queue: Mutex<Queue>,
    returned: [AtomicU64; RETURNS],
}

impl Outbox {
    /// An open outbox with a window of `window` bytes.
    pub fn new(window: u64) -> Outbox {
        Outbox {
            window: SendWindow::new(window),
            queue: Mutex::new(Queue::default()),
            returned: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// The send window.
    pub fn window(&self) -> &SendWindow {
        &self.window
    }

    /// Queues `m`, whose [`Outgoing::cost`] the caller has taken from the window, and counts
    /// it *accepted*. If the outbox is closed its permits go back at once
    /// (`Return::Refused`) and it is handed back.
    pub fn admit(&self, mut m: Outgoing) -> Result<(), Outgoing> {
        let mut q = self.queue.lock();
        if q.closed {
            drop(q);
            let permit = std::mem::replace(&mut m.permit, Permit::none());
            self.give_back(Return::Refused, permit);
            return Err(m);
        }
        q.accepted += 1;
        q.accepted_bytes += m.payload.len() as u64;
        q.msgs.push_back(m);
        Ok(())
    }

    /// Queues every message of `ms` in order under one lock (what [`admit`](Outbox::admit)
    /// does for each), leaving `ms` empty. If the outbox is closed nothing is queued: every
    /// message's permits go back at once (`Return::Refused`) and `ms` keeps them all.
    /// Returns whether they were queued.
    pub fn admit_all(&self, ms: &mut Vec<Outgoing>) -> bool {
        let mut q = self.queue.lock();
        if q.closed {
            drop(q);
            for m in ms.iter_mut() {
                let permit = std::mem::replace(&mut m.permit, Permit::none());
                self.give_back(Return::Refused, permit);
            }
            return false;
        }
        q.accepted += ms.len() as u64;
        q.accepted_bytes += ms.iter().map(|m| m.payload.len() as u64).sum::<u64>();
        q.msgs.extend(ms.drain(..));
        true
    }

    /// Messages and payload bytes admitted so far. Read it after the counters of what became
    /// of them (sent, filtered, failed): it never lags them.
    pub fn accepted(&self) -> (u64, u64) {
        let q = self.queue.lock();
        (q.accepted, q.accepted_bytes)
    }

    /// Moves every queued message to the back of `into` (one lock, no copy when `into` is
    /// empty: the queues are swapped).
    pub fn take_into(&self, into: &mut VecDeque<Outgoing>) {
        let mut q = self.queue.lock();
        if into.is_empty() {
            std::mem::swap(&mut q.msgs, into);
        } else {
            into.extend(q.msgs.drain(..));
        }
    }

    /// The IO thread's next message to publish to this peer (`Remote::publish`): the front
    /// of `pending` (taken earlier, not yet published), else the front of what senders
    /// queued since — taken after clearing the peer's `scheduled` flag
    /// ([`Scheduled::clear_then`]), so that a message this take misses finds the flag clear
    /// and its sender schedules the peer again. `None` once nothing is queued.
    pub fn next_to_publish(
        &self,
        scheduled: &Scheduled,
        pending: &mut VecDeque<Outgoing>,
    ) -> Option<Outgoing> {
        if pending.is_empty() {
            scheduled.clear_then(|| self.take_into(pending));
        }
        pending.pop_front()
    }

    /// The peer returned `credit` bytes (`Remote::on_ack`): gives back what `ledger` lets go
    /// (never more than is outstanding) as [`Return::Credited`]. Returns the bytes given
    /// back.
    pub fn credit(&self, ledger: &mut Ledger, credit: u64) -> u64 {
        let permit = ledger.credit(credit);
        let bytes = permit.bytes();
        self.give_back(Return::Credited, permit);
        bytes
    }

    /// The peer is retired (`Remote::retire`: removed, or the node shuts down): closes the
    /// outbox and fails every message not published — `pending`, taken earlier, and what is
    /// queued — giving their permits back as [`Return::Failed`]. Returns them, permits
    /// taken, for the caller to report.
    pub fn fail_queued(&self, pending: &mut VecDeque<Outgoing>) -> VecDeque<Outgoing> {
        let mut queued = std::mem::take(pending);
        queued.extend(self.close());
        let mut permits = Permit::none();
        for m in &mut queued {
            permits.absorb(std::mem::replace(&mut m.permit, Permit::none()));
        }
        self.give_back(Return::Failed, permits);
        queued
    }

    /// The peer will never credit what it was sent (`Remote::retire`): what `ledger` holds goes
    /// back as [`Return::Retired`], and the window closes (senders waiting on it wake with
    /// `Closed`).
    pub fn retire(&self, ledger: &mut Ledger) {
        self.give_back(Return::Retired, ledger.retire());
        self.window.close();
    }

    /// Whether no message is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.lock().msgs.is_empty()
    }

    /// Refuses new messages from now on and returns what is queued (the caller fails them
    /// through [`give_back`](Outbox::give_back)).
    pub fn close(&self) -> VecDeque<Outgoing> {
        let mut q = self.queue.lock();
        q.closed = true;
        std::mem::take(&mut q.msgs)
    }

    /// Refuses new messages but keeps what is queued (shutdown: still flushed).
    pub fn close_keep(&self) {
        self.queue.lock().closed = true;
    }

    /// Whether the outbox refuses new messages.
    #[cfg(any(test, cohort_internals))]
    pub fn is_closed(&self) -> bool {
        self.queue.lock().closed
    }

    /// The one place permits go back to the window.
    pub fn give_back(&self, why: Return, permit: Permit) {
        let bytes = permit.bytes();
        if bytes > 0 {
            // Relaxed: statistics; the window's own release carries the ordering.
            self.returned[why as usize].fetch_add(bytes, Ordering::Relaxed);
        }
        self.window.release(permit);
    }

    /// Window bytes given back for `why` so far.
    pub fn returned(&self, why: Return) -> u64 {
        self.returned[why as usize].load(Ordering::Relaxed)
    }
}

/// The IO thread's account of published messages: the permits of what was published to the
/// peer and not yet credited back.
#[derive(Debug)]
pub struct Ledger {
    uncredited: Permit,
}

impl Default for Ledger {
    fn default() -> Ledger {
        Ledger {
            uncredited: Permit::none(),
        }
    }
}

impl Ledger {
    /// A message holding `permit` was published.
    pub fn publish(&mut self, permit: Permit) {
        self.uncredited.absorb(permit);
    }

    /// The peer returned `credit` bytes. Returns the permit that may go back to the window:
    /// never more than is uncredited (a confused or malicious peer cannot inflate a window).
    pub fn credit(&mut self, credit: u64) -> Permit {
        self.uncredited.take(credit)
    }

    /// `bytes` of what is outstanding will never be credited (unreliable messages lost with
    /// a connection). Returns the permit the caller gives back: never more than is
    /// outstanding.
    pub fn forget(&mut self, bytes: u64) -> Permit {
        self.uncredited.take(bytes)
    }

    /// The peer will never credit what is outstanding (restart, removal): returns all of it.
    pub fn retire(&mut self) -> Permit {
        std::mem::replace(&mut self.uncredited, Permit::none())
    }

    /// Bytes published and not yet credited.
    pub fn uncredited(&self) -> u64 {
        self.uncredited.bytes()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Ev {
        /// try_send of a message of this length
        Accept(u16),
        /// the writer takes the queue and publishes (true) or filters (false) each message
        Write(Vec<bool>),
        /// the peer returns this much credit
        Credit(u32),
        /// the peer is removed
        Remove,
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            4 => (0u16..3000).prop_map(Ev::Accept),
            3 => proptest::collection::vec(any::<bool>(), 0..8).prop_map(Ev::Write),
            3 => (0u32..20_000).prop_map(Ev::Credit),
            1 => Just(Ev::Remove),
        ]
    }

    proptest! {
        /// Any sequence of accept / publish / filter / credit / remove keeps
        /// `in_flight == cost(queued) + uncredited` and never releases more than was taken
        /// (the window asserts that in debug builds).
        #[test]
        fn permits_are_conserved(events in proptest::collection::vec(ev(), 0..200)) {
            const W: u64 = 16 * 1024;
            let ob = Outbox::new(W);
            let mut ledger = Ledger::default();
            let mut pending: VecDeque<Outgoing> = VecDeque::new();
            let mut consumed_not_credited = 0u64; // what the "receiver" could still credit
            for e in events {
                match e {
                    Ev::Accept(len) => {
                        if let Ok(permit) = ob.window().try_acquire(cost(len as usize)) {
                            let payload = Bytes::from(vec![0u8; len as usize]);
                            let _ = ob.admit(Outgoing::new(payload, false, None, permit));
                        }
                    }
                    Ev::Write(decisions) => {
                        ob.take_into(&mut pending);
                        for publish in decisions {
                            let Some(m) = pending.pop_front() else { break };
                            if publish {
                                consumed_not_credited += m.cost();
                                ledger.publish(m.into_permit());
                            } else {
                                ob.give_back(Return::Filtered, m.into_permit());
                            }
                        }
                    }
                    Ev::Credit(c) => {
                        // A well-behaved receiver credits at most what it consumed; a bad one
                        // sends more, and the ledger clamps.
                        let c = u64::from(c);
                        consumed_not_credited = consumed_not_credited.saturating_sub(c);
                        let back = ledger.credit(c);
                        ob.give_back(Return::Credited, back);
                    }
                    Ev::Remove => {
                        for m in ob.close().into_iter().chain(pending.drain(..)) {
                            ob.give_back(Return::Failed, m.into_permit());
                        }
                        ob.give_back(Return::Retired, ledger.retire());
                    }
                }
                let queued: u64 = {
                    let mut all = VecDeque::new();
                    // Peek without consuming: take, measure, put back in order.
                    ob.take_into(&mut all);
                    let n = all.iter().map(Outgoing::cost).sum::<u64>();
                    let q = &mut ob.queue.lock().msgs;
                    all.extend(q.drain(..));
                    *q = all;
                    n
                };
                let pending_cost: u64 = pending.iter().map(Outgoing::cost).sum();
                prop_assert_eq!(ob.window().in_flight(), queued + pending_cost + ledger.uncredited());
                prop_assert_eq!(ob.window().available() + ob.window().in_flight(), W);
            }
            // Drain: publish nothing more, credit everything, fail the rest.
            for m in ob.close().into_iter().chain(pending.drain(..)) {
                ob.give_back(Return::Failed, m.into_permit());
            }
            let back = ledger.credit(u64::MAX);
            ob.give_back(Return::Credited, back);
            prop_assert_eq!(ob.window().available(), W);
        }
    }

    #[test]
    fn closed_outbox_refuses_and_returns_permits() {
        let ob = Outbox::new(100);
        let permit = ob.window().try_acquire(cost(3)).unwrap();
        let m = Outgoing::new(Bytes::from_static(b"abc"), true, None, permit);
        assert!(ob.close().is_empty());
        let back = ob.admit(m).unwrap_err();
        assert!(back.is_oob());
        assert_eq!(ob.window().available(), 100);
        assert_eq!(ob.returned(Return::Refused), cost(3));
    }

    #[test]
    fn ledger_clamps_excess_credit() {
        let w = SendWindow::new(100);
        let mut l = Ledger::default();
        l.publish(w.try_acquire(10).unwrap());
        let back = l.credit(25);
        assert_eq!(back.bytes(), 10);
        w.release(back);
        assert_eq!(l.uncredited(), 0);
        l.publish(w.try_acquire(5).unwrap());
        let back = l.retire();
        assert_eq!(back.bytes(), 5);
        w.release(back);
        assert_eq!(w.available(), 100);
    }

    /// A permit dropped without being given back is a lost window byte: debug builds catch
    /// it where it happens.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "dropped without being given back")]
    fn a_permit_dropped_without_being_given_back_panics() {
        let w = SendWindow::new(100);
        let permit = w.try_acquire(10).unwrap();
        drop(permit);
    }
}
