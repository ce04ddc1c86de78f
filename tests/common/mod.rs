//! Helpers shared by the integration tests: waiting on a condition with a deadline, building
//! a full mesh of nodes on 127.0.0.1, checking per-sender order in a handler, reserving a
//! port, and looking at the process's threads by name.
//!
//! Every test binary includes this module and uses only part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fmt::Display;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cohort::{Builder, Delivery, Node, PeerState, Stats};

/// How long a test waits for something that should happen "soon" before declaring it never
/// will. Generous: the machine is shared and noisy, and this only matters when a test fails.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// Deadline given to `shutdown` by tests that expect it to succeed.
pub(crate) const SHUTDOWN: Duration = Duration::from_secs(10);

/// Polls `cond` until it holds; panics with `what` if it still does not after `timeout`.
/// Polls with a short park, never with a fixed sleep standing in for the event.
pub(crate) fn wait_until(what: impl Display, timeout: Duration, cond: impl FnMut() -> bool) {
    wait_until_or(timeout, cond, || what.to_string());
}

/// Like [`wait_until`], but the panic message is built at the deadline (so it can show the
/// state that was reached, e.g. a node's stats).
pub(crate) fn wait_until_or(
    timeout: Duration,
    mut cond: impl FnMut() -> bool,
    explain: impl FnOnce() -> String,
) {
    let deadline = Instant::now() + timeout;
    let mut spins = 0u32;
    loop {
        if cond() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for: {}", explain());
        }
        if spins < 64 {
            spins += 1;
            std::thread::yield_now();
        } else {
            std::thread::park_timeout(Duration::from_millis(1));
        }
    }
}

/// A port on 127.0.0.1 that was free a moment ago: bound to an ephemeral port, then released.
pub(crate) fn reserve_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr")
}

/// Starts every builder, then makes each node a peer of every other (`add_peer`), so the
/// members dial each other at about the same time.
pub(crate) fn start_mesh(builders: Vec<Builder>) -> Vec<Node> {
    let nodes: Vec<Node> = builders
        .into_iter()
        .map(|b| b.start().expect("node starts"))
        .collect();
    for a in &nodes {
        for b in &nodes {
            if a.name() != b.name() {
                a.add_peer(b.name(), b.local_addr()).expect("add_peer");
            }
        }
    }
    nodes
}

/// Whether `node` sees `peer` as `Connected`.
pub(crate) fn is_connected(node: &Node, peer: &str) -> bool {
    node.stats()
        .peer(peer)
        .is_some_and(|p| p.state == PeerState::Connected)
}

/// Waits until every node has every other as `Connected`, over exactly one established
/// connection each.
pub(crate) fn wait_mesh_connected(nodes: &[Node]) {
    let n = nodes.len() as u64;
    wait_until_or(
        PATIENCE,
        || {
            nodes.iter().all(|a| {
                let s = a.stats();
                s.peers.len() as u64 == n - 1
                    && s.peers.iter().all(|p| p.state == PeerState::Connected)
                    && s.connections.established == n - 1
                    && s.connections.open == n - 1
            })
        },
        || format!("a connected mesh; stats:\n{}", all_stats(nodes)),
    );
}

