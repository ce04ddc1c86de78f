//! Delivery to the application: a worker pool, one batch queue per sender with an atomic
//! delivering state word (at most one pool thread delivers a sender's regular messages at
//! any moment, in order), and per sender an out-of-band queue that at most its fair share of
//! the pool's threads drain at once, in any order.

mod buffers;
mod credit;
mod inbox;
mod member;
mod oob;
mod pool;
mod progress;
mod room;

pub use buffers::ReadBuffers;
pub use credit::PeerCreditSink;
pub use inbox::{Inbox, InboxIter, InboxRecv, InboxTryIter, RecvError};
pub use member::{CreditSink, MemberQueue, Queued, Run, RunOutcome};
pub use oob::{OobQueue, OobRun};
pub(crate) use pool::on_pool_thread;
pub use pool::{Handler, Next, Pool, PoolStats, Task, TaskQueue};
pub use progress::Progress;
pub(crate) use room::ReplyRoom;

use std::any::Any;
use std::fmt;
use std::ops::Range;

use bytes::Bytes;

use crate::sync::{Arc, SharedStr};
use crate::wire::ReplyStatus;

/// What deliveries need of the receiving node's send half. `deliver` sits below `node` and
/// names none of its types: the node's `Sender` implements this trait, the deliveries carry
/// it as a [`NodeRef`], and `node` reads its `Sender` back ([`NodeHandle::as_any`]) where
/// the public API hands it out (`Delivery::sender`, `Delivery::reply`).
pub trait NodeHandle: fmt::Debug + Send + Sync + 'static {
    /// A handle of its own for one delivering thread (a pool worker, an inbox): the
    /// deliveries' clones of it then touch a reference count no other thread touches.
    fn fork(&self) -> NodeRef;
    /// Tells `to` that its request `id` goes unanswered, and why (`status`): a reply status
    /// instead of a reply. A failure (the requester removed, the node shut down) is logged.
    fn reply_status(&self, to: &str, id: u64, status: ReplyStatus);
    /// The handle as `Any`, for `node` to read its own type back.
    fn as_any(&self) -> &dyn Any;
}

/// The receiving node's send half, as a delivery, the pool and an inbox carry it.
pub type NodeRef = Arc<dyn NodeHandle>;

/// What the messages of one run that one deliverer hands over in one turn share: the
/// sender's name, the receiving node's send handle and the run's bytes, where their payloads
/// lie. Made once per run and turn, so handing one over takes one reference count (this
/// one's, on a line the deliverer's core holds), where an origin of name and handle alone
/// and a slice of the run's bytes took two (the run buffer's a line the IO thread touches
/// too), and a delivery of its own takes three.
pub(crate) struct Origin {
    from: SharedStr,
    node: Option<NodeRef>,
    frames: Bytes,
    /// Where the run's read buffer goes when this drops the last view of it.
    home: Option<Arc<ReadBuffers>>,
}

impl Origin {
    /// The origin of messages from `from` lying in `frames`, carrying `node`; `frames`'s
    /// read buffer goes back to `home` when the last view of it goes.
    pub(crate) fn new(
        from: SharedStr,
        node: Option<NodeRef>,
        frames: Bytes,
        home: Option<Arc<ReadBuffers>>,
    ) -> Origin {
        Origin {
            from,
            node,
            frames,
            home,
        }
    }

    /// Whether the payloads of `frames` lie in this origin's bytes (the same view of the
    /// same buffer: while this holds it, no other run's bytes start there).
    fn holds(&self, frames: &Bytes) -> bool {
        self.frames.as_ptr() == frames.as_ptr() && self.frames.len() == frames.len()
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            home.give_if_last(std::mem::take(&mut self.frames));
        }
    }
}

impl fmt::Debug for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Origin")
            .field("from", &self.from)
            .field("run_bytes", &self.frames.len())
            .finish_non_exhaustive()
    }
}

