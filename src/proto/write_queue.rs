//! A link's outgoing bytes: the frames encoded and not yet written, in order.
//!
//! Most frames are small and encoded in place, at the queue's tail (handshake frames, acks,
//! heartbeats, a data frame the IO thread encodes). A large piece that already lies in a
//! buffer of its own — a run of frames its senders encoded, the payload of a large message —
//! is queued as that buffer ([`WriteQueue::push`]), shared with the unacknowledged queue
//! that keeps it for resend: its bytes go from there to the socket (one `writev` for
//! several pieces) and are never copied into the link's buffer. A small piece is cheaper
//! copied than shared, and is copied.
//!
//! Positions count every byte ever queued on the link, so a mark made at one position
//! (a journal gate, [`WriteQueue::end`]) keeps naming the same byte however much is written
//! or compacted since.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::Bytes;

use crate::wire;

/// Pieces at least this long are queued as they lie ([`WriteQueue::push`]); shorter ones
/// are copied to the tail. Sharing costs a reference count, a slot in the queue and an
/// entry in the write's vector; copying costs the bytes.
#[cfg(not(test))]
pub(crate) const SHARE_AT: usize = 4 * 1024;
/// In the crate's own tests pieces are shared from 32 bytes: the simulation's payloads are
/// short (5 to 53 bytes) and its runs hold one or two messages, so about half its runs,
/// and about half the payloads a journalling member's IO thread encodes, are then shared
/// pieces, and its schedules (cuts at any byte, partial writes, journal gates) run through
/// them as well as through copies.
#[cfg(test)]
pub(crate) const SHARE_AT: usize = 32;

/// Written bytes at the front of the tail before it is compacted.
const COMPACT_AT: usize = 64 * 1024;

/// Longest stretch of the tail copied into a piece of its own when a shared piece is queued
/// after it; a longer tail is handed over whole, without a copy.
const TAIL_COPY_MAX: usize = 4 * 1024;

/// The frames of one link waiting for the socket (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct WriteQueue {
    /// Pieces queued before `tail`, oldest first.
    pieces: VecDeque<Bytes>,
    /// Frames encoded after the last piece.
    tail: Vec<u8>,
    /// Bytes of the front (the first piece, or the tail when there is none) already
    /// written. While pieces are queued the tail is untouched: `head` is the front
    /// piece's.
    head: usize,
    /// Bytes the pieces hold, less `head` when a piece is at the front.
    in_pieces: usize,
    /// Bytes ever written: the position of the first unwritten byte.
    written: u64,
}

impl WriteQueue {
    /// A queue holding `first` (the acceptor's `Hello`, or nothing).
    pub(crate) fn new(first: Vec<u8>) -> WriteQueue {
        WriteQueue {
            tail: first,
            ..WriteQueue::default()
        }
    }

    /// Where the next frames are encoded: after everything queued.
    #[inline]
    pub(crate) fn tail(&mut self) -> &mut Vec<u8> {
        &mut self.tail
    }

    /// Queues `bytes` after everything queued: shared as they lie when they are
    /// [`SHARE_AT`] long or more, copied to the tail otherwise.
    pub(crate) fn push(&mut self, bytes: &Bytes) {
        if bytes.len() < SHARE_AT {
            self.tail.extend_from_slice(bytes);
            return;
        }
        if self.pieces.is_empty() {
            // The tail goes before the new piece: it becomes a piece of its own (its written
            // prefix dropped), or is dropped whole when it is all written.
            let rest = self.tail.len() - self.head;
            if rest > 0 {
                let piece = if rest <= TAIL_COPY_MAX {
                    Bytes::copy_from_slice(&self.tail[self.head..])
                } else {
                    Bytes::from(self.take_tail()).slice(self.head..)
                };
                self.in_pieces += piece.len();
                self.pieces.push_back(piece);
            }
            self.tail.clear();
            self.head = 0;
        } else if !self.tail.is_empty() {
            let piece = if self.tail.len() <= TAIL_COPY_MAX {
                let piece = Bytes::copy_from_slice(&self.tail);
                self.tail.clear();
                piece
            } else {
                Bytes::from(self.take_tail())
            };
            self.in_pieces += piece.len();
            self.pieces.push_back(piece);
        }
        self.in_pieces += bytes.len();
        self.pieces.push_back(bytes.clone());
    }

