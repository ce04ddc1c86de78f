//! Addresses for members that are not up: where a test needs an address before the node
//! that will listen on it exists (a peer configured before it starts), or after that node
//! has stopped (a member restarted on the same address), or an address where nothing ever
//! listens (a peer that is down for the whole test).
//!
//! Binding an ephemeral port and releasing it at once to "reserve" it is a race: between
//! the release and the node's bind, another socket may take the port — another test's
//! listener, or any dial, which gets an ephemeral port as its source (and a dial from the
//! very port it dials connects to itself when nothing listens there). `Builder::listen`
//! takes an address, not a bound listener, so the port cannot be handed over bound;
//! [`HeldAddr`] keeps it bound instead, in a way that still lets the node listen on it.

use std::net::{Ipv4Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};

/// An address on 127.0.0.1 held for a member that is not up: a socket bound to it with
/// `SO_REUSEADDR` that never listens. While it is held:
///
/// - a dial to it is refused, as to any address where nothing listens;
/// - no other socket takes the port: the kernel gives a bound port to no `bind(…:0)` and to
///   no dial as its source port, and binding it without `SO_REUSEADDR` fails;
/// - a node can listen on it all the same, and again after that node stops: a node's
///   listener sets `SO_REUSEADDR`, and Linux lets two sockets that both set it share a port
///   as long as at most one of them listens.
///
/// So a test keeps the `HeldAddr` for as long as any incarnation of the member may listen
/// there — usually the whole test — and the port stays the test's between incarnations.
/// (This relies on Linux's rules for `SO_REUSEADDR`, as the tests' use of `/proc` does.)
#[derive(Debug)]
pub(crate) struct HeldAddr {
    _socket: Socket,
    addr: SocketAddr,
}

impl HeldAddr {
    /// Holds an ephemeral port on 127.0.0.1.
    pub(crate) fn new() -> HeldAddr {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))
            .expect("a socket to hold a port");
        socket.set_reuse_address(true).expect("SO_REUSEADDR");
        socket
            .bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())
            .expect("bind an ephemeral port on 127.0.0.1");
        let addr = socket
            .local_addr()
            .expect("the held address")
            .as_socket()
            .expect("an IPv4 address");
        HeldAddr {
            _socket: socket,
            addr,
        }
    }

    /// The held address: give it to the member's `Builder::listen`, and to its peers.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}
