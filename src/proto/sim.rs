//! A two-member harness for the recovery protocol: the real [`Handshake`], the real
//! [`Descriptor`] and the real wire encoding, driven over an in-memory link with simulated
//! time. No sockets, no threads, no sleeps: quinn-proto's `Pair::drive()` is the model.
//!
//! ## What is simulated
//!
//! Two members, `alpha` (A) and `beta` (B). Each keeps what the IO thread keeps per peer
//! (`PeerIo` in `src/net/io.rs`): the recovery descriptor, the messages the application
//! sent and the IO thread has not yet published, the connection that speaks for the peer,
//! the ack timer and the ack encoded but not yet written. The functions under "the IO
//! thread" below are named after the `IoThread` methods they mirror and do what those do
//! with the handshake, the descriptor and the wire — nothing more:
//!
//! | here | `IoThread::` | what it does to recovery |
//! |---|---|---|
//! | [`Sim::dial`] | `dial` + `accept_all` | new link; the acceptor writes Hello |
//! | [`Sim::on_identified`] | `on_identified` | tie-break against the old link, `accept(received)` |
//! | [`Sim::establish`] | `establish` | `resume(peer_received)`: resend before anything new, then a forced ack |
//! | [`Sim::flush_peer`] | `flush_peer` | `publish` + `encode_data` while below the high-water mark |
//! | [`Sim::write_conn`] | `write_conn` | bytes leave; a drained buffer makes its ack count (`ack_written`) |
//! | [`Sim::read_conn`] | `read_conn` + `take_frames` | frames in; EOF closes |
//! | [`Sim::on_data`] | `on_data` | `Deliver` / `Duplicate` / gap |
//! | [`Sim::after_data`] | `after_data` | ack at the threshold, else arm the ack timer |
//! | [`Sim::write_ack`] | `write_ack` | cumulative ack + cumulative credit (`return_credit`) |
//! | [`Sim::on_ack`] | `on_ack` | `on_ack` + `on_credit` |
//! | [`Sim::close_conn`] | `close_conn` | the link is gone; an unwritten ack is owed again |
//! | [`Sim::advance`] | `fire_timers` (`AckDelay`) | the delayed ack |
//!
//! A *link* is one TCP connection: a byte pipe per direction. Each member holds an *end* of
//! it (`net::conn::Conn`): its handshake until established, its write buffer (encoded, not
//! yet handed to the socket) and its read buffer (read, not yet a whole frame).
//!
//! ## The recovery protocol, as driven here
//!
//! 1. **Handshake.** The acceptor writes Hello; the dialler checks it and answers
//!    HelloReply with how many of the acceptor's messages it holds; the acceptor answers
//!    Ready with how many of the dialler's it holds, and is established; the dialler is
//!    established on Ready.
//! 2. **Resume.** On establishing, each side retires from its unacked queue what the peer
//!    holds and writes the rest, in order, before any new message; then an ack (cumulative
//!    counts and credit totals, so an ack lost with the old link costs nothing).
//! 3. **Publish.** A message gets the next sequence number when the IO thread writes it,
//!    and stays in the unacked queue until acknowledged.
//! 4. **Receive.** The next sequence number is delivered; one at or below `received` is a
//!    duplicate and dropped; one beyond is a gap, a protocol error.
//! 5. **Ack.** Once `received` exceeds what the last ack covered by the threshold, or when
//!    the timer armed by the first unacknowledged message fires. `acks_sent` advances only
//!    once the write buffer holding the ack has drained.
//! 6. **Breaks.** A broken link loses its write buffers, the bytes in flight beyond the cut
//!    point and any partial frame in a read buffer. A side notices when it reads EOF (after
//!    what survived the cut); the side that noticed redials. The other may still hold the
//!    dead link (half-open) and reads its surviving bytes until the new link identifies at
//!    that side, which closes the old one: its unread bytes are lost, so an old link's
//!    frames never arrive after the new link's handshake.
//!
//! ## The knobs ([`Step`])
//!
//! - **drop**: [`Step::Cut`] cuts a link; of the bytes in flight each way only a prefix
//!   chosen at any byte offset arrives (mid-frame included), and writes to a cut link are
//!   lost. [`Step::Write`] / [`Step::Read`] move arbitrary byte counts, so frames are split
//!   everywhere.
//! - **duplicate**: [`Step::Replay`] has the link deliver again, at a frame boundary of the
//!   current connection, data frames the receiver already holds and an ack the peer wrote
//!   earlier: the descriptor must drop the data as duplicates and ignore the stale ack.
//! - **reorder across connections**: a side reads its half-open old link's surviving
//!   bytes whenever the schedule says, interleaved with the new link's handshake, up to the
//!   point where the new link identifies at that side; after that those bytes are lost.
//! - **time**: [`Step::Advance`] moves the simulated clock (a `u64`); ack timers fire.
//! - **authentication**: `Config::secret` gives both members the same secret, so every
//!   handshake carries nonces and MACs (the dialler then adopts a link only on an
//!   authenticated Ready, as `IoThread` does); schedules run with and without one.
//!   Different secrets are a scenario of their own: every dial is refused, nothing changes.
//!
//! ## What is checked
//!
//! After every step ([`Sim::check`]): `sent >= acked`, `received >= acks_sent`, all four
//! counters monotonic, the unacked queue is exactly `acked+1..=sent`, every sent message is
//! queued or published exactly once, a sender never retires what its peer lacks
//! (`acked <= peer.received <= sent`), credit never exceeds what the peer consumed, at most
//! one established end per member and it is the one that speaks for the peer. Every
//! delivery is checked on the spot against the sender's list (next in order, same bytes).
//! After the schedule the link runs clean until quiet ([`Sim::settle`]), and then every
//! message has been delivered exactly once, in order, on each side, every unacked queue is
//! empty and all credit has come back ([`Sim::check_complete`]).
//!
//! ## Not modelled
//!
//! Restarts (a new launch id), two dials in flight at once (one handshake at a time; the
//! tie-break is modelled only against an old link), Close frames (a closed end is EOF to
//! the other side), heartbeats and the idle timeout (a break is noticed by reading EOF),
//! credit returned in halves (`RecvCredit`: here all consumed bytes go in the next ack),
//! unreliable and out-of-band messages, the delivery pool.

use std::collections::VecDeque;

use bytes::Bytes;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

use super::{
    keep_new, Descriptor, Handshake, HsEvent, LocalIdentity, PeerIdentity, Receive, RecoveryError,
    Secret, TieBreak,
};
use crate::wire::{self, CloseCode, Frame};

/// A member: index into [`Sim::m`].
type Side = usize;
const A: Side = 0;
const B: Side = 1;
/// Member names; the tie-break compares them (`alpha` < `beta`).
const NAMES: [&str; 2] = ["alpha", "beta"];
const MAX_MESSAGE: usize = 1024;

fn other(s: Side) -> Side {
    1 - s
}

