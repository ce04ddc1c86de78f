//! Read buffers going back to the IO thread once their messages are delivered.
//!
//! The IO thread reads into a link's buffer and hands the frames of each read to the pool
//! as runs, slices of that buffer; when too little room is left it moves on to another
//! buffer. Without reuse, each buffer is freed by whichever thread drops its last run, and
//! the next is a fresh allocation: memory the allocator may have handed back to the system
//! meanwhile (glibc trims the top of its heap once 128 KiB lie free there), so the kernel's
//! copy of the next read faults in every page anew. Whatever drops the last view of a
//! buffer gives it back here instead: a run ([`Run`](super::Run)'s drop, on a deliverer),
//! or the origin a run's deliveries share (on whichever thread drops the last of them, the
//! application's too); the IO thread's next buffer comes from here when one is at hand:
//! memory already mapped, and a `malloc` and a `free` fewer per buffer. (A payload sliced
//! off on its own — a run's only message in a turn, `payload_bytes` — goes to the
//! allocator when it is the last view.)

use bytes::{Bytes, BytesMut};

use crate::sync::Mutex;

/// Reads' room kept at least, however small the receive window.
const MIN_KEEP: usize = 8;

/// Read buffers whose every run was delivered, for the IO thread's next reads (see the
/// module doc). Shared by the IO thread and the deliverers of one node.
#[derive(Debug)]
pub struct ReadBuffers {
    /// The room one read takes at most (the driver's read chunk).
    chunk: usize,
    /// Bytes of buffers kept at most.
    budget: usize,
    // A lock taken once per buffer (every few dozen KiB read), never while holding another.
    free: Mutex<Free>,
}

#[derive(Debug, Default)]
struct Free {
    bufs: Vec<BytesMut>,
    /// The capacity of `bufs`, all told.
    bytes: usize,
    /// The fewest buffers kept at any moment since the last
    /// [`release_unused`](ReadBuffers::release_unused): that many no read needed.
    low: usize,
}

impl Free {
    /// Takes the buffer at `at`.
    fn remove(&mut self, at: usize) -> BytesMut {
        let buf = self.bufs.remove(at);
        self.bytes -= buf.capacity();
        self.low = self.low.min(self.bufs.len());
        buf
    }
}

impl ReadBuffers {
    /// An empty set, for reads of at most `chunk` bytes, that keeps [`MIN_KEEP`] reads'
    /// room.
    #[cfg(any(test, cohort_internals))]
    pub fn new(chunk: usize) -> ReadBuffers {
        ReadBuffers::for_window(chunk, 0)
    }

    /// An empty set, for reads of at most `chunk` bytes, that keeps buffers of a receive
    /// window of `window` bytes in all (and never less than [`MIN_KEEP`] reads' room). A
    /// peer may make the node hold a window of its messages, each read's buffer held until
    /// the last message read into it is delivered: when the deliverers catch up they give
    /// back that much at once, and a set that kept less would free the rest, only for the
    /// next reads to take new allocations, which the kernel's copy faults in page by page
    /// (a third of a 1 KiB message's CPU, measured, when the allocator gave the memory back
    /// to the system between bursts). The tick frees what no read needed
    /// ([`release_unused`](ReadBuffers::release_unused)).
    pub fn for_window(chunk: usize, window: u64) -> ReadBuffers {
        let window = usize::try_from(window).unwrap_or(usize::MAX);
        ReadBuffers {
            chunk,
            budget: window.max(MIN_KEEP * chunk),
            free: Mutex::new(Free::default()),
        }
    }

    /// Takes `buf` back: the last view of a read buffer, which nothing else holds. Kept
    /// (emptied, its whole allocation reclaimed) when it has at least one read's room and
    /// fits in what the set may keep; freed otherwise, outside the lock.
    pub fn give(&self, mut buf: BytesMut) {
        buf.clear();
        // The last view may start anywhere in its allocation: asking for one byte more than
        // it offers moves it (empty) to the allocation's start, so that `capacity` is the
        // whole allocation's before it is judged. (At the start already, nothing moves.)
        let _ = buf.try_reclaim(buf.capacity() + 1);
        let size = buf.capacity();
        if size < self.chunk {
            return;
        }
        let mut free = self.free.lock();
        if free.bytes + size <= self.budget {
            free.bytes += size;
            free.bufs.push(buf);
        }
    }

