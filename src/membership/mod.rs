//! Membership without a peer list: SWIM failure detection with suspicion and Lifeguard's
//! refinements, gossip dissemination, join through seeds, one view of the members — as a
//! sans-IO state machine, the same shape as `proto::Endpoint`: [`Membership::handle`] takes
//! a received packet, the time or a command ([`Input`]), [`Membership::poll`] gives packets
//! to send to an address and changes of the view ([`Output`]), and
//! [`Membership::poll_timeout`] says when it next needs the time. No threads, no sockets, no
//! clock of its own; every random choice comes from a generator seeded by the caller, so a
//! run is a function of its inputs (the simulation, `sim.rs`, relies on it).
//!
//! The protocol, its parameters and what is wired: `docs/design.md`, "Membership (SWIM)".
//! The packet encoding: [`codec`].
//!
//! The node runs it inside its endpoint (`proto/endpoint/members.rs`): `Builder::membership`,
//! `Builder::seed`, `Node::members`.

pub mod codec;
#[cfg(test)]
mod sim;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub use codec::{Body, Claim, DecodeError, PacketKey, State};
use codec::{Encoder, Packet};

/// Above this many members the anti-entropy interval grows in proportion, so that a full
/// view exchange (its size grows with the cluster) costs each member the same per second.
pub const SYNC_SCALE_MEMBERS: usize = 32;

/// The protocol's parameters. The defaults are memberlist's LAN configuration (probe every
/// second, three indirect probes, suspicion 4·log10(N) probe intervals, gossip every 200 ms
/// to three members) and Lifeguard's (suspicion up to 6× that, shortened by independent
/// confirmations; probe timing scaled by the local health, up to 8×).
#[derive(Debug, Clone)]
pub struct Config {
    /// How often a member probes one other member (scaled by its local health).
    pub probe_interval: Duration,
    /// How long a direct probe waits for its `Ack` before asking others (scaled likewise).
    pub probe_timeout: Duration,
    /// How many members are asked to probe indirectly (k).
    pub indirect_probes: usize,
    /// Suspicion lasts at least `suspicion_mult · max(1, log10 N)` probe intervals.
    pub suspicion_mult: u32,
    /// ... and at most this many times the minimum, when nobody confirms it.
    pub suspicion_max_mult: u32,
    /// How often queued gossip is sent to [`Config::gossip_fanout`] members.
    pub gossip_interval: Duration,
    /// Members each gossip round goes to.
    pub gossip_fanout: usize,
    /// Each claim is sent `retransmit_mult · ⌈log10(N + 1)⌉` times.
    pub retransmit_mult: u32,
    /// Failed members keep getting gossip this long (so a wrongly failed one can refute).
    pub gossip_to_the_dead: Duration,
    /// Anti-entropy: how often the whole view is exchanged with one random live member
    /// (times ⌈N / [`SYNC_SCALE_MEMBERS`]⌉ above that many members).
    pub sync_interval: Duration,
    /// How often a member exchanges views with one seed or remembered member it does not
    /// see alive (healing partitions), and how often a member that knows nobody retries
    /// its seeds.
    pub rejoin_interval: Duration,
    /// How long a failed or left member stays in the view before it is removed.
    pub reap_after: Duration,
    /// How long the address of a failed member is remembered (for healing) after that.
    pub remember_for: Duration,
    /// The largest packet sent (at most [`codec::MAX_PACKET`]).
    pub max_packet: usize,
    /// The local health multiplier's maximum (Lifeguard's awareness).
    pub max_health: u32,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            probe_interval: Duration::from_secs(1),
            probe_timeout: Duration::from_millis(500),
            indirect_probes: 3,
            suspicion_mult: 4,
            suspicion_max_mult: 6,
            gossip_interval: Duration::from_millis(200),
            gossip_fanout: 3,
            retransmit_mult: 4,
            gossip_to_the_dead: Duration::from_secs(30),
            sync_interval: Duration::from_secs(30),
            rejoin_interval: Duration::from_secs(10),
            reap_after: Duration::from_secs(60),
            remember_for: Duration::from_secs(600),
            max_packet: codec::MAX_PACKET,
            max_health: 8,
        }
    }
}

/// Who this member is.
#[derive(Debug, Clone)]
pub struct Local {
    /// The cluster's name (packets of another cluster are ignored).
    pub cluster: String,
    /// This member's name: unique per live process.
    pub name: String,
    /// Where it receives membership packets.
    pub addr: SocketAddr,
    /// This process's launch id.
    pub launch: u64,
    /// The cluster secret: with one, every packet is MACed and only MACed packets are read.
    pub key: Option<PacketKey>,
}

/// One member as this member sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its name.
    pub name: String,
    /// Its address.
    pub addr: SocketAddr,
    /// Its state.
    pub state: State,
    /// Its incarnation (raised by the member itself to refute a suspicion, or on rejoining).
    pub incarnation: u64,
    /// Its process's launch id.
    pub launch: u64,
}

/// A change of the view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberEvent {
    /// A member was added, or its state, incarnation, launch or address changed.
    Changed {
        /// It now.
        member: Member,
        /// It before; `None` when it is new to the view.
        previous: Option<Member>,
    },
    /// A failed or left member was removed from the view after [`Config::reap_after`].
    Removed {
        /// It as it was last.
        member: Member,
    },
}

/// What the caller hands in.
#[derive(Debug)]
pub enum Input<'a> {
    /// A packet arrived from `from`.
    Packet {
        /// The sender's address.
        from: SocketAddr,
        /// The bytes.
        data: &'a [u8],
    },
    /// The time [`Membership::poll_timeout`] asked for has come (or any later time).
    Timer,
    /// Join through these seeds (any member's address): exchange views with each until one
    /// answers; later, rejoin through them after a partition.
    Join(&'a [SocketAddr]),
    /// Leave: gossip a clean leave, stop probing. [`Membership::leave_settled`] says when the
    /// leave has been gossiped enough for the caller to stop.
    Leave,
}

/// What the caller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send `packet` to `to`.
    Send {
        /// The address.
        to: SocketAddr,
        /// The bytes (at most [`Config::max_packet`]).
        packet: Vec<u8>,
    },
    /// The view changed.
    Event(MemberEvent),
}

