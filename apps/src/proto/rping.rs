//! The application protocol of librdmacm's `rping` (rdma-core
//! `librdmacm/examples/rping.c`), byte for byte, with no I/O.
//!
//! Confirmed against `shared/peer/captures/siw-rping.pcapng` (siw ↔ siw,
//! `rping -C 5`, default size 64); see the tests at the bottom.
//!
//! # Connection
//!
//! * TCP port [`DEFAULT_PORT`] (7174, `-p`). The client connects with
//!   `responder_resources = initiator_depth = 1`, so the MPA v2 private data
//!   is `00 01 00 01` (IRD 1, ORD 1) both ways; no ULP private data.
//! * QP: send queue [`SQ_DEPTH`] (16), receive queue [`RQ_DEPTH`] (2), one
//!   SGE each; one CQ for both (`2 * SQ_DEPTH` entries).
//! * Buffers per side: `recv_buf` and `send_buf` (16 bytes each, one
//!   [`RdmaInfo`]), `rdma_buf` (`size` bytes, remote read + write), and on
//!   the client `start_buf` (`size` bytes, remote read + write).
//!
//! # One iteration ("ping" number `i`, starting at 0)
//!
//! Each side posts exactly **one** 16-byte receive before connecting
//! (client: before `rdma_connect`; server: before `rdma_accept`) and reposts
//! one from its completion handler every time a receive completes, so one
//! receive is always outstanding. A receive whose length is not 16 is fatal
//! ("Received bogus data").
//!
//! | step | client | wire | server |
//! | --- | --- | --- | --- |
//! | 1 | fill `start_buf` ([`fill_ping`]), Send `RdmaInfo{start_buf, start_rkey, size}` | Send (16 B, QN 0) → | receive: remember addr/rkey/len |
//! | 2 | | ← RDMA Read Request (QN 1), → Read Response | RDMA Read `len` bytes from (rkey, addr) into its `rdma_buf` |
//! | 3 | | ← Send (16 B) | after the Read completes: Send the "go ahead" (its never-written `send_buf`: 16 zero bytes) |
//! | 4 | on that receive: Send `RdmaInfo{rdma_buf, rdma_rkey, size}` | Send (16 B) → | receive: remember addr/rkey |
//! | 5 | | ← RDMA Write | RDMA Write `strlen(rdma_buf) + 1` bytes (= `size` for rping's data) to (rkey, addr) |
//! | 6 | | ← Send (16 B zeros) | after the Write completes: Send the "go ahead" |
//! | 7 | on that receive: `-V` compares `start_buf` and `rdma_buf` (all `size` bytes), `-v` prints `ping data: <rdma_buf>` | | |
//!
//! The server prints `server ping data: <rdma_buf>` (with `-v`) after step 2.
//! Only the server's Read and Write and every Send are signalled; the server
//! never waits for its Send completions.
//!
//! # End
//!
//! The client stops after `-C count` iterations (0 or absent = forever) and
//! calls `rdma_disconnect` (a TCP FIN on iWARP, no Terminate). The server
//! ignores `-C`: it loops until the DISCONNECTED event, prints
//! `server DISCONNECT EVENT...` on stderr and exits 0 (sometimes 255, a
//! known rping CM-thread race after a complete exchange). The client also
//! prints `client DISCONNECT EVENT...` when its own disconnect completes.
//!
//! # Sizes
//!
//! `-S size` must lie in [`MIN_SIZE`]`..=`[`MAX_SIZE`] (default
//! [`DEFAULT_SIZE`] = 64). The server's `rdma_buf` has the *server's* size;
//! its Read uses the length the client advertised, so a client size larger
//! than the server's makes the server's Read fail locally. A host-side
//! server should size its buffer from the advertisement (or use ≥ the
//! client's size).

use iwarp::wire::{Error, Result};

