//! Three members, each knowing the other two: every pair is its own stream.

use super::harness::{Settings, Side, Sim, Spec, Step};

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
