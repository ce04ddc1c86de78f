//! A peer's outbox: its send window, the queue of accepted messages, and the one place where
//! permits go back to the window.
//!
//! Permits are conserved by the types. A sender takes `cost(len)` bytes of window as a
//! [`Permit`] (`SendCore::enqueue_to`, `src/node/send.rs`: the only place a send takes one,
//! but for `SendCore::enqueue_batch`, which takes one for a chunk of messages and splits it
//! among them with `Permit::take`; a journal restore charges the window with
//! `SendWindow::take_up_to`); the message carries it
//! ([`Outgoing`]) into the outbox — or, encoded by its sender into a run of frames
//! ([`Outbox::admit_framed`]), the run holds its messages' permits as one ([`Framed`]) —
//! and, once published, into the IO thread's [`Ledger`]; and it goes back exactly once,
//! through [`Outbox::give_back`], naming why ([`Return`]):
//!
//! | path | where | [`Return`] |
//! |---|---|---|
//! | outbox closed when the message arrived | `admit` | `Refused` |
//! | outbox closed when a batch's chunk arrived (each of its messages) | `admit_all` | `Refused` |
//! | outbox closed when a message to be encoded by its sender arrived (or a batch's chunk) | `admit_framed` / `admit_framed_all` | `Refused` |
//! | the outbound filter dropped it at publish time | IO thread, `proto::Remote::publish` | `Filtered` |
//! | its deadline passed while it was queued | IO thread, `Remote::publish` / `Remote::sweep_queued` (tick) | `Expired` |
//! | the peer cannot take a message that large | IO thread, `Remote::publish` | `Failed` |
//! | a request its requester gave up (timed out, handle dropped) before it left | IO thread, `Remote::publish` / `Remote::sweep_queued` (tick) | `Withdrawn` |
//! | a `connected_only` send whose peer disconnected while it waited for the window | `SendCore::enqueue_to` | `Refused` |
//! | unreliable, for a disconnected peer of a journalling node | IO thread, `Remote::publish` | `Failed` |
//! | the peer was removed / the node shut down with it queued (a run taken apart, each message failed) | IO thread, `Remote::retire` | `Failed` |
//! | published, then credited back by the receiver | IO thread, `Remote::on_ack` via [`Ledger::credit`] | `Credited` |
//! | published, then the peer restarted, forgot us or was removed | IO thread, `Remote::bind` / `Remote::forget` / `Remote::retire` via [`Ledger::retire`] | `Retired` |
//! | published unreliable, then lost with its connection | IO thread, `Remote::establish` (handshake counts) via [`Ledger::forget`] | `Lost` |
//!
//! A permit cannot be copied, and dropping one that holds bytes panics in debug builds, so a
//! path that forgets to give one back fails its tests. At every instant
//! `window.in_flight() == cost(queued) + ledger.uncredited()`.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::{Bytes, BytesMut};

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

/// The largest payload a sender encodes itself ([`Outbox::admit_framed`]): a larger one is
/// queued as it is and encoded by the IO thread (its payload written from where it lies),
/// so that no sender copies much while it holds the outbox's lock. Up to 4 KiB the copy
/// costs less than a message handed to the IO thread alone (measured at 2 and 4 KiB, one
/// and four sending threads); at 8 and 16 KiB it did not pay.
pub const FRAMED_MAX_PAYLOAD: usize = 4096;

/// A run of queued messages stops taking more once its frames reach this many bytes: the IO
/// thread publishes a run whole, so this bounds how far past its high-water mark one run
/// fills a connection's write buffer.
pub const FRAMED_RUN_BYTES: usize = 32 * 1024;

/// Room the outbox's frame buffer takes at a time when it needs more: the buffer is one
/// allocation that successive runs are split from, reused once every run in it has been
/// acknowledged and dropped. With a run's bytes this stays under the size at which the
/// allocator maps and unmaps memory for each buffer (128 KiB by default for glibc).
const FRAMED_BUFFER_BYTES: usize = 64 * 1024;

