//! The durable outbox on the IO thread: what is journalled when, group commit before any
//! byte leaves, acks held back until the progress they carry is on disk, and restoring each
//! peer's stream from what the journal recovered.
//!
//! Records gather in one batch while the loop turns (messages as they are published, acks
//! as they retire messages, delivery progress as acks are prepared, rebinds at handshakes)
//! and are appended in one write, with at most one fsync, right before the first socket
//! write of the turn ([`IoThread::commit_journal`]). So a peer never holds a message the
//! journal lacks, and an ack never covers progress the journal could lose.

use super::*;
use crate::journal::{FsyncPolicy, Journal, JournalError, Record, RecoveredPeer};
use crate::proto::Unacked;

/// The journal as the IO thread holds it.
pub(super) struct JournalIo {
    pub(super) journal: Journal,
    policy: FsyncPolicy,
    /// Records of this turn, appended together.
    batch: Vec<Record>,
    /// What recovery found for peers not added yet, by name.
    recovered: HashMap<String, RecoveredPeer>,
    /// Peers whose recorded progress waits for the disk before it is acknowledged.
    awaiting: Vec<usize>,
    /// A sync timer is pending (interval policy).
    sync_timer: bool,
    /// A write or sync failed: nothing more is journalled or acknowledged.
    failed: bool,
}

impl JournalIo {
    /// Where `flush_peer` puts the records of the messages it publishes (`None` after a
    /// failure: nothing is published any more).
    pub(super) fn batch_for_publish(&mut self) -> Option<&mut Vec<Record>> {
        (!self.failed).then_some(&mut self.batch)
    }

    pub(super) fn new(journal: Journal, recovered: crate::journal::Recovered) -> JournalIo {
        let policy = journal.fsync_policy();
        JournalIo {
            journal,
            policy,
            batch: Vec::new(),
            recovered: recovered.peers.into_iter().collect(),
            awaiting: Vec::new(),
            sync_timer: false,
            failed: false,
        }
    }
}

/// The journal after the IO thread has stopped, with what is needed to record how far the
/// pool got: the node records it once the pool has drained, so a clean shutdown leaves
/// nothing to deliver again.
pub(crate) struct JournalLeft {
    journal: Journal,
    peers: Vec<LeftPeer>,
}

/// A peer's share of [`JournalLeft`].
struct LeftPeer {
    name: String,
    /// Its handled watermark and receive credit, still moving while the pool drains.
    progress: Arc<crate::deliver::Progress>,
    credit: Arc<crate::flow::RecvCredit>,
    /// What was recorded (delivered, credit, unreliable bytes), and how many of its
    /// messages were received.
    recorded: (u64, u64, u64),
    received: u64,
}

impl JournalLeft {
    /// Records each peer's final delivery progress and syncs the journal.
    pub(crate) fn close(mut self) -> Result<(), JournalError> {
        let mut records = Vec::new();
        for p in self.peers {
            // The unreliable count before the credit (see `record_progress`).
            let unreliable = p.progress.unreliable();
            let done = p.progress.done().min(p.received);
            let credit = p.credit.take();
            if done > p.recorded.0 || credit > 0 || unreliable > p.recorded.2 {
                records.push(Record::Delivered {
                    peer: p.name.into(),
                    count: done.max(p.recorded.0),
                    credit: p.recorded.1 + credit,
                    unreliable: unreliable.max(p.recorded.2),
                });
            }
        }
        self.journal.append(&records)?;
        self.journal.sync()
    }
}

impl IoThread {
    /// At exit: leaves the journal for the node to record the pool's last progress.
    pub(super) fn leave_journal(&mut self) {
        let Some(j) = self.journal.take() else {
            return;
        };
        if j.failed {
            return;
        }
        let peers = self
            .peers
            .values()
            .filter_map(|p| {
                let progress = p.shared.progress.clone()?;
                Some(LeftPeer {
                    name: p.shared.name.to_string(),
                    progress,
                    credit: p.shared.credit.clone(),
                    recorded: (p.recorded.0, p.recorded.1, p.recorded_unreliable),
                    received: p.desc.received(),
                })
            })
            .collect();
        *self.shared.journal_left.lock() = Some(JournalLeft {
            journal: j.journal,
            peers,
        });
    }

    /// Whether no journal write or sync has failed (always true without a journal): after
    /// a failure, bytes in write buffers may hold messages the journal lacks.
    pub(super) fn journal_ok(&self) -> bool {
        self.journal.as_ref().is_none_or(|j| !j.failed)
    }

