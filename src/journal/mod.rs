//! The durable outbox: a journal of preallocated, recycled segment files.
//!
//! A [`Journal`] records, for one member, each reliable outgoing message before it is
//! published ([`Record::Message`]), the acks that retire them ([`Record::Acked`]) and how far
//! the application has consumed each peer's stream ([`Record::Delivered`]). After a restart,
//! [`Journal::open`] hands back, per peer, the unacknowledged messages in order and the
//! counters to resume from ([`Recovered`]).
//!
//! The journal is single-threaded by design: one owner at a time (the journal's writer
//! thread, or the IO thread's turn appending a small batch inline) appends batches from
//! many peers, and group commit turns each batch into one write and at most one fsync.
//!
//! # Files
//!
//! A journal directory holds `segment-NNNNNNNN.jrnl` files of a fixed size
//! ([`JournalConfig::segment_size`], 16 MiB by default), fully written when created (not
//! sparse). A file is created under the name `segment-NNNNNNNN.jrnl.tmp`, written to its full
//! size, synced, renamed into place, and the directory is synced, so a crash never leaves a
//! half-made segment; leftover `.tmp` files are deleted at recovery. Beside the segments, a
//! `launch-id` file (16 hex digits and a newline, written the same careful way) keeps the
//! owner's launch id across restarts ([`Journal::launch_id`]). Files are never deleted
//! by the journal: a segment whose records are all retired goes back to the **empty-file
//! pool** (its header reset), and a new segment is always taken from the pool first. A file
//! is created only when the pool is empty, so the number of files is the high-water mark of
//! segments in use, and restarting never adds one.
//!
//! # Segment header (1024 bytes, integers little-endian)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `COHORTJL` |
//! | 8 | 2 | format version (`2`) |
//! | 10 | 1 | state: `1` empty, `2` active, `3` sealed |
//! | 11 | 1 | zero |
//! | 12 | 4 | CRC32 of the 1024 header bytes with this field zeroed |
//! | 16 | 8 | capacity: the file's length in bytes |
//! | 24 | 8 | generation: the segment's place in the journal (empty: the last one it held) |
//! | 32 | 8 | end: offset just past the last record (sealed only, else 0) |
//! | 40 | 8 | record count (sealed only, else 0) |
//! | 48 | 16 | zero |
//! | 64 | 1 + 255 | owning member's name: length byte, UTF-8 bytes |
//! | 320 | 1 + 255 | cluster name: length byte, UTF-8 bytes |
//! | 576 | 448 | zero |
//!
//! An all-zero header is an *uninitialised* file. Only the fields in the first 48 bytes
//! change after creation, so a header rewrite stays within one sector.
//!
//! # Record framing (from offset 1024)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | CRC32 of: the segment generation (8 bytes, not stored), then bytes 4.. of the frame |
//! | 4 | 4 | body length `n` |
//! | 8 | 1 | kind: `1` message, `2` acked, `3` delivered, `4` checkpoint, `5` bound |
//! | 9 | 3 | zero |
//! | 12 | n | body |
//!
//! Bodies (names are `u16` length + UTF-8, at most 255 bytes):
//! message `name, seq: u64, flags: u8, payload (rest)`; acked `name, up_to: u64, credit:
//! u64`; delivered `name, count: u64, credit: u64, unreliable: u64`; bound `name, launch: u64`; checkpoint
//! `n: u32, n × (name, sent, acked, delivered, credit, launch, credit_seen, published,
//! epoch, unreliable: u64 each)`. A zero frame header marks the end of the records. Because the CRC mixes
//! in the generation, records left from a segment's earlier life never validate, and a
//! recycled segment needs no zeroing.
//!
//! # Segment states
//!
//! ```text
//!            create (tmp, fill, sync, rename, sync dir)
//!                 │
//!                 ▼
//!   ┌──────────► Empty ──── take from pool ────► Active ─── full: seal ───► Sealed
//!   │          (the pool)   (new generation,   (appended to)  (end, count     │
//!   │                        checkpoint first)                  in header)    │
//!   └──────────── every message retired, and a newer checkpoint exists ───────┘
//! ```
//!
//! Rotation, in order: seal the active segment (header with its end) and, unless the policy is
//! [`FsyncPolicy::Never`], fsync it; take a segment from the pool (or create one); write its
//! active header and a [`Record::Checkpoint`] of every peer's counters in one write, and fsync
//! it. A segment is *retired* when each of its messages has `seq <= acked` for its peer and a
//! newer segment starts with a checkpoint: its counters then live on in that checkpoint (a
//! segment whose activation was torn by a crash has none, and protects the older ones). A segment
//! holding an unacked message stays until that message is acked, so a peer that never acks
//! pins its segments (bounded by the send window in practice).
//!
//! # Recovery rules
//!
//! 1. `.tmp` files are deleted. Every segment is read and verified (in parallel with rayon).
//! 2. A header of another format version, of another member or cluster, with bad magic or a
//!    bad checksum is an error, reported before anything on disk is changed.
//! 3. Uninitialised (all-zero) and empty segments go to the pool.
//! 4. Active and sealed segments are ordered by generation. A sealed segment must hold valid
//!    records up to its `end`; an invalid record before it (corruption, truncation) cuts the
//!    journal there: the records before it survive, the later segments are discarded to the
//!    pool and listed in [`RecoveryReport::discarded`]. The newest active segment is read
//!    until its first zero or invalid frame (a torn tail, or stale bytes of its earlier
//!    life); the rest of the segment is zeroed and never replayed, and the next append goes
//!    there. An older active segment (a crash between two rotation steps) is sealed where
//!    its records end.
//! 5. Records are replayed in order. Counters take the maximum of what they see; messages
//!    with `seq > acked` are returned, per peer, in sequence order.
//! 6. Fully retired segments go to the pool. No file is created during recovery.
//!
//! # Errors
//!
//! Every disk failure is a [`JournalError`]; nothing the disk can do panics. After an error
//! from [`Journal::append`] or a sync, the in-memory state may be ahead of the disk: drop the
//! journal and open it again, which recovers what is actually there.
//!
//! # JournalGate
//!
//! With [`FsyncPolicy::EveryBatch`] a batch is on disk when [`Journal::append`] returns;
//! with [`FsyncPolicy::Interval`] at most that long after (the journal writer thread syncs
//! when the interval is due, appends or not); with [`FsyncPolicy::Never`] records survive a
//! process crash (they are in the page cache) but not an OS crash.

