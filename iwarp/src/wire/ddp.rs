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

    /// The wrapped buffer, giving up the view.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn byte(&self, i: usize) -> u8 {
        self.buffer.as_ref().get(i).copied().unwrap_or(0)
    }

    fn u32_at(&self, r: core::ops::Range<usize>) -> u32 {
        be32(self.buffer.as_ref(), r).unwrap_or(0)
    }

    /// T (Tagged flag, RFC 5041 §4.2): set for the tagged buffer model
    /// (STag and TO follow), clear for the untagged model (QN, MSN, MO).
    pub fn tagged(&self) -> bool {
        self.byte(field::DDP_CTRL) & T_BIT != 0
    }
    /// L (Last flag, RFC 5041 §4.2): this segment carries the last bytes
    /// of its DDP message.
    pub fn last(&self) -> bool {
        self.byte(field::DDP_CTRL) & L_BIT != 0
    }
    /// The 4 reserved bits (Rsvd) of the DDP control field; senders set
    /// them to zero.
    pub fn ddp_reserved(&self) -> u8 {
        (self.byte(field::DDP_CTRL) >> 2) & 0x0f
    }
    /// DV (DDP Version, 2 bits; [`DDP_VERSION`] for RFC 5041).
    pub fn ddp_version(&self) -> u8 {
        self.byte(field::DDP_CTRL) & 0x03
    }
    /// RV (RDMA Version, 2 bits) of the RDMAP control field (RFC 5040
    /// §4.2); 1 for RFC 5040.
    pub fn rdmap_version(&self) -> u8 {
        self.byte(field::RDMAP_CTRL) >> 6
    }
    /// The 2 reserved bits of the RDMAP control field; senders set them
    /// to zero.
    pub fn rdmap_reserved(&self) -> u8 {
        (self.byte(field::RDMAP_CTRL) >> 4) & 0x03
    }
    /// The RDMA OpCode field (4 bits, RFC 5040 §4.2, RFC 7306 §4),
    /// unvalidated; [`super::rdmap::Opcode`] decodes it.
    pub fn opcode(&self) -> u8 {
        self.byte(field::RDMAP_CTRL) & 0x0f
    }
    /// Data Sink STag of a tagged header (RFC 5041 §4.3): the Steering Tag
    /// of the buffer the payload is placed into.
    pub fn stag(&self) -> u32 {
        self.u32_at(field::STAG)
    }
    /// Data Sink Tagged Offset of a tagged header (RFC 5041 §4.3): the
    /// 64-bit byte address in the STag's buffer of the first payload byte.
    pub fn to(&self) -> u64 {
        be64(self.buffer.as_ref(), field::TO).unwrap_or(0)
    }
    /// The Invalidate STag / reserved RsvdULP word (untagged header).
    pub fn inv_stag(&self) -> u32 {
        self.u32_at(field::INV_STAG)
    }
    /// QN (Queue Number) of an untagged header (RFC 5041 §4.4): the
    /// untagged queue of the message (RFC 5040 §5.1: 0 Send, 1 Read and
    /// Atomic Requests, 2 Terminate; RFC 7306: 3 Atomic Responses).
    pub fn qn(&self) -> u32 {
        self.u32_at(field::QN)
    }
    /// MSN (Message Sequence Number) of an untagged header (RFC 5041
    /// §4.4): numbers the messages of one queue, starting at 1 and
    /// incrementing by one per message, modulo 2^32.
    pub fn msn(&self) -> u32 {
        self.u32_at(field::MSN)
    }
    /// MO (Message Offset) of an untagged header (RFC 5041 §4.4): the
    /// byte offset of this segment's payload within its message.
    pub fn mo(&self) -> u32 {
        self.u32_at(field::MO)
    }
    /// Header length in bytes implied by the T bit:
    /// [`TAGGED_HEADER_LEN`] or [`UNTAGGED_HEADER_LEN`].
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
    /// Set the T (Tagged) flag; the header length follows from it.
    pub fn set_tagged(&mut self, v: bool) {
        self.set_bits(field::DDP_CTRL, T_BIT, if v { T_BIT } else { 0 });
    }
    /// Set the L (Last) flag.
    pub fn set_last(&mut self, v: bool) {
        self.set_bits(field::DDP_CTRL, L_BIT, if v { L_BIT } else { 0 });
    }
    /// Set the 4 reserved bits of the DDP control field (low 4 bits of `v`).
    pub fn set_ddp_reserved(&mut self, v: u8) {
        self.set_bits(field::DDP_CTRL, 0x3c, v << 2);
    }
    /// Set DV, the DDP Version (low 2 bits of `v`).
    pub fn set_ddp_version(&mut self, v: u8) {
        self.set_bits(field::DDP_CTRL, 0x03, v);
    }
    /// Set RV, the RDMAP version (low 2 bits of `v`).
    pub fn set_rdmap_version(&mut self, v: u8) {
        self.set_bits(field::RDMAP_CTRL, 0xc0, v << 6);
    }
    /// Set the 2 reserved bits of the RDMAP control field (low 2 bits of
    /// `v`).
    pub fn set_rdmap_reserved(&mut self, v: u8) {
        self.set_bits(field::RDMAP_CTRL, 0x30, v << 4);
    }
    /// Set the RDMA OpCode (low 4 bits of `v`).
    pub fn set_opcode(&mut self, v: u8) {
        self.set_bits(field::RDMAP_CTRL, 0x0f, v);
    }
    /// Set the Data Sink STag of a tagged header.
    pub fn set_stag(&mut self, v: u32) {
        self.buffer.as_mut()[field::STAG].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the Data Sink Tagged Offset of a tagged header.
    pub fn set_to(&mut self, v: u64) {
        self.buffer.as_mut()[field::TO].copy_from_slice(&v.to_be_bytes());
    }
    /// Set the RsvdULP word of an untagged header: the Invalidate STag of a
    /// Send with Invalidate, zero otherwise.
    pub fn set_inv_stag(&mut self, v: u32) {
        self.buffer.as_mut()[field::INV_STAG].copy_from_slice(&v.to_be_bytes());
    }
    /// Set QN, the Queue Number of an untagged header.
    pub fn set_qn(&mut self, v: u32) {
        self.buffer.as_mut()[field::QN].copy_from_slice(&v.to_be_bytes());
    }
    /// Set MSN, the Message Sequence Number of an untagged header.
    pub fn set_msn(&mut self, v: u32) {
        self.buffer.as_mut()[field::MSN].copy_from_slice(&v.to_be_bytes());
    }
    /// Set MO, the Message Offset of an untagged header.
    pub fn set_mo(&mut self, v: u32) {
        self.buffer.as_mut()[field::MO].copy_from_slice(&v.to_be_bytes());
    }
}

