//! Admission of accepted connections that have not completed their handshake (with a
//! secret: not yet authenticated), the *pending* ones: what strangers who can reach the
//! listening port can make us hold. The IO thread asks [`Admission::verdict`] about every
//! accepted connection and keeps the table up to date; the rules (OpenSSH's `MaxStartups`
//! and `PerSourceMaxStartups` are the model) are:
//!
//! - **per source**: a source address holds at most `per_source` pending connections, so
//!   one host cannot take every slot. A new connection from an address holding its share is
//!   not refused: it displaces that address's oldest pending connection, so strangers
//!   sharing a member's address (NAT, a proxy, one host running both) cannot keep the
//!   member out — its handshake lasts one round trip, so it is young. Only connections
//!   accepted before the newcomer are displaced: among those accepted at one instant (one
//!   burst the IO thread takes in at once), the ones beyond the share are refused;
//! - **displacement**: when the table is full (or the node is at its connection limit), a
//!   new connection is not refused: it displaces the oldest pending connection of the
//!   source holding the most (among sources holding as many, the one whose oldest is
//!   oldest). A flood from one address displaces only its own connections, and a member's
//!   handshake — young, from an address holding few — survives a flood from elsewhere;
//! - **pressure**: the handshake deadline of pending connections shrinks as the table
//!   fills ([`Admission::deadline`]), so idle ones are shed sooner when slots are scarce.
//!
//! Sans-IO: tokens, addresses and instants in, decisions out; the IO thread closes.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::LinkId;
use crate::util::IdHash;

/// The pressure deadline is never below this (nor above `handshake_timeout`).
pub(crate) const MIN_PRESSURE_DEADLINE: Duration = Duration::from_millis(100);

/// The per-source share when none is configured: a quarter of the pending slots (at least
/// one), so it takes four busy sources to fill the table.
pub(crate) fn default_per_source(max_pending: usize) -> usize {
    (max_pending / 4).max(1)
}

/// What to do with a newly accepted connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// There is room: admit it.
    Admit,
    /// The table (or the node) is full: admit it after closing this pending connection.
    Displace(LinkId),
    /// Its source address holds its share of pending connections already: admit it after
    /// closing this, the oldest of them.
    DisplaceOwn(LinkId),
    /// Full, and nothing pending to displace (every connection is a member's or our own
    /// dial): refuse it.
    Full,
    /// Its source address holds its share of pending connections already, every one of
    /// them accepted at the same instant as it (one burst): refuse it.
    SourceBurst,
}

#[derive(Debug)]
struct Entry {
    seq: u64,
    source: IpAddr,
    since: Instant,
}

/// The pending accepted connections, by age and by source address.
#[derive(Debug)]
pub(crate) struct Admission {
    max_pending: usize,
    per_source: usize,
    next_seq: u64,
    entries: HashMap<LinkId, Entry, IdHash>,
    /// Per source, its pending connections, oldest first.
    sources: HashMap<IpAddr, VecDeque<(u64, LinkId)>>,
    /// Every pending connection, oldest first.
    by_age: BTreeMap<u64, LinkId>,
    /// (connections held, the oldest one's age rank reversed, source): the last element is
    /// the source displacement takes from.
    by_load: BTreeSet<(usize, Reverse<u64>, IpAddr)>,
}

