//! MPA (RFC 5044, RFC 6581): connection setup and FPDU framing.
//!
//! * [`handshake`]: the MPA request/reply exchange for initiator and
//!   responder, with CRC/marker negotiation, the RFC 6581 IRD/ORD exchange,
//!   RTR selection and timeouts.
//! * [`framing`]: FPDU framing on transmit (length, markers, pad, CRC32c)
//!   and deframing on receive, resumable at any byte boundary.

pub mod framing;
pub mod handshake;
