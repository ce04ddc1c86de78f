//! Crash tests of the durable outbox: a journalling member killed with SIGKILL at random
//! points under load, 20 times over.
//!
//! The journalling member runs in a child process: this test binary re-executed with
//! `--exact crash_child` (an ignored test that does nothing unless a crash test configured
//! it through `COHORT_CRASH_*` environment variables). Its peer runs in the test's own
//! process, stays up across every round, and sees everything the child does.
//!
//! **Sender** ([`sigkill_at_random_points_loses_nothing_synced_and_never_replays_garbage`]):
//! each round starts `a` from the same journal directory (fsync on every batch). `a` prints
//! `started` once its node is up, then sends numbered messages to `b` without pause, calls
//! `Node::sync_journal` every [`SYNC_EVERY`] messages and prints `synced <run> <count>`
//! after each `Ok`. The test kills it after a random number of `synced` lines and a random
//! number of further deliveries, while it is still sending. Before some rounds, another
//! start is killed as soon as it begins opening its journal (a crash during recovery).
//! After each kill the test recovers a *copy* of the journal and checks it against what `b`
//! holds. A last start, without sending, lets `a` resend what `b` still lacks; then `a`
//! shuts down cleanly, and three clean restarts must resend nothing and add no file. `b`
//! must have seen one stream: seq 1, 2, 3, … with no gap and no duplicate, every synced
//! message in it, every payload intact.
//!
//! **Receiver** ([`a_receiver_killed_at_random_points_loses_nothing_and_redelivers_in_order`]):
//! the journalling member is `b`, printing each delivery from its handler; `a` sends without
//! pause across 20 kills of `b` at random points. Each incarnation of `b` must deliver a
//! contiguous run of seqs starting at most one past what earlier incarnations handled (no
//! gap; what it delivers again is the documented at-least-once window), every message must
//! arrive, and after a clean stop nothing is delivered again.
//!
//! The randomness comes from one seed, printed at the start; `COHORT_CRASH_SEED=<seed>`
//! replays the same choices (the kill points still depend on timing).

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cohort::internals::journal::{Journal, JournalConfig, SegmentStatus};
use cohort::{Delivery, FsyncPolicy, Node};
use support::*;

/// Rounds of start, send, SIGKILL.
const ROUNDS: u64 = 20;
/// `a` syncs its journal after every this many messages.
const SYNC_EVERY: u64 = 250;
/// Small segments, so that the rounds rotate, seal and recycle segments all the time.
const SEGMENT: u64 = 64 << 10;
/// `a`'s send window: it bounds the unacknowledged messages, hence the live segments.
const WINDOW: u64 = 512 << 10;
/// Most files the journal directory may hold after a kill: a sanity bound, not a tight one.
/// A start resends what its journal holds unacknowledged, and those messages take no
/// permits of the new process's window (the credit `b` returns for them even frees permits
/// for new messages), so a run killed before `b` caught up leaves more than a window
/// unacknowledged for the next. The directory reached 22 files here; with the child's syncs
/// removed (a scratch change: faster runs), 36 files and 28 live segments (3.5 windows). A
/// file leaked per restart (the Qpid bug) is caught exactly by the clean restarts at the
/// end.
const MAX_FILES: usize = 6 * (WINDOW / SEGMENT) as usize + 4;
/// A child sends at most this many messages (it is killed long before; the cap only stops a
/// child whose parent died).
const CHILD_CAP: u64 = 200_000;

const CLUSTER: &str = "crash";
const CLUSTER_RX: &str = "crash-rx";
const ENV_DIR: &str = "COHORT_CRASH_DIR";
const ENV_PEER: &str = "COHORT_CRASH_PEER";
const ENV_RUN: &str = "COHORT_CRASH_RUN";
const ENV_SEND: &str = "COHORT_CRASH_SEND";
const ENV_ROLE: &str = "COHORT_CRASH_ROLE";
const ENV_LISTEN: &str = "COHORT_CRASH_LISTEN";
/// Marks the child's protocol lines on its stdout (libtest writes there too).
const MARK: &str = "crash-child:";

/// The counter carried by message `i` of run `run` (each child process is one run).
fn value(run: u64, i: u64) -> u64 {
    (run << 32) | i
}

