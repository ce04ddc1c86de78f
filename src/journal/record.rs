//! Journal records and their framing on disk.
//!
//! A frame is `crc: u32 LE | len: u32 LE | kind: u8 | 3 zero bytes | body (len bytes)`. The
//! CRC32 (crc32fast) covers the segment's generation (8 bytes LE, not stored in the frame),
//! then bytes 4..12 of the frame (length, kind, padding), then the body. Mixing in the
//! generation makes a record left over from a segment's previous life fail its checksum, so a
//! recycled segment never needs to be zeroed.

use bytes::Bytes;

use crate::sync::SharedStr;

/// Bytes before a record's body: checksum, length, kind, padding.
pub const FRAME_HEADER: usize = 12;

/// Bytes of counters per peer in a checkpoint: sent, acked, delivered, credit, launch,
/// credit seen, published, epoch, unreliable.
pub(crate) const CHECKPOINT_COUNTERS: usize = 72;

/// Longest peer name a record can hold (the wire's limit).
pub(crate) const MAX_PEER_NAME: usize = crate::wire::MAX_NAME;

mod kind {
    pub(super) const MESSAGE: u8 = 1;
    pub(super) const ACKED: u8 = 2;
    pub(super) const DELIVERED: u8 = 3;
    pub(super) const CHECKPOINT: u8 = 4;
    pub(super) const BOUND: u8 = 5;
}

/// One entry of the journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A reliable outgoing message, journalled before it is published.
    Message {
        /// The member it is addressed to.
        peer: SharedStr,
        /// Its sequence number on that peer's stream.
        seq: u64,
        /// Its wire flags.
        flags: u8,
        /// Its bytes.
        payload: Bytes,
    },
    /// The peer acknowledged every message with `seq <= up_to`; they are retired. It had
    /// returned `credit` window bytes in all: after a restart, the sender charges its window
    /// for what the peer has not credited yet.
    Acked {
        /// The peer that acknowledged.
        peer: SharedStr,
        /// The cumulative ack.
        up_to: u64,
        /// The cumulative credit the peer had returned.
        credit: u64,
    },
    /// This member has delivered `count` messages from `peer` to its application, and may
    /// return `credit` window bytes to it in all (cumulative): the receiver acknowledges and
    /// credits only what such a record holds.
    Delivered {
        /// The sending peer.
        peer: SharedStr,
        /// Messages delivered so far (cumulative).
        count: u64,
        /// Credit (window bytes consumed) that may be returned so far (cumulative).
        credit: u64,
        /// Window bytes of unreliable messages handled so far (cumulative): told to the
        /// sender after a restart, so that it counts as lost only what was not.
        unreliable: u64,
    },
    /// The counters of `peer` belong to its incarnation `launch` from here on. If they
    /// belonged to another incarnation (or `launch` is 0: the relationship was reset), they
    /// restart from zero and the peer's earlier messages are retired: they were reported
    /// undelivered and are never resent.
    Bound {
        /// The peer.
        peer: SharedStr,
        /// Its launch id (0: unbound).
        launch: u64,
    },
    /// Every peer's counters at the moment a segment was activated, so that older segments
    /// can be recycled without losing them. Written by the journal itself.
    Checkpoint {
        /// One entry per known peer.
        peers: Vec<PeerCounters>,
    },
}

/// A peer's counters as stored in a [`Record::Checkpoint`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerCounters {
    /// The peer's name.
    pub peer: String,
    /// Highest sequence number journalled for this peer (0: none).
    pub sent: u64,
    /// Highest cumulative ack received from this peer.
    pub acked: u64,
    /// Messages from this peer delivered to the application.
    pub delivered: u64,
    /// Credit (window bytes) this member may return to the peer, cumulative.
    pub credit: u64,
    /// The peer's incarnation these counters belong to (0: not yet met).
    pub launch: u64,
    /// Credit (window bytes) the peer has returned to this member, cumulative.
    pub credit_seen: u64,
    /// Window bytes of the messages journalled to the peer, cumulative.
    pub published: u64,
    /// How many times the peer's stream was reset ([`Record::Bound`]): a checkpoint of a
    /// newer epoch replaces counters of an older one instead of merging with them.
    pub epoch: u64,
    /// Window bytes of the peer's unreliable messages this member handled, cumulative.
    pub unreliable: u64,
}

