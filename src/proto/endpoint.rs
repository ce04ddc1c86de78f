//! A member's whole protocol, sans-IO: its links (connections), its peers, and what routes
//! between them — admission of accepted links, the handshake's decisions (who a link speaks
//! for, the tie-break between two links for one peer, incarnations), reconnects with
//! backoff, acks and credit, liveness, the journal's group commit, shutdown. quinn-proto's
//! `Endpoint` and `Connection` are the model. It never touches a socket or reads a clock:
//! the IO thread (`net`) drives it with sockets and `Instant::now()`, the simulation with
//! pipes in memory and a simulated clock, both through the same boundary.
//!
//! ## The boundary
//!
//! - **In**: [`Endpoint::handle`]`(now, `[`Input`]`)` — what happened: a command or a
//!   hand-off from another thread, a connection opened, read, writable, written, failed,
//!   the journal writer's marks, the time passing ([`Input::Timeout`]).
//! - **Out**: [`Endpoint::poll`]`(now)` until it returns `None` — what to do, as
//!   [`Output`]s, in the order the endpoint decides (its rustdoc): pool tasks and events
//!   (dial, close, resume reading, report undelivered messages, tell a membership fact),
//!   journal batches and syncs, then one [`Output::Transmit`] per link with bytes to write.
//!   The driver does each as it comes (a transmit is reported back with
//!   [`Input::Wrote`]), which may feed more inputs in; it keeps polling until `None`.
//! - **Then** it sleeps until [`Endpoint::poll_timeout`], a socket, or another thread
//!   wakes it.
//!
//! Besides the boundary, the driver reads a link's buffers ([`Endpoint::link_mut`],
//! [`Endpoint::to_write`]) and asks a few questions: [`Endpoint::judge`] (whether to take an
//! accepted connection at all, before anything is spent on it), [`Endpoint::shutdown_done`],
//! [`Endpoint::journal_ok`].

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::admission::{self, Admission, Shedding, Verdict};
use super::link::{Link, LinkId};
use super::peer::{Inflow, Peer, Unestablished};
use super::timer::{Backoff, TimerKind, Timers};
use super::{
    resolve, Handshake, HsEvent, LocalIdentity, PeerIdentity, RecoveryError, Resolution, TieBreak,
};
use crate::deliver::Task;
use crate::events::{DisconnectReason as Why, RefuseReason};
use crate::journal::{FsyncPolicy, Journal, JournalError, Record, RecoveredPeer, WriterMarks};
use crate::peer::{Counters, OutboundFilter, PeerShared, PeerState};
use crate::proto::Unacked;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{Arc, SharedStr};
use crate::util::{IdHash, NameHash};
use crate::wire::{self, CloseCode, Frame, Nonce};

/// The protocol's settings.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) name: SharedStr,
    pub(crate) cluster: String,
    pub(crate) launch_id: u64,
    pub(crate) window: u64,
    /// The most window bytes of one peer's messages we hold (received, not yet handled); a
    /// peer's link is not read while it has more.
    pub(crate) recv_window: u64,
    pub(crate) max_message: usize,
    pub(crate) allow_unknown: bool,
    pub(crate) ack_threshold: u64,
    pub(crate) ack_delay: Duration,
    pub(crate) backoff_min: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) handshake_timeout: Duration,
    pub(crate) write_high_water: usize,
    pub(crate) outbound_filter: Option<Arc<OutboundFilter>>,
    /// A sender blocked this long on an empty window makes us send a probe.
    pub(crate) probe_interval: Duration,
    /// A sender blocked this long is logged (once per blocked episode).
    pub(crate) block_warning: Duration,
    /// Return residual credit (below half a window) once the sender's queue is idle.
    pub(crate) credit_on_idle: bool,
    /// Period of the housekeeping tick.
    pub(crate) tick: Duration,
    /// A heartbeat goes out on a link with nothing written for this long.
    pub(crate) heartbeat: Duration,
    /// A link with nothing read for this long is closed and its peer redialled.
    pub(crate) idle_timeout: Duration,
    /// Links open at most (accepted ones beyond displace a pending one, or are refused).
    pub(crate) max_connections: usize,
    /// Accepted links still in their handshake at most.
    pub(crate) max_pending: usize,
    /// ... of which from one source address.
    pub(crate) max_pending_per_source: usize,
    /// Shared secret: every handshake is authenticated with it.
    pub(crate) secret: Option<super::Secret>,
    /// The node journals (its reliable messages and delivery progress).
    pub(crate) journalled: bool,
    /// The application wants membership facts ([`Output::Fact`]); without it none is made.
    pub(crate) events: bool,
    /// A member admitted at run time (unknown, no address) that stays disconnected this
    /// long is removed ([`Output::Forget`]).
    pub(crate) forget_after: Duration,
}

/// Node-wide connection counters, shared with the node's stats.
#[derive(Debug, Default)]
pub(crate) struct NodeCounters {
    pub(crate) accepted: AtomicU64,
    pub(crate) dialled: AtomicU64,
    pub(crate) dial_failures: AtomicU64,
    pub(crate) handshakes: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) refused_cluster: AtomicU64,
    pub(crate) refused_unknown: AtomicU64,
    pub(crate) refused_version: AtomicU64,
    pub(crate) name_conflicts: AtomicU64,
    pub(crate) auth_failures: AtomicU64,
    pub(crate) handshake_timeouts: AtomicU64,
    pub(crate) tie_breaks: AtomicU64,
    pub(crate) protocol_errors: AtomicU64,
    /// Links closed because their peer sent past its window (also protocol errors).
    pub(crate) window_violations: AtomicU64,
    /// Times a link's reading was paused: its peer held more than its receive window.
    pub(crate) read_pauses: AtomicU64,
    pub(crate) idle_timeouts: AtomicU64,
    pub(crate) refused_limit: AtomicU64,
    /// Accepted links refused because their source held its share of pending ones, all
    /// accepted at the same instant (one burst).
    pub(crate) refused_per_source: AtomicU64,
    /// Pending accepted links closed to make room for a newer one.
    pub(crate) displaced: AtomicU64,
    /// ... of which for one from the same address, which held its share.
    pub(crate) displaced_per_source: AtomicU64,
    /// Handshake timeouts that came early because the pending table was over half full.
    pub(crate) pressure_timeouts: AtomicU64,
    pub(crate) journal_failures: AtomicU64,
    /// Links closed for a TLS failure (handshake, certificate, name).
    pub(crate) tls_failures: AtomicU64,
    /// Timers pending now.
    pub(crate) timers: AtomicU64,
    /// Links open now (any state).
    pub(crate) open: AtomicU64,
    /// Links established now.
    pub(crate) established: AtomicU64,
    /// Accepted links pending (not yet established) now.
    pub(crate) pending: AtomicU64,
}

/// What the endpoint asks of whoever drives it, taken from [`Endpoint::poll`] in the order
/// the endpoint decides (see the module doc: "The boundary").
#[derive(Debug)]
#[must_use = "the driver must do what the endpoint asks"]
pub(crate) enum Output {
    /// Submit a task to the delivery pool.
    Task(Task),
    /// Hand a numbered batch of journal records to the journal's writer (in order); the
    /// bytes that depend on it are not given to [`Output::Transmit`] until the writer's
    /// marks ([`Input::JournalMarks`]) say it is appended.
    Journal(Batch),
    /// The journal batch that a `sync_journal` ([`Input::SyncJournal`]) waits for, in the
    /// order the syncs came in: `None` after a journal failure (the caller is never told it
    /// succeeded).
    JournalSync(Option<u64>),
    /// Write what [`Endpoint::to_write`] gives for the link, then report it with
    /// [`Input::Wrote`] (or [`Input::Failed`]).
    Transmit(LinkId),
    /// Open a connection to `addr` for peer `peer`, then report [`Input::Dialled`] (or
    /// [`Input::DialFailed`]).
    Dial {
        peer: usize,
        name: SharedStr,
        addr: SocketAddr,
    },
    /// The link is gone from the endpoint: write `last` (best effort) and drop the
    /// connection.
    Close { link: LinkId, last: Vec<u8> },
    /// A paused link may be read again (its bytes already in the kernel raise no event).
    Resume(LinkId),
    /// Messages that will never be delivered to `peer`.
    Undelivered {
        peer: SharedStr,
        messages: Vec<Unacked>,
    },
    /// A member not configured here dialled in and was admitted
    /// (`Builder::allow_unknown_members`): the node must know it.
    Admitted(Arc<PeerShared>),
    /// A journal write or sync failed: the node stops.
    JournalFailed,
    /// A membership fact for the application (only when [`Config::events`] is set).
    Fact(Fact),
    /// A member admitted at run time stayed disconnected for `forget_after` and was
    /// retired, as `remove_peer` does: the node must forget it (if the shared state it
    /// holds under that name is still this one).
    Forget(Arc<PeerShared>),
}

/// A transition of a peer the application hears of (the driver turns it into a public
/// [`crate::Event`]). Per peer, `Connected` and `Disconnected` alternate, starting with
/// `Connected`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fact {
    /// A link to `peer` was established; `launch` is the peer's launch id.
    Connected { peer: SharedStr, launch: u64 },
    /// The established link to `peer` is gone.
    Disconnected { peer: SharedStr, why: Why },
    /// `peer` turned out to be a new incarnation; `undelivered` messages to the old one
    /// were reported undelivered.
    NewIncarnation {
        peer: SharedStr,
        launch: u64,
        undelivered: u64,
    },
    /// A handshake was refused (by us, or by the other side: `by_peer`).
    Refused {
        peer: Option<String>,
        addr: Option<SocketAddr>,
        reason: RefuseReason,
        by_peer: bool,
    },
    /// `peer` was removed (`remove_peer`).
    Removed { peer: SharedStr },
    /// `peer`, admitted at run time, was forgotten after staying disconnected.
    Forgotten { peer: SharedStr },
}

/// Records `fact` for the driver if the application wants facts (one branch otherwise).
pub(crate) fn note(cfg: &Config, out: &mut Out, fact: impl FnOnce() -> Fact) {
    if cfg.events {
        out.events.push_back(Output::Fact(fact()));
    }
}

