//! Where a sender's deliverers report consumption: [`PeerCreditSink`] connects a peer's
//! queues to its receive credit, its delivery progress (journalling receivers) and the IO
//! thread's credit list.

use super::{CreditSink, Progress};
use crate::flow::RecvCredit;
use crate::handoff::Handoff;
use crate::sync::Arc;

/// Connects a sender's consumption to the IO thread: credit goes back when half the
/// sender's window has been consumed (or consumption brought a paused sender back within
/// its window). What is left below half goes back with the IO thread's next tick, ack or
/// probe answer: [`idle`](CreditSink::idle) does nothing.
pub struct PeerCreditSink {
    peer: usize,
    credit: Arc<RecvCredit>,
    /// With a journal: how far the application has handled the peer's reliable stream.
    progress: Option<Arc<Progress>>,
    handoff: Arc<Handoff>,
}

impl PeerCreditSink {
    /// The sink of peer `peer`'s queues (its member queue and its out-of-band queue each
    /// have one, sharing `credit` and `progress`).
    pub fn new(
        peer: usize,
        credit: Arc<RecvCredit>,
        progress: Option<Arc<Progress>>,
        handoff: Arc<Handoff>,
    ) -> PeerCreditSink {
        PeerCreditSink {
            peer,
            credit,
            progress,
            handoff,
        }
    }

    fn request(&self) {
        if self.credit.request_flush() {
            self.handoff.request_credit(self.peer);
        }
    }
}

impl CreditSink for PeerCreditSink {
    fn consumed(&self, epoch: u32, bytes: u64) {
        if self.credit.consumed(epoch, bytes) {
            self.request();
        }
    }
    fn tracks_progress(&self) -> bool {
        self.progress.is_some()
    }
    fn handled(&self, epoch: u32, seqs: &[u64]) {
        if let Some(p) = &self.progress {
            p.complete(epoch, seqs.iter().copied());
        }
    }
    fn handled_unreliable(&self, epoch: u32, cost: u64) {
        if let Some(p) = &self.progress {
            p.complete_unreliable(epoch, cost);
        }
    }
    fn idle(&self) {
        // Residual credit (below half a window) goes back with the IO thread's next tick,
        // ack or probe answer: waking the IO thread here would cost a syscall per burst
        // (per message in a ping-pong).
    }
}

impl std::fmt::Debug for PeerCreditSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerCreditSink")
            .field("peer", &self.peer)
            .finish()
    }
}
