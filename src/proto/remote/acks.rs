//! The ack policy: what we acknowledge of the peer's stream, when an ack is owed (a
//! threshold, a delay, a duplicate, a probe), what it carries (the received count and the
//! credit that may go back), and when it counts as sent (once its bytes have left).

use super::Remote;
use crate::proto::endpoint::{Config, Produced};
use crate::proto::link::Link;
use crate::proto::recovery::Descriptor;
use crate::wire;

/// The ack policy's state (the counts themselves are the descriptor's).
#[derive(Default)]
pub(crate) struct Acks {
    /// An ack timer is armed.
    pub(crate) timer: bool,
    /// The received count of an ack encoded but not yet written out: the descriptor's
    /// `acks_sent` advances only once the bytes have left (a link that breaks first loses
    /// the ack, and it is owed again).
    pub(super) unwritten: Option<u64>,
    /// A duplicate arrived: ack even if nothing new is owed.
    pub(super) forced: bool,
}

impl Acks {
    /// The received count the acks written so far cover (including one still in a write
    /// buffer).
    fn covered(&self, desc: &Descriptor) -> u64 {
        self.unwritten.unwrap_or(0).max(desc.acks_sent())
    }

    /// Whether an ack is owed that no ack written so far covers.
    pub(crate) fn behind(&self, desc: &Descriptor) -> bool {
        desc.received() > self.covered(desc)
    }

    /// The link's write buffer drained: every ack in it has left, and counts as sent.
    pub(crate) fn written(&mut self, desc: &mut Descriptor) {
        if let Some(r) = self.unwritten.take() {
            desc.ack_written(r);
        }
    }
}

impl Remote {
    /// After data: an ack now if enough is owed (`Some(true)`: written to `link`), else
    /// returns whether a delayed ack must be armed.
    pub(crate) fn after_data(&mut self, cfg: &Config, out: &mut Produced, link: &mut Link) -> bool {
        self.attempt = 0; // the peer took the connection: backoff starts over
        if self.desc.received() - self.acks.covered(&self.desc) >= cfg.ack_threshold {
            self.ack(out, Some(link), false);
            // With a journal the ack covers only what the handler has done and the disk
            // holds: if that is not everything received, come back for the rest.
            return self.shared.journalled() && self.acks.behind(&self.desc) && !self.acks.timer;
        }
        (self.desc.ack_owed() || self.acks.forced) && !self.acks.timer
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
        let journalled = self.shared.journalled();
        // With a journal, only what the journal holds on disk: the messages recorded as
        // delivered and the credit recorded with them.
        let received = self
            .journal
            .acknowledgeable(&self.shared, self.desc.received());
        let force = force || std::mem::take(&mut self.acks.forced);
        let credit_owed = if journalled {
            self.journal
                .durable
                .1
                .saturating_sub(self.desc.credit_returned())
        } else {
            self.shared.credit.pending()
        };
        if credit_owed == 0 && received <= self.acks.covered(&self.desc) && !force {
            return false;
        }
        let credit = if journalled {
            credit_owed
        } else {
            self.shared.credit.take()
        };
        let total = self.desc.return_credit(credit);
        wire::encode_ack(link.out.tail(), received, total);
        self.acks.unwritten = Some(received);
        true
    }
}
