//! The network of the simulation: links as byte pipes between two members ([`SimLink`]),
//! what the IO thread does with its sockets (a connection made, bytes written and read,
//! EOF), and the faults on the network: a link cut with a prefix of its bytes in flight
//! surviving, frames replayed from earlier, a process's death closing its connections;
//! and the pump that moves every byte that can move.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use super::harness::Sim;
use super::member::{addr, Member, Side};
use crate::events::DisconnectReason as Why;
use crate::proto::{Input, LinkId};
use crate::wire;

/// One connection between two members: a byte pipe per direction.
#[derive(Debug)]
pub(super) struct SimLink {
    /// The dialler and the acceptor.
    pub(super) sides: [Side; 2],
    /// `ends[i]`: member `sides[i]`'s link id, until it closes its end.
    pub(super) ends: [Option<LinkId>; 2],
    /// `pipe[i]`: bytes member `sides[i]` wrote that the other has not read yet.
    pub(super) pipe: [VecDeque<u8>; 2],
    /// Member `sides[i]` closed its end: the other reads what is in the pipe, then EOF.
    pub(super) closed: [bool; 2],
    /// Broken: nothing more crosses.
    pub(super) cut: bool,
}

impl SimLink {
    pub(super) fn at(&self, side: Side) -> Option<usize> {
        self.sides.iter().position(|&s| s == side)
    }

    /// `side`'s end, while it holds it open.
    pub(super) fn end(&self, side: Side) -> Option<LinkId> {
        self.at(side).and_then(|i| self.ends[i])
    }

    /// The member at the other end from `side`.
    pub(super) fn peer_of(&self, side: Side) -> Side {
        if self.sides[0] == side {
            self.sides[1]
        } else {
            self.sides[0]
        }
    }

    /// The bytes `side` wrote that the other has not read yet.
    pub(super) fn from(&mut self, side: Side) -> &mut VecDeque<u8> {
        let i = self.at(side).expect("a member of the link");
        &mut self.pipe[i]
    }

    /// Whether the other end from `side` was closed.
    fn closed_by_peer(&self, side: Side) -> bool {
        self.at(side).is_some_and(|i| self.closed[1 - i])
    }

    /// Whether either member still holds its end.
    pub(super) fn open(&self) -> bool {
        self.ends.iter().any(Option::is_some)
    }
}

impl Sim {
    /// A fresh nonce.
    fn nonce(&mut self) -> wire::Nonce {
        self.nonces += 1;
        let mut n = [0u8; wire::NONCE_LEN];
        n[..8].copy_from_slice(&self.nonces.to_le_bytes());
        n
    }

    // ----- the IO thread's sockets ----------------------------------------------------------

    /// The oldest connection `side` asked for is made: a link with an end at each member
    /// (the other accepts it, if its admission rules do; a connection to a process that
    /// ended fails).
    pub(super) fn dial(&mut self, side: Side) -> bool {
        if self.m[side].dead {
            return false;
        }
        let Some((peer, to)) = self.m[side].dials.pop_front() else {
            return false;
        };
        // The live process listening there, else the one that did.
        let at: Vec<Side> = (0..self.m.len())
            .filter(|&s| self.m[s].addr == to)
            .collect();
        let target = *at
            .iter()
            .find(|&&s| !self.m[s].dead)
            .or(at.first())
            .expect("a member's address");
        let now = self.now();
        let (d, a) = (LinkId(self.next_link), LinkId(self.next_link + 1));
        self.next_link += 2;
        let l = self.links.len();
        self.links.push(SimLink {
            sides: [side, target],
            ends: [Some(d), Some(a)],
            pipe: Default::default(),
            closed: [false; 2],
            cut: false,
        });
        self.owner.insert((side, d), l);
        let (nd, na) = (self.nonce(), self.nonce());
        if self.m[target].dead {
            let sl = &mut self.links[l];
            sl.ends[1] = None;
            sl.closed[1] = true;
            let dialled = Input::Dialled {
                target: peer,
                link: d,
                nonce: nd,
            };
            self.m[side].ep.handle(now, dialled);
            let failed = Input::Failed {
                link: d,
                why: Why::Io,
            };
            self.m[side].ep.handle(now, failed);
            self.drain(side);
            return true;
        }
        self.owner.insert((target, a), l);
        let dialled = Input::Dialled {
            target: peer,
            link: d,
            nonce: nd,
        };
        self.m[side].ep.handle(now, dialled);
        let acceptor = &mut self.m[target].ep;
        let verdict = acceptor.verdict_on_accept(now, addr(side));
        if matches!(
            verdict,
            crate::proto::Verdict::SourceBurst | crate::proto::Verdict::Full
        ) {
            let failed = Input::Failed {
                link: d,
                why: Why::Io,
            };
            self.m[side].ep.handle(now, failed);
        } else {
            let accepted = Input::Accepted {
                link: a,
                from: addr(side),
                verdict,
                nonce: na,
            };
            acceptor.handle(now, accepted);
            self.m[side].ep.handle(now, Input::Connected(d));
        }
        self.drain(target);
        self.drain(side);
        true
    }

