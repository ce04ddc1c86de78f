//! The recovery descriptor: per (local member, remote member, remote launch id), the
//! counters of reliable messages and the queue of sent-but-unacknowledged ones.
//!
//! Only reliable data messages are counted. Acks, credit, probes, heartbeats and handshake
//! frames never touch these counters. Sequence numbers start at 1; a count of `n` means
//! "messages 1..=n".
//!
//! Invariants (checked by the property tests below):
//! `acked <= sent`, `acks_sent <= received`, every counter only grows, and the unacked queue
//! holds exactly the messages `acked+1 ..= sent`, in order.

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};

use crate::wire;

/// A published reliable message kept until the peer acknowledges it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unacked {
    /// Its sequence number (0 in a report of a message that failed before it was ever
    /// published: see `Output::Undelivered`).
    pub seq: u64,
    /// Data flags it was sent with.
    pub flags: u8,
    /// The bytes, kept for resend.
    pub payload: Bytes,
}

/// A published message waiting for the peer's ack, as the unacked queue holds it: one
/// message (published from the outbox one by one, or restored from a journal), or a run of
/// messages published together, kept as the numbered frames they went out in
/// (`Outbox::admit_framed`): one entry, one reference count and no per-message work for the
/// whole run.
#[derive(Clone, Debug)]
enum Held {
    One(Unacked),
    /// Messages `first .. first + count` (`count >= 1`): their frames, back to back.
    Run {
        first: u64,
        count: u64,
        frames: Bytes,
    },
}

impl Held {
    /// Its last sequence number.
    fn last(&self) -> u64 {
        match self {
            Held::One(u) => u.seq,
            Held::Run { first, count, .. } => first + count - 1,
        }
    }

    /// Appends its messages to `into`, in order (a run's payloads copied out of its frames:
    /// a rare path, and a payload the application keeps from a report then does not hold
    /// the buffer the run was written in).
    fn unpack(self, into: &mut Vec<Unacked>) {
        match self {
            Held::One(u) => into.push(u),
            Held::Run { first, frames, .. } => {
                into.extend(wire::numbered_frames(&frames).zip(first..).map(
                    |((flags, payload), seq)| Unacked {
                        seq,
                        flags,
                        payload: Bytes::copy_from_slice(&frames[payload]),
                    },
                ));
            }
        }
    }
}

/// The messages of `held`, one by one, in order.
fn unpack(held: VecDeque<Held>) -> Vec<Unacked> {
    let mut msgs = Vec::with_capacity(held.len());
    for h in held {
        h.unpack(&mut msgs);
    }
    msgs
}

/// A message to resend ([`Descriptor::resume`]): its number, flags and payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resend<'a> {
    /// Its sequence number.
    pub seq: u64,
    /// Data flags it was sent with.
    pub flags: u8,
    /// The bytes.
    pub payload: &'a [u8],
}

/// The unacked messages in order ([`Descriptor::resume`]).
#[derive(Debug)]
pub struct Resends<'a> {
    held: std::collections::vec_deque::Iter<'a, Held>,
    /// The run being gone through: its next number, its frames and where it is in them.
    run: Option<(u64, &'a Bytes, wire::NumberedFrames<'a>)>,
}

impl<'a> Iterator for Resends<'a> {
    type Item = Resend<'a>;

    fn next(&mut self) -> Option<Resend<'a>> {
        loop {
            if let Some((seq, frames, at)) = &mut self.run {
                if let Some((flags, payload)) = at.next() {
                    *seq += 1;
                    return Some(Resend {
                        seq: *seq - 1,
                        flags,
                        payload: &frames[payload],
                    });
                }
                self.run = None;
            }
            match self.held.next()? {
                Held::One(u) => {
                    return Some(Resend {
                        seq: u.seq,
                        flags: u.flags,
                        payload: &u.payload,
                    })
                }
                Held::Run { first, frames, .. } => {
                    self.run = Some((*first, frames, wire::numbered_frames(frames)));
                }
            }
        }
    }
}

/// What [`Descriptor::accept_frames`] admitted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Accepted {
    /// Messages.
    pub count: usize,
    /// Bytes of their frames, headers included: how far they reach into the buffer.
    pub frame_bytes: usize,
    /// Bytes of their payloads.
    pub payload_bytes: u64,
    /// Window bytes they cost.
    pub cost: u64,
}

/// What [`Descriptor::accept_data`] decided about an incoming reliable message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Receive {
    /// The next message in order: deliver it.
    Deliver,
    /// Already received (`seq <= received`): drop it, count it, still ack.
    Duplicate,
}

