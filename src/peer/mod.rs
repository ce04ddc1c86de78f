//! A member's lifecycle and the per-peer state shared between application threads, the IO
//! thread and the pool.
//!
//! ```text
//!             ┌──────────── dial fails / connection lost ───────────┐
//!             ▼                                                     │
//!  Connecting ──► Handshaking ──► Connected ──► Backoff ──► Connecting …
//!       │              │              │            │
//!       └──────────────┴──────────────┴────────────┴──► Closed (terminal: removed / shutdown)
//! ```
//!
//! `Backoff` means "not connected, may reconnect"; `Closed` means "closed for good": no
//! timer scheduled earlier can dial again, and a connection completing after `Closed` is
//! closed at once. Every transition goes through [`PeerState::can_become`].

mod outbox;
mod requests;

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

pub(crate) use outbox::Owed;
pub use outbox::{
    Framed, Ledger, Outbox, Outgoing, Queued, Return, FRAMED_MAX_PAYLOAD, FRAMED_RUN_BYTES,
};
pub use requests::{Failure, Requests, Slot};

use crate::deliver::{MemberQueue, OobQueue, PeerCreditSink, Progress};
use crate::flow::RecvCredit;
use crate::handoff::{Handoff, Scheduled};
use crate::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use crate::sync::{wait_until, Arc, Condvar, Mutex, RwLock, SharedStr};
use crate::util::NameHash;

/// Where a peer is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
#[repr(u8)]
pub enum PeerState {
    /// A TCP connect is in progress.
    Connecting = 0,
    /// A connection is up and exchanging the handshake.
    Handshaking = 1,
    /// Handshake done; messages flow.
    Connected = 2,
    /// Not connected; a reconnect is scheduled (or the peer is expected to dial us).
    Backoff = 3,
    /// Removed or shut down: terminal.
    Closed = 4,
}

impl PeerState {
    fn from_u8(v: u8) -> PeerState {
        match v {
            0 => PeerState::Connecting,
            1 => PeerState::Handshaking,
            2 => PeerState::Connected,
            3 => PeerState::Backoff,
            _ => PeerState::Closed,
        }
    }

    /// Whether the lifecycle allows going from `self` to `next`. Staying in a state is
    /// allowed (a second connection can handshake while one already is); nothing leaves
    /// `Closed`.
    pub fn can_become(self, next: PeerState) -> bool {
        use PeerState::*;
        match (self, next) {
            (Closed, _) => false,
            (_, Closed) => true,
            (a, b) if a == b => true,
            (Connecting, Handshaking | Backoff) => true,
            (Handshaking, Connected | Backoff | Connecting) => true,
            (Connected, Backoff | Handshaking) => true,
            (Backoff, Connecting | Handshaking) => true,
            _ => false,
        }
    }
}

impl fmt::Display for PeerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            PeerState::Connecting => "connecting",
            PeerState::Handshaking => "handshaking",
            PeerState::Connected => "connected",
            PeerState::Backoff => "backoff",
            PeerState::Closed => "closed",
        };
        f.pad(s)
    }
}

/// What the outbound filter is told about the peer a message is about to be published to,
/// as of that moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerInfo<'a> {
    /// Member name.
    pub name: &'a str,
    /// The peer's current incarnation, once it has completed a handshake.
    pub launch_id: Option<u64>,
    /// Its lifecycle state.
    pub state: PeerState,
}

