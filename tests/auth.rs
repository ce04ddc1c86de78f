//! Shared-secret authentication over real TCP: a peer without the secret, with
//! another secret, replaying a recorded handshake, of another cluster, or sending garbage
//! after a good handshake is closed and counted, and never disturbs a stream of messages
//! between two good members in the same process — not even when it claims to be one of them.

mod support;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use cohort::internals::proto::LocalIdentity;
use cohort::internals::wire::{self, CloseCode, Frame};
use cohort::{Node, PeerState};
use support::*;

const SECRET: &[u8] = b"the cluster's 32-byte secret....";
const CLUSTER: &str = "t-auth";

/// Two good members with a secret; `b` admits unknown members (`a` among them, so that a
/// stranger that got in would show up as a new peer too) and counts what it receives from
/// `a`, checking that it arrives in order with nothing missing.
struct Pair {
    a: Node,
    b: Node,
    got: Arc<AtomicU64>,
    disorder: Arc<AtomicU64>,
    sent: u64,
}

impl Pair {
    fn new(prefix: &str) -> Pair {
        let got = Arc::new(AtomicU64::new(0));
        let disorder = Arc::new(AtomicU64::new(0));
        let (g, d) = (got.clone(), disorder.clone());
        let b = Node::builder(&format!("{prefix}-b"))
            .cluster(CLUSTER)
            .secret(SECRET)
            .allow_unknown_members(true)
            .handshake_timeout(Duration::from_secs(2))
            .on_message(move |m| {
                let mut v = [0u8; 8];
                v.copy_from_slice(&m.payload()[..8]);
                // Messages are numbered from 0: the next one must be the count so far.
                if u64::from_le_bytes(v) != g.fetch_add(1, Ordering::SeqCst) {
                    d.fetch_add(1, Ordering::SeqCst);
                }
            })
            .start()
            .expect("start b");
        let a = Node::builder(&format!("{prefix}-a"))
            .cluster(CLUSTER)
            .secret(SECRET)
            .peer(b.name(), b.local_addr())
            .start()
            .expect("start a");
        // Only `a` dials: `b` admits it as an unknown member once it has authenticated, so
        // the pair has exactly one connection, with no tie-break.
        let mut p = Pair {
            a,
            b,
            got,
            disorder,
            sent: 0,
        };
        p.stream(200);
        p
    }

    /// Sends `n` more numbered messages from `a` to `b` and waits until `b` has them all.
    fn stream(&mut self, n: u64) {
        for _ in 0..n {
            let payload = self.sent.to_le_bytes().to_vec();
            self.a.send(self.b.name(), payload).expect("send");
            self.sent += 1;
        }
        let (got, sent) = (&self.got, self.sent);
        wait_until_or(
            PATIENCE,
            || got.load(Ordering::SeqCst) >= sent,
            || format!("the stream delivered {sent}; b:\n{}", self.b.stats()),
        );
    }

    /// The good members' connection was never disturbed, nothing was lost or reordered, and
    /// no stranger was admitted as a member.
    fn check_undisturbed(&mut self) {
        self.stream(200);
        assert_eq!(self.got.load(Ordering::SeqCst), self.sent, "nothing lost");
        assert_eq!(self.disorder.load(Ordering::SeqCst), 0, "in order");
        let s = self.b.stats();
        let pa = s.peer(self.a.name()).expect("a at b");
        assert_eq!(
            (pa.connects, pa.disconnects),
            (1, 0),
            "never disturbed: {s}"
        );
        assert_eq!(pa.state, PeerState::Connected);
        assert_eq!(pa.undelivered + pa.duplicates, 0, "{s}");
        let sa = self.a.stats();
        let pb = sa.peer(self.b.name()).expect("b at a");
        assert_eq!(
            (pb.connects, pb.disconnects),
            (1, 0),
            "never disturbed: {sa}"
        );
        assert_eq!(sa.connections.auth_failures, 0, "{sa}");
    }

    fn auth_failures(&self) -> u64 {
        self.b.stats().connections.auth_failures
    }

    /// Peers `b` knows, by name.
    fn b_peers(&self) -> Vec<String> {
        self.b.stats().peers.into_iter().map(|p| p.name).collect()
    }

    /// Waits until `b` holds only the member's connection.
    fn wait_only_member_open(&self) {
        wait_until_or(
            PATIENCE,
            || self.b.stats().connections.open == 1,
            || {
                format!(
                    "only the member's connection open at b:\n{}",
                    self.b.stats()
                )
            },
        );
    }

    fn shutdown(self) {
        self.a.shutdown(SHUTDOWN).expect("shutdown a");
        self.b.shutdown(SHUTDOWN).expect("shutdown b");
    }
}

/// A member identity for a hand-driven handshake.
fn identity(name: &str, secret: Option<&[u8]>) -> LocalIdentity {
    raw::identity(CLUSTER, name, 1 << 20, secret)
}

