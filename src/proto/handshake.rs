//! The handshake state machine, sans-IO.
//!
//! ```text
//!  acceptor                                  dialler
//!  ── Hello{identity, N_a} ─────────────────►  check version, auth, cluster, name
//!  ◄──── HelloReply{identity, received, connections, N_d, MAC_d}
//!  check version, auth, MAC_d, cluster; the
//!  caller decides (known member? tie-break?)
//!  ── Ready{received, MAC_a} ───────────────►  check MAC_a: established
//!  established
//! ```
//!
//! Both sides then drop from their unacked queue what the other has and resend the rest,
//! before any new message. The machine only validates and sequences; decisions that need
//! the node's state (is this member known, which of two connections wins) are the caller's,
//! taken between [`HsEvent::Identified`] and [`Handshake::accept`] (or a refusal: a `Close`
//! frame).
//!
//! ## Authentication
//!
//! With a [`Secret`] in the [`LocalIdentity`], each side sends a fresh nonce (the caller's
//! randomness: `acceptor` / `dialler` take it, so the machine stays deterministic) and
//! proves it knows the secret with an HMAC-SHA-256 over the handshake transcript — every
//! handshake frame sent and received so far, byte for byte, so no field can be altered:
//!
//! ```text
//!  MAC_d = HMAC(secret, "cohort dialler"  || Hello || HelloReply without MAC_d)
//!  MAC_a = HMAC(secret, "cohort acceptor" || Hello || HelloReply || Ready without MAC_a)
//! ```
//!
//! `MAC_d` covers the acceptor's fresh nonce and `MAC_a` the dialler's, so a recorded
//! handshake replayed to either side fails. MACs are compared in constant time. The
//! acceptor verifies `MAC_d` *before* it reports [`HsEvent::Identified`], so its caller
//! acts only on an authenticated dialler. The dialler's `Identified` (from `Hello`) is **not**
//! authenticated yet: its caller must only answer (`accept`) or refuse, and change no state
//! until [`HsEvent::Established`], which comes only after `MAC_a` verified. A side with a
//! secret refuses a peer without one, and the other way round, with [`CloseCode::Auth`].

use bytes::Bytes;
use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use crate::wire::{self, CloseCode, Frame, Identity, Mac, Nonce};

/// Domain label of the dialler's MAC.
const DIALLER_LABEL: &[u8] = b"cohort dialler";
/// Domain label of the acceptor's MAC.
const ACCEPTOR_LABEL: &[u8] = b"cohort acceptor";

/// The cluster's shared secret for handshake authentication. Cheap to clone (one copy of
/// the bytes, shared); its `Debug` never shows them. `==` compares configurations and is not
/// constant-time: peers are checked only through MACs, never by comparing secrets.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Bytes);

impl Secret {
    /// Copies the secret bytes.
    pub fn new(bytes: &[u8]) -> Secret {
        Secret(Bytes::copy_from_slice(bytes))
    }

    /// Its bytes (membership packets are MACed with them too).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether it is empty (the node builder refuses an empty secret).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// HMAC-SHA-256 of `label || parts...` under this secret.
    fn mac(&self, label: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
        // HMAC takes keys of any length (longer ones are hashed): this never fails.
        let mut m = <Hmac<Sha256> as hmac::digest::KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        m.update(label);
        for p in parts {
            m.update(p);
        }
        m
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(<{} bytes>)", self.0.len())
    }
}

/// One side's authentication state during a handshake.
#[derive(Debug)]
struct Auth {
    secret: Secret,
    /// Our fresh nonce.
    nonce: Nonce,
    /// The handshake frames so far, as on the wire.
    transcript: Vec<u8>,
}

/// Appends the MAC of `label || transcript || frame[..len - MAC_LEN]` to the last
/// [`wire::MAC_LEN`] bytes of `frame` (encoded with a placeholder there).
fn seal(auth: &Auth, label: &[u8], frame: &mut [u8]) {
    let body = frame.len() - wire::MAC_LEN;
    let tag = auth
        .secret
        .mac(label, &[&auth.transcript, &frame[..body]])
        .finalize()
        .into_bytes();
    frame[body..].copy_from_slice(&tag);
}