/// The key a connection's source address is counted under: IPv4-mapped IPv6 addresses
/// count as the IPv4 address they carry.
pub(crate) fn source_of(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

impl Admission {
    /// A table of at most `max_pending` connections, `per_source` from one address.
    pub(crate) fn new(max_pending: usize, per_source: usize) -> Admission {
        let max_pending = max_pending.max(1);
        Admission {
            max_pending,
            per_source: per_source.clamp(1, max_pending),
            next_seq: 0,
            entries: HashMap::default(),
            sources: HashMap::new(),
            by_age: BTreeMap::new(),
            by_load: BTreeSet::new(),
        }
    }

    /// Pending connections now.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn per_source(&self) -> usize {
        self.per_source
    }

    pub(crate) fn max_pending(&self) -> usize {
        self.max_pending
    }

    /// Pending connections from `source` now.
    pub(crate) fn held_by(&self, source: IpAddr) -> usize {
        self.sources.get(&source).map_or(0, VecDeque::len)
    }

    /// The source holding the most pending connections, and how many.
    pub(crate) fn biggest(&self) -> Option<(IpAddr, usize)> {
        self.by_load.last().map(|&(n, _, ip)| (ip, n))
    }

    /// Whether `token` is pending here, and since when.
    pub(crate) fn since(&self, token: LinkId) -> Option<Instant> {
        self.entries.get(&token).map(|e| e.since)
    }

    /// The verdict on a connection just accepted from `source` at `now`; `node_full` says
    /// the node is at its limit of open connections. Changes nothing: the caller acts on
    /// it, then [`insert`](Admission::insert)s an admitted connection.
    pub(crate) fn verdict(&self, source: IpAddr, now: Instant, node_full: bool) -> Verdict {
        if let Some(q) = self
            .sources
            .get(&source)
            .filter(|q| q.len() >= self.per_source)
        {
            // Its address holds its share: the newcomer takes the place of the oldest, which
            // had its chance to answer, unless that one came in at this same instant.
            let oldest = q.front().map(|&(_, t)| t);
            return match oldest.filter(|t| self.since(*t).is_some_and(|s| s < now)) {
                Some(t) => Verdict::DisplaceOwn(t),
                None => Verdict::SourceBurst,
            };
        }
        if !node_full && self.len() < self.max_pending {
            return Verdict::Admit;
        }
        match self.victim() {
            Some(t) => Verdict::Displace(t),
            None => Verdict::Full,
        }
    }

    /// The connection displacement takes: the oldest of the source holding the most
    /// (among equals, the source whose oldest connection is oldest).
    fn victim(&self) -> Option<LinkId> {
        let &(_, _, ip) = self.by_load.last()?;
        self.sources.get(&ip)?.front().map(|&(_, t)| t)
    }

    /// Records `token`, accepted from `source` at `now`, as pending.
    pub(crate) fn insert(&mut self, token: LinkId, source: IpAddr, now: Instant) {
        self.remove(token);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.insert(
            token,
            Entry {
                seq,
                source,
                since: now,
            },
        );
        self.by_age.insert(seq, token);
        let q = self.sources.entry(source).or_default();
        if let Some(&(oldest, _)) = q.front() {
            self.by_load.remove(&(q.len(), Reverse(oldest), source));
        }
        q.push_back((seq, token));
        let key = (q.len(), Reverse(q[0].0), source);
        self.by_load.insert(key);
    }

    /// Forgets `token` (established or closed). Returns whether it was pending.
    pub(crate) fn remove(&mut self, token: LinkId) -> bool {
        let Some(e) = self.entries.remove(&token) else {
            return false;
        };
        self.by_age.remove(&e.seq);
        let Some(q) = self.sources.get_mut(&e.source) else {
            return true;
        };
        if let Some(&(oldest, _)) = q.front() {
            self.by_load.remove(&(q.len(), Reverse(oldest), e.source));
        }
        if let Some(i) = q.iter().position(|&(s, _)| s == e.seq) {
            q.remove(i);
        }
        match q.front() {
            Some(&(oldest, _)) => {
                self.by_load.insert((q.len(), Reverse(oldest), e.source));
            }
            None => {
                self.sources.remove(&e.source);
            }
        }
        true
    }

    /// The handshake deadline of a pending connection with the table as it is now, given
    /// the configured `full` one (`handshake_timeout`): `full` while at most half the slots
    /// are taken; above that, `full × 2 × free slots / max_pending`, never below a tenth of
    /// `full` (and never below [`MIN_PRESSURE_DEADLINE`], unless `full` itself is).
    pub(crate) fn deadline(&self, full: Duration) -> Duration {
        let floor = (full / 10).max(MIN_PRESSURE_DEADLINE).min(full);
        let free = self.max_pending.saturating_sub(self.len()) as u128;
        let nanos = full.as_nanos() * 2 * free / self.max_pending as u128;
        let scaled = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        scaled.clamp(floor, full)
    }

    /// The oldest pending connection if it is past its deadline at `now` (see
    /// [`deadline`](Admission::deadline)), with the deadline that applied. The caller closes
    /// it and calls again: each closing lengthens the deadline of the rest.
    pub(crate) fn overdue(&self, now: Instant, full: Duration) -> Option<(LinkId, Duration)> {
        let (_, &token) = self.by_age.first_key_value()?;
        let since = self.entries.get(&token)?.since;
        let limit = self.deadline(full);
        (now.saturating_duration_since(since) >= limit).then_some((token, limit))
    }
}

