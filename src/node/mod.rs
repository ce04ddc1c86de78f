//! The public handle: [`Node`] (lifecycle, peers, stats; `send.rs`: [`Sender`], the send
//! variants, cloneable into handlers and other threads), configured by [`Builder`].

mod builder;
mod delivery;
mod error;
#[cfg(feature = "metrics")]
mod metrics;
mod send;
mod stats;
#[cfg(feature = "codec")]
mod typed;

pub use crate::net::{IdleStats, IdleStrategy};
pub use builder::{Builder, UndeliveredFn};
pub use error::{ConfigError, Error, ReplyFailure, SendError, TrySendError};
use send::send_variants;
pub use send::{PeerSender, PendingReply, RequestOptions, SendOptions, Sender};
pub use stats::{ConnStats, PeerStats, Stats};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::addr::{Addr, ToAddr};
use crate::deliver::{Handler, Pool};
use crate::net::{
    Command, Completion, CoreSlot, Doorbell, IoParts, IoShared, IoThread, Listener, Outcome,
    PeerMap, UndeliveredHook,
};
use crate::peer::{Counters, PeerShared};
use crate::proto::NodeCounters;
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{thread, Arc, Mutex, SharedStr};
use crate::wire;

/// The listening socket's accept queue. It absorbs connection bursts while the IO thread
/// is busy or descheduled: a connection arriving to a full queue is dropped by the kernel,
/// and its dialler (a member, perhaps) retries only after a second. The kernel caps this at
/// its own limit (`net.core.somaxconn`, 4096 by default on Linux).
const LISTEN_BACKLOG: i32 = 4096;

/// What [`Node::shutdown`] reports once the node has stopped: the node's account of the
/// messages that never reached a peer, totals since it started over the peers it had when
/// it stopped (per peer: [`PeerStats`](crate::PeerStats) `undelivered` and `failed`).
///
/// ```
/// use std::time::Duration;
/// # fn main() -> Result<(), cohort::Error> {
/// // A peer that is never up: what is queued for it cannot be handed over.
/// let alpha = cohort::Node::builder("alpha")
///     .cluster("docs")
///     .peer("beta", "127.0.0.1:9") // nothing listens on the discard port here
///     .start()?;
/// alpha.send("beta", &b"lost"[..])?;
/// let report = alpha.shutdown(Duration::from_secs(1))?;
/// assert_eq!(report.failed, 1); // queued, never published: its permits came back
/// assert_eq!(report.undelivered, 0); // nothing was published and left unacknowledged
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Messages published but never acknowledged by their peer: reported to the
    /// undelivered callback (when the peer restarted, was removed, or the node closed with
    /// them unacknowledged).
    pub undelivered: u64,
    /// Messages accepted but never published: expired, too large for the peer, unreliable
    /// ones for a disconnected peer, or still queued when the peer was removed or the node
    /// closed. Each was reported to the undelivered callback.
    pub failed: u64,
    /// How long the shutdown took.
    pub elapsed: Duration,
}

/// A member of a cluster: a listener, one IO thread, a delivery pool, and a connection to
/// each peer.
///
/// Dropping a `Node` that was not [`shutdown`](Node::shutdown) shuts it down as
/// `shutdown(Duration::from_secs(5))` does ([`Node::DROP_SHUTDOWN`]): the dropping thread
/// blocks until the queued messages are flushed and acknowledged and every thread is
/// joined, for at most those 5 seconds. There is no [`ShutdownReport`] to return: the
/// drop logs one instead, a warning with its counts when something was left undelivered or
/// failed (each such message was also handed to
/// [`on_undelivered`](Builder::on_undelivered)), a debug line otherwise, and an error when
/// threads were still running at the deadline. Call `shutdown` yourself to choose the
/// deadline and get the report; a node dropped on one of its own pool threads (from its
/// message handler) waits out the deadline for itself.
///
/// ```
/// use std::sync::mpsc;
/// # fn main() -> Result<(), cohort::Error> {
/// let (tx, rx) = mpsc::channel();
/// let tx = std::sync::Mutex::new(tx);
/// let beta = cohort::Node::builder("beta")
///     .on_message(move |d| { let _ = tx.lock().unwrap().send(d.payload_bytes()); })
///     .start()?;
/// let alpha = cohort::Node::builder("alpha").peer("beta", beta.local_addr()).start()?;
/// beta.add_peer("alpha", alpha.local_addr())?;
/// alpha.send("beta", &b"hello"[..])?;
/// assert_eq!(&rx.recv().unwrap()[..], b"hello");
/// alpha.shutdown(std::time::Duration::from_secs(5))?;
/// beta.shutdown(std::time::Duration::from_secs(5))?;
/// # Ok(()) }
/// ```
#[must_use = "dropping a Node shuts it down"]
pub struct Node {
    sender: Sender,
    name: SharedStr,
    launch_id: u64,
    /// Whether the node journals (`Builder::journal`).
    journalled: bool,
    /// The address the listener is bound to.
    local_addr: Addr,
    window: u64,
    io: Arc<IoShared>,
    peers: PeerMap,
    pool: Arc<Pool>,
    counters: Arc<NodeCounters>,
    io_thread: Mutex<Option<thread::JoinHandle<()>>>,
    io_done: Arc<Completion>,
    shut: AtomicBool,
    /// Listening on the default loopback address (`Builder::listen` not called): a peer
    /// added outside loopback is warned about.
    loopback_default: bool,
    /// The loopback warning was logged (at start or by `add_peer`): it is logged once.
    warned_loopback: AtomicBool,
    /// The membership events queue (`Builder::on_event`).
    events: Option<Arc<crate::events::EventQueue>>,
    /// Connections run TLS: peer names added later must be DNS names.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    tls: bool,
    /// The membership view, as the IO thread last wrote it (membership only).
    members: Option<Arc<crate::sync::Mutex<crate::proto::MembersView>>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.name)
            .field("local_addr", &self.local_addr)
            .field("launch_id", &format_args!("{:016x}", self.launch_id))
            .finish()
    }
}

