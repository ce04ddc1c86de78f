//! Seeds: a member given only an address (`Builder::seed`) reaches the member listening
//! there, learns its name from the handshake, and streams with it as with a configured
//! peer; its own address among its seeds is skipped; a seed that is down is dialled again
//! until it answers; a member without the cluster's secret gets nowhere.

mod support;

use cohort::{ConfigError, Error, Node};
use support::*;

const CLUSTER: &str = "seeds";
const SECRET: &[u8] = b"seed secret";

/// The member that answers at a seed: it admits members it does not know.
fn answering(name: &str, listen: std::net::SocketAddr, order: &std::sync::Arc<OrderCheck>) -> Node {
    Node::builder(name)
        .cluster(CLUSTER)
        .secret(SECRET)
        .listen(listen)
        .allow_unknown_members(true)
        .on_message(order.handler())
        .start()
        .expect("start the member at the seed")
}

/// A member that knows no name, only the address of another, reaches it and learns its
/// name; then both stream at once, mixed sizes, and each delivers everything once, in
/// order. The member found at the seed is dialled there again when its link is lost.
#[test]
fn a_member_given_only_a_seed_streams_with_the_member_there() {
    const N: u64 = 500;
    let (ob, oa) = (OrderCheck::new(), OrderCheck::new());
    let b = answering("seed-b", "127.0.0.1:0".parse().expect("addr"), &ob);
    let a = Node::builder("seed-a")
        .cluster(CLUSTER)
        .secret(SECRET)
        .seed(b.local_addr())
        .on_message(oa.handler())
        .start()
        .expect("start a");
    wait_until("a reaches the member at its seed", PATIENCE, || {
        is_connected(&a, "seed-b")
    });
    assert_eq!(a.peers(), vec!["seed-b".to_string()]);
    let (sa, sb) = (a.sender(), b.sender());
    let ta = std::thread::spawn(move || {
        for i in 0..N {
            send_patiently(&sa, "seed-b", payload(i, 1 + (i as usize * 37) % 3000));
        }
    });
    let tb = std::thread::spawn(move || {
        for i in 0..N {
            send_patiently(&sb, "seed-a", payload(i, 1 + (i as usize * 53) % 3000));
        }
    });
    ta.join().expect("a's sender");
    tb.join().expect("b's sender");
    wait_until_or(
        PATIENCE,
        || ob.count_from("seed-a") == N && oa.count_from("seed-b") == N,
        || format!("everything delivered:\n{}\n{}", a.stats(), b.stats()),
    );
    ob.assert_ok();
    oa.assert_ok();
    // The member found at the seed is redialled there like a configured peer.
    a.disconnect("seed-b").expect("disconnect");
    wait_until("a reconnects to the seed's member", PATIENCE, || {
        peer_stats(&a, "seed-b").connects >= 2 && is_connected(&a, "seed-b")
    });
    shutdown_all(&[a, b]);
}

/// Every member may be given one list of seeds: its own address among them is dialled
/// once, found to be itself, and never again — not even when the node is alone and dials
/// its other seeds again.
#[test]
fn its_own_address_among_the_seeds_is_skipped() {
    let own = HeldAddr::new();
    let ob = OrderCheck::new();
    let b = answering("own-b", "127.0.0.1:0".parse().expect("addr"), &ob);
    let b_addr = b.local_addr();
    let a = Node::builder("own-a")
        .cluster(CLUSTER)
        .secret(SECRET)
        .listen(own.addr())
        .allow_unknown_members(true)
        .seeds([own.addr(), b_addr])
        .start()
        .expect("start a");
    wait_until("a reaches b", PATIENCE, || is_connected(&a, "own-b"));
    wait_until("a's dial to itself came in and went", PATIENCE, || {
        a.stats().connections.accepted >= 1
    });
    assert_eq!(a.peers(), vec!["own-b".to_string()], "no peer for itself");
    // Alone: b stops; a dials its seeds again (b's, refused) with backoff.
    b.shutdown(SHUTDOWN).expect("b stops");
    let failures = a.stats().connections.dial_failures;
    wait_until("a dials b's seed again, and again", PATIENCE, || {
        a.stats().connections.dial_failures >= failures + 3
    });
    let s = a.stats();
    assert_eq!(
        s.connections.accepted, 1,
        "its own address was dialled again:\n{s}"
    );
    assert_eq!(s.connections.refused, 0, "{s}");
    a.shutdown(SHUTDOWN).expect("a stops");
}

/// A seed where nothing listens yet is dialled again with backoff until a member listens
/// there.
#[test]
fn a_seed_down_at_start_is_dialled_until_it_answers() {
    let held = HeldAddr::new();
    let a = Node::builder("late-a")
        .cluster(CLUSTER)
        .secret(SECRET)
        .seed(held.addr())
        .start()
        .expect("start a");
    wait_until(
        "a's dials to the seed fail, more than once",
        PATIENCE,
        || a.stats().connections.dial_failures >= 2,
    );
    let ob = OrderCheck::new();
    let b = answering("late-b", held.addr(), &ob);
    wait_until("a reaches the seed once it answers", PATIENCE, || {
        is_connected(&a, "late-b")
    });
    a.send("late-b", payload(0, 10)).expect("send");
    wait_until("delivered", PATIENCE, || ob.count_from("late-a") == 1);
    shutdown_all(&[a, b]);
}

