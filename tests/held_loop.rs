//! An IO thread that does not run for a while — descheduled on a busy machine (64 member
//! processes on two cores), or held by a slow callback — must not blame its peers for the
//! time it did not look (invariant 9: time we did not read is never counted as a peer's
//! silence), and must not make them wait for the rest of its turn to learn that a
//! handshake went through. Real TCP on 127.0.0.1. The loop is held in the middle of a turn
//! by its outbound filter (which runs on the IO thread when a message is published), the
//! way the CPU scheduler holds it when it takes the core away; the time it is held for is
//! made by moving the node's clock forward (`Node::advance_clock`) once the peer's bytes
//! wait in its socket, not slept through.
//!
//! Also here, the back-pressure path the mesh harness (`examples/mesh.rs`) pointed at:
//! bytes left in a socket while reading is paused (its peer holds more than the receive
//! window) are read once the handler catches up, with no new readiness edge to announce
//! them.
//!
//! And what a command promises its caller when it returns, which a loop held later in the
//! same turn shows: `remove_peer` has reported the member's unacknowledged messages.

mod support;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use cohort::internals::proto::{Handshake, HsEvent, LocalIdentity};
use cohort::internals::wire;
use cohort::{Node, Outgoing, PeerInfo};
use support::*;

const CLUSTER: &str = "t-held";

/// The payload that makes a node's outbound filter hold its IO thread.
const HOLD: &[u8] = b"hold the loop";

/// Waits until at least `bytes` wait unread in the socket [`receive_queue`] finds.
fn wait_unread(what: &str, port: u16, remote: Option<u16>, bytes: u64) {
    wait_until_or(
        PATIENCE,
        || receive_queue(port, remote).is_some_and(|q| q >= bytes),
        || {
            format!(
                "{what} waiting unread ({:?} of {bytes} bytes)",
                receive_queue(port, remote)
            )
        },
    );
}

/// Waits until `node`'s IO thread has judged its timeouts as of `at` or later (on its
/// clock, which `Node::advance_clock` moved to `at`).
fn wait_judged(node: &Node, at: Instant) {
    wait_until("timeouts judged after the clock moved", PATIENCE, || {
        node.timeouts_judged_at().is_some_and(|j| j >= at)
    });
}

/// Holds a node's IO thread inside its outbound filter, in the middle of a loop turn, from
/// the moment it publishes a [`HOLD`] message (or the payload given to [`Hold::on`]) until
/// the test releases it.
struct Hold {
    /// The payload that holds.
    payload: &'static [u8],
    /// (held now, released)
    state: Mutex<(bool, bool)>,
    cond: Condvar,
}

impl Hold {
    fn new() -> Arc<Hold> {
        Hold::on(HOLD)
    }

    /// A hold on messages with `payload`.
    fn on(payload: &'static [u8]) -> Arc<Hold> {
        Arc::new(Hold {
            payload,
            state: Mutex::new((false, false)),
            cond: Condvar::new(),
        })
    }

    /// The outbound filter to install: passes every message, holding on [`HOLD`].
    fn filter(self: &Arc<Self>) -> impl Fn(&PeerInfo<'_>, &Outgoing) -> bool + Send + Sync {
        let hold = self.clone();
        move |_, m| {
            hold.check(m);
            true
        }
    }

    /// In an outbound filter: holds if `m` is this hold's message.
    fn check(&self, m: &Outgoing) {
        if m.payload() == self.payload {
            self.enter();
        }
    }

    /// On the IO thread: holds until released (or, if the test went wrong, for PATIENCE).
    fn enter(&self) {
        let deadline = Instant::now() + PATIENCE;
        let mut s = self.state.lock().unwrap();
        s.0 = true;
        self.cond.notify_all();
        while !s.1 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            s = self.cond.wait_timeout(s, deadline - now).unwrap().0;
        }
        s.0 = false;
    }

    /// Waits until the IO thread is held.
    fn wait_held(&self) {
        let deadline = Instant::now() + PATIENCE;
        let mut s = self.state.lock().unwrap();
        while !s.0 {
            let now = Instant::now();
            assert!(now < deadline, "the IO thread never reached the hold");
            s = self.cond.wait_timeout(s, deadline - now).unwrap().0;
        }
    }

    fn release(&self) {
        self.state.lock().unwrap().1 = true;
        self.cond.notify_all();
    }
}

/// A member identity for a hand-driven handshake.
fn identity(name: &str) -> LocalIdentity {
    raw::identity(CLUSTER, name, 1 << 20, None)
}