/// A violation of the recovery protocol by the peer; the connection is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoveryError {
    /// A reliable message skipped sequence numbers.
    Gap {
        /// The sequence number expected next.
        expected: u64,
        /// The one received.
        got: u64,
    },
    /// The peer acknowledged (or claims to have received) more than was ever sent to it.
    AckBeyondSent {
        /// The peer's claim.
        claimed: u64,
        /// What was sent.
        sent: u64,
    },
    /// The peer claims to have received fewer messages than it already acknowledged:
    /// it lost state without changing its launch id.
    AckWentBack {
        /// The peer's claim.
        claimed: u64,
        /// What it had acknowledged before.
        acked: u64,
    },
    /// The peer sent past its window: a message would make the window bytes received from
    /// it and not yet credited back exceed the window it declared. An honest sender never
    /// does (its window bounds what it has uncredited, and no credit is returned that it
    /// has not seen); this one ignores credit.
    WindowExceeded {
        /// Window bytes received and not yet credited back before the message.
        outstanding: u64,
        /// The message's window bytes.
        cost: u64,
        /// The peer's window.
        window: u64,
    },
}

impl std::fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecoveryError::Gap { expected, got } => {
                write!(f, "sequence gap: expected {expected}, got {got}")
            }
            RecoveryError::AckBeyondSent { claimed, sent } => {
                write!(
                    f,
                    "peer acknowledged {claimed} messages but only {sent} were sent"
                )
            }
            RecoveryError::AckWentBack { claimed, acked } => {
                write!(
                    f,
                    "peer claims {claimed} received after acknowledging {acked}"
                )
            }
            RecoveryError::WindowExceeded {
                outstanding,
                cost,
                window,
            } => write!(
                f,
                "peer ignores flow control: a message of {cost} window bytes on top of {outstanding} not yet credited exceeds its window of {window}"
            ),
        }
    }
}

impl std::error::Error for RecoveryError {}

/// Messages retired by an ack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retired {
    /// Messages removed from the unacked queue.
    pub messages: u64,
}

/// Counters and unacked queue for one remote incarnation. Owned by the IO thread.
#[derive(Debug, Default)]
pub struct Descriptor {
    remote_launch: Option<u64>,
    sent: u64,
    acked: u64,
    received: u64,
    acks_sent: u64,
    unacked: VecDeque<Held>,
    /// Buffers whose last run was acknowledged (nothing else holds them), to be handed
    /// back to the outbox ([`spent`](Descriptor::spent)).
    spent: Vec<BytesMut>,
    /// Receiver side: credit returned to the peer so far (cumulative, this incarnation).
    credit_returned: u64,
    /// Receiver side: window bytes of the messages received from this incarnation
    /// (reliable ones once, and unreliable ones; cumulative). Less `credit_returned`, what
    /// the peer may have outstanding: never more than its window.
    received_cost: u64,
    /// Sender side: the highest cumulative credit the peer has reported.
    credit_seen: u64,
    /// Connections established with this incarnation (each successful `resume`).
    connections: u64,
    /// Highest sequence number ever put on a connection to this incarnation: messages
    /// above it never left (published while disconnected, with a journal).
    written: u64,
    /// Window bytes of unreliable messages published to this incarnation (cumulative).
    unreliable_sent: u64,
    /// ... of which found lost (and given back) at reconnects.
    unreliable_lost: u64,
    /// Window bytes of unreliable messages received from this incarnation (cumulative).
    unreliable_received: u64,
}

impl Descriptor {
    /// A descriptor that has not yet met any incarnation of the peer.
    pub fn new() -> Descriptor {
        Descriptor::default()
    }

    /// A descriptor rebuilt from a journal after a restart: `sent` and `acked` of our
    /// stream with its unacknowledged messages (`acked+1 ..= sent`, in order), and
    /// `received` (what we recorded as delivered, all of it acknowledged at most) and
    /// `credit_returned` of the peer's stream, and `credit_seen`, the credit the peer had
    /// returned for ours, and `unreliable_received`, the window bytes of the peer's
    /// unreliable messages we recorded as handled. Per-connection counters start afresh.
    pub fn restore(
        remote_launch: Option<u64>,
        sent: u64,
        acked: u64,
        received: u64,
        credit: (u64, u64),
        unreliable_received: u64,
        unacked: Vec<Unacked>,
    ) -> Descriptor {
        let (credit_returned, credit_seen) = credit;
        debug_assert!(unacked.iter().zip(acked + 1..).all(|(u, seq)| u.seq == seq));
        debug_assert_eq!(acked + unacked.len() as u64, sent);
        Descriptor {
            remote_launch,
            sent,
            acked,
            received,
            acks_sent: received,
            unacked: unacked.into_iter().map(Held::One).collect(),
            credit_returned,
            // Nothing received in this process is outstanding yet.
            received_cost: credit_returned,
            credit_seen,
            unreliable_received,
            // Whether the previous process wrote them is unknown: assume it did.
            written: sent,
            ..Descriptor::default()
        }
    }

    /// Messages up to `seq` have been put on a connection.
    pub fn note_written(&mut self, seq: u64) {
        self.written = self.written.max(seq);
    }

