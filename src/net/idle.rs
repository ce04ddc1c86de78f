//! How the IO thread (and, through it, the pool) waits for work: the setting chosen on the
//! node's builder ([`IdleStrategy`]), and the policy that carries it out ([`Spin`]).

use std::time::{Duration, Instant};

use crate::handoff::SpinGate;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How a node's IO thread and idle delivery threads wait for work
/// ([`Builder::idle_strategy`](crate::Builder::idle_strategy)).
///
/// Every hand-off between threads of a round trip (application → IO thread → socket → IO
/// thread → delivery thread, each way) either finds the next thread polling, or wakes it:
/// a system call, and tens of microseconds on a virtual machine whose core was idle. A
/// spinning thread catches the hand-off at no such cost, but holds its core meanwhile:
/// where a node's busy threads outnumber the cores, that core was wanted by another
/// thread of the pipeline. [`docs/benchmarks.md`](https://docs.rs/crate/cohort-net/latest/source/docs/benchmarks.md)
/// has the figures behind the default.
///
/// ```
/// use std::time::Duration;
/// use cohort::IdleStrategy;
///
/// let node = cohort::Node::builder("trader")
///     .idle_strategy(IdleStrategy::Spin(Duration::from_micros(50)))
///     .start()?;
/// node.shutdown(Duration::from_secs(1))?;
/// # Ok::<(), cohort::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdleStrategy {
    /// Block as soon as there is nothing to do: no CPU while idle, a wake-up per hand-off.
    Block,
    /// After work, the IO thread and one idle delivery thread poll for up to this long
    /// before they block, while the node is lightly loaded and the cores are free: its IO
    /// thread waited for more than half of its last 2 ms, and the yields of its spin gave
    /// the core away for no more than 200 µs in all (counting only yields of over 25 µs;
    /// a yield that finds only spinners takes a few microseconds). A loaded node, or one whose cores
    /// other threads or processes want, blocks at once, so the spin does not take a core
    /// from bulk traffic. [`IdleStats`] counts how often the spin stood down, and why.
    /// The default, with 50 µs.
    Adaptive(Duration),
    /// After work, the IO thread and one idle delivery thread always poll for this long
    /// before they block: the lowest latency, for the price of those threads' cores.
    Spin(Duration),
}

impl IdleStrategy {
    /// How long the IO thread (and an idle delivery thread) spins after work (zero:
    /// never), and whether it adapts (a spin of zero has nothing to adapt).
    pub(crate) fn spin(self) -> (Duration, bool) {
        match self {
            IdleStrategy::Block => (Duration::ZERO, false),
            IdleStrategy::Adaptive(d) => (d, !d.is_zero()),
            IdleStrategy::Spin(d) => (d, false),
        }
    }
}

impl Default for IdleStrategy {
    fn default() -> Self {
        IdleStrategy::Adaptive(Duration::from_micros(50))
    }
}

/// The IO thread's idle strategy ([`IdleStrategy`]): after a turn with something to do it
/// polls without blocking (spins, yielding its core between empty polls) for the spin,
/// then blocks in `poll` until a socket, a timer or a wake-up needs it. While it spins,
/// requesters skip the wake-up call ([`Handoff::spin_begin`]). Adaptive, it spins only
/// while the thread is lightly loaded, and tells the pool to do the same. A turn woken by
/// a timer alone starts no spin, nor one that left the node quiet (it read a heartbeat, a
/// probe or an ack on a quiet link: `Endpoint::tick_put_off`), so an idle node costs no CPU
/// for it.
///
/// [`Handoff::spin_begin`]: crate::handoff::Handoff::spin_begin
pub(super) struct Spin {
    spin: Duration,
    /// Spin only while the thread is lightly loaded (see [`Spin::account`]).
    adaptive: bool,
    /// Spin until then (the last active turn plus `spin`).
    until: Option<Instant>,
    /// Tells the doorbell when we spin.
    gate: SpinGate,
    /// Adaptive: the current measurement window's start, and the time the thread spent
    /// waiting in it (in `poll`, or yielding).
    window: Instant,
    waited: Duration,
    /// Adaptive: whether the last window found the thread lightly loaded and its core
    /// not wanted by others.
    allowed: bool,
    /// Adaptive: the time the yields of this window gave the core away, counting only
    /// those longer than [`CONTENDED_YIELD`].
    given_away: Duration,
}

