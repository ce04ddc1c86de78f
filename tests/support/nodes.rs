//! Fixtures: nodes started and connected the way most tests need them — a connected pair or
//! mesh, the journalling sender `a` and the receiver `b` of the two-member tests — and their
//! stats read the way the tests read them.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Barrier;
use std::time::Duration;

use cohort::{Builder, Node, PeerState, PeerStats, Sender};

use super::messages::payload;
use super::wait::{wait_until_or, PATIENCE, SHUTDOWN};

/// Test settings of a [`Builder`].
pub(crate) trait BuilderExt {
    /// Redials a peer that is down after 5 ms, backing off to at most 50 ms, so that a test
    /// that takes a peer down and brings it back does not wait out the default backoff.
    fn redial_quickly(self) -> Self;
}

impl BuilderExt for Builder {
    fn redial_quickly(self) -> Self {
        self.reconnect_backoff(Duration::from_millis(5), Duration::from_millis(50))
    }
}

/// Makes each of `nodes` a peer of every other (`add_peer`), so that they dial each other
/// at about the same time.
pub(crate) fn introduce(nodes: &[Node]) {
    for a in nodes {
        for b in nodes {
            if a.name() != b.name() {
                a.add_peer(b.name(), b.local_addr()).expect("add_peer");
            }
        }
    }
}

/// Makes each of `nodes` a peer of every other, all at the same moment: each node adds its
/// peers from a thread of its own, the threads released together by a barrier, so that the
/// members dial each other at once (and the tie-break decides which connection stays).
pub(crate) fn introduce_at_once(nodes: &[Node]) {
    let barrier = Barrier::new(nodes.len());
    std::thread::scope(|s| {
        for node in nodes {
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                for other in nodes.iter().filter(|o| o.name() != node.name()) {
                    node.add_peer(other.name(), other.local_addr())
                        .expect("add_peer");
                }
            });
        }
    });
}

/// A connected mesh (with two builders, a connected pair): starts every builder, makes
/// each node a peer of every other, and waits until every node has every other
/// `Connected` over exactly one connection.
pub(crate) fn connected<const N: usize>(builders: [Builder; N]) -> [Node; N] {
    let nodes = builders.map(|b| b.start().expect("node starts"));
    introduce(&nodes);
    wait_mesh_connected(&nodes);
    nodes
}

/// Whether `node` sees `peer` as `Connected`.
pub(crate) fn is_connected(node: &Node, peer: &str) -> bool {
    node.stats()
        .peer(peer)
        .is_some_and(|p| p.state == PeerState::Connected)
}

/// Waits until every node has every other as `Connected`, over exactly one established
/// connection each.
pub(crate) fn wait_mesh_connected(nodes: &[Node]) {
    let n = nodes.len() as u64;
    wait_until_or(
        PATIENCE,
        || {
            nodes.iter().all(|a| {
                let s = a.stats();
                s.peers.len() as u64 == n - 1
                    && s.peers.iter().all(|p| p.state == PeerState::Connected)
                    && s.connections.established == n - 1
                    && s.connections.open == n - 1
            })
        },
        || format!("a connected mesh; stats:\n{}", all_stats(nodes)),
    );
}

/// The receiving member `b` of a two-member test: listens on `listen` and admits whoever
/// dials it; it dials no one, so every connection is one its sender dialled.
pub(crate) fn receiver_b(cluster: &str, listen: impl ToSocketAddrs) -> Builder {
    Node::builder("b")
        .cluster(cluster)
        .listen(listen)
        .allow_unknown_members(true)
}

/// The sending member `a` of a two-member test: its static peer `b` is at `b_addr`; it
/// journals in `journal` if given (for a scenario run both with and without a journal).
pub(crate) fn sender_a(cluster: &str, b_addr: SocketAddr, journal: Option<&Path>) -> Builder {
    let a = Node::builder("a").cluster(cluster).peer("b", b_addr);
    match journal {
        Some(dir) => a.journal(dir),
        None => a,
    }
}

/// The journalling member `a` of a two-member test: journals in `dir` and sends to its
/// static peer `b` at `b_addr`.
pub(crate) fn journalled_a(cluster: &str, dir: &Path, b_addr: SocketAddr) -> Builder {
    sender_a(cluster, b_addr, Some(dir))
}

/// Every node's stats table, for failure messages.
pub(crate) fn all_stats(nodes: &[Node]) -> String {
    nodes
        .iter()
        .map(|n| n.stats().to_string())
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// Shuts every node down, asserting each shutdown succeeds.
pub(crate) fn shutdown_all(nodes: &[Node]) {
    for n in nodes {
        n.shutdown(SHUTDOWN)
            .unwrap_or_else(|e| panic!("shutdown of {} failed: {e}", n.name()));
    }
}

/// Stats of `node`'s peer `peer`; panics if the node has no such peer.
pub(crate) fn peer_stats(node: &Node, peer: &str) -> PeerStats {
    let s = node.stats();
    s.peer(peer)
        .cloned()
        .unwrap_or_else(|| panic!("{} has no peer {peer}:\n{s}", node.name()))
}

/// Sends like `Sender::send`, but gives up (panicking with the reason) after [`PATIENCE`]
/// instead of blocking for ever, so that credit that never comes back fails the test
/// rather than hanging it.
pub(crate) fn send_patiently(sender: &Sender, to: &str, payload: Vec<u8>) {
    if let Err(e) = sender.send_timeout(to, payload, PATIENCE) {
        panic!("{} -> {to}: send failed: {e}", sender.name());
    }
}

/// Every node sends messages `0..count` ([`payload`]s of `size` bytes) to every other node,
/// each node from a thread of its own, message `i` to each of its peers in turn; returns
/// once everything is sent.
pub(crate) fn send_to_every_other(nodes: &[Node], count: u64, size: usize) {
    std::thread::scope(|s| {
        for node in nodes {
            s.spawn(move || {
                let sender = node.sender();
                let others: Vec<&str> = nodes
                    .iter()
                    .map(Node::name)
                    .filter(|n| *n != node.name())
                    .collect();
                for i in 0..count {
                    for to in &others {
                        send_patiently(&sender, to, payload(i, size));
                    }
                }
            });
        }
    });
}

/// `try_send`s messages `first, first + 1, …` ([`payload`]s of `size` bytes) to `to` until
/// its window is dry; returns how many were accepted.
pub(crate) fn fill_window(sender: &Sender, to: &str, first: u64, size: usize) -> u64 {
    let mut n = 0;
    while sender.try_send(to, payload(first + n, size)).is_ok() {
        n += 1;
    }
    n
}

/// Waits until `node`'s window to `peer` is whole again (`available == window`): every
/// permit came back.
pub(crate) fn wait_window_whole(node: &Node, peer: &str) {
    wait_until_or(
        PATIENCE,
        || {
            let p = peer_stats(node, peer);
            p.available == p.window
        },
        || {
            format!(
                "{}'s window to {peer} whole again:\n{}",
                node.name(),
                node.stats()
            )
        },
    );
}

/// Waits until every window of every node is whole again: the credit of everything sent
/// came back.
pub(crate) fn wait_windows_whole(nodes: &[Node]) {
    wait_until_or(
        PATIENCE,
        || {
            nodes
                .iter()
                .all(|n| n.stats().peers.iter().all(|p| p.available == p.window))
        },
        || format!("every window whole again; stats:\n{}", all_stats(nodes)),
    );
}
