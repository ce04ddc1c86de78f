//! Two members, alpha and beta: the protocol step by step, and random schedules of every
//! fault.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

use super::harness::{Sim, Stats, Step};
use super::member::{Settings, Side, A, B};
use crate::peer::Outgoing;
use crate::proto::Input;
use crate::wire;

// ----- schedules -------------------------------------------------------------------------

fn settings() -> impl Strategy<Value = Settings> {
    (
        1u64..=8,
        1u64..=32,
        2usize..=400,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(ack_threshold, ack_delay, high_water, secret, both_dial, journal)| Settings {
                ack_threshold,
                ack_delay,
                high_water,
                secret,
                both_dial,
                journal,
            },
        )
}

fn side() -> impl Strategy<Value = Side> {
    0..2usize
}

/// Byte counts for a write or read: small (frames split everywhere), medium, everything.
fn amount() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..24, 24usize..256, Just(usize::MAX)]
}

/// One step; `cut` weighs breaks against 32 for everything else.
fn step(cut: u32) -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (side(), 0usize..48).prop_map(|(side, len)| Step::Send { side, len }),
        8 => (side(), any::<usize>(), amount())
            .prop_map(|(side, pick, n)| Step::Write { side, pick, n }),
        8 => (side(), any::<usize>(), amount())
            .prop_map(|(side, pick, n)| Step::Read { side, pick, n }),
        3 => (1u64..16).prop_map(|ms| Step::Advance { ms }),
        cut => (any::<usize>(), any::<[u16; 2]>()).prop_map(|(pick, keep)| Step::Cut { pick, keep }),
        4 => side().prop_map(|side| Step::Dial { side }),
        1 => (side(), 0u64..8, 0u64..4)
            .prop_map(|(side, back, count)| Step::Replay { side, back, count }),
    ]
}

fn schedule(cut: u32, len: usize) -> impl Strategy<Value = (Settings, Vec<Step>)> {
    (settings(), proptest::collection::vec(step(cut), 1..len))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random messages both ways, random partial writes and reads, cuts at random byte
    /// offsets (mid-frame included), half-open links read late, replays, both sides dialling
    /// at once, random ack thresholds and delays: every message is delivered exactly once,
    /// in order, on each side, the counters hold their invariants at every step, and every
    /// permit comes back.
    #[test]
    fn any_cut_point_loses_nothing_and_duplicates_nothing((s, steps) in schedule(1, 400)) {
        Sim::run(s, &steps);
    }

    /// The same under a storm of cuts (about one step in seven breaks a link), handshakes
    /// included: cuts land mid-handshake and mid-resend.
    #[test]
    fn cut_storms_lose_nothing_and_duplicate_nothing((s, steps) in schedule(5, 250)) {
        Sim::run(s, &steps);
    }
}

/// The property tests are only as good as the schedules: 200 of them (deterministic seed)
/// must reach every knob — cuts, lost bytes, resends, replays, duplicates, stale acks,
/// tie-breaks, reconnects.
#[test]
fn schedules_reach_every_knob() {
    let mut runner = TestRunner::deterministic();
    let mut total = Stats::default();
    for i in 0..200 {
        let strategy = if i % 2 == 0 {
            schedule(1, 400).boxed()
        } else {
            schedule(5, 250).boxed()
        };
        let (s, steps) = strategy
            .new_tree(&mut runner)
            .expect("a schedule")
            .current();
        total.add(&Sim::run(s, &steps));
    }
    println!("200 schedules: {total:#?}");
    let s = total;
    for (what, n) in [
        ("cuts", s.cuts),
        ("bytes lost", s.bytes_lost),
        ("resent", s.resent),
        ("replayed", s.replayed),
        ("duplicates dropped", s.duplicates),
        ("stale acks", s.stale_acks),
        ("tie-breaks", s.tie_breaks),
    ] {
        assert!(n > 0, "no schedule reached {what}: {s:#?}");
    }
    assert!(
        s.established > 2 * 200,
        "no reconnect beyond one link per schedule: {s:#?}"
    );
}

// ----- scenarios: the protocol step by step ----------------------------------------------

fn settings_with(ack_threshold: u64) -> Settings {
    Settings {
        ack_threshold,
        ack_delay: 10,
        high_water: 1 << 16,
        secret: false,
        both_dial: false,
        journal: false,
    }
}

