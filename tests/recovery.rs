//! Recovery over the handshake and a lifecycle without orphans (invariants 5 and 6),
//! over real TCP on 127.0.0.1:
//!
//! - three members exchange 200 000 reliable messages each way through fault-injecting
//!   proxies that cut connections every few hundred milliseconds, mid-frame included: every
//!   message is delivered exactly once and in order, the stats show reconnects and resends,
//!   and every window ends whole;
//! - a peer killed (SIGKILL, in a child process) and restarted on the same port with messages
//!   in flight: the survivor reports the old incarnation's unacknowledged messages through
//!   `on_undelivered` and `PeerStats::undelivered`, never delivers them to the new
//!   incarnation, and talks to the new one — once when the death is seen at once, once when
//!   the old connection stays half-open;
//! - the Pulsar interleaving: `remove_peer` while a reconnect is scheduled, while a TCP
//!   connect is in flight and while a handshake is in flight leaves no connection, no timer,
//!   no thread and no dial behind, and re-adding the peer connects and delivers; and so must
//!   re-adding a peer one had exchanged messages with, which the other member still knows;
//! - both members dialling each other at once, 1000 times, end with one connection each time.
//!
//! Every connection of the volume test goes through a proxy, whichever side dials: member `i`
//! reaches member `j` through its own proxy `P(i→j)`. No test sleeps to wait for an event
//! (the cutter sleeps to pace the faults it injects; the "nothing happens" checks watch for a
//! bounded time longer than the backoff they rule out).

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cohort::{Builder, Bytes, Node, PeerState, Sender};
use support::proxy::{Mode, Proxy, XorShift};
use support::*;

// ----- the volume test through cutting proxies ------------------------------------------

/// Every connection of a mesh through a proxy: `proxies[&(i, j)]` is how node `i` reaches
/// node `j`.
struct ProxiedMesh {
    nodes: Vec<Node>,
    proxies: HashMap<(usize, usize), Proxy>,
}

impl ProxiedMesh {
    /// Starts the builders, puts a proxy in front of every (dialler, target) pair and makes
    /// each node a peer of every other through its proxy.
    fn start(builders: Vec<Builder>, seed: u64, max_chunk: usize) -> ProxiedMesh {
        let nodes: Vec<Node> = builders
            .into_iter()
            .map(|b| b.start().expect("node starts"))
            .collect();
        let mut proxies = HashMap::new();
        for i in 0..nodes.len() {
            for (j, target) in nodes.iter().enumerate() {
                if i != j {
                    let p = Proxy::start(
                        &format!("{i}{j}"),
                        target.local_addr(),
                        seed ^ ((i * 16 + j) as u64).wrapping_mul(0x1000_0001),
                        max_chunk,
                    );
                    proxies.insert((i, j), p);
                }
            }
        }
        for (i, a) in nodes.iter().enumerate() {
            for (j, b) in nodes.iter().enumerate() {
                if i != j {
                    a.add_peer(b.name(), proxies[&(i, j)].addr())
                        .expect("add_peer");
                }
            }
        }
        ProxiedMesh { nodes, proxies }
    }

    /// Cuts the connections between `i` and `j` (through either proxy), in the middle of a
    /// frame if traffic comes within `grace`; returns how many were cut.
    fn cut_pair(&self, i: usize, j: usize, grace: Duration) -> usize {
        self.proxies[&(i, j)].cut_all_mid_frame(grace)
            + self.proxies[&(j, i)].cut_all_mid_frame(grace)
    }

    fn proxy_summary(&self) -> String {
        let mut v: Vec<String> = self.proxies.values().map(|p| format!("{p:?}")).collect();
        v.sort();
        v.join("\n")
    }

    fn stop_proxies(&self) {
        for p in self.proxies.values() {
            p.stop();
        }
    }
}

/// Recovery at volume (invariant 5): three members, each sending 200 000 reliable messages
/// to each of the other two, every connection through a proxy that forwards in writes of
/// random size and holds back a random tail of the stream. Connections are cut every
/// 100–400 ms (one pair at a time, every fourth time all of them) and at each tenth of the
/// deliveries (one pair in turn), so each pair is cut while traffic flows however fast the
/// run; a cut lands right after a write that left the receiver part of a frame (or, on a
/// link quiet for 50 ms, wherever it is). Every receiver sees each sender's counters
/// 0..200 000 in order with `seq()` going up by one; afterwards each peer shows more than
/// one connect, resends happened, some cuts landed mid-frame, nothing failed or was reported
/// undelivered, no protocol error was seen (a cut mid-frame is an EOF, not a malformed
/// frame), and every window is whole again.
/// A builder per name of `names` in `cluster`, redialling quickly, whose handler is the
/// order check of the same place in `checks`; `more` adds the test's own settings.
fn checked(
    names: &[&str],
    checks: &[Arc<OrderCheck>],
    cluster: &str,
    more: impl Fn(Builder) -> Builder,
) -> Vec<Builder> {
    names
        .iter()
        .zip(checks)
        .map(|(name, check)| {
            more(Node::builder(name))
                .cluster(cluster)
                .redial_quickly()
                .on_message(check.handler())
        })
        .collect()
}

