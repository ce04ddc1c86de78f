//! Small helpers shared by several parts.

/// An error and its chain of sources, `: `-separated, for a log line (each error's
/// `Display` says only its own level).
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

/// A random, nonzero `u64` for launch ids: std's randomly keyed hasher over the time and the
/// process id. Not for secrets.
pub(crate) fn random_nonzero_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        h.write_u128(now);
        h.write_u32(std::process::id());
        let id = h.finish();
        if id != 0 {
            return id;
        }
    }
}

/// FNV-1a: member names are short and come from configuration or authenticated handshakes,
/// so a fast non-keyed hash fits the send path's lookup.
pub(crate) type NameHash = std::hash::BuildHasherDefault<Fnv>;

/// Hashes integer keys (tokens, peer ids) to themselves: they are unique and come from
/// counters of ours, so there is nothing to scramble.
pub(crate) type IdHash = std::hash::BuildHasherDefault<IdHasher>;

/// The identity hasher of [`IdHash`].
#[derive(Debug, Default)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Not used by usize keys; fold anything else in so the hasher stays correct.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = n as u64;
    }
}

/// FNV-1a 64-bit hasher.
#[derive(Debug)]
pub(crate) struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}
