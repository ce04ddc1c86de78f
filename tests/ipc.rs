//! Members on one host over Unix-domain sockets (`Addr::unix`): the same protocol as over
//! TCP — messages both ways from the first instant, requests and replies, exactly-once
//! delivery across reconnects and across a member killed with SIGKILL and restarted on its
//! socket's path, authentication — and the socket file's lifecycle: a stale file reclaimed,
//! a live one never taken over, the file removed when the node stops, a path too long
//! refused with the limit.
//!
//! The killed member runs in a child process: this test binary re-executed with `--exact
//! ipc_child` (an ignored test that does nothing unless configured through `COHORT_IPC_*`
//! environment variables).
#![cfg(unix)]

mod support;

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cohort::{Addr, Delivery, Error, Event, FsyncPolicy, Node, RefuseReason};
use support::*;

const CLUSTER: &str = "ipc";

/// A directory for the test's sockets, created.
fn socket_dir(name: &str) -> TempDir {
    let dir = TempDir::new(name);
    std::fs::create_dir_all(dir.path()).expect("socket dir");
    dir
}

fn sock(dir: &TempDir, name: &str) -> PathBuf {
    dir.path().join(format!("{name}.sock"))
}

/// Leaves a stale socket file at `path`: a listener bound there and closed without removing
/// it, as a process killed while listening leaves it.
fn stale_socket(path: &Path) {
    drop(std::os::unix::net::UnixListener::bind(path).expect("bind the stale socket"));
    assert!(path.exists(), "the stale file is there");
}

#[test]
fn two_members_over_unix_sockets_exchange_messages_both_ways_from_the_first_instant() {
    let dir = socket_dir("ipc-both-ways");
    let (pa, pb) = (sock(&dir, "a"), sock(&dir, "b"));
    let (ca, cb) = (OrderCheck::new(), OrderCheck::new());
    let a = Node::builder("a")
        .cluster(CLUSTER)
        .listen(Addr::unix(&pa))
        .peer("b", Addr::unix(&pb))
        .on_message(ca.handler())
        .start()
        .expect("a starts");
    let b = Node::builder("b")
        .cluster(CLUSTER)
        .listen(Addr::unix(&pb))
        .peer("a", Addr::unix(&pa))
        .on_message(cb.handler())
        .start()
        .expect("b starts");
    assert_eq!(a.listen_addr(), Addr::unix(&pa));
    assert_eq!(
        a.listen_addr().to_string(),
        format!("unix:{}", pa.display())
    );
    assert!(
        pa.exists() && pb.exists(),
        "the socket files exist while the nodes run"
    );
    // No wait for the connection: both send at once, each its whole stream.
    const N: u64 = 5_000;
    let (ta, tb) = (a.sender(), b.sender());
    let other = std::thread::spawn(move || {
        for i in 0..N {
            send_patiently(&tb, "a", payload(i, 64));
        }
    });
    for i in 0..N {
        send_patiently(&ta, "b", payload(i, 1024));
    }
    other.join().expect("b's sender");
    wait_until_or(
        PATIENCE,
        || ca.count_from("b") == N && cb.count_from("a") == N,
        || format!("{}\n{}", a.stats(), b.stats()),
    );
    ca.assert_got_exactly("a", &["b"], N);
    cb.assert_got_exactly("b", &["a"], N);
    shutdown_all(&[a, b]);
    assert!(
        !pa.exists() && !pb.exists(),
        "a node removes its socket file when it stops"
    );
}

#[test]
fn requests_and_replies_cross_a_unix_socket() {
    let dir = socket_dir("ipc-requests");
    let server = Node::builder("server")
        .cluster(CLUSTER)
        .listen(Addr::unix(sock(&dir, "server")))
        .allow_unknown_members(true)
        .on_message(|d: Delivery| {
            let mut answer = b"re:".to_vec();
            answer.extend_from_slice(d.payload());
            d.reply(answer).expect("reply");
        })
        .start()
        .expect("server starts");
    // The client listens on TCP: a node's peers may be of either kind.
    let client = Node::builder("client")
        .cluster(CLUSTER)
        .peer("server", server.listen_addr())
        .start()
        .expect("client starts");
    for i in 0..500u64 {
        let reply = client
            .request("server", payload(i, 100), PATIENCE)
            .unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(&reply[..3], b"re:");
        assert_eq!(counter_of(&reply[3..]), Ok(i), "request {i}'s reply");
    }
    shutdown_all(&[client, server]);
}

