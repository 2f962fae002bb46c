//! MPA request/reply frames (RFC 5044 §7.1) and the RFC 6581 IRD/ORD words.
//!
//! ```text
//! 0..16   key: "MPA ID Req Frame" / "MPA ID Rep Frame"
//! 16      M(0x80) C(0x40) R(0x20) E(0x10, RFC 6581 enhanced) Res(0x0f)
//! 17      Rev
//! 18..20  PD_Length (big endian, at most 512)
//! 20..    private data
//! ```
//!
//! With RFC 6581 enhanced connection setup (E set, Rev 2) the first four
//! private data bytes are the [`IrdOrd`] words; they count toward the
//! 512-byte limit.

use super::{Error, Result};

/// Key of an MPA Request frame: the 16 ASCII bytes "MPA ID Req Frame"
/// that open every MPA Request (RFC 5044 §7.1).
pub const REQUEST_KEY: &[u8; 16] = b"MPA ID Req Frame";
/// Key of an MPA Reply frame: the 16 ASCII bytes "MPA ID Rep Frame"
/// that open every MPA Reply (RFC 5044 §7.1).
pub const REPLY_KEY: &[u8; 16] = b"MPA ID Rep Frame";
/// Length of the fixed part of a request/reply frame.
pub const HEADER_LEN: usize = 20;
/// Largest allowed PD_Length (RFC 5044 §7.1).
pub const MAX_PRIVATE_DATA: usize = 512;

mod field {
    use core::ops::Range;
    pub const KEY: Range<usize> = 0..16;
    pub const FLAGS: usize = 16;
    pub const REV: usize = 17;
    pub const PD_LEN: Range<usize> = 18..20;
}

const M_BIT: u8 = 0x80;
const C_BIT: u8 = 0x40;
const R_BIT: u8 = 0x20;
const E_BIT: u8 = 0x10;
const RES_MASK: u8 = 0x0f;

/// Which of the two MPA connection setup frames (RFC 5044 §7.1) a frame
/// is; the Key field tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// MPA Request (initiator to responder).
    Request,
    /// MPA Reply (responder to initiator).
    Reply,
}

impl FrameKind {
    /// The 16-byte key of this kind of frame.
    pub fn key(self) -> &'static [u8; 16] {
        match self {
            Self::Request => REQUEST_KEY,
            Self::Reply => REPLY_KEY,
        }
    }

    /// The kind whose key is `key`, if any.
    pub fn from_key(key: &[u8]) -> Option<Self> {
        if key == REQUEST_KEY {
            Some(Self::Request)
        } else if key == REPLY_KEY {
            Some(Self::Reply)
        } else {
            None
        }
    }
}

