//! Benchmarks of the stack; see `benches/`.
