//! The empty-file pool: segments that hold no live records, waiting to be reused.
//!
//! A segment enters the pool when it is created, when all its records are retired, or when
//! recovery finds it uninitialised, empty or discarded. The journal takes from the pool before
//! it ever creates a file, so the number of files only grows when every file is in use.

use super::segment::{Header, Identity, SegmentFile, SegmentState};
use super::JournalError;

/// A segment in the pool.
#[derive(Debug)]
pub(crate) struct PooledSegment {
    pub(crate) file: SegmentFile,
    /// The file's length.
    pub(crate) capacity: u64,
}

/// The empty-file pool. Segments are handed out lowest id first, so reuse is deterministic.
#[derive(Debug, Default)]
pub(crate) struct SegmentPool {
    free: Vec<PooledSegment>,
}

impl SegmentPool {
    /// Segments waiting in the pool.
    pub(crate) fn len(&self) -> usize {
        self.free.len()
    }

    /// Takes the segment with the lowest id, if any.
    pub(crate) fn take(&mut self) -> Option<PooledSegment> {
        self.free.pop()
    }

    /// Resets `file`'s header to [`SegmentState::Empty`] and puts it in the pool. The body is
    /// left as it is: stale records fail their checksum under any later generation.
    pub(crate) fn recycle(
        &mut self,
        mut file: SegmentFile,
        identity: &Identity,
        capacity: u64,
        last_generation: u64,
    ) -> Result<(), JournalError> {
        file.write_header(&empty_header(identity, capacity, last_generation))?;
        self.put(PooledSegment { file, capacity });
        Ok(())
    }

    /// Puts a segment whose header already says `Empty` into the pool.
    pub(crate) fn put(&mut self, segment: PooledSegment) {
        self.free.push(segment);
        self.free.sort_by_key(|s| std::cmp::Reverse(s.file.id));
    }
}

/// The header of a pooled segment.
pub(crate) fn empty_header(identity: &Identity, capacity: u64, last_generation: u64) -> Header {
    Header {
        state: SegmentState::Empty,
        capacity,
        generation: last_generation,
        end: 0,
        records: 0,
        identity: identity.clone(),
    }
}
