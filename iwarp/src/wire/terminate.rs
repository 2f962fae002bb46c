//! The RDMAP Terminate message body (RFC 5040 §4.8).
//!
//! A Terminate is an untagged DDP message on queue 2 (opcode 7); this
//! module handles the bytes after its 18-byte DDP header:
//!
//! ```text
//! 0..2   Layer(4) EType(4) Error Code(8)            (TermCode::to_bits)
//! 2..4   HdrCt M(0x8000) D(0x4000) R(0x2000), 13 reserved bits
//! then   DDP Segment Length (2 bytes)      present if M or D is set
//!        Terminated DDP header (14 or 18)  present if D is set
//!        Terminated RDMAP header (28)      present if R is set
//! ```
//!
//! The DDP Segment Length sits right before the terminated DDP header, in
//! the place the MPA ULPDU length has in an FPDU; it is valid only if M is
//! set. The optional fields are absent (not zero-filled) when their flags
//! are clear, except that the 2-byte length slot precedes a terminated DDP
//! header even when M is clear (it then holds 0). There is no padding: MPA
//! pads the whole ULPDU. This matches both Linux siw (which copies the
//! offending MPA length + DDP header + Read Request header) and
//! Wireshark's `iwarp_ddp_rdmap` dissector (which reads the length and DDP
//! header when D is set, the 28-byte RDMAP header when R is set). The only
//! RDMAP message with an RDMAP header beyond the control byte is the RDMA
//! Read Request, so R means a [`ReadRequest`].
//!
//! Checked with tshark 4.0 on a hand-built Terminate FPDU (DDP untagged
//! error, M/D/R set): length, 18-byte DDP header and 28-byte RDMAP header
//! decode as laid out here. Note that Wireshark sizes the terminated DDP
//! header from the etype alone (14 bytes whenever etype is 1, even for an
//! RDMAP-layer error), so it mis-splits RDMAP remote protection errors;
//! parsing here uses the T bit of the copied header instead.

use super::ddp::HeaderRepr;
use super::rdmap::ReadRequest;
use super::{Error, Result};
use crate::error::TermCode;

const M_BIT: u8 = 0x80;
const D_BIT: u8 = 0x40;
const R_BIT: u8 = 0x20;

/// Length of the Terminate Control word (control field + reserved bits).
pub const CONTROL_LEN: usize = 4;
/// Length of the DDP Segment Length field that precedes a terminated DDP
/// header, in bytes.
pub const SEG_LEN_LEN: usize = 2;

/// A parsed Terminate message body (RFC 5040 §4.8): the error code and the
/// optional copies of the offending segment's headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TerminateRepr {
    /// The error, `None` if the layer nibble names no known layer.
    pub code: Option<TermCode>,
    /// Layer, etype and code bits as received (first 16 bits). On emit
    /// they are used only when `code` is `None`.
    pub raw_code_bits: u16,
    /// DDP Segment Length of the offending segment, in bytes, as its MPA
    /// ULPDU_Length field held it; `Some` exactly when the M bit is set.
    pub ddp_seg_len: Option<u16>,
    /// Terminated DDP Header: a copy of the offending segment's DDP header
    /// with its RDMAP control field; present when the D bit is set.
    pub ddp_header: Option<HeaderRepr>,
    /// Terminated RDMAP Header: present when the R bit is set; only an
    /// RDMA Read Request has an RDMAP header beyond the control field.
    pub rdmap_header: Option<ReadRequest>,
}

impl TerminateRepr {
    /// A Terminate body for `code` with no copied headers.
    pub fn new(code: TermCode) -> Self {
        Self {
            code: Some(code),
            raw_code_bits: code.to_bits(),
            ddp_seg_len: None,
            ddp_header: None,
            rdmap_header: None,
        }
    }

