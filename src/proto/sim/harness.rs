//! The simulation's driver: the schedule's steps ([`Step`]) and what they did ([`Stats`]);
//! the simulation ([`Sim`]): its members and links, the simulated clock, the oracle; doing
//! what an endpoint asks as the IO thread does ([`Sim::drain`]), the application's sends,
//! the simulated journal writer, held deliveries, time passing, and a schedule run to its
//! end. The members are in `member`, the links and the faults on them in `network`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::member::{addr, pair, run_task, Known, Member, Settings, Side, Spec, WINDOW};
use super::network::SimLink;
use super::oracle::Oracle;
use crate::deliver::Task;
use crate::events::{DisconnectReason as Why, Event};
use crate::peer::{Outgoing, PeerShared};
use crate::proto::endpoint::Batch;
use crate::proto::{Input, LinkId, NodeCounters, Output};
use crate::sync::Arc;

/// What the faults did, summed over runs to show the schedules reach every knob.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Stats {
    pub(super) messages: u64,
    pub(super) cuts: u64,
    /// Bytes lost: in flight beyond a cut, or written to a dead link.
    pub(super) bytes_lost: u64,
    /// Links established (handshakes completed, both sides counted).
    pub(super) established: u64,
    pub(super) resent: u64,
    /// Data frames replayed by the link.
    pub(super) replayed: u64,
    /// Data frames dropped as duplicates.
    pub(super) duplicates: u64,
    /// Older acks replayed by the link.
    pub(super) stale_acks: u64,
    /// Links resolved by the tie-break.
    pub(super) tie_breaks: u64,
    /// Protocol errors (a stale handshake read late from a dead link, a replay at the
    /// wrong moment): the link is closed and recovery goes on.
    pub(super) protocol_errors: u64,
    /// Handshakes refused for authentication (only when the members' secrets differ).
    pub(super) auth_refusals: u64,
    /// `Refused` facts, all members.
    pub(super) refusals: u64,
    /// `NewIncarnation` facts, all members.
    pub(super) new_incarnations: u64,
    /// Processes ended.
    pub(super) deaths: u64,
    /// Times a member's peer went over from one incarnation's established link to
    /// another's (a takeover of the name, or a restart).
    pub(super) takeovers: u64,
    /// Processes started again at an old one's address.
    pub(super) restarts: u64,
    /// Journal failures (each stops its node).
    pub(super) journal_failures: u64,
    /// Members forgotten (admitted at run time, away for `forget_after`), all members.
    pub(super) forgotten: u64,
    /// Messages delivered by one incarnation and reported undelivered when their sender
    /// went over to another.
    pub(super) delivered_then_dropped: u64,
}

impl Stats {
    pub(super) fn add(&mut self, o: &Stats) {
        self.messages += o.messages;
        self.cuts += o.cuts;
        self.bytes_lost += o.bytes_lost;
        self.established += o.established;
        self.resent += o.resent;
        self.replayed += o.replayed;
        self.duplicates += o.duplicates;
        self.stale_acks += o.stale_acks;
        self.tie_breaks += o.tie_breaks;
        self.protocol_errors += o.protocol_errors;
        self.auth_refusals += o.auth_refusals;
        self.refusals += o.refusals;
        self.new_incarnations += o.new_incarnations;
        self.deaths += o.deaths;
        self.restarts += o.restarts;
        self.takeovers += o.takeovers;
        self.journal_failures += o.journal_failures;
        self.forgotten += o.forgotten;
        self.delivered_then_dropped += o.delivered_then_dropped;
    }
}

/// One step of a schedule. Steps that do not apply in the current state do nothing.
#[derive(Clone, Debug)]
pub(super) enum Step {
    /// The application of `side` sends its first peer a message with `len` bytes of filler
    /// (if its window has room), and the endpoint is asked to publish.
    Send { side: Side, len: usize },
    /// The socket takes up to `n` bytes of the write buffer of one of `side`'s ends.
    Write { side: Side, pick: usize, n: usize },
    /// `side` reads up to `n` bytes from one of its ends and handles them.
    Read { side: Side, pick: usize, n: usize },
    /// Simulated time passes.
    Advance { ms: u64 },
    /// A live link breaks; of the bytes in flight each way, the fraction `keep / u16::MAX`
    /// (rounded down: any byte offset) arrives.
    Cut { pick: usize, keep: [u16; 2] },
    /// The oldest connection `side`'s endpoint asked for is made.
    Dial { side: Side },
    /// The link delivers to `side` again data frames it already holds (from `back` before
    /// its latest, `count` more after that) and an ack the peer wrote earlier.
    Replay { side: Side, back: u64, count: u64 },
    /// The process `side` ends.
    Kill { side: Side },
    /// A process that ended starts again at its address, under a new launch id (once).
    Restart { side: Side },
    /// `side`'s journal writer appends everything handed to it
    /// ([`Sim::journal_catch_up`]).
    Journal { side: Side },
    /// `side`'s journal writer fails (a write or a sync): what it appended stays, the
    /// batches handed to it and not appended are lost, and the node stops.
    JournalFail { side: Side },
    /// Every byte that can move moves, and the connections asked for are made, with no
    /// time passing ([`Sim::pump`]).
    Pump,
}

