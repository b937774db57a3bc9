//! The adversarial suite: one file per attack that docs/security.md
//! names, each run through the real tower layer (and a real Redis where
//! the attack reaches the store). Every test here failed before the fix it
//! holds; docs/security.md cites each one beside the promise it keeps.

#[path = "../support/mod.rs"]
mod support;

mod forged_forwarded;
mod hardening;
mod hostile_upstream;
mod key_spray;
mod lockout_wear;
mod log_memory;
mod redis_oom;
mod repeated_header;
