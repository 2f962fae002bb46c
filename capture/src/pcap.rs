//! Classic pcap files (`LINKTYPE_ETHERNET`).
//!
//! [`PcapWriter`] writes the frames it is handed, each with the timestamp
//! it is given: the AF_XDP engine records every frame it receives or sends
//! with it (`--xdp-pcap`).
//!
//! [`TcpCapture`] turns the two byte streams of one TCP connection into a
//! pcap file that Wireshark/tshark dissects like a real capture: Ethernet
//! II, IPv4 (198.18.0.1 → 198.18.0.2) and TCP with correct checksums, a
//! three-way handshake, data segments of at most `mss` bytes whose
//! sequence and acknowledgement numbers follow both streams, and a FIN
//! exchange at the end. Timestamps are synthetic and strictly increasing;
//! nothing reads a clock. The tests use it to put the protocol core's
//! output in front of tshark ([`crate::tshark`]).
//!
//! ```no_run
//! use iwarp_capture::pcap::{Side, TcpCapture};
//! let file = std::fs::File::create("/tmp/x.pcap")?;
//! let mut cap = TcpCapture::new(file, 40000, 7174, 1460)?;
//! cap.send(Side::Client, b"hello")?;
//! cap.send(Side::Server, b"world")?;
//! cap.finish()?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io::{self, Write};

/// IPv4 address of the client (connection initiator).
pub const CLIENT_ADDR: [u8; 4] = [198, 18, 0, 1];
/// IPv4 address of the server (connection responder).
pub const SERVER_ADDR: [u8; 4] = [198, 18, 0, 2];
/// MAC address of the client.
pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// MAC address of the server.
pub const SERVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

const CLIENT_ISN: u32 = 0x1000_0000;
const SERVER_ISN: u32 = 0x2000_0000;
/// First timestamp: 2023-11-14T22:13:20Z, a fixed arbitrary instant.
const START_MICROS: u64 = 1_700_000_000 * 1_000_000;
/// Synthetic time between two consecutive frames.
const STEP_MICROS: u64 = 10;
/// The largest frame a reader is told to expect (the file header's
/// snapshot length); longer frames are written whole all the same.
pub const SNAPLEN: u32 = 262_144;
/// The link type of the file: Ethernet II frames.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Magic number of a classic pcap file with microsecond timestamps.
const MAGIC: u32 = 0xa1b2_c3d4;
const ETH_LEN: usize = 14;
const IP_LEN: usize = 20;
const TCP_LEN: usize = 20;
/// Largest payload that fits the 16-bit IPv4 total length.
const MAX_MSS: usize = 65_535 - IP_LEN - TCP_LEN;
/// The TCP window advertised by both sides.
const WINDOW: u16 = 65_535;

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;

/// Writer of a classic pcap file (microsecond timestamps, Ethernet link
/// type) of whole frames.
///
/// [`Self::new`] writes the file header, [`Self::record`] one frame.
/// Buffering is the caller's choice (wrap a file in a
/// [`std::io::BufWriter`]).
///
/// ```
/// use iwarp_capture::pcap::PcapWriter;
/// let mut w = PcapWriter::new(Vec::new())?;
/// w.record(1_500_000, &[0xa5; 60])?;
/// let bytes = w.into_inner()?;
/// assert_eq!(bytes.len(), 24 + 16 + 60);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
}

