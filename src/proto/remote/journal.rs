//! The journal's view of the peer's stream: how far the application handled it and the
//! credit that may go back, as recorded and as durable (what acks may carry), and the
//! stream the journal recovered at start.

use super::{report_undelivered, Remote};
use crate::journal::{Record, RecoveredPeer};
use crate::peer::PeerShared;
use crate::proto::endpoint::{Config, Produced};
use crate::proto::recovery::{Descriptor, Unacked};

/// The journal's view of the peer's stream (all zero without a journal).
#[derive(Default)]
pub(crate) struct JournalView {
    /// (messages delivered, credit) recorded for the peer's stream.
    recorded: (u64, u64),
    /// Window bytes of the peer's unreliable messages recorded as handled.
    recorded_unreliable: u64,
    /// The part of `recorded` known to be on disk: what acks may carry.
    pub(super) durable: (u64, u64),
    /// The stream was restored after a restart with more bytes than the window could be
    /// charged for: credit for the excess finds nothing outstanding, and is clamped quietly.
    pub(super) restored: bool,
    /// The last sequence number restored from the journal at start (`None`: not restored).
    /// Only a restored stream may find its peer ahead of it.
    pub(super) restored_upto: Option<u64>,
}

impl JournalView {
    /// What the journal recorded of the peer's stream: (delivered, credit) and the window
    /// bytes of its unreliable messages handled.
    pub(crate) fn recorded(&self) -> ((u64, u64), u64) {
        (self.recorded, self.recorded_unreliable)
    }

    /// What we acknowledge of `received` messages of the peer's stream (`shared`: the
    /// peer's): every one — or, with a journal, only what the journal holds as delivered
    /// (acks and handshakes alike).
    pub(super) fn acknowledgeable(&self, shared: &PeerShared, received: u64) -> u64 {
        if shared.journalled() {
            received.min(self.durable.0)
        } else {
            received
        }
    }

    /// What the journal recorded is now durable: acks may carry it.
    pub(crate) fn made_durable(&mut self) {
        self.durable = self.recorded;
    }

    /// The peer's stream restarts from zero: nothing of it is recorded.
    pub(super) fn restart(&mut self) {
        self.recorded = (0, 0);
        self.recorded_unreliable = 0;
        self.durable = (0, 0);
    }
}

impl Remote {
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
        let j = &mut self.journal;
        if done <= j.recorded.0 && credit == 0 && unreliable <= j.recorded_unreliable {
            return;
        }
        j.recorded = (done.max(j.recorded.0), j.recorded.1 + credit);
        j.recorded_unreliable = j.recorded_unreliable.max(unreliable);
        if !out.journal_open() {
            return;
        }
        out.records.push(Record::Delivered {
            peer: self.shared.name.clone(),
            count: j.recorded.0,
            credit: j.recorded.1,
            unreliable: j.recorded_unreliable,
        });
        out.awaiting.push(self.shared.id);
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
        self.outbound.ledger.publish(permit);
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
        self.journal = JournalView {
            recorded: (r.delivered, r.credit),
            recorded_unreliable: r.unreliable,
            durable: (r.delivered, r.credit),
            restored: cost > charged,
            restored_upto: Some(sent),
        };
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
            report_undelivered(&self.shared, out, lost);
        }
    }
}
