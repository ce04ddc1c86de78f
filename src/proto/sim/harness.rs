//! The simulation's machinery: members, links as byte pipes, what the IO thread does, the
//! faults.

use crate::addr::Addr;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::oracle::Oracle;
use crate::deliver::{Delivery, MemberQueue, OobQueue, PeerCreditSink, RunOutcome, Task};
use crate::events::{DisconnectReason as Why, Event, RefuseReason};
use crate::flow::RecvCredit;
use crate::handoff::{Handoff, Wake};
use crate::peer::{Outgoing, PeerShared};
use crate::proto::endpoint::Batch;
use crate::proto::{
    Config, Descriptor, Endpoint, Input, LinkId, NodeCounters, Output, Secret, Target,
};
use crate::sync::{Arc, SharedStr};
use crate::wire;

/// A member: index into [`Sim::m`].
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
    /// see [`Sim::journal_catch_up`]).
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
    fn new(shared: Arc<PeerShared>) -> Known {
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
    spec: Spec,
    /// A `Refused` fact whose link's close has not come yet.
    refusal_open: bool,
    /// The writer's last batch appended.
    appended: u64,
    /// Its journal failed (`Output::JournalFailed`): the node stops, and once its
    /// endpoint's shutdown is done the process has ended.
    pub(super) journal_failed: bool,
    /// Journal batches handed over and not yet "appended" (the writer lags until
    /// [`Sim::journal_catch_up`]), with the highest message sequence number each holds per
    /// peer.
    batches: Vec<(u64, Vec<(SharedStr, u64)>)>,
    /// Per peer, the highest message sequence number in an appended batch: the peer never
    /// holds a message beyond it.
    pub(super) journalled: HashMap<SharedStr, u64>,
}

/// One connection between two members: a byte pipe per direction.
#[derive(Debug)]
pub(super) struct SimLink {
    /// The dialler and the acceptor.
    pub(super) sides: [Side; 2],
    /// `ends[i]`: member `sides[i]`'s link id, until it closes its end.
    pub(super) ends: [Option<LinkId>; 2],
    /// `pipe[i]`: bytes member `sides[i]` wrote that the other has not read yet.
    pub(super) pipe: [VecDeque<u8>; 2],
    /// Member `sides[i]` closed its end: the other reads what is in the pipe, then EOF.
    pub(super) closed: [bool; 2],
    /// Broken: nothing more crosses.
    pub(super) cut: bool,
}

impl SimLink {
    fn at(&self, side: Side) -> Option<usize> {
        self.sides.iter().position(|&s| s == side)
    }

    /// `side`'s end, while it holds it open.
    pub(super) fn end(&self, side: Side) -> Option<LinkId> {
        self.at(side).and_then(|i| self.ends[i])
    }

    /// The member at the other end from `side`.
    pub(super) fn peer_of(&self, side: Side) -> Side {
        if self.sides[0] == side {
            self.sides[1]
        } else {
            self.sides[0]
        }
    }

    /// The bytes `side` wrote that the other has not read yet.
    pub(super) fn from(&mut self, side: Side) -> &mut VecDeque<u8> {
        let i = self.at(side).expect("a member of the link");
        &mut self.pipe[i]
    }

    /// Whether the other end from `side` was closed.
    fn closed_by_peer(&self, side: Side) -> bool {
        self.at(side).is_some_and(|i| self.closed[1 - i])
    }

    /// Whether either member still holds its end.
    pub(super) fn open(&self) -> bool {
        self.ends.iter().any(Option::is_some)
    }
}

/// What the faults did, summed over runs to show the schedules reach every knob.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Stats {
    pub(super) messages: u64,
    pub(super) cuts: u64,
    /// Bytes lost: in flight beyond a cut, or written to a dead link.
    pub(super) bytes_lost: u64,
    /// Links established (handshakes completed, both sides counted).
    pub(super) established: u64,
    pub(super) resent: u64,
    /// Data frames replayed by the link.
    pub(super) replayed: u64,
    /// Data frames dropped as duplicates.
    pub(super) duplicates: u64,
    /// Older acks replayed by the link.
    pub(super) stale_acks: u64,
    /// Links resolved by the tie-break.
    pub(super) tie_breaks: u64,
    /// Protocol errors (a stale handshake read late from a dead link, a replay at the
    /// wrong moment): the link is closed and recovery goes on.
    pub(super) protocol_errors: u64,
    /// Handshakes refused for authentication (only when the members' secrets differ).
    pub(super) auth_refusals: u64,
    /// `Refused` facts, all members.
    pub(super) refusals: u64,
    /// `NewIncarnation` facts, all members.
    pub(super) new_incarnations: u64,
    /// Processes ended.
    pub(super) deaths: u64,
    /// Times a member's peer went over from one incarnation's established link to
    /// another's (a takeover of the name, or a restart).
    pub(super) takeovers: u64,
    /// Processes started again at an old one's address.
    pub(super) restarts: u64,
    /// Journal failures (each stops its node).
    pub(super) journal_failures: u64,
    /// Members forgotten (admitted at run time, away for `forget_after`), all members.
    pub(super) forgotten: u64,
    /// Messages delivered by one incarnation and reported undelivered when their sender
    /// went over to another.
    pub(super) delivered_then_dropped: u64,
}

