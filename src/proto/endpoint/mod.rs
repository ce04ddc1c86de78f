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
//! - **Produced**: [`Endpoint::poll`]`(now)` until it returns `None` — what to do, as
//!   [`Output`]s, in the order the endpoint decides (its rustdoc): pool tasks and events
//!   (dial, close, resume reading, report undelivered messages, tell a membership fact),
//!   journal batches and syncs, then one [`Output::Transmit`] per link with bytes to write.
//!   The driver does each as it comes (a transmit is reported back with
//!   [`Input::Wrote`]), which may feed more inputs in; it keeps polling until `None`.
//! - **Then** it sleeps until [`Endpoint::poll_timeout`], a socket, or another thread
//!   wakes it.
//!
//! Besides the boundary, the driver reads a link's buffers ([`Endpoint::link_mut`],
//! [`Endpoint::to_write`]) and asks a few questions: [`Endpoint::verdict_on_accept`] (whether to take an
//! accepted connection at all, before anything is spent on it) and
//! [`Endpoint::shutdown_done`].

use std::net::SocketAddr;

use crate::addr::Addr;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::admission::{self, Admission, Shedding, Verdict};
use super::link::{Link, LinkId};
use super::remote::{Inflow, Remote, Unestablished};
use super::timer::{Backoff, TimerKind, Timers};
use super::write_queue::Unwritten;
use super::{
    resolve, Handshake, HsEvent, LocalIdentity, PeerIdentity, RecoveryError, Resolution, TieBreak,
};
use crate::deliver::{ReadBuffers, Task};
use crate::events::{DisconnectReason as Why, Event, RefuseReason};
use crate::journal::{FsyncPolicy, Journal, JournalError, Record, RecoveredPeer, WriterMarks};
use crate::peer::{Counters, OutboundFilter, PeerShared, PeerState};
use crate::proto::Unacked;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{Arc, SharedStr};
use crate::util::{IdHash, NameHash};
use crate::wire::{self, CloseCode, Frame, Nonce};

mod commands;
mod identify;
mod input;
mod journal;
mod links;
mod members;
mod roster;
mod seeds;
mod table;
mod time;

use identify::Handshakes;
pub(crate) use journal::{JournalGate, StoppedJournal, StoppedPeer};
use links::{Gate, SeedsOwed};
use members::Members;
pub(crate) use members::{MembersView, MembershipSetup};
use roster::Roster;
use seeds::Seeds;
pub(crate) use seeds::Target;
use table::Links;

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
    /// Period of the housekeeping tick while anything is in flight (a quiet endpoint puts
    /// it off until a link's next heartbeat or idle deadline: `time::Housekeeping`).
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
    /// The application wants events ([`Output::Event`]); without it none is made.
    pub(crate) events: bool,
    /// A member admitted at run time (unknown, no address) that stays disconnected this
    /// long is removed ([`Output::Forget`]).
    pub(crate) forget_after: Duration,
    /// Addresses dialled without a member name: whoever answers there becomes a peer
    /// (`Builder::seeds`).
    pub(crate) seeds: Vec<SocketAddr>,
    /// Seeds given by name (`host:port`), with the addresses they resolved to at start:
    /// resolved again while the node reaches nobody ([`Output::Resolve`]).
    pub(crate) seed_names: Vec<(String, Vec<SocketAddr>)>,
    /// Membership (SWIM) is on: the view's members are the node's peers.
    pub(crate) membership: Option<MembershipSetup>,
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

