//! The wire format: frame header, encode and decode of every frame kind. Sans-IO: pure
//! functions over byte slices, no sockets, no threads. The byte-level table is in
//! `docs/wire.md`.
//!
//! Every frame is `len: u32 LE` (the bytes that follow it), `kind: u8`, `flags: u8`, then a
//! kind-specific body. Magic and version appear on handshake frames only.
//!
//! ```
//! use cohort::internals::wire::{self, Frame};
//! let mut buf = Vec::new();
//! wire::encode_data(&mut buf, wire::FLAG_RELIABLE, Some(7), b"hi");
//! let (frame, used) = wire::decode(&buf, 1024).unwrap().unwrap();
//! assert_eq!(used, buf.len());
//! assert_eq!(frame, Frame::Data { flags: wire::FLAG_RELIABLE, seq: Some(7), payload: b"hi" });
//! ```

use std::fmt;

use bytes::{Buf, Bytes, BytesMut};

/// Magic bytes that open every handshake identity: `"CHRT"`.
pub const MAGIC: [u8; 4] = *b"CHRT";
/// Protocol version carried in the handshake; peers with another version are refused.
/// Version 2 added the authentication trailer to `Hello`, `HelloReply` and `Ready`; version 3
/// the request and reply data flags; version 4 the status flag of a reply.
pub const VERSION: u16 = 4;
/// Bytes of the length prefix.
pub const LEN_BYTES: usize = 4;
/// Bytes of length prefix + kind + flags.
pub const HEADER_BYTES: usize = LEN_BYTES + 2;
/// Longest cluster or member name, in bytes.
pub const MAX_NAME: usize = 255;
/// Bytes of a handshake nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of a handshake MAC (HMAC-SHA-256).
pub const MAC_LEN: usize = 32;
/// Authentication scheme byte: none (no secret configured).
pub const AUTH_NONE: u8 = 0;
/// Authentication scheme byte: HMAC-SHA-256 challenge–response over the handshake.
pub const AUTH_HMAC_SHA256: u8 = 1;
/// Largest handshake frame body: two names plus fixed fields and the authentication
/// trailer, with room to spare.
pub const MAX_HANDSHAKE_BODY: usize =
    4 + 2 + 8 + 8 + 4 + 8 + 8 + 8 + 1 + MAX_NAME + 1 + MAX_NAME + 1 + NONCE_LEN + MAC_LEN + 64;

/// Largest handshake frame after its length prefix (kind, flags, body): the bound a
/// connection's frames are read with until its handshake completes.
pub const MAX_HANDSHAKE_FRAME: usize = 2 + MAX_HANDSHAKE_BODY;

/// A handshake nonce: fresh random bytes per connection and side.
pub type Nonce = [u8; NONCE_LEN];
/// A handshake MAC.
pub type Mac = [u8; MAC_LEN];

/// Frame kinds (the byte after the length).
pub mod kind {
    /// Handshake step 1: the accepting side's identity.
    pub const HELLO: u8 = 0x01;
    /// Handshake step 2: the dialling side's identity and how much it has received.
    pub const HELLO_REPLY: u8 = 0x02;
    /// Handshake step 3: the accepting side's received count; the connection is up.
    pub const READY: u8 = 0x03;
    /// An application message.
    pub const DATA: u8 = 0x10;
    /// Cumulative ack plus returned credit.
    pub const ACK: u8 = 0x20;
    /// Credit probe: "I am blocked, send me what credit you hold".
    pub const PROBE: u8 = 0x21;
    /// Liveness on an idle connection.
    pub const HEARTBEAT: u8 = 0x22;
    /// The sender is closing this connection, with a reason.
    pub const CLOSE: u8 = 0x30;
}

/// Data flag: out of band (delivered straight to the pool, unordered).
pub const FLAG_OOB: u8 = 0x01;
/// Data flag: reliable (carries a sequence number, acked, resent across reconnects).
pub const FLAG_RELIABLE: u8 = 0x02;
/// Data flag: a request; the payload starts with its [`REQUEST_ID_BYTES`]-byte id (the
/// requester's, little-endian), which the reply carries back, then the 4-byte room it
/// reserves for the reply ([`request_room`]). Always reliable.
pub const FLAG_REQUEST: u8 = 0x04;
/// Data flag: the reply to a request; the payload starts with the request's id. Always
/// reliable, and outside flow control: it costs no window of its own, its room was
/// reserved in the request's.
pub const FLAG_REPLY: u8 = 0x08;
/// Data flag, only with [`FLAG_REPLY`]: the replier could not answer, and the reply
/// carries a [`ReplyStatus`] instead of a payload (after the id: the status code, then the
/// code's fields; [`encode_reply_status`]). Reliable and outside flow control like any
/// reply.
pub const FLAG_STATUS: u8 = 0x10;
/// Bytes of the request id that starts the payload of a request or a reply.
pub const REQUEST_ID_BYTES: usize = 8;
/// Bytes before a request's payload: its id and the room reserved for its reply.
pub const REQUEST_HEADER_BYTES: usize = REQUEST_ID_BYTES + 4;

/// Bytes the transport puts before the application's payload in a data frame with
/// `flags`: a request's header, a reply's id, or nothing.
pub fn tag_bytes(flags: u8) -> usize {
    if flags & FLAG_REQUEST != 0 {
        REQUEST_HEADER_BYTES
    } else if flags & FLAG_REPLY != 0 {
        REQUEST_ID_BYTES
    } else {
        0
    }
}

/// The room (payload bytes) a request reserves for its reply, from its header (`None` if
/// too short).
pub fn request_room(payload: &[u8]) -> Option<u32> {
    let room: [u8; 4] = payload
        .get(REQUEST_ID_BYTES..REQUEST_HEADER_BYTES)?
        .try_into()
        .ok()?;
    Some(u32::from_le_bytes(room))
}

/// The request id at the start of a request's or reply's payload (`None` if too short).
pub fn request_id(payload: &[u8]) -> Option<u64> {
    let id: [u8; REQUEST_ID_BYTES] = payload.get(..REQUEST_ID_BYTES)?.try_into().ok()?;
    Some(u64::from_le_bytes(id))
}

/// Why a replier could not answer a request: what a reply with [`FLAG_STATUS`] carries
/// instead of a payload. On the wire: a code byte, then the code's fields (little-endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyStatus {
    /// Code 1: the handler's reply of `len` bytes exceeded the `room` the request reserved
    /// for it (fields: `len: u64`, `room: u32`).
    TooLarge {
        /// The refused reply's length.
        len: u64,
        /// The room the request reserved.
        room: u32,
    },
    /// Code 2: the request was handed to the application, which dropped it without
    /// replying.
    Unanswered,
    /// Code 3: the message handler panicked on the request.
    Panicked,
    /// Code 4: the replying node has no message handler to answer requests.
    NoHandler,
    /// Any other code (a later version's reason); the bytes after it are not read.
    Other(u8),
}

impl ReplyStatus {
    /// The code byte.
    pub fn code(&self) -> u8 {
        match self {
            ReplyStatus::TooLarge { .. } => 1,
            ReplyStatus::Unanswered => 2,
            ReplyStatus::Panicked => 3,
            ReplyStatus::NoHandler => 4,
            ReplyStatus::Other(c) => *c,
        }
    }
}

/// The body of a status reply (what follows the request id): the code, then its fields.
pub fn encode_reply_status(status: ReplyStatus) -> Vec<u8> {
    let mut b = vec![status.code()];
    if let ReplyStatus::TooLarge { len, room } = status {
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(&room.to_le_bytes());
    }
    b
}

