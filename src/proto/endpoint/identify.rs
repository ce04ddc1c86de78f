//! The handshake's decisions ([`Handshakes`], over the link table, the peers and the
//! [`Ctx`] only): a handshake frame taken, who a link speaks for, a name held by another
//! live process, the tie-break between two links for one peer, incarnations, and the link
//! established (resend what the peer lacks, then new messages). A seed's handshake is in
//! `seeds.rs`, a link's handshake starting in `links.rs`.

use super::*;

/// The handshake's decisions on a link, over the parts they touch: the link table, the
/// peers and the services, nothing else (what they learn of a seed waits in
/// [`SeedsOwed`]). Made for the step that needs it (`Handshakes { links, peers, ctx }`).
pub(super) struct Handshakes<'a> {
    pub(super) links: &'a mut Links,
    pub(super) peers: &'a mut Roster,
    pub(super) ctx: &'a mut Ctx,
}

impl Endpoint {
    /// The handshake's decisions, over the parts they touch.
    pub(super) fn handshakes(&mut self) -> Handshakes<'_> {
        Handshakes {
            links: &mut self.links,
            peers: &mut self.peers,
            ctx: &mut self.ctx,
        }
    }
}

impl Handshakes<'_> {
    /// Closes link `id` ([`Links::close`]).
    pub(super) fn close(
        &mut self,
        now: Instant,
        id: LinkId,
        close: Option<(CloseCode, &str)>,
        why: Why,
    ) {
        self.links.close(now, id, close, why, self.peers, self.ctx);
    }

    /// Refuses the handshake on link `id` ([`Links::refuse`]).
    pub(super) fn refuse(&mut self, now: Instant, id: LinkId, refusal: (CloseCode, &str)) {
        self.links.refuse(now, id, refusal, self.peers, self.ctx);
    }

    /// Closes link `id` for a protocol error ([`Links::protocol_error`]).
    pub(super) fn protocol_error(&mut self, now: Instant, id: LinkId, reason: String) {
        self.links
            .protocol_error(now, id, reason, self.peers, self.ctx);
    }

    /// A handshake frame on link `id`, whose handshake is under way: who the other side
    /// is, its Ready, or its refusal (or a frame the handshake cannot take).
    pub(super) fn on_frame(
        &mut self,
        now: Instant,
        id: LinkId,
        frame: &Frame,
        cert: CertCheck<'_>,
    ) {
        let Some(link) = self.links.table.get_mut(&id) else {
            return;
        };
        let Some(hs) = link.hs.as_mut() else { return };
        match hs.on_frame(frame) {
            Ok(HsEvent::Identified {
                peer,
                peer_received,
                peer_connections,
                peer_unreliable,
            }) => {
                let resume = peer_received.map(|r| (r, peer_unreliable.unwrap_or(0)));
                self.on_identified(now, id, peer, resume, peer_connections, cert)
            }
            Ok(HsEvent::Established {
                peer_received,
                peer_unreliable,
            }) => self.on_established(now, id, peer_received, peer_unreliable),
            Err(e) => {
                if e.by_peer && e.code == CloseCode::Superseded {
                    // The peer kept the other of two simultaneous connections.
                    log::debug!("{}: {e}", self.ctx.cfg.name);
                    self.close(now, id, None, Why::Replaced);
                } else if e.by_peer && e.code == CloseCode::NameInUse {
                    // A process of our name (another launch) is connected there, or
                    // replaced us: this one retries with backoff, and gets in once the
                    // other is gone.
                    let addr = link.remote.clone();
                    let ours = self.ctx.cfg.launch_id;
                    // Once per episode at `error` (until the peer takes a connection).
                    let first = link
                        .dialled
                        .or(link.peer)
                        .and_then(|p| self.peers.get_mut(&p))
                        .is_none_or(|p| p.last_conflict.replace(ours) != Some(ours));
                    let line = format!(
                        "{}: {} refuses us: another process with our member name is connected there, or replaced us (launch id here {ours:016x}); check that only one process runs as '{}'. Retrying with backoff",
                        self.ctx.cfg.name,
                        addr.map_or_else(|| "the peer".to_string(), |a| a.to_string()),
                        self.ctx.cfg.name
                    );
                    if first {
                        log::error!("{line}");
                    } else {
                        log::debug!("{line}");
                    }
                    self.ctx.counters.refusal(e.code);
                    self.links.refused(id, e.code, true, self.peers, self.ctx);
                    self.close(now, id, None, Why::PeerClosed);
                } else if e.by_peer {
                    log::warn!("{}: {e}", self.ctx.cfg.name);
                    self.ctx.counters.refusal(e.code);
                    self.links.refused(id, e.code, true, self.peers, self.ctx);
                    self.close(now, id, None, Why::PeerClosed);
                } else if e.code == CloseCode::NameMismatch && link.seed.is_some() {
                    // Only our own name is refused to a seed's dial: it is our address.
                    self.seed_is_own(now, id);
                } else if e.code == CloseCode::Protocol {
                    // A frame the handshake cannot take (malformed, or not the one its
                    // step expects): a protocol error, not a refusal of who the peer is.
                    self.protocol_error(now, id, e.reason);
                } else {
                    self.refuse(now, id, (e.code, &e.reason));
                }
            }
        }
    }

    /// A link said who it is. An accepted one (`resume`: the dialler's received counts,
    /// reliable messages and unreliable window bytes) is authenticated by now when a secret
    /// is configured: it is adopted and answered with Ready, and established. A dialled one
    /// has only read the acceptor's Hello, which proves nothing yet: it is answered, and
    /// adopted only once Ready authenticates the acceptor.
    pub(super) fn on_identified(
        &mut self,
        now: Instant,
        id: LinkId,
        peer: PeerIdentity,
        resume: Option<(u64, u64)>,
        peer_connections: Option<u64>,
        cert: CertCheck<'_>,
    ) {
        let Some((peer_received, peer_unreliable)) = resume else {
            return self.answer_hello(now, id, &peer);
        };
        // TLS: the client certificate must name the member the handshake claims.
        if let Err(why) = cert(&peer.name) {
            Counters::add(&self.ctx.counters.tls_failures, 1);
            log::warn!(
                "{}: refusing a connection claiming to be '{}': {why}",
                self.ctx.cfg.name,
                peer.name
            );
            let addr = self.links.table.get(&id).and_then(|l| l.remote.clone());
            emit(&self.ctx.cfg, &mut self.ctx.out, || Event::Refused {
                peer: Some(peer.name.clone()),
                addr,
                reason: RefuseReason::NameMismatch,
                by_peer: false,
            });
            return self.close(
                now,
                id,
                Some((
                    CloseCode::NameMismatch,
                    "TLS certificate not valid for the member name claimed",
                )),
                Why::Tls,
            );
        }
        let pid = match self.peers.id_of(&peer.name) {
            Some(pid) => pid,
            None if self.ctx.cfg.allow_unknown && self.ctx.shutdown.is_none() => {
                self.peers.admit_unknown(&peer.name, self.ctx)
            }
            None => {
                let reason = format!("member '{}' is not configured here", peer.name);
                return self.refuse(now, id, (CloseCode::UnknownMember, &reason));
            }
        };
        let Some((received, connections, unreliable)) =
            self.adopt(now, id, pid, &peer, true, peer_connections)
        else {
            return;
        };
        let Some(link) = self.links.table.get_mut(&id) else {
            return;
        };
        let Some(hs) = link.hs.as_mut() else { return };
        hs.accept(received, connections, unreliable, link.out.tail());
        self.links.dirty.push_back(id);
        self.establish(now, id, peer_received, peer_unreliable);
    }

    /// Dialler: the acceptor's Hello arrived. With a secret it is not authenticated yet
    /// (anyone answering at the peer's address can send it), so nothing changes here: no
    /// tie-break, no new incarnation, the link does not yet speak for the peer. We answer
    /// with our counts for the incarnation it names and adopt the link on Ready.
    pub(super) fn answer_hello(&mut self, now: Instant, id: LinkId, peer: &PeerIdentity) {
        let Some(pid) = self.links.table.get(&id).and_then(|l| l.dialled) else {
            return self.seed_hello(now, id, peer);
        };
        let Some(p) = self.peers.get(&pid) else {
            return self.refuse(now, id, (CloseCode::Removed, "member removed"));
        };
        if self.ctx.closed_to(p) {
            return self.refuse(now, id, (CloseCode::Shutdown, "member closed"));
        }
        // Another process holds the name: no counts for this one (zeros would tell it that
        // we lost our state for it).
        if let Some(holder) = self.links.name_holder(pid, id, peer.launch_id, self.peers) {
            return self.refuse_name_in_use(now, id, pid, peer, holder);
        }
        let Some(p) = self.peers.get(&pid) else {
            return;
        };
        let (received, connections, unreliable) = p.counts_for(peer.launch_id);
        let Some(link) = self.links.table.get_mut(&id) else {
            return;
        };
        let Some(hs) = link.hs.as_mut() else { return };
        hs.accept(received, connections, unreliable, link.out.tail());
        link.asked_at = now;
        self.links.dirty.push_back(id);
    }

    /// Dialler: Ready arrived (and authenticated the acceptor, with a secret). Adopt the
    /// link for the peer, then establish it.
    pub(super) fn on_established(
        &mut self,
        now: Instant,
        id: LinkId,
        peer_received: u64,
        peer_unreliable: u64,
    ) {
        let Some(link) = self.links.table.get(&id) else {
            return;
        };
        let (Some(pid), Some(peer)) = (
            link.dialled,
            link.hs.as_ref().and_then(|h| h.peer()).cloned(),
        ) else {
            return self.seed_ready(now, id, peer_received, peer_unreliable);
        };
        if self.adopt(now, id, pid, &peer, false, None).is_some() {
            self.establish(now, id, peer_received, peer_unreliable);
        }
    }

    /// Refuses link `id`, whose handshake claims peer `pid`'s name as incarnation `peer`,
    /// because `holder` has the name: `Close{NameInUse}`, a `Refused` fact, the counter,
    /// and an error naming both processes (once per claimant; repeats at `debug`). The
    /// holder's link is sent a heartbeat at once: if its process is in fact gone (a
    /// half-open connection), the write brings the reset that closes it, and the
    /// claimant's next attempt gets in.
    pub(super) fn refuse_name_in_use(
        &mut self,
        now: Instant,
        id: LinkId,
        pid: usize,
        peer: &PeerIdentity,
        holder: NameHolder,
    ) {
        let addr = self.links.table.get(&id).and_then(|l| l.remote.clone());
        let show = |a: Option<Addr>| a.map_or_else(|| "?".to_string(), |a| a.to_string());
        let first = match self.peers.get_mut(&pid) {
            Some(p) => p.last_conflict.replace(peer.launch_id) != Some(peer.launch_id),
            None => true,
        };
        let (why, then) = if holder.link.is_some() {
            (
                "it is connected from there",
                "and gets in once the other is gone",
            )
        } else {
            (
                "it replaced that process here",
                "and is refused for good: restart or stop it",
            )
        };
        let line = format!(
            "{}: refusing '{}' from {} (launch id {:016x}): another process holds the name at {} (launch id {:016x}; {why}). Two processes run with one member name, or an old one is still running; the refused one retries ({})",
            self.ctx.cfg.name,
            peer.name,
            show(addr),
            peer.launch_id,
            show(holder.addr),
            holder.launch,
            then,
        );
        if first {
            log::error!("{line}");
        } else {
            log::debug!("{line}");
        }
        if let Some(link) = holder.link.and_then(|o| self.links.table.get_mut(&o)) {
            wire::encode_heartbeat(link.out.tail());
            self.links.dirty.push_back(link.id);
        }
        self.ctx.counters.refusal(CloseCode::NameInUse);
        self.links
            .refused(id, CloseCode::NameInUse, false, self.peers, self.ctx);
        self.close(
            now,
            id,
            Some((
                CloseCode::NameInUse,
                "another process holds this member name",
            )),
            Why::ProtocolError,
        );
    }

    /// Makes link `id` the one that speaks for peer `pid`, identified (and, with a secret,
    /// authenticated) as `peer`: refuses it if the peer is gone or closing, applies the
    /// tie-break against another link for the peer, binds the incarnation. Returns our
    /// counts for the handshake (received, connections, unreliable bytes), or `None` if the
    /// link was refused or closed.
    pub(super) fn adopt(
        &mut self,
        now: Instant,
        id: LinkId,
        pid: usize,
        peer: &PeerIdentity,
        accepting: bool,
        peer_connections: Option<u64>,
    ) -> Option<(u64, u64, u64)> {
        let Some(p) = self.peers.get(&pid) else {
            self.refuse(now, id, (CloseCode::Removed, "member removed"));
            return None;
        };
        if self.ctx.closed_to(p) {
            self.refuse(now, id, (CloseCode::Shutdown, "member closed"));
            return None;
        }
        if let Some(holder) = self.links.name_holder(pid, id, peer.launch_id, self.peers) {
            self.refuse_name_in_use(now, id, pid, peer, holder);
            return None;
        }
        let p = self.peers.get(&pid)?;
        // Tie-break against the link that speaks for this peer now, if another.
        if let Some(other) = p.link.filter(|&o| o != id) {
            if let Some(ol) = self.links.table.get(&other) {
                let stale = matches!(ol.launch, Some(l) if l != peer.launch_id);
                let resolution = resolve(TieBreak {
                    stale,
                    new_by_us: !accepting,
                    old_by_us: ol.dialled.is_some(),
                    old_established: ol.established,
                    we_are_smaller: *self.ctx.cfg.name < *peer.name,
                    our_connections: p.desc.connections_with(peer.launch_id),
                    peer_connections,
                });
                Counters::add(&self.ctx.counters.tie_breaks, 1);
                if resolution == Resolution::NameInUse {
                    // (`name_holder` finds such a link first.)
                    let holder = NameHolder {
                        launch: ol.launch.unwrap_or_default(),
                        addr: ol.remote.clone(),
                        link: Some(other),
                    };
                    self.refuse_name_in_use(now, id, pid, peer, holder);
                    return None;
                }
                if resolution == Resolution::ReplaceOld {
                    log::debug!(
                        "{}: '{}' connected again; replacing the older connection",
                        self.ctx.cfg.name,
                        peer.name
                    );
                    self.close(
                        now,
                        other,
                        Some((CloseCode::Superseded, "replaced by a newer connection")),
                        Why::Replaced,
                    );
                } else {
                    log::debug!(
                        "{}: simultaneous connect with '{}'; keeping ours",
                        self.ctx.cfg.name,
                        peer.name
                    );
                    self.close(
                        now,
                        id,
                        Some((
                            CloseCode::Superseded,
                            "simultaneous connect lost the tie-break",
                        )),
                        Why::Replaced,
                    );
                    return None;
                }
            }
        }
        let p = self.peers.get_mut(&pid)?;
        p.bind(&self.ctx.cfg, &mut self.ctx.out, peer);
        let counts = p.counts_for(peer.launch_id);
        p.link = Some(id);
        if p.state != PeerState::Handshaking {
            p.set_state(PeerState::Handshaking);
        }
        let link = self.links.table.get_mut(&id)?;
        link.peer = Some(pid);
        link.launch = Some(peer.launch_id);
        Some(counts)
    }

    /// The handshake completed on link `id`: resend what the peer lacks, then new messages.
    pub(super) fn establish(
        &mut self,
        now: Instant,
        id: LinkId,
        peer_received: u64,
        peer_unreliable: u64,
    ) {
        let Some(link) = self.links.table.get_mut(&id) else {
            return;
        };
        let Some(pid) = link.peer else { return };
        let Some(p) = self.peers.get_mut(&pid) else {
            return;
        };
        self.links.gate.pending.remove(id);
        match p.establish(
            &self.ctx.cfg,
            &mut self.ctx.out,
            link,
            peer_received,
            peer_unreliable,
            now,
        ) {
            Ok(()) => {
                let launch = link.launch.unwrap_or_default();
                if p.up {
                    // Never two `Connected` in a row: a link established while another was
                    // announced replaced it (the old one is closed by now).
                    let peer = p.name().clone();
                    emit(&self.ctx.cfg, &mut self.ctx.out, || Event::Disconnected {
                        peer: peer.to_string(),
                        reason: Why::Replaced,
                    });
                }
                p.up = true;
                let peer = p.name().clone();
                emit(&self.ctx.cfg, &mut self.ctx.out, || Event::Connected {
                    peer: peer.to_string(),
                    incarnation: launch,
                });
                Counters::add(&self.ctx.counters.handshakes, 1);
                self.links.update_gauges(&self.ctx.counters);
                self.links.dirty.push_back(id);
                self.links.deferred.push(pid);
            }
            Err(Unestablished::Superseded) => {
                self.close(
                    now,
                    id,
                    Some((CloseCode::Superseded, "superseded")),
                    Why::Replaced,
                );
            }
            Err(Unestablished::Outdated(why)) => {
                log::info!("{}: {why}", self.ctx.cfg.name);
                self.close(
                    now,
                    id,
                    Some((CloseCode::Superseded, "superseded")),
                    Why::Replaced,
                );
            }
            Err(Unestablished::Forgotten(why)) => {
                log::warn!("{}: {why}", self.ctx.cfg.name);
                self.close(
                    now,
                    id,
                    Some((CloseCode::Other, "state reset")),
                    Why::ProtocolError,
                );
            }
            Err(Unestablished::Violation(e)) => self.protocol_error(now, id, e),
        }
    }
}