    /// Whether this node journals.
    pub(super) fn journalled(&self) -> bool {
        self.journal.is_some()
    }

    /// Adds a record to this turn's batch.
    pub(super) fn journal_record(&mut self, r: Record) {
        if let Some(j) = self.journal.as_mut().filter(|j| !j.failed) {
            j.batch.push(r);
        }
    }

    /// Appends this turn's records (one write, at most one fsync), then acknowledges the
    /// progress that is now on disk. Called before any socket write.
    pub(super) fn commit_journal(&mut self) {
        let Some(j) = self.journal.as_mut() else {
            return;
        };
        if j.batch.is_empty() || j.failed {
            return;
        }
        let result = j.journal.append(&j.batch);
        j.batch.clear();
        match result {
            Ok(()) => self.journal_written(),
            Err(e) => self.journal_failed(e),
        }
    }

    /// Forces the journal to disk now (node shutdown, `Node::sync_journal`). Returns whether
    /// everything journalled is on disk: `false` once a write or sync has failed (then the
    /// node is stopping, and nothing may be reported durable).
    pub(super) fn sync_journal(&mut self) -> bool {
        self.commit_journal();
        let Some(j) = self.journal.as_mut().filter(|j| !j.failed) else {
            return false;
        };
        match j.journal.sync() {
            Ok(()) => {
                self.journal_written();
                true
            }
            Err(e) => {
                self.journal_failed(e);
                false
            }
        }
    }

    /// The interval policy's timer: sync what is written, then acknowledge it.
    pub(super) fn journal_sync_due(&mut self) {
        if let Some(j) = self.journal.as_mut() {
            j.sync_timer = false;
        }
        // A failure stops the node; nothing waits on this sync.
        let _ = self.sync_journal();
    }

    /// Records reached the journal: once they are as durable as the policy makes them,
    /// the progress they hold may be acknowledged.
    fn journal_written(&mut self) {
        let Some(j) = self.journal.as_mut() else {
            return;
        };
        *self.shared.journal_stats.lock() = Some(j.journal.stats());
        if let FsyncPolicy::Interval(every) = j.policy {
            if j.journal.unsynced() {
                if !j.sync_timer {
                    j.sync_timer = true;
                    self.timers
                        .add(Instant::now() + every, TimerKind::JournalSync);
                }
                return; // acks wait for the sync
            }
        }
        for id in std::mem::take(&mut j.awaiting) {
            if let Some(p) = self.peers.get_mut(&id) {
                p.durable = p.recorded;
                self.write_ack(id, false);
            }
        }
    }

    /// A journal write failed: durability can no longer be promised, so the node stops
    /// (fail-stop). Nothing more is journalled or acknowledged; peers resend after our
    /// restart what we had not acknowledged.
    fn journal_failed(&mut self, e: JournalError) {
        log::error!(
            "{}: journal write failed, stopping the node: {e}",
            self.cfg.name
        );
        Counters::add(&self.counters.journal_failures, 1);
        if let Some(j) = self.journal.as_mut() {
            j.failed = true;
            j.batch.clear();
            j.awaiting.clear();
        }
        self.begin_shutdown(Instant::now());
    }

    /// Journals how far the application has handled peer `id`'s stream and the credit that
    /// may go back to it; the ack carrying them is written once they are durable.
    pub(super) fn record_progress(&mut self, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let Some(progress) = &p.shared.progress else {
            return;
        };
        // The unreliable count is read before the credit is taken: the pool adds to the
        // credit first, so every unreliable byte recorded has its credit recorded too (a
        // restarted member tells the sender this count; credit for bytes beyond it would
        // never come, so the sender gives them back).
        let unreliable = progress.unreliable();
        let done = progress.done().min(p.desc.received());
        let credit = p.shared.credit.take();
        if done <= p.recorded.0 && credit == 0 && unreliable <= p.recorded_unreliable {
            return;
        }
        p.recorded = (done.max(p.recorded.0), p.recorded.1 + credit);
        p.recorded_unreliable = p.recorded_unreliable.max(unreliable);
        let record = Record::Delivered {
            peer: p.shared.name.clone(),
            count: p.recorded.0,
            credit: p.recorded.1,
            unreliable: p.recorded_unreliable,
        };
        if let Some(j) = self.journal.as_mut().filter(|j| !j.failed) {
            j.batch.push(record);
            if !j.awaiting.contains(&id) {
                j.awaiting.push(id);
            }
        }
    }