/// Dials `addr` and runs a complete, correct dialler handshake by hand with the crate's own
/// `proto`/`wire` code; returns the established connection.
fn raw_member(addr: SocketAddr, name: &str, expected: &str) -> TcpStream {
    raw::dial(addr, identity(name, Some(SECRET)), expected, PATIENCE)
}

fn connect(addr: SocketAddr) -> TcpStream {
    raw::connect(addr, PATIENCE)
}

fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    raw::read_frame(s, wire::MAX_HANDSHAKE_FRAME)
}

/// A member without a secret is refused both ways: when it dials, and when it is dialled.
#[test]
fn a_member_without_the_secret_is_refused_both_ways() {
    let mut p = Pair::new("nosecret");
    let open = Node::builder("open")
        .cluster(CLUSTER)
        .peer(p.b.name(), p.b.local_addr())
        .start()
        .expect("start open");
    wait_until("b refused the dial without a secret", PATIENCE, || {
        p.auth_failures() >= 1 && open.stats().connections.auth_failures >= 1
    });
    p.stream(200);
    // b dials it: b refuses its Hello, which carries no nonce.
    let before = p.auth_failures();
    p.b.add_peer("open", open.local_addr()).expect("add_peer");
    wait_until("b refused the Hello without a secret", PATIENCE, || {
        p.auth_failures() >= before + 2
    });
    assert_ne!(
        p.b.stats().peer("open").expect("configured").state,
        PeerState::Connected
    );
    assert_eq!(p.b.stats().peer("open").expect("configured").connects, 0);
    p.b.remove_peer("open").expect("remove");
    open.shutdown(SHUTDOWN).expect("shutdown open");
    p.wait_only_member_open();
    p.check_undisturbed();
    assert_eq!(p.b_peers(), vec![p.a.name().to_owned()]);
    p.shutdown();
}

/// A member with another secret is refused and counted on both sides, and never admitted
/// although `b` admits unknown members.
#[test]
fn a_wrong_secret_is_refused_and_counted() {
    let mut p = Pair::new("wrong");
    let intruder = Node::builder("intruder")
        .cluster(CLUSTER)
        .secret(b"not the cluster's secret")
        .peer(p.b.name(), p.b.local_addr())
        .start()
        .expect("start intruder");
    wait_until(
        "b refused the wrong secret (redials included)",
        PATIENCE,
        || p.auth_failures() >= 3,
    );
    p.stream(200);
    let s = intruder.stats();
    assert!(
        s.connections.auth_failures >= 1,
        "the refusal reached it: {s}"
    );
    assert_eq!(s.peer(p.b.name()).expect("b").connects, 0, "{s}");
    intruder.shutdown(SHUTDOWN).expect("shutdown intruder");
    p.wait_only_member_open();
    p.check_undisturbed();
    assert_eq!(p.b_peers(), vec![p.a.name().to_owned()], "never admitted");
    p.shutdown();
}

/// An impostor that claims a good member's name (with a new launch id, which without
/// authentication would make `b` drop the member's live connection as a stale incarnation)
/// but has the wrong secret: refused before `b` acts on the name.
#[test]
fn an_impostor_cannot_disturb_a_members_connection() {
    let mut p = Pair::new("impostor");
    let impostor = Node::builder(p.a.name())
        .cluster(CLUSTER)
        .secret(b"a guessed secret")
        .peer(p.b.name(), p.b.local_addr())
        .reconnect_backoff(Duration::from_millis(1), Duration::from_millis(20))
        .start()
        .expect("start impostor");
    for _ in 0..5 {
        let before = p.auth_failures();
        p.stream(100);
        wait_until("another impostor dial refused", PATIENCE, || {
            p.auth_failures() > before
        });
    }
    impostor.shutdown(SHUTDOWN).expect("shutdown impostor");
    p.wait_only_member_open();
    p.check_undisturbed();
    assert_eq!(
        p.b.stats().connections.tie_breaks,
        0,
        "no tie-break was run"
    );
    p.shutdown();
}

