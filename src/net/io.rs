//! The IO thread's event loop.
//!
//! One thread owns the `Poll`, the listener, every connection, every peer's recovery
//! descriptor and every timer. It drains readiness until `WouldBlock` (bounded per
//! connection per turn, for fairness), coalesces outgoing frames into one buffer per
//! connection written once per turn, and never blocks: a peer holding more than its receive
//! window is not read until its handler catches up (TCP back-pressure on that peer only), a
//! full socket makes it stop publishing to that peer.
//!
//! A turn can last long — on a machine with more busy threads than cores the thread waits
//! for a CPU many times within one turn — so timeouts that blame a peer (idle, handshake)
//! are judged as of the last `poll`, never by time the loop did not look, and handshake
//! frames and a new connection's first frames are written at once, not at the end of the
//! turn.

mod admit;
mod connect;
mod durable;
pub(crate) use durable::JournalLeft;
mod handshake;
mod housekeeping;
mod read;
mod write;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use bytes::Bytes;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use super::admission::{self, Admission, Shedding, Verdict};
use super::conn::{self, Conn, Transport};
use super::timer::{Backoff, TimerKind, Timers};
use super::{
    Command, IdHash, IoConfig, IoParts, IoShared, NameHash, PeerMap, UndeliveredHook, FIRST_CONN,
    LISTENER, WAKER,
};
use crate::deliver::{Delivery, Pool, Task};
use crate::journal::Record;
use crate::peer::{Counters, Ledger, Outgoing, PeerInfo, PeerShared, PeerState, Return};
use crate::proto::{
    keep_new, Descriptor, Handshake, HsEvent, LocalIdentity, PeerIdentity, Receive, RecoveryError,
    TieBreak,
};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, SharedStr};
use crate::wire::{self, CloseCode, Frame, Nonce};

/// Bytes read from one connection per loop turn before others get their turn.
const READ_BUDGET: usize = 512 * 1024;

/// Connections accepted per loop turn before the connections we hold get their turn: a
/// connect storm faster than the loop would otherwise keep it accepting, and no handshake
/// in progress would be answered meanwhile.
const ACCEPT_BUDGET: usize = 256;

/// Node-wide connection counters.
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
    pub(crate) auth_failures: AtomicU64,
    pub(crate) handshake_timeouts: AtomicU64,
    pub(crate) tie_breaks: AtomicU64,
    pub(crate) protocol_errors: AtomicU64,
    /// Connections closed because their peer sent past its window (also protocol errors).
    pub(crate) window_violations: AtomicU64,
    /// Times a connection's reading was paused: its peer had more than its window waiting
    /// for delivery (messages of a previous stream still being handled).
    pub(crate) read_pauses: AtomicU64,
    pub(crate) idle_timeouts: AtomicU64,
    pub(crate) refused_limit: AtomicU64,
    /// Accepted connections refused because their source held its share of pending ones.
    pub(crate) refused_per_source: AtomicU64,
    /// Pending accepted connections closed to make room for a newer one.
    pub(crate) displaced: AtomicU64,
    /// Handshake timeouts that came early because the pending table was over half full.
    pub(crate) pressure_timeouts: AtomicU64,
    pub(crate) journal_failures: AtomicU64,
    /// Connections closed for a TLS failure (handshake, certificate, name).
    pub(crate) tls_failures: AtomicU64,
    /// Timers pending in the IO thread now.
    pub(crate) timers: AtomicU64,
    /// Connections open now (any state).
    pub(crate) open: AtomicU64,
    /// Connections established now.
    pub(crate) established: AtomicU64,
    /// Accepted connections in their handshake now.
    pub(crate) pending: AtomicU64,
}

