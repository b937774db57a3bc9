//! What a `tracing` subscriber writes, captured (feature `tracing`): for
//! tests that read or count the library's log lines.
#![allow(dead_code)] // each test file uses a part

use std::sync::{Arc, Mutex};

/// The text a subscriber made by [`Captured::subscriber`] wrote.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// A plain-text subscriber (no colours) writing here, at `INFO` and up.
    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish()
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.0.lock().unwrap().is_empty()
    }

    /// How many lines are warnings.
    pub fn warnings(&self) -> usize {
        self.text().lines().filter(|l| l.contains(" WARN ")).count()
    }
}