#[test]
fn three_members_200k_each_way_through_cutting_proxies() {
    const COUNT: u64 = 200_000;
    const NAMES: [&str; 3] = ["cut-a", "cut-b", "cut-c"];
    const SEED: u64 = 0x00C0_FFEE_2024_0004;
    // Cuts that found a live connection, each pair gets at least.
    const MIN_CUTS: u64 = 3;
    let started = Instant::now();
    let checks = NAMES.map(|_| OrderCheck::new());
    let builders = checked(&NAMES, &checks, "t-cut", |b| b.pool_threads(2));
    let mesh = ProxiedMesh::start(builders, SEED, 512);
    let nodes = &mesh.nodes;
    wait_mesh_connected(nodes);

    let senders_done = AtomicBool::new(false);
    let pairs = [(0usize, 1usize), (0, 2), (1, 2)];
    let total = 2 * COUNT * NAMES.len() as u64;
    let progress = || checks.iter().map(|c| c.total()).sum::<u64>();
    // Cuts of each pair that found a live connection: [while traffic flowed, in all].
    let cuts_by_pair = std::thread::scope(|s| {
        let cutter = s.spawn(|| {
            let mut rng = XorShift::new(SEED);
            let mut counts = [[0u64; 2]; 3];
            let cut = |counts: &mut [[u64; 2]; 3], k: usize, flowing: bool| {
                let (i, j) = pairs[k];
                let cut = mesh.cut_pair(i, j, Duration::from_millis(50)) > 0;
                if cut {
                    counts[k][0] += u64::from(flowing);
                    counts[k][1] += 1;
                }
                cut
            };
            // Two schedules: by the clock (every 100–400 ms, one pair in turn, every fourth
            // time all of them), and by progress (at each tenth of the deliveries, one pair
            // in turn, retried until it finds the pair connected), so that however fast the
            // run, each pair is cut while traffic flows.
            let mut next_at = Instant::now() + Duration::from_millis(rng.range(100, 400));
            let (mut tick, mut tenth) = (0usize, 1u64);
            let mut senders_done_at = None;
            loop {
                let delivered = progress();
                let flowing = delivered < total;
                if senders_done_at.is_none() && senders_done.load(Ordering::SeqCst) {
                    senders_done_at = Some(Instant::now());
                }
                // Stop once everything is delivered and each pair had its cuts, or (a lost
                // message) well after the senders finished: the wait below then reports it.
                let given_up = senders_done_at.is_some_and(|t| t.elapsed() > PATIENCE);
                if (!flowing && counts.iter().all(|c| c[1] >= MIN_CUTS)) || given_up {
                    return counts;
                }
                if tenth < 10
                    && delivered >= total * tenth / 10
                    && cut(&mut counts, tenth as usize % 3, flowing)
                {
                    tenth += 1;
                }
                if Instant::now() >= next_at {
                    if tick % 4 == 3 {
                        (0..3).for_each(|k| {
                            cut(&mut counts, k, flowing);
                        });
                    } else {
                        cut(&mut counts, tick % 3, flowing);
                    }
                    tick += 1;
                    next_at = Instant::now() + Duration::from_millis(rng.range(100, 400));
                }
                // Paces the fault schedule; nothing is waited for here.
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        send_to_every_other(nodes, COUNT, 16);
        senders_done.store(true, Ordering::SeqCst);
        cutter.join().expect("cutter")
    });
    let traffic = started.elapsed();

    wait_until_or(
        PATIENCE * 2,
        || checks.iter().all(|c| c.total() >= 2 * COUNT),
        || {
            let got: Vec<u64> = checks.iter().map(|c| c.total()).collect();
            format!(
                "all deliveries (got {got:?}); stats:\n{}\n{}",
                all_stats(nodes),
                mesh.proxy_summary()
            )
        },
    );
    for (check, name) in checks.iter().zip(NAMES) {
        let others: Vec<&str> = NAMES.into_iter().filter(|n| *n != name).collect();
        check.assert_got_exactly(name, &others, COUNT);
    }
    // The cutter has stopped: the mesh comes back to one connection per pair, and the credit
    // of the last messages comes home.
    wait_mesh_connected(nodes);
    wait_windows_whole(nodes);

    let (mut resent, mut duplicates) = (0, 0);
    for node in nodes {
        let s = node.stats();
        assert_eq!(s.connections.protocol_errors, 0, "{s}");
        for p in &s.peers {
            let ctx = || format!("{} -> {}: {p:?}\n{s}", s.node, p.name);
            assert_eq!(p.accepted, COUNT, "{}", ctx());
            assert_eq!(p.sent, COUNT, "published once each: {}", ctx());
            assert_eq!(
                (p.filtered, p.failed, p.queued, p.undelivered),
                (0, 0, 0, 0),
                "{}",
                ctx()
            );
            assert_eq!(p.received, COUNT, "{}", ctx());
            assert_eq!(p.delivered, COUNT, "{}", ctx());
            assert_eq!(p.in_flight, 0, "{}", ctx());
            assert!(p.connects > 1, "reconnected: {}", ctx());
            assert!(p.disconnects >= 1, "{}", ctx());
            assert_eq!(p.max_concurrent_deliverers, 1, "{}", ctx());
            resent += p.resent;
            duplicates += p.duplicates;
        }
    }
    assert!(
        resent > 0,
        "cuts with messages in flight must cause resends:\n{}",
        all_stats(nodes)
    );
    let cuts: u64 = mesh.proxies.values().map(|p| p.cuts()).sum();
    let mid_frame: u64 = mesh.proxies.values().map(|p| p.mid_frame_cuts()).sum();
    assert!(
        cuts_by_pair.iter().all(|c| c[0] >= 2 && c[1] >= MIN_CUTS),
        "every pair cut twice while traffic flowed and {MIN_CUTS} times in all, [flowing, all]: {cuts_by_pair:?}\n{}",
        mesh.proxy_summary()
    );
    assert!(
        mid_frame > 0,
        "some cut landed inside a frame:\n{}",
        mesh.proxy_summary()
    );
    shutdown_all(nodes);
    mesh.stop_proxies();
    println!(
        "cutting proxies: {cuts} connections cut ({mid_frame} directions mid-frame), cuts per pair [while traffic flowed, in all] {cuts_by_pair:?}, \
         {resent} resent, {duplicates} duplicates dropped; traffic and cuts took {traffic:.1?}, whole test {:.1?}",
        started.elapsed()
    );
}

// ----- messages framed at send and queued whole, in one stream ---------------------------

/// How message `i` of the mixed stream is sent: most small ones are encoded by the sending
/// thread into the outbox's runs; one in seven is too large for that (queued whole, encoded
/// by the IO thread), and one in eleven has a ttl (queued whole too, since it may expire).
fn mixed(sender: &Sender, to: &str, i: u64) {
    let sent = match (i % 7, i % 11) {
        (3, _) => sender.send_timeout(to, payload(i, 6000), PATIENCE),
        (_, 5) => sender.send_with(
            to,
            payload(i, 40),
            cohort::SendOptions::new().ttl(PATIENCE * 4),
        ),
        _ => sender.send_timeout(to, payload(i, 16 + (i % 200) as usize), PATIENCE),
    };
    if let Err(e) = sent {
        panic!("{} -> {to}: send {i} failed: {e}", sender.name());
    }
}

/// A stream that mixes messages the sender encodes itself (runs of frames) with messages
/// queued whole keeps one order and one numbering through connections cut every few tens
/// of milliseconds, mid-frame: each message is delivered once, in order, with the next
/// sequence number, and every window ends whole.
#[test]
fn framed_and_whole_messages_keep_one_order_through_cuts() {
    const COUNT: u64 = 30_000;
    const NAMES: [&str; 2] = ["mix-a", "mix-b"];
    let checks = NAMES.map(|_| OrderCheck::new());
    let builders = checked(&NAMES, &checks, "t-mixed", |b| b);
    let mesh = ProxiedMesh::start(builders, 0x00C0_FFEE_2026_1206, 700);
    let nodes = &mesh.nodes;
    wait_mesh_connected(nodes);
    let done = AtomicBool::new(false);
    let cuts = std::thread::scope(|s| {
        let cutter = s.spawn(|| {
            let mut rng = XorShift::new(7);
            let mut cuts = 0;
            while !done.load(Ordering::SeqCst) {
                cuts += mesh.cut_pair(0, 1, Duration::from_millis(20));
                // Paces the fault schedule; nothing is waited for here.
                std::thread::sleep(Duration::from_millis(rng.range(20, 60)));
            }
            cuts
        });
        for (i, node) in nodes.iter().enumerate() {
            let to = NAMES[1 - i];
            s.spawn(move || {
                let sender = node.sender();
                (0..COUNT).for_each(|k| mixed(&sender, to, k));
            });
        }
        wait_until_or(
            PATIENCE * 4,
            || checks.iter().all(|c| c.total() >= COUNT),
            || format!("all deliveries; stats:\n{}", all_stats(nodes)),
        );
        done.store(true, Ordering::SeqCst);
        cutter.join().expect("cutter")
    });
    for (check, name) in checks.iter().zip(NAMES) {
        let other = NAMES.into_iter().find(|n| *n != name).expect("two names");
        check.assert_got_exactly(name, &[other], COUNT);
    }
    wait_mesh_connected(nodes);
    wait_windows_whole(nodes);
    for node in nodes {
        let s = node.stats();
        for p in &s.peers {
            assert_eq!((p.accepted, p.sent), (COUNT, COUNT), "{s}");
            assert_eq!((p.failed, p.undelivered, p.in_flight), (0, 0, 0), "{s}");
        }
    }
    let resent: u64 = nodes
        .iter()
        .flat_map(|n| n.stats().peers)
        .map(|p| p.resent)
        .sum();
    println!("mixed stream: {cuts} cuts, {resent} messages resent");
    assert!(
        cuts > 0,
        "the connection was cut:\n{}",
        mesh.proxy_summary()
    );
    assert!(resent > 0, "cuts with messages in flight cause resends");
    shutdown_all(nodes);
    mesh.stop_proxies();
}

// ----- a peer killed and restarted on the same port -------------------------------------

/// Set in a child's environment: the test function plays the victim instead of the test.
const VICTIM_ENV: &str = "COHORT_RECOVERY_VICTIM";
/// Set in a child's environment: the address the victim listens on.
const VICTIM_LISTEN_ENV: &str = "COHORT_RECOVERY_VICTIM_LISTEN";
/// Set in a child's environment: the survivor's address.
const VICTIM_SURVIVOR_ENV: &str = "COHORT_RECOVERY_VICTIM_SURVIVOR";
/// Set in a child's environment: the message counter whose handler never returns.
const VICTIM_STALL_ENV: &str = "COHORT_RECOVERY_VICTIM_STALL";
/// What a victim prints before each report on stdout (the harness may print on the same line).
const MARK: &str = "@victim ";

/// The victim, in a child process: a node named `victim` on the given address that reports
/// each message it gets on stdout (`got <counter> <seq>`) and echoes it back to the
/// survivor, tagged with its launch id. It never acknowledges on its own (no ack threshold,
/// no ack delay): an ack leaves only with credit, once the survivor's window is half used or
/// its messages have all been handled. The handler stalls for good on the message numbered
/// `VICTIM_STALL_ENV`, so what comes after it is received but never acknowledged. It runs until
/// it is killed, or until its stdin closes (the parent is gone).
fn victim_main() -> ! {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is set"));
    let listen: SocketAddr = var(VICTIM_LISTEN_ENV).parse().expect("listen address");
    let survivor: SocketAddr = var(VICTIM_SURVIVOR_ENV).parse().expect("survivor address");
    let stall: Option<u64> = std::env::var(VICTIM_STALL_ENV)
        .ok()
        .map(|s| s.parse().expect("stall counter"));
    let me: Arc<OnceLock<(Sender, u64)>> = Arc::new(OnceLock::new());
    let m = me.clone();
    let node = Node::builder("victim")
        .cluster("t-restart")
        .listen(listen)
        .pool_threads(1)
        .redial_quickly()
        .ack_threshold(u64::MAX)
        .ack_delay(Duration::from_secs(3600))
        .peer("survivor", survivor)
        .on_message(move |d| {
            let n = counter_of(d.payload()).expect("a test payload");
            println!("{MARK}got {n} {}", d.seq().unwrap_or(0));
            if Some(n) == stall {
                println!("{MARK}stalled");
                loop {
                    std::thread::park();
                }
            }
            let (sender, launch) = m.get().expect("started");
            let mut echo = launch.to_le_bytes().to_vec();
            echo.extend_from_slice(&n.to_le_bytes());
            if let Err(e) = sender.send_timeout("survivor", echo, PATIENCE) {
                println!("{MARK}echo-failed {n}: {e}");
            }
        })
        .start();
    let node = match node {
        Ok(node) => node,
        Err(e) => {
            println!("{MARK}start-failed {e}");
            std::process::exit(3);
        }
    };
    let _ = me.set((node.sender(), node.launch_id()));
    println!("{MARK}ready {:x}", node.launch_id());
    // Until killed; or until the parent is gone, which closes our stdin.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    std::process::exit(0);
}

/// What a victim printed, as it arrives.
#[derive(Default)]
struct Reports {
    lines: Mutex<(Vec<String>, bool)>,
    cond: Condvar,
}

/// A victim child process. Dropping it kills and reaps the child, so no test leaves one
/// behind, failed or not.
struct Victim {
    child: Child,
    stdin: Option<ChildStdin>,
    reports: Arc<Reports>,
    reader: Option<JoinHandle<()>>,
    launch: u64,
}

impl Victim {
    /// Starts a victim on `listen` (running test `test`) and waits for it to be ready.
    fn spawn(test: &str, listen: SocketAddr, survivor: SocketAddr, stall: Option<u64>) -> Victim {
        let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
        cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(VICTIM_ENV, "1")
            .env(VICTIM_LISTEN_ENV, listen.to_string())
            .env(VICTIM_SURVIVOR_ENV, survivor.to_string())
            .env_remove(VICTIM_STALL_ENV)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if let Some(n) = stall {
            cmd.env(VICTIM_STALL_ENV, n.to_string());
        }
        let mut child = cmd.spawn().expect("spawn the victim");
        let stdout = child.stdout.take().expect("piped stdout");
        let reports = Arc::new(Reports::default());
        let r = reports.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find(MARK) {
                    r.lines
                        .lock()
                        .unwrap()
                        .0
                        .push(line[at + MARK.len()..].to_owned());
                    r.cond.notify_all();
                }
            }
            r.lines.lock().unwrap().1 = true;
            r.cond.notify_all();
        });
        let mut v = Victim {
            stdin: child.stdin.take(),
            child,
            reports,
            reader: Some(reader),
            launch: 0,
        };
        let first = v.wait_for("the victim to start", |lines| {
            lines
                .iter()
                .find(|l| l.starts_with("ready ") || l.starts_with("start-failed "))
                .cloned()
        });
        let Some(hex) = first.strip_prefix("ready ") else {
            panic!("the victim failed to start its node: {first}");
        };
        v.launch = u64::from_str_radix(hex.trim(), 16).expect("a launch id");
        v
    }

    /// Waits (deadline-bounded) until `f` finds what it looks for in the reports so far.
    fn wait_for<T>(&self, what: &str, mut f: impl FnMut(&[String]) -> Option<T>) -> T {
        let deadline = Instant::now() + PATIENCE;
        let mut g = self.reports.lines.lock().unwrap();
        loop {
            if let Some(t) = f(&g.0) {
                return t;
            }
            let now = Instant::now();
            if g.1 || now >= deadline {
                panic!(
                    "waiting for {what}: {}; the victim reported {:?}",
                    if g.1 { "its output ended" } else { "timed out" },
                    g.0.iter().rev().take(10).collect::<Vec<_>>()
                );
            }
            g = self.reports.cond.wait_timeout(g, deadline - now).unwrap().0;
        }
    }

    /// The messages it got so far: (counter, seq).
    fn got(&self) -> Vec<(u64, u64)> {
        self.reports
            .lines
            .lock()
            .unwrap()
            .0
            .iter()
            .filter_map(|l| {
                let mut it = l.strip_prefix("got ")?.split(' ');
                Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
            })
            .collect()
    }

    /// Waits until it has got message `counter`.
    fn wait_got(&self, counter: u64) {
        let want = format!("got {counter} ");
        self.wait_for(&format!("the victim to get message {counter}"), |lines| {
            lines.iter().any(|l| l.starts_with(&want)).then_some(())
        });
    }

    /// SIGKILL, and reap it.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stdin.take();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the survivor saw: the payloads reported undelivered (by peer), and the echoes it
/// got (launch id of the echoing incarnation, counter, seq).
#[derive(Default)]
struct SurvivorLog {
    undelivered: Mutex<Vec<(String, Vec<Bytes>)>>,
    echoes: Mutex<Vec<(u64, u64, Option<u64>)>>,
}

impl SurvivorLog {
    fn undelivered_counters(&self, peer: &str) -> Vec<u64> {
        self.undelivered
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| p == peer)
            .flat_map(|(_, msgs)| msgs.iter().map(|m| counter_of(m).expect("a test payload")))
            .collect()
    }

    /// The echoes of incarnation `launch`: (counter, seq).
    fn echoes_of(&self, launch: u64) -> Vec<(u64, Option<u64>)> {
        self.echoes
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.0 == launch)
            .map(|e| (e.1, e.2))
            .collect()
    }
}

