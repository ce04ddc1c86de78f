//! What the simulation checks: per (sender process, receiver process) pair, after every
//! step and once the members have run clean.

use std::collections::HashMap;

use bytes::Bytes;

use super::harness::Sim;
use super::member::{Side, WINDOW};
use crate::proto::LinkId;
use crate::sync::SharedStr;

/// What the checks remember between steps.
#[derive(Default)]
pub(super) struct Oracle {
    /// Per receiving member, deliveries already checked.
    checked: HashMap<Side, usize>,
    /// Per (sender, receiver): the last delivery checked (message index, sequence number).
    cursor: HashMap<(Side, Side), (usize, u64)>,
    /// Per (sender, name it sent to): each message index delivered, and by which process.
    delivered_by: HashMap<(Side, SharedStr), HashMap<usize, Side>>,
    /// Per (sender, name it sent to): each message index reported undelivered, and the
    /// incarnation the sender was bound to when it reported it.
    reported: HashMap<(Side, SharedStr), HashMap<usize, Option<u64>>>,
    /// Per (member, peer): undelivered reports already checked.
    reports_checked: HashMap<(Side, usize), usize>,
    /// `[sent, acked, received, acks_sent]` per (member, peer, incarnation of the peer) at
    /// the last check.
    seen: HashMap<(Side, usize, Option<u64>), [u64; 4]>,
    /// Per (member, peer): the simulated link of the last established link seen speaking
    /// for the peer, and the peer's incarnation on it.
    held: HashMap<(Side, usize), (usize, u64)>,
    /// Times a member's peer went over from one incarnation's established link to
    /// another's.
    pub(super) takeovers: u64,
    /// Messages delivered by one incarnation and reported undelivered when its sender went
    /// over to another (the old one never acknowledged them).
    pub(super) delivered_then_dropped: u64,
}

/// Where a (member, peer) pair stands at the end.
#[derive(Debug, PartialEq, Eq)]
enum Pair {
    /// Nothing is owed: no live process has that name, or each is bound to another live
    /// process with the member's name, or one of the two replaced the other (which it
    /// refuses for good).
    Exempt,
    /// Not bound to a live process bound back to it yet.
    Waiting,
    /// Bound to live process `y`, which is bound back to it.
    Bound(Side),
}

/// A message's sender and index, from its bytes.
fn origin(b: &Bytes) -> (Side, usize) {
    let i = u32::from_le_bytes([b[1], b[2], b[3], b[4]]);
    (usize::from(b[0]), i as usize)
}

impl Sim {
    /// Whether two members claim one name.
    pub(super) fn twins(&self) -> bool {
        self.m
            .iter()
            .enumerate()
            .any(|(i, a)| self.m[..i].iter().any(|b| b.name == a.name))
    }

    /// No twins and no deaths: every message is owed its delivery, none is undelivered.
    fn strict(&self) -> bool {
        !self.twins() && self.stats.deaths == 0
    }

    /// The member named `name` with launch id `launch`.
    fn process(&self, name: &str, launch: Option<u64>) -> Option<Side> {
        let launch = launch?;
        (0..self.m.len()).find(|&s| self.m[s].name == name && self.m[s].launch == launch)
    }

    /// The process member `x`'s peer `k` is bound to, bound back to `x` (whether alive or
    /// not), with `y`'s index for `x`.
    fn mutual(&self, x: Side, k: usize) -> Option<(Side, usize)> {
        let known = &self.m[x].peers[k];
        let y = self.process(&known.name, self.m[x].desc_of(k).remote_launch())?;
        let back = self.m[y].known(self.m[x].name)?;
        (self.m[y].desc_of(back).remote_launch() == Some(self.m[x].launch)).then_some((y, back))
    }

