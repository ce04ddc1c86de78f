//! Arbitrary frames fed to an acceptor and a dialler handshake, `accept` / `refuse` with
//! arbitrary counts, `keep_new` on arbitrary tie-breaks, and complete exchanges between
//! arbitrary identities: never a panic. Body in `tests/fuzz/harness.rs` (shared with
//! `tests/fuzz_corpus.rs`).
#![no_main]

#[allow(dead_code)]
#[path = "../../tests/fuzz/harness.rs"]
mod harness;

#[global_allocator]
static ALLOC: harness::TrackAlloc = harness::TrackAlloc;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::handshake(data));
