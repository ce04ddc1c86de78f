//! Invariant 2, permits are conserved: loom models of the writer — the IO thread
//! filtering or publishing a peer's queued messages while credit arrives, an application
//! thread takes permits, and the peer is removed — with the code that ships:
//! `cohort::internals::peer::{Outbox, Outgoing, Return, Ledger}`,
//! `cohort::internals::handoff::Scheduled` and `cohort::internals::flow::SendWindow`.
//!
//! The threads mirror the real ones:
//!
//! - the application (`SendCore::enqueue_to`): `window().acquire(cost)` (parks on a dry
//!   window), then `admit` — refused, with its permits given back (`Return::Refused`), once
//!   the outbox is closed;
//! - the IO thread, with the steps `Remote` (`src/proto/remote/`) takes: `publish` takes each
//!   message with `Outbox::next_to_publish` (clearing the peer's `Scheduled` flag before it
//!   takes the queue), then the outbound filter drops it (`give_back(Filtered)`) or it is
//!   published (`ledger.publish`); `on_ack` gives credit back with `Outbox::credit` (never
//!   more than the ledger holds); `retire` (removal) fails what is queued with
//!   `Outbox::fail_queued` (closing the outbox, `give_back(Failed)`), then `Outbox::retire`
//!   gives the ledger back (`Retired`) and closes the window;
//! - `Node::remove_peer` on the caller's thread: `window().close()`, concurrently with the
//!   IO thread's part.
//!
//! Checked after every thread is joined:
//!
//! - every permit is released exactly once: the window is whole (`available() ==
//!   capacity()`; an over-release panics inside `SendWindow::release` under loom) and the
//!   bytes given back per [`Return`] reason match, message for message, what became of each
//!   message (filtered, credited or retired, failed, refused);
//! - a message admitted after the close is refused with its permits back;
//! - no acquirer waits forever once permits are available: a parked `acquire` that is
//!   never woken leaves every thread blocked, which loom reports as a deadlock.
//!
//! ## What `writer_releases_wake_a_parked_sender` guards
//!
//! That model has no `close()` to fall back on: the application's third `acquire` parks on
//! a dry window and only the writer's releases (a filtered message, then credit for a
//! published one) can wake it. Without the `fence(SeqCst)` pair in `SendWindow::release` /
//! `acquire_until` (see `loom-tests/tests/window.rs`) loom reports a deadlock here: a
//! store-buffering execution in which `release` sees no waiter and notifies nobody while
//! the sender's re-check misses the permits, so it parks for good with the permits
//! available. The removal models cannot see that bug, because `close()` always takes the
//! lock and notifies, which masks a lost release wake-up.
#![cfg(loom)]

use std::collections::VecDeque;

use bytes::Bytes;
use cohort::internals::flow::{cost, AcquireError};
use cohort::internals::handoff::Scheduled;
use cohort::internals::peer::{self, Ledger, Outbox, Outgoing, Queued, Return};
use loom::sync::Arc;
use loom::thread;

/// Every message of the models has a 1-byte payload; the byte says what the outbound filter
/// decides (`b'f'`: drop it; anything else: publish it).
fn msg(tag: &'static [u8; 1]) -> Bytes {
    Bytes::from_static(tag)
}

/// Window bytes one message holds.
fn c() -> u64 {
    cost(1)
}

/// The outbound filter of the models.
fn keep(m: &Outgoing) -> bool {
    m.payload()[..] != b"f"[..]
}

/// What the IO thread did with the messages it took.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Writer {
    filtered: u64,
    published: u64,
    failed: u64,
}

impl Writer {
    /// `Remote::publish`: filter or publish each message `next_to_publish` hands out, giving
    /// back a filtered one's permits at once and recording a published one in the ledger.
    fn flush(&mut self, ob: &Outbox, ledger: &mut Ledger) {
        let scheduled = Scheduled::new();
        let mut pending = VecDeque::new();
        while let Some(q) = ob.next_to_publish(&scheduled, &mut pending) {
            let m = match q {
                Queued::One(m) => m,
                Queued::Framed(run) => {
                    // Encoded by its senders: a node with an outbound filter never frames
                    // at send, so a run is published whole.
                    self.published += run.len();
                    ledger.publish(run.into_frames().1);
                    continue;
                }
            };
            if keep(&m) {
                ledger.publish(peer::into_permit(m));
                self.published += 1;
            } else {
                ob.give_back(Return::Filtered, peer::into_permit(m));
                self.filtered += 1;
            }
        }
    }

    /// `Remote::on_ack`: the peer returned `credit` bytes; never more than is outstanding
    /// goes back.
    fn credit(ob: &Outbox, ledger: &mut Ledger, credit: u64) {
        ob.credit(ledger, credit);
    }

