//! The probe's side of one raw iWARP connection: a plain `TcpStream`, the
//! core's MPA framer/deframer for well-formed FPDUs, and raw writes for
//! the broken ones.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Instant;

use iwarp::error::TermCode;
use iwarp::mpa::framing::{wire_len, RxDeframer, RxItem, TxFramer, MAX_ULPDU};
use iwarp::wire::ddp::{Buffer, HeaderRepr, DDP_VERSION};
use iwarp::wire::mpa::{FrameRepr, HEADER_LEN};
use iwarp::wire::rdmap::{Opcode, ReadRequest, RDMAP_VERSION};
use iwarp::wire::terminate::TerminateRepr;

use super::Reaction;

/// Why reading from the peer stopped.
fn io_reaction(e: &std::io::Error) -> Reaction {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => Reaction::Silence,
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => {
            Reaction::Reset
        }
        _ => Reaction::Garbled(format!("read error: {e}")),
    }
}

/// Read at least one byte into `buf` before `deadline`; the reaction if the
/// stream ended, failed or stayed silent.
fn read_some(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<usize, Reaction> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Reaction::Silence);
    }
    s.set_read_timeout(Some(left))
        .map_err(|e| Reaction::Garbled(format!("set_read_timeout: {e}")))?;
    match s.read(buf) {
        Ok(0) => Err(Reaction::Closed),
        Ok(n) => Ok(n),
        Err(e) if e.kind() == ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(io_reaction(&e)),
    }
}

/// Read one MPA request/reply frame (20 bytes + private data). Bytes after
/// it are returned as well (they are FPDUs).
pub fn read_mpa_frame(
    s: &mut TcpStream,
    deadline: Instant,
) -> Result<(Vec<u8>, Vec<u8>), Reaction> {
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        if got.len() >= HEADER_LEN {
            let total = FrameRepr::frame_len(&got).map_err(|_| {
                Reaction::Garbled(format!(
                    "not an MPA frame: {}",
                    hex(&got[..got.len().min(24)])
                ))
            })?;
            if got.len() >= total {
                let rest = got.split_off(total);
                return Ok((got, rest));
            }
        }
        let n = read_some(s, &mut buf, deadline)?;
        got.extend_from_slice(&buf[..n]);
    }
}

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One FPDU as received.
#[derive(Clone, Debug)]
pub struct Fpdu {
    /// The ULPDU (DDP segment).
    pub ulpdu: Vec<u8>,
    /// The CRC matched (always true without CRC).
    pub crc_ok: bool,
}

/// An established raw connection in full operation.
pub struct Wire {
    stream: TcpStream,
    tx: TxFramer,
    rx: RxDeframer,
    inbuf: Vec<u8>,
    /// Next MSN of our Sends (queue 0).
    pub send_msn: u32,
    /// Next MSN of our Read Requests (queue 1).
    pub rr_msn: u32,
    /// FPDUs skipped while waiting for a reaction.
    pub skipped: usize,
}

impl Wire {
    /// Wrap an established stream: `crc` negotiated, `markers_tx` we
    /// insert markers, `markers_rx` the peer does. `rest` are bytes already
    /// read after the MPA frame.
    pub fn new(
        stream: TcpStream,
        crc: bool,
        markers_tx: bool,
        markers_rx: bool,
        rest: Vec<u8>,
    ) -> Self {
        Self {
            stream,
            tx: TxFramer::new(crc, markers_tx),
            rx: RxDeframer::new(crc, markers_rx, MAX_ULPDU),
            inbuf: rest,
            send_msn: 1,
            rr_msn: 1,
            skipped: 0,
        }
    }

    /// Stream position of the next byte we send (markers counted).
    pub fn tx_position(&self) -> u64 {
        self.tx.position()
    }

