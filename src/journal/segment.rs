//! One segment file: its header, its records, and the file operations on it.

use crate::sync::Arc;
use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::record::{read_frame, FrameRead, Record};
use super::JournalError;

/// Bytes reserved for the header at the start of every segment.
pub const HEADER_LEN: usize = 1024;
/// The first eight bytes of every segment.
pub(crate) const MAGIC: [u8; 8] = *b"COHORTJL";
/// The on-disk format this build reads and writes.
pub const FORMAT_VERSION: u16 = 2;
/// Longest member or cluster name a header holds.
pub(crate) const MAX_IDENTITY_NAME: usize = 255;

const OFF_VERSION: usize = 8;
const OFF_STATE: usize = 10;
const OFF_CRC: usize = 12;
const OFF_CAPACITY: usize = 16;
const OFF_GENERATION: usize = 24;
const OFF_END: usize = 32;
const OFF_RECORDS: usize = 40;
const OFF_MEMBER: usize = 64;
const OFF_CLUSTER: usize = 320;

/// The life cycle of a segment (see the module docs for the state machine).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SegmentState {
    /// In the empty-file pool, waiting to be used.
    Empty,
    /// The segment records are being appended to.
    Active,
    /// Full (or superseded); its records end at the header's `end`.
    Sealed,
}

impl SegmentState {
    fn to_byte(self) -> u8 {
        match self {
            SegmentState::Empty => 1,
            SegmentState::Active => 2,
            SegmentState::Sealed => 3,
        }
    }
    fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(SegmentState::Empty),
            2 => Some(SegmentState::Active),
            3 => Some(SegmentState::Sealed),
            _ => None,
        }
    }
}

/// Who owns a journal: written in every header and checked at recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) cluster: String,
    pub(crate) member: String,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.cluster, self.member)
    }
}

/// A decoded segment header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) state: SegmentState,
    /// Length of the file, header included.
    pub(crate) capacity: u64,
    /// Active/Sealed: the segment's place in the journal. Empty: the last generation this
    /// file held (so that a new generation is always above every stale record on disk).
    pub(crate) generation: u64,
    /// Sealed: the offset where the records end. Otherwise 0.
    pub(crate) end: u64,
    /// Sealed: the number of records. Otherwise 0.
    pub(crate) records: u64,
    pub(crate) identity: Identity,
}

