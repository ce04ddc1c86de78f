//! One connection's protocol state, without the socket: its handshake, the bytes read and
//! not yet split into frames, the frames encoded and not yet written, and what liveness
//! needs to know. The IO thread moves bytes between a link's buffers and its socket; the
//! simulation moves them through memory. Either way the [`Endpoint`](super::Endpoint) owns
//! the link and decides what its frames mean.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::write_queue::{Unwritten, WriteQueue};
use super::Handshake;
use crate::deliver::ReadBuffers;
use crate::wire;

/// Identifies a link for as long as it lives; never reused, so an id that outlived its link
/// names nothing (a stale event is ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct LinkId(pub(crate) usize);

/// The protocol state of one connection.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) id: LinkId,
    /// The member we dialled (outgoing links only).
    pub(crate) dialled: Option<usize>,
    /// The member this link speaks for once identified (a dialled link from the start).
    pub(crate) peer: Option<usize>,
    /// The seed dialled (an address, no member yet), until a member takes the link.
    pub(crate) seed: Option<usize>,
    /// Until the handshake completes.
    pub(crate) hs: Option<Handshake>,
    /// The transport is not connected yet (a dial in progress): nothing is read or written.
    pub(crate) connecting: bool,
    /// Handshake done and adopted by its peer: data may flow.
    pub(crate) established: bool,
    /// The peer's launch id (from the handshake).
    pub(crate) launch: Option<u64>,
    /// The other end's address, when known (for the application's events).
    pub(crate) remote: Option<crate::addr::Addr>,
    /// Not read for now: its peer holds more than its receive window.
    pub(crate) paused: bool,
    /// Bytes read and not yet split into frames.
    pub(crate) rbuf: BytesMut,
    /// Frames encoded and not yet written.
    pub(crate) out: WriteQueue,
    /// With a journal: `(end, batch)` — the bytes of `out` before position `end` (and after
    /// the previous gate's) may leave only once journal batch `batch` is appended. Bytes
    /// past the last gate hold no record the journal lacks.
    gates: VecDeque<(u64, u64)>,
    /// When bytes last arrived (failure detection).
    pub(crate) last_read: Instant,
    /// When bytes were last written (heartbeats go out only on a quiet link).
    pub(crate) last_write: Instant,
    /// When this side made the handshake frame the peer answers next: the acceptor's
    /// `Hello` (when the link was accepted), the dialler's `HelloReply`. The peer made its
    /// answer after it read that frame, so the counts in it cover every ack of the peer's
    /// that we had taken before then, and perhaps none we took since (acks the peer sent on
    /// another link, which it went on to keep).
    pub(crate) asked_at: Instant,
}

impl Link {
    /// A new link: dialled (`dialled`: the member, and the transport still connecting) or
    /// accepted, with its handshake and whatever the handshake wrote first (the acceptor's
    /// `Hello`).
    pub(crate) fn new(
        id: LinkId,
        dialled: Option<usize>,
        hs: Handshake,
        first: Vec<u8>,
        now: Instant,
    ) -> Link {
        Link {
            id,
            dialled,
            peer: dialled,
            seed: None,
            hs: Some(hs),
            connecting: dialled.is_some(),
            established: false,
            launch: None,
            remote: None,
            paused: false,
            rbuf: BytesMut::with_capacity(super::READ_CHUNK),
            out: WriteQueue::new(first),
            gates: VecDeque::new(),
            last_read: now,
            last_write: now,
            asked_at: now,
        }
    }

    /// The bound of the next frame's length: the handshake's until the link is
    /// established, then `data_max` (see [`wire::split_frame`]).
    pub(crate) fn frame_limit(&self, data_max: usize) -> usize {
        if self.established {
            data_max
        } else {
            wire::MAX_HANDSHAKE_FRAME
        }
    }

    /// Bytes encoded and not yet written.
    #[inline]
    pub(crate) fn unwritten(&self) -> usize {
        self.out.len()
    }

