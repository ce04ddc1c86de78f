//! The IO thread's event loop.
//!
//! One thread owns the `Poll`, the listener, every connection, every peer's recovery
//! descriptor and every timer. It drains readiness until `WouldBlock` (bounded per
//! connection per turn, for fairness), coalesces outgoing frames into one buffer per
//! connection written once per turn, and never blocks: a full pool makes it stop reading
//! (TCP back-pressure), a full socket makes it stop publishing to that peer.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use super::conn::Conn;
use super::timer::{Backoff, TimerKind, Timers};
use super::{
    Command, IdHash, IoConfig, IoParts, IoShared, NameHash, PeerMap, UndeliveredHook, FIRST_CONN,
    LISTENER, WAKER,
};
use crate::deliver::{Delivery, Pool, Task};
use crate::peer::{Counters, Ledger, Outgoing, PeerInfo, PeerShared, PeerState, Return};
use crate::proto::{
    keep_new, Descriptor, Handshake, HsEvent, LocalIdentity, PeerIdentity, Receive, RecoveryError,
    TieBreak,
};
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::sync::{Arc, SharedStr};
use crate::wire::{self, CloseCode, Frame};

/// Bytes read from one connection per loop turn before others get their turn.
const READ_BUDGET: usize = 512 * 1024;

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
    pub(crate) handshake_timeouts: AtomicU64,
    pub(crate) tie_breaks: AtomicU64,
    pub(crate) protocol_errors: AtomicU64,
    pub(crate) pool_stalls: AtomicU64,
    pub(crate) idle_timeouts: AtomicU64,
    pub(crate) refused_limit: AtomicU64,
    /// Timers pending in the IO thread now.
    pub(crate) timers: AtomicU64,
    /// Connections open now (any state).
    pub(crate) open: AtomicU64,
    /// Connections established now.
    pub(crate) established: AtomicU64,
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
    /// When we last sent a credit probe.
    last_probe: Option<Instant>,
    /// The blocked episode we last warned about.
    warned_episode: u64,
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
}

