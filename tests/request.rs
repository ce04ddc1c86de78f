//! Request and reply: replies travel outside flow control, so members requesting each
//! other at full rate through small windows never deadlock; every reply reaches its own
//! request; a request fails fast when its peer is removed or restarts; late replies are
//! dropped and counted.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cohort::{Bytes, Error, Node};
use support::*;

const WINDOW: u64 = 64 * 1024;

/// What a server answers to request `payload`: the payload reversed, then its length.
fn answer(payload: &[u8]) -> Vec<u8> {
    let mut a: Vec<u8> = payload.iter().rev().copied().collect();
    a.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    a
}

/// A request payload unique to (member, thread, i), of a size that varies with `i`.
fn request_payload(member: u8, thread: u8, i: u64) -> Vec<u8> {
    let mut p = vec![member, thread];
    p.extend_from_slice(&i.to_le_bytes());
    p.resize(10 + (i % 7) as usize * 150, (i % 251) as u8);
    p
}

/// Checks that one sender's regular messages come in order: counters 0, 1, 2, … (their
/// sequence numbers have gaps: requests and replies share the sender's stream).
#[derive(Default)]
struct InOrder {
    next: AtomicU64,
    errors: AtomicU64,
}

impl InOrder {
    fn record(&self, payload: &[u8]) {
        // One deliverer at a time per sender: a load and a store suffice.
        let n = counter_of(payload).expect("a numbered payload");
        if n != self.next.load(Ordering::SeqCst) {
            self.errors.fetch_add(1, Ordering::SeqCst);
        }
        self.next.store(n + 1, Ordering::SeqCst);
    }
}

