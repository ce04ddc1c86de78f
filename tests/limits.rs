//! Bad input never hurts others (invariant 8): strangers that open connections and say
//! nothing, send an oversized or malformed frame, or trickle a handshake are each closed and
//! counted, while a stream of messages between two good members keeps flowing.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use cohort::internals::wire;
use cohort::Node;
use support::*;

/// Two good members with a stream flowing from `a` to `b`; `b` has tight limits.
fn pair(prefix: &str) -> (Node, Node, Arc<Counter>) {
    let got = Counter::new();
    let b = Node::builder(&format!("{prefix}-b"))
        .cluster("t-limits")
        .connection_limits(64, 16)
        .handshake_timeout(Duration::from_millis(300))
        .on_message(got.handler())
        .start()
        .expect("start b");
    let a = Node::builder(&format!("{prefix}-a"))
        .cluster("t-limits")
        .peer(b.name(), b.local_addr())
        .start()
        .expect("start a");
    b.add_peer(a.name(), a.local_addr()).expect("add_peer");
    (a, b, got)
}

/// Sends `n` messages from `a` to `b` and waits until `b` has them all.
fn stream(a: &Node, b: &Node, got: &Counter, n: u64) {
    let target = got.get() + n;
    for i in 0..n {
        a.send(b.name(), i.to_le_bytes().to_vec()).expect("send");
    }
    wait_until("the stream delivered", PATIENCE, || got.get() >= target);
}

/// 1,000 connections opened and left idle: the ones over the limits are shed (refused, or
/// displacing the older ones of their address), the rest time out in their handshake, and
/// the members' stream flows throughout.
#[test]
fn a_thousand_idle_connections_are_refused_or_timed_out_while_members_talk() {
    let (a, b, got) = pair("idle");
    stream(&a, &b, &got, 1_000);
    let mut strangers = Vec::new();
    for i in 0..1_000 {
        if let Ok(s) = TcpStream::connect(b.local_addr()) {
            strangers.push(s);
        }
        if i % 100 == 0 {
            stream(&a, &b, &got, 100); // flowing throughout
        }
    }
    wait_until("connections over the limits shed", PATIENCE, || {
        let c = b.stats().connections;
        c.refused_limit + c.displaced > 0
    });
    stream(&a, &b, &got, 1_000);
    wait_until("the idle strangers timed out", PATIENCE, || {
        let c = b.stats().connections;
        c.handshake_timeouts > 0 && c.open == 1
    });
    let s = b.stats();
    assert!(s.connections.open <= 64, "never above the limit: {s}");
    assert_eq!(
        s.peer(a.name()).expect("peer").connects,
        1,
        "the member was never disturbed: {s}"
    );
    drop(strangers);
    a.shutdown(Duration::from_secs(5)).expect("shutdown a");
    b.shutdown(Duration::from_secs(5)).expect("shutdown b");
}

/// An oversized frame, a malformed frame, and garbage before a handshake each close that
/// one connection with a counted protocol error; a slow-loris handshake times out.
#[test]
fn bad_frames_and_slow_handshakes_close_only_their_connection() {
    let (a, b, got) = pair("bad");
    stream(&a, &b, &got, 500);
    // A length prefix far above the handshake's size: refused before any allocation.
    let mut big = TcpStream::connect(b.local_addr()).expect("connect");
    big.write_all(&u32::MAX.to_le_bytes()).expect("write");
    // An unknown frame kind.
    let mut junk = TcpStream::connect(b.local_addr()).expect("connect");
    junk.write_all(&[2, 0, 0, 0, 0x7f, 0]).expect("write");
    // Data before any handshake.
    let mut early = TcpStream::connect(b.local_addr()).expect("connect");
    early
        .write_all(&[3, 0, 0, 0, 0x10, 0, b'x'])
        .expect("write");
    // A handshake trickled one byte at a time, never finished.
    let mut slow = TcpStream::connect(b.local_addr()).expect("connect");
    slow.write_all(&[40]).expect("write");
    wait_until("three protocol errors", PATIENCE, || {
        b.stats().connections.protocol_errors >= 3
    });
    stream(&a, &b, &got, 500);
    wait_until("the slow handshake timed out", PATIENCE, || {
        b.stats().connections.handshake_timeouts >= 1
    });
    stream(&a, &b, &got, 500);
    let s = b.stats();
    assert_eq!(
        s.connections.open, 1,
        "only the member's connection is left: {s}"
    );
    assert_eq!(
        s.peer(a.name()).expect("peer").connects,
        1,
        "never disturbed: {s}"
    );
    a.shutdown(Duration::from_secs(5)).expect("shutdown a");
    b.shutdown(Duration::from_secs(5)).expect("shutdown b");
}

/// Frames of a known kind sent at the wrong step of the handshake — a `Hello` to the
/// acceptor, or an `Ack`, `Ready`, `Probe` or `Heartbeat` instead of a `HelloReply` — break
/// the protocol: each closes its connection with `Close{Protocol}` and counts as a protocol
/// error, not as a refusal (which says the peer was refused for who it is: cluster, name,
/// version, authentication).
#[test]
fn frames_at_the_wrong_handshake_step_are_protocol_errors_not_refusals() {
    let (a, b, got) = pair("step");
    stream(&a, &b, &got, 100);
    let before = b.stats().connections;
    let mut hello = Vec::new();
    let id = wire::Identity {
        version: wire::VERSION,
        launch_id: 1,
        window: 1 << 20,
        max_message: 1 << 16,
        cluster: "t-limits",
        name: "stranger",
        nonce: None,
    };
    wire::encode_hello(&mut hello, &id);
    let mut ack = Vec::new();
    wire::encode_ack(&mut ack, 1, 1);
    let mut ready = Vec::new();
    wire::encode_ready(&mut ready, 0, 0, None);
    let mut probe = Vec::new();
    wire::encode_probe(&mut probe);
    let mut heartbeat = Vec::new();
    wire::encode_heartbeat(&mut heartbeat);
    let frames = [hello, ack, ready, probe, heartbeat];
    for frame in &frames {
        let mut s = raw::connect(b.local_addr(), PATIENCE);
        raw::read_frame(&mut s, wire::MAX_HANDSHAKE_FRAME).expect("the acceptor's Hello");
        s.write_all(frame).expect("write");
        assert_eq!(raw::closed_with(&mut s), Some(wire::CloseCode::Protocol));
    }
    let n = frames.len() as u64;
    wait_until("every wrong-step frame counted", PATIENCE, || {
        b.stats().connections.protocol_errors >= before.protocol_errors + n
    });
    stream(&a, &b, &got, 100);
    let after = b.stats().connections;
    assert_eq!(
        after.protocol_errors,
        before.protocol_errors + n,
        "{after:?}"
    );
    assert_eq!(after.refused, before.refused, "not refusals: {after:?}");
    a.shutdown(Duration::from_secs(5)).expect("shutdown a");
    b.shutdown(Duration::from_secs(5)).expect("shutdown b");
}