    /// Highest sequence number ever put on a connection to this incarnation.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The peer incarnation these counters belong to.
    pub fn remote_launch(&self) -> Option<u64> {
        self.remote_launch
    }

    /// Binds the descriptor to the incarnation `launch_id`. If it belonged to another one,
    /// every counter restarts and the old incarnation's unacknowledged messages are returned:
    /// they were never acknowledged and must be reported as undelivered, never sent to the
    /// new incarnation.
    pub fn bind(&mut self, launch_id: u64) -> Vec<Unacked> {
        match self.remote_launch {
            Some(l) if l == launch_id => Vec::new(),
            None => {
                self.remote_launch = Some(launch_id);
                Vec::new()
            }
            Some(_) => {
                let old = unpack(std::mem::take(&mut self.unacked));
                *self = Descriptor {
                    remote_launch: Some(launch_id),
                    ..Descriptor::default()
                };
                old
            }
        }
    }

    /// Starts afresh with the same incarnation: the peer lost its state for us without
    /// restarting (it removed us and added us again). Every counter restarts and the
    /// unacknowledged messages are returned (undelivered), as for a new incarnation.
    pub fn reset(&mut self) -> Vec<Unacked> {
        let launch = self.remote_launch;
        let old = unpack(std::mem::take(&mut self.unacked));
        *self = Descriptor {
            remote_launch: launch,
            ..Descriptor::default()
        };
        old
    }

    /// Reliable messages received in order from the peer (the count sent in handshakes and
    /// acks). Zero for an incarnation not met yet.
    pub fn received_from(&self, launch_id: u64) -> u64 {
        if self.remote_launch == Some(launch_id) {
            self.received
        } else {
            0
        }
    }

    /// Highest sequence number published.
    pub fn sent(&self) -> u64 {
        self.sent
    }
    /// Highest sequence number the peer acknowledged.
    pub fn acked(&self) -> u64 {
        self.acked
    }
    /// Highest sequence number received in order.
    pub fn received(&self) -> u64 {
        self.received
    }
    /// The received count last put in an ack.
    pub fn acks_sent(&self) -> u64 {
        self.acks_sent
    }
    /// Messages waiting for an ack.
    pub fn unacked_len(&self) -> usize {
        // The queue holds exactly `acked + 1 ..= sent`.
        (self.sent - self.acked) as usize
    }
    /// The sequence number the next reliable message [published](Descriptor::publish) gets.
    #[inline]
    pub fn next_seq(&self) -> u64 {
        self.sent + 1
    }

    /// Publishes a reliable message: assigns its sequence number
    /// ([`next_seq`](Descriptor::next_seq)) and keeps it for resend. Returns the number.
    // Inlined: once per message on the IO thread, and small.
    #[inline]
    pub fn publish(&mut self, flags: u8, payload: Bytes) -> u64 {
        self.sent += 1;
        self.unacked.push_back(Held::One(Unacked {
            seq: self.sent,
            flags,
            payload,
        }));
        self.sent
    }

    /// Publishes a run of `count` reliable messages: `frames`, their data frames back to
    /// back, numbered from [`next_seq`](Descriptor::next_seq) (`wire::number_frames`), kept
    /// whole for resend. Returns the last number.
    pub fn publish_run(&mut self, count: u64, frames: Bytes) -> u64 {
        debug_assert!(count > 0);
        debug_assert_eq!(wire::numbered_frames(&frames).count() as u64, count);
        let first = self.sent + 1;
        self.sent += count;
        self.unacked.push_back(Held::Run {
            first,
            count,
            frames,
        });
        self.sent
    }

    /// Buffers every run written in which was acknowledged since they were last taken
    /// (`Outbox::recycle` reuses them and clears this).
    pub fn spent(&mut self) -> &mut Vec<BytesMut> {
        &mut self.spent
    }

    /// Our stream jumps to `to`: the peer holds more of it than we do (our journal lost its
    /// tail in a machine crash). Messages up to `kept` were journalled before the crash and
    /// the peer has them: they are retired. Later ones were numbered after the restart and
    /// collide with what the peer already holds: they are taken out and returned, to be
    /// published again after `to`. Everything up to `to` then counts as sent and
    /// acknowledged.
    pub fn fast_forward(&mut self, to: u64, kept: u64) -> Vec<Unacked> {
        if to <= self.sent {
            return Vec::new();
        }
        let mut fresh = unpack(std::mem::take(&mut self.unacked));
        fresh.retain(|m| m.seq > kept);
        self.sent = to;
        self.acked = to;
        fresh
    }

