//! Requests that cannot be answered fail at once, saying why: a reply larger than the room
//! its request reserved, a request its application dropped unanswered, a handler that
//! panicked on it, a node with no handler. A reply within the room is always sent, whatever
//! the two members' windows and `max_message`; the handler can see the room.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cohort::{Builder, Bytes, Delivery, Error, Node, ReplyFailure};
use support::*;

/// What a requester waits before it would fail with `NoReply`: far longer than the fast
/// failures take, so that a failure at the timeout shows as the wrong error.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The generous bound on a fast failure (it takes a round trip on this host).
const AT_ONCE: Duration = Duration::from_secs(2);

/// A requester and a replier (handler `on`), each knowing the other.
fn pair(
    cluster: &str,
    requester: impl FnOnce(Builder) -> Builder,
    replier: impl FnOnce(Builder) -> Builder,
    on: impl Fn(Delivery) + Send + Sync + 'static,
) -> (Node, Node) {
    let server = replier(Node::builder("server").cluster(cluster))
        .on_message(on)
        .start()
        .expect("start the replier");
    let client = requester(Node::builder("client").cluster(cluster))
        .peer("server", server.local_addr())
        .start()
        .expect("start the requester");
    server
        .add_peer("client", client.local_addr())
        .expect("add_peer");
    (client, server)
}

/// Sends `n` requests one after the other and returns how long each took to fail, checking
/// each error with `expect`.
fn time_failures(client: &Node, n: usize, expect: impl Fn(&Error) -> bool) -> Vec<Duration> {
    // The first request also waits for the connection: not timed.
    let r = client.request("server", &b"warm up"[..], TIMEOUT);
    assert!(matches!(&r, Err(e) if expect(e.error())), "{r:?}");
    assert_eq!(
        r.unwrap_err().into_inner(),
        None,
        "it left: the payload is the peer's"
    );
    (0..n)
        .map(|i| {
            let started = Instant::now();
            let r = client.request("server", vec![i as u8; 10], TIMEOUT);
            let took = started.elapsed();
            assert!(
                matches!(&r, Err(e) if expect(e.error())),
                "request {i}: {r:?}"
            );
            assert!(
                took < AT_ONCE,
                "request {i} failed after {took:?}, not at once: {r:?}"
            );
            took
        })
        .collect()
}

fn report(what: &str, mut times: Vec<Duration>) {
    times.sort();
    eprintln!(
        "{what}: {} requests failed, p50 {:?}, max {:?}",
        times.len(),
        times[times.len() / 2],
        times[times.len() - 1]
    );
}

/// A requester with a 64 KiB window reserves 16 KiB for each reply; repliers with a 32 KiB
/// window, or a `max_message` of 1,000 bytes, still send a reply that fills that room
/// exactly (their own limits bound their messages, not the replies the requester asked
/// for), and the handler sees the room.
#[test]
fn a_reply_that_fills_the_room_goes_whatever_the_repliers_limits() {
    const ROOM: usize = 16 * 1024;
    type Limits = fn(Builder) -> Builder;
    let replier_limits: [(&str, Limits); 2] = [
        ("a 32 KiB window", |b| b.window_bytes(32 * 1024)),
        ("max_message 1000", |b| b.max_message(1000)),
    ];
    for (what, limits) in replier_limits {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let (client, server) = pair(
            "t-fill",
            |b| b.window_bytes(64 * 1024),
            limits,
            move |d| {
                let room = d.reply_room();
                let sent = d
                    .reply(vec![7u8; room.unwrap_or(0)])
                    .map_err(|e| e.to_string());
                s.lock().expect("seen").push((room, sent));
            },
        );
        let r = client.request("server", &b"fill it"[..], PATIENCE);
        // The handler records after its reply left: the reply may come first.
        wait_until("the handler recorded its reply", PATIENCE, || {
            !seen.lock().expect("seen").is_empty()
        });
        let seen = seen.lock().expect("seen").clone();
        assert_eq!(
            seen,
            [(Some(ROOM), Ok(()))],
            "replier with {what}: the room and the reply"
        );
        let reply = r.unwrap_or_else(|e| panic!("replier with {what}: {e}"));
        assert_eq!(reply.len(), ROOM, "replier with {what}");
        assert!(reply.iter().all(|b| *b == 7));
        client.shutdown(SHUTDOWN).expect("shutdown client");
        server.shutdown(SHUTDOWN).expect("shutdown server");
    }
}

