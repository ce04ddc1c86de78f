//! Handshake decisions that need the node's state: who a connection speaks for, the
//! tie-break, incarnations, and resuming (resend) once a connection is established.

use super::*;

impl IoThread {
    /// A connection said who it is. An accepted one (`resume`: the dialler's received
    /// counts, reliable messages and unreliable window bytes) is authenticated by now when a
    /// secret is configured: it is adopted and answered with Ready, and established. A
    /// dialled one has only read the acceptor's Hello, which proves nothing yet: it is
    /// answered, and adopted only once Ready authenticates the acceptor
    /// ([`on_established`](IoThread::on_established)).
    pub(super) fn on_identified(
        &mut self,
        token: Token,
        peer: PeerIdentity,
        resume: Option<(u64, u64)>,
        peer_connections: Option<u64>,
    ) {
        let Some((peer_received, peer_unreliable)) = resume else {
            return self.answer_hello(token, &peer);
        };
        // TLS: the client certificate must name the member the handshake claims.
        if let Some(Err(why)) = self
            .conns
            .get(&token)
            .map(|c| c.peer_cert_valid_for(&peer.name))
        {
            return self.refuse_certificate(token, &peer.name, &why);
        }
        let id = match self.by_name.get(peer.name.as_str()) {
            Some(&id) => id,
            None if self.cfg.allow_unknown && self.shutdown.is_none() => {
                self.add_unknown(&peer.name)
            }
            None => {
                let reason = format!("member '{}' is not configured here", peer.name);
                return self.refuse(token, CloseCode::UnknownMember, &reason);
            }
        };
        let Some((received, connections, unreliable)) =
            self.adopt(token, id, &peer, true, peer_connections)
        else {
            return;
        };
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let Some(hs) = conn.hs.as_mut() else { return };
        hs.accept(received, connections, unreliable, &mut conn.wbuf);
        // The Ready leaves now, not at the end of the turn: the dialler cannot speak before
        // it has it, and its silence counts from the HelloReply we just read.
        self.write_conn(token);
        self.establish(token, peer_received, peer_unreliable);
    }

    /// Dialler: the acceptor's Hello arrived. With a secret it is not authenticated yet
    /// (anyone answering at the peer's address can send it), so nothing changes here: no
    /// tie-break, no new incarnation, the connection does not yet speak for the peer. We
    /// answer with our counts for the incarnation it names — what binding it would leave,
    /// zero for another launch id — and adopt the connection on Ready.
    fn answer_hello(&mut self, token: Token, peer: &PeerIdentity) {
        let Some(id) = self.conns.get(&token).and_then(|c| c.dialled) else {
            return;
        };
        let Some(p) = self.peers.get(&id) else {
            return self.refuse(token, CloseCode::Removed, "member removed");
        };
        if p.state == PeerState::Closed || self.shutdown.is_some() {
            return self.refuse(token, CloseCode::Shutdown, "member closed");
        }
        let received = p.desc.received_from(peer.launch_id);
        // With a journal, the handshake acknowledges no more than an ack may: what the
        // journal holds as delivered (the rest is resent and dropped here as duplicates).
        let received = if p.shared.progress.is_some() {
            received.min(p.durable.0)
        } else {
            received
        };
        let connections = p.desc.connections_with(peer.launch_id);
        let unreliable = p.desc.unreliable_received_from(peer.launch_id);
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let Some(hs) = conn.hs.as_mut() else { return };
        hs.accept(received, connections, unreliable, &mut conn.wbuf);
        // Now, not at the end of the turn: the handshake's deadline is running.
        self.write_conn(token);
    }

    /// Dialler: Ready arrived (and authenticated the acceptor, with a secret). Adopt the
    /// connection for the peer, then establish it.
    pub(super) fn on_established(
        &mut self,
        token: Token,
        peer_received: u64,
        peer_unreliable: u64,
    ) {
        let Some(conn) = self.conns.get(&token) else {
            return;
        };
        let (Some(id), Some(peer)) = (
            conn.dialled,
            conn.hs.as_ref().and_then(|h| h.peer()).cloned(),
        ) else {
            return;
        };
        if self.adopt(token, id, &peer, false, None).is_some() {
            self.establish(token, peer_received, peer_unreliable);
        }
    }

