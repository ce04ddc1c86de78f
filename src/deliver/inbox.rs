//! Pull-style receive: an [`Inbox`] takes the node's deliveries on the application's own
//! thread instead of a handler on the pool's.
//!
//! It is the pool with the application's thread as its only worker: the IO thread queues
//! the same tasks (a sender's queue, never a message), and each `recv` runs the next one,
//! taking up to a batch of that sender's messages off its queue. Credit goes back to the
//! sender as messages are taken, so a consumer that stops taking stalls its senders through
//! their windows, and memory stays bounded exactly as with a handler.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::pool::{Next, Pool};
use super::{Delivery, NodeRef};
use crate::sync::Arc;

/// Why an [`Inbox`] returned no message.
///
/// ```
/// use std::time::Duration;
/// use cohort::RecvError;
/// # fn main() -> Result<(), cohort::Error> {
/// let (node, inbox) = cohort::Node::builder("alpha").cluster("docs").start_with_inbox()?;
/// assert_eq!(inbox.try_recv().err(), Some(RecvError::Empty));
/// let waited = inbox.recv_timeout(Duration::from_millis(10));
/// assert_eq!(waited.err(), Some(RecvError::Timeout));
/// node.shutdown(Duration::from_secs(5))?;
/// assert_eq!(inbox.recv().err(), Some(RecvError::Closed)); // nothing more will come
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecvError {
    /// [`try_recv`](Inbox::try_recv): no message is waiting now.
    #[error("no message is waiting")]
    Empty,
    /// [`recv_timeout`](Inbox::recv_timeout) or [`recv_deadline`](Inbox::recv_deadline): no
    /// message came in time.
    #[error("no message came before the deadline")]
    Timeout,
    /// The node was shut down and every message it had received has been taken.
    #[error("the node is shut down and its inbox is empty")]
    Closed,
}

/// The node's messages, taken on the application's own thread (see
/// [`Builder::start_with_inbox`](crate::Builder::start_with_inbox)); the method names are
/// crossbeam-channel's.
///
/// - **Order**: a sender's regular messages come out in its order; its out-of-band ones in
///   any order. Senders are served in turn, a batch at most
///   ([`delivery_batch`](crate::Builder::delivery_batch)) from one before the next.
/// - **Flow control holds end to end**: a message's credit goes back to its sender when the
///   inbox takes it off the sender's queue, so a consumer that stops taking stalls each
///   sender after about one window (plus the batch the inbox holds), and resumes it when
///   it takes again.
/// - **One consumer**: an `Inbox` can move to another thread but not be shared (it is
///   `Send`, not `Sync`), which is what keeps a sender's order.
/// - The messages it has taken off the senders' queues and not yet returned (at most one
///   batch) are lost if it is dropped: they count as delivered.
/// - **With a journal** ([`Builder::journal`](crate::Builder::journal)) a message counts as
///   handled, and is acknowledged, once the inbox has handed it to you (a handler's counts
///   when it returns): if the process dies while you process it, that message is lost
///   rather than delivered again. The inbox then takes one message at a time, so at most
///   that one is at stake.
///
/// ```
/// use std::time::Duration;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let (beta, inbox) = cohort::Node::builder("beta").start_with_inbox()?;
/// let alpha = cohort::Node::builder("alpha").peer("beta", beta.local_addr()).start()?;
/// beta.add_peer("alpha", alpha.local_addr())?;
/// for i in 0..10u8 {
///     alpha.send("beta", vec![i])?;
/// }
/// for i in 0..10u8 {
///     let d = inbox.recv_timeout(Duration::from_secs(10))?;
///     assert_eq!((d.from(), d.payload()), ("alpha", &[i][..]));
/// }
/// assert_eq!(inbox.try_recv().unwrap_err(), cohort::RecvError::Empty);
/// alpha.shutdown(Duration::from_secs(5))?;
/// beta.shutdown(Duration::from_secs(5))?;
/// assert_eq!(inbox.recv().unwrap_err(), cohort::RecvError::Closed);
/// # Ok(()) }
/// ```
pub struct Inbox {
    pool: Arc<Pool>,
    /// Its own handle (see `NodeHandle::fork`), for the deliveries' `sender()`.
    node: Option<NodeRef>,
    /// Messages taken off a sender's queue, not yet returned. A `RefCell`: one consumer,
    /// which also makes the inbox `!Sync`.
    hand: RefCell<VecDeque<Delivery>>,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("held", &self.hand.borrow().len())
            .finish_non_exhaustive()
    }
}

impl Inbox {
    /// The inbox that runs `pool`'s tasks (a pool without workers).
    pub(crate) fn new(pool: Arc<Pool>) -> Inbox {
        let node = pool.node().map(|n| n.fork());
        Inbox {
            pool,
            node,
            hand: RefCell::new(VecDeque::new()),
        }
    }

    /// The next message; waits as long as it takes. Fails only with
    /// [`RecvError::Closed`].
    pub fn recv(&self) -> Result<Delivery, RecvError> {
        self.take(None)
    }

    /// The next message if one is waiting: [`RecvError::Empty`] if none.
    pub fn try_recv(&self) -> Result<Delivery, RecvError> {
        self.take(Some(Instant::now())).map_err(|e| match e {
            RecvError::Timeout => RecvError::Empty,
            e => e,
        })
    }

