//! The periodic tick: credit probes, block warnings, residual credit, expiry of queued
//! messages for disconnected peers, heartbeats and the idle timeout.

use super::*;

impl IoThread {
    /// Periodic work: accepted connections past their handshake deadline closed (and the
    /// shedding warning, when due), credit probes for blocked senders, a warning per long
    /// block, residual credit once a sender's queue is idle, expiry of queued messages.
    pub(super) fn tick(&mut self) {
        let now = Instant::now();
        // Pending handshakes are judged as of the last poll: a handshake frame that arrived
        // since is read first.
        self.shed_overdue(self.polled_at);
        self.warn_shedding(now);
        let ids: Vec<usize> = self.peers.keys().copied().collect();
        for id in ids {
            let Some(p) = self.peers.get_mut(&id) else {
                continue;
            };
            let established = p
                .conn
                .and_then(|t| self.conns.get(&t))
                .is_some_and(|c| c.established);
            let window = p.shared.outbox.window();
            if let Some((since, episode)) = window.blocked_since() {
                let blocked = now.saturating_duration_since(since);
                let probe_due = p
                    .last_probe
                    .is_none_or(|t| now.saturating_duration_since(t) >= self.cfg.probe_interval);
                if established && blocked >= self.cfg.probe_interval && probe_due {
                    p.last_probe = Some(now);
                    Counters::add(&p.shared.counters.probes, 1);
                    if let Some(conn) = p.conn.and_then(|t| self.conns.get_mut(&t)) {
                        wire::encode_probe(&mut conn.wbuf);
                        self.dirty.push(conn.token);
                    }
                }
                if blocked >= self.cfg.block_warning && p.warned_episode != episode {
                    p.warned_episode = episode;
                    log::warn!(
                        "{}: senders to '{}' blocked for {:.1?}: window {} bytes, {} in flight ({} unacknowledged messages), peer {}",
                        self.cfg.name,
                        p.shared.name,
                        blocked,
                        window.capacity(),
                        window.in_flight(),
                        p.desc.unacked_len(),
                        p.state
                    );
                }
            }
            let residual = self.cfg.credit_on_idle
                && established
                && p.shared.credit.pending() > 0
                && !p.shared.member.is_running();
            if residual {
                self.send_ack(id);
            } else if !established && p.shared.ttl_queued() {
                self.expire_queued(id, now);
                if self.journalled() {
                    // What waited behind an expired message is journalled now.
                    self.flush_peer(id);
                }
            }
        }
        if !self.paused.is_empty() {
            self.resume_paused(now);
        }
        self.check_liveness(now);
        self.timers.add(now + self.cfg.tick, TimerKind::Tick);
    }

    /// Heartbeats on quiet established connections (any traffic suppresses them), and
    /// failure detection: a connection silent for `idle_timeout` is closed, and its peer
    /// redialled with backoff.
    ///
    /// Silence is what the loop saw, not the time that passed: it runs from the last read
    /// to the last poll, so a turn that took long (the IO thread without the CPU, a slow
    /// callback) does not count against the peer, whose bytes may be waiting unread since.
    /// A connection whose input waits in `read_pending` (the read budget spent), or that we
    /// are not reading (paused: its peer holds more than its receive window), has spoken
    /// and is not silent: time we did not read is ours, not the peer's.
    pub(super) fn check_liveness(&mut self, now: Instant) {
        let seen = self.polled_at;
        let mut silent = Vec::new();
        for conn in self.conns.values_mut() {
            if !conn.established {
                continue;
            }
            let quiet = seen.saturating_duration_since(conn.last_read);
            if quiet >= self.cfg.idle_timeout && !conn.read_pending && !conn.paused {
                silent.push((conn.token, quiet));
            } else if now.saturating_duration_since(conn.last_write) >= self.cfg.heartbeat {
                wire::encode_heartbeat(&mut conn.wbuf);
                self.dirty.push(conn.token);
            }
        }
        for (token, quiet) in silent {
            Counters::add(&self.counters.idle_timeouts, 1);
            let who = self
                .conns
                .get(&token)
                .and_then(|c| c.peer)
                .map(|id| self.peer_name(id));
            log::warn!(
                "{}: connection to '{}' silent for {quiet:.1?} (idle timeout {:?}); closing it",
                self.cfg.name,
                who.as_deref().unwrap_or("?"),
                self.cfg.idle_timeout
            );
            self.close_conn(token, Some((CloseCode::Other, "idle timeout")));
        }
    }
}
