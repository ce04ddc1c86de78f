//! Helpers shared by the benches: criterion settings, test-mode detection, counters that a
//! bench thread can wait on with a deadline (one shared, one per source), the raw-TCP baseline's framing, and a
//! per-sample log that turns criterion's samples into one "cohort vs raw TCP" summary line.
//!
//! Each bench file includes this module with `mod common;` and uses a subset of it.

#![allow(dead_code)]

use std::io::{self, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use criterion::Criterion;

// The CPU clock and the fresh payloads, shared with the measuring examples.
#[path = "../../examples/support/mod.rs"]
mod support;
#[allow(unused_imports)] // each bench uses a subset
pub(crate) use support::{fresh_payload, process_cpu};

/// Samples per benchmark: each sample is one `iter_custom` call of many iterations.
pub(crate) const SAMPLE_SIZE: usize = 10;

/// Buffer size of the raw-TCP baseline's `BufWriter` and `BufReader`.
pub(crate) const RAW_BUFFER: usize = 64 * 1024;

/// Largest frame the raw-TCP baseline accepts (a bound checked before reading a payload).
pub(crate) const RAW_MAX_FRAME: usize = 1 << 20;

/// The criterion settings every bench uses: few, long samples so a whole bench file runs in
/// a couple of minutes on a 2-core machine.
pub(crate) fn criterion() -> Criterion {
    Criterion::default()
        .sample_size(SAMPLE_SIZE)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

/// Whether criterion runs each benchmark once as a smoke test rather than measuring it.
///
/// This is criterion's own rule: `cargo bench` passes `--bench`, `cargo test --benches`
/// passes nothing, and `cargo bench -- --test` asks for test mode explicitly.
pub(crate) fn test_mode() -> bool {
    let mut bench = false;
    let mut test = false;
    for arg in std::env::args() {
        bench |= arg == "--bench";
        test |= arg == "--test";
    }
    test || !bench
}

/// Whether criterion runs in `--quick` mode (two samples per benchmark instead of
/// [`SAMPLE_SIZE`]).
pub(crate) fn quick_mode() -> bool {
    std::env::args().any(|a| a == "--quick")
}

/// A count of completed events (messages received, deliveries run) that a bench thread can
/// wait on. Producers pay one atomic add per call; they take the lock only when the count
/// reaches the target the waiter announced, so waiting does not slow counting down.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    count: AtomicU64,
    target: AtomicU64,
    lock: Mutex<()>,
    reached: Condvar,
}

impl Progress {
    /// Records `n` events.
    pub(crate) fn add(&self, n: u64) {
        let count = self.count.fetch_add(n, Ordering::SeqCst) + n;
        if count >= self.target.load(Ordering::SeqCst) {
            // Taking the lock orders this notify after a waiter's check of `count`.
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.reached.notify_all();
        }
    }

    /// Events counted so far.
    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Announces `n` more events and returns the count to wait for. Call it before causing
    /// the events, with none in flight.
    pub(crate) fn expect(&self, n: u64) -> u64 {
        self.target.fetch_add(n, Ordering::SeqCst) + n
    }

    /// Waits until the count reaches `target`; panics naming `what` if `timeout` passes
    /// first (a stalled transport must fail the bench, not hang it).
    pub(crate) fn wait_for(&self, target: u64, timeout: Duration, what: &str) {
        let deadline = Instant::now() + timeout;
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let count = self.count();
            if count >= target {
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                panic!("{what}: counted {count} of {target} events within {timeout:?}");
            }
            guard = self
                .reached
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Messages counted per source, for a handler that sees every source's messages on several
/// pool threads: each source's count in a cache line of its own, bumped with a plain load and
/// store instead of an atomic add on one shared line. That is as cheap as the raw baseline's
/// reader threads, which add to a [`Progress`] once per buffer they parse. One shared counter
/// added to per message by every delivering thread is a contended line the transport never
/// touches: it put 12–15 % of cohort's CPU samples in the bench's handler, and 4→1 64 B
/// measured 210–218 ns CPU per message with per-source counts against 249–264 with one
/// counter (docs/benchmarks.md, "Where the time goes").
///
/// Correct because a source's regular messages are delivered by one pool thread at a time
/// (cohort's one-deliverer-per-sender rule, whose hand-over orders one deliverer's writes
/// before the next one's reads): were two threads to count one source at once, counts would
/// be lost and [`PerSource::wait_for`] would fail the bench.
#[derive(Debug)]
pub(crate) struct PerSource {
    slots: Box<[SourceSlot]>,
    lock: Mutex<()>,
    reached: Condvar,
}

/// One source's count and the count its waiter wants, alone in their cache lines (128 bytes:
/// the adjacent-line prefetcher pairs 64-byte lines).
#[derive(Debug, Default)]
#[repr(align(128))]
struct SourceSlot {
    count: AtomicU64,
    target: AtomicU64,
}

impl PerSource {
    /// Counts for `sources` sources, numbered from 0.
    pub(crate) fn new(sources: usize) -> PerSource {
        PerSource {
            slots: (0..sources).map(|_| SourceSlot::default()).collect(),
            lock: Mutex::new(()),
            reached: Condvar::new(),
        }
    }

    /// Counts one message from `source`. Called by the thread delivering that source's
    /// messages, one thread at a time (see the type's docs).
    #[inline]
    pub(crate) fn record(&self, source: usize) {
        let slot = &self.slots[source];
        // Relaxed: this thread is the slot's only writer now, and saw the previous
        // deliverer's store through the transport's hand-over.
        let count = slot.count.load(Ordering::Relaxed) + 1;
        // Release: a waiter that reads it (Acquire) has every count before it.
        slot.count.store(count, Ordering::Release);
        // The target was set before the messages were sent.
        if count == slot.target.load(Ordering::Acquire) {
            // Taking the lock orders this notify after a waiter's check of the counts.
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.reached.notify_all();
        }
    }

    /// Announces `n` more messages from every source. Call it before sending them, with
    /// none in flight.
    pub(crate) fn expect_each(&self, n: u64) {
        for slot in self.slots.iter() {
            slot.target.fetch_add(n, Ordering::SeqCst);
        }
    }

    /// Messages counted so far, all sources together.
    pub(crate) fn total(&self) -> u64 {
        self.slots
            .iter()
            .map(|s| s.count.load(Ordering::Acquire))
            .sum()
    }

    /// Waits until every source's count reaches its target; panics naming `what` if
    /// `timeout` passes first.
    pub(crate) fn wait_for(&self, timeout: Duration, what: &str) {
        let deadline = Instant::now() + timeout;
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let behind = self
                .slots
                .iter()
                .find(|s| s.count.load(Ordering::Acquire) < s.target.load(Ordering::SeqCst));
            let Some(behind) = behind else {
                return;
            };
            let now = Instant::now();
            if now >= deadline {
                panic!(
                    "{what}: a source counted {} of {} messages within {timeout:?}",
                    behind.count.load(Ordering::Acquire),
                    behind.target.load(Ordering::SeqCst)
                );
            }
            guard = self
                .reached
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Two connected blocking sockets on 127.0.0.1 with `TCP_NODELAY` set on both:
/// `(client, server)`.
pub(crate) fn tcp_pair() -> io::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let client = TcpStream::connect(listener.local_addr()?)?;
    let (server, _) = listener.accept()?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    Ok((client, server))
}

/// Which kind of socket a case runs over: TCP on 127.0.0.1, or a Unix-domain socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Over {
    Tcp,
    Unix,
}

/// A blocking socket of the raw baseline, of either kind.
#[derive(Debug)]
pub(crate) enum RawStream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixStream),
}

impl RawStream {
    pub(crate) fn try_clone(&self) -> io::Result<RawStream> {
        match self {
            RawStream::Tcp(s) => s.try_clone().map(RawStream::Tcp),
            #[cfg(unix)]
            RawStream::Unix(s) => s.try_clone().map(RawStream::Unix),
        }
    }
}

impl Read for RawStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            RawStream::Tcp(s) => s.read(buf),
            #[cfg(unix)]
            RawStream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for RawStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            RawStream::Tcp(s) => s.write(buf),
            #[cfg(unix)]
            RawStream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Two connected blocking sockets of the raw baseline over `over`: `(client, server)` (TCP:
/// [`tcp_pair`]; Unix: a socket pair).
pub(crate) fn raw_pair(over: Over) -> io::Result<(RawStream, RawStream)> {
    match over {
        Over::Tcp => tcp_pair().map(|(c, s)| (RawStream::Tcp(c), RawStream::Tcp(s))),
        #[cfg(unix)]
        Over::Unix => std::os::unix::net::UnixStream::pair()
            .map(|(c, s)| (RawStream::Unix(c), RawStream::Unix(s))),
        #[cfg(not(unix))]
        Over::Unix => Err(io::ErrorKind::Unsupported.into()),
    }
}

/// A fresh directory for this bench's Unix sockets, named after `what`.
pub(crate) fn socket_dir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cohort-bench-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench: the sockets' directory");
    dir
}

/// The address member `name` listens on over `over`: an ephemeral TCP port on 127.0.0.1,
/// or `name.sock` in `dir`.
pub(crate) fn listen_addr(over: Over, dir: &std::path::Path, name: &str) -> cohort::Addr {
    match over {
        Over::Tcp => cohort::Addr::Tcp(([127, 0, 0, 1], 0).into()),
        Over::Unix => cohort::Addr::unix(dir.join(format!("{name}.sock"))),
    }
}

/// Writes one baseline frame: the payload's length as a little-endian `u32`, then the
/// payload.
pub(crate) fn write_frame<W: Write>(w: &mut W, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len()).map_err(|_| io::ErrorKind::InvalidInput)?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(payload)
}

