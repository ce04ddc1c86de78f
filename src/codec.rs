//! Typed messages (cargo feature `codec`): send any [`Serialize`] value, and decode a
//! [`Delivery`] or a reply into any [`DeserializeOwned`] one.
//!
//! Values travel as [postcard](https://docs.rs/postcard)'s binary format: compact
//! (integers and lengths as varints, no field names, no padding), with a wire format that
//! is stable across postcard 1.x. Both ends must agree on the type: the format carries no
//! schema, so a payload decoded into another type than the one it was encoded from fails
//! with [`Error::Codec`], or (when the bytes happen to fit) decodes into nonsense. Version
//! your message types as you would a file format: add an enum variant rather than change a
//! field.
//!
//! The typed methods are a layer over the byte ones, nothing more: [`Sender::send_typed`]
//! encodes and calls [`Sender::send`], [`Delivery::decode`] decodes
//! [`Delivery::payload`]. Typed and byte messages mix freely in one stream, and an
//! application that sends bytes pays nothing for this feature.
//!
//! | sending | receiving |
//! | --- | --- |
//! | [`Sender::send_typed`], [`PeerSender::send_typed`], [`Node::send_typed`] | [`Delivery::decode`] |
//! | [`Sender::request_typed`], [`PeerSender::request_typed`], [`Node::request_typed`] | [`Delivery::decode`], then [`Delivery::reply_typed`] |
//! | [`Sender::send_request_typed`], then [`PendingReply::wait_typed`] (or await the [`PendingReply`] and [`decode`] its bytes) | the same |
//!
//! ```
//! use std::time::Duration;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Add { a: i64, b: i64 }
//!
//! #[derive(Serialize, Deserialize, Debug, PartialEq)]
//! enum Answer { Sum(i64), Overflow }
//!
//! # fn main() -> Result<(), cohort::Error> {
//! let server = cohort::Node::builder("server")
//!     .on_message(|d| {
//!         let answer = match d.decode::<Add>() {
//!             Ok(Add { a, b }) => a.checked_add(b).map_or(Answer::Overflow, Answer::Sum),
//!             Err(e) => return eprintln!("not an Add from {}: {e}", d.from()),
//!         };
//!         let _ = d.reply_typed(&answer);
//!     })
//!     .start()?;
//! let client = cohort::Node::builder("client").peer("server", server.local_addr()).start()?;
//! server.add_peer("client", client.local_addr())?;
//!
//! let answer: Answer = client.request_typed("server", &Add { a: 40, b: 2 }, Duration::from_secs(10))?;
//! assert_eq!(answer, Answer::Sum(42));
//! # client.shutdown(Duration::from_secs(5))?;
//! # server.shutdown(Duration::from_secs(5))?;
//! # Ok(()) }
//! ```
//!
//! [`Delivery`]: crate::Delivery
//! [`Delivery::decode`]: crate::Delivery::decode
//! [`Delivery::payload`]: crate::Delivery::payload
//! [`Delivery::reply_typed`]: crate::Delivery::reply_typed
//! [`Error::Codec`]: crate::Error::Codec
//! [`Node::request_typed`]: crate::Node::request_typed
//! [`Node::send_typed`]: crate::Node::send_typed
//! [`PeerSender::request_typed`]: crate::PeerSender::request_typed
//! [`PeerSender::send_typed`]: crate::PeerSender::send_typed
//! [`PendingReply`]: crate::PendingReply
//! [`PendingReply::wait_typed`]: crate::PendingReply::wait_typed
//! [`Sender::request_typed`]: crate::Sender::request_typed
//! [`Sender::send`]: crate::Sender::send
//! [`Sender::send_request_typed`]: crate::Sender::send_request_typed
//! [`Sender::send_typed`]: crate::Sender::send_typed