impl NodeCounters {
    /// Counts a handshake refused with `code` (by either side).
    fn refusal(&self, code: CloseCode) {
        Counters::add(&self.refused, 1);
        match code {
            CloseCode::Cluster => Counters::add(&self.refused_cluster, 1),
            CloseCode::UnknownMember => Counters::add(&self.refused_unknown, 1),
            CloseCode::Version => Counters::add(&self.refused_version, 1),
            CloseCode::NameInUse => Counters::add(&self.name_conflicts, 1),
            CloseCode::Auth => Counters::add(&self.auth_failures, 1),
            _ => {}
        }
    }
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
    /// Open a connection to `addr` for `target` (a peer, named `name`, or a seed), then
    /// report [`Input::Dialled`] (or [`Input::DialFailed`]).
    Dial {
        target: Target,
        name: Option<SharedStr>,
        addr: Addr,
    },
    /// The link is gone from the endpoint: write `last` (best effort) and drop the
    /// connection. `last` is empty after a journal failure: nothing more leaves then.
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
    /// An event for the application's `on_event` (only when [`Config::events`] is set).
    /// Per peer, `Connected` and `Disconnected` alternate, starting with `Connected`.
    Event(Event),
    /// A member admitted at run time stayed disconnected for `forget_after` and was
    /// retired, as `remove_peer` does: the node must forget it (if the shared state it
    /// holds under that name is still this one). Also a member the membership declared
    /// failed or that left.
    Forget(Arc<PeerShared>),
    /// Send a membership packet to `to` (a datagram: best effort, dropped when it cannot
    /// be sent at once).
    Datagram { to: SocketAddr, packet: Vec<u8> },
    /// Resolve seed name `name` (its `host:port` is `host`) away from the IO thread's loop,
    /// then report [`Input::Resolved`].
    Resolve { name: usize, host: String },
}