impl<'a> PeerInfo<'a> {
    pub(crate) fn new(name: &'a str, launch_id: Option<u64>, state: PeerState) -> PeerInfo<'a> {
        PeerInfo {
            name,
            launch_id,
            state,
        }
    }
}

/// Decides, right before a message is published to a peer, whether it goes out (`true`) or
/// is dropped (`false`: its permits go back, it is counted `filtered`, it gets no sequence
/// number). Runs on the IO thread: keep it fast and non-blocking.
pub type OutboundFilter = dyn Fn(&PeerInfo<'_>, &Outgoing) -> bool + Send + Sync;

/// Per-peer counters. They add up: `accepted == sent + filtered + failed + queued` at every
/// instant the stats are read (queued is derived). `expired` is part of `failed`,
/// `withdrawn` part of `filtered`.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) sent: AtomicU64,
    pub(crate) sent_bytes: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) failed_bytes: AtomicU64,
    pub(crate) filtered: AtomicU64,
    pub(crate) filtered_bytes: AtomicU64,
    pub(crate) expired: AtomicU64,
    /// Requests given up by their requester before they left (counted in `filtered`).
    pub(crate) withdrawn: AtomicU64,
    pub(crate) probes: AtomicU64,
    pub(crate) received: AtomicU64,
    pub(crate) received_bytes: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) resent: AtomicU64,
    pub(crate) connects: AtomicU64,
    pub(crate) disconnects: AtomicU64,
    pub(crate) undelivered: AtomicU64,
    /// Reliable messages published and not yet acknowledged (a gauge).
    pub(crate) unacked: AtomicU64,
    /// The most window bytes ever held for this peer (received, not yet consumed).
    pub(crate) held_peak: AtomicU64,
    /// Round-trip samples (the IO thread's probes and their acks).
    pub(crate) rtt: Rtt,
    /// When bytes last arrived on the peer's established connection.
    pub(crate) heard: Heard,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        // Release/Acquire: a reader that sees an outcome (sent, failed...) also sees the
        // outbox state that preceded it, so `accepted`, read after, never lags behind.
        c.fetch_add(n, Ordering::Release);
    }
    pub(crate) fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Acquire)
    }
    /// Raises the held high-water mark to `held` (the IO thread, its only writer).
    pub(crate) fn note_held(&self, held: u64) {
        // Relaxed: a gauge; one writer, so a load and a store suffice.
        if held > self.held_peak.load(Ordering::Relaxed) {
            self.held_peak.store(held, Ordering::Relaxed);
        }
    }
}

/// Round-trip times measured by the IO thread (its only writer): the last sample and a
/// smoothed value, `srtt = 7/8 srtt + 1/8 sample` as TCP's (RFC 6298), in nanoseconds; 0
/// means none measured yet.
#[derive(Debug, Default)]
pub(crate) struct Rtt {
    last: AtomicU64,
    smoothed: AtomicU64,
}

impl Rtt {
    /// Takes one sample.
    pub(crate) fn sample(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
        // Relaxed: gauges with one writer; a reader may pair one sample's `last` with the
        // previous sample's `smoothed`, each value whole, which a snapshot allows.
        let old = self.smoothed.load(Ordering::Relaxed);
        let smoothed = if old == 0 { ns } else { old - old / 8 + ns / 8 };
        self.last.store(ns, Ordering::Relaxed);
        self.smoothed.store(smoothed.max(1), Ordering::Relaxed);
    }

    /// The last sample.
    pub(crate) fn last(&self) -> Option<Duration> {
        nonzero(self.last.load(Ordering::Relaxed))
    }

    /// The smoothed value.
    pub(crate) fn smoothed(&self) -> Option<Duration> {
        nonzero(self.smoothed.load(Ordering::Relaxed))
    }
}

fn nonzero(ns: u64) -> Option<Duration> {
    (ns > 0).then(|| Duration::from_nanos(ns))
}

/// When a peer was last heard from: nanoseconds past `epoch`, plus one (0: never), written
/// by the IO thread once per read.
#[derive(Debug)]
pub(crate) struct Heard {
    epoch: Instant,
    at: AtomicU64,
}

impl Default for Heard {
    fn default() -> Heard {
        Heard {
            epoch: Instant::now(),
            at: AtomicU64::new(0),
        }
    }
}

impl Heard {
    /// Bytes arrived at `now`.
    pub(crate) fn note(&self, now: Instant) {
        let ns = now.saturating_duration_since(self.epoch).as_nanos();
        let ns = u64::try_from(ns).unwrap_or(u64::MAX - 1) + 1;
        // Relaxed: a gauge with one writer; nothing else is read on the strength of it.
        self.at.store(ns, Ordering::Relaxed);
    }