    /// Frame `ulpdu` as one FPDU (advancing our stream position) without
    /// sending it.
    pub fn frame(&mut self, ulpdu: &[u8]) -> Vec<u8> {
        let len = ulpdu.len().min(MAX_ULPDU);
        let ulpdu = &ulpdu[..len];
        let mut out = vec![0u8; wire_len(len, self.tx.position(), true) + 16];
        // `len` fits: clipped to MAX_ULPDU above.
        self.tx.start(u16::try_from(len).unwrap_or(u16::MAX));
        let (mut r, mut w) = (0, 0);
        while r < len {
            let (a, b) = self.tx.put(&ulpdu[r..], &mut out[w..]);
            r += a;
            w += b;
        }
        loop {
            let (b, done) = self.tx.finish(&mut out[w..]);
            w += b;
            if done {
                break;
            }
        }
        out.truncate(w);
        out
    }

    /// Send raw bytes; a write error is the peer's reaction (reset).
    pub fn write_raw(&mut self, bytes: &[u8]) -> Result<(), Reaction> {
        self.stream.write_all(bytes).map_err(|e| io_reaction(&e))
    }

    /// Frame and send one ULPDU.
    pub fn send_ulpdu(&mut self, ulpdu: &[u8]) -> Result<(), Reaction> {
        let b = self.frame(ulpdu);
        self.write_raw(&b)
    }

    /// Half-close our direction (TCP FIN).
    pub fn shutdown_write(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }

    /// The next FPDU from the peer before `deadline`.
    pub fn next_fpdu(&mut self, deadline: Instant) -> Result<Fpdu, Reaction> {
        let mut cur: Option<Vec<u8>> = None;
        let mut buf = vec![0u8; 65536];
        loop {
            let mut pos = 0;
            let mut done = None;
            while pos < self.inbuf.len() && done.is_none() {
                let (n, item) = self
                    .rx
                    .next(&self.inbuf[pos..])
                    .map_err(|e| Reaction::Garbled(format!("peer's stream: {e}")))?;
                match item {
                    Some(RxItem::Start { ulpdu_len }) => {
                        cur = Some(Vec::with_capacity(usize::from(ulpdu_len)))
                    }
                    Some(RxItem::Data(d)) => {
                        if let Some(c) = cur.as_mut() {
                            c.extend_from_slice(d);
                        }
                    }
                    Some(RxItem::End { crc_ok }) => {
                        done = Some(Fpdu {
                            ulpdu: cur.take().unwrap_or_default(),
                            crc_ok,
                        });
                    }
                    None => {}
                }
                if n == 0 && done.is_none() {
                    break;
                }
                pos += n;
            }
            self.inbuf.drain(..pos.min(self.inbuf.len()));
            if let Some(f) = done {
                return Ok(f);
            }
            let n = read_some(&mut self.stream, &mut buf, deadline)?;
            self.inbuf.extend_from_slice(&buf[..n]);
        }
    }

    /// The next untagged Send from the peer (skipping other FPDUs): its
    /// payload.
    pub fn next_send(&mut self, deadline: Instant) -> Result<Vec<u8>, Reaction> {
        loop {
            let f = self.next_fpdu(deadline)?;
            let h = HeaderRepr::parse(&f.ulpdu)
                .map_err(|e| Reaction::Garbled(format!("peer's DDP header: {e}")))?;
            if h.opcode == Opcode::Terminate as u8 {
                return Err(terminate_reaction(&f.ulpdu, h.header_len()));
            }
            if Opcode::from_raw(h.opcode).is_some_and(Opcode::is_send) {
                return Ok(f.ulpdu.get(h.header_len()..).unwrap_or(&[]).to_vec());
            }
            self.skipped += 1;
        }
    }

