//! Recovery: read every segment (in parallel), validate, cut a torn tail, replay the records
//! in generation order, and put every uninitialised, discarded or fully retired segment back
//! in the pool.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::pool::{PooledSegment, SegmentPool};
use super::record::{PeerCounters, Record};
use super::segment::{
    is_temp_name, parse_file_name, scan_records, sync_dir, Header, HeaderRead, Identity, Scan,
    ScanStop, SegmentFile, SegmentState,
};
use super::{JournalError, LiveSegment};

/// A message that was journalled and not acknowledged when the journal was last closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalMessage {
    /// Its sequence number.
    pub seq: u64,
    /// Its wire flags.
    pub flags: u8,
    /// Its bytes.
    pub payload: Bytes,
}

/// What the journal knows about one peer after recovery.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveredPeer {
    /// Messages with `seq > counters.acked`, in sequence order. They are still journalled:
    /// resend them, do not append them again.
    pub unacked: Vec<JournalMessage>,
    /// Its counters as the replay left them (the same a checkpoint holds): continue the
    /// stream at `sent + 1`; `published` with `credit_seen` is what is still uncredited
    /// after a restart.
    pub counters: PeerCounters,
}

/// Where recovery stopped reading because a record was invalid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cut {
    /// The segment file.
    pub path: PathBuf,
    /// Offset of the first invalid byte; everything from here on was dropped.
    pub offset: u64,
    /// Why the record there was refused.
    pub reason: &'static str,
}

/// Sequence numbers missing from a peer's unacked messages (possible only after a cut in
/// the middle of the journal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqGap {
    /// The peer.
    pub peer: String,
    /// First missing sequence number.
    pub from: u64,
    /// Last missing sequence number.
    pub to: u64,
}

/// What recovery found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segments whose records were replayed.
    pub segments_replayed: usize,
    /// Records replayed.
    pub records_replayed: u64,
    /// The torn tail or corruption at which reading stopped, if any. At the tail of the
    /// active segment this is the normal trace of a crash (or of stale bytes of a recycled
    /// segment), and harmless.
    pub cut: Option<Cut>,
    /// Segments that came after a cut in the middle of the journal; their records were
    /// dropped and the files returned to the pool. Non-empty only after real corruption.
    pub discarded: Vec<PathBuf>,
    /// Segments put (back) in the pool by recovery: uninitialised, fully retired, discarded.
    pub returned_to_pool: usize,
    /// Interrupted segment creations (`*.jrnl.tmp`) deleted.
    pub temp_files_removed: usize,
    /// Holes in the unacked sequences.
    pub gaps: Vec<SeqGap>,
}

/// The recovered state handed to the caller of [`super::Journal::open`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Per peer: unacked messages and counters.
    pub peers: BTreeMap<String, RecoveredPeer>,
    /// What recovery found and did.
    pub report: RecoveryReport,
}

/// One segment file as read from disk.
#[derive(Debug)]
pub(crate) struct Found {
    pub(crate) id: u64,
    pub(crate) path: PathBuf,
    pub(crate) len: u64,
    pub(crate) header: HeaderRead,
    /// For an uninitialised header: whether the whole file is zeroes.
    pub(crate) all_zero: bool,
    /// Records of an active or sealed segment.
    pub(crate) scan: Option<Scan>,
}