/// Asserts `echoes` are `expected` counters, in order, with seq 1, 2, 3, …
fn assert_echoes(echoes: &[(u64, Option<u64>)], expected: &[u64], who: &str) {
    let counters: Vec<u64> = echoes.iter().map(|e| e.0).collect();
    assert_eq!(counters, expected, "echoes of {who}");
    for (i, (_, seq)) in echoes.iter().enumerate() {
        assert_eq!(*seq, Some(i as u64 + 1), "echo {i} of {who}: {echoes:?}");
    }
}

/// The restart scenario (invariant 5), shared by the two tests below.
///
/// 1. The survivor sends 200 messages of 1000 bytes (several windows: acks must come back
///    for them to go), the victim gets and echoes them all, and the survivor's window comes
///    back whole — so all 200 are acknowledged.
/// 2. Message 200 stalls the victim's handler for good, and 20 small ones follow and are
///    published (`sent == accepted`): the victim receives them but can never acknowledge
///    them (no credit is consumed, no ack threshold or delay, the survivor is not blocked so
///    it sends no probe).
/// 3. 10 more are sent and the victim is killed (SIGKILL) at once: these are in flight,
///    queued or published to a dead connection. Once the survivor has seen the death (or,
///    half-open, right away), 10 more are sent: queued for the next incarnation (half-open:
///    published to the dead one).
/// 4. A new victim starts on the same port (a new launch id). The survivor must report,
///    through `on_undelivered` and `PeerStats::undelivered`, exactly a contiguous run of
///    messages starting at 200 and covering at least the 21 it knows were published and
///    unacknowledged (and, when the death was seen, none sent after it); the new incarnation
///    must get exactly the rest (queued messages never published to the old incarnation),
///    then 100 new ones, in order, with seq from 1, and none of the old incarnation's
///    unacknowledged messages.
///    Its echoes arrive at the survivor, tagged with its launch id.
///
/// With `half_open`, the survivor reaches the victim through a proxy that does not pass on
/// the victim's death: the survivor's old connection stays open, and the new incarnation's
/// handshake (on a connection it dials itself) must replace it instead of being refused.
fn restart_scenario(test: &str, half_open: bool) {
    if std::env::var_os(VICTIM_ENV).is_some() {
        victim_main();
    }
    const PHASE1: u64 = 200;
    const STALL: u64 = PHASE1;
    const PHASE2_END: u64 = STALL + 21;
    const PHASE3_END: u64 = PHASE2_END + 10;
    const PHASE3B_END: u64 = PHASE3_END + 10;
    const PHASE4_END: u64 = PHASE3B_END + 100;
    const WINDOW: u64 = 64 * 1024;
    let log = Arc::new(SurvivorLog::default());
    let (l1, l2) = (log.clone(), log.clone());
    let survivor = Node::builder("survivor")
        .cluster("t-restart")
        .pool_threads(1)
        .window_bytes(WINDOW)
        .redial_quickly()
        .on_undelivered(move |peer, msgs| {
            l1.undelivered.lock().unwrap().push((peer.to_owned(), msgs));
        })
        .on_message(move |d| {
            let p = d.payload();
            let launch = u64::from_le_bytes(p[..8].try_into().expect("an echo"));
            let n = u64::from_le_bytes(p[8..16].try_into().expect("an echo"));
            l2.echoes.lock().unwrap().push((launch, n, d.seq()));
        })
        .start()
        .expect("survivor starts");
    // Both incarnations of the victim listen here; held for the whole scenario, so that the
    // port stays the victim's while it is dead.
    let held = HeldAddr::new();
    let victim_addr = held.addr();
    let mut first = Victim::spawn(test, victim_addr, survivor.local_addr(), Some(STALL));
    let proxy = half_open.then(|| {
        let p = Proxy::start("rs", victim_addr, 0x5EED_0003, 256);
        p.set_close_through(false);
        p
    });
    let dial = proxy.as_ref().map_or(victim_addr, |p| p.addr());
    survivor.add_peer("victim", dial).expect("add_peer");
    wait_until_or(
        PATIENCE,
        || is_connected(&survivor, "victim"),
        || format!("the survivor to connect; stats:\n{}", survivor.stats()),
    );
    if let Some(p) = &proxy {
        // The survivor's dial (through the proxy) is the connection kept: the tie-break keeps
        // the one dialled by the smaller name, "survivor".
        wait_until_or(
            PATIENCE,
            || p.live() == 1 && survivor.stats().connections.open == 1,
            || {
                format!(
                    "one connection, through the proxy: {p:?}\n{}",
                    survivor.stats()
                )
            },
        );
    }
    let tx = survivor.sender();

    // 1. Acknowledged.
    for i in 0..PHASE1 {
        send_patiently(&tx, "victim", payload(i, 1000));
    }
    first.wait_got(PHASE1 - 1);
    // The window whole: all acked.
    wait_window_whole(&survivor, "victim");
    wait_until("the echoes of the first incarnation", PATIENCE, || {
        log.echoes_of(first.launch).len() == PHASE1 as usize
    });

    // 2. Received, never acknowledged.
    send_patiently(&tx, "victim", payload(STALL, 8));
    first.wait_for("the victim to stall", |l| {
        l.iter().any(|l| l == "stalled").then_some(())
    });
    for i in STALL + 1..PHASE2_END {
        send_patiently(&tx, "victim", payload(i, 8));
    }
    wait_until_or(
        PATIENCE,
        || {
            let p = peer_stats(&survivor, "victim");
            p.sent == PHASE2_END && p.queued == 0
        },
        || format!("phase 2 published; stats:\n{}", survivor.stats()),
    );

    // 3. In flight when the victim dies.
    for i in PHASE2_END..PHASE3_END {
        send_patiently(&tx, "victim", payload(i, 8));
    }
    first.kill();
    let got_first = first.got();
    if half_open {
        // Nothing tells the survivor: its connection to the dead incarnation is still the
        // registered one when the new incarnation arrives.
        let p = peer_stats(&survivor, "victim");
        assert_eq!(
            (p.state, p.disconnects),
            (PeerState::Connected, 0),
            "half-open: {p:?}"
        );
    } else {
        wait_until_or(
            PATIENCE,
            || peer_stats(&survivor, "victim").disconnects == 1,
            || {
                format!(
                    "the survivor to see the death; stats:\n{}",
                    survivor.stats()
                )
            },
        );
    }
    // 3b. Sent while the victim is dead: queued (for the new incarnation), or, half-open,
    // published to the dead one.
    for i in PHASE3_END..PHASE3B_END {
        send_patiently(&tx, "victim", payload(i, 8));
    }
    let before = peer_stats(&survivor, "victim");
    assert_eq!(before.undelivered, 0, "{before:?}");

    // 4. The new incarnation.
    let second = Victim::spawn(test, victim_addr, survivor.local_addr(), None);
    assert_ne!(second.launch, first.launch);
    wait_until_or(
        PATIENCE,
        || !log.undelivered_counters("victim").is_empty() && is_connected(&survivor, "victim"),
        || {
            format!(
                "the old incarnation's messages reported undelivered and a connection to the new one; stats:\n{}",
                survivor.stats()
            )
        },
    );
    for i in PHASE3B_END..PHASE4_END {
        send_patiently(&tx, "victim", payload(i, 32));
    }
    second.wait_got(PHASE4_END - 1);

    let undelivered = log.undelivered_counters("victim");
    let got_second = second.got();
    for v in [&first, &second] {
        let lines = v.reports.lines.lock().unwrap();
        let failed: Vec<&String> = lines.0.iter().filter(|l| l.contains("failed")).collect();
        assert!(failed.is_empty(), "the victim reported {failed:?}");
    }
    let ctx = || {
        format!(
            "undelivered {undelivered:?}\nnew incarnation got {got_second:?}\nstats:\n{}",
            survivor.stats()
        )
    };
    // The old incarnation got 0..=STALL, in order, with seq 1, 2, 3, …
    let expected_first: Vec<(u64, u64)> = (0..=STALL).map(|i| (i, i + 1)).collect();
    assert_eq!(got_first, expected_first, "what the first incarnation got");
    // Reported: a contiguous run from the stall message, covering what was published.
    assert_eq!(undelivered.first(), Some(&STALL), "{}", ctx());
    assert!(
        undelivered.windows(2).all(|w| w[1] == w[0] + 1),
        "in order, none missing: {}",
        ctx()
    );
    let end = STALL + undelivered.len() as u64;
    let most = if half_open { PHASE3B_END } else { PHASE3_END };
    assert!(
        (PHASE2_END..=most).contains(&end),
        "everything published to the old incarnation and nothing else: {}",
        ctx()
    );
    // The new incarnation got the rest, in order, seq from 1; none of the undelivered.
    let expected_second: Vec<u64> = (end..PHASE4_END).collect();
    let counters: Vec<u64> = got_second.iter().map(|g| g.0).collect();
    assert_eq!(counters, expected_second, "{}", ctx());
    for (i, (_, seq)) in got_second.iter().enumerate() {
        assert_eq!(
            *seq,
            i as u64 + 1,
            "seq restarts for a new incarnation: {}",
            ctx()
        );
    }
    // The callback and the counter agree; every message is accounted for once.
    wait_until("the new incarnation's echoes", PATIENCE, || {
        log.echoes_of(second.launch).len() == expected_second.len()
    });
    assert_echoes(
        &log.echoes_of(first.launch),
        &(0..PHASE1).collect::<Vec<_>>(),
        "the first incarnation",
    );
    assert_echoes(
        &log.echoes_of(second.launch),
        &expected_second,
        "the second incarnation",
    );
    wait_window_whole(&survivor, "victim");
    let p = peer_stats(&survivor, "victim");
    assert_eq!(p.undelivered, undelivered.len() as u64, "{}", ctx());
    assert_eq!(p.accepted, PHASE4_END, "{}", ctx());
    assert_eq!(p.sent, PHASE4_END, "published once each: {}", ctx());
    assert_eq!((p.failed, p.queued, p.filtered), (0, 0, 0), "{}", ctx());
    assert!(p.connects >= 2, "{}", ctx());
    let s = survivor.stats();
    assert_eq!(s.connections.protocol_errors, 0, "{s}");
    assert_eq!(
        (s.connections.open, s.connections.established),
        (1, 1),
        "{s}"
    );
    println!(
        "restart ({}): {} undelivered (of {} sent before the kill, {} more after it), {} delivered to the new incarnation, {} connects, {} tie-breaks",
        if half_open { "half-open" } else { "seen at once" },
        undelivered.len(),
        PHASE3_END,
        PHASE3B_END - PHASE3_END,
        got_second.len(),
        p.connects,
        s.connections.tie_breaks
    );
    drop(second);
    survivor.shutdown(SHUTDOWN).expect("shutdown");
    if let Some(p) = proxy {
        p.stop();
    }
}

