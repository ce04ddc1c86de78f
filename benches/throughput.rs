//! Throughput, 1→1, 4→1 and 8→1, at 64 B and 1 KiB payloads: cohort against a raw-TCP
//! baseline in the same run, so the ratio is read off one report, with the CPU time per
//! message of each (the whole process's CPU time over a sample, every thread of both ends,
//! from `/proc/self/stat`, divided by the messages: what a rate on many cores hides).
//!
//! - `cohort`: sender nodes (`source-0`, …) each `send` (blocking on the window) to one
//!   `sink` node on 127.0.0.1, whose handler counts messages. 4→1 (8→1) is four (eight)
//!   sender nodes, each driven by its own thread.
//! - `raw_tcp`: blocking `std::net::TcpStream`s with `TCP_NODELAY`, frames of a
//!   little-endian `u32` length and the payload, a 64 KiB `BufWriter` per sender and, per
//!   connection, a receiver thread that reads through a 64 KiB `BufReader`, parses every
//!   frame and counts it. 4→1 (8→1) is four (eight) connections, each with its own sender
//!   thread.
//!
//! - `cohort_fresh` and `raw_tcp_fresh`: the same, each message a payload of its own that
//!   the sending thread allocates and writes (as applications send; the other cases share
//!   one payload per sender, its reference count taken per send).
//! - `cohort_slice`: each message written into one buffer the sending thread reuses and
//!   sent from it with `send_slice` (its summary line is against `raw_tcp`, which writes
//!   from one buffer too).
//! - `cohort_lent_fresh`: `cohort_fresh` with a sink whose handler borrows each message
//!   (`Builder::on_message_ref`) instead of taking it (`on_message`): no reference count
//!   and no `Delivery` per message on the delivering side.
//! - `cohort_uds` and `raw_uds` (1→1 only): the `cohort` and `raw_tcp` cases over
//!   Unix-domain sockets (the nodes listen on socket files, `Addr::unix`; the baseline is a
//!   `UnixStream` pair), so the summary lines give UDS against TCP loopback, for cohort and
//!   for the raw sockets, rate and CPU per message.
//! - `cohort_tls` (1→1 only, with `--features tls`): the `cohort` case with every
//!   connection over TLS 1.3 (rustls, ring; certificates from a CA made at start), so the
//!   summary line gives the cost of TLS as a ratio against the same run in plain TCP.
//!
//! One iteration sends a batch of messages and waits until the receiving side has counted
//! all of them; criterion reports messages per second. Nodes and connections are set up once
//! per benchmark function. After each group a line gives both medians and their ratio, and
//! one the CPU time per message of each.
//!
//! `cargo bench --bench throughput` (add `-- 1to1_64B` to run one group;
//! `cargo bench --features tls --bench throughput -- 1to1` for the TLS comparison);
//! `cargo test --benches` runs each case once with small batches.

#[cfg(feature = "tls")]
#[path = "../tests/support/certs.rs"]
mod certs;
mod common;

use std::io::{self, BufWriter, Write};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cohort::{Builder, Bytes, Node, SendOptions};
use common::{Over, PerSource, Progress, RawStream, Samples};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// Payload sizes measured, with the label used in group names.
const SIZES: [(usize, &str); 2] = [(64, "64B"), (1024, "1KiB")];

/// Longest wait for one batch to be counted before the bench fails.
const BATCH_TIMEOUT: Duration = Duration::from_secs(60);

/// How the sink's handler gets each message.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Handling {
    /// Takes it (`on_message`, a `Delivery` of its own).
    Owned,
    /// Borrows it for the call (`on_message_ref`, a `DeliveryRef`).
    Lent,
}

/// How a batch's messages get their payloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Payloads {
    /// One payload per sender, its reference count taken per send (`Bytes::clone`).
    Shared,
    /// Each message a payload of its own, allocated and written by the sending thread as
    /// an application makes one (`common::fresh_payload`); raw TCP writes the same.
    Fresh,
    /// Each message written into one buffer the sending thread reuses and sent from it
    /// (`send_slice`, no options); raw TCP writes from its one buffer, as for `Shared`.
    Reused,
}

/// Which side of the comparison a batch is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Cohort,
    RawTcp,
}

