//! The application → IO thread hand-off: loom models of `cohort::internals::handoff::{Handoff,
//! Scheduled}` and `cohort::internals::peer::Outbox`, with the code that ships.
//!
//! A sender (`SendCore::enqueue_to`) admits its message to the peer's outbox, then
//! schedules the peer (`IoShared::schedule` → `Handoff::schedule`): unless the peer's
//! `Scheduled` flag is set, it goes on the ready list and the doorbell rings the IO
//! thread's waker — unless a wake-up is already pending. The IO thread (`IoThread::run`,
//! `handle_requests`) polls; if `take_wake` finds a wake-up pending it takes the ready list
//! and publishes each peer; `Remote::publish` (`src/proto/remote/outgoing.rs`) takes its messages one by
//! one with `Outbox::next_to_publish`, which clears the flag and takes the outbox whenever
//! what it took is used up, until a take finds nothing. The models' IO thread is that
//! loop with the waker of `loom_tests::ModelWaker`: its poll returns only for a wake-up, so
//! a message that only a timeout or another sender's wake-up would bring in is stranded.
//!
//! Checked in every execution, once the senders are done and the IO thread's loop has seen
//! every wake-up:
//!
//! - no message is stranded: every admitted message was published exactly once, in each
//!   sender's order; the outboxes and the ready list are empty, no flag is left set, no
//!   wake-up left pending; every permit came through with its message;
//! - the IO thread is woken at most once per batch: every `wake` call is answered by
//!   exactly one turn whose `take_wake` found it pending (a second wake in one batch would
//!   be a turn that finds nothing, or a wake-up counted twice).
//!
//! The `framed_*` models send as a node without filter or journal sends its plain messages:
//! each sender encodes its message into the outbox's last run of frames
//! (`Outbox::admit_framed`), a message queued whole ends that run, and the IO thread takes
//! runs and single messages in one order, handing each run's buffer back
//! (`Outbox::recycle`) while senders open new runs.
//!
//! The `driven_*` models run the IO thread's loop as it blocks (`IdleStrategy::Block`): each
//! poll parks it through the shipping `Parking` (`Held::park`: the state let go, the
//! doorbell's PARKED bit set), and a requester whose doorbell finds it parked drives the
//! turn itself through `Parking::drive`, as `net::Doorbell` does, or wakes it where the state
//! is held (the IO thread back from its poll, another requester's turn). Nothing is stranded
//! either way, every message is published once in each sender's order, and every `wake` call
//! is answered by one turn of the IO thread's own that finds it pending (driven turns come on
//! top, with no call). With a journal writer beside the senders (it publishes its mark and
//! rings with `ring_io`, as `IoShared::wake` does), every turn reads the mark, so a
//! wake-up of the writer's that a driven turn takes is never lost.
//!
//! The `spinning_*` models run the IO thread's spin (`loom_tests::io_loop_spinning`, on the
//! shipping `SpinGate`):
//! senders whose doorbell finds it spinning make no `wake` call, and nothing is stranded
//! either way; every `wake` call still starts its own turn (calls ≤ turns).
#![cfg(loom)]

use std::collections::VecDeque;

use bytes::Bytes;
use cohort::internals::flow::{cost, Permit};
use cohort::internals::handoff::{Handoff, Parking, Scheduled, Wake};
use cohort::internals::peer::{self, Outbox, Queued, Return};
use cohort::internals::wire;
use loom::sync::atomic::Ordering::{Acquire, Release};
use loom::thread;
use loom_tests::{io_loop, io_loop_spinning, ModelWaker, Polled, Requesters};
use std::sync::{Arc, OnceLock, Weak};

/// The parts of `PeerShared` the hand-off touches.
struct Peer {
    outbox: Outbox,
    scheduled: Scheduled,
}

impl Peer {
    fn new() -> Peer {
        Peer {
            outbox: Outbox::new(1 << 20),
            scheduled: Scheduled::new(),
        }
    }
}

struct Node {
    peers: Vec<Peer>,
    handoff: Handoff,
}