/// Reads the body of a status reply (what follows the request id). A known code must have
/// exactly its fields; an unknown one is [`ReplyStatus::Other`], whatever follows it.
pub fn decode_reply_status(body: &[u8]) -> Result<ReplyStatus, WireError> {
    let mut r = Reader { buf: body };
    let status = match r.u8("reply status")? {
        1 => ReplyStatus::TooLarge {
            len: r.u64("reply status length")?,
            room: r.u32("reply status room")?,
        },
        2 => ReplyStatus::Unanswered,
        3 => ReplyStatus::Panicked,
        4 => ReplyStatus::NoHandler,
        other => return Ok(ReplyStatus::Other(other)),
    };
    if !r.buf.is_empty() {
        return Err(WireError::Malformed("trailing bytes in reply status"));
    }
    Ok(status)
}

/// Checks a data frame's flags against what follows its sequence number (`rest`).
fn check_data_flags(flags: u8, rest: &[u8]) -> Result<(), WireError> {
    if flags & !(FLAG_OOB | FLAG_RELIABLE | FLAG_REQUEST | FLAG_REPLY | FLAG_STATUS) != 0 {
        return Err(WireError::Malformed("unknown data flags"));
    }
    let tagged = flags & (FLAG_REQUEST | FLAG_REPLY);
    if flags & FLAG_STATUS != 0 && tagged != FLAG_REPLY {
        return Err(WireError::Malformed("status without reply"));
    }
    if tagged == 0 {
        return Ok(());
    }
    if tagged == FLAG_REQUEST | FLAG_REPLY {
        return Err(WireError::Malformed("both request and reply"));
    }
    if flags & FLAG_RELIABLE == 0 {
        return Err(WireError::Malformed("unreliable request or reply"));
    }
    if tagged == FLAG_REPLY && flags & FLAG_OOB != 0 {
        return Err(WireError::Malformed("out-of-band reply"));
    }
    if rest.len() < tag_bytes(flags) {
        return Err(WireError::Malformed("request id"));
    }
    if flags & FLAG_STATUS != 0 {
        decode_reply_status(&rest[REQUEST_ID_BYTES..])?;
    }
    Ok(())
}

/// Why a connection is being closed; sent in a [`Frame::Close`] and logged by the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CloseCode {
    /// Protocol versions differ.
    Version = 1,
    /// The peer belongs to another cluster.
    Cluster = 2,
    /// The peer's member name is not configured here and unknown members are not allowed.
    UnknownMember = 3,
    /// Another connection speaks for the pair now: this one lost the tie-break (both
    /// members dialled at once), was replaced by a newer one, or answered a handshake that
    /// acknowledgements on the other one have since overtaken.
    Superseded = 4,
    /// A frame broke the protocol.
    Protocol = 5,
    /// The node is shutting down.
    Shutdown = 6,
    /// The peer was removed from this node.
    Removed = 7,
    /// The handshake named another member than the one dialled.
    NameMismatch = 8,
    /// Authentication failed: the peer has no secret, another secret, or none is configured
    /// here while the peer requires one.
    Auth = 9,
    /// Another live process holds the member name the handshake claims: a connection of
    /// another incarnation (launch id) is established for it, or the claimed incarnation was
    /// already replaced by a newer one.
    NameInUse = 10,
    /// Any other reason.
    Other = 255,
}

impl CloseCode {
    /// Parses a code byte; unknown codes map to [`CloseCode::Other`].
    pub fn from_u8(b: u8) -> CloseCode {
        match b {
            1 => CloseCode::Version,
            2 => CloseCode::Cluster,
            3 => CloseCode::UnknownMember,
            4 => CloseCode::Superseded,
            5 => CloseCode::Protocol,
            6 => CloseCode::Shutdown,
            7 => CloseCode::Removed,
            8 => CloseCode::NameMismatch,
            9 => CloseCode::Auth,
            10 => CloseCode::NameInUse,
            _ => CloseCode::Other,
        }
    }
}

/// Who is at the other end of a connection, as said in the handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity<'a> {
    /// Protocol version of the sender.
    pub version: u16,
    /// Random per process start: a new value means the member restarted.
    pub launch_id: u64,
    /// The sender's send window in bytes: the receiver returns credit in halves of it.
    pub window: u64,
    /// Largest message payload the sender accepts; larger messages are never sent to it.
    pub max_message: u32,
    /// Cluster name.
    pub cluster: &'a str,
    /// Member name.
    pub name: &'a str,
    /// The sender's fresh nonce, present iff it authenticates (has a secret). On the wire it
    /// is in the authentication trailer at the end of the frame.
    pub nonce: Option<Nonce>,
}

/// A decoded frame, borrowing from the input buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// Handshake step 1 (acceptor → dialler).
    Hello(Identity<'a>),
    /// Handshake step 2 (dialler → acceptor): identity, the dialler's received count from
    /// the acceptor's current incarnation, how many connections it has established with that
    /// incarnation, the window bytes of unreliable messages it has received from it, and
    /// its MAC over the handshake so far (present iff the identity carries a nonce).
    HelloReply(Identity<'a>, u64, u64, u64, Option<Mac>),
    /// Handshake step 3 (acceptor → dialler): the acceptor's received counts.
    Ready {
        /// Reliable messages the acceptor has received from the dialler's incarnation.
        received: u64,
        /// Window bytes of unreliable messages received from it (cumulative): the dialler
        /// gives back the permits of the ones a broken connection swallowed.
        unreliable: u64,
        /// The acceptor's MAC over the whole handshake, if it authenticates.
        mac: Option<Mac>,
    },
    /// An application message.
    Data {
        /// [`FLAG_OOB`] | [`FLAG_RELIABLE`].
        flags: u8,
        /// Sequence number, present iff reliable.
        seq: Option<u64>,
        /// The message bytes.
        payload: &'a [u8],
    },
    /// Cumulative ack and cumulative returned credit.
    Ack {
        /// Reliable messages received so far from the peer's current incarnation.
        received: u64,
        /// Bytes of credit handed back to the peer's send window so far (cumulative over
        /// the incarnation, so a lost ack loses nothing).
        credit: u64,
    },
    /// Credit probe.
    Probe,
    /// Liveness.
    Heartbeat,
    /// Orderly close with a reason.
    Close {
        /// Machine-readable reason.
        code: CloseCode,
        /// Human-readable detail.
        reason: &'a str,
    },
}

/// A frame that cannot be decoded; the connection that sent it is closed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// The length prefix exceeds the configured maximum (checked before any allocation).
    TooLarge {
        /// Declared frame length.
        len: usize,
        /// Configured maximum.
        max: usize,
    },
    /// Unknown frame kind byte.
    UnknownKind(u8),
    /// A frame body is shorter or longer than its kind requires, or its fields are invalid.
    Malformed(&'static str),
    /// Handshake magic is wrong: not a cohort peer.
    BadMagic,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::TooLarge { len, max } => {
                write!(f, "frame of {len} bytes exceeds the maximum of {max}")
            }
            WireError::UnknownKind(k) => write!(f, "unknown frame kind 0x{k:02x}"),
            WireError::Malformed(what) => write!(f, "malformed frame: {what}"),
            WireError::BadMagic => write!(f, "bad handshake magic: not a cohort peer"),
        }
    }
}

impl std::error::Error for WireError {}

/// Largest frame length (the bytes after the length prefix) for a payload limit.
pub fn max_frame_len(max_payload: usize) -> usize {
    // kind + flags + seq + payload; handshake frames are far below this.
    (2 + 8 + max_payload).max(2 + MAX_HANDSHAKE_BODY)
}

/// Encoded size of a data frame.
#[inline]
pub fn data_frame_len(reliable: bool, payload_len: usize) -> usize {
    HEADER_BYTES + if reliable { 8 } else { 0 } + payload_len
}

