//! Scaffold target: CRC32c and Terminate-code decoding over arbitrary
//! bytes. The receive-path and handshake targets join it once those APIs
//! exist.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = iwarp::crc::crc32c(data);
    if let [hi, lo, ..] = *data {
        let bits = u16::from_be_bytes([hi, lo]);
        if let Some(code) = iwarp::error::TermCode::from_bits(bits) {
            assert_eq!(code.to_bits(), bits, "Terminate code round trip");
        }
    }
});