/// Membership's traffic counters ([`Node::membership_stats`](crate::Node::membership_stats)),
/// cumulative since the node started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct MembershipStats {
    /// Packets sent (probes, acks, gossip, view exchanges).
    pub packets_sent: u64,
    /// Bytes of those.
    pub bytes_sent: u64,
    /// Packets received and accepted.
    pub packets_received: u64,
    /// Bytes of those.
    pub bytes_received: u64,
    /// Packets dropped: not decodable, of another cluster, or not authenticated.
    pub dropped: u64,
    /// Of those, the ones whose MAC was missing, unexpected or wrong (a member without the
    /// cluster's secret, or a stranger).
    pub auth_failures: u64,
    /// Gossip ignored because its sender is not in the view and did not join.
    pub ignored_strangers: u64,
    /// Times this member raised its incarnation to refute a suspicion about itself.
    pub refutations: u64,
    /// Claims that a member failed, taken as a suspicion instead because this member had
    /// heard from it more recently than a suspicion lasts.
    pub doubted_failures: u64,
    /// Claims from a second process under a live member's name (another launch at another
    /// address), ignored: the process the view holds keeps the name while it is alive. On
    /// the second process, the claims of the first it did not fight.
    pub twin_claims: u64,
}

/// A SplitMix64 generator: small, fast, and seeded by the caller, so runs repeat.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// `k` distinct picks from `items`, in random order.
    fn pick<T: Clone>(&mut self, items: &[T], k: usize) -> Vec<T> {
        let mut v = items.to_vec();
        let k = k.min(v.len());
        for i in 0..k {
            let j = i + self.below(v.len() - i);
            v.swap(i, j);
        }
        v.truncate(k);
        v
    }
}

/// Where a claim comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// This member's own verdict (its suspicion ran out).
    Own,
    /// Gossip: news.
    Gossip,
    /// A view exchange: the sender's standing beliefs.
    Sync,
}

/// A suspicion of one member at one incarnation (Lifeguard's dynamic timeout).
#[derive(Debug, Clone)]
struct Suspicion {
    incarnation: u64,
    start: Instant,
    min: Duration,
    max: Duration,
    /// Confirmations expected (k), 0 when the cluster is too small to expect any.
    expected: u32,
    /// Members that suspect it (the first, then the confirmations).
    by: BTreeSet<String>,
    /// Whether this member has probed it since (a suspect is probed out of turn, once).
    probed: bool,
    deadline: Instant,
}

impl Suspicion {
    fn update_deadline(&mut self) {
        let confirmations = self.by.len().saturating_sub(1) as f64;
        let timeout = if self.expected == 0 {
            self.min
        } else {
            let frac = (confirmations + 1.0).ln() / (f64::from(self.expected) + 1.0).ln();
            let span = self.max.saturating_sub(self.min).as_secs_f64();
            let t = self.max.as_secs_f64() - span * frac.min(1.0);
            Duration::from_secs_f64(t.max(self.min.as_secs_f64()))
        };
        self.deadline = self.start + timeout;
    }
}

/// Another member, as this one sees it.
#[derive(Debug, Clone)]
struct Entry {
    addr: SocketAddr,
    launch: u64,
    incarnation: u64,
    state: State,
    /// When the state last changed.
    since: Instant,
    suspicion: Option<Suspicion>,
    /// When a packet from it last arrived.
    heard: Option<Instant>,
}

/// The probe in progress.
#[derive(Debug, Clone)]
struct Probe {
    target: String,
    seq: u32,
    /// When the direct probe gives up and indirect ones start.
    direct_deadline: Option<Instant>,
    /// When the probe fails.
    round_end: Instant,
    expected_nacks: u32,
    nacks: u32,
}

/// A probe this member makes for another (`PingReq`).
#[derive(Debug, Clone)]
struct Relay {
    seq: u32,
    origin: SocketAddr,
    origin_seq: u32,
    deadline: Instant,
}

/// A claim being gossiped, and how many packets carried it.
#[derive(Debug, Clone)]
struct Broadcast {
    claim: Claim,
    sent: u32,
    /// Order of queuing: among claims sent as often, the newest go first.
    order: u64,
}

/// One member's membership protocol. See the module's documentation.
#[derive(Debug)]
pub struct Membership {
    cfg: Config,
    me: Local,
    cluster: u32,
    incarnation: u64,
    left: bool,
    members: BTreeMap<String, Entry>,
    /// Probe order: shuffled names, walked round-robin, reshuffled at the end.
    order: Vec<String>,
    next_in_order: usize,
    probe: Option<Probe>,
    relays: Vec<Relay>,
    broadcasts: BTreeMap<String, Broadcast>,
    broadcast_order: u64,
    out: VecDeque<Output>,
    seq: u32,
    rng: Rng,
    /// Lifeguard's local health multiplier: 0 healthy, up to `max_health`.
    health: u32,
    seeds: Vec<SocketAddr>,
    /// View exchanges with every seed since the last join while no seed is seen alive.
    join_retries: u32,
    /// Failed members' addresses, kept after they leave the view (until when).
    remembered: BTreeMap<String, (SocketAddr, Instant)>,
    /// Senders not in the view this member exchanged views with, and when.
    strangers_synced: BTreeMap<String, Instant>,
    /// Another process holds this member's name in the views (see
    /// [`Membership::about_me`]): until it is declared failed or leaves, this one exchanges
    /// views with a live member every rejoin interval, to learn when.
    shadowed: bool,
    /// Processes under a name held by another (name, launch, address) already logged.
    twins_logged: BTreeSet<(String, u64, SocketAddr)>,
    /// Members added to the view on a third member's word, to greet, and when (see
    /// [`Membership::greet`]).
    to_greet: VecDeque<(String, Instant)>,
    /// Greetings go out at most [`Config::gossip_fanout`] per gossip interval: not before.
    next_greet: Instant,
    next_probe: Option<Instant>,
    next_gossip: Instant,
    next_sync: Instant,
    next_rejoin: Option<Instant>,
    stats: MembershipStats,
}