fn send_n(sim: &mut Sim, side: Side, n: usize) {
    for _ in 0..n {
        sim.send(side, 3);
    }
}

fn data_len() -> usize {
    wire::data_frame_len(true, 5 + 3)
}

/// The simulated link `side` speaks to its peer on now.
fn current(sim: &mut Sim, side: Side) -> usize {
    let id = sim.m[side]
        .ep
        .peer(sim.m[side].peer().id)
        .and_then(|p| p.link)
        .expect("a link speaks for the peer");
    sim.owner[&(side, id)]
}

/// A pair that exchanged three messages and settled: nothing in flight either way.
fn settled_pair() -> Sim {
    let mut sim = Sim::new(settings_with(100));
    sim.pump();
    send_n(&mut sim, A, 3);
    sim.settle();
    sim
}

/// Moves the clock `ms` on and runs `side`'s timers alone (nobody reads or writes).
fn timers_alone(sim: &mut Sim, side: Side, ms: u64) {
    sim.ms += ms;
    let now = sim.now();
    sim.m[side].ep.handle(now, Input::Timeout);
    sim.drain(side);
}

/// Whole milliseconds until the earliest timer of `sides` (at least 1), as an event loop
/// sleeping until it would wait.
fn ms_to_next_timer(sim: &Sim, sides: &[Side]) -> u64 {
    let next = sides
        .iter()
        .filter_map(|&s| sim.m[s].ep.poll_timeout())
        .min()
        .expect("the tick is always armed");
    let wait = next.saturating_duration_since(sim.now()).as_nanos();
    wait.div_ceil(1_000_000).max(1) as u64
}

/// No faults: the three handshake frames, then data both ways; the threshold acks at once,
/// the timer acks the remainder, and every unacked queue empties.
#[test]
fn handshake_data_and_acks() {
    let mut sim = Sim::new(settings_with(2));
    sim.pump();
    send_n(&mut sim, A, 3);
    assert!(
        sim.m[A].peers[0].shared.outbox.spare_bytes() > 0,
        "alpha encoded runs: their buffer is held while messages are in flight"
    );
    send_n(&mut sim, B, 1);
    sim.pump();
    assert_eq!(sim.m[B].delivered_len(), 3);
    assert_eq!(sim.m[A].delivered_len(), 1);
    // beta acked at the threshold (2 owed) or later; alpha's one message waits for the timer.
    assert!(sim.m[A].desc().acked() >= 2);
    assert_eq!(sim.m[B].desc().acked(), 0);
    sim.advance(10);
    sim.pump();
    assert_eq!((sim.m[A].desc().acked(), sim.m[B].desc().acked()), (3, 1));
    sim.settle();
    sim.check_complete();
    // Idle, everything acknowledged: the tick lets the run buffers go.
    sim.advance(1000);
    for s in [A, B] {
        assert_eq!(
            sim.m[s].peers[0].shared.outbox.spare_bytes(),
            0,
            "member {s}"
        );
    }
}

/// A probe (the sender's window ran dry) reaching a member that holds no credit is answered
/// with nothing and leaves no flush request behind: had it left one, the pool's next request
/// (half a window consumed) would find it set and be swallowed, and that credit would wait
/// for the sender's next probe.
#[test]
fn a_probe_answered_with_no_credit_leaves_no_flush_request_behind() {
    let mut sim = Sim::new(settings_with(2));
    sim.pump();
    send_n(&mut sim, A, 3);
    sim.pump();
    sim.advance(10);
    sim.pump();
    assert_eq!(
        sim.m[B].peer().credit.pending(),
        0,
        "every ack took the credit"
    );
    let l = current(&mut sim, A);
    let mut probe = Vec::new();
    wire::encode_probe(&mut probe);
    sim.links[l].from(A).extend(probe);
    sim.read(B, l, usize::MAX);
    assert!(
        sim.m[B].peer().credit.request_flush(),
        "a flush request was left set by the probe's answer"
    );
}

