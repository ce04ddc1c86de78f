//! The idle strategy as the stats report it, over real TCP on 127.0.0.1: a pair of members
//! under each strategy answers requests and carries a burst of messages, and
//! `Stats::idle` says what its IO thread did — whether it spins after work now, and how often
//! an adaptive spin stood down.

mod support;

use std::time::Duration;

use cohort::{IdleStats, IdleStrategy, Node, Stats};
use support::*;

const BURST: u64 = 20_000;

/// A pair under `idle`: `b` answers requests and counts the rest. Sends a burst of 1 KiB
/// messages from `a` to `b` and makes round trips both before and after it; returns each
/// member's stats once the burst is delivered, with its `idle_stats` read just after.
fn exercise(cluster: &str, idle: IdleStrategy) -> [(Stats, IdleStats); 2] {
    let got = Counter::new();
    let count = got.clone();
    let nodes = connected([
        Node::builder("a").cluster(cluster).idle_strategy(idle),
        Node::builder("b")
            .cluster(cluster)
            .idle_strategy(idle)
            .on_message(move |d| {
                if d.is_request() {
                    let _ = d.reply(d.payload_bytes());
                } else {
                    count.add();
                }
            }),
    ]);
    let round_trips = |n: u64| {
        for i in 0..n {
            let reply = nodes[0]
                .request("b", payload(i, 64), PATIENCE)
                .expect("b answers");
            assert_eq!(counter_of(&reply), Ok(i));
        }
    };
    round_trips(50);
    let sender = nodes[0].sender();
    for i in 0..BURST {
        send_patiently(&sender, "b", payload(i, 1024));
    }
    wait_until_or(
        PATIENCE,
        || got.get() == BURST,
        || format!("the burst delivered; stats:\n{}", all_stats(&nodes)),
    );
    round_trips(50);
    let stats = [0, 1].map(|i| (nodes[i].stats(), nodes[i].idle_stats()));
    shutdown_all(&nodes);
    stats
}

/// `Block` never spins and so never stands down; `Spin` spins whatever the load and never
/// stands down either.
#[test]
fn fixed_strategies_report_what_they_do_and_never_stand_down() {
    for (cluster, idle, spins) in [
        ("t-idle-block", IdleStrategy::Block, false),
        (
            "t-idle-spin",
            IdleStrategy::Spin(Duration::from_micros(20)),
            true,
        ),
    ] {
        for (s, alone) in exercise(cluster, idle) {
            let i = s.idle;
            // Read just after: only the turns senders drove may have grown in between (a
            // pool thread's credit going back).
            assert_eq!(
                (
                    alone.spinning,
                    alone.stood_down_loaded,
                    alone.stood_down_contended
                ),
                (i.spinning, i.stood_down_loaded, i.stood_down_contended),
                "idle_stats reads what stats does:\n{s}"
            );
            assert!(alone.driven_turns >= i.driven_turns, "{alone:?}:\n{s}");
            assert_eq!(i.spinning, spins, "{idle:?}:\n{s}");
            assert_eq!(
                (i.stood_down_loaded, i.stood_down_contended),
                (0, 0),
                "{idle:?}:\n{s}"
            );
            let line = format!(
                "idle: {}",
                if spins {
                    "spinning after work"
                } else {
                    "blocking when idle"
                }
            );
            assert!(s.to_string().contains(&line), "{idle:?}:\n{s}");
        }
    }
}

/// The adaptive default starts spinning (the stats say so from the node's start); whenever
/// a member reports it is not spinning, a stand-down was counted (for load or for contended
/// cores), and the member still answers. An adaptive spin of zero never spins.
#[test]
fn the_adaptive_spin_counts_each_stand_down() {
    let fresh = Node::builder("fresh")
        .cluster("t-idle-fresh")
        .start()
        .expect("node starts");
    let i = fresh.stats().idle;
    assert!(
        i.spinning || i.stood_down_loaded + i.stood_down_contended > 0,
        "a new node spins after work, or has counted why not: {i:?}"
    );
    fresh.shutdown(SHUTDOWN).expect("shutdown");
    for (s, _) in exercise("t-idle-zero", IdleStrategy::Adaptive(Duration::ZERO)) {
        let i = s.idle;
        assert!(!i.spinning, "a spin of zero:\n{s}");
        assert_eq!(
            (i.stood_down_loaded, i.stood_down_contended),
            (0, 0),
            "a spin of zero has nothing to stand down:\n{s}"
        );
    }
    for (s, alone) in exercise("t-idle-adaptive", IdleStrategy::default()) {
        let i = s.idle;
        assert!(
            alone.spinning || alone.stood_down_loaded + alone.stood_down_contended > 0,
            "off with no stand-down counted: {alone:?}"
        );
        assert!(
            i.spinning || i.stood_down_loaded + i.stood_down_contended > 0,
            "off with no stand-down counted:\n{s}"
        );
    }
}
