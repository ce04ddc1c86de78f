//! What the application's threads ask of the endpoint: members added, removed and
//! disconnected, messages published, credit returned, a journal sync, the shutdown.

use super::*;

impl Roster {
    /// Starts managing a peer (restoring its journalled stream, dialling it if it has an
    /// address).
    ///
    /// A member of the same name may have dialled in and been admitted between the node's
    /// check of its peer map and this command (the admission's map entry then replaced the
    /// node's): the admitted peer, which holds the connection and its stream, becomes the
    /// configured one — it gains the address and is no longer forgotten — and the state the
    /// command brought is discarded (what was sent to it meanwhile fails and is reported).
    pub(super) fn add(&mut self, shared: Arc<PeerShared>, addr: Option<Addr>, ctx: &mut Ctx) {
        if let Some(held) = self.id_of(&shared.name) {
            let name = shared.name.clone();
            if let Some(p) = self.get_mut(&held) {
                if p.dynamic {
                    p.dynamic = false;
                    p.addr = p.addr.take().or_else(|| addr.clone());
                    p.gen += 1; // cancels its forget timer
                                // The map holds it already; said again, so that it is the one kept.
                    ctx.out.events.push_back(Output::Admitted(p.shared.clone()));
                    log::info!(
                        "{}: '{name}' was added while it was being admitted (it dialled in); the admitted member is kept, now with the address given",
                        ctx.cfg.name
                    );
                } else {
                    log::error!(
                        "{}: '{name}' added twice; the second is dropped",
                        ctx.cfg.name
                    );
                }
            }
            let failed = Remote::new(shared, addr).discard(&ctx.cfg, &mut ctx.out);
            if failed > 0 {
                log::warn!(
                    "{}: {failed} messages sent to '{name}' as it was added failed: it was admitted meanwhile",
                    ctx.cfg.name
                );
            }
            if self.get(&held).is_some_and(|p| p.link.is_none()) && ctx.shutdown.is_none() {
                self.dial(held, ctx);
            }
            return;
        }
        let id = shared.id;
        let mut peer = Remote::new(shared, addr);
        if let Some(r) = ctx
            .journal
            .as_mut()
            .and_then(|j| j.recovered.remove(&**peer.name()))
        {
            peer.restore(&ctx.cfg, &mut ctx.out, r);
        }
        self.insert(id, peer);
        if ctx.shutdown.is_none() {
            self.dial(id, ctx);
        }
    }

    /// Retires peer `id` for good (`remove_peer`, or the membership declared it failed or
    /// gone): what is queued fails (giving back its permits), its window closes, its link
    /// closes with `reason`, and the application is told it disconnected if it was
    /// connected. A reconnect timer still pending finds no peer and does nothing; a link
    /// completing later finds no peer and is refused. Returns its shared state.
    pub(super) fn remove_member(
        &mut self,
        now: Instant,
        id: usize,
        reason: &str,
        links: &mut Links,
        ctx: &mut Ctx,
    ) -> Option<Arc<PeerShared>> {
        let p = self.get(&id)?;
        let (link, name, up, shared) = (p.link, p.name().clone(), p.up, p.shared.clone());
        self.retire(id, true, ctx);
        if let Some(link) = link {
            let close = Some((CloseCode::Removed, reason));
            links.close(now, link, close, Why::Removed, self, ctx);
        }
        if up {
            emit(&ctx.cfg, &mut ctx.out, || Event::Disconnected {
                peer: name.to_string(),
                reason: Why::Removed,
            });
        }
        Some(shared)
    }

    /// `remove_peer`: retires peer `id` for good ([`remove_member`](Roster::remove_member))
    /// and tells the application it was removed.
    pub(super) fn remove_peer(
        &mut self,
        now: Instant,
        id: usize,
        links: &mut Links,
        ctx: &mut Ctx,
    ) {
        if let Some(shared) = self.remove_member(now, id, "member removed", links, ctx) {
            emit(&ctx.cfg, &mut ctx.out, || Event::Removed {
                peer: shared.name.to_string(),
            });
        }
    }

    /// Drops the peer's link; recovery brings it back.
    pub(super) fn disconnect(&mut self, now: Instant, id: usize, links: &mut Links, ctx: &mut Ctx) {
        if let Some(link) = self.get(&id).and_then(|p| p.link) {
            log::info!(
                "{}: disconnecting '{}' on request",
                ctx.cfg.name,
                self.name(id)
            );
            links.close(
                now,
                link,
                Some((CloseCode::Other, "disconnect requested")),
                Why::Requested,
                self,
                ctx,
            );
        }
    }
}

