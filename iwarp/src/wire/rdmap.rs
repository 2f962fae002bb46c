//! RDMAP (RFC 5040 §4): opcodes, untagged queue numbers and the RDMA Read
//! Request header; the RFC 7306 extensions: Immediate Data, and the Atomic
//! Request and Response headers with the atomic operations themselves.
//!
//! The RDMAP control field itself (version, reserved bits, opcode) lives in
//! the second byte of the DDP header and is handled by [`super::ddp`].

use super::{Error, Result};

/// The RDMAP version this crate speaks (RFC 5040 §4.2).
pub const RDMAP_VERSION: u8 = 1;

/// Untagged queue number of Send messages (RFC 5040 §5.1, §6).
pub const QN_SEND: u32 = 0;
/// Untagged queue number of RDMA Read Request messages (RFC 5040 §5.1);
/// RFC 7306 Atomic Requests use it too.
pub const QN_READ_REQUEST: u32 = 1;
/// Untagged queue number of Terminate messages (RFC 5040 §5.1).
pub const QN_TERMINATE: u32 = 2;
/// Untagged queue number of Atomic Response messages (RFC 7306 §5; Atomic
/// Requests share queue 1 with RDMA Read Requests).
pub const QN_ATOMIC_RESPONSE: u32 = 3;
/// The number of untagged queues RDMAP uses (QN 0 to 3); a segment for
/// any other QN is a DDP error.
pub const UNTAGGED_QUEUES: usize = 4;

/// Length of the data an Immediate Data message carries (RFC 7306 §6).
pub const IMMEDIATE_LEN: usize = 8;

/// An RDMAP message opcode (RFC 5040 §4.3, table in §4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// RDMA Write (tagged).
    Write = 0,
    /// RDMA Read Request (untagged, queue 1).
    ReadRequest = 1,
    /// RDMA Read Response (tagged).
    ReadResponse = 2,
    /// Send (untagged, queue 0).
    Send = 3,
    /// Send with Invalidate (untagged, queue 0): the RsvdULP word names an
    /// STag the receiver invalidates.
    SendInvalidate = 4,
    /// Send with Solicited Event (untagged, queue 0): the receiver raises
    /// a completion event even when armed for solicited events only.
    SendSolicited = 5,
    /// Send with Solicited Event and Invalidate (untagged, queue 0).
    SendSolicitedInvalidate = 6,
    /// Terminate (untagged, queue 2).
    Terminate = 7,
    /// Immediate Data (RFC 7306 §6; untagged, queue 0, 8 bytes).
    ImmediateData = 8,
    /// Immediate Data with Solicited Event (RFC 7306 §6; untagged, queue
    /// 0, 8 bytes).
    ImmediateDataSolicited = 9,
    /// Atomic Request (RFC 7306 §5; untagged, queue 1).
    AtomicRequest = 10,
    /// Atomic Response (RFC 7306 §5; untagged, queue 3).
    AtomicResponse = 11,
}

impl Opcode {
    /// The opcode for a raw 4-bit value; `None` for reserved values (12..=15).
    pub fn from_raw(raw: u8) -> Option<Self> {
        Some(match raw {
            0 => Self::Write,
            1 => Self::ReadRequest,
            2 => Self::ReadResponse,
            3 => Self::Send,
            4 => Self::SendInvalidate,
            5 => Self::SendSolicited,
            6 => Self::SendSolicitedInvalidate,
            7 => Self::Terminate,
            8 => Self::ImmediateData,
            9 => Self::ImmediateDataSolicited,
            10 => Self::AtomicRequest,
            11 => Self::AtomicResponse,
            _ => return None,
        })
    }

    /// Whether the message uses the DDP tagged buffer model (Write and
    /// Read Response); all others are untagged.
    pub fn is_tagged(self) -> bool {
        matches!(self, Self::Write | Self::ReadResponse)
    }

    /// The untagged queue number of the message, `None` for tagged ones.
    pub fn queue(self) -> Option<u32> {
        match self {
            Self::Write | Self::ReadResponse => None,
            Self::ReadRequest | Self::AtomicRequest => Some(QN_READ_REQUEST),
            Self::Terminate => Some(QN_TERMINATE),
            Self::AtomicResponse => Some(QN_ATOMIC_RESPONSE),
            Self::Send
            | Self::SendInvalidate
            | Self::SendSolicited
            | Self::SendSolicitedInvalidate
            | Self::ImmediateData
            | Self::ImmediateDataSolicited => Some(QN_SEND),
        }
    }

