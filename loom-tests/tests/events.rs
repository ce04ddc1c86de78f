//! The node's membership events queue, `cohort::internals::events::EventQueue`, with the
//! code that ships: the IO thread pushes while one deliverer at a time (a pool task) hands
//! events to the callback; nothing is stranded (every event pushed is delivered, exactly
//! once), they arrive in the order pushed, and no two deliverers run at once.
//!
//! The pool is modelled by its contract: a push that answers `Schedule` starts a deliverer,
//! which runs the queue until it is released (again after every yield).
#![cfg(loom)]

use cohort::internals::events::{EventQueue, Pushed};
use cohort::Event;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

fn event(n: u64) -> Event {
    Event::Removed {
        peer: n.to_string(),
    }
}

#[derive(Default)]
struct Seen {
    order: Mutex<Vec<String>>,
    inside: AtomicUsize,
    most_inside: AtomicUsize,
}

#[test]
fn events_arrive_once_in_order_with_one_deliverer() {
    loom::model(|| {
        let seen = Arc::new(Seen::default());
        let s = seen.clone();
        let callback = move |e: Event| {
            let now = s.inside.fetch_add(1, Ordering::Relaxed) + 1;
            s.most_inside.fetch_max(now, Ordering::Relaxed);
            if let Event::Removed { peer } = e {
                s.order.lock().unwrap().push(peer);
            }
            s.inside.fetch_sub(1, Ordering::Relaxed);
        };
        let q = Arc::new(EventQueue::new(
            std::sync::Arc::from("n"),
            std::sync::Arc::new(callback),
            8,
        ));
        let mut deliverers = Vec::new();
        for n in 0..3 {
            if q.push(event(n)) == Pushed::Schedule {
                let q = q.clone();
                // A budget of one: the deliverer yields (goes round again) between events.
                deliverers.push(thread::spawn(move || while q.run(1) {}));
            }
        }
        for d in deliverers {
            d.join().unwrap();
        }
        assert_eq!(*seen.order.lock().unwrap(), ["0", "1", "2"]);
        assert_eq!(seen.most_inside.load(Ordering::Relaxed), 1);
        assert!(q.is_empty());
    });
}