use std::fmt;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why a value could not be encoded, or a payload decoded into the type asked for (in
/// [`Error::Codec`](crate::Error::Codec)).
///
/// ```
/// use cohort::codec::{decode, encode};
///
/// let bytes = encode(&(7u32, String::from("seven")))?;
/// let back: (u32, String) = decode(&bytes)?;
/// assert_eq!(back, (7, "seven".to_owned()));
///
/// let e = decode::<(u32, String)>(&bytes[..2]).unwrap_err(); // cut short
/// assert!(e.is_decode());
/// assert_eq!(e.len(), 2);
/// println!("{e}"); // cannot decode a (u32, alloc::string::String) from 2 bytes: …
/// # Ok::<(), cohort::codec::CodecError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodecError {
    decode: bool,
    type_name: &'static str,
    len: usize,
    problem: String,
}

impl CodecError {
    fn encoding<T: ?Sized>(e: &postcard::Error) -> CodecError {
        CodecError {
            decode: false,
            type_name: std::any::type_name::<T>(),
            len: 0,
            problem: e.to_string(),
        }
    }

    fn decoding<T>(len: usize, problem: String) -> CodecError {
        CodecError {
            decode: true,
            type_name: std::any::type_name::<T>(),
            len,
            problem,
        }
    }

    /// Whether a payload could not be decoded (`false`: a value could not be encoded).
    pub fn is_decode(&self) -> bool {
        self.decode
    }

    /// The Rust type that was encoded, or asked for when decoding (as
    /// [`std::any::type_name`] spells it: for messages, not for matching).
    pub fn type_name(&self) -> &'static str {
        self.type_name
    }

    /// The length of the payload that could not be decoded (0 for an encoding error).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the payload that could not be decoded was empty (always `true` for an
    /// encoding error).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.decode {
            write!(
                f,
                "cannot decode a {} from {} bytes: {} (was it sent as this type, by a peer \
                 with the same definition of it?)",
                self.type_name, self.len, self.problem
            )
        } else {
            write!(f, "cannot encode a {}: {}", self.type_name, self.problem)
        }
    }
}

impl std::error::Error for CodecError {}

/// Encodes `value` as postcard's bytes, as the typed send methods do.
///
/// Fails only for what postcard cannot represent: a sequence or map whose serializer does
/// not tell its length up front (`serialize_seq(None)`, rare outside hand-written
/// `Serialize` impls), or a `Serialize` impl that fails on its own.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Bytes, CodecError> {
    postcard::to_allocvec(value)
        .map(Bytes::from)
        .map_err(|e| CodecError::encoding::<T>(&e))
}

/// The largest encoding buffer a thread keeps between typed sends: one grown past it for a
/// large value is freed after its send.
const SCRATCH_KEEP: usize = 64 * 1024;