/// A frame read from a connection, owned so that it can be handled with the whole IO state
/// at hand.
enum Inbound {
    Data {
        flags: u8,
        seq: Option<u64>,
        payload: Bytes,
    },
    /// Any other frame, decoded again when handled.
    Other(Bytes),
    Bad(wire::WireError),
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
    /// Tasks the pool refused; while any is here, no socket is read.
    stash: VecDeque<Task>,
    shutdown: Option<Instant>,
    inbound: Vec<Inbound>,
    batch: Vec<Delivery>,
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
        };
        IoThread {
            max_len: wire::max_frame_len(cfg.max_message),
            backoff: Backoff::new(cfg.launch_id),
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
            stash: VecDeque::new(),
            shutdown: None,
            inbound: Vec::new(),
            batch: Vec::new(),
        }
    }

    /// Runs the loop until shutdown completes.
    pub(crate) fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        self.timers
            .add(Instant::now() + self.cfg.tick, TimerKind::Tick);
        loop {
            let now = Instant::now();
            // Don't sleep with work in hand: unread input, or bytes published after the last
            // write pass (a drained socket's writer refilled its buffer).
            let busy =
                (!self.read_pending.is_empty() && self.stash.is_empty()) || !self.dirty.is_empty();
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
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_all(),
                    WAKER => {}
                    t => {
                        let hup = ev.is_read_closed() || ev.is_error();
                        let readable = ev.is_readable() || hup;
                        self.conn_event(t, readable, hup, ev.is_writable() || ev.is_error());
                    }
                }
            }
            if self.shared.take_wake() {
                self.handle_requests();
            }
            if self.shared.pool_space.swap(false, Ordering::AcqRel) {
                self.unstash();
            }
            if self.stash.is_empty() {
                self.process_read_pending();
            }
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

    // ----- requests from other threads -------------------------------------------------

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
        for id in credit {
            self.send_ack(id);
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
                        last_probe: None,
                        warned_episode: 0,
                    },
                );
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
        }
    }

    fn peer_name(&self, id: usize) -> SharedStr {
        self.peers
            .get(&id)
            .map(|p| p.shared.name.clone())
            .unwrap_or_else(|| "?".into())
    }

    // ----- connections -------------------------------------------------------------------

    /// Publishes the connection gauges after the connection set changed.
    fn update_gauges(&self) {
        // Relaxed: gauges for stats only.
        self.counters
            .open
            .store(self.conns.len() as u64, Ordering::Relaxed);
        let est = self.conns.values().filter(|c| c.established).count() as u64;
        self.counters.established.store(est, Ordering::Relaxed);
    }

    fn new_token(&mut self) -> Token {
        let t = Token(self.next_token);
        self.next_token += 1;
        t
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, from)) => {
                    if self.shutdown.is_some() {
                        continue; // dropped: we are closing
                    }
                    let pending = self
                        .conns
                        .values()
                        .filter(|c| c.dialled.is_none() && !c.established)
                        .count();
                    if self.conns.len() >= self.cfg.max_connections
                        || pending >= self.cfg.max_pending
                    {
                        // Dropped at once: an untrusted peer cannot make us hold more.
                        Counters::add(&self.counters.refused_limit, 1);
                        log::debug!(
                            "{}: refusing connection from {from}: {} open, {pending} handshaking (limits {} / {})",
                            self.cfg.name,
                            self.conns.len(),
                            self.cfg.max_connections,
                            self.cfg.max_pending
                        );
                        continue;
                    }
                    configure(&self.cfg, &stream);
                    let token = self.new_token();
                    if let Err(e) =
                        self.poll
                            .registry()
                            .register(&mut stream, token, Interest::READABLE)
                    {
                        log::warn!(
                            "{}: cannot register connection from {from}: {e}",
                            self.cfg.name
                        );
                        continue;
                    }
                    Counters::add(&self.counters.accepted, 1);
                    log::debug!("{}: accepted connection from {from}", self.cfg.name);
                    let mut out = Vec::new();
                    let hs = Handshake::acceptor(self.local.clone(), &mut out);
                    let mut conn = Conn::new(token, stream, None, hs);
                    conn.wbuf = out;
                    self.conns.insert(token, conn);
                    self.update_gauges();
                    self.dirty.push(token);
                    self.timers.add(
                        Instant::now() + self.cfg.handshake_timeout,
                        TimerKind::Handshake { token },
                    );
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and the like: log and try again on the next readiness event.
                    log::error!("{}: accept failed: {e}", self.cfg.name);
                    break;
                }
            }
        }
    }

    fn dial(&mut self, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if p.state == PeerState::Closed || p.conn.is_some() || self.shutdown.is_some() {
            return;
        }
        let Some(addr) = p.addr else {
            p.set_state(PeerState::Backoff);
            return; // no address: it will dial us
        };
        match TcpStream::connect(addr) {
            Ok(mut stream) => {
                let token = Token(self.next_token);
                self.next_token += 1;
                if let Err(e) = self.poll.registry().register(
                    &mut stream,
                    token,
                    Interest::READABLE | Interest::WRITABLE,
                ) {
                    log::warn!("{}: cannot register dial to {addr}: {e}", self.cfg.name);
                    self.schedule_reconnect(id);
                    return;
                }
                let p = self.peers.get_mut(&id).expect("peer present");
                let hs = Handshake::dialler(self.local.clone(), p.shared.name.to_string());
                let mut conn = Conn::new(token, stream, Some(id), hs);
                conn.set_writable_interest(true);
                p.conn = Some(token);
                p.set_state(PeerState::Connecting);
                self.conns.insert(token, conn);
                self.update_gauges();
                Counters::add(&self.counters.dialled, 1);
                self.timers.add(
                    Instant::now() + self.cfg.handshake_timeout,
                    TimerKind::Handshake { token },
                );
            }
            Err(e) => {
                log::debug!(
                    "{}: dial '{}' at {addr} failed: {e}",
                    self.cfg.name,
                    p.shared.name
                );
                Counters::add(&self.counters.dial_failures, 1);
                self.schedule_reconnect(id);
            }
        }
    }

    fn schedule_reconnect(&mut self, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if p.state == PeerState::Closed || self.shutdown.is_some() {
            return;
        }
        p.set_state(PeerState::Backoff);
        if p.addr.is_none() {
            return;
        }
        p.gen += 1;
        let delay = self
            .backoff
            .delay(p.attempt, self.cfg.backoff_min, self.cfg.backoff_max);
        p.attempt = p.attempt.saturating_add(1);
        let gen = p.gen;
        self.timers.add(
            Instant::now() + delay,
            TimerKind::Reconnect { peer: id, gen },
        );
    }

    fn conn_event(&mut self, token: Token, readable: bool, hup: bool, writable: bool) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return; // stale token: a spurious event for a connection already closed
        };
        if conn.connecting {
            match conn.stream.take_error() {
                Ok(None) => {}
                Ok(Some(e)) | Err(e) => return self.dial_failed(token, e),
            }
            match conn.stream.peer_addr() {
                Ok(_) => {
                    conn.connecting = false;
                    configure(&self.cfg, &conn.stream);
                    if let Some(id) = conn.dialled {
                        if let Some(p) = self.peers.get_mut(&id) {
                            p.set_state(PeerState::Handshaking);
                        }
                    }
                    self.dirty.push(token);
                }
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return, // not yet
                Err(e) => return self.dial_failed(token, e),
            }
        }
        if writable {
            self.write_conn(token);
        }
        if readable {
            self.read_conn(token, hup);
        }
    }

    fn dial_failed(&mut self, token: Token, e: io::Error) {
        Counters::add(&self.counters.dial_failures, 1);
        if let Some(conn) = self.conns.get(&token) {
            if let Some(id) = conn.dialled {
                log::debug!(
                    "{}: connect to '{}' failed: {e}",
                    self.cfg.name,
                    self.peer_name(id)
                );
            }
        }
        self.close_conn(token, None);
    }

    fn write_conn(&mut self, token: Token) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if conn.connecting {
            return;
        }
        let result = conn.flush();
        match result {
            Ok(drained) => {
                if drained && conn.established {
                    // Every ack in the buffer has been written: now it counts as sent.
                    if let Some(p) = conn.peer.and_then(|id| self.peers.get_mut(&id)) {
                        if p.conn == Some(token) {
                            if let Some(r) = p.ack_unwritten.take() {
                                p.desc.ack_written(r);
                            }
                        }
                    }
                }
                let Some(conn) = self.conns.get_mut(&token) else {
                    return;
                };
                let low = conn.unwritten() < self.cfg.write_high_water / 2;
                if let Err(e) = conn.update_interest(self.poll.registry()) {
                    log::warn!("{}: reregister failed: {e}", self.cfg.name);
                }
                let peer = if conn.established { conn.peer } else { None };
                if let (true, Some(id)) = (low, peer) {
                    let more = self
                        .peers
                        .get(&id)
                        .is_some_and(|p| !p.pending.is_empty() || !p.shared.outbox.is_empty());
                    if more {
                        self.flush_peer(id);
                    }
                }
            }
            Err(e) => {
                log::info!("{}: write failed, closing connection: {e}", self.cfg.name);
                self.close_conn(token, None);
            }
        }
    }

    fn flush_dirty(&mut self) {
        let dirty = std::mem::take(&mut self.dirty);
        for t in &dirty {
            self.write_conn(*t);
        }
        let mut dirty = dirty;
        dirty.clear();
        if self.dirty.is_empty() {
            self.dirty = dirty;
        }
    }

    /// Reads and handles what connection `token` has, up to the per-turn budget. `hup`: the
    /// readiness event reported the peer's hang-up (or this is a continuation), so read until
    /// EOF or `WouldBlock` rather than stopping at a short read.
    fn read_conn(&mut self, token: Token, hup: bool) {
        if !self.stash.is_empty() {
            // The pool is full: leave the bytes in the kernel so TCP pushes back.
            self.mark_read_pending(token);
            return;
        }
        let mut total = 0usize;
        loop {
            let Some(conn) = self.conns.get_mut(&token) else {
                return;
            };
            match conn.read_some() {
                Ok((0, _)) => {
                    self.handle_inbound(token);
                    if self.conns.contains_key(&token) {
                        self.close_conn(token, None);
                    }
                    return;
                }
                Ok((n, short)) => {
                    total += n;
                    conn.last_read = Instant::now();
                    self.parse(token);
                    self.handle_inbound(token);
                    if !self.stash.is_empty() || total >= READ_BUDGET {
                        self.mark_read_pending(token);
                        return;
                    }
                    if short && !hup {
                        // Drained: skip the read that would only say WouldBlock. Not after
                        // a hang-up event, whose EOF the next read must see.
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::info!("{}: read failed, closing connection: {e}", self.cfg.name);
                    self.close_conn(token, None);
                    return;
                }
            }
        }
    }

    fn mark_read_pending(&mut self, token: Token) {
        if let Some(c) = self.conns.get_mut(&token) {
            if !c.read_pending {
                c.read_pending = true;
                self.read_pending.push_back(token);
            }
        }
    }

    fn process_read_pending(&mut self) {
        for _ in 0..self.read_pending.len() {
            if !self.stash.is_empty() {
                return;
            }
            let Some(t) = self.read_pending.pop_front() else {
                return;
            };
            if let Some(c) = self.conns.get_mut(&t) {
                c.read_pending = false;
                self.read_conn(t, true);
            }
        }
    }

    /// Splits complete frames off the read buffer into `self.inbound`.
    fn parse(&mut self, token: Token) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        loop {
            // Until the handshake is done only handshake frames are legal: bound them by
            // the handshake's size, not by the (much larger) data frame limit.
            let max = if conn.established {
                self.max_len
            } else {
                2 + wire::MAX_HANDSHAKE_BODY
            };
            let len = match wire::peek_len(&conn.rbuf, max) {
                Ok(Some(len)) => len,
                Ok(None) => break,
                Err(e) => {
                    self.inbound.push(Inbound::Bad(e));
                    break;
                }
            };
            let total = wire::LEN_BYTES + len;
            if conn.rbuf.len() < total {
                break;
            }
            let kind = conn.rbuf[wire::LEN_BYTES];
            let flags = conn.rbuf[wire::LEN_BYTES + 1];
            let mut frame = conn.rbuf.split_to(total);
            if kind == wire::kind::DATA {
                if flags & !(wire::FLAG_OOB | wire::FLAG_RELIABLE) != 0 {
                    self.inbound.push(Inbound::Bad(wire::WireError::Malformed(
                        "unknown data flags",
                    )));
                    break;
                }
                frame.advance(wire::HEADER_BYTES);
                let seq = if flags & wire::FLAG_RELIABLE != 0 {
                    if frame.len() < 8 {
                        self.inbound
                            .push(Inbound::Bad(wire::WireError::Malformed("sequence number")));
                        break;
                    }
                    let s = frame.get_u64_le();
                    if s == 0 {
                        self.inbound.push(Inbound::Bad(wire::WireError::Malformed(
                            "sequence number 0",
                        )));
                        break;
                    }
                    Some(s)
                } else {
                    None
                };
                self.inbound.push(Inbound::Data {
                    flags,
                    seq,
                    payload: frame.freeze(),
                });
            } else {
                self.inbound.push(Inbound::Other(frame.freeze()));
            }
        }
    }

    /// Whether connection `token` is open, and if so whether it is established and for
    /// which peer.
    fn conn_state(&self, token: Token) -> Option<(bool, Option<usize>)> {
        self.conns.get(&token).map(|c| (c.established, c.peer))
    }

    fn handle_inbound(&mut self, token: Token) {
        let mut inbound = std::mem::take(&mut self.inbound);
        let mut peer_of_batch = None;
        // Looked up once, and again only after a frame that may change the connection.
        let mut state = self.conn_state(token);
        for item in inbound.drain(..) {
            let Some((established, peer)) = state else {
                break; // closed by an earlier frame
            };
            match item {
                Inbound::Data {
                    flags,
                    seq,
                    payload,
                } => match (established, peer) {
                    (true, Some(id)) => {
                        peer_of_batch = Some(id);
                        if !self.on_data(token, id, flags, seq, payload) {
                            state = None;
                        }
                    }
                    _ => {
                        self.protocol_error(token, "data before the handshake completed".into());
                        state = None;
                    }
                },
                Inbound::Other(bytes) => {
                    self.on_frame(token, &bytes);
                    state = self.conn_state(token);
                }
                Inbound::Bad(e) => {
                    self.protocol_error(token, e.to_string());
                    state = None;
                }
            }
        }
        self.inbound = inbound;
        if let Some(id) = peer_of_batch {
            self.push_batch(id);
            self.after_data(id);
        }
    }

    fn protocol_error(&mut self, token: Token, reason: String) {
        Counters::add(&self.counters.protocol_errors, 1);
        let who = self
            .conns
            .get(&token)
            .and_then(|c| c.peer)
            .map(|id| self.peer_name(id))
            .unwrap_or_else(|| "an unidentified peer".into());
        log::warn!(
            "{}: protocol error from {who}, closing connection: {reason}",
            self.cfg.name
        );
        self.close_conn(token, Some((CloseCode::Protocol, &reason)));
    }

    fn on_data(
        &mut self,
        token: Token,
        id: usize,
        flags: u8,
        seq: Option<u64>,
        payload: Bytes,
    ) -> bool {
        let Some(p) = self.peers.get_mut(&id) else {
            return true;
        };
        if let Some(seq) = seq {
            match p.desc.on_data(seq) {
                Ok(Receive::Deliver) => {}
                Ok(Receive::Duplicate) => {
                    Counters::add(&p.shared.counters.duplicates, 1);
                    // Still acked: the sender resent it because it lacks our ack.
                    p.ack_forced = true;
                    return true;
                }
                Err(e) => {
                    self.push_batch(id);
                    self.protocol_error(token, e.to_string());
                    return false;
                }
            }
        }
        if seq.is_none() {
            p.desc.on_unreliable(crate::flow::cost(payload.len()));
        }
        Counters::add(&p.shared.counters.received, 1);
        Counters::add(&p.shared.counters.received_bytes, payload.len() as u64);
        let oob = flags & wire::FLAG_OOB != 0;
        if oob {
            let d = Delivery::new(p.shared.name.clone(), payload, None, true);
            let sink = p.shared.oob_sink.clone();
            self.submit(Task::Oob(d, sink));
        } else {
            // Named by the deliverer, on the pool thread: cloning the sender's name here and
            // dropping it there would bounce its refcount between cores on every message.
            self.batch.push(Delivery::unnamed(payload, seq));
        }
        true
    }

    /// Hands the regular messages parsed this turn to the sender's queue.
    fn push_batch(&mut self, id: usize) {
        if self.batch.is_empty() {
            return;
        }
        let Some(p) = self.peers.get(&id) else {
            self.batch.clear();
            return;
        };
        let member = p.shared.member.clone();
        if member.push(self.batch.drain(..)) {
            self.submit(Task::Member(member));
        }
    }

    fn submit(&mut self, task: Task) {
        if !self.stash.is_empty() {
            self.stash.push_back(task);
            return;
        }
        if let Err(t) = self.pool.try_submit(task) {
            Counters::add(&self.counters.pool_stalls, 1);
            log::debug!("{}: delivery pool full; pausing reads", self.cfg.name);
            self.stash.push_back(t);
        }
    }

    fn unstash(&mut self) {
        while let Some(t) = self.stash.pop_front() {
            if let Err(t) = self.pool.try_submit(t) {
                self.stash.push_front(t);
                return;
            }
        }
    }

    /// After data from peer `id`: ack now if enough is owed, else make sure a delayed ack is
    /// armed.
    fn after_data(&mut self, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        p.attempt = 0; // the peer took the connection: backoff starts over
        let covered = p.ack_unwritten.unwrap_or(0).max(p.desc.acks_sent());
        if p.desc.received() - covered >= self.cfg.ack_threshold {
            self.send_ack(id);
        } else if (p.desc.ack_owed() || p.ack_forced) && !p.ack_timer {
            p.ack_timer = true;
            self.timers.add(
                Instant::now() + self.cfg.ack_delay,
                TimerKind::AckDelay { peer: id },
            );
        }
    }

    /// Writes an ack carrying the received count and all pending credit, if the peer has an
    /// established connection.
    fn send_ack(&mut self, id: usize) {
        self.write_ack(id, false);
    }

    /// Writes an ack (cumulative received count and cumulative credit) even when nothing new
    /// is owed if `force`: after a reconnect, in case the last one was lost with the old
    /// connection.
    fn write_ack(&mut self, id: usize, force: bool) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let Some(token) = p.conn else { return };
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if !conn.established {
            return;
        }
        let received = p.desc.received();
        let covered = p.ack_unwritten.unwrap_or(0).max(p.desc.acks_sent());
        let force = force || std::mem::take(&mut p.ack_forced);
        if p.shared.credit.pending() == 0 && received <= covered && !force {
            return;
        }
        let credit = p.shared.credit.take();
        let total = p.desc.return_credit(credit);
        wire::encode_ack(&mut conn.wbuf, received, total);
        p.ack_unwritten = Some(received);
        self.dirty.push(token);
    }

    fn on_frame(&mut self, token: Token, bytes: &Bytes) {
        let frame = match wire::decode(bytes, self.max_len) {
            Ok(Some((f, _))) => f,
            Ok(None) => return self.protocol_error(token, "truncated frame".into()),
            Err(e) => return self.protocol_error(token, e.to_string()),
        };
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if let Some(hs) = conn.hs.as_mut() {
            match hs.on_frame(&frame) {
                Ok(HsEvent::Identified {
                    peer,
                    peer_received,
                    peer_connections,
                    peer_unreliable,
                }) => {
                    let resume = peer_received.map(|r| (r, peer_unreliable.unwrap_or(0)));
                    self.on_identified(token, peer, resume, peer_connections)
                }
                Ok(HsEvent::Established {
                    peer_received,
                    peer_unreliable,
                }) => self.establish(token, peer_received, peer_unreliable),
                Err(e) => {
                    if e.by_peer && e.code == CloseCode::Duplicate {
                        // The peer kept the other of two simultaneous connections.
                        log::debug!("{}: {e}", self.cfg.name);
                        self.close_conn(token, None);
                    } else if e.by_peer {
                        log::warn!("{}: {e}", self.cfg.name);
                        self.count_refusal(e.code);
                        self.close_conn(token, None);
                    } else {
                        self.refuse(token, e.code, &e.reason);
                    }
                }
            }
            return;
        }
        let Some(id) = conn.peer else { return };
        match frame {
            Frame::Ack { received, credit } => self.on_ack(token, id, received, credit),
            Frame::Probe => {
                // Answer with every byte of credit we hold, even below half a window.
                if let Some(p) = self.peers.get(&id) {
                    p.shared.credit.request_flush();
                }
                self.send_ack(id);
            }
            Frame::Heartbeat => {}
            Frame::Close { code, reason } => {
                log::info!(
                    "{}: '{}' closed the connection ({code:?}): {reason}",
                    self.cfg.name,
                    self.peer_name(id)
                );
                self.close_conn(token, None);
            }
            Frame::Data { .. } => unreachable!("data frames take the fast path"),
            Frame::Hello(_) | Frame::HelloReply(..) | Frame::Ready { .. } => {
                self.protocol_error(token, "handshake frame after the handshake".into())
            }
        }
    }

    fn count_refusal(&self, code: CloseCode) {
        Counters::add(&self.counters.refused, 1);
        match code {
            CloseCode::Cluster => Counters::add(&self.counters.refused_cluster, 1),
            CloseCode::UnknownMember => Counters::add(&self.counters.refused_unknown, 1),
            CloseCode::Version => Counters::add(&self.counters.refused_version, 1),
            _ => {}
        }
    }

    fn refuse(&mut self, token: Token, code: CloseCode, reason: &str) {
        log::warn!(
            "{}: refusing connection ({code:?}): {reason}",
            self.cfg.name
        );
        self.count_refusal(code);
        self.close_conn(token, Some((code, reason)));
    }

    fn on_ack(&mut self, token: Token, id: usize, received: u64, credit: u64) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        p.attempt = 0; // the peer took the connection: backoff starts over
        if let Err(e) = p.desc.on_ack(received) {
            return self.protocol_error(token, e.to_string());
        }
        let credit = p.desc.on_credit(credit);
        if credit > 0 {
            // Never give back more than was taken: credit beyond what is outstanding (a
            // confused or malicious peer, or credit from before its restart) is clamped.
            let outstanding = p.ledger.uncredited();
            let c = p.ledger.credit(credit);
            if c < credit {
                log::warn!(
                    "{}: '{}' returned {credit} bytes of credit with only {outstanding} outstanding; clamped",
                    self.cfg.name,
                    p.shared.name,
                );
            }
            p.shared.outbox.give_back(Return::Credited, c);
        }
    }

    /// A connection said who it is. Decide whether it may speak for that peer.
    /// `resume`: for an accepted connection, the dialler's received counts (reliable
    /// messages, unreliable window bytes).
    fn on_identified(
        &mut self,
        token: Token,
        peer: PeerIdentity,
        resume: Option<(u64, u64)>,
        peer_connections: Option<u64>,
    ) {
        let accepting = resume.is_some();
        let id = if accepting {
            match self.by_name.get(peer.name.as_str()) {
                Some(&id) => id,
                None if self.cfg.allow_unknown && self.shutdown.is_none() => {
                    self.add_unknown(&peer.name)
                }
                None => {
                    let reason = format!("member '{}' is not configured here", peer.name);
                    return self.refuse(token, CloseCode::UnknownMember, &reason);
                }
            }
        } else {
            match self.conns.get(&token).and_then(|c| c.dialled) {
                Some(id) => id,
                None => return,
            }
        };
        let Some(p) = self.peers.get(&id) else {
            return self.refuse(token, CloseCode::Removed, "member removed");
        };
        if p.state == PeerState::Closed || self.shutdown.is_some() {
            return self.refuse(token, CloseCode::Shutdown, "member closed");
        }
        // Tie-break against the connection that speaks for this peer now, if another.
        if let Some(other) = p.conn.filter(|&o| o != token) {
            if let Some(oc) = self.conns.get(&other) {
                let stale = matches!(oc.launch, Some(l) if l != peer.launch_id);
                let keep_new = keep_new(TieBreak {
                    stale,
                    new_by_us: !accepting,
                    old_by_us: oc.dialled.is_some(),
                    old_established: oc.established,
                    we_are_smaller: *self.cfg.name < *peer.name,
                    our_connections: p.desc.connections_with(peer.launch_id),
                    peer_connections,
                });
                Counters::add(&self.counters.tie_breaks, 1);
                if keep_new {
                    log::debug!(
                        "{}: '{}' connected again; replacing the older connection",
                        self.cfg.name,
                        peer.name
                    );
                    self.close_conn(
                        other,
                        Some((CloseCode::Duplicate, "replaced by a newer connection")),
                    );
                } else {
                    log::debug!(
                        "{}: simultaneous connect with '{}'; keeping ours",
                        self.cfg.name,
                        peer.name
                    );
                    return self.close_conn(
                        token,
                        Some((
                            CloseCode::Duplicate,
                            "simultaneous connect lost the tie-break",
                        )),
                    );
                }
            }
        }
        self.bind_incarnation(id, &peer);
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let received = p.desc.received();
        let connections = p.desc.connections();
        let unreliable = p.desc.unreliable_received();
        p.conn = Some(token);
        if p.state != PeerState::Handshaking {
            p.set_state(PeerState::Handshaking);
        }
        let conn = self.conns.get_mut(&token).expect("conn present");
        conn.peer = Some(id);
        conn.launch = Some(peer.launch_id);
        let hs = conn.hs.as_mut().expect("handshaking");
        hs.accept(received, connections, unreliable, &mut conn.wbuf);
        self.dirty.push(token);
        if let Some((peer_received, peer_unreliable)) = resume {
            self.establish(token, peer_received, peer_unreliable);
        }
    }

    /// Binds the peer's recovery descriptor to the incarnation that just identified; a
    /// changed launch id retires the old one (its unacked messages are undelivered).
    fn bind_incarnation(&mut self, id: usize, peer: &PeerIdentity) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        p.shared.credit.set_window(peer.window);
        p.peer_max_message = peer.max_message as usize;
        let restarted = matches!(p.desc.remote_launch(), Some(l) if l != peer.launch_id);
        let old = p.desc.bind(peer.launch_id);
        if !restarted {
            return;
        }
        log::warn!(
            "{}: '{}' restarted (new launch id); {} unacknowledged messages to its old incarnation are undelivered",
            self.cfg.name,
            peer.name,
            old.len()
        );
        // Credit for the old incarnation will never come: give it all back, and drop any
        // credit we still owed the old incarnation.
        p.shared
            .outbox
            .give_back(Return::Retired, p.ledger.retire());
        let _ = p.shared.credit.take();
        Counters::add(&p.shared.counters.undelivered, old.len() as u64);
        self.report_undelivered(&peer.name, old);
    }

    /// Hands messages that will never be delivered to the application's hook, if any. The
    /// hook runs on the IO thread: a panic in it is caught and logged, never fatal.
    fn report_undelivered(&self, peer: &str, msgs: Vec<crate::proto::Unacked>) {
        if msgs.is_empty() {
            return;
        }
        if let Some(hook) = &self.undelivered {
            if catch_unwind(AssertUnwindSafe(|| hook(peer, msgs))).is_err() {
                log::error!(
                    "{}: the on_undelivered hook panicked; continuing",
                    self.cfg.name
                );
            }
        }
    }

    /// Retires everything of the current relationship with peer `id` (unacked messages are
    /// undelivered, their credit given back) while keeping what is queued.
    fn forget_relationship(&mut self, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let old = p.desc.reset();
        p.shared
            .outbox
            .give_back(Return::Retired, p.ledger.retire());
        let _ = p.shared.credit.take();
        Counters::add(&p.shared.counters.undelivered, old.len() as u64);
        let name = p.shared.name.clone();
        self.report_undelivered(&name, old);
    }

    /// The handshake completed on `token`: resend what the peer lacks, then new messages.
    fn establish(&mut self, token: Token, peer_received: u64, peer_unreliable: u64) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let Some(id) = conn.peer else { return };
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if p.conn != Some(token) {
            return self.close_conn(token, Some((CloseCode::Duplicate, "superseded")));
        }
        conn.hs = None;
        conn.established = true;
        self.update_gauges();
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let mut resent = 0u64;
        let resumed = match p.desc.resume(peer_received) {
            Ok(rest) => {
                for u in rest {
                    wire::encode_data(&mut conn.wbuf, u.flags, Some(u.seq), &u.payload);
                    resent += 1;
                }
                Ok(())
            }
            Err(e) => Err(e),
        };
        match resumed {
            Ok(()) => {}
            Err(RecoveryError::AckWentBack { claimed, acked }) => {
                // Same incarnation, fewer messages than it acknowledged: the peer forgot us
                // (removed and added us again). Start afresh on both sides: we retire our
                // state now, the peer's is already fresh; the redial then resumes from zero.
                let why = format!(
                    "'{}' holds {claimed} of our messages after acknowledging {acked}: it lost its state for us (removed and re-added?); starting afresh",
                    self.peer_name(id)
                );
                log::warn!("{}: {why}", self.cfg.name);
                self.forget_relationship(id);
                return self.close_conn(token, Some((CloseCode::Other, "state reset")));
            }
            Err(e) => return self.protocol_error(token, e.to_string()),
        }
        let p = self.peers.get_mut(&id).expect("peer present");
        // Unreliable messages the old connection swallowed are never resent: their permits
        // come back now, from the peer's count of what it received.
        let lost = p.desc.unreliable_lost(peer_unreliable);
        if lost > 0 {
            p.ledger.forget(lost);
            p.shared.outbox.give_back(Return::Lost, lost);
        }
        Counters::add(&p.shared.counters.resent, resent);
        Counters::add(&p.shared.counters.connects, 1);
        Counters::add(&self.counters.handshakes, 1);
        // The backoff restarts only once the peer shows it took the connection (its first
        // ack or message), so a peer that refuses right after the handshake is not redialled
        // at the minimum backoff forever.
        p.gen += 1; // cancels a pending reconnect
        p.set_state(PeerState::Connected);
        log::info!(
            "{}: connected to '{}' ({} resent, {} unacked)",
            self.cfg.name,
            p.shared.name,
            resent,
            p.desc.unacked_len()
        );
        self.dirty.push(token);
        // Credit and acks from before the reconnect go first (the last ack may have been lost
        // with the old connection; totals make resending it harmless).
        if p.shared.credit.pending() > 0 || p.desc.ack_owed() || p.desc.credit_returned() > 0 {
            self.write_ack(id, true);
        }
        self.flush_peer(id);
    }

    /// Publishes queued messages of peer `id` to its connection while its write buffer is
    /// below the high-water mark. This is where a message gets its sequence number, enters
    /// the unacked queue and counts as sent — or is filtered, expires, or fails, giving its
    /// permits back.
    fn flush_peer(&mut self, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let Some(token) = p.conn else { return };
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if !conn.established {
            return;
        }
        let high = self.cfg.write_high_water;
        let filter = self.cfg.outbound_filter.as_deref();
        let shared = &p.shared;
        let info = PeerInfo::new(&shared.name, p.desc.remote_launch(), p.state);
        let mut now: Option<Instant> = None;
        let mut tally = Tally::default();
        'outer: loop {
            if p.pending.is_empty() {
                // Clear before taking: a send that pushes after this reschedules the peer.
                shared.scheduled.store(false, Ordering::Release);
                shared.outbox.take_into(&mut p.pending);
            }
            if p.pending.is_empty() {
                break;
            }
            while let Some(m) = p.pending.pop_front() {
                if conn.unwritten() >= high {
                    p.pending.push_front(m);
                    // The socket is backed up: the writable event resumes this peer. Stay
                    // marked scheduled so that senders do not wake the IO thread for
                    // nothing on every message meanwhile.
                    shared.scheduled.store(true, Ordering::Release);
                    break 'outer;
                }
                let len = m.payload.len();
                if let Some(deadline) = m.deadline {
                    if *now.get_or_insert_with(Instant::now) >= deadline {
                        shared.outbox.give_back(Return::Expired, m.cost());
                        tally.expired += 1;
                        tally.failed += 1;
                        tally.failed_bytes += len as u64;
                        continue;
                    }
                }
                if len > p.peer_max_message {
                    shared.outbox.give_back(Return::Failed, m.cost());
                    tally.failed += 1;
                    tally.failed_bytes += len as u64;
                    tally.too_large += 1;
                    continue;
                }
                if let Some(f) = filter {
                    let keep =
                        catch_unwind(AssertUnwindSafe(|| f(&info, &m))).unwrap_or_else(|_| {
                            log::error!(
                                "outbound filter panicked; dropping the message to '{}'",
                                shared.name
                            );
                            false
                        });
                    if !keep {
                        shared.outbox.give_back(Return::Filtered, m.cost());
                        tally.filtered += 1;
                        tally.filtered_bytes += len as u64;
                        continue;
                    }
                }
                let c = m.cost();
                if m.is_reliable() {
                    let u = p.desc.publish(m.flags, m.payload);
                    wire::encode_data(&mut conn.wbuf, u.flags, Some(u.seq), &u.payload);
                } else {
                    p.desc.publish_unreliable(c);
                    wire::encode_data(&mut conn.wbuf, m.flags, None, &m.payload);
                }
                p.ledger.publish(c);
                tally.sent += 1;
                tally.sent_bytes += len as u64;
            }
        }
        let c = &shared.counters;
        if tally.sent > 0 {
            Counters::add(&c.sent, tally.sent);
            Counters::add(&c.sent_bytes, tally.sent_bytes);
            self.dirty.push(token);
        }
        if tally.filtered > 0 {
            Counters::add(&c.filtered, tally.filtered);
            Counters::add(&c.filtered_bytes, tally.filtered_bytes);
        }
        if tally.failed > 0 {
            Counters::add(&c.failed, tally.failed);
            Counters::add(&c.failed_bytes, tally.failed_bytes);
            Counters::add(&c.expired, tally.expired);
        }
        if tally.too_large > 0 {
            log::warn!(
                "{}: {} messages failed: larger than the {} bytes '{}' accepts",
                self.cfg.name,
                tally.too_large,
                p.peer_max_message,
                shared.name
            );
        }
    }

    /// Fails the expired messages queued for a peer that is not connected (for a connected
    /// peer, expiry is checked at publish time).
    fn expire_queued(&mut self, id: usize, now: Instant) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        p.shared.outbox.take_into(&mut p.pending);
        let before = p.pending.len();
        let shared = &p.shared;
        let (mut n, mut bytes) = (0u64, 0u64);
        p.pending.retain(|m| match m.deadline {
            Some(d) if now >= d => {
                shared.outbox.give_back(Return::Expired, m.cost());
                n += 1;
                bytes += m.payload.len() as u64;
                false
            }
            _ => true,
        });
        debug_assert_eq!(before - p.pending.len(), n as usize);
        if n > 0 {
            Counters::add(&shared.counters.expired, n);
            Counters::add(&shared.counters.failed, n);
            Counters::add(&shared.counters.failed_bytes, bytes);
            log::debug!(
                "{}: {n} messages to '{}' expired while queued",
                self.cfg.name,
                shared.name
            );
        }
    }

    /// Periodic work: credit probes for blocked senders, a warning per long block, residual
    /// credit once a sender's queue is idle, expiry of queued messages.
    fn tick(&mut self) {
        let now = Instant::now();
        let ids: Vec<usize> = self.peers.keys().copied().collect();
        for id in ids {
            let Some(p) = self.peers.get_mut(&id) else {
                continue;
            };
            let established = p
                .conn
                .and_then(|t| self.conns.get(&t))
                .is_some_and(|c| c.established);
            let window = p.shared.outbox.window();
            if let Some((since, episode)) = window.blocked_since() {
                let blocked = now.saturating_duration_since(since);
                let probe_due = p
                    .last_probe
                    .is_none_or(|t| now.saturating_duration_since(t) >= self.cfg.probe_interval);
                if established && blocked >= self.cfg.probe_interval && probe_due {
                    p.last_probe = Some(now);
                    Counters::add(&p.shared.counters.probes, 1);
                    if let Some(conn) = p.conn.and_then(|t| self.conns.get_mut(&t)) {
                        wire::encode_probe(&mut conn.wbuf);
                        self.dirty.push(conn.token);
                    }
                }
                if blocked >= self.cfg.block_warning && p.warned_episode != episode {
                    p.warned_episode = episode;
                    log::warn!(
                        "{}: senders to '{}' blocked for {:.1?}: window {} bytes, {} in flight ({} unacknowledged messages), peer {}",
                        self.cfg.name,
                        p.shared.name,
                        blocked,
                        window.capacity(),
                        window.in_flight(),
                        p.desc.unacked_len(),
                        p.state
                    );
                }
            }
            let residual = self.cfg.credit_on_idle
                && established
                && p.shared.credit.pending() > 0
                && !p.shared.member.is_running();
            if residual {
                self.send_ack(id);
            } else if !established && p.shared.ttl_queued() {
                self.expire_queued(id, now);
            }
        }
        self.check_liveness(now);
        self.timers.add(now + self.cfg.tick, TimerKind::Tick);
    }

    /// Heartbeats on quiet established connections (any traffic suppresses them), and
    /// failure detection: a connection silent for `idle_timeout` is closed, and its peer
    /// redialled with backoff.
    fn check_liveness(&mut self, now: Instant) {
        let mut silent = Vec::new();
        for conn in self.conns.values_mut() {
            if !conn.established {
                continue;
            }
            if now.saturating_duration_since(conn.last_read) >= self.cfg.idle_timeout {
                silent.push(conn.token);
            } else if now.saturating_duration_since(conn.last_write) >= self.cfg.heartbeat {
                wire::encode_heartbeat(&mut conn.wbuf);
                self.dirty.push(conn.token);
            }
        }
        for token in silent {
            Counters::add(&self.counters.idle_timeouts, 1);
            let who = self
                .conns
                .get(&token)
                .and_then(|c| c.peer)
                .map(|id| self.peer_name(id));
            log::warn!(
                "{}: connection to '{}' silent for {:?}; closing it",
                self.cfg.name,
                who.as_deref().unwrap_or("?"),
                self.cfg.idle_timeout
            );
            self.close_conn(token, Some((CloseCode::Other, "idle timeout")));
        }
    }

    /// Closes a connection (after writing `close` best-effort) and, if it spoke for a peer,
    /// moves the peer to `Backoff` and schedules a reconnect.
    fn close_conn(&mut self, token: Token, close: Option<(CloseCode, &str)>) {
        let Some(mut conn) = self.conns.remove(&token) else {
            return;
        };
        if let Some((code, reason)) = close {
            wire::encode_close(&mut conn.wbuf, code, reason);
            let _ = conn.flush(); // best effort: the socket is closed right after
        }
        let _ = self.poll.registry().deregister(&mut conn.stream);
        self.update_gauges();
        self.timers.cancel(|k| *k == TimerKind::Handshake { token });
        let Some(id) = conn.peer else { return };
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if p.conn != Some(token) {
            return;
        }
        p.conn = None;
        p.ack_unwritten = None; // lost with the connection: owed again
        if conn.established {
            Counters::add(&p.shared.counters.disconnects, 1);
            log::info!("{}: connection to '{}' lost", self.cfg.name, p.shared.name);
        }
        if p.state != PeerState::Closed {
            self.schedule_reconnect(id);
        }
    }

    fn add_unknown(&mut self, name: &str) -> usize {
        let name: SharedStr = name.into();
        let shared = self.shared.new_peer(name.clone(), self.cfg.window);
        let id = shared.id;
        self.peers_map.write().insert(name.clone(), shared.clone());
        log::info!("{}: admitting unknown member '{name}'", self.cfg.name);
        self.command(Command::AddPeer {
            peer: shared,
            addr: None,
        });
        id
    }

    /// Closes peer `id` for good: fails what is queued (giving back its permits), closes
    /// its window and connection. A reconnect timer still pending finds no peer and does
    /// nothing; a connection completing later finds no peer and is refused.
    fn remove_peer(&mut self, id: usize) {
        let Some(conn) = self.peers.get(&id).and_then(|p| p.conn) else {
            self.retire_peer(id, CloseCode::Removed);
            return;
        };
        self.retire_peer(id, CloseCode::Removed);
        self.close_conn(conn, Some((CloseCode::Removed, "member removed")));
    }

    /// Terminal transition of a peer: `Closed`, outbox closed and failed, permits back.
    fn retire_peer(&mut self, id: usize, why: CloseCode) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        p.set_state(PeerState::Closed);
        p.gen += 1;
        let failed = fail_queued(p);
        let unacked = p.desc.drain_unacked();
        p.shared
            .outbox
            .give_back(Return::Retired, p.ledger.retire());
        p.shared.outbox.window().close();
        let undelivered = unacked.len() as u64;
        Counters::add(&p.shared.counters.undelivered, undelivered);
        if failed + undelivered > 0 {
            log::warn!(
                "{}: '{}' closed ({why:?}): {failed} queued messages failed, {undelivered} sent but unacknowledged",
                self.cfg.name,
                p.shared.name
            );
        }
        let name = p.shared.name.clone();
        if why == CloseCode::Removed {
            self.timers.cancel(|k| match k {
                TimerKind::Reconnect { peer, .. } | TimerKind::AckDelay { peer } => *peer == id,
                _ => false,
            });
            self.peers.remove(&id);
            if self.by_name.get(&name) == Some(&id) {
                self.by_name.remove(&name);
            }
        }
        self.report_undelivered(&name, unacked);
    }

    // ----- timers ------------------------------------------------------------------------

    fn fire_timers(&mut self) {
        let now = Instant::now();
        while let Some(t) = self.timers.pop_due(now) {
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
                    if self.conns.get(&token).is_some_and(|c| !c.established) {
                        Counters::add(&self.counters.handshake_timeouts, 1);
                        log::warn!("{}: handshake timed out; closing connection", self.cfg.name);
                        self.close_conn(token, None);
                    }
                }
                TimerKind::AckDelay { peer } => {
                    if let Some(p) = self.peers.get_mut(&peer) {
                        p.ack_timer = false;
                    }
                    self.send_ack(peer);
                }
                TimerKind::Tick => self.tick(),
                TimerKind::Deadline => {}
            }
        }
    }

    // ----- shutdown ----------------------------------------------------------------------

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
            if p.conn
                .is_some_and(|t| self.conns.get(&t).is_some_and(|c| c.established))
            {
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
