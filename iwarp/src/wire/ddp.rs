//! The DDP segment header (RFC 5041 §4) combined with the RDMAP control
//! field (RFC 5040 §4.1, §4.2).
//!
//! RDMAP uses DDP's `RsvdULP` bits: the first 8 of them are the RDMAP
//! control byte (version, reserved, opcode); in an untagged header the next
//! 32 carry the Invalidate STag of a Send with Invalidate (reserved
//! otherwise). Layout, big endian:
//!
//! ```text
//! byte 0      T(0x80) L(0x40) Rsvd(0x3c) DV(0x03)
//! byte 1      RV(0xc0) Rsvd(0x30) OpCode(0x0f)
//! tagged:     2..6 STag, 6..14 TO                      (14 bytes)
//! untagged:   2..6 Inv STag, 6..10 QN, 10..14 MSN, 14..18 MO  (18 bytes)
//! ```

use super::rdmap::{be32, be64};
use super::{Error, Result};

/// The DDP version this crate speaks (RFC 5041 §4.1).
pub const DDP_VERSION: u8 = 1;
/// Length of a tagged DDP header, RDMAP control byte included.
pub const TAGGED_HEADER_LEN: usize = 14;
/// Length of an untagged DDP header, RDMAP control byte and Invalidate
/// STag included.
pub const UNTAGGED_HEADER_LEN: usize = 18;

mod field {
    use core::ops::Range;
    pub const DDP_CTRL: usize = 0;
    pub const RDMAP_CTRL: usize = 1;
    pub const STAG: Range<usize> = 2..6;
    pub const TO: Range<usize> = 6..14;
    pub const INV_STAG: Range<usize> = 2..6;
    pub const QN: Range<usize> = 6..10;
    pub const MSN: Range<usize> = 10..14;
    pub const MO: Range<usize> = 14..18;
}

const T_BIT: u8 = 0x80;
const L_BIT: u8 = 0x40;

