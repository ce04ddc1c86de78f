//! Publishing: where a queued message gets its sequence number and enters the unacked
//! queue (or is filtered, expires, or fails, its permits back), the sweep of a disconnected
//! peer's queue, and the peer's acks and credit coming back.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use super::Remote;
use crate::journal::Record;
use crate::peer::{
    Counters, Failure, Framed, Ledger, Outgoing, PeerInfo, PeerShared, Queued, Return,
};
use crate::proto::endpoint::{Config, Output, Produced};
use crate::proto::link::Link;
use crate::proto::recovery::{Descriptor, RecoveryError, Unacked};
use crate::sync::atomic::Ordering;
use crate::sync::SharedStr;
use crate::wire;
use bytes::Bytes;

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

impl Tally {
    /// Adds the pass to `shared`'s counters and logs what failed (`max_message`: the
    /// largest payload the peer accepts).
    fn count(&self, cfg: &Config, shared: &PeerShared, max_message: usize) {
        let c = &shared.counters;
        if self.sent > 0 {
            Counters::add(&c.sent, self.sent);
            Counters::add(&c.sent_bytes, self.sent_bytes);
        }
        if self.filtered > 0 {
            Counters::add(&c.filtered, self.filtered);
            Counters::add(&c.filtered_bytes, self.filtered_bytes);
        }
        if self.failed > 0 {
            Counters::add(&c.failed, self.failed);
            Counters::add(&c.failed_bytes, self.failed_bytes);
            Counters::add(&c.expired, self.expired);
        }
        if self.unconnected > 0 {
            log::debug!(
                "{}: {} unreliable messages to '{}' failed: not connected",
                cfg.name,
                self.unconnected,
                shared.name
            );
        }
        if self.withdrawn > 0 {
            Counters::add(&c.withdrawn, self.withdrawn);
            log::debug!(
                "{}: {} requests to '{}' withdrawn: given up before they left",
                cfg.name,
                self.withdrawn,
                shared.name
            );
        }
        if self.too_large > 0 {
            log::warn!(
                "{}: {} messages failed: larger than the {} bytes '{}' accepts",
                cfg.name,
                self.too_large,
                max_message,
                shared.name
            );
        }
    }
}