#[inline]
fn put_header(out: &mut Vec<u8>, body_len: usize, kind: u8, flags: u8) {
    let len = (2 + body_len) as u32;
    out.extend_from_slice(&len.to_le_bytes());
    out.push(kind);
    out.push(flags);
}

/// Appends a data frame. `seq` must be `Some` iff `flags` has [`FLAG_RELIABLE`].
#[inline]
pub fn encode_data(out: &mut Vec<u8>, flags: u8, seq: Option<u64>, payload: &[u8]) {
    debug_assert_eq!(seq.is_some(), flags & FLAG_RELIABLE != 0);
    let (header, n) = data_header(flags, seq, payload.len());
    out.reserve(n + payload.len());
    out.extend_from_slice(&header[..n]);
    out.extend_from_slice(payload);
}

/// Appends a data frame's header: what [`encode_data`] writes before the payload, for a
/// payload of `payload_len` bytes the caller writes after it.
#[inline]
pub fn encode_data_header(out: &mut Vec<u8>, flags: u8, seq: Option<u64>, payload_len: usize) {
    debug_assert_eq!(seq.is_some(), flags & FLAG_RELIABLE != 0);
    let (header, n) = data_header(flags, seq, payload_len);
    out.extend_from_slice(&header[..n]);
}

/// A data frame's header in one piece (length, kind, flags, sequence number), and how many
/// of its bytes are used (the sequence number only for a reliable frame): two copies per
/// message, not five.
#[inline]
fn data_header(flags: u8, seq: Option<u64>, payload_len: usize) -> ([u8; HEADER_BYTES + 8], usize) {
    let seq_len = if seq.is_some() { 8 } else { 0 };
    let mut header = [0u8; HEADER_BYTES + 8];
    let len = (2 + seq_len + payload_len) as u32;
    header[..LEN_BYTES].copy_from_slice(&len.to_le_bytes());
    header[LEN_BYTES] = kind::DATA;
    header[LEN_BYTES + 1] = flags;
    if let Some(s) = seq {
        header[HEADER_BYTES..].copy_from_slice(&s.to_le_bytes());
    }
    (header, HEADER_BYTES + seq_len)
}

/// Appends a reliable data frame whose sequence number is not known yet: 0 stands in its
/// place until [`number_frames`] writes it. A sender encodes its message this way before the
/// IO thread numbers it (`Outbox::admit_framed`).
#[inline]
pub fn encode_unnumbered(out: &mut BytesMut, flags: u8, payload: &[u8]) {
    let (header, n) = data_header(flags | FLAG_RELIABLE, Some(0), payload.len());
    out.extend_from_slice(&header[..n]);
    out.extend_from_slice(payload);
}

/// Numbers the reliable data frames of `frames` (written by [`encode_unnumbered`], back to
/// back) `first`, `first + 1`, … in order, and returns how many there were.
///
/// ```
/// use cohort::internals::wire::{self, Frame};
/// let mut frames = bytes::BytesMut::new();
/// wire::encode_unnumbered(&mut frames, 0, b"a");
/// wire::encode_unnumbered(&mut frames, wire::FLAG_OOB, b"bc");
/// assert_eq!(wire::number_frames(&mut frames, 7), 2);
/// let (f, used) = wire::decode(&frames, 1 << 20).unwrap().unwrap();
/// assert_eq!(f, Frame::Data { flags: wire::FLAG_RELIABLE, seq: Some(7), payload: b"a" });
/// let (f, _) = wire::decode(&frames[used..], 1 << 20).unwrap().unwrap();
/// assert_eq!(f, Frame::Data { flags: wire::FLAG_OOB | wire::FLAG_RELIABLE, seq: Some(8), payload: b"bc" });
/// ```
pub fn number_frames(frames: &mut [u8], first: u64) -> u64 {
    let mut at = 0;
    let mut seq = first;
    while let Some(next) = next_numbered(frames, at) {
        frames[at + HEADER_BYTES..at + HEADER_BYTES + 8].copy_from_slice(&seq.to_le_bytes());
        seq += 1;
        at = next;
    }
    debug_assert_eq!(at, frames.len(), "frames encoded back to back, whole");
    seq - first
}

/// The reliable data frames of `frames` (written by [`encode_unnumbered`], back to back), in
/// order: each one's flags and where its payload lies.
pub fn numbered_frames(frames: &[u8]) -> NumberedFrames<'_> {
    NumberedFrames { frames, at: 0 }
}

/// Bytes the first `n` reliable data frames of `frames` take (written by
/// [`encode_unnumbered`], back to back): where frame `n + 1` starts.
pub fn numbered_frames_len(frames: &[u8], n: u64) -> usize {
    let mut at = 0;
    for _ in 0..n {
        match next_numbered(frames, at) {
            Some(next) => at = next,
            None => break,
        }
    }
    at
}

/// Iterator of [`numbered_frames`]: `(flags, payload range)` per frame.
#[derive(Debug)]
pub struct NumberedFrames<'a> {
    frames: &'a [u8],
    at: usize,
}

impl Iterator for NumberedFrames<'_> {
    type Item = (u8, std::ops::Range<usize>);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let at = self.at;
        let next = next_numbered(self.frames, at)?;
        self.at = next;
        Some((self.frames[at + LEN_BYTES + 1], at + HEADER_BYTES + 8..next))
    }
}

/// Where the reliable data frame at `at` of `frames` ends, or `None` at the end (or at
/// anything but a whole reliable data frame: not what [`encode_unnumbered`] writes).
#[inline]
fn next_numbered(frames: &[u8], at: usize) -> Option<usize> {
    let header = frames.get(at..at + HEADER_BYTES + 8)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let end = at + LEN_BYTES + len;
    let whole = header[LEN_BYTES] == kind::DATA
        && header[LEN_BYTES + 1] & FLAG_RELIABLE != 0
        && len >= 2 + 8
        && end <= frames.len();
    debug_assert!(whole, "not a whole reliable data frame at {at}");
    whole.then_some(end)
}

/// Appends an ack frame.
pub fn encode_ack(out: &mut Vec<u8>, received: u64, credit: u64) {
    put_header(out, 16, kind::ACK, 0);
    out.extend_from_slice(&received.to_le_bytes());
    out.extend_from_slice(&credit.to_le_bytes());
}

/// Appends a credit probe.
pub fn encode_probe(out: &mut Vec<u8>) {
    put_header(out, 0, kind::PROBE, 0);
}

/// Appends a heartbeat.
pub fn encode_heartbeat(out: &mut Vec<u8>) {
    put_header(out, 0, kind::HEARTBEAT, 0);
}

/// Appends a close frame; `reason` is cut to 255 bytes at a char boundary.
pub fn encode_close(out: &mut Vec<u8>, code: CloseCode, reason: &str) {
    let mut end = reason.len().min(255);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let reason = &reason[..end];
    put_header(out, 1 + reason.len(), kind::CLOSE, 0);
    out.push(code as u8);
    out.extend_from_slice(reason.as_bytes());
}

fn identity_len(id: &Identity<'_>) -> usize {
    4 + 2 + 8 + 8 + 4 + 1 + id.cluster.len() + 1 + id.name.len()
}

/// Bytes of the authentication trailer: the scheme byte, then the nonce and/or MAC.
fn auth_len(nonce: bool, mac: bool) -> usize {
    1 + if nonce { NONCE_LEN } else { 0 } + if mac { MAC_LEN } else { 0 }
}