/// Buffers of acknowledged runs a peer's outbox keeps for its next runs: a sender writes
/// into a recycled buffer rather than a fresh allocation whose pages the kernel must map
/// again (a page fault per 4 KiB written, which cost a third of a 1 KiB message's CPU when
/// the allocator handed the memory back between acks). An ack retires up to
/// `ack_threshold` messages at once (1 024 by default: 16 buffers of 1 KiB messages, 64 of
/// 4 KiB ones), and what it frees was written into while the window was in use; so the
/// outbox keeps as many as the window fills, and never fewer than [`MIN_FREE_BUFFERS`]. That is memory the
/// peer's unacknowledged runs held a moment before: a new buffer is made only when none
/// is kept, so the buffers a peer holds never outnumber those its busiest moment needed.
/// A peer found idle at a tick ([`Outbox::release_buffers`]) or closed lets them all go.
fn free_buffers(window: u64) -> usize {
    let fills = window / FRAMED_BUFFER_BYTES as u64;
    usize::try_from(fills)
        .unwrap_or(usize::MAX)
        .max(MIN_FREE_BUFFERS)
}

/// The fewest buffers an outbox keeps for reuse, however small its window.
const MIN_FREE_BUFFERS: usize = 4;

/// Reliable messages, regular or out-of-band, that their senders encoded themselves
/// ([`Outbox::admit_framed`]), in order: data frames back to back, each with a 0 where its
/// sequence number goes, and the permits of them all. The IO thread numbers and publishes
/// the run whole ([`wire::number_frames`]), with no per-message work but the number and
/// the unacked entry; a run that must go one message at a time (one of them is larger than
/// the peer takes, or it fails unpublished) is taken apart with
/// [`Framed::into_messages`].
#[derive(Debug)]
pub struct Framed {
    frames: BytesMut,
    count: u64,
    payload_bytes: u64,
    largest: usize,
    permit: Permit,
}

impl Framed {
    fn new(frames: BytesMut) -> Framed {
        debug_assert!(frames.is_empty());
        Framed {
            frames,
            count: 0,
            payload_bytes: 0,
            largest: 0,
            permit: Permit::none(),
        }
    }

    /// Appends one message (`flags`: [`wire::FLAG_OOB`] or 0) holding `permit`, its cost.
    #[inline]
    fn push(&mut self, flags: u8, payload: &[u8], permit: Permit) {
        debug_assert_eq!(
            permit.bytes(),
            cost(payload.len()),
            "a message holds its cost"
        );
        debug_assert!(
            self.frames.capacity() - self.frames.len() >= wire::data_frame_len(true, payload.len()),
            "a run never grows: its buffer has room for it"
        );
        wire::encode_unnumbered(&mut self.frames, flags, payload);
        self.count += 1;
        self.payload_bytes += payload.len() as u64;
        self.largest = self.largest.max(payload.len());
        self.permit.absorb(permit);
    }

    /// Messages in the run.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// Whether the run holds no message.
    #[cfg(any(test, cohort_internals))]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Payload bytes of its messages.
    pub fn payload_bytes(&self) -> u64 {
        self.payload_bytes
    }

    /// Its largest payload.
    pub fn largest(&self) -> usize {
        self.largest
    }

    /// Window bytes its messages hold: the sum of their costs.
    #[cfg(any(test, cohort_internals))]
    pub fn cost(&self) -> u64 {
        self.permit.bytes()
    }

    /// The run taken apart to be published whole: its frames (unnumbered), and its permits.
    pub fn into_frames(self) -> (BytesMut, Permit) {
        (self.frames, self.permit)
    }

