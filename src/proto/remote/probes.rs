//! The housekeeping tick and the probes: a credit probe for senders parked on an empty
//! window, a warning per long block, round-trip probes, residual credit, expiry of queued
//! messages while disconnected, an idle peer's run buffers let go.

use std::time::Instant;

use super::Remote;
use crate::peer::{Counters, Rtt};
use crate::proto::endpoint::{Config, Produced};
use crate::proto::link::{Link, LinkId};
use crate::wire;

impl Remote {
    /// The housekeeping tick: a credit probe for senders parked on an empty window (once
    /// per probe interval), a warning per long block, residual credit once the sender's
    /// queue is idle, expiry of queued messages while disconnected, and the run buffers
    /// of a peer with nothing queued or unacknowledged let go. Returns whether bytes were
    /// written to `link`.
    pub(crate) fn tick(
        &mut self,
        cfg: &Config,
        out: &mut Produced,
        mut link: Option<&mut Link>,
        now: Instant,
    ) -> bool {
        let established = link.as_ref().is_some_and(|l| l.established);
        let mut wrote = false;
        let window = self.shared.outbox.window();
        if let Some((since, episode)) = window.blocked_since() {
            let blocked = now.saturating_duration_since(since);
            let probe_due = self
                .last_probe
                .is_none_or(|t| now.saturating_duration_since(t) >= cfg.probe_interval);
            if established && blocked >= cfg.probe_interval && probe_due {
                self.last_probe = Some(now);
                // Its answer may come after the credit it asks for: no round-trip probe
                // for a heartbeat, so that answer is never taken for one.
                self.rtt.defer(now);
                Counters::add(&self.shared.counters.probes, 1);
                if let Some(l) = link.as_deref_mut() {
                    wire::encode_probe(l.out.tail());
                    wrote = true;
                }
            }
            if blocked >= cfg.block_warning && self.warned_episode != episode {
                self.warned_episode = episode;
                log::warn!(
                    "{}: senders to '{}' blocked for {:.1?}: window {} bytes, {} in flight ({} unacknowledged messages), peer {}",
                    cfg.name,
                    self.shared.name,
                    blocked,
                    window.capacity(),
                    window.in_flight(),
                    self.desc.unacked_len(),
                    self.state
                );
            }
        }
        if established {
            if let Some(l) = link.as_deref_mut() {
                let owed =
                    self.desc.acked() < self.desc.sent() || self.outbound.ledger.uncredited() > 0;
                wrote |= self.rtt.send(cfg, l, now, owed);
            }
        }
        let residual = cfg.credit_on_idle
            && established
            && self.shared.credit.pending() > 0
            && !self.shared.member.is_running();
        if residual {
            wrote |= self.ack(out, link, false);
        } else if !established
            && self.outbound.sweep_queued(&self.shared, cfg, out, now)
            && cfg.journalled
        {
            // What waited behind an expired message is journalled now.
            self.publish(cfg, out, None, cfg.write_high_water, now);
        }
        if self.desc.unacked_len() == 0 && !self.outbound.has_queued(&self.shared) {
            // Nothing queued, nothing unacknowledged: the peer's run buffers go, so an
            // idle peer holds none.
            self.shared.outbox.release_buffers();
        }
        wrote
    }

    /// Whether this peer leaves the tick nothing to do: no sender holds window bytes or
    /// waits for them (no credit probe, no block warning due), nothing queued (nothing to
    /// expire or withdraw), nothing unacknowledged, none of its bytes held here nor, with
    /// `credit_on_idle`, consumed and not yet credited back (no residual credit to
    /// return), and its `Scheduled` flag clear, so that the next send rings the IO thread
    /// (the flag stays set while the peer is away with messages sent to it, and while its
    /// socket is backed up: sends then ring nobody). What ends it comes in as an input: a
    /// send (`Publish`), a read of its data, a credit flush.
    pub(crate) fn is_quiet(&self, cfg: &Config) -> bool {
        let window = self.shared.outbox.window();
        let credit = &self.shared.credit;
        let settled = if cfg.credit_on_idle {
            credit.settled()
        } else {
            credit.held() == 0
        };
        settled
            && window.in_flight() == 0
            && self.desc.unacked_len() == 0
            && !self.shared.scheduled.is_set()
            && !self.outbound.has_queued(&self.shared)
            && window.blocked_since().is_none()
    }
}

/// Round-trip measurement: a probe on the peer's link at most once per heartbeat interval,
/// and only while the peer owes this node nothing (every reliable message acknowledged,
/// every window byte credited back). The peer answers every probe with an ack at once, and
/// owes no other, so the next ack on this link is the answer, whatever the wire's frames
/// carry: the time between them is one round trip (the two IO threads' turns included). No
/// sample is taken while the peer owes acks or credit (a busy stream in this direction),
/// nor within a heartbeat of the handshake or of a credit probe (acks of theirs may still
/// be on the way); a probe without an answer is dropped after the idle timeout. The sample
/// is exact only if the ack's one-way trip is shorter than a heartbeat.
#[derive(Default)]
pub(crate) struct RoundTrip {
    /// A probe sent to measure the round trip, on that link at that instant, and not yet
    /// answered.
    probe: Option<(LinkId, Instant)>,
    /// When we last sent a round-trip probe (or when the next one was last put off).
    probed: Option<Instant>,
}

impl RoundTrip {
    /// Sends a probe on `link` if one is due and the peer owes nothing (`owed`: it does).
    /// Returns whether bytes were written to `link`.
    fn send(&mut self, cfg: &Config, link: &mut Link, now: Instant, owed: bool) -> bool {
        if let Some((lid, at)) = self.probe {
            if lid == link.id && now.saturating_duration_since(at) < cfg.idle_timeout {
                return false;
            }
            self.probe = None;
        }
        let due = self
            .probed
            .is_none_or(|t| now.saturating_duration_since(t) >= cfg.heartbeat);
        if !due || owed {
            return false;
        }
        wire::encode_probe(link.out.tail());
        self.probe = Some((link.id, now));
        self.probed = Some(now);
        true
    }

    /// No probe for a heartbeat from `now`: an ack on its way (the answer to a credit
    /// probe) must not be taken for the answer to one.
    fn defer(&mut self, now: Instant) {
        self.probed = Some(now);
    }

    /// A handshake completed at `now`: a probe in flight on an older link is dropped, and
    /// the first one waits a heartbeat (the handshake's own acks may still be on their
    /// way).
    pub(super) fn restart(&mut self, now: Instant) {
        self.probe = None;
        self.probed = Some(now);
    }

    /// An ack arrived on `link` at `now`: the answer to a round-trip probe sent on it, if
    /// one waits; its sample goes to `rtt`.
    pub(crate) fn answer(&mut self, link: LinkId, now: Instant, rtt: &Rtt) {
        if let Some((lid, at)) = self.probe {
            if lid == link {
                self.probe = None;
                rtt.sample(now.saturating_duration_since(at));
            }
        }
    }
}