impl Stats {
    pub(super) fn add(&mut self, o: &Stats) {
        self.messages += o.messages;
        self.cuts += o.cuts;
        self.bytes_lost += o.bytes_lost;
        self.established += o.established;
        self.resent += o.resent;
        self.replayed += o.replayed;
        self.duplicates += o.duplicates;
        self.stale_acks += o.stale_acks;
        self.tie_breaks += o.tie_breaks;
        self.protocol_errors += o.protocol_errors;
        self.auth_refusals += o.auth_refusals;
        self.refusals += o.refusals;
        self.new_incarnations += o.new_incarnations;
        self.deaths += o.deaths;
        self.restarts += o.restarts;
        self.takeovers += o.takeovers;
        self.journal_failures += o.journal_failures;
        self.forgotten += o.forgotten;
        self.delivered_then_dropped += o.delivered_then_dropped;
    }
}

/// One step of a schedule. Steps that do not apply in the current state do nothing.
#[derive(Clone, Debug)]
pub(super) enum Step {
    /// The application of `side` sends its first peer a message with `len` bytes of filler
    /// (if its window has room), and the endpoint is asked to publish.
    Send { side: Side, len: usize },
    /// The socket takes up to `n` bytes of the write buffer of one of `side`'s ends.
    Write { side: Side, pick: usize, n: usize },
    /// `side` reads up to `n` bytes from one of its ends and handles them.
    Read { side: Side, pick: usize, n: usize },
    /// Simulated time passes.
    Advance { ms: u64 },
    /// A live link breaks; of the bytes in flight each way, the fraction `keep / u16::MAX`
    /// (rounded down: any byte offset) arrives.
    Cut { pick: usize, keep: [u16; 2] },
    /// The oldest connection `side`'s endpoint asked for is made.
    Dial { side: Side },
    /// The link delivers to `side` again data frames it already holds (from `back` before
    /// its latest, `count` more after that) and an ack the peer wrote earlier.
    Replay { side: Side, back: u64, count: u64 },
    /// The process `side` ends.
    Kill { side: Side },
    /// A process that ended starts again at its address, under a new launch id (once).
    Restart { side: Side },
    /// `side`'s journal writer appends everything handed to it
    /// ([`Sim::journal_catch_up`]).
    Journal { side: Side },
    /// `side`'s journal writer fails (a write or a sync): what it appended stays, the
    /// batches handed to it and not appended are lost, and the node stops.
    JournalFail { side: Side },
    /// Every byte that can move moves, and the connections asked for are made, with no
    /// time passing ([`Sim::pump`]).
    Pump,
}

/// The simulation: members, the links between them, the simulated clock, the oracle.
pub(super) struct Sim {
    start: Instant,
    /// Simulated milliseconds since `start`.
    pub(super) ms: u64,
    settings: Settings,
    pub(super) m: Vec<Member>,
    pub(super) links: Vec<SimLink>,
    /// Which simulated link each member's link id belongs to.
    pub(super) owner: HashMap<(Side, LinkId), usize>,
    next_link: usize,
    pub(super) stats: Stats,
    /// Handshake nonces handed out: each one fresh (a counter stands in for the OS's
    /// randomness, so schedules replay exactly).
    nonces: u64,
    pub(super) oracle: Oracle,
    /// Deliveries held as a blocked handler would hold them: the member and the sender
    /// whose messages its pool does not run ([`Sim::hold`]).
    hold: Option<(Side, String)>,
    /// The pool tasks held meanwhile, run at [`Sim::release`].
    held: Vec<Task>,
}

impl Drop for Sim {
    /// A process that ended drops its messages with their permits, as does one still
    /// refused a name it claims, or one whose peer ended (its messages to it wait for an
    /// incarnation that never comes): the permit's drop check would take that for a leak,
    /// so they are dropped with it off. (The oracle checks the windows of every pair that
    /// can complete.)
    fn drop(&mut self) {
        let twins = self.twins() || self.m.iter().any(|m| m.dead);
        for m in std::mem::take(&mut self.m) {
            let stuck = || {
                m.peers
                    .iter()
                    .any(|k| k.shared.outbox.window().available() != WINDOW)
            };
            if m.dead || (twins && stuck()) {
                crate::flow::dropping_unchecked(|| drop(m));
            }
        }
    }
}

