//! The IO thread: drives the node's protocol ([`Endpoint`]) with sockets.
//!
//! It owns the mio `Poll`, the listener and one socket per link, and does only what needs
//! them: accepting and dialling connections, reading into links' read buffers and writing
//! from their write buffers (draining readiness until `WouldBlock`, bounded per connection
//! per turn for fairness), waking for the endpoint's timers, handing the requests of other
//! threads (commands, peers with new messages, credit to return) to the endpoint, and doing
//! what its events ask (open a connection, close one, submit pool tasks, report undelivered
//! messages). Every decision about what the bytes mean is the endpoint's. It never blocks
//! but in its poll.
//!
//! Its state ([`IoCore`]: everything but the poll) lives in a [`Parking`]: the loop holds
//! it while it turns and lets it go while it blocks in its poll, when a requester that
//! rings finds it parked may take it for one turn of its own ([`IoCore::drive`], through
//! the [`Doorbell`]): the requester's messages are then written on its own thread.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};

use super::conn::{self, Conn, Transport};
use super::idle::{Spin, SpinChange};
use super::socket::{Listener, Stream};
use super::{
    Command, Completion, IoConfig, IoParts, IoShared, PeerMap, UndeliveredHook, FIRST_CONN,
    LISTENER, MEMBERS, WAKER,
};
use crate::addr::Addr;
use crate::deliver::{Pool, ReadBuffers, Task};
use crate::events::{DisconnectReason as Why, Event as Public, EventQueue, Pushed};
use crate::handoff::{Parking, Wake};
use crate::journal::{JournalWriter, WriterMarks};
use crate::proto::{
    Endpoint, Input, LinkId, NodeCounters, Output, StoppedJournal, Target, Verdict,
};
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{Arc, Weak};
use crate::util::IdHash;
use crate::wire::{self, Nonce};

/// Bytes read from one connection per loop turn before others get their turn.
const READ_BUDGET: usize = 512 * 1024;

/// Membership packets read per loop turn at most.
const DATAGRAM_BUDGET: usize = 256;
/// The largest membership packet read (a longer one is cut, and fails its decoding).
const MAX_DATAGRAM: usize = crate::membership::codec::MAX_PACKET + 1;

/// Connections accepted per loop turn at most: the rest wait in the kernel's accept queue
/// for the next turn, so a connect storm cannot keep the loop from the connections it
/// already holds.
const ACCEPT_BUDGET: usize = 256;

/// The IO thread: its poll, and its state ([`IoCore`]), which its loop holds but for the
/// time it blocks in the poll.
pub(crate) struct IoThread {
    poll: Poll,
    state: IoCore,
    /// Where the loop keeps `state` once it runs.
    core: Arc<CoreSlot>,
}

/// Where the IO thread's state lives: in the IO thread's hands while its loop turns, free
/// while it blocks in its poll, when a requester may take it for a turn of its own
/// ([`Doorbell`]); empty before the thread starts and once it has stopped.
pub(crate) type CoreSlot = Parking<IoCore>;

/// A send that finds the IO thread parked drives its turn only this long after a turn
/// that published: what comes faster is a stream, which the IO thread, woken, takes in
/// batches (a driven turn writes what it publishes at once, one write per turn).
const DRIVE_GAP: Duration = Duration::from_micros(20);

/// Everything the IO thread works with but its poll: the protocol, the sockets (registered
/// through `registry`, a handle on the poll's), the hand-over to other threads.
pub(crate) struct IoCore {
    cfg: IoConfig,
    registry: mio::Registry,
    listener: Listener,
    /// The membership socket (membership only).
    udp: Option<mio::net::UdpSocket>,
    shared: Arc<IoShared>,
    peers_map: PeerMap,
    pool: Arc<Pool>,
    counters: Arc<NodeCounters>,
    undelivered: Option<UndeliveredHook>,
    /// The application's membership events (`Builder::on_event`), delivered on the pool.
    events: Option<Arc<EventQueue>>,
    stopped: Arc<AtomicBool>,
    endpoint: Endpoint,
    /// The journal's writer thread (journalling nodes), and its marks as last seen.
    writer: Option<JournalWriter>,
    marks: WriterMarks,
    /// `Node::sync_journal` calls handed to the endpoint, waiting for the batch to sync
    /// ([`Output::JournalSync`], in the same order).
    sync_asked: VecDeque<Arc<Completion>>,
    /// `Node::sync_journal` calls waiting for the writer to sync up to a batch.
    syncs: Vec<(u64, Arc<Completion>)>,
    conns: HashMap<LinkId, Conn, IdHash>,
    next_token: usize,
    /// Connections with unread input left over (budget reached).
    read_pending: VecDeque<LinkId>,
    /// The listener reported connections and not all were accepted yet.
    accept_pending: bool,
    /// Ciphertext read from a TLS connection before rustls decrypts it (shared by all
    /// connections; stays empty without TLS).
    scratch: Vec<u8>,
    /// The endpoint's read buffers given back by delivered runs, where reads find room.
    read_buffers: Arc<ReadBuffers>,
    /// Periodic work and when it is due next.
    periodic: Option<(super::Periodic, Instant)>,
    /// When the IO thread's poll, if it blocks, returns by itself (`None`: only for an
    /// event or a wake-up); a driven turn that wants it back sooner wakes it.
    parked_until: Option<Instant>,
    /// Whether requesters may drive turns: not with an outbound filter (the application's
    /// code runs on the IO thread, never inside one of its own sends).
    drivable: bool,
    /// When a turn last published (took scheduled peers), driven or not.
    published_at: Option<Instant>,
    /// Inside a driven turn.
    driving: bool,
    /// What a driven turn leaves to the IO thread's next turn, in order: what runs or
    /// drops the application's code (undelivered messages: the hook, or the payloads'
    /// drops; events and pool tasks: the callbacks and the inbox's waker), and changes to
    /// the node's peer map (whose lock a sending thread may hold as it rings). Never run
    /// inside the send that drove the turn: the sending thread may hold the application's
    /// locks, or the map's.
    later: Vec<Output>,
    /// A driven turn panicked: the IO thread stops with it, as if the turn had been its own.
    failed: Option<Box<dyn std::any::Any + Send>>,
}

