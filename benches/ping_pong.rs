//! Round-trip time of a 64 B message between two members, cohort with its defaults and with
//! its low-latency setting against a raw-TCP baseline, in the same run.
//!
//! - `cohort`: member `ping` sends to member `pong`; pong's handler sends the payload back
//!   through the node handle its delivery carries; ping's handler signals the bench thread,
//!   which then sends the next one. Each round trip crosses both nodes' IO threads and
//!   delivery pools.
//! - `cohort_low_latency`: the same with `Builder::low_latency(50 µs)` on both nodes: their
//!   IO threads and idle delivery threads spin that long after each piece of work.
//! - `request` (and `request_low_latency`): ping's bench thread calls `Node::request`;
//!   pong's handler answers with `Delivery::reply`, which ping's IO thread hands straight to
//!   the waiting request (no delivery pool on ping's side).
//! - `inbox` (and `inbox_low_latency`): ping takes pong's echo on the bench thread from its
//!   `Inbox` (`Builder::start_with_inbox`), again without a pool hop on ping's side.
//! - `cohort_uds`, `request_uds` (and their `_low_latency`): the `cohort` and `request`
//!   cases with both members listening on Unix-domain sockets (`Addr::unix`), against
//!   `raw_uds`, the raw baseline over a `UnixStream` pair; the table gives each with its ratio
//!   to raw TCP, so UDS against TCP loopback is read off one run.
//! - `raw_tcp`: one blocking `std::net::TcpStream` pair with `TCP_NODELAY`, frames of a
//!   little-endian `u32` length and the payload; an echo thread reads each frame through a
//!   64 KiB `BufReader` and writes it back, the bench thread writes a frame and reads the
//!   echo.
//!
//! One iteration is one round trip; criterion reports the mean time per round trip. Every
//! round trip of criterion's measured samples is also timed on its own, and after the group
//! a table gives min, p50, p99 and p99.9 of each case, the process's CPU time per round trip
//! over those samples (every thread: what a spinning idle strategy burns shows here), and
//! the ratios to raw TCP, with the mode the baseline ran in (on a VM, raw TCP's round trip is either a few microseconds or,
//! when its two threads wake on different idle cores, tens of microseconds).
//!
//! `cargo bench --bench ping_pong`; `cargo test --benches` runs each case once.

mod common;

use std::io::{self, BufReader, Write};
use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use cohort::{Builder, Bytes, Inbox, Node};
use common::{Over, RawStream};
use criterion::{criterion_group, criterion_main, Criterion};

/// Payload of every ping and pong.
const SIZE: usize = 64;

/// Longest wait for one reply before the bench fails.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// How a case configures both nodes.
type Setting = fn(Builder) -> Builder;

/// The spin of the low-latency case (`Builder::low_latency`).
const LOW_LATENCY_SPIN: Duration = Duration::from_micros(50);

/// How `ping` gets its answer.
#[derive(Clone, Copy)]
enum Shape {
    /// Pong sends the payload back; ping's handler signals the bench thread.
    Handler,
    /// Ping's bench thread takes pong's echo from its inbox (no hop to a pool thread).
    Inbox,
    /// Ping requests, pong's handler replies: the reply goes straight from ping's IO thread
    /// to the waiting request.
    Request,
}

/// How ping receives, per shape.
enum Answers {
    Handler(mpsc::Receiver<()>),
    Inbox(Inbox),
    Request,
}

/// Two cohort members; `pong` echoes whatever `ping` sends, or replies to its requests.
struct CohortPair {
    ping: Node,
    pong: Node,
    answers: Answers,
}

impl CohortPair {
    /// The pair, each node built from `Node::builder` through `setting`, answering as
    /// `shape` says.
    fn start(setting: Setting, shape: Shape, over: Over) -> Result<CohortPair, cohort::Error> {
        let dir = match over {
            Over::Tcp => std::path::PathBuf::new(),
            Over::Unix => common::socket_dir("ping-pong"),
        };
        let pong = setting(Node::builder("pong"))
            .cluster("bench")
            .listen(common::listen_addr(over, &dir, "pong"))
            .on_message(move |d| {
                if d.is_request() {
                    d.reply(d.payload_bytes()).expect("pong: reply to ping");
                } else {
                    let node = d.sender().expect("a delivery carries its node");
                    node.send(d.from(), d.payload_bytes())
                        .expect("pong: echo to ping");
                }
            })
            .start()?;
        let ping = setting(Node::builder("ping"))
            .cluster("bench")
            .listen(common::listen_addr(over, &dir, "ping"))
            .peer("pong", pong.listen_addr());
        let (ping, answers) = match shape {
            Shape::Handler => {
                let (replied, replies) = mpsc::channel();
                let ping = ping
                    .on_message(move |_| {
                        // The bench thread may have given up (dropped the receiver) already.
                        let _ = replied.send(());
                    })
                    .start()?;
                (ping, Answers::Handler(replies))
            }
            Shape::Inbox => {
                let (ping, inbox) = ping.start_with_inbox()?;
                (ping, Answers::Inbox(inbox))
            }
            Shape::Request => (ping.start()?, Answers::Request),
        };
        pong.add_peer("ping", ping.listen_addr())?;
        Ok(CohortPair {
            ping,
            pong,
            answers,
        })
    }

