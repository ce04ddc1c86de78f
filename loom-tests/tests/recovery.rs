//! Recovery: loom models of the ack counters and the unacked queue, with the code
//! that ships: `cohort::internals::peer::Outbox` (the hand-off from the application to the IO thread)
//! and `cohort::internals::proto::Descriptor` (sequence numbers, acks, the resend set).
//!
//! The boundary as the code has it (`src/net/io.rs`): the application thread admits
//! messages into the peer's `Outbox`; the IO thread takes them (`take_into`), publishes
//! them into the `Descriptor` it owns (`flush_peer`), applies the peer's cumulative acks
//! (`on_ack`) and, when a reconnect's handshake says how many messages the peer holds,
//! takes the resend set (`establish` → `resume(peer_received)`), written before anything
//! new. The descriptor has no lock because only the IO thread touches it.
//!
//! - `admit_races_publish_ack_and_reconnect` models exactly that: the application thread
//!   admitting while the IO thread publishes, acks and reconnects.
//! - `publish_ack_and_reconnect_race_on_a_shared_descriptor` splits the IO thread's three
//!   roles over three loom threads (a writer admitting and publishing, an acker, a
//!   reconnect), the descriptor behind a `loom::sync::Mutex` owned by the test. The mutex
//!   stands for the IO thread's single ownership: each descriptor call runs whole, and the
//!   interleavings loom explores are the orders in which one thread could make those calls
//!   as acks, publishes and the handshake arrive. The peer (what it has received, and the
//!   cut that ends the old connection) sits behind a second mutex: an ack only carries a
//!   count the peer had, and after the cut the peer receives nothing more on the old
//!   connection, so its handshake count is at least every ack the IO thread applied.
//!
//! Checked in every execution:
//!
//! - at every step `acked <= sent` and the unacked queue holds `sent - acked` messages;
//! - an ack retires exactly the messages between the old and the new count, and a stale
//!   one (overtaken by a newer ack or by the handshake) retires nothing;
//! - at the reconnect each published sequence number is either acknowledged (`<= acked`)
//!   or in the resend set, never both, never neither; the resend set is in order, holds
//!   nothing `<= acked` and nothing the peer already holds — nothing is resent after it
//!   was acked;
//! - no message is lost: every admitted message is published exactly once, in admission
//!   order, and the new connection carries exactly what the peer lacks, in order (resend
//!   set, then new messages: `peer_received + 1 ..= sent`); once the peer acknowledges
//!   everything the unacked queue is empty.
#![cfg(loom)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use bytes::Bytes;
use cohort::internals::flow::cost;
use cohort::internals::peer::{self, Ledger, Outbox, Outgoing};
use cohort::internals::proto::Descriptor;
use cohort::internals::wire;
use loom::sync::{Arc, Mutex};
use loom::thread;

/// Messages per model; each payload is its one-byte tag, `1..=MESSAGES` in admission order.
const MESSAGES: u8 = 3;

/// The application's send: the window's permits, then `admit`. The window holds every
/// message of the model, so nothing parks (the window has its own models).
fn admit(ob: &Outbox, tag: u8) {
    let permit = ob
        .window()
        .try_acquire(cost(1))
        .expect("the window holds every message of the model");
    let m = peer::outgoing(Bytes::from(vec![tag]), false, None, permit);
    ob.admit(m).expect("the outbox is open");
}

fn outbox() -> Arc<Outbox> {
    Arc::new(Outbox::new(u64::from(MESSAGES) * cost(1)))
}

/// Executions (summed over a model's iterations, outside loom) that reached: a non-empty
/// resend set, an ack applied after the reconnect that retired nothing, a message first
/// published on the new connection. One per model (tests run in parallel); each model
/// asserts it reached what it is for.
#[derive(Debug, Default)]
struct Reached {
    resent: AtomicUsize,
    stale_ack: AtomicUsize,
    new_after_resend: AtomicUsize,
}

impl Reached {
    const fn new() -> Reached {
        Reached {
            resent: AtomicUsize::new(0),
            stale_ack: AtomicUsize::new(0),
            new_after_resend: AtomicUsize::new(0),
        }
    }

    fn counts(&self) -> [usize; 3] {
        [&self.resent, &self.stale_ack, &self.new_after_resend].map(|c| c.load(Relaxed))
    }
}