    /// Queues a data frame (see [`wire::encode_data`]): its header at the tail, and its
    /// payload after it as [`push`](WriteQueue::push) queues bytes.
    pub(crate) fn push_data(&mut self, flags: u8, seq: Option<u64>, payload: &Bytes) {
        if payload.len() < SHARE_AT {
            wire::encode_data(&mut self.tail, flags, seq, payload);
        } else {
            wire::encode_data_header(&mut self.tail, flags, seq, payload.len());
            self.push(payload);
        }
    }

    /// The tail, handed over whole; the next frames go to a new one with room for a
    /// few of them.
    fn take_tail(&mut self) -> Vec<u8> {
        std::mem::replace(&mut self.tail, Vec::with_capacity(TAIL_COPY_MAX))
    }

    /// Bytes queued and not yet written.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        if self.pieces.is_empty() {
            self.tail.len() - self.head
        } else {
            self.in_pieces + self.tail.len()
        }
    }

    /// Whether every byte queued has been written.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The position of the first unwritten byte.
    #[inline]
    pub(crate) fn written(&self) -> u64 {
        self.written
    }

    /// The position after the last byte queued.
    #[inline]
    pub(crate) fn end(&self) -> u64 {
        self.written + self.len() as u64
    }

    /// The unwritten bytes before position `limit` (at most all of them).
    #[inline]
    pub(crate) fn upto(&self, limit: u64) -> Unwritten<'_> {
        let len = limit.saturating_sub(self.written).min(self.len() as u64) as usize;
        Unwritten { queue: self, len }
    }

    /// Every unwritten byte.
    #[inline]
    pub(crate) fn all(&self) -> Unwritten<'_> {
        Unwritten {
            queue: self,
            len: self.len(),
        }
    }

    /// `n` bytes at the front were written. Returns `true` when the queue is empty.
    pub(crate) fn advance(&mut self, mut n: usize) -> bool {
        debug_assert!(n <= self.len(), "wrote {n} of {} bytes", self.len());
        self.written += n as u64;
        while n > 0 {
            let Some(front) = self.pieces.front() else {
                self.head += n;
                break;
            };
            let rest = front.len() - self.head;
            if n < rest {
                self.head += n;
                self.in_pieces -= n;
                break;
            }
            n -= rest;
            self.in_pieces -= rest;
            self.head = 0;
            self.pieces.pop_front();
        }
        if !self.pieces.is_empty() {
            return false;
        }
        if self.head >= self.tail.len() {
            self.tail.clear();
            self.head = 0;
            return true;
        }
        // Drop the written prefix once it is most of the tail, so a socket that never
        // fully drains cannot make the tail grow without bound.
        if self.head >= COMPACT_AT && self.head * 2 >= self.tail.len() {
            self.tail.drain(..self.head);
            self.head = 0;
        }
        false
    }
}

/// The first `len` unwritten bytes of a [`WriteQueue`]: what may be written now.
#[derive(Clone, Copy)]
pub(crate) struct Unwritten<'a> {
    queue: &'a WriteQueue,
    len: usize,
}

impl<'a> Unwritten<'a> {
    /// How many bytes.
    #[inline]
    pub(crate) fn len(self) -> usize {
        self.len
    }

    /// The bytes, in order, as the slices they lie in.
    pub(crate) fn slices(self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let q = self.queue;
        let mut left = self.len;
        let mut head = q.head;
        q.pieces
            .iter()
            .map(|p| &p[..])
            .chain(std::iter::once(&q.tail[..]))
            .filter_map(move |s| {
                let s = &s[head.min(s.len())..];
                head = 0;
                let s = &s[..left.min(s.len())];
                left -= s.len();
                (!s.is_empty()).then_some(s)
            })
    }

