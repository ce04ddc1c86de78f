//! The bodies of the fuzz targets, shared with `tests/fuzz_corpus.rs` (which replays the
//! committed corpus on every `cargo test`). Included by path from both, so it is written
//! as a plain module: `pub(crate)` items, no crate attributes.
//!
//! - [`decode_stream`]: an arbitrary byte stream split into frames exactly as the IO thread
//!   does (`wire::split_frame` against the handshake or the data bound, one frame at a
//!   time), each checked against `decode`.
//! - [`handshake`]: arbitrary frames fed to an acceptor or a dialler, `accept` / `refuse`
//!   with arbitrary counts after `Identified`, `resolve` on an arbitrary tie-break; or a
//!   complete acceptor ↔ dialler exchange between two arbitrary identities, checked against
//!   a model of the identity checks.
//!
//! Every call that reads untrusted bytes runs with [`TrackAlloc`] armed, which records the
//! largest single allocation: decoding must allocate nothing at all, the handshake nothing
//! larger than a small multiple of the handshake frame bound.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::BytesMut;
use cohort::internals::proto::{
    resolve, Handshake, HsEvent, LocalIdentity, Resolution, Role, Secret, TieBreak,
};
use cohort::internals::wire::{self, CloseCode, Frame, WireError};

/// Longest handshake frame after its length prefix: the bound `parse` uses before a
/// connection is established.
pub(crate) const HS_MAX: usize = wire::MAX_HANDSHAKE_FRAME;

/// Largest single allocation the handshake may make while handling one frame: names and
/// reasons are bounded by the handshake frame, and formatting them into an error message
/// at most doubles a few times. Anything sized by an untrusted `u32` is far above this.
const HS_ALLOC_BOUND: usize = 4 * (wire::LEN_BYTES + HS_MAX);

/// Payload limits the decode target picks from (the node's `max_message`).
const MAX_PAYLOADS: [usize; 8] = [0, 1, 7, 64, 255, 1024, 4096, 1 << 20];

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, recording (per thread, while armed) how many allocations were made
/// and the largest. Install it with `#[global_allocator]` in the including crate.
pub(crate) struct TrackAlloc;

fn record(size: usize) {
    let _ = ARMED.try_with(|armed| {
        if armed.get() {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
    });
}

// SAFETY: every call is forwarded unchanged to `System`; the bookkeeping touches only
// const-initialised thread-locals without destructors, which never allocate.
unsafe impl GlobalAlloc for TrackAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Runs `f` with the allocation tracker armed; returns its result, the number of
/// allocations and the largest one.
fn tracked<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    LARGEST.with(|l| l.set(0));
    COUNT.with(|c| c.set(0));
    ARMED.with(|a| a.set(true));
    let out = f();
    ARMED.with(|a| a.set(false));
    (out, COUNT.with(Cell::get), LARGEST.with(Cell::get))
}

/// Whether [`TrackAlloc`] is the global allocator and sees allocations (a harness whose
/// crate forgot `#[global_allocator]` would check nothing).
pub(crate) fn tracker_is_live() -> bool {
    let (_, count, largest) = tracked(|| std::hint::black_box(Vec::<u8>::with_capacity(1000)));
    count == 1 && largest == 1000
}

/// Runs `f`, asserting it allocates nothing larger than `bound` bytes (bookkeeping of a
/// fixed size, never anything sized by the input).
fn small_alloc<T>(what: &str, bound: usize, f: impl FnOnce() -> T) -> T {
    let (out, count, largest) = tracked(f);
    assert!(
        largest <= bound,
        "{what} allocated {largest} B ({count} allocations), more than {bound} B"
    );
    out
}

/// Runs `f`, asserting it allocates nothing.
fn no_alloc<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let (out, count, largest) = tracked(f);
    assert_eq!(
        count, 0,
        "{what} allocated ({count} allocations, largest {largest} B)"
    );
    out
}

/// A reader over fuzzer bytes that yields zeroes once exhausted, so every input is usable.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u64(&mut self) -> u64 {
        let mut a = [0u8; 8];
        for b in &mut a {
            *b = self.u8();
        }
        u64::from_le_bytes(a)
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        head
    }
    /// A name of at most `wire::MAX_NAME` bytes (the precondition `LocalIdentity` has in
    /// the node, which validates its configuration).
    fn name(&mut self) -> String {
        let n = self.u8() as usize % 24;
        let mut s = String::from_utf8_lossy(self.take(n)).into_owned();
        let mut end = s.len().min(wire::MAX_NAME);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s
    }
}

