//! The handshake state machine, sans-IO.
//!
//! ```text
//!  acceptor                                  dialler
//!  ── Hello{identity} ──────────────────────►  check version, cluster, name
//!  ◄─────────────── HelloReply{identity, received, connections}
//!  check version, cluster; the caller decides
//!  (known member? tie-break?), then
//!  ── Ready{received} ──────────────────────►  established
//!  established
//! ```
//!
//! Both sides then drop from their unacked queue what the other has and resend the rest,
//! before any new message. The machine only validates and sequences; decisions that need
//! the node's state (is this member known, which of two connections wins) are the caller's,
//! taken between [`HsEvent::Identified`] and [`Handshake::accept`] / [`Handshake::refuse`].

use crate::wire::{self, CloseCode, Frame, Identity};

/// Our own identity, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalIdentity {
    /// Random per start.
    pub launch_id: u64,
    /// Our send window, bytes.
    pub window: u64,
    /// Largest message payload we accept.
    pub max_message: u32,
    /// Cluster name.
    pub cluster: String,
    /// Our member name.
    pub name: String,
}

impl LocalIdentity {
    fn wire(&self) -> Identity<'_> {
        Identity {
            version: wire::VERSION,
            launch_id: self.launch_id,
            window: self.window,
            max_message: self.max_message,
            cluster: &self.cluster,
            name: &self.name,
        }
    }
}

/// The peer's identity as it said it in the handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    /// Member name.
    pub name: String,
    /// Launch id: changes when the member restarts.
    pub launch_id: u64,
    /// The peer's send window (we return credit to it in halves of this).
    pub window: u64,
    /// Largest message payload the peer accepts.
    pub max_message: u32,
}

/// Which end of the connection we are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// We accepted the connection; we speak first.
    Acceptor,
    /// We dialled `expected`.
    Dialler {
        /// The member we meant to reach.
        expected: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Acceptor: Hello sent, waiting for HelloReply. Dialler: waiting for Hello.
    AwaitPeer,
    /// Peer identified; waiting for the caller's decision.
    Deciding,
    /// Dialler: HelloReply sent, waiting for Ready.
    AwaitReady,
    /// Established.
    Done,
    /// Refused or failed.
    Failed,
}

/// What a handshake frame led to.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum HsEvent {
    /// The peer said who it is and passed the version and cluster checks. The caller now
    /// calls [`Handshake::accept`] or [`Handshake::refuse`]. For an acceptor,
    /// `peer_received` is how many of our messages the dialler holds.
    Identified {
        /// Who it is.
        peer: PeerIdentity,
        /// Acceptor only: the dialler's received count.
        peer_received: Option<u64>,
        /// Acceptor only: how many connections the dialler has established with our
        /// incarnation (for [`keep_new`]).
        peer_connections: Option<u64>,
        /// Acceptor only: window bytes of our unreliable messages the dialler has received.
        peer_unreliable: Option<u64>,
    },
    /// Dialler only: the acceptor's Ready arrived; the connection is up.
    Established {
        /// How many of our messages the acceptor holds.
        peer_received: u64,
        /// Window bytes of our unreliable messages the acceptor has received.
        peer_unreliable: u64,
    },
}

/// Why a handshake failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HsError {
    /// The close code (sent to the peer when we are the one refusing).
    pub code: CloseCode,
    /// What went wrong, for the log.
    pub reason: String,
    /// Whether the peer closed on us (true) or we refuse it (false).
    pub by_peer: bool,
}

impl std::fmt::Display for HsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.by_peer {
            write!(
                f,
                "peer refused the handshake ({:?}): {}",
                self.code, self.reason
            )
        } else {
            write!(f, "handshake refused ({:?}): {}", self.code, self.reason)
        }
    }
}

impl std::error::Error for HsError {}

fn refuse(code: CloseCode, reason: String) -> HsError {
    HsError {
        code,
        reason,
        by_peer: false,
    }
}

/// One connection's handshake.
#[derive(Debug)]
pub struct Handshake {
    role: Role,
    step: Step,
    local: LocalIdentity,
    peer: Option<PeerIdentity>,
}

