//! Round-trip time between two members in one process: `ping` sends a message to `pong`,
//! pong's handler sends it back, and ping waits for it before sending the next. After a
//! warm-up, K round trips are timed one by one and their percentiles printed in
//! microseconds, next to the same measurement over raw blocking TCP (u32-length-prefixed
//! frames, `TCP_NODELAY`, an echo thread) in the same run, and the ratio of the medians;
//! then the process's CPU time per round trip of each (every thread, over the timed round
//! trips: what a spinning idle strategy burns shows here), how often each member's
//! adaptive spin stood down and how many of its IO thread's turns its sending threads
//! drove (`Stats::idle`), and the round trips split by whether both members' spins were on
//! throughout (`on`) or not (`off`), each with its share.
//!
//! `cargo run --release --example ping_pong [-- --count K --size B --warmup W --spin-us S
//! --gap-us G --journal never|interval|every --request --stages]` (defaults: K = 100 000 round trips of B = 64
//! bytes after W = 10 000 untimed ones, the builder's defaults, no gap, no journal).
//! `--spin-us S` sets `Builder::low_latency(S µs)` on both members (0: no spin at all).
//! `--gap-us G` pauses G µs between round trips (cohort's and raw TCP's alike), as a
//! sender of sporadic requests does: a pause longer than the spin finds every thread
//! parked when the next request comes. With `--journal`,
//! both members journal in fresh
//! directories under the system temp dir with that fsync policy (`interval`: 5 ms), so the
//! cost of the durable outbox on a round trip is read off one report.
//!
//! `--request` makes each round trip a request and its reply (`Node::request` at ping,
//! `Delivery::reply` in pong's handler): ping's main thread waits for the reply itself,
//! with no handler of ping's in between (the reply's way then ends when `request`
//! returns).
//!
//! `--stages` also says where the round trips' time went: each request carries its number,
//! pong's handler notes when it was entered and when its reply's `send` returned, and
//! ping's handler when the reply reached it, so each round trip splits into the request's
//! way (ping's `send` until pong's handler: ping's write, pong's IO thread waking and
//! reading, the hand-over to pong's pool), the reply's `send` in pong's handler (pong's
//! write too where the send drives pong's turn), and the reply's way (until ping's
//! handler: pong's write where its IO thread makes it, ping's IO thread, ping's pool). It
//! prints each part's mean for the fastest half of the round trips, the next 40 %, the
//! next 9 % and the slowest 1 %, and how often each part was the largest in the slowest
//! 1 %: what a slow round trip spends its time on; and raw TCP's round trips split the same
//! way (its echo thread notes when its `read` returned and when its `write` did), each
//! part's baseline. (A message of at least 8 bytes; the
//! notes cost pong two clock readings per round trip, and each request is a payload of its
//! own.)

use std::error::Error;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use cohort::{Builder, Bytes, FsyncPolicy, Node};

mod support;
use support::{journal_dir, journalled, process_cpu};

/// Longest wait for one reply before giving up.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

const USAGE: &str = "usage: ping_pong [--count K] [--size B] [--warmup W] [--spin-us S]
                 [--gap-us G] [--journal never|interval|every] [--request] [--stages]