/// The IO thread's settings that matter to recovery.
#[derive(Clone, Copy, Debug)]
struct Config {
    /// Ack once this many received messages are not covered by an ack.
    ack_threshold: u64,
    /// Simulated ticks from the first unacknowledged message to the delayed ack.
    ack_delay: u64,
    /// Publishing stops while the write buffer holds this many bytes.
    high_water: usize,
    /// Both members have the same secret: every handshake is authenticated.
    secret: bool,
}

/// One member's end of a link (`net::conn::Conn`).
#[derive(Debug)]
struct End {
    /// Until established.
    hs: Option<Handshake>,
    established: bool,
    /// This member dialled the link (`Conn::dialled`).
    dialled: bool,
    /// Encoded, not yet handed to the link.
    wbuf: Vec<u8>,
    /// Read from the link, not yet a whole frame.
    rbuf: Vec<u8>,
}

impl End {
    fn new(hs: Handshake, dialled: bool, wbuf: Vec<u8>) -> End {
        End {
            hs: Some(hs),
            established: false,
            dialled,
            wbuf,
            rbuf: Vec::new(),
        }
    }
}

/// One TCP connection.
#[derive(Debug, Default)]
struct Link {
    /// `ends[s]`: member `s`'s end, until it closes it.
    ends: [Option<End>; 2],
    /// `pipe[s]`: bytes member `s` wrote that the other has not read yet.
    pipe: [VecDeque<u8>; 2],
    /// Broken: nothing more crosses; each end reads what survived, then EOF.
    cut: bool,
}

/// One member: the IO thread's state for its peer, and the application's view.
#[derive(Debug)]
struct Member {
    local: LocalIdentity,
    desc: Descriptor,
    /// Sent by the application, not yet published (the outbox and `PeerIo::pending`).
    outbox: VecDeque<Bytes>,
    /// The link that speaks for the peer (`PeerIo::conn`).
    conn: Option<usize>,
    /// When the armed ack timer fires (`PeerIo::ack_timer` and its `AckDelay` timer).
    ack_timer: Option<u64>,
    /// The received count of an ack encoded but not yet written (`PeerIo::ack_unwritten`).
    ack_unwritten: Option<u64>,
    /// Bytes delivered and not yet returned as credit.
    credit_pending: u64,
    /// Credit the peer has returned to us (the sum of `on_credit`).
    credited: u64,
    /// Every message the application sent, in order: the oracle.
    sent: Vec<Bytes>,
    /// Every message delivered to the application, in order.
    delivered: Vec<Bytes>,
    delivered_bytes: u64,
    /// Every ack encoded, `(received, credit total)`: material for stale replays.
    acks: Vec<(u64, u64)>,
}

impl Member {
    fn new(side: Side, secret: bool) -> Member {
        Member {
            local: LocalIdentity {
                launch_id: 0xA1 + side as u64,
                window: 1 << 16,
                max_message: MAX_MESSAGE as u32,
                cluster: "sim".into(),
                name: NAMES[side].into(),
                secret: secret.then(|| Secret::new(b"sim secret")),
            },
            desc: Descriptor::new(),
            outbox: VecDeque::new(),
            conn: None,
            ack_timer: None,
            ack_unwritten: None,
            credit_pending: 0,
            credited: 0,
            sent: Vec::new(),
            delivered: Vec::new(),
            delivered_bytes: 0,
            acks: Vec::new(),
        }
    }

    /// What the last ack covers, written or not (`after_data` / `write_ack`).
    fn ack_covered(&self) -> u64 {
        self.ack_unwritten.unwrap_or(0).max(self.desc.acks_sent())
    }
}

/// What the faults did, summed over runs to show the schedules reach every knob.
#[derive(Clone, Copy, Debug, Default)]
struct Stats {
    messages: u64,
    cuts: u64,
    /// Bytes lost: in flight beyond a cut, written to a dead link, left in a closed end.
    bytes_lost: u64,
    /// Partial frames thrown away with a closed end (a cut mid-frame).
    torn_frames: u64,
    /// Ends established (two per completed handshake).
    established: u64,
    resent: u64,
    /// Data frames replayed by the link.
    replayed: u64,
    /// Of those (and any other), dropped by `on_data` as duplicates.
    duplicates: u64,
    /// Older acks replayed by the link.
    stale_acks: u64,
    /// Messages delivered from a dead link's tail after the peer had dialled a new one.
    late_deliveries: u64,
    /// A redial closed by the tie-break in favour of the (dead) link it replaces.
    tie_break_refusals: u64,
    /// A live link closed by the tie-break in favour of a dead one read late.
    live_replaced: u64,
    /// Protocol errors raised by a dead link's remains (see [`Sim::protocol_error`]).
    stale_handshakes: u64,
    /// Handshakes refused for authentication (only when the members' secrets differ).
    auth_refusals: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.messages += o.messages;
        self.cuts += o.cuts;
        self.bytes_lost += o.bytes_lost;
        self.torn_frames += o.torn_frames;
        self.established += o.established;
        self.resent += o.resent;
        self.replayed += o.replayed;
        self.duplicates += o.duplicates;
        self.stale_acks += o.stale_acks;
        self.late_deliveries += o.late_deliveries;
        self.tie_break_refusals += o.tie_break_refusals;
        self.live_replaced += o.live_replaced;
        self.stale_handshakes += o.stale_handshakes;
    }
}

/// Why a connection is closed as a protocol error.
#[derive(Debug)]
enum Violation {
    Recovery(RecoveryError),
    Other(String),
}

/// One step of a schedule. Steps that do not apply in the current state do nothing.
#[derive(Clone, Debug)]
enum Step {
    /// The application of `side` sends a message with `len` bytes of filler.
    Send { side: Side, len: usize },
    /// `side`'s IO thread is woken to publish.
    Publish { side: Side },
    /// The socket takes up to `n` bytes of the write buffer of one of `side`'s ends.
    Write { side: Side, pick: usize, n: usize },
    /// `side` reads up to `n` bytes from one of its ends and handles the whole frames.
    Read { side: Side, pick: usize, n: usize },
    /// Simulated time passes.
    Advance { ticks: u64 },
    /// A live link breaks; of the bytes in flight each way, the fraction `keep / u16::MAX`
    /// (rounded down: any byte offset) arrives.
    Cut { pick: usize, keep: [u16; 2] },
    /// `side`'s reconnect timer fires: it dials, if it has no link for the peer and no
    /// handshake is in progress.
    Dial { side: Side },
    /// The link delivers to `side` again data frames it already holds (from `back` before
    /// its latest, `count` more after that) and an ack the peer wrote earlier.
    Replay { side: Side, back: u64, count: u64 },
}

#[derive(Debug)]
struct Sim {
    cfg: Config,
    now: u64,
    m: [Member; 2],
    links: Vec<Link>,
    max_len: usize,
    stats: Stats,
    /// `[sent, acked, received, acks_sent]` per member at the last check.
    seen: [[u64; 4]; 2],
    /// Bytes moved and ends closed so far: [`Sim::pump`] runs until it stops growing.
    moved: usize,
    /// Handshake nonces handed out: each one is fresh (a counter stands in for the OS's
    /// randomness, so schedules replay exactly).
    nonces: u64,
}

