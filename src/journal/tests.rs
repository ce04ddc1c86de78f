//! Tests of the journal as a whole: restarts, the pool, corruption, group commit.

use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::segment::{file_name, HEADER_LEN};
use super::*;

const SEG: u64 = 64 * 1024;

/// A directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!(
            "cohort-journal-{name}-{}-{nanos}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn config(dir: &Path) -> JournalConfig {
    JournalConfig::new(dir, "alpha")
        .cluster("test")
        .segment_size(SEG)
        .fsync(FsyncPolicy::Never)
}

fn open(dir: &Path) -> (Journal, Recovered) {
    Journal::open(config(dir)).expect("open journal")
}

fn msg(peer: &str, seq: u64, len: usize) -> Record {
    Record::Message {
        peer: peer.into(),
        seq,
        flags: 2,
        payload: Bytes::from(vec![(seq % 251) as u8; len]),
    }
}

fn acked(peer: &str, up_to: u64) -> Record {
    Record::Acked {
        peer: peer.into(),
        up_to,
        credit: up_to * 100,
    }
}

fn delivered(peer: &str, count: u64) -> Record {
    Record::Delivered {
        peer: peer.into(),
        count,
        credit: count * 10,
        unreliable: count,
    }
}

fn segment_files(dir: &Path) -> usize {
    fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            segment::parse_file_name(name.to_str().unwrap()).is_some()
        })
        .count()
}

fn seqs(r: &Recovered, peer: &str) -> Vec<u64> {
    r.peers
        .get(peer)
        .map(|p| p.unacked.iter().map(|m| m.seq).collect())
        .unwrap_or_default()
}

fn active_path(j: &Journal) -> PathBuf {
    j.live.last().unwrap().file.path.clone()
}

fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    let mut f = OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(bytes).unwrap();
}

fn xor_byte(path: &Path, offset: u64) {
    let data = fs::read(path).unwrap();
    patch(path, offset, &[data[offset as usize] ^ 0x5a]);
}

/// The Qpid linearstore leak, in our terms: the last segment ends exactly full and a fresh
/// segment has been added; 50 restarts never add a file, and the pool keeps the unused ones.
#[test]
fn qpid_reproducer_restarts_never_grow_the_file_count() {
    let dir = TempDir::new("qpid");
    let (mut j, _) = open(dir.path());
    // Five segments' worth, then most of it acked so that segments go back to the pool.
    let mut seq = 0;
    while j.live.len() < 5 {
        seq += 1;
        j.append(&[msg("beta", seq, 900)]).unwrap();
    }
    let acked_to = seq - 5;
    j.append(&[acked("beta", acked_to)]).unwrap();
    assert!(j.stats().pool >= 3);
    // Fill the active segment exactly: the last message's frame takes all the room left.
    let filled_gen;
    loop {
        let room = j.active().unwrap().room();
        let frame = msg("beta", seq + 1, 0).frame_len() as u64;
        if room >= frame && room <= frame + 900 {
            seq += 1;
            let before = j.live.len();
            filled_gen = j.active().unwrap().generation;
            j.append(&[msg("beta", seq, (room - frame) as usize)])
                .unwrap();
            let full = j.live.iter().find(|s| s.generation == filled_gen).unwrap();
            assert_eq!(full.end, full.capacity, "the segment ends exactly full");
            assert_eq!(full.state, SegmentState::Sealed);
            assert!(j.live.len() >= before, "a fresh segment was added");
            assert_eq!(j.active().unwrap().records, 1, "only its checkpoint");
            break;
        }
        seq += 1;
        j.append(&[msg("beta", seq, 300)]).unwrap();
    }
    let expect_unacked: Vec<u64> = (acked_to + 1..=seq).collect();
    let files = segment_files(dir.path());
    let pool = j.stats().pool;
    assert!(pool > 0, "retired segments are in the pool");
    drop(j);

    for round in 0..50 {
        let (j, rec) = open(dir.path());
        assert_eq!(
            segment_files(dir.path()),
            files,
            "round {round}: file count grew"
        );
        assert_eq!(j.stats().pool, pool, "round {round}: pool changed");
        assert_eq!(seqs(&rec, "beta"), expect_unacked, "round {round}");
        assert_eq!(rec.report.gaps, vec![]);
        assert_eq!(j.stats().segments_created, 0);
    }

    // And restarts that append a little each time stay bounded too.
    for _ in 0..50 {
        let (mut j, rec) = open(dir.path());
        let last = rec.peers["beta"].counters.sent;
        j.append(&[msg("beta", last + 1, 2000), acked("beta", last - 4)])
            .unwrap();
        assert_eq!(
            j.stats().segments_created,
            0,
            "no file while the pool holds one"
        );
        assert!(segment_files(dir.path()) <= files);
    }
    let (_, rec) = open(dir.path());
    let sent = rec.peers["beta"].counters.sent;
    assert_eq!(seqs(&rec, "beta"), (sent - 4..=sent).collect::<Vec<_>>());
}

