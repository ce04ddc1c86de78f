//! Membership through seeds: members that know no peer list, each given one seed (the
//! address of the member started before it), find each other and print the view
//! converging; then one member leaves, and the others see it. Or, with `--name`, one
//! member of a cluster across terminals or machines (stop one with Ctrl-C, or `kill -9`
//! it, and watch the others suspect it and declare it failed).
//!
//! `cargo run --example discovery [-- --members N]`
//! `cargo run --example discovery -- --name a --listen 127.0.0.1:7000`
//! `cargo run --example discovery -- --name b --listen 127.0.0.1:7001 --seed 127.0.0.1:7000`

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cohort::{Event, MemberState, Node};

const USAGE: &str = "usage: discovery [--members N] [--interval-ms MS]
       discovery --name NAME --listen ADDR [--seed ADDR]... [--interval-ms MS]

Without --name: N members on loopback (default 6), each given only the address of the one
started before it, print the view until every member holds every other alive; then the
last one leaves (a clean shutdown), and the others print what they see.

With --name: one member listening at ADDR, joining through each --seed (none: the first
member), printing every change of its view until interrupted.

  --members N       members in one process (default 6)
  --name NAME       run one member under this name
  --listen ADDR     where it listens (TCP and the membership's UDP)
  --seed ADDR       a member's address to join through (repeatable)
  --interval-ms MS  the membership probe interval (default 200)
  -h, --help        this text";

const SECRET: &[u8] = b"discovery example";

struct Args {
    members: usize,
    name: Option<String>,
    listen: Option<SocketAddr>,
    seeds: Vec<SocketAddr>,
    interval: Duration,
}

fn parse() -> Result<Option<Args>, String> {
    let mut a = Args {
        members: 6,
        name: None,
        listen: None,
        seeds: Vec::new(),
        interval: Duration::from_millis(200),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |what: &str| it.next().ok_or(format!("{what} needs a value"));
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--members" => {
                let v = value("--members")?;
                a.members = v.parse().map_err(|e| format!("--members {v:?}: {e}"))?;
                if a.members < 2 {
                    return Err("--members must be at least 2".into());
                }
            }
            "--name" => a.name = Some(value("--name")?),
            "--listen" => {
                let v = value("--listen")?;
                a.listen = Some(v.parse().map_err(|e| format!("--listen {v:?}: {e}"))?);
            }
            "--seed" => {
                let v = value("--seed")?;
                a.seeds
                    .push(v.parse().map_err(|e| format!("--seed {v:?}: {e}"))?);
            }
            "--interval-ms" => {
                let v = value("--interval-ms")?;
                let ms: u64 = v.parse().map_err(|e| format!("--interval-ms {v:?}: {e}"))?;
                a.interval = Duration::from_millis(ms);
            }
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    Ok(Some(a))
}

fn main() -> ExitCode {
    match parse() {
        Ok(None) => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Ok(Some(args)) => {
            let run = if args.name.is_some() {
                one_member(&args)
            } else {
                in_one_process(&args)
            };
            match run {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("discovery: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// One line per member: its view, `name(state)` for every member but alive ones.
fn views(nodes: &[Node]) -> String {
    nodes
        .iter()
        .map(|n| {
            let view: Vec<String> = n
                .members()
                .iter()
                .map(|m| match m.state {
                    MemberState::Alive => m.name.clone(),
                    s => format!("{}({s})", m.name),
                })
                .collect();
            format!("  {:>4}: {}", n.name(), view.join(" "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn alive(n: &Node) -> usize {
    n.members()
        .iter()
        .filter(|m| m.state == MemberState::Alive)
        .count()
}

fn in_one_process(args: &Args) -> Result<(), Box<dyn Error>> {
    let start = Instant::now();
    let mut nodes: Vec<Node> = Vec::new();
    for i in 0..args.members {
        let mut b = Node::builder(&format!("m{i}"))
            .secret(SECRET)
            .listen("127.0.0.1:0")
            .membership(true)
            .membership_interval(args.interval);
        if let Some(prev) = nodes.last() {
            b = b.seed(prev.local_addr());
        }
        nodes.push(b.start()?);
    }
    println!(
        "{} members started, each given only the address of the one before it",
        nodes.len()
    );
    let everyone = nodes.len();
    let converged = wait(
        || nodes.iter().all(|n| alive(n) == everyone),
        Duration::from_secs(60),
        || println!("{:>6.2?}\n{}", start.elapsed(), views(&nodes)),
    );
    if !converged {
        return Err("the view did not converge within 60 s".into());
    }
    println!(
        "converged after {:.2?}: every member holds {everyone} alive\n{}",
        start.elapsed(),
        views(&nodes)
    );
    let last = nodes.pop().ok_or("no member")?;
    let name = last.name().to_string();
    last.shutdown(Duration::from_secs(5))?;
    let t = Instant::now();
    let seen = wait(
        || {
            nodes.iter().all(|n| {
                n.members()
                    .iter()
                    .any(|m| m.name == name && m.state == MemberState::Left)
            })
        },
        Duration::from_secs(30),
        || {},
    );
    println!(
        "'{name}' shut down: {} after {:.2?}\n{}",
        if seen {
            "every member saw it leave"
        } else {
            "not seen leaving within 30 s"
        },
        t.elapsed(),
        views(&nodes)
    );
    Ok(())
}

/// Polls `done` every 100 ms for at most `limit`, calling `tick` every second.
fn wait(mut done: impl FnMut() -> bool, limit: Duration, mut tick: impl FnMut()) -> bool {
    let start = Instant::now();
    let mut next_tick = start;
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        if Instant::now() >= next_tick {
            tick();
            next_tick += Duration::from_secs(1);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    done()
}

fn one_member(args: &Args) -> Result<(), Box<dyn Error>> {
    let name = args.name.as_deref().ok_or("--name")?;
    let listen = args.listen.ok_or("--name needs --listen ADDR")?;
    let (tx, rx) = mpsc::channel::<Event>();
    let node = Node::builder(name)
        .secret(SECRET)
        .listen(listen)
        .membership(true)
        .membership_interval(args.interval)
        .seeds(args.seeds.iter().copied())
        .on_event(move |e| {
            let _ = tx.send(e.clone());
        })
        .start()?;
    println!(
        "'{name}' listening at {}; joining through {:?}",
        node.local_addr(),
        args.seeds
    );
    for e in rx {
        match e {
            Event::MemberJoined { .. }
            | Event::MemberSuspected { .. }
            | Event::MemberAlive { .. }
            | Event::MemberFailed { .. }
            | Event::MemberLeft { .. } => {
                let view: Vec<String> = node
                    .members()
                    .iter()
                    .map(|m| format!("{}({})", m.name, m.state))
                    .collect();
                println!("{e}; view: {}", view.join(" "));
            }
            _ => {}
        }
    }
    Ok(())
}
