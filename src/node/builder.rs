//! [`Builder`]: every setting of a node, checked at `start`.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};

use crate::addr::{Addr, SeedKind, ToAddr, ToSeed};
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;

use super::{ConfigError, Error, Node, Sender};
use crate::deliver::{Delivery, DeliveryRef, Handler, Inbox};
use crate::flow::MESSAGE_OVERHEAD;
use crate::journal::{FsyncPolicy, DEFAULT_SEGMENT_SIZE};
use crate::net::{IdleStrategy, IoConfig};
use crate::peer::{Outgoing, PeerInfo};
use crate::proto;
use crate::sync::Arc;

/// A callback told about messages that will never be delivered: the peer was removed or
/// the node shut down with them unacknowledged, or the peer restarted before acknowledging
/// them; or they were accepted and failed before they were ever sent — their ttl passed
/// ([`SendOptions::ttl`](crate::SendOptions::ttl)), they are larger than the peer's
/// handshake says it accepts (queued before that was known: once it is, such a send
/// fails at once), they are unreliable and the peer was not connected (journalling nodes),
/// or they were still queued when the peer was removed or the node shut down. Arguments:
/// the peer's name and the payloads, in send order.
///
/// With it, every message a send accepted is accounted for: delivered, or reported here
/// (per peer, what it is given adds up to [`PeerStats`](crate::PeerStats) `failed +
/// undelivered` less the replies among them, which those counters include). Not reported:
/// replies (`Delivery::reply`), messages the
/// [`outbound_filter`](Builder::outbound_filter) dropped, requests withdrawn because their
/// requester gave them up (both counted `filtered`), and unreliable messages lost with a
/// connection. A request reported here also fails its
/// [`PendingReply`](crate::PendingReply).
///
/// "Delivered" means the receiving node took the message in: a receiver acknowledges on
/// receipt, so without a journal a message it received and then lost in a crash before
/// its handler ran is neither delivered nor reported (a peer that restarts is a new
/// incarnation, and what it had acknowledged is not sent again). A journalling receiver
/// ([`Builder::journal`]) acknowledges only what it recorded as handled, which closes
/// that gap; docs/design.md, "What survives what", lists each case.
pub type UndeliveredFn = dyn Fn(&str, Vec<Bytes>) + Send + Sync;

/// Requests in flight to one peer, by default (`Builder::max_requests`).
const DEFAULT_MAX_REQUESTS: usize = 1024;

/// Delivery threads at least, by default: handlers may block, and one sender occupies
/// at most `1 + oob_concurrency` of them.
const MIN_POOL_THREADS: usize = 4;

/// The listen address of a node that does not call [`Builder::listen`].
const DEFAULT_LISTEN: ([u8; 4], u16) = ([127, 0, 0, 1], 0);

/// How long a member admitted at run time may stay disconnected before it is forgotten, by
/// default ([`Builder::forget_after`]).
const DEFAULT_FORGET_AFTER: Duration = Duration::from_secs(60);

/// Configures and starts a [`Node`].
///
/// ```no_run
/// # fn main() -> Result<(), cohort::Error> {
/// let node = cohort::Node::builder("alpha")
///     .cluster("demo")
///     .listen("127.0.0.1:0")
///     .peer("beta", "127.0.0.1:7001")
///     .window_bytes(4 << 20)
///     .on_message(|d| println!("{} sent {} bytes", d.from(), d.payload().len()))
///     .start()?;
/// node.send("beta", &b"hello"[..])?;
/// # Ok(()) }
/// ```
#[must_use = "a Builder does nothing until `start`"]
pub struct Builder {
    /// What the IO thread is given: the protocol's settings and the sockets' (buffer sizes,
    /// TLS). The setters write here, so an option of either lives in one place. What only
    /// `start` knows (the launch id, whether the node journals) and what follows from other
    /// settings (the receive window, the largest message, the per-source share of pending
    /// connections, the housekeeping tick) are filled in by
    /// [`io_config`](Builder::io_config); until then they are zero.
    pub(crate) io: IoConfig,
    // The node's own settings: its listener, its peers, the pool, the callbacks, the journal.
    pub(crate) listen: Result<Addr, String>,
    /// Whether [`listen`](Builder::listen) was called (otherwise `listen` is the default,
    /// `127.0.0.1:0`).
    pub(crate) listen_given: bool,
    pub(crate) peers: Vec<(String, Result<Addr, String>)>,
    /// Each seed as given.
    pub(crate) seeds: Vec<crate::addr::Seed>,
    /// Membership on or off as set (`None`: on when there are seeds).
    pub(crate) membership: Option<bool>,
    /// The membership protocol's probe interval (its other periods follow).
    pub(crate) membership_interval: Duration,
    /// The address members reach this node at (`None`: the listen address).
    pub(crate) advertise: Option<Result<SocketAddr, String>>,
    pub(crate) pool_threads: usize,
    /// Pool threads one sender's out-of-band messages may occupy at once (`None`: half
    /// the pool, at least one).
    pub(crate) oob_concurrency: Option<usize>,
    pub(crate) delivery_batch: usize,
    pub(crate) max_requests: usize,
    pub(crate) handler: Option<Handler>,
    pub(crate) undelivered: Option<Arc<UndeliveredFn>>,
    /// The membership event callback and how many events may wait for it.
    pub(crate) on_event: Option<EventCallback>,
    pub(crate) event_capacity: usize,
    pub(crate) journal: Option<JournalSettings>,
    /// How often the IO thread publishes metrics (zero: never).
    #[cfg(feature = "metrics")]
    pub(crate) metrics_interval: Duration,
    // The IO thread's settings whose default follows from others, as given; `io_config`
    // resolves them.
    /// The most this node holds for one peer (`None`: our own window).
    pub(crate) recv_window: Option<u64>,
    /// The largest message (`None`: the default of
    /// [`effective_max_message`](Builder::effective_max_message)).
    pub(crate) max_message: Option<usize>,
    /// The room a request reserves for its reply (`None`: see
    /// [`effective_max_reply`](Builder::effective_max_reply)).
    pub(crate) max_reply: Option<usize>,
    /// Pending connections one source may hold (`None`: a share of `max_pending`).
    pub(crate) pending_per_source: Option<usize>,
}

/// Where and how a node journals (see [`Builder::journal`]).
#[derive(Clone, Debug)]
pub(crate) struct JournalSettings {
    pub(crate) dir: PathBuf,
    pub(crate) fsync: FsyncPolicy,
    pub(crate) segment_size: u64,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.name())
            .field("cluster", &self.io.proto.cluster)
            .field("listen", &self.listen)
            .field("peers", &self.peers)
            .field("seeds", &self.seeds)
            .field("pool_threads", &self.pool_threads)
            .field("window", &self.io.proto.window)
            .field("tls", &self.io.tls.is_some())
            .field("secret", &self.io.proto.secret)
            .finish_non_exhaustive()
    }
}

/// The membership event callback as configured: [`Builder::on_event`]'s, or
/// [`Builder::on_event_with`]'s, which `start` gives the node's send handle.
#[derive(Clone)]
pub(crate) enum EventCallback {
    Plain(crate::events::EventFn),
    WithSender(EventWithSenderFn),
}

/// [`Builder::on_event_with`]'s callback.
pub(crate) type EventWithSenderFn = Arc<dyn Fn(crate::Event, &Sender) + Send + Sync>;

impl EventCallback {
    /// The callback the events queue calls; `node` is the node's send handle.
    pub(crate) fn bind(&self, node: &Sender) -> crate::events::EventFn {
        match self {
            EventCallback::Plain(f) => f.clone(),
            EventCallback::WithSender(f) => {
                let (f, node) = (f.clone(), node.fork());
                Arc::new(move |e| f(e, &node))
            }
        }
    }
}

