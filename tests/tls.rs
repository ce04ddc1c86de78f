//! TLS (feature `tls`) over real TCP on 127.0.0.1, with certificates made at run time: two
//! members with certificates from a test CA exchange messages in order across a reconnect;
//! a member with a certificate from another CA, a member whose certificate names another
//! member (as acceptor and as dialler) and a plain TCP client are each refused and counted
//! while the good members keep talking; configuration errors say what is wrong; sends that
//! find the IO thread parked write their records on the sending thread.
#![cfg(feature = "tls")]

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use cohort::tls::{TlsConfig, TlsError};
use cohort::{Error, Node};
use support::certs::TestCa;
use support::*;

const CLUSTER: &str = "t-tls";

/// A TLS member named `name` with a certificate from `ca`, recording deliveries in `check`.
fn member(ca: &TestCa, name: &str, check: &Arc<OrderCheck>) -> cohort::Builder {
    Node::builder(name)
        .cluster(CLUSTER)
        .tls(ca.tls(name))
        .on_message(check.handler())
}

/// Two TLS members from one CA, connected both ways.
fn pair(ca: &TestCa, a: &str, b: &str) -> (Node, Node, Arc<OrderCheck>, Arc<OrderCheck>) {
    pair_with(ca, a, b, |builder| builder)
}

/// [`pair`], each member's builder passed through `tune` first.
fn pair_with(
    ca: &TestCa,
    a: &str,
    b: &str,
    tune: impl Fn(cohort::Builder) -> cohort::Builder,
) -> (Node, Node, Arc<OrderCheck>, Arc<OrderCheck>) {
    let (ca_check, cb_check) = (OrderCheck::new(), OrderCheck::new());
    let nb = tune(member(ca, b, &cb_check)).start().expect("start b");
    let na = tune(member(ca, a, &ca_check))
        .peer(b, nb.local_addr())
        .start()
        .expect("start a");
    nb.add_peer(a, na.local_addr()).expect("add_peer");
    wait_until("a and b connected over TLS", PATIENCE, || {
        is_connected(&na, b) && is_connected(&nb, a)
    });
    (na, nb, ca_check, cb_check)
}

/// Sends `n` more messages from `from` to `to` (counters continuing from `start`) and waits
/// until `check` has them all.
fn stream(from: &Node, to: &Node, check: &OrderCheck, start: u64, n: u64) {
    let s = from.sender();
    for i in start..start + n {
        send_patiently(&s, to.name(), payload(i, 8 + (i as usize % 300)));
    }
    wait_until_or(
        PATIENCE,
        || check.count_from(from.name()) >= start + n,
        || {
            format!(
                "{} messages from {}:\n{}",
                start + n,
                from.name(),
                to.stats()
            )
        },
    );
}

#[test]
fn members_with_certificates_from_the_ca_exchange_100k_messages_in_order_across_a_reconnect() {
    let ca = TestCa::new("cohort test CA");
    let (a, b, a_got, b_got) = pair(&ca, "alpha", "beta");
    const N: u64 = 100_000;
    // Varied sizes: mostly small, some of several TLS records (16 KiB each).
    let size = |i: u64| match i % 1000 {
        0 => 60_000,
        1..=9 => 17_000,
        _ => 8 + (i as usize * 7919) % 1500,
    };
    let back = {
        let (b_tx, a_name) = (b.sender(), a.name().to_owned());
        std::thread::spawn(move || {
            for i in 0..N / 10 {
                send_patiently(&b_tx, &a_name, payload(i, 8 + (i as usize % 700)));
            }
        })
    };
    let s = a.sender();
    for i in 0..N {
        send_patiently(&s, "beta", payload(i, size(i)));
        if i == N / 2 {
            // A reconnect in the middle: the recovery handshake runs inside a new TLS
            // session, and what was in flight is resent.
            a.disconnect("beta").expect("disconnect");
        }
    }
    back.join().expect("sender thread");
    wait_until_or(
        PATIENCE,
        || b_got.count_from("alpha") >= N && a_got.count_from("beta") >= N / 10,
        || format!("all messages delivered:\n{}\n{}", a.stats(), b.stats()),
    );
    a_got.assert_ok();
    b_got.assert_ok();
    assert_eq!(b_got.total(), N, "nothing lost or duplicated");
    assert_eq!(a_got.total(), N / 10);
    wait_until("the reconnect", PATIENCE, || {
        peer_stats(&a, "beta").connects >= 2 && is_connected(&a, "beta")
    });
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.connections.tls_failures, 0, "{sa}");
    assert_eq!(sb.connections.tls_failures, 0, "{sb}");
    assert_eq!(sb.peer("alpha").expect("alpha").received, N, "{sb}");
    shutdown_all(&[a, b]);
}