/// A message handed to the application's handler.
///
/// ```
/// # use cohort::Delivery;
/// let builder = cohort::Node::builder("beta").on_message(|d: Delivery| {
///     println!("{} bytes from {} (seq {:?}, oob {})", d.payload().len(), d.from(), d.seq(), d.is_oob());
/// });
/// # let _ = builder;
/// ```
#[derive(Clone)]
pub struct Delivery {
    body: Body,
    seq: Option<u64>,
    oob: bool,
    /// The receiver's stream epoch (see [`Progress`]).
    epoch: u32,
    /// The requester's id and the room it reserved for the reply, when the message is a
    /// request (behind a pointer: a delivery stays small).
    request: Option<Arc<ReplyRoom>>,
}

/// Who sent a delivered message, where its bytes lie and the node's send handle.
#[derive(Clone)]
enum Body {
    /// A message with bytes of its own: its sender (filled in as it is delivered, when the
    /// IO thread left it out), and the receiving node's send handle (set as it is handed
    /// over).
    Own {
        from: Option<SharedStr>,
        payload: Bytes,
        node: Option<NodeRef>,
    },
    /// A message of a run: its origin names the sender, carries the handle and holds the
    /// run's bytes, where the payload lies at `payload`.
    InRun {
        origin: Arc<Origin>,
        payload: Range<usize>,
    },
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("from", &self.from())
            .field("len", &self.payload().len())
            .field("seq", &self.seq)
            .field("oob", &self.oob)
            .field("epoch", &self.epoch)
            .field("request", &self.request)
            .finish()
    }
}

