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

/// Member names are short and come from configuration or authenticated handshakes, so a
/// fast non-keyed hash fits the send path's look-up by name ([`NameHasher`]).
pub(crate) type NameHash = std::hash::BuildHasherDefault<NameHasher>;

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

/// The hasher of [`NameHash`]: eight bytes at a time (the last one to seven as one word
/// too, read as two overlapping halves), each word folded in with a multiply whose 128-bit product has its halves
/// xored, so that every input bit reaches both the low bits the map indexes with and the
/// high bits it tags with. About a third of a byte-at-a-time FNV-1a's instructions on a
/// short name.
#[derive(Debug)]
pub(crate) struct NameHasher(u64);

impl Default for NameHasher {
    fn default() -> NameHasher {
        NameHasher(0x243f_6a88_85a3_08d3)
    }
}

impl NameHasher {
    #[inline]
    fn mix(&mut self, word: u64) {
        let p = u128::from(self.0 ^ word) * 0x9e37_79b9_7f4a_7c15;
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }
}

impl std::hash::Hasher for NameHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            self.mix(u64::from_le_bytes(b));
        }
        let rest = words.remainder();
        let n = rest.len();
        let word = match (rest.first_chunk::<4>(), rest.last_chunk::<4>()) {
            // Four to seven bytes: two reads of four, overlapping.
            (Some(a), Some(b)) => {
                u64::from(u32::from_le_bytes(*a)) | u64::from(u32::from_le_bytes(*b)) << 32
            }
            _ if n > 0 => {
                u64::from(rest[0]) | u64::from(rest[n / 2]) << 8 | u64::from(rest[n - 1]) << 16
            }
            _ => return,
        };
        // The length too: the reads above overlap differently for each.
        self.mix(word ^ (n as u64) << 59);
    }
    #[inline]
    fn write_u8(&mut self, b: u8) {
        // `str`'s terminator (0xff): one mix, not a one-byte `write`.
        self.mix(u64::from(b) | 1 << 63);
    }
}
