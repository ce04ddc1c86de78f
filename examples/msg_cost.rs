//! The cost of a message, for profilers: `senders` source nodes send `count` messages of
//! `size` bytes to one sink node in this process (as `benches/throughput.rs` does), or, with
//! `--raw`, the same over raw TCP connections (u32-length frames, 64 KiB buffers). With
//! `--batch N` each source sends `N` messages per `send_batch` instead of one per `send`; with
//! `--to`, through a `PeerSender` (`Node::to`) instead of by name. With `--fresh` every message
//! is a payload of its own, allocated and written by the sending thread as an application
//! makes one (by default one payload is shared, its reference count taken per send); with
//! `--slice`, written into one buffer the sender reuses and sent with `send_slice`. With
//! `--lent` the sink's handler borrows each message (`Builder::on_message_ref`). With
//! `--threads N` each source node sends from `N` threads, which share its outbox for the
//! sink; with `--journal never|interval`, every node journals (cohort only). Prints the
//! process's CPU time (every thread, from `/proc/self/stat`) per message, and how many
//! messages the sink's pool delivered per turn (`PoolStats::tasks_run`: a turn ends at the
//! pool's budget or with the sender's queue empty). With `--idle S` (cohort only), the
//! nodes then stay connected and quiet for `S` seconds, and it prints the CPU they used
//! meanwhile and how often their threads woke (voluntary context switches of every thread,
//! from `/proc/self/task/*/status`, with the involuntary ones apart).
//!
//! ```text
//! cargo run --release --example msg_cost -- [--senders N] [--threads N] [--size B] [--count C] [--batch N] [--to] [--fresh] [--lent] [--slice] [--block] [--journal never|interval] [--idle S [--stagger]] [--raw]
//! valgrind --tool=callgrind target/release/examples/msg_cost --block --count 20000
//! ```
//!
//! Under a profiler that counts instructions, run two counts and divide the difference of
//! the totals by the difference of the counts: set-up and shut-down cancel. `--block` makes
//! both nodes block instead of spinning when idle (`IdleStrategy::Block`), so a count is
//! repeatable: a spin's polls depend on timing.

use std::error::Error;
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cohort::{Builder, Bytes, FsyncPolicy, IdleStrategy, Node};

mod support;
use support::{fresh_payload, journal_dir, journalled, process_cpu};

/// Messages counted per source (a cohort source, or a raw connection), each count alone in
/// its cache line and bumped with a plain load and store: written by one thread at a time
/// (a raw connection's reader; the pool thread delivering a cohort source's messages, one
/// at a time by cohort's rule), so counting costs the transport nothing shared. One counter
/// that every delivering thread adds to would be a contended line the transport never
/// touches.
struct Counts(Box<[Count]>);

/// One source's count (128 bytes: the adjacent-line prefetcher pairs 64-byte lines).
#[derive(Default)]
#[repr(align(128))]
struct Count(AtomicU64);

impl Counts {
    fn new(sources: usize) -> Counts {
        Counts((0..sources).map(|_| Count::default()).collect())
    }

    /// One more message from `source`, counted by its one writer.
    #[inline]
    fn record(&self, source: usize) {
        let c = &self.0[source].0;
        // Relaxed load: this thread is the only writer now; Release: the waiter's Acquire
        // sees every count before this one.
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Release);
    }

    fn total(&self) -> u64 {
        self.0.iter().map(|c| c.0.load(Ordering::Acquire)).sum()
    }
}