std::thread_local! {
    /// The buffer this thread's typed sends encode into ([`with_encoded`]).
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Encodes `value` as [`encode`] does, into a buffer this thread reuses, and hands the
/// bytes to `f` (a typed send, which copies them into the message's frame): no allocation
/// per message once the buffer has grown. The buffer is out of its slot while `f` runs, so
/// a typed send made from inside `f` encodes into a buffer of its own.
pub(crate) fn with_encoded<T: Serialize + ?Sized, R>(
    value: &T,
    f: impl FnOnce(&[u8]) -> R,
) -> Result<R, CodecError> {
    // Never borrowed across a call: `borrow_mut` finds the slot free. `try_with`: a send
    // from a thread-local's destructor, once the slot is gone, allocates.
    let mut buf = SCRATCH
        .try_with(|slot| std::mem::take(&mut *slot.borrow_mut()))
        .unwrap_or_default();
    buf.clear();
    let buf = postcard::to_extend(value, buf).map_err(|e| CodecError::encoding::<T>(&e))?;
    let r = f(&buf);
    if buf.capacity() <= SCRATCH_KEEP {
        let _ = SCRATCH.try_with(|slot| *slot.borrow_mut() = buf);
    }
    Ok(r)
}

/// Decodes a `T` from `bytes`, all of them: bytes left over after the value mean the
/// payload is not a `T` (or not only one), and fail like a corrupt one. Never panics, and
/// never allocates more than the payload's length can justify, whatever the bytes say.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match postcard::take_from_bytes::<T>(bytes) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(CodecError::decoding::<T>(
            bytes.len(),
            format!("{} bytes left over after the value", rest.len()),
        )),
        Err(e) => Err(CodecError::decoding::<T>(bytes.len(), e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::BTreeMap;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    enum Shape {
        Dot,
        Circle { r: f64 },
        Poly(Vec<(i32, i32)>),
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Scene {
        name: String,
        shapes: Vec<Shape>,
        tags: BTreeMap<String, Option<u64>>,
    }

    /// The reused buffer encodes as `encode` does, is reused (no allocation once grown),
    /// lets a call made from inside `f` encode on its own, and is not kept once grown large.
    #[test]
    fn encoding_into_the_thread_s_buffer() {
        let value = scene();
        let (bytes, at) = with_encoded(&value, |b| (b.to_vec(), b.as_ptr())).expect("encodes");
        assert_eq!(bytes, encode(&value).expect("encodes"));
        let again = with_encoded(&value, |b| b.as_ptr()).expect("encodes");
        assert_eq!(again, at, "the same buffer, reused");
        let nested = with_encoded(&value, |outer| {
            let inner = with_encoded(&7u32, |b| (b.to_vec(), b.as_ptr())).expect("encodes");
            (outer.to_vec(), outer.as_ptr(), inner)
        })
        .expect("encodes");
        assert_eq!(nested.0, bytes);
        assert_eq!(nested.2 .0, encode(&7u32).expect("encodes"));
        assert_ne!(
            nested.2 .1, nested.1,
            "the inner call had a buffer of its own"
        );
        let large = vec![1u8; 2 * SCRATCH_KEEP];
        with_encoded(&large, |b| assert!(b.len() > 2 * SCRATCH_KEEP)).expect("encodes");
        let kept = SCRATCH.with(|slot| slot.borrow().capacity());
        assert!(kept <= SCRATCH_KEEP, "{kept} bytes kept");
    }

    fn scene() -> Scene {
        Scene {
            name: "s".into(),
            shapes: vec![
                Shape::Dot,
                Shape::Circle { r: 1.5 },
                Shape::Poly(vec![(0, 0), (-1, 300)]),
            ],
            tags: [("a".to_owned(), Some(u64::MAX)), ("b".to_owned(), None)].into(),
        }
    }

    #[test]
    fn a_value_round_trips_and_small_integers_take_one_byte() {
        let bytes = encode(&scene()).expect("encodes");
        assert_eq!(decode::<Scene>(&bytes), Ok(scene()));
        assert_eq!(encode(&5u64).expect("encodes").len(), 1, "a varint");
    }

    #[test]
    fn every_prefix_and_a_trailing_byte_fail_without_panicking() {
        let bytes = encode(&scene()).expect("encodes");
        for cut in 0..bytes.len() {
            let e = decode::<Scene>(&bytes[..cut]).expect_err("cut short");
            assert!(e.is_decode() && e.len() == cut, "{e}");
        }
        let mut longer = bytes.to_vec();
        longer.push(0);
        let e = decode::<Scene>(&longer).expect_err("a byte left over");
        assert!(e.to_string().contains("1 bytes left over"), "{e}");
        assert!(e.type_name().ends_with("Scene"), "{e}");
    }

    #[test]
    fn a_huge_announced_length_does_not_allocate_it() {
        // A Vec<u64> claiming u32::MAX elements in five bytes.
        let claim = [0xff, 0xff, 0xff, 0xff, 0x0f];
        assert!(decode::<Vec<u64>>(&claim).is_err());
    }

    #[test]
    fn what_postcard_cannot_encode_is_an_encoding_error() {
        struct Unsized;
        impl Serialize for Unsized {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeSeq;
                s.serialize_seq(None)?.end()
            }
        }
        let e = encode(&Unsized).expect_err("no length up front");
        assert!(!e.is_decode(), "{e}");
        assert!(e.to_string().starts_with("cannot encode a "), "{e}");
    }
}
