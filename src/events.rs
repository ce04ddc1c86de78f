//! Membership events: what happens to a node's peers, told to the application's
//! [`on_event`](crate::Builder::on_event) callback.
//!
//! The protocol decides the transitions (`proto`: a handshake completes, a connection is
//! lost, a peer turns out to be a new incarnation, a handshake is refused, a member is
//! removed or forgotten) and records them as facts; the IO thread turns each into an
//! [`Event`] and pushes it on an [`EventQueue`]. The queue is delivered on the delivery
//! pool by one task at a time, so events reach the callback in the order they happened and
//! never run on the IO thread. It holds at most its capacity; beyond it events are dropped
//! and counted ([`Stats::events_dropped`](crate::Stats::events_dropped)).

use crate::addr::Addr;
use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{Arc, Mutex, SharedStr};

/// Events pending delivery at most, by default ([`Builder::event_capacity`]).
///
/// [`Builder::event_capacity`]: crate::Builder::event_capacity
pub(crate) const DEFAULT_CAPACITY: usize = 4096;

/// Something that happened to one of a node's peers.
///
/// Events of a node reach its [`on_event`](crate::Builder::on_event) callback one at a
/// time, in the order they happened: a peer's `Connected` comes before the `Disconnected`
/// that ends that connection, and a peer is never `Connected` twice without a
/// `Disconnected` between (as long as no event was dropped: see
/// [`Stats::events_dropped`](crate::Stats::events_dropped)).
///
/// ```
/// use cohort::{Event, Node};
///
/// let node = Node::builder("alpha")
///     .on_event(|e: Event| match e {
///         Event::Connected { peer, incarnation } => {
///             println!("{peer} is up (incarnation {incarnation:016x})")
///         }
///         Event::Disconnected { peer, reason } => println!("{peer} is down: {reason}"),
///         Event::NewIncarnation { peer, undelivered, .. } => {
///             println!("{peer} restarted; {undelivered} messages to it were lost")
///         }
///         other => println!("{other}"),
///     })
///     .start()?;
/// node.shutdown(std::time::Duration::from_secs(5))?;
/// # Ok::<(), cohort::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A connection to `peer` completed its handshake: messages flow.
    Connected {
        /// The member's name.
        peer: String,
        /// The peer's launch id: a process's incarnation, random per start (kept across
        /// restarts by a journalling member).
        incarnation: u64,
    },
    /// The connection to `peer` is gone. Unless the peer was removed or this node is
    /// shutting down, it is re-established with backoff (a configured peer is dialled, a
    /// member admitted at run time is expected to dial again).
    Disconnected {
        /// The member's name.
        peer: String,
        /// Why.
        reason: DisconnectReason,
    },
    /// `peer` restarted as a new process (a new launch id): the messages its previous
    /// incarnation had not acknowledged will never be delivered. `undelivered` counts them
    /// all, replies to its requests included (as
    /// [`PeerStats::undelivered`](crate::PeerStats::undelivered) does); those but the
    /// replies are handed to [`on_undelivered`](crate::Builder::on_undelivered) (a reply
    /// has nobody to go back to: the requester that asked is gone), so it may receive
    /// fewer than `undelivered`. Comes once per new incarnation, before its `Connected`.
    NewIncarnation {
        /// The member's name.
        peer: String,
        /// The new launch id.
        incarnation: u64,
        /// Messages to the old incarnation published and never acknowledged, replies
        /// included; `on_undelivered` is given these less the replies.
        undelivered: u64,
    },
    /// A handshake was refused, by this node or by the other side; the connection was
    /// closed.
    Refused {
        /// The member the connection spoke for, when known (the one we dialled, or the one
        /// the handshake claimed).
        peer: Option<String>,
        /// The other end's address, when known.
        addr: Option<Addr>,
        /// Why.
        reason: RefuseReason,
        /// Whether the other side refused us (`true`) rather than we it.
        by_peer: bool,
    },
    /// `peer` was removed for good ([`Node::remove_peer`](crate::Node::remove_peer)).
    Removed {
        /// The member's name.
        peer: String,
    },
    /// `peer`, a member admitted at run time
    /// ([`allow_unknown_members`](crate::Builder::allow_unknown_members)), stayed
    /// disconnected for [`forget_after`](crate::Builder::forget_after) and was removed, as
    /// [`Node::remove_peer`](crate::Node::remove_peer) would.
    Forgotten {
        /// The member's name.
        peer: String,
    },
    /// Membership ([`Builder::membership`](crate::Builder::membership)): a member joined the
    /// view — new to it, or back after it failed or left — listening at `addr`. It is a
    /// peer from now on (dialled there).
    MemberJoined {
        /// The member's name.
        peer: String,
        /// Where it listens.
        addr: SocketAddr,
        /// Its membership incarnation (raised by the member to refute a suspicion).
        incarnation: u64,
    },
    /// Membership: a probe of the member failed, directly and through others: it is
    /// declared failed unless it answers within the suspicion timeout.
    MemberSuspected {
        /// The member's name.
        peer: String,
    },
    /// Membership: a suspected member answered (it refuted the suspicion).
    MemberAlive {
        /// The member's name.
        peer: String,
    },
    /// Membership: the member was declared failed (its probes failed and the suspicion
    /// timed out): it is removed, as [`Node::remove_peer`](crate::Node::remove_peer) does —
    /// its queued messages fail and what it never acknowledged is reported undelivered. A
    /// restarted process of that name joins again ([`Event::MemberJoined`]).
    MemberFailed {
        /// The member's name.
        peer: String,
    },
    /// Membership: the member left the cluster (it shut down cleanly): removed likewise.
    MemberLeft {
        /// The member's name.
        peer: String,
    },
}