/// With `IdleStrategy::Block` the IO thread parks whenever it is idle, and a send that
/// finds it parked runs its turn and writes on the sending thread (`IdleStats::
/// driven_turns`): over TLS, the records it writes are the connection's, in order with
/// the IO thread's own, and every message arrives whole and in order.
#[test]
fn sends_that_find_the_io_thread_parked_write_their_records_themselves() {
    const ROUNDS: u64 = 30;
    let ca = TestCa::new("driven-ca");
    let (na, nb, ca_check, cb_check) = pair_with(&ca, "a", "b", |builder| {
        builder.idle_strategy(cohort::IdleStrategy::Block)
    });
    let before = na.idle_stats().driven_turns;
    for i in 0..ROUNDS {
        // Past the spacing between driven turns, then until a's IO thread is parked.
        na.advance_clock(Duration::from_millis(1));
        wait_until("a's IO thread parked", PATIENCE, || na.io_parked());
        na.send("b", payload(i, 8 + (i as usize * 97) % 3000))
            .expect("send");
        wait_until_or(
            PATIENCE,
            || cb_check.count_from("a") == i + 1,
            || format!("message {i} delivered:\n{}", nb.stats()),
        );
    }
    cb_check.assert_got_exactly("b", &["a"], ROUNDS);
    assert!(
        na.idle_stats().driven_turns > before,
        "no send drove a turn:\n{}",
        na.stats()
    );
    // And a stream after them, which the IO thread takes in batches.
    stream(&na, &nb, &cb_check, ROUNDS, 2_000);
    cb_check.assert_ok();
    ca_check.assert_ok();
    shutdown_all(&[na, nb]);
}

#[test]
fn a_member_with_a_certificate_from_another_ca_is_refused() {
    let ca = TestCa::new("cohort test CA");
    let other = TestCa::new("another CA");
    let (a, b, _, b_got) = pair(&ca, "alpha", "beta");
    // "gamma" is configured on beta, but its certificate comes from another CA (it trusts
    // ours, so the refusal is beta's, as the acceptor and as the dialler).
    let g = Node::builder("gamma")
        .cluster(CLUSTER)
        .tls(other.tls_trusting("gamma", &ca))
        .peer("beta", b.local_addr())
        .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(50))
        .start()
        .expect("start gamma");
    b.add_peer("gamma", g.local_addr()).expect("add gamma");
    let accepted_before = b.stats().connections.accepted;
    for i in 0..10 {
        g.try_send("beta", payload(i, 16)).expect("queued");
    }
    wait_until_or(
        PATIENCE,
        || {
            let c = b.stats().connections;
            c.tls_failures >= 2 && c.accepted > accepted_before
        },
        || format!("beta refuses gamma's certificate:\n{}", b.stats()),
    );
    // Meanwhile alpha and beta keep talking.
    stream(&a, &b, &b_got, 0, 2_000);
    let sb = b.stats();
    assert_eq!(b_got.count_from("gamma"), 0, "nothing from gamma delivered");
    let gs = sb.peer("gamma").expect("gamma configured");
    assert_eq!((gs.connects, gs.received), (0, 0), "{sb}");
    assert_eq!(
        peer_stats(&b, "alpha").connects,
        1,
        "alpha undisturbed: {sb}"
    );
    assert!(g.stats().connections.tls_failures >= 1, "gamma sees it too");
    b_got.assert_ok();
    shutdown_all(&[a, b, g]);
}

/// Waits until `node` has counted at least `n` TLS failures.
fn wait_tls_failures(node: &Node, n: u64, what: &str) {
    wait_until_or(
        PATIENCE,
        || node.stats().connections.tls_failures >= n,
        || format!("{what}:\n{}", node.stats()),
    );
}

/// The dialler's identifying handshake frame (what a dialler sends once it has the
/// acceptor's `Hello`), claiming member `name` of our cluster.
fn hello_reply(name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let id = cohort::internals::wire::Identity {
        version: cohort::internals::wire::VERSION,
        launch_id: 42,
        window: 1 << 20,
        max_message: 1 << 16,
        cluster: CLUSTER,
        name,
        nonce: None,
    };
    cohort::internals::wire::encode_hello_reply(&mut out, &id, 0, 0, 0, None);
    out
}

