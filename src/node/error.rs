//! The errors of the public surface.

use std::time::Duration;

/// Everything that can go wrong in the public API of a [`Node`](crate::Node).
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
    /// The message is larger than the node accepts.
    #[error("message of {len} bytes exceeds the maximum of {max} bytes (raise Builder::max_message and window_bytes)")]
    TooLarge {
        /// The message's length.
        len: usize,
        /// The configured maximum.
        max: usize,
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
    /// The builder's settings are inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The TLS configuration could not be loaded (feature `tls`).
    #[cfg(feature = "tls")]
    #[error("TLS configuration: {0}")]
    Tls(#[from] crate::tls::TlsError),
    /// The listener could not be set up on the address of
    /// [`Builder::listen`](crate::Builder::listen): typically the address is in use
    /// ([`std::io::ErrorKind::AddrInUse`]) or not one of this host's. The OS error is the
    /// [`source`](std::error::Error::source).
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
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Another OS-level failure (setting up the poller, spawning a thread).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The journal could not be opened, recovered or written (see the message).
    #[error("{0}")]
    Journal(#[from] crate::journal::JournalError),
    /// `shutdown` could not join every thread within its deadline; the threads named are
    /// still running (typically a message handler that does not return).
    #[error("shutdown deadline passed with threads still running: {0}")]
    ShutdownTimedOut(String),
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