    /// `Remote::retire` for a removal: fail what is queued, retire what is published, close.
    fn remove(&mut self, ob: &Outbox, ledger: &mut Ledger) {
        let failed = ob.fail_queued(&mut VecDeque::new());
        self.failed += failed.len() as u64;
        ob.retire(ledger);
    }
}

/// What the application thread's sends came to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct App {
    /// Sends encode their messages into the outbox's runs (`admit_framed`), as on a node
    /// without filter or journal.
    framed: bool,
    /// Permits taken (messages that got past `acquire`).
    taken: u64,
    admitted: u64,
    /// Refused by `admit` (the outbox was closed): permits given back as `Refused`.
    refused: u64,
    /// `acquire` failed with `Closed`: no permit taken.
    closed: u64,
}

impl App {
    /// `enqueue_to` with `Wait::Forever`.
    fn send(&mut self, ob: &Outbox, payload: Bytes) {
        let permit = match ob.window().acquire(cost(payload.len())) {
            Ok(permit) => permit,
            Err(AcquireError::Closed) => {
                self.closed += 1;
                return;
            }
            Err(e) => panic!("acquire failed with {e:?}"),
        };
        self.taken += permit.bytes();
        if self.framed {
            if ob.admit_framed(false, &payload, permit) {
                self.admitted += 1;
            } else {
                assert!(ob.is_closed(), "admit_framed refused an open outbox");
                self.refused += 1;
            }
            return;
        }
        match ob.admit(peer::outgoing(payload, false, None, permit)) {
            Ok(()) => self.admitted += 1,
            Err(back) => {
                assert!(ob.is_closed(), "admit refused an open outbox");
                assert_eq!(back.cost(), c(), "the refused message is handed back");
                self.refused += 1;
            }
        }
    }
}

/// The window is whole and the bytes given back per reason match what became of each
/// message.
fn assert_conserved(ob: &Outbox, app: App, writer: Writer, credited_or_retired: u64) {
    let w = ob.window();
    assert_eq!(
        w.available(),
        w.capacity(),
        "permits not conserved: {app:?} {writer:?}"
    );
    assert_eq!(w.in_flight(), 0);
    assert_eq!(w.waiters(), 0, "a sender left registered as waiting");
    assert_eq!(
        app.admitted,
        writer.filtered + writer.published + writer.failed,
        "every admitted message is filtered, published or failed exactly once"
    );
    assert_eq!(ob.returned(Return::Filtered), writer.filtered * c());
    assert_eq!(ob.returned(Return::Failed), writer.failed * c());
    assert_eq!(ob.returned(Return::Refused), app.refused * c());
    assert_eq!(ob.returned(Return::Expired), 0);
    assert_eq!(
        ob.returned(Return::Credited) + ob.returned(Return::Retired),
        credited_or_retired,
        "published permits come back once, by credit or by retirement"
    );
    let all: u64 = [
        Return::Credited,
        Return::Filtered,
        Return::Expired,
        Return::Failed,
        Return::Refused,
        Return::Retired,
    ]
    .iter()
    .map(|&r| ob.returned(r))
    .sum();
    assert_eq!(
        all, app.taken,
        "every permit taken is given back exactly once"
    );
}

/// No removal: the only way a parked sender can get its permits is the writer's releases.
/// The window holds two messages; the application has queued `f` (which the filter drops)
/// and `p` (published), and its third send parks on the dry window while the IO thread
/// takes the queue, filters `f` (one release) and publishes `p`, whose credit then arrives
/// (a second release). Either release must wake the sender; once it is through, the IO
/// thread (here: the main thread after the joins) publishes `q` and its credit comes back.
#[test]
fn writer_releases_wake_a_parked_sender() {
    loom_tests::model("writer/writer_releases_wake_a_parked_sender", || {
        let ob = Arc::new(Outbox::new(2 * c()));
        let mut app = App::default();
        app.send(&ob, msg(b"f"));
        app.send(&ob, msg(b"p"));
        assert_eq!(ob.window().available(), 0);

        let sender = {
            let ob = ob.clone();
            thread::spawn(move || {
                let mut app = app;
                app.send(&ob, msg(b"q"));
                app
            })
        };
        let io = {
            let ob = ob.clone();
            thread::spawn(move || {
                let mut writer = Writer::default();
                let mut ledger = Ledger::default();
                writer.flush(&ob, &mut ledger);
                // The credit for what was published arrives.
                let credit = ledger.uncredited();
                Writer::credit(&ob, &mut ledger, credit);
                (writer, ledger)
            })
        };
        let app = sender.join().unwrap();
        let (mut writer, mut ledger) = io.join().unwrap();
        assert_eq!((app.admitted, app.refused, app.closed), (3, 0, 0));
        // The IO thread's next turn: publish whatever is left (`q`, unless it was already
        // taken), and its credit comes back.
        writer.flush(&ob, &mut ledger);
        let credit = ledger.uncredited();
        Writer::credit(&ob, &mut ledger, credit);
        assert_eq!(ledger.uncredited(), 0);
        assert_eq!((writer.filtered, writer.published), (1, 2));
        assert_conserved(&ob, app, writer, 2 * c());
    });
}