/// Runs a pool task inline, to its end.
fn run_task(task: Task, handler: &(dyn Fn(Delivery) + Send + Sync)) {
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
    let credit = Arc::new(RecvCredit::new());
    let progress = journal.then(|| Arc::new(crate::deliver::Progress::new(0)));
    let sink = || PeerCreditSink::new(id, credit.clone(), progress.clone(), handoff.clone());
    let member = Arc::new(MemberQueue::new(name.clone(), Box::new(sink())));
    let oob = Arc::new(OobQueue::new(name.clone(), 1, Arc::new(sink())));
    Arc::new(PeerShared::new(
        id, name, WINDOW, credit, member, oob, progress, 16,
    ))
}

impl Member {
    fn new(side: Side, spec: &Spec, s: Settings, now: Instant) -> Member {
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
    fn handler(&self) -> impl Fn(Delivery) + Send + Sync + 'static {
        let log = self.delivered.clone();
        move |d: Delivery| {
            log.lock()
                .expect("delivery log")
                .push((d.seq(), d.payload().clone()));
        }
    }

    pub(super) fn delivered_len(&self) -> usize {
        self.delivered.lock().expect("delivery log").len()
    }
}

impl Sim {
    /// Alpha and beta (see [`pair`]).
    pub(super) fn new(s: Settings) -> Sim {
        Sim::with(s, &pair(s))
    }

    /// Members as `specs` say (member `i` is `specs[i]`); each adds its peers in order (and
    /// asks to dial those whose address it knows).
    pub(super) fn with(s: Settings, specs: &[Spec]) -> Sim {
        let start = Instant::now();
        let mut sim = Sim {
            start,
            ms: 0,
            settings: s,
            m: Vec::new(),
            links: Vec::new(),
            owner: HashMap::new(),
            next_link: 1,
            stats: Stats::default(),
            nonces: 0,
            oracle: Oracle::default(),
            hold: None,
            held: Vec::new(),
        };
        for (side, spec) in specs.iter().enumerate() {
            sim.m.push(Member::new(side, spec, s, start));
        }
        for (side, spec) in specs.iter().enumerate() {
            sim.add_peers(side, spec);
        }
        sim
    }

    /// A new process as `spec` says, started now at the address of `old` (a restart);
    /// returns its side.
    pub(super) fn restart(&mut self, old: Side, spec: &Spec) -> Side {
        let side = self.m.len();
        let now = self.now();
        self.stats.restarts += 1;
        let mut m = Member::new(side, spec, self.settings, now);
        m.addr = self.m[old].addr.clone();
        self.m.push(m);
        self.add_peers(side, spec);
        side
    }

    fn add_peers(&mut self, side: Side, spec: &Spec) {
        // What the endpoint asked for as it started (its seeds' dials).
        self.drain(side);
        let now = self.now();
        for (k, &(_, at)) in spec.knows.iter().enumerate() {
            let shared = self.m[side].peers[k].shared.clone();
            self.m[side].ep.handle(
                now,
                Input::AddPeer {
                    peer: shared,
                    addr: at.map(addr),
                },
            );
            self.drain(side);
        }
    }

    pub(super) fn now(&self) -> Instant {
        self.start + Duration::from_millis(self.ms)
    }

    /// The live members.
    pub(super) fn live(&self) -> Vec<Side> {
        (0..self.m.len()).filter(|&s| !self.m[s].dead).collect()
    }

    /// A fresh nonce.
    fn nonce(&mut self) -> wire::Nonce {
        self.nonces += 1;
        let mut n = [0u8; wire::NONCE_LEN];
        n[..8].copy_from_slice(&self.nonces.to_le_bytes());
        n
    }

