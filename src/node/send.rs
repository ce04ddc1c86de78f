//! The send side: [`Sender`] (every send variant, a peer named on each call), [`PeerSender`]
//! (the same variants bound to one peer) and [`SendOptions`]. The variants are written once,
//! in [`Route`], and their public methods once, in `send_variants!`: `Sender`, `PeerSender`
//! and `Node` each say where a message goes (`route`) and get the methods from the macro,
//! whose rustdoc is `Sender`'s.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{Error, ReplyFailure, SendError, TrySendError};
use crate::flow::{cost, AcquireError, Permit};
use crate::net::{IoShared, PeerMap};
use crate::peer::{Failure, Found, Owed, Slot};
use crate::peer::{Outgoing, PeerShared, PeerState, Return, FRAMED_MAX_PAYLOAD, FRAMED_RUN_BYTES};
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{Arc, SharedStr};
use crate::wire;

/// The send variants, written once for the three handles that have them ([`Sender`],
/// [`PeerSender`], [`Node`]): each is a method that takes the handle's [`Route`]
/// (`self.route(to)`, with `to` the peer's name where the handle names one on each call)
/// and calls the like-named method there. The caller gives each variant's rustdoc, or
/// `see Sender` for "See [`Sender::…`]" on all of them.
macro_rules! send_variants {
    (@one ($($to:ident)?) [$(#[$doc:meta])*] send) => {
        $(#[$doc])*
        pub fn send(&self, $($to: &str,)? payload: impl Into<Bytes>) -> Result<(), SendError<Bytes>> {
            self.route($($to)?).send(payload.into())
        }
    };
    (@one ($($to:ident)?) [$(#[$doc:meta])*] send_slice) => {
        $(#[$doc])*
        pub fn send_slice(&self, $($to: &str,)? payload: &[u8]) -> Result<(), Error> {
            self.route($($to)?).send_slice(payload)
        }
    };
    (@one ($($to:ident)?) [$(#[$doc:meta])*] try_send) => {
        $(#[$doc])*
        pub fn try_send(&self, $($to: &str,)? payload: impl Into<Bytes>) -> Result<(), TrySendError<Bytes>> {
            self.route($($to)?).try_send(payload.into())
        }
    };
    (@one ($($to:ident)?) [$(#[$doc:meta])*] send_timeout) => {
        $(#[$doc])*
        pub fn send_timeout(
            &self,
            $($to: &str,)?
            payload: impl Into<Bytes>,
            timeout: Duration,
        ) -> Result<(), SendError<Bytes>> {
            self.route($($to)?).send_timeout(payload.into(), timeout)
        }
    };
    (@one ($($to:ident)?) [$(#[$doc:meta])*] send_oob) => {
        $(#[$doc])*
        pub fn send_oob(&self, $($to: &str,)? payload: impl Into<Bytes>) -> Result<(), SendError<Bytes>> {
            self.route($($to)?).send_oob(payload.into())
        }
    };
    (@one ($($to:ident)?) [$(#[$doc:meta])*] send_with) => {
        $(#[$doc])*
        pub fn send_with(
            &self,
            $($to: &str,)?
            payload: impl Into<Bytes>,
            opts: SendOptions,
        ) -> Result<(), SendError<Bytes>> {
            self.route($($to)?).send_with(payload.into(), opts)
        }
    };
    (@one ($($to:ident)?) [$(#[$doc:meta])*] request) => {
        $(#[$doc])*
        pub fn request(
            &self,
            $($to: &str,)?
            payload: impl Into<Bytes>,
            timeout: Duration,
        ) -> Result<Bytes, SendError<Option<Bytes>>> {
            self.route($($to)?).request(payload.into(), timeout, RequestOptions::new())
        }
    };
    (@one ($($to:ident)?) [$(#[$doc:meta])*] send_request) => {
        $(#[$doc])*
        #[must_use = "the reply is only seen through the PendingReply; dropping it gives the request up"]
        pub fn send_request(
            &self,
            $($to: &str,)?
            payload: impl Into<Bytes>,
        ) -> Result<PendingReply, SendError<Bytes>> {
            self.route($($to)?).send_request(payload.into(), RequestOptions::new())
        }
    };
    (@one ($($to:ident)?) [$(#[$doc:meta])*] request_with) => {
        $(#[$doc])*
        pub fn request_with(
            &self,
            $($to: &str,)?
            payload: impl Into<Bytes>,
            timeout: Duration,
            opts: RequestOptions,
        ) -> Result<Bytes, SendError<Option<Bytes>>> {
            self.route($($to)?).request(payload.into(), timeout, opts)
        }
    };
    (@one ($($to:ident)?) [$(#[$doc:meta])*] send_request_with) => {
        $(#[$doc])*
        #[must_use = "the reply is only seen through the PendingReply; dropping it gives the request up"]
        pub fn send_request_with(
            &self,
            $($to: &str,)?
            payload: impl Into<Bytes>,
            opts: RequestOptions,
        ) -> Result<PendingReply, SendError<Bytes>> {
            self.route($($to)?).send_request(payload.into(), opts)
        }
    };
    (@one ($($to:ident)?) [$(#[$doc:meta])*] send_batch) => {
        $(#[$doc])*
        pub fn send_batch<B: Into<Bytes>>(
            &self,
            $($to: &str,)?
            payloads: impl IntoIterator<Item = B>,
        ) -> Result<(), SendError<Vec<Bytes>>> {
            self.route($($to)?)
                .send_batch(payloads.into_iter().map(Into::into).collect())
        }
    };
    (see Sender ($($to:ident)?)) => {
        send_variants! { ($($to)?)
            #[doc = "See [`Sender::send`]."] send;
            #[doc = "See [`Sender::send_slice`]."] send_slice;
            #[doc = "See [`Sender::try_send`]."] try_send;
            #[doc = "See [`Sender::send_timeout`]."] send_timeout;
            #[doc = "See [`Sender::send_oob`]."] send_oob;
            #[doc = "See [`Sender::send_with`]."] send_with;
            #[doc = "See [`Sender::send_batch`]."] send_batch;
            #[doc = "See [`Sender::request`]."] request;
            #[doc = "See [`Sender::send_request`]."] send_request;
            #[doc = "See [`Sender::request_with`]."] request_with;
            #[doc = "See [`Sender::send_request_with`]."] send_request_with;
        }
    };
    ($to:tt $($(#[$doc:meta])* $name:ident;)*) => {
        $(send_variants!(@one $to [$(#[$doc])*] $name);)*
    };
}
pub(super) use send_variants;

/// Options of [`Sender::send_with`].
///
/// ```
/// use std::time::Duration;
/// let opts = cohort::SendOptions::new().oob().ttl(Duration::from_millis(500));
/// # let _ = opts;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use = "SendOptions do nothing until passed to `send_with`"]
pub struct SendOptions {
    oob: bool,
    unreliable: bool,
    ttl: Option<Duration>,
    connected_only: bool,
}

impl SendOptions {
    /// A regular message with no expiry (what [`Sender::send`] sends).
    pub fn new() -> SendOptions {
        SendOptions::default()
    }

    /// Out of band: straight to a pool thread at the receiver, unordered.
    pub fn oob(mut self) -> SendOptions {
        self.oob = true;
        self
    }

    /// Unreliable: no sequence number, no ack, no resend. Cheaper, and still ordered with the
    /// sender's other regular messages while its connection lives, but **lost if the
    /// connection breaks** with it unread (its window permits then come back at the next
    /// handshake). Never duplicated. `Delivery::seq()` is `None` for it.
    pub fn unreliable(mut self) -> SendOptions {
        self.unreliable = true;
        self
    }

    /// Fail the message if it has not been published within `ttl` — for instance because
    /// the peer is disconnected: it is counted `failed` (and `expired`), its permits come
    /// back, and it is reported to
    /// [`Builder::on_undelivered`](crate::Builder::on_undelivered).
    pub fn ttl(mut self, ttl: Duration) -> SendOptions {
        self.ttl = Some(ttl);
        self
    }

    /// Fail fast instead of queueing when the peer has no established connection: the
    /// send returns [`Error::NotConnected`] at once, with the payload, and nothing is
    /// queued (ZeroMQ's `ZMQ_IMMEDIATE`, Aeron's `NOT_CONNECTED`). Without it a message to
    /// a disconnected peer waits in its queue (within the window) until the peer is back.
    ///
    /// The check is made when the send starts, and again once it has its window if it had
    /// to wait for it. It is a snapshot of what the IO thread knows: a connection can drop
    /// right after it (or be dead without the IO thread knowing yet, until the idle
    /// timeout). Such a message is queued as usual and follows the normal rules: resent
    /// after the reconnect, or reported to
    /// [`Builder::on_undelivered`](crate::Builder::on_undelivered) if it can never be
    /// delivered.
    ///
    /// ```
    /// use std::time::Duration;
    /// use cohort::{Error, SendOptions};
    /// # fn main() -> Result<(), cohort::Error> {
    /// let node = cohort::Node::builder("alpha").peer("beta", "127.0.0.1:9").start()?;
    /// let opts = SendOptions::new().connected_only();
    /// match node.send_with("beta", &b"now or never"[..], opts) {
    ///     Err(e) if matches!(e.error(), Error::NotConnected(_)) => {
    ///         let payload = e.into_inner(); // not queued: route it elsewhere
    ///         assert_eq!(&payload[..], b"now or never");
    ///     }
    ///     other => panic!("beta is not up: {other:?}"),
    /// }
    /// # node.shutdown(Duration::from_secs(1))?;
    /// # Ok(()) }
    /// ```
    pub fn connected_only(mut self) -> SendOptions {
        self.connected_only = true;
        self
    }
}

/// Options of [`Sender::request_with`] and [`Sender::send_request_with`].
///
/// ```
/// let opts = cohort::RequestOptions::new().connected_only();
/// # let _ = opts;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use = "RequestOptions do nothing until passed to `request_with` or `send_request_with`"]
pub struct RequestOptions {
    connected_only: bool,
}

impl RequestOptions {
    /// A request as [`Sender::request`] sends it.
    pub fn new() -> RequestOptions {
        RequestOptions::default()
    }

    /// Fail at once with [`Error::NotConnected`] instead of queueing the request when the
    /// peer has no established connection (rather than wait for it until the timeout). The
    /// same check, and the same race, as [`SendOptions::connected_only`]: a request queued
    /// because the connection dropped right after the check waits for the peer like any
    /// other (and is withdrawn, never sent, if its requester gives it up first).
    pub fn connected_only(mut self) -> RequestOptions {
        self.connected_only = true;
        self
    }

    /// The send options a request travels with.
    fn send_options(self) -> SendOptions {
        SendOptions {
            connected_only: self.connected_only,
            ..SendOptions::new()
        }
    }
}

/// The send half of a node: cheap to clone, usable from any thread, including from inside
/// a message handler (to reply).
///
/// ```
/// use std::time::Duration;
/// # fn main() -> Result<(), cohort::Error> {
/// let beta = cohort::Node::builder("beta")
///     .cluster("docs")
///     .allow_unknown_members(true)
///     .on_message(|d| println!("{} bytes from {}", d.payload().len(), d.from()))
///     .start()?;
/// let alpha = cohort::Node::builder("alpha")
///     .cluster("docs")
///     .peer("beta", beta.local_addr())
///     .start()?;
/// // One Sender, cloned into every thread that sends.
/// let tx = alpha.sender();
/// let workers: Vec<_> = (0..4)
///     .map(|w| {
///         let tx = tx.clone();
///         std::thread::spawn(move || tx.send("beta", format!("from worker {w}").into_bytes()))
///     })
///     .collect();
/// for w in workers {
///     w.join().expect("a worker panicked")?;
/// }
/// alpha.shutdown(Duration::from_secs(5))?; // flushes what is queued first
/// beta.shutdown(Duration::from_secs(5))?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Sender {
    core: Arc<SendCore>,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("node", &self.core.name)
            .finish()
    }
}

impl Sender {
    /// The send half of node `name`, whose peers are `peers`. Sends fail with
    /// [`Error::Closed`] once `stopped` is set; a message longer than `max_message` fails
    /// with [`Error::TooLarge`]. With `frame`, plain messages are encoded by the sending
    /// thread ([`Outbox::admit_framed`](crate::peer::Outbox::admit_framed)).
    pub(super) fn new(
        name: SharedStr,
        peers: PeerMap,
        io: Arc<IoShared>,
        max_message: usize,
        max_reply: u32,
        stopped: Arc<AtomicBool>,
        frame: bool,
    ) -> Sender {
        Sender {
            core: Arc::new(SendCore {
                name,
                peers,
                io,
                max_message,
                max_reply,
                stopped,
                frame,
                warned_blocking: Arc::new(AtomicBool::new(false)),
                warned_reply: Arc::new(AtomicBool::new(false)),
            }),
        }
    }

    /// The same node's handle under a reference count of its own: a pool worker's clones
    /// of it (one per delivery) then never touch a count another thread touches.
    pub(crate) fn fork(&self) -> Sender {
        let c = &self.core;
        Sender {
            core: Arc::new(SendCore {
                name: c.name.clone(),
                peers: c.peers.clone(),
                io: c.io.clone(),
                max_message: c.max_message,
                max_reply: c.max_reply,
                stopped: c.stopped.clone(),
                frame: c.frame,
                warned_blocking: c.warned_blocking.clone(),
                warned_reply: c.warned_reply.clone(),
            }),
        }
    }

    pub(super) fn route<'a>(&'a self, to: &'a str) -> Route<'a> {
        Route {
            core: &self.core,
            to: To::Name(to),
        }
    }

    send_variants! { (to)
        /// Sends a regular message: delivered to `to`'s handler in this sender's order, exactly
        /// once while both processes live. Blocks (parks) while `to`'s send window is full.
        ///
        /// Fails, handing the payload back in the [`SendError`], when `to` is not a peer
        /// ([`Error::UnknownPeer`]), the payload is larger than this node sends or than `to`
        /// accepts, once its handshake said so ([`Error::TooLarge`]), or the node is shut down
        /// or `to` removed, also while the send waits ([`Error::Closed`]).
        ///
        /// Once accepted, a message that can never be delivered is reported to
        /// [`Builder::on_undelivered`](crate::Builder::on_undelivered): for instance one queued
        /// before `to`'s limit was known and larger than it.
        send;

        /// Sends a regular message copied from `payload`, as [`send`](Sender::send) does,
        /// for a caller that builds its messages in a buffer of its own and reuses it: a
        /// message of up to 4 KiB, on a node with no outbound filter and no journal, goes
        /// straight into the frame the node writes whenever the window has room (no
        /// allocation, no reference count); any other is first copied into a buffer of its
        /// own. Blocks and fails like `send` (the payload stays the caller's either way).
        ///
        /// ```
        /// use std::time::Duration;
        /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
        /// let (beta, inbox) = cohort::Node::builder("beta").start_with_inbox()?;
        /// let alpha = cohort::Node::builder("alpha").peer("beta", beta.local_addr()).start()?;
        /// beta.add_peer("alpha", alpha.local_addr())?;
        /// let mut buf = Vec::with_capacity(64);
        /// for i in 0..3u32 {
        ///     buf.clear();
        ///     buf.extend_from_slice(b"tick ");
        ///     buf.extend_from_slice(&i.to_le_bytes());
        ///     alpha.send_slice("beta", &buf)?;
        /// }
        /// for i in 0..3u32 {
        ///     let d = inbox.recv_timeout(Duration::from_secs(10))?;
        ///     assert_eq!(&d.payload()[5..], &i.to_le_bytes());
        /// }
        /// # alpha.shutdown(Duration::from_secs(5))?;
        /// # beta.shutdown(Duration::from_secs(5))?;
        /// # Ok(()) }
        /// ```
        send_slice;

        /// Like [`send`](Sender::send) but never waits for the window: a full window hands the
        /// payload back in [`TrySendError::Full`]. (On a journalling node whose IO thread is
        /// idle, the send may append its record to the journal itself: one small write into
        /// the page cache, which the kernel can delay as it can any file write.)
        try_send;

        /// Like [`send`](Sender::send) but waits at most `timeout` for room in the window, then
        /// fails with [`Error::TimedOut`], handing the payload back
        /// ([`SendError::into_inner`]) to retry later or send elsewhere.
        send_timeout;

        /// Sends out of band: handed straight to a pool thread at the receiver, not ordered
        /// with the sender's other messages (still exactly once, still flow-controlled). Fails
        /// like [`send`](Sender::send).
        send_oob;

        /// Sends with [`SendOptions`] (out of band, expiry, unreliable, connected only);
        /// blocks and fails like [`send`](Sender::send), and with [`Error::NotConnected`] for
        /// [`connected_only`](SendOptions::connected_only) when `to` has no established
        /// connection.
        send_with;

        /// Sends every payload of `payloads` to `to` as regular messages, in order: what
        /// [`send`](Sender::send) on each would do, but with one look-up of `to`, and one
        /// take from its window and one lock of its queue per chunk of messages (up to 64,
        /// and at most a quarter of the window) instead of per message: the cheaper way to
        /// send many messages at once. Blocks (parks) while `to`'s window has no room for the
        /// next chunk.
        ///
        /// Fails as `send` does. If a payload is larger than this node sends or than `to`
        /// accepts ([`Error::TooLarge`]), or `to` is not a peer ([`Error::UnknownPeer`]),
        /// nothing is queued. Otherwise the [`SendError`] hands back the payloads not queued,
        /// in order (for [`Error::Closed`]: the node shut down or `to` was removed while the
        /// batch went out); the ones before them were queued, and are delivered as `send`'s
        /// would be.
        ///
        /// ```
        /// use std::time::Duration;
        /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
        /// let (beta, inbox) = cohort::Node::builder("beta").start_with_inbox()?;
        /// let alpha = cohort::Node::builder("alpha").peer("beta", beta.local_addr()).start()?;
        /// beta.add_peer("alpha", alpha.local_addr())?;
        /// let ticks: Vec<Vec<u8>> = (0..100u32).map(|i| i.to_le_bytes().to_vec()).collect();
        /// alpha.sender().send_batch("beta", ticks)?;
        /// for i in 0..100u32 {
        ///     let d = inbox.recv_timeout(Duration::from_secs(10))?;
        ///     assert_eq!(d.payload(), &i.to_le_bytes()); // in order
        /// }
        /// # alpha.shutdown(Duration::from_secs(5))?;
        /// # beta.shutdown(Duration::from_secs(5))?;
        /// # Ok(()) }
        /// ```
        send_batch;
    }

    /// Sends `payload` to every peer without blocking: one result per peer, sorted by
    /// peer name. A peer whose window is full gets [`Error::Full`] and stalls only itself;
    /// the others receive the message.
    ///
    /// Each peer that did not take the message hands the payload back in its own
    /// [`SendError`] (the same [`Bytes`], shared, not copied), so a caller can retry just
    /// those peers with [`send`](Sender::send) or [`to`](Sender::to):
    ///
    /// ```
    /// # fn main() -> Result<(), cohort::Error> {
    /// let node = cohort::Node::builder("alpha").peer("beta", "127.0.0.1:9").start()?;
    /// for (peer, result) in node.broadcast(&b"hello"[..]) {
    ///     if let Err(e) = result {
    ///         let (payload, error) = e.into_parts();
    ///         eprintln!("not queued for {peer}: {error}; {} bytes back", payload.len());
    ///     }
    /// }
    /// # node.shutdown(std::time::Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    #[must_use = "each peer's result says whether it was queued"]
    pub fn broadcast(
        &self,
        payload: impl Into<Bytes>,
    ) -> Vec<(String, Result<(), SendError<Bytes>>)> {
        let payload = payload.into();
        let peers: Vec<Arc<PeerShared>> = self.core.peers.read().values().cloned().collect();
        let mut out: Vec<(String, Result<(), SendError<Bytes>>)> = peers
            .iter()
            .map(|p| {
                let route = Route {
                    core: &self.core,
                    to: To::Peer(p),
                };
                (
                    p.name.to_string(),
                    route.try_send(payload.clone()).map_err(SendError::from_try),
                )
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    send_variants! { (to)
        /// Sends `payload` to `to` as a request and waits at most `timeout` (for room in the
        /// window, under the cap of requests in flight, and for the reply) for `to`'s handler
        /// to answer it with [`Delivery::reply`](crate::Delivery::reply). Returns the reply.
        ///
        /// Fails with [`Error::NoReply`] when the time is up (a reply that comes later is
        /// dropped and counted in [`PeerStats::late_replies`](crate::PeerStats::late_replies)),
        /// and fails fast, not at the timeout, when the peer can no longer answer:
        /// [`Error::Closed`] once it is removed or this node shuts down,
        /// [`Error::PeerRestarted`] when it comes back as a new incarnation,
        /// [`Error::TooLarge`] when the peer's handshake says it accepts less, and
        /// [`Error::ReplyFailed`] as soon as the peer says it cannot answer (its reply was
        /// larger than the room this request reserved, its application dropped the request
        /// unanswered, its handler panicked, or it has none). A request is delivered exactly
        /// once like any regular message, in order with the sender's others.
        ///
        /// A request given up before it left (its time ran out while it waited in the queue,
        /// say for a peer that is down) is withdrawn: never sent, so never run by the peer
        /// (counted in [`PeerStats::withdrawn`](crate::PeerStats::withdrawn)). One that had
        /// left may still be run there; its reply is then dropped as late.
        ///
        /// The error is a [`SendError`] whose payload is `Some(payload)` when the request was
        /// never queued (unknown peer, too large, not connected with `connected_only`, no room
        /// in the window or under the cap within `timeout`, closed): nothing was sent, and it
        /// can go elsewhere. It is `None` once the request was queued: the peer may have it.
        /// `?` turns it into an [`Error`].
        ///
        /// Do not wait for a reply inside a message handler: it holds the pool thread that
        /// delivers that sender's messages. Use [`send_request`](Sender::send_request) there,
        /// and take the reply elsewhere.
        ///
        /// ```
        /// use std::time::Duration;
        /// # fn main() -> Result<(), cohort::Error> {
        /// let server = cohort::Node::builder("server")
        ///     .on_message(|d| {
        ///         let n = u32::from_le_bytes(d.payload()[..4].try_into().unwrap_or([0; 4]));
        ///         let _ = d.reply((n * 2).to_le_bytes().to_vec());
        ///     })
        ///     .start()?;
        /// let client = cohort::Node::builder("client").peer("server", server.local_addr()).start()?;
        /// server.add_peer("client", client.local_addr())?;
        /// let reply = client.sender().request("server", 21u32.to_le_bytes().to_vec(), Duration::from_secs(10))?;
        /// assert_eq!(&reply[..], &42u32.to_le_bytes());
        /// # client.shutdown(Duration::from_secs(5))?;
        /// # server.shutdown(Duration::from_secs(5))?;
        /// # Ok(()) }
        /// ```
        request;

        /// Sends `payload` to `to` as a request and returns at once with a handle to wait on,
        /// so that one thread can have many requests in flight. Waits, like
        /// [`send`](Sender::send), only for room in the window and under the cap of requests in
        /// flight ([`Builder::max_requests`](crate::Builder::max_requests)). It fails only
        /// before the request is queued, so its [`SendError`] always hands the payload back.
        ///
        /// ```no_run
        /// use std::time::Duration;
        /// # fn main() -> Result<(), cohort::Error> {
        /// # let node = cohort::Node::builder("client").peer("server", "127.0.0.1:7001").start()?;
        /// let sender = node.sender();
        /// let pending: Vec<_> = (0..100u32)
        ///     .map(|i| sender.send_request("server", i.to_le_bytes().to_vec()))
        ///     .collect::<Result<_, _>>()?;
        /// for p in pending {
        ///     let reply = p.wait(Duration::from_secs(5))?;
        ///     println!("{} bytes back", reply.len());
        /// }
        /// # Ok(()) }
        /// ```
        send_request;

        /// [`request`](Sender::request) with [`RequestOptions`]: with
        /// [`connected_only`](RequestOptions::connected_only), fails at once with
        /// [`Error::NotConnected`] when `to` has no established connection.
        ///
        /// ```
        /// use std::time::Duration;
        /// use cohort::{Error, RequestOptions};
        /// # fn main() -> Result<(), cohort::Error> {
        /// let node = cohort::Node::builder("alpha").peer("beta", "127.0.0.1:9").start()?;
        /// let opts = RequestOptions::new().connected_only();
        /// let r = node.sender().request_with("beta", &b"ping"[..], Duration::from_secs(2), opts);
        /// let e = r.unwrap_err(); // at once, not after 2 s
        /// assert!(matches!(e.error(), Error::NotConnected(_)));
        /// assert_eq!(e.into_inner().as_deref(), Some(&b"ping"[..])); // never queued
        /// # node.shutdown(Duration::from_secs(1))?;
        /// # Ok(()) }
        /// ```
        request_with;

        /// [`send_request`](Sender::send_request) with [`RequestOptions`] (see
        /// [`request_with`](Sender::request_with)).
        send_request_with;
    }

    /// Queues the reply to request `id` from `to` (see `Delivery::reply`, which checked it
    /// against the request's room): no window to wait for, its request's room paid for it.
    /// Not bounded by this node's own `max_message`: the room is what the requester
    /// reserved and takes in, whatever this node's limits for its own messages.
    pub(crate) fn reply(&self, to: &str, id: u64, payload: Bytes) -> Result<(), Error> {
        let peer = self.core.peer_named(to)?;
        self.core.queue_reply(&peer, payload.len(), |owed| {
            Outgoing::reply(id, &payload, owed)
        })
    }

    /// Queues the word to request `id` from `to` that it cannot be answered, and why: a
    /// reply carrying `status` instead of a payload, which fails the request at once.
    pub(crate) fn reply_status(
        &self,
        to: &str,
        id: u64,
        status: wire::ReplyStatus,
    ) -> Result<(), Error> {
        let peer = self.core.peer_named(to)?;
        let len = wire::encode_reply_status(status).len();
        self.core
            .queue_reply(&peer, len, |owed| Outgoing::reply_status(id, status, owed))
    }

    /// A reply of `len` bytes was refused as larger than its request's `room`: warned once
    /// per node (the requester is told with the request's failure).
    pub(crate) fn warn_reply_refused(&self, to: &str, len: usize, room: u64) {
        // Relaxed: a once-only flag for a log line.
        if !self.core.warned_reply.swap(true, Ordering::Relaxed) {
            log::warn!(
                "{}: a reply of {len} bytes to '{to}' was refused: its request reserved {room} \
                 bytes for it (the requester's Builder::max_reply; Delivery::reply_room tells \
                 a handler). Unless a smaller reply follows, the requester fails with the \
                 reason; further refusals are logged at debug level",
                self.core.name
            );
        } else {
            log::debug!(
                "{}: a reply of {len} bytes to '{to}' was refused: its request reserved {room} \
                 bytes for it",
                self.core.name
            );
        }
    }

    /// This node's member name (as [`Node::name`](crate::Node::name)).
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// Whether `peer` has an established connection now (its handshake completed), as the
    /// IO thread last said: a snapshot, which a connection that drops right after makes
    /// stale. `false` for a member that is not configured, and once the node is shut down.
    ///
    /// ```
    /// # fn main() -> Result<(), cohort::Error> {
    /// let node = cohort::Node::builder("alpha").peer("beta", "127.0.0.1:9").start()?;
    /// assert!(!node.sender().is_connected("beta")); // nothing listens there
    /// assert!(!node.sender().is_connected("nobody"));
    /// # node.shutdown(std::time::Duration::from_secs(1))?;
    /// # Ok(()) }
    /// ```
    pub fn is_connected(&self, peer: &str) -> bool {
        let p = self.core.peers.read().get(peer).cloned();
        p.is_some_and(|p| self.core.connected(&p))
    }

    /// Waits at most `timeout` for `peer` to have an established connection (its
    /// handshake completed): returns at once if it has one. The thread parks until the IO
    /// thread says the peer connected (no polling), so this is the way to start sending
    /// only once a member is up, rather than queueing for it (a send to a peer that is not
    /// connected waits in its queue, within the window) or polling
    /// [`is_connected`](Sender::is_connected).
    ///
    /// Fails with [`Error::ConnectTimedOut`] if the peer did not connect in time (it stays
    /// configured and dialled), [`Error::UnknownPeer`] for a member that is not configured,
    /// and [`Error::Closed`] once the node is shut down or the peer removed, also while
    /// waiting. Like [`is_connected`](Sender::is_connected), success is a snapshot: the
    /// connection may drop right after.
    ///
    /// ```
    /// use std::time::Duration;
    /// # fn main() -> Result<(), cohort::Error> {
    /// let beta = cohort::Node::builder("beta").cluster("docs").allow_unknown_members(true).start()?;
    /// let alpha = cohort::Node::builder("alpha")
    ///     .cluster("docs")
    ///     .peer("beta", beta.local_addr())
    ///     .start()?;
    /// let tx = alpha.sender();
    /// tx.wait_connected("beta", Duration::from_secs(10))?;
    /// assert!(tx.is_connected("beta"));
    /// tx.send("beta", &b"first message, to a member that is up"[..])?;
    /// # alpha.shutdown(Duration::from_secs(5))?;
    /// # beta.shutdown(Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    pub fn wait_connected(&self, peer: &str, timeout: Duration) -> Result<(), Error> {
        let p = self.core.peer_named(peer)?;
        self.core.wait_connected(&p, timeout)
    }

    /// A send handle bound to one peer: the same send variants without the lookup by name
    /// on every message (the fast path for a hot loop). If the peer is removed the handle's
    /// sends fail with [`Error::Closed`]; a peer added again under the same name needs a new
    /// handle.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), cohort::Error> {
    /// let node = cohort::Node::builder("alpha").peer("beta", "127.0.0.1:7001").start()?;
    /// let to_beta = node.sender().to("beta")?;
    /// for i in 0..1000u32 {
    ///     to_beta.send(i.to_le_bytes().to_vec())?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn to(&self, peer: &str) -> Result<PeerSender, Error> {
        let p = self.core.peers.read().get(peer).cloned();
        match p {
            Some(peer) => Ok(PeerSender {
                core: self.core.clone(),
                peer,
            }),
            None => Err(Error::UnknownPeer(peer.to_owned())),
        }
    }
}

/// A [`Sender`] bound to one peer (see [`Sender::to`]): the peer is looked up once, not
/// on every send, which makes it the fastest way to send many messages to one member.
///
/// ```
/// use std::time::Duration;
/// # fn main() -> Result<(), cohort::Error> {
/// # let beta = cohort::Node::builder("beta").cluster("docs").allow_unknown_members(true).start()?;
/// let alpha = cohort::Node::builder("alpha")
///     .cluster("docs")
///     .peer("beta", beta.local_addr())
///     .start()?;
/// let to_beta = alpha.sender().to("beta")?; // fails with Error::UnknownPeer for a stranger
/// for i in 0..100u32 {
///     to_beta.send(i.to_le_bytes().to_vec())?;
/// }
/// assert_eq!(to_beta.peer(), "beta");
/// alpha.shutdown(Duration::from_secs(5))?;
/// # beta.shutdown(Duration::from_secs(5))?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PeerSender {
    core: Arc<SendCore>,
    peer: Arc<PeerShared>,
}

impl std::fmt::Debug for PeerSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerSender")
            .field("node", &self.core.name)
            .field("peer", &self.peer.name)
            .finish()
    }
}

impl PeerSender {
    /// The peer's name.
    pub fn peer(&self) -> &str {
        &self.peer.name
    }

    /// See [`Sender::is_connected`].
    pub fn is_connected(&self) -> bool {
        self.core.connected(&self.peer)
    }

    /// See [`Sender::wait_connected`]; fails with [`Error::Closed`] (not `UnknownPeer`)
    /// once the peer was removed.
    pub fn wait_connected(&self, timeout: Duration) -> Result<(), Error> {
        self.core.wait_connected(&self.peer, timeout)
    }

    fn route(&self) -> Route<'_> {
        Route {
            core: &self.core,
            to: To::Peer(&self.peer),
        }
    }

    send_variants!(see Sender ());
}

/// Where a message goes: a peer named on each call (looked up in the peer map), or the one
/// a [`PeerSender`] holds.
#[derive(Clone, Copy)]
enum To<'a> {
    Name(&'a str),
    Peer(&'a Arc<PeerShared>),
}

/// A send on its way: the node's sending side and where the message goes. Its methods are
/// the send variants, each the like-named method of [`Sender`] (documented there): which
/// options, how long to wait for the window, what error a caller sees.
pub(super) struct Route<'a> {
    core: &'a SendCore,
    to: To<'a>,
}

impl Route<'_> {
    pub(super) fn send(self, payload: Bytes) -> Result<(), SendError<Bytes>> {
        match self.core.send_plain(self.to, &payload) {
            // Copied into its frame: dropped here, on the sending thread.
            Plain::Sent => Ok(()),
            Plain::Closed => Err(SendError::new(Error::Closed, payload)),
            Plain::Other => self.send_with(payload, SendOptions::new()),
        }
    }

    pub(super) fn send_slice(self, payload: &[u8]) -> Result<(), Error> {
        match self.core.send_plain(self.to, payload) {
            Plain::Sent => Ok(()),
            Plain::Closed => Err(Error::Closed),
            // Any other path keeps the payload until it is published: a copy of its own.
            Plain::Other => self
                .send_with(Bytes::copy_from_slice(payload), SendOptions::new())
                .map_err(|e| e.into_parts().1),
        }
    }

    pub(super) fn try_send(self, payload: Bytes) -> Result<(), TrySendError<Bytes>> {
        match self.core.send_plain(self.to, &payload) {
            Plain::Sent => Ok(()),
            Plain::Closed => Err(TrySendError::Failed(payload, Error::Closed)),
            Plain::Other => self
                .core
                .enqueue(self.to, payload, SendOptions::new(), Wait::No),
        }
    }

    pub(super) fn send_timeout(
        self,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<(), SendError<Bytes>> {
        self.core
            .enqueue(self.to, payload, SendOptions::new(), Wait::For(timeout))
            .map_err(SendError::from_try)
    }

    pub(super) fn send_oob(self, payload: Bytes) -> Result<(), SendError<Bytes>> {
        self.send_with(payload, SendOptions::new().oob())
    }

    pub(super) fn send_batch(self, payloads: Vec<Bytes>) -> Result<(), SendError<Vec<Bytes>>> {
        let peer = match self.to {
            To::Peer(p) => p.clone(),
            To::Name(name) => match self.core.peer_named(name) {
                Ok(p) => p,
                Err(e) => return Err(SendError::new(e, payloads)),
            },
        };
        self.core.enqueue_batch(&peer, payloads)
    }

    pub(super) fn send_with(
        self,
        payload: Bytes,
        opts: SendOptions,
    ) -> Result<(), SendError<Bytes>> {
        self.core
            .enqueue(self.to, payload, opts, Wait::Forever)
            .map_err(SendError::from_try)
    }

    pub(super) fn request(
        self,
        payload: Bytes,
        timeout: Duration,
        opts: RequestOptions,
    ) -> Result<Bytes, SendError<Option<Bytes>>> {
        let deadline = Instant::now() + timeout;
        self.send_request_until(payload, Some(deadline), timeout, opts)
            .map_err(|e| {
                e.map_payload(Some).map_error(|e| match e {
                    // Its time ran out waiting for the window: no reply within it either.
                    Error::TimedOut(_) => Error::NoReply(timeout),
                    e => e,
                })
            })?
            .wait_until(Some(deadline), timeout)
            // Queued: the payload is the peer's now.
            .map_err(|e| SendError::new(e, None))
    }

    pub(super) fn send_request(
        self,
        payload: Bytes,
        opts: RequestOptions,
    ) -> Result<PendingReply, SendError<Bytes>> {
        self.send_request_until(payload, None, Duration::ZERO, opts)
    }

    /// Registers a request with the peer (within its cap) and queues it; `timeout` is what
    /// `deadline` was computed from, for the error. Fails only before the request is
    /// queued, handing the payload back.
    fn send_request_until(
        self,
        payload: Bytes,
        deadline: Option<Instant>,
        timeout: Duration,
        opts: RequestOptions,
    ) -> Result<PendingReply, SendError<Bytes>> {
        let peer = match self.to {
            To::Peer(p) => p.clone(),
            To::Name(name) => match self.core.peer_named(name) {
                Ok(p) => p,
                Err(e) => return Err(SendError::new(e, payload)),
            },
        };
        if opts.connected_only {
            // Before taking a slot: nothing to give up.
            if let Err(e) = not_connected(&peer) {
                return Err(SendError::new(e, payload));
            }
        }
        let (id, slot) = match peer.requests.register(deadline) {
            Ok(registered) => registered,
            Err(f) => return Err(SendError::new(failure(f, &peer.name, timeout), payload)),
        };
        let pending = PendingReply {
            peer: peer.clone(),
            id,
            slot,
        };
        let wait = match deadline {
            None => Wait::Forever,
            Some(d) => Wait::For(d.saturating_duration_since(Instant::now())),
        };
        self.core
            .enqueue_to(
                &peer,
                payload,
                opts.send_options(),
                wait,
                Kind::Request(id, self.core.max_reply),
            )
            .map_err(SendError::from_try)?;
        Ok(pending)
    }
}

/// The error a request's failure is to its caller (`timeout`: what it waited).
fn failure(f: Failure, peer: &str, timeout: Duration) -> Error {
    match f {
        Failure::Closed => Error::Closed,
        Failure::Restarted => Error::PeerRestarted(peer.to_owned()),
        Failure::TimedOut => Error::NoReply(timeout),
        Failure::Refused(status) => Error::ReplyFailed {
            peer: peer.to_owned(),
            reason: ReplyFailure::from_status(status),
        },
        Failure::TooLarge { len, max } => Error::TooLarge { len, max },
    }
}

/// `Err(NotConnected)` unless `peer` has an established connection now, as the IO thread
/// last said (a snapshot: see [`SendOptions::connected_only`]).
fn not_connected(peer: &PeerShared) -> Result<(), Error> {
    if peer.state() == PeerState::Connected {
        Ok(())
    } else {
        Err(Error::NotConnected(peer.name.to_string()))
    }
}

/// A request on its way (see [`Sender::send_request`]): wait for its reply with
/// [`wait`](PendingReply::wait), look without waiting with
/// [`is_ready`](PendingReply::is_ready), or `.await` it (it is a [`Future`](#impl-Future-for-PendingReply),
/// under any executor). Dropping it gives the request up: a reply that comes later is
/// counted late.
#[must_use = "a request's reply is only seen through its PendingReply"]
pub struct PendingReply {
    peer: Arc<PeerShared>,
    id: u64,
    slot: Arc<Slot>,
}

impl std::fmt::Debug for PendingReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingReply")
            .field("peer", &self.peer.name)
            .field("id", &self.id)
            .finish()
    }
}

impl PendingReply {
    /// The peer the request went to.
    pub fn peer(&self) -> &str {
        &self.peer.name
    }

    /// Waits at most `timeout` for the reply. Fails with [`Error::NoReply`] if none came
    /// (the request is then given up), [`Error::PeerRestarted`] as soon as the peer comes
    /// back as a new incarnation, [`Error::ReplyFailed`] as soon as the peer says it cannot
    /// answer (see [`ReplyFailure`]), and [`Error::Closed`] as soon as it is removed or
    /// the node shuts down.
    pub fn wait(self, timeout: Duration) -> Result<Bytes, Error> {
        self.wait_until(Some(Instant::now() + timeout), timeout)
    }

    /// Whether the reply (or the request's failure) is there: [`wait`](PendingReply::wait)
    /// then returns at once.
    pub fn is_ready(&self) -> bool {
        self.slot.is_filled()
    }

    fn wait_until(self, deadline: Option<Instant>, timeout: Duration) -> Result<Bytes, Error> {
        let outcome = self.peer.requests.wait(self.id, &self.slot, deadline);
        if outcome.is_none() {
            // Given up: withdrawn if it has not left yet.
            self.peer.note_withdrawal();
        }
        match outcome {
            Some(r) => r.map_err(|f| failure(f, &self.peer.name, timeout)),
            None => Err(Error::NoReply(timeout)),
        }
    }
}

/// Awaiting a `PendingReply` waits for the reply without blocking a thread, under any
/// executor: the thread that receives the reply (the IO thread), or fails the request
/// (the IO thread, a removal, a shutdown), wakes the task. cohort has no runtime of its
/// own, and needs none here.
///
/// There is no timeout: race it against your executor's timer (`tokio::time::timeout`,
/// `futures::select!`…). Dropping the future gives the request up as dropping the handle
/// does: withdrawn if it has not left yet, its reply counted late if it comes. It fails,
/// as soon as the outcome is known, with the errors of [`wait`](PendingReply::wait)
/// (except [`Error::NoReply`], which only a timeout gives). Polling it again after it is
/// ready returns the same outcome.
///
/// ```
/// use std::time::Duration;
/// # fn main() -> Result<(), cohort::Error> {
/// let server = cohort::Node::builder("server")
///     .on_message(|d| { let _ = d.reply(d.payload().to_ascii_uppercase()); })
///     .start()?;
/// let client = cohort::Node::builder("client").peer("server", server.local_addr()).start()?;
/// server.add_peer("client", client.local_addr())?;
/// let pending = client.send_request("server", &b"hello"[..])?;
/// // Any executor; `pollster` is the smallest.
/// let reply = pollster::block_on(pending)?;
/// assert_eq!(&reply[..], b"HELLO");
/// # client.shutdown(Duration::from_secs(5))?;
/// # server.shutdown(Duration::from_secs(5))?;
/// # Ok(()) }
/// ```
impl std::future::Future for PendingReply {
    type Output = Result<Bytes, Error>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Bytes, Error>> {
        match self.slot.poll_peek(cx.waker()) {
            // No deadline of ours: `Failure::TimedOut` (waiting for the cap) is not one
            // the slot is filled with.
            Some(r) => {
                std::task::Poll::Ready(r.map_err(|f| failure(f, &self.peer.name, Duration::ZERO)))
            }
            None => std::task::Poll::Pending,
        }
    }
}

impl Drop for PendingReply {
    fn drop(&mut self) {
        // Answered, failed or timed-out requests are already out of the table (a no-op
        // then); one given up here is withdrawn if it has not left yet.
        if self.peer.requests.forget(self.id) {
            self.peer.note_withdrawal();
        }
    }
}

/// What every send handle of a node shares.
struct SendCore {
    name: SharedStr,
    peers: PeerMap,
    io: Arc<IoShared>,
    max_message: usize,
    /// The room a request reserves for its reply (`Builder::max_reply`).
    max_reply: u32,
    stopped: Arc<AtomicBool>,
    /// Plain messages (reliable, no ttl, at most `FRAMED_MAX_PAYLOAD` bytes) are encoded
    /// by the sending thread, into the outbox's last run (`Outbox::admit_framed`): the node
    /// has no outbound filter and no journal, which must see each message.
    frame: bool,
    /// A handler has blocked on a full window (warned once per node).
    warned_blocking: Arc<AtomicBool>,
    /// A reply was refused as larger than its room (warned once per node).
    warned_reply: Arc<AtomicBool>,
}

thread_local! {
    /// The peer this thread's last send by name found, with the map it was found in.
    static LAST_FOUND: RefCell<Option<Found>> = const { RefCell::new(None) };
}

/// What [`SendCore::send_plain`] did with a message.
enum Plain {
    /// Queued (copied into its frame: the caller drops the payload).
    Sent,
    /// Refused: the peer's outbox is closed (its permits went back).
    Closed,
    /// Not tried: the general path ([`SendCore::enqueue`]) takes it.
    Other,
}

/// What a send queues: a message, or a request with its id and the room it reserves for
/// its reply.
#[derive(Clone, Copy)]
enum Kind {
    Message,
    Request(u64, u32),
}

/// How long a send waits for room in the window.
#[derive(Clone, Copy)]
enum Wait {
    No,
    Forever,
    For(Duration),
}

impl SendCore {
    /// Queues a reply (or a reply status) of `len` bytes after its id, built by `make`
    /// with what it owes the requester: until it is written it counts as held for the
    /// requester, whose connection is not read while that exceeds its receive window.
    fn queue_reply(
        &self,
        peer: &PeerShared,
        len: usize,
        make: impl FnOnce(Owed) -> Outgoing,
    ) -> Result<(), Error> {
        let owed = Owed::new(
            peer.credit.clone(),
            self.io.handoff.clone(),
            peer.id,
            cost(len + wire::REQUEST_ID_BYTES),
        );
        peer.outbox.admit(make(owed)).map_err(|_| Error::Closed)?;
        self.io.schedule(peer);
        Ok(())
    }

    /// Whether `peer` has an established connection now (and the node runs).
    fn connected(&self, peer: &PeerShared) -> bool {
        !self.stopped.load(Ordering::Acquire) && peer.state() == PeerState::Connected
    }

    /// Parks until `peer` is connected, closed, or `timeout` has passed.
    fn wait_connected(&self, peer: &PeerShared, timeout: Duration) -> Result<(), Error> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        // A timeout too long for an `Instant` waits without a deadline.
        let deadline = Instant::now().checked_add(timeout);
        match peer.wait_connected(deadline) {
            Ok(()) => Ok(()),
            Err(PeerState::Closed) => Err(Error::Closed),
            Err(_) => Err(Error::ConnectTimedOut {
                peer: peer.name.to_string(),
                timeout,
            }),
        }
    }

    fn peer_named(&self, name: &str) -> Result<Arc<PeerShared>, Error> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.peers
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| Error::UnknownPeer(name.to_owned()))
    }

    fn enqueue(
        &self,
        to: To<'_>,
        payload: Bytes,
        opts: SendOptions,
        wait: Wait,
    ) -> Result<(), TrySendError<Bytes>> {
        match to {
            To::Name(name) => self.enqueue_named(name, payload, opts, wait),
            To::Peer(peer) => self.enqueue_to(peer, payload, opts, wait, Kind::Message),
        }
    }

    /// The common send, in one short frame: a plain message (regular, reliable, no ttl,
    /// small enough to be framed by this thread) to the peer `to` gives, or names as this
    /// thread's last send by name found it ([`Peers::remembered_if_hit`]), with room in its
    /// window now. Anything else — a look-up, a wait for room, a message too large, a
    /// stopped node, another kind of message — is not tried (`Plain::Other`): the general
    /// path ([`enqueue`](SendCore::enqueue)) takes it from the start. What this does, in
    /// its order, is what [`enqueue_to`](SendCore::enqueue_to) does for such a message.
    ///
    /// [`Peers::remembered_if_hit`]: crate::peer::Peers::remembered_if_hit
    #[inline]
    fn send_plain(&self, to: To<'_>, payload: &[u8]) -> Plain {
        if !self.frames(payload.len()) {
            return Plain::Other;
        }
        let name = match to {
            To::Peer(peer) => return self.queue_plain(peer, payload),
            To::Name(name) => name,
        };
        LAST_FOUND
            .try_with(|cell| {
                let mut last = cell.try_borrow_mut().ok()?;
                let peer = self.peers.remembered_if_hit(name, &mut last)?;
                Some(self.queue_plain(peer, payload))
            })
            .ok()
            .flatten()
            // Not remembered, or a send from a payload's drop, or the thread is exiting.
            .unwrap_or(Plain::Other)
    }

    /// [`send_plain`](SendCore::send_plain) to `peer`.
    #[inline]
    fn queue_plain(&self, peer: &PeerShared, payload: &[u8]) -> Plain {
        let len = payload.len();
        if len > self.max_message_to(peer) || self.stopped.load(Ordering::Acquire) {
            return Plain::Other;
        }
        let Ok(permit) = peer.outbox.window().try_acquire(cost(len)) else {
            return Plain::Other;
        };
        if self.queue_framed(peer, false, payload, permit) {
            Plain::Sent
        } else {
            Plain::Closed
        }
    }

    /// Whether this thread encodes a message of `len` bytes of payload itself (a node with
    /// no outbound filter and no journal, a payload of at most `FRAMED_MAX_PAYLOAD`): for a
    /// plain message, the caller checks the rest (reliable, no ttl, not a request).
    #[inline]
    fn frames(&self, len: usize) -> bool {
        self.frame && len <= FRAMED_MAX_PAYLOAD
    }

    /// The largest message `peer` takes: ours, or the peer's once its handshake told it
    /// (kept while it is disconnected).
    #[inline]
    fn max_message_to(&self, peer: &PeerShared) -> usize {
        self.max_message.min(peer.peer_max_message())
    }

    /// Queues a plain message encoded by this thread into `peer`'s outbox, holding
    /// `permit`, and schedules the peer: `false` if the outbox is closed (the permits went
    /// back, `Return::Refused`). The payload is the caller's again (copied into its frame).
    #[inline]
    fn queue_framed(&self, peer: &PeerShared, oob: bool, payload: &[u8], permit: Permit) -> bool {
        // Counted *accepted* under the queue lock, before the IO thread can see it.
        if !peer.outbox.admit_framed(oob, payload, permit) {
            return false;
        }
        self.io.schedule(peer);
        true
    }

    /// Finds the peer by name (the one this thread's last send by name found, while the
    /// node's peer map is unchanged: [`Peers::remembered`](crate::peer::Peers::remembered);
    /// else [`Peers::look_up`](crate::peer::Peers::look_up)), and queues the message for
    /// it, never parking while holding the peer map's lock.
    fn enqueue_named(
        &self,
        to: &str,
        payload: Bytes,
        opts: SendOptions,
        wait: Wait,
    ) -> Result<(), TrySendError<Bytes>> {
        let mut payload = Some(payload);
        let sent = LAST_FOUND.try_with(|cell| {
            let payload = payload.take().expect("taken once");
            match cell.try_borrow_mut() {
                Ok(mut last) => self.enqueue_found(&mut last, to, payload, opts, wait),
                // A send from inside this thread's own send (a payload's drop that sends):
                // a look-up of its own.
                Err(_) => self.enqueue_found(&mut None, to, payload, opts, wait),
            }
        });
        match sent {
            Ok(sent) => sent,
            // The thread is exiting and its thread-locals are gone: a look-up of its own.
            Err(_) => {
                let payload = payload.take().expect("not taken: no thread-local");
                self.enqueue_found(&mut None, to, payload, opts, wait)
            }
        }
    }

    /// `enqueue_named` with `last`, what the thread remembers.
    #[inline]
    fn enqueue_found(
        &self,
        last: &mut Option<Found>,
        to: &str,
        payload: Bytes,
        opts: SendOptions,
        wait: Wait,
    ) -> Result<(), TrySendError<Bytes>> {
        if let Some(peer) = self.peers.remembered(to, last) {
            // No lock held: a send that must wait for room parks right here (on what this
            // thread remembers, which nothing else on the thread can touch then).
            return self.enqueue_to(peer, payload, opts, wait, Kind::Message);
        }
        let mut payload = Some(payload);
        let tried = self.peers.look_up(to, last, |peer| {
            let payload = payload.take().expect("taken once");
            match self.enqueue_to(peer, payload, opts, Wait::No, Kind::Message) {
                // Wait on our own clone, outside the map's lock: a sender parked under it
                // would stall add_peer and remove_peer.
                Err(TrySendError::Full(payload)) if !matches!(wait, Wait::No) => {
                    Err((peer.clone(), payload))
                }
                other => Ok(other),
            }
        });
        match tried {
            None => Err(TrySendError::Failed(
                payload.take().expect("not taken: no peer"),
                Error::UnknownPeer(to.to_owned()),
            )),
            Some(Ok(done)) => done,
            Some(Err((peer, payload))) => {
                self.enqueue_to(&peer, payload, opts, wait, Kind::Message)
            }
        }
    }

    /// A send about to wait for a full window on a pool thread: the handler's thread is
    /// what hands credit back, so two members whose handlers wait on each other this way
    /// wait for ever. Warned once per node, with the way out.
    #[cold]
    fn warn_if_handler(&self, peer: &PeerShared) {
        // Relaxed: a once-only flag for a log line.
        if crate::deliver::on_pool_thread() && !self.warned_blocking.swap(true, Ordering::Relaxed) {
            log::warn!(
                "{}: a message handler is blocked sending to '{}' (its window is full): \
                 while it waits, this node returns no credit for the sender it is \
                 delivering, and two members doing this to each other wait for ever. From \
                 a handler, send with try_send (a full window hands the payload back) or \
                 hand the work to another thread",
                self.name,
                peer.name
            );
        }
    }

    /// Queues `payloads` for `peer` as regular messages, in order, chunk by chunk: a
    /// chunk's permits taken from the window at once (waiting for room, as a `send` does)
    /// and split among its messages, which are admitted under one lock of the outbox. Fails
    /// before queueing anything if a payload is too large; otherwise hands back the
    /// payloads not queued.
    fn enqueue_batch(
        &self,
        peer: &PeerShared,
        payloads: Vec<Bytes>,
    ) -> Result<(), SendError<Vec<Bytes>>> {
        /// The most messages a chunk takes: the IO thread may publish the first ones
        /// while the sender builds the next chunk.
        const CHUNK: usize = 64;
        let max_message = self.max_message_to(peer);
        if let Some(len) = payloads.iter().map(Bytes::len).find(|&l| l > max_message) {
            let e = Error::TooLarge {
                len,
                max: max_message,
            };
            return Err(SendError::new(e, payloads));
        }
        let window = peer.outbox.window();
        // A quarter of the window at most: a batch larger than that goes out as the window
        // frees, rather than waiting for room for all of it.
        let most = (window.capacity() / 4).max(1);
        let mut rest = payloads.into_iter();
        let mut chunk: Vec<Outgoing> = Vec::with_capacity(rest.len().min(CHUNK));
        while !rest.as_slice().is_empty() {
            let (mut n, mut total) = (0, 0);
            for p in rest.as_slice().iter().take(CHUNK) {
                let c = cost(p.len());
                // Encoded by this thread under the outbox's lock, a chunk copies no more
                // than a run holds.
                let framed_full = self.frame && total + c > FRAMED_RUN_BYTES as u64;
                if n > 0 && (total + c > most || framed_full) {
                    break;
                }
                n += 1;
                total += c;
            }
            if self.stopped.load(Ordering::Acquire) {
                return Err(SendError::new(Error::Closed, rest.collect()));
            }
            let acquired = match window.try_acquire(total) {
                Err(AcquireError::Full) => {
                    self.warn_if_handler(peer);
                    window.acquire(total)
                }
                first => first,
            };
            let mut permit = match acquired {
                Ok(permit) => permit,
                Err(AcquireError::TooLarge) => {
                    // Only a chunk of one message can be larger than the window.
                    let len = rest.as_slice().first().map_or(0, Bytes::len);
                    let e = Error::TooLarge {
                        len,
                        max: self.max_message,
                    };
                    return Err(SendError::new(e, rest.collect()));
                }
                // Closed: `acquire` waits without a deadline, never `Full` or `TimedOut`.
                Err(_) => return Err(SendError::new(Error::Closed, rest.collect())),
            };
            let framed = rest.as_slice()[..n].iter().all(|p| self.frames(p.len()));
            if framed {
                let msgs = rest.as_slice()[..n]
                    .iter()
                    .map(|p| (&p[..], permit.take(cost(p.len()))));
                // Counted *accepted* under the queue lock, before the IO thread can see them.
                if !peer.outbox.admit_framed_all(false, msgs) {
                    // `admit_framed_all` gave the permits back (Return::Refused).
                    return Err(SendError::new(Error::Closed, rest.collect()));
                }
                debug_assert_eq!(
                    permit.bytes(),
                    0,
                    "the chunk's permits all went to its messages"
                );
                // Copied into their frames: dropped here, on the sending thread.
                rest.by_ref().take(n).for_each(drop);
                self.io.schedule(peer);
                continue;
            }
            chunk.extend(rest.by_ref().take(n).map(|p| {
                let c = cost(p.len());
                Outgoing::new(p, false, None, permit.take(c))
            }));
            debug_assert_eq!(
                permit.bytes(),
                0,
                "the chunk's permits all went to its messages"
            );
            // Counted *accepted* under the queue lock, before the IO thread can see them.
            if !peer.outbox.admit_all(&mut chunk) {
                // `admit_all` gave the permits back (Return::Refused).
                let back = chunk.drain(..).map(|m| m.payload).chain(rest).collect();
                return Err(SendError::new(Error::Closed, back));
            }
            self.io.schedule(peer);
        }
        Ok(())
    }

    /// Takes the message's permits from the peer's window (the only place they are taken,
    /// but for a batch's: [`SendCore::enqueue_batch`])
    /// and queues it for the IO thread.
    fn enqueue_to(
        &self,
        peer: &PeerShared,
        payload: Bytes,
        opts: SendOptions,
        wait: Wait,
        kind: Kind,
    ) -> Result<(), TrySendError<Bytes>> {
        let len = payload.len();
        // A request or reply carries its id in the message: that much less room for the
        // payload.
        let id_bytes = match kind {
            Kind::Message => 0,
            Kind::Request(..) => wire::REQUEST_HEADER_BYTES,
        };
        let on_wire = len + id_bytes;
        let max_message = self.max_message_to(peer);
        if on_wire > max_message {
            let e = Error::TooLarge {
                len,
                max: max_message - id_bytes.min(max_message),
            };
            return Err(TrySendError::Failed(payload, e));
        }
        if self.stopped.load(Ordering::Acquire) {
            return Err(TrySendError::Failed(payload, Error::Closed));
        }
        if opts.connected_only {
            if let Err(e) = not_connected(peer) {
                return Err(TrySendError::Failed(payload, e));
            }
        }
        let c = match kind {
            Kind::Request(_, room) => Outgoing::request_cost(len, room),
            Kind::Message => cost(len),
        };
        let window = peer.outbox.window();
        let mut waited = false;
        let acquired = match wait {
            Wait::No => window.try_acquire(c),
            Wait::Forever | Wait::For(_) => match window.try_acquire(c) {
                Err(AcquireError::Full) => {
                    self.warn_if_handler(peer);
                    waited = true;
                    match wait {
                        Wait::For(d) => window.acquire_timeout(c, d),
                        _ => window.acquire(c),
                    }
                }
                first => first,
            },
        };
        let permit = match acquired {
            Ok(permit) => permit,
            Err(AcquireError::Full) => return Err(TrySendError::Full(payload)),
            Err(AcquireError::Closed) => return Err(TrySendError::Failed(payload, Error::Closed)),
            Err(AcquireError::TimedOut) => {
                let d = match wait {
                    Wait::For(d) => d,
                    _ => Duration::ZERO,
                };
                return Err(TrySendError::Failed(payload, Error::TimedOut(d)));
            }
            Err(AcquireError::TooLarge) => {
                let e = Error::TooLarge {
                    len,
                    max: self.max_message,
                };
                return Err(TrySendError::Failed(payload, e));
            }
        };
        if waited && opts.connected_only {
            // The connection may have dropped while the send waited for the window.
            if let Err(e) = not_connected(peer) {
                peer.outbox.give_back(Return::Refused, permit);
                return Err(TrySendError::Failed(payload, e));
            }
        }
        if self.frames(len)
            && matches!(kind, Kind::Message)
            && !opts.unreliable
            && opts.ttl.is_none()
        {
            if !self.queue_framed(peer, opts.oob, &payload, permit) {
                return Err(TrySendError::Failed(payload, Error::Closed));
            }
            // Copied into its frame: dropped here, on the sending thread.
            return Ok(());
        }
        let deadline = opts.ttl.map(|t| {
            peer.note_ttl();
            // On the clock the IO thread judges it with.
            self.io.clock.now() + t
        });
        // A request's payload is copied behind its id: keep the caller's to hand back.
        let (m, kept) = match kind {
            Kind::Request(id, room) => (
                Outgoing::request(id, room, &payload, opts.oob, deadline, permit),
                Some(payload),
            ),
            _ if opts.unreliable => (
                Outgoing::new(payload, opts.oob, deadline, permit).unreliable(),
                None,
            ),
            _ => (Outgoing::new(payload, opts.oob, deadline, permit), None),
        };
        // Counted *accepted* under the queue lock, before the IO thread can see it.
        if let Err(m) = peer.outbox.admit(m) {
            // `admit` gave the permits back (Return::Refused).
            return Err(TrySendError::Failed(
                kept.unwrap_or(m.payload),
                Error::Closed,
            ));
        }
        self.io.schedule(peer);
        Ok(())
    }
}
