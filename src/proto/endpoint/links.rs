//! Links opening and closing: admission of accepted connections (the pending table's
//! verdicts, displacement, deadlines under pressure), an accepted or dialled link entering
//! the table with its handshake, a failure, and [`Links::close`]: a link's close and what it
//! means for its peer (reconnected with backoff, or retired: see `roster.rs`), with only the
//! roster and the [`Ctx`] at hand. What a close means to the seeds ([`SeedsOwed`]) is
//! settled by `Seeds` once the step is done.

use super::*;

/// Admission of accepted links: the table of those still in their handshake (by age and
/// source address) and what its rules shed since the last warning.
pub(super) struct Gate {
    pub(super) pending: Admission,
    shed: Shedding,
}

impl Gate {
    /// Whether admission leaves the tick nothing to do: no accepted connection pending,
    /// nothing shed that the shedding warning has yet to report.
    pub(super) fn is_quiet(&self) -> bool {
        self.pending.len() == 0 && !self.shed.any()
    }

    pub(super) fn new(cfg: &Config) -> Gate {
        Gate {
            pending: Admission::new(cfg.max_pending, cfg.max_pending_per_source),
            shed: Shedding::default(),
        }
    }

    /// Judges a connection just accepted from `from` at `now`, with `open` links open.
    fn verdict(
        &mut self,
        now: Instant,
        from: &Addr,
        open: usize,
        cfg: &Config,
        counters: &NodeCounters,
    ) -> Verdict {
        let source = admission::source_of(from.source_ip());
        let node_full = open >= cfg.max_connections;
        let v = self.pending.verdict(source, now, node_full);
        if matches!(v, Verdict::SourceBurst | Verdict::Full) {
            self.refuse_stranger(from, v, open, cfg, counters);
        }
        v
    }

    /// Logs what the admission rules shed, when a warning is due.
    fn warn(&mut self, now: Instant, node: &str) {
        let Some(line) = self.shed.warning(now) else {
            return;
        };
        let biggest = match self.pending.biggest() {
            Some((ip, n)) => format!(", most by {ip} ({n})"),
            None => String::new(),
        };
        log::warn!(
            "{node}: {line}; {} of {} handshaking slots taken{biggest}, {} per address at most",
            self.pending.len(),
            self.pending.max_pending(),
            self.pending.per_source()
        );
    }

    fn refuse_stranger(
        &mut self,
        from: &Addr,
        why: Verdict,
        open: usize,
        cfg: &Config,
        counters: &NodeCounters,
    ) {
        Counters::add(&counters.refused_limit, 1);
        if why == Verdict::SourceBurst {
            Counters::add(&counters.refused_per_source, 1);
            self.shed.over_source += 1;
            log::debug!(
                "{}: refusing connection from {from}: its address holds its share of handshaking connections ({} of {} at most), all accepted in the same burst as it",
                cfg.name,
                self.pending.held_by(admission::source_of(from.source_ip())),
                self.pending.per_source()
            );
        } else {
            self.shed.refused += 1;
            log::debug!(
                "{}: refusing connection from {from}: {open} open (limit {}), none handshaking to make room",
                cfg.name,
                cfg.max_connections
            );
        }
    }

    /// Pending link `victim` is closed to make room for one from `from`: the oldest of the
    /// address holding the most, or (`own`) of `from`'s address, which holds its share.
    fn displaced(
        &mut self,
        now: Instant,
        victim: LinkId,
        from: &Addr,
        own: bool,
        cfg: &Config,
        counters: &NodeCounters,
    ) {
        Counters::add(&counters.displaced, 1);
        self.shed.displaced += 1;
        if own {
            Counters::add(&counters.displaced_per_source, 1);
            self.shed.displaced_own += 1;
        }
        if log::log_enabled!(log::Level::Debug) {
            let age = self
                .pending
                .since(victim)
                .map(|t| now.saturating_duration_since(t))
                .unwrap_or_default();
            if own {
                log::debug!(
                    "{}: the address of {from} holds its share of handshaking connections ({}); closing its oldest ({age:.1?} old) for the new one",
                    cfg.name,
                    self.pending.per_source()
                );
            } else {
                let held = self.pending.biggest().map_or(0, |(_, n)| n);
                log::debug!(
                    "{}: {} of {} handshaking slots taken; closing the oldest connection ({age:.1?} old) of the address holding the most ({held}) for one from {from}",
                    cfg.name,
                    self.pending.len(),
                    self.pending.max_pending()
                );
            }
        }
    }