/// Marks the IO thread's end even if it panics: the commands it did not take are
/// abandoned (their callers told), and so is every later one.
struct DoneGuard(Arc<Completion>, Arc<AtomicBool>, Arc<IoShared>);

impl Drop for DoneGuard {
    fn drop(&mut self) {
        self.2.close_commands();
        self.1.store(true, Ordering::Release);
        self.0.complete();
    }
}

impl Node {
    /// Starts configuring a member named `name`.
    pub fn builder(name: &str) -> Builder {
        Builder::new(name)
    }

    /// Starts the node; with `inbox`, its pool has no workers (an [`Inbox`](crate::Inbox)
    /// on the application's thread runs its tasks). Returns the pool with the node.
    fn start(b: Builder, inbox: bool) -> Result<(Node, Arc<Pool>), Error> {
        let (listen, peer_addrs) = b.validate()?;
        // The journal first: a directory that cannot be recovered stops the start before a
        // socket is bound.
        let journal = match &b.journal {
            None => None,
            Some(j) => {
                let config = crate::journal::JournalConfig::new(&j.dir, b.name())
                    .cluster(&b.io.proto.cluster)
                    .segment_size(j.segment_size)
                    .fsync(j.fsync);
                let (journal, recovered) = crate::journal::Journal::open(config)?;
                let r = &recovered.report;
                log::info!(
                    "{}: journal {} recovered: {} segments, {} records replayed, {} unacknowledged messages to {} peers",
                    b.name(),
                    j.dir.display(),
                    r.segments_replayed,
                    r.records_replayed,
                    recovered.peers.values().map(|p| p.unacked.len()).sum::<usize>(),
                    recovered.peers.len()
                );
                Some((journal, recovered))
            }
        };
        // A journalling member keeps its launch id across restarts: its peers continue its
        // streams instead of meeting a new incarnation.
        let launch_id = journal
            .as_ref()
            .map_or_else(crate::util::random_nonzero_u64, |(j, _)| j.launch_id());
        let config = b.io_config(launch_id, journal.is_some());
        let (name, window) = (config.proto.name.clone(), config.proto.window);
        let max_message = config.proto.max_message;

        let (mut listener, local_addr) =
            Listener::bind(&listen, LISTEN_BACKLOG).map_err(|source| Error::Listen {
                addr: listen.clone(),
                source,
            })?;

        let poll = mio::Poll::new()?;
        poll.registry()
            .register(&mut listener, crate::net::LISTENER, mio::Interest::READABLE)?;
        let mut config = config;
        let (udp, members) = if b.membership_on() {
            let (mut udp, setup) = membership_setup(&b, &config, &local_addr, &peer_addrs)?;
            poll.registry()
                .register(&mut udp, crate::net::MEMBERS, mio::Interest::READABLE)?;
            let view = setup.view.clone();
            config.proto.membership = Some(setup);
            config.proto.allow_unknown = true;
            (Some(udp), Some(view))
        } else {
            (None, None)
        };
        let waker = mio::Waker::new(poll.registry(), crate::net::WAKER)?;
        // Filled by the IO thread as it is set up; its doorbell lets requesters drive it.
        let core: Arc<CoreSlot> = Arc::new(CoreSlot::new());
        let io = Arc::new(IoShared::new(
            Doorbell::new(waker, Arc::downgrade(&core)),
            journal.is_some(),
            b.effective_oob_concurrency(),
            b.max_requests,
        ));

        let peers: PeerMap = Arc::new(crate::peer::Peers::default());
        let stopped = Arc::new(AtomicBool::new(false));
        let sender = Sender::new(
            name.clone(),
            peers.clone(),
            io.clone(),
            max_message,
            b.effective_max_reply(),
            stopped.clone(),
            // Every message must reach the IO thread whole: the filter sees each, and the
            // journal records each.
            journal.is_none() && b.io.proto.outbound_filter.is_none(),
        );
        let handler = b.handler.clone().unwrap_or_else(|| {
            let warned = Arc::new(AtomicBool::new(false));
            let node = name.clone();
            Handler::owned(move |d: crate::Delivery| {
                // A requester learns at once that nobody here answers.
                d.refuse_no_handler();
                if !warned.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "{node}: message from '{}' dropped: no on_message handler was set",
                        d.from()
                    );
                }
            })
        });
        let pool = Arc::new(if inbox {
            // With a journal, what the inbox takes counts as handled (and is acknowledged):
            // one message at a time, so only the one the application holds is at stake.
            let batch = if b.journal.is_some() {
                1
            } else {
                b.delivery_batch
            };
            Pool::without_workers(batch, Some(Arc::new(sender.clone())))?
        } else {
            Pool::start(
                b.name(),
                b.pool_threads,
                b.delivery_batch,
                handler,
                Some(Arc::new(sender.clone())),
            )?
        });

        // The pool spins as long as the IO thread would; an adaptive IO thread turns the
        // pool's spin off while the node is loaded (`Pool::allow_spin`).
        pool.set_spin(b.io.idle.spin().0);
        for (pname, addr) in &peer_addrs {
            let shared = io.new_peer(pname.as_str().into(), window);
            peers.change(|map| map.insert(shared.name.clone(), shared.clone()));
            io.command(Command::AddPeer {
                peer: shared,
                addr: Some(addr.clone()),
            });
        }

        let counters = Arc::new(NodeCounters::default());
        let undelivered: Option<UndeliveredHook> = b.undelivered.clone().map(|f| {
            let h: UndeliveredHook =
                Arc::new(move |peer: &str, msgs: Vec<crate::proto::Unacked>| {
                    // The application's payloads: replies are not its messages, and a
                    // request's id is the transport's.
                    let payloads: Vec<Bytes> = msgs
                        .into_iter()
                        .filter(|u| u.flags & wire::FLAG_REPLY == 0)
                        .map(|u| {
                            let header = wire::tag_bytes(u.flags).min(u.payload.len());
                            u.payload.slice(header..)
                        })
                        .collect();
                    if !payloads.is_empty() {
                        f(peer, payloads)
                    }
                });
            h
        });
        let events = b.on_event.as_ref().map(|f| {
            Arc::new(crate::events::EventQueue::new(
                name.clone(),
                f.bind(&sender),
                b.event_capacity,
            ))
        });
        let tls = config.tls.is_some();
        #[cfg(feature = "metrics")]
        let periodic = metrics::publisher(
            b.metrics_interval,
            StatsSources {
                name: name.clone(),
                peers: peers.clone(),
                pool: pool.clone(),
                counters: counters.clone(),
                io: io.clone(),
                events: events.clone(),
            },
        );
        #[cfg(not(feature = "metrics"))]
        let periodic = None;
        let io_done = Arc::new(Completion::default());
        let parts = IoParts {
            config,
            poll,
            listener,
            udp,
            shared: io.clone(),
            peers: peers.clone(),
            pool: pool.clone(),
            counters: counters.clone(),
            undelivered,
            events: events.clone(),
            stopped: stopped.clone(),
            journal,
            periodic,
            core,
        };
        let guard = DoneGuard(io_done.clone(), stopped.clone(), io.clone());
        let io_state = match IoThread::new(parts) {
            Ok(t) => t,
            Err(e) => {
                pool.stop();
                return Err(Error::Io(e));
            }
        };
        let io_thread = thread::Builder::new()
            .name(format!("{name}-io"))
            .spawn(move || {
                let _guard = guard;
                io_state.run();
            });
        let io_thread = match io_thread {
            Ok(h) => h,
            Err(e) => {
                pool.stop();
                return Err(Error::Io(e));
            }
        };
        if b.journal.is_some() {
            // The journal's restored streams charge the peers' windows as the IO thread
            // adds them: wait for that, so that no send of ours comes first.
            io_barrier(&io, &io_done);
        }
        log::info!(
            "{name}: listening on {local_addr} (cluster '{}', {} peers)",
            b.io.proto.cluster,
            peer_addrs.len()
        );
        let warning = b.loopback_listen_warning(&local_addr, &peer_addrs);
        if let Some(warning) = &warning {
            log::warn!("{warning}");
        }
        let loopback_default = b.default_loopback_listen(&local_addr);
        let node = Node {
            sender,
            name,
            launch_id,
            journalled: b.journal.is_some(),
            local_addr,
            window,
            io,
            peers,
            pool: pool.clone(),
            counters,
            io_thread: Mutex::new(Some(io_thread)),
            io_done,
            shut: AtomicBool::new(false),
            loopback_default,
            warned_loopback: AtomicBool::new(warning.is_some()),
            events,
            tls,
            members,
        };
        Ok((node, pool))
    }

    /// This member's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The TCP address the listener is bound to (with the real port when 0 was asked).
    ///
    /// A node listening on a Unix-domain socket has none: it returns `0.0.0.0:0` (the
    /// unspecified address, port 0), which nothing can dial. [`listen_addr`](Node::listen_addr)
    /// gives the address of either kind.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
            .as_tcp()
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// The address the listener is bound to, of either kind: TCP (with the real port when
    /// 0 was asked) or a Unix-domain socket. What another member's
    /// [`Builder::peer`](crate::Builder::peer) or [`add_peer`](Node::add_peer) takes to
    /// reach this one.
    pub fn listen_addr(&self) -> Addr {
        self.local_addr.clone()
    }

    /// This process's launch id (random per start; peers use it to detect restarts).
    pub fn launch_id(&self) -> u64 {
        self.launch_id
    }

    /// A cloneable send handle, for other threads and for replies from inside a handler.
    pub fn sender(&self) -> Sender {
        self.sender.clone()
    }

    /// The cluster's members as this node's membership view holds them
    /// ([`Builder::membership`]): this node first, then the others by name — failed and left
    /// ones too, for a while after they were declared so. Empty without membership.
    ///
    /// ```
    /// # fn main() -> Result<(), cohort::Error> {
    /// let node = cohort::Node::builder("first").membership(true).start()?;
    /// let view = node.members();
    /// assert_eq!(view[0].name, "first");
    /// assert_eq!(view[0].state, cohort::MemberState::Alive);
    /// # node.shutdown(std::time::Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    pub fn members(&self) -> Vec<crate::MemberInfo> {
        use crate::membership::State;
        let Some(view) = &self.members else {
            return Vec::new();
        };
        view.lock()
            .members
            .iter()
            .map(|m| crate::MemberInfo {
                name: m.name.clone(),
                addr: m.addr,
                state: match m.state {
                    State::Alive => crate::MemberState::Alive,
                    State::Suspect => crate::MemberState::Suspect,
                    State::Failed => crate::MemberState::Failed,
                    State::Left => crate::MemberState::Left,
                },
                incarnation: m.incarnation,
            })
            .collect()
    }

    /// Membership's traffic counters ([`Builder::membership`]); `None` without membership.
    pub fn membership_stats(&self) -> Option<crate::MembershipStats> {
        Some(self.members.as_ref()?.lock().stats.clone())
    }

    /// Names of the configured peers, sorted.
    pub fn peers(&self) -> Vec<String> {
        let mut v: Vec<String> = self.peers.read().keys().map(|k| k.to_string()).collect();
        v.sort();
        v
    }

    /// Adds a member at run time, at its address (TCP, or a Unix-domain socket: see
    /// [`Addr`]); it is dialled at once.
    pub fn add_peer<A: ToAddr>(&self, name: &str, addr: A) -> Result<(), Error> {
        builder::check_name("add_peer", name)?;
        if name == &*self.name {
            return Err(ConfigError::Name {
                setting: "add_peer",
                name: name.to_owned(),
                problem: "is this node's own name".into(),
            }
            .into());
        }
        #[cfg(feature = "tls")]
        if self.tls {
            crate::tls::server_name(name).map_err(|problem| ConfigError::Name {
                setting: "add_peer",
                name: name.to_owned(),
                problem,
            })?;
        }
        if self.shut.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let unresolved = |problem: String| ConfigError::Address {
            setting: "add_peer",
            peer: Some(name.to_owned()),
            problem,
        };
        let addr = addr.to_addr().map_err(|e| unresolved(e.to_string()))?;
        if let Addr::Unix(path) = &addr {
            crate::net::check_unix_path(path).map_err(unresolved)?;
        }
        let shared = self.peers.change(|map| {
            if map.contains_key(name) {
                return Err(Error::PeerExists(name.to_owned()));
            }
            let shared = self.io.new_peer(name.into(), self.window);
            map.insert(shared.name.clone(), shared.clone());
            Ok(shared)
        })?;
        // Relaxed: a once-only flag for a log line.
        if self.loopback_default
            && !addr.is_local()
            && !self.warned_loopback.swap(true, Ordering::Relaxed)
        {
            log::warn!(
                "{}",
                builder::loopback_warning(
                    &self.name,
                    &self.local_addr,
                    &format!("'{name}' at {addr}")
                )
            );
        }
        self.io.command(Command::AddPeer {
            peer: shared,
            addr: Some(addr),
        });
        if self.journalled {
            io_barrier(&self.io, &self.io_done); // as in `start`
        }
        Ok(())
    }

    /// Removes a member for good: its connection is closed, messages still queued for it
    /// fail (their permits are given back) and, like those it had not acknowledged, are
    /// reported to [`Builder::on_undelivered`], senders blocked on it wake with
    /// [`Error::Closed`], and no reconnect scheduled earlier can bring it back. It can be
    /// added again later as a new peer.
    pub fn remove_peer(&self, name: &str) -> Result<(), Error> {
        let Some(peer) = self.peers.change(|map| map.remove(name)) else {
            return Err(Error::UnknownPeer(name.to_owned()));
        };
        let done = Arc::new(Completion::default());
        self.io.command(Command::RemovePeer {
            id: peer.id,
            done: done.clone(),
        });
        peer.outbox.window().close();
        peer.requests.close();
        // Abandoned: the IO thread has stopped (the node is shut down), and with it every
        // connection.
        if done.wait_until(Some(Instant::now() + Duration::from_secs(10))) == Outcome::Pending {
            log::warn!(
                "{}: remove_peer('{name}') not confirmed by the IO thread within 10 s",
                self.name
            );
        }
        Ok(())
    }

    /// Drops the connection to `name`; it is re-established with backoff and recovery
    /// resends whatever was not acknowledged.
    pub fn disconnect(&self, name: &str) -> Result<(), Error> {
        let Some(id) = self.peers.read().get(name).map(|p| p.id) else {
            return Err(Error::UnknownPeer(name.to_owned()));
        };
        self.io.command(Command::Disconnect { id });
        Ok(())
    }

    /// The route of a send to `to`, as the node's [`Sender`] takes it.
    fn route<'a>(&'a self, to: &'a str) -> send::Route<'a> {
        self.sender.route(to)
    }

    send_variants!(see Sender (to));

    /// See [`Sender::broadcast`].
    #[must_use = "each peer's result says whether it was queued"]
    pub fn broadcast(
        &self,
        payload: impl Into<Bytes>,
    ) -> Vec<(String, Result<(), SendError<Bytes>>)> {
        self.sender.broadcast(payload)
    }

    /// See [`Sender::to`].
    pub fn to(&self, peer: &str) -> Result<PeerSender, Error> {
        self.sender.to(peer)
    }

    /// See [`Sender::is_connected`].
    pub fn is_connected(&self, peer: &str) -> bool {
        self.sender.is_connected(peer)
    }

    /// See [`Sender::wait_connected`].
    pub fn wait_connected(&self, peer: &str, timeout: Duration) -> Result<(), Error> {
        self.sender.wait_connected(peer, timeout)
    }

    /// What the idle strategy did ([`Stats::idle`]) alone: three loads, no allocation, cheap
    /// enough to read around every round trip (to tell the round trips that began with the
    /// node's spin standing down, or saw it stand down, from the others).
    ///
    /// ```
    /// # fn main() -> Result<(), cohort::Error> {
    /// let node = cohort::Node::builder("quote").start()?;
    /// let before = node.idle_stats();
    /// // ... a round trip ...
    /// let after = node.idle_stats();
    /// let stood_down = after.stood_down_loaded + after.stood_down_contended
    ///     > before.stood_down_loaded + before.stood_down_contended;
    /// println!("began spinning: {}, stood down meanwhile: {stood_down}", before.spinning);
    /// # node.shutdown(std::time::Duration::from_secs(1))?;
    /// # Ok(()) }
    /// ```
    pub fn idle_stats(&self) -> IdleStats {
        self.io.spin.read()
    }

    /// A snapshot of every counter.
    ///
    /// The counters are read one by one while the node runs, not frozen together. A
    /// delivery is counted (`delivered`, `oob_delivered`, the pool's figures) only after
    /// the handler returns, so a snapshot taken while messages flow may lag what the
    /// handler itself has counted: to compare the two, wait until the stats reach the
    /// count expected (or the traffic has stopped and the pool is idle) before reading.
    pub fn stats(&self) -> Stats {
        self.sources().collect()
    }

    /// Not API: moves this node's clock forward by `by` — the clock its IO thread reads
    /// the time on (the real time plus what the tests added) — and wakes the IO thread;
    /// returns the clock's reading just after. A test makes time pass with it (a loop held
    /// for three idle timeouts) instead of sleeping through it. Built only with `--cfg
    /// cohort_internals`.
    #[cfg(cohort_internals)]
    #[doc(hidden)]
    pub fn advance_clock(&self, by: Duration) -> Instant {
        let now = self.io.clock.advance(by);
        self.io.wake();
        now
    }

    /// Not API: whether this node's IO thread blocks in its poll now with no wake-up
    /// pending, so that a send would ask to drive its turn (see
    /// [`IdleStats::driven_turns`]). Built only with `--cfg
    /// cohort_internals`.
    #[cfg(cohort_internals)]
    #[doc(hidden)]
    pub fn io_parked(&self) -> bool {
        self.io.handoff.is_parked()
    }

    /// Not API: the latest instant, on this node's clock, that its IO thread judged its
    /// timeouts (idle links, handshake deadlines, timers) at; a test waits for it to pass
    /// what [`advance_clock`](Node::advance_clock) returned. Built only with `--cfg
    /// cohort_internals`.
    #[cfg(cohort_internals)]
    #[doc(hidden)]
    pub fn timeouts_judged_at(&self) -> Option<Instant> {
        self.io.clock.judged_at()
    }

    fn sources(&self) -> StatsSources {
        StatsSources {
            name: self.name.clone(),
            peers: self.peers.clone(),
            pool: self.pool.clone(),
            counters: self.counters.clone(),
            io: self.io.clone(),
            events: self.events.clone(),
        }
    }

    /// With a journal: journals every message accepted so far (to any peer, connected or
    /// not) and forces the journal to disk, whatever the fsync policy. When it returns `Ok`,
    /// those messages survive a crash of this process or of the machine. Fails with
    /// [`Error::Config`] without a journal, [`Error::TimedOut`] if the IO thread did not
    /// finish within `timeout`, and [`Error::Closed`] once the node is shut down — also when
    /// a journal write or sync failed, which stops the node (logged, and counted in
    /// [`Stats::journal_failures`](crate::Stats::journal_failures)).
    pub fn sync_journal(&self, timeout: Duration) -> Result<(), Error> {
        if !self.journalled {
            return Err(ConfigError::NoJournal {
                setting: "sync_journal",
            }
            .into());
        }
        if self.shut.load(Ordering::Acquire) || self.io_done.outcome() != Outcome::Pending {
            return Err(Error::Closed);
        }
        let done = Arc::new(Completion::default());
        self.io.command(Command::SyncJournal { done: done.clone() });
        let deadline = Instant::now() + timeout;
        loop {
            // Abandoned: the IO thread stopped first. The IO thread's end is checked as well
            // in case it panicked while holding the sync.
            match done.wait_until(Some(
                (Instant::now() + Duration::from_millis(50)).min(deadline),
            )) {
                Outcome::Done => return Ok(()),
                Outcome::Abandoned => return Err(Error::Closed),
                Outcome::Pending => {}
            }
            if self.io_done.outcome() != Outcome::Pending {
                return Err(Error::Closed);
            }
            if Instant::now() >= deadline {
                return Err(Error::TimedOut(timeout));
            }
        }
    }

    /// Stops the node within `timeout`: refuses new sends, flushes what is queued to
    /// connected peers and waits for their acks (a peer whose handshake is under way and
    /// that is owed messages counts as connected, on a link this node dialled or one it
    /// accepted: the handshake completes, or fails at its
    /// [`handshake_timeout`](Builder::handshake_timeout), within the same deadline), closes
    /// every connection, lets the pool deliver what was received, and joins every thread. Returns what could not be
    /// delivered; fails with [`Error::ShutdownTimedOut`] if a thread (typically a handler
    /// that does not return) is still running at the deadline. Calling it again returns at
    /// once. Do not call it from inside a message handler: the pool would wait for itself.
    pub fn shutdown(&self, timeout: Duration) -> Result<ShutdownReport, Error> {
        let started = Instant::now();
        let deadline = started + timeout;
        if self.shut.swap(true, Ordering::AcqRel) {
            return Ok(ShutdownReport::default());
        }
        // The IO thread's deadline, on its clock (the real one outside cohort's tests).
        let io_deadline = self.io.clock.now() + timeout;
        self.io.command(Command::Shutdown {
            deadline: io_deadline,
        });
        let mut stuck = Vec::new();
        // The IO thread leaves its loop by the deadline; give it a moment past it to close.
        if self
            .io_done
            .wait_until(Some(deadline + Duration::from_millis(200)))
            != Outcome::Pending
        {
            if let Some(h) = self.io_thread.lock().take() {
                let _ = h.join();
            }
        } else {
            stuck.push(format!("{}-io", self.name));
        }
        // Requests still waiting will not be answered now.
        for p in self.peers.read().values() {
            p.requests.close();
        }
        self.pool.stop();
        let left = self
            .pool
            .join_until(deadline.max(Instant::now() + Duration::from_millis(10)));
        if left > 0 {
            stuck.push(format!("{left} delivery thread(s)"));
        } else if let Some(journal) = self.io.stopped_journal.lock().take() {
            // The pool has drained: record how far it got, so a restart delivers none of
            // it again.
            if let Err(e) = journal.close() {
                log::error!(
                    "{}: journal: cannot record the final progress: {}",
                    self.name,
                    crate::util::Chain(&e)
                );
            }
        }
        let (mut undelivered, mut failed) = (0, 0);
        for p in self.peers.read().values() {
            undelivered += Counters::get(&p.counters.undelivered);
            failed += Counters::get(&p.counters.failed);
        }
        if !stuck.is_empty() {
            return Err(Error::ShutdownTimedOut(stuck.join(", ")));
        }
        log::info!(
            "{}: shut down ({undelivered} undelivered, {failed} failed)",
            self.name
        );
        Ok(ShutdownReport {
            undelivered,
            failed,
            elapsed: started.elapsed(),
        })
    }
}

