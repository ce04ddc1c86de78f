//! Typed request and reply (feature `codec`): a `store` member keeps a stock of items and
//! answers `Ask`s with `Answer`s, plain Rust types that derive serde's traits; a `shop`
//! member waits for the store to be up, asks it questions one at a time and many at once,
//! and checks every answer. No byte is handled by hand.
//!
//! `cargo run --example typed --features codec [-- --requests N]`

use std::collections::BTreeMap;
use std::error::Error;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use cohort::{Delivery, Node};
use serde::{Deserialize, Serialize};

const USAGE: &str = "usage: typed [--requests N]

Two members on loopback: 'shop' asks 'store' typed questions (stock of an item, a
reservation, the whole list) and checks each typed answer; prints what it learnt.

  --requests N   reservations of one unit each, 64 in flight at a time (default 1000)
  -h, --help     this text";

const TIMEOUT: Duration = Duration::from_secs(30);

/// What the shop asks.
#[derive(Serialize, Deserialize, Debug)]
enum Ask {
    Stock { item: String },
    Reserve { item: String, units: u32 },
    List,
}

/// What the store answers.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum Answer {
    Stock { item: String, units: u32 },
    Reserved { left: u32 },
    NotEnough { left: u32 },
    NoSuchItem(String),
    List(BTreeMap<String, u32>),
}

fn parse() -> Result<Option<u32>, String> {
    let mut requests = 1000;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--requests" => {
                let value = it.next().ok_or("--requests needs a value")?;
                requests = value
                    .parse()
                    .map_err(|e| format!("--requests {value:?}: {e}"))?;
            }
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    Ok(Some(requests))
}

/// The store's handler: decode the question, answer it.
fn serve(stock: &Mutex<BTreeMap<String, u32>>, d: &Delivery) -> Result<(), cohort::Error> {
    let ask: Ask = d.decode()?;
    // A poisoned lock (a panic while it was held) still holds a consistent map here.
    let mut stock = stock.lock().unwrap_or_else(|p| p.into_inner());
    let answer = match ask {
        Ask::Stock { item } => match stock.get(&item) {
            Some(&units) => Answer::Stock { item, units },
            None => Answer::NoSuchItem(item),
        },
        Ask::Reserve { item, units } => match stock.get_mut(&item) {
            Some(left) if *left >= units => {
                *left -= units;
                Answer::Reserved { left: *left }
            }
            Some(left) => Answer::NotEnough { left: *left },
            None => Answer::NoSuchItem(item),
        },
        Ask::List => Answer::List(stock.clone()),
    };
    d.reply_typed(&answer)
}

fn run(requests: u32) -> Result<(), Box<dyn Error>> {
    let initial: BTreeMap<String, u32> =
        [("apple".to_owned(), requests / 2), ("pear".to_owned(), 3)].into();
    let stock = Mutex::new(initial.clone());
    let store = Node::builder("store")
        .cluster("typed-example")
        .allow_unknown_members(true)
        .on_message(move |d| {
            if let Err(e) = serve(&stock, &d) {
                eprintln!("store: cannot answer {}: {e}", d.from());
            }
        })
        .start()?;
    let shop = Node::builder("shop")
        .cluster("typed-example")
        .peer("store", store.local_addr())
        .start()?;
    // Start asking once the store is up, rather than queue for it.
    shop.wait_connected("store", TIMEOUT)?;

    let answer: Answer = shop.request_typed(
        "store",
        &Ask::Stock {
            item: "pear".into(),
        },
        TIMEOUT,
    )?;
    println!("stock of pears: {answer:?}");
    assert_eq!(
        answer,
        Answer::Stock {
            item: "pear".into(),
            units: 3
        }
    );
    let answer: Answer = shop.request_typed(
        "store",
        &Ask::Stock {
            item: "plum".into(),
        },
        TIMEOUT,
    )?;
    println!("stock of plums: {answer:?}");
    assert_eq!(answer, Answer::NoSuchItem("plum".into()));

    // Many reservations in flight: half of them find an apple, the rest find none left.
    let to_store = shop.to("store")?;
    let (mut reserved, mut refused) = (0u32, 0u32);
    let mut pending = std::collections::VecDeque::new();
    let mut take = |p: cohort::PendingReply| -> Result<(), cohort::Error> {
        match p.wait_typed::<Answer>(TIMEOUT)? {
            Answer::Reserved { .. } => reserved += 1,
            Answer::NotEnough { left: 0 } => refused += 1,
            other => panic!("unexpected answer to a reservation: {other:?}"),
        }
        Ok(())
    };
    for _ in 0..requests {
        let ask = Ask::Reserve {
            item: "apple".into(),
            units: 1,
        };
        pending.push_back(to_store.send_request_typed(&ask)?);
        if pending.len() == 64 {
            take(pending.pop_front().expect("64 waiting"))?;
        }
    }
    for p in pending {
        take(p)?;
    }
    println!("{requests} reservations: {reserved} apples reserved, {refused} refused (none left)");
    assert_eq!((reserved, refused), (requests / 2, requests - requests / 2));

    let answer: Answer = shop.request_typed("store", &Ask::List, TIMEOUT)?;
    println!("stock now: {answer:?}");
    let mut expected = initial;
    expected.insert("apple".into(), 0);
    assert_eq!(answer, Answer::List(expected));

    shop.shutdown(Duration::from_secs(5))?;
    store.shutdown(Duration::from_secs(5))?;
    Ok(())
}

fn main() -> ExitCode {
    let requests = match parse() {
        Ok(Some(n)) => n,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("typed: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(requests) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("typed: {e}");
            ExitCode::FAILURE
        }
    }
}