impl Event {
    /// The member the event is about, when it names one.
    pub fn peer(&self) -> Option<&str> {
        match self {
            Event::Connected { peer, .. }
            | Event::Disconnected { peer, .. }
            | Event::NewIncarnation { peer, .. }
            | Event::Removed { peer }
            | Event::Forgotten { peer }
            | Event::MemberJoined { peer, .. }
            | Event::MemberSuspected { peer }
            | Event::MemberAlive { peer }
            | Event::MemberFailed { peer }
            | Event::MemberLeft { peer } => Some(peer),
            Event::Refused { peer, .. } => peer.as_deref(),
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Connected { peer, incarnation } => {
                write!(f, "'{peer}' connected (incarnation {incarnation:016x})")
            }
            Event::Disconnected { peer, reason } => write!(f, "'{peer}' disconnected: {reason}"),
            Event::NewIncarnation {
                peer,
                incarnation,
                undelivered,
            } => write!(
                f,
                "'{peer}' restarted (incarnation {incarnation:016x}); {undelivered} messages undelivered"
            ),
            Event::Refused {
                peer,
                addr,
                reason,
                by_peer,
            } => {
                let who = peer.as_deref().map_or("a connection".to_owned(), |p| format!("'{p}'"));
                let at = addr
                    .as_ref()
                    .map_or(String::new(), |a| format!(" at {a}"));
                if *by_peer {
                    write!(f, "{who}{at} refused our handshake: {reason}")
                } else {
                    write!(f, "refused {who}{at}: {reason}")
                }
            }
            Event::Removed { peer } => write!(f, "'{peer}' removed"),
            Event::Forgotten { peer } => write!(f, "'{peer}' forgotten"),
            Event::MemberJoined {
                peer,
                addr,
                incarnation,
            } => write!(f, "member '{peer}' joined at {addr} (incarnation {incarnation})"),
            Event::MemberSuspected { peer } => write!(f, "member '{peer}' suspected"),
            Event::MemberAlive { peer } => write!(f, "member '{peer}' alive again"),
            Event::MemberFailed { peer } => write!(f, "member '{peer}' failed: removed"),
            Event::MemberLeft { peer } => write!(f, "member '{peer}' left: removed"),
        }
    }
}

/// A member of the cluster as this node's membership view holds it
/// ([`Node::members`](crate::Node::members)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    /// Its name.
    pub name: String,
    /// Where it listens (and receives membership packets).
    pub addr: SocketAddr,
    /// Where the view has it.
    pub state: MemberState,
    /// Its membership incarnation: raised by the member itself to refute a suspicion, or
    /// when it joins again.
    pub incarnation: u64,
}

/// Where a member stands in the membership view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemberState {
    /// Answering probes.
    Alive,
    /// A probe failed; declared failed unless it answers within the suspicion timeout.
    Suspect,
    /// Declared failed: removed; kept in the view for a while, then forgotten.
    Failed,
    /// Left the cluster cleanly; kept in the view for a while, then forgotten.
    Left,
}