/// A peer killed with messages in flight and restarted on the same port; the survivor sees
/// the death at once (the kernel closes the dead process's connection).
#[test]
fn restarted_peer_gets_old_unacked_reported_undelivered() {
    restart_scenario(
        "restarted_peer_gets_old_unacked_reported_undelivered",
        false,
    );
}

/// The same, with the survivor's connection to the dead incarnation left half-open (a proxy
/// that does not pass the close on): the new incarnation's handshake replaces it.
#[test]
fn restarted_peer_replaces_a_half_open_connection() {
    restart_scenario("restarted_peer_replaces_a_half_open_connection", true);
}

// ----- the Pulsar interleaving: remove_peer against a scheduled or in-flight connect -------

/// Reconnect backoff of the node that removes its peer: long, so that the removal lands in
/// the middle of it, and the "nothing dials again" watch can outlast it.
const LONG_BACKOFF: Duration = Duration::from_millis(1500);

/// The peer: it knows nobody and admits whoever dials it, so every connection between the
/// two is one the remover dialled.
fn removed(name: &str, check: &Arc<OrderCheck>) -> Node {
    Node::builder(name)
        .cluster("t-pulsar")
        .pool_threads(1)
        .allow_unknown_members(true)
        .on_message(check.handler())
        .start()
        .expect("start")
}

