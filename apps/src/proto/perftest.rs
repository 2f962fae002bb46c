//! perftest's data exchange with `-R` (RDMA CM) over iWARP, byte for byte,
//! with no I/O: the messages on the control ("comm") connection, the
//! order of exchanges for each test, the measurement phase and the text
//! perftest prints.
//!
//! Reference: Debian bookworm perftest 4.5+0.17 (it announces itself as
//! version "6.06"), as run by the siw VM. Confirmed against
//! `shared/peer/captures/siw-ib_write_bw.pcapng` (tests below) and a
//! `siw-vm-selftest --full --capture` run (all six tests except
//! `ib_read_lat`, whose data connection lost a listen race in that run);
//! see `docs/interop-protocols.md`.
//!
//! # Connections
//!
//! Both go to the server's port ([`DEFAULT_PORT`] 18515, `-p`):
//!
//! 1. the **comm** connection (opened first): RC QP, tx/rx depth 1,
//!    IRD = ORD = 0 (MPA private data `00 00 00 00`; perftest treats it as
//!    a SEND test even for read tests), no ULP private data. It carries
//!    only untagged Sends, strictly alternating: in every exchange the
//!    **client sends first** and the server answers with the same kind of
//!    message. Each side keeps exactly one receive of
//!    [`PingpongDest::LEN`] (56) bytes posted (posted before
//!    connect/accept, reposted right after each receive completes), so a
//!    message longer than 56 bytes or two messages in a row break it.
//! 2. `num_of_qps` (`-q`, default 1) **data** connections, opened by the
//!    client between the two zero [`Exchange::Sync`]s. IRD = ORD =
//!    `out_reads` for read tests (siw: 128 → `00 80 00 80`), else 0; no
//!    ULP private data. The server only starts listening for them *after*
//!    it has answered the first sync, so a fast client can be refused: the
//!    client retries up to 10 times, 100 ms apart, but stock perftest
//!    sometimes crashes on that path (seen with `ib_read_lat`). A host-side
//!    server must listen before it answers the first sync.
//!
//! Close: after the last exchange each side disconnects the data QPs and
//! the comm QP (plain TCP FINs, no Terminate).

use core::fmt::Write as _;

use iwarp::wire::{Error, Result};

/// perftest's default port (`-p`).
pub const DEFAULT_PORT: u16 = 18515;
/// The version string Debian's perftest 4.5+0.17 sends.
pub const VERSION: &str = "6.06";
/// perftest refuses a peer whose version parses below this.
pub const MIN_PEER_VERSION: f64 = 5.70;
/// Default `-n` for bandwidth tests.
pub const DEFAULT_ITERS_BW: u64 = 5000;
/// Default `-n` for latency tests.
pub const DEFAULT_ITERS_LAT: u64 = 1000;
/// Default `-s` for bandwidth tests.
pub const DEFAULT_SIZE_BW: u64 = 65536;
/// Default `-s` for latency tests.
pub const DEFAULT_SIZE_LAT: u64 = 2;
/// Default `-t` (send queue depth) for bandwidth tests (capped at `-n`).
pub const DEFAULT_TX_DEPTH_BW: u32 = 128;
/// Send queue depth of latency tests.
pub const DEFAULT_TX_DEPTH_LAT: u32 = 1;
/// Default `-Q` (one signalled completion every this many sends) in bw.
pub const DEFAULT_CQ_MOD: u32 = 100;
/// Default `-r` (receive depth) for `send_bw` (capped at `-n`).
pub const DEFAULT_RX_DEPTH_SEND_BW: u32 = 512;
/// `out_reads` (`-o`) when not given: the device's `max_qp_rd_atom`
/// (siw: 128). Non-read tests advertise 1 in [`PingpongDest::out_reads`].
pub const SIW_OUT_READS: u32 = 128;
/// The cycle buffer both sides announce (the page size).
pub const CYCLE_BUFFER: u32 = 4096;
/// The cache line size both sides announce.
pub const CACHE_LINE: u32 = 64;
/// `ibv_mtu` enum value siw reports on a 1500-byte link (IBV_MTU_1024).
pub const SIW_MTU_ENUM: u8 = 3;

/// The six tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// `ib_write_bw`
    WriteBw,
    /// `ib_write_lat`
    WriteLat,
    /// `ib_read_bw`
    ReadBw,
    /// `ib_read_lat`
    ReadLat,
    /// `ib_send_bw`
    SendBw,
    /// `ib_send_lat`
    SendLat,
}

/// The operation a test measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// RDMA Write.
    Write,
    /// RDMA Read.
    Read,
    /// Send.
    Send,
}

impl Test {
    /// All six, in a fixed order.
    pub const ALL: [Self; 6] = [
        Self::WriteBw,
        Self::WriteLat,
        Self::ReadBw,
        Self::ReadLat,
        Self::SendBw,
        Self::SendLat,
    ];

    /// The measured operation.
    pub fn verb(self) -> Verb {
        match self {
            Self::WriteBw | Self::WriteLat => Verb::Write,
            Self::ReadBw | Self::ReadLat => Verb::Read,
            Self::SendBw | Self::SendLat => Verb::Send,
        }
    }

    /// `true` for bandwidth tests.
    pub fn is_bw(self) -> bool {
        matches!(self, Self::WriteBw | Self::ReadBw | Self::SendBw)
    }