impl Delivery {
    /// A delivery (used by the transport; public for tests and benches of handlers).
    pub fn new(from: SharedStr, payload: Bytes, seq: Option<u64>, oob: bool) -> Delivery {
        Delivery::own(Some(from), payload, seq, oob)
    }
    fn own(from: Option<SharedStr>, payload: Bytes, seq: Option<u64>, oob: bool) -> Delivery {
        Delivery {
            body: Body::Own {
                from,
                payload,
                node: None,
            },
            seq,
            oob,
            epoch: 0,
            request: None,
        }
    }
    /// A regular message whose sender the [`MemberQueue`] fills in when it delivers it.
    pub(crate) fn unnamed(payload: Bytes, seq: Option<u64>) -> Delivery {
        Delivery::own(None, payload, seq, false)
    }
    /// A regular message of a run, from `origin` (which names its sender, gives it the
    /// node's send handle and holds the run's bytes, where its payload lies at `payload`),
    /// of stream epoch `epoch`.
    #[inline]
    pub(crate) fn of_run(
        origin: Arc<Origin>,
        payload: Range<usize>,
        seq: Option<u64>,
        epoch: u32,
    ) -> Delivery {
        Delivery {
            body: Body::InRun { origin, payload },
            seq,
            oob: false,
            epoch,
            request: None,
        }
    }
    /// A regular message of a run delivered with a name and a handle of its own (no
    /// [`Origin`] shared with the rest of its run): `payload`, from `from`, of stream epoch
    /// `epoch`, carrying `node`.
    #[inline]
    pub(crate) fn lone(
        from: &SharedStr,
        payload: Bytes,
        seq: Option<u64>,
        epoch: u32,
        node: Option<&NodeRef>,
    ) -> Delivery {
        Delivery {
            body: Body::Own {
                from: Some(from.clone()),
                payload,
                node: node.cloned(),
            },
            seq,
            oob: false,
            epoch,
            request: None,
        }
    }
    /// Tags the delivery with the receiver's stream epoch.
    pub(crate) fn in_epoch(mut self, epoch: u32) -> Delivery {
        self.epoch = epoch;
        self
    }
    pub(crate) fn epoch(&self) -> u32 {
        self.epoch
    }
    pub(crate) fn is_named(&self) -> bool {
        match &self.body {
            Body::Own { from, .. } => from.is_some(),
            Body::InRun { .. } => true,
        }
    }
    /// Marks the delivery a request: the requester's id and its reply's room (when there
    /// is one).
    pub(crate) fn with_request(mut self, request: Option<Arc<ReplyRoom>>) -> Delivery {
        self.request = request;
        self
    }
    /// Window bytes the message took (what the sender's permit held; see
    /// [`crate::flow::frame_cost`]): its payload and the overhead, and for a request its
    /// header and the room it reserved for the reply.
    pub(crate) fn cost(&self) -> u64 {
        match &self.request {
            None => crate::flow::cost(self.payload().len()),
            Some(room) => {
                crate::flow::cost(self.payload().len() + crate::wire::REQUEST_HEADER_BYTES)
                    + room.bytes()
            }
        }
    }
    /// Gives the delivery the receiving node's send handle, as it is handed to the
    /// application: from now on a request dropped without a reply tells its requester.
    // Inlined, the rest out of line: once per message on a pool thread, where a call that
    // moved the whole delivery in and out cost about 30 instructions a message.
    #[inline]
    pub(crate) fn with_node(mut self, node: Option<&NodeRef>) -> Delivery {
        // A message of a run: its origin carries the handle (and it is no request).
        if let Body::Own { .. } = self.body {
            self.attach_node(node);
        }
        self
    }
    /// [`with_node`](Delivery::with_node) for a delivery that is not part of a run.
    fn attach_node(&mut self, node: Option<&NodeRef>) {
        let Body::Own {
            from, node: held, ..
        } = &mut self.body
        else {
            return;
        };
        *held = node.cloned();
        if let (Some(node), Some(from), Some(room)) = (node, from.as_ref(), self.request.as_mut()) {
            // Not cloned yet (it is being handed over): the room is this delivery's alone.
            if let Some(room) = Arc::get_mut(room) {
                room.arm(node.clone(), from.clone());
            }
        }
    }
    /// Refuses the request this message is, if it is one: this node has no handler (the
    /// requester is told when the delivery goes, unless a reply came meanwhile).
    pub(crate) fn refuse_no_handler(&self) {
        if let Some(room) = &self.request {
            room.refuse_no_handler();
        }
    }
    /// Names the sender of a message the IO thread left unnamed (a message of a run is
    /// named by its origin).
    pub(crate) fn name_as(&mut self, sender: &SharedStr) {
        if let Body::Own { from, .. } = &mut self.body {
            *from = Some(sender.clone());
        }
    }
    /// The sending member's name.
    #[inline]
    pub fn from(&self) -> &str {
        match &self.body {
            Body::Own { from, .. } => from.as_deref().unwrap_or(""),
            Body::InRun { origin, .. } => &origin.from,
        }
    }
    /// The message bytes, where the delivery holds them.
    // Inlined into the application's crate (as `from`): a handler reads it per message, and
    // with its two cases it is no longer small enough to be inlined there unasked.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        match &self.body {
            Body::Own { payload, .. } => payload,
            Body::InRun { origin, payload } => &origin.frames[payload.clone()],
        }
    }
    /// The message bytes as a [`Bytes`] of their own, to keep or send on: shares the
    /// delivery's buffer (a reference count, no copy).
    ///
    /// ```
    /// let forward = cohort::Node::builder("relay").on_message(|d| {
    ///     if let Some(node) = d.sender() {
    ///         // Sent on without a copy of the bytes.
    ///         let _ = node.try_send("archive", d.payload_bytes());
    ///     }
    /// });
    /// # let _ = forward;
    /// ```
    pub fn payload_bytes(&self) -> Bytes {
        match &self.body {
            Body::Own { payload, .. } => payload.clone(),
            Body::InRun { origin, payload } => origin.frames.slice(payload.clone()),
        }
    }
    /// Takes the message bytes (sharing the delivery's buffer, no copy).
    pub fn into_payload(self) -> Bytes {
        match self.body {
            Body::Own { payload, .. } => payload,
            Body::InRun { origin, payload } => origin.frames.slice(payload),
        }
    }
    /// Takes the sender's name and the message bytes.
    pub fn into_parts(self) -> (String, Bytes) {
        (self.from().to_owned(), self.into_payload())
    }
    /// Whether the message is a request (sent with [`Sender::request`](crate::Sender::request) or
    /// [`Sender::send_request`](crate::Sender::send_request)), which the requester waits to have answered with
    /// [`reply`](Delivery::reply).
    pub fn is_request(&self) -> bool {
        self.request.is_some()
    }
    /// The most bytes a [`reply`](Delivery::reply) to this request may carry: the room its
    /// requester reserved for the reply ([`Builder::max_reply`](crate::Builder::max_reply)
    /// on the requesting node). `None` for a message that is not a request.
    ///
    /// ```
    /// let server = cohort::Node::builder("server").on_message(|d| {
    ///     if let Some(room) = d.reply_room() {
    ///         let mut answer = vec![0u8; 100_000];
    ///         // Send what fits, rather than have the reply refused.
    ///         answer.truncate(room);
    ///         let _ = d.reply(answer);
    ///     }
    /// });
    /// # let _ = server;
    /// ```
    pub fn reply_room(&self) -> Option<usize> {
        self.request
            .as_ref()
            .map(|room| usize::try_from(room.bytes()).unwrap_or(usize::MAX))
    }
    /// The request's reply room, if the message is a request (`Delivery::reply`, in
    /// `node`, takes it).
    pub(crate) fn room(&self) -> Option<&ReplyRoom> {
        self.request.as_deref()
    }
    /// The receiving node's send handle, once the delivery is handed over.
    pub(crate) fn node(&self) -> Option<&dyn NodeHandle> {
        match &self.body {
            Body::Own { node, .. } => node.as_deref(),
            Body::InRun { origin, .. } => origin.node.as_deref(),
        }
    }
    /// The sender's sequence number for a reliable message (regular or out-of-band); `None`
    /// for unreliable messages. Numbers strictly increase per sender and incarnation. With a
    /// journal, a message may be delivered again after a crash of the receiver: the
    /// sequence number tells such a redelivery apart (see
    /// [`Builder::journal`](crate::Builder::journal)).
    pub fn seq(&self) -> Option<u64> {
        self.seq
    }
    /// Whether the message was sent out of band (unordered, straight to the pool).
    pub fn is_oob(&self) -> bool {
        self.oob
    }
}