    /// Applies a cumulative ack: retires every message with `seq <= received`.
    pub fn on_ack(&mut self, received: u64) -> Result<Retired, RecoveryError> {
        if received > self.sent {
            return Err(RecoveryError::AckBeyondSent {
                claimed: received,
                sent: self.sent,
            });
        }
        if received <= self.acked {
            // An older ack overtaken by a newer one: nothing to do.
            return Ok(Retired::default());
        }
        // The queue is in sequence order: one search per ack finds where the retired ones
        // end, and they go in one drain (no check and pop per message).
        let n = self.unacked.partition_point(|h| h.last() <= received);
        for h in self.unacked.drain(..n) {
            if let Held::Run { frames, .. } = h {
                // The last run of its buffer: the buffer is free again.
                if let Ok(b) = frames.try_into_mut() {
                    self.spent.push(b);
                }
            }
        }
        if let Some(Held::Run {
            first,
            count,
            frames,
        }) = self.unacked.front_mut()
        {
            if *first <= received {
                // The ack ends inside a run: its acknowledged frames are let go of.
                let acked = received + 1 - *first;
                frames.advance(wire::numbered_frames_len(frames, acked));
                *first += acked;
                *count -= acked;
            }
        }
        let messages = received - self.acked;
        self.acked = received;
        Ok(Retired { messages })
    }

    /// Receiver side: admits a data message costing `cost` window bytes — reliable with
    /// sequence number `seq`, or unreliable (`None`) — from a peer whose window is
    /// `window`. A duplicate is reported (and costs nothing: it was charged when it first
    /// arrived); a gap, or a message past the window (see
    /// [`RecoveryError::WindowExceeded`]), is refused and changes nothing.
    pub fn accept_data(
        &mut self,
        seq: Option<u64>,
        cost: u64,
        window: u64,
    ) -> Result<Receive, RecoveryError> {
        if let Some(seq) = seq {
            if seq <= self.received {
                return Ok(Receive::Duplicate);
            }
            if seq != self.received + 1 {
                return Err(RecoveryError::Gap {
                    expected: self.received + 1,
                    got: seq,
                });
            }
        }
        let outstanding = self.outstanding_received();
        if outstanding.saturating_add(cost) > window {
            return Err(RecoveryError::WindowExceeded {
                outstanding,
                cost,
                window,
            });
        }
        self.received_cost += cost;
        match seq {
            Some(seq) => self.received = seq,
            None => self.unreliable_received += cost,
        }
        Ok(Receive::Deliver)
    }

    /// Receiver side: admits the regular data frames at the front of `frames` (each that
    /// [`wire::peek_regular`] finds under `max`) from a peer whose window is `window`, as
    /// [`accept_data`](Descriptor::accept_data) admits each, in one pass: no per-message
    /// call, the counters updated once. Stops before the first frame that is not the next
    /// reliable message (a duplicate or a gap) or would take the peer past `window` — for
    /// the caller to take on its own, with `accept_data`, which reports it — or that is not
    /// a complete regular frame, and after the first that brings the frames' cost past
    /// `limit`.
    // Inlined: its loop is the receiving IO thread's whole per-message work.
    #[inline]
    pub fn accept_frames(
        &mut self,
        frames: &[u8],
        max: usize,
        window: u64,
        limit: u64,
    ) -> Accepted {
        let room = window.saturating_sub(self.outstanding_received());
        let mut next = self.received + 1;
        let (mut a, mut unreliable) = (Accepted::default(), 0u64);
        while let Some(r) = wire::peek_regular(&frames[a.frame_bytes..], max) {
            let cost = crate::flow::cost(r.total - r.header);
            if a.cost + cost > room {
                break;
            }
            match r.seq {
                Some(seq) if seq != next => break,
                Some(_) => next += 1,
                None => unreliable += cost,
            }
            a.count += 1;
            a.frame_bytes += r.total;
            a.payload_bytes += (r.total - r.header) as u64;
            a.cost += cost;
            if a.cost > limit {
                break;
            }
        }
        self.received = next - 1;
        self.received_cost += a.cost;
        self.unreliable_received += unreliable;
        a
    }

    /// Receiver side: window bytes received from this incarnation and not yet credited
    /// back (at most the peer's window).
    pub fn outstanding_received(&self) -> u64 {
        self.received_cost.saturating_sub(self.credit_returned)
    }

    /// Whether any received message is not yet acknowledged.
    pub fn ack_owed(&self) -> bool {
        self.received > self.acks_sent
    }

    /// Records that an ack carrying `received` has been written to the connection.
    pub fn ack_written(&mut self, received: u64) {
        debug_assert!(received <= self.received);
        self.acks_sent = self.acks_sent.max(received);
    }

