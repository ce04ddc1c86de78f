//! The inbound path: reading sockets within a budget, splitting frames off the read buffer,
//! data to the member queues and the pool, control frames, protocol errors.

use super::*;

impl IoThread {
    /// Reads and handles what connection `token` has, up to the per-turn budget. `hup`: the
    /// readiness event reported the peer's hang-up (or this is a continuation), so read until
    /// EOF or `WouldBlock` rather than stopping at a short read.
    pub(super) fn read_conn(&mut self, token: Token, hup: bool) {
        let mut total = 0usize;
        loop {
            let Some(conn) = self.conns.get_mut(&token) else {
                return;
            };
            if conn.paused {
                // Its peer has more than its window waiting for delivery: the bytes stay
                // in the kernel (TCP pushes back on the peer) until `resume_paused`.
                return;
            }
            match conn.read_some(&mut self.scratch) {
                Ok((0, _)) => {
                    self.take_frames(token);
                    if self.conns.contains_key(&token) {
                        self.close_conn(token, None);
                    }
                    return;
                }
                Ok((n, short)) => {
                    total += n;
                    conn.last_read = Instant::now();
                    if conn.transport.wants_write() {
                        // TLS: reading made records to send (handshake, alerts).
                        self.dirty.push(token);
                    }
                    self.take_frames(token);
                    if total >= READ_BUDGET {
                        self.mark_read_pending(token);
                        return;
                    }
                    if short && !hup {
                        // Drained: skip the read that would only say WouldBlock. Not after
                        // a hang-up event, whose EOF the next read must see.
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if conn.transport.wants_write() {
                        // TLS: the handshake records read made an answer to send.
                        self.dirty.push(token);
                    }
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if conn::is_tls_failure(&e) => {
                    return self.tls_failure(token, &e.to_string());
                }
                Err(e) => {
                    log::info!("{}: read failed, closing connection: {e}", self.cfg.name);
                    self.close_conn(token, None);
                    return;
                }
            }
        }
    }

    pub(super) fn mark_read_pending(&mut self, token: Token) {
        if let Some(c) = self.conns.get_mut(&token) {
            if !c.read_pending {
                c.read_pending = true;
                self.read_pending.push_back(token);
            }
        }
    }

    pub(super) fn process_read_pending(&mut self) {
        for _ in 0..self.read_pending.len() {
            let Some(t) = self.read_pending.pop_front() else {
                return;
            };
            if let Some(c) = self.conns.get_mut(&t) {
                c.read_pending = false;
                self.read_conn(t, true);
            }
        }
    }

    /// Splits the frames the read buffer holds and handles each one before splitting the
    /// next, so that every frame is bounded by the state its connection is in when it is
    /// reached: a read that brought the last handshake frame and data frames together
    /// frames the data by the data limit (see [`wire::split_frame`]). The turn's regular
    /// messages go to their sender's queue in one push at the end.
    pub(super) fn take_frames(&mut self, token: Token) {
        let mut peer_of_batch = None;
        // Until the connection is closed by a frame, or no complete frame is left.
        while let Some(conn) = self.conns.get_mut(&token) {
            if conn.paused {
                break;
            }
            let (established, peer) = (conn.established, conn.peer);
            let max = if established {
                self.max_len
            } else {
                wire::MAX_HANDSHAKE_FRAME
            };
            match wire::split_frame(&mut conn.rbuf, max) {
                Ok(None) => break,
                Ok(Some(wire::Split::Data {
                    flags,
                    seq,
                    payload,
                })) => match (established, peer) {
                    (true, Some(id)) => {
                        peer_of_batch = Some(id);
                        match self.on_data(token, id, flags, seq, payload) {
                            Inflow::Go => {}
                            Inflow::Closed => break,
                            Inflow::Pause => {
                                if self.pause(token, id) {
                                    break;
                                }
                            }
                        }
                    }
                    _ => {
                        self.protocol_error(token, "data before the handshake completed".into());
                        break;
                    }
                },
                Ok(Some(wire::Split::Control(bytes))) => self.on_frame(token, &bytes),
                Err(e) => {
                    if let Some(id) = peer_of_batch {
                        self.push_batch(id);
                    }
                    self.protocol_error(token, e.to_string());
                    break;
                }
            }
        }
        if let Some(id) = peer_of_batch {
            self.push_batch(id);
            self.after_data(id);
        }
    }

    pub(super) fn protocol_error(&mut self, token: Token, reason: String) {
        Counters::add(&self.counters.protocol_errors, 1);
        let who = self
            .conns
            .get(&token)
            .and_then(|c| c.peer)
            .map(|id| self.peer_name(id))
            .unwrap_or_else(|| "an unidentified peer".into());
        log::warn!(
            "{}: protocol error from {who}, closing connection: {reason}",
            self.cfg.name
        );
        self.close_conn(token, Some((CloseCode::Protocol, &reason)));
    }

    /// A TLS failure (handshake, certificate, or a certificate not valid for the member
    /// name claimed): closes that one connection, after a best-effort alert, and counts it.
    pub(super) fn tls_failure(&mut self, token: Token, reason: &str) {
        Counters::add(&self.counters.tls_failures, 1);
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        conn.flush_alert();
        let (peer, addr) = (conn.peer, conn.stream.peer_addr());
        let who = match (peer, addr) {
            (Some(id), _) => format!("'{}'", self.peer_name(id)),
            (None, Ok(a)) => a.to_string(),
            (None, Err(_)) => "an unidentified peer".to_owned(),
        };
        log::warn!(
            "{}: TLS failure with {who}, closing connection: {reason}",
            self.cfg.name
        );
        self.close_conn(token, None);
    }

    /// A TLS peer whose certificate is not valid for the member name its handshake claims:
    /// refused (with a `Close` telling it why), counted as a TLS failure.
    pub(super) fn refuse_certificate(&mut self, token: Token, claimed: &str, why: &str) {
        Counters::add(&self.counters.tls_failures, 1);
        log::warn!(
            "{}: refusing a connection claiming to be '{claimed}': {why}",
            self.cfg.name
        );
        self.close_conn(
            token,
            Some((
                CloseCode::NameMismatch,
                "TLS certificate not valid for the member name claimed",
            )),
        );
    }

    /// A data frame from peer `id` on its established connection `token`: admitted
    /// against the peer's window (a peer past it is closed: it ignores credit), then
    /// queued for delivery. Says whether to go on reading, or pause this connection
    /// because the peer's held bytes, counting messages of a previous stream still being
    /// handled, exceed its window.
    pub(super) fn on_data(
        &mut self,
        token: Token,
        id: usize,
        flags: u8,
        seq: Option<u64>,
        payload: Bytes,
    ) -> Inflow {
        let Some(p) = self.peers.get_mut(&id) else {
            return Inflow::Go;
        };
        let cost = crate::flow::cost(payload.len());
        match p.desc.accept_data(seq, cost, p.peer_window) {
            Ok(Receive::Deliver) => {}
            Ok(Receive::Duplicate) => {
                Counters::add(&p.shared.counters.duplicates, 1);
                // Still acked: the sender resent it because it lacks our ack.
                p.ack_forced = true;
                return Inflow::Go;
            }
            Err(e) => {
                if matches!(e, RecoveryError::WindowExceeded { .. }) {
                    Counters::add(&self.counters.window_violations, 1);
                }
                self.push_batch(id);
                self.protocol_error(token, e.to_string());
                return Inflow::Closed;
            }
        }
        Counters::add(&p.shared.counters.received, 1);
        Counters::add(&p.shared.counters.received_bytes, payload.len() as u64);
        let held = p.shared.credit.received(cost);
        p.shared.counters.note_held(held);
        if flags & wire::FLAG_OOB != 0 {
            self.oob_batch
                .push(Delivery::new(p.shared.name.clone(), payload, seq, true).in_epoch(p.epoch));
        } else {
            // Named by the deliverer, on the pool thread: cloning the sender's name here and
            // dropping it there would bounce its refcount between cores on every message.
            self.batch
                .push(Delivery::unnamed(payload, seq).in_epoch(p.epoch));
        }
        if held > p.shared.credit.window() {
            Inflow::Pause
        } else {
            Inflow::Go
        }
    }

    /// Hands the messages split this turn to the sender's queues: regular ones to its
    /// member queue (one deliverer at a time), out-of-band ones to its OOB queue (at most
    /// its share of the pool's threads).
    pub(super) fn push_batch(&mut self, id: usize) {
        let Some(p) = self.peers.get(&id) else {
            self.batch.clear();
            self.oob_batch.clear();
            return;
        };
        let (member, oob) = (p.shared.member.clone(), p.shared.oob.clone());
        if !self.batch.is_empty() && member.push(self.batch.drain(..)) {
            self.submit(Task::Member(member));
        }
        if !self.oob_batch.is_empty() {
            for _ in 0..oob.push(self.oob_batch.drain(..)) {
                self.submit(Task::Oob(oob.clone()));
            }
        }
    }

    pub(super) fn submit(&mut self, task: Task) {
        if !self.pool.submit(task) {
            log::debug!(
                "{}: delivery pool stopped; a delivery task was dropped",
                self.cfg.name
            );
        }
    }

    /// Stops reading connection `token` of peer `id`, which holds more than its receive
    /// window: its bytes stay in the kernel and TCP pushes back on the peer, until the
    /// handler brings it back within the window (the pool then asks the IO thread to
    /// resume it; the tick checks too). Returns `false` if it is already back within.
    pub(super) fn pause(&mut self, token: Token, id: usize) -> bool {
        let Some(p) = self.peers.get(&id) else {
            return false;
        };
        if !p.shared.credit.pause() {
            return false;
        }
        let (held, window) = (p.shared.credit.held(), p.shared.credit.window());
        let Some(conn) = self.conns.get_mut(&token) else {
            return false;
        };
        if !conn.paused {
            conn.paused = true;
            self.paused.push(token);
            Counters::add(&self.counters.read_pauses, 1);
            log::debug!(
                "{}: '{}' has {held} bytes waiting for delivery, more than its receive window of {window}; not reading it until the handler catches up",
                self.cfg.name,
                self.peer_name(id)
            );
        }
        true
    }

    /// Resumes reading peer `id`'s connection if it was paused and the peer is back within
    /// its receive window. Time spent paused is ours, not the peer's: the idle timeout
    /// counts from the resumption.
    pub(super) fn resume_peer(&mut self, id: usize, now: Instant) {
        let Some(p) = self.peers.get(&id) else {
            return;
        };
        let Some(token) = p.conn else {
            return;
        };
        if !self.conns.get(&token).is_some_and(|c| c.paused) || !p.shared.credit.resume() {
            return;
        }
        self.paused.retain(|&t| t != token);
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        conn.paused = false;
        conn.last_read = now;
        // What is split off the buffer first, then what the kernel holds: readiness is
        // edge-triggered, so no event would come for bytes that were already there.
        self.take_frames(token);
        self.mark_read_pending(token);
    }

    /// The tick: resumes paused connections whose peers are back within their windows
    /// (a fallback: the pool asks for each resumption as it happens).
    pub(super) fn resume_paused(&mut self, now: Instant) {
        let ids: Vec<usize> = self
            .paused
            .iter()
            .filter_map(|t| self.conns.get(t).and_then(|c| c.peer))
            .collect();
        self.paused.retain(|t| self.conns.contains_key(t));
        for id in ids {
            self.resume_peer(id, now);
        }
    }

    pub(super) fn on_frame(&mut self, token: Token, bytes: &Bytes) {
        let frame = match wire::decode(bytes, self.max_len) {
            Ok(Some((f, _))) => f,
            Ok(None) => return self.protocol_error(token, "truncated frame".into()),
            Err(e) => return self.protocol_error(token, e.to_string()),
        };
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if let Some(hs) = conn.hs.as_mut() {
            match hs.on_frame(&frame) {
                Ok(HsEvent::Identified {
                    peer,
                    peer_received,
                    peer_connections,
                    peer_unreliable,
                }) => {
                    let resume = peer_received.map(|r| (r, peer_unreliable.unwrap_or(0)));
                    self.on_identified(token, peer, resume, peer_connections)
                }
                Ok(HsEvent::Established {
                    peer_received,
                    peer_unreliable,
                }) => self.on_established(token, peer_received, peer_unreliable),
                Err(e) => {
                    if e.by_peer && e.code == CloseCode::Duplicate {
                        // The peer kept the other of two simultaneous connections.
                        log::debug!("{}: {e}", self.cfg.name);
                        self.close_conn(token, None);
                    } else if e.by_peer {
                        log::warn!("{}: {e}", self.cfg.name);
                        self.count_refusal(e.code);
                        self.close_conn(token, None);
                    } else if e.code == CloseCode::Protocol {
                        // A frame the handshake cannot take (malformed, or not the one its
                        // step expects): a protocol error, not a refusal of who the peer is.
                        self.protocol_error(token, e.reason);
                    } else {
                        self.refuse(token, e.code, &e.reason);
                    }
                }
            }
            return;
        }
        let Some(id) = conn.peer else { return };
        match frame {
            Frame::Ack { received, credit } => self.on_ack(token, id, received, credit),
            Frame::Probe => {
                // Answer with every byte of credit we hold, even below half a window.
                if let Some(p) = self.peers.get(&id) {
                    p.shared.credit.request_flush();
                }
                self.send_ack(id);
            }
            Frame::Heartbeat => {}
            Frame::Close { code, reason } => {
                log::info!(
                    "{}: '{}' closed the connection ({code:?}): {reason}",
                    self.cfg.name,
                    self.peer_name(id)
                );
                self.close_conn(token, None);
            }
            Frame::Data { .. } => unreachable!("data frames take the fast path"),
            Frame::Hello(_) | Frame::HelloReply(..) | Frame::Ready { .. } => {
                self.protocol_error(token, "handshake frame after the handshake".into())
            }
        }
    }

    pub(super) fn count_refusal(&self, code: CloseCode) {
        Counters::add(&self.counters.refused, 1);
        match code {
            CloseCode::Cluster => Counters::add(&self.counters.refused_cluster, 1),
            CloseCode::UnknownMember => Counters::add(&self.counters.refused_unknown, 1),
            CloseCode::Version => Counters::add(&self.counters.refused_version, 1),
            CloseCode::Auth => Counters::add(&self.counters.auth_failures, 1),
            _ => {}
        }
    }

    pub(super) fn refuse(&mut self, token: Token, code: CloseCode, reason: &str) {
        log::warn!(
            "{}: refusing connection ({code:?}): {reason}",
            self.cfg.name
        );
        self.count_refusal(code);
        self.close_conn(token, Some((code, reason)));
    }

    pub(super) fn on_ack(&mut self, token: Token, id: usize, received: u64, credit: u64) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        p.attempt = 0; // the peer took the connection: backoff starts over
        let acked = p.desc.acked();
        if let Err(e) = p.desc.on_ack(received) {
            return self.protocol_error(token, e.to_string());
        }
        let credit = p.desc.on_credit(credit);
        if (p.desc.acked() > acked || credit > 0) && self.journal.is_some() {
            let r = Record::Acked {
                peer: p.shared.name.clone(),
                up_to: p.desc.acked(),
                credit: p.desc.credit_seen(),
            };
            self.journal_record(r);
        }
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        if credit > 0 {
            // Never give back more than was taken: credit beyond what is outstanding (a
            // confused or malicious peer, or credit from before its restart) is clamped.
            let outstanding = p.ledger.uncredited();
            let c = p.ledger.credit(credit);
            if c < credit && p.restored {
                log::debug!(
                    "{}: '{}' returned {credit} bytes of credit for messages from before our restart; {c} applied",
                    self.cfg.name,
                    p.shared.name,
                );
            } else if c < credit {
                log::warn!(
                    "{}: '{}' returned {credit} bytes of credit with only {outstanding} outstanding; clamped",
                    self.cfg.name,
                    p.shared.name,
                );
            }
            p.shared.outbox.give_back(Return::Credited, c);
        }
    }
}
