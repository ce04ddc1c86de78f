//! Two live processes claiming one member name: the second is refused while the first holds
//! the name, a process the name was taken from is never taken back, a genuine restart still
//! gets in, and nothing is ever delivered twice.
//!
//! Each twin is this test binary re-executed with `--exact twin_child` (an ignored test that
//! does nothing unless a twin test configured it through `COHORT_TWIN_*` environment
//! variables): a node named `twin` whose only peer is `hub`, streaming numbered messages that
//! carry its process id, and printing on its stdout (marked lines) what it is told: refusals,
//! connections, messages reported undelivered. The hub runs in the test's own process and
//! checks every delivery: per twin process, each number exactly once and in order.

mod support;

use std::collections::HashMap;
use std::io::Read;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cohort::{Event, Node, RefuseReason};
use support::*;

const CLUSTER: &str = "twins";
const ENV_HUB: &str = "COHORT_TWIN_HUB";
/// Marks the child's protocol lines on its stdout (libtest writes there too).
const MARK: &str = "twin-child:";
/// A twin sends at most this many messages (the cap only stops a child whose parent died
/// without closing its stdin).
const CHILD_CAP: u64 = 1_000_000;

/// What the hub saw of each twin process's stream.
#[derive(Default)]
struct Streams {
    /// Per process id: the next number expected, and how many were delivered.
    next: HashMap<u32, u64>,
    delivered: HashMap<u32, u64>,
    /// A number delivered again (at or below one already delivered).
    duplicates: u64,
    /// A number skipped (above the next expected).
    gaps: u64,
}