/// The payload size of a message: 8 to 1031 bytes, a function of its counter, so that a
/// record of the wrong length is caught and records end at every possible offset.
fn size_of(value: u64) -> usize {
    8 + (value.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize
}

/// Entries of the journal directory.
fn file_count(dir: &Path) -> usize {
    std::fs::read_dir(dir).expect("list the journal").count()
}

/// A small deterministic generator (splitmix64): the test's choices replay from its seed.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// The seed: `COHORT_CRASH_SEED` if set, else the time mixed with the process id.
fn seed() -> u64 {
    if let Ok(s) = std::env::var("COHORT_CRASH_SEED") {
        return s.parse().expect("COHORT_CRASH_SEED must be a u64");
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64;
    nanos ^ (u64::from(std::process::id()) << 40)
}

/// What `b` saw from `a`: every delivery in order, and any payload that failed its check.
#[derive(Default)]
struct BLog {
    /// `(counter, seq)` per delivery.
    deliveries: Vec<(u64, u64)>,
    /// Corrupt, truncated or unsequenced deliveries.
    errors: Vec<String>,
    /// Per run, one more than the highest message number delivered.
    reached: BTreeMap<u64, u64>,
}

impl BLog {
    /// How many messages of `run` have arrived, if the stream is in that run now.
    fn delivered_in(&self, run: u64) -> u64 {
        match self.deliveries.last() {
            Some(&(v, _)) if v >> 32 == run => (v & 0xFFFF_FFFF) + 1,
            _ => 0,
        }
    }
}

/// The handler of `b`: checks each payload and logs it.
fn logging(log: &Arc<Mutex<BLog>>) -> impl Fn(Delivery) + Send + Sync + 'static {
    let log = log.clone();
    move |d: Delivery| {
        let mut log = log.lock().unwrap();
        let checked = counter_of(d.payload()).and_then(|v| {
            if d.payload().len() != size_of(v) {
                return Err(format!(
                    "payload {v:#x} has {} bytes, expected {}",
                    d.payload().len(),
                    size_of(v)
                ));
            }
            d.seq()
                .map(|s| (v, s))
                .ok_or_else(|| format!("payload {v:#x} has no seq"))
        });
        match checked {
            Ok((v, seq)) => {
                let reached = log.reached.entry(v >> 32).or_insert(0);
                *reached = (*reached).max((v & 0xFFFF_FFFF) + 1);
                log.deliveries.push((v, seq));
            }
            Err(e) => log.errors.push(e),
        }
    }
}

/// What the parent learnt from recovering a copy of the journal after a kill.
struct Recovery {
    launch_id: u64,
    /// Messages the next start resends.
    unacked: usize,
    /// The highest seq journalled.
    sent: u64,
    /// Whether reading stopped at an invalid record at the tail (a torn or stale tail).
    cut: bool,
}

/// Recovers a copy of the journal in `dir`, as the next start of `a` will recover the
/// original, and checks what it holds against what `b` has: recovery succeeds, nothing in
/// the middle of the journal is discarded, the unacknowledged messages are exactly
/// `acked+1 ..= sent` with intact payloads, `b` holds nothing the journal lacks
/// (`acked <= received <= sent`), and the journal and `b` agree on every sequence number
/// both know. The copy leaves the original exactly as the kill left it for the child.
fn recover_copy(dir: &Path, run: u64, b_received: u64, b_log: &BLog) -> Recovery {
    let copy = dir.with_extension("copy");
    let _ = std::fs::remove_dir_all(&copy);
    std::fs::create_dir_all(&copy).expect("create the copy");
    for entry in std::fs::read_dir(dir).expect("list the journal") {
        let entry = entry.expect("journal entry");
        std::fs::copy(entry.path(), copy.join(entry.file_name())).expect("copy a journal file");
    }
    let config = JournalConfig::new(&copy, "a")
        .cluster(CLUSTER)
        .segment_size(SEGMENT)
        .fsync(FsyncPolicy::Never);
    let (journal, recovered) = Journal::open(config).unwrap_or_else(|e| {
        panic!(
            "run {run}: recovery of the journal failed: {e}\n{}",
            cohort::inspect_journal(dir).map_or_else(|e| e.to_string(), |i| i.to_string())
        )
    });
    let report = &recovered.report;
    assert!(
        report.discarded.is_empty() && report.gaps.is_empty(),
        "run {run}: a SIGKILL damaged the middle of the journal: {report:?}"
    );
    let peer = recovered.peers.get("b");
    let (sent, acked) = peer.map_or((0, 0), |p| (p.counters.sent, p.counters.acked));
    assert!(
        acked <= b_received && b_received <= sent,
        "run {run}: journal acked {acked}, sent {sent}, but b received {b_received} (b holds a message the journal lacks?)"
    );
    let unacked = peer.map_or(&[][..], |p| &p.unacked[..]);
    let seqs: Vec<u64> = unacked.iter().map(|m| m.seq).collect();
    let want: Vec<u64> = (acked + 1..=sent).collect();
    assert!(
        seqs == want,
        "run {run}: unacked seqs are not exactly acked+1..=sent ({acked}+1..={sent}): {} messages, first {:?}, last {:?}",
        seqs.len(),
        seqs.first(),
        seqs.last()
    );
    let mut prev: Option<u64> = None;
    for m in unacked {
        let v = counter_of(&m.payload).unwrap_or_else(|e| {
            panic!(
                "run {run}: recovery replays a corrupt message (seq {}): {e}",
                m.seq
            )
        });
        assert_eq!(
            m.payload.len(),
            size_of(v),
            "run {run}: recovery replays message {v:#x} (seq {}) with a wrong length",
            m.seq
        );
        if let Some(p) = prev {
            let next_in_run = v == p + 1;
            let next_run = v >> 32 > p >> 32 && v & 0xFFFF_FFFF == 0;
            assert!(
                next_in_run || next_run,
                "run {run}: journalled message {v:#x} (seq {}) follows {p:#x}",
                m.seq
            );
        }
        prev = Some(v);
        if let Some(&(got, _)) = b_log.deliveries.get(m.seq as usize - 1) {
            assert_eq!(
                got, v,
                "run {run}: seq {} is message {v:#x} in the journal, {got:#x} at b",
                m.seq
            );
        }
    }
    let facts = Recovery {
        launch_id: journal.launch_id(),
        unacked: unacked.len(),
        sent,
        cut: report.cut.is_some(),
    };
    drop(journal);
    let _ = std::fs::remove_dir_all(&copy);
    facts
}

/// One run of the child process.
struct ChildNode {
    run: u64,
    child: Child,
    stdin: Option<ChildStdin>,
    /// The child's protocol lines (the part after [`MARK`]), as they come.
    lines: Receiver<String>,
    stdout: Option<JoinHandle<()>>,
    stderr: Arc<Mutex<String>>,
    /// The highest count of a `synced` line seen so far.
    synced: u64,
    /// `synced` lines seen so far.
    syncs: u64,
    /// A receiver's deliveries: `(seq, counter)`, in the order its handler ran.
    delivered: Vec<(u64, u64)>,
}

/// What a child runs.
#[derive(Clone, Copy)]
enum Role {
    /// The journalling sender `a`, sending to `b` (or, without `send`, only resending).
    Sender { b: SocketAddr, send: bool },
    /// The journalling receiver `b`, listening on `listen`, printing each delivery.
    Receiver { listen: SocketAddr },
}

impl ChildNode {
    fn spawn(dir: &Path, run: u64, role: Role) -> ChildNode {
        let exe = std::env::current_exe().expect("path of the test binary");
        let mut cmd = Command::new(exe);
        cmd.args([
            "--exact",
            "crash_child",
            "--nocapture",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env(ENV_DIR, dir)
        .env(ENV_RUN, run.to_string());
        let piped = match role {
            Role::Sender { b, send } => {
                cmd.env(ENV_ROLE, "sender")
                    .env(ENV_PEER, b.to_string())
                    .env(ENV_SEND, if send { "1" } else { "0" });
                !send
            }
            Role::Receiver { listen } => {
                cmd.env(ENV_ROLE, "receiver")
                    .env(ENV_LISTEN, listen.to_string());
                true
            }
        };
        let mut child = cmd
            .stdin(if piped { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the child");
        let child::Output {
            lines,
            stdout,
            stderr,
        } = child::output(&mut child, MARK);
        let stdin = child.stdin.take();
        ChildNode {
            run,
            child,
            stdin,
            lines,
            stdout: Some(stdout),
            stderr,
            synced: 0,
            syncs: 0,
            delivered: Vec::new(),
        }
    }

    /// Panics with what the child said on stderr.
    fn fail(&mut self, why: &str) -> ! {
        let _ = self.child.kill();
        let status = self.child.wait();
        panic!(
            "run {}: {why}; child exit: {status:?}; its stderr:\n{}",
            self.run,
            self.stderr.lock().unwrap()
        );
    }

    /// Takes one protocol line into account.
    fn note(&mut self, line: &str) {
        if let Some(rest) = line.strip_prefix("synced ") {
            let mut it = rest.split(' ').map(|s| s.parse::<u64>().ok());
            match (it.next().flatten(), it.next().flatten()) {
                (Some(r), Some(n)) if r == self.run && n >= self.synced => {
                    self.synced = n;
                    self.syncs += 1;
                }
                _ => self.fail(&format!("unexpected line `{line}`")),
            }
        } else if let Some(rest) = line.strip_prefix("d ") {
            let mut it = rest.split(' ').map(|s| s.parse::<u64>().ok());
            match (it.next().flatten(), it.next().flatten()) {
                (Some(seq), Some(counter)) => self.delivered.push((seq, counter)),
                _ => self.fail(&format!("unexpected line `{line}`")),
            }
        } else if line.starts_with("bad ") {
            self.fail(&format!("the receiver got a corrupt message: {line}"));
        }
    }

    /// The next protocol line, waiting at most until `deadline`: `None` at the deadline,
    /// a panic if the child's stdout ended (it exited).
    fn next_line(&mut self, deadline: Instant) -> Option<String> {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(wait) {
            Ok(line) => {
                self.note(&line);
                Some(line)
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => self.fail("the child's output ended"),
        }
    }

    /// Waits for the `started` line: the child recovered its journal and its node is up.
    fn wait_started(&mut self) {
        self.wait_for("started");
    }

    /// Waits for the line `what`.
    fn wait_for(&mut self, what: &str) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.next_line(deadline) {
                Some(l) if l == what => return,
                Some(_) => {}
                None => self.fail(&format!("no `{what}` line within {PATIENCE:?}")),
            }
        }
    }

    /// Fails at once if the child has exited (rather than waiting for deliveries from a
    /// process that is gone).
    fn check_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            self.fail(&format!("the child exited: {status}"));
        }
    }

    /// Takes the lines that have arrived, without waiting.
    fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.note(&line);
        }
    }

    /// Ends the child's input (it shuts down cleanly), and checks its shutdown report and
    /// exit status.
    fn stop(mut self) {
        self.stop_keeping_lines();
    }

    /// [`stop`](Self::stop), keeping the child's lines (a receiver's deliveries) readable.
    fn stop_keeping_lines(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + PATIENCE;
        let report = loop {
            match self.next_line(deadline) {
                Some(l) if l.starts_with("stopped ") => break l["stopped ".len()..].to_owned(),
                Some(_) => {}
                None => self.fail("no clean stop"),
            }
        };
        let status = self.child.wait().expect("wait for the child");
        assert!(
            status.success(),
            "run {}: the child failed: {status}",
            self.run
        );
        assert_eq!(
            report, "undelivered 0",
            "run {}: the child's shutdown report",
            self.run
        );
    }

    /// SIGKILLs the child, checks it was still running, and reads its last lines (they
    /// count: each `synced` followed a successful sync, each `d` a delivery).
    fn kill(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            self.fail(&format!("the child exited before the kill: {status}"));
        }
        self.child.kill().expect("SIGKILL the child");
        let status = self.child.wait().expect("wait for the child");
        assert_eq!(
            status.signal(),
            Some(9),
            "run {}: the child died of something else than the SIGKILL: {status}; stderr:\n{}",
            self.run,
            self.stderr.lock().unwrap()
        );
        if let Some(h) = self.stdout.take() {
            h.join().expect("stdout reader");
        }
        self.drain();
    }
}

