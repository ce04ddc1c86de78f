//! Connections and the peer lifecycle: accepting, dialling with backoff, connect completion,
//! closing, admitting unknown members, removing and retiring peers.

use super::*;

impl IoThread {
    /// Accepts every connection waiting on the listener. Each is judged by the admission
    /// rules (`net::admission`): refused at once if its source address holds its share of
    /// pending connections, or if the node is full with nothing pending to displace; made
    /// room for by displacing a pending connection when the table or the node is full;
    /// otherwise admitted with the handshake deadline of the table as it is now. At most
    /// `ACCEPT_BUDGET` per call: the rest waits for the next loop turn.
    pub(super) fn accept_all(&mut self) {
        for _ in 0..ACCEPT_BUDGET {
            match self.listener.accept() {
                Ok((mut stream, from)) => {
                    if self.shutdown.is_some() {
                        continue; // dropped: we are closing
                    }
                    let now = Instant::now();
                    let source = admission::source_of(from.ip());
                    let node_full = self.conns.len() >= self.cfg.max_connections;
                    let victim = match self.admission.judge(source, node_full) {
                        Verdict::Admit => None,
                        Verdict::Displace(victim) => Some(victim),
                        v @ (Verdict::SourceFull | Verdict::Full) => {
                            self.refuse_stranger(from, v);
                            continue; // dropped at once: the stream closes here
                        }
                    };
                    let transport = match Transport::new(self.cfg.tls.as_ref(), None) {
                        Ok(t) => t,
                        Err(e) => {
                            Counters::add(&self.counters.tls_failures, 1);
                            log::warn!("{}: connection from {from} dropped: {e}", self.cfg.name);
                            continue;
                        }
                    };
                    let Some(nonce) = self.fresh_nonce() else {
                        continue; // dropped; logged
                    };
                    if let Some(victim) = victim {
                        self.displace(victim, from);
                    }
                    configure(&self.cfg, &stream);
                    let token = self.new_token();
                    if let Err(e) =
                        self.poll
                            .registry()
                            .register(&mut stream, token, Interest::READABLE)
                    {
                        log::warn!(
                            "{}: cannot register connection from {from}: {e}",
                            self.cfg.name
                        );
                        continue;
                    }
                    Counters::add(&self.counters.accepted, 1);
                    log::debug!("{}: accepted connection from {from}", self.cfg.name);
                    let mut out = Vec::new();
                    let hs = Handshake::acceptor(self.local.clone(), nonce, &mut out);
                    let mut conn = Conn::new(token, stream, None, hs);
                    conn.transport = transport;
                    conn.wbuf = out;
                    self.conns.insert(token, conn);
                    self.admission.insert(token, source, now);
                    self.update_gauges();
                    let deadline = self.admission.deadline(self.cfg.handshake_timeout);
                    self.timers
                        .add(now + deadline, TimerKind::Handshake { token });
                    // The table just grew: older connections may be past the shorter deadline.
                    self.shed_overdue(now);
                    // The Hello leaves now, not at the end of the turn: the dialler's
                    // handshake deadline is running.
                    self.write_conn(token);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.accept_pending = false;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and the like: log and try again on the next readiness event.
                    log::error!("{}: accept failed: {e}", self.cfg.name);
                    self.accept_pending = false;
                    break;
                }
            }
        }
        self.warn_shedding(Instant::now());
    }