/// Where a deliverer hands messages over: the application's handler, which takes each as a
/// [`Delivery`] of its own ([`Owning`]) or borrows it ([`Lending`]), or an inbox.
pub trait Recipient {
    /// A message that came alone, as its delivery.
    fn take(&mut self, d: Delivery);
    /// A regular message of a run, lent where it lies in the run's bytes, without the
    /// node's send handle: the recipient gives it the one it gives every message (`more`:
    /// further messages of the same run follow in this turn). Only messages of runs come
    /// this way.
    fn lend(&mut self, msg: DeliveryRef<'_>, more: bool);
}

/// Hands messages to `F` as deliveries of their own, each carrying `node`. The messages of
/// one run that one turn hands over share one [`Origin`], made at the first of them: one
/// reference count taken per message (see [`Origin`]).
pub struct Owning<'n, F> {
    node: Option<&'n NodeRef>,
    origin: Option<Arc<Origin>>,
    to: F,
}

impl<'n, F: FnMut(Delivery)> Owning<'n, F> {
    /// Deliveries that carry `node`, handed to `to`.
    pub fn new(node: Option<&'n NodeRef>, to: F) -> Owning<'n, F> {
        Owning {
            node,
            origin: None,
            to,
        }
    }
}

impl<F> fmt::Debug for Owning<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Owning")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl<F: FnMut(Delivery)> Recipient for Owning<'_, F> {
    #[inline]
    fn take(&mut self, d: Delivery) {
        (self.to)(d.with_node(self.node));
    }

    #[inline]
    fn lend(&mut self, msg: DeliveryRef<'_>, more: bool) {
        let Lent::Run {
            from,
            frames,
            home,
            at,
            payload,
            seq,
            epoch,
            ..
        } = msg.lent
        else {
            debug_assert!(false, "only messages of runs are lent");
            return self.take(msg.to_delivery());
        };
        let span = at..at + payload.len();
        let origin = match self.origin.take() {
            Some(origin) if origin.holds(frames) => Some(origin),
            // Made at the first message of a run that has more to come in this turn.
            _ if more => Some(Arc::new(Origin::new(
                from.clone(),
                self.node.cloned(),
                frames.clone(),
                home.cloned(),
            ))),
            _ => None,
        };
        let d = match origin {
            Some(origin) => {
                // Kept for the run's next message; the last one takes it, so the run's
                // bytes go with its deliveries.
                if more {
                    self.origin = Some(Arc::clone(&origin));
                }
                Delivery::of_run(origin, span, seq, epoch)
            }
            None => Delivery::lone(from, frames.slice(span), seq, epoch, self.node),
        };
        (self.to)(d);
    }
}

