//! An arbitrary byte stream split into frames as the IO thread does and decoded: never a
//! panic, never an allocation. Body in `tests/fuzz/harness.rs` (shared with `tests/fuzz_corpus.rs`).
#![no_main]

#[allow(dead_code)]
#[path = "../../tests/fuzz/harness.rs"]
mod harness;

#[global_allocator]
static ALLOC: harness::TrackAlloc = harness::TrackAlloc;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::decode_stream(data));