/// Adaptive spin: the length of a load measurement window.
const SPIN_WINDOW: Duration = Duration::from_millis(2);

/// Adaptive spin: a yield that gave the core away for longer than this gave it to a thread
/// that had work (a few microseconds is the cost of a yield that found only spinners).
const CONTENDED_YIELD: Duration = Duration::from_micros(25);

/// Adaptive spin: what such yields may give away in one window before the spin stops (a
/// tenth of it). A thread of the node's own pipeline that runs on the spinner's core for a
/// few tens of microseconds now and then is not contention: stopping for it cost every
/// round trip of the next 2–4 ms a wake-up. One yield that gives away a time slice
/// (another process, or bulk traffic's threads) still stops the spin at once, for the rest
/// of its window.
const CONTENDED_BUDGET: Duration = Duration::from_micros(200);

/// Why an adaptive spin changed its mind (see [`Spin::account`] and [`Spin::yielded`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SpinChange {
    /// The node is lightly loaded and its cores free again: spin after work.
    Resumed,
    /// The IO thread worked more than half of a window.
    Loaded,
    /// Its yields gave the core away for more than [`CONTENDED_BUDGET`] in a window.
    Contended,
}

impl SpinChange {
    /// Whether the spin is on after this change.
    pub(super) fn allows(self) -> bool {
        self == SpinChange::Resumed
    }
}

/// What the IO thread's idle strategy did, for [`IdleStats`]: written by the IO thread
/// alone, at each change of mind (at most one per window or yield), read by `Node::stats`.
#[derive(Debug, Default)]
pub(crate) struct SpinCounters {
    /// Whether the IO thread spins after work now.
    on: AtomicBool,
    stood_down_loaded: AtomicU64,
    stood_down_contended: AtomicU64,
    driven: AtomicU64,
}

impl SpinCounters {
    /// Notes the strategy the IO thread starts with (whether it spins at all).
    pub(super) fn start(&self, spins: bool) {
        // Relaxed here and below: statistics, read on their own.
        self.on.store(spins, Ordering::Relaxed);
    }

