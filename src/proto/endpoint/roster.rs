//! The peers: each member's protocol state by id, and the ids by name, kept in step (a
//! name maps to the id of a peer held, and a peer's name to its id, unless a peer claiming
//! an existing name was refused before it got here).

use super::*;

/// The peers by id and by name.
#[derive(Default)]
pub(super) struct Roster {
    by_id: HashMap<usize, Remote, IdHash>,
    by_name: HashMap<SharedStr, usize, NameHash>,
}

impl Roster {
    /// Peer `id`.
    pub(super) fn get(&self, id: &usize) -> Option<&Remote> {
        self.by_id.get(id)
    }

    /// Peer `id`, to change.
    pub(super) fn get_mut(&mut self, id: &usize) -> Option<&mut Remote> {
        self.by_id.get_mut(id)
    }

    /// Every peer.
    pub(super) fn values(&self) -> impl Iterator<Item = &Remote> {
        self.by_id.values()
    }

    /// Every peer's id (a copy: the peers may change while the caller goes through them).
    pub(super) fn ids(&self) -> Vec<usize> {
        self.by_id.keys().copied().collect()
    }

    /// The id of the peer named `name`.
    pub(super) fn id_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Peer `id`'s name (`?` for a peer not held).
    pub(super) fn name(&self, id: usize) -> SharedStr {
        self.by_id
            .get(&id)
            .map(|p| p.name().clone())
            .unwrap_or_else(|| "?".into())
    }

    /// Holds `peer` as `id`, under its name.
    pub(super) fn insert(&mut self, id: usize, peer: Remote) {
        self.by_name.insert(peer.name().clone(), id);
        self.by_id.insert(id, peer);
    }

    /// Drops peer `id`, and its name if the name is still its own.
    pub(super) fn remove(&mut self, id: usize) {
        let Some(p) = self.by_id.remove(&id) else {
            return;
        };
        if self.by_name.get(p.name()) == Some(&id) {
            self.by_name.remove(p.name());
        }
    }
}