/// A zero-copy view of a request/reply frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checks. Accessors of a short buffer read
    /// missing bytes as zero; setters panic if the field lies outside it.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wrap a buffer, checking that it holds the 20-byte header and all the
    /// private data PD_Length announces (`Truncated` otherwise). The key
    /// and PD_Length limit are not checked here (see [`FrameRepr::parse`]).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// `Truncated` unless header and private data are all present.
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN || len < HEADER_LEN + usize::from(self.pd_len()) {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// The wrapped buffer, giving up the view.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn byte(&self, i: usize) -> u8 {
        self.buffer.as_ref().get(i).copied().unwrap_or(0)
    }

    /// The 16-byte key (empty if the buffer is too short).
    pub fn key(&self) -> &[u8] {
        self.buffer.as_ref().get(field::KEY).unwrap_or(&[])
    }
    /// M (Marker flag): the sender wants markers in the stream it
    /// receives (RFC 5044 §7.1).
    pub fn markers(&self) -> bool {
        self.byte(field::FLAGS) & M_BIT != 0
    }
    /// C (CRC flag): the sender wants the MPA CRC32c on FPDUs; CRC is on in
    /// both directions if either side sets it (RFC 5044 §7.1).
    pub fn crc(&self) -> bool {
        self.byte(field::FLAGS) & C_BIT != 0
    }
    /// R (Rejected Connection flag): set in a Reply that refuses the
    /// connection (RFC 5044 §7.1); zero in a Request.
    pub fn reject(&self) -> bool {
        self.byte(field::FLAGS) & R_BIT != 0
    }
    /// The RFC 6581 Enhanced connection establishment bit:
    /// the private data starts with the [`IrdOrd`] words.
    pub fn enhanced(&self) -> bool {
        self.byte(field::FLAGS) & E_BIT != 0
    }
    /// Res: the 4 reserved flag bits, sent as zero and ignored on receipt
    /// (RFC 5044 §7.1).
    pub fn reserved(&self) -> u8 {
        self.byte(field::FLAGS) & RES_MASK
    }
    /// Rev: the MPA revision, 1 for RFC 5044 and 2 for RFC 6581 enhanced
    /// connection setup.
    pub fn revision(&self) -> u8 {
        self.byte(field::REV)
    }
    /// PD_Length: the length in bytes of the private data that follows
    /// the 20-byte header (big endian; RFC 5044 allows at most 512).
    pub fn pd_len(&self) -> u16 {
        u16::from_be_bytes([
            self.byte(field::PD_LEN.start),
            self.byte(field::PD_LEN.end - 1),
        ])
    }
    /// The private data (clipped to the buffer).
    pub fn private_data(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = HEADER_LEN
            .saturating_add(usize::from(self.pd_len()))
            .min(b.len());
        b.get(HEADER_LEN..end).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_flag(&mut self, bit: u8, v: bool) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        if v {
            *b |= bit;
        } else {
            *b &= !bit;
        }
    }
    /// Set the Key field (one of [`REQUEST_KEY`], [`REPLY_KEY`]).
    pub fn set_key(&mut self, key: &[u8; 16]) {
        self.buffer.as_mut()[field::KEY].copy_from_slice(key);
    }
    /// Set the M (Marker) flag.
    pub fn set_markers(&mut self, v: bool) {
        self.set_flag(M_BIT, v);
    }
    /// Set the C (CRC) flag.
    pub fn set_crc(&mut self, v: bool) {
        self.set_flag(C_BIT, v);
    }
    /// Set the R (Rejected Connection) flag.
    pub fn set_reject(&mut self, v: bool) {
        self.set_flag(R_BIT, v);
    }
    /// Set the RFC 6581 Enhanced connection establishment bit.
    pub fn set_enhanced(&mut self, v: bool) {
        self.set_flag(E_BIT, v);
    }
    /// Set the 4 reserved flag bits (Res); only the low 4 bits of `v`
    /// are used.
    pub fn set_reserved(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !RES_MASK) | (v & RES_MASK);
    }
    /// Set the Rev field.
    pub fn set_revision(&mut self, v: u8) {
        self.buffer.as_mut()[field::REV] = v;
    }
    /// Set PD_Length (bytes of private data after the header).
    pub fn set_pd_len(&mut self, v: u16) {
        self.buffer.as_mut()[field::PD_LEN].copy_from_slice(&v.to_be_bytes());
    }
    /// Mutable private data area (`pd_len` bytes after the header).
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + usize::from(self.pd_len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// A parsed MPA request or reply frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRepr<'a> {
    /// Request or reply (from the key).
    pub kind: FrameKind,
    /// M (Marker flag): the sender wants markers in the stream it
    /// receives.
    pub markers: bool,
    /// C (CRC flag): the sender wants the MPA CRC32c on FPDUs.
    pub crc: bool,
    /// R (Rejected Connection flag): the Reply refuses the connection.
    pub reject: bool,
    /// RFC 6581 enhanced connection establishment flag.
    pub enhanced: bool,
    /// The remaining 4 reserved flag bits, as received.
    pub reserved: u8,
    /// Rev: the MPA revision (1: RFC 5044, 2: RFC 6581 enhanced).
    pub revision: u8,
    /// The whole private data field (with IRD/ORD words, if any).
    pub private_data: &'a [u8],
}

impl<'a> FrameRepr<'a> {
    /// Parse a frame at the start of `bytes` (trailing bytes ignored).
    /// `Malformed` for an unknown key or PD_Length > 512; `Truncated` if
    /// the header or the private data is incomplete.
    pub fn parse(bytes: &'a [u8]) -> Result<Self> {
        let len = Self::frame_len(bytes)?;
        let data = bytes.get(..len).ok_or(Error::Truncated)?;
        let p = Packet::new_checked(data)?;
        let kind = FrameKind::from_key(p.key()).ok_or(Error::Malformed)?;
        let private_data = data.get(HEADER_LEN..).ok_or(Error::Truncated)?;
        Ok(Self {
            kind,
            markers: p.markers(),
            crc: p.crc(),
            reject: p.reject(),
            enhanced: p.enhanced(),
            reserved: p.reserved(),
            revision: p.revision(),
            private_data,
        })
    }