    /// Whether the message is one of the two Immediate Data variants.
    pub fn is_immediate(self) -> bool {
        matches!(self, Self::ImmediateData | Self::ImmediateDataSolicited)
    }

    /// Whether the message is one of the four Send variants.
    pub fn is_send(self) -> bool {
        matches!(
            self,
            Self::Send | Self::SendInvalidate | Self::SendSolicited | Self::SendSolicitedInvalidate
        )
    }

    /// Whether the message is a Send or Immediate Data with Solicited
    /// Event.
    pub fn solicited(self) -> bool {
        matches!(
            self,
            Self::SendSolicited | Self::SendSolicitedInvalidate | Self::ImmediateDataSolicited
        )
    }

    /// Whether the message carries an STag to invalidate (RsvdULP field).
    pub fn invalidates(self) -> bool {
        matches!(self, Self::SendInvalidate | Self::SendSolicitedInvalidate)
    }
}

/// The RDMA Read Request header (RFC 5040 §4.4), which follows the
/// untagged DDP header of a Read Request on queue 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    /// Data Sink STag: where the Read Response places the data.
    pub sink_stag: u32,
    /// Data Sink Tagged Offset: the byte address in the sink buffer where
    /// the first byte of the response goes.
    pub sink_to: u64,
    /// RDMA Read Message Size: the number of bytes to read (may be 0).
    pub size: u32,
    /// Data Source STag: the buffer to read at the responder.
    pub src_stag: u32,
    /// Data Source Tagged Offset: the byte address in the source buffer of
    /// the first byte to read.
    pub src_to: u64,
}

/// An atomic operation (RFC 7306 §5.1: the AOpCode of an Atomic Request).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AtomicOp {
    /// Add, in fields the mask bounds, and return the original value.
    FetchAdd = 0,
    /// Compare under a mask and, when equal, swap the masked bits; return
    /// the original value either way.
    CompareSwap = 2,
}

impl AtomicOp {
    /// The operation for a raw AOpCode; `None` for reserved values.
    pub fn from_raw(raw: u8) -> Option<Self> {
        match raw {
            0 => Some(Self::FetchAdd),
            2 => Some(Self::CompareSwap),
            _ => None,
        }
    }
}

/// The Atomic Request header (RFC 7306 §5, Figure 4), which follows the
/// untagged DDP header of an Atomic Request on queue 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicRequest {
    /// The AOpCode (low 4 bits of the first word), raw: a responder must
    /// reject codes it does not support, so they are kept for validation.
    pub aopcode: u8,
    /// Request Identifier: chosen by the requester and echoed in the
    /// Atomic Response, which it matches to the request.
    pub req_id: u32,
    /// Remote STag: the responder's buffer holding the 64-bit target.
    pub stag: u32,
    /// Remote Tagged Offset of the 64-bit target word in that buffer; it
    /// must be 8-byte aligned.
    pub to: u64,
    /// Add Data (FetchAdd) or Swap Data (CompareSwap).
    pub add_swap: u64,
    /// Add Mask (FetchAdd: the most significant bit of each field) or Swap
    /// Mask (CompareSwap: the bits swapped).
    pub add_swap_mask: u64,
    /// Compare Data (CompareSwap; 0 for FetchAdd).
    pub compare: u64,
    /// Compare Mask (CompareSwap; all ones for FetchAdd).
    pub compare_mask: u64,
}

mod atomic_field {
    use core::ops::Range;
    pub const AOPCODE: Range<usize> = 0..4;
    pub const REQ_ID: Range<usize> = 4..8;
    pub const STAG: Range<usize> = 8..12;
    pub const TO: Range<usize> = 12..20;
    pub const ADD_SWAP: Range<usize> = 20..28;
    pub const ADD_SWAP_MASK: Range<usize> = 28..36;
    pub const COMPARE: Range<usize> = 36..44;
    pub const COMPARE_MASK: Range<usize> = 44..52;
    pub const RESP_REQ_ID: Range<usize> = 0..4;
    pub const RESP_ORIG: Range<usize> = 4..12;
}

impl AtomicRequest {
    /// Wire length of the header.
    pub const LEN: usize = 52;

    /// A FetchAdd request (§5.1.1: Compare Data 0, Compare Mask all ones).
    pub fn fetch_add(req_id: u32, stag: u32, to: u64, add: u64, add_mask: u64) -> Self {
        Self {
            aopcode: AtomicOp::FetchAdd as u8,
            req_id,
            stag,
            to,
            add_swap: add,
            add_swap_mask: add_mask,
            compare: 0,
            compare_mask: u64::MAX,
        }
    }

