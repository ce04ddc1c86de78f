//! Futures without a runtime: a `PendingReply` awaited under an executor (here `pollster`)
//! is woken by the thread that receives its reply or fails it; dropping the future gives
//! the request up; `Inbox::recv_async` waits for the next message without a thread.

mod support;

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use cohort::{Error, Node, RecvError, ReplyFailure};
use support::*;

/// A waker that counts its wake-ups.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl CountingWaker {
    fn woken(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A server whose handler answers each request with its payload reversed, once `gate` is
/// open (so that a request's future is still pending when the test polls it first).
fn gated_server(cluster: &str, gate: Arc<Gate>) -> cohort::Builder {
    Node::builder("server")
        .cluster(cluster)
        .on_message(move |d| {
            gate.pass();
            let mut answer = d.payload().to_vec();
            answer.reverse();
            let _ = d.reply(answer);
        })
}

#[test]
fn a_reply_wakes_the_future_from_the_thread_that_receives_it() {
    let gate = Gate::new();
    let [client, server] = connected([
        Node::builder("client").cluster("futures-reply"),
        gated_server("futures-reply", gate.clone()),
    ]);
    let counter = Arc::new(CountingWaker::default());
    let waker = Waker::from(counter.clone());
    let mut cx = Context::from_waker(&waker);
    let mut pending = pin!(client.send_request("server", &b"abc"[..]).expect("queued"));
    assert!(
        pending.as_mut().poll(&mut cx).is_pending(),
        "not answered yet"
    );
    assert_eq!(counter.woken(), 0);
    gate.open();
    wait_until("the future is woken", PATIENCE, || counter.woken() > 0);
    match pending.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(reply)) => assert_eq!(&reply[..], b"cba"),
        other => panic!("expected the reply, got {other:?}"),
    }
    // Polled again, it says the same.
    assert!(matches!(pending.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));

    // Under an executor, from another thread: many in flight, awaited in turn.
    let sender = client.sender();
    let awaited = std::thread::spawn(move || {
        pollster::block_on(async {
            let mut replies = Vec::new();
            let pending: Vec<_> = (0..20u8)
                .map(|i| sender.send_request("server", vec![i, 1, 2]))
                .collect::<Result<_, _>>()?;
            for p in pending {
                replies.push(p.await?);
            }
            Ok::<_, Error>(replies)
        })
    });
    let replies = join_within("the executor's thread returns", &[], awaited).expect("replies");
    for (i, r) in replies.iter().enumerate() {
        assert_eq!(&r[..], &[2, 1, i as u8]);
    }
    shutdown_all(&[client, server]);
}

#[test]
fn a_failed_request_fails_its_future() {
    let gate = Gate::new();
    let held = gate.clone();
    let [client, server] = connected([
        Node::builder("client").cluster("futures-fail"),
        Node::builder("server")
            .cluster("futures-fail")
            .on_message(move |_| held.pass()), // handled, never answered
    ]);
    let pending = client.send_request("server", &b"?"[..]).expect("queued");
    let outcome = Watched::spawn("await-unanswered", move || pollster::block_on(pending));
    // The executor parks on the pending future; the failure must wake it.
    outcome.wait_parked("the executor parks");
    gate.open();
    match join_within("the executor's thread returns", &[], outcome.into_handle()) {
        Err(Error::ReplyFailed {
            peer,
            reason: ReplyFailure::Unanswered,
        }) => assert_eq!(peer, "server"),
        other => panic!("expected an unanswered request, got {other:?}"),
    }

    // Failed by the removal of its peer while it is awaited (a peer that is down: the
    // request waits in its queue).
    let nobody = HeldAddr::new();
    client.add_peer("down", nobody.addr()).expect("added");
    let pending = client.send_request("down", &b"?"[..]).expect("queued");
    let outcome = Watched::spawn("await-removed", move || pollster::block_on(pending));
    outcome.wait_parked("the executor parks");
    client.remove_peer("down").expect("removed");
    let outcome = join_within("the executor's thread returns", &[], outcome.into_handle());
    assert!(matches!(outcome, Err(Error::Closed)), "{outcome:?}");
    shutdown_all(&[client, server]);
}