    /// How long before `now` bytes last arrived (`None`: never).
    pub(crate) fn since(&self, now: Instant) -> Option<Duration> {
        let at = self.at.load(Ordering::Relaxed).checked_sub(1)?;
        let at = self.epoch.checked_add(Duration::from_nanos(at))?;
        Some(now.saturating_duration_since(at))
    }
}

/// The peers a node knows, by name: read by the send path, written by `add_peer` and
/// `remove_peer`, and by the IO thread, which [`admit`]s members that dial in unknown and
/// [`forget`]s them. (Loom model: `loom-tests/tests/peer_map.rs`.) Every change goes
/// through [`Peers::change`], which bumps a generation under the write lock, so a send by
/// name can take again the peer it found last ([`Found`], kept per thread by the send path)
/// while the map is the same one and its generation unchanged: no lock, no hash.
pub(crate) struct Peers {
    map: RwLock<HashMap<SharedStr, Arc<PeerShared>, NameHash>>,
    generation: AtomicU64,
    /// Which map this is, unique in the process: a [`Found`] of a map since dropped is not
    /// taken for one allocated at the same address.
    id: u64,
}

/// A look-up by name remembered: `peer` was the entry for its name in map `map` (a
/// [`Peers::id`]) at generation `generation`, and is while both hold. `misses`: sends by
/// other names, or through other nodes, since it was last taken.
pub struct Found {
    map: u64,
    generation: u64,
    peer: Arc<PeerShared>,
    misses: u32,
}

/// Sends by other names (or through other nodes) after which a remembered peer gives way
/// to the one looked up: a thread that moved to another peer gets the fast path again, and
/// one that alternates between peers pays the remembering (a reference count taken and
/// dropped) once in so many sends.
const FOUND_GIVES_WAY: u32 = 64;

impl fmt::Debug for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Found")
            .field("peer", &self.peer.name)
            .field("generation", &self.generation)
            .field("misses", &self.misses)
            .finish_non_exhaustive()
    }
}

impl Default for Peers {
    fn default() -> Peers {
        // Only an identity, never a hand-off between threads: std's atomic, outside the
        // facade (loom's are not statics), Relaxed.
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Peers {
            map: RwLock::new(HashMap::default()),
            generation: AtomicU64::new(0),
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }
}

impl fmt::Debug for Peers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peers")
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl Peers {
    /// The map, under its read lock.
    pub(crate) fn read(
        &self,
    ) -> impl std::ops::Deref<Target = HashMap<SharedStr, Arc<PeerShared>, NameHash>> + '_ {
        self.map.read()
    }

    /// Changes the map under its write lock, and bumps the generation before the lock goes.
    pub(crate) fn change<R>(
        &self,
        f: impl FnOnce(&mut HashMap<SharedStr, Arc<PeerShared>, NameHash>) -> R,
    ) -> R {
        let mut map = self.map.write();
        let r = f(&mut map);
        // Release, and bumped under the write lock: a look-up under the read lock reads the
        // generation of the map it sees, and a send ordered after this change (after
        // `add_peer` or `remove_peer` returned, say) reads this generation or a later one
        // (Acquire in `generation`), so it never takes a peer remembered from before.
        self.generation.fetch_add(1, Ordering::Release);
        r
    }

    /// The generation: bumped by every change of the map.
    #[inline]
    fn generation(&self) -> u64 {
        // Acquire: pairs with `change`'s Release (see there).
        self.generation.load(Ordering::Acquire)
    }

    /// Runs `f` on the peer named `name`: the one `last` remembers, while `last` was found
    /// in this map and the map has not changed since ([`remembered`](Peers::remembered));
    /// else the one the map holds, under its read lock ([`look_up`](Peers::look_up)).
    /// `None` if no peer has that name (`f` not run). What the send path does
    /// (`SendCore::send_plain`'s first try, then `SendCore::enqueue_found`), for the loom
    /// models.
    #[cfg(any(test, cohort_internals))]
    pub(crate) fn with_found<R>(
        &self,
        name: &str,
        last: &mut Option<Found>,
        f: impl FnOnce(&Arc<PeerShared>) -> R,
    ) -> Option<R> {
        if let Some(peer) = self.remembered_if_hit(name, last) {
            return Some(f(peer));
        }
        if let Some(peer) = self.remembered(name, last) {
            return Some(f(peer));
        }
        self.look_up(name, last, f)
    }