/// A TLS client with a valid certificate naming `cert_name`, which connects to `target`,
/// completes TLS and claims to be `claimed` in the cohort handshake. Returns what the node
/// wrote back after its `Hello` until it closed the connection.
fn impostor(ca: &TestCa, target: &Node, cert_name: &str, claimed: &str) -> Vec<u8> {
    use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};
    let m = ca.member(cert_name);
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).expect("CA"))
        .expect("root");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_client_auth_cert(
        vec![CertificateDer::from_pem_slice(m.cert_pem.as_bytes()).expect("cert")],
        PrivateKeyDer::from_pem_slice(m.key_pem.as_bytes()).expect("key"),
    )
    .expect("client config");
    let server = ServerName::try_from(target.name().to_owned()).expect("server name");
    let conn = rustls::ClientConnection::new(Arc::new(config), server).expect("client");
    let tcp = TcpStream::connect(target.local_addr()).expect("connect");
    tcp.set_read_timeout(Some(PATIENCE)).expect("timeout");
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(&hello_reply(claimed))
        .expect("TLS handshake and HelloReply");
    tls.flush().expect("flush");
    let mut back = Vec::new();
    // Until the node closes: EOF (clean or not) or a reset ends the read.
    let _ = tls.read_to_end(&mut back);
    back
}

#[test]
fn a_member_whose_certificate_names_another_member_is_refused_by_the_acceptor() {
    let ca = TestCa::new("cohort test CA");
    let (a, b, _, b_got) = pair(&ca, "alpha", "beta");
    // "gamma" is configured on beta but never up: nothing listens at its address.
    let gamma = HeldAddr::new();
    b.add_peer("gamma", gamma.addr()).expect("gamma");
    // A client holding alpha's certificate (valid, from our CA) claims to be gamma.
    let back = impostor(&ca, &b, "alpha", "gamma");
    wait_tls_failures(&b, 1, "beta refuses the impostor");
    // What came back: beta's Hello, then a Close naming the mismatch.
    let text = String::from_utf8_lossy(&back);
    assert!(
        text.contains("not valid for the member name"),
        "the refusal tells why: {text:?}"
    );
    stream(&a, &b, &b_got, 0, 2_000);
    let sb = b.stats();
    assert_eq!(sb.peer("gamma").expect("gamma").connects, 0, "{sb}");
    assert_eq!(sb.peer("alpha").expect("alpha").connects, 1, "{sb}");
    // And one claiming a name its certificate does carry is let through the name check
    // (it then fails the handshake only because it is not a configured member).
    let tls_before = sb.connections.tls_failures;
    let _ = impostor(&ca, &b, "delta", "delta");
    wait_until("delta refused as unknown", PATIENCE, || {
        b.stats().connections.refused_unknown >= 1
    });
    assert_eq!(b.stats().connections.tls_failures, tls_before);
    shutdown_all(&[a, b]);
}

#[test]
fn a_peer_whose_certificate_names_another_member_is_refused_by_the_dialler() {
    let ca = TestCa::new("cohort test CA");
    let (a, b, _, b_got) = pair(&ca, "alpha", "beta");
    // "gamma" listens with a valid certificate for "gamma"; beta believes the member at
    // that address is "delta", so gamma's certificate does not match the name beta dials.
    let g = Node::builder("gamma")
        .cluster(CLUSTER)
        .tls(ca.tls("gamma"))
        .start()
        .expect("gamma");
    b.add_peer("delta", g.local_addr()).expect("delta");
    wait_tls_failures(&b, 1, "beta refuses gamma's certificate for delta");
    stream(&a, &b, &b_got, 0, 1_000);
    assert_eq!(peer_stats(&b, "delta").connects, 0);
    assert_eq!(g.stats().connections.handshakes, 0);
    shutdown_all(&[a, b, g]);
}

