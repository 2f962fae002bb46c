//! User-space TCP for the AF_XDP data path: smoltcp configured for iWARP
//! (no Nagle, short delayed ACK, window scaling, Reno congestion control
//! set on every socket), generic over `smoltcp::phy::Device`, and an
//! in-memory link with fault injection and pcap output for tests
//! ([`sim`]).
//!
//! Like the `iwarp` core this crate is sans-IO: no sockets, no threads, no
//! clock reads. Time enters as a `smoltcp::time::Instant` argument; frames
//! enter and leave only through the device. Its system calls are about
//! memory: each connection's socket buffers are a mapping of their own,
//! whose pages idle connections give back ([`Config::idle_release`]).
//!
//! One pass of the caller's loop:
//!
//! 1. [`Stack::poll`]`(now)`: up to [`Config::ingress_budget`] frames and
//!    [`Config::ingress_bytes`] bytes in (TCP payload lands in the
//!    connections' receive rings), new passive connections handed to
//!    [`Stack::accept`], then egress (the batch's acknowledgements).
//! 2. For each connection, [`Stack::recv`] hands the received bytes to a
//!    closure (for iWARP: `Context::handle_input`) and [`Stack::send`]
//!    lets a closure fill the transmit ring (`Context::poll_transmit`),
//!    FPDUs sized from [`Stack::emss`].
//! 3. [`Stack::poll`] again to send what was written; repeat while it
//!    returns true, then wait until [`Stack::poll_at`].
//!
//! FPDU alignment (RFC 5044 §8): with [`Stack::send_segment`] instead of
//! [`Stack::send`] (and `Context::poll_transmit_within` in the closure),
//! the writer queues whole segments of whole FPDUs, one at a time or full
//! ones back to back; [`Stack::poll_egress`] sends a round of segments,
//! after which the connections queue the next, within smoltcp's
//! congestion window. smoltcp exposes neither what it has sent, nor the
//! peer's window, nor its congestion window, so the device wrapper reads
//! the first two from the segments passing through it and replays Reno's
//! window from them; it also cuts the MTU so the MSS is a multiple of 4,
//! the length of every FPDU.
//!
//! ```
//! use iwarp_tcp::sim::{LinkConfig, Sim, Step};
//! use iwarp_tcp::Config;
//! use smoltcp::time::Duration;
//!
//! let mut sim = Sim::new(Config::default(), Config::default(), LinkConfig::default());
//! sim.b.listen(7174).unwrap();
//! let a = sim.a.connect((Sim::IP_B, 7174), 40000).unwrap();
//! let mut b = None;
//! let mut got = Vec::new();
//! let limit = sim.now + Duration::from_secs(1);
//! sim.run(limit, |s| {
//!     if b.is_none() {
//!         b = s.b.accept(7174);
//!     }
//!     if s.a.is_established(a) && s.a.send_queue(a) == 0 && got.is_empty() {
//!         s.a.send_slice(a, b"hello").unwrap();
//!     }
//!     if let Some(b) = b {
//!         let _ = s.b.recv(b, |buf| { got.extend_from_slice(buf); buf.len() });
//!     }
//!     if got == b"hello" { Step::Done } else { Step::Idle }
//! })
//! .unwrap();
//! assert_eq!(sim.a.emss(a), Some(1460));
//! ```

#![warn(missing_docs)]

mod config;
pub mod csum;
mod cwnd;
mod flow;
mod hash;
mod pages;
mod port;
mod probe;
pub mod sim;
mod stack;

pub use config::{Config, MAX_BUFFER, MIN_BUFFER, SHARED_BUFFER_MIN};
pub use probe::{PROBE_ANSWER_WAIT, PROBE_LIMIT};
pub use smoltcp;
pub use smoltcp::socket::tcp::{CongestionControl, State};
pub use stack::{ConnId, Counters, Error, Stack, FRAME_RUN_BUCKETS};