/// The node that removes its peer, with a [`LONG_BACKOFF`].
fn remover(name: &str, check: &Arc<OrderCheck>) -> cohort::Builder {
    Node::builder(name)
        .cluster("t-pulsar")
        .pool_threads(1)
        .reconnect_backoff(LONG_BACKOFF, LONG_BACKOFF)
        .on_message(check.handler())
}

/// After `node.remove_peer(peer)`: the peer is gone from the stats, no connection is open
/// or established, no timer is pending but the housekeeping tick, and the node runs exactly
/// its own threads (the IO thread and one pool thread).
fn assert_removed_cleanly(node: &Node, peer: &str) {
    let s = node.stats();
    assert!(s.peer(peer).is_none(), "{peer} is gone:\n{s}");
    assert!(node.peers().is_empty(), "{:?}", node.peers());
    wait_until_or(
        PATIENCE,
        || {
            let c = node.stats().connections;
            c.open == 0 && c.established == 0 && c.timers == 1
        },
        || format!("no connection and no timer left; stats:\n{}", node.stats()),
    );
    let expected = vec![
        format!("{}-deliver-0", node.name()),
        format!("{}-io", node.name()),
    ];
    wait_until_or(
        PATIENCE,
        || threads_named(&format!("{}-", node.name())) == expected,
        || {
            format!(
                "only the node's own threads: {:?}",
                threads_named(&format!("{}-", node.name()))
            )
        },
    );
}

