//! Bytes read on a link: frames split under the bound of the link's state, data admitted
//! to its sender's queues (with back-pressure: a link paused past its peer's window),
//! control frames (a handshake's go to [`Handshakes`]), and refusals and protocol errors
//! ([`Links::refuse`], [`Links::protocol_error`]).

use super::*;

impl Endpoint {
    /// Bytes were read into link `id`'s read buffer at `now`: splits the frames it holds
    /// and handles each one before splitting the next, so that every frame is bounded by
    /// the state its link is in when it is reached (a read that brought the last handshake
    /// frame and data frames together frames the data by the data limit). The turn's
    /// messages go to their sender's queues in one push at the end.
    pub(super) fn handle_input(&mut self, now: Instant, id: LinkId, cert: CertCheck<'_>) {
        if let Some(link) = self.links.table.get_mut(&id) {
            link.last_read = now;
            if let Some(p) = link.peer.filter(|_| link.established) {
                if let Some(p) = self.peers.get(&p) {
                    p.shared.counters.heard.note(now);
                }
            }
        }
        let mut peer_of_batch = None;
        // Bytes at the front of the read buffer holding the frames of the turn's run
        // (regular messages found and admitted, taken off together when the run is cut).
        let mut pending = 0usize;
        // Until the link is closed by a frame, paused, or no complete frame is left.
        while let Some(link) = self.links.table.get_mut(&id) {
            if link.paused {
                break;
            }
            let (established, peer) = (link.established, link.peer);
            let max = link.frame_limit(self.ctx.max_len);
            // The hot path: regular messages on an established link join the run, as many
            // as follow one another (one look-up of the link and the peer for them all).
            if let (Ok(Some(wire::Peek::Data { flags, total, .. })), Some(pid)) = (
                wire::peek_frame(&link.rbuf[pending..], max),
                peer.filter(|_| established),
            ) {
                if flags & (wire::FLAG_REQUEST | wire::FLAG_REPLY | wire::FLAG_OOB) == 0 {
                    peer_of_batch = Some(pid);
                    let Some(p) = self.peers.get_mut(&pid) else {
                        pending += total;
                        continue;
                    };
                    let before = pending;
                    match p.admit_run(&mut self.ctx.out, &link.rbuf, max, &mut pending) {
                        // The frame after the run is not one of its messages (another
                        // kind, a duplicate, a gap, past the window) or is incomplete: the
                        // next turn of the loop sees which.
                        Inflow::Continue if pending > before => continue,
                        // This frame is not the run's (a duplicate, a gap, past the
                        // peer's window): taken on its own below, which says why.
                        Inflow::Continue => {}
                        Inflow::Pause => {
                            if self.links.pause(id, pid, &self.peers, &self.ctx) {
                                break;
                            }
                            continue;
                        }
                    }
                }
            }
            // Anything else is split off on its own, after the run before it.
            if pending > 0 {
                self.links.cut_run(
                    id,
                    peer_of_batch,
                    std::mem::take(&mut pending),
                    &self.peers,
                    &mut self.ctx,
                );
            }
            let Some(link) = self.links.table.get_mut(&id) else {
                break;
            };
            match wire::split_frame(&mut link.rbuf, max) {
                Ok(None) => {
                    link.make_room_for_frame(max, &self.ctx.out.read_buffers);
                    break;
                }
                Ok(Some(wire::Split::Data {
                    flags,
                    seq,
                    payload,
                })) => {
                    let Some(pid) = peer.filter(|_| established) else {
                        self.links.protocol_error(
                            now,
                            id,
                            "data before the handshake completed".into(),
                            &mut self.peers,
                            &mut self.ctx,
                        );
                        break;
                    };
                    peer_of_batch = Some(pid);
                    let Some(p) = self.peers.get_mut(&pid) else {
                        continue;
                    };
                    match p.on_data(&mut self.ctx.out, flags, seq, payload) {
                        Ok(Inflow::Continue) => {}
                        Ok(Inflow::Pause) => {
                            if self.links.pause(id, pid, &self.peers, &self.ctx) {
                                break;
                            }
                        }
                        Err(e) => {
                            self.links
                                .bad_data(now, id, pid, &e, &mut self.peers, &mut self.ctx);
                            break;
                        }
                    }
                }
                Ok(Some(wire::Split::Control(bytes))) => self.on_frame(now, id, &bytes, cert),
                Err(e) => {
                    if let Some(pid) = peer_of_batch {
                        self.ctx.out.push_batch(self.peers.get(&pid));
                    }
                    self.links.protocol_error(
                        now,
                        id,
                        e.to_string(),
                        &mut self.peers,
                        &mut self.ctx,
                    );
                    break;
                }
            }
        }
        if pending > 0 {
            self.links
                .cut_run(id, peer_of_batch, pending, &self.peers, &mut self.ctx);
        }
        if let Some(pid) = peer_of_batch {
            self.ctx.out.push_batch(self.peers.get(&pid));
            self.links
                .after_data(now, pid, &mut self.peers, &mut self.ctx);
        }
    }

