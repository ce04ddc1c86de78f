//! Feature `metrics`: two nodes over real TCP on 127.0.0.1 publish their counters through
//! the `metrics` facade to a recorder installed by this test, and the traffic they exchange
//! shows in the documented metrics (`docs/metrics.md`).
//!
//! `metrics::set_global_recorder` can be called once per process, and the node publishes
//! from its IO thread (so a thread-local recorder would not see it): this file is its own
//! test binary, with one test.
#![cfg(feature = "metrics")]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{
    self, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString,
    Unit,
};

use cohort::Node;
use support::*;

/// A metric's identity: its name and its labels, sorted.
type Id = (String, Vec<(String, String)>);

/// The last value set for a counter or a gauge (a gauge as `f64` bits).
#[derive(Default, Debug)]
struct Value(AtomicU64);

impl CounterFn for Value {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }
}

impl GaugeFn for Value {
    fn increment(&self, value: f64) {
        self.set(f64::from_bits(self.0.load(Ordering::Relaxed)) + value);
    }
    fn decrement(&self, value: f64) {
        GaugeFn::increment(self, -value);
    }
    fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }
}

/// A recorder that keeps every counter's and gauge's last value in a map, and every
/// description's unit. Written here (some forty lines) rather than taken from
/// `metrics-util`'s `DebuggingRecorder`: the test needs only last values by name and label,
/// and a dev-dependency would bring that crate's own dependencies to every test build.
#[derive(Default)]
struct MapRecorder {
    counters: Mutex<HashMap<Id, Arc<Value>>>,
    gauges: Mutex<HashMap<Id, Arc<Value>>>,
    units: Mutex<HashMap<String, Option<Unit>>>,
}

fn id(key: &Key) -> Id {
    let mut labels: Vec<(String, String)> = key
        .labels()
        .map(|l| (l.key().to_string(), l.value().to_string()))
        .collect();
    labels.sort();
    (key.name().to_string(), labels)
}

/// The recorder installed: a handle on the map the test reads.
struct Installed(Arc<MapRecorder>);

impl Recorder for Installed {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.0
            .units
            .lock()
            .unwrap()
            .insert(key.as_str().to_string(), unit);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.0
            .units
            .lock()
            .unwrap()
            .insert(key.as_str().to_string(), unit);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.0
            .units
            .lock()
            .unwrap()
            .insert(key.as_str().to_string(), unit);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> metrics::Counter {
        let mut map = self.0.counters.lock().unwrap();
        metrics::Counter::from_arc(map.entry(id(key)).or_default().clone())
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let mut map = self.0.gauges.lock().unwrap();
        Gauge::from_arc(map.entry(id(key)).or_default().clone())
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

impl MapRecorder {
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
        let id = labelled(name, labels);
        let map = self.counters.lock().unwrap();
        map.get(&id).map(|v| v.0.load(Ordering::Relaxed))
    }
    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let id = labelled(name, labels);
        let map = self.gauges.lock().unwrap();
        map.get(&id)
            .map(|v| f64::from_bits(v.0.load(Ordering::Relaxed)))
    }
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .counters
            .lock()
            .unwrap()
            .keys()
            .map(|k| k.0.clone())
            .collect();
        names.extend(self.gauges.lock().unwrap().keys().map(|k| k.0.clone()));
        names.sort();
        names.dedup();
        names
    }
    fn dump(&self) -> String {
        let mut lines: Vec<String> = Vec::new();
        for (k, v) in self.counters.lock().unwrap().iter() {
            lines.push(format!("{k:?} = {}", v.0.load(Ordering::Relaxed)));
        }
        for (k, v) in self.gauges.lock().unwrap().iter() {
            lines.push(format!(
                "{k:?} = {}",
                f64::from_bits(v.0.load(Ordering::Relaxed))
            ));
        }
        lines.sort();
        lines.join("\n")
    }
}

fn labelled(name: &str, labels: &[(&str, &str)]) -> Id {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    (name.to_string(), labels)
}

const SENT: u64 = 500;
const BACK: u64 = 40;
const SIZE: usize = 100;

