//! One TCP connection owned by the IO thread: its socket, read buffer, coalesced write
//! buffer and handshake. Many frames go out per `write` and come in per `read`.

use std::io::{self, Read, Write};
use std::time::Instant;

use bytes::BytesMut;
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};

use crate::proto::Handshake;

/// Written bytes at the front of the write buffer before it is compacted.
const COMPACT_AT: usize = 64 * 1024;

/// Bytes read per `read` call at most; the read buffer grows to hold one maximal frame.
pub(crate) const READ_CHUNK: usize = 64 * 1024;

#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) token: Token,
    pub(crate) stream: TcpStream,
    /// Peer we dialled (outgoing connections only).
    pub(crate) dialled: Option<usize>,
    /// Peer this connection belongs to once identified.
    pub(crate) peer: Option<usize>,
    /// Until the handshake completes.
    pub(crate) hs: Option<Handshake>,
    /// TCP connect still in progress.
    pub(crate) connecting: bool,
    /// Handshake done and adopted by its peer: data may flow.
    pub(crate) established: bool,
    pub(crate) rbuf: BytesMut,
    pub(crate) wbuf: Vec<u8>,
    pub(crate) wpos: usize,
    writable_interest: bool,
    /// Queued in the IO thread's read-pending list (readable, not drained).
    pub(crate) read_pending: bool,
    /// The peer's launch id (from the handshake).
    pub(crate) launch: Option<u64>,
    /// When bytes last arrived (failure detection).
    pub(crate) last_read: Instant,
    /// When bytes were last written (heartbeats are sent only on a quiet connection).
    pub(crate) last_write: Instant,
}

impl Conn {
    pub(crate) fn new(
        token: Token,
        stream: TcpStream,
        dialled: Option<usize>,
        hs: Handshake,
    ) -> Conn {
        Conn {
            token,
            stream,
            dialled,
            peer: dialled,
            hs: Some(hs),
            connecting: dialled.is_some(),
            established: false,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: Vec::with_capacity(READ_CHUNK),
            wpos: 0,
            writable_interest: false,
            read_pending: false,
            launch: None,
            last_read: Instant::now(),
            last_write: Instant::now(),
        }
    }

    /// Bytes buffered and not yet written.
    pub(crate) fn unwritten(&self) -> usize {
        self.wbuf.len() - self.wpos
    }

    /// Reads once into the read buffer, at most [`READ_CHUNK`] bytes. Returns the bytes read
    /// (`0` is EOF) and whether the read was short (the socket had no more to give: its
    /// receive queue is drained, and with edge-triggered readiness new data raises a new
    /// event).
    pub(crate) fn read_some(&mut self) -> io::Result<(usize, bool)> {
        // A partial frame at the front stays in place; `reserve` moves or grows the buffer
        // only when the spare room is low (frames are split off as soon as they complete, so
        // the buffer holds at most one partial frame plus a chunk).
        if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
            self.rbuf.reserve(READ_CHUNK);
        }
        let len = self.rbuf.len();
        let end = self.rbuf.capacity().min(len + READ_CHUNK);
        // Zero-fill the slice the read writes into. This keeps the code free of `unsafe`;
        // the cost is a memset of at most one chunk per read syscall.
        self.rbuf.resize(end, 0);
        let offered = end - len;
        match self.stream.read(&mut self.rbuf[len..]) {
            Ok(n) => {
                self.rbuf.truncate(len + n);
                Ok((n, n < offered))
            }
            Err(e) => {
                self.rbuf.truncate(len);
                Err(e)
            }
        }
    }

    /// Writes as much of the write buffer as the socket takes. Returns `Ok(true)` when the
    /// buffer is empty.
    pub(crate) fn flush(&mut self) -> io::Result<bool> {
        while self.wpos < self.wbuf.len() {
            match self.stream.write(&self.wbuf[self.wpos..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.wpos += n;
                    self.last_write = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Drop the written prefix once it is most of the buffer, so a socket
                    // that never fully drains cannot make the buffer grow without bound.
                    if self.wpos >= COMPACT_AT && self.wpos * 2 >= self.wbuf.len() {
                        self.wbuf.drain(..self.wpos);
                        self.wpos = 0;
                    }
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        self.wbuf.clear();
        self.wpos = 0;
        Ok(true)
    }

    /// Registers for writable readiness while bytes are pending and drops it once the
    /// buffer is empty (level of interest follows `wants_write`, as in rustls+mio).
    pub(crate) fn update_interest(&mut self, registry: &Registry) -> io::Result<()> {
        let want = self.connecting || self.unwritten() > 0;
        if want != self.writable_interest {
            let interest = if want {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            registry.reregister(&mut self.stream, self.token, interest)?;
            self.writable_interest = want;
        }
        Ok(())
    }

    /// Marks the registration as including writable interest (set at registration time).
    pub(crate) fn set_writable_interest(&mut self, on: bool) {
        self.writable_interest = on;
    }
}