/// The simulation: members, the links between them, the simulated clock, the oracle.
pub(super) struct Sim {
    start: Instant,
    /// Simulated milliseconds since `start`.
    pub(super) ms: u64,
    settings: Settings,
    pub(super) m: Vec<Member>,
    pub(super) links: Vec<SimLink>,
    /// Which simulated link each member's link id belongs to.
    pub(super) owner: HashMap<(Side, LinkId), usize>,
    pub(super) next_link: usize,
    pub(super) stats: Stats,
    /// Handshake nonces handed out: each one fresh (a counter stands in for the OS's
    /// randomness, so schedules replay exactly).
    pub(super) nonces: u64,
    pub(super) oracle: Oracle,
    /// Deliveries held as a blocked handler would hold them: the member and the sender
    /// whose messages its pool does not run ([`Sim::hold`]).
    hold: Option<(Side, String)>,
    /// The pool tasks held meanwhile, run at [`Sim::release`].
    held: Vec<Task>,
}

impl Drop for Sim {
    /// A process that ended drops its messages with their permits, as does one still
    /// refused a name it claims, or one whose peer ended (its messages to it wait for an
    /// incarnation that never comes): the permit's drop check would take that for a leak,
    /// so they are dropped with it off. (The oracle checks the windows of every pair that
    /// can complete.)
    fn drop(&mut self) {
        let twins = self.twins() || self.m.iter().any(|m| m.dead);
        for m in std::mem::take(&mut self.m) {
            let stuck = || {
                m.peers
                    .iter()
                    .any(|k| k.shared.outbox.window().available() != WINDOW)
            };
            if m.dead || (twins && stuck()) {
                crate::flow::dropping_unchecked(|| drop(m));
            }
        }
    }
}

impl Sim {
    /// Alpha and beta (see [`pair`]).
    pub(super) fn new(s: Settings) -> Sim {
        Sim::with(s, &pair(s))
    }

    /// Members as `specs` say (member `i` is `specs[i]`); each adds its peers in order (and
    /// asks to dial those whose address it knows).
    pub(super) fn with(s: Settings, specs: &[Spec]) -> Sim {
        let start = Instant::now();
        let mut sim = Sim {
            start,
            ms: 0,
            settings: s,
            m: Vec::new(),
            links: Vec::new(),
            owner: HashMap::new(),
            next_link: 1,
            stats: Stats::default(),
            nonces: 0,
            oracle: Oracle::default(),
            hold: None,
            held: Vec::new(),
        };
        for (side, spec) in specs.iter().enumerate() {
            sim.m.push(Member::new(side, spec, s, start));
        }
        for (side, spec) in specs.iter().enumerate() {
            sim.add_peers(side, spec);
        }
        sim
    }

    /// A new process as `spec` says, started now at the address of `old` (a restart);
    /// returns its side.
    pub(super) fn restart(&mut self, old: Side, spec: &Spec) -> Side {
        let side = self.m.len();
        let now = self.now();
        self.stats.restarts += 1;
        let mut m = Member::new(side, spec, self.settings, now);
        m.addr = self.m[old].addr.clone();
        self.m.push(m);
        self.add_peers(side, spec);
        side
    }

    fn add_peers(&mut self, side: Side, spec: &Spec) {
        // What the endpoint asked for as it started (its seeds' dials).
        self.drain(side);
        let now = self.now();
        for (k, &(_, at)) in spec.knows.iter().enumerate() {
            let shared = self.m[side].peers[k].shared.clone();
            self.m[side].ep.handle(
                now,
                Input::AddPeer {
                    peer: shared,
                    addr: at.map(addr),
                },
            );
            self.drain(side);
        }
    }