    /// Does what `side`'s endpoint asks ([`Endpoint::poll`], in its order), as the IO
    /// thread does: runs pool tasks inline, hands journal batches to the simulated writer,
    /// remembers a dial, closes ends, records reports and facts (and checks them); leaves
    /// the bytes of a transmit to the schedule's `Write` steps; then hands over the credit
    /// the pool asked to return, until nothing more is asked.
    pub(super) fn drain(&mut self, side: Side) {
        let now = self.now();
        let who = self.m[side].name;
        let handler = self.m[side].handler();
        loop {
            while let Some(out) = self.m[side].ep.poll(now) {
                match out {
                    Output::Task(t) if self.holds(side, &t) => self.held.push(t),
                    Output::Task(t) => run_task(t, &handler),
                    // The IO thread hands the turn's journal records to the writer.
                    Output::Journal(batch) => self.hand_to_journal(side, batch),
                    Output::JournalSync(_) => {}
                    // The schedule's `Write` steps move the bytes.
                    Output::Transmit(_) => {}
                    Output::Dial { target, addr, .. } => {
                        let dials = &mut self.m[side].dials;
                        if !dials.iter().any(|&(t, _)| t == target) {
                            dials.push_back((target, addr));
                        }
                    }
                    Output::Close { link, last } => {
                        self.m[side].refusal_open = false;
                        if let Some(l) = self.owner.remove(&(side, link)) {
                            let sl = &mut self.links[l];
                            let i = sl.at(side).expect("a member of its link");
                            if sl.cut {
                                self.stats.bytes_lost += last.len() as u64;
                            } else {
                                sl.pipe[i].extend(last);
                            }
                            sl.closed[i] = true;
                            sl.ends[i] = None;
                        }
                    }
                    Output::Resume(_) => {}
                    Output::Undelivered { peer, messages } => {
                        let m = &mut self.m[side];
                        let k = m.known(&peer).expect("a known peer");
                        // A peer being forgotten is out of the endpoint already: the
                        // incarnation it was told of last is the one it was bound to.
                        let bound = match m.ep.peer(k) {
                            Some(p) => p.desc.remote_launch(),
                            None => m.peers[k].launches_told.last().copied(),
                        };
                        m.peers[k]
                            .undelivered
                            .extend(messages.into_iter().map(|u| (u.payload, bound)));
                    }
                    Output::Event(Event::Connected {
                        peer,
                        incarnation: launch,
                    }) => {
                        let m = &mut self.m[side];
                        let k = m.known(&peer).expect("a known peer");
                        let known = &mut m.peers[k];
                        assert!(!known.up, "{who}: told Connected to {peer} twice in a row");
                        if let Some(&prev) = known.launches_told.last().filter(|&&l| l != launch) {
                            assert!(
                                !known.launches_told.contains(&launch),
                                "{who}: '{peer}' went back to incarnation {launch:#x} after {prev:#x}"
                            );
                            assert_ne!(
                                known.last_why,
                                Some(Why::Replaced),
                                "{who}: '{peer}' incarnation {prev:#x} was replaced by {launch:#x} over its live link"
                            );
                        }
                        known.up = true;
                        known.connects_told += 1;
                        known.launches_told.push(launch);
                    }
                    Output::Event(Event::Disconnected { peer, reason: why }) => {
                        let m = &mut self.m[side];
                        let k = m.known(&peer).expect("a known peer");
                        assert!(
                            m.peers[k].up,
                            "{who}: told {peer} Disconnected while not connected"
                        );
                        m.peers[k].up = false;
                        m.peers[k].last_why = Some(why);
                    }
                    Output::Event(Event::Removed { peer }) => {
                        let m = &self.m[side];
                        let k = m.known(&peer).expect("a known peer");
                        assert!(!m.peers[k].up, "{who}: {peer} removed while told connected");
                    }
                    Output::Event(Event::NewIncarnation { .. }) => self.stats.new_incarnations += 1,
                    Output::Event(Event::Refused {
                        reason, by_peer, ..
                    }) => {
                        let m = &mut self.m[side];
                        assert!(
                            !m.refusal_open,
                            "{who}: two Refused facts for one handshake"
                        );
                        m.refusal_open = true;
                        m.refusals.push((reason, by_peer));
                        self.stats.refusals += 1;
                    }
                    Output::Admitted(shared) => {
                        let m = &mut self.m[side];
                        // Said again for a peer it holds (a node's `add_peer` raced the
                        // admission): the node's map keeps it, nothing new here.
                        let again = m
                            .peers
                            .get(shared.id)
                            .is_some_and(|k| Arc::ptr_eq(&k.shared, &shared));
                        if !again {
                            assert_eq!(
                                shared.id,
                                m.peers.len(),
                                "{who}: admitted as the next peer"
                            );
                            // A name it forgot comes back: what it sent that name before
                            // stays the start of the record (messages are numbered per
                            // name), all delivered or reported already.
                            let before = m
                                .peers
                                .iter()
                                .rev()
                                .find(|k| k.forgotten && k.name == shared.name)
                                .map(|k| k.sent.clone());
                            let mut known = Known::new(shared);
                            known.sent = before.unwrap_or_default();
                            m.peers.push(known);
                        }
                    }
                    Output::JournalFailed => {
                        self.m[side].journal_failed = true;
                        self.stats.journal_failures += 1;
                    }
                    Output::Forget(shared) => self.forget(side, &shared),
                    Output::Event(Event::Forgotten { peer }) => {
                        let m = &self.m[side];
                        assert!(
                            m.known(&peer).is_none(),
                            "{who}: told '{peer}' forgotten before the node forgot it"
                        );
                        self.stats.forgotten += 1;
                    }
                    // No member of the simulation runs membership (it has a simulation
                    // of its own, `membership::sim`).
                    Output::Datagram { .. } | Output::Resolve { .. } | Output::Event(_) => {}
                }
            }
            // What the pool asked of the IO thread meanwhile is its next input.
            let credit = self.m[side].handoff.take_credit_flush();
            if credit.is_empty() {
                // After a journal failure the IO thread ends once the endpoint's shutdown
                // is done: the process has stopped.
                if self.m[side].journal_failed && self.m[side].ep.shutdown_done(now) {
                    self.kill(side);
                }
                return;
            }
            for id in credit {
                self.m[side].ep.handle(now, Input::FlushCredit(id));
            }
        }
    }

