//! Differential fuzz target: see `fuzz/model/lease.rs` (the keyed hot-key case).
#![no_main]

#[path = "../model/mod.rs"]
mod model;

libfuzzer_sys::fuzz_target!(|data: &[u8]| model::run_lease_keyed(data));