/// The kind of a record, for counting and display.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum RecordKind {
    /// A reliable message sent to a peer (its sequence number, flags and payload).
    Message,
    /// A peer acknowledged messages up to a sequence number, with the credit it returned.
    Acked,
    /// How far this member has handled a peer's stream, with the credit that may go back.
    Delivered,
    /// A segment's summary of every peer's counters, so older segments can be retired.
    Checkpoint,
    /// A peer's stream was bound to a new incarnation of it, or reset.
    Bound,
}

impl Record {
    /// The record's kind.
    pub fn kind(&self) -> RecordKind {
        match self {
            Record::Message { .. } => RecordKind::Message,
            Record::Acked { .. } => RecordKind::Acked,
            Record::Delivered { .. } => RecordKind::Delivered,
            Record::Checkpoint { .. } => RecordKind::Checkpoint,
            Record::Bound { .. } => RecordKind::Bound,
        }
    }

    fn kind_byte(&self) -> u8 {
        match self {
            Record::Message { .. } => kind::MESSAGE,
            Record::Acked { .. } => kind::ACKED,
            Record::Delivered { .. } => kind::DELIVERED,
            Record::Checkpoint { .. } => kind::CHECKPOINT,
            Record::Bound { .. } => kind::BOUND,
        }
    }

    /// Length of the body (without the frame header).
    pub(crate) fn body_len(&self) -> usize {
        match self {
            Record::Message { peer, payload, .. } => 2 + peer.len() + 8 + 1 + payload.len(),
            Record::Bound { peer, .. } => 2 + peer.len() + 8,
            Record::Acked { peer, .. } => 2 + peer.len() + 16,
            Record::Delivered { peer, .. } => 2 + peer.len() + 24,
            Record::Checkpoint { peers } => {
                4 + peers
                    .iter()
                    .map(|p| 2 + p.peer.len() + CHECKPOINT_COUNTERS)
                    .sum::<usize>()
            }
        }
    }

    /// Length of the whole frame.
    pub(crate) fn frame_len(&self) -> usize {
        FRAME_HEADER + self.body_len()
    }

    /// The longest peer name in this record, for validation.
    pub(crate) fn longest_name(&self) -> Option<&str> {
        match self {
            Record::Message { peer, .. }
            | Record::Acked { peer, .. }
            | Record::Delivered { peer, .. }
            | Record::Bound { peer, .. } => Some(peer),
            Record::Checkpoint { peers } => peers
                .iter()
                .map(|p| p.peer.as_str())
                .max_by_key(|p| p.len()),
        }
    }

