//! One TCP connection owned by the IO thread: its socket, transport (plain TCP, or TLS with
//! the `tls` feature), read buffer, coalesced write buffer and handshake. Many frames go out
//! per `write` and come in per `read`; over TLS, many frames per TLS write (records of up
//! to 16 KiB, written vectored).

use std::io::{self, Read, Write};
use std::time::Instant;

use bytes::BytesMut;
use mio::net::TcpStream;
use mio::{Interest, Registry, Token};

use crate::proto::Handshake;

#[cfg(feature = "tls")]
use super::tls::TlsSession;
#[cfg(feature = "tls")]
pub(crate) use super::tls::TlsSetup;

/// Without the `tls` feature there is no TLS configuration: an `Option<TlsSetup>` is always
/// `None`, and the code that would use one is not compiled.
#[cfg(not(feature = "tls"))]
#[derive(Clone, Debug)]
pub(crate) enum TlsSetup {}

/// What carries a connection's bytes. The plain path is a unit variant: no allocation,
/// no indirection, one `match` per read or write.
#[derive(Debug)]
pub(crate) enum Transport {
    Plain,
    /// rustls, pumped over the same non-blocking socket (boxed: a rustls connection is
    /// large, and a plain `Conn` should not carry its size).
    #[cfg(feature = "tls")]
    Tls(Box<TlsSession>),
}

impl Transport {
    /// The transport of a new connection: plain without a TLS configuration; with one, a
    /// TLS client for a dial (`dialled`: the peer's member name, the TLS server name) or
    /// a TLS server for an accepted connection.
    pub(crate) fn new(tls: Option<&TlsSetup>, dialled: Option<&str>) -> Result<Transport, String> {
        match tls {
            None => {
                let _ = dialled;
                Ok(Transport::Plain)
            }
            #[cfg(feature = "tls")]
            Some(t) => Ok(Transport::Tls(Box::new(TlsSession::new(t, dialled)?))),
            #[cfg(not(feature = "tls"))]
            Some(t) => match *t {},
        }
    }

    /// Whether the transport holds bytes of its own to write (TLS records: handshake,
    /// alerts, encrypted frames).
    #[inline]
    pub(crate) fn wants_write(&self) -> bool {
        match self {
            Transport::Plain => false,
            #[cfg(feature = "tls")]
            Transport::Tls(s) => s.wants_write(),
        }
    }
}

/// Whether `e` is a TLS failure (bad certificate, unknown CA, not TLS at all...) rather
/// than a socket error.
pub(crate) fn is_tls_failure(e: &io::Error) -> bool {
    #[cfg(feature = "tls")]
    {
        super::tls::is_failure(e)
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = e;
        false
    }
}

/// Written bytes at the front of the write buffer before it is compacted.
const COMPACT_AT: usize = 64 * 1024;

/// Bytes read per `read` call at most; the read buffer grows to hold one maximal frame.
pub(crate) const READ_CHUNK: usize = 64 * 1024;

#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) token: Token,
    pub(crate) stream: TcpStream,
    /// Plain TCP or TLS.
    pub(crate) transport: Transport,
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
    /// Not read for now: the peer has more than its window waiting for delivery.
    pub(crate) paused: bool,
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
            transport: Transport::Plain,
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
            paused: false,
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
    /// event). Over TLS the bytes are plaintext: ciphertext is read into `scratch` (the IO
    /// thread's, shared by all connections) and fed to rustls; a read that yields only TLS
    /// records without data (handshake, tickets) reads on, so `0` still means EOF.
    pub(crate) fn read_some(&mut self, scratch: &mut Vec<u8>) -> io::Result<(usize, bool)> {
        #[cfg(feature = "tls")]
        if let Transport::Tls(s) = &mut self.transport {
            return s.read(&mut self.stream, &mut self.rbuf, scratch);
        }
        let _ = scratch;
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
        #[cfg(feature = "tls")]
        if let Transport::Tls(s) = &mut self.transport {
            let drained = s.flush(
                &mut self.stream,
                &self.wbuf,
                &mut self.wpos,
                &mut self.last_write,
            )?;
            if drained {
                self.wbuf.clear();
                self.wpos = 0;
            } else {
                self.compact();
            }
            return Ok(drained);
        }
        while self.wpos < self.wbuf.len() {
            match self.stream.write(&self.wbuf[self.wpos..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.wpos += n;
                    self.last_write = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.compact();
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

    /// Drops the written prefix once it is most of the buffer, so a socket that never fully
    /// drains cannot make the buffer grow without bound.
    fn compact(&mut self) {
        if self.wpos >= COMPACT_AT && self.wpos * 2 >= self.wbuf.len() {
            self.wbuf.drain(..self.wpos);
            self.wpos = 0;
        }
    }

    /// Whether the connection has something to write: a connect to complete, buffered
    /// frames, or TLS records (handshake, alerts) of its own.
    pub(crate) fn wants_write(&self) -> bool {
        self.connecting || self.unwritten() > 0 || self.transport.wants_write()
    }

    /// With TLS, whether the peer's certificate is valid for member `name` (the acceptor's
    /// check of the name a dialler claims in its handshake). Always `Ok` on plain TCP.
    pub(crate) fn peer_cert_valid_for(&self, name: &str) -> Result<(), String> {
        match &self.transport {
            Transport::Plain => {
                let _ = name;
                Ok(())
            }
            #[cfg(feature = "tls")]
            Transport::Tls(s) => s.peer_valid_for(name),
        }
    }

    /// Best effort, before closing after a TLS failure: writes what the transport has of
    /// its own (the alert telling the peer why), dropping unwritten frames.
    pub(crate) fn flush_alert(&mut self) {
        self.wbuf.clear();
        self.wpos = 0;
        let _ = self.flush();
    }

    /// Registers for writable readiness while bytes are pending and drops it once the
    /// buffer is empty (level of interest follows `wants_write`, as in rustls+mio).
    pub(crate) fn update_interest(&mut self, registry: &Registry) -> io::Result<()> {
        let want = self.wants_write();
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
