//! Seeds: addresses dialled without knowing who answers there (`Builder::seeds`). Whoever
//! answers — of our cluster, authenticated when a secret is set, not ourselves — becomes
//! (or is found to be) a peer, with the seed's address to dial it again. Seeds are dialled
//! at start, and again with backoff whenever the node has no established link at all; a
//! seed that turns out to be this member's own address is never dialled again.
//!
//! A seed given by name (`host:port`) is resolved at start by `Node::start`'s thread, and
//! again, with backoff, while the node reaches nobody: the endpoint asks the driver
//! ([`Output::Resolve`]), which resolves on a short-lived thread of its own (a resolver may
//! block for seconds) and hands the addresses back as a command ([`Input::Resolved`]).
//! An address the name no longer gives is not dialled again; a new one is dialled at once
//! and given to membership to join through.

use super::*;

/// What dialling an address is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// A configured or admitted peer, by id.
    Peer(usize),
    /// A seed, by its index in [`Config::seeds`].
    Seed(usize),
}

/// One seed's state.
#[derive(Debug)]
pub(super) struct Seed {
    pub(super) addr: SocketAddr,
    /// A dial asked of the driver and not reported yet.
    dialling: bool,
    /// Its link, while it has not said who it is for sure (authenticated).
    pub(super) link: Option<LinkId>,
    /// The handshake there named us: our own address, never dialled again.
    own: bool,
    attempt: u32,
    /// Bumped by each dial: a retry timer of an older generation does nothing.
    gen: u64,
    /// The seed name it was resolved from, if any.
    name: Option<usize>,
    /// Its name no longer resolves to it: not dialled again.
    gone: bool,
}

/// One seed name's state (its `host:port` is in [`Config::seed_names`]).
#[derive(Debug, Default)]
pub(super) struct SeedName {
    /// A resolution asked of the driver and not reported yet.
    resolving: bool,
    /// A resolution timer is set.
    due: bool,
    attempt: u32,
    /// Bumped by each timer set: a timer of an older generation does nothing.
    gen: u64,
}

impl Seed {
    pub(super) fn new(addr: SocketAddr, name: Option<usize>) -> Seed {
        Seed {
            addr,
            dialling: false,
            link: None,
            own: false,
            attempt: 0,
            gen: 0,
            name,
            gone: false,
        }
    }

    /// The seeds a node starts with: its addresses, then those its names resolved to.
    pub(super) fn initial(cfg: &Config) -> Vec<Seed> {
        let mut seeds: Vec<Seed> = cfg.seeds.iter().map(|&a| Seed::new(a, None)).collect();
        for (n, (_, addrs)) in cfg.seed_names.iter().enumerate() {
            for &a in addrs {
                if !seeds.iter().any(|s| s.addr == a) {
                    seeds.push(Seed::new(a, Some(n)));
                }
            }
        }
        seeds
    }

    /// Whether it may be dialled (not our own address, still given by its name).
    fn usable(&self) -> bool {
        !self.own && !self.gone
    }
}

/// The seeds: their addresses ([`Config::seeds`], then those the names resolved to at
/// start, then those they resolved to later; an index stays that address's for good) and
/// the names they were given by, with their dials, re-resolution and backoff.
#[derive(Debug)]
pub(super) struct Seeds {
    list: Vec<Seed>,
    /// The seeds given by name, in [`Config::seed_names`]' order.
    names: Vec<SeedName>,
}

impl Seeds {
    /// The seeds a node starts with (none dialled yet).
    pub(super) fn new(cfg: &Config) -> Seeds {
        Seeds {
            list: Seed::initial(cfg),
            names: cfg.seed_names.iter().map(|_| SeedName::default()).collect(),
        }
    }

    /// Whether the node has no seed address.
    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Dials every seed (at start).
    pub(super) fn dial_all(&mut self, events: &mut VecDeque<Output>) {
        for s in 0..self.list.len() {
            self.dial(s, false, events);
        }
    }

