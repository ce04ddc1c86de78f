//! The membership packet: a compact binary encoding, bounded in size, authenticated with the
//! cluster secret when there is one.
//!
//! ```text
//! packet  = magic:u8 (0xC5) version:u8 (1) flags:u8 cluster:u32 from:name launch:u64
//!           incarnation:u64 kind:u8 body count:u8 claim{count} [tag:16]
//! flags   = bit 0: a tag follows (the sender has a secret); other bits zero
//! name    = len:u8 (1..=255) utf-8{len}
//! addr    = family:u8 (4 | 6) ip:4|16 port:u16
//! body    = Ping    (1): seq:u32 target:name
//!         | Ack     (2): seq:u32
//!         | PingReq (3): seq:u32 target:name addr
//!         | Nack    (4): seq:u32
//!         | Sync    (5): reply:u8 (0 | 1)
//!         | Gossip  (6): (nothing)
//! claim   = name addr launch:u64 incarnation:u64 state:u8 (0 alive, 1 suspect, 2 failed,
//!           3 left) by:u8 len, then utf-8{len} (0: none; the suspecter's name)
//! tag     = the first 16 bytes of HMAC-SHA-256(secret, "cohort membership" || every byte
//!           before the tag)
//! ```
//!
//! Integers are little-endian, as in `docs/wire.md`. A packet with every name at its 255-byte
//! maximum and one claim is at most [`MAX_ONE_CLAIM`] bytes, so any packet of
//! [`MAX_PACKET`] holds at least one claim: a sender never has to drop one for its size.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use crate::wire::MAX_NAME;

/// First byte of every membership packet.
pub const MAGIC: u8 = 0xC5;
/// The encoding's version.
pub const VERSION: u8 = 1;
/// The largest packet a member sends: under a typical path MTU, as memberlist and foca use.
pub const MAX_PACKET: usize = 1400;
/// Bytes of the truncated HMAC-SHA-256 that ends an authenticated packet.
pub const TAG_LEN: usize = 16;
/// Domain label of the packet MAC (the handshake's are "cohort dialler" / "cohort acceptor").
const LABEL: &[u8] = b"cohort membership";
/// Flag bit: a tag follows.
const FLAG_TAG: u8 = 1;

/// Bytes of an encoded name at most.
const NAME_MAX: usize = 1 + MAX_NAME;
/// Bytes of an encoded address at most.
const ADDR_MAX: usize = 1 + 16 + 2;
/// Header (magic, version, flags, cluster, from, launch, incarnation, kind) at most.
const HEADER_MAX: usize = 3 + 4 + NAME_MAX + 8 + 8 + 1;
/// The largest body (`PingReq`).
const BODY_MAX: usize = 4 + NAME_MAX + ADDR_MAX;
/// The largest claim.
pub const CLAIM_MAX: usize = NAME_MAX + ADDR_MAX + 8 + 8 + 1 + NAME_MAX;
/// The largest packet holding one claim, every name at its maximum.
pub const MAX_ONE_CLAIM: usize = HEADER_MAX + BODY_MAX + 1 + CLAIM_MAX + TAG_LEN;
const _: () = assert!(MAX_ONE_CLAIM <= MAX_PACKET);

/// What a member believes of another: the SWIM states, and a clean leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// Answering probes (or not yet found otherwise).
    Alive,
    /// A probe failed; failed unless it refutes within the suspicion timeout.
    Suspect,
    /// Declared failed after the suspicion timeout: no longer probed.
    Failed,
    /// Left the cluster on its own.
    Left,
}

impl State {
    /// Precedence among claims of one incarnation: a later state overrides an earlier one.
    pub(crate) fn rank(self) -> u8 {
        match self {
            State::Alive => 0,
            State::Suspect => 1,
            State::Failed => 2,
            State::Left => 3,
        }
    }