/// A zero-copy view of a DDP/RDMAP header at the start of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wrap a buffer without checking its length. Accessors of fields
    /// beyond the end of the buffer return 0.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wrap a buffer, checking that it holds the whole header (14 or 18
    /// bytes depending on the T bit).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// `Truncated` unless the buffer holds the whole header.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        match b.first() {
            Some(&first) if b.len() >= HeaderRepr::header_len_for(first) => Ok(()),
            _ => Err(Error::Truncated),
        }
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn byte(&self, i: usize) -> u8 {
        self.buffer.as_ref().get(i).copied().unwrap_or(0)
    }

    fn u32_at(&self, r: core::ops::Range<usize>) -> u32 {
        be32(self.buffer.as_ref(), r).unwrap_or(0)
    }

    /// The T (tagged) flag.
    pub fn tagged(&self) -> bool {
        self.byte(field::DDP_CTRL) & T_BIT != 0
    }
    /// The L (last segment of the message) flag.
    pub fn last(&self) -> bool {
        self.byte(field::DDP_CTRL) & L_BIT != 0
    }
    /// The 4 reserved bits of the DDP control byte.
    pub fn ddp_reserved(&self) -> u8 {
        (self.byte(field::DDP_CTRL) >> 2) & 0x0f
    }
    /// The DDP version (2 bits).
    pub fn ddp_version(&self) -> u8 {
        self.byte(field::DDP_CTRL) & 0x03
    }
    /// The RDMAP version (2 bits).
    pub fn rdmap_version(&self) -> u8 {
        self.byte(field::RDMAP_CTRL) >> 6
    }
    /// The 2 reserved bits of the RDMAP control byte.
    pub fn rdmap_reserved(&self) -> u8 {
        (self.byte(field::RDMAP_CTRL) >> 4) & 0x03
    }
    /// The raw 4-bit RDMAP opcode.
    pub fn opcode(&self) -> u8 {
        self.byte(field::RDMAP_CTRL) & 0x0f
    }
    /// The STag (tagged header).
    pub fn stag(&self) -> u32 {
        self.u32_at(field::STAG)
    }
    /// The Tagged Offset (tagged header).
    pub fn to(&self) -> u64 {
        be64(self.buffer.as_ref(), field::TO).unwrap_or(0)
    }
    /// The Invalidate STag / reserved RsvdULP word (untagged header).
    pub fn inv_stag(&self) -> u32 {
        self.u32_at(field::INV_STAG)
    }
    /// The Queue Number (untagged header).
    pub fn qn(&self) -> u32 {
        self.u32_at(field::QN)
    }
    /// The Message Sequence Number (untagged header).
    pub fn msn(&self) -> u32 {
        self.u32_at(field::MSN)
    }
    /// The Message Offset (untagged header).
    pub fn mo(&self) -> u32 {
        self.u32_at(field::MO)
    }
    /// Header length implied by the T bit.
    pub fn header_len(&self) -> usize {
        HeaderRepr::header_len_for(self.byte(field::DDP_CTRL))
    }
    /// The bytes after the header (empty if the buffer is shorter).
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(self.header_len()..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_bits(&mut self, i: usize, mask: u8, value: u8) {
        let b = &mut self.buffer.as_mut()[i];
        *b = (*b & !mask) | (value & mask);
    }
    /// Set the T flag.
    pub fn set_tagged(&mut self, v: bool) {
        self.set_bits(field::DDP_CTRL, T_BIT, if v { T_BIT } else { 0 });
    }
    /// Set the L flag.
    pub fn set_last(&mut self, v: bool) {
        self.set_bits(field::DDP_CTRL, L_BIT, if v { L_BIT } else { 0 });
    }
    /// Set the 4 reserved DDP bits.
    pub fn set_ddp_reserved(&mut self, v: u8) {
        self.set_bits(field::DDP_CTRL, 0x3c, v << 2);
    }
    /// Set the DDP version (2 bits).
    pub fn set_ddp_version(&mut self, v: u8) {
        self.set_bits(field::DDP_CTRL, 0x03, v);
    }
    /// Set the RDMAP version (2 bits).
    pub fn set_rdmap_version(&mut self, v: u8) {
        self.set_bits(field::RDMAP_CTRL, 0xc0, v << 6);
    }
    /// Set the 2 reserved RDMAP bits.
    pub fn set_rdmap_reserved(&mut self, v: u8) {
        self.set_bits(field::RDMAP_CTRL, 0x30, v << 4);
    }
    /// Set the 4-bit opcode.
    pub fn set_opcode(&mut self, v: u8) {
        self.set_bits(field::RDMAP_CTRL, 0x0f, v);
    }
    /// Set the STag (tagged).
    pub fn set_stag(&mut self, v: u32) {
        self.buffer.as_mut()[field::STAG].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the Tagged Offset (tagged).
    pub fn set_to(&mut self, v: u64) {
        self.buffer.as_mut()[field::TO].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the Invalidate STag (untagged).
    pub fn set_inv_stag(&mut self, v: u32) {
        self.buffer.as_mut()[field::INV_STAG].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the Queue Number (untagged).
    pub fn set_qn(&mut self, v: u32) {
        self.buffer.as_mut()[field::QN].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the Message Sequence Number (untagged).
    pub fn set_msn(&mut self, v: u32) {
        self.buffer.as_mut()[field::MSN].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the Message Offset (untagged).
    pub fn set_mo(&mut self, v: u32) {
        self.buffer.as_mut()[field::MO].copy_from_slice(&v.to_be_bytes());
    }
}

/// The buffer model part of a DDP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffer {
    /// Tagged buffer model (RFC 5041 §4.3).
    Tagged {
        /// Steering Tag of the target buffer.
        stag: u32,
        /// Tagged Offset within it.
        to: u64,
    },
    /// Untagged buffer model (RFC 5041 §4.4).
    Untagged {
        /// RsvdULP word: the Invalidate STag of a Send with Invalidate,
        /// otherwise reserved (0).
        inv_stag: u32,
        /// Queue Number.
        qn: u32,
        /// Message Sequence Number.
        msn: u32,
        /// Message Offset.
        mo: u32,
    },
}

/// A parsed DDP + RDMAP control header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderRepr {
    /// L flag: last segment of the DDP message.
    pub last: bool,
    /// DDP version (2 bits).
    pub ddp_version: u8,
    /// The 4 reserved bits of byte 0, as received (0 on emit normally).
    pub ddp_reserved: u8,
    /// RDMAP version (2 bits).
    pub rdmap_version: u8,
    /// The 2 reserved bits of the RDMAP control byte.
    pub rdmap_reserved: u8,
    /// Raw 4-bit RDMAP opcode (validated by the caller).
    pub opcode: u8,
    /// Tagged or untagged buffer fields.
    pub buffer: Buffer,
}

impl HeaderRepr {
    /// Header length for a DDP control byte: 14 if the T bit is set,
    /// else 18.
    pub fn header_len_for(first_byte: u8) -> usize {
        if first_byte & T_BIT != 0 {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        }
    }

    /// Parse a header at the start of `bytes`. `Truncated` if the header
    /// is not complete. Versions and reserved bits are returned as
    /// received, never checked here.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let p = Packet::new_checked(bytes)?;
        let buffer = if p.tagged() {
            Buffer::Tagged {
                stag: p.stag(),
                to: p.to(),
            }
        } else {
            Buffer::Untagged {
                inv_stag: p.inv_stag(),
                qn: p.qn(),
                msn: p.msn(),
                mo: p.mo(),
            }
        };
        Ok(Self {
            last: p.last(),
            ddp_version: p.ddp_version(),
            ddp_reserved: p.ddp_reserved(),
            rdmap_version: p.rdmap_version(),
            rdmap_reserved: p.rdmap_reserved(),
            opcode: p.opcode(),
            buffer,
        })
    }

    /// Length of this header on the wire.
    pub fn header_len(&self) -> usize {
        match self.buffer {
            Buffer::Tagged { .. } => TAGGED_HEADER_LEN,
            Buffer::Untagged { .. } => UNTAGGED_HEADER_LEN,
        }
    }

    /// Same as [`Self::header_len`].
    pub fn buffer_len(&self) -> usize {
        self.header_len()
    }

    /// Write the header into `buf[..header_len()]`. Field values wider
    /// than their bit width are truncated.
    ///
    /// # Panics
    /// If `buf` is shorter than [`Self::header_len`].
    pub fn emit(&self, buf: &mut [u8]) {
        let len = self.header_len();
        let mut p = Packet::new_unchecked(&mut buf[..len]);
        let tagged = matches!(self.buffer, Buffer::Tagged { .. });
        p.buffer[0] = 0;
        p.buffer[1] = 0;
        p.set_tagged(tagged);
        p.set_last(self.last);
        p.set_ddp_reserved(self.ddp_reserved);
        p.set_ddp_version(self.ddp_version);
        p.set_rdmap_version(self.rdmap_version);
        p.set_rdmap_reserved(self.rdmap_reserved);
        p.set_opcode(self.opcode);
        match self.buffer {
            Buffer::Tagged { stag, to } => {
                p.set_stag(stag);
                p.set_to(to);
            }
            Buffer::Untagged {
                inv_stag,
                qn,
                msn,
                mo,
            } => {
                p.set_inv_stag(inv_stag);
                p.set_qn(qn);
                p.set_msn(msn);
                p.set_mo(mo);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(bytes: &[u8], expect: HeaderRepr) {
        let repr = HeaderRepr::parse(bytes).unwrap();
        assert_eq!(repr, expect);
        let mut out = vec![0xa5; repr.header_len()];
        repr.emit(&mut out);
        assert_eq!(&out[..], &bytes[..repr.header_len()]);
        for n in 0..repr.header_len() {
            assert_eq!(HeaderRepr::parse(&bytes[..n]), Err(Error::Truncated));
        }
    }

    /// Frame 3 of siw-rping.pcapng: a Send (QN 0, MSN 1), header after the
    /// MPA length `00 22`.
    #[test]
    fn siw_send() {
        let bytes = [
            0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0x00, 0x00, 0x56, 0x3d,
        ];
        round_trip(
            &bytes,
            HeaderRepr {
                last: true,
                ddp_version: 1,
                ddp_reserved: 0,
                rdmap_version: 1,
                rdmap_reserved: 0,
                opcode: 3,
                buffer: Buffer::Untagged {
                    inv_stag: 0,
                    qn: 0,
                    msn: 1,
                    mo: 0,
                },
            },
        );
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(p.payload(), &[0x00, 0x00, 0x56, 0x3d]);
    }

    /// Frame 5 of siw-rping.pcapng: a Read Request on QN 1.
    #[test]
    fn siw_read_request() {
        let bytes = [0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0];
        let r = HeaderRepr::parse(&bytes).unwrap();
        assert_eq!(r.opcode, 1);
        assert_eq!(
            r.buffer,
            Buffer::Untagged {
                inv_stag: 0,
                qn: 1,
                msn: 1,
                mo: 0
            }
        );
        round_trip(&bytes, r);
    }

    /// Frame 6 of siw-rping.pcapng: the tagged Read Response.
    #[test]
    fn siw_read_response() {
        let bytes = [
            0xc1, 0x42, 0x33, 0x1d, 0xed, 0x00, 0x00, 0x00, 0x55, 0x96, 0xa5, 0x4c, 0x9b, 0x10,
        ];
        round_trip(
            &bytes,
            HeaderRepr {
                last: true,
                ddp_version: 1,
                ddp_reserved: 0,
                rdmap_version: 1,
                rdmap_reserved: 0,
                opcode: 2,
                buffer: Buffer::Tagged {
                    stag: 0x331d_ed00,
                    to: 0x5596_a54c_9b10,
                },
            },
        );
    }

    /// An RDMA Write from siw-ib_write_bw.pcapng (frame 46).
    #[test]
    fn siw_write() {
        let bytes = [
            0xc1, 0x40, 0x18, 0x3a, 0xa8, 0x00, 0x00, 0x00, 0x55, 0xdc, 0x0b, 0x13, 0x90, 0x00,
        ];
        let r = HeaderRepr::parse(&bytes).unwrap();
        assert_eq!(r.opcode, 0);
        assert_eq!(
            r.buffer,
            Buffer::Tagged {
                stag: 0x183a_a800,
                to: 0x55dc_0b13_9000
            }
        );
        round_trip(&bytes, r);
    }

    #[test]
    fn reserved_bits_and_inv_stag() {
        let repr = HeaderRepr {
            last: false,
            ddp_version: 2,
            ddp_reserved: 0xf,
            rdmap_version: 3,
            rdmap_reserved: 2,
            opcode: 6,
            buffer: Buffer::Untagged {
                inv_stag: 0xdead_beef,
                qn: 0,
                msn: 7,
                mo: 4096,
            },
        };
        let mut out = [0u8; 18];
        repr.emit(&mut out);
        assert_eq!(out[0], 0x3e);
        assert_eq!(out[1], 0xe6);
        assert_eq!(&out[2..6], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(HeaderRepr::parse(&out), Ok(repr));
        let p = Packet::new_unchecked(&out[..3]);
        assert_eq!(p.mo(), 0); // out-of-range reads never panic
        assert_eq!(Packet::new_checked(&[][..]).err(), Some(Error::Truncated));
    }
}
