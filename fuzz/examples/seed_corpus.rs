//! Writes the seed corpus: real encoded frames, framed by the setting bytes the targets in
//! `tests/fuzz/harness.rs` read first. Run from `fuzz/`: `cargo run --example seed_corpus`, then
//! commit `tests/fuzz/corpus/`. Deterministic, so re-running rewrites the same files.

use std::fs;
use std::path::Path;

use cohort::internals::wire::{self, CloseCode, Identity};

fn id<'a>(cluster: &'a str, name: &'a str, window: u64) -> Identity<'a> {
    Identity {
        version: wire::VERSION,
        launch_id: 0x1122_3344_5566_7788,
        window,
        max_message: 4096,
        cluster,
        name,
        nonce: None,
    }
}

fn authed<'a>(cluster: &'a str, name: &'a str, window: u64) -> Identity<'a> {
    Identity {
        nonce: Some([0x5a; wire::NONCE_LEN]),
        ..id(cluster, name, window)
    }
}

fn frames() -> Vec<(&'static str, Vec<u8>)> {
    let mut v: Vec<(&'static str, Vec<u8>)> = Vec::new();
    let mut f = |name, enc: &dyn Fn(&mut Vec<u8>)| {
        let mut out = Vec::new();
        enc(&mut out);
        v.push((name, out));
    };
    f("hello", &|o| wire::encode_hello(o, &id("c", "b", 1 << 20)));
    f("hello_long_names", &|o| {
        wire::encode_hello(o, &id(&"c".repeat(255), &"n".repeat(255), 2))
    });
    f("hello_reply", &|o| {
        wire::encode_hello_reply(o, &id("c", "b", 1 << 20), 5, 1, 64, None)
    });
    f("ready", &|o| wire::encode_ready(o, 3, 128, None));
    // With the authentication trailer (nonce, and a MAC no secret produced).
    f("hello_auth", &|o| wire::encode_hello(o, &authed("c", "b", 1 << 20)));
    f("hello_reply_auth", &|o| {
        wire::encode_hello_reply(
            o,
            &authed("c", "b", 1 << 20),
            5,
            1,
            64,
            Some(&[0xa5; wire::MAC_LEN]),
        )
    });
    f("ready_auth", &|o| {
        wire::encode_ready(o, 3, 128, Some(&[0xa5; wire::MAC_LEN]))
    });
    f("data_plain", &|o| wire::encode_data(o, 0, None, b"hello"));
    f("data_oob", &|o| {
        wire::encode_data(o, wire::FLAG_OOB, None, b"x")
    });
    f("data_reliable", &|o| {
        wire::encode_data(o, wire::FLAG_RELIABLE, Some(1), b"payload")
    });
    f("data_reliable_oob_empty", &|o| {
        wire::encode_data(o, wire::FLAG_RELIABLE | wire::FLAG_OOB, Some(u64::MAX), b"")
    });
    f("data_request", &|o| {
        let mut body = 0x0102_0304_0506_0708u64.to_le_bytes().to_vec(); // the request id
        body.extend_from_slice(&1024u32.to_le_bytes()); // room for the reply
        body.extend_from_slice(b"question");
        wire::encode_data(o, wire::FLAG_RELIABLE | wire::FLAG_REQUEST, Some(2), &body)
    });
    f("data_reply", &|o| {
        let mut body = 0x0102_0304_0506_0708u64.to_le_bytes().to_vec();
        body.extend_from_slice(b"answer");
        wire::encode_data(o, wire::FLAG_RELIABLE | wire::FLAG_REPLY, Some(3), &body)
    });
    f("data_reply_status_too_large", &|o| {
        let mut body = 0x0102_0304_0506_0708u64.to_le_bytes().to_vec();
        body.extend_from_slice(&wire::encode_reply_status(wire::ReplyStatus::TooLarge {
            len: 20_000,
            room: 16_384,
        }));
        let flags = wire::FLAG_RELIABLE | wire::FLAG_REPLY | wire::FLAG_STATUS;
        wire::encode_data(o, flags, Some(4), &body)
    });
    f("data_reply_status_unanswered", &|o| {
        let mut body = 0x0102_0304_0506_0708u64.to_le_bytes().to_vec();
        body.extend_from_slice(&wire::encode_reply_status(wire::ReplyStatus::Unanswered));
        let flags = wire::FLAG_RELIABLE | wire::FLAG_REPLY | wire::FLAG_STATUS;
        wire::encode_data(o, flags, Some(5), &body)
    });
    f("ack", &|o| wire::encode_ack(o, 7, 4096));
    f("probe", &|o| wire::encode_probe(o));
    f("heartbeat", &|o| wire::encode_heartbeat(o));
    f("close", &|o| {
        wire::encode_close(o, CloseCode::Protocol, "bad frame")
    });
    f("close_utf8", &|o| {
        wire::encode_close(o, CloseCode::Other, "naïve ☃")
    });
    v
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    fs::write(dir.join(name), bytes).unwrap();
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fuzz/corpus");
    let (dec, hs) = (root.join("decode"), root.join("handshake"));
    for d in [&dec, &hs] {
        fs::create_dir_all(d).unwrap();
        for e in fs::read_dir(d).unwrap() {
            fs::remove_file(e.unwrap().path()).unwrap();
        }
    }
    let fr = frames();
    let get = |n: &str| fr.iter().find(|(k, _)| *k == n).unwrap().1.clone();

    // decode: [mode, chunk] ++ stream. mode & 3: 0 handshake bound, 1 data bound, 2 switch
    // after HelloReply/Ready; mode >> 2 picks max_message (6 = 4096). chunk 0 = one read.
    for (name, bytes) in &fr {
        let mode = if name.starts_with("hello") || name.starts_with("ready") {
            0
        } else {
            1 | 6 << 2
        };
        write(&dec, name, &cat(&[&[mode, 0], bytes]));
    }
    let session = cat(&[
        &get("hello_reply"),
        &get("data_reliable"),
        &get("data_oob"),
        &get("data_request"),
        &get("data_reply"),
        &get("data_reply_status_too_large"),
        &get("ack"),
        &get("probe"),
        &get("heartbeat"),
        &get("close"),
    ]);
    write(
        &dec,
        "session_one_read",
        &cat(&[&[2 | 6 << 2, 0], &session]),
    );
    write(
        &dec,
        "session_byte_reads",
        &cat(&[&[2 | 6 << 2, 1], &session]),
    );
    write(
        &dec,
        "session_7_byte_reads",
        &cat(&[&[2 | 6 << 2, 7], &session]),
    );
    // The last handshake frame and data frames larger than any handshake frame, in one
    // read: the data must be bounded by the data limit from the frame after Ready on.
    let mut after_ready = get("ready");
    wire::encode_data(&mut after_ready, wire::FLAG_RELIABLE, Some(1), &[0x5a; 1000]);
    wire::encode_data(&mut after_ready, wire::FLAG_RELIABLE, Some(2), &[0xa5; 3000]);
    wire::encode_ack(&mut after_ready, 0, 0);
    write(
        &dec,
        "ready_then_large_data_one_read",
        &cat(&[&[2 | 6 << 2, 0], &after_ready]),
    );
    let mut big = Vec::new();
    wire::encode_data(&mut big, wire::FLAG_RELIABLE, Some(9), &[0xab; 300]);
    write(&dec, "data_300_limit_255", &cat(&[&[1 | 4 << 2, 0], &big]));
    write(&dec, "data_300_limit_1024", &cat(&[&[1 | 5 << 2, 0], &big]));
    write(
        &dec,
        "too_large",
        &[1, 0, 0xff, 0xff, 0xff, 0xff, wire::kind::DATA, 0],
    );
    write(&dec, "too_short", &[1, 0, 1, 0, 0, 0, wire::kind::PROBE]);
    write(
        &dec,
        "partial",
        &cat(&[&[1 | 6 << 2, 0], &get("ack")[..10]]),
    );
    let mut seq0 = get("data_reliable");
    seq0[wire::HEADER_BYTES..wire::HEADER_BYTES + 8].fill(0);
    write(&dec, "data_seq0", &cat(&[&[1 | 6 << 2, 0], &seq0]));
    let mut bad_magic = get("hello");
    bad_magic[wire::HEADER_BYTES] = b'X';
    write(&dec, "hello_bad_magic", &cat(&[&[0, 0], &bad_magic]));

    // handshake, mode & 2 == 0: [mode] ++ tie-break (17) ++ local (launch 8, window 8,
    // max_message 1, secret 1: 0 none, 1 "k", 2 another) ++ nonce (8) ++ decide (1) ++
    // counts (24) ++ frames. Our side is "a" in cluster "c".
    let tie = |bits: u8, ours: u8, theirs: u8| {
        let mut t = vec![bits];
        t.extend_from_slice(&u64::from(ours).to_le_bytes());
        t.extend_from_slice(&u64::from(theirs).to_le_bytes());
        t
    };
    let local = |secret: u8| {
        cat(&[
            &1u64.to_le_bytes(),
            &3u64.to_le_bytes(),
            &[200, secret],
            &0x0102u64.to_le_bytes(),
        ])
    };
    let counts = cat(&[
        &5u64.to_le_bytes(),
        &2u64.to_le_bytes(),
        &64u64.to_le_bytes(),
    ]);
    let feed_with = |secret: u8, role: u8, t: &[u8], decide: u8, frames: &[u8]| {
        cat(&[&[role], t, &local(secret), &[decide], &counts, frames])
    };
    let feed = |role: u8, t: &[u8], decide: u8, frames: &[u8]| feed_with(0, role, t, decide, frames);
    let ok_dial = cat(&[&get("hello"), &get("ready")]);
    let hs_files: Vec<(&str, Vec<u8>)> = vec![
        (
            "acceptor_ok",
            feed(0, &tie(0, 0, 0), 0, &get("hello_reply")),
        ),
        (
            "acceptor_refuses",
            feed(0, &tie(1, 1, 2), 9, &get("hello_reply")),
        ),
        (
            "acceptor_then_data",
            feed(
                0,
                &tie(2, 2, 2),
                0,
                &cat(&[&get("hello_reply"), &get("data_plain")]),
            ),
        ),
        (
            "acceptor_peer_closes",
            feed(0, &tie(6, 3, 1), 0, &get("close")),
        ),
        (
            "acceptor_wrong_frame",
            feed(0, &tie(10, 1, 1), 0, &get("hello")),
        ),
        (
            "acceptor_twice",
            feed(
                0,
                &tie(42, 1, 3),
                0,
                &cat(&[&get("hello_reply"), &get("hello_reply")]),
            ),
        ),
        ("dialler_ok", feed(1, &tie(12, 0, 4), 0, &ok_dial)),
        ("dialler_refuses", feed(1, &tie(16, 1, 0), 3, &ok_dial)),
        (
            "dialler_early_ready",
            feed(1, &tie(20, 5, 5), 0, &get("ready")),
        ),
        (
            "dialler_long_names",
            feed(1, &tie(40, 2, 1), 0, &get("hello_long_names")),
        ),
        (
            "dialler_ready_twice",
            feed(1, &tie(56, 7, 7), 0, &cat(&[&ok_dial, &get("ready")])),
        ),
        (
            "dialler_peer_closes",
            feed(
                1,
                &tie(63, 1, 0),
                0,
                &cat(&[&get("hello"), &get("close_utf8")]),
            ),
        ),
        (
            "acceptor_auth_bad_mac",
            feed_with(1, 0, &tie(0, 0, 0), 0, &get("hello_reply_auth")),
        ),
        (
            "acceptor_auth_missing",
            feed_with(1, 0, &tie(0, 0, 0), 0, &get("hello_reply")),
        ),
        (
            "acceptor_auth_unexpected",
            feed(0, &tie(0, 0, 0), 0, &get("hello_reply_auth")),
        ),
        (
            "dialler_auth_bad_ready",
            feed_with(
                1,
                1,
                &tie(12, 0, 4),
                0,
                &cat(&[&get("hello_auth"), &get("ready_auth")]),
            ),
        ),
        (
            "dialler_auth_ready_without_mac",
            feed_with(
                2,
                1,
                &tie(12, 0, 4),
                0,
                &cat(&[&get("hello_auth"), &get("ready")]),
            ),
        ),
        (
            "dialler_auth_missing",
            feed_with(1, 1, &tie(12, 0, 4), 0, &ok_dial),
        ),
    ];
    for (name, bytes) in &hs_files {
        write(&hs, name, bytes);
    }

    // handshake, mode & 2 == 2: [mode] ++ tie-break ++ bits (1: other cluster, 2: dialled
    // another name) ++ names (length byte % 24, bytes) ++ two locals (with a secret byte)
    // ++ two count triples ++ the acceptor's and the dialler's nonce (8 each).
    let name = |s: &str| cat(&[&[s.len() as u8], s.as_bytes()]);
    let loc = |w: u64, secret: u8| cat(&[&7u64.to_le_bytes(), &w.to_le_bytes(), &[100, secret]]);
    let tail = cat(&[&counts, &counts, &1u64.to_le_bytes(), &2u64.to_le_bytes()]);
    let ex_with = |sa: u8, sd: u8, bits: u8, names: &[&str], wa: u64, wd: u64| {
        let ns: Vec<u8> = names.iter().flat_map(|n| name(n)).collect();
        cat(&[&[2], &tie(0, 1, 1), &[bits], &ns, &loc(wa, sa), &loc(wd, sd), &tail])
    };
    let ex = |bits: u8, names: &[&str], wa: u64, wd: u64| ex_with(0, 0, bits, names, wa, wd);
    let ex_files: Vec<(&str, Vec<u8>)> = vec![
        ("exchange_ok", ex(0, &["c", "a", "b"], 3, 3)),
        ("exchange_other_cluster", ex(1, &["c", "a", "x", "b"], 3, 3)),
        ("exchange_same_name", ex(0, &["c", "a", "a"], 3, 3)),
        ("exchange_dialled_other", ex(2, &["c", "a", "b", "z"], 3, 3)),
        ("exchange_acceptor_window", ex(0, &["c", "a", "b"], 1, 3)),
        ("exchange_dialler_window", ex(0, &["c", "a", "b"], 3, 0)),
        ("exchange_utf8", ex(0, &["clüster", "ä", "ö"], 2, 2)),
        ("exchange_auth_ok", ex_with(1, 1, 0, &["c", "a", "b"], 3, 3)),
        ("exchange_auth_other_secret", ex_with(1, 2, 0, &["c", "a", "b"], 3, 3)),
        ("exchange_auth_dialler_none", ex_with(1, 0, 0, &["c", "a", "b"], 3, 3)),
        ("exchange_auth_acceptor_none", ex_with(0, 1, 0, &["c", "a", "b"], 3, 3)),
        ("exchange_auth_other_cluster", ex_with(1, 1, 1, &["c", "a", "x", "b"], 3, 3)),
        ("exchange_auth_dialler_window", ex_with(2, 2, 0, &["c", "a", "b"], 3, 0)),
    ];
    for (name, bytes) in &ex_files {
        write(&hs, name, bytes);
    }
    let n = |d: &Path| fs::read_dir(d).unwrap().count();
    println!("wrote {} + {} files", n(&dec), n(&hs));
}
