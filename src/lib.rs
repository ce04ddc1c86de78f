//! # cohort
//!
//! A cluster message transport for synchronous Rust programs: no async runtime (a reply
//! and the inbox can still be awaited, under any executor). Named members of a cluster
//! send each other byte messages (or typed values, feature `codec`) over TCP, with
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
//! - **a durable outbox** ([`Builder::journal`]): preallocated segment files, an empty-file
//!   pool and recovery, so reliable messages and delivery counts survive a restart
//!   ([`inspect_journal`] looks inside one);
//! - **membership events** ([`Builder::on_event`]): a peer connected, disconnected,
//!   restarted as a new incarnation, a handshake refused, a member removed or forgotten
//!   ([`Builder::forget_after`]), told in order on the delivery pool, never on the IO thread,
//!   to a callback that can send ([`Builder::on_event_with`]);
//! - **connection state**: [`Node::is_connected`], and [`Node::wait_connected`] to park
//!   until a member is up (woken by the IO thread, no polling);
//! - **futures without a runtime**: a [`PendingReply`] is a `Future`, woken by the thread
//!   that receives the reply, and [`Inbox::recv_async`] waits for the next message;
//! - **typed messages** (cargo feature `codec`, module `codec`): send any
//!   `serde::Serialize` value and decode a [`Delivery`] or a reply into any
//!   `serde::de::DeserializeOwned` one, in postcard's compact binary format;
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
//! The architecture is described in [`docs/design.md`](https://docs.rs/crate/cohort-net/latest/source/docs/design.md), the wire
//! format in [`docs/wire.md`](https://docs.rs/crate/cohort-net/latest/source/docs/wire.md), every metric in
//! [`docs/metrics.md`](https://docs.rs/crate/cohort-net/latest/source/docs/metrics.md) (these files ship in the package; docs.rs
//! shows them with the crate's sources).

#![doc(test(attr(deny(warnings))))]
// docs.rs builds with `--cfg docsrs` on nightly: each item says which feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
// The internal modules' `pub` items are their API within the crate; cohort's own tests,
// benches, fuzz targets and loom models reach them through `internals` (`--cfg
// cohort_internals`, set for every build of those: `.cargo/config.toml`, and CI's loom and
// fuzz steps). Without it, what only they use is unreachable and its re-exports unused:
// every lint stays on where the cfg is.
#![cfg_attr(not(cohort_internals), allow(unreachable_pub, unused_imports))]

mod addr;
#[cfg(feature = "codec")]
pub mod codec;
mod deliver;
mod events;
mod flow;
mod handoff;
mod journal;
// The node drives the membership core; some of its surface (its counters, health, a plain
// encoder) serves only the tests and, through `internals`, cohort's own tools.
#[cfg_attr(not(cohort_internals), allow(dead_code))]
mod membership;
mod net;
mod node;
mod peer;
mod proto;
mod sync;
#[cfg(feature = "tls")]
pub mod tls;
mod util;
mod wire;

pub use addr::{Addr, AddrParseError, Seed, ToAddr, ToSeed};
pub use bytes::Bytes;
pub use deliver::{
    Delivery, DeliveryRef, Inbox, InboxIter, InboxRecv, InboxTryIter, PoolStats, RecvError,
};
pub use events::{DisconnectReason, Event, MemberInfo, MemberState, RefuseReason};
pub use journal::{
    inspect as inspect_journal, FsyncPolicy, JournalError, JournalInspection, JournalStats,
    RecordKind, SegmentInfo, SegmentState, SegmentStatus,
};
pub use membership::MembershipStats;
pub use node::{
    Builder, ConfigError, ConnStats, Error, IdleStats, IdleStrategy, Node, PeerSender, PeerStats,
    PendingReply, ReplyFailure, RequestOptions, SendError, SendOptions, Sender, ShutdownReport,
    Stats, TrySendError, UndeliveredFn,
};
pub use peer::{Outgoing, PeerInfo, PeerState};

/// Not API: the crate's internals, for cohort's own loom models, fuzz targets, benches and
/// tests, built with `--cfg cohort_internals` (a compiler flag, not a cargo feature: no
/// dependent crate can turn it on; `.cargo/config.toml` sets it for the repository's own
/// builds). Nothing here is covered by semver, documented, or meant for applications.
#[cfg(cohort_internals)]
#[doc(hidden)]
pub mod internals {
    /// The delivery side: member queues, OOB queues, the pool, progress.
    pub mod deliver {
        pub use crate::deliver::*;