/// The IO thread's waker ([`Wake`]): its mio `Waker`, and its state for a requester that
/// finds it parked ([`IoCore::drive`]).
pub(crate) struct Doorbell {
    waker: mio::Waker,
    /// Weak: the IO thread owns its state; the doorbell lives in the hand-off, which the
    /// state points to.
    core: Weak<CoreSlot>,
}

impl Doorbell {
    pub(crate) fn new(waker: mio::Waker, core: Weak<CoreSlot>) -> Doorbell {
        Doorbell { waker, core }
    }
}

impl Wake for Doorbell {
    fn wake(&self) -> io::Result<()> {
        self.waker.wake()
    }

    fn drive(&self) -> bool {
        // Never waits: a state in other hands (the IO thread's, back from its poll, or
        // another requester's turn) means the doorbell wakes the IO thread instead.
        let Some(wake) = self
            .core
            .upgrade()
            .and_then(|core| core.drive(IoCore::drive))
            .flatten()
        else {
            return false;
        };
        // Once the state is let go: the IO thread, woken, takes it at once.
        if wake {
            if let Err(e) = self.waker.wake() {
                log::error!("cannot wake the IO thread: {e}");
            }
        }
        true
    }
}

/// Whether a driven turn leaves `out` to the IO thread ([`IoCore::later`]): what runs or
/// drops the application's code, and what changes the node's peer map.
fn left_to_the_io_thread(out: &Output) -> bool {
    matches!(
        out,
        Output::Undelivered { .. }
            | Output::Event(_)
            | Output::Task(_)
            | Output::Admitted(_)
            | Output::Forget(_)
    )
}

fn link(token: Token) -> LinkId {
    LinkId(token.0)
}

impl IoThread {
    pub(crate) fn new(parts: IoParts) -> std::io::Result<IoThread> {
        // First: what can fail here must not leave a journal writer running.
        let registry = parts.poll.registry().try_clone()?;
        let (shared, window) = (parts.shared.clone(), parts.config.proto.window);
        let new_peer: crate::proto::NewPeer = Box::new(move |name| shared.new_peer(name, window));
        let (writer, journal) = match parts.journal {
            Some((journal, recovered)) => {
                let policy = journal.fsync_policy();
                let io = parts.shared.clone();
                let name = &parts.config.proto.name;
                let writer = JournalWriter::start(name, journal, Box::new(move || io.wake()))?;
                (Some(writer), Some((policy, recovered)))
            }
            None => (None, None),
        };
        // Set before the thread runs, so the node's first stats tell its strategy.
        parts
            .shared
            .spin
            .start(!parts.config.idle.spin().0.is_zero());
        let now = parts.shared.clock.now();
        let endpoint = Endpoint::new(
            parts.config.proto.clone(),
            parts.counters.clone(),
            journal,
            new_peer,
            now,
        );
        let read_buffers = Arc::clone(endpoint.read_buffers());
        let drivable = parts.config.proto.outbound_filter.is_none();
        let core = IoCore {
            cfg: parts.config,
            registry,
            listener: parts.listener,
            udp: parts.udp,
            shared: parts.shared,
            peers_map: parts.peers,
            pool: parts.pool,
            counters: parts.counters,
            undelivered: parts.undelivered,
            events: parts.events,
            stopped: parts.stopped,
            endpoint,
            writer,
            marks: WriterMarks::default(),
            sync_asked: VecDeque::new(),
            syncs: Vec::new(),
            conns: HashMap::default(),
            next_token: FIRST_CONN,
            read_pending: VecDeque::new(),
            accept_pending: false,
            scratch: Vec::new(),
            read_buffers,
            periodic: parts.periodic.map(|p| {
                let first = now + p.every;
                (p, first)
            }),
            parked_until: None,
            drivable,
            published_at: None,
            driving: false,
            later: Vec::new(),
            failed: None,
        };
        Ok(IoThread {
            poll: parts.poll,
            state: core,
            core: parts.core,
        })
    }

