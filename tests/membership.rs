//! Membership (SWIM) over real sockets on 127.0.0.1: members given one seed each converge
//! to one view and to a full mesh of peers; a member that shuts down is seen leaving; one
//! killed with SIGKILL (a child process) is declared failed by all the others and removed,
//! and its restart joins again; a member without the cluster's secret never gets in.
//!
//! A killed member is this test binary re-executed with `--exact member_child` (an ignored
//! test that does nothing unless `COHORT_MEMBER_SEED` is set).

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cohort::{Event, MemberState, Node};
use support::*;

const CLUSTER: &str = "members";
const SECRET: &[u8] = b"membership secret";
/// Fast probing for the tests: failure detection within about 5-30 intervals.
const INTERVAL: Duration = Duration::from_millis(100);
const ENV_SEED: &str = "COHORT_MEMBER_SEED";
const MARK: &str = "member-child:";

/// Every membership event a node was told, in order.
type Seen = Arc<Mutex<Vec<Event>>>;

fn member(name: &str, seed: Option<SocketAddr>, seen: &Seen) -> Node {
    let s = seen.clone();
    let mut b = Node::builder(name)
        .cluster(CLUSTER)
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .membership(true)
        .membership_interval(INTERVAL)
        .on_event(move |e| s.lock().expect("events").push(e.clone()));
    if let Some(seed) = seed {
        b = b.seed(seed);
    }
    b.start().expect("start a member")
}

/// A member that knows one other by name only (`Builder::peer`, no seed), as a TLS member
/// must: it joins the view through that peer.
fn member_with_peer(name: &str, peer: &Node) -> Node {
    Node::builder(name)
        .cluster(CLUSTER)
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .membership(true)
        .membership_interval(INTERVAL)
        .peer(peer.name(), peer.local_addr())
        .start()
        .expect("start a member")
}

/// The names `node`'s view holds in `state`.
fn in_state(node: &Node, state: MemberState) -> BTreeSet<String> {
    node.members()
        .into_iter()
        .filter(|m| m.state == state)
        .map(|m| m.name)
        .collect()
}

fn names(all: &[&str]) -> BTreeSet<String> {
    all.iter().map(|s| s.to_string()).collect()
}

/// Eight members, each given the address of the one started before it (a chain: the first
/// knows nobody): every view holds all eight alive, every member is a connected peer of
/// every other, and a message from each to each is delivered.
#[test]
fn members_given_one_seed_each_converge_to_one_view_and_a_mesh() {
    const N: usize = 8;
    let orders: Vec<_> = (0..N).map(|_| OrderCheck::new()).collect();
    let mut nodes: Vec<Node> = Vec::new();
    let all: Vec<String> = (0..N).map(|i| format!("m{i}")).collect();
    for (i, name) in all.iter().enumerate() {
        let seed = nodes.last().map(Node::local_addr);
        let mut b = Node::builder(name)
            .cluster(CLUSTER)
            .secret(SECRET)
            .listen("127.0.0.1:0")
            .membership(true)
            .membership_interval(INTERVAL)
            .on_message(orders[i].handler());
        if let Some(seed) = seed {
            b = b.seed(seed);
        }
        nodes.push(b.start().expect("start"));
    }
    let everyone: BTreeSet<String> = all.iter().cloned().collect();
    let started = Instant::now();
    wait_until_or(
        PATIENCE,
        || {
            nodes
                .iter()
                .all(|n| in_state(n, MemberState::Alive) == everyone)
        },
        || {
            nodes
                .iter()
                .map(|n| format!("{}: {:?}", n.name(), n.members()))
                .collect::<Vec<_>>()
                .join("\n")
        },
    );
    println!("{N} members converged in {:?}", started.elapsed());
    wait_until_or(
        PATIENCE,
        || {
            nodes.iter().all(|n| {
                all.iter()
                    .filter(|p| **p != n.name())
                    .all(|p| is_connected(n, p))
            })
        },
        || {
            nodes
                .iter()
                .map(|n| n.stats().to_string())
                .collect::<Vec<_>>()
                .join("\n")
        },
    );
    for n in &nodes {
        for p in all.iter().filter(|p| **p != n.name()) {
            n.send(p, payload(0, 16)).expect("send to a member");
        }
    }
    wait_until("every member's message delivered", PATIENCE, || {
        orders.iter().all(|o| o.total() == (N - 1) as u64)
    });
    for o in &orders {
        o.assert_ok();
    }
    shutdown_all(&nodes);
}