impl Handshake {
    /// Starts the acceptor side; appends Hello to `out`.
    pub fn acceptor(local: LocalIdentity, out: &mut Vec<u8>) -> Handshake {
        wire::encode_hello(out, &local.wire());
        Handshake {
            role: Role::Acceptor,
            step: Step::AwaitPeer,
            local,
            peer: None,
        }
    }

    /// Starts the dialler side; it waits for the acceptor's Hello.
    pub fn dialler(local: LocalIdentity, expected: String) -> Handshake {
        Handshake {
            role: Role::Dialler { expected },
            step: Step::AwaitPeer,
            local,
            peer: None,
        }
    }

    /// Whether the handshake completed.
    pub fn is_done(&self) -> bool {
        self.step == Step::Done
    }

    /// Our role.
    pub fn role(&self) -> &Role {
        &self.role
    }

    /// The peer, once identified.
    pub fn peer(&self) -> Option<&PeerIdentity> {
        self.peer.as_ref()
    }

    fn check(&self, id: &Identity<'_>) -> Result<PeerIdentity, HsError> {
        if id.version != wire::VERSION {
            return Err(refuse(
                CloseCode::Version,
                format!(
                    "protocol version {} (ours is {})",
                    id.version,
                    wire::VERSION
                ),
            ));
        }
        if id.cluster != self.local.cluster {
            return Err(refuse(
                CloseCode::Cluster,
                format!(
                    "member '{}' is in cluster '{}', not '{}'",
                    id.name, id.cluster, self.local.cluster
                ),
            ));
        }
        if id.name == self.local.name {
            return Err(refuse(
                CloseCode::NameMismatch,
                format!("peer uses our own member name '{}'", id.name),
            ));
        }
        if let Role::Dialler { expected } = &self.role {
            if id.name != expected {
                return Err(refuse(
                    CloseCode::NameMismatch,
                    format!("dialled '{expected}' but '{}' answered", id.name),
                ));
            }
        }
        if id.window < 2 {
            return Err(refuse(
                CloseCode::Protocol,
                format!("window of {} bytes", id.window),
            ));
        }
        Ok(PeerIdentity {
            name: id.name.to_owned(),
            launch_id: id.launch_id,
            window: id.window,
            max_message: id.max_message,
        })
    }

    /// Feeds one frame received before the handshake completed.
    pub fn on_frame(&mut self, frame: &Frame<'_>) -> Result<HsEvent, HsError> {
        let r = self.on_frame_inner(frame);
        if r.is_err() {
            self.step = Step::Failed;
        }
        r
    }

    fn on_frame_inner(&mut self, frame: &Frame<'_>) -> Result<HsEvent, HsError> {
        if let Frame::Close { code, reason } = frame {
            return Err(HsError {
                code: *code,
                reason: (*reason).to_owned(),
                by_peer: true,
            });
        }
        match (&self.role, self.step, frame) {
            (Role::Dialler { .. }, Step::AwaitPeer, Frame::Hello(id)) => {
                let peer = self.check(id)?;
                self.peer = Some(peer.clone());
                self.step = Step::Deciding;
                Ok(HsEvent::Identified {
                    peer,
                    peer_received: None,
                    peer_connections: None,
                    peer_unreliable: None,
                })
            }
            (
                Role::Acceptor,
                Step::AwaitPeer,
                Frame::HelloReply(id, received, connections, unreliable),
            ) => {
                let peer = self.check(id)?;
                self.peer = Some(peer.clone());
                self.step = Step::Deciding;
                Ok(HsEvent::Identified {
                    peer,
                    peer_received: Some(*received),
                    peer_connections: Some(*connections),
                    peer_unreliable: Some(*unreliable),
                })
            }
            (
                Role::Dialler { .. },
                Step::AwaitReady,
                Frame::Ready {
                    received,
                    unreliable,
                },
            ) => {
                self.step = Step::Done;
                Ok(HsEvent::Established {
                    peer_received: *received,
                    peer_unreliable: *unreliable,
                })
            }
            (_, step, f) => Err(refuse(
                CloseCode::Protocol,
                format!("unexpected {} during handshake ({step:?})", frame_name(f)),
            )),
        }
    }