/// Reads one whole frame (prefix included) from a blocking socket; `None` at EOF, reset or
/// the socket's read timeout.
fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    raw::read_frame(s, 1 << 20)
}

/// Bytes waiting unread in the receive queue of the established TCP socket whose local
/// port is `port` (and whose remote port is `remote`, if given), from `/proc/net/tcp`, if
/// there is exactly one such socket.
fn receive_queue(port: u16, remote: Option<u16>) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let mut found = None;
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 5 || f[3] != "01" {
            continue; // not ESTABLISHED
        }
        let local_port = f[1]
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok());
        let remote_port = f[2]
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok());
        if local_port != Some(port) || remote.is_some_and(|r| remote_port != Some(r)) {
            continue;
        }
        if found.is_some() {
            return None;
        }
        found = f[4]
            .split(':')
            .nth(1)
            .and_then(|q| u64::from_str_radix(q, 16).ok());
    }
    found
}

/// `b`, whose IO thread is held mid-turn for three idle timeouts (on its clock, moved
/// forward while it is held) while `a`'s messages reach its socket, does not close the
/// connection for silence: `a`'s messages were waiting in the socket, and the loop had not
/// looked. (Before, the turn went on to the
/// housekeeping tick, which measured the silence up to the present and closed the
/// connection; the mesh harness saw such connections closed with 128 000 unread bytes in
/// their socket.)
#[test]
fn a_held_loop_does_not_blame_a_peer_whose_bytes_wait_unread() {
    const N: u64 = 200;
    const IDLE: Duration = Duration::from_millis(750);
    let hold = Hold::new();
    let order = OrderCheck::new();
    let b = Node::builder("held-b")
        .cluster(CLUSTER)
        .allow_unknown_members(true)
        .heartbeat(Duration::from_millis(50), IDLE)
        .outbound_filter(hold.filter())
        .on_message(order.handler())
        .start()
        .expect("start b");
    // `a` does not mind `b`'s silence while it is held: only `b`'s judgement is tested.
    let a = Node::builder("held-a")
        .cluster(CLUSTER)
        .heartbeat(Duration::from_millis(50), Duration::from_secs(60))
        .peer("held-b", b.local_addr())
        .start()
        .expect("start a");
    wait_until("connected both ways", PATIENCE, || {
        is_connected(&a, "held-b") && is_connected(&b, "held-a")
    });

    b.send("held-a", HOLD).expect("send");
    hold.wait_held();
    for i in 0..N {
        a.send("held-b", payload(i, 64)).expect("send");
    }
    // b's only connection is the one it accepted from a, at its listening port.
    let frames = N * wire::data_frame_len(true, 64) as u64;
    wait_unread("a's messages", b.local_addr().port(), None, frames);
    // The fault: held for three idle timeouts, as b's clock counts them.
    let later = b.advance_clock(3 * IDLE);
    hold.release();

    wait_until_or(
        PATIENCE,
        || order.count_from("held-a") == N,
        || format!("everything from a delivered:\n{}", b.stats()),
    );
    wait_judged(&b, later);
    order.assert_ok();
    let s = b.stats();
    assert_eq!(
        s.connections.idle_timeouts, 0,
        "a's bytes were waiting: not silence\n{s}"
    );
    let p = s.peer("held-a").expect("peer");
    assert_eq!(
        (p.connects, p.disconnects),
        (1, 0),
        "the same connection:\n{s}"
    );
    a.shutdown(SHUTDOWN).expect("shutdown a");
    b.shutdown(SHUTDOWN).expect("shutdown b");
}

/// Two members whose `b` holds at most 4 KiB of `a`'s messages (`recv_window`) and whose
/// handler blocks on an OOB message `block` until the gate opens (one thread delivers `a`'s
/// OOB messages). `a` (a 64 KiB window) then sends `block` and three more OOB messages of
/// 2 KiB: the handler blocks on the first, the others wait behind it, `b` holds more than
/// its receive window, and stops reading `a`'s connection (TCP back-pressure).
struct Paused {
    a: Node,
    b: Node,
    gate: Arc<Gate>,
    /// Regular messages handled, and those that came out of order (OOB messages share
    /// their sequence numbers, so only the payload counters are checked).
    regular: Arc<AtomicU64>,
    disorder: Arc<AtomicU64>,
    oob: Arc<AtomicU64>,
}