/// rping's default TCP port.
pub const DEFAULT_PORT: u16 = 7174;
/// rping's default ping data size (`-S`).
pub const DEFAULT_SIZE: usize = 64;
/// Smallest `-S` rping accepts: `sizeof(stringify(INT_MAX)) +
/// sizeof(RPING_MSG_FMT)`. rping.c does not include `<limits.h>`, so
/// `INT_MAX` stays a bare word: 8 + 15 = 23. Debian's rping 44.0 in the VM
/// prints "Invalid size 1 (valid range is 23 to 65536)". At 23 bytes a
/// ten-digit ping number leaves no room for the pattern (see [`fill_ping`]).
pub const MIN_SIZE: usize = 23;
/// Largest `-S` rping accepts (`RPING_BUFSIZE - 1`; its message says 65536).
pub const MAX_SIZE: usize = 64 * 1024 - 1;
/// Send queue depth of rping's QP.
pub const SQ_DEPTH: u32 = 16;
/// Receive queue depth of rping's QP (only one receive is ever posted).
pub const RQ_DEPTH: u32 = 2;
/// `responder_resources` and `initiator_depth` rping passes to the CM
/// (the MPA v2 IRD and ORD).
pub const IRD_ORD: u16 = 1;
/// The prefix format of the ping data: `rdma-ping-%d: `.
pub const MSG_PREFIX: &str = "rdma-ping-";
/// First character of the cyclic pattern ('A').
pub const PATTERN_FIRST: u8 = 65;
/// Last character of the cyclic pattern ('z').
pub const PATTERN_LAST: u8 = 122;
/// What the server's "go ahead" Send carries: its `send_buf`, which it
/// never writes.
pub const GO_AHEAD: [u8; RdmaInfo::LEN] = [0; RdmaInfo::LEN];

/// `struct rping_rdma_info`: the 16-byte buffer advertisement the client
/// sends (all fields big endian).
///
/// ```text
/// 0        8      12     16
/// | buf u64 | rkey | size |
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdmaInfo {
    /// Virtual address of the buffer (the tagged offset to use with `rkey`).
    pub addr: u64,
    /// STag of the buffer.
    pub rkey: u32,
    /// Length in bytes (the client's `-S`).
    pub size: u32,
}

impl RdmaInfo {
    /// Encoded length.
    pub const LEN: usize = 16;

    /// Decode; the message must be exactly [`Self::LEN`] bytes (rping
    /// rejects any other receive length).
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let b: &[u8; Self::LEN] = bytes.try_into().map_err(|_| {
            if bytes.len() < Self::LEN {
                Error::Truncated
            } else {
                Error::Malformed
            }
        })?;
        let [a0, a1, a2, a3, a4, a5, a6, a7, k0, k1, k2, k3, s0, s1, s2, s3] = *b;
        Ok(Self {
            addr: u64::from_be_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
            rkey: u32::from_be_bytes([k0, k1, k2, k3]),
            size: u32::from_be_bytes([s0, s1, s2, s3]),
        })
    }

    /// Encode.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..8].copy_from_slice(&self.addr.to_be_bytes());
        out[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        out[12..].copy_from_slice(&self.size.to_be_bytes());
        out
    }
}

/// `true` if `size` is a valid `-S` value.
pub fn size_is_valid(size: usize) -> bool {
    (MIN_SIZE..=MAX_SIZE).contains(&size)
}

/// First pattern character of iteration `iteration` ('A' for ping 0, then
/// +1 per ping, wrapping from 'z' back to 'A').
pub fn start_char(iteration: u64) -> u8 {
    let span = u64::from(PATTERN_LAST - PATTERN_FIRST) + 1;
    // The remainder is < 58, so the cast cannot truncate.
    PATTERN_FIRST + (iteration % span) as u8
}