    /// Seed `s`'s address.
    pub(super) fn addr(&self, s: usize) -> Option<SocketAddr> {
        self.list.get(s).map(|seed| seed.addr)
    }

    /// Whether seed `s`'s retry timer of generation `gen` is its latest.
    pub(super) fn is_current(&self, s: usize, gen: u64) -> bool {
        self.list.get(s).is_some_and(|seed| seed.gen == gen)
    }

    /// Dials seed `s` if it is idle, not our own address, and the node is not `stopping`.
    pub(super) fn dial(&mut self, s: usize, stopping: bool, events: &mut VecDeque<Output>) {
        let Some(seed) = self.list.get_mut(s) else {
            return;
        };
        if !seed.usable() || seed.dialling || seed.link.is_some() || stopping {
            return;
        }
        seed.dialling = true;
        seed.gen += 1;
        events.push_back(Output::Dial {
            target: Target::Seed(s),
            name: None,
            addr: Addr::Tcp(seed.addr),
        });
    }

    /// The node, not stopping, may reach nobody now: every idle seed is dialled again after
    /// its backoff, and every name resolved again.
    pub(super) fn retry_all(
        &mut self,
        now: Instant,
        cfg: &Config,
        backoff: &mut Backoff,
        timers: &mut Timers,
    ) {
        for (s, seed) in self.list.iter_mut().enumerate() {
            if !seed.usable() || seed.dialling || seed.link.is_some() {
                continue;
            }
            let delay = backoff.delay(seed.attempt, cfg.backoff_min, cfg.backoff_max);
            seed.attempt = seed.attempt.saturating_add(1);
            seed.gen += 1;
            let gen = seed.gen;
            timers.add(now + delay, TimerKind::Seed { seed: s, gen });
        }
        for n in 0..self.names.len() {
            self.resolve_later(now, n, false, cfg, backoff, timers);
        }
    }

    /// Seed name `n` is resolved again after its backoff, unless it is being resolved or
    /// is due already.
    pub(super) fn resolve_later(
        &mut self,
        now: Instant,
        n: usize,
        stopping: bool,
        cfg: &Config,
        backoff: &mut Backoff,
        timers: &mut Timers,
    ) {
        let Some(name) = self.names.get_mut(n) else {
            return;
        };
        if name.resolving || name.due || stopping {
            return;
        }
        // A name is asked of the resolver at most every quarter second (the backoff's
        // minimum is the dials', 20 ms by default: a resolver is not asked that often).
        let min = cfg.backoff_min.max(Duration::from_millis(250));
        let max = cfg.backoff_max.max(min);
        let delay = backoff.delay(name.attempt, min, max);
        name.attempt = name.attempt.saturating_add(1);
        name.due = true;
        name.gen += 1;
        let gen = name.gen;
        timers.add(now + delay, TimerKind::Resolve { name: n, gen });
    }

    /// Seed names that resolved to nothing at start are resolved again after the backoff
    /// (the node, just started, reaches nobody yet).
    pub(super) fn resolve_unresolved(
        &mut self,
        now: Instant,
        cfg: &Config,
        backoff: &mut Backoff,
        timers: &mut Timers,
    ) {
        for n in 0..self.names.len() {
            if !self.list.iter().any(|s| s.name == Some(n)) {
                self.resolve_later(now, n, false, cfg, backoff, timers);
            }
        }
    }

    /// Seed name `n`'s timer (generation `gen`) fired: the driver resolves it if the node
    /// is still `alone` (reaches nobody) and not stopping.
    pub(super) fn resolve_due(&mut self, n: usize, gen: u64, alone: bool, ctx: &mut Ctx) {
        let Some(name) = self.names.get_mut(n) else {
            return;
        };
        if name.gen != gen {
            return;
        }
        name.due = false;
        if !alone || ctx.shutdown.is_some() {
            name.attempt = 0;
            return;
        }
        let Some((host, _)) = ctx.cfg.seed_names.get(n) else {
            return;
        };
        name.resolving = true;
        ctx.out.events.push_back(Output::Resolve {
            name: n,
            host: host.clone(),
        });
    }

