//! The network layer: one IO thread drives the node's protocol (`proto::Endpoint`) with a
//! mio `Poll`, the listener and one socket per link. Application threads and pool threads
//! talk to it through [`IoShared`]: its commands, and the [`Handoff`] lists with one
//! `Waker`, woken at most once per batch of requests.

mod clock;
mod conn;
mod idle;
mod io;
mod socket;

use std::net::SocketAddr;
use std::time::Instant;

use crate::addr::Addr;

pub(crate) use clock::Clock;
pub(crate) use conn::TlsSetup;
pub(crate) use idle::SpinCounters;
pub use idle::{IdleStats, IdleStrategy};
pub(crate) use io::{CoreSlot, Doorbell, IoThread};
pub(crate) use socket::{check_unix_path, Listener};

use crate::deliver::Pool;
use crate::handoff::{Abandon, Commands, Handoff};
pub(crate) use crate::handoff::{Completion, Outcome};
use crate::journal::{Journal, Recovered};
use crate::peer::{PeerShared, PeerWiring};
use crate::proto::{NodeCounters, StoppedJournal, Unacked};
use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use crate::sync::{Arc, Mutex, SharedStr};

/// Token of the listener.
pub(crate) const LISTENER: mio::Token = mio::Token(0);
/// Token of the waker.
pub(crate) const WAKER: mio::Token = mio::Token(1);
/// Token of the membership socket (UDP, at the listen address).
pub(crate) const MEMBERS: mio::Token = mio::Token(2);
/// First token handed to a connection.
pub(crate) const FIRST_CONN: usize = 3;

/// Settings the IO thread needs: the protocol's, and the sockets'.
#[derive(Clone)]
pub(crate) struct IoConfig {
    pub(crate) proto: crate::proto::Config,
    pub(crate) send_buffer: Option<usize>,
    pub(crate) recv_buffer: Option<usize>,
    /// How the IO thread (and, through it, the pool) waits for work.
    pub(crate) idle: IdleStrategy,
    /// TLS for every connection (feature `tls`); always `None` without the feature.
    pub(crate) tls: Option<TlsSetup>,
    /// A network fault a test makes: membership datagrams to or from an address it
    /// returns `true` for are dropped (set only with `--cfg cohort_internals`).
    pub(crate) drop_datagrams: Option<DatagramFilter>,
    /// How seed names are resolved: the system's resolver, or a test's (set only with
    /// `--cfg cohort_internals`).
    pub(crate) resolver: Option<Resolver>,
}

/// A test's stand-in for the system's resolver: a seed's `host:port` to its addresses.
pub(crate) type Resolver = Arc<dyn Fn(&str) -> std::io::Result<Vec<SocketAddr>> + Send + Sync>;

/// Resolves a seed's `host:port` (blocking: never on the IO thread's loop).
pub(crate) fn resolve_seed(
    resolver: Option<&Resolver>,
    name: &str,
) -> std::io::Result<Vec<SocketAddr>> {
    match resolver {
        Some(r) => r(name),
        None => std::net::ToSocketAddrs::to_socket_addrs(name).map(Iterator::collect),
    }
}

/// Which membership datagrams a test's network fault drops, by the other end's address.
pub(crate) type DatagramFilter = Arc<dyn Fn(SocketAddr) -> bool + Send + Sync>;

/// Requests from the node handle to the IO thread.
#[derive(Debug)]
pub(crate) enum Command {
    /// Start managing a peer (dial it if it has an address).
    AddPeer {
        peer: Arc<PeerShared>,
        addr: Option<Addr>,
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
    /// Seed name `name` resolved to `addrs` (on a resolver thread; none: it did not).
    Resolved { name: usize, addrs: Vec<SocketAddr> },
}

impl Abandon for Command {
    fn abandon(self) {
        match self {
            Command::RemovePeer { done, .. }
            | Command::SyncJournal { done }
            | Command::Barrier { done } => {
                done.abandon();
            }
            Command::AddPeer { .. }
            | Command::Disconnect { .. }
            | Command::Shutdown { .. }
            | Command::Resolved { .. } => {}
        }
    }
}

/// The peers a node knows, by name; shared by the node handle (send path) and the IO thread
/// (which adds members that dial in when unknown members are allowed).
pub(crate) type PeerMap = Arc<crate::peer::Peers>;

/// What the application receives about messages that will never be delivered.
pub(crate) type UndeliveredHook = Arc<dyn Fn(&str, Vec<Unacked>) + Send + Sync>;

/// The IO thread's inbox, shared with every other thread.
pub(crate) struct IoShared {
    /// The ready and credit lists, and the doorbell that every request rings.
    pub(crate) handoff: Arc<Handoff>,
    /// Commands for the IO thread; closed as it stops (see [`Commands`]).
    pub(crate) commands: Commands<Command>,
    next_peer: AtomicUsize,
    /// What every peer's shared state is wired with.
    wiring: PeerWiring,
    /// The journal's counters as of its last write (journalling nodes only).
    pub(crate) journal_stats: Mutex<Option<crate::journal::JournalStats>>,
    /// The journal, handed over by the IO thread when it exits.
    pub(crate) stopped_journal: Mutex<Option<StoppedJournal>>,
    /// Where the IO thread reads the time, and what hands it instants (a test's clock in
    /// cohort's own builds; `Instant::now()`, zero-sized, in the application's).
    pub(crate) clock: Clock,
    /// What the IO thread's idle strategy did ([`crate::IdleStats`]).
    pub(crate) spin: SpinCounters,
}

impl std::fmt::Debug for IoShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoShared").finish_non_exhaustive()
    }
}

