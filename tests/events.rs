//! Membership events (`Builder::on_event`): a peer's `Connected` and `Disconnected`
//! alternate across connection cuts, a restarted peer gives exactly one `NewIncarnation`
//! with the count `on_undelivered` was given, a refused handshake gives `Refused`, a member
//! admitted at run time is forgotten after `forget_after` (and `broadcast` leaves it out),
//! and a slow callback keeps the queue bounded, counting what it drops.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cohort::{DisconnectReason, Event, Node, RefuseReason};
use support::proxy::Proxy;
use support::*;

/// Every event a node's callback was given, in order.
#[derive(Default)]
struct Log(Mutex<Vec<Event>>);

impl Log {
    fn new() -> Arc<Log> {
        Arc::new(Log::default())
    }

    /// A callback that records into this log.
    fn callback(self: &Arc<Self>) -> impl Fn(Event) + Send + Sync + 'static {
        let log = self.clone();
        move |e| log.0.lock().unwrap().push(e)
    }

    fn events(&self) -> Vec<Event> {
        self.0.lock().unwrap().clone()
    }

    fn count(&self, what: impl Fn(&Event) -> bool) -> usize {
        self.0.lock().unwrap().iter().filter(|e| what(e)).count()
    }

    /// The `Connected` and `Disconnected` events about `peer`, as `true` and `false`.
    fn ups_and_downs(&self, peer: &str) -> Vec<bool> {
        self.events()
            .iter()
            .filter_map(|e| match e {
                Event::Connected { peer: p, .. } if p == peer => Some(true),
                Event::Disconnected { peer: p, .. } if p == peer => Some(false),
                _ => None,
            })
            .collect()
    }
}

/// Asserts that `Connected` and `Disconnected` alternate, starting with `Connected`.
fn assert_alternate(ups: &[bool], who: &str) {
    for (i, up) in ups.iter().enumerate() {
        assert_eq!(*up, i % 2 == 0, "{who}: event {i} out of turn in {ups:?}");
    }
}

fn is_connected_event(e: &Event, peer: &str) -> bool {
    matches!(e, Event::Connected { peer: p, .. } if p == peer)
}