    /// The peer `last` remembers, if it is named `name`, was found in this map, and the map
    /// has not changed since: one load, no lock, as if looked up at that load. Otherwise
    /// `None`, and a miss counted against what `last` remembers.
    #[inline]
    pub(crate) fn remembered<'a>(
        &self,
        name: &str,
        last: &'a mut Option<Found>,
    ) -> Option<&'a Arc<PeerShared>> {
        let found = last.as_mut()?;
        if self.holds(found, name) {
            found.misses = 0;
            return Some(&found.peer);
        }
        if found.map != self.id {
            // Another node's peer (perhaps of a node since gone): a miss like another name,
            // so a thread sending through two nodes in turn does not trade its entry back
            // and forth.
            found.misses += 1;
            return None;
        }
        if found.generation != self.generation() {
            return None;
        }
        // Another name.
        found.misses += 1;
        None
    }

    /// [`remembered`](Peers::remembered), but a miss is not counted: for a first try that
    /// leaves a miss to the look-up after it.
    #[inline]
    pub(crate) fn remembered_if_hit<'a>(
        &self,
        name: &str,
        last: &'a mut Option<Found>,
    ) -> Option<&'a Arc<PeerShared>> {
        let found = last.as_mut().filter(|f| self.holds(f, name))?;
        found.misses = 0;
        Some(&found.peer)
    }

    /// Whether `found` is `name`'s entry in this map as it is now.
    #[inline]
    fn holds(&self, found: &Found, name: &str) -> bool {
        found.map == self.id && found.generation == self.generation() && *found.peer.name == *name
    }

    /// Runs `f` on the peer named `name` under the map's read lock, and remembers it in
    /// `last` if `last` remembers nothing, remembers this map as it was before a change, or
    /// has missed [`FOUND_GIVES_WAY`] times (other names, other nodes' maps).
    /// `None` if no peer has that name (`f` not run).
    #[cold]
    pub(crate) fn look_up<R>(
        &self,
        name: &str,
        last: &mut Option<Found>,
        f: impl FnOnce(&Arc<PeerShared>) -> R,
    ) -> Option<R> {
        let map = self.map.read();
        let peer = map.get(name)?;
        // `f` queues a message and rings: under the map's lock, the ring wakes the IO
        // thread rather than drive its turn here (what that turn drops or runs could
        // take this lock again, or a lock the application holds).
        let f = |peer: &Arc<PeerShared>| crate::handoff::undriven(|| f(peer));
        // Replaced when it is empty, out of date for this map, or has missed often enough.
        let replace = last.as_ref().is_none_or(|l| {
            (l.map == self.id && l.generation != self.generation()) || l.misses >= FOUND_GIVES_WAY
        });
        if replace {
            *last = Some(Found {
                map: self.id,
                // Under the read lock: no change can come between the look-up and this
                // read.
                generation: self.generation(),
                peer: peer.clone(),
                misses: 0,
            });
        }
        Some(f(peer))
    }
}

/// The IO thread admitted `shared`, a member that dialled in unknown: senders find it by
/// name from now on.
pub(crate) fn admit(peers: &Peers, shared: Arc<PeerShared>) {
    peers.change(|map| map.insert(shared.name.clone(), shared));
}

/// The IO thread forgot `shared`, retired first (its outbox closed, what it held failed, its
/// window closed), so a sender that found it before this fails rather than queue on it.
/// Removed from `peers` unless its name now belongs to another (a member added again
/// since). Returns whether it was removed.
pub(crate) fn forget(peers: &Peers, shared: &Arc<PeerShared>) -> bool {
    peers.change(|map| {
        // Only the state the endpoint retired: a member added again under the name since
        // is another.
        if map
            .get(&shared.name)
            .is_some_and(|p| Arc::ptr_eq(p, shared))
        {
            map.remove(&shared.name);
            return true;
        }
        false
    })
}