/// What a close code sent in a refused handshake means to the application (`None`: not a
/// refusal of who the other side is).
fn refusal(code: CloseCode) -> Option<RefuseReason> {
    match code {
        CloseCode::Cluster => Some(RefuseReason::WrongCluster),
        CloseCode::UnknownMember => Some(RefuseReason::UnknownMember),
        CloseCode::Version => Some(RefuseReason::Version),
        CloseCode::Auth => Some(RefuseReason::Auth),
        CloseCode::NameMismatch => Some(RefuseReason::NameMismatch),
        CloseCode::NameInUse => Some(RefuseReason::NameInUse),
        _ => None,
    }
}

/// What happened, handed to [`Endpoint::handle`] with the time it was seen.
pub(crate) enum Input<'a> {
    // ---- from the application's threads (commands and hand-offs) ----
    /// A member to know (dialled at `addr` if given).
    AddPeer {
        peer: Arc<PeerShared>,
        addr: Option<SocketAddr>,
    },
    /// `remove_peer`: retire the member for good.
    RemovePeer(usize),
    /// `disconnect`: close the member's link; it is dialled again with backoff.
    Disconnect(usize),
    /// Shut down by `deadline` (flush, then stop).
    Shutdown { deadline: Instant },
    /// Publish everything queued and cut the journal: the sync to wait for comes out as
    /// [`Output::JournalSync`].
    SyncJournal,
    /// The member has new messages in its outbox.
    Publish(usize),
    /// The pool asks that credit consumed from the member's stream go back.
    FlushCredit(usize),
    // ---- from the connections ----
    /// The driver opened a connection for peer `peer` (after [`Output::Dial`]) as `link`.
    Dialled {
        peer: usize,
        link: LinkId,
        nonce: Nonce,
    },
    /// The driver could not open a connection for peer `peer`.
    DialFailed(usize),
    /// A dialled link's connection completed.
    Connected(LinkId),
    /// A connection accepted from `from`, judged by [`Endpoint::judge`] (not refused),
    /// became `link`.
    Accepted {
        link: LinkId,
        from: SocketAddr,
        verdict: Verdict,
        nonce: Nonce,
    },
    /// Bytes were appended to the link's read buffer; `cert` checks, with TLS, that the
    /// peer's certificate is valid for the member name a handshake claims.
    Read { link: LinkId, cert: CertCheck<'a> },
    /// The link's socket can take bytes again.
    Writable(LinkId),
    /// `n` bytes of the link's write buffer were written.
    Wrote { link: LinkId, n: usize },
    /// The link's connection failed or was closed by the peer.
    Failed { link: LinkId, why: Why },
    /// A TLS failure on the link (handshake, or a certificate not valid for the name).
    TlsFailed {
        link: LinkId,
        reason: &'a str,
        from: Option<SocketAddr>,
    },
    // ---- from the journal's writer and the clock ----
    /// The journal's writer moved its marks.
    JournalMarks(WriterMarks),
    /// Time passed: timers due at `now` run.
    Timeout,
}

/// The process that holds a member's name against a newcomer claiming it.
struct NameHolder {
    /// Its incarnation.
    launch: u64,
    /// Where it is connected from (or was, for one that replaced the newcomer).
    addr: Option<SocketAddr>,
    /// Its established link, if the name is held by a live connection.
    link: Option<LinkId>,
}

/// A numbered batch of journal records, for the journal's writer.
pub(crate) type Batch = (u64, Vec<Record>);

/// What one call produces besides the links' bytes: journal records, pool tasks, events.
pub(crate) struct Out {
    /// Journal records of this turn, handed to the journal together (one batch) before any
    /// byte leaves.
    pub(crate) records: Vec<Record>,
    /// Peers whose recorded progress (in this turn's records) waits for the disk before
    /// it is acknowledged.
    pub(crate) awaiting: Vec<usize>,
    /// Batches cut and not yet taken by the driver.
    batches: Vec<Batch>,
    /// Pool tasks to submit.
    pub(crate) tasks: VecDeque<Task>,
    pub(crate) events: VecDeque<Output>,
    /// Messages split from one read, for one push to their sender's queues.
    pub(crate) batch: Vec<crate::deliver::Delivery>,
    pub(crate) oob_batch: Vec<crate::deliver::Delivery>,
    /// The node journals, and no journal write has failed.
    journal_open: bool,
}

impl Out {
    /// Whether records may be journalled (a journalling node whose journal has not
    /// failed).
    pub(crate) fn journal_open(&self) -> bool {
        self.journal_open
    }
}

/// What the endpoint knows of the journal: it never touches it (a writer thread does, see
/// `journal::JournalWriter`); it cuts the turn's records into numbered batches, and lets
/// bytes leave and acks carry progress as the writer's marks say their batch is durable.
pub(crate) struct Durability {
    policy: FsyncPolicy,
    /// What recovery found for peers not added yet, by name.
    recovered: HashMap<String, RecoveredPeer>,
    /// The last batch cut.
    cut: u64,
    /// The writer's marks as last reported.
    marks: WriterMarks,
    /// Peers whose recorded progress is in batch `n`: acknowledged once `n` is durable.
    awaiting: VecDeque<(u64, usize)>,
}

impl Durability {
    /// The last batch whose delivery progress may be acknowledged: appended (the page
    /// cache survives a crash of the process) — or, with an interval policy, synced.
    fn ack_mark(&self) -> u64 {
        match self.policy {
            FsyncPolicy::Interval(_) => self.marks.synced,
            FsyncPolicy::EveryBatch | FsyncPolicy::Never => self.marks.appended,
        }
    }
}

/// The journal after the IO thread has stopped, with what is needed to record how far the
/// pool got: the node records it once the pool has drained, so a clean shutdown leaves
/// nothing to deliver again.
pub(crate) struct JournalLeft {
    journal: Journal,
    peers: Vec<LeftPeer>,
}

/// A peer's share of [`JournalLeft`].
pub(crate) struct LeftPeer {
    name: String,
    /// Its handled watermark and receive credit, still moving while the pool drains.
    progress: Arc<crate::deliver::Progress>,
    credit: Arc<crate::flow::RecvCredit>,
    /// What was recorded (delivered, credit, unreliable bytes), and how many of its
    /// messages were received.
    recorded: (u64, u64, u64),
    received: u64,
}

impl JournalLeft {
    /// The journal, back from its writer, and the peers' progress as the endpoint left it.
    pub(crate) fn new(journal: Journal, peers: Vec<LeftPeer>) -> JournalLeft {
        JournalLeft { journal, peers }
    }

    /// Records each peer's final delivery progress and syncs the journal.
    pub(crate) fn close(mut self) -> Result<(), JournalError> {
        let mut records = Vec::new();
        for p in self.peers {
            // The unreliable count before the credit (see `Peer::record_progress`).
            let unreliable = p.progress.unreliable();
            let done = p.progress.done().min(p.received);
            let credit = p.credit.take();
            if done > p.recorded.0 || credit > 0 || unreliable > p.recorded.2 {
                records.push(Record::Delivered {
                    peer: p.name.into(),
                    count: done.max(p.recorded.0),
                    credit: p.recorded.1 + credit,
                    unreliable: unreliable.max(p.recorded.2),
                });
            }
        }
        self.journal.append(&records)?;
        self.journal.sync()
    }
}

/// Makes the shared state of a member admitted while it dials in.
pub(crate) type NewPeer = Box<dyn Fn(SharedStr) -> Arc<PeerShared> + Send>;

/// Checks, on a TLS link, that the peer's certificate is valid for the member name its
/// handshake claims (always `Ok` on plain TCP).
pub(crate) type CertCheck<'a> = &'a dyn Fn(&str) -> Result<(), String>;

/// A member's protocol (see the module doc).
pub(crate) struct Endpoint {
    cfg: Config,
    local: LocalIdentity,
    /// The bound of a data frame's length.
    max_len: usize,
    counters: Arc<NodeCounters>,
    new_peer: NewPeer,
    links: HashMap<LinkId, Link, IdHash>,
    peers: HashMap<usize, Peer, IdHash>,
    by_name: HashMap<SharedStr, usize, NameHash>,
    timers: Timers,
    backoff: Backoff,
    admission: Admission,
    shedding: Shedding,
    /// Links with bytes appended to their write buffer since the last write pass.
    dirty: VecDeque<LinkId>,
    /// Links whose reading is paused.
    paused: Vec<LinkId>,
    /// Peers whose queued messages are published once the frames written so far have left
    /// (a handshake's last frame goes first: see [`poll`](Endpoint::poll), step 4).
    deferred: Vec<usize>,
    shutdown: Option<Instant>,
    journal: Option<Durability>,
    /// `sync_journal`s handled, each with the batch it waits for, not yet polled.
    syncs: VecDeque<Option<u64>>,
    out: Out,
}

impl Endpoint {
    /// A member with no peer yet; with `journal` (its fsync policy and what it recovered),
    /// one that journals. `new_peer` makes the shared state of a member admitted as it
    /// dials in.
    pub(crate) fn new(
        cfg: Config,
        counters: Arc<NodeCounters>,
        journal: Option<(FsyncPolicy, crate::journal::Recovered)>,
        new_peer: NewPeer,
        now: Instant,
    ) -> Endpoint {
        let local = LocalIdentity {
            launch_id: cfg.launch_id,
            window: cfg.window,
            max_message: cfg.max_message as u32,
            cluster: cfg.cluster.clone(),
            name: cfg.name.to_string(),
            secret: cfg.secret.clone(),
        };
        let journal = journal.map(|(policy, recovered)| Durability {
            policy,
            recovered: recovered.peers.into_iter().collect(),
            cut: 0,
            marks: WriterMarks::default(),
            awaiting: VecDeque::new(),
        });
        let mut timers = Timers::default();
        timers.add(now + cfg.tick, TimerKind::Tick);
        Endpoint {
            max_len: wire::max_frame_len(cfg.max_message),
            backoff: Backoff::new(cfg.launch_id),
            admission: Admission::new(cfg.max_pending, cfg.max_pending_per_source),
            shedding: Shedding::default(),
            local,
            counters,
            new_peer,
            links: HashMap::default(),
            peers: HashMap::default(),
            by_name: HashMap::default(),
            timers,
            dirty: VecDeque::new(),
            paused: Vec::new(),
            deferred: Vec::new(),
            shutdown: None,
            syncs: VecDeque::new(),
            out: Out {
                records: Vec::new(),
                awaiting: Vec::new(),
                tasks: VecDeque::new(),
                events: VecDeque::new(),
                batch: Vec::new(),
                oob_batch: Vec::new(),
                batches: Vec::new(),
                journal_open: journal.is_some(),
            },
            journal,
            cfg,
        }
    }

