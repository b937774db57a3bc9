//! `ratewall-server`: an Envoy rate limit service on ratewall.
//!
//! Envoy (and Istio, Contour, Gloo, Emissary) asks an external service
//! whether a request may pass: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`
//! over gRPC. This crate answers it, reading envoyproxy/ratelimit's YAML
//! configuration unchanged, with every ratewall algorithm one line of YAML
//! away (`rate_limit: { policy: "100/min burst 20" }`) and its counters in
//! ratewall's bounded in-memory tables: nothing else to run.
//!
//! ```
//! use ratewall_server::config::Config;
//! use ratewall_server::{Service, ServiceOptions};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let yaml = r#"
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit: { unit: second, requests_per_unit: 2 }
//!   - key: api_key
//!     rate_limit: { policy: "100/min sliding-window" }
//! "#;
//! let service = Service::new(
//!     Config::from_sources(&[("edge.yaml".into(), yaml.into())])?,
//!     ServiceOptions::default(),
//! )?;
//! let ip: &[(&str, &str)] = &[("remote_address", "10.0.0.1")];
//! assert!(service.check("edge", &[ip], 1).await?);
//! assert!(service.check("edge", &[ip], 1).await?);
//! assert!(!service.check("edge", &[ip], 1).await?); // 2 per second
//! # Ok(())
//! # }
//! ```
//!
//! The binary (`ratewall-server --config-dir DIR`) serves gRPC and HTTP
//! (`/json`, `/healthcheck`, `/metrics`); [`ServerBuilder`] starts the same
//! server in-process.

pub mod config;
mod headers;
mod json;
mod server;
mod service;
mod stats;
mod store;
mod together;

pub use headers::ResponseHeaders;
pub use server::{RunningServer, ServerBuilder, StartError};
pub use service::{request, RequestError, Service, ServiceOptions};
pub use store::LimitError;
