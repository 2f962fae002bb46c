//! Support code shared by the application binaries (rping, iwarp-perf,
//! iwarp-cm, iwarp-probe).
#![warn(missing_docs)]

pub mod backend;
pub mod hex;
pub mod logging;
pub mod probe;
pub mod proto;