    pub(super) fn apply(&mut self, step: &Step) {
        match *step {
            Step::Send { side, len } => self.send(side, len),
            Step::Write { side, pick, n } => {
                if let Some(l) = self.pick_end(side, pick) {
                    self.write(side, l, n);
                }
            }
            Step::Read { side, pick, n } => {
                if let Some(l) = self.pick_end(side, pick) {
                    self.read(side, l, n);
                }
            }
            Step::Advance { ms } => self.advance(ms),
            Step::Cut { pick, keep } => {
                let live: Vec<usize> = (0..self.links.len())
                    .filter(|&l| !self.links[l].cut && self.links[l].open())
                    .collect();
                if !live.is_empty() {
                    self.cut(live[pick % live.len()], keep);
                }
            }
            Step::Dial { side } => {
                self.dial(side);
            }
            Step::Replay { side, back, count } => self.replay(side, back, count),
            Step::Kill { side } => self.kill(side),
            Step::Pump => self.pump(),
            Step::Journal { side } => {
                if !self.m[side].dead {
                    self.journal_catch_up(side);
                }
            }
            Step::JournalFail { side } => self.journal_fail(side),
            Step::Restart { side } => {
                let restarted =
                    (side + 1..self.m.len()).any(|s| self.m[s].addr == self.m[side].addr);
                if self.m[side].dead && !restarted {
                    let spec = Spec {
                        launch: 0x1000 + self.m.len() as u64,
                        ..self.m[side].spec.clone()
                    };
                    self.restart(side, &spec);
                }
            }
        }
    }

    /// The `pick`-th (modulo) link `side` still holds an end of.
    pub(super) fn pick_end(&self, side: Side, pick: usize) -> Option<usize> {
        let open: Vec<usize> = (0..self.links.len())
            .filter(|&l| self.links[l].end(side).is_some())
            .collect();
        (!open.is_empty()).then(|| open[pick % open.len()])
    }

    // ----- the application ---------------------------------------------------------------

    /// Sends `side`'s first peer a message (see [`send_to`](Sim::send_to)).
    pub(super) fn send(&mut self, side: Side, len: usize) {
        self.send_to(side, 0, len);
    }

    /// Sends message number `i` of `side` to its peer `k`: its side, its number, then `len`
    /// filler bytes, so that every message's bytes are distinct. Skipped when the window is
    /// full (as `try_send` would refuse it), or the process ended.
    pub(super) fn send_to(&mut self, side: Side, k: usize, len: usize) {
        if self.m[side].dead {
            return;
        }
        let now = self.now();
        let m = &mut self.m[side];
        let known = &mut m.peers[k];
        let i = known.sent.len() as u32;
        let mut p = Vec::with_capacity(5 + len);
        p.push(side as u8);
        p.extend_from_slice(&i.to_le_bytes());
        p.resize(5 + len, i as u8);
        let p = Bytes::from(p);
        let Ok(permit) = known
            .shared
            .outbox
            .window()
            .try_acquire(crate::flow::cost(p.len()))
        else {
            return;
        };
        let msg = Outgoing::new(p.clone(), false, None, permit);
        if known.shared.outbox.admit(msg).is_err() {
            return;
        }
        known.sent.push(p);
        self.stats.messages += 1;
        let id = known.shared.id;
        m.ep.handle(now, Input::Publish(id));
        self.drain(side);
    }

    // ----- the IO thread's sockets ----------------------------------------------------------