/// Qpid's actual leftover: an uninitialised file (zeroes, or zero length) found at recovery
/// goes to the pool and is used before any file is created.
#[test]
fn uninitialised_files_go_to_the_pool_and_are_used_first() {
    let dir = TempDir::new("uninit");
    {
        let (mut j, _) = open(dir.path());
        j.append(&[msg("beta", 1, 10)]).unwrap();
    }
    fs::write(dir.path().join(file_name(7)), vec![0u8; SEG as usize]).unwrap();
    fs::write(dir.path().join(file_name(8)), b"").unwrap();
    fs::write(dir.path().join(format!("{}.tmp", file_name(9))), b"half").unwrap();
    let (mut j, rec) = open(dir.path());
    assert_eq!(rec.report.returned_to_pool, 2);
    assert_eq!(rec.report.temp_files_removed, 1);
    assert_eq!(j.stats().pool, 2);
    assert_eq!(
        fs::metadata(dir.path().join(file_name(8))).unwrap().len(),
        SEG
    );
    assert_eq!(seqs(&rec, "beta"), vec![1]);
    // Force two rotations: both come from the pool.
    for seq in 2..200 {
        j.append(&[msg("beta", seq, 1000)]).unwrap();
        if j.stats().segments_reused == 2 {
            break;
        }
    }
    assert_eq!(j.stats().segments_reused, 2);
    assert_eq!(j.stats().segments_created, 0);
    assert_eq!(segment_files(dir.path()), 3);
}

#[test]
fn unacked_messages_survive_a_restart_in_order_and_acked_ones_are_gone() {
    let dir = TempDir::new("restart");
    let (mut j, rec) = open(dir.path());
    assert!(rec.peers.is_empty());
    for i in 1..=100u64 {
        let mut batch = vec![msg("beta", i, 700)];
        if i <= 50 {
            batch.push(msg("gamma", i, 300));
        }
        j.append(&batch).unwrap();
    }
    j.append(&[
        acked("beta", 40),
        acked("gamma", 50),
        delivered("beta", 17),
        delivered("delta", 5),
    ])
    .unwrap();
    assert!(j.stats().segments_created > 1, "spans several segments");
    drop(j);

    let (mut j, rec) = open(dir.path());
    assert_eq!(seqs(&rec, "beta"), (41..=100).collect::<Vec<_>>());
    assert_eq!(seqs(&rec, "gamma"), Vec::<u64>::new());
    let beta = &rec.peers["beta"];
    let c = &beta.counters;
    assert_eq!((c.sent, c.acked, c.delivered), (100, 40, 17));
    assert_eq!(beta.unacked[0].payload, Bytes::from(vec![41u8; 700]));
    assert_eq!(beta.unacked[0].flags, 2);
    let gamma = &rec.peers["gamma"].counters;
    assert_eq!((gamma.sent, gamma.acked), (50, 50));
    assert_eq!(rec.peers["delta"].counters.delivered, 5);
    assert_eq!(rec.report.gaps, vec![]);

    // Resume where it stopped; survives another restart.
    j.append(&[msg("beta", 101, 10), acked("beta", 60)])
        .unwrap();
    drop(j);
    let (_, rec) = open(dir.path());
    assert_eq!(seqs(&rec, "beta"), (61..=101).collect::<Vec<_>>());
    assert_eq!(rec.peers["delta"].counters.delivered, 5);
    assert_eq!(rec.peers["beta"].counters.delivered, 17);
}

#[test]
fn retired_segments_are_reused_and_files_stay_bounded_over_a_long_run() {
    let dir = TempDir::new("long");
    let (mut j, _) = open(dir.path());
    let peers = ["beta", "gamma", "delta"];
    let mut max_files = 0;
    for round in 1..=3000u64 {
        let pool_before = j.stats().pool;
        let created_before = j.stats().segments_created;
        let mut batch: Vec<Record> = peers.iter().map(|p| msg(p, round, 200)).collect();
        if round > 10 {
            batch.extend(peers.iter().map(|p| acked(p, round - 10)));
            batch.push(delivered("beta", round - 3));
        }
        j.append(&batch).unwrap();
        if j.stats().segments_created > created_before {
            assert_eq!(
                pool_before, 0,
                "round {round}: file created while the pool held one"
            );
        }
        max_files = max_files.max(segment_files(dir.path()));
    }
    let s = j.stats();
    assert!(s.segments_recycled > 20, "{s:?}");
    assert!(s.segments_reused > 20, "{s:?}");
    assert!(max_files <= 4, "files grew to {max_files}: {s:?}");
    drop(j);
    let (_, rec) = open(dir.path());
    assert_eq!(seqs(&rec, "gamma"), (2991..=3000).collect::<Vec<_>>());
    assert_eq!(rec.peers["beta"].counters.delivered, 2997);
}

