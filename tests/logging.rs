//! What a node logs about its listen address: every node logs the address it listens on,
//! and a node left on the default, loopback-only address while it has peers outside
//! loopback warns that they cannot reach it. The records are captured by a `log::Log`
//! installed for this test binary alone.

mod support;

use std::sync::{Mutex, Once};

use cohort::Node;
use support::*;

/// Every record logged by this test binary, as `(level, message)`.
static RECORDS: Mutex<Vec<(log::Level, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            let mut records = RECORDS.lock().unwrap_or_else(|e| e.into_inner());
            records.push((r.level(), r.args().to_string()));
        }
    }
    fn flush(&self) {}
}

static CAPTURE: Capture = Capture;

/// Installs [`Capture`] as this binary's logger, once.
fn capture_logs() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        log::set_logger(&CAPTURE).expect("the only logger of this binary");
        log::set_max_level(log::LevelFilter::Info);
    });
}

/// The messages logged at `level` by the node named `name` (they start with its name).
fn logged(level: log::Level, name: &str) -> Vec<String> {
    let prefix = format!("{name}: ");
    RECORDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(l, m)| *l == level && m.starts_with(&prefix))
        .map(|(_, m)| m.clone())
        .collect()
}

/// The one `info` record saying where `node` listens.
fn assert_listening_logged(node: &Node) {
    let want = format!("{}: listening on {}", node.name(), node.local_addr());
    let infos = logged(log::Level::Info, node.name());
    assert!(
        infos.iter().any(|m| m.starts_with(&want)),
        "no {want:?} among {infos:?}"
    );
}

/// A node that never calls `listen` listens on loopback; with a peer configured on an
/// address outside loopback it warns at start, naming the peer and `Builder::listen`.
#[test]
fn default_listen_address_with_a_remote_peer_warns() {
    capture_logs();
    let node = Node::builder("log-remote")
        .cluster("t-logging")
        .peer("faraway", "10.255.255.1:7000")
        .start()
        .expect("node starts");
    assert!(node.local_addr().ip().is_loopback());
    assert_listening_logged(&node);
    let warnings = logged(log::Level::Warn, "log-remote");
    assert!(
        warnings
            .iter()
            .any(|m| m.contains("'faraway' at 10.255.255.1:7000")
                && m.contains("remote peers cannot reach a node listening on loopback")
                && m.contains("Builder::listen")),
        "no loopback warning among {warnings:?}"
    );
    node.shutdown(SHUTDOWN).expect("shutdown");
}

/// A peer outside loopback added at run time (`add_peer`) warns as one configured at
/// start, once: neither a second such peer nor one on a node that warned at start warns
/// again.
#[test]
fn default_listen_address_with_a_remote_peer_added_later_warns_once() {
    capture_logs();
    let node = Node::builder("log-added")
        .cluster("t-logging")
        .start()
        .expect("node starts");
    node.add_peer("near", "127.0.0.1:9")
        .expect("add a local peer");
    let about_loopback = |name: &str| -> Vec<String> {
        logged(log::Level::Warn, name)
            .into_iter()
            .filter(|m| m.contains("loopback"))
            .collect()
    };
    assert!(about_loopback("log-added").is_empty());
    node.add_peer("faraway", "10.255.255.1:7000")
        .expect("add a remote peer");
    node.add_peer("further", "10.255.255.2:7000")
        .expect("add another remote peer");
    let warnings = about_loopback("log-added");
    assert_eq!(warnings.len(), 1, "one warning: {warnings:?}");
    assert!(
        warnings[0].contains("'faraway' at 10.255.255.1:7000")
            && warnings[0].contains("remote peers cannot reach a node listening on loopback")
            && warnings[0].contains("Builder::listen"),
        "{warnings:?}"
    );
    node.shutdown(SHUTDOWN).expect("shutdown");

    let warned = Node::builder("log-warned")
        .cluster("t-logging")
        .peer("faraway", "10.255.255.1:7000")
        .start()
        .expect("node starts");
    warned
        .add_peer("further", "10.255.255.2:7000")
        .expect("add another remote peer");
    let warnings = about_loopback("log-warned");
    assert_eq!(warnings.len(), 1, "warned at start only: {warnings:?}");
    warned.shutdown(SHUTDOWN).expect("shutdown");
}

/// Peers on loopback can reach a node on the default address: no warning, and they
/// connect.
#[test]
fn default_listen_address_with_loopback_peers_does_not_warn() {
    capture_logs();
    let b = Node::builder("log-local-b")
        .cluster("t-logging")
        .start()
        .expect("b starts");
    let a = Node::builder("log-local-a")
        .cluster("t-logging")
        .peer("log-local-b", b.local_addr())
        .start()
        .expect("a starts");
    b.add_peer("log-local-a", a.local_addr()).expect("add a");
    wait_until("a and b connected", PATIENCE, || {
        is_connected(&a, "log-local-b") && is_connected(&b, "log-local-a")
    });
    for node in [&a, &b] {
        assert_listening_logged(node);
        let warnings = logged(log::Level::Warn, node.name());
        assert!(
            !warnings.iter().any(|m| m.contains("loopback")),
            "{}: unexpected warning {warnings:?}",
            node.name()
        );
    }
    shutdown_all(&[a, b]);
}

/// A listen address the application chose is its business, loopback or not: no warning.
#[test]
fn listen_address_given_does_not_warn() {
    capture_logs();
    let node = Node::builder("log-given")
        .cluster("t-logging")
        .listen("127.0.0.1:0")
        .peer("faraway", "10.255.255.1:7000")
        .start()
        .expect("node starts");
    assert_listening_logged(&node);
    let warnings = logged(log::Level::Warn, "log-given");
    assert!(
        !warnings.iter().any(|m| m.contains("loopback")),
        "unexpected warning {warnings:?}"
    );
    node.shutdown(SHUTDOWN).expect("shutdown");
}