#[test]
fn a_plain_client_to_a_tls_node_is_refused_without_harm() {
    let ca = TestCa::new("cohort test CA");
    let (a, b, _, b_got) = pair(&ca, "alpha", "beta");
    // Raw TCP speaking the plain cohort handshake (a HelloReply, as a plain dialler would).
    let mut raw = TcpStream::connect(b.local_addr()).expect("connect");
    raw.set_read_timeout(Some(PATIENCE)).expect("timeout");
    raw.write_all(&hello_reply("alpha")).expect("write");
    let mut back = Vec::new();
    let _ = raw.read_to_end(&mut back); // closed by beta
    wait_tls_failures(&b, 1, "beta refuses the plain client");
    // A plain cohort node beta dials: beta's TLS client gets plain frames and fails.
    let plain = Node::builder("gamma")
        .cluster(CLUSTER)
        .handshake_timeout(Duration::from_millis(500))
        .start()
        .expect("plain gamma");
    b.add_peer("gamma", plain.local_addr()).expect("gamma");
    wait_tls_failures(&b, 2, "beta refuses plain gamma");
    stream(&a, &b, &b_got, 0, 2_000);
    let sb = b.stats();
    assert_eq!(sb.peer("alpha").expect("alpha").connects, 1, "{sb}");
    assert_eq!(sb.peer("gamma").expect("gamma").connects, 0, "{sb}");
    assert_eq!(plain.stats().connections.handshakes, 0);
    shutdown_all(&[a, b, plain]);
}

#[test]
fn tls_configuration_errors_name_the_file_and_the_problem() {
    let tmp = TempDir::new("tls-config");
    let dir = tmp.path();
    std::fs::create_dir_all(dir).expect("temp dir");
    let ca = TestCa::new("cohort test CA");
    let m = ca.member("alpha");
    let (ca_path, cert_path, key_path) = (
        dir.join("ca.pem"),
        dir.join("alpha.pem"),
        dir.join("alpha.key"),
    );
    std::fs::write(&ca_path, ca.pem()).expect("write");
    std::fs::write(&cert_path, &m.cert_pem).expect("write");
    std::fs::write(&key_path, &m.key_pem).expect("write");
    TlsConfig::from_pem_files(&ca_path, &cert_path, &key_path).expect("good files load");

    let missing = dir.join("missing.pem");
    let e = TlsConfig::from_pem_files(&missing, &cert_path, &key_path).unwrap_err();
    assert!(matches!(e, TlsError::File { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("missing.pem") && msg.contains("CA certificate"),
        "{msg}"
    );

    // A key where the certificate should be.
    let e = TlsConfig::from_pem_files(&ca_path, &key_path, &key_path).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("alpha.key") && msg.contains("no CERTIFICATE"),
        "{msg}"
    );

    // A certificate where the key should be.
    let e = TlsConfig::from_pem_files(&ca_path, &cert_path, &cert_path).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("alpha.pem") && msg.contains("private key"),
        "{msg}"
    );

    // A key that is not the certificate's.
    let other = ca.member("alpha");
    let e = TlsConfig::from_pem(
        ca.pem().as_bytes(),
        m.cert_pem.as_bytes(),
        other.key_pem.as_bytes(),
    )
    .unwrap_err();
    assert!(matches!(e, TlsError::Rustls { .. }), "{e:?}: {e}");

    // Converts into the node's error for `?`.
    let e: Error = TlsError::Verifier("x".into()).into();
    assert!(e.to_string().contains("TLS"), "{e}");
}

#[test]
fn member_names_must_be_dns_names_and_the_certificate_must_name_the_member() {
    let ca = TestCa::new("cohort test CA");
    // `start` fails with a configuration error whose message says all of `says`.
    let refused = |b: cohort::Builder, says: &[&str]| match b.start() {
        Err(Error::Config(c)) => {
            let m = c.to_string();
            assert!(says.iter().all(|s| m.contains(s)), "{m}")
        }
        other => panic!("expected a configuration error saying {says:?}, got {other:?}"),
    };
    refused(
        Node::builder("node 1").tls(ca.tls("alpha")),
        &["node 1", "DNS"],
    );
    refused(
        Node::builder("alpha")
            .tls(ca.tls("alpha"))
            .peer("10.0.0.1", "127.0.0.1:1"),
        &["10.0.0.1", "IP address"],
    );
    refused(
        Node::builder("alpha").tls(ca.tls("beta")),
        &["own certificate", "alpha"],
    );
    let a = Node::builder("alpha")
        .tls(ca.tls("alpha"))
        .start()
        .expect("a valid member starts");
    let e = a.add_peer("bad name", "127.0.0.1:1").unwrap_err();
    assert!(
        matches!(&e, Error::Config(c @ cohort::ConfigError::Name { setting: "add_peer", .. }) if c.to_string().contains("DNS")),
        "{e}"
    );
    shutdown_all(&[a]);
}

