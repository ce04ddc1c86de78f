//! The housekeeping tick and the probes: a credit probe for senders parked on an empty
//! window, a warning per long block, round-trip probes, residual credit, expiry of queued
//! messages while disconnected.

use std::time::Instant;

use super::Remote;
use crate::peer::Counters;
use crate::proto::endpoint::{Config, Produced};
use crate::proto::link::{Link, LinkId};
use crate::wire;

impl Remote {
    /// The housekeeping tick: a credit probe for senders parked on an empty window (once
    /// per probe interval), a warning per long block, residual credit once the sender's
    /// queue is idle, expiry of queued messages while disconnected. Returns whether bytes
    /// were written to `link`.
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
                self.rtt_probed = Some(now);
                Counters::add(&self.shared.counters.probes, 1);
                if let Some(l) = link.as_deref_mut() {
                    wire::encode_probe(&mut l.wbuf);
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
                wrote |= self.rtt_probe(cfg, l, now);
            }
        }
        let residual = cfg.credit_on_idle
            && established
            && self.shared.credit.pending() > 0
            && !self.shared.member.is_running();
        if residual {
            wrote |= self.ack(out, link, false);
        } else if !established && self.sweep_queued(cfg, out, now) && cfg.journalled {
            // What waited behind an expired message is journalled now.
            self.publish(cfg, out, None, cfg.write_high_water, now);
        }
        wrote
    }

    /// Round-trip measurement: sends a probe on `link` at most once per heartbeat interval,
    /// and only while the peer owes this node nothing (every reliable message acknowledged,
    /// every window byte credited back). The peer answers every probe with an ack at once,
    /// and owes no other, so the next ack on this link is the answer, whatever the wire's
    /// frames carry: the time between them is one round trip (the two IO threads' turns
    /// included). No sample is taken while the peer owes acks or credit (a busy stream in
    /// this direction), nor within a heartbeat of the handshake or of a credit probe (acks
    /// of theirs may still be on the way); a probe without an answer is dropped after the
    /// idle timeout. The sample is exact only if the ack's one-way trip is shorter than a
    /// heartbeat.
    fn rtt_probe(&mut self, cfg: &Config, link: &mut Link, now: Instant) -> bool {
        if let Some((lid, at)) = self.rtt_probe {
            if lid == link.id && now.saturating_duration_since(at) < cfg.idle_timeout {
                return false;
            }
            self.rtt_probe = None;
        }
        let due = self
            .rtt_probed
            .is_none_or(|t| now.saturating_duration_since(t) >= cfg.heartbeat);
        let owed = self.desc.acked() < self.desc.sent() || self.ledger.uncredited() > 0;
        if !due || owed {
            return false;
        }
        wire::encode_probe(&mut link.wbuf);
        self.rtt_probe = Some((link.id, now));
        self.rtt_probed = Some(now);
        true
    }

    /// An ack arrived on `link` at `now`: the answer to a round-trip probe sent on it, if
    /// one waits.
    pub(crate) fn rtt_answer(&mut self, link: LinkId, now: Instant) {
        if let Some((lid, at)) = self.rtt_probe {
            if lid == link {
                self.rtt_probe = None;
                self.shared
                    .counters
                    .rtt
                    .sample(now.saturating_duration_since(at));
            }
        }
    }
}