    pub(super) fn now(&self) -> Instant {
        self.start + Duration::from_millis(self.ms)
    }

    /// The live members.
    pub(super) fn live(&self) -> Vec<Side> {
        (0..self.m.len()).filter(|&s| !self.m[s].dead).collect()
    }
    /// Does what `side`'s endpoint asks ([`Endpoint::poll`](crate::proto::Endpoint::poll), in its order), as the IO
    /// thread does: runs pool tasks inline, hands journal batches to the simulated writer,
    /// remembers a dial, closes ends, records reports and facts (and checks them); leaves
    /// the bytes of a transmit to the schedule's `Write` steps; then hands over the credit
    /// the pool asked to return, until nothing more is asked.
    pub(super) fn drain(&mut self, side: Side) {
        let now = self.now();
        let who = self.m[side].name;
        let handler = self.m[side].handler();
        loop {
            while let Some(out) = self.m[side].ep.poll(now) {
                match out {
                    Output::Task(t) if self.holds(side, &t) => self.held.push(t),
                    Output::Task(t) => run_task(t, &handler),
                    // The IO thread hands the turn's journal records to the writer.
                    Output::Journal(batch) => self.hand_to_journal(side, batch),
                    Output::JournalSync(_) => {}
                    // The schedule's `Write` steps move the bytes.
                    Output::Transmit(_) => {}
                    Output::Dial { target, addr, .. } => {
                        let dials = &mut self.m[side].dials;
                        if !dials.iter().any(|&(t, _)| t == target) {
                            dials.push_back((target, addr));
                        }
                    }
                    Output::Close { link, last } => {
                        self.m[side].refusal_open = false;
                        if let Some(l) = self.owner.remove(&(side, link)) {
                            let sl = &mut self.links[l];
                            let i = sl.at(side).expect("a member of its link");
                            if sl.cut {
                                self.stats.bytes_lost += last.len() as u64;
                            } else {
                                sl.pipe[i].extend(last);
                            }
                            sl.closed[i] = true;
                            sl.ends[i] = None;
                        }
                    }
                    Output::Resume(_) => {}
                    Output::Undelivered { peer, messages } => {
                        let m = &mut self.m[side];
                        let k = m.known(&peer).expect("a known peer");
                        // A peer being forgotten is out of the endpoint already: the
                        // incarnation it was told of last is the one it was bound to.
                        let bound = match m.ep.peer(k) {
                            Some(p) => p.desc.remote_launch(),
                            None => m.peers[k].launches_told.last().copied(),
                        };
                        m.peers[k]
                            .undelivered
                            .extend(messages.into_iter().map(|u| (u.payload, bound)));
                    }
                    Output::Event(Event::Connected {
                        peer,
                        incarnation: launch,
                    }) => {
                        let m = &mut self.m[side];
                        let k = m.known(&peer).expect("a known peer");
                        let known = &mut m.peers[k];
                        assert!(!known.up, "{who}: told Connected to {peer} twice in a row");
                        if let Some(&prev) = known.launches_told.last().filter(|&&l| l != launch) {
                            assert!(
                                !known.launches_told.contains(&launch),
                                "{who}: '{peer}' went back to incarnation {launch:#x} after {prev:#x}"
                            );
                            assert_ne!(
                                known.last_why,
                                Some(Why::Replaced),
                                "{who}: '{peer}' incarnation {prev:#x} was replaced by {launch:#x} over its live link"
                            );
                        }
                        known.up = true;
                        known.connects_told += 1;
                        known.launches_told.push(launch);
                    }
                    Output::Event(Event::Disconnected { peer, reason: why }) => {
                        let m = &mut self.m[side];
                        let k = m.known(&peer).expect("a known peer");
                        assert!(
                            m.peers[k].up,
                            "{who}: told {peer} Disconnected while not connected"
                        );
                        m.peers[k].up = false;
                        m.peers[k].last_why = Some(why);
                    }
                    Output::Event(Event::Removed { peer }) => {
                        let m = &self.m[side];
                        let k = m.known(&peer).expect("a known peer");
                        assert!(!m.peers[k].up, "{who}: {peer} removed while told connected");
                    }
                    Output::Event(Event::NewIncarnation { .. }) => self.stats.new_incarnations += 1,
                    Output::Event(Event::Refused {
                        reason, by_peer, ..
                    }) => {
                        let m = &mut self.m[side];
                        assert!(
                            !m.refusal_open,
                            "{who}: two Refused facts for one handshake"
                        );
                        m.refusal_open = true;
                        m.refusals.push((reason, by_peer));
                        self.stats.refusals += 1;
                    }
                    Output::Admitted(shared) => {
                        let m = &mut self.m[side];
                        // Said again for a peer it holds (a node's `add_peer` raced the
                        // admission): the node's map keeps it, nothing new here.
                        let again = m
                            .peers
                            .get(shared.id)
                            .is_some_and(|k| Arc::ptr_eq(&k.shared, &shared));
                        if !again {
                            assert_eq!(
                                shared.id,
                                m.peers.len(),
                                "{who}: admitted as the next peer"
                            );
                            // A name it forgot comes back: what it sent that name before
                            // stays the start of the record (messages are numbered per
                            // name), all delivered or reported already.
                            let before = m
                                .peers
                                .iter()
                                .rev()
                                .find(|k| k.forgotten && k.name == shared.name)
                                .map(|k| k.sent.clone());
                            let mut known = Known::new(shared);
                            known.sent = before.unwrap_or_default();
                            m.peers.push(known);
                        }
                    }
                    Output::JournalFailed => {
                        self.m[side].journal_failed = true;
                        self.stats.journal_failures += 1;
                    }
                    Output::Forget(shared) => self.forget(side, &shared),
                    Output::Event(Event::Forgotten { peer }) => {
                        let m = &self.m[side];
                        assert!(
                            m.known(&peer).is_none(),
                            "{who}: told '{peer}' forgotten before the node forgot it"
                        );
                        self.stats.forgotten += 1;
                    }
                    // No member of the simulation runs membership (it has a simulation
                    // of its own, `membership::sim`).
                    Output::Datagram { .. } | Output::Resolve { .. } | Output::Event(_) => {}
                }
            }
            // What the pool asked of the IO thread meanwhile is its next input.
            let credit = self.m[side].handoff.take_credit_flush();
            if credit.is_empty() {
                // After a journal failure the IO thread ends once the endpoint's shutdown
                // is done: the process has stopped.
                if self.m[side].journal_failed && self.m[side].ep.shutdown_done(now) {
                    self.kill(side);
                }
                return;
            }
            for id in credit {
                self.m[side].ep.handle(now, Input::FlushCredit(id));
            }
        }
    }

