//! A full mesh of member *processes* on loopback, every member broadcasting a burst: the
//! harness for connection-level faults that only show with many processes at once
//! (simultaneous dials and their tie-breaks, back-pressure, CPU starvation).
//!
//! ```text
//! cargo run --release --example mesh -- --members 64 --messages 2000 --size 256 --runs 10
//! taskset -c 0 cargo run --release --example mesh -- --members 16 --runs 20
//! ```
//!
//! The parent picks a free port per member, re-executes itself once per member (`--child I`,
//! with every port on the command line) and, once every child is listening, tells them all
//! to go at once. Each child then adds every other member as a peer (so every pair dials
//! each other at about the same moment), broadcasts `--messages` messages of `--size` bytes
//! with `Node::broadcast`, and waits until it has handled every message of every peer,
//! exactly once and in order, and every peer has credited all of its own. It then prints
//! one `STATS` line (connection counters, resends, duplicates, how long it went without
//! the CPU) and one `PEER` line per peer whose connection was lost, and stays up until the
//! parent tells every child to exit, so that no member leaves while others still need it.
//!
//! The parent prints one line per run and a summary: run time (from "go" to the last
//! child's report), idle timeouts (per member), protocol errors, handshake timeouts,
//! handshakes, tie-breaks, messages resent, duplicates, messages out of order, and what the
//! CPU did: the worst process's largest overshoot of a 10 ms sleep (how long it went
//! without running), the worst IO thread's total time runnable but waiting for a CPU, and
//! the CPU seconds of all IO threads, delivery pools and application threads (from
//! `/proc/self/task/*/schedstat`). The exit status is non-zero if a run lost a connection
//! to the idle timeout or did not complete.
//!
//! Options: `--members N` (default 16), `--messages M` (2000), `--size B` (256), `--runs R`
//! (1), `--deadline S` (seconds a run may take before the children are killed, 120),
//! `--logs DIR` (each child's log, `DIR/run-K/mI.log`; default `target/mesh-logs`),
//! `--watch MS` (sample `ss` every MS milliseconds and report sockets whose receive queue
//! stayed non-empty for a second or more). Child log level: `MESH_LOG` (`error`, `warn`
//! (default), `info`, `debug`, `trace`).

use std::collections::HashMap;
use std::error::Error;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cohort::{Node, PeerState};

const CLUSTER: &str = "mesh";

const USAGE: &str = "usage: mesh [--members N] [--messages M] [--size B] [--runs R] [--deadline S]
            [--logs DIR] [--watch MS]

A full mesh of member processes on loopback, every member broadcasting a burst; prints one
line per run and a summary. Exits non-zero if a run lost a connection to the idle timeout
or did not complete.

  --members N      member processes (default 16, at least 2)
  --messages M     messages each member broadcasts (default 2000)
  --size B         bytes per message, at least 8 (default 256)
  --runs R         runs, one after the other (default 1)
  --deadline S     seconds a run may take before its members are killed (default 120)
  --logs DIR       each member's log, DIR/run-K/mI.log (default target/mesh-logs)
  --watch MS       sample `ss` every MS milliseconds and report sockets whose receive
                   queue stayed non-empty for a second or more
  -h, --help       this text

Member log level: MESH_LOG=error|warn|info|debug|trace (default warn). The example runs its
members as `mesh --child I --ports P,P,... [options]`; those two flags are its own.";

/// Settings shared by the parent and its children.
#[derive(Clone, Debug)]
struct Opts {
    members: usize,
    messages: u64,
    size: usize,
    runs: usize,
    deadline: Duration,
    logs: PathBuf,
    watch: Option<Duration>,
    /// For a member process: its index and every member's port (`--child`, `--ports`).
    child: Option<(String, String)>,
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{flag} {value:?}: not a number"))
}