    /// The bytes to write next.
    pub(crate) fn to_write(&self) -> Unwritten<'_> {
        self.out.all()
    }

    /// Gates every unwritten byte behind journal batch `batch`: they hold (or follow)
    /// records of that batch, and may not leave before it is appended.
    pub(crate) fn gate(&mut self, batch: u64) {
        if self.out.is_empty() {
            return;
        }
        let end = self.out.end();
        match self.gates.back_mut() {
            Some(last) if last.0 == end => last.1 = batch,
            _ => self.gates.push_back((end, batch)),
        }
    }

    /// The bytes to write next whose journal batches are appended up to `appended`, `cut`
    /// being the last batch cut: all of [`to_write`](Link::to_write) but what waits behind
    /// a later batch. Bytes past the last gate were made after it, so they may depend on any
    /// batch cut so far (a resend on a new link of messages journalled in a batch still on
    /// its way): they wait for `cut`.
    pub(crate) fn durable_part(&self, appended: u64, cut: u64) -> Unwritten<'_> {
        let written = self.out.written();
        let end = match self.gates.iter().position(|&(_, b)| b > appended) {
            None if cut <= appended => return self.out.all(),
            None => self.gates.back().map_or(written, |g| g.0),
            Some(0) => written,
            Some(i) => self.gates[i - 1].0,
        };
        self.out.upto(end)
    }

    /// `n` bytes of [`to_write`](Link::to_write) were written at `now`. Returns `true` when
    /// the queue is empty: everything encoded so far has left.
    pub(crate) fn wrote(&mut self, n: usize, now: Instant) -> bool {
        if n > 0 {
            self.last_write = now;
        }
        let empty = self.out.advance(n);
        let written = self.out.written();
        while self.gates.front().is_some_and(|&(end, _)| end <= written) {
            self.gates.pop_front();
        }
        empty
    }

    /// When the frame at the front of the read buffer (its start read, the rest to come) is
    /// longer than the buffer holds: room for all of it and a quarter read more, so that the
    /// rest is read in place, moved once rather than at every growth of the buffer (a large
    /// message was copied about once more as a whole, growing by doubling). The frame's
    /// length is within the link's limit (`max`), so is at most the largest message.
    pub(crate) fn make_room_for_frame(&mut self, max: usize, buffers: &ReadBuffers) {
        room_for_frame(&mut self.rbuf, max, buffers);
    }

    /// The read buffer, for the transport to read into.
    pub(crate) fn read_buffer(&mut self) -> &mut BytesMut {
        &mut self.rbuf
    }

    /// Whether the link wants its input read now (not connecting, not paused).
    pub(crate) fn wants_read(&self) -> bool {
        !self.connecting && !self.paused
    }

    /// Whether it has bytes to write.
    pub(crate) fn wants_write(&self) -> bool {
        self.unwritten() > 0
    }

    /// Whether a heartbeat is due at `now`: nothing written for `heartbeat`.
    pub(crate) fn heartbeat_due(&self, now: Instant, heartbeat: Duration) -> bool {
        now.saturating_duration_since(self.last_write) >= heartbeat
    }
}

