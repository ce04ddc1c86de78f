//! The journal's delivery watermark, `cohort::internals::deliver::Progress`, with the code that ships:
//! pool threads complete sequence numbers in any order (regular batches and OOB messages)
//! while the IO thread reads the watermark and may restart the stream.
//!
//! Checked: the watermark never passes a message that has not been handled; once every
//! completion is in, it covers them all; a completion of the old epoch never counts in the
//! new one.
#![cfg(loom)]

use cohort::internals::deliver::Progress;
use loom::sync::Arc;
use loom::thread;

#[test]
fn out_of_order_completions_close_the_gap() {
    loom::model(|| {
        let p = Arc::new(Progress::new(0));
        let e = p.epoch();
        let a = {
            let p = p.clone();
            thread::spawn(move || p.complete(e, [1, 3]))
        };
        let b = {
            let p = p.clone();
            thread::spawn(move || p.complete(e, [2]))
        };
        // The IO thread reads meanwhile: never beyond what was completed.
        let seen = p.done();
        assert!(seen <= 3, "watermark {seen}");
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(p.done(), 3);
    });
}

#[test]
fn a_restart_ignores_the_old_streams_late_completions() {
    loom::model(|| {
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
    });
}