mod error;
mod inspect;
mod launch;
mod pool;
mod record;
mod recover;
mod segment;
mod writer;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use error::JournalError;
pub use inspect::{inspect, JournalInspection, SegmentInfo, SegmentStatus};
pub use record::{PeerCounters, Record, RecordKind, FRAME_HEADER};
pub use recover::{Cut, JournalMessage, Recovered, RecoveredPeer, RecoveryReport, SeqGap};
pub use segment::{SegmentState, FORMAT_VERSION, HEADER_LEN};
pub use writer::{JournalWriter, Store, WriterMarks};

use pool::SegmentPool;
use record::MAX_PEER_NAME;
use segment::{Header, Identity, SegmentFile, MAX_IDENTITY_NAME};

/// Default segment size: 16 MiB.
pub const DEFAULT_SEGMENT_SIZE: u64 = 16 << 20;
/// Smallest segment size accepted.
pub const MIN_SEGMENT_SIZE: u64 = 8 << 10;
/// Largest segment size accepted.
pub const MAX_SEGMENT_SIZE: u64 = 1 << 31;

/// The smallest frame any record can take (an ack with an empty name).
const MIN_FRAME: u64 = (FRAME_HEADER + 2 + 8) as u64;

/// The most bytes of frames [`Journal::append_inline`] writes: a round trip's few records,
/// not a bulk sender's batch (that one is the writer thread's, in one group commit).
pub(crate) const INLINE_MAX: u64 = 8 * 1024;

