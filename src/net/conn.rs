//! One connection's socket side: the stream (TCP or a Unix-domain socket), its transport (plain TCP, or TLS with the
//! `tls` feature) and its readiness registration. The bytes it reads go into its link's read
//! buffer and the bytes it writes come from its link's write buffer (`proto::Link`): the
//! protocol side lives there. Many frames go out per `write` and come in per `read`; over
//! TLS, many frames per TLS write (records of up to 16 KiB, written vectored).

use std::io::{self, IoSlice, Write};

use bytes::BytesMut;
use mio::{Interest, Registry, Token};

use super::socket::Stream;
use crate::addr::Addr;

use crate::deliver::ReadBuffers;
use crate::proto::write_queue::Unwritten;
use crate::proto::READ_CHUNK;
#[cfg(feature = "tls")]
use crate::tls::TlsPump;

/// The TLS configuration the IO thread holds (`IoConfig::tls`). Without the `tls` feature it
/// is an enum with no variants, a type with no values: an `Option<TlsSetup>` is then always
/// `None`, so the builder and `IoConfig` carry it with no `cfg` of their own, and the one
/// arm that would start TLS with it is `match *t {}`.
#[cfg(feature = "tls")]
pub(crate) type TlsSetup = crate::tls::TlsConfig;
#[cfg(not(feature = "tls"))]
#[derive(Clone, Debug)]
pub(crate) enum TlsSetup {}

/// What carries a connection's bytes, and how they are read and written. The plain path is
/// a unit variant with its socket calls right here: no allocation, no indirection, one
/// `match` per read or write. The TLS path is the `tls` module's [`TlsPump`].
#[derive(Debug)]
pub(crate) enum Transport {
    Plain,
    /// rustls, pumped over the same non-blocking socket (boxed: a rustls connection is
    /// large, and a plain `Conn` should not carry its size).
    #[cfg(feature = "tls")]
    Tls(Box<TlsPump>),
}

impl Transport {
    /// The transport of a new connection: plain without a TLS configuration; with one, a
    /// TLS client for a dial (`dialled`: the peer's member name, the TLS server name) or
    /// a TLS server for an accepted connection.
    pub(crate) fn new(tls: Option<&TlsSetup>, dialled: Option<&str>) -> Result<Transport, String> {
        match tls {
            None => Ok(Transport::Plain),
            #[cfg(feature = "tls")]
            Some(t) => Ok(Transport::Tls(Box::new(TlsPump::new(t, dialled)?))),
            #[cfg(not(feature = "tls"))]
            Some(t) => {
                let _ = dialled;
                match *t {}
            }
        }
    }

    /// Reads once from `stream` into `rbuf`, at most [`READ_CHUNK`] bytes. Returns the bytes
    /// read (`0` is EOF) and whether the read was short (the socket had no more to give: its
    /// receive queue is drained, and with edge-triggered readiness new data raises a new
    /// event). Over TLS the bytes are plaintext: ciphertext is read into `scratch` (the IO
    /// thread's, shared by all connections) and fed to rustls; a read that yields only TLS
    /// records without data (handshake, tickets) reads on, so `0` still means EOF.
    #[inline]
    pub(crate) fn read(
        &mut self,
        stream: &mut Stream,
        rbuf: &mut BytesMut,
        buffers: &ReadBuffers,
        scratch: &mut Vec<u8>,
    ) -> io::Result<(usize, bool)> {
        match self {
            Transport::Plain => {
                let _ = scratch;
                read_plain(stream, rbuf, buffers)
            }
            #[cfg(feature = "tls")]
            Transport::Tls(t) => {
                buffers.make_room(rbuf);
                t.read(stream, rbuf, scratch)
            }
        }
    }

    /// Writes as much of `bytes` to `stream` as the socket takes (and, over TLS, the
    /// transport's own records). Returns how many of them were taken.
    #[inline]
    pub(crate) fn write(&mut self, stream: &mut Stream, bytes: Unwritten<'_>) -> io::Result<usize> {
        match self {
            Transport::Plain => write_plain(stream, bytes),
            #[cfg(feature = "tls")]
            Transport::Tls(t) => {
                // With no bytes of the link's, still one call: it writes the records rustls
                // made of its own (the TLS handshake, alerts).
                let mut taken = t.write(stream, &[])?;
                for s in bytes.slices() {
                    let n = t.write(stream, s)?;
                    taken += n;
                    // Taken only in part, or records left unwritten: the socket is full.
                    if n < s.len() || t.wants_write() {
                        break;
                    }
                }
                Ok(taken)
            }
        }
    }

