//! Replays the committed fuzz corpus through the same property checks the
//! fuzz targets run, so that `cargo test` on stable keeps every seed (and
//! every crash input added to the corpus once fixed) passing without
//! cargo-fuzz or a nightly compiler.

#[path = "../fuzz/props.rs"]
mod props;

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;

/// Runs `check` on every file in `fuzz/corpus/<target>`, naming the file
/// that breaks a property.
fn replay(target: &str, check: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut paths: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    paths.sort();
    // A missing or emptied corpus must fail, not pass on zero inputs.
    let seeds = paths
        .iter()
        .filter(|path| {
            path.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
        })
        .count();
    assert!(seeds > 0, "no seed-* files in {}", dir.display());
    for path in &paths {
        let data = fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        if panic::catch_unwind(AssertUnwindSafe(|| check(&data))).is_err() {
            panic!("{} breaks a property (message above)", path.display());
        }
    }
    println!(
        "replayed {} {target} inputs ({seeds} seeds) from {}",
        paths.len(),
        dir.display()
    );
}

#[test]
fn every_parse_corpus_input_keeps_the_parser_properties() {
    replay("parse", props::check_parse);
}

#[test]
fn every_roundtrip_corpus_input_encodes_and_parses_back() {
    replay("roundtrip", props::check_roundtrip);
}