/// A cut in the middle of the second frame: beta delivers the first and throws the torn
/// one away; on the redial alpha resends exactly messages 2 and 3.
#[test]
fn cut_mid_frame_resends_only_what_the_peer_lacks() {
    let mut sim = Sim::new(settings_with(100));
    sim.pump();
    send_n(&mut sim, A, 3);
    let l = current(&mut sim, A);
    sim.write(A, l, usize::MAX);
    sim.read(B, l, data_len() + data_len() / 2);
    assert_eq!(sim.m[B].delivered_len(), 1);
    sim.cut(l, [0, 0]);
    sim.pump(); // both read EOF
    sim.advance(50); // alpha's reconnect timer
    sim.pump();
    sim.gather();
    assert_eq!(sim.stats.resent, 2);
    assert_eq!(sim.m[B].delivered_len(), 3);
    assert_eq!(sim.stats.duplicates, 0);
    sim.settle();
    sim.check_complete();
}

/// A request queued while the link is down, and given up by its requester before the link
/// is back, is withdrawn when the endpoint publishes again: never sent (beta delivers only
/// the regular messages around it, in order), its permits back, counted `filtered` and
/// `withdrawn`. (No sweep runs first: the requester here does not flag the withdrawal, so
/// publishing is what finds it.)
#[test]
fn a_request_given_up_before_it_left_is_withdrawn_at_publish() {
    let mut sim = Sim::new(settings_with(1));
    sim.pump();
    send_n(&mut sim, A, 1);
    sim.pump();
    let l = current(&mut sim, A);
    sim.cut(l, [0, 0]);
    sim.pump();
    let peer = sim.m[A].peer().clone();
    let (id, slot) = peer.requests.register(None).expect("room");
    let permit = peer
        .outbox
        .window()
        .try_acquire(Outgoing::request_cost(3, 64))
        .expect("room in the window");
    let request = Outgoing::request(id, 64, b"old", false, None, permit);
    assert!(peer.outbox.admit(request).is_ok(), "open");
    let now = sim.now();
    sim.m[A].ep.handle(now, Input::Publish(peer.id));
    sim.drain(A);
    assert!(peer.requests.forget(id), "it timed out, still queued");
    send_n(&mut sim, A, 1);
    sim.advance(50); // alpha's reconnect timer
    sim.pump();
    sim.advance(50);
    sim.pump();
    assert_eq!(sim.m[B].delivered_len(), 2);
    let c = &peer.counters;
    let get = crate::peer::Counters::get;
    assert_eq!(
        (get(&c.withdrawn), get(&c.filtered), get(&c.sent)),
        (1, 1, 2)
    );
    assert!(slot.try_take().is_none(), "nobody waits for it");
    sim.settle();
    sim.check_complete();
}

/// Beta's ack leaves its buffer (so `acks_sent` advances) and dies in flight. Nothing is
/// lost: the handshake says how much beta holds, so alpha retires it all and resends
/// nothing.
#[test]
fn an_ack_lost_with_the_link_is_replaced_by_the_handshake() {
    let mut sim = Sim::new(settings_with(1));
    sim.pump();
    send_n(&mut sim, A, 3);
    let l = current(&mut sim, A);
    sim.write(A, l, usize::MAX);
    sim.read(B, l, usize::MAX);
    sim.write(B, l, usize::MAX);
    assert_eq!(sim.m[B].desc().acks_sent(), 3, "written: counts as sent");
    sim.cut(l, [0, 0]);
    sim.pump();
    assert_eq!(sim.m[A].desc().unacked_len(), 3, "the ack never arrived");
    sim.advance(50);
    sim.pump();
    sim.gather();
    assert_eq!(sim.stats.resent, 0);
    assert_eq!(sim.m[A].desc().unacked_len(), 0);
    sim.settle();
    sim.check_complete();
}

/// The link replays messages 1 and 2 after a reconnect, and an old ack: beta drops both as
/// duplicates (still delivered once), alpha ignores the stale ack.
#[test]
fn replayed_frames_are_dropped_as_duplicates() {
    let mut sim = Sim::new(settings_with(1));
    sim.pump();
    send_n(&mut sim, A, 3);
    sim.pump();
    let l = current(&mut sim, A);
    sim.cut(l, [u16::MAX, u16::MAX]);
    sim.pump();
    sim.advance(50);
    sim.pump();
    sim.replay(B, 2, 1);
    sim.replay(A, 0, 0);
    sim.pump();
    sim.gather();
    assert_eq!(sim.stats.duplicates, 2);
    assert_eq!(sim.m[B].delivered_len(), 3);
    assert_eq!(sim.m[A].desc().acked(), 3, "a stale ack does not go back");
    sim.settle();
    sim.check_complete();
}

