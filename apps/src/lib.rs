//! Support code shared by the application binaries (rping, iwarp-perf).

pub mod backend;
pub mod proto;
