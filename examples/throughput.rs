//! Throughput between two processes (or two machines): a receiving member, `sink`, and a
//! sending member, `source`, both in cluster `throughput`.
//!
//! ```text
//! cargo run --release --example throughput -- --listen 127.0.0.1:7000 [--runs R]
//! cargo run --release --example throughput -- --connect 127.0.0.1:7000 --count 1000000 --size 64
//! ```
//!
//! The sink admits members it does not know (the source dials it), prints messages and
//! megabytes (10^6 bytes of payload) per second once per second while traffic flows, and a
//! summary when a run completes; with `--runs R` it shuts down after R runs, otherwise it
//! serves runs until killed.
//!
//! The source sends a start message announcing the run, `--count` data messages of
//! `--size` bytes with `send` (which blocks while the window is full), and an end message.
//! Delivery is ordered per sender, so when the sink's handler sees the end message it has
//! handled the whole run; it answers with a done message. The source prints how fast its
//! sends were accepted and how fast the sink handled them, then shuts down.
//! `--name NAME` (default `source`) lets several sources feed one sink at once.

use std::collections::HashMap;
use std::error::Error;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use cohort::{Bytes, DeliveryRef, Node, TrySendError};

const USAGE: &str = "\
usage:
  throughput --listen ADDR [--runs R]
      run the receiving member 'sink' on ADDR; exit after R runs (default: never)
  throughput --connect ADDR [--count N] [--size B] [--name NAME]
      run a sending member (default name 'source') that sends N messages (default
      1000000) of B bytes (default 64, at most 1 MiB) to the sink at ADDR
  throughput -h | --help
      this text";

const CLUSTER: &str = "throughput";
const SINK: &str = "sink";

/// First byte of every message: what it is.
const DATA: u8 = 0;
/// Source → sink, before the data: `[START, count: u64 LE, size: u64 LE]`.
const START: u8 = 1;
/// Source → sink, after the data: `[END, count: u64 LE]`.
const END: u8 = 2;
/// Sink → source, once the end message was handled: `[DONE, messages: u64 LE,
/// nanoseconds from start to end message: u64 LE]`.
const DONE: u8 = 3;

/// Largest `--size` accepted (the default maximum message size).
const MAX_SIZE: u64 = 1 << 20;

const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a source waits for room in the sink's window before giving up: the sink is
/// down or not consuming.
const STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// What this process runs, from the command line.
#[derive(Debug)]
enum Role {
    /// The receiving member, listening on `addr`; stops after `runs` runs if given.
    Sink { addr: String, runs: Option<u64> },
    /// A sending member.
    Source(SourceOptions),
}

#[derive(Debug)]
struct SourceOptions {
    /// The sink's address.
    addr: String,
    /// Data messages to send.
    count: u64,
    /// Bytes per data message.
    size: u64,
    /// This member's name.
    name: String,
}