/// How the models' senders queue their messages.
#[derive(Clone, Copy, PartialEq, Eq)]
enum How {
    /// One by one, each queued whole (`Outbox::admit`).
    Whole,
    /// The first sender sends each of its `(peer, count)` as one batch (`admit_all`).
    Batch,
    /// Every sender encodes its messages into the outbox's runs (`admit_framed`).
    Framed,
    /// The first sender encodes its messages (`admit_framed`), the others queue theirs
    /// whole: runs end and start again as the two interleave.
    Mixed,
}

/// The application's send of message `[sender, i]` to peer `id`: its permit (the window
/// holds every message of the models, so nothing parks: the window has its own models),
/// admit (encoded by the sender with `framed`), then schedule.
fn send(node: &Node, id: usize, sender: u8, i: u8, framed: bool) {
    let peer = &node.peers[id];
    let permit = peer
        .outbox
        .window()
        .try_acquire(cost(2))
        .expect("the window holds every message of the model");
    if framed {
        assert!(
            peer.outbox.admit_framed(false, &[sender, i], permit),
            "the outbox is open"
        );
    } else {
        let m = peer::outgoing(Bytes::from(vec![sender, i]), false, None, permit);
        peer.outbox.admit(m).expect("the outbox is open");
    }
    node.handoff.schedule(id, &peer.scheduled);
}

/// The application's `send_batch` of messages `[sender, 0]` to `[sender, count - 1]` to
/// peer `id` (`SendCore::enqueue_batch`'s hand-off part): one permit for them all, split
/// among them, all admitted under one lock (`Outbox::admit_all`), then one schedule.
fn send_batch(node: &Node, id: usize, sender: u8, count: u8) {
    let peer = &node.peers[id];
    let mut permit = peer
        .outbox
        .window()
        .try_acquire(cost(2) * u64::from(count))
        .expect("the window holds every message of the model");
    let mut ms: Vec<_> = (0..count)
        .map(|i| {
            peer::outgoing(
                Bytes::from(vec![sender, i]),
                false,
                None,
                permit.take(cost(2)),
            )
        })
        .collect();
    assert!(peer.outbox.admit_all(&mut ms), "the outbox is open");
    node.handoff.schedule(id, &peer.scheduled);
}

/// `Remote::publish`'s hand-off part: `Outbox::next_to_publish` (the shipping step: clear
/// the flag, then take, whenever what was taken is used up) until it finds nothing.
/// Appends what it published, a run's messages in the order of its frames, and hands each
/// run's buffer back (`Outbox::recycle`, as an ack of the run would); keeps the messages'
/// permits in `held` (given back once the model is done).
fn publish(peer: &Peer, published: &mut Vec<[u8; 2]>, held: &mut Permit) {
    let mut pending = VecDeque::new();
    while let Some(q) = peer.outbox.next_to_publish(&peer.scheduled, &mut pending) {
        match q {
            Queued::One(m) => {
                let p = m.payload();
                published.push([p[0], p[1]]);
                held.absorb(peer::into_permit(m));
            }
            Queued::Framed(run) => {
                let n = run.len();
                let (frames, permit) = run.into_frames();
                let payloads: Vec<[u8; 2]> = wire::numbered_frames(&frames)
                    .map(|(_, p)| [frames[p.start], frames[p.start + 1]])
                    .collect();
                assert_eq!(payloads.len() as u64, n, "a run holds what it counts");
                assert_eq!(
                    permit.bytes(),
                    cost(2) * n,
                    "a run holds its messages' permits"
                );
                published.extend(payloads);
                held.absorb(permit);
                // As an ack of the run would, but at once: the buffer may still be shared
                // with the room the next run is written in (the shipping IO thread hands
                // back only a buffer nothing else holds; `recycle` is safe either way), so
                // the hand-back races the senders' next runs under the outbox's lock.
                peer.outbox.recycle(&mut vec![frames]);
            }
        }
    }
}

