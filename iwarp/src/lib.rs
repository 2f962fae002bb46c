//! A sans-IO implementation of the iWARP protocol suite.
//!
//! This crate is fully deterministic: it performs no I/O, spawns no
//! threads and never reads a clock. Bytes of the TCP stream and the current
//! time go in; bytes to transmit, work completions and connection events
//! come out. The AF_XDP engine and the kernel-socket backend drive it.
//! It reports connection lifecycle, Terminates and failures as `tracing`
//! events (none per frame), which reach whatever subscriber the
//! application installs and go nowhere without one (see [`qp`]).
//!
//! Layers, bottom up:
//!
//! | module | spec | role |
//! |---|---|---|
//! | [`wire`] | RFC 5044, 5041, 5040, 6581, 7306 | typed views and `Repr` parse/emit of every frame and header |
//! | [`mpa`] | RFC 5044, 6581 | connection setup (request/reply, IRD/ORD, RTR) and FPDU framing (length, pad, CRC32c, markers) |
//! | [`mem`] | RFC 5040 §5 | STag table, memory regions and access checks |
//! | [`qp`] | RFC 5040, 5041, 7306 | queue pairs: DDP segmentation and placement, RDMAP operations (atomics and Immediate Data included), Terminate |
//! | [`cq`] | verbs | completion queues and work completions |
//! | [`srq`] | verbs | shared receive queues: one queue of posted receives for many QPs |
//! | [`verbs`] | verbs | [`verbs::Context`], the owner of protection domains, regions, CQs and QPs |
//! | [`slab`] | – | the generational table behind the handles of PDs, CQs and QPs |
//!
//! Peer input never panics the core: every violation becomes a Terminate
//! message with the layer/type/code the RFCs assign, the QP moves to
//! Error and its outstanding work requests complete with a flush status.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod cq;
pub mod crc;
pub mod error;
pub mod mem;
pub mod mpa;
pub mod qp;
pub mod slab;
pub mod srq;
pub mod testing;
pub mod time;
pub mod verbs;
pub mod wire;