/// The peer is removed while the writer works and a sender parks. The application sends
/// `f`, `p`, `q` into a window of two messages (its third send parks until a release or
/// the close); the IO thread takes whatever is queued, filters or publishes it, then
/// processes the removal; `remove_peer`'s `window().close()` runs concurrently. With
/// `credit_first`, the credit for what was published arrives before the removal; without,
/// it arrives after — and is clamped to nothing, the permits having come back already as
/// `Retired`.
///
/// With `framed`, the application encodes its messages into the outbox's runs
/// (`admit_framed`; no filter then, so it sends `p`, `p`, `q`): the removal fails a run
/// taken apart into its messages, each with its own permit back.
fn removal_model(name: &'static str, credit_first: bool, framed: bool) {
    loom_tests::model(name, move || {
        let ob = Arc::new(Outbox::new(2 * c()));
        let sender = {
            let ob = ob.clone();
            thread::spawn(move || {
                let mut app = App {
                    framed,
                    ..App::default()
                };
                let first = if framed { b"p" } else { b"f" };
                for tag in [first, b"p", b"q"] {
                    app.send(&ob, msg(tag));
                }
                app
            })
        };
        let io = {
            let ob = ob.clone();
            thread::spawn(move || {
                let mut writer = Writer::default();
                let mut ledger = Ledger::default();
                writer.flush(&ob, &mut ledger);
                let published = ledger.uncredited();
                if credit_first {
                    Writer::credit(&ob, &mut ledger, published);
                }
                writer.remove(&ob, &mut ledger);
                assert_eq!(ledger.uncredited(), 0, "retired");
                if !credit_first {
                    // Late credit for what was published: already given back as Retired.
                    // (Only this thread gives back `Credited`; the sender may be taking
                    // permits meanwhile, so the window itself is checked at the end.)
                    let before = ob.returned(Return::Credited);
                    Writer::credit(&ob, &mut ledger, published);
                    assert_eq!(ob.returned(Return::Credited), before, "released twice");
                }
                (writer, published)
            })
        };
        // remove_peer: the window closes, waking a parked sender with Closed.
        ob.window().close();
        let app = sender.join().unwrap();
        let (writer, published) = io.join().unwrap();
        assert_eq!(app.admitted + app.refused + app.closed, 3);
        assert!(ob.is_closed());
        // After the removal every send is refused: a closed window takes nothing, and a
        // message that got its permits just before the close is refused by `admit` with
        // its permits back.
        assert_eq!(
            ob.window().try_acquire(c()).err(),
            Some(AcquireError::Closed)
        );
        let mut late = App {
            framed,
            ..App::default()
        };
        late.send(&ob, msg(b"p"));
        assert_eq!((late.taken, late.closed), (0, 1));
        let refused_before = ob.returned(Return::Refused);
        ob.window().reopen();
        let mut after_close = App {
            framed,
            ..App::default()
        };
        after_close.send(&ob, msg(b"p"));
        assert_eq!((after_close.refused, after_close.admitted), (1, 0));
        assert_eq!(ob.returned(Return::Refused), refused_before + c());
        let app = App {
            taken: app.taken + after_close.taken,
            refused: app.refused + after_close.refused,
            ..app
        };
        assert_conserved(&ob, app, writer, published);
        if credit_first {
            assert_eq!(ob.returned(Return::Retired), 0);
        } else {
            assert_eq!(ob.returned(Return::Credited), 0);
        }
    });
}

/// Removal with the credit for the published message arriving first.
#[test]
fn writer_credit_then_removal_race_a_parked_sender() {
    removal_model(
        "writer/writer_credit_then_removal_race_a_parked_sender",
        true,
        false,
    );
}

/// Removal with the credit arriving after it (clamped: no double release).
#[test]
fn writer_removal_then_late_credit_race_a_parked_sender() {
    removal_model(
        "writer/writer_removal_then_late_credit_race_a_parked_sender",
        false,
        false,
    );
}

/// Removal with the credit arriving first, the application encoding its messages into the
/// outbox's runs: what a removal finds queued is a run, failed message by message.
#[test]
fn framed_credit_then_removal_race_a_parked_sender() {
    removal_model(
        "writer/framed_credit_then_removal_race_a_parked_sender",
        true,
        true,
    );
}

/// Removal with the credit arriving after it, framed.
#[test]
fn framed_removal_then_late_credit_race_a_parked_sender() {
    removal_model(
        "writer/framed_removal_then_late_credit_race_a_parked_sender",
        false,
        true,
    );
}
