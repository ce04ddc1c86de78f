//! Where a member listens and where its peers are: a TCP address, or the path of a
//! Unix-domain socket for members on one host.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The prefix that names a Unix-domain socket in an address's text form
/// (`unix:/run/app/alpha.sock`): [`Addr`]'s `Display` writes it and its `FromStr` reads it.
pub(crate) const UNIX_PREFIX: &str = "unix:";

/// A member's address: TCP, or a Unix-domain socket's path (members on one host).
///
/// [`Builder::listen`](crate::Builder::listen), [`Builder::peer`](crate::Builder::peer)
/// and [`Node::add_peer`](crate::Node::add_peer) take any [`ToAddr`]: everything that
/// [`ToSocketAddrs`] takes (`"127.0.0.1:7000"`, `("host", 7000)`, a `SocketAddr`), or an
/// `Addr`. A Unix socket is named with [`Addr::unix`], or parsed from its text form
/// `unix:<path>` (a configuration file's string):
///
/// ```no_run
/// use cohort::Addr;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let beta: Addr = "unix:/run/app/beta.sock".parse()?;
/// let node = cohort::Node::builder("alpha")
///     .listen(Addr::unix("/run/app/alpha.sock"))
///     .peer("beta", beta)
///     .start()?;
/// assert_eq!(node.listen_addr().to_string(), "unix:/run/app/alpha.sock");
/// # Ok(()) }
/// ```
///
/// Unix-domain sockets need a Unix host: elsewhere, a node given one fails to start with
/// [`Error::Config`](crate::Error::Config).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Addr {
    /// A TCP address.
    Tcp(SocketAddr),
    /// The path of a Unix-domain socket.
    Unix(PathBuf),
}

impl Addr {
    /// The Unix-domain socket at `path`.
    pub fn unix(path: impl Into<PathBuf>) -> Addr {
        Addr::Unix(path.into())
    }

    /// The TCP address, if this is one.
    pub fn as_tcp(&self) -> Option<SocketAddr> {
        match self {
            Addr::Tcp(a) => Some(*a),
            Addr::Unix(_) => None,
        }
    }

    /// The socket's path, if this is a Unix-domain socket.
    pub fn as_unix(&self) -> Option<&Path> {
        match self {
            Addr::Tcp(_) => None,
            Addr::Unix(p) => Some(p),
        }
    }

    /// Whether only this host reaches the address: a loopback TCP address, or any
    /// Unix-domain socket.
    pub fn is_local(&self) -> bool {
        match self {
            Addr::Tcp(a) => a.ip().is_loopback(),
            Addr::Unix(_) => true,
        }
    }

    /// The source that admission counts a connection from this address under: its IP; all
    /// of a Unix socket's connections come from this host, and count as loopback's.
    pub(crate) fn source_ip(&self) -> IpAddr {
        match self {
            Addr::Tcp(a) => a.ip(),
            Addr::Unix(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }
}

impl fmt::Display for Addr {
    /// A TCP address as `SocketAddr` writes it, a Unix socket as `unix:<path>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Tcp(a) => a.fmt(f),
            Addr::Unix(p) => write!(f, "{UNIX_PREFIX}{}", p.display()),
        }
    }
}

impl From<SocketAddr> for Addr {
    fn from(a: SocketAddr) -> Addr {
        Addr::Tcp(a)
    }
}

impl PartialEq<SocketAddr> for Addr {
    fn eq(&self, other: &SocketAddr) -> bool {
        self.as_tcp() == Some(*other)
    }
}

impl PartialEq<Addr> for SocketAddr {
    fn eq(&self, other: &Addr) -> bool {
        other == self
    }
}

/// What [`Addr`]'s `FromStr` says of text it cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{text}' is not an address: {problem}")]
pub struct AddrParseError {
    text: String,
    problem: &'static str,
}

impl FromStr for Addr {
    type Err = AddrParseError;

    /// `unix:<path>` (a non-empty path) is a Unix-domain socket; anything else must be a
    /// numeric TCP address (`127.0.0.1:7000`, `[::1]:7000`). Host names are resolved by
    /// [`ToAddr`] (`Builder::listen("localhost:7000")`), never here.
    fn from_str(s: &str) -> Result<Addr, AddrParseError> {
        let err = |problem| AddrParseError {
            text: s.to_owned(),
            problem,
        };
        match s.strip_prefix(UNIX_PREFIX) {
            Some("") => Err(err("a Unix socket's path is empty")),
            Some(path) => Ok(Addr::unix(path)),
            None => s
                .parse::<SocketAddr>()
                .map(Addr::Tcp)
                .map_err(|_| err("expected ip:port or unix:<path>")),
        }
    }
}

/// What names a member's address: everything [`ToSocketAddrs`] takes (resolved, the first
/// address kept), and [`Addr`] itself (a TCP address or a Unix-domain socket).
pub trait ToAddr {
    /// The address; an error if it does not resolve.
    fn to_addr(&self) -> io::Result<Addr>;
}

impl<T: ToSocketAddrs + ?Sized> ToAddr for T {
    fn to_addr(&self) -> io::Result<Addr> {
        self.to_socket_addrs()?
            .next()
            .map(Addr::Tcp)
            .ok_or_else(|| io::Error::other("the address resolved to nothing"))
    }
}

impl ToAddr for Addr {
    fn to_addr(&self) -> io::Result<Addr> {
        Ok(self.clone())
    }
}