/// Two nodes publishing every 20 ms; a sends `SENT` messages to b and b `BACK` to a. The
/// recorder sees the counts on both sides with the `node` and `peer` labels, the gauges
/// (connected, window, round trip, pool), every metric it sees is documented with the unit
/// it was described with, and once a stops, b's gauge shows a disconnected.
#[test]
fn nodes_publish_their_traffic_as_metrics() {
    let recorder = Arc::new(MapRecorder::default());
    metrics::set_global_recorder(Installed(recorder.clone()))
        .expect("the only recorder of this binary");

    let (a_got, b_got) = (Counter::new(), Counter::new());
    let every = Duration::from_millis(20);
    let nodes = connected([
        Node::builder("a")
            .cluster("t-metrics")
            .metrics_interval(every)
            .on_message(a_got.handler()),
        Node::builder("b")
            .cluster("t-metrics")
            .metrics_interval(every)
            .on_message(b_got.handler()),
    ]);
    for i in 0..SENT {
        send_patiently(&nodes[0].sender(), "b", payload(i, SIZE));
    }
    for i in 0..BACK {
        send_patiently(&nodes[1].sender(), "a", payload(i, SIZE));
    }
    let ab = [("node", "a"), ("peer", "b")];
    let ba = [("node", "b"), ("peer", "a")];
    let r = &recorder;
    wait_until_or(
        PATIENCE,
        || {
            r.counter("cohort_messages_sent_total", &ab) == Some(SENT)
                && r.counter("cohort_sent_bytes_total", &ab) == Some(SENT * SIZE as u64)
                && r.counter("cohort_messages_received_total", &ba) == Some(SENT)
                && r.counter("cohort_messages_delivered_total", &ba) == Some(SENT)
                && r.counter("cohort_delivered_bytes_total", &ba) == Some(SENT * SIZE as u64)
                && r.counter("cohort_messages_sent_total", &ba) == Some(BACK)
                && r.counter("cohort_messages_delivered_total", &ab) == Some(BACK)
                && r.counter("cohort_connects_total", &ab) == Some(1)
                && r.gauge("cohort_peer_connected", &ab) == Some(1.0)
                && r.gauge("cohort_window_in_flight_bytes", &ab) == Some(0.0)
                && r.gauge("cohort_queued_messages", &ab) == Some(0.0)
                && r.gauge("cohort_rtt_seconds", &ab).is_some_and(|s| s > 0.0)
                && r.gauge("cohort_rtt_seconds", &ba).is_some_and(|s| s > 0.0)
                && r.gauge("cohort_last_heard_seconds", &ab).is_some()
        },
        || {
            format!(
                "the traffic in the metrics; recorded:\n{}\nstats:\n{}",
                r.dump(),
                all_stats(&nodes)
            )
        },
    );
    let node_a = [("node", "a")];
    assert!(
        r.gauge("cohort_pool_threads", &node_a)
            .is_some_and(|t| t >= 1.0),
        "{}",
        r.dump()
    );
    assert_eq!(
        r.gauge("cohort_connections_established", &node_a),
        Some(1.0),
        "{}",
        r.dump()
    );
    assert_eq!(
        r.counter("cohort_handshakes_total", &node_a),
        Some(1),
        "{}",
        r.dump()
    );
    assert_eq!(
        r.counter("cohort_pool_panics_total", &node_a),
        Some(0),
        "{}",
        r.dump()
    );
    assert_eq!(
        r.counter("cohort_messages_resent_total", &ab),
        Some(0),
        "{}",
        r.dump()
    );
    assert_eq!(
        a_got.get() + b_got.get(),
        SENT + BACK,
        "the handlers saw what the metrics say"
    );

    // Every metric published is documented, and was described with the unit the table says.
    let doc = include_str!("../docs/metrics.md");
    let units = recorder.units.lock().unwrap().clone();
    let names = recorder.names();
    assert!(names.len() >= 40, "{names:?}");
    for name in &names {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}` |")))
            .unwrap_or_else(|| panic!("{name} is not documented in docs/metrics.md"));
        let unit = units
            .get(name)
            .copied()
            .flatten()
            .unwrap_or_else(|| panic!("{name} was not described with a unit"));
        assert!(
            row.contains(&format!("| {} |", unit.as_str())),
            "{name}: {unit:?} vs {row}"
        );
    }

    // a stops: b keeps publishing, and shows it disconnected.
    nodes[0].shutdown(SHUTDOWN).expect("a shuts down");
    wait_until_or(
        PATIENCE,
        || {
            r.gauge("cohort_peer_connected", &ba) == Some(0.0)
                && r.counter("cohort_disconnects_total", &ba) == Some(1)
        },
        || format!("b sees a gone; recorded:\n{}", r.dump()),
    );
    nodes[1].shutdown(SHUTDOWN).expect("b shuts down");
}