    /// Takes back the read buffer `view` lies in if `view` is the last view of it (the
    /// run that dropped last, or the last delivery of a run); otherwise only drops `view`.
    /// Two last views dropped at once on two threads may both miss: the buffer is freed
    /// then, not kept.
    pub fn give_if_last(&self, view: Bytes) {
        if let Ok(buf) = view.try_into_mut() {
            self.give(buf);
        }
    }

    /// A buffer given back, empty, with room for at least one read.
    #[cfg(any(test, cohort_internals))]
    pub fn take(&self) -> Option<BytesMut> {
        self.take_at_least(self.chunk)
    }

    /// A buffer given back, empty, with room for at least `need` bytes: the last given back
    /// that has it (buffers grown for large frames are kept beside those of one read).
    fn take_at_least(&self, need: usize) -> Option<BytesMut> {
        let mut free = self.free.lock();
        let at = free.bufs.iter().rposition(|b| b.capacity() >= need)?;
        Some(free.remove(at))
    }

    /// Buffers kept now.
    #[cfg(any(test, cohort_internals))]
    pub fn kept(&self) -> usize {
        self.free.lock().bufs.len()
    }

    /// Frees the buffers that no read needed since the last call (the IO thread's tick
    /// calls it): as many as were kept throughout, at the fewest. A node that stopped
    /// receiving holds none after two ticks, and a busy one only what its reads took.
    pub fn release_unused(&self) {
        let mut free = self.free.lock();
        let unused = free.low.min(free.bufs.len());
        // The ones at the bottom: `take` pops the last given back, still in cache.
        let kept = free.bufs.split_off(unused);
        let released = std::mem::replace(&mut free.bufs, kept);
        free.bytes -= released.iter().map(BytesMut::capacity).sum::<usize>();
        free.low = free.bufs.len();
        drop(free);
        drop(released);
    }

    /// Makes room for a read in `rbuf` when less than a quarter of a read's is left:
    /// in place when nothing else holds its allocation, else in a buffer given back (the
    /// partial frame at its front copied over), else in a new one.
    pub fn make_room(&self, rbuf: &mut BytesMut) {
        let chunk = self.chunk;
        if rbuf.capacity() - rbuf.len() >= chunk / 4 {
            return;
        }
        self.make_room_for(rbuf, rbuf.len() + chunk / 4, chunk);
    }

    /// Makes `rbuf` hold `need` bytes from its start (a frame that the read buffer's room
    /// does not hold, whose start is at its front, and a quarter read more): in place when
    /// nothing else holds its allocation, else in a buffer given back that is large enough
    /// (what `rbuf` holds copied over), else in a new one. The rest of the frame is then
    /// read in place, and a buffer that held a large frame is read into again, not faulted
    /// in anew for the next.
    pub fn room_for_frame(&self, rbuf: &mut BytesMut, need: usize) {
        if rbuf.capacity() < need {
            self.make_room_for(rbuf, need, need - rbuf.len());
        }
    }

