//! A fault-injecting TCP proxy for the integration tests: plain threads and blocking sockets
//! on 127.0.0.1, no extra crates.
//!
//! A [`Proxy`] listens on an ephemeral port and, for each connection it accepts, dials its
//! target and forwards both directions. Each direction re-chunks the byte stream into writes
//! of random size (1 to `max_chunk` bytes, from a per-connection xorshift seeded by the test),
//! so the receiver sees frames split at arbitrary points and a cut leaves it holding part of
//! a frame. [`Proxy::cut_all`] shuts down (both halves of) every forwarded pair at once;
//! [`Proxy::stop`] cuts everything and joins every thread the proxy started.
//!
//! Modes, for the lifecycle tests: [`Mode::Forward`] (the default), [`Mode::Refuse`] (accept,
//! then close at once: the dialler's handshake fails with an EOF), and [`Mode::Hold`] (accept
//! and never answer: the dialler stays in its handshake until the proxy lets go). With
//! [`Proxy::set_close_through`]`(false)`, one end closing leaves the other open (half-open).
//!
//! To tell whether a cut landed mid-frame, each direction follows the frame boundaries of
//! the bytes it forwarded: every cohort frame starts with a 4-byte little-endian length of
//! what follows (`docs/wire.md`). The proxy never looks inside a frame.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// A deterministic xorshift64* generator.
#[derive(Clone, Debug)]
pub(crate) struct XorShift(u64);

impl XorShift {
    /// A generator; any seed works (zero is remapped).
    pub(crate) fn new(seed: u64) -> XorShift {
        XorShift(seed ^ 0x9E37_79B9_7F4A_7C15 | 1)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// What the proxy does with a connection it accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Mode {
    /// Dial the target and forward both ways.
    Forward = 0,
    /// Close it at once.
    Refuse = 1,
    /// Keep it open, read and discard what it sends, never answer.
    Hold = 2,
}

/// One accepted connection: the client side and, when forwarding, the target side.
struct Pair {
    client: TcpStream,
    target: Option<TcpStream>,
    /// Set before the pair is shut down by a cut (not by either end closing).
    cut: Arc<AtomicBool>,
    /// A cut is wanted: the next write that leaves a frame half-forwarded performs it.
    requested: Arc<AtomicBool>,
}

impl Pair {
    fn shut(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        if let Some(t) = &self.target {
            let _ = t.shutdown(Shutdown::Both);
        }
    }
}

struct Inner {
    label: String,
    target: SocketAddr,
    mode: AtomicU8,
    close_through: AtomicBool,
    max_chunk: u64,
    seed: u64,
    stopped: AtomicBool,
    pairs: Mutex<HashMap<u64, Pair>>,
    next_id: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
    accepted: AtomicU64,
    cuts: AtomicU64,
    mid_frame_cuts: AtomicU64,
    forwarded: AtomicU64,
}

/// A TCP proxy from an ephemeral port on 127.0.0.1 to one target address.
pub(crate) struct Proxy {
    addr: SocketAddr,
    inner: Arc<Inner>,
    acceptor: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "proxy {} {} -> {} ({:?}, {} accepted, {} live, {} cuts, {} mid-frame)",
            self.inner.label,
            self.addr,
            self.inner.target,
            self.mode(),
            self.accepted(),
            self.live(),
            self.cuts(),
            self.mid_frame_cuts()
        )
    }
}