/// IO-thread-only state of one peer.
struct PeerIo {
    shared: Arc<PeerShared>,
    addr: Option<SocketAddr>,
    state: PeerState,
    /// The connection that speaks for this peer: our dial in progress, or a connection that
    /// identified as this peer (handshaking or established).
    conn: Option<Token>,
    desc: Descriptor,
    /// Consecutive failed attempts (backoff exponent).
    attempt: u32,
    /// Reconnect timers carry this; bumping it cancels them.
    gen: u64,
    /// Taken from the shared outbox, not yet published (the socket buffer was full).
    pending: VecDeque<Outgoing>,
    /// Window bytes published and not yet credited back by the peer.
    ledger: Ledger,
    ack_timer: bool,
    /// The received count of an ack encoded but not yet written out: the descriptor's
    /// `acks_sent` advances only once the bytes have left (a connection that breaks first
    /// loses the ack, and it is owed again).
    ack_unwritten: Option<u64>,
    /// A duplicate arrived: ack even if nothing new is owed.
    ack_forced: bool,
    /// Largest payload the peer accepts (from its handshake).
    peer_max_message: usize,
    /// The peer's send window (from its handshake): what it may have received here and not
    /// yet credited back, enforced.
    peer_window: u64,
    /// When we last sent a credit probe.
    last_probe: Option<Instant>,
    /// The blocked episode we last warned about.
    warned_episode: u64,
    /// Journal: (messages delivered, credit) recorded for the peer's stream, and the part
    /// known to be on disk (what acks may carry).
    recorded: (u64, u64),
    /// Journal: window bytes of the peer's unreliable messages recorded as handled.
    recorded_unreliable: u64,
    durable: (u64, u64),
    /// Journal: the epoch of the peer's stream (see `deliver::Progress`).
    epoch: u32,
    /// Journal: the stream was restored after a restart with more bytes than the window
    /// could be charged for: credit for the excess finds nothing outstanding, and is
    /// clamped quietly.
    restored: bool,
    /// Journal: the last sequence number restored from the journal at start (`None`: not
    /// restored). Only a restored stream may find its peer ahead of it.
    restored_upto: Option<u64>,
}

impl PeerIo {
    fn set_state(&mut self, next: PeerState) {
        if self.state == next {
            return;
        }
        debug_assert!(
            self.state.can_become(next),
            "illegal peer transition {:?} -> {:?} for '{}'",
            self.state,
            next,
            self.shared.name
        );
        if !self.state.can_become(next) {
            log::error!(
                "peer '{}': illegal transition {} -> {} ignored",
                self.shared.name,
                self.state,
                next
            );
            return;
        }
        self.state = next;
        self.shared.set_state(next);
    }
}

/// What reading a data frame leaves the connection to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inflow {
    /// Go on reading.
    Go,
    /// The frame closed the connection.
    Closed,
    /// Stop reading until the peer's held bytes are back within its window.
    Pause,
}

/// What one `flush_peer` pass did, added to the shared counters once.
#[derive(Default)]
struct Tally {
    sent: u64,
    sent_bytes: u64,
    filtered: u64,
    filtered_bytes: u64,
    failed: u64,
    failed_bytes: u64,
    expired: u64,
    too_large: u64,
    /// Unreliable messages failed for want of a connection (journalling nodes).
    unconnected: u64,
}

pub(crate) struct IoThread {
    cfg: IoConfig,
    local: LocalIdentity,
    poll: Poll,
    listener: TcpListener,
    shared: Arc<IoShared>,
    peers_map: PeerMap,
    pool: Arc<Pool>,
    counters: Arc<NodeCounters>,
    undelivered: Option<UndeliveredHook>,
    stopped: Arc<AtomicBool>,
    max_len: usize,
    conns: HashMap<Token, Conn, IdHash>,
    next_token: usize,
    peers: HashMap<usize, PeerIo, IdHash>,
    by_name: HashMap<SharedStr, usize, NameHash>,
    timers: Timers,
    backoff: Backoff,
    /// Connections with unread input left over (budget reached, or reading paused).
    read_pending: VecDeque<Token>,
    /// Connections with bytes appended to their write buffer this turn.
    dirty: Vec<Token>,
    /// Connections whose reading is paused (see `pause`).
    paused: Vec<Token>,
    shutdown: Option<Instant>,
    batch: Vec<Delivery>,
    /// Out-of-band messages split this turn, for one push to their sender's OOB queue.
    oob_batch: Vec<Delivery>,
    /// The durable outbox, when the node journals.
    journal: Option<durable::JournalIo>,
    /// Ciphertext read from a TLS connection before rustls decrypts it (shared by all
    /// connections; stays empty without TLS).
    scratch: Vec<u8>,
    /// Accepted connections not yet established, by age and source address.
    admission: Admission,
    /// What the admission rules shed since the last warning about it.
    shedding: Shedding,
    /// The listener may hold connections not yet accepted (readiness reported, or the
    /// accept budget of the last turn ran out).
    accept_pending: bool,
    /// When the last `poll` returned. What the loop knows of its sockets is as of then:
    /// bytes that arrive later in a turn are seen at the next poll, however long the turn
    /// takes (a descheduled IO thread, a slow callback). Timeouts that blame a peer are
    /// judged as of this instant, never by time the loop did not look.
    polled_at: Instant,
}