    /// Resumes reading peer `id`'s link if it was paused and the peer is back within its
    /// receive window. Time spent paused is ours, not the peer's: the idle timeout counts
    /// from the resumption.
    pub(super) fn resume_peer(&mut self, now: Instant, id: usize) {
        let Some(p) = self.peers.get(&id) else {
            return;
        };
        let Some(lid) = p.link else {
            return;
        };
        if !self.links.table.get(&lid).is_some_and(|l| l.paused) || !p.shared.credit.resume() {
            return;
        }
        self.links.paused.retain(|&l| l != lid);
        let Some(link) = self.links.table.get_mut(&lid) else {
            return;
        };
        link.paused = false;
        link.last_read = now;
        // What is in the buffer first, then what the connection holds: the driver reads
        // it (readiness is edge-triggered, so no event would come for bytes already there).
        self.handle_input(now, lid, &|_| Ok(()));
        self.ctx.out.events.push_back(Output::Resume(lid));
    }

    /// A control frame (any frame but data) on link `id`.
    pub(super) fn on_frame(&mut self, now: Instant, id: LinkId, bytes: &[u8], cert: CertCheck<'_>) {
        let frame = match wire::decode(bytes, self.ctx.max_len) {
            Ok(Some((f, _))) => f,
            Ok(None) => {
                return self.links.protocol_error(
                    now,
                    id,
                    "truncated frame".into(),
                    &mut self.peers,
                    &mut self.ctx,
                )
            }
            Err(e) => {
                return self.links.protocol_error(
                    now,
                    id,
                    e.to_string(),
                    &mut self.peers,
                    &mut self.ctx,
                )
            }
        };
        let Some(link) = self.links.table.get(&id) else {
            return;
        };
        if link.hs.is_some() {
            return self.handshakes().on_frame(now, id, &frame, cert);
        }
        let Some(pid) = link.peer else { return };
        match frame {
            Frame::Ack { received, credit } => {
                let Some(p) = self.peers.get_mut(&pid) else {
                    return;
                };
                p.rtt.answer(id, now, &p.shared.counters.rtt);
                if let Err(e) = p.on_ack(&self.ctx.cfg, &mut self.ctx.out, received, credit, now) {
                    self.links.protocol_error(
                        now,
                        id,
                        e.to_string(),
                        &mut self.peers,
                        &mut self.ctx,
                    );
                }
            }
            Frame::Probe => {
                let Some(p) = self.peers.get_mut(&pid) else {
                    return;
                };
                let Some(link) = self.links.table.get_mut(&id) else {
                    return;
                };
                // Answered with every byte of credit we hold, even below half a window (an
                // ack takes all that is pending), and no flush request (one left set when
                // nothing was pending would swallow the pool's next request). The ack is
                // written even when nothing is owed: the prober may be measuring the round
                // trip (see `RoundTrip::send`).
                if p.ack(&mut self.ctx.out, Some(link), true) {
                    self.links.dirty.push_back(id);
                }
            }
            Frame::Heartbeat => {}
            Frame::Close { code, reason } => {
                log::info!(
                    "{}: '{}' closed the connection ({code:?}): {reason}",
                    self.ctx.cfg.name,
                    self.peers.name(pid)
                );
                self.links.close(
                    now,
                    id,
                    None,
                    Why::PeerClosed,
                    &mut self.peers,
                    &mut self.ctx,
                );
            }
            Frame::Data { .. } => unreachable!("data frames are split off by split_frame"),
            Frame::Hello(_) | Frame::HelloReply(..) | Frame::Ready { .. } => {
                self.links.protocol_error(
                    now,
                    id,
                    "handshake frame after the handshake".into(),
                    &mut self.peers,
                    &mut self.ctx,
                )
            }
        }
    }
}

impl Links {
    /// Peer `pid`'s data on link `id` broke its stream (`e`: a window exceeded, a sequence
    /// out of order): the messages taken from the read before it go to the peer's queues,
    /// then the link is closed for a protocol error.
    fn bad_data(
        &mut self,
        now: Instant,
        id: LinkId,
        pid: usize,
        e: &RecoveryError,
        peers: &mut Roster,
        ctx: &mut Ctx,
    ) {
        if matches!(e, RecoveryError::WindowExceeded { .. }) {
            Counters::add(&ctx.counters.window_violations, 1);
        }
        ctx.out.push_batch(peers.get(&pid));
        self.protocol_error(now, id, e.to_string(), peers, ctx);
    }

    /// Link `id` broke the protocol (`reason`): counted, logged, closed with a Close frame
    /// saying why.
    pub(super) fn protocol_error(
        &mut self,
        now: Instant,
        id: LinkId,
        reason: String,
        peers: &mut Roster,
        ctx: &mut Ctx,
    ) {
        Counters::add(&ctx.counters.protocol_errors, 1);
        let who = self
            .table
            .get(&id)
            .and_then(|l| l.peer)
            .map(|p| peers.name(p))
            .unwrap_or_else(|| "an unidentified peer".into());
        log::warn!(
            "{}: protocol error from {who}, closing connection: {reason}",
            ctx.cfg.name
        );
        let close = Some((CloseCode::Protocol, reason.as_str()));
        self.close(now, id, close, Why::ProtocolError, peers, ctx);
    }

    /// Refuses the handshake on link `id` with `code` (`reason` in the Close frame):
    /// counted, told to the application if it refuses who the other side is, closed.
    pub(super) fn refuse(
        &mut self,
        now: Instant,
        id: LinkId,
        (code, reason): (CloseCode, &str),
        peers: &mut Roster,
        ctx: &mut Ctx,
    ) {
        log::warn!("{}: refusing connection ({code:?}): {reason}", ctx.cfg.name);
        ctx.counters.refusal(code);
        self.refused(id, code, false, peers, ctx);
        self.close(
            now,
            id,
            Some((code, reason)),
            Why::ProtocolError,
            peers,
            ctx,
        );
    }
}