/// Segment ids and leftover temporary files in `dir`.
pub(crate) fn list_dir(dir: &Path) -> Result<(Vec<u64>, Vec<PathBuf>), JournalError> {
    let mut ids = Vec::new();
    let mut temps = Vec::new();
    for entry in fs::read_dir(dir).map_err(JournalError::io(dir))? {
        let entry = entry.map_err(JournalError::io(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(id) = parse_file_name(name) {
            ids.push(id);
        } else if is_temp_name(name) {
            temps.push(entry.path());
        }
    }
    ids.sort_unstable();
    Ok((ids, temps))
}

/// Reads and scans one segment file.
pub(crate) fn read_segment(dir: &Path, id: u64) -> Result<Found, JournalError> {
    let path = dir.join(super::segment::file_name(id));
    let data = fs::read(&path).map_err(JournalError::io(&path))?;
    let header = Header::decode(&data);
    let all_zero = header == HeaderRead::Uninitialised && data.iter().all(|&b| b == 0);
    let scan = match &header {
        HeaderRead::Valid(h) if h.state != SegmentState::Empty => Some(scan_records(h, &data)),
        _ => None,
    };
    Ok(Found {
        id,
        path,
        len: data.len() as u64,
        header,
        all_zero,
        scan,
    })
}

/// Reads and scans every segment, in parallel where rayon is available.
pub(crate) fn read_segments(dir: &Path, ids: &[u64]) -> Result<Vec<Found>, JournalError> {
    #[cfg(not(loom))]
    {
        use rayon::prelude::*;
        ids.par_iter().map(|&id| read_segment(dir, id)).collect()
    }
    #[cfg(loom)]
    {
        ids.iter().map(|&id| read_segment(dir, id)).collect()
    }
}

/// The journal's state after recovery.
#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) live: Vec<LiveSegment>,
    pub(crate) pool: SegmentPool,
    pub(crate) counters: BTreeMap<String, PeerCounters>,
    pub(crate) next_generation: u64,
    pub(crate) next_file_id: u64,
    pub(crate) recovered: Recovered,
}

/// A segment with records, on its way through recovery.
struct Candidate {
    found: Found,
    header: Header,
    scan: Scan,
}

/// Recovers the journal in `dir` for `identity`. New and repaired pool segments get
/// `segment_size` bytes.
pub(crate) fn recover(
    dir: &Path,
    identity: &Identity,
    segment_size: u64,
) -> Result<Opened, JournalError> {
    fs::create_dir_all(dir).map_err(JournalError::io(dir))?;
    let (ids, temps) = list_dir(dir)?;
    let mut report = RecoveryReport::default();
    for tmp in &temps {
        fs::remove_file(tmp).map_err(JournalError::io(tmp))?;
        report.temp_files_removed += 1;
    }
    if !temps.is_empty() {
        sync_dir(dir)?;
    }
    let next_file_id = ids.last().map_or(1, |id| id + 1);
    let found = read_segments(dir, &ids)?;

    // Refuse before changing anything on disk.
    let mut next_generation = 1;
    for f in &found {
        match &f.header {
            HeaderRead::NotASegment => {
                return Err(JournalError::NotASegment {
                    path: f.path.clone(),
                })
            }
            HeaderRead::OtherVersion(v) => {
                return Err(JournalError::UnsupportedVersion {
                    path: f.path.clone(),
                    found: *v,
                    supported: super::segment::FORMAT_VERSION,
                })
            }
            HeaderRead::Damaged(reason) => {
                return Err(JournalError::DamagedHeader {
                    path: f.path.clone(),
                    reason,
                })
            }
            HeaderRead::Valid(h) if h.identity != *identity => {
                return Err(JournalError::ForeignMember {
                    path: f.path.clone(),
                    expected: identity.to_string(),
                    found: h.identity.to_string(),
                })
            }
            HeaderRead::Valid(h) => next_generation = next_generation.max(h.generation + 1),
            HeaderRead::Uninitialised => {}
        }
    }

    let mut pool = SegmentPool::default();
    let mut candidates = Vec::new();
    for f in found {
        match f.header.clone() {
            HeaderRead::Uninitialised => {
                // Qpid's leak: a file that was never initialised. It goes to the pool.
                let mut file = SegmentFile::open(dir, f.id)?;
                if !f.all_zero {
                    file.zero(0, f.len)?;
                }
                file.resize(segment_size)?;
                pool.recycle(file, identity, segment_size, 0)?;
                report.returned_to_pool += 1;
            }
            HeaderRead::Valid(h) if h.state == SegmentState::Empty => {
                let mut file = SegmentFile::open(dir, f.id)?;
                if f.len != h.capacity {
                    file.resize(h.capacity)?;
                }
                pool.put(PooledSegment {
                    file,
                    capacity: h.capacity,
                });
            }
            HeaderRead::Valid(h) => {
                let scan = f.scan.clone().unwrap_or_else(|| scan_records(&h, &[]));
                candidates.push(Candidate {
                    found: f,
                    header: h,
                    scan,
                });
            }
            _ => unreachable!("refused above"),
        }
    }
    candidates.sort_by_key(|c| (c.header.generation, c.found.id));

    // Decide how far the journal is valid.
    let count = candidates.len();
    let mut live: Vec<LiveSegment> = Vec::new();
    let mut discarded = Vec::new();
    for (k, c) in candidates.into_iter().enumerate() {
        if report.cut.is_some() {
            // A cut inside a sealed segment: everything after it is dropped.
            discarded.push(c);
            continue;
        }
        let is_last = k + 1 == count;
        let mut file = SegmentFile::open(dir, c.found.id)?;
        let mut header = c.header.clone();
        match (header.state, &c.scan.stop) {
            (SegmentState::Sealed, ScanStop::Invalid { offset, reason }) => {
                // Corruption inside sealed records: keep what precedes it, drop what follows.
                log::warn!(
                    "journal: {} is corrupt at offset {offset} ({reason}); later records are dropped",
                    c.found.path.display()
                );
                report.cut = Some(Cut {
                    path: c.found.path.clone(),
                    offset: *offset,
                    reason,
                });
                header.end = c.scan.end;
                header.records = c.scan.records.len() as u64;
                file.write_header(&header)?;
                if c.found.len < header.capacity {
                    file.resize(header.capacity)?;
                }
            }
            (SegmentState::Sealed, ScanStop::Clean) => {}
            (SegmentState::Active, stop) if is_last => {
                if let ScanStop::Invalid { offset, reason } = stop {
                    log::info!(
                        "journal: cut the tail of {} at offset {offset} ({reason})",
                        c.found.path.display()
                    );
                    report.cut = Some(Cut {
                        path: c.found.path.clone(),
                        offset: *offset,
                        reason,
                    });
                }
                if matches!(stop, ScanStop::Invalid { .. }) || c.found.len < header.capacity {
                    // Zero the torn tail so it can never be read again, and restore the size.
                    file.zero(c.scan.end, header.capacity)?;
                    file.resize(header.capacity)?;
                }
            }
            (SegmentState::Active, _) => {
                // A crash between activating the next segment and sealing this one: its
                // records end where the scan stopped.
                header.state = SegmentState::Sealed;
                header.end = c.scan.end;
                header.records = c.scan.records.len() as u64;
                file.write_header(&header)?;
                if c.found.len < header.capacity {
                    file.resize(header.capacity)?;
                }
            }
            (SegmentState::Empty, _) => unreachable!("pooled above"),
        }
        live.push(LiveSegment {
            file,
            capacity: header.capacity,
            generation: header.generation,
            state: header.state,
            end: c.scan.end,
            records: c.scan.records.len() as u64,
            pins: BTreeMap::new(),
            dirty: false,
            checkpointed: matches!(c.scan.records.first(), Some(Record::Checkpoint { .. })),
            pending: Some(c.scan.records),
        });
    }
    for c in discarded {
        let file = SegmentFile::open(dir, c.found.id)?;
        log::warn!(
            "journal: discarded {} (after a cut); returned to the pool",
            c.found.path.display()
        );
        report.discarded.push(c.found.path.clone());
        pool.recycle(file, identity, c.header.capacity, c.header.generation)?;
        report.returned_to_pool += 1;
    }

    // Replay in generation order.
    let mut counters: BTreeMap<String, PeerCounters> = BTreeMap::new();
    let mut messages: BTreeMap<String, BTreeMap<u64, JournalMessage>> = BTreeMap::new();
    for i in 0..live.len() {
        let (older, rest) = live.split_at_mut(i);
        let seg = &mut rest[0];
        let records = seg.pending.take().unwrap_or_default();
        report.segments_replayed += 1;
        report.records_replayed += records.len() as u64;
        for record in records {
            for peer in super::apply(&mut counters, &mut seg.pins, &record) {
                // Reset: the peer's earlier messages are retired, never resent.
                super::unpin(older, &peer);
                messages.remove(&peer);
            }
            if let Record::Message {
                peer,
                seq,
                flags,
                payload,
            } = record
            {
                messages.entry(peer.to_string()).or_default().insert(
                    seq,
                    JournalMessage {
                        seq,
                        flags,
                        payload,
                    },
                );
            }
        }
    }

    // Fully retired segments whose counters a newer checkpoint holds.
    for seg in super::take_retired(&mut live, &counters) {
        pool.recycle(seg.file, identity, seg.capacity, seg.generation)?;
        report.returned_to_pool += 1;
    }

    let mut peers = BTreeMap::new();
    for (name, c) in &counters {
        let unacked: Vec<JournalMessage> = messages
            .remove(name)
            .unwrap_or_default()
            .into_values()
            .filter(|m| m.seq > c.acked)
            .collect();
        let mut expect = c.acked + 1;
        for m in &unacked {
            if m.seq > expect {
                report.gaps.push(SeqGap {
                    peer: name.clone(),
                    from: expect,
                    to: m.seq - 1,
                });
            }
            expect = m.seq + 1;
        }
        if expect <= c.sent && c.sent > c.acked {
            report.gaps.push(SeqGap {
                peer: name.clone(),
                from: expect,
                to: c.sent,
            });
        }
        peers.insert(
            name.clone(),
            RecoveredPeer {
                unacked,
                counters: c.clone(),
            },
        );
    }
    Ok(Opened {
        live,
        pool,
        counters,
        next_generation,
        next_file_id,
        recovered: Recovered { peers, report },
    })
}