/// A real handshake recorded by a relay in the middle, then replayed: the dialler's
/// `HelloReply` to the acceptor (against a fresh nonce: refused), and the acceptor's `Hello`
/// and `Ready` to a dialler (against its fresh nonce: refused).
#[test]
fn a_replayed_handshake_is_refused() {
    let mut p = Pair::new("replay");
    // Record: member "c" dials b through a relay that forwards the three handshake frames.
    let relay = TcpListener::bind("127.0.0.1:0").expect("bind relay");
    let relay_addr = relay.local_addr().expect("addr");
    let b_addr = p.b.local_addr();
    let recorder = thread::spawn(move || {
        let (mut c, _) = relay.accept().expect("accept c");
        c.set_read_timeout(Some(PATIENCE)).expect("timeout");
        let mut b = connect(b_addr);
        let hello = read_frame(&mut b).expect("Hello");
        c.write_all(&hello).expect("relay Hello");
        let reply = read_frame(&mut c).expect("HelloReply");
        b.write_all(&reply).expect("relay HelloReply");
        let ready = read_frame(&mut b).expect("Ready");
        c.write_all(&ready).expect("relay Ready");
        (hello, reply, ready, c, b)
    });
    let c = Node::builder("c")
        .cluster(CLUSTER)
        .secret(SECRET)
        .peer(p.b.name(), relay_addr)
        .start()
        .expect("start c");
    let (hello, reply, ready, c_end, b_end) = recorder.join().expect("recorder");
    wait_until("c connected through the relay", PATIENCE, || {
        c.stats().peer(p.b.name()).is_some_and(|s| s.connects == 1)
    });
    c.shutdown(SHUTDOWN).expect("shutdown c");
    drop((c_end, b_end));
    assert!(matches!(
        wire::decode(&reply, 4096),
        Ok(Some((Frame::HelloReply(_, _, _, _, Some(_)), _)))
    ));

    // Replay the dialler's HelloReply to b on a new connection.
    let before = p.auth_failures();
    let mut s = connect(p.b.local_addr());
    let fresh_hello = read_frame(&mut s).expect("Hello");
    assert_ne!(fresh_hello, hello, "a fresh nonce each time");
    s.write_all(&reply).expect("replay");
    assert_eq!(raw::closed_with(&mut s), Some(CloseCode::Auth));
    wait_until("b counted the replay", PATIENCE, || {
        p.auth_failures() > before
    });
    p.stream(200);

    // Replay b's Hello and Ready to a dialler "d" that means to reach b.
    let fake = TcpListener::bind("127.0.0.1:0").expect("bind fake b");
    let d = Node::builder("d")
        .cluster(CLUSTER)
        .secret(SECRET)
        .peer(p.b.name(), fake.local_addr().expect("addr"))
        .start()
        .expect("start d");
    let (mut s, _) = fake.accept().expect("d dials");
    s.set_read_timeout(Some(PATIENCE)).expect("timeout");
    s.write_all(&hello).expect("replay Hello");
    let d_reply = read_frame(&mut s).expect("d answers the Hello");
    assert_ne!(d_reply, reply);
    s.write_all(&ready).expect("replay Ready");
    assert_eq!(raw::closed_with(&mut s), Some(CloseCode::Auth));
    wait_until("d counted the replay", PATIENCE, || {
        d.stats().connections.auth_failures >= 1
    });
    let ds = d.stats();
    assert_eq!(ds.peer(p.b.name()).expect("b").connects, 0, "{ds}");
    d.shutdown(SHUTDOWN).expect("shutdown d");
    drop(fake);

    p.wait_only_member_open();
    p.check_undisturbed();
    // "c" got in once, legitimately (b admits unknown members), "d" never reached b.
    let mut peers = p.b_peers();
    peers.sort();
    assert_eq!(peers, vec!["c".to_owned(), p.a.name().to_owned()]);
    p.shutdown();
}

/// The right secret but another cluster: refused for the cluster and counted as such.
#[test]
fn a_wrong_cluster_is_refused_and_counted() {
    let mut p = Pair::new("cluster");
    let far = Node::builder("far")
        .cluster("another-cluster")
        .secret(SECRET)
        .peer(p.b.name(), p.b.local_addr())
        .start()
        .expect("start far");
    wait_until("b counted the wrong cluster", PATIENCE, || {
        p.b.stats().connections.refused_cluster >= 1
    });
    p.stream(200);
    far.shutdown(SHUTDOWN).expect("shutdown far");
    p.wait_only_member_open();
    p.check_undisturbed();
    assert_eq!(p.auth_failures(), 0);
    assert_eq!(p.b_peers(), vec![p.a.name().to_owned()]);
    p.shutdown();
}

/// A client that completes a correct authenticated handshake by hand, then sends junk: that
/// one connection is closed with a counted protocol error.
#[test]
fn garbage_after_a_good_handshake_is_closed_and_counted() {
    let mut p = Pair::new("garbage");
    let before = p.b.stats().connections.protocol_errors;
    let mut s = raw_member(p.b.local_addr(), "raw", p.b.name());
    wait_until("b established the raw member", PATIENCE, || {
        p.b.stats()
            .peer("raw")
            .is_some_and(|r| r.state == PeerState::Connected)
    });
    p.stream(200);
    s.write_all(&[2, 0, 0, 0, 0x7f, 0]).expect("junk");
    assert_eq!(raw::closed_with(&mut s), Some(CloseCode::Protocol));
    wait_until("b counted the protocol error", PATIENCE, || {
        p.b.stats().connections.protocol_errors > before
    });
    p.wait_only_member_open();
    p.check_undisturbed();
    assert_eq!(p.auth_failures(), 0);
    p.shutdown();
}

/// An empty secret is a configuration error, caught at `start`.
#[test]
fn an_empty_secret_is_refused_at_start() {
    match Node::builder("empty").secret(b"").start() {
        Err(cohort::Error::Config(why @ cohort::ConfigError::EmptySecret)) => {
            assert!(why.to_string().contains("secret"), "{why}")
        }
        Err(e) => panic!("another error: {e}"),
        Ok(n) => {
            n.shutdown(SHUTDOWN).expect("shutdown");
            panic!("started with an empty secret");
        }
    }
}