    /// The run as the messages it holds, in order, each with its own permit: what a run
    /// that cannot be published whole becomes. Their payloads are copied out of the run
    /// (a rare path): a payload the application keeps from a report does not hold the
    /// buffer the run was written in.
    pub fn into_messages(self) -> Vec<Outgoing> {
        let Framed {
            frames,
            count,
            mut permit,
            ..
        } = self;
        let mut msgs = Vec::with_capacity(count as usize);
        for (flags, payload) in wire::numbered_frames(&frames) {
            let p = permit.take(cost(payload.len()));
            msgs.push(Outgoing {
                payload: Bytes::copy_from_slice(&frames[payload]),
                flags,
                deadline: None,
                permit: p,
                owed: None,
            });
        }
        debug_assert_eq!(
            permit.bytes(),
            0,
            "the run's permits all went to its messages"
        );
        msgs
    }
}

/// What the outbox queues, in the order it was admitted: a message as its sender gave it,
/// or a run of messages their senders encoded.
#[derive(Debug)]
pub enum Queued {
    /// One message, encoded when it is published ([`Outbox::admit`]).
    One(Outgoing),
    /// Messages encoded by their senders ([`Outbox::admit_framed`]).
    Framed(Framed),
}

#[cfg(any(test, cohort_internals))]
impl Queued {
    /// Messages it holds.
    pub fn len(&self) -> u64 {
        match self {
            Queued::One(_) => 1,
            Queued::Framed(f) => f.len(),
        }
    }

    /// Whether it holds no message (never, once queued).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Window bytes its messages hold.
    pub fn cost(&self) -> u64 {
        match self {
            Queued::One(m) => m.cost(),
            Queued::Framed(f) => f.cost(),
        }
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
    msgs: VecDeque<Queued>,
    /// The last of `msgs` is a run senders still add to.
    open: bool,
    /// The room left in the buffer the last run was written in, for the next run.
    spare: BytesMut,
    /// Buffers the IO thread handed back ([`Outbox::recycle`]) once every run written in
    /// them was acknowledged: the next buffers, without an allocation (at most
    /// `keep`).
    free: Vec<BytesMut>,
    /// How many buffers `free` holds at most ([`free_buffers`] of the window).
    keep: usize,
    closed: bool,
    /// Messages and payload bytes ever admitted: counted under the lock that admits them
    /// (no extra atomic on the send path, and never behind what the IO thread has taken).
    accepted: u64,
    accepted_bytes: u64,
}

impl Queue {
    /// Opens a run at the back of the queue (ending the open one) whose first frame takes
    /// `need` bytes: in the room left in the last run's buffer, else in a buffer handed
    /// back, else in a new one. A run never grows its buffer: one that is full ends, and
    /// the next starts in another buffer, so no frame is ever copied twice here.
    fn start_run(&mut self, need: usize) {
        self.close_run();
        let mut frames = std::mem::take(&mut self.spare);
        if frames.capacity() < need {
            let want = need.max(FRAMED_BUFFER_BYTES);
            frames = match self.free.pop() {
                Some(mut b) => {
                    // Held by nobody else: `reserve` takes its whole allocation back.
                    b.reserve(want);
                    b
                }
                None => BytesMut::with_capacity(want),
            };
        }
        self.open = true;
        self.msgs.push_back(Queued::Framed(Framed::new(frames)));
    }

