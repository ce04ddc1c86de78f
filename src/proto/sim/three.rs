//! Three members, each knowing the other two: every pair is its own stream.

use std::time::Duration;

use super::harness::{Sim, Step};
use super::member::{Settings, Side, Spec};
use crate::sync::atomic::Ordering;

const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];

fn settings() -> Settings {
    Settings {
        ack_threshold: 2,
        ack_delay: 10,
        high_water: 1 << 16,
        secret: false,
        both_dial: false,
        journal: false,
    }
}

/// Member `i` knows the other two; it dials those after it (so every pair has one dialler).
fn spec(i: Side, launch: u64) -> Spec {
    Spec {
        name: NAMES[i],
        launch,
        knows: (0..3)
            .filter(|&j| j != i)
            .map(|j| (NAMES[j], (j > i).then_some(j)))
            .collect(),
        journal: false,
        seeds: Vec::new(),
    }
}

/// Sends `n` messages from `side` to each of its peers.
fn send_all(sim: &mut Sim, side: Side, n: usize) {
    for _ in 0..n {
        for k in 0..sim.m[side].peers.len() {
            sim.send_to(side, k, 3);
        }
    }
}

/// Three members stream to each other over three links; two links break mid-stream: each
/// of the six streams is delivered exactly once, in order.
#[test]
fn three_members_stream_each_pair_exactly_once() {
    let specs: Vec<Spec> = (0..3).map(|i| spec(i, 0xA1 + i as u64)).collect();
    let mut sim = Sim::with(settings(), &specs);
    sim.pump();
    assert_eq!(sim.links.len(), 3);
    for side in 0..3 {
        send_all(&mut sim, side, 4);
    }
    for l in 0..3 {
        sim.write(sim.links[l].sides[0], l, 40);
    }
    sim.cut(0, [u16::MAX / 2, 0]);
    sim.cut(2, [0, u16::MAX]);
    sim.pump();
    sim.advance(50);
    for side in 0..3 {
        send_all(&mut sim, side, 2);
    }
    sim.settle();
    sim.check_complete();
    for m in &sim.m {
        assert_eq!(m.delivered_len(), 2 * 6, "{}: six from each peer", m.name);
    }
}

/// Gamma dies with messages in flight both ways and starts again under a new launch id:
/// alpha and beta go over to the new incarnation (what the old one never acknowledged is
/// reported undelivered, never delivered twice) and stream to it. Gamma's address is the
/// old one's: both dial it.
#[test]
fn a_restarted_member_is_a_new_stream() {
    let specs: Vec<Spec> = (0..3).map(|i| spec(i, 0xA1 + i as u64)).collect();
    let mut sim = Sim::with(settings(), &specs);
    sim.pump();
    for side in 0..3 {
        send_all(&mut sim, side, 3);
    }
    for l in 0..3 {
        sim.write(sim.links[l].sides[0], l, 30);
        sim.write(sim.links[l].sides[1], l, 30);
    }
    sim.apply(&Step::Kill { side: 2 });
    sim.pump();
    let gamma = sim.restart(2, &spec(2, 0xC2));
    for side in [0, 1, gamma] {
        send_all(&mut sim, side, 2);
    }
    sim.settle();
    sim.check_complete();
    sim.gather();
    assert_eq!(sim.stats.deaths, 1);
    assert_eq!(
        sim.stats.new_incarnations, 2,
        "alpha and beta each met gamma's new incarnation"
    );
    assert_eq!(
        sim.m[gamma].delivered_len(),
        2 * 2,
        "the two sent to it from each"
    );
}

/// Messages `side` holds in its delivery log from `from` (the payload's first byte names
/// the sender).
fn delivered_from(sim: &Sim, side: Side, from: Side) -> usize {
    let log = sim.m[side].delivered.lock().expect("delivery log");
    log.iter().filter(|(_, p)| p[0] as usize == from).count()
}

/// Beta's handler blocks on alpha's first message and stays blocked for four idle timeouts
/// (two simulated minutes): alpha's window fills and alpha stops; gamma's stream to beta
/// flows meanwhile; heartbeats keep every link alive — nothing is taken for silence,
/// nothing closes or reconnects. When the handler returns, everything alpha sent is
/// delivered once, in order. (A wall-clock test could only watch this for a while.)
#[test]
fn a_handler_blocked_for_many_idle_timeouts_stalls_only_its_sender() {
    const ALPHA: Side = 0;
    const BETA: Side = 1;
    const GAMMA: Side = 2;
    let specs: Vec<Spec> = (0..3).map(|i| spec(i, 0xA1 + i as u64)).collect();
    let mut sim = Sim::with(settings(), &specs);
    sim.pump();
    sim.gather();
    let links = sim.stats.established;
    assert_eq!(links, 6, "three links, each counted at both ends");

    sim.hold(BETA, "alpha");
    // Alpha (its peer 0 is beta) sends more than its window holds: it stops when full.
    for _ in 0..200 {
        sim.send_to(ALPHA, 0, 512);
        sim.pump();
    }
    let sent_by_alpha = sim.m[ALPHA].peers[0].sent.len();
    assert!(
        sent_by_alpha < 200 && sent_by_alpha > 0,
        "alpha's window filled ({sent_by_alpha} sent)"
    );
    let idle = Duration::from_secs(30);
    let mut sent_by_gamma = 0;
    for _ in 0..4 * idle.as_secs() {
        sim.advance(1000);
        // Gamma (its peer 1 is beta) streams one message a second.
        sim.send_to(GAMMA, 1, 64);
        sent_by_gamma += 1;
        sim.pump();
        assert_eq!(
            delivered_from(&sim, BETA, GAMMA),
            sent_by_gamma,
            "gamma's stream flows past the blocked handler"
        );
    }
    assert_eq!(delivered_from(&sim, BETA, ALPHA), 0, "the handler held");
    assert_eq!(
        sim.m[ALPHA].peers[0].sent.len(),
        sent_by_alpha,
        "alpha stayed stopped on its full window"
    );
    for m in &sim.m {
        let timeouts = m.counters.idle_timeouts.load(Ordering::Relaxed);
        assert_eq!(timeouts, 0, "{}: no link taken for silent", m.name);
    }
    sim.gather();
    assert_eq!(
        sim.stats.established, links,
        "no link closed or reconnected"
    );

    sim.release();
    sim.settle();
    assert_eq!(delivered_from(&sim, BETA, ALPHA), sent_by_alpha);
    sim.check_complete();
}
