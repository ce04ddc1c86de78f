//! Prints what is on disk in a cohort journal directory: segments, their states, record
//! counts, and the empty-file pool.
//!
//! ```text
//! cargo run --example journal_inspect -- /var/lib/myapp/journal
//! ```

use std::ffi::OsString;
use std::process::ExitCode;

const USAGE: &str = "usage: journal_inspect DIR

Prints what is on disk in the cohort journal directory DIR (the one given to
Builder::journal): its segments, their states and record counts, and the empty-file pool.
Reads only; changes nothing.

  -h, --help       this text";

/// The command line: the directory; `Ok(None)` when help was asked for.
fn parse() -> Result<Option<OsString>, String> {
    let mut dir = None;
    for arg in std::env::args_os().skip(1) {
        match arg.to_str() {
            Some("-h" | "--help") => return Ok(None),
            // A directory whose name starts with '-' can be given as ./-name.
            Some(flag) if flag.starts_with('-') => {
                return Err(format!("unknown argument {flag:?}"))
            }
            _ if dir.is_some() => return Err(format!("one DIR only, not also {arg:?}")),
            _ => dir = Some(arg),
        }
    }
    dir.map(Some).ok_or_else(|| "no DIR given".to_owned())
}

fn main() -> ExitCode {
    let dir = match parse() {
        Ok(Some(dir)) => dir,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("journal_inspect: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match cohort::inspect_journal(&dir) {
        Ok(inspection) => {
            print!("{inspection}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("journal_inspect: {e}");
            // Each error says its own level; the causes follow.
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                eprintln!("  caused by: {c}");
                cause = c.source();
            }
            ExitCode::FAILURE
        }
    }
}