impl IoThread {
    pub(crate) fn new(parts: IoParts) -> IoThread {
        let cfg = parts.config;
        let local = LocalIdentity {
            launch_id: cfg.launch_id,
            window: cfg.window,
            max_message: cfg.max_message as u32,
            cluster: cfg.cluster.clone(),
            name: cfg.name.to_string(),
            secret: cfg.secret.clone(),
        };
        IoThread {
            max_len: wire::max_frame_len(cfg.max_message),
            backoff: Backoff::new(cfg.launch_id),
            admission: Admission::new(cfg.max_pending, cfg.max_pending_per_source),
            shedding: Shedding::default(),
            accept_pending: false,
            local,
            cfg,
            poll: parts.poll,
            listener: parts.listener,
            shared: parts.shared,
            peers_map: parts.peers,
            pool: parts.pool,
            counters: parts.counters,
            undelivered: parts.undelivered,
            stopped: parts.stopped,
            conns: HashMap::default(),
            next_token: FIRST_CONN,
            peers: HashMap::default(),
            by_name: HashMap::default(),
            timers: Timers::default(),
            read_pending: VecDeque::new(),
            dirty: Vec::new(),
            paused: Vec::new(),
            shutdown: None,
            batch: Vec::new(),
            oob_batch: Vec::new(),
            journal: parts.journal.map(|(j, r)| durable::JournalIo::new(j, r)),
            scratch: Vec::new(),
            polled_at: Instant::now(),
        }
    }