impl<W: Write> PcapWriter<W> {
    /// Start a file: writes the 24-byte pcap header (version 2.4, snapshot
    /// length [`SNAPLEN`], link type [`LINKTYPE_ETHERNET`]).
    pub fn new(mut out: W) -> io::Result<Self> {
        let mut header = [0u8; 24];
        header[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        header[4..6].copy_from_slice(&2u16.to_le_bytes());
        header[6..8].copy_from_slice(&4u16.to_le_bytes());
        // thiszone and sigfigs stay 0
        header[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        header[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&header)?;
        Ok(Self { out })
    }

    /// Append one whole frame (an Ethernet frame without its FCS), stamped
    /// `micros` microseconds after the Unix epoch (seconds past `u32::MAX`
    /// wrap).
    pub fn record(&mut self, micros: u64, frame: &[u8]) -> io::Result<()> {
        let secs = (micros / 1_000_000) as u32;
        let usecs = (micros % 1_000_000) as u32;
        let len = u32::try_from(frame.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame over 4 GiB"))?;
        let mut rec = [0u8; 16];
        rec[0..4].copy_from_slice(&secs.to_le_bytes());
        rec[4..8].copy_from_slice(&usecs.to_le_bytes());
        rec[8..12].copy_from_slice(&len.to_le_bytes());
        rec[12..16].copy_from_slice(&len.to_le_bytes());
        self.out.write_all(&rec)?;
        self.out.write_all(frame)
    }

    /// Flush the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Flush and return the underlying writer.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// One end of the captured connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The initiator: 198.18.0.1, `client_port`.
    Client,
    /// The responder: 198.18.0.2, `server_port`.
    Server,
}

#[derive(Clone, Copy, Debug)]
struct Endpoint {
    mac: [u8; 6],
    addr: [u8; 4],
    port: u16,
    /// Sequence number of the next byte this side sends.
    next_seq: u32,
    /// IPv4 identification of the next datagram.
    ip_id: u16,
}

/// Writer of a pcap file holding one synthetic TCP connection.
///
/// [`Self::new`] writes the file header and the handshake, [`Self::send`]
/// appends data segments, [`Self::finish`] closes the connection with FINs
/// and hands the writer back.
#[derive(Debug)]
pub struct TcpCapture<W: Write> {
    out: PcapWriter<W>,
    mss: usize,
    client: Endpoint,
    server: Endpoint,
    /// Number of frames written so far (drives the timestamps).
    frames: u32,
}

impl<W: Write> TcpCapture<W> {
    /// Start a capture: writes the pcap header and the SYN, SYN-ACK, ACK
    /// handshake. `mss` (1..=65495) bounds the payload of each data frame.
    pub fn new(out: W, client_port: u16, server_port: u16, mss: usize) -> io::Result<Self> {
        if mss == 0 || mss > MAX_MSS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("mss must be in 1..={MAX_MSS}, got {mss}"),
            ));
        }
        let mut cap = Self {
            out: PcapWriter::new(out)?,
            mss,
            client: Endpoint {
                mac: CLIENT_MAC,
                addr: CLIENT_ADDR,
                port: client_port,
                next_seq: CLIENT_ISN,
                ip_id: 1,
            },
            server: Endpoint {
                mac: SERVER_MAC,
                addr: SERVER_ADDR,
                port: server_port,
                next_seq: SERVER_ISN,
                ip_id: 1,
            },
            frames: 0,
        };
        cap.segment(Side::Client, SYN, &[])?;
        cap.segment(Side::Server, SYN | ACK, &[])?;
        cap.segment(Side::Client, ACK, &[])?;
        Ok(cap)
    }

    /// Append `bytes` to the stream sent by `from`, cut into frames of at
    /// most `mss` bytes. Each frame acknowledges everything the other side
    /// has sent so far. An empty `bytes` writes nothing.
    pub fn send(&mut self, from: Side, bytes: &[u8]) -> io::Result<()> {
        for chunk in bytes.chunks(self.mss) {
            self.segment(from, PSH | ACK, chunk)?;
        }
        Ok(())
    }

    /// Close the connection (client FIN, server FIN, client ACK), flush and
    /// return the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.segment(Side::Client, FIN | ACK, &[])?;
        self.segment(Side::Server, FIN | ACK, &[])?;
        self.segment(Side::Client, ACK, &[])?;
        self.out.into_inner()
    }

    /// Write one frame from `from` with `flags` and `payload`, and advance
    /// that side's sequence number by the sequence space it consumes.
    fn segment(&mut self, from: Side, flags: u8, payload: &[u8]) -> io::Result<()> {
        let (src, dst) = match from {
            Side::Client => (self.client, self.server),
            Side::Server => (self.server, self.client),
        };
        // Only the client's SYN carries no acknowledgement.
        let ack = if flags & ACK != 0 { dst.next_seq } else { 0 };
        let frame = build_frame(&src, &dst, ack, flags, payload);

        let micros = START_MICROS + u64::from(self.frames) * STEP_MICROS;
        self.out.record(micros, &frame)?;
        self.frames = self.frames.wrapping_add(1);

        let consumed = payload.len() as u32 + u32::from(flags & (SYN | FIN) != 0);
        let me = match from {
            Side::Client => &mut self.client,
            Side::Server => &mut self.server,
        };
        me.next_seq = me.next_seq.wrapping_add(consumed);
        me.ip_id = me.ip_id.wrapping_add(1);
        Ok(())
    }
}

