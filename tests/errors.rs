//! The errors of the public surface, as an error reporter prints them: each level's
//! `Display` says what failed there, and a cause is only its `source()`, so printing the
//! chain shows no text twice.

mod support;

use std::time::Duration;

use support::*;

/// The `Display` of `e` and of each of its sources, outermost first.
fn chain(e: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut out = vec![e.to_string()];
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push(c.to_string());
        cause = c.source();
    }
    out
}

/// Checks that no level of `e`'s chain repeats the text of a level below it, and that the
/// chain has at least `depth` levels.
fn no_repeats(what: &str, e: &(dyn std::error::Error + 'static), depth: usize) {
    let levels = chain(e);
    assert!(levels.len() >= depth, "{what}: a chain of {levels:?}");
    for (i, outer) in levels.iter().enumerate() {
        for inner in &levels[i + 1..] {
            assert!(
                !outer.contains(inner.as_str()),
                "{what}: {outer:?} repeats its cause {inner:?} (chain {levels:?})"
            );
        }
    }
}

#[test]
fn listen_error_names_the_address_and_leaves_the_os_error_to_its_source() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("local_addr");
    let e = cohort::Node::builder("err-listen")
        .listen(addr)
        .start()
        .expect_err("the address is taken");
    assert!(matches!(e, cohort::Error::Listen { .. }), "{e:?}");
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
    no_repeats("Listen", &e, 2);
}

#[test]
fn journal_error_leaves_the_journal_and_os_errors_to_its_sources() {
    let dir = TempDir::new("err-journal");
    // A file where the journal's directory should be: the journal cannot be opened.
    std::fs::write(dir.path(), b"not a directory").expect("write a file");
    let e = cohort::Node::builder("err-journal")
        .journal(dir.path())
        .start()
        .expect_err("no directory to journal in");
    assert!(matches!(e, cohort::Error::Journal(_)), "{e:?}");
    // Transparent: the journal's own message, then the OS error.
    assert!(e.to_string().starts_with("journal I/O error on"), "{e}");
    no_repeats("Journal", &e, 2);
    let _ = std::fs::remove_file(dir.path());
}

#[test]
fn io_error_leaves_the_os_error_to_its_source() {
    let os = std::io::Error::new(std::io::ErrorKind::OutOfMemory, "no threads left");
    let e = cohort::Error::from(os);
    no_repeats("Io", &e, 2);
    // A send's error is the same chain.
    let node = cohort::Node::builder("err-send").start().expect("start");
    node.shutdown(Duration::from_secs(5)).expect("shutdown");
    let e = node.send("nobody", &b"x"[..]).expect_err("shut down");
    assert_eq!(e.to_string(), e.error().to_string());
    no_repeats("SendError", &e, 1);
}

#[cfg(feature = "tls")]
#[test]
fn tls_error_leaves_the_file_error_to_its_source() {
    let dir = TempDir::new("err-tls");
    let missing = dir.path().join("missing.pem");
    let tls = cohort::tls::TlsConfig::from_pem_files(&missing, &missing, &missing)
        .expect_err("no such files");
    let e = cohort::Error::from(tls);
    no_repeats("Tls", &e, 3);
}
