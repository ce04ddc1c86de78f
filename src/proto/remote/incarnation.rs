//! Incarnations and the handshake: our counts for a handshake, binding the recovery
//! descriptor to the incarnation that identified (a new one retires the old one's
//! messages), resuming on a completed handshake (resend what the peer lacks), and
//! forgetting a relationship the peer lost.

use std::collections::VecDeque;
use std::time::Instant;

use super::outgoing::number;
use super::{report_undelivered, Remote};
use crate::journal::Record;
use crate::peer::{Counters, Failure, PeerState, Return};
use crate::proto::endpoint::{Config, Produced};
use crate::proto::link::Link;
use crate::proto::recovery::RecoveryError;
use crate::proto::PeerIdentity;
use crate::wire;

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

/// How many replaced incarnations a peer remembers.
const REPLACED_KEPT: usize = 8;

/// Incarnations (launch ids) of the peer that a newer one replaced, newest last, at most
/// [`REPLACED_KEPT`]: a process of the name that was replaced is never taken back (it is a
/// second process claiming the name, or an old one still running), so the name cannot flip
/// between two live processes. Kept in memory only.
#[derive(Default)]
pub(crate) struct Replaced(VecDeque<u64>);

impl Replaced {
    /// The incarnation `launch` of this peer was replaced here by a newer one: whichever
    /// process has it now is not the one the name belongs to.
    pub(crate) fn contains(&self, launch: u64) -> bool {
        self.0.contains(&launch)
    }

    /// Incarnation `launch` was replaced by a newer one (the oldest remembered is
    /// forgotten if need be).
    fn remember(&mut self, launch: u64) {
        if self.0.len() == REPLACED_KEPT {
            self.0.pop_front();
        }
        self.0.push_back(launch);
    }
}

impl Remote {
    /// Our counts for a handshake with incarnation `launch`: received (no more than an ack
    /// may carry), connections established with it, unreliable bytes received from it —
    /// ours if it is the incarnation we know (after [`bind`](Remote::bind), the one that
    /// identified), zeros otherwise (a dialler answering a Hello that proves nothing yet
    /// computes them without binding).
    pub(crate) fn counts_for(&self, launch: u64) -> (u64, u64, u64) {
        (
            self.journal
                .acknowledgeable(&self.shared, self.desc.received_from(launch)),
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
        self.outbound.peer_max_message = peer.max_message as usize;
        // Senders refuse a larger message from now on (kept while disconnected).
        self.shared
            .learn_max_message(self.outbound.peer_max_message);
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
        self.replaced.remember(replaced);
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
        let mut outstanding = self.outbound.ledger.retire();
        self.outbound.ledger.publish(outstanding.take(keep));
        self.shared.outbox.give_back(Return::Retired, outstanding);
        for m in unsent {
            number(&mut self.desc, out, &self.shared.name, m.flags, m.payload);
        }
        let (peer, launch, lost) = (self.shared.name.clone(), peer.launch_id, old.len());
        crate::proto::endpoint::emit(cfg, out, || crate::events::Event::NewIncarnation {
            peer: peer.to_string(),
            incarnation: launch,
            undelivered: lost as u64,
        });
        report_undelivered(&self.shared, out, old);
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
        self.journal.restart();
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
            .give_back(Return::Retired, self.outbound.ledger.retire());
        report_undelivered(&self.shared, out, old);
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
            .journal
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
            if out.journal_open() {
                out.records.push(Record::Acked {
                    peer: self.shared.name.clone(),
                    up_to: peer_received,
                    credit: self.desc.credit_seen(),
                });
            }
            for m in fresh {
                number(&mut self.desc, out, &self.shared.name, m.flags, m.payload);
            }
        }
        let mut oversized = None;
        let resumed = match self.desc.resume(peer_received) {
            Ok(rest) => {
                for u in rest {
                    if u.payload.len() > self.outbound.peer_max_message && oversized.is_none() {
                        oversized = Some((u.seq, u.payload.len()));
                    }
                    wire::encode_data(link.out.tail(), u.flags, Some(u.seq), u.payload);
                    resent += 1;
                }
                Ok(())
            }
            Err(e) => Err(e),
        };
        if !self.desc.spent().is_empty() {
            // Runs the peer's count acknowledged: their buffers are free again.
            self.shared.outbox.recycle(self.desc.spent());
        }
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
                self.outbound.peer_max_message
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
            .outbound
            .ledger
            .forget(self.desc.unreliable_lost(peer_unreliable));
        if lost.bytes() > 0 {
            self.shared.outbox.give_back(Return::Lost, lost);
        }
        Counters::add(&self.shared.counters.resent, resent);
        Counters::add(&self.shared.counters.connects, 1);
        // The handshake's own acks (the dialler acks on Ready) may still be on their way:
        // the first round-trip probe waits a heartbeat, so none is taken for its answer.
        self.rtt.restart(now);
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
}