/// Fill `buf` exactly as the rping client fills `start_buf` for ping
/// `iteration`: `snprintf(buf, len, "rdma-ping-%d: ", iteration)`, then
/// from the end of that text the cyclic pattern 'A'..='z' starting at
/// [`start_char`], and a NUL in the last byte. rping's `%d` is a C `int`:
/// iterations beyond `i32::MAX` print negative numbers there; this follows
/// that. Like `snprintf`, the text is cut to `len - 1` bytes. An empty
/// buffer is left alone.
pub fn fill_ping(buf: &mut [u8], iteration: u64) {
    let Some(last) = buf.len().checked_sub(1) else {
        return;
    };
    // C int wrap-around of the loop counter.
    let shown = iteration as u32 as i32;
    let text = format!("{MSG_PREFIX}{shown}: ");
    let cut = text.len().min(last);
    buf[..cut].copy_from_slice(&text.as_bytes()[..cut]);
    // rping continues from the untruncated text length (snprintf's
    // return), so a cut text is followed by no pattern at all.
    let mut c = start_char(iteration);
    for b in buf.iter_mut().skip(text.len()) {
        *b = c;
        c = if c >= PATTERN_LAST {
            PATTERN_FIRST
        } else {
            c + 1
        };
    }
    buf[last] = 0;
}

/// The ping data of iteration `iteration` at `size` bytes.
pub fn ping_data(size: usize, iteration: u64) -> Vec<u8> {
    let mut v = vec![0u8; size];
    fill_ping(&mut v, iteration);
    v
}

/// Length of the server's echo RDMA Write: `strlen(rdma_buf) + 1`, i.e. up
/// to and including the first NUL, capped at the buffer (rping itself would
/// read past a buffer without a NUL).
pub fn echo_len(rdma_buf: &[u8]) -> usize {
    rdma_buf
        .iter()
        .position(|&b| b == 0)
        .map_or(rdma_buf.len(), |p| p + 1)
}

/// The text rping prints for a buffer with `%s`: bytes up to the first NUL.
pub fn as_c_str(buf: &[u8]) -> &[u8] {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    &buf[..end]
}

/// The client's `-v` line for one ping (without the newline).
pub fn client_line(rdma_buf: &[u8]) -> String {
    format!("ping data: {}", String::from_utf8_lossy(as_c_str(rdma_buf)))
}

/// The server's `-v` line for one ping (without the newline).
pub fn server_line(rdma_buf: &[u8]) -> String {
    format!(
        "server ping data: {}",
        String::from_utf8_lossy(as_c_str(rdma_buf))
    )
}

/// Which local buffer an advertisement or a transfer refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffer {
    /// The client's `start_buf` (the server reads it).
    Start,
    /// `rdma_buf` (the server reads into it and writes from it; the
    /// client's is written by the server).
    Rdma,
}

/// What the client must do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAction {
    /// Fill `start_buf` with [`fill_ping`] for this iteration, then Send the
    /// advertisement of `start_buf` (16 bytes, [`RdmaInfo`]).
    AdvertiseStart {
        /// Ping number (0-based).
        iteration: u64,
    },
    /// Send the advertisement of `rdma_buf`.
    AdvertiseRdma,
    /// Wait for the server's next Send (then call
    /// [`Client::on_recv`]; repost the receive).
    WaitRecv,
    /// With `-V`, compare `start_buf` and `rdma_buf`; with `-v`, print
    /// [`client_line`]. Then call [`Client::advance`].
    Check {
        /// Ping number (0-based).
        iteration: u64,
    },
    /// All pings done: disconnect.
    Disconnect,
}

/// Client side of the ping loop as a state machine. Before connecting,
/// post one 16-byte receive; after each receive completion, repost it.
#[derive(Clone, Debug)]
pub struct Client {
    count: Option<u64>,
    iteration: u64,
    state: ClientState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClientState {
    Start,
    AwaitReadGoAhead,
    AwaitWriteGoAhead,
    Checking,
    Done,
}

impl Client {
    /// `count` = `-C` (`None` = forever, as rping with `-C 0` or no `-C`).
    pub fn new(count: Option<u64>) -> Self {
        let state = if count == Some(0) {
            ClientState::Done
        } else {
            ClientState::Start
        };
        Self {
            count: count.filter(|&c| c > 0),
            iteration: 0,
            state,
        }
    }

    /// The first action after the connection is established.
    pub fn start(&mut self) -> ClientAction {
        self.advance()
    }

