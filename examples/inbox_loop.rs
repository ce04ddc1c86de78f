//! Pull-style receive: a simulation loop takes its messages on its own thread, once per
//! tick, instead of in a handler on the delivery pool.
//!
//! Two `sensor` members stream numbered readings to `sim`. The simulation runs fixed ticks:
//! each tick it takes whatever has arrived (`Inbox::try_iter`, never blocking), checks each
//! sensor's readings come in order, does its work, and now and then tells each sensor the
//! tick it reached. Between ticks nothing is taken, so flow control holds the sensors back:
//! while the loop works, a sensor gets at most about one window ahead of it.
//!
//! `cargo run --release --example inbox_loop [-- --readings N --tick-us US]`

use std::collections::HashMap;
use std::error::Error;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cohort::Node;

const USAGE: &str = "usage: inbox_loop [--readings N] [--tick-us US]

Two sensors stream readings to a simulation loop that takes them from its inbox once per
tick; prints how many each tick took and checks their order.

  --readings N     readings per sensor (default 100000)
  --tick-us US     length of one tick in microseconds (default 1000)
  -h, --help       this text";

const SENSORS: [&str; 2] = ["sensor-1", "sensor-2"];
const WINDOW: u64 = 64 * 1024;

fn parse() -> Result<Option<(u64, Duration)>, String> {
    let (mut readings, mut tick) = (100_000u64, Duration::from_micros(1000));
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        if flag != "--readings" && flag != "--tick-us" {
            return Err(format!("unknown argument {flag:?}"));
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let n = value
            .parse::<u64>()
            .map_err(|e| format!("{flag} {value:?}: {e}"))?;
        if flag == "--readings" {
            readings = n;
        } else {
            tick = Duration::from_micros(n.max(1));
        }
    }
    Ok(Some((readings, tick)))
}

fn run(readings: u64, tick: Duration) -> Result<(), Box<dyn Error>> {
    let (sim, inbox) = Node::builder("sim")
        .cluster("inbox-example")
        .window_bytes(WINDOW)
        .start_with_inbox()?;
    // The last tick each sensor heard of.
    let heard = Arc::new(AtomicU64::new(0));
    let sensors: Vec<Node> = SENSORS
        .iter()
        .map(|name| {
            let heard = heard.clone();
            Node::builder(name)
                .cluster("inbox-example")
                .window_bytes(WINDOW)
                .peer("sim", sim.local_addr())
                .on_message(move |d| {
                    if let Ok(tick) = d.payload()[..].try_into() {
                        heard.fetch_max(u64::from_le_bytes(tick), Ordering::Relaxed);
                    }
                })
                .start()
        })
        .collect::<Result<_, _>>()?;
    for s in &sensors {
        sim.add_peer(s.name(), s.local_addr())?;
    }
    // Each sensor streams on a thread of its own; `send` parks while its window is full.
    let streams: Vec<_> = sensors
        .iter()
        .map(|s| {
            let to_sim = s.sender().to("sim")?;
            Ok(std::thread::spawn(move || -> Result<(), cohort::Error> {
                for i in 0..readings {
                    let mut reading = i.to_le_bytes().to_vec();
                    reading.resize(100, 0);
                    to_sim.send(reading)?;
                }
                Ok(())
            }))
        })
        .collect::<Result<_, cohort::Error>>()?;

    let mut next: HashMap<String, u64> = HashMap::new();
    let (mut ticks, mut most, mut taken) = (0u64, 0usize, 0u64);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);
    while taken < readings * SENSORS.len() as u64 {
        let tick_start = Instant::now();
        if tick_start > deadline {
            return Err(format!("only {taken} readings in 60 s").into());
        }
        // The tick's input: whatever has arrived, without blocking.
        let mut this_tick = 0;
        for d in inbox.try_iter() {
            let n = u64::from_le_bytes(d.payload()[..8].try_into()?);
            let expected = next.entry(d.from().to_owned()).or_insert(0);
            if n != *expected {
                return Err(format!("{}: reading {n}, expected {expected}", d.from()).into());
            }
            *expected += 1;
            this_tick += 1;
        }
        taken += this_tick as u64;
        most = most.max(this_tick);
        ticks += 1;
        // The tick's output: tell each sensor how far the simulation got.
        if ticks % 100 == 0 {
            for name in SENSORS {
                let _ = sim.try_send(name, ticks.to_le_bytes().to_vec());
            }
        }
        // The rest of the tick: the simulation's own work would go here.
        while tick_start.elapsed() < tick {
            std::hint::spin_loop();
        }
    }
    for s in streams {
        s.join().map_err(|_| "a sensor thread panicked")??;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{taken} readings in order over {ticks} ticks of {tick:?} ({secs:.2} s); \
         at most {most} in one tick; the sensors heard of tick {}",
        heard.load(Ordering::Relaxed)
    );
    for s in &sensors {
        s.shutdown(Duration::from_secs(5))?;
    }
    sim.shutdown(Duration::from_secs(5))?;
    Ok(())
}

fn main() -> ExitCode {
    match parse() {
        Ok(None) => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("inbox_loop: {e}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Ok(Some((readings, tick))) => match run(readings, tick) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("inbox_loop: {e}");
                // Each error says its own level; the causes follow.
                let mut cause = std::error::Error::source(&*e);
                while let Some(c) = cause {
                    eprintln!("  caused by: {c}");
                    cause = c.source();
                }
                ExitCode::FAILURE
            }
        },
    }
}
