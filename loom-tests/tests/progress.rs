//! The journal's delivery watermark, `cohort::internals::deliver::Progress`, with the code that ships:
//! pool threads complete sequence numbers in any order (regular batches and OOB messages)
//! while the IO thread reads the watermark and may restart the stream.
//!
//! Checked: the watermark never passes a message whose completion has not begun (each
//! completer marks its numbers before it calls `complete`; the reader compares after its
//! read), never goes back, and once every completion is in, covers them all; a completion
//! of the old epoch never counts in the new one.
#![cfg(loom)]

use cohort::internals::deliver::Progress;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

/// Sequence numbers whose completion has begun: each completer marks its numbers before it
/// calls `complete`.
struct Begun([AtomicBool; 4]);

impl Begun {
    fn mark(&self, seqs: &[u64]) {
        for &s in seqs {
            // Relaxed: `complete` takes the progress lock after this, and the reader's
            // `done()` takes it before it looks here, so a completion the reader's watermark
            // includes has its mark visible; no ordering of our own may hide a bad watermark.
            self.0[s as usize].store(true, Ordering::Relaxed);
        }
    }

    /// The highest `n` with every number in `1..=n` begun.
    fn prefix(&self) -> u64 {
        (1..4u64)
            .take_while(|&s| self.0[s as usize].load(Ordering::Relaxed))
            .last()
            .unwrap_or(0)
    }
}

/// Two pool threads complete 1 and 3 (one batch) and 2 (another) in any order, while the
/// IO thread reads the watermark twice: each read is at most the highest number below
/// which every completion has at least begun — 3 only once 2 has — and the second is not
/// below the first; at the end the watermark covers all three.
#[test]
fn out_of_order_completions_close_the_gap() {
    loom_tests::model("progress/out_of_order_completions_close_the_gap", || {
        let p = Arc::new(Progress::new(0));
        let begun = Arc::new(Begun(Default::default()));
        let e = p.epoch();
        let complete = |seqs: &'static [u64]| {
            let (p, begun) = (p.clone(), begun.clone());
            thread::spawn(move || {
                begun.mark(seqs);
                p.complete(e, seqs.iter().copied());
            })
        };
        let a = complete(&[1, 3]);
        let b = complete(&[2]);
        // The IO thread reads meanwhile: never beyond what was handled.
        let first = p.done();
        let bound = begun.prefix();
        assert!(
            first <= bound,
            "watermark {first} passes an unhandled message (handled up to {bound})"
        );
        let second = p.done();
        assert!(
            second >= first,
            "watermark went back: {first} then {second}"
        );
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(p.done(), 3);
    });
}

#[test]
fn a_restart_ignores_the_old_streams_late_completions() {
    loom_tests::model(
        "progress/a_restart_ignores_the_old_streams_late_completions",
        || {
            let p = Arc::new(Progress::new(5));
            let old = p.epoch();
            let late = {
                let p = p.clone();
                thread::spawn(move || p.complete(old, [6, 7]))
            };
            let new = p.restart(0, 0);
            late.join().unwrap();
            assert_eq!(
                p.done(),
                0,
                "old epoch's 6 and 7 must not count in the new stream"
            );
            p.complete(new, [1]);
            assert_eq!(p.done(), 1);
        },
    );
}
