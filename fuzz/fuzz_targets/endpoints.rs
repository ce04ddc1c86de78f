//! Arbitrary bytes as a schedule for two members' real endpoints, driven through their
//! boundary (`Endpoint::handle` / `poll`) by the simulation: cuts at any byte, partial
//! reads and writes, replays, dials at once, timers, deaths and restarts. The simulation's
//! oracle checks, after every step and at the end, that every message is delivered exactly
//! once and in order, that the recovery counters hold their invariants and that every
//! permit comes back; any breach panics. Body: `cohort::internals::sim::run_bytes`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cohort::internals::sim::run_bytes(data));