impl Drop for ChildNode {
    /// A child left running by a failing test is killed, not orphaned.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn sigkill_at_random_points_loses_nothing_synced_and_never_replays_garbage() {
    let started = Instant::now();
    let seed = seed();
    eprintln!("crash test seed {seed} (replay the choices with COHORT_CRASH_SEED={seed})");
    let mut rng = Rng(seed);
    let dir = TempDir::new("sigkill");
    let log: Arc<Mutex<BLog>> = Arc::default();
    let b = receiver_b(CLUSTER, "127.0.0.1:0")
        .on_message(logging(&log))
        .start()
        .expect("b starts");
    let b_addr = b.local_addr();

    // Per run: the last synced count.
    let mut synced: BTreeMap<u64, u64> = BTreeMap::new();
    let mut max_files = 0;
    // The most segments holding records after a kill.
    let mut max_live = 0;
    let mut launch_id = None;
    // Messages the rounds' recoveries found unacknowledged (to resend), and tails cut.
    let (mut resend, mut cuts) = (0, 0);
    // Messages to b in the journal after the last kill (its `sent` counter).
    let mut journalled = 0;
    // Each child sends with its own run number in its payloads; a round is one run killed
    // under load, sometimes preceded by one killed while it recovers.
    let mut run = 0;
    let mut early_kills = 0;
    for round in 0..ROUNDS {
        if rng.range(0, 3) == 0 {
            // Killed as soon as it says it is opening its journal: somewhere in recovery
            // (reading, cutting a torn tail, recycling) or just after.
            let mut a = ChildNode::spawn(
                dir.path(),
                run,
                Role::Sender {
                    b: b_addr,
                    send: true,
                },
            );
            a.wait_for("starting");
            a.kill();
            let n = a.synced;
            eprintln!("run {run:2}: killed while starting (synced {n})");
            synced.insert(run, n);
            early_kills += 1;
            run += 1;
        }
        let mut a = ChildNode::spawn(
            dir.path(),
            run,
            Role::Sender {
                b: b_addr,
                send: true,
            },
        );
        a.wait_started();
        // Kill after 0 to 8 syncs, then after 0 to 2 × SYNC_EVERY more deliveries (or
        // as soon as another sync covers that point): at every phase of a sync.
        let syncs = rng.range(0, 8);
        let extra = rng.range(0, 2 * SYNC_EVERY);
        let deadline = Instant::now() + PATIENCE;
        while a.syncs < syncs {
            if a.next_line(deadline).is_none() {
                a.fail(&format!("fewer than {syncs} syncs within {PATIENCE:?}"));
            }
        }
        let target = a.synced + extra;
        wait_until_or(
            PATIENCE,
            || {
                a.drain();
                a.check_alive();
                a.synced >= target || log.lock().unwrap().delivered_in(run) >= target
            },
            || format!("round {round}: {target} messages at b; b:\n{}", b.stats()),
        );
        let (at, total) = {
            let log = log.lock().unwrap();
            (log.delivered_in(run), log.deliveries.len())
        };
        a.kill();
        let n = a.synced;
        eprintln!(
            "run {run:2}: killed after {syncs} syncs + {extra} (target {target}): synced {n}, {at} of the run delivered, {total} in all"
        );
        synced.insert(run, n);
        let rec = {
            let log = log.lock().unwrap();
            let received = b.stats().peer("a").map_or(0, |p| p.received);
            recover_copy(dir.path(), run, received, &log)
        };
        assert_eq!(
            *launch_id.get_or_insert(rec.launch_id),
            rec.launch_id,
            "round {round}: the launch id changed"
        );
        resend += rec.unacked;
        journalled = rec.sent;
        cuts += u64::from(rec.cut);
        let files = file_count(dir.path());
        max_files = max_files.max(files);
        let ins = cohort::inspect_journal(dir.path()).expect("inspect the journal");
        max_live = max_live.max(ins.segments.len() - ins.pool().count());
        assert!(
            ins.segments.iter().all(|s| matches!(
                s.status,
                SegmentStatus::State(_) | SegmentStatus::Uninitialised
            )),
            "round {round}: a damaged segment header after a kill:\n{ins}"
        );
        assert!(
            files <= MAX_FILES,
            "round {round}: the journal holds {files} files (at most {MAX_FILES} expected):\n{ins}"
        );
        run += 1;
    }

