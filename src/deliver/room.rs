//! The room a request reserves for its reply. Its requester took that many window bytes
//! with the request, and the replier holds them for it (they count in what it holds for
//! the requester) until the reply leaves its queue — published, or dropped — or, if the
//! request is never answered, until the request is dropped. So replies need no window of
//! their own, and what a replier owes is bounded by its receive window like everything
//! else it holds.

use super::CreditSink;
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::Arc;

/// A request's reply room, shared by the clones of its [`Delivery`](super::Delivery):
/// claimed by the one reply, or given back as credit when the last clone is dropped
/// unanswered.
pub(crate) struct ReplyRoom {
    sink: Arc<dyn CreditSink>,
    /// The requester's stream epoch the request came in (credit of an older one is void).
    epoch: u32,
    bytes: u64,
    claimed: AtomicBool,
}

impl ReplyRoom {
    /// Room of `bytes` for a request of stream epoch `epoch` from the sender whose
    /// consumption `sink` takes.
    pub(crate) fn new(sink: Arc<dyn CreditSink>, epoch: u32, bytes: u64) -> ReplyRoom {
        ReplyRoom {
            sink,
            epoch,
            bytes,
            claimed: AtomicBool::new(false),
        }
    }

    /// The reply's payload bytes the room takes.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Takes the room for the reply: `None` if a reply already took it.
    pub(crate) fn claim(&self) -> Option<RoomCredit> {
        // AcqRel: one claimer wins; the loser (and the drop) see it.
        if self.claimed.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(RoomCredit {
            sink: self.sink.clone(),
            epoch: self.epoch,
            bytes: self.bytes,
        })
    }
}

impl Drop for ReplyRoom {
    fn drop(&mut self) {
        // Never answered: the room goes back now.
        if !self.claimed.load(Ordering::Acquire) {
            self.sink.consumed(self.epoch, self.bytes);
        }
    }
}

impl std::fmt::Debug for ReplyRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyRoom")
            .field("bytes", &self.bytes)
            .field("claimed", &self.claimed.load(Ordering::Relaxed))
            .finish()
    }
}

/// A claimed room, travelling with its reply: given back as credit when dropped, which
/// happens wherever the reply leaves the queue (published, failed, refused).
pub(crate) struct RoomCredit {
    sink: Arc<dyn CreditSink>,
    epoch: u32,
    bytes: u64,
}

impl Drop for RoomCredit {
    fn drop(&mut self) {
        self.sink.consumed(self.epoch, self.bytes);
    }
}

impl std::fmt::Debug for RoomCredit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoomCredit")
            .field("bytes", &self.bytes)
            .finish()
    }
}