/// Lends messages to `F`, each carrying `node`: a run's straight out of its bytes, one that
/// came alone from its delivery (which goes once `F` returns).
pub struct Lending<'n, F> {
    node: Option<&'n NodeRef>,
    to: F,
}

impl<'n, F: FnMut(DeliveryRef<'_>)> Lending<'n, F> {
    /// Messages that carry `node`, lent to `to`.
    pub fn new(node: Option<&'n NodeRef>, to: F) -> Lending<'n, F> {
        Lending { node, to }
    }
}

impl<F> fmt::Debug for Lending<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lending").finish_non_exhaustive()
    }
}

impl<F: FnMut(DeliveryRef<'_>)> Recipient for Lending<'_, F> {
    #[inline]
    fn take(&mut self, d: Delivery) {
        (self.to)(DeliveryRef::whole(&d.with_node(self.node)));
    }

    #[inline]
    fn lend(&mut self, msg: DeliveryRef<'_>, _more: bool) {
        (self.to)(msg.carrying(self.node));
    }
}

/// A message lent to the application's handler for the length of one call
/// ([`Builder::on_message_ref`](crate::Builder::on_message_ref)): what a
/// [`Delivery`] says of it, borrowed where the transport holds it. The regular messages one
/// read brought are lent straight out of that read's bytes: handing one over touches no
/// reference count and makes nothing (a message that came alone — a request, an
/// out-of-band message — is lent from its delivery). Keep what outlives the call with
/// [`to_delivery`](DeliveryRef::to_delivery) (or
/// [`payload_bytes`](DeliveryRef::payload_bytes) for the bytes alone), which take the
/// reference counts a `Delivery` holds.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
///
/// let bytes = Arc::new(AtomicU64::new(0));
/// let seen = bytes.clone();
/// let builder = cohort::Node::builder("beta").on_message_ref(move |m| {
///     // Read in place: nothing is copied or counted to hand it over.
///     seen.fetch_add(m.payload().len() as u64, Ordering::Relaxed);
///     if m.is_request() {
///         let _ = m.reply(b"ok".to_vec());
///     }
/// });
/// # let _ = builder;
/// ```
#[derive(Clone, Copy)]
pub struct DeliveryRef<'a> {
    lent: Lent<'a>,
}

/// Where a lent message lives.
#[derive(Clone, Copy)]
enum Lent<'a> {
    /// A delivery the deliverer holds whole (a message that came alone: out of band, a
    /// request, one the IO thread could not take as part of a run).
    Whole(&'a Delivery),
    /// A regular message of a run: its payload lies in the run's bytes.
    Run {
        from: &'a SharedStr,
        node: Option<&'a NodeRef>,
        /// The run's bytes, from which [`DeliveryRef::payload_bytes`] slices the payload
        /// (which starts `at` bytes in).
        frames: &'a Bytes,
        /// Where the run's read buffer goes when its last view goes.
        home: Option<&'a Arc<ReadBuffers>>,
        at: usize,
        payload: &'a [u8],
        seq: Option<u64>,
        epoch: u32,
    },
}

impl<'a> DeliveryRef<'a> {
    /// Lends `d` whole.
    pub(crate) fn whole(d: &'a Delivery) -> DeliveryRef<'a> {
        DeliveryRef {
            lent: Lent::Whole(d),
        }
    }

    /// Lends a regular message of a run: the bytes `payload` of `frames` (whose read
    /// buffer goes back to `home`), reliable with sequence number `seq` or not, of stream
    /// epoch `epoch`, from `from`; without the node's send handle until
    /// [`carrying`](DeliveryRef::carrying) gives it one.
    #[inline]
    pub(crate) fn of_run(
        from: &'a SharedStr,
        frames: &'a Bytes,
        home: Option<&'a Arc<ReadBuffers>>,
        payload: Range<usize>,
        seq: Option<u64>,
        epoch: u32,
    ) -> DeliveryRef<'a> {
        DeliveryRef {
            lent: Lent::Run {
                from,
                node: None,
                frames,
                home,
                at: payload.start,
                payload: &frames[payload],
                seq,
                epoch,
            },
        }
    }