/// Waits until `counts` add up to `target`, sleeping a millisecond between looks (no
/// condition variable: nothing extra on the measured path but this thread's polls).
fn wait_for(counts: &Counts, target: u64) -> Result<(), Box<dyn Error>> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while counts.total() < target {
        if Instant::now() > deadline {
            return Err(format!("{} of {target} messages counted", counts.total()).into());
        }
        thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// How a run of `msg_cost` sends: `batch` messages per call, through a `PeerSender`
/// (`bound`), a payload of its own per message (`fresh`), nodes that block when idle,
/// `threads` sending threads per source node (sharing its outbox for the sink), every node
/// journalling under `journal`, and a quiet `idle` after the run, measured.
#[derive(Clone, Copy)]
struct Mode {
    idle: Option<Duration>,
    batch: u64,
    threads: usize,
    journal: Option<FsyncPolicy>,
    slice: bool,
    block: bool,
    bound: bool,
    fresh: bool,
    lent: bool,
    stagger: bool,
}

fn cohort(senders: usize, size: usize, count: u64, mode: Mode) -> Result<(), Box<dyn Error>> {
    let Mode {
        idle: quiet,
        batch,
        threads,
        journal,
        slice,
        block,
        bound,
        fresh: own_payloads,
        lent,
        stagger,
    } = mode;
    let received = Arc::new(Counts::new(senders));
    let counter = received.clone();
    let idle = |b: Builder| {
        if block {
            b.idle_strategy(IdleStrategy::Block)
        } else {
            b
        }
    };
    let node = |name: &str| journalled(idle(Node::builder(name)), "msg-cost", name, journal);
    let sink = node("sink").cluster("cost");
    // A message's first byte names its source.
    let sink = if lent {
        sink.on_message_ref(move |m| counter.record(usize::from(m.payload()[0])))
    } else {
        sink.on_message(move |d| counter.record(usize::from(d.payload()[0])))
    }
    .start()?;
    let mut sources = Vec::new();
    for i in 0..senders {
        let name = format!("source-{i}");
        let source = node(&name)
            .cluster("cost")
            .peer("sink", sink.local_addr())
            .start()?;
        sink.add_peer(source.name(), source.local_addr())?;
        sources.push(source);
    }
    for (i, s) in sources.iter().enumerate() {
        s.send("sink", Bytes::from(vec![i as u8]))?;
    }
    wait_for(&received, senders as u64)?;
    let payload = vec![0xA5; size.max(1)];
    let per = count / (senders * threads) as u64;
    let cpu = process_cpu();
    let started = Instant::now();
    thread::scope(|s| {
        let each_thread = sources
            .iter()
            .enumerate()
            .flat_map(|s| std::iter::repeat_n(s, threads));
        for (i, source) in each_thread {
            let payload = &payload;
            s.spawn(move || {
                // Each source its own payload (different senders send different data):
                // one shared by every sending thread would make its reference count a
                // cache line they all fight over, which no application has. Its first byte
                // names the source.
                let mut own = payload.clone();
                own[0] = i as u8;
                let next = |k: u64| -> Bytes {
                    if own_payloads {
                        Bytes::from(fresh_payload(&own, k))
                    } else {
                        Bytes::from(own.clone())
                    }
                };
                let payload = Bytes::from(own.clone());
                if slice {
                    // Each message written into one buffer the thread reuses.
                    let mut buf = own.clone();
                    let n = buf.len().saturating_sub(1).min(8);
                    for k in 0..per {
                        buf[1..1 + n].copy_from_slice(&k.to_le_bytes()[..n]);
                        source.send_slice("sink", &buf).expect("send to the sink");
                    }
                } else if own_payloads && batch <= 1 {
                    let sink = source.to("sink").expect("the sink is a peer");
                    for k in 0..per {
                        if bound {
                            sink.send(next(k)).expect("send to the sink");
                        } else {
                            source.send("sink", next(k)).expect("send to the sink");
                        }
                    }
                } else if batch > 1 {
                    let mut left = per;
                    while left > 0 {
                        let n = left.min(batch);
                        let payloads = std::iter::repeat_n(payload.clone(), n as usize);
                        source
                            .send_batch("sink", payloads)
                            .expect("send to the sink");
                        left -= n;
                    }
                } else if bound {
                    let sink = source.to("sink").expect("the sink is a peer");
                    for _ in 0..per {
                        sink.send(payload.clone()).expect("send to the sink");
                    }
                } else {
                    for _ in 0..per {
                        source
                            .send("sink", payload.clone())
                            .expect("send to the sink");
                    }
                }
            });
        }
    });
    let sent = per * (senders * threads) as u64;
    wait_for(&received, senders as u64 + sent)?;
    let line = report(sent, started, cpu);
    let tasks = sink.stats().pool.tasks_run;
    let driven: u64 = sources.iter().map(|s| s.stats().idle.driven_turns).sum();
    println!(
        "sink's pool: {tasks} delivery turns, {:.0} messages per turn; sources' IO turns driven by senders: {driven}",
        sent as f64 / tasks.max(1) as f64
    );
    if let Some(quiet) = quiet {
        if stagger && senders > 1 {
            // One more message from each source, spread over a second: the links fall
            // quiet out of step, as in a cluster whose members stopped at different times.
            let gap = Duration::from_secs(1) / senders as u32;
            for (i, s) in sources.iter().enumerate() {
                s.send("sink", Bytes::from(vec![i as u8]))?;
                thread::sleep(gap);
            }
            wait_for(&received, 2 * senders as u64 + sent)?;
        }
        println!("{}", idle_report(quiet));
    }
    // The report's line last: scripts read it with `tail -1`.
    println!("{line}");
    for n in sources.iter().chain([&sink]) {
        n.shutdown(Duration::from_secs(5))?;
        if journal.is_some() {
            let _ = std::fs::remove_dir_all(journal_dir("msg-cost", n.name()));
        }
    }
    Ok(())
}

fn raw(
    senders: usize,
    size: usize,
    count: u64,
    fresh_payloads: bool,
) -> Result<(), Box<dyn Error>> {
    let received = Arc::new(Counts::new(senders));
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for i in 0..senders {
        let client = TcpStream::connect(listener.local_addr()?)?;
        let (server, _) = listener.accept()?;
        client.set_nodelay(true)?;
        server.set_nodelay(true)?;
        let counter = received.clone();
        readers.push(thread::spawn(move || {
            let mut r = BufReader::with_capacity(64 * 1024, server);
            let mut buf = vec![0u8; 1 << 20];
            let mut head = [0u8; 4];
            while r.read_exact(&mut head).is_ok() {
                let len = u32::from_le_bytes(head) as usize;
                if r.read_exact(&mut buf[..len]).is_err() {
                    break;
                }
                counter.record(i);
            }
        }));
        writers.push(BufWriter::with_capacity(64 * 1024, client));
    }
    let payload = vec![0xA5u8; size];
    let per = count / senders as u64;
    let cpu = process_cpu();
    let started = Instant::now();
    thread::scope(|s| {
        for w in writers.iter_mut() {
            let payload = &payload;
            s.spawn(move || {
                for k in 0..per {
                    w.write_all(&(payload.len() as u32).to_le_bytes())
                        .expect("write");
                    if fresh_payloads {
                        w.write_all(&fresh_payload(payload, k)).expect("write");
                    } else {
                        w.write_all(payload).expect("write");
                    }
                }
                w.flush().expect("flush");
            });
        }
    });
    wait_for(&received, per * senders as u64)?;
    println!("{}", report(per * senders as u64, started, cpu));
    drop(writers);
    for r in readers {
        let _ = r.join();
    }
    Ok(())
}

/// The sum over every live thread of this process of what `read` finds in its `file` under
/// `/proc/self/task/<tid>/`; `None` where the directory cannot be read or `read` finds
/// nothing in a thread's file. (A thread that ended meanwhile is skipped.)
fn over_threads<T: std::iter::Sum<T>>(file: &str, read: impl Fn(&str) -> Option<T>) -> Option<T> {
    let mut each = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        if let Ok(text) = std::fs::read_to_string(task.ok()?.path().join(file)) {
            each.push(read(&text)?);
        }
    }
    Some(each.into_iter().sum())
}

