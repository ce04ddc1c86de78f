//! The journal's one error type.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong when opening, appending to or inspecting a journal.
///
/// Each variant names the file involved and says what an operator can do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// An I/O operation on a journal file or directory failed.
    #[error("journal I/O error on {path} (check that the directory exists, is writable and the disk is not full)")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A segment was written by a different version of the journal format.
    #[error("segment {path} has journal format version {found}, this build reads version {supported}; open it with a matching cohort version or move the directory away")]
    UnsupportedVersion {
        /// The segment file.
        path: PathBuf,
        /// The version found in the header.
        found: u16,
        /// The version this build reads and writes.
        supported: u16,
    },
    /// A segment belongs to another member (or cluster) than the one opening the journal.
    #[error("segment {path} belongs to member {found:?}, not {expected:?}; each member needs its own journal directory")]
    ForeignMember {
        /// The segment file.
        path: PathBuf,
        /// `cluster/member` of the journal being opened.
        expected: String,
        /// `cluster/member` recorded in the segment header.
        found: String,
    },
    /// A file named like a segment does not start with the journal's magic bytes.
    #[error(
        "{path} is not a cohort journal segment (bad magic); move it out of the journal directory"
    )]
    NotASegment {
        /// The file.
        path: PathBuf,
    },
    /// A segment header fails its checksum or holds impossible values.
    #[error("segment {path} has a damaged header ({reason}); move the file out of the journal directory to discard its records")]
    DamagedHeader {
        /// The segment file.
        path: PathBuf,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A record cannot fit in an empty segment.
    #[error("a journal record of {size} bytes does not fit in a segment (at most {max} bytes); raise the segment size")]
    RecordTooLarge {
        /// The framed size of the record.
        size: usize,
        /// The largest framed record a segment can take.
        max: usize,
    },
    /// A name (member, cluster or peer) is longer than the format allows.
    #[error("name {name:?} is {len} bytes, the journal allows at most {max}")]
    NameTooLong {
        /// The name (possibly shortened for display).
        name: String,
        /// Its length in bytes.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The `launch-id` file does not hold a launch id.
    #[error("the journal's launch id file {path} is damaged (expected 16 hex digits); restore it, or delete it to have the peers treat this member as a new incarnation")]
    DamagedLaunchId {
        /// The file.
        path: PathBuf,
    },
    /// The configured segment size is unusable.
    #[error("segment size {size} is out of range ({min}..={max} bytes)")]
    BadSegmentSize {
        /// The configured size.
        size: u64,
        /// The smallest allowed.
        min: u64,
        /// The largest allowed.
        max: u64,
    },
}

impl JournalError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> JournalError {
        let path = path.into();
        move |source| JournalError::Io { path, source }
    }
}