/// Queues `event` for the application if it listens (one branch otherwise: the event,
/// and the names it copies, are made only for a listener).
pub(crate) fn emit(cfg: &Config, out: &mut Produced, event: impl FnOnce() -> Event) {
    if cfg.events {
        out.events.push_back(Output::Event(event()));
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
        addr: Option<Addr>,
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
    /// The driver opened a connection for `target` (after [`Output::Dial`]) as `link`.
    Dialled {
        target: Target,
        link: LinkId,
        nonce: Nonce,
    },
    /// The driver could not open a connection for `target`.
    DialFailed(Target),
    /// A dialled link's connection completed.
    Connected(LinkId),
    /// A connection accepted from `from`, judged by [`Endpoint::verdict_on_accept`] (not refused),
    /// became `link`.
    Accepted {
        link: LinkId,
        from: Addr,
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
        from: Option<Addr>,
    },
    /// A membership packet arrived from `from` (on the driver's UDP socket).
    Datagram { from: SocketAddr, data: &'a [u8] },
    /// Seed name `name` resolved to `addrs` (none: it did not resolve).
    Resolved { name: usize, addrs: Vec<SocketAddr> },
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
    addr: Option<Addr>,
    /// Its established link, if the name is held by a live connection.
    link: Option<LinkId>,
}

/// A numbered batch of journal records, for the journal's writer.
pub(crate) type Batch = (u64, Vec<Record>);

/// What one call produces besides the links' bytes: journal records, pool tasks, events.
pub(crate) struct Produced {
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
    /// Messages split from one read, for one push to their sender's queues: runs of
    /// regular messages and the messages between them that are not in a run (requests).
    pub(crate) batch: Vec<crate::deliver::Queued>,
    pub(crate) oob_batch: Vec<crate::deliver::Delivery>,
    /// The run of regular messages being found in the read buffer, not yet cut off it.
    pub(crate) run: RunBuilder,
    /// The node journals, and no journal write has failed.
    journal_open: bool,
    /// Where delivered runs give their read buffers back, for the next reads.
    pub(crate) read_buffers: Arc<ReadBuffers>,
}

/// The regular messages of one sender found in a read buffer and admitted, not yet taken
/// off it (their frames lie back to back at its front): how many, what they cost the
/// receive window, and how much of that is not yet counted as held
/// (`RecvCredit::received`, done once per run, and before the run is queued, so the pool
/// never subtracts what was not added).
#[derive(Debug, Default)]
pub(crate) struct RunBuilder {
    /// Messages.
    pub(crate) count: usize,
    /// The stream epoch of its messages.
    pub(crate) epoch: u32,
    /// Payload bytes.
    pub(crate) bytes: u64,
    /// Window cost not yet added to the held count.
    pub(crate) unflushed: u64,
    /// The held count as last read or added to: with `unflushed`, at least what the
    /// sender holds now (consumption only lowers it).
    pub(crate) held: u64,
}

impl RunBuilder {
    pub(crate) fn clear(&mut self) {
        self.count = 0;
        self.bytes = 0;
        self.unflushed = 0;
    }
}

impl Produced {
    /// Whether records may be journalled (a journalling node whose journal has not
    /// failed).
    pub(crate) fn journal_open(&self) -> bool {
        self.journal_open
    }

    /// Cuts the turn's run of peer `shared`: its messages, found in `buf` (the front of the
    /// read buffer, just taken off), are counted received and held, and queued for this
    /// peer's one push at the end of the turn (after any message queued before them).
    pub(crate) fn cut_run(&mut self, shared: &PeerShared, buf: bytes::Bytes) {
        let run = &mut self.run;
        if run.unflushed > 0 {
            run.held = shared.credit.received(std::mem::take(&mut run.unflushed));
            shared.counters.note_held(run.held);
        }
        if run.count == 0 {
            return;
        }
        Counters::add(&shared.counters.received, run.count as u64);
        Counters::add(&shared.counters.received_bytes, run.bytes);
        let (count, bytes) = (
            std::mem::take(&mut run.count),
            std::mem::take(&mut run.bytes),
        );
        let run = crate::deliver::Run::new(buf, run.epoch, count, bytes);
        self.batch.push(run.returning_to(&self.read_buffers).into());
    }

    /// Pushes the messages split from one read to peer `p`'s queues (dropped if the peer
    /// is gone): regular ones to its member queue (one deliverer at a time), out-of-band
    /// ones to its OOB queue (at most its share of the pool's threads); the pool tasks to
    /// run them go to `tasks`.
    fn push_batch(&mut self, p: Option<&Remote>) {
        let Some(p) = p else {
            self.batch.clear();
            self.oob_batch.clear();
            self.run.clear();
            return;
        };
        let (member, oob) = (&p.shared.member, &p.shared.oob);
        if !self.batch.is_empty() && member.push(self.batch.drain(..)) {
            self.tasks.push_back(Task::Member(member.clone()));
        }
        if !self.oob_batch.is_empty() {
            for _ in 0..oob.push(self.oob_batch.drain(..)) {
                self.tasks.push_back(Task::Oob(oob.clone()));
            }
        }
    }
}

/// Makes the shared state of a member admitted while it dials in.
pub(crate) type NewPeer = Box<dyn Fn(SharedStr) -> Arc<PeerShared> + Send>;

/// Checks, on a TLS link, that the peer's certificate is valid for the member name its
/// handshake claims (always `Ok` on plain TCP).
pub(crate) type CertCheck<'a> = &'a dyn Fn(&str) -> Result<(), String>;

/// The services every part of the endpoint uses: its settings (and who it is in a
/// handshake, the bound of a frame), its counters, its timers and reconnect backoff,
/// whether it is shutting down, what it produces, and the journal's gate.
pub(crate) struct Ctx {
    cfg: Config,
    counters: Arc<NodeCounters>,
    timers: Timers,
    backoff: Backoff,
    /// The shutdown's deadline, once one began.
    shutdown: Option<Instant>,
    out: Produced,
    /// The journal's gate, for a node that journals.
    journal: Option<JournalGate>,
    /// Who this member is, as its handshakes say.
    local: LocalIdentity,
    /// The bound of a data frame's length.
    max_len: usize,
}

impl Ctx {
    /// Whether a handshake with `p` is refused: it is closed, or the node is shutting down
    /// and owes it nothing. A handshake already under way when a shutdown begins goes on
    /// while the peer is owed messages, so that they are handed over before the node stops.
    pub(super) fn closed_to(&self, p: &Remote) -> bool {
        p.state == PeerState::Closed || (self.shutdown.is_some() && !p.owes_anything())
    }

    /// Whether no journal write or sync has failed (always true without a journal): after
    /// a failure, bytes in write buffers may hold messages the journal lacks.
    pub(super) fn journal_ok(&self) -> bool {
        self.journal.as_ref().is_none_or(|j| !j.marks.failed)
    }

    /// The bytes of `link` that may be written now: all of them without a journal; with
    /// one, those whose journal records are durable (`appended`).
    pub(super) fn may_leave<'l>(&self, link: &'l Link) -> Unwritten<'l> {
        match &self.journal {
            None => link.to_write(),
            Some(j) => link.durable_part(j.marks.appended, j.cut),
        }
    }
}