/// The checks of every model once its senders are done and its IO thread has stopped: each
/// sender's messages were `published` exactly once, in its order; no outbox holds a message,
/// no flag is left set, every permit came through with its message (`held`, each peer's,
/// given back here); nothing is left on the ready list, no wake-up pending.
fn check_drained(
    senders: &[&[(usize, u8)]],
    published: &[[u8; 2]],
    peers: &[Peer],
    held: Vec<Permit>,
    handoff: &Handoff,
) {
    for (s, sends) in senders.iter().enumerate() {
        let mine: Vec<u8> = published
            .iter()
            .filter(|m| usize::from(m[0]) == s)
            .map(|m| m[1])
            .collect();
        let count: u8 = sends.iter().map(|&(_, n)| n).sum();
        assert_eq!(
            mine,
            (0..count).collect::<Vec<u8>>(),
            "sender {s}: published {mine:?} (all: {published:?})"
        );
    }
    for ((id, p), permits) in peers.iter().enumerate().zip(held) {
        assert!(
            p.outbox.is_empty(),
            "peer {id}: a message stranded in the outbox"
        );
        assert!(!p.scheduled.is_set(), "peer {id}: left scheduled");
        p.outbox.give_back(Return::Credited, permits);
        let w = p.outbox.window();
        assert_eq!(
            w.available(),
            w.capacity(),
            "peer {id}: permits not all back"
        );
    }
    assert!(
        handoff.take_ready().is_empty(),
        "a peer stranded on the ready list"
    );
    assert!(!handoff.take_wake(), "a wake-up left pending");
}

/// Runs `senders` (each a list of `(peer, count)` sends, one thread per sender) against the
/// IO thread's loop on the main thread (with `spins` spin episodes, if any), then checks
/// everything. `how` says how the senders queue their messages.
fn model(peers: usize, senders: &'static [&'static [(usize, u8)]], spins: Option<usize>, how: How) {
    let waker = ModelWaker::new();
    let node = Arc::new(Node {
        peers: (0..peers).map(|_| Peer::new()).collect(),
        handoff: Handoff::new(waker.waker()),
    });
    let done = Requesters::new(senders.len(), &waker);
    let threads: Vec<_> = senders
        .iter()
        .enumerate()
        .map(|(s, sends)| {
            let (node, done) = (node.clone(), done.clone());
            thread::spawn(move || {
                let framed = how == How::Framed || (how == How::Mixed && s == 0);
                for &(id, count) in sends.iter() {
                    if how == How::Batch && s == 0 {
                        send_batch(&node, id, s as u8, count);
                        continue;
                    }
                    for i in 0..count {
                        send(&node, id, s as u8, i, framed);
                    }
                }
                done.done();
            })
        })
        .collect();

    let mut published = Vec::new();
    let mut held: Vec<Permit> = (0..peers).map(|_| Permit::none()).collect();
    let turn = || {
        for id in node.handoff.take_ready() {
            publish(&node.peers[id], &mut published, &mut held[id]);
        }
    };
    let turns = match spins {
        None => io_loop(&node.handoff, &waker, turn),
        Some(n) => io_loop_spinning(&node.handoff, &waker, n, turn),
    };
    for t in threads {
        t.join().unwrap();
    }

    check_drained(senders, &published, &node.peers, held, &node.handoff);
    if spins.is_none() {
        assert_eq!(
            waker.calls(),
            turns,
            "the IO thread was woken {} times for {turns} batches",
            waker.calls()
        );
    } else {
        assert!(
            waker.calls() <= turns,
            "the IO thread was woken {} times for {turns} batches",
            waker.calls()
        );
    }
}

/// Two senders to one peer, the first sending twice: its second send finds the flag set
/// (the IO thread has not cleared it yet: no schedule, no wake) or cleared (it schedules
/// again), and the other sender's message races both.
#[test]
fn two_senders_one_peer() {
    loom_tests::model("handoff/two_senders_one_peer", || {
        model(1, &[&[(0, 2)], &[(0, 1)]], None, How::Whole);
    });
}

/// Two senders, one message each to its own peer: both peers may go on the ready list in
/// one batch, with one wake-up between them.
#[test]
fn two_peers_share_the_wake_up() {
    loom_tests::model("handoff/two_peers_share_the_wake_up", || {
        model(2, &[&[(0, 1)], &[(1, 1)]], None, How::Whole);
    });
}

/// Two senders to one peer while the IO thread spins twice (at the start, and after a turn
/// with work): a send whose
/// doorbell finds it spinning makes no wake-up call and is taken by a spin round, or by the
/// turn `spin_end` asks for; one that comes after the spin wakes it.
#[test]
fn spinning_two_senders_one_peer() {
    loom_tests::model("handoff/spinning_two_senders_one_peer", || {
        model(1, &[&[(0, 2)], &[(0, 1)]], Some(2), How::Whole);
    });
}

