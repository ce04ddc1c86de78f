//! Threads: this process's threads by name (a node names its own), and threads a test
//! spawns and watches park in the kernel.

use std::thread::JoinHandle;

use cohort::{Bytes, Node, SendError, Sender};

use super::messages::payload;
use super::nodes::all_stats;
use super::wait::{wait_until, wait_until_or, PATIENCE};

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

/// Waits until no thread whose name starts with `prefix` is left. A joined thread's
/// `/proc` entry can outlive `pthread_join` by a moment (the kernel wakes the joiner before
/// it reaps the task), so this waits rather than checks once.
pub(crate) fn wait_threads_gone(prefix: &str) {
    wait_until_or(
        PATIENCE,
        || threads_named(prefix).is_empty(),
        || format!("threads {:?} to end", threads_named(prefix)),
    );
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

/// A thread spawned by a test, with its kernel id, so the test can see it park.
#[derive(Debug)]
pub(crate) struct Watched<T> {
    handle: JoinHandle<T>,
    tid: u32,
}

impl<T: Send + 'static> Watched<T> {
    /// Spawns `f` on a thread named `name` and learns its kernel id.
    pub(crate) fn spawn(name: &str, f: impl FnOnce() -> T + Send + 'static) -> Watched<T> {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                tid_tx.send(current_tid()).expect("report tid");
                f()
            })
            .expect("spawn");
        let tid = tid_rx.recv().expect("tid");
        Watched { handle, tid }
    }

    /// Waits (deadline-bounded) until the thread sleeps in the kernel (state `S`: parked,
    /// e.g. on a dry window) or has finished.
    pub(crate) fn wait_parked(&self, what: &str) {
        wait_until(what, PATIENCE, || {
            self.handle.is_finished() || thread_state(self.tid) == Some('S')
        });
    }

    /// Whether the thread has finished.
    pub(crate) fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// The thread's handle.
    pub(crate) fn into_handle(self) -> JoinHandle<T> {
        self.handle
    }
}

/// Spawns a thread that `send`s one message of `size` bytes to `to` (whose window must be
/// dry) and waits until that thread is parked in the kernel, i.e. blocked on the window.
pub(crate) fn blocked_sender(
    sender: Sender,
    to: &'static str,
    size: usize,
) -> JoinHandle<Result<(), SendError<Bytes>>> {
    let t = Watched::spawn("blocked-sender", move || {
        sender.send(to, payload(u64::MAX / 2, size))
    });
    t.wait_parked("the sender to park on the dry window");
    let handle = t.into_handle();
    assert!(
        !handle.is_finished(),
        "send on a dry window returned at once: {:?}",
        handle.join()
    );
    handle
}

/// Waits (with a deadline) for a thread to finish and returns its result; the failure
/// message shows `what` and the stats of `nodes`.
pub(crate) fn join_within<T>(what: &str, nodes: &[Node], h: JoinHandle<T>) -> T {
    wait_until_or(
        PATIENCE,
        || h.is_finished(),
        || format!("{what}; stats:\n{}", all_stats(nodes)),
    );
    h.join().expect("thread panicked")
}
