//! The IO thread's sockets, of either kind: a connection's [`Stream`] (TCP, or a
//! Unix-domain socket on a Unix host) and the node's [`Listener`], with what each kind does
//! differently: binding (a Unix socket's file: a stale one reclaimed, a live one never
//! taken, removed again on close), dialling, and the options a connection gets.

use std::io::{self, Read, Write};
use std::net::SocketAddr;

use mio::event::Source;
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};

use crate::addr::Addr;

/// A connection's socket.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(mio::net::UnixStream),
}

/// Calls `$body` with the stream of either kind bound to `$s`.
macro_rules! either {
    ($stream:expr, $s:ident => $body:expr) => {
        match $stream {
            Stream::Tcp($s) => $body,
            #[cfg(unix)]
            Stream::Unix($s) => $body,
        }
    };
}

impl Stream {
    /// Starts a non-blocking connect to `addr`. A Unix socket connects at once or fails
    /// (no listener: `ConnectionRefused`; no file: `NotFound`; a full accept queue:
    /// `WouldBlock`), and the dial is retried with backoff like a refused TCP connect.
    pub(crate) fn connect(addr: &Addr) -> io::Result<Stream> {
        match addr {
            Addr::Tcp(a) => TcpStream::connect(*a).map(Stream::Tcp),
            #[cfg(unix)]
            Addr::Unix(p) => mio::net::UnixStream::connect(p).map(Stream::Unix),
            #[cfg(not(unix))]
            Addr::Unix(_) => Err(unix_unsupported()),
        }
    }

    /// The socket's pending error (`SO_ERROR`): how a connect failed.
    pub(crate) fn take_error(&self) -> io::Result<Option<io::Error>> {
        either!(self, s => s.take_error())
    }

    /// Whether a connect completed: `Ok(false)` while it is still under way.
    pub(crate) fn connected(&self) -> io::Result<bool> {
        let peer = either!(self, s => s.peer_addr().map(drop));
        match peer {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The socket as socket2 sees it, for the calls mio does not offer (`recv` into
    /// uninitialised memory, socket options).
    #[inline]
    pub(crate) fn sock_ref(&self) -> socket2::SockRef<'_> {
        either!(self, s => socket2::SockRef::from(s))
    }

    /// Looks at the first byte waiting, without taking it: `Ok(0)` at the end of the
    /// stream.
    pub(crate) fn peek(&self, byte: &mut [u8; 1]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.peek(byte),
            #[cfg(unix)]
            Stream::Unix(s) => {
                let mut buf = [std::mem::MaybeUninit::uninit(); 1];
                let n = socket2::SockRef::from(s).peek(&mut buf)?;
                Ok(n)
            }
        }
    }

    /// Socket options for every connection, through socket2: `TCP_NODELAY` (TCP only; a
    /// Unix socket has no Nagle delay) and the buffer sizes asked for.
    pub(crate) fn configure(&self, node: &str, send: Option<usize>, recv: Option<usize>) {
        let sock = self.sock_ref();
        if matches!(self, Stream::Tcp(_)) {
            if let Err(e) = sock.set_tcp_nodelay(true) {
                log::warn!("{node}: cannot set TCP_NODELAY: {e}");
            }
        }
        if let Some(n) = send {
            if let Err(e) = sock.set_send_buffer_size(n) {
                log::warn!("{node}: cannot set SO_SNDBUF: {e}");
            }
        }
        if let Some(n) = recv {
            if let Err(e) = sock.set_recv_buffer_size(n) {
                log::warn!("{node}: cannot set SO_RCVBUF: {e}");
            }
        }
    }
}

impl Read for Stream {
    #[inline]
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        either!(self, s => s.read(buf))
    }
}

impl Write for Stream {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        either!(self, s => s.write(buf))
    }

    #[inline]
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        either!(self, s => s.write_vectored(bufs))
    }

    fn flush(&mut self) -> io::Result<()> {
        either!(self, s => s.flush())
    }
}

impl Source for Stream {
    fn register(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        either!(self, s => s.register(r, t, i))
    }

    fn reregister(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        either!(self, s => s.reregister(r, t, i))
    }

    fn deregister(&mut self, r: &Registry) -> io::Result<()> {
        either!(self, s => s.deregister(r))
    }
}

/// The node's listening socket.
#[derive(Debug)]
pub(crate) enum Listener {
    Tcp(TcpListener),
    #[cfg(unix)]
    Unix(UnixSocket),
}

/// A bound Unix-domain listener and its socket file, removed when it is dropped (the IO
/// thread stops) if the file is still the one it bound.
#[cfg(unix)]
#[derive(Debug)]
pub(crate) struct UnixSocket {
    listener: mio::net::UnixListener,
    path: std::path::PathBuf,
    /// The file's device and inode as bound: the file at `path` is removed only if it is
    /// still this one.
    file: (u64, u64),
}

#[cfg(unix)]
impl Drop for UnixSocket {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file);
        if ours {
            if let Err(e) = std::fs::remove_file(&self.path) {
                log::warn!("cannot remove the socket file {}: {e}", self.path.display());
            }
        }
    }
}

impl Listener {
    /// Listens on `addr` with an accept queue of `backlog`; returns the listener and the
    /// address it is bound to (the real port when port 0 was asked).
    pub(crate) fn bind(addr: &Addr, backlog: i32) -> io::Result<(Listener, Addr)> {
        match addr {
            Addr::Tcp(a) => {
                let (l, local) = bind_tcp(*a, backlog)?;
                Ok((Listener::Tcp(l), Addr::Tcp(local)))
            }
            #[cfg(unix)]
            Addr::Unix(p) => {
                let l = bind_unix(p, backlog)?;
                Ok((Listener::Unix(l), addr.clone()))
            }
            #[cfg(not(unix))]
            Addr::Unix(_) => Err(unix_unsupported()),
        }
    }