    /// A pending accepted link is closed, past its deadline `limit`.
    pub(super) fn timed_out(&mut self, limit: Duration, cfg: &Config, counters: &NodeCounters) {
        let early = limit < cfg.handshake_timeout;
        Counters::add(&counters.handshake_timeouts, 1);
        self.shed.timed_out += 1;
        if early {
            Counters::add(&counters.pressure_timeouts, 1);
            self.shed.early += 1;
        }
        log::debug!(
            "{}: handshake of an accepted connection timed out after {limit:.1?}{}; closing it",
            cfg.name,
            if early {
                format!(
                    " (shortened: {} of {} handshaking slots taken)",
                    self.pending.len(),
                    self.pending.max_pending()
                )
            } else {
                String::new()
            }
        );
    }
}

impl Endpoint {
    /// Judges a connection just accepted from `from` at `now` (before anything is spent on
    /// it).
    pub(crate) fn verdict_on_accept(&mut self, now: Instant, from: Addr) -> Verdict {
        let open = self.links.table.len();
        self.links
            .gate
            .verdict(now, &from, open, &self.ctx.cfg, &self.ctx.counters)
    }

    /// Whether connections accepted now are refused outright (shutting down).
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.ctx.shutdown.is_some()
    }

    /// Logs what the admission rules shed, when a warning is due.
    pub(crate) fn warn_shedding(&mut self, now: Instant) {
        self.links.gate.warn(now, &self.ctx.cfg.name);
    }
}

/// What a step learnt about the seeds through their links, settled once the step is done
/// ([`Seeds::settle`]): a seed that is our own address, a seed whose link a member took
/// (its job done), a seed whose link closed (idle again), and whether the node, having
/// lost a seed's link or an established one, may reach nobody now.
#[derive(Debug, Default)]
pub(super) struct SeedsOwed {
    /// Seeds whose handshake named us.
    pub(super) own: Vec<usize>,
    /// Seeds whose link was taken by the member found there.
    pub(super) taken: Vec<usize>,
    /// Seed links closed: (seed, link).
    pub(super) idle: Vec<(usize, LinkId)>,
    /// The node may reach nobody now.
    pub(super) maybe_alone: bool,
}

impl Handshakes<'_> {
    /// A connection accepted from `from` (admitted by [`judge`](Endpoint::verdict_on_accept), which
    /// may have named a pending link to displace) becomes link `id`: the acceptor's
    /// handshake starts (its Hello is written), with the deadline of the pending table as it
    /// is now.
    pub(super) fn accepted(
        &mut self,
        now: Instant,
        id: LinkId,
        from: Addr,
        verdict: Verdict,
        nonce: Nonce,
    ) {
        let displaced = match verdict {
            Verdict::Displace(victim) => Some((victim, false)),
            Verdict::DisplaceOwn(victim) => Some((victim, true)),
            Verdict::Admit | Verdict::Full | Verdict::SourceBurst => None,
        };
        if let Some((victim, own)) = displaced {
            self.links
                .gate
                .displaced(now, victim, &from, own, &self.ctx.cfg, &self.ctx.counters);
            self.close(now, victim, None, Why::Replaced);
        }
        Counters::add(&self.ctx.counters.accepted, 1);
        log::debug!("{}: accepted connection from {from}", self.ctx.cfg.name);
        let mut first = Vec::new();
        let hs = Handshake::acceptor(self.ctx.local.clone(), nonce, &mut first);
        let mut link = Link::new(id, None, hs, first, now);
        let source = admission::source_of(from.source_ip());
        link.remote = Some(from);
        self.links.table.insert(id, link);
        self.links.gate.pending.insert(id, source, now);
        self.links.update_gauges(&self.ctx.counters);
        self.links.dirty.push_back(id);
        let deadline = self
            .links
            .gate
            .pending
            .deadline(self.ctx.cfg.handshake_timeout);
        self.ctx
            .timers
            .add(now + deadline, TimerKind::Handshake { link: id });
        // The table just grew: older links may be past the shorter deadline.
        self.links.shed_overdue(now, self.peers, self.ctx);
    }

    /// The driver opened a connection for peer `peer` (after [`Output::Dial`]): it becomes
    /// link `id`, connecting; the dialler's handshake waits for the acceptor's Hello.
    pub(super) fn dialled(&mut self, now: Instant, peer: usize, id: LinkId, nonce: Nonce) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return self.ctx.out.events.push_back(Output::Close {
                link: id,
                last: Vec::new(),
            });
        };
        if p.state == PeerState::Closed || p.link.is_some() || self.ctx.shutdown.is_some() {
            return self.ctx.out.events.push_back(Output::Close {
                link: id,
                last: Vec::new(),
            });
        }
        let hs = Handshake::dialler(self.ctx.local.clone(), p.name().to_string(), nonce);
        p.link = Some(id);
        p.set_state(PeerState::Connecting);
        let mut link = Link::new(id, Some(peer), hs, Vec::new(), now);
        link.remote = p.addr.clone();
        self.links.open_dialled(now, link, self.ctx);
    }
}