/// Two senders to their own peers while the IO thread spins once.
#[test]
fn spinning_two_peers() {
    loom_tests::model("handoff/spinning_two_peers", || {
        model(2, &[&[(0, 1)], &[(1, 1)]], Some(1), How::Whole);
    });
}

/// A batch of two (one permit, one lock, one schedule) and a single send to one peer: the
/// batch's messages are published in order, exactly once, whichever way the single send
/// and the IO thread's take interleave with it.
#[test]
fn a_batch_and_a_single_sender_one_peer() {
    loom_tests::model("handoff/a_batch_and_a_single_sender_one_peer", || {
        model(1, &[&[(0, 2)], &[(0, 1)]], None, How::Batch);
    });
}

/// The same while the IO thread spins twice.
#[test]
fn spinning_a_batch_and_a_single_sender() {
    loom_tests::model("handoff/spinning_a_batch_and_a_single_sender", || {
        model(1, &[&[(0, 2)], &[(0, 1)]], Some(2), How::Batch);
    });
}

/// Two senders encoding their messages into one peer's runs, the first sending twice: a
/// message lands in the run the IO thread is about to take, or opens the next one after
/// the take (in the room the taken run's buffer has left, or in the buffer just handed
/// back); every message is published once, in each sender's order, permits with it.
#[test]
fn framed_two_senders_one_peer() {
    loom_tests::model("handoff/framed_two_senders_one_peer", || {
        model(1, &[&[(0, 2)], &[(0, 1)]], None, How::Framed);
    });
}

/// A sender encoding its messages and one queueing its message whole, to one peer: the
/// whole message ends the open run, the next framed one opens another, and the IO thread
/// publishes runs and the single message in the order they were queued.
#[test]
fn framed_and_whole_messages_one_peer() {
    loom_tests::model("handoff/framed_and_whole_messages_one_peer", || {
        model(1, &[&[(0, 2)], &[(0, 1)]], None, How::Mixed);
    });
}

/// The framed senders while the IO thread spins twice.
#[test]
fn spinning_framed_two_senders() {
    loom_tests::model("handoff/spinning_framed_two_senders", || {
        model(1, &[&[(0, 2)], &[(0, 1)]], Some(2), How::Framed);
    });
}

/// What the IO thread's turns did, kept in its state (`Parking`'s `T`): what they published,
/// each peer's permits held, and how many turns ran of each kind.
struct Turns {
    published: Vec<[u8; 2]>,
    held: Vec<Permit>,
    /// Turns of the IO thread's own whose `take_wake` found a wake-up pending.
    own: usize,
    /// Turns requesters drove.
    driven: usize,
    /// The journal writer's mark as a turn last read it (see [`Driver::mark`]).
    mark_seen: u64,
}

/// A node whose IO thread parks: its peers, its hand-off (whose waker is a [`Driver`]) and
/// where the IO thread keeps its state.
struct ParkingNode {
    peers: Vec<Peer>,
    handoff: Handoff,
    parking: Arc<Parking<Turns>>,
}

/// The doorbell's waker, as `net::Doorbell`: `wake` wakes the model's poll; `drive` runs a
/// turn on the requester's thread through the shipping `Parking::drive` (the IO thread
/// parked, its state free): the pending wake-up taken, then the ready list, as the IO
/// thread's turn does; then, with `wake_after`, leaves a wake-up pending and wakes the IO
/// thread once the state is let go, as a driven turn does that leaves the IO thread work or
/// whose node spins after work.
struct Driver {
    waker: Box<dyn Wake>,
    parking: Arc<Parking<Turns>>,
    /// The node, once built (the waker is built first: the node's hand-off holds it).
    node: Arc<OnceLock<Weak<ParkingNode>>>,
    wake_after: bool,
    /// The journal writer's mark (`WriterMarks` as `IoCore::journal_progress` reads them):
    /// stored before the writer's `ring_io`, read by every turn, driven or not.
    mark: Arc<loom::sync::atomic::AtomicU64>,
}