    /// Ends the open run, if any: the next framed message starts another, in the room its
    /// buffer has left (split off, not copied).
    #[inline]
    fn close_run(&mut self) {
        if std::mem::take(&mut self.open) {
            if let Some(Queued::Framed(f)) = self.msgs.back_mut() {
                let len = f.frames.len();
                self.spare = f.frames.split_off(len);
            }
        }
    }
}

/// A peer's send window and queue of accepted, unpublished messages.
///
/// ```
/// use cohort::internals::flow::cost;
/// use cohort::internals::peer::{self, Outbox, Queued, Return};
/// let ob = Outbox::new(1024);
/// let payload = cohort::Bytes::from_static(b"hi");
/// let permit = ob.window().try_acquire(cost(payload.len())).unwrap();
/// ob.admit(peer::outgoing(payload, false, None, permit)).unwrap();
/// let mut taken = std::collections::VecDeque::new();
/// ob.take_into(&mut taken);
/// let Some(Queued::One(m)) = taken.pop_front() else { unreachable!("one message") };
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
            queue: Mutex::new(Queue {
                keep: free_buffers(window),
                ..Queue::default()
            }),
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
        q.close_run();
        q.accepted += 1;
        q.accepted_bytes += m.payload.len() as u64;
        q.msgs.push_back(Queued::One(m));
        Ok(())
    }

    /// Queues a reliable message (`oob`: out of band) of at most [`FRAMED_MAX_PAYLOAD`]
    /// bytes, whose cost the caller has taken from the window as `permit`, encoded here as
    /// the frame it travels in (its sequence number written when it is published), and
    /// counts it *accepted*. If the outbox is closed its permits go back at once
    /// (`Return::Refused`) and it returns `false`.
    ///
    /// The sender copies the payload into the last run of the queue ([`Framed`]), so the
    /// IO thread publishes what senders queued a run at a time, and the payload is the
    /// caller's again when this returns: no reference count of it crosses threads.
    pub fn admit_framed(&self, oob: bool, payload: &[u8], permit: Permit) -> bool {
        self.admit_framed_all(oob, std::iter::once((payload, permit)))
    }

    /// Queues every message of `msgs` (each a payload and its cost, taken as its permit)
    /// in order, under one lock, as [`admit_framed`](Outbox::admit_framed) does for one.
    /// If the outbox is closed nothing is queued, every permit goes back
    /// (`Return::Refused`), and it returns `false`.
    pub fn admit_framed_all<'p>(
        &self,
        oob: bool,
        msgs: impl Iterator<Item = (&'p [u8], Permit)>,
    ) -> bool {
        let flags = if oob { wire::FLAG_OOB } else { 0 };
        let mut q = self.queue.lock();
        if q.closed {
            drop(q);
            let mut back = Permit::none();
            msgs.for_each(|(_, p)| back.absorb(p));
            self.give_back(Return::Refused, back);
            return false;
        }
        let q = &mut *q;
        for (payload, permit) in msgs {
            debug_assert!(payload.len() <= FRAMED_MAX_PAYLOAD);
            let need = wire::data_frame_len(true, payload.len());
            let fits = q.open
                && matches!(q.msgs.back(), Some(Queued::Framed(f))
                    if f.frames.len() < FRAMED_RUN_BYTES
                        && f.frames.capacity() - f.frames.len() >= need);
            if !fits {
                q.start_run(need);
            }
            let Some(Queued::Framed(run)) = q.msgs.back_mut() else {
                unreachable!("the open run is the last of the queue")
            };
            run.push(flags, payload, permit);
            q.accepted += 1;
            q.accepted_bytes += payload.len() as u64;
        }
        true
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
        q.close_run();
        q.accepted += ms.len() as u64;
        q.accepted_bytes += ms.iter().map(|m| m.payload.len() as u64).sum::<u64>();
        q.msgs.extend(ms.drain(..).map(Queued::One));
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
    pub fn take_into(&self, into: &mut VecDeque<Queued>) {
        let mut q = self.queue.lock();
        q.close_run();
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
        pending: &mut VecDeque<Queued>,
    ) -> Option<Queued> {
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
    pub fn fail_queued(&self, pending: &mut VecDeque<Queued>) -> VecDeque<Outgoing> {
        let mut queued = messages(std::mem::take(pending));
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

    /// Refuses new messages from now on and returns what is queued, one by one (the
    /// caller fails them through [`give_back`](Outbox::give_back)).
    pub fn close(&self) -> VecDeque<Outgoing> {
        let mut q = self.queue.lock();
        q.closed = true;
        q.close_run();
        let queued = std::mem::take(&mut q.msgs);
        // No run will be written again: the buffers go (freed outside the lock).
        let buffers = (std::mem::take(&mut q.spare), std::mem::take(&mut q.free));
        drop(q);
        drop(buffers);
        messages(queued)
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

    /// The IO thread hands back `buffers`, in each of which every run the senders wrote
    /// was acknowledged (and which nothing else holds): the next runs that need a buffer
    /// take them instead of allocating (at most [`free_buffers`] of the window are kept;
    /// the rest are freed, outside the lock). Leaves `buffers` empty. A buffer some other handle
    /// still shares would be safe here too, only of no use: views of one allocation never
    /// overlap, and `reserve` allocates afresh when it cannot take the whole allocation.
    pub fn recycle(&self, buffers: &mut Vec<BytesMut>) {
        let mut q = self.queue.lock();
        if !q.closed {
            while q.free.len() < q.keep {
                let Some(mut b) = buffers.pop() else { break };
                b.clear();
                q.free.push(b);
            }
        }
        drop(q);
        buffers.clear();
    }

    /// Lets the run buffers go — the room left in the last one and those kept for reuse —
    /// when no run is open: the IO thread's tick calls it for a peer with nothing queued
    /// and nothing unacknowledged, so an idle peer holds no buffer (the next message
    /// encoded by its sender takes a new one). The buffers are freed outside the lock.
    pub fn release_buffers(&self) {
        let mut q = self.queue.lock();
        if q.open || (q.free.is_empty() && q.spare.capacity() == 0) {
            return;
        }
        let buffers = (std::mem::take(&mut q.spare), std::mem::take(&mut q.free));
        drop(q);
        drop(buffers);
    }

    /// Buffer bytes the outbox holds for runs not yet written: the room left in the last
    /// buffer and the buffers kept for reuse.
    #[cfg(any(test, cohort_internals))]
    pub fn spare_bytes(&self) -> usize {
        let q = self.queue.lock();
        q.spare.capacity() + q.free.iter().map(BytesMut::capacity).sum::<usize>()
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

/// The messages of `queued`, one by one, in order (runs taken apart).
fn messages(queued: VecDeque<Queued>) -> VecDeque<Outgoing> {
    let mut msgs = VecDeque::with_capacity(queued.len());
    for q in queued {
        match q {
            Queued::One(m) => msgs.push_back(m),
            Queued::Framed(f) => msgs.extend(f.into_messages()),
        }
    }
    msgs
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
        /// try_send of a message of this length, encoded by its sender (true) or not
        Accept(u16, bool),
        /// the writer takes the queue and publishes (true) or filters (false) each message;
        /// a run it filters is taken apart first (one decision)
        Write(Vec<bool>),
        /// the peer returns this much credit
        Credit(u32),
        /// the peer is removed
        Remove,
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![
            4 => (0u16..3000, any::<bool>()).prop_map(|(l, f)| Ev::Accept(l, f)),
            3 => proptest::collection::vec(any::<bool>(), 0..8).prop_map(Ev::Write),
            3 => (0u32..20_000).prop_map(Ev::Credit),
            1 => Just(Ev::Remove),
        ]
    }

    /// Fails what is queued and pending (what `fail_queued` does), permits back.
    fn fail_all(ob: &Outbox, pending: &mut VecDeque<Queued>) {
        for m in ob.fail_queued(pending) {
            assert_eq!(m.permit.bytes(), 0, "fail_queued took the permits");
        }
    }

    proptest! {
        /// Any sequence of accept / publish / filter / credit / remove keeps
        /// `in_flight == cost(queued) + uncredited` and never releases more than was taken
        /// (the window asserts that in debug builds), with messages queued one by one and
        /// in runs their senders encoded.
        #[test]
        fn permits_are_conserved(events in proptest::collection::vec(ev(), 0..200)) {
            const W: u64 = 16 * 1024;
            let ob = Outbox::new(W);
            let mut ledger = Ledger::default();
            let mut pending: VecDeque<Queued> = VecDeque::new();
            let mut accepted = 0u64;
            for e in events {
                match e {
                    Ev::Accept(len, framed) => {
                        if let Ok(permit) = ob.window().try_acquire(cost(len as usize)) {
                            let payload = Bytes::from(vec![7u8; len as usize]);
                            // Only a payload up to the limit is encoded by its sender.
                            let queued = if framed && payload.len() <= FRAMED_MAX_PAYLOAD {
                                ob.admit_framed(false, &payload, permit)
                            } else {
                                ob.admit(Outgoing::new(payload, false, None, permit)).is_ok()
                            };
                            accepted += u64::from(queued);
                        }
                    }
                    Ev::Write(decisions) => {
                        ob.take_into(&mut pending);
                        for publish in decisions {
                            match pending.pop_front() {
                                None => break,
                                Some(Queued::One(m)) if publish => ledger.publish(m.into_permit()),
                                Some(Queued::One(m)) => {
                                    ob.give_back(Return::Filtered, m.into_permit());
                                }
                                Some(Queued::Framed(f)) if publish => {
                                    let (frames, permit) = f.into_frames();
                                    prop_assert!(wire::numbered_frames(&frames)
                                        .all(|(_, p)| frames[p].iter().all(|&b| b == 7)));
                                    ledger.publish(permit);
                                }
                                Some(Queued::Framed(f)) => {
                                    let n = f.len();
                                    let msgs = f.into_messages();
                                    prop_assert_eq!(msgs.len() as u64, n);
                                    for m in msgs.into_iter().rev() {
                                        pending.push_front(Queued::One(m));
                                    }
                                }
                            }
                        }
                    }
                    Ev::Credit(c) => {
                        // A well-behaved receiver credits at most what it consumed; a bad one
                        // sends more, and the ledger clamps.
                        let back = ledger.credit(u64::from(c));
                        ob.give_back(Return::Credited, back);
                    }
                    Ev::Remove => {
                        fail_all(&ob, &mut pending);
                        ob.give_back(Return::Retired, ledger.retire());
                    }
                }
                let queued: u64 = {
                    let mut all = VecDeque::new();
                    // Peek without consuming: take, measure, put back in order.
                    ob.take_into(&mut all);
                    let n = all.iter().map(Queued::cost).sum::<u64>();
                    let q = &mut ob.queue.lock().msgs;
                    all.extend(q.drain(..));
                    *q = all;
                    n
                };
                let pending_cost: u64 = pending.iter().map(Queued::cost).sum();
                prop_assert_eq!(ob.window().in_flight(), queued + pending_cost + ledger.uncredited());
                prop_assert_eq!(ob.window().available() + ob.window().in_flight(), W);
                prop_assert_eq!(ob.accepted().0, accepted);
            }
            // Drain: publish nothing more, credit everything, fail the rest.
            fail_all(&ob, &mut pending);
            let back = ledger.credit(u64::MAX);
            ob.give_back(Return::Credited, back);
            prop_assert_eq!(ob.window().available(), W);
        }
    }

    /// A run of framed messages taken apart gives each message back as it was sent, with
    /// its own cost, in order; regular and out-of-band runs stay apart.
    #[test]
    fn a_run_taken_apart_is_its_messages_in_order() {
        let ob = Outbox::new(1 << 20);
        let payloads: Vec<Vec<u8>> = (0..50u8).map(|i| vec![i; i as usize * 3]).collect();
        for (i, p) in payloads.iter().enumerate() {
            let permit = ob.window().try_acquire(cost(p.len())).unwrap();
            assert!(ob.admit_framed(i == 20, p, permit));
        }
        let mut pending = VecDeque::new();
        ob.take_into(&mut pending);
        // The out-of-band message needs its own flags: same run, its own flag byte.
        let msgs: Vec<Outgoing> = pending
            .drain(..)
            .flat_map(|q| match q {
                Queued::Framed(f) => f.into_messages(),
                Queued::One(_) => panic!("nothing was queued unframed"),
            })
            .collect();
        assert_eq!(msgs.len(), payloads.len());
        for (i, (m, p)) in msgs.into_iter().zip(&payloads).enumerate() {
            assert_eq!(m.payload(), &p[..]);
            assert_eq!(m.is_oob(), i == 20);
            assert!(m.is_reliable());
            assert_eq!(m.permit.bytes(), cost(p.len()));
            ob.give_back(Return::Failed, m.into_permit());
        }
        assert_eq!(ob.window().available(), 1 << 20);
        assert_eq!(
            ob.accepted(),
            (50, payloads.iter().map(|p| p.len() as u64).sum())
        );
    }

    /// Buffers handed back are reused by the next runs, at most as many as the window fills
    /// are kept, and an idle peer's release (or a close) lets every one go.
    #[test]
    fn buffers_are_reused_and_let_go() {
        const KEPT: usize = 16;
        assert_eq!(free_buffers(KEPT as u64 * FRAMED_BUFFER_BYTES as u64), KEPT);
        assert_eq!(
            free_buffers(1000),
            MIN_FREE_BUFFERS,
            "however small the window"
        );
        let ob = Outbox::new(KEPT as u64 * FRAMED_BUFFER_BYTES as u64);
        let mut handed = Vec::new();
        for _ in 0..KEPT + 2 {
            handed.push(BytesMut::with_capacity(FRAMED_BUFFER_BYTES));
        }
        ob.recycle(&mut handed);
        assert!(handed.is_empty());
        assert_eq!(ob.spare_bytes(), KEPT * FRAMED_BUFFER_BYTES);
        // A run too large for the room left takes a kept buffer, not a new allocation.
        let permit = ob.window().try_acquire(cost(100)).unwrap();
        assert!(ob.admit_framed(false, &[1u8; 100], permit));
        let mut pending = VecDeque::new();
        ob.take_into(&mut pending);
        assert_eq!(
            ob.spare_bytes(),
            KEPT * FRAMED_BUFFER_BYTES - wire::data_frame_len(true, 100),
            "the run was written in a kept buffer, its room left over"
        );
        ob.release_buffers();
        assert_eq!(ob.spare_bytes(), 0, "an idle peer holds no buffer");
        let Some(Queued::Framed(run)) = pending.pop_front() else {
            panic!("one run")
        };
        ob.give_back(Return::Failed, run.into_frames().1);
        ob.recycle(&mut vec![BytesMut::with_capacity(1024)]);
        assert!(ob.spare_bytes() > 0);
        assert!(ob.close().is_empty());
        assert_eq!(ob.spare_bytes(), 0, "a closed outbox holds no buffer");
        ob.recycle(&mut vec![BytesMut::with_capacity(1024)]);
        assert_eq!(ob.spare_bytes(), 0, "nor takes one back");
    }

    /// A run stops growing at its size: the IO thread publishes runs whole, and one run
    /// bounds how far past its mark it fills a write buffer.
    #[test]
    fn runs_are_bounded() {
        let ob = Outbox::new(1 << 24);
        let payload = [1u8; 1000];
        for _ in 0..1000 {
            let permit = ob.window().try_acquire(cost(payload.len())).unwrap();
            assert!(ob.admit_framed(false, &payload, permit));
        }
        let mut pending = VecDeque::new();
        ob.take_into(&mut pending);
        assert!(pending.len() > 1);
        assert_eq!(pending.iter().map(Queued::len).sum::<u64>(), 1000);
        for q in pending.drain(..) {
            let Queued::Framed(f) = q else {
                panic!("framed")
            };
            let (frames, permit) = f.into_frames();
            assert!(frames.len() < FRAMED_RUN_BYTES + wire::data_frame_len(true, 1000));
            ob.give_back(Return::Failed, permit);
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
        let permit = ob.window().try_acquire(cost(3)).unwrap();
        assert!(!ob.admit_framed(false, b"abc", permit));
        assert_eq!(ob.window().available(), 100);
        assert_eq!(ob.returned(Return::Refused), 2 * cost(3));
        assert_eq!(ob.accepted(), (0, 0));
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
