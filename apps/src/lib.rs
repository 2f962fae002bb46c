//! Support code shared by the application binaries (rping, iwarp-perf,
//! iwarp-cm, iwarp-probe, iwarp-soak).
#![warn(missing_docs)]

pub mod backend;
pub mod hex;
pub mod lines;
pub mod logging;
pub mod probe;
pub mod proto;