impl ToAddr for &Addr {
    fn to_addr(&self) -> io::Result<Addr> {
        Ok((*self).clone())
    }
}

/// A seed as given to [`Builder::seed`](crate::Builder::seed): fixed addresses, or a host
/// name and port that the node resolves at start and again, with backoff, whenever it reaches
/// no member (a name may resolve to several addresses, and to others later: a DNS name
/// listing a cluster's members, as a Kubernetes headless service does). Made by
/// [`ToSeed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed(pub(crate) SeedKind);

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SeedKind {
    /// Addresses given as such: never resolved.
    Fixed(Vec<SocketAddr>),
    /// `host:port` with a host name: resolved when needed.
    Name(String),
    /// Not a seed: why.
    Invalid(String),
}

impl Seed {
    /// The seed's text form (`host:port`, or the addresses).
    pub(crate) fn given(&self) -> String {
        match &self.0 {
            SeedKind::Fixed(a) if a.len() == 1 => a[0].to_string(),
            SeedKind::Fixed(a) => format!("{a:?}"),
            SeedKind::Name(n) | SeedKind::Invalid(n) => n.clone(),
        }
    }

    fn from_text(text: &str) -> Seed {
        if let Ok(a) = text.parse::<SocketAddr>() {
            return Seed(SeedKind::Fixed(vec![a]));
        }
        match text.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                Seed(SeedKind::Name(text.to_owned()))
            }
            _ => Seed(SeedKind::Invalid(format!(
                "{text}: not host:port (a seed needs its port)"
            ))),
        }
    }

    fn from_host_port(host: &str, port: u16) -> Seed {
        match host.parse::<IpAddr>() {
            Ok(ip) => Seed(SeedKind::Fixed(vec![SocketAddr::new(ip, port)])),
            Err(_) => Seed::from_text(&format!("{host}:{port}")),
        }
    }
}

/// What [`Builder::seed`](crate::Builder::seed) takes: what [`ToSocketAddrs`] takes, kept
/// as given — a host name is resolved again later, an address stays as it is.
pub trait ToSeed {
    /// The seed.
    fn to_seed(&self) -> Seed;
}

impl ToSeed for Seed {
    fn to_seed(&self) -> Seed {
        self.clone()
    }
}

impl ToSeed for str {
    fn to_seed(&self) -> Seed {
        Seed::from_text(self)
    }
}

impl ToSeed for String {
    fn to_seed(&self) -> Seed {
        Seed::from_text(self)
    }
}

impl ToSeed for (&str, u16) {
    fn to_seed(&self) -> Seed {
        Seed::from_host_port(self.0, self.1)
    }
}

impl ToSeed for (String, u16) {
    fn to_seed(&self) -> Seed {
        Seed::from_host_port(&self.0, self.1)
    }
}

impl ToSeed for [SocketAddr] {
    fn to_seed(&self) -> Seed {
        Seed(SeedKind::Fixed(self.to_vec()))
    }
}

impl ToSeed for Vec<SocketAddr> {
    fn to_seed(&self) -> Seed {
        Seed(SeedKind::Fixed(self.clone()))
    }
}

impl<T: ToSeed + ?Sized> ToSeed for &T {
    fn to_seed(&self) -> Seed {
        (**self).to_seed()
    }
}

macro_rules! fixed_seed {
    ($($t:ty),*) => {$(
        impl ToSeed for $t {
            fn to_seed(&self) -> Seed {
                match self.to_socket_addrs() {
                    Ok(a) => Seed(SeedKind::Fixed(a.collect())),
                    Err(e) => Seed(SeedKind::Invalid(e.to_string())),
                }
            }
        }
    )*};
}

fixed_seed!(
    SocketAddr,
    std::net::SocketAddrV4,
    std::net::SocketAddrV6,
    (IpAddr, u16),
    (Ipv4Addr, u16),
    (std::net::Ipv6Addr, u16)
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_forms_round_trip() {
        let tcp: Addr = "127.0.0.1:7000".parse().expect("tcp");
        assert_eq!(tcp, Addr::Tcp(SocketAddr::from(([127, 0, 0, 1], 7000))));
        assert_eq!(tcp.to_string(), "127.0.0.1:7000");
        let unix: Addr = "unix:/run/a b.sock".parse().expect("unix");
        assert_eq!(unix, Addr::unix("/run/a b.sock"));
        assert_eq!(unix.to_string(), "unix:/run/a b.sock");
        assert_eq!(unix.to_string().parse::<Addr>(), Ok(unix.clone()));
        assert!(unix.is_local() && tcp.is_local());
        let e = "unix:".parse::<Addr>().unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
        let e = "alpha".parse::<Addr>().unwrap_err().to_string();
        assert!(e.contains("unix:<path>"), "{e}");
    }

    #[test]
    fn socket_addrs_and_addrs_are_addresses() {
        let a = ("127.0.0.1", 9).to_addr().expect("resolves");
        assert_eq!(a.as_tcp().map(|a| a.port()), Some(9));
        let u = Addr::unix("/tmp/x.sock");
        let by_ref: &Addr = &u;
        assert_eq!(ToAddr::to_addr(&by_ref).expect("itself"), u);
        assert_eq!(u.as_unix(), Some(Path::new("/tmp/x.sock")));
        assert!("nonsense".to_addr().is_err());
    }
}