/// When the journal forces what it wrote to disk ([`Builder::journal_fsync`]).
///
/// The journal thread writes each batch of records (every message sent, acknowledgement and
/// delivery count of one turn of the IO thread, and all batches waiting at once); a message
/// leaves for its peer only once its batch is written, and delivery progress is
/// acknowledged to the sender only once it is durable under the policy.
///
/// ```
/// use std::time::Duration;
/// use cohort::{FsyncPolicy, Node};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = std::env::temp_dir().join(format!("cohort-doc-fsync-{}", std::process::id()));
/// let node = Node::builder("alpha")
///     .cluster("docs")
///     .journal(&dir)
///     // Survives a process crash at once, an OS crash up to 5 ms back.
///     .journal_fsync(FsyncPolicy::Interval(Duration::from_millis(5)))
///     .journal_segment_size(64 << 10)
///     .start()?;
/// node.sync_journal(Duration::from_secs(5))?; // what is journalled now is on disk
/// node.shutdown(Duration::from_secs(5))?;
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
///
/// [`Builder::journal_fsync`]: crate::Builder::journal_fsync
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FsyncPolicy {
    /// An fsync after every write: what was written survives an OS crash or power loss.
    /// The slowest: every message waits for the disk.
    EveryBatch,
    /// An fsync when this long has passed since the last one (the journal thread syncs on
    /// its own once the interval is due): an OS crash loses at most that much.
    Interval(Duration),
    /// Never fsync on its own ([`Node::sync_journal`] does): survives a process crash (the
    /// records are in the page cache), not an OS crash.
    ///
    /// [`Node::sync_journal`]: crate::Node::sync_journal
    Never,
}

/// How to open a journal.
#[derive(Clone, Debug)]
pub struct JournalConfig {
    dir: PathBuf,
    cluster: String,
    member: String,
    segment_size: u64,
    fsync: FsyncPolicy,
}

impl JournalConfig {
    /// A journal in `dir` owned by `member`, with 16 MiB segments, fsync on every batch and
    /// an empty cluster name.
    pub fn new(dir: impl Into<PathBuf>, member: impl Into<String>) -> Self {
        JournalConfig {
            dir: dir.into(),
            cluster: String::new(),
            member: member.into(),
            segment_size: DEFAULT_SEGMENT_SIZE,
            fsync: FsyncPolicy::EveryBatch,
        }
    }

    /// The cluster name recorded in (and checked against) every segment header.
    pub fn cluster(mut self, cluster: impl Into<String>) -> Self {
        self.cluster = cluster.into();
        self
    }

    /// The size of new segment files, in bytes.
    pub fn segment_size(mut self, bytes: u64) -> Self {
        self.segment_size = bytes;
        self
    }

    /// The fsync policy.
    pub fn fsync(mut self, policy: FsyncPolicy) -> Self {
        self.fsync = policy;
        self
    }
}

/// Counters of what a journal has done since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct JournalStats {
    /// Batches of records written (each holding at least one record).
    pub appends: u64,
    /// Records appended.
    pub records: u64,
    /// Writes of record data (one per batch, one more per segment a batch spills into).
    pub writes: u64,
    /// Bytes of record data written.
    pub bytes_written: u64,
    /// Header writes (rotation, sealing, recycling).
    pub header_writes: u64,
    /// fsync calls on segment files.
    pub fsyncs: u64,
    /// Segment files created.
    pub segments_created: u64,
    /// Segments taken from the pool.
    pub segments_reused: u64,
    /// Segments retired into the pool while open.
    pub segments_recycled: u64,
    /// Segments holding live records now.
    pub live_segments: usize,
    /// Segments in the pool now.
    pub pool: usize,
}

