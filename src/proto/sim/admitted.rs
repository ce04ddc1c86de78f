//! A member admitted as it dials in (`allow_unknown_members`), and the node adding the same
//! name while that admission is on its way: one peer for the name, whatever the order.

use super::harness::Sim;
use super::member::{peer_shared, Settings, Spec, WINDOW};
use crate::proto::Input;

const ALPHA: usize = 0;
const BETA: usize = 1;

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

/// Alpha knows beta's address; beta knows nobody and admits alpha when it dials in.
fn specs() -> [Spec; 2] {
    [
        Spec {
            name: "alpha",
            launch: 0xA1,
            knows: vec![("beta", Some(BETA))],
            journal: false,
            seeds: Vec::new(),
        },
        Spec {
            name: "beta",
            launch: 0xB1,
            knows: Vec::new(),
            journal: false,
            seeds: Vec::new(),
        },
    ]
}

/// Alpha dials in and beta admits it; both stream, exactly once and in order.
#[test]
fn a_member_that_dials_in_is_admitted_and_streams() {
    let mut sim = Sim::with(settings(), &specs());
    sim.pump();
    assert_eq!(sim.m[BETA].peers.len(), 1, "beta admitted alpha");
    for _ in 0..4 {
        sim.send_to(ALPHA, 0, 5);
        sim.send_to(BETA, 0, 5);
    }
    sim.settle();
    sim.check_complete();
    assert_eq!(sim.m[BETA].delivered_len(), 4);
    assert_eq!(sim.m[ALPHA].delivered_len(), 4);
}

/// The node adds alpha (with its address) while alpha's admission is on its way: the
/// command arrives with a state of its own for a name the endpoint already admitted. The
/// endpoint keeps the admitted peer — its connection and its stream — now configured with
/// the address (never forgotten, dialled when its link is lost), and drops the command's
/// state: no second peer for the name, and a send still holding that state fails.
#[test]
fn a_member_added_while_it_is_admitted_stays_one_peer() {
    let mut sim = Sim::with(settings(), &specs());
    sim.pump();
    for _ in 0..3 {
        sim.send_to(ALPHA, 0, 5);
        sim.send_to(BETA, 0, 5);
    }
    sim.pump();
    let admitted = sim.m[BETA].peers[0].shared.clone();
    // The state `Node::add_peer` made.
    let next = sim.m[BETA].peers.len();
    let handoff = sim.m[BETA].handoff.clone();
    let added = peer_shared(next, "alpha".into(), false, &handoff);
    let now = sim.now();
    let alpha_addr = sim.m[ALPHA].addr.clone();
    sim.m[BETA].ep.handle(
        now,
        Input::AddPeer {
            peer: added.clone(),
            addr: Some(alpha_addr.clone()),
        },
    );
    sim.drain(BETA);
    let ep = &sim.m[BETA].ep;
    assert!(ep.peer(added.id).is_none(), "no second peer for the name");
    let p = ep.peer(admitted.id).expect("the admitted peer stays");
    assert!(!p.dynamic, "configured now: never forgotten");
    assert_eq!(p.addr, Some(alpha_addr), "with the address given");
    // The dropped state is closed: a send still holding it fails at its window.
    assert!(
        added
            .outbox
            .window()
            .try_acquire(crate::flow::cost(4))
            .is_err(),
        "a send to the dropped state fails"
    );
    assert_eq!(added.outbox.window().available(), WINDOW);
    // Alpha's link breaks and alpha stays away long enough to be forgotten: beta dials it
    // (it has the address now) and the streams go on exactly once.
    sim.cut(0, [0, 0]);
    for _ in 0..2 {
        sim.send_to(ALPHA, 0, 5);
        sim.send_to(BETA, 0, 5);
    }
    sim.advance(61_000);
    sim.settle();
    sim.check_complete();
    assert!(sim.m[BETA].ep.peer(admitted.id).is_some(), "not forgotten");
    assert_eq!(sim.m[BETA].delivered_len(), 5);
    assert_eq!(sim.m[ALPHA].delivered_len(), 5);
}

/// A member admitted as it dialled in, then gone for `forget_after`, is forgotten: the
/// endpoint retires it as `remove_peer` does — what was sent to it and not acknowledged is
/// reported undelivered, every permit comes back, the application is told — and when it
/// comes back (a new process) it is admitted afresh as another peer and streams exactly
/// once.
#[test]
fn a_member_away_for_forget_after_is_forgotten_and_admitted_afresh() {
    let mut sim = Sim::with(settings(), &specs());
    sim.pump();
    for _ in 0..3 {
        sim.send_to(ALPHA, 0, 5);
        sim.send_to(BETA, 0, 5);
    }
    sim.pump();
    // Two more from beta that alpha never acknowledges: alpha dies first.
    sim.send_to(BETA, 0, 5);
    sim.send_to(BETA, 0, 5);
    sim.kill(ALPHA);
    sim.pump();
    let first = sim.m[BETA].peers[0].shared.clone();
    sim.advance(30_000);
    sim.pump();
    assert_eq!(sim.stats.forgotten, 0, "not yet: {:#?}", sim.stats);
    assert!(sim.m[BETA].ep.peer(first.id).is_some());
    sim.advance(31_000);
    sim.pump();
    assert_eq!(sim.stats.forgotten, 1, "{:#?}", sim.stats);
    assert!(sim.m[BETA].peers[0].forgotten);
    assert!(sim.m[BETA].ep.peer(first.id).is_none());
    assert_eq!(
        sim.m[BETA].peers[0].undelivered.len(),
        2,
        "what alpha never acknowledged is reported"
    );
    // Alpha starts again and dials in: a new peer for the name.
    sim.apply(&super::harness::Step::Restart { side: ALPHA });
    let a2 = sim.m.len() - 1;
    sim.pump();
    assert_eq!(sim.m[BETA].peers.len(), 2, "admitted afresh");
    let again = sim.m[BETA].known("alpha").expect("known again");
    assert_eq!(again, 1);
    sim.send_to(a2, 0, 5);
    sim.send_to(BETA, again, 5);
    sim.settle();
    sim.check_complete();
    assert_eq!(sim.m[a2].delivered_len(), 1);
    assert_eq!(sim.m[BETA].delivered_len(), 4);
}