    /// Runs the loop until shutdown completes.
    pub(crate) fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        // The configured peers first (their journalled streams are restored as they are
        // added), then a word about journalled streams no configured peer claimed.
        self.handle_requests();
        self.warn_unclaimed();
        self.timers
            .add(Instant::now() + self.cfg.tick, TimerKind::Tick);
        loop {
            let now = Instant::now();
            // Don't sleep with work in hand: unread input, or bytes published after the last
            // write pass (a drained socket's writer refilled its buffer).
            let busy =
                !self.read_pending.is_empty() || !self.dirty.is_empty() || self.accept_pending;
            let timeout = if busy {
                Some(Duration::ZERO)
            } else {
                self.timers.next_in(now)
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                log::error!("IO thread: poll failed, stopping: {e}");
                break;
            }
            self.polled_at = Instant::now();
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_pending = true,
                    WAKER => {}
                    t => {
                        let hup = ev.is_read_closed() || ev.is_error();
                        let readable = ev.is_readable() || hup;
                        self.conn_event(t, readable, hup, ev.is_writable() || ev.is_error());
                    }
                }
            }
            if self.accept_pending {
                self.accept_all();
            }
            if self.shared.take_wake() {
                self.handle_requests();
            }
            self.process_read_pending();
            self.fire_timers();
            self.flush_dirty();
            // Relaxed: a gauge for stats.
            self.counters
                .timers
                .store(self.timers.len() as u64, Ordering::Relaxed);
            if let Some(deadline) = self.shutdown {
                if self.shutdown_flushed() || Instant::now() >= deadline {
                    break;
                }
            }
        }
        self.finish();
    }

    fn handle_requests(&mut self) {
        let commands = std::mem::take(&mut *self.shared.commands.lock());
        for c in commands {
            self.command(c);
        }
        let ready = std::mem::take(&mut *self.shared.ready.lock());
        for id in ready {
            self.flush_peer(id);
        }
        let credit = std::mem::take(&mut *self.shared.credit_flush.lock());
        let now = Instant::now();
        for id in credit {
            self.send_ack(id);
            self.resume_peer(id, now);
        }
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::AddPeer { peer, addr } => {
                let id = peer.id;
                self.by_name.insert(peer.name.clone(), id);
                self.peers.insert(
                    id,
                    PeerIo {
                        shared: peer,
                        addr,
                        state: PeerState::Backoff,
                        conn: None,
                        desc: Descriptor::new(),
                        attempt: 0,
                        gen: 0,
                        pending: VecDeque::new(),
                        ledger: Ledger::default(),
                        ack_timer: false,
                        ack_unwritten: None,
                        ack_forced: false,
                        peer_max_message: usize::MAX,
                        peer_window: 0,
                        last_probe: None,
                        warned_episode: 0,
                        recorded: (0, 0),
                        recorded_unreliable: 0,
                        durable: (0, 0),
                        epoch: 0,
                        restored: false,
                        restored_upto: None,
                    },
                );
                self.restore_peer(id);
                if self.shutdown.is_none() {
                    self.dial(id);
                }
            }
            Command::RemovePeer { id, done } => {
                self.remove_peer(id);
                done.complete();
            }
            Command::Disconnect { id } => {
                if let Some(t) = self.peers.get(&id).and_then(|p| p.conn) {
                    log::info!(
                        "{}: disconnecting '{}' on request",
                        self.cfg.name,
                        self.peer_name(id)
                    );
                    self.close_conn(t, Some((CloseCode::Other, "disconnect requested")));
                }
            }
            Command::Shutdown { deadline } => self.begin_shutdown(deadline),
            Command::Barrier { done } => done.complete(),
            Command::SyncJournal { done } => {
                let ids: Vec<usize> = self.peers.keys().copied().collect();
                for id in ids {
                    self.flush_peer_for_sync(id);
                }
                // After a journal failure the caller is never told the sync succeeded: it
                // sees the node stop (`Error::Closed`).
                if self.sync_journal() {
                    done.complete();
                }
            }
        }
    }

    fn peer_name(&self, id: usize) -> SharedStr {
        self.peers
            .get(&id)
            .map(|p| p.shared.name.clone())
            .unwrap_or_else(|| "?".into())
    }

    /// Publishes the connection gauges after the connection set changed.
    fn update_gauges(&self) {
        // Relaxed: gauges for stats only.
        self.counters
            .open
            .store(self.conns.len() as u64, Ordering::Relaxed);
        let est = self.conns.values().filter(|c| c.established).count() as u64;
        self.counters.established.store(est, Ordering::Relaxed);
        self.counters
            .pending
            .store(self.admission.len() as u64, Ordering::Relaxed);
    }

    fn new_token(&mut self) -> Token {
        let t = Token(self.next_token);
        self.next_token += 1;
        t
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        // Handshake deadlines that passed after the last poll: judged after the next one.
        let mut unjudged = Vec::new();
        while let Some((at, t)) = self.timers.pop_due(now) {
            match t {
                TimerKind::Reconnect { peer, gen } => {
                    if self
                        .peers
                        .get(&peer)
                        .is_some_and(|p| p.gen == gen && p.conn.is_none())
                    {
                        self.dial(peer);
                    }
                }
                TimerKind::Handshake { token } => {
                    let open = self.conns.get(&token).is_some_and(|c| !c.established);
                    if open && self.polled_at < at {
                        // The deadline passed during this turn: what the peer sent since the
                        // last poll is unread yet (a Ready waiting in the socket).
                        unjudged.push((at, t));
                        continue;
                    }
                    self.handshake_due(token, self.polled_at);
                }
                TimerKind::AckDelay { peer } => {
                    if let Some(p) = self.peers.get_mut(&peer) {
                        p.ack_timer = false;
                    }
                    self.send_ack(peer);
                    if self.journalled() {
                        // The handler may not have reached what arrived: ask again later
                        // while an ack is owed.
                        if let Some(p) = self.peers.get_mut(&peer) {
                            let covered = p.ack_unwritten.unwrap_or(0).max(p.desc.acks_sent());
                            if p.desc.received() > covered && !p.ack_timer && p.conn.is_some() {
                                p.ack_timer = true;
                                self.timers
                                    .add(now + self.cfg.ack_delay, TimerKind::AckDelay { peer });
                            }
                        }
                    }
                }
                TimerKind::Tick => self.tick(),
                TimerKind::JournalSync => self.journal_sync_due(),
                TimerKind::Deadline => {}
            }
        }
        // Due already: the next turn polls without waiting, then judges them.
        for (at, t) in unjudged {
            self.timers.add(at, t);
        }
    }

    fn begin_shutdown(&mut self, deadline: Instant) {
        if self.shutdown.is_some() {
            return;
        }
        self.shutdown = Some(deadline);
        self.timers.add(deadline, TimerKind::Deadline);
        let ids: Vec<usize> = self.peers.keys().copied().collect();
        for id in ids {
            let p = self.peers.get_mut(&id).expect("listed");
            p.gen += 1; // no more reconnects
                        // No new messages; what is queued is still flushed.
            p.shared.outbox.close_keep();
            p.shared.outbox.window().close();
            let connected = p
                .conn
                .is_some_and(|t| self.conns.get(&t).is_some_and(|c| c.established));
            // With a journal, what is queued for a disconnected peer is journalled now and
            // resent after the restart.
            if connected || self.journal.is_some() {
                self.flush_peer(id);
            }
        }
    }

    /// Whether everything queued to connected peers is written and acknowledged.
    fn shutdown_flushed(&self) -> bool {
        self.peers.values().all(|p| {
            let established = p
                .conn
                .and_then(|t| self.conns.get(&t))
                .filter(|c| c.established);
            match established {
                None => true, // not connected: nothing more can be flushed
                Some(c) => {
                    p.pending.is_empty()
                        && p.shared.outbox.is_empty()
                        && c.unwritten() == 0
                        && p.desc.unacked_len() == 0
                }
            }
        })
    }

    fn finish(&mut self) {
        let tokens: Vec<Token> = self.conns.keys().copied().collect();
        let ids: Vec<usize> = self.peers.keys().copied().collect();
        for id in ids {
            self.retire_peer(id, CloseCode::Shutdown);
        }
        for t in tokens {
            self.close_conn(t, Some((CloseCode::Shutdown, "node shutting down")));
        }
        // A failure is logged and counted; `leave_journal` then leaves nothing to record.
        let _ = self.sync_journal();
        self.leave_journal();
        self.stopped.store(true, Ordering::Release);
        log::debug!("{}: IO thread stopped", self.cfg.name);
    }
}

