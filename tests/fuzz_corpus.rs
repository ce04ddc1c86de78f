//! Replays the committed fuzz corpus (`tests/fuzz/corpus/`) through the bodies of the fuzz
//! targets, so that every `cargo test` exercises it without cargo-fuzz or a nightly
//! toolchain. The bodies live in `tests/fuzz/harness.rs`, shared with `fuzz/fuzz_targets/`
//! (both live here, not in the `fuzz/` crate, so that the package ships them with this test).

#[path = "fuzz/harness.rs"]
mod harness;

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;

// Records allocations while the harness decodes untrusted bytes (see `harness::TrackAlloc`).
#[global_allocator]
static ALLOC: harness::TrackAlloc = harness::TrackAlloc;

fn replay(target: &str, body: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no corpus in {}", dir.display());
    for path in &files {
        let data = fs::read(path).unwrap();
        if let Err(e) = panic::catch_unwind(AssertUnwindSafe(|| body(&data))) {
            eprintln!("fuzz target {target} fails on {}", path.display());
            panic::resume_unwind(e);
        }
    }
    // Every input is also fine cut short at any point (a connection dropped mid-frame).
    for path in &files {
        let data = fs::read(path).unwrap();
        for end in 0..data.len() {
            body(&data[..end]);
        }
    }
}

#[test]
fn allocation_tracker_is_installed() {
    assert!(harness::tracker_is_live());
}

#[test]
fn decode_corpus() {
    replay("decode", harness::decode_stream);
}

#[test]
fn handshake_corpus() {
    replay("handshake", harness::handshake);
}

#[test]
fn empty_and_tiny_inputs() {
    for data in [&[][..], &[0], &[1, 1], &[2, 0, 0], &[3; 40]] {
        harness::decode_stream(data);
        harness::handshake(data);
    }
}

/// The fuzz target `endpoints`: each input is a schedule for two members' endpoints in the
/// simulation, every check of its oracle applied (no message lost, duplicated or reordered,
/// counters monotonic, permits whole).
#[test]
fn endpoints_corpus() {
    replay("endpoints", cohort::internals::sim::run_bytes);
}
