//! TLS over a connection's non-blocking socket: a `rustls::Connection` pumped by the IO
//! thread, with no extra thread and no async runtime. `net`'s `Transport` calls it where the
//! plain path would read or write the socket.
//!
//! - **read**: ciphertext is read from the socket into the IO thread's scratch buffer (up
//!   to 64 KiB per syscall, as on the plain path; rustls' own `read_tls` would read 4 KiB at
//!   a time), fed to rustls slice by slice (`read_tls` + `process_new_packets`), and the
//!   plaintext is drained into the connection's read buffer after every slice, so rustls
//!   never holds more than one slice of it.
//! - **write**: the connection's coalesced frame buffer goes into `writer()` (encrypted into
//!   records of up to 16 KiB), and `write_tls` writes the records vectored, many per
//!   syscall, until the socket says `WouldBlock` or rustls has nothing left; writable
//!   interest stays registered while rustls `wants_write`.
//! - **failures** (bad certificate, unknown CA, garbage instead of TLS) surface as an
//!   `io::Error` wrapping [`TlsFailure`], which the IO thread counts and closes on.

use std::io::{self, BufRead, Read, Write};

use bytes::BytesMut;
use rustls::{ClientConnection, Connection, ServerConnection};

use super::TlsConfig;

/// Bytes rustls may hold for writing (plaintext before the handshake completes, records
/// not yet written) before `writer()` takes no more: the IO thread's write high-water mark.
const TLS_BUFFER: usize = 256 * 1024;

/// A TLS failure, carried inside an `io::Error` of kind `InvalidData`.
#[derive(Debug)]
pub(crate) struct TlsFailure(pub(crate) String);

impl std::fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TLS: {}", self.0)
    }
}

impl std::error::Error for TlsFailure {}

fn failure(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, TlsFailure(what.to_string()))
}

/// Whether `e` wraps a [`TlsFailure`].
pub(crate) fn is_failure(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<TlsFailure>())
}

/// One connection's TLS state.
#[derive(Debug)]
pub(crate) struct TlsPump {
    conn: Connection,
    /// The peer sent `close_notify`: no more data will come.
    closed: bool,
}

impl TlsPump {
    /// The TLS client of a dial to member `dialled` (its name is the TLS server name,
    /// checked against the acceptor's certificate), or the TLS server of an accepted
    /// connection.
    pub(crate) fn new(config: &TlsConfig, dialled: Option<&str>) -> Result<TlsPump, String> {
        let mut conn: Connection = match dialled {
            Some(name) => {
                let server_name = super::server_name(name)?;
                ClientConnection::new(config.client.clone(), server_name)
                    .map_err(|e| format!("cannot start a TLS client: {e}"))?
                    .into()
            }
            None => ServerConnection::new(config.server.clone())
                .map_err(|e| format!("cannot start a TLS server: {e}"))?
                .into(),
        };
        conn.set_buffer_limit(Some(TLS_BUFFER));
        Ok(TlsPump {
            conn,
            closed: false,
        })
    }

    #[inline]
    pub(crate) fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    /// Reads ciphertext once (at most `scratch`'s 64 KiB) and appends the plaintext it holds
    /// to `rbuf`. Returns the plaintext bytes (`0`: EOF, TCP or `close_notify`) and whether
    /// the socket read was short. A read that brings only records without data (handshake,
    /// resumption tickets) reads on, until data, EOF or `WouldBlock` (returned as an error, as
    /// on the plain path), so edge-triggered readiness is drained either way.
    pub(crate) fn read(
        &mut self,
        stream: &mut (impl Read + Write),
        rbuf: &mut BytesMut,
        scratch: &mut Vec<u8>,
    ) -> io::Result<(usize, bool)> {
        if scratch.len() < crate::proto::READ_CHUNK {
            scratch.resize(crate::proto::READ_CHUNK, 0);
        }
        loop {
            if self.closed {
                return Ok((0, true));
            }
            let n = stream.read(&mut scratch[..])?;
            if n == 0 {
                return Ok((0, true));
            }
            let short = n < scratch.len();
            let plain = self.feed(&scratch[..n], rbuf)?;
            if plain > 0 {
                return Ok((plain, short));
            }
        }
    }

