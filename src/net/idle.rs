//! How the IO thread (and, through it, the pool) waits for work: a setting of the IO loop,
//! chosen on the node's builder.

use std::time::Duration;

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
    /// thread waited for more than half of its last 2 ms, and no yield of its spin gave
    /// the core away for more than 25 µs. A loaded node, or one whose cores other threads
    /// or processes want, blocks at once, so the spin does not take a core from bulk
    /// traffic. The default, with 50 µs.
    Adaptive(Duration),
    /// After work, the IO thread and one idle delivery thread always poll for this long
    /// before they block: the lowest latency, for the price of those threads' cores.
    Spin(Duration),
}

impl Default for IdleStrategy {
    fn default() -> Self {
        IdleStrategy::Adaptive(Duration::from_micros(50))
    }
}