/// The buffer model part of a DDP header: the fields after the two
/// control bytes, whose layout the T flag selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffer {
    /// Tagged buffer model (RFC 5041 §4.3).
    Tagged {
        /// Data Sink STag: the Steering Tag of the buffer the payload is
        /// placed into.
        stag: u32,
        /// Data Sink Tagged Offset: the byte address, in the STag's
        /// buffer, of the first payload byte.
        to: u64,
    },
    /// Untagged buffer model (RFC 5041 §4.4).
    Untagged {
        /// RsvdULP word: the Invalidate STag of a Send with Invalidate,
        /// otherwise reserved (0).
        inv_stag: u32,
        /// QN: the untagged queue (0 Send, 1 Read/Atomic Request,
        /// 2 Terminate, 3 Atomic Response).
        qn: u32,
        /// MSN: the message's number within its queue, from 1, modulo
        /// 2^32.
        msn: u32,
        /// MO: byte offset of this segment's payload within its message.
        mo: u32,
    },
}

/// A parsed DDP segment header with the RDMAP control field: everything
/// before the ULP payload of a DDP segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderRepr {
    /// L flag: last segment of the DDP message.
    pub last: bool,
    /// DV: the DDP Version (2 bits).
    pub ddp_version: u8,
    /// The 4 reserved bits of byte 0, as received (0 on emit normally).
    pub ddp_reserved: u8,
    /// RV: the RDMAP version (2 bits).
    pub rdmap_version: u8,
    /// The 2 reserved bits of the RDMAP control byte.
    pub rdmap_reserved: u8,
    /// The RDMA OpCode, 4 bits as received; the caller decodes it with
    /// [`super::rdmap::Opcode`] and rejects unknown values.
    pub opcode: u8,
    /// The buffer model fields: STag and TO (tagged) or RsvdULP, QN, MSN
    /// and MO (untagged).
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

    /// Length of this header on the wire in bytes: 14 tagged, 18
    /// untagged.
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