    /// Default `-s`.
    pub fn default_size(self) -> u64 {
        if self.is_bw() {
            DEFAULT_SIZE_BW
        } else {
            DEFAULT_SIZE_LAT
        }
    }

    /// Default `-n`.
    pub fn default_iters(self) -> u64 {
        if self.is_bw() {
            DEFAULT_ITERS_BW
        } else {
            DEFAULT_ITERS_LAT
        }
    }

    /// MPA v2 IRD and ORD of the data connections (`out_reads` for read
    /// tests, else 0). The comm connection always uses 0/0.
    pub fn data_ird_ord(self, out_reads: u16) -> (u16, u16) {
        match self.verb() {
            Verb::Read => (out_reads, out_reads),
            _ => (0, 0),
        }
    }

    /// The test title line (centred with 20 spaces).
    pub fn title(self) -> &'static str {
        match self {
            Self::WriteBw => "RDMA_Write BW Test",
            Self::WriteLat => "RDMA_Write Latency Test",
            Self::ReadBw => "RDMA_Read BW Test",
            Self::ReadLat => "RDMA_Read Latency Test",
            Self::SendBw => "Send BW Test",
            Self::SendLat => "Send Latency Test",
        }
    }

    /// The title line of `-b` (bandwidth tests).
    pub fn title_bidirectional(self) -> &'static str {
        match self {
            Self::WriteBw => "RDMA_Write Bidirectional BW Test",
            Self::ReadBw => "RDMA_Read Bidirectional BW Test",
            Self::SendBw => "Send Bidirectional BW Test",
            t => t.title(),
        }
    }

    /// The tool's command name.
    pub fn command(self) -> &'static str {
        match self {
            Self::WriteBw => "ib_write_bw",
            Self::WriteLat => "ib_write_lat",
            Self::ReadBw => "ib_read_bw",
            Self::ReadLat => "ib_read_lat",
            Self::SendBw => "ib_send_bw",
            Self::SendLat => "ib_send_lat",
        }
    }
}

// ---------------------------------------------------------------------------
// Messages of the comm connection.

/// The 16-byte version message: the version string, NUL padded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VersionMsg(pub [u8; Self::LEN]);

impl VersionMsg {
    /// Encoded length (`sizeof(user_param->rem_version)`).
    pub const LEN: usize = 16;

    /// Encode `version` (cut to 15 bytes, NUL padded).
    pub fn new(version: &str) -> Self {
        let mut b = [0u8; Self::LEN];
        let n = version.len().min(Self::LEN - 1);
        b[..n].copy_from_slice(&version.as_bytes()[..n]);
        Self(b)
    }

    /// Decode (exactly 16 bytes).
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        exact::<{ Self::LEN }>(bytes).map(Self)
    }

    /// The text up to the first NUL.
    pub fn text(&self) -> &str {
        let end = self.0.iter().position(|&b| b == 0).unwrap_or(Self::LEN);
        core::str::from_utf8(&self.0[..end]).unwrap_or("")
    }

    /// The version as C's `atof` sees it (leading number; 0 if none).
    pub fn number(&self) -> f64 {
        let t = self.text().trim_start();
        let end = t
            .char_indices()
            .find(|&(i, c)| !(c.is_ascii_digit() || (c == '.' && !t[..i].contains('.'))))
            .map_or(t.len(), |(i, _)| i);
        t[..end].parse().unwrap_or(0.0)
    }
}

/// A 4-byte big-endian integer (cycle buffer, cache line size).
pub fn encode_u32(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

/// Decode a 4-byte big-endian integer (exactly 4 bytes).
pub fn parse_u32(bytes: &[u8]) -> Result<u32> {
    exact::<4>(bytes).map(u32::from_be_bytes)
}

/// The 2-byte MTU message: the `ibv_mtu` enum value (1 = 256 … 5 = 4096)
/// printed with `%d`, then a NUL (`"3\0"` for 1024). perftest takes the
/// smaller of both sides'.
pub fn encode_mtu(mtu_enum: u8) -> [u8; 2] {
    [b'0' + mtu_enum.min(9), 0]
}

/// Decode the MTU message (exactly 2 bytes; `strtol` of the text).
pub fn parse_mtu(bytes: &[u8]) -> Result<u8> {
    let [d, _] = exact::<2>(bytes)?;
    if d.is_ascii_digit() {
        Ok(d - b'0')
    } else {
        Err(Error::Malformed)
    }
}

/// `struct pingpong_dest`, 56 bytes; every field big endian.
///
/// ```text
///  0 lid  4 out_reads  8 qpn  12 psn  16 rkey  20 (4 bytes padding,
///  uninitialised stack garbage on the wire)  24 vaddr u64  32 gid[16]
///  48 srqn  52 gid_index
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PingpongDest {
    /// LID (0 on iWARP).
    pub lid: u32,
    /// The sender's `out_reads` (1 unless a read test).
    pub out_reads: u32,
    /// Queue pair number of the data QP.
    pub qpn: u32,
    /// Random 24-bit PSN (meaningless on iWARP; printed).
    pub psn: u32,
    /// STag of the buffer the peer may access (send_bw: of the credit
    /// buffer).
    pub rkey: u32,
    /// Address of that buffer (see the measurement notes per test).
    pub vaddr: u64,
    /// GID: on siw the MAC address followed by 10 zero bytes.
    pub gid: [u8; 16],
    /// SRQ number (0).
    pub srqn: u32,
    /// GID index (0).
    pub gid_index: u32,
}

impl PingpongDest {
    /// Encoded length.
    pub const LEN: usize = 56;

    /// Decode (exactly 56 bytes; the padding is ignored).
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let b = exact::<{ Self::LEN }>(bytes)?;
        let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&b[24..32]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        Ok(Self {
            lid: u32_at(0),
            out_reads: u32_at(4),
            qpn: u32_at(8),
            psn: u32_at(12),
            rkey: u32_at(16),
            vaddr: u64::from_be_bytes(vaddr),
            gid,
            srqn: u32_at(48),
            gid_index: u32_at(52),
        })
    }

    /// Encode (padding bytes zero).
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        for (o, v) in [
            (0, self.lid),
            (4, self.out_reads),
            (8, self.qpn),
            (12, self.psn),
            (16, self.rkey),
            (48, self.srqn),
            (52, self.gid_index),
        ] {
            b[o..o + 4].copy_from_slice(&v.to_be_bytes());
        }
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid);
        b
    }

    /// The GID siw uses for a MAC address.
    pub fn gid_from_mac(mac: [u8; 6]) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[..6].copy_from_slice(&mac);
        g
    }
}

