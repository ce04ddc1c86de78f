//! The journal gate: records cut into batches before any byte they cover may leave, the
//! writer's marks releasing bytes and acknowledging progress, a failure stopping the node.

use super::*;

/// What the endpoint knows of the journal: it never touches it (a writer thread does, see
/// `journal::JournalWriter`); it cuts the turn's records into numbered batches, and lets
/// bytes leave and acks carry progress as the writer's marks say their batch is durable.
pub(crate) struct JournalGate {
    pub(super) policy: FsyncPolicy,
    /// What recovery found for peers not added yet, by name.
    pub(super) recovered: HashMap<String, RecoveredPeer>,
    /// The last batch cut.
    pub(super) cut: u64,
    /// The writer's marks as last reported.
    pub(super) marks: WriterMarks,
    /// Peers whose recorded progress is in batch `n`: acknowledged once `n` is durable.
    pub(super) awaiting: VecDeque<(u64, usize)>,
}

impl JournalGate {
    /// The last batch whose delivery progress may be acknowledged: appended (the page
    /// cache survives a crash of the process) — or, with an interval policy, synced.
    fn ack_mark(&self) -> u64 {
        match self.policy {
            FsyncPolicy::Interval(_) => self.marks.synced,
            FsyncPolicy::EveryBatch | FsyncPolicy::Never => self.marks.appended,
        }
    }

    /// Cuts this turn's records into the next batch for the journal's writer, and gates
    /// every link's unwritten bytes behind it: nothing leaves before the journal holds it.
    /// [`Endpoint::poll`] cuts before it gives out any write, and hands the batches to
    /// the driver for the writer ([`Output::Journal`]). Returns whether a batch was cut.
    pub(super) fn cut(&mut self, links: &mut Links, out: &mut Produced) -> bool {
        if out.records.is_empty() || self.marks.failed {
            return false;
        }
        self.cut += 1;
        let n = self.cut;
        for id in out.awaiting.drain(..) {
            self.awaiting.push_back((n, id));
        }
        out.batches.push((n, std::mem::take(&mut out.records)));
        for link in links.table.values_mut() {
            link.gate(n);
        }
        true
    }

    /// The journal's writer moved its marks: bytes whose records are now appended may
    /// leave (their links are marked to write), progress whose records are now durable is
    /// acknowledged. Returns whether they report a failure (the node must stop).
    pub(super) fn progress(
        &mut self,
        marks: WriterMarks,
        peers: &mut Roster,
        links: &mut Links,
    ) -> bool {
        if self.marks == marks || self.marks.failed {
            return false;
        }
        let released = marks.appended > self.marks.appended;
        self.marks = marks;
        if marks.failed {
            return true;
        }
        let durable = self.ack_mark();
        while let Some(&(n, id)) = self.awaiting.front() {
            if n > durable {
                break;
            }
            self.awaiting.pop_front();
            let Some(p) = peers.get_mut(&id) else {
                continue;
            };
            p.journal.made_durable();
            let link = p.link.and_then(|l| links.table.get_mut(&l));
            let link_id = link.as_ref().map(|l| l.id);
            if p.write_ack(link, false) {
                if let Some(l) = link_id {
                    links.dirty.push_back(l);
                }
            }
        }
        if released {
            for link in links.table.values().filter(|l| l.wants_write()) {
                links.dirty.push_back(link.id);
            }
        }
        false
    }
}

/// The journal after the IO thread has stopped, with what is needed to record how far the
/// pool got: the node records it once the pool has drained, so a clean shutdown leaves
/// nothing to deliver again.
pub(crate) struct StoppedJournal {
    pub(super) journal: Journal,
    pub(super) peers: Vec<StoppedPeer>,
}

/// A peer's share of [`StoppedJournal`].
pub(crate) struct StoppedPeer {
    pub(super) name: String,
    /// Its handled watermark and receive credit, still moving while the pool drains.
    pub(super) progress: Arc<crate::deliver::Progress>,
    pub(super) credit: Arc<crate::flow::RecvCredit>,
    /// What was recorded (delivered, credit, unreliable bytes), and how many of its
    /// messages were received.
    pub(super) recorded: (u64, u64, u64),
    pub(super) received: u64,
}

impl StoppedJournal {
    /// The journal, back from its writer, and the peers' progress as the endpoint left it.
    pub(crate) fn new(journal: Journal, peers: Vec<StoppedPeer>) -> StoppedJournal {
        StoppedJournal { journal, peers }
    }

    /// Records each peer's final delivery progress and syncs the journal.
    pub(crate) fn close(mut self) -> Result<(), JournalError> {
        let mut records = Vec::new();
        for p in self.peers {
            // The unreliable count before the credit (see `Remote::record_progress`).
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

impl Endpoint {
    /// A journal write or sync failed: durability can no longer be promised, so the node
    /// stops (fail-stop). Nothing more is journalled or acknowledged, and nothing not yet
    /// durable leaves; peers resend after our restart what we had not acknowledged.
    pub(super) fn journal_failed(&mut self, now: Instant) {
        log::error!(
            "{}: journal write failed, stopping the node",
            self.ctx.cfg.name
        );
        Counters::add(&self.ctx.counters.journal_failures, 1);
        if let Some(j) = self.ctx.journal.as_mut() {
            j.marks.failed = true;
            j.awaiting.clear();
        }
        self.ctx.out.journal_open = false;
        self.ctx.out.records.clear();
        self.ctx.out.awaiting.clear();
        self.ctx.out.batches.clear();
        // A close already queued carries bytes cut before the failure: none leaves now
        // (the buffer may hold messages the journal could not take).
        for e in &mut self.ctx.out.events {
            if let Output::Close { last, .. } = e {
                last.clear();
            }
        }
        self.ctx.out.events.push_back(Output::JournalFailed);
        self.begin_shutdown(now, now);
    }
}
