//! Replays the checked-in fuzz corpus (`fuzz/corpus/<target>/`) through the
//! same differential core the fuzz targets run (`fuzz/model/`), on stable,
//! so every `cargo test` exercises every input the fuzzer kept.

#[path = "../fuzz/model/mod.rs"]
mod model;

use std::path::PathBuf;

fn replay(target: &str, run: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "empty corpus in {}", dir.display());
    let mut failures = Vec::new();
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        if std::panic::catch_unwind(|| run(&bytes)).is_err() {
            failures.push(file.display().to_string());
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} corpus inputs of `{target}` fail (reproduce with `cargo +nightly fuzz run {target} <file>`): {failures:#?}",
        failures.len(),
        files.len()
    );
}

#[test]
fn token_bucket_corpus() {
    replay("token_bucket", model::run_token_bucket);
}

#[test]
fn leaky_bucket_corpus() {
    replay("leaky_bucket", model::run_leaky_bucket);
}

#[test]
fn config_corpus() {
    replay("config", model::run_config);
}

#[test]
fn windows_corpus() {
    replay("windows", model::run_windows);
}

#[test]
fn keyed_corpus() {
    replay("keyed", model::run_keyed);
}

#[test]
fn multi_corpus() {
    replay("multi", model::run_multi);
}

#[test]
fn headers_corpus() {
    replay("headers", model::run_headers);
}

#[test]
fn lease_corpus() {
    replay("lease", model::run_lease);
}

#[test]
fn lease_keyed_corpus() {
    replay("lease_keyed", model::run_lease_keyed);
}

#[test]
fn announce_corpus() {
    replay("announce", model::run_announce);
}

#[test]
fn client_keys_corpus() {
    replay("client_keys", model::run_client_keys);
}