/// A segment holding live records.
#[derive(Debug)]
pub(crate) struct LiveSegment {
    pub(crate) file: SegmentFile,
    pub(crate) capacity: u64,
    pub(crate) generation: u64,
    pub(crate) state: SegmentState,
    /// Offset just past the last record.
    pub(crate) end: u64,
    pub(crate) records: u64,
    /// Per peer, the highest seq of a message in this segment.
    pub(crate) pins: BTreeMap<String, u64>,
    /// Written since the last fsync began.
    pub(crate) dirty: bool,
    /// Its first record is a checkpoint (true of every segment but one whose activation
    /// was torn by a crash): older segments' counters are then safe to drop.
    pub(crate) checkpointed: bool,
    /// Records read at recovery, waiting to be replayed.
    pub(crate) pending: Option<Vec<Record>>,
}

/// Takes every fully retired segment out of `live`, keeping any at or after the newest
/// checkpointed segment (nothing newer holds their counters yet).
pub(crate) fn take_retired(
    live: &mut Vec<LiveSegment>,
    counters: &BTreeMap<String, PeerCounters>,
) -> Vec<LiveSegment> {
    let covered = live.iter().rposition(|s| s.checkpointed).unwrap_or(0);
    let mut retired = Vec::new();
    let mut i = 0;
    let mut limit = covered;
    while i < limit {
        if live[i].is_retired(counters) {
            retired.push(live.remove(i));
            limit -= 1;
        } else {
            i += 1;
        }
    }
    retired
}

impl LiveSegment {
    /// Every message in it is acknowledged.
    pub(crate) fn is_retired(&self, counters: &BTreeMap<String, PeerCounters>) -> bool {
        self.pins
            .iter()
            .all(|(peer, &max)| counters.get(peer).is_some_and(|c| c.acked >= max))
    }

    fn room(&self) -> u64 {
        self.capacity - self.end
    }
}

/// Applies a record to the counters and to the pins of the segment holding it. Returns
/// the peers whose stream it reset — a [`Record::Bound`] reset, or a checkpoint of a newer
/// epoch than what was replayed so far (the reset's own segment was recycled): the caller
/// then unpins their messages in every other segment ([`unpin`]) and forgets them.
pub(crate) fn apply(
    counters: &mut BTreeMap<String, PeerCounters>,
    pins: &mut BTreeMap<String, u64>,
    record: &Record,
) -> Vec<String> {
    let mut reset = Vec::new();
    // Looked up before inserting: a record per message must not allocate a name.
    fn entry<'a>(
        counters: &'a mut BTreeMap<String, PeerCounters>,
        peer: &str,
    ) -> &'a mut PeerCounters {
        if !counters.contains_key(peer) {
            counters.insert(
                peer.to_owned(),
                PeerCounters {
                    peer: peer.to_owned(),
                    ..PeerCounters::default()
                },
            );
        }
        counters.get_mut(peer).expect("just inserted")
    }
    match record {
        Record::Message {
            peer,
            seq,
            flags,
            payload,
        } => {
            let c = entry(counters, peer);
            c.sent = c.sent.max(*seq);
            c.published += crate::flow::frame_cost(*flags, payload);
            match pins.get_mut(&**peer) {
                Some(pin) => *pin = (*pin).max(*seq),
                None => {
                    pins.insert(peer.to_string(), *seq);
                }
            }
        }
        Record::Acked {
            peer,
            up_to,
            credit,
        } => {
            let c = entry(counters, peer);
            c.acked = c.acked.max(*up_to);
            c.credit_seen = c.credit_seen.max(*credit);
        }
        Record::Delivered {
            peer,
            count,
            credit,
            unreliable,
        } => {
            let c = entry(counters, peer);
            c.delivered = c.delivered.max(*count);
            c.credit = c.credit.max(*credit);
            c.unreliable = c.unreliable.max(*unreliable);
        }
        Record::Bound { peer, launch } => {
            let c = entry(counters, peer);
            if *launch == 0 || (c.launch != 0 && c.launch != *launch) {
                *c = PeerCounters {
                    peer: peer.to_string(),
                    epoch: c.epoch + 1,
                    ..PeerCounters::default()
                };
                pins.remove(&**peer);
                reset.push(peer.to_string());
            }
            c.launch = *launch;
        }
        Record::Checkpoint { peers } => {
            for p in peers {
                let c = entry(counters, &p.peer);
                if p.epoch > c.epoch {
                    // The reset happened in a segment recycled since: the checkpoint's
                    // counters replace what older segments said of the old stream.
                    *c = p.clone();
                    pins.remove(&p.peer);
                    reset.push(p.peer.clone());
                    continue;
                }
                if p.epoch < c.epoch {
                    continue;
                }
                c.published = c.published.max(p.published);
                c.unreliable = c.unreliable.max(p.unreliable);
                c.sent = c.sent.max(p.sent);
                c.acked = c.acked.max(p.acked);
                c.delivered = c.delivered.max(p.delivered);
                c.credit = c.credit.max(p.credit);
                c.launch = p.launch;
                c.credit_seen = c.credit_seen.max(p.credit_seen);
            }
        }
    }
    reset
}