/// Offset of the `n`th record (0-based) of a segment holding `checkpoint_len` and then
/// single-record frames of `frame_len` bytes.
fn nth_record(checkpoint_len: usize, frame_len: usize, n: usize) -> u64 {
    (HEADER_LEN + checkpoint_len + n * frame_len) as u64
}

#[test]
fn a_flipped_byte_in_a_record_body_cuts_the_journal_there() {
    let dir = TempDir::new("flip");
    let (mut j, _) = open(dir.path());
    for seq in 1..=10 {
        j.append(&[msg("beta", seq, 100)]).unwrap();
    }
    let path = active_path(&j);
    drop(j);
    let frame = msg("beta", 1, 100).frame_len();
    let empty_checkpoint = Record::Checkpoint { peers: vec![] }.frame_len();
    let sixth = nth_record(empty_checkpoint, frame, 5);
    xor_byte(&path, sixth + FRAME_HEADER as u64 + 40);

    let (mut j, rec) = open(dir.path());
    assert_eq!(seqs(&rec, "beta"), vec![1, 2, 3, 4, 5]);
    let cut = rec.report.cut.clone().expect("a cut");
    assert_eq!((cut.path.clone(), cut.offset), (path.clone(), sixth));
    assert_eq!(cut.reason, "record checksum mismatch");
    // The tail was zeroed: the old records 7..10 can never come back.
    let data = fs::read(&path).unwrap();
    assert!(data[sixth as usize..].iter().all(|&b| b == 0));
    assert_eq!(data.len() as u64, SEG);
    j.append(&[msg("beta", 6, 5)]).unwrap();
    drop(j);
    let (_, rec) = open(dir.path());
    assert_eq!(seqs(&rec, "beta"), (1..=6).collect::<Vec<_>>());
    assert_eq!(rec.report.cut, None);
}

#[test]
fn corruption_inside_a_sealed_segment_cuts_there_and_discards_what_follows() {
    let dir = TempDir::new("sealed");
    let (mut j, _) = open(dir.path());
    let mut seq = 0;
    while j.live.len() < 3 {
        seq += 1;
        j.append(&[msg("beta", seq, 1000)]).unwrap();
    }
    let first = j.live[0].file.path.clone();
    let total = seq;
    drop(j);
    let frame = msg("beta", 1, 1000).frame_len();
    let empty_checkpoint = Record::Checkpoint { peers: vec![] }.frame_len();
    xor_byte(&first, nth_record(empty_checkpoint, frame, 3) + 30);

    let files = segment_files(dir.path());
    let (mut j, rec) = open(dir.path());
    assert_eq!(seqs(&rec, "beta"), vec![1, 2, 3]);
    assert_eq!(rec.report.cut.as_ref().unwrap().path, first);
    assert_eq!(rec.report.discarded.len(), 2);
    assert_eq!(rec.peers["beta"].counters.sent, 3);
    assert!(total > 3);
    assert_eq!(j.stats().pool, 2);
    // Appending works (from the pool) and survives a reopen.
    j.append(&[msg("beta", 4, 10)]).unwrap();
    assert_eq!(j.stats().segments_created, 0);
    drop(j);
    let (_, rec) = open(dir.path());
    assert_eq!(seqs(&rec, "beta"), vec![1, 2, 3, 4]);
    assert_eq!(segment_files(dir.path()), files);
}

#[test]
fn a_truncated_segment_is_cut_cleanly_or_refused_clearly() {
    // Truncated in its records: a clean cut, and the file is restored to its size.
    let dir = TempDir::new("trunc");
    let (mut j, _) = open(dir.path());
    for seq in 1..=10 {
        j.append(&[msg("beta", seq, 100)]).unwrap();
    }
    let path = active_path(&j);
    drop(j);
    let frame = msg("beta", 1, 100).frame_len();
    let empty_checkpoint = Record::Checkpoint { peers: vec![] }.frame_len();
    let cut_at = nth_record(empty_checkpoint, frame, 7) + 20;
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(cut_at)
        .unwrap();
    let (_, rec) = open(dir.path());
    assert_eq!(seqs(&rec, "beta"), (1..=7).collect::<Vec<_>>());
    assert!(rec.report.cut.is_some());
    assert_eq!(fs::metadata(&path).unwrap().len(), SEG);

    // Truncated inside its header: refused, naming the file, and left untouched.
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100)
        .unwrap();
    let err = Journal::open(config(dir.path())).unwrap_err();
    assert!(matches!(err, JournalError::DamagedHeader { .. }), "{err}");
    assert!(err.to_string().contains(&file_name(1)), "{err}");
    assert_eq!(fs::metadata(&path).unwrap().len(), 100);
}

