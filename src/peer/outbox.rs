//! A peer's outbox: its send window, the queue of accepted messages, and the one place where
//! permits go back to the window.
//!
//! Permits are conserved by construction. A message's `cost(len)` bytes are taken from the
//! window in one place, by its sender (`SendCore::enqueue_to`, `src/node/send.rs`), before
//! [`Outbox::admit`] queues it; they go back exactly once, through [`Outbox::give_back`],
//! naming why ([`Return`]):
//!
//! | path | where | [`Return`] |
//! |---|---|---|
//! | outbox closed when the message arrived | `admit` | `Refused` |
//! | the outbound filter dropped it at publish time | IO thread, `proto::Peer::publish` | `Filtered` |
//! | its deadline passed while it was queued | IO thread, `Peer::publish` / `Peer::expire_queued` (tick) | `Expired` |
//! | the peer cannot take a message that large | IO thread, `Peer::publish` | `Failed` |
//! | unreliable, for a disconnected peer of a journalling node | IO thread, `Peer::publish` | `Failed` |
//! | the peer was removed / the node shut down with it queued | IO thread, `Peer::retire` | `Failed` |
//! | published, then credited back by the receiver | IO thread, `Peer::on_ack` via [`Ledger::credit`] | `Credited` |
//! | published, then the peer restarted, forgot us or was removed | IO thread, `Peer::bind` / `Peer::forget` / `Peer::retire` via [`Ledger::retire`] | `Retired` |
//! | published unreliable, then lost with its connection | IO thread, `Peer::establish` (handshake counts) via [`Ledger::forget`] | `Lost` |
//!
//! Published messages are tracked by the IO thread's [`Ledger`] (bytes published and not yet
//! credited); queued ones by their presence in a queue. So at every instant
//! `window.in_flight() == cost(queued) + ledger.uncredited()`.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

use crate::flow::{cost, SendWindow};
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::Mutex;
use crate::wire;

/// A message accepted by `send*` and not yet published. The outbound filter sees it.
#[derive(Clone, Debug)]
pub struct Outgoing {
    pub(crate) payload: Bytes,
    pub(crate) flags: u8,
    pub(crate) deadline: Option<Instant>,
}

impl Outgoing {
    /// A reliable regular (`oob == false`) or out-of-band message, optionally expiring at
    /// `deadline` if it has not been published by then.
    pub fn new(payload: Bytes, oob: bool, deadline: Option<Instant>) -> Outgoing {
        let flags = if oob { wire::FLAG_OOB } else { 0 } | wire::FLAG_RELIABLE;
        Outgoing {
            payload,
            flags,
            deadline,
        }
    }

    /// The same message sent unreliably: no sequence number, no ack, no resend; lost if its
    /// connection breaks.
    pub fn unreliable(mut self) -> Outgoing {
        self.flags &= !wire::FLAG_RELIABLE;
        self
    }

    /// Whether it is sent reliably (sequence number, acked, resent across reconnects).
    pub fn is_reliable(&self) -> bool {
        self.flags & wire::FLAG_RELIABLE != 0
    }
    /// The message bytes.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }
    /// Whether it was sent out of band.
    pub fn is_oob(&self) -> bool {
        self.flags & wire::FLAG_OOB != 0
    }
    /// When it expires if still queued.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
    /// Window bytes it holds: [`cost`] of its length.
    pub fn cost(&self) -> u64 {
        cost(self.payload.len())
    }
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
    /// The outbox was already closed when the message arrived.
    Refused = 4,
    /// Published, but its credit can never come back (the peer restarted or was removed).
    Retired = 5,
    /// An unreliable message a broken connection swallowed (found at the next handshake).
    Lost = 6,
}

