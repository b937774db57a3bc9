//! Helpers shared by integration tests.
pub mod redis_server;
