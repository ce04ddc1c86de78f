//! The errors of the public surface.

use std::time::Duration;

/// Everything that can go wrong in the public API of a [`Node`](crate::Node).
///
/// As the Rust API guidelines ask, each error's `Display` says what failed at its own level
/// and nothing more; the cause (an OS error, a journal's or a TLS file's problem) is only its
/// [`source`](std::error::Error::source). Print the whole chain to see everything, as an
/// error reporter (`anyhow`, `eyre`) does:
///
/// ```
/// fn report(e: &dyn std::error::Error) -> String {
///     let mut text = e.to_string();
///     let mut cause = e.source();
///     while let Some(c) = cause {
///         text += &format!(": {c}");
///         cause = c.source();
///     }
///     text
/// }
/// let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
/// let e = cohort::Node::builder("alpha").listen(taken.local_addr()?).start().unwrap_err();
/// eprintln!("{}", report(&e)); // cannot listen on 127.0.0.1:…: Address already in use …
/// # Ok::<(), std::io::Error>(())
/// ```
///
/// A failed send wraps it in a [`SendError`] that hands the payload back:
///
/// ```
/// use cohort::{Error, Node};
/// # fn main() -> Result<(), Error> {
/// let node = Node::builder("alpha").cluster("docs").start()?;
/// match node.send("nobody", &b"hello"[..]) {
///     Err(e) if matches!(e.error(), Error::UnknownPeer(_)) => {
///         let payload = e.into_inner(); // nothing lost: route it elsewhere
///         assert_eq!(&payload[..], b"hello");
///     }
///     other => panic!("expected UnknownPeer, got {other:?}"),
/// }
/// # node.shutdown(std::time::Duration::from_secs(5))?;
/// # Ok(()) }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No member of that name is configured; add it with the builder's `peer` or
    /// `Node::add_peer`.
    #[error("unknown peer '{0}': add it with Builder::peer or Node::add_peer first")]
    UnknownPeer(String),
    /// A member of that name is already configured.
    #[error("peer '{0}' is already configured")]
    PeerExists(String),
    /// The node was shut down, or the peer was removed, while the message waited.
    #[error("closed: the node is shut down or the peer was removed")]
    Closed,
    /// The message is larger than this node sends or than its peer accepts (the peer's
    /// limit is learnt from its handshake and kept while it is disconnected).
    #[error("message of {len} bytes exceeds the maximum of {max} bytes (Builder::max_message of this node or of the peer: raise it on both, with window_bytes)")]
    TooLarge {
        /// The message's length.
        len: usize,
        /// The largest payload accepted: this node's `max_message`, or the peer's if
        /// smaller (less a request's header, for a request).
        max: usize,
    },
    /// A reply ([`Delivery::reply`](crate::Delivery::reply)) is larger than the room its
    /// request reserved for it: the requester's
    /// [`Builder::max_reply`](crate::Builder::max_reply), as
    /// [`Delivery::reply_room`](crate::Delivery::reply_room) tells. The requester's
    /// `PendingReply` fails with [`ReplyFailure::TooLarge`] unless a smaller reply follows.
    #[error("reply of {len} bytes exceeds the {room} bytes its request reserved for it (the requester's Builder::max_reply; Delivery::reply_room tells the room): send a smaller reply")]
    ReplyTooLarge {
        /// The reply's length.
        len: usize,
        /// The room its request reserved.
        room: usize,
    },
    /// The peer's send window has no room now (a `try_send` turned into an `Error`).
    #[error("send window full: the peer is not keeping up; retry later or use send/send_timeout")]
    Full,
    /// `send_timeout` waited its whole timeout for room in the peer's send window: the
    /// peer is slow or not consuming.
    #[error("timed out after {0:?} waiting for send window")]
    TimedOut(Duration),
    /// A request got no reply within its timeout (a reply that comes later is dropped and
    /// counted in [`PeerStats::late_replies`](crate::PeerStats::late_replies)).
    #[error("no reply within {0:?}")]
    NoReply(Duration),
    /// The peer restarted as a new incarnation while the request waited: the new process
    /// cannot answer what the old one received (and the request may or may not have been
    /// handled by the old one).
    #[error("peer '{0}' restarted while the request waited for its reply; it may or may not have been handled")]
    PeerRestarted(String),
    /// [`Delivery::reply`](crate::Delivery::reply) on a message that is not a request.
    #[error("the message is not a request: there is nobody to reply to")]
    NotARequest,
    /// A second [`Delivery::reply`](crate::Delivery::reply) to the same request.
    #[error("the request was already answered")]
    AlreadyReplied,
    /// A setting of the [`Builder`](crate::Builder), or an argument of
    /// [`Node::add_peer`](crate::Node::add_peer), cannot work: which one and why is in the
    /// [`ConfigError`].
    #[error("invalid configuration: {0}")]
    Config(ConfigError),
    /// The TLS configuration could not be loaded (feature `tls`): the
    /// [`TlsError`](crate::tls::TlsError), its [`source`](std::error::Error::source), says
    /// which file and why.
    #[cfg(feature = "tls")]
    #[error("the TLS configuration could not be loaded")]
    Tls(#[from] crate::tls::TlsError),
    /// The listener could not be set up on the address of
    /// [`Builder::listen`](crate::Builder::listen): typically the address is in use
    /// ([`std::io::ErrorKind::AddrInUse`]) or not one of this host's. The OS error is the
    /// [`source`](std::error::Error::source). For a Unix-domain socket, `AddrInUse` also
    /// means that another process listens on the socket's file (it is never taken over),
    /// and `AlreadyExists` that the path is a file that is not a socket.
    ///
    /// ```
    /// use std::error::Error as _;
    ///
    /// let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    /// let addr = taken.local_addr()?;
    /// match cohort::Node::builder("alpha").listen(addr).start() {
    ///     Err(e @ cohort::Error::Listen { .. }) => {
    ///         assert!(e.to_string().contains(&addr.to_string()));
    ///         let os = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
    ///         assert_eq!(os.map(|o| o.kind()), Some(std::io::ErrorKind::AddrInUse));
    ///     }
    ///     other => panic!("expected a listen error, got {other:?}"),
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address asked for (a Unix-domain socket's is written `unix:<path>`).
        addr: crate::addr::Addr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Another OS-level failure (setting up the poller, spawning a thread); the OS error is
    /// the [`source`](std::error::Error::source).
    #[error("an OS-level operation failed (setting up the poller or spawning a thread)")]
    Io(#[from] std::io::Error),
    /// The journal could not be opened, recovered or written: transparent, its `Display`
    /// is the [`JournalError`](crate::journal::JournalError)'s (which names the file and
    /// what to do) and its [`source`](std::error::Error::source) that error's cause (the
    /// OS error, if any).
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
    /// `shutdown` could not join every thread within its deadline; the threads named are
    /// still running (typically a message handler that does not return).
    #[error("shutdown deadline passed with threads still running: {0}")]
    ShutdownTimedOut(String),
    /// The peer took the request in but says it cannot answer it, and why (the
    /// [`ReplyFailure`]): its reply was larger than the room this request reserved, its
    /// application dropped the request without replying, its handler panicked on it, or it
    /// has no handler. The request fails as soon as the peer's word arrives, not at its
    /// timeout. The request was handled (or refused) once; whether to send it again is the
    /// application's call.
    ///
    /// ```
    /// use std::time::Duration;
    /// use cohort::{Error, ReplyFailure};
    /// # fn main() -> Result<(), cohort::Error> {
    /// let server = cohort::Node::builder("server")
    ///     .on_message(|d| {
    ///         // Handled, but not answered: the requester is told at once.
    ///         let _ = d.payload();
    ///     })
    ///     .start()?;
    /// let client = cohort::Node::builder("client").peer("server", server.local_addr()).start()?;
    /// server.add_peer("client", client.local_addr())?;
    /// match client.request("server", &b"anyone?"[..], Duration::from_secs(60)).map_err(Error::from) {
    ///     Err(Error::ReplyFailed { peer, reason: ReplyFailure::Unanswered }) => assert_eq!(peer, "server"),
    ///     other => panic!("expected an unanswered request, got {other:?}"),
    /// }
    /// # client.shutdown(Duration::from_secs(5))?;
    /// # server.shutdown(Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    #[error("'{peer}' cannot answer the request: {reason}")]
    ReplyFailed {
        /// The member the request went to.
        peer: String,
        /// Why it cannot answer.
        reason: ReplyFailure,
    },
    /// A send or request made with `connected_only`
    /// ([`SendOptions::connected_only`](crate::SendOptions::connected_only),
    /// [`RequestOptions::connected_only`](crate::RequestOptions::connected_only)) found no
    /// established connection to the peer: the message was not queued (the payload comes
    /// back in the [`SendError`]). Retry once it is connected
    /// ([`Event::Connected`](crate::Event::Connected), [`PeerStats::state`](crate::PeerStats::state)),
    /// send it elsewhere, or send without `connected_only` to queue it until the peer is back.
    #[error("peer '{0}' is not connected: the message was not queued (sent with connected_only); retry once it connects, or send without connected_only to queue it")]
    NotConnected(String),
    /// [`wait_connected`](crate::Node::wait_connected) waited its whole `timeout` and the
    /// peer never completed a handshake: it is not running, not reachable at the address
    /// configured, or refusing this node (see [`Event::Refused`](crate::Event::Refused)
    /// and [`Stats::connections`](crate::Stats::connections)). The peer stays configured
    /// and is still dialled: waiting again may succeed.
    #[error("peer '{peer}' did not connect within {timeout:?}: is it running and reachable at the address configured, with the same cluster name and secret?")]
    ConnectTimedOut {
        /// The member waited for.
        peer: String,
        /// How long it was waited for.
        timeout: Duration,
    },
    /// A typed message or reply could not be encoded, or a payload could not be decoded
    /// into the type asked for (feature `codec`; the [`CodecError`](crate::codec::CodecError)
    /// says which type, which way and why). Decoding never panics: a corrupt, truncated or
    /// foreign payload is this error.
    #[cfg(feature = "codec")]
    #[error(transparent)]
    Codec(#[from] crate::codec::CodecError),
}

/// Why a peer cannot answer a request, in [`Error::ReplyFailed`]: what the replier sent
/// back instead of a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplyFailure {
    /// The handler's reply of `len` bytes was larger than the `room` the request reserved
    /// for it ([`Builder::max_reply`](crate::Builder::max_reply) on the requesting node;
    /// a handler sees it as [`Delivery::reply_room`](crate::Delivery::reply_room)).
    TooLarge {
        /// The refused reply's length.
        len: u64,
        /// The room the request reserved.
        room: u64,
    },
    /// The request reached the peer's application, which dropped it (its handler
    /// returned, or it let the [`Delivery`](crate::Delivery) go) without replying.
    Unanswered,
    /// The peer's message handler panicked on the request.
    HandlerPanicked,
    /// The peer has no message handler ([`Builder::on_message`](crate::Builder::on_message))
    /// to answer requests.
    NoHandler,
    /// A reason this version does not know (a code from a newer peer).
    Other(u8),
}

impl ReplyFailure {
    /// The failure a status reply carries.
    pub(crate) fn from_status(s: crate::wire::ReplyStatus) -> ReplyFailure {
        use crate::wire::ReplyStatus;
        match s {
            ReplyStatus::TooLarge { len, room } => ReplyFailure::TooLarge {
                len,
                room: u64::from(room),
            },
            ReplyStatus::Unanswered => ReplyFailure::Unanswered,
            ReplyStatus::Panicked => ReplyFailure::HandlerPanicked,
            ReplyStatus::NoHandler => ReplyFailure::NoHandler,
            ReplyStatus::Other(c) => ReplyFailure::Other(c),
        }
    }
}

impl std::fmt::Display for ReplyFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplyFailure::TooLarge { len, room } => write!(
                f,
                "its reply of {len} bytes is larger than the {room} bytes this request \
                 reserved for it (raise Builder::max_reply on this node, or have the \
                 handler keep within Delivery::reply_room)"
            ),
            ReplyFailure::Unanswered => f.write_str(
                "its application dropped the request without replying (a handler must call \
                 Delivery::reply, or keep the Delivery to reply later)",
            ),
            ReplyFailure::HandlerPanicked => {
                f.write_str("its message handler panicked on the request (see its log)")
            }
            ReplyFailure::NoHandler => f.write_str(
                "it has no message handler to answer requests (set Builder::on_message, or \
                 take requests from its Inbox)",
            ),
            ReplyFailure::Other(code) => write!(
                f,
                "it refused the request for a reason this version does not know (code {code})"
            ),
        }
    }
}