    /// The oldest connection `side` asked for is made: a link with an end at each member
    /// (the other accepts it, if its admission rules do; a connection to a process that
    /// ended fails).
    pub(super) fn dial(&mut self, side: Side) -> bool {
        if self.m[side].dead {
            return false;
        }
        let Some((peer, to)) = self.m[side].dials.pop_front() else {
            return false;
        };
        // The live process listening there, else the one that did.
        let at: Vec<Side> = (0..self.m.len())
            .filter(|&s| self.m[s].addr == to)
            .collect();
        let target = *at
            .iter()
            .find(|&&s| !self.m[s].dead)
            .or(at.first())
            .expect("a member's address");
        let now = self.now();
        let (d, a) = (LinkId(self.next_link), LinkId(self.next_link + 1));
        self.next_link += 2;
        let l = self.links.len();
        self.links.push(SimLink {
            sides: [side, target],
            ends: [Some(d), Some(a)],
            pipe: Default::default(),
            closed: [false; 2],
            cut: false,
        });
        self.owner.insert((side, d), l);
        let (nd, na) = (self.nonce(), self.nonce());
        if self.m[target].dead {
            let sl = &mut self.links[l];
            sl.ends[1] = None;
            sl.closed[1] = true;
            let dialled = Input::Dialled {
                target: peer,
                link: d,
                nonce: nd,
            };
            self.m[side].ep.handle(now, dialled);
            let failed = Input::Failed {
                link: d,
                why: Why::Io,
            };
            self.m[side].ep.handle(now, failed);
            self.drain(side);
            return true;
        }
        self.owner.insert((target, a), l);
        let dialled = Input::Dialled {
            target: peer,
            link: d,
            nonce: nd,
        };
        self.m[side].ep.handle(now, dialled);
        let acceptor = &mut self.m[target].ep;
        let verdict = acceptor.verdict_on_accept(now, addr(side));
        if matches!(
            verdict,
            crate::proto::Verdict::SourceBurst | crate::proto::Verdict::Full
        ) {
            let failed = Input::Failed {
                link: d,
                why: Why::Io,
            };
            self.m[side].ep.handle(now, failed);
        } else {
            let accepted = Input::Accepted {
                link: a,
                from: addr(side),
                verdict,
                nonce: na,
            };
            acceptor.handle(now, accepted);
            self.m[side].ep.handle(now, Input::Connected(d));
        }
        self.drain(target);
        self.drain(side);
        true
    }

    /// The socket takes up to `n` bytes of `side`'s write buffer on link `l`; on a cut link,
    /// or one the other side closed, they are lost.
    pub(super) fn write(&mut self, side: Side, l: usize, n: usize) {
        let Some(id) = self.links[l].end(side) else {
            return;
        };
        let now = self.now();
        // (Every drain ends with the journal cut: what the buffer holds is gated already.)
        let Some(bytes) = self.m[side].ep.to_write(id) else {
            return;
        };
        let k = n.min(bytes.len());
        if k == 0 {
            return;
        }
        if self.links[l].cut || self.links[l].closed_by_peer(side) {
            self.stats.bytes_lost += k as u64;
        } else {
            let bytes = bytes[..k].to_vec();
            self.links[l].from(side).extend(bytes);
        }
        self.m[side].ep.handle(now, Input::Wrote { link: id, n: k });
        self.drain(side);
    }

    /// `side` reads up to `n` bytes from link `l` and hands them to its endpoint; once the
    /// pipe is empty on a cut link, or one the other side closed, it reads EOF.
    pub(super) fn read(&mut self, side: Side, l: usize, n: usize) {
        let Some(id) = self.links[l].end(side) else {
            return;
        };
        let now = self.now();
        let from = self.links[l].peer_of(side);
        let input = self.links[l].from(from);
        let k = n.min(input.len());
        if k > 0 {
            let Some(link) = self.m[side].ep.link_mut(id) else {
                return;
            };
            if !link.wants_read() {
                return; // paused
            }
            link.read_buffer().extend(input.drain(..k));
            let cert = |_: &str| Ok(());
            self.m[side].ep.handle(
                now,
                Input::Read {
                    link: id,
                    cert: &cert,
                },
            );
        } else if self.links[l].cut || self.links[l].closed_by_peer(side) {
            let failed = Input::Failed {
                link: id,
                why: Why::PeerClosed,
            };
            self.m[side].ep.handle(now, failed);
        }
        self.drain(side);
    }

    /// Hands a batch of `side`'s journal records to its (simulated) writer.
    fn hand_to_journal(&mut self, side: Side, (n, records): Batch) {
        let tops = records
            .iter()
            .filter_map(|r| match r {
                crate::journal::Record::Message { peer, seq, .. } => Some((peer.clone(), *seq)),
                _ => None,
            })
            .collect();
        self.m[side].batches.push((n, tops));
    }

    /// `side`'s journal writer appends (and, the policy being `Never`, only appends)
    /// everything handed to it.
    pub(super) fn journal_catch_up(&mut self, side: Side) {
        let m = &mut self.m[side];
        let Some(&(last, _)) = m.batches.last() else {
            return;
        };
        for (_, tops) in std::mem::take(&mut m.batches) {
            for (peer, seq) in tops {
                let top = m.journalled.entry(peer).or_default();
                *top = (*top).max(seq);
            }
        }
        m.appended = last;
        let now = self.now();
        let marks = crate::journal::WriterMarks {
            appended: last,
            synced: 0,
            failed: false,
        };
        self.m[side].ep.handle(now, Input::JournalMarks(marks));
        self.drain(side);
    }

    /// `side`'s journal writer fails: what it appended stays appended, what it was handed
    /// since is lost, and it says so (`WriterMarks::failed`). Nothing for a member that
    /// does not journal, or has ended.
    pub(super) fn journal_fail(&mut self, side: Side) {
        let m = &mut self.m[side];
        if m.dead || !m.spec.journal {
            return;
        }
        m.batches.clear();
        let marks = crate::journal::WriterMarks {
            appended: m.appended,
            synced: 0,
            failed: true,
        };
        let now = self.now();
        self.m[side].ep.handle(now, Input::JournalMarks(marks));
        self.drain(side);
    }