    fn from_byte(b: u8) -> Result<State, DecodeError> {
        Ok(match b {
            0 => State::Alive,
            1 => State::Suspect,
            2 => State::Failed,
            3 => State::Left,
            other => return Err(DecodeError::State(other)),
        })
    }
}

/// One piece of gossip: what one member's state is, at which incarnation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The member the claim is about.
    pub name: String,
    /// Where it receives membership packets.
    pub addr: SocketAddr,
    /// The process's launch id (informational: a new one is a restart).
    pub launch: u64,
    /// Its incarnation: only the member itself raises it (to refute, or on rejoining).
    pub incarnation: u64,
    /// The state claimed.
    pub state: State,
    /// For a suspicion: the member that suspects (each distinct one confirms it).
    pub by: Option<String>,
}

/// A packet's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// A probe of `target`, answered by an `Ack` with the same `seq` to the sender's address.
    Ping {
        /// The prober's sequence number.
        seq: u32,
        /// The member probed (another process at its address does not answer).
        target: String,
    },
    /// The answer to a `Ping` (or, relayed, to a `PingReq`).
    Ack {
        /// The probe's sequence number.
        seq: u32,
    },
    /// Asks the receiver to probe `target` at `addr` and relay its `Ack`.
    PingReq {
        /// The asker's sequence number, echoed in the relayed `Ack` or `Nack`.
        seq: u32,
        /// The member to probe.
        target: String,
        /// Its address.
        addr: SocketAddr,
    },
    /// The relay's probe got no answer in time (Lifeguard: tells the asker it is not the
    /// asker's own slowness).
    Nack {
        /// The asker's sequence number.
        seq: u32,
    },
    /// State exchange (join, anti-entropy, rejoin after a partition): the claims are the
    /// sender's whole view, over one or more packets; `reply` asks for the receiver's.
    Sync {
        /// Whether the receiver should answer with its own view.
        reply: bool,
    },
    /// Gossip only: the claims.
    Gossip,
}

impl Body {
    fn kind(&self) -> u8 {
        match self {
            Body::Ping { .. } => 1,
            Body::Ack { .. } => 2,
            Body::PingReq { .. } => 3,
            Body::Nack { .. } => 4,
            Body::Sync { .. } => 5,
            Body::Gossip => 6,
        }
    }
}

/// A decoded packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// The cluster's name hashed ([`cluster_hash`]).
    pub cluster: u32,
    /// The sender's member name.
    pub from: String,
    /// The sender's launch id.
    pub launch: u64,
    /// The sender's incarnation: a packet from a member is its word that it is alive at
    /// that incarnation (a refutation reaches whoever it talks to).
    pub incarnation: u64,
    /// The message.
    pub body: Body,
    /// Gossip carried along.
    pub claims: Vec<Claim>,
}

/// Why a packet was not accepted. Each is counted, and the packet ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// It ends before its fields do.
    #[error("membership packet truncated")]
    Short,
    /// Not a membership packet.
    #[error("not a membership packet (first byte {0:#04x})")]
    Magic(u8),
    /// Another version of the encoding.
    #[error("membership packet version {0}, this build speaks {VERSION}")]
    Version(u8),
    /// Unknown flag bits.
    #[error("membership packet with unknown flags {0:#04x}")]
    Flags(u8),
    /// Unknown message kind.
    #[error("membership packet of unknown kind {0}")]
    Kind(u8),
    /// Unknown member state.
    #[error("membership claim with unknown state {0}")]
    State(u8),
    /// Unknown address family.
    #[error("membership address of unknown family {0}")]
    Family(u8),
    /// An empty name, or one that is not UTF-8.
    #[error("membership packet with an empty or non-UTF-8 name")]
    Name,
    /// A boolean that is neither 0 nor 1.
    #[error("membership packet with a malformed flag byte {0}")]
    Bool(u8),
    /// Bytes after the last field.
    #[error("membership packet with {0} trailing bytes")]
    Trailing(usize),
    /// Longer than [`MAX_PACKET`].
    #[error("membership packet of {0} bytes, more than {MAX_PACKET}")]
    TooLong(usize),
    /// The sender has a secret and this member has none, or the other way round.
    #[error("membership packet {0}")]
    TagPresence(&'static str),
    /// The tag does not verify: another secret, or an altered packet.
    #[error("membership packet failed authentication (wrong secret or altered)")]
    Tag,
}

