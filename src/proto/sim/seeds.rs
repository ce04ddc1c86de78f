//! Seeds: a member that knows only an address dials it, learns who answers there, and
//! streams with it as with a configured peer. (A member's own address among its seeds is
//! tested over real sockets: the simulation does not connect a member to itself.)

use super::harness::Sim;
use super::member::{Settings, Spec};

const ALPHA: usize = 0;
const BETA: usize = 1;

fn settings() -> Settings {
    Settings {
        ack_threshold: 2,
        ack_delay: 10,
        high_water: 1 << 16,
        secret: true,
        both_dial: false,
        journal: false,
    }
}

/// Alpha knows nobody by name, only `seeds` (members whose addresses it has); beta knows
/// `beta_knows`.
fn specs(seeds: Vec<usize>, beta_knows: Vec<(&'static str, Option<usize>)>) -> [Spec; 2] {
    [
        Spec {
            name: "alpha",
            launch: 0xA1,
            knows: Vec::new(),
            journal: false,
            seeds,
        },
        Spec {
            name: "beta",
            launch: 0xB1,
            knows: beta_knows,
            journal: false,
            seeds: Vec::new(),
        },
    ]
}

/// Alpha dials beta's address without a name: it learns "beta" from the handshake, beta
/// admits "alpha", and both stream exactly once, in order.
#[test]
fn a_seed_becomes_the_peer_that_answers_there() {
    let mut sim = Sim::with(settings(), &specs(vec![BETA], Vec::new()));
    sim.pump();
    assert_eq!(sim.m[ALPHA].known("beta"), Some(0), "alpha found beta");
    assert_eq!(sim.m[BETA].known("alpha"), Some(0), "beta admitted alpha");
    for _ in 0..5 {
        sim.send_to(ALPHA, 0, 7);
        sim.send_to(BETA, 0, 7);
    }
    sim.settle();
    sim.check_complete();
    assert_eq!(sim.m[ALPHA].delivered_len(), 5);
    assert_eq!(sim.m[BETA].delivered_len(), 5);
    // The peer has the seed's address: a cut link is dialled again there.
    let p = sim.m[ALPHA].peer().id;
    assert_eq!(
        sim.m[ALPHA].ep.peer(p).and_then(|p| p.addr.clone()),
        Some(sim.m[BETA].addr.clone())
    );
    sim.cut(sim.links.len() - 1, [0, 0]);
    sim.send_to(ALPHA, 0, 7);
    sim.send_to(BETA, 0, 7);
    sim.settle();
    sim.check_complete();
    assert_eq!(sim.m[BETA].delivered_len(), 6);
}

/// A seed at the address of a member alpha knows by name (with no address of its own)
/// gives that member its link: one peer, one established link.
#[test]
fn a_seed_where_a_known_member_listens_gives_that_member_its_link() {
    let mut specs = specs(vec![BETA], Vec::new());
    specs[ALPHA].knows = vec![("beta", None)];
    let mut sim = Sim::with(settings(), &specs);
    sim.pump();
    assert_eq!(sim.m[ALPHA].peers.len(), 1, "no second peer for beta");
    assert_eq!(sim.m[ALPHA].ep.links().filter(|l| l.established).count(), 1);
    sim.send_to(ALPHA, 0, 3);
    sim.send_to(BETA, 0, 3);
    sim.settle();
    sim.check_complete();
}

/// A seed whose member is down at start is dialled again with backoff, and found once it
/// is back (a new process at that address).
#[test]
fn a_seed_down_at_start_is_dialled_again_until_it_answers() {
    let mut sim = Sim::with(settings(), &specs(vec![BETA], Vec::new()));
    sim.kill(BETA);
    sim.pump();
    assert!(sim.m[ALPHA].peers.is_empty());
    sim.apply(&super::harness::Step::Restart { side: BETA });
    let b2 = sim.m.len() - 1;
    for _ in 0..40 {
        sim.advance(50);
        sim.pump();
    }
    assert_eq!(sim.m[ALPHA].known("beta"), Some(0), "found once it is back");
    sim.send_to(ALPHA, 0, 3);
    sim.send_to(b2, 0, 3);
    sim.settle();
    sim.check_complete();
    assert_eq!(sim.m[b2].delivered_len(), 1);
}