/// What was shed since the last warning: strangers are logged one line per connection at
/// `debug`, and in a `warn` summary at most every [`Shedding::EVERY`].
#[derive(Debug, Default)]
pub(crate) struct Shedding {
    /// Refused over the per-source share (a burst from one address beyond it).
    pub(crate) over_source: u64,
    /// Refused with the node full and nothing to displace.
    pub(crate) refused: u64,
    /// Displaced by a newer connection, of which `displaced_own` by one from the same
    /// address, which held its share.
    pub(crate) displaced: u64,
    pub(crate) displaced_own: u64,
    /// Handshake deadlines passed, of which `early` before `handshake_timeout` (pressure).
    pub(crate) timed_out: u64,
    pub(crate) early: u64,
    last_warning: Option<Instant>,
}

impl Shedding {
    /// Least time between two warnings.
    pub(crate) const EVERY: Duration = Duration::from_secs(10);

    /// Whether anything was shed since the last warning.
    pub(crate) fn any(&self) -> bool {
        self.over_source + self.refused + self.displaced + self.timed_out > 0
    }

    /// The warning due at `now`, if anything was shed and the last one is old enough: a
    /// summary of what was shed since, after which the counts start again.
    pub(crate) fn warning(&mut self, now: Instant) -> Option<String> {
        if !self.any()
            || self
                .last_warning
                .is_some_and(|t| now.saturating_duration_since(t) < Self::EVERY)
        {
            return None;
        }
        let since = match self.last_warning {
            Some(t) => format!("in the last {:.0?}", now.saturating_duration_since(t)),
            None => "starting".to_owned(),
        };
        let line = format!(
            "shedding unauthenticated connections ({since}): {} displaced ({} by a newer one from the same address), {} refused over the per-source limit, {} refused at the connection limit, {} handshakes timed out ({} early, under pressure)",
            self.displaced, self.displaced_own, self.over_source, self.refused, self.timed_out, self.early
        );
        *self = Shedding {
            last_warning: Some(now),
            ..Shedding::default()
        };
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    #[test]
    fn a_source_at_its_share_displaces_its_own_oldest() {
        let mut a = Admission::new(8, 2);
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(1);
        a.insert(LinkId(1), ip(1), t0);
        assert_eq!(a.verdict(ip(1), later, false), Verdict::Admit);
        a.insert(LinkId(2), ip(1), later);
        // .1 holds its share: a newcomer from it takes the place of its oldest, whichever
        // address holds the most, with free slots in the table.
        let t1 = later + Duration::from_millis(1);
        assert_eq!(a.verdict(ip(1), t1, false), Verdict::DisplaceOwn(LinkId(1)));
        assert_eq!(a.verdict(ip(1), t1, true), Verdict::DisplaceOwn(LinkId(1)));
        assert_eq!(a.verdict(ip(2), t1, false), Verdict::Admit);
        a.remove(LinkId(1));
        a.insert(LinkId(3), ip(1), t1);
        assert_eq!(a.held_by(ip(1)), 2, "never more than its share");
        assert_eq!(
            a.verdict(ip(1), t1 + Duration::from_millis(1), false),
            Verdict::DisplaceOwn(LinkId(2)),
            "oldest first"
        );
        a.remove(LinkId(2));
        assert_eq!(a.verdict(ip(1), t1, false), Verdict::Admit);
        assert_eq!(default_per_source(128), 32);
        assert_eq!(default_per_source(2), 1);
        assert_eq!(Admission::new(4, 100).per_source(), 4);
    }

    #[test]
    fn a_burst_beyond_the_share_at_one_instant_is_refused() {
        let mut a = Admission::new(8, 3);
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_millis(1);
        a.insert(LinkId(1), ip(1), t0);
        a.insert(LinkId(2), ip(1), t1);
        a.insert(LinkId(3), ip(1), t1);
        // At t1 only the one from t0 may go: it had its chance to answer.
        assert_eq!(a.verdict(ip(1), t1, false), Verdict::DisplaceOwn(LinkId(1)));
        a.remove(LinkId(1));
        a.insert(LinkId(4), ip(1), t1);
        // The share is all from t1: more of that burst are refused, none displaced.
        assert_eq!(a.verdict(ip(1), t1, false), Verdict::SourceBurst);
        assert_eq!(a.verdict(ip(1), t1, true), Verdict::SourceBurst);
        // Another address is not held back by it.
        assert_eq!(a.verdict(ip(2), t1, false), Verdict::Admit);
        // A later instant displaces the burst's oldest.
        let t2 = t1 + Duration::from_nanos(1);
        assert_eq!(a.verdict(ip(1), t2, false), Verdict::DisplaceOwn(LinkId(2)));
        // A share of one.
        let mut b = Admission::new(8, 1);
        b.insert(LinkId(1), ip(1), t0);
        assert_eq!(b.verdict(ip(1), t0, false), Verdict::SourceBurst);
        assert_eq!(b.verdict(ip(1), t1, false), Verdict::DisplaceOwn(LinkId(1)));
    }

    #[test]
    fn a_flood_from_a_members_address_displaces_strangers_not_the_member() {
        // A member's handshake from .1 amid strangers from .1 holding its share: every
        // newcomer from .1 displaces the oldest, so the member's connection, accepted after
        // them, goes only once `per_source` newer ones from .1 arrived during its handshake.
        let per_source = 4;
        let mut a = Admission::new(16, per_source);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        for t in 0..per_source {
            a.insert(LinkId(t), ip(1), at(t as u64));
        }
        let member = LinkId(100);
        match a.verdict(ip(1), at(10), false) {
            Verdict::DisplaceOwn(v) => {
                assert_eq!(v, LinkId(0));
                a.remove(v);
            }
            v => panic!("the member's connection is admitted, got {v:?}"),
        }
        a.insert(member, ip(1), at(10));
        for t in 1..per_source {
            let v = a.verdict(ip(1), at(10 + t as u64), false);
            assert_eq!(v, Verdict::DisplaceOwn(LinkId(t)), "strangers go first");
            a.remove(LinkId(t));
            a.insert(LinkId(200 + t), ip(1), at(10 + t as u64));
        }
        assert!(a.since(member).is_some(), "the member's handshake survives");
        assert_eq!(
            a.verdict(ip(1), at(20), false),
            Verdict::DisplaceOwn(member),
            "... until `per_source` newer ones came from its address"
        );
        // Other addresses never lose a connection to .1's flood.
        a.insert(LinkId(300), ip(2), at(0));
        assert_eq!(a.verdict(ip(1), at(21), true), Verdict::DisplaceOwn(member));
    }

    #[test]
    fn a_full_table_displaces_the_oldest_of_the_biggest_holder() {
        let mut a = Admission::new(6, 4);
        let now = Instant::now();
        // A member's handshake from .1, then a flood from .9 and one from .5.
        a.insert(LinkId(1), ip(1), now);
        for t in 2..=5 {
            a.insert(LinkId(t), ip(9), now);
        }
        a.insert(LinkId(6), ip(5), now);
        assert_eq!(a.biggest(), Some((ip(9), 4)));
        // The flood's own oldest goes, whoever arrives (a newcomer from .9 at this same
        // instant is refused; later, it displaces its own oldest).
        assert_eq!(a.verdict(ip(9), now, false), Verdict::SourceBurst);
        let later = now + Duration::from_millis(1);
        assert_eq!(
            a.verdict(ip(9), later, false),
            Verdict::DisplaceOwn(LinkId(2))
        );
        assert_eq!(a.verdict(ip(7), now, false), Verdict::Displace(LinkId(2)));
        a.remove(LinkId(2));
        a.insert(LinkId(7), ip(7), now);
        assert_eq!(a.verdict(ip(1), now, false), Verdict::Displace(LinkId(3)));
        a.remove(LinkId(3));
        a.insert(LinkId(8), ip(1), now);
        // .9 and .1 now hold two each: .1's oldest (token 1) is older than .9's (token 4).
        assert_eq!(a.verdict(ip(3), now, false), Verdict::Displace(LinkId(1)));
        a.remove(LinkId(1));
        a.insert(LinkId(9), ip(3), now);
        assert_eq!(a.verdict(ip(3), now, false), Verdict::Displace(LinkId(4)));
        // The node at its connection limit displaces as well, even with free slots.
        let mut b = Admission::new(6, 4);
        assert_eq!(b.verdict(ip(1), now, true), Verdict::Full);
        b.insert(LinkId(1), ip(1), now);
        assert_eq!(b.verdict(ip(2), now, true), Verdict::Displace(LinkId(1)));
    }

    #[test]
    fn the_deadline_shrinks_above_half_full_down_to_a_floor() {
        let full = Duration::from_secs(5);
        let mut a = Admission::new(100, 100);
        let now = Instant::now();
        for t in 0..50 {
            a.insert(LinkId(t), ip(1), now);
        }
        assert_eq!(a.deadline(full), full);
        for t in 50..75 {
            a.insert(LinkId(t), ip(1), now);
        }
        assert_eq!(a.deadline(full), Duration::from_millis(2_500));
        for t in 75..100 {
            a.insert(LinkId(t), ip(1), now);
        }
        assert_eq!(a.deadline(full), Duration::from_millis(500));
        let short = Duration::from_millis(50);
        assert_eq!(a.deadline(short), short, "never above the configured one");
        assert_eq!(
            a.deadline(Duration::from_millis(300)),
            MIN_PRESSURE_DEADLINE
        );
    }

    #[test]
    fn overdue_connections_come_oldest_first_and_each_closing_relaxes_the_rest() {
        let full = Duration::from_secs(1);
        let mut a = Admission::new(4, 4);
        let t0 = Instant::now();
        for t in 0..4 {
            a.insert(LinkId(t), ip(1), t0 + Duration::from_millis(10 * t as u64));
        }
        // Full: deadline 100 ms.
        let at = t0 + Duration::from_millis(115);
        assert_eq!(
            a.overdue(at, full),
            Some((LinkId(0), Duration::from_millis(100)))
        );
        a.remove(LinkId(0));
        // Three of four taken: 500 ms, nobody is that old.
        assert_eq!(a.overdue(at, full), None);
        assert_eq!(a.since(LinkId(1)), Some(t0 + Duration::from_millis(10)));
        assert_eq!(
            a.overdue(t0 + Duration::from_millis(510), full)
                .map(|o| o.0),
            Some(LinkId(1))
        );
    }

    #[test]
    fn removal_keeps_every_index_consistent() {
        let mut a = Admission::new(64, 64);
        let now = Instant::now();
        for t in 0..40usize {
            a.insert(LinkId(t), ip((t % 5) as u8), now);
        }
        for t in (0..40usize).step_by(3) {
            assert!(a.remove(LinkId(t)));
            assert!(!a.remove(LinkId(t)));
        }
        let held: usize = (0..5).map(|i| a.held_by(ip(i))).sum();
        assert_eq!(held, a.len());
        assert_eq!(a.by_load.len(), a.sources.len());
        assert_eq!(a.by_age.len(), a.len());
        for t in 0..40usize {
            a.remove(LinkId(t));
        }
        assert_eq!((a.len(), a.sources.len(), a.by_load.len()), (0, 0, 0));
        assert_eq!(a.biggest(), None);
    }

    #[test]
    fn shedding_is_summarised_at_most_every_ten_seconds() {
        let mut s = Shedding::default();
        let t0 = Instant::now();
        assert_eq!(s.warning(t0), None, "nothing shed, nothing said");
        s.displaced += 3;
        let first = s.warning(t0).expect("shedding starts: said at once");
        assert!(first.contains("3 displaced"), "{first}");
        s.over_source += 1;
        s.displaced += 2;
        s.displaced_own += 2;
        assert_eq!(s.warning(t0 + Duration::from_secs(1)), None);
        let next = s
            .warning(t0 + Shedding::EVERY)
            .expect("said again after the interval");
        assert!(
            next.contains("1 refused over the per-source limit"),
            "{next}"
        );
        assert!(
            next.contains("2 displaced (2 by a newer one from the same address)"),
            "counts start again: {next}"
        );
    }
}