    pub(super) fn dial(&mut self, id: usize) {
        let nonce = self.fresh_nonce();
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if p.state == PeerState::Closed || p.conn.is_some() || self.shutdown.is_some() {
            return;
        }
        let Some(addr) = p.addr else {
            p.set_state(PeerState::Backoff);
            return; // no address: it will dial us
        };
        let transport = match Transport::new(self.cfg.tls.as_ref(), Some(&p.shared.name)) {
            Ok(t) => t,
            Err(e) => {
                Counters::add(&self.counters.tls_failures, 1);
                log::warn!("{}: cannot dial '{}': {e}", self.cfg.name, p.shared.name);
                return self.schedule_reconnect(id);
            }
        };
        let Some(nonce) = nonce else {
            return self.schedule_reconnect(id); // logged
        };
        match TcpStream::connect(addr) {
            Ok(mut stream) => {
                let token = Token(self.next_token);
                self.next_token += 1;
                if let Err(e) = self.poll.registry().register(
                    &mut stream,
                    token,
                    Interest::READABLE | Interest::WRITABLE,
                ) {
                    log::warn!("{}: cannot register dial to {addr}: {e}", self.cfg.name);
                    self.schedule_reconnect(id);
                    return;
                }
                let p = self.peers.get_mut(&id).expect("peer present");
                let hs = Handshake::dialler(self.local.clone(), p.shared.name.to_string(), nonce);
                let mut conn = Conn::new(token, stream, Some(id), hs);
                conn.transport = transport;
                conn.set_writable_interest(true);
                p.conn = Some(token);
                p.set_state(PeerState::Connecting);
                self.conns.insert(token, conn);
                self.update_gauges();
                Counters::add(&self.counters.dialled, 1);
                self.timers.add(
                    Instant::now() + self.cfg.handshake_timeout,
                    TimerKind::Handshake { token },
                );
            }
            Err(e) => {
                log::debug!(
                    "{}: dial '{}' at {addr} failed: {e}",
                    self.cfg.name,
                    p.shared.name
                );
                Counters::add(&self.counters.dial_failures, 1);
                self.schedule_reconnect(id);
            }
        }
    }

    /// A fresh handshake nonce: OS randomness when a secret is configured (the nonce is not
    /// used otherwise). `None` if the OS has no randomness to give: logged, and the
    /// connection is not made rather than authenticated with a predictable nonce.
    pub(super) fn fresh_nonce(&self) -> Option<Nonce> {
        let mut nonce = [0u8; wire::NONCE_LEN];
        if self.cfg.secret.is_none() {
            return Some(nonce);
        }
        match getrandom::getrandom(&mut nonce) {
            Ok(()) => Some(nonce),
            Err(e) => {
                log::error!(
                    "{}: no OS randomness for a handshake nonce ({e}); connection not made",
                    self.cfg.name
                );
                None
            }
        }
    }

    pub(super) fn schedule_reconnect(&mut self, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if p.state == PeerState::Closed || self.shutdown.is_some() {
            return;
        }
        p.set_state(PeerState::Backoff);
        if p.addr.is_none() {
            return;
        }
        p.gen += 1;
        let delay = self
            .backoff
            .delay(p.attempt, self.cfg.backoff_min, self.cfg.backoff_max);
        p.attempt = p.attempt.saturating_add(1);
        let gen = p.gen;
        self.timers.add(
            Instant::now() + delay,
            TimerKind::Reconnect { peer: id, gen },
        );
    }