/// Re-encodes a decoded frame; `None` for the two forms the encoder cannot produce (a close
/// frame with flags or with an unknown code byte, both accepted by the decoder and mapped).
fn reencode(f: &Frame<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    match f {
        Frame::Hello(id) => wire::encode_hello(&mut out, id),
        Frame::HelloReply(id, r, c, u, mac) => {
            wire::encode_hello_reply(&mut out, id, *r, *c, *u, mac.as_ref())
        }
        Frame::Ready {
            received,
            unreliable,
            mac,
        } => wire::encode_ready(&mut out, *received, *unreliable, mac.as_ref()),
        Frame::Data {
            flags,
            seq,
            payload,
        } => wire::encode_data(&mut out, *flags, *seq, payload),
        Frame::Ack { received, credit } => wire::encode_ack(&mut out, *received, *credit),
        Frame::Probe => wire::encode_probe(&mut out),
        Frame::Heartbeat => wire::encode_heartbeat(&mut out),
        Frame::Close { code, reason } => wire::encode_close(&mut out, *code, reason),
    }
    out
}

/// Checks one complete frame (`frame` is exactly its bytes, prefix included) as decoded.
fn check_frame(f: &Frame<'_>, frame: &[u8]) {
    let canonical = match f {
        // The decoder takes any code byte (unknown ones become `Other`), any flags byte and
        // any reason length; the encoder writes flags 0 and cuts the reason to 255 bytes.
        Frame::Close { code, reason } => {
            frame[wire::LEN_BYTES + 1] == 0
                && frame[wire::HEADER_BYTES] == *code as u8
                && reason.len() <= 255
        }
        // Another version's handshake frame is decoded up to its identity only.
        Frame::Hello(id) | Frame::HelloReply(id, ..) => id.version == wire::VERSION,
        _ => true,
    };
    if canonical {
        assert_eq!(reencode(f), frame, "decode ∘ encode is not the identity");
        // The handshake authenticates received frames by re-encoding them this way.
        let mut again = Vec::new();
        wire::encode_frame(&mut again, f);
        assert_eq!(
            again, frame,
            "encode_frame differs from the encode_* functions"
        );
    }
    if let Frame::Hello(id) | Frame::HelloReply(id, ..) = f {
        assert!(id.cluster.len() <= wire::MAX_NAME && id.name.len() <= wire::MAX_NAME);
    }
}

/// Splits `stream` into frames with `wire::split_frame`, as the IO thread does, and checks
/// each one against `decode`. The first two bytes choose the setting: the bound (handshake,
/// data, or handshake until a `HelloReply` or `Ready` decodes, then data, as on a
/// connection that completes its handshake — with chunk 0 the whole stream is one read, so
/// the frames after the handshake arrive in the same read as its last frame), the node's
/// `max_message`, and the size of the reads the stream arrives in.
pub(crate) fn decode_stream(data: &[u8]) {
    let mut cfg = Bytes(data);
    let (mode, chunk) = (cfg.u8(), cfg.u8());
    let stream = cfg.0;
    let data_max = wire::max_frame_len(MAX_PAYLOADS[(mode >> 2) as usize % MAX_PAYLOADS.len()]);
    let mut established = mode & 3 == 1;
    let chunk = match chunk {
        0 => stream.len().max(1),
        c => c as usize,
    };

    let mut rbuf = BytesMut::new();
    for read in stream.chunks(chunk) {
        rbuf.extend_from_slice(read);
        loop {
            let max = if established { data_max } else { HS_MAX };
            let before = rbuf.clone();
            // Splitting shares the buffer: the first split of a buffer allocates its
            // reference count, nothing else.
            let split = small_alloc("split_frame", 64, || wire::split_frame(&mut rbuf, max));
            let decoded = no_alloc("decode", || wire::decode(&before, max));
            let split = match split {
                Ok(Some(split)) => split,
                Ok(None) => {
                    assert_eq!(rbuf, before, "split_frame consumed a partial frame");
                    assert_eq!(decoded, Ok(None), "decode disagrees with split_frame");
                    break;
                }
                Err(e) => {
                    // The connection is closed; decode must refuse the same buffer the same
                    // way (split_frame checks data headers only, decode the whole body).
                    match (&decoded, &e) {
                        (Err(d), e) if d == e => {}
                        (Err(WireError::Malformed(_)), WireError::Malformed(_)) => {}
                        _ => panic!("split_frame says {e:?}, decode {decoded:?}"),
                    }
                    if let WireError::TooLarge { len, max: m } = e {
                        assert!(len > max && m == max);
                    }
                    return;
                }
            };
            let total = before.len() - rbuf.len();
            let len = total - wire::LEN_BYTES;
            assert!(
                (2..=max).contains(&len),
                "split_frame let through {len} (max {max})"
            );
            let frame = &before[..total];
            if let wire::Split::Data {
                flags,
                seq,
                payload,
            } = &split
            {
                // The IO thread never calls decode for data; both must agree.
                match &decoded {
                    Ok(Some((
                        Frame::Data {
                            flags: f2,
                            seq: s2,
                            payload: p2,
                        },
                        _,
                    ))) => assert_eq!((*flags, *seq, &payload[..]), (*f2, *s2, *p2)),
                    d => panic!("decode {d:?} but split_frame a data frame"),
                }
            } else if let wire::Split::Control(bytes) = &split {
                assert_eq!(&bytes[..], frame, "a control frame split whole");
            }
            match decoded {
                Ok(Some((f, used))) => {
                    assert_eq!(used, total);
                    check_frame(&f, frame);
                    if mode & 3 == 2 && matches!(f, Frame::HelloReply(..) | Frame::Ready { .. }) {
                        established = true;
                    }
                }
                Ok(None) => panic!("decode calls a complete frame of {total} bytes partial"),
                Err(WireError::TooLarge { .. }) => panic!("decode refuses what split_frame took"),
                Err(e) => {
                    // Refused body: the body decoder on its own says the same.
                    let kind = frame[wire::LEN_BYTES];
                    let b = &frame[wire::HEADER_BYTES..];
                    let d = no_alloc("decode_body", || {
                        wire::decode_body(kind, frame[wire::LEN_BYTES + 1], b)
                    });
                    assert_eq!(d.unwrap_err(), e);
                    return;
                }
            }
        }
    }
}