/// Membership's socket and settings: a UDP socket on the listener's address and port, and
/// the address members learn for this node (the advertised one, else the listen address,
/// which must then be a specific one). Membership needs a TCP listener: its socket is UDP
/// at the same address, and members gossip each other's IP addresses.
fn membership_setup(
    b: &Builder,
    config: &crate::net::IoConfig,
    local_addr: &Addr,
    peers: &HashMap<String, Addr>,
) -> Result<(mio::net::UdpSocket, crate::proto::MembershipSetup), Error> {
    let Some(local_addr) = local_addr.as_tcp() else {
        return Err(ConfigError::Address {
            setting: "membership",
            peer: None,
            problem: format!(
                "membership (or seeds) needs a TCP listen address, and {local_addr} is a Unix-domain socket: listen on TCP, or name the peers with Builder::peer"
            ),
        }
        .into());
    };
    let addr = match &b.advertise {
        Some(Ok(a)) => *a,
        _ if local_addr.ip().is_unspecified() => {
            return Err(ConfigError::Address {
                setting: "advertise",
                peer: None,
                problem: format!(
                    "membership announces the address members reach this node at, and {local_addr} (the listen address) is not one: call Builder::advertise with this host's address"
                ),
            }
            .into())
        }
        _ => local_addr,
    };
    let udp = std::net::UdpSocket::bind(local_addr)
        .and_then(|s| s.set_nonblocking(true).map(|()| s))
        .map_err(|source| Error::Listen {
            addr: Addr::Tcp(local_addr),
            source,
        })?;
    if config.proto.secret.is_none() {
        log::warn!(
            "{}: membership without a secret: anyone who can send a datagram to {addr} can \
             join the view or gossip members out of it; set Builder::secret on every member",
            config.proto.name
        );
    }
    let setup = crate::proto::MembershipSetup {
        config: b.membership_config(),
        addr,
        // The seeds, and the members configured by name (`Builder::peer`): a member that
        // knows one other by name joins through it (with TLS, the only way in: seeds are
        // refused, a dial by address naming no certificate).
        join: config
            .proto
            .seeds
            .iter()
            .chain(config.proto.seed_names.iter().flat_map(|(_, a)| a))
            .copied()
            .chain(peers.values().filter_map(Addr::as_tcp))
            .collect(),
        view: Arc::new(crate::sync::Mutex::new(crate::proto::MembersView::default())),
    };
    Ok((mio::net::UdpSocket::from_std(udp), setup))
}