/// Both members, `side`'s first.
fn pair(m: &mut [Member; 2], side: Side) -> (&mut Member, &mut Member) {
    let (a, b) = m.split_at_mut(1);
    if side == A {
        (&mut a[0], &mut b[0])
    } else {
        (&mut b[0], &mut a[0])
    }
}

impl Sim {
    fn new(cfg: Config) -> Sim {
        Sim {
            cfg,
            now: 0,
            m: [Member::new(A, cfg.secret), Member::new(B, cfg.secret)],
            links: Vec::new(),
            max_len: wire::max_frame_len(MAX_MESSAGE),
            stats: Stats::default(),
            seen: [[0; 4]; 2],
            moved: 0,
            nonces: 0,
        }
    }

    /// A fresh nonce.
    fn nonce(&mut self) -> wire::Nonce {
        self.nonces += 1;
        let mut n = [0u8; wire::NONCE_LEN];
        n[..8].copy_from_slice(&self.nonces.to_le_bytes());
        n
    }

    fn apply(&mut self, step: &Step) {
        match *step {
            Step::Send { side, len } => self.send(side, len),
            Step::Publish { side } => self.flush_peer(side),
            Step::Write { side, pick, n } => {
                if let Some(l) = self.pick_end(side, pick) {
                    self.write_conn(side, l, n);
                }
            }
            Step::Read { side, pick, n } => {
                if let Some(l) = self.pick_end(side, pick) {
                    self.read_conn(side, l, n);
                }
            }
            Step::Advance { ticks } => self.advance(ticks),
            Step::Cut { pick, keep } => {
                let live: Vec<usize> = (0..self.links.len())
                    .filter(|&l| !self.links[l].cut)
                    .collect();
                if !live.is_empty() {
                    self.cut(live[pick % live.len()], keep);
                }
            }
            Step::Dial { side } => {
                self.dial(side);
            }
            Step::Replay { side, back, count } => self.replay(side, back, count),
        }
    }

    /// The `pick`-th (modulo) link `side` still holds an end of.
    fn pick_end(&self, side: Side, pick: usize) -> Option<usize> {
        let open: Vec<usize> = (0..self.links.len())
            .filter(|&l| self.links[l].ends[side].is_some())
            .collect();
        (!open.is_empty()).then(|| open[pick % open.len()])
    }

    /// A live link with a handshake in progress at either end.
    fn handshaking(&self) -> bool {
        self.links
            .iter()
            .any(|l| !l.cut && l.ends.iter().flatten().any(|e| e.hs.is_some()))
    }

    // ----- the application ---------------------------------------------------------------

    /// Sends message number `i` of `side`: its side, its number, then `len` filler bytes, so
    /// that every message's bytes are distinct.
    fn send(&mut self, side: Side, len: usize) {
        let m = &mut self.m[side];
        let i = m.sent.len() as u32;
        let mut p = Vec::with_capacity(5 + len);
        p.push(side as u8);
        p.extend_from_slice(&i.to_le_bytes());
        p.resize(5 + len, i as u8);
        let p = Bytes::from(p);
        m.sent.push(p.clone());
        m.outbox.push_back(p);
        self.stats.messages += 1;
    }

    // ----- the IO thread -----------------------------------------------------------------

    /// `side` dials its peer, which accepts at once and writes Hello. One handshake at a
    /// time: simultaneous dials are the lifecycle's business, not recovery's.
    fn dial(&mut self, side: Side) -> bool {
        if self.m[side].conn.is_some() || self.handshaking() {
            return false;
        }
        let mut hello = Vec::new();
        let (na, nd) = (self.nonce(), self.nonce());
        let acceptor = Handshake::acceptor(self.m[other(side)].local.clone(), na, &mut hello);
        let dialler = Handshake::dialler(self.m[side].local.clone(), NAMES[other(side)].into(), nd);
        let mut link = Link::default();
        link.ends[side] = Some(End::new(dialler, true, Vec::new()));
        link.ends[other(side)] = Some(End::new(acceptor, false, hello));
        self.links.push(link);
        self.m[side].conn = Some(self.links.len() - 1);
        true
    }

    /// Publishes `side`'s queued messages while the write buffer is below the high-water
    /// mark: each gets its sequence number and enters the unacked queue here.
    fn flush_peer(&mut self, side: Side) {
        let m = &mut self.m[side];
        let Some(l) = m.conn else { return };
        let Some(end) = self.links[l].ends[side].as_mut() else {
            return;
        };
        if !end.established {
            return;
        }
        while end.wbuf.len() < self.cfg.high_water {
            let Some(payload) = m.outbox.pop_front() else {
                break;
            };
            let u = m.desc.publish(wire::FLAG_RELIABLE, payload);
            wire::encode_data(&mut end.wbuf, u.flags, Some(u.seq), &u.payload);
        }
    }

    /// The socket takes up to `n` bytes of `side`'s write buffer on link `l`; on a cut link
    /// they are lost. A drained buffer makes its ack count as sent.
    fn write_conn(&mut self, side: Side, l: usize, n: usize) {
        let link = &mut self.links[l];
        let Some(end) = link.ends[side].as_mut() else {
            return;
        };
        let k = n.min(end.wbuf.len());
        self.moved += k;
        let bytes = end.wbuf.drain(..k);
        if link.cut {
            self.stats.bytes_lost += k as u64;
            drop(bytes);
        } else {
            link.pipe[side].extend(bytes);
        }
        let (drained, established) = (end.wbuf.is_empty(), end.established);
        let low = end.wbuf.len() < self.cfg.high_water / 2;
        let m = &mut self.m[side];
        if drained && established && m.conn == Some(l) {
            if let Some(r) = m.ack_unwritten.take() {
                m.desc.ack_written(r);
            }
        }
        if low && established && !m.outbox.is_empty() {
            self.flush_peer(side);
        }
    }

    /// `side` reads up to `n` bytes from link `l` and handles every whole frame; with
    /// nothing left to read on a cut link it reads EOF and closes its end.
    fn read_conn(&mut self, side: Side, l: usize, n: usize) {
        let link = &mut self.links[l];
        let Some(end) = link.ends[side].as_mut() else {
            return;
        };
        let input = &mut link.pipe[other(side)];
        if input.is_empty() {
            if link.cut {
                self.close_conn(side, l);
            }
            return;
        }
        let k = n.min(input.len());
        self.moved += k;
        end.rbuf.extend(input.drain(..k));
        let mut frames = Vec::new();
        let mut bad = None;
        loop {
            match wire::peek_len(&end.rbuf, self.max_len) {
                Ok(Some(len)) if end.rbuf.len() >= wire::LEN_BYTES + len => {
                    frames.push(end.rbuf.drain(..wire::LEN_BYTES + len).collect::<Vec<u8>>());
                }
                Ok(_) => break,
                Err(e) => {
                    bad = Some(e);
                    break;
                }
            }
        }
        self.handle_inbound(side, l, frames);
        if let Some(e) = bad {
            if self.links[l].ends[side].is_some() {
                self.protocol_error(side, l, Violation::Other(e.to_string()));
            }
        }
    }

