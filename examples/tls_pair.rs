//! Two members over TLS, from certificate files: `alpha` sends `--count` messages to `beta`,
//! which checks their order; then both print their stats.
//!
//! The directory holds `ca.pem`, `alpha.pem`, `alpha.key`, `beta.pem` and `beta.key`, made
//! as `docs/tls.md` shows (openssl or rcgen).
//!
//! `cargo run --features tls --example tls_pair -- --certs DIR [--count N]`

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cohort::tls::TlsConfig;
use cohort::Node;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(arg("--certs").ok_or("usage: tls_pair --certs DIR [--count N]")?);
    let count: u64 = arg("--count").map_or(Ok(100_000), |s| s.parse())?;
    let tls = |name: &str| {
        TlsConfig::from_pem_files(
            dir.join("ca.pem"),
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        )
    };

    let next = Arc::new(AtomicU64::new(0));
    let disorder = Arc::new(AtomicU64::new(0));
    let (n, bad) = (next.clone(), disorder.clone());
    let beta = Node::builder("beta")
        .cluster("tls-demo")
        .tls(tls("beta")?)
        .on_message(move |d| {
            let mut le = [0u8; 8];
            le.copy_from_slice(&d.payload()[..8]);
            if u64::from_le_bytes(le) != n.fetch_add(1, Ordering::SeqCst) {
                bad.fetch_add(1, Ordering::SeqCst);
            }
        })
        .start()?;
    let alpha = Node::builder("alpha")
        .cluster("tls-demo")
        .tls(tls("alpha")?)
        .peer("beta", beta.local_addr())
        .start()?;
    beta.add_peer("alpha", alpha.local_addr())?;

    let started = Instant::now();
    for i in 0..count {
        alpha.send("beta", i.to_le_bytes().repeat(8))?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while next.load(Ordering::SeqCst) < count && Instant::now() < deadline {
        std::thread::park_timeout(Duration::from_millis(5));
    }
    let elapsed = started.elapsed();
    let got = next.load(Ordering::SeqCst);
    println!(
        "{got} of {count} messages of 64 B over TLS in {elapsed:.2?} ({:.0} msgs/s), {} out of order\n",
        got as f64 / elapsed.as_secs_f64(),
        disorder.load(Ordering::SeqCst)
    );
    println!("{}\n\n{}", alpha.stats(), beta.stats());
    alpha.shutdown(Duration::from_secs(5))?;
    beta.shutdown(Duration::from_secs(5))?;
    if got < count || disorder.load(Ordering::SeqCst) > 0 {
        return Err("not every message arrived in order".into());
    }
    Ok(())
}
