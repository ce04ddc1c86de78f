//! Small helpers shared by several parts.

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
