//! Three members on loopback in one process; each sends N messages to each other, then a
//! table shows what was delivered per sender, whether order held, the rate, and the most
//! pool threads ever seen delivering one sender's messages at once (must be 1).
//!
//! `cargo run --release --example cluster [-- --count N --size B]`

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cohort::Node;

const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];

/// What one receiver saw from one sender.
#[derive(Default)]
struct Seen {
    next: u64,
    delivered: u64,
    out_of_order: u64,
}

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let count = arg("--count", 200_000);
    let size = arg("--size", 64).max(8) as usize;
    let pool_threads = arg("--pool-threads", 2) as usize;

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
    let deadline = Instant::now() + Duration::from_secs(120);
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
