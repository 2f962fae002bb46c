//! CRC32c as used by MPA (RFC 5044 §4.4): the Castagnoli polynomial, the
//! same as iSCSI.
//!
//! Two crates compute it, each where it is faster. `crc-fast` folds long
//! spans with carry-less multiplication (PCLMULQDQ or VPCLMULQDQ on x86,
//! PMULL on ARMv8): a whole 1448-byte FPDU costs a third to a half of
//! what it costs the `crc32c` crate, whose three-way `crc32` instruction
//! loop runs in parallel only over whole 768-byte blocks. Short spans
//! (FPDU headers, marker-split pieces, small messages) go to `crc32c`,
//! whose serial loop starts faster. `cargo bench -p iwarp-bench --bench
//! core -- crc` times both over the sizes MPA sees.
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

    /// A CRC over bytes whose CRC is `crc`, to be extended.
    pub const fn from_value(crc: u32) -> Self {
        Self(crc)
    }

    /// Extend the CRC over `bytes`.
    #[inline]
    pub fn update(&mut self, bytes: &[u8]) {
        self.0 = append(self.0, bytes);
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

/// Spans from this length on go to `crc-fast`, shorter ones to `crc32c`.
/// Below it the two are within 15 % of each other, `crc32c` mostly
/// ahead; from it on `crc-fast` folds and is 2–4 times as fast (`cargo
/// bench -p iwarp-bench --bench core -- crc`).
pub const FOLD_FROM: usize = 448;

/// CRC32c of one buffer.
pub fn crc32c(bytes: &[u8]) -> u32 {
    append(0, bytes)
}

/// The CRC of the bytes behind `crc` followed by `bytes`.
#[inline]
fn append(crc: u32, bytes: &[u8]) -> u32 {
    if bytes.len() >= FOLD_FROM {
        folded_append(crc, bytes)
    } else {
        crc32c::crc32c_append(crc, bytes)
    }
}

/// The CRC of the bytes behind `crc` followed by `bytes`, by `crc-fast`
/// whatever the length.
#[inline]
pub fn folded_append(crc: u32, bytes: &[u8]) -> u32 {
    // The digest's state is the register before the final inversion,
    // which is the inverted CRC.
    let mut d =
        crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(bytes);
    d.finalize() as u32
}

/// The CRC of the bytes behind `crc` followed by `bytes`, by `crc32c`
/// whatever the length.
#[inline]
pub fn serial_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
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

    #[test]
    fn both_crates_agree_at_every_length_and_start() {
        let data: Vec<u8> = (0..4200u32).map(|i| (i * 131 + 7) as u8).collect();
        for len in (0..600).chain([1023, 1024, 1447, 1448, 1456, 3440, 4096]) {
            for off in [0, 1, 3, 8, 13] {
                let b = &data[off..off + len];
                for crc in [0, 1, 0xffff_ffff, 0x1234_5678] {
                    assert_eq!(
                        folded_append(crc, b),
                        serial_append(crc, b),
                        "len {len} off {off} crc {crc:#x}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_long_span_split_at_the_threshold_gives_the_whole_crc() {
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 29) as u8).collect();
        for cut in [1, FOLD_FROM - 1, FOLD_FROM, FOLD_FROM + 1, 1500] {
            let mut c = Crc32c::new();
            c.update(&data[..cut]);
            c.update(&data[cut..]);
            assert_eq!(c.value(), crc32c(&data), "cut at {cut}");
        }
    }
}