#[test]
fn a_member_listening_on_tcp_and_one_on_a_unix_socket_dial_each_other() {
    let dir = socket_dir("ipc-mixed");
    let (ct, cu) = (OrderCheck::new(), OrderCheck::new());
    let tcp = Node::builder("tcp")
        .cluster(CLUSTER)
        .on_message(ct.handler())
        .start()
        .expect("tcp starts");
    let unix = Node::builder("unix")
        .cluster(CLUSTER)
        .listen(Addr::unix(sock(&dir, "unix")))
        .on_message(cu.handler())
        .start()
        .expect("unix starts");
    // Each dials the other at the kind of address it listens on.
    tcp.add_peer("unix", unix.listen_addr()).expect("add unix");
    unix.add_peer("tcp", tcp.local_addr()).expect("add tcp");
    for i in 0..200 {
        send_patiently(&tcp.sender(), "unix", payload(i, 64));
        send_patiently(&unix.sender(), "tcp", payload(i, 64));
    }
    wait_until("200 each way", PATIENCE, || {
        ct.count_from("unix") == 200 && cu.count_from("tcp") == 200
    });
    ct.assert_got_exactly("tcp", &["unix"], 200);
    cu.assert_got_exactly("unix", &["tcp"], 200);
    shutdown_all(&[tcp, unix]);
}

#[test]
fn connections_cut_over_a_unix_socket_lose_and_repeat_nothing() {
    let dir = socket_dir("ipc-cuts");
    let check = OrderCheck::new();
    let b = Node::builder("b")
        .cluster(CLUSTER)
        .listen(Addr::unix(sock(&dir, "b")))
        .allow_unknown_members(true)
        .on_message(check.handler())
        .start()
        .expect("b starts");
    let a = Node::builder("a")
        .cluster(CLUSTER)
        .listen(Addr::unix(sock(&dir, "a")))
        .peer("b", b.listen_addr())
        .redial_quickly()
        .start()
        .expect("a starts");
    const N: u64 = 20_000;
    let tx = a.sender();
    let sending = std::thread::spawn(move || {
        for i in 0..N {
            send_patiently(&tx, "b", payload(i, 256));
        }
    });
    // Cut the connection again and again while the stream flows; each reconnect resends
    // what b lacks and nothing it has.
    let mut cuts = 0;
    let deadline = Instant::now() + PATIENCE;
    while check.count_from("a") < N && Instant::now() < deadline {
        let before = peer_stats(&a, "b").connects;
        a.disconnect("b").expect("disconnect");
        cuts += 1;
        wait_until("the reconnect", PATIENCE, || {
            peer_stats(&a, "b").connects > before || check.count_from("a") == N
        });
    }
    sending.join().expect("sender");
    wait_until_or(
        PATIENCE,
        || check.count_from("a") == N,
        || format!("{}\n{}", a.stats(), b.stats()),
    );
    check.assert_got_exactly("b", &["a"], N);
    assert!(cuts >= 2, "the stream crossed {cuts} cuts");
    assert_eq!(peer_stats(&b, "a").duplicates, 0, "nothing delivered twice");
    shutdown_all(&[a, b]);
}

#[test]
fn a_stale_socket_file_is_reclaimed_and_a_live_one_is_never_taken_over() {
    let dir = socket_dir("ipc-stale");
    let path = sock(&dir, "m");
    stale_socket(&path);
    let counter = Counter::new();
    let m = Node::builder("m")
        .cluster(CLUSTER)
        .listen(Addr::unix(&path))
        .allow_unknown_members(true)
        .on_message(counter.handler())
        .start()
        .expect("m starts on the stale file");
    // A second node on the same path: refused, naming the path; m keeps its listener.
    let err = Node::builder("thief")
        .cluster(CLUSTER)
        .listen(Addr::unix(&path))
        .start()
        .expect_err("a live socket is not taken");
    let text = format!("{err}: {}", std::error::Error::source(&err).expect("cause"));
    assert!(text.contains(&path.display().to_string()), "{text}");
    assert!(text.contains("another process listens"), "{text}");
    match &err {
        Error::Listen { addr, source } => {
            assert_eq!(*addr, Addr::unix(&path));
            assert_eq!(source.kind(), ErrorKind::AddrInUse);
        }
        other => panic!("expected Error::Listen, got {other:?}"),
    }
    let c = Node::builder("c")
        .cluster(CLUSTER)
        .peer("m", Addr::unix(&path))
        .start()
        .expect("c starts");
    send_patiently(&c.sender(), "m", payload(0, 10));
    wait_until("m still answers on its path", PATIENCE, || {
        counter.get() == 1
    });
    shutdown_all(&[c, m]);
    assert!(!path.exists(), "removed on shutdown");

    // A file that is not a socket is left alone.
    std::fs::write(&path, b"data").expect("a plain file");
    let err = Node::builder("m")
        .listen(Addr::unix(&path))
        .start()
        .expect_err("not a socket");
    match &err {
        Error::Listen { source, .. } => assert_eq!(source.kind(), ErrorKind::AlreadyExists),
        other => panic!("expected Error::Listen, got {other:?}"),
    }
    assert_eq!(std::fs::read(&path).expect("still there"), b"data");
}