    fn pair(&self, x: Side, k: usize) -> Pair {
        let (me, name) = (self.m[x].name, &self.m[x].peers[k].name);
        let live: Vec<Side> = self
            .live()
            .into_iter()
            .filter(|&s| *self.m[s].name == **name)
            .collect();
        if self.m[x].dead || live.is_empty() {
            return Pair::Exempt;
        }
        // Which process of our name each of them is bound to, if it is alive.
        let holds = |y: Side| {
            let back = self.m[y].known(me)?;
            self.process(me, self.m[y].desc_of(back).remote_launch())
                .filter(|&b| !self.m[b].dead)
        };
        // Whether the endpoint of `a` refuses process `b` (its peer `ka`) for good: an
        // incarnation it replaced.
        let replaced = |a: Side, ka: usize, b: Side| {
            self.m[a]
                .ep
                .peer(ka)
                .is_some_and(|p| p.replaced.contains(self.m[b].launch))
        };
        let shut_out = |y: Side| {
            replaced(x, k, y)
                || holds(y).is_some_and(|b| b != x)
                || self.m[y].known(me).is_some_and(|back| replaced(y, back, x))
        };
        if live.iter().all(|&y| shut_out(y)) {
            return Pair::Exempt; // another process of our name has it, or had it
        }
        match self
            .process(name, self.m[x].desc_of(k).remote_launch())
            .filter(|y| live.contains(y))
        {
            Some(y) if holds(y) == Some(x) => Pair::Bound(y),
            _ => Pair::Waiting,
        }
    }

    pub(super) fn check(&mut self) {
        for x in 0..self.m.len() {
            self.check_counters(x);
            self.check_links(x);
            self.check_deliveries(x);
            self.check_reports(x);
        }
    }

    /// The counters of each of `x`'s peers: their invariants, monotonic per incarnation,
    /// consistent with the process bound to (when it is bound back), and the journal ahead
    /// of what the peer holds.
    fn check_counters(&mut self, x: Side) {
        let who = self.m[x].name;
        for k in 0..self.m[x].peers.len() {
            if self.m[x].peers[k].forgotten {
                continue;
            }
            let d = self.m[x].desc_of(k);
            let now = [d.sent(), d.acked(), d.received(), d.acks_sent()];
            let name = self.m[x].peers[k].name.clone();
            assert!(now[0] >= now[1], "{who}/{name}: sent < acked: {now:?}");
            assert!(
                now[2] >= now[3],
                "{who}/{name}: received < acks_sent: {now:?}"
            );
            let seen = self
                .oracle
                .seen
                .entry((x, k, d.remote_launch()))
                .or_default();
            for (i, what) in ["sent", "acked", "received", "acks_sent"]
                .iter()
                .enumerate()
            {
                assert!(
                    now[i] >= seen[i],
                    "{who}/{name}: {what} went back: {seen:?} -> {now:?}"
                );
            }
            *seen = now;
            let Some((y, back)) = self.mutual(x, k) else {
                continue;
            };
            let (mine, theirs) = (self.m[x].desc_of(k), self.m[y].desc_of(back));
            assert!(
                mine.acked() <= theirs.received() && theirs.received() <= mine.sent(),
                "{who}: acked {} / {name} received {} / sent {}",
                mine.acked(),
                theirs.received(),
                mine.sent()
            );
            let m = &self.m[x];
            // After a journal failure too: nothing the journal lacks leaves then.
            if m.peers[k].shared.progress.is_some() {
                let journalled = m.journalled.get(&name).copied().unwrap_or(0);
                let held = theirs.received();
                assert!(
                    held <= journalled,
                    "{name} holds {who}'s message {held}, {who}'s journal only up to {journalled}: a message left before the journal held it"
                );
            }
        }
    }