/// Every node's stats table, for failure messages.
pub(crate) fn all_stats(nodes: &[Node]) -> String {
    nodes
        .iter()
        .map(|n| n.stats().to_string())
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// Shuts every node down, asserting each shutdown succeeds.
pub(crate) fn shutdown_all(nodes: &[Node]) {
    for n in nodes {
        n.shutdown(SHUTDOWN)
            .unwrap_or_else(|e| panic!("shutdown of {} failed: {e}", n.name()));
    }
}

/// A test payload: `counter` as 8 little-endian bytes, padded with a byte pattern derived
/// from the counter to `size` bytes (at least 8).
pub(crate) fn payload(counter: u64, size: usize) -> Vec<u8> {
    let mut v = vec![(counter % 251) as u8; size.max(8)];
    v[..8].copy_from_slice(&counter.to_le_bytes());
    v
}

/// The counter of a [`payload`], after checking the padding is intact.
pub(crate) fn counter_of(bytes: &[u8]) -> Result<u64, String> {
    if bytes.len() < 8 {
        return Err(format!("payload of {} bytes has no counter", bytes.len()));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if bytes[8..].iter().any(|&b| b != (n % 251) as u8) {
        return Err(format!("payload {n} is corrupt"));
    }
    Ok(n)
}

/// What one receiver saw from one sender.
#[derive(Debug, Default, Clone)]
struct Track {
    /// The counter expected next.
    next: u64,
    /// Sequence number of the last regular message.
    last_seq: u64,
}

/// Checks, inside a handler, that each sender's regular messages arrive complete and in
/// order: payload counters 0, 1, 2, … and `Delivery::seq()` 1, 2, 3, … (one more per regular
/// message). Violations are recorded, not panicked on (a panic in a handler is caught by the
/// pool), and asserted by [`OrderCheck::assert_ok`].
#[derive(Debug, Default)]
pub(crate) struct OrderCheck {
    per_sender: Mutex<HashMap<String, Track>>,
    errors: Mutex<Vec<String>>,
    total: AtomicU64,
}

impl OrderCheck {
    /// A fresh, shareable checker.
    pub(crate) fn new() -> Arc<OrderCheck> {
        Arc::new(OrderCheck::default())
    }

    /// Records one delivery.
    pub(crate) fn record(&self, d: &Delivery) {
        let mut map = self.per_sender.lock().unwrap();
        let t = map.entry(d.from().to_owned()).or_default();
        let problem = match counter_of(d.payload()) {
            Err(e) => Some(format!("from {}: {e}", d.from())),
            Ok(_) if d.is_oob() => Some(format!("from {}: unexpected OOB message", d.from())),
            Ok(n) if n != t.next => Some(format!(
                "from {}: counter {n}, expected {} (out of order, lost or duplicated)",
                d.from(),
                t.next
            )),
            Ok(n) if d.seq() != Some(t.last_seq + 1) => Some(format!(
                "from {}: message {n} has seq {:?}, expected Some({})",
                d.from(),
                d.seq(),
                t.last_seq + 1
            )),
            Ok(_) => None,
        };
        if let Ok(n) = counter_of(d.payload()) {
            t.next = n + 1;
        }
        if let Some(s) = d.seq() {
            t.last_seq = s;
        }
        drop(map);
        if let Some(p) = problem {
            let mut errors = self.errors.lock().unwrap();
            if errors.len() < 20 {
                errors.push(p);
            }
        }
        self.total.fetch_add(1, Ordering::SeqCst);
    }

    /// Messages recorded so far, all senders.
    pub(crate) fn total(&self) -> u64 {
        self.total.load(Ordering::SeqCst)
    }

    /// Messages recorded from `sender` (the next counter expected from it).
    pub(crate) fn count_from(&self, sender: &str) -> u64 {
        self.per_sender
            .lock()
            .unwrap()
            .get(sender)
            .map_or(0, |t| t.next)
    }

    /// Panics if any delivery was out of order, lost, duplicated or corrupt.
    pub(crate) fn assert_ok(&self) {
        let errors = self.errors.lock().unwrap();
        assert!(errors.is_empty(), "order violations: {errors:#?}");
    }
}

/// A gate a handler can wait on until the test opens it.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    open: Mutex<bool>,
    cond: Condvar,
}

impl Gate {
    /// A closed gate.
    pub(crate) fn new() -> Arc<Gate> {
        Arc::new(Gate::default())
    }

    /// Blocks until the gate is open.
    pub(crate) fn pass(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cond.wait(open).unwrap();
        }
    }

    /// Opens the gate for good.
    pub(crate) fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cond.notify_all();
    }
}

/// Names (`comm`, at most 15 bytes) of this process's threads that start with `prefix`.
pub(crate) fn threads_named(prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for entry in dir.flatten() {
        // A thread may exit between the listing and the read: skip it.
        if let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) {
            let comm = comm.trim_end().to_owned();
            if comm.starts_with(prefix) {
                out.push(comm);
            }
        }
    }
    out.sort();
    out
}

/// The kernel's id of the calling thread (Linux: from `/proc/thread-self`).
pub(crate) fn current_tid() -> u32 {
    let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    link.file_name()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .expect("a numeric tid")
}

/// The scheduler state letter of thread `tid` of this process (`R` running, `S` sleeping…).
pub(crate) fn thread_state(tid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // "tid (comm) S ..." — comm may contain spaces and parentheses: split at the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// Stats of `node`'s peer `peer`; panics if the node has no such peer.
pub(crate) fn peer_stats(node: &Node, peer: &str) -> cohort::PeerStats {
    let s: Stats = node.stats();
    s.peer(peer)
        .cloned()
        .unwrap_or_else(|| panic!("{} has no peer {peer}:\n{s}", node.name()))
}

/// Sends like `Sender::send`, but gives up (panicking with the reason) after [`PATIENCE`]
/// instead of blocking for ever, so that credit that never comes back fails the test
/// rather than hanging it.
pub(crate) fn send_patiently(sender: &cohort::Sender, to: &str, payload: Vec<u8>) {
    if let Err(e) = sender.send_timeout(to, payload, PATIENCE) {
        panic!("{} -> {to}: send failed: {e}", sender.node_name());
    }
}

/// Spawns a thread that `send`s one message of `size` bytes to `to` (whose window must be
/// dry) and waits until that thread is parked in the kernel, i.e. blocked on the window.
pub(crate) fn blocked_sender(
    sender: cohort::Sender,
    to: &'static str,
    size: usize,
) -> std::thread::JoinHandle<Result<(), cohort::Error>> {
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("blocked-sender".into())
        .spawn(move || {
            tid_tx.send(current_tid()).expect("report tid");
            sender.send(to, payload(u64::MAX / 2, size))
        })
        .expect("spawn");
    let tid = tid_rx.recv().expect("tid");
    wait_until("the sender to park on the dry window", PATIENCE, || {
        handle.is_finished() || thread_state(tid) == Some('S')
    });
    assert!(
        !handle.is_finished(),
        "send on a dry window returned at once: {:?}",
        handle.join()
    );
    handle
}

/// A fresh directory under the system temp dir, removed on drop; kept (and named on stderr)
/// when the test is failing, for `cohort::journal::inspect`.
#[allow(dead_code)] // not every test binary uses it
pub(crate) struct TempDir(std::path::PathBuf);

#[allow(dead_code)]
impl TempDir {
    pub(crate) fn new(name: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "cohort-test-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        TempDir(path)
    }
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("journal kept for inspection: {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