/// The command line; `Ok(None)` when help was asked for.
fn parse() -> Result<Option<Opts>, String> {
    let mut o = Opts {
        members: 16,
        messages: 2000,
        size: 256,
        runs: 1,
        deadline: Duration::from_secs(120),
        logs: PathBuf::from("target/mesh-logs"),
        watch: None,
        child: None,
    };
    let (mut child, mut ports) = (None, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        let known = [
            "--members",
            "--messages",
            "--size",
            "--runs",
            "--deadline",
            "--logs",
            "--watch",
            "--child",
            "--ports",
        ];
        if !known.contains(&flag.as_str()) {
            return Err(format!("unknown argument {flag:?}"));
        }
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--members" => o.members = number(&flag, &v)?,
            "--messages" => o.messages = number(&flag, &v)?,
            "--size" => o.size = number(&flag, &v)?,
            "--runs" => o.runs = number(&flag, &v)?,
            "--deadline" => o.deadline = Duration::from_secs(number(&flag, &v)?),
            "--logs" => o.logs = PathBuf::from(v),
            "--watch" => o.watch = Some(Duration::from_millis(number(&flag, &v)?)),
            "--child" => child = Some(v),
            _ => ports = Some(v),
        }
    }
    if o.members < 2 {
        return Err("--members: at least 2".into());
    }
    if o.size < 8 {
        return Err("--size: at least 8 (the message number)".into());
    }
    o.child = match (child, ports) {
        (Some(i), Some(p)) => Some((i, p)),
        (None, None) => None,
        _ => return Err("--child and --ports go together".into()),
    };
    Ok(Some(o))
}

fn member_name(i: usize) -> String {
    format!("m{i:02}")
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("mesh: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match &o.child {
        Some((i, ports)) => child(&o, i, ports),
        None => parent(&o),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("mesh: {e}");
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

// ---------------------------------------------------------------------------------------
// Child: one member.

/// Logs to stderr with wall-clock time (seconds and milliseconds), so that the logs of all
/// members line up.
struct StderrLog {
    level: log::LevelFilter,
}

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= self.level
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            eprintln!(
                "{}.{:03} {:5} {}",
                t.as_secs() % 100_000,
                t.subsec_millis(),
                r.level(),
                r.args()
            );
        }
    }
    fn flush(&self) {}
}

/// What one child saw from one sender.
#[derive(Default)]
struct Seen {
    next: u64,
    delivered: u64,
    out_of_order: u64,
}

/// The longest the process went without running, as seen by a thread that sleeps 10 ms at a
/// time: the largest overshoot, and when (milliseconds after "go").
#[derive(Default)]
struct Starvation {
    max_gap_ms: AtomicU64,
    at_ms: AtomicU64,
    over_1s: AtomicU64,
}