impl Header {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        b[..8].copy_from_slice(&MAGIC);
        b[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[OFF_STATE] = self.state.to_byte();
        b[OFF_CAPACITY..OFF_CAPACITY + 8].copy_from_slice(&self.capacity.to_le_bytes());
        b[OFF_GENERATION..OFF_GENERATION + 8].copy_from_slice(&self.generation.to_le_bytes());
        b[OFF_END..OFF_END + 8].copy_from_slice(&self.end.to_le_bytes());
        b[OFF_RECORDS..OFF_RECORDS + 8].copy_from_slice(&self.records.to_le_bytes());
        put_name(&mut b[OFF_MEMBER..], &self.identity.member);
        put_name(&mut b[OFF_CLUSTER..], &self.identity.cluster);
        let crc = crc32fast::hash(&b);
        b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes the first bytes of a file (all of it if it is shorter than a header).
    pub(crate) fn decode(bytes: &[u8]) -> HeaderRead {
        if bytes.len() < HEADER_LEN {
            return if bytes.iter().all(|&b| b == 0) {
                HeaderRead::Uninitialised
            } else {
                HeaderRead::Damaged("the file is shorter than a segment header")
            };
        }
        let b = &bytes[..HEADER_LEN];
        if b.iter().all(|&x| x == 0) {
            return HeaderRead::Uninitialised;
        }
        if b[..8] != MAGIC {
            return HeaderRead::NotASegment;
        }
        let version = u16::from_le_bytes([b[OFF_VERSION], b[OFF_VERSION + 1]]);
        if version != FORMAT_VERSION {
            return HeaderRead::OtherVersion(version);
        }
        let mut copy = b.to_vec();
        copy[OFF_CRC..OFF_CRC + 4].fill(0);
        if crc32fast::hash(&copy) != u32_at(b, OFF_CRC) {
            return HeaderRead::Damaged("header checksum mismatch");
        }
        let Some(state) = SegmentState::from_byte(b[OFF_STATE]) else {
            return HeaderRead::Damaged("unknown segment state");
        };
        let (Some(member), Some(cluster)) =
            (get_name(&b[OFF_MEMBER..]), get_name(&b[OFF_CLUSTER..]))
        else {
            return HeaderRead::Damaged("owner name is not UTF-8");
        };
        let header = Header {
            state,
            capacity: u64_at(b, OFF_CAPACITY),
            generation: u64_at(b, OFF_GENERATION),
            end: u64_at(b, OFF_END),
            records: u64_at(b, OFF_RECORDS),
            identity: Identity { cluster, member },
        };
        if header.capacity < HEADER_LEN as u64 || header.capacity > super::MAX_SEGMENT_SIZE {
            return HeaderRead::Damaged("capacity out of range");
        }
        if state == SegmentState::Sealed
            && (header.end < HEADER_LEN as u64 || header.end > header.capacity)
        {
            return HeaderRead::Damaged("sealed end outside the segment");
        }
        HeaderRead::Valid(header)
    }
}

/// What the first bytes of a segment file say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HeaderRead {
    /// All zeroes: a file that was never initialised. It belongs in the pool.
    Uninitialised,
    /// Not our magic.
    NotASegment,
    /// Our magic, another format version.
    OtherVersion(u16),
    /// Our magic and version, but the header is unusable.
    Damaged(&'static str),
    /// A good header.
    Valid(Header),
}

fn put_name(out: &mut [u8], name: &str) {
    out[0] = name.len() as u8;
    out[1..1 + name.len()].copy_from_slice(name.as_bytes());
}

fn get_name(b: &[u8]) -> Option<String> {
    let len = b[0] as usize;
    String::from_utf8(b[1..1 + len].to_vec()).ok()
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

/// Why a scan of a segment's records stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ScanStop {
    /// Zeroes, the sealed end, or no room for another frame.
    Clean,
    /// An invalid frame at `offset` (absolute in the file).
    Invalid { offset: u64, reason: &'static str },
}

/// The records of one segment, as far as they are valid.
#[derive(Clone, Debug)]
pub(crate) struct Scan {
    pub(crate) records: Vec<Record>,
    /// Offset just past the last valid record.
    pub(crate) end: u64,
    pub(crate) stop: ScanStop,
}

/// Reads the records of a segment whose file content is `data` (header included).
/// A sealed segment is read up to its `end`; anything short of it is reported as invalid.
pub(crate) fn scan_records(header: &Header, data: &[u8]) -> Scan {
    let limit = match header.state {
        SegmentState::Sealed => header.end as usize,
        _ => header.capacity as usize,
    };
    let avail = limit.min(data.len());
    let mut pos = HEADER_LEN.min(avail);
    let mut records = Vec::new();
    let stop = loop {
        if pos >= avail {
            break if avail < limit && header.state == SegmentState::Sealed {
                ScanStop::Invalid {
                    offset: pos as u64,
                    reason: "the file is shorter than its sealed records",
                }
            } else {
                ScanStop::Clean
            };
        }
        match read_frame(header.generation, &data[pos..avail]) {
            FrameRead::Record(r, len) => {
                records.push(r);
                pos += len;
            }
            FrameRead::End if header.state == SegmentState::Sealed => {
                break ScanStop::Invalid {
                    offset: pos as u64,
                    reason: "zeroes before the sealed end",
                }
            }
            FrameRead::End => break ScanStop::Clean,
            FrameRead::Invalid(reason) => {
                break ScanStop::Invalid {
                    offset: pos as u64,
                    reason,
                }
            }
        }
    };
    Scan {
        records,
        end: pos as u64,
        stop,
    }
}

/// An open segment file.
#[derive(Debug)]
pub(crate) struct SegmentFile {
    pub(crate) id: u64,
    pub(crate) path: PathBuf,
    /// Shared with a [`SyncHandle`] while the journal's writer syncs outside its lock.
    file: Arc<File>,
}

/// One segment's file, held to fsync it outside the journal's lock
/// ([`SegmentFile::sync_handle`]).
#[derive(Debug)]
pub(crate) struct SyncHandle {
    path: PathBuf,
    file: Arc<File>,
}

impl SyncHandle {
    /// `fdatasync`: whatever was written to the file before the call is on disk after it.
    pub(crate) fn sync(&self) -> Result<(), JournalError> {
        self.file.sync_data().map_err(JournalError::io(&self.path))
    }
}

/// `segment-00000042.jrnl`
pub(crate) fn file_name(id: u64) -> String {
    format!("segment-{id:08}.jrnl")
}

/// The id in a segment file name, if it is one.
pub(crate) fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("segment-")?.strip_suffix(".jrnl")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether a file name is a leftover of an interrupted segment creation.
pub(crate) fn is_temp_name(name: &str) -> bool {
    name.starts_with("segment-") && name.ends_with(".jrnl.tmp")
}

static ZEROES: [u8; 64 * 1024] = [0; 64 * 1024];

impl SegmentFile {
    /// Opens an existing segment for reading and writing.
    pub(crate) fn open(dir: &Path, id: u64) -> Result<Self, JournalError> {
        let path = dir.join(file_name(id));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(JournalError::io(&path))?;
        Ok(SegmentFile {
            id,
            path,
            file: Arc::new(file),
        })
    }

    /// Creates a new segment in the pool, so that a crash never leaves a half-made file: the
    /// file is written in full under a temporary name, synced, renamed into place, and the
    /// directory is synced.
    pub(crate) fn create(dir: &Path, id: u64, header: &Header) -> Result<Self, JournalError> {
        let path = dir.join(file_name(id));
        let tmp = dir.join(format!("{}.tmp", file_name(id)));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(JournalError::io(&tmp))?;
        file.write_all(&header.encode())
            .map_err(JournalError::io(&tmp))?;
        write_zeroes(&file, HEADER_LEN as u64, header.capacity).map_err(JournalError::io(&tmp))?;
        file.sync_all().map_err(JournalError::io(&tmp))?;
        fs::rename(&tmp, &path).map_err(JournalError::io(&path))?;
        sync_dir(dir)?;
        Ok(SegmentFile {
            id,
            path,
            file: Arc::new(file),
        })
    }

    /// Writes `bytes` at `offset`: one `pwrite` on Unix (the IO thread's inline appends pay
    /// one system call, not a seek and a write).
    pub(crate) fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<(), JournalError> {
        #[cfg(unix)]
        let written = std::os::unix::fs::FileExt::write_all_at(&*self.file, bytes, offset);
        #[cfg(not(unix))]
        let written = (&*self.file)
            .seek(SeekFrom::Start(offset))
            .and_then(|_| (&*self.file).write_all(bytes));
        written.map_err(JournalError::io(&self.path))
    }

    /// Rewrites the header.
    pub(crate) fn write_header(&mut self, header: &Header) -> Result<(), JournalError> {
        self.write_at(0, &header.encode())
    }

    /// Writes zeroes over `from..to` (growing the file if needed).
    pub(crate) fn zero(&mut self, from: u64, to: u64) -> Result<(), JournalError> {
        write_zeroes(&self.file, from, to).map_err(JournalError::io(&self.path))
    }

    /// Makes the file exactly `len` bytes, writing zeroes over any extension (so the space is
    /// allocated, not sparse).
    pub(crate) fn resize(&mut self, len: u64) -> Result<(), JournalError> {
        let current = self
            .file
            .metadata()
            .map_err(JournalError::io(&self.path))?
            .len();
        if current > len {
            self.file
                .set_len(len)
                .map_err(JournalError::io(&self.path))?;
        } else if current < len {
            self.zero(current, len)?;
        }
        Ok(())
    }

    /// `fdatasync`.
    pub(crate) fn sync(&mut self) -> Result<(), JournalError> {
        self.file.sync_data().map_err(JournalError::io(&self.path))
    }

    /// A handle to fsync this file later, on another thread or outside a lock: it covers
    /// what was written before its `sync` call.
    pub(crate) fn sync_handle(&self) -> SyncHandle {
        SyncHandle {
            path: self.path.clone(),
            file: self.file.clone(),
        }
    }
}

fn write_zeroes(mut file: &File, from: u64, to: u64) -> std::io::Result<()> {
    file.seek(SeekFrom::Start(from))?;
    let mut left = to.saturating_sub(from);
    while left > 0 {
        let n = left.min(ZEROES.len() as u64) as usize;
        file.write_all(&ZEROES[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Syncs a directory so that a create or rename in it is durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    #[cfg(unix)]
    {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(JournalError::io(dir))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(state: SegmentState) -> Header {
        Header {
            state,
            capacity: 65536,
            generation: 7,
            end: if state == SegmentState::Sealed {
                2048
            } else {
                0
            },
            records: 3,
            identity: Identity {
                cluster: "c".into(),
                member: "alpha".into(),
            },
        }
    }

    #[test]
    fn headers_round_trip_and_detect_damage() {
        for s in [
            SegmentState::Empty,
            SegmentState::Active,
            SegmentState::Sealed,
        ] {
            let h = header(s);
            let b = h.encode();
            assert_eq!(Header::decode(&b), HeaderRead::Valid(h));
            let mut bad = b.clone();
            bad[OFF_MEMBER + 1] ^= 1;
            assert!(matches!(Header::decode(&bad), HeaderRead::Damaged(_)));
            let mut v2 = b.clone();
            v2[OFF_VERSION] = (FORMAT_VERSION + 1) as u8;
            assert_eq!(
                Header::decode(&v2),
                HeaderRead::OtherVersion(FORMAT_VERSION + 1)
            );
            let mut magic = b.clone();
            magic[0] = b'X';
            assert_eq!(Header::decode(&magic), HeaderRead::NotASegment);
        }
        assert_eq!(Header::decode(&[0; 10]), HeaderRead::Uninitialised);
        assert_eq!(Header::decode(&[0; 2000]), HeaderRead::Uninitialised);
        assert!(matches!(Header::decode(&[1; 10]), HeaderRead::Damaged(_)));
    }

    #[test]
    fn file_names_parse_back() {
        assert_eq!(parse_file_name(&file_name(42)), Some(42));
        assert_eq!(parse_file_name("segment-.jrnl"), None);
        assert_eq!(parse_file_name("segment-00000001.jrnl.tmp"), None);
        assert!(is_temp_name("segment-00000001.jrnl.tmp"));
    }
}