    /// Handles frames read from link `l` in order; after any data, `after_data` once.
    fn handle_inbound(&mut self, side: Side, l: usize, frames: Vec<Vec<u8>>) {
        let mut data = false;
        for bytes in frames {
            let Some(end) = self.links[l].ends[side].as_ref() else {
                break; // closed by an earlier frame
            };
            let established = end.established;
            let frame = match wire::decode(&bytes, self.max_len) {
                Ok(Some((f, _))) => f,
                other => {
                    let v = Violation::Other(format!("undecodable frame: {other:?}"));
                    self.protocol_error(side, l, v);
                    break;
                }
            };
            match frame {
                Frame::Data {
                    seq: Some(seq),
                    payload,
                    ..
                } if established => {
                    data = true;
                    if !self.on_data(side, l, seq, payload) {
                        break;
                    }
                }
                Frame::Data { .. } => {
                    let v = Violation::Other("data before the handshake, or unreliable".into());
                    self.protocol_error(side, l, v);
                    break;
                }
                f => self.on_frame(side, l, f),
            }
        }
        if data {
            self.after_data(side);
        }
    }

    /// A handshake frame, or a control frame on an established link.
    fn on_frame(&mut self, side: Side, l: usize, frame: Frame<'_>) {
        let end = self.links[l].ends[side].as_mut().expect("end is open");
        if let Some(hs) = end.hs.as_mut() {
            match hs.on_frame(&frame) {
                // The harness sends reliable messages only: unreliable counts stay zero.
                Ok(HsEvent::Identified {
                    peer,
                    peer_received,
                    peer_connections,
                    ..
                }) => self.on_identified(side, l, peer, peer_received, peer_connections),
                Ok(HsEvent::Established { peer_received, .. }) => {
                    self.on_established(side, l, peer_received)
                }
                Err(e)
                    if e.code == CloseCode::Auth
                        && self.m[A].local.secret != self.m[B].local.secret =>
                {
                    self.stats.auth_refusals += 1;
                    self.close_conn(side, l);
                }
                Err(e) => self.protocol_error(side, l, Violation::Other(e.to_string())),
            }
            return;
        }
        match frame {
            Frame::Ack { received, credit } => self.on_ack(side, l, received, credit),
            f => {
                let v = Violation::Other(format!("{f:?} after the handshake"));
                self.protocol_error(side, l, v)
            }
        }
    }

    /// The peer said who it is on link `l`. The acceptor (the dialler authenticated by
    /// now) adopts the link and answers Ready; the dialler (Hello proves nothing yet) only
    /// answers, with its counts for the incarnation named, and adopts the link on Ready.
    fn on_identified(
        &mut self,
        side: Side,
        l: usize,
        peer: PeerIdentity,
        peer_received: Option<u64>,
        peer_connections: Option<u64>,
    ) {
        assert_eq!(peer.name, NAMES[other(side)]);
        let counts = match peer_received {
            Some(_) => match self.adopt(side, l, &peer, true, peer_connections) {
                Some(c) => c,
                None => return,
            },
            None => {
                let d = &self.m[side].desc;
                (
                    d.received_from(peer.launch_id),
                    d.connections_with(peer.launch_id),
                )
            }
        };
        let End { hs, wbuf, .. } = self.links[l].ends[side].as_mut().expect("end is open");
        hs.as_mut()
            .expect("handshaking")
            .accept(counts.0, counts.1, 0, wbuf);
        if let Some(peer_received) = peer_received {
            self.establish(side, l, peer_received);
        }
    }

    /// Dialler: Ready arrived (authenticated, with a secret): adopt the link, establish.
    fn on_established(&mut self, side: Side, l: usize, peer_received: u64) {
        let end = self.links[l].ends[side].as_ref().expect("end is open");
        let peer = end
            .hs
            .as_ref()
            .and_then(|h| h.peer())
            .cloned()
            .expect("identified before Ready");
        if self.adopt(side, l, &peer, false, None).is_some() {
            self.establish(side, l, peer_received);
        }
    }

    /// Link `l` speaks for the peer from now on (`IoThread::adopt`): if another link does,
    /// the tie-break decides which one stays. Returns our counts (received, connections)
    /// or `None` if `l` lost.
    fn adopt(
        &mut self,
        side: Side,
        l: usize,
        peer: &PeerIdentity,
        accepting: bool,
        peer_connections: Option<u64>,
    ) -> Option<(u64, u64)> {
        if let Some(old) = self.m[side].conn.filter(|&o| o != l) {
            if let Some(old_end) = self.links[old].ends[side].as_ref() {
                // Same launch id (no restarts here), so `io.rs`'s `stale` is false.
                let keep_new = keep_new(TieBreak {
                    stale: false,
                    new_by_us: !accepting,
                    old_by_us: old_end.dialled,
                    old_established: old_end.established,
                    we_are_smaller: NAMES[side] < NAMES[other(side)],
                    our_connections: self.m[side].desc.connections(),
                    peer_connections,
                });
                if keep_new {
                    if !self.links[old].cut {
                        self.stats.live_replaced += 1;
                    }
                    self.close_conn(side, old);
                } else {
                    self.stats.tie_break_refusals += 1;
                    self.close_conn(side, l);
                    return None;
                }
            }
        }
        let m = &mut self.m[side];
        assert!(
            m.desc.bind(peer.launch_id).is_empty(),
            "same incarnation: nothing retired"
        );
        m.conn = Some(l);
        Some((m.desc.received(), m.desc.connections()))
    }

    /// The handshake completed on link `l`: resend what the peer lacks, in order, then an
    /// ack if one may have been lost, then new messages.
    fn establish(&mut self, side: Side, l: usize, peer_received: u64) {
        if self.m[side].conn != Some(l) {
            return self.close_conn(side, l); // superseded
        }
        let Sim {
            m, links, stats, ..
        } = self;
        let m = &mut m[side];
        let end = links[l].ends[side].as_mut().expect("end is open");
        end.hs = None;
        end.established = true;
        let resumed = match m.desc.resume(peer_received) {
            Ok(rest) => {
                for u in rest {
                    wire::encode_data(&mut end.wbuf, u.flags, Some(u.seq), &u.payload);
                    stats.resent += 1;
                }
                Ok(())
            }
            Err(e) => Err(e),
        };
        if let Err(e) = resumed {
            return self.protocol_error(side, l, Violation::Recovery(e));
        }
        self.stats.established += 1;
        let m = &self.m[side];
        if m.credit_pending > 0 || m.desc.ack_owed() || m.desc.credit_returned() > 0 {
            self.write_ack(side, true);
        }
        self.flush_peer(side);
    }

