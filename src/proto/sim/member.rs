//! The processes of the simulation: who each member is ([`Spec`]) and what a schedule runs
//! with ([`Settings`]); a member ([`Member`]): its real endpoint built as a node builds it,
//! the peers it knows and the application's view of each ([`Known`]: what it sent, what it
//! was told), what its pool delivered, its simulated journal writer's state; and the pool's
//! tasks run inline.

use crate::addr::Addr;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::deliver::{Delivery, RunOutcome, Task};
use crate::events::{DisconnectReason as Why, RefuseReason};
use crate::handoff::{Handoff, Wake};
use crate::peer::{PeerShared, PeerWiring};
use crate::proto::{Config, Descriptor, Endpoint, NodeCounters, Secret, Target};
use crate::sync::{Arc, SharedStr};

/// A member: index into [`Sim::m`](super::harness::Sim::m).
pub(super) type Side = usize;
pub(super) const A: Side = 0;
pub(super) const B: Side = 1;
pub(super) const MAX_MESSAGE: usize = 1024;
pub(super) const WINDOW: u64 = 1 << 16;

/// A member's address, as the others dial it (nothing listens there: the simulation makes
/// the connection).
pub(super) fn addr(side: Side) -> Addr {
    Addr::Tcp(std::net::SocketAddr::from((
        [127, 0, 0, 1],
        7000 + side as u16,
    )))
}

/// What a schedule runs with.
#[derive(Clone, Copy, Debug)]
pub(super) struct Settings {
    /// Ack once this many received messages are not covered by an ack.
    pub(super) ack_threshold: u64,
    /// Milliseconds from the first unacknowledged message to the delayed ack.
    pub(super) ack_delay: u64,
    /// Publishing stops while the write buffer holds this many bytes.
    pub(super) high_water: usize,
    /// All members have the same secret: every handshake is authenticated.
    pub(super) secret: bool,
    /// Two members: whether beta knows alpha's address too (and dials it), besides alpha
    /// beta's.
    pub(super) both_dial: bool,
    /// Two members: alpha journals (its writer's marks move only when the simulation says,
    /// see [`Sim::journal_catch_up`](super::harness::Sim::journal_catch_up)).
    pub(super) journal: bool,
}