/// A member that shuts down leaves: the others see it left (sooner than a failure would
/// be declared) and remove it from their peers.
#[test]
fn a_member_that_shuts_down_is_seen_leaving() {
    let (sa, sb, sc) = (Seen::default(), Seen::default(), Seen::default());
    let a = member("la", None, &sa);
    let b = member("lb", Some(a.local_addr()), &sb);
    let c = member("lc", Some(a.local_addr()), &sc);
    let everyone = names(&["la", "lb", "lc"]);
    wait_until("the view converges", PATIENCE, || {
        [&a, &b, &c]
            .iter()
            .all(|n| in_state(n, MemberState::Alive) == everyone)
    });
    let t = Instant::now();
    c.shutdown(SHUTDOWN).expect("c stops");
    wait_until("a and b see c leave", PATIENCE, || {
        [&a, &b]
            .iter()
            .all(|n| in_state(n, MemberState::Left).contains("lc"))
    });
    println!("left seen after {:?}", t.elapsed());
    for (n, seen) in [(&a, &sa), (&b, &sb)] {
        wait_until("c removed from the peers", PATIENCE, || {
            !n.peers().contains(&"lc".to_string())
        });
        // Events reach the callback on the pool, after the view changed.
        wait_until("told c left", PATIENCE, || {
            seen.lock()
                .expect("events")
                .iter()
                .any(|e| matches!(e, Event::MemberLeft { peer } if peer == "lc"))
        });
        let events = seen.lock().expect("events").clone();
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, Event::MemberFailed { .. })),
            "{events:?}"
        );
    }
    shutdown_all(&[a, b]);
}

/// A process killed with SIGKILL is declared failed by every other member and removed from
/// their peers; started again (a new process, same name and address), it joins again.
#[test]
fn a_killed_member_is_declared_failed_and_its_restart_joins_again() {
    let (sa, sb) = (Seen::default(), Seen::default());
    let a = member("ka", None, &sa);
    let b = member("kb", Some(a.local_addr()), &sb);
    let held = HeldAddr::new();
    let mut child = spawn_member(a.local_addr(), held.addr());
    let everyone = names(&["ka", "kb", "kchild"]);
    wait_until("the view converges with the child", PATIENCE, || {
        [&a, &b]
            .iter()
            .all(|n| in_state(n, MemberState::Alive) == everyone)
    });
    let t = Instant::now();
    child.kill().expect("SIGKILL the child");
    let _ = child.wait();
    wait_until_or(
        PATIENCE,
        || {
            [&a, &b]
                .iter()
                .all(|n| in_state(n, MemberState::Failed).contains("kchild"))
        },
        || format!("{:?}\n{:?}", a.members(), b.members()),
    );
    println!("failure declared by both after {:?}", t.elapsed());
    for (n, seen) in [(&a, &sa), (&b, &sb)] {
        wait_until("the child removed from the peers", PATIENCE, || {
            !n.peers().contains(&"kchild".to_string())
        });
        // Events reach the callback on the pool, after the view changed.
        wait_until("told the child failed", PATIENCE, || {
            seen.lock()
                .expect("events")
                .iter()
                .any(|e| matches!(e, Event::MemberFailed { peer } if peer == "kchild"))
        });
        let events = seen.lock().expect("events").clone();
        // Neither a nor b was ever suspected by the other meanwhile.
        assert!(
            !events.iter().any(
                |e| matches!(e, Event::MemberFailed { peer } | Event::MemberSuspected { peer } if peer != "kchild")
            ),
            "{events:?}"
        );
    }
    let mut again = spawn_member(a.local_addr(), held.addr());
    wait_until_or(
        PATIENCE,
        || {
            [&a, &b]
                .iter()
                .all(|n| in_state(n, MemberState::Alive) == everyone && is_connected(n, "kchild"))
        },
        || format!("{:?}\n{:?}", a.members(), b.members()),
    );
    let _ = again.kill();
    let _ = again.wait();
    shutdown_all(&[a, b]);
}