    /// Handshake: the peer says it has received `peer_received` of our messages. Retires
    /// those and returns the rest, in order, to be resent before any new message.
    pub fn resume(&mut self, peer_received: u64) -> Result<Resends<'_>, RecoveryError> {
        if peer_received < self.acked {
            return Err(RecoveryError::AckWentBack {
                claimed: peer_received,
                acked: self.acked,
            });
        }
        self.on_ack(peer_received)?;
        self.connections += 1;
        Ok(Resends {
            held: self.unacked.iter(),
            run: None,
        })
    }

    /// Connections established with incarnation `launch_id` so far (zero if the descriptor
    /// belongs to another one). Exchanged in the handshake, it tells a redial after a
    /// half-open connection from a simultaneous dial (see
    /// [`crate::proto::handshake::resolve`]).
    pub fn connections_with(&self, launch_id: u64) -> u64 {
        if self.remote_launch == Some(launch_id) {
            self.connections
        } else {
            0
        }
    }

    /// Receiver side: adds `bytes` of newly consumed credit and returns the cumulative total
    /// to put in the next ack. Acks carry totals, not deltas, so an ack lost with a broken
    /// connection loses no credit: the next one carries it.
    pub fn return_credit(&mut self, bytes: u64) -> u64 {
        self.credit_returned += bytes;
        self.credit_returned
    }

    /// Receiver side: the cumulative credit returned so far.
    pub fn credit_returned(&self) -> u64 {
        self.credit_returned
    }

    /// Sender side: the highest cumulative credit the peer has reported.
    pub fn credit_seen(&self) -> u64 {
        self.credit_seen
    }

    /// Sender side: the peer reports `total` credit returned so far; returns the new part
    /// (zero for a stale or repeated report).
    pub fn on_credit(&mut self, total: u64) -> u64 {
        let delta = total.saturating_sub(self.credit_seen);
        self.credit_seen = self.credit_seen.max(total);
        delta
    }

    /// An unreliable message costing `cost` window bytes was published (no sequence number,
    /// no resend).
    pub fn publish_unreliable(&mut self, cost: u64) {
        self.unreliable_sent += cost;
    }

    /// Window bytes of unreliable messages received from this incarnation.
    #[cfg(any(test, cohort_internals))]
    pub fn unreliable_received(&self) -> u64 {
        self.unreliable_received
    }

    /// Window bytes of unreliable messages received from incarnation `launch_id` (zero if the
    /// descriptor belongs to another one), sent in the handshake.
    pub fn unreliable_received_from(&self, launch_id: u64) -> u64 {
        if self.remote_launch == Some(launch_id) {
            self.unreliable_received
        } else {
            0
        }
    }

    /// Handshake: the peer has received `peer_unreliable` window bytes of our unreliable
    /// messages. What we published beyond that died with a broken connection (unreliable
    /// messages are never resent): returns its window bytes, not returned before, so their
    /// permits can go back.
    pub fn unreliable_lost(&mut self, peer_unreliable: u64) -> u64 {
        let lost = self
            .unreliable_sent
            .saturating_sub(peer_unreliable)
            .saturating_sub(self.unreliable_lost);
        self.unreliable_lost += lost;
        lost
    }

    /// Takes every unacknowledged message out (the peer was removed or the node stopped).
    pub fn drain_unacked(&mut self) -> Vec<Unacked> {
        unpack(std::mem::take(&mut self.unacked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn publish_n(d: &mut Descriptor, n: u64) {
        for i in 0..n {
            d.publish(crate::wire::FLAG_RELIABLE, Bytes::from(vec![i as u8; 3]));
        }
    }

    /// `payloads` encoded by their sender into `buf` and published as one run, as
    /// `Outbox::admit_framed` and `Remote::publish` do; odd-length payloads out of band.
    fn publish_run(d: &mut Descriptor, buf: &mut BytesMut, payloads: &[&[u8]]) -> u64 {
        for p in payloads {
            let flags = if p.len() % 2 == 1 { wire::FLAG_OOB } else { 0 };
            wire::encode_unnumbered(buf, flags, p);
        }
        let mut frames = buf.split();
        assert_eq!(
            wire::number_frames(&mut frames, d.next_seq()),
            payloads.len() as u64
        );
        d.publish_run(payloads.len() as u64, frames.freeze())
    }

    fn resent(d: &mut Descriptor, peer_received: u64) -> Vec<(u64, u8, Vec<u8>)> {
        d.resume(peer_received)
            .unwrap()
            .map(|r| (r.seq, r.flags, r.payload.to_vec()))
            .collect()
    }

    /// A run is retired in part by an ack that ends inside it, and what is resent is
    /// exactly what comes after, each message with its own number, flags and bytes, in
    /// order with the messages published one by one around it.
    #[test]
    fn runs_retire_in_part_and_resend_from_where_the_ack_ended() {
        let mut d = Descriptor::new();
        d.bind(1);
        publish_n(&mut d, 1); // 1
        let mut buf = BytesMut::with_capacity(1024);
        let last = publish_run(&mut d, &mut buf, &[b"ab", b"c", b"de", b"fgh", b"ij"]); // 2..=6
        assert_eq!(last, 6);
        publish_n(&mut d, 1); // 7
        assert_eq!(d.unacked_len(), 7);
        assert_eq!(d.on_ack(3).unwrap(), Retired { messages: 3 });
        assert_eq!(d.unacked_len(), 4);
        let r = wire::FLAG_RELIABLE;
        let o = wire::FLAG_OOB | r;
        let want = vec![
            (4, r, b"de".to_vec()),
            (5, o, b"fgh".to_vec()),
            (6, r, b"ij".to_vec()),
            (7, r, vec![0, 0, 0]),
        ];
        assert_eq!(resent(&mut d, 3), want);
        // A handshake that says more was received retires more, inside the run again.
        assert_eq!(resent(&mut d, 5), want[2..].to_vec());
        assert_eq!(d.on_ack(7).unwrap(), Retired { messages: 2 });
        assert_eq!(d.unacked_len(), 0);
        assert_eq!(resent(&mut d, 7), vec![]);
    }

    /// A new incarnation, a reset, a removal and a fast-forward take a run apart into the
    /// messages it holds (what is reported undelivered, or published again), in order.
    #[test]
    fn runs_come_out_as_their_messages() {
        let fill = |d: &mut Descriptor| {
            let mut buf = BytesMut::with_capacity(64);
            publish_n(d, 1);
            publish_run(d, &mut buf, &[b"one", b"two!", b"three"]);
            publish_n(d, 1);
        };
        let seqs = |v: &[Unacked]| v.iter().map(|u| u.seq).collect::<Vec<_>>();
        let mut d = Descriptor::new();
        d.bind(1);
        fill(&mut d);
        d.on_ack(2).unwrap();
        let old = d.bind(2);
        assert_eq!(seqs(&old), vec![3, 4, 5]);
        assert_eq!(&old[0].payload[..], b"two!");
        assert_eq!(old[0].flags, wire::FLAG_RELIABLE);
        assert_eq!(&old[1].payload[..], b"three");
        assert_eq!(old[1].flags, wire::FLAG_RELIABLE | wire::FLAG_OOB);
        fill(&mut d);
        assert_eq!(seqs(&d.reset()), vec![1, 2, 3, 4, 5]);
        fill(&mut d);
        assert_eq!(seqs(&d.drain_unacked()), vec![1, 2, 3, 4, 5]);
        let mut d = Descriptor::new();
        d.bind(1);
        fill(&mut d);
        let fresh = d.fast_forward(9, 2);
        assert_eq!(seqs(&fresh), vec![3, 4, 5]);
        assert_eq!(&fresh[0].payload[..], b"two!");
        assert_eq!(d.unacked_len(), 0);
    }

    /// A buffer whose runs have all been acknowledged comes back to be written again (and
    /// not before: a run still unacknowledged holds it).
    #[test]
    fn the_last_run_of_a_buffer_hands_the_buffer_back() {
        let mut d = Descriptor::new();
        d.bind(1);
        let mut buf = BytesMut::with_capacity(4096);
        publish_run(&mut d, &mut buf, &[b"aa", b"bb"]); // 1..=2
        publish_run(&mut d, &mut buf, &[b"cc"]); // 3
        drop(buf); // the sender moved on to another buffer
        d.on_ack(2).unwrap();
        assert!(d.spent().is_empty(), "run 3 still holds the buffer");
        d.on_ack(3).unwrap();
        let spent = std::mem::take(d.spent());
        assert_eq!(spent.len(), 1);
        let mut b = spent.into_iter().next().unwrap();
        b.clear();
        b.reserve(4096);
        assert!(b.capacity() >= 4096);
    }

    #[test]
    fn ack_retires_in_order() {
        let mut d = Descriptor::new();
        d.bind(1);
        publish_n(&mut d, 5);
        assert_eq!(d.on_ack(3).unwrap(), Retired { messages: 3 });
        assert_eq!(d.unacked_len(), 2);
        assert_eq!(
            d.on_ack(2).unwrap(),
            Retired::default(),
            "stale ack is a no-op"
        );
        assert!(d.on_ack(6).is_err());
        let rest: Vec<u64> = d.resume(4).unwrap().map(|u| u.seq).collect();
        assert_eq!(rest, vec![5]);
        assert!(matches!(
            d.resume(2),
            Err(RecoveryError::AckWentBack { .. })
        ));
    }

    #[test]
    fn unreliable_losses_are_counted_once() {
        let mut d = Descriptor::new();
        d.publish_unreliable(100);
        d.publish_unreliable(50);
        assert_eq!(
            d.unreliable_lost(100),
            50,
            "the peer got the first one only"
        );
        assert_eq!(d.unreliable_lost(100), 0, "not given back twice");
        d.publish_unreliable(30);
        assert_eq!(d.unreliable_lost(130), 0, "the peer got the new one");
        d.publish_unreliable(20);
        assert_eq!(d.unreliable_lost(130), 20, "lost with the next connection");
    }

    #[test]
    fn credit_totals_survive_a_lost_ack() {
        let (mut rx, mut tx) = (Descriptor::new(), Descriptor::new());
        let first = rx.return_credit(100); // this ack is lost with its connection
        let second = rx.return_credit(50);
        assert_eq!((first, second), (100, 150));
        assert_eq!(
            tx.on_credit(second),
            150,
            "the later total carries the lost credit"
        );
        assert_eq!(tx.on_credit(first), 0, "a stale total gives nothing");
        assert_eq!(tx.on_credit(second), 0, "a repeated total gives nothing");
        tx.bind(1);
        tx.bind(2);
        assert_eq!(tx.on_credit(10), 10, "a new incarnation starts from zero");
    }

    #[test]
    fn a_peer_is_held_to_its_window() {
        let mut d = Descriptor::new();
        d.bind(7);
        // Window 100: 60 + 40 fit; one more byte does not, and changes nothing.
        assert_eq!(d.accept_data(Some(1), 60, 100), Ok(Receive::Deliver));
        assert_eq!(d.accept_data(None, 40, 100), Ok(Receive::Deliver));
        assert_eq!(
            d.accept_data(Some(2), 1, 100),
            Err(RecoveryError::WindowExceeded {
                outstanding: 100,
                cost: 1,
                window: 100
            })
        );
        assert_eq!((d.received(), d.unreliable_received()), (1, 40));
        // A duplicate costs nothing (it was charged when it first came); credit returned
        // makes room again.
        assert_eq!(d.accept_data(Some(1), 60, 100), Ok(Receive::Duplicate));
        d.return_credit(60);
        assert_eq!(d.outstanding_received(), 40);
        assert_eq!(d.accept_data(Some(2), 60, 100), Ok(Receive::Deliver));
        // A gap is refused before the window is looked at.
        assert!(matches!(
            d.accept_data(Some(9), 1, 1000),
            Err(RecoveryError::Gap { expected: 3, .. })
        ));
        // A new incarnation starts with nothing outstanding.
        d.bind(8);
        assert_eq!(d.outstanding_received(), 0);
        // A restored stream: nothing received in this process is outstanding.
        let r = Descriptor::restore(Some(8), 0, 0, 5, (500, 0), 0, Vec::new());
        assert_eq!(r.outstanding_received(), 0);
    }

    #[test]
    fn duplicates_and_gaps() {
        let mut d = Descriptor::new();
        assert_eq!(d.accept_data(Some(1), 1, 100).unwrap(), Receive::Deliver);
        assert_eq!(d.accept_data(Some(1), 1, 100).unwrap(), Receive::Duplicate);
        assert!(matches!(
            d.accept_data(Some(3), 1, 100),
            Err(RecoveryError::Gap {
                expected: 2,
                got: 3
            })
        ));
        assert_eq!(d.accept_data(Some(2), 1, 100).unwrap(), Receive::Deliver);
        assert!(d.ack_owed());
        d.ack_written(2);
        assert!(!d.ack_owed());
    }

    #[test]
    fn new_incarnation_returns_old_unacked_and_resets() {
        let mut d = Descriptor::new();
        assert!(d.bind(1).is_empty());
        publish_n(&mut d, 3);
        let _ = d.accept_data(Some(1), 1, 100).unwrap();
        assert!(d.bind(1).is_empty(), "same incarnation keeps state");
        let old = d.bind(2);
        assert_eq!(old.iter().map(|u| u.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!((d.sent(), d.received(), d.unacked_len()), (0, 0, 0));
        assert_eq!(d.received_from(1), 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Publish(u8),
        PublishRun(Vec<u8>),
        Ack(u64),
        Data(u64),
        AckWritten,
        Resume(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u8..50).prop_map(Op::Publish),
            proptest::collection::vec(0u8..20, 1..6).prop_map(Op::PublishRun),
            (0u64..40).prop_map(Op::Ack),
            (0u64..40).prop_map(Op::Data),
            Just(Op::AckWritten),
            (0u64..40).prop_map(Op::Resume),
        ]
    }

    proptest! {
        /// Counters never go backwards, acked <= sent, acks_sent <= received, and the unacked
        /// queue is exactly acked+1..=sent whatever the peer sends.
        #[test]
        fn counters_are_monotonic(ops in proptest::collection::vec(op(), 0..200)) {
            let mut d = Descriptor::new();
            d.bind(7);
            let (mut s, mut a, mut r, mut k) = (0, 0, 0, 0);
            for o in ops {
                match o {
                    Op::Publish(n) => { d.publish(0, Bytes::from(vec![0; n as usize])); }
                    Op::PublishRun(lens) => {
                        let payloads: Vec<Vec<u8>> = lens.iter().map(|&n| vec![n; n as usize]).collect();
                        let refs: Vec<&[u8]> = payloads.iter().map(|p| &p[..]).collect();
                        publish_run(&mut d, &mut BytesMut::new(), &refs);
                    }
                    Op::Ack(x) => { let _ = d.on_ack(x); }
                    Op::Data(x) => { let _ = d.accept_data(Some(x), 1, u64::MAX); }
                    Op::AckWritten => { let rc = d.received(); d.ack_written(rc); }
                    Op::Resume(x) => { let _ = d.resume(x).map(|it| it.count()); }
                }
                prop_assert!(d.sent() >= s && d.acked() >= a && d.received() >= r && d.acks_sent() >= k);
                s = d.sent(); a = d.acked(); r = d.received(); k = d.acks_sent();
                prop_assert!(a <= s);
                prop_assert!(k <= r);
                let seqs: Vec<u64> = unpack(d.unacked.clone()).iter().map(|u| u.seq).collect();
                let want: Vec<u64> = (a + 1..=s).collect();
                prop_assert_eq!(&seqs, &want);
                prop_assert_eq!(d.unacked_len(), want.len());
                // What a handshake would resend: the same messages, in order.
                let resend: Vec<u64> = Resends { held: d.unacked.iter(), run: None }.map(|r| r.seq).collect();
                prop_assert_eq!(resend, want);
            }
        }
    }

    /// A frame for [`accept_frames_admits_as_accept_data_does`]: a reliable message with
    /// this sequence number and payload length, or an unreliable one, or bytes that are not
    /// a regular frame (an out-of-band message).
    #[derive(Debug, Clone)]
    enum In {
        Reliable(u64, u8),
        Unreliable(u8),
        Oob(u8),
    }

    fn frame_in() -> impl Strategy<Value = In> {
        prop_oneof![
            8 => (1u64..12, 0u8..60).prop_map(|(s, n)| In::Reliable(s, n)),
            2 => (0u8..60).prop_map(In::Unreliable),
            1 => (0u8..60).prop_map(In::Oob),
        ]
    }

    proptest! {
        /// `accept_frames` admits exactly the frames that `accept_data`, called on each in
        /// turn, delivers — up to the first it would not (a duplicate, a gap, past the
        /// window), the first that is not a regular frame, the first over `max`, or just
        /// after the cost passes `limit` — and leaves the descriptor as those calls do;
        /// whatever it stops at, `accept_data` then reports as it would have.
        #[test]
        fn accept_frames_admits_as_accept_data_does(
            ins in proptest::collection::vec(frame_in(), 0..24),
            received in 0u64..4,
            returned in 0u64..200,
            window in 0u64..1500,
            // Any, or exactly the cost of the first few frames.
            limit in prop_oneof![Just(None), Just(Some(u64::MAX)), (0u64..1500).prop_map(Some)],
            limit_at in 0usize..6,
            max in prop_oneof![Just(usize::MAX), 20usize..80],
            cut in 0usize..8,
        ) {
            let mut buf = Vec::new();
            let mut ends = Vec::new();
            for i in &ins {
                match *i {
                    In::Reliable(s, n) => wire::encode_data(&mut buf, wire::FLAG_RELIABLE, Some(s), &vec![1; n as usize]),
                    In::Unreliable(n) => wire::encode_data(&mut buf, 0, None, &vec![2; n as usize]),
                    In::Oob(n) => wire::encode_data(&mut buf, wire::FLAG_OOB, None, &vec![3; n as usize]),
                }
                ends.push(buf.len());
            }
            // The last frame may be incomplete.
            buf.truncate(buf.len().saturating_sub(cut));
            let limit = limit.unwrap_or_else(|| {
                ins.iter()
                    .take(limit_at)
                    .map(|i| match *i {
                        In::Reliable(_, n) | In::Unreliable(n) | In::Oob(n) => crate::flow::cost(n as usize),
                    })
                    .sum::<u64>()
            });
            let base = || {
                let mut d = Descriptor::new();
                d.bind(1);
                for s in 1..=received {
                    assert_eq!(d.accept_data(Some(s), 100, u64::MAX), Ok(Receive::Deliver));
                }
                d.credit_returned = returned.min(d.received_cost);
                d
            };
            let mut batch = base();
            let got = batch.accept_frames(&buf, max, window, limit);
            // One by one (a refused or duplicate message changes nothing).
            let mut one = base();
            let mut want = Accepted::default();
            let mut start = 0;
            for (i, &end) in ins.iter().zip(&ends) {
                if end > buf.len() || end - start - 4 > max {
                    break;
                }
                let (seq, len) = match *i {
                    In::Reliable(s, n) => (Some(s), n as usize),
                    In::Unreliable(n) => (None, n as usize),
                    In::Oob(_) => break,
                };
                let cost = crate::flow::cost(len);
                if one.accept_data(seq, cost, window) != Ok(Receive::Deliver) {
                    break;
                }
                want.count += 1;
                want.frame_bytes = end;
                want.payload_bytes += len as u64;
                want.cost += cost;
                start = end;
                if want.cost > limit {
                    break;
                }
            }
            prop_assert_eq!(got, want);
            prop_assert_eq!(
                (batch.received, batch.received_cost, batch.unreliable_received),
                (one.received, one.received_cost, one.unreliable_received)
            );
        }
    }
}