/// A member that answers every request, and (with `chatter`) also sends the requester a
/// regular message from its handler for each request, with `try_send` (a full window
/// skips one, counted in `skipped`).
fn member(
    name: &str,
    chatter: bool,
    regular_in: Arc<InOrder>,
    skipped: Arc<AtomicU64>,
    chat_seq: Arc<AtomicU64>,
) -> Node {
    Node::builder(name)
        .cluster("t-rr")
        .window_bytes(WINDOW)
        .on_message(move |d| {
            if !d.is_request() {
                regular_in.record(d.payload());
                return;
            }
            d.reply(answer(d.payload())).expect("reply");
            if chatter {
                let node = d.sender().expect("the node");
                // One sequence per member, taken and sent under no lock: each pool thread
                // sends its own; order is checked by the receiver per sender, so number
                // only what was accepted.
                let next = chat_seq.load(Ordering::SeqCst);
                match node.try_send(d.from(), payload(next, 64)) {
                    Ok(()) => {
                        chat_seq.store(next + 1, Ordering::SeqCst);
                    }
                    Err(e) if e.is_full() => {
                        skipped.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => panic!("chatter: {e}"),
                }
            }
        })
        .start()
        .expect("start member")
}

/// Two members request each other from 4 threads each, 32 requests in flight per thread,
/// 100,000 requests each way through 64 KiB windows; returns when every reply came back
/// matched to its request.
fn request_each_other(chatter: bool) {
    const THREADS: u8 = 4;
    const EACH: u64 = 25_000; // per thread: 100,000 per member
    const IN_FLIGHT: usize = 32;
    let checks = [Arc::new(InOrder::default()), Arc::new(InOrder::default())];
    let skipped = Arc::new(AtomicU64::new(0));
    let seqs = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let nodes = [
        member(
            "rr-a",
            chatter,
            checks[0].clone(),
            skipped.clone(),
            seqs[0].clone(),
        ),
        member(
            "rr-b",
            chatter,
            checks[1].clone(),
            skipped.clone(),
            seqs[1].clone(),
        ),
    ];
    // Both dial at once, and request from the first instant.
    introduce_at_once(&nodes);
    let [a, b] = nodes;
    let mut threads = Vec::new();
    for (m, (node, peer)) in [(&a, "rr-b"), (&b, "rr-a")].into_iter().enumerate() {
        for t in 0..THREADS {
            let to = node.sender().to(peer).expect("peer handle");
            threads.push(std::thread::spawn(move || {
                let mut pending = std::collections::VecDeque::new();
                let mut matched = 0u64;
                let mut settle = |p: (u64, cohort::PendingReply)| {
                    let (i, reply) = p;
                    let got = reply.wait(PATIENCE).expect("a reply");
                    assert_eq!(
                        &got[..],
                        &answer(&request_payload(m as u8, t, i))[..],
                        "the reply to request {i} of thread {t}"
                    );
                    matched += 1;
                };
                for i in 0..EACH {
                    let req = to
                        .send_request(request_payload(m as u8, t, i))
                        .expect("send_request");
                    pending.push_back((i, req));
                    if pending.len() >= IN_FLIGHT {
                        settle(pending.pop_front().expect("one"));
                    }
                }
                while let Some(p) = pending.pop_front() {
                    settle(p);
                }
                matched
            }));
        }
    }
    let matched: u64 = threads
        .into_iter()
        .map(|t| t.join().expect("requesting thread"))
        .sum();
    assert_eq!(matched, 2 * THREADS as u64 * EACH);
    for (node, peer) in [(&a, "rr-b"), (&b, "rr-a")] {
        let p = peer_stats(node, peer);
        assert_eq!(p.replies, THREADS as u64 * EACH, "{}", node.stats());
        assert_eq!((p.late_replies, p.requests_in_flight), (0, 0));
    }
    if chatter {
        // Every regular message a handler managed to send arrives, in order.
        for (k, check) in checks.iter().enumerate() {
            let sent = seqs[1 - k].load(Ordering::SeqCst);
            wait_until("the handlers' regular messages", PATIENCE, || {
                check.next.load(Ordering::SeqCst) == sent
            });
            assert_eq!(check.errors.load(Ordering::SeqCst), 0, "out of order");
        }
        assert!(
            seqs[0].load(Ordering::SeqCst) + seqs[1].load(Ordering::SeqCst) > 0,
            "the handlers sent regular messages"
        );
    }
    a.shutdown(SHUTDOWN).expect("shutdown a");
    b.shutdown(SHUTDOWN).expect("shutdown b");
}

#[test]
fn members_requesting_each_other_through_small_windows_never_deadlock() {
    request_each_other(false);
}

#[test]
fn requests_and_regular_messages_from_handlers_both_ways_never_deadlock() {
    request_each_other(true);
}

/// A request whose peer is removed fails with `Closed` at once, not at its timeout; one
/// whose reply comes after the timeout fails with `NoReply`, and the reply is counted late.
#[test]
fn a_request_fails_fast_when_its_peer_is_removed_and_late_replies_are_counted() {
    let gate = Gate::new();
    let held = Arc::new(AtomicU64::new(0));
    let (g, h) = (gate.clone(), held.clone());
    let server = Node::builder("rf-server")
        .cluster("t-rf")
        .on_message(move |d| {
            h.fetch_add(1, Ordering::SeqCst);
            g.pass();
            let _ = d.reply(answer(d.payload()));
        })
        .start()
        .expect("start server");
    let client = Node::builder("rf-client")
        .cluster("t-rf")
        .peer("rf-server", server.local_addr())
        .start()
        .expect("start client");
    server
        .add_peer("rf-client", client.local_addr())
        .expect("add_peer");

    // Late: the handler holds the request past its timeout, then answers.
    let r = client.request("rf-server", &b"late"[..], Duration::from_millis(100));
    assert!(
        matches!(r.as_ref().map_err(|e| e.error()), Err(Error::NoReply(_))),
        "{r:?}"
    );
    assert_eq!(
        r.unwrap_err().into_inner(),
        None,
        "it left: the payload is the peer's"
    );
    gate.open();
    wait_until_or(
        PATIENCE,
        || peer_stats(&client, "rf-server").late_replies == 1,
        || client.stats().to_string(),
    );
    let ok = client
        .request("rf-server", &b"now"[..], PATIENCE)
        .expect("an answered request");
    assert_eq!(&ok[..], &answer(b"now")[..]);

    // Removed: a request waiting for a reply that will not come fails with Closed.
    let stuck = Gate::new();
    let s2 = stuck.clone();
    let server2 = Node::builder("rf-server2")
        .cluster("t-rf")
        .on_message(move |_| s2.pass())
        .start()
        .expect("start server2");
    client
        .add_peer("rf-server2", server2.local_addr())
        .expect("add_peer");
    server2
        .add_peer("rf-client", client.local_addr())
        .expect("add_peer");
    let pending = client
        .send_request("rf-server2", &b"never answered"[..])
        .expect("send_request");
    wait_until("server2 holds the request", PATIENCE, || {
        peer_stats(&server2, "rf-client").received == 1
    });
    let waiter = std::thread::spawn(move || pending.wait(Duration::from_secs(3600)));
    client.remove_peer("rf-server2").expect("remove_peer");
    let r = waiter.join().expect("waiter");
    assert!(matches!(r, Err(Error::Closed)), "{r:?}");
    assert!(matches!(
        client
            .request("rf-server2", &b"x"[..], PATIENCE)
            .map_err(Error::from),
        Err(Error::UnknownPeer(_))
    ));
    stuck.open();
    client.shutdown(SHUTDOWN).expect("shutdown client");
    server.shutdown(SHUTDOWN).expect("shutdown server");
    server2.shutdown(SHUTDOWN).expect("shutdown server2");
}

/// A peer that restarts (a new process under the same name and address) while requests
/// wait for it: they fail with `PeerRestarted` as soon as the new incarnation is met, and
/// the new one answers new requests.
#[test]
fn a_request_fails_fast_when_its_peer_restarts() {
    let addr = HeldAddr::new();
    // Keeps every request unanswered (a request dropped unanswered would fail at once).
    let kept: Arc<std::sync::Mutex<Vec<cohort::Delivery>>> = Arc::default();
    let (k, at) = (kept.clone(), addr.addr());
    let silent = move || {
        Node::builder("rs-server")
            .cluster("t-rs")
            .listen(at)
            .on_message(move |d| k.lock().expect("kept").push(d))
    };
    let client = Node::builder("rs-client")
        .cluster("t-rs")
        .peer("rs-server", addr.addr())
        .reconnect_backoff(Duration::from_millis(5), Duration::from_millis(50))
        .start()
        .expect("start client");
    let first = silent().start().expect("start server");
    first
        .add_peer("rs-client", client.local_addr())
        .expect("add_peer");
    let pending: Vec<_> = (0..10u8)
        .map(|i| {
            client
                .send_request("rs-server", vec![i; 100])
                .expect("send_request")
        })
        .collect();
    wait_until("the first server received the requests", PATIENCE, || {
        peer_stats(&first, "rs-client").received == 10
    });
    first.shutdown(SHUTDOWN).expect("shutdown the first server");
    drop(first);
    // Gone with their process: a node that is shut down tells nobody.
    kept.lock().expect("kept").clear();
    // A request made while the server is away is not published: the new incarnation gets
    // it, and answers it.
    wait_until("the client saw the server go", PATIENCE, || {
        !is_connected(&client, "rs-server")
    });
    let while_away = client
        .send_request("rs-server", &b"while away"[..])
        .expect("send_request");

    let second = Node::builder("rs-server")
        .cluster("t-rs")
        .listen(addr.addr())
        .peer("rs-client", client.local_addr())
        .on_message(|d| {
            let _ = d.reply(answer(d.payload()));
        })
        .start()
        .expect("start the second server");
    let started = Instant::now();
    for p in pending {
        let r = p.wait(Duration::from_secs(3600));
        assert!(
            matches!(r, Err(Error::PeerRestarted(ref n)) if n == "rs-server"),
            "{r:?}"
        );
    }
    // Failed at the new incarnation's handshake, not at an hour's timeout.
    assert!(started.elapsed() < Duration::from_secs(3600));
    let r = while_away
        .wait(PATIENCE)
        .expect("answered by the new incarnation");
    assert_eq!(&r[..], &answer(b"while away")[..]);
    let r = client
        .request("rs-server", &b"again"[..], PATIENCE)
        .expect("the new incarnation answers");
    assert_eq!(&r[..], &answer(b"again")[..]);
    client.shutdown(SHUTDOWN).expect("shutdown client");
    second.shutdown(SHUTDOWN).expect("shutdown server");
}

/// `reply` on a message that is not a request fails; requests and replies respect
/// `max_message` with their id; a node's shutdown fails a waiting request with `Closed`.
#[test]
fn reply_and_request_edges() {
    let not_a_request = Arc::new(AtomicU64::new(0));
    let n = not_a_request.clone();
    let server = Node::builder("re-server")
        .cluster("t-re")
        .max_message(1000)
        .window_bytes(64 * 1024)
        .on_message(move |d| {
            if d.is_request() {
                // A reply one byte too long with its id fails; the right size goes.
                let (back, e) = d.reply(vec![0u8; 993]).expect_err("too large").into_parts();
                assert!(
                    matches!(e, Error::ReplyTooLarge { len: 993, room: 992 }),
                    "{e}"
                );
                assert!(e.to_string().contains("max_reply"), "{e}");
                assert_eq!(back.len(), 993, "the refused reply is handed back");
                d.reply(Bytes::from(vec![7u8; 992])).expect("reply");
                let (back, e) = d.reply(&b"again"[..]).expect_err("replied").into_parts();
                assert!(matches!(e, Error::AlreadyReplied), "{e}");
                assert_eq!(&back[..], b"again", "the second reply is handed back");
            } else if matches!(d.reply(&b"no"[..]).map_err(|e| e.into_parts()), Err((back, Error::NotARequest)) if &back[..] == b"no") {
                n.fetch_add(1, Ordering::SeqCst);
            }
        })
        .start()
        .expect("start server");
    let client = Node::builder("re-client")
        .cluster("t-re")
        .max_message(1000)
        .window_bytes(64 * 1024)
        .peer("re-server", server.local_addr())
        .start()
        .expect("start client");
    server
        .add_peer("re-client", client.local_addr())
        .expect("add_peer");
    client.send("re-server", &b"plain"[..]).expect("send");
    wait_until("NotARequest", PATIENCE, || {
        not_a_request.load(Ordering::SeqCst) == 1
    });
    // A request's header takes 12 bytes of max_message; the reply's room is what is left
    // for a reply (max_message less its 8-byte id).
    let (back, e) = client
        .request("re-server", vec![0u8; 989], PATIENCE)
        .expect_err("too large")
        .into_parts();
    assert!(matches!(e, Error::TooLarge { len: 989, max: 988 }), "{e}");
    assert_eq!(
        back.map(|b| b.len()),
        Some(989),
        "never queued: handed back"
    );
    let r = client
        .request("re-server", vec![1u8; 988], PATIENCE)
        .expect("a request of the largest size");
    assert_eq!(r.len(), 992, "a reply of the largest size");
    client.shutdown(SHUTDOWN).expect("shutdown client");
    assert!(matches!(
        client
            .request("re-server", &b"after"[..], PATIENCE)
            .map_err(Error::from),
        Err(Error::Closed)
    ));
    server.shutdown(SHUTDOWN).expect("shutdown server");
}

/// Journalling members: replies are journalled and acknowledged like any reliable message,
/// and, though they never reach a handler, they count as handled: the acks (which with a
/// journal cover only what was handled) keep up, so both windows come back whole and
/// regular messages after the replies are acknowledged.
#[test]
fn requests_between_journalling_members_keep_their_acks_moving() {
    let (da, db) = (TempDir::new("rj-a"), TempDir::new("rj-b"));
    let serve = |name: &str, dir: &TempDir| {
        Node::builder(name)
            .cluster("t-rj")
            .journal(dir.path())
            .window_bytes(WINDOW)
            .on_message(|d| {
                if d.is_request() {
                    let _ = d.reply(answer(d.payload()));
                }
            })
            .start()
            .expect("start a journalling member")
    };
    let nodes = [serve("rj-a", &da), serve("rj-b", &db)];
    introduce_at_once(&nodes);
    let [a, b] = nodes;
    for i in 0..2_000u64 {
        let (from, to) = if i % 2 == 0 {
            (&a, "rj-b")
        } else {
            (&b, "rj-a")
        };
        let p = request_payload(0, 0, i);
        let r = from.request(to, p.clone(), PATIENCE).expect("a reply");
        assert_eq!(&r[..], &answer(&p)[..]);
        from.send(to, payload(i, 100)).expect("send");
    }
    let nodes = [a, b];
    wait_windows_whole(&nodes);
    for (node, peer) in [(&nodes[0], "rj-b"), (&nodes[1], "rj-a")] {
        wait_until_or(
            PATIENCE,
            || {
                let p = peer_stats(node, peer);
                p.sent > 0 && p.queued == 0 && p.in_flight == 0 && p.unacked == 0
            },
            || node.stats().to_string(),
        );
    }
    // Everything acknowledged: nothing left to report undelivered at the shutdown.
    for node in &nodes {
        let report = node.shutdown(SHUTDOWN).expect("shutdown");
        assert_eq!(
            (report.undelivered, report.failed),
            (0, 0),
            "{}",
            node.name()
        );
    }
}

/// A requester that never reads its replies (a hand-driven peer: it sends 20,000 small
/// requests, each reserving and answered with 64 KiB, and reads nothing) stops being read
/// once what the replier holds for it — its requests and their reply rooms — passes the
/// receive window: the replier does not take in all its requests and pile up gigabytes of
/// replies. Other members are served meanwhile.
#[test]
fn a_requester_that_does_not_read_its_replies_stops_being_read() {
    use cohort::internals::wire;
    use std::io::Write;
    const RECV_WINDOW: u64 = 256 * 1024;
    const REPLY: usize = 64 * 1024;
    const REQUESTS: u64 = 20_000;
    let server = Node::builder("nr-server")
        .cluster("t-nr")
        .recv_window(RECV_WINDOW)
        .allow_unknown_members(true)
        .on_message(|d| {
            if d.is_request() {
                let _ = d.reply(vec![7u8; REPLY]);
            }
        })
        .start()
        .expect("start server");
    // It declares a window large enough for every request: only the replier's own bound
    // can stop it.
    let me = raw::identity("t-nr", "nr-raw", 1 << 30, None);
    let s = raw::dial(server.local_addr(), me, server.name(), PATIENCE);
    let mut w = s.try_clone().expect("clone");
    let writer = std::thread::spawn(move || {
        let mut frame = Vec::new();
        for seq in 1..=REQUESTS {
            frame.clear();
            let mut body = seq.to_le_bytes().to_vec(); // the request id
            body.extend_from_slice(&(REPLY as u32).to_le_bytes()); // room for the reply
            body.extend_from_slice(b"question");
            wire::encode_data(
                &mut frame,
                wire::FLAG_RELIABLE | wire::FLAG_REQUEST,
                Some(seq),
                &body,
            );
            if w.write_all(&frame).is_err() {
                return seq - 1;
            }
        }
        REQUESTS
    });
    wait_until_or(
        PATIENCE,
        || server.stats().connections.read_pauses > 0,
        || {
            format!(
                "the server paused reading the requester:\n{}",
                server.stats()
            )
        },
    );
    // Someone else is still answered.
    let client = Node::builder("nr-client")
        .cluster("t-nr")
        .peer("nr-server", server.local_addr())
        .start()
        .expect("start client");
    let r = client
        .request("nr-server", &b"me too"[..], PATIENCE)
        .expect("another member is answered");
    assert_eq!(r.len(), REPLY);
    // A bounded look, not a wait for an event: what the server owes the requester stays
    // bounded while the requester goes on not reading. Each reading counts only when the
    // one after it agrees: `queued_bytes` is `accepted` less `sent`, counters read one
    // after the other, so while replies flow a reader descheduled between the two reads
    // would also count the replies queued and sent meanwhile.
    let (mut most, mut readings) = (0, 0);
    let look_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < look_until {
        let (a, b) = (peer_stats(&server, "nr-raw"), peer_stats(&server, "nr-raw"));
        if (a.accepted_bytes, a.sent_bytes) == (b.accepted_bytes, b.sent_bytes) {
            most = most.max(b.queued_bytes);
            readings += 1;
        }
        std::thread::yield_now();
    }
    assert!(
        readings > 0,
        "no two readings agreed in 2 s:\n{}",
        server.stats()
    );
    let p = peer_stats(&server, "nr-raw");
    assert!(
        p.received < REQUESTS,
        "the server took in all {REQUESTS} requests of a peer that reads none of its \
         replies:\n{}",
        server.stats()
    );
    // What it owes is bounded by its receive window (each request's room counted in it,
    // and the one request that took it past the window), not by what the requester sends.
    assert!(
        most <= RECV_WINDOW + 2 * REPLY as u64,
        "owed {most} bytes with a receive window of {RECV_WINDOW}:\n{}",
        server.stats()
    );
    client.shutdown(SHUTDOWN).expect("shutdown client");
    // Its connection is not drained: the shutdown's flush to it waits only so long.
    server
        .shutdown(Duration::from_secs(1))
        .expect("shutdown server");
    drop(s);
    let _ = writer.join().expect("writer");
}

/// A request's window cost includes the room it reserves for its reply; the room comes back
/// with the reply, or, for a request its handler drops unanswered, with the request: either
/// way the requester's window is whole again.
#[test]
fn reply_rooms_come_back_answered_or_not() {
    let server = Node::builder("rr2-server")
        .cluster("t-rr2")
        .on_message(|d| {
            // Answer the even ones; drop the odd ones unanswered.
            if d.payload()[0] % 2 == 0 {
                d.reply(d.payload_bytes()).expect("reply");
            }
        })
        .start()
        .expect("start server");
    let client = Node::builder("rr2-client")
        .cluster("t-rr2")
        .window_bytes(512 * 1024)
        .max_reply(32 * 1024)
        .peer("rr2-server", server.local_addr())
        .start()
        .expect("start client");
    server
        .add_peer("rr2-client", client.local_addr())
        .expect("add_peer");
    // Ten rooms of 32 KiB fit the window at once: no send waits for one to come back.
    let pending: Vec<_> = (0..10u8)
        .map(|i| {
            client
                .send_request("rr2-server", vec![i; 10])
                .expect("send_request")
        })
        .collect();
    for (i, p) in pending.into_iter().enumerate() {
        if i % 2 == 0 {
            assert_eq!(&p.wait(PATIENCE).expect("a reply")[..], &[i as u8; 10][..]);
        }
        // The odd ones are given up here, unanswered.
    }
    wait_window_whole(&client, "rr2-server");
    assert_eq!(peer_stats(&client, "rr2-server").requests_in_flight, 0);
    client.shutdown(SHUTDOWN).expect("shutdown client");
    server.shutdown(SHUTDOWN).expect("shutdown server");
}

/// A handler may keep requests and answer them later, from another thread: many more than
/// the receive window holds rooms for are kept unanswered at once, and all are answered.
#[test]
fn requests_kept_and_answered_later_never_stall_the_requester() {
    const KEPT: usize = 40; // 40 rooms of 16 KiB: 640 KiB, against a 128 KiB window
    let kept = Arc::new(std::sync::Mutex::new(Vec::new()));
    let k = kept.clone();
    let server = Node::builder("kl-server")
        .cluster("t-kl")
        .recv_window(128 * 1024)
        .on_message(move |d| k.lock().expect("kept").push(d))
        .start()
        .expect("start server");
    let client = Node::builder("kl-client")
        .cluster("t-kl")
        .window_bytes(128 * 1024)
        .max_reply(16 * 1024)
        .peer("kl-server", server.local_addr())
        .start()
        .expect("start client");
    server
        .add_peer("kl-client", client.local_addr())
        .expect("add_peer");
    let to = client.sender().to("kl-server").expect("peer");
    let requester = std::thread::spawn(move || {
        let pending: Vec<_> = (0..KEPT as u8)
            .map(|i| to.send_request(vec![i; 100]).expect("send_request"))
            .collect();
        pending
            .into_iter()
            .map(|p| p.wait(PATIENCE).expect("a reply").to_vec())
            .collect::<Vec<_>>()
    });
    wait_until_or(
        PATIENCE,
        || kept.lock().expect("kept").len() == KEPT,
        || format!("the server kept every request:\n{}", server.stats()),
    );
    // Answered now, from this thread, in reverse.
    for d in kept.lock().expect("kept").drain(..).rev() {
        d.reply(answer(d.payload())).expect("reply");
    }
    let replies = requester.join().expect("requester");
    for (i, r) in replies.iter().enumerate() {
        assert_eq!(r, &answer(&[i as u8; 100]));
    }
    client.shutdown(SHUTDOWN).expect("shutdown client");
    server.shutdown(SHUTDOWN).expect("shutdown server");
}

/// The byte counters of a request and its reply: the transport's counters (`accepted`,
/// `sent`, `received`) count the payload as it travels, a request's 12-byte header (its id
/// and reply room) and a reply's 8-byte request id included; `delivered_bytes` counts what
/// the handler sees, the request's own payload.
#[test]
fn request_byte_counters_count_the_headers_delivered_bytes_do_not() {
    const N: u64 = 50;
    const LEN: u64 = 10;
    const REPLY: u64 = 4;
    let server = Node::builder("rb-server")
        .cluster("t-rb")
        .on_message(|d| {
            d.reply(vec![0u8; REPLY as usize]).expect("reply");
        })
        .start()
        .expect("start server");
    let client = Node::builder("rb-client")
        .cluster("t-rb")
        .peer("rb-server", server.local_addr())
        .start()
        .expect("start client");
    server
        .add_peer("rb-client", client.local_addr())
        .expect("add_peer");
    for _ in 0..N {
        client
            .request("rb-server", vec![1u8; LEN as usize], PATIENCE)
            .expect("reply");
    }
    let request = N * (LEN + 12);
    let reply = N * (REPLY + 8);
    let c = peer_stats(&client, "rb-server");
    assert_eq!(
        (c.accepted_bytes, c.sent_bytes),
        (request, request),
        "{c:?}"
    );
    assert_eq!(c.received_bytes, reply, "replies received: {c:?}");
    assert_eq!(c.delivered_bytes, 0, "replies are not deliveries: {c:?}");
    // A delivery is counted once its handler returns, after the reply it sent.
    wait_until_or(
        PATIENCE,
        || {
            let s = peer_stats(&server, "rb-client");
            s.sent_bytes == reply && s.delivered == N
        },
        || format!("replies sent, requests handled:\n{}", server.stats()),
    );
    let s = peer_stats(&server, "rb-client");
    assert_eq!(s.received_bytes, request, "requests received: {s:?}");
    assert_eq!(s.delivered_bytes, N * LEN, "the handler's payloads: {s:?}");
    assert_eq!(s.accepted_bytes, reply, "replies accepted: {s:?}");
    shutdown_all(&[client, server]);
}