/// A reply one byte larger than the room is refused at the replier, and the requester fails
/// at once with "too large" (the reply's length and the room), not at its timeout. A
/// handler whose first reply is refused may still answer within the room.
#[test]
fn a_reply_too_large_for_its_room_fails_the_request_at_once() {
    const ROOM: usize = 4096;
    let (client, server) = pair(
        "t-large",
        |b| b.max_reply(ROOM),
        |b| b,
        |d| {
            let refused = d.reply(vec![0u8; ROOM + 1]).map_err(Error::from);
            assert!(
                matches!(refused, Err(Error::ReplyTooLarge { len, room }) if len == ROOM + 1 && room == ROOM),
                "{refused:?}"
            );
            if d.payload().starts_with(b"retry") {
                d.reply(&b"the short answer"[..])
                    .expect("a reply within the room");
            }
        },
    );
    let too_large = |e: &Error| {
        matches!(e, Error::ReplyFailed { peer, reason: ReplyFailure::TooLarge { len, room } }
            if peer == "server" && *len == ROOM as u64 + 1 && *room == ROOM as u64)
    };
    report(
        "reply too large for its room",
        time_failures(&client, 20, too_large),
    );
    let e = client
        .request("server", &b"again"[..], TIMEOUT)
        .expect_err("too large");
    let text = e.to_string();
    assert!(
        text.contains("4097") && text.contains("4096") && text.contains("max_reply"),
        "{text}"
    );
    let r = client
        .request("server", &b"retry smaller"[..], TIMEOUT)
        .expect("the smaller reply that followed");
    assert_eq!(&r[..], b"the short answer");
    client.shutdown(SHUTDOWN).expect("shutdown client");
    server.shutdown(SHUTDOWN).expect("shutdown server");
}

/// A handler that returns without replying (dropping the request) fails the request at once
/// with "unanswered"; one that keeps a clone of the `Delivery` to answer later does not:
/// only the last clone's drop says it went unanswered.
#[test]
fn a_request_its_handler_drops_unanswered_fails_at_once() {
    let kept: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let k = kept.clone();
    let (client, server) = pair(
        "t-drop",
        |b| b,
        |b| b,
        move |d| {
            if d.payload().starts_with(b"keep") {
                k.lock().expect("kept").push(d.clone());
            }
            // Returns: this clone goes unanswered.
        },
    );
    let unanswered = |e: &Error| matches!(e, Error::ReplyFailed { peer, reason: ReplyFailure::Unanswered } if peer == "server");
    report(
        "request dropped unanswered",
        time_failures(&client, 20, unanswered),
    );
    let pending = client
        .send_request("server", &b"keep me"[..])
        .expect("send_request");
    wait_until("the handler kept the request", PATIENCE, || {
        kept.lock().expect("kept").len() == 1
    });
    // A request after it, dropped: its status follows whatever the kept one's handler
    // sent, in order.
    let r = client.request("server", &b"drop me"[..], TIMEOUT);
    assert!(matches!(&r, Err(e) if unanswered(e.error())), "{r:?}");
    assert!(
        !pending.is_ready(),
        "a kept request is not failed when the handler's own clone goes"
    );
    let d = kept.lock().expect("kept").pop().expect("kept");
    d.reply(&b"later"[..]).expect("reply later");
    drop(d);
    assert_eq!(
        &pending.wait(PATIENCE).expect("the later reply")[..],
        b"later"
    );
    client.shutdown(SHUTDOWN).expect("shutdown client");
    server.shutdown(SHUTDOWN).expect("shutdown server");
}

/// A request taken from an `Inbox` and dropped without a reply fails at once too.
#[test]
fn a_request_dropped_from_the_inbox_fails_at_once() {
    let (server, inbox) = Node::builder("server")
        .cluster("t-inbox")
        .start_with_inbox()
        .expect("start the replier");
    let client = Node::builder("client")
        .cluster("t-inbox")
        .peer("server", server.local_addr())
        .start()
        .expect("start the requester");
    server
        .add_peer("client", client.local_addr())
        .expect("add_peer");
    let pending = client
        .send_request("server", &b"anyone?"[..])
        .expect("send_request");
    let d = inbox.recv_timeout(PATIENCE).expect("the request");
    assert_eq!(d.reply_room(), Some(64 * 1024));
    let started = Instant::now();
    drop(d);
    let r = pending.wait(TIMEOUT);
    let took = started.elapsed();
    assert!(
        matches!(
            &r,
            Err(Error::ReplyFailed {
                reason: ReplyFailure::Unanswered,
                ..
            })
        ),
        "{r:?}"
    );
    assert!(took < AT_ONCE, "failed after {took:?}");
    eprintln!("request dropped from the inbox: failed {took:?} after the drop");
    client.shutdown(SHUTDOWN).expect("shutdown client");
    server.shutdown(SHUTDOWN).expect("shutdown server");
}