    /// Runs the loop until shutdown completes. The loop holds the IO thread's state but
    /// while it blocks in its poll; then a requester may drive a turn with it
    /// ([`IoCore::drive`]), and the loop takes it back as its poll returns.
    pub(crate) fn run(self) {
        let IoThread {
            mut poll,
            state,
            core,
        } = self;
        let mut events = Events::with_capacity(1024);
        let mut held = core.hold(state);
        let Some(state) = held.state() else {
            return;
        };
        // The configured peers first (their journalled streams are restored as they are
        // added), then a word about journalled streams no configured peer claimed.
        let shared = Arc::clone(&state.shared);
        state.handle_requests(shared.clock.now());
        state.endpoint.warn_unclaimed();
        state.drain(shared.clock.now());
        let (spin_for, adaptive) = state.cfg.idle.spin();
        let mut spin = Spin::new(spin_for, adaptive, shared.clock.now());
        loop {
            let Some(state) = held.state() else {
                return;
            };
            let now = shared.clock.now();
            if let Some(change) = spin.account(now) {
                state.spin_changed(change);
            }
            // Don't sleep with work in hand: unread input, bytes to write, connections to
            // accept.
            let busy = state.busy();
            let (timeout, until) = if busy || spin.keep(now, &shared.handoff) {
                (Some(Duration::ZERO), None)
            } else {
                let until = state.wake_at();
                (until.map(|at| at.saturating_duration_since(now)), until)
            };
            let polled = if timeout == Some(Duration::ZERO) {
                poll.poll(&mut events, timeout)
            } else {
                // Parked: the state is free for a requester's turn until the poll returns.
                state.parked_until = until;
                held.park(&shared.handoff, || poll.poll(&mut events, timeout))
            };
            let Some(state) = held.state() else {
                return;
            };
            state.run_later(shared.clock.now());
            if let Some(panic) = state.failed.take() {
                // A driven turn panicked with the state in its hands: stop as if the turn
                // had been ours (the node's guard closes what a panicking IO thread leaves).
                std::panic::resume_unwind(panic);
            }
            if let Err(e) = polled {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                log::error!("IO thread: poll failed, stopping: {e}");
                break;
            }
            let idle_spin = spin.is_spinning() && events.is_empty() && !busy;
            // What the loop knows of its sockets is as of now: bytes that arrive later in
            // this turn are seen at the next poll, however long the turn takes (a
            // descheduled IO thread, a slow callback). Timeouts are judged as of this instant.
            let polled_at = shared.clock.now();
            spin.waited(polled_at.saturating_duration_since(now));
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => state.accept_pending = true,
                    WAKER => {}
                    MEMBERS => state.read_datagrams(polled_at),
                    t => {
                        let hup = ev.is_read_closed() || ev.is_error();
                        let readable = ev.is_readable() || hup;
                        let writable = ev.is_writable() || ev.is_error();
                        state.conn_event(link(t), readable, hup, writable);
                    }
                }
            }
            let now = shared.clock.now();
            if state.accept_pending {
                state.accept_all(now);
            }
            let woken = shared.take_wake();
            // The journal writer's marks, at every turn, woken or not (three loads): a
            // driven turn that took the writer's wake-up has read them too, and this turn
            // reads whatever came since.
            state.journal_progress(now);
            if woken {
                state.handle_requests(now);
            }
            let worked = !events.is_empty() || woken;
            if !worked && idle_spin {
                // Nothing came in: give the core to whoever may be about to send to us.
                // The real clock: how long the yield took, for the spin's accounting.
                let before = Instant::now();
                std::thread::yield_now();
                if let Some(change) = spin.yielded(before.elapsed()) {
                    state.spin_changed(change);
                }
            }
            state.process_read_pending();
            state.endpoint.handle(polled_at, Input::Timeout);
            shared.clock.judged(polled_at);
            state.drain(now);
            // A turn that left the node quiet (its housekeeping put off: it read a heartbeat,
            // a probe or an ack on a quiet link, a membership packet, or was woken for
            // nothing) starts no spin, as a turn woken by a timer alone: nothing is coming
            // that a spin would catch.
            if worked && !state.endpoint.tick_put_off() {
                spin.active(now);
            }
            state.run_periodic(polled_at);
            if state.endpoint.shutdown_done(shared.clock.now()) {
                break;
            }
        }
        // Taken out: a requester that finds the slot empty wakes a thread that has gone,
        // which is harmless, and never drives a turn of a stopped node.
        if let Some(mut state) = held.take() {
            state.finish();
        }
    }
}

impl IoCore {
    /// Unread input or connections to accept: the loop must not block.
    fn busy(&self) -> bool {
        !self.read_pending.is_empty() || self.accept_pending
    }