    // A last start, without sending: `a` resends what `b` lacks — everything the journal
    // held after the last kill, synced or not — then stops cleanly. `b` may hold it all
    // already (what the last run wrote before its kill): `a` must connect all the same, to
    // learn it and record it in its journal.
    let connects = peer_stats(&b, "a").connects;
    let mut a = ChildNode::spawn(
        dir.path(),
        run,
        Role::Sender {
            b: b_addr,
            send: false,
        },
    );
    a.wait_started();
    wait_until_or(
        PATIENCE,
        || {
            let p = peer_stats(&b, "a");
            p.received >= journalled && p.connects > connects
        },
        || {
            format!(
                "the {journalled} journalled messages at b; synced per run {synced:?}, reached b {:?}; b:\n{}\n{}",
                log.lock().unwrap().reached,
                b.stats(),
                cohort::inspect_journal(dir.path())
                    .map_or_else(|e| e.to_string(), |i| i.to_string())
            )
        },
    );
    a.stop();
    let after_rounds = peer_stats(&b, "a");

    // Clean restarts (the Qpid reproducer, in small): each connects, resends nothing (the
    // journal recorded b's acks at the clean stop) and adds no file.
    let files = file_count(dir.path());
    for k in 0..3 {
        let connects = peer_stats(&b, "a").connects;
        let mut a = ChildNode::spawn(
            dir.path(),
            run + 1 + k,
            Role::Sender {
                b: b_addr,
                send: false,
            },
        );
        a.wait_started();
        wait_until("a to reconnect to b", PATIENCE, || {
            peer_stats(&b, "a").connects > connects
        });
        a.stop();
        assert_eq!(
            file_count(dir.path()),
            files,
            "clean restart {k} changed the number of files:\n{}",
            cohort::inspect_journal(dir.path()).map_or_else(|e| e.to_string(), |i| i.to_string())
        );
    }
    let bs = peer_stats(&b, "a");
    assert_eq!(
        (bs.received, bs.duplicates),
        (after_rounds.received, after_rounds.duplicates),
        "a clean restart sent or resent something"
    );