    /// A reliable data frame on an established link. Checks every delivery against the
    /// sender's list on the spot. Returns whether the link is still open.
    fn on_data(&mut self, side: Side, l: usize, seq: u64, payload: &[u8]) -> bool {
        let (me, peer) = pair(&mut self.m, side);
        match me.desc.on_data(seq) {
            Ok(Receive::Deliver) => {
                let (to, from) = (NAMES[side], NAMES[other(side)]);
                assert!(
                    seq <= peer.desc.sent(),
                    "{to} delivered seq {seq}, but {from} published only {}",
                    peer.desc.sent()
                );
                assert_eq!(
                    me.delivered.len() as u64 + 1,
                    seq,
                    "{to} delivered seq {seq} out of order"
                );
                assert_eq!(
                    payload,
                    &peer.sent[seq as usize - 1][..],
                    "{to} delivered as seq {seq} something {from} did not send as its message {seq}"
                );
                me.delivered.push(Bytes::copy_from_slice(payload));
                me.delivered_bytes += payload.len() as u64;
                me.credit_pending += payload.len() as u64;
                if self.links[l].cut && l + 1 < self.links.len() {
                    self.stats.late_deliveries += 1;
                }
                true
            }
            Ok(Receive::Duplicate) => {
                self.stats.duplicates += 1;
                true
            }
            Err(e) => {
                self.protocol_error(side, l, Violation::Recovery(e));
                false
            }
        }
    }

    /// Ack now if the threshold is reached, else make sure the ack timer is armed.
    fn after_data(&mut self, side: Side) {
        let m = &mut self.m[side];
        if m.desc.received() - m.ack_covered() >= self.cfg.ack_threshold {
            self.write_ack(side, false);
        } else if m.desc.ack_owed() && m.ack_timer.is_none() {
            m.ack_timer = Some(self.now + self.cfg.ack_delay);
        }
    }

    /// Encodes an ack (received count, credit total) on the established link, if anything
    /// is owed or `force`. It counts as sent only once written ([`Sim::write_conn`]).
    fn write_ack(&mut self, side: Side, force: bool) {
        let m = &mut self.m[side];
        let Some(l) = m.conn else { return };
        let Some(end) = self.links[l].ends[side].as_mut() else {
            return;
        };
        if !end.established {
            return;
        }
        let received = m.desc.received();
        if m.credit_pending == 0 && received <= m.ack_covered() && !force {
            return;
        }
        let total = m.desc.return_credit(std::mem::take(&mut m.credit_pending));
        wire::encode_ack(&mut end.wbuf, received, total);
        m.ack_unwritten = Some(received);
        m.acks.push((received, total));
    }

    fn on_ack(&mut self, side: Side, l: usize, received: u64, credit: u64) {
        let m = &mut self.m[side];
        if let Err(e) = m.desc.on_ack(received) {
            return self.protocol_error(side, l, Violation::Recovery(e));
        }
        m.credited += m.desc.on_credit(credit);
    }

    /// `side` closes its end of link `l`: its write buffer, its partial frame and whatever
    /// it had not read are lost; the other end reads what `side` wrote, then EOF.
    fn close_conn(&mut self, side: Side, l: usize) {
        let link = &mut self.links[l];
        let Some(end) = link.ends[side].take() else {
            return;
        };
        self.moved += 1;
        if !end.rbuf.is_empty() {
            self.stats.torn_frames += 1;
        }
        let unread = &mut link.pipe[other(side)];
        self.stats.bytes_lost += (end.wbuf.len() + end.rbuf.len() + unread.len()) as u64;
        unread.clear();
        link.cut = true;
        let m = &mut self.m[side];
        if m.conn == Some(l) {
            m.conn = None;
            m.ack_unwritten = None; // lost with the link: owed again
        }
    }

    /// A protocol error closes the link. An honest run may raise exactly one kind, on a dead
    /// link: a handshake read late from a dead link's remains whose received count is older
    /// than acks processed since (`AckWentBack`). Anything else fails the test.
    fn protocol_error(&mut self, side: Side, l: usize, v: Violation) {
        let cut = self.links[l].cut;
        let (benign, what) = match v {
            Violation::Recovery(e) => (
                matches!(e, RecoveryError::AckWentBack { .. }),
                e.to_string(),
            ),
            Violation::Other(what) => (false, what),
        };
        assert!(
            cut && benign,
            "{}: protocol error on link {l} (cut: {cut}): {what}",
            NAMES[side]
        );
        self.stats.stale_handshakes += 1;
        self.close_conn(side, l);
    }

    /// Simulated time passes; a due ack timer fires.
    fn advance(&mut self, ticks: u64) {
        self.now += ticks;
        for side in [A, B] {
            if self.m[side].ack_timer.is_some_and(|t| t <= self.now) {
                self.m[side].ack_timer = None;
                self.write_ack(side, false);
            }
        }
    }

    // ----- the link's faults ------------------------------------------------------------

    /// Link `l` breaks. Of the bytes in flight each way only a prefix arrives, cut at any
    /// byte offset.
    fn cut(&mut self, l: usize, keep: [u16; 2]) {
        let link = &mut self.links[l];
        link.cut = true;
        for (pipe, keep) in link.pipe.iter_mut().zip(keep) {
            let len = pipe.len();
            let k = (len as u64 * u64::from(keep) / u64::from(u16::MAX)) as usize;
            pipe.truncate(k);
            self.stats.bytes_lost += (len - k) as u64;
        }
        self.stats.cuts += 1;
    }

    /// The link delivers to `side`, at a frame boundary of its established connection,
    /// data frames it already holds (a resend that overlaps) and an ack its peer wrote
    /// earlier.
    fn replay(&mut self, side: Side, back: u64, count: u64) {
        let me = &self.m[side];
        let Some(l) = me.conn else { return };
        let Some(end) = self.links[l].ends[side].as_ref() else {
            return;
        };
        if !end.established || !end.rbuf.is_empty() {
            return; // not at a frame boundary
        }
        let peer = &self.m[other(side)];
        let mut frames = Vec::new();
        let received = me.desc.received();
        if received > 0 {
            let first = received - back % received;
            for seq in first..=(first + count).min(received) {
                let mut f = Vec::new();
                let payload = &peer.sent[seq as usize - 1];
                wire::encode_data(&mut f, wire::FLAG_RELIABLE, Some(seq), payload);
                frames.push(f);
                self.stats.replayed += 1;
            }
        }
        if !peer.acks.is_empty() {
            let (r, credit) = peer.acks[back as usize % peer.acks.len()];
            let mut f = Vec::new();
            wire::encode_ack(&mut f, r, credit);
            frames.push(f);
            self.stats.stale_acks += 1;
        }
        self.handle_inbound(side, l, frames);
    }

    // ----- checks ------------------------------------------------------------------------

