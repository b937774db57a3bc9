//! Announce fuzz target: see `fuzz/model/announce.rs`.
#![no_main]

#[path = "../model/mod.rs"]
mod model;

libfuzzer_sys::fuzz_target!(|data: &[u8]| model::run_announce(data));