#[test]
fn a_socket_path_too_long_is_a_configuration_error_naming_the_limit() {
    let long = PathBuf::from("/tmp").join("d".repeat(120)).join("m.sock");
    let err = Node::builder("m")
        .listen(Addr::unix(&long))
        .start()
        .expect_err("too long");
    let text = err.to_string();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(
        text.contains("listen") && text.contains("at most"),
        "{text}"
    );
    let node = Node::builder("m").start().expect("starts");
    let err = node
        .add_peer("far", Addr::unix(&long))
        .expect_err("too long");
    assert!(err.to_string().contains("at most"), "{err}");
    node.shutdown(SHUTDOWN).expect("shutdown");
}

#[test]
fn membership_on_a_unix_socket_is_a_configuration_error() {
    let dir = socket_dir("ipc-membership");
    let path = sock(&dir, "m");
    let err = Node::builder("m")
        .listen(Addr::unix(&path))
        .membership(true)
        .start()
        .expect_err("membership needs TCP");
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(err.to_string().contains("TCP listen address"), "{err}");
    assert!(!path.exists(), "the socket file is removed again");
}

#[test]
fn a_wrong_secret_is_refused_over_a_unix_socket() {
    let dir = socket_dir("ipc-secret");
    let events: Arc<Mutex<Vec<Event>>> = Arc::default();
    let seen = events.clone();
    let b = Node::builder("b")
        .cluster(CLUSTER)
        .secret(b"the cluster's secret")
        .listen(Addr::unix(sock(&dir, "b")))
        .allow_unknown_members(true)
        .on_event(move |e| seen.lock().unwrap().push(e))
        .start()
        .expect("b starts");
    let intruder = Node::builder("intruder")
        .cluster(CLUSTER)
        .secret(b"another secret")
        .peer("b", b.listen_addr())
        .start()
        .expect("intruder starts");
    wait_until("b refused the wrong secret", PATIENCE, || {
        b.stats().connections.auth_failures >= 1
    });
    wait_until("the refusal event", PATIENCE, || {
        events.lock().unwrap().iter().any(|e| {
            matches!(e, Event::Refused { reason: RefuseReason::Auth, addr: Some(a), .. }
                if *a == b.listen_addr())
        })
    });
    assert!(!is_connected(&intruder, "b"));
    assert!(b.peers().is_empty(), "never admitted: {:?}", b.peers());
    // The right secret connects over the same socket.
    let member = Node::builder("member")
        .cluster(CLUSTER)
        .secret(b"the cluster's secret")
        .peer("b", b.listen_addr())
        .start()
        .expect("member starts");
    wait_until("the member connects", PATIENCE, || {
        is_connected(&member, "b")
    });
    shutdown_all(&[intruder, member, b]);
}

// ---- a member killed with SIGKILL and restarted on its socket's path -------------------

const ENV_DIR: &str = "COHORT_IPC_DIR";
const ENV_MODE: &str = "COHORT_IPC_MODE";
const MARK: &str = "ipc-child:";
/// Messages the child sends while `b` is up, then as many while `b` is down.
const HALF: u64 = 1_000;

/// The journalling member `a` of the kill test, in the child: listens at `dir/a.sock`,
/// sends to `b` at `dir/b.sock`.
fn child_a(dir: &Path) -> Node {
    Node::builder("a")
        .cluster(CLUSTER)
        .listen(Addr::unix(dir.join("a.sock")))
        .peer("b", Addr::unix(dir.join("b.sock")))
        .journal(dir.join("a-journal"))
        .journal_fsync(FsyncPolicy::EveryBatch)
        .redial_quickly()
        .start()
        .expect("a starts (on its old socket's path)")
}

/// The test's member `b`: journalling too, so that its restart keeps its incarnation (and
/// `a`'s stream to it); logs every delivery as (counter, seq).
fn parent_b(dir: &Path, log: &Arc<Mutex<Vec<(u64, u64)>>>) -> Node {
    let into = log.clone();
    Node::builder("b")
        .cluster(CLUSTER)
        .listen(Addr::unix(dir.join("b.sock")))
        .peer("a", Addr::unix(dir.join("a.sock")))
        .journal(dir.join("b-journal"))
        .journal_fsync(FsyncPolicy::Never)
        .redial_quickly()
        .on_message(move |d: Delivery| {
            let n = counter_of(d.payload()).expect("intact payload");
            into.lock().unwrap().push((n, d.seq().expect("reliable")));
        })
        .start()
        .expect("b starts")
}