    /// Makes `token` the connection that speaks for peer `id`, identified (and, with a
    /// secret, authenticated) as `peer`: refuses it if the peer is gone or closing, applies
    /// the tie-break against another connection for the peer, binds the incarnation.
    /// Returns our counts for the handshake (received, connections, unreliable bytes), or
    /// `None` if the connection was refused or closed.
    fn adopt(
        &mut self,
        token: Token,
        id: usize,
        peer: &PeerIdentity,
        accepting: bool,
        peer_connections: Option<u64>,
    ) -> Option<(u64, u64, u64)> {
        let Some(p) = self.peers.get(&id) else {
            self.refuse(token, CloseCode::Removed, "member removed");
            return None;
        };
        if p.state == PeerState::Closed || self.shutdown.is_some() {
            self.refuse(token, CloseCode::Shutdown, "member closed");
            return None;
        }
        // Tie-break against the connection that speaks for this peer now, if another.
        if let Some(other) = p.conn.filter(|&o| o != token) {
            if let Some(oc) = self.conns.get(&other) {
                let stale = matches!(oc.launch, Some(l) if l != peer.launch_id);
                let keep_new = keep_new(TieBreak {
                    stale,
                    new_by_us: !accepting,
                    old_by_us: oc.dialled.is_some(),
                    old_established: oc.established,
                    we_are_smaller: *self.cfg.name < *peer.name,
                    our_connections: p.desc.connections_with(peer.launch_id),
                    peer_connections,
                });
                Counters::add(&self.counters.tie_breaks, 1);
                if keep_new {
                    log::debug!(
                        "{}: '{}' connected again; replacing the older connection",
                        self.cfg.name,
                        peer.name
                    );
                    self.close_conn(
                        other,
                        Some((CloseCode::Duplicate, "replaced by a newer connection")),
                    );
                } else {
                    log::debug!(
                        "{}: simultaneous connect with '{}'; keeping ours",
                        self.cfg.name,
                        peer.name
                    );
                    self.close_conn(
                        token,
                        Some((
                            CloseCode::Duplicate,
                            "simultaneous connect lost the tie-break",
                        )),
                    );
                    return None;
                }
            }
        }
        self.bind_incarnation(id, peer);
        let p = self.peers.get_mut(&id)?;
        // With a journal, no more than an ack may carry (see `answer_hello`).
        let received = if p.shared.progress.is_some() {
            p.desc.received().min(p.durable.0)
        } else {
            p.desc.received()
        };
        let counts = (received, p.desc.connections(), p.desc.unreliable_received());
        p.conn = Some(token);
        if p.state != PeerState::Handshaking {
            p.set_state(PeerState::Handshaking);
        }
        let conn = self.conns.get_mut(&token)?;
        conn.peer = Some(id);
        conn.launch = Some(peer.launch_id);
        Some(counts)
    }