    /// Hands ciphertext to rustls and drains the plaintext into `rbuf`.
    fn feed(&mut self, mut cipher: &[u8], rbuf: &mut BytesMut) -> io::Result<usize> {
        let mut plain = 0;
        while !cipher.is_empty() {
            let n = self.conn.read_tls(&mut cipher).map_err(failure)?;
            if n == 0 {
                self.closed = true; // close_notify received earlier: rustls reads no more
                break;
            }
            self.conn.process_new_packets().map_err(failure)?;
            let mut reader = self.conn.reader();
            loop {
                let taken = match reader.fill_buf() {
                    Ok([]) => {
                        self.closed = true; // close_notify
                        break;
                    }
                    Ok(chunk) => {
                        rbuf.extend_from_slice(chunk);
                        chunk.len()
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(failure(e)),
                };
                reader.consume(taken);
                plain += taken;
            }
        }
        Ok(plain)
    }

    /// Moves as much of `buf` as rustls takes into it and writes records until the socket is
    /// full or everything is out. Returns how many bytes of `buf` were taken (before the
    /// handshake completes, rustls holds the plaintext until it can encrypt it, and writes
    /// it as soon as the handshake is done; records not yet written keep
    /// [`wants_write`](TlsPump::wants_write) true).
    pub(crate) fn write(
        &mut self,
        stream: &mut (impl Read + Write),
        buf: &[u8],
    ) -> io::Result<usize> {
        let mut taken = 0;
        loop {
            if taken < buf.len() {
                taken += self.conn.writer().write(&buf[taken..])?;
            }
            if !self.conn.wants_write() {
                return Ok(taken);
            }
            match self.conn.write_tls(stream) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(taken),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether the peer's certificate (verified against the CA during the TLS handshake)
    /// is valid for member `name`.
    pub(crate) fn peer_valid_for(&self, name: &str) -> Result<(), String> {
        if self.conn.is_handshaking() {
            return Err("the TLS handshake is not complete".into());
        }
        let leaf = self
            .conn
            .peer_certificates()
            .and_then(|c| c.first())
            .ok_or_else(|| "the peer presented no certificate".to_string())?;
        super::cert_valid_for(leaf, name)
    }
}

#[cfg(test)]
mod tests {
    //! The pump over a real non-blocking socket pair on 127.0.0.1, without the IO thread: handshake, data both ways through the coalescing buffers, EOF semantics, and
    //! garbage instead of TLS.

    use std::time::{Duration, Instant};

    use super::*;
    use mio::net::TcpStream;
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa,
        KeyPair,
    };

    fn configs(names: &[&str]) -> Vec<TlsConfig> {
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("key")).expect("ca");
        names
            .iter()
            .map(|name| {
                let mut p = CertificateParams::new(vec![(*name).to_owned()]).expect("params");
                p.extended_key_usages = vec![
                    ExtendedKeyUsagePurpose::ServerAuth,
                    ExtendedKeyUsagePurpose::ClientAuth,
                ];
                let key = KeyPair::generate().expect("key");
                let cert = p.signed_by(&key, &ca).expect("sign");
                TlsConfig::from_pem(
                    ca.pem().as_bytes(),
                    cert.pem().as_bytes(),
                    key.serialize_pem().as_bytes(),
                )
                .expect("config")
            })
            .collect()
    }

    /// A connected non-blocking pair: (dialled side, accepted side).
    fn socket_pair() -> (TcpStream, TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        client.set_nonblocking(true).expect("nonblocking");
        server.set_nonblocking(true).expect("nonblocking");
        (TcpStream::from_std(client), TcpStream::from_std(server))
    }

    /// One end: socket, TLS state and the connection's buffers.
    struct End {
        stream: TcpStream,
        tls: TlsPump,
        rbuf: BytesMut,
        wbuf: Vec<u8>,
        wpos: usize,
        eof: bool,
    }

    impl End {
        fn new(stream: TcpStream, tls: TlsPump) -> End {
            End {
                stream,
                tls,
                rbuf: BytesMut::new(),
                wbuf: Vec::new(),
                wpos: 0,
                eof: false,
            }
        }

        /// One write pass and one read pass, as the IO thread would on readiness.
        fn pump(&mut self, scratch: &mut Vec<u8>) -> io::Result<()> {
            self.wpos += self.tls.write(&mut self.stream, &self.wbuf[self.wpos..])?;
            if self.wpos == self.wbuf.len() {
                self.wbuf.clear();
                self.wpos = 0;
            }
            loop {
                match self.tls.read(&mut self.stream, &mut self.rbuf, scratch) {
                    Ok((0, _)) => {
                        self.eof = true;
                        return Ok(());
                    }
                    Ok((n, _)) => assert!(n > 0),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        }
    }

    /// Pumps both ends until `done` or a deadline.
    fn pump_until(a: &mut End, b: &mut End, mut done: impl FnMut(&End, &End) -> bool) {
        let mut scratch = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done(a, b) {
            assert!(Instant::now() < deadline, "timed out pumping the pair");
            a.pump(&mut scratch).expect("pump a");
            b.pump(&mut scratch).expect("pump b");
            std::thread::yield_now();
        }
    }

    fn pair() -> (End, End) {
        let c = configs(&["alpha", "beta"]);
        let (dial, accept) = socket_pair();
        let a = End::new(dial, TlsPump::new(&c[0], Some("beta")).expect("client"));
        let b = End::new(accept, TlsPump::new(&c[1], None).expect("server"));
        (a, b)
    }

    #[test]
    fn data_flows_both_ways_and_names_are_checked() {
        let (mut a, mut b) = pair();
        // Written before the handshake: held by rustls until it completes.
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        a.wbuf.extend_from_slice(&big);
        b.wbuf.extend_from_slice(b"hello from beta");
        pump_until(&mut a, &mut b, |a, b| {
            b.rbuf.len() == big.len() && a.rbuf.len() == 15
        });
        assert_eq!(&b.rbuf[..], &big[..]);
        assert_eq!(&a.rbuf[..], b"hello from beta");
        assert!(!a.eof && !b.eof, "no data-less read was taken for EOF");
        b.tls
            .peer_valid_for("alpha")
            .expect("alpha's certificate names alpha");
        let e = b.tls.peer_valid_for("gamma").unwrap_err();
        assert!(e.contains("gamma"), "{e}");
        a.tls
            .peer_valid_for("beta")
            .expect("beta's certificate names beta");
    }

    #[test]
    fn close_notify_reads_as_eof() {
        let (mut a, mut b) = pair();
        a.wbuf.extend_from_slice(b"last words");
        pump_until(&mut a, &mut b, |_, b| b.rbuf.len() == 10);
        a.tls.conn.send_close_notify();
        pump_until(&mut a, &mut b, |_, b| b.eof);
        assert_eq!(&b.rbuf[..], b"last words");
    }

    #[test]
    fn plain_bytes_are_a_tls_failure() {
        let c = configs(&["beta"]);
        let (mut raw, accept) = socket_pair();
        let mut b = End::new(accept, TlsPump::new(&c[0], None).expect("server"));
        raw.write_all(b"\x10\x00\x00\x00 this is not a TLS record at all")
            .expect("write");
        let mut scratch = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        let e = loop {
            assert!(Instant::now() < deadline, "no failure reported");
            match b.pump(&mut scratch) {
                Ok(()) => std::thread::yield_now(),
                Err(e) => break e,
            }
        };
        assert!(is_failure(&e), "{e:?}");
        assert!(b.tls.wants_write(), "an alert is queued for the peer");
    }
}