impl Role {
    /// Parses the arguments; `Ok(None)` when help was asked for.
    fn parse() -> Result<Option<Role>, String> {
        let mut args = std::env::args().skip(1);
        let (mut listen, mut connect, mut runs) = (None, None, None);
        let (mut count, mut size, mut name) = (1_000_000, 64, "source".to_owned());
        while let Some(flag) = args.next() {
            let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
            let number = |v: String| -> Result<u64, String> {
                v.parse().map_err(|e| format!("{flag} {v:?}: {e}"))
            };
            match flag.as_str() {
                "--listen" => listen = Some(value()?),
                "--connect" => connect = Some(value()?),
                "--runs" => runs = Some(number(value()?)?),
                "--count" => count = number(value()?)?,
                "--size" => size = number(value()?)?,
                "--name" => name = value()?,
                "-h" | "--help" => return Ok(None),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        match (listen, connect) {
            (Some(addr), None) => Ok(Some(Role::Sink { addr, runs })),
            (None, Some(addr)) => {
                if !(1..=MAX_SIZE).contains(&size) {
                    return Err(format!("--size must be 1 to {MAX_SIZE} bytes, got {size}"));
                }
                Ok(Some(Role::Source(SourceOptions {
                    addr,
                    count,
                    size,
                    name,
                })))
            }
            _ => Err("give exactly one of --listen and --connect".into()),
        }
    }
}

fn main() -> ExitCode {
    let role = match Role::parse() {
        Ok(Some(role)) => role,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("throughput: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match role {
        Role::Sink { addr, runs } => sink(&addr, runs),
        Role::Source(options) => source(&options),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("throughput: {e}");
            // Each error says its own level; the causes follow.
            let mut cause = std::error::Error::source(&*e);
            while let Some(c) = cause {
                eprintln!("  caused by: {c}");
                cause = c.source();
            }
            ExitCode::FAILURE
        }
    }
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    let field = bytes.get(at..at + 8)?;
    Some(u64::from_le_bytes(field.try_into().ok()?))
}

fn control(kind: u8, a: u64, b: u64) -> Bytes {
    let mut m = Vec::with_capacity(17);
    m.push(kind);
    m.extend_from_slice(&a.to_le_bytes());
    m.extend_from_slice(&b.to_le_bytes());
    Bytes::from(m)
}

/// A run in progress at the sink, keyed by source.
struct Run {
    started: Instant,
    /// Sequence number of the start message.
    start_seq: Option<u64>,
    size: u64,
}

/// What the sink's handler tells its main thread.
enum Event {
    Started {
        from: String,
        count: u64,
        size: u64,
    },
    Finished {
        from: String,
        announced: u64,
        delivered: u64,
        size: u64,
        elapsed: Duration,
    },
}

/// State shared by the sink's handler (on pool threads) and its main thread.
struct SinkState {
    messages: AtomicU64,
    bytes: AtomicU64,
    runs: Mutex<HashMap<String, Run>>,
    events: mpsc::Sender<Event>,
}

impl SinkState {
    fn handle(&self, d: DeliveryRef<'_>) {
        let payload = d.payload();
        match payload.first() {
            Some(&DATA) => {
                self.messages.fetch_add(1, Ordering::Relaxed);
                self.bytes
                    .fetch_add(payload.len() as u64, Ordering::Relaxed);
            }
            Some(&START) => {
                let (count, size) = (u64_at(payload, 1), u64_at(payload, 9));
                let (Some(count), Some(size)) = (count, size) else {
                    return eprintln!("sink: malformed start message from {}", d.from());
                };
                let run = Run {
                    started: Instant::now(),
                    start_seq: d.seq(),
                    size,
                };
                self.lock_runs().insert(d.from().to_owned(), run);
                self.event(Event::Started {
                    from: d.from().to_owned(),
                    count,
                    size,
                });
            }
            Some(&END) => self.finish(d),
            _ => eprintln!("sink: unexpected message from {}", d.from()),
        }
    }

    /// The end message of a run: everything before it from that source was handled.
    fn finish(&self, d: DeliveryRef<'_>) {
        let Some(announced) = u64_at(d.payload(), 1) else {
            return eprintln!("sink: malformed end message from {}", d.from());
        };
        let Some(run) = self.lock_runs().remove(d.from()) else {
            return eprintln!("sink: end message from {} without a start", d.from());
        };
        let elapsed = run.started.elapsed();
        // Per-sender order with consecutive sequence numbers: the data messages are
        // exactly those strictly between the start and the end message.
        let delivered = match (run.start_seq, d.seq()) {
            (Some(start), Some(end)) => end.saturating_sub(start + 1),
            _ => announced,
        };
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        if let Some(node) = d.sender() {
            if let Err(e) = node.send(d.from(), control(DONE, delivered, nanos)) {
                eprintln!("sink: telling {} its run is done failed: {e}", d.from());
            }
        }
        self.event(Event::Finished {
            from: d.from().to_owned(),
            announced,
            delivered,
            size: run.size,
            elapsed,
        });
    }

    fn lock_runs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Run>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn event(&self, e: Event) {
        // Fails only once main has stopped listening, when nobody is left to tell.
        let _ = self.events.send(e);
    }
}

fn per_sec(amount: f64, elapsed: Duration) -> f64 {
    amount / elapsed.as_secs_f64().max(1e-9)
}

/// Runs the receiving member until `runs` runs completed (forever if `None`).
fn sink(addr: &str, runs: Option<u64>) -> Result<(), Box<dyn Error>> {
    let (events_tx, events) = mpsc::channel();
    let state = Arc::new(SinkState {
        messages: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        runs: Mutex::new(HashMap::new()),
        events: events_tx,
    });
    let handler_state = state.clone();
    let node = Node::builder(SINK)
        .cluster(CLUSTER)
        .listen(addr)
        .allow_unknown_members(true)
        // Each message read where it lies: lent, not taken.
        .on_message_ref(move |d| handler_state.handle(d))
        .start()?;
    println!(
        "sink: listening on {} (cluster '{CLUSTER}')",
        node.local_addr()
    );

    let tick = Duration::from_secs(1);
    let mut next_tick = Instant::now() + tick;
    let (mut last_at, mut last_messages, mut last_bytes) = (Instant::now(), 0u64, 0u64);
    let mut finished = 0u64;
    while runs.is_none_or(|r| finished < r) {
        match events.recv_timeout(next_tick.saturating_duration_since(Instant::now())) {
            Ok(Event::Started { from, count, size }) => {
                println!("sink: run from '{from}' started: {count} messages of {size} B");
            }
            Ok(Event::Finished {
                from,
                announced,
                delivered,
                size,
                elapsed,
            }) => {
                finished += 1;
                let bytes = (delivered * size) as f64;
                println!(
                    "sink: run from '{from}' complete: {delivered} of {announced} messages in \
                     {:.3} s: {:.0} msgs/s, {:.1} MB/s",
                    elapsed.as_secs_f64(),
                    per_sec(delivered as f64, elapsed),
                    per_sec(bytes, elapsed) / 1e6,
                );
                if delivered != announced {
                    eprintln!("sink: run from '{from}' lost or duplicated messages");
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let now = Instant::now();
                next_tick = now + tick;
                let messages = state.messages.load(Ordering::Relaxed);
                let bytes = state.bytes.load(Ordering::Relaxed);
                if messages != last_messages {
                    let elapsed = now - last_at;
                    println!(
                        "sink: {:>12.0} msgs/s {:>9.1} MB/s   ({messages} messages so far)",
                        per_sec((messages - last_messages) as f64, elapsed),
                        per_sec((bytes - last_bytes) as f64, elapsed) / 1e6,
                    );
                }
                (last_at, last_messages, last_bytes) = (now, messages, bytes);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let report = node.shutdown(SHUTDOWN_TIMEOUT)?;
    println!(
        "sink: shut down in {:.3} s after {finished} run(s)",
        report.elapsed.as_secs_f64()
    );
    Ok(())
}

/// Sends `payload` to the sink like `Node::send`, but fails instead of blocking for good
/// when the sink stops taking messages. The common case pays no clock read.
fn send(node: &Node, payload: Bytes) -> Result<(), Box<dyn Error>> {
    match node.try_send(SINK, payload) {
        Ok(()) => Ok(()),
        Err(TrySendError::Full(payload)) => {
            node.send_timeout(SINK, payload, STALL_TIMEOUT)
                .map_err(|e| format!("{e}: is {SINK} running and reachable?"))?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Sends one run to the sink and reports its rates.
fn source(o: &SourceOptions) -> Result<(), Box<dyn Error>> {
    let addr = o.addr.as_str();
    let (done_tx, done) = mpsc::channel::<Bytes>();
    let node = Node::builder(&o.name)
        .cluster(CLUSTER)
        .peer(SINK, addr)
        .on_message(move |d| {
            if d.from() == SINK && d.payload().first() == Some(&DONE) {
                // Fails only once main has stopped waiting.
                let _ = done_tx.send(d.into_payload());
            }
        })
        .start()?;
    println!(
        "{}: sending {} messages of {} B to {SINK} at {addr}",
        o.name, o.count, o.size
    );

    let mut data = vec![0u8; o.size as usize];
    data[0] = DATA;
    let data = Bytes::from(data);
    let started = Instant::now();
    send(&node, control(START, o.count, o.size))?;
    for _ in 0..o.count {
        send(&node, data.clone())?;
    }
    send(&node, control(END, o.count, 0))?;
    let sent = started.elapsed();
    println!(
        "{}: send accepted {} messages in {:.3} s: {:.0} msgs/s",
        o.name,
        o.count,
        sent.as_secs_f64(),
        per_sec(o.count as f64, sent)
    );

    // Generous: 10 s, plus 1 µs per message and 1 s per 100 MB.
    let timeout = Duration::from_secs(10)
        + Duration::from_micros(o.count)
        + Duration::from_secs(o.count.saturating_mul(o.size) / 100_000_000);
    let reply = done.recv_timeout(timeout).map_err(|e| {
        format!("no confirmation from {SINK} within {timeout:?} ({e}); is it running?")
    })?;
    let confirmed = started.elapsed();
    let delivered = u64_at(&reply, 1).ok_or("malformed done message")?;
    let sink_nanos = u64_at(&reply, 9).ok_or("malformed done message")?;
    let sink_elapsed = Duration::from_nanos(sink_nanos);
    println!(
        "{}: {SINK} handled {delivered} messages {:.3} s after the first send: {:.0} msgs/s, \
         {:.1} MB/s ({:.0} msgs/s measured at the sink)",
        o.name,
        confirmed.as_secs_f64(),
        per_sec(delivered as f64, confirmed),
        per_sec((delivered * o.size) as f64, confirmed) / 1e6,
        per_sec(delivered as f64, sink_elapsed),
    );

    let report = node.shutdown(SHUTDOWN_TIMEOUT)?;
    println!(
        "{}: shut down in {:.3} s ({} undelivered, {} failed)",
        o.name,
        report.elapsed.as_secs_f64(),
        report.undelivered,
        report.failed
    );
    if delivered != o.count {
        return Err(format!("{SINK} handled {delivered} of {} messages", o.count).into());
    }
    Ok(())
}