#[test]
fn a_header_of_another_version_or_member_is_a_clear_error() {
    let dir = TempDir::new("foreign");
    {
        let (mut j, _) = open(dir.path());
        j.append(&[msg("beta", 1, 10)]).unwrap();
    }
    let err = Journal::open(config(dir.path()).cluster("other")).unwrap_err();
    assert!(matches!(err, JournalError::ForeignMember { .. }), "{err}");
    let err = Journal::open(JournalConfig::new(dir.path(), "beta").cluster("test")).unwrap_err();
    assert!(
        err.to_string().contains("belongs to member \"test/alpha\""),
        "{err}"
    );

    let path = dir.path().join(file_name(1));
    let before = fs::read(&path).unwrap();
    patch(&path, 8, &(FORMAT_VERSION + 1).to_le_bytes());
    let err = Journal::open(config(dir.path())).unwrap_err();
    match &err {
        JournalError::UnsupportedVersion {
            found, supported, ..
        } => assert_eq!((*found, *supported), (FORMAT_VERSION + 1, FORMAT_VERSION)),
        other => panic!("{other}"),
    }
    assert!(
        err.to_string()
            .contains(&format!("version {}", FORMAT_VERSION + 1)),
        "{err}"
    );
    // Nothing was changed on disk but the byte we patched.
    let mut after = fs::read(&path).unwrap();
    after[8] = before[8];
    assert_eq!(after, before);

    patch(&path, 0, b"NOTJOURN");
    let err = Journal::open(config(dir.path())).unwrap_err();
    assert!(matches!(err, JournalError::NotASegment { .. }), "{err}");
}

#[test]
fn a_torn_tail_is_cut_never_replayed_and_appends_after_it_survive() {
    let dir = TempDir::new("torn");
    let (mut j, _) = open(dir.path());
    j.append(&[msg("beta", 1, 50), msg("beta", 2, 50)]).unwrap();
    let end = j.active().unwrap().end;
    let generation = j.active().unwrap().generation;
    let path = active_path(&j);
    drop(j);
    // A record half-written: its first half reaches the disk, the rest does not.
    let mut frame = Vec::new();
    msg("beta", 3, 400).encode(generation, &mut frame);
    patch(&path, end, &frame[..frame.len() / 2]);

    let (mut j, rec) = open(dir.path());
    assert_eq!(seqs(&rec, "beta"), vec![1, 2]);
    assert_eq!(rec.peers["beta"].counters.sent, 2);
    assert_eq!(rec.report.cut.as_ref().unwrap().offset, end);
    j.append(&[msg("beta", 3, 7)]).unwrap();
    drop(j);
    let (_, rec) = open(dir.path());
    assert_eq!(seqs(&rec, "beta"), vec![1, 2, 3]);
    assert_eq!(rec.peers["beta"].unacked[2].payload.len(), 7);
    assert_eq!(rec.report.cut, None);
}

/// A crash while activating a segment (its checkpoint torn) must not let the older
/// segments, whose counters that checkpoint should have carried, be recycled.
#[test]
fn a_torn_activation_keeps_the_counters_of_older_segments() {
    let dir = TempDir::new("torn-activation");
    let (mut j, _) = open(dir.path());
    j.append(&[msg("beta", 1, 10), acked("beta", 1), delivered("gamma", 9)])
        .unwrap();
    let mut seq = 1;
    while j.next_generation < 3 {
        seq += 1;
        j.append(&[msg("beta", seq, 1000)]).unwrap();
    }
    // Simulate the crash: the new segment's checkpoint never reached the disk.
    let path = active_path(&j);
    drop(j);
    patch(&path, HEADER_LEN as u64, &[0xee; 64]);
    for round in 0..3 {
        let (mut j, rec) = open(dir.path());
        assert_eq!(rec.peers["gamma"].counters.delivered, 9, "round {round}");
        // Everything acked: the old segment is retired but must stay for its counters.
        j.append(&[acked("beta", seq)]).unwrap();
        assert_eq!(j.live.len(), 2);
    }
    // The next rotation writes a checkpoint again, and then the old segments may go.
    let (mut j, _) = open(dir.path());
    let generation = j.next_generation;
    while j.next_generation == generation {
        seq += 1;
        j.append(&[msg("beta", seq, 1000), acked("beta", seq)])
            .unwrap();
    }
    assert_eq!(j.live.len(), 1);
    drop(j);
    let (_, rec) = open(dir.path());
    assert_eq!(rec.peers["gamma"].counters.delivered, 9);
    assert_eq!(rec.peers["beta"].counters.acked, seq);
}