/// The hub: admits whoever dials it, checks every delivery, keeps every event.
struct Hub {
    node: Node,
    streams: Arc<Mutex<Streams>>,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Hub {
    fn start() -> Hub {
        let streams = Arc::new(Mutex::new(Streams::default()));
        let events = Arc::new(Mutex::new(Vec::new()));
        let (s, e) = (streams.clone(), events.clone());
        let node = Node::builder("hub")
            .cluster(CLUSTER)
            .listen("127.0.0.1:0")
            .allow_unknown_members(true)
            .on_message(move |d| {
                let p = d.payload();
                assert_eq!(p.len(), 12, "a twin's message is its pid and a number");
                let pid = u32::from_le_bytes(p[..4].try_into().unwrap());
                let n = u64::from_le_bytes(p[4..].try_into().unwrap());
                let mut s = s.lock().unwrap();
                let next = s.next.get(&pid).copied().unwrap_or(0);
                if n < next {
                    s.duplicates += 1;
                } else if n > next {
                    s.gaps += 1;
                }
                s.next.insert(pid, next.max(n + 1));
                *s.delivered.entry(pid).or_default() += 1;
            })
            .on_event(move |ev| e.lock().unwrap().push(ev))
            .start()
            .expect("start the hub");
        Hub {
            node,
            streams,
            events,
        }
    }

    fn delivered_from(&self, pid: u32) -> u64 {
        let s = self.streams.lock().unwrap();
        s.delivered.get(&pid).copied().unwrap_or(0)
    }

    fn duplicates_and_gaps(&self) -> (u64, u64) {
        let s = self.streams.lock().unwrap();
        (s.duplicates, s.gaps)
    }

    fn name_conflicts(&self) -> u64 {
        self.node.stats().connections.name_conflicts
    }

    /// How many events match `f`.
    fn count(&self, f: impl Fn(&Event) -> bool) -> usize {
        self.events.lock().unwrap().iter().filter(|e| f(e)).count()
    }

    fn new_incarnations(&self) -> usize {
        self.count(|e| matches!(e, Event::NewIncarnation { .. }))
    }

    fn connects(&self) -> usize {
        self.count(|e| matches!(e, Event::Connected { .. }))
    }

    fn refusals(&self) -> usize {
        self.count(|e| {
            matches!(
                e,
                Event::Refused {
                    reason: RefuseReason::NameInUse,
                    by_peer: false,
                    ..
                }
            )
        })
    }

    fn explain(&self) -> String {
        let (d, g) = self.duplicates_and_gaps();
        let s = self.streams.lock().unwrap();
        format!(
            "delivered per pid {:?}, {d} duplicates, {g} gaps; events {:?}\n{}",
            s.delivered,
            self.events.lock().unwrap(),
            self.node.stats()
        )
    }
}

/// A twin process, killed when dropped.
struct Twin {
    pid: u32,
    child: Child,
    lines: Receiver<String>,
    /// What it said so far: refusals it was told of, connections, messages it reported
    /// undelivered.
    refused: u64,
    connected: u64,
    undelivered: u64,
    stderr: Arc<Mutex<String>>,
}

impl Twin {
    /// Starts a twin that dials the hub at `hub`, and waits until its node is up.
    fn spawn(hub: SocketAddr) -> Twin {
        let exe = std::env::current_exe().expect("path of the test binary");
        let mut child = Command::new(exe)
            .args([
                "--exact",
                "twin_child",
                "--nocapture",
                "--include-ignored",
                "--test-threads=1",
            ])
            .env(ENV_HUB, hub.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a twin");
        let out = child::output(&mut child, MARK);
        let (lines, stderr) = (out.lines, out.stderr);
        let mut twin = Twin {
            pid: child.id(),
            child,
            lines,
            refused: 0,
            connected: 0,
            undelivered: 0,
            stderr,
        };
        let deadline = Instant::now() + PATIENCE;
        loop {
            match twin.next_line(deadline) {
                Some(l) if l.starts_with("started") => return twin,
                Some(_) => {}
                None => twin.fail("it did not start"),
            }
        }
    }

    fn fail(&mut self, why: &str) -> ! {
        let _ = self.child.kill();
        let status = self.child.wait();
        panic!(
            "twin {}: {why}; exit: {status:?}; its stderr:\n{}",
            self.pid,
            self.stderr.lock().unwrap()
        );
    }

    /// The next line, taken into account; `None` at the deadline or once its output ended.
    fn next_line(&mut self, deadline: Instant) -> Option<String> {
        let line = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .ok()?;
        if line == "refused" {
            self.refused += 1;
        } else if line == "connected" {
            self.connected += 1;
        } else if let Some(n) = line.strip_prefix("undelivered ") {
            self.undelivered += n.parse::<u64>().expect("a count");
        }
        Some(line)
    }

    /// Takes every line said so far into account.
    fn catch_up(&mut self) {
        while self.next_line(Instant::now()).is_some() {}
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Twin {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The twin's process: a node named `twin` streaming numbered messages to `hub`.
#[test]
#[ignore = "re-executed by the twin tests"]
fn twin_child() {
    let Ok(hub) = std::env::var(ENV_HUB) else {
        eprintln!("twin_child runs only under the twin tests");
        return;
    };
    let hub: SocketAddr = hub.parse().expect("the hub's address");
    let pid = std::process::id();
    let say = |what: String| println!("{MARK} {what}");
    let node = Node::builder("twin")
        .cluster(CLUSTER)
        .peer("hub", hub)
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(500))
        .on_undelivered(move |_, msgs| say(format!("undelivered {}", msgs.len())))
        .on_event(move |ev| match ev {
            Event::Refused {
                reason: RefuseReason::NameInUse,
                by_peer: true,
                ..
            } => say("refused".into()),
            Event::Connected { .. } => say("connected".into()),
            _ => {}
        })
        .start()
        .expect("start a twin");
    // The parent closes our stdin when it is done with us (or dies).
    std::thread::spawn(|| {
        let _ = std::io::stdin().read(&mut [0u8; 1]);
        std::process::exit(0);
    });
    say(format!("started {pid}"));
    let sender = node.sender();
    for n in 0..CHILD_CAP {
        let mut payload = Vec::with_capacity(12);
        payload.extend_from_slice(&pid.to_le_bytes());
        payload.extend_from_slice(&n.to_le_bytes());
        if let Err(e) = sender.send("hub", payload) {
            eprintln!("send failed: {e}");
            break;
        }
        if n % 32 == 31 {
            // Paces the stream so that three processes share two cores.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    std::thread::park();
}

/// The first twin holds the name; a second, started while the first streams, is refused at
/// every attempt and never delivered; the first goes on unaffected. Once the first is
/// killed, the second gets in as a new incarnation and its stream starts at its first
/// message. Nothing is delivered twice or reported undelivered by a twin.
#[test]
fn a_second_live_process_is_refused_and_nothing_is_delivered_twice() {
    let hub = Hub::start();
    let addr = hub.node.local_addr();
    let mut first = Twin::spawn(addr);
    wait_until_or(
        PATIENCE,
        || hub.delivered_from(first.pid) >= 500,
        || format!("the first twin's messages; {}", hub.explain()),
    );
    let mut second = Twin::spawn(addr);
    wait_until_or(
        PATIENCE,
        || hub.name_conflicts() >= 4,
        || format!("the second twin refused 4 times; {}", hub.explain()),
    );
    // The first twin's stream goes on while the second knocks.
    let before = hub.delivered_from(first.pid);
    wait_until_or(
        PATIENCE,
        || hub.delivered_from(first.pid) >= before + 500 && hub.name_conflicts() >= 6,
        || format!("the first twin streaming on; {}", hub.explain()),
    );
    second.catch_up();
    first.catch_up();
    let conflicts = hub.name_conflicts();
    eprintln!(
        "while both lived: first delivered {}, second {}, {conflicts} refusals ({} told to the second)",
        hub.delivered_from(first.pid),
        hub.delivered_from(second.pid),
        second.refused
    );
    assert_eq!(hub.delivered_from(second.pid), 0, "{}", hub.explain());
    assert_eq!(hub.duplicates_and_gaps(), (0, 0), "{}", hub.explain());
    assert_eq!(hub.new_incarnations(), 0, "{}", hub.explain());
    assert_eq!(
        hub.connects(),
        1,
        "the name never changed hands: {}",
        hub.explain()
    );
    assert!(second.refused >= 1, "the second twin was told");
    assert_eq!(second.connected, 0);
    // Each refusal made one event, no more (the events lag the counter by at most the ones
    // still queued for the callback).
    wait_until_or(
        PATIENCE,
        || hub.refusals() as u64 >= conflicts,
        || format!("one event per refusal; {}", hub.explain()),
    );
    assert!(hub.refusals() as u64 <= hub.name_conflicts());

    // The first process dies: the second gets in as a new incarnation.
    let killed = Instant::now();
    first.kill();
    wait_until_or(
        PATIENCE,
        || hub.delivered_from(second.pid) >= 500,
        || {
            format!(
                "the second twin's messages after the first died; {}",
                hub.explain()
            )
        },
    );
    eprintln!(
        "the second twin's 500th message delivered {:?} after the first was killed",
        killed.elapsed()
    );
    second.catch_up();
    assert_eq!(hub.duplicates_and_gaps(), (0, 0), "{}", hub.explain());
    assert_eq!(hub.new_incarnations(), 1, "{}", hub.explain());
    assert_eq!(
        second.undelivered, 0,
        "the second twin reported nothing undelivered"
    );
    assert_eq!(
        first.undelivered, 0,
        "the first twin reported nothing undelivered"
    );
    hub.node.shutdown(SHUTDOWN).expect("shutdown");
}

/// A cut lets the second twin take the name (the first's connection is gone); when the
/// first comes back, it is refused for good: the name never flips back, its stream stays
/// where it was, and it reports nothing undelivered (the hub has what it acknowledged).
#[test]
fn a_process_the_name_was_taken_from_is_not_taken_back() {
    let hub = Hub::start();
    let proxy = proxy::Proxy::start("first", hub.node.local_addr(), 7, 1 << 16);
    let mut first = Twin::spawn(proxy.addr());
    wait_until_or(
        PATIENCE,
        || hub.delivered_from(first.pid) >= 500,
        || format!("the first twin's messages; {}", hub.explain()),
    );
    // The first twin's link is cut and it cannot dial back; the second takes the name.
    proxy.set_mode(proxy::Mode::Refuse);
    proxy.cut_all();
    let mut second = Twin::spawn(hub.node.local_addr());
    wait_until_or(
        PATIENCE,
        || hub.delivered_from(second.pid) >= 500,
        || format!("the second twin's messages; {}", hub.explain()),
    );
    let frozen = hub.delivered_from(first.pid);
    assert_eq!(hub.new_incarnations(), 1, "{}", hub.explain());
    // The first comes back: refused at every attempt, while the second streams on.
    let conflicts = hub.name_conflicts();
    proxy.set_mode(proxy::Mode::Forward);
    let before = hub.delivered_from(second.pid);
    wait_until_or(
        PATIENCE,
        || hub.name_conflicts() >= conflicts + 3 && hub.delivered_from(second.pid) >= before + 500,
        || format!("the first twin refused 3 times; {}", hub.explain()),
    );
    first.catch_up();
    second.catch_up();
    eprintln!(
        "after the takeover: first delivered {} (frozen at {frozen}), second {}, {} refusals",
        hub.delivered_from(first.pid),
        hub.delivered_from(second.pid),
        hub.name_conflicts() - conflicts
    );
    assert_eq!(hub.delivered_from(first.pid), frozen, "{}", hub.explain());
    assert_eq!(
        hub.new_incarnations(),
        1,
        "the name never went back: {}",
        hub.explain()
    );
    assert_eq!(hub.duplicates_and_gaps(), (0, 0), "{}", hub.explain());
    assert!(first.refused >= 1, "the first twin was told");
    assert_eq!(
        first.undelivered, 0,
        "the first twin reported nothing undelivered"
    );
    assert_eq!(second.undelivered, 0);
    hub.node.shutdown(SHUTDOWN).expect("shutdown");
}
