//! Membership (`Builder::membership`, `Builder::seed`): the endpoint drives the SWIM core
//! (`crate::membership`) and makes its view the node's peers. A member the view holds alive
//! or suspect is a peer, dialled at the address the view gives; one it declares failed or
//! left is retired for good, as `remove_peer` does (its queued messages fail, what it never
//! acknowledged is reported undelivered), and the node forgets it. The core's packets
//! travel as datagrams ([`Output::Datagram`], [`Input::Datagram`]) on the driver's UDP
//! socket at the listen address; its timers are the endpoint's.

use std::collections::HashSet;

use super::*;
use crate::events::Event;
use crate::membership::{self, MemberEvent, State};
use crate::sync::Mutex;

/// Membership as configured for a node.
#[derive(Clone)]
pub(crate) struct MembershipSetup {
    /// The protocol's parameters.
    pub(crate) config: membership::Config,
    /// Where this member receives membership packets and listens: the address members
    /// learn for it.
    pub(crate) addr: SocketAddr,
    /// Addresses to join through.
    pub(crate) join: Vec<SocketAddr>,
    /// The view and the counters, as `Node::members` and `Node::membership_stats` read
    /// them (the endpoint writes them as they change).
    pub(crate) view: Arc<Mutex<MembersView>>,
}

/// What the node reads of membership.
#[derive(Default)]
pub(crate) struct MembersView {
    pub(crate) members: Vec<membership::Member>,
    pub(crate) stats: membership::MembershipStats,
}

/// The endpoint's membership state.
pub(super) struct Members {
    swim: membership::Membership,
    view: Arc<Mutex<MembersView>>,
    /// Names of the peers the view governs (added by it, or confirmed by it after they
    /// dialled in): retired when the view declares them failed or left. Peers configured
    /// by name are left to the application.
    governed: HashSet<SharedStr>,
}

impl Members {
    pub(super) fn new(cfg: &Config, setup: &MembershipSetup, now: Instant) -> Members {
        let local = membership::Local {
            cluster: cfg.cluster.clone(),
            name: cfg.name.to_string(),
            addr: setup.addr,
            launch: cfg.launch_id,
            key: cfg
                .secret
                .as_ref()
                .map(|s| membership::PacketKey::new(s.bytes())),
        };
        let mut swim = membership::Membership::new(setup.config.clone(), local, cfg.launch_id, now);
        if !setup.join.is_empty() {
            swim.handle(now, membership::Input::Join(&setup.join));
        }
        setup.view.lock().members = swim.members();
        Members {
            swim,
            view: setup.view.clone(),
            governed: HashSet::new(),
        }
    }

    /// When the core next needs the time.
    pub(super) fn next_at(&self) -> Option<Instant> {
        self.swim.poll_timeout()
    }

    /// A membership packet arrived from `from`.
    pub(super) fn packet(&mut self, now: Instant, from: SocketAddr, data: &[u8]) {
        self.swim
            .handle(now, membership::Input::Packet { from, data });
        self.publish_stats();
    }

    /// Joins through `addrs` too (a seed name resolved to new addresses).
    pub(super) fn join(&mut self, now: Instant, addrs: &[SocketAddr]) {
        self.swim.handle(now, membership::Input::Join(addrs));
        self.publish_stats();
    }

    /// The core's timers, if due.
    pub(super) fn timers(&mut self, now: Instant) {
        if self.next_at().is_some_and(|at| at <= now) {
            self.swim.handle(now, membership::Input::Timer);
            self.publish_stats();
        }
    }

    /// Leaving on shutdown: the core tells some members at once (the datagrams go out in
    /// this drain), so the others need not wait for the failure detector.
    pub(super) fn leave(&mut self, now: Instant) {
        self.swim.handle(now, membership::Input::Leave);
    }

    /// Publishes the counters (after a packet or a timer: never on a message's path).
    fn publish_stats(&self) {
        // One short lock per membership packet or timer, against `Node::membership_stats`.
        self.view.lock().stats = self.swim.stats().clone();
    }
}