Round-trip time between two members in one process, next to raw blocking TCP.

  --count K        timed round trips (default 100000)
  --size B         bytes per message (default 64)
  --warmup W       untimed round trips first (default 10000)
  --spin-us S      Builder::low_latency(S µs) on both members; 0: never spin
                   (default: the builder's idle strategy)
  --gap-us G       pause G µs between round trips (default 0), for cohort and raw TCP
  --journal P      journal both members in fresh temp directories with fsync policy P:
                   never, interval (5 ms) or every (default: no journal)
  --request        each round trip a request and its reply (Node::request, Delivery::reply)
  --stages         where the round trips' time went (request's way, reply's send,
                   reply's way), by band of round-trip time (--size at least 8)
  -h, --help       this text";

/// The command line.
struct Args {
    count: usize,
    size: usize,
    warmup: usize,
    spin: Option<Duration>,
    gap: Duration,
    policy: Option<FsyncPolicy>,
    request: bool,
    stages: bool,
}

/// The command line; `Ok(None)` when help was asked for.
fn parse() -> Result<Option<Args>, String> {
    let mut a = Args {
        count: 100_000,
        size: 64,
        warmup: 10_000,
        spin: None,
        gap: Duration::ZERO,
        policy: None,
        request: false,
        stages: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        if flag == "--stages" {
            a.stages = true;
            continue;
        }
        if flag == "--request" {
            a.request = true;
            continue;
        }
        let known = [
            "--count",
            "--size",
            "--warmup",
            "--spin-us",
            "--gap-us",
            "--journal",
        ];
        if !known.contains(&flag.as_str()) {
            return Err(format!("unknown argument {flag:?}"));
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        if flag == "--journal" {
            a.policy = Some(match value.as_str() {
                "never" => FsyncPolicy::Never,
                "interval" => FsyncPolicy::Interval(Duration::from_millis(5)),
                "every" => FsyncPolicy::EveryBatch,
                _ => return Err(format!("--journal never|interval|every, not {value:?}")),
            });
            continue;
        }
        let n = value
            .parse::<u64>()
            .map_err(|e| format!("{flag} {value:?}: {e}"))?;
        match flag.as_str() {
            "--count" => a.count = n.max(1) as usize,
            "--size" => a.size = n as usize,
            "--warmup" => a.warmup = n as usize,
            "--gap-us" => a.gap = Duration::from_micros(n),
            _ => a.spin = Some(Duration::from_micros(n)),
        }
    }
    if a.stages && a.size < 8 {
        return Err("--stages needs --size of at least 8 (each request carries its number)".into());
    }
    Ok(Some(a))
}

/// When each round trip's request reached pong's handler and when the reply's `send` there
/// returned: nanoseconds since `base` (0: never), one slot per round trip, each written
/// once by the pool thread that delivers the request, and read once pong has shut down
/// (its pool threads joined: the reply may reach ping before pong's `send` returns, so
/// nothing earlier orders the second note before main's read). When the reply reached
/// ping's handler is what that handler hands main already.
struct Stages {
    base: Instant,
    pong_in: Vec<AtomicU64>,
    pong_out: Vec<AtomicU64>,
}

impl Stages {
    fn new(trips: usize) -> Stages {
        let slots = || (0..trips).map(|_| AtomicU64::new(0)).collect();
        Stages {
            base: Instant::now(),
            pong_in: slots(),
            pong_out: slots(),
        }
    }

    /// The round trip a message is part of: its first 8 bytes.
    fn trip(payload: &[u8]) -> Option<usize> {
        let n: [u8; 8] = payload.get(..8)?.try_into().ok()?;
        usize::try_from(u64::from_le_bytes(n)).ok()
    }

    /// Notes `now` in `slots` for the round trip `payload` belongs to.
    fn note(&self, slots: &[AtomicU64], payload: &[u8], now: Instant) {
        if let Some(slot) = Self::trip(payload).and_then(|i| slots.get(i)) {
            // Relaxed: read after pong's pool threads are joined.
            slot.store(self.nanos(now), Ordering::Relaxed);
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from((at - self.base).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Round trip `i`, sent at `sent` and back at `arrived`, in its three parts (request's
    /// way, reply's send, reply's way), if pong noted its two points.
    fn parts(&self, i: usize, sent: Instant, arrived: Instant) -> Option<[Duration; 3]> {
        let read = |slots: &[AtomicU64]| match slots.get(i)?.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        };
        let points = [
            self.nanos(sent),
            read(&self.pong_in)?,
            read(&self.pong_out)?,
            self.nanos(arrived),
        ];
        let part = |a: u64, b: u64| Duration::from_nanos(b.saturating_sub(a));
        Some([
            part(points[0], points[1]),
            part(points[1], points[2]),
            part(points[2], points[3]),
        ])
    }
}

/// A round trip's time and its three parts (request's way, reply's send, reply's way).
type Split = (Duration, [Duration; 3]);

/// Prints where the round trips' time went: `trips` sorted by round-trip time, each band's
/// mean of each part, and which part was the largest in the slowest 1 %.
fn print_stages(who: &str, trips: &mut [Split]) {
    if trips.is_empty() {
        return;
    }
    trips.sort_unstable_by_key(|t| t.0);
    let n = trips.len();
    let at = |q: f64| ((q * n as f64).round() as usize).min(n);
    println!("{who}: where the time went, µs (means per band of round-trip time):");
    println!(
        "{:<14} {:>7} {:>9} {:>14} {:>14} {:>12}",
        "band", "trips", "rtt", "request's way", "reply's send", "reply's way"
    );
    let bands = [
        ("fastest 50%", 0.0, 0.5),
        ("p50-p90", 0.5, 0.9),
        ("p90-p99", 0.9, 0.99),
        ("slowest 1%", 0.99, 1.0),
    ];
    for (label, from, to) in bands {
        let band = &trips[at(from)..at(to)];
        if band.is_empty() {
            continue;
        }
        let mean = |f: &dyn Fn(&Split) -> Duration| {
            micros(band.iter().map(f).sum::<Duration>()) / band.len() as f64
        };
        println!(
            "{:<14} {:>7} {:>9.1} {:>14.1} {:>14.1} {:>12.1}",
            label,
            band.len(),
            mean(&|t| t.0),
            mean(&|t| t.1[0]),
            mean(&|t| t.1[1]),
            mean(&|t| t.1[2]),
        );
    }
    let slowest = &trips[at(0.99)..];
    let mut largest = [0usize; 3];
    for (_, parts) in slowest {
        let (i, _) = parts
            .iter()
            .enumerate()
            .max_by_key(|(_, d)| **d)
            .expect("three parts");
        largest[i] += 1;
    }
    println!(
        "slowest 1%: the largest part was the request's way in {}, the reply's send in {}, \
         the reply's way in {} of {}",
        largest[0],
        largest[1],
        largest[2],
        slowest.len()
    );
}

/// The value at quantile `q` (0..=1) of `sorted`, which must not be empty.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let rank = (q * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("ping_pong: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ping_pong: {e}");
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

fn run(a: &Args) -> Result<(), Box<dyn Error>> {
    let (count, size, warmup, spin, policy) = (a.count, a.size, a.warmup, a.spin, a.policy);
    let gap = a.gap;
    // The IO thread and idle delivery threads spin this long after work before they block
    // (Builder::low_latency; 0 = block at once); the builder's default if not given.
    let tune = |b: Builder| match spin {
        Some(spin) => b.low_latency(spin),
        None => b,
    };

    // pong echoes through the node handle its delivery carries, or replies to a request.
    let stages = a.stages.then(|| Arc::new(Stages::new(warmup + count)));
    let noted = stages.clone();
    let pong = journalled(tune(Node::builder("pong")), "ping-pong", "pong", policy)
        .cluster("ping-pong")
        .on_message(move |d| {
            if let Some(s) = &noted {
                s.note(&s.pong_in, d.payload(), Instant::now());
            }
            let sent = if d.is_request() {
                d.reply(d.payload_bytes()).map_err(|e| e.to_string())
            } else {
                match d.sender() {
                    Some(node) => node
                        .send(d.from(), d.payload_bytes())
                        .map_err(|e| e.to_string()),
                    None => Err("no node handle".into()),
                }
            };
            if let Err(e) = sent {
                eprintln!("pong: reply to {} failed: {e}", d.from());
            }
            if let Some(s) = &noted {
                s.note(&s.pong_out, d.payload(), Instant::now());
            }
        })
        .start()?;

    let (replied, replies) = mpsc::channel::<Instant>();
    let ping = journalled(tune(Node::builder("ping")), "ping-pong", "ping", policy)
        .cluster("ping-pong")
        .peer("pong", pong.local_addr())
        .on_message(move |_| {
            // Ends only if main has stopped waiting.
            let _ = replied.send(Instant::now());
        })
        .start()?;
    pong.add_peer("ping", ping.local_addr())?;

    let payload = Bytes::from(vec![0x5A; size]);
    // With `--stages`, each request carries its round trip's number in its first 8 bytes.
    let numbered = |i: usize| {
        let mut p = vec![0x5A; size];
        p[..8].copy_from_slice(&(i as u64).to_le_bytes());
        Bytes::from(p)
    };
    // Each timed round trip's number, time, and when it left and came back: split into its
    // parts once pong has stopped (see `Stages`).
    let mut timed = Vec::new();
    let mut rtts = Vec::with_capacity(count);
    // The same round trips, split by whether both members' spins were on throughout
    // (spinning as it began, no stand-down counted by its end) or not.
    let (mut spun, mut not_spun) = (Vec::new(), Vec::new());
    let mut cpu = None;
    for i in 0..warmup + count {
        if i == warmup {
            cpu = process_cpu();
        }
        pause(gap);
        let before = [ping.idle_stats(), pong.idle_stats()];
        let message = if stages.is_some() {
            numbered(i)
        } else {
            payload.clone()
        };
        let sent = Instant::now();
        let arrived = if a.request {
            ping.request("pong", message, REPLY_TIMEOUT)
                .map_err(|e| format!("round trip {i}: the request failed ({e})"))?;
            Instant::now()
        } else {
            ping.send("pong", message)?;
            replies
                .recv_timeout(REPLY_TIMEOUT)
                .map_err(|e| format!("round trip {i}: no reply within {REPLY_TIMEOUT:?} ({e})"))?
        };
        if i >= warmup {
            let after = [ping.idle_stats(), pong.idle_stats()];
            let on = before.iter().zip(&after).all(|(b, a)| {
                b.spinning
                    && a.stood_down_loaded == b.stood_down_loaded
                    && a.stood_down_contended == b.stood_down_contended
            });
            let rtt = arrived - sent;
            rtts.push(rtt);
            if on { &mut spun } else { &mut not_spun }.push(rtt);
            if stages.is_some() {
                timed.push((i, rtt, sent, arrived));
            }
        }
    }

    let cohort_cpu = cpu_per_trip(cpu, count);
    // What each member's idle strategy did over the run (warm-up included): a tail that
    // comes with stand-downs is the adaptive spin blocking where it would have polled.
    let idle: Vec<String> = [&ping, &pong]
        .iter()
        .map(|n| {
            let i = n.stats().idle;
            format!(
                "{} stood down {} times ({} for load, {} for contended cores), \
                 {} turns driven by senders",
                n.name(),
                i.stood_down_loaded + i.stood_down_contended,
                i.stood_down_loaded,
                i.stood_down_contended,
                i.driven_turns
            )
        })
        .collect();
    ping.shutdown(Duration::from_secs(5))?;
    pong.shutdown(Duration::from_secs(5))?;
    let mut parts: Vec<Split> = stages.as_ref().map_or_else(Vec::new, |s| {
        timed
            .iter()
            .filter_map(|&(i, rtt, sent, arrived)| Some((rtt, s.parts(i, sent, arrived)?)))
            .collect()
    });
    let unsplit = timed.len() - parts.len();
    if policy.is_some() {
        for name in ["ping", "pong"] {
            let _ = std::fs::remove_dir_all(journal_dir("ping-pong", name));
        }
    }

    let (raw, raw_cpu, mut raw_parts) = raw_tcp_rtts(size, warmup, count, gap, a.stages)?;
    let journal = policy.map_or("no journal".to_owned(), |p| format!("journal {p:?}"));
    let paced = if gap.is_zero() {
        String::new()
    } else {
        format!(", {} µs apart", gap.as_micros())
    };
    let how = if a.request {
        "requests and replies"
    } else {
        "round trips"
    };
    println!("{count} {how} of {size} B (after {warmup} warm-up, {journal}{paced}), RTT in µs:");
    println!(
        "{:<8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "", "min", "p50", "p99", "p99.9", "max", "mean"
    );
    let cohort_p50 = print_row("cohort", &mut rtts);
    let raw_p50 = print_row("raw TCP", &mut raw.clone());
    println!("p50 cohort/raw = {:.2}", cohort_p50 / raw_p50);
    if let (Some(c), Some(r)) = (cohort_cpu, raw_cpu) {
        // Every thread of the process: both members' IO and pool threads (what a spinning
        // idle strategy burns shows here) and main; raw TCP's two threads.
        println!(
            "CPU per round trip (every thread): cohort {:.1} µs, raw TCP {:.1} µs, cohort/raw = {:.2}",
            micros(c),
            micros(r),
            c.as_secs_f64() / r.as_secs_f64().max(f64::MIN_POSITIVE)
        );
    }
    println!("idle spin: {}", idle.join(", "));
    // Where the tail comes from: the round trips that found both members' spins on
    // throughout ("on"), against those with a spin down or standing down ("off"), with the
    // share of the round trips in each.
    for (on, rtts) in [("on", &mut spun), ("off", &mut not_spun)] {
        if !rtts.is_empty() {
            let share = 100.0 * rtts.len() as f64 / count as f64;
            print_row(&format!("{on} {share:>3.0}%"), rtts);
        }
    }
    if stages.is_some() {
        print_stages("cohort", &mut parts);
        if unsplit > 0 {
            println!("({unsplit} round trips not split: pong noted no time for them)");
        }
        print_stages("raw TCP", &mut raw_parts);
    }
    Ok(())
}

/// The process's CPU time since `before` over `trips` round trips (`None` if it could not be
/// read).
fn cpu_per_trip(before: Option<Duration>, trips: usize) -> Option<Duration> {
    let spent = process_cpu()?.checked_sub(before?)?;
    Some(spent / u32::try_from(trips).unwrap_or(u32::MAX))
}

/// Prints one row of percentiles; returns the median in µs.
fn print_row(label: &str, rtts: &mut [Duration]) -> f64 {
    let total: Duration = rtts.iter().sum();
    rtts.sort_unstable();
    let p50 = micros(quantile(rtts, 0.50));
    println!(
        "{:<8} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
        label,
        micros(rtts[0]),
        p50,
        micros(quantile(rtts, 0.99)),
        micros(quantile(rtts, 0.999)),
        micros(rtts[rtts.len() - 1]),
        micros(total) / rtts.len() as f64,
    );
    p50
}

/// Raw TCP's round trips, the process's CPU time per round trip over them, and (with
/// `stages`) the timed round trips split into their parts.
type RawRun = (Vec<Duration>, Option<Duration>, Vec<Split>);

/// Waits `gap` before the next round trip (none when zero). A sleep: the wait is not timed,
/// and a sender of sporadic requests sleeps between them.
fn pause(gap: Duration) {
    if !gap.is_zero() {
        std::thread::sleep(gap);
    }
}

/// The baseline: the same ping-pong over one blocking loopback TCP connection, `gap` apart.
fn raw_tcp_rtts(
    size: usize,
    warmup: usize,
    count: usize,
    gap: Duration,
    split: bool,
) -> Result<RawRun, Box<dyn Error>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    // With `split`, the echo thread notes when each request's `read` returned and when the
    // reply's `write` did, as pong's handler does (read once the thread is joined).
    let stages = split.then(|| Arc::new(Stages::new(warmup + count)));
    let noted = stages.clone();
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; 4 + size];
        loop {
            if let Err(e) = s.read_exact(&mut buf) {
                return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    Ok(())
                } else {
                    Err(e)
                };
            }
            if let Some(st) = &noted {
                st.note(&st.pong_in, &buf[4..], Instant::now());
            }
            s.write_all(&buf)?;
            if let Some(st) = &noted {
                st.note(&st.pong_out, &buf[4..], Instant::now());
            }
        }
    });
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut frame = (size as u32).to_le_bytes().to_vec();
    frame.resize(4 + size, 0x5A);
    let mut reply = vec![0u8; 4 + size];
    let mut rtts = Vec::with_capacity(count);
    let mut timed = Vec::new();
    let mut cpu = None;
    for i in 0..warmup + count {
        if i == warmup {
            cpu = process_cpu();
        }
        pause(gap);
        if split {
            frame[4..12].copy_from_slice(&(i as u64).to_le_bytes());
        }
        let sent = Instant::now();
        s.write_all(&frame)?;
        s.read_exact(&mut reply)?;
        let arrived = Instant::now();
        if i >= warmup {
            rtts.push(arrived - sent);
            if split {
                timed.push((i, arrived - sent, sent, arrived));
            }
        }
    }
    let cpu = cpu_per_trip(cpu, count);
    drop(s);
    echo.join().map_err(|_| "raw TCP echo thread panicked")??;
    let parts = stages.map_or_else(Vec::new, |st| {
        timed
            .iter()
            .filter_map(|&(i, rtt, sent, arrived)| Some((rtt, st.parts(i, sent, arrived)?)))
            .collect()
    });
    Ok((rtts, cpu, parts))
}
