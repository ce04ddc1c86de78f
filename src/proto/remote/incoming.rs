//! Receiving: data frames admitted against the peer's window (one at a time, or a read's
//! regular messages as one run) and receive credit held for them. The run is cut, and a
//! read's messages pushed to the peer's delivery queues, by what the turn produces
//! ([`Produced::cut_run`], [`Produced::push_batch`]).

use bytes::{Buf, Bytes};

use super::Remote;
use crate::deliver::{Delivery, ReplyRoom};
use crate::peer::{Counters, Failure};
use crate::proto::endpoint::Produced;
use crate::proto::recovery::{Receive, RecoveryError};
use crate::sync::Arc;
use crate::wire;

/// What reading a data frame leaves the link to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Inflow {
    /// Go on reading.
    Continue,
    /// Stop reading until the peer's held bytes are back within its receive window.
    Pause,
}

impl Remote {
    /// A data frame on the peer's established link: admitted against the peer's window (a
    /// peer past it ignores credit: `Err`, the link is closed), then queued for delivery in
    /// `out`. Says whether to go on reading, or pause the link because the peer's held
    /// bytes, counting messages of a previous stream still being handled, exceed its
    /// receive window.
    pub(crate) fn on_data(
        &mut self,
        out: &mut Produced,
        flags: u8,
        seq: Option<u64>,
        mut payload: Bytes,
    ) -> Result<Inflow, RecoveryError> {
        let cost = crate::flow::frame_cost(flags, &payload);
        match self.desc.accept_data(seq, cost, self.peer_window)? {
            Receive::Deliver => {}
            Receive::Duplicate => {
                Counters::add(&self.shared.counters.duplicates, 1);
                // Still acked: the sender resent it because it lacks our ack.
                self.acks.forced = true;
                return Ok(Inflow::Continue);
            }
        }
        Counters::add(&self.shared.counters.received, 1);
        Counters::add(&self.shared.counters.received_bytes, payload.len() as u64);
        // The wire checked that a request or reply starts with its header.
        let (id, room) = if flags & (wire::FLAG_REQUEST | wire::FLAG_REPLY) != 0 {
            let id = wire::request_id(&payload).unwrap_or_default();
            let room = wire::request_room(&payload).unwrap_or_default();
            payload.advance(wire::tag_bytes(flags).min(payload.len()));
            (id, room)
        } else {
            (0, 0)
        };
        if flags & wire::FLAG_REPLY != 0 {
            // Straight to the request waiting for it, outside flow control: it took no
            // window of its own (its room came back when the replier sent it) and returns
            // no credit. A journalling receiver counts it handled now.
            if let (Some(p), Some(seq)) = (&self.shared.progress, seq) {
                p.complete(self.epoch, std::iter::once(seq));
            }
            // A status reply carries why the replier cannot answer instead of a payload
            // (the wire checked it).
            let reply = if flags & wire::FLAG_STATUS != 0 {
                let status =
                    wire::decode_reply_status(&payload).unwrap_or(wire::ReplyStatus::Other(0));
                Err(Failure::Refused(status))
            } else {
                Ok(payload)
            };
            if !self.shared.requests.answer(id, reply) {
                log::debug!(
                    "reply from '{}' to request {id} came after the request was given up",
                    self.shared.name
                );
            }
            return Ok(Inflow::Continue);
        }
        // What this sender makes us hold: the message, with a request's reply room, until
        // it is consumed.
        let held = self.shared.credit.received(cost);
        self.shared.counters.note_held(held);
        let request = (flags & wire::FLAG_REQUEST != 0)
            .then(|| Arc::new(ReplyRoom::new(id, u64::from(room))));
        if flags & wire::FLAG_OOB != 0 {
            out.oob_batch.push(
                Delivery::new(self.shared.name.clone(), payload, seq, true)
                    .in_epoch(self.epoch)
                    .with_request(request),
            );
        } else {
            // Named by the deliverer, on the pool thread: cloning the sender's name here and
            // dropping it there would bounce its refcount between cores on every message.
            out.batch.push(
                Delivery::unnamed(payload, seq)
                    .in_epoch(self.epoch)
                    .with_request(request)
                    .into(),
            );
        }
        Ok(if held > self.shared.credit.window() {
            Inflow::Pause
        } else {
            Inflow::Continue
        })
    }

    /// Admits the regular messages that follow one another in `rbuf` (the link's read
    /// buffer, bound by `max` as the link's state says) from `*pending` on into the turn's
    /// run, moving `*pending` past them: admitted as [`on_data`] admits each
    /// ([`Descriptor::accept_frames`]), and left in the buffer, so a read's messages take
    /// its bytes once ([`cut_run`]). Stops at the first frame that is not one of them
    /// (another kind, a request, reply or out-of-band message, a duplicate, a gap, a frame
    /// past the peer's window, or a malformed or incomplete frame: the caller takes it on
    /// its own, and reports what is wrong with it) with `Continue`, or after the message
    /// that took the peer past its receive window with `Pause`. The held count is added to
    /// once per run, or when the run may cross the receive window: then a pause is decided
    /// on the count itself, as for a single message.
    ///
    /// [`on_data`]: Remote::on_data
    /// [`cut_run`]: Produced::cut_run
    /// [`Descriptor::accept_frames`]: crate::proto::Descriptor::accept_frames
    pub(crate) fn admit_run(
        &mut self,
        out: &mut Produced,
        rbuf: &[u8],
        max: usize,
        pending: &mut usize,
    ) -> Inflow {
        let window = self.shared.credit.window();
        let run = &mut out.run;
        loop {
            if run.count == 0 && run.unflushed == 0 {
                run.epoch = self.epoch;
                run.held = self.shared.credit.held();
            }
            let limit = window.saturating_sub(run.held + run.unflushed);
            let a = self
                .desc
                .accept_frames(&rbuf[*pending..], max, self.peer_window, limit);
            *pending += a.frame_bytes;
            run.count += a.count;
            run.bytes += a.payload_bytes;
            run.unflushed += a.cost;
            if run.held + run.unflushed <= window {
                // Stopped at a frame that is not the run's, or at the end of the read.
                return Inflow::Continue;
            }
            run.held = self
                .shared
                .credit
                .received(std::mem::take(&mut run.unflushed));
            self.shared.counters.note_held(run.held);
            if run.held > window {
                return Inflow::Pause;
            }
        }
    }
}