fn watch_starvation(s: Arc<Starvation>, go: Instant, stop: Arc<AtomicBool>) {
    let tick = Duration::from_millis(10);
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(tick);
        let now = Instant::now();
        let gap = now.saturating_duration_since(last).saturating_sub(tick);
        last = now;
        let ms = gap.as_millis() as u64;
        if ms > s.max_gap_ms.load(Ordering::Relaxed) {
            s.max_gap_ms.store(ms, Ordering::Relaxed);
            s.at_ms.store(
                now.saturating_duration_since(go).as_millis() as u64,
                Ordering::Relaxed,
            );
        }
        if gap >= Duration::from_secs(1) {
            s.over_1s.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// CPU time and time spent runnable but waiting for a CPU (`run_delay`), in milliseconds,
/// of this process's threads by role (the IO thread, the delivery pool, the application's
/// main thread, the rest), from `/proc/self/task/*/schedstat`.
#[derive(Default)]
struct Sched {
    io: (u64, u64),
    pool: (u64, u64),
    app: (u64, u64),
    other: (u64, u64),
}

fn sched_by_role() -> Sched {
    let mut s = Sched::default();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return s;
    };
    // The main thread (the application's, which broadcasts) has the process's id.
    let main_tid = std::process::id().to_string();
    for task in tasks.flatten() {
        let p = task.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        let comm = comm.trim();
        let stat = std::fs::read_to_string(p.join("schedstat")).unwrap_or_default();
        let mut f = stat
            .split_whitespace()
            .map(|v| v.parse::<u64>().unwrap_or(0) / 1_000_000);
        let (exec, wait) = (f.next().unwrap_or(0), f.next().unwrap_or(0));
        let role = if comm.ends_with("-io") {
            &mut s.io
        } else if comm.contains("-deliver-") {
            &mut s.pool
        } else if task.file_name().to_str() == Some(&main_tid) {
            &mut s.app
        } else {
            &mut s.other
        };
        role.0 += exec;
        role.1 += wait;
    }
    s
}

fn child(o: &Opts, index: &str, ports: &str) -> Result<bool, Box<dyn Error>> {
    let level = std::env::var("MESH_LOG")
        .ok()
        .and_then(|l| l.parse().ok())
        .unwrap_or(log::LevelFilter::Warn);
    log::set_logger(Box::leak(Box::new(StderrLog { level }))).map_err(|e| e.to_string())?;
    log::set_max_level(level);

    let me: usize = index.parse()?;
    let ports: Vec<u16> = ports.split(',').map(str::parse).collect::<Result<_, _>>()?;
    if ports.len() != o.members || me >= o.members {
        return Err("--ports must name one port per member".into());
    }
    let name = member_name(me);
    let seen: Arc<Mutex<HashMap<String, Seen>>> = Arc::default();
    let handled = Arc::new(AtomicU64::new(0));
    let node = {
        let seen = seen.clone();
        let handled = handled.clone();
        Node::builder(&name)
            .cluster(CLUSTER)
            .listen(("127.0.0.1", ports[me]))
            .on_message(move |d| {
                let n = d
                    .payload()
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map_or(u64::MAX, u64::from_le_bytes);
                let mut map = seen.lock().unwrap_or_else(|e| e.into_inner());
                let s = map.entry(d.from().to_owned()).or_default();
                if n != s.next {
                    s.out_of_order += 1;
                }
                s.next = n.wrapping_add(1);
                s.delivered += 1;
                handled.fetch_add(1, Ordering::Relaxed);
            })
            .start()?
    };
    let stdin = std::io::stdin();
    let mut line = String::new();
    println!("READY {me}");
    std::io::stdout().flush()?;
    stdin.lock().read_line(&mut line)?;
    if line.trim() != "GO" {
        return Ok(false);
    }
    let go = Instant::now();
    let starvation = Arc::new(Starvation::default());
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (s, stop) = (starvation.clone(), stop.clone());
        std::thread::Builder::new()
            .name("starvation".into())
            .spawn(move || watch_starvation(s, go, stop))?
    };
    for (i, port) in ports.iter().enumerate() {
        if i != me {
            node.add_peer(&member_name(i), ("127.0.0.1", *port))?;
        }
    }
    let peers = (o.members - 1) as u64;
    let mut full = 0u64;
    let mut payload = vec![0u8; o.size];
    for n in 0..o.messages {
        payload[..8].copy_from_slice(&n.to_le_bytes());
        for (peer, r) in node.broadcast(payload.clone()) {
            if r.is_err() {
                // A full window: wait for room for this one peer (never with the defaults).
                full += 1;
                node.send(&peer, payload.clone())?;
            }
        }
    }
    // Done when every peer's messages were handled and every peer credited all of ours.
    let deadline = go + o.deadline;
    let expected = peers * o.messages;
    let done = loop {
        let all_handled = handled.load(Ordering::Relaxed) >= expected;
        let all_credited = all_handled && {
            let s = node.stats();
            s.peers.len() as u64 == peers
                && s.peers
                    .iter()
                    .all(|p| p.in_flight == 0 && p.queued == 0 && p.sent >= o.messages)
        };
        if all_credited {
            break true;
        }
        if Instant::now() >= deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = go.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    let s = node.stats();
    let c = s.connections;
    let sum = |f: fn(&cohort::PeerStats) -> u64| s.peers.iter().map(f).sum::<u64>();
    let map = seen.lock().unwrap_or_else(|e| e.into_inner());
    let out_of_order: u64 = map.values().map(|s| s.out_of_order).sum();
    let short = (0..o.members)
        .filter(|&i| i != me)
        .filter(|&i| map.get(&member_name(i)).map_or(0, |s| s.delivered) != o.messages)
        .count();
    drop(map);
    let sched = sched_by_role();
    println!(
        "STATS {me} done={} ms={} idle_timeouts={} protocol_errors={} handshake_timeouts={} \
         handshakes={} tie_breaks={} refused={} dial_failures={} read_pauses={} resent={} \
         duplicates={} disconnects={} out_of_order={} short_senders={short} full={full} \
         gap_ms={} gap_at_ms={} gaps_over_1s={} io_exec_ms={} io_wait_ms={} pool_exec_ms={} \
         pool_wait_ms={} app_exec_ms={} app_wait_ms={} other_exec_ms={} open={} established={}",
        u8::from(done),
        elapsed.as_millis(),
        c.idle_timeouts,
        c.protocol_errors,
        c.handshake_timeouts,
        c.handshakes,
        c.tie_breaks,
        c.refused,
        c.dial_failures,
        c.read_pauses,
        sum(|p| p.resent),
        sum(|p| p.duplicates),
        sum(|p| p.disconnects),
        out_of_order,
        starvation.max_gap_ms.load(Ordering::Relaxed),
        starvation.at_ms.load(Ordering::Relaxed),
        starvation.over_1s.load(Ordering::Relaxed),
        sched.io.0,
        sched.io.1,
        sched.pool.0,
        sched.pool.1,
        sched.app.0,
        sched.app.1,
        sched.other.0,
        c.open,
        c.established,
    );
    for p in &s.peers {
        if p.disconnects > 0 || p.state != PeerState::Connected || !done {
            println!(
                "PEER {me} {} state={} connects={} disconnects={} resent={} duplicates={} \
                 sent={} received={} delivered={} in_flight={}",
                p.name,
                p.state,
                p.connects,
                p.disconnects,
                p.resent,
                p.duplicates,
                p.sent,
                p.received,
                p.delivered,
                p.in_flight
            );
        }
    }
    std::io::stdout().flush()?;
    // Stay up until every member is done: leaving now would look like a fault to the others.
    line.clear();
    let _ = stdin.lock().read_line(&mut line);
    let _ = node.shutdown(Duration::from_secs(5));
    Ok(done)
}

// ---------------------------------------------------------------------------------------
// Parent: runs and figures.

/// One child's `STATS` line, as key → value.
type Report = HashMap<String, u64>;

fn parse_stats(line: &str) -> Report {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| v.parse().ok().map(|v| (k.to_owned(), v)))
        .collect()
}

