//! Two members over TLS: `alpha` sends `--count` messages to `beta`, which checks their
//! order; then both print their stats.
//!
//! By default the example makes its own certificates at start, in memory, with rcgen: a
//! throwaway CA and one certificate per member naming it (a DNS subject alternative name,
//! usable for server and client authentication), as every member of a TLS cluster needs.
//! With `--certs DIR` it reads them instead from `DIR/ca.pem`, `DIR/alpha.pem`,
//! `DIR/alpha.key`, `DIR/beta.pem` and `DIR/beta.key`, made as `docs/tls.md` shows.
//!
//! `cargo run --features tls --example tls_pair [-- --count N --certs DIR]`

use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cohort::tls::TlsConfig;
use cohort::Node;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

const USAGE: &str = "usage: tls_pair [--count N] [--certs DIR]

Two members, alpha and beta, over TLS: alpha sends N messages to beta, which checks their
order; both print their stats. Needs the tls feature:
cargo run --features tls --example tls_pair -- [OPTIONS]

  --count N        messages to send (default 100000)
  --certs DIR      read ca.pem, alpha.pem, alpha.key, beta.pem and beta.key from DIR
                   (default: make a throwaway CA and member certificates at start)
  -h, --help       this text";

const MEMBERS: [&str; 2] = ["alpha", "beta"];

struct Args {
    count: u64,
    certs: Option<PathBuf>,
}

/// The command line; `Ok(None)` when help was asked for.
fn parse() -> Result<Option<Args>, String> {
    let mut a = Args {
        count: 100_000,
        certs: None,
    };
    let mut it = std::env::args_os().skip(1);
    while let Some(flag) = it.next() {
        let flag = flag.to_string_lossy().into_owned();
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        if flag != "--count" && flag != "--certs" {
            return Err(format!("unknown argument {flag:?}"));
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        if flag == "--certs" {
            a.certs = Some(PathBuf::from(value));
        } else {
            let value = value.to_string_lossy();
            a.count = value
                .parse()
                .map_err(|e| format!("{flag} {value:?}: {e}"))?;
        }
    }
    Ok(Some(a))
}

/// Each member's TLS settings, read from the files in `dir`.
fn from_files(dir: &Path) -> Result<Vec<TlsConfig>, Box<dyn Error>> {
    let mut configs = Vec::new();
    for name in MEMBERS {
        let config = TlsConfig::from_pem_files(
            dir.join("ca.pem"),
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        )
        .map_err(|e| format!("certificates of {name} in {}: {e}", dir.display()))?;
        configs.push(config);
    }
    Ok(configs)
}

/// Each member's TLS settings, from a CA made for this run (ECDSA P-256 keys): every
/// member trusts the CA and holds a certificate naming it, for both ends of a connection.
fn throwaway() -> Result<Vec<TlsConfig>, Box<dyn Error>> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "tls_pair throwaway CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;

    let mut configs = Vec::new();
    for name in MEMBERS {
        // The member name as a DNS subject alternative name: what cohort checks.
        let mut member = CertificateParams::new(vec![name.to_owned()])?;
        member.distinguished_name.push(DnType::CommonName, name);
        member.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate()?;
        let cert = member.signed_by(&key, &ca)?;
        configs.push(TlsConfig::from_pem(
            ca.pem().as_bytes(),
            cert.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
        )?);
    }
    Ok(configs)
}

fn run(a: &Args) -> Result<(), Box<dyn Error>> {
    let count = a.count;
    let mut tls = match &a.certs {
        Some(dir) => from_files(dir)?,
        None => throwaway()?,
    }
    .into_iter();
    let (alpha_tls, beta_tls) = (tls.next(), tls.next());
    let (Some(alpha_tls), Some(beta_tls)) = (alpha_tls, beta_tls) else {
        return Err("one TLS configuration per member".into());
    };

    let next = Arc::new(AtomicU64::new(0));
    let disorder = Arc::new(AtomicU64::new(0));
    let (n, bad) = (next.clone(), disorder.clone());
    let beta = Node::builder("beta")
        .cluster("tls-demo")
        .tls(beta_tls)
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
        .tls(alpha_tls)
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
    // beta's stats count a delivery once its handler has returned: let them catch up
    // with the handler's own count before printing them.
    let delivered = |node: &Node| node.stats().peers.iter().map(|p| p.delivered).sum::<u64>();
    while delivered(&beta) < got && Instant::now() < deadline {
        std::thread::park_timeout(Duration::from_millis(1));
    }
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

fn main() -> ExitCode {
    let args = match parse() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("tls_pair: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tls_pair: {e}");
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