impl Paused {
    fn new(prefix: &str, heartbeat: Duration, b_idle: Duration) -> Paused {
        let gate = Gate::new();
        let regular = Arc::new(AtomicU64::new(0));
        let disorder = Arc::new(AtomicU64::new(0));
        let oob = Arc::new(AtomicU64::new(0));
        let (g, r, dis, n) = (gate.clone(), regular.clone(), disorder.clone(), oob.clone());
        let b = Node::builder(&format!("{prefix}-b"))
            .cluster(CLUSTER)
            .allow_unknown_members(true)
            .recv_window(4096)
            .oob_concurrency(1)
            .heartbeat(heartbeat, b_idle)
            .on_message(move |d| {
                if d.is_oob() {
                    if d.payload() == b"block" {
                        g.pass();
                    }
                    n.fetch_add(1, Ordering::SeqCst);
                } else {
                    // One deliverer at a time per sender: a plain load and store will do.
                    let next = r.load(Ordering::SeqCst);
                    if counter_of(d.payload()) != Ok(next) {
                        dis.fetch_add(1, Ordering::SeqCst);
                    }
                    r.store(next + 1, Ordering::SeqCst);
                }
            })
            .start()
            .expect("start b");
        let a = Node::builder(&format!("{prefix}-a"))
            .cluster(CLUSTER)
            .window_bytes(64 * 1024)
            .heartbeat(heartbeat, Duration::from_secs(60))
            .peer(&format!("{prefix}-b"), b.local_addr())
            .start()
            .expect("start a");
        let p = Paused {
            a,
            b,
            gate,
            regular,
            disorder,
            oob,
        };
        wait_until("connected both ways", PATIENCE, || {
            is_connected(&p.a, p.b.name()) && is_connected(&p.b, p.a.name())
        });
        p.a.send_oob(p.b.name(), &b"block"[..]).expect("send_oob");
        for i in 0..3 {
            p.a.send_oob(p.b.name(), payload(i, 2048))
                .expect("send_oob");
        }
        wait_until_or(
            PATIENCE,
            || p.b.stats().connections.read_pauses >= 1,
            || format!("b paused reading a:\n{}", p.b.stats()),
        );
        p
    }

    /// Opens the gate and waits until `b` has handled the four OOB messages and `n`
    /// regular ones.
    fn drain(&self, n: u64) {
        self.gate.open();
        wait_until_or(
            PATIENCE,
            || self.oob.load(Ordering::SeqCst) == 4 && self.regular.load(Ordering::SeqCst) == n,
            || format!("everything handled:\n{}", self.b.stats()),
        );
        assert_eq!(self.disorder.load(Ordering::SeqCst), 0, "in order");
    }

    fn shutdown(self) {
        self.a.shutdown(SHUTDOWN).expect("shutdown a");
        self.b.shutdown(SHUTDOWN).expect("shutdown b");
    }
}

/// Reading paused (the peer holds more than the receive window) for three idle timeouts
/// (on the node's clock, moved forward while paused), with the peer's messages written
/// meanwhile, is not the peer's silence: its bytes wait in the socket, and the connection
/// stays.
#[test]
fn reading_paused_for_a_peer_over_its_receive_window_is_not_silence() {
    const N: u64 = 100;
    const IDLE: Duration = Duration::from_millis(750);
    let p = Paused::new("paused", Duration::from_millis(50), IDLE);
    for i in 0..N {
        p.a.send(p.b.name(), payload(i, 64)).expect("send");
    }
    let frames = N * wire::data_frame_len(true, 64) as u64;
    wait_unread("a's messages", p.b.local_addr().port(), None, frames);
    // The fault: paused for three idle timeouts, as b's clock counts them, and judged so
    // while still paused.
    let later = p.b.advance_clock(3 * IDLE);
    wait_judged(&p.b, later);
    p.drain(N);
    let s = p.b.stats();
    assert_eq!(
        s.connections.idle_timeouts, 0,
        "reading was paused here, not silent there\n{s}"
    );
    let peer = s.peer(p.a.name()).expect("peer");
    assert_eq!(
        (peer.connects, peer.disconnects),
        (1, 0),
        "the same connection:\n{s}"
    );
    p.shutdown();
}

/// Bytes that reached the socket while reading was paused are read once the handler has
/// caught up, although nothing more arrives to raise a new readiness edge (edge-triggered
/// polling reports arrivals, not bytes waiting): the resumed socket is read until it would
/// block.
#[test]
fn bytes_left_in_a_paused_socket_are_read_without_a_new_edge() {
    const N: u64 = 50;
    const SIZE: usize = 1000;
    // No heartbeats for the length of the test: after its burst `a` writes nothing more.
    let quiet = Duration::from_secs(60);
    let p = Paused::new("edge", quiet, quiet);
    for i in 0..N {
        p.a.send(p.b.name(), payload(i, SIZE)).expect("send");
    }
    let burst = N * wire::data_frame_len(true, SIZE) as u64;
    let port = p.b.local_addr().port();
    wait_until_or(
        PATIENCE,
        || receive_queue(port, None).is_some_and(|q| q >= burst),
        || {
            format!(
                "the burst waiting in b's socket ({:?} of {burst} bytes)",
                receive_queue(port, None)
            )
        },
    );
    p.drain(N);
    assert_eq!(p.b.stats().connections.idle_timeouts, 0);
    p.shutdown();
}