/// A crash between activating the next segment and sealing the old one (possible with
/// `FsyncPolicy::Never` and an OS crash): both are active; the older is sealed at recovery.
#[test]
fn an_older_segment_left_active_is_sealed_at_recovery() {
    let dir = TempDir::new("two-active");
    let (mut j, _) = open(dir.path());
    let mut seq = 0;
    while j.live.len() < 2 {
        seq += 1;
        j.append(&[msg("beta", seq, 1000)]).unwrap();
    }
    let old = j.live[0].file.path.clone();
    drop(j);
    let data = fs::read(&old).unwrap();
    let segment::HeaderRead::Valid(mut h) = segment::Header::decode(&data) else {
        panic!("bad header");
    };
    h.state = SegmentState::Active;
    h.end = 0;
    h.records = 0;
    patch(&old, 0, &h.encode());
    let (_, rec) = open(dir.path());
    assert_eq!(seqs(&rec, "beta"), (1..=seq).collect::<Vec<_>>());
    let ins = inspect(dir.path()).unwrap();
    let states: Vec<String> = ins.segments.iter().map(|s| s.status.to_string()).collect();
    assert_eq!(states, vec!["sealed", "active"]);
}

#[test]
fn a_batch_from_several_peers_is_one_write() {
    let dir = TempDir::new("group");
    let (mut j, _) = open(dir.path());
    j.append(&[msg("beta", 1, 10)]).unwrap();
    let before = j.stats();
    let end_before = j.active().unwrap().end;
    let batch = vec![
        msg("beta", 2, 100),
        msg("gamma", 1, 200),
        msg("delta", 1, 300),
        acked("beta", 1),
        delivered("gamma", 4),
    ];
    j.append(&batch).unwrap();
    let after = j.stats();
    let bytes: usize = batch.iter().map(Record::frame_len).sum();
    assert_eq!(after.writes - before.writes, 1);
    assert_eq!(after.records - before.records, 5);
    assert_eq!(after.bytes_written - before.bytes_written, bytes as u64);
    assert_eq!(j.active().unwrap().end - end_before, bytes as u64);
}

