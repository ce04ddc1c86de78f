//! Arbitrary bytes as a schedule for two members' endpoints: the fuzz target `endpoints`
//! (`fuzz/fuzz_targets/endpoints.rs`) hands its input to [`run_bytes`], which reads
//! [`Settings`] and a list of [`Step`]s out of it and runs them through [`Sim::run`] — the
//! real endpoints, driven through their boundary by the simulation's driver, with every
//! check of the oracle after every step and at the end. A coverage-guided fuzzer thereby
//! searches the space of cuts at any byte, partial reads and writes, replays, dials at once,
//! timer firings, process deaths and restarts for a schedule that loses, duplicates or
//! reorders a message, breaks a counter or leaks a permit: any of these panics.
//!
//! Every input is a schedule (no byte sequence is rejected): each value is taken modulo its
//! range, and a short input is padded with zeros. Schedules are capped at [`MAX_STEPS`]
//! steps so one input stays fast.

use super::harness::{Sim, Step};
use super::member::{Settings, Side};

/// Steps read from one input at most.
pub(crate) const MAX_STEPS: usize = 512;

/// Reads values off the input, zeros once it is used up.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn side(&mut self) -> Side {
        Side::from(self.u8() & 1)
    }

    /// A byte count for a write or a read: small (frames split everywhere), medium, or
    /// everything, as the property tests draw them.
    fn amount(&mut self) -> usize {
        match self.u8() {
            b @ 0..=127 => 1 + usize::from(b) % 23,
            b @ 128..=223 => 24 + usize::from(b - 128) * 2,
            _ => usize::MAX,
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The settings the first bytes of an input choose.
fn settings(r: &mut Reader<'_>) -> Settings {
    let bits = r.u8();
    Settings {
        ack_threshold: 1 + u64::from(r.u8() % 8),
        ack_delay: 1 + u64::from(r.u8() % 32),
        high_water: 2 + usize::from(r.u16() % 399),
        secret: bits & 1 != 0,
        both_dial: bits & 2 != 0,
        journal: bits & 4 != 0,
    }
}

/// The next step of an input.
fn step(r: &mut Reader<'_>) -> Step {
    match r.u8() % 32 {
        0..=5 => Step::Send {
            side: r.side(),
            len: usize::from(r.u8() % 48),
        },
        6..=12 => Step::Write {
            side: r.side(),
            pick: usize::from(r.u8()),
            n: r.amount(),
        },
        13..=19 => Step::Read {
            side: r.side(),
            pick: usize::from(r.u8()),
            n: r.amount(),
        },
        20..=22 => Step::Advance {
            ms: 1 + u64::from(r.u8() % 15),
        },
        23..=24 => Step::Cut {
            pick: usize::from(r.u8()),
            keep: [r.u16(), r.u16()],
        },
        25..=27 => Step::Dial { side: r.side() },
        28 => Step::Replay {
            side: r.side(),
            back: u64::from(r.u8() % 8),
            count: u64::from(r.u8() % 4),
        },
        29 => Step::Journal { side: r.side() },
        30 => Step::Pump,
        _ => match r.u8() % 8 {
            0 => Step::Kill { side: r.side() },
            1 => Step::Restart { side: r.side() },
            2 => Step::JournalFail { side: r.side() },
            _ => Step::Advance {
                ms: 100 + u64::from(r.u8()) * 20,
            },
        },
    }
}

/// The schedule an input stands for.
fn schedule(data: &[u8]) -> (Settings, Vec<Step>) {
    let mut r = Reader(data);
    let s = settings(&mut r);
    let mut steps = Vec::new();
    while !r.is_empty() && steps.len() < MAX_STEPS {
        steps.push(step(&mut r));
    }
    (s, steps)
}

/// Runs the schedule `data` stands for; panics on anything the oracle finds.
pub(crate) fn run_bytes(data: &[u8]) {
    let (s, steps) = schedule(data);
    Sim::run(s, &steps);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs made of a pattern repeated, and a few hand-picked ones: each runs clean. (The
    /// fuzz target searches the rest.)
    #[test]
    fn byte_schedules_run_clean() {
        let mut inputs: Vec<Vec<u8>> = vec![Vec::new(), vec![0xff; 64], vec![7; 300]];
        for seed in 0u8..40 {
            let v: Vec<u8> = (0..600u32)
                .map(|i| {
                    (i.wrapping_mul(31).wrapping_add(u32::from(seed) * 97) % 251) as u8
                        ^ seed.rotate_left(i % 8)
                })
                .collect();
            inputs.push(v);
        }
        let mut steps = 0;
        for data in &inputs {
            steps += schedule(data).1.len();
            run_bytes(data);
        }
        assert!(
            steps > 40 * 100,
            "the inputs make long schedules ({steps} steps)"
        );
    }
}