const RETURNS: usize = 7;

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
/// use cohort::peer::{Outbox, Outgoing, Return};
/// let ob = Outbox::new(1024);
/// let m = Outgoing::new(cohort::Bytes::from_static(b"hi"), false, None);
/// ob.window().try_acquire(m.cost()).unwrap();
/// ob.admit(m).unwrap();
/// let mut taken = std::collections::VecDeque::new();
/// ob.take_into(&mut taken);
/// let m = taken.pop_front().unwrap();
/// ob.give_back(Return::Filtered, m.cost());
/// assert_eq!(ob.window().available(), 1024);
/// assert_eq!(ob.returned(Return::Filtered), m.cost());
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
    pub fn admit(&self, m: Outgoing) -> Result<(), Outgoing> {
        let mut q = self.queue.lock();
        if q.closed {
            drop(q);
            self.give_back(Return::Refused, m.cost());
            return Err(m);
        }
        q.accepted += 1;
        q.accepted_bytes += m.payload.len() as u64;
        q.msgs.push_back(m);
        Ok(())
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
    pub fn is_closed(&self) -> bool {
        self.queue.lock().closed
    }

    /// The one place permits go back to the window.
    pub fn give_back(&self, why: Return, bytes: u64) {
        if bytes == 0 {
            return;
        }
        // Relaxed: statistics; the window's own release carries the ordering.
        self.returned[why as usize].fetch_add(bytes, Ordering::Relaxed);
        self.window.release(bytes);
    }

    /// Window bytes given back for `why` so far.
    pub fn returned(&self, why: Return) -> u64 {
        self.returned[why as usize].load(Ordering::Relaxed)
    }
}

/// The IO thread's account of published messages: window bytes published to the peer and
/// not yet credited back.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Ledger {
    uncredited: u64,
}

impl Ledger {
    /// A message of `cost` bytes was published.
    pub fn publish(&mut self, cost: u64) {
        self.uncredited += cost;
    }

    /// The peer returned `credit` bytes. Returns how many may go back to the window: never
    /// more than is uncredited (a confused or malicious peer cannot inflate a window).
    pub fn credit(&mut self, credit: u64) -> u64 {
        let c = credit.min(self.uncredited);
        self.uncredited -= c;
        c
    }

    /// `bytes` of what is outstanding will never be credited (unreliable messages lost with
    /// a connection). Returns how many the caller gives back: never more than is
    /// outstanding.
    pub fn forget(&mut self, bytes: u64) -> u64 {
        let b = bytes.min(self.uncredited);
        self.uncredited -= b;
        b
    }

    /// The peer will never credit what is outstanding (restart, removal): returns all of it.
    pub fn retire(&mut self) -> u64 {
        std::mem::take(&mut self.uncredited)
    }

    /// Bytes published and not yet credited.
    pub fn uncredited(&self) -> u64 {
        self.uncredited
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
                        let m = Outgoing::new(Bytes::from(vec![0u8; len as usize]), false, None);
                        if ob.window().try_acquire(m.cost()).is_ok() {
                            let _ = ob.admit(m);
                        }
                    }
                    Ev::Write(decisions) => {
                        ob.take_into(&mut pending);
                        for publish in decisions {
                            let Some(m) = pending.pop_front() else { break };
                            if publish {
                                ledger.publish(m.cost());
                                consumed_not_credited += m.cost();
                            } else {
                                ob.give_back(Return::Filtered, m.cost());
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
                        let queued = ob.close();
                        let failed: u64 = queued.iter().chain(pending.iter()).map(Outgoing::cost).sum();
                        pending.clear();
                        ob.give_back(Return::Failed, failed);
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
            let rest: u64 = ob.close().iter().chain(pending.iter()).map(Outgoing::cost).sum();
            ob.give_back(Return::Failed, rest);
            let back = ledger.credit(u64::MAX);
            ob.give_back(Return::Credited, back);
            prop_assert_eq!(ob.window().available(), W);
        }
    }

    #[test]
    fn closed_outbox_refuses_and_returns_permits() {
        let ob = Outbox::new(100);
        let m = Outgoing::new(Bytes::from_static(b"abc"), true, None);
        ob.window().try_acquire(m.cost()).unwrap();
        assert!(ob.close().is_empty());
        let back = ob.admit(m).unwrap_err();
        assert!(back.is_oob());
        assert_eq!(ob.window().available(), 100);
        assert_eq!(ob.returned(Return::Refused), cost(3));
    }

    #[test]
    fn ledger_clamps_excess_credit() {
        let mut l = Ledger::default();
        l.publish(10);
        assert_eq!(l.credit(25), 10);
        assert_eq!(l.uncredited(), 0);
        l.publish(5);
        assert_eq!(l.retire(), 5);
    }
}