    /// [`make_room`](ReadBuffers::make_room) and
    /// [`room_for_frame`](ReadBuffers::room_for_frame): `need` bytes from `rbuf`'s start,
    /// or `grow` more than it holds in a buffer of its own.
    fn make_room_for(&self, rbuf: &mut BytesMut, need: usize, grow: usize) {
        if rbuf.try_reclaim(grow) {
            return;
        }
        match self.take_at_least(need) {
            Some(mut fresh) => {
                fresh.extend_from_slice(rbuf);
                *rbuf = fresh;
            }
            None => rbuf.reserve(grow),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const READ_CHUNK: usize = 64 * 1024;

    #[test]
    fn a_delivered_buffer_is_read_into_again_without_a_new_allocation() {
        let buffers = ReadBuffers::new(READ_CHUNK);
        let mut rbuf = BytesMut::new();
        buffers.make_room(&mut rbuf);
        let first = rbuf.as_ptr();
        rbuf.extend_from_slice(&[1u8; READ_CHUNK]);
        // Two runs handed to delivery, and a partial frame left at the front.
        let a = rbuf.split_to(1000).freeze();
        let b = rbuf.split_to(READ_CHUNK - 1010).freeze();
        buffers.make_room(&mut rbuf);
        assert_ne!(
            rbuf.as_ptr(),
            first,
            "the old buffer is still read by the runs"
        );
        assert_eq!(&rbuf[..], &[1u8; 10], "the partial frame moved with it");
        drop(a);
        // The last view goes back.
        buffers.give(b.try_into_mut().expect("nothing else holds it"));
        assert_eq!(buffers.kept(), 1);
        // The next move takes it, with the partial frame copied to its front.
        rbuf.extend_from_slice(&[2u8; READ_CHUNK - 20]);
        let c = rbuf.split_to(READ_CHUNK - 15).freeze();
        buffers.make_room(&mut rbuf);
        assert_eq!(rbuf.as_ptr(), first, "the given-back buffer, not a new one");
        assert_eq!(&rbuf[..], &[2u8; 5]);
        assert!(rbuf.capacity() - rbuf.len() >= READ_CHUNK / 4);
        assert_eq!(buffers.kept(), 0);
        drop(c);
    }

    #[test]
    fn a_large_partial_frame_grows_a_buffer_of_its_own() {
        let buffers = ReadBuffers::new(READ_CHUNK);
        buffers.give(BytesMut::with_capacity(READ_CHUNK));
        let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
        rbuf.resize(READ_CHUNK, 1);
        // A run still read, and most of a large frame after it.
        let run = rbuf.split_to(10).freeze();
        buffers.make_room(&mut rbuf);
        assert_eq!(
            buffers.kept(),
            1,
            "the given-back buffer is left for shorter frames"
        );
        assert_eq!(rbuf.len(), READ_CHUNK - 10);
        assert!(rbuf.iter().all(|&b| b == 1));
        assert!(rbuf.capacity() - rbuf.len() >= READ_CHUNK);
        drop(run);
    }

    #[test]
    fn kept_buffers_are_bounded_and_freed_once_unused() {
        let buffers = ReadBuffers::new(READ_CHUNK);
        for _ in 0..MIN_KEEP + 3 {
            buffers.give(BytesMut::with_capacity(READ_CHUNK));
        }
        assert_eq!(buffers.kept(), MIN_KEEP);
        // Given back since the last tick: the next one judges them.
        buffers.release_unused();
        assert_eq!(buffers.kept(), MIN_KEEP);
        buffers.release_unused();
        assert_eq!(buffers.kept(), 0, "no read took one for a whole tick");
        buffers.give(BytesMut::with_capacity(MIN_KEEP * READ_CHUNK + 1));
        buffers.give(BytesMut::with_capacity(100));
        assert_eq!(buffers.kept(), 0, "too large and too small are freed");
        // The last view of a large buffer, starting near its end, is judged by its whole
        // allocation, not by the room after it.
        let mut large = BytesMut::with_capacity(9 * READ_CHUNK);
        large.resize(9 * READ_CHUNK, 7);
        let last = large.split_off(9 * READ_CHUNK - 100);
        drop(large);
        buffers.give(last);
        assert_eq!(buffers.kept(), 0, "a large allocation is freed");
        for _ in 0..MIN_KEEP {
            buffers.give(BytesMut::with_capacity(READ_CHUNK));
        }
        buffers.release_unused();
        // Reads take three at once, then give them back: five were never needed.
        let taken: Vec<_> = (0..3).map(|_| buffers.take().expect("kept")).collect();
        taken.into_iter().for_each(|b| buffers.give(b));
        buffers.release_unused();
        assert_eq!(buffers.kept(), 3, "what the reads took stays for the next");
        buffers.release_unused();
        assert_eq!(buffers.kept(), 0);
    }

    #[test]
    fn a_window_of_buffers_is_kept() {
        let window = 40 * READ_CHUNK as u64;
        let buffers = ReadBuffers::for_window(READ_CHUNK, window);
        // The deliverers catch up and give back a window's worth at once.
        for _ in 0..45 {
            buffers.give(BytesMut::with_capacity(READ_CHUNK));
        }
        assert_eq!(buffers.kept(), 40);
        // What is kept is counted in bytes: a buffer grown for a large frame counts as the
        // reads' room it holds, and one that does not fit is freed.
        let buffers = ReadBuffers::for_window(READ_CHUNK, window);
        buffers.give(BytesMut::with_capacity(30 * READ_CHUNK));
        buffers.give(BytesMut::with_capacity(20 * READ_CHUNK));
        for _ in 0..15 {
            buffers.give(BytesMut::with_capacity(READ_CHUNK));
        }
        assert_eq!(buffers.kept(), 11);
        assert_eq!(
            ReadBuffers::for_window(READ_CHUNK, 1000).budget,
            MIN_KEEP * READ_CHUNK,
            "however small the window"
        );
    }
}