    /// Accepts the identified peer. Acceptor: appends Ready and is done. Dialler: appends
    /// HelloReply and waits for Ready. `our_received` is how many of the peer's current
    /// incarnation's messages we hold; `our_connections` how many connections we have
    /// established with it (sent by the dialler only); `our_unreliable` the window bytes of
    /// its unreliable messages we have received.
    pub fn accept(
        &mut self,
        our_received: u64,
        our_connections: u64,
        our_unreliable: u64,
        out: &mut Vec<u8>,
    ) {
        assert_eq!(
            self.step,
            Step::Deciding,
            "accept before the peer was identified"
        );
        match self.role {
            Role::Acceptor => {
                wire::encode_ready(out, our_received, our_unreliable);
                self.step = Step::Done;
            }
            Role::Dialler { .. } => {
                wire::encode_hello_reply(
                    out,
                    &self.local.wire(),
                    our_received,
                    our_connections,
                    our_unreliable,
                );
                self.step = Step::AwaitReady;
            }
        }
    }

    /// Refuses the peer: appends a Close frame with the reason.
    pub fn refuse(&mut self, code: CloseCode, reason: &str, out: &mut Vec<u8>) {
        wire::encode_close(out, code, reason);
        self.step = Step::Failed;
    }
}

/// What is known, on one member, about two connections that both speak for one peer: the
/// one it already has (`old`) and one that just identified (`new`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TieBreak {
    /// `old` belongs to an earlier incarnation of the peer (its launch id differs).
    pub stale: bool,
    /// We dialled `new`.
    pub new_by_us: bool,
    /// We dialled `old`.
    pub old_by_us: bool,
    /// `old` has completed its handshake here.
    pub old_established: bool,
    /// Our member name sorts before the peer's.
    pub we_are_smaller: bool,
    /// Connections we have established with the peer's incarnation.
    pub our_connections: u64,
    /// When the peer dialled `new`: connections it says it has established with ours.
    pub peer_connections: Option<u64>,
}

/// Whether `new` replaces `old` (else `new` is refused). Both members reach the same answer
/// for the same pair of connections:
///
/// - a new incarnation always replaces the old one's connection;
/// - a second dial from the same side replaces the first (its dialler dropped it);
/// - the peer dials while we hold an established connection that we dialled: if the peer
///   has established at least as many connections with us as we have with it, it has seen
///   `old` and dials again, so `old` is dead on its side (half-open): replace. If it has
///   established fewer, its dial predates `old`, which it adopted meanwhile (dropping `new`):
///   keep `old`;
/// - otherwise (two dials in flight at once) keep the one dialled by the smaller name.
pub fn keep_new(t: TieBreak) -> bool {
    if t.stale || t.new_by_us == t.old_by_us {
        return true;
    }
    if !t.new_by_us && t.old_established {
        return matches!(t.peer_connections, Some(theirs) if theirs >= t.our_connections);
    }
    t.new_by_us == t.we_are_smaller
}

