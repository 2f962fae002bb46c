//! Support code shared by the application binaries (rping, iwarp-perf,
//! iwarp-cm).

pub mod backend;
pub mod hex;
pub mod proto;