/// The IO thread's descriptor, and what the checks need to know of its history.
struct Io {
    desc: Descriptor,
    /// `published[seq - 1]`: the tag of the message published as `seq`.
    published: Vec<u8>,
    /// After the reconnect: the peer's received count, and every sequence number written on
    /// the new connection, in order (the resend set, then new messages).
    new_conn: Option<(u64, Vec<u64>)>,
    /// The permits of what was published (no credit comes back in these models).
    ledger: Ledger,
    reached: &'static Reached,
}

impl Io {
    fn new(reached: &'static Reached) -> Io {
        let mut desc = Descriptor::new();
        assert!(desc.bind(1).is_empty());
        Io {
            desc,
            published: Vec::new(),
            new_conn: None,
            ledger: Ledger::default(),
            reached,
        }
    }

    /// `flush_peer` for one message: it gets the next sequence number and enters the
    /// unacked queue. Returns its sequence number.
    fn publish(&mut self, m: Outgoing) -> u64 {
        let u = self.desc.publish(wire::FLAG_RELIABLE, m.payload().clone());
        self.ledger.publish(peer::into_permit(m));
        let (seq, tag) = (u.seq, u.payload[0]);
        assert_eq!(
            seq,
            self.published.len() as u64 + 1,
            "sequence numbers skip"
        );
        self.published.push(tag);
        if let Some((_, written)) = &mut self.new_conn {
            written.push(seq);
            self.reached.new_after_resend.fetch_add(1, Relaxed);
        }
        self.check();
        seq
    }

    /// `flush_peer`: takes what the application queued and publishes all of it.
    fn flush(&mut self, ob: &Outbox) {
        let mut taken = VecDeque::new();
        ob.take_into(&mut taken);
        for m in taken {
            self.publish(m);
        }
    }

    /// `on_ack`: the peer holds `received` messages.
    fn ack(&mut self, received: u64) {
        let before = self.desc.acked();
        let retired = self
            .desc
            .on_ack(received)
            .expect("an ack carries a count the peer had: never beyond sent");
        assert_eq!(
            retired.messages,
            received.saturating_sub(before),
            "an ack retires exactly what it newly covers"
        );
        assert_eq!(self.desc.acked(), before.max(received));
        if self.new_conn.is_some() && retired.messages == 0 {
            self.reached.stale_ack.fetch_add(1, Relaxed);
        }
        self.check();
    }

    /// `establish` after a reconnect: the handshake says the peer holds `peer_received`;
    /// the resend set is what it lacks.
    fn reconnect(&mut self, peer_received: u64) {
        assert!(self.new_conn.is_none(), "one reconnect per model");
        let acked_before = self.desc.acked();
        let published = &self.published;
        let resend: Vec<u64> = self
            .desc
            .resume(peer_received)
            .expect("the handshake count is at least every ack applied")
            .map(|u| {
                assert_eq!(
                    u.payload[0],
                    published[u.seq as usize - 1],
                    "resent with other bytes"
                );
                u.seq
            })
            .collect();
        let (acked, sent) = (self.desc.acked(), self.desc.sent());
        assert_eq!(acked, acked_before.max(peer_received));
        for seq in 1..=sent {
            assert!(
                (seq <= acked) != resend.contains(&seq),
                "seq {seq}: acked {acked}, resend set {resend:?}: acked and resent, or neither"
            );
        }
        assert!(
            resend.windows(2).all(|w| w[0] < w[1]),
            "resend set out of order: {resend:?}"
        );
        assert!(
            resend.iter().all(|&s| s > acked && s > peer_received),
            "resent after it was acked, or resent what the peer holds: {resend:?}"
        );
        if !resend.is_empty() {
            self.reached.resent.fetch_add(1, Relaxed);
        }
        self.new_conn = Some((peer_received, resend));
        self.check();
    }

    fn check(&self) {
        let d = &self.desc;
        assert!(d.acked() <= d.sent(), "acked beyond sent");
        assert_eq!(
            d.unacked_len() as u64,
            d.sent() - d.acked(),
            "unacked queue"
        );
    }

