//! The link table: every link by id, with the links that have bytes to write and those
//! whose reading is paused, the admission of accepted ones ([`Gate`]), and the peers
//! published once a handshake's last frame is out; what touches only the links, the peers
//! and the services ([`Ctx`]) together: publishing and acks written, data's acks and
//! pauses, a run cut off a read buffer, a refusal told, the link gauges. Closing a link and
//! the reasons for it are in `links.rs`, `input.rs` and `time.rs`.

use super::*;

/// Every link, with the write and pause lists that follow them and the admission of those
/// accepted (the pending table of those still in their handshake).
pub(super) struct Links {
    pub(super) table: HashMap<LinkId, Link, IdHash>,
    /// Links with bytes appended to their write buffer since the last write pass.
    pub(super) dirty: VecDeque<LinkId>,
    /// Links whose reading is paused.
    pub(super) paused: Vec<LinkId>,
    /// Admission of accepted links.
    pub(super) gate: Gate,
    /// What links closed owe the seeds, until the step is done.
    pub(super) seeds_owed: SeedsOwed,
    /// Peers whose queued messages are published once the frames written so far have left
    /// (a handshake's last frame goes first: see [`Endpoint::poll`], step 4).
    pub(super) deferred: Vec<usize>,
}

impl Links {
    pub(super) fn new(cfg: &Config) -> Links {
        Links {
            table: HashMap::default(),
            dirty: VecDeque::new(),
            paused: Vec::new(),
            gate: Gate::new(cfg),
            seeds_owed: SeedsOwed::default(),
            deferred: Vec::new(),
        }
    }

    /// Takes the first `upto` bytes off link `id`'s read buffer, where the turn's run (of
    /// peer `pid`) lies, and cuts the run (see `Remote::cut_run`).
    pub(super) fn cut_run(
        &mut self,
        id: LinkId,
        pid: Option<usize>,
        upto: usize,
        peers: &Roster,
        ctx: &mut Ctx,
    ) {
        let Some(link) = self.table.get_mut(&id) else {
            ctx.out.run.clear();
            return;
        };
        let buf = link.rbuf.split_to(upto).freeze();
        match pid.and_then(|p| peers.get(&p)) {
            Some(p) => ctx.out.cut_run(&p.shared, buf),
            None => ctx.out.run.clear(),
        }
    }

    /// After data from peer `id`: an ack now if enough is owed, else a delayed ack armed.
    pub(super) fn after_data(
        &mut self,
        now: Instant,
        id: usize,
        peers: &mut Roster,
        ctx: &mut Ctx,
    ) {
        let Some(p) = peers.get_mut(&id) else {
            return;
        };
        let Some(link) = p.link.and_then(|l| self.table.get_mut(&l)) else {
            return;
        };
        let (link_id, before) = (link.id, link.unwritten());
        let arm = p.after_data(&ctx.cfg, &mut ctx.out, link);
        if link.unwritten() > before {
            self.dirty.push_back(link_id);
        }
        if arm {
            p.acks.timer = true;
            ctx.timers
                .add(now + ctx.cfg.ack_delay, TimerKind::AckDelay { peer: id });
        }
    }

    /// Stops reading link `id` of peer `pid`, which holds more than its receive window:
    /// its bytes stay where they are (for a connection, in the kernel: TCP pushes back on
    /// the peer) until the handler brings it back within the window. Returns `false` if it
    /// is already back within.
    pub(super) fn pause(&mut self, id: LinkId, pid: usize, peers: &Roster, ctx: &Ctx) -> bool {
        let Some(p) = peers.get(&pid) else {
            return false;
        };
        if !p.shared.credit.pause() {
            return false;
        }
        let (held, window) = (p.shared.credit.held(), p.shared.credit.window());
        let Some(link) = self.table.get_mut(&id) else {
            return false;
        };
        if !link.paused {
            link.paused = true;
            self.paused.push(id);
            Counters::add(&ctx.counters.read_pauses, 1);
            log::debug!(
                "{}: '{}' has {held} bytes waiting for delivery, more than its receive window of {window}; not reading it until the handler catches up",
                ctx.cfg.name,
                p.name()
            );
        }
        true
    }

    /// Tells the application that the handshake on link `id` was refused with `code` (by
    /// the other side: `by_peer`), if that is a refusal of who the other side is.
    pub(super) fn refused(
        &mut self,
        id: LinkId,
        code: CloseCode,
        by_peer: bool,
        peers: &Roster,
        ctx: &mut Ctx,
    ) {
        let Some(reason) = refusal(code) else {
            return;
        };
        let Some(link) = self.table.get(&id) else {
            return;
        };
        let addr = link.remote.clone();
        let peer = match link.peer.or(link.dialled) {
            Some(p) => Some(peers.name(p).to_string()),
            None => link
                .hs
                .as_ref()
                .and_then(|h| h.peer())
                .map(|p| p.name.clone()),
        };
        emit(&ctx.cfg, &mut ctx.out, || Event::Refused {
            peer,
            addr,
            reason,
            by_peer,
        });
    }

    /// A dialled link's connection completed.
    pub(super) fn connected(&mut self, id: LinkId, peers: &mut Roster) {
        let Some(link) = self.table.get_mut(&id) else {
            return;
        };
        link.connecting = false;
        if let Some(p) = link.dialled.and_then(|p| peers.get_mut(&p)) {
            p.set_state(PeerState::Handshaking);
        }
        self.dirty.push_back(id);
    }