    /// Seed name `n` resolved to `addrs` (none: it did not resolve, and the addresses it
    /// gave before stay): one it no longer gives is not dialled again. Returns the new
    /// seeds, or `None` if there is no such name.
    pub(super) fn resolved(
        &mut self,
        n: usize,
        addrs: &[SocketAddr],
        cfg: &Config,
    ) -> Option<Vec<usize>> {
        let name = self.names.get_mut(n)?;
        name.resolving = false;
        let given = cfg
            .seed_names
            .get(n)
            .map_or("?", |(h, _)| h.as_str())
            .to_owned();
        let mut fresh = Vec::new();
        if !addrs.is_empty() {
            for seed in self.list.iter_mut().filter(|s| s.name == Some(n)) {
                seed.gone = !addrs.contains(&seed.addr);
            }
            for &a in addrs {
                match self.list.iter_mut().find(|s| s.addr == a) {
                    Some(seed) => seed.gone = false,
                    None => {
                        log::info!("{}: seed {given} resolved to {a}", cfg.name);
                        self.list.push(Seed::new(a, Some(n)));
                        fresh.push(self.list.len() - 1);
                    }
                }
            }
        }
        Some(fresh)
    }

    /// Seed name `n` reached someone: its next re-resolution starts from the shortest
    /// backoff.
    pub(super) fn name_reached(&mut self, n: usize) {
        if let Some(name) = self.names.get_mut(n) {
            name.attempt = 0;
        }
    }

    /// The driver opened a connection to seed `s` (its dial is over): its address, or
    /// `None` if there is no such seed.
    pub(super) fn dialled(&mut self, s: usize) -> Option<SocketAddr> {
        let seed = self.list.get_mut(s)?;
        seed.dialling = false;
        Some(seed.addr)
    }

    /// Seed `s`'s link is `id` now.
    pub(super) fn linked(&mut self, s: usize, id: LinkId) {
        if let Some(seed) = self.list.get_mut(s) {
            seed.link = Some(id);
        }
    }

    /// No connection to seed `s` could be opened: tried again with backoff while the node
    /// reaches nobody.
    pub(super) fn dial_failed(&mut self, now: Instant, s: usize, links: &Links, ctx: &mut Ctx) {
        Counters::add(&ctx.counters.dial_failures, 1);
        if let Some(seed) = self.list.get_mut(s) {
            seed.dialling = false;
            log::debug!("{}: seed {} did not answer", ctx.cfg.name, seed.addr);
        }
        self.retry_if_alone(now, links, ctx);
    }

    /// Settles what the step just done learnt through the seeds' links ([`SeedsOwed`]): a
    /// seed that is our own address is never dialled again, a seed whose link a member took
    /// or whose link closed is idle again, and if the node may reach nobody now, every idle
    /// seed is dialled again after its backoff.
    pub(super) fn settle(&mut self, now: Instant, links: &mut Links, ctx: &mut Ctx) {
        let owed = &links.seeds_owed;
        if owed.own.is_empty() && owed.taken.is_empty() && !owed.maybe_alone {
            return; // every close that owes the seeds anything sets `maybe_alone`
        }
        let owed = std::mem::take(&mut links.seeds_owed);
        for s in owed.own {
            self.is_own(s, &ctx.cfg.name);
        }
        for s in owed.taken {
            self.taken(s);
        }
        for (s, id) in owed.idle {
            if let Some(seed) = self.list.get_mut(s) {
                if seed.link == Some(id) {
                    seed.link = None;
                }
            }
        }
        if owed.maybe_alone {
            self.retry_if_alone(now, links, ctx);
        }
    }

    /// The handshake there named us: seed `s` is our own address, never dialled again.
    fn is_own(&mut self, s: usize, node: &str) {
        if let Some(seed) = self.list.get_mut(s) {
            log::debug!(
                "{node}: seed {} is this member's own address; not dialled again",
                seed.addr
            );
            seed.own = true;
        }
    }

