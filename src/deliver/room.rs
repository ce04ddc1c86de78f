//! The room a request reserves for its reply: the most payload bytes the reply may carry.
//! The requester took that many window bytes with the request (its window cost is its own
//! plus the room), and the replier gives them back with the request's own cost when it
//! has consumed the request. So a replier never holds more unconsumed requests than the
//! window pays for their replies too, a reply never waits for the window, and a queued
//! reply counts as held for its requester until it is written (`RecvCredit::owe`).

use crate::sync::atomic::{AtomicBool, Ordering};

/// A request's reply room and whether it was answered, shared by the clones of its
/// [`Delivery`](super::Delivery): one reply takes it.
#[derive(Debug)]
pub(crate) struct ReplyRoom {
    /// The requester's id for the request.
    id: u64,
    bytes: u64,
    answered: AtomicBool,
}

impl ReplyRoom {
    /// Room for a reply of at most `bytes` payload bytes to request `id`.
    pub(crate) fn new(id: u64, bytes: u64) -> ReplyRoom {
        ReplyRoom {
            id,
            bytes,
            answered: AtomicBool::new(false),
        }
    }

    /// The requester's id for the request.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The most payload bytes the reply may carry.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Takes the room for a reply: `false` if a reply has it already.
    pub(crate) fn claim(&self) -> bool {
        // AcqRel: one claimer wins, and a release happens after its claim.
        self.answered
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Gives the room back: the claimed reply could not be queued (another may try).
    pub(crate) fn release(&self) {
        self.answered.store(false, Ordering::Release);
    }
}