/// Messages per iteration: about 10–50 ms of traffic on a 2-core machine (raw TCP moves
/// several times more per second, so it gets bigger batches); tiny in test mode, where the
/// code is unoptimised and runs once.
fn batch_len(size: usize, transport: Transport) -> u64 {
    let cohort = if size <= 64 { 100_000 } else { 40_000 };
    match (common::test_mode(), transport) {
        (true, _) => 1_000,
        (false, Transport::Cohort) => cohort,
        (false, Transport::RawTcp) => 4 * cohort,
    }
}

/// The CA of a TLS run (a type with no values without the `tls` feature).
#[cfg(feature = "tls")]
type Ca = certs::TestCa;
#[cfg(not(feature = "tls"))]
type Ca = std::convert::Infallible;

/// `b` with a certificate for `name` from `ca`, if any.
fn secure(b: Builder, name: &str, ca: Option<&Ca>) -> Builder {
    let _ = name; // used only with the `tls` feature
    match ca {
        None => b,
        #[cfg(feature = "tls")]
        Some(ca) => b.tls(ca.tls(name)),
        #[cfg(not(feature = "tls"))]
        Some(never) => match *never {},
    }
}

/// `senders` cohort nodes sending to one `sink` node that counts what its handler sees, per
/// source (a message's first byte names its source).
struct CohortFanIn {
    sink: Node,
    sources: Vec<Node>,
    received: Arc<PerSource>,
}

impl CohortFanIn {
    /// With `ca`, every connection runs TLS with certificates from it; every node listens
    /// `over` TCP or a Unix-domain socket.
    fn start(senders: usize, ca: Option<&Ca>, over: Over) -> Result<CohortFanIn, cohort::Error> {
        CohortFanIn::start_with(senders, ca, over, Handling::Owned)
    }

    /// [`start`](CohortFanIn::start), the sink's handler getting each message as `handling`
    /// says.
    fn start_with(
        senders: usize,
        ca: Option<&Ca>,
        over: Over,
        handling: Handling,
    ) -> Result<CohortFanIn, cohort::Error> {
        let dir = match over {
            Over::Tcp => std::path::PathBuf::new(),
            Over::Unix => common::socket_dir("throughput"),
        };
        let received = Arc::new(PerSource::new(senders));
        let counter = received.clone();
        let sink = secure(Node::builder("sink"), "sink", ca)
            .cluster("bench")
            .listen(common::listen_addr(over, &dir, "sink"));
        let sink = match handling {
            Handling::Owned => {
                sink.on_message(move |d| counter.record(usize::from(d.payload()[0])))
            }
            Handling::Lent => {
                sink.on_message_ref(move |m| counter.record(usize::from(m.payload()[0])))
            }
        }
        .start()?;
        let mut sources = Vec::with_capacity(senders);
        for i in 0..senders {
            let name = format!("source-{i}");
            let source = secure(Node::builder(&name), &name, ca)
                .cluster("bench")
                .listen(common::listen_addr(over, &dir, &name))
                .peer("sink", sink.listen_addr())
                .start()?;
            sink.add_peer(source.name(), source.listen_addr())?;
            sources.push(source);
        }
        let rig = CohortFanIn {
            sink,
            sources,
            received,
        };
        // One message from each source: every connection is up before measuring.
        rig.received.expect_each(1);
        for (i, source) in rig.sources.iter().enumerate() {
            source.send("sink", Bytes::from(vec![i as u8]))?;
        }
        rig.received
            .wait_for(BATCH_TIMEOUT, "cohort: connecting the sources");
        Ok(rig)
    }

    /// Sends `n` messages (split evenly over the sources) with `opts` and waits until all
    /// are counted.
    fn run_batch(&self, n: u64, payload: &Bytes, opts: SendOptions) {
        self.run_batch_of(n, payload, opts, Payloads::Shared)
    }