        /// A pool without workers and the [`Inbox`] that runs its tasks, as
        /// `Builder::start_with_inbox` makes them (without a node: the deliveries carry no
        /// send handle); `budget` is the delivery batch.
        pub fn inbox(budget: usize) -> std::io::Result<(crate::sync::Arc<Pool>, Inbox)> {
            let pool = crate::sync::Arc::new(Pool::without_workers(budget, None)?);
            Ok((pool.clone(), Inbox::new(pool)))
        }
    }
    /// Membership events and their queue.
    pub mod events {
        pub use crate::events::*;
    }
    /// The protocol's simulation, for the fuzz target `endpoints`.
    #[cfg(not(loom))]
    pub mod sim {
        /// Runs the schedule for two members' endpoints that `data` stands for (settings,
        /// then steps: writes, reads, cuts at any byte, replays, dials, timers, deaths and
        /// restarts), checking every message delivered once and in order, the counters and
        /// the permits; panics on anything it finds.
        pub fn run_bytes(data: &[u8]) {
            crate::proto::sim::fuzz::run_bytes(data)
        }
    }
    /// The send window and receive credit.
    pub mod flow {
        pub use crate::flow::*;
    }
    /// The hand-off from application and pool threads to the IO thread.
    pub mod handoff {
        pub use crate::handoff::*;
    }
    /// The membership protocol (SWIM), sans-IO, and its packet encoding.
    pub mod membership {
        pub use crate::membership::*;
    }
    /// The journal's storage.
    pub mod journal {
        pub use crate::journal::*;
    }
    /// Per-peer shared state: the outbox and the ledger.
    pub mod peer {
        use crate::flow::Permit;
        pub use crate::peer::*;
        use bytes::Bytes;
        use std::time::Instant;

        /// A message holding `permit`, as `send` makes one.
        pub fn outgoing(
            payload: Bytes,
            oob: bool,
            deadline: Option<Instant>,
            permit: Permit,
        ) -> Outgoing {
            Outgoing::new(payload, oob, deadline, permit)
        }

        /// The message's permit, as the IO thread takes it to give back or publish.
        pub fn into_permit(m: Outgoing) -> Permit {
            m.into_permit()
        }

        /// A node's peer map (`net::PeerMap`), changed through the IO thread's own steps
        /// (`peer::admit`, `peer::forget`) and read as the send path reads it.
        #[derive(Debug, Default)]
        pub struct Map(crate::peer::Peers);

        impl Map {
            /// Empty.
            pub fn new() -> Map {
                Map::default()
            }
            /// The IO thread admits `shared` (`Event::Admitted`).
            pub fn admit(&self, shared: crate::sync::Arc<PeerShared>) {
                crate::peer::admit(&self.0, shared)
            }
            /// The IO thread forgets `shared` (`Event::Forget`); whether it was removed.
            pub fn forget(&self, shared: &crate::sync::Arc<PeerShared>) -> bool {
                crate::peer::forget(&self.0, shared)
            }
            /// Runs `f` on the peer named `name` under the map's read lock, as
            /// `SendCore::enqueue_named` does.
            pub fn with<R>(
                &self,
                name: &str,
                f: impl FnOnce(Option<&crate::sync::Arc<PeerShared>>) -> R,
            ) -> R {
                f(self.0.read().get(name))
            }
            /// Runs `f` on the peer named `name` as a send by name finds it: the one
            /// `last` remembers while the map is unchanged, else looked up under the read
            /// lock (and perhaps remembered); `None` if there is none
            /// (`SendCore::enqueue_named` with the thread's remembered look-up).
            pub fn with_found<R>(
                &self,
                name: &str,
                last: &mut Option<crate::peer::Found>,
                f: impl FnOnce(&crate::sync::Arc<PeerShared>) -> R,
            ) -> Option<R> {
                self.0.with_found(name, last, f)
            }
        }

        /// The peer's outbox (its send window and queue).
        pub fn outbox(p: &PeerShared) -> &Outbox {
            &p.outbox
        }

        /// A peer's shared state as the IO thread makes it (`IoShared::new_peer`), without
        /// a receive side to report to: its deliveries return no credit.
        pub fn shared(id: usize, name: &str, window: u64) -> crate::sync::Arc<PeerShared> {
            use crate::deliver::{CreditSink, MemberQueue, OobQueue};
            use crate::sync::Arc;
            struct NoCredit;
            impl CreditSink for NoCredit {
                fn consumed(&self, _epoch: u32, _cost: u64) {}
                fn idle(&self) {}
            }
            let name: crate::sync::SharedStr = name.into();
            let member = Arc::new(MemberQueue::new(name.clone(), Box::new(NoCredit)));
            let oob = Arc::new(OobQueue::new(name.clone(), 1, Arc::new(NoCredit)));
            let credit = Arc::new(crate::flow::RecvCredit::new());
            Arc::new(PeerShared::new(
                id, name, window, credit, member, oob, None, 1,
            ))
        }
    }
    /// The protocol: handshake, recovery descriptor.
    pub mod proto {
        pub use crate::proto::*;
    }
    /// The frame codec.
    pub mod wire {
        pub use crate::wire::*;
    }
}

/// The README's code, compiled by `cargo test` so that what a user copies from it builds.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