/// Waits (at most 10 s) until the IO thread has handled every command sent before.
fn io_barrier(io: &IoShared, io_done: &Completion) {
    let done = Arc::new(Completion::default());
    io.command(Command::Barrier { done: done.clone() });
    let deadline = Instant::now() + Duration::from_secs(10);
    // Abandoned: the IO thread has stopped, so nothing is pending either.
    while done.wait_until(Some(
        (Instant::now() + Duration::from_millis(50)).min(deadline),
    )) == Outcome::Pending
    {
        if io_done.outcome() != Outcome::Pending || Instant::now() >= deadline {
            log::warn!("the IO thread did not confirm its pending commands");
            return;
        }
    }
}

/// What a stats snapshot is read from: the node's, or the IO thread's when it publishes
/// metrics.
struct StatsSources {
    name: SharedStr,
    peers: PeerMap,
    pool: Arc<Pool>,
    counters: Arc<NodeCounters>,
    io: Arc<IoShared>,
    events: Option<Arc<crate::events::EventQueue>>,
}

impl StatsSources {
    /// A snapshot of every counter.
    fn collect(&self) -> Stats {
        let peers: Vec<Arc<PeerShared>> = self.peers.read().values().cloned().collect();
        // One reading for every peer, on the clock the IO thread notes reads with.
        let now = self.io.clock.now();
        let mut out: Vec<PeerStats> = peers.iter().map(|p| peer_stats(p, now)).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        let c = &self.counters;
        let g = |a: &crate::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            node: self.name.to_string(),
            max_concurrent_deliverers: out
                .iter()
                .map(|p| p.max_concurrent_deliverers)
                .max()
                .unwrap_or(0),
            peers: out,
            pool: self.pool.stats(),
            oob_delivered: self.pool.oob_delivered().0,
            connections: ConnStats {
                accepted: g(&c.accepted),
                dialled: g(&c.dialled),
                dial_failures: g(&c.dial_failures),
                handshakes: g(&c.handshakes),
                refused: g(&c.refused),
                refused_cluster: g(&c.refused_cluster),
                refused_unknown: g(&c.refused_unknown),
                refused_version: g(&c.refused_version),
                name_conflicts: g(&c.name_conflicts),
                auth_failures: g(&c.auth_failures),
                handshake_timeouts: g(&c.handshake_timeouts),
                tie_breaks: g(&c.tie_breaks),
                protocol_errors: g(&c.protocol_errors),
                window_violations: g(&c.window_violations),
                read_pauses: g(&c.read_pauses),
                idle_timeouts: g(&c.idle_timeouts),
                refused_limit: g(&c.refused_limit),
                refused_per_source: g(&c.refused_per_source),
                displaced: g(&c.displaced),
                displaced_per_source: g(&c.displaced_per_source),
                pressure_timeouts: g(&c.pressure_timeouts),
                tls_failures: g(&c.tls_failures),
                timers: g(&c.timers),
                open: g(&c.open),
                established: g(&c.established),
                pending: g(&c.pending),
            },
            journal: *self.io.journal_stats.lock(),
            journal_failures: g(&c.journal_failures),
            events_dropped: self.events.as_ref().map_or(0, |q| q.dropped()),
            event_panics: self.events.as_ref().map_or(0, |q| q.panics()),
            idle: self.io.spin.read(),
        }
    }
}

