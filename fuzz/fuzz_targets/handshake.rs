//! The MPA handshake, both roles: arbitrary bytes as the peer's request
//! (to a responder) and as the peer's reply (to an initiator), cut at
//! arbitrary points. Nothing may panic; a handshake that consumed a frame
//! either established, was rejected, or failed with an error event.
//!
//! Input: byte 0 selects the configuration (revision, CRC, markers, P2P
//! and the RTR set), byte 1 the chunk size; the rest is the stream.
#![no_main]

use iwarp::mpa::handshake::{Config, Event, Handshake, RtrSet};
use iwarp::time::{Duration, Instant};
use libfuzzer_sys::fuzz_target;

fn config(c: u8) -> Config {
    Config {
        revision: 1 + (c & 1),
        crc: c & 2 != 0,
        markers: c & 4 != 0,
        p2p: c & 8 != 0,
        rtr: RtrSet { send: c & 16 != 0, write: c & 32 != 0, read: c & 64 != 0 },
        ird: u16::from(c >> 7) + 1,
        ..Config::default()
    }
}

fn run(hs: &mut Handshake, stream: &[u8], chunk: usize) {
    let mut out = [0u8; 600];
    let mut now = Instant::ZERO;
    for piece in stream.chunks(chunk) {
        let mut off = 0;
        while off < piece.len() {
            match hs.handle_input(&piece[off..], now) {
                Ok(0) | Err(_) => break,
                Ok(n) => off += n,
            }
        }
        while let Some(ev) = hs.poll_event() {
            if let Event::ConnectRequest(req) = ev {
                let _ = if req.private_data.first() == Some(&0xff) { hs.reject(b"no") } else { hs.accept(b"ok") };
            }
        }
        while hs.poll_transmit(&mut out) > 0 {}
        now = now + Duration::from_millis(1);
    }
    hs.handle_timeout(now + Duration::from_secs(3600));
    while hs.poll_event().is_some() {}
    assert!(hs.poll_timeout().is_none() || hs.is_done());
}

fuzz_target!(|data: &[u8]| {
    let [c, k, stream @ ..] = data else { return };
    let chunk = 1 + usize::from(*k);
    let mut responder = Handshake::responder(config(*c), Instant::ZERO);
    run(&mut responder, stream, chunk);
    if let Ok(mut initiator) = Handshake::initiator(config(c.rotate_left(3)), b"fuzz", Instant::ZERO) {
        run(&mut initiator, stream, chunk);
    }
});