    pub(super) fn conn_event(&mut self, token: Token, readable: bool, hup: bool, writable: bool) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return; // stale token: a spurious event for a connection already closed
        };
        if conn.connecting {
            match conn.stream.take_error() {
                Ok(None) => {}
                Ok(Some(e)) | Err(e) => return self.dial_failed(token, e),
            }
            match conn.stream.peer_addr() {
                Ok(_) => {
                    conn.connecting = false;
                    configure(&self.cfg, &conn.stream);
                    if let Some(id) = conn.dialled {
                        if let Some(p) = self.peers.get_mut(&id) {
                            p.set_state(PeerState::Handshaking);
                        }
                    }
                    self.dirty.push(token);
                }
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return, // not yet
                Err(e) => return self.dial_failed(token, e),
            }
        }
        if writable {
            self.write_conn(token);
        }
        if readable {
            self.read_conn(token, hup);
        }
    }

    pub(super) fn dial_failed(&mut self, token: Token, e: io::Error) {
        Counters::add(&self.counters.dial_failures, 1);
        if let Some(conn) = self.conns.get(&token) {
            if let Some(id) = conn.dialled {
                log::debug!(
                    "{}: connect to '{}' failed: {e}",
                    self.cfg.name,
                    self.peer_name(id)
                );
            }
        }
        self.close_conn(token, None);
    }

    /// Closes a connection (after writing `close` best-effort) and, if it spoke for a peer,
    /// moves the peer to `Backoff` and schedules a reconnect.
    pub(super) fn close_conn(&mut self, token: Token, close: Option<(CloseCode, &str)>) {
        if close.is_some() && self.conns.contains_key(&token) {
            // The close flushes the write buffer, which may hold messages published this
            // turn: nothing leaves before the journal holds it.
            self.commit_journal();
        }
        let journal_ok = self.journal_ok();
        self.admission.remove(token);
        let Some(mut conn) = self.conns.remove(&token) else {
            return;
        };
        if let Some((code, reason)) = close {
            if journal_ok {
                wire::encode_close(&mut conn.wbuf, code, reason);
                let _ = conn.flush(); // best effort: the socket is closed right after
            }
        }
        let _ = self.poll.registry().deregister(&mut conn.stream);
        self.update_gauges();
        self.timers.cancel(|k| *k == TimerKind::Handshake { token });
        let Some(id) = conn.peer else { return };
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if p.conn != Some(token) {
            return;
        }
        if conn.paused {
            // Nothing left to resume; the next connection pauses afresh if need be.
            p.shared.credit.unpause();
        }
        p.conn = None;
        p.ack_unwritten = None; // lost with the connection: owed again
        if conn.established {
            Counters::add(&p.shared.counters.disconnects, 1);
            log::info!("{}: connection to '{}' lost", self.cfg.name, p.shared.name);
        }
        if p.state != PeerState::Closed {
            self.schedule_reconnect(id);
        }
    }

    pub(super) fn add_unknown(&mut self, name: &str) -> usize {
        let name: SharedStr = name.into();
        let shared = self.shared.new_peer(name.clone(), self.cfg.window);
        let id = shared.id;
        self.peers_map.write().insert(name.clone(), shared.clone());
        log::info!("{}: admitting unknown member '{name}'", self.cfg.name);
        self.command(Command::AddPeer {
            peer: shared,
            addr: None,
        });
        id
    }

    /// Closes peer `id` for good: fails what is queued (giving back its permits), closes
    /// its window and connection. A reconnect timer still pending finds no peer and does
    /// nothing; a connection completing later finds no peer and is refused.
    pub(super) fn remove_peer(&mut self, id: usize) {
        let Some(conn) = self.peers.get(&id).and_then(|p| p.conn) else {
            self.retire_peer(id, CloseCode::Removed);
            return;
        };
        self.retire_peer(id, CloseCode::Removed);
        self.close_conn(conn, Some((CloseCode::Removed, "member removed")));
    }

    /// Terminal transition of a peer: `Closed`, outbox closed and failed, permits back.
    pub(super) fn retire_peer(&mut self, id: usize, why: CloseCode) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        p.set_state(PeerState::Closed);
        p.gen += 1;
        let failed = fail_queued(p);
        let mut unacked = p.desc.drain_unacked();
        p.shared
            .outbox
            .give_back(Return::Retired, p.ledger.retire());
        p.shared.outbox.window().close();
        let name = p.shared.name.clone();
        if self.journal.is_some() && why != CloseCode::Removed && !unacked.is_empty() {
            // Shutting down with a journal: they stay journalled and are resent after a
            // restart, so they are not undelivered.
            log::info!(
                "{}: {} unacknowledged messages to '{name}' stay in the journal",
                self.cfg.name,
                unacked.len()
            );
            unacked.clear();
        }
        let undelivered = unacked.len() as u64;
        Counters::add(&p.shared.counters.undelivered, undelivered);
        if failed + undelivered > 0 {
            log::warn!(
                "{}: '{}' closed ({why:?}): {failed} queued messages failed, {undelivered} sent but unacknowledged",
                self.cfg.name,
                p.shared.name
            );
        }
        if self.journal.is_some() && why == CloseCode::Removed {
            // Removed for good: its journalled messages are retired with it.
            self.journal_record(Record::Bound {
                peer: name.clone(),
                launch: 0,
            });
        }
        if why == CloseCode::Removed {
            self.timers.cancel(|k| match k {
                TimerKind::Reconnect { peer, .. } | TimerKind::AckDelay { peer } => *peer == id,
                _ => false,
            });
            self.peers.remove(&id);
            if self.by_name.get(&name) == Some(&id) {
                self.by_name.remove(&name);
            }
        }
        self.report_undelivered(&name, unacked);
    }
}
