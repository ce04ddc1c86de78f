//! The network layer: one IO thread drives the node's protocol (`proto::Endpoint`) with a
//! mio `Poll`, the listener and one socket per link. Application threads and pool threads
//! talk to it through [`IoShared`]: a few mutex-guarded lists and one `Waker`, woken at
//! most once per batch of requests.

mod conn;
mod io;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Instant;

pub(crate) use conn::TlsSetup;
pub(crate) use io::IoThread;

use crate::deliver::{CreditSink, MemberQueue, OobQueue, Pool, Progress};
use crate::flow::RecvCredit;
use crate::journal::{Journal, Recovered};
use crate::peer::PeerShared;
use crate::proto::{JournalLeft, NodeCounters, Unacked};
use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use crate::sync::{Arc, Condvar, Mutex, RwLock, SharedStr};
use crate::util::NameHash;

/// Token of the listener.
pub(crate) const LISTENER: mio::Token = mio::Token(0);
/// Token of the waker.
pub(crate) const WAKER: mio::Token = mio::Token(1);
/// First token handed to a connection.
pub(crate) const FIRST_CONN: usize = 2;

/// Settings the IO thread needs: the protocol's, and the sockets'.
#[derive(Clone)]
pub(crate) struct IoConfig {
    pub(crate) proto: crate::proto::Config,
    pub(crate) send_buffer: Option<usize>,
    pub(crate) recv_buffer: Option<usize>,
    /// TLS for every connection (feature `tls`); always `None` without the feature.
    pub(crate) tls: Option<TlsSetup>,
}

/// Requests from the node handle to the IO thread.
#[derive(Debug)]
pub(crate) enum Command {
    /// Start managing a peer (dial it if it has an address).
    AddPeer {
        peer: Arc<PeerShared>,
        addr: Option<SocketAddr>,
    },
    /// Close the peer for good: fail its queued messages, drop its connections.
    RemovePeer { id: usize, done: Arc<Completion> },
    /// Drop the peer's connection; recovery brings it back.
    Disconnect { id: usize },
    /// Flush, close everything and exit by `deadline`.
    Shutdown { deadline: Instant },
    /// Journal what is queued, force the journal to disk, then complete.
    SyncJournal { done: Arc<Completion> },
    /// Complete once every command before it has been handled.
    Barrier { done: Arc<Completion> },
}

/// A one-shot "done" signal.
#[derive(Debug, Default)]
pub(crate) struct Completion {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Completion {
    pub(crate) fn complete(&self) {
        *self.done.lock() = true;
        self.cv.notify_all();
    }
    /// Waits until completed or `deadline`; returns whether it completed.
    pub(crate) fn wait_until(&self, deadline: Instant) -> bool {
        let mut d = self.done.lock();
        while !*d {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            crate::sync::wait_timeout(&self.cv, &mut d, deadline - now);
        }
        true
    }
}

/// The peers a node knows, by name; shared by the node handle (send path) and the IO thread
/// (which adds members that dial in when unknown members are allowed).
pub(crate) type PeerMap = Arc<RwLock<HashMap<SharedStr, Arc<PeerShared>, NameHash>>>;

/// What the application receives about messages that will never be delivered.
pub(crate) type UndeliveredHook = Arc<dyn Fn(&str, Vec<Unacked>) + Send + Sync>;

/// The IO thread's inbox, shared with every other thread.
pub(crate) struct IoShared {
    waker: mio::Waker,
    /// Set by the first requester after the IO thread last looked; the IO thread clears it
    /// before taking the lists, so a request is either taken or wakes it again.
    wake_pending: AtomicBool,
    pub(crate) commands: Mutex<Vec<Command>>,
    /// Peers with newly accepted messages.
    pub(crate) ready: Mutex<Vec<usize>>,
    /// Peers whose receive credit should be returned now.
    pub(crate) credit_flush: Mutex<Vec<usize>>,
    next_peer: AtomicUsize,
    /// Pool threads that may deliver one sender's out-of-band messages at once.
    oob_limit: usize,
    /// Sends wake-ups skipped because one was already pending (a measure of batching).
    pub(crate) wakes: crate::sync::atomic::AtomicU64,
    /// The node journals: peers track how far their streams have been handled.
    journalled: bool,
    /// The journal's counters as of its last write (journalling nodes only).
    pub(crate) journal_stats: Mutex<Option<crate::journal::JournalStats>>,
    /// The journal, handed over by the IO thread when it exits.
    pub(crate) journal_left: Mutex<Option<JournalLeft>>,
}

impl std::fmt::Debug for IoShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoShared").finish_non_exhaustive()
    }
}

impl IoShared {
    pub(crate) fn new(waker: mio::Waker, journalled: bool, oob_limit: usize) -> IoShared {
        IoShared {
            waker,
            wake_pending: AtomicBool::new(false),
            commands: Mutex::new(Vec::new()),
            ready: Mutex::new(Vec::new()),
            credit_flush: Mutex::new(Vec::new()),
            next_peer: AtomicUsize::new(0),
            oob_limit,
            wakes: crate::sync::atomic::AtomicU64::new(0),
            journalled,
            journal_stats: Mutex::new(None),
            journal_left: Mutex::new(None),
        }
    }