/// Reorder across connections. The link breaks with three of alpha's messages in flight;
/// beta has not noticed (half-open) when alpha redials. If beta reads the old link's tail
/// before the new link identifies, it delivers them from there and its Ready says so:
/// alpha resends nothing. If not, the tail is lost when the new link replaces the old one,
/// and alpha resends all three. Exactly once either way.
#[test]
fn a_half_open_link_is_read_until_the_new_handshake_then_dropped() {
    for read_tail_first in [true, false] {
        let mut sim = Sim::new(settings_with(100));
        sim.pump();
        send_n(&mut sim, A, 3);
        let old = current(&mut sim, A);
        sim.write(A, old, usize::MAX);
        sim.cut(old, [u16::MAX, u16::MAX]);
        sim.read(A, old, usize::MAX); // alpha reads EOF; beta does not notice
        sim.advance(50); // alpha's reconnect timer
        assert!(sim.dial(A));
        let new = sim.links.len() - 1;
        sim.write(B, new, usize::MAX); // Hello
        sim.read(A, new, usize::MAX); // alpha answers HelloReply(received 0)
        sim.write(A, new, usize::MAX);
        if read_tail_first {
            sim.read(B, old, usize::MAX);
            assert_eq!(sim.m[B].delivered_len(), 3);
        }
        sim.read(B, new, usize::MAX); // identifies the new link: the old one is closed
        assert!(sim.links[old].end(B).is_none());
        sim.pump();
        sim.gather();
        assert_eq!(sim.stats.resent, if read_tail_first { 0 } else { 3 });
        assert_eq!(sim.m[B].delivered_len(), 3);
        assert_eq!(sim.stats.duplicates, 0);
        sim.settle();
        sim.check_complete();
    }
}

/// The tie-break against a half-open link. Alpha dialled the first link; it breaks and only
/// beta notices. Beta redials. At alpha the new link (dialled by beta) and the old (dialled
/// by alpha, established) would look like a simultaneous dial, but beta's HelloReply says it
/// has established as many connections with alpha as alpha has with it: beta has seen the
/// old link and dials again, so it is dead on its side. Alpha replaces it at once instead of
/// refusing beta until its idle timeout.
#[test]
fn a_redial_against_a_half_open_link_replaces_it() {
    let mut sim = Sim::new(Settings {
        both_dial: true,
        ..settings_with(100)
    });
    sim.dial(A);
    sim.pump(); // beta's own dial request is refused by the tie-break or never made
    send_n(&mut sim, B, 2);
    let old = current(&mut sim, A);
    sim.cut(old, [0, 0]);
    sim.read(B, old, usize::MAX); // beta reads EOF; alpha does not notice
    sim.advance(50); // beta's reconnect timer
    assert!(sim.dial(B));
    let new = sim.links.len() - 1;
    sim.write(A, new, usize::MAX); // Hello
    sim.read(B, new, usize::MAX); // beta answers HelloReply(connections 1)
    sim.write(B, new, usize::MAX);
    sim.read(A, new, usize::MAX); // alpha identifies beta's link and replaces the old one
    assert_eq!(
        current(&mut sim, A),
        new,
        "alpha dropped the dead link for the live one"
    );
    sim.pump();
    sim.gather();
    assert_eq!(
        sim.stats.resent, 2,
        "what the dead link swallowed is resent"
    );
    sim.settle();
    sim.check_complete();
}

/// With a shared secret the handshake carries nonces and MACs and nothing else changes: data
/// both ways, a cut mid-stream, a redial that resends exactly what the peer lacks.
#[test]
fn an_authenticated_handshake_changes_nothing_else() {
    let mut sim = Sim::new(Settings {
        secret: true,
        ..settings_with(100)
    });
    sim.pump();
    send_n(&mut sim, A, 3);
    send_n(&mut sim, B, 2);
    let l = current(&mut sim, A);
    sim.write(A, l, usize::MAX);
    sim.read(B, l, data_len() + data_len() / 2);
    sim.cut(l, [0, 0]);
    sim.pump();
    sim.advance(50);
    sim.pump();
    sim.gather();
    // alpha's 2 that beta lacks, and beta's 2 that were never written.
    assert_eq!(sim.stats.resent, 4);
    sim.settle();
    sim.check_complete();
    assert_eq!(sim.stats.auth_refusals, 0);
}