/// A member without the cluster's secret, given a member's address as its seed, is refused
/// there: neither side makes a peer of the other.
#[test]
fn a_seed_does_not_let_a_member_without_the_secret_in() {
    let ob = OrderCheck::new();
    let b = answering("guard-b", "127.0.0.1:0".parse().expect("addr"), &ob);
    let stranger = Node::builder("stranger")
        .cluster(CLUSTER)
        .secret(b"another secret")
        .seed(b.local_addr())
        .start()
        .expect("start the stranger");
    wait_until("the stranger is refused", PATIENCE, || {
        b.stats().connections.auth_failures >= 1
    });
    assert!(
        b.peers().is_empty(),
        "b admitted a stranger: {:?}",
        b.peers()
    );
    assert!(
        stranger.peers().is_empty(),
        "the stranger made a peer: {:?}",
        stranger.peers()
    );
    shutdown_all(&[stranger, b]);
}

/// A seed without its port is a configuration error naming it; a name that does not
/// resolve is not (a cluster's DNS name may list no member yet): the node starts and
/// resolves it again.
#[test]
fn a_seed_without_a_port_is_a_configuration_error_and_an_unresolved_name_is_not() {
    let err = Node::builder("unresolved")
        .seed("seed-host.invalid")
        .start()
        .expect_err("a seed without a port");
    match &err {
        Error::Config(ConfigError::Address { setting, .. }) => assert_eq!(*setting, "seed"),
        other => panic!("expected a seed address error, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("seed-host.invalid"), "{text}");
    let node = Node::builder("unresolved")
        .seed("no-such-host.invalid:7000")
        .start()
        .expect("a seed name that does not resolve yet");
    node.shutdown(SHUTDOWN).expect("stops");
}

/// A seed given by name is kept as a name: while the node reaches nobody it is resolved
/// again, with backoff, on a thread of its own (never the IO thread), and the member at an
/// address it resolves to later is found. Here the name resolves to nothing at start, then
/// to two addresses: one where nothing listens, one where a member does.
#[test]
fn a_seed_name_is_resolved_again_until_it_gives_a_member() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let ob = OrderCheck::new();
    let b = Node::builder("named-b")
        .cluster(CLUSTER)
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .membership(true)
        .membership_interval(std::time::Duration::from_millis(100))
        .on_message(ob.handler())
        .start()
        .expect("start b");
    let nobody = HeldAddr::new();
    let listed = Arc::new(AtomicBool::new(false));
    let threads: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let (l, t, b_addr, dead) = (
        listed.clone(),
        threads.clone(),
        b.local_addr(),
        nobody.addr(),
    );
    let a = Node::builder("named-a")
        .cluster(CLUSTER)
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .membership_interval(std::time::Duration::from_millis(100))
        .seed("members.cluster.test:7000")
        .resolve_seeds_with(move |name| {
            assert_eq!(name, "members.cluster.test:7000");
            t.lock()
                .expect("threads")
                .push(std::thread::current().name().map(str::to_owned));
            // Relaxed: a switch the test flips once.
            if l.load(Ordering::Relaxed) {
                Ok(vec![dead, b_addr])
            } else {
                Err(std::io::Error::other("no such name yet"))
            }
        })
        .start()
        .expect("start a with a name that does not resolve yet");
    wait_until("a resolves the name again, and again", PATIENCE, || {
        threads.lock().expect("threads").len() >= 3
    });
    assert!(a.members().len() == 1, "{:?}", a.members());
    listed.store(true, Ordering::Relaxed);
    wait_until(
        "a finds b at the address the name gives now",
        PATIENCE,
        || {
            is_connected(&a, "named-b")
                && a.members().iter().any(|m| m.name == "named-b")
                && b.members().iter().any(|m| m.name == "named-a")
        },
    );
    let calls = threads.lock().expect("threads").clone();
    // The first resolution is `start`'s, on the test's thread; every later one on a
    // resolver thread of its own.
    for name in &calls[1..] {
        assert_eq!(name.as_deref(), Some("cohort-resolve"), "{calls:?}");
    }
    let settled = calls.len();
    // Reaching a member, it resolves the name no more.
    a.send("named-b", payload(0, 10)).expect("send");
    wait_until("delivered", PATIENCE, || ob.count_from("named-a") == 1);
    assert!(
        threads.lock().expect("threads").len() <= settled + 1,
        "{:?}",
        threads.lock().expect("threads")
    );
    shutdown_all(&[a, b]);
}

/// "localhost:PORT" as the seed, resolved by the system: the member that comes up on that
/// port later is found, and after it stops and another process comes up there, that one
/// is found too.
#[test]
fn a_localhost_seed_finds_the_member_that_comes_up_there_and_its_restart() {
    let held = HeldAddr::new();
    let seed = format!("localhost:{}", held.addr().port());
    let interval = std::time::Duration::from_millis(100);
    let a = Node::builder("local-a")
        .cluster(CLUSTER)
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .membership_interval(interval)
        .seed(seed.as_str())
        .start()
        .expect("start a");
    let at_port = |name: &str| {
        Node::builder(name)
            .cluster(CLUSTER)
            .secret(SECRET)
            .listen(held.addr())
            .membership(true)
            .membership_interval(interval)
            .start()
            .expect("start the member at the seed's port")
    };
    wait_until("a's dials to the seed fail", PATIENCE, || {
        a.stats().connections.dial_failures >= 2
    });
    let b = at_port("local-b");
    let alive = |n: &Node, name: &str| {
        n.members()
            .iter()
            .any(|m| m.name == name && m.state == cohort::MemberState::Alive)
    };
    wait_until("a finds b", PATIENCE, || {
        alive(&a, "local-b") && is_connected(&a, "local-b")
    });
    b.shutdown(SHUTDOWN).expect("b stops");
    wait_until("a sees b gone", PATIENCE, || !alive(&a, "local-b"));
    let c = at_port("local-c");
    wait_until(
        "a finds the member that came up there next",
        PATIENCE,
        || alive(&a, "local-c") && alive(&c, "local-a"),
    );
    shutdown_all(&[a, c]);
}