fn frame_name(f: &Frame<'_>) -> &'static str {
    match f {
        Frame::Hello(_) => "Hello",
        Frame::HelloReply(..) => "HelloReply",
        Frame::Ready { .. } => "Ready",
        Frame::Data { .. } => "Data",
        Frame::Ack { .. } => "Ack",
        Frame::Probe => "Probe",
        Frame::Heartbeat => "Heartbeat",
        Frame::Close { .. } => "Close",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tb() -> TieBreak {
        TieBreak {
            stale: false,
            new_by_us: false,
            old_by_us: true,
            old_established: true,
            we_are_smaller: true,
            our_connections: 3,
            peer_connections: Some(3),
        }
    }

    #[test]
    fn tie_break_cases() {
        assert!(
            keep_new(TieBreak {
                stale: true,
                ..tb()
            }),
            "new incarnation wins"
        );
        assert!(
            keep_new(TieBreak {
                old_by_us: false,
                ..tb()
            }),
            "same dialler: newer wins"
        );
        assert!(
            keep_new(tb()),
            "half-open: the peer saw old and dials again"
        );
        assert!(
            !keep_new(TieBreak {
                peer_connections: Some(2),
                ..tb()
            }),
            "its dial predates old"
        );
        // Both in flight: the smaller name's dial wins, on both sides.
        let inflight = TieBreak {
            old_established: false,
            ..tb()
        };
        assert!(!keep_new(inflight), "we are smaller and old is ours");
        assert!(keep_new(TieBreak {
            we_are_smaller: false,
            ..inflight
        }));
        let mirror = TieBreak {
            new_by_us: true,
            old_by_us: false,
            old_established: false,
            peer_connections: None,
            ..tb()
        };
        assert!(keep_new(mirror), "the smaller's own dial wins on its side");
    }

    fn local(name: &str, cluster: &str) -> LocalIdentity {
        LocalIdentity {
            launch_id: name.len() as u64 + 100,
            window: 1 << 16,
            max_message: 1 << 15,
            cluster: cluster.into(),
            name: name.into(),
        }
    }

    /// Feeds every complete frame in `buf` to `hs`, returning the events.
    fn feed(hs: &mut Handshake, buf: &mut Vec<u8>) -> Vec<Result<HsEvent, HsError>> {
        let mut evs = Vec::new();
        let mut at = 0;
        while let Some((f, n)) = wire::decode(&buf[at..], 4096).unwrap() {
            evs.push(hs.on_frame(&f));
            at += n;
        }
        buf.drain(..at);
        evs
    }

    #[test]
    fn three_steps_in_memory() {
        let mut a_out = Vec::new();
        let mut d_out = Vec::new();
        let mut a = Handshake::acceptor(local("beta", "c"), &mut a_out);
        let mut d = Handshake::dialler(local("alpha", "c"), "beta".into());
        let ev = feed(&mut d, &mut a_out);
        assert!(matches!(
            &ev[..],
            [Ok(HsEvent::Identified {
                peer_received: None,
                ..
            })]
        ));
        d.accept(4, 0, 0, &mut d_out);
        let ev = feed(&mut a, &mut d_out);
        match &ev[..] {
            [Ok(HsEvent::Identified {
                peer,
                peer_received: Some(4),
                peer_connections: Some(0),
                peer_unreliable: Some(0),
            })] => assert_eq!(peer.name, "alpha"),
            other => panic!("{other:?}"),
        }
        a.accept(9, 0, 0, &mut a_out);
        assert!(a.is_done());
        let ev = feed(&mut d, &mut a_out);
        assert_eq!(
            ev,
            vec![Ok(HsEvent::Established {
                peer_received: 9,
                peer_unreliable: 0
            })]
        );
        assert!(d.is_done());
    }

    #[test]
    fn wrong_cluster_and_wrong_name_are_refused() {
        let mut a_out = Vec::new();
        let _a = Handshake::acceptor(local("beta", "other"), &mut a_out);
        let mut d = Handshake::dialler(local("alpha", "c"), "beta".into());
        let ev = feed(&mut d, &mut a_out);
        assert!(matches!(
            &ev[..],
            [Err(HsError {
                code: CloseCode::Cluster,
                by_peer: false,
                ..
            })]
        ));

        let mut a_out = Vec::new();
        let _a = Handshake::acceptor(local("gamma", "c"), &mut a_out);
        let mut d = Handshake::dialler(local("alpha", "c"), "beta".into());
        let ev = feed(&mut d, &mut a_out);
        assert!(matches!(
            &ev[..],
            [Err(HsError {
                code: CloseCode::NameMismatch,
                ..
            })]
        ));
    }

    #[test]
    fn data_before_handshake_is_a_protocol_error() {
        let mut a_out = Vec::new();
        let mut a = Handshake::acceptor(local("beta", "c"), &mut a_out);
        let mut b = Vec::new();
        wire::encode_data(&mut b, 0, None, b"x");
        let ev = feed(&mut a, &mut b);
        assert!(matches!(
            &ev[..],
            [Err(HsError {
                code: CloseCode::Protocol,
                ..
            })]
        ));
    }

    #[test]
    fn peer_close_is_reported_as_by_peer() {
        let mut d = Handshake::dialler(local("alpha", "c"), "beta".into());
        let mut b = Vec::new();
        wire::encode_close(&mut b, CloseCode::UnknownMember, "who are you");
        let ev = feed(&mut d, &mut b);
        assert!(matches!(
            &ev[..],
            [Err(HsError {
                code: CloseCode::UnknownMember,
                by_peer: true,
                ..
            })]
        ));
    }
}