impl Membership {
    /// A member alone in its view, alive at incarnation 0; `seed` seeds its random choices.
    /// Nothing is sent until it joins ([`Input::Join`]) or another member reaches it.
    pub fn new(cfg: Config, me: Local, seed: u64, now: Instant) -> Membership {
        let cluster = codec::cluster_hash(&me.cluster);
        let cfg_rejoin = cfg.rejoin_interval;
        let mut rng = Rng(seed ^ 0x6A09_E667_F3BC_C908);
        // The first view exchange at a random point of the interval: members started
        // together do not all exchange at once, and a gap the gossip left is found sooner.
        let first_sync = cfg
            .sync_interval
            .mul_f64((rng.next() % 1000) as f64 / 1000.0);
        Membership {
            next_gossip: now + cfg.gossip_interval,
            next_sync: now + first_sync,
            next_probe: Some(now + cfg.probe_interval),
            cfg,
            me,
            cluster,
            incarnation: 0,
            left: false,
            members: BTreeMap::new(),
            order: Vec::new(),
            next_in_order: 0,
            probe: None,
            relays: Vec::new(),
            broadcasts: BTreeMap::new(),
            broadcast_order: 0,
            out: VecDeque::new(),
            seq: 0,
            rng,
            health: 0,
            seeds: Vec::new(),
            join_retries: 0,
            remembered: BTreeMap::new(),
            next_rejoin: Some(now + cfg_rejoin),
            strangers_synced: BTreeMap::new(),
            to_greet: VecDeque::new(),
            next_greet: now,
            twins_logged: BTreeSet::new(),
            shadowed: false,
            stats: MembershipStats::default(),
        }
    }

    /// This member's name.
    pub fn name(&self) -> &str {
        &self.me.name
    }

    /// Its current incarnation.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The view: this member first, then the others by name, failed and left ones until they
    /// are removed.
    pub fn members(&self) -> Vec<Member> {
        let mut v = Vec::with_capacity(self.members.len() + 1);
        v.push(Member {
            name: self.me.name.clone(),
            addr: self.me.addr,
            state: if self.left { State::Left } else { State::Alive },
            incarnation: self.incarnation,
            launch: self.me.launch,
        });
        v.extend(self.members.iter().map(|(n, e)| member(n, e)));
        v
    }

    /// One member of the view (not this one).
    pub fn member(&self, name: &str) -> Option<Member> {
        self.members.get(name).map(|e| member(name, e))
    }

    /// Counters.
    pub fn stats(&self) -> &MembershipStats {
        &self.stats
    }

    /// Lifeguard's local health multiplier (0: healthy).
    pub fn health(&self) -> u32 {
        self.health
    }

    /// After [`Input::Leave`]: whether the leave has been sent as often as any claim is (or
    /// there is nobody to tell), so the caller may stop driving this member.
    pub fn leave_settled(&self) -> bool {
        let nobody = !self
            .members
            .values()
            .any(|e| matches!(e.state, State::Alive | State::Suspect));
        self.left && (nobody || !self.broadcasts.contains_key(&self.me.name))
    }

    /// Members counted for the timing formulas: the live ones and this one.
    fn live_count(&self) -> usize {
        1 + self
            .members
            .values()
            .filter(|e| matches!(e.state, State::Alive | State::Suspect))
            .count()
    }

    fn scaled(&self, d: Duration) -> Duration {
        d * (self.health + 1)
    }

    fn self_claim(&self) -> Claim {
        Claim {
            name: self.me.name.clone(),
            addr: self.me.addr,
            launch: self.me.launch,
            incarnation: self.incarnation,
            state: if self.left { State::Left } else { State::Alive },
            by: None,
        }
    }

    /// Takes in a packet, the time, or a command.
    pub fn handle(&mut self, now: Instant, input: Input<'_>) {
        match input {
            Input::Packet { from, data } => self.on_packet(now, from, data),
            Input::Timer => self.on_timer(now),
            Input::Join(seeds) => {
                for s in seeds {
                    if *s != self.me.addr && !self.seeds.contains(s) {
                        self.seeds.push(*s);
                    }
                }
                self.queue_broadcast(self.self_claim());
                for s in self.seeds.clone() {
                    self.send_sync(now, s, true);
                }
                self.join_retries = 0;
                self.next_rejoin = Some(now + self.cfg.probe_interval);
            }
            Input::Leave => {
                if self.left {
                    return;
                }
                self.left = true;
                self.probe = None;
                self.next_probe = None;
                self.queue_broadcast(self.self_claim());
                // Tell some members at once; the gossip rounds do the rest.
                let targets = self.gossip_targets(now);
                for t in targets {
                    self.send_gossip(now, t);
                }
            }
        }
    }

    /// The next thing to do, if any.
    pub fn poll(&mut self, _now: Instant) -> Option<Output> {
        self.out.pop_front()
    }