/// See [`Link::make_room_for_frame`].
fn room_for_frame(rbuf: &mut BytesMut, max: usize, buffers: &ReadBuffers) {
    let Ok(Some(len)) = wire::peek_len(rbuf, max) else {
        return;
    };
    let frame = wire::LEN_BYTES + len;
    // A frame of at most a quarter read is left to the read's own room-making
    // (`ReadBuffers::make_room`), which keeps a quarter read of room past what the buffer
    // holds, in a buffer given back where one is at hand rather than a new allocation.
    if frame > rbuf.capacity() && frame > super::READ_CHUNK / 4 {
        buffers.room_for_frame(rbuf, frame + super::READ_CHUNK / 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::READ_CHUNK;

    #[test]
    fn a_large_frame_begun_gets_room_for_all_of_it_once() {
        let buffers = ReadBuffers::new(READ_CHUNK);
        let mut frame = Vec::new();
        wire::encode_data(&mut frame, 0, None, &vec![9u8; 5 * READ_CHUNK]);
        let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
        rbuf.extend_from_slice(&frame[..1000]);
        room_for_frame(&mut rbuf, 1 << 20, &buffers);
        assert!(rbuf.capacity() >= frame.len() + READ_CHUNK / 4);
        assert_eq!(&rbuf[..], &frame[..1000], "what came of it kept");
        let at = rbuf.as_ptr();
        // The rest read in place: no move however it comes.
        for chunk in frame[1000..].chunks(7000) {
            room_for_frame(&mut rbuf, 1 << 20, &buffers);
            rbuf.extend_from_slice(chunk);
        }
        assert_eq!(rbuf.as_ptr(), at);
        assert_eq!(&rbuf[..], &frame[..]);
        // A frame that fits, one whose length is not there yet, or one over the limit:
        // nothing changes.
        for (bytes, max) in [(&frame[..3], 1 << 20), (&frame[..100], 1000)] {
            let mut small = BytesMut::with_capacity(READ_CHUNK);
            small.extend_from_slice(bytes);
            room_for_frame(&mut small, max, &buffers);
            assert_eq!(small.capacity(), READ_CHUNK);
        }
        let mut short = Vec::new();
        wire::encode_data(&mut short, 0, None, &[1; 100]);
        let mut small = BytesMut::with_capacity(READ_CHUNK);
        small.extend_from_slice(&short[..50]);
        room_for_frame(&mut small, 1 << 20, &buffers);
        assert_eq!(small.capacity(), READ_CHUNK);
    }

    /// A read that filled its buffer ends, as a rule, inside a frame. A frame that a quarter
    /// read holds gets no buffer of its own: the next read moves it into one given back,
    /// so that a stream of such frames is read into the same few buffers.
    #[test]
    fn a_small_frame_cut_at_a_buffers_end_moves_to_one_given_back() {
        let buffers = ReadBuffers::new(READ_CHUNK);
        let mut frame = Vec::new();
        wire::encode_data(&mut frame, 0, None, &[5; 1024]);
        let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
        let whole = READ_CHUNK / frame.len();
        for _ in 0..whole {
            rbuf.extend_from_slice(&frame);
        }
        let cut = READ_CHUNK - rbuf.len();
        rbuf.extend_from_slice(&frame[..cut]);
        assert_eq!(rbuf.capacity(), rbuf.len(), "the read filled the buffer");
        // The whole frames go to delivery as a run; delivered, their buffer comes back.
        let run = rbuf.split_to(whole * frame.len()).freeze();
        let back = BytesMut::with_capacity(READ_CHUNK);
        let back_at = back.as_ptr();
        buffers.give(back);
        room_for_frame(&mut rbuf, 1 << 20, &buffers);
        assert_eq!(rbuf.capacity(), cut, "no buffer of its own");
        buffers.make_room(&mut rbuf);
        assert_eq!(
            rbuf.as_ptr(),
            back_at,
            "the buffer given back, not a new one"
        );
        assert_eq!(&rbuf[..], &frame[..cut]);
        assert!(rbuf.capacity() - rbuf.len() >= frame.len() - cut);
        drop(run);
    }

    /// A large frame's room comes from a buffer given back when one is large enough: a
    /// stream of large messages is read into the buffers of those before it.
    #[test]
    fn a_large_frame_takes_a_buffer_given_back_large_enough() {
        let buffers = ReadBuffers::new(READ_CHUNK);
        let mut frame = Vec::new();
        wire::encode_data(&mut frame, 0, None, &vec![3u8; 100_000]);
        let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
        rbuf.extend_from_slice(&[0u8; 1000]);
        rbuf.extend_from_slice(&frame[..5000]);
        // The frames before it, still being delivered: the buffer is shared.
        let run = rbuf.split_to(1000).freeze();
        buffers.give(BytesMut::with_capacity(READ_CHUNK));
        let large = BytesMut::with_capacity(3 * READ_CHUNK);
        let large_at = large.as_ptr();
        buffers.give(large);
        buffers.give(BytesMut::with_capacity(READ_CHUNK));
        room_for_frame(&mut rbuf, 1 << 20, &buffers);
        assert_eq!(
            rbuf.as_ptr(),
            large_at,
            "the one large enough, not a new one"
        );
        assert_eq!(&rbuf[..], &frame[..5000]);
        assert!(rbuf.capacity() >= frame.len() + READ_CHUNK / 4);
        assert_eq!(buffers.kept(), 2, "the smaller ones stay for reads");
        drop(run);
    }
}