    /// A CompareSwap request: `(compare, compare_mask)`, `(swap, swap_mask)`.
    pub fn compare_swap(
        req_id: u32,
        stag: u32,
        to: u64,
        (compare, compare_mask): (u64, u64),
        (swap, swap_mask): (u64, u64),
    ) -> Self {
        Self {
            aopcode: AtomicOp::CompareSwap as u8,
            req_id,
            stag,
            to,
            add_swap: swap,
            add_swap_mask: swap_mask,
            compare,
            compare_mask,
        }
    }

    /// The operation, `None` for a reserved AOpCode.
    pub fn op(&self) -> Option<AtomicOp> {
        AtomicOp::from_raw(self.aopcode)
    }

    /// Parse the header from the bytes after the DDP header. The 28
    /// reserved bits before the AOpCode are ignored (RFC 5040 §4: a
    /// receiver ignores reserved fields).
    pub fn parse(b: &[u8]) -> Result<Self> {
        use atomic_field as f;
        Ok(Self {
            aopcode: (be32(b, f::AOPCODE)? & 0xf) as u8,
            req_id: be32(b, f::REQ_ID)?,
            stag: be32(b, f::STAG)?,
            to: be64(b, f::TO)?,
            add_swap: be64(b, f::ADD_SWAP)?,
            add_swap_mask: be64(b, f::ADD_SWAP_MASK)?,
            compare: be64(b, f::COMPARE)?,
            compare_mask: be64(b, f::COMPARE_MASK)?,
        })
    }

    /// Emit into `buf[..LEN]`, reserved bits zero.
    ///
    /// # Panics
    /// If `buf` is shorter than [`Self::LEN`].
    pub fn emit(&self, buf: &mut [u8]) {
        use atomic_field as f;
        buf[f::AOPCODE].copy_from_slice(&u32::from(self.aopcode & 0xf).to_be_bytes());
        buf[f::REQ_ID].copy_from_slice(&self.req_id.to_be_bytes());
        buf[f::STAG].copy_from_slice(&self.stag.to_be_bytes());
        buf[f::TO].copy_from_slice(&self.to.to_be_bytes());
        buf[f::ADD_SWAP].copy_from_slice(&self.add_swap.to_be_bytes());
        buf[f::ADD_SWAP_MASK].copy_from_slice(&self.add_swap_mask.to_be_bytes());
        buf[f::COMPARE].copy_from_slice(&self.compare.to_be_bytes());
        buf[f::COMPARE_MASK].copy_from_slice(&self.compare_mask.to_be_bytes());
    }

    /// The value the target holds after the operation, given the value it
    /// held before (`None` for a reserved AOpCode).
    pub fn apply(&self, orig: u64) -> Option<u64> {
        Some(match self.op()? {
            AtomicOp::FetchAdd => masked_add(orig, self.add_swap, self.add_swap_mask),
            AtomicOp::CompareSwap => {
                if (orig ^ self.compare) & self.compare_mask == 0 {
                    (orig & !self.add_swap_mask) | (self.add_swap & self.add_swap_mask)
                } else {
                    orig
                }
            }
        })
    }
}

/// RFC 7306 §5.1.1's masked addition: `a + b` where every bit set in
/// `mask` is the most significant bit of a field, whose carry out is
/// dropped. Adding with those bits cleared lets each field's carry land
/// in its top bit and go no further; the top bits are then the sum
/// without carry-out of the operands' top bits and that carry.
pub fn masked_add(a: u64, b: u64, mask: u64) -> u64 {
    ((a & !mask).wrapping_add(b & !mask)) ^ ((a ^ b) & mask)
}

/// The Atomic Response header (RFC 7306 §5, Figure 6), which follows the
/// untagged DDP header of an Atomic Response on queue 3.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicResponse {
    /// The Request Identifier of the request answered.
    pub req_id: u32,
    /// The value the target held before the operation.
    pub orig: u64,
}

impl AtomicResponse {
    /// Wire length of the header.
    pub const LEN: usize = 12;

    /// Parse the header from the bytes after the DDP header.
    pub fn parse(b: &[u8]) -> Result<Self> {
        Ok(Self {
            req_id: be32(b, atomic_field::RESP_REQ_ID)?,
            orig: be64(b, atomic_field::RESP_ORIG)?,
        })
    }

