//! Two members on one host over Unix-domain sockets: `alpha` and `beta` each listen on a
//! socket file (`Addr::unix`) and name the other's as its peer. alpha sends K messages to
//! beta, then asks R requests, which beta answers; the example prints the rate and the
//! round trips, and shows the socket files gone once both nodes have stopped.
//!
//! `cargo run --release --example ipc [-- --count K --size B --requests R --dir D]`
//! (defaults: K = 100 000 messages of B = 64 bytes, R = 10 000 requests, the sockets in a
//! fresh directory under the system temp dir). The same protocol, handshake, recovery and
//! authentication as over TCP; a member of another process names the same path.

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use cohort::{Addr, Bytes, Node};

const USAGE: &str = "usage: ipc [--count K] [--size B] [--requests R] [--dir D]

Two members in one process over Unix-domain sockets: alpha sends K messages to beta,
then asks R requests that beta answers.

  --count K        messages alpha sends (default 100000)
  --size B         bytes per message (default 64)
  --requests R     requests alpha asks, one at a time (default 10000)
  --dir D          directory of the socket files (default: a fresh one under the
                   system temp dir, removed at the end)
  -h, --help       this text";

/// The command line.
struct Args {
    count: u64,
    size: usize,
    requests: u64,
    dir: Option<PathBuf>,
}

/// The command line; `Ok(None)` when help was asked for.
fn parse() -> Result<Option<Args>, String> {
    let mut a = Args {
        count: 100_000,
        size: 64,
        requests: 10_000,
        dir: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        if !["--count", "--size", "--requests", "--dir"].contains(&flag.as_str()) {
            return Err(format!("unknown argument {flag:?}"));
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        if flag == "--dir" {
            a.dir = Some(PathBuf::from(value));
            continue;
        }
        let n = value
            .parse::<u64>()
            .map_err(|e| format!("{flag} {value:?}: {e}"))?;
        match flag.as_str() {
            "--count" => a.count = n,
            "--size" => a.size = n as usize,
            _ => a.requests = n,
        }
    }
    Ok(Some(a))
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("ipc: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipc: {e}");
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
    let (dir, temporary) = match &a.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("cohort-ipc-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&dir)?;
    let (alpha_at, beta_at) = (
        Addr::unix(dir.join("alpha.sock")),
        Addr::unix(dir.join("beta.sock")),
    );

    // beta counts messages and answers requests with their payload.
    let received = Arc::new(AtomicU64::new(0));
    let counted = received.clone();
    let (all_in, all) = mpsc::channel::<()>();
    let count = a.count;
    let beta = Node::builder("beta")
        .cluster("ipc")
        .listen(beta_at.clone())
        .peer("alpha", alpha_at.clone())
        .on_message(move |d| {
            if d.is_request() {
                if let Err(e) = d.reply(d.payload_bytes()) {
                    eprintln!("beta: reply failed: {e}");
                }
            } else {
                // Relaxed: a count; the channel tells main when it is complete.
                if counted.fetch_add(1, Ordering::Relaxed) + 1 == count {
                    let _ = all_in.send(());
                }
            }
        })
        .start()?;
    let alpha = Node::builder("alpha")
        .cluster("ipc")
        .listen(alpha_at.clone())
        .peer("beta", beta.listen_addr())
        .start()?;
    println!(
        "alpha listens on {}, beta on {}",
        alpha.listen_addr(),
        beta.listen_addr()
    );

    // Messages: sent from the first instant (the connection is made meanwhile).
    let payload = Bytes::from(vec![0x5A; a.size]);
    let started = Instant::now();
    for _ in 0..a.count {
        alpha.send("beta", payload.clone())?;
    }
    if a.count > 0 && all.recv_timeout(Duration::from_secs(60)).is_err() {
        return Err(format!(
            "beta got {} of {} messages within 60 s",
            received.load(Ordering::Relaxed),
            a.count
        )
        .into());
    }
    let took = started.elapsed();
    println!(
        "{} messages of {} B: {:.0} messages/s ({:.1} MB/s)",
        a.count,
        a.size,
        a.count as f64 / took.as_secs_f64(),
        (a.count as f64 * a.size as f64) / took.as_secs_f64() / 1e6
    );

    // Requests, one at a time.
    let mut rtts = Vec::with_capacity(a.requests as usize);
    for _ in 0..a.requests {
        let sent = Instant::now();
        let reply = alpha.request("beta", payload.clone(), Duration::from_secs(10))?;
        rtts.push(sent.elapsed());
        if reply != payload {
            return Err("a reply differs from its request".into());
        }
    }
    if !rtts.is_empty() {
        rtts.sort_unstable();
        let at = |q: f64| rtts[(q * (rtts.len() - 1) as f64).round() as usize];
        println!(
            "{} requests: round trip min {:?}, p50 {:?}, p99 {:?}",
            a.requests,
            rtts[0],
            at(0.5),
            at(0.99)
        );
    }

    alpha.shutdown(Duration::from_secs(5))?;
    beta.shutdown(Duration::from_secs(5))?;
    let left = [&alpha_at, &beta_at]
        .iter()
        .filter_map(|a| a.as_unix())
        .filter(|p| p.exists())
        .count();
    println!("stopped; socket files left: {left}");
    if temporary {
        let _ = std::fs::remove_dir(&dir);
    }
    Ok(())
}
