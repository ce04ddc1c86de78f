//! The owner's launch id, kept in the journal directory so that it survives restarts.

use std::fs;
use std::io::Write;
use std::path::Path;

use super::segment::sync_dir;
use super::JournalError;

/// File name of the launch id.
pub(crate) const FILE: &str = "launch-id";

/// Reads the launch id, or makes one and writes it (to a temporary file, synced, renamed,
/// directory synced) if the journal has none yet.
pub(crate) fn load_or_create(dir: &Path) -> Result<u64, JournalError> {
    let path = dir.join(FILE);
    match fs::read_to_string(&path) {
        Ok(text) => {
            parse(&text).ok_or_else(|| JournalError::DamagedLaunchId { path: path.clone() })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = crate::util::random_nonzero_u64();
            let tmp = dir.join(format!("{FILE}.tmp"));
            let mut f = fs::File::create(&tmp).map_err(JournalError::io(&tmp))?;
            f.write_all(format!("{id:016x}\n").as_bytes())
                .map_err(JournalError::io(&tmp))?;
            f.sync_all().map_err(JournalError::io(&tmp))?;
            fs::rename(&tmp, &path).map_err(JournalError::io(&path))?;
            sync_dir(dir)?;
            Ok(id)
        }
        Err(e) => Err(JournalError::Io { path, source: e }),
    }
}

fn parse(text: &str) -> Option<u64> {
    let hex = text.trim_end_matches('\n');
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok().filter(|&id| id != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_what_it_writes() {
        assert_eq!(parse("00000000000000ff\n"), Some(255));
        assert_eq!(parse("0000000000000000\n"), None);
        assert_eq!(parse("ff\n"), None);
        assert_eq!(parse("zzzzzzzzzzzzzzzz\n"), None);
    }
}