/// Secrets the fuzzer picks from: none, one, another.
const SECRETS: [Option<&[u8]>; 3] = [None, Some(b"k"), Some(b"another secret")];

fn local(b: &mut Bytes<'_>, cluster: &str, name: &str) -> LocalIdentity {
    LocalIdentity {
        launch_id: b.u64(),
        window: b.u64() % 4, // small, so that the "window < 2" refusal is reached
        max_message: b.u8() as u32,
        cluster: cluster.to_owned(),
        name: name.to_owned(),
        secret: SECRETS[b.u8() as usize % SECRETS.len()].map(Secret::new),
    }
}

fn nonce(b: &mut Bytes<'_>) -> wire::Nonce {
    let mut n = [0u8; wire::NONCE_LEN];
    n[..8].copy_from_slice(&b.u64().to_le_bytes());
    n
}

fn tie_break(b: &mut Bytes<'_>) -> TieBreak {
    let bits = b.u8();
    let our_connections = b.u64() % 8;
    let theirs = b.u64() % 8;
    TieBreak {
        stale: bits & 1 != 0,
        new_by_us: bits & 2 != 0,
        old_by_us: bits & 4 != 0,
        old_established: bits & 8 != 0,
        we_are_smaller: bits & 16 != 0,
        our_connections,
        peer_connections: (bits & 32 != 0).then_some(theirs),
    }
}

/// `resolve` never panics; for two dials in flight at once (neither side has an established
/// `old`) both members reach the same answer; only an established `old` of another
/// incarnation refuses the new one for its name.
fn check_resolve(t: TieBreak) {
    let here = resolve(t);
    assert_eq!(
        here == Resolution::NameInUse,
        t.stale && t.old_established,
        "{t:?}"
    );
    if !t.old_established {
        let there = TieBreak {
            new_by_us: !t.new_by_us,
            old_by_us: !t.old_by_us,
            we_are_smaller: !t.we_are_smaller,
            ..t
        };
        assert_eq!(here, resolve(there), "members disagree on {t:?}");
    }
}

/// Decodes every complete frame of `out` (what a handshake wrote) under the handshake bound.
fn frames_of(out: &[u8]) -> Vec<Frame<'_>> {
    let mut v = Vec::new();
    let mut at = 0;
    while at < out.len() {
        let (f, used) = wire::decode(&out[at..], HS_MAX)
            .expect("the handshake wrote a frame it cannot read")
            .expect("the handshake wrote a partial frame");
        v.push(f);
        at += used;
    }
    v
}

