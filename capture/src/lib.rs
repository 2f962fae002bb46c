//! pcap files and the tshark judge: the capture I/O of the workspace, kept
//! out of the sans-IO protocol core (`iwarp`).
//!
//! * [`pcap`]: [`pcap::PcapWriter`], a classic pcap file (Ethernet link
//!   type) of frames handed to it, which the AF_XDP engine records with;
//!   [`pcap::TcpCapture`], a synthetic TCP connection (handshake, data
//!   segments, FIN exchange) carrying two given byte streams, so that the
//!   core's output can be dissected like a real capture.
//! * [`tshark`]: runs Wireshark's `tshark` on a capture and summarises what
//!   its iWARP dissectors decoded ([`tshark::Report`]): an independent
//!   wire-format oracle for the tests and for `iwarp-pcapcheck`.
//! * `log` (feature `log`): a `tracing` layer that records every event
//!   with its fields and the spans it belongs to, for tests of what the
//!   libraries log.
#![deny(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "log")]
pub mod log;
pub mod pcap;
pub mod tshark;