    // ---- the boundary ----------------------------------------------------------------

    /// Takes what happened at `now`. Whatever it makes the endpoint ask of the driver
    /// comes out of [`poll`](Endpoint::poll), which the driver drains next.
    pub(crate) fn handle(&mut self, now: Instant, input: Input<'_>) {
        match input {
            Input::AddPeer { peer, addr } => self.add_peer(now, peer, addr),
            Input::RemovePeer(id) => self.remove_peer(now, id),
            Input::Disconnect(id) => self.disconnect(now, id),
            Input::Shutdown { deadline } => self.begin_shutdown(now, deadline),
            Input::SyncJournal => {
                let n = self.sync_journal_now(now);
                self.syncs.push_back(n);
            }
            Input::Publish(id) => self.publish(now, id),
            Input::FlushCredit(id) => self.flush_credit(now, id),
            Input::Dialled { peer, link, nonce } => self.dialled(now, peer, link, nonce),
            Input::DialFailed(peer) => self.dial_failed(now, peer),
            Input::Connected(link) => self.connected(link),
            Input::Accepted {
                link,
                from,
                verdict,
                nonce,
            } => self.accepted(now, link, from, verdict, nonce),
            Input::Read { link, cert } => self.handle_input(now, link, cert),
            Input::Writable(link) => self.dirty.push_back(link),
            Input::Wrote { link, n } => self.wrote(now, link, n),
            Input::Failed { link, why } => self.link_failed(now, link, why),
            Input::TlsFailed { link, reason, from } => self.tls_failed(now, link, reason, from),
            Input::JournalMarks(marks) => self.journal_progress(now, marks),
            Input::Timeout => self.handle_timeout(now),
        }
    }

    /// The next thing the driver must do, or `None` when there is nothing more until the
    /// next input. The order is the endpoint's:
    ///
    /// 1. pool tasks, then the events (dials, closes, reports, facts) in the order they
    ///    happened — a task before any event that follows it;
    /// 2. the journal: the records gathered since the last cut go to the writer as one
    ///    batch, before any byte that depends on them may leave, then the syncs waiting for
    ///    it;
    /// 3. writes: each link with new bytes (one [`Output::Transmit`] per link, in the order
    ///    they got bytes); what a write makes happen comes out before the next;
    /// 4. once nothing above is left, what waited for the writes (publishing to peers whose
    ///    handshake just completed, so that the handshake's last frame leaves before
    ///    anything slow — the outbound filter, a journal batch — runs), and again from 1.
    ///
    /// After a journal failure no byte leaves: a link with bytes to write is closed
    /// instead (its buffer may hold messages the journal lacks).
    pub(crate) fn poll(&mut self, now: Instant) -> Option<Output> {
        loop {
            if let Some(t) = self.out.tasks.pop_front() {
                return Some(Output::Task(t));
            }
            if let Some(e) = self.out.events.pop_front() {
                return Some(e);
            }
            self.cut_journal();
            if !self.out.batches.is_empty() {
                return Some(Output::Journal(self.out.batches.remove(0)));
            }
            if let Some(n) = self.syncs.pop_front() {
                return Some(Output::JournalSync(n));
            }
            if let Some(id) = self.dirty.pop_front() {
                if self.links.get(&id).is_none_or(|l| l.connecting) {
                    continue; // closed since, or not connected yet
                }
                if !self.journal_ok() {
                    self.link_failed(now, id, Why::Shutdown);
                    continue;
                }
                return Some(Output::Transmit(id));
            }
            if self.deferred.is_empty() {
                return None;
            }
            for id in std::mem::take(&mut self.deferred) {
                self.publish(now, id);
            }
        }
    }