    /// Established links: at most one per peer, the one that speaks for it; and the name
    /// goes over to another incarnation only once the link of the one that held it was cut,
    /// closed by that process, or the process ended.
    fn check_links(&mut self, x: Side) {
        let m = &self.m[x];
        if m.dead {
            return;
        }
        let mut per_peer: HashMap<usize, Vec<LinkId>> = HashMap::new();
        for l in m.ep.links().filter(|l| l.established) {
            per_peer
                .entry(l.peer.expect("an established link speaks for a peer"))
                .or_default()
                .push(l.id);
        }
        for (pid, est) in per_peer {
            let name = &m.peers[pid].name;
            assert!(
                est.len() <= 1,
                "{}: {} established links for {name}",
                m.name,
                est.len()
            );
            let p = m.ep.peer(pid).expect("peer");
            assert_eq!(
                p.link,
                Some(est[0]),
                "{}: an established link speaks for nobody",
                m.name
            );
            let Some(launch) = m.ep.links().find(|l| l.id == est[0]).and_then(|l| l.launch) else {
                continue;
            };
            let l = self.owner[&(x, est[0])];
            if let Some((l0, was)) = self.oracle.held.insert((x, pid), (l, launch)) {
                if was == launch {
                    continue;
                }
                self.oracle.takeovers += 1;
                let old = self
                    .process(name, Some(was))
                    .expect("a process held the name");
                let link = &self.links[l0];
                assert!(
                    self.m[old].dead || link.cut || link.end(old).is_none(),
                    "{}: '{name}' went over from incarnation {was:#x} to {launch:#x} while the link to {was:#x} was whole",
                    m.name
                );
            }
        }
    }

    /// Every delivery is the next message of its sender process to this one, byte for
    /// byte; none was delivered before under this name, or reported undelivered by its
    /// sender while bound to this process.
    fn check_deliveries(&mut self, x: Side) {
        let strict = self.strict();
        let who = self.m[x].name;
        let from = self.oracle.checked.get(&x).copied().unwrap_or(0);
        let delivered = self.m[x].delivered.lock().expect("log")[from..].to_vec();
        for (n, (seq, bytes)) in delivered.iter().enumerate() {
            let k = from + n;
            let (s, i) = origin(bytes);
            let sender = &self.m[s];
            let theirs = sender
                .known(who)
                .map(|kk| &sender.peers[kk].sent)
                .expect("sent by a member that knows it");
            assert_eq!(
                Some(bytes),
                theirs.get(i),
                "{who}: delivery {k} is not {}'s message {i}",
                sender.name
            );
            let by = self.oracle.delivered_by.entry((s, who.into())).or_default();
            if let Some(&first) = by.get(&i) {
                panic!(
                    "{who} (process {x}): {}'s (process {s}) message {i} delivered twice (first by process {first})",
                    sender.name
                );
            }
            by.insert(i, x);
            let launch = self.m[x].launch;
            if let Some(r) = self
                .oracle
                .reported
                .get(&(s, who.into()))
                .and_then(|r| r.get(&i))
            {
                if *r == Some(launch) {
                    panic!("{who} (process {x}): delivered {}'s message {i}, which its sender reported undelivered while bound to this process", sender.name);
                }
                self.oracle.delivered_then_dropped += 1;
            }
            match self.oracle.cursor.insert((s, x), (i, seq.unwrap_or(0))) {
                Some((li, lq)) => {
                    assert_eq!(
                        (i, *seq),
                        (li + 1, Some(lq + 1)),
                        "{who} (process {x}): delivery {k} is {}'s (process {s}) message {i} with seq {seq:?} after message {li} with seq {lq} (lost, duplicated or reordered)",
                        sender.name
                    );
                }
                None => {
                    assert_eq!(
                        *seq,
                        Some(1),
                        "{who}: the first delivery from process {s}'s seq"
                    );
                    if strict {
                        assert_eq!(
                            i, 0,
                            "{who}: the first delivery is {}'s message {i}",
                            sender.name
                        );
                    }
                }
            }
        }
        self.oracle.checked.insert(x, from + delivered.len());
    }

    /// What `x` reported undelivered: its own messages, none delivered by the process it
    /// was bound to when it reported them.
    fn check_reports(&mut self, x: Side) {
        let who = self.m[x].name;
        for k in 0..self.m[x].peers.len() {
            let known = &self.m[x].peers[k];
            let from = self
                .oracle
                .reports_checked
                .get(&(x, k))
                .copied()
                .unwrap_or(0);
            for (b, bound) in &known.undelivered[from..] {
                let (s, i) = origin(b);
                assert_eq!(s, x, "{who}: reported another member's message undelivered");
                let key = (x, known.name.clone());
                if let Some(&r) = self.oracle.delivered_by.get(&key).and_then(|d| d.get(&i)) {
                    if *bound == Some(self.m[r].launch) {
                        panic!(
                            "{who} (process {x}): reported its message {i} to '{}' undelivered, which process {r} (the one it was bound to) delivered",
                            known.name
                        );
                    }
                    self.oracle.delivered_then_dropped += 1;
                }
                self.oracle
                    .reported
                    .entry(key)
                    .or_default()
                    .insert(i, *bound);
            }
            self.oracle
                .reports_checked
                .insert((x, k), known.undelivered.len());
        }
    }