    /// `side`'s endpoint forgot the member whose shared state is `shared` (admitted at run
    /// time, away for `forget_after`): it holds no peer of that name any more, everything
    /// sent to it was delivered or reported undelivered, and every permit is back.
    fn forget(&mut self, side: Side, shared: &Arc<PeerShared>) {
        let m = &mut self.m[side];
        let who = m.name;
        let k = m
            .peers
            .iter()
            .position(|k| Arc::ptr_eq(&k.shared, shared))
            .expect("forgets a peer it knows");
        assert!(
            m.ep.peer(shared.id).is_none(),
            "{who}: '{}' forgotten, still in the endpoint",
            shared.name
        );
        let known = &mut m.peers[k];
        assert!(
            !known.up,
            "{who}: '{}' forgotten while connected",
            known.name
        );
        assert!(!known.forgotten, "{who}: '{}' forgotten twice", known.name);
        known.forgotten = true;
        assert_eq!(
            known.shared.outbox.window().available(),
            WINDOW,
            "{who}: the permits of '{}' are back once it is forgotten",
            known.name
        );
    }

    /// From now on `side`'s pool runs none of `from`'s messages, regular or out-of-band, as
    /// if its handler blocked on the first: their tasks wait for [`Sim::release`], the
    /// queue's deliverer flag stays taken, so the messages that follow only queue up, and
    /// no credit goes back to `from` for them.
    pub(super) fn hold(&mut self, side: Side, from: &str) {
        self.hold = Some((side, from.to_owned()));
    }

    /// The handler `hold` blocked returns: the held tasks run, and `side` hands over the
    /// credit they returned.
    pub(super) fn release(&mut self) {
        let Some((side, _)) = self.hold.take() else {
            return;
        };
        let handler = self.m[side].handler();
        for t in std::mem::take(&mut self.held) {
            run_task(t, &handler);
        }
        self.drain(side);
    }

    /// Whether `task`, made by `side`, is held ([`Sim::hold`]).
    fn holds(&self, side: Side, task: &Task) -> bool {
        let Some((at, from)) = &self.hold else {
            return false;
        };
        *at == side
            && match task {
                Task::Member(q) => q.name() == from,
                Task::Oob(q) => q.name() == from,
                Task::Events(_) => false,
            }
    }

    /// Simulated time passes: each live member's timers run, and the connections asked for
    /// are remembered.
    pub(super) fn advance(&mut self, ms: u64) {
        self.ms += ms;
        let now = self.now();
        for side in self.live() {
            self.m[side].ep.handle(now, Input::Timeout);
            self.drain(side);
        }
    }

    /// Link `l` breaks: of the bytes in flight each way only the fraction `keep` arrives
    /// (`keep[0]` of those the member with the lower index wrote).
    pub(super) fn cut(&mut self, l: usize, mut keep: [u16; 2]) {
        let link = &mut self.links[l];
        link.cut = true;
        if link.sides[0] > link.sides[1] {
            keep.swap(0, 1);
        }
        for (pipe, keep) in link.pipe.iter_mut().zip(keep) {
            let kept = pipe.len() * usize::from(keep) / usize::from(u16::MAX);
            self.stats.bytes_lost += (pipe.len() - kept) as u64;
            pipe.truncate(kept);
        }
        self.stats.cuts += 1;
    }

    /// The process `side` ends: the system closes its connections (what it wrote arrives,
    /// then EOF; what it had not written is lost), and it does nothing more.
    pub(super) fn kill(&mut self, side: Side) {
        if std::mem::replace(&mut self.m[side].dead, true) {
            return;
        }
        self.stats.deaths += 1;
        self.m[side].dials.clear();
        for sl in &mut self.links {
            if let Some(i) = sl.at(side) {
                if let Some(id) = sl.ends[i].take() {
                    self.owner.remove(&(side, id));
                    sl.closed[i] = true;
                }
            }
        }
    }