/// Context switches of every thread of this process so far, from
/// `/proc/self/task/*/status`: voluntary (a thread blocked, so at rest, how often threads
/// sleep and are woken) and involuntary (a runnable thread gave up its core: preempted, or
/// yielding while the idle strategy spins).
fn context_switches() -> Option<(u64, u64)> {
    let count = |status: &str, key: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    let voluntary = over_threads("status", |s| count(s, "voluntary_ctxt_switches:"))?;
    let involuntary = over_threads("status", |s| count(s, "nonvoluntary_ctxt_switches:"))?;
    Some((voluntary, involuntary))
}

/// The CPU time of every live thread of this process, to the microsecond: the sum of their
/// `se.sum_exec_runtime` (milliseconds) in `/proc/self/task/*/sched`, where the kernel
/// keeps it (`CONFIG_SCHED_DEBUG`); `None` elsewhere. (`/proc/self/stat` counts in
/// hundredths of a second: too coarse for a quiet process.)
fn threads_cpu() -> Option<Duration> {
    let ms: f64 = over_threads("sched", |sched| {
        let line = sched
            .lines()
            .find(|l| l.starts_with("se.sum_exec_runtime"))?;
        line.split(':').nth(1)?.trim().parse::<f64>().ok()
    })?;
    Some(Duration::from_secs_f64(ms / 1e3))
}

/// The line of figures of the nodes left connected and quiet for `quiet`: the CPU they
/// used meanwhile (every thread's, to the microsecond where the kernel tells it, else in
/// hundredths of a second), as a share of one core, and their threads' context switches
/// per second, voluntary (wake-ups) and involuntary. (This thread only sleeps: what it
/// adds is its own two wake-ups.)
fn idle_report(quiet: Duration) -> String {
    let fine = threads_cpu().is_some();
    let cpu_now = || if fine { threads_cpu() } else { process_cpu() };
    let (cpu, switches) = (cpu_now(), context_switches());
    let started = Instant::now();
    thread::sleep(quiet);
    let elapsed = started.elapsed();
    let used = match (cpu, cpu_now()) {
        (Some(a), Some(b)) => format!(
            "{:.3} % of one core ({:.2} ms of CPU)",
            (b - a).as_secs_f64() / elapsed.as_secs_f64() * 100.0,
            (b - a).as_secs_f64() * 1e3
        ),
        _ => "CPU unknown".to_owned(),
    };
    let woke = match (switches, context_switches()) {
        (Some((v0, i0)), Some((v1, i1))) => {
            let per_s = |a: u64, b: u64| b.saturating_sub(a) as f64 / elapsed.as_secs_f64();
            format!(
                "{:.1} wake-ups per second (voluntary context switches), {:.1} involuntary",
                per_s(v0, v1),
                per_s(i0, i1)
            )
        }
        _ => "context switches unknown".to_owned(),
    };
    format!("then quiet for {elapsed:.2?}: {used}, {woke}")
}