    /// Appends this record's frame to `out`, checksummed for segment `generation`.
    /// Names must have been checked against [`MAX_PEER_NAME`].
    pub(crate) fn encode(&self, generation: u64, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        let body_len = self.body_len() as u32;
        out.extend_from_slice(&body_len.to_le_bytes());
        out.extend_from_slice(&[self.kind_byte(), 0, 0, 0]);
        match self {
            Record::Message {
                peer,
                seq,
                flags,
                payload,
            } => {
                put_name(out, peer);
                out.extend_from_slice(&seq.to_le_bytes());
                out.push(*flags);
                out.extend_from_slice(payload);
            }
            Record::Bound { peer, launch } => {
                put_name(out, peer);
                out.extend_from_slice(&launch.to_le_bytes());
            }
            Record::Acked {
                peer,
                up_to: count,
                credit,
            } => {
                put_name(out, peer);
                out.extend_from_slice(&count.to_le_bytes());
                out.extend_from_slice(&credit.to_le_bytes());
            }
            Record::Delivered {
                peer,
                count,
                credit,
                unreliable,
            } => {
                put_name(out, peer);
                out.extend_from_slice(&count.to_le_bytes());
                out.extend_from_slice(&credit.to_le_bytes());
                out.extend_from_slice(&unreliable.to_le_bytes());
            }
            Record::Checkpoint { peers } => {
                out.extend_from_slice(&(peers.len() as u32).to_le_bytes());
                for p in peers {
                    put_name(out, &p.peer);
                    out.extend_from_slice(&p.sent.to_le_bytes());
                    out.extend_from_slice(&p.acked.to_le_bytes());
                    out.extend_from_slice(&p.delivered.to_le_bytes());
                    out.extend_from_slice(&p.credit.to_le_bytes());
                    out.extend_from_slice(&p.launch.to_le_bytes());
                    out.extend_from_slice(&p.credit_seen.to_le_bytes());
                    out.extend_from_slice(&p.published.to_le_bytes());
                    out.extend_from_slice(&p.epoch.to_le_bytes());
                    out.extend_from_slice(&p.unreliable.to_le_bytes());
                }
            }
        }
        let crc = frame_crc(generation, &out[start + 4..]);
        out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
}

/// CRC32 of a frame: the generation, then everything after the stored checksum.
fn frame_crc(generation: u64, after_crc: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&generation.to_le_bytes());
    h.update(after_crc);
    h.finalize()
}

/// What reading one frame at an offset found.
#[derive(Debug)]
pub(crate) enum FrameRead {
    /// A valid record and the length of its frame.
    Record(Record, usize),
    /// Zeroes (or too little space for a frame header): the records end here.
    End,
    /// Not a valid record of this generation: a torn write, stale bytes of an older life of
    /// the segment, or corruption.
    Invalid(&'static str),
}

/// Reads the frame at the start of `buf` (which runs to the end of the segment's data).
pub(crate) fn read_frame(generation: u64, buf: &[u8]) -> FrameRead {
    if buf.len() < FRAME_HEADER {
        return if buf.iter().all(|&b| b == 0) {
            FrameRead::End
        } else {
            FrameRead::Invalid("frame header runs past the end of the segment")
        };
    }
    let header = &buf[..FRAME_HEADER];
    if header.iter().all(|&b| b == 0) {
        return FrameRead::End;
    }
    let crc = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
    let Some(total) = FRAME_HEADER.checked_add(len).filter(|&t| t <= buf.len()) else {
        return FrameRead::Invalid("record length runs past the end of the segment");
    };
    if frame_crc(generation, &buf[4..total]) != crc {
        return FrameRead::Invalid("record checksum mismatch");
    }
    if header[9..12] != [0, 0, 0] {
        return FrameRead::Invalid("nonzero padding in record header");
    }
    match decode_body(header[8], &buf[FRAME_HEADER..total]) {
        Some(record) => FrameRead::Record(record, total),
        None => FrameRead::Invalid("record body does not decode"),
    }
}

/// A bounds-checked reader over a record body.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        let mut a = [0; 8];
        a.copy_from_slice(b);
        Some(u64::from_le_bytes(a))
    }
    fn name(&mut self) -> Option<String> {
        let len = self.u16()? as usize;
        if len > MAX_PEER_NAME {
            return None;
        }
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }
}