#[test]
fn fsync_policies_sync_when_they_should() {
    let dir = TempDir::new("every");
    let (mut j, _) = Journal::open(config(dir.path()).fsync(FsyncPolicy::EveryBatch)).unwrap();
    j.append(&[msg("beta", 1, 10)]).unwrap(); // creates the first segment
    let base = j.stats().fsyncs;
    for seq in 2..=6 {
        j.append(&[msg("beta", seq, 10), acked("beta", seq - 1)])
            .unwrap();
    }
    assert_eq!(j.stats().fsyncs - base, 5, "one fsync per batch");

    let dir = TempDir::new("never");
    let (mut j, _) = open(dir.path());
    for seq in 1..=5 {
        j.append(&[msg("beta", seq, 10)]).unwrap();
    }
    assert_eq!(j.stats().fsyncs, 0);
    j.sync().unwrap();
    assert_eq!(j.stats().fsyncs, 1, "an explicit sync still syncs");

    let dir = TempDir::new("interval");
    let hour = Duration::from_secs(3600);
    let (mut j, _) = Journal::open(config(dir.path()).fsync(FsyncPolicy::Interval(hour))).unwrap();
    let t0 = Instant::now();
    j.append_at(&[msg("beta", 1, 10)], t0).unwrap();
    let base = j.stats().fsyncs; // the first segment's activation
    j.append_at(&[msg("beta", 2, 10)], t0 + hour / 2).unwrap();
    assert_eq!(j.stats().fsyncs, base, "not due yet");
    assert!(j.unsynced());
    j.append_at(&[msg("beta", 3, 10)], t0 + 2 * hour).unwrap();
    assert_eq!(j.stats().fsyncs, base + 1, "due at append");
    assert!(!j.unsynced());
    j.append_at(
        &[msg("beta", 4, 10)],
        t0 + 2 * hour + Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(j.stats().fsyncs, base + 1, "due an hour after the last");
    j.append_at(
        &[msg("beta", 5, 10)],
        t0 + 3 * hour + Duration::from_secs(1),
    )
    .unwrap();
    assert_eq!(j.stats().fsyncs, base + 2, "due at append");
}

#[test]
fn oversized_records_and_names_are_refused_and_nothing_is_written() {
    let dir = TempDir::new("big");
    let (mut j, _) = open(dir.path());
    let err = j
        .append(&[msg("beta", 1, 10), msg("beta", 2, SEG as usize)])
        .unwrap_err();
    assert!(matches!(err, JournalError::RecordTooLarge { .. }), "{err}");
    let err = j.append(&[msg(&"x".repeat(300), 1, 1)]).unwrap_err();
    assert!(matches!(err, JournalError::NameTooLong { .. }), "{err}");
    assert_eq!(j.stats().writes, 0);
    assert!(Journal::open(config(dir.path()).segment_size(100)).is_err());
    drop(j);
    let (_, rec) = open(dir.path());
    assert!(rec.peers.is_empty());
}

#[test]
fn inspect_lists_segments_states_records_and_the_pool() {
    let dir = TempDir::new("inspect");
    let (mut j, _) = open(dir.path());
    let mut seq = 0;
    while j.live.len() < 3 {
        seq += 1;
        j.append(&[msg("beta", seq, 1000)]).unwrap();
    }
    j.append(&[acked("beta", seq)]).unwrap();
    assert_eq!(j.stats().pool, 2);
    drop(j);
    fs::write(dir.path().join(file_name(9)), vec![0u8; 100]).unwrap();
    let ins = inspect(dir.path()).unwrap();
    assert_eq!(ins.segments.len(), 4);
    let states: Vec<String> = ins.segments.iter().map(|s| s.status.to_string()).collect();
    assert!(states.contains(&"active".to_string()), "{states:?}");
    assert!(states.contains(&"uninitialised".to_string()), "{states:?}");
    assert!(ins.pool().count() >= 2, "{ins}");
    let active = ins
        .segments
        .iter()
        .find(|s| s.status == SegmentStatus::State(SegmentState::Active))
        .unwrap();
    assert!(active.records[&RecordKind::Message] > 0);
    assert_eq!(active.records[&RecordKind::Checkpoint], 1);
    let table = ins.to_string();
    println!("{table}");
    assert!(table.contains("pool: "), "{table}");
    assert!(table.contains("owner: test/alpha"), "{table}");
    assert!(inspect(dir.path().join("missing")).is_err());
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    /// A journal with a sealed and an active segment, and a pooled one; returns its files.
    fn build() -> Vec<(String, Vec<u8>)> {
        let dir = TempDir::new("prop-src");
        let (mut j, _) = open(dir.path());
        let mut seq = 0;
        while j.live.len() < 2 {
            seq += 1;
            j.append(&[msg("beta", seq, 3000), delivered("gamma", seq)])
                .unwrap();
        }
        j.append(&[msg("beta", seq + 1, 10)]).unwrap();
        drop(j);
        let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        files.sort();
        files
    }

    fn template() -> &'static Vec<(String, Vec<u8>)> {
        static T: std::sync::OnceLock<Vec<(String, Vec<u8>)>> = std::sync::OnceLock::new();
        T.get_or_init(build)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Arbitrary corruption of a segment (bytes overwritten, a truncation) never panics
        /// recovery or inspection; if recovery succeeds, appending and reopening still work.
        #[test]
        fn arbitrary_corruption_never_panics_recovery(
            file in 0usize..8,
            edits in proptest::collection::vec((0usize..(SEG as usize), any::<u8>()), 1..16),
            hot in proptest::collection::vec((0usize..4096, any::<u8>()), 0..8),
            truncate in proptest::option::of(0usize..(SEG as usize)),
        ) {
            let files = template();
            let dir = TempDir::new("prop");
            let target = file % files.len();
            for (i, (name, data)) in files.iter().enumerate() {
                let mut data = data.clone();
                if i == target {
                    // Mostly in the header and first records, where it matters most.
                    for &(off, v) in hot.iter().chain(edits.iter()) {
                        if off < data.len() {
                            data[off] = v;
                        }
                    }
                    if let Some(len) = truncate {
                        data.truncate(len);
                    }
                }
                fs::write(dir.path().join(name), data).unwrap();
            }
            let _ = inspect(dir.path());
            if let Ok((mut j, rec)) = Journal::open(config(dir.path())) {
                let next = rec.peers.get("beta").map_or(0, |p| p.counters.sent) + 1;
                j.append(&[msg("beta", next, 10)]).unwrap();
                drop(j);
                let (_, rec) = Journal::open(config(dir.path())).unwrap();
                prop_assert_eq!(rec.peers["beta"].counters.sent, next);
            }
        }
    }
}

