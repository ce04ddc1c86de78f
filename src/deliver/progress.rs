//! How far a sender's reliable stream has been handled by the application, for the
//! journal: the receiver records this watermark and acknowledges nothing beyond it.
//!
//! Regular messages complete in order, out-of-band ones in any order, so the watermark is
//! the highest sequence number below which every reliable message has been handled; the
//! ones completed above a gap wait in a small set until the gap closes.

use std::collections::BTreeSet;

use crate::sync::Mutex;

/// The handled watermark of one sender's reliable stream. Pool threads report completions
/// ([`complete`](Progress::complete)); the IO thread reads [`done`](Progress::done) and
/// restarts it when the stream restarts ([`restart`](Progress::restart)).
#[derive(Debug, Default)]
pub struct Progress {
    // A mutex, not atomics: a completion above a gap must be kept until the gap closes, and
    // it is taken once per delivered batch, not per message.
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Completions from another epoch (a stream that was restarted) are ignored.
    epoch: u32,
    /// Every reliable message with `seq <= done` has been handled.
    done: u64,
    /// Handled messages above the first gap.
    ahead: BTreeSet<u64>,
    /// Window bytes of unreliable messages handled in this epoch.
    unreliable: u64,
}

impl Progress {
    /// A stream handled up to `done`, in epoch 0.
    pub fn new(done: u64) -> Progress {
        Progress {
            inner: Mutex::new(Inner {
                epoch: 0,
                done,
                ahead: BTreeSet::new(),
                unreliable: 0,
            }),
        }
    }

    /// The current epoch: deliveries carry it, so that completions of a stream that has
    /// since restarted are not mistaken for the new stream's.
    #[cfg(any(test, cohort_internals))]
    pub fn epoch(&self) -> u32 {
        self.inner.lock().epoch
    }

    /// The stream restarts (the sender is a new incarnation, or the relationship was
    /// reset, or it is restored from the journal) at `done`, with `unreliable` window bytes
    /// of unreliable messages handled: a new epoch begins. Returns it.
    pub fn restart(&self, done: u64, unreliable: u64) -> u32 {
        let mut g = self.inner.lock();
        g.epoch = g.epoch.wrapping_add(1);
        g.done = done;
        g.ahead.clear();
        g.unreliable = unreliable;
        g.epoch
    }

    /// Unreliable messages of `epoch` costing `cost` window bytes were handled.
    pub fn complete_unreliable(&self, epoch: u32, cost: u64) {
        let mut g = self.inner.lock();
        if g.epoch == epoch {
            g.unreliable += cost;
        }
    }

    /// Window bytes of unreliable messages handled in this epoch (from the value given to
    /// [`restart`](Progress::restart)).
    pub fn unreliable(&self) -> u64 {
        self.inner.lock().unreliable
    }

    /// Messages of `epoch` with these sequence numbers have been handled.
    pub fn complete(&self, epoch: u32, seqs: impl IntoIterator<Item = u64>) {
        let mut g = self.inner.lock();
        if g.epoch != epoch {
            return;
        }
        for seq in seqs {
            if seq == g.done + 1 {
                g.done = seq;
                while g.ahead.first() == Some(&(g.done + 1)) {
                    g.ahead.pop_first();
                    g.done += 1;
                }
            } else if seq > g.done {
                g.ahead.insert(seq);
            }
        }
    }

    /// Every reliable message up to this sequence number has been handled.
    pub fn done(&self) -> u64 {
        self.inner.lock().done
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_watermark_waits_for_gaps_and_ignores_old_epochs() {
        let p = Progress::new(3);
        p.complete(0, [4, 5]);
        assert_eq!(p.done(), 5);
        p.complete(0, [7, 9]);
        assert_eq!(p.done(), 5, "6 not handled yet");
        p.complete(0, [6]);
        assert_eq!(p.done(), 7);
        p.complete(0, [8]);
        assert_eq!(p.done(), 9);
        p.complete(0, [2, 9]);
        assert_eq!(p.done(), 9, "old or repeated completions change nothing");
        let e = p.restart(0, 0);
        p.complete(0, [1, 2]);
        assert_eq!(p.done(), 0, "completions of the old stream are ignored");
        p.complete(e, [1]);
        assert_eq!(p.done(), 1);
    }
}
