//! Helpers for tests that play a hostile peer: craft DDP/RDMAP headers,
//! frame them into FPDUs, and read back what the victim put on the wire.
#![allow(dead_code)]

use iwarp::cq::{WcStatus, WorkCompletion};
use iwarp::mpa::framing::{RxDeframer, RxItem, TxFramer};
use iwarp::testing::{End, Pair};
use iwarp::wire::ddp::{Buffer, HeaderRepr, DDP_VERSION};
use iwarp::wire::mpa::{FrameRepr, HEADER_LEN, REPLY_KEY};
use iwarp::wire::rdmap::{Opcode, ReadRequest, QN_TERMINATE, RDMAP_VERSION};
use iwarp::wire::terminate::TerminateRepr;

/// A tagged header (Write / Read Response) with valid versions, L set.
pub fn tagged(opcode: u8, stag: u32, to: u64) -> HeaderRepr {
    HeaderRepr {
        last: true,
        ddp_version: DDP_VERSION,
        ddp_reserved: 0,
        rdmap_version: RDMAP_VERSION,
        rdmap_reserved: 0,
        opcode,
        buffer: Buffer::Tagged { stag, to },
    }
}

/// An untagged header with valid versions, L set.
pub fn untagged(opcode: u8, qn: u32, msn: u32, mo: u32) -> HeaderRepr {
    HeaderRepr {
        last: true,
        ddp_version: DDP_VERSION,
        ddp_reserved: 0,
        rdmap_version: RDMAP_VERSION,
        rdmap_reserved: 0,
        opcode,
        buffer: Buffer::Untagged {
            inv_stag: 0,
            qn,
            msn,
            mo,
        },
    }
}

/// A Send (queue 0) header.
pub fn send(msn: u32, mo: u32) -> HeaderRepr {
    untagged(Opcode::Send as u8, 0, msn, mo)
}

/// A Send with Invalidate header.
pub fn send_inv(msn: u32, inv_stag: u32) -> HeaderRepr {
    let mut h = untagged(Opcode::SendInvalidate as u8, 0, msn, 0);
    h.buffer = Buffer::Untagged {
        inv_stag,
        qn: 0,
        msn,
        mo: 0,
    };
    h
}

/// An RDMA Write header.
pub fn write(stag: u32, to: u64) -> HeaderRepr {
    tagged(Opcode::Write as u8, stag, to)
}

/// An RDMA Read Request header (queue 1).
pub fn read_request(msn: u32) -> HeaderRepr {
    untagged(Opcode::ReadRequest as u8, 1, msn, 0)
}

/// Header followed by `body` (RDMAP header or payload).
pub fn ulpdu(hdr: &HeaderRepr, body: &[u8]) -> Vec<u8> {
    let mut v = vec![0; hdr.header_len()];
    hdr.emit(&mut v);
    v.extend_from_slice(body);
    v
}

/// The 28 bytes of a Read Request header.
pub fn rr_bytes(r: &ReadRequest) -> Vec<u8> {
    let mut v = vec![0; ReadRequest::LEN];
    r.emit(&mut v);
    v
}

/// Frames ULPDUs into a stream that starts at the first FPDU.
pub struct Crafter {
    framer: TxFramer,
}

impl Crafter {
    /// A fresh framer: position 0 is the first FPDU byte.
    pub fn new(crc: bool, markers: bool) -> Self {
        Self {
            framer: TxFramer::new(crc, markers),
        }
    }

    /// The stream position of the next byte.
    pub fn position(&self) -> u64 {
        self.framer.position()
    }

    /// Frame one ULPDU; returns its wire bytes.
    pub fn fpdu(&mut self, ulpdu: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; ulpdu.len() + 4096];
        self.framer
            .start(u16::try_from(ulpdu.len()).expect("ULPDU fits"));
        let (r, mut w) = self.framer.put(ulpdu, &mut out);
        assert_eq!(r, ulpdu.len());
        let (n, done) = self.framer.finish(&mut out[w..]);
        assert!(done);
        w += n;
        out.truncate(w);
        out
    }
}

/// One FPDU as read back from a stream.
#[derive(Debug)]
pub struct Fpdu {
    pub ulpdu: Vec<u8>,
    pub crc_ok: bool,
}

/// Everything `end` sent, concatenated.
pub fn sent_by(p: &Pair, end: End) -> Vec<u8> {
    p.transcript()
        .iter()
        .filter(|(e, _)| *e == end)
        .flat_map(|(_, b)| b.iter().copied())
        .collect()
}

/// The FPDUs `end` sent after its MPA frame (if it sent one).
pub fn fpdus_sent_by(p: &Pair, end: End, crc: bool, markers: bool) -> Vec<Fpdu> {
    let bytes = sent_by(p, end);
    let mut rest = &bytes[..];
    if rest.starts_with(REPLY_KEY) && rest.len() >= HEADER_LEN {
        let len = FrameRepr::frame_len(&rest[..HEADER_LEN]).expect("MPA reply");
        rest = &rest[len..];
    }
    let mut d = RxDeframer::new(crc, markers, 65535);
    let mut out = Vec::new();
    let mut cur = Vec::new();
    while !rest.is_empty() {
        let (n, item) = d.next(rest).expect("victim's stream is well-framed");
        match item {
            Some(RxItem::Start { .. }) => cur.clear(),
            Some(RxItem::Data(x)) => cur.extend_from_slice(x),
            Some(RxItem::End { crc_ok }) => out.push(Fpdu {
                ulpdu: core::mem::take(&mut cur),
                crc_ok,
            }),
            None => {}
        }
        rest = &rest[n..];
    }
    assert!(d.at_boundary(), "victim's stream ends mid-FPDU");
    out
}

/// The Terminate messages among `fpdus`: (untagged header, body).
pub fn terminates(fpdus: &[Fpdu]) -> Vec<(HeaderRepr, TerminateRepr)> {
    fpdus
        .iter()
        .filter_map(|f| {
            let h = HeaderRepr::parse(&f.ulpdu).ok()?;
            (h.opcode == Opcode::Terminate as u8).then(|| {
                assert!(f.crc_ok, "Terminate FPDU has a bad CRC");
                assert!(matches!(
                    h.buffer,
                    Buffer::Untagged {
                        qn: QN_TERMINATE,
                        ..
                    }
                ));
                let t = TerminateRepr::parse(&f.ulpdu[h.header_len()..]).expect("Terminate body");
                (h, t)
            })
        })
        .collect()
}

/// Every completion is a flush, except the listed `(wr_id, status)` ones,
/// which must each appear exactly once with that status.
pub fn assert_flushed_except(wcs: &[WorkCompletion], expected: &[(u64, WcStatus)], posted: &[u64]) {
    for &id in posted {
        let mine: Vec<_> = wcs.iter().filter(|w| w.wr_id == id).collect();
        assert_eq!(mine.len(), 1, "wr {id} completions: {wcs:?}");
        let want = expected
            .iter()
            .find(|(e, _)| *e == id)
            .map_or(WcStatus::WrFlushError, |(_, s)| *s);
        assert_eq!(mine[0].status, want, "wr {id}: {wcs:?}");
    }
    assert_eq!(wcs.len(), posted.len(), "unexpected completions: {wcs:?}");
}
