//! Members' real [`Endpoint`](super::Endpoint)s, driven over links in memory with simulated
//! time: the code that ships, with no sockets, no threads and no sleeps (quinn-proto's
//! `Pair::drive()` is the model). It drives each endpoint through the same boundary as the
//! IO thread — inputs through `Endpoint::handle`, outputs drained from `Endpoint::poll` in
//! the endpoint's order ([`harness::Sim::drain`]) — and plays only what the IO thread does
//! with sockets: it moves bytes between the links' buffers and byte pipes, opens the
//! connections the endpoints ask for, runs the pool's tasks inline and hands the time over
//! (`Input::Timeout`); and the faults: where a link breaks, which bytes survive, when each
//! side reads, writes and dials, frames replayed from earlier, processes dying.
//!
//! ## Members
//!
//! Any number of members ([`member::Spec`]): each has a name and a launch id — two members
//! may claim the same name with different launch ids (two processes for one name, or a
//! [`harness::Sim::restart`] starts a new process at an old one's address while the
//! simulation runs) — and the peers it
//! knows, by name, with or without the address of a member to dial. A link connects two
//! members; [`harness::Sim::kill`] ends a process (its connections close, it does nothing
//! more).
//!
//! ## The knobs ([`harness::Step`])
//!
//! - **drop**: `Step::Cut` breaks a link; of the bytes in flight each way only a prefix
//!   chosen at any byte offset arrives (mid-frame included), and writes to a cut link are
//!   lost. `Step::Write` / `Step::Read` move arbitrary byte counts, so frames are split
//!   everywhere; each side notices a break when it reads EOF after what survived.
//! - **duplicate**: `Step::Replay` has the link deliver again, at a frame boundary, data
//!   frames the receiver already holds and an ack the peer wrote earlier.
//! - **reorder across connections**: a side reads its half-open old link's surviving bytes
//!   whenever the schedule says, interleaved with a new link's handshake.
//! - **dials**: an endpoint asks for a connection (`Event::Dial`) when a peer is added and
//!   when its reconnect timer fires; `Step::Dial` is the moment the connection is made,
//!   so both sides may dial at once (when both know the other's address) and the tie-break
//!   decides.
//! - **time**: `Step::Advance` moves the simulated clock: delayed acks, reconnects with
//!   backoff, heartbeats, handshake and idle timeouts, the housekeeping tick.
//! - **deaths**: `Step::Kill` ends a process at any point, handshakes included.
//! - **journal failures**: `Step::JournalFail` fails a journalling member's writer (what it
//!   appended stays, the batches handed to it since are lost); the endpoint stops the node
//!   and, once its shutdown is done, the process has ended.
//! - **forgetting**: a member admitted as it dialled in and away for `forget_after` is
//!   forgotten (`Output::Forget`): its record stays in the simulation, marked, and a new
//!   process of that name dialling in is admitted afresh as another peer.
//! - **authentication**: all members have the same secret, or none.
//!
//! ## What is checked ([`oracle`])
//!
//! Per (sender process, receiver process) pair, after every step: `sent >= acked`,
//! `received >= acks_sent`, all four counters monotonic for each incarnation the receiver
//! knows, a sender never retires what its peer lacks (`acked <= peer.received <= sent`), at
//! most one established link per member and peer and it is the one that speaks for the
//! peer, every delivery is the sender process's next message, byte for byte, and none is
//! delivered twice under one name (by two processes) or reported undelivered by its sender
//! while bound to the process that delivered it; every `Refused` fact closes its handshake,
//! and a name's connected incarnation never goes back to one it left. After the schedule the
//! members run clean until quiet ([`harness::Sim::settle`]): every pair whose two processes
//! are bound to each other has everything delivered exactly once, in order (or, across
//! incarnations, reported undelivered), its unacked queue empty and its send window whole:
//! permits are conserved.

// Outside the tests only the fuzz target's entry uses the harness: the scenario helpers
// it also has are for the tests.
#![cfg_attr(not(test), allow(dead_code))]

#[cfg(test)]
mod admitted;
pub(crate) mod fuzz;
mod harness;
mod member;
mod network;
mod oracle;
#[cfg(test)]
mod pair;
#[cfg(test)]
mod seeds;
#[cfg(test)]
mod three;
#[cfg(test)]
mod twins;