    /// `run_batch`, the payloads made as `payloads` says.
    fn run_batch_of(&self, n: u64, payload: &Bytes, opts: SendOptions, payloads: Payloads) {
        let per_source = n / self.sources.len() as u64;
        self.received.expect_each(per_source);
        let send_all = |(i, source): (usize, &Node)| {
            // Each source its own payload (different senders send different data): one
            // shared by every sending thread would make its reference count a cache line
            // they all fight over, which no application has and raw TCP does not pay. Its
            // first byte names the source to the sink's count.
            let mut own = payload.to_vec();
            own[0] = i as u8;
            if payloads == Payloads::Reused {
                debug_assert_eq!(opts, SendOptions::new(), "send_slice takes no options");
                let mut buf = own;
                let counter = buf.len().saturating_sub(1).min(8);
                for k in 0..per_source {
                    buf[1..1 + counter].copy_from_slice(&k.to_le_bytes()[..counter]);
                    source
                        .send_slice("sink", &buf)
                        .expect("cohort: send to the sink");
                }
                return;
            }
            if payloads == Payloads::Fresh {
                for k in 0..per_source {
                    let p = Bytes::from(common::fresh_payload(&own, k));
                    source
                        .send_with("sink", p, opts)
                        .expect("cohort: send to the sink");
                }
                return;
            }
            let payload = Bytes::from(own);
            for _ in 0..per_source {
                source
                    .send_with("sink", payload.clone(), opts)
                    .expect("cohort: send to the sink");
            }
        };
        match self.sources.as_slice() {
            [one] => send_all((0, one)),
            many => thread::scope(|s| {
                for source in many.iter().enumerate() {
                    s.spawn(move || send_all(source));
                }
            }),
        }
        self.received
            .wait_for(BATCH_TIMEOUT, "cohort: sink counting a batch");
    }

    fn shutdown(self) {
        for node in self.sources.iter().chain([&self.sink]) {
            if let Err(e) = node.shutdown(Duration::from_secs(5)) {
                eprintln!("{}: shutdown failed: {e}", node.name());
            }
        }
    }
}

/// `senders` blocking connections (TCP or Unix-domain) into one process, a counting reader
/// thread per connection.
struct RawFanIn {
    writers: Vec<BufWriter<RawStream>>,
    readers: Vec<thread::JoinHandle<io::Result<()>>>,
    received: Arc<Progress>,
}

impl RawFanIn {
    fn start(senders: usize, over: Over) -> io::Result<RawFanIn> {
        let received = Arc::new(Progress::default());
        let mut writers = Vec::with_capacity(senders);
        let mut readers = Vec::with_capacity(senders);
        for i in 0..senders {
            let (client, server) = common::raw_pair(over)?;
            let counter = received.clone();
            readers.push(
                thread::Builder::new()
                    .name(format!("raw-reader-{i}"))
                    .spawn(move || common::count_frames(server, &counter))?,
            );
            writers.push(BufWriter::with_capacity(common::RAW_BUFFER, client));
        }
        Ok(RawFanIn {
            writers,
            readers,
            received,
        })
    }

    /// Writes `n` frames (split evenly over the connections), flushes, and waits until the
    /// readers have counted them all.
    fn run_batch(&mut self, n: u64, payload: &[u8]) {
        self.run_batch_of(n, payload, Payloads::Shared)
    }

    /// `run_batch`, the payloads made as `payloads` says.
    fn run_batch_of(&mut self, n: u64, payload: &[u8], payloads: Payloads) {
        let per_writer = n / self.writers.len() as u64;
        let target = self.received.expect(per_writer * self.writers.len() as u64);
        let write_all = |w: &mut BufWriter<RawStream>| {
            for k in 0..per_writer {
                let written = match payloads {
                    Payloads::Shared | Payloads::Reused => common::write_frame(w, payload),
                    Payloads::Fresh => common::write_frame(w, &common::fresh_payload(payload, k)),
                };
                written.expect("raw TCP: write");
            }
            w.flush().expect("raw TCP: flush");
        };
        match self.writers.as_mut_slice() {
            [one] => write_all(one),
            many => thread::scope(|s| {
                for w in many {
                    s.spawn(move || write_all(w));
                }
            }),
        }
        self.received
            .wait_for(target, BATCH_TIMEOUT, "raw TCP: readers counting a batch");
    }

    /// Closes the connections and joins the readers (they stop at end of stream).
    fn shutdown(self) {
        drop(self.writers);
        for reader in self.readers {
            match reader.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("raw TCP reader failed: {e}"),
                Err(_) => eprintln!("raw TCP reader panicked"),
            }
        }
    }
}

/// Times `iters` batches with `run`, recording the call in `samples`.
fn time_batches(iters: u64, samples: &Samples, mut run: impl FnMut()) -> Duration {
    let cpu = common::process_cpu();
    let started = Instant::now();
    for _ in 0..iters {
        run();
    }
    let elapsed = started.elapsed();
    samples.record(iters, elapsed);
    if let (Some(before), Some(after)) = (cpu, common::process_cpu()) {
        samples.record_cpu(iters, after.saturating_sub(before));
    }
    elapsed
}