    /// Emit into `buf[..LEN]`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`Self::LEN`].
    pub fn emit(&self, buf: &mut [u8]) {
        buf[atomic_field::RESP_REQ_ID].copy_from_slice(&self.req_id.to_be_bytes());
        buf[atomic_field::RESP_ORIG].copy_from_slice(&self.orig.to_be_bytes());
    }
}

mod field {
    use core::ops::Range;
    pub const SINK_STAG: Range<usize> = 0..4;
    pub const SINK_TO: Range<usize> = 4..12;
    pub const SIZE: Range<usize> = 12..16;
    pub const SRC_STAG: Range<usize> = 16..20;
    pub const SRC_TO: Range<usize> = 20..28;
}

pub(crate) fn be32(b: &[u8], r: core::ops::Range<usize>) -> Result<u32> {
    let s = b.get(r).ok_or(Error::Truncated)?;
    let a: [u8; 4] = s.try_into().map_err(|_| Error::Truncated)?;
    Ok(u32::from_be_bytes(a))
}

pub(crate) fn be64(b: &[u8], r: core::ops::Range<usize>) -> Result<u64> {
    let s = b.get(r).ok_or(Error::Truncated)?;
    let a: [u8; 8] = s.try_into().map_err(|_| Error::Truncated)?;
    Ok(u64::from_be_bytes(a))
}

impl ReadRequest {
    /// Length of the header on the wire.
    pub const LEN: usize = 28;