/// A setting that cannot work, in [`Error::Config`]: one variant per kind of problem, each
/// naming the setting ([`setting`](ConfigError::setting): the [`Builder`](crate::Builder)
/// method, or the call, that was given it). Its `Display` says the value and what would
/// work.
///
/// ```
/// use cohort::{ConfigError, Error};
///
/// match cohort::Node::builder("alpha").recv_window(10).start() {
///     Err(Error::Config(ConfigError::OutOfRange { setting, value, min, .. })) => {
///         assert_eq!(setting, "recv_window");
///         assert_eq!(value, 10);
///         assert!(min > 10);
///     }
///     other => panic!("expected an out-of-range recv_window, got {other:?}"),
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A name cannot be used: a member, cluster or peer name that is empty or longer than
    /// 255 bytes, a peer with this node's own name, or (with TLS) a member name that is not
    /// a DNS name.
    Name {
        /// `"name"` (this member's, given to [`Node::builder`](crate::Node::builder)),
        /// `"cluster"`, `"peer"` or `"add_peer"`.
        setting: &'static str,
        /// The name given.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A size or count out of the range that works (the range may follow from other
    /// settings: a message must fit in half the window).
    OutOfRange {
        /// `"window_bytes"`, `"recv_window"`, `"max_message"`, `"max_reply"`,
        /// `"journal_segment_size"` (in bytes) or `"pool_threads"` (in threads).
        setting: &'static str,
        /// The value in effect, in bytes (in threads for `"pool_threads"`).
        value: u64,
        /// The smallest that works.
        min: u64,
        /// The largest that works with the other settings (`u64::MAX`: no upper bound).
        max: u64,
    },
    /// An address that does not resolve to a socket address.
    Address {
        /// `"listen"`, `"peer"` or `"add_peer"`.
        setting: &'static str,
        /// The peer whose address it is (`None` for `listen`).
        peer: Option<String>,
        /// Why it did not resolve.
        problem: String,
    },
    /// [`Builder::secret`](crate::Builder::secret) with an empty secret.
    EmptySecret,
    /// A journal setting, or [`Node::sync_journal`](crate::Node::sync_journal), on a node
    /// configured without a journal directory ([`Builder::journal`](crate::Builder::journal)).
    NoJournal {
        /// `"journal_fsync or journal_segment_size"` or `"sync_journal"`.
        setting: &'static str,
    },
    /// [`Builder::start_with_inbox`](crate::Builder::start_with_inbox) with an
    /// [`on_message`](crate::Builder::on_message) handler: the messages go to one or the
    /// other.
    InboxWithHandler,
    /// [`Builder::seed`](crate::Builder::seed) with [`Builder::tls`](crate::Builder::tls):
    /// a TLS client verifies the certificate of the member it dials, and a seed names none.
    SeedsWithTls,
    /// With TLS, this member's own certificate is not valid for its name.
    Certificate {
        /// This member's name.
        member: String,
        /// Why the certificate does not do.
        problem: String,
    },
}

