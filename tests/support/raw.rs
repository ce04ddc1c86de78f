//! A member driven by hand over a blocking socket, with the crate's own `proto` and `wire`
//! code: it completes a real handshake and then writes whatever frames a test wants —
//! garbage, or data past its window — as a buggy or hostile peer would.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use cohort::internals::proto::{Handshake, HsEvent, LocalIdentity, Secret};
use cohort::internals::wire::{self, CloseCode, Frame};

/// A member identity for a hand-driven handshake.
pub(crate) fn identity(
    cluster: &str,
    name: &str,
    window: u64,
    secret: Option<&[u8]>,
) -> LocalIdentity {
    LocalIdentity {
        launch_id: 0x5eed,
        window,
        max_message: 1 << 20,
        cluster: cluster.into(),
        name: name.into(),
        secret: secret.map(Secret::new),
    }
}

/// Reads one whole frame (prefix included) from a blocking socket; `None` at EOF or reset.
/// Frames larger than `max` bytes after the prefix are refused with a panic.
pub(crate) fn read_frame(s: &mut TcpStream, max: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; wire::LEN_BYTES];
    s.read_exact(&mut buf).ok()?;
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    assert!(len <= max, "frame of {len} bytes");
    buf.resize(wire::LEN_BYTES + len, 0);
    s.read_exact(&mut buf[wire::LEN_BYTES..]).ok()?;
    Some(buf)
}

/// Connects with a read timeout of `patience`.
pub(crate) fn connect(addr: SocketAddr, patience: Duration) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(patience)).expect("timeout");
    s
}

/// Dials `addr` and runs a complete, correct dialler handshake by hand as `me`, expecting
/// the member `expected`; returns the established connection.
pub(crate) fn dial(
    addr: SocketAddr,
    me: LocalIdentity,
    expected: &str,
    patience: Duration,
) -> TcpStream {
    let mut s = connect(addr, patience);
    let mut hs = Handshake::dialler(me, expected.into(), [0x42; wire::NONCE_LEN]);
    let hello = read_frame(&mut s, wire::MAX_HANDSHAKE_FRAME).expect("Hello");
    let (f, _) = wire::decode(&hello, 4096).expect("decodes").expect("whole");
    assert!(matches!(hs.on_frame(&f), Ok(HsEvent::Identified { .. })));
    let mut reply = Vec::new();
    hs.accept(0, 0, 0, &mut reply);
    s.write_all(&reply).expect("write HelloReply");
    let ready = read_frame(&mut s, wire::MAX_HANDSHAKE_FRAME).expect("Ready");
    let (f, _) = wire::decode(&ready, 4096).expect("decodes").expect("whole");
    assert!(
        matches!(hs.on_frame(&f), Ok(HsEvent::Established { .. })),
        "Ready completes (and, with a secret, authenticates) the handshake"
    );
    s
}

/// Reads until the peer closes: returns the code of the `Close` frame it sent first, if
/// any (acks and heartbeats before it are skipped). Panics if the connection stays open
/// past the socket's read timeout.
pub(crate) fn closed_with(s: &mut TcpStream) -> Option<CloseCode> {
    loop {
        let frame = read_frame(s, 1 << 20)?;
        match wire::decode(&frame, 1 << 20) {
            Ok(Some((Frame::Close { code, .. }, _))) => {
                // Then EOF (or a reset).
                let mut rest = [0u8; 64];
                match s.read(&mut rest) {
                    Ok(0) => {}
                    Err(e) if e.kind() != ErrorKind::WouldBlock => {}
                    other => panic!("still open after Close: {other:?}"),
                }
                return Some(code);
            }
            Ok(Some(_)) => continue, // an ack or a heartbeat
            other => panic!("unexpected bytes {other:?}"),
        }
    }
}