    /// Publishes what the application queued for peer `id`.
    pub(super) fn publish(&mut self, now: Instant, id: usize, peers: &mut Roster, ctx: &mut Ctx) {
        self.publish_upto(now, id, ctx.cfg.write_high_water, peers, ctx);
    }

    /// [`publish`](Links::publish) with the high-water mark `high`.
    pub(super) fn publish_upto(
        &mut self,
        now: Instant,
        id: usize,
        high: usize,
        peers: &mut Roster,
        ctx: &mut Ctx,
    ) {
        let Some(p) = peers.get_mut(&id) else {
            return;
        };
        let link = p
            .link
            .and_then(|l| self.table.get_mut(&l))
            .filter(|l| l.established);
        let link_id = link.as_ref().map(|l| l.id);
        if p.publish(&ctx.cfg, &mut ctx.out, link, high, now) {
            if let Some(l) = link_id {
                self.dirty.push_back(l);
            }
        }
    }

    /// Writes an ack to peer `id` if one is owed.
    pub(super) fn ack(&mut self, id: usize, peers: &mut Roster, ctx: &mut Ctx) {
        let Some(p) = peers.get_mut(&id) else {
            return;
        };
        let link = p.link.and_then(|l| self.table.get_mut(&l));
        let link_id = link.as_ref().map(|l| l.id);
        if p.ack(&mut ctx.out, link, false) {
            if let Some(l) = link_id {
                self.dirty.push_back(l);
            }
        }
    }

    /// Publishes the link gauges after the link set changed.
    pub(super) fn update_gauges(&self, counters: &NodeCounters) {
        // Relaxed: gauges for stats only.
        counters
            .open
            .store(self.table.len() as u64, Ordering::Relaxed);
        let est = self.table.values().filter(|l| l.established).count() as u64;
        counters.established.store(est, Ordering::Relaxed);
        counters
            .pending
            .store(self.gate.pending.len() as u64, Ordering::Relaxed);
    }

    /// `n` bytes of link `id`'s write buffer were written at `now`; `drained`: the buffer
    /// is empty. A drained established link's acks count as sent, and a link below its
    /// low-water mark gets more of its peer's queue.
    pub(super) fn wrote(
        &mut self,
        now: Instant,
        id: LinkId,
        n: usize,
        peers: &mut Roster,
        ctx: &mut Ctx,
    ) {
        let Some(link) = self.table.get_mut(&id) else {
            return;
        };
        let drained = link.wrote(n, now);
        if !link.established {
            return;
        }
        let Some(pid) = link.peer else { return };
        let low = link.unwritten() < ctx.cfg.write_high_water / 2;
        let Some(p) = peers.get_mut(&pid) else {
            return;
        };
        if p.link != Some(id) {
            return;
        }
        if drained {
            // Every ack in the buffer has been written: now it counts as sent.
            p.acks.written(&mut p.desc);
        }
        if low && p.outbound.has_queued(&p.shared) {
            self.publish(now, pid, peers, ctx);
        }
    }

    /// The ack timer of peer `id` fired (`journalled`: the node journals).
    pub(super) fn ack_due(
        &mut self,
        now: Instant,
        id: usize,
        journalled: bool,
        peers: &mut Roster,
        ctx: &mut Ctx,
    ) {
        if let Some(p) = peers.get_mut(&id) {
            p.acks.timer = false;
        }
        self.ack(id, peers, ctx);
        if !journalled {
            return;
        }
        // The handler may not have reached what arrived: ask again later while an ack is
        // owed.
        if let Some(p) = peers.get_mut(&id) {
            if p.acks.behind(&p.desc) && !p.acks.timer && p.link.is_some() {
                p.acks.timer = true;
                ctx.timers
                    .add(now + ctx.cfg.ack_delay, TimerKind::AckDelay { peer: id });
            }
        }
    }

    /// Whether another process holds peer `pid`'s name against link `id`, whose handshake
    /// claims incarnation `launch`: an established link of another incarnation speaks for
    /// the peer (that process is alive as far as we can tell), or `launch` was replaced here
    /// by a newer incarnation (whatever process has it is not the one the name belongs to).
    pub(super) fn name_holder(
        &self,
        pid: usize,
        id: LinkId,
        launch: u64,
        peers: &Roster,
    ) -> Option<NameHolder> {
        let p = peers.get(&pid)?;
        let live = p
            .link
            .filter(|&o| o != id)
            .and_then(|o| self.table.get(&o))
            .filter(|l| l.established && l.launch.is_some_and(|l| l != launch));
        if let Some(l) = live {
            return Some(NameHolder {
                launch: l.launch.unwrap_or_default(),
                addr: l.remote.clone(),
                link: Some(l.id),
            });
        }
        if p.replaced.contains(launch) {
            let current = p.link.and_then(|o| self.table.get(&o));
            return Some(NameHolder {
                launch: p.desc.remote_launch().unwrap_or_default(),
                addr: current.and_then(|l| l.remote.clone()),
                link: None,
            });
        }
        None
    }

    /// Whether any link is established (the node reaches at least one member).
    pub(super) fn reaches_anyone(&self) -> bool {
        self.table.values().any(|l| l.established)
    }
}