    // b's view: one stream, seq 1, 2, 3, … with no gap and no duplicate, made of each
    // run's messages 0, 1, … up to where the kill cut it, every synced one included.
    let log = log.lock().unwrap();
    assert!(
        log.errors.is_empty(),
        "corrupt deliveries: {:?}",
        log.errors
    );
    let mut per_run: BTreeMap<u64, u64> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut run = 0;
    for (k, &(v, seq)) in log.deliveries.iter().enumerate() {
        if seq != k as u64 + 1 {
            problems.push(format!("delivery {k}: seq {seq}, expected {}", k + 1));
        }
        let (r, i) = (v >> 32, v & 0xFFFF_FFFF);
        let next = per_run.get(&r).copied().unwrap_or(0);
        if r < run || i != next {
            problems.push(format!(
                "delivery {k} (seq {seq}): message {i} of run {r}, expected {next} (stream in run {run})"
            ));
        }
        run = r;
        per_run.insert(r, i + 1);
        if problems.len() >= 10 {
            break;
        }
    }
    assert!(problems.is_empty(), "b's stream from a: {problems:#?}");
    for (&r, &n) in &synced {
        let got = per_run.get(&r).copied().unwrap_or(0);
        assert!(
            got >= n,
            "run {r}: {n} messages synced, only {got} reached b (lost)"
        );
    }
    assert_eq!(bs.delivered, log.deliveries.len() as u64);