/// The delayed ack and the idle-timeout clock run in simulated time: an hour of silence on
/// a link whose peer writes heartbeats closes nothing, and nothing more is sent than the
/// heartbeats — a property a wall-clock test could only wait for.
#[test]
fn an_hour_of_quiet_costs_only_heartbeats() {
    let mut sim = Sim::new(settings_with(100));
    sim.pump();
    send_n(&mut sim, A, 1);
    sim.settle();
    let acked = sim.m[A].desc().acked();
    for _ in 0..3600 {
        sim.advance(1000);
        sim.pump();
    }
    sim.gather();
    assert_eq!(sim.m[A].desc().acked(), acked);
    assert_eq!(sim.stats.established, 2, "the first link lived the hour");
    let idle = sim.m[A]
        .counters
        .idle_timeouts
        .load(crate::sync::atomic::Ordering::Relaxed);
    assert_eq!(idle, 0);
    sim.check_complete();
}

/// A pair with nothing in flight puts its housekeeping tick off until a link's next
/// heartbeat or idle deadline: driven as the IO thread drives it, each step sleeping until
/// the earlier of the two endpoints' next timers, a quiet minute takes a few wake-ups a
/// heartbeat (the tick's own 10 ms would take 100 a second; a read of a heartbeat or a
/// probe bringing the tick back, two a second), keeps the link; a send brings the tick
/// back within a tick, on both sides, one tick in each timer heap, and the stream
/// completes.
#[test]
fn a_quiet_pair_wakes_a_few_times_a_heartbeat() {
    use std::time::Duration;
    let mut sim = settled_pair();
    let start = sim.now();
    let mut wakes = 0u64;
    while sim.now() < start + Duration::from_secs(60) {
        let ms = ms_to_next_timer(&sim, &[A, B]);
        sim.advance(ms);
        sim.pump();
        wakes += 1;
    }
    for side in [A, B] {
        let (put_off, at) = sim.m[side].ep.tick_plan();
        assert!(put_off, "side {side}: the tick is put off");
        assert!(at > sim.now() + Duration::from_millis(10), "side {side}");
    }
    assert!(
        wakes <= 90,
        "{wakes} wake-ups in a quiet minute (the tick alone: 6000)"
    );
    sim.gather();
    assert_eq!(sim.stats.established, 2, "the first link lived the minute");
    // A send brings the sender's tick back, and the data read brings the receiver's.
    send_n(&mut sim, A, 1);
    let (put_off, at) = sim.m[A].ep.tick_plan();
    assert!(!put_off);
    assert!(at <= sim.now() + Duration::from_millis(10));
    sim.pump();
    let (put_off, at) = sim.m[B].ep.tick_plan();
    assert!(!put_off);
    assert!(at <= sim.now() + Duration::from_millis(10));
    sim.settle();
    sim.check_complete();
}

/// A quiet endpoint whose peer falls silent judges the link at its idle deadline, not at
/// the next heartbeat after it: the put-off tick is armed for the earlier of the two.
/// alpha alone is driven, each step to its next timer, and reads nothing more.
#[test]
fn a_quiet_link_that_falls_silent_is_closed_at_its_idle_deadline() {
    use crate::sync::atomic::Ordering;
    use std::time::Duration;
    let mut sim = settled_pair();
    let last_read = sim.m[A]
        .ep
        .links()
        .find(|l| l.established)
        .expect("an established link")
        .last_read;
    let idle = |sim: &Sim| sim.m[A].counters.idle_timeouts.load(Ordering::Relaxed);
    let mut wakes = 0u64;
    while idle(&sim) == 0 {
        assert!(wakes < 1000, "the silent link was never judged");
        let ms = ms_to_next_timer(&sim, &[A]);
        timers_alone(&mut sim, A, ms);
        wakes += 1;
    }
    let deadline = last_read + Duration::from_secs(30);
    assert!(sim.now() >= deadline);
    assert!(
        sim.now() <= deadline + Duration::from_millis(10),
        "judged {:?} after its deadline",
        sim.now() - deadline
    );
    // About one wake-up a heartbeat over the 30 s (the tick alone: 3000).
    assert!(wakes <= 2 * 30, "{wakes} wake-ups");
}