    /// Wakes the IO thread unless a wake-up is already pending.
    pub(crate) fn wake(&self) {
        // AcqRel: our list push (under its mutex) happens-before the IO thread's take.
        if !self.wake_pending.swap(true, Ordering::AcqRel) {
            self.wakes.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = self.waker.wake() {
                log::error!("cannot wake the IO thread: {e}");
            }
        }
    }

    /// IO thread: whether a wake-up was requested since the last call (and clears it).
    pub(crate) fn take_wake(&self) -> bool {
        self.wake_pending.swap(false, Ordering::AcqRel)
    }

    pub(crate) fn command(&self, c: Command) {
        self.commands.lock().push(c);
        self.wake();
    }

    /// Puts peer `id` on the ready list unless it is already there.
    #[inline]
    pub(crate) fn schedule(&self, peer: &PeerShared) {
        // The IO thread clears `scheduled` before it locks the outbox to drain it. Our push
        // went through that same lock, so either the drain sees our message, or the clear is
        // ordered before our push and the load below sees `false`. Loading first keeps the
        // common case (IO thread busy, flag already set) free of a contended write.
        if !peer.scheduled.load(Ordering::Acquire) && !peer.scheduled.swap(true, Ordering::AcqRel) {
            self.ready.lock().push(peer.id);
            self.wake();
        }
    }

    pub(crate) fn next_peer_id(&self) -> usize {
        self.next_peer.fetch_add(1, Ordering::Relaxed)
    }

    /// Builds the shared state of a new peer, wiring its receive credit to this IO thread.
    pub(crate) fn new_peer(self: &Arc<Self>, name: SharedStr, window: u64) -> Arc<PeerShared> {
        let id = self.next_peer_id();
        let credit = Arc::new(RecvCredit::new());
        let progress = self.journalled.then(|| Arc::new(Progress::new(0)));
        let sink = PeerCreditSink {
            peer: id,
            credit: credit.clone(),
            progress: progress.clone(),
            io: self.clone(),
        };
        let oob_sink = Arc::new(PeerCreditSink {
            peer: id,
            credit: credit.clone(),
            progress: progress.clone(),
            io: self.clone(),
        });
        let member = Arc::new(MemberQueue::new(name.clone(), Box::new(sink)));
        let oob = Arc::new(OobQueue::new(name.clone(), self.oob_limit, oob_sink));
        Arc::new(PeerShared::new(
            id, name, window, credit, member, oob, progress,
        ))
    }
}

/// Connects a sender's consumption to the IO thread: credit goes back when half the
/// sender's window has been consumed, or when its queue goes idle.
struct PeerCreditSink {
    peer: usize,
    credit: Arc<RecvCredit>,
    /// With a journal: how far the application has handled the peer's reliable stream.
    progress: Option<Arc<Progress>>,
    io: Arc<IoShared>,
}

impl PeerCreditSink {
    fn request(&self) {
        if self.credit.request_flush() {
            self.io.credit_flush.lock().push(self.peer);
            self.io.wake();
        }
    }
}

impl CreditSink for PeerCreditSink {
    fn consumed(&self, epoch: u32, bytes: u64) {
        if self.credit.consumed(epoch, bytes) {
            self.request();
        }
    }
    fn tracks_progress(&self) -> bool {
        self.progress.is_some()
    }
    fn handled(&self, epoch: u32, seqs: &[u64]) {
        if let Some(p) = &self.progress {
            p.complete(epoch, seqs.iter().copied());
        }
    }
    fn handled_unreliable(&self, epoch: u32, cost: u64) {
        if let Some(p) = &self.progress {
            p.complete_unreliable(epoch, cost);
        }
    }
    fn idle(&self) {
        // Residual credit (below half a window) goes back with the IO thread's next tick,
        // ack or probe answer: waking the IO thread here would cost a syscall per burst
        // (per message in a ping-pong).
    }
}

impl std::fmt::Debug for PeerCreditSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerCreditSink")
            .field("peer", &self.peer)
            .finish()
    }
}

/// Everything the IO thread is started with.
pub(crate) struct IoParts {
    pub(crate) config: IoConfig,
    pub(crate) poll: mio::Poll,
    pub(crate) listener: mio::net::TcpListener,
    pub(crate) shared: Arc<IoShared>,
    pub(crate) peers: PeerMap,
    pub(crate) pool: Arc<Pool>,
    pub(crate) counters: Arc<NodeCounters>,
    pub(crate) undelivered: Option<UndeliveredHook>,
    pub(crate) stopped: Arc<AtomicBool>,
    /// The opened journal and what it recovered (journalling nodes only).
    pub(crate) journal: Option<(Journal, Recovered)>,
}