    /// Total frame length (20 + PD_Length) from the 20-byte header.
    /// `Truncated` if `header` is shorter than 20 bytes; `Malformed` for an
    /// unknown key or PD_Length > 512.
    pub fn frame_len(header: &[u8]) -> Result<usize> {
        if header.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let p = Packet::new_unchecked(header);
        if FrameKind::from_key(p.key()).is_none() {
            return Err(Error::Malformed);
        }
        let pd = usize::from(p.pd_len());
        if pd > MAX_PRIVATE_DATA {
            return Err(Error::Malformed);
        }
        Ok(HEADER_LEN + pd)
    }

    /// Length of the frame on the wire: the 20-byte header plus the
    /// private data.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.private_data.len()
    }

    /// Write the frame into `buf[..buffer_len()]`.
    ///
    /// # Panics
    /// If `buf` is too short or the private data is longer than 65535
    /// bytes (callers keep it within [`MAX_PRIVATE_DATA`]).
    pub fn emit(&self, buf: &mut [u8]) {
        let pd_len = u16::try_from(self.private_data.len()).expect("private data too long");
        let mut p = Packet::new_unchecked(&mut buf[..self.buffer_len()]);
        p.set_key(self.kind.key());
        p.buffer[field::FLAGS] = 0;
        p.set_markers(self.markers);
        p.set_crc(self.crc);
        p.set_reject(self.reject);
        p.set_enhanced(self.enhanced);
        p.set_reserved(self.reserved);
        p.set_revision(self.revision);
        p.set_pd_len(pd_len);
        p.private_data_mut().copy_from_slice(self.private_data);
    }
}

/// The RFC 6581 IRD/ORD words: the first four private data bytes of an
/// enhanced request/reply.
///
/// ```text
/// 0..2  IRD word: P2P(0x8000) zero-length Send RTR(0x4000) IRD(0x3fff)
/// 2..4  ORD word: RDMA Write RTR(0x8000) RDMA Read RTR(0x4000) ORD(0x3fff)
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IrdOrd {
    /// IRD: how many inbound RDMA Read Requests (and RFC 7306 Atomic
    /// Requests) the sender accepts outstanding as responder (14 bits).
    pub ird: u16,
    /// ORD: how many outbound RDMA Read Requests (and RFC 7306 Atomic
    /// Requests) the sender keeps outstanding as requester (14 bits).
    pub ord: u16,
    /// P2P flag of the IRD word: the peer-to-peer connection model, in which
    /// the initiator sends a Ready to Receive (RTR) message before the
    /// responder may send (RFC 6581).
    pub p2p: bool,
    /// The "Send" RTR flag (IRD word): a zero-length Send may serve as RTR.
    pub rtr_send: bool,
    /// The "Write" RTR flag (ORD word): a zero-length RDMA Write may serve as
    /// RTR.
    pub rtr_write: bool,
    /// The "Read" RTR flag (ORD word): a zero-length RDMA Read may serve as
    /// RTR.
    pub rtr_read: bool,
}

const IRD_ORD_MASK: u16 = 0x3fff;

impl IrdOrd {
    /// Length of the two words on the wire, in bytes.
    pub const LEN: usize = 4;
    /// Largest IRD or ORD value the 14-bit fields hold (0x3fff).
    pub const MAX: u16 = IRD_ORD_MASK;

