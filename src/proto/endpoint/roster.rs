//! The peers: each member's protocol state by id and the ids by name, kept in step (a peer
//! is held under its name; dropping it drops the name too), and what happens to a peer:
//! added (with the stream the journal recovered for it), admitted at run time (it dialled
//! in, a seed or the membership found it), dialled, reconnected with backoff, disconnected,
//! retired or removed (its link closed through [`Links::close`]), forgotten.

use super::*;

/// The peers by id and by name, and how the shared state of a member admitted at run time
/// is made.
pub(super) struct Roster {
    by_id: HashMap<usize, Remote, IdHash>,
    by_name: HashMap<SharedStr, usize, NameHash>,
    new_peer: NewPeer,
}

impl Roster {
    /// No peer yet; `new_peer` makes the shared state of a member admitted at run time.
    pub(super) fn new(new_peer: NewPeer) -> Roster {
        Roster {
            by_id: HashMap::default(),
            by_name: HashMap::default(),
            new_peer,
        }
    }

    /// The shared state of member `name`, admitted at run time (it dialled in, a seed or
    /// the membership found it): the node's map learns it ([`Output::Admitted`]).
    fn admit(&mut self, name: &str, ctx: &mut Ctx) -> Arc<PeerShared> {
        let shared = (self.new_peer)(name.into());
        ctx.out.events.push_back(Output::Admitted(shared.clone()));
        shared
    }

    /// A member not configured here dialled in as `name`: it is admitted and added, and
    /// forgotten if it stays disconnected (`forget_after`). Returns its id.
    pub(super) fn admit_unknown(&mut self, name: &str, ctx: &mut Ctx) -> usize {
        log::info!("{}: admitting unknown member '{name}'", ctx.cfg.name);
        let shared = self.admit(name, ctx);
        let id = shared.id;
        self.add(shared, None, ctx);
        if let Some(p) = self.get_mut(&id) {
            p.dynamic = true;
        }
        id
    }

    /// A member found at seed address `addr` becomes a peer: the node's map learns it, it
    /// is dialled at the seed's address when its link is lost, and it is never forgotten.
    /// Its stream is the journal's, if the journal has one. Returns its id.
    pub(super) fn admit_seeded(&mut self, name: &str, addr: Option<Addr>, ctx: &mut Ctx) -> usize {
        log::info!(
            "{}: found '{name}' at seed {}",
            ctx.cfg.name,
            addr.as_ref()
                .map_or_else(|| "?".to_string(), |a| a.to_string())
        );
        let shared = self.admit(name, ctx);
        let id = shared.id;
        let mut peer = Remote::new(shared, addr);
        if let Some(r) = ctx.journal.as_mut().and_then(|j| j.recovered.remove(name)) {
            peer.restore(&ctx.cfg, &mut ctx.out, r);
        }
        self.insert(id, peer);
        id
    }

    /// Member `name`, live in the membership's view at `addr` and not known here, becomes
    /// a peer (dialled there). Returns its id.
    pub(super) fn admit_member(&mut self, name: &str, addr: SocketAddr, ctx: &mut Ctx) -> usize {
        log::info!("{}: member '{name}' joined at {addr}", ctx.cfg.name);
        let shared = self.admit(name, ctx);
        let id = shared.id;
        self.add(shared, Some(Addr::Tcp(addr)), ctx);
        id
    }

    /// Peer `id`.
    pub(super) fn get(&self, id: &usize) -> Option<&Remote> {
        self.by_id.get(id)
    }

    /// Peer `id`, to change.
    pub(super) fn get_mut(&mut self, id: &usize) -> Option<&mut Remote> {
        self.by_id.get_mut(id)
    }

    /// Every peer.
    pub(super) fn values(&self) -> impl Iterator<Item = &Remote> {
        self.by_id.values()
    }

    /// Every peer's id (a copy: the peers may change while the caller goes through them).
    pub(super) fn ids(&self) -> Vec<usize> {
        self.by_id.keys().copied().collect()
    }

    /// The id of the peer named `name`.
    pub(super) fn id_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Peer `id`'s name (`?` for a peer not held).
    pub(super) fn name(&self, id: usize) -> SharedStr {
        self.by_id
            .get(&id)
            .map(|p| p.name().clone())
            .unwrap_or_else(|| "?".into())
    }

    /// Holds `peer` as `id`, under its name.
    pub(super) fn insert(&mut self, id: usize, peer: Remote) {
        self.by_name.insert(peer.name().clone(), id);
        self.by_id.insert(id, peer);
    }