/// A dialler whose loop is held while the acceptor's Ready arrives, and past its handshake
/// deadline (on its clock, moved forward while it is held), reads the Ready before it
/// judges the deadline: the handshake completed in
/// time as far as the peer is concerned, and the loop had not looked. (Before, the turn
/// went on to the timers and closed the connection as a handshake timeout.)
#[test]
fn a_handshake_deadline_passing_while_the_loop_is_held_is_judged_after_a_poll() {
    const HANDSHAKE: Duration = Duration::from_secs(3);
    let hold = Hold::new();
    let c = Node::builder("hsd-c")
        .cluster(CLUSTER)
        .allow_unknown_members(true)
        .start()
        .expect("start c");
    let b = Node::builder("hsd-b")
        .cluster(CLUSTER)
        .handshake_timeout(HANDSHAKE)
        .outbound_filter(hold.filter())
        .peer("hsd-c", c.local_addr())
        .start()
        .expect("start b");
    wait_until("b connected to c", PATIENCE, || is_connected(&b, "hsd-c"));

    // b dials a member played by hand, here.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    b.add_peer("hsd-r", addr).expect("add_peer");
    let (mut s, _) = listener.accept().expect("accept b's dial");
    s.set_read_timeout(Some(PATIENCE)).expect("timeout");
    let mut hello = Vec::new();
    let mut hs = Handshake::acceptor(identity("hsd-r"), [0; wire::NONCE_LEN], &mut hello);
    s.write_all(&hello).expect("write Hello");
    let reply = read_frame(&mut s).expect("HelloReply");
    let (f, _) = wire::decode(&reply, 4096).expect("decodes").expect("whole");
    assert!(matches!(hs.on_frame(&f), Ok(HsEvent::Identified { .. })));
    let mut ready = Vec::new();
    hs.accept(0, 0, 0, &mut ready);

    // Hold b's loop (publishing to c), answer while it is held, and keep it held until
    // its handshake deadline has passed, as its clock counts it (the fault).
    b.send("hsd-c", HOLD).expect("send");
    hold.wait_held();
    s.write_all(&ready).expect("write Ready");
    let b_port = s.peer_addr().expect("b's address").port();
    wait_unread("the Ready", b_port, Some(addr.port()), ready.len() as u64);
    let later = b.advance_clock(HANDSHAKE + HANDSHAKE / 4);
    hold.release();

    wait_until_or(
        PATIENCE,
        || is_connected(&b, "hsd-r") || b.stats().connections.handshake_timeouts > 0,
        || format!("the handshake judged:\n{}", b.stats()),
    );
    wait_judged(&b, later);
    let st = b.stats();
    assert_eq!(
        st.connections.handshake_timeouts, 0,
        "the Ready was waiting in the socket\n{st}"
    );
    assert!(is_connected(&b, "hsd-r"), "{st}");
    b.shutdown(SHUTDOWN).expect("shutdown b");
    c.shutdown(SHUTDOWN).expect("shutdown c");
}