#[test]
fn dropping_the_future_gives_the_request_up() {
    let gate = Gate::new();
    let [client, server] = connected([
        Node::builder("client").cluster("futures-drop"),
        gated_server("futures-drop", gate.clone()),
    ]);
    {
        let mut pending = pin!(client.send_request("server", &b"x"[..]).expect("queued"));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(pending.as_mut().poll(&mut cx).is_pending());
        assert_eq!(peer_stats(&client, "server").requests_in_flight, 1);
        // It has left: the server holds it (its handler waits at the gate).
        wait_until("the server receives the request", PATIENCE, || {
            peer_stats(&server, "client").received == 1
        });
    } // dropped, pending
    assert_eq!(
        peer_stats(&client, "server").requests_in_flight,
        0,
        "given up as the future is dropped"
    );
    gate.open();
    wait_until("the reply is counted late", PATIENCE, || {
        peer_stats(&client, "server").late_replies == 1
    });
    assert_eq!(peer_stats(&client, "server").replies, 0);

    // A request that has not left (its peer is down) is withdrawn, never sent.
    let nobody = HeldAddr::new();
    client.add_peer("down", nobody.addr()).expect("added");
    {
        let mut pending = pin!(client.send_request("down", &b"x"[..]).expect("queued"));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(pending.as_mut().poll(&mut cx).is_pending());
    }
    wait_until("the request is withdrawn", PATIENCE, || {
        peer_stats(&client, "down").withdrawn == 1
    });
    assert_eq!(peer_stats(&client, "down").sent, 0);
    shutdown_all(&[client, server]);
}

#[test]
fn the_inbox_future_is_woken_by_a_message_and_ends_with_the_node() {
    let (b, inbox) = Node::builder("b")
        .cluster("futures-inbox")
        .allow_unknown_members(true)
        .start_with_inbox()
        .expect("b starts");
    let a = Node::builder("a")
        .cluster("futures-inbox")
        .peer("b", b.local_addr())
        .start()
        .expect("a starts");
    a.wait_connected("b", PATIENCE).expect("connected");

    let counter = Arc::new(CountingWaker::default());
    let waker = Waker::from(counter.clone());
    let mut cx = Context::from_waker(&waker);
    {
        let mut next = pin!(inbox.recv_async());
        assert!(next.as_mut().poll(&mut cx).is_pending(), "nothing sent yet");
        a.send("b", &b"one"[..]).expect("sent");
        wait_until("the inbox's future is woken", PATIENCE, || {
            counter.woken() > 0
        });
        match next.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(d)) => assert_eq!((d.from(), d.payload()), ("a", &b"one"[..])),
            other => panic!("expected the message, got {other:?}"),
        }
    }
    // A dropped future took nothing: the next message is still there.
    a.send("b", &b"two"[..]).expect("sent");
    a.send("b", &b"three"[..]).expect("sent");
    drop(inbox.recv_async());
    let got = pollster::block_on(async {
        let first = inbox.recv_async().await?;
        let second = inbox.recv_async().await?;
        Ok::<_, RecvError>([first, second])
    })
    .expect("two messages");
    assert_eq!(got[0].payload(), b"two");
    assert_eq!(got[1].payload(), b"three");

    // Pending when the node shuts down: woken, and closed.
    let counter = Arc::new(CountingWaker::default());
    let waker = Waker::from(counter.clone());
    let mut cx = Context::from_waker(&waker);
    let mut last = pin!(inbox.recv_async());
    assert!(last.as_mut().poll(&mut cx).is_pending());
    a.shutdown(SHUTDOWN).expect("a shuts down");
    b.shutdown(SHUTDOWN).expect("b shuts down");
    assert!(counter.woken() > 0, "the shutdown woke it");
    assert!(matches!(
        last.as_mut().poll(&mut cx),
        Poll::Ready(Err(RecvError::Closed))
    ));
}
