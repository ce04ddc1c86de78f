//! A real network partition: eight member processes in two Linux network namespaces joined
//! by a veth pair, four on each side, each given one seed. Once their view is whole the
//! link between the halves is blackholed in the kernel (a route on each side: packets of
//! established connections queue and are retransmitted, new connections and membership
//! datagrams fail), so TCP and UDP both lose the other half, as in a partition between
//! racks. Each half declares the other failed; after the routes go, the halves find each
//! other again, with no restart, into one view of eight and a full mesh of connections.
//!
//! Network namespaces need root (`CAP_NET_ADMIN`) and iproute2's `ip`; where they are not
//! at hand the test says so and does nothing. The members are this test binary re-executed
//! with `--exact netns_member` inside a namespace (`ip netns exec`).

mod support;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use cohort::{MemberState, Node};
use support::*;

const CLUSTER: &str = "partition";
const SECRET: &[u8] = b"partition secret";
/// Fast probing: a failure is declared within seconds.
const INTERVAL: Duration = Duration::from_millis(100);
const ENV: &str = "COHORT_NETNS_MEMBER";
const MARK: &str = "netns-member:";
/// The two halves' addresses on the veth pair.
const LEFT_IP: &str = "10.201.0.1";
const RIGHT_IP: &str = "10.201.0.2";

/// Runs `ip` with `args`; whether it succeeded.
fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Two network namespaces joined by a veth pair; removed (with the pair) when dropped.
struct Halves {
    left: String,
    right: String,
}

impl Halves {
    /// Makes them, or `None` where this machine cannot (not root, no `ip`).
    fn new() -> Option<Halves> {
        let pid = std::process::id();
        let h = Halves {
            left: format!("cohort-{pid}-l"),
            right: format!("cohort-{pid}-r"),
        };
        if !ip(&["netns", "add", &h.left]) {
            return None;
        }
        if !ip(&["netns", "add", &h.right]) {
            return None; // `h` drops: the left one goes
        }
        let (l, r) = (h.left.as_str(), h.right.as_str());
        let steps: [&[&str]; 7] = [
            &[
                "link", "add", "l0", "netns", l, "type", "veth", "peer", "name", "r0", "netns", r,
            ],
            &["-n", l, "addr", "add", "10.201.0.1/24", "dev", "l0"],
            &["-n", r, "addr", "add", "10.201.0.2/24", "dev", "r0"],
            &["-n", l, "link", "set", "l0", "up"],
            &["-n", r, "link", "set", "r0", "up"],
            &["-n", l, "link", "set", "lo", "up"],
            &["-n", r, "link", "set", "lo", "up"],
        ];
        steps.iter().all(|a| ip(a)).then_some(h)
    }

    /// Cuts the halves apart (`true`) or joins them again (`false`).
    fn part(&self, parted: bool) {
        let verb = if parted { "add" } else { "del" };
        for (ns, other) in [(&self.left, RIGHT_IP), (&self.right, LEFT_IP)] {
            let dest = format!("{other}/32");
            assert!(
                ip(&["-n", ns, "route", verb, "blackhole", &dest]),
                "ip -n {ns} route {verb} blackhole {dest}"
            );
        }
    }
}

impl Drop for Halves {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.left]);
        let _ = ip(&["netns", "del", &self.right]);
    }
}

/// A member process and what it last said of its view.
struct Member {
    name: String,
    child: Child,
    lines: Receiver<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    /// Its latest summary: name → (state, connected).
    view: BTreeMap<String, (String, bool)>,
}

impl Member {
    fn spawn(ns: &str, name: &str, listen: SocketAddr, seed: Option<SocketAddr>) -> Member {
        let exe = std::env::current_exe().expect("the test binary");
        let seed = seed.map_or_else(|| "-".to_owned(), |s| s.to_string());
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(exe)
            .args([
                "--exact",
                "netns_member",
                "--nocapture",
                "--include-ignored",
                "--test-threads=1",
            ])
            .env(ENV, format!("{name} {listen} {seed}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a member in its namespace");
        let out = child::output(&mut child, MARK);
        Member {
            name: name.to_owned(),
            child,
            lines: out.lines,
            stderr: out.stderr,
            view: BTreeMap::new(),
        }
    }

    /// Takes what the member said since the last call.
    fn update(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            let Some(rest) = line.strip_prefix("view ") else {
                continue;
            };
            self.view = rest
                .split(' ')
                .filter_map(|m| {
                    let mut f = m.split(':');
                    let (name, state, up) = (f.next()?, f.next()?, f.next()?);
                    Some((name.to_owned(), (state.to_owned(), up == "up")))
                })
                .collect();
        }
    }

    fn sees(&self, name: &str, state: &str) -> bool {
        self.view.get(name).is_some_and(|(s, _)| s == state)
    }

