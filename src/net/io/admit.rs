//! Acting on the admission rules (`net::admission`): refusing and displacing strangers,
//! handshake deadlines (shortened for accepted connections under pressure), and the
//! rate-limited warning about what was shed.

use super::*;

impl IoThread {
    /// Drops a connection just accepted from `from` (the caller drops the stream), counted
    /// and logged under `why`.
    pub(super) fn refuse_stranger(&mut self, from: SocketAddr, why: Verdict) {
        Counters::add(&self.counters.refused_limit, 1);
        if why == Verdict::SourceFull {
            Counters::add(&self.counters.refused_per_source, 1);
            self.shedding.over_source += 1;
            log::debug!(
                "{}: refusing connection from {from}: its address holds {} handshaking connections already (limit {})",
                self.cfg.name,
                self.admission.held_by(admission::source_of(from.ip())),
                self.admission.per_source()
            );
        } else {
            self.shedding.refused += 1;
            log::debug!(
                "{}: refusing connection from {from}: {} open (limit {}), none handshaking to make room",
                self.cfg.name,
                self.conns.len(),
                self.cfg.max_connections
            );
        }
    }

    /// Closes pending connection `victim` to make room for one from `from`.
    pub(super) fn displace(&mut self, victim: Token, from: SocketAddr) {
        Counters::add(&self.counters.displaced, 1);
        self.shedding.displaced += 1;
        if log::log_enabled!(log::Level::Debug) {
            let age = self
                .admission
                .since(victim)
                .map(|t| t.elapsed())
                .unwrap_or_default();
            let held = self.admission.biggest().map_or(0, |(_, n)| n);
            log::debug!(
                "{}: {} of {} handshaking slots taken; closing the oldest connection ({age:.1?} old) of the address holding the most ({held}) for one from {from}",
                self.cfg.name,
                self.admission.len(),
                self.admission.max_pending()
            );
        }
        self.admission.remove(victim);
        self.close_conn(victim, None);
    }

    /// The handshake timer of `token` fired. An accepted connection is held to the deadline
    /// of the table as it is now (shorter under pressure; re-armed if the table emptied
    /// since); our own dial always has the whole `handshake_timeout`.
    pub(super) fn handshake_due(&mut self, token: Token, now: Instant) {
        let Some(conn) = self.conns.get(&token).filter(|c| !c.established) else {
            return;
        };
        let dialled = conn.dialled;
        if let Some(since) = self.admission.since(token) {
            let limit = self.admission.deadline(self.cfg.handshake_timeout);
            if now < since + limit {
                self.timers
                    .add(since + limit, TimerKind::Handshake { token });
            } else {
                self.pending_timed_out(token, limit);
            }
            return;
        }
        Counters::add(&self.counters.handshake_timeouts, 1);
        match dialled {
            Some(id) => log::warn!(
                "{}: handshake with '{}' timed out; closing the connection",
                self.cfg.name,
                self.peer_name(id)
            ),
            None => log::warn!("{}: handshake timed out; closing connection", self.cfg.name),
        }
        self.close_conn(token, None);
    }

    /// Closes every pending accepted connection past the deadline of the table as it is
    /// at `now`, oldest first (each one closed lengthens the deadline of the rest).
    pub(super) fn shed_overdue(&mut self, now: Instant) {
        while let Some((token, limit)) = self.admission.overdue(now, self.cfg.handshake_timeout) {
            self.pending_timed_out(token, limit);
        }
    }

    /// Closes pending accepted connection `token`, past its deadline `limit`.
    fn pending_timed_out(&mut self, token: Token, limit: Duration) {
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
        self.admission.remove(token);
        self.close_conn(token, None);
    }

    /// Logs what the admission rules shed since the last warning, at most every
    /// [`Shedding::EVERY`].
    pub(super) fn warn_shedding(&mut self, now: Instant) {
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
}
