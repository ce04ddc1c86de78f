//! A member's lifecycle and the per-peer state shared between application threads, the IO
//! thread and the pool.
//!
//! ```text
//!             ┌──────────── dial fails / connection lost ───────────┐
//!             ▼                                                     │
//!  Connecting ──► Handshaking ──► Connected ──► Backoff ──► Connecting …
//!       │              │              │            │
//!       └──────────────┴──────────────┴────────────┴──► Closed (terminal: removed / shutdown)
//! ```
//!
//! `Backoff` means "not connected, may reconnect"; `Closed` means "closed for good": no
//! timer scheduled earlier can dial again, and a connection completing after `Closed` is
//! closed at once. Every transition goes through [`PeerState::can_become`].

use std::collections::VecDeque;
use std::fmt;

use bytes::Bytes;

use crate::deliver::{CreditSink, MemberQueue};
use crate::flow::{RecvCredit, SendWindow};
use crate::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use crate::sync::{Arc, Mutex, SharedStr};

/// Where a peer is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PeerState {
    /// A TCP connect is in progress.
    Connecting = 0,
    /// A connection is up and exchanging the handshake.
    Handshaking = 1,
    /// Handshake done; messages flow.
    Connected = 2,
    /// Not connected; a reconnect is scheduled (or the peer is expected to dial us).
    Backoff = 3,
    /// Removed or shut down: terminal.
    Closed = 4,
}

impl PeerState {
    fn from_u8(v: u8) -> PeerState {
        match v {
            0 => PeerState::Connecting,
            1 => PeerState::Handshaking,
            2 => PeerState::Connected,
            3 => PeerState::Backoff,
            _ => PeerState::Closed,
        }
    }

    /// Whether the lifecycle allows going from `self` to `next`. Staying in a state is
    /// allowed (a second connection can handshake while one already is); nothing leaves
    /// `Closed`.
    pub fn can_become(self, next: PeerState) -> bool {
        use PeerState::*;
        match (self, next) {
            (Closed, _) => false,
            (_, Closed) => true,
            (a, b) if a == b => true,
            (Connecting, Handshaking | Backoff) => true,
            (Handshaking, Connected | Backoff | Connecting) => true,
            (Connected, Backoff | Handshaking) => true,
            (Backoff, Connecting | Handshaking) => true,
            _ => false,
        }
    }
}

impl fmt::Display for PeerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            PeerState::Connecting => "connecting",
            PeerState::Handshaking => "handshaking",
            PeerState::Connected => "connected",
            PeerState::Backoff => "backoff",
            PeerState::Closed => "closed",
        };
        f.pad(s)
    }
}

/// A message accepted by `send*` and not yet published.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub(crate) payload: Bytes,
    pub(crate) flags: u8,
}

/// Per-peer counters. They add up: `accepted == sent + failed + queued` at every instant
/// the stats are read (queued is derived).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) accepted: AtomicU64,
    pub(crate) accepted_bytes: AtomicU64,
    pub(crate) sent: AtomicU64,
    pub(crate) sent_bytes: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) failed_bytes: AtomicU64,
    pub(crate) received: AtomicU64,
    pub(crate) received_bytes: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) resent: AtomicU64,
    pub(crate) connects: AtomicU64,
    pub(crate) disconnects: AtomicU64,
    pub(crate) undelivered: AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        // Relaxed: statistics only; nothing is ordered by them.
        c.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// Per-peer state shared by every thread.
pub(crate) struct PeerShared {
    pub(crate) id: usize,
    pub(crate) name: SharedStr,
    pub(crate) window: SendWindow,
    /// Accepted messages waiting for the IO thread. Closed (no more pushes) once the peer is
    /// removed or the node shuts down; the flag lives under the same lock so a push can never
    /// slip in after the final drain.
    pub(crate) outbox: Mutex<Outbox>,
    /// Set while the peer is in the IO thread's ready list.
    pub(crate) scheduled: AtomicBool,
    /// Lifecycle state mirrored for stats (the IO thread owns the real one).
    state: AtomicU8,
    pub(crate) credit: Arc<RecvCredit>,
    pub(crate) member: Arc<MemberQueue>,
    /// Where out-of-band deliveries from this peer report consumption.
    pub(crate) oob_sink: Arc<dyn CreditSink>,
    pub(crate) counters: Counters,
}

#[derive(Debug, Default)]
pub(crate) struct Outbox {
    pub(crate) queue: VecDeque<Outgoing>,
    pub(crate) closed: bool,
}

impl fmt::Debug for PeerShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerShared")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("state", &self.state())
            .finish()
    }
}

impl PeerShared {
    pub(crate) fn new(
        id: usize,
        name: SharedStr,
        window: u64,
        credit: Arc<RecvCredit>,
        member: Arc<MemberQueue>,
        oob_sink: Arc<dyn CreditSink>,
    ) -> PeerShared {
        PeerShared {
            id,
            name,
            window: SendWindow::new(window),
            outbox: Mutex::new(Outbox::default()),
            scheduled: AtomicBool::new(false),
            state: AtomicU8::new(PeerState::Backoff as u8),
            credit,
            member,
            oob_sink,
            counters: Counters::default(),
        }
    }

    pub(crate) fn state(&self) -> PeerState {
        PeerState::from_u8(self.state.load(Ordering::Relaxed))
    }

    pub(crate) fn set_state(&self, s: PeerState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::PeerState::*;

    #[test]
    fn closed_is_terminal() {
        for s in [Connecting, Handshaking, Connected, Backoff, Closed] {
            assert!(!Closed.can_become(s));
            assert!(s == Closed || s.can_become(Closed));
        }
    }

    #[test]
    fn lifecycle_edges() {
        assert!(Backoff.can_become(Connecting));
        assert!(Connecting.can_become(Handshaking));
        assert!(Handshaking.can_become(Connected));
        assert!(Connected.can_become(Backoff));
        assert!(
            !Connecting.can_become(Connected),
            "a connection handshakes first"
        );
        assert!(!Backoff.can_become(Connected));
    }
}