impl Remote {
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
        // The sequence number of the last reliable message written to the link (0: none).
        let mut written = 0;
        // Clear before taking (`next_to_publish`): a send that pushes after this
        // reschedules the peer.
        while let Some(q) = shared
            .outbox
            .next_to_publish(&shared.scheduled, &mut self.outbound.pending)
        {
            let mut m = match q {
                Queued::One(m) => m,
                Queued::Framed(f) => {
                    match link.as_deref_mut() {
                        Some(l)
                            if f.largest() <= self.outbound.peer_max_message
                                && !out.journal_open() =>
                        {
                            if l.unwritten() >= high {
                                self.outbound.pending.push_front(Queued::Framed(f));
                                shared.scheduled.hold(); // as for one message, below
                                break;
                            }
                            let ledger = &mut self.outbound.ledger;
                            written = publish_framed(&mut self.desc, ledger, l, f, &mut tally);
                        }
                        // One by one, through the checks below: a message larger than the
                        // peer takes (its limit learnt after it was queued) fails alone,
                        // and a journal records each message (a journalling node does not
                        // frame at send; this keeps it right if one did).
                        _ => {
                            for m in f.into_messages().into_iter().rev() {
                                self.outbound.pending.push_front(Queued::One(m));
                            }
                        }
                    }
                    continue;
                }
            };
            let stop = match link.as_deref() {
                Some(l) => l.unwritten() >= high,
                // A message with a ttl waits for a connection (or its expiry, by the
                // tick) rather than be journalled, where it could no longer expire; the
                // ones behind it wait too, in order. A sync journals it all the same.
                None => m.deadline.is_some() && high != usize::MAX,
            };
            if stop {
                self.outbound.pending.push_front(Queued::One(m));
                // The socket is backed up: the writable event resumes this peer. Stay
                // marked scheduled so that senders do not wake the IO thread for
                // nothing on every message meanwhile.
                shared.scheduled.hold();
                break;
            }
            if m.is_reply() && !m.is_status() && m.payload.len() > self.outbound.peer_max_message {
                // Within its room but more than the requester takes in one frame (a
                // room its builder would not give): it learns why at once instead.
                let len = m.payload().len() as u64;
                let room = self
                    .outbound
                    .peer_max_message
                    .saturating_sub(wire::REQUEST_ID_BYTES);
                if !std::mem::replace(&mut self.outbound.warned_reply_too_large, true) {
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
            if len > self.outbound.peer_max_message {
                // Accepted before the peer's limit was known (the send checks it once
                // it is): its request, if it is one, fails now, not at its timeout.
                if let Some(id) = request {
                    let max = self
                        .outbound
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
            let (payload, flags, permit) = m.into_parts();
            if flags & wire::FLAG_RELIABLE != 0 {
                if flags & wire::FLAG_REQUEST != 0 {
                    if let Some(id) = wire::request_id(&payload) {
                        shared.requests.mark_sent(id);
                    }
                }
                if let Some(l) = link.as_deref_mut() {
                    // Encoded with the number it is about to get, while its payload is at
                    // hand (not read back from the unacked queue).
                    written = self.desc.next_seq();
                    l.out.push_data(flags, Some(written), &payload);
                }
                let seq = number(&mut self.desc, out, &shared.name, flags, payload);
                debug_assert!(link.is_none() || seq == written);
            } else if let Some(l) = link.as_deref_mut() {
                self.desc
                    .publish_unreliable(crate::flow::frame_cost(flags, &payload));
                l.out.push_data(flags, None, &payload);
            }
            self.outbound.ledger.publish(permit);
            tally.sent += 1;
            tally.sent_bytes += len as u64;
        }
        if written > 0 {
            // Numbered in order: the last one written is the highest.
            self.desc.note_written(written);
        }
        let wrote = tally.sent > 0 && link.is_some();
        tally.count(cfg, shared, self.outbound.peer_max_message);
        report_unsent(shared, out, lost);
        self.note_unacked();
        wrote
    }

    /// Updates the unacknowledged gauge the stats read.
    fn note_unacked(&self) {
        // Relaxed: a gauge for the stats, written by the IO thread only.
        self.shared
            .counters
            .unacked
            .store(self.desc.unacked_len() as u64, Ordering::Relaxed);
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
        if !self.desc.spent().is_empty() {
            self.shared.outbox.recycle(self.desc.spent());
        }
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
            let outstanding = self.outbound.ledger.uncredited();
            let c = self.shared.outbox.credit(&mut self.outbound.ledger, credit);
            if c < credit && self.journal.restored {
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
}

/// The outgoing stream on this side of the shared outbox: messages taken from it and not
/// yet published (the socket buffer was full, or a message waits for a connection), the
/// window bytes published and not yet credited back, and what the peer accepts.
pub(crate) struct Outbound {
    /// Taken from the shared outbox, not yet published (the socket buffer was full).
    pub(super) pending: VecDeque<Queued>,
    /// Window bytes published and not yet credited back by the peer.
    pub(super) ledger: Ledger,
    /// Largest payload the peer accepts (from its handshake).
    pub(super) peer_max_message: usize,
    /// A reply larger than the peer accepts was turned into a status (warned once).
    warned_reply_too_large: bool,
}

impl Default for Outbound {
    fn default() -> Outbound {
        Outbound {
            pending: VecDeque::new(),
            ledger: Ledger::default(),
            peer_max_message: usize::MAX,
            warned_reply_too_large: false,
        }
    }
}

impl Outbound {
    /// Whether anything is queued or pending for publication (`shared`: the peer's).
    pub(crate) fn has_queued(&self, shared: &PeerShared) -> bool {
        !self.pending.is_empty() || !shared.outbox.is_empty()
    }

    /// Sweeps the queue of a disconnected peer (for a connected one, both are checked at
    /// publish time): fails the messages whose ttl passed (reported to the application), and
    /// withdraws the requests their requesters gave up, so their permits come back before
    /// the peer does. Returns whether it looked (a message with a ttl was ever queued, or a
    /// request was given up since the last sweep).
    pub(super) fn sweep_queued(
        &mut self,
        shared: &PeerShared,
        cfg: &Config,
        out: &mut Produced,
        now: Instant,
    ) -> bool {
        let withdrawals = shared.take_withdrawals();
        if !withdrawals && !shared.ttl_queued() {
            return false;
        }
        shared.outbox.take_into(&mut self.pending);
        let expired = |m: &Outgoing| m.deadline.is_some_and(|d| now >= d);
        let withdrawn = |m: &Outgoing| {
            withdrawals && request_of(m).is_some_and(|id| !shared.requests.is_waiting(id))
        };
        // A run its senders encoded holds neither: no ttl, no request.
        let gone = |q: &Queued| matches!(q, Queued::One(m) if expired(m) || withdrawn(m));
        let (mut n, mut bytes, mut w, mut w_bytes) = (0u64, 0u64, 0u64, 0u64);
        let mut lost = Vec::new();
        if self.pending.iter().any(gone) {
            let queued = std::mem::take(&mut self.pending);
            for q in queued {
                match q {
                    Queued::One(m) if withdrawn(&m) => {
                        w += 1;
                        w_bytes += m.payload.len() as u64;
                        shared.outbox.give_back(Return::Withdrawn, m.into_permit());
                    }
                    Queued::One(m) if expired(&m) => {
                        n += 1;
                        bytes += m.payload.len() as u64;
                        lost.push(unsent(shared, Return::Expired, m));
                    }
                    q => self.pending.push_back(q),
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
        report_unsent(shared, out, lost);
        true
    }

    /// Fails every message not yet published, giving back its permits; they are reported
    /// to the application's hook through `out`. Returns how many. A request its requester
    /// gave up (timed out, or dropped its handle) is withdrawn instead, as at publish: its
    /// caller was told already, so it is neither failed nor reported.
    pub(super) fn fail_queued(
        &mut self,
        shared: &PeerShared,
        cfg: &Config,
        out: &mut Produced,
    ) -> u64 {
        shared.outbox.take_into(&mut self.pending);
        let (mut w, mut w_bytes) = (0u64, 0u64);
        for q in std::mem::take(&mut self.pending) {
            match q {
                Queued::One(m)
                    if request_of(&m).is_some_and(|id| !shared.requests.is_waiting(id)) =>
                {
                    w += 1;
                    w_bytes += m.payload.len() as u64;
                    shared.outbox.give_back(Return::Withdrawn, m.into_permit());
                }
                q => self.pending.push_back(q),
            }
        }
        count_withdrawn(cfg, shared, w, w_bytes);
        let queued = shared.outbox.fail_queued(&mut self.pending);
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
        Counters::add(&shared.counters.failed_bytes, bytes);
        Counters::add(&shared.counters.failed, n);
        report_unsent(shared, out, lost);
        n
    }
}

/// Publishes a run of messages their senders encoded ([`Framed`]) to `link`: numbers its
/// frames in place from the descriptor's next sequence number, queues them whole on the
/// link (a long run shared with the unacked queue, not copied), puts the run into the
/// unacked queue as one entry (its numbered frames, kept for resend) and its
/// permits into `ledger`, and counts them sent. Returns the last sequence number.
// Not inlined into `publish`: its loop is the whole per-message cost of a run.
#[inline(never)]
fn publish_framed(
    desc: &mut Descriptor,
    ledger: &mut Ledger,
    link: &mut Link,
    run: Framed,
    tally: &mut Tally,
) -> u64 {
    let (count, bytes) = (run.len(), run.payload_bytes());
    let (mut frames, permit) = run.into_frames();
    let first = desc.next_seq();
    let numbered = wire::number_frames(&mut frames, first);
    debug_assert_eq!(numbered, count);
    let frames = frames.freeze();
    link.out.push(&frames);
    desc.publish_run(count, frames);
    ledger.publish(permit);
    tally.sent += count;
    tally.sent_bytes += bytes;
    first + count - 1
}

/// The id of `m` if it is a request.
pub(super) fn request_of(m: &Outgoing) -> Option<u64> {
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

/// Gives a reliable message its sequence number (it joins the unacked queue until
/// acknowledged) and, while the journal is open, journals it: the one way a reliable message
/// to `peer` is numbered, whether published from the outbox, carried over to a new
/// incarnation ([`Remote::bind`]) or published after the journal's lost tail
/// ([`Remote::establish`]).
// Inlined: once per message on the IO thread (`Remote::publish`), and small.
#[inline]
pub(super) fn number(
    desc: &mut Descriptor,
    out: &mut Produced,
    peer: &SharedStr,
    flags: u8,
    payload: Bytes,
) -> u64 {
    if out.journal_open() {
        journal_message(out, peer, desc.next_seq(), flags, &payload);
    }
    desc.publish(flags, payload)
}

/// Journals message `seq` to `peer` ([`number`]'s part for a journalling node, kept out of
/// line so that `number` stays small enough to inline).
#[inline(never)]
fn journal_message(out: &mut Produced, peer: &SharedStr, seq: u64, flags: u8, payload: &Bytes) {
    out.records.push(Record::Message {
        peer: peer.clone(),
        seq,
        flags,
        payload: payload.clone(),
    });
}

/// Reports accepted messages to `shared`'s peer that will never be sent (failed before
/// publication: expired, too large for the peer, unreliable without a connection, or still
/// queued when the peer was retired) to the application's hook through `out`. They are
/// counted `failed` where they failed, not `undelivered` (never published).
fn report_unsent(shared: &PeerShared, out: &mut Produced, msgs: Vec<Unacked>) {
    if !msgs.is_empty() {
        out.events.push_back(Output::Undelivered {
            peer: shared.name.clone(),
            messages: msgs,
        });
    }
}
