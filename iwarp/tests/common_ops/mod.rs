//! Helpers shared by the operation-matrix tests (`tests/pair.rs`).
#![allow(dead_code)]

use iwarp::cq::{WcOpcode, WcStatus, WorkCompletion};
use iwarp::mem::{Access, MrInfo};
use iwarp::mpa::handshake::{Config, Negotiated};
use iwarp::qp::{QpEvent, RecvWr, SendOp, SendWr, Sge};
use iwarp::testing::{End, Side};

/// Local write plus both remote rights.
pub fn rw() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ
}

/// The other end.
pub fn other(e: End) -> End {
    match e {
        End::A => End::B,
        End::B => End::A,
    }
}

/// `len` pseudo-random bytes from `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// An SGE of `len` bytes at offset `off` of `mr`.
pub fn sge(mr: &MrInfo, off: usize, len: usize) -> Sge {
    Sge {
        addr: mr.iova + off as u64,
        len: len as u32,
        lkey: mr.lkey,
    }
}

/// An MPA configuration.
pub fn mpa(revision: u8, crc: bool, markers: bool) -> Config {
    Config {
        revision,
        crc,
        markers,
        ..Config::default()
    }
}

/// A plain Send.
pub const SEND: SendOp = SendOp::Send {
    solicited: false,
    invalidate: None,
};

/// Post a send-queue work request; panics if refused.
pub fn post_send(s: &mut Side, wr_id: u64, op: SendOp, sgl: &[Sge], signaled: bool) {
    s.ctx
        .post_send(
            s.qp,
            &SendWr {
                wr_id,
                op,
                sgl,
                signaled,
            },
        )
        .expect("post_send");
}

/// Post a receive; panics if refused.
pub fn post_recv(s: &mut Side, wr_id: u64, sgl: &[Sge]) {
    s.ctx
        .post_recv(s.qp, &RecvWr { wr_id, sgl })
        .expect("post_recv");
}

/// The comparable part of a completion.
pub type WcKey = (u64, WcStatus, WcOpcode, u32);

/// The comparable parts of completions.
pub fn keys(wcs: &[WorkCompletion]) -> Vec<WcKey> {
    wcs.iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect()
}

/// Drain `s`'s completions and expect exactly one successful one.
pub fn one_wc(s: &mut Side, wr_id: u64, opcode: WcOpcode, byte_len: Option<u32>) -> WorkCompletion {
    let wcs = s.completions();
    assert_eq!(wcs.len(), 1, "{wcs:?} events {:?}", s.events);
    let wc = wcs[0];
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (wr_id, WcStatus::Success, opcode),
        "{wc:?} events {:?}",
        s.events
    );
    if let Some(n) = byte_len {
        assert_eq!(wc.byte_len, n, "{wc:?}");
    }
    wc
}

/// The `negotiated` of the (single) `Established` event of `s`.
pub fn established(s: &Side) -> (Negotiated, Vec<u8>) {
    let mut found = s.events.iter().filter_map(|e| match e {
        QpEvent::Established {
            negotiated,
            private_data,
        } => Some((negotiated.clone(), private_data.clone())),
        _ => None,
    });
    let first = found.next().expect("an Established event");
    assert!(found.next().is_none(), "two Established events");
    first
}