    /// Parse a Terminate body. `Truncated` if a field its flags announce
    /// is missing; trailing bytes are ignored; reserved bits are ignored.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let ctrl = bytes.get(..CONTROL_LEN).ok_or(Error::Truncated)?;
        let raw_code_bits = u16::from_be_bytes([ctrl[0], ctrl[1]]);
        let hdrct = ctrl[2];
        let (m, d, r) = (hdrct & M_BIT != 0, hdrct & D_BIT != 0, hdrct & R_BIT != 0);
        let mut rest = &bytes[CONTROL_LEN..];
        let mut ddp_seg_len = None;
        if m || d {
            let s = rest.get(..SEG_LEN_LEN).ok_or(Error::Truncated)?;
            if m {
                ddp_seg_len = Some(u16::from_be_bytes([s[0], s[1]]));
            }
            rest = &rest[SEG_LEN_LEN..];
        }
        let mut ddp_header = None;
        if d {
            let h = HeaderRepr::parse(rest)?;
            rest = &rest[h.header_len()..];
            ddp_header = Some(h);
        }
        let rdmap_header = if r {
            Some(ReadRequest::parse(rest)?)
        } else {
            None
        };
        Ok(Self {
            code: TermCode::from_bits(raw_code_bits),
            raw_code_bits,
            ddp_seg_len,
            ddp_header,
            rdmap_header,
        })
    }

    /// Length of the body on the wire in bytes: 4, plus 2 for the
    /// segment length slot, plus 14 or 18 for a DDP header, plus 28 for a
    /// Read Request header.
    pub fn buffer_len(&self) -> usize {
        let mut len = CONTROL_LEN;
        if self.ddp_seg_len.is_some() || self.ddp_header.is_some() {
            len += SEG_LEN_LEN;
        }
        if let Some(h) = &self.ddp_header {
            len += h.header_len();
        }
        if self.rdmap_header.is_some() {
            len += ReadRequest::LEN;
        }
        len
    }

    /// Write the body into `buf[..buffer_len()]`. The HdrCt flags follow
    /// from which optional fields are `Some`; reserved bits are 0.
    ///
    /// # Panics
    /// If `buf` is shorter than [`Self::buffer_len`].
    pub fn emit(&self, buf: &mut [u8]) {
        let bits = self.code.map_or(self.raw_code_bits, TermCode::to_bits);
        buf[..2].copy_from_slice(&bits.to_be_bytes());
        let mut hdrct = 0;
        if self.ddp_seg_len.is_some() {
            hdrct |= M_BIT;
        }
        if self.ddp_header.is_some() {
            hdrct |= D_BIT;
        }
        if self.rdmap_header.is_some() {
            hdrct |= R_BIT;
        }
        buf[2] = hdrct;
        buf[3] = 0;
        let mut off = CONTROL_LEN;
        if self.ddp_seg_len.is_some() || self.ddp_header.is_some() {
            let v = self.ddp_seg_len.unwrap_or(0);
            buf[off..off + SEG_LEN_LEN].copy_from_slice(&v.to_be_bytes());
            off += SEG_LEN_LEN;
        }
        if let Some(h) = &self.ddp_header {
            h.emit(&mut buf[off..]);
            off += h.header_len();
        }
        if let Some(r) = &self.rdmap_header {
            r.emit(&mut buf[off..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::codes;
    use crate::wire::ddp::Buffer;

    #[test]
    fn bare_llp_terminate() {
        let t = TerminateRepr::new(codes::MPA_CRC);
        assert_eq!(t.buffer_len(), 4);
        let mut out = [0xa5; 4];
        t.emit(&mut out);
        assert_eq!(out, [0x20, 0x02, 0x00, 0x00]);
        assert_eq!(TerminateRepr::parse(&out), Ok(t));
    }

    /// A Terminate for the siw Read Request of siw-rping.pcapng frame 5,
    /// laid out as siw sends it: MPA-length slot carrying the DDP segment
    /// length (46 - 18 = 28), the 18-byte DDP header, the 28-byte header.
    #[test]
    fn read_request_terminate() {
        let mut bytes = vec![0x01, 0x00, 0xe0, 0x00, 0x00, 0x1c];
        bytes.extend_from_slice(&[0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0]);
        bytes.extend_from_slice(&[
            0x33, 0x1d, 0xed, 0x00, 0x00, 0x00, 0x55, 0x96, 0xa5, 0x4c, 0x9b, 0x10, 0x00, 0x00,
            0x00, 0x40, 0xc2, 0x05, 0x31, 0x00, 0x00, 0x00, 0x56, 0x3d, 0x2e, 0xbf, 0x4e, 0x30,
        ]);
        let t = TerminateRepr::parse(&bytes).unwrap();
        assert_eq!(t.code, Some(codes::RDMAP_INVALID_STAG));
        assert_eq!(t.ddp_seg_len, Some(28));
        let h = t.ddp_header.unwrap();
        assert_eq!(h.opcode, 1);
        assert!(matches!(h.buffer, Buffer::Untagged { qn: 1, msn: 1, .. }));
        assert_eq!(t.rdmap_header.unwrap().size, 64);
        assert_eq!(t.buffer_len(), bytes.len());
        let mut out = vec![0xa5; bytes.len()];
        t.emit(&mut out);
        assert_eq!(out, bytes);
        for n in 0..bytes.len() {
            assert_eq!(TerminateRepr::parse(&bytes[..n]), Err(Error::Truncated));
        }
    }

    #[test]
    fn d_without_m_and_unknown_layer() {
        // D set, M clear: the length slot is present but not valid.
        let tagged = [
            0x30, 0x12, 0x40, 0x00, 0xaa, 0xbb, 0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        let t = TerminateRepr::parse(&tagged).unwrap();
        assert_eq!(t.code, None);
        assert_eq!(t.raw_code_bits, 0x3012);
        assert_eq!(t.ddp_seg_len, None);
        assert_eq!(t.ddp_header.unwrap().header_len(), 14);
        let mut out = [0xa5; 20];
        t.emit(&mut out);
        assert_eq!(&out[..4], &tagged[..4]);
        assert_eq!(&out[4..6], &[0, 0]);
        assert_eq!(&out[6..], &tagged[6..]);
    }
}
