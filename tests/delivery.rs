//! Delivery to the application: out-of-band messages, and at most one pool thread
//! delivering a given sender's messages while different senders are delivered in parallel.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cohort::Node;
use support::*;

/// Out-of-band messages are delivered exactly once, flagged `is_oob()`, without a sequence
/// number, and counted in `oob_delivered` (not in the per-peer regular `delivered`); the
/// regular messages interleaved with them still arrive in order, with increasing `seq()`.
#[test]
fn oob_messages_are_delivered() {
    const REGULAR: u64 = 500;
    const OOB: u64 = 100;

    #[derive(Default)]
    struct Seen {
        oob: BTreeSet<u64>,
        oob_duplicates: u64,
        regular_next: u64,
        last_seq: u64,
        errors: Vec<String>,
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let total = Arc::new(AtomicU64::new(0));
    let (s, t) = (seen.clone(), total.clone());
    let receiver = Node::builder("rx")
        .cluster("t-oob")
        .pool_threads(2)
        .on_message(move |d| {
            let mut s = s.lock().unwrap();
            match counter_of(d.payload()) {
                Err(e) => s.errors.push(e),
                Ok(n) if d.is_oob() => {
                    // Reliable OOB messages share the sender's sequence space.
                    if d.seq().is_none() {
                        s.errors.push(format!("OOB {n} has no seq"));
                    }
                    if !s.oob.insert(n) {
                        s.oob_duplicates += 1;
                    }
                }
                Ok(n) => {
                    if n != s.regular_next {
                        let e = format!("regular {n}, expected {}", s.regular_next);
                        s.errors.push(e);
                    }
                    s.regular_next = n + 1;
                    match d.seq() {
                        Some(q) if q > s.last_seq => s.last_seq = q,
                        other => {
                            let e = format!("regular {n} has seq {other:?} after {}", s.last_seq);
                            s.errors.push(e);
                        }
                    }
                }
            }
            drop(s);
            t.fetch_add(1, Ordering::SeqCst);
        });
    let sender = Node::builder("tx").cluster("t-oob").pool_threads(1);
    let nodes = connected([sender, receiver]);
    let [sender, receiver] = &nodes;

    // OOB counters are offset so they cannot be mistaken for regular ones.
    let mut oob_sent = 0;
    let tx = sender.sender();
    for i in 0..REGULAR {
        send_patiently(&tx, "rx", payload(i, 24));
        if i % (REGULAR / OOB) == 0 {
            sender
                .send_oob("rx", payload(1_000_000 + oob_sent, 24))
                .expect("send_oob");
            oob_sent += 1;
        }
    }
    assert_eq!(oob_sent, OOB);
    wait_until_or(
        PATIENCE,
        || total.load(Ordering::SeqCst) >= REGULAR + OOB,
        || format!("all deliveries; stats:\n{}", all_stats(&nodes)),
    );
    let s = seen.lock().unwrap();
    assert!(s.errors.is_empty(), "{:#?}", s.errors);
    assert_eq!(s.oob_duplicates, 0);
    let want: BTreeSet<u64> = (0..OOB).map(|i| 1_000_000 + i).collect();
    assert_eq!(s.oob, want, "every OOB message exactly once");
    assert_eq!(s.regular_next, REGULAR);
    drop(s);
    assert_eq!(total.load(Ordering::SeqCst), REGULAR + OOB);

    let rs = receiver.stats();
    assert_eq!(rs.oob_delivered, OOB, "{rs}");
    let p = rs.peer("tx").expect("peer");
    assert_eq!(p.delivered, REGULAR, "{rs}");
    assert_eq!(p.received, REGULAR + OOB, "{rs}");
    // OOB messages are flow-controlled too: their credit comes back.
    wait_until_or(
        PATIENCE,
        || {
            let p = peer_stats(sender, "rx");
            p.available == p.window
        },
        || format!("the window whole again; stats:\n{}", sender.stats()),
    );
    let p = peer_stats(sender, "rx");
    assert_eq!(p.accepted, REGULAR + OOB, "{p:?}");
    assert_eq!(
        p.accepted,
        p.sent + p.filtered + p.failed + p.queued,
        "{p:?}"
    );
    shutdown_all(&nodes);
}

/// One deliverer per sender (invariant 1): with a pool of 4 threads and 4 senders into one
/// receiver whose handler takes a moment per message, the handler never runs twice at once
/// for the same sender, but does run for different senders at once; each sender's messages
/// arrive in order, and the stats' `max_concurrent_deliverers` agrees.
///
/// The first messages of each sender are paced so that each arrives in a read of its own
/// while that sender's deliverer is still busy with the first one: that is when a broken
/// state word would start a second deliverer.
#[test]
fn one_deliverer_per_sender_while_senders_overlap() {
    const SENDERS: usize = 4;
    const COUNT: u64 = 300;
    const PACED: u64 = 10;

    struct Concurrency {
        now: [AtomicUsize; SENDERS],
        max: [AtomicUsize; SENDERS],
        total_now: AtomicUsize,
        total_max: AtomicUsize,
    }
    let conc = Arc::new(Concurrency {
        now: Default::default(),
        max: Default::default(),
        total_now: AtomicUsize::new(0),
        total_max: AtomicUsize::new(0),
    });
    let check = OrderCheck::new();
    let (c, k) = (conc.clone(), check.clone());
    let receiver = Node::builder("sink")
        .cluster("t-deliverer")
        .pool_threads(4)
        .on_message(move |d| {
            let i: usize = d.from()[1..].parse().expect("sender index");
            let mine = c.now[i].fetch_add(1, Ordering::SeqCst) + 1;
            c.max[i].fetch_max(mine, Ordering::SeqCst);
            let all = c.total_now.fetch_add(1, Ordering::SeqCst) + 1;
            c.total_max.fetch_max(all, Ordering::SeqCst);
            // Simulated work, so that deliveries have time to overlap; the first message
            // takes longer, while the next ones arrive one by one.
            let first = counter_of(d.payload()) == Ok(0);
            std::thread::sleep(Duration::from_micros(if first { 20_000 } else { 200 }));
            k.record(&d);
            c.total_now.fetch_sub(1, Ordering::SeqCst);
            c.now[i].fetch_sub(1, Ordering::SeqCst);
        })
        .start()
        .expect("start");
    let senders: Vec<Node> = (0..SENDERS)
        .map(|i| {
            Node::builder(&format!("s{i}"))
                .cluster("t-deliverer")
                .pool_threads(1)
                .peer("sink", receiver.local_addr())
                .start()
                .expect("start")
        })
        .collect();
    for s in &senders {
        receiver
            .add_peer(s.name(), s.local_addr())
            .expect("add_peer");
    }
    wait_until_or(
        PATIENCE,
        || senders.iter().all(|s| is_connected(s, "sink")),
        || format!("senders connected; stats:\n{}", all_stats(&senders)),
    );

    std::thread::scope(|scope| {
        for s in &senders {
            let receiver = &receiver;
            scope.spawn(move || {
                let tx = s.sender();
                for n in 0..COUNT {
                    send_patiently(&tx, "sink", payload(n, 64));
                    if n < PACED {
                        wait_until("the receiver to read the message", PATIENCE, || {
                            peer_stats(receiver, s.name()).received > n
                        });
                    }
                }
            });
        }
    });
    wait_until_or(
        PATIENCE,
        || check.total() >= SENDERS as u64 * COUNT,
        || format!("all deliveries; receiver stats:\n{}", receiver.stats()),
    );
    check.assert_ok();
    for i in 0..SENDERS {
        assert_eq!(check.count_from(&format!("s{i}")), COUNT);
        assert_eq!(
            conc.max[i].load(Ordering::SeqCst),
            1,
            "sender s{i} was delivered by two pool threads at once"
        );
    }
    let total_max = conc.total_max.load(Ordering::SeqCst);
    assert!(
        total_max >= 2,
        "deliveries for different senders never overlapped (max {total_max} at once)"
    );
    assert!(
        total_max <= 4,
        "more handlers at once than pool threads: {total_max}"
    );
    let rs = receiver.stats();
    assert_eq!(rs.max_concurrent_deliverers, 1, "{rs}");
    for p in &rs.peers {
        assert_eq!(p.max_concurrent_deliverers, 1, "{rs}");
        assert_eq!(p.delivered, COUNT, "{rs}");
    }
    assert_eq!(rs.pool.threads, 4, "{rs}");
    shutdown_all(&senders);
    shutdown_all(&[receiver]);
}