    /// Notes a change of mind of the adaptive spin.
    pub(super) fn note(&self, change: SpinChange) {
        self.on.store(change.allows(), Ordering::Relaxed);
        let counter = match change {
            SpinChange::Resumed => return,
            SpinChange::Loaded => &self.stood_down_loaded,
            SpinChange::Contended => &self.stood_down_contended,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the IO thread spins after work now (a driven turn then wakes it, so that
    /// it spins for what answers the messages the turn wrote).
    pub(super) fn is_on(&self) -> bool {
        // Relaxed: a hint; a stale reading costs one wake-up, or one spin, more or less.
        self.on.load(Ordering::Relaxed)
    }

    /// Notes a turn that a requester drove while the IO thread was parked.
    pub(super) fn driven(&self) {
        self.driven.fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot.
    pub(crate) fn read(&self) -> IdleStats {
        IdleStats {
            driven_turns: self.driven.load(Ordering::Relaxed),
            spinning: self.on.load(Ordering::Relaxed),
            stood_down_loaded: self.stood_down_loaded.load(Ordering::Relaxed),
            stood_down_contended: self.stood_down_contended.load(Ordering::Relaxed),
        }
    }
}

/// What the node's [`IdleStrategy`] did ([`Stats::idle`](crate::Stats::idle)): whether its
/// IO thread spins after work now, and how often an adaptive spin stood down.
///
/// A round trip that finds the next thread polling costs no wake-up; one that finds it
/// blocked costs a system call and, on a virtual machine, tens of microseconds. A latency
/// tail that comes in bursts of milliseconds, with stand-downs counted meanwhile, is the
/// adaptive strategy at work: [`IdleStrategy::Spin`] (`Builder::low_latency`) never stands
/// down.
///
/// ```
/// # fn main() -> Result<(), cohort::Error> {
/// let node = cohort::Node::builder("quote").start()?;
/// let idle = node.stats().idle;
/// // The default strategy spins after work while the node is lightly loaded.
/// println!("spinning after work: {}", idle.spinning);
/// println!(
///     "stood down {} times for load, {} for contended cores",
///     idle.stood_down_loaded, idle.stood_down_contended
/// );
/// # node.shutdown(std::time::Duration::from_secs(1))?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct IdleStats {
    /// Whether the IO thread (and one idle delivery thread) spins after work now: always
    /// with [`IdleStrategy::Spin`], never with [`IdleStrategy::Block`] (nor with a spin of
    /// zero), and with [`IdleStrategy::Adaptive`] while the node is lightly loaded and its
    /// cores free.
    pub spinning: bool,
    /// Times the adaptive spin stood down because the IO thread worked more than half of a
    /// 2 ms window (decided as the window ends; it resumes after a quieter window).
    pub stood_down_loaded: u64,
    /// Times the adaptive spin stood down because its yields gave the core to other
    /// threads or processes for more than 200 µs of a window (at once, for the rest of that
    /// window; it resumes after it unless the window was a loaded one).
    pub stood_down_contended: u64,
    /// Turns of the IO thread that another thread ran itself (a send, a handler's reply,
    /// a pool thread returning credit), finding the IO thread blocked in its poll: the
    /// messages it published were written on that thread, with no hand-off to the IO
    /// thread. Turns that publish are at least 20 µs apart (faster sends are a stream, which
    /// the IO thread takes in batches); a node with a journal or an outbound filter never
    /// has one.
    pub driven_turns: u64,
}

impl Spin {
    pub(super) fn new(spin: Duration, adaptive: bool, now: Instant) -> Spin {
        Spin {
            spin,
            adaptive,
            until: None,
            gate: SpinGate::new(),
            window: now,
            waited: Duration::ZERO,
            allowed: true,
            given_away: Duration::ZERO,
        }
    }

    /// Time the thread spent waiting (in `poll`, or yielding the core).
    pub(super) fn waited(&mut self, d: Duration) {
        self.waited += d;
    }

    /// Adaptive: at the end of each window, whether to spin in the next: only if the
    /// thread waited more than half of it (a loaded node does not spin: a spinning thread
    /// would hold a core the pipeline needs) and its yields did not give the core away for
    /// long (other threads or processes want the cores). A lightly loaded node on idle
    /// cores spins, and its requests and replies cross without a wake-up. Returns the
    /// decision when it changes.
    pub(super) fn account(&mut self, now: Instant) -> Option<SpinChange> {
        let total = now.saturating_duration_since(self.window);
        if !self.adaptive || total < SPIN_WINDOW {
            return None;
        }
        let loaded = self.waited * 2 <= total;
        self.window = now;
        self.waited = Duration::ZERO;
        self.given_away = Duration::ZERO;
        // A window whose yields stopped the spin was reported then (`yielded` turned it
        // off for the rest of that window): a change to "off" here is for load, and a
        // window that was not loaded turns the spin back on, whatever stopped it.
        match (loaded, self.allowed) {
            (true, true) => self.decide(false, SpinChange::Loaded),
            (false, false) => self.decide(true, SpinChange::Resumed),
            _ => None,
        }
    }

    /// A yield of the spin took `took`: once the yields of this window that gave the core
    /// away for longer than [`CONTENDED_YIELD`] add up to more than [`CONTENDED_BUDGET`],
    /// spinning is not free here: stop now, for the rest of this window (adaptive; the
    /// window's end decides on the next as for any window). Returns the decision when it
    /// changes.
    pub(super) fn yielded(&mut self, took: Duration) -> Option<SpinChange> {
        self.waited += took;
        if !self.adaptive || took <= CONTENDED_YIELD {
            return None;
        }
        self.given_away += took;
        if self.given_away <= CONTENDED_BUDGET {
            return None;
        }
        self.until = None;
        self.decide(false, SpinChange::Contended)
    }

    fn decide(&mut self, allowed: bool, why: SpinChange) -> Option<SpinChange> {
        (allowed != self.allowed).then(|| {
            self.allowed = allowed;
            why
        })
    }

    /// A turn found something to do (events, or a wake-up): spin for a while after it.
    pub(super) fn active(&mut self, now: Instant) {
        if !self.spin.is_zero() && self.allowed {
            self.until = Some(now + self.spin);
        }
    }

    pub(super) fn is_spinning(&self) -> bool {
        self.gate.is_spinning()
    }

    /// Whether the next poll should not block: within the spin, or a request came in as
    /// the spin ended (the doorbell did not ring for it).
    pub(super) fn keep(&mut self, now: Instant, handoff: &crate::handoff::Handoff) -> bool {
        let spin = self.until.is_some_and(|until| now < until);
        if !spin {
            self.until = None;
        }
        self.gate.before_poll(handoff, spin)
    }
}

#[cfg(test)]
mod tests {
    use super::{IdleStrategy, Spin, SpinChange, SpinCounters};
    use crate::handoff::{Handoff, Wake};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Counts `wake` calls.
    #[derive(Default)]
    struct Calls(Arc<AtomicUsize>);

    impl Wake for Calls {
        fn wake(&self) -> std::io::Result<()> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    fn handoff() -> (Handoff, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        (Handoff::new(Box::new(Calls(calls.clone()))), calls)
    }

    #[test]
    fn without_a_spin_the_loop_blocks_and_every_request_wakes_it() {
        let (handoff, calls) = handoff();
        let mut spin = Spin::new(Duration::ZERO, false, Instant::now());
        let now = Instant::now();
        spin.active(now);
        assert!(!spin.keep(now, &handoff));
        handoff.ring();
        assert_eq!(calls.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_request_while_spinning_makes_no_call_and_is_taken() {
        let (handoff, calls) = handoff();
        let mut spin = Spin::new(Duration::from_millis(1), false, Instant::now());
        let t0 = Instant::now();
        spin.active(t0);
        assert!(spin.keep(t0, &handoff), "spins after work");
        handoff.ring();
        assert_eq!(
            calls.load(Ordering::Relaxed),
            0,
            "no wake-up while spinning"
        );
        assert!(handoff.take_wake(), "the spinning loop finds the request");
        // The spin ends with a request that did not wake the loop: it must not block.
        handoff.ring();
        let later = t0 + Duration::from_millis(2);
        assert!(
            spin.keep(later, &handoff),
            "a request came in as the spin ended"
        );
        assert!(handoff.take_wake());
        // Spun out, nothing pending: it blocks, and the next request wakes it.
        assert!(!spin.keep(later, &handoff));
        handoff.ring();
        assert_eq!(calls.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn an_adaptive_spin_stops_on_a_busy_thread_and_on_contended_cores() {
        let (handoff, _) = handoff();
        let t0 = Instant::now();
        let mut spin = Spin::new(Duration::from_micros(50), true, t0);
        // A window in which the thread waited most of the time: it keeps spinning.
        spin.waited(Duration::from_micros(1800));
        assert_eq!(spin.account(t0 + Duration::from_millis(2)), None);
        spin.active(t0 + Duration::from_millis(2));
        assert!(spin.keep(t0 + Duration::from_millis(2), &handoff));
        // A window in which it worked more than half: no spin until a quieter one.
        let t1 = t0 + Duration::from_millis(2);
        spin.waited(Duration::from_micros(500));
        assert_eq!(
            spin.account(t1 + Duration::from_millis(2)),
            Some(SpinChange::Loaded)
        );
        let t2 = t1 + Duration::from_millis(2);
        spin.active(t2);
        assert!(!spin.keep(t2, &handoff), "work starts no spin now");
        spin.waited(Duration::from_micros(1900));
        assert_eq!(
            spin.account(t2 + Duration::from_millis(2)),
            Some(SpinChange::Resumed)
        );
        // A yield that gave the core away for a time slice: it stops at once, and work
        // later in that window starts no spin.
        let t3 = t2 + Duration::from_millis(2);
        spin.active(t3);
        assert!(spin.keep(t3, &handoff));
        assert_eq!(
            spin.yielded(Duration::from_micros(300)),
            Some(SpinChange::Contended)
        );
        assert!(!spin.keep(t3, &handoff), "it stops at once");
        let later = t3 + Duration::from_millis(1);
        spin.active(later);
        assert!(
            !spin.keep(later, &handoff),
            "off for the rest of the window"
        );
        // A quiet window's end turns it back on: the stand-down lasted that window alone.
        spin.waited(Duration::from_micros(1500));
        assert_eq!(
            spin.account(t3 + Duration::from_millis(2)),
            Some(SpinChange::Resumed)
        );
        let t4 = t3 + Duration::from_millis(2);
        spin.active(t4);
        assert!(spin.keep(t4, &handoff));
        // Contended in a window that was loaded too: off, and still off after its end.
        assert_eq!(
            spin.yielded(Duration::from_micros(300)),
            Some(SpinChange::Contended)
        );
        spin.waited(Duration::from_micros(200));
        assert_eq!(
            spin.account(t4 + Duration::from_millis(2)),
            None,
            "still off"
        );
        let t5 = t4 + Duration::from_millis(2);
        spin.active(t5);
        assert!(
            !spin.keep(t5, &handoff),
            "a loaded window's next starts no spin"
        );
    }

    #[test]
    fn an_adaptive_spin_rides_out_short_yields_until_they_add_up() {
        let (handoff, _) = handoff();
        let t0 = Instant::now();
        let mut spin = Spin::new(Duration::from_micros(50), true, t0);
        spin.active(t0);
        // Yields that found only spinners, and a few that let another thread of the
        // pipeline run for tens of microseconds: the spin goes on.
        for _ in 0..100 {
            assert_eq!(spin.yielded(Duration::from_micros(3)), None);
        }
        for _ in 0..4 {
            assert_eq!(spin.yielded(Duration::from_micros(45)), None);
        }
        assert!(spin.keep(t0, &handoff), "still spinning");
        // The window ends quiet: a new budget.
        spin.waited(Duration::from_micros(1500));
        assert_eq!(spin.account(t0 + Duration::from_millis(2)), None);
        let t1 = t0 + Duration::from_millis(2);
        spin.active(t1);
        for _ in 0..4 {
            assert_eq!(spin.yielded(Duration::from_micros(45)), None);
        }
        // The fifth in this window takes what they gave away past the budget.
        assert_eq!(
            spin.yielded(Duration::from_micros(45)),
            Some(SpinChange::Contended)
        );
        assert!(!spin.keep(t1, &handoff), "it stops at once");
    }

    #[test]
    fn a_strategy_names_its_spin_and_whether_it_adapts() {
        let us = Duration::from_micros;
        assert_eq!(IdleStrategy::Block.spin(), (Duration::ZERO, false));
        assert_eq!(IdleStrategy::Spin(us(20)).spin(), (us(20), false));
        assert_eq!(IdleStrategy::Adaptive(us(50)).spin(), (us(50), true));
        // Nothing to adapt: it never spins, so it never stands down.
        assert_eq!(
            IdleStrategy::Adaptive(Duration::ZERO).spin(),
            (Duration::ZERO, false)
        );
    }

    #[test]
    fn the_counters_tell_why_the_spin_stood_down() {
        let counters = SpinCounters::default();
        counters.start(true);
        counters.note(SpinChange::Loaded);
        let seen = counters.read();
        assert!(!seen.spinning);
        assert_eq!((seen.stood_down_loaded, seen.stood_down_contended), (1, 0));
        counters.note(SpinChange::Resumed);
        counters.note(SpinChange::Contended);
        counters.note(SpinChange::Resumed);
        let seen = counters.read();
        assert!(seen.spinning);
        assert_eq!((seen.stood_down_loaded, seen.stood_down_contended), (1, 1));
    }
}