fn fan_in(c: &mut Criterion, senders: usize) {
    for (size, label) in SIZES {
        let payload = Bytes::from(vec![0xA5; size]);
        let name = format!("throughput_{senders}to1_{label}");
        let mut group = c.benchmark_group(&name);

        let n = batch_len(size, Transport::Cohort);
        group.throughput(Throughput::Elements(n));
        let cohort_samples = Samples::new(n);
        let rig = CohortFanIn::start(senders, None, Over::Tcp).expect("cohort: start the nodes");
        group.bench_function("cohort", |b| {
            b.iter_custom(|iters| {
                time_batches(iters, &cohort_samples, || {
                    rig.run_batch(n, &payload, SendOptions::new())
                })
            })
        });
        // The same without recovery: unreliable messages carry no sequence number, enter no
        // unacked queue and are never resent (credit still flows), so the ratio of the two
        // is the cost of exactly-once delivery across reconnects.
        let unreliable_samples = Samples::new(n);
        group.bench_function("cohort_unreliable", |b| {
            b.iter_custom(|iters| {
                time_batches(iters, &unreliable_samples, || {
                    rig.run_batch(n, &payload, SendOptions::new().unreliable())
                })
            })
        });
        // Each message a payload of its own, as applications send (against raw TCP
        // writing the same below): what a shared payload hides is the payload's reference
        // count and allocation crossing threads.
        let fresh_samples = Samples::new(n);
        group.bench_function("cohort_fresh", |b| {
            b.iter_custom(|iters| {
                time_batches(iters, &fresh_samples, || {
                    rig.run_batch_of(n, &payload, SendOptions::new(), Payloads::Fresh)
                })
            })
        });
        // Each message built in a buffer the sender reuses and copied from it.
        let slice_samples = Samples::new(n);
        group.bench_function("cohort_slice", |b| {
            b.iter_custom(|iters| {
                time_batches(iters, &slice_samples, || {
                    rig.run_batch_of(n, &payload, SendOptions::new(), Payloads::Reused)
                })
            })
        });
        rig.shutdown();
        let lent_samples = Samples::new(n);
        let rig = CohortFanIn::start_with(senders, None, Over::Tcp, Handling::Lent)
            .expect("cohort: start the nodes");
        group.bench_function("cohort_lent_fresh", |b| {
            b.iter_custom(|iters| {
                time_batches(iters, &lent_samples, || {
                    rig.run_batch_of(n, &payload, SendOptions::new(), Payloads::Fresh)
                })
            })
        });
        rig.shutdown();
        let uds_samples = (senders == 1 && cfg!(unix)).then(|| {
            let samples = Samples::new(n);
            let rig = CohortFanIn::start(senders, None, Over::Unix)
                .expect("cohort: start the nodes on Unix sockets");
            group.bench_function("cohort_uds", |b| {
                b.iter_custom(|iters| {
                    time_batches(iters, &samples, || {
                        rig.run_batch(n, &payload, SendOptions::new())
                    })
                })
            });
            rig.shutdown();
            samples
        });
        #[cfg(feature = "tls")]
        let tls_samples = (senders == 1).then(|| {
            let samples = Samples::new(n);
            let ca = certs::TestCa::new("bench CA");
            let rig =
                CohortFanIn::start(senders, Some(&ca), Over::Tcp).expect("cohort: start TLS nodes");
            group.bench_function("cohort_tls", |b| {
                b.iter_custom(|iters| {
                    time_batches(iters, &samples, || {
                        rig.run_batch(n, &payload, SendOptions::new())
                    })
                })
            });
            rig.shutdown();
            samples
        });

        let n = batch_len(size, Transport::RawTcp);
        group.throughput(Throughput::Elements(n));
        let raw_samples = Samples::new(n);
        let mut raw = RawFanIn::start(senders, Over::Tcp).expect("raw TCP: connect");
        group.bench_function("raw_tcp", |b| {
            b.iter_custom(|iters| time_batches(iters, &raw_samples, || raw.run_batch(n, &payload)))
        });
        let raw_fresh_samples = Samples::new(n);
        group.bench_function("raw_tcp_fresh", |b| {
            b.iter_custom(|iters| {
                time_batches(iters, &raw_fresh_samples, || {
                    raw.run_batch_of(n, &payload, Payloads::Fresh)
                })
            })
        });
        raw.shutdown();
        let raw_uds_samples = (senders == 1 && cfg!(unix)).then(|| {
            let samples = Samples::new(n);
            let mut raw = RawFanIn::start(senders, Over::Unix).expect("raw UDS: a socket pair");
            group.bench_function("raw_uds", |b| {
                b.iter_custom(|iters| time_batches(iters, &samples, || raw.run_batch(n, &payload)))
            });
            raw.shutdown();
            samples
        });
        group.finish();

        if !common::test_mode() {
            summarize(&name, &cohort_samples, &raw_samples);
            summarize(
                &format!("{name} (fresh payloads)"),
                &fresh_samples,
                &raw_fresh_samples,
            );
            summarize(
                &format!("{name} (fresh payloads, lent to the handler)"),
                &lent_samples,
                &raw_fresh_samples,
            );
            summarize(
                &format!("{name} (from a reused buffer: send_slice)"),
                &slice_samples,
                &raw_samples,
            );
            if let (Some(uds), Some(raw_uds)) = (&uds_samples, &raw_uds_samples) {
                compare(&name, "cohort", uds, &cohort_samples);
                compare(&name, "raw", raw_uds, &raw_samples);
            }
            if let (Some(rel), Some(unrel)) = (
                cohort_samples.median_rate(),
                unreliable_samples.median_rate(),
            ) {
                println!(
                    "summary {name}: cohort without recovery {}, with/without = {:.2}\n",
                    common::rate(unrel),
                    rel / unrel
                );
            }
            #[cfg(feature = "tls")]
            if let (Some(plain), Some(tls)) = (
                cohort_samples.median_rate(),
                tls_samples.as_ref().and_then(Samples::median_rate),
            ) {
                println!(
                    "summary {name}: cohort over TLS {}, plain {}, TLS/plain = {:.2}\n",
                    common::rate(tls),
                    common::rate(plain),
                    tls / plain
                );
            }
        }
    }
}

