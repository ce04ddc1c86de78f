//! The journal's view of the peer's stream: how far the application handled it and the
//! credit that may go back, as recorded and as durable (what acks may carry), and the
//! stream the journal recovered at start.

use super::Remote;
use crate::journal::{Record, RecoveredPeer};
use crate::proto::endpoint::{Config, Produced};
use crate::proto::recovery::{Descriptor, Unacked};

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
}