impl Endpoint {
    /// Returns peer `id`'s receive credit now (the pool asked: half the window consumed,
    /// or a paused link back within its window).
    pub(super) fn flush_credit(&mut self, now: Instant, id: usize) {
        self.links.ack(id, &mut self.peers, &mut self.ctx);
        self.resume_peer(now, id);
    }

    /// Begins shutting down: no new messages, no reconnects; what is queued is still
    /// flushed (or, with a journal, journalled) until `deadline`.
    pub(super) fn begin_shutdown(&mut self, now: Instant, deadline: Instant) {
        if self.ctx.shutdown.is_some() {
            return;
        }
        self.ctx.shutdown = Some(deadline);
        self.ctx.timers.add(deadline, TimerKind::Deadline);
        if let Some(m) = self.members.as_mut() {
            m.leave(now);
        }
        let ids = self.peers.ids();
        for id in ids {
            let Some(p) = self.peers.get_mut(&id) else {
                continue;
            };
            p.gen += 1; // no more reconnects
                        // No new messages; what is queued is still flushed.
            p.shared.outbox.close_keep();
            p.shared.outbox.window().close();
            let connected = p
                .link
                .is_some_and(|l| self.links.table.get(&l).is_some_and(|l| l.established));
            // With a journal, what is queued for a disconnected peer is journalled now and
            // resent after the restart.
            if connected || self.ctx.journal.is_some() {
                self.links.publish(now, id, &mut self.peers, &mut self.ctx);
            }
        }
    }

    /// Journals everything queued (to any peer, connected or not, past the write buffers'
    /// high-water marks) and cuts it into a batch. Returns the batch whose sync makes it all
    /// durable (the driver asks the writer for that sync), or `None` after a journal failure
    /// (nothing may be reported durable then).
    pub(super) fn sync_journal_now(&mut self, now: Instant) -> Option<u64> {
        let ids = self.peers.ids();
        for id in ids {
            self.links
                .publish_upto(now, id, usize::MAX, &mut self.peers, &mut self.ctx);
        }
        if let Some(j) = self.ctx.journal.as_mut() {
            j.cut(&mut self.links, &mut self.ctx.out);
        }
        self.ctx
            .journal
            .as_ref()
            .filter(|j| !j.marks.failed)
            .map(|j| j.cut)
    }

    /// The final step of a shutdown: every peer retired, every link closed, the last records
    /// cut into a batch. Returns, with a journal, what the node needs to record the pool's
    /// last progress once the writer has given the journal back.
    pub(crate) fn finish(&mut self, now: Instant) -> Option<Vec<StoppedPeer>> {
        let links: Vec<LinkId> = self.links.table.keys().copied().collect();
        let ids = self.peers.ids();
        for id in ids {
            self.peers.retire(id, false, &mut self.ctx);
        }
        for l in links {
            self.links.close(
                now,
                l,
                Some((CloseCode::Shutdown, "node shutting down")),
                Why::Shutdown,
                &mut self.peers,
                &mut self.ctx,
            );
        }
        self.seeds.settle(now, &mut self.links, &mut self.ctx);
        if let Some(j) = self.ctx.journal.as_mut() {
            j.cut(&mut self.links, &mut self.ctx.out);
        }
        let j = self.ctx.journal.as_ref()?;
        if j.marks.failed {
            return None;
        }
        Some(
            self.peers
                .values()
                .filter_map(|p| {
                    let progress = p.shared.progress.clone()?;
                    let (recorded, unreliable) = p.journal.recorded();
                    Some(StoppedPeer {
                        name: p.name().to_string(),
                        progress,
                        credit: p.shared.credit.clone(),
                        recorded: (recorded.0, recorded.1, unreliable),
                        received: p.desc.received(),
                    })
                })
                .collect(),
        )
    }

    /// Warns about journalled peers that are not configured (their messages stay in the
    /// journal until the member is added).
    pub(crate) fn warn_unclaimed(&self) {
        if let Some(j) = &self.ctx.journal {
            for (name, r) in &j.recovered {
                if !r.unacked.is_empty() {
                    log::warn!(
                        "{}: the journal holds {} unacknowledged messages to '{name}', which is not configured; they wait until it is added",
                        self.ctx.cfg.name,
                        r.unacked.len()
                    );
                }
            }
        }
    }
}