    /// The link `side` speaks to its peer on delivers again data frames `side` already
    /// holds and an ack its peer wrote earlier — at a frame boundary: only when `side` has
    /// no partial frame buffered (then the pipe starts at one).
    pub(super) fn replay(&mut self, side: Side, back: u64, count: u64) {
        let Some(l) = self.pick_end(side, 0) else {
            return;
        };
        let Some(id) = self.links[l].end(side) else {
            return;
        };
        let Some(k) = self.m[side]
            .ep
            .link_mut(id)
            .filter(|k| k.established && k.rbuf.is_empty())
            .and_then(|k| k.peer)
        else {
            return;
        };
        if self.links[l].cut {
            return;
        }
        let from = self.links[l].peer_of(side);
        let received = self.m[side].desc_of(k).received();
        let first = received.saturating_sub(back).max(1);
        // What it holds from that process, by sequence number: its delivery log.
        let held: HashMap<u64, Bytes> = self.m[side]
            .delivered
            .lock()
            .expect("delivery log")
            .iter()
            .filter(|(_, b)| usize::from(b[0]) == from)
            .filter_map(|(seq, b)| Some(((*seq)?, b.clone())))
            .collect();
        let mut frames = Vec::new();
        for seq in first..=received.min(first + count) {
            let Some(p) = held.get(&seq) else {
                break;
            };
            wire::encode_data(&mut frames, wire::FLAG_RELIABLE, Some(seq), p);
            self.stats.replayed += 1;
        }
        // An ack of what the peer held at some earlier point: cumulative, so no news.
        let acked = self.m[side].desc_of(k).acked();
        if acked > 0 {
            wire::encode_ack(&mut frames, acked - 1, 0);
            self.stats.stale_acks += 1;
        }
        let pipe = self.links[l].from(from);
        for b in frames.into_iter().rev() {
            pipe.push_front(b);
        }
    }

    /// Moves every byte that can move until nothing does: the live members write and read
    /// all their links (the connections asked for are made), with no time passing.
    pub(super) fn pump(&mut self) {
        for _ in 0..1000 {
            let before = self.progress();
            for side in self.live() {
                while self.dial(side) {}
                for l in 0..self.links.len() {
                    self.write(side, l, usize::MAX);
                }
            }
            for side in self.live() {
                for l in 0..self.links.len() {
                    self.read(side, l, usize::MAX);
                }
            }
            if self.progress() == before {
                return;
            }
        }
        panic!("the members never went quiet");
    }

    /// A measure of activity: pipe bytes, buffered bytes, links, deliveries, acks.
    fn progress(&mut self) -> (usize, usize, usize, usize, u64) {
        let piped: usize = self
            .links
            .iter()
            .map(|l| l.pipe[0].len() + l.pipe[1].len() + usize::from(l.open()))
            .sum();
        let live = self.live();
        let buffered: usize = live
            .iter()
            .flat_map(|&s| self.m[s].ep.links().map(|l| l.unwritten() + l.rbuf.len()))
            .sum();
        let delivered = self.m.iter().map(Member::delivered_len).sum();
        let acks = live
            .iter()
            .flat_map(|&s| (0..self.m[s].peers.len()).map(move |k| (s, k)))
            .filter(|&(s, k)| !self.m[s].peers[k].forgotten)
            .map(|(s, k)| self.m[s].desc_of(k).acked())
            .sum();
        (piped, buffered, self.links.len(), delivered, acks)
    }

    /// Sums the members' counters into [`Sim::stats`].
    pub(super) fn gather(&mut self) {
        use crate::sync::atomic::{AtomicU64, Ordering};
        let sum = |f: fn(&NodeCounters) -> &AtomicU64| -> u64 {
            // Relaxed: counters read for the statistics only.
            self.m
                .iter()
                .map(|m| f(&m.counters).load(Ordering::Relaxed))
                .sum()
        };
        self.stats.established = sum(|c| &c.handshakes);
        self.stats.tie_breaks = sum(|c| &c.tie_breaks);
        self.stats.protocol_errors = sum(|c| &c.protocol_errors);
        self.stats.auth_refusals = sum(|c| &c.auth_failures);
        let peers = |f: fn(&crate::peer::Counters) -> &AtomicU64| -> u64 {
            self.m
                .iter()
                .flat_map(|m| &m.peers)
                .map(|k| crate::peer::Counters::get(f(&k.shared.counters)))
                .sum()
        };
        self.stats.resent = peers(|c| &c.resent);
        self.stats.duplicates = peers(|c| &c.duplicates);
        self.stats.delivered_then_dropped = self.oracle.delivered_then_dropped;
        self.stats.takeovers = self.oracle.takeovers;
    }

    /// Runs a schedule to completion, checking everything; returns what the faults did.
    pub(super) fn run(s: Settings, steps: &[Step]) -> Stats {
        Sim::run_with(Sim::new(s), steps)
    }

    /// Runs a schedule on `sim` to completion, checking everything; returns what the faults
    /// did.
    pub(super) fn run_with(sim: Sim, steps: &[Step]) -> Stats {
        Sim::run_filtered(sim, steps, |_, _| true)
    }

    /// [`run_with`](Sim::run_with), skipping the steps `applies` says do not apply (to a
    /// member that does not exist yet).
    pub(super) fn run_filtered(
        mut sim: Sim,
        steps: &[Step],
        applies: impl Fn(&Sim, &Step) -> bool,
    ) -> Stats {
        for step in steps {
            if !applies(&sim, step) {
                continue;
            }
            sim.apply(step);
            sim.check();
        }
        sim.settle();
        sim.check_complete();
        sim.gather();
        sim.stats
    }
}
