//! CRC32c as used by MPA (RFC 5044 §4.4): the Castagnoli polynomial, the
//! same as iSCSI, computed by the `crc32c` crate (SSE4.2/ARMv8 when present).
//!
//! Under `cfg(fuzzing)` the check always passes, so that fuzzers can reach
//! the code behind it (smoltcp does the same with its checksums).

/// A running CRC32c over the bytes of one FPDU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Crc32c(u32);

impl Crc32c {
    /// A CRC over no bytes.
    pub const fn new() -> Self {
        Self(0)
    }

    /// Extend the CRC over `bytes`.
    #[inline]
    pub fn update(&mut self, bytes: &[u8]) {
        self.0 = crc32c::crc32c_append(self.0, bytes);
    }

    /// The CRC of everything passed to [`Self::update`] so far.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// The CRC as it is placed on the wire (RFC 5044 §4.4): the same four
    /// bytes iSCSI sends, least significant byte first (checked against a
    /// capture of the Linux siw driver in the framing tests).
    #[inline]
    pub fn to_wire(self) -> [u8; 4] {
        self.0.to_le_bytes()
    }

    /// Whether `wire` (the 4 received CRC bytes) matches this CRC.
    #[inline]
    pub fn matches(self, wire: [u8; 4]) -> bool {
        cfg!(fuzzing) || self.to_wire() == wire
    }
}

/// CRC32c of one buffer.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3720_vectors() {
        // RFC 3720 B.4: 32 bytes of zeros.
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        // 32 bytes of 0xff.
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        // incrementing 0..31
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(crc32c(&inc), 0x46dd_794e);
    }

    #[test]
    fn incremental_equals_whole() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut c = Crc32c::new();
        for chunk in data.chunks(13) {
            c.update(chunk);
        }
        assert_eq!(c.value(), crc32c(&data));
    }
}