/// Ports that were free a moment ago (bound together, so they are distinct).
fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a: SocketAddr| a.port()))
        .collect()
}

/// What the `ss` sampler found: sockets of our children whose receive queue stayed
/// non-empty for a second or more, as (owner, local address, peer address, how long, most
/// bytes queued), longest first.
type Spans = Vec<(String, String, String, Duration, u64)>;

fn watch_queues(pids: HashMap<u32, usize>, every: Duration, stop: Arc<AtomicBool>) -> Spans {
    let mut open: HashMap<(String, String), (usize, Instant, Instant, u64)> = HashMap::new();
    let mut spans = Vec::new();
    let close = |spans: &mut Spans, k: (String, String), v: (usize, Instant, Instant, u64)| {
        let d = v.2.saturating_duration_since(v.1);
        if d >= Duration::from_secs(1) {
            spans.push((member_name(v.0), k.0, k.1, d, v.3));
        }
    };
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let out = Command::new("ss")
            .args(["-tnpH", "state", "established"])
            .output();
        let Ok(out) = out else { break };
        let text = String::from_utf8_lossy(&out.stdout);
        let mut nonempty = HashMap::new();
        for l in text.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 5 {
                continue;
            }
            let Ok(recvq) = f[0].parse::<u64>() else {
                continue;
            };
            let Some(pid) = f[4]
                .split("pid=")
                .nth(1)
                .and_then(|r| r.split(',').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let Some(&who) = pids.get(&pid) else { continue };
            if recvq > 0 {
                nonempty.insert((f[2].to_owned(), f[3].to_owned()), (who, recvq));
            }
        }
        let gone: Vec<(String, String)> = open
            .keys()
            .filter(|k| !nonempty.contains_key(*k))
            .cloned()
            .collect();
        for k in gone {
            if let Some(v) = open.remove(&k) {
                close(&mut spans, k, v);
            }
        }
        for (k, (who, q)) in nonempty {
            let e = open.entry(k).or_insert((who, now, now, 0));
            e.2 = now;
            e.3 = e.3.max(q);
        }
        std::thread::sleep(every);
    }
    for (k, v) in open {
        close(&mut spans, k, v);
    }
    spans.sort_by_key(|s| std::cmp::Reverse(s.3));
    spans
}