/// A whole baseline frame in one buffer, for writers that send it with one `write_all`.
pub(crate) fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + payload.len());
    write_frame(&mut out, payload).expect("writing to a Vec cannot fail");
    out
}

/// Reads one baseline frame into `buf` and returns its payload length, or `None` at end of
/// stream. A length above `buf.len()` is an error, checked before reading the payload.
pub(crate) fn read_frame<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<Option<usize>> {
    let mut header = [0u8; 4];
    match r.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(header) as usize;
    if len > buf.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {} byte bound", buf.len()),
        ));
    }
    r.read_exact(&mut buf[..len])?;
    Ok(Some(len))
}

/// The baseline receiver: reads `stream` through a 64 KiB `BufReader`, parses every frame
/// and adds them to `progress` each time the buffer runs dry (before the next `read`
/// syscall, so a waiter sees every frame that has arrived). Returns at end of stream.
pub(crate) fn count_frames(stream: impl Read, progress: &Progress) -> io::Result<()> {
    let mut reader = BufReader::with_capacity(RAW_BUFFER, stream);
    let mut buf = vec![0u8; RAW_MAX_FRAME];
    let mut unreported = 0u64;
    while read_frame(&mut reader, &mut buf)?.is_some() {
        unreported += 1;
        if reader.buffer().is_empty() {
            progress.add(unreported);
            unreported = 0;
        }
    }
    progress.add(unreported);
    Ok(())
}