#[test]
fn a_new_incarnation_retires_the_old_messages_and_their_segments() {
    let dir = TempDir::new("bound");
    let launch;
    {
        let (mut j, _) = open(dir.path());
        launch = j.launch_id();
        assert_ne!(launch, 0);
        let bound = |l: u64| Record::Bound {
            peer: "beta".into(),
            launch: l,
        };
        j.append(&[bound(7)]).unwrap();
        // Old incarnation: enough unacked messages to fill several segments.
        for seq in 1..=120 {
            j.append(&[msg("beta", seq, 2000)]).unwrap();
        }
        j.append(&[delivered("beta", 5)]).unwrap();
        assert!(j.stats().live_segments > 2);
        // The same incarnation again changes nothing.
        j.append(&[bound(7)]).unwrap();
        assert_eq!(j.peer("beta").unwrap().sent, 120);
        // The peer restarted: its old messages are retired, the new stream starts at 1.
        j.append(&[bound(8), msg("beta", 1, 10), msg("beta", 2, 10)])
            .unwrap();
        let c = j.peer("beta").unwrap();
        assert_eq!((c.sent, c.acked, c.delivered, c.launch), (2, 0, 0, 8));
        // Once the active segment moves on, the old ones go back to the pool.
        for seq in 3..=40 {
            j.append(&[msg("beta", seq, 2000), acked("beta", seq)])
                .unwrap();
        }
        assert!(j.stats().segments_recycled > 0, "{:?}", j.stats());
    }
    let (j, r) = open(dir.path());
    assert_eq!(j.launch_id(), launch, "the launch id survives a restart");
    let p = &r.peers["beta"];
    let c = &p.counters;
    assert_eq!((c.sent, c.acked, c.launch), (40, 40, 8));
    assert!(
        p.unacked.is_empty(),
        "old incarnation's messages never come back"
    );
    assert!(r.report.gaps.is_empty());
}

#[test]
fn delivered_credit_and_a_reset_survive_a_restart() {
    let dir = TempDir::new("credit");
    {
        let (mut j, _) = open(dir.path());
        j.append(&[
            Record::Bound {
                peer: "beta".into(),
                launch: 3,
            },
            delivered("beta", 4),
        ])
        .unwrap();
    }
    {
        let (mut j, r) = open(dir.path());
        let p = &r.peers["beta"].counters;
        assert_eq!((p.delivered, p.credit, p.launch), (4, 40, 3));
        // A reset with the same incarnation: unbind, then bind again.
        j.append(&[
            Record::Bound {
                peer: "beta".into(),
                launch: 0,
            },
            Record::Bound {
                peer: "beta".into(),
                launch: 3,
            },
            msg("beta", 1, 5),
        ])
        .unwrap();
    }
    let (_, r) = open(dir.path());
    let p = &r.peers["beta"].counters;
    assert_eq!((p.sent, p.delivered, p.credit, p.launch), (1, 0, 0, 3));
    assert_eq!(seqs(&r, "beta"), vec![1]);
}

/// Segments are retired out of order (`take_retired` takes any covered segment whose pins
/// are acked), so the segment holding a `Bound` reset can go back to the pool while an
/// older segment, pinned by another peer, still holds messages of the reset stream.
/// Recovery must not replay those old messages without the reset: with the newer
/// checkpoint's counters merged with `max`, they would come back as unacknowledged messages
/// of the new stream, and retired (reported undelivered) messages would be resent to the
/// peer's new incarnation.
#[test]
fn a_reset_survives_the_retirement_of_the_segment_that_recorded_it() {
    let dir = TempDir::new("reset-retired");
    {
        let (mut j, _) = open(dir.path());
        let bound = |peer: &str, l: u64| Record::Bound {
            peer: peer.into(),
            launch: l,
        };
        j.append(&[bound("beta", 7), bound("gamma", 9)]).unwrap();
        // The old stream to beta, over three segments; a message to gamma that is never
        // acknowledged pins the second one.
        for seq in 1..=70 {
            if seq == 45 {
                j.append(&[msg("gamma", 1, 100)]).unwrap();
            }
            j.append(&[msg("beta", seq, 2000)]).unwrap();
        }
        // beta restarted: its old messages are retired.
        j.append(&[bound("beta", 8)]).unwrap();
        assert_eq!(j.peer("beta").unwrap().sent, 0);
        // The new stream, acknowledged as it goes, moves on to newer segments.
        for seq in 1..=40 {
            j.append(&[msg("beta", seq, 2000), acked("beta", seq)])
                .unwrap();
        }
        assert!(j.stats().segments_recycled > 0, "{:?}", j.stats());
        let c = j.peer("beta").unwrap();
        assert_eq!((c.sent, c.acked, c.launch), (40, 40, 8));
    }
    let (_, r) = open(dir.path());
    let p = &r.peers["beta"].counters;
    assert_eq!(
        (p.sent, p.acked, p.launch, seqs(&r, "beta")),
        (40, 40, 8, vec![]),
        "the old incarnation's messages must not come back"
    );
    assert_eq!(seqs(&r, "gamma"), vec![1]);
}

