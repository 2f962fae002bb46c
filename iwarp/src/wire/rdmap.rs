//! RDMAP (RFC 5040 §4): opcodes, untagged queue numbers and the RDMA Read
//! Request header.
//!
//! The RDMAP control field itself (version, reserved bits, opcode) lives in
//! the second byte of the DDP header and is handled by [`super::ddp`].

use super::{Error, Result};

/// The RDMAP version this crate speaks (RFC 5040 §4.2).
pub const RDMAP_VERSION: u8 = 1;

/// Untagged queue number of Send messages (RFC 5040 §5.1, §6).
pub const QN_SEND: u32 = 0;
/// Untagged queue number of RDMA Read Request messages.
pub const QN_READ_REQUEST: u32 = 1;
/// Untagged queue number of Terminate messages.
pub const QN_TERMINATE: u32 = 2;

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
    /// Send with Invalidate.
    SendInvalidate = 4,
    /// Send with Solicited Event.
    SendSolicited = 5,
    /// Send with Solicited Event and Invalidate.
    SendSolicitedInvalidate = 6,
    /// Terminate (untagged, queue 2).
    Terminate = 7,
}

impl Opcode {
    /// The opcode for a raw 4-bit value; `None` for reserved values (8..=15).
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
            Self::ReadRequest => Some(QN_READ_REQUEST),
            Self::Terminate => Some(QN_TERMINATE),
            Self::Send
            | Self::SendInvalidate
            | Self::SendSolicited
            | Self::SendSolicitedInvalidate => Some(QN_SEND),
        }
    }

    /// Whether the message is one of the four Send variants.
    pub fn is_send(self) -> bool {
        matches!(
            self,
            Self::Send | Self::SendInvalidate | Self::SendSolicited | Self::SendSolicitedInvalidate
        )
    }

    /// Whether the message is a Send with Solicited Event.
    pub fn solicited(self) -> bool {
        matches!(self, Self::SendSolicited | Self::SendSolicitedInvalidate)
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
    /// Data Sink Tagged Offset.
    pub sink_to: u64,
    /// RDMA Read Message Size in bytes.
    pub size: u32,
    /// Data Source STag: the buffer to read at the responder.
    pub src_stag: u32,
    /// Data Source Tagged Offset.
    pub src_to: u64,
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
            assert_eq!(op.is_some(), raw < 8);
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
