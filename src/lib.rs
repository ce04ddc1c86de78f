//! # cohort
//!
//! A cluster message transport for synchronous Rust programs: no async runtime, no
//! futures. Named members of a cluster send each other byte messages over TCP, with
//!
//! - **one delivery thread per sender**: a sender's regular messages reach the handler in
//!   its order, on at most one pool thread at a time; out-of-band messages go straight to
//!   the pool;
//! - **credit flow control**: a byte window per peer, refilled by the receiver in halves as
//!   its application consumes; `send` parks, `try_send` hands the payload back;
//! - **recovery**: a recovery descriptor per connection, a handshake that exchanges received
//!   counts, and resend of what the peer lacks, for exactly-once in-order delivery across
//!   reconnects;
//! - **authentication** ([`Builder::secret`]): a challenge–response in every handshake, with
//!   fresh nonces on both sides and HMAC-SHA-256 over the whole handshake; a peer without the
//!   secret is refused before the node acts on anything it says;
//! - **a durable outbox** ([`journal`]): preallocated segment files, an empty-file pool and
//!   recovery, so reliable messages and delivery counts survive a restart;
//! - **optional TLS** (cargo feature `tls`, module `tls`): rustls over the same
//!   connections, certificates on both sides, each member's name checked against its
//!   certificate.
//!
//! ```
//! use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
//! use std::time::{Duration, Instant};
//! # fn main() -> Result<(), cohort::Error> {
//! let got = Arc::new(AtomicUsize::new(0));
//! let g = got.clone();
//! let beta = cohort::Node::builder("beta")
//!     .cluster("demo")
//!     .on_message(move |d| { assert_eq!(d.from(), "alpha"); g.fetch_add(1, Ordering::SeqCst); })
//!     .start()?;
//! let alpha = cohort::Node::builder("alpha")
//!     .cluster("demo")
//!     .peer("beta", beta.local_addr())
//!     .start()?;
//! beta.add_peer("alpha", alpha.local_addr())?;
//! for i in 0..100u32 {
//!     alpha.send("beta", i.to_le_bytes().to_vec())?;
//! }
//! let deadline = Instant::now() + Duration::from_secs(10);
//! while got.load(Ordering::SeqCst) < 100 && Instant::now() < deadline {
//!     std::thread::yield_now();
//! }
//! assert_eq!(got.load(Ordering::SeqCst), 100);
//! alpha.shutdown(Duration::from_secs(5))?;
//! beta.shutdown(Duration::from_secs(5))?;
//! # Ok(()) }
//! ```
//!
//! The architecture is described in `docs/design.md`, the wire format in `docs/wire.md`.

#![doc(test(attr(deny(warnings))))]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod deliver;
pub mod flow;
pub mod handoff;
pub mod journal;
mod net;
pub mod peer;
pub mod proto;
pub(crate) mod sync;
#[cfg(feature = "tls")]
pub mod tls;
pub mod wire;

mod node;
mod util;

pub use bytes::Bytes;
pub use deliver::{Delivery, PoolStats};
pub use journal::{FsyncPolicy, JournalStats};
pub use node::{
    Builder, ConnStats, Error, Node, PeerSender, PeerStats, SendOptions, Sender, ShutdownReport,
    Stats, TrySendError, UndeliveredFn,
};
pub use peer::{Outgoing, PeerInfo, PeerState};