    /// The socket takes up to `n` bytes of `side`'s write buffer on link `l`; on a cut link,
    /// or one the other side closed, they are lost.
    pub(super) fn write(&mut self, side: Side, l: usize, n: usize) {
        let Some(id) = self.links[l].end(side) else {
            return;
        };
        let now = self.now();
        // (Every drain ends with the journal cut: what the buffer holds is gated already.)
        let Some(bytes) = self.m[side].ep.to_write(id) else {
            return;
        };
        let k = n.min(bytes.len());
        if k == 0 {
            return;
        }
        if self.links[l].cut || self.links[l].closed_by_peer(side) {
            self.stats.bytes_lost += k as u64;
        } else {
            let mut left = k;
            let mut taken = Vec::with_capacity(k);
            for s in bytes.slices() {
                let s = &s[..left.min(s.len())];
                taken.extend_from_slice(s);
                left -= s.len();
            }
            self.links[l].from(side).extend(taken);
        }
        self.m[side].ep.handle(now, Input::Wrote { link: id, n: k });
        self.drain(side);
    }

    /// `side` reads up to `n` bytes from link `l` and hands them to its endpoint; once the
    /// pipe is empty on a cut link, or one the other side closed, it reads EOF.
    pub(super) fn read(&mut self, side: Side, l: usize, n: usize) {
        let Some(id) = self.links[l].end(side) else {
            return;
        };
        let now = self.now();
        let from = self.links[l].peer_of(side);
        let input = self.links[l].from(from);
        let k = n.min(input.len());
        if k > 0 {
            let Some(link) = self.m[side].ep.link_mut(id) else {
                return;
            };
            if !link.wants_read() {
                return; // paused
            }
            link.read_buffer().extend(input.drain(..k));
            let cert = |_: &str| Ok(());
            self.m[side].ep.handle(
                now,
                Input::Read {
                    link: id,
                    cert: &cert,
                },
            );
        } else if self.links[l].cut || self.links[l].closed_by_peer(side) {
            let failed = Input::Failed {
                link: id,
                why: Why::PeerClosed,
            };
            self.m[side].ep.handle(now, failed);
        }
        self.drain(side);
    }
    /// Link `l` breaks: of the bytes in flight each way only the fraction `keep` arrives
    /// (`keep[0]` of those the member with the lower index wrote).
    pub(super) fn cut(&mut self, l: usize, mut keep: [u16; 2]) {
        let link = &mut self.links[l];
        link.cut = true;
        if link.sides[0] > link.sides[1] {
            keep.swap(0, 1);
        }
        for (pipe, keep) in link.pipe.iter_mut().zip(keep) {
            let kept = pipe.len() * usize::from(keep) / usize::from(u16::MAX);
            self.stats.bytes_lost += (pipe.len() - kept) as u64;
            pipe.truncate(kept);
        }
        self.stats.cuts += 1;
    }