/// Verifies, in constant time, that `mac` is the MAC of `label || transcript || frame`
/// where `frame` is the received frame re-encoded without its MAC.
fn verify(auth: &Auth, label: &[u8], frame: &[u8], mac: &Mac) -> bool {
    let body = frame.len() - wire::MAC_LEN;
    auth.secret
        .mac(label, &[&auth.transcript, &frame[..body]])
        .verify_slice(mac)
        .is_ok()
}

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
    /// The cluster's shared secret: with one, every handshake is authenticated and peers
    /// without it are refused.
    pub secret: Option<Secret>,
}

impl LocalIdentity {
    fn wire(&self, nonce: Option<Nonce>) -> Identity<'_> {
        Identity {
            version: wire::VERSION,
            launch_id: self.launch_id,
            window: self.window,
            max_message: self.max_message,
            cluster: &self.cluster,
            name: &self.name,
            nonce,
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
    /// We dialled `expected`, or an address whoever answers there (a seed: `None`).
    Dialler {
        /// The member we meant to reach.
        expected: Option<String>,
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
    /// The peer said who it is and passed the version, authentication and cluster checks.
    /// The caller now calls [`Handshake::accept`] or refuses the link (a `Close` frame). For an
    /// acceptor, `peer_received` is how many of our messages the dialler holds, and the
    /// dialler is authenticated (with a secret). For a dialler the acceptor is not
    /// authenticated yet: change no state before [`HsEvent::Established`].
    Identified {
        /// Who it is.
        peer: PeerIdentity,
        /// Acceptor only: the dialler's received count.
        peer_received: Option<u64>,
        /// Acceptor only: how many connections the dialler has established with our
        /// incarnation (for [`resolve`]).
        peer_connections: Option<u64>,
        /// Acceptor only: window bytes of our unreliable messages the dialler has received.
        peer_unreliable: Option<u64>,
    },
    /// Dialler only: the acceptor's Ready arrived (and its MAC verified, with a secret); the
    /// connection is up.
    Established {
        /// How many of our messages the acceptor holds.
        peer_received: u64,
        /// Window bytes of our unreliable messages the acceptor has received.
        peer_unreliable: u64,
    },
}

/// Why a handshake failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandshakeError {
    /// The close code (sent to the peer when we are the one refusing).
    pub code: CloseCode,
    /// What went wrong, for the log.
    pub reason: String,
    /// Whether the peer closed on us (true) or we refuse it (false).
    pub by_peer: bool,
}

impl std::fmt::Display for HandshakeError {
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

impl std::error::Error for HandshakeError {}

fn refuse(code: CloseCode, reason: String) -> HandshakeError {
    HandshakeError {
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
    auth: Option<Auth>,
}

impl Handshake {
    /// Starts the acceptor side; appends Hello to `out`. `nonce` must be fresh random
    /// bytes when `local` has a secret (it is unused otherwise).
    pub fn acceptor(local: LocalIdentity, nonce: Nonce, out: &mut Vec<u8>) -> Handshake {
        let auth = Self::auth(&local, nonce);
        let start = out.len();
        wire::encode_hello(out, &local.wire(auth.as_ref().map(|a| a.nonce)));
        let mut hs = Handshake {
            role: Role::Acceptor,
            step: Step::AwaitPeer,
            local,
            peer: None,
            auth,
        };
        if let Some(a) = hs.auth.as_mut() {
            a.transcript.extend_from_slice(&out[start..]);
        }
        hs
    }

    /// Starts the dialler side; it waits for the acceptor's Hello. `nonce` as for
    /// [`acceptor`](Handshake::acceptor).
    pub fn dialler(local: LocalIdentity, expected: String, nonce: Nonce) -> Handshake {
        Self::dialling(local, Some(expected), nonce)
    }

    /// Starts the dialler side of a connection to an address, not to a member: whoever
    /// answers there (of our cluster, authenticated, not ourselves) is who the link speaks
    /// for. A seed is dialled so.
    pub fn dialler_any(local: LocalIdentity, nonce: Nonce) -> Handshake {
        Self::dialling(local, None, nonce)
    }

    fn dialling(local: LocalIdentity, expected: Option<String>, nonce: Nonce) -> Handshake {
        Handshake {
            auth: Self::auth(&local, nonce),
            role: Role::Dialler { expected },
            step: Step::AwaitPeer,
            local,
            peer: None,
        }
    }

    fn auth(local: &LocalIdentity, nonce: Nonce) -> Option<Auth> {
        local.secret.clone().map(|secret| Auth {
            secret,
            nonce,
            transcript: Vec::with_capacity(2 * (wire::LEN_BYTES + 2 + wire::MAX_HANDSHAKE_BODY)),
        })
    }

    /// Whether the handshake completed.
    #[cfg(any(test, cohort_internals))]
    pub fn is_done(&self) -> bool {
        self.step == Step::Done
    }

    /// Whether this handshake authenticates (a secret is configured).
    #[cfg(any(test, cohort_internals))]
    pub fn authenticates(&self) -> bool {
        self.auth.is_some()
    }

    /// Our role.
    #[cfg(any(test, cohort_internals))]
    pub fn role(&self) -> &Role {
        &self.role
    }

    /// The peer, once identified.
    pub fn peer(&self) -> Option<&PeerIdentity> {
        self.peer.as_ref()
    }

    /// The checks that come before authentication: the version, and whether both sides
    /// agree on authenticating at all.
    fn check_auth_mode(&self, id: &Identity<'_>) -> Result<(), HandshakeError> {
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
        match (&self.auth, id.nonce) {
            (Some(_), None) => Err(refuse(
                CloseCode::Auth,
                format!(
                    "'{}' sent no authentication (no secret configured there); a secret is required here",
                    id.name
                ),
            )),
            (None, Some(_)) => Err(refuse(
                CloseCode::Auth,
                format!(
                    "'{}' requires authentication, but no secret is configured here",
                    id.name
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Re-encodes a received frame, verifies its MAC against the transcript and appends it
    /// to the transcript. `mac` is the frame's MAC field.
    fn authenticate(
        &mut self,
        frame: &Frame<'_>,
        mac: Option<&Mac>,
        label: &[u8],
        who: &str,
    ) -> Result<(), HandshakeError> {
        let Some(auth) = self.auth.as_mut() else {
            return match mac {
                None => Ok(()),
                Some(_) => Err(refuse(
                    CloseCode::Auth,
                    format!("'{who}' sent a MAC, but no secret is configured here"),
                )),
            };
        };
        let Some(mac) = mac else {
            return Err(refuse(
                CloseCode::Auth,
                format!(
                    "'{who}' sent no MAC (no secret configured there?); a secret is required here"
                ),
            ));
        };
        let mut bytes = Vec::with_capacity(wire::LEN_BYTES + 2 + wire::MAX_HANDSHAKE_BODY);
        wire::encode_frame(&mut bytes, frame);
        if !verify(auth, label, &bytes, mac) {
            return Err(refuse(
                CloseCode::Auth,
                format!("authentication of '{who}' failed: wrong secret, or a replayed or altered handshake"),
            ));
        }
        auth.transcript.extend_from_slice(&bytes);
        Ok(())
    }

    fn check(&self, id: &Identity<'_>) -> Result<PeerIdentity, HandshakeError> {
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
        if let Role::Dialler {
            expected: Some(expected),
        } = &self.role
        {
            if id.name != *expected {
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
    pub fn on_frame(&mut self, frame: &Frame<'_>) -> Result<HsEvent, HandshakeError> {
        let r = self.on_frame_inner(frame);
        if r.is_err() {
            self.step = Step::Failed;
            self.auth = None;
        }
        r
    }

    fn on_frame_inner(&mut self, frame: &Frame<'_>) -> Result<HsEvent, HandshakeError> {
        if let Frame::Close { code, reason } = frame {
            return Err(HandshakeError {
                code: *code,
                reason: (*reason).to_owned(),
                by_peer: true,
            });
        }
        match (&self.role, self.step, frame) {
            (Role::Dialler { .. }, Step::AwaitPeer, Frame::Hello(id)) => {
                self.check_auth_mode(id)?;
                let peer = self.check(id)?;
                if let Some(a) = self.auth.as_mut() {
                    // Authenticated later, by the acceptor's MAC over the transcript.
                    wire::encode_frame(&mut a.transcript, frame);
                }
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
                Frame::HelloReply(id, received, connections, unreliable, mac),
            ) => {
                self.check_auth_mode(id)?;
                // Before any other check: nothing about an unauthenticated dialler is
                // looked at further, and the caller hears of it only once authenticated.
                self.authenticate(frame, mac.as_ref(), DIALLER_LABEL, id.name)?;
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
                    mac,
                },
            ) => {
                let who = self
                    .peer
                    .as_ref()
                    .map_or("?", |p| p.name.as_str())
                    .to_owned();
                self.authenticate(frame, mac.as_ref(), ACCEPTOR_LABEL, &who)?;
                self.auth = None; // done: drop the transcript
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
        let start = out.len();
        let placeholder = self.auth.as_ref().map(|_| [0u8; wire::MAC_LEN]);
        match self.role {
            Role::Acceptor => {
                wire::encode_ready(out, our_received, our_unreliable, placeholder.as_ref());
                if let Some(a) = self.auth.take() {
                    seal(&a, ACCEPTOR_LABEL, &mut out[start..]);
                }
                self.step = Step::Done;
            }
            Role::Dialler { .. } => {
                wire::encode_hello_reply(
                    out,
                    &self.local.wire(self.auth.as_ref().map(|a| a.nonce)),
                    our_received,
                    our_connections,
                    our_unreliable,
                    placeholder.as_ref(),
                );
                if let Some(a) = self.auth.as_mut() {
                    seal(a, DIALLER_LABEL, &mut out[start..]);
                    a.transcript.extend_from_slice(&out[start..]);
                }
                self.step = Step::AwaitReady;
            }
        }
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

/// What becomes of two connections that speak for one peer (see [`resolve`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// `new` replaces `old`, which is closed as superseded.
    ReplaceOld,
    /// `old` stays; `new` is closed as superseded.
    KeepOld,
    /// `old` is an established connection of another live process claiming the same
    /// member name: `new` is refused (`NameInUse`) and `old` stays.
    NameInUse,
}

/// Which of `old` and `new` is kept. Both members reach the same answer for the same pair
/// of connections:
///
/// - a new incarnation (another launch id) replaces the old one's connection while that is
///   still in its handshake; while it is established, the name belongs to the process at
///   its other end, which is alive as far as we can tell: the newcomer is a second process
///   claiming the name and is refused (a genuine restart finds the old connection closed,
///   on an EOF at once or after the idle timeout);
/// - a second dial from the same side replaces the first (its dialler dropped it);
/// - the peer dials while we hold an established connection that we dialled: if the peer
///   has established at least as many connections with us as we have with it, it has seen
///   `old` and dials again, so `old` is dead on its side (half-open): replace. If it has
///   established fewer, its dial predates `old`, which it adopted meanwhile (dropping `new`):
///   keep `old`;
/// - otherwise (two dials in flight at once) keep the one dialled by the smaller name.
pub fn resolve(t: TieBreak) -> Resolution {
    let replace = |yes: bool| {
        if yes {
            Resolution::ReplaceOld
        } else {
            Resolution::KeepOld
        }
    };
    if t.stale {
        return if t.old_established {
            Resolution::NameInUse
        } else {
            Resolution::ReplaceOld
        };
    }
    if t.new_by_us == t.old_by_us {
        return Resolution::ReplaceOld;
    }
    if !t.new_by_us && t.old_established {
        return replace(matches!(t.peer_connections, Some(theirs) if theirs >= t.our_connections));
    }
    replace(t.new_by_us == t.we_are_smaller)
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

    /// The tie-break keeps the new connection.
    fn replaces(t: TieBreak) -> bool {
        resolve(t) == Resolution::ReplaceOld
    }

    #[test]
    fn tie_break_cases() {
        assert_eq!(
            resolve(TieBreak {
                stale: true,
                old_established: false,
                ..tb()
            }),
            Resolution::ReplaceOld,
            "a new incarnation replaces a connection still in its handshake"
        );
        for (new_by_us, old_by_us) in [(false, true), (true, false), (false, false), (true, true)] {
            assert_eq!(
                resolve(TieBreak {
                    stale: true,
                    new_by_us,
                    old_by_us,
                    ..tb()
                }),
                Resolution::NameInUse,
                "another process while the name's connection is established"
            );
        }
        assert!(
            replaces(TieBreak {
                old_by_us: false,
                ..tb()
            }),
            "same dialler: newer wins"
        );
        assert!(
            replaces(tb()),
            "half-open: the peer saw old and dials again"
        );
        assert!(
            !replaces(TieBreak {
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
        assert!(!replaces(inflight), "we are smaller and old is ours");
        assert!(replaces(TieBreak {
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
        assert!(replaces(mirror), "the smaller's own dial wins on its side");
    }

    fn local(name: &str, cluster: &str) -> LocalIdentity {
        LocalIdentity {
            launch_id: name.len() as u64 + 100,
            window: 1 << 16,
            max_message: 1 << 15,
            cluster: cluster.into(),
            name: name.into(),
            secret: None,
        }
    }

    fn secured(name: &str, secret: &[u8]) -> LocalIdentity {
        LocalIdentity {
            secret: Some(Secret::new(secret)),
            ..local(name, "c")
        }
    }

    /// Feeds every complete frame in `buf` to `hs`, returning the events.
    fn feed(hs: &mut Handshake, buf: &mut Vec<u8>) -> Vec<Result<HsEvent, HandshakeError>> {
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
        let mut a = Handshake::acceptor(local("beta", "c"), [1; 32], &mut a_out);
        let mut d = Handshake::dialler(local("alpha", "c"), "beta".into(), [2; 32]);
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
        let _a = Handshake::acceptor(local("beta", "other"), [1; 32], &mut a_out);
        let mut d = Handshake::dialler(local("alpha", "c"), "beta".into(), [2; 32]);
        let ev = feed(&mut d, &mut a_out);
        assert!(matches!(
            &ev[..],
            [Err(HandshakeError {
                code: CloseCode::Cluster,
                by_peer: false,
                ..
            })]
        ));

        let mut a_out = Vec::new();
        let _a = Handshake::acceptor(local("gamma", "c"), [1; 32], &mut a_out);
        let mut d = Handshake::dialler(local("alpha", "c"), "beta".into(), [2; 32]);
        let ev = feed(&mut d, &mut a_out);
        assert!(matches!(
            &ev[..],
            [Err(HandshakeError {
                code: CloseCode::NameMismatch,
                ..
            })]
        ));
    }

    #[test]
    fn data_before_handshake_is_a_protocol_error() {
        let mut a_out = Vec::new();
        let mut a = Handshake::acceptor(local("beta", "c"), [1; 32], &mut a_out);
        let mut b = Vec::new();
        wire::encode_data(&mut b, 0, None, b"x");
        let ev = feed(&mut a, &mut b);
        assert!(matches!(
            &ev[..],
            [Err(HandshakeError {
                code: CloseCode::Protocol,
                ..
            })]
        ));
    }

    #[test]
    fn peer_close_is_reported_as_by_peer() {
        let mut d = Handshake::dialler(local("alpha", "c"), "beta".into(), [2; 32]);
        let mut b = Vec::new();
        wire::encode_close(&mut b, CloseCode::UnknownMember, "who are you");
        let ev = feed(&mut d, &mut b);
        assert!(matches!(
            &ev[..],
            [Err(HandshakeError {
                code: CloseCode::UnknownMember,
                by_peer: true,
                ..
            })]
        ));
    }

    /// Runs a handshake between an acceptor and a dialler; returns the error each side
    /// hit, if any (`None` for both: established on both sides).
    fn run(a: LocalIdentity, d: LocalIdentity) -> (Option<HandshakeError>, Option<HandshakeError>) {
        let mut a_out = Vec::new();
        let mut d_out = Vec::new();
        let mut a = Handshake::acceptor(a, [0xaa; 32], &mut a_out);
        let mut d = Handshake::dialler(d, "beta".into(), [0xdd; 32]);
        match feed(&mut d, &mut a_out).pop() {
            Some(Ok(HsEvent::Identified { .. })) => d.accept(0, 0, 0, &mut d_out),
            Some(Err(e)) => return (None, Some(e)),
            other => panic!("{other:?}"),
        }
        match feed(&mut a, &mut d_out).pop() {
            Some(Ok(HsEvent::Identified { .. })) => a.accept(0, 0, 0, &mut a_out),
            Some(Err(e)) => return (Some(e), None),
            other => panic!("{other:?}"),
        }
        assert!(a.is_done());
        match feed(&mut d, &mut a_out).pop() {
            Some(Ok(HsEvent::Established { .. })) => (None, None),
            Some(Err(e)) => (None, Some(e)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_same_secret_authenticates_both_sides() {
        assert_eq!(
            run(secured("beta", b"s3"), secured("alpha", b"s3")),
            (None, None)
        );
    }

    #[test]
    fn a_wrong_or_missing_secret_is_refused() {
        let (a, d) = run(secured("beta", b"one"), secured("alpha", b"two"));
        let a = a.expect("the acceptor refuses the dialler's MAC");
        assert_eq!((a.code, a.by_peer, d), (CloseCode::Auth, false, None));
        assert!(a.reason.contains("wrong secret"), "{}", a.reason);

        // Acceptor with a secret, dialler without: the dialler sees Hello's nonce.
        let (_, d) = run(secured("beta", b"one"), local("alpha", "c"));
        let d = d.expect("refused");
        assert_eq!(d.code, CloseCode::Auth);
        assert!(
            d.reason.contains("no secret is configured here"),
            "{}",
            d.reason
        );

        // Dialler with a secret, acceptor without.
        let (_, d) = run(local("beta", "c"), secured("alpha", b"one"));
        let d = d.expect("refused");
        assert_eq!(d.code, CloseCode::Auth);
        assert!(d.reason.contains("sent no authentication"), "{}", d.reason);
    }

    /// The acceptor decides with a fresh nonce each time: a HelloReply recorded from an
    /// earlier, genuine handshake fails on a new connection, and so does a Ready replayed
    /// to a dialler.
    #[test]
    fn a_recorded_handshake_does_not_replay() {
        let mut a_out = Vec::new();
        let mut a = Handshake::acceptor(secured("beta", b"k"), [1; 32], &mut a_out);
        let mut d = Handshake::dialler(secured("alpha", b"k"), "beta".into(), [2; 32]);
        let _ = feed(&mut d, &mut a_out);
        let mut reply = Vec::new();
        d.accept(0, 0, 0, &mut reply);
        let recorded_reply = reply.clone();
        let _ = feed(&mut a, &mut reply);
        a.accept(0, 0, 0, &mut a_out);
        let recorded_ready = a_out.clone();

        // Replayed to a new acceptor (new nonce).
        let mut hello = Vec::new();
        let mut a2 = Handshake::acceptor(secured("beta", b"k"), [3; 32], &mut hello);
        let ev = feed(&mut a2, &mut recorded_reply.clone());
        assert!(
            matches!(
                &ev[..],
                [Err(HandshakeError {
                    code: CloseCode::Auth,
                    by_peer: false,
                    ..
                })]
            ),
            "{ev:?}"
        );
        // Ready replayed to a new dialler of the same Hello (new nonce).
        let mut d2 = Handshake::dialler(secured("alpha", b"k"), "beta".into(), [4; 32]);
        let mut hello = Vec::new();
        let _a3 = Handshake::acceptor(secured("beta", b"k"), [1; 32], &mut hello);
        let _ = feed(&mut d2, &mut hello);
        let mut r2 = Vec::new();
        d2.accept(0, 0, 0, &mut r2);
        let ev = feed(&mut d2, &mut recorded_ready.clone());
        assert!(
            matches!(
                &ev[..],
                [Err(HandshakeError {
                    code: CloseCode::Auth,
                    ..
                })]
            ),
            "{ev:?}"
        );
    }

    /// Every byte of the dialler's HelloReply is covered: flipping any one of them is
    /// refused (as malformed by the decoder, or by the MAC).
    #[test]
    fn an_altered_reply_is_refused() {
        let mut a_out = Vec::new();
        let _ = Handshake::acceptor(secured("beta", b"k"), [1; 32], &mut a_out);
        let hello = a_out.clone();
        let mut d = Handshake::dialler(secured("alpha", b"k"), "beta".into(), [2; 32]);
        let _ = feed(&mut d, &mut a_out);
        let mut reply = Vec::new();
        d.accept(5, 1, 0, &mut reply);
        for i in wire::LEN_BYTES..reply.len() {
            let mut hello2 = Vec::new();
            let mut a = Handshake::acceptor(secured("beta", b"k"), [1; 32], &mut hello2);
            assert_eq!(hello2, hello);
            let mut bad = reply.clone();
            bad[i] ^= 0x01;
            // A flip the decoder refuses is refused too.
            if let Ok(Some((f, _))) = wire::decode(&bad, 4096) {
                let r = a.on_frame(&f);
                assert!(r.is_err(), "byte {i} altered yet accepted: {r:?}");
            }
        }
    }

    #[test]
    fn secret_debug_hides_the_bytes() {
        let s = format!("{:?}", Secret::new(b"hunter2"));
        assert!(!s.contains("hunter2") && s.contains("7 bytes"), "{s}");
    }

    /// The test vector in `docs/wire.md` ("An authenticated handshake"): same inputs, same
    /// bytes, so the document stays byte-exact.
    #[test]
    fn the_documented_test_vector() {
        let loc = |name: &str, launch_id: u64| LocalIdentity {
            launch_id,
            window: 4 << 20,
            max_message: 1 << 20,
            cluster: "demo".into(),
            name: name.into(),
            secret: Some(Secret::new(b"secret")),
        };
        let mut hello = Vec::new();
        let mut a = Handshake::acceptor(loc("beta", 0x0123_4567_89ab_cdef), [0xaa; 32], &mut hello);
        let mut d = Handshake::dialler(
            loc("alpha", 0x1111_1111_1111_1111),
            "beta".into(),
            [0xdd; 32],
        );
        assert_eq!(hello.len(), 75);
        let _ = feed(&mut d, &mut hello.clone());
        let mut reply = Vec::new();
        d.accept(0, 0, 0, &mut reply);
        assert_eq!(reply.len(), 132);
        let mac_d = "54877b922d980554e10d55251d149ea03c3481fd368eba1fb88e284cb857e372";
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        assert_eq!(hex(&reply[100..]), mac_d);
        let _ = feed(&mut a, &mut reply.clone());
        let mut ready = Vec::new();
        a.accept(0, 0, 0, &mut ready);
        let mac_a = "43c7c9bd03201443dd0436fabdc0b182c000d3ae2c7afc1486da69a711988f37";
        assert_eq!((ready.len(), hex(&ready[23..])), (55, mac_a.to_owned()));
        let ev = feed(&mut d, &mut ready);
        assert!(matches!(&ev[..], [Ok(HsEvent::Established { .. })]));
    }
}
