//! Loom models of ratewall live in `tests/`; this crate compiles to nothing without `--cfg ratewall_loom`.