    /// Accepts one connection: the stream, and where it comes from (TCP: the dialler's
    /// address; a Unix socket's dialler has none, and its connections are said to come
    /// from the socket's path).
    pub(crate) fn accept(&self) -> io::Result<(Stream, Addr)> {
        match self {
            Listener::Tcp(l) => l.accept().map(|(s, a)| (Stream::Tcp(s), Addr::Tcp(a))),
            #[cfg(unix)]
            Listener::Unix(u) => u
                .listener
                .accept()
                .map(|(s, _)| (Stream::Unix(s), Addr::Unix(u.path.clone()))),
        }
    }
}

impl Source for Listener {
    fn register(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.register(r, t, i),
            #[cfg(unix)]
            Listener::Unix(u) => u.listener.register(r, t, i),
        }
    }

    fn reregister(&mut self, r: &Registry, t: Token, i: Interest) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.reregister(r, t, i),
            #[cfg(unix)]
            Listener::Unix(u) => u.listener.reregister(r, t, i),
        }
    }

    fn deregister(&mut self, r: &Registry) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.deregister(r),
            #[cfg(unix)]
            Listener::Unix(u) => u.listener.deregister(r),
        }
    }
}

fn bind_tcp(addr: SocketAddr, backlog: i32) -> io::Result<(TcpListener, SocketAddr)> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(backlog)?;
    socket.set_nonblocking(true)?;
    let listener = TcpListener::from_std(socket.into());
    let local_addr = listener.local_addr()?;
    Ok((listener, local_addr))
}

/// Binds a Unix-domain listener at `path`. A socket file already there is reclaimed only
/// if nothing listens on it (a connect is refused: a process that bound it died without
/// removing it); one a process listens on is never taken (`AddrInUse`), nor is a file that
/// is not a socket (`AlreadyExists`).
#[cfg(unix)]
fn bind_unix(path: &std::path::Path, backlog: i32) -> io::Result<UnixSocket> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    let sockaddr = socket2::SockAddr::unix(path)?;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the path exists and is not a socket; it is left as it is: remove it or \
                 choose another path",
            ));
        }
        let probe = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
        probe.set_nonblocking(true)?;
        match probe.connect(&sockaddr) {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                log::info!(
                    "removing the stale socket file {} (nothing listens on it)",
                    path.display()
                );
                match std::fs::remove_file(path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
            // Gone meanwhile: bind creates it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            // Accepted, or a full accept queue: a process listens there.
            Ok(()) => return Err(live()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(live()),
            Err(e) => return Err(e),
        }
    }
    fn live() -> io::Error {
        io::Error::new(
            io::ErrorKind::AddrInUse,
            "another process listens on this socket; it is not taken over: stop that \
             process or choose another path",
        )
    }
    let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
    socket.bind(&sockaddr)?;
    socket.listen(backlog)?;
    socket.set_nonblocking(true)?;
    let meta = std::fs::symlink_metadata(path)?;
    let std_listener: std::os::unix::net::UnixListener = socket.into();
    Ok(UnixSocket {
        listener: mio::net::UnixListener::from_std(std_listener),
        path: path.to_owned(),
        file: (meta.dev(), meta.ino()),
    })
}

#[cfg(not(unix))]
fn unix_unsupported() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "Unix-domain sockets need a Unix host",
    )
}

/// Whether `path` can be a Unix-domain socket's address here; the problem if not (too
/// long for the system's `sockaddr_un`, empty, or holding a NUL byte).
pub(crate) fn check_unix_path(path: &std::path::Path) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::net::SocketAddr as UnixAddr;

        let len = path.as_os_str().len();
        if len == 0 {
            return Err("a Unix socket's path is empty".into());
        }
        if path.as_os_str().as_bytes().contains(&0) {
            return Err("a Unix socket's path holds a NUL byte".into());
        }
        if UnixAddr::from_pathname(path).is_err() {
            // The longest path this system's socket address holds.
            let max = (1..=len)
                .rev()
                .find(|&n| UnixAddr::from_pathname("a".repeat(n)).is_ok())
                .unwrap_or(0);
            return Err(format!(
                "the socket path {} is {len} bytes; a Unix-domain socket's path holds at most \
                 {max} bytes here: choose a shorter one (a relative path, or a shorter \
                 directory)",
                path.display()
            ));
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Err("Unix-domain sockets need a Unix host".into())
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "cohort-socket-{}-{}",
            std::process::id(),
            crate::util::random_nonzero_u64()
        ));
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn a_unix_listener_reclaims_a_stale_file_never_a_live_one_and_removes_its_own() {
        let d = dir();
        let path = d.join("s.sock");
        // A stale file: bound, then the listener closed without removing it.
        drop(std::os::unix::net::UnixListener::bind(&path).expect("bind"));
        assert!(path.exists());
        let (live, local) = Listener::bind(&Addr::unix(&path), 16).expect("reclaims");
        assert_eq!(local, Addr::unix(&path));
        let e = Listener::bind(&Addr::unix(&path), 16).expect_err("live");
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        drop(live);
        assert!(!path.exists(), "removed on close");
        std::fs::write(&path, b"not a socket").expect("file");
        let e = Listener::bind(&Addr::unix(&path), 16).expect_err("a file");
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
        assert!(path.exists(), "left as it is");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_path_too_long_is_named_with_the_limit() {
        let long = std::path::PathBuf::from(format!("/tmp/{}", "x".repeat(200)));
        let e = check_unix_path(&long).expect_err("too long");
        assert!(e.contains("at most") && e.contains("bytes"), "{e}");
        assert!(check_unix_path(std::path::Path::new("/tmp/ok.sock")).is_ok());
    }
}
