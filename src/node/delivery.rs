//! The parts of [`Delivery`] that speak of the node: its send half (`Delivery::sender`)
//! and the reply, which fails with the node's [`Error`]. `deliver` sits below `node` and
//! carries the send half as a [`NodeRef`]; here `Sender` implements [`NodeHandle`] and
//! is read back.

use std::any::Any;

use bytes::Bytes;

use super::{Error, SendError, Sender};
use crate::deliver::{Delivery, DeliveryRef, NodeHandle, NodeRef};
use crate::sync::Arc;
use crate::wire::ReplyStatus;

impl NodeHandle for Sender {
    fn fork(&self) -> NodeRef {
        Arc::new(Sender::fork(self))
    }

    fn reply_status(&self, to: &str, id: u64, status: ReplyStatus) {
        if let Err(e) = Sender::reply_status(self, to, id, status) {
            log::debug!(
                "{}: cannot tell '{to}' that request {id} goes unanswered: {e}",
                self.name()
            );
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Delivery {
    /// Answers the request this message is, with `payload`. Never blocks and never waits
    /// for the window: the requester reserved room for the reply in its request's window
    /// bytes ([`Builder::max_reply`](crate::Builder::max_reply)), so a handler can always
    /// answer within that room ([`reply_room`](Delivery::reply_room)), whatever the two
    /// members' windows and `max_message` (now, or later from a kept `Delivery`), and two
    /// members requesting each other cannot deadlock. Reliable like any message: it
    /// survives reconnects.
    ///
    /// Fails with [`Error::NotARequest`] for a message that is not a request,
    /// [`Error::ReplyTooLarge`] for a reply larger than the room its requester reserved (a
    /// smaller reply may follow; if none does, the requester fails with
    /// [`ReplyFailure::TooLarge`](crate::ReplyFailure::TooLarge)),
    /// [`Error::AlreadyReplied`] for a second reply, [`Error::UnknownPeer`] if the
    /// requester was removed meanwhile, and [`Error::Closed`] once the node is shut down;
    /// the [`SendError`] hands the reply back ([`into_inner`](SendError::into_inner)), to
    /// trim it to [`reply_room`](Delivery::reply_room) and answer again, say.
    ///
    /// A request that is never answered is not left waiting: when the last clone of its
    /// `Delivery` goes without a reply (the handler returned or panicked, or the
    /// application dropped it), the requester fails at once with
    /// [`Error::ReplyFailed`] saying why. Keep the `Delivery` to answer later.
    ///
    /// ```
    /// let server = cohort::Node::builder("server").on_message(|d| {
    ///     if d.is_request() {
    ///         let mut answer = d.payload().to_vec();
    ///         answer.reverse();
    ///         if let Err(e) = d.reply(answer) {
    ///             eprintln!("cannot answer {}: {e}", d.from());
    ///         }
    ///     }
    /// });
    /// # let _ = server;
    /// ```
    pub fn reply(&self, payload: impl Into<Bytes>) -> Result<(), SendError<Bytes>> {
        let payload = payload.into();
        let (Some(room), Some(node)) = (self.room(), self.sender()) else {
            return Err(SendError::new(Error::NotARequest, payload));
        };
        if payload.len() as u64 > room.bytes() {
            node.warn_reply_refused(self.from(), payload.len(), room.bytes());
            room.refuse_too_large(payload.len() as u64);
            let error = Error::ReplyTooLarge {
                len: payload.len(),
                room: usize::try_from(room.bytes()).unwrap_or(usize::MAX),
            };
            return Err(SendError::new(error, payload));
        }
        if !room.claim() {
            return Err(SendError::new(Error::AlreadyReplied, payload));
        }
        match node.reply(self.from(), room.id(), payload.clone()) {
            Ok(()) => Ok(()),
            Err(e) => {
                room.release();
                Err(SendError::new(e, payload))
            }
        }
    }
    /// The receiving node's send handle, to answer the sender or send anywhere from inside
    /// a handler (no need to smuggle the node's [`Sender`] in after `start`). `Some` for
    /// every message a node delivers, to a handler or through an
    /// [`Inbox`](crate::Inbox); `None` only for a `Delivery` built by hand.
    ///
    /// A handler should answer with [`Sender::try_send`], not with a blocking
    /// [`Sender::send`]: the handler's pool thread is what returns credit, so two members
    /// that both block in their handlers on each other's full windows wait for ever (a
    /// send from a handler that waits for the window logs a warning once).
    ///
    /// ```
    /// let echo = cohort::Node::builder("echo").on_message(|d| {
    ///     if let Some(node) = d.sender() {
    ///         // A full window hands the payload back instead of blocking the handler.
    ///         let _ = node.try_send(d.from(), d.payload_bytes());
    ///     }
    /// });
    /// # let _ = echo;
    /// ```
    pub fn sender(&self) -> Option<&Sender> {
        // `Sender` is the only `NodeHandle`: the downcast finds it whenever a node is set.
        self.node()
            .and_then(|n| n.as_any().downcast_ref::<Sender>())
    }
}

impl<'a> DeliveryRef<'a> {
    /// Answers the request this message is, with `payload`: [`Delivery::reply`], which
    /// says how and when it fails. Fails with [`Error::NotARequest`] for a message that is
    /// not a request.
    ///
    /// ```
    /// let server = cohort::Node::builder("server").on_message_ref(|m| {
    ///     if m.is_request() {
    ///         let mut answer = m.payload().to_vec();
    ///         answer.reverse();
    ///         if let Err(e) = m.reply(answer) {
    ///             eprintln!("cannot answer {}: {e}", m.from());
    ///         }
    ///     }
    /// });
    /// # let _ = server;
    /// ```
    pub fn reply(&self, payload: impl Into<Bytes>) -> Result<(), SendError<Bytes>> {
        match self.as_whole() {
            Some(d) => d.reply(payload),
            None => Err(SendError::new(Error::NotARequest, payload.into())),
        }
    }

    /// The receiving node's send handle (see [`Delivery::sender`]): `Some` for every
    /// message a node lends.
    pub fn sender(&self) -> Option<&'a Sender> {
        // `Sender` is the only `NodeHandle`: the downcast finds it whenever a node is set.
        self.node()
            .and_then(|n| n.as_any().downcast_ref::<Sender>())
    }
}