    /// After every thread is joined and everything published: nothing lost, nothing twice.
    fn finish(mut self) {
        let (peer_received, written) = self.new_conn.take().expect("the model reconnected");
        let admitted: Vec<u8> = (1..=MESSAGES).collect();
        assert_eq!(
            self.published, admitted,
            "every admitted message published exactly once, in admission order"
        );
        let sent = self.desc.sent();
        assert_eq!(
            written,
            (peer_received + 1..=sent).collect::<Vec<u64>>(),
            "the new connection must carry exactly what the peer lacks, in order"
        );
        self.ack(sent);
        assert_eq!(self.desc.unacked_len(), 0);
        assert_eq!(self.desc.unacked_bytes(), 0);
    }
}

/// The code's own boundary: the application admits three messages while the IO thread
/// publishes what it finds, applies an ack for everything published so far, publishes
/// again, then reconnects after a break that lost the last message written (the peer's
/// handshake count is one short, unless that one was already acked) and publishes the
/// rest. loom explores where the admits land between the IO thread's takes.
#[test]
fn admit_races_publish_ack_and_reconnect() {
    static REACHED: Reached = Reached::new();
    loom_tests::model("recovery/admit_races_publish_ack_and_reconnect", || {
        let ob = outbox();
        let app = {
            let ob = ob.clone();
            thread::spawn(move || {
                for tag in 1..=MESSAGES {
                    admit(&ob, tag);
                }
            })
        };
        let mut io = Io::new(&REACHED);
        io.flush(&ob);
        let everything = io.desc.sent();
        io.ack(everything);
        io.flush(&ob);
        let peer_received = io.desc.sent().saturating_sub(1).max(io.desc.acked());
        io.reconnect(peer_received);
        io.flush(&ob);
        app.join().unwrap();
        io.flush(&ob);
        io.finish();
    });
    let [resent, _, new] = REACHED.counts();
    assert!(
        resent > 0 && new > 0,
        "resent {resent}, new after resend {new}"
    );
}

/// The peer: what it has received on the old connection, and whether that connection is
/// cut (after which it receives nothing more on it).
#[derive(Debug, Default)]
struct Peer {
    received: u64,
    cut: bool,
}

/// The IO thread's roles split over three threads around a shared descriptor (see the
/// module doc): a writer admitting each message and publishing it (then the old connection
/// carries it to the peer unless cut), an acker applying the peer's count twice (each ack
/// possibly overtaken by the other role's work before it is applied), and the main thread
/// reconnecting: it cuts the old connection, reads the peer's handshake count and takes the
/// resend set.
#[test]
fn publish_ack_and_reconnect_race_on_a_shared_descriptor() {
    static REACHED: Reached = Reached::new();
    loom_tests::model(
        "recovery/publish_ack_and_reconnect_race_on_a_shared_descriptor",
        || {
            let ob = outbox();
            let io = Arc::new(Mutex::new(Io::new(&REACHED)));
            let peer = Arc::new(Mutex::new(Peer::default()));
            let writer = {
                let (ob, io, peer) = (ob.clone(), io.clone(), peer.clone());
                thread::spawn(move || {
                    for tag in 1..=MESSAGES {
                        admit(&ob, tag);
                        let mut taken = VecDeque::new();
                        ob.take_into(&mut taken);
                        for m in taken {
                            let seq = io.lock().unwrap().publish(m);
                            let mut p = peer.lock().unwrap();
                            if !p.cut {
                                assert_eq!(p.received + 1, seq, "the old connection is in order");
                                p.received = seq;
                            }
                        }
                    }
                })
            };
            let acker = {
                let (io, peer) = (io.clone(), peer.clone());
                thread::spawn(move || {
                    for _ in 0..2 {
                        let received = peer.lock().unwrap().received;
                        io.lock().unwrap().ack(received);
                    }
                })
            };
            let peer_received = {
                let mut p = peer.lock().unwrap();
                p.cut = true;
                p.received
            };
            io.lock().unwrap().reconnect(peer_received);
            writer.join().unwrap();
            acker.join().unwrap();
            let io = Arc::try_unwrap(io)
                .unwrap_or_else(|_| panic!("threads joined"))
                .into_inner()
                .unwrap();
            assert!(ob.is_empty(), "the writer published everything it admitted");
            io.finish();
        },
    );
    let [resent, stale, new] = REACHED.counts();
    println!(
        "  reached: {resent} resend sets, {stale} stale acks, {new} publishes after the resend"
    );
    assert!(
        resent > 0 && stale > 0 && new > 0,
        "resent {resent}, stale acks {stale}, new after resend {new}"
    );
}