    fn round_trip(&self, payload: &Bytes) {
        let answered = match &self.answers {
            Answers::Request => self
                .ping
                .request("pong", payload.clone(), REPLY_TIMEOUT)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Answers::Handler(replies) => {
                self.ping
                    .send("pong", payload.clone())
                    .expect("ping: send to pong");
                replies
                    .recv_timeout(REPLY_TIMEOUT)
                    .map_err(|e| e.to_string())
            }
            Answers::Inbox(inbox) => {
                self.ping
                    .send("pong", payload.clone())
                    .expect("ping: send to pong");
                inbox
                    .recv_timeout(REPLY_TIMEOUT)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        };
        if let Err(e) = answered {
            panic!("cohort: no answer from pong within {REPLY_TIMEOUT:?}: {e}");
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

/// A blocking connection (TCP or Unix-domain) to an echo thread.
struct RawPair {
    client: RawStream,
    reader: BufReader<RawStream>,
    echo: thread::JoinHandle<io::Result<()>>,
    frame: Vec<u8>,
    reply: Vec<u8>,
}

impl RawPair {
    fn start(payload: &[u8], over: Over) -> io::Result<RawPair> {
        let (client, server) = common::raw_pair(over)?;
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
fn echo(stream: RawStream) -> io::Result<()> {
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

/// Every round trip of each `iter_custom` call of one benchmark function, timed on its own,
/// and the process's CPU time over each call.
#[derive(Debug, Default)]
struct Latencies {
    calls: Mutex<Vec<Vec<Duration>>>,
    cpu: Mutex<Vec<Duration>>,
}

impl Latencies {
    /// Times `iters` round trips with `run`, one by one; returns the total.
    fn time(&self, iters: u64, mut run: impl FnMut()) -> Duration {
        let mut each = Vec::with_capacity(iters as usize);
        let cpu = common::process_cpu();
        let started = Instant::now();
        let mut last = started;
        for _ in 0..iters {
            run();
            let now = Instant::now();
            each.push(now - last);
            last = now;
        }
        let elapsed = last - started;
        if let (Some(before), Some(after)) = (cpu, common::process_cpu()) {
            self.cpu
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(after.saturating_sub(before));
        }
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(each);
        elapsed
    }

    /// How many of the last calls are criterion's measured samples (warm-up calls come
    /// first).
    fn samples() -> usize {
        if common::quick_mode() {
            2
        } else {
            common::SAMPLE_SIZE
        }
    }

    /// The process's CPU time (every thread: both members, or raw TCP's two threads, and
    /// the bench thread) per round trip over criterion's measured samples, in microseconds;
    /// `None` where it could not be read.
    fn cpu_per_trip(&self) -> Option<f64> {
        let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let cpu = self.cpu.lock().unwrap_or_else(|e| e.into_inner());
        if cpu.len() != calls.len() {
            return None;
        }
        let n = Self::samples();
        let trips: usize = calls[calls.len().saturating_sub(n)..]
            .iter()
            .map(Vec::len)
            .sum();
        let total: Duration = cpu[cpu.len().saturating_sub(n)..].iter().sum();
        (trips > 0).then(|| total.as_secs_f64() * 1e6 / trips as f64)
    }

    /// The round trips of criterion's measured samples (its last calls: warm-up calls come
    /// first), sorted.
    fn measured(&self) -> Vec<Duration> {
        let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let samples = Self::samples();
        let mut all: Vec<Duration> = calls[calls.len().saturating_sub(samples)..]
            .iter()
            .flatten()
            .copied()
            .collect();
        all.sort();
        all
    }
}

/// min, p50, p99, p99.9 of `sorted` (not empty), in microseconds.
fn percentiles(sorted: &[Duration]) -> [f64; 4] {
    let at = |q: f64| {
        let rank = (q * (sorted.len() - 1) as f64).round() as usize;
        sorted[rank].as_secs_f64() * 1e6
    };
    [at(0.0), at(0.5), at(0.99), at(0.999)]
}

/// Prints the table of every case's percentiles and their ratios to raw TCP.
fn summary(name: &str, cases: &[(&str, &Latencies)]) {
    let rows: Vec<(&str, usize, [f64; 4], Option<f64>)> = cases
        .iter()
        .filter_map(|(case, l)| {
            let sorted = l.measured();
            (!sorted.is_empty())
                .then(|| (*case, sorted.len(), percentiles(&sorted), l.cpu_per_trip()))
        })
        .collect();
    let Some(&(_, _, raw, raw_cpu)) = rows.iter().find(|r| r.0 == "raw_tcp") else {
        return;
    };
    println!(
        "summary {name}: µs per round trip, and CPU µs per round trip (every thread of the \
         process); ratio to raw TCP in brackets"
    );
    println!(
        "  {:<24} {:>9} {:>16} {:>16} {:>16} {:>16} {:>16}",
        "case", "trips", "min", "p50", "p99", "p99.9", "CPU"
    );
    for (case, n, p, cpu) in &rows {
        let cell = |k: usize| format!("{:.1} ({:.2}×)", p[k], p[k] / raw[k]);
        let cpu = match (cpu, raw_cpu) {
            (Some(c), Some(r)) if r > 0.0 => format!("{c:.1} ({:.2}×)", c / r),
            (Some(c), _) => format!("{c:.1}"),
            _ => "-".to_owned(),
        };
        println!(
            "  {case:<24} {n:>9} {:>16} {:>16} {:>16} {:>16} {cpu:>16}",
            cell(0),
            cell(1),
            cell(2),
            cell(3)
        );
    }
    // Raw TCP has two modes: fast, its round trips close to its minimum (both threads woken
    // on one core, or on cores that were not idle); slow, several times that (each wake-up
    // lands on an idle core, which takes tens of microseconds on a VM). A ratio below 1
    // against the slow mode means nothing.
    let mode = if raw[1] < 2.0 * raw[0] {
        "fast"
    } else {
        "slow"
    };
    println!(
        "  raw TCP baseline ran in its {mode} mode (p50 {:.1} µs, {:.1}× its minimum)\n",
        raw[1],
        raw[1] / raw[0]
    );
}

fn ping_pong(c: &mut Criterion) {
    let payload = Bytes::from(vec![0x5A; SIZE]);
    let name = "ping_pong_64B";
    let mut group = c.benchmark_group(name);

    let raw_latencies = Latencies::default();
    let mut raw = RawPair::start(&payload, Over::Tcp).expect("raw TCP: connect");
    group.bench_function("raw_tcp", |b| {
        b.iter_custom(|iters| raw_latencies.time(iters, || raw.round_trip()))
    });
    raw.shutdown();
    let raw_uds_latencies = Latencies::default();
    if cfg!(unix) {
        let mut raw = RawPair::start(&payload, Over::Unix).expect("raw UDS: a socket pair");
        group.bench_function("raw_uds", |b| {
            b.iter_custom(|iters| raw_uds_latencies.time(iters, || raw.round_trip()))
        });
        raw.shutdown();
    }

    let defaults: Setting = |b| b;
    let low_latency: Setting = |b| b.low_latency(LOW_LATENCY_SPIN);
    let cases: [(&str, Setting, Shape, Over); 10] = [
        ("cohort", defaults, Shape::Handler, Over::Tcp),
        ("cohort_low_latency", low_latency, Shape::Handler, Over::Tcp),
        ("request", defaults, Shape::Request, Over::Tcp),
        (
            "request_low_latency",
            low_latency,
            Shape::Request,
            Over::Tcp,
        ),
        ("inbox", defaults, Shape::Inbox, Over::Tcp),
        ("inbox_low_latency", low_latency, Shape::Inbox, Over::Tcp),
        ("cohort_uds", defaults, Shape::Handler, Over::Unix),
        (
            "cohort_uds_low_latency",
            low_latency,
            Shape::Handler,
            Over::Unix,
        ),
        ("request_uds", defaults, Shape::Request, Over::Unix),
        (
            "request_uds_low_latency",
            low_latency,
            Shape::Request,
            Over::Unix,
        ),
    ];
    let mut cohort_latencies = Vec::new();
    for (case, setting, shape, over) in cases {
        if over == Over::Unix && !cfg!(unix) {
            continue;
        }
        let latencies = Latencies::default();
        let pair = CohortPair::start(setting, shape, over).expect("cohort: start the nodes");
        pair.round_trip(&payload); // connects the members before measuring
        group.bench_function(case, |b| {
            b.iter_custom(|iters| latencies.time(iters, || pair.round_trip(&payload)))
        });
        pair.shutdown();
        cohort_latencies.push((case, latencies));
    }
    group.finish();

    if !common::test_mode() {
        let mut cases = vec![("raw_tcp", &raw_latencies), ("raw_uds", &raw_uds_latencies)];
        cases.extend(cohort_latencies.iter().map(|(case, l)| (*case, l)));
        summary(name, &cases);
    }
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = ping_pong
}
criterion_main!(benches);
