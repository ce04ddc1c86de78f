//! Typed messages (feature `codec`) between real members: values with nested types and a
//! large vector come out as they went in, a payload that is not the type asked for decodes
//! to an error (never a panic), and a request and its reply travel as typed values.

mod support;

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::Mutex;

use cohort::{Delivery, Error, Node, ReplyFailure};
use serde::{Deserialize, Serialize};
use support::*;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
enum Part {
    Empty,
    Named { name: String, weight: Option<f64> },
    Pair(i16, u128),
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Order {
    id: u64,
    customer: String,
    parts: Vec<Part>,
    notes: BTreeMap<String, Vec<Option<bool>>>,
    readings: Vec<u32>,
}

fn order(id: u64, readings: usize) -> Order {
    Order {
        id,
        customer: format!("customer-{id} ✓"),
        parts: vec![
            Part::Empty,
            Part::Named {
                name: "bolt".into(),
                weight: Some(-0.25),
            },
            Part::Named {
                name: String::new(),
                weight: None,
            },
            Part::Pair(i16::MIN, u128::MAX),
        ],
        notes: [
            ("a".to_owned(), vec![Some(true), None, Some(false)]),
            ("empty".to_owned(), vec![]),
        ]
        .into(),
        readings: (0..readings as u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect(),
    }
}

/// A receiver `b` whose deliveries go to the returned channel, and a sender `a`, connected.
fn pair(cluster: &str) -> (Node, Node, mpsc::Receiver<Delivery>) {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let [a, b] = connected([
        Node::builder("a").cluster(cluster),
        Node::builder("b").cluster(cluster).on_message(move |d| {
            let _ = tx.lock().expect("channel").send(d);
        }),
    ]);
    (a, b, rx)
}

#[test]
fn nested_values_and_a_large_vector_arrive_as_sent() {
    let (a, b, rx) = pair("typed-roundtrip");
    // 150 000 readings, most of them 5-byte varints: about 700 KB encoded, well over the
    // socket buffers and within the default 1 MiB message limit.
    let big = order(1, 150_000);
    let small = order(2, 3);
    a.send_typed("b", &big).expect("the large order is sent");
    a.sender().send_typed("b", &small).expect("sent");
    a.to("b").expect("b").send_typed(&small).expect("sent");
    // Typed and byte messages mix in one stream.
    a.send("b", &b"raw bytes"[..]).expect("sent");
    for want in [&big, &small, &small] {
        let d = rx.recv_timeout(PATIENCE).expect("a delivery");
        assert!(d.payload().len() > 4 * want.readings.len() / 2);
        assert_eq!(&d.decode::<Order>().expect("decodes"), want);
    }
    let d = rx.recv_timeout(PATIENCE).expect("a delivery");
    assert_eq!(d.payload(), b"raw bytes");
    shutdown_all(&[a, b]);
}

#[test]
fn a_corrupt_or_foreign_payload_decodes_to_an_error() {
    let (a, b, rx) = pair("typed-corrupt");
    let good = cohort::codec::encode(&order(3, 10)).expect("encodes");
    let cut = good.slice(..good.len() / 2);
    let mut flipped = good.to_vec();
    // The customer's length varint, made to claim more bytes than there are.
    flipped[1] = 0xff;
    flipped[2] = 0x7f;
    let mut longer = good.to_vec();
    longer.push(0);
    let sent: Vec<(&str, Vec<u8>)> = vec![
        ("cut short", cut.to_vec()),
        ("a length past the end", flipped),
        ("a byte left over", longer),
        ("empty", Vec::new()),
        ("garbage", vec![0xff; 64]),
    ];
    for (_, p) in &sent {
        a.send("b", p.clone()).expect("sent");
    }
    for (what, p) in &sent {
        let d = rx.recv_timeout(PATIENCE).expect("a delivery");
        match d.decode::<Order>() {
            Err(Error::Codec(e)) => {
                assert!(e.is_decode(), "{what}: {e}");
                assert_eq!(e.len(), p.len(), "{what}");
                assert!(e.type_name().ends_with("Order"), "{what}: {e}");
                assert!(e.to_string().starts_with("cannot decode a "), "{what}: {e}");
            }
            other => panic!("{what}: expected a decode error, got {other:?}"),
        }
        // The delivery is untouched: the payload can be tried as another type.
        assert_eq!(d.payload(), &p[..], "{what}");
    }
    shutdown_all(&[a, b]);
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum Quote {
    Price { cents: u64, parts: usize },
    Refused(String),
}

/// A server that prices an `Order`: one cent per reading, `Refused` for an order without
/// parts, a reply that is not a `Quote` for id 13, and no reply for id 14.
fn pricing_server(d: Delivery) {
    let o: Order = match d.decode() {
        Ok(o) => o,
        Err(e) => {
            let _ = d.reply_typed(&Quote::Refused(e.to_string()));
            return;
        }
    };
    let r = match o.id {
        13 => d.reply(&b"\xff\xff\xff"[..]).map_err(cohort::Error::from),
        14 => Ok(()),
        _ if o.parts.is_empty() => d.reply_typed(&Quote::Refused("no parts".into())),
        _ => d.reply_typed(&Quote::Price {
            cents: o.readings.len() as u64,
            parts: o.parts.len(),
        }),
    };
    r.expect("the reply is queued");
}

#[test]
fn a_typed_request_gets_a_typed_reply() {
    let [client, server] = connected([
        Node::builder("client").cluster("typed-request"),
        Node::builder("server")
            .cluster("typed-request")
            .on_message(pricing_server),
    ]);
    let q: Quote = client
        .request_typed("server", &order(1, 25), PATIENCE)
        .expect("a quote");
    assert_eq!(
        q,
        Quote::Price {
            cents: 25,
            parts: 4
        }
    );

    let mut no_parts = order(2, 1);
    no_parts.parts.clear();
    let q: Quote = client
        .sender()
        .request_typed("server", &no_parts, PATIENCE)
        .expect("a quote");
    assert_eq!(q, Quote::Refused("no parts".into()));

    // Many in flight from one thread, through a handle bound to the server.
    let to_server = client.to("server").expect("server");
    let pending: Vec<_> = (100..110)
        .map(|i| to_server.send_request_typed(&order(i, i as usize)))
        .collect::<Result<_, _>>()
        .expect("queued");
    for (i, p) in (100..110).zip(pending) {
        let q: Quote = p.wait_typed(PATIENCE).expect("a quote");
        assert_eq!(q, Quote::Price { cents: i, parts: 4 });
    }

    // A reply that is not a `Quote` is the requester's decode error.
    match client.request_typed::<_, Quote>("server", &order(13, 1), PATIENCE) {
        Err(Error::Codec(e)) => {
            assert!(e.is_decode() && e.type_name().ends_with("Quote"), "{e}")
        }
        other => panic!("expected a decode error, got {other:?}"),
    }
    // The transport's errors come through unchanged.
    match to_server.request_typed::<_, Quote>(&order(14, 1), PATIENCE) {
        Err(Error::ReplyFailed {
            reason: ReplyFailure::Unanswered,
            ..
        }) => {}
        other => panic!("expected an unanswered request, got {other:?}"),
    }
    match client.request_typed::<_, Quote>("nobody", &order(1, 1), PATIENCE) {
        Err(Error::UnknownPeer(p)) => assert_eq!(p, "nobody"),
        other => panic!("expected an unknown peer, got {other:?}"),
    }
    shutdown_all(&[client, server]);
}

#[test]
fn a_value_that_cannot_be_encoded_is_an_error_and_nothing_is_sent() {
    struct NoLength;
    impl Serialize for NoLength {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeSeq;
            s.serialize_seq(None)?.end()
        }
    }
    let (a, b, _rx) = pair("typed-encode");
    match a.send_typed("b", &NoLength) {
        Err(Error::Codec(e)) => assert!(!e.is_decode(), "{e}"),
        other => panic!("expected an encoding error, got {other:?}"),
    }
    assert_eq!(peer_stats(&a, "b").accepted, 0, "nothing was queued");
    shutdown_all(&[a, b]);
}
