//! Read buffers going back to the IO thread once their messages are delivered.
//!
//! The IO thread reads into a link's buffer and hands the frames of each read to the pool
//! as runs, slices of that buffer; when too little room is left it moves on to another
//! buffer. Without reuse, each buffer is freed by whichever thread drops its last run, and
//! the next is a fresh allocation: memory the allocator may have handed back to the system
//! meanwhile (glibc trims the top of its heap once 128 KiB lie free there), so the kernel's
//! copy of the next read faults in every page anew. A deliverer that drops the last view of
//! a buffer gives it back here instead ([`Run`](super::Run)'s drop), and the IO thread's
//! next buffer comes from here when one is at hand: memory already mapped, and a `malloc`
//! and a `free` fewer per buffer.

use bytes::BytesMut;

use crate::sync::Mutex;

/// Buffers kept at least, however small the receive window.
const MIN_KEEP: usize = 8;

/// A buffer larger than this many reads' room (grown for a large frame) is freed rather
/// than kept.
const KEEP_AT_MOST: usize = 4;

/// Read buffers whose every run was delivered, for the IO thread's next reads (see the
/// module doc). Shared by the IO thread and the deliverers of one node.
#[derive(Debug)]
pub struct ReadBuffers {
    /// The room one read takes at most (the driver's read chunk).
    chunk: usize,
    /// Buffers kept at most.
    keep: usize,
    // A lock taken once per buffer (every few dozen KiB read), never while holding another.
    free: Mutex<Free>,
}

#[derive(Debug, Default)]
struct Free {
    bufs: Vec<BytesMut>,
    /// The fewest buffers kept at any moment since the last
    /// [`release_unused`](ReadBuffers::release_unused): that many no read needed.
    low: usize,
}

impl ReadBuffers {
    /// An empty set, for reads of at most `chunk` bytes, that keeps [`MIN_KEEP`] buffers.
    #[cfg(any(test, cohort_internals))]
    pub fn new(chunk: usize) -> ReadBuffers {
        ReadBuffers::for_window(chunk, 0)
    }

    /// An empty set, for reads of at most `chunk` bytes, that keeps as many buffers as a
    /// receive window of `window` bytes fills (and never fewer than [`MIN_KEEP`]). A peer
    /// may make the node hold a window of its messages, each read's buffer held until the
    /// last message read into it is delivered: when the deliverers catch up they give back
    /// that many at once, and a set that kept fewer would free the rest, only for the next
    /// reads to take new allocations, which the kernel's copy faults in page by page (a
    /// third of a 1 KiB message's CPU, measured, when the allocator gave the memory back to
    /// the system between bursts). What is kept is never more than the busiest moment held
    /// (a buffer is made only when none is kept), and the tick frees what no read needed
    /// ([`release_unused`](ReadBuffers::release_unused)).
    pub fn for_window(chunk: usize, window: u64) -> ReadBuffers {
        let fills = window / chunk.max(1) as u64;
        ReadBuffers {
            chunk,
            keep: usize::try_from(fills).unwrap_or(usize::MAX).max(MIN_KEEP),
            free: Mutex::new(Free::default()),
        }
    }

    /// Takes `buf` back: the last view of a read buffer, which nothing else holds. Kept
    /// (emptied, its whole allocation reclaimed) when that allocation is of a read buffer's
    /// size (at least one read's room, at most [`KEEP_AT_MOST`] reads') and fewer than
    /// the set's bound are kept; freed otherwise, outside the lock.
    pub fn give(&self, mut buf: BytesMut) {
        buf.clear();
        // The last view may start anywhere in its allocation: asking for one byte more than
        // it offers moves it (empty) to the allocation's start, so that `capacity` is the
        // whole allocation's before it is judged. (At the start already, nothing moves.)
        let _ = buf.try_reclaim(buf.capacity() + 1);
        let size = buf.capacity();
        if size < self.chunk || size > KEEP_AT_MOST * self.chunk {
            return;
        }
        let mut free = self.free.lock();
        if free.bufs.len() < self.keep {
            free.bufs.push(buf);
        }
    }

    /// A buffer given back, empty, with room for at least one read.
    pub fn take(&self) -> Option<BytesMut> {
        let mut free = self.free.lock();
        let buf = free.bufs.pop();
        free.low = free.low.min(free.bufs.len());
        buf
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
        free.low = free.bufs.len();
        drop(free);
        drop(released);
    }

    /// Makes room for a read in `rbuf` when less than a quarter of a read's is left:
    /// in place when nothing else holds its allocation, else in a buffer given back (the
    /// partial frame at its front copied over), else in a new one.
    pub fn make_room(&self, rbuf: &mut BytesMut) {
        let chunk = self.chunk;
        if rbuf.capacity() - rbuf.len() >= chunk / 4 || rbuf.try_reclaim(chunk) {
            return;
        }
        // A buffer given back takes the partial frame and leaves a quarter of a read's room
        // at least; a longer partial frame (of a large message) grows its own buffer
        // instead, which doubles as it grows: taking given-back buffers for it would copy
        // the frame again at every quarter read.
        let need = rbuf.len() + chunk / 4;
        match self.take() {
            Some(mut fresh) if fresh.capacity() >= need => {
                fresh.extend_from_slice(rbuf);
                *rbuf = fresh;
            }
            other => {
                if let Some(fresh) = other {
                    self.give(fresh);
                }
                rbuf.reserve(chunk);
            }
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
        buffers.give(BytesMut::with_capacity(KEEP_AT_MOST * READ_CHUNK + 1));
        buffers.give(BytesMut::with_capacity(100));
        assert_eq!(buffers.kept(), 0, "too large and too small are freed");
        // The last view of a large buffer, starting near its end, is judged by its whole
        // allocation, not by the room after it.
        let mut large = BytesMut::with_capacity(8 * READ_CHUNK);
        large.resize(8 * READ_CHUNK, 7);
        let last = large.split_off(7 * READ_CHUNK - 100);
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
        assert_eq!(
            ReadBuffers::for_window(READ_CHUNK, 1000).keep,
            MIN_KEEP,
            "however small the window"
        );
    }
}
