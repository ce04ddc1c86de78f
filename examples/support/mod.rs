//! What the measuring examples (`msg_cost`, `ping_pong`) share.

use std::time::Duration;

/// The process's CPU time so far (user + system, every thread), from `/proc/self/stat`
/// (Linux; `None` elsewhere or if it cannot be read). Its resolution is the kernel's clock
/// tick (10 ms at the usual 100 Hz): good over a run of a second or more.
pub(crate) fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces: the fields after it start past its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime, fields 14 and 15 of the line, in USER_HZ (100 on Linux).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}
