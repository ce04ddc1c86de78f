//! Loom models of cohort's concurrency invariants. The models live in `tests/`; this crate
//! only holds what they share.
//!
//! Run them with
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loom-tests --release
//! ```
//!
//! Under `--cfg loom` the `cohort` dependency is built on loom's primitives (its
//! `src/sync` facade swaps them in), so the models check the code that ships. Without the
//! cfg every test file compiles to nothing.

/// Runs `f` under [`loom::model`], counting the interleavings loom explores.
///
/// The preemption bound comes from `LOOM_MAX_PREEMPTIONS`; when it is unset it defaults to
/// 2 (what CI uses) rather than loom's unbounded search, so a bare `cargo test` under
/// `--cfg loom` finishes. Prints `loom model NAME: N iterations` (visible with
/// `--nocapture`) and returns the count; panics if loom explored nothing.
#[cfg(loom)]
pub fn model<F>(name: &str, f: F) -> usize
where
    F: Fn() + Sync + Send + 'static,
{
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let iterations = Arc::new(AtomicUsize::new(0));
    let counter = iterations.clone();
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    let started = std::time::Instant::now();
    builder.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f();
    });
    let n = iterations.load(Ordering::Relaxed);
    println!(
        "loom model {name}: {n} iterations in {:.2?} (preemption bound {:?})",
        started.elapsed(),
        builder.preemption_bound
    );
    assert!(n > 0, "loom model {name} explored no interleaving");
    n
}
