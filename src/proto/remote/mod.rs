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
//! One file per concern, each an `impl Remote` block; the fields that belong to one concern
//! only are a type of that file:
//!
//! | file | concern |
//! |---|---|
//! | `mod.rs` | the state, its lifecycle (`set_state`, `link_lost`, `retire`, `discard`) |
//! | `outgoing.rs` | publishing (`number`: a sequence number and a journal record; filters, expiry), acks and credit received; the outgoing stream (`Outbound`: messages taken and not published, their sweep and failure, the ledger) |
//! | `incoming.rs` | data frames admitted against the peer's window, runs ([`Inflow`]); the run is cut and pushed to the delivery queues by [`Produced`] |
//! | `acks.rs` | the ack policy (`Acks`): when an ack is owed, what it carries, when it counts as written |
//! | `journal.rs` | the journal's view of the peer's stream (`JournalView`): progress recorded and durable (what acks may carry), the restore at start |
//! | `incarnation.rs` | the handshake's counts, binding an incarnation ([`Replaced`]), resuming on a handshake ([`Unestablished`]), forgetting |
//! | `probes.rs` | the housekeeping tick: credit probes, round-trip probes (`RoundTrip`), block warnings |

use std::time::Instant;

use super::endpoint::{Config, Output, Produced};
use super::link::LinkId;
use super::recovery::{Descriptor, Unacked};
use crate::addr::Addr;
use crate::journal::Record;
use crate::peer::{Counters, PeerShared, PeerState};
use crate::sync::{Arc, SharedStr};

mod acks;
mod incarnation;
mod incoming;
mod journal;
mod outgoing;
mod probes;

use acks::Acks;
use incarnation::Replaced;
pub(crate) use incarnation::Unestablished;
pub(crate) use incoming::Inflow;
use journal::JournalView;
use outgoing::Outbound;
use probes::RoundTrip;

/// One peer's protocol state across its links (see the module doc).
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
    /// The outgoing stream on this side: messages taken and not yet published, window
    /// bytes not yet credited back, the peer's limit.
    pub(crate) outbound: Outbound,
    /// The ack policy's state: a timer armed, an ack not yet written out, one forced.
    pub(crate) acks: Acks,
    /// The peer's send window (from its handshake): what it may have received here and not
    /// yet credited back, enforced.
    peer_window: u64,
    /// When an ack (or a handshake's count) last moved `desc.acked()` forward: a
    /// handshake answer made before then may be older than what the peer has acknowledged
    /// since (see [`Link::asked_at`](super::link::Link::asked_at)).
    acked_at: Option<Instant>,
    /// When we last sent a credit probe.
    last_probe: Option<Instant>,
    /// Round-trip measurement: the probe in flight, when the last one went.
    pub(crate) rtt: RoundTrip,
    /// The blocked episode we last warned about.
    warned_episode: u64,
    /// The journal's view of the peer's stream: progress recorded and durable, and what
    /// was restored at start.
    pub(crate) journal: JournalView,
    /// The epoch of the peer's stream: deliveries carry it, so that credit and progress of
    /// a stream that has since restarted are not mistaken for the new one's.
    pub(crate) epoch: u32,
    /// Incarnations of the peer that a newer one replaced: never taken back.
    pub(crate) replaced: Replaced,
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
            outbound: Outbound::default(),
            acks: Acks::default(),
            peer_window: 0,
            acked_at: None,
            last_probe: None,
            rtt: RoundTrip::default(),
            warned_episode: 0,
            journal: JournalView::default(),
            epoch: 0,
            replaced: Replaced::default(),
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

    /// Whether anything queued to the peer is not acknowledged yet, published or not.
    pub(crate) fn owes_anything(&self) -> bool {
        self.outbound.has_queued(&self.shared) || self.desc.unacked_len() > 0
    }

    /// Drops a state for the peer that never took part: the endpoint already holds one for
    /// its name. What was queued on it fails (reported through `out`, permits back), and its
    /// outbox and requests close, so a handle still holding it fails its sends. Returns how
    /// many messages failed.
    pub(crate) fn discard(mut self, cfg: &Config, out: &mut Produced) -> u64 {
        self.set_state(PeerState::Closed);
        let failed = self.outbound.fail_queued(&self.shared, cfg, out);
        self.shared.outbox.retire(&mut self.outbound.ledger);
        self.shared.requests.close();
        failed
    }

    /// The link that spoke for the peer is gone.
    pub(crate) fn link_lost(&mut self, cfg: &Config, was_established: bool) {
        self.link = None;
        self.acks.unwritten = None; // lost with the link: owed again
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
        let failed = self.outbound.fail_queued(&self.shared, cfg, out);
        let mut unacked = self.desc.drain_unacked();
        self.shared.outbox.retire(&mut self.outbound.ledger);
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
        report_undelivered(&self.shared, out, unacked);
    }
}

/// Reports messages to `shared`'s peer that will never be delivered (counted, and handed to
/// the application's hook through `out`).
fn report_undelivered(shared: &PeerShared, out: &mut Produced, msgs: Vec<Unacked>) {
    Counters::add(&shared.counters.undelivered, msgs.len() as u64);
    if !msgs.is_empty() {
        out.events.push_back(Output::Undelivered {
            peer: shared.name.clone(),
            messages: msgs,
        });
    }
}