    /// The invariants that hold after every step.
    fn check(&mut self) {
        for side in [A, B] {
            let (me, peer) = (&self.m[side], &self.m[other(side)]);
            let d = &me.desc;
            let name = NAMES[side];
            let now = [d.sent(), d.acked(), d.received(), d.acks_sent()];
            assert!(d.sent() >= d.acked(), "{name}: acked beyond sent: {now:?}");
            assert!(
                d.received() >= d.acks_sent(),
                "{name}: acks_sent beyond received: {now:?}"
            );
            for (i, what) in ["sent", "acked", "received", "acks_sent"]
                .iter()
                .enumerate()
            {
                assert!(
                    now[i] >= self.seen[side][i],
                    "{name}: {what} went back from {} to {}",
                    self.seen[side][i],
                    now[i]
                );
            }
            self.seen[side] = now;
            assert_eq!(
                d.unacked_len() as u64,
                d.sent() - d.acked(),
                "{name}: unacked queue"
            );
            assert_eq!(
                d.sent() as usize + me.outbox.len(),
                me.sent.len(),
                "{name}: a message published twice or never queued"
            );
            assert_eq!(me.delivered.len() as u64, d.received(), "{name}: delivered");
            assert!(
                d.acked() <= peer.desc.received(),
                "{name} retired messages {} has not received: acked {} > received {}",
                NAMES[other(side)],
                d.acked(),
                peer.desc.received()
            );
            assert!(peer.desc.received() <= d.sent());
            assert!(
                me.credited <= peer.delivered_bytes,
                "{name}: credit beyond what was consumed"
            );
            let established: Vec<usize> = (0..self.links.len())
                .filter(|&l| {
                    self.links[l].ends[side]
                        .as_ref()
                        .is_some_and(|e| e.established)
                })
                .collect();
            assert!(
                established.is_empty() || established == [me.conn.unwrap_or(usize::MAX)],
                "{name}: established ends {established:?}, speaking for the peer {:?}",
                me.conn
            );
        }
    }

    /// Writes and reads everything, EOFs included, until nothing moves.
    fn pump(&mut self) {
        self.pump_links(0..usize::MAX);
    }

    /// [`Sim::pump`] on the links in `only`.
    fn pump_links(&mut self, only: std::ops::Range<usize>) {
        for _ in 0..10_000 {
            let before = self.moved;
            for l in only.start..only.end.min(self.links.len()) {
                for side in [A, B] {
                    self.write_conn(side, l, usize::MAX);
                    self.read_conn(side, l, usize::MAX);
                }
            }
            self.check();
            if self.moved == before {
                return;
            }
        }
        panic!("pump: traffic never stops");
    }

    /// The schedule is over: the link runs clean (reconnecting whoever lost its link,
    /// firing ack timers) until everything is delivered and acknowledged.
    fn settle(&mut self) {
        for _ in 0..1_000 {
            if self.quiet() {
                return;
            }
            self.pump();
            if let Some(side) = [A, B].into_iter().find(|&s| self.m[s].conn.is_none()) {
                self.dial(side);
            }
            self.pump();
            self.flush_peer(A);
            self.flush_peer(B);
            self.pump();
            self.advance(self.cfg.ack_delay);
            self.check();
        }
        panic!(
            "did not settle: alpha {:?}, beta {:?}",
            self.m[A].desc, self.m[B].desc
        );
    }

    fn quiet(&self) -> bool {
        let idle = self.m.iter().all(|m| {
            m.outbox.is_empty()
                && m.desc.unacked_len() == 0
                && m.ack_unwritten.is_none()
                && m.credit_pending == 0
        });
        let done = [A, B].iter().all(|&s| {
            let peer = &self.m[other(s)];
            self.m[s].delivered.len() == peer.sent.len()
                && self.m[s].credited == peer.delivered_bytes
        });
        let empty = self.links.iter().all(|l| {
            l.pipe.iter().all(VecDeque::is_empty)
                && l.ends.iter().flatten().all(|e| e.wbuf.is_empty())
        });
        idle && done && empty
    }

    /// After [`Sim::settle`]: exactly once, in order, everything acknowledged and credited.
    fn check_complete(&self) {
        for side in [A, B] {
            let (me, peer) = (&self.m[side], &self.m[other(side)]);
            assert_eq!(
                me.delivered,
                peer.sent,
                "{} did not get {}'s messages exactly once, in order",
                NAMES[side],
                NAMES[other(side)]
            );
            assert_eq!(me.desc.sent(), me.sent.len() as u64);
            assert_eq!(me.desc.acked(), me.desc.sent(), "{} unacked", NAMES[side]);
            assert_eq!(me.desc.unacked_len(), 0);
            assert_eq!(
                me.credited, peer.delivered_bytes,
                "credit did not all come back"
            );
        }
    }

    /// Runs a schedule to completion, checking everything; returns what the faults did.
    fn run(cfg: Config, steps: &[Step]) -> Stats {
        let mut sim = Sim::new(cfg);
        for step in steps {
            sim.apply(step);
            sim.check();
        }
        sim.settle();
        sim.check_complete();
        sim.stats
    }
}

// ----- schedules -------------------------------------------------------------------------

fn config() -> impl Strategy<Value = Config> {
    (1u64..=8, 1u64..=32, 2usize..=400, any::<bool>()).prop_map(
        |(ack_threshold, ack_delay, high_water, secret)| Config {
            ack_threshold,
            ack_delay,
            high_water,
            secret,
        },
    )
}

fn side() -> impl Strategy<Value = Side> {
    0..2usize
}

/// Byte counts for a write or read: small (frames split everywhere), medium, everything.
fn amount() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..24, 24usize..256, Just(usize::MAX)]
}

/// One step; `cut` weighs breaks against 32 for everything else.
fn step(cut: u32) -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (side(), 0usize..48).prop_map(|(side, len)| Step::Send { side, len }),
        2 => side().prop_map(|side| Step::Publish { side }),
        8 => (side(), any::<usize>(), amount())
            .prop_map(|(side, pick, n)| Step::Write { side, pick, n }),
        8 => (side(), any::<usize>(), amount())
            .prop_map(|(side, pick, n)| Step::Read { side, pick, n }),
        3 => (1u64..16).prop_map(|ticks| Step::Advance { ticks }),
        cut => (any::<usize>(), any::<[u16; 2]>()).prop_map(|(pick, keep)| Step::Cut { pick, keep }),
        4 => side().prop_map(|side| Step::Dial { side }),
        1 => (side(), 0u64..8, 0u64..4)
            .prop_map(|(side, back, count)| Step::Replay { side, back, count }),
    ]
}

