//! Sans-IO protocol state machines: the handshake and the recovery descriptor. Driven by
//! calls (`on_frame`, `on_ack`, `on_data`, `resume`) and appending their output to a byte
//! buffer; no sockets, no clock, no threads, so they are tested in memory.

pub mod handshake;
pub mod recovery;
#[cfg(test)]
mod sim;

pub use handshake::{
    keep_new, Handshake, HsError, HsEvent, LocalIdentity, PeerIdentity, Role, Secret, TieBreak,
};
pub use recovery::{Descriptor, Receive, RecoveryError, Retired, Unacked};