/// The cluster secret as the packets use it: its `Debug` never shows the bytes.
#[derive(Clone)]
pub struct PacketKey(Vec<u8>);

impl PacketKey {
    /// The key for a cluster secret (the bytes given to `Builder::secret`).
    pub fn new(secret: &[u8]) -> PacketKey {
        PacketKey(secret.to_vec())
    }

    fn mac(&self, bytes: &[u8]) -> Hmac<Sha256> {
        // HMAC takes keys of any length (longer ones are hashed): this never fails.
        let mut m = <Hmac<Sha256> as hmac::digest::KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        m.update(LABEL);
        m.update(bytes);
        m
    }
}

impl std::fmt::Debug for PacketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PacketKey(..)")
    }
}

/// FNV-1a (32 bits) of the cluster name: packets of another cluster are told apart without
/// carrying its name (a secret is what keeps strangers out).
pub fn cluster_hash(cluster: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in cluster.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    debug_assert!(!name.is_empty() && name.len() <= MAX_NAME);
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
}

fn put_addr(out: &mut Vec<u8>, addr: &SocketAddr) {
    match addr.ip() {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&addr.port().to_le_bytes());
}

fn put_claim(out: &mut Vec<u8>, c: &Claim) {
    put_name(out, &c.name);
    put_addr(out, &c.addr);
    out.extend_from_slice(&c.launch.to_le_bytes());
    out.extend_from_slice(&c.incarnation.to_le_bytes());
    out.push(c.state as u8);
    match &c.by {
        Some(by) => put_name(out, by),
        None => out.push(0),
    }
}

/// The encoded size of a claim.
pub fn claim_len(c: &Claim) -> usize {
    let ip = if c.addr.is_ipv4() { 4 } else { 16 };
    1 + c.name.len() + 1 + ip + 2 + 8 + 8 + 1 + 1 + c.by.as_ref().map_or(0, String::len)
}

/// Builds one packet: the header and body, then claims while they fit, then the tag.
#[derive(Debug)]
pub struct Encoder {
    buf: Vec<u8>,
    count_at: usize,
    count: u8,
    limit: usize,
}

impl Encoder {
    /// A packet from `from` (launch `launch`, at `incarnation`) of the cluster hashed as
    /// `cluster`, at most
    /// `max` bytes (at least [`MAX_ONE_CLAIM`] is used, at most [`MAX_PACKET`]); `tagged`:
    /// whether [`Encoder::finish`] will be given a key.
    pub fn new(
        cluster: u32,
        from: &str,
        launch: u64,
        incarnation: u64,
        body: &Body,
        tagged: bool,
        max: usize,
    ) -> Encoder {
        let mut buf = Vec::with_capacity(256);
        buf.push(MAGIC);
        buf.push(VERSION);
        buf.push(if tagged { FLAG_TAG } else { 0 });
        buf.extend_from_slice(&cluster.to_le_bytes());
        put_name(&mut buf, from);
        buf.extend_from_slice(&launch.to_le_bytes());
        buf.extend_from_slice(&incarnation.to_le_bytes());
        buf.push(body.kind());
        match body {
            Body::Ping { seq, target } => {
                buf.extend_from_slice(&seq.to_le_bytes());
                put_name(&mut buf, target);
            }
            Body::Ack { seq } | Body::Nack { seq } => buf.extend_from_slice(&seq.to_le_bytes()),
            Body::PingReq { seq, target, addr } => {
                buf.extend_from_slice(&seq.to_le_bytes());
                put_name(&mut buf, target);
                put_addr(&mut buf, addr);
            }
            Body::Sync { reply } => buf.push(u8::from(*reply)),
            Body::Gossip => {}
        }
        let count_at = buf.len();
        buf.push(0);
        let tag = if tagged { TAG_LEN } else { 0 };
        let limit = max.clamp(MAX_ONE_CLAIM, MAX_PACKET) - tag;
        Encoder {
            buf,
            count_at,
            count: 0,
            limit,
        }
    }