    /// When the endpoint next needs [`Input::Timeout`].
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next_at()
    }

    /// A link, to move bytes between its buffers and its connection.
    pub(crate) fn link_mut(&mut self, id: LinkId) -> Option<&mut Link> {
        self.links.get_mut(&id)
    }

    /// Whether the endpoint is shutting down and done: everything queued to connected
    /// peers written and acknowledged, or the deadline passed. A peer whose handshake is
    /// under way over an open transport counts as connected when it is owed something: the
    /// handshake ends soon (established, refused, or at its timeout), and a node stopping
    /// just as it reconnects still hands over what it holds. That includes a link it
    /// accepted and that has not said who it is yet, while a member owed messages has no
    /// link (it may be the one dialling).
    pub(crate) fn shutdown_done(&self, now: Instant) -> bool {
        let Some(deadline) = self.shutdown else {
            return false;
        };
        if now >= deadline {
            return true;
        }
        let mut owed_unlinked = false;
        let peers_done = self.peers.values().all(|p| {
            match p.link.and_then(|l| self.links.get(&l)) {
                Some(l) if l.established => p.flushed(l),
                Some(l) if !l.connecting => !p.owes_anything(),
                _ => {
                    // Not connected: nothing more can be flushed, unless it is the one
                    // dialling us on a link accepted and not identified yet.
                    owed_unlinked |= p.owes_anything();
                    true
                }
            }
        });
        // A member owed messages may be behind a handshake we accepted: it identifies
        // itself soon (or is refused, or times out). Without such a member, strangers'
        // handshakes hold nothing up.
        peers_done
            && !(owed_unlinked
                && self
                    .links
                    .values()
                    .any(|l| l.dialled.is_none() && l.peer.is_none() && !l.established))
    }

    /// Whether no journal write or sync has failed (always true without a journal): after
    /// a failure, bytes in write buffers may hold messages the journal lacks.
    pub(crate) fn journal_ok(&self) -> bool {
        self.journal.as_ref().is_none_or(|j| !j.marks.failed)
    }

    /// The bytes of link `id` that may be written now: all of them without a journal; with
    /// one, those whose journal records are durable (`appended`).
    pub(crate) fn to_write(&self, id: LinkId) -> Option<&[u8]> {
        let link = self.links.get(&id)?;
        Some(match &self.journal {
            None => link.to_write(),
            Some(j) => link.durable_part(j.marks.appended, j.cut),
        })
    }

    fn peer_name(&self, id: usize) -> SharedStr {
        self.peers
            .get(&id)
            .map(|p| p.name().clone())
            .unwrap_or_else(|| "?".into())
    }

    /// Publishes the link gauges after the link set changed.
    fn update_gauges(&self) {
        // Relaxed: gauges for stats only.
        self.counters
            .open
            .store(self.links.len() as u64, Ordering::Relaxed);
        let est = self.links.values().filter(|l| l.established).count() as u64;
        self.counters.established.store(est, Ordering::Relaxed);
        self.counters
            .pending
            .store(self.admission.len() as u64, Ordering::Relaxed);
    }

    // ---- commands ------------------------------------------------------------------

    /// Starts managing a peer (restoring its journalled stream, dialling it if it has an
    /// address).
    fn add_peer(&mut self, now: Instant, shared: Arc<PeerShared>, addr: Option<SocketAddr>) {
        let id = shared.id;
        self.by_name.insert(shared.name.clone(), id);
        let mut peer = Peer::new(shared, addr);
        if let Some(r) = self
            .journal
            .as_mut()
            .and_then(|j| j.recovered.remove(&**peer.name()))
        {
            peer.restore(&self.cfg, &mut self.out, r);
        }
        self.peers.insert(id, peer);
        if self.shutdown.is_none() {
            self.dial(now, id);
        }
    }

    /// Closes peer `id` for good: fails what is queued (giving back its permits), closes
    /// its window and link. A reconnect timer still pending finds no peer and does nothing;
    /// a link completing later finds no peer and is refused.
    fn remove_peer(&mut self, now: Instant, id: usize) {
        let Some(p) = self.peers.get(&id) else {
            return;
        };
        let (link, name, up) = (p.link, p.name().clone(), p.up);
        self.retire_peer(id, true);
        if let Some(link) = link {
            self.close_link(
                now,
                link,
                Some((CloseCode::Removed, "member removed")),
                Why::Removed,
            );
        }
        if up {
            let peer = name.clone();
            note(&self.cfg, &mut self.out, || Fact::Disconnected {
                peer,
                why: Why::Removed,
            });
        }
        note(&self.cfg, &mut self.out, || Fact::Removed { peer: name });
    }

    /// Drops the peer's link; recovery brings it back.
    fn disconnect(&mut self, now: Instant, id: usize) {
        if let Some(link) = self.peers.get(&id).and_then(|p| p.link) {
            log::info!(
                "{}: disconnecting '{}' on request",
                self.cfg.name,
                self.peer_name(id)
            );
            self.close_link(
                now,
                link,
                Some((CloseCode::Other, "disconnect requested")),
                Why::Requested,
            );
        }
    }

    /// Publishes what the application queued for peer `id`.
    fn publish(&mut self, now: Instant, id: usize) {
        self.publish_upto(now, id, self.cfg.write_high_water);
    }

    /// [`publish`](Endpoint::publish) with the high-water mark `high`.
    fn publish_upto(&mut self, now: Instant, id: usize, high: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let link = p
            .link
            .and_then(|l| self.links.get_mut(&l))
            .filter(|l| l.established);
        let link_id = link.as_ref().map(|l| l.id);
        if p.publish(&self.cfg, &mut self.out, link, high, now) {
            if let Some(l) = link_id {
                self.dirty.push_back(l);
            }
        }
    }

    /// Returns peer `id`'s receive credit now (the pool asked: half the window consumed,
    /// or a paused link back within its window).
    fn flush_credit(&mut self, now: Instant, id: usize) {
        self.ack(id);
        self.resume_peer(now, id);
    }

    /// Writes an ack to peer `id` if one is owed.
    fn ack(&mut self, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let link = p.link.and_then(|l| self.links.get_mut(&l));
        let link_id = link.as_ref().map(|l| l.id);
        if p.ack(&mut self.out, link, false) {
            if let Some(l) = link_id {
                self.dirty.push_back(l);
            }
        }
    }

    /// Begins shutting down: no new messages, no reconnects; what is queued is still
    /// flushed (or, with a journal, journalled) until `deadline`.
    fn begin_shutdown(&mut self, now: Instant, deadline: Instant) {
        if self.shutdown.is_some() {
            return;
        }
        self.shutdown = Some(deadline);
        self.timers.add(deadline, TimerKind::Deadline);
        let ids: Vec<usize> = self.peers.keys().copied().collect();
        for id in ids {
            let Some(p) = self.peers.get_mut(&id) else {
                continue;
            };
            p.gen += 1; // no more reconnects
                        // No new messages; what is queued is still flushed.
            p.shared.outbox.close_keep();
            p.shared.outbox.window().close();
            let connected = p
                .link
                .is_some_and(|l| self.links.get(&l).is_some_and(|l| l.established));
            // With a journal, what is queued for a disconnected peer is journalled now and
            // resent after the restart.
            if connected || self.journal.is_some() {
                self.publish(now, id);
            }
        }
    }

    /// Journals everything queued (to any peer, connected or not, past the write buffers'
    /// high-water marks) and cuts it into a batch. Returns the batch whose sync makes it all
    /// durable (the driver asks the writer for that sync), or `None` after a journal failure
    /// (nothing may be reported durable then).
    fn sync_journal_now(&mut self, now: Instant) -> Option<u64> {
        let ids: Vec<usize> = self.peers.keys().copied().collect();
        for id in ids {
            self.publish_upto(now, id, usize::MAX);
        }
        self.cut_journal();
        self.journal
            .as_ref()
            .filter(|j| !j.marks.failed)
            .map(|j| j.cut)
    }

    /// The final step of a shutdown: every peer retired, every link closed, the last records
    /// cut into a batch. Returns, with a journal, what the node needs to record the pool's
    /// last progress once the writer has given the journal back.
    pub(crate) fn finish(&mut self, now: Instant) -> Option<Vec<LeftPeer>> {
        let links: Vec<LinkId> = self.links.keys().copied().collect();
        let ids: Vec<usize> = self.peers.keys().copied().collect();
        for id in ids {
            self.retire_peer(id, false);
        }
        for l in links {
            self.close_link(
                now,
                l,
                Some((CloseCode::Shutdown, "node shutting down")),
                Why::Shutdown,
            );
        }
        self.cut_journal();
        let j = self.journal.as_ref()?;
        if j.marks.failed {
            return None;
        }
        Some(
            self.peers
                .values()
                .filter_map(|p| {
                    let progress = p.shared.progress.clone()?;
                    let (recorded, unreliable) = p.recorded();
                    Some(LeftPeer {
                        name: p.name().to_string(),
                        progress,
                        credit: p.shared.credit.clone(),
                        recorded: (recorded.0, recorded.1, unreliable),
                        received: p.desc.received(),
                    })
                })
                .collect(),
        )
    }

    /// Warns about journalled peers that are not configured (their messages stay in the
    /// journal until the member is added).
    pub(crate) fn warn_unclaimed(&self) {
        if let Some(j) = &self.journal {
            for (name, r) in &j.recovered {
                if !r.unacked.is_empty() {
                    log::warn!(
                        "{}: the journal holds {} unacknowledged messages to '{name}', which is not configured; they wait until it is added",
                        self.cfg.name,
                        r.unacked.len()
                    );
                }
            }
        }
    }

    // ---- links: opening and closing --------------------------------------------------

    /// Judges a connection just accepted from `from` at `now` (before anything is spent on
    /// it).
    pub(crate) fn judge(&mut self, now: Instant, from: SocketAddr) -> Verdict {
        let source = admission::source_of(from.ip());
        let node_full = self.links.len() >= self.cfg.max_connections;
        let v = self.admission.judge(source, now, node_full);
        if matches!(v, Verdict::SourceFull | Verdict::Full) {
            self.refuse_stranger(from, v);
        }
        v
    }

    /// A connection accepted from `from` (admitted by [`judge`](Endpoint::judge), which
    /// may have named a pending link to displace) becomes link `id`: the acceptor's
    /// handshake starts (its Hello is written), with the deadline of the pending table as it
    /// is now.
    fn accepted(
        &mut self,
        now: Instant,
        id: LinkId,
        from: SocketAddr,
        verdict: Verdict,
        nonce: Nonce,
    ) {
        match verdict {
            Verdict::Displace(victim) => self.displace(now, victim, from, false),
            Verdict::DisplaceOwn(victim) => self.displace(now, victim, from, true),
            Verdict::Admit | Verdict::Full | Verdict::SourceFull => {}
        }
        Counters::add(&self.counters.accepted, 1);
        log::debug!("{}: accepted connection from {from}", self.cfg.name);
        let mut first = Vec::new();
        let hs = Handshake::acceptor(self.local.clone(), nonce, &mut first);
        let mut link = Link::new(id, None, hs, first, now);
        link.remote = Some(from);
        self.links.insert(id, link);
        self.admission
            .insert(id, admission::source_of(from.ip()), now);
        self.update_gauges();
        self.dirty.push_back(id);
        let deadline = self.admission.deadline(self.cfg.handshake_timeout);
        self.timers
            .add(now + deadline, TimerKind::Handshake { link: id });
        // The table just grew: older links may be past the shorter deadline.
        self.shed_overdue(now);
    }

    /// Whether a handshake with `p` is refused: it is closed, or the node is shutting down
    /// and owes it nothing. A handshake already under way when a shutdown begins goes on
    /// while the peer is owed messages, so that they are handed over before the node stops.
    fn closed_to(&self, p: &Peer) -> bool {
        p.state == PeerState::Closed || (self.shutdown.is_some() && !p.owes_anything())
    }

    /// Whether connections accepted now are refused outright (shutting down).
    pub(crate) fn refuses_all(&self) -> bool {
        self.shutdown.is_some()
    }

    /// Logs what the admission rules shed, when a warning is due.
    pub(crate) fn warn_shedding(&mut self, now: Instant) {
        let Some(line) = self.shedding.warning(now) else {
            return;
        };
        let biggest = match self.admission.biggest() {
            Some((ip, n)) => format!(", most by {ip} ({n})"),
            None => String::new(),
        };
        log::warn!(
            "{}: {line}; {} of {} handshaking slots taken{biggest}, {} per address at most",
            self.cfg.name,
            self.admission.len(),
            self.admission.max_pending(),
            self.admission.per_source()
        );
    }

    fn refuse_stranger(&mut self, from: SocketAddr, why: Verdict) {
        Counters::add(&self.counters.refused_limit, 1);
        if why == Verdict::SourceFull {
            Counters::add(&self.counters.refused_per_source, 1);
            self.shedding.over_source += 1;
            log::debug!(
                "{}: refusing connection from {from}: its address holds its share of handshaking connections ({} of {} at most), all accepted in the same burst as it",
                self.cfg.name,
                self.admission.held_by(admission::source_of(from.ip())),
                self.admission.per_source()
            );
        } else {
            self.shedding.refused += 1;
            log::debug!(
                "{}: refusing connection from {from}: {} open (limit {}), none handshaking to make room",
                self.cfg.name,
                self.links.len(),
                self.cfg.max_connections
            );
        }
    }

    /// Closes pending link `victim` to make room for one from `from`: the oldest of the
    /// address holding the most, or (`own`) of `from`'s address, which holds its share.
    fn displace(&mut self, now: Instant, victim: LinkId, from: SocketAddr, own: bool) {
        Counters::add(&self.counters.displaced, 1);
        self.shedding.displaced += 1;
        if own {
            Counters::add(&self.counters.displaced_per_source, 1);
            self.shedding.displaced_own += 1;
        }
        if log::log_enabled!(log::Level::Debug) {
            let age = self
                .admission
                .since(victim)
                .map(|t| now.saturating_duration_since(t))
                .unwrap_or_default();
            if own {
                log::debug!(
                    "{}: the address of {from} holds its share of handshaking connections ({}); closing its oldest ({age:.1?} old) for the new one",
                    self.cfg.name,
                    self.admission.per_source()
                );
            } else {
                let held = self.admission.biggest().map_or(0, |(_, n)| n);
                log::debug!(
                    "{}: {} of {} handshaking slots taken; closing the oldest connection ({age:.1?} old) of the address holding the most ({held}) for one from {from}",
                    self.cfg.name,
                    self.admission.len(),
                    self.admission.max_pending()
                );
            }
        }
        self.close_link(now, victim, None, Why::Replaced);
    }

    /// Closes every pending accepted link past the deadline of the table as it is at
    /// `now`, oldest first (each one closed lengthens the deadline of the rest).
    fn shed_overdue(&mut self, now: Instant) {
        while let Some((id, limit)) = self.admission.overdue(now, self.cfg.handshake_timeout) {
            self.pending_timed_out(now, id, limit);
        }
    }

    /// Closes pending accepted link `id`, past its deadline `limit`.
    fn pending_timed_out(&mut self, now: Instant, id: LinkId, limit: Duration) {
        let early = limit < self.cfg.handshake_timeout;
        Counters::add(&self.counters.handshake_timeouts, 1);
        self.shedding.timed_out += 1;
        if early {
            Counters::add(&self.counters.pressure_timeouts, 1);
            self.shedding.early += 1;
        }
        log::debug!(
            "{}: handshake of an accepted connection timed out after {limit:.1?}{}; closing it",
            self.cfg.name,
            if early {
                format!(
                    " (shortened: {} of {} handshaking slots taken)",
                    self.admission.len(),
                    self.admission.max_pending()
                )
            } else {
                String::new()
            }
        );
        self.close_link(now, id, None, Why::IdleTimeout);
    }

    /// Dials peer `id` now if it has an address and no link: the driver opens the
    /// connection ([`Output::Dial`]).
    fn dial(&mut self, now: Instant, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if p.state == PeerState::Closed || p.link.is_some() || self.shutdown.is_some() {
            return;
        }
        let Some(addr) = p.addr else {
            p.set_state(PeerState::Backoff);
            return; // no address: it will dial us
        };
        let _ = now;
        let name = p.name().clone();
        self.out.events.push_back(Output::Dial {
            peer: id,
            name,
            addr,
        });
    }

    /// The driver opened a connection for peer `peer` (after [`Output::Dial`]): it becomes
    /// link `id`, connecting; the dialler's handshake waits for the acceptor's Hello.
    fn dialled(&mut self, now: Instant, peer: usize, id: LinkId, nonce: Nonce) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return self.out.events.push_back(Output::Close {
                link: id,
                last: Vec::new(),
            });
        };
        if p.state == PeerState::Closed || p.link.is_some() || self.shutdown.is_some() {
            return self.out.events.push_back(Output::Close {
                link: id,
                last: Vec::new(),
            });
        }
        let hs = Handshake::dialler(self.local.clone(), p.name().to_string(), nonce);
        p.link = Some(id);
        p.set_state(PeerState::Connecting);
        let mut link = Link::new(id, Some(peer), hs, Vec::new(), now);
        link.remote = p.addr;
        self.links.insert(id, link);
        self.update_gauges();
        Counters::add(&self.counters.dialled, 1);
        self.timers.add(
            now + self.cfg.handshake_timeout,
            TimerKind::Handshake { link: id },
        );
    }

    /// The driver could not open a connection for peer `peer` (or get what a dial needs):
    /// retry with backoff.
    fn dial_failed(&mut self, now: Instant, peer: usize) {
        Counters::add(&self.counters.dial_failures, 1);
        self.schedule_reconnect(now, peer);
    }

    /// A dialled link's connection completed.
    fn connected(&mut self, id: LinkId) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        link.connecting = false;
        if let Some(p) = link.dialled.and_then(|p| self.peers.get_mut(&p)) {
            p.set_state(PeerState::Handshaking);
        }
        self.dirty.push_back(id);
    }

    /// The link's connection failed or the peer closed it (EOF), `why`: it is closed
    /// without a Close frame.
    fn link_failed(&mut self, now: Instant, id: LinkId, why: Why) {
        if let Some(link) = self.links.get(&id) {
            if link.connecting {
                Counters::add(&self.counters.dial_failures, 1);
                if let Some(p) = link.dialled {
                    log::debug!(
                        "{}: connect to '{}' failed",
                        self.cfg.name,
                        self.peer_name(p)
                    );
                }
            }
        }
        self.close_link(now, id, None, why);
    }

    /// A TLS failure on link `id` (handshake, certificate, or a certificate not valid for
    /// the member name claimed): closed, counted.
    fn tls_failed(&mut self, now: Instant, id: LinkId, reason: &str, from: Option<SocketAddr>) {
        Counters::add(&self.counters.tls_failures, 1);
        let who = match (self.links.get(&id).and_then(|l| l.peer), from) {
            (Some(p), _) => format!("'{}'", self.peer_name(p)),
            (None, Some(a)) => a.to_string(),
            (None, None) => "an unidentified peer".to_owned(),
        };
        log::warn!(
            "{}: TLS failure with {who}, closing connection: {reason}",
            self.cfg.name
        );
        self.close_link(now, id, None, Why::Tls);
    }

    /// Closes a link (after writing `close`, best effort) and, if it spoke for a peer,
    /// moves the peer to `Backoff` and schedules a reconnect. `why`: what the application
    /// is told if the link was the peer's established one.
    fn close_link(&mut self, now: Instant, id: LinkId, close: Option<(CloseCode, &str)>, why: Why) {
        let journal_ok = self.journal_ok();
        self.admission.remove(id);
        let Some(link) = self.links.remove(&id) else {
            return;
        };
        self.paused.retain(|&l| l != id);
        let mut last = Vec::new();
        if let Some((code, reason)) = close {
            if journal_ok && !link.connecting {
                // What may leave of the buffer, then the Close. With a journal, bytes whose
                // records are not durable yet stay behind (nothing leaves before the journal
                // holds it): they are unacknowledged, resent after the next handshake.
                last = match &self.journal {
                    None => link.to_write().to_vec(),
                    Some(j) => link.durable_part(j.marks.appended, j.cut).to_vec(),
                };
                wire::encode_close(&mut last, code, reason);
            }
        }
        self.out.events.push_back(Output::Close { link: id, last });
        self.update_gauges();
        self.timers
            .cancel(|k| *k == TimerKind::Handshake { link: id });
        let Some(pid) = link.peer else { return };
        let Some(p) = self.peers.get_mut(&pid) else {
            return;
        };
        if p.link != Some(id) {
            return;
        }
        p.link_lost(&self.cfg, link.established);
        if std::mem::take(&mut p.up) {
            let peer = p.name().clone();
            note(&self.cfg, &mut self.out, || Fact::Disconnected {
                peer,
                why,
            });
        }
        if p.state != PeerState::Closed {
            self.schedule_reconnect(now, pid);
        }
    }

    fn schedule_reconnect(&mut self, now: Instant, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if p.state == PeerState::Closed || self.shutdown.is_some() {
            return;
        }
        p.set_state(PeerState::Backoff);
        if p.addr.is_none() {
            // Nothing to dial: it will dial us. A member admitted at run time is forgotten
            // if it does not within `forget_after` (a reconnect bumps `gen`, cancelling it).
            if p.dynamic {
                p.gen += 1;
                let gen = p.gen;
                if let Some(at) = now.checked_add(self.cfg.forget_after) {
                    self.timers.add(at, TimerKind::Forget { peer: id, gen });
                }
            }
            return;
        }
        p.gen += 1;
        let delay = self
            .backoff
            .delay(p.attempt, self.cfg.backoff_min, self.cfg.backoff_max);
        p.attempt = p.attempt.saturating_add(1);
        let gen = p.gen;
        self.timers
            .add(now + delay, TimerKind::Reconnect { peer: id, gen });
    }

    /// Terminal transition of a peer (removed for good, or the node shutting down).
    fn retire_peer(&mut self, id: usize, removed: bool) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        p.retire(&self.cfg, &mut self.out, removed);
        if removed {
            let name = p.name().clone();
            self.timers.cancel(|k| match k {
                TimerKind::Reconnect { peer, .. }
                | TimerKind::AckDelay { peer }
                | TimerKind::Forget { peer, .. } => *peer == id,
                _ => false,
            });
            self.peers.remove(&id);
            if self.by_name.get(&name) == Some(&id) {
                self.by_name.remove(&name);
            }
        }
    }

    fn add_unknown(&mut self, now: Instant, name: &str) -> usize {
        let shared = (self.new_peer)(name.into());
        let id = shared.id;
        log::info!("{}: admitting unknown member '{name}'", self.cfg.name);
        self.out.events.push_back(Output::Admitted(shared.clone()));
        self.add_peer(now, shared, None);
        if let Some(p) = self.peers.get_mut(&id) {
            p.dynamic = true;
        }
        id
    }

    /// The forget timer of peer `id` (generation `gen`) fired: if that member, admitted at
    /// run time, is still disconnected since, it is retired as `remove_peer` does (queued
    /// messages fail, unacknowledged ones are undelivered) and the node forgets it.
    fn forget_peer(&mut self, id: usize, gen: u64) {
        let Some(p) = self.peers.get(&id) else {
            return;
        };
        if !p.dynamic
            || p.gen != gen
            || p.link.is_some()
            || p.state == PeerState::Closed
            || self.shutdown.is_some()
        {
            return;
        }
        let (name, shared) = (p.name().clone(), p.shared.clone());
        log::info!(
            "{}: forgetting '{name}', admitted at run time and disconnected for {:?}",
            self.cfg.name,
            self.cfg.forget_after
        );
        self.retire_peer(id, true);
        self.out.events.push_back(Output::Forget(shared));
        note(&self.cfg, &mut self.out, || Fact::Forgotten { peer: name });
    }

    // ---- input -----------------------------------------------------------------------

    /// Bytes were read into link `id`'s read buffer at `now`: splits the frames it holds
    /// and handles each one before splitting the next, so that every frame is bounded by
    /// the state its link is in when it is reached (a read that brought the last handshake
    /// frame and data frames together frames the data by the data limit). The turn's
    /// messages go to their sender's queues in one push at the end.
    fn handle_input(&mut self, now: Instant, id: LinkId, cert: CertCheck<'_>) {
        if let Some(link) = self.links.get_mut(&id) {
            link.last_read = now;
            if let Some(p) = link.peer.filter(|_| link.established) {
                if let Some(p) = self.peers.get(&p) {
                    p.shared.counters.heard.note(now);
                }
            }
        }
        let mut peer_of_batch = None;
        // Until the link is closed by a frame, paused, or no complete frame is left.
        while let Some(link) = self.links.get_mut(&id) {
            if link.paused {
                break;
            }
            let (established, peer) = (link.established, link.peer);
            let max = link.frame_limit(self.max_len);
            match wire::split_frame(&mut link.rbuf, max) {
                Ok(None) => break,
                Ok(Some(wire::Split::Data {
                    flags,
                    seq,
                    payload,
                })) => {
                    let Some(pid) = peer.filter(|_| established) else {
                        self.protocol_error(now, id, "data before the handshake completed".into());
                        break;
                    };
                    peer_of_batch = Some(pid);
                    let Some(p) = self.peers.get_mut(&pid) else {
                        continue;
                    };
                    match p.on_data(&mut self.out, flags, seq, payload) {
                        Ok(Inflow::Go) => {}
                        Ok(Inflow::Pause) => {
                            if self.pause(id, pid) {
                                break;
                            }
                        }
                        Err(e) => {
                            if matches!(e, RecoveryError::WindowExceeded { .. }) {
                                Counters::add(&self.counters.window_violations, 1);
                            }
                            self.push_batch(pid);
                            self.protocol_error(now, id, e.to_string());
                            break;
                        }
                    }
                }
                Ok(Some(wire::Split::Control(bytes))) => self.on_frame(now, id, &bytes, cert),
                Err(e) => {
                    if let Some(pid) = peer_of_batch {
                        self.push_batch(pid);
                    }
                    self.protocol_error(now, id, e.to_string());
                    break;
                }
            }
        }
        if let Some(pid) = peer_of_batch {
            self.push_batch(pid);
            self.after_data(now, pid);
        }
    }

    fn push_batch(&mut self, pid: usize) {
        match self.peers.get(&pid) {
            Some(p) => p.push_batch(&mut self.out),
            None => {
                self.out.batch.clear();
                self.out.oob_batch.clear();
            }
        }
    }

    /// After data from peer `id`: an ack now if enough is owed, else a delayed ack armed.
    fn after_data(&mut self, now: Instant, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let Some(link) = p.link.and_then(|l| self.links.get_mut(&l)) else {
            return;
        };
        let (link_id, before) = (link.id, link.unwritten());
        let arm = p.after_data(&self.cfg, &mut self.out, link);
        if link.unwritten() > before {
            self.dirty.push_back(link_id);
        }
        if arm {
            p.ack_timer = true;
            self.timers
                .add(now + self.cfg.ack_delay, TimerKind::AckDelay { peer: id });
        }
    }

    /// Stops reading link `id` of peer `pid`, which holds more than its receive window:
    /// its bytes stay where they are (for a connection, in the kernel: TCP pushes back on
    /// the peer) until the handler brings it back within the window. Returns `false` if it
    /// is already back within.
    fn pause(&mut self, id: LinkId, pid: usize) -> bool {
        let Some(p) = self.peers.get(&pid) else {
            return false;
        };
        if !p.shared.credit.pause() {
            return false;
        }
        let (held, window) = (p.shared.credit.held(), p.shared.credit.window());
        let Some(link) = self.links.get_mut(&id) else {
            return false;
        };
        if !link.paused {
            link.paused = true;
            self.paused.push(id);
            Counters::add(&self.counters.read_pauses, 1);
            log::debug!(
                "{}: '{}' has {held} bytes waiting for delivery, more than its receive window of {window}; not reading it until the handler catches up",
                self.cfg.name,
                p.name()
            );
        }
        true
    }

    /// Resumes reading peer `id`'s link if it was paused and the peer is back within its
    /// receive window. Time spent paused is ours, not the peer's: the idle timeout counts
    /// from the resumption.
    fn resume_peer(&mut self, now: Instant, id: usize) {
        let Some(p) = self.peers.get(&id) else {
            return;
        };
        let Some(lid) = p.link else {
            return;
        };
        if !self.links.get(&lid).is_some_and(|l| l.paused) || !p.shared.credit.resume() {
            return;
        }
        self.paused.retain(|&l| l != lid);
        let Some(link) = self.links.get_mut(&lid) else {
            return;
        };
        link.paused = false;
        link.last_read = now;
        // What is in the buffer first, then what the connection holds: the driver reads
        // it (readiness is edge-triggered, so no event would come for bytes already there).
        self.handle_input(now, lid, &|_| Ok(()));
        self.out.events.push_back(Output::Resume(lid));
    }

    fn protocol_error(&mut self, now: Instant, id: LinkId, reason: String) {
        Counters::add(&self.counters.protocol_errors, 1);
        let who = self
            .links
            .get(&id)
            .and_then(|l| l.peer)
            .map(|p| self.peer_name(p))
            .unwrap_or_else(|| "an unidentified peer".into());
        log::warn!(
            "{}: protocol error from {who}, closing connection: {reason}",
            self.cfg.name
        );
        self.close_link(
            now,
            id,
            Some((CloseCode::Protocol, &reason)),
            Why::ProtocolError,
        );
    }

    fn count_refusal(&self, code: CloseCode) {
        Counters::add(&self.counters.refused, 1);
        match code {
            CloseCode::Cluster => Counters::add(&self.counters.refused_cluster, 1),
            CloseCode::UnknownMember => Counters::add(&self.counters.refused_unknown, 1),
            CloseCode::Version => Counters::add(&self.counters.refused_version, 1),
            CloseCode::NameInUse => Counters::add(&self.counters.name_conflicts, 1),
            CloseCode::Auth => Counters::add(&self.counters.auth_failures, 1),
            _ => {}
        }
    }

    /// Tells the application that the handshake on link `id` was refused with `code` (by
    /// the other side: `by_peer`), if that is a refusal of who the other side is.
    fn refused(&mut self, id: LinkId, code: CloseCode, by_peer: bool) {
        let Some(reason) = refusal(code) else {
            return;
        };
        let Some(link) = self.links.get(&id) else {
            return;
        };
        let addr = link.remote;
        let peer = match link.peer.or(link.dialled) {
            Some(p) => Some(self.peer_name(p).to_string()),
            None => link
                .hs
                .as_ref()
                .and_then(|h| h.peer())
                .map(|p| p.name.clone()),
        };
        note(&self.cfg, &mut self.out, || Fact::Refused {
            peer,
            addr,
            reason,
            by_peer,
        });
    }

    fn refuse(&mut self, now: Instant, id: LinkId, code: CloseCode, reason: &str) {
        log::warn!(
            "{}: refusing connection ({code:?}): {reason}",
            self.cfg.name
        );
        self.count_refusal(code);
        self.refused(id, code, false);
        self.close_link(now, id, Some((code, reason)), Why::ProtocolError);
    }

    /// A control frame (any frame but data) on link `id`.
    fn on_frame(&mut self, now: Instant, id: LinkId, bytes: &[u8], cert: CertCheck<'_>) {
        let frame = match wire::decode(bytes, self.max_len) {
            Ok(Some((f, _))) => f,
            Ok(None) => return self.protocol_error(now, id, "truncated frame".into()),
            Err(e) => return self.protocol_error(now, id, e.to_string()),
        };
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        if let Some(hs) = link.hs.as_mut() {
            match hs.on_frame(&frame) {
                Ok(HsEvent::Identified {
                    peer,
                    peer_received,
                    peer_connections,
                    peer_unreliable,
                }) => {
                    let resume = peer_received.map(|r| (r, peer_unreliable.unwrap_or(0)));
                    self.on_identified(now, id, peer, resume, peer_connections, cert)
                }
                Ok(HsEvent::Established {
                    peer_received,
                    peer_unreliable,
                }) => self.on_established(now, id, peer_received, peer_unreliable),
                Err(e) => {
                    if e.by_peer && e.code == CloseCode::Superseded {
                        // The peer kept the other of two simultaneous connections.
                        log::debug!("{}: {e}", self.cfg.name);
                        self.close_link(now, id, None, Why::Replaced);
                    } else if e.by_peer && e.code == CloseCode::NameInUse {
                        // A process of our name (another launch) is connected there, or
                        // replaced us: this one retries with backoff, and gets in once the
                        // other is gone.
                        let addr = link.remote;
                        let ours = self.cfg.launch_id;
                        // Once per episode at `error` (until the peer takes a connection).
                        let first = link
                            .dialled
                            .or(link.peer)
                            .and_then(|p| self.peers.get_mut(&p))
                            .is_none_or(|p| p.last_conflict.replace(ours) != Some(ours));
                        let line = format!(
                            "{}: {} refuses us: another process with our member name is connected there, or replaced us (launch id here {ours:016x}); check that only one process runs as '{}'. Retrying with backoff",
                            self.cfg.name,
                            addr.map_or_else(|| "the peer".to_string(), |a| a.to_string()),
                            self.cfg.name
                        );
                        if first {
                            log::error!("{line}");
                        } else {
                            log::debug!("{line}");
                        }
                        self.count_refusal(e.code);
                        self.refused(id, e.code, true);
                        self.close_link(now, id, None, Why::PeerClosed);
                    } else if e.by_peer {
                        log::warn!("{}: {e}", self.cfg.name);
                        self.count_refusal(e.code);
                        self.refused(id, e.code, true);
                        self.close_link(now, id, None, Why::PeerClosed);
                    } else if e.code == CloseCode::Protocol {
                        // A frame the handshake cannot take (malformed, or not the one its
                        // step expects): a protocol error, not a refusal of who the peer is.
                        self.protocol_error(now, id, e.reason);
                    } else {
                        self.refuse(now, id, e.code, &e.reason);
                    }
                }
            }
            return;
        }
        let Some(pid) = link.peer else { return };
        match frame {
            Frame::Ack { received, credit } => {
                let Some(p) = self.peers.get_mut(&pid) else {
                    return;
                };
                p.rtt_answer(id, now);
                if let Err(e) = p.on_ack(&self.cfg, &mut self.out, received, credit, now) {
                    self.protocol_error(now, id, e.to_string());
                }
            }
            Frame::Probe => {
                let Some(p) = self.peers.get_mut(&pid) else {
                    return;
                };
                let Some(link) = self.links.get_mut(&id) else {
                    return;
                };
                if p.on_probe(&mut self.out, link) {
                    self.dirty.push_back(id);
                }
            }
            Frame::Heartbeat => {}
            Frame::Close { code, reason } => {
                log::info!(
                    "{}: '{}' closed the connection ({code:?}): {reason}",
                    self.cfg.name,
                    self.peer_name(pid)
                );
                self.close_link(now, id, None, Why::PeerClosed);
            }
            Frame::Data { .. } => unreachable!("data frames are split off by split_frame"),
            Frame::Hello(_) | Frame::HelloReply(..) | Frame::Ready { .. } => {
                self.protocol_error(now, id, "handshake frame after the handshake".into())
            }
        }
    }

    /// A link said who it is. An accepted one (`resume`: the dialler's received counts,
    /// reliable messages and unreliable window bytes) is authenticated by now when a secret
    /// is configured: it is adopted and answered with Ready, and established. A dialled one
    /// has only read the acceptor's Hello, which proves nothing yet: it is answered, and
    /// adopted only once Ready authenticates the acceptor.
    fn on_identified(
        &mut self,
        now: Instant,
        id: LinkId,
        peer: PeerIdentity,
        resume: Option<(u64, u64)>,
        peer_connections: Option<u64>,
        cert: CertCheck<'_>,
    ) {
        let Some((peer_received, peer_unreliable)) = resume else {
            return self.answer_hello(now, id, &peer);
        };
        // TLS: the client certificate must name the member the handshake claims.
        if let Err(why) = cert(&peer.name) {
            Counters::add(&self.counters.tls_failures, 1);
            log::warn!(
                "{}: refusing a connection claiming to be '{}': {why}",
                self.cfg.name,
                peer.name
            );
            let addr = self.links.get(&id).and_then(|l| l.remote);
            note(&self.cfg, &mut self.out, || Fact::Refused {
                peer: Some(peer.name.clone()),
                addr,
                reason: RefuseReason::NameMismatch,
                by_peer: false,
            });
            return self.close_link(
                now,
                id,
                Some((
                    CloseCode::NameMismatch,
                    "TLS certificate not valid for the member name claimed",
                )),
                Why::Tls,
            );
        }
        let pid = match self.by_name.get(peer.name.as_str()) {
            Some(&pid) => pid,
            None if self.cfg.allow_unknown && self.shutdown.is_none() => {
                self.add_unknown(now, &peer.name)
            }
            None => {
                let reason = format!("member '{}' is not configured here", peer.name);
                return self.refuse(now, id, CloseCode::UnknownMember, &reason);
            }
        };
        let Some((received, connections, unreliable)) =
            self.adopt(now, id, pid, &peer, true, peer_connections)
        else {
            return;
        };
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        let Some(hs) = link.hs.as_mut() else { return };
        hs.accept(received, connections, unreliable, &mut link.wbuf);
        self.dirty.push_back(id);
        self.establish(now, id, peer_received, peer_unreliable);
    }

    /// Dialler: the acceptor's Hello arrived. With a secret it is not authenticated yet
    /// (anyone answering at the peer's address can send it), so nothing changes here: no
    /// tie-break, no new incarnation, the link does not yet speak for the peer. We answer
    /// with our counts for the incarnation it names and adopt the link on Ready.
    fn answer_hello(&mut self, now: Instant, id: LinkId, peer: &PeerIdentity) {
        let Some(pid) = self.links.get(&id).and_then(|l| l.dialled) else {
            return;
        };
        let Some(p) = self.peers.get(&pid) else {
            return self.refuse(now, id, CloseCode::Removed, "member removed");
        };
        if self.closed_to(p) {
            return self.refuse(now, id, CloseCode::Shutdown, "member closed");
        }
        // Another process holds the name: no counts for this one (zeros would tell it that
        // we lost our state for it).
        if let Some(holder) = self.name_holder(pid, id, peer.launch_id) {
            return self.refuse_name_in_use(now, id, pid, peer, holder);
        }
        let Some(p) = self.peers.get(&pid) else {
            return;
        };
        let (received, connections, unreliable) = p.counts_for(peer.launch_id);
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        let Some(hs) = link.hs.as_mut() else { return };
        hs.accept(received, connections, unreliable, &mut link.wbuf);
        link.asked_at = now;
        self.dirty.push_back(id);
    }

    /// Dialler: Ready arrived (and authenticated the acceptor, with a secret). Adopt the
    /// link for the peer, then establish it.
    fn on_established(
        &mut self,
        now: Instant,
        id: LinkId,
        peer_received: u64,
        peer_unreliable: u64,
    ) {
        let Some(link) = self.links.get(&id) else {
            return;
        };
        let (Some(pid), Some(peer)) = (
            link.dialled,
            link.hs.as_ref().and_then(|h| h.peer()).cloned(),
        ) else {
            return;
        };
        if self.adopt(now, id, pid, &peer, false, None).is_some() {
            self.establish(now, id, peer_received, peer_unreliable);
        }
    }

    /// Whether another process holds peer `pid`'s name against link `id`, whose handshake
    /// claims incarnation `launch`: an established link of another incarnation speaks for
    /// the peer (that process is alive as far as we can tell), or `launch` was replaced here
    /// by a newer incarnation (whatever process has it is not the one the name belongs to).
    fn name_holder(&self, pid: usize, id: LinkId, launch: u64) -> Option<NameHolder> {
        let p = self.peers.get(&pid)?;
        let live = p
            .link
            .filter(|&o| o != id)
            .and_then(|o| self.links.get(&o))
            .filter(|l| l.established && l.launch.is_some_and(|l| l != launch));
        if let Some(l) = live {
            return Some(NameHolder {
                launch: l.launch.unwrap_or_default(),
                addr: l.remote,
                link: Some(l.id),
            });
        }
        if p.was_replaced(launch) {
            let current = p.link.and_then(|o| self.links.get(&o));
            return Some(NameHolder {
                launch: p.desc.remote_launch().unwrap_or_default(),
                addr: current.and_then(|l| l.remote),
                link: None,
            });
        }
        None
    }

    /// Refuses link `id`, whose handshake claims peer `pid`'s name as incarnation `peer`,
    /// because `holder` has the name: `Close{NameInUse}`, a `Refused` fact, the counter,
    /// and an error naming both processes (once per claimant; repeats at `debug`). The
    /// holder's link is sent a heartbeat at once: if its process is in fact gone (a
    /// half-open connection), the write brings the reset that closes it, and the
    /// claimant's next attempt gets in.
    fn refuse_name_in_use(
        &mut self,
        now: Instant,
        id: LinkId,
        pid: usize,
        peer: &PeerIdentity,
        holder: NameHolder,
    ) {
        let addr = self.links.get(&id).and_then(|l| l.remote);
        let show = |a: Option<SocketAddr>| a.map_or_else(|| "?".to_string(), |a| a.to_string());
        let first = match self.peers.get_mut(&pid) {
            Some(p) => p.last_conflict.replace(peer.launch_id) != Some(peer.launch_id),
            None => true,
        };
        let (why, then) = if holder.link.is_some() {
            (
                "it is connected from there",
                "and gets in once the other is gone",
            )
        } else {
            (
                "it replaced that process here",
                "and is refused for good: restart or stop it",
            )
        };
        let line = format!(
            "{}: refusing '{}' from {} (launch id {:016x}): another process holds the name at {} (launch id {:016x}; {why}). Two processes run with one member name, or an old one is still running; the refused one retries ({})",
            self.cfg.name,
            peer.name,
            show(addr),
            peer.launch_id,
            show(holder.addr),
            holder.launch,
            then,
        );
        if first {
            log::error!("{line}");
        } else {
            log::debug!("{line}");
        }
        if let Some(link) = holder.link.and_then(|o| self.links.get_mut(&o)) {
            wire::encode_heartbeat(&mut link.wbuf);
            self.dirty.push_back(link.id);
        }
        self.count_refusal(CloseCode::NameInUse);
        self.refused(id, CloseCode::NameInUse, false);
        self.close_link(
            now,
            id,
            Some((
                CloseCode::NameInUse,
                "another process holds this member name",
            )),
            Why::ProtocolError,
        );
    }

    /// Makes link `id` the one that speaks for peer `pid`, identified (and, with a secret,
    /// authenticated) as `peer`: refuses it if the peer is gone or closing, applies the
    /// tie-break against another link for the peer, binds the incarnation. Returns our
    /// counts for the handshake (received, connections, unreliable bytes), or `None` if the
    /// link was refused or closed.
    fn adopt(
        &mut self,
        now: Instant,
        id: LinkId,
        pid: usize,
        peer: &PeerIdentity,
        accepting: bool,
        peer_connections: Option<u64>,
    ) -> Option<(u64, u64, u64)> {
        let Some(p) = self.peers.get(&pid) else {
            self.refuse(now, id, CloseCode::Removed, "member removed");
            return None;
        };
        if self.closed_to(p) {
            self.refuse(now, id, CloseCode::Shutdown, "member closed");
            return None;
        }
        if let Some(holder) = self.name_holder(pid, id, peer.launch_id) {
            self.refuse_name_in_use(now, id, pid, peer, holder);
            return None;
        }
        let p = self.peers.get(&pid)?;
        // Tie-break against the link that speaks for this peer now, if another.
        if let Some(other) = p.link.filter(|&o| o != id) {
            if let Some(ol) = self.links.get(&other) {
                let stale = matches!(ol.launch, Some(l) if l != peer.launch_id);
                let resolution = resolve(TieBreak {
                    stale,
                    new_by_us: !accepting,
                    old_by_us: ol.dialled.is_some(),
                    old_established: ol.established,
                    we_are_smaller: *self.cfg.name < *peer.name,
                    our_connections: p.desc.connections_with(peer.launch_id),
                    peer_connections,
                });
                Counters::add(&self.counters.tie_breaks, 1);
                if resolution == Resolution::NameInUse {
                    // (`name_holder` finds such a link first.)
                    let holder = NameHolder {
                        launch: ol.launch.unwrap_or_default(),
                        addr: ol.remote,
                        link: Some(other),
                    };
                    self.refuse_name_in_use(now, id, pid, peer, holder);
                    return None;
                }
                if resolution == Resolution::ReplaceOld {
                    log::debug!(
                        "{}: '{}' connected again; replacing the older connection",
                        self.cfg.name,
                        peer.name
                    );
                    self.close_link(
                        now,
                        other,
                        Some((CloseCode::Superseded, "replaced by a newer connection")),
                        Why::Replaced,
                    );
                } else {
                    log::debug!(
                        "{}: simultaneous connect with '{}'; keeping ours",
                        self.cfg.name,
                        peer.name
                    );
                    self.close_link(
                        now,
                        id,
                        Some((
                            CloseCode::Superseded,
                            "simultaneous connect lost the tie-break",
                        )),
                        Why::Replaced,
                    );
                    return None;
                }
            }
        }
        let p = self.peers.get_mut(&pid)?;
        p.bind(&self.cfg, &mut self.out, peer);
        let counts = p.handshake_counts();
        p.link = Some(id);
        if p.state != PeerState::Handshaking {
            p.set_state(PeerState::Handshaking);
        }
        let link = self.links.get_mut(&id)?;
        link.peer = Some(pid);
        link.launch = Some(peer.launch_id);
        Some(counts)
    }

    /// The handshake completed on link `id`: resend what the peer lacks, then new messages.
    fn establish(&mut self, now: Instant, id: LinkId, peer_received: u64, peer_unreliable: u64) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        let Some(pid) = link.peer else { return };
        let Some(p) = self.peers.get_mut(&pid) else {
            return;
        };
        self.admission.remove(id);
        match p.establish(
            &self.cfg,
            &mut self.out,
            link,
            peer_received,
            peer_unreliable,
            now,
        ) {
            Ok(()) => {
                let launch = link.launch.unwrap_or_default();
                if p.up {
                    // Never two `Connected` in a row: a link established while another was
                    // announced replaced it (the old one is closed by now).
                    let peer = p.name().clone();
                    note(&self.cfg, &mut self.out, || Fact::Disconnected {
                        peer,
                        why: Why::Replaced,
                    });
                }
                p.up = true;
                let peer = p.name().clone();
                note(&self.cfg, &mut self.out, || Fact::Connected {
                    peer,
                    launch,
                });
                Counters::add(&self.counters.handshakes, 1);
                self.update_gauges();
                self.dirty.push_back(id);
                self.deferred.push(pid);
            }
            Err(Unestablished::Superseded) => {
                self.close_link(
                    now,
                    id,
                    Some((CloseCode::Superseded, "superseded")),
                    Why::Replaced,
                );
            }
            Err(Unestablished::Outdated(why)) => {
                log::info!("{}: {why}", self.cfg.name);
                self.close_link(
                    now,
                    id,
                    Some((CloseCode::Superseded, "superseded")),
                    Why::Replaced,
                );
            }
            Err(Unestablished::Forgotten(why)) => {
                log::warn!("{}: {why}", self.cfg.name);
                self.close_link(
                    now,
                    id,
                    Some((CloseCode::Other, "state reset")),
                    Why::ProtocolError,
                );
            }
            Err(Unestablished::Violation(e)) => self.protocol_error(now, id, e),
        }
    }

    // ---- output ----------------------------------------------------------------------

    /// `n` bytes of link `id`'s write buffer were written at `now`; `drained`: the buffer
    /// is empty. A drained established link's acks count as sent, and a link below its
    /// low-water mark gets more of its peer's queue.
    fn wrote(&mut self, now: Instant, id: LinkId, n: usize) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        let drained = link.wrote(n, now);
        if !link.established {
            return;
        }
        let Some(pid) = link.peer else { return };
        let low = link.unwritten() < self.cfg.write_high_water / 2;
        let Some(p) = self.peers.get_mut(&pid) else {
            return;
        };
        if p.link != Some(id) {
            return;
        }
        if drained {
            // Every ack in the buffer has been written: now it counts as sent.
            p.drained();
        }
        if low && p.has_queued() {
            self.publish(now, pid);
        }
    }

    // ---- time --------------------------------------------------------------------------

    /// Runs every timer due at `now`. A driver passes the time its view of the links was
    /// last refreshed (the IO thread: when its last `poll` returned), not the present:
    /// timeouts that blame a peer (idle, handshake) must never count time it did not look
    /// at its links — bytes that arrived since are read before they are judged.
    fn handle_timeout(&mut self, now: Instant) {
        while let Some((_, t)) = self.timers.pop_due(now) {
            match t {
                TimerKind::Reconnect { peer, gen } => {
                    if self
                        .peers
                        .get(&peer)
                        .is_some_and(|p| p.gen == gen && p.link.is_none())
                    {
                        self.dial(now, peer);
                    }
                }
                TimerKind::Handshake { link } => self.handshake_due(now, link),
                TimerKind::Forget { peer, gen } => self.forget_peer(peer, gen),
                TimerKind::AckDelay { peer } => self.ack_due(now, peer),
                TimerKind::Tick => self.tick(now),
                TimerKind::Deadline => {}
            }
        }
        // Relaxed: a gauge for stats.
        self.counters
            .timers
            .store(self.timers.len() as u64, Ordering::Relaxed);
    }

    /// The ack timer of peer `id` fired.
    fn ack_due(&mut self, now: Instant, id: usize) {
        if let Some(p) = self.peers.get_mut(&id) {
            p.ack_timer = false;
        }
        self.ack(id);
        if self.journal.is_none() {
            return;
        }
        // The handler may not have reached what arrived: ask again later while an ack is
        // owed.
        if let Some(p) = self.peers.get_mut(&id) {
            if p.ack_behind() && !p.ack_timer && p.link.is_some() {
                p.ack_timer = true;
                self.timers
                    .add(now + self.cfg.ack_delay, TimerKind::AckDelay { peer: id });
            }
        }
    }

    /// The handshake timer of link `id` fired. An accepted link is held to the deadline of
    /// the table as it is now (shorter under pressure; re-armed if the table emptied
    /// since); our own dial always has the whole `handshake_timeout`.
    fn handshake_due(&mut self, now: Instant, id: LinkId) {
        let Some(link) = self.links.get(&id).filter(|l| !l.established) else {
            return;
        };
        let dialled = link.dialled;
        if let Some(since) = self.admission.since(id) {
            let limit = self.admission.deadline(self.cfg.handshake_timeout);
            if now < since + limit {
                self.timers
                    .add(since + limit, TimerKind::Handshake { link: id });
            } else {
                self.pending_timed_out(now, id, limit);
            }
            return;
        }
        Counters::add(&self.counters.handshake_timeouts, 1);
        match dialled {
            Some(p) => log::warn!(
                "{}: handshake with '{}' timed out; closing the connection",
                self.cfg.name,
                self.peer_name(p)
            ),
            None => log::warn!("{}: handshake timed out; closing connection", self.cfg.name),
        }
        self.close_link(now, id, None, Why::IdleTimeout);
    }

    /// Periodic work: pending links past their deadline closed (and the shedding warning,
    /// when due), each peer's tick (probes, block warnings, residual credit, expiry),
    /// paused links back within their windows resumed, heartbeats and the idle timeout.
    fn tick(&mut self, now: Instant) {
        self.shed_overdue(now);
        self.warn_shedding(now);
        let ids: Vec<usize> = self.peers.keys().copied().collect();
        for id in ids {
            let Some(p) = self.peers.get_mut(&id) else {
                continue;
            };
            let link = p.link.and_then(|l| self.links.get_mut(&l));
            let link_id = link.as_ref().map(|l| l.id);
            if p.tick(&self.cfg, &mut self.out, link, now) {
                if let Some(l) = link_id {
                    self.dirty.push_back(l);
                }
            }
        }
        if !self.paused.is_empty() {
            let ids: Vec<usize> = self
                .paused
                .iter()
                .filter_map(|l| self.links.get(l).and_then(|l| l.peer))
                .collect();
            for id in ids {
                self.resume_peer(now, id);
            }
        }
        self.check_liveness(now);
        self.timers.add(now + self.cfg.tick, TimerKind::Tick);
    }

    /// Heartbeats on quiet established links (any traffic suppresses them), and failure
    /// detection: a link silent for `idle_timeout` is closed, and its peer redialled with
    /// backoff. A link we are not reading (paused) is never silent: time we did not read is
    /// ours, not the peer's.
    fn check_liveness(&mut self, now: Instant) {
        let mut silent = Vec::new();
        for link in self.links.values_mut() {
            if !link.established {
                continue;
            }
            let unread = now.saturating_duration_since(link.last_read);
            if !link.paused && unread >= self.cfg.idle_timeout {
                silent.push(link.id);
            } else if now.saturating_duration_since(link.last_write) >= self.cfg.heartbeat {
                wire::encode_heartbeat(&mut link.wbuf);
                self.dirty.push_back(link.id);
            }
        }
        for id in silent {
            Counters::add(&self.counters.idle_timeouts, 1);
            let who = self
                .links
                .get(&id)
                .and_then(|l| l.peer)
                .map(|p| self.peer_name(p));
            log::warn!(
                "{}: connection to '{}' silent for {:?}; closing it",
                self.cfg.name,
                who.as_deref().unwrap_or("?"),
                self.cfg.idle_timeout
            );
            self.close_link(
                now,
                id,
                Some((CloseCode::Other, "idle timeout")),
                Why::IdleTimeout,
            );
        }
    }

    // ---- the journal -------------------------------------------------------------------

    /// Cuts this turn's records into the next batch for the journal's writer, and gates
    /// every link's unwritten bytes behind it: nothing leaves before the journal holds it.
    /// [`poll`](Endpoint::poll) cuts before it gives out any write, and hands the batches to
    /// the driver for the writer ([`Output::Journal`]). Returns whether a batch was cut.
    fn cut_journal(&mut self) -> bool {
        let Some(j) = self.journal.as_mut() else {
            return false;
        };
        if self.out.records.is_empty() || j.marks.failed {
            return false;
        }
        j.cut += 1;
        let n = j.cut;
        for id in self.out.awaiting.drain(..) {
            j.awaiting.push_back((n, id));
        }
        self.out
            .batches
            .push((n, std::mem::take(&mut self.out.records)));
        for link in self.links.values_mut() {
            link.gate(n);
        }
        true
    }

    /// The journal's writer moved its marks: bytes whose records are now appended may
    /// leave (their links are marked to write), progress whose records are now durable is
    /// acknowledged; a failure stops the node.
    fn journal_progress(&mut self, now: Instant, marks: WriterMarks) {
        let Some(j) = self.journal.as_mut() else {
            return;
        };
        if j.marks == marks || j.marks.failed {
            return;
        }
        let released = marks.appended > j.marks.appended;
        j.marks = marks;
        if marks.failed {
            return self.journal_failed(now);
        }
        let durable = j.ack_mark();
        while let Some(&(n, id)) = j.awaiting.front() {
            if n > durable {
                break;
            }
            j.awaiting.pop_front();
            let Some(p) = self.peers.get_mut(&id) else {
                continue;
            };
            p.progress_durable();
            let link = p.link.and_then(|l| self.links.get_mut(&l));
            let link_id = link.as_ref().map(|l| l.id);
            if p.write_ack(link, false) {
                if let Some(l) = link_id {
                    self.dirty.push_back(l);
                }
            }
        }
        if released {
            for link in self.links.values().filter(|l| l.wants_write()) {
                self.dirty.push_back(link.id);
            }
        }
    }

    /// A journal write or sync failed: durability can no longer be promised, so the node
    /// stops (fail-stop). Nothing more is journalled or acknowledged, and nothing not yet
    /// durable leaves; peers resend after our restart what we had not acknowledged.
    fn journal_failed(&mut self, now: Instant) {
        log::error!("{}: journal write failed, stopping the node", self.cfg.name);
        Counters::add(&self.counters.journal_failures, 1);
        if let Some(j) = self.journal.as_mut() {
            j.marks.failed = true;
            j.awaiting.clear();
        }
        self.out.journal_open = false;
        self.out.records.clear();
        self.out.awaiting.clear();
        self.out.batches.clear();
        self.out.events.push_back(Output::JournalFailed);
        self.begin_shutdown(now, now);
    }

    /// Peer `id`, for the simulation's checks.
    #[cfg(test)]
    pub(crate) fn peer(&self, id: usize) -> Option<&Peer> {
        self.peers.get(&id)
    }

    /// Every link, for the simulation's checks.
    #[cfg(test)]
    pub(crate) fn links(&self) -> impl Iterator<Item = &Link> {
        self.links.values()
    }
}