    /// When [`Input::Timer`] is next needed.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = [
            self.next_probe,
            self.probe.as_ref().and_then(|p| p.direct_deadline),
            self.probe.as_ref().map(|p| p.round_end),
            self.relays.iter().map(|r| r.deadline).min(),
            (!self.broadcasts.is_empty()).then_some(self.next_gossip),
            (!self.left).then_some(self.next_sync),
            if self.left { None } else { self.next_rejoin },
            self.members
                .values()
                .filter(|_| !self.left)
                .filter_map(|e| e.suspicion.as_ref().map(|s| s.deadline))
                .min(),
            self.members
                .values()
                .filter(|e| matches!(e.state, State::Failed | State::Left))
                .map(|e| e.since + self.cfg.reap_after)
                .min(),
            if self.left {
                None
            } else {
                self.to_greet.front().map(|g| g.1.max(self.next_greet))
            },
        ]
        .into_iter()
        .flatten()
        .min();
        if let Some(r) = self.remembered.values().map(|(_, until)| *until).min() {
            t = Some(t.map_or(r, |t| t.min(r)));
        }
        t
    }

    // ---- sending ----

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    fn encoder(&self, body: &Body) -> Encoder {
        Encoder::new(
            self.cluster,
            &self.me.name,
            self.me.launch,
            self.incarnation,
            body,
            self.me.key.is_some(),
            self.cfg.max_packet,
        )
    }

    fn emit(&mut self, to: SocketAddr, e: Encoder) {
        let packet = e.finish(self.me.key.as_ref());
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += packet.len() as u64;
        self.out.push_back(Output::Send { to, packet });
    }

    /// How many packets carry each claim.
    fn retransmit_limit(&self) -> u32 {
        let n = self.live_count() as f64;
        self.cfg.retransmit_mult * ((n + 1.0).log10().ceil() as u32).max(1)
    }

    /// Adds queued claims (least sent first, newest first among equals) while they fit;
    /// `first`, if any, goes in before them.
    fn piggyback(&mut self, e: &mut Encoder, first: Option<&str>) {
        let limit = self.retransmit_limit();
        let mut queued: Vec<(u32, std::cmp::Reverse<u64>, String)> = self
            .broadcasts
            .iter()
            .map(|(n, b)| (b.sent, std::cmp::Reverse(b.order), n.clone()))
            .collect();
        queued.sort();
        if let Some(f) = first {
            if let Some(pos) = queued.iter().position(|q| q.2 == f) {
                let q = queued.remove(pos);
                queued.insert(0, q);
            }
        }
        for (_, _, name) in queued {
            let Some(b) = self.broadcasts.get_mut(&name) else {
                continue;
            };
            if !e.push(&b.claim) {
                if e.count() >= usize::from(u8::MAX) {
                    break;
                }
                continue;
            }
            b.sent += 1;
            if b.sent >= limit {
                self.broadcasts.remove(&name);
            }
        }
    }

    fn send_body(&mut self, to: SocketAddr, body: Body, first: Option<&str>) {
        let mut e = self.encoder(&body);
        self.piggyback(&mut e, first);
        self.emit(to, e);
    }

    fn send_gossip(&mut self, _now: Instant, to: SocketAddr) {
        self.send_body(to, Body::Gossip, None);
    }

    /// The whole view (this member's claim first) to `to`, over as many packets as it takes;
    /// only the first asks for a reply.
    fn send_sync(&mut self, _now: Instant, to: SocketAddr, reply: bool) {
        let mut claims = vec![self.self_claim()];
        claims.extend(self.members.iter().map(|(n, e)| Claim {
            name: n.clone(),
            addr: e.addr,
            launch: e.launch,
            incarnation: e.incarnation,
            state: e.state,
            by: None,
        }));
        let mut first = true;
        let mut rest = claims.as_slice();
        while !rest.is_empty() {
            let mut e = self.encoder(&Body::Sync {
                reply: reply && first,
            });
            let mut n = 0;
            while n < rest.len() && e.push(&rest[n]) {
                n += 1;
            }
            rest = &rest[n..];
            first = false;
            self.emit(to, e);
        }
    }

    fn queue_broadcast(&mut self, claim: Claim) {
        self.broadcast_order += 1;
        let order = self.broadcast_order;
        self.broadcasts.insert(
            claim.name.clone(),
            Broadcast {
                claim,
                sent: 0,
                order,
            },
        );
    }

    /// Live members, and members failed within [`Config::gossip_to_the_dead`].
    fn gossip_targets(&mut self, now: Instant) -> Vec<SocketAddr> {
        let candidates: Vec<SocketAddr> = self
            .members
            .values()
            .filter(|e| match e.state {
                State::Alive | State::Suspect => true,
                State::Failed => now < e.since + self.cfg.gossip_to_the_dead,
                State::Left => false,
            })
            .map(|e| e.addr)
            .collect();
        self.rng.pick(&candidates, self.cfg.gossip_fanout)
    }

    // ---- receiving ----

    fn on_packet(&mut self, now: Instant, from: SocketAddr, data: &[u8]) {
        let p = match codec::decode(data, self.me.key.as_ref()) {
            Ok(p) => p,
            Err(e) => {
                self.stats.dropped += 1;
                if matches!(e, DecodeError::Tag | DecodeError::TagPresence(_)) {
                    self.stats.auth_failures += 1;
                }
                log::debug!("membership packet from {from} dropped: {e}");
                return;
            }
        };
        if p.cluster != self.cluster || p.from == self.me.name || self.left {
            self.stats.dropped += 1;
            return;
        }
        self.stats.packets_received += 1;
        self.stats.bytes_received += data.len() as u64;
        let Packet {
            from: sender,
            launch,
            incarnation,
            body,
            claims,
            ..
        } = p;
        let known = self.members.contains_key(&sender);
        let sync = matches!(body, Body::Sync { .. });
        if !known && !sync {
            // A member (it holds the secret) this one has not heard of: the gossip that
            // would have told of it missed this member. Exchange views with it, at most once
            // per sync interval each.
            self.strangers_synced
                .retain(|_, at| now < *at + self.cfg.sync_interval);
            if !self.strangers_synced.contains_key(&sender) {
                self.strangers_synced.insert(sender.clone(), now);
                self.send_sync(now, from, true);
            }
        }
        match body {
            Body::Ping { seq, target } => {
                if target == self.me.name {
                    self.send_body(from, Body::Ack { seq }, None);
                }
            }
            Body::Ack { seq } => self.on_ack(seq),
            Body::Nack { seq } => {
                if let Some(p) = self.probe.as_mut().filter(|p| p.seq == seq) {
                    p.nacks += 1;
                }
            }
            Body::PingReq { seq, target, addr } => {
                // Only members ask for probes: a stranger cannot make this one probe for it.
                if known && target != self.me.name {
                    let my_seq = self.next_seq();
                    self.relays.push(Relay {
                        seq: my_seq,
                        origin: from,
                        origin_seq: seq,
                        deadline: now + self.cfg.probe_timeout,
                    });
                    self.send_body(
                        addr,
                        Body::Ping {
                            seq: my_seq,
                            target,
                        },
                        None,
                    );
                }
            }
            Body::Sync { reply } => {
                if reply {
                    self.send_sync(now, from, false);
                }
            }
            Body::Gossip => {}
        }
        // A member enters the view by joining (a view exchange) or through the gossip of
        // others, never by its own say-so in other packets: a sender not in the view has its
        // claims about itself ignored outside a `Sync` (a wrongly failed member is still in
        // the view, so it can refute). What it says of others counts: it holds the secret.
        for mut c in claims {
            if !known && !sync && c.name == sender {
                self.stats.ignored_strangers += 1;
                continue;
            }
            if c.state == State::Suspect && c.by.is_none() {
                c.by = Some(sender.clone());
            }
            let source = if sync { Source::Sync } else { Source::Gossip };
            self.apply_claim(now, c, source);
        }
        // A packet from a member of the view is its word that it is alive at the incarnation
        // it sends: a refutation reaches whoever it talks to, not only through the gossip.
        if known {
            // Only from the process the view holds: a second process under its name (another
            // launch) speaks for itself through its claims, which carry its address.
            if let Some(e) = self.members.get_mut(&sender).filter(|e| e.launch == launch) {
                e.heard = Some(now);
                if incarnation > e.incarnation {
                    let claim = Claim {
                        name: sender,
                        addr: e.addr,
                        launch,
                        incarnation,
                        state: State::Alive,
                        by: None,
                    };
                    self.apply(now, claim);
                }
            }
        }
    }

    /// Members added to the view on a third member's word get one gossip packet each, a
    /// probe interval later, unless they wrote to this member meanwhile (then they know
    /// it). The claims that told of a member may have reached this one and missed it: a
    /// join wave's gossip, spent while the views were small, leaves some members unaware of
    /// some others, and neither side would notice until one probes the other (up to N probe
    /// intervals) or an anti-entropy exchange (30 s and more). A packet from a member not in
    /// the view starts a view exchange, so the greeting closes such a gap within a round
    /// trip. Waiting an interval lets the gossip do its work first: the greeting then finds
    /// a gap only where the gossip left one. At most [`Config::gossip_fanout`] go out per
    /// gossip interval (a member that learned 63 others at once greets them over 4 s, not
    /// in one burst), each carrying queued gossip like any packet.
    fn greet(&mut self, now: Instant) {
        if now < self.next_greet {
            return;
        }
        let mut sent = 0;
        while let Some((name, at)) = self.to_greet.front() {
            if now < *at || sent >= self.cfg.gossip_fanout {
                break;
            }
            let to = self
                .members
                .get(name)
                .filter(|e| e.heard.is_none() && matches!(e.state, State::Alive | State::Suspect))
                .map(|e| e.addr);
            self.to_greet.pop_front();
            if let Some(to) = to {
                self.send_gossip(now, to);
                sent += 1;
            }
        }
        if sent > 0 {
            self.next_greet = now + self.cfg.gossip_interval;
        }
    }

    fn on_ack(&mut self, seq: u32) {
        if self.probe.as_ref().is_some_and(|p| p.seq == seq) {
            self.probe = None;
            self.health = self.health.saturating_sub(1);
            return;
        }
        if let Some(i) = self.relays.iter().position(|r| r.seq == seq) {
            let r = self.relays.swap_remove(i);
            self.send_body(r.origin, Body::Ack { seq: r.origin_seq }, None);
        }
    }

    /// Takes in one claim: newer news replaces older (incarnation first, then the state's
    /// precedence), and is gossiped on; a claim about this member that is not the truth is
    /// refuted.
    fn apply(&mut self, now: Instant, c: Claim) {
        self.apply_claim(now, c, Source::Gossip);
    }

    /// [`Membership::apply`], for a claim from `source`.
    fn apply_claim(&mut self, now: Instant, mut c: Claim, source: Source) {
        if c.name == self.me.name {
            self.about_me(c);
            return;
        }
        let doubt = self.suspicion_min();
        if let Some(e) = self.members.get(&c.name) {
            if is_twin(e, &c) {
                // A second process under a live member's name: the one the view holds keeps
                // it while it is alive, as the transport keeps the name's live connection.
                self.stats.twin_claims += 1;
                let (held, key) = (e.addr, (c.name.clone(), c.launch, c.addr));
                if self.twins_logged.len() < 64 && self.twins_logged.insert(key) {
                    log::warn!(
                        "{}: '{}' at {} claims the name of the member alive at {held} (another process); ignored while that one is alive",
                        self.me.name,
                        c.name,
                        c.addr
                    );
                }
                return;
            }
        }
        let Some(e) = self.members.get_mut(&c.name) else {
            // Only live members are added; news of the death of a stranger is not news.
            if matches!(c.state, State::Alive | State::Suspect) {
                let entry = Entry {
                    addr: c.addr,
                    launch: c.launch,
                    incarnation: c.incarnation,
                    state: c.state,
                    since: now,
                    suspicion: None,
                    heard: None,
                };
                self.members.insert(c.name.clone(), entry);
                self.remembered.remove(&c.name);
                if source != Source::Own {
                    self.to_greet
                        .push_back((c.name.clone(), now + self.cfg.probe_interval));
                }
                let at = self.rng.below(self.order.len() + 1);
                self.order.insert(at, c.name.clone());
                if c.state == State::Suspect {
                    self.start_suspicion(now, &c.name, c.incarnation, c.by.clone());
                }
                let m = self.member(&c.name);
                if let Some(member) = m {
                    self.out.push_back(Output::Event(MemberEvent::Changed {
                        member,
                        previous: None,
                    }));
                }
                self.queue_broadcast(c);
            }
            return;
        };
        // A verdict of failure is doubted — taken as a suspicion, which the member refutes
        // when this one probes it, or which fails it if it is indeed gone — when it comes in
        // a view exchange (a member's standing beliefs, maybe formed across a partition that
        // has healed since), or about a member this one heard from more recently than any
        // suspicion lasts (the one declaring it waited at least that long since it last heard
        // of it: the two were cut off from each other, not the member from everyone).
        let doubted = match source {
            Source::Own => false,
            Source::Sync => true,
            Source::Gossip => e.heard.is_some_and(|h| now < h + doubt),
        };
        if doubted && c.state == State::Failed && matches!(e.state, State::Alive | State::Suspect) {
            self.stats.doubted_failures += 1;
            c.state = State::Suspect;
            c.by = None;
        }
        let news = (c.incarnation, c.state.rank()) > (e.incarnation, e.state.rank());
        if !news {
            // The same suspicion from another member confirms it (Lifeguard).
            if c.state == State::Suspect
                && e.state == State::Suspect
                && c.incarnation == e.incarnation
            {
                if let (Some(s), Some(by)) = (e.suspicion.as_mut(), c.by.as_ref()) {
                    if s.by.insert(by.clone()) {
                        s.update_deadline();
                        self.queue_broadcast(c);
                    }
                }
            }
            return;
        }
        let previous = member(&c.name, e);
        e.addr = c.addr;
        e.launch = c.launch;
        e.incarnation = c.incarnation;
        if e.state != c.state {
            e.since = now;
        }
        e.state = c.state;
        e.suspicion = None;
        match c.state {
            State::Suspect => self.start_suspicion(now, &c.name, c.incarnation, c.by.clone()),
            State::Alive => {
                if !self.order.contains(&c.name) {
                    let at = self.rng.below(self.order.len() + 1);
                    self.order.insert(at, c.name.clone());
                }
            }
            State::Failed | State::Left => {}
        }
        if let Some(member) = self.member(&c.name) {
            self.out.push_back(Output::Event(MemberEvent::Changed {
                member,
                previous: Some(previous),
            }));
        }
        self.queue_broadcast(c);
    }

    /// A claim about this member: anything but the truth at its incarnation or later is
    /// refuted by raising the incarnation above it (the standard SWIM refutation; also how a
    /// restarted member takes its place back from what is said of its previous life).
    fn about_me(&mut self, c: Claim) {
        if self.left || c.incarnation < self.incarnation {
            return;
        }
        if c.launch != self.me.launch
            && c.addr != self.me.addr
            && matches!(c.state, State::Alive | State::Suspect)
        {
            // Another process, at another address, holds (or held, and is not declared
            // failed yet) this name. Raising the incarnation over it would start a fight
            // neither can win for good — each refutation answered by the other's — with the
            // view's address of the name flipping at every round. This process does not
            // fight: members keep the process they hold while it is alive, and this one takes
            // the name only once the other is declared failed or has left (a claim of that is
            // refuted below).
            self.stats.twin_claims += 1;
            self.shadowed = true;
            let key = (c.name.clone(), c.launch, c.addr);
            if self.twins_logged.len() < 64 && self.twins_logged.insert(key) {
                log::warn!(
                    "{}: another process holds this member's name at {} (this one is at {}); not taking it while that one is alive",
                    self.me.name,
                    c.addr,
                    self.me.addr
                );
            }
            return;
        }
        let truth = c.state == State::Alive
            && c.launch == self.me.launch
            && c.addr == self.me.addr
            && c.incarnation == self.incarnation;
        if truth {
            return;
        }
        self.incarnation = c.incarnation + 1;
        self.shadowed = false;
        self.stats.refutations += 1;
        // Lifeguard: being suspected hints that this member is slow to answer.
        self.health = (self.health + 1).min(self.cfg.max_health);
        self.queue_broadcast(self.self_claim());
    }

    /// The shortest a suspicion lasts: `suspicion_mult · max(1, log10 N)` probe intervals.
    fn suspicion_min(&self) -> Duration {
        let n = self.live_count() as f64;
        self.cfg
            .probe_interval
            .mul_f64(f64::from(self.cfg.suspicion_mult) * n.log10().max(1.0))
    }

    fn start_suspicion(&mut self, now: Instant, name: &str, incarnation: u64, by: Option<String>) {
        let min = self.suspicion_min();
        let max = min * self.cfg.suspicion_max_mult;
        // With fewer members than k + 2, no k independent confirmations can come.
        let expected = if self.live_count() >= self.cfg.indirect_probes + 2 {
            self.cfg.indirect_probes as u32
        } else {
            0
        };
        let Some(e) = self.members.get_mut(name) else {
            return;
        };
        let mut s = Suspicion {
            incarnation,
            start: now,
            min,
            max,
            expected,
            by: by.into_iter().collect(),
            probed: false,
            deadline: now,
        };
        s.update_deadline();
        e.suspicion = Some(s);
    }

    // ---- time ----

    fn on_timer(&mut self, now: Instant) {
        if !self.left {
            self.probe_timers(now);
            self.suspicion_timers(now);
            if now >= self.next_sync {
                // Scaled with the cluster so that its bytes per member per second stay flat.
                let scale = self.live_count().div_ceil(SYNC_SCALE_MEMBERS).max(1) as u32;
                self.next_sync = now + self.cfg.sync_interval * scale;
                let live: Vec<SocketAddr> = self
                    .members
                    .values()
                    .filter(|e| e.state == State::Alive)
                    .map(|e| e.addr)
                    .collect();
                if let Some(to) = self.rng.pick(&live, 1).pop() {
                    self.send_sync(now, to, true);
                }
            }
            if self.next_rejoin.is_some_and(|t| now >= t) {
                self.rejoin(now);
            }
            self.greet(now);
        }
        for r in std::mem::take(&mut self.relays) {
            if now >= r.deadline {
                self.send_body(r.origin, Body::Nack { seq: r.origin_seq }, None);
            } else {
                self.relays.push(r);
            }
        }
        if now >= self.next_gossip {
            self.next_gossip = now + self.cfg.gossip_interval;
            if !self.broadcasts.is_empty() {
                for t in self.gossip_targets(now) {
                    self.send_gossip(now, t);
                }
            }
        }
        self.reap(now);
    }

    fn probe_timers(&mut self, now: Instant) {
        // The probe in progress: direct timeout, then the end of the round.
        if let Some(p) = self.probe.as_mut() {
            if p.direct_deadline.is_some_and(|t| now >= t) {
                p.direct_deadline = None;
                let target = p.target.clone();
                let seq = p.seq;
                if let Some(addr) = self.members.get(&target).map(|e| e.addr) {
                    let helpers: Vec<SocketAddr> = self
                        .members
                        .iter()
                        .filter(|(n, e)| **n != target && e.state == State::Alive)
                        .map(|(_, e)| e.addr)
                        .collect();
                    let helpers = self.rng.pick(&helpers, self.cfg.indirect_probes);
                    if let Some(p) = self.probe.as_mut() {
                        p.expected_nacks = helpers.len() as u32;
                    }
                    for h in helpers {
                        let body = Body::PingReq {
                            seq,
                            target: target.clone(),
                            addr,
                        };
                        self.send_body(h, body, None);
                    }
                }
            }
        }
        if self.probe.as_ref().is_some_and(|p| now >= p.round_end) {
            if let Some(p) = self.probe.take() {
                self.probe_failed(now, p);
            }
        }
        if self.next_probe.is_some_and(|t| now >= t) && self.probe.is_none() {
            self.start_probe(now);
        }
    }

    fn probe_failed(&mut self, now: Instant, p: Probe) {
        // Lifeguard: a missing nack hints that this member is the slow one; with nacks from
        // every helper, the target is the one not answering. One step per probe, not one per
        // missing nack (memberlist's count): helpers cut off by a partition send none either,
        // and probing every 9 s there would slow detection on both sides of the cut.
        let delta = if p.expected_nacks > 0 {
            u32::from(p.nacks < p.expected_nacks)
        } else {
            1
        };
        self.health = (self.health + delta).min(self.cfg.max_health);
        let Some(e) = self.members.get(&p.target) else {
            return;
        };
        let claim = Claim {
            name: p.target.clone(),
            addr: e.addr,
            launch: e.launch,
            incarnation: e.incarnation,
            state: State::Suspect,
            by: Some(self.me.name.clone()),
        };
        match e.state {
            State::Alive | State::Suspect => self.apply(now, claim),
            State::Failed | State::Left => {}
        }
    }

    /// Probes the next live member in the shuffled order.
    fn start_probe(&mut self, now: Instant) {
        let interval = self.scaled(self.cfg.probe_interval);
        self.next_probe = Some(now + interval);
        // A suspect first, out of turn, once per suspicion: its probe carries the suspicion
        // (so it can refute), its answer carries its incarnation (so a refutation the gossip
        // missed still arrives), and a dead one gets its confirmations sooner.
        let suspects: Vec<String> = self
            .members
            .iter()
            .filter(|(_, e)| {
                e.state == State::Suspect && e.suspicion.as_ref().is_some_and(|s| !s.probed)
            })
            .map(|(n, _)| n.clone())
            .collect();
        let mut target = self.rng.pick(&suspects, 1).pop();
        if let Some(s) = target
            .as_ref()
            .and_then(|t| self.members.get_mut(t))
            .and_then(|e| e.suspicion.as_mut())
        {
            s.probed = true;
        }
        for _ in 0..=self.order.len() {
            if target.is_some() {
                break;
            }
            if self.next_in_order >= self.order.len() {
                let members = &self.members;
                self.order.retain(|n| {
                    members
                        .get(n)
                        .is_some_and(|e| matches!(e.state, State::Alive | State::Suspect))
                });
                let mut order = std::mem::take(&mut self.order);
                let len = order.len();
                order = self.rng.pick(&order, len);
                self.order = order;
                self.next_in_order = 0;
                if self.order.is_empty() {
                    break;
                }
            }
            let name = self.order[self.next_in_order].clone();
            self.next_in_order += 1;
            if self
                .members
                .get(&name)
                .is_some_and(|e| matches!(e.state, State::Alive | State::Suspect))
            {
                target = Some(name);
                break;
            }
        }
        let Some(target) = target else {
            return;
        };
        let Some(addr) = self.members.get(&target).map(|e| e.addr) else {
            return;
        };
        let seq = self.next_seq();
        self.probe = Some(Probe {
            target: target.clone(),
            seq,
            direct_deadline: Some(now + self.scaled(self.cfg.probe_timeout)),
            round_end: now + interval,
            expected_nacks: 0,
            nacks: 0,
        });
        // A suspect hears of its suspicion first, so it can refute (Lifeguard's buddy system).
        let first = Some(target.clone());
        self.send_body(
            addr,
            Body::Ping {
                seq,
                target: target.clone(),
            },
            first.as_deref(),
        );
    }

    fn suspicion_timers(&mut self, now: Instant) {
        let due: Vec<(String, u64)> = self
            .members
            .iter()
            .filter_map(|(n, e)| {
                let s = e.suspicion.as_ref()?;
                (now >= s.deadline && e.state == State::Suspect).then(|| (n.clone(), s.incarnation))
            })
            .collect();
        for (name, incarnation) in due {
            let Some(e) = self.members.get(&name) else {
                continue;
            };
            let claim = Claim {
                name: name.clone(),
                addr: e.addr,
                launch: e.launch,
                incarnation,
                state: State::Failed,
                by: None,
            };
            self.apply_claim(now, claim, Source::Own);
        }
    }

    /// A member that knows nobody retries its seeds; one that knows some exchanges views
    /// with one seed or remembered member it does not see alive (so partitions heal).
    fn rejoin(&mut self, now: Instant) {
        let alone = !self
            .members
            .values()
            .any(|e| matches!(e.state, State::Alive | State::Suspect));
        if alone {
            self.next_rejoin = Some(now + self.cfg.probe_interval);
            for s in self.seeds.clone() {
                self.send_sync(now, s, true);
            }
            return;
        }
        let live: BTreeSet<SocketAddr> = self
            .members
            .values()
            .filter(|e| matches!(e.state, State::Alive | State::Suspect))
            .map(|e| e.addr)
            .collect();
        // Joined, but no seed is seen alive: the join's exchange with the seeds may have
        // been lost while a member that joined through this one made it not alone — the
        // two would be an island until the rejoin interval. The seeds are asked again
        // after 1, 2, 4, ... probe intervals, up to the rejoin interval (a dead seed costs
        // no more than the rejoin does, after that).
        let unjoined = !self.seeds.is_empty() && !self.seeds.iter().any(|s| live.contains(s));
        let backoff = self.cfg.probe_interval * 2u32.saturating_pow(self.join_retries);
        if unjoined && backoff < self.cfg.rejoin_interval {
            self.join_retries += 1;
            self.next_rejoin = Some(now + backoff);
            for s in self.seeds.clone() {
                self.send_sync(now, s, true);
            }
            return;
        }
        self.next_rejoin = Some(now + self.cfg.rejoin_interval);
        let mut candidates: Vec<SocketAddr> = self
            .seeds
            .iter()
            .filter(|s| !live.contains(s))
            .copied()
            .collect();
        candidates.extend(
            self.members
                .values()
                .filter(|e| e.state == State::Failed)
                .map(|e| e.addr),
        );
        candidates.extend(self.remembered.values().map(|(a, _)| *a));
        candidates.sort();
        candidates.dedup();
        candidates.retain(|a| !live.contains(a) && *a != self.me.addr);
        if let Some(to) = self.rng.pick(&candidates, 1).pop() {
            self.send_sync(now, to, true);
        }
        if self.shadowed {
            // The members gossip nothing to a process they do not hold: it asks.
            let live: Vec<SocketAddr> = live.into_iter().collect();
            if let Some(to) = self.rng.pick(&live, 1).pop() {
                self.send_sync(now, to, true);
            }
        }
    }

    fn reap(&mut self, now: Instant) {
        let due: Vec<String> = self
            .members
            .iter()
            .filter(|(_, e)| {
                matches!(e.state, State::Failed | State::Left)
                    && now >= e.since + self.cfg.reap_after
            })
            .map(|(n, _)| n.clone())
            .collect();
        for name in due {
            if let Some(e) = self.members.remove(&name) {
                if e.state == State::Failed {
                    self.remembered
                        .insert(name.clone(), (e.addr, now + self.cfg.remember_for));
                }
                self.order.retain(|n| *n != name);
                self.out.push_back(Output::Event(MemberEvent::Removed {
                    member: member(&name, &e),
                }));
            }
        }
        self.remembered.retain(|_, (_, until)| now < *until);
    }
}