    /// Adds `claim` if it fits (and fewer than 255 are in); whether it did.
    pub fn push(&mut self, claim: &Claim) -> bool {
        if self.count == u8::MAX || self.buf.len() + claim_len(claim) > self.limit {
            return false;
        }
        put_claim(&mut self.buf, claim);
        self.count += 1;
        true
    }

    /// The claims added so far.
    pub fn count(&self) -> usize {
        usize::from(self.count)
    }

    /// The packet's bytes, tagged with `key` when given (it must be given exactly when the
    /// encoder was made `tagged`).
    pub fn finish(mut self, key: Option<&PacketKey>) -> Vec<u8> {
        self.buf[self.count_at] = self.count;
        if let Some(key) = key {
            debug_assert_eq!(self.buf[2] & FLAG_TAG, FLAG_TAG);
            let tag = key.mac(&self.buf).finalize().into_bytes();
            self.buf.extend_from_slice(&tag[..TAG_LEN]);
        }
        self.buf
    }
}

/// Encodes `p` whole (its claims must fit: for tests and tools).
pub fn encode(p: &Packet, key: Option<&PacketKey>) -> Vec<u8> {
    let mut e = Encoder::new(
        p.cluster,
        &p.from,
        p.launch,
        p.incarnation,
        &p.body,
        key.is_some(),
        MAX_PACKET,
    );
    for c in &p.claims {
        let fitted = e.push(c);
        debug_assert!(fitted, "claims beyond one packet");
    }
    e.finish(key)
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).ok_or(DecodeError::Short)?;
        let s = self.b.get(self.at..end).ok_or(DecodeError::Short)?;
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        let s = self.take(2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let mut a = [0; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut a = [0; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn name_or_none(&mut self) -> Result<Option<String>, DecodeError> {
        let len = usize::from(self.u8()?);
        if len == 0 {
            return Ok(None);
        }
        let s = std::str::from_utf8(self.take(len)?).map_err(|_| DecodeError::Name)?;
        Ok(Some(s.to_owned()))
    }
    fn name(&mut self) -> Result<String, DecodeError> {
        self.name_or_none()?.ok_or(DecodeError::Name)
    }
    fn addr(&mut self) -> Result<SocketAddr, DecodeError> {
        let ip = match self.u8()? {
            4 => {
                let mut a = [0; 4];
                a.copy_from_slice(self.take(4)?);
                IpAddr::V4(Ipv4Addr::from(a))
            }
            6 => {
                let mut a = [0; 16];
                a.copy_from_slice(self.take(16)?);
                IpAddr::V6(Ipv6Addr::from(a))
            }
            other => return Err(DecodeError::Family(other)),
        };
        Ok(SocketAddr::new(ip, self.u16()?))
    }
    fn boolean(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::Bool(other)),
        }
    }
}