    // The journal: nothing left to resend, no leaked file, no leftover `.tmp`; everything
    // acked, so the pool holds all but the live segments.
    let (journal, recovered) = Journal::open(
        JournalConfig::new(dir.path(), "a")
            .cluster(CLUSTER)
            .segment_size(SEGMENT),
    )
    .expect("the journal opens after the rounds");
    let left = recovered.peers.get("b").map_or(0, |p| p.unacked.len());
    assert_eq!(left, 0, "messages left to resend after a clean stop");
    drop(journal);
    let ins = cohort::inspect_journal(dir.path()).expect("inspect the journal");
    let pool = ins.pool().count();
    let live = ins.segments.len() - pool;
    assert!(ins.temp_files.is_empty(), "leftover temp files:\n{ins}");
    assert!(
        ins.segments.len() < MAX_FILES && live <= 2,
        "after the rounds, with every message acked:\n{ins}"
    );
    eprintln!(
        "{ROUNDS} SIGKILL rounds under load and {early_kills} while starting, in {:.1?}: {} messages delivered to b, {} duplicates dropped by seq \
         ({resend} found unacked by recovery, {cuts} tails cut); \
         (synced, delivered) per run {:?}; journal: {} segment files ({} in the pool), \
         at most {max_files} files in the directory and {max_live} live segments after a kill",
        started.elapsed(),
        log.deliveries.len(),
        bs.duplicates,
        synced
            .iter()
            .map(|(r, &n)| (n, per_run.get(r).copied().unwrap_or(0)))
            .collect::<Vec<_>>(),
        ins.segments.len(),
        pool,
    );
    drop(log);
    shutdown_all(&[b]);
}

/// Rounds of the receiver crash test.
const RX_ROUNDS: u64 = 20;
/// The sender's window in the receiver crash test: large enough for a backlog of thousands
/// of messages at `b`, so that kills often land with messages received and not yet handled
/// (or handled and not yet recorded) — the cases at-least-once delivery is about. With a
/// quarter of it, a scratch change that records messages as delivered when they are
/// received was caught in 1 of 3 runs; with this window, in 5 of 5.
const RX_WINDOW: u64 = 2 << 20;

