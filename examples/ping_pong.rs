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
//! --gap-us G --journal never|interval|every]` (defaults: K = 100 000 round trips of B = 64
//! bytes after W = 10 000 untimed ones, the builder's defaults, no gap, no journal).
//! `--spin-us S` sets `Builder::low_latency(S µs)` on both members (0: no spin at all).
//! `--gap-us G` pauses G µs between round trips (cohort's and raw TCP's alike), as a
//! sender of sporadic requests does: a pause longer than the spin finds every thread
//! parked when the next request comes. With `--journal`,
//! both members journal in fresh
//! directories under the system temp dir with that fsync policy (`interval`: 5 ms), so the
//! cost of the durable outbox on a round trip is read off one report.

use std::error::Error;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cohort::{Builder, Bytes, FsyncPolicy, Node};

mod support;
use support::{journal_dir, journalled, process_cpu};

/// Longest wait for one reply before giving up.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

const USAGE: &str = "usage: ping_pong [--count K] [--size B] [--warmup W] [--spin-us S]
                 [--gap-us G] [--journal never|interval|every]

Round-trip time between two members in one process, next to raw blocking TCP.

  --count K        timed round trips (default 100000)
  --size B         bytes per message (default 64)
  --warmup W       untimed round trips first (default 10000)
  --spin-us S      Builder::low_latency(S µs) on both members; 0: never spin
                   (default: the builder's idle strategy)
  --gap-us G       pause G µs between round trips (default 0), for cohort and raw TCP
  --journal P      journal both members in fresh temp directories with fsync policy P:
                   never, interval (5 ms) or every (default: no journal)
  -h, --help       this text";

/// The command line.
struct Args {
    count: usize,
    size: usize,
    warmup: usize,
    spin: Option<Duration>,
    gap: Duration,
    policy: Option<FsyncPolicy>,
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
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
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
    Ok(Some(a))
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

    // pong echoes through the node handle its delivery carries.
    let pong = journalled(tune(Node::builder("pong")), "ping-pong", "pong", policy)
        .cluster("ping-pong")
        .on_message(move |d| {
            let Some(node) = d.sender() else { return };
            if let Err(e) = node.send(d.from(), d.payload_bytes()) {
                eprintln!("pong: reply to {} failed: {e}", d.from());
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
        let sent = Instant::now();
        ping.send("pong", payload.clone())?;
        let arrived = replies
            .recv_timeout(REPLY_TIMEOUT)
            .map_err(|e| format!("round trip {i}: no reply within {REPLY_TIMEOUT:?} ({e})"))?;
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
    if policy.is_some() {
        for name in ["ping", "pong"] {
            let _ = std::fs::remove_dir_all(journal_dir("ping-pong", name));
        }
    }

    let (raw, raw_cpu) = raw_tcp_rtts(size, warmup, count, gap)?;
    let journal = policy.map_or("no journal".to_owned(), |p| format!("journal {p:?}"));
    let paced = if gap.is_zero() {
        String::new()
    } else {
        format!(", {} µs apart", gap.as_micros())
    };
    println!(
        "{count} round trips of {size} B (after {warmup} warm-up, {journal}{paced}), RTT in µs:"
    );
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

/// Raw TCP's round trips, and the process's CPU time per round trip over them.
type RawRun = (Vec<Duration>, Option<Duration>);

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
) -> Result<RawRun, Box<dyn Error>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
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
            s.write_all(&buf)?;
        }
    });
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut frame = (size as u32).to_le_bytes().to_vec();
    frame.resize(4 + size, 0x5A);
    let mut reply = vec![0u8; 4 + size];
    let mut rtts = Vec::with_capacity(count);
    let mut cpu = None;
    for i in 0..warmup + count {
        if i == warmup {
            cpu = process_cpu();
        }
        pause(gap);
        let sent = Instant::now();
        s.write_all(&frame)?;
        s.read_exact(&mut reply)?;
        if i >= warmup {
            rtts.push(sent.elapsed());
        }
    }
    let cpu = cpu_per_trip(cpu, count);
    drop(s);
    echo.join().map_err(|_| "raw TCP echo thread panicked")??;
    Ok((rtts, cpu))
}
