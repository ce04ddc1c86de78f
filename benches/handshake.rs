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
//! After the group a line gives both medians and their ratio; then the two cases alternate in
//! 40 batches of 250 connections each and a second line gives the quartiles of the batches
//! and the ratio of their medians (running the cases one after the other lets a change in the
//! machine's load between them skew the ratio). On a shared 2-core machine the time per
//! connection is bimodal — about 27 µs, or 110–120 µs when the scheduler's placement of the
//! node's IO thread makes every wake-up slow, with or without a secret — so compare runs in
//! which both cases landed in the same mode.
//!
//! A third group, `handshake_in_memory`, runs both sides of the handshake with no sockets
//! and no threads: the CPU cost alone, which is what authentication adds (nonces, HMACs).
//!
//! `cargo bench --bench handshake`; `cargo test --benches` runs each case once.

mod common;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use cohort::internals::proto::{Handshake, HsEvent, LocalIdentity, Secret};
use cohort::internals::wire::{self, Frame};
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

/// One server node and the client identity that matches it.
struct Case {
    name: &'static str,
    node: Node,
    me: LocalIdentity,
    samples: Samples,
}

impl Case {
    fn start(secret: bool) -> Case {
        let node = server(secret);
        let me = client(secret);
        let mut buf = Vec::with_capacity(1024);
        connect_once(node.local_addr(), &me, &mut buf).expect("first connection");
        Case {
            name: if secret { "secret" } else { "no_secret" },
            node,
            me,
            samples: Samples::new(1),
        }
    }

    /// Times `n` connections.
    fn run(&self, n: u64, buf: &mut Vec<u8>) -> Duration {
        let addr = self.node.local_addr();
        let started = Instant::now();
        for _ in 0..n {
            connect_once(addr, &self.me, buf).expect("connect + handshake");
        }
        started.elapsed()
    }

    fn shutdown(self) {
        let s = self.node.stats().connections;
        assert_eq!(s.auth_failures + s.protocol_errors, 0, "{s:?}");
        self.node
            .shutdown(Duration::from_secs(10))
            .expect("shutdown the server node");
    }
}

/// Quartiles (25 %, 50 %, 75 %) of per-connection times, in µs.
fn quartiles(mut v: Vec<f64>) -> [f64; 3] {
    v.sort_by(f64::total_cmp);
    [v[v.len() / 4], v[v.len() / 2], v[v.len() * 3 / 4]]
}

/// One complete handshake in memory, both sides, with the crate's `proto` code: the CPU
/// cost alone (no sockets, no threads, so no scheduling noise). With a secret it includes
/// two nonces from the OS, as the IO thread takes them.
fn in_memory(acceptor: &LocalIdentity, dialler: &LocalIdentity, bufs: &mut [Vec<u8>; 2]) {
    let nonce = || {
        let mut n = [0u8; wire::NONCE_LEN];
        if acceptor.secret.is_some() {
            getrandom::getrandom(&mut n).expect("OS randomness");
        }
        n
    };
    let [a_out, d_out] = bufs;
    a_out.clear();
    d_out.clear();
    let mut a = Handshake::acceptor(acceptor.clone(), nonce(), a_out);
    let mut d = Handshake::dialler(dialler.clone(), "server".into(), nonce());
    assert!(matches!(
        feed(&mut d, a_out),
        Ok(HsEvent::Identified { .. })
    ));
    d.accept(0, 0, 0, d_out);
    assert!(matches!(
        feed(&mut a, d_out),
        Ok(HsEvent::Identified { .. })
    ));
    a_out.clear();
    a.accept(0, 0, 0, a_out);
    assert!(matches!(
        feed(&mut d, a_out),
        Ok(HsEvent::Established { .. })
    ));
}

fn server_identity(secret: bool) -> LocalIdentity {
    LocalIdentity {
        launch_id: 0x5e,
        name: "server".into(),
        ..client(secret)
    }
}

fn handshake(c: &mut Criterion) {
    let name = "connect_handshake";
    let cases = [Case::start(false), Case::start(true)];
    let mut buf = Vec::with_capacity(1024);
    let mut group = c.benchmark_group(name);
    for case in &cases {
        group.bench_function(case.name, |b| {
            b.iter_custom(|iters| {
                let elapsed = case.run(iters, &mut buf);
                case.samples.record(iters, elapsed);
                elapsed
            })
        });
    }
    group.finish();
    if !common::test_mode() {
        if let (Some(p), Some(a)) = (
            cases[0].samples.median_per_iter(),
            cases[1].samples.median_per_iter(),
        ) {
            println!(
                "summary {name} (criterion samples): no secret {:.1} µs, secret {:.1} µs per connection, secret/none = {:.2}",
                p.as_secs_f64() * 1e6,
                a.as_secs_f64() * 1e6,
                a.as_secs_f64() / p.as_secs_f64()
            );
        }
        // The two cases above run one after the other, so a change in the machine's load
        // between them skews their ratio. Here they alternate in short batches, and the
        // medians of the batches are compared.
        const ROUNDS: usize = 40;
        const BATCH: u64 = 250;
        let mut per = [Vec::new(), Vec::new()];
        for _ in 0..ROUNDS {
            for (i, case) in cases.iter().enumerate() {
                let t = case.run(BATCH, &mut buf);
                per[i].push(t.as_secs_f64() * 1e6 / BATCH as f64);
            }
        }
        let [p, a] = per.map(quartiles);
        println!(
            "summary {name} (interleaved, {ROUNDS} × {BATCH} each; quartiles): no secret {:.1} / {:.1} / {:.1} µs, secret {:.1} / {:.1} / {:.1} µs per connection, median secret/none = {:.2}",
            p[0], p[1], p[2], a[0], a[1], a[2], a[1] / p[1]
        );
    }
    for case in cases {
        case.shutdown();
    }

    // The CPU cost of the handshake alone.
    let name = "handshake_in_memory";
    let mut group = c.benchmark_group(name);
    let mut bufs = [Vec::with_capacity(1024), Vec::with_capacity(1024)];
    let mut medians = Vec::new();
    for secret in [false, true] {
        let (acceptor, dialler) = (server_identity(secret), client(secret));
        let samples = Samples::new(1);
        let case = if secret { "secret" } else { "no_secret" };
        group.bench_function(case, |b| {
            b.iter_custom(|iters| {
                let started = Instant::now();
                for _ in 0..iters {
                    in_memory(&acceptor, &dialler, &mut bufs);
                }
                let elapsed = started.elapsed();
                samples.record(iters, elapsed);
                elapsed
            })
        });
        medians.push(samples.median_per_iter());
    }
    group.finish();
    if let (false, [Some(p), Some(a)]) = (common::test_mode(), &medians[..]) {
        println!(
            "summary {name}: no secret {:.2} µs, secret {:.2} µs per handshake (both sides), secret − none = {:.2} µs\n",
            p.as_secs_f64() * 1e6,
            a.as_secs_f64() * 1e6,
            (a.as_secs_f64() - p.as_secs_f64()) * 1e6
        );
    }
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = handshake
}
criterion_main!(benches);
