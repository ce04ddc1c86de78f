//! Temporary directories for journals and files.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh directory under the system temp dir, named after what it is for; removed on
/// drop, kept (and named on stderr) when the test is failing, for
/// `cohort::inspect_journal`. Created by whoever writes in it first (a journal creates its
/// own directory).
#[derive(Debug)]
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    /// A directory named `cohort-test-{name}-{pid}-{n}`, not created yet.
    pub(crate) fn new(name: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "cohort-test-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        TempDir(path)
    }

    /// Its path.
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test directory kept for inspection: {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