/// TLS over Unix-domain sockets: the same certificates and member-name checks as over TCP.
/// Two members on socket files exchange messages both ways across a reconnect; a member
/// with a certificate from another CA is refused on the socket.
#[cfg(unix)]
#[test]
fn members_on_unix_sockets_speak_tls_and_a_certificate_from_another_ca_is_refused_there() {
    let ca = TestCa::new("cohort test CA");
    let dir = TempDir::new("tls-uds");
    std::fs::create_dir_all(dir.path()).expect("socket dir");
    let at = |name: &str| cohort::Addr::unix(dir.path().join(format!("{name}.sock")));
    let (a_got, b_got) = (OrderCheck::new(), OrderCheck::new());
    let b = member(&ca, "beta", &b_got)
        .listen(at("beta"))
        .start()
        .expect("start b");
    let a = member(&ca, "alpha", &a_got)
        .listen(at("alpha"))
        .peer("beta", b.listen_addr())
        .start()
        .expect("start a");
    b.add_peer("alpha", a.listen_addr()).expect("add_peer");
    stream(&a, &b, &b_got, 0, 2_000);
    stream(&b, &a, &a_got, 0, 2_000);
    let before = peer_stats(&a, "beta").connects;
    a.disconnect("beta").expect("disconnect");
    wait_until("the reconnect over TLS", PATIENCE, || {
        peer_stats(&a, "beta").connects > before && is_connected(&a, "beta")
    });
    stream(&a, &b, &b_got, 2_000, 2_000);
    b_got.assert_got_exactly("beta", &["alpha"], 4_000);
    // A member with a certificate from another CA: refused by b on its socket.
    b.add_peer("gamma", at("gamma")).expect("gamma");
    let other = TestCa::new("another CA");
    let impostor = Node::builder("gamma")
        .cluster(CLUSTER)
        .tls(other.tls("gamma"))
        .peer("beta", b.listen_addr())
        .start()
        .expect("start impostor");
    wait_until("b refused the impostor", PATIENCE, || {
        b.stats().connections.tls_failures >= 1
    });
    assert!(!is_connected(&impostor, "beta"));
    shutdown_all(&[impostor, a, b]);
}

/// Membership over TLS: seeds are refused (a seed names no certificate to verify), so two
/// members each name the first with `peer`; they join the view through it, learn each
/// other from it and connect to each other over TLS, each verifying the other's
/// certificate for the name the view gave.
#[test]
fn tls_members_join_the_view_through_a_member_named_with_peer() {
    use cohort::MemberState;
    use std::collections::BTreeSet;
    let ca = TestCa::new("t-tls-members-ca");
    let check = OrderCheck::new();
    let secret = b"tls membership secret";
    let start = |name: &str, via: Option<&Node>| {
        let mut b = member(&ca, name, &check)
            .listen("127.0.0.1:0")
            .secret(secret)
            .membership(true)
            .membership_interval(Duration::from_millis(100));
        if let Some(via) = via {
            b = b.peer(via.name(), via.local_addr());
        }
        b.start().expect("start a TLS member")
    };
    let a = start("tls-m-a", None);
    let b = start("tls-m-b", Some(&a));
    let c = start("tls-m-c", Some(&a));
    let all: BTreeSet<String> = ["tls-m-a", "tls-m-b", "tls-m-c"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let alive = |n: &Node| -> BTreeSet<String> {
        n.members()
            .into_iter()
            .filter(|m| m.state == MemberState::Alive)
            .map(|m| m.name)
            .collect()
    };
    wait_until_or(
        PATIENCE,
        || {
            [&a, &b, &c].iter().all(|n| alive(n) == all)
                && is_connected(&b, "tls-m-c")
                && is_connected(&c, "tls-m-b")
        },
        || {
            format!(
                "b: {:?}\n{}\nc: {:?}\n{}",
                b.members(),
                b.stats(),
                c.members(),
                c.stats()
            )
        },
    );
    assert!(matches!(
        Node::builder("tls-m-d")
            .tls(ca.tls("tls-m-d"))
            .seed(a.local_addr())
            .start(),
        Err(Error::Config(_))
    ));
    shutdown_all(&[a, b, c]);
}
