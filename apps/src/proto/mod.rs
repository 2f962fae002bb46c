//! Exact application protocols of the tools the siw peer runs, as pure
//! encode/decode and state-machine code (no I/O). See
//! `docs/interop-protocols.md`.

pub mod perftest;
pub mod rping;
