//! A child process of a test: this test binary re-executed to run one ignored test as a
//! member of its own (the crash tests, the twin tests), its marked stdout lines and its
//! stderr collected by two threads.

use std::io::{BufRead, BufReader, Read};
use std::process::Child;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What a child says: its stdout lines that carry `mark` (libtest writes there too), the
/// mark and surrounding blanks cut off, in order; the thread reading them (it ends at the
/// child's exit); and everything it wrote on stderr so far.
pub(crate) struct Output {
    pub(crate) lines: Receiver<String>,
    pub(crate) stdout: JoinHandle<()>,
    pub(crate) stderr: Arc<Mutex<String>>,
}

/// Takes `child`'s piped stdout and stderr and starts reading them.
pub(crate) fn output(child: &mut Child, mark: &'static str) -> Output {
    let (tx, lines) = mpsc::channel();
    let out = BufReader::new(child.stdout.take().expect("child stdout"));
    let stdout = std::thread::spawn(move || {
        for line in out.lines() {
            let Ok(line) = line else { break };
            if let Some(at) = line.find(mark) {
                if tx.send(line[at + mark.len()..].trim().to_owned()).is_err() {
                    break;
                }
            }
        }
    });
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut err = child.stderr.take().expect("child stderr");
    let sink = stderr.clone();
    // Detached: it ends at the child's exit (end of stream).
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    Output {
        lines,
        stdout,
        stderr,
    }
}
