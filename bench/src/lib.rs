//! Benchmarks of the stack; see `benches/`.
//!
//! `benches/core.rs` measures the sans-IO protocol core alone, on one
//! core and without any I/O: receive-side placement of RDMA Write FPDUs
//! (`handle_input`) and transmit-side framing (`poll_transmit`).