/// A peer whose sends would ring nobody keeps the tick: away, with messages sent to it
/// (its `Scheduled` flag left set by the publish that found no link), the next send to it
/// neither lists it nor wakes the IO thread, so only the tick expires that send's ttl or
/// withdraws a request given up. alpha's peer is cut off and waits for its redial; with
/// the flag set, every tick comes a tick after the last; once it is clear (nothing sent
/// since), the tick is put off again.
#[test]
fn a_peer_whose_sends_ring_nobody_keeps_the_tick() {
    use std::time::Duration;
    let mut sim = settled_pair();
    let l = current(&mut sim, A);
    sim.cut(l, [0, 0]);
    sim.pump();
    sim.m[A].peer().scheduled.hold();
    for _ in 0..20 {
        timers_alone(&mut sim, A, 10);
    }
    let (put_off, at) = sim.m[A].ep.tick_plan();
    assert!(!put_off, "a tick put off with a send that rings nobody");
    assert!(at <= sim.now() + Duration::from_millis(10));
    sim.m[A].peer().scheduled.clear_then(|| ());
    for _ in 0..3 {
        timers_alone(&mut sim, A, 10);
    }
    assert!(sim.m[A].ep.tick_plan().0, "nothing left for the tick");
}

/// `remove_peer` while a reconnect is scheduled (the Pulsar interleaving): the link breaks,
/// a reconnect is scheduled, the peer is removed during the backoff. Ten simulated minutes
/// later nothing has asked for a connection, and no timer is left but the tick — what a
/// wall-clock test could only watch for a while.
#[test]
fn a_removed_peer_is_never_dialled_again() {
    let mut sim = Sim::new(settings_with(1));
    sim.pump();
    send_n(&mut sim, A, 2);
    sim.pump();
    let l = current(&mut sim, A);
    sim.cut(l, [0, 0]);
    sim.pump(); // both read EOF: alpha schedules a reconnect
    assert!(
        sim.m[A].dials.is_empty(),
        "the reconnect is scheduled, not due"
    );
    let (now, id) = (sim.now(), sim.m[A].peer().id);
    sim.m[A].ep.handle(now, Input::RemovePeer(id));
    sim.drain(A);
    for _ in 0..600 {
        timers_alone(&mut sim, A, 1000);
        assert!(
            sim.m[A].dials.is_empty(),
            "a removed peer was dialled again"
        );
    }
    let timers = sim.m[A]
        .counters
        .timers
        .load(crate::sync::atomic::Ordering::Relaxed);
    assert_eq!(timers, 1, "only the housekeeping tick is left");
    assert!(sim.m[A].ep.peer(id).is_none());
    assert_eq!(sim.m[A].ep.links().count(), 0);
}

/// A journalling sender whose writer lags: nothing of a message leaves before the batch
/// holding its record is appended — not on the link it was published to, and not when the
/// link breaks and a new one resends it (the resend holds no new record, but depends on the
/// batch still on its way).
#[test]
fn nothing_leaves_before_the_journal_holds_it_even_resent_on_a_new_link() {
    let mut sim = Sim::new(Settings {
        journal: true,
        ..settings_with(100)
    });
    for _ in 0..4 {
        sim.journal_catch_up(A); // the handshake's binding of beta's incarnation
        sim.pump();
    }
    send_n(&mut sim, A, 3);
    let l = current(&mut sim, A);
    sim.write(A, l, usize::MAX);
    assert!(
        sim.links[l].from(A).is_empty(),
        "left before its batch was appended"
    );
    sim.cut(l, [0, 0]);
    sim.pump(); // both read EOF
    sim.advance(50); // alpha redials
    sim.pump(); // the new link's handshake; alpha resends the three
    let new = current(&mut sim, A);
    assert_ne!(new, l);
    assert_eq!(
        sim.m[B].delivered_len(),
        0,
        "a resend left before its batch was appended"
    );
    sim.journal_catch_up(A);
    sim.pump();
    assert_eq!(sim.m[B].delivered_len(), 3);
    sim.settle();
    sim.check_complete();
}

