//! One member's protocol state across its connections: the recovery descriptor, what was
//! accepted and not yet published, the ledger of published bytes not yet credited, the ack
//! policy, receive credit, the journal's view of its stream, and its place in the
//! lifecycle. Sans-IO: it is handed the link that speaks for the member (or none), the time,
//! and a place for what it produces ([`Produced`]: journal records, pool tasks, events); it never
//! touches a socket, a clock or a thread. The [`Endpoint`](super::Endpoint) routes frames
//! and timers to it.
//!
//! Everything it shares with other threads goes through [`PeerShared`]: the outbox and send
//! window (application threads), receive credit and delivery progress (pool threads), the
//! counters (stats).

use crate::addr::Addr;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use bytes::{Buf, Bytes};

use super::endpoint::{Config, Output, Produced};
use super::link::Link;
use super::recovery::{Descriptor, Receive, RecoveryError, Unacked};
use super::PeerIdentity;
use crate::deliver::{Delivery, ReplyRoom, Task};
use crate::journal::{Record, RecoveredPeer};
use crate::peer::{Counters, Failure, Ledger, Outgoing, PeerInfo, PeerShared, PeerState, Return};
use crate::sync::atomic::Ordering;
use crate::sync::{Arc, SharedStr};
use crate::wire;

/// What reading a data frame leaves the link to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Inflow {
    /// Go on reading.
    Continue,
    /// Stop reading until the peer's held bytes are back within its receive window.
    Pause,
}

/// Why establishing a link failed.
#[derive(Debug)]
pub(crate) enum Unestablished {
    /// Another link speaks for the peer now.
    Superseded,
    /// The peer's counts went back, but they were made before acks we have taken since: it
    /// answered this handshake before it acknowledged more on another link, which it kept
    /// (dropping this one). Stale, not forgotten: the link is closed, nothing is reset.
    Outdated(String),
    /// Same incarnation, fewer of our messages than it acknowledged: it lost its state for
    /// us (removed and re-added us). Both sides start afresh.
    Forgotten(String),
    /// The peer's counts break the protocol.
    Violation(String),
}

/// What one publishing pass did, added to the shared counters once.
#[derive(Default)]
struct Tally {
    sent: u64,
    sent_bytes: u64,
    filtered: u64,
    filtered_bytes: u64,
    failed: u64,
    failed_bytes: u64,
    expired: u64,
    too_large: u64,
    /// Requests given up by their requester before they left (part of `filtered`).
    withdrawn: u64,
    /// Unreliable messages failed for want of a connection (journalling nodes).
    unconnected: u64,
}