/// Who a member is: its name and launch id, the peers it knows.
#[derive(Clone, Debug)]
pub(super) struct Spec {
    pub(super) name: &'static str,
    pub(super) launch: u64,
    /// The peers it knows, by name, each with the member whose address it dials (if it
    /// knows one).
    pub(super) knows: Vec<(&'static str, Option<Side>)>,
    /// It journals.
    pub(super) journal: bool,
    /// The members whose addresses it has as seeds (dialled without a name).
    pub(super) seeds: Vec<Side>,
}

/// The IO thread's waker, in simulated time: the simulation's driver looks at the
/// hand-off's lists at every step, so a wake-up has nothing to do.
struct NoWake;

impl Wake for NoWake {
    fn wake(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every message delivered to an application, in order: (sequence number, bytes).
pub(super) type DeliveryLog = Arc<StdMutex<Vec<(Option<u64>, Bytes)>>>;

/// A peer a member knows: the application's view of it.
pub(super) struct Known {
    pub(super) name: SharedStr,
    pub(super) shared: Arc<PeerShared>,
    /// Every message the application sent it, in order: the oracle.
    pub(super) sent: Vec<Bytes>,
    /// Messages reported undelivered, with the incarnation the endpoint was bound to when
    /// it reported them.
    pub(super) undelivered: Vec<(Bytes, Option<u64>)>,
    /// What the application was told of it: connected (a `Connected` fact not yet followed
    /// by a `Disconnected`), how many `Connected` facts, and the launch id of each.
    pub(super) up: bool,
    pub(super) connects_told: u64,
    pub(super) launches_told: Vec<u64>,
    /// Why the last `Disconnected` fact said the link was lost.
    pub(super) last_why: Option<Why>,
    /// The endpoint forgot it (admitted at run time, it stayed away for `forget_after`):
    /// the member's map no longer holds it; if it dials in again it is admitted afresh,
    /// as another peer.
    pub(super) forgotten: bool,
}

impl Known {
    /// A peer known from now on, nothing sent or told yet.
    pub(super) fn new(shared: Arc<PeerShared>) -> Known {
        Known {
            name: shared.name.clone(),
            shared,
            sent: Vec::new(),
            undelivered: Vec::new(),
            up: false,
            connects_told: 0,
            launches_told: Vec::new(),
            last_why: None,
            forgotten: false,
        }
    }
}

/// One member: its endpoint, the peers it knows, the application's view.
pub(super) struct Member {
    pub(super) name: &'static str,
    pub(super) launch: u64,
    /// Where it listens: its own address, or the one of the process it restarts.
    pub(super) addr: Addr,
    pub(super) ep: Endpoint,
    pub(super) counters: Arc<NodeCounters>,
    /// The peers it knows; a peer's shared id is its index here.
    pub(super) peers: Vec<Known>,
    /// What the pool hands this member's IO thread: the shipping `PeerCreditSink`s put the
    /// peer on its credit list when credit should go back.
    pub(super) handoff: Arc<Handoff>,
    /// Connections the endpoint asked for and not made yet: (for what, address).
    pub(super) dials: VecDeque<(Target, Addr)>,
    /// Every message delivered to the application, in order (sequence number, bytes).
    pub(super) delivered: DeliveryLog,
    /// The process ended: it does nothing more.
    pub(super) dead: bool,
    /// `Refused` facts it was told: the reason, and whether the other side refused.
    pub(super) refusals: Vec<(RefuseReason, bool)>,
    /// Who it is.
    pub(super) spec: Spec,
    /// A `Refused` fact whose link's close has not come yet.
    pub(super) refusal_open: bool,
    /// The writer's last batch appended.
    pub(super) appended: u64,
    /// Its journal failed (`Output::JournalFailed`): the node stops, and once its
    /// endpoint's shutdown is done the process has ended.
    pub(super) journal_failed: bool,
    /// Journal batches handed over and not yet "appended" (the writer lags until
    /// [`Sim::journal_catch_up`](super::harness::Sim::journal_catch_up)), with the highest message sequence number each holds per
    /// peer.
    pub(super) batches: Vec<(u64, Vec<(SharedStr, u64)>)>,
    /// Per peer, the highest message sequence number in an appended batch: the peer never
    /// holds a message beyond it.
    pub(super) journalled: HashMap<SharedStr, u64>,
}

/// Runs a pool task inline, to its end.
pub(super) fn run_task(task: Task, handler: &(dyn Fn(Delivery) + Send + Sync)) {
    match task {
        Task::Member(q) => while q.run(64, handler) == RunOutcome::Yield {},
        Task::Oob(q) => while q.run(64, handler).outcome == RunOutcome::Yield {},
        Task::Events(q) => while q.run(64) {},
    }
}

/// Alpha and beta: alpha dials beta; beta dials alpha too with `both_dial`; alpha journals
/// with `journal`.
pub(super) fn pair(s: Settings) -> Vec<Spec> {
    vec![
        Spec {
            name: "alpha",
            launch: 0xA1,
            knows: vec![("beta", Some(B))],
            journal: s.journal,
            seeds: Vec::new(),
        },
        Spec {
            name: "beta",
            launch: 0xA2,
            knows: vec![("alpha", s.both_dial.then_some(A))],
            journal: false,
            seeds: Vec::new(),
        },
    ]
}

/// The shared state of peer `id` named `name` of a member, as a node makes it: its receive
/// credit, sender and OOB queues reporting to the member's hand-off.
pub(super) fn peer_shared(
    id: usize,
    name: SharedStr,
    journal: bool,
    handoff: &Arc<Handoff>,
) -> Arc<PeerShared> {
    let wiring = PeerWiring {
        handoff: handoff.clone(),
        journalled: journal,
        oob_limit: 1,
        max_requests: 16,
    };
    Arc::new(PeerShared::wired(id, name, WINDOW, &wiring))
}

impl Member {
    pub(super) fn new(side: Side, spec: &Spec, s: Settings, now: Instant) -> Member {
        let journal = spec.journal;
        let handoff = Arc::new(Handoff::new(Box::new(NoWake)));
        let counters = Arc::new(NodeCounters::default());
        let cfg = Config {
            name: spec.name.into(),
            cluster: "sim".into(),
            launch_id: spec.launch,
            window: WINDOW,
            recv_window: WINDOW,
            max_message: MAX_MESSAGE,
            // Members not among `knows` are admitted as they dial in (each gets the next
            // peer index; `Sim::drain` records it).
            allow_unknown: true,
            ack_threshold: s.ack_threshold,
            ack_delay: Duration::from_millis(s.ack_delay),
            backoff_min: Duration::from_millis(5),
            backoff_max: Duration::from_millis(40),
            handshake_timeout: Duration::from_secs(5),
            write_high_water: s.high_water,
            outbound_filter: None,
            probe_interval: Duration::from_millis(100),
            block_warning: Duration::from_secs(60),
            credit_on_idle: true,
            tick: Duration::from_millis(10),
            heartbeat: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(30),
            max_connections: 64,
            max_pending: 16,
            max_pending_per_source: 16,
            secret: s.secret.then(|| Secret::new(b"sim secret")),
            journalled: journal,
            events: true,
            forget_after: Duration::from_secs(60),
            seeds: spec
                .seeds
                .iter()
                .filter_map(|&s| addr(s).as_tcp())
                .collect(),
            seed_names: Vec::new(),
            membership: None,
        };
        let ep = Endpoint::new(
            cfg,
            counters.clone(),
            journal.then(|| {
                (
                    crate::journal::FsyncPolicy::Never,
                    crate::journal::Recovered::default(),
                )
            }),
            {
                let next = std::sync::atomic::AtomicUsize::new(spec.knows.len());
                let handoff = handoff.clone();
                Box::new(move |name| {
                    let id = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    peer_shared(id, name, journal, &handoff)
                })
            },
            now,
        );
        let peers = spec
            .knows
            .iter()
            .enumerate()
            .map(|(id, &(name, _))| Known::new(peer_shared(id, name.into(), journal, &handoff)))
            .collect();
        Member {
            name: spec.name,
            launch: spec.launch,
            addr: addr(side),
            ep,
            counters,
            peers,
            handoff,
            dials: VecDeque::new(),
            delivered: Arc::new(StdMutex::new(Vec::new())),
            dead: false,
            refusals: Vec::new(),
            refusal_open: false,
            spec: spec.clone(),
            appended: 0,
            journal_failed: false,
            batches: Vec::new(),
            journalled: HashMap::new(),
        }
    }

    /// The shared state of its first peer (the only one, with two members).
    pub(super) fn peer(&self) -> &Arc<PeerShared> {
        &self.peers[0].shared
    }

    /// Its recovery descriptor for its first peer.
    pub(super) fn desc(&self) -> &Descriptor {
        self.desc_of(0)
    }

    /// Its recovery descriptor for peer `k`.
    pub(super) fn desc_of(&self, k: usize) -> &Descriptor {
        &self
            .ep
            .peer(k)
            .expect("the simulation never removes a peer it checks")
            .desc
    }

    /// The index of the peer it knows by `name` (not one it forgot).
    pub(super) fn known(&self, name: &str) -> Option<usize> {
        self.peers
            .iter()
            .position(|k| !k.forgotten && *k.name == *name)
    }

    /// Messages delivered to its application so far.
    /// The member's application handler: records each delivery in its log.
    pub(super) fn handler(&self) -> impl Fn(Delivery) + Send + Sync + 'static {
        let log = self.delivered.clone();
        move |d: Delivery| {
            log.lock()
                .expect("delivery log")
                .push((d.seq(), d.payload_bytes()));
        }
    }

    pub(super) fn delivered_len(&self) -> usize {
        self.delivered.lock().expect("delivery log").len()
    }
}