#[test]
fn a_receiver_killed_at_random_points_loses_nothing_and_redelivers_in_order() {
    // The journalling member is the receiver `b`, in the child; the sender `a` (no
    // journal) runs here and sends without pause across all of b's crashes. b acks only
    // what its journal records as delivered, so each restart may deliver again the
    // messages handled after the last record — in order, continuing the stream — and
    // never skips one.
    let started = Instant::now();
    let seed = seed();
    eprintln!("receiver crash test seed {seed} (replay the choices with COHORT_CRASH_SEED={seed})");
    let mut rng = Rng(seed);
    let dir = TempDir::new("sigkill-rx");
    // Every incarnation of b (a child process) listens here; held for the whole test, so the
    // port stays b's while it is dead.
    let held = HeldAddr::new();
    let listen = held.addr();
    let a = Node::builder("a")
        .cluster(CLUSTER_RX)
        .peer("b", listen)
        .window_bytes(RX_WINDOW)
        .redial_quickly()
        .start()
        .expect("a starts");
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let tx = a.sender();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                match tx.send_timeout("b", payload(i, size_of(i)), Duration::from_millis(20)) {
                    Ok(()) => i += 1,
                    // b is down: try again
                    Err(e) if matches!(e.error(), cohort::Error::TimedOut(_)) => {}
                    Err(e) => panic!("a -> b: {e}"),
                }
            }
            i
        })
    };

    // What each incarnation of b delivered, `(seq, counter)` in handler order.
    let mut incarnations: Vec<Vec<(u64, u64)>> = Vec::new();
    let mut early_kills = 0;
    let mut max_files = 0;
    for round in 0..RX_ROUNDS {
        if rng.range(0, 3) == 0 {
            let mut b = ChildNode::spawn(dir.path(), round, Role::Receiver { listen });
            b.wait_for("starting");
            b.kill();
            incarnations.push(std::mem::take(&mut b.delivered));
            early_kills += 1;
        }
        let mut b = ChildNode::spawn(dir.path(), round, Role::Receiver { listen });
        b.wait_started();
        let deliveries = rng.range(0, 3000);
        wait_until_or(
            PATIENCE,
            || {
                b.drain();
                b.check_alive();
                b.delivered.len() as u64 >= deliveries
            },
            || format!("round {round}: {deliveries} deliveries; a:\n{}", a.stats()),
        );
        b.kill();
        incarnations.push(std::mem::take(&mut b.delivered));
        let files = file_count(dir.path());
        max_files = max_files.max(files);
        assert!(
            files <= 6,
            "round {round}: b's journal (delivery records only) holds {files} files:\n{}",
            cohort::inspect_journal(dir.path()).map_or_else(|e| e.to_string(), |i| i.to_string())
        );
    }
    stop.store(true, Ordering::Relaxed);
    let sent = sender.join().expect("the sending thread");

    // A last start: everything a accepted arrives, then b stops cleanly.
    let mut b = ChildNode::spawn(dir.path(), RX_ROUNDS, Role::Receiver { listen });
    b.wait_started();
    let seen_before = incarnations
        .iter()
        .flat_map(|inc| inc.iter().map(|&(seq, _)| seq))
        .max()
        .unwrap_or(0);
    wait_until_or(
        PATIENCE,
        || {
            b.drain();
            b.check_alive();
            seen_before.max(b.delivered.last().map_or(0, |&(seq, _)| seq)) >= sent
        },
        || format!("all {sent} messages at b; a:\n{}", a.stats()),
    );
    let connects = peer_stats(&a, "b").connects;
    b.stop_keeping_lines();
    incarnations.push(std::mem::take(&mut b.delivered));

    // Per incarnation: contiguous seqs, counter = seq - 1, starting at most one past the
    // highest seq any earlier incarnation handled (no gap); everything at or below that is
    // a redelivery.
    let mut max_seen = 0;
    let mut redelivered = 0;
    let mut max_redelivered = 0;
    let mut problems = Vec::new();
    for (k, inc) in incarnations.iter().enumerate() {
        let mut prev = None;
        let mut again = 0;
        for &(seq, counter) in inc {
            if counter != seq - 1 {
                problems.push(format!(
                    "incarnation {k}: seq {seq} carries message {counter}"
                ));
            }
            match prev {
                None if seq > max_seen + 1 => problems.push(format!(
                    "incarnation {k} starts at seq {seq}, but only {max_seen} were delivered before (gap)"
                )),
                Some(p) if seq != p + 1 => {
                    problems.push(format!("incarnation {k}: seq {seq} after {p}"))
                }
                _ => {}
            }
            if seq <= max_seen {
                again += 1;
            }
            prev = Some(seq);
        }
        redelivered += again;
        max_redelivered = max_redelivered.max(again);
        max_seen = max_seen.max(prev.unwrap_or(0));
        if problems.len() >= 10 {
            break;
        }
    }
    assert!(problems.is_empty(), "b's deliveries: {problems:#?}");
    assert_eq!(max_seen, sent, "every message a accepted was delivered");
    let s = peer_stats(&a, "b");
    assert_eq!(
        s.undelivered, 0,
        "b kept its launch id: nothing retired undelivered"
    );

    // A clean stop recorded everything: restarts deliver nothing again and keep the file
    // count.
    let files = file_count(dir.path());
    for k in 0..2 {
        let connects_before = peer_stats(&a, "b").connects.max(connects);
        let mut b = ChildNode::spawn(dir.path(), RX_ROUNDS + 1 + k, Role::Receiver { listen });
        b.wait_started();
        wait_until("a to reconnect to b", PATIENCE, || {
            peer_stats(&a, "b").connects > connects_before
        });
        b.stop_keeping_lines();
        assert!(
            b.delivered.is_empty(),
            "clean restart {k} delivered again: {:?}",
            &b.delivered[..b.delivered.len().min(10)]
        );
        assert_eq!(
            file_count(dir.path()),
            files,
            "clean restart {k} changed the files"
        );
    }
    let (journal, recovered) = Journal::open(
        JournalConfig::new(dir.path(), "b")
            .cluster(CLUSTER_RX)
            .segment_size(SEGMENT),
    )
    .expect("b's journal opens");
    assert_eq!(
        recovered.peers.get("a").map(|p| p.counters.delivered),
        Some(sent),
        "b's journal records every message as delivered"
    );
    drop(journal);
    eprintln!(
        "{RX_ROUNDS} receiver SIGKILL rounds and {early_kills} while starting, in {:.1?}: a sent {sent}, \
         b handled {} deliveries in {} incarnations, {redelivered} of them again after a crash \
         (at most {max_redelivered} after one); a resent {}; at most {max_files} files in b's journal",
        started.elapsed(),
        incarnations.iter().map(Vec::len).sum::<usize>(),
        incarnations.len(),
        s.resent,
    );
    shutdown_all(&[a]);
}