    /// Whether everything `x` sent its peer `k` was delivered (by some process of that
    /// name) or reported undelivered, its unacked queue is empty and its window whole.
    fn pair_done(&self, x: Side, k: usize) -> bool {
        let known = &self.m[x].peers[k];
        let key = (x, known.name.clone());
        let (by, rep) = (
            self.oracle.delivered_by.get(&key),
            self.oracle.reported.get(&key),
        );
        (0..known.sent.len()).all(|i| {
            by.is_some_and(|b| b.contains_key(&i)) || rep.is_some_and(|r| r.contains_key(&i))
        }) && self.m[x].desc_of(k).unacked_len() == 0
            && known.shared.outbox.window().available() == WINDOW
    }

    fn pairs(&self) -> Vec<(Side, usize)> {
        self.live()
            .into_iter()
            .flat_map(|x| {
                (0..self.m[x].peers.len())
                    .filter(move |&k| !self.m[x].peers[k].forgotten)
                    .map(move |k| (x, k))
            })
            .collect()
    }

    pub(super) fn complete(&self) -> bool {
        self.pairs()
            .into_iter()
            .all(|(x, k)| match self.pair(x, k) {
                Pair::Exempt => true,
                Pair::Waiting => false,
                Pair::Bound(_) => self.pair_done(x, k),
            })
    }

    /// The live members run clean until everything owed is delivered and acknowledged and
    /// every window is whole: links are read and written in full, time passes for delayed
    /// acks, reconnects and the tick's residual credit.
    pub(super) fn settle(&mut self) {
        for _ in 0..2000 {
            for s in self.live() {
                self.journal_catch_up(s);
            }
            self.pump();
            self.check();
            if self.complete() {
                return;
            }
            self.advance(5);
        }
        let state: Vec<String> = self
            .pairs()
            .into_iter()
            .map(|(x, k)| {
                let m = &self.m[x];
                format!(
                    "{} (process {x}) -> {}: {:?}, {:?}, delivered {}",
                    m.name,
                    m.peers[k].name,
                    self.pair(x, k),
                    m.desc_of(k),
                    m.delivered_len()
                )
            })
            .collect();
        panic!("no quiescence: {state:#?}");
    }

    pub(super) fn check_complete(&mut self) {
        self.check();
        let strict = self.strict();
        for (x, k) in self.pairs() {
            let m = &self.m[x];
            let known = &m.peers[k];
            let what = format!("{} (process {x}) -> {}", m.name, known.name);
            assert_eq!(
                known.connects_told,
                crate::peer::Counters::get(&known.shared.counters.connects),
                "{what}: told Connected once per connection"
            );
            let y = match self.pair(x, k) {
                Pair::Exempt => {
                    assert!(!strict, "{what}: exempt with no twin and no death");
                    continue;
                }
                Pair::Waiting => panic!("{what}: not settled"),
                Pair::Bound(y) => y,
            };
            if strict {
                let delivered: Vec<Bytes> = self.m[y]
                    .delivered
                    .lock()
                    .expect("log")
                    .iter()
                    .map(|(_, b)| b.clone())
                    .filter(|b| origin(b).0 == x)
                    .collect();
                assert_eq!(
                    delivered, known.sent,
                    "{what}: delivered exactly once, in order"
                );
                assert!(
                    known.undelivered.is_empty(),
                    "{what}: nothing reported undelivered"
                );
            }
            assert!(self.pair_done(x, k), "{what}: not everything delivered");
            assert_eq!(m.desc_of(k).unacked_len(), 0, "{what}: unacked left");
            assert_eq!(
                known.shared.outbox.window().available(),
                WINDOW,
                "{what}: permits not all back"
            );
        }
    }
}