    fn connected(&self, name: &str) -> bool {
        self.view.get(name).is_some_and(|&(_, up)| up)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        // Closing stdin stops it; a kill makes sure.
        drop(self.child.stdin.take());
        let deadline = Instant::now() + SHUTDOWN;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::yield_now();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `cond` holds of every member's latest view.
fn wait_views(members: &mut [Member], what: &str, cond: impl Fn(usize, &Member) -> bool) {
    let members = std::cell::RefCell::new(members);
    wait_until_or(
        PATIENCE,
        || {
            let mut ms = members.borrow_mut();
            ms.iter_mut().for_each(Member::update);
            ms.iter().enumerate().all(|(i, m)| cond(i, m))
        },
        || {
            let views: Vec<String> = members
                .borrow()
                .iter()
                .map(|m| {
                    let stderr = m.stderr.lock().map(|s| s.clone()).unwrap_or_default();
                    format!("{}: {:?}\n{stderr}", m.name, m.view)
                })
                .collect();
            format!("{what}:\n{}", views.join("\n"))
        },
    );
}

#[test]
fn a_partition_between_two_network_namespaces_heals_into_one_view() {
    let Some(halves) = Halves::new() else {
        eprintln!(
            "skipped: no network namespaces here (needs root and iproute2's `ip`); the \
             partition is also covered on 127.0.0.1 by tests/membership.rs"
        );
        return;
    };
    let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
    let addr = |i: usize| -> SocketAddr {
        let host = if i < 4 { LEFT_IP } else { RIGHT_IP };
        format!("{host}:{}", 7100 + i % 4)
            .parse()
            .expect("an address")
    };
    // Each seeded with the one before it: the right half's first knows the left's last.
    let mut members: Vec<Member> = (0..8)
        .map(|i| {
            let ns = if i < 4 { &halves.left } else { &halves.right };
            Member::spawn(ns, &names[i], addr(i), (i > 0).then(|| addr(i - 1)))
        })
        .collect();
    let whole = |_: usize, m: &Member| {
        names.iter().all(|n| m.sees(n, "alive"))
            && names
                .iter()
                .filter(|n| **n != m.name)
                .all(|n| m.connected(n))
    };
    wait_views(&mut members, "the view converges to eight", whole);

    halves.part(true);
    let t = Instant::now();
    wait_views(
        &mut members,
        "each half declares the other failed",
        |i, m| {
            let (mine, other) = if i < 4 { (0..4, 4..8) } else { (4..8, 0..4) };
            mine.into_iter().all(|j| m.sees(&names[j], "alive"))
                && other.into_iter().all(|j| m.sees(&names[j], "failed"))
        },
    );
    println!(
        "each half declared the other failed after {:?}",
        t.elapsed()
    );

    halves.part(false);
    let t = Instant::now();
    wait_views(&mut members, "the halves heal into one view", whole);
    println!("healed into one view after {:?}", t.elapsed());

    for m in &mut members {
        drop(m.child.stdin.take());
    }
    for m in &mut members {
        let status = m.child.wait().expect("a member's exit");
        assert!(status.success(), "{} exited with {status}", m.name);
    }
}

/// One member of the partition test, run inside a namespace: prints its view (every
/// member's state and whether it is connected) after each event, until its stdin closes.
#[test]
#[ignore = "run by the partition test as a child process in a network namespace"]
fn netns_member() {
    let Ok(spec) = std::env::var(ENV) else {
        eprintln!("netns_member runs only under the partition test");
        return;
    };
    let mut parts = spec.split(' ');
    let name = parts.next().expect("name").to_owned();
    let listen: SocketAddr = parts.next().and_then(|s| s.parse().ok()).expect("listen");
    let seed: Option<SocketAddr> = parts.next().and_then(|s| s.parse().ok());
    let (tx, events) = std::sync::mpsc::channel();
    let mut b = Node::builder(&name)
        .cluster(CLUSTER)
        .secret(SECRET)
        .listen(listen)
        .membership_interval(INTERVAL)
        .on_event(move |_| {
            let _ = tx.send(());
        });
    if let Some(seed) = seed {
        b = b.seed(seed);
    } else {
        b = b.membership(true);
    }
    let node = b.start().expect("start the member");
    // Stdin closing is the signal to stop.
    let (stop_tx, stop) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1];
        let _ = std::io::Read::read(&mut std::io::stdin(), &mut buf);
        let _ = stop_tx.send(());
    });
    let mut last = String::new();
    loop {
        let view: Vec<String> = node
            .members()
            .into_iter()
            .map(|m| {
                let state = match m.state {
                    MemberState::Alive => "alive",
                    MemberState::Suspect => "suspect",
                    MemberState::Failed => "failed",
                    MemberState::Left => "left",
                    _ => "other",
                };
                let up = if node.is_connected(&m.name) {
                    "up"
                } else {
                    "down"
                };
                format!("{}:{state}:{up}", m.name)
            })
            .collect();
        let line = view.join(" ");
        if line != last {
            println!("{MARK} view {line}");
            let _ = std::io::stdout().flush();
            last = line;
        }
        if stop.try_recv().is_ok() {
            break;
        }
        // The next event, or a look every interval (a connection made or lost between two
        // events also changes the line).
        let _ = events.recv_timeout(INTERVAL);
    }
    node.shutdown(SHUTDOWN).expect("the member stops");
}
