//! Failure detection: a connection that goes silent — the network stops carrying bytes but
//! neither side sees a reset, as with a half-open connection after a partition — is closed
//! after the idle timeout and redialled, and recovery delivers everything sent meanwhile
//! exactly once, in order. (That heartbeats keep an idle but healthy connection open for
//! ever is shown in simulated time: `proto::sim::an_hour_of_quiet_costs_only_heartbeats`.)

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cohort::Node;
use support::freeze::FreezingProxy;
use support::*;

/// A connection that stops carrying bytes is detected by the idle timeout on both ends,
/// closed, redialled, and the messages sent before and during the silence are delivered
/// exactly once, in order.
#[test]
fn silent_connection_is_closed_and_redialled_without_loss() {
    const N: u64 = 2_000;
    let next = Arc::new(AtomicU64::new(0));
    let out_of_order = Arc::new(AtomicU64::new(0));
    let (nx, ooo) = (next.clone(), out_of_order.clone());
    let beta = Node::builder("live-b")
        .cluster("t-live")
        .allow_unknown_members(true)
        .heartbeat(Duration::from_millis(20), Duration::from_millis(300))
        .on_message(move |d| {
            let n = u64::from_le_bytes(d.payload()[..8].try_into().expect("counter"));
            if nx.load(Ordering::SeqCst) != n {
                ooo.fetch_add(1, Ordering::SeqCst);
            }
            nx.store(n + 1, Ordering::SeqCst);
        })
        .start()
        .expect("start beta");
    let proxy = FreezingProxy::start(beta.local_addr());
    let alpha = Node::builder("live-a")
        .cluster("t-live")
        .heartbeat(Duration::from_millis(20), Duration::from_millis(300))
        .redial_quickly()
        .peer("live-b", proxy.addr())
        .start()
        .expect("start alpha");

    let send = |range: std::ops::Range<u64>| {
        for i in range {
            let mut p = i.to_le_bytes().to_vec();
            p.resize(64, 0);
            alpha.send("live-b", p).expect("send");
        }
    };
    send(0..N / 2);
    wait_until("the first half delivered", PATIENCE, || {
        next.load(Ordering::SeqCst) == N / 2
    });

    // Silence: the connection stays open but carries nothing.
    proxy.freeze();
    send(N / 2..N);
    wait_until_or(
        PATIENCE,
        // Whichever side notices first closes; the other then sees the close (here the
        // proxy passes the FIN on) or times out too.
        || alpha.stats().connections.idle_timeouts + beta.stats().connections.idle_timeouts >= 1,
        || format!("the idle timeout:\n{}\n{}", alpha.stats(), beta.stats()),
    );
    // Let new connections through: the redial succeeds and recovery resends.
    proxy.thaw_new();
    wait_until("everything delivered after the redial", PATIENCE, || {
        next.load(Ordering::SeqCst) == N
    });

    let a = alpha.stats();
    let to_b = a.peer("live-b").expect("peer");
    assert_eq!(
        out_of_order.load(Ordering::SeqCst),
        0,
        "order held across the redial"
    );
    assert!(to_b.connects >= 2, "redialled after the timeout: {a}");
    assert!(
        to_b.resent > 0,
        "what the silent connection swallowed was resent: {a}"
    );
    let b = beta.stats();
    assert_eq!(
        b.peer("live-a").expect("peer").received,
        N,
        "exactly once: {b}"
    );
    wait_window_whole(&alpha, "live-b");
    alpha
        .shutdown(Duration::from_secs(5))
        .expect("shutdown alpha");
    beta.shutdown(Duration::from_secs(5))
        .expect("shutdown beta");
}

/// Unreliable sends: delivered with no sequence number while the connection
/// lives; those a broken connection swallows are lost — never resent, never duplicated —
/// and their window permits come back at the next handshake, so the window ends whole.
/// Reliable messages interleaved with them are still delivered exactly once, in order.
#[test]
fn unreliable_messages_lost_with_a_connection_give_their_permits_back() {
    const N: u64 = 500;
    let reliable = Arc::new(Mutex::new(Vec::<u64>::new()));
    let unreliable = Arc::new(AtomicU64::new(0));
    let (r, u) = (reliable.clone(), unreliable.clone());
    let beta = Node::builder("unrel-b")
        .cluster("t-live")
        .allow_unknown_members(true)
        .heartbeat(Duration::from_millis(20), Duration::from_millis(300))
        .on_message(move |d| {
            let n = u64::from_le_bytes(d.payload()[..8].try_into().expect("counter"));
            match d.seq() {
                Some(_) => r.lock().expect("no panics holding this lock").push(n),
                None => {
                    u.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
        .start()
        .expect("start beta");
    let proxy = FreezingProxy::start(beta.local_addr());
    let alpha = Node::builder("unrel-a")
        .cluster("t-live")
        .heartbeat(Duration::from_millis(20), Duration::from_millis(300))
        .redial_quickly()
        .peer("unrel-b", proxy.addr())
        .start()
        .expect("start alpha");
    let payload = |i: u64| {
        let mut p = i.to_le_bytes().to_vec();
        p.resize(100, 0);
        p
    };
    let send_both = |range: std::ops::Range<u64>| {
        for i in range {
            alpha.send("unrel-b", payload(i)).expect("reliable send");
            let opts = cohort::SendOptions::new().unreliable();
            alpha
                .send_with("unrel-b", payload(i), opts)
                .expect("unreliable send");
        }
    };
    send_both(0..N);
    wait_until("the first unreliable ones delivered", PATIENCE, || {
        unreliable.load(Ordering::SeqCst) == N
    });
    proxy.freeze();
    send_both(N..2 * N); // the unreliable half of these dies with the frozen connection
    wait_until_or(
        PATIENCE,
        || alpha.stats().connections.idle_timeouts + beta.stats().connections.idle_timeouts >= 1,
        || format!("the idle timeout:\n{}\n{}", alpha.stats(), beta.stats()),
    );
    proxy.thaw_new();
    wait_until("every reliable message delivered", PATIENCE, || {
        reliable.lock().expect("lock").len() as u64 == 2 * N
    });
    wait_window_whole(&alpha, "unrel-b");
    let got = reliable.lock().expect("lock").clone();
    assert_eq!(
        got,
        (0..2 * N).collect::<Vec<_>>(),
        "reliable: exactly once, in order"
    );
    let delivered = unreliable.load(Ordering::SeqCst);
    assert!(
        (N..2 * N).contains(&delivered),
        "unreliable: the first {N} arrived, the frozen ones did not all make it, none twice: {delivered}"
    );
    let s = alpha.stats();
    let p = s.peer("unrel-b").expect("peer");
    assert!(
        p.unreliable_lost_bytes > 0,
        "the lost ones gave their permits back: {s}"
    );
    alpha
        .shutdown(Duration::from_secs(5))
        .expect("shutdown alpha");
    beta.shutdown(Duration::from_secs(5))
        .expect("shutdown beta");
}