/// The `(iterations, elapsed)` of every `iter_custom` call of one benchmark function, so a
/// bench can print a summary comparing two functions of the same run.
#[derive(Debug)]
pub(crate) struct Samples {
    /// Events (messages, round trips) in one iteration.
    per_iter: u64,
    calls: Mutex<Vec<(u64, Duration)>>,
    /// The process's CPU time (every thread: both ends of the benchmark live in this
    /// process) spent in each recorded call, when it could be read.
    cpu: Mutex<Vec<(u64, Duration)>>,
}

impl Samples {
    /// An empty log for a benchmark whose iterations each handle `per_iter` events.
    pub(crate) fn new(per_iter: u64) -> Samples {
        Samples {
            per_iter,
            calls: Mutex::new(Vec::new()),
            cpu: Mutex::new(Vec::new()),
        }
    }

    /// Records the process CPU time one `iter_custom` call of `iters` iterations used.
    pub(crate) fn record_cpu(&self, iters: u64, cpu: Duration) {
        self.cpu
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((iters, cpu));
    }

    /// CPU time per event (all threads of the process) over criterion's measured samples:
    /// their CPU time summed over their events summed, or `None` if none was recorded.
    pub(crate) fn cpu_per_event(&self) -> Option<Duration> {
        let cpu = self.cpu.lock().unwrap_or_else(|e| e.into_inner());
        let measured = if quick_mode() { 2 } else { SAMPLE_SIZE };
        let tail = &cpu[cpu.len().saturating_sub(measured)..];
        let events: u64 = tail.iter().map(|(iters, _)| iters * self.per_iter).sum();
        let total: Duration = tail.iter().map(|(_, d)| *d).sum();
        (events > 0).then(|| total.div_f64(events as f64))
    }

    /// Records one `iter_custom` call.
    pub(crate) fn record(&self, iters: u64, elapsed: Duration) {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((iters, elapsed));
    }

    /// The median time per iteration over criterion's measured samples (the last calls:
    /// warm-up calls come first), or `None` if nothing was recorded.
    pub(crate) fn median_per_iter(&self) -> Option<Duration> {
        let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let measured = if quick_mode() { 2 } else { SAMPLE_SIZE };
        let mut per_iter: Vec<Duration> = calls[calls.len().saturating_sub(measured)..]
            .iter()
            .filter(|(iters, _)| *iters > 0)
            .map(|&(iters, elapsed)| elapsed.div_f64(iters as f64))
            .collect();
        if per_iter.is_empty() {
            return None;
        }
        per_iter.sort();
        Some(per_iter[per_iter.len() / 2])
    }

    /// Events per second at [`median_per_iter`](Samples::median_per_iter).
    pub(crate) fn median_rate(&self) -> Option<f64> {
        self.median_per_iter()
            .map(|t| self.per_iter as f64 / t.as_secs_f64())
    }
}

/// Formats a rate in messages per second with an SI prefix.
pub(crate) fn rate(per_sec: f64) -> String {
    if per_sec >= 1e6 {
        format!("{:.2} M msgs/s", per_sec / 1e6)
    } else if per_sec >= 1e3 {
        format!("{:.1} k msgs/s", per_sec / 1e3)
    } else {
        format!("{per_sec:.0} msgs/s")
    }
}
