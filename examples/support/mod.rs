//! What the measuring examples (`msg_cost`, `ping_pong`) and the benches (`benches/common`,
//! which includes this file) share. Each uses a subset of it.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use cohort::{Builder, FsyncPolicy};

/// The process's CPU time so far (user + system, every thread), from `/proc/self/stat`
/// (Linux; `None` elsewhere or if it cannot be read). Its resolution is the kernel's clock
/// tick (10 ms at the usual 100 Hz): good over a sample or a run of a second or more.
pub(crate) fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces: the fields after it start past its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the whole line, 11 and 12 after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // The USER_HZ the kernel reports these in is 100 on every Linux configuration Rust
    // targets (sysconf(_SC_CLK_TCK)).
    Some(Duration::from_millis((utime + stime) * 10))
}

/// The payload of message `k` as an application makes one: allocated and written by the
/// sending thread, `template` with `k` after its first byte (which names the source).
pub(crate) fn fresh_payload(template: &[u8], k: u64) -> Vec<u8> {
    let mut v = template.to_vec();
    let n = v.len().saturating_sub(1).min(8);
    v[1..1 + n].copy_from_slice(&k.to_le_bytes()[..n]);
    v
}

/// The journal directory of member `name` in a run of the example `example`: under the
/// system's temp directory, named after the process.
pub(crate) fn journal_dir(example: &str, name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("cohort-{example}-{name}-{}", std::process::id()))
}

/// `b` journalling under `policy` in a fresh [`journal_dir`], if asked.
pub(crate) fn journalled(
    b: Builder,
    example: &str,
    name: &str,
    policy: Option<FsyncPolicy>,
) -> Builder {
    let Some(policy) = policy else { return b };
    let dir = journal_dir(example, name);
    let _ = std::fs::remove_dir_all(&dir);
    b.journal(dir).journal_fsync(policy)
}