/// Re-adds `peer` at `addr` and checks a message goes through each way over one connection.
fn assert_re_add_works(a: &Node, b: &Node, addr: SocketAddr, checks: [&OrderCheck; 2]) {
    a.add_peer(b.name(), addr).expect("re-add the peer");
    wait_until_or(
        PATIENCE,
        || {
            is_connected(a, b.name())
                && is_connected(b, a.name())
                && a.stats().connections.established == 1
        },
        || {
            format!(
                "re-added peer connected; stats:\n{}\n\n{}",
                a.stats(),
                b.stats()
            )
        },
    );
    let [at_a, at_b] = checks;
    let (na, nb) = (at_a.total(), at_b.total());
    a.send(b.name(), payload(nb, 8)).expect("send");
    b.send(a.name(), payload(na, 8)).expect("send");
    wait_until_or(
        PATIENCE,
        || at_a.total() == na + 1 && at_b.total() == nb + 1,
        || {
            format!(
                "a message each way after the re-add; stats:\n{}\n\n{}",
                a.stats(),
                b.stats()
            )
        },
    );
    at_a.assert_ok();
    at_b.assert_ok();
}

/// `remove_peer` while a reconnect is scheduled (invariant 6, the Pulsar interleaving): the
/// peer's first connection fails (the proxy in front of it accepts and closes), so a
/// reconnect is scheduled `LONG_BACKOFF` out; the peer is removed during that backoff. No
/// connection, timer or thread is left, nothing dials the address again for longer than the
/// backoff, and re-adding the peer connects and delivers.
#[test]
fn remove_peer_during_reconnect_backoff_leaves_nothing_behind() {
    let (ca, cb) = (OrderCheck::new(), OrderCheck::new());
    let b = removed("pbk-b", &cb);
    let a = remover("pbk-a", &ca).start().expect("start");
    let proxy = Proxy::start("pbk", b.local_addr(), 1, 4096);
    proxy.set_mode(Mode::Refuse);
    a.add_peer("pbk-b", proxy.addr()).expect("add_peer");
    wait_until_or(
        PATIENCE,
        || {
            let s = a.stats();
            proxy.accepted() == 1
                && s.peer("pbk-b")
                    .is_some_and(|p| p.state == PeerState::Backoff)
                && s.connections.open == 0
        },
        || {
            format!(
                "the first dial refused, a reconnect scheduled; stats:\n{}",
                a.stats()
            )
        },
    );
    a.remove_peer("pbk-b").expect("remove_peer");
    // The reconnect was at least LONG_BACKOFF / 2 away: it had not fired yet.
    assert_eq!(proxy.accepted(), 1, "removed during the backoff");
    assert_removed_cleanly(&a, "pbk-b");

    proxy.set_mode(Mode::Forward);
    assert_re_add_works(&a, &b, proxy.addr(), [&ca, &cb]);
    shutdown_all(&[a, b]);
    proxy.stop();
    wait_threads_gone("pbk-");
}