/// Figures of one run.
struct RunResult {
    secs: f64,
    reports: Vec<Option<Report>>,
    peers: Vec<String>,
    spans: Spans,
}

fn total(r: &RunResult, key: &str) -> u64 {
    r.reports
        .iter()
        .flatten()
        .map(|m| m.get(key).copied().unwrap_or(0))
        .sum()
}

fn worst(r: &RunResult, key: &str) -> (u64, String) {
    r.reports
        .iter()
        .enumerate()
        .filter_map(|(i, m)| m.as_ref().map(|m| (m.get(key).copied().unwrap_or(0), i)))
        .max()
        .map_or((0, "-".into()), |(v, i)| (v, member_name(i)))
}

fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

fn run_once(o: &Opts, run: usize) -> Result<RunResult, Box<dyn Error>> {
    let exe = std::env::current_exe()?;
    let ports = free_ports(o.members)?;
    let port_list = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let dir = o.logs.join(format!("run-{run}"));
    std::fs::create_dir_all(&dir)?;
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut children: Vec<Child> = Vec::new();
    let mut stdins: Vec<ChildStdin> = Vec::new();
    let mut pids = HashMap::new();
    for i in 0..o.members {
        let log = std::fs::File::create(dir.join(format!("{}.log", member_name(i))))?;
        let spawned = Command::new(&exe)
            .args([
                "--child",
                &i.to_string(),
                "--ports",
                &port_list,
                "--members",
                &o.members.to_string(),
                "--messages",
                &o.messages.to_string(),
                "--size",
                &o.size.to_string(),
                "--deadline",
                &o.deadline.as_secs().to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn();
        let mut c = match spawned {
            Ok(c) => c,
            Err(e) => {
                kill_all(&mut children);
                return Err(e.into());
            }
        };
        pids.insert(c.id(), i);
        let (Some(stdin), Some(stdout)) = (c.stdin.take(), c.stdout.take()) else {
            children.push(c);
            kill_all(&mut children);
            return Err("child without pipes".into());
        };
        stdins.push(stdin);
        children.push(c);
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((i, line)).is_err() {
                    break;
                }
            }
        });
    }
    drop(tx);
    // Everyone listening, then everyone goes at once.
    let mut ready = 0;
    let start_deadline = Instant::now() + Duration::from_secs(60);
    while ready < o.members {
        let left = start_deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((_, l)) if l.starts_with("READY") => ready += 1,
            Ok(_) => {}
            Err(_) => {
                kill_all(&mut children);
                return Err(format!("only {ready} of {} children started", o.members).into());
            }
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = o.watch.map(|every| {
        let (pids, stop) = (pids.clone(), stop.clone());
        std::thread::spawn(move || watch_queues(pids, every, stop))
    });
    let go = Instant::now();
    for s in &mut stdins {
        let _ = s.write_all(b"GO\n").and_then(|()| s.flush());
    }
    let mut reports: Vec<Option<Report>> = vec![None; o.members];
    let mut peers = Vec::new();
    let mut got = 0;
    let deadline = go + o.deadline + Duration::from_secs(10);
    while got < o.members {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, l)) if l.starts_with("STATS") => {
                reports[i] = Some(parse_stats(&l));
                got += 1;
            }
            Ok((_, l)) if l.starts_with("PEER") => peers.push(l),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let secs = go.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let spans = sampler.and_then(|h| h.join().ok()).unwrap_or_default();
    for s in &mut stdins {
        let _ = s.write_all(b"EXIT\n").and_then(|()| s.flush());
    }
    drop(stdins);
    let exit_deadline = Instant::now() + Duration::from_secs(15);
    for c in &mut children {
        loop {
            match c.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < exit_deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
            }
        }
    }
    Ok(RunResult {
        secs,
        reports,
        peers,
        spans,
    })
}

