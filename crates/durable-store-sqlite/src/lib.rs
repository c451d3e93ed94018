//! # durable-store-sqlite
//!
//! The embedded default store of `durable`, on one SQLite file. Filled in by the SQLite issue.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
