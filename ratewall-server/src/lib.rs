//! `ratewall-server`: an Envoy rate limit service on ratewall.
//!
//! (Under construction.)

pub mod config;
