//! The ack policy: what we acknowledge of the peer's stream, when an ack is owed (a
//! threshold, a delay, a duplicate, a probe), what it carries (the received count and the
//! credit that may go back), and when it counts as sent (once its bytes have left).

use super::Remote;
use crate::proto::endpoint::{Config, Produced};
use crate::proto::link::Link;
use crate::wire;

impl Remote {
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
    /// trip (see [`Remote::rtt_probe`]).
    pub(crate) fn on_probe(&mut self, out: &mut Produced, link: &mut Link) -> bool {
        self.ack(out, Some(link), true)
    }
}
