//! Prints what is on disk in a cohort journal directory: segments, their states, record
//! counts, and the empty-file pool.
//!
//! ```text
//! cargo run --example journal_inspect -- /var/lib/myapp/journal
//! ```

use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: journal_inspect DIR");
        return ExitCode::from(2);
    };
    match cohort::inspect_journal(&dir) {
        Ok(inspection) => {
            print!("{inspection}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("journal_inspect: {e}");
            ExitCode::FAILURE
        }
    }
}
