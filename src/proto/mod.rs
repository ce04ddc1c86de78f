//! Sans-IO protocol: the handshake, the recovery descriptor, and above them a member's whole
//! protocol — its links ([`Link`]: one connection's buffers and handshake), its peers
//! (`Remote`: one member's state across connections) and the [`Endpoint`] that routes between
//! them, with admission, timers and the journal's group commit. Driven by calls that carry
//! the time and answered through byte buffers and polled events; no sockets, no clock, no
//! threads, so the IO thread drives it with sockets and the simulation in memory.

pub(crate) mod admission;
pub(crate) mod endpoint;
pub mod handshake;
pub(crate) mod link;
pub mod recovery;
pub(crate) mod remote;
pub(crate) mod write_queue;
// The simulation: the tests' harness, and (for the fuzz target `endpoints`) the schedules
// read out of bytes; not under loom, whose primitives live only inside a model.
#[cfg(any(test, all(cohort_internals, not(loom))))]
pub(crate) mod sim;
pub(crate) mod timer;

pub(crate) use admission::Verdict;
pub(crate) use endpoint::{
    Config, Endpoint, Input, MembersView, MembershipSetup, NewPeer, NodeCounters, Output,
    StoppedJournal, Target,
};
pub use handshake::{
    resolve, Handshake, HandshakeError, HsEvent, LocalIdentity, PeerIdentity, Resolution, Role,
    Secret, TieBreak,
};
pub(crate) use link::LinkId;
pub use recovery::{Descriptor, Receive, RecoveryError, Retired, Unacked};

/// Bytes read per `read` call at most; a link's read buffer grows to hold one maximal frame.
pub(crate) const READ_CHUNK: usize = 64 * 1024;