/// An acceptor writes its Ready as soon as it accepts the handshake, not at the end of its
/// loop turn: here the rest of the turn is held (publishing the message queued for the
/// new peer), and the Ready reaches the dialler meanwhile. The dialler's silence is
/// measured from the moment the acceptor read its HelloReply, so a Ready held back by the
/// acceptor's own turn was counted against the dialler.
#[test]
fn an_acceptor_writes_its_ready_before_the_rest_of_its_turn() {
    let hold = Hold::new();
    // b knows d at an address where nobody listens: its dial fails, and a message for d
    // waits until d dials in.
    let nowhere = HeldAddr::new();
    let b = Node::builder("rdy-b")
        .cluster(CLUSTER)
        .reconnect_backoff(Duration::from_secs(30), Duration::from_secs(60))
        .peer("rdy-d", nowhere.addr())
        .outbound_filter(hold.filter())
        .start()
        .expect("start b");
    wait_until_or(
        PATIENCE,
        || b.stats().connections.dial_failures >= 1,
        || format!("b's dial failed:\n{}", b.stats()),
    );
    b.send("rdy-d", HOLD).expect("send");

    let mut s = TcpStream::connect(b.local_addr()).expect("connect");
    s.set_read_timeout(Some(PATIENCE)).expect("timeout");
    let mut hs = Handshake::dialler(identity("rdy-d"), "rdy-b".into(), [0; wire::NONCE_LEN]);
    let hello = read_frame(&mut s).expect("Hello");
    let (f, _) = wire::decode(&hello, 4096).expect("decodes").expect("whole");
    assert!(matches!(hs.on_frame(&f), Ok(HsEvent::Identified { .. })));
    let mut reply = Vec::new();
    hs.accept(0, 0, 0, &mut reply);
    s.write_all(&reply).expect("write HelloReply");

    // b accepts, establishes, publishes the held message: its loop is held from there.
    hold.wait_held();
    // Pacing: how long the Ready may take while b is held (it is written before the hold).
    s.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    let ready = read_frame(&mut s);
    hold.release();
    let ready = ready.expect("the Ready arrived while b's loop was held");
    let (f, _) = wire::decode(&ready, 4096).expect("decodes").expect("whole");
    assert!(matches!(hs.on_frame(&f), Ok(HsEvent::Established { .. })));
    wait_until("b connected to d", PATIENCE, || is_connected(&b, "rdy-d"));
    b.shutdown(SHUTDOWN).expect("shutdown b");
}

/// `remove_peer` returns once the member is gone, and that includes reporting the messages
/// it never acknowledged to `on_undelivered`: a caller that goes on from there (resending
/// them elsewhere, settling its books) finds them reported. Here the loop is held right
/// after the removal, in the same turn (publishing a message to another member), so a
/// report left for later in the turn would come after `remove_peer` returned.
#[test]
fn remove_peer_returns_after_the_unacknowledged_messages_are_reported() {
    const FIRST: &[u8] = b"hold the loop before the removal";
    const AFTER: &[u8] = b"hold the loop after the removal";
    let (first, after) = (Hold::on(FIRST), Hold::on(AFTER));
    let reported = Arc::new(AtomicU64::new(0));
    // b acknowledges nothing within the test: its acks are due a minute after receipt, and
    // it returns no credit on its own.
    let b = Node::builder("rmr-b")
        .cluster(CLUSTER)
        .allow_unknown_members(true)
        .ack_delay(Duration::from_secs(60))
        .credit_on_idle(false)
        .start()
        .expect("start b");
    let c = Node::builder("rmr-c")
        .cluster(CLUSTER)
        .allow_unknown_members(true)
        .start()
        .expect("start c");
    let (f, s, r) = (first.clone(), after.clone(), reported.clone());
    let a = Node::builder("rmr-a")
        .cluster(CLUSTER)
        .peer("rmr-b", b.local_addr())
        .peer("rmr-c", c.local_addr())
        .outbound_filter(move |_, m| {
            f.check(m);
            s.check(m);
            true
        })
        .on_undelivered(move |peer, messages| {
            if peer == "rmr-b" {
                r.fetch_add(messages.len() as u64, Ordering::SeqCst);
            }
        })
        .start()
        .expect("start a");
    wait_until("a connected to b and c", PATIENCE, || {
        is_connected(&a, "rmr-b") && is_connected(&a, "rmr-c")
    });
    a.send("rmr-b", payload(0, 64)).expect("send");
    wait_until("b received it", PATIENCE, || {
        b.stats().peer("rmr-a").is_some_and(|p| p.received == 1)
    });

    // Held while publishing to b: the removal and a message to c are taken together once
    // it goes on, the removal first.
    a.send("rmr-b", FIRST).expect("send");
    first.wait_held();
    let seen = thread::scope(|scope| {
        let remover = scope.spawn(|| {
            a.remove_peer("rmr-b").expect("remove_peer");
            reported.load(Ordering::SeqCst)
        });
        wait_until("the removal asked for", PATIENCE, || {
            !a.peers().iter().any(|p| p == "rmr-b")
        });
        a.send("rmr-c", AFTER).expect("send");
        first.release();
        after.wait_held();
        // b's connection closed: the removal was handled in this turn, before the hold.
        if a.stats().connections.open == 1 {
            let seen = remover.join().expect("remover");
            after.release();
            seen
        } else {
            after.release();
            remover.join().expect("remover")
        }
    });
    assert_eq!(
        seen, 2,
        "both messages b never acknowledged were reported when remove_peer returned"
    );
    a.shutdown(SHUTDOWN).expect("shutdown a");
    b.shutdown(SHUTDOWN).expect("shutdown b");
    c.shutdown(SHUTDOWN).expect("shutdown c");
}