/// After a [`Record::Bound`] reset `peer`: its messages in every segment are retired.
pub(crate) fn unpin(live: &mut [LiveSegment], peer: &str) {
    for seg in live {
        seg.pins.remove(peer);
    }
}

/// A member's journal. The module docs (`src/journal/mod.rs`) give the format and the rules.
#[derive(Debug)]
pub struct Journal {
    /// The owner's launch id, kept across restarts (see [`Journal::launch_id`]).
    launch_id: u64,
    dir: PathBuf,
    identity: Identity,
    segment_size: u64,
    fsync: FsyncPolicy,
    /// In generation order; the last one is the active segment when its state is `Active`.
    live: Vec<LiveSegment>,
    pool: SegmentPool,
    counters: BTreeMap<String, PeerCounters>,
    next_generation: u64,
    next_file_id: u64,
    buf: Vec<u8>,
    last_sync: Instant,
    stats: JournalStats,
}

impl Journal {
    /// Opens (creating if needed) the journal described by `config` and recovers it.
    ///
    /// Returns the journal, positioned to append after the last valid record, and what it
    /// holds: per peer the unacked messages in order and the counters to resume from.
    pub fn open(config: JournalConfig) -> Result<(Journal, Recovered), JournalError> {
        if !(MIN_SEGMENT_SIZE..=MAX_SEGMENT_SIZE).contains(&config.segment_size) {
            return Err(JournalError::BadSegmentSize {
                size: config.segment_size,
                min: MIN_SEGMENT_SIZE,
                max: MAX_SEGMENT_SIZE,
            });
        }
        for name in [&config.member, &config.cluster] {
            check_name(name, MAX_IDENTITY_NAME)?;
        }
        let identity = Identity {
            cluster: config.cluster.clone(),
            member: config.member.clone(),
        };
        let opened = recover::recover(&config.dir, &identity, config.segment_size)?;
        let launch_id = launch::load_or_create(&config.dir)?;
        let mut journal = Journal {
            launch_id,
            dir: config.dir,
            identity,
            segment_size: config.segment_size,
            fsync: config.fsync,
            live: opened.live,
            pool: opened.pool,
            counters: opened.counters,
            next_generation: opened.next_generation,
            next_file_id: opened.next_file_id,
            buf: Vec::new(),
            last_sync: Instant::now(),
            stats: JournalStats::default(),
        };
        journal.refresh_stats();
        Ok((journal, opened.recovered))
    }

