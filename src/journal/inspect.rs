//! A read-only look at a journal directory, for operators.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::record::RecordKind;
use super::recover::{list_dir, read_segment};
use super::segment::{HeaderRead, ScanStop, SegmentState};
use super::JournalError;

/// What a segment file is, as far as its header says.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SegmentStatus {
    /// All zeroes: never initialised (recovery puts it in the pool).
    Uninitialised,
    /// A valid header in this state.
    State(SegmentState),
    /// A header of another format version.
    OtherVersion(u16),
    /// Not a journal segment.
    NotASegment,
    /// A damaged header.
    Damaged(&'static str),
}

/// One segment file.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SegmentInfo {
    /// File name.
    pub file: String,
    /// Length of the file in bytes.
    pub len: u64,
    /// What its header says.
    pub status: SegmentStatus,
    /// `cluster/member` from the header, if valid.
    pub owner: Option<String>,
    /// Generation from the header, if valid.
    pub generation: u64,
    /// Offset just past the last valid record (active and sealed segments).
    pub end: u64,
    /// Valid records by kind.
    pub records: BTreeMap<RecordKind, u64>,
    /// Why reading stopped early, if it did (a torn tail or corruption), and where.
    pub stopped: Option<(u64, &'static str)>,
}

impl SegmentInfo {
    /// Whether recovery would treat this file as part of the empty-file pool.
    pub fn in_pool(&self) -> bool {
        matches!(
            self.status,
            SegmentStatus::Uninitialised | SegmentStatus::State(SegmentState::Empty)
        )
    }

    /// Total valid records.
    pub fn record_count(&self) -> u64 {
        self.records.values().sum()
    }
}

/// What is on disk in a journal directory. Its `Display` is a table.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct JournalInspection {
    /// The directory.
    pub dir: PathBuf,
    /// Every segment file, by file name.
    pub segments: Vec<SegmentInfo>,
    /// Leftover temporary files of an interrupted segment creation.
    pub temp_files: Vec<PathBuf>,
}

impl JournalInspection {
    /// Files in the empty-file pool (empty or uninitialised).
    pub fn pool(&self) -> impl Iterator<Item = &SegmentInfo> {
        self.segments.iter().filter(|s| s.in_pool())
    }
}

/// Lists the segments of the journal in `dir`, their states, record counts and the pool.
/// Reads only; changes nothing. `cargo run --example journal_inspect -- DIR` prints it.
///
/// ```
/// use std::time::Duration;
/// use cohort::{FsyncPolicy, Node};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = std::env::temp_dir().join(format!("cohort-doc-inspect-{}", std::process::id()));
/// let node = Node::builder("alpha")
///     .cluster("docs")
///     .peer("beta", "127.0.0.1:9") // not up: the message waits in the journal
///     .journal(&dir)
///     .journal_fsync(FsyncPolicy::Interval(Duration::from_millis(100)))
///     .journal_segment_size(64 << 10)
///     .start()?;
/// node.send("beta", &b"kept for beta"[..])?;
/// node.shutdown(Duration::from_secs(5))?;
/// let journal = cohort::inspect_journal(&dir)?;
/// let records: u64 = journal.segments.iter().map(|s| s.record_count()).sum();
/// assert!(records >= 1);
/// assert!(journal.temp_files.is_empty());
/// println!("{journal}"); // one row per segment file: state, generation, records
/// std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
pub fn inspect(dir: impl AsRef<Path>) -> Result<JournalInspection, JournalError> {
    let dir = dir.as_ref();
    let (ids, temp_files) = list_dir(dir)?;
    let mut segments = Vec::new();
    for id in ids {
        let found = read_segment(dir, id)?;
        let file = found
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (status, owner, generation) = match &found.header {
            HeaderRead::Uninitialised => (SegmentStatus::Uninitialised, None, 0),
            HeaderRead::NotASegment => (SegmentStatus::NotASegment, None, 0),
            HeaderRead::OtherVersion(v) => (SegmentStatus::OtherVersion(*v), None, 0),
            HeaderRead::Damaged(r) => (SegmentStatus::Damaged(r), None, 0),
            HeaderRead::Valid(h) => (
                SegmentStatus::State(h.state),
                Some(h.identity.to_string()),
                h.generation,
            ),
        };
        let mut records = BTreeMap::new();
        let (mut end, mut stopped) = (0, None);
        if let Some(scan) = &found.scan {
            for r in &scan.records {
                *records.entry(r.kind()).or_insert(0) += 1;
            }
            end = scan.end;
            if let ScanStop::Invalid { offset, reason } = scan.stop {
                stopped = Some((offset, reason));
            }
        }
        segments.push(SegmentInfo {
            file,
            len: found.len,
            status,
            owner,
            generation,
            end,
            records,
            stopped,
        });
    }
    Ok(JournalInspection {
        dir: dir.to_path_buf(),
        segments,
        temp_files,
    })
}

impl fmt::Display for SegmentStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SegmentStatus::Uninitialised => f.pad("uninitialised"),
            SegmentStatus::State(SegmentState::Empty) => f.pad("empty"),
            SegmentStatus::State(SegmentState::Active) => f.pad("active"),
            SegmentStatus::State(SegmentState::Sealed) => f.pad("sealed"),
            SegmentStatus::OtherVersion(v) => f.pad(&format!("version {v}")),
            SegmentStatus::NotASegment => f.pad("not a segment"),
            SegmentStatus::Damaged(_) => f.pad("damaged"),
        }
    }
}

impl fmt::Display for JournalInspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "journal {}", self.dir.display())?;
        writeln!(
            f,
            "{:<24} {:<13} {:>5} {:>10} {:>10} {:>8} {:>6} {:>6} {:>6} {:>5}  note",
            "file", "state", "gen", "size", "used", "records", "msg", "ack", "dlv", "ckpt"
        )?;
        for s in &self.segments {
            let n = |k| s.records.get(&k).copied().unwrap_or(0);
            let note = match (&s.status, s.stopped) {
                (SegmentStatus::Damaged(r), _) => (*r).to_string(),
                (_, Some((off, r))) => format!("stops at {off}: {r}"),
                _ => String::new(),
            };
            writeln!(
                f,
                "{:<24} {:<13} {:>5} {:>10} {:>10} {:>8} {:>6} {:>6} {:>6} {:>5}  {}",
                s.file,
                s.status,
                s.generation,
                s.len,
                s.end,
                s.record_count(),
                n(RecordKind::Message),
                n(RecordKind::Acked),
                n(RecordKind::Delivered),
                n(RecordKind::Checkpoint),
                note
            )?;
        }
        let pool: Vec<&str> = self.pool().map(|s| s.file.as_str()).collect();
        writeln!(f, "pool: {} file(s) {}", pool.len(), pool.join(" "))?;
        if let Some(owner) = self.segments.iter().find_map(|s| s.owner.as_deref()) {
            writeln!(f, "owner: {owner}")?;
        }
        for t in &self.temp_files {
            writeln!(
                f,
                "leftover temp file (deleted at next open): {}",
                t.display()
            )?;
        }
        Ok(())
    }
}