impl Links {
    /// Closes every pending accepted link past the deadline of the table as it is at
    /// `now`, oldest first (each one closed lengthens the deadline of the rest).
    pub(super) fn shed_overdue(&mut self, now: Instant, peers: &mut Roster, ctx: &mut Ctx) {
        while let Some((id, limit)) = self.gate.pending.overdue(now, ctx.cfg.handshake_timeout) {
            self.gate.timed_out(limit, &ctx.cfg, &ctx.counters);
            self.close(now, id, None, Why::IdleTimeout, peers, ctx);
        }
    }

    /// A connection this node dials (to a peer or a seed) enters the link table, counted,
    /// with its handshake's deadline.
    pub(super) fn open_dialled(&mut self, now: Instant, link: Link, ctx: &mut Ctx) {
        let id = link.id;
        self.table.insert(id, link);
        self.update_gauges(&ctx.counters);
        Counters::add(&ctx.counters.dialled, 1);
        ctx.timers.add(
            now + ctx.cfg.handshake_timeout,
            TimerKind::Handshake { link: id },
        );
    }

    /// The link's connection failed or the peer closed it (EOF), `why`: it is closed
    /// without a Close frame.
    pub(super) fn failed(
        &mut self,
        now: Instant,
        id: LinkId,
        why: Why,
        peers: &mut Roster,
        ctx: &mut Ctx,
    ) {
        if let Some(link) = self.table.get(&id) {
            if link.connecting {
                Counters::add(&ctx.counters.dial_failures, 1);
                if let Some(p) = link.dialled {
                    log::debug!("{}: connect to '{}' failed", ctx.cfg.name, peers.name(p));
                }
            }
        }
        self.close(now, id, None, why, peers, ctx);
    }

    /// A TLS failure on link `id` (handshake, certificate, or a certificate not valid for
    /// the member name claimed): closed, counted.
    pub(super) fn tls_failed(
        &mut self,
        now: Instant,
        id: LinkId,
        reason: &str,
        from: Option<Addr>,
        peers: &mut Roster,
        ctx: &mut Ctx,
    ) {
        Counters::add(&ctx.counters.tls_failures, 1);
        let who = match (self.table.get(&id).and_then(|l| l.peer), from) {
            (Some(p), _) => format!("'{}'", peers.name(p)),
            (None, Some(a)) => a.to_string(),
            (None, None) => "an unidentified peer".to_owned(),
        };
        log::warn!(
            "{}: TLS failure with {who}, closing connection: {reason}",
            ctx.cfg.name
        );
        self.close(now, id, None, Why::Tls, peers, ctx);
    }

    /// Closes a link (after writing `close`, best effort) and, if it spoke for a peer,
    /// moves the peer to `Backoff` and schedules a reconnect. `why`: what the application
    /// is told if the link was the peer's established one. What the close means to the
    /// seeds waits in [`SeedsOwed`] until the step is done.
    pub(super) fn close(
        &mut self,
        now: Instant,
        id: LinkId,
        close: Option<(CloseCode, &str)>,
        why: Why,
        peers: &mut Roster,
        ctx: &mut Ctx,
    ) {
        self.gate.pending.remove(id);
        let Some(link) = self.table.remove(&id) else {
            return;
        };
        self.paused.retain(|&l| l != id);
        let mut last = Vec::new();
        if let Some((code, reason)) = close {
            if ctx.journal_ok() && !link.connecting {
                // What may leave of the buffer, then the Close. With a journal, bytes whose
                // records are not durable yet stay behind (nothing leaves before the journal
                // holds it): they are unacknowledged, resent after the next handshake.
                last = ctx.may_leave(&link).to_vec();
                wire::encode_close(&mut last, code, reason);
            }
        }
        ctx.out.events.push_back(Output::Close { link: id, last });
        self.update_gauges(&ctx.counters);
        ctx.timers
            .cancel(|k| *k == TimerKind::Handshake { link: id });
        if let Some(s) = link.seed {
            self.seeds_owed.idle.push((s, id));
            self.seeds_owed.maybe_alone = true;
        }
        let Some(pid) = link.peer else { return };
        let Some(p) = peers.get_mut(&pid) else {
            return;
        };
        if p.link != Some(id) {
            return;
        }
        p.link_lost(&ctx.cfg, link.established);
        if link.established {
            self.seeds_owed.maybe_alone = true;
        }
        if std::mem::take(&mut p.up) {
            let peer = p.name().clone();
            emit(&ctx.cfg, &mut ctx.out, || Event::Disconnected {
                peer: peer.to_string(),
                reason: why,
            });
        }
        if p.state != PeerState::Closed {
            peers.schedule_reconnect(now, pid, ctx);
        }
    }
}
