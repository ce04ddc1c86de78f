//! Membership at 16, 32 and 64 members, over real sockets on 127.0.0.1 (all members in this
//! one process), with the default probe interval (1 s):
//!
//! - **converge**: the members start one after the other, each given only the address of the
//!   one before it; the time from the last start until every view holds every member alive;
//! - **cost**: over 10 s of steady state, membership packets and bytes each member sends per
//!   second (SWIM's cost per member does not grow with the cluster);
//! - **detect**: one member goes silent (every membership datagram to or from it dropped, a
//!   test-only fault: a crash as the network sees it); the time until the first member
//!   suspects it and until every other member has declared it failed;
//! - **false failures**: any other member declared failed by anyone but the silenced one
//!   (which hears nobody), all run long (should be 0).
//!
//! `cargo bench --bench membership` (about two minutes); `cargo test --benches` runs it with
//! 4 members and a 100 ms interval, as a smoke test. `cargo bench --bench membership --
//! --converge`: time to converge only, eight runs at each size, each member given a random
//! earlier member as its seed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cohort::{Event, MemberState, Node};

const SECRET: &[u8] = b"membership bench";

struct Run {
    nodes: Vec<Node>,
    /// Per member: the switch that silences it.
    silenced: Vec<Arc<AtomicBool>>,
    /// Members declared failed, as (who declared, whom), all members.
    failures: Arc<Mutex<Vec<(String, String)>>>,
    suspicions: Arc<AtomicU64>,
}

/// How each member is given its seed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Seeds {
    /// The member started before it.
    Chain,
    /// A member started before it, picked at random (a tree: the join wave the simulation
    /// found slowest to converge).
    Random,
}

fn start(n: usize, interval: Duration) -> Run {
    start_with(n, interval, Seeds::Chain, 0)
}

fn start_with(n: usize, interval: Duration, seeds: Seeds, rng: u64) -> Run {
    let mut rng = rng;
    let failures: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let suspicions = Arc::new(AtomicU64::new(0));
    let mut nodes: Vec<Node> = Vec::with_capacity(n);
    let mut silenced = Vec::with_capacity(n);
    // Every member's address, as the silenced member's filter needs them.
    let addrs: Arc<Mutex<Vec<SocketAddr>>> = Arc::default();
    for i in 0..n {
        let name = format!("m{i:02}");
        let silent = Arc::new(AtomicBool::new(false));
        let s = silent.clone();
        let (f, sus, who) = (failures.clone(), suspicions.clone(), name.clone());
        let mut b = Node::builder(&name)
            .cluster("bench")
            .secret(SECRET)
            .listen("127.0.0.1:0")
            .membership(true)
            .membership_interval(interval)
            // Relaxed: a switch flipped once, read per datagram.
            .drop_membership_datagrams(move |_| s.load(Ordering::Relaxed))
            .on_event(move |e| match e {
                Event::MemberFailed { peer } => f
                    .lock()
                    .expect("failures")
                    .push((who.clone(), peer.clone())),
                Event::MemberSuspected { .. } => {
                    sus.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            });
        let seed = match seeds {
            Seeds::Chain => nodes.last(),
            Seeds::Random if i > 0 => {
                // SplitMix64: a run repeats given its seed.
                rng = rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = rng;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                nodes.get(((z ^ (z >> 31)) % i as u64) as usize)
            }
            Seeds::Random => None,
        };
        if let Some(prev) = seed {
            b = b.seed(prev.local_addr());
        }
        let node = b.start().expect("start a member");
        addrs.lock().expect("addrs").push(node.local_addr());
        nodes.push(node);
        silenced.push(silent);
    }
    Run {
        nodes,
        silenced,
        failures,
        suspicions,
    }
}

fn alive(n: &Node) -> usize {
    n.members()
        .iter()
        .filter(|m| m.state == MemberState::Alive)
        .count()
}

/// Polls `done` every 10 ms for at most `limit`; the time it took, or `None`.
fn until(limit: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

fn measure(n: usize, interval: Duration, steady: Duration) {
    let run = start(n, interval);
    let converged = until(interval * 60, || run.nodes.iter().all(|m| alive(m) == n));
    let Some(converged) = converged else {
        println!("{n} members: did not converge within {:?}", interval * 60);
        return;
    };
    let sent = |r: &Run| -> (u64, u64) {
        r.nodes
            .iter()
            .filter_map(Node::membership_stats)
            .fold((0, 0), |(p, b), s| (p + s.packets_sent, b + s.bytes_sent))
    };
    let (p0, b0) = sent(&run);
    let t0 = Instant::now();
    std::thread::sleep(steady);
    let (p1, b1) = sent(&run);
    let secs = t0.elapsed().as_secs_f64() * n as f64;
    let victim = n / 2;
    let name = run.nodes[victim].name().to_string();
    let silenced_at = Instant::now();
    // Relaxed: see the filter.
    run.silenced[victim].store(true, Ordering::Relaxed);
    let others: Vec<&Node> = run
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, m)| m)
        .collect();
    let suspected = until(interval * 120, || {
        others.iter().any(|m| {
            m.members()
                .iter()
                .any(|x| x.name == name && x.state != MemberState::Alive)
        })
    });
    let detected = until(interval * 120, || {
        others.iter().all(|m| {
            m.members()
                .iter()
                .any(|x| x.name == name && x.state == MemberState::Failed)
        })
    });
    let detected_after = silenced_at.elapsed();
    let false_failures = run
        .failures
        .lock()
        .expect("failures")
        .iter()
        // The silenced member declares everyone else failed: it hears nobody.
        .filter(|(who, whom)| *whom != name && *who != name)
        .count();
    println!(
        "{n:>3} members: converged {converged:.2?} after the last start; {:.1} packets/s and {:.0} B/s per member; silenced member first suspected after {}, declared failed by all {} others after {}; false failures {false_failures}; suspicions {}",
        (p1 - p0) as f64 / secs,
        (b1 - b0) as f64 / secs,
        suspected.map_or("(never)".into(), |d| format!("{:.2?}", d)),
        n - 1,
        detected.map_or(format!("(not within {:.0?})", detected_after), |_| format!(
            "{detected_after:.2?}"
        )),
        run.suspicions.load(Ordering::Relaxed),
    );
    for node in run.nodes {
        let _ = node.shutdown(Duration::from_secs(5));
    }
}

/// Time to converge only, `runs` times: members started one after the other, each given a
/// random earlier member as its seed.
fn converge_random(n: usize, interval: Duration, runs: u64) {
    let mut times = Vec::new();
    for r in 0..runs {
        let run = start_with(n, interval, Seeds::Random, r + 1);
        let t = until(interval * 60, || run.nodes.iter().all(|m| alive(m) == n));
        times.push(t.map_or(f64::INFINITY, |d| d.as_secs_f64()));
        for node in run.nodes {
            let _ = node.shutdown(Duration::from_secs(5));
        }
    }
    let text: Vec<String> = times.iter().map(|t| format!("{t:.2} s")).collect();
    println!(
        "{n:>3} members, random earlier seeds: converged after the last start in {}",
        text.join(", ")
    );
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    if std::env::args().any(|a| a == "--converge") {
        for n in [16, 32, 64] {
            converge_random(n, Duration::from_secs(1), 8);
        }
    } else if full {
        for n in [16, 32, 64] {
            measure(n, Duration::from_secs(1), Duration::from_secs(10));
        }
    } else {
        measure(4, Duration::from_millis(100), Duration::from_millis(500));
    }
}