/// The bandwidth report the client sends after write_bw / read_bw (not
/// send_bw, where each side measures and prints its own): five exchanges
/// of 8 bytes each, in this order, all big endian: `size` (u64), `iters`
/// (u64; 4 bytes if the peer's version < 5.33), `bw_peak`, `bw_avg`,
/// `msg_rate` (IEEE doubles). The bandwidths are in the printed unit
/// (MB/s = 2^20 B/s, or Gb/s = 10^9 bit/s with `--report_gbits`), the
/// rate in Mpps. The server prints the client's numbers; what the server
/// sends back is its own never-filled report (stack garbage) and is
/// ignored by the client.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BwReport {
    /// Message size in bytes.
    pub size: u64,
    /// Iterations (messages) measured.
    pub iters: u64,
    /// Peak bandwidth, in the printed [`BwUnit`].
    pub bw_peak: f64,
    /// Average bandwidth, in the printed [`BwUnit`].
    pub bw_avg: f64,
    /// Average message rate in Mpps.
    pub msg_rate: f64,
}

impl BwReport {
    /// Number of 8-byte exchanges that carry the report.
    pub const FIELDS: usize = 5;
    /// Size in bytes of each exchanged message.
    pub const FIELD_LEN: usize = 8;

    /// The five 8-byte messages, in order.
    pub fn to_messages(&self) -> [[u8; 8]; Self::FIELDS] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// perftest's bidirectional row: this side's size and iterations,
    /// the sums of both sides' peak, average and message rate.
    pub fn bidirectional(&self, remote: &Self) -> Self {
        Self {
            size: self.size,
            iters: self.iters,
            bw_peak: self.bw_peak + remote.bw_peak,
            bw_avg: self.bw_avg + remote.bw_avg,
            msg_rate: self.msg_rate + remote.msg_rate,
        }
    }

    /// Rebuild from the five received messages.
    pub fn from_messages(m: [&[u8]; Self::FIELDS]) -> Result<Self> {
        let f = |i: usize| exact::<8>(m[i]).map(u64::from_be_bytes);
        Ok(Self {
            size: f(0)?,
            iters: f(1)?,
            bw_peak: f64::from_bits(f(2)?),
            bw_avg: f64::from_bits(f(3)?),
            msg_rate: f64::from_bits(f(4)?),
        })
    }
}

/// The send_bw credit: a 4-byte RDMA Write from the server into the
/// client's credit buffer (`rkey`/`vaddr` of the client's
/// [`PingpongDest`]) holding the cumulative number of receives completed,
/// in the server's host order (little endian on x86).
pub fn encode_credit(received: u32) -> [u8; 4] {
    received.to_le_bytes()
}

/// Decode a credit word.
pub fn parse_credit(bytes: &[u8]) -> Result<u32> {
    exact::<4>(bytes).map(u32::from_le_bytes)
}

fn exact<const N: usize>(bytes: &[u8]) -> Result<[u8; N]> {
    bytes.try_into().map_err(|_| {
        if bytes.len() < N {
            Error::Truncated
        } else {
            Error::Malformed
        }
    })
}

// ---------------------------------------------------------------------------
// Order of exchanges.

/// One step of the comm-connection script. Each message step is a pair:
/// the client Sends, then the server Sends the same kind back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exchange {
    /// [`VersionMsg`] (16 B).
    Version,
    /// Cycle buffer, [`encode_u32`] (4 B; only if the peer's version ≥
    /// 5.32, always the case here).
    CycleBuffer,
    /// Cache line size, [`encode_u32`] (4 B).
    CacheLine,
    /// MTU, [`encode_mtu`] (2 B).
    Mtu,
    /// A 56-byte all-zero [`PingpongDest`] (the handshake before the QPs
    /// exist).
    Sync,
    /// Not a message: the client opens the data connection(s) now; the
    /// server listens (before answering the preceding `Sync`) and accepts
    /// them.
    ConnectData,
    /// The [`PingpongDest`] of data QP `qp` (index, 0-based).
    Dest {
        /// QP index.
        qp: u32,
    },
    /// Not a message: the measurement phase on the data connections.
    Measure,
    /// One of the five [`BwReport`] fields (8 B), index 0..5.
    Report {
        /// Field index.
        field: u8,
    },
}