    /// A receive completed with `len` bytes. Errors if it was not expected
    /// or not 16 bytes long.
    pub fn on_recv(&mut self, len: usize) -> Result<ClientAction> {
        if len != RdmaInfo::LEN {
            return Err(Error::Malformed);
        }
        match self.state {
            ClientState::AwaitReadGoAhead => {
                self.state = ClientState::AwaitWriteGoAhead;
                Ok(ClientAction::AdvertiseRdma)
            }
            ClientState::AwaitWriteGoAhead => {
                self.state = ClientState::Checking;
                Ok(ClientAction::Check {
                    iteration: self.iteration,
                })
            }
            _ => Err(Error::Malformed),
        }
    }

    /// Advance after [`ClientAction::Check`] (or to begin).
    pub fn advance(&mut self) -> ClientAction {
        match self.state {
            ClientState::Start => {
                self.state = ClientState::AwaitReadGoAhead;
                ClientAction::AdvertiseStart {
                    iteration: self.iteration,
                }
            }
            ClientState::Checking => {
                self.iteration = self.iteration.saturating_add(1);
                if self.count.is_some_and(|c| self.iteration >= c) {
                    self.state = ClientState::Done;
                    ClientAction::Disconnect
                } else {
                    self.state = ClientState::AwaitReadGoAhead;
                    ClientAction::AdvertiseStart {
                        iteration: self.iteration,
                    }
                }
            }
            ClientState::Done => ClientAction::Disconnect,
            ClientState::AwaitReadGoAhead | ClientState::AwaitWriteGoAhead => {
                ClientAction::WaitRecv
            }
        }
    }

    /// Pings completed so far.
    pub fn completed(&self) -> u64 {
        match self.state {
            ClientState::Done => self.count.unwrap_or(self.iteration),
            _ => self.iteration,
        }
    }
}

/// What the server must do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerAction {
    /// Post an RDMA Read of `info.size` bytes from (`info.rkey`,
    /// `info.addr`) into `rdma_buf`; call [`Server::on_read_done`] when it
    /// completes.
    Read(RdmaInfo),
    /// Send the 16-byte go-ahead ([`GO_AHEAD`]), then wait for the next
    /// receive.
    SendGoAhead,
    /// Post an RDMA Write of [`echo_len`]`(rdma_buf)` bytes to (`info.rkey`,
    /// `info.addr`); call [`Server::on_write_done`] when it completes.
    Write(RdmaInfo),
}

/// Server side of the ping loop. Before accepting, post one 16-byte
/// receive; after each receive completion, repost it. The loop ends when
/// the client disconnects (that is success).
#[derive(Clone, Debug, Default)]
pub struct Server {
    state: ServerState,
    pings: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum ServerState {
    #[default]
    AwaitReadAdvert,
    Reading,
    AwaitWriteAdvert,
    Writing,
}

impl Server {
    /// A new server loop (waiting for the first advertisement).
    pub fn new() -> Self {
        Self::default()
    }

    /// A receive completed with these bytes.
    pub fn on_recv(&mut self, msg: &[u8]) -> Result<ServerAction> {
        let info = RdmaInfo::parse(msg)?;
        match self.state {
            ServerState::AwaitReadAdvert => {
                self.state = ServerState::Reading;
                Ok(ServerAction::Read(info))
            }
            ServerState::AwaitWriteAdvert => {
                self.state = ServerState::Writing;
                Ok(ServerAction::Write(info))
            }
            ServerState::Reading | ServerState::Writing => Err(Error::Malformed),
        }
    }

    /// The RDMA Read completed: print [`server_line`] with `-v`, then Send.
    pub fn on_read_done(&mut self) -> Result<ServerAction> {
        if self.state != ServerState::Reading {
            return Err(Error::Malformed);
        }
        self.state = ServerState::AwaitWriteAdvert;
        Ok(ServerAction::SendGoAhead)
    }