    /// Parse the two words; `Truncated` if fewer than 4 bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let [a, b, c, d, ..] = bytes else {
            return Err(Error::Truncated);
        };
        let ird = u16::from_be_bytes([*a, *b]);
        let ord = u16::from_be_bytes([*c, *d]);
        Ok(Self {
            ird: ird & IRD_ORD_MASK,
            ord: ord & IRD_ORD_MASK,
            p2p: ird & 0x8000 != 0,
            rtr_send: ird & 0x4000 != 0,
            rtr_write: ord & 0x8000 != 0,
            rtr_read: ord & 0x4000 != 0,
        })
    }

    /// Length on the wire ([`Self::LEN`]).
    pub fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Write the words into `buf[..4]`; IRD/ORD above 0x3fff are clamped.
    ///
    /// # Panics
    /// If `buf` is shorter than 4 bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        let flag = |b: bool, bit: u16| if b { bit } else { 0 };
        let ird = self.ird.min(IRD_ORD_MASK) | flag(self.p2p, 0x8000) | flag(self.rtr_send, 0x4000);
        let ord =
            self.ord.min(IRD_ORD_MASK) | flag(self.rtr_write, 0x8000) | flag(self.rtr_read, 0x4000);
        buf[..2].copy_from_slice(&ird.to_be_bytes());
        buf[2..4].copy_from_slice(&ord.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MPA Request of siw-rping.pcapng (frame 1): rev 2, enhanced,
    /// no M/C/R, PD_Length 4, IRD 1 / ORD 1.
    const SIW_RPING_REQUEST: [u8; 24] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d,
        0x65, 0x10, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01,
    ];
    /// The MPA Reply of siw-crc-rping-ib_write_bw.pcapng: C echoed (0x50).
    const SIW_CRC_REPLY: [u8; 24] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6d,
        0x65, 0x50, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01,
    ];

    #[test]
    fn siw_request() {
        let f = FrameRepr::parse(&SIW_RPING_REQUEST).unwrap();
        assert_eq!(f.kind, FrameKind::Request);
        assert!(!f.markers && !f.crc && !f.reject && f.enhanced);
        assert_eq!((f.reserved, f.revision), (0, 2));
        assert_eq!(f.private_data, &[0, 1, 0, 1]);
        let io = IrdOrd::parse(f.private_data).unwrap();
        assert_eq!(
            io,
            IrdOrd {
                ird: 1,
                ord: 1,
                ..IrdOrd::default()
            }
        );
        assert_eq!(FrameRepr::frame_len(&SIW_RPING_REQUEST[..20]), Ok(24));
        let mut out = [0xa5; 24];
        f.emit(&mut out);
        assert_eq!(out, SIW_RPING_REQUEST);
        for n in 0..24 {
            assert_eq!(
                FrameRepr::parse(&SIW_RPING_REQUEST[..n]),
                Err(Error::Truncated)
            );
        }
    }

    #[test]
    fn siw_crc_reply() {
        let f = FrameRepr::parse(&SIW_CRC_REPLY).unwrap();
        assert_eq!(f.kind, FrameKind::Reply);
        assert!(f.crc && f.enhanced && !f.markers && !f.reject);
        let p = Packet::new_checked(&SIW_CRC_REPLY[..]).unwrap();
        assert_eq!(p.pd_len(), 4);
        assert_eq!(p.private_data(), &[0, 1, 0, 1]);
    }

    #[test]
    fn bad_key_and_long_pd() {
        let mut b = SIW_RPING_REQUEST;
        b[0] = b'X';
        assert_eq!(FrameRepr::parse(&b), Err(Error::Malformed));
        assert_eq!(FrameRepr::frame_len(&b), Err(Error::Malformed));
        let mut b = SIW_RPING_REQUEST;
        b[18..20].copy_from_slice(&513u16.to_be_bytes());
        assert_eq!(FrameRepr::frame_len(&b), Err(Error::Malformed));
        assert_eq!(FrameRepr::parse(&b), Err(Error::Malformed));
        b[18..20].copy_from_slice(&512u16.to_be_bytes());
        assert_eq!(FrameRepr::frame_len(&b), Ok(532));
    }

    /// siw `peer_to_peer=1`: request `80 01 c0 01`, reply `80 01 80 01`.
    #[test]
    fn ird_ord_p2p_words() {
        let req = IrdOrd::parse(&[0x80, 0x01, 0xc0, 0x01]).unwrap();
        assert!(req.p2p && !req.rtr_send && req.rtr_write && req.rtr_read);
        assert_eq!((req.ird, req.ord), (1, 1));
        let rep = IrdOrd::parse(&[0x80, 0x01, 0x80, 0x01]).unwrap();
        assert!(rep.p2p && rep.rtr_write && !rep.rtr_read);
        let mut out = [0; 4];
        req.emit(&mut out);
        assert_eq!(out, [0x80, 0x01, 0xc0, 0x01]);
        let all = IrdOrd {
            ird: 0xffff,
            ord: 0x3fff,
            p2p: false,
            rtr_send: true,
            rtr_write: false,
            rtr_read: true,
        };
        all.emit(&mut out);
        assert_eq!(out, [0x7f, 0xff, 0x7f, 0xff]);
        assert_eq!(IrdOrd::parse(&out[..3]), Err(Error::Truncated));
    }

    #[test]
    fn emit_flags() {
        let f = FrameRepr {
            kind: FrameKind::Reply,
            markers: true,
            crc: true,
            reject: true,
            enhanced: false,
            reserved: 0x5,
            revision: 1,
            private_data: b"hi",
        };
        let mut out = [0; 22];
        f.emit(&mut out);
        assert_eq!(&out[..16], REPLY_KEY);
        assert_eq!(&out[16..], &[0xe5, 1, 0, 2, b'h', b'i']);
        assert_eq!(FrameRepr::parse(&out), Ok(f));
    }
}