/// Build one Ethernet/IPv4/TCP frame. A SYN carries an MSS option.
fn build_frame(src: &Endpoint, dst: &Endpoint, ack: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let options: &[u8] = if flags & SYN != 0 {
        // MSS option (kind 2, length 4); the value is informational only.
        &[2, 4, 0x05, 0xb4]
    } else {
        &[]
    };
    let tcp_len = TCP_LEN + options.len() + payload.len();
    let ip_total = IP_LEN + tcp_len;
    let mut f = Vec::with_capacity(ETH_LEN + ip_total);

    // Ethernet II
    f.extend_from_slice(&dst.mac);
    f.extend_from_slice(&src.mac);
    f.extend_from_slice(&0x0800u16.to_be_bytes());

    // IPv4
    let ip_start = f.len();
    f.push(0x45); // version 4, IHL 5
    f.push(0); // DSCP/ECN
    f.extend_from_slice(&(ip_total as u16).to_be_bytes());
    f.extend_from_slice(&src.ip_id.to_be_bytes());
    f.extend_from_slice(&0x4000u16.to_be_bytes()); // DF, offset 0
    f.push(64); // TTL
    f.push(6); // TCP
    f.extend_from_slice(&[0, 0]); // checksum, filled below
    f.extend_from_slice(&src.addr);
    f.extend_from_slice(&dst.addr);
    let ip_sum = checksum(0, &f[ip_start..]);
    f[ip_start + 10..ip_start + 12].copy_from_slice(&ip_sum.to_be_bytes());

    // TCP
    let tcp_start = f.len();
    f.extend_from_slice(&src.port.to_be_bytes());
    f.extend_from_slice(&dst.port.to_be_bytes());
    f.extend_from_slice(&src.next_seq.to_be_bytes());
    f.extend_from_slice(&ack.to_be_bytes());
    f.push((((TCP_LEN + options.len()) / 4) as u8) << 4);
    f.push(flags);
    f.extend_from_slice(&WINDOW.to_be_bytes());
    f.extend_from_slice(&[0, 0]); // checksum, filled below
    f.extend_from_slice(&[0, 0]); // urgent pointer
    f.extend_from_slice(options);
    f.extend_from_slice(payload);

    // Pseudo header: source, destination, zero, protocol, TCP length.
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&src.addr);
    pseudo[4..8].copy_from_slice(&dst.addr);
    pseudo[9] = 6;
    pseudo[10..12].copy_from_slice(&(tcp_len as u16).to_be_bytes());
    let partial = sum_words(0, &pseudo);
    let tcp_sum = checksum(partial, &f[tcp_start..]);
    f[tcp_start + 16..tcp_start + 18].copy_from_slice(&tcp_sum.to_be_bytes());
    f
}

/// Add `bytes` as big-endian 16-bit words (odd length padded with zero) to
/// a running 32-bit sum.
fn sum_words(mut sum: u32, bytes: &[u8]) -> u32 {
    let mut words = bytes.chunks_exact(2);
    for w in &mut words {
        sum = sum.wrapping_add(u32::from(u16::from_be_bytes([w[0], w[1]])));
        // Fold early so that the sum never overflows.
        sum = (sum & 0xffff) + (sum >> 16);
    }
    if let [last] = words.remainder() {
        sum = sum.wrapping_add(u32::from(*last) << 8);
    }
    sum
}