fn put_auth(out: &mut Vec<u8>, nonce: Option<&Nonce>, mac: Option<&Mac>) {
    if nonce.is_none() && mac.is_none() {
        out.push(AUTH_NONE);
        return;
    }
    out.push(AUTH_HMAC_SHA256);
    if let Some(n) = nonce {
        out.extend_from_slice(n);
    }
    if let Some(m) = mac {
        out.extend_from_slice(m);
    }
}

fn put_identity(out: &mut Vec<u8>, id: &Identity<'_>) {
    debug_assert!(id.cluster.len() <= MAX_NAME && id.name.len() <= MAX_NAME);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&id.version.to_le_bytes());
    out.extend_from_slice(&id.launch_id.to_le_bytes());
    out.extend_from_slice(&id.window.to_le_bytes());
    out.extend_from_slice(&id.max_message.to_le_bytes());
    out.push(id.cluster.len() as u8);
    out.extend_from_slice(id.cluster.as_bytes());
    out.push(id.name.len() as u8);
    out.extend_from_slice(id.name.as_bytes());
}

/// Appends handshake step 1. With `id.nonce` the trailer is `AUTH_HMAC_SHA256` and the
/// nonce, else `AUTH_NONE`.
pub fn encode_hello(out: &mut Vec<u8>, id: &Identity<'_>) {
    let auth = auth_len(id.nonce.is_some(), false);
    put_header(out, identity_len(id) + auth, kind::HELLO, 0);
    put_identity(out, id);
    put_auth(out, id.nonce.as_ref(), None);
}

/// Appends handshake step 2. `mac` must be `Some` iff `id.nonce` is (the MAC is the
/// frame's last [`MAC_LEN`] bytes, so a caller computing it over the frame can encode a
/// placeholder and overwrite it).
pub fn encode_hello_reply(
    out: &mut Vec<u8>,
    id: &Identity<'_>,
    received: u64,
    connections: u64,
    unreliable: u64,
    mac: Option<&Mac>,
) {
    debug_assert_eq!(
        id.nonce.is_some(),
        mac.is_some(),
        "nonce and MAC go together"
    );
    let auth = auth_len(id.nonce.is_some(), mac.is_some());
    put_header(out, identity_len(id) + 24 + auth, kind::HELLO_REPLY, 0);
    put_identity(out, id);
    out.extend_from_slice(&received.to_le_bytes());
    out.extend_from_slice(&connections.to_le_bytes());
    out.extend_from_slice(&unreliable.to_le_bytes());
    put_auth(out, id.nonce.as_ref(), mac);
}

/// Appends handshake step 3; `mac`, if any, is the frame's last [`MAC_LEN`] bytes.
pub fn encode_ready(out: &mut Vec<u8>, received: u64, unreliable: u64, mac: Option<&Mac>) {
    put_header(out, 16 + auth_len(false, mac.is_some()), kind::READY, 0);
    out.extend_from_slice(&received.to_le_bytes());
    out.extend_from_slice(&unreliable.to_le_bytes());
    put_auth(out, None, mac);
}

/// Appends `frame` encoded exactly as the `encode_*` functions do. Decoding is strict (no
/// trailing bytes, no unused flags, one encoding per value), so for a frame decoded from a
/// buffer this reproduces its bytes: the handshake uses it to authenticate the frames it
/// received byte for byte.
pub fn encode_frame(out: &mut Vec<u8>, frame: &Frame<'_>) {
    match frame {
        Frame::Hello(id) => encode_hello(out, id),
        Frame::HelloReply(id, r, c, u, mac) => {
            encode_hello_reply(out, id, *r, *c, *u, mac.as_ref())
        }
        Frame::Ready {
            received,
            unreliable,
            mac,
        } => encode_ready(out, *received, *unreliable, mac.as_ref()),
        Frame::Data {
            flags,
            seq,
            payload,
        } => encode_data(out, *flags, *seq, payload),
        Frame::Ack { received, credit } => encode_ack(out, *received, *credit),
        Frame::Probe => encode_probe(out),
        Frame::Heartbeat => encode_heartbeat(out),
        Frame::Close { code, reason } => {
            // A code byte outside the table decodes as `Other`; re-encoded it is 255.
            put_header(out, 1 + reason.len(), kind::CLOSE, 0);
            out.push(*code as u8);
            out.extend_from_slice(reason.as_bytes());
        }
    }
}

/// A cursor over a frame body that never reads past its end.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Malformed(what));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn name(&mut self, what: &'static str) -> Result<&'a str, WireError> {
        let n = self.u8(what)? as usize;
        let b = self.take(n, what)?;
        std::str::from_utf8(b).map_err(|_| WireError::Malformed("name is not UTF-8"))
    }
    fn end(&self) -> Result<(), WireError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(WireError::Malformed("trailing bytes in frame"))
        }
    }
}

fn identity<'a>(r: &mut Reader<'a>) -> Result<Identity<'a>, WireError> {
    if r.take(4, "handshake magic")? != MAGIC {
        return Err(WireError::BadMagic);
    }
    Ok(Identity {
        version: r.u16("version")?,
        launch_id: r.u64("launch id")?,
        window: r.u64("window")?,
        max_message: r.u32("max message")?,
        cluster: r.name("cluster name")?,
        name: r.name("member name")?,
        nonce: None,
    })
}

/// Reads the authentication trailer: `Ok(false)` for `AUTH_NONE`, `Ok(true)` for
/// `AUTH_HMAC_SHA256` (the caller then reads the nonce and/or MAC).
fn auth_scheme(r: &mut Reader<'_>) -> Result<bool, WireError> {
    match r.u8("authentication scheme")? {
        AUTH_NONE => Ok(false),
        AUTH_HMAC_SHA256 => Ok(true),
        _ => Err(WireError::Malformed("unknown authentication scheme")),
    }
}

fn array32(r: &mut Reader<'_>, what: &'static str) -> Result<[u8; 32], WireError> {
    let mut a = [0u8; 32];
    a.copy_from_slice(r.take(32, what)?);
    Ok(a)
}

/// Reads the length prefix of the frame at the start of `buf`, if complete, checking it
/// against `max_len` (the bytes after the prefix) before anything is allocated for it.
#[inline]
pub fn peek_len(buf: &[u8], max_len: usize) -> Result<Option<usize>, WireError> {
    if buf.len() < LEN_BYTES {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > max_len {
        return Err(WireError::TooLarge { len, max: max_len });
    }
    if len < 2 {
        return Err(WireError::Malformed("frame shorter than its header"));
    }
    Ok(Some(len))
}

/// Decodes the frame at the start of `buf`. Returns `Ok(None)` when `buf` holds only part
/// of a frame, or `Ok(Some((frame, bytes_used)))`. `max_len` bounds the length prefix.
pub fn decode(buf: &[u8], max_len: usize) -> Result<Option<(Frame<'_>, usize)>, WireError> {
    let Some(len) = peek_len(buf, max_len)? else {
        return Ok(None);
    };
    let total = LEN_BYTES + len;
    if buf.len() < total {
        return Ok(None);
    }
    let frame = decode_body(
        buf[LEN_BYTES],
        buf[LEN_BYTES + 1],
        &buf[HEADER_BYTES..total],
    )?;
    Ok(Some((frame, total)))
}

/// A frame split off a read buffer by [`split_frame`]. It owns its bytes without copying
/// them: they share the read buffer's allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Split {
    /// An application message, split without building a [`Frame`] (the hot path: its
    /// header is checked exactly as [`decode_body`] checks it).
    Data {
        /// [`FLAG_OOB`] | [`FLAG_RELIABLE`].
        flags: u8,
        /// Sequence number, present iff reliable.
        seq: Option<u64>,
        /// The message bytes.
        payload: Bytes,
    },
    /// Any other frame, whole (length prefix included): decode it with [`decode`].
    Control(Bytes),
}