impl Wake for Driver {
    fn wake(&self) -> std::io::Result<()> {
        self.waker.wake()
    }

    fn drive(&self) -> bool {
        let Some(node) = self.node.get().and_then(Weak::upgrade) else {
            return false;
        };
        let ran = self
            .parking
            .drive(|turns| {
                node.handoff.take_wake();
                // As `IoCore::drive`: the wake-up it took may be the writer's.
                turns.mark_seen = self.mark.load(Acquire);
                turns.driven += 1;
                parked_turn(&node, turns);
                if self.wake_after {
                    // As `IoCore::drive`: the IO thread's turn, woken below, takes what
                    // came meanwhile.
                    node.handoff.pend();
                }
            })
            .is_some();
        if ran && self.wake_after {
            self.waker.wake().expect("the model's waker");
        }
        ran
    }
}

/// A turn, the IO thread's or a driven one: publishes every peer on the ready list.
fn parked_turn(node: &ParkingNode, turns: &mut Turns) {
    for id in node.handoff.take_ready() {
        publish(&node.peers[id], &mut turns.published, &mut turns.held[id]);
    }
}

/// What a `driven_*` model adds to its senders (all off by default).
#[derive(Clone, Copy, Default)]
struct Driven {
    /// The senders encode their messages into the outbox's runs.
    framed: bool,
    /// Each driven turn wakes the IO thread once it has let the state go.
    wake_after: bool,
    /// A journal writer publishes its mark and rings `ring_io` beside the senders.
    writer: bool,
}

/// `senders` (as in [`model`]) against an IO thread that parks at every poll, as `how`
/// says, then the checks of [`model`], and: every `wake` call was answered by one of the
/// IO thread's own turns (with `wake_after`, or was a driven turn's wake-up after it; with
/// a `writer`, its one call may find its wake-up taken by a driven turn), and a writer's
/// mark was read by some turn.
fn driven_model(peers: usize, senders: &'static [&'static [(usize, u8)]], how: Driven) {
    let Driven {
        framed,
        wake_after,
        writer,
    } = how;
    let waker = ModelWaker::new();
    let parking = Arc::new(Parking::new());
    let slot: Arc<OnceLock<Weak<ParkingNode>>> = Arc::default();
    let mark = Arc::new(loom::sync::atomic::AtomicU64::new(0));
    let node = Arc::new(ParkingNode {
        peers: (0..peers).map(|_| Peer::new()).collect(),
        handoff: Handoff::new(Box::new(Driver {
            waker: waker.waker(),
            parking: parking.clone(),
            node: slot.clone(),
            wake_after,
            mark: mark.clone(),
        })),
        parking,
    });
    assert!(slot.set(Arc::downgrade(&node)).is_ok(), "set once");
    let done = Requesters::new(senders.len() + usize::from(writer), &waker);
    // The journal writer (with `writer`): publishes its mark, then wakes the IO thread as
    // `JournalWriter`'s wake-up does (`IoShared::wake` → `Handoff::ring_io`).
    let writer_thread = writer.then(|| {
        let (node, done, mark) = (node.clone(), done.clone(), mark.clone());
        thread::spawn(move || {
            mark.store(1, Release);
            node.handoff.ring_io();
            done.done();
        })
    });
    let threads: Vec<_> = senders
        .iter()
        .enumerate()
        .map(|(s, sends)| {
            let (node, done) = (node.clone(), done.clone());
            thread::spawn(move || {
                for &(id, count) in sends.iter() {
                    for i in 0..count {
                        let peer = &node.peers[id];
                        let permit = peer
                            .outbox
                            .window()
                            .try_acquire(cost(2))
                            .expect("the window holds every message of the model");
                        let m = [s as u8, i];
                        if framed {
                            assert!(peer.outbox.admit_framed(false, &m, permit), "open");
                        } else {
                            let m = peer::outgoing(Bytes::from(m.to_vec()), false, None, permit);
                            peer.outbox.admit(m).expect("the outbox is open");
                        }
                        node.handoff.schedule(id, &peer.scheduled);
                    }
                }
                done.done();
            })
        })
        .collect();

    // The IO thread's loop as it blocks: park through the poll, take the state back, a
    // turn if a wake-up is pending; until a poll finds the waker stopped.
    let mut held = node.parking.hold(Turns {
        published: Vec::new(),
        held: (0..peers).map(|_| Permit::none()).collect(),
        own: 0,
        driven: 0,
        mark_seen: 0,
    });
    loop {
        if held.park(&node.handoff, || waker.poll()) == Polled::Stopped {
            break;
        }
        let turns = held.state().expect("the state is in until taken");
        let woken = node.handoff.take_wake();
        // As `IoThread::run`: the marks at every turn, woken or not.
        turns.mark_seen = mark.load(Acquire);
        if woken {
            turns.own += 1;
            parked_turn(&node, turns);
        }
    }
    for t in threads.into_iter().chain(writer_thread) {
        t.join().unwrap();
    }
    let turns = held.take().expect("the state is in until taken");
    assert_eq!(
        turns.mark_seen,
        mark.load(Acquire),
        "the writer's mark, published with a wake-up, never read by a turn"
    );

    check_drained(
        senders,
        &turns.published,
        &node.peers,
        turns.held,
        &node.handoff,
    );
    let answered = turns.own + if wake_after { turns.driven } else { 0 };
    let calls = waker.calls();
    // The writer's `ring_io` calls the waker even where a wake-up is pending: that call's
    // turn may find it taken (by a driven turn, which read the mark), and answers nothing.
    let unanswered = usize::from(writer);
    assert!(
        (wake_after || answered <= calls) && calls <= answered + unanswered,
        "{calls} wake calls for {} turns of the IO thread's own and {} driven",
        turns.own,
        turns.driven
    );
}