/// The complete ordered comm-connection script of `test` with
/// `num_qps` data QPs (latency tests use 1). Identical for client and
/// server; in every message step the client sends first.
///
/// Observed (siw ↔ siw): bw tests exchange the dests of all QPs twice plus
/// QP 0 once more before measuring, send_bw one more (the server has
/// posted its receives by then), the latency tests four times. After
/// write_bw/read_bw: Dest 0, the [`BwReport`], Dest 0 (close). send_bw
/// (each side prints its own numbers, no report) and send_lat end with one
/// Dest 0; write_lat with none. ib_read_lat is not in the capture; it is
/// assumed to end like send_lat (open question).
pub fn script(test: Test, num_qps: u32) -> Vec<Exchange> {
    use Exchange::*;
    let q = if test.is_bw() { num_qps.max(1) } else { 1 };
    let mut v = vec![
        Version,
        CycleBuffer,
        CacheLine,
        Mtu,
        Sync,
        ConnectData,
        Sync,
    ];
    if test.is_bw() {
        v.extend((0..q).map(|qp| Dest { qp }));
        v.extend((0..q).map(|qp| Dest { qp }));
        v.push(Dest { qp: 0 });
        if test == Test::SendBw {
            v.push(Dest { qp: 0 });
        }
    } else {
        v.extend([Dest { qp: 0 }; 4]);
    }
    v.push(Measure);
    match test {
        Test::WriteBw | Test::ReadBw => {
            v.push(Dest { qp: 0 });
            v.extend((0..BwReport::FIELDS as u8).map(|field| Report { field }));
            v.push(Dest { qp: 0 });
        }
        Test::SendBw | Test::SendLat | Test::ReadLat => v.push(Dest { qp: 0 }),
        Test::WriteLat => {}
    }
    v
}

/// [`script`] with perftest's `-b` (bidirectional) and `-D` (duration)
/// for one message size. `-D` alone changes nothing on the comm
/// connection (each side ends the measurement by its own clock).
/// Bidirectional write_bw / read_bw: one more Dest 0 right before the
/// measurement (both sides start sending after it), then both sides send
/// their [`BwReport`] (no Dest before it) and the closing Dest 0.
/// Bidirectional send_bw: the plain order plus the report exchange after
/// the measurement, except with `-D`, where each side prints its own
/// numbers and there is no report. Latency tests have no `-b`.
pub fn script_with(test: Test, num_qps: u32, bidirectional: bool, duration: bool) -> Vec<Exchange> {
    use Exchange::*;
    let mut v = script(test, num_qps);
    if !(bidirectional && test.is_bw()) {
        return v;
    }
    let m = v.iter().position(|s| *s == Measure).unwrap_or(v.len());
    v.truncate(m);
    if test != Test::SendBw {
        v.push(Dest { qp: 0 });
    }
    v.push(Measure);
    if !(test == Test::SendBw && duration) {
        v.extend((0..BwReport::FIELDS as u8).map(|field| Report { field }));
    }
    v.push(Dest { qp: 0 });
    v
}

/// Length of the message of an exchange step (`None` for the non-message
/// steps).
pub fn message_len(step: Exchange) -> Option<usize> {
    match step {
        Exchange::Version => Some(VersionMsg::LEN),
        Exchange::CycleBuffer | Exchange::CacheLine => Some(4),
        Exchange::Mtu => Some(2),
        Exchange::Sync | Exchange::Dest { .. } => Some(PingpongDest::LEN),
        Exchange::Report { .. } => Some(BwReport::FIELD_LEN),
        Exchange::ConnectData | Exchange::Measure => None,
    }
}

/// Address of the region a side advertises in its [`PingpongDest`] for
/// QP `qp`: perftest allocates one buffer of `2 * num_qps * slot` bytes
/// (`slot` = [`buff_size`]) per context, sends from the first half and
/// advertises `buf + (num_qps + qp) * slot` (the second half). send_bw
/// advertises its credit buffer instead.
pub fn buff_size(size: u64, cycle_buffer: u64) -> u64 {
    size.max(cycle_buffer)
}

/// The remote-address step of bw tests: with `size <= cycle_buffer / 2`,
/// each RDMA Write/Read goes to the next `inc` bytes of the peer's region,
/// wrapping within `cycle_buffer` (e.g. 1 KiB writes: +0, +0x400, +0x800,
/// +0xc00, +0, …); otherwise always offset 0.
pub fn addr_increment(size: u64, cache_line: u64) -> u64 {
    if cache_line == 0 {
        return size;
    }
    if size > cache_line {
        size.div_ceil(cache_line).saturating_mul(cache_line)
    } else {
        cache_line
    }
}

/// Offset (from the advertised vaddr) of the `n`th bw operation.
pub fn bw_remote_offset(n: u64, size: u64, cycle_buffer: u64, cache_line: u64) -> u64 {
    if size > cycle_buffer / 2 {
        return 0;
    }
    let inc = addr_increment(size, cache_line);
    n.saturating_mul(inc) % cycle_buffer.max(1)
}

/// The value in the last byte of the `n`th (1-based) write_lat message:
/// `(char)n`. Each side busy-polls the last byte of its receive region
/// until it equals the next expected count. The **server** writes first
/// (observed), then each side answers the peer's write `k` with its own
/// write `k`; the other `size - 1` bytes stay zero.
pub fn write_lat_marker(n: u64) -> u8 {
    (n & 0xff) as u8
}