    pub(super) fn apply(&mut self, step: &Step) {
        match *step {
            Step::Send { side, len } => self.send(side, len),
            Step::Write { side, pick, n } => {
                if let Some(l) = self.pick_end(side, pick) {
                    self.write(side, l, n);
                }
            }
            Step::Read { side, pick, n } => {
                if let Some(l) = self.pick_end(side, pick) {
                    self.read(side, l, n);
                }
            }
            Step::Advance { ms } => self.advance(ms),
            Step::Cut { pick, keep } => {
                let live: Vec<usize> = (0..self.links.len())
                    .filter(|&l| !self.links[l].cut && self.links[l].open())
                    .collect();
                if !live.is_empty() {
                    self.cut(live[pick % live.len()], keep);
                }
            }
            Step::Dial { side } => {
                self.dial(side);
            }
            Step::Replay { side, back, count } => self.replay(side, back, count),
            Step::Kill { side } => self.kill(side),
            Step::Pump => self.pump(),
            Step::Journal { side } => {
                if !self.m[side].dead {
                    self.journal_catch_up(side);
                }
            }
            Step::JournalFail { side } => self.journal_fail(side),
            Step::Restart { side } => {
                let restarted =
                    (side + 1..self.m.len()).any(|s| self.m[s].addr == self.m[side].addr);
                if self.m[side].dead && !restarted {
                    let spec = Spec {
                        launch: 0x1000 + self.m.len() as u64,
                        ..self.m[side].spec.clone()
                    };
                    self.restart(side, &spec);
                }
            }
        }
    }

    /// The `pick`-th (modulo) link `side` still holds an end of.
    pub(super) fn pick_end(&self, side: Side, pick: usize) -> Option<usize> {
        let open: Vec<usize> = (0..self.links.len())
            .filter(|&l| self.links[l].end(side).is_some())
            .collect();
        (!open.is_empty()).then(|| open[pick % open.len()])
    }

    // ----- the application ---------------------------------------------------------------