    /// Seed `s`'s link was taken by the member found there: the seed's job is done.
    fn taken(&mut self, s: usize) {
        if let Some(seed) = self.list.get_mut(s) {
            seed.link = None;
            seed.attempt = 0;
        }
    }

    /// The node may reach nobody now: every idle seed is dialled again after its backoff.
    pub(super) fn retry_if_alone(&mut self, now: Instant, links: &Links, ctx: &mut Ctx) {
        if self.is_empty() || ctx.shutdown.is_some() || links.reaches_anyone() {
            return;
        }
        self.retry_all(now, &ctx.cfg, &mut ctx.backoff, &mut ctx.timers);
    }

    /// Seed `s`'s retry timer (generation `gen`) fired: it is dialled again if the node
    /// still reaches nobody.
    pub(super) fn due(&mut self, s: usize, gen: u64, links: &Links, ctx: &mut Ctx) {
        if self.is_current(s, gen) && !links.reaches_anyone() {
            self.dial(s, ctx.shutdown.is_some(), &mut ctx.out.events);
        }
    }

    /// The driver opened a connection to seed `s` as link `id`: a dialler's handshake that
    /// takes whoever answers.
    pub(super) fn opened(
        &mut self,
        now: Instant,
        s: usize,
        id: LinkId,
        nonce: Nonce,
        links: &mut Links,
        ctx: &mut Ctx,
    ) {
        let Some(addr) = self.dialled(s) else {
            return ctx.out.events.push_back(Output::Close {
                link: id,
                last: Vec::new(),
            });
        };
        if ctx.shutdown.is_some() {
            return ctx.out.events.push_back(Output::Close {
                link: id,
                last: Vec::new(),
            });
        }
        self.linked(s, id);
        let hs = Handshake::dialler_any(ctx.local.clone(), nonce);
        let mut link = Link::new(id, None, hs, Vec::new(), now);
        link.connecting = true;
        link.seed = Some(s);
        link.remote = Some(Addr::Tcp(addr));
        links.open_dialled(now, link, ctx);
    }
}

impl Endpoint {
    /// Seed name `n` resolved to `addrs` (none: it did not resolve, and the addresses it
    /// gave before stay). A new address is dialled at once and given to membership to join
    /// through; one it no longer gives is not dialled again. While the node still reaches
    /// nobody, the name is resolved again after its backoff.
    pub(super) fn seed_resolved(&mut self, now: Instant, n: usize, addrs: &[SocketAddr]) {
        let Some(fresh) = self.seeds.resolved(n, addrs, &self.ctx.cfg) else {
            return;
        };
        if !fresh.is_empty() {
            let join: Vec<SocketAddr> = fresh.iter().filter_map(|&s| self.seeds.addr(s)).collect();
            if let Some(m) = self.members.as_mut() {
                m.join(now, &join);
            }
            for s in fresh {
                self.seeds
                    .dial(s, self.ctx.shutdown.is_some(), &mut self.ctx.out.events);
            }
        }
        if !self.links.reaches_anyone() {
            let stopping = self.ctx.shutdown.is_some();
            self.seeds.resolve_later(
                now,
                n,
                stopping,
                &self.ctx.cfg,
                &mut self.ctx.backoff,
                &mut self.ctx.timers,
            );
        } else {
            self.seeds.name_reached(n);
        }
    }
}