fn schedule(cut: u32, len: usize) -> impl Strategy<Value = (Config, Vec<Step>)> {
    (config(), proptest::collection::vec(step(cut), 1..len))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Random messages both ways, random partial writes and reads, cuts at random byte
    /// offsets (mid-frame included), half-open links read late, replays, random ack
    /// thresholds and delays: every message is delivered exactly once, in order, on each
    /// side, and the counters hold their invariants at every step.
    #[test]
    fn any_cut_point_loses_nothing_and_duplicates_nothing((cfg, steps) in schedule(1, 400)) {
        Sim::run(cfg, &steps);
    }

    /// The same under a storm of cuts (about one step in seven breaks a link), handshakes
    /// included: cuts land mid-handshake and mid-resend.
    #[test]
    fn cut_storms_lose_nothing_and_duplicate_nothing((cfg, steps) in schedule(5, 250)) {
        Sim::run(cfg, &steps);
    }
}

/// The property tests are only as good as the schedules: 400 of them (deterministic seed)
/// must reach every knob — cuts, torn frames, resends, duplicates, stale acks, late
/// deliveries from a half-open link, tie-break refusals.
#[test]
fn schedules_reach_every_knob() {
    let mut runner = TestRunner::deterministic();
    let mut total = Stats::default();
    for i in 0..400 {
        let strategy = if i % 2 == 0 {
            schedule(1, 400).boxed()
        } else {
            schedule(5, 250).boxed()
        };
        let (cfg, steps) = strategy.new_tree(&mut runner).unwrap().current();
        total.add(&Sim::run(cfg, &steps));
    }
    println!("400 schedules: {total:#?}");
    let s = total;
    for (what, n) in [
        ("cuts", s.cuts),
        ("bytes lost", s.bytes_lost),
        ("torn frames", s.torn_frames),
        ("resent", s.resent),
        ("replayed", s.replayed),
        ("duplicates dropped", s.duplicates),
        ("stale acks", s.stale_acks),
        ("late deliveries", s.late_deliveries),
        ("tie-break refusals", s.tie_break_refusals),
    ] {
        assert!(n > 0, "no schedule reached {what}: {s:#?}");
    }
    assert!(
        s.established > 2 * 400,
        "no reconnect beyond one link per schedule: {s:#?}"
    );
}

// ----- scenarios: the protocol step by step ----------------------------------------------

fn cfg(ack_threshold: u64) -> Config {
    Config {
        ack_threshold,
        ack_delay: 10,
        high_water: 1 << 16,
        secret: false,
    }
}

/// Dials from `side` and runs the handshake to the end.
fn connect(sim: &mut Sim, side: Side) {
    assert!(sim.dial(side));
    sim.pump();
    let l = sim.links.len() - 1;
    assert!(sim.links[l].ends.iter().flatten().all(|e| e.established));
}

fn send_n(sim: &mut Sim, side: Side, n: usize) {
    for _ in 0..n {
        sim.send(side, 3);
    }
    sim.flush_peer(side);
}

fn data_len() -> usize {
    wire::data_frame_len(true, 5 + 3)
}

/// No faults: the three handshake frames, then data both ways; the threshold acks at once,
/// the timer acks the remainder, and every unacked queue empties.
#[test]
fn handshake_data_and_acks() {
    let mut sim = Sim::new(cfg(2));
    connect(&mut sim, A);
    send_n(&mut sim, A, 3);
    send_n(&mut sim, B, 1);
    sim.pump();
    assert_eq!(sim.m[B].delivered.len(), 3);
    assert_eq!(sim.m[A].delivered.len(), 1);
    // beta acked at the threshold (2 owed) or later; alpha's one message waits for the timer.
    assert!(sim.m[A].desc.acked() >= 2);
    assert_eq!(sim.m[B].desc.acked(), 0);
    sim.advance(10);
    sim.pump();
    assert_eq!((sim.m[A].desc.acked(), sim.m[B].desc.acked()), (3, 1));
    sim.check();
    sim.check_complete();
}

/// A cut in the middle of the second frame: beta delivers the first, throws the torn one
/// away; on the redial (by beta this time) alpha resends exactly messages 2 and 3.
#[test]
fn cut_mid_frame_resends_only_what_the_peer_lacks() {
    let mut sim = Sim::new(cfg(100));
    connect(&mut sim, A);
    send_n(&mut sim, A, 3);
    sim.write_conn(A, 0, usize::MAX);
    sim.read_conn(B, 0, data_len() + data_len() / 2);
    assert_eq!(sim.m[B].delivered.len(), 1);
    sim.cut(0, [0, 0]);
    sim.pump(); // both read EOF
    assert_eq!(sim.stats.torn_frames, 1);
    assert_eq!((sim.m[A].conn, sim.m[B].conn), (None, None));
    connect(&mut sim, B);
    assert_eq!(sim.stats.resent, 2);
    assert_eq!(sim.m[B].delivered.len(), 3);
    assert_eq!(sim.stats.duplicates, 0);
    sim.settle();
    sim.check_complete();
}

/// Beta's ack leaves its buffer (so `acks_sent` advances) and dies in flight. Nothing is
/// lost: the handshake says how much beta holds, so alpha retires it all and resends
/// nothing.
#[test]
fn an_ack_lost_with_the_link_is_replaced_by_the_handshake() {
    let mut sim = Sim::new(cfg(1));
    connect(&mut sim, A);
    send_n(&mut sim, A, 3);
    sim.write_conn(A, 0, usize::MAX);
    sim.read_conn(B, 0, usize::MAX);
    sim.write_conn(B, 0, usize::MAX);
    assert_eq!(sim.m[B].desc.acks_sent(), 3, "written: counts as sent");
    sim.cut(0, [0, 0]);
    sim.pump();
    assert_eq!(sim.m[A].desc.unacked_len(), 3, "the ack never arrived");
    connect(&mut sim, A);
    assert_eq!(sim.stats.resent, 0);
    assert_eq!(sim.m[A].desc.unacked_len(), 0);
    sim.check_complete();
}

/// The link replays messages 1 and 2 after a reconnect, and an old ack: beta drops both as
/// duplicates (still delivered once), alpha ignores the stale ack.
#[test]
fn replayed_frames_are_dropped_as_duplicates() {
    let mut sim = Sim::new(cfg(1));
    connect(&mut sim, A);
    send_n(&mut sim, A, 2);
    sim.pump();
    send_n(&mut sim, A, 1);
    sim.pump();
    sim.cut(0, [u16::MAX, u16::MAX]);
    sim.pump();
    connect(&mut sim, B);
    sim.replay(B, 2, 1); // messages 1 and 2 (alpha wrote no ack to replay)
    sim.replay(A, 0, 0); // alpha holds no message: only beta's first ack, long overtaken
    assert_eq!(sim.stats.duplicates, 2);
    assert_eq!(sim.m[B].delivered.len(), 3);
    assert_eq!(sim.m[A].desc.acked(), 3, "a stale ack does not go back");
    sim.check();
    sim.check_complete();
}

