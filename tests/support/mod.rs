//! Helpers shared by integration tests.
#[cfg(feature = "axum")]
pub mod http_client;
#[cfg(feature = "tracing")]
pub mod logs;
#[cfg(feature = "redis")]
pub mod redis_limits;
pub mod redis_server;
pub mod store_faults;