    /// The message of a run, carrying `node`, the receiving node's send handle (a message
    /// lent whole carries its delivery's).
    #[inline]
    pub(crate) fn carrying(mut self, node: Option<&'a NodeRef>) -> DeliveryRef<'a> {
        if let Lent::Run { node: n, .. } = &mut self.lent {
            *n = node;
        }
        self
    }

    /// The sending member's name.
    pub fn from(&self) -> &'a str {
        match self.lent {
            Lent::Whole(d) => d.from(),
            Lent::Run { from, .. } => from,
        }
    }

    /// The message bytes, where the transport holds them.
    pub fn payload(&self) -> &'a [u8] {
        match self.lent {
            Lent::Whole(d) => d.payload(),
            Lent::Run { payload, .. } => payload,
        }
    }

    /// The message bytes as a [`Bytes`] of their own, to keep after the call: shares the
    /// transport's buffer (a reference count, no copy).
    pub fn payload_bytes(&self) -> Bytes {
        match self.lent {
            Lent::Whole(d) => d.payload_bytes(),
            Lent::Run {
                frames,
                at,
                payload,
                ..
            } => frames.slice(at..at + payload.len()),
        }
    }

    /// The sender's sequence number for a reliable message; `None` for an unreliable one
    /// (see [`Delivery::seq`]).
    pub fn seq(&self) -> Option<u64> {
        match self.lent {
            Lent::Whole(d) => d.seq(),
            Lent::Run { seq, .. } => seq,
        }
    }

    /// Whether the message was sent out of band (unordered, straight to the pool).
    pub fn is_oob(&self) -> bool {
        match self.lent {
            Lent::Whole(d) => d.is_oob(),
            Lent::Run { .. } => false,
        }
    }

    /// Whether the message is a request, to answer with [`reply`](DeliveryRef::reply)
    /// (see [`Delivery::is_request`]).
    pub fn is_request(&self) -> bool {
        self.as_whole().is_some_and(Delivery::is_request)
    }

    /// The most bytes a reply to this request may carry; `None` for a message that is
    /// not a request (see [`Delivery::reply_room`]).
    pub fn reply_room(&self) -> Option<usize> {
        self.as_whole().and_then(Delivery::reply_room)
    }

    /// The message as a [`Delivery`] of its own, to keep after the call (to answer a
    /// request later, say): takes the reference counts a delivery holds, copies no
    /// payload. A request kept so is answered, or told unanswered, as the last clone of
    /// its `Delivery` decides (see [`Delivery::reply`]).
    pub fn to_delivery(&self) -> Delivery {
        match self.lent {
            Lent::Whole(d) => d.clone(),
            Lent::Run {
                from,
                node,
                frames,
                at,
                payload,
                seq,
                epoch,
                ..
            } => Delivery::lone(from, frames.slice(at..at + payload.len()), seq, epoch, node),
        }
    }

    /// The delivery lent whole, if it is one.
    pub(crate) fn as_whole(&self) -> Option<&'a Delivery> {
        match self.lent {
            Lent::Whole(d) => Some(d),
            Lent::Run { .. } => None,
        }
    }

    /// The receiving node's send handle.
    pub(crate) fn node(&self) -> Option<&'a dyn NodeHandle> {
        match self.lent {
            Lent::Whole(d) => d.node(),
            Lent::Run { node, .. } => node.map(|n| &**n),
        }
    }
}

impl fmt::Debug for DeliveryRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeliveryRef")
            .field("from", &self.from())
            .field("len", &self.payload().len())
            .field("seq", &self.seq())
            .field("oob", &self.is_oob())
            .field("request", &self.is_request())
            .finish()
    }
}
