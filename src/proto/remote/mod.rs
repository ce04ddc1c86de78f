//! One member's protocol state across its links ([`Remote`]): the recovery descriptor, what
//! was accepted and not yet published, the ledger of published bytes not yet credited, the
//! ack policy, receive credit, the journal's view of its stream, and its place in the
//! lifecycle. Sans-IO: it is handed the link that speaks for the member (or none), the
//! time, and a place for what it produces ([`Produced`]: journal records, pool tasks,
//! events); it never touches a socket, a clock or a thread. The
//! [`Endpoint`](super::Endpoint) routes frames and timers to it.
//!
//! Everything it shares with other threads goes through [`PeerShared`] (`crate::peer`): the
//! outbox and send window (application threads), receive credit and delivery progress (pool
//! threads), the counters (stats).
//!
//! One file per concern, each an `impl Remote` block:
//!
//! | file | concern |
//! |---|---|
//! | `mod.rs` | the state, its lifecycle (`set_state`, `link_lost`, `retire`, `discard`) |
//! | `outgoing.rs` | publishing (sequence numbers, the unacked queue, filters, expiry), acks and credit received |
//! | `incoming.rs` | data frames admitted against the peer's window, runs, the push to the delivery queues |
//! | `acks.rs` | the ack policy: when an ack is owed, what it carries, when it counts as written |
//! | `journal.rs` | the journal's view of the peer's stream: progress recorded and durable, the restore at start |
//! | `incarnation.rs` | the handshake's counts, binding an incarnation, resuming on a handshake, forgetting |
//! | `probes.rs` | the housekeeping tick: credit probes, round-trip probes, block warnings |

use std::collections::VecDeque;
use std::time::Instant;

use super::endpoint::{Config, Produced};
use super::link::{Link, LinkId};
use super::recovery::Descriptor;
use crate::addr::Addr;
use crate::journal::Record;
use crate::peer::{Counters, Ledger, Outgoing, PeerShared, PeerState};
use crate::sync::{Arc, SharedStr};

mod acks;
mod incarnation;
mod incoming;
mod journal;
mod outgoing;
mod probes;

pub(crate) use incarnation::Unestablished;
pub(crate) use incoming::Inflow;

/// A member's protocol state (see the module doc).
pub(crate) struct Remote {
    pub(crate) shared: Arc<PeerShared>,
    pub(crate) addr: Option<Addr>,
    pub(crate) state: PeerState,
    /// The link that speaks for this peer: our dial in progress, or a link that identified
    /// as this peer (handshaking or established).
    pub(crate) link: Option<LinkId>,
    pub(crate) desc: Descriptor,
    /// Consecutive failed attempts (backoff exponent).
    pub(crate) attempt: u32,
    /// Reconnect timers carry this; bumping it cancels them.
    pub(crate) gen: u64,
    /// The application was told it is connected (`Event::Connected`) and not yet that it
    /// is not.
    pub(crate) up: bool,
    /// Admitted at run time (an unknown member that dialled in): forgotten after
    /// `forget_after` disconnected.
    pub(crate) dynamic: bool,
    /// Taken from the shared outbox, not yet published (the socket buffer was full).
    pending: VecDeque<Outgoing>,
    /// Window bytes published and not yet credited back by the peer.
    ledger: Ledger,
    /// An ack timer is armed.
    pub(crate) ack_timer: bool,
    /// The received count of an ack encoded but not yet written out: the descriptor's
    /// `acks_sent` advances only once the bytes have left (a link that breaks first loses
    /// the ack, and it is owed again).
    ack_unwritten: Option<u64>,
    /// A duplicate arrived: ack even if nothing new is owed.
    ack_forced: bool,
    /// Largest payload the peer accepts (from its handshake).
    peer_max_message: usize,
    /// A reply larger than the peer accepts was turned into a status (warned once).
    warned_reply_too_large: bool,
    /// The peer's send window (from its handshake): what it may have received here and not
    /// yet credited back, enforced.
    peer_window: u64,
    /// When an ack (or a handshake's count) last moved `desc.acked()` forward: a
    /// handshake answer made before then may be older than what the peer has acknowledged
    /// since (see [`Link::asked_at`]).
    acked_at: Option<Instant>,
    /// When we last sent a credit probe.
    last_probe: Option<Instant>,
    /// A probe sent to measure the round trip, on that link at that instant, and not yet
    /// answered.
    rtt_probe: Option<(LinkId, Instant)>,
    /// When we last sent a round-trip probe.
    rtt_probed: Option<Instant>,
    /// The blocked episode we last warned about.
    warned_episode: u64,
    /// Journal: (messages delivered, credit) recorded for the peer's stream, and the part
    /// known to be on disk (what acks may carry).
    recorded: (u64, u64),
    /// Journal: window bytes of the peer's unreliable messages recorded as handled.
    recorded_unreliable: u64,
    pub(crate) durable: (u64, u64),
    /// The epoch of the peer's stream: deliveries carry it, so that credit and progress of
    /// a stream that has since restarted are not mistaken for the new one's.
    pub(crate) epoch: u32,
    /// Journal: the stream was restored after a restart with more bytes than the window
    /// could be charged for: credit for the excess finds nothing outstanding, and is
    /// clamped quietly.
    restored: bool,
    /// Journal: the last sequence number restored from the journal at start (`None`: not
    /// restored). Only a restored stream may find its peer ahead of it.
    restored_upto: Option<u64>,
    /// Incarnations (launch ids) of the peer that a newer one replaced, newest last, at most
    /// [`REPLACED_KEPT`]: a process of the name that was replaced is never taken back (it
    /// is a second process claiming the name, or an old one still running), so the name
    /// cannot flip between two live processes. Kept in memory only.
    replaced: VecDeque<u64>,
    /// The incarnation last found in a name conflict with this peer (a claimant of its
    /// name we refused, or ours when the peer refused us for our name): repeats are logged
    /// quietly until a handshake completes.
    pub(crate) last_conflict: Option<u64>,
}