/// A handshake answer made before acks the same member sent on another link is stale, not
/// the mark of a member that lost its state for us. Both members dial at once: beta answers
/// alpha's Hello on its own dial `y`, then keeps alpha's dial `x` (the tie-break) and drops
/// `y`, its answer already sent; over `x` it acknowledges two messages. `x` breaks, and
/// only then does alpha read beta's answer on `y`: it says beta holds none of alpha's
/// messages. Beta holds both: alpha must not start its stream afresh (reporting them
/// undelivered and numbering new ones from 1 again, which beta would drop as duplicates).
#[test]
fn a_handshake_answered_before_acks_on_another_link_resets_nothing() {
    const ALL: usize = usize::MAX;
    let mut sim = Sim::new(Settings {
        both_dial: true,
        ..settings_with(1)
    });
    assert!(sim.dial(A));
    let x = sim.links.len() - 1;
    assert!(sim.dial(B));
    let y = sim.links.len() - 1;
    // On y, beta's dial, beta answers alpha's Hello; alpha reads the answer only later.
    sim.write(A, y, ALL);
    sim.read(B, y, ALL);
    sim.write(B, y, ALL);
    // On x, alpha's dial, the handshake completes; beta keeps x and drops y.
    sim.write(B, x, ALL);
    sim.read(A, x, ALL);
    sim.write(A, x, ALL);
    sim.read(B, x, ALL);
    assert!(sim.links[y].end(B).is_none(), "beta kept alpha's dial");
    sim.write(B, x, ALL);
    sim.read(A, x, ALL);
    assert_eq!(current(&mut sim, A), x);
    // Two messages over x, acknowledged.
    send_n(&mut sim, A, 2);
    sim.write(A, x, ALL);
    sim.read(B, x, ALL);
    sim.write(B, x, ALL);
    sim.read(A, x, ALL);
    assert_eq!(sim.m[A].desc().acked(), 2);
    // x breaks; alpha notices, then reads beta's old answer on y.
    sim.cut(x, [0, 0]);
    sim.read(A, x, ALL);
    sim.read(A, y, ALL);
    sim.check();
    sim.settle();
    sim.check_complete();
}

/// A journalling member whose writer fails stops at once (fail-stop): what its journal
/// appended may still have left, the rest never does — not in a write, not in the last
/// bytes of a close — and the process ends. Its restart, without that journal, is a new
/// incarnation: its peer reports what it had sent the failed one and goes on with the new
/// one, exactly once.
#[test]
fn a_failed_journal_stops_the_member_and_nothing_unjournalled_leaves() {
    let mut sim = Sim::new(Settings {
        journal: true,
        ..settings_with(1)
    });
    for _ in 0..4 {
        sim.journal_catch_up(A); // the handshake's binding of beta's incarnation
        sim.pump();
    }
    send_n(&mut sim, A, 3);
    send_n(&mut sim, B, 2);
    sim.journal_catch_up(A);
    sim.pump();
    assert_eq!(sim.m[B].delivered_len(), 3);
    // Three more, published into the write buffer but not appended; the writer fails.
    send_n(&mut sim, A, 3);
    let l = current(&mut sim, A);
    sim.write(A, l, usize::MAX);
    sim.apply(&Step::JournalFail { side: A });
    assert_eq!(sim.stats.journal_failures, 1);
    assert!(sim.m[A].journal_failed);
    assert!(sim.m[A].dead, "the node stopped once its shutdown was done");
    sim.pump();
    sim.check();
    assert_eq!(
        sim.m[B].delivered_len(),
        3,
        "a message the journal never held reached the peer"
    );
    // Its restart (the journal lost) binds beta anew.
    sim.apply(&Step::Restart { side: A });
    let a2 = sim.m.len() - 1;
    send_n(&mut sim, a2, 2);
    sim.send(B, 3);
    for _ in 0..4 {
        sim.journal_catch_up(a2);
        sim.pump();
    }
    sim.settle();
    sim.check_complete();
    assert_eq!(sim.m[B].delivered_len(), 5, "the old three, the new two");
    assert_eq!(sim.stats.new_incarnations, 1, "{:#?}", sim.stats);
}
