//! Round-trip time of a 64 B message between two members, cohort against a raw-TCP
//! baseline in the same run.
//!
//! - `cohort`: member `ping` sends to member `pong`; pong's handler sends the payload back
//!   through a [`cohort::Sender`]; ping's handler signals the bench thread, which then sends
//!   the next one. Each round trip crosses both nodes' IO threads and delivery pools.
//! - `raw_tcp`: one blocking `std::net::TcpStream` pair with `TCP_NODELAY`, frames of a
//!   little-endian `u32` length and the payload; an echo thread reads each frame through a
//!   64 KiB `BufReader` and writes it back, the bench thread writes a frame and reads the
//!   echo.
//!
//! One iteration is one round trip; criterion reports the time per round trip. After the
//! group a line gives both medians and their ratio.
//!
//! `cargo bench --bench ping_pong`; `cargo test --benches` runs each case once.

mod common;

use std::io::{self, BufReader, Write};
use std::net::TcpStream;
use std::sync::{mpsc, Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use cohort::{Bytes, Node, Sender};
use common::Samples;
use criterion::{criterion_group, criterion_main, Criterion};

/// Payload of every ping and pong.
const SIZE: usize = 64;

/// Longest wait for one reply before the bench fails.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Two cohort members; `pong` echoes whatever `ping` sends.
struct CohortPair {
    ping: Node,
    pong: Node,
    replies: mpsc::Receiver<()>,
}

impl CohortPair {
    fn start() -> Result<CohortPair, cohort::Error> {
        // The echo handler needs pong's own Sender, which exists only once pong started.
        let pong_sender: Arc<OnceLock<Sender>> = Arc::new(OnceLock::new());
        let echo = pong_sender.clone();
        let pong = Node::builder("pong")
            .cluster("bench")
            .on_message(move |d| {
                let sender = echo.get().expect("pong's Sender is set before any ping");
                sender
                    .send(d.from(), d.payload().clone())
                    .expect("pong: reply to ping");
            })
            .start()?;
        pong_sender
            .set(pong.sender())
            .expect("pong's Sender is set once");

        let (replied, replies) = mpsc::channel();
        let ping = Node::builder("ping")
            .cluster("bench")
            .peer("pong", pong.local_addr())
            .on_message(move |_| {
                // The bench thread may have given up (and dropped the receiver) already.
                let _ = replied.send(());
            })
            .start()?;
        pong.add_peer("ping", ping.local_addr())?;
        Ok(CohortPair {
            ping,
            pong,
            replies,
        })
    }

    fn round_trip(&self, payload: &Bytes) {
        self.ping
            .send("pong", payload.clone())
            .expect("ping: send to pong");
        if let Err(e) = self.replies.recv_timeout(REPLY_TIMEOUT) {
            panic!("cohort: no reply from pong within {REPLY_TIMEOUT:?}: {e}");
        }
    }

    fn shutdown(self) {
        for node in [&self.ping, &self.pong] {
            if let Err(e) = node.shutdown(Duration::from_secs(5)) {
                eprintln!("{}: shutdown failed: {e}", node.name());
            }
        }
    }
}

/// A blocking TCP connection to an echo thread.
struct RawPair {
    client: TcpStream,
    reader: BufReader<TcpStream>,
    echo: thread::JoinHandle<io::Result<()>>,
    frame: Vec<u8>,
    reply: Vec<u8>,
}

impl RawPair {
    fn start(payload: &[u8]) -> io::Result<RawPair> {
        let (client, server) = common::tcp_pair()?;
        let echo = thread::Builder::new()
            .name("raw-echo".into())
            .spawn(move || echo(server))?;
        Ok(RawPair {
            reader: BufReader::with_capacity(common::RAW_BUFFER, client.try_clone()?),
            client,
            echo,
            frame: common::frame(payload),
            reply: vec![0; common::RAW_MAX_FRAME],
        })
    }

    fn round_trip(&mut self) {
        self.client.write_all(&self.frame).expect("raw TCP: write");
        match common::read_frame(&mut self.reader, &mut self.reply) {
            Ok(Some(_)) => {}
            Ok(None) => panic!("raw TCP: the echo thread closed the connection"),
            Err(e) => panic!("raw TCP: read: {e}"),
        }
    }

    fn shutdown(self) {
        drop(self.reader);
        drop(self.client);
        match self.echo.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("raw TCP echo failed: {e}"),
            Err(_) => eprintln!("raw TCP echo panicked"),
        }
    }
}

/// Sends every frame read from `stream` back, until end of stream.
fn echo(stream: TcpStream) -> io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::with_capacity(common::RAW_BUFFER, stream);
    let mut buf = vec![0u8; common::RAW_MAX_FRAME];
    let mut frame = Vec::with_capacity(4 + SIZE);
    while let Some(len) = common::read_frame(&mut reader, &mut buf)? {
        frame.clear();
        common::write_frame(&mut frame, &buf[..len])?;
        writer.write_all(&frame)?;
    }
    Ok(())
}

/// Times `iters` round trips with `run`, recording the call in `samples`.
fn time_round_trips(iters: u64, samples: &Samples, mut run: impl FnMut()) -> Duration {
    let started = Instant::now();
    for _ in 0..iters {
        run();
    }
    let elapsed = started.elapsed();
    samples.record(iters, elapsed);
    elapsed
}

fn ping_pong(c: &mut Criterion) {
    let payload = Bytes::from(vec![0x5A; SIZE]);
    let name = "ping_pong_64B";
    let mut group = c.benchmark_group(name);

    let cohort_samples = Samples::new(1);
    let pair = CohortPair::start().expect("cohort: start the nodes");
    pair.round_trip(&payload); // connects the members before measuring
    group.bench_function("cohort", |b| {
        b.iter_custom(|iters| {
            time_round_trips(iters, &cohort_samples, || pair.round_trip(&payload))
        })
    });
    pair.shutdown();

    let raw_samples = Samples::new(1);
    let mut raw = RawPair::start(&payload).expect("raw TCP: connect");
    group.bench_function("raw_tcp", |b| {
        b.iter_custom(|iters| time_round_trips(iters, &raw_samples, || raw.round_trip()))
    });
    raw.shutdown();
    group.finish();

    if !common::test_mode() {
        if let (Some(c), Some(r)) = (
            cohort_samples.median_per_iter(),
            raw_samples.median_per_iter(),
        ) {
            println!(
                "summary {name}: cohort {:.1} µs, raw TCP {:.1} µs per round trip, cohort/raw = {:.2}\n",
                c.as_secs_f64() * 1e6,
                r.as_secs_f64() * 1e6,
                c.as_secs_f64() / r.as_secs_f64()
            );
        }
    }
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = ping_pong
}
criterion_main!(benches);
