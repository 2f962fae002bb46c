//! MPA deframing over arbitrary bytes: the resumable `RxDeframer::next`
//! alone and `next_whole` tried before each `next` must agree on every
//! ULPDU, CRC verdict and error, wherever the stream is cut. Also CRC32c
//! and Terminate-code decoding over the same bytes.
//!
//! Input: byte 0 selects the configuration (bit 0: markers, bit 1: CRC,
//! bit 2: a small `max_ulpdu`, bits 3-7: the cut sizes' seed); the rest
//! is the stream. CRC checks pass under `cfg(fuzzing)`, on both paths.
#![no_main]

use iwarp::mpa::framing::RxDeframer;
use iwarp::testing::{deframe_all, Deframed};
use libfuzzer_sys::fuzz_target;

/// The stream cut into pieces of 1..=`max_cut` bytes (xorshift from
/// `seed`), deframed with or without `next_whole`.
fn deframe(cfg: u8, stream: &[u8], whole: bool) -> Deframed {
    let (markers, crc) = (cfg & 1 != 0, cfg & 2 != 0);
    let max = if cfg & 4 != 0 {
        64
    } else {
        usize::from(u16::MAX)
    };
    let max_cut = 1 + u64::from(cfg >> 3) * 61;
    let mut rng = u64::from(cfg >> 3) | 1;
    let cut = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        1 + (rng % max_cut) as usize
    };
    deframe_all(&mut RxDeframer::new(crc, markers, max), stream, cut, whole)
}

fuzz_target!(|data: &[u8]| {
    let _ = iwarp::crc::crc32c(data);
    if let [hi, lo, ..] = *data {
        let bits = u16::from_be_bytes([hi, lo]);
        if let Some(code) = iwarp::error::TermCode::from_bits(bits) {
            assert_eq!(code.to_bits(), bits, "Terminate code round trip");
        }
    }
    let Some((&cfg, stream)) = data.split_first() else {
        return;
    };
    assert_eq!(
        deframe(cfg, stream, true),
        deframe(cfg, stream, false),
        "next_whole and next disagree"
    );
});