    /// Sends `side`'s first peer a message (see [`send_to`](Sim::send_to)) — two, the
    /// second queued before the IO thread publishes the first, when `len` is a multiple of
    /// 4: a run of frames may then hold two messages (and an ack or a handshake may end
    /// inside it).
    pub(super) fn send(&mut self, side: Side, len: usize) {
        self.queue_to(side, 0, len, if len % 4 == 0 { 2 } else { 1 });
    }

    /// Sends message number `i` of `side` to its peer `k`: its side, its number, then `len`
    /// filler bytes, so that every message's bytes are distinct. Skipped when the window is
    /// full (as `try_send` would refuse it), or the process ended.
    ///
    /// As a node without journal sends: two messages in three are encoded by the sender
    /// into the outbox's runs (`Outbox::admit_framed`), the third queued whole, so runs and
    /// whole messages interleave; a member that journals queues each whole.
    pub(super) fn send_to(&mut self, side: Side, k: usize, len: usize) {
        self.queue_to(side, k, len, 1);
    }

    /// [`send_to`](Sim::send_to) for `burst` messages, queued one after the other before the
    /// IO thread publishes.
    fn queue_to(&mut self, side: Side, k: usize, len: usize, burst: usize) {
        if self.m[side].dead {
            return;
        }
        let now = self.now();
        let m = &mut self.m[side];
        let framing = !m.spec.journal;
        let known = &mut m.peers[k];
        let mut queued = 0;
        for _ in 0..burst {
            let i = known.sent.len() as u32;
            let mut p = Vec::with_capacity(5 + len);
            p.push(side as u8);
            p.extend_from_slice(&i.to_le_bytes());
            p.resize(5 + len, i as u8);
            let p = Bytes::from(p);
            let Ok(permit) = known
                .shared
                .outbox
                .window()
                .try_acquire(crate::flow::cost(p.len()))
            else {
                break;
            };
            let admitted = if framing && i % 3 != 0 {
                known.shared.outbox.admit_framed(false, &p, permit)
            } else {
                let msg = Outgoing::new(p.clone(), false, None, permit);
                known.shared.outbox.admit(msg).is_ok()
            };
            if !admitted {
                break;
            }
            known.sent.push(p);
            queued += 1;
        }
        if queued == 0 {
            return;
        }
        self.stats.messages += queued;
        let id = known.shared.id;
        m.ep.handle(now, Input::Publish(id));
        self.drain(side);
    }
    /// Hands a batch of `side`'s journal records to its (simulated) writer.
    fn hand_to_journal(&mut self, side: Side, (n, records): Batch) {
        let tops = records
            .iter()
            .filter_map(|r| match r {
                crate::journal::Record::Message { peer, seq, .. } => Some((peer.clone(), *seq)),
                _ => None,
            })
            .collect();
        self.m[side].batches.push((n, tops));
    }

    /// `side`'s journal writer appends (and, the policy being `Never`, only appends)
    /// everything handed to it.
    pub(super) fn journal_catch_up(&mut self, side: Side) {
        let m = &mut self.m[side];
        let Some(&(last, _)) = m.batches.last() else {
            return;
        };
        for (_, tops) in std::mem::take(&mut m.batches) {
            for (peer, seq) in tops {
                let top = m.journalled.entry(peer).or_default();
                *top = (*top).max(seq);
            }
        }
        m.appended = last;
        let now = self.now();
        let marks = crate::journal::WriterMarks {
            appended: last,
            synced: 0,
            failed: false,
        };
        self.m[side].ep.handle(now, Input::JournalMarks(marks));
        self.drain(side);
    }

    /// `side`'s journal writer fails: what it appended stays appended, what it was handed
    /// since is lost, and it says so (`WriterMarks::failed`). Nothing for a member that
    /// does not journal, or has ended.
    pub(super) fn journal_fail(&mut self, side: Side) {
        let m = &mut self.m[side];
        if m.dead || !m.spec.journal {
            return;
        }
        m.batches.clear();
        let marks = crate::journal::WriterMarks {
            appended: m.appended,
            synced: 0,
            failed: true,
        };
        let now = self.now();
        self.m[side].ep.handle(now, Input::JournalMarks(marks));
        self.drain(side);
    }