impl fmt::Display for MemberState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemberState::Alive => "alive",
            MemberState::Suspect => "suspect",
            MemberState::Failed => "failed",
            MemberState::Left => "left",
        })
    }
}

/// Why a connection to a peer was lost ([`Event::Disconnected`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DisconnectReason {
    /// The peer closed the connection (it said so, or its end of the socket closed).
    PeerClosed,
    /// Nothing was read from the connection for the idle timeout (a silent or half-open
    /// connection).
    IdleTimeout,
    /// The peer broke the protocol (a malformed frame, a window violation...).
    ProtocolError,
    /// Reading or writing the socket failed.
    Io,
    /// TLS failed on the connection (feature `tls`).
    Tls,
    /// A newer connection from the same peer replaced it (the peer reconnected, or
    /// restarted, while this one still looked open).
    Replaced,
    /// [`Node::disconnect`](crate::Node::disconnect) asked for it.
    Requested,
    /// The peer was removed ([`Node::remove_peer`](crate::Node::remove_peer)) or forgotten.
    Removed,
    /// This node is shutting down.
    Shutdown,
}

impl fmt::Display for DisconnectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            DisconnectReason::PeerClosed => "closed by the peer",
            DisconnectReason::IdleTimeout => "idle timeout",
            DisconnectReason::ProtocolError => "protocol error",
            DisconnectReason::Io => "I/O error",
            DisconnectReason::Tls => "TLS failure",
            DisconnectReason::Replaced => "replaced by a newer connection",
            DisconnectReason::Requested => "disconnect requested",
            DisconnectReason::Removed => "removed",
            DisconnectReason::Shutdown => "shutting down",
        })
    }
}

/// Why a handshake was refused ([`Event::Refused`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RefuseReason {
    /// The other side belongs to another cluster.
    WrongCluster,
    /// The member is not configured on the refusing side, which does not admit unknown
    /// members.
    UnknownMember,
    /// The protocol versions differ.
    Version,
    /// Authentication failed: no secret, another secret, or one where none is expected.
    Auth,
    /// The handshake named another member than the one dialled, or (TLS) the certificate
    /// is not valid for the member name claimed.
    NameMismatch,
    /// Another live process holds the member name: the refusing side has an established
    /// connection with another incarnation (launch id) of that name, or the refused
    /// incarnation was already replaced there by a newer one. Two processes were started
    /// with one name (or an old one is still running). The refused one retries with backoff:
    /// while the name is held by a live connection, it gets in once that process is gone; a
    /// process the name was taken from (replaced by a newer incarnation) stays refused by
    /// that member, and must be restarted (a new launch id) or stopped.
    NameInUse,
}

impl fmt::Display for RefuseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            RefuseReason::WrongCluster => "wrong cluster",
            RefuseReason::UnknownMember => "unknown member",
            RefuseReason::Version => "protocol version mismatch",
            RefuseReason::Auth => "authentication failed",
            RefuseReason::NameMismatch => "member name mismatch",
            RefuseReason::NameInUse => "member name in use by another live process",
        })
    }
}

/// The application's event callback.
pub type EventFn = Arc<dyn Fn(Event) + Send + Sync>;

struct Inner {
    queue: VecDeque<Event>,
    /// A pool task holds the queue (queued or running): producers do not submit another.
    running: bool,
    /// Events were dropped since the queue last emptied (the warning is logged once per
    /// such episode).
    overflowing: bool,
}

/// The ordered, bounded queue of a node's events: the IO thread pushes, one pool task at a
/// time delivers. The running flag lives under the queue's lock, so an event pushed while
/// the deliverer is leaving is never stranded: either the deliverer's last look (under the
/// lock) finds it, or the push finds the flag cleared and schedules a new deliverer.
pub struct EventQueue {
    node: SharedStr,
    inner: Mutex<Inner>,
    handler: EventFn,
    capacity: usize,
    dropped: AtomicU64,
    delivered: AtomicU64,
    panics: AtomicU64,
}

impl fmt::Debug for EventQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventQueue")
            .field("node", &self.node)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// What a push asks of the pusher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Pushed {
    /// Queued behind a deliverer already scheduled.
    Queued,
    /// Queued; no deliverer holds the queue: submit one ([`Task::Events`]).
    ///
    /// [`Task::Events`]: crate::deliver::Task::Events
    Schedule,
    /// Dropped: the queue was full (counted).
    Dropped,
}