    /// Wait for the peer's reaction: a Terminate (other FPDUs are skipped
    /// and counted), the end of the stream, or silence until `deadline`.
    pub fn wait_reaction(&mut self, deadline: Instant) -> Reaction {
        loop {
            let f = match self.next_fpdu(deadline) {
                Ok(f) => f,
                Err(r) => return r,
            };
            if !f.crc_ok {
                return Reaction::Garbled("peer's FPDU has a bad CRC".into());
            }
            match HeaderRepr::parse(&f.ulpdu) {
                Ok(h) if h.opcode == Opcode::Terminate as u8 => {
                    return terminate_reaction(&f.ulpdu, h.header_len())
                }
                Ok(_) => self.skipped += 1,
                Err(e) => return Reaction::Garbled(format!("peer's DDP header: {e}")),
            }
        }
    }
}

/// Decode the Terminate in `ulpdu` (DDP header of `hlen` bytes first).
fn terminate_reaction(ulpdu: &[u8], hlen: usize) -> Reaction {
    let body = ulpdu.get(hlen..).unwrap_or(&[]);
    match TerminateRepr::parse(body) {
        Ok(t) => Reaction::Terminate {
            bits: t.raw_code_bits,
            code: t.code,
        },
        Err(_) => match body {
            [a, b, ..] => {
                let bits = u16::from_be_bytes([*a, *b]);
                Reaction::Terminate {
                    bits,
                    code: TermCode::from_bits(bits),
                }
            }
            _ => Reaction::Garbled("Terminate too short".into()),
        },
    }
}

/// An untagged header (DDP v1, RDMAP v1, L set).
pub fn untagged(op: Opcode, qn: u32, msn: u32, mo: u32) -> HeaderRepr {
    HeaderRepr {
        last: true,
        ddp_version: DDP_VERSION,
        ddp_reserved: 0,
        rdmap_version: RDMAP_VERSION,
        rdmap_reserved: 0,
        opcode: op as u8,
        buffer: Buffer::Untagged {
            inv_stag: 0,
            qn,
            msn,
            mo,
        },
    }
}

/// A header followed by `payload`, as one ULPDU.
pub fn ulpdu(h: &HeaderRepr, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; h.header_len() + payload.len()];
    h.emit(&mut v);
    v[h.header_len()..].copy_from_slice(payload);
    v
}

/// A Send on queue `qn` with MSN `msn`.
pub fn send(qn: u32, msn: u32, payload: &[u8]) -> Vec<u8> {
    ulpdu(&untagged(Opcode::Send, qn, msn, 0), payload)
}

/// An RDMA Write of `len` bytes of 0xee to (`stag`, `to`).
pub fn write(stag: u32, to: u64, len: usize) -> Vec<u8> {
    let h = HeaderRepr {
        buffer: Buffer::Tagged { stag, to },
        opcode: Opcode::Write as u8,
        ..untagged(Opcode::Write, 0, 0, 0)
    };
    ulpdu(&h, &vec![0xee; len])
}

/// An RFC 7306 Atomic Request (queue 1, MSN `msn`): FetchAdd of 1 on the
/// word at (`stag`, `to`).
pub fn fetch_add_request(msn: u32, stag: u32, to: u64) -> Vec<u8> {
    let r = iwarp::wire::rdmap::AtomicRequest::fetch_add(msn, stag, to, 1, 0);
    let mut body = [0u8; iwarp::wire::rdmap::AtomicRequest::LEN];
    r.emit(&mut body);
    ulpdu(
        &untagged(
            Opcode::AtomicRequest,
            iwarp::wire::rdmap::QN_READ_REQUEST,
            msn,
            0,
        ),
        &body,
    )
}

/// An RDMA Read Request (MSN `msn`) for `size` bytes of (`stag`, `to`).
pub fn read_request(msn: u32, stag: u32, to: u64, size: u32) -> Vec<u8> {
    let r = ReadRequest {
        sink_stag: 0x0000_4242,
        sink_to: 0,
        size,
        src_stag: stag,
        src_to: to,
    };
    let mut body = [0u8; ReadRequest::LEN];
    r.emit(&mut body);
    ulpdu(
        &untagged(
            Opcode::ReadRequest,
            iwarp::wire::rdmap::QN_READ_REQUEST,
            msn,
            0,
        ),
        &body,
    )
}