/// Sixteen processes, each given one seed (the process started before it; the first, this
/// test's own member): every view converges to all seventeen members alive. Then one
/// process is killed with SIGKILL and every other member declares it failed — and nothing
/// else.
#[test]
fn sixteen_processes_each_given_one_seed_converge_and_see_a_kill() {
    const N: usize = 16;
    let seen = Seen::default();
    let hub = member("hub", None, &seen);
    let addrs: Vec<HeldAddr> = (0..N).map(|_| HeldAddr::new()).collect();
    let started = Instant::now();
    let mut children: Vec<(Child, std::sync::mpsc::Receiver<String>)> = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let seed = if i == 0 {
            hub.local_addr()
        } else {
            addrs[i - 1].addr()
        };
        children.push(spawn_named(seed, addr.addr(), &format!("p{i:02}"), N + 1));
    }
    for (i, (_, lines)) in children.iter().enumerate() {
        let line = lines
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("child {i} did not converge"));
        assert_eq!(line, "converged");
    }
    wait_until("the hub's view is whole", PATIENCE, || {
        in_state(&hub, MemberState::Alive).len() == N + 1
    });
    println!(
        "{N} processes and the hub converged in {:?}",
        started.elapsed()
    );
    let (victim, _) = &mut children[N / 2];
    let t = Instant::now();
    victim.kill().expect("SIGKILL");
    let _ = victim.wait();
    let name = format!("p{:02}", N / 2);
    wait_until("the hub declares it failed", PATIENCE, || {
        in_state(&hub, MemberState::Failed).contains(&name)
    });
    for (i, (_, lines)) in children.iter().enumerate().filter(|(i, _)| *i != N / 2) {
        let line = lines
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("child {i} never declared {name} failed"));
        assert_eq!(
            line,
            format!("failed {name}"),
            "child {i}: no other failure"
        );
    }
    println!(
        "the kill declared failed by all {N} others after {:?}",
        t.elapsed()
    );
    let s = hub.membership_stats().expect("stats");
    let secs = started.elapsed().as_secs_f64();
    println!(
        "hub: {:.1} packets/s and {:.0} bytes/s out, {:.1} packets/s in, over {secs:.1} s",
        s.packets_sent as f64 / secs,
        s.bytes_sent as f64 / secs,
        s.packets_received as f64 / secs
    );
    for (mut c, _) in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    hub.shutdown(SHUTDOWN).expect("the hub stops");
}

/// A member without the cluster's secret, seeded with a member's address, never enters a
/// view, while a member with it, started after, does.
#[test]
fn a_member_without_the_secret_cannot_join() {
    let sa = Seen::default();
    let a = member("sa", None, &sa);
    let stranger = Node::builder("intruder")
        .cluster(CLUSTER)
        .secret(b"not the secret")
        .listen("127.0.0.1:0")
        .membership_interval(INTERVAL)
        .seed(a.local_addr())
        .start()
        .expect("start the stranger");
    // A genuine member joining later proves the stranger's packets had their time.
    let late = member("sb", Some(a.local_addr()), &Seen::default());
    wait_until("the genuine member joins", PATIENCE, || {
        in_state(&a, MemberState::Alive) == names(&["sa", "sb"])
    });
    wait_until("the genuine member sees the view", PATIENCE, || {
        in_state(&late, MemberState::Alive) == names(&["sa", "sb"])
    });
    assert!(
        !a.members().iter().any(|m| m.name == "intruder"),
        "{:?}",
        a.members()
    );
    assert!(!a.peers().contains(&"intruder".to_string()));
    assert_eq!(
        in_state(&stranger, MemberState::Alive),
        names(&["intruder"]),
        "the stranger learnt nobody"
    );
    shutdown_all(&[stranger, late, a]);
}