// ---------------------------------------------------------------------------
// Printed text.

/// The separator line (87 dashes).
pub const RESULT_LINE: &str =
    "---------------------------------------------------------------------------------------";

/// Unit of the bandwidth columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BwUnit {
    /// MB/sec (2^20 bytes per second), the default.
    MBps,
    /// Gb/sec (10^9 bits per second), `--report_gbits`.
    Gbps,
}

impl BwUnit {
    /// Convert bytes per second to this unit.
    pub fn from_bytes_per_sec(self, bps: f64) -> f64 {
        match self {
            Self::MBps => bps / f64::from(1u32 << 20),
            Self::Gbps => bps * 8.0 / 1e9,
        }
    }
}

/// Column header of bw tests.
pub fn bw_header(unit: BwUnit) -> &'static str {
    match unit {
        BwUnit::MBps => {
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
        }
        BwUnit::Gbps => {
            " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
        }
    }
}

/// One result row of a bw test (write/read_bw: both sides print the
/// client's numbers; send_bw: each side its own).
pub fn bw_row(r: &BwReport) -> String {
    format!(
        " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
        r.size, r.iters, r.bw_peak, r.bw_avg, r.msg_rate
    )
}

/// Column header of latency tests (note the trailing space).
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// Latency statistics in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatStats {
    /// Message size in bytes.
    pub size: u64,
    /// Iterations (messages) measured.
    pub iters: u64,
    /// Smallest latency, µs.
    pub min: f64,
    /// Largest latency, µs.
    pub max: f64,
    /// Median latency (perftest's "typical"), µs.
    pub typical: f64,
    /// Mean latency, µs.
    pub avg: f64,
    /// Standard deviation of the latencies, µs.
    pub stdev: f64,
    /// 99th percentile latency, µs.
    pub p99: f64,
    /// 99.9th percentile latency, µs.
    pub p999: f64,
}

/// One result row of a latency test (each side prints its own numbers).
pub fn lat_row(s: &LatStats) -> String {
    format!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        s.size, s.iters, s.min, s.max, s.typical, s.avg, s.stdev, s.p99, s.p999
    )
}

/// Column header of latency tests with `-D` (duration).
pub const LAT_DUR_HEADER: &str = " #bytes        #iterations       t_avg[usec]    tps average";

/// Result of a latency test with `-D`: the operations completed in the
/// sampled part of the run (the duration less the margin at both ends).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatDurStats {
    /// Message size.
    pub size: u64,
    /// Operations completed while sampling.
    pub iters: u64,
    /// Sample time per operation in microseconds, divided by the
    /// round-trip factor (2 for write/send latency, 1 for read).
    pub t_avg: f64,
    /// Operations per second.
    pub tps: f64,
}

/// One result row of a latency test with `-D`.
pub fn lat_dur_row(s: &LatDurStats) -> String {
    format!(
        " {:<7}       {}            {:<7.2}        {:<7.2}",
        s.size, s.iters, s.t_avg, s.tps
    )
}

/// Whether the printing side is the client or the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The side that connects (`ib_*_bw <server>`).
    Client,
    /// The side that listens (`ib_*_bw` without a server name).
    Server,
}

/// The test-information block perftest prints before the address lines,
/// as observed on siw with `-R` (server: preceded by the "Waiting for
/// client to connect" box; client: with a `TX depth` line).
pub fn info_block(test: Test, side: Side, num_qps: u32, tx_depth: u32, out_reads: u32) -> String {
    info_block_with(
        test,
        side,
        &InfoOpts {
            num_qps,
            tx_depth,
            out_reads,
            bidirectional: false,
            rx_depth: 0,
        },
    )
}

/// The options [`info_block_with`] prints beyond the test and the side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InfoOpts {
    /// Number of data QPs.
    pub num_qps: u32,
    /// Send queue depth.
    pub tx_depth: u32,
    /// Outstanding RDMA Reads (read tests).
    pub out_reads: u32,
    /// `-b`: the title says `Bidirectional`, both sides print `TX depth`
    /// and send_bw prints `RX depth` (perftest prints them for a side
    /// that sends, and receives, in the test).
    pub bidirectional: bool,
    /// Receive depth, printed by a bidirectional send_bw.
    pub rx_depth: u32,
}