/// Feeds one frame to `hs` with the tracker armed.
fn feed(
    hs: &mut Handshake,
    f: &Frame<'_>,
) -> Result<HsEvent, cohort::internals::proto::HandshakeError> {
    let (r, _, largest) = tracked(|| hs.on_frame(f));
    assert!(largest <= HS_ALLOC_BOUND, "on_frame allocated {largest} B");
    r
}

/// The first byte picks the scenario: bit 0 the role, bit 1 the scenario (frames from the
/// fuzzer, or a complete exchange between two fuzzer-made identities).
pub(crate) fn handshake(data: &[u8]) {
    let mut b = Bytes(data);
    let mode = b.u8();
    check_resolve(tie_break(&mut b));
    if mode & 2 == 0 {
        feed_frames(mode & 1 == 0, &mut b);
    } else {
        exchange(&mut b);
    }
}

/// Our side is cluster "c", member "a"; a dialler expects "b" (the committed corpus holds
/// frames that pass these checks, so the fuzzer starts past them).
fn feed_frames(acceptor: bool, b: &mut Bytes<'_>) {
    let me = local(b, "c", "a");
    let mut out = Vec::new();
    let mut hs = if acceptor {
        let hs = Handshake::acceptor(me, nonce(b), &mut out);
        assert!(matches!(frames_of(&out)[..], [Frame::Hello(_)]));
        hs
    } else {
        Handshake::dialler(me, "b".to_owned(), nonce(b))
    };
    let hs_auth = hs.authenticates();
    let decide = b.u8();
    let counts = (b.u64(), b.u64(), b.u64());
    let mut identified = false;
    let mut rbuf = BytesMut::from(b.0);
    loop {
        let len = match wire::peek_len(&rbuf, HS_MAX) {
            Ok(Some(len)) if rbuf.len() >= wire::LEN_BYTES + len => len,
            _ => return, // incomplete (the connection waits) or refused (it is closed)
        };
        let frame = rbuf.split_to(wire::LEN_BYTES + len).freeze();
        let Ok(Some((f, _))) = wire::decode(&frame, HS_MAX) else {
            return;
        };
        let was_done = hs.is_done();
        match feed(&mut hs, &f) {
            Ok(HsEvent::Identified {
                peer,
                peer_received,
                peer_connections,
                peer_unreliable,
            }) => {
                assert!(!identified, "identified twice");
                identified = true;
                assert_eq!(hs.peer(), Some(&peer));
                assert!(peer.window >= 2 && peer.name != "a");
                assert_eq!(peer_received.is_some(), acceptor);
                assert_eq!(peer_connections.is_some(), acceptor);
                assert_eq!(peer_unreliable.is_some(), acceptor);
                out.clear();
                if decide & 1 == 0 {
                    hs.accept(counts.0, counts.1, counts.2, &mut out);
                    match frames_of(&out)[..] {
                        [Frame::Ready {
                            received,
                            unreliable,
                            mac,
                        }] => {
                            assert!(acceptor && hs.is_done());
                            assert_eq!((received, unreliable), (counts.0, counts.2));
                            assert_eq!(mac.is_some(), hs_auth);
                        }
                        [Frame::HelloReply(ref id, r, c, u, mac)] => {
                            assert!(!acceptor && !hs.is_done());
                            assert_eq!((id.nonce.is_some(), mac.is_some()), (hs_auth, hs_auth));
                            assert_eq!((id.cluster, id.name), ("c", "a"));
                            assert_eq!((r, c, u), counts);
                        }
                        ref other => panic!("accept wrote {other:?}"),
                    }
                } else {
                    // The endpoint refuses the peer: it writes a Close frame (its reason cut
                    // at 255 bytes, here mid-character), closes the link and drops the
                    // handshake.
                    let reason = "é".repeat(decide as usize);
                    wire::encode_close(&mut out, CloseCode::from_u8(decide >> 1), &reason);
                    assert!(matches!(frames_of(&out)[..], [Frame::Close { .. }]));
                    return;
                }
            }
            Ok(HsEvent::Established { .. }) => {
                assert!(!acceptor && identified && !was_done && hs.is_done());
            }
            Err(e) => {
                assert!(!hs.is_done());
                assert_eq!(e.by_peer, matches!(f, Frame::Close { .. }));
            }
        }
        assert!(matches!(
            (hs.role(), acceptor),
            (Role::Acceptor, true) | (Role::Dialler { .. }, false)
        ));
    }
}