/// A handler that panics on a request fails it at once with "handler panicked"; the
/// replier goes on serving.
#[test]
fn a_request_its_handler_panics_on_fails_at_once() {
    let (client, server) = pair(
        "t-panic",
        |b| b,
        |b| b,
        |d| {
            if d.payload().starts_with(b"fine") {
                d.reply(&b"fine"[..]).expect("reply");
                return;
            }
            panic!("this handler panics on purpose");
        },
    );
    let panicked = |e: &Error| matches!(e, Error::ReplyFailed { peer, reason: ReplyFailure::HandlerPanicked } if peer == "server");
    report(
        "handler panicked on the request",
        time_failures(&client, 20, panicked),
    );
    let r = client
        .request("server", &b"fine?"[..], TIMEOUT)
        .expect("the replier still answers");
    assert_eq!(&r[..], b"fine");
    client.shutdown(SHUTDOWN).expect("shutdown client");
    server.shutdown(SHUTDOWN).expect("shutdown server");
}

/// A request to a node that has no message handler fails at once with "no handler".
#[test]
fn a_request_to_a_node_without_a_handler_fails_at_once() {
    let server = Node::builder("server")
        .cluster("t-none")
        .start()
        .expect("start the replier");
    let client = Node::builder("client")
        .cluster("t-none")
        .peer("server", server.local_addr())
        .start()
        .expect("start the requester");
    server
        .add_peer("client", client.local_addr())
        .expect("add_peer");
    let no_handler = |e: &Error| matches!(e, Error::ReplyFailed { peer, reason: ReplyFailure::NoHandler } if peer == "server");
    report(
        "replier without a handler",
        time_failures(&client, 5, no_handler),
    );
    client.shutdown(SHUTDOWN).expect("shutdown client");
    server.shutdown(SHUTDOWN).expect("shutdown server");
}

/// Failed requests give their window back like answered ones: after many of each kind the
/// requester's window is whole and nothing waits.
#[test]
fn failed_requests_give_their_rooms_back() {
    let answered = Arc::new(AtomicU64::new(0));
    let a = answered.clone();
    let (client, server) = pair(
        "t-rooms",
        |b| b.window_bytes(256 * 1024).max_reply(16 * 1024),
        |b| b,
        move |d| match d.payload()[0] % 3 {
            0 => {
                d.reply(d.payload_bytes()).expect("reply");
                a.fetch_add(1, Ordering::SeqCst);
            }
            1 => {
                let _ = d.reply(Bytes::from(vec![0u8; 16 * 1024 + 1]));
            }
            _ => {}
        },
    );
    let pending: Vec<_> = (0..300u32)
        .map(|i| {
            client
                .send_request("server", vec![(i % 3) as u8; 10])
                .expect("send_request")
        })
        .collect();
    for (i, p) in pending.into_iter().enumerate() {
        let r = p.wait(PATIENCE);
        match i % 3 {
            0 => assert!(r.is_ok(), "{i}: {r:?}"),
            1 => assert!(
                matches!(
                    r,
                    Err(Error::ReplyFailed {
                        reason: ReplyFailure::TooLarge { .. },
                        ..
                    })
                ),
                "{i}: {r:?}"
            ),
            _ => assert!(
                matches!(
                    r,
                    Err(Error::ReplyFailed {
                        reason: ReplyFailure::Unanswered,
                        ..
                    })
                ),
                "{i}: {r:?}"
            ),
        }
    }
    assert_eq!(answered.load(Ordering::SeqCst), 100);
    wait_window_whole(&client, "server");
    let p = peer_stats(&client, "server");
    assert_eq!((p.requests_in_flight, p.late_replies), (0, 0));
    client.shutdown(SHUTDOWN).expect("shutdown client");
    server.shutdown(SHUTDOWN).expect("shutdown server");
}

