//! The outbound path: publishing queued messages (filter, expiry, sequence numbers), acks
//! with credit, and writing connection buffers.

use super::*;

impl IoThread {
    pub(super) fn write_conn(&mut self, token: Token) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if conn.connecting {
            return;
        }
        // Nothing leaves before the journal holds it.
        self.commit_journal();
        if !self.journal_ok() {
            // The buffer may hold messages the journal could not take: they must not reach
            // the peer (a restart would give their sequence numbers to other messages).
            return self.close_conn(token, None);
        }
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        let result = conn.flush();
        match result {
            Ok(drained) => {
                if drained && conn.established {
                    // Every ack in the buffer has been written: now it counts as sent.
                    if let Some(p) = conn.peer.and_then(|id| self.peers.get_mut(&id)) {
                        if p.conn == Some(token) {
                            if let Some(r) = p.ack_unwritten.take() {
                                p.desc.ack_written(r);
                            }
                        }
                    }
                }
                let Some(conn) = self.conns.get_mut(&token) else {
                    return;
                };
                let low = conn.unwritten() < self.cfg.write_high_water / 2;
                if let Err(e) = conn.update_interest(self.poll.registry()) {
                    log::warn!("{}: reregister failed: {e}", self.cfg.name);
                }
                let peer = if conn.established { conn.peer } else { None };
                if let (true, Some(id)) = (low, peer) {
                    let more = self
                        .peers
                        .get(&id)
                        .is_some_and(|p| !p.pending.is_empty() || !p.shared.outbox.is_empty());
                    if more {
                        self.flush_peer(id);
                    }
                }
            }
            Err(e) => {
                log::info!("{}: write failed, closing connection: {e}", self.cfg.name);
                self.close_conn(token, None);
            }
        }
    }

    pub(super) fn flush_dirty(&mut self) {
        // Also commits what was journalled for peers with nothing to write (messages to a
        // disconnected peer).
        self.commit_journal();
        let dirty = std::mem::take(&mut self.dirty);
        for t in &dirty {
            self.write_conn(*t);
        }
        let mut dirty = dirty;
        dirty.clear();
        if self.dirty.is_empty() {
            self.dirty = dirty;
        }
    }

    /// After data from peer `id`: ack now if enough is owed, else make sure a delayed ack is
    /// armed.
    pub(super) fn after_data(&mut self, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        p.attempt = 0; // the peer took the connection: backoff starts over
        let covered = p.ack_unwritten.unwrap_or(0).max(p.desc.acks_sent());
        if p.desc.received() - covered >= self.cfg.ack_threshold {
            self.send_ack(id);
            if !self.journalled() {
                return;
            }
            // With a journal the ack covers only what the handler has done and the disk
            // holds: if that is not everything received, come back for the rest.
            let Some(p) = self.peers.get_mut(&id) else {
                return;
            };
            let covered = p.ack_unwritten.unwrap_or(0).max(p.desc.acks_sent());
            if p.desc.received() > covered && !p.ack_timer {
                p.ack_timer = true;
                self.timers.add(
                    Instant::now() + self.cfg.ack_delay,
                    TimerKind::AckDelay { peer: id },
                );
            }
        } else if (p.desc.ack_owed() || p.ack_forced) && !p.ack_timer {
            p.ack_timer = true;
            self.timers.add(
                Instant::now() + self.cfg.ack_delay,
                TimerKind::AckDelay { peer: id },
            );
        }
    }

    /// Writes an ack carrying the received count and all pending credit, if the peer has an
    /// established connection.
    pub(super) fn send_ack(&mut self, id: usize) {
        // With a journal, the progress is recorded first and acknowledged once on disk.
        self.record_progress(id);
        self.write_ack(id, false);
    }

    /// Writes an ack (cumulative received count and cumulative credit) even when nothing new
    /// is owed if `force`: after a reconnect, in case the last one was lost with the old
    /// connection.
    pub(super) fn write_ack(&mut self, id: usize, force: bool) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let Some(token) = p.conn else { return };
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if !conn.established {
            return;
        }
        let journalled = p.shared.progress.is_some();
        // With a journal, only what the journal holds on disk: the messages recorded as
        // delivered and the credit recorded with them.
        let received = if journalled {
            p.desc.received().min(p.durable.0)
        } else {
            p.desc.received()
        };
        let covered = p.ack_unwritten.unwrap_or(0).max(p.desc.acks_sent());
        let force = force || std::mem::take(&mut p.ack_forced);
        let credit_owed = if journalled {
            p.durable.1.saturating_sub(p.desc.credit_returned())
        } else {
            p.shared.credit.pending()
        };
        if credit_owed == 0 && received <= covered && !force {
            return;
        }
        let credit = if journalled {
            credit_owed
        } else {
            p.shared.credit.take()
        };
        let total = p.desc.return_credit(credit);
        wire::encode_ack(&mut conn.wbuf, received, total);
        p.ack_unwritten = Some(received);
        self.dirty.push(token);
    }

    /// Publishes queued messages of peer `id` to its connection while its write buffer is
    /// below the high-water mark. This is where a message gets its sequence number, enters
    /// the unacked queue and counts as sent — or is filtered, expires, or fails, giving its
    /// permits back.
    ///
    /// With a journal, reliable messages are published (journalled) even while the peer is
    /// disconnected, so that nothing `send` accepted depends on this process surviving; the
    /// handshake resends them. An unreliable message for a disconnected peer then fails at
    /// once (its permits back, counted `failed`): best effort finds no connection, and it
    /// must not hold back the reliable messages behind it from the journal. A message with
    /// a ttl stops the eager publishing until it is published to a connection or expires
    /// (`Node::sync_journal` journals it anyway: from then on it no longer expires).
    pub(super) fn flush_peer(&mut self, id: usize) {
        self.publish_peer(id, self.cfg.write_high_water);
    }

    /// For `Node::sync_journal`: publishes every queued message of peer `id`, past the write
    /// buffer's high-water mark, so that the journal holds everything accepted before the
    /// sync. (Stopping at the mark would leave messages of a backed-up connection queued,
    /// not journalled, after a sync that reported them durable.) The buffer then grows by
    /// at most the peer's send window.
    pub(super) fn flush_peer_for_sync(&mut self, id: usize) {
        self.publish_peer(id, usize::MAX);
    }

    /// [`flush_peer`](Self::flush_peer) with the high-water mark `high`.
    fn publish_peer(&mut self, id: usize, high: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let mut conn = p
            .conn
            .and_then(|t| self.conns.get_mut(&t))
            .filter(|c| c.established);
        let mut journal = match self.journal.as_mut() {
            None => None,
            Some(j) => match j.batch_for_publish() {
                Some(batch) => Some(batch),
                None => return, // the journal failed: nothing is published unjournalled
            },
        };
        if conn.is_none() && journal.is_none() {
            return;
        }
        let filter = self.cfg.outbound_filter.as_deref();
        let shared = &p.shared;
        let info = PeerInfo::new(&shared.name, p.desc.remote_launch(), p.state);
        let mut now: Option<Instant> = None;
        let mut tally = Tally::default();
        'outer: loop {
            if p.pending.is_empty() {
                // Clear before taking: a send that pushes after this reschedules the peer.
                shared.scheduled.store(false, Ordering::Release);
                shared.outbox.take_into(&mut p.pending);
            }
            if p.pending.is_empty() {
                break;
            }
            while let Some(m) = p.pending.pop_front() {
                let stop = match conn.as_deref() {
                    Some(c) => c.unwritten() >= high,
                    // A message with a ttl waits for a connection (or its expiry, by the
                    // tick) rather than be journalled, where it could no longer expire; the
                    // ones behind it wait too, in order. A sync journals it all the same.
                    None => m.deadline.is_some() && high != usize::MAX,
                };
                if stop {
                    p.pending.push_front(m);
                    // The socket is backed up: the writable event resumes this peer. Stay
                    // marked scheduled so that senders do not wake the IO thread for
                    // nothing on every message meanwhile.
                    shared.scheduled.store(true, Ordering::Release);
                    break 'outer;
                }
                let len = m.payload.len();
                if conn.is_none() && !m.is_reliable() {
                    shared.outbox.give_back(Return::Failed, m.cost());
                    tally.failed += 1;
                    tally.failed_bytes += len as u64;
                    tally.unconnected += 1;
                    continue;
                }
                if let Some(deadline) = m.deadline {
                    if *now.get_or_insert_with(Instant::now) >= deadline {
                        shared.outbox.give_back(Return::Expired, m.cost());
                        tally.expired += 1;
                        tally.failed += 1;
                        tally.failed_bytes += len as u64;
                        continue;
                    }
                }
                if len > p.peer_max_message {
                    shared.outbox.give_back(Return::Failed, m.cost());
                    tally.failed += 1;
                    tally.failed_bytes += len as u64;
                    tally.too_large += 1;
                    continue;
                }
                if let Some(f) = filter {
                    let keep =
                        catch_unwind(AssertUnwindSafe(|| f(&info, &m))).unwrap_or_else(|_| {
                            log::error!(
                                "outbound filter panicked; dropping the message to '{}'",
                                shared.name
                            );
                            false
                        });
                    if !keep {
                        shared.outbox.give_back(Return::Filtered, m.cost());
                        tally.filtered += 1;
                        tally.filtered_bytes += len as u64;
                        continue;
                    }
                }
                let c = m.cost();
                if m.is_reliable() {
                    let u = p.desc.publish(m.flags, m.payload);
                    if let Some(batch) = journal.as_deref_mut() {
                        batch.push(Record::Message {
                            peer: shared.name.clone(),
                            seq: u.seq,
                            flags: u.flags,
                            payload: u.payload.clone(),
                        });
                    }
                    if let Some(conn) = conn.as_deref_mut() {
                        wire::encode_data(&mut conn.wbuf, u.flags, Some(u.seq), &u.payload);
                        let seq = u.seq;
                        p.desc.note_written(seq);
                    }
                } else if let Some(conn) = conn.as_deref_mut() {
                    p.desc.publish_unreliable(c);
                    wire::encode_data(&mut conn.wbuf, m.flags, None, &m.payload);
                }
                p.ledger.publish(c);
                tally.sent += 1;
                tally.sent_bytes += len as u64;
            }
        }
        let c = &shared.counters;
        if tally.sent > 0 {
            Counters::add(&c.sent, tally.sent);
            Counters::add(&c.sent_bytes, tally.sent_bytes);
            if let Some(conn) = conn {
                self.dirty.push(conn.token);
            }
        }
        if tally.filtered > 0 {
            Counters::add(&c.filtered, tally.filtered);
            Counters::add(&c.filtered_bytes, tally.filtered_bytes);
        }
        if tally.failed > 0 {
            Counters::add(&c.failed, tally.failed);
            Counters::add(&c.failed_bytes, tally.failed_bytes);
            Counters::add(&c.expired, tally.expired);
        }
        if tally.unconnected > 0 {
            log::debug!(
                "{}: {} unreliable messages to '{}' failed: not connected",
                self.cfg.name,
                tally.unconnected,
                shared.name
            );
        }
        if tally.too_large > 0 {
            log::warn!(
                "{}: {} messages failed: larger than the {} bytes '{}' accepts",
                self.cfg.name,
                tally.too_large,
                p.peer_max_message,
                shared.name
            );
        }
    }

    /// Fails the expired messages queued for a peer that is not connected (for a connected
    /// peer, expiry is checked at publish time).
    pub(super) fn expire_queued(&mut self, id: usize, now: Instant) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        p.shared.outbox.take_into(&mut p.pending);
        let before = p.pending.len();
        let shared = &p.shared;
        let (mut n, mut bytes) = (0u64, 0u64);
        p.pending.retain(|m| match m.deadline {
            Some(d) if now >= d => {
                shared.outbox.give_back(Return::Expired, m.cost());
                n += 1;
                bytes += m.payload.len() as u64;
                false
            }
            _ => true,
        });
        debug_assert_eq!(before - p.pending.len(), n as usize);
        if n > 0 {
            Counters::add(&shared.counters.expired, n);
            Counters::add(&shared.counters.failed, n);
            Counters::add(&shared.counters.failed_bytes, bytes);
            log::debug!(
                "{}: {n} messages to '{}' expired while queued",
                self.cfg.name,
                shared.name
            );
        }
    }
}