/// The IO thread's inline append writes a small batch into the active segment and nothing
/// else: it refuses (writing nothing) a batch that would roll a segment, one over
/// `INLINE_MAX` and any batch under `EveryBatch`; under `Interval` it never syncs, even
/// once the interval has passed (the writer's timer does, outside the journal's lock);
/// what it wrote is recovered like any append.
#[test]
fn inline_appends_take_one_write_or_are_refused() {
    let dir = TempDir::new("inline");
    let (mut j, _) = open(dir.path());
    let now = Instant::now();
    // The first append activates a segment (the writer's job): inline refuses it.
    assert!(!j.append_inline(&[msg("p", 1, 10)]).unwrap());
    j.append_at(&[msg("p", 1, 10)], now).unwrap();
    let before = j.stats();
    assert!(j.append_inline(&[msg("p", 2, 10)]).unwrap());
    let after = j.stats();
    assert_eq!(after.writes, before.writes + 1, "one write");
    assert_eq!(after.fsyncs, before.fsyncs, "no sync");
    assert_eq!(after.records, before.records + 1);
    // Too large for an inline append: refused.
    assert!(!j
        .append_inline(&[msg("p", 3, INLINE_MAX as usize)])
        .unwrap());
    // Fill the segment (the writer's appends) until less than 4 KiB is left.
    let mut seq = 3;
    while j.active().unwrap().room() >= 4096 {
        j.append_at(&[msg("p", seq, 1000)], now).unwrap();
        seq += 1;
    }
    let overhead = msg("p", seq, 0).frame_len() as u64;
    let fits = (j.active().unwrap().room() - MIN_FRAME - overhead) as usize;
    // One byte more and no frame would fit after it (a roll would follow): refused.
    let writes = j.stats().writes;
    assert!(!j.append_inline(&[msg("p", seq, fits + 1)]).unwrap());
    assert_eq!(j.stats().writes, writes, "nothing written");
    assert!(j.append_inline(&[msg("p", seq, fits)]).unwrap());
    drop(j);
    let (_, recovered) = open(dir.path());
    assert_eq!(seqs(&recovered, "p"), (1..=seq).collect::<Vec<_>>());

    // EveryBatch: never inline.
    let every = TempDir::new("inline-every");
    let (mut j, _) = Journal::open(config(every.path()).fsync(FsyncPolicy::EveryBatch)).unwrap();
    j.append_at(&[msg("p", 1, 10)], now).unwrap();
    assert!(!j.append_inline(&[msg("p", 2, 10)]).unwrap());
    // Interval: inline even with the interval always passed (zero), never syncing: the
    // writer's timer does.
    let interval = TempDir::new("inline-interval");
    let policy = FsyncPolicy::Interval(Duration::ZERO);
    let (mut j, _) = Journal::open(config(interval.path()).fsync(policy)).unwrap();
    j.append_at(&[msg("p", 1, 10)], now).unwrap();
    assert!(
        !j.unsynced(),
        "append_at syncs once the interval has passed"
    );
    let fsyncs = j.stats().fsyncs;
    assert!(j.append_inline(&[msg("p", 2, 10)]).unwrap());
    assert!(j.append_inline(&[msg("p", 3, 10)]).unwrap());
    assert_eq!(j.stats().fsyncs, fsyncs, "an inline append never syncs");
    assert!(j.unsynced());
}

/// A sync begun under the lock covers what was written before it, and not what is
/// written while it runs: that is owed the next one.
#[test]
fn a_sync_run_outside_the_lock_covers_what_came_before_it() {
    let dir = TempDir::new("begin-sync");
    let policy = FsyncPolicy::Interval(Duration::from_secs(3600));
    let (mut j, _) = Journal::open(config(dir.path()).fsync(policy)).unwrap();
    let now = Instant::now();
    j.append_at(&[msg("p", 1, 10)], now).unwrap();
    assert!(j.unsynced());
    let fsyncs = j.stats().fsyncs;
    let pending = j.begin_sync(now);
    assert!(!j.unsynced(), "counted synced from the sync's start");
    // Written while the sync runs: owed the next one.
    assert!(j.append_inline(&[msg("p", 2, 10)]).unwrap());
    assert!(j.unsynced());
    pending.run().unwrap();
    j.finish_sync(pending);
    assert_eq!(j.stats().fsyncs, fsyncs + 1, "one segment synced");
    assert!(j.unsynced(), "the write made during the sync still waits");
    let pending = j.begin_sync(Instant::now());
    pending.run().unwrap();
    j.finish_sync(pending);
    assert!(!j.unsynced());
    drop(j);
    let (_, recovered) = open(dir.path());
    assert_eq!(seqs(&recovered, "p"), vec![1, 2]);
}