fn parent(o: &Opts) -> Result<bool, Box<dyn Error>> {
    println!(
        "mesh: {} members ({} connections), {} messages of {} B each, {} runs, {} CPUs",
        o.members,
        o.members * (o.members - 1) / 2,
        o.messages,
        o.size,
        o.runs,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut ok = true;
    let mut per_run = Vec::new();
    for run in 1..=o.runs {
        let r = run_once(o, run)?;
        let missing = r.reports.iter().filter(|m| m.is_none()).count();
        let not_done = r
            .reports
            .iter()
            .flatten()
            .filter(|m| m.get("done") != Some(&1))
            .count();
        let idle = total(&r, "idle_timeouts");
        let mut line = format!(
            "run {run:>3}: {:>6.1} s  idle_timeouts {idle:>3}  protocol_errors {}  \
             handshake_timeouts {}  handshakes {}  tie_breaks {}  resent {}  duplicates {}  \
             read_pauses {}  out_of_order {}",
            r.secs,
            total(&r, "protocol_errors"),
            total(&r, "handshake_timeouts"),
            total(&r, "handshakes"),
            total(&r, "tie_breaks"),
            total(&r, "resent"),
            total(&r, "duplicates"),
            total(&r, "read_pauses"),
            total(&r, "out_of_order"),
        );
        let (gap, gap_who) = worst(&r, "gap_ms");
        let (wait, wait_who) = worst(&r, "io_wait_ms");
        let _ = write!(
            line,
            "  max_gap {gap} ms ({gap_who})  max_io_wait {wait} ms ({wait_who})  cpu s: io {:.1} pool {:.1} app {:.1} other {:.1}",
            total(&r, "io_exec_ms") as f64 / 1000.0,
            total(&r, "pool_exec_ms") as f64 / 1000.0,
            total(&r, "app_exec_ms") as f64 / 1000.0,
            total(&r, "other_exec_ms") as f64 / 1000.0,
        );
        if missing + not_done > 0 {
            let _ = write!(line, "  INCOMPLETE: {missing} silent, {not_done} not done");
            ok = false;
        }
        println!("{line}");
        if idle > 0 {
            let who: Vec<String> = r
                .reports
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    let n = m.as_ref()?.get("idle_timeouts").copied().unwrap_or(0);
                    (n > 0).then(|| format!("{}:{n}", member_name(i)))
                })
                .collect();
            println!("          idle timeouts at {}", who.join(" "));
            println!(
                "          logs: {}",
                o.logs.join(format!("run-{run}")).display()
            );
        }
        if idle > 0 || missing + not_done > 0 {
            for p in r.peers.iter().take(12) {
                println!("          {p}");
            }
            if r.peers.len() > 12 {
                println!("          ... {} more PEER lines", r.peers.len() - 12);
            }
        }
        for (who, local, peer, d, q) in r.spans.iter().take(10) {
            println!(
                "          receive queue of {who} {local} <- {peer}: non-empty for {:.1} s (up to {q} B)",
                d.as_secs_f64()
            );
        }
        per_run.push((r.secs, idle, total(&r, "handshake_timeouts")));
    }
    let runs = per_run.len();
    let with = per_run.iter().filter(|(_, i, _)| *i > 0).count();
    let sum: u64 = per_run.iter().map(|(_, i, _)| i).sum();
    let with_hs = per_run.iter().filter(|(_, _, h)| *h > 0).count();
    let sum_hs: u64 = per_run.iter().map(|(_, _, h)| h).sum();
    let max_t = per_run.iter().map(|(t, _, _)| *t).fold(0.0, f64::max);
    let mean_t = per_run.iter().map(|(t, _, _)| t).sum::<f64>() / runs.max(1) as f64;
    println!(
        "summary: {runs} runs, {with} with idle timeouts ({sum} in all), {with_hs} with handshake \
         timeouts ({sum_hs} in all); run time mean {mean_t:.1} s, max {max_t:.1} s"
    );
    Ok(ok && with == 0)
}