/// Two members of different windows (64 KiB and 32 KiB) request each other from several
/// threads at once, every fifth reply filling its room exactly (16 KiB for the larger
/// member's requests, 8 KiB for the smaller's): every request is answered, none waits for
/// its timeout.
#[test]
fn members_of_different_windows_answer_every_request_under_load() {
    const THREADS: u32 = 3;
    const EACH: u32 = 400;
    const IN_FLIGHT: usize = 8;
    let serve = |name: &str, window: u64| {
        Node::builder(name)
            .cluster("t-mixed")
            .window_bytes(window)
            .on_message(|d| {
                let room = d.reply_room().expect("only requests are sent");
                let i = u32::from_le_bytes(d.payload()[..4].try_into().expect("a counter"));
                let len = if i % 5 == 0 {
                    room
                } else {
                    (i as usize * 37) % 200
                };
                d.reply(vec![(i % 251) as u8; len])
                    .expect("a reply within the room");
            })
            .start()
            .expect("start a member")
    };
    let nodes = [serve("big", 64 * 1024), serve("small", 32 * 1024)];
    introduce_at_once(&nodes);
    let mut threads = Vec::new();
    for (node, peer, room) in [
        (&nodes[0], "small", 16 * 1024),
        (&nodes[1], "big", 8 * 1024),
    ] {
        for t in 0..THREADS {
            let to = node.sender().to(peer).expect("peer");
            threads.push(std::thread::spawn(move || {
                let mut pending = std::collections::VecDeque::new();
                let settle = |(i, p): (u32, cohort::PendingReply)| {
                    let r = p
                        .wait(PATIENCE)
                        .unwrap_or_else(|e| panic!("request {i}: {e}"));
                    let len = if i % 5 == 0 {
                        room
                    } else {
                        (i as usize * 37) % 200
                    };
                    assert_eq!(r.len(), len, "request {i}");
                    assert!(r.iter().all(|b| *b == (i % 251) as u8));
                };
                for n in 0..EACH {
                    let i = t * EACH + n;
                    let p = to
                        .send_request(i.to_le_bytes().to_vec())
                        .expect("send_request");
                    pending.push_back((i, p));
                    if pending.len() >= IN_FLIGHT {
                        settle(pending.pop_front().expect("pending"));
                    }
                }
                pending.into_iter().for_each(settle);
            }));
        }
    }
    for t in threads {
        t.join().expect("a requesting thread");
    }
    shutdown_all(&nodes);
}

/// A requester (driven by hand) that reserves more room than it accepts in one message: a
/// reply within the room but beyond what it accepts is not sent, nor silently dropped; it
/// becomes a "too large" status naming what the requester accepts.
#[test]
fn a_reply_beyond_what_the_requester_accepts_becomes_a_status() {
    use cohort::internals::wire::{self, Frame, ReplyStatus};
    use std::io::Write;
    let server = Node::builder("server")
        .cluster("t-raw")
        .allow_unknown_members(true)
        .on_message(|d| {
            d.reply(vec![1u8; 5000])
                .expect("within the room it reserved");
        })
        .start()
        .expect("start the replier");
    let mut me = raw::identity("t-raw", "requester", 1 << 20, None);
    me.max_message = 1000;
    let mut s = raw::dial(server.local_addr(), me, server.name(), PATIENCE);
    let mut body = 42u64.to_le_bytes().to_vec(); // the request id
    body.extend_from_slice(&(64u32 * 1024).to_le_bytes()); // the room it reserves
    body.extend_from_slice(b"question");
    let mut frame = Vec::new();
    wire::encode_data(
        &mut frame,
        wire::FLAG_RELIABLE | wire::FLAG_REQUEST,
        Some(1),
        &body,
    );
    s.write_all(&frame).expect("write the request");
    s.set_read_timeout(Some(PATIENCE)).expect("read timeout");
    let status = loop {
        let f = raw::read_frame(&mut s, 1 << 20).expect("the answer before the connection ends");
        let (f, _) = wire::decode(&f, 1 << 20)
            .expect("a well-formed frame")
            .expect("whole");
        if let Frame::Data { flags, payload, .. } = f {
            assert_eq!(
                flags,
                wire::FLAG_RELIABLE | wire::FLAG_REPLY | wire::FLAG_STATUS,
                "a status, not the reply"
            );
            assert_eq!(wire::request_id(payload), Some(42));
            break wire::decode_reply_status(&payload[wire::REQUEST_ID_BYTES..]).expect("a status");
        }
    };
    assert_eq!(
        status,
        ReplyStatus::TooLarge {
            len: 5000,
            room: 992
        }
    );
    drop(s);
    server.shutdown(SHUTDOWN).expect("shutdown server");
}