impl EventQueue {
    /// An empty queue of node `node`'s events for `handler`, holding at most `capacity`.
    pub fn new(node: SharedStr, handler: EventFn, capacity: usize) -> EventQueue {
        EventQueue {
            node,
            inner: Mutex::new(Inner {
                queue: VecDeque::new(),
                running: false,
                overflowing: false,
            }),
            handler,
            capacity: capacity.max(1),
            dropped: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            panics: AtomicU64::new(0),
        }
    }

    /// Queues `event` (or drops it when full).
    pub fn push(&self, event: Event) -> Pushed {
        let mut inner = self.inner.lock();
        if inner.queue.len() >= self.capacity {
            // Relaxed: a counter for stats.
            self.dropped.fetch_add(1, Ordering::Relaxed);
            if !inner.overflowing {
                inner.overflowing = true;
                log::warn!(
                    "{}: {} membership events wait for the on_event callback; dropping the newer ones (counted in events_dropped)",
                    self.node,
                    self.capacity
                );
            }
            return Pushed::Dropped;
        }
        inner.queue.push_back(event);
        if inner.running {
            Pushed::Queued
        } else {
            inner.running = true;
            Pushed::Schedule
        }
    }

    /// The deliverer (the pool task holding the queue): hands events to the callback one at
    /// a time, in order, at most `budget` of them. Returns `true` when the budget ran out
    /// with events left (the caller submits the task again, to the back of the pool's
    /// queue), `false` when the queue is empty and released.
    pub fn run(&self, budget: usize) -> bool {
        for _ in 0..budget.max(1) {
            let event = {
                let mut inner = self.inner.lock();
                match inner.queue.pop_front() {
                    Some(e) => e,
                    None => {
                        inner.running = false;
                        inner.overflowing = false;
                        return false;
                    }
                }
            };
            if catch_unwind(AssertUnwindSafe(|| (self.handler)(event))).is_err() {
                // Relaxed: a counter for stats.
                self.panics.fetch_add(1, Ordering::Relaxed);
                log::error!(
                    "{}: the on_event callback panicked; continuing (counted in event_panics)",
                    self.node
                );
            }
            // Relaxed: a counter.
            self.delivered.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Panics of the callback caught (each event counts as delivered).
    pub fn panics(&self) -> u64 {
        // Relaxed: a counter for stats.
        self.panics.load(Ordering::Relaxed)
    }

    /// Events dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        // Relaxed: a counter for stats.
        self.dropped.load(Ordering::Relaxed)
    }

    /// Events handed to the callback so far.
    #[cfg(any(test, cohort_internals))]
    pub fn delivered(&self) -> u64 {
        // Relaxed: a counter for stats.
        self.delivered.load(Ordering::Relaxed)
    }

    /// Events waiting now.
    #[cfg(any(test, cohort_internals))]
    pub fn len(&self) -> usize {
        self.inner.lock().queue.len()
    }

    /// Whether no event waits now.
    #[cfg(any(test, cohort_internals))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn connected(n: u64) -> Event {
        Event::Connected {
            peer: "p".into(),
            incarnation: n,
        }
    }

    #[test]
    fn one_deliverer_in_order_and_a_bound() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let q = EventQueue::new(
            "n".into(),
            Arc::new(move |e| {
                if let Event::Connected { incarnation, .. } = e {
                    s.lock().push(incarnation);
                }
            }),
            3,
        );
        assert_eq!(q.push(connected(1)), Pushed::Schedule);
        assert_eq!(q.push(connected(2)), Pushed::Queued);
        assert_eq!(q.push(connected(3)), Pushed::Queued);
        assert_eq!(q.push(connected(4)), Pushed::Dropped);
        assert_eq!(q.dropped(), 1);
        assert!(q.run(2), "the budget ran out with one left");
        assert!(!q.run(8), "emptied and released");
        assert_eq!(*seen.lock(), vec![1, 2, 3]);
        assert_eq!(
            q.push(connected(5)),
            Pushed::Schedule,
            "released: a new deliverer"
        );
        assert!(!q.run(8));
        assert_eq!(q.delivered(), 4);
    }

    #[test]
    fn a_panicking_callback_does_not_stop_delivery() {
        let q = EventQueue::new("n".into(), Arc::new(|_| panic!("callback")), 8);
        assert_eq!(q.push(connected(1)), Pushed::Schedule);
        assert_eq!(q.push(connected(2)), Pushed::Queued);
        assert!(!q.run(8));
        assert_eq!(q.delivered(), 2);
    }
}