    /// Binds the peer's recovery descriptor to the incarnation that just identified; a
    /// changed launch id retires the old one (its unacked messages are undelivered).
    pub(super) fn bind_incarnation(&mut self, id: usize, peer: &PeerIdentity) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        // What the peer may send is its own window (enforced); what we hold for it, and
        // return credit in halves of, is the smaller of that and our receive window.
        p.peer_window = peer.window;
        p.shared
            .credit
            .set_window(peer.window.min(self.cfg.recv_window));
        p.peer_max_message = peer.max_message as usize;
        let restarted = matches!(p.desc.remote_launch(), Some(l) if l != peer.launch_id);
        let first = p.desc.remote_launch().is_none();
        let written = p.desc.written();
        let mut old = p.desc.bind(peer.launch_id);
        if first || restarted {
            // The journal's counters for this peer belong to this incarnation from now on
            // (for a new one, they restart and its old messages are retired).
            self.journal_record(Record::Bound {
                peer: peer.name.as_str().into(),
                launch: peer.launch_id,
            });
        }
        if !restarted {
            return;
        }
        self.restart_stream(id);
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        // Messages that never left (published while disconnected, with a journal) were
        // never the old incarnation's: they go to the new one, numbered afresh.
        let split = old.partition_point(|m| m.seq <= written);
        let unsent = old.split_off(split);
        log::warn!(
            "{}: '{}' restarted (new launch id); {} unacknowledged messages to its old incarnation are undelivered, {} never sent go to the new one",
            self.cfg.name,
            peer.name,
            old.len(),
            unsent.len()
        );
        // Credit for the old incarnation will never come: give it all back (but what the
        // unsent messages hold), and drop any credit we still owed the old incarnation.
        let keep: u64 = unsent
            .iter()
            .map(|m| crate::flow::cost(m.payload.len()))
            .sum();
        let outstanding = p.ledger.retire();
        let keep = keep.min(outstanding);
        p.ledger.publish(keep);
        p.shared
            .outbox
            .give_back(Return::Retired, outstanding - keep);
        let name = p.shared.name.clone();
        let mut records = Vec::with_capacity(unsent.len());
        for m in unsent {
            let u = p.desc.publish(m.flags, m.payload);
            records.push(Record::Message {
                peer: name.clone(),
                seq: u.seq,
                flags: u.flags,
                payload: u.payload.clone(),
            });
        }
        for r in records {
            self.journal_record(r);
        }
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        Counters::add(&p.shared.counters.undelivered, old.len() as u64);
        self.report_undelivered(&peer.name, old);
    }

    /// Hands messages that will never be delivered to the application's hook, if any. The
    /// hook runs on the IO thread: a panic in it is caught and logged, never fatal.
    pub(super) fn report_undelivered(&self, peer: &str, msgs: Vec<crate::proto::Unacked>) {
        if msgs.is_empty() {
            return;
        }
        if let Some(hook) = &self.undelivered {
            if catch_unwind(AssertUnwindSafe(|| hook(peer, msgs))).is_err() {
                log::error!(
                    "{}: the on_undelivered hook panicked; continuing",
                    self.cfg.name
                );
            }
        }
    }

    /// Retires everything of the current relationship with peer `id` (unacked messages are
    /// undelivered, their credit given back) while keeping what is queued.
    pub(super) fn forget_relationship(&mut self, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let old = p.desc.reset();
        if self.journal.is_some() {
            // Unbind (retiring the journalled stream), then bind afresh.
            let (peer, launch) = (p.shared.name.clone(), p.desc.remote_launch());
            self.journal_record(Record::Bound {
                peer: peer.clone(),
                launch: 0,
            });
            if let Some(launch) = launch {
                self.journal_record(Record::Bound { peer, launch });
            }
        }
        // Credit we owed the old stream is dropped with it.
        self.restart_stream(id);
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        p.shared
            .outbox
            .give_back(Return::Retired, p.ledger.retire());
        Counters::add(&p.shared.counters.undelivered, old.len() as u64);
        let name = p.shared.name.clone();
        self.report_undelivered(&name, old);
    }

    /// The handshake completed on `token`: resend what the peer lacks, then new messages.
    pub(super) fn establish(&mut self, token: Token, peer_received: u64, peer_unreliable: u64) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let Some(id) = conn.peer else { return };
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if p.conn != Some(token) {
            return self.close_conn(token, Some((CloseCode::Duplicate, "superseded")));
        }
        conn.hs = None;
        conn.established = true;
        self.admission.remove(token); // no longer pending
        self.update_gauges();
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let mut resent = 0u64;
        let acked = p.desc.acked();
        if let Some(kept) = p.restored_upto.filter(|_| peer_received > p.desc.sent()) {
            // The peer holds more of our stream than our journal: its tail was lost (a
            // machine crash under a lazy fsync policy, or a cut for corruption). Those
            // messages reached the peer; continue after them rather than refuse forever.
            log::warn!(
                "{}: '{}' holds {peer_received} of our messages, our journal only {}: its tail was lost; continuing at {}",
                self.cfg.name,
                p.shared.name,
                p.desc.sent(),
                peer_received + 1
            );
            let fresh = p.desc.fast_forward(peer_received, kept);
            let credit = p.desc.credit_seen();
            let name = p.shared.name.clone();
            let mut records = vec![Record::Acked {
                peer: name.clone(),
                up_to: peer_received,
                credit,
            }];
            for m in fresh {
                let u = p.desc.publish(m.flags, m.payload);
                records.push(Record::Message {
                    peer: name.clone(),
                    seq: u.seq,
                    flags: u.flags,
                    payload: u.payload.clone(),
                });
            }
            for r in records {
                self.journal_record(r);
            }
        }
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let mut oversized = None;
        let resumed = match p.desc.resume(peer_received) {
            Ok(rest) => {
                for u in rest {
                    if u.payload.len() > p.peer_max_message && oversized.is_none() {
                        oversized = Some((u.seq, u.payload.len()));
                    }
                    wire::encode_data(&mut conn.wbuf, u.flags, Some(u.seq), &u.payload);
                    resent += 1;
                }
                Ok(())
            }
            Err(e) => Err(e),
        };
        if let Some((seq, len)) = oversized {
            // Only a message journalled before this process knew the peer's limit can be
            // here; the peer will refuse it on every resend.
            log::error!(
                "{}: journalled message {seq} to '{}' has {len} bytes, more than the {} it accepts: it cannot be delivered; give every member the same max_message",
                self.cfg.name,
                p.shared.name,
                p.peer_max_message
            );
        }
        match resumed {
            Ok(()) => {}
            Err(RecoveryError::AckWentBack { claimed, acked }) => {
                // Same incarnation, fewer messages than it acknowledged: the peer forgot us
                // (removed and added us again). Start afresh on both sides: we retire our
                // state now, the peer's is already fresh; the redial then resumes from zero.
                let why = format!(
                    "'{}' holds {claimed} of our messages after acknowledging {acked}: it lost its state for us (removed and re-added?); starting afresh",
                    self.peer_name(id)
                );
                log::warn!("{}: {why}", self.cfg.name);
                self.forget_relationship(id);
                return self.close_conn(token, Some((CloseCode::Other, "state reset")));
            }
            Err(e) => return self.protocol_error(token, e.to_string()),
        }
        let p = self.peers.get_mut(&id).expect("peer present");
        // Every unacked message is on this connection now.
        let sent = p.desc.sent();
        p.desc.note_written(sent);
        if p.desc.acked() > acked && self.journal.is_some() {
            let r = Record::Acked {
                peer: p.shared.name.clone(),
                up_to: p.desc.acked(),
                credit: p.desc.credit_seen(),
            };
            self.journal_record(r);
        }
        let p = self.peers.get_mut(&id).expect("peer present");
        // Unreliable messages the old connection swallowed are never resent: their permits
        // come back now, from the peer's count of what it received. Never more than is
        // outstanding: a peer that restarted from its journal counts from zero again.
        let lost = p.ledger.forget(p.desc.unreliable_lost(peer_unreliable));
        if lost > 0 {
            p.shared.outbox.give_back(Return::Lost, lost);
        }
        Counters::add(&p.shared.counters.resent, resent);
        Counters::add(&p.shared.counters.connects, 1);
        Counters::add(&self.counters.handshakes, 1);
        // The backoff restarts only once the peer shows it took the connection (its first
        // ack or message), so a peer that refuses right after the handshake is not redialled
        // at the minimum backoff forever.
        p.gen += 1; // cancels a pending reconnect
        p.set_state(PeerState::Connected);
        log::info!(
            "{}: connected to '{}' ({} resent, {} unacked)",
            self.cfg.name,
            p.shared.name,
            resent,
            p.desc.unacked_len()
        );
        self.dirty.push(token);
        // Credit and acks from before the reconnect go first (the last ack may have been lost
        // with the old connection; totals make resending it harmless).
        if p.shared.credit.pending() > 0 || p.desc.ack_owed() || p.desc.credit_returned() > 0 {
            self.record_progress(id);
            self.write_ack(id, true);
        }
        self.flush_peer(id);
        // The first frames on the new connection leave now rather than at the end of the
        // turn: the peer's liveness clock for it is already running.
        self.write_conn(token);
    }
}