    /// When the loop's poll must return by itself: the endpoint's next timer, or the
    /// periodic work's.
    fn wake_at(&self) -> Option<Instant> {
        let due = self.periodic.as_ref().map(|p| p.1);
        match (self.endpoint.poll_timeout(), due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ---- driven turns --------------------------------------------------------------

    /// A turn of the IO thread run by a requester (a sending thread, a pool thread whose
    /// handler replies or whose deliveries return credit) that rang while the IO thread was
    /// parked: it takes the wake-up and the lists of scheduled peers and credit to return,
    /// publishes, and does what the endpoint asks (its writes leave on this thread). A
    /// message then leaves on the thread that sent it, with no hand-off to the IO thread:
    /// the sending half of a request/reply crosses one thread hop less on each node. Runs
    /// only while the IO thread blocks in its poll ([`Parking::drive`]), on a node without
    /// outbound filter, never for a command (`Handoff::ring_undriven`: a caller
    /// may wait for what only the IO thread's turn completes, such as `remove_peer`'s
    /// report) nor under the peer map's lock (`handoff::undriven`), and not within
    /// [`DRIVE_GAP`] of a turn that published (what comes faster is a stream: the IO
    /// thread, woken, takes it in batches). It leaves to the IO thread the commands it
    /// finds, reading, accepting and the timers, and what [`later`](IoCore::later) holds.
    /// With a journal, the batch the turn cuts is appended on this thread where
    /// [`JournalWriter::submit`] takes it inline (one small write into the page cache),
    /// and its bytes leave at once; else it goes to the writer, whose marks wake the IO
    /// thread (`ring_io`), which writes what they release.
    /// Returns `None` where it declined, else whether the IO thread must be woken once the
    /// state is let go: for what the turn left it (commands, input, connections, outputs
    /// held for later, a timer earlier than the one its poll waits for: a quiet node's
    /// put-off tick, brought back by the send), or to spin for the answers to what the turn
    /// wrote (while its idle strategy spins after work).
    fn drive(&mut self) -> Option<bool> {
        if !self.drivable || self.failed.is_some() {
            return None;
        }
        let now = self.shared.clock.now();
        if self
            .published_at
            .is_some_and(|at| now.saturating_duration_since(at) < DRIVE_GAP)
        {
            return None;
        }
        self.driving = true;
        let turn = catch_unwind(AssertUnwindSafe(|| {
            // Our own pending wake-up, at least: see `Handoff::ring`. It may be the journal
            // writer's too (`ring_io` leaves one pending and wakes the IO thread): its marks
            // are read now, so what they release leaves with this turn.
            self.shared.take_wake();
            self.journal_progress(now);
            self.take_lists(now);
            self.drain(now);
        }));
        self.driving = false;
        self.shared.spin.driven();
        let wake = match turn {
            Ok(()) => {
                !self.shared.commands.is_empty()
                    || self.busy()
                    || !self.later.is_empty()
                    || self.shared.spin.is_on()
                    || match (self.wake_at(), self.parked_until) {
                        (Some(want), Some(until)) => want < until,
                        (Some(_), None) => true,
                        (None, _) => false,
                    }
            }
            Err(panic) => {
                log::error!(
                    "{}: the IO thread's turn panicked on a sending thread; the IO thread stops",
                    self.cfg.proto.name
                );
                self.failed = Some(panic);
                true
            }
        };
        if wake {
            self.shared.handoff.pend();
        }
        Some(wake)
    }

    /// Does what driven turns left for the IO thread ([`later`](IoCore::later)), in order.
    fn run_later(&mut self, now: Instant) {
        for out in std::mem::take(&mut self.later) {
            self.output(now, out);
        }
    }

    /// The adaptive spin changed its mind: the pool follows it, and the stats count it.
    fn spin_changed(&self, change: SpinChange) {
        self.pool.allow_spin(change.allows());
        self.shared.spin.note(change);
    }

    /// Does what the endpoint asks, in its order, until it asks nothing more
    /// ([`Endpoint::poll`]): pool tasks and events, journal batches and syncs, writes.
    fn drain(&mut self, now: Instant) {
        while let Some(out) = self.endpoint.poll(now) {
            if self.driving && left_to_the_io_thread(&out) {
                self.later.push(out);
            } else {
                self.output(now, out);
            }
        }
    }

    /// Does what one of the endpoint's outputs asks.
    fn output(&mut self, now: Instant, out: Output) {
        match out {
            Output::Task(t) => self.submit(t),
            Output::Journal((n, records)) => {
                // A small batch may be appended here, with nothing queued ahead of it
                // and the writer idle: its bytes are released at once, with no
                // hand-over to the writer thread and back.
                if self.writer.as_ref().is_some_and(|w| w.submit(n, records)) {
                    self.journal_progress(now);
                }
            }
            Output::JournalSync(n) => {
                let Some(done) = self.sync_asked.pop_front() else {
                    return;
                };
                // After a journal failure (`None`) the caller is never told the sync
                // succeeded: it sees the node stop (`Error::Closed`).
                if let (Some(n), Some(writer)) = (n, &self.writer) {
                    writer.sync(n);
                    self.syncs.push((n, done));
                    self.complete_syncs();
                    self.journal_progress(now);
                } else {
                    done.abandon();
                }
            }
            Output::Transmit(id) => self.write_link(id, now),
            Output::Dial { target, name, addr } => self.dial(now, target, name.as_deref(), &addr),
            Output::Close { link, last } => {
                if let Some(mut c) = self.conns.remove(&link) {
                    c.write_last(&last);
                    let _ = &self.registry.deregister(&mut c.stream);
                }
            }
            Output::Resume(link) => self.mark_read_pending(link),
            Output::Undelivered { peer, messages } => {
                if let Some(hook) = &self.undelivered {
                    if catch_unwind(AssertUnwindSafe(|| hook(&peer, messages))).is_err() {
                        log::error!(
                            "{}: the on_undelivered hook panicked; continuing",
                            self.cfg.proto.name
                        );
                    }
                }
            }
            Output::Admitted(shared) => crate::peer::admit(&self.peers_map, shared),
            Output::JournalFailed => {}
            Output::Event(event) => self.tell(event),
            Output::Forget(shared) => {
                crate::peer::forget(&self.peers_map, &shared);
            }
            Output::Datagram { to, packet } => self.send_datagram(to, &packet),
            Output::Resolve { name, host } => self.resolve(name, host),
        }
    }

    /// Reads the journal writer's marks and tells the endpoint what moved (bytes released,
    /// progress acknowledged, or a failure); completes the syncs they satisfy.
    fn journal_progress(&mut self, now: Instant) {
        let Some(writer) = &self.writer else {
            return;
        };
        let marks = writer.marks();
        if marks == self.marks {
            return;
        }
        self.marks = marks;
        *self.shared.journal_stats.lock() = writer.stats();
        self.complete_syncs();
        self.endpoint.handle(now, Input::JournalMarks(marks));
    }

    /// Completes the `sync_journal` calls the writer's marks (as last seen) satisfy.
    fn complete_syncs(&mut self) {
        let marks = self.marks;
        self.syncs.retain(|(n, done)| {
            let met = !marks.failed && marks.synced >= *n;
            if met {
                done.complete();
            }
            !met
        });
    }

    /// Reads every membership packet waiting on the UDP socket and hands each to the
    /// endpoint (at most [`DATAGRAM_BUDGET`] per turn: a flood cannot hold the loop).
    fn read_datagrams(&mut self, now: Instant) {
        let Some(udp) = &self.udp else {
            return;
        };
        let mut buf = [0u8; MAX_DATAGRAM];
        for _ in 0..DATAGRAM_BUDGET {
            match udp.recv_from(&mut buf) {
                Ok((n, from)) => {
                    if self.cfg.drop_datagrams.as_ref().is_some_and(|f| f(from)) {
                        continue;
                    }
                    self.endpoint.handle(
                        now,
                        Input::Datagram {
                            from,
                            data: &buf[..n],
                        },
                    )
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // An ICMP error of an earlier send (a member gone): nothing to read.
                    log::debug!("{}: membership socket: {e}", self.cfg.proto.name);
                }
            }
        }
        // Budget spent: what is left raises no new edge; re-arming reports it next turn.
        if let Some(udp) = self.udp.as_mut() {
            let _ = self.registry.reregister(udp, MEMBERS, Interest::READABLE);
        }
    }

    /// Resolves seed name `name` (`host`) on a thread of its own: a resolver may block for
    /// seconds (a DNS server that does not answer), and this thread must not. The thread
    /// hands the addresses back as a command and ends; the endpoint asks for one
    /// resolution of a name at a time, with backoff, only while the node reaches nobody.
    fn resolve(&mut self, name: usize, host: String) {
        let shared = self.shared.clone();
        let resolver = self.cfg.resolver.clone();
        let node = self.cfg.proto.name.clone();
        let spawned = crate::sync::thread::Builder::new()
            .name("cohort-resolve".into())
            .spawn(move || {
                let addrs = match super::resolve_seed(resolver.as_ref(), &host) {
                    Ok(addrs) => addrs,
                    Err(e) => {
                        log::debug!("{node}: seed {host} did not resolve: {e}");
                        Vec::new()
                    }
                };
                shared.command(Command::Resolved { name, addrs });
            });
        if let Err(e) = spawned {
            log::warn!("{}: no thread to resolve a seed: {e}", self.cfg.proto.name);
            self.shared.command(Command::Resolved {
                name,
                addrs: Vec::new(),
            });
        }
    }

    /// Sends a membership packet: best effort, as the protocol expects of a datagram (a
    /// full socket buffer drops it).
    fn send_datagram(&mut self, to: SocketAddr, packet: &[u8]) {
        let Some(udp) = &self.udp else {
            return;
        };
        if self.cfg.drop_datagrams.as_ref().is_some_and(|f| f(to)) {
            return;
        }
        if let Err(e) = udp.send_to(packet, to) {
            log::debug!(
                "{}: membership packet to {to} not sent: {e}",
                self.cfg.proto.name
            );
        }
    }

    /// Submits a pool task the endpoint produced.
    fn submit(&mut self, t: Task) {
        if !self.pool.submit(t) {
            log::debug!(
                "{}: delivery pool stopped; a delivery task was dropped",
                self.cfg.proto.name
            );
        }
    }

    /// Queues an event for the application's callback, delivered on the pool (one task at
    /// a time, in order); never runs the callback here.
    fn tell(&mut self, event: Public) {
        let Some(q) = &self.events else {
            return;
        };
        if q.push(event) == Pushed::Schedule && !self.pool.submit(Task::Events(q.clone())) {
            log::debug!(
                "{}: delivery pool stopped; membership events were dropped",
                self.cfg.proto.name
            );
        }
    }

    /// Hands the requests of other threads to the endpoint: commands, scheduled peers,
    /// credit to return.
    fn handle_requests(&mut self, now: Instant) {
        let commands = self.shared.commands.take();
        for c in commands {
            self.command(now, c);
        }
        self.take_lists(now);
    }

    /// Hands the scheduled peers and the credit to return to the endpoint.
    fn take_lists(&mut self, now: Instant) {
        let ready = self.shared.handoff.take_ready();
        if !ready.is_empty() {
            self.published_at = Some(now);
        }
        for id in ready {
            self.endpoint.handle(now, Input::Publish(id));
        }
        let credit = self.shared.handoff.take_credit_flush();
        for id in credit {
            self.endpoint.handle(now, Input::FlushCredit(id));
        }
    }

    /// Hands a command to the endpoint. A command its caller waits for completes only once
    /// the driver has done what the endpoint asked for it (the events of this command and of
    /// the ones before): `remove_peer` returns with the member's unacknowledged messages
    /// reported to `on_undelivered` and its connection closed, a barrier with the events of
    /// the commands before it handled.
    fn command(&mut self, now: Instant, c: Command) {
        match c {
            Command::AddPeer { peer, addr } => {
                self.endpoint.handle(now, Input::AddPeer { peer, addr });
            }
            Command::RemovePeer { id, done } => {
                self.endpoint.handle(now, Input::RemovePeer(id));
                self.drain(now);
                done.complete();
            }
            Command::Disconnect { id } => self.endpoint.handle(now, Input::Disconnect(id)),
            Command::Shutdown { deadline } => {
                self.endpoint.handle(now, Input::Shutdown { deadline });
            }
            Command::Barrier { done } => {
                self.drain(now);
                done.complete();
            }
            Command::Resolved { name, addrs } => {
                self.endpoint.handle(now, Input::Resolved { name, addrs });
            }
            Command::SyncJournal { done } => {
                self.sync_asked.push_back(done);
                self.endpoint.handle(now, Input::SyncJournal);
                self.drain(now);
            }
        }
    }

    /// The periodic work, if due at `now`.
    fn run_periodic(&mut self, now: Instant) {
        let Some((p, due)) = &mut self.periodic else {
            return;
        };
        if *due <= now {
            (p.run)();
            // Not a fixed rate: a late turn moves the next run, never runs it twice.
            *due = now + p.every;
        }
    }

    fn finish(&mut self) {
        let now = self.shared.clock.now();
        let peers = self.endpoint.finish(now);
        self.drain(now);
        // The writer appends and syncs what it was handed, then gives the journal back: the
        // node records the pool's last progress in it once the pool has drained.
        let journal = self.writer.take().and_then(JournalWriter::stop);
        // Stopping syncs everything handed over, unless the journal failed: the syncs
        // still waiting are done, or will never be.
        for (_, done) in self.syncs.drain(..) {
            if journal.is_some() {
                done.complete();
            } else {
                done.abandon();
            }
        }
        for done in self.sync_asked.drain(..) {
            done.abandon();
        }
        if let (Some(journal), Some(peers)) = (journal, peers) {
            *self.shared.stopped_journal.lock() = Some(StoppedJournal::new(journal, peers));
        }
        // Once more, so what is published ends with the node's last counts.
        if let Some((p, _)) = &mut self.periodic {
            (p.run)();
        }
        self.stopped.store(true, Ordering::Release);
        log::debug!("{}: IO thread stopped", self.cfg.proto.name);
    }

    fn new_token(&mut self) -> Token {
        let t = Token(self.next_token);
        self.next_token += 1;
        t
    }

    // ---- connections ---------------------------------------------------------------

    /// Accepts connections waiting on the listener, each judged by the endpoint's
    /// admission rules first; at most [`ACCEPT_BUDGET`] per call.
    fn accept_all(&mut self, now: Instant) {
        for _ in 0..ACCEPT_BUDGET {
            match self.listener.accept() {
                Ok((mut stream, from)) => {
                    if self.endpoint.is_shutting_down() {
                        continue; // dropped: we are closing
                    }
                    if closed_by_dialler(&stream) {
                        continue; // dropped before it is judged: it takes no slot
                    }
                    let verdict = self.endpoint.verdict_on_accept(now, from.clone());
                    if matches!(verdict, Verdict::SourceBurst | Verdict::Full) {
                        continue; // dropped at once: the stream closes here
                    }
                    let transport = match Transport::new(self.cfg.tls.as_ref(), None) {
                        Ok(t) => t,
                        Err(e) => {
                            Counters::add(&self.counters.tls_failures, 1);
                            log::warn!(
                                "{}: connection from {from} dropped: {e}",
                                self.cfg.proto.name
                            );
                            continue;
                        }
                    };
                    let Some(nonce) = self.fresh_nonce() else {
                        continue; // dropped; logged
                    };
                    configure(&self.cfg, &stream);
                    let token = self.new_token();
                    if let Err(e) = self
                        .registry
                        .register(&mut stream, token, Interest::READABLE)
                    {
                        log::warn!(
                            "{}: cannot register connection from {from}: {e}",
                            self.cfg.proto.name
                        );
                        continue;
                    }
                    let conn = Conn::new(token, stream, from.clone(), transport, false);
                    self.conns.insert(link(token), conn);
                    self.endpoint.handle(
                        now,
                        Input::Accepted {
                            link: link(token),
                            from,
                            verdict,
                            nonce,
                        },
                    );
                    self.drain(now);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.accept_pending = false;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and the like: log and try again on the next readiness event.
                    log::error!("{}: accept failed: {e}", self.cfg.proto.name);
                    self.accept_pending = false;
                    break;
                }
            }
        }
        self.endpoint.warn_shedding(now);
    }

    /// Opens a connection to `addr` for peer `peer`, named `name` (the endpoint asked).
    fn dial(&mut self, now: Instant, target: Target, name: Option<&str>, addr: &Addr) {
        let peer = target;
        // A TLS client verifies the server's certificate for the member it dials; a seed
        // names none (the builder refuses seeds with TLS).
        let transport = match name.map(|n| Transport::new(self.cfg.tls.as_ref(), Some(n))) {
            Some(Ok(t)) => t,
            None if self.cfg.tls.is_none() => Transport::Plain,
            None => {
                log::warn!(
                    "{}: cannot dial seed {addr} over TLS: no member name to verify",
                    self.cfg.proto.name
                );
                return self.endpoint.handle(now, Input::DialFailed(peer));
            }
            Some(Err(e)) => {
                Counters::add(&self.counters.tls_failures, 1);
                let name = name.unwrap_or("?");
                log::warn!("{}: cannot dial '{name}': {e}", self.cfg.proto.name);
                return self.endpoint.handle(now, Input::DialFailed(peer));
            }
        };
        let name = name.unwrap_or("a seed");
        let Some(nonce) = self.fresh_nonce() else {
            return self.endpoint.handle(now, Input::DialFailed(peer)); // logged
        };
        match Stream::connect(addr) {
            Ok(mut stream) => {
                let token = self.new_token();
                if let Err(e) = &self.registry.register(
                    &mut stream,
                    token,
                    Interest::READABLE | Interest::WRITABLE,
                ) {
                    log::warn!(
                        "{}: cannot register dial to {addr}: {e}",
                        self.cfg.proto.name
                    );
                    return self.endpoint.handle(now, Input::DialFailed(peer));
                }
                let conn = Conn::new(token, stream, addr.clone(), transport, true);
                self.conns.insert(link(token), conn);
                let link = link(token);
                self.endpoint.handle(
                    now,
                    Input::Dialled {
                        target: peer,
                        link,
                        nonce,
                    },
                );
            }
            Err(e) => {
                log::debug!(
                    "{}: dial '{name}' at {addr} failed: {e}",
                    self.cfg.proto.name
                );
                self.endpoint.handle(now, Input::DialFailed(peer));
            }
        }
    }

    /// A fresh handshake nonce: OS randomness when a secret is configured (the nonce is not
    /// used otherwise). `None` if the OS has no randomness to give: logged, and the
    /// connection is not made rather than authenticated with a predictable nonce.
    fn fresh_nonce(&self) -> Option<Nonce> {
        let mut nonce = [0u8; wire::NONCE_LEN];
        if self.cfg.proto.secret.is_none() {
            return Some(nonce);
        }
        match getrandom::getrandom(&mut nonce) {
            Ok(()) => Some(nonce),
            Err(e) => {
                log::error!(
                    "{}: no OS randomness for a handshake nonce ({e}); connection not made",
                    self.cfg.proto.name
                );
                None
            }
        }
    }

    fn conn_event(&mut self, id: LinkId, readable: bool, hup: bool, writable: bool) {
        let now = self.shared.clock.now();
        let Some(conn) = self.conns.get_mut(&id) else {
            return; // stale token: a spurious event for a connection already closed
        };
        let connecting = self.endpoint.link_mut(id).is_some_and(|l| l.connecting);
        if connecting {
            match conn.stream.take_error() {
                Ok(None) => {}
                Ok(Some(e)) | Err(e) => return self.connect_failed(now, id, e),
            }
            match conn.stream.connected() {
                Ok(true) => {
                    configure(&self.cfg, &conn.stream);
                    self.endpoint.handle(now, Input::Connected(id));
                }
                Ok(false) => return, // not yet
                Err(e) => return self.connect_failed(now, id, e),
            }
        }
        if writable {
            self.endpoint.handle(now, Input::Writable(id));
        }
        if readable {
            self.read_link(id, hup);
        }
        self.drain(now);
    }

    fn connect_failed(&mut self, now: Instant, id: LinkId, e: io::Error) {
        log::debug!("{}: connect failed: {e}", self.cfg.proto.name);
        self.endpoint.handle(
            now,
            Input::Failed {
                link: id,
                why: Why::Io,
            },
        );
        self.drain(now);
    }

    // ---- reading -------------------------------------------------------------------

    /// Reads and hands to the endpoint what connection `id` has, up to the per-turn budget.
    /// `hup`: the readiness event reported the peer's hang-up (or this is a continuation),
    /// so read until EOF or `WouldBlock` rather than stopping at a short read.
    fn read_link(&mut self, id: LinkId, hup: bool) {
        let mut total = 0usize;
        loop {
            let now = self.shared.clock.now();
            let (Some(conn), Some(link)) = (self.conns.get_mut(&id), self.endpoint.link_mut(id))
            else {
                return;
            };
            if !link.wants_read() {
                // Connecting, or paused: its peer holds more than its receive window, and the
                // bytes stay in the kernel (TCP pushes back on the peer) until it resumes.
                return;
            }
            match conn.read_some(link.read_buffer(), &self.read_buffers, &mut self.scratch) {
                Ok((0, _)) => {
                    self.hand_over(now, id);
                    let why = Why::PeerClosed;
                    self.endpoint.handle(now, Input::Failed { link: id, why });
                    return;
                }
                Ok((n, short)) => {
                    total += n;
                    self.hand_over(now, id);
                    if total >= READ_BUDGET {
                        self.mark_read_pending(id);
                        return;
                    }
                    if short && !hup {
                        // Drained: skip the read that would only say WouldBlock. Not after
                        // a hang-up event, whose EOF the next read must see.
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.tls_records(now, id);
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if conn::is_tls_failure(&e) => {
                    let from = Some(conn.remote.clone());
                    conn.write_last(&[]); // the alert telling the peer why
                    let reason = e.to_string();
                    let failed = Input::TlsFailed {
                        link: id,
                        reason: &reason,
                        from,
                    };
                    self.endpoint.handle(now, failed);
                    return;
                }
                Err(e) => {
                    log::info!(
                        "{}: read failed, closing connection: {e}",
                        self.cfg.proto.name
                    );
                    let why = Why::Io;
                    self.endpoint.handle(now, Input::Failed { link: id, why });
                    return;
                }
            }
        }
    }

    /// Hands what was just read on `id` to the endpoint (with the TLS certificate check
    /// for the member name a handshake claims).
    fn hand_over(&mut self, now: Instant, id: LinkId) {
        self.tls_records(now, id);
        let conns = &self.conns;
        let cert = |name: &str| {
            conns
                .get(&id)
                .map_or(Ok(()), |c| c.peer_cert_valid_for(name))
        };
        self.endpoint.handle(
            now,
            Input::Read {
                link: id,
                cert: &cert,
            },
        );
    }

    /// TLS: reading made records of the transport's own to send (handshake, alerts).
    fn tls_records(&mut self, now: Instant, id: LinkId) {
        if self
            .conns
            .get(&id)
            .is_some_and(|c| c.transport.wants_write())
        {
            self.endpoint.handle(now, Input::Writable(id));
        }
    }

    fn mark_read_pending(&mut self, id: LinkId) {
        if let Some(c) = self.conns.get_mut(&id) {
            if !c.read_pending {
                c.read_pending = true;
                self.read_pending.push_back(id);
            }
        }
    }

    fn process_read_pending(&mut self) {
        for _ in 0..self.read_pending.len() {
            let Some(id) = self.read_pending.pop_front() else {
                return;
            };
            if let Some(c) = self.conns.get_mut(&id) {
                c.read_pending = false;
                self.read_link(id, true);
            }
        }
    }

    // ---- writing -------------------------------------------------------------------

    /// Writes what link `id` may write now ([`Endpoint::to_write`]: with a journal, the
    /// bytes whose records are appended) and, over TLS, the transport's own records.
    fn write_link(&mut self, id: LinkId, now: Instant) {
        let (Some(conn), Some(bytes)) = (self.conns.get_mut(&id), self.endpoint.to_write(id))
        else {
            return;
        };
        match conn.write(bytes) {
            Ok(n) => {
                self.endpoint.handle(now, Input::Wrote { link: id, n });
                let wants = self.endpoint.link_mut(id).is_some_and(|l| l.wants_write());
                if let Some(conn) = self.conns.get_mut(&id) {
                    if let Err(e) = conn.update_interest(&self.registry, wants) {
                        log::warn!("{}: reregister failed: {e}", self.cfg.proto.name);
                    }
                }
            }
            Err(e) => {
                log::info!(
                    "{}: write failed, closing connection: {e}",
                    self.cfg.proto.name
                );
                let why = Why::Io;
                self.endpoint.handle(now, Input::Failed { link: id, why });
            }
        }
    }
}

use crate::peer::Counters;

/// Whether an accepted connection was already closed or reset by its dialler (a peek sees
/// the end of the stream or an error): a connect/close storm's connections are mostly so
/// by the time they are accepted, and are dropped before the admission rules judge them,
/// so they neither take a pending slot nor displace one. A member's dialler sends nothing
/// before our Hello (with TLS, its ClientHello: bytes, not an end), so it is never taken
/// for one.
fn closed_by_dialler(stream: &Stream) -> bool {
    let mut byte = [0u8; 1];
    match stream.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ),
    }
}

/// Socket options for every connection (see [`Stream::configure`]).
fn configure(cfg: &IoConfig, stream: &Stream) {
    stream.configure(&cfg.proto.name, cfg.send_buffer, cfg.recv_buffer);
}