impl ConfigError {
    /// The setting at fault: the [`Builder`](crate::Builder) method (or the call) that was
    /// given it, e.g. `"max_message"`, `"peer"`, `"add_peer"`, `"sync_journal"`.
    pub fn setting(&self) -> &'static str {
        match self {
            ConfigError::Name { setting, .. }
            | ConfigError::OutOfRange { setting, .. }
            | ConfigError::Address { setting, .. }
            | ConfigError::NoJournal { setting } => setting,
            ConfigError::EmptySecret => "secret",
            ConfigError::InboxWithHandler => "on_message",
            ConfigError::Certificate { .. } => "tls",
            ConfigError::SeedsWithTls => "seed",
        }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Name {
                setting,
                name,
                problem,
            } => {
                // A long name is shown by its start: the problem says how long it is.
                const SHOWN: usize = 32;
                match name.char_indices().nth(SHOWN) {
                    Some((cut, _)) => write!(f, "{setting} {:?}…: {problem}", &name[..cut]),
                    None => write!(f, "{setting} {name:?}: {problem}"),
                }
            }
            ConfigError::OutOfRange {
                setting,
                value,
                min,
                max,
            } => {
                let unit = match *setting {
                    "pool_threads" => "threads",
                    "membership_interval" => "ms",
                    _ => "bytes",
                };
                if *max == u64::MAX {
                    write!(
                        f,
                        "{setting} of {value} {unit} is out of range: it must be at least {min}"
                    )?;
                } else {
                    write!(
                        f,
                        "{setting} of {value} {unit} is out of range: it must be from {min} to {max} {unit}"
                    )?;
                }
                match *setting {
                    "max_message" => f.write_str(
                        " (a message and its 16 bytes of overhead must fit in half the window, \
                         or it could never be sent): raise window_bytes or lower max_message",
                    ),
                    "max_reply" => f.write_str(
                        " (a request's room for its reply, with the request's header and \
                         overhead, must fit in half the window, or no request could be sent): \
                         raise window_bytes or lower max_reply",
                    ),
                    _ => Ok(()),
                }
            }
            ConfigError::Address {
                setting,
                peer: Some(peer),
                problem,
            } => write!(f, "{setting}: address of peer '{peer}': {problem}"),
            ConfigError::Address {
                setting,
                peer: None,
                problem,
            } => write!(f, "{setting} address: {problem}"),
            ConfigError::EmptySecret => f.write_str(
                "secret: the secret is empty: use at least 32 random bytes, or no secret",
            ),
            ConfigError::NoJournal { setting } => write!(
                f,
                "{setting} needs a journal directory: configure Builder::journal(dir)"
            ),
            ConfigError::InboxWithHandler => f.write_str(
                "start_with_inbox takes messages through the inbox: remove the on_message \
                 (or on_message_ref) handler, or call start",
            ),
            ConfigError::Certificate { member, problem } => write!(
                f,
                "tls: this member's own certificate must name it ('{member}'): {problem}"
            ),
            ConfigError::SeedsWithTls => f.write_str(
                "seed: seeds cannot be used with tls (a TLS client verifies the certificate of the member it dials, and a seed names none); name one member with `peer` instead: membership joins through it",
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Error {
        Error::Config(e)
    }
}

/// Why [`send`](crate::Sender::send), [`send_timeout`](crate::Sender::send_timeout),
/// [`send_oob`](crate::Sender::send_oob), [`send_with`](crate::Sender::send_with),
/// [`send_request`](crate::Sender::send_request), [`request`](crate::Sender::request) (of a
/// [`Sender`](crate::Sender), [`PeerSender`](crate::PeerSender) or [`Node`](crate::Node)),
/// each peer's part of a [`broadcast`](crate::Sender::broadcast), or
/// [`Delivery::reply`](crate::Delivery::reply) did not take the message: the [`Error`],
/// and the payload handed back ([`into_inner`](SendError::into_inner)) to retry, send
/// elsewhere or log.
///
/// A send fails only before its message is queued (unknown peer, too large for this node
/// or for the peer's announced limit, node closed or peer removed, timed out waiting for
/// the window, not connected with `connected_only`), so the payload always comes back; so
/// do `send_request` and `Delivery::reply`. A blocking [`request`](crate::Sender::request)
/// can also fail after its request left (no reply in time, the peer cannot answer): its
/// payload is a `SendError<Option<Bytes>>`, `Some` when the request was never queued and
/// `None` once it was (the request then belongs to the peer).
/// What becomes of a message once queued is not the send's result: if it is never
/// delivered it is reported to
/// [`Builder::on_undelivered`](crate::Builder::on_undelivered) (see the counters of
/// [`PeerStats`](crate::PeerStats)).
///
/// Its `Display` and `source` are the error's, and it converts into [`Error`], so `?`
/// works in a function returning `Result<_, cohort::Error>`.
///
/// ```
/// use std::time::Duration;
/// use cohort::Error;
///
/// # fn main() -> Result<(), cohort::Error> {
/// let node = cohort::Node::builder("alpha").start()?;
/// node.shutdown(Duration::from_secs(5))?;
/// let e = node
///     .send_timeout("beta", vec![1, 2, 3], Duration::from_millis(10))
///     .unwrap_err();
/// assert!(matches!(e.error(), Error::Closed | Error::UnknownPeer(_)));
/// assert_eq!(&e.into_inner()[..], &[1, 2, 3]);
/// # Ok(()) }
/// ```
pub struct SendError<T> {
    error: Error,
    payload: T,
}

impl<T> SendError<T> {
    /// Why the message was not taken.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// Takes the payload back.
    pub fn into_inner(self) -> T {
        self.payload
    }

