//! One client, one key: see `fuzz/model/client_keys.rs`.
#![no_main]

#[path = "../model/mod.rs"]
mod model;

libfuzzer_sys::fuzz_target!(|data: &[u8]| model::run_client_keys(data));
