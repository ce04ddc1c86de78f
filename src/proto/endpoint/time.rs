//! The timers: delayed acks, handshake deadlines ([`Links::handshake_due`]), the
//! housekeeping tick, liveness ([`Links::check_liveness`]).

use super::*;

impl Endpoint {
    /// Runs every timer due at `now`. A driver passes the time its view of the links was
    /// last refreshed (the IO thread: when its last `poll` returned), not the present:
    /// timeouts that blame a peer (idle, handshake) must never count time it did not look
    /// at its links — bytes that arrived since are read before they are judged.
    pub(super) fn handle_timeout(&mut self, now: Instant) {
        while let Some((_, t)) = self.ctx.timers.pop_due(now) {
            match t {
                TimerKind::Reconnect { peer, gen } => {
                    if self
                        .peers
                        .get(&peer)
                        .is_some_and(|p| p.gen == gen && p.link.is_none())
                    {
                        self.peers.dial(peer, &mut self.ctx);
                    }
                }
                TimerKind::Handshake { link } => {
                    self.links
                        .handshake_due(now, link, &mut self.peers, &mut self.ctx)
                }
                TimerKind::Forget { peer, gen } => self.peers.forget(peer, gen, &mut self.ctx),
                TimerKind::Seed { seed, gen } => {
                    self.seeds.due(seed, gen, &self.links, &mut self.ctx)
                }
                TimerKind::Resolve { name, gen } => {
                    let alone = !self.links.reaches_anyone();
                    self.seeds.resolve_due(name, gen, alone, &mut self.ctx)
                }
                TimerKind::AckDelay { peer } => self.links.ack_due(
                    now,
                    peer,
                    self.ctx.journal.is_some(),
                    &mut self.peers,
                    &mut self.ctx,
                ),
                TimerKind::Tick => self.tick(now),
                TimerKind::Deadline => {}
            }
        }
        // Relaxed: a gauge for stats.
        self.ctx
            .counters
            .timers
            .store(self.ctx.timers.len() as u64, Ordering::Relaxed);
    }

    /// Periodic work: pending links past their deadline closed (and the shedding warning,
    /// when due), each peer's tick (probes, block warnings, residual credit, expiry),
    /// paused links back within their windows resumed, heartbeats and the idle timeout,
    /// read buffers no read took since the last tick freed.
    pub(super) fn tick(&mut self, now: Instant) {
        self.links.shed_overdue(now, &mut self.peers, &mut self.ctx);
        self.warn_shedding(now);
        let ids = self.peers.ids();
        for id in ids {
            let Some(p) = self.peers.get_mut(&id) else {
                continue;
            };
            let link = p.link.and_then(|l| self.links.table.get_mut(&l));
            let link_id = link.as_ref().map(|l| l.id);
            if p.tick(&self.ctx.cfg, &mut self.ctx.out, link, now) {
                if let Some(l) = link_id {
                    self.links.dirty.push_back(l);
                }
            }
        }
        if !self.links.paused.is_empty() {
            let ids: Vec<usize> = self
                .links
                .paused
                .iter()
                .filter_map(|l| self.links.table.get(l).and_then(|l| l.peer))
                .collect();
            for id in ids {
                self.resume_peer(now, id);
            }
        }
        self.links
            .check_liveness(now, &mut self.peers, &mut self.ctx);
        self.ctx.out.read_buffers.release_unused();
        self.ctx
            .timers
            .add(now + self.ctx.cfg.tick, TimerKind::Tick);
    }
}

impl Links {
    /// The handshake timer of link `id` fired. An accepted link is held to the deadline of
    /// the table as it is now (shorter under pressure; re-armed if the table emptied
    /// since); our own dial always has the whole `handshake_timeout`.
    pub(super) fn handshake_due(
        &mut self,
        now: Instant,
        id: LinkId,
        peers: &mut Roster,
        ctx: &mut Ctx,
    ) {
        let Some(link) = self.table.get(&id).filter(|l| !l.established) else {
            return;
        };
        let dialled = link.dialled;
        if let Some(since) = self.gate.pending.since(id) {
            let limit = self.gate.pending.deadline(ctx.cfg.handshake_timeout);
            if now < since + limit {
                ctx.timers
                    .add(since + limit, TimerKind::Handshake { link: id });
            } else {
                self.gate.timed_out(limit, &ctx.cfg, &ctx.counters);
                self.close(now, id, None, Why::IdleTimeout, peers, ctx);
            }
            return;
        }
        Counters::add(&ctx.counters.handshake_timeouts, 1);
        match dialled {
            Some(p) => log::warn!(
                "{}: handshake with '{}' timed out; closing the connection",
                ctx.cfg.name,
                peers.name(p)
            ),
            None => log::warn!("{}: handshake timed out; closing connection", ctx.cfg.name),
        }
        self.close(now, id, None, Why::IdleTimeout, peers, ctx);
    }

    /// Heartbeats on quiet established links (any traffic suppresses them), and failure
    /// detection: a link silent for `idle_timeout` is closed, and its peer redialled with
    /// backoff. A link we are not reading (paused) is never silent: time we did not read is
    /// ours, not the peer's.
    pub(super) fn check_liveness(&mut self, now: Instant, peers: &mut Roster, ctx: &mut Ctx) {
        let mut silent = Vec::new();
        for link in self.table.values_mut() {
            if !link.established {
                continue;
            }
            let unread = now.saturating_duration_since(link.last_read);
            if !link.paused && unread >= ctx.cfg.idle_timeout {
                silent.push(link.id);
            } else if now.saturating_duration_since(link.last_write) >= ctx.cfg.heartbeat {
                wire::encode_heartbeat(link.out.tail());
                self.dirty.push_back(link.id);
            }
        }
        for id in silent {
            Counters::add(&ctx.counters.idle_timeouts, 1);
            let who = self
                .table
                .get(&id)
                .and_then(|l| l.peer)
                .map(|p| peers.name(p));
            log::warn!(
                "{}: connection to '{}' silent for {:?}; closing it",
                ctx.cfg.name,
                who.as_deref().unwrap_or("?"),
                ctx.cfg.idle_timeout
            );
            self.close(
                now,
                id,
                Some((CloseCode::Other, "idle timeout")),
                Why::IdleTimeout,
                peers,
                ctx,
            );
        }
    }
}