/// Decodes and authenticates `bytes`: with `key`, the packet must carry a tag that verifies
/// under it (checked before any field is read); without, it must carry none.
pub fn decode(bytes: &[u8], key: Option<&PacketKey>) -> Result<Packet, DecodeError> {
    if bytes.len() > MAX_PACKET {
        return Err(DecodeError::TooLong(bytes.len()));
    }
    let byte = |i: usize| bytes.get(i).copied().ok_or(DecodeError::Short);
    if byte(0)? != MAGIC {
        return Err(DecodeError::Magic(byte(0)?));
    }
    if byte(1)? != VERSION {
        return Err(DecodeError::Version(byte(1)?));
    }
    let flags = byte(2)?;
    if flags & !FLAG_TAG != 0 {
        return Err(DecodeError::Flags(flags));
    }
    let tagged = flags & FLAG_TAG != 0;
    let signed = match (tagged, key) {
        (true, Some(key)) => {
            let split = bytes.len().checked_sub(TAG_LEN).ok_or(DecodeError::Short)?;
            let (body, tag) = bytes.split_at(split);
            key.mac(body)
                .verify_truncated_left(tag)
                .map_err(|_| DecodeError::Tag)?;
            body
        }
        (false, None) => bytes,
        (true, None) => {
            return Err(DecodeError::TagPresence(
                "carries a MAC, but no secret is configured here",
            ))
        }
        (false, Some(_)) => {
            return Err(DecodeError::TagPresence(
                "carries no MAC (no secret configured there?); a secret is required here",
            ))
        }
    };
    let mut r = Reader { b: signed, at: 3 };
    let cluster = r.u32()?;
    let from = r.name()?;
    let launch = r.u64()?;
    let incarnation = r.u64()?;
    let body = match r.u8()? {
        1 => Body::Ping {
            seq: r.u32()?,
            target: r.name()?,
        },
        2 => Body::Ack { seq: r.u32()? },
        3 => Body::PingReq {
            seq: r.u32()?,
            target: r.name()?,
            addr: r.addr()?,
        },
        4 => Body::Nack { seq: r.u32()? },
        5 => Body::Sync {
            reply: r.boolean()?,
        },
        6 => Body::Gossip,
        other => return Err(DecodeError::Kind(other)),
    };
    let count = r.u8()?;
    let mut claims = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        claims.push(Claim {
            name: r.name()?,
            addr: r.addr()?,
            launch: r.u64()?,
            incarnation: r.u64()?,
            state: State::from_byte(r.u8()?)?,
            by: r.name_or_none()?,
        });
    }
    if r.at != signed.len() {
        return Err(DecodeError::Trailing(signed.len() - r.at));
    }
    Ok(Packet {
        cluster,
        from,
        launch,
        incarnation,
        body,
        claims,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        // 1 to 255 bytes of UTF-8 (multi-byte characters included), cut at a char boundary.
        proptest::collection::vec(any::<char>(), 1..120).prop_map(|cs| {
            let mut s = String::new();
            for c in cs {
                if s.len() + c.len_utf8() > MAX_NAME {
                    break;
                }
                s.push(c);
            }
            s
        })
    }

    fn addr() -> impl Strategy<Value = SocketAddr> {
        prop_oneof![
            (any::<[u8; 4]>(), any::<u16>())
                .prop_map(|(ip, p)| SocketAddr::new(IpAddr::V4(ip.into()), p)),
            (any::<[u8; 16]>(), any::<u16>())
                .prop_map(|(ip, p)| SocketAddr::new(IpAddr::V6(ip.into()), p)),
        ]
    }

    fn state() -> impl Strategy<Value = State> {
        prop_oneof![
            Just(State::Alive),
            Just(State::Suspect),
            Just(State::Failed),
            Just(State::Left)
        ]
    }

    fn claim() -> impl Strategy<Value = Claim> {
        (
            name(),
            addr(),
            any::<u64>(),
            any::<u64>(),
            state(),
            proptest::option::of(name()),
        )
            .prop_map(|(name, addr, launch, incarnation, state, by)| Claim {
                name,
                addr,
                launch,
                incarnation,
                state,
                by,
            })
    }

    fn body() -> impl Strategy<Value = Body> {
        prop_oneof![
            (any::<u32>(), name()).prop_map(|(seq, target)| Body::Ping { seq, target }),
            any::<u32>().prop_map(|seq| Body::Ack { seq }),
            (any::<u32>(), name(), addr()).prop_map(|(seq, target, addr)| Body::PingReq {
                seq,
                target,
                addr
            }),
            any::<u32>().prop_map(|seq| Body::Nack { seq }),
            any::<bool>().prop_map(|reply| Body::Sync { reply }),
            Just(Body::Gossip),
        ]
    }

    proptest! {
        /// Whatever fits is decoded back as it was, with and without a key; the packet never
        /// exceeds the bound; every truncation and every flipped byte of an authenticated
        /// packet is an error, never a panic nor a different packet.
        #[test]
        fn packets_roundtrip_within_the_bound(
            from in name(),
            launch in any::<u64>(),
            cluster in any::<u32>(),
            body in body(),
            claims in proptest::collection::vec(claim(), 0..12),
            keyed in any::<bool>(),
            flip in any::<(usize, u8)>(),
        ) {
            let key = keyed.then(|| PacketKey::new(b"cluster secret"));
            let mut e = Encoder::new(cluster, &from, launch, launch ^ 1, &body, keyed, MAX_PACKET);
            let mut fitted = Vec::new();
            for c in &claims {
                if e.push(c) {
                    fitted.push(c.clone());
                }
            }
            // At least one claim always fits.
            prop_assert!(claims.is_empty() || !fitted.is_empty());
            let bytes = e.finish(key.as_ref());
            prop_assert!(bytes.len() <= MAX_PACKET, "{} bytes", bytes.len());
            let p = decode(&bytes, key.as_ref()).expect("decodes");
            let incarnation = launch ^ 1;
            prop_assert_eq!(p, Packet { cluster, from, launch, incarnation, body, claims: fitted });
            for cut in 0..bytes.len() {
                prop_assert!(decode(&bytes[..cut], key.as_ref()).is_err());
            }
            if keyed {
                let mut altered = bytes.clone();
                let at = flip.0 % altered.len();
                altered[at] ^= flip.1.max(1);
                prop_assert!(decode(&altered, key.as_ref()).is_err());
                prop_assert_eq!(
                    decode(&bytes, Some(&PacketKey::new(b"another secret"))),
                    Err(DecodeError::Tag)
                );
            }
        }

        /// Arbitrary bytes decode to an error or a packet, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1500)) {
            let _ = decode(&bytes, None);
            let _ = decode(&bytes, Some(&PacketKey::new(b"k")));
        }
    }

    #[test]
    fn a_packet_with_one_maximal_claim_fits() {
        let long = "n".repeat(MAX_NAME);
        let addr: SocketAddr = "[::1]:9".parse().expect("an address");
        let body = Body::PingReq {
            seq: 1,
            target: long.clone(),
            addr,
        };
        let mut e = Encoder::new(1, &long, 1, 1, &body, true, MAX_PACKET);
        let c = Claim {
            name: long.clone(),
            addr,
            launch: 1,
            incarnation: 1,
            state: State::Suspect,
            by: Some(long),
        };
        assert_eq!(claim_len(&c), CLAIM_MAX);
        assert!(e.push(&c));
        let bytes = e.finish(Some(&PacketKey::new(b"s")));
        assert_eq!(bytes.len(), MAX_ONE_CLAIM);
        assert!(decode(&bytes, Some(&PacketKey::new(b"s"))).is_ok());
    }

    #[test]
    fn tag_presence_must_match() {
        let p = Packet {
            cluster: cluster_hash("c"),
            from: "a".into(),
            launch: 1,
            incarnation: 0,
            body: Body::Gossip,
            claims: vec![],
        };
        let key = PacketKey::new(b"s");
        assert!(matches!(
            decode(&encode(&p, None), Some(&key)),
            Err(DecodeError::TagPresence(_))
        ));
        assert!(matches!(
            decode(&encode(&p, Some(&key)), None),
            Err(DecodeError::TagPresence(_))
        ));
        assert_eq!(decode(&[0x00], None), Err(DecodeError::Magic(0)));
        assert_eq!(decode(&[MAGIC, 9, 0], None), Err(DecodeError::Version(9)));
    }
}
