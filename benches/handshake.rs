//! Connection set-up cost with and without a shared secret (`Builder::secret`), in one run.
//!
//! One iteration is one TCP connect plus a complete handshake with a running node: a client
//! on the bench thread dials the node, and drives the dialler side of the handshake with the
//! crate's own `proto::Handshake` over a blocking socket (Hello in, HelloReply out, Ready in,
//! verified). The node's IO thread does the acceptor side with all of its real code: accept,
//! Hello, checks, MAC, adopting the connection, Ready, establishing. The client closes with
//! an RST (`SO_LINGER` 0) so that thousands of connections leave no `TIME_WAIT` behind, and
//! uses one member name throughout, so the node sees a member reconnecting (each new
//! connection replaces the last one, if that one is still registered).
//!
//! - `no_secret`: neither side has a secret: no nonces, no MACs.
//! - `secret`: both have the same 32-byte secret: two OS-random nonces (one per side) and
//!   two HMAC-SHA-256 computations and two verifications per connection.
//!
//! After the group a line gives both medians and their ratio.
//!
//! `cargo bench --bench handshake`; `cargo test --benches` runs each case once.

mod common;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use cohort::proto::{Handshake, HsEvent, LocalIdentity, Secret};
use cohort::wire::{self, Frame};
use cohort::Node;
use common::Samples;
use criterion::{criterion_group, criterion_main, Criterion};

const CLUSTER: &str = "bench";
const SECRET: &[u8] = b"a 32-byte secret for the benches";

/// The client's identity; the node admits it as an unknown member on first contact.
fn client(secret: bool) -> LocalIdentity {
    LocalIdentity {
        launch_id: 0xbe0c,
        window: 4 << 20,
        max_message: 1 << 20,
        cluster: CLUSTER.into(),
        name: "client".into(),
        secret: secret.then(|| Secret::new(SECRET)),
    }
}

fn read_frame(s: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.resize(wire::LEN_BYTES, 0);
    s.read_exact(buf)?;
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > 2 + wire::MAX_HANDSHAKE_BODY {
        return Err(io::Error::other(format!("frame of {len} bytes")));
    }
    buf.resize(wire::LEN_BYTES + len, 0);
    s.read_exact(&mut buf[wire::LEN_BYTES..])
}

fn feed(hs: &mut Handshake, buf: &[u8]) -> io::Result<HsEvent> {
    let frame: Frame<'_> = match wire::decode(buf, 2 + wire::MAX_HANDSHAKE_BODY) {
        Ok(Some((f, _))) => f,
        other => return Err(io::Error::other(format!("bad frame: {other:?}"))),
    };
    hs.on_frame(&frame).map_err(io::Error::other)
}

/// One connection: connect, handshake to the end, close with an RST.
fn connect_once(addr: SocketAddr, me: &LocalIdentity, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut nonce = [0u8; wire::NONCE_LEN];
    if me.secret.is_some() {
        getrandom::getrandom(&mut nonce).map_err(|e| io::Error::other(e.to_string()))?;
    }
    let mut hs = Handshake::dialler(me.clone(), "server".into(), nonce);
    read_frame(&mut s, buf)?;
    match feed(&mut hs, buf)? {
        HsEvent::Identified { .. } => {}
        ev => return Err(io::Error::other(format!("after Hello: {ev:?}"))),
    }
    buf.clear();
    hs.accept(0, 0, 0, buf);
    s.write_all(buf)?;
    read_frame(&mut s, buf)?;
    match feed(&mut hs, buf)? {
        HsEvent::Established { .. } => {}
        ev => return Err(io::Error::other(format!("after Ready: {ev:?}"))),
    }
    socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO))?;
    Ok(())
}

fn server(secret: bool) -> Node {
    let mut b = Node::builder("server")
        .cluster(CLUSTER)
        .allow_unknown_members(true)
        .connection_limits(1 << 16, 1 << 12);
    if secret {
        b = b.secret(SECRET);
    }
    b.start().expect("start the server node")
}

fn bench_case(group_name: &str, c: &mut Criterion, secret: bool, samples: &Samples) {
    let node = server(secret);
    let addr = node.local_addr();
    let me = client(secret);
    let mut buf = Vec::with_capacity(1024);
    connect_once(addr, &me, &mut buf).expect("first connection");
    let mut group = c.benchmark_group(group_name);
    let case = if secret { "secret" } else { "no_secret" };
    group.bench_function(case, |b| {
        b.iter_custom(|iters| {
            let started = Instant::now();
            for _ in 0..iters {
                connect_once(addr, &me, &mut buf).expect("connect + handshake");
            }
            let elapsed = started.elapsed();
            samples.record(iters, elapsed);
            elapsed
        })
    });
    group.finish();
    let s = node.stats().connections;
    assert_eq!(s.auth_failures + s.protocol_errors, 0, "{s:?}");
    node.shutdown(Duration::from_secs(10))
        .expect("shutdown the server node");
}

fn handshake(c: &mut Criterion) {
    let name = "connect_handshake";
    let plain = Samples::new(1);
    let authed = Samples::new(1);
    bench_case(name, c, false, &plain);
    bench_case(name, c, true, &authed);
    if !common::test_mode() {
        if let (Some(p), Some(a)) = (plain.median_per_iter(), authed.median_per_iter()) {
            println!(
                "summary {name}: no secret {:.1} µs, secret {:.1} µs per connection, secret/none = {:.2}\n",
                p.as_secs_f64() * 1e6,
                a.as_secs_f64() * 1e6,
                a.as_secs_f64() / p.as_secs_f64()
            );
        }
    }
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = handshake
}
criterion_main!(benches);