    /// Writes as much of `buf` as the socket takes (see [`write`](Transport::write)).
    fn write_slice(&mut self, stream: &mut Stream, buf: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Plain => write_plain_slice(stream, buf),
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.write(stream, buf),
        }
    }

    /// Whether the transport holds bytes of its own to write (TLS records: handshake,
    /// alerts, encrypted frames).
    #[inline]
    pub(crate) fn wants_write(&self) -> bool {
        match self {
            Transport::Plain => false,
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.wants_write(),
        }
    }
}

/// The plain read: straight into the spare room of `rbuf`.
#[inline]
fn read_plain(
    stream: &mut Stream,
    rbuf: &mut BytesMut,
    buffers: &ReadBuffers,
) -> io::Result<(usize, bool)> {
    // A partial frame at the front stays in place; the buffer moves (to one given back,
    // or a new one) only when the spare room is low (frames are split off as soon as they
    // complete, so it holds at most one partial frame plus a chunk).
    buffers.make_room(rbuf);
    read_spare(stream, rbuf)
}

/// Reads once into the spare room of `rbuf` (at most [`READ_CHUNK`] bytes), without
/// zero-filling it first: socket2's `recv` takes uninitialised memory and says how much of
/// it the kernel wrote. Returns the bytes read and whether the read was short.
#[inline]
fn read_spare(stream: &Stream, rbuf: &mut BytesMut) -> io::Result<(usize, bool)> {
    let len = rbuf.len();
    let spare = rbuf.spare_capacity_mut();
    let offered = spare.len().min(READ_CHUNK);
    let n = stream.sock_ref().recv(&mut spare[..offered])?;
    debug_assert!(n <= offered);
    // SAFETY: `recv` returns how many bytes of the slice it was given the kernel wrote
    // (recv(2)'s count; socket2 documents the first `n` bytes as initialised): the spare
    // room from `len` to `len + n` is initialised, and `len + n <= capacity`.
    unsafe { rbuf.set_len(len + n) };
    Ok((n, n < offered))
}

/// The plain write: until the socket says `WouldBlock` or `buf` is out.
#[inline]
fn write_plain_slice(stream: &mut Stream, buf: &[u8]) -> io::Result<usize> {
    write_until_full(buf.len(), |done| stream.write(&buf[done..]))
}

/// Slices handed to one `writev`.
const WRITE_SLICES: usize = 64;

/// The plain write: `bytes` as they lie (the link's buffer and the runs shared with it),
/// several slices to a `writev`, until they are all out or the socket is full.
fn write_plain(stream: &mut Stream, bytes: Unwritten<'_>) -> io::Result<usize> {
    let mut iov = [IoSlice::new(&[]); WRITE_SLICES];
    write_until_full(bytes.len(), |done| {
        let k = bytes.fill(done, &mut iov);
        if k == 1 {
            stream.write(&iov[0])
        } else {
            stream.write_vectored(&iov[..k])
        }
    })
}