/// A member's protocol (see the module doc).
pub(crate) struct Endpoint {
    /// The services its parts share.
    ctx: Ctx,
    /// The links, with those that have bytes to write and those paused.
    links: Links,
    /// The peers, by id and by name.
    peers: Roster,
    /// `sync_journal`s handled, each with the batch it waits for, not yet polled.
    syncs: VecDeque<Option<u64>>,
    /// The seeds: addresses dialled without a name, and the names they were given by.
    seeds: Seeds,
    /// Membership, when configured.
    members: Option<Members>,
    /// When the housekeeping tick runs next, and whether it is put off.
    housekeeping: time::Housekeeping,
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
        let journal = journal.map(|(policy, recovered)| JournalGate {
            policy,
            recovered: recovered.peers.into_iter().collect(),
            cut: 0,
            marks: WriterMarks::default(),
            awaiting: VecDeque::new(),
        });
        let mut timers = Timers::default();
        let housekeeping = time::Housekeeping::new(now, &cfg);
        timers.add(now + cfg.tick, TimerKind::Tick);
        let mut ep = Endpoint {
            housekeeping,
            links: Links::new(&cfg),
            peers: Roster::new(new_peer),
            syncs: VecDeque::new(),
            seeds: Seeds::new(&cfg),
            members: cfg
                .membership
                .as_ref()
                .map(|setup| Members::new(&cfg, setup, now)),
            ctx: Ctx {
                backoff: Backoff::new(cfg.launch_id),
                counters,
                timers,
                shutdown: None,
                out: Produced {
                    records: Vec::new(),
                    awaiting: Vec::new(),
                    tasks: VecDeque::new(),
                    events: VecDeque::new(),
                    batch: Vec::new(),
                    oob_batch: Vec::new(),
                    run: RunBuilder::default(),
                    batches: Vec::new(),
                    journal_open: journal.is_some(),
                    read_buffers: Arc::new(ReadBuffers::for_window(
                        crate::proto::READ_CHUNK,
                        cfg.recv_window,
                    )),
                },
                max_len: wire::max_frame_len(cfg.max_message),
                local,
                cfg,
                journal,
            },
        };
        ep.seeds.dial_all(&mut ep.ctx.out.events);
        ep.seeds
            .resolve_unresolved(now, &ep.ctx.cfg, &mut ep.ctx.backoff, &mut ep.ctx.timers);
        ep
    }

    /// Takes what happened at `now`. Whatever it makes the endpoint ask of the driver
    /// comes out of [`poll`](Endpoint::poll), which the driver drains next.
    pub(crate) fn handle(&mut self, now: Instant, input: Input<'_>) {
        // A put-off tick comes back on any input that may bring work: not the time passing,
        // a write's progress, nor a membership packet (the view keeps its own timers; a
        // member it makes a peer comes in as a dial's inputs).
        let tick_back = self.housekeeping.put_off()
            && !matches!(
                input,
                Input::Timeout | Input::Wrote { .. } | Input::Writable(_) | Input::Datagram { .. }
            );
        let read = match &input {
            Input::Read { link, .. } if tick_back => Some(*link),
            _ => None,
        };
        match input {
            Input::AddPeer { peer, addr } => self.peers.add(peer, addr, &mut self.ctx),
            Input::RemovePeer(id) => {
                self.peers
                    .remove_peer(now, id, &mut self.links, &mut self.ctx)
            }
            Input::Disconnect(id) => self
                .peers
                .disconnect(now, id, &mut self.links, &mut self.ctx),
            Input::Shutdown { deadline } => self.begin_shutdown(now, deadline),
            Input::SyncJournal => {
                let n = self.sync_journal_now(now);
                self.syncs.push_back(n);
            }
            Input::Publish(id) => self.links.publish(now, id, &mut self.peers, &mut self.ctx),
            Input::FlushCredit(id) => self.flush_credit(now, id),
            Input::Dialled {
                target: Target::Peer(peer),
                link,
                nonce,
            } => self.handshakes().dialled(now, peer, link, nonce),
            Input::Dialled {
                target: Target::Seed(s),
                link,
                nonce,
            } => self
                .seeds
                .opened(now, s, link, nonce, &mut self.links, &mut self.ctx),
            Input::DialFailed(Target::Peer(peer)) => {
                self.peers.dial_failed(now, peer, &mut self.ctx)
            }
            Input::DialFailed(Target::Seed(s)) => {
                self.seeds.dial_failed(now, s, &self.links, &mut self.ctx)
            }
            Input::Connected(link) => self.links.connected(link, &mut self.peers),
            Input::Accepted {
                link,
                from,
                verdict,
                nonce,
            } => self.handshakes().accepted(now, link, from, verdict, nonce),
            Input::Read { link, cert } => self.handle_input(now, link, cert),
            Input::Writable(link) => self.links.dirty.push_back(link),
            Input::Wrote { link, n } => {
                self.links
                    .wrote(now, link, n, &mut self.peers, &mut self.ctx)
            }
            Input::Failed { link, why } => {
                self.links
                    .failed(now, link, why, &mut self.peers, &mut self.ctx)
            }
            Input::TlsFailed { link, reason, from } => {
                self.links
                    .tls_failed(now, link, reason, from, &mut self.peers, &mut self.ctx)
            }
            Input::JournalMarks(marks) => {
                let failed = self
                    .ctx
                    .journal
                    .as_mut()
                    .is_some_and(|j| j.progress(marks, &mut self.peers, &mut self.links));
                if failed {
                    self.journal_failed(now);
                }
            }
            Input::Datagram { from, data } => {
                if let Some(m) = self.members.as_mut() {
                    m.packet(now, from, data);
                }
            }
            Input::Resolved { name, addrs } => self.seed_resolved(now, name, &addrs),
            Input::Timeout => {
                self.handle_timeout(now);
                if let Some(m) = self.members.as_mut() {
                    m.timers(now);
                }
            }
        }
        if tick_back {
            self.bring_tick_back(now, read);
        }
        self.seeds.settle(now, &mut self.links, &mut self.ctx);
    }

    /// The next thing the driver must do, or `None` when there is nothing more until the
    /// next input. The order is the endpoint's:
    ///
    /// 1. pool tasks, then the events (dials, closes, reports, events) in the order they
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
            if let Some(m) = self.members.as_mut() {
                m.pump(now, &mut self.peers, &mut self.links, &mut self.ctx);
            }
            self.seeds.settle(now, &mut self.links, &mut self.ctx);
            if let Some(t) = self.ctx.out.tasks.pop_front() {
                return Some(Output::Task(t));
            }
            if let Some(e) = self.ctx.out.events.pop_front() {
                return Some(e);
            }
            if let Some(j) = self.ctx.journal.as_mut() {
                j.cut(&mut self.links, &mut self.ctx.out);
            }
            if !self.ctx.out.batches.is_empty() {
                return Some(Output::Journal(self.ctx.out.batches.remove(0)));
            }
            if let Some(n) = self.syncs.pop_front() {
                return Some(Output::JournalSync(n));
            }
            if let Some(id) = self.links.dirty.pop_front() {
                if self.links.table.get(&id).is_none_or(|l| l.connecting) {
                    continue; // closed since, or not connected yet
                }
                if !self.ctx.journal_ok() {
                    self.links
                        .failed(now, id, Why::Shutdown, &mut self.peers, &mut self.ctx);
                    continue;
                }
                return Some(Output::Transmit(id));
            }
            if self.links.deferred.is_empty() {
                return None;
            }
            for id in std::mem::take(&mut self.links.deferred) {
                self.links.publish(now, id, &mut self.peers, &mut self.ctx);
            }
        }
    }

    /// When the endpoint next needs [`Input::Timeout`].
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let members = self.members.as_ref().and_then(Members::next_at);
        match (self.ctx.timers.next_at(), members) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A link, to move bytes between its buffers and its connection.
    pub(crate) fn link_mut(&mut self, id: LinkId) -> Option<&mut Link> {
        self.links.table.get_mut(&id)
    }

    /// Whether the endpoint is shutting down and done: everything queued to connected
    /// peers written and acknowledged, or the deadline passed. A peer whose handshake is
    /// under way over an open transport counts as connected when it is owed something: the
    /// handshake ends soon (established, refused, or at its timeout), and a node stopping
    /// just as it reconnects still hands over what it holds. That includes a link it
    /// accepted and that has not said who it is yet, while a member owed messages has no
    /// link (it may be the one dialling).
    pub(crate) fn shutdown_done(&self, now: Instant) -> bool {
        let Some(deadline) = self.ctx.shutdown else {
            return false;
        };
        if now >= deadline {
            return true;
        }
        let mut owed_unlinked = false;
        let peers_done = self.peers.values().all(|p| {
            match p.link.and_then(|l| self.links.table.get(&l)) {
                // Flushed: everything queued is published, written and acknowledged.
                Some(l) if l.established => !p.owes_anything() && l.unwritten() == 0,
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
                    .table
                    .values()
                    .any(|l| l.dialled.is_none() && l.peer.is_none() && !l.established))
    }

    /// The bytes of link `id` that may be written now: all of them without a journal; with
    /// one, those whose journal records are durable (`appended`).
    pub(crate) fn to_write(&self, id: LinkId) -> Option<Unwritten<'_>> {
        let link = self.links.table.get(&id)?;
        Some(self.ctx.may_leave(link))
    }

    /// The read buffers delivered runs give back: where the driver's next read buffers
    /// come from (`ReadBuffers::make_room`).
    pub(crate) fn read_buffers(&self) -> &Arc<ReadBuffers> {
        &self.ctx.out.read_buffers
    }

    /// Whether the housekeeping tick is put off: the last one found the endpoint quiet and
    /// no input has brought work since.
    #[inline]
    pub(crate) fn tick_put_off(&self) -> bool {
        self.housekeeping.put_off()
    }

    /// Whether the housekeeping tick is put off, and when it is due; for the simulation's
    /// checks.
    #[cfg(test)]
    pub(crate) fn tick_plan(&self) -> (bool, Instant) {
        debug_assert_eq!(
            self.ctx.timers.count(|k| *k == TimerKind::Tick),
            1,
            "one housekeeping tick in the timer heap"
        );
        self.housekeeping.state()
    }

    /// Peer `id`, for the simulation's checks.
    #[cfg(any(test, all(cohort_internals, not(loom))))]
    pub(crate) fn peer(&self, id: usize) -> Option<&Remote> {
        self.peers.get(&id)
    }

    /// Every link, for the simulation's checks.
    #[cfg(any(test, all(cohort_internals, not(loom))))]
    pub(crate) fn links(&self) -> impl Iterator<Item = &Link> {
        self.links.table.values()
    }
}