/// A member listening at a held address, with a network fault: membership datagrams to or
/// from an address `cut` returns `true` for are dropped.
fn member_at(
    name: &str,
    listen: SocketAddr,
    seed: Option<SocketAddr>,
    seen: &Seen,
    cut: impl Fn(SocketAddr) -> bool + Send + Sync + 'static,
) -> Node {
    let s = seen.clone();
    let mut b = Node::builder(name)
        .cluster(CLUSTER)
        .secret(SECRET)
        .listen(listen)
        .membership(true)
        .membership_interval(INTERVAL)
        .drop_membership_datagrams(cut)
        .on_event(move |e| s.lock().expect("events").push(e.clone()));
    if let Some(seed) = seed {
        b = b.seed(seed);
    }
    b.start().expect("start a member")
}

/// Waits until `node` has sent `more` membership packets beyond what it had sent: protocol
/// time passing (probe rounds), not wall-clock time.
fn wait_rounds(node: &Node, more: u64) {
    let sent = |n: &Node| n.membership_stats().map_or(0, |s| s.packets_sent);
    let target = sent(node) + more;
    wait_until("membership rounds pass", PATIENCE, || sent(node) >= target);
}

/// Two members that cannot reach each other (every membership datagram between them is
/// dropped) while both reach the others: each one's direct probes of the other fail, the
/// indirect ones through the others succeed, and nobody is declared failed.
#[test]
fn a_member_cut_off_from_one_other_is_not_declared_failed() {
    let addrs: Vec<HeldAddr> = (0..4).map(|_| HeldAddr::new()).collect();
    let (a, b) = (addrs[0].addr(), addrs[1].addr());
    let seen: Vec<Seen> = (0..4).map(|_| Seen::default()).collect();
    let names = ["ca", "cb", "cc", "cd"];
    let nodes: Vec<Node> = (0..4)
        .map(|i| {
            let seed = (i != 2).then(|| addrs[2].addr());
            let cut = move |x: SocketAddr| (i == 0 && x == b) || (i == 1 && x == a);
            member_at(names[i], addrs[i].addr(), seed, &seen[i], cut)
        })
        .collect();
    let everyone = super_names(&names);
    wait_until_or(
        PATIENCE,
        || {
            nodes
                .iter()
                .all(|n| in_state(n, MemberState::Alive) == everyone)
        },
        || {
            nodes
                .iter()
                .map(|n| format!("{}: {:?} {:?}", n.name(), n.members(), n.membership_stats()))
                .collect::<Vec<_>>()
                .join("\n")
        },
    );
    // Forty probe rounds or so of the cut members.
    wait_rounds(&nodes[0], 200);
    wait_rounds(&nodes[1], 200);
    for (n, seen) in nodes.iter().zip(&seen) {
        assert_eq!(in_state(n, MemberState::Alive), everyone, "{}", n.name());
        let events = seen.lock().expect("events").clone();
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, Event::MemberFailed { .. })),
            "{}: {events:?}",
            n.name()
        );
    }
    shutdown_all(&nodes);
}