/// `remove_peer` while a handshake is in flight: the proxy in front of the peer accepts the
/// dial and never answers, so the node sits in `Handshaking`; the peer is removed. The node
/// closes that connection (the proxy sees it end), no connection, timer or thread is left,
/// nothing dials again, and re-adding the peer connects and delivers.
#[test]
fn remove_peer_during_handshake_leaves_nothing_behind() {
    let (ca, cb) = (OrderCheck::new(), OrderCheck::new());
    let b = removed("phs-b", &cb);
    let a = remover("phs-a", &ca)
        .handshake_timeout(Duration::from_secs(60))
        .start()
        .expect("start");
    let proxy = Proxy::start("phs", b.local_addr(), 2, 4096);
    proxy.set_mode(Mode::Hold);
    a.add_peer("phs-b", proxy.addr()).expect("add_peer");
    wait_until_or(
        PATIENCE,
        || {
            let s = a.stats();
            proxy.live() == 1
                && s.peer("phs-b")
                    .is_some_and(|p| p.state == PeerState::Handshaking)
                && s.connections.open == 1
        },
        || format!("a handshake in flight; stats:\n{}\n{proxy:?}", a.stats()),
    );
    a.remove_peer("phs-b").expect("remove_peer");
    wait_until_or(
        PATIENCE,
        || proxy.live() == 0,
        || format!("the held connection closed by the node: {proxy:?}"),
    );
    assert_eq!(proxy.accepted(), 1);
    assert_removed_cleanly(&a, "phs-b");

    proxy.set_mode(Mode::Forward);
    assert_re_add_works(&a, &b, proxy.addr(), [&ca, &cb]);
    shutdown_all(&[a, b]);
    proxy.stop();
    wait_threads_gone("phs-");
}

/// Sockets of this host (IPv4) connected, or connecting, to `port` on 127.0.0.1, from
/// `/proc/net/tcp`: (local port, TCP state) of the open sockets connected or connecting to
/// `port`. State 2 is SYN_SENT. A socket no descriptor holds any more (inode 0: one in
/// TIME_WAIT, left by an earlier test whose listener had the same port) is not open.
fn sockets_to(port: u16) -> Vec<(u16, u8)> {
    let text = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let remote = format!("0100007F:{port:04X}");
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 10 || f[2] != remote || f[9] == "0" {
                return None;
            }
            let local = u16::from_str_radix(f[1].rsplit(':').next()?, 16).ok()?;
            Some((local, u8::from_str_radix(f[3], 16).ok()?))
        })
        .collect()
}

/// `/proc/net/tcp`: how many established connections wait in the accept queue of the
/// listener on `port` (a listening socket reports its accept backlog as `rx_queue`).
fn accept_queue(port: u16) -> u32 {
    let text = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let local = format!("0100007F:{port:04X}");
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // State 0A is LISTEN; field 4 is `tx_queue:rx_queue` in hex.
            if f.len() < 5 || f[1] != local || f[3] != "0A" {
                return None;
            }
            u32::from_str_radix(f[4].split(':').nth(1)?, 16).ok()
        })
        .sum()
}

/// `remove_peer` while the TCP connect itself is in flight: the peer's address is a
/// listener whose accept queue is full (backlog 0, one connection queued and never
/// accepted), so the kernel drops the node's SYN and its connect stays in SYN_SENT (seen in
/// `/proc/net/tcp`); the peer is removed. The node's socket is gone (no SYN_SENT left), no
/// connection, timer or thread is left, and once the queue is drained nothing connects for
/// longer than a SYN retransmission and the backoff — a socket left behind would complete
/// its connect then. Re-adding the peer (at the real peer's address) connects and delivers.
#[test]
fn remove_peer_during_tcp_connect_leaves_nothing_behind() {
    use socket2::{Domain, Socket, Type};
    let (ca, cb) = (OrderCheck::new(), OrderCheck::new());
    let b = removed("psy-b", &cb);
    let a = remover("psy-a", &ca).start().expect("start");
    let sock = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    sock.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind");
    sock.listen(0).expect("listen");
    let listener: TcpListener = sock.into();
    let addr = listener.local_addr().expect("addr");
    // Fill the accept queue: with backlog 0, one queued connection makes it full.
    let filler = TcpStream::connect(addr).expect("filler connects");
    let filler_port = filler.local_addr().expect("filler addr").port();
    // The filler's connect returns when its side is established; the listener counts it a
    // moment later, when it takes the final ACK. A SYN that came in between would be
    // answered, so the node dials only once the queue is seen full.
    wait_until_or(
        PATIENCE,
        || accept_queue(addr.port()) >= 1,
        || "the filler queued at the listener".to_string(),
    );
    let node_sockets = || -> Vec<(u16, u8)> {
        sockets_to(addr.port())
            .into_iter()
            .filter(|s| s.0 != filler_port)
            .collect()
    };

    a.add_peer("psy-b", addr).expect("add_peer");
    wait_until_or(
        PATIENCE,
        || node_sockets().iter().any(|s| s.1 == 2),
        || {
            format!(
                "the node's connect in SYN_SENT: {:?}",
                sockets_to(addr.port())
            )
        },
    );
    let p = peer_stats(&a, "psy-b");
    assert_eq!(p.state, PeerState::Connecting, "{p:?}");
    a.remove_peer("psy-b").expect("remove_peer");
    wait_until_or(
        PATIENCE,
        || node_sockets().is_empty(),
        || format!("the node's socket closed: {:?}", node_sockets()),
    );
    assert_removed_cleanly(&a, "psy-b");
    // Drain the queue: a SYN still being retried would now be answered.
    listener.set_nonblocking(true).expect("nonblocking");
    // The node's socket is closed (above), so no retransmitted SYN of its can complete:
    // whatever the queue holds is the filler's. (That no timer dials the removed peer again
    // is proved in simulated time: `proto::sim::a_removed_peer_is_never_dialled_again`.)
    let mut accepted = Vec::new();
    let mut strangers = 0u64;
    while let Ok((s, from)) = listener.accept() {
        if from.port() != filler_port {
            strangers += 1;
        }
        accepted.push(s);
    }
    assert_eq!(strangers, 0, "the removed peer's address was dialled again");
    assert!(node_sockets().is_empty(), "{:?}", node_sockets());
    drop((accepted, filler, listener));

    assert_re_add_works(&a, &b, b.local_addr(), [&ca, &cb]);
    shutdown_all(&[a, b]);
    wait_threads_gone("psy-");
}

