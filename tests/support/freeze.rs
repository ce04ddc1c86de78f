//! A TCP forwarder whose connections can go silent: the network stops carrying bytes but
//! neither side sees a reset, as with a half-open connection after a partition. For the
//! failure-detection tests; plain threads and blocking sockets on 127.0.0.1.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// A TCP forwarder whose existing connections can be frozen: their bytes stop flowing in
/// both directions, but the sockets stay open, so no side sees EOF or a reset.
pub(crate) struct FreezingProxy {
    addr: SocketAddr,
    frozen: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    sockets: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<thread::JoinHandle<()>>,
}

impl FreezingProxy {
    /// Starts forwarding from an ephemeral port on 127.0.0.1 to `target`.
    pub(crate) fn start(target: SocketAddr) -> FreezingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let frozen = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let sockets: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (f, st, socks) = (frozen.clone(), stop.clone(), sockets.clone());
        let acceptor = thread::spawn(move || {
            for client in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                // Connections made while frozen stay frozen too.
                let pair_frozen = Arc::new(AtomicBool::new(f.load(Ordering::SeqCst)));
                {
                    let mut s = socks.lock().expect("sockets");
                    s.push(client.try_clone().expect("clone"));
                    s.push(server.try_clone().expect("clone"));
                }
                for (from, to) in [
                    (
                        client.try_clone().expect("clone"),
                        server.try_clone().expect("clone"),
                    ),
                    (server, client),
                ] {
                    let (global, pair) = (f.clone(), pair_frozen.clone());
                    thread::spawn(move || pump(from, to, &global, &pair));
                }
            }
        });
        FreezingProxy {
            addr,
            frozen,
            stop,
            sockets,
            acceptor: Some(acceptor),
        }
    }

    /// The address to dial instead of the target.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Freezes every connection open now (and any made while frozen).
    pub(crate) fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// New connections flow again; the frozen ones stay frozen (they are dead to both ends).
    pub(crate) fn thaw_new(&self) {
        self.frozen.store(false, Ordering::SeqCst);
    }
}

impl Drop for FreezingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for s in self.sockets.lock().expect("sockets").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        let _ = TcpStream::connect(self.addr); // unblock accept
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
    }
}

/// Copies `from` to `to` until either closes. Once `pair` is frozen the bytes read are
/// dropped on the floor: the connection is silent in both directions but stays open.
fn pump(mut from: TcpStream, mut to: TcpStream, global: &AtomicBool, pair: &AtomicBool) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if global.load(Ordering::SeqCst) {
            pair.store(true, Ordering::SeqCst);
        }
        if pair.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