/// Reorder across connections. The link alpha dialled breaks with three of alpha's
/// messages in flight; beta has not noticed (half-open) when alpha redials. If beta reads
/// the old link's tail before the new link identifies, it delivers them from there and
/// its Ready says so: alpha resends nothing. If not, the tail is lost when the new link
/// replaces the old one, and alpha resends all three. Exactly once either way.
#[test]
fn a_half_open_link_is_read_until_the_new_handshake_then_dropped() {
    for read_tail_first in [true, false] {
        let mut sim = Sim::new(cfg(100));
        connect(&mut sim, A);
        send_n(&mut sim, A, 3);
        sim.write_conn(A, 0, usize::MAX);
        sim.cut(0, [u16::MAX, u16::MAX]);
        sim.read_conn(A, 0, usize::MAX); // alpha reads EOF; beta does not notice
        assert_eq!((sim.m[A].conn, sim.m[B].conn), (None, Some(0)));
        assert!(sim.dial(A));
        sim.write_conn(B, 1, usize::MAX); // Hello
        sim.read_conn(A, 1, usize::MAX); // alpha answers HelloReply(received 0)
        sim.write_conn(A, 1, usize::MAX);
        if read_tail_first {
            sim.read_conn(B, 0, usize::MAX);
            assert_eq!(sim.m[B].delivered.len(), 3);
            assert_eq!(sim.stats.late_deliveries, 3);
        }
        sim.read_conn(B, 1, usize::MAX); // identifies link 1: link 0 is closed
        assert!(sim.links[0].ends[B].is_none());
        sim.pump();
        assert_eq!(sim.stats.resent, if read_tail_first { 0 } else { 3 });
        assert_eq!(sim.m[B].delivered.len(), 3);
        assert_eq!(sim.stats.duplicates, 0);
        sim.settle();
        sim.check_complete();
    }
}

/// The tie-break (`keep_new`, as `IoThread::on_identified` applies it) against a half-open
/// link. Alpha dialled link 0; it breaks and only beta notices. Beta redials. At alpha the
/// new link (dialled by beta) and the old (dialled by alpha, established) would look like a
/// simultaneous dial, but beta's HelloReply says it has established as many connections
/// with alpha as alpha has with it: beta has seen link 0 and dials again, so link 0 is dead
/// on its side. Alpha replaces it at once instead of refusing beta until its idle timeout.
#[test]
fn a_redial_against_a_half_open_link_replaces_it() {
    let mut sim = Sim::new(cfg(100));
    connect(&mut sim, A);
    send_n(&mut sim, B, 2);
    sim.cut(0, [0, 0]);
    sim.read_conn(B, 0, usize::MAX); // beta reads EOF; alpha does not notice
    assert_eq!((sim.m[A].conn, sim.m[B].conn), (Some(0), None));
    assert!(sim.dial(B));
    sim.write_conn(A, 1, usize::MAX); // Hello
    sim.read_conn(B, 1, usize::MAX); // beta answers HelloReply(connections 1)
    sim.write_conn(B, 1, usize::MAX);
    sim.read_conn(A, 1, usize::MAX); // alpha identifies beta's link and replaces link 0
    assert_eq!(sim.stats.tie_break_refusals, 0);
    assert_eq!(
        sim.m[A].conn,
        Some(1),
        "alpha dropped the dead link for the live one"
    );
    sim.pump();
    assert_eq!(
        sim.stats.resent, 2,
        "what the dead link swallowed is resent"
    );
    sim.settle();
    sim.check_complete();
}

/// The same tie-break against a handshake read late from a dead link. Alpha dials link 0
/// and answers beta's Hello; the link breaks with that HelloReply in flight, and only alpha
/// notices. Beta dials link 1, which comes up; beta's messages flow and are acked. Then
/// beta reads link 0's remains: a dial from alpha whose HelloReply says alpha had
/// established no connection with beta, fewer than beta has (link 1). So that dial predates
/// link 1, which alpha adopted meanwhile: beta keeps the live link and refuses the stale
/// one. Nothing is lost, nothing is resent.
#[test]
fn a_late_handshake_on_a_dead_link_is_refused() {
    let mut sim = Sim::new(cfg(1));
    assert!(sim.dial(A));
    sim.write_conn(B, 0, usize::MAX); // Hello
    sim.read_conn(A, 0, usize::MAX); // alpha answers HelloReply(received 0, connections 0)
    sim.write_conn(A, 0, usize::MAX);
    sim.cut(0, [u16::MAX, u16::MAX]); // the HelloReply survives in flight
    sim.read_conn(A, 0, usize::MAX); // alpha reads EOF; beta has not read link 0 yet
    assert_eq!((sim.m[A].conn, sim.m[B].conn), (None, None));
    assert!(sim.dial(B), "a dead link is no handshake in progress");
    sim.pump_links(1..2);
    send_n(&mut sim, B, 2);
    sim.pump_links(1..2);
    assert_eq!(sim.m[B].desc.acked(), 2);
    sim.read_conn(B, 0, usize::MAX); // the stale HelloReply
    assert_eq!(sim.stats.live_replaced, 0);
    assert_eq!(sim.stats.tie_break_refusals, 1);
    assert_eq!(sim.m[B].conn, Some(1), "the live link stays");
    sim.settle();
    sim.check_complete();
    assert_eq!(sim.stats.resent, 0);
}

/// With a shared secret the handshake carries nonces and MACs and nothing else changes: data
/// both ways, a cut mid-stream, a redial that resends exactly what the peer lacks.
#[test]
fn an_authenticated_handshake_changes_nothing_else() {
    let mut sim = Sim::new(Config {
        secret: true,
        ..cfg(100)
    });
    connect(&mut sim, A);
    send_n(&mut sim, A, 3);
    send_n(&mut sim, B, 2);
    sim.write_conn(A, 0, usize::MAX);
    sim.read_conn(B, 0, data_len() + data_len() / 2);
    sim.cut(0, [0, 0]);
    sim.pump();
    connect(&mut sim, B);
    // alpha's 2 that beta lacks, and beta's 2 that were never written.
    assert_eq!(sim.stats.resent, 4);
    sim.settle();
    sim.check_complete();
    assert_eq!(sim.stats.auth_refusals, 0);
}

/// Members with different secrets: every dial is refused during the handshake and nothing
/// about the peer changes on either side (no link speaks for it, counters stay at zero).
#[test]
fn another_secret_is_refused_and_changes_nothing() {
    let mut sim = Sim::new(Config {
        secret: true,
        ..cfg(2)
    });
    sim.m[B].local.secret = Some(Secret::new(b"another secret"));
    send_n(&mut sim, A, 2);
    for side in [A, B, A] {
        assert!(sim.dial(side));
        sim.pump();
        assert!(sim
            .links
            .last()
            .unwrap()
            .ends
            .iter()
            .flatten()
            .all(|e| !e.established));
        for m in &sim.m {
            assert_eq!(m.conn, None);
            assert_eq!(m.desc.remote_launch(), None, "no incarnation bound");
            assert_eq!((m.desc.sent(), m.desc.received()), (0, 0));
        }
    }
    assert_eq!(sim.stats.auth_refusals, 3);
    assert_eq!(sim.stats.established, 0);
}