    /// Dials peer `id` now if it has an address and no link and the node is not
    /// stopping: the driver opens the connection ([`Output::Dial`]). One without an
    /// address waits for it to dial in.
    pub(super) fn dial(&mut self, id: usize, ctx: &mut Ctx) {
        let Some(p) = self.by_id.get_mut(&id) else {
            return;
        };
        if p.state == PeerState::Closed || p.link.is_some() || ctx.shutdown.is_some() {
            return;
        }
        let Some(addr) = p.addr.clone() else {
            p.set_state(PeerState::Backoff);
            return; // no address: it will dial us
        };
        let name = p.name().clone();
        ctx.out.events.push_back(Output::Dial {
            target: Target::Peer(id),
            name: Some(name),
            addr,
        });
    }

    /// Peer `id` lost its link or could not be dialled: it is dialled again after its
    /// backoff, unless it is closed or the node is stopping. One without an address waits
    /// for it to dial in; if it was admitted at run time, it is forgotten if it does not
    /// within `forget_after`.
    pub(super) fn schedule_reconnect(&mut self, now: Instant, id: usize, ctx: &mut Ctx) {
        let Some(p) = self.by_id.get_mut(&id) else {
            return;
        };
        if p.state == PeerState::Closed || ctx.shutdown.is_some() {
            return;
        }
        p.set_state(PeerState::Backoff);
        if p.addr.is_none() {
            // Nothing to dial: it will dial us. A member admitted at run time is forgotten
            // if it does not within `forget_after` (a reconnect bumps `gen`, cancelling it).
            if p.dynamic {
                p.gen += 1;
                let gen = p.gen;
                if let Some(at) = now.checked_add(ctx.cfg.forget_after) {
                    ctx.timers.add(at, TimerKind::Forget { peer: id, gen });
                }
            }
            return;
        }
        p.gen += 1;
        let delay = ctx
            .backoff
            .delay(p.attempt, ctx.cfg.backoff_min, ctx.cfg.backoff_max);
        p.attempt = p.attempt.saturating_add(1);
        let gen = p.gen;
        ctx.timers
            .add(now + delay, TimerKind::Reconnect { peer: id, gen });
    }

    /// Terminal transition of peer `id` (`removed` for good, or the node shutting down).
    pub(super) fn retire(&mut self, id: usize, removed: bool, ctx: &mut Ctx) {
        let Some(p) = self.by_id.get_mut(&id) else {
            return;
        };
        p.retire(&ctx.cfg, &mut ctx.out, removed);
        if removed {
            ctx.timers.cancel(|k| match k {
                TimerKind::Reconnect { peer, .. }
                | TimerKind::AckDelay { peer }
                | TimerKind::Forget { peer, .. } => *peer == id,
                _ => false,
            });
            self.remove(id);
        }
    }

    /// The forget timer of peer `id` (generation `gen`) fired: if that member, admitted at
    /// run time, is still disconnected since, it is retired as `remove_peer` does (queued
    /// messages fail, unacknowledged ones are undelivered) and the node forgets it, unless
    /// the node is stopping.
    pub(super) fn forget(&mut self, id: usize, gen: u64, ctx: &mut Ctx) {
        let Some(p) = self.by_id.get(&id) else {
            return;
        };
        if !p.dynamic
            || p.gen != gen
            || p.link.is_some()
            || p.state == PeerState::Closed
            || ctx.shutdown.is_some()
        {
            return;
        }
        let (name, shared) = (p.name().clone(), p.shared.clone());
        log::info!(
            "{}: forgetting '{name}', admitted at run time and disconnected for {:?}",
            ctx.cfg.name,
            ctx.cfg.forget_after
        );
        self.retire(id, true, ctx);
        ctx.out.events.push_back(Output::Forget(shared));
        emit(&ctx.cfg, &mut ctx.out, || Event::Forgotten {
            peer: name.to_string(),
        });
    }

    /// Drops peer `id`, and its name if the name is still its own.
    fn remove(&mut self, id: usize) {
        let Some(p) = self.by_id.remove(&id) else {
            return;
        };
        if self.by_name.get(p.name()) == Some(&id) {
            self.by_name.remove(p.name());
        }
    }

    /// The driver could not open a connection for peer `peer` (or get what a dial needs):
    /// retry with backoff.
    pub(super) fn dial_failed(&mut self, now: Instant, peer: usize, ctx: &mut Ctx) {
        Counters::add(&ctx.counters.dial_failures, 1);
        self.schedule_reconnect(now, peer, ctx);
    }
}