    /// The next message, waiting at most `timeout`: [`RecvError::Timeout`] if none came.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Delivery, RecvError> {
        self.take(Some(Instant::now() + timeout))
    }

    /// The next message, waiting until `deadline`: [`RecvError::Timeout`] if none came.
    pub fn recv_deadline(&self, deadline: Instant) -> Result<Delivery, RecvError> {
        self.take(Some(deadline))
    }

    /// A blocking iterator over the messages; it ends when the node is shut down and the
    /// inbox is empty.
    pub fn iter(&self) -> InboxIter<'_> {
        InboxIter { inbox: self }
    }

    /// An iterator over the messages waiting now; it never blocks.
    pub fn try_iter(&self) -> InboxTryIter<'_> {
        InboxTryIter { inbox: self }
    }

    /// The next message, as a future: for async code, which must not block its
    /// executor's thread in [`recv`](Inbox::recv). It is ready once a message is taken
    /// (`Ok`) or the node is shut down and the inbox empty ([`RecvError::Closed`]); until
    /// then it waits without a thread, woken by the IO thread when a sender's messages
    /// arrive. No runtime of cohort's own is involved: any executor drives it.
    ///
    /// A poll does what [`try_recv`](Inbox::try_recv) does (it runs the senders' queued
    /// deliveries on the polling thread, a batch at most, and membership events when
    /// [`on_event`](crate::Builder::on_event) is set). There is no timeout: race it against
    /// your executor's timer. Dropping it loses nothing: a message is only taken when it is
    /// returned.
    ///
    /// The future borrows the inbox, which has one consumer (it is not `Sync`), so the
    /// future is not `Send`: await it on a current-thread executor or in a task that
    /// stays on its thread (`spawn_local`), not in one a work-stealing runtime may move.
    ///
    /// ```
    /// use std::time::Duration;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let (beta, inbox) = cohort::Node::builder("beta").start_with_inbox()?;
    /// let alpha = cohort::Node::builder("alpha").peer("beta", beta.local_addr()).start()?;
    /// beta.add_peer("alpha", alpha.local_addr())?;
    /// alpha.send("beta", &b"ping"[..])?;
    /// // Any executor; `pollster` is the smallest.
    /// let d = pollster::block_on(async { inbox.recv_async().await })?;
    /// assert_eq!(d.payload(), b"ping");
    /// # alpha.shutdown(Duration::from_secs(5))?;
    /// # beta.shutdown(Duration::from_secs(5))?;
    /// # Ok(()) }
    /// ```
    pub fn recv_async(&self) -> InboxRecv<'_> {
        InboxRecv { inbox: self }
    }

    fn take(&self, deadline: Option<Instant>) -> Result<Delivery, RecvError> {
        super::pool::mark_delivering_thread();
        loop {
            if let Some(d) = self.hand.borrow_mut().pop_front() {
                return Ok(d);
            }
            let hand = &self.hand;
            match self.pool.run_next(deadline, self.node.as_ref(), |d| {
                hand.borrow_mut().push_back(d)
            }) {
                Next::Task(()) => {}
                Next::TimedOut => return Err(RecvError::Timeout),
                Next::Stopped => return Err(RecvError::Closed),
            }
        }
    }
}

/// The next message of an [`Inbox`], as a future (see [`Inbox::recv_async`]).
#[derive(Debug)]
#[must_use = "futures do nothing unless polled or awaited"]
pub struct InboxRecv<'a> {
    inbox: &'a Inbox,
}

impl Future for InboxRecv<'_> {
    type Output = Result<Delivery, RecvError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.inbox.try_recv() {
                Err(RecvError::Empty) => {}
                done => return Poll::Ready(done),
            }
            // Nothing now: be woken by the next task queued (or the stop). A task queued
            // between the look and the registration makes it say "ready": look again.
            if !self.inbox.pool.ready_or_wake(cx.waker()) {
                return Poll::Pending;
            }
        }
    }
}

/// A blocking iterator over an [`Inbox`] (see [`Inbox::iter`]).
#[derive(Debug)]
#[must_use = "iterators are lazy and do nothing unless consumed"]
pub struct InboxIter<'a> {
    inbox: &'a Inbox,
}

impl Iterator for InboxIter<'_> {
    type Item = Delivery;
    fn next(&mut self) -> Option<Delivery> {
        self.inbox.recv().ok()
    }
}

/// A non-blocking iterator over an [`Inbox`] (see [`Inbox::try_iter`]).
#[derive(Debug)]
#[must_use = "iterators are lazy and do nothing unless consumed"]
pub struct InboxTryIter<'a> {
    inbox: &'a Inbox,
}

impl Iterator for InboxTryIter<'_> {
    type Item = Delivery;
    fn next(&mut self) -> Option<Delivery> {
        self.inbox.try_recv().ok()
    }
}

impl<'a> IntoIterator for &'a Inbox {
    type Item = Delivery;
    type IntoIter = InboxIter<'a>;
    fn into_iter(self) -> InboxIter<'a> {
        self.iter()
    }
}