    /// The process `side` ends: the system closes its connections (what it wrote arrives,
    /// then EOF; what it had not written is lost), and it does nothing more.
    pub(super) fn kill(&mut self, side: Side) {
        if std::mem::replace(&mut self.m[side].dead, true) {
            return;
        }
        self.stats.deaths += 1;
        self.m[side].dials.clear();
        for sl in &mut self.links {
            if let Some(i) = sl.at(side) {
                if let Some(id) = sl.ends[i].take() {
                    self.owner.remove(&(side, id));
                    sl.closed[i] = true;
                }
            }
        }
    }

    /// The link `side` speaks to its peer on delivers again data frames `side` already
    /// holds and an ack its peer wrote earlier — at a frame boundary: only when `side` has
    /// no partial frame buffered (then the pipe starts at one).
    pub(super) fn replay(&mut self, side: Side, back: u64, count: u64) {
        let Some(l) = self.pick_end(side, 0) else {
            return;
        };
        let Some(id) = self.links[l].end(side) else {
            return;
        };
        let Some(k) = self.m[side]
            .ep
            .link_mut(id)
            .filter(|k| k.established && k.rbuf.is_empty())
            .and_then(|k| k.peer)
        else {
            return;
        };
        if self.links[l].cut {
            return;
        }
        let from = self.links[l].peer_of(side);
        let received = self.m[side].desc_of(k).received();
        let first = received.saturating_sub(back).max(1);
        // What it holds from that process, by sequence number: its delivery log.
        let held: HashMap<u64, Bytes> = self.m[side]
            .delivered
            .lock()
            .expect("delivery log")
            .iter()
            .filter(|(_, b)| usize::from(b[0]) == from)
            .filter_map(|(seq, b)| Some(((*seq)?, b.clone())))
            .collect();
        let mut frames = Vec::new();
        for seq in first..=received.min(first + count) {
            let Some(p) = held.get(&seq) else {
                break;
            };
            wire::encode_data(&mut frames, wire::FLAG_RELIABLE, Some(seq), p);
            self.stats.replayed += 1;
        }
        // An ack of what the peer held at some earlier point: cumulative, so no news.
        let acked = self.m[side].desc_of(k).acked();
        if acked > 0 {
            wire::encode_ack(&mut frames, acked - 1, 0);
            self.stats.stale_acks += 1;
        }
        let pipe = self.links[l].from(from);
        for b in frames.into_iter().rev() {
            pipe.push_front(b);
        }
    }

    /// Moves every byte that can move until nothing does: the live members write and read
    /// all their links (the connections asked for are made), with no time passing.
    pub(super) fn pump(&mut self) {
        for _ in 0..1000 {
            let before = self.progress();
            for side in self.live() {
                while self.dial(side) {}
                for l in 0..self.links.len() {
                    self.write(side, l, usize::MAX);
                }
            }
            for side in self.live() {
                for l in 0..self.links.len() {
                    self.read(side, l, usize::MAX);
                }
            }
            if self.progress() == before {
                return;
            }
        }
        panic!("the members never went quiet");
    }

    /// A measure of activity: pipe bytes, buffered bytes, links, deliveries, acks.
    fn progress(&mut self) -> (usize, usize, usize, usize, u64) {
        let piped: usize = self
            .links
            .iter()
            .map(|l| l.pipe[0].len() + l.pipe[1].len() + usize::from(l.open()))
            .sum();
        let live = self.live();
        let buffered: usize = live
            .iter()
            .flat_map(|&s| self.m[s].ep.links().map(|l| l.unwritten() + l.rbuf.len()))
            .sum();
        let delivered = self.m.iter().map(Member::delivered_len).sum();
        let acks = live
            .iter()
            .flat_map(|&s| (0..self.m[s].peers.len()).map(move |k| (s, k)))
            .filter(|&(s, k)| !self.m[s].peers[k].forgotten)
            .map(|(s, k)| self.m[s].desc_of(k).acked())
            .sum();
        (piped, buffered, self.links.len(), delivered, acks)
    }
}