/// Over a proxy that cuts the connection five times, each cut gives the dialler a
/// `Disconnected` then a `Connected` again (never two `Connected` in a row), and the same on
/// the side that accepts; the shutdown ends with a `Disconnected` for the shutdown.
#[test]
fn cuts_give_disconnected_then_connected_in_order() {
    const CUTS: usize = 5;
    let (la, lb) = (Log::new(), Log::new());
    let b = receiver_b("t-events-cuts", "127.0.0.1:0")
        .on_event(lb.callback())
        .start()
        .expect("b starts");
    let proxy = Proxy::start("ev", b.local_addr(), 0xE7E7_0001, 512);
    let a = sender_a("t-events-cuts", proxy.addr(), None)
        .redial_quickly()
        .on_event(la.callback())
        .start()
        .expect("a starts");
    for cut in 0..=CUTS {
        wait_until_or(
            PATIENCE,
            || la.count(|e| is_connected_event(e, "b")) == cut + 1,
            || format!("connection {} of a; events {:?}", cut + 1, la.events()),
        );
        // Some traffic on each connection.
        send_patiently(&a.sender(), "b", payload(cut as u64, 64));
        if cut < CUTS {
            wait_until("a connection to cut", PATIENCE, || proxy.live() > 0);
            proxy.cut_all();
            wait_until_or(
                PATIENCE,
                || la.ups_and_downs("b").len() == 2 * (cut + 1),
                || format!("cut {cut} seen by a; events {:?}", la.events()),
            );
        }
    }
    a.shutdown(SHUTDOWN).expect("a shuts down");
    b.shutdown(SHUTDOWN).expect("b shuts down");
    proxy.stop();

    let ups = la.ups_and_downs("b");
    assert_alternate(&ups, "a about b");
    assert_eq!(ups.len(), 2 * (CUTS + 1), "{:?}", la.events());
    let events = la.events();
    let reasons: Vec<DisconnectReason> = events
        .iter()
        .filter_map(|e| match e {
            Event::Disconnected { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect();
    assert!(
        reasons[..CUTS]
            .iter()
            .all(|r| matches!(r, DisconnectReason::PeerClosed | DisconnectReason::Io)),
        "cuts: {reasons:?}"
    );
    assert_eq!(reasons[CUTS], DisconnectReason::Shutdown, "{reasons:?}");
    for e in &events {
        if let Event::Connected { incarnation, .. } = e {
            assert_eq!(*incarnation, b.launch_id(), "{events:?}");
        }
    }
    let ups = lb.ups_and_downs("a");
    assert_alternate(&ups, "b about a");
    assert!(ups.len() >= 2 * CUTS, "{:?}", lb.events());
    assert_eq!(ups.last(), Some(&false), "{:?}", lb.events());
    assert_eq!(
        la.count(|e| matches!(e, Event::NewIncarnation { .. })),
        0,
        "no restart: {events:?}"
    );
}

/// A peer that restarts as a new node (a new launch id) on the same address gives the
/// survivor exactly one `NewIncarnation`, between the old incarnation's `Disconnected` and
/// the new one's `Connected`, counting as many undelivered messages as `on_undelivered` was
/// given: the ones the old incarnation received and never acknowledged.
#[test]
fn a_restarted_peer_gives_one_new_incarnation_with_the_undelivered_count() {
    const UNACKED: u64 = 20;
    let held = HeldAddr::new();
    // A victim that never acknowledges: no ack threshold or delay reached, and the little it
    // consumes never returns credit (no credit on idle, far below half its window).
    let victim = || {
        Node::builder("victim")
            .cluster("t-events-restart")
            .listen(held.addr())
            .allow_unknown_members(true)
            .ack_threshold(u64::MAX)
            .ack_delay(Duration::from_secs(3600))
            .credit_on_idle(false)
            .start()
            .expect("victim starts")
    };
    let log = Log::new();
    let reported = Arc::new(AtomicU64::new(0));
    let r = reported.clone();
    let survivor = Node::builder("survivor")
        .cluster("t-events-restart")
        .peer("victim", held.addr())
        .redial_quickly()
        .on_undelivered(move |_, msgs| {
            r.fetch_add(msgs.len() as u64, Ordering::SeqCst);
        })
        .on_event(log.callback())
        .start()
        .expect("survivor starts");
    let first = victim();
    wait_until_or(
        PATIENCE,
        || log.count(|e| is_connected_event(e, "victim")) == 1,
        || format!("the first connection; stats:\n{}", survivor.stats()),
    );
    let tx = survivor.sender();
    for i in 0..UNACKED {
        send_patiently(&tx, "victim", payload(i, 8));
    }
    wait_until_or(
        PATIENCE,
        || peer_stats(&first, "survivor").received == UNACKED,
        || format!("the victim to receive; stats:\n{}", first.stats()),
    );
    let first_launch = first.launch_id();
    first
        .shutdown(SHUTDOWN)
        .expect("the first victim shuts down");
    wait_until_or(
        PATIENCE,
        || log.ups_and_downs("victim") == [true, false],
        || format!("the survivor to see it go; events {:?}", log.events()),
    );
    assert_eq!(reported.load(Ordering::SeqCst), 0);

    let second = victim();
    assert_ne!(second.launch_id(), first_launch);
    wait_until_or(
        PATIENCE,
        || log.count(|e| is_connected_event(e, "victim")) == 2,
        || format!("the second connection; events {:?}", log.events()),
    );
    // The undelivered callback runs before the event is queued; it has been called.
    let undelivered = reported.load(Ordering::SeqCst);
    survivor.shutdown(SHUTDOWN).expect("survivor shuts down");
    second
        .shutdown(SHUTDOWN)
        .expect("the second victim shuts down");

    let events = log.events();
    let incarnations: Vec<(u64, u64)> = events
        .iter()
        .filter_map(|e| match e {
            Event::NewIncarnation {
                peer,
                incarnation,
                undelivered,
            } if peer == "victim" => Some((*incarnation, *undelivered)),
            _ => None,
        })
        .collect();
    assert_eq!(
        incarnations,
        [(second.launch_id(), undelivered)],
        "{events:?}"
    );
    assert_eq!(undelivered, UNACKED, "{events:?}");
    let about_victim: Vec<&Event> = events
        .iter()
        .filter(|e| e.peer() == Some("victim"))
        .collect();
    assert!(
        matches!(
            about_victim[..],
            [
                Event::Connected { incarnation: i1, .. },
                Event::Disconnected { .. },
                Event::NewIncarnation { .. },
                Event::Connected { incarnation: i2, .. },
                Event::Disconnected {
                    reason: DisconnectReason::Shutdown,
                    ..
                },
            ] if *i1 == first_launch && *i2 == second.launch_id()
        ),
        "{about_victim:?}"
    );
}

/// A handshake refused for the wrong cluster, and one refused for the wrong secret, give
/// `Refused` on both sides: the dialler names the member it dialled, the acceptor the
/// address the connection came from.
#[test]
fn refused_handshakes_give_refused() {
    for (case, cluster, secret, reason) in [
        (
            "cluster",
            "t-events-other",
            None,
            RefuseReason::WrongCluster,
        ),
        (
            "secret",
            "t-events-refused",
            Some(&b"another secret, 32 bytes at least"[..]),
            RefuseReason::Auth,
        ),
    ] {
        let (la, lb) = (Log::new(), Log::new());
        let b = Node::builder("b")
            .cluster("t-events-refused")
            .secret(b"the cluster's secret, 32 bytes at least")
            .allow_unknown_members(true)
            .on_event(lb.callback())
            .start()
            .expect("b starts");
        let a = Node::builder("a").cluster(cluster);
        let a = match secret {
            Some(s) => a.secret(s),
            None => a.secret(b"the cluster's secret, 32 bytes at least"),
        };
        let a = a
            .peer("b", b.local_addr())
            .on_event(la.callback())
            .start()
            .expect("a starts");
        let refused = |e: &Event| matches!(e, Event::Refused { reason: r, .. } if *r == reason);
        wait_until_or(
            PATIENCE,
            || la.count(refused) > 0 && lb.count(refused) > 0,
            || {
                format!(
                    "{case}: refusals on both sides; a {:?}, b {:?}",
                    la.events(),
                    lb.events()
                )
            },
        );
        a.shutdown(SHUTDOWN).expect("a shuts down");
        b.shutdown(SHUTDOWN).expect("b shuts down");
        for e in la.events().iter().filter(|e| refused(e)) {
            let Event::Refused { peer, addr, .. } = e else {
                unreachable!()
            };
            assert_eq!(peer.as_deref(), Some("b"), "{case}: {e:?}");
            assert_eq!(*addr, Some(b.listen_addr()), "{case}: {e:?}");
        }
        for e in lb.events().iter().filter(|e| refused(e)) {
            let Event::Refused { addr, .. } = e else {
                unreachable!()
            };
            assert!(
                addr.as_ref()
                    .and_then(|a| a.as_tcp())
                    .is_some_and(|a| a.ip() == b.local_addr().ip()),
                "{case}: {e:?}"
            );
        }
        for log in [&la, &lb] {
            assert_eq!(
                log.count(|e| matches!(e, Event::Connected { .. })),
                0,
                "{case}: {:?}",
                log.events()
            );
        }
    }
}

/// A member admitted at run time that leaves is forgotten once it has stayed disconnected
/// for `forget_after`: `Forgotten` follows its `Disconnected`, it is no longer a peer and
/// `broadcast` leaves it out; what was queued for it fails. A configured peer, down since
/// the start, is never forgotten.
#[test]
fn an_unknown_member_that_leaves_is_forgotten() {
    let down = HeldAddr::new();
    let log = Log::new();
    let registry = Node::builder("registry")
        .cluster("t-events-forget")
        .allow_unknown_members(true)
        .forget_after(Duration::from_millis(300))
        .peer("configured", down.addr())
        .on_event(log.callback())
        .start()
        .expect("registry starts");
    let member = Node::builder("member")
        .cluster("t-events-forget")
        .peer("registry", registry.local_addr())
        .start()
        .expect("member starts");
    wait_until_or(
        PATIENCE,
        || log.count(|e| is_connected_event(e, "member")) == 1,
        || format!("the member admitted; stats:\n{}", registry.stats()),
    );
    assert_eq!(registry.peers(), ["configured", "member"]);
    let names = |r: Vec<(String, Result<(), cohort::SendError<cohort::Bytes>>)>| -> Vec<String> {
        r.into_iter().map(|(n, _)| n).collect()
    };
    assert_eq!(
        names(registry.broadcast(&b"hello"[..])),
        ["configured", "member"]
    );
    member.shutdown(SHUTDOWN).expect("member shuts down");
    wait_until_or(
        PATIENCE,
        || log.ups_and_downs("member") == [true, false],
        || format!("the member gone; events {:?}", log.events()),
    );
    // Queued while it is gone: fails when it is forgotten.
    registry
        .try_send("member", &b"queued"[..])
        .expect("queued for a disconnected member");
    wait_until_or(
        PATIENCE,
        || log.count(|e| matches!(e, Event::Forgotten { peer } if peer == "member")) == 1,
        || format!("the member forgotten; events {:?}", log.events()),
    );
    assert_eq!(registry.peers(), ["configured"]);
    assert_eq!(names(registry.broadcast(&b"hello"[..])), ["configured"]);
    assert!(matches!(
        registry
            .send("member", &b"late"[..])
            .map_err(cohort::Error::from),
        Err(cohort::Error::UnknownPeer(_))
    ));
    let about_member: Vec<Event> = log
        .events()
        .into_iter()
        .filter(|e| e.peer() == Some("member"))
        .collect();
    assert!(
        matches!(
            &about_member[..],
            [
                Event::Connected { .. },
                Event::Disconnected { .. },
                Event::Forgotten { .. }
            ]
        ),
        "{about_member:?}"
    );
    assert_eq!(
        log.count(|e| e.peer() == Some("configured")),
        0,
        "{:?}",
        log.events()
    );
    let report = registry.shutdown(SHUTDOWN).expect("registry shuts down");
    // Its queued message and the broadcast's failed: counted over the peers it still has,
    // so only what was queued for `configured` is in the report.
    assert!(report.failed >= 1, "{report:?}");
}

/// A callback that blocks holds one event; behind it at most `event_capacity` wait, the
/// rest are dropped and counted in `events_dropped`. Once it returns, the waiting ones are
/// delivered, and later events flow again.
#[test]
fn a_slow_callback_keeps_the_queue_bounded_and_counts_drops() {
    const CAPACITY: usize = 8;
    const CYCLES: u64 = 12;
    let gate = Gate::new();
    let seen = Arc::new(AtomicU64::new(0));
    let (g, s) = (gate.clone(), seen.clone());
    let b = receiver_b("t-events-flood", "127.0.0.1:0")
        .start()
        .expect("b starts");
    let a = sender_a("t-events-flood", b.local_addr(), None)
        .redial_quickly()
        .event_capacity(CAPACITY)
        .on_event(move |_| {
            s.fetch_add(1, Ordering::SeqCst);
            g.pass();
        })
        .start()
        .expect("a starts");
    wait_until("the first event in the callback", PATIENCE, || {
        seen.load(Ordering::SeqCst) == 1
    });
    // Each cycle: a Disconnected and a Connected.
    for cycle in 1..=CYCLES {
        a.disconnect("b").expect("disconnect");
        wait_until_or(
            PATIENCE,
            || {
                let p = peer_stats(&a, "b");
                p.connects == cycle + 1 && is_connected(&a, "b")
            },
            || format!("reconnect {cycle}; stats:\n{}", a.stats()),
        );
    }
    let produced = |a: &Node| {
        let p = peer_stats(a, "b");
        p.connects + p.disconnects
    };
    assert_eq!(produced(&a), 1 + 2 * CYCLES);
    // One in the callback, CAPACITY waiting, the rest dropped.
    wait_until_or(
        PATIENCE,
        || a.stats().events_dropped == produced(&a) - 1 - CAPACITY as u64,
        || format!("drops counted; stats:\n{}", a.stats()),
    );
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "the callback is still blocked"
    );
    gate.open();
    wait_until("the waiting events delivered", PATIENCE, || {
        seen.load(Ordering::SeqCst) == 1 + CAPACITY as u64
    });
    // The queue drained: a new event is delivered, not dropped.
    let dropped = a.stats().events_dropped;
    a.disconnect("b").expect("disconnect");
    wait_until("a later event delivered", PATIENCE, || {
        seen.load(Ordering::SeqCst) >= 2 + CAPACITY as u64
    });
    a.shutdown(SHUTDOWN).expect("a shuts down");
    b.shutdown(SHUTDOWN).expect("b shuts down");
    assert_eq!(a.stats().events_dropped, dropped);
}

/// A callback that panics is caught: each panic is counted in `Stats::event_panics` (and
/// the table), and the events after it are still delivered.
#[test]
fn a_panicking_callback_is_counted_and_events_go_on() {
    const CYCLES: u64 = 3;
    let seen = Arc::new(AtomicU64::new(0));
    let s = seen.clone();
    let b = receiver_b("t-events-panic", "127.0.0.1:0")
        .start()
        .expect("b starts");
    let a = sender_a("t-events-panic", b.local_addr(), None)
        .redial_quickly()
        .on_event(move |e| {
            s.fetch_add(1, Ordering::SeqCst);
            if matches!(e, Event::Disconnected { .. }) {
                panic!("a callback that panics on every disconnection");
            }
        })
        .start()
        .expect("a starts");
    wait_until("the first connection seen", PATIENCE, || {
        seen.load(Ordering::SeqCst) == 1
    });
    for cycle in 1..=CYCLES {
        a.disconnect("b").expect("disconnect");
        wait_until_or(
            PATIENCE,
            || seen.load(Ordering::SeqCst) == 1 + 2 * cycle,
            || format!("cycle {cycle}: events after a panic; stats:\n{}", a.stats()),
        );
    }
    let stats = a.stats();
    assert_eq!(stats.event_panics, CYCLES, "{stats}");
    assert!(
        stats
            .to_string()
            .contains(&format!("on_event panics: {CYCLES}")),
        "{stats}"
    );
    assert_eq!(b.stats().event_panics, 0, "no callback, no panics");
    a.shutdown(SHUTDOWN).expect("a shuts down");
    b.shutdown(SHUTDOWN).expect("b shuts down");
}