/// A complete exchange between an acceptor and a dialler with fuzzer-made identities; the
/// outcome must match the identity checks (same cluster, distinct names, the dialled name,
/// windows of at least 2 bytes), and the counts each side learns are the ones the other sent.
fn exchange(b: &mut Bytes<'_>) {
    let bits = b.u8();
    let (ca, na) = (b.name(), b.name());
    let cd = if bits & 1 == 0 { ca.clone() } else { b.name() };
    let nd = b.name();
    let expected = if bits & 2 == 0 { na.clone() } else { b.name() };
    let (a_id, d_id) = (local(b, &ca, &na), local(b, &cd, &nd));
    let (a_counts, d_counts) = ((b.u64(), b.u64(), b.u64()), (b.u64(), b.u64(), b.u64()));

    let mut out = Vec::new();
    let mut a = Handshake::acceptor(a_id.clone(), nonce(b), &mut out);
    let mut d = Handshake::dialler(d_id.clone(), expected.clone(), nonce(b));

    // Hello: the dialler checks the acceptor: whether both authenticate, then the identity.
    let hello = frames_of(&out);
    let want = if a_id.secret.is_some() != d_id.secret.is_some() {
        Some(CloseCode::Auth)
    } else if ca != cd {
        Some(CloseCode::Cluster)
    } else if na == nd || na != expected {
        Some(CloseCode::NameMismatch)
    } else if a_id.window < 2 {
        Some(CloseCode::Protocol)
    } else {
        None
    };
    match (feed(&mut d, &hello[0]), want) {
        (Ok(HsEvent::Identified { peer, .. }), None) => {
            assert_eq!(
                (
                    peer.name.as_str(),
                    peer.launch_id,
                    peer.window,
                    peer.max_message
                ),
                (na.as_str(), a_id.launch_id, a_id.window, a_id.max_message)
            );
        }
        (Err(e), Some(code)) if e.code == code && !e.by_peer => return,
        (got, want) => panic!("dialler: {got:?}, expected refusal {want:?}"),
    }

    // HelloReply: the acceptor checks the dialler.
    let mut reply = Vec::new();
    d.accept(d_counts.0, d_counts.1, d_counts.2, &mut reply);
    let reply = frames_of(&reply);
    // With secrets, the MAC first: another secret is refused before anything else.
    if a_id.secret != d_id.secret {
        match feed(&mut a, &reply[0]) {
            Err(e) if e.code == CloseCode::Auth && !e.by_peer => return,
            got => panic!("acceptor with another secret: {got:?}"),
        }
    }
    match (feed(&mut a, &reply[0]), d_id.window < 2) {
        (
            Ok(HsEvent::Identified {
                peer,
                peer_received,
                peer_connections,
                peer_unreliable,
            }),
            false,
        ) => {
            assert_eq!(peer.name, nd);
            assert_eq!(
                (peer_received, peer_connections, peer_unreliable),
                (Some(d_counts.0), Some(d_counts.1), Some(d_counts.2))
            );
        }
        (Err(e), true) if e.code == CloseCode::Protocol => return,
        (got, small) => panic!("acceptor: {got:?}, dialler window too small: {small}"),
    }

    // Ready: both are up.
    let mut ready = Vec::new();
    a.accept(a_counts.0, a_counts.1, a_counts.2, &mut ready);
    assert!(a.is_done());
    let ready = frames_of(&ready);
    match feed(&mut d, &ready[0]) {
        Ok(HsEvent::Established {
            peer_received,
            peer_unreliable,
        }) => assert_eq!((peer_received, peer_unreliable), (a_counts.0, a_counts.2)),
        other => panic!("dialler after Ready: {other:?}"),
    }
    if a_id.secret.is_some() {
        // A Ready with any one bit of its MAC flipped is refused by a fresh dialler that
        // reached the same point.
        let mut d2 = Handshake::dialler(d_id.clone(), expected.clone(), [0xee; wire::NONCE_LEN]);
        let _ = feed(&mut d2, &hello[0]);
        let mut reply2 = Vec::new();
        d2.accept(d_counts.0, d_counts.1, d_counts.2, &mut reply2);
        // Ready from the first exchange: its MAC covers the first dialler's nonce.
        assert!(matches!(feed(&mut d2, &ready[0]), Err(e) if e.code == CloseCode::Auth));
    }
    assert!(d.is_done());
    // Any further handshake frame is a protocol error, never a panic.
    assert!(feed(&mut d, &ready[0]).is_err());
    assert!(feed(&mut a, &reply[0]).is_err());
}