/// Writes one protocol line to stdout and flushes it, so the parent has it even if the
/// next instant is a SIGKILL.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{MARK}{line}").expect("stdout");
    out.flush().expect("flush stdout");
}

/// The child process of the crash tests: does nothing unless a crash test configured it
/// through the `COHORT_CRASH_*` environment variables, then runs the journalling sender `a`
/// ([`sender_child`]) or the journalling receiver `b` ([`receiver_child`]).
#[test]
#[ignore = "re-executed by the crash tests"]
fn crash_child() {
    let Ok(dir) = std::env::var(ENV_DIR) else {
        eprintln!("crash_child runs only under the crash tests");
        return;
    };
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let run: u64 = env(ENV_RUN).parse().expect("run number");
    match env(ENV_ROLE).as_str() {
        "sender" => sender_child(
            &dir,
            env(ENV_PEER).parse().expect("peer address"),
            run,
            env(ENV_SEND) == "1",
        ),
        "receiver" => receiver_child(&dir, env(ENV_LISTEN).parse().expect("listen address")),
        other => panic!("unknown role {other:?}"),
    }
}

/// The journalling member `a`: with `send` it sends to `b` until it is killed, syncing its
/// journal every [`SYNC_EVERY`] messages and printing `synced <run> <count>` after each;
/// without, it only starts (resending what `b` lacks) and shuts down cleanly when its stdin
/// ends.
fn sender_child(dir: &str, b: SocketAddr, run: u64, send: bool) {
    say("starting");
    let a = journalled_a(CLUSTER, Path::new(dir), b)
        .journal_fsync(FsyncPolicy::EveryBatch)
        .journal_segment_size(SEGMENT)
        .window_bytes(WINDOW)
        .redial_quickly()
        .start()
        .expect("a starts from its journal");
    say("started");
    if !send {
        // Wait for the parent to close stdin.
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        let report = a.shutdown(SHUTDOWN).expect("clean shutdown");
        say(&format!("stopped undelivered {}", report.undelivered));
        return;
    }
    let tx = a.sender();
    for i in 0..CHILD_CAP {
        let v = value(run, i);
        send_patiently(&tx, "b", payload(v, size_of(v)));
        if (i + 1) % SYNC_EVERY == 0 {
            a.sync_journal(PATIENCE).expect("sync_journal");
            let s = peer_stats(&a, "b");
            // What `synced` promises: every message accepted so far is in the journal.
            assert_eq!(
                s.queued, 0,
                "sync_journal returned with messages not journalled: {s:?}"
            );
            say(&format!("synced {run} {}", i + 1));
        }
    }
    a.shutdown(SHUTDOWN).expect("shutdown");
}

/// The journalling member `b`: prints `d <seq> <counter>` from its handler for each
/// delivery (before the handler returns, so before the journal can record it as delivered),
/// or `bad <why>` for a corrupt one; shuts down cleanly when its stdin ends.
fn receiver_child(dir: &str, listen: SocketAddr) {
    say("starting");
    let b = receiver_b(CLUSTER_RX, listen)
        .journal(dir)
        .journal_fsync(FsyncPolicy::EveryBatch)
        .journal_segment_size(SEGMENT)
        .on_message(|d: Delivery| {
            let line = match (counter_of(d.payload()), d.seq()) {
                (Ok(v), Some(seq)) if d.payload().len() == size_of(v) => format!("d {seq} {v}"),
                (Ok(v), seq) => format!(
                    "bad message {v} (seq {seq:?}) has {} bytes, expected {}",
                    d.payload().len(),
                    size_of(v)
                ),
                (Err(e), seq) => format!("bad seq {seq:?}: {e}"),
            };
            say(&line);
        })
        .start()
        .expect("b starts from its journal");
    say("started");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    let report = b.shutdown(SHUTDOWN).expect("clean shutdown");
    say(&format!("stopped undelivered {}", report.undelivered));
}
