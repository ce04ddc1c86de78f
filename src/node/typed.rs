//! Typed messages (feature `codec`): the typed send, request, reply and decode methods of
//! the node's handles, of [`Delivery`] and of [`DeliveryRef`], over the byte ones, with
//! values encoded by the [`codec`](crate::codec) module. The codec itself (`encode`, `decode`, `CodecError`) sits
//! low in the layers, so that the node's [`Error`] can carry its error; these methods speak
//! of the node's types, so they live here.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{Error, Node, PeerSender, PendingReply, Sender};
use crate::codec::{decode, encode, with_encoded};
use crate::deliver::{Delivery, DeliveryRef};

/// The typed send variants, written once for the three handles that have them ([`Sender`],
/// [`PeerSender`], [`Node`]) over their byte variants (`send_variants!`): each encodes the
/// value, calls the handle's like-named byte method (with `to`, the peer's name, where the
/// handle names one on each call) and, for a request, decodes the reply. The caller gives
/// each variant's rustdoc, or `see Sender` for "Feature `codec`: see [`Sender::…`]" on all
/// of them.
macro_rules! typed_variants {
    (@one ($($to:ident)?) [$(#[$doc:meta])*] send_typed) => {
        $(#[$doc])*
        pub fn send_typed<T: Serialize + ?Sized>(&self, $($to: &str,)? value: &T) -> Result<(), Error> {
            with_encoded(value, |bytes| self.send_slice($($to,)? bytes))?
        }
    };
    (@one ($($to:ident)?) [$(#[$doc:meta])*] request_typed) => {
        $(#[$doc])*
        pub fn request_typed<Q, R>(
            &self,
            $($to: &str,)?
            request: &Q,
            timeout: Duration,
        ) -> Result<R, Error>
        where
            Q: Serialize + ?Sized,
            R: DeserializeOwned,
        {
            let reply = self.request($($to,)? encode(request)?, timeout)?;
            Ok(decode(&reply)?)
        }
    };
    (@one ($($to:ident)?) [$(#[$doc:meta])*] send_request_typed) => {
        $(#[$doc])*
        #[must_use = "the reply is only seen through the PendingReply; dropping it gives the request up"]
        pub fn send_request_typed<Q: Serialize + ?Sized>(
            &self,
            $($to: &str,)?
            request: &Q,
        ) -> Result<PendingReply, Error> {
            Ok(self.send_request($($to,)? encode(request)?)?)
        }
    };
    (see Sender ($($to:ident)?)) => {
        typed_variants! { ($($to)?)
            #[doc = "Feature `codec`: see [`Sender::send_typed`]."] send_typed;
            #[doc = "Feature `codec`: see [`Sender::request_typed`]."] request_typed;
            #[doc = "Feature `codec`: see [`Sender::send_request_typed`]."] send_request_typed;
        }
    };
    ($to:tt $($(#[$doc:meta])* $name:ident;)*) => {
        $(typed_variants!(@one $to [$(#[$doc])*] $name);)*
    };
}

impl Sender {
    typed_variants! { (to)
        /// Feature `codec`: sends `value`, encoded (see [`codec`](crate::codec)), as a regular
        /// message: [`send`](Sender::send) with typed values. Blocks while the window is full,
        /// and fails as `send` does, or with [`Error::Codec`] if `value` cannot be encoded
        /// (nothing is sent then). The value stays the caller's; on failure, nothing was
        /// queued.
        ///
        /// ```
        /// use serde::{Deserialize, Serialize};
        ///
        /// #[derive(Serialize, Deserialize, Debug, PartialEq)]
        /// struct Tick { n: u64, label: String }
        ///
        /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
        /// let (beta, inbox) = cohort::Node::builder("beta").start_with_inbox()?;
        /// let alpha = cohort::Node::builder("alpha").peer("beta", beta.local_addr()).start()?;
        /// beta.add_peer("alpha", alpha.local_addr())?;
        /// alpha.sender().send_typed("beta", &Tick { n: 1, label: "one".into() })?;
        /// let d = inbox.recv_timeout(std::time::Duration::from_secs(10))?;
        /// assert_eq!(d.decode::<Tick>()?, Tick { n: 1, label: "one".into() });
        /// # alpha.shutdown(std::time::Duration::from_secs(5))?;
        /// # beta.shutdown(std::time::Duration::from_secs(5))?;
        /// # Ok(()) }
        /// ```
        send_typed;

        /// Feature `codec`: sends `request`, encoded, as a request, and decodes its reply into
        /// an `R`: [`request`](Sender::request) with typed values. Fails as `request` does, or
        /// with [`Error::Codec`] if the request cannot be encoded (nothing is sent) or the
        /// reply does not decode as an `R`. See the [`codec`](crate::codec) module's example.
        request_typed;

        /// Feature `codec`: sends `request`, encoded, as a request, and returns at once with
        /// the handle to wait on: [`send_request`](Sender::send_request) with a typed request.
        /// Take the reply with [`PendingReply::wait_typed`], or await the handle and
        /// [`decode`] the bytes.
        send_request_typed;
    }
}

impl PeerSender {
    typed_variants!(see Sender ());
}

impl Node {
    typed_variants!(see Sender (to));
}

impl PendingReply {
    /// Feature `codec`: [`wait`](PendingReply::wait)s at most `timeout` for the reply and
    /// decodes it into an `R`; fails as `wait` does, or with [`Error::Codec`] if the reply
    /// is not an `R`.
    pub fn wait_typed<R: DeserializeOwned>(self, timeout: Duration) -> Result<R, Error> {
        let reply = self.wait(timeout)?;
        Ok(decode(&reply)?)
    }
}

impl Delivery {
    /// Feature `codec`: decodes the message into a `T` (see [`codec`](crate::codec)).
    /// Fails with [`Error::Codec`] when the payload is not a whole `T` as encoded by the
    /// typed send methods (or by [`encode`]): corrupt, cut short, with bytes left over, or
    /// another type. Never panics, whatever the payload. The delivery is left as it was,
    /// so a payload that is not a `T` can be tried as another type.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, Error> {
        Ok(decode(self.payload())?)
    }

    /// Feature `codec`: answers the request this message is with `value`, encoded:
    /// [`reply`](Delivery::reply) with a typed value. Fails as `reply` does (the encoded
    /// reply must fit in [`reply_room`](Delivery::reply_room)), or with [`Error::Codec`]
    /// if `value` cannot be encoded (nothing is sent, and the request may still be
    /// answered).
    pub fn reply_typed<T: Serialize + ?Sized>(&self, value: &T) -> Result<(), Error> {
        Ok(self.reply(encode(value)?)?)
    }
}

impl DeliveryRef<'_> {
    /// Feature `codec`: decodes the message into a `T`, where it lies (see
    /// [`Delivery::decode`]).
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, Error> {
        Ok(decode(self.payload())?)
    }

    /// Feature `codec`: answers the request this message is with `value`, encoded (see
    /// [`Delivery::reply_typed`]).
    pub fn reply_typed<T: Serialize + ?Sized>(&self, value: &T) -> Result<(), Error> {
        Ok(self.reply(encode(value)?)?)
    }
}