/// Per-peer state shared by every thread.
pub struct PeerShared {
    pub(crate) id: usize,
    pub(crate) name: SharedStr,
    /// Send window and accepted messages waiting for the IO thread. Closed (no more pushes)
    /// once the peer is removed or the node shuts down; the flag lives under the queue's lock
    /// so a push can never slip in after the final drain.
    pub(crate) outbox: Outbox,
    /// Set while the peer is in the IO thread's ready list (or held back by it).
    pub(crate) scheduled: Scheduled,
    /// Set once a message with a time-to-live was queued: the IO thread then sweeps this
    /// peer's queue for expired messages while it is disconnected.
    uses_ttl: AtomicBool,
    /// Set when a requester gave up a request (timed out, or its `PendingReply` dropped):
    /// the IO thread then sweeps this peer's queue for withdrawn requests while it is
    /// disconnected, so their permits come back before the peer does.
    withdrawals: AtomicBool,
    /// The largest message the peer accepts, from its last handshake (`usize::MAX` until
    /// one completed); kept while it is disconnected. Written by the IO thread, read by
    /// senders, which refuse a larger message at once.
    peer_max_message: AtomicUsize,
    /// Lifecycle state mirrored for stats and `wait_connected` (the IO thread owns the
    /// real one). Written under `state_lock`, so that a waiter that saw the old state under
    /// the lock is already waiting on `state_changed` when the writer notifies.
    state: AtomicU8,
    state_lock: Mutex<()>,
    state_changed: Condvar,
    pub(crate) credit: Arc<RecvCredit>,
    pub(crate) member: Arc<MemberQueue>,
    /// Out-of-band messages from this peer, drained by at most its share of the pool.
    pub(crate) oob: Arc<OobQueue>,
    /// How far the application has handled this peer's reliable stream (journalling
    /// nodes only).
    pub(crate) progress: Option<Arc<Progress>>,
    /// This node's requests to the peer, waiting for their replies.
    pub(crate) requests: Requests,
    pub(crate) counters: Counters,
}

impl fmt::Debug for PeerShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerShared")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("state", &self.state())
            .finish()
    }
}

/// What a node's peers share, whichever peer: set at start, read by [`PeerShared::wired`].
#[derive(Clone, Debug)]
pub(crate) struct PeerWiring {
    /// Where deliverers report consumption (the IO thread's hand-off).
    pub(crate) handoff: Arc<Handoff>,
    /// The node journals: peers track how far their streams have been handled.
    pub(crate) journalled: bool,
    /// Pool threads that may deliver one sender's out-of-band messages at once.
    pub(crate) oob_limit: usize,
    /// Requests one peer may have in flight from this node.
    pub(crate) max_requests: usize,
}

impl PeerShared {
    /// Peer `id`'s shared state as a node makes it: its receive credit and, journalling,
    /// its progress, with its member and out-of-band queues reporting both to the IO
    /// thread through `wiring.handoff`.
    pub(crate) fn wired(
        id: usize,
        name: SharedStr,
        window: u64,
        wiring: &PeerWiring,
    ) -> PeerShared {
        let credit = Arc::new(RecvCredit::new());
        let progress = wiring.journalled.then(|| Arc::new(Progress::new(0)));
        let sink =
            || PeerCreditSink::new(id, credit.clone(), progress.clone(), wiring.handoff.clone());
        let member = Arc::new(MemberQueue::new(name.clone(), Box::new(sink())));
        let oob = Arc::new(OobQueue::new(
            name.clone(),
            wiring.oob_limit,
            Arc::new(sink()),
        ));
        PeerShared::new(
            id,
            name,
            window,
            credit,
            member,
            oob,
            progress,
            wiring.max_requests,
        )
    }