/// Two senders to one peer, the first sending twice, against an IO thread that parks: a
/// send drives the turn where it finds the IO thread parked and its state free, wakes it
/// where the state is held (the IO thread back from its poll, or the other sender's turn),
/// or finds a wake-up pending whose turn takes its message.
#[test]
fn driven_two_senders_one_peer() {
    loom_tests::model("handoff/driven_two_senders_one_peer", || {
        driven_model(1, &[&[(0, 2)], &[(0, 1)]], Driven::default());
    });
}

/// The same where each driven turn wakes the IO thread once it has let the state go (its
/// node spins after work, or the turn left it work): the IO thread's poll may return for
/// that wake-up with no request pending, and finds the state free or in another
/// requester's hands; nothing is stranded either way.
#[test]
fn driven_turns_that_wake_the_io_thread_after() {
    loom_tests::model("handoff/driven_turns_that_wake_the_io_thread_after", || {
        driven_model(
            1,
            &[&[(0, 2)], &[(0, 1)]],
            Driven {
                wake_after: true,
                ..Driven::default()
            },
        );
    });
}

/// Two senders, one message each to its own peer: one's driven turn may take the other's
/// peer too, or leave it to a turn of its own or of the IO thread.
#[test]
fn driven_two_peers() {
    loom_tests::model("handoff/driven_two_peers", || {
        driven_model(2, &[&[(0, 1)], &[(1, 1)]], Driven::default());
    });
}

/// The framed senders against an IO thread that parks.
#[test]
fn driven_framed_two_senders() {
    loom_tests::model("handoff/driven_framed_two_senders", || {
        driven_model(
            1,
            &[&[(0, 2)], &[(0, 1)]],
            Driven {
                framed: true,
                ..Driven::default()
            },
        );
    });
}

/// A journalling node: a sender's ring may drive a turn while the journal writer publishes
/// its mark and rings with `ring_io`, whose wake-up the driven turn's `take_wake` may take
/// before the IO thread's poll returns for it. The mark is read all the same: by the driven
/// turn after its `take_wake` (which then came after the writer's ring), or by the IO
/// thread's next turn (the writer's wake-up still pending). Where driven turns do not read
/// the marks, the mark is lost in that interleaving: the IO thread's turn finds nothing
/// pending, and what the mark released waits for the writer's next step.
#[test]
fn driven_turns_and_the_journal_writers_wake_up() {
    loom_tests::model(
        "handoff/driven_turns_and_the_journal_writers_wake_up",
        || {
            driven_model(
                1,
                &[&[(0, 1)], &[(0, 1)]],
                Driven {
                    writer: true,
                    ..Driven::default()
                },
            );
        },
    );
}