impl IoShared {
    pub(crate) fn new(
        waker: Doorbell,
        journalled: bool,
        oob_limit: usize,
        max_requests: usize,
    ) -> IoShared {
        let handoff = Arc::new(Handoff::new(Box::new(waker)));
        IoShared {
            wiring: PeerWiring {
                handoff: handoff.clone(),
                journalled,
                oob_limit,
                max_requests,
            },
            handoff,
            commands: Commands::new(),
            next_peer: AtomicUsize::new(0),
            journal_stats: Mutex::new(None),
            stopped_journal: Mutex::new(None),
            clock: Clock::new(),
            spin: SpinCounters::default(),
        }
    }

    /// Leaves a wake-up pending and wakes the IO thread, even where one is pending (unless
    /// it spins: its next poll comes anyway); call after publishing what it should look at
    /// (the journal writer: its marks, which every turn reads; a test: its clock moved).
    /// Never a driven turn: what this asks for is the IO thread's own work.
    pub(crate) fn wake(&self) {
        self.handoff.ring_io();
    }

    /// IO thread: whether a wake-up was requested since the last call (and clears it).
    pub(crate) fn take_wake(&self) -> bool {
        self.handoff.take_wake()
    }

    /// Hands `c` to the IO thread; once it has stopped, `c` is abandoned at once (its
    /// caller, if one waits, is told).
    pub(crate) fn command(&self, c: Command) {
        self.commands.send(c, &self.handoff);
    }

    /// The IO thread stops taking commands: those it did not take are abandoned (their
    /// callers told), and so is every later one. Called once the IO thread has left its
    /// loop, whether it finished or panicked.
    pub(crate) fn close_commands(&self) {
        self.commands.stop();
    }

    /// Puts the peer on the ready list unless it is already there (see [`Handoff`]).
    #[inline]
    pub(crate) fn schedule(&self, peer: &PeerShared) {
        self.handoff.schedule(peer.id, &peer.scheduled);
    }

    pub(crate) fn next_peer_id(&self) -> usize {
        self.next_peer.fetch_add(1, Ordering::Relaxed)
    }

    /// Builds the shared state of a new peer, wiring its receive credit to this IO thread.
    pub(crate) fn new_peer(&self, name: SharedStr, window: u64) -> Arc<PeerShared> {
        Arc::new(PeerShared::wired(
            self.next_peer_id(),
            name,
            window,
            &self.wiring,
        ))
    }
}

/// Everything the IO thread is started with.
pub(crate) struct IoParts {
    pub(crate) config: IoConfig,
    pub(crate) poll: mio::Poll,
    pub(crate) listener: Listener,
    /// The membership socket, registered under [`MEMBERS`] (membership only).
    pub(crate) udp: Option<mio::net::UdpSocket>,
    pub(crate) shared: Arc<IoShared>,
    pub(crate) peers: PeerMap,
    pub(crate) pool: Arc<Pool>,
    pub(crate) counters: Arc<NodeCounters>,
    pub(crate) undelivered: Option<UndeliveredHook>,
    /// The application's membership events (`Builder::on_event`).
    pub(crate) events: Option<Arc<crate::events::EventQueue>>,
    pub(crate) stopped: Arc<AtomicBool>,
    /// The opened journal and what it recovered (journalling nodes only).
    pub(crate) journal: Option<(Journal, Recovered)>,
    /// Work the IO thread does on a period of its own (feature `metrics`: publishing the
    /// node's counters).
    pub(crate) periodic: Option<Periodic>,
    /// Where the IO thread keeps its state (empty until it starts), which its
    /// [`Doorbell`] lets requesters drive while the thread is parked.
    pub(crate) core: Arc<CoreSlot>,
}

/// Something the IO thread runs every `every`, between two turns, and once more as it
/// stops: never on the path of a message.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Periodic {
    pub(crate) every: std::time::Duration,
    pub(crate) run: Box<dyn FnMut() + Send>,
}

impl std::fmt::Debug for Periodic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Periodic")
            .field("every", &self.every)
            .finish_non_exhaustive()
    }
}
