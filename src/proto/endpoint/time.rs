//! The timers: delayed acks, handshake deadlines ([`Links::handshake_due`]), the
//! housekeeping tick ([`Housekeeping`]), liveness ([`Links::check_liveness`]).

use super::*;

/// When the housekeeping tick runs next. While anything is in flight it runs every
/// `Config::tick`; a tick that finds the endpoint quiet ([`Endpoint::is_quiet`]) puts the
/// next one off until a link's next heartbeat or idle deadline, so that a connected
/// cluster with nothing to say wakes about once a heartbeat, not twenty times a second.
/// Any input that may bring work ([`Endpoint::handle`]) brings the tick back within
/// `Config::tick`. There is exactly one `TimerKind::Tick` in the heap: moving the tick
/// earlier cancels the one put off.
#[derive(Debug)]
pub(super) struct Housekeeping {
    /// When the one tick in the heap is due.
    at: Instant,
    /// The last tick found the endpoint quiet, and no input has brought work since.
    quiet: bool,
}

impl Housekeeping {
    /// The first tick, one period after `now`; the timer is the caller's to add.
    pub(super) fn new(now: Instant, cfg: &Config) -> Housekeeping {
        Housekeeping {
            at: now + cfg.tick,
            quiet: false,
        }
    }

    /// Whether the tick is put off (the last one found the endpoint quiet) and an input
    /// that may bring work must bring it back.
    #[inline]
    pub(super) fn put_off(&self) -> bool {
        self.quiet
    }

    /// Whether the tick is put off; for tests, with the instant it is due.
    #[cfg(test)]
    pub(crate) fn state(&self) -> (bool, Instant) {
        (self.quiet, self.at)
    }
}

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
        let quiet = self.is_quiet();
        let at = if quiet {
            self.quiet_until(now)
        } else {
            now + self.ctx.cfg.tick
        };
        self.housekeeping = Housekeeping { at, quiet };
        self.ctx.timers.add(at, TimerKind::Tick);
    }

    /// Whether the housekeeping tick has nothing to do until a link's next heartbeat or
    /// idle deadline: no shutdown under way, every link established and read, no accepted
    /// connection pending, nothing shed and not yet reported, and every peer quiet
    /// ([`Remote::is_quiet`]: nothing queued, unacknowledged, uncredited or held). What
    /// ends quiet comes in as an input (a send, a read, a command, a connection), which
    /// brings the tick back ([`Endpoint::bring_tick_back`]).
    pub(super) fn is_quiet(&self) -> bool {
        self.ctx.shutdown.is_none()
            && self.links.is_quiet()
            && self.peers.values().all(|p| p.is_quiet(&self.ctx.cfg))
    }

    /// When a quiet endpoint's next tick is due: the earliest heartbeat or idle deadline
    /// of its links, at most a heartbeat away and at least a tick.
    fn quiet_until(&self, now: Instant) -> Instant {
        let cfg = &self.ctx.cfg;
        let latest = now + cfg.heartbeat.max(cfg.tick);
        let due = self
            .links
            .liveness_due(cfg, now)
            .map_or(latest, |d| d.min(latest));
        due.max(now + cfg.tick)
    }

    /// An input that may bring work came while the tick was put off: the tick comes back
    /// within `Config::tick`. A read on an established link whose peer is still quiet
    /// after it (a heartbeat, a probe, an ack) brought none.
    #[cold]
    pub(super) fn bring_tick_back(&mut self, now: Instant, read: Option<LinkId>) {
        if let Some(l) = read.and_then(|id| self.links.table.get(&id)) {
            let peer = l.peer.filter(|_| l.established && !l.paused);
            if peer
                .and_then(|p| self.peers.get(&p))
                .is_some_and(|p| p.is_quiet(&self.ctx.cfg))
            {
                return;
            }
        }
        self.housekeeping.quiet = false;
        let at = now + self.ctx.cfg.tick;
        if at < self.housekeeping.at {
            self.ctx.timers.cancel(|k| *k == TimerKind::Tick);
            self.ctx.timers.add(at, TimerKind::Tick);
            self.housekeeping.at = at;
        }
    }
}

impl Links {
    /// Whether the links leave the tick nothing to do: every link established and read, no
    /// accepted connection pending, nothing shed and not yet reported.
    pub(super) fn is_quiet(&self) -> bool {
        self.paused.is_empty() && self.gate.is_quiet() && self.table.values().all(|l| l.established)
    }

    /// The earliest instant after a tick at `now` that a link's liveness needs looking at:
    /// its next heartbeat (a heartbeat after its last write, or after `now` where this
    /// tick's [`check_liveness`](Links::check_liveness) just queued one) or its idle
    /// deadline (the idle timeout after its last read). `None` without an established
    /// link.
    fn liveness_due(&self, cfg: &Config, now: Instant) -> Option<Instant> {
        self.table
            .values()
            .filter(|l| l.established)
            .map(|l| {
                // A heartbeat due now was just queued by this tick's `check_liveness`.
                let beat = if l.heartbeat_due(now, cfg.heartbeat) {
                    now + cfg.heartbeat
                } else {
                    l.last_write + cfg.heartbeat
                };
                beat.min(l.last_read + cfg.idle_timeout)
            })
            .min()
    }

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
            } else if link.heartbeat_due(now, ctx.cfg.heartbeat) {
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