/// The line of figures of a run of `n` messages begun at `started`, with the process's CPU
/// time then (`cpu`).
fn report(n: u64, started: Instant, cpu: Option<Duration>) -> String {
    let elapsed = started.elapsed();
    let per_msg = match (cpu, process_cpu()) {
        (Some(a), Some(b)) => format!("{} ns CPU/msg", (b - a).as_nanos() / u128::from(n.max(1))),
        _ => "CPU unknown".to_owned(),
    };
    format!(
        "{n} messages in {elapsed:.2?}: {:.2} M/s, {per_msg}",
        n as f64 / elapsed.as_secs_f64() / 1e6
    )
}

const USAGE: &str = "\
usage: msg_cost [--senders N] [--threads N] [--size B] [--count C] [--batch N] [--to] [--fresh] [--lent] [--slice] [--block] [--journal never|interval] [--idle S [--stagger]] [--raw]

The CPU time per message of N source nodes sending to one sink node in this process.
  --senders N   source nodes (default 1)
  --threads N   sending threads per source node, sharing its outbox (default 1)
  --size B      payload bytes per message (default 64)
  --count C     messages in all (default 1000000)
  --batch N     each source sends N messages per send_batch (default 1: send)
  --to          send through a PeerSender (Node::to) instead of by name
  --fresh       each message a payload of its own, allocated and written by the sender
  --lent        the sink's handler borrows each message (`on_message_ref`)
  --slice       each message written into a buffer the sender reuses, sent with send_slice
  --block       both nodes block when idle (IdleStrategy::Block): repeatable counts
  --journal P   every node journals in a fresh temp directory, fsync policy P: never or
                interval (5 ms)
  --idle S      then leave the nodes connected and quiet for S seconds, and print the CPU
                they used and their threads' context switches per second meanwhile
                (voluntary: wake-ups; involuntary: preempted or yielding)
  --stagger     with --idle, each source first sends one more message, the sources spread
                over a second: their links fall quiet out of step (with two or more)
  --raw         the same over raw TCP connections instead of cohort
  -h, --help    this text
";

fn main() -> Result<(), Box<dyn Error>> {
    let (mut senders, mut size, mut count, mut raw_tcp) = (1usize, 64usize, 1_000_000u64, false);
    let mut mode = Mode {
        idle: None,
        batch: 1,
        threads: 1,
        journal: None,
        slice: false,
        block: false,
        bound: false,
        fresh: false,
        lent: false,
        stagger: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--senders" => senders = args.next().ok_or("--senders N")?.parse()?,
            "--size" => size = args.next().ok_or("--size B")?.parse()?,
            "--count" => count = args.next().ok_or("--count C")?.parse()?,
            "--batch" => mode.batch = args.next().ok_or("--batch N")?.parse()?,
            "--threads" => mode.threads = args.next().ok_or("--threads N")?.parse()?,
            "--journal" => {
                mode.journal = Some(match args.next().as_deref() {
                    Some("never") => FsyncPolicy::Never,
                    Some("interval") => FsyncPolicy::Interval(Duration::from_millis(5)),
                    _ => return Err("--journal never|interval".into()),
                })
            }
            "--idle" => {
                let secs: f64 = args.next().ok_or("--idle S")?.parse()?;
                if !(secs.is_finite() && secs > 0.0) {
                    return Err("--idle S: a number of seconds above 0".into());
                }
                mode.idle = Some(Duration::from_secs_f64(secs));
            }
            "--stagger" => mode.stagger = true,
            "--block" => mode.block = true,
            "--raw" => raw_tcp = true,
            "--to" => mode.bound = true,
            "--fresh" => mode.fresh = true,
            "--lent" => mode.lent = true,
            "--slice" => mode.slice = true,
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other}\n{USAGE}").into()),
        }
    }
    if senders > 256 {
        return Err("--senders: at most 256 (a message's first byte names its source)".into());
    }
    if mode.stagger && mode.idle.is_none() {
        return Err("--stagger goes with --idle S".into());
    }
    mode.threads = mode.threads.max(1);
    if raw_tcp {
        raw(senders.max(1), size, count, mode.fresh)
    } else {
        cohort(senders.max(1), size, count, mode)
    }
}