/// In the child. `send`: sends [`HALF`] messages, says `sent`, waits for a line on stdin
/// (`b` is down then), sends [`HALF`] more (into its journal), syncs the journal, says
/// `synced` and waits to be killed. `drain`: starts (its journal resends what `b` lacks),
/// stops cleanly (which waits for `b`'s acknowledgements) and says `done <undelivered>`.
#[test]
#[ignore = "runs as the child process of a_member_killed_and_restarted_on_its_socket_path_resends_exactly_once"]
fn ipc_child() {
    let (Ok(dir), Ok(mode)) = (std::env::var(ENV_DIR), std::env::var(ENV_MODE)) else {
        eprintln!("ipc_child runs only under the kill test");
        return;
    };
    let dir = PathBuf::from(dir);
    let a = child_a(&dir);
    println!("{MARK} started");
    if mode == "send" {
        let tx = a.sender();
        let mut line = String::new();
        for i in 0..2 * HALF {
            if i == HALF {
                println!("{MARK} sent {i}");
                std::io::stdin().read_line(&mut line).expect("stdin");
            }
            send_patiently(&tx, "b", payload(i, 128));
        }
        a.sync_journal(PATIENCE).expect("sync");
        println!("{MARK} synced {}", 2 * HALF);
        // Until the parent kills it (or dies: end of stdin).
        let _ = std::io::stdin().read_line(&mut line);
        return;
    }
    // A clean stop waits for b's acknowledgements of what the journal resent.
    let report = a.shutdown(PATIENCE).expect("shutdown");
    println!("{MARK} done {}", report.undelivered);
}

fn spawn_child(dir: &Path, mode: &str) -> (std::process::Child, child::Output) {
    let exe = std::env::current_exe().expect("path of the test binary");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "ipc_child",
            "--nocapture",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env(ENV_DIR, dir)
        .env(ENV_MODE, mode)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let out = child::output(&mut child, MARK);
    (child, out)
}

/// The next line of the child, within `PATIENCE`.
fn next_line(out: &child::Output, what: &str) -> String {
    out.lines
        .recv_timeout(PATIENCE)
        .unwrap_or_else(|e| panic!("{what}: {e}; stderr:\n{}", out.stderr.lock().unwrap()))
}

/// `a` sends to `b` over Unix sockets; `b` stops; `a` sends more (they wait in its journal)
/// and is killed with SIGKILL, leaving its socket file. `b` comes back, then `a`, on the same
/// path: it reclaims the stale file, and its journal resends exactly what `b` lacks.
#[test]
fn a_member_killed_and_restarted_on_its_socket_path_resends_exactly_once() {
    let dir = socket_dir("ipc-kill");
    let a_sock = dir.path().join("a.sock");
    let log: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let b = parent_b(dir.path(), &log);

    let (mut child, out) = spawn_child(dir.path(), "send");
    assert_eq!(next_line(&out, "the child starts"), "started");
    assert_eq!(next_line(&out, "the first half"), format!("sent {HALF}"));
    wait_until("b holds the first half", PATIENCE, || {
        log.lock().unwrap().len() as u64 == HALF
    });
    b.shutdown(SHUTDOWN).expect("shutdown b");
    drop(b);
    let mut stdin = child.stdin.take().expect("child stdin");
    std::io::Write::write_all(&mut stdin, b"go\n").expect("tell the child");
    assert_eq!(
        next_line(&out, "the second half, journalled"),
        format!("synced {}", 2 * HALF)
    );
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    drop(stdin);
    assert!(a_sock.exists(), "the killed process left its socket file");
    assert_eq!(log.lock().unwrap().len() as u64, HALF, "b was down");

    // b comes back (its journal keeps its incarnation), then a on its old path.
    let b = parent_b(dir.path(), &log);
    let (mut child, out) = spawn_child(dir.path(), "drain");
    assert_eq!(next_line(&out, "the restarted child starts"), "started");
    assert_eq!(next_line(&out, "the restarted child stops"), "done 0");
    let status = child.wait().expect("exit");
    assert!(
        status.success(),
        "{status}; stderr:\n{}",
        out.stderr.lock().unwrap()
    );
    assert!(!a_sock.exists(), "a clean stop removes the socket file");

    let got = log.lock().unwrap().clone();
    let want: Vec<(u64, u64)> = (0..2 * HALF).map(|i| (i, i + 1)).collect();
    assert_eq!(got, want, "one stream: no gap, no duplicate, in order");
    assert_eq!(peer_stats(&b, "a").duplicates, 0);
    b.shutdown(SHUTDOWN).expect("shutdown b");
}