    /// Parse the 28-byte header; `Truncated` if `bytes` is shorter.
    /// Trailing bytes are ignored.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < Self::LEN {
            return Err(Error::Truncated);
        }
        Ok(Self {
            sink_stag: be32(bytes, field::SINK_STAG)?,
            sink_to: be64(bytes, field::SINK_TO)?,
            size: be32(bytes, field::SIZE)?,
            src_stag: be32(bytes, field::SRC_STAG)?,
            src_to: be64(bytes, field::SRC_TO)?,
        })
    }

    /// Length of the header on the wire ([`Self::LEN`]).
    pub fn buffer_len(&self) -> usize {
        Self::LEN
    }

    /// Write the header into `buf[..28]`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`Self::LEN`].
    pub fn emit(&self, buf: &mut [u8]) {
        buf[field::SINK_STAG].copy_from_slice(&self.sink_stag.to_be_bytes());
        buf[field::SINK_TO].copy_from_slice(&self.sink_to.to_be_bytes());
        buf[field::SIZE].copy_from_slice(&self.size.to_be_bytes());
        buf[field::SRC_STAG].copy_from_slice(&self.src_stag.to_be_bytes());
        buf[field::SRC_TO].copy_from_slice(&self.src_to.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcode_properties() {
        for raw in 0..16u8 {
            let op = Opcode::from_raw(raw);
            assert_eq!(op.is_some(), raw < 12);
            if let Some(op) = op {
                assert_eq!(op as u8, raw);
                assert_eq!(op.is_tagged(), op.queue().is_none());
            }
        }
        assert_eq!(Opcode::ReadRequest.queue(), Some(QN_READ_REQUEST));
        assert_eq!(Opcode::Terminate.queue(), Some(QN_TERMINATE));
        assert_eq!(Opcode::SendSolicitedInvalidate.queue(), Some(QN_SEND));
        assert!(Opcode::SendSolicitedInvalidate.solicited());
        assert!(Opcode::SendSolicitedInvalidate.invalidates());
        assert!(!Opcode::SendSolicited.invalidates());
        assert!(Opcode::SendInvalidate.is_send());
        assert!(!Opcode::ReadRequest.is_send());
        assert!(Opcode::ReadResponse.is_tagged());
        assert_eq!(Opcode::ImmediateData.queue(), Some(QN_SEND));
        assert_eq!(Opcode::AtomicRequest.queue(), Some(QN_READ_REQUEST));
        assert_eq!(Opcode::AtomicResponse.queue(), Some(QN_ATOMIC_RESPONSE));
        assert!(Opcode::ImmediateDataSolicited.solicited());
        assert!(Opcode::ImmediateDataSolicited.is_immediate());
        assert!(!Opcode::ImmediateData.is_send());
    }

    /// RFC 7306 §5.1.1's pseudocode for the masked FetchAdd, bit by bit.
    fn masked_add_by_bits(orig: u64, add: u64, mask: u64) -> u64 {
        let mut out = 0u64;
        let mut carry = 0u64;
        for bit in 0..64 {
            let sum = carry + ((orig >> bit) & 1) + ((add >> bit) & 1);
            out |= (sum & 1) << bit;
            carry = if (mask >> bit) & 1 == 1 { 0 } else { sum >> 1 };
        }
        out
    }

    #[test]
    fn masked_add_matches_the_rfc_bit_by_bit() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let masks = [
            0,
            u64::MAX,
            1 << 63,
            0x8080_8080_8080_8080,
            0x8000_0000_8000_0000,
        ];
        for i in 0..20_000 {
            let (a, b) = (next(), next());
            let m = if i % 2 == 0 {
                masks[i / 2 % masks.len()]
            } else {
                next()
            };
            assert_eq!(
                masked_add(a, b, m),
                masked_add_by_bits(a, b, m),
                "{a:#x} {b:#x} {m:#x}"
            );
        }
        // Mask 0: a plain 64-bit add, wrapping.
        assert_eq!(masked_add(u64::MAX, 2, 0), 1);
        // Two 32-bit fields: the low field's carry does not reach the high one.
        assert_eq!(
            masked_add(0x0000_0001_ffff_ffff, 1, 0x8000_0000_8000_0000),
            0x0000_0001_0000_0000
        );
    }

    #[test]
    fn atomic_request_round_trip_and_operations() {
        let req = AtomicRequest {
            aopcode: AtomicOp::CompareSwap as u8,
            req_id: 0x0102_0304,
            stag: 0xaabb_ccdd,
            to: 0x1122_3344_5566_7788,
            add_swap: 0xffff_0000_ffff_0000,
            add_swap_mask: 0x0000_ffff_ffff_0000,
            compare: 0x1234,
            compare_mask: 0xffff,
        };
        let mut b = [0u8; AtomicRequest::LEN];
        req.emit(&mut b);
        assert_eq!(&b[..4], &[0, 0, 0, 2]);
        assert_eq!(&b[4..8], &[1, 2, 3, 4]);
        assert_eq!(&b[12..20], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(AtomicRequest::parse(&b), Ok(req));
        assert_eq!(AtomicRequest::parse(&b[..51]), Err(Error::Truncated));
        // Reserved bits above the AOpCode are ignored.
        b[0] = 0xff;
        assert_eq!(AtomicRequest::parse(&b), Ok(req));
        // Compare under the mask: equal in the low 16 bits, so the masked
        // bits are swapped.
        assert_eq!(
            req.apply(0x9999_0000_0000_1234),
            Some(0x9999_0000_ffff_1234)
        );
        assert_eq!(
            req.apply(0x9999_0000_0000_1235),
            Some(0x9999_0000_0000_1235)
        );
        let add = AtomicRequest {
            aopcode: AtomicOp::FetchAdd as u8,
            add_swap: 5,
            add_swap_mask: 0,
            ..req
        };
        assert_eq!(add.apply(10), Some(15));
        assert_eq!(AtomicRequest { aopcode: 1, ..req }.apply(10), None);
        let resp = AtomicResponse {
            req_id: 7,
            orig: 0x0102_0304_0506_0708,
        };
        let mut r = [0u8; AtomicResponse::LEN];
        resp.emit(&mut r);
        assert_eq!(r, [0, 0, 0, 7, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(AtomicResponse::parse(&r), Ok(resp));
    }

    /// The Read Request body of frame 5 of siw-rping.pcapng (after the
    /// 18-byte untagged DDP header `41 41 ...`).
    #[test]
    fn parse_siw_read_request() {
        let bytes = [
            0x33, 0x1d, 0xed, 0x00, 0x00, 0x00, 0x55, 0x96, 0xa5, 0x4c, 0x9b, 0x10, 0x00, 0x00,
            0x00, 0x40, 0xc2, 0x05, 0x31, 0x00, 0x00, 0x00, 0x56, 0x3d, 0x2e, 0xbf, 0x4e, 0x30,
        ];
        let rr = ReadRequest::parse(&bytes).unwrap();
        assert_eq!(
            rr,
            ReadRequest {
                sink_stag: 0x331d_ed00,
                sink_to: 0x5596_a54c_9b10,
                size: 64,
                src_stag: 0xc205_3100,
                src_to: 0x563d_2ebf_4e30,
            }
        );
        let mut out = [0xa5; 28];
        rr.emit(&mut out);
        assert_eq!(out, bytes);
        assert_eq!(ReadRequest::parse(&bytes[..27]), Err(Error::Truncated));
    }
}