    /// Appends a batch of records (from any number of peers) as one write, then syncs if the
    /// fsync policy says so. The batch is checked first: if any record is refused, nothing is
    /// written. A batch that does not fit in the active segment continues in the next one.
    pub fn append(&mut self, records: &[Record]) -> Result<(), JournalError> {
        self.append_at(records, Instant::now())
    }

    /// [`append`](Self::append) with the current time given, for the
    /// [`FsyncPolicy::Interval`] check.
    pub fn append_at(&mut self, records: &[Record], now: Instant) -> Result<(), JournalError> {
        self.append_batch(records, now)?;
        if let FsyncPolicy::Interval(every) = self.fsync {
            if !records.is_empty() && now.saturating_duration_since(self.last_sync) >= every {
                self.sync_at(now)?;
            }
        }
        Ok(())
    }

    /// The writer thread's append: [`append_at`](Self::append_at) without the interval's
    /// sync, which the writer runs outside the journal's lock
    /// ([`begin_sync`](Self::begin_sync)). Under [`FsyncPolicy::EveryBatch`] the batch is
    /// synced with its write.
    pub(crate) fn append_batch(
        &mut self,
        records: &[Record],
        now: Instant,
    ) -> Result<(), JournalError> {
        if records.is_empty() {
            return Ok(());
        }
        self.check_batch(records)?;
        self.write_batch(records)?;
        if self.active().is_some_and(|s| s.room() < MIN_FRAME) {
            // Exactly (or all but) full: move on now, so the next batch has a segment.
            self.rotate()?;
        }
        self.recycle_retired()?;
        if self.fsync == FsyncPolicy::EveryBatch {
            self.sync_at(now)?;
        }
        self.refresh_stats();
        Ok(())
    }

    /// Appends a small batch only if that takes one write to the active segment and
    /// nothing else: no segment to seal or take from the pool (the batch fits, and leaves
    /// room for another frame), no sync with it (never under [`FsyncPolicy::EveryBatch`]),
    /// at most [`INLINE_MAX`] bytes of frames. `Ok(false)`, with nothing written, when it
    /// would take more: [`append_at`](Self::append_at) does it then. Under
    /// [`FsyncPolicy::Interval`] the batch waits for the writer's next sync, as every
    /// append does. Retired segments are recycled by the next `append_at`.
    pub fn append_inline(&mut self, records: &[Record]) -> Result<bool, JournalError> {
        if self.fsync == FsyncPolicy::EveryBatch {
            return Ok(false);
        }
        let bytes = records.iter().map(Record::frame_len).sum::<usize>() as u64;
        let fits = self.active().is_some_and(|s| s.room() >= bytes + MIN_FRAME);
        if bytes > INLINE_MAX || !fits {
            return Ok(false);
        }
        if records.is_empty() {
            return Ok(true);
        }
        self.check_batch(records)?;
        self.write_batch(records)?;
        self.refresh_stats();
        Ok(true)
    }

    /// Writes `records` (checked) after the active segment's end, continuing in a new
    /// segment where one is full.
    fn write_batch(&mut self, records: &[Record]) -> Result<(), JournalError> {
        self.stats.appends += 1;
        let mut i = 0;
        while i < records.len() {
            let needed = records[i].frame_len() as u64;
            if self.active().is_none_or(|s| s.room() < needed) {
                self.rotate()?;
            }
            let last = self.live.len() - 1;
            let (older, active) = self.live.split_at_mut(last);
            let seg = &mut active[0];
            self.buf.clear();
            let mut n = 0;
            while let Some(r) = records.get(i) {
                if seg.room() < (self.buf.len() + r.frame_len()) as u64 {
                    break;
                }
                r.encode(seg.generation, &mut self.buf);
                for peer in apply(&mut self.counters, &mut seg.pins, r) {
                    unpin(older, &peer);
                }
                i += 1;
                n += 1;
            }
            seg.file.write_at(seg.end, &self.buf)?;
            seg.end += self.buf.len() as u64;
            seg.records += n;
            seg.dirty = true;
            self.stats.writes += 1;
            self.stats.records += n;
            self.stats.bytes_written += self.buf.len() as u64;
        }
        Ok(())
    }