    /// `side`'s endpoint forgot the member whose shared state is `shared` (admitted at run
    /// time, away for `forget_after`): it holds no peer of that name any more, everything
    /// sent to it was delivered or reported undelivered, and every permit is back.
    fn forget(&mut self, side: Side, shared: &Arc<PeerShared>) {
        let m = &mut self.m[side];
        let who = m.name;
        let k = m
            .peers
            .iter()
            .position(|k| Arc::ptr_eq(&k.shared, shared))
            .expect("forgets a peer it knows");
        assert!(
            m.ep.peer(shared.id).is_none(),
            "{who}: '{}' forgotten, still in the endpoint",
            shared.name
        );
        let known = &mut m.peers[k];
        assert!(
            !known.up,
            "{who}: '{}' forgotten while connected",
            known.name
        );
        assert!(!known.forgotten, "{who}: '{}' forgotten twice", known.name);
        known.forgotten = true;
        assert_eq!(
            known.shared.outbox.window().available(),
            WINDOW,
            "{who}: the permits of '{}' are back once it is forgotten",
            known.name
        );
    }

    /// From now on `side`'s pool runs none of `from`'s messages, regular or out-of-band, as
    /// if its handler blocked on the first: their tasks wait for [`Sim::release`], the
    /// queue's deliverer flag stays taken, so the messages that follow only queue up, and
    /// no credit goes back to `from` for them.
    pub(super) fn hold(&mut self, side: Side, from: &str) {
        self.hold = Some((side, from.to_owned()));
    }

    /// The handler `hold` blocked returns: the held tasks run, and `side` hands over the
    /// credit they returned.
    pub(super) fn release(&mut self) {
        let Some((side, _)) = self.hold.take() else {
            return;
        };
        let handler = self.m[side].handler();
        for t in std::mem::take(&mut self.held) {
            run_task(t, &handler);
        }
        self.drain(side);
    }

    /// Whether `task`, made by `side`, is held ([`Sim::hold`]).
    fn holds(&self, side: Side, task: &Task) -> bool {
        let Some((at, from)) = &self.hold else {
            return false;
        };
        *at == side
            && match task {
                Task::Member(q) => q.name() == from,
                Task::Oob(q) => q.name() == from,
                Task::Events(_) => false,
            }
    }

    /// Simulated time passes: each live member's timers run, and the connections asked for
    /// are remembered.
    pub(super) fn advance(&mut self, ms: u64) {
        self.ms += ms;
        let now = self.now();
        for side in self.live() {
            self.m[side].ep.handle(now, Input::Timeout);
            self.drain(side);
        }
    }
    /// Sums the members' counters into [`Sim::stats`].
    pub(super) fn gather(&mut self) {
        use crate::sync::atomic::{AtomicU64, Ordering};
        let sum = |f: fn(&NodeCounters) -> &AtomicU64| -> u64 {
            // Relaxed: counters read for the statistics only.
            self.m
                .iter()
                .map(|m| f(&m.counters).load(Ordering::Relaxed))
                .sum()
        };
        self.stats.established = sum(|c| &c.handshakes);
        self.stats.tie_breaks = sum(|c| &c.tie_breaks);
        self.stats.protocol_errors = sum(|c| &c.protocol_errors);
        self.stats.auth_refusals = sum(|c| &c.auth_failures);
        let peers = |f: fn(&crate::peer::Counters) -> &AtomicU64| -> u64 {
            self.m
                .iter()
                .flat_map(|m| &m.peers)
                .map(|k| crate::peer::Counters::get(f(&k.shared.counters)))
                .sum()
        };
        self.stats.resent = peers(|c| &c.resent);
        self.stats.duplicates = peers(|c| &c.duplicates);
        self.stats.delivered_then_dropped = self.oracle.delivered_then_dropped;
        self.stats.takeovers = self.oracle.takeovers;
    }

    /// Runs a schedule to completion, checking everything; returns what the faults did.
    pub(super) fn run(s: Settings, steps: &[Step]) -> Stats {
        Sim::run_with(Sim::new(s), steps)
    }

    /// Runs a schedule on `sim` to completion, checking everything; returns what the faults
    /// did.
    pub(super) fn run_with(sim: Sim, steps: &[Step]) -> Stats {
        Sim::run_filtered(sim, steps, |_, _| true)
    }

    /// [`run_with`](Sim::run_with), skipping the steps `applies` says do not apply (to a
    /// member that does not exist yet).
    pub(super) fn run_filtered(
        mut sim: Sim,
        steps: &[Step],
        applies: impl Fn(&Sim, &Step) -> bool,
    ) -> Stats {
        for step in steps {
            if !applies(&sim, step) {
                continue;
            }
            sim.apply(step);
            sim.check();
        }
        sim.settle();
        sim.check_complete();
        sim.gather();
        sim.stats
    }
}
