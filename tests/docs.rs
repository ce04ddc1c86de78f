//! The documentation a user reads: the dependency lines name the package (`cohort-net`), and
//! no document points at a file outside the package.

/// Every Markdown document shipped with the package, with its path.
const DOCS: &[(&str, &str)] = &[
    ("README.md", include_str!("../README.md")),
    ("docs/design.md", include_str!("../docs/design.md")),
    ("docs/metrics.md", include_str!("../docs/metrics.md")),
    ("docs/tls.md", include_str!("../docs/tls.md")),
    ("docs/wire.md", include_str!("../docs/wire.md")),
    ("docs/benchmarks.md", include_str!("../docs/benchmarks.md")),
];

#[test]
fn dependency_lines_name_the_package() {
    for (path, text) in DOCS {
        for line in text.lines() {
            let line = line.trim_start_matches(['#', ' ']);
            assert!(
                !line.starts_with("cohort =") && !line.starts_with("cohort={"),
                "{path}: {line:?} depends on `cohort`; the package is `cohort-net`"
            );
        }
    }
}

#[test]
fn no_document_points_outside_the_package() {
    for (path, text) in DOCS {
        for needle in ["../", "shared/DESIGN"] {
            assert!(
                !text.contains(needle),
                "{path} points outside the package ({needle:?})"
            );
        }
    }
}
