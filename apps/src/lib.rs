//! Support code shared by the application binaries (rping, iwarp-perf).

pub mod probe;
pub mod proto;
