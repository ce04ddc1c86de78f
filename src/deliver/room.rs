//! The room a request reserves for its reply: the most payload bytes the reply may carry.
//! The requester took that many window bytes with the request (its window cost is its own
//! plus the room), and the replier gives them back with the request's own cost when it
//! has consumed the request. So a replier never holds more unconsumed requests than the
//! window pays for their replies too, a reply never waits for the window, and a queued
//! reply counts as held for its requester until it is written (`RecvCredit::owe`).
//!
//! Every request handed to the application is answered, one way or the other: when the
//! last clone of its `Delivery` goes without a reply (a handler returned, panicked, or the
//! application let it go), the room's drop sends the requester a reply status saying why
//! (`wire::ReplyStatus`), so the requester fails at once instead of at its timeout.

use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::SharedStr;
use crate::wire::ReplyStatus;

use super::NodeRef;

/// [`ReplyRoom::refused`] for a node with no handler.
const NO_HANDLER: u64 = u64::MAX;

/// A request's reply room and whether it was answered, shared by the clones of its
/// [`Delivery`](super::Delivery): one reply takes it.
#[derive(Debug)]
pub(crate) struct ReplyRoom {
    /// The requester's id for the request.
    id: u64,
    bytes: u64,
    answered: AtomicBool,
    /// Why the request was not answered, if it was refused: said to the requester when
    /// the request goes unanswered. 0: not refused; [`NO_HANDLER`]: no handler; else the
    /// length of a reply refused as larger than the room.
    refused: AtomicU64,
    /// Where the word that it was not answered goes: the receiving node's send handle and
    /// the requester, set when the request is handed to the application. A request
    /// dropped before that (its sender's queue discarded, the node shut down) says nothing.
    answer_to: Option<(NodeRef, SharedStr)>,
}

impl ReplyRoom {
    /// Room for a reply of at most `bytes` payload bytes to request `id`.
    pub(crate) fn new(id: u64, bytes: u64) -> ReplyRoom {
        ReplyRoom {
            id,
            bytes,
            answered: AtomicBool::new(false),
            refused: AtomicU64::new(0),
            answer_to: None,
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

    /// From now on a drop without a reply tells `from` why, through `node`.
    pub(crate) fn arm(&mut self, node: NodeRef, from: SharedStr) {
        self.answer_to = Some((node, from));
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

    /// The application's reply of `len` bytes was refused as larger than the room: what
    /// the requester is told if no reply follows.
    pub(crate) fn refuse_too_large(&self, len: u64) {
        // Relaxed: read only by the last clone's drop, which the `Arc`'s release/acquire on
        // its count orders after every clone's use.
        self.refused
            .store(len.min(NO_HANDLER - 1), Ordering::Relaxed);
    }

    /// This node has no handler for the request: what the requester is told.
    pub(crate) fn refuse_no_handler(&self) {
        // Relaxed: as above.
        self.refused.store(NO_HANDLER, Ordering::Relaxed);
    }

    /// Why the request goes unanswered, when its last clone goes.
    fn why_unanswered(&self) -> ReplyStatus {
        match self.refused.load(Ordering::Relaxed) {
            // The last clone dropped while unwinding: the handler panicked holding it.
            0 if std::thread::panicking() => ReplyStatus::Panicked,
            0 => ReplyStatus::Unanswered,
            NO_HANDLER => ReplyStatus::NoHandler,
            len => ReplyStatus::TooLarge {
                len,
                room: u32::try_from(self.bytes).unwrap_or(u32::MAX),
            },
        }
    }
}

impl Drop for ReplyRoom {
    fn drop(&mut self) {
        let Some((node, from)) = self.answer_to.take() else {
            return;
        };
        // Acquire: a reply claimed on another thread (the last clone's owner may differ).
        if self.answered.load(Ordering::Acquire) {
            return;
        }
        node.reply_status(&from, self.id, self.why_unanswered());
    }
}