/// A member's protocol state (see the module doc).
pub(crate) struct Peer {
    pub(crate) shared: Arc<PeerShared>,
    pub(crate) addr: Option<Addr>,
    pub(crate) state: PeerState,
    /// The link that speaks for this peer: our dial in progress, or a link that identified
    /// as this peer (handshaking or established).
    pub(crate) link: Option<super::LinkId>,
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
    rtt_probe: Option<(super::LinkId, Instant)>,
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

/// How many replaced incarnations a peer remembers.
const REPLACED_KEPT: usize = 8;

impl Peer {
    /// A peer not yet met, not connected (`Backoff`), dialled at `addr` if it has one.
    pub(crate) fn new(shared: Arc<PeerShared>, addr: Option<Addr>) -> Peer {
        Peer {
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

    /// What we acknowledge of the peer's stream: every message received — or, with a
    /// journal, only what the journal holds as delivered (acks and handshakes alike).
    pub(crate) fn acknowledgeable(&self) -> u64 {
        if self.journalled() {
            self.desc.received().min(self.durable.0)
        } else {
            self.desc.received()
        }
    }

    /// The received count the acks written so far cover (including one still in a write
    /// buffer).
    fn ack_covered(&self) -> u64 {
        self.ack_unwritten.unwrap_or(0).max(self.desc.acks_sent())
    }

    /// Whether an ack is owed that no ack written so far covers.
    pub(crate) fn ack_behind(&self) -> bool {
        self.desc.received() > self.ack_covered()
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

    // ---- publishing ---------------------------------------------------------------

    /// Publishes queued messages to `link` (established, or `None`) while its write buffer
    /// is below `high`. This is where a message gets its sequence number, enters the
    /// unacked queue and counts as sent — or is filtered, expires, or fails, giving its
    /// permits back.
    ///
    /// With a journal, reliable messages are published (journalled) even while the peer is
    /// disconnected, so that nothing `send` accepted depends on this process surviving; the
    /// handshake resends them. An unreliable message for a disconnected peer then fails at
    /// once (its permits back, counted `failed`): best effort finds no connection, and it
    /// must not hold back the reliable messages behind it from the journal. A message with
    /// a ttl stops the eager publishing until it is published to a connection or expires
    /// (`high == usize::MAX`, a sync, journals it anyway: from then on it no longer
    /// expires). Returns whether bytes were written to the link.
    pub(crate) fn publish(
        &mut self,
        cfg: &Config,
        out: &mut Produced,
        mut link: Option<&mut Link>,
        high: usize,
        now: Instant,
    ) -> bool {
        let journal = out.journal_open();
        if link.is_none() && !journal {
            return false;
        }
        if cfg.journalled && !journal {
            return false; // the journal failed: nothing is published unjournalled
        }
        let filter = cfg.outbound_filter.as_deref();
        let shared = &self.shared;
        let info = PeerInfo::new(&shared.name, self.desc.remote_launch(), self.state);
        let mut clock: Option<Instant> = None;
        let mut tally = Tally::default();
        // Accepted messages that will never be sent, for `on_undelivered`.
        let mut lost: Vec<Unacked> = Vec::new();
        // Clear before taking (`next_to_publish`): a send that pushes after this
        // reschedules the peer.
        while let Some(mut m) = shared
            .outbox
            .next_to_publish(&shared.scheduled, &mut self.pending)
        {
            let stop = match link.as_deref() {
                Some(l) => l.unwritten() >= high,
                // A message with a ttl waits for a connection (or its expiry, by the
                // tick) rather than be journalled, where it could no longer expire; the
                // ones behind it wait too, in order. A sync journals it all the same.
                None => m.deadline.is_some() && high != usize::MAX,
            };
            if stop {
                self.pending.push_front(m);
                // The socket is backed up: the writable event resumes this peer. Stay
                // marked scheduled so that senders do not wake the IO thread for
                // nothing on every message meanwhile.
                shared.scheduled.hold();
                break;
            }
            if m.is_reply() && !m.is_status() && m.payload.len() > self.peer_max_message {
                // Within its room but more than the requester takes in one frame (a
                // room its builder would not give): it learns why at once instead.
                let len = m.payload().len() as u64;
                let room = self.peer_max_message.saturating_sub(wire::REQUEST_ID_BYTES);
                if !std::mem::replace(&mut self.warned_reply_too_large, true) {
                    log::warn!(
                        "a reply of {len} bytes to '{}' is more than it accepts ({room} \
                         bytes, though its request reserved more); it is told the reply \
                         was too large (warned once for this peer)",
                        shared.name
                    );
                }
                let room = u32::try_from(room).unwrap_or(u32::MAX);
                m = m.into_status(wire::ReplyStatus::TooLarge { len, room });
            }
            let len = m.payload.len();
            let request = request_of(&m);
            if request.is_some_and(|id| !shared.requests.is_waiting(id)) {
                // Its requester gave it up (timed out, or dropped its handle) before it
                // left: withdrawn, never sent, so the peer never runs it.
                shared.outbox.give_back(Return::Withdrawn, m.into_permit());
                tally.withdrawn += 1;
                tally.filtered += 1;
                tally.filtered_bytes += len as u64;
                continue;
            }
            if link.is_none() && !m.is_reliable() {
                lost.push(unsent(shared, Return::Failed, m));
                tally.failed += 1;
                tally.failed_bytes += len as u64;
                tally.unconnected += 1;
                continue;
            }
            if let Some(deadline) = m.deadline {
                if *clock.get_or_insert(now) >= deadline {
                    lost.push(unsent(shared, Return::Expired, m));
                    tally.expired += 1;
                    tally.failed += 1;
                    tally.failed_bytes += len as u64;
                    continue;
                }
            }
            if len > self.peer_max_message {
                // Accepted before the peer's limit was known (the send checks it once
                // it is): its request, if it is one, fails now, not at its timeout.
                if let Some(id) = request {
                    let max = self
                        .peer_max_message
                        .saturating_sub(wire::REQUEST_HEADER_BYTES);
                    let len = m.payload().len();
                    shared.requests.fail(id, Failure::TooLarge { len, max });
                }
                lost.push(unsent(shared, Return::Failed, m));
                tally.failed += 1;
                tally.failed_bytes += len as u64;
                tally.too_large += 1;
                continue;
            }
            if let Some(f) = filter {
                let keep = catch_unwind(AssertUnwindSafe(|| f(&info, &m))).unwrap_or_else(|_| {
                    log::error!(
                        "outbound filter panicked; dropping the message to '{}'",
                        shared.name
                    );
                    false
                });
                if !keep {
                    shared.outbox.give_back(Return::Filtered, m.into_permit());
                    tally.filtered += 1;
                    tally.filtered_bytes += len as u64;
                    continue;
                }
            }
            let c = m.cost();
            let reliable = m.is_reliable();
            let Outgoing {
                payload,
                flags,
                permit,
                ..
            } = m;
            if reliable {
                if flags & wire::FLAG_REQUEST != 0 {
                    if let Some(id) = wire::request_id(&payload) {
                        shared.requests.mark_sent(id);
                    }
                }
                let u = self.desc.publish(flags, payload);
                if journal {
                    out.records.push(Record::Message {
                        peer: shared.name.clone(),
                        seq: u.seq,
                        flags: u.flags,
                        payload: u.payload.clone(),
                    });
                }
                if let Some(l) = link.as_deref_mut() {
                    wire::encode_data(&mut l.wbuf, u.flags, Some(u.seq), &u.payload);
                    let seq = u.seq;
                    self.desc.note_written(seq);
                }
            } else if let Some(l) = link.as_deref_mut() {
                self.desc.publish_unreliable(c);
                wire::encode_data(&mut l.wbuf, flags, None, &payload);
            }
            self.ledger.publish(permit);
            tally.sent += 1;
            tally.sent_bytes += len as u64;
        }
        let c = &shared.counters;
        let wrote = tally.sent > 0 && link.is_some();
        if tally.sent > 0 {
            Counters::add(&c.sent, tally.sent);
            Counters::add(&c.sent_bytes, tally.sent_bytes);
        }
        if tally.filtered > 0 {
            Counters::add(&c.filtered, tally.filtered);
            Counters::add(&c.filtered_bytes, tally.filtered_bytes);
        }
        if tally.failed > 0 {
            Counters::add(&c.failed, tally.failed);
            Counters::add(&c.failed_bytes, tally.failed_bytes);
            Counters::add(&c.expired, tally.expired);
        }
        if tally.unconnected > 0 {
            log::debug!(
                "{}: {} unreliable messages to '{}' failed: not connected",
                cfg.name,
                tally.unconnected,
                shared.name
            );
        }
        if tally.withdrawn > 0 {
            Counters::add(&c.withdrawn, tally.withdrawn);
            log::debug!(
                "{}: {} requests to '{}' withdrawn: given up before they left",
                cfg.name,
                tally.withdrawn,
                shared.name
            );
        }
        if tally.too_large > 0 {
            log::warn!(
                "{}: {} messages failed: larger than the {} bytes '{}' accepts",
                cfg.name,
                tally.too_large,
                self.peer_max_message,
                shared.name
            );
        }
        self.report_unsent(out, lost);
        self.note_unacked();
        wrote
    }

    /// Reports accepted messages that will never be sent (failed before publication:
    /// expired, too large for the peer, unreliable without a connection, or still queued
    /// when the peer was retired) to the application's hook through `out`. They are counted
    /// `failed` where they failed, not `undelivered` (never published).
    fn report_unsent(&self, out: &mut Produced, msgs: Vec<Unacked>) {
        if !msgs.is_empty() {
            out.events.push_back(Output::Undelivered {
                peer: self.shared.name.clone(),
                messages: msgs,
            });
        }
    }

    /// Updates the unacknowledged gauge the stats read.
    fn note_unacked(&self) {
        // Relaxed: a gauge for the stats, written by the IO thread only.
        self.shared
            .counters
            .unacked
            .store(self.desc.unacked_len() as u64, Ordering::Relaxed);
    }

    /// Sweeps the queue of a disconnected peer (for a connected one, both are checked at
    /// publish time): fails the messages whose ttl passed (reported to the application), and
    /// withdraws the requests their requesters gave up, so their permits come back before
    /// the peer does. Returns whether it looked (a message with a ttl was ever queued, or a
    /// request was given up since the last sweep).
    pub(crate) fn sweep_queued(&mut self, cfg: &Config, out: &mut Produced, now: Instant) -> bool {
        let withdrawals = self.shared.take_withdrawals();
        if !withdrawals && !self.shared.ttl_queued() {
            return false;
        }
        self.shared.outbox.take_into(&mut self.pending);
        let shared = &self.shared;
        let expired = |m: &Outgoing| m.deadline.is_some_and(|d| now >= d);
        let withdrawn = |m: &Outgoing| {
            withdrawals && request_of(m).is_some_and(|id| !shared.requests.is_waiting(id))
        };
        let (mut n, mut bytes, mut w, mut w_bytes) = (0u64, 0u64, 0u64, 0u64);
        let mut lost = Vec::new();
        if self.pending.iter().any(|m| expired(m) || withdrawn(m)) {
            let queued = std::mem::take(&mut self.pending);
            for m in queued {
                if withdrawn(&m) {
                    w += 1;
                    w_bytes += m.payload.len() as u64;
                    shared.outbox.give_back(Return::Withdrawn, m.into_permit());
                } else if expired(&m) {
                    n += 1;
                    bytes += m.payload.len() as u64;
                    lost.push(unsent(shared, Return::Expired, m));
                } else {
                    self.pending.push_back(m);
                }
            }
        }
        count_withdrawn(cfg, shared, w, w_bytes);
        if n > 0 {
            Counters::add(&shared.counters.expired, n);
            Counters::add(&shared.counters.failed, n);
            Counters::add(&shared.counters.failed_bytes, bytes);
            log::debug!(
                "{}: {n} messages to '{}' expired while queued",
                cfg.name,
                shared.name
            );
        }
        self.report_unsent(out, lost);
        true
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

    /// Fails every message not yet published, giving back its permits; they are reported
    /// to the application's hook through `out`. Returns how many. A request its requester
    /// gave up (timed out, or dropped its handle) is withdrawn instead, as at publish: its
    /// caller was told already, so it is neither failed nor reported.
    fn fail_queued(&mut self, cfg: &Config, out: &mut Produced) -> u64 {
        self.shared.outbox.take_into(&mut self.pending);
        let shared = &self.shared;
        let (mut w, mut w_bytes) = (0u64, 0u64);
        for m in std::mem::take(&mut self.pending) {
            if request_of(&m).is_some_and(|id| !shared.requests.is_waiting(id)) {
                w += 1;
                w_bytes += m.payload.len() as u64;
                shared.outbox.give_back(Return::Withdrawn, m.into_permit());
            } else {
                self.pending.push_back(m);
            }
        }
        count_withdrawn(cfg, shared, w, w_bytes);
        let queued = self.shared.outbox.fail_queued(&mut self.pending);
        let n = queued.len() as u64;
        let bytes: u64 = queued.iter().map(|m| m.payload.len() as u64).sum();
        let lost: Vec<Unacked> = queued
            .into_iter()
            .map(|m| Unacked {
                seq: 0,
                flags: m.flags,
                payload: m.payload,
            })
            .collect();
        Counters::add(&self.shared.counters.failed_bytes, bytes);
        Counters::add(&self.shared.counters.failed, n);
        self.report_unsent(out, lost);
        n
    }

    // ---- receiving ----------------------------------------------------------------

    /// A data frame on the peer's established link: admitted against the peer's window (a
    /// peer past it ignores credit: `Err`, the link is closed), then queued for delivery in
    /// `out`. Says whether to go on reading, or pause the link because the peer's held
    /// bytes, counting messages of a previous stream still being handled, exceed its
    /// receive window.
    pub(crate) fn on_data(
        &mut self,
        out: &mut Produced,
        flags: u8,
        seq: Option<u64>,
        mut payload: Bytes,
    ) -> Result<Inflow, RecoveryError> {
        let cost = crate::flow::frame_cost(flags, &payload);
        match self.desc.accept_data(seq, cost, self.peer_window)? {
            Receive::Deliver => {}
            Receive::Duplicate => {
                Counters::add(&self.shared.counters.duplicates, 1);
                // Still acked: the sender resent it because it lacks our ack.
                self.ack_forced = true;
                return Ok(Inflow::Continue);
            }
        }
        Counters::add(&self.shared.counters.received, 1);
        Counters::add(&self.shared.counters.received_bytes, payload.len() as u64);
        // The wire checked that a request or reply starts with its header.
        let (id, room) = if flags & (wire::FLAG_REQUEST | wire::FLAG_REPLY) != 0 {
            let id = wire::request_id(&payload).unwrap_or_default();
            let room = wire::request_room(&payload).unwrap_or_default();
            payload.advance(wire::tag_bytes(flags).min(payload.len()));
            (id, room)
        } else {
            (0, 0)
        };
        if flags & wire::FLAG_REPLY != 0 {
            // Straight to the request waiting for it, outside flow control: it took no
            // window of its own (its room came back when the replier sent it) and returns
            // no credit. A journalling receiver counts it handled now.
            if let (Some(p), Some(seq)) = (&self.shared.progress, seq) {
                p.complete(self.epoch, std::iter::once(seq));
            }
            // A status reply carries why the replier cannot answer instead of a payload
            // (the wire checked it).
            let reply = if flags & wire::FLAG_STATUS != 0 {
                let status =
                    wire::decode_reply_status(&payload).unwrap_or(wire::ReplyStatus::Other(0));
                Err(Failure::Refused(status))
            } else {
                Ok(payload)
            };
            if !self.shared.requests.answer(id, reply) {
                log::debug!(
                    "reply from '{}' to request {id} came after the request was given up",
                    self.shared.name
                );
            }
            return Ok(Inflow::Continue);
        }
        // What this sender makes us hold: the message, with a request's reply room, until
        // it is consumed.
        let held = self.shared.credit.received(cost);
        self.shared.counters.note_held(held);
        let request = (flags & wire::FLAG_REQUEST != 0)
            .then(|| Arc::new(ReplyRoom::new(id, u64::from(room))));
        if flags & wire::FLAG_OOB != 0 {
            out.oob_batch.push(
                Delivery::new(self.shared.name.clone(), payload, seq, true)
                    .in_epoch(self.epoch)
                    .with_request(request),
            );
        } else {
            // Named by the deliverer, on the pool thread: cloning the sender's name here and
            // dropping it there would bounce its refcount between cores on every message.
            out.batch.push(
                Delivery::unnamed(payload, seq)
                    .in_epoch(self.epoch)
                    .with_request(request)
                    .into(),
            );
        }
        Ok(if held > self.shared.credit.window() {
            Inflow::Pause
        } else {
            Inflow::Continue
        })
    }

    /// A regular data frame (no request, reply or out-of-band flag) whose payload lies at
    /// `start..start + len` of the link's read buffer: admitted as [`on_data`] admits it,
    /// and added to the turn's run (`out.run`) instead of split off the buffer, so a read's
    /// messages take its bytes once ([`cut_run`]). The held count is added to once per
    /// run, or when the run may cross the receive window: then a pause is decided on the
    /// count itself, as for a single message.
    ///
    /// [`on_data`]: Peer::on_data
    /// [`cut_run`]: Peer::cut_run
    pub(crate) fn on_run_data(
        &mut self,
        out: &mut Produced,
        seq: Option<u64>,
        start: usize,
        len: usize,
    ) -> Result<Inflow, RecoveryError> {
        let cost = crate::flow::cost(len);
        match self.desc.accept_data(seq, cost, self.peer_window)? {
            Receive::Deliver => {}
            Receive::Duplicate => {
                Counters::add(&self.shared.counters.duplicates, 1);
                // Still acked: the sender resent it because it lacks our ack.
                self.ack_forced = true;
                return Ok(Inflow::Continue);
            }
        }
        let run = &mut out.run;
        if run.frames.is_empty() && run.unflushed == 0 {
            run.epoch = self.epoch;
            run.held = self.shared.credit.held();
        }
        run.frames
            .push(crate::deliver::RunFrame { start, len, seq });
        run.bytes += len as u64;
        run.unflushed += cost;
        let window = self.shared.credit.window();
        if run.held + run.unflushed > window {
            run.held = self
                .shared
                .credit
                .received(std::mem::take(&mut run.unflushed));
            self.shared.counters.note_held(run.held);
            if run.held > window {
                return Ok(Inflow::Pause);
            }
        }
        Ok(Inflow::Continue)
    }

    /// Admits the regular messages that follow one another in `rbuf` (the link's read
    /// buffer, bound by `max` as the link's state says) from `*pending` on into the turn's
    /// run ([`on_run_data`]), moving `*pending` past each. Stops at the first frame that is
    /// not one (another kind, a request, reply or out-of-band message, or a malformed or
    /// incomplete frame: the caller splits it off on its own) with `Continue`, or after the
    /// message that took the peer past its receive window with `Pause`, or at a message
    /// the peer had no right to send (`Err`, not admitted).
    ///
    /// [`on_run_data`]: Peer::on_run_data
    pub(crate) fn admit_run(
        &mut self,
        out: &mut Produced,
        rbuf: &[u8],
        max: usize,
        pending: &mut usize,
    ) -> Result<Inflow, RecoveryError> {
        while let Ok(Some(wire::Peek::Data {
            flags,
            seq,
            header,
            total,
        })) = wire::peek_frame(&rbuf[*pending..], max)
        {
            if flags & (wire::FLAG_REQUEST | wire::FLAG_REPLY | wire::FLAG_OOB) != 0 {
                break;
            }
            let inflow = self.on_run_data(out, seq, *pending + header, total - header)?;
            *pending += total;
            if inflow == Inflow::Pause {
                return Ok(Inflow::Pause);
            }
        }
        Ok(Inflow::Continue)
    }

    /// Cuts the turn's run: its messages, found in `buf` (the front of the read buffer,
    /// just taken off), are counted received and held, and queued for this peer's one
    /// push at the end of the turn (after any message queued before them).
    pub(crate) fn cut_run(&self, out: &mut Produced, buf: Bytes) {
        let run = &mut out.run;
        if run.unflushed > 0 {
            run.held = self
                .shared
                .credit
                .received(std::mem::take(&mut run.unflushed));
            self.shared.counters.note_held(run.held);
        }
        if run.frames.is_empty() {
            return; // duplicates only
        }
        Counters::add(&self.shared.counters.received, run.frames.len() as u64);
        Counters::add(&self.shared.counters.received_bytes, run.bytes);
        run.bytes = 0;
        let n = run.frames.len();
        let frames = std::mem::replace(&mut run.frames, Vec::with_capacity(n));
        out.batch
            .push(crate::deliver::Run::new(buf, run.epoch, frames).into());
    }

    /// Hands the messages split from one read to this peer's queues: regular ones to its
    /// sender queue (one deliverer at a time), out-of-band ones to its OOB queue (at most
    /// its share of the pool's threads); the pool tasks to run them go to `out`.
    pub(crate) fn push_batch(&self, out: &mut Produced) {
        let (member, oob) = (&self.shared.member, &self.shared.oob);
        if !out.batch.is_empty() && member.push(out.batch.drain(..)) {
            out.tasks.push_back(Task::Member(member.clone()));
        }
        if !out.oob_batch.is_empty() {
            for _ in 0..oob.push(out.oob_batch.drain(..)) {
                out.tasks.push_back(Task::Oob(oob.clone()));
            }
        }
    }

    /// After data: an ack now if enough is owed (`Some(true)`: written to `link`), else
    /// returns whether a delayed ack must be armed.
    pub(crate) fn after_data(&mut self, cfg: &Config, out: &mut Produced, link: &mut Link) -> bool {
        self.attempt = 0; // the peer took the connection: backoff starts over
        if self.desc.received() - self.ack_covered() >= cfg.ack_threshold {
            self.ack(out, Some(link), false);
            // With a journal the ack covers only what the handler has done and the disk
            // holds: if that is not everything received, come back for the rest.
            return self.journalled() && self.ack_behind() && !self.ack_timer;
        }
        (self.desc.ack_owed() || self.ack_forced) && !self.ack_timer
    }

    /// Writes an ack carrying the received count and the credit that may go back, if one
    /// is owed (or always, with `force`: after a reconnect, in case the last one was lost
    /// with the old link). With a journal, the progress is recorded first and acknowledged
    /// only once on disk. Returns whether bytes were written to `link`.
    pub(crate) fn ack(&mut self, out: &mut Produced, link: Option<&mut Link>, force: bool) -> bool {
        self.record_progress(out);
        self.write_ack(link, force)
    }

    /// Writes an ack (cumulative received count and cumulative credit) to `link` if one is
    /// owed, or always with `force`. Returns whether it wrote one.
    pub(crate) fn write_ack(&mut self, link: Option<&mut Link>, force: bool) -> bool {
        let Some(link) = link.filter(|l| l.established) else {
            return false;
        };
        let journalled = self.journalled();
        // With a journal, only what the journal holds on disk: the messages recorded as
        // delivered and the credit recorded with them.
        let received = self.acknowledgeable();
        let force = force || std::mem::take(&mut self.ack_forced);
        let credit_owed = if journalled {
            self.durable.1.saturating_sub(self.desc.credit_returned())
        } else {
            self.shared.credit.pending()
        };
        if credit_owed == 0 && received <= self.ack_covered() && !force {
            return false;
        }
        let credit = if journalled {
            credit_owed
        } else {
            self.shared.credit.take()
        };
        let total = self.desc.return_credit(credit);
        wire::encode_ack(&mut link.wbuf, received, total);
        self.ack_unwritten = Some(received);
        true
    }

    /// Journals how far the application has handled the peer's stream and the credit that
    /// may go back to it; the ack carrying them is written once they are durable (the
    /// endpoint learns which peers wait from `out.awaiting`).
    pub(crate) fn record_progress(&mut self, out: &mut Produced) {
        let Some(progress) = &self.shared.progress else {
            return;
        };
        // The unreliable count is read before the credit is taken: the pool adds to the
        // credit first, so every unreliable byte recorded has its credit recorded too (a
        // restarted member tells the sender this count; credit for bytes beyond it would
        // never come, so the sender gives them back).
        let unreliable = progress.unreliable();
        let done = progress.done().min(self.desc.received());
        let credit = self.shared.credit.take();
        if done <= self.recorded.0 && credit == 0 && unreliable <= self.recorded_unreliable {
            return;
        }
        self.recorded = (done.max(self.recorded.0), self.recorded.1 + credit);
        self.recorded_unreliable = self.recorded_unreliable.max(unreliable);
        if !out.journal_open() {
            return;
        }
        out.records.push(Record::Delivered {
            peer: self.shared.name.clone(),
            count: self.recorded.0,
            credit: self.recorded.1,
            unreliable: self.recorded_unreliable,
        });
        out.awaiting.push(self.shared.id);
    }

    /// What the journal recorded of the peer's stream: (delivered, credit) and the window
    /// bytes of its unreliable messages handled.
    pub(crate) fn recorded(&self) -> ((u64, u64), u64) {
        (self.recorded, self.recorded_unreliable)
    }

    /// What the journal recorded is now durable: acks may carry it.
    pub(crate) fn progress_durable(&mut self) {
        self.durable = self.recorded;
    }

    /// The link's write buffer drained: every ack in it has left, and counts as sent.
    pub(crate) fn drained(&mut self) {
        if let Some(r) = self.ack_unwritten.take() {
            self.desc.ack_written(r);
        }
    }

    /// A Probe: answer with every byte of credit we hold, even below half a window (an ack
    /// takes all that is pending). No flush request is made for it: one left set when
    /// nothing was pending would swallow the pool's next request.
    /// The ack is written even when nothing is owed: the prober may be measuring the round
    /// trip (see [`Peer::rtt_probe`]).
    pub(crate) fn on_probe(&mut self, out: &mut Produced, link: &mut Link) -> bool {
        self.ack(out, Some(link), true)
    }

    /// Round-trip measurement: sends a probe on `link` at most once per heartbeat interval,
    /// and only while the peer owes this node nothing (every reliable message acknowledged,
    /// every window byte credited back). The peer answers every probe with an ack at once,
    /// and owes no other, so the next ack on this link is the answer, whatever the wire's
    /// frames carry: the time between them is one round trip (the two IO threads' turns
    /// included). No sample is taken while the peer owes acks or credit (a busy stream in
    /// this direction), nor within a heartbeat of the handshake or of a credit probe (acks
    /// of theirs may still be on the way); a probe without an answer is dropped after the
    /// idle timeout. The sample is exact only if the ack's one-way trip is shorter than a
    /// heartbeat.
    fn rtt_probe(&mut self, cfg: &Config, link: &mut Link, now: Instant) -> bool {
        if let Some((lid, at)) = self.rtt_probe {
            if lid == link.id && now.saturating_duration_since(at) < cfg.idle_timeout {
                return false;
            }
            self.rtt_probe = None;
        }
        let due = self
            .rtt_probed
            .is_none_or(|t| now.saturating_duration_since(t) >= cfg.heartbeat);
        let owed = self.desc.acked() < self.desc.sent() || self.ledger.uncredited() > 0;
        if !due || owed {
            return false;
        }
        wire::encode_probe(&mut link.wbuf);
        self.rtt_probe = Some((link.id, now));
        self.rtt_probed = Some(now);
        true
    }

    /// An ack arrived on `link` at `now`: the answer to a round-trip probe sent on it, if
    /// one waits.
    pub(crate) fn rtt_answer(&mut self, link: super::LinkId, now: Instant) {
        if let Some((lid, at)) = self.rtt_probe {
            if lid == link {
                self.rtt_probe = None;
                self.shared
                    .counters
                    .rtt
                    .sample(now.saturating_duration_since(at));
            }
        }
    }

    /// An ack from the peer: retires what it acknowledges, gives back the credit it returns
    /// (never more than is outstanding). `Err` if it acknowledges what was never sent.
    pub(crate) fn on_ack(
        &mut self,
        cfg: &Config,
        out: &mut Produced,
        received: u64,
        credit: u64,
        now: Instant,
    ) -> Result<(), RecoveryError> {
        self.attempt = 0; // the peer took the connection: backoff starts over
        let acked = self.desc.acked();
        self.desc.on_ack(received)?;
        if self.desc.acked() > acked {
            self.acked_at = Some(now);
            self.note_unacked();
        }
        let credit = self.desc.on_credit(credit);
        if (self.desc.acked() > acked || credit > 0) && out.journal_open() {
            out.records.push(Record::Acked {
                peer: self.shared.name.clone(),
                up_to: self.desc.acked(),
                credit: self.desc.credit_seen(),
            });
        }
        if credit > 0 {
            // Never give back more than was taken: credit beyond what is outstanding (a
            // confused or malicious peer, or credit from before its restart) is clamped.
            let outstanding = self.ledger.uncredited();
            let c = self.shared.outbox.credit(&mut self.ledger, credit);
            if c < credit && self.restored {
                log::debug!(
                    "{}: '{}' returned {credit} bytes of credit for messages from before our restart; {c} applied",
                    cfg.name,
                    self.shared.name,
                );
            } else if c < credit {
                log::warn!(
                    "{}: '{}' returned {credit} bytes of credit with only {outstanding} outstanding; clamped",
                    cfg.name,
                    self.shared.name,
                );
            }
        }
        Ok(())
    }

    // ---- the handshake and incarnations ---------------------------------------------

    /// Our counts for a handshake with the incarnation that identified (what `bind` keeps
    /// for it): received (no more than an ack may carry), connections established with it,
    /// unreliable bytes received from it.
    pub(crate) fn handshake_counts(&self) -> (u64, u64, u64) {
        (
            self.acknowledgeable(),
            self.desc.connections(),
            self.desc.unreliable_received(),
        )
    }

    /// The incarnation `launch` of this peer was replaced here by a newer one: whichever
    /// process has it now is not the one the name belongs to.
    pub(crate) fn was_replaced(&self, launch: u64) -> bool {
        self.replaced.contains(&launch)
    }

    /// Our counts for incarnation `launch`, computed without binding it (a dialler answering
    /// a Hello that proves nothing yet): ours if it is the incarnation we know, zeros
    /// otherwise.
    pub(crate) fn counts_for(&self, launch: u64) -> (u64, u64, u64) {
        let received = self.desc.received_from(launch);
        let received = if self.journalled() {
            received.min(self.durable.0)
        } else {
            received
        };
        (
            received,
            self.desc.connections_with(launch),
            self.desc.unreliable_received_from(launch),
        )
    }

    /// Binds the recovery descriptor to the incarnation that identified (and, with a
    /// secret, authenticated); a changed launch id retires the old one: its unacked
    /// messages are undelivered, but those that never left go to the new one, renumbered.
    pub(crate) fn bind(&mut self, cfg: &Config, out: &mut Produced, peer: &PeerIdentity) {
        // What the peer may send is its own window (enforced); what we hold for it, and
        // return credit in halves of, is the smaller of that and our receive window.
        self.peer_window = peer.window;
        self.shared
            .credit
            .set_window(peer.window.min(cfg.recv_window));
        self.peer_max_message = peer.max_message as usize;
        // Senders refuse a larger message from now on (kept while disconnected).
        self.shared.learn_max_message(self.peer_max_message);
        let replaced = self.desc.remote_launch().filter(|&l| l != peer.launch_id);
        let restarted = replaced.is_some();
        let first = self.desc.remote_launch().is_none();
        let written = self.desc.written();
        let mut old = self.desc.bind(peer.launch_id);
        if (first || restarted) && out.journal_open() {
            // The journal's counters for this peer belong to this incarnation from now on
            // (for a new one, they restart and its old messages are retired).
            out.records.push(Record::Bound {
                peer: peer.name.as_str().into(),
                launch: peer.launch_id,
            });
        }
        let Some(replaced) = replaced else {
            return;
        };
        if self.replaced.len() == REPLACED_KEPT {
            self.replaced.pop_front();
        }
        self.replaced.push_back(replaced);
        self.restart_stream();
        // Messages that never left (published while disconnected, with a journal) were
        // never the old incarnation's: they go to the new one, numbered afresh.
        let split = old.partition_point(|m| m.seq <= written);
        let mut unsent = old.split_off(split);
        // Replies among them answer the old incarnation's requests: nobody waits for them.
        unsent.retain(|m| m.flags & wire::FLAG_REPLY == 0);
        // Our requests the old incarnation will never answer fail now; those that never
        // left, or were not published yet, go to the new one and still wait.
        let still_sent: Vec<u64> = unsent
            .iter()
            .filter(|m| m.flags & wire::FLAG_REQUEST != 0)
            .filter_map(|m| wire::request_id(&m.payload))
            .collect();
        let failed = self
            .shared
            .requests
            .fail_sent_but(&still_sent, Failure::Restarted);
        if failed > 0 {
            log::warn!(
                "{}: {failed} requests to '{}' failed: it restarted before answering",
                cfg.name,
                peer.name
            );
        }
        log::warn!(
            "{}: '{}' restarted (new launch id); {} unacknowledged messages to its old incarnation are undelivered, {} never sent go to the new one",
            cfg.name,
            peer.name,
            old.len(),
            unsent.len()
        );
        // Credit for the old incarnation will never come: give it all back (but what the
        // unsent messages hold).
        let keep: u64 = unsent
            .iter()
            .map(|m| crate::flow::frame_cost(m.flags, &m.payload))
            .sum();
        let mut outstanding = self.ledger.retire();
        self.ledger.publish(outstanding.take(keep));
        self.shared.outbox.give_back(Return::Retired, outstanding);
        let journal = out.journal_open();
        for m in unsent {
            let u = self.desc.publish(m.flags, m.payload);
            if journal {
                out.records.push(Record::Message {
                    peer: self.shared.name.clone(),
                    seq: u.seq,
                    flags: u.flags,
                    payload: u.payload.clone(),
                });
            }
        }
        let (peer, launch, undelivered) = (self.shared.name.clone(), peer.launch_id, old.len());
        super::endpoint::emit(cfg, out, || crate::events::Event::NewIncarnation {
            peer: peer.to_string(),
            incarnation: launch,
            undelivered: undelivered as u64,
        });
        self.undelivered(out, old);
    }

    /// The peer's stream restarts from zero (new incarnation, or a reset): a new epoch
    /// begins, so messages of the old stream still being handled earn no credit (its window
    /// is not over-released by them) and, with a journal, late completions of the old
    /// stream do not move the new one's watermark.
    fn restart_stream(&mut self) {
        self.epoch = match &self.shared.progress {
            Some(progress) => progress.restart(0, 0),
            None => self.epoch.wrapping_add(1),
        };
        let _ = self.shared.credit.restart(self.epoch);
        self.recorded = (0, 0);
        self.recorded_unreliable = 0;
        self.durable = (0, 0);
    }

    /// Reports messages that will never be delivered (counted, and handed to the
    /// application's hook through `out`).
    fn undelivered(&self, out: &mut Produced, msgs: Vec<Unacked>) {
        Counters::add(&self.shared.counters.undelivered, msgs.len() as u64);
        if !msgs.is_empty() {
            out.events.push_back(Output::Undelivered {
                peer: self.shared.name.clone(),
                messages: msgs,
            });
        }
    }

    /// Retires everything of the current relationship (unacked messages are undelivered,
    /// their credit given back) while keeping what is queued: the peer lost its state for
    /// us without restarting.
    pub(crate) fn forget(&mut self, out: &mut Produced) {
        let old = self.desc.reset();
        if out.journal_open() {
            // Unbind (retiring the journalled stream), then bind afresh.
            let (peer, launch) = (self.shared.name.clone(), self.desc.remote_launch());
            out.records.push(Record::Bound {
                peer: peer.clone(),
                launch: 0,
            });
            if let Some(launch) = launch {
                out.records.push(Record::Bound { peer, launch });
            }
        }
        // Credit we owed the old stream is dropped with it.
        self.restart_stream();
        self.shared
            .outbox
            .give_back(Return::Retired, self.ledger.retire());
        self.undelivered(out, old);
    }

    /// The handshake completed on `link`, which speaks for this peer: resend what the peer
    /// lacks (`peer_received` of our messages; `peer_unreliable` window bytes of our
    /// unreliable ones), then an ack carrying whatever is owed. New messages are published
    /// after, by the caller.
    pub(crate) fn establish(
        &mut self,
        cfg: &Config,
        out: &mut Produced,
        link: &mut Link,
        peer_received: u64,
        peer_unreliable: u64,
        now: Instant,
    ) -> Result<(), Unestablished> {
        if self.link != Some(link.id) {
            return Err(Unestablished::Superseded);
        }
        link.hs = None;
        self.last_conflict = None;
        link.established = true;
        let mut resent = 0u64;
        let acked = self.desc.acked();
        if let Some(kept) = self
            .restored_upto
            .filter(|_| peer_received > self.desc.sent())
        {
            // The peer holds more of our stream than our journal: its tail was lost (a
            // machine crash under a lazy fsync policy, or a cut for corruption). Those
            // messages reached the peer; continue after them rather than refuse forever.
            log::warn!(
                "{}: '{}' holds {peer_received} of our messages, our journal only {}: its tail was lost; continuing at {}",
                cfg.name,
                self.shared.name,
                self.desc.sent(),
                peer_received + 1
            );
            let fresh = self.desc.fast_forward(peer_received, kept);
            let journal = out.journal_open();
            if journal {
                out.records.push(Record::Acked {
                    peer: self.shared.name.clone(),
                    up_to: peer_received,
                    credit: self.desc.credit_seen(),
                });
            }
            for m in fresh {
                let u = self.desc.publish(m.flags, m.payload);
                if journal {
                    out.records.push(Record::Message {
                        peer: self.shared.name.clone(),
                        seq: u.seq,
                        flags: u.flags,
                        payload: u.payload.clone(),
                    });
                }
            }
        }
        let mut oversized = None;
        let resumed = match self.desc.resume(peer_received) {
            Ok(rest) => {
                for u in rest {
                    if u.payload.len() > self.peer_max_message && oversized.is_none() {
                        oversized = Some((u.seq, u.payload.len()));
                    }
                    wire::encode_data(&mut link.wbuf, u.flags, Some(u.seq), &u.payload);
                    resent += 1;
                }
                Ok(())
            }
            Err(e) => Err(e),
        };
        match resumed {
            Ok(()) => {}
            Err(RecoveryError::AckWentBack { claimed, acked })
                if self.acked_at.is_some_and(|t| t >= link.asked_at) =>
            {
                return Err(Unestablished::Outdated(format!(
                    "'{}' answered this handshake holding {claimed} of our messages, before it acknowledged {acked} on another connection; dropping this one",
                    self.shared.name
                )));
            }
            Err(RecoveryError::AckWentBack { claimed, acked }) => {
                let why = format!(
                    "'{}' holds {claimed} of our messages after acknowledging {acked}: it lost its state for us (removed and re-added?); starting afresh",
                    self.shared.name
                );
                self.forget(out);
                return Err(Unestablished::Forgotten(why));
            }
            Err(e) => return Err(Unestablished::Violation(e.to_string())),
        }
        if let Some((seq, len)) = oversized {
            // Only a message journalled before this process knew the peer's limit can be
            // here; the peer will refuse it on every resend.
            log::error!(
                "{}: journalled message {seq} to '{}' has {len} bytes, more than the {} it accepts: it cannot be delivered; give every member the same max_message",
                cfg.name,
                self.shared.name,
                self.peer_max_message
            );
        }
        // Every unacked message is on this link now.
        let sent = self.desc.sent();
        self.desc.note_written(sent);
        if self.desc.acked() > acked {
            self.acked_at = Some(now);
        }
        if self.desc.acked() > acked && out.journal_open() {
            out.records.push(Record::Acked {
                peer: self.shared.name.clone(),
                up_to: self.desc.acked(),
                credit: self.desc.credit_seen(),
            });
        }
        // Unreliable messages the old link swallowed are never resent: their permits come
        // back now, from the peer's count of what it received. Never more than is
        // outstanding: a peer that restarted from its journal counts from zero again.
        let lost = self
            .ledger
            .forget(self.desc.unreliable_lost(peer_unreliable));
        if lost.bytes() > 0 {
            self.shared.outbox.give_back(Return::Lost, lost);
        }
        Counters::add(&self.shared.counters.resent, resent);
        Counters::add(&self.shared.counters.connects, 1);
        // The handshake's own acks (the dialler acks on Ready) may still be on their way:
        // the first round-trip probe waits a heartbeat, so none is taken for its answer.
        self.rtt_probe = None;
        self.rtt_probed = Some(now);
        // The backoff restarts only once the peer shows it took the connection (its first
        // ack or message), so a peer that refuses right after the handshake is not redialled
        // at the minimum backoff forever.
        self.gen += 1; // cancels a pending reconnect
        self.set_state(PeerState::Connected);
        log::info!(
            "{}: connected to '{}' ({} resent, {} unacked)",
            cfg.name,
            self.shared.name,
            resent,
            self.desc.unacked_len()
        );
        // Credit and acks from before the reconnect go first (the last ack may have been
        // lost with the old link; totals make resending it harmless).
        if self.shared.credit.pending() > 0
            || self.desc.ack_owed()
            || self.desc.credit_returned() > 0
        {
            self.record_progress(out);
            self.write_ack(Some(link), true);
        }
        // New messages follow once the handshake's last frame has left (the endpoint
        // publishes them next): its peer's deadline is running, and publishing can take
        // long (an outbound filter, a full journal batch).
        Ok(())
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

    /// Gives the peer the stream the journal recovered for it: sequence numbers continue,
    /// unacknowledged messages are resent at the next handshake, and how far we delivered
    /// its messages is what we tell it we received. The restored messages are charged to
    /// the window (as far as it has room), so what a member keeps for a peer stays bounded
    /// by the window however often it restarts.
    pub(crate) fn restore(&mut self, cfg: &Config, out: &mut Produced, r: RecoveredPeer) {
        let RecoveredPeer {
            unacked: messages,
            counters: r,
        } = r;
        let mut unacked: Vec<Unacked> = Vec::with_capacity(messages.len());
        let mut lost = Vec::new();
        for m in messages {
            let next = r.acked + unacked.len() as u64 + 1;
            let u = Unacked {
                seq: m.seq,
                flags: m.flags,
                payload: m.payload,
            };
            if m.seq == next && lost.is_empty() {
                unacked.push(u);
            } else {
                lost.push(u);
            }
        }
        let sent = r.acked + unacked.len() as u64;
        if sent < r.sent {
            log::error!(
                "{}: the journal lacks messages {}..={} to '{}' (cut by corruption); {} later ones cannot be resent in order and are undelivered",
                cfg.name,
                sent + 1,
                r.sent,
                self.shared.name,
                lost.len()
            );
        }
        let launch = (r.launch != 0).then_some(r.launch);
        // Uncredited: every journalled message the peer has not credited yet — the unacked
        // ones, and acked ones whose credit was still on its way.
        let unacked_cost: u64 = unacked
            .iter()
            .map(|u| crate::flow::frame_cost(u.flags, &u.payload))
            .sum();
        let cost = r.published.saturating_sub(r.credit_seen).max(unacked_cost);
        let permit = self.shared.outbox.window().take_up_to(cost);
        let charged = permit.bytes();
        self.ledger.publish(permit);
        self.desc = Descriptor::restore(
            launch,
            sent,
            r.acked,
            r.delivered,
            (r.credit, r.credit_seen),
            r.unreliable,
            unacked,
        );
        if let Some(progress) = &self.shared.progress {
            self.epoch = progress.restart(r.delivered, r.unreliable);
            let _ = self.shared.credit.restart(self.epoch);
        }
        self.recorded = (r.delivered, r.credit);
        self.recorded_unreliable = r.unreliable;
        self.durable = self.recorded;
        self.restored = cost > charged;
        self.restored_upto = Some(sent);
        if cost > charged {
            log::warn!(
                "{}: journal: the {} bytes of messages restored for '{}' exceed its free window ({} bytes charged)",
                cfg.name,
                cost,
                self.shared.name,
                charged
            );
        }
        log::info!(
            "{}: journal: '{}' resumes at seq {} ({} unacknowledged to resend), {} of its messages delivered",
            cfg.name,
            self.shared.name,
            sent + 1,
            self.desc.unacked_len(),
            r.delivered
        );
        if !lost.is_empty() {
            self.undelivered(out, lost);
        }
    }

    /// The housekeeping tick: a credit probe for senders parked on an empty window (once
    /// per probe interval), a warning per long block, residual credit once the sender's
    /// queue is idle, expiry of queued messages while disconnected. Returns whether bytes
    /// were written to `link`.
    pub(crate) fn tick(
        &mut self,
        cfg: &Config,
        out: &mut Produced,
        mut link: Option<&mut Link>,
        now: Instant,
    ) -> bool {
        let established = link.as_ref().is_some_and(|l| l.established);
        let mut wrote = false;
        let window = self.shared.outbox.window();
        if let Some((since, episode)) = window.blocked_since() {
            let blocked = now.saturating_duration_since(since);
            let probe_due = self
                .last_probe
                .is_none_or(|t| now.saturating_duration_since(t) >= cfg.probe_interval);
            if established && blocked >= cfg.probe_interval && probe_due {
                self.last_probe = Some(now);
                // Its answer may come after the credit it asks for: no round-trip probe
                // for a heartbeat, so that answer is never taken for one.
                self.rtt_probed = Some(now);
                Counters::add(&self.shared.counters.probes, 1);
                if let Some(l) = link.as_deref_mut() {
                    wire::encode_probe(&mut l.wbuf);
                    wrote = true;
                }
            }
            if blocked >= cfg.block_warning && self.warned_episode != episode {
                self.warned_episode = episode;
                log::warn!(
                    "{}: senders to '{}' blocked for {:.1?}: window {} bytes, {} in flight ({} unacknowledged messages), peer {}",
                    cfg.name,
                    self.shared.name,
                    blocked,
                    window.capacity(),
                    window.in_flight(),
                    self.desc.unacked_len(),
                    self.state
                );
            }
        }
        if established {
            if let Some(l) = link.as_deref_mut() {
                wrote |= self.rtt_probe(cfg, l, now);
            }
        }
        let residual = cfg.credit_on_idle
            && established
            && self.shared.credit.pending() > 0
            && !self.shared.member.is_running();
        if residual {
            wrote |= self.ack(out, link, false);
        } else if !established && self.sweep_queued(cfg, out, now) && cfg.journalled {
            // What waited behind an expired message is journalled now.
            self.publish(cfg, out, None, cfg.write_high_water, now);
        }
        wrote
    }
}

/// The id of `m` if it is a request.
fn request_of(m: &Outgoing) -> Option<u64> {
    if m.is_request() {
        wire::request_id(&m.payload)
    } else {
        None
    }
}

/// Gives the permits of `m`, which will never be sent, back to `shared`'s window (`why`),
/// and keeps what the application is told of it: an [`Unacked`] with no sequence number
/// (0: never published).
fn unsent(shared: &PeerShared, why: Return, m: Outgoing) -> Unacked {
    let Outgoing {
        payload,
        flags,
        permit,
        ..
    } = m;
    shared.outbox.give_back(why, permit);
    Unacked {
        seq: 0,
        flags,
        payload,
    }
}

/// Counts `n` requests (`bytes` of payload) withdrawn while queued: given up by their
/// requesters before they left, they count as filtered (the application decided).
fn count_withdrawn(cfg: &Config, shared: &PeerShared, n: u64, bytes: u64) {
    if n == 0 {
        return;
    }
    Counters::add(&shared.counters.filtered, n);
    Counters::add(&shared.counters.filtered_bytes, bytes);
    Counters::add(&shared.counters.withdrawn, n);
    log::debug!(
        "{}: {n} requests to '{}' withdrawn while queued: given up",
        cfg.name,
        shared.name
    );
}