/// [`info_block`] with every option (`-b`).
pub fn info_block_with(test: Test, side: Side, o: &InfoOpts) -> String {
    let InfoOpts {
        num_qps,
        tx_depth,
        out_reads,
        bidirectional,
        rx_depth,
    } = *o;
    let mut s = String::new();
    if side == Side::Server {
        s.push_str("\n************************************\n");
        s.push_str("* Waiting for client to connect... *\n");
        s.push_str("************************************\n");
    }
    let _ = writeln!(s, "{RESULT_LINE}");
    if bidirectional && test.is_bw() {
        let _ = writeln!(s, "                    {}", test.title_bidirectional());
    } else {
        let _ = writeln!(s, "                    {}", test.title());
    }
    let _ = writeln!(s, " Dual-port       : OFF\t\tDevice         : siw0");
    let _ = writeln!(s, " Number of qps   : {num_qps}\t\tTransport type : IW");
    let _ = writeln!(s, " Connection type : RC\t\tUsing SRQ      : OFF");
    let relax = if test == Test::WriteLat { "OFF" } else { "ON" };
    let _ = writeln!(s, " PCIe relax order: {relax}");
    let _ = writeln!(s, " ibv_wr* API     : OFF");
    if side == Side::Client || bidirectional {
        let _ = writeln!(s, " TX depth        : {tx_depth}");
    }
    if bidirectional && test == Test::SendBw {
        let _ = writeln!(s, " RX depth        : {rx_depth}");
    }
    if test.is_bw() {
        let _ = writeln!(s, " CQ Moderation   : {DEFAULT_CQ_MOD}");
    }
    let _ = writeln!(s, " Mtu             : 1024[B]");
    let _ = writeln!(s, " Link type       : Ethernet");
    let _ = writeln!(s, " GID index       : 0");
    if test.verb() == Verb::Read {
        let _ = writeln!(s, " Outstand reads  : {out_reads}");
    } else {
        let _ = writeln!(s, " Max inline data : 0[B]");
    }
    let _ = writeln!(s, " rdma_cm QPs\t : ON");
    let _ = writeln!(s, " Data ex. method : rdma_cm");
    let _ = writeln!(s, "{RESULT_LINE}");
    if side == Side::Server {
        let _ = writeln!(s, " Waiting for client rdma_cm QP to connect");
        let _ = writeln!(
            s,
            " Please run the same command with the IB/RoCE interface IP"
        );
        let _ = writeln!(s, "{RESULT_LINE}");
    }
    s
}

/// The two lines printed per QP for `local` or `remote` addresses
/// (`" %s address: LID %#04x QPN %#06x PSN %#06x"` and the GID with
/// `%02d`, i.e. *decimal* bytes).
pub fn address_lines(local: bool, d: &PingpongDest) -> String {
    let mut s = format!(
        " {} address: LID {} QPN {} PSN {}\n GID: ",
        if local { "local" } else { "remote" },
        c_alt_hex(d.lid, 4),
        c_alt_hex(d.qpn, 6),
        c_alt_hex(d.psn, 6),
    );
    let parts: Vec<String> = d.gid.iter().map(|b| format!("{b:02}")).collect();
    s.push_str(&parts.join(":"));
    s.push('\n');
    s
}

