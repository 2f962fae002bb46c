//! MPA markers (RFC 5044 §4.3).
//!
//! When markers are negotiated for a direction, a 4-byte marker is placed
//! every [`MARKER_INTERVAL`] octets of that direction's TCP stream in full
//! operation phase. A marker is 16 reserved bits (sent as 0) followed by the
//! 16-bit FPDUPTR, the number of octets from the start of the FPDU the
//! marker lies in (its ULPDU_Length field) to the marker. Placement and the
//! FPDUPTR arithmetic belong to `mpa::framing`; this module is only the
//! 4-byte format.

use super::{Error, Result};

/// Distance between markers in the TCP stream, in octets.
pub const MARKER_INTERVAL: usize = 512;
/// Length of a marker on the wire, in octets (RFC 5044 §4.3).
pub const MARKER_LEN: usize = 4;

/// An MPA marker (RFC 5044 §4.3): 16 reserved bits and the 16-bit
/// FPDUPTR, big endian.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MarkerRepr {
    /// The 16 reserved bits, as received (0 on emit normally).
    pub reserved: u16,
    /// FPDUPTR: the marker's stream position minus that of the start of
    /// its FPDU.
    pub fpdu_ptr: u16,
}

impl MarkerRepr {
    /// Parse a marker; `Truncated` if fewer than 4 bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        match bytes {
            [a, b, c, d, ..] => Ok(Self {
                reserved: u16::from_be_bytes([*a, *b]),
                fpdu_ptr: u16::from_be_bytes([*c, *d]),
            }),
            _ => Err(Error::Truncated),
        }
    }

    /// Length on the wire ([`MARKER_LEN`]).
    pub fn buffer_len(&self) -> usize {
        MARKER_LEN
    }

    /// Write the marker into `buf[..4]`.
    ///
    /// # Panics
    /// If `buf` is shorter than 4 bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[..2].copy_from_slice(&self.reserved.to_be_bytes());
        buf[2..4].copy_from_slice(&self.fpdu_ptr.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let m = MarkerRepr {
            reserved: 0,
            fpdu_ptr: 0x01f6,
        };
        let mut out = [0xa5; 4];
        m.emit(&mut out);
        assert_eq!(out, [0, 0, 0x01, 0xf6]);
        assert_eq!(MarkerRepr::parse(&out), Ok(m));
        assert_eq!(MarkerRepr::parse(&out[..3]), Err(Error::Truncated));
    }
}