/// Four members against four: while every membership datagram between the halves is
/// dropped, each half declares the other failed; once the partition heals, the two
/// halves find each other again (through the members they remember) and every view holds
/// all eight alive, every member a connected peer of every other.
#[test]
fn a_partition_of_four_against_four_heals_into_one_view() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let addrs: Vec<HeldAddr> = (0..8).map(|_| HeldAddr::new()).collect();
    let left: Vec<SocketAddr> = addrs[..4].iter().map(HeldAddr::addr).collect();
    let parted = Arc::new(AtomicBool::new(false));
    let names: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
    let nodes: Vec<Node> = (0..8)
        .map(|i| {
            let (left, parted) = (left.clone(), parted.clone());
            let mine = i < 4;
            // SeqCst: a test's switch, read rarely.
            let cut =
                move |x: SocketAddr| parted.load(Ordering::SeqCst) && left.contains(&x) != mine;
            let seed = (i > 0).then(|| addrs[i - 1].addr());
            member_at(&names[i], addrs[i].addr(), seed, &Seen::default(), cut)
        })
        .collect();
    let all: BTreeSet<String> = names.iter().cloned().collect();
    wait_until("the view converges", PATIENCE, || {
        nodes.iter().all(|n| in_state(n, MemberState::Alive) == all)
    });
    parted.store(true, Ordering::SeqCst);
    let t = Instant::now();
    let (l, r): (BTreeSet<String>, BTreeSet<String>) = (
        names[..4].iter().cloned().collect(),
        names[4..].iter().cloned().collect(),
    );
    wait_until_or(
        PATIENCE,
        || {
            nodes.iter().enumerate().all(|(i, n)| {
                let other = if i < 4 { &r } else { &l };
                let gone: BTreeSet<String> = n
                    .members()
                    .into_iter()
                    .filter(|m| m.state == MemberState::Failed)
                    .map(|m| m.name)
                    .collect();
                other.is_subset(&gone)
            })
        },
        || {
            nodes
                .iter()
                .map(|n| format!("{}: {:?}", n.name(), n.members()))
                .collect::<Vec<_>>()
                .join("\n")
        },
    );
    println!(
        "each half declared the other failed after {:?}",
        t.elapsed()
    );
    parted.store(false, Ordering::SeqCst);
    let t = Instant::now();
    wait_until_or(
        PATIENCE,
        || {
            nodes.iter().all(|n| {
                in_state(n, MemberState::Alive) == all
                    && names
                        .iter()
                        .filter(|p| **p != n.name())
                        .all(|p| is_connected(n, p))
            })
        },
        || {
            nodes
                .iter()
                .map(|n| format!("{}: {:?}", n.name(), n.members()))
                .collect::<Vec<_>>()
                .join("\n")
        },
    );
    println!("healed into one view after {:?}", t.elapsed());
    shutdown_all(&nodes);
}

fn super_names(all: &[&str]) -> BTreeSet<String> {
    names(all)
}

/// Starts this test binary again as the member `kchild`, listening at `listen`, seeded
/// with `seed`.
fn spawn_member(seed: SocketAddr, listen: SocketAddr) -> Child {
    spawn_named(seed, listen, "kchild", 0).0
}

