//! Membership events: three members on loopback print what `on_event` tells them while one
//! of them restarts and a guest member comes and goes.
//!
//! 1. `alpha` and `beta` know each other; `registry` admits any member of the cluster and
//!    forgets one gone for `--forget-ms` (default 500). Everyone connects.
//! 2. `beta` restarts on the same address as a new process would (a new launch id): `alpha`
//!    sees it disconnect, come back as a new incarnation, and connect again.
//! 3. A `guest` the registry does not know dials it, then leaves: the registry forgets it.
//!
//! Each step waits for the events it expects (at most 10 s each), then the example stops.
//!
//! `cargo run --example events [-- --forget-ms MS]`

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cohort::{Event, Node};

const USAGE: &str = "usage: events [--forget-ms MS]

Three members on loopback print their membership events while one restarts and a guest
comes and goes; the example stops on its own.

  --forget-ms MS   how long the registry keeps a departed guest (default 500)
  -h, --help       this text";

const CLUSTER: &str = "events-example";
const STEP: Duration = Duration::from_secs(10);

/// Which node saw which event.
type Seen = (String, Event);

/// A member that prints its events and forwards them to the example's main thread.
fn member(name: &str, tx: &Sender<Seen>) -> cohort::Builder {
    let tx = Mutex::new(tx.clone());
    let me = name.to_owned();
    Node::builder(name)
        .cluster(CLUSTER)
        .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(200))
        .on_event(move |e| {
            println!("[{me:>8}] {e}");
            // The receiver outlives every node; a send fails only once main has returned.
            let _ = tx.lock().map(|tx| tx.send((me.clone(), e)));
        })
}

/// The events forwarded by the members, with those that came while the example waited
/// for another: the members' events interleave in any order.
struct Events {
    rx: Receiver<Seen>,
    early: Vec<Seen>,
}

impl Events {
    /// Waits until `node` sees an event `want` says is the one (or has seen it already
    /// while the example waited for another).
    fn wait_for(
        &mut self,
        node: &str,
        what: &str,
        want: impl Fn(&Event) -> bool,
    ) -> Result<Event, Box<dyn Error>> {
        if let Some(i) = self.early.iter().position(|(n, e)| n == node && want(e)) {
            return Ok(self.early.remove(i).1);
        }
        let deadline = Instant::now() + STEP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((n, e)) if n == node && want(&e) => return Ok(e),
                Ok(other) => self.early.push(other),
                Err(_) => return Err(format!("{node} did not see {what} within {STEP:?}").into()),
            }
        }
    }

    /// Forgets the events of the steps before: the next step waits for new ones.
    fn next_step(&mut self) {
        self.early.clear();
    }
}

fn connected_to(peer: &'static str) -> impl Fn(&Event) -> bool {
    move |e| matches!(e, Event::Connected { peer: p, .. } if p == peer)
}

fn run(forget: Duration) -> Result<(), Box<dyn Error>> {
    let (tx, rx) = mpsc::channel();
    let mut events = Events {
        rx,
        early: Vec::new(),
    };
    let registry = member("registry", &tx)
        .allow_unknown_members(true)
        .forget_after(forget)
        .start()?;
    let beta = member("beta", &tx).allow_unknown_members(true).start()?;
    let beta_addr: SocketAddr = beta.local_addr();
    let alpha = member("alpha", &tx)
        .peer("beta", beta_addr)
        .peer("registry", registry.local_addr())
        .start()?;
    println!("-- alpha connects to beta and the registry");
    events.wait_for("alpha", "beta connected", connected_to("beta"))?;
    events.wait_for("registry", "alpha connected", connected_to("alpha"))?;
    for i in 0..10u32 {
        alpha.send("beta", i.to_le_bytes().to_vec())?;
    }

    println!("-- beta restarts (a new process: a new launch id)");
    events.next_step();
    beta.shutdown(Duration::from_secs(5))?;
    drop(beta);
    let beta = member("beta", &tx)
        .allow_unknown_members(true)
        .listen(beta_addr)
        .start()?;
    let e = events.wait_for(
        "alpha",
        "beta's new incarnation",
        |e| matches!(e, Event::NewIncarnation { peer, .. } if peer == "beta"),
    )?;
    if let Event::NewIncarnation { undelivered, .. } = e {
        println!("-- alpha: {undelivered} messages to beta's old process were undelivered");
    }
    events.wait_for("alpha", "beta connected again", connected_to("beta"))?;

    println!("-- a guest the registry does not know comes and goes");
    events.next_step();
    let guest = member("guest", &tx)
        .peer("registry", registry.local_addr())
        .start()?;
    events.wait_for("registry", "the guest connected", connected_to("guest"))?;
    println!("-- registry peers: {:?}", registry.peers());
    guest.shutdown(Duration::from_secs(5))?;
    events.wait_for(
        "registry",
        "the guest forgotten",
        |e| matches!(e, Event::Forgotten { peer } if peer == "guest"),
    )?;
    println!("-- registry peers: {:?}", registry.peers());

    println!("-- shutting down");
    for node in [&alpha, &beta, &registry] {
        node.shutdown(Duration::from_secs(5))?;
    }
    Ok(())
}

/// The command line: how long the registry keeps a departed guest; `Ok(None)` when help
/// was asked for.
fn parse() -> Result<Option<Duration>, String> {
    let mut forget = Duration::from_millis(500);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--forget-ms" => {
                let value = it.next().ok_or(format!("{flag} needs a value"))?;
                let ms = value
                    .parse()
                    .map_err(|e| format!("{flag} {value:?}: {e}"))?;
                forget = Duration::from_millis(ms);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(forget))
}

fn main() -> ExitCode {
    let forget = match parse() {
        Ok(Some(forget)) => forget,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("events: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(forget) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("events: {e}");
            // Each error says its own level; the causes follow.
            let mut cause = std::error::Error::source(&*e);
            while let Some(c) = cause {
                eprintln!("  caused by: {c}");
                cause = c.source();
            }
            ExitCode::FAILURE
        }
    }
}
