//! Three members on loopback in one process; each sends N messages to each other, then a
//! table shows what was delivered per sender, whether order held, the rate, and the most
//! pool threads ever seen delivering one sender's messages at once (must be 1).
//!
//! `cargo run --release --example cluster [-- --count N --size B --pool-threads T]`

use std::collections::HashMap;
use std::error::Error;
use std::process::ExitCode;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cohort::Node;

const USAGE: &str = "usage: cluster [--count N] [--size B] [--pool-threads T]

Three members on loopback send each other N messages each; prints what every member
delivered from every other, whether their order held, the rate, and each node's stats.

  --count N          messages from each member to each other member (default 200000)
  --size B           bytes per message, at least 8 (default 64)
  --pool-threads T   delivery threads per member (default 2)
  -h, --help         this text";

const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];

/// The longest the example waits for its messages to be delivered.
const DEADLINE: Duration = Duration::from_secs(120);

/// What one receiver saw from one sender.
#[derive(Default)]
struct Seen {
    next: u64,
    delivered: u64,
    out_of_order: u64,
}

struct Args {
    count: u64,
    size: usize,
    pool_threads: usize,
}

/// The command line; `Ok(None)` when help was asked for.
fn parse() -> Result<Option<Args>, String> {
    let mut a = Args {
        count: 200_000,
        size: 64,
        pool_threads: 2,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        if !["--count", "--size", "--pool-threads"].contains(&flag.as_str()) {
            return Err(format!("unknown argument {flag:?}"));
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let n = value
            .parse::<u64>()
            .map_err(|e| format!("{flag} {value:?}: {e}"))?;
        match flag.as_str() {
            "--count" => a.count = n,
            "--size" if n < 8 => return Err(format!("--size {n}: at least 8 (the counter)")),
            "--size" => a.size = n as usize,
            _ if n == 0 => return Err(format!("{flag} {n}: at least 1")),
            _ => a.pool_threads = n as usize,
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
            eprintln!("cluster: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cluster: {e}");
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

/// Messages of every sender delivered by `node`, as its stats count them.
fn counted(node: &Node) -> u64 {
    node.stats().peers.iter().map(|p| p.delivered).sum()
}

/// Waits until every node's stats count `per_node` delivered messages, or `deadline`.
/// A handler's own count runs ahead of the stats, which count a delivery once its handler
/// has returned: without this wait the table could show fewer than the handlers saw.
fn wait_for_stats(nodes: &[Node], per_node: u64, deadline: Instant) -> bool {
    loop {
        if nodes.iter().all(|n| counted(n) >= per_node) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::park_timeout(Duration::from_millis(1));
    }
}

fn run(a: &Args) -> Result<(), Box<dyn Error>> {
    let (count, size, pool_threads) = (a.count, a.size, a.pool_threads);

    let expected_total = count * 6;
    // seen[receiver][sender]
    let seen: Vec<Arc<Mutex<HashMap<String, Seen>>>> =
        NAMES.iter().map(|_| Arc::default()).collect();
    // Messages delivered so far, with a condvar to wait on without polling.
    let total = Arc::new((Mutex::new(0u64), Condvar::new()));
    let mut nodes = Vec::new();
    for (i, name) in NAMES.iter().enumerate() {
        let seen = seen[i].clone();
        let total = total.clone();
        let node = Node::builder(name)
            .cluster("example")
            .pool_threads(pool_threads)
            .on_message(move |d| {
                let n = u64::from_le_bytes(d.payload()[..8].try_into().expect("8-byte counter"));
                let mut map = seen.lock().expect("no panics holding this lock");
                let s = map.entry(d.from().to_owned()).or_default();
                if n != s.next {
                    s.out_of_order += 1;
                }
                s.next = n + 1;
                s.delivered += 1;
                drop(map);
                let (count, cv) = &*total;
                let mut n = count.lock().expect("no panics holding this lock");
                *n += 1;
                if *n % 1024 == 0 || *n == expected_total {
                    cv.notify_all();
                }
            })
            .start()?;
        nodes.push(node);
    }
    for (i, a) in nodes.iter().enumerate() {
        for (j, b) in nodes.iter().enumerate() {
            if i != j {
                a.add_peer(b.name(), b.local_addr())?;
            }
        }
    }

    let expected = expected_total;
    let started = Instant::now();
    std::thread::scope(|s| {
        for node in &nodes {
            s.spawn(move || {
                let others: Vec<&str> = NAMES
                    .iter()
                    .copied()
                    .filter(|n| *n != node.name())
                    .collect();
                let mut buf = vec![0u8; size];
                for n in 0..count {
                    buf[..8].copy_from_slice(&n.to_le_bytes());
                    for to in &others {
                        node.send(to, buf.clone()).expect("send");
                    }
                }
            });
        }
    });
    let deadline = Instant::now() + DEADLINE;
    {
        let (count, cv) = &*total;
        let mut n = count.lock().expect("no panics holding this lock");
        while *n < expected {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            n = cv
                .wait_timeout(n, deadline - now)
                .expect("no panics holding this lock")
                .0;
        }
    }
    let elapsed = started.elapsed();
    // Each node receives `count` messages from each of the two others.
    if !wait_for_stats(&nodes, count * 2, deadline) {
        eprintln!("cluster: the stats below may lag: not every delivery counted by the deadline");
    }

    println!(
        "{:<8} {:<8} {:>12} {:>10}",
        "receiver", "sender", "delivered", "in order"
    );
    let mut all_ok = true;
    for (i, r) in NAMES.iter().enumerate() {
        let map = seen[i].lock().expect("no panics holding this lock");
        for s in NAMES.iter().filter(|s| *s != r) {
            let (d, ooo) = map
                .get(*s)
                .map_or((0, 0), |x| (x.delivered, x.out_of_order));
            let ok = d == count && ooo == 0;
            all_ok &= ok;
            println!(
                "{:<8} {:<8} {:>12} {:>10}",
                r,
                s,
                d,
                if ooo == 0 { "yes" } else { "NO" }
            );
        }
    }
    let delivered = *total.0.lock().expect("no panics holding this lock");
    let max_conc = nodes
        .iter()
        .map(|n| n.stats().max_concurrent_deliverers)
        .max()
        .unwrap_or(0);
    println!(
        "\n{delivered} of {expected} messages of {size} B in {:.3} s: {:.0} msgs/s; most concurrent deliverers for one sender: {max_conc}",
        elapsed.as_secs_f64(),
        delivered as f64 / elapsed.as_secs_f64()
    );
    for n in &nodes {
        println!("\n{}", n.stats());
    }
    for n in &nodes {
        n.shutdown(Duration::from_secs(5))?;
    }
    if !all_ok || max_conc != 1 {
        return Err("delivery check failed".into());
    }
    Ok(())
}