impl Remote {
    /// A peer not yet met, not connected (`Backoff`), dialled at `addr` if it has one.
    pub(crate) fn new(shared: Arc<PeerShared>, addr: Option<Addr>) -> Remote {
        Remote {
            shared,
            addr,
            state: PeerState::Backoff,
            link: None,
            desc: Descriptor::new(),
            attempt: 0,
            gen: 0,
            up: false,
            dynamic: false,
            pending: VecDeque::new(),
            ledger: Ledger::default(),
            ack_timer: false,
            ack_unwritten: None,
            ack_forced: false,
            peer_max_message: usize::MAX,
            warned_reply_too_large: false,
            peer_window: 0,
            acked_at: None,
            last_probe: None,
            rtt_probe: None,
            rtt_probed: None,
            warned_episode: 0,
            recorded: (0, 0),
            recorded_unreliable: 0,
            durable: (0, 0),
            epoch: 0,
            restored: false,
            restored_upto: None,
            replaced: VecDeque::new(),
            last_conflict: None,
        }
    }

    /// The member's name.
    pub(crate) fn name(&self) -> &SharedStr {
        &self.shared.name
    }

    /// Moves to `next` if the lifecycle allows it (see [`PeerState::can_become`]).
    pub(crate) fn set_state(&mut self, next: PeerState) {
        if self.state == next {
            return;
        }
        debug_assert!(
            self.state.can_become(next),
            "illegal peer transition {:?} -> {:?} for '{}'",
            self.state,
            next,
            self.shared.name
        );
        if !self.state.can_become(next) {
            log::error!(
                "peer '{}': illegal transition {} -> {} ignored",
                self.shared.name,
                self.state,
                next
            );
            return;
        }
        self.state = next;
        self.shared.set_state(next);
    }

    fn journalled(&self) -> bool {
        self.shared.progress.is_some()
    }

    /// Whether anything is queued or pending for publication.
    pub(crate) fn has_queued(&self) -> bool {
        !self.pending.is_empty() || !self.shared.outbox.is_empty()
    }

    /// Whether everything queued to the peer is published, written and acknowledged (on
    /// `link`, established).
    pub(crate) fn flushed(&self, link: &Link) -> bool {
        !self.owes_anything() && link.unwritten() == 0
    }

    /// Whether anything queued to the peer is not acknowledged yet, published or not.
    pub(crate) fn owes_anything(&self) -> bool {
        !self.pending.is_empty() || !self.shared.outbox.is_empty() || self.desc.unacked_len() > 0
    }

    /// Drops a state for the peer that never took part: the endpoint already holds one for
    /// its name. What was queued on it fails (reported through `out`, permits back), and its
    /// outbox and requests close, so a handle still holding it fails its sends. Returns how
    /// many messages failed.
    pub(crate) fn discard(mut self, cfg: &Config, out: &mut Produced) -> u64 {
        self.set_state(PeerState::Closed);
        let failed = self.fail_queued(cfg, out);
        self.shared.outbox.retire(&mut self.ledger);
        self.shared.requests.close();
        failed
    }

    /// The link that spoke for the peer is gone.
    pub(crate) fn link_lost(&mut self, cfg: &Config, was_established: bool) {
        self.link = None;
        self.ack_unwritten = None; // lost with the link: owed again
        if self.shared.credit.is_paused() {
            // Nothing left to resume; the next link pauses afresh if need be.
            self.shared.credit.unpause();
        }
        if was_established {
            Counters::add(&self.shared.counters.disconnects, 1);
            log::info!("{}: connection to '{}' lost", cfg.name, self.shared.name);
        }
    }

    /// Terminal transition: `Closed`, outbox closed and failed, permits back, unacked
    /// messages undelivered (with a journal and a shutdown, they stay journalled instead).
    /// `removed`: the member was removed (for good) rather than the node shutting down.
    pub(crate) fn retire(&mut self, cfg: &Config, out: &mut Produced, removed: bool) {
        self.set_state(PeerState::Closed);
        self.gen += 1;
        let failed = self.fail_queued(cfg, out);
        let mut unacked = self.desc.drain_unacked();
        self.shared.outbox.retire(&mut self.ledger);
        // Closed for good: requests waiting for its replies fail now, and no new ones go.
        self.shared.requests.close();
        let name = self.shared.name.clone();
        if cfg.journalled && !removed && !unacked.is_empty() {
            // Shutting down with a journal: they stay journalled and are resent after a
            // restart, so they are not undelivered.
            log::info!(
                "{}: {} unacknowledged messages to '{name}' stay in the journal",
                cfg.name,
                unacked.len()
            );
            unacked.clear();
        }
        let undelivered = unacked.len() as u64;
        if failed + undelivered > 0 {
            log::warn!(
                "{}: '{name}' closed ({}): {failed} queued messages failed, {undelivered} sent but unacknowledged",
                cfg.name,
                if removed { "removed" } else { "shutting down" }
            );
        }
        if removed && out.journal_open() {
            // Removed for good: its journalled messages are retired with it.
            out.records.push(Record::Bound {
                peer: name,
                launch: 0,
            });
        }
        self.undelivered(out, unacked);
    }
}
