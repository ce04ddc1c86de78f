//! Links opening and closing: admission of accepted connections (the pending table's
//! verdicts, displacement, deadlines under pressure), dials and their outcome, a link's
//! close and what it means for its peer (reconnect with backoff, forget, retire).

use super::*;

impl Endpoint {
    /// Judges a connection just accepted from `from` at `now` (before anything is spent on
    /// it).
    pub(crate) fn verdict_on_accept(&mut self, now: Instant, from: Addr) -> Verdict {
        let source = admission::source_of(from.source_ip());
        let node_full = self.links.len() >= self.cfg.max_connections;
        let v = self.admission.verdict(source, now, node_full);
        if matches!(v, Verdict::SourceBurst | Verdict::Full) {
            self.refuse_stranger(&from, v);
        }
        v
    }

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
        match verdict {
            Verdict::Displace(victim) => self.displace(now, victim, &from, false),
            Verdict::DisplaceOwn(victim) => self.displace(now, victim, &from, true),
            Verdict::Admit | Verdict::Full | Verdict::SourceBurst => {}
        }
        Counters::add(&self.counters.accepted, 1);
        log::debug!("{}: accepted connection from {from}", self.cfg.name);
        let mut first = Vec::new();
        let hs = Handshake::acceptor(self.local.clone(), nonce, &mut first);
        let mut link = Link::new(id, None, hs, first, now);
        let source = admission::source_of(from.source_ip());
        link.remote = Some(from);
        self.links.insert(id, link);
        self.admission.insert(id, source, now);
        self.update_gauges();
        self.dirty.push_back(id);
        let deadline = self.admission.deadline(self.cfg.handshake_timeout);
        self.timers
            .add(now + deadline, TimerKind::Handshake { link: id });
        // The table just grew: older links may be past the shorter deadline.
        self.shed_overdue(now);
    }

    /// Whether a handshake with `p` is refused: it is closed, or the node is shutting down
    /// and owes it nothing. A handshake already under way when a shutdown begins goes on
    /// while the peer is owed messages, so that they are handed over before the node stops.
    pub(super) fn closed_to(&self, p: &Remote) -> bool {
        p.state == PeerState::Closed || (self.shutdown.is_some() && !p.owes_anything())
    }

    /// Whether connections accepted now are refused outright (shutting down).
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutdown.is_some()
    }

    /// Logs what the admission rules shed, when a warning is due.
    pub(crate) fn warn_shedding(&mut self, now: Instant) {
        let Some(line) = self.shedding.warning(now) else {
            return;
        };
        let biggest = match self.admission.biggest() {
            Some((ip, n)) => format!(", most by {ip} ({n})"),
            None => String::new(),
        };
        log::warn!(
            "{}: {line}; {} of {} handshaking slots taken{biggest}, {} per address at most",
            self.cfg.name,
            self.admission.len(),
            self.admission.max_pending(),
            self.admission.per_source()
        );
    }

    pub(super) fn refuse_stranger(&mut self, from: &Addr, why: Verdict) {
        Counters::add(&self.counters.refused_limit, 1);
        if why == Verdict::SourceBurst {
            Counters::add(&self.counters.refused_per_source, 1);
            self.shedding.over_source += 1;
            log::debug!(
                "{}: refusing connection from {from}: its address holds its share of handshaking connections ({} of {} at most), all accepted in the same burst as it",
                self.cfg.name,
                self.admission.held_by(admission::source_of(from.source_ip())),
                self.admission.per_source()
            );
        } else {
            self.shedding.refused += 1;
            log::debug!(
                "{}: refusing connection from {from}: {} open (limit {}), none handshaking to make room",
                self.cfg.name,
                self.links.len(),
                self.cfg.max_connections
            );
        }
    }

    /// Closes pending link `victim` to make room for one from `from`: the oldest of the
    /// address holding the most, or (`own`) of `from`'s address, which holds its share.
    pub(super) fn displace(&mut self, now: Instant, victim: LinkId, from: &Addr, own: bool) {
        Counters::add(&self.counters.displaced, 1);
        self.shedding.displaced += 1;
        if own {
            Counters::add(&self.counters.displaced_per_source, 1);
            self.shedding.displaced_own += 1;
        }
        if log::log_enabled!(log::Level::Debug) {
            let age = self
                .admission
                .since(victim)
                .map(|t| now.saturating_duration_since(t))
                .unwrap_or_default();
            if own {
                log::debug!(
                    "{}: the address of {from} holds its share of handshaking connections ({}); closing its oldest ({age:.1?} old) for the new one",
                    self.cfg.name,
                    self.admission.per_source()
                );
            } else {
                let held = self.admission.biggest().map_or(0, |(_, n)| n);
                log::debug!(
                    "{}: {} of {} handshaking slots taken; closing the oldest connection ({age:.1?} old) of the address holding the most ({held}) for one from {from}",
                    self.cfg.name,
                    self.admission.len(),
                    self.admission.max_pending()
                );
            }
        }
        self.close_link(now, victim, None, Why::Replaced);
    }

    /// Closes every pending accepted link past the deadline of the table as it is at
    /// `now`, oldest first (each one closed lengthens the deadline of the rest).
    pub(super) fn shed_overdue(&mut self, now: Instant) {
        while let Some((id, limit)) = self.admission.overdue(now, self.cfg.handshake_timeout) {
            self.pending_timed_out(now, id, limit);
        }
    }

    /// Closes pending accepted link `id`, past its deadline `limit`.
    pub(super) fn pending_timed_out(&mut self, now: Instant, id: LinkId, limit: Duration) {
        let early = limit < self.cfg.handshake_timeout;
        Counters::add(&self.counters.handshake_timeouts, 1);
        self.shedding.timed_out += 1;
        if early {
            Counters::add(&self.counters.pressure_timeouts, 1);
            self.shedding.early += 1;
        }
        log::debug!(
            "{}: handshake of an accepted connection timed out after {limit:.1?}{}; closing it",
            self.cfg.name,
            if early {
                format!(
                    " (shortened: {} of {} handshaking slots taken)",
                    self.admission.len(),
                    self.admission.max_pending()
                )
            } else {
                String::new()
            }
        );
        self.close_link(now, id, None, Why::IdleTimeout);
    }

    /// Dials peer `id` now if it has an address and no link: the driver opens the
    /// connection ([`Output::Dial`]).
    pub(super) fn dial(&mut self, now: Instant, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if p.state == PeerState::Closed || p.link.is_some() || self.shutdown.is_some() {
            return;
        }
        let Some(addr) = p.addr.clone() else {
            p.set_state(PeerState::Backoff);
            return; // no address: it will dial us
        };
        let _ = now;
        let name = p.name().clone();
        self.out.events.push_back(Output::Dial {
            target: Target::Peer(id),
            name: Some(name),
            addr,
        });
    }

    /// The driver opened a connection for peer `peer` (after [`Output::Dial`]): it becomes
    /// link `id`, connecting; the dialler's handshake waits for the acceptor's Hello.
    pub(super) fn dialled(&mut self, now: Instant, peer: usize, id: LinkId, nonce: Nonce) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return self.out.events.push_back(Output::Close {
                link: id,
                last: Vec::new(),
            });
        };
        if p.state == PeerState::Closed || p.link.is_some() || self.shutdown.is_some() {
            return self.out.events.push_back(Output::Close {
                link: id,
                last: Vec::new(),
            });
        }
        let hs = Handshake::dialler(self.local.clone(), p.name().to_string(), nonce);
        p.link = Some(id);
        p.set_state(PeerState::Connecting);
        let mut link = Link::new(id, Some(peer), hs, Vec::new(), now);
        link.remote = p.addr.clone();
        self.links.insert(id, link);
        self.update_gauges();
        Counters::add(&self.counters.dialled, 1);
        self.timers.add(
            now + self.cfg.handshake_timeout,
            TimerKind::Handshake { link: id },
        );
    }

    /// The driver could not open a connection for peer `peer` (or get what a dial needs):
    /// retry with backoff.
    pub(super) fn dial_failed(&mut self, now: Instant, peer: usize) {
        Counters::add(&self.counters.dial_failures, 1);
        self.schedule_reconnect(now, peer);
    }

    /// A dialled link's connection completed.
    pub(super) fn connected(&mut self, id: LinkId) {
        let Some(link) = self.links.get_mut(&id) else {
            return;
        };
        link.connecting = false;
        if let Some(p) = link.dialled.and_then(|p| self.peers.get_mut(&p)) {
            p.set_state(PeerState::Handshaking);
        }
        self.dirty.push_back(id);
    }

    /// The link's connection failed or the peer closed it (EOF), `why`: it is closed
    /// without a Close frame.
    pub(super) fn link_failed(&mut self, now: Instant, id: LinkId, why: Why) {
        if let Some(link) = self.links.get(&id) {
            if link.connecting {
                Counters::add(&self.counters.dial_failures, 1);
                if let Some(p) = link.dialled {
                    log::debug!(
                        "{}: connect to '{}' failed",
                        self.cfg.name,
                        self.peer_name(p)
                    );
                }
            }
        }
        self.close_link(now, id, None, why);
    }

    /// A TLS failure on link `id` (handshake, certificate, or a certificate not valid for
    /// the member name claimed): closed, counted.
    pub(super) fn tls_failed(
        &mut self,
        now: Instant,
        id: LinkId,
        reason: &str,
        from: Option<Addr>,
    ) {
        Counters::add(&self.counters.tls_failures, 1);
        let who = match (self.links.get(&id).and_then(|l| l.peer), from) {
            (Some(p), _) => format!("'{}'", self.peer_name(p)),
            (None, Some(a)) => a.to_string(),
            (None, None) => "an unidentified peer".to_owned(),
        };
        log::warn!(
            "{}: TLS failure with {who}, closing connection: {reason}",
            self.cfg.name
        );
        self.close_link(now, id, None, Why::Tls);
    }

    /// Closes a link (after writing `close`, best effort) and, if it spoke for a peer,
    /// moves the peer to `Backoff` and schedules a reconnect. `why`: what the application
    /// is told if the link was the peer's established one.
    pub(super) fn close_link(
        &mut self,
        now: Instant,
        id: LinkId,
        close: Option<(CloseCode, &str)>,
        why: Why,
    ) {
        let journal_ok = self.journal_ok();
        self.admission.remove(id);
        let Some(link) = self.links.remove(&id) else {
            return;
        };
        self.paused.retain(|&l| l != id);
        let mut last = Vec::new();
        if let Some((code, reason)) = close {
            if journal_ok && !link.connecting {
                // What may leave of the buffer, then the Close. With a journal, bytes whose
                // records are not durable yet stay behind (nothing leaves before the journal
                // holds it): they are unacknowledged, resent after the next handshake.
                last = match &self.journal {
                    None => link.to_write().to_vec(),
                    Some(j) => link.durable_part(j.marks.appended, j.cut).to_vec(),
                };
                wire::encode_close(&mut last, code, reason);
            }
        }
        self.out.events.push_back(Output::Close { link: id, last });
        self.update_gauges();
        self.timers
            .cancel(|k| *k == TimerKind::Handshake { link: id });
        if let Some(s) = link.seed {
            self.seed_link_closed(now, s, id);
        }
        let Some(pid) = link.peer else { return };
        let Some(p) = self.peers.get_mut(&pid) else {
            return;
        };
        if p.link != Some(id) {
            return;
        }
        p.link_lost(&self.cfg, link.established);
        if link.established {
            self.seeds_if_alone(now);
        }
        let Some(p) = self.peers.get_mut(&pid) else {
            return;
        };
        if std::mem::take(&mut p.up) {
            let peer = p.name().clone();
            emit(&self.cfg, &mut self.out, || Event::Disconnected {
                peer: peer.to_string(),
                reason: why,
            });
        }
        if p.state != PeerState::Closed {
            self.schedule_reconnect(now, pid);
        }
    }

    pub(super) fn schedule_reconnect(&mut self, now: Instant, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if p.state == PeerState::Closed || self.shutdown.is_some() {
            return;
        }
        p.set_state(PeerState::Backoff);
        if p.addr.is_none() {
            // Nothing to dial: it will dial us. A member admitted at run time is forgotten
            // if it does not within `forget_after` (a reconnect bumps `gen`, cancelling it).
            if p.dynamic {
                p.gen += 1;
                let gen = p.gen;
                if let Some(at) = now.checked_add(self.cfg.forget_after) {
                    self.timers.add(at, TimerKind::Forget { peer: id, gen });
                }
            }
            return;
        }
        p.gen += 1;
        let delay = self
            .backoff
            .delay(p.attempt, self.cfg.backoff_min, self.cfg.backoff_max);
        p.attempt = p.attempt.saturating_add(1);
        let gen = p.gen;
        self.timers
            .add(now + delay, TimerKind::Reconnect { peer: id, gen });
    }

    /// Terminal transition of a peer (removed for good, or the node shutting down).
    pub(super) fn retire_peer(&mut self, id: usize, removed: bool) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        p.retire(&self.cfg, &mut self.out, removed);
        if removed {
            let name = p.name().clone();
            self.timers.cancel(|k| match k {
                TimerKind::Reconnect { peer, .. }
                | TimerKind::AckDelay { peer }
                | TimerKind::Forget { peer, .. } => *peer == id,
                _ => false,
            });
            self.peers.remove(&id);
            if self.by_name.get(&name) == Some(&id) {
                self.by_name.remove(&name);
            }
        }
    }

    pub(super) fn add_unknown(&mut self, now: Instant, name: &str) -> usize {
        let shared = (self.new_peer)(name.into());
        let id = shared.id;
        log::info!("{}: admitting unknown member '{name}'", self.cfg.name);
        self.out.events.push_back(Output::Admitted(shared.clone()));
        self.add_peer(now, shared, None);
        if let Some(p) = self.peers.get_mut(&id) {
            p.dynamic = true;
        }
        id
    }

    /// The forget timer of peer `id` (generation `gen`) fired: if that member, admitted at
    /// run time, is still disconnected since, it is retired as `remove_peer` does (queued
    /// messages fail, unacknowledged ones are undelivered) and the node forgets it.
    pub(super) fn forget_peer(&mut self, id: usize, gen: u64) {
        let Some(p) = self.peers.get(&id) else {
            return;
        };
        if !p.dynamic
            || p.gen != gen
            || p.link.is_some()
            || p.state == PeerState::Closed
            || self.shutdown.is_some()
        {
            return;
        }
        let (name, shared) = (p.name().clone(), p.shared.clone());
        log::info!(
            "{}: forgetting '{name}', admitted at run time and disconnected for {:?}",
            self.cfg.name,
            self.cfg.forget_after
        );
        self.retire_peer(id, true);
        self.out.events.push_back(Output::Forget(shared));
        emit(&self.cfg, &mut self.out, || Event::Forgotten {
            peer: name.to_string(),
        });
    }
}