/// Removing a peer one has talked to, and adding it again, must connect again
/// (`remove_peer`'s doc: "It can be added again later as a new peer"), while the other
/// member, which was not told to forget anything, keeps its peer. Here the two exchanged 100
/// messages each way first, all acknowledged, so the other member's recovery descriptor for
/// this incarnation holds sent = acked = received = 100; the remover's new peer entry starts
/// from zero.
#[test]
fn re_added_peer_with_history_connects_and_delivers() {
    let (ca, cb) = (OrderCheck::new(), OrderCheck::new());
    let builder = |name: &str, check: &Arc<OrderCheck>| {
        Node::builder(name)
            .cluster("t-readd")
            .pool_threads(1)
            .redial_quickly()
            .on_message(check.handler())
            .start()
            .expect("start")
    };
    let a = builder("hist-a", &ca);
    let b = builder("hist-b", &cb);
    a.add_peer("hist-b", b.local_addr()).expect("add_peer");
    b.add_peer("hist-a", a.local_addr()).expect("add_peer");
    wait_until("connected", PATIENCE, || {
        is_connected(&a, "hist-b") && is_connected(&b, "hist-a")
    });
    for i in 0..100 {
        send_patiently(&a.sender(), "hist-b", payload(i, 16));
        send_patiently(&b.sender(), "hist-a", payload(i, 16));
    }
    wait_until("the first 100 each way", PATIENCE, || {
        ca.total() == 100 && cb.total() == 100
    });
    // Everything acknowledged both ways (the credit came back with the acks).
    wait_until("both windows whole", PATIENCE, || {
        let (pa, pb) = (peer_stats(&a, "hist-b"), peer_stats(&b, "hist-a"));
        pa.available == pa.window && pb.available == pb.window
    });
    a.remove_peer("hist-b").expect("remove_peer");
    a.add_peer("hist-b", b.local_addr())
        .expect("add the peer again");
    let check = |c: &OrderCheck| c.total();
    wait_until_or(
        PATIENCE,
        || {
            is_connected(&a, "hist-b")
                && is_connected(&b, "hist-a")
                && a.stats().connections.established == 1
                && b.stats().connections.established == 1
        },
        || {
            format!(
                "the re-added peer connected ({} / {} delivered); stats:\n{}\n\n{}",
                check(&ca),
                check(&cb),
                a.stats(),
                b.stats()
            )
        },
    );
    // The remover's new peer entry starts a new sequence; the other side continues its own.
    a.send("hist-b", payload(0, 16)).expect("send");
    b.send("hist-a", payload(100, 16)).expect("send");
    wait_until_or(
        PATIENCE,
        || ca.total() == 101 && cb.total() == 101,
        || {
            format!(
                "a message each way after the re-add; stats:\n{}\n\n{}",
                a.stats(),
                b.stats()
            )
        },
    );
    shutdown_all(&[a, b]);
}

// ----- simultaneous dials --------------------------------------------------------------

/// Both members dialling each other at once end with exactly one connection, every time
/// (invariant 6, the deterministic tie-break), over 1000 rounds. The same two nodes are used
/// throughout: each round both `add_peer` the other, released together by a barrier, so
/// both dial at once; both end `Connected` over one open, established connection that both
/// kept (one handshake each, none lost), a message goes each way over it (seq 1 of a fresh
/// peer entry); then both remove the other and wait until no connection is left, which
/// makes the next round start from nothing.
#[test]
fn simultaneous_dial_1000_rounds_keeps_exactly_one_connection() {
    const ROUNDS: u64 = 1000;
    let started = Instant::now();
    // What each node got this round: (from, counter, seq).
    type Got = Arc<Mutex<Vec<(String, u64, Option<u64>)>>>;
    let got: [Got; 2] = Default::default();
    let nodes: Vec<Node> = ["sd-a", "sd-b"]
        .iter()
        .zip(&got)
        .map(|(name, got)| {
            let got = got.clone();
            Node::builder(name)
                .cluster("t-tie1000")
                .pool_threads(1)
                .redial_quickly()
                .on_message(move |d| {
                    let n = counter_of(d.payload()).expect("a test payload");
                    got.lock().unwrap().push((d.from().to_owned(), n, d.seq()));
                })
                .start()
                .expect("start")
        })
        .collect();
    let mut tie_break_rounds = 0u64;
    let mut last_tie_breaks = 0u64;
    for round in 0..ROUNDS {
        introduce_at_once(&nodes);
        let one_connection = |n: &Node, peer: &str| {
            let s = n.stats();
            s.peer(peer)
                .is_some_and(|p| p.state == PeerState::Connected)
                && s.connections.established == 1
                && s.connections.open == 1
        };
        wait_until_or(
            PATIENCE,
            || one_connection(&nodes[0], "sd-b") && one_connection(&nodes[1], "sd-a"),
            || {
                format!(
                    "round {round}: one connection; stats:\n{}",
                    all_stats(&nodes)
                )
            },
        );
        for (i, n) in nodes.iter().enumerate() {
            n.send(nodes[1 - i].name(), payload(round, 8))
                .expect("send");
        }
        wait_until_or(
            PATIENCE,
            || got.iter().all(|g| !g.lock().unwrap().is_empty()),
            || {
                format!(
                    "round {round}: one message each way; stats:\n{}",
                    all_stats(&nodes)
                )
            },
        );
        for (i, n) in nodes.iter().enumerate() {
            let other = nodes[1 - i].name();
            let g = std::mem::take(&mut *got[i].lock().unwrap());
            assert_eq!(
                g,
                vec![(other.to_owned(), round, Some(1))],
                "round {round}: what {} got",
                n.name()
            );
            let s = n.stats();
            assert_eq!(
                (s.connections.open, s.connections.established),
                (1, 1),
                "round {round}:\n{s}"
            );
            let p = s.peer(other).expect("peer");
            assert_eq!(p.state, PeerState::Connected, "round {round}:\n{s}");
            // Both sides kept the same connection: it never had to be re-established.
            assert_eq!(p.connects, 1, "round {round}: one handshake per side:\n{s}");
            assert_eq!(p.disconnects, 0, "round {round}: no connection lost:\n{s}");
            assert_eq!(s.connections.protocol_errors, 0, "round {round}:\n{s}");
        }
        let tie_breaks: u64 = nodes.iter().map(|n| n.stats().connections.tie_breaks).sum();
        if tie_breaks > last_tie_breaks {
            tie_break_rounds += 1;
        }
        last_tie_breaks = tie_breaks;
        nodes[0].remove_peer("sd-b").expect("remove_peer");
        nodes[1].remove_peer("sd-a").expect("remove_peer");
        wait_until_or(
            PATIENCE,
            || nodes.iter().all(|n| n.stats().connections.open == 0),
            || {
                format!(
                    "round {round}: no connection left; stats:\n{}",
                    all_stats(&nodes)
                )
            },
        );
    }
    shutdown_all(&nodes);
    println!(
        "{ROUNDS} rounds of simultaneous dials: both dials met in {tie_break_rounds} rounds ({last_tie_breaks} tie-breaks), {:.1?}",
        started.elapsed()
    );
}
