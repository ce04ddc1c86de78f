//! The hand-over from handshake to data: bytes that arrive in the same read as the last
//! handshake frame are framed by the rules of the state the connection is in when each
//! frame is reached, never by the state it was in when the read returned.
//!
//! Two members that dial each other and both stream from the first instant are the case a
//! user hits first: the acceptor writes `Ready` and its queued messages in one write, and
//! the dialler reads them in one read. Every run must end with one handshake per side, no
//! protocol error and nothing resent — on plain TCP, with authentication (the handshake's
//! MAC checks), and over TLS (the TLS handshake's records, then cohort's, then data).

mod support;

use std::thread;

use cohort::{Builder, Node};
use support::*;

/// How the two members secure their connection.
#[derive(Clone, Copy)]
enum Setup<'a> {
    Plain,
    Secret,
    #[cfg(feature = "tls")]
    Tls(&'a certs::TestCa),
    #[cfg(not(feature = "tls"))]
    #[allow(dead_code)]
    Never(std::marker::PhantomData<&'a ()>),
}

impl Setup<'_> {
    fn builder(self, name: &str, cluster: &str) -> Builder {
        let b = Node::builder(name).cluster(cluster);
        match self {
            Setup::Plain => b,
            Setup::Secret => b.secret(b"handover secret"),
            #[cfg(feature = "tls")]
            Setup::Tls(ca) => b.tls(ca.tls(name)),
            #[cfg(not(feature = "tls"))]
            Setup::Never(_) => b,
        }
    }
}

/// Message sizes of one run.
#[derive(Clone, Copy, Debug)]
enum Sizes {
    Fixed(usize),
    /// Sizes from 8 B to 64 KiB, drawn from a seeded generator.
    Random(u64),
}

impl Sizes {
    fn size(self, i: u64) -> usize {
        match self {
            Sizes::Fixed(n) => n,
            Sizes::Random(seed) => {
                // splitmix64 of (seed, i): reproducible per run.
                let mut x = seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                x ^= x >> 31;
                8 + (x % (64 * 1024 - 8 + 1)) as usize
            }
        }
    }
}

/// One run: `a` has `b` as a static peer, `b` adds `a` at run time; both start streaming
/// `count` messages to the other the moment they can, before any connection exists.
fn dial_each_other_and_stream(setup: Setup<'_>, run: usize, sizes: Sizes, count: u64) {
    let cluster = format!("handover-{run}");
    let got_a = OrderCheck::new();
    let got_b = OrderCheck::new();
    let b = setup
        .builder(&format!("b{run}"), &cluster)
        .on_message(got_b.handler())
        .start()
        .expect("start b");
    let a = setup
        .builder(&format!("a{run}"), &cluster)
        .peer(b.name(), b.local_addr())
        .on_message(got_a.handler())
        .start()
        .expect("start a");
    let (sa, b_name) = (a.sender(), b.name().to_owned());
    let from_a = thread::spawn(move || {
        for i in 0..count {
            send_patiently(&sa, &b_name, payload(i, sizes.size(i)));
        }
    });
    b.add_peer(a.name(), a.local_addr()).expect("add_peer");
    let (sb, a_name) = (b.sender(), a.name().to_owned());
    let from_b = thread::spawn(move || {
        for i in 0..count {
            send_patiently(&sb, &a_name, payload(i, sizes.size(i + 1_000_000)));
        }
    });
    from_a.join().expect("a's sender");
    from_b.join().expect("b's sender");
    let nodes = [a, b];
    wait_until_or(
        PATIENCE,
        || got_a.total() == count && got_b.total() == count,
        || {
            format!(
                "run {run} ({sizes:?}): both streams delivered (a got {}, b got {})\n{}",
                got_a.total(),
                got_b.total(),
                all_stats(&nodes)
            )
        },
    );
    got_a.assert_ok();
    got_b.assert_ok();
    for (node, other) in [(&nodes[0], &nodes[1]), (&nodes[1], &nodes[0])] {
        let s = node.stats();
        let p = s.peer(other.name()).expect("peer stats");
        assert_eq!(
            s.connections.protocol_errors,
            0,
            "run {run} ({sizes:?}): protocol errors at {}:\n{s}",
            node.name()
        );
        assert_eq!(
            p.connects,
            1,
            "run {run} ({sizes:?}): {} completed more than one handshake with {}:\n{s}",
            node.name(),
            other.name()
        );
        assert_eq!(
            p.resent,
            0,
            "run {run} ({sizes:?}): {} resent messages to {}:\n{s}",
            node.name(),
            other.name()
        );
    }
    shutdown_all(&nodes);
}

fn runs(first: usize, n: usize, sizes: impl Fn(usize) -> Sizes, count: u64) {
    for run in first..first + n {
        dial_each_other_and_stream(Setup::Plain, run, sizes(run), count);
    }
}

#[test]
fn kilobyte_messages_both_ways_from_the_first_instant() {
    runs(0, 25, |_| Sizes::Fixed(1000), 200);
}

#[test]
fn four_kib_messages_both_ways_from_the_first_instant() {
    runs(100, 25, |_| Sizes::Fixed(4096), 200);
}

#[test]
fn sixty_kib_messages_both_ways_from_the_first_instant() {
    runs(200, 25, |_| Sizes::Fixed(60 * 1024), 100);
}

#[test]
fn random_sizes_both_ways_from_the_first_instant() {
    runs(300, 25, |run| Sizes::Random(run as u64), 100);
}

#[test]
fn authenticated_members_both_ways_from_the_first_instant() {
    for run in 400..410 {
        let sizes = if run % 2 == 0 {
            Sizes::Fixed(4096)
        } else {
            Sizes::Random(run as u64)
        };
        dial_each_other_and_stream(Setup::Secret, run, sizes, 100);
    }
}

#[cfg(feature = "tls")]
#[test]
fn tls_members_both_ways_from_the_first_instant() {
    let ca = certs::TestCa::new("handover CA");
    for run in 500..510 {
        let sizes = if run % 2 == 0 {
            Sizes::Fixed(4096)
        } else {
            Sizes::Random(run as u64)
        };
        dial_each_other_and_stream(Setup::Tls(&ca), run, sizes, 100);
    }
}