    /// The RDMA Write completed: Send the go-ahead for the next ping.
    pub fn on_write_done(&mut self) -> Result<ServerAction> {
        if self.state != ServerState::Writing {
            return Err(Error::Malformed);
        }
        self.state = ServerState::AwaitReadAdvert;
        self.pings = self.pings.saturating_add(1);
        Ok(ServerAction::SendGoAhead)
    }

    /// Complete pings served.
    pub fn pings(&self) -> u64 {
        self.pings
    }

    /// `true` between pings (a disconnect here is a clean end).
    pub fn is_idle(&self) -> bool {
        self.state == ServerState::AwaitReadAdvert
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iwarp::wire::ddp;

    /// TCP payloads of `siw-rping.pcapng`; client 34886 → server 7174.
    /// Frame 18: client Send, advertisement of start_buf (ping 0).
    const F18: &str =
        "00224143000000000000000000000001000000000000563d2ebf4e30c20531000000004000000000";
    /// Frame 19: server RDMA Read Request (QN 1).
    const F19: &str = "002e414100000000000000010000000100000000331ded0000005596a54c9b1000000040c20531000000563d2ebf4e3000000000";
    /// Frame 20: client Read Response, ping 0 data.
    const F20: &str = "004ec142331ded0000005596a54c9b1072646d612d70696e672d303a204142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f7071720000000000";
    /// Frame 21: server go-ahead Send.
    const F21: &str =
        "00224143000000000000000000000001000000000000000000000000000000000000000000000000";
    /// Frame 22: client advertisement of rdma_buf.
    const F22: &str =
        "00224143000000000000000000000002000000000000563d2ebf1b1000bb5c000000004000000000";
    /// Frame 23: server RDMA Write (echo of ping 0).
    const F23: &str = "004ec14000bb5c000000563d2ebf1b1072646d612d70696e672d303a204142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f7071720000000000";
    /// Frame 52: Read Response of ping 4.
    const F52: &str = "004ec142331ded0000005596a54c9b1072646d612d70696e672d343a2045464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f606162636465666768696a6b6c6d6e6f707172737475760000000000";

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// (opcode, qn-or-stag, payload) of one FPDU (no markers, CRC 0).
    fn fpdu(s: &str) -> (u8, Vec<u8>, ddp::Packet<Vec<u8>>) {
        let b = hex(s);
        let len = usize::from(u16::from_be_bytes([b[0], b[1]]));
        let seg = b[2..2 + len].to_vec();
        let p = ddp::Packet::new_checked(seg).unwrap();
        (p.opcode(), p.payload().to_vec(), p)
    }

    #[test]
    fn advertisement_matches_capture() {
        let (op, payload, p) = fpdu(F18);
        assert_eq!(op, 3, "Send");
        assert!(!p.tagged());
        assert_eq!((p.qn(), p.msn(), p.mo()), (0, 1, 0));
        let info = RdmaInfo::parse(&payload).unwrap();
        assert_eq!(
            info,
            RdmaInfo {
                addr: 0x0000_563d_2ebf_4e30,
                rkey: 0xc205_3100,
                size: 64
            }
        );
        assert_eq!(info.to_bytes().as_slice(), payload.as_slice());

        // The Read Request names exactly that buffer as its source.
        let (op, rr, p) = fpdu(F19);
        assert_eq!(op, 1, "Read Request");
        assert_eq!((p.qn(), p.msn()), (1, 1));
        assert_eq!(&rr[12..16], &64u32.to_be_bytes(), "read size");
        assert_eq!(&rr[16..20], &info.rkey.to_be_bytes());
        assert_eq!(&rr[20..28], &info.addr.to_be_bytes());

        // Second advertisement: rdma_buf, and the Write goes there.
        let (_, payload, p) = fpdu(F22);
        assert_eq!(p.msn(), 2);
        let sink = RdmaInfo::parse(&payload).unwrap();
        assert_eq!(sink.size, 64);
        let (op, _, w) = fpdu(F23);
        assert_eq!(op, 0, "RDMA Write");
        assert!(w.tagged());
        assert_eq!((w.stag(), w.to()), (sink.rkey, sink.addr));
    }

    #[test]
    fn go_ahead_is_sixteen_zero_bytes() {
        let (op, payload, p) = fpdu(F21);
        assert_eq!(op, 3);
        assert_eq!((p.qn(), p.msn()), (0, 1));
        assert_eq!(payload, GO_AHEAD);
    }

    #[test]
    fn ping_data_matches_capture() {
        let (_, p0, _) = fpdu(F20);
        assert_eq!(p0, ping_data(DEFAULT_SIZE, 0));
        let (_, echo, _) = fpdu(F23);
        assert_eq!(echo, p0);
        assert_eq!(echo_len(&p0), DEFAULT_SIZE);
        let (_, p4, _) = fpdu(F52);
        assert_eq!(p4, ping_data(DEFAULT_SIZE, 4));
        assert_eq!(
            client_line(&p0),
            "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
        );
    }

    #[test]
    fn pattern_wraps() {
        assert_eq!(start_char(0), b'A');
        assert_eq!(start_char(57), b'z');
        assert_eq!(start_char(58), b'A');
        let d = ping_data(MIN_SIZE, 57);
        assert_eq!(&d[..15], b"rdma-ping-57: z");
        assert_eq!(d[15], b'A');
        assert_eq!(d[MIN_SIZE - 1], 0);
        // The longest prefix exactly fills the minimum size.
        let d = ping_data(MIN_SIZE, 0x7fff_ffff);
        assert_eq!(as_c_str(&d), b"rdma-ping-2147483647: ");
        let d = ping_data(26, 0x7fff_ffff);
        assert_eq!(as_c_str(&d), b"rdma-ping-2147483647: HIJ");
        // snprintf truncation: the text is cut, no pattern follows.
        let d = ping_data(MIN_SIZE, 0x8000_0000);
        assert_eq!(as_c_str(&d), b"rdma-ping--2147483648:");
        // Degenerate buffers do not panic.
        fill_ping(&mut [], 3);
        let mut one = [7u8];
        fill_ping(&mut one, 3);
        assert_eq!(one, [0]);
    }

    #[test]
    fn parse_rejects_wrong_length() {
        assert_eq!(RdmaInfo::parse(&[0; 15]), Err(Error::Truncated));
        assert_eq!(RdmaInfo::parse(&[0; 17]), Err(Error::Malformed));
        assert!(size_is_valid(23) && size_is_valid(65535));
        assert!(!size_is_valid(22) && !size_is_valid(65536));
    }

    #[test]
    fn client_and_server_loops() {
        let mut c = Client::new(Some(2));
        let mut s = Server::new();
        let adv = RdmaInfo {
            addr: 1,
            rkey: 2,
            size: 64,
        };
        let mut action = c.start();
        for i in 0..2 {
            assert_eq!(action, ClientAction::AdvertiseStart { iteration: i });
            assert_eq!(s.on_recv(&adv.to_bytes()), Ok(ServerAction::Read(adv)));
            assert_eq!(s.on_read_done(), Ok(ServerAction::SendGoAhead));
            assert_eq!(c.on_recv(16), Ok(ClientAction::AdvertiseRdma));
            assert_eq!(s.on_recv(&adv.to_bytes()), Ok(ServerAction::Write(adv)));
            assert_eq!(s.on_write_done(), Ok(ServerAction::SendGoAhead));
            assert_eq!(c.on_recv(16), Ok(ClientAction::Check { iteration: i }));
            assert!(s.is_idle());
            action = c.advance();
        }
        assert_eq!(action, ClientAction::Disconnect);
        assert_eq!(c.advance(), ClientAction::Disconnect);
        assert_eq!(c.completed(), 2);
        assert_eq!(s.pings(), 2);
        // Unexpected input is an error, not a panic.
        assert!(s.on_read_done().is_err());
        assert!(c.on_recv(16).is_err());
        assert!(c.on_recv(3).is_err());
        assert_eq!(Client::new(Some(0)).start(), ClientAction::Disconnect);
    }
}