impl Proxy {
    /// Starts a proxy to `target` that forwards in writes of 1 to `max_chunk` bytes, the
    /// sizes drawn from a generator seeded with `seed`. `label` names its threads.
    pub(crate) fn start(label: &str, target: SocketAddr, seed: u64, max_chunk: usize) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy binds an ephemeral port");
        let addr = listener.local_addr().expect("proxy address");
        let inner = Arc::new(Inner {
            label: label.to_owned(),
            target,
            mode: AtomicU8::new(Mode::Forward as u8),
            close_through: AtomicBool::new(true),
            max_chunk: max_chunk.max(1) as u64,
            seed,
            stopped: AtomicBool::new(false),
            pairs: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            threads: Mutex::new(Vec::new()),
            accepted: AtomicU64::new(0),
            cuts: AtomicU64::new(0),
            mid_frame_cuts: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
        });
        let i = inner.clone();
        let acceptor = thread::Builder::new()
            .name(format!("px-{label}-acc"))
            .spawn(move || accept_loop(&i, listener))
            .expect("spawn the proxy's accept thread");
        Proxy {
            addr,
            inner,
            acceptor: Mutex::new(Some(acceptor)),
        }
    }

    /// The address to dial instead of the target.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The target.
    pub(crate) fn target(&self) -> SocketAddr {
        self.inner.target
    }

    /// What is done with connections accepted from now on (live ones are not affected).
    pub(crate) fn set_mode(&self, mode: Mode) {
        self.inner.mode.store(mode as u8, Ordering::SeqCst);
    }

    /// Whether one end closing closes the other (default `true`). With `false`, a
    /// connection whose far end dies stays open on the near side, as if the far end's host
    /// had vanished without a word: half-open, until a cut or `stop`.
    pub(crate) fn set_close_through(&self, on: bool) {
        self.inner.close_through.store(on, Ordering::SeqCst);
    }

    /// The current mode.
    pub(crate) fn mode(&self) -> Mode {
        match self.inner.mode.load(Ordering::SeqCst) {
            0 => Mode::Forward,
            1 => Mode::Refuse,
            _ => Mode::Hold,
        }
    }

    /// Connections accepted so far, in any mode.
    pub(crate) fn accepted(&self) -> u64 {
        self.inner.accepted.load(Ordering::SeqCst)
    }

    /// Connections open now (forwarded pairs and held connections).
    pub(crate) fn live(&self) -> usize {
        self.inner.pairs.lock().unwrap().len()
    }

    /// Connections cut by [`cut_all`](Proxy::cut_all) so far.
    pub(crate) fn cuts(&self) -> u64 {
        self.inner.cuts.load(Ordering::SeqCst)
    }

    /// Directions of cut connections that had forwarded part of a frame, not all of it.
    pub(crate) fn mid_frame_cuts(&self) -> u64 {
        self.inner.mid_frame_cuts.load(Ordering::SeqCst)
    }

    /// Bytes forwarded so far, both directions.
    pub(crate) fn forwarded(&self) -> u64 {
        self.inner.forwarded.load(Ordering::SeqCst)
    }

    /// Abruptly shuts down every live connection, both sockets of each pair, wherever their
    /// byte streams are (mid-frame included). Returns how many were cut.
    pub(crate) fn cut_all(&self) -> usize {
        cut_all(&self.inner)
    }

    /// Cuts every live connection in the middle of a frame: each is marked, and the first
    /// write of either direction that leaves the receiver holding part of a frame cuts it
    /// right there. A connection with no traffic for `grace` is cut abruptly wherever it is.
    /// Returns how many were cut.
    pub(crate) fn cut_all_mid_frame(&self, grace: Duration) -> usize {
        let marked: Vec<u64> = {
            let pairs = self.inner.pairs.lock().unwrap();
            for p in pairs.values() {
                p.requested.store(true, Ordering::SeqCst);
            }
            pairs.keys().copied().collect()
        };
        if marked.is_empty() {
            return 0;
        }
        let deadline = Instant::now() + grace;
        let pending = || {
            let pairs = self.inner.pairs.lock().unwrap();
            marked.iter().any(|id| pairs.contains_key(id))
        };
        while pending() && Instant::now() < deadline {
            thread::park_timeout(Duration::from_millis(1));
        }
        let late: Vec<Pair> = {
            let mut pairs = self.inner.pairs.lock().unwrap();
            marked.iter().filter_map(|id| pairs.remove(id)).collect()
        };
        for p in &late {
            p.cut.store(true, Ordering::SeqCst);
            p.shut();
        }
        self.inner
            .cuts
            .fetch_add(late.len() as u64, Ordering::SeqCst);
        marked.len()
    }

    /// Cuts everything, stops accepting, and joins every thread of the proxy.
    pub(crate) fn stop(&self) {
        if self.inner.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the accept thread (blocked in accept) with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5));
        if let Some(h) = self.acceptor.lock().unwrap().take() {
            let _ = h.join();
        }
        cut_all(&self.inner);
        let threads = std::mem::take(&mut *self.inner.threads.lock().unwrap());
        for h in threads {
            let _ = h.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

fn cut_all(inner: &Inner) -> usize {
    let pairs: Vec<(u64, Pair)> = inner.pairs.lock().unwrap().drain().collect();
    for (_, p) in &pairs {
        p.cut.store(true, Ordering::SeqCst);
        p.shut();
    }
    inner.cuts.fetch_add(pairs.len() as u64, Ordering::SeqCst);
    pairs.len()
}

fn accept_loop(inner: &Arc<Inner>, listener: TcpListener) {
    for stream in listener.incoming() {
        if inner.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = stream else { continue };
        inner.accepted.fetch_add(1, Ordering::SeqCst);
        let _ = client.set_nodelay(true);
        let mode = inner.mode.load(Ordering::SeqCst);
        if mode == Mode::Refuse as u8 {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let id = inner.next_id.fetch_add(1, Ordering::SeqCst);
        let cut = Arc::new(AtomicBool::new(false));
        let requested = Arc::new(AtomicBool::new(false));
        let target = if mode == Mode::Hold as u8 {
            None
        } else {
            match TcpStream::connect_timeout(&inner.target, Duration::from_secs(5)) {
                Ok(t) => {
                    let _ = t.set_nodelay(true);
                    Some(t)
                }
                Err(_) => {
                    // The target is down: the client sees its connection close.
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
            }
        };
        let clone = |s: &TcpStream| s.try_clone().expect("clone a proxied socket");
        let pair = Pair {
            client: clone(&client),
            target: target.as_ref().map(clone),
            cut: cut.clone(),
            requested: requested.clone(),
        };
        inner.pairs.lock().unwrap().insert(id, pair);
        let mut spawned = Vec::new();
        match target {
            None => {
                let i = inner.clone();
                let h = thread::Builder::new()
                    .name(format!("px-{}-hold", inner.label))
                    .spawn(move || {
                        let mut c = client;
                        let mut buf = [0u8; 4096];
                        while matches!(c.read(&mut buf), Ok(n) if n > 0) {}
                        end_pair(&i, id);
                    })
                    .expect("spawn a proxy thread");
                spawned.push(h);
            }
            Some(t) => {
                for dir in 0..2u64 {
                    let (src, dst) = if dir == 0 {
                        (clone(&client), clone(&t))
                    } else {
                        (clone(&t), clone(&client))
                    };
                    let i = inner.clone();
                    let (cut, requested) = (cut.clone(), requested.clone());
                    let seed = inner.seed ^ id.wrapping_mul(0x9E37_79B9) ^ (dir << 62);
                    let h = thread::Builder::new()
                        .name(format!("px-{}-fwd", inner.label))
                        .spawn(move || pump(&i, id, src, dst, &cut, &requested, seed))
                        .expect("spawn a proxy thread");
                    spawned.push(h);
                }
            }
        }
        let mut threads = inner.threads.lock().unwrap();
        // Reap the threads of connections that ended, so a long test does not pile them up.
        let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut *threads)
            .into_iter()
            .partition(|h| h.is_finished());
        *threads = running;
        threads.extend(spawned);
        drop(threads);
        for h in done {
            let _ = h.join();
        }
    }
}

/// One end of a pair closed (not a cut): close the other too, as a real path would.
fn end_pair(inner: &Inner, id: u64) {
    if let Some(p) = inner.pairs.lock().unwrap().remove(&id) {
        p.shut();
    }
}

/// Where a direction's byte stream is relative to frame boundaries.
#[derive(Default)]
struct FrameCursor {
    header: [u8; 4],
    header_len: usize,
    body_left: u64,
}

impl FrameCursor {
    fn advance(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let n = (self.body_left.min(bytes.len() as u64)) as usize;
                self.body_left -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            let n = (4 - self.header_len).min(bytes.len());
            self.header[self.header_len..self.header_len + n].copy_from_slice(&bytes[..n]);
            self.header_len += n;
            bytes = &bytes[n..];
            if self.header_len == 4 {
                self.body_left = u64::from(u32::from_le_bytes(self.header));
                self.header_len = 0;
            }
        }
    }

    fn mid_frame(&self) -> bool {
        self.header_len > 0 || self.body_left > 0
    }
}

/// How long a direction keeps the tail it holds back once its source goes quiet.
const HOLD: Duration = Duration::from_millis(5);

/// Forwards `src` to `dst` until either end closes or the pair is cut. Writes are of random
/// size, and while the source keeps sending, a random tail of what was read (up to
/// `max_chunk` bytes) is held back until more arrives or the source has been quiet for
/// [`HOLD`]: so while traffic flows the receiver is nearly always missing the end of a
/// frame, and a cut leaves it with a partial one.
fn pump(
    inner: &Inner,
    id: u64,
    mut src: TcpStream,
    mut dst: TcpStream,
    cut: &AtomicBool,
    requested: &AtomicBool,
    seed: u64,
) {
    let mut rng = XorShift::new(seed);
    let mut cursor = FrameCursor::default();
    let mut buf = vec![0u8; 64 * 1024];
    let mut data: Vec<u8> = Vec::with_capacity(buf.len() + inner.max_chunk as usize);
    let mut write = |bytes: &[u8], rng: &mut XorShift| -> io::Result<()> {
        let mut off = 0;
        while off < bytes.len() {
            let k = (rng.range(1, inner.max_chunk) as usize).min(bytes.len() - off);
            dst.write_all(&bytes[off..off + k])?;
            cursor.advance(&bytes[off..off + k]);
            inner.forwarded.fetch_add(k as u64, Ordering::Relaxed);
            off += k;
            if requested.load(Ordering::SeqCst) && cursor.mid_frame() {
                // Cut here, with part of a frame delivered (unless someone else was first).
                if let Some(p) = inner.pairs.lock().unwrap().remove(&id) {
                    p.cut.store(true, Ordering::SeqCst);
                    p.shut();
                    inner.cuts.fetch_add(1, Ordering::SeqCst);
                }
                return Err(io::ErrorKind::ConnectionAborted.into());
            }
        }
        Ok(())
    };
    let result: io::Result<()> = (|| loop {
        let timeout = if data.is_empty() { None } else { Some(HOLD) };
        src.set_read_timeout(timeout)?;
        match src.read(&mut buf) {
            Ok(0) => return write(&data, &mut rng),
            Ok(n) => {
                data.extend_from_slice(&buf[..n]);
                let keep = (rng.range(0, inner.max_chunk) as usize).min(data.len());
                let upto = data.len() - keep;
                write(&data[..upto], &mut rng)?;
                data.drain(..upto);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                write(&data, &mut rng)?;
                data.clear();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    })();
    let _ = result;
    if cut.load(Ordering::SeqCst) {
        if cursor.mid_frame() {
            inner.mid_frame_cuts.fetch_add(1, Ordering::SeqCst);
        }
    } else if inner.close_through.load(Ordering::SeqCst) {
        end_pair(inner, id);
    }
}