    /// Fills `out` with the slices of the bytes after the first `skip`, in order, as
    /// many as fit. Returns how many it filled (0: nothing left after `skip`).
    pub(crate) fn fill(self, mut skip: usize, out: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        for s in self.slices() {
            if n == out.len() {
                break;
            }
            if skip >= s.len() {
                skip -= s.len();
                continue;
            }
            out[n] = IoSlice::new(&s[skip..]);
            skip = 0;
            n += 1;
        }
        n
    }

    /// The bytes copied into one buffer.
    pub(crate) fn to_vec(self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for s in self.slices() {
            v.extend_from_slice(s);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The queue's bytes, checked against a plain model (a `Vec` of everything queued and a
    /// count written) after every step of a scripted mix of small frames, shared pieces and
    /// partial writes of every size.
    #[test]
    fn queued_bytes_leave_in_order_however_they_are_written() {
        let mut q = WriteQueue::new(b"hello".to_vec());
        let mut model: Vec<u8> = b"hello".to_vec();
        let mut done = 0usize;
        let mut x = 7u32;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for step in 0..20_000u32 {
            match next() % 5 {
                0 | 1 => {
                    let len = (next() % 300) as usize;
                    let bytes: Vec<u8> = (0..len).map(|i| (step as usize + i) as u8).collect();
                    q.tail().extend_from_slice(&bytes);
                    model.extend_from_slice(&bytes);
                }
                2 => {
                    let len =
                        [10, SHARE_AT - 1, SHARE_AT, 3 * SHARE_AT, 70_000][(next() % 5) as usize];
                    let bytes: Bytes = (0..len).map(|i| (step as usize * 3 + i) as u8).collect();
                    q.push(&bytes);
                    model.extend_from_slice(&bytes);
                }
                _ => {
                    let all = q.all();
                    assert_eq!(all.len(), model.len() - done, "step {step}");
                    assert_eq!(all.to_vec(), model[done..], "step {step}");
                    let n = match next() % 4 {
                        0 => all.len(),
                        _ => (next() as usize) % (all.len() + 1),
                    };
                    // What a vectored write would take, from an offset.
                    let skip = n / 2;
                    let mut iov = [IoSlice::new(&[]); 4];
                    let k = all.fill(skip, &mut iov);
                    let filled: Vec<u8> = iov[..k].iter().flat_map(|s| s.iter().copied()).collect();
                    assert!(model[done + skip..].starts_with(&filled), "step {step}");
                    assert!(k == iov.len() || filled.len() == all.len() - skip);
                    let empty = q.advance(n);
                    done += n;
                    assert_eq!(empty, done == model.len(), "step {step}");
                    assert_eq!(q.written(), done as u64);
                    assert_eq!(q.end(), model.len() as u64);
                }
            }
        }
    }

    #[test]
    fn a_limit_stops_the_bytes_at_its_position() {
        let mut q = WriteQueue::new(Vec::new());
        q.tail().extend_from_slice(b"abc");
        let mark = q.end();
        q.push(&Bytes::from(vec![b'x'; SHARE_AT]));
        q.tail().extend_from_slice(b"def");
        assert_eq!(q.upto(mark).to_vec(), b"abc");
        assert!(!q.advance(2));
        assert_eq!(q.upto(mark).to_vec(), b"c");
        assert!(!q.advance(1));
        assert_eq!(q.upto(mark).len(), 0);
        let rest = q.all().to_vec();
        assert_eq!(rest.len(), SHARE_AT + 3);
        assert!(q.advance(rest.len()));
        assert!(q.is_empty());
    }

    #[test]
    fn a_large_piece_is_shared_not_copied() {
        let mut q = WriteQueue::new(Vec::new());
        let run = Bytes::from(vec![7u8; 2 * SHARE_AT]);
        q.push(&run);
        let first = q.all().slices().next().expect("a slice");
        assert_eq!(
            first.as_ptr(),
            run.as_ptr(),
            "written from where the run lies"
        );
    }
}