fn peer_stats(p: &PeerShared, now: Instant) -> PeerStats {
    let c = &p.counters;
    // Read the outcomes before accepted: accepted is bumped first, so queued >= 0.
    let sent = Counters::get(&c.sent);
    let filtered = Counters::get(&c.filtered);
    let failed = Counters::get(&c.failed);
    let sent_bytes = Counters::get(&c.sent_bytes);
    let filtered_bytes = Counters::get(&c.filtered_bytes);
    let failed_bytes = Counters::get(&c.failed_bytes);
    let (accepted, accepted_bytes) = p.outbox.accepted();
    PeerStats {
        name: p.name.to_string(),
        state: p.state(),
        accepted,
        accepted_bytes,
        sent,
        sent_bytes,
        filtered,
        filtered_bytes,
        withdrawn: Counters::get(&c.withdrawn),
        failed,
        failed_bytes,
        expired: Counters::get(&c.expired),
        queued: accepted.saturating_sub(sent + filtered + failed),
        queued_bytes: accepted_bytes.saturating_sub(sent_bytes + filtered_bytes + failed_bytes),
        received: Counters::get(&c.received),
        received_bytes: Counters::get(&c.received_bytes),
        delivered: p.member.delivered(),
        delivered_bytes: p.member.delivered_bytes(),
        delivery_queued_bytes: p.member.queued_bytes(),
        unconsumed_bytes: p.credit.held(),
        unconsumed_peak: Counters::get(&c.held_peak),
        oob_delivered: p.oob.delivered(),
        duplicates: Counters::get(&c.duplicates),
        resent: Counters::get(&c.resent),
        connects: Counters::get(&c.connects),
        disconnects: Counters::get(&c.disconnects),
        undelivered: Counters::get(&c.undelivered),
        window: p.outbox.window().capacity(),
        available: p.outbox.window().available(),
        in_flight: p.outbox.window().in_flight(),
        blocked: p.outbox.window().blocked_time(),
        probes: Counters::get(&c.probes),
        unreliable_lost_bytes: p.outbox.returned(crate::peer::Return::Lost),
        max_concurrent_deliverers: p.member.max_concurrent(),
        max_concurrent_oob: p.oob.max_concurrent(),
        unacked: Counters::get(&c.unacked),
        rtt: c.rtt.smoothed(),
        rtt_last: c.rtt.last(),
        last_heard: c.heard.since(now),
        requests_in_flight: p.requests.in_flight(),
        replies: p.requests.answered(),
        late_replies: p.requests.late(),
    }
}

impl Node {
    /// The deadline of the shutdown a drop makes (see [`Node`]).
    pub const DROP_SHUTDOWN: Duration = Duration::from_secs(5);
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.shut.load(Ordering::Acquire) {
            return;
        }
        match self.shutdown(Self::DROP_SHUTDOWN) {
            Ok(r) if r.undelivered > 0 || r.failed > 0 => log::warn!(
                "{}: dropped without shutdown: shut down in {:?} with {} messages published \
                 and never acknowledged and {} never published (each reported to \
                 on_undelivered); call Node::shutdown to choose the deadline and get the report",
                self.name,
                r.elapsed,
                r.undelivered,
                r.failed
            ),
            Ok(r) => log::debug!(
                "{}: dropped without shutdown: shut down in {:?}, everything delivered",
                self.name,
                r.elapsed
            ),
            Err(e) => log::error!(
                "{}: dropped without shutdown: {e} (within {:?})",
                self.name,
                Self::DROP_SHUTDOWN
            ),
        }
    }
}