/// A second process claiming a live member's name is refused at every attempt, but the
/// error naming both processes is logged once on each side (its repeats go to `debug`).
#[test]
fn a_name_conflict_is_logged_once_per_claimant_on_each_side() {
    capture_logs();
    let hub = Node::builder("log-hub")
        .cluster("t-logging-twins")
        .listen("127.0.0.1:0")
        .allow_unknown_members(true)
        .start()
        .expect("hub starts");
    let twin = |_| {
        Node::builder("log-twin")
            .cluster("t-logging-twins")
            .peer("log-hub", hub.local_addr())
            .reconnect_backoff(
                std::time::Duration::from_millis(5),
                std::time::Duration::from_millis(50),
            )
            .start()
            .expect("twin starts")
    };
    let first = twin(0);
    wait_until("the first twin connected", PATIENCE, || {
        is_connected(&first, "log-hub")
    });
    let second = twin(1);
    wait_until("three refusals of the second twin", PATIENCE, || {
        hub.stats().connections.name_conflicts >= 3
    });
    let hub_errors = logged(log::Level::Error, "log-hub");
    assert_eq!(hub_errors.len(), 1, "{hub_errors:?}");
    assert!(
        hub_errors[0].contains("refusing 'log-twin' from 127.0.0.1:")
            && hub_errors[0].contains("another process holds the name at 127.0.0.1:"),
        "{hub_errors:?}"
    );
    let twin_errors = logged(log::Level::Error, "log-twin");
    assert_eq!(twin_errors.len(), 1, "{twin_errors:?}");
    assert!(twin_errors[0].contains("refuses us"), "{twin_errors:?}");
    assert!(second.stats().connections.name_conflicts >= 1);
    assert!(is_connected(&first, "log-hub"));
    shutdown_all(&[second, first, hub]);
}

/// A reply refused as larger than its request's room is logged at the replier: one warning
/// per node, naming the sizes and `Builder::max_reply`, however many are refused.
#[test]
fn a_refused_reply_warns_once() {
    capture_logs();
    let server = Node::builder("log-replier")
        .cluster("t-logging")
        .on_message(|d| {
            let too_large = d.reply_room().map_or(1, |room| room + 1);
            let _ = d.reply(vec![0u8; too_large]);
        })
        .start()
        .expect("server starts");
    let client = Node::builder("log-requester")
        .cluster("t-logging")
        .max_reply(1000)
        .peer("log-replier", server.local_addr())
        .start()
        .expect("client starts");
    server
        .add_peer("log-requester", client.local_addr())
        .expect("add the requester");
    for _ in 0..3 {
        let r = client.request("log-replier", &b"?"[..], PATIENCE);
        assert!(
            matches!(&r, Err(e) if matches!(e.error(), cohort::Error::ReplyFailed { .. })),
            "{r:?}"
        );
    }
    let warnings: Vec<String> = logged(log::Level::Warn, "log-replier")
        .into_iter()
        .filter(|m| m.contains("reply"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("1001 bytes to 'log-requester' was refused")
            && warnings[0].contains("reserved 1000 bytes")
            && warnings[0].contains("Builder::max_reply"),
        "{warnings:?}"
    );
    shutdown_all(&[client, server]);
}

/// A node dropped without `shutdown` shuts down within `Node::DROP_SHUTDOWN` and logs the
/// report it cannot return: a warning with its counts when something was left undelivered.
#[test]
fn a_node_dropped_with_messages_left_warns_with_the_report() {
    capture_logs();
    let node = Node::builder("log-dropped")
        .cluster("t-logging")
        .peer("absent", "127.0.0.1:9") // nothing listens on the discard port
        .start()
        .expect("node starts");
    node.send("absent", &b"never sent"[..]).expect("queued");
    drop(node);
    let warnings: Vec<String> = logged(log::Level::Warn, "log-dropped")
        .into_iter()
        .filter(|m| m.contains("dropped without shutdown"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("0 messages published and never acknowledged and 1 never published")
            && warnings[0].contains("on_undelivered")
            && warnings[0].contains("Node::shutdown"),
        "{warnings:?}"
    );
    assert_eq!(
        cohort::Node::DROP_SHUTDOWN,
        std::time::Duration::from_secs(5)
    );

    // Nothing left: nothing to warn about.
    let quiet = Node::builder("log-dropped-quiet")
        .cluster("t-logging")
        .start()
        .expect("node starts");
    drop(quiet);
    assert!(
        logged(log::Level::Warn, "log-dropped-quiet").is_empty(),
        "{:?}",
        logged(log::Level::Warn, "log-dropped-quiet")
    );
}

/// Membership without a secret lets anyone who can reach its port in: the node warns at
/// start, naming the way out; with a secret it does not.
#[test]
fn membership_without_a_secret_warns() {
    capture_logs();
    let open = Node::builder("log-open-members")
        .listen("127.0.0.1:0")
        .membership(true)
        .start()
        .expect("start");
    let warned = logged(log::Level::Warn, "log-open-members");
    assert!(
        warned
            .iter()
            .any(|m| m.contains("membership without a secret") && m.contains("Builder::secret")),
        "{warned:?}"
    );
    let closed = Node::builder("log-closed-members")
        .listen("127.0.0.1:0")
        .secret(b"a secret")
        .membership(true)
        .start()
        .expect("start");
    let warned = logged(log::Level::Warn, "log-closed-members");
    assert!(
        !warned.iter().any(|m| m.contains("without a secret")),
        "{warned:?}"
    );
    open.shutdown(SHUTDOWN).expect("shutdown");
    closed.shutdown(SHUTDOWN).expect("shutdown");
}