/// Socket options for every connection, through socket2.
fn configure(cfg: &IoConfig, stream: &TcpStream) {
    let sock = socket2::SockRef::from(stream);
    if let Err(e) = sock.set_tcp_nodelay(true) {
        log::warn!("{}: cannot set TCP_NODELAY: {e}", cfg.name);
    }
    if let Some(n) = cfg.send_buffer {
        if let Err(e) = sock.set_send_buffer_size(n) {
            log::warn!("{}: cannot set SO_SNDBUF: {e}", cfg.name);
        }
    }
    if let Some(n) = cfg.recv_buffer {
        if let Err(e) = sock.set_recv_buffer_size(n) {
            log::warn!("{}: cannot set SO_RCVBUF: {e}", cfg.name);
        }
    }
}

/// Fails every message of `p` not yet published, giving back its permits. Returns how many.
fn fail_queued(p: &mut PeerIo) -> u64 {
    let mut queued = std::mem::take(&mut p.pending);
    queued.extend(p.shared.outbox.close());
    let n = queued.len() as u64;
    let bytes: u64 = queued.iter().map(|m| m.payload.len() as u64).sum();
    let permits: u64 = queued.iter().map(Outgoing::cost).sum();
    p.shared.outbox.give_back(Return::Failed, permits);
    Counters::add(&p.shared.counters.failed_bytes, bytes);
    Counters::add(&p.shared.counters.failed, n);
    n
}