impl Members {
    /// Takes what the core asks: datagrams to send, changes of the view to act on (on the
    /// peers, and the links of those it retires).
    pub(super) fn pump(
        &mut self,
        now: Instant,
        peers: &mut Roster,
        links: &mut Links,
        ctx: &mut Ctx,
    ) {
        while let Some(out) = self.swim.poll(now) {
            match out {
                membership::Output::Send { to, packet } => {
                    ctx.out.events.push_back(Output::Datagram { to, packet });
                }
                membership::Output::Event(e) => {
                    self.view.lock().members = self.swim.members();
                    self.event(now, e, peers, links, ctx);
                }
            }
        }
    }

    fn event(
        &mut self,
        now: Instant,
        e: MemberEvent,
        peers: &mut Roster,
        links: &mut Links,
        ctx: &mut Ctx,
    ) {
        let MemberEvent::Changed { member, previous } = e else {
            return; // a failed or left member reaped from the view: retired already
        };
        if member.name == *ctx.cfg.name {
            return;
        }
        let before = previous.as_ref().map(|p| p.state);
        let name = member.name.clone();
        match member.state {
            State::Alive | State::Suspect => {
                self.live(&member.name, member.addr, peers, ctx);
                let back = matches!(before, None | Some(State::Failed | State::Left));
                let fact = match (before, member.state) {
                    _ if back => Event::MemberJoined {
                        peer: name,
                        addr: member.addr,
                        incarnation: member.incarnation,
                    },
                    (Some(State::Suspect), State::Alive) => Event::MemberAlive { peer: name },
                    (_, State::Suspect) if before != Some(State::Suspect) => {
                        Event::MemberSuspected { peer: name }
                    }
                    _ => return,
                };
                emit(&ctx.cfg, &mut ctx.out, || fact);
            }
            State::Failed | State::Left => {
                if matches!(before, Some(State::Failed | State::Left)) {
                    return;
                }
                let failed = member.state == State::Failed;
                self.gone(now, &member.name, failed, peers, links, ctx);
                let fact = if failed {
                    Event::MemberFailed { peer: name }
                } else {
                    Event::MemberLeft { peer: name }
                };
                emit(&ctx.cfg, &mut ctx.out, || fact);
            }
        }
    }

    /// The view holds `name` live at `addr`: it is a peer with that address (added if the
    /// node does not know it), governed by the view, and dialled if it has no link.
    fn live(&mut self, name: &str, addr: SocketAddr, peers: &mut Roster, ctx: &mut Ctx) {
        if ctx.shutdown.is_some() {
            return;
        }
        let id = match peers.id_of(name) {
            Some(id) => {
                let Some(p) = peers.get_mut(&id) else {
                    return;
                };
                if p.state == PeerState::Closed {
                    return;
                }
                if p.dynamic {
                    // Admitted as it dialled in: the view vouches for it now.
                    p.dynamic = false;
                    p.gen += 1; // cancels its forget timer
                }
                if p.addr != Some(Addr::Tcp(addr)) {
                    p.addr = Some(Addr::Tcp(addr));
                }
                id
            }
            None => peers.admit_member(name, addr, ctx),
        };
        self.governed.insert(name.into());
        if peers.get(&id).is_some_and(|p| p.link.is_none()) {
            peers.dial(id, ctx);
        }
    }

    /// The view declared `name` failed (or it left): a peer the view governs is retired for
    /// good, as `remove_peer` does (its link closed, the application told it disconnected),
    /// and the node forgets it.
    fn gone(
        &mut self,
        now: Instant,
        name: &str,
        failed: bool,
        peers: &mut Roster,
        links: &mut Links,
        ctx: &mut Ctx,
    ) {
        let governed = self.governed.remove(name);
        let Some(id) = peers.id_of(name) else {
            return;
        };
        if !governed {
            log::info!(
                "{}: member '{name}' {}; it is a configured peer, kept",
                ctx.cfg.name,
                if failed { "failed" } else { "left" }
            );
            return;
        }
        if peers.get(&id).is_none() {
            return;
        }
        log::info!(
            "{}: member '{name}' {}: removed",
            ctx.cfg.name,
            if failed {
                "declared failed"
            } else {
                "left the cluster"
            }
        );
        let reason = if failed {
            "declared failed by the cluster's membership"
        } else {
            "left the cluster"
        };
        if let Some(shared) = peers.remove_member(now, id, reason, links, ctx) {
            ctx.out.events.push_back(Output::Forget(shared));
        }
    }
}