impl Handshakes<'_> {
    /// The handshake on seed link `id` named us: the seed is our own address.
    pub(super) fn seed_is_own(&mut self, now: Instant, id: LinkId) {
        let Some(s) = self.links.table.get(&id).and_then(|l| l.seed) else {
            return;
        };
        self.links.seeds_owed.own.push(s);
        self.links
            .close(now, id, None, Why::Shutdown, self.peers, self.ctx);
    }

    /// Dialler on seed link `id`: the Hello of whoever answers arrived (not authenticated
    /// yet, with a secret). A member we know (or whose stream the journal recovered) that
    /// has no link of its own takes this one, as a dial of its own would; one that has a
    /// link keeps it, and this one closes. For a member we do not know we answer as a
    /// stranger (nothing received from it) and make it a peer only once Ready proves who it
    /// is.
    pub(super) fn seed_hello(&mut self, now: Instant, id: LinkId, peer: &PeerIdentity) {
        // The seed's address, where the member found there is dialled again.
        let Some(at) = self.links.table.get(&id).filter(|l| l.seed.is_some()) else {
            return;
        };
        let at = at.remote.clone();
        let known = self.peers.id_of(&peer.name);
        let recovered = self
            .ctx
            .journal
            .as_ref()
            .is_some_and(|j| j.recovered.contains_key(peer.name.as_str()));
        let pid = match known {
            Some(pid) => Some(pid),
            None if recovered && self.ctx.shutdown.is_none() => {
                Some(self.peers.admit_seeded(&peer.name, at, self.ctx))
            }
            None => None,
        };
        let Some(pid) = pid else {
            // A stranger so far: nothing received from it, no connection with it.
            let Some(link) = self.links.table.get_mut(&id) else {
                return;
            };
            let Some(hs) = link.hs.as_mut() else { return };
            hs.accept(0, 0, 0, link.out.tail());
            link.asked_at = now;
            self.links.dirty.push_back(id);
            return;
        };
        if !self.seed_takes(now, id, pid) {
            return;
        }
        self.answer_hello(now, id, peer);
    }

    /// Dialler on seed link `id`: Ready arrived (and authenticated whoever answered, with a
    /// secret). A member we answered as a stranger becomes a peer now, with the seed's
    /// address — unless a link of its own came meanwhile, which it keeps.
    pub(super) fn seed_ready(
        &mut self,
        now: Instant,
        id: LinkId,
        peer_received: u64,
        peer_unreliable: u64,
    ) {
        let Some(link) = self.links.table.get(&id) else {
            return;
        };
        let (Some(_), Some(peer)) = (link.seed, link.hs.as_ref().and_then(|h| h.peer()).cloned())
        else {
            return;
        };
        let at = link.remote.clone();
        if self.peers.id_of(&peer.name).is_some() || self.ctx.shutdown.is_some() {
            // Known meanwhile: our answer said we hold nothing of it, which may not be
            // true now. This link goes; the member's own comes or stays.
            return self.close(
                now,
                id,
                Some((CloseCode::Superseded, "connected otherwise meanwhile")),
                Why::Replaced,
            );
        }
        let pid = self.peers.admit_seeded(&peer.name, at, self.ctx);
        if !self.seed_takes(now, id, pid) {
            return;
        }
        if self.adopt(now, id, pid, &peer, false, None).is_some() {
            self.establish(now, id, peer_received, peer_unreliable);
        }
    }

    /// Peer `pid` takes seed link `id` if it has no link of its own (the seed's job is
    /// done then); otherwise the seed link closes. Returns whether it took it.
    fn seed_takes(&mut self, now: Instant, id: LinkId, pid: usize) -> bool {
        let Some(p) = self.peers.get_mut(&pid) else {
            self.links
                .close(now, id, None, Why::Removed, self.peers, self.ctx);
            return false;
        };
        if p.state == PeerState::Closed || p.link.is_some_and(|l| l != id) {
            log::debug!(
                "{}: seed link to '{}' closed: connected otherwise",
                self.ctx.cfg.name,
                p.name()
            );
            self.close(
                now,
                id,
                Some((CloseCode::Superseded, "connected otherwise")),
                Why::Replaced,
            );
            return false;
        }
        p.gen += 1; // a reconnect timer of its own does nothing now
        p.link = Some(id);
        p.set_state(PeerState::Handshaking);
        let Some(link) = self.links.table.get_mut(&id) else {
            return false;
        };
        link.dialled = Some(pid);
        link.peer = Some(pid);
        if let Some(s) = link.seed.take() {
            self.links.seeds_owed.taken.push(s);
        }
        true
    }
}