    /// The peer's stream restarts from zero (new incarnation, or a reset): a new epoch
    /// begins, so messages of the old stream still being handled earn no credit (its
    /// window is not over-released by them) and, with a journal, late completions of the
    /// old stream do not move the new one's watermark.
    pub(super) fn restart_stream(&mut self, id: usize) {
        if let Some(p) = self.peers.get_mut(&id) {
            p.epoch = match &p.shared.progress {
                Some(progress) => progress.restart(0, 0),
                None => p.epoch.wrapping_add(1),
            };
            let _ = p.shared.credit.restart(p.epoch);
            p.recorded = (0, 0);
            p.recorded_unreliable = 0;
            p.durable = (0, 0);
        }
    }

    /// Gives a newly added peer the stream the journal recovered for it: sequence numbers
    /// continue, unacknowledged messages are resent at the next handshake, and how far we
    /// delivered its messages is what we tell it we received.
    pub(super) fn restore_peer(&mut self, id: usize) {
        let Some(p) = self.peers.get_mut(&id) else {
            return;
        };
        let Some(j) = self.journal.as_mut() else {
            return;
        };
        let Some(r) = j.recovered.remove(&*p.shared.name) else {
            return;
        };
        let mut unacked: Vec<Unacked> = Vec::with_capacity(r.unacked.len());
        let mut lost = Vec::new();
        for m in r.unacked {
            let next = r.acked + unacked.len() as u64 + 1;
            if m.seq == next && lost.is_empty() {
                unacked.push(Unacked {
                    seq: m.seq,
                    flags: m.flags,
                    payload: m.payload,
                });
            } else {
                lost.push(Unacked {
                    seq: m.seq,
                    flags: m.flags,
                    payload: m.payload,
                });
            }
        }
        let sent = r.acked + unacked.len() as u64;
        if sent < r.sent {
            log::error!(
                "{}: the journal lacks messages {}..={} to '{}' (cut by corruption); {} later ones cannot be resent in order and are undelivered",
                self.cfg.name,
                sent + 1,
                r.sent,
                p.shared.name,
                lost.len()
            );
        }
        let launch = (r.launch != 0).then_some(r.launch);
        // The restored messages hold no permits in this process: charge the window for them
        // (as far as it has room), so that what a member keeps for a peer stays bounded by
        // the window however often it restarts. The peer's credit for them releases the
        // charge as for any published message; `credit_seen` makes its running total
        // count from where the journal left it.
        // Uncredited: every journalled message the peer has not credited yet — the unacked
        // ones, and acked ones whose credit was still on its way.
        let unacked_cost: u64 = unacked
            .iter()
            .map(|u| crate::flow::cost(u.payload.len()))
            .sum();
        let cost = r.published.saturating_sub(r.credit_seen).max(unacked_cost);
        let charged = p.shared.outbox.window().take_up_to(cost);
        p.ledger.publish(charged);
        p.desc = Descriptor::restore(
            launch,
            sent,
            r.acked,
            r.delivered,
            (r.credit, r.credit_seen),
            r.unreliable,
            unacked,
        );
        if let Some(progress) = &p.shared.progress {
            p.epoch = progress.restart(r.delivered, r.unreliable);
            let _ = p.shared.credit.restart(p.epoch);
        }
        p.recorded = (r.delivered, r.credit);
        p.recorded_unreliable = r.unreliable;
        p.durable = p.recorded;
        p.restored = cost > charged;
        p.restored_upto = Some(sent);
        if cost > charged {
            log::warn!(
                "{}: journal: the {} bytes of messages restored for '{}' exceed its free window ({} bytes charged)",
                self.cfg.name,
                cost,
                p.shared.name,
                charged
            );
        }
        log::info!(
            "{}: journal: '{}' resumes at seq {} ({} unacknowledged to resend), {} of its messages delivered",
            self.cfg.name,
            p.shared.name,
            sent + 1,
            p.desc.unacked_len(),
            r.delivered
        );
        if !lost.is_empty() {
            let name = p.shared.name.clone();
            Counters::add(&p.shared.counters.undelivered, lost.len() as u64);
            self.report_undelivered(&name, lost);
        }
    }

    /// Warns about journalled peers that are not configured (their messages stay in the
    /// journal until the member is added).
    pub(super) fn warn_unclaimed(&self) {
        if let Some(j) = &self.journal {
            for (name, r) in &j.recovered {
                if !r.unacked.is_empty() {
                    log::warn!(
                        "{}: the journal holds {} unacknowledged messages to '{name}', which is not configured; they wait until it is added",
                        self.cfg.name,
                        r.unacked.len()
                    );
                }
            }
        }
    }
}