/// Calls `write_from(done)` (a write of what follows the first `done` of `len` bytes)
/// until all `len` are written or the socket is full. Returns how many were.
#[inline]
fn write_until_full(
    len: usize,
    mut write_from: impl FnMut(usize) -> io::Result<usize>,
) -> io::Result<usize> {
    let mut done = 0;
    while done < len {
        match write_from(done) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Whether `e` is a TLS failure (bad certificate, unknown CA, not TLS at all...) rather
/// than a socket error.
pub(crate) fn is_tls_failure(e: &io::Error) -> bool {
    #[cfg(feature = "tls")]
    {
        crate::tls::is_failure(e)
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = e;
        false
    }
}

#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) token: Token,
    pub(crate) stream: Stream,
    /// Plain or TLS.
    pub(crate) transport: Transport,
    /// The other end: the address dialled, or where an accepted connection came from.
    pub(crate) remote: Addr,
    writable_interest: bool,
    /// Queued in the IO thread's read-pending list (readable, not drained).
    pub(crate) read_pending: bool,
}

impl Conn {
    pub(crate) fn new(
        token: Token,
        stream: Stream,
        remote: Addr,
        transport: Transport,
        writable: bool,
    ) -> Conn {
        Conn {
            token,
            stream,
            remote,
            transport,
            writable_interest: writable,
            read_pending: false,
        }
    }

    /// Reads once into `rbuf` (see [`Transport::read`]).
    pub(crate) fn read_some(
        &mut self,
        rbuf: &mut BytesMut,
        buffers: &ReadBuffers,
        scratch: &mut Vec<u8>,
    ) -> io::Result<(usize, bool)> {
        self.transport
            .read(&mut self.stream, rbuf, buffers, scratch)
    }

    /// Writes as much of `bytes` as the socket takes (see [`Transport::write`]). Returns
    /// how many of them were taken.
    pub(crate) fn write(&mut self, bytes: Unwritten<'_>) -> io::Result<usize> {
        self.transport.write(&mut self.stream, bytes)
    }

    /// Best effort, right before the connection is dropped: writes `last` (a `Close`, after
    /// what was still buffered) and whatever the transport has of its own (a TLS alert).
    pub(crate) fn write_last(&mut self, last: &[u8]) {
        let _ = self.transport.write_slice(&mut self.stream, last);
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
            Transport::Tls(t) => t.peer_valid_for(name),
        }
    }

    /// Registers for writable readiness while bytes are pending (`link_wants`: the link's
    /// buffer holds some, or the transport has records of its own) and drops it once there
    /// are none (level of interest follows `wants_write`, as in rustls+mio).
    pub(crate) fn update_interest(
        &mut self,
        registry: &Registry,
        link_wants: bool,
    ) -> io::Result<()> {
        let want = link_wants || self.transport.wants_write();
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected pair: the reading end as a `Stream` (left blocking, so that a read waits
    /// for bytes instead of polling) and the writing end.
    fn tcp_pair() -> (Stream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let w = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (r, _) = l.accept().expect("accept");
        (Stream::Tcp(mio::net::TcpStream::from_std(r)), w)
    }

    #[cfg(unix)]
    fn unix_pair() -> (Stream, std::os::unix::net::UnixStream) {
        let (r, w) = std::os::unix::net::UnixStream::pair().expect("pair");
        (Stream::Unix(mio::net::UnixStream::from_std(r)), w)
    }

    fn pattern(from: usize, n: usize) -> Vec<u8> {
        (from..from + n).map(|i| (i % 251) as u8).collect()
    }

    /// Reads until `rbuf` holds `want` bytes, checking that no read offers more than a chunk.
    fn read_to(stream: &mut Stream, rbuf: &mut BytesMut, want: usize) {
        while rbuf.len() < want {
            let before = rbuf.len();
            let (n, _) = read_plain(stream, rbuf, &ReadBuffers::new(READ_CHUNK)).expect("read");
            assert!(n > 0, "EOF before {want} bytes");
            assert!(n <= READ_CHUNK);
            assert_eq!(rbuf.len(), before + n);
        }
        assert_eq!(rbuf.len(), want);
    }

    /// A partial frame kept at the front of the read buffer comes through reads intact, and
    /// so does every byte read after it: a few small reads, a read that fills all the room
    /// offered (not short), reads that make the buffer grow, and EOF.
    fn reads_keep_the_front_and_every_byte(mut r: Stream, mut w: impl Write + Send + 'static) {
        let front = b"a partial frame".to_vec();
        // 20 000 bytes of room: more than the quarter chunk that makes a read reserve, so
        // the first reads go into exactly this room.
        let mut rbuf = BytesMut::with_capacity(front.len() + 20_000);
        rbuf.extend_from_slice(&front);
        let mut sent = 0;
        for n in [1, 100, 3000] {
            w.write_all(&pattern(sent, n)).expect("write");
            sent += n;
            read_to(&mut r, &mut rbuf, front.len() + sent);
        }
        // Room left: 20 000 − 3 101 bytes; written in full before the read (on loopback and
        // a socket pair a write that returns has queued its bytes at the reader), so the read
        // fills it and is not short.
        let room = rbuf.capacity() - rbuf.len();
        assert!((READ_CHUNK / 4..READ_CHUNK).contains(&room), "{room}");
        w.write_all(&pattern(sent, room)).expect("write");
        sent += room;
        let (n, short) =
            read_plain(&mut r, &mut rbuf, &ReadBuffers::new(READ_CHUNK)).expect("read");
        assert_eq!((n, short), (room, false));
        // More than two chunks: the buffer grows, moving what it holds.
        let big = 2 * READ_CHUNK + 12_345;
        let tail = pattern(sent, big);
        let writer = std::thread::spawn(move || {
            w.write_all(&tail).expect("write");
            // Dropping the writer closes its end: EOF.
        });
        sent += big;
        read_to(&mut r, &mut rbuf, front.len() + sent);
        writer.join().expect("writer");
        assert_eq!(&rbuf[..front.len()], &front[..]);
        assert!(rbuf[front.len()..] == pattern(0, sent)[..], "bytes changed");
        let held = rbuf.len();
        assert_eq!(
            read_plain(&mut r, &mut rbuf, &ReadBuffers::new(READ_CHUNK)).expect("EOF"),
            (0, true)
        );
        assert_eq!(rbuf.len(), held);
    }

    #[test]
    fn a_plain_read_keeps_a_partial_frame_and_every_byte_over_tcp() {
        let (r, w) = tcp_pair();
        reads_keep_the_front_and_every_byte(r, w);
    }

    #[cfg(unix)]
    #[test]
    fn a_plain_read_keeps_a_partial_frame_and_every_byte_over_a_unix_socket() {
        let (r, w) = unix_pair();
        reads_keep_the_front_and_every_byte(r, w);
    }
}