/// The Internet checksum (RFC 1071) of `bytes`, continuing `partial`.
fn checksum(partial: u32, bytes: &[u8]) -> u16 {
    let mut sum = sum_words(partial, bytes);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Split a pcap file into its frames, checking the file header.
    fn frames(pcap: &[u8]) -> Vec<&[u8]> {
        assert_eq!(&pcap[0..4], &0xa1b2_c3d4u32.to_le_bytes());
        assert_eq!(&pcap[20..24], &1u32.to_le_bytes());
        let mut out = Vec::new();
        let mut rest = &pcap[24..];
        let mut last_ts = 0u64;
        while !rest.is_empty() {
            let secs = u32::from_le_bytes(rest[0..4].try_into().unwrap());
            let usecs = u32::from_le_bytes(rest[4..8].try_into().unwrap());
            let ts = u64::from(secs) * 1_000_000 + u64::from(usecs);
            assert!(ts > last_ts, "timestamps increase");
            last_ts = ts;
            let incl = u32::from_le_bytes(rest[8..12].try_into().unwrap()) as usize;
            let orig = u32::from_le_bytes(rest[12..16].try_into().unwrap()) as usize;
            assert_eq!(incl, orig);
            out.push(&rest[16..16 + incl]);
            rest = &rest[16 + incl..];
        }
        out
    }

    struct Seg<'a> {
        src_port: u16,
        seq: u32,
        ack: u32,
        flags: u8,
        payload: &'a [u8],
    }

    /// Parse and verify one frame (both checksums must come out as zero).
    fn parse(frame: &[u8]) -> Seg<'_> {
        assert_eq!(&frame[12..14], &[0x08, 0x00]);
        let ip = &frame[ETH_LEN..];
        assert_eq!(ip[0], 0x45);
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        assert_eq!(total, ip.len());
        assert_eq!(checksum(0, &ip[..IP_LEN]), 0, "IPv4 header checksum");
        let tcp = &ip[IP_LEN..];
        let mut pseudo = [0u8; 12];
        pseudo[0..8].copy_from_slice(&ip[12..20]);
        pseudo[9] = 6;
        pseudo[10..12].copy_from_slice(&(tcp.len() as u16).to_be_bytes());
        assert_eq!(checksum(sum_words(0, &pseudo), tcp), 0, "TCP checksum");
        let doff = usize::from(tcp[12] >> 4) * 4;
        Seg {
            src_port: u16::from_be_bytes([tcp[0], tcp[1]]),
            seq: u32::from_be_bytes(tcp[4..8].try_into().unwrap()),
            ack: u32::from_be_bytes(tcp[8..12].try_into().unwrap()),
            flags: tcp[13],
            payload: &tcp[doff..],
        }
    }

    fn sample(mss: usize) -> Vec<u8> {
        let mut cap = TcpCapture::new(Vec::new(), 40000, 7174, mss).unwrap();
        cap.send(Side::Client, &[1u8; 25]).unwrap();
        cap.send(Side::Server, &[2u8; 7]).unwrap();
        cap.send(Side::Client, &[]).unwrap();
        cap.send(Side::Client, &[3u8; 3]).unwrap();
        cap.finish().unwrap()
    }

    #[test]
    fn checksum_rfc1071_example() {
        // RFC 1071 §3: the words 0001 f203 f4f5 f6f7 sum to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(checksum(0, &data), !0xddf2);
        // Odd length: the last byte is padded with zero.
        assert_eq!(checksum(0, &[0x12]), !0x1200);
    }

    #[test]
    fn writer_header_and_records() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        w.record(3_000_007, &[0xa5; 60]).unwrap();
        w.record(3_000_008, &[0x5a; 3]).unwrap();
        let b = w.into_inner().unwrap();
        assert_eq!(b.len(), 24 + 16 + 60 + 16 + 3);
        assert_eq!(b[..4], MAGIC.to_le_bytes());
        assert_eq!(b[4..8], [2, 0, 4, 0], "version 2.4");
        assert_eq!(b[8..16], [0; 8], "thiszone, sigfigs");
        assert_eq!(b[16..20], SNAPLEN.to_le_bytes());
        assert_eq!(b[20..24], 1u32.to_le_bytes(), "Ethernet link type");
        assert_eq!(b[24..28], 3u32.to_le_bytes());
        assert_eq!(b[28..32], 7u32.to_le_bytes());
        assert_eq!(b[32..36], 60u32.to_le_bytes());
        assert_eq!(b[36..40], 60u32.to_le_bytes());
        assert!(b[40..100].iter().all(|&x| x == 0xa5));
        assert_eq!(b[104..108], 8u32.to_le_bytes());
        assert_eq!(b[108..112], 3u32.to_le_bytes());
        assert_eq!(b[116..], [0x5a; 3]);
    }

    #[test]
    fn rejects_bad_mss() {
        assert!(TcpCapture::new(Vec::new(), 1, 2, 0).is_err());
        assert!(TcpCapture::new(Vec::new(), 1, 2, MAX_MSS + 1).is_err());
        assert!(TcpCapture::new(Vec::new(), 1, 2, MAX_MSS).is_ok());
    }

    #[test]
    fn handshake_segments_and_fin() {
        let pcap = sample(10);
        let segs: Vec<_> = frames(&pcap).into_iter().map(parse).collect();
        let c = CLIENT_ISN;
        let s = SERVER_ISN;
        let expect: &[(u16, u32, u32, u8, usize)] = &[
            (40000, c, 0, SYN, 0),
            (7174, s, c + 1, SYN | ACK, 0),
            (40000, c + 1, s + 1, ACK, 0),
            (40000, c + 1, s + 1, PSH | ACK, 10),
            (40000, c + 11, s + 1, PSH | ACK, 10),
            (40000, c + 21, s + 1, PSH | ACK, 5),
            (7174, s + 1, c + 26, PSH | ACK, 7),
            (40000, c + 26, s + 8, PSH | ACK, 3),
            (40000, c + 29, s + 8, FIN | ACK, 0),
            (7174, s + 8, c + 30, FIN | ACK, 0),
            (40000, c + 30, s + 9, ACK, 0),
        ];
        assert_eq!(segs.len(), expect.len());
        for (i, (seg, &(port, seq, ack, flags, len))) in segs.iter().zip(expect).enumerate() {
            assert_eq!(seg.src_port, port, "frame {i} port");
            assert_eq!(seg.seq, seq, "frame {i} seq");
            assert_eq!(seg.ack, ack, "frame {i} ack");
            assert_eq!(seg.flags, flags, "frame {i} flags");
            assert_eq!(seg.payload.len(), len, "frame {i} len");
        }
        assert!(segs[3].payload.iter().all(|&b| b == 1));
        assert!(segs[6].payload.iter().all(|&b| b == 2));
    }

    #[test]
    fn odd_payload_checksums() {
        // A single odd-length payload exercises the checksum padding.
        let pcap = sample(3);
        for frame in frames(&pcap) {
            parse(frame);
        }
    }

    #[test]
    fn tshark_accepts_capture() {
        if !crate::tshark::available() {
            eprintln!("note: tshark not on PATH, skipping the tshark check");
            return;
        }
        let path = std::env::temp_dir().join(format!(
            "iwarp-pcap-test-{}-accepts.pcap",
            std::process::id()
        ));
        std::fs::write(&path, sample(10)).unwrap();
        let out = std::process::Command::new("tshark")
            .arg("-r")
            .arg(&path)
            .args(["-n", "-o", "tcp.check_checksum:TRUE", "-o"])
            .args(["ip.check_checksum:TRUE", "-T", "fields", "-e", "tcp.len"])
            .args(["-z", "expert,note"])
            .output()
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let lens: Vec<&str> = text.lines().take(11).collect();
        assert_eq!(
            lens,
            ["0", "0", "0", "10", "10", "5", "7", "3", "0", "0", "0"]
        );
        // Only the expert header lines may mention these.
        let lower = text.to_lowercase();
        for bad in ["checksum", "malformed", "errors (", "warns ("] {
            assert!(!lower.contains(bad), "tshark reports {bad:?}:\n{text}");
        }
    }
}