    /// Forces every written record to disk now, whatever the policy.
    pub fn sync(&mut self) -> Result<(), JournalError> {
        self.sync_at(Instant::now())
    }

    /// The launch id of the member that owns this journal: made when the journal is
    /// created, then kept in its `launch-id` file. A member that journals presents the same
    /// launch id after a restart, so its peers continue its message streams rather than
    /// treating it as a new incarnation.
    pub fn launch_id(&self) -> u64 {
        self.launch_id
    }

    /// The counters of one peer as journalled so far.
    #[cfg(test)]
    pub fn peer(&self, peer: &str) -> Option<&PeerCounters> {
        self.counters.get(peer)
    }

    /// The fsync policy it was opened with.
    pub fn fsync_policy(&self) -> FsyncPolicy {
        self.fsync
    }

    /// Whether records have been written since the last fsync began (a sync in progress
    /// counts its files clean: see [`begin_sync`](Self::begin_sync)).
    pub fn unsynced(&self) -> bool {
        self.live.iter().any(|s| s.dirty)
    }

    /// Time since the last fsync began (or since the journal was opened).
    pub(crate) fn since_sync(&self) -> Duration {
        self.last_sync.elapsed()
    }

    /// What the journal has done since it was opened.
    pub fn stats(&self) -> JournalStats {
        self.stats
    }

    /// Starts a sync of everything written so far, to be run outside the journal's lock:
    /// takes a handle on each segment written since the last sync and counts them synced
    /// from now, so that a write made while the sync runs is owed the next one
    /// ([`unsynced`](Self::unsynced) says so) and appends go on meanwhile. The caller runs
    /// [`PendingSync::run`] and, if it succeeds, hands it back to
    /// [`finish_sync`](Self::finish_sync). If it fails, what is on disk is unknown: the
    /// journal must not be written to again (the writer stops).
    pub(crate) fn begin_sync(&mut self, now: Instant) -> PendingSync {
        let files = self
            .live
            .iter_mut()
            .filter(|s| s.dirty)
            .map(|seg| {
                seg.dirty = false;
                seg.file.sync_handle()
            })
            .collect();
        self.last_sync = now;
        PendingSync { files }
    }

    /// Counts a sync begun by [`begin_sync`](Self::begin_sync) done.
    pub(crate) fn finish_sync(&mut self, done: PendingSync) {
        self.stats.fsyncs += done.files.len() as u64;
    }

    fn sync_at(&mut self, now: Instant) -> Result<(), JournalError> {
        let pending = self.begin_sync(now);
        pending.run()?;
        self.finish_sync(pending);
        Ok(())
    }

    fn active(&self) -> Option<&LiveSegment> {
        self.live.last().filter(|s| s.state == SegmentState::Active)
    }

    /// Refuses a batch holding a name that is too long or a record that would not fit in a
    /// fresh segment after its header and checkpoint.
    fn check_batch(&self, records: &[Record]) -> Result<(), JournalError> {
        let mut names: std::collections::BTreeSet<&str> =
            self.counters.keys().map(String::as_str).collect();
        for r in records {
            if let Some(name) = r.longest_name() {
                check_name(name, MAX_PEER_NAME)?;
            }
            match r {
                Record::Checkpoint { peers } => names.extend(peers.iter().map(|p| p.peer.as_str())),
                Record::Message { peer, .. }
                | Record::Acked { peer, .. }
                | Record::Delivered { peer, .. }
                | Record::Bound { peer, .. } => {
                    names.insert(peer);
                }
            }
        }
        let checkpoint = FRAME_HEADER
            + 4
            + names
                .iter()
                .map(|n| 2 + n.len() + record::CHECKPOINT_COUNTERS)
                .sum::<usize>();
        let capacity = self.segment_size as usize;
        let max = capacity.saturating_sub(HEADER_LEN + checkpoint);
        for r in records {
            if r.frame_len() > max {
                return Err(JournalError::RecordTooLarge {
                    size: r.frame_len(),
                    max,
                });
            }
        }
        Ok(())
    }

