//! The receive path of an established QP: arbitrary bytes as the peer's
//! FPDU stream, cut at arbitrary points. Nothing may panic, the peer may
//! never write outside the regions it was given, and a QP that saw a
//! violation must end in Error with a Terminate queued.
//!
//! Input: byte 0 selects the configuration (bit 0: markers toward the
//! victim, bit 1: CRC, bit 2: strict reserved bits, bits 3-7: chunk size
//! seed); the rest is the stream. CRC checks pass under `cfg(fuzzing)`.
#![no_main]

use iwarp::mem::Access;
use iwarp::mpa::handshake::Config;
use iwarp::qp::{QpConfig, QpState, RecvWr, Sge};
use iwarp::testing::{Chunking, End, Pair};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, stream)) = data.split_first() else { return };
    let qp = QpConfig { strict_reserved: cfg & 4 != 0, rx_max_ulpdu: 4096, ..QpConfig::default() };
    let chunk = 1 + usize::from(cfg >> 3) * 97;
    let a = Config { crc: cfg & 2 != 0, ..Config::default() };
    let b = Config { markers: cfg & 1 != 0, ird: 4, ..Config::default() };
    let mut p = Pair::connected(qp, Chunking::random(chunk, u64::from(cfg)), a, b);
    // The victim's memory: a writable/readable region, a receive buffer,
    // and a guard region no remote access may touch.
    let open = p.b.reg(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ);
    let recv = p.b.reg(2048, Access::LOCAL_WRITE);
    let guard = p.b.reg_with(&[0x5a; 4096], Access::LOCAL_WRITE);
    for i in 0..4 {
        let sgl = [Sge { addr: recv.iova + i * 512, len: 512, lkey: recv.lkey }];
        p.b.ctx.post_recv(p.b.qp, &RecvWr { wr_id: i, sgl: &sgl }).unwrap();
    }
    let _ = open;
    p.inject(End::B, stream);
    p.drive();
    assert!(p.b.bytes(&guard).iter().all(|&b| b == 0x5a), "guard region written");
    let terminated = p.b.events.iter().any(|e| matches!(e, iwarp::qp::QpEvent::LocalTerminate(_)));
    if terminated {
        assert_eq!(p.b.state(), QpState::Error);
    }
});