/// Whether `c` comes from a second process under the name of live member `e`: another
/// launch at another address (a restart at the same address is the same member's next life).
fn is_twin(e: &Entry, c: &Claim) -> bool {
    matches!(e.state, State::Alive | State::Suspect) && c.launch != e.launch && c.addr != e.addr
}

fn member(name: &str, e: &Entry) -> Member {
    Member {
        name: name.to_owned(),
        addr: e.addr,
        state: e.state,
        incarnation: e.incarnation,
        launch: e.launch,
    }
}

#[cfg(test)]
mod tests {
    use super::codec::{Encoder, MAX_PACKET};
    use super::*;
    use proptest::prelude::*;

    const NAMES: [&str; 6] = ["me", "a", "b", "c", "d", "e"];

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, i], 7000))
    }

    /// One step: a packet from member `from` (any body, any claims about the six names),
    /// or time passing.
    #[derive(Debug, Clone)]
    enum Step {
        Packet {
            from: usize,
            kind: u8,
            seq: u32,
            claims: Vec<(usize, u8, u64, u8, Option<usize>)>,
        },
        Garbage(Vec<u8>),
        Wait(u16),
        Leave,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (
                1..NAMES.len(),
                0u8..6,
                0u32..8,
                proptest::collection::vec(
                    (
                        0..NAMES.len(),
                        1u8..4,
                        0u64..4,
                        0u8..4,
                        proptest::option::of(0..NAMES.len())
                    ),
                    0..6
                )
            )
                .prop_map(|(from, kind, seq, claims)| Step::Packet { from, kind, seq, claims }),
            1 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(Step::Garbage),
            3 => any::<u16>().prop_map(Step::Wait),
            1 => Just(Step::Leave),
        ]
    }

    fn encode(
        from: usize,
        kind: u8,
        seq: u32,
        claims: &[(usize, u8, u64, u8, Option<usize>)],
    ) -> Vec<u8> {
        let target = NAMES[usize::from(kind) % NAMES.len()].to_owned();
        let body = match kind {
            0 => Body::Ping {
                seq,
                target: "me".into(),
            },
            1 => Body::Ack { seq },
            2 => Body::PingReq {
                seq,
                target,
                addr: addr(9),
            },
            3 => Body::Nack { seq },
            4 => Body::Sync {
                reply: seq % 2 == 0,
            },
            _ => Body::Gossip,
        };
        let key = PacketKey::new(b"k");
        let mut e = Encoder::new(
            codec::cluster_hash("c"),
            NAMES[from],
            1,
            u64::from(seq % 3),
            &body,
            true,
            MAX_PACKET,
        );
        for &(who, a, incarnation, state, by) in claims {
            e.push(&Claim {
                name: NAMES[who].into(),
                addr: addr(a),
                launch: u64::from(a),
                incarnation,
                state: [State::Alive, State::Suspect, State::Failed, State::Left]
                    [usize::from(state)],
                by: by.map(|b| NAMES[b].to_owned()),
            });
        }
        e.finish(Some(&key))
    }

    proptest! {
        /// Whatever authenticated members say, in whatever order and timing: no panic, every
        /// packet within the bound, this member never in its own view of the others, and
        /// after the time it asked for is handed over, it never asks for a time already
        /// past (no busy loop).
        #[test]
        fn any_input_keeps_the_machine_sound(steps in proptest::collection::vec(step(), 1..80)) {
            let start = Instant::now();
            let mut now = start;
            let me = Local {
                cluster: "c".into(),
                name: "me".into(),
                addr: addr(0),
                launch: 1,
                key: Some(PacketKey::new(b"k")),
            };
            let mut m = Membership::new(Config::default(), me, 5, now);
            m.handle(now, Input::Join(&[addr(1)]));
            for s in steps {
                match s {
                    Step::Packet { from, kind, seq, claims } => {
                        let bytes = encode(from, kind, seq, &claims);
                        m.handle(now, Input::Packet { from: addr(from as u8), data: &bytes });
                    }
                    Step::Garbage(bytes) => m.handle(now, Input::Packet { from: addr(7), data: &bytes }),
                    Step::Wait(ms) => {
                        now += Duration::from_millis(u64::from(ms));
                        // Hand over every timer due by then, as a driver does.
                        let mut rounds = 0;
                        while m.poll_timeout().is_some_and(|t| t <= now) {
                            m.handle(now, Input::Timer);
                            let after = m.poll_timeout();
                            prop_assert!(
                                after.is_none_or(|a| a > now),
                                "asked for {:?} at {:?}",
                                after.map(|a| a.saturating_duration_since(start)),
                                now - start
                            );
                            rounds += 1;
                            prop_assert!(rounds < 10_000);
                        }
                    }
                    Step::Leave => m.handle(now, Input::Leave),
                }
                while let Some(o) = m.poll(now) {
                    if let Output::Send { packet, .. } = o {
                        prop_assert!(packet.len() <= MAX_PACKET);
                        prop_assert!(codec::decode(&packet, Some(&PacketKey::new(b"k"))).is_ok());
                    }
                }
                prop_assert!(m.member("me").is_none());
                let view = m.members();
                prop_assert_eq!(view[0].name.as_str(), "me");
            }
        }
    }
}