fn decode_body(kind: u8, body: &[u8]) -> Option<Record> {
    let mut c = Cursor(body);
    let record = match kind {
        kind::MESSAGE => {
            let peer = c.name()?.into();
            let seq = c.u64()?;
            let flags = c.u8()?;
            let payload = Bytes::copy_from_slice(c.0);
            c.0 = &[];
            Record::Message {
                peer,
                seq,
                flags,
                payload,
            }
        }
        kind::ACKED => Record::Acked {
            peer: c.name()?.into(),
            up_to: c.u64()?,
            credit: c.u64()?,
        },
        kind::DELIVERED => Record::Delivered {
            peer: c.name()?.into(),
            count: c.u64()?,
            credit: c.u64()?,
            unreliable: c.u64()?,
        },
        kind::BOUND => Record::Bound {
            peer: c.name()?.into(),
            launch: c.u64()?,
        },
        kind::CHECKPOINT => {
            let n = c.u32()? as usize;
            // Each entry takes at least 2 + 40 bytes: bound the allocation by the body.
            if n > c.0.len() / (2 + CHECKPOINT_COUNTERS) {
                return None;
            }
            let mut peers = Vec::with_capacity(n);
            for _ in 0..n {
                peers.push(PeerCounters {
                    peer: c.name()?,
                    sent: c.u64()?,
                    acked: c.u64()?,
                    delivered: c.u64()?,
                    credit: c.u64()?,
                    launch: c.u64()?,
                    credit_seen: c.u64()?,
                    published: c.u64()?,
                    epoch: c.u64()?,
                    unreliable: c.u64()?,
                });
            }
            Record::Checkpoint { peers }
        }
        _ => return None,
    };
    c.0.is_empty().then_some(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Record> {
        vec![
            Record::Message {
                peer: "beta".into(),
                seq: 7,
                flags: 3,
                payload: Bytes::from_static(b"hello"),
            },
            Record::Message {
                peer: "".into(),
                seq: u64::MAX,
                flags: 0,
                payload: Bytes::new(),
            },
            Record::Acked {
                peer: "gamma".into(),
                up_to: 42,
                credit: 4200,
            },
            Record::Delivered {
                peer: "beta".into(),
                count: 9,
                credit: 1234,
                unreliable: 77,
            },
            Record::Bound {
                peer: "beta".into(),
                launch: 0xfeed,
            },
            Record::Checkpoint { peers: vec![] },
            Record::Checkpoint {
                peers: vec![
                    PeerCounters {
                        peer: "a".into(),
                        sent: 1,
                        acked: 2,
                        delivered: 3,
                        credit: 7,
                        launch: 8,
                        credit_seen: 11,
                        published: 13,
                        epoch: 1,
                        unreliable: 15,
                    },
                    PeerCounters {
                        peer: "bb".into(),
                        sent: 4,
                        acked: 5,
                        delivered: 6,
                        credit: 9,
                        launch: 10,
                        credit_seen: 12,
                        published: 14,
                        epoch: 2,
                        unreliable: 16,
                    },
                ],
            },
        ]
    }

    #[test]
    fn every_record_kind_round_trips_through_its_frame() {
        for r in samples() {
            let mut buf = Vec::new();
            r.encode(5, &mut buf);
            assert_eq!(buf.len(), r.frame_len());
            buf.extend_from_slice(&[0; 16]);
            match read_frame(5, &buf) {
                FrameRead::Record(back, len) => {
                    assert_eq!(back, r);
                    assert_eq!(len, r.frame_len());
                }
                other => panic!("{r:?} read back as {other:?}"),
            }
        }
    }

    #[test]
    fn a_record_of_another_generation_or_with_a_flipped_bit_is_invalid() {
        for r in samples() {
            let mut buf = Vec::new();
            r.encode(5, &mut buf);
            assert!(matches!(read_frame(6, &buf), FrameRead::Invalid(_)));
            for i in 0..buf.len() {
                let mut bad = buf.clone();
                bad[i] ^= 0x10;
                assert!(
                    !matches!(read_frame(5, &bad), FrameRead::Record(..)),
                    "flip at {i} of {r:?} accepted"
                );
            }
        }
    }

    #[test]
    fn zeroes_end_the_records() {
        assert!(matches!(read_frame(1, &[0; 40]), FrameRead::End));
        assert!(matches!(read_frame(1, &[0; 5]), FrameRead::End));
        assert!(matches!(read_frame(1, &[]), FrameRead::End));
    }
}