/// Starts this test binary again as the member `name`, listening at `listen`, seeded with
/// `seed`; with `expect` > 0 it says `converged` (read from the returned lines) once its
/// view holds that many members alive.
fn spawn_named(
    seed: SocketAddr,
    listen: SocketAddr,
    name: &str,
    expect: usize,
) -> (Child, std::sync::mpsc::Receiver<String>) {
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "member_child",
            "--nocapture",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env(ENV_SEED, format!("{seed} {listen} {name} {expect}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a member");
    let out = child::output(&mut child, MARK);
    let line = out
        .lines
        .recv_timeout(PATIENCE)
        .unwrap_or_else(|_| panic!("the child started: {}", out.stderr.lock().unwrap()));
    assert_eq!(line, "started");
    (child, out.lines)
}

/// The member a kill test starts as a child process: runs until its stdin closes (or it is
/// killed).
#[test]
#[ignore = "run by the membership tests as a child process"]
fn member_child() {
    let Ok(spec) = std::env::var(ENV_SEED) else {
        eprintln!("member_child runs only under the membership tests");
        return;
    };
    let mut parts = spec.split(' ');
    let seed: SocketAddr = parts.next().and_then(|s| s.parse().ok()).expect("seed");
    let listen: SocketAddr = parts.next().and_then(|s| s.parse().ok()).expect("listen");
    let name = parts.next().expect("name").to_string();
    let expect: usize = parts.next().and_then(|s| s.parse().ok()).expect("expect");
    let node = Node::builder(&name)
        .cluster(CLUSTER)
        .secret(SECRET)
        .listen(listen)
        .membership_interval(INTERVAL)
        .seed(seed)
        .on_event(|e| {
            if let Event::MemberFailed { peer } = e {
                println!("{MARK} failed {peer}");
            }
        })
        .start()
        .expect("start the child member");
    println!("{MARK} started");
    if expect > 0 {
        wait_until("the child's view is whole", PATIENCE, || {
            node.members()
                .iter()
                .filter(|m| m.state == MemberState::Alive)
                .count()
                == expect
        });
        println!("{MARK} converged");
    }
    let mut buf = [0u8; 1];
    let _ = std::io::Read::read(&mut std::io::stdin(), &mut buf);
    node.shutdown(SHUTDOWN).expect("the child stops");
}

/// Two processes under one name join through one seed: the members keep the first (the
/// transport refuses the second at the handshake, and the view agrees), neither raises its
/// incarnation against the other, nobody is declared failed; when the first leaves, the
/// second takes the name.
#[test]
fn a_second_process_under_a_live_name_stays_out_of_the_view_until_the_first_leaves() {
    let seen: Seen = Arc::default();
    let hub = member("hub", None, &seen);
    let other = member("other", Some(hub.local_addr()), &seen);
    let first = member("twin", Some(hub.local_addr()), &seen);
    let holds = |n: &Node, addr: SocketAddr| {
        n.members()
            .iter()
            .any(|m| m.name == "twin" && m.addr == addr && m.state == MemberState::Alive)
    };
    wait_until("the three converge", PATIENCE, || {
        [&hub, &other].iter().all(|n| holds(n, first.local_addr()))
            && in_state(&first, MemberState::Alive) == names(&["twin", "hub", "other"])
    });
    let incarnation = first.members()[0].incarnation;
    let second = member("twin", Some(hub.local_addr()), &seen);
    wait_until(
        "the hub ignores the second's claims, again and again",
        PATIENCE,
        || {
            hub.membership_stats().is_some_and(|s| s.twin_claims >= 5)
                && second
                    .membership_stats()
                    .is_some_and(|s| s.twin_claims >= 1)
        },
    );
    for n in [&hub, &other] {
        assert!(holds(n, first.local_addr()), "{:?}", n.members());
    }
    assert_eq!(
        first.members()[0].incarnation,
        incarnation,
        "the first fought"
    );
    assert_eq!(second.members()[0].incarnation, 0, "the second fought");
    let failed: Vec<Event> = seen
        .lock()
        .expect("events")
        .iter()
        .filter(|e| matches!(e, Event::MemberFailed { .. }))
        .cloned()
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    first
        .shutdown(Duration::from_secs(5))
        .expect("the first stops");
    wait_until("the second takes the name", PATIENCE, || {
        [&hub, &other].iter().all(|n| holds(n, second.local_addr()))
    });
    for n in [hub, other, second] {
        n.shutdown(Duration::from_secs(5)).expect("stop");
    }
}

/// Two members configured with a third by name (no seeds: the way in with TLS, where seeds
/// are refused) join the view through it: every view holds the three alive, and the two
/// that knew only the third find and connect to each other.
#[test]
fn members_configured_with_a_peer_by_name_join_through_it() {
    let a = member("named-a", None, &Seen::default());
    let b = member_with_peer("named-b", &a);
    let c = member_with_peer("named-c", &a);
    let all = names(&["named-a", "named-b", "named-c"]);
    wait_until_or(
        PATIENCE,
        || {
            [&a, &b, &c]
                .iter()
                .all(|n| in_state(n, MemberState::Alive) == all)
                && is_connected(&b, "named-c")
                && is_connected(&c, "named-b")
        },
        || {
            format!(
                "a: {:?}\nb: {:?}\nc: {:?}",
                a.members(),
                b.members(),
                c.members()
            )
        },
    );
    shutdown_all(&[a, b, c]);
}