/// Prints both medians (messages per second) and the cohort / raw TCP ratio.
fn summarize(name: &str, cohort: &Samples, raw: &Samples) {
    let (Some(c), Some(r)) = (cohort.median_rate(), raw.median_rate()) else {
        return; // filtered out
    };
    println!(
        "summary {name}: cohort {}, raw TCP {}, cohort/raw = {:.2}\n",
        common::rate(c),
        common::rate(r),
        c / r
    );
    if let (Some(cc), Some(rc)) = (cohort.cpu_per_event(), raw.cpu_per_event()) {
        println!(
            "summary {name}: CPU per message (all threads, both ends): cohort {} ns, raw TCP {} ns, cohort/raw = {:.2}\n",
            cc.as_nanos(),
            rc.as_nanos(),
            cc.as_secs_f64() / rc.as_secs_f64()
        );
    }
}

/// Prints `label` over UDS against over TCP loopback: both medians and their ratio, and the
/// CPU time per message of each.
fn compare(name: &str, label: &str, uds: &Samples, tcp: &Samples) {
    if let (Some(u), Some(t)) = (uds.median_rate(), tcp.median_rate()) {
        println!(
            "summary {name}: {label} over UDS {}, over TCP {}, UDS/TCP = {:.2}\n",
            common::rate(u),
            common::rate(t),
            u / t
        );
    }
    if let (Some(u), Some(t)) = (uds.cpu_per_event(), tcp.cpu_per_event()) {
        println!(
            "summary {name}: {label} CPU per message (all threads, both ends): UDS {} ns, TCP {} ns, UDS/TCP = {:.2}\n",
            u.as_nanos(),
            t.as_nanos(),
            u.as_secs_f64() / t.as_secs_f64()
        );
    }
}

fn one_to_one(c: &mut Criterion) {
    fan_in(c, 1);
}

fn four_to_one(c: &mut Criterion) {
    fan_in(c, 4);
}

fn eight_to_one(c: &mut Criterion) {
    fan_in(c, 8);
}

criterion_group! {
    name = benches;
    config = common::criterion();
    targets = one_to_one, four_to_one, eight_to_one
}
criterion_main!(benches);