    /// Seals the active segment (if any) and activates a new one from the pool, or a new
    /// file only if the pool is empty.
    fn rotate(&mut self) -> Result<(), JournalError> {
        let sync = self.fsync != FsyncPolicy::Never;
        if let Some(seg) = self
            .live
            .last_mut()
            .filter(|s| s.state == SegmentState::Active)
        {
            seg.state = SegmentState::Sealed;
            seg.file.write_header(&Header {
                state: SegmentState::Sealed,
                capacity: seg.capacity,
                generation: seg.generation,
                end: seg.end,
                records: seg.records,
                identity: self.identity.clone(),
            })?;
            self.stats.header_writes += 1;
            if sync {
                seg.file.sync()?;
                seg.dirty = false;
                self.stats.fsyncs += 1;
            }
        }
        let mut file = match self.pool.take() {
            Some(pooled) => {
                self.stats.segments_reused += 1;
                let mut file = pooled.file;
                if pooled.capacity != self.segment_size {
                    file.resize(self.segment_size)?;
                }
                file
            }
            None => {
                let id = self.next_file_id;
                self.next_file_id += 1;
                self.stats.segments_created += 1;
                SegmentFile::create(
                    &self.dir,
                    id,
                    &pool::empty_header(&self.identity, self.segment_size, 0),
                )?
            }
        };
        let generation = self.next_generation;
        self.next_generation += 1;
        let header = Header {
            state: SegmentState::Active,
            capacity: self.segment_size,
            generation,
            end: 0,
            records: 0,
            identity: self.identity.clone(),
        };
        let mut bytes = header.encode();
        Record::Checkpoint {
            peers: self.counters.values().cloned().collect(),
        }
        .encode(generation, &mut bytes);
        file.write_at(0, &bytes)?;
        self.stats.header_writes += 1;
        if sync {
            file.sync()?;
            self.stats.fsyncs += 1;
        }
        self.live.push(LiveSegment {
            file,
            capacity: self.segment_size,
            generation,
            state: SegmentState::Active,
            end: bytes.len() as u64,
            records: 1,
            pins: BTreeMap::new(),
            dirty: !sync,
            checkpointed: true,
            pending: None,
        });
        Ok(())
    }

    /// Returns every fully retired segment older than the newest checkpoint to the pool.
    fn recycle_retired(&mut self) -> Result<(), JournalError> {
        for seg in take_retired(&mut self.live, &self.counters) {
            self.pool
                .recycle(seg.file, &self.identity, seg.capacity, seg.generation)?;
            self.stats.header_writes += 1;
            self.stats.segments_recycled += 1;
        }
        Ok(())
    }

    fn refresh_stats(&mut self) {
        self.stats.live_segments = self.live.len();
        self.stats.pool = self.pool.len();
    }
}

/// A sync of the journal's files begun under its lock ([`Journal::begin_sync`]), to run
/// without it: the writer thread's fsync, while the IO thread goes on appending.
#[derive(Debug)]
pub struct PendingSync {
    files: Vec<segment::SyncHandle>,
}

impl PendingSync {
    /// `fdatasync`s each file the sync covers: every record written before it began is on
    /// disk once this returns `Ok`.
    pub fn run(&self) -> Result<(), JournalError> {
        self.files.iter().try_for_each(segment::SyncHandle::sync)
    }
}

fn check_name(name: &str, max: usize) -> Result<(), JournalError> {
    if name.len() > max {
        return Err(JournalError::NameTooLong {
            name: name.chars().take(40).collect(),
            len: name.len(),
            max,
        });
    }
    Ok(())
}