/// A member, cluster or peer name (`setting`) is 1 to 255 bytes.
pub(crate) fn check_name(setting: &'static str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > crate::wire::MAX_NAME {
        return Err(ConfigError::Name {
            setting,
            name: name.to_owned(),
            problem: format!(
                "is {} bytes: a name must be 1 to {} bytes",
                name.len(),
                crate::wire::MAX_NAME
            ),
        });
    }
    Ok(())
}

fn resolve<A: ToAddr>(addr: A) -> Result<Addr, String> {
    let addr = addr.to_addr().map_err(|e| e.to_string())?;
    if let Addr::Unix(path) = &addr {
        crate::net::check_unix_path(path)?;
    }
    Ok(addr)
}

/// A TCP address (membership's: seeds and the advertised address).
fn resolve_tcp<A: ToSocketAddrs>(addr: A) -> Result<SocketAddr, String> {
    match addr.to_socket_addrs() {
        Ok(mut it) => it
            .next()
            .ok_or_else(|| "address resolved to nothing".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

impl Builder {
    pub(crate) fn new(name: &str) -> Builder {
        Builder {
            io: IoConfig {
                proto: proto::Config {
                    name: name.into(),
                    cluster: "default".to_owned(),
                    window: 4 << 20,
                    allow_unknown: false,
                    ack_threshold: 1024,
                    ack_delay: Duration::from_millis(20),
                    backoff_min: Duration::from_millis(20),
                    backoff_max: Duration::from_secs(2),
                    handshake_timeout: Duration::from_secs(5),
                    write_high_water: 256 * 1024,
                    outbound_filter: None,
                    probe_interval: Duration::from_millis(100),
                    block_warning: Duration::from_secs(5),
                    credit_on_idle: true,
                    heartbeat: Duration::from_secs(1),
                    idle_timeout: Duration::from_secs(5),
                    max_connections: 4096,
                    max_pending: 128,
                    secret: None,
                    forget_after: DEFAULT_FORGET_AFTER,
                    // Filled in by `io_config`.
                    seeds: Vec::new(),
                    seed_names: Vec::new(),
                    membership: None,
                    events: false,
                    launch_id: 0,
                    journalled: false,
                    recv_window: 0,
                    max_message: 0,
                    max_pending_per_source: 0,
                    tick: Duration::ZERO,
                },
                send_buffer: None,
                recv_buffer: None,
                idle: IdleStrategy::default(),
                tls: None,
                drop_datagrams: None,
                resolver: None,
            },
            listen: Ok(Addr::Tcp(SocketAddr::from(DEFAULT_LISTEN))),
            listen_given: false,
            peers: Vec::new(),
            seeds: Vec::new(),
            membership: None,
            membership_interval: Duration::from_secs(1),
            advertise: None,
            pool_threads: std::thread::available_parallelism()
                .map_or(MIN_POOL_THREADS, |n| n.get())
                .max(MIN_POOL_THREADS),
            oob_concurrency: None,
            delivery_batch: 256,
            max_requests: DEFAULT_MAX_REQUESTS,
            handler: None,
            undelivered: None,
            on_event: None,
            event_capacity: crate::events::DEFAULT_CAPACITY,
            journal: None,
            #[cfg(feature = "metrics")]
            metrics_interval: Duration::from_secs(1),
            recv_window: None,
            max_message: None,
            max_reply: None,
            pending_per_source: None,
        }
    }

    /// This member's name.
    pub(crate) fn name(&self) -> &str {
        &self.io.proto.name
    }

    /// What the IO thread is given: the settings as configured, with what `start` decided
    /// (`launch_id`, `journalled`) and what follows from other settings.
    pub(crate) fn io_config(&self, launch_id: u64, journalled: bool) -> IoConfig {
        let mut io = self.io.clone();
        let resolver = io.resolver.clone();
        let p = &mut io.proto;
        p.launch_id = launch_id;
        p.journalled = journalled;
        p.events = self.on_event.is_some();
        p.recv_window = self.recv_window.unwrap_or(p.window);
        p.max_message = self.effective_max_message();
        p.max_pending_per_source = self.effective_pending_per_source();
        p.seeds.clear();
        p.seed_names.clear();
        for seed in &self.seeds {
            match &seed.0 {
                SeedKind::Fixed(addrs) => p.seeds.extend(addrs.iter().copied()),
                SeedKind::Name(name) => {
                    // On the thread calling `start`: the IO thread never waits for a resolver.
                    let addrs = match crate::net::resolve_seed(resolver.as_ref(), name) {
                        Ok(addrs) => addrs,
                        Err(e) => {
                            log::warn!(
                                "{}: seed {name} did not resolve ({e}); resolved again while no member is reached",
                                p.name
                            );
                            Vec::new()
                        }
                    };
                    p.seed_names.push((name.clone(), addrs));
                }
                SeedKind::Invalid(_) => {}
            }
        }
        // Housekeeping often enough for probes and heartbeats: half the shorter, 5 to 50 ms.
        p.tick = (p.probe_interval / 2)
            .min(p.heartbeat / 2)
            .clamp(Duration::from_millis(5), Duration::from_millis(50));
        io
    }

    /// The cluster name (default `"default"`). Members of another cluster are refused.
    pub fn cluster(mut self, cluster: &str) -> Self {
        self.io.proto.cluster = cluster.to_owned();
        self
    }

    /// Address to listen on: a TCP address (port 0 picks an ephemeral port, see
    /// [`Node::local_addr`]) or, for members on one host, a Unix-domain socket
    /// ([`Addr::unix`]; see [`Addr`] for the forms taken).
    ///
    /// A node listens on one address. Its peers may be of either kind: a node listening on
    /// a Unix socket can dial TCP peers and the other way round; each peer is dialled at
    /// the address it is configured with, so a member is reached over the kind of socket
    /// it listens on. A Unix socket's file is created at start (one left by a process that
    /// died is removed first, if nothing listens on it; one a process listens on is never
    /// taken: [`Error::Listen`](crate::Error::Listen)), and removed when the node stops.
    /// Over a Unix socket the handshake, [`secret`](Builder::secret), TLS, recovery,
    /// admission and liveness are TCP's; only the socket's file permissions decide who
    /// may connect at all. Membership (and seeds) need a TCP listen address: a node on a
    /// Unix socket names its peers.
    ///
    /// The default is `127.0.0.1:0`: loopback only, on an ephemeral port, so **members on
    /// other machines cannot dial a node that never calls `listen`** (only its own dials
    /// connect it to them). A member of a cluster spanning machines listens on an address
    /// its peers can reach and that they are configured with, e.g. `.listen("0.0.0.0:7000")`
    /// or its own interface's address. Every node logs the address it listens on at start
    /// (`info`, through the [`log`](https://docs.rs/log) crate), and a node on the default
    /// address with a peer outside loopback logs a warning, once: at start for the peers
    /// configured, or when [`Node::add_peer`](crate::Node::add_peer) adds the first one.
    pub fn listen<A: ToAddr>(mut self, addr: A) -> Self {
        self.listen = resolve(addr);
        self.listen_given = true;
        self
    }

    /// A static member: its name and the address it listens on (TCP, or a Unix-domain
    /// socket's path: see [`Addr`]). It is dialled at start and redialled with jittered
    /// exponential backoff until it answers.
    pub fn peer<A: ToAddr>(mut self, name: &str, addr: A) -> Self {
        self.peers.push((name.to_owned(), resolve(addr)));
        self
    }

    /// A seed: an address where some member of the cluster listens, whose name this node
    /// need not know. It is dialled at start; whoever answers there (of this cluster,
    /// authenticated when a [`secret`](Builder::secret) is set, not this node itself)
    /// becomes a peer under the name it gives, dialled at that address again whenever its
    /// connection is lost — as if it had been configured with [`peer`](Builder::peer).
    /// Seeds that did not answer are dialled again, with backoff, whenever the node has no
    /// connection at all. Its own address among the seeds is skipped (so every member may be
    /// given one list).
    ///
    /// A host name (`"members.example:7000"`, `("members.example", 7000)`) is kept as a
    /// name: resolved at `start`, each address it gives a seed, and resolved again, with
    /// backoff and never on the IO thread, whenever the node reaches nobody — a DNS name
    /// listing the cluster's members (a Kubernetes headless service) finds whoever it lists
    /// then. A name that does not resolve at `start` is not an error (it is resolved again);
    /// a seed without a port is ([`ConfigError::Address`]).
    ///
    /// Seeds switch [`membership`](Builder::membership) on (unless it is set off): through
    /// the member at any seed this node learns every member of the cluster, and they learn
    /// it. Set off, a seed only makes the member answering there a peer.
    ///
    /// The member answering must accept members it does not know
    /// ([`allow_unknown_members`](Builder::allow_unknown_members)); with a secret only
    /// members holding it get in. Seeds cannot be combined with TLS: a TLS client
    /// verifies the certificate of the member it means to reach, and a seed names none;
    /// with TLS, name one member with [`peer`](Builder::peer): membership joins through it.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), cohort::Error> {
    /// let node = cohort::Node::builder("newcomer")
    ///     .secret(b"cluster secret")
    ///     .seed("10.0.0.5:7000")
    ///     .start()?;
    /// println!("{:?}", node.members());
    /// # Ok(()) }
    /// ```
    pub fn seed<A: ToSeed>(mut self, addr: A) -> Self {
        self.seeds.push(addr.to_seed());
        self
    }

    /// Not API: resolves seed names with `resolve` instead of the system's resolver (a
    /// name whose addresses change, for cohort's own tests). Built only with `--cfg
    /// cohort_internals`.
    #[cfg(cohort_internals)]
    #[doc(hidden)]
    pub fn resolve_seeds_with(
        mut self,
        resolve: impl Fn(&str) -> std::io::Result<Vec<SocketAddr>> + Send + Sync + 'static,
    ) -> Self {
        self.io.resolver = Some(Arc::new(resolve));
        self
    }

    /// Membership: this node keeps a view of the cluster's members with the SWIM protocol
    /// (failure detection by direct and indirect probes with suspicion, Lifeguard's
    /// refinements, gossip) and makes its members its peers — no peer list needed. On when
    /// [`seed`](Builder::seed)s are given (default: off without seeds; the first member of
    /// a cluster switches it on to be joinable).
    ///
    /// - A member joins through any seed, or any member configured by name
    ///   ([`peer`](Builder::peer): with TLS, where seeds are refused,
    ///   the way in): it learns every member, and every member learns it
    ///   ([`Event::MemberJoined`](crate::Event::MemberJoined)); each becomes a peer,
    ///   dialled at the address the view gives.
    /// - A member is declared failed only after its direct probe and indirect probes
    ///   through other members fail and a suspicion period passes (one broken link or one
    ///   busy process is not a dead member): it is then removed as
    ///   [`Node::remove_peer`](crate::Node::remove_peer) does, its unacknowledged messages
    ///   reported. A member that shuts down leaves cleanly. Peers configured by name
    ///   ([`peer`](Builder::peer)) stay configured whatever the view says.
    /// - The view: [`Node::members`](crate::Node::members); its changes reach
    ///   [`on_event`](Builder::on_event).
    /// - Packets travel as UDP datagrams on the listen address's port, MACed with the
    ///   [`secret`](Builder::secret) when one is set (set one: without it anyone who can
    ///   reach the port can join, and the node warns at start). Members it does not know
    ///   may dial in
    ///   ([`allow_unknown_members`](Builder::allow_unknown_members) is implied).
    /// - It needs an address members can reach: the listen address, or
    ///   [`advertise`](Builder::advertise) when listening on an unspecified one (`0.0.0.0`).
    ///
    /// Timing: [`membership_interval`](Builder::membership_interval).
    pub fn membership(mut self, on: bool) -> Self {
        self.membership = Some(on);
        self
    }

    /// The membership protocol's probe interval (default 1 s): each member probes one other
    /// this often; a probe waits half of it for an answer before asking others; gossip goes
    /// out every fifth of it; suspicion lasts 4·max(1, log10 N) intervals, up to six times
    /// that while nobody confirms it (so a failure is declared within roughly 5–30
    /// intervals, sooner in larger clusters that confirm it). Other periods (view
    /// exchanges, rejoining after a partition) scale with it.
    pub fn membership_interval(mut self, interval: Duration) -> Self {
        self.membership_interval = interval;
        self
    }

    /// The address other members reach this node at, announced by membership (default:
    /// the listen address; needed when listening on `0.0.0.0`).
    pub fn advertise<A: ToSocketAddrs>(mut self, addr: A) -> Self {
        self.advertise = Some(resolve_tcp(addr));
        self
    }

    /// Not API: a network fault for cohort's own tests — membership datagrams to or from
    /// an address `drop` returns `true` for are dropped (a cut between two members, a
    /// partition). Built only with `--cfg cohort_internals`.
    #[cfg(cohort_internals)]
    #[doc(hidden)]
    pub fn drop_membership_datagrams(
        mut self,
        drop: impl Fn(SocketAddr) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.io.drop_datagrams = Some(Arc::new(drop));
        self
    }

    /// Whether membership runs (set, or implied by seeds).
    pub(crate) fn membership_on(&self) -> bool {
        self.membership.unwrap_or(!self.seeds.is_empty())
    }

    /// The membership protocol's settings: memberlist's LAN defaults scaled by
    /// [`membership_interval`](Builder::membership_interval).
    pub(crate) fn membership_config(&self) -> crate::membership::Config {
        let d = crate::membership::Config::default();
        let scale = |x: Duration| {
            x.mul_f64(self.membership_interval.as_secs_f64() / d.probe_interval.as_secs_f64())
        };
        crate::membership::Config {
            probe_interval: self.membership_interval,
            probe_timeout: scale(d.probe_timeout),
            gossip_interval: scale(d.gossip_interval),
            gossip_to_the_dead: scale(d.gossip_to_the_dead),
            sync_interval: scale(d.sync_interval),
            rejoin_interval: scale(d.rejoin_interval),
            reap_after: scale(d.reap_after),
            remember_for: scale(d.remember_for),
            ..d
        }
    }

    /// Several seeds (see [`seed`](Builder::seed)).
    pub fn seeds<A: ToSeed>(mut self, addrs: impl IntoIterator<Item = A>) -> Self {
        for a in addrs {
            self = self.seed(a);
        }
        self
    }

    /// Delivery pool threads (default: available parallelism, at least 4).
    ///
    /// One sender occupies at most `1 + oob_concurrency` of them at once (one delivers its
    /// regular messages, at most its share its out-of-band ones), so even handlers that
    /// block on one sender leave the others `threads - 1 - oob_concurrency` threads: at
    /// least one with the defaults. Idle threads park and cost nothing.
    ///
    /// At least one: `start` refuses 0 with [`ConfigError::OutOfRange`] (setting
    /// `"pool_threads"`), since a node without a delivery thread could deliver nothing.
    ///
    /// ```
    /// use cohort::{ConfigError, Error};
    ///
    /// match cohort::Node::builder("alpha").pool_threads(0).start() {
    ///     Err(Error::Config(ConfigError::OutOfRange { setting: "pool_threads", min: 1, .. })) => {}
    ///     other => panic!("expected pool_threads out of range, got {other:?}"),
    /// }
    /// ```
    pub fn pool_threads(mut self, n: usize) -> Self {
        self.pool_threads = n;
        self
    }

    /// The most pool threads that deliver one sender's out-of-band messages at once: its
    /// fair share of the pool (default: half the pool's threads, at least one; at most the
    /// whole pool).
    ///
    /// Out-of-band messages are unordered, so several threads may run one sender's at once;
    /// this cap keeps an OOB flood, or a handler that blocks on one sender's OOB messages,
    /// from taking every thread. With `T` pool threads and the default share, one sender
    /// occupies at most `1 + max(1, T/2)` threads (its regular messages take at most one),
    /// and the rest serve the others.
    ///
    /// ```
    /// let b = cohort::Node::builder("alpha").pool_threads(8).oob_concurrency(2);
    /// # let _ = b;
    /// ```
    pub fn oob_concurrency(mut self, n: usize) -> Self {
        self.oob_concurrency = Some(n.max(1));
        self
    }

    /// Pool threads that may deliver one sender's out-of-band messages at once.
    pub(crate) fn effective_oob_concurrency(&self) -> usize {
        self.oob_concurrency
            .unwrap_or(self.pool_threads / 2)
            .clamp(1, self.pool_threads.max(1))
    }

    /// Most messages one sender's deliverer handles before yielding its pool thread to other
    /// senders (default 256).
    pub fn delivery_batch(mut self, n: usize) -> Self {
        self.delivery_batch = n;
        self
    }

    /// How the IO thread and idle delivery threads wait for work (default
    /// [`IdleStrategy::Adaptive`] with 50 µs): see [`IdleStrategy`].
    pub fn idle_strategy(mut self, idle: IdleStrategy) -> Self {
        self.io.idle = idle;
        self
    }

    /// The low-latency setting, `idle_strategy(IdleStrategy::Spin(spin))`: the IO thread
    /// and one idle delivery thread always poll for `spin` after work before they block, so
    /// that messages closer together than `spin` cross without a wake-up, whatever the
    /// load. The price is two busy cores per node for `spin` after traffic; on a machine
    /// with fewer cores than busy threads, bulk throughput falls (a fifth at 1 KiB with a
    /// 20 µs spin on 2 cores).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let node = cohort::Node::builder("trader")
    ///     .low_latency(Duration::from_micros(50))
    ///     .start()?;
    /// node.shutdown(Duration::from_secs(1))?;
    /// # Ok::<(), cohort::Error>(())
    /// ```
    pub fn low_latency(self, spin: Duration) -> Self {
        self.idle_strategy(IdleStrategy::Spin(spin))
    }

    /// Send window per peer in bytes (default 4 MiB): how much may be accepted for a peer
    /// and not yet consumed by its application. Each message costs its length plus 16
    /// bytes (so empty messages are flow-controlled too). A busy peer also keeps, for its
    /// next small messages, the buffers their acknowledged predecessors were encoded in, up
    /// to this window's worth (never more than its busiest moment held), let go once a
    /// tick finds it idle.
    pub fn window_bytes(mut self, bytes: u64) -> Self {
        self.io.proto.window = bytes;
        self
    }

    /// The receive window: the most window bytes of one peer's messages this node holds —
    /// received and not yet handled by the application, regular and out-of-band, each at
    /// its window cost (default: this node's own [`window_bytes`](Builder::window_bytes)).
    ///
    /// What a peer can make this node hold is bounded by this, whatever the peer does:
    ///
    /// - a peer's own send window (declared in its handshake) is enforced: a peer that
    ///   sends past it ignores flow control and is closed as a protocol error
    ///   (`ConnStats::window_violations`);
    /// - a peer whose window is larger than this is read only while it holds less: its
    ///   connection is paused (TCP pushes back on it) until the handler catches up, and
    ///   credit goes back to it in halves of this window. Its frames wait in the kernel
    ///   meanwhile, and the idle timeout does not count the pause as silence.
    ///
    /// Memory held per peer is then at most this window plus one message, plus the
    /// bookkeeping of each message held (about 100 bytes each: at most `recv_window / 16`
    /// of them, as every message costs at least 16 window bytes). Besides, the node keeps
    /// for its next reads the read buffers its handlers are done with, up to a receive
    /// window's bytes in all, and lets go at each housekeeping tick of those no read took
    /// since the last (a node with nothing in flight ticks only at its heartbeats).
    ///
    /// ```
    /// // Send with 16 MiB in flight per peer, but hold at most 4 MiB for any one peer.
    /// let b = cohort::Node::builder("alpha").window_bytes(16 << 20).recv_window(4 << 20);
    /// # let _ = b;
    /// ```
    pub fn recv_window(mut self, bytes: u64) -> Self {
        self.recv_window = Some(bytes);
        self
    }

    /// Largest message accepted (default: the smaller of 1 MiB and half the window less the
    /// per-message overhead). Must fit in half the window.
    pub fn max_message(mut self, bytes: usize) -> Self {
        self.max_message = Some(bytes);
        self
    }

    /// Whether members not configured here may connect (default `false`: they are refused
    /// and counted).
    pub fn allow_unknown_members(mut self, allow: bool) -> Self {
        self.io.proto.allow_unknown = allow;
        self
    }

    /// How long a member admitted at run time ([`allow_unknown_members`]) may stay
    /// disconnected before this node forgets it (default 60 s): it is then removed as
    /// [`Node::remove_peer`](crate::Node::remove_peer) would remove it — messages still
    /// queued for it fail, those it had not acknowledged are reported undelivered
    /// ([`on_undelivered`](Builder::on_undelivered)) — an [`Event::Forgotten`] is emitted,
    /// and [`broadcast`](crate::Sender::broadcast) no longer includes it. If it dials in
    /// again later it is admitted afresh, as a new member.
    ///
    /// The clock starts when its connection is lost (or its first handshake fails) and
    /// stops when it connects again. Members configured with [`peer`](Builder::peer) or
    /// [`Node::add_peer`](crate::Node::add_peer) are never forgotten. `Duration::MAX`
    /// never forgets.
    ///
    /// [`allow_unknown_members`]: Builder::allow_unknown_members
    /// [`Event::Forgotten`]: crate::Event::Forgotten
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// // A registry that accepts any member, and forgets one gone for ten seconds.
    /// let b = cohort::Node::builder("registry")
    ///     .allow_unknown_members(true)
    ///     .forget_after(Duration::from_secs(10));
    /// # let _ = b;
    /// ```
    pub fn forget_after(mut self, d: Duration) -> Self {
        self.io.proto.forget_after = d;
        self
    }

    /// Acks are sent once this many messages are unacknowledged (default 1024) or after
    /// [`ack_delay`](Builder::ack_delay), whichever comes first.
    pub fn ack_threshold(mut self, n: u64) -> Self {
        self.io.proto.ack_threshold = n.max(1);
        self
    }

    /// Longest an ack is held back (default 20 ms).
    pub fn ack_delay(mut self, d: Duration) -> Self {
        self.io.proto.ack_delay = d;
        self
    }

    /// Reconnect backoff bounds (default 20 ms to 2 s, jittered).
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.io.proto.backoff_min = min;
        self.io.proto.backoff_max = max.max(min);
        self
    }

    /// A connection that has not completed its handshake by then is closed (default 5 s).
    /// For accepted connections this deadline shrinks while more than half the pending
    /// slots are taken (see [`connection_limits`](Builder::connection_limits)); our own
    /// dials always have all of it.
    pub fn handshake_timeout(mut self, d: Duration) -> Self {
        self.io.proto.handshake_timeout = d;
        self
    }

    /// Bytes buffered per connection before publishing to it pauses (default 256 KiB).
    pub fn write_buffer(mut self, bytes: usize) -> Self {
        self.io.proto.write_high_water = bytes.max(1024);
        self
    }

    /// `SO_SNDBUF` / `SO_RCVBUF` for every connection (default: the OS's).
    pub fn socket_buffers(mut self, send: Option<usize>, recv: Option<usize>) -> Self {
        self.io.send_buffer = send;
        self.io.recv_buffer = recv;
        self
    }

    /// The largest reply this node's requests accept: each request reserves that much room
    /// for its reply in the peer's send window (its window cost is its own plus this, given
    /// back when the peer has consumed it). So a replier takes in no more requests than its
    /// receive window holds with their replies' room, a reply never waits for the window,
    /// and two members requesting each other cannot deadlock. A larger reply fails at the
    /// replier with [`Error::ReplyTooLarge`]. Default: 64 KiB, or a quarter of the send window if that is
    /// less, and at most `max_message` less the reply's 8-byte id.
    pub fn max_reply(mut self, bytes: usize) -> Self {
        self.max_reply = Some(bytes);
        self
    }

    /// The room each request reserves for its reply (see [`max_reply`](Builder::max_reply)).
    pub(crate) fn effective_max_reply(&self) -> u32 {
        let max = self
            .max_reply
            .unwrap_or_else(|| (64 * 1024).min(self.io.proto.window as usize / 4))
            .min(
                self.effective_max_message()
                    .saturating_sub(crate::wire::REQUEST_ID_BYTES),
            );
        max.min(u32::MAX as usize) as u32
    }

    /// Requests this node may have waiting for their reply to one peer at once (default
    /// 1024): a request beyond it waits until an earlier one is answered, fails or is given
    /// up (within its timeout, for [`Sender::request`](crate::Sender::request)). What
    /// bounds the replies themselves is the room each request reserves for its reply in
    /// the window ([`max_reply`](Builder::max_reply)).
    pub fn max_requests(mut self, n: usize) -> Self {
        self.max_requests = n.max(1);
        self
    }

    /// The message handler, called on a pool thread. Regular messages from one sender are
    /// handed to it one at a time, in order; different senders run in parallel. Credit
    /// returns to the sender once it returns. A panic in it is caught, logged and counted.
    pub fn on_message<F>(mut self, f: F) -> Self
    where
        F: Fn(Delivery) + Send + Sync + 'static,
    {
        self.handler = Some(Handler::owned(f));
        self
    }

    /// The message handler, called on a pool thread with each message lent for the call:
    /// [`on_message`](Builder::on_message) without taking the message, for handlers that
    /// read it in place. The regular messages one read brought are lent out of that read's
    /// bytes: nothing is copied or counted to hand one over (a [`Delivery`] of its own holds
    /// a reference count, taken and dropped for each message, to what the messages of its
    /// run share: the sender's name, the node and the bytes they came in); what must
    /// outlive the call is kept with
    /// [`DeliveryRef::to_delivery`] or [`DeliveryRef::payload_bytes`]. Everything else is as for `on_message`, which it
    /// replaces (a node has one handler): order, one deliverer per sender, credit returned
    /// as it returns, panics caught, requests answered with [`DeliveryRef::reply`] (one left
    /// unanswered when the call returns fails its requester at once, unless a kept
    /// `Delivery` may still answer it).
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    ///
    /// let total = Arc::new(AtomicU64::new(0));
    /// let sum = total.clone();
    /// let builder = cohort::Node::builder("beta").on_message_ref(move |m| {
    ///     // Read where it lies; nothing to drop.
    ///     if let Some(&first) = m.payload().first() {
    ///         sum.fetch_add(u64::from(first), Ordering::Relaxed);
    ///     }
    /// });
    /// # let _ = builder;
    /// ```
    pub fn on_message_ref<F>(mut self, f: F) -> Self
    where
        F: Fn(DeliveryRef<'_>) + Send + Sync + 'static,
    {
        self.handler = Some(Handler::Lent(Arc::new(f)));
        self
    }

    /// Called with messages that will never be delivered (see [`UndeliveredFn`]). It runs on
    /// the IO thread: keep it short, and do not call `remove_peer` or `shutdown` from it
    /// (they wait for the IO thread). A panic in it is caught and logged.
    pub fn on_undelivered<F>(mut self, f: F) -> Self
    where
        F: Fn(&str, Vec<Bytes>) + Send + Sync + 'static,
    {
        self.undelivered = Some(Arc::new(f));
        self
    }

    /// Called with each membership [`Event`](crate::Event): a peer connected, disconnected,
    /// restarted as a new incarnation, a handshake refused, a member removed or forgotten.
    ///
    /// It never runs on the IO thread: the IO thread queues events, and one delivery pool
    /// thread at a time hands them to `f`, in the order they happened. So `f` may block
    /// or call into the node (`send`, `stats`, `remove_peer`), at the price of a pool
    /// thread while it does. At most [`event_capacity`](Builder::event_capacity) events
    /// (default 4096) wait for it; beyond that, newer events are dropped, counted in
    /// [`Stats::events_dropped`](crate::Stats::events_dropped) and a warning is logged once
    /// per overflow. A panic in it is caught, logged and counted in
    /// [`Stats::event_panics`](crate::Stats::event_panics) (metric
    /// `cohort_event_panics_total`); the next event is delivered. Without it, no event is made.
    /// With [`start_with_inbox`](Builder::start_with_inbox) there is no pool: `f` runs on
    /// the thread that calls the inbox's `recv` methods, between two messages.
    ///
    /// ```
    /// use std::sync::{mpsc, Mutex};
    /// use cohort::Event;
    ///
    /// let (tx, rx) = mpsc::channel();
    /// let tx = Mutex::new(tx);
    /// let beta = cohort::Node::builder("beta").allow_unknown_members(true).start()?;
    /// let alpha = cohort::Node::builder("alpha")
    ///     .peer("beta", beta.local_addr())
    ///     .on_event(move |e| { let _ = tx.lock().unwrap().send(e); })
    ///     .start()?;
    /// match rx.recv_timeout(std::time::Duration::from_secs(10)) {
    ///     Ok(Event::Connected { peer, .. }) => assert_eq!(peer, "beta"),
    ///     other => panic!("{other:?}"),
    /// }
    /// alpha.shutdown(std::time::Duration::from_secs(5))?;
    /// beta.shutdown(std::time::Duration::from_secs(5))?;
    /// # Ok::<(), cohort::Error>(())
    /// ```
    pub fn on_event<F>(mut self, f: F) -> Self
    where
        F: Fn(crate::Event) + Send + Sync + 'static,
    {
        self.on_event = Some(EventCallback::Plain(Arc::new(f)));
        self
    }

    /// Like [`on_event`](Builder::on_event), with the node's send handle: `f` can send,
    /// request or reply to whom the event is about (greet a member on
    /// [`Event::Connected`](crate::Event::Connected), hand its work elsewhere on
    /// [`Event::Removed`](crate::Event::Removed)), as a message handler can with
    /// [`Delivery::sender`]. Runs where `on_event`'s callback runs, one event at a time in
    /// order, with the same bound; the two replace each other (the last one set is
    /// called). As in a message handler, send with [`Sender::try_send`] (a full window
    /// hands the payload back) rather than block the pool thread.
    ///
    /// ```
    /// use std::time::Duration;
    /// use cohort::Event;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let (beta, inbox) = cohort::Node::builder("beta").allow_unknown_members(true).start_with_inbox()?;
    /// let alpha = cohort::Node::builder("alpha")
    ///     .peer("beta", beta.local_addr())
    ///     .on_event_with(|e, node| {
    ///         if let Event::Connected { peer, .. } = e {
    ///             let _ = node.try_send(&peer, format!("hello {peer}, {} here", node.name()));
    ///         }
    ///     })
    ///     .start()?;
    /// let hello = inbox.recv_timeout(Duration::from_secs(10))?;
    /// assert_eq!(hello.payload(), b"hello beta, alpha here");
    /// # alpha.shutdown(Duration::from_secs(5))?;
    /// # beta.shutdown(Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    pub fn on_event_with<F>(mut self, f: F) -> Self
    where
        F: Fn(crate::Event, &Sender) + Send + Sync + 'static,
    {
        self.on_event = Some(EventCallback::WithSender(Arc::new(f)));
        self
    }

    /// Feature `metrics`: how often the node publishes its counters and gauges through the
    /// [`metrics`](https://docs.rs/metrics) facade (default 1 s; `Duration::ZERO` turns it
    /// off). The IO thread takes a [`Stats`](crate::Stats) snapshot between two turns and
    /// sets every metric to its current value (`Counter::absolute`, `Gauge::set`), so
    /// sending, receiving and delivering pay nothing for it; a recorder sees values at most
    /// this old, and once more the last ones as the node shuts down. Install the recorder
    /// (an exporter) before starting the node. Metrics are named `cohort_…`, labelled
    /// `node` (this member) and, per peer, `peer`; every one of them — name, kind, unit,
    /// labels, meaning — is listed in [`docs/metrics.md`](https://docs.rs/crate/cohort-net/latest/source/docs/metrics.md).
    #[cfg(feature = "metrics")]
    pub fn metrics_interval(mut self, every: Duration) -> Self {
        self.metrics_interval = every;
        self
    }

    /// How many membership events may wait for the [`on_event`](Builder::on_event)
    /// callback (default 4096, at least 1); newer ones are dropped and counted
    /// ([`Stats::events_dropped`](crate::Stats::events_dropped)).
    pub fn event_capacity(mut self, n: usize) -> Self {
        self.event_capacity = n.max(1);
        self
    }

    /// A filter consulted by the IO thread right before each message is published to a
    /// peer, so it sees the peer as it is at that moment (say, a peer that announced after the
    /// message was queued that it no longer takes some kind of message). A message it rejects
    /// gives its window permits back, gets no sequence number, is not counted as sent and is
    /// counted `filtered`. It must be fast and must not block; a panic in it drops the message
    /// and is logged.
    ///
    /// ```
    /// let b = cohort::Node::builder("alpha")
    ///     .outbound_filter(|peer: &cohort::PeerInfo<'_>, msg: &cohort::Outgoing| {
    ///         !(peer.name == "legacy" && msg.payload().starts_with(b"v2:"))
    ///     });
    /// # let _ = b;
    /// ```
    pub fn outbound_filter<F>(mut self, f: F) -> Self
    where
        F: Fn(&PeerInfo<'_>, &Outgoing) -> bool + Send + Sync + 'static,
    {
        self.io.proto.outbound_filter = Some(Arc::new(f));
        self
    }

    /// A sender parked this long on an empty window makes the IO thread send the peer a
    /// credit probe, answered with every byte of credit it holds (default 100 ms).
    pub fn probe_interval(mut self, d: Duration) -> Self {
        self.io.proto.probe_interval = d.max(Duration::from_millis(1));
        self
    }

    /// A sender parked this long is logged at `warn`, once per blocked episode, with the
    /// peer, window, bytes in flight and how long (default 5 s).
    pub fn block_warning(mut self, d: Duration) -> Self {
        self.io.proto.block_warning = d;
        self
    }

    /// Whether the receiver returns credit below half a window once a sender's queue has
    /// drained (default `true`, within one housekeeping tick). With `false`, credit returns
    /// only in halves of the window and in answer to probes, as in JGroups' UFC.
    pub fn credit_on_idle(mut self, on: bool) -> Self {
        self.io.proto.credit_on_idle = on;
        self
    }

    /// Failure detection: a heartbeat goes out on a connection that has written nothing
    /// for `heartbeat` (traffic suppresses it), and a connection that has read nothing for
    /// `idle_timeout` is closed and its peer redialled (defaults 1 s and 5 s). The timeout
    /// should span several heartbeats. A node with nothing in flight (nothing queued,
    /// unacknowledged, uncredited or waiting in its handlers' queues) looks at its
    /// connections only when a heartbeat or a timeout is due, so a quiet node's IO thread
    /// wakes a few times a heartbeat per connection rather than at every housekeeping tick.
    pub fn heartbeat(mut self, heartbeat: Duration, idle_timeout: Duration) -> Self {
        self.io.proto.heartbeat = heartbeat.max(Duration::from_millis(1));
        self.io.proto.idle_timeout = idle_timeout.max(self.io.proto.heartbeat);
        self
    }

    /// Limits on what connecting strangers can make us hold: at most `total` connections
    /// open, and at most `pending` accepted connections still in their handshake — with a
    /// [`secret`](Builder::secret), not yet authenticated (defaults 4096 and 128). Strangers
    /// filling these limits cannot keep members out:
    ///
    /// - **per source**: one source address may hold at most a share of the pending
    ///   connections (default `pending / 4`, at least 1; see
    ///   [`pending_per_source`](Builder::pending_per_source)); a new connection from an
    ///   address holding its share displaces that address's oldest pending connection
    ///   (`ConnStats::displaced_per_source`, and `displaced`), so strangers sharing a
    ///   member's address cannot keep it out: the member's handshake, which takes a round
    ///   trip, is the youngest. Beyond the share, connections accepted in one burst with
    ///   all those the address holds are closed at once (`ConnStats::refused_per_source`,
    ///   and `refused_limit`);
    /// - **displacement**: when `pending` connections are pending (or `total` are open), a
    ///   new connection is not refused: it displaces the oldest pending connection of the
    ///   source address holding the most (among addresses holding as many, the one whose
    ///   oldest connection is oldest), counted in `ConnStats::displaced`. A flood from one
    ///   address displaces only its own connections; a member's handshake, which takes a
    ///   round trip, is young and from an address holding few. Only when nothing is pending
    ///   (every connection is established or our own dial) is a connection over `total`
    ///   refused (`ConnStats::refused_limit`);
    /// - **pressure**: while more than half the pending slots are taken, the handshake
    ///   deadline of accepted connections shrinks from
    ///   [`handshake_timeout`](Builder::handshake_timeout) (`t`) to
    ///   `t × 2 × free slots / pending`, never below `t / 10` nor 100 ms (nor above `t`):
    ///   5 s when half full, 2.5 s when three quarters full, 500 ms when full, with the
    ///   default 5 s. A connection past it is closed and counted in
    ///   `ConnStats::handshake_timeouts` and `pressure_timeouts`.
    ///
    /// Established members and our own dials are never displaced, refused or hurried by
    /// any of this. What is shed is logged per connection at `debug`, and summed up in a
    /// `warn` at most every 10 s. Handshake frames are bounded by the handshake's size,
    /// not by `max_message`.
    ///
    /// A flood from many addresses at once (more than `pending` of them within a
    /// handshake's round trip), or from the member's own address (more than its share
    /// within that round trip), can still displace a member's handshake; the member
    /// redials. A connection its dialler closed before it was accepted is dropped unjudged:
    /// a connect/close storm takes no slot.
    pub fn connection_limits(mut self, total: usize, pending: usize) -> Self {
        self.io.proto.max_connections = total.max(1);
        self.io.proto.max_pending = pending.max(1);
        self
    }

    /// How many pending (not yet established) accepted connections one source address may
    /// hold (default: a quarter of the `pending` limit of
    /// [`connection_limits`](Builder::connection_limits), at least 1; clamped to 1 ..=
    /// `pending`), so one host cannot take every pending slot. A new connection from an
    /// address holding its share displaces that address's oldest pending connection
    /// (counted in `ConnStats::displaced_per_source`): strangers behind a member's address
    /// make room for the member rather than keep it out. A burst from one address beyond
    /// its share, taken in at one instant, is closed at once instead
    /// (`ConnStats::refused_per_source`). IPv4 addresses and IPv6 addresses count one by
    /// one (an IPv4-mapped IPv6 address as its IPv4 address).
    ///
    /// Raise it when many members share one address (behind NAT, or many members on one
    /// host) and may dial this one all at once, within a handshake's round trip: the
    /// members over it displace each other and redial with backoff.
    pub fn pending_per_source(mut self, n: usize) -> Self {
        self.pending_per_source = Some(n);
        self
    }

    /// The per-source share of pending connections in effect.
    pub(crate) fn effective_pending_per_source(&self) -> usize {
        self.pending_per_source
            .unwrap_or_else(|| {
                crate::proto::admission::default_per_source(self.io.proto.max_pending)
            })
            .clamp(1, self.io.proto.max_pending)
    }

    /// Journals reliable messages and delivery progress in `dir` (created if missing), so
    /// that they survive a restart of this process: the **durable outbox**. Off by default.
    ///
    /// With the journal on:
    ///
    /// - every reliable message is recorded (with its peer and sequence number) before it
    ///   is published, and as soon as the IO thread takes it from the send queue, connected
    ///   or not; acknowledgements retire it. After a restart, [`Node`](crate::Node) resends
    ///   what its peers lack, continuing each stream's sequence numbers: this member keeps
    ///   its launch id (kept in the journal), so its peers continue the streams too.
    /// - the receiver records, per sender, how far its handler has returned, and
    ///   acknowledges (and returns credit for) only what it has recorded. A crash may
    ///   therefore **deliver again** the messages handled after the last record: delivery
    ///   is at-least-once across crashes, and [`Delivery::seq`](crate::Delivery::seq) tells
    ///   a redelivery apart (per sender, a sequence number at or below the highest one
    ///   already handled).
    /// - an unreliable message for a disconnected peer fails at once (counted `failed`)
    ///   instead of waiting for a connection ahead of reliable ones;
    /// - nothing that `send` accepted is lost once the IO thread has journalled it and the
    ///   [fsync policy](Builder::journal_fsync) has run; [`Node::sync_journal`](crate::Node::sync_journal)
    ///   waits for exactly that.
    ///
    /// Without the journal, the guarantees of recovery across reconnects hold (exactly once,
    /// in order, while both processes live). One directory per member: the journal checks
    /// the member and cluster names in every segment and refuses another's. Two processes
    /// must never open the same directory at once (nothing locks it).
    ///
    /// ```no_run
    /// use cohort::{FsyncPolicy, Node};
    /// use std::time::Duration;
    ///
    /// let node = Node::builder("alpha")
    ///     .peer("beta", "127.0.0.1:7001")
    ///     .journal("/var/lib/myapp/alpha-journal")
    ///     .journal_fsync(FsyncPolicy::Interval(Duration::from_millis(5)))
    ///     .start()?;
    /// node.send("beta", &b"survives a restart"[..])?;
    /// node.sync_journal(Duration::from_secs(1))?; // on disk now
    /// # Ok::<(), cohort::Error>(())
    /// ```
    pub fn journal(mut self, dir: impl Into<PathBuf>) -> Self {
        let prev = self.journal.take();
        self.journal = Some(JournalSettings {
            dir: dir.into(),
            fsync: prev.as_ref().map_or(FsyncPolicy::EveryBatch, |j| j.fsync),
            segment_size: prev.map_or(DEFAULT_SEGMENT_SIZE, |j| j.segment_size),
        });
        self
    }

    /// When journalled records are forced to disk (default [`FsyncPolicy::EveryBatch`]: one
    /// fsync per group of records the IO thread writes together). Only with
    /// [`journal`](Builder::journal).
    pub fn journal_fsync(mut self, policy: FsyncPolicy) -> Self {
        self.journal_settings().fsync = policy;
        self
    }

    /// The size of the journal's preallocated segment files (default 16 MiB; from 8 KiB to
    /// 2 GiB, else `start` fails with [`ConfigError::OutOfRange`]). Only with
    /// [`journal`](Builder::journal).
    pub fn journal_segment_size(mut self, bytes: u64) -> Self {
        self.journal_settings().segment_size = bytes;
        self
    }

    fn journal_settings(&mut self) -> &mut JournalSettings {
        self.journal.get_or_insert_with(|| JournalSettings {
            dir: PathBuf::new(),
            fsync: FsyncPolicy::EveryBatch,
            segment_size: DEFAULT_SEGMENT_SIZE,
        })
    }

    /// Runs every connection over TLS (feature `tls`): this member presents the
    /// certificate of `config` and accepts only peers whose certificates chain to its CA
    /// and name the member they claim to be (see [`crate::tls`]). Member names must then
    /// be valid DNS names, and this member's certificate must be valid for its own name;
    /// [`start`](Builder::start) checks both and fails with [`Error::Config`] otherwise.
    /// Every member of the cluster must use TLS: a plain connection to a TLS member is
    /// refused (counted in [`ConnStats::tls_failures`](crate::ConnStats::tls_failures)).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), cohort::Error> {
    /// let tls = cohort::tls::TlsConfig::from_pem_files("ca.pem", "alpha.pem", "alpha.key")?;
    /// let node = cohort::Node::builder("alpha")
    ///     .tls(tls)
    ///     .peer("beta", "10.0.0.2:7000")
    ///     .start()?;
    /// # let _ = node;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls(mut self, config: crate::tls::TlsConfig) -> Self {
        self.io.tls = Some(config);
        self
    }

    /// With TLS: member names are certificate DNS names, and our certificate names us.
    #[cfg(feature = "tls")]
    fn validate_tls(&self) -> Result<(), Error> {
        let Some(tls) = &self.io.tls else {
            return Ok(());
        };
        let names = std::iter::once(("name", self.name()))
            .chain(self.peers.iter().map(|(n, _)| ("peer", n.as_str())));
        for (setting, name) in names {
            crate::tls::server_name(name).map_err(|problem| ConfigError::Name {
                setting,
                name: name.to_owned(),
                problem,
            })?;
        }
        tls.leaf_names(self.name()).map_err(|problem| {
            Error::Config(ConfigError::Certificate {
                member: self.name().to_owned(),
                problem,
            })
        })
    }

    /// A shared secret that authenticates every connection (default: none). Each handshake
    /// becomes a challenge–response: both sides send a fresh random nonce and prove they
    /// know the secret with an HMAC-SHA-256 over the whole handshake, so the secret never
    /// crosses the wire and a recorded handshake cannot be replayed. A peer without the
    /// secret, with another one, or with one when this node has none, is refused before
    /// anything else happens on its connection: the connection is closed with a logged
    /// warning and counted in `ConnStats::auth_failures`. Every member of the cluster
    /// needs the same secret; use at least 32 random bytes. An empty secret is refused at
    /// [`start`](Builder::start).
    ///
    /// This authenticates the handshake, not each message: it keeps strangers out, but
    /// does not encrypt traffic or protect an established connection from an attacker on
    /// the network path (use TLS for that).
    ///
    /// ```
    /// # fn main() -> Result<(), cohort::Error> {
    /// let secret = b"a 32-byte cluster secret, random";
    /// let beta = cohort::Node::builder("beta").cluster("demo").secret(secret).start()?;
    /// let alpha = cohort::Node::builder("alpha")
    ///     .cluster("demo")
    ///     .secret(secret)
    ///     .peer("beta", beta.local_addr())
    ///     .start()?;
    /// alpha.send("beta", &b"hello"[..])?;
    /// # alpha.shutdown(std::time::Duration::from_secs(5))?;
    /// # beta.shutdown(std::time::Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    pub fn secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.io.proto.secret = Some(crate::proto::Secret::new(secret.as_ref()));
        self
    }

    /// The effective maximum message size.
    pub(crate) fn effective_max_message(&self) -> usize {
        let half = (self.io.proto.window / 2).saturating_sub(MESSAGE_OVERHEAD) as usize;
        self.max_message.unwrap_or_else(|| half.min(1 << 20))
    }

    pub(crate) fn validate(&self) -> Result<(Addr, HashMap<String, Addr>), Error> {
        if let Some(j) = &self.journal {
            if j.dir.as_os_str().is_empty() {
                return Err(ConfigError::NoJournal {
                    setting: "journal_fsync or journal_segment_size",
                }
                .into());
            }
            let sizes = crate::journal::MIN_SEGMENT_SIZE..=crate::journal::MAX_SEGMENT_SIZE;
            if !sizes.contains(&j.segment_size) {
                return Err(ConfigError::OutOfRange {
                    setting: "journal_segment_size",
                    value: j.segment_size,
                    min: *sizes.start(),
                    max: *sizes.end(),
                }
                .into());
            }
        }
        check_name("name", self.name())?;
        check_name("cluster", &self.io.proto.cluster)?;
        if self.pool_threads == 0 {
            return Err(ConfigError::OutOfRange {
                setting: "pool_threads",
                value: 0,
                min: 1,
                max: u64::MAX,
            }
            .into());
        }
        if self.io.proto.secret.as_ref().is_some_and(|s| s.is_empty()) {
            return Err(ConfigError::EmptySecret.into());
        }
        // The smallest window holds two empty messages; the largest is what a receiver
        // accounts for.
        let windows = 2 * (MESSAGE_OVERHEAD + 1)..=crate::flow::MAX_WINDOW;
        let out_of_range = |setting, value: u64, max: u64| ConfigError::OutOfRange {
            setting,
            value,
            min: 0,
            max,
        };
        if !windows.contains(&self.io.proto.window) {
            return Err(ConfigError::OutOfRange {
                setting: "window_bytes",
                value: self.io.proto.window,
                min: *windows.start(),
                max: *windows.end(),
            }
            .into());
        }
        if let Some(w) = self.recv_window {
            if !windows.contains(&w) {
                return Err(ConfigError::OutOfRange {
                    setting: "recv_window",
                    value: w,
                    min: *windows.start(),
                    max: *windows.end(),
                }
                .into());
            }
        }
        let half = self.io.proto.window / 2;
        // A message and its overhead fit in half the window (or it could never be sent),
        // and its frame's length in the wire format's.
        let max = self.effective_max_message() as u64;
        let max_allowed = half
            .saturating_sub(MESSAGE_OVERHEAD)
            .min(u64::from(u32::MAX) - 64);
        if max == 0 || max > max_allowed {
            return Err(ConfigError::OutOfRange {
                setting: "max_message",
                value: max,
                min: 1,
                max: max_allowed,
            }
            .into());
        }
        // A request (its header, overhead and room for its reply) fits in half the window.
        let reply = u64::from(self.effective_max_reply());
        let request = crate::wire::REQUEST_HEADER_BYTES as u64 + MESSAGE_OVERHEAD;
        let reply_allowed = half.saturating_sub(request);
        if reply + request > half {
            return Err(out_of_range("max_reply", reply, reply_allowed).into());
        }
        #[cfg(feature = "tls")]
        self.validate_tls()?;
        for seed in &self.seeds {
            let problem = match &seed.0 {
                SeedKind::Invalid(problem) => problem.clone(),
                SeedKind::Fixed(a) if a.is_empty() => "no address".to_string(),
                _ => continue,
            };
            return Err(ConfigError::Address {
                setting: "seed",
                peer: None,
                problem: format!("{}: {problem}", seed.given()),
            }
            .into());
        }
        if let Some(Err(problem)) = &self.advertise {
            return Err(ConfigError::Address {
                setting: "advertise",
                peer: None,
                problem: problem.clone(),
            }
            .into());
        }
        if self.membership_on()
            && (self.membership_interval < Duration::from_millis(10)
                || self.membership_interval > Duration::from_secs(3600))
        {
            return Err(ConfigError::OutOfRange {
                setting: "membership_interval",
                value: u64::try_from(self.membership_interval.as_millis()).unwrap_or(u64::MAX),
                min: 10,
                max: 3_600_000,
            }
            .into());
        }
        #[cfg(feature = "tls")]
        if self.io.tls.is_some() && !self.seeds.is_empty() {
            return Err(ConfigError::SeedsWithTls.into());
        }
        let listen = self
            .listen
            .clone()
            .map_err(|problem| ConfigError::Address {
                setting: "listen",
                peer: None,
                problem,
            })?;
        let mut peers = HashMap::new();
        for (name, addr) in &self.peers {
            check_name("peer", name)?;
            if *name == self.name() {
                return Err(ConfigError::Name {
                    setting: "peer",
                    name: name.clone(),
                    problem: "is this node's own name".into(),
                }
                .into());
            }
            let addr = addr.clone().map_err(|problem| ConfigError::Address {
                setting: "peer",
                peer: Some(name.clone()),
                problem,
            })?;
            if peers.insert(name.clone(), addr).is_some() {
                return Err(Error::PeerExists(name.clone()));
            }
        }
        Ok((listen, peers))
    }

    /// The warning for a node left on the default, loopback-only listen address while
    /// `peers` names members outside loopback, which cannot dial it; `None` if there is
    /// nothing to warn about.
    pub(crate) fn loopback_listen_warning(
        &self,
        listen: &Addr,
        peers: &HashMap<String, Addr>,
    ) -> Option<String> {
        if self.listen_given || !listen.is_local() {
            return None;
        }
        let mut remote: Vec<String> = peers
            .iter()
            .filter(|(_, addr)| !addr.is_local())
            .map(|(name, addr)| format!("'{name}' at {addr}"))
            .collect();
        if remote.is_empty() {
            return None;
        }
        remote.sort();
        Some(loopback_warning(self.name(), listen, &remote.join(", ")))
    }

    /// Whether this node listens on the default, loopback-only address (not given with
    /// `listen`), so that peers outside loopback, configured now or added later, cannot
    /// dial it.
    pub(crate) fn default_loopback_listen(&self, listen: &Addr) -> bool {
        !self.listen_given && listen.is_local()
    }

    /// Binds the listener, starts the IO thread and the delivery pool, and dials the
    /// configured peers.
    pub fn start(self) -> Result<Node, Error> {
        Node::start(self, false).map(|(node, _pool)| node)
    }

    /// Like [`start`](Builder::start), but the application takes the messages on its own
    /// thread from the returned [`Inbox`] instead of a handler on pool threads (no pool is
    /// started). With no hop to a pool thread, it is the lowest-latency way to receive.
    /// Fails with [`Error::Config`] if a handler was set
    /// ([`on_message`](Builder::on_message) or [`on_message_ref`](Builder::on_message_ref)).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), cohort::Error> {
    /// let (node, inbox) = cohort::Node::builder("beta").listen("127.0.0.1:7001").start_with_inbox()?;
    /// for d in &inbox {
    ///     println!("{} bytes from {}", d.payload().len(), d.from());
    /// }
    /// # drop(node);
    /// # Ok(()) }
    /// ```
    pub fn start_with_inbox(self) -> Result<(Node, Inbox), Error> {
        if self.handler.is_some() {
            return Err(ConfigError::InboxWithHandler.into());
        }
        let (node, pool) = Node::start(self, true)?;
        Ok((node, Inbox::new(pool)))
    }
}

/// The warning of node `name`, on the default loopback address `listen`, with the peers
/// `remote` (`'name' at addr`, comma-separated) outside loopback.
pub(crate) fn loopback_warning(name: &str, listen: &Addr, remote: &str) -> String {
    format!(
        "{name}: listening on {listen}, the default loopback address, with peers outside \
         loopback ({remote}): remote peers cannot reach a node listening on loopback; call \
         Builder::listen with an address they can reach"
    )
}