/// C's `%#0Nx`: `0x` + zero-padded hex to a total width of `width`, but
/// zero prints as plain zero padding (no `0x`).
fn c_alt_hex(v: u32, width: usize) -> String {
    if v == 0 {
        format!("{:0width$}", 0)
    } else {
        format!("{v:#0width$x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iwarp::wire::ddp;

    /// Comm-connection Sends of `siw-ib_write_bw.pcapng` (client port
    /// 59625, server 18515), as full TCP payloads (one FPDU each).
    const VERSION_C: &str =
        "0022414300000000000000000000000100000000362e303600000000000000000000000000000000";
    const CYCLE: &str = "00164143000000000000000000000002000000000000100000000000";
    const CACHE: &str = "00164143000000000000000000000003000000000000004000000000";
    /// Note the two pad bytes `00 40`: siw does not zero MPA padding.
    const MTU: &str = "00144143000000000000000000000004000000003300004000000000";
    const SYNC: &str = "004a414300000000000000000000000500000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000";
    /// Frames 40 (client) and 41 (server): the per-QP dest.
    const DEST_C: &str = "004a4143000000000000000000000007000000000000000000000001000000020041d484950245000e7f00000000561ba040900052540012000c00000000000000000000000000000000000000000000";
    const DEST_S: &str = "004a41430000000000000000000000070000000000000000000000010000000200f9ee23183aa8000e7f0000000055dc0b13900052540012000b00000000000000000000000000000000000000000000";
    /// Frame 46: the first RDMA Write of the data connection (truncated
    /// after the header).
    const WRITE0: &str = "040ec140183aa800000055dc0b139000";
    /// Frames 201, 203, 205, 207, 209: the client's report.
    const REPORT: [&str; 5] = [
        "001a414300000000000000000000000b00000000000000000000040000000000",
        "001a414300000000000000000000000c00000000000000000000006400000000",
        "001a414300000000000000000000000d000000003fa499ecfac2914f00000000",
        "001a414300000000000000000000000e000000003fa3cacd41782aea00000000",
        "001a414300000000000000000000000f000000003f73540c71ef59e900000000",
    ];

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The Send payload of a comm-connection FPDU, checking it is an
    /// untagged Send on queue 0 with the given MSN.
    fn send_payload(s: &str, msn: u32) -> Vec<u8> {
        let b = hex(s);
        let len = usize::from(u16::from_be_bytes([b[0], b[1]]));
        let p = ddp::Packet::new_checked(&b[2..2 + len]).unwrap();
        assert_eq!(p.opcode(), 3);
        assert!(!p.tagged() && p.last());
        assert_eq!((p.qn(), p.msn(), p.mo()), (0, msn, 0));
        p.payload().to_vec()
    }

    #[test]
    fn parameter_exchange_matches_capture() {
        let v = send_payload(VERSION_C, 1);
        let msg = VersionMsg::parse(&v).unwrap();
        assert_eq!(msg.text(), VERSION);
        assert_eq!(msg, VersionMsg::new(VERSION));
        assert!(msg.number() >= MIN_PEER_VERSION);
        assert_eq!(msg.number(), 6.06);

        let c = send_payload(CYCLE, 2);
        assert_eq!(parse_u32(&c), Ok(CYCLE_BUFFER));
        assert_eq!(encode_u32(CYCLE_BUFFER).as_slice(), c.as_slice());
        let l = send_payload(CACHE, 3);
        assert_eq!(parse_u32(&l), Ok(CACHE_LINE));
        let m = send_payload(MTU, 4);
        assert_eq!(parse_mtu(&m), Ok(SIW_MTU_ENUM));
        assert_eq!(encode_mtu(SIW_MTU_ENUM).as_slice(), m.as_slice());

        let z = send_payload(SYNC, 5);
        assert_eq!(PingpongDest::parse(&z), Ok(PingpongDest::default()));
        assert_eq!(PingpongDest::default().to_bytes().as_slice(), z.as_slice());
    }

    #[test]
    fn dest_matches_capture() {
        let c = PingpongDest::parse(&send_payload(DEST_C, 7)).unwrap();
        let mac = [0x52, 0x54, 0x00, 0x12, 0x00, 0x0c];
        assert_eq!(
            c,
            PingpongDest {
                lid: 0,
                out_reads: 1,
                qpn: 2,
                psn: 0x41d484,
                rkey: 0x9502_4500,
                vaddr: 0x0000_561b_a040_9000,
                gid: PingpongDest::gid_from_mac(mac),
                srqn: 0,
                gid_index: 0,
            }
        );
        // Encoding differs only in the 4 padding bytes (garbage on the wire).
        let mut wire = send_payload(DEST_C, 7);
        wire[20..24].fill(0);
        assert_eq!(c.to_bytes().as_slice(), wire.as_slice());

        // The client's first RDMA Write targets the server's advertised
        // region, offset 0.
        let s = PingpongDest::parse(&send_payload(DEST_S, 7)).unwrap();
        let w = hex(WRITE0);
        let p = ddp::Packet::new_checked(&w[2..]).unwrap();
        assert!(p.tagged());
        assert_eq!(p.opcode(), 0);
        assert_eq!((p.stag(), p.to()), (s.rkey, s.vaddr));
        assert_eq!(bw_remote_offset(1, 1024, 4096, 64), 0x400);
        assert_eq!(bw_remote_offset(4, 1024, 4096, 64), 0);
        assert_eq!(bw_remote_offset(3, 4096, 4096, 64), 0);
        assert_eq!(
            address_lines(true, &c).lines().next(),
            Some(" local address: LID 0000 QPN 0x0002 PSN 0x41d484")
        );
        assert_eq!(
            address_lines(false, &s).lines().nth(1),
            Some(" GID: 82:84:00:18:00:11:00:00:00:00:00:00:00:00:00:00")
        );
    }

    #[test]
    fn report_matches_capture() {
        let msgs: Vec<Vec<u8>> = REPORT
            .iter()
            .enumerate()
            .map(|(i, s)| send_payload(s, 11 + i as u32))
            .collect();
        let r =
            BwReport::from_messages([&msgs[0], &msgs[1], &msgs[2], &msgs[3], &msgs[4]]).unwrap();
        assert_eq!((r.size, r.iters), (1024, 100));
        assert!((r.bw_peak - 0.0402).abs() < 1e-4);
        for (m, w) in r.to_messages().iter().zip(&msgs) {
            assert_eq!(m.as_slice(), w.as_slice());
        }
        assert_eq!(
            BwReport::from_messages([&[0; 7], &[0; 8], &[0; 8], &[0; 8], &[0; 8]]),
            Err(Error::Truncated)
        );
    }

    #[test]
    fn script_shapes() {
        // The comm-connection message sizes of write_bw -q 1, as captured.
        let sizes: Vec<usize> = script(Test::WriteBw, 1)
            .into_iter()
            .filter_map(message_len)
            .collect();
        assert_eq!(
            sizes,
            [16, 4, 4, 2, 56, 56, 56, 56, 56, 56, 8, 8, 8, 8, 8, 56]
        );
        // -q 4: 2q+1 dests before measuring.
        let pre = script(Test::WriteBw, 4)
            .into_iter()
            .take_while(|s| *s != Exchange::Measure)
            .filter(|s| matches!(s, Exchange::Dest { .. }))
            .count();
        assert_eq!(pre, 9);
        assert_eq!(
            script(Test::SendBw, 1)
                .iter()
                .filter_map(|s| message_len(*s))
                .count(),
            11
        );
        assert_eq!(script(Test::WriteLat, 1).last(), Some(&Exchange::Measure));
        assert_eq!(
            script(Test::SendLat, 1)
                .iter()
                .filter_map(|s| message_len(*s))
                .count(),
            11
        );
        assert_eq!(Test::ReadBw.data_ird_ord(128), (128, 128));
        assert_eq!(Test::SendBw.data_ird_ord(128), (0, 0));
    }

    /// Comm-connection message sizes (one per client→server / server→client
    /// pair) seen in a `siw-vm-selftest --full --capture` run (siw ↔ siw,
    /// `-R -s 4096|64 -n 200`); ib_read_lat is missing from that run.
    #[test]
    fn script_matches_selftest_capture() {
        const PRE: [usize; 6] = [16, 4, 4, 2, 56, 56];
        let observed: [(Test, u32, &[usize]); 6] = [
            (Test::WriteBw, 1, &[56, 56, 56, 56, 8, 8, 8, 8, 8, 56]),
            (Test::ReadBw, 1, &[56, 56, 56, 56, 8, 8, 8, 8, 8, 56]),
            (Test::SendBw, 1, &[56, 56, 56, 56, 56]),
            (Test::WriteLat, 1, &[56, 56, 56, 56]),
            (Test::SendLat, 1, &[56, 56, 56, 56, 56]),
            (
                Test::WriteBw,
                4,
                &[56, 56, 56, 56, 56, 56, 56, 56, 56, 56, 8, 8, 8, 8, 8, 56],
            ),
        ];
        for (test, q, rest) in observed {
            let want: Vec<usize> = PRE.iter().chain(rest).copied().collect();
            let got: Vec<usize> = script(test, q)
                .into_iter()
                .filter_map(message_len)
                .collect();
            assert_eq!(got, want, "{test:?} -q {q}");
        }
    }

    #[test]
    fn printed_rows_match_console() {
        let r = BwReport {
            size: 4096,
            iters: 200,
            bw_peak: 4.21,
            bw_avg: 4.01,
            msg_rate: 0.001027,
        };
        assert_eq!(
            bw_row(&r),
            " 4096       200              4.21               4.01   \t\t   0.001027"
        );
        let s = LatStats {
            size: 64,
            iters: 200,
            min: 248.25,
            max: 2482.59,
            typical: 429.62,
            avg: 519.95,
            stdev: 287.27,
            p99: 2310.23,
            p999: 2482.59,
        };
        assert_eq!(lat_row(&s), " 64      200          248.25         2482.59      429.62   \t       519.95      \t287.27 \t\t2310.23 \t\t2482.59");
        let s2 = LatStats {
            max: 27947.45,
            typical: 1711.46,
            avg: 2438.13,
            stdev: 1855.68,
            p99: 9977.41,
            p999: 27947.45,
            min: 352.46,
            ..s
        };
        assert_eq!(lat_row(&s2), " 64      200          352.46         27947.45      1711.46  \t       2438.13     \t1855.68\t\t9977.41 \t\t27947.45");
        assert_eq!(RESULT_LINE.len(), 87);
        let info = info_block(Test::WriteBw, Side::Client, 1, 128, 1);
        assert!(info.contains("\n TX depth        : 128\n CQ Moderation   : 100\n"));
        assert!(info_block(Test::ReadBw, Side::Server, 1, 128, 128)
            .contains(" Outstand reads  : 128\n"));
    }

    #[test]
    fn bidirectional_scripts() {
        let len = |t, b, d| {
            script_with(t, 1, b, d)
                .into_iter()
                .filter_map(message_len)
                .collect::<Vec<_>>()
        };
        // write_bw -b: the pre-measure sync Dest, no Dest before the report.
        assert_eq!(
            len(Test::WriteBw, true, false),
            [16, 4, 4, 2, 56, 56, 56, 56, 56, 56, 8, 8, 8, 8, 8, 56]
        );
        assert_eq!(
            script_with(Test::WriteBw, 1, true, false)[10..12],
            [Exchange::Dest { qp: 0 }, Exchange::Measure]
        );
        assert_eq!(
            len(Test::ReadBw, true, true),
            len(Test::WriteBw, true, false)
        );
        assert_eq!(
            len(Test::SendBw, true, false),
            [16, 4, 4, 2, 56, 56, 56, 56, 56, 56, 8, 8, 8, 8, 8, 56]
        );
        assert_eq!(
            len(Test::SendBw, true, true),
            len(Test::SendBw, false, false)
        );
        for t in Test::ALL {
            assert_eq!(script_with(t, 2, false, true), script(t, 2));
        }
        assert_eq!(
            script_with(Test::SendLat, 1, true, false),
            script(Test::SendLat, 1)
        );
        let info = info_block_with(
            Test::SendBw,
            Side::Server,
            &InfoOpts {
                num_qps: 1,
                tx_depth: 128,
                out_reads: 1,
                bidirectional: true,
                rx_depth: 512,
            },
        );
        assert!(info.contains("                    Send Bidirectional BW Test\n"));
        assert!(info.contains(" TX depth        : 128\n RX depth        : 512\n"));
        let me = BwReport {
            size: 4096,
            iters: 100,
            bw_peak: 1.0,
            bw_avg: 0.5,
            msg_rate: 0.25,
        };
        let peer = BwReport { iters: 90, ..me };
        let both = me.bidirectional(&peer);
        assert_eq!((both.size, both.iters), (4096, 100));
        assert_eq!((both.bw_peak, both.bw_avg, both.msg_rate), (2.0, 1.0, 0.5));
        let d = LatDurStats {
            size: 2,
            iters: 12345,
            t_avg: 40.51,
            tps: 12345.0,
        };
        assert_eq!(
            lat_dur_row(&d),
            " 2             12345            40.51          12345.00"
        );
    }

    #[test]
    fn credits_and_markers() {
        // send_bw: server's 4-byte Write `42 00 00 00` = 66 receives.
        assert_eq!(parse_credit(&[0x42, 0, 0, 0]), Ok(66));
        assert_eq!(encode_credit(200), [0xc8, 0, 0, 0]);
        assert_eq!(write_lat_marker(200), 0xc8);
        assert_eq!(write_lat_marker(256), 0);
        assert_eq!(parse_mtu(b"x\0"), Err(Error::Malformed));
        assert_eq!(VersionMsg::new("5.70abc").number(), 5.70);
        assert_eq!(VersionMsg::new("").number(), 0.0);
    }
}