/// Splits the first complete frame off the front of `buf`, its length prefix checked
/// against `max_len` before anything is allocated for it. Returns `Ok(None)` while `buf`
/// holds only part of a frame.
///
/// Frames are split one at a time on purpose: the bound is the one of the state the
/// connection is in when each frame is reached. A caller must handle a frame that can
/// change that state (the handshake's) before it splits the next one, whatever else the
/// same read brought in: bytes that arrived with the last handshake frame are data frames,
/// bounded by the data limit, not by the handshake's.
///
/// ```
/// use cohort::internals::wire::{self, Split};
/// let mut stream = Vec::new();
/// wire::encode_ready(&mut stream, 0, 0, None);
/// wire::encode_data(&mut stream, wire::FLAG_RELIABLE, Some(1), &[7; 1000]);
/// let mut buf = bytes::BytesMut::from(&stream[..]);
/// // Until the handshake completes, frames are bounded by the handshake's size...
/// let ready = wire::split_frame(&mut buf, wire::MAX_HANDSHAKE_FRAME).unwrap().unwrap();
/// assert!(matches!(ready, Split::Control(_)));
/// // ...and from the frame after `Ready` on, by the data limit.
/// let data = wire::split_frame(&mut buf, wire::max_frame_len(1 << 20)).unwrap().unwrap();
/// assert!(matches!(data, Split::Data { seq: Some(1), .. }));
/// assert!(buf.is_empty());
/// ```
pub fn split_frame(buf: &mut BytesMut, max_len: usize) -> Result<Option<Split>, WireError> {
    match peek_frame(buf, max_len)? {
        None => Ok(None),
        Some(Peek::Control { total }) => Ok(Some(Split::Control(buf.split_to(total).freeze()))),
        Some(Peek::Data {
            flags,
            seq,
            header,
            total,
        }) => {
            let mut frame = buf.split_to(total);
            frame.advance(header);
            Ok(Some(Split::Data {
                flags,
                seq,
                payload: frame.freeze(),
            }))
        }
    }
}

/// The first complete frame at the front of a read buffer, found by [`peek_frame`]
/// without taking it off: where it ends, and for a data frame its header, checked as
/// [`split_frame`] checks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peek {
    /// An application message: its payload is `buf[header..total]`.
    Data {
        /// [`FLAG_OOB`] | [`FLAG_RELIABLE`] | [`FLAG_REQUEST`] | [`FLAG_REPLY`] |
        /// [`FLAG_STATUS`].
        flags: u8,
        /// Sequence number, present iff reliable.
        seq: Option<u64>,
        /// Bytes before the payload: length prefix, kind, flags, sequence number.
        header: usize,
        /// Bytes of the whole frame, length prefix included.
        total: usize,
    },
    /// Any other frame, `buf[..total]` whole: decode it with [`decode`].
    Control {
        /// Bytes of the whole frame, length prefix included.
        total: usize,
    },
}

/// A regular data frame found by [`peek_regular`]: its payload is `buf[header..total]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regular {
    /// Sequence number, present iff reliable.
    pub seq: Option<u64>,
    /// Bytes before the payload: length prefix, kind, flags, sequence number.
    pub header: usize,
    /// Bytes of the whole frame, length prefix included.
    pub total: usize,
}

/// [`peek_frame`] narrowed to what a receive loop over a run of regular messages takes: the
/// first frame of `buf` if it is complete and a well-formed regular data frame (flags
/// [`FLAG_RELIABLE`] or none: no request, reply, status or out-of-band flag), `None` for
/// anything else — a partial frame, another kind, a tagged or out-of-band data frame, or a
/// frame [`peek_frame`] refuses (which it then reports). A frame it returns is one
/// [`peek_frame`] returns as `Peek::Data` with the same fields.
// Inlined, and checking only what a regular frame needs: once per message in the
// receiving IO thread's loop (`Remote::admit_run`).
#[inline]
pub fn peek_regular(buf: &[u8], max_len: usize) -> Option<Regular> {
    let head = buf.get(..HEADER_BYTES)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    // A length below 2 or above `max_len`, or another kind: `peek_frame`'s to judge.
    if len > max_len || len < 2 || head[LEN_BYTES] != kind::DATA {
        return None;
    }
    let total = LEN_BYTES + len;
    if buf.len() < total {
        return None;
    }
    match head[LEN_BYTES + 1] {
        0 => Some(Regular {
            seq: None,
            header: HEADER_BYTES,
            total,
        }),
        FLAG_RELIABLE if len >= 2 + 8 => {
            let mut s = [0u8; 8];
            s.copy_from_slice(buf.get(HEADER_BYTES..HEADER_BYTES + 8)?);
            let s = u64::from_le_bytes(s);
            (s != 0).then_some(Regular {
                seq: Some(s),
                header: HEADER_BYTES + 8,
                total,
            })
        }
        _ => None,
    }
}

/// The frame at the front of `buf`, read as the regular data frame that [`peek_regular`]
/// found there before: its length and its flags' reliable bit, nothing checked again (a
/// deliverer walks the frames of a run its IO thread checked). `None` only where `buf`
/// ends before the frame does.
#[inline]
pub fn read_regular(buf: &[u8]) -> Option<Regular> {
    let head = buf.get(..HEADER_BYTES)?;
    let total = LEN_BYTES + u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if buf.len() < total {
        return None;
    }
    if head[LEN_BYTES + 1] & FLAG_RELIABLE == 0 {
        return Some(Regular {
            seq: None,
            header: HEADER_BYTES,
            total,
        });
    }
    let s = buf.get(HEADER_BYTES..HEADER_BYTES + 8)?;
    let seq = u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]);
    Some(Regular {
        seq: Some(seq),
        header: HEADER_BYTES + 8,
        total,
    })
}

/// Finds the first complete frame at the front of `buf` (its length prefix checked against
/// `max_len`, a data frame's header exactly as [`split_frame`] checks it) without taking
/// it off: a reader can find every frame of a read first and take them off together.
/// Returns `Ok(None)` while `buf` holds only part of a frame.
pub fn peek_frame(buf: &[u8], max_len: usize) -> Result<Option<Peek>, WireError> {
    let Some(len) = peek_len(buf, max_len)? else {
        return Ok(None);
    };
    let total = LEN_BYTES + len;
    if buf.len() < total {
        return Ok(None);
    }
    let (kind, flags) = (buf[LEN_BYTES], buf[LEN_BYTES + 1]);
    if kind != kind::DATA {
        return Ok(Some(Peek::Control { total }));
    }
    let seq_bytes = if flags & FLAG_RELIABLE != 0 { 8 } else { 0 };
    check_data_flags(
        flags,
        buf.get(HEADER_BYTES + seq_bytes..total).unwrap_or_default(),
    )?;
    let seq = if flags & FLAG_RELIABLE != 0 {
        if len < 2 + 8 {
            return Err(WireError::Malformed("sequence number"));
        }
        let mut s = [0u8; 8];
        s.copy_from_slice(&buf[HEADER_BYTES..HEADER_BYTES + 8]);
        let s = u64::from_le_bytes(s);
        if s == 0 {
            return Err(WireError::Malformed("sequence number 0"));
        }
        Some(s)
    } else {
        None
    };
    Ok(Some(Peek::Data {
        flags,
        seq,
        header: HEADER_BYTES + seq_bytes,
        total,
    }))
}

