//! Request and reply between three members: every member serves requests (it answers with
//! the sum of the numbers it is sent) and asks the two others at once, from several threads,
//! with many requests in flight per thread. Replies travel outside flow control, so members
//! that request each other at full rate through small windows never deadlock.
//!
//! `cargo run --release --example request_reply [-- --requests N --threads T --window BYTES]`

use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cohort::{Delivery, Node};

const USAGE: &str = "usage: request_reply [--requests N] [--threads T] [--window BYTES]

Three members on loopback request each other at once; each answers with the sum of the
numbers in the request. Prints the rate and checks every reply.

  --requests N      requests per thread (default 20000)
  --threads T       requesting threads per member (default 2)
  --window BYTES    send window per peer (default 65536)
  -h, --help        this text";

const MEMBERS: [&str; 3] = ["ann", "bob", "cid"];
/// Requests a thread keeps in flight.
const IN_FLIGHT: usize = 64;
const TIMEOUT: Duration = Duration::from_secs(30);

struct Args {
    requests: u64,
    threads: usize,
    window: u64,
}

fn parse() -> Result<Option<Args>, String> {
    let mut a = Args {
        requests: 20_000,
        threads: 2,
        window: 64 * 1024,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        if !["--requests", "--threads", "--window"].contains(&flag.as_str()) {
            return Err(format!("unknown argument {flag:?}"));
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let n = value
            .parse::<u64>()
            .map_err(|e| format!("{flag} {value:?}: {e}"))?;
        match flag.as_str() {
            "--requests" => a.requests = n,
            "--threads" => a.threads = n.max(1) as usize,
            _ => a.window = n,
        }
    }
    Ok(Some(a))
}

/// The service every member offers: the sum of the little-endian u32s in the request.
fn serve(d: Delivery) {
    if !d.is_request() {
        return;
    }
    let sum: u64 = d
        .payload()
        .chunks_exact(4)
        .map(|c| u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .sum();
    // Never blocks: a reply needs no window.
    if let Err(e) = d.reply(sum.to_le_bytes().to_vec()) {
        eprintln!("cannot answer {}: {e}", d.from());
    }
}

/// A request for the numbers i, i+1, …, i+k, and the sum it must come back with.
fn question(i: u64) -> (Vec<u8>, u64) {
    let k = 1 + i % 16;
    let numbers: Vec<u32> = (0..k).map(|j| (i + j) as u32).collect();
    let sum = numbers.iter().map(|&n| u64::from(n)).sum();
    (numbers.iter().flat_map(|n| n.to_le_bytes()).collect(), sum)
}

fn run(a: &Args) -> Result<(), Box<dyn Error>> {
    let nodes: Vec<Node> = MEMBERS
        .iter()
        .map(|name| {
            Node::builder(name)
                .cluster("request-reply-example")
                .window_bytes(a.window)
                .on_message(serve)
                .start()
        })
        .collect::<Result<_, _>>()?;
    for n in &nodes {
        for other in nodes.iter().filter(|o| o.name() != n.name()) {
            n.add_peer(other.name(), other.local_addr())?;
        }
    }
    let started = Instant::now();
    let answered: u64 = std::thread::scope(|s| -> Result<u64, Box<dyn Error + Send + Sync>> {
        let mut threads = Vec::new();
        for n in &nodes {
            for other in nodes.iter().filter(|o| o.name() != n.name()) {
                for _ in 0..a.threads {
                    let to = n.sender().to(other.name())?;
                    threads.push(s.spawn(move || -> Result<u64, cohort::Error> {
                        // Many requests in flight from one thread: send, and take the
                        // oldest reply once IN_FLIGHT are waiting.
                        let mut pending = std::collections::VecDeque::new();
                        let mut done = 0;
                        let mut check = |(reply, sum): (cohort::PendingReply, u64)| {
                            let got = reply.wait(TIMEOUT)?;
                            let got = u64::from_le_bytes(got[..].try_into().unwrap_or([0xff; 8]));
                            assert_eq!(got, sum, "a reply matched to its request");
                            done += 1;
                            Ok::<(), cohort::Error>(())
                        };
                        for i in 0..a.requests {
                            let (payload, sum) = question(i);
                            pending.push_back((to.send_request(payload)?, sum));
                            if pending.len() == IN_FLIGHT {
                                check(pending.pop_front().expect("IN_FLIGHT waiting"))?;
                            }
                        }
                        for p in pending {
                            check(p)?;
                        }
                        Ok(done)
                    }));
                }
            }
        }
        let mut total = 0;
        for t in threads {
            total += t.join().map_err(|_| "a requesting thread panicked")??;
        }
        Ok(total)
    })
    .map_err(|e| e.to_string())?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{answered} requests answered and checked in {secs:.2} s ({:.0} requests/s), \
         {} members × {} peers × {} threads",
        answered as f64 / secs,
        MEMBERS.len(),
        MEMBERS.len() - 1,
        a.threads
    );
    for n in &nodes {
        for p in n.stats().peers {
            println!(
                "  {} → {}: {} replies, {} late, {} in flight",
                n.name(),
                p.name,
                p.replies,
                p.late_replies,
                p.requests_in_flight
            );
        }
    }
    for n in &nodes {
        n.shutdown(Duration::from_secs(5))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("request_reply: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("request_reply: {e}");
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
