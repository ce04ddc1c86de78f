//! Waiting on a condition with a deadline: how every test waits for something to happen.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// How long a test waits for something that should happen "soon" before declaring it never
/// will. Generous: the machine is shared and noisy, and this only matters when a test fails.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// Deadline given to `shutdown` by tests that expect it to succeed.
pub(crate) const SHUTDOWN: Duration = Duration::from_secs(10);

/// Polls `cond` until it holds; panics with `what` if it still does not after `timeout`.
/// Polls with a short park, never with a fixed sleep standing in for the event.
pub(crate) fn wait_until(what: impl Display, timeout: Duration, cond: impl FnMut() -> bool) {
    wait_until_or(timeout, cond, || what.to_string());
}

/// Like [`wait_until`], but the panic message is built at the deadline (so it can show the
/// state that was reached, e.g. a node's stats).
pub(crate) fn wait_until_or(
    timeout: Duration,
    cond: impl FnMut() -> bool,
    explain: impl FnOnce() -> String,
) {
    if !poll_until(timeout, cond) {
        panic!("timed out after {timeout:?} waiting for: {}", explain());
    }
}

/// Polls `cond` until it holds (`true`) or `timeout` has passed (`false`): for a test that
/// counts what did not happen in time rather than failing at once. Yields for the first
/// polls, then parks a millisecond between them.
pub(crate) fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    let mut spins = 0u32;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        if spins < 64 {
            spins += 1;
            std::thread::yield_now();
        } else {
            std::thread::park_timeout(Duration::from_millis(1));
        }
    }
}
