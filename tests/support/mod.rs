//! Helpers shared by integration tests.
#[cfg(feature = "axum")]
pub mod http_client;
pub mod redis_server;
