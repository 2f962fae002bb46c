//! MPA deframing over arbitrary bytes: the resumable `RxDeframer::next`
//! alone and `next_whole` tried before each `next` must agree on every
//! ULPDU, CRC verdict and error, wherever the stream is cut. Also CRC32c
//! and Terminate-code decoding over the same bytes.
//!
//! Input: byte 0 selects the configuration (bit 0: markers, bit 1: CRC,
//! bit 2: a small `max_ulpdu`, bits 3-7: the cut sizes' seed); the rest
//! is the stream. CRC checks pass under `cfg(fuzzing)`, on both paths.
#![no_main]

use iwarp::mpa::framing::{FramingError, RxDeframer, RxItem};
use libfuzzer_sys::fuzz_target;

type Ulpdus = Vec<(Vec<u8>, bool)>;

/// Deframe `stream` cut into pieces of 1..=`max_cut` bytes (xorshift from
/// `seed`); with `whole`, `next_whole` first at every step.
fn deframe(
    crc: bool,
    markers: bool,
    max: usize,
    stream: &[u8],
    seed: u64,
    max_cut: usize,
    whole: bool,
) -> (Ulpdus, Option<FramingError>) {
    let mut rx = RxDeframer::new(crc, markers, max);
    let (mut out, mut cur) = (Vec::new(), Vec::new());
    let mut rng = seed | 1;
    let mut rest = stream;
    while !rest.is_empty() {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let k = (1 + (rng % max_cut as u64) as usize).min(rest.len());
        let mut chunk = &rest[..k];
        rest = &rest[k..];
        while !chunk.is_empty() {
            if whole {
                if let Some((n, u, ok)) = rx.next_whole(chunk) {
                    assert!(cur.is_empty(), "next_whole inside an FPDU");
                    assert!(n > 0 && n <= chunk.len());
                    out.push((u.to_vec(), ok));
                    chunk = &chunk[n..];
                    continue;
                }
            }
            match rx.next(chunk) {
                Ok((n, item)) => {
                    match item {
                        Some(RxItem::Data(d)) => cur.extend_from_slice(d),
                        Some(RxItem::End { crc_ok }) => {
                            out.push((std::mem::take(&mut cur), crc_ok))
                        }
                        _ => {}
                    }
                    chunk = &chunk[n..];
                }
                Err(e) => return (out, Some(e)),
            }
        }
    }
    (out, None)
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
    let (markers, crc) = (cfg & 1 != 0, cfg & 2 != 0);
    let max = if cfg & 4 != 0 {
        64
    } else {
        usize::from(u16::MAX)
    };
    let seed = u64::from(cfg >> 3);
    let max_cut = 1 + usize::from(cfg >> 3) * 61;
    assert_eq!(
        deframe(crc, markers, max, stream, seed, max_cut, true),
        deframe(crc, markers, max, stream, seed, max_cut, false),
        "next_whole and next disagree"
    );
});