    // Its parts, wired together by [`wired`](PeerShared::wired) (or, without a receive
    // side, by the internals' `shared`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: usize,
        name: SharedStr,
        window: u64,
        credit: Arc<RecvCredit>,
        member: Arc<MemberQueue>,
        oob: Arc<OobQueue>,
        progress: Option<Arc<Progress>>,
        max_requests: usize,
    ) -> PeerShared {
        PeerShared {
            id,
            name,
            outbox: Outbox::new(window),
            scheduled: Scheduled::new(),
            uses_ttl: AtomicBool::new(false),
            withdrawals: AtomicBool::new(false),
            peer_max_message: AtomicUsize::new(usize::MAX),
            state: AtomicU8::new(PeerState::Backoff as u8),
            state_lock: Mutex::new(()),
            state_changed: Condvar::new(),
            credit,
            member,
            oob,
            progress,
            requests: Requests::new(max_requests),
            counters: Counters::default(),
        }
    }

    /// Whether the node journals this peer's stream (it tracks how far the application
    /// handled it).
    pub(crate) fn journalled(&self) -> bool {
        self.progress.is_some()
    }

    pub(crate) fn note_ttl(&self) {
        // Relaxed: a hint for the IO thread's sweep; a late sweep only delays expiry.
        if !self.uses_ttl.load(Ordering::Relaxed) {
            self.uses_ttl.store(true, Ordering::Relaxed);
        }
    }

    pub(crate) fn ttl_queued(&self) -> bool {
        self.uses_ttl.load(Ordering::Relaxed)
    }

    /// A requester gave up a request: the IO thread may withdraw it from the queue.
    pub(crate) fn note_withdrawal(&self) {
        // Relaxed: a hint for the IO thread's sweep; publishing checks every request anyway.
        if !self.withdrawals.load(Ordering::Relaxed) {
            self.withdrawals.store(true, Ordering::Relaxed);
        }
    }

    /// Whether a request was given up since the last call (the IO thread's sweep).
    pub(crate) fn take_withdrawals(&self) -> bool {
        // Relaxed: a hint (see `note_withdrawal`).
        self.withdrawals.load(Ordering::Relaxed) && self.withdrawals.swap(false, Ordering::Relaxed)
    }

    /// The largest message the peer accepts, as its last handshake said (`usize::MAX`
    /// while none has completed).
    pub(crate) fn peer_max_message(&self) -> usize {
        // Relaxed: one value on its own; a sender that reads an older one is caught when
        // its message is published.
        self.peer_max_message.load(Ordering::Relaxed)
    }

    /// The peer's handshake said it accepts messages of at most `max` bytes.
    pub(crate) fn learn_max_message(&self, max: usize) {
        // Relaxed: see `peer_max_message`.
        self.peer_max_message.store(max, Ordering::Relaxed);
    }

    pub(crate) fn state(&self) -> PeerState {
        PeerState::from_u8(self.state.load(Ordering::Relaxed))
    }

    /// The IO thread moved the peer to `s` (a few times per connection, never per
    /// message): wakes whoever waits for it to connect.
    pub(crate) fn set_state(&self, s: PeerState) {
        {
            // The lock orders the store against a waiter's check (see `state_lock`).
            let _g = self.state_lock.lock();
            self.state.store(s as u8, Ordering::Relaxed);
        }
        self.state_changed.notify_all();
    }

    /// Waits until the peer is `Connected` (`Ok`), or `Closed` for good
    /// (`Err(PeerState::Closed)`), or `deadline` (if any) passes (`Err` with the state
    /// then). Parks on a condvar the IO thread's state changes notify: no polling.
    pub(crate) fn wait_connected(&self, deadline: Option<Instant>) -> Result<(), PeerState> {
        let mut g = self.state_lock.lock();
        loop {
            match self.state() {
                PeerState::Connected => return Ok(()),
                PeerState::Closed => return Err(PeerState::Closed),
                s => {
                    if !wait_until(&self.state_changed, &mut g, deadline) {
                        return Err(s);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PeerState::*;
    use super::{Found, PeerShared, Peers, FOUND_GIVES_WAY};
    use crate::deliver::{CreditSink, MemberQueue, OobQueue};
    use crate::sync::{Arc, SharedStr};

    /// A peer's shared state whose deliveries return no credit.
    fn peer(id: usize, name: &str) -> Arc<PeerShared> {
        struct NoCredit;
        impl CreditSink for NoCredit {
            fn consumed(&self, _epoch: u32, _cost: u64) {}
            fn idle(&self) {}
        }
        let name: SharedStr = name.into();
        let member = Arc::new(MemberQueue::new(name.clone(), Box::new(NoCredit)));
        let oob = Arc::new(OobQueue::new(name.clone(), 1, Arc::new(NoCredit)));
        let credit = Arc::new(crate::flow::RecvCredit::new());
        Arc::new(PeerShared::new(
            id,
            name,
            1 << 16,
            credit,
            member,
            oob,
            None,
            1,
        ))
    }

    /// A send's first try (`remembered_if_hit`) takes the remembered peer while the map is
    /// unchanged and counts no miss; the look-up after it (`remembered`) counts one; the
    /// remembered peer gives way to another name after `FOUND_GIVES_WAY` misses, and a
    /// change of the map is never a hit.
    #[test]
    fn a_first_try_counts_no_miss_and_a_changed_map_is_never_a_hit() {
        let peers = Peers::default();
        super::admit(&peers, peer(0, "a"));
        super::admit(&peers, peer(1, "b"));
        let mut last: Option<Found> = None;
        assert!(peers.remembered_if_hit("a", &mut last).is_none());
        assert_eq!(peers.look_up("a", &mut last, |p| p.id), Some(0));
        assert_eq!(
            peers.remembered_if_hit("a", &mut last).map(|p| p.id),
            Some(0)
        );
        for _ in 0..FOUND_GIVES_WAY * 2 {
            assert!(peers.remembered_if_hit("b", &mut last).is_none());
        }
        assert_eq!(
            last.as_ref().map(|f| f.misses),
            Some(0),
            "first tries count nothing"
        );
        for _ in 0..FOUND_GIVES_WAY {
            assert!(peers.remembered("b", &mut last).is_none());
        }
        assert_eq!(peers.look_up("b", &mut last, |p| p.id), Some(1));
        assert_eq!(
            peers.remembered_if_hit("b", &mut last).map(|p| p.id),
            Some(1)
        );
        super::admit(&peers, peer(2, "c"));
        assert!(
            peers.remembered_if_hit("b", &mut last).is_none(),
            "the map changed since b was found"
        );
        assert!(peers.remembered("b", &mut last).is_none());
    }

    #[test]
    fn rtt_smooths_like_tcp() {
        use std::time::Duration;
        let rtt = super::Rtt::default();
        assert_eq!((rtt.last(), rtt.smoothed()), (None, None));
        rtt.sample(Duration::from_millis(8));
        assert_eq!(rtt.smoothed(), Some(Duration::from_millis(8)));
        rtt.sample(Duration::from_millis(16));
        assert_eq!(rtt.last(), Some(Duration::from_millis(16)));
        assert_eq!(rtt.smoothed(), Some(Duration::from_millis(9)));
    }

    #[test]
    fn heard_counts_from_the_last_read() {
        use std::time::{Duration, Instant};
        let heard = super::Heard::default();
        let now = Instant::now();
        assert_eq!(heard.since(now), None);
        heard.note(now);
        let later = now + Duration::from_millis(30);
        assert_eq!(heard.since(later), Some(Duration::from_millis(30)));
    }

    #[test]
    fn closed_is_terminal() {
        for s in [Connecting, Handshaking, Connected, Backoff, Closed] {
            assert!(!Closed.can_become(s));
            assert!(s == Closed || s.can_become(Closed));
        }
    }

    #[test]
    fn lifecycle_edges() {
        assert!(Backoff.can_become(Connecting));
        assert!(Connecting.can_become(Handshaking));
        assert!(Handshaking.can_become(Connected));
        assert!(Connected.can_become(Backoff));
        assert!(
            !Connecting.can_become(Connected),
            "a connection handshakes first"
        );
        assert!(!Backoff.can_become(Connected));
    }
}