    /// The error, dropping the payload.
    pub fn into_error(self) -> Error {
        self.error
    }

    /// The payload and the error.
    pub fn into_parts(self) -> (T, Error) {
        (self.payload, self.error)
    }

    /// A failure with the payload it hands back.
    pub(crate) fn new(error: Error, payload: T) -> SendError<T> {
        SendError { error, payload }
    }

    /// The same error with the payload mapped (a request's payload becomes `Some` while
    /// the call still holds it).
    pub(crate) fn map_payload<U>(self, f: impl FnOnce(T) -> U) -> SendError<U> {
        SendError {
            error: self.error,
            payload: f(self.payload),
        }
    }

    /// The same payload with the error mapped.
    pub(crate) fn map_error(self, f: impl FnOnce(Error) -> Error) -> SendError<T> {
        SendError {
            error: f(self.error),
            payload: self.payload,
        }
    }

    /// A send's failure from its attempt (a full window is [`Error::Full`]).
    pub(crate) fn from_try(e: TrySendError<T>) -> SendError<T> {
        match e {
            TrySendError::Full(payload) => SendError {
                error: Error::Full,
                payload,
            },
            TrySendError::Failed(payload, error) => SendError { error, payload },
        }
    }
}

impl<T> std::fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<T> std::fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl<T> std::error::Error for SendError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

impl<T> From<SendError<T>> for Error {
    fn from(e: SendError<T>) -> Error {
        e.error
    }
}

/// Why [`Node::try_send`](crate::Node::try_send) did not take the message. Every variant
/// hands the payload back, so nothing is lost by trying.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrySendError<T> {
    /// The peer's send window has no room now: back-pressure. Retry later.
    #[error("send window full")]
    Full(T),
    /// Not sent for another reason (unknown peer, too large, closed).
    #[error("{1}")]
    Failed(T, Error),
}

impl<T> TrySendError<T> {
    /// Takes the payload back.
    pub fn into_inner(self) -> T {
        match self {
            TrySendError::Full(t) | TrySendError::Failed(t, _) => t,
        }
    }

    /// Whether this is back-pressure (retry later) rather than a failure.
    pub fn is_full(&self) -> bool {
        matches!(self, TrySendError::Full(_))
    }
}

impl<T> From<TrySendError<T>> for Error {
    fn from(e: TrySendError<T>) -> Error {
        match e {
            TrySendError::Full(_) => Error::Full,
            TrySendError::Failed(_, e) => e,
        }
    }
}