/// Decodes one frame body (what follows kind and flags).
pub fn decode_body(kind: u8, flags: u8, body: &[u8]) -> Result<Frame<'_>, WireError> {
    let mut r = Reader { buf: body };
    let frame = match kind {
        kind::DATA => {
            let seq_bytes = if flags & FLAG_RELIABLE != 0 { 8 } else { 0 };
            check_data_flags(flags, r.buf.get(seq_bytes..).unwrap_or_default())?;
            let seq = if flags & FLAG_RELIABLE != 0 {
                let s = r.u64("sequence number")?;
                if s == 0 {
                    return Err(WireError::Malformed("sequence number 0"));
                }
                Some(s)
            } else {
                None
            };
            return Ok(Frame::Data {
                flags,
                seq,
                payload: r.buf,
            });
        }
        kind::ACK => Frame::Ack {
            received: r.u64("ack received")?,
            credit: r.u64("ack credit")?,
        },
        kind::PROBE => Frame::Probe,
        kind::HEARTBEAT => Frame::Heartbeat,
        kind::CLOSE => {
            let code = CloseCode::from_u8(r.u8("close code")?);
            let reason = std::str::from_utf8(r.buf)
                .map_err(|_| WireError::Malformed("close reason is not UTF-8"))?;
            return Ok(Frame::Close { code, reason });
        }
        kind::HELLO | kind::HELLO_REPLY => {
            let mut id = identity(&mut r)?;
            if id.version != VERSION {
                // Another version's layout past the identity is unknown: stop here, so the
                // handshake refuses it with `Close{Version}` rather than as malformed.
                return Ok(if kind == kind::HELLO {
                    Frame::Hello(id)
                } else {
                    Frame::HelloReply(id, 0, 0, 0, None)
                });
            }
            if kind == kind::HELLO {
                if auth_scheme(&mut r)? {
                    id.nonce = Some(array32(&mut r, "nonce")?);
                }
                Frame::Hello(id)
            } else {
                let received = r.u64("received count")?;
                let connections = r.u64("connection count")?;
                let unreliable = r.u64("unreliable received")?;
                let mut mac = None;
                if auth_scheme(&mut r)? {
                    id.nonce = Some(array32(&mut r, "nonce")?);
                    mac = Some(array32(&mut r, "MAC")?);
                }
                Frame::HelloReply(id, received, connections, unreliable, mac)
            }
        }
        kind::READY => {
            let received = r.u64("received count")?;
            let unreliable = r.u64("unreliable received")?;
            let mac = if auth_scheme(&mut r)? {
                Some(array32(&mut r, "MAC")?)
            } else {
                None
            };
            Frame::Ready {
                received,
                unreliable,
                mac,
            }
        }
        other => return Err(WireError::UnknownKind(other)),
    };
    if flags != 0 {
        return Err(WireError::Malformed("flags on a control frame"));
    }
    r.end()?;
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roundtrip(buf: &[u8]) -> Frame<'_> {
        let (f, used) = decode(buf, 1 << 20).unwrap().unwrap();
        assert_eq!(used, buf.len());
        f
    }

    #[test]
    fn every_kind_roundtrips() {
        let id = Identity {
            version: VERSION,
            launch_id: 42,
            window: 1 << 20,
            max_message: 1 << 19,
            cluster: "demo",
            name: "alpha",
            nonce: None,
        };
        let mut b = Vec::new();
        encode_hello(&mut b, &id);
        assert_eq!(roundtrip(&b), Frame::Hello(id.clone()));
        b.clear();
        encode_hello_reply(&mut b, &id, 9, 2, 80, None);
        assert_eq!(roundtrip(&b), Frame::HelloReply(id.clone(), 9, 2, 80, None));
        b.clear();
        encode_ready(&mut b, 3, 160, None);
        assert_eq!(
            roundtrip(&b),
            Frame::Ready {
                received: 3,
                unreliable: 160,
                mac: None
            }
        );
        // With the authentication trailer.
        let authed = Identity {
            nonce: Some([7; NONCE_LEN]),
            ..id
        };
        b.clear();
        encode_hello(&mut b, &authed);
        assert_eq!(
            b.len(),
            HEADER_BYTES + identity_len(&authed) + 1 + NONCE_LEN
        );
        assert_eq!(roundtrip(&b), Frame::Hello(authed.clone()));
        b.clear();
        encode_hello_reply(&mut b, &authed, 9, 2, 80, Some(&[9; MAC_LEN]));
        assert_eq!(&b[b.len() - MAC_LEN..], &[9; MAC_LEN]);
        assert_eq!(
            roundtrip(&b),
            Frame::HelloReply(authed, 9, 2, 80, Some([9; MAC_LEN]))
        );
        b.clear();
        encode_ready(&mut b, 3, 160, Some(&[5; MAC_LEN]));
        assert_eq!(
            roundtrip(&b),
            Frame::Ready {
                received: 3,
                unreliable: 160,
                mac: Some([5; MAC_LEN])
            }
        );
        b.clear();
        encode_ack(&mut b, 5, 77);
        assert_eq!(
            roundtrip(&b),
            Frame::Ack {
                received: 5,
                credit: 77
            }
        );
        b.clear();
        encode_probe(&mut b);
        assert_eq!(roundtrip(&b), Frame::Probe);
        b.clear();
        encode_heartbeat(&mut b);
        assert_eq!(roundtrip(&b), Frame::Heartbeat);
        b.clear();
        encode_close(&mut b, CloseCode::Cluster, "wrong cluster");
        assert_eq!(
            roundtrip(&b),
            Frame::Close {
                code: CloseCode::Cluster,
                reason: "wrong cluster"
            }
        );
    }

    fn small_id() -> Identity<'static> {
        Identity {
            version: VERSION,
            launch_id: 1,
            window: 1,
            max_message: 1,
            cluster: "c",
            name: "n",
            nonce: None,
        }
    }

    /// A version-1 `Hello` (no authentication trailer) decodes up to its identity, so the
    /// handshake can refuse it as another version rather than as malformed.
    #[test]
    fn another_version_decodes_up_to_the_identity() {
        let mut b = Vec::new();
        encode_hello(
            &mut b,
            &Identity {
                version: 1,
                ..small_id()
            },
        );
        b.truncate(b.len() - 1); // v1 had no trailer
        let len = (b.len() - LEN_BYTES) as u32;
        b[..LEN_BYTES].copy_from_slice(&len.to_le_bytes());
        match decode(&b, 1024) {
            Ok(Some((Frame::Hello(id), n))) => {
                assert_eq!((id.version, n), (1, b.len()));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn largest_handshake_frames_fit_the_bound() {
        let long = "x".repeat(MAX_NAME);
        let id = Identity {
            cluster: &long,
            name: &long,
            nonce: Some([0; NONCE_LEN]),
            ..small_id()
        };
        let mut b = Vec::new();
        encode_hello_reply(&mut b, &id, 1, 1, 1, Some(&[0; MAC_LEN]));
        assert!(b.len() - LEN_BYTES <= 2 + MAX_HANDSHAKE_BODY);
        assert_eq!(MAX_HANDSHAKE_BODY, 691);
    }

    /// Requests and replies carry their id behind the sequence number; the flags that
    /// cannot go together, an unreliable one, and one too short for its id are refused by
    /// both decoders.
    #[test]
    fn request_and_reply_flags_are_checked() {
        let id = 0x0102_0304_0506_0708u64.to_le_bytes();
        let mut header = id.to_vec();
        header.extend_from_slice(&1000u32.to_le_bytes());
        let ok = [
            (FLAG_RELIABLE | FLAG_REQUEST, &header[..]),
            (FLAG_RELIABLE | FLAG_REQUEST | FLAG_OOB, &header[..]),
            (FLAG_RELIABLE | FLAG_REPLY, &id[..]),
        ];
        for (flags, body) in ok {
            let mut b = Vec::new();
            encode_data(&mut b, flags, Some(3), body);
            assert!(decode(&b, 1024).is_ok(), "flags {flags:#x}");
            let mut buf = BytesMut::from(&b[..]);
            match split_frame(&mut buf, 1024) {
                Ok(Some(Split::Data { payload, .. })) => {
                    assert_eq!(request_id(&payload), Some(0x0102_0304_0506_0708))
                }
                other => panic!("flags {flags:#x}: {other:?}"),
            }
        }
        assert_eq!(request_room(&header), Some(1000));
        let bad: [(u8, Option<u64>, &[u8], &str); 5] = [
            (
                FLAG_REQUEST,
                None,
                &header[..],
                "unreliable request or reply",
            ),
            (FLAG_RELIABLE | FLAG_REQUEST, Some(1), &id[..], "request id"),
            (
                FLAG_RELIABLE | FLAG_REQUEST | FLAG_REPLY,
                Some(1),
                &id[..],
                "both request and reply",
            ),
            (
                FLAG_RELIABLE | FLAG_REPLY | FLAG_OOB,
                Some(1),
                &id[..],
                "out-of-band reply",
            ),
            (FLAG_RELIABLE | FLAG_REPLY, Some(1), &id[..7], "request id"),
        ];
        for (flags, seq, body, why) in bad {
            let mut b = Vec::new();
            // Bypass encode_data's check: a hostile peer writes what it likes.
            b.extend_from_slice(&((2 + seq.map_or(0, |_| 8) + body.len()) as u32).to_le_bytes());
            b.extend_from_slice(&[kind::DATA, flags]);
            if let Some(s) = seq {
                b.extend_from_slice(&s.to_le_bytes());
            }
            b.extend_from_slice(body);
            assert_eq!(decode(&b, 1024), Err(WireError::Malformed(why)), "{why}");
            let mut buf = BytesMut::from(&b[..]);
            assert_eq!(
                split_frame(&mut buf, 1024).map(|_| ()),
                Err(WireError::Malformed(why)),
                "{why}"
            );
        }
    }

    /// A reply may carry a status instead of a payload: every status goes through both
    /// decoders and back; a status flag without the reply flag, a status too short for its
    /// code's fields or longer than them is refused; an unknown code is `Other`.
    #[test]
    fn reply_statuses_roundtrip_and_are_checked() {
        let statuses = [
            ReplyStatus::TooLarge {
                len: 20_000,
                room: 16_384,
            },
            ReplyStatus::TooLarge {
                len: u64::MAX,
                room: u32::MAX,
            },
            ReplyStatus::Unanswered,
            ReplyStatus::Panicked,
            ReplyStatus::NoHandler,
            ReplyStatus::Other(0),
            ReplyStatus::Other(200),
        ];
        let flags = FLAG_RELIABLE | FLAG_REPLY | FLAG_STATUS;
        for status in statuses {
            let mut body = 7u64.to_le_bytes().to_vec();
            body.extend_from_slice(&encode_reply_status(status));
            let mut b = Vec::new();
            encode_data(&mut b, flags, Some(9), &body);
            let f = roundtrip(&b);
            assert_eq!(
                f,
                Frame::Data {
                    flags,
                    seq: Some(9),
                    payload: &body
                }
            );
            assert_eq!(decode_reply_status(&body[8..]), Ok(status));
            let mut again = Vec::new();
            encode_frame(&mut again, &f);
            assert_eq!(again, b);
            let mut buf = BytesMut::from(&b[..]);
            match split_frame(&mut buf, 1024) {
                Ok(Some(Split::Data { payload, .. })) => {
                    assert_eq!(request_id(&payload), Some(7));
                    assert_eq!(decode_reply_status(&payload[8..]), Ok(status));
                }
                other => panic!("{status:?}: {other:?}"),
            }
        }
        // The documented bytes of a "too large" status (docs/wire.md).
        assert_eq!(
            encode_reply_status(ReplyStatus::TooLarge {
                len: 20_000,
                room: 16_384
            }),
            [1, 0x20, 0x4e, 0, 0, 0, 0, 0, 0, 0, 0x40, 0, 0]
        );
        assert_eq!(encode_reply_status(ReplyStatus::Unanswered), [2]);
        let mut body = 7u64.to_le_bytes().to_vec();
        body.extend_from_slice(&encode_reply_status(ReplyStatus::TooLarge {
            len: 20_000,
            room: 16_384,
        }));
        let mut frame = Vec::new();
        encode_data(&mut frame, flags, Some(9), &body);
        assert_eq!(
            frame,
            [
                0x1f, 0, 0, 0, 0x10, 0x1a, 9, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 1, 0x20,
                0x4e, 0, 0, 0, 0, 0, 0, 0, 0x40, 0, 0
            ]
        );
        // An unknown code's further bytes are not read.
        assert_eq!(decode_reply_status(&[9, 1, 2]), Ok(ReplyStatus::Other(9)));
        let id = 7u64.to_le_bytes();
        let with = |tail: &[u8]| [&id[..], tail].concat();
        let bad: [(u8, Vec<u8>, &str); 6] = [
            (
                FLAG_RELIABLE | FLAG_STATUS,
                with(&[2]),
                "status without reply",
            ),
            (
                FLAG_RELIABLE | FLAG_REQUEST | FLAG_STATUS,
                [&with(&[0; 4])[..], &[2]].concat(),
                "status without reply",
            ),
            (
                FLAG_RELIABLE | FLAG_REPLY | FLAG_STATUS,
                with(&[]),
                "reply status",
            ),
            (
                FLAG_RELIABLE | FLAG_REPLY | FLAG_STATUS,
                with(&[1, 0, 0, 0, 0, 0, 0, 0, 0]),
                "reply status room",
            ),
            (
                FLAG_RELIABLE | FLAG_REPLY | FLAG_STATUS,
                with(&[2, 0]),
                "trailing bytes in reply status",
            ),
            (
                FLAG_RELIABLE | FLAG_REPLY | FLAG_STATUS,
                id[..5].to_vec(),
                "request id",
            ),
        ];
        for (flags, body, why) in bad {
            let mut b = Vec::new();
            b.extend_from_slice(&((2 + 8 + body.len()) as u32).to_le_bytes());
            b.extend_from_slice(&[kind::DATA, flags]);
            b.extend_from_slice(&1u64.to_le_bytes());
            b.extend_from_slice(&body);
            assert_eq!(decode(&b, 1024), Err(WireError::Malformed(why)), "{why}");
            let mut buf = BytesMut::from(&b[..]);
            assert_eq!(
                split_frame(&mut buf, 1024).map(|_| ()),
                Err(WireError::Malformed(why)),
                "{why}"
            );
        }
    }

    #[test]
    fn partial_frames_wait_for_more() {
        let mut b = Vec::new();
        encode_data(&mut b, FLAG_RELIABLE, Some(1), b"hello");
        for cut in 0..b.len() {
            assert_eq!(decode(&b[..cut], 1024).unwrap(), None, "cut at {cut}");
        }
    }

    #[test]
    fn oversized_length_is_refused_before_allocation() {
        let b = (u32::MAX).to_le_bytes();
        assert_eq!(
            decode(&b, 1024),
            Err(WireError::TooLarge {
                len: u32::MAX as usize,
                max: 1024
            })
        );
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        // Unknown kind.
        assert_eq!(
            decode(&[2, 0, 0, 0, 0x7f, 0], 64),
            Err(WireError::UnknownKind(0x7f))
        );
        // Ack too short.
        assert!(matches!(
            decode(&[3, 0, 0, 0, kind::ACK, 0, 1], 64),
            Err(WireError::Malformed(_))
        ));
        // Reliable data without a seq.
        assert!(matches!(
            decode(&[2, 0, 0, 0, kind::DATA, FLAG_RELIABLE], 64),
            Err(WireError::Malformed(_))
        ));
        // Hello with bad magic.
        let mut b = Vec::new();
        encode_hello(&mut b, &small_id());
        b[HEADER_BYTES] = b'X';
        assert_eq!(decode(&b, 1024), Err(WireError::BadMagic));
        // Unknown authentication scheme.
        let mut b = Vec::new();
        encode_ready(&mut b, 1, 2, None);
        let last = b.len() - 1;
        b[last] = 2;
        assert_eq!(
            decode(&b, 1024),
            Err(WireError::Malformed("unknown authentication scheme"))
        );
        // A nonce cut short.
        let mut b = Vec::new();
        encode_hello(
            &mut b,
            &Identity {
                nonce: Some([1; NONCE_LEN]),
                ..small_id()
            },
        );
        b.truncate(b.len() - 1);
        let len = (b.len() - LEN_BYTES) as u32;
        b[..LEN_BYTES].copy_from_slice(&len.to_le_bytes());
        assert_eq!(decode(&b, 1024), Err(WireError::Malformed("nonce")));
        // Length below the header.
        assert!(matches!(
            decode(&[1, 0, 0, 0, 0], 64),
            Err(WireError::Malformed(_))
        ));
    }

    proptest! {
        /// `peek_regular` returns exactly the frames `peek_frame` finds as regular data
        /// (no request, reply or out-of-band flag), with the same fields, and nothing else.
        #[test]
        fn peek_regular_agrees_with_peek_frame(
            len in prop_oneof![0u32..40, any::<u32>()],
            kind_byte in prop_oneof![Just(kind::DATA), any::<u8>()],
            flags in prop_oneof![Just(0u8), Just(FLAG_RELIABLE), any::<u8>()],
            seq in prop_oneof![Just(0u64), any::<u64>()],
            tail in proptest::collection::vec(any::<u8>(), 0..40),
            max in 0usize..64,
        ) {
            let mut b = Vec::new();
            b.extend_from_slice(&len.to_le_bytes());
            b.push(kind_byte);
            b.push(flags);
            b.extend_from_slice(&seq.to_le_bytes());
            b.extend_from_slice(&tail);
            for cut in [b.len(), 4, 5, 6, 13, 14] {
                let buf = &b[..cut.min(b.len())];
                let want = match peek_frame(buf, max) {
                    Ok(Some(Peek::Data { flags, seq, header, total }))
                        if flags & (FLAG_REQUEST | FLAG_REPLY | FLAG_OOB) == 0 =>
                    {
                        Some(Regular { seq, header, total })
                    }
                    _ => None,
                };
                prop_assert_eq!(peek_regular(buf, max), want);
                if let Some(found) = want {
                    prop_assert_eq!(read_regular(buf), Some(found));
                }
            }
        }

        #[test]
        fn data_roundtrips(payload in proptest::collection::vec(any::<u8>(), 0..2048),
                           seq in 1u64.., oob in any::<bool>(), reliable in any::<bool>()) {
            let flags = if oob { FLAG_OOB } else { 0 } | if reliable { FLAG_RELIABLE } else { 0 };
            let seq = reliable.then_some(seq);
            let mut b = Vec::new();
            encode_data(&mut b, flags, seq, &payload);
            prop_assert_eq!(b.len(), data_frame_len(reliable, payload.len()));
            let (f, used) = decode(&b, max_frame_len(4096)).unwrap().unwrap();
            prop_assert_eq!(used, b.len());
            prop_assert_eq!(f, Frame::Data { flags, seq, payload: &payload });
        }

        /// Decoding is canonical: a frame decoded from bytes encodes back to the same bytes
        /// (the handshake MACs received frames by re-encoding them).
        #[test]
        fn decoded_frames_encode_to_their_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512),
                                                kind_byte in prop_oneof![Just(kind::HELLO), Just(kind::HELLO_REPLY), Just(kind::READY), any::<u8>()],
                                                auth in any::<bool>(), version in prop_oneof![Just(VERSION), any::<u16>()]) {
            // Mostly well-formed handshake frames, mutated in their tail bytes.
            let id = Identity { version, nonce: auth.then_some([3; NONCE_LEN]), ..small_id() };
            let mut b = Vec::new();
            match kind_byte {
                kind::HELLO => encode_hello(&mut b, &id),
                kind::HELLO_REPLY => encode_hello_reply(&mut b, &id, 1, 2, 3, auth.then_some(&[4; MAC_LEN])),
                kind::READY => encode_ready(&mut b, 1, 2, auth.then_some(&[4; MAC_LEN])),
                _ => b.extend_from_slice(&bytes),
            }
            for (i, x) in bytes.iter().take(4).enumerate() {
                if b.len() > 12 + i * 7 && x & 1 == 1 {
                    let at = 12 + i * 7;
                    b[at] ^= x;
                }
            }
            if let Ok(Some((f, n))) = decode(&b, 4096) {
                let foreign = matches!(&f, Frame::Hello(id) | Frame::HelloReply(id, ..) if id.version != VERSION);
                let unknown_close = matches!(&f, Frame::Close { code: CloseCode::Other, .. });
                if !foreign && !unknown_close {
                    let mut again = Vec::new();
                    encode_frame(&mut again, &f);
                    prop_assert_eq!(&again[..], &b[..n]);
                }
            }
        }

        #[test]
        fn reply_statuses_roundtrip(code in any::<u8>(), len in any::<u64>(), room in any::<u32>(),
                                    id in any::<u64>(), seq in 1u64..) {
            let status = match code % 5 {
                0 => ReplyStatus::TooLarge { len, room },
                1 => ReplyStatus::Unanswered,
                2 => ReplyStatus::Panicked,
                3 => ReplyStatus::NoHandler,
                _ => ReplyStatus::Other(if (1..=4).contains(&code) { 0 } else { code }),
            };
            let mut body = id.to_le_bytes().to_vec();
            body.extend_from_slice(&encode_reply_status(status));
            let flags = FLAG_RELIABLE | FLAG_REPLY | FLAG_STATUS;
            let mut b = Vec::new();
            encode_data(&mut b, flags, Some(seq), &body);
            let (f, used) = decode(&b, max_frame_len(64)).unwrap().unwrap();
            prop_assert_eq!(used, b.len());
            prop_assert_eq!(f, Frame::Data { flags, seq: Some(seq), payload: &body });
            prop_assert_eq!(request_id(&body), Some(id));
            prop_assert_eq!(decode_reply_status(&body[REQUEST_ID_BYTES..]), Ok(status));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes, 256);
        }

        #[test]
        fn frames_concatenate(a in proptest::collection::vec(any::<u8>(), 0..100),
                              b in proptest::collection::vec(any::<u8>(), 0..100)) {
            let mut buf = Vec::new();
            encode_data(&mut buf, 0, None, &a);
            encode_ack(&mut buf, 1, 2);
            encode_data(&mut buf, FLAG_OOB, None, &b);
            let (f1, n1) = decode(&buf, 4096).unwrap().unwrap();
            prop_assert_eq!(f1, Frame::Data { flags: 0, seq: None, payload: &a });
            let (f2, n2) = decode(&buf[n1..], 4096).unwrap().unwrap();
            prop_assert_eq!(f2, Frame::Ack { received: 1, credit: 2 });
            let (f3, n3) = decode(&buf[n1 + n2..], 4096).unwrap().unwrap();
            prop_assert_eq!(f3, Frame::Data { flags: FLAG_OOB, seq: None, payload: &b });
            prop_assert_eq!(n1 + n2 + n3, buf.len());
        }
    }
}
