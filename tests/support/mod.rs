//! Support for the integration tests: every test file includes it the same way,
//!
//! ```ignore
//! mod support;
//! use support::*;
//! ```
//!
//! which brings the everyday vocabulary into scope (the re-exports below); the rest is
//! reached through its module (`raw::dial`, `proxy::Proxy`, `certs::TestCa`). Each test
//! binary uses only part of it.
//!
//! | module | what it holds |
//! |---|---|
//! | [`wait`] | waiting on a condition with a deadline: `wait_until`, `poll_until`, `PATIENCE`, `SHUTDOWN` |
//! | [`addr`] | `HeldAddr`: an address kept for a member that is not up (yet, or any more) |
//! | [`child`] | a child process running one of this binary's tests: its marked stdout lines and its stderr |
//! | [`nodes`] | fixtures: `connected` pair or mesh, `introduce_at_once`, the receiver `b` and the journalling sender `a` of two-member tests, `fill_window`, waits for whole windows, stats |
//! | [`messages`] | numbered test payloads, `OrderCheck` (per-sender order), `Counter`, `RecordsFirst` (a journalling sender's records before its messages), `Gate` |
//! | [`threads`] | this process's threads by name, `Watched` threads parking on a dry window, `join_within` |
//! | [`tempdir`] | `TempDir`, removed on drop, kept when the test fails |
//! | [`raw`] | a member driven by hand over a blocking socket, with the crate's `proto`/`wire` |
//! | [`proxy`] | a fault-injecting TCP proxy (cuts mid-frame, refuses, holds, half-open) |
//! | [`freeze`] | a forwarder whose connections can go silent without a reset |
//! | [`certs`] | (feature `tls`) a test CA and member certificates made at run time |
//!
//! No helper sleeps to wait for an event: they wait on a condition with a deadline.
#![allow(dead_code)]

// The helpers reach below the API (`raw` speaks the crate's `proto` and `wire`) through
// `cohort::internals`, which exists only in a build with `--cfg cohort_internals`.
#[cfg(not(cohort_internals))]
compile_error!(
    "cohort's tests reach its internals: build them with `--cfg cohort_internals`. \
     .cargo/config.toml sets it, but a RUSTFLAGS in the environment replaces that: \
     add `--cfg cohort_internals` to it"
);

pub(crate) mod addr;
#[cfg(feature = "tls")]
pub(crate) mod certs;
#[cfg(unix)]
pub(crate) mod child;
pub(crate) mod freeze;
pub(crate) mod messages;
pub(crate) mod nodes;
pub(crate) mod proxy;
pub(crate) mod raw;
pub(crate) mod tempdir;
pub(crate) mod threads;
pub(crate) mod wait;

// The everyday vocabulary, for `use support::*`; a binary that leaves some of it unused is
// not told so.
#[allow(unused_imports)]
pub(crate) use addr::HeldAddr;
#[allow(unused_imports)]
pub(crate) use messages::{counter_of, payload, Counter, Gate, OrderCheck, RecordsFirst};
#[allow(unused_imports)]
pub(crate) use nodes::{
    all_stats, connected, fill_window, introduce, introduce_at_once, is_connected, journalled_a,
    peer_stats, receiver_b, send_patiently, send_to_every_other, sender_a, shutdown_all,
    wait_mesh_connected, wait_window_whole, wait_windows_whole, BuilderExt,
};
#[allow(unused_imports)]
pub(crate) use tempdir::TempDir;
#[allow(unused_imports)]
pub(crate) use threads::{blocked_sender, join_within, threads_named, wait_threads_gone, Watched};
#[allow(unused_imports)]
pub(crate) use wait::{poll_until, wait_until, wait_until_or, PATIENCE, SHUTDOWN};
