//! Negative tests: one per validation rule of RFC 5040 §7 / RFC 5041 §7 /
//! RFC 5044 §8 (and the MPA connection setup).
//!
//! A (the initiator) plays a hostile peer: its QP sends nothing itself; the
//! test crafts FPDUs with a fresh `TxFramer` and injects them into B (the
//! responder, the victim). Each test checks that B reports the violation
//! with the expected Terminate code and moves to Error, that the Terminate
//! on the wire carries the same code (and the offending headers), that A
//! sees it, that B's work requests are flushed, and that no memory outside
//! the target changed.

mod common;

use common::*;
use iwarp::cq::{WcStatus, WorkCompletion};
use iwarp::error::{codes, TermCode};
use iwarp::mem::{Access, MrInfo};
use iwarp::mpa::handshake::{Config, HandshakeError, RtrSet, RtrType};
use iwarp::qp::{QpConfig, QpEvent, QpState, RecvWr, SendOp, SendWr, Sge};
use iwarp::testing::{Chunking, End, Pair};
use iwarp::time::{Duration, Instant};
use iwarp::wire::ddp::HeaderRepr;
use iwarp::wire::mpa::{FrameKind, FrameRepr};
use iwarp::wire::rdmap::{AtomicRequest, AtomicResponse, Opcode, ReadRequest};

const RECV0: u64 = 100;
const SEND_WR: u64 = 200;
const WRITE_WR: u64 = 201;
const RBUF_LEN: u32 = 64;
const TARGET_LEN: usize = 1024;
const TARGET_FILL: u8 = 0xaa;
const GUARD_FILL: u8 = 0x55;

/// What the fixture sets up.
struct Opts {
    qp: QpConfig,
    a: Config,
    b: Config,
    /// Receive WRs B posts (0..=2).
    recvs: usize,
    /// B posts a Send and an RDMA Write (which never leave: B sends only
    /// after it received an FPDU, and the first one is the violation).
    sends: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            qp: QpConfig::default(),
            a: Config::default(),
            b: Config::default(),
            recvs: 2,
            sends: true,
        }
    }
}

/// A connected pair with B's memory laid out as
/// `guard_lo | target | guard_hi | rbuf0 | rbuf1` (separate regions).
struct Fx {
    p: Pair,
    guard_lo: MrInfo,
    target: MrInfo,
    guard_hi: MrInfo,
    rbuf: [MrInfo; 2],
    posted: Vec<u64>,
    crafter: Crafter,
    /// B inserts markers into what it sends (A asked for them).
    b_tx_markers: bool,
    crc: bool,
}

impl Fx {
    fn new(o: Opts) -> Self {
        let p = Pair::connected(o.qp.clone(), Chunking::whole(1 << 16), o.a, o.b);
        Self::with_pair(p, o.recvs, o.sends)
    }

    fn with_pair(mut p: Pair, recvs: usize, sends: bool) -> Self {
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let guard_lo = p.b.reg_with(&[GUARD_FILL; 64], all);
        let target = p.b.reg_with(&[TARGET_FILL; TARGET_LEN], all);
        let guard_hi = p.b.reg_with(&[GUARD_FILL; 64], all);
        let rbuf = [
            p.b.reg(RBUF_LEN as usize, Access::LOCAL_WRITE),
            p.b.reg(RBUF_LEN as usize, Access::LOCAL_WRITE),
        ];
        let mut posted = Vec::new();
        for (i, r) in rbuf.iter().enumerate().take(recvs) {
            let id = RECV0 + i as u64;
            p.b.ctx
                .post_recv(
                    p.b.qp,
                    &RecvWr {
                        wr_id: id,
                        sgl: &[Sge {
                            addr: r.iova,
                            len: RBUF_LEN,
                            lkey: r.lkey,
                        }],
                    },
                )
                .unwrap();
            posted.push(id);
        }
        if sends {
            let src = p.b.reg_with(&[7; 32], Access::NONE);
            let sge = [Sge {
                addr: src.iova,
                len: 32,
                lkey: src.lkey,
            }];
            for (id, op) in [
                (
                    SEND_WR,
                    SendOp::Send {
                        solicited: false,
                        invalidate: None,
                    },
                ),
                (
                    WRITE_WR,
                    SendOp::Write {
                        remote_addr: 0x1000,
                        rkey: 0x100,
                    },
                ),
            ] {
                p.b.ctx
                    .post_send(
                        p.b.qp,
                        &SendWr {
                            wr_id: id,
                            op,
                            sgl: &sge,
                            signaled: true,
                        },
                    )
                    .unwrap();
                posted.push(id);
            }
        }
        let neg = p.a.ctx.qp(p.a.qp).and_then(|q| q.negotiated().cloned());
        let (crc, a_markers_tx, a_markers_rx) = neg.map_or((false, false, false), |n| {
            (n.crc, n.markers_tx, n.markers_rx)
        });
        Self {
            p,
            guard_lo,
            target,
            guard_hi,
            rbuf,
            posted,
            crafter: Crafter::new(crc, a_markers_tx),
            b_tx_markers: a_markers_rx,
            crc,
        }
    }

    /// Frame each ULPDU into one FPDU.
    fn frame(&mut self, ulpdus: &[Vec<u8>]) -> Vec<u8> {
        ulpdus.iter().flat_map(|u| self.crafter.fpdu(u)).collect()
    }

    /// Inject raw stream bytes into B and drive.
    fn inject_raw(&mut self, bytes: &[u8]) {
        self.p.inject(End::B, bytes);
        self.p.drive();
    }

    /// Frame, inject into B, drive.
    fn inject(&mut self, ulpdus: &[Vec<u8>]) {
        let bytes = self.frame(ulpdus);
        self.inject_raw(&bytes);
    }

    /// Frame one ULPDU, inject into B, drive.
    fn inject_one(&mut self, ulpdu: &[u8]) {
        let bytes = self.crafter.fpdu(ulpdu);
        self.inject_raw(&bytes);
    }

    fn bytes(&self, mr: &MrInfo) -> Vec<u8> {
        self.p.b.bytes(mr).to_vec()
    }

    /// Guards unchanged; the target unchanged outside `target_range`
    /// (offsets), receive buffers unchanged unless listed.
    fn assert_memory(&self, target_range: core::ops::Range<usize>, changed_rbufs: &[usize]) {
        assert_eq!(self.bytes(&self.guard_lo), vec![GUARD_FILL; 64]);
        assert_eq!(self.bytes(&self.guard_hi), vec![GUARD_FILL; 64]);
        let t = self.bytes(&self.target);
        for (i, &b) in t.iter().enumerate() {
            if !target_range.contains(&i) {
                assert_eq!(b, TARGET_FILL, "target byte {i} changed");
            }
        }
        for (i, r) in self.rbuf.iter().enumerate() {
            if !changed_rbufs.contains(&i) {
                assert_eq!(self.bytes(r), vec![0; RBUF_LEN as usize], "rbuf{i} changed");
            }
        }
    }

    /// No memory of B changed.
    fn assert_memory_untouched(&self) {
        self.assert_memory(0..0, &[]);
    }

    /// Checks 1–4 of a violation: B's event and state, the Terminate on
    /// the wire (code, copied DDP header and segment length, copied Read
    /// Request header), A's event, B's completions.
    fn assert_terminated(
        &mut self,
        code: TermCode,
        ddp: Option<(HeaderRepr, usize)>,
        rdma: Option<ReadRequest>,
        statuses: &[(u64, WcStatus)],
    ) -> Vec<WorkCompletion> {
        // 1. B reports the violation and is in Error.
        let local: Vec<_> = self
            .p
            .b
            .events
            .iter()
            .filter(|e| matches!(e, QpEvent::LocalTerminate(_)))
            .collect();
        assert_eq!(
            local,
            vec![&QpEvent::LocalTerminate(code)],
            "B events: {:?}",
            self.p.b.events
        );
        assert_eq!(self.p.b.state(), QpState::Error);
        // 2. The Terminate on the wire: B's only FPDU.
        let fpdus = fpdus_sent_by(&self.p, End::B, self.crc, self.b_tx_markers);
        assert_eq!(fpdus.len(), 1, "B sent more than the Terminate: {fpdus:?}");
        let terms = terminates(&fpdus);
        assert_eq!(terms.len(), 1);
        let (hdr, t) = &terms[0];
        assert!(hdr.last);
        assert_eq!(t.code, Some(code), "Terminate on the wire");
        assert_eq!(t.raw_code_bits, code.to_bits());
        assert_eq!(t.ddp_header, ddp.map(|d| d.0), "copied DDP header");
        assert_eq!(
            t.ddp_seg_len,
            ddp.map(|d| u16::try_from(d.1).unwrap()),
            "DDP segment length"
        );
        assert_eq!(t.rdmap_header, rdma, "copied RDMAP header");
        // 3. A sees the Terminate.
        assert!(
            self.p.a.events.contains(&QpEvent::RemoteTerminate(code)),
            "A events: {:?}",
            self.p.a.events
        );
        assert_eq!(self.p.a.state(), QpState::Error);
        // 4. B's work requests are flushed (but for the named ones).
        let wcs = self.p.b.completions();
        assert_flushed_except(&wcs, statuses, &self.posted);
        wcs
    }
}

/// A Write of `len` bytes of 0x11.
fn write_ulpdu(stag: u32, to: u64, len: usize) -> (HeaderRepr, Vec<u8>) {
    let h = write(stag, to);
    (h, ulpdu(&h, &vec![0x11; len]))
}

/// A Read Request for 16 bytes of `src_stag` at `src_to`.
fn rr(msn: u32, src_stag: u32, src_to: u64) -> (HeaderRepr, ReadRequest, Vec<u8>) {
    let h = read_request(msn);
    let r = ReadRequest {
        sink_stag: 0x4242,
        sink_to: 0,
        size: 16,
        src_stag,
        src_to,
    };
    (h, r, ulpdu(&h, &rr_bytes(&r)))
}

// ---- RDMA Write (DDP tagged buffer) ------------------------------------------

fn write_violation(code: TermCode, stag: impl FnOnce(&mut Fx) -> (u32, u64)) {
    let mut fx = Fx::new(Opts::default());
    let (stag, to) = stag(&mut fx);
    let (h, u) = write_ulpdu(stag, to, 32);
    fx.inject_one(&u);
    fx.assert_terminated(code, Some((h, u.len())), None, &[]);
    fx.assert_memory_untouched();
}

#[test]
fn write_invalid_stag() {
    // Same slot, other key: a stale or guessed STag.
    write_violation(codes::DDP_T_INVALID_STAG, |fx| {
        (fx.target.rkey ^ 0x01, fx.target.iova)
    });
}

#[test]
fn write_base_bounds() {
    write_violation(codes::DDP_T_BASE_BOUNDS, |fx| {
        (fx.target.rkey, fx.target.iova + TARGET_LEN as u64 - 16)
    });
}

#[test]
fn write_below_base() {
    write_violation(codes::DDP_T_BASE_BOUNDS, |fx| {
        (fx.target.rkey, fx.target.iova - 16)
    });
}

#[test]
fn write_to_wrap() {
    write_violation(codes::DDP_T_TO_WRAP, |fx| (fx.target.rkey, u64::MAX - 8));
}

#[test]
fn write_no_remote_write_access() {
    let mut fx = Fx::new(Opts::default());
    let ro = fx.p.b.reg_with(
        &[TARGET_FILL; 64],
        Access::LOCAL_WRITE | Access::REMOTE_READ,
    );
    let (h, u) = write_ulpdu(ro.rkey, ro.iova, 32);
    fx.inject_one(&u);
    fx.assert_terminated(codes::RDMAP_ACCESS_RIGHTS, Some((h, u.len())), None, &[]);
    fx.assert_memory_untouched();
    assert_eq!(fx.bytes(&ro), vec![TARGET_FILL; 64]);
}

#[test]
fn write_region_of_other_pd() {
    let mut fx = Fx::new(Opts::default());
    let pd2 = fx.p.b.ctx.alloc_pd();
    let other =
        fx.p.b
            .ctx
            .reg_mr_owned(
                pd2,
                vec![TARGET_FILL; 64].into_boxed_slice(),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
    let (h, u) = write_ulpdu(other.rkey, other.iova, 32);
    fx.inject_one(&u);
    fx.assert_terminated(codes::DDP_T_STAG_NOT_ASSOC, Some((h, u.len())), None, &[]);
    fx.assert_memory_untouched();
    assert_eq!(fx.bytes(&other), vec![TARGET_FILL; 64]);
}

#[test]
fn write_after_remote_invalidate() {
    // A Send with Invalidate kills the target's STag; a Write through it
    // afterwards is an invalid STag.
    let mut fx = Fx::new(Opts::default());
    let stag = fx.target.rkey;
    let s = send_inv(1, stag);
    let (h, w) = write_ulpdu(stag, fx.target.iova, 32);
    fx.inject(&[ulpdu(&s, &[9; 8]), w.clone()]);
    let wcs = fx.assert_terminated(
        codes::DDP_T_INVALID_STAG,
        Some((h, w.len())),
        None,
        &[(RECV0, WcStatus::Success)],
    );
    let recv = wcs.iter().find(|w| w.wr_id == RECV0).unwrap();
    assert_eq!(recv.invalidated_stag, Some(stag));
    assert_eq!(recv.byte_len, 8);
    assert!(!fx.p.b.ctx.mem().is_valid(stag));
    fx.assert_memory(0..0, &[0]);
    assert_eq!(&fx.bytes(&fx.rbuf[0])[..8], &[9; 8]);
}

#[test]
fn read_response_without_read() {
    let mut fx = Fx::new(Opts::default());
    let h = tagged(Opcode::ReadResponse as u8, fx.target.rkey, fx.target.iova);
    let u = ulpdu(&h, &[0x11; 32]);
    fx.inject_one(&u);
    fx.assert_terminated(
        codes::RDMAP_UNEXPECTED_OPCODE,
        Some((h, u.len())),
        None,
        &[],
    );
    fx.assert_memory_untouched();
}

// ---- RDMA Read Request ---------------------------------------------------------

fn read_violation(code: TermCode, src: impl FnOnce(&mut Fx) -> (u32, u64)) {
    let mut fx = Fx::new(Opts::default());
    let (stag, to) = src(&mut fx);
    let (h, r, u) = rr(1, stag, to);
    fx.inject_one(&u);
    fx.assert_terminated(code, Some((h, u.len())), Some(r), &[]);
    fx.assert_memory_untouched();
}

#[test]
fn read_request_invalid_stag() {
    read_violation(codes::RDMAP_INVALID_STAG, |fx| {
        (fx.target.rkey ^ 0x01, fx.target.iova)
    });
}

#[test]
fn read_request_base_bounds() {
    read_violation(codes::RDMAP_BASE_BOUNDS, |fx| {
        (fx.target.rkey, fx.target.iova + TARGET_LEN as u64 - 8)
    });
}

#[test]
fn read_request_to_wrap() {
    read_violation(codes::RDMAP_TO_WRAP, |fx| (fx.target.rkey, u64::MAX - 4));
}

#[test]
fn read_request_no_remote_read_access() {
    read_violation(codes::RDMAP_ACCESS_RIGHTS, |fx| {
        let wo =
            fx.p.b
                .reg_with(&[1; 64], Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        (wo.rkey, wo.iova)
    });
}

#[test]
fn read_request_region_of_other_pd() {
    read_violation(codes::RDMAP_STAG_NOT_ASSOC, |fx| {
        let pd2 = fx.p.b.ctx.alloc_pd();
        let other =
            fx.p.b
                .ctx
                .reg_mr_owned(pd2, vec![1; 64].into_boxed_slice(), Access::REMOTE_READ)
                .unwrap();
        (other.rkey, other.iova)
    });
}

#[test]
fn read_request_beyond_ird() {
    // IRD 1 (the default on both sides): a second Read Request before the
    // first was answered.
    let mut fx = Fx::new(Opts::default());
    assert_eq!(
        fx.p.b.ctx.qp(fx.p.b.qp).unwrap().negotiated().unwrap().ird,
        1
    );
    let (stag, to) = (fx.target.rkey, fx.target.iova);
    let (_, _, u1) = rr(1, stag, to);
    let (h2, r2, u2) = rr(2, stag, to);
    fx.inject(&[u1, u2.clone()]);
    fx.assert_terminated(
        codes::RDMAP_CATASTROPHIC_STREAM,
        Some((h2, u2.len())),
        Some(r2),
        &[],
    );
    fx.assert_memory_untouched();
}

// ---- DDP untagged buffer -------------------------------------------------------

fn untagged_violation(
    o: Opts,
    code: TermCode,
    h: HeaderRepr,
    payload: &[u8],
    st: &[(u64, WcStatus)],
) {
    let mut fx = Fx::new(o);
    let u = ulpdu(&h, payload);
    fx.inject_one(&u);
    fx.assert_terminated(code, Some((h, u.len())), None, st);
    fx.assert_memory_untouched();
}

#[test]
fn send_msn_out_of_range() {
    // A valid Send (MSN 1), then MSN 3: a gap.
    let mut fx = Fx::new(Opts::default());
    let h = send(3, 0);
    let u = ulpdu(&h, &[2; 8]);
    fx.inject(&[ulpdu(&send(1, 0), &[1; 8]), u.clone()]);
    fx.assert_terminated(
        codes::DDP_U_INVALID_MSN_RANGE,
        Some((h, u.len())),
        None,
        &[(RECV0, WcStatus::Success)],
    );
    fx.assert_memory(0..0, &[0]);
    assert_eq!(&fx.bytes(&fx.rbuf[0])[..8], &[1; 8]);
    assert_eq!(&fx.bytes(&fx.rbuf[0])[8..], &[0; RBUF_LEN as usize - 8]);
}

#[test]
fn send_invalid_qn() {
    let h = untagged(Opcode::Send as u8, 4, 1, 0);
    untagged_violation(Opts::default(), codes::DDP_U_INVALID_QN, h, &[1; 8], &[]);
}

#[test]
fn send_invalid_mo() {
    untagged_violation(
        Opts::default(),
        codes::DDP_U_INVALID_MO,
        send(1, 8),
        &[1; 8],
        &[],
    );
}

#[test]
fn send_without_receive_posted() {
    let o = Opts {
        recvs: 0,
        ..Opts::default()
    };
    untagged_violation(
        o,
        codes::DDP_U_INVALID_MSN_NO_BUFFER,
        send(1, 0),
        &[1; 8],
        &[],
    );
}

#[test]
fn send_longer_than_receive_buffer() {
    untagged_violation(
        Opts::default(),
        codes::DDP_U_MSG_TOO_LONG,
        send(1, 0),
        &[1; RBUF_LEN as usize + 1],
        &[(RECV0, WcStatus::LocalLengthError)],
    );
}

#[test]
fn send_longer_than_receive_buffer_second_segment() {
    // The first segment fits; the second overruns the buffer.
    let mut fx = Fx::new(Opts::default());
    let mut first = send(1, 0);
    first.last = false;
    let second = send(1, 48);
    let u2 = ulpdu(&second, &[2; 32]);
    fx.inject(&[ulpdu(&first, &[1; 48]), u2.clone()]);
    fx.assert_terminated(
        codes::DDP_U_MSG_TOO_LONG,
        Some((second, u2.len())),
        None,
        &[(RECV0, WcStatus::LocalLengthError)],
    );
    // The first segment was placed; nothing beyond the buffer.
    fx.assert_memory(0..0, &[0]);
    assert_eq!(&fx.bytes(&fx.rbuf[0])[..48], &[1; 48]);
}

#[test]
fn ddp_version_tagged() {
    let mut fx = Fx::new(Opts::default());
    let (mut h, _) = write_ulpdu(fx.target.rkey, fx.target.iova, 0);
    h.ddp_version = 2;
    let u = ulpdu(&h, &[0x11; 32]);
    fx.inject_one(&u);
    fx.assert_terminated(codes::DDP_T_INVALID_VERSION, Some((h, u.len())), None, &[]);
    fx.assert_memory_untouched();
}

#[test]
fn ddp_version_untagged() {
    let mut h = send(1, 0);
    h.ddp_version = 0;
    untagged_violation(
        Opts::default(),
        codes::DDP_U_INVALID_VERSION,
        h,
        &[1; 8],
        &[],
    );
}

// ---- RDMAP ---------------------------------------------------------------------

#[test]
fn rdmap_version() {
    let mut h = send(1, 0);
    h.rdmap_version = 2;
    untagged_violation(
        Opts::default(),
        codes::RDMAP_INVALID_VERSION,
        h,
        &[1; 8],
        &[],
    );
}

#[test]
fn unknown_opcode() {
    let h = untagged(0xc, 0, 1, 0);
    untagged_violation(
        Opts::default(),
        codes::RDMAP_UNEXPECTED_OPCODE,
        h,
        &[1; 8],
        &[],
    );
}

#[test]
fn opcode_tagged_bit_mismatch() {
    // A Send opcode in a tagged header, aimed at the target.
    let mut fx = Fx::new(Opts::default());
    let h = tagged(Opcode::Send as u8, fx.target.rkey, fx.target.iova);
    let u = ulpdu(&h, &[0x11; 32]);
    fx.inject_one(&u);
    fx.assert_terminated(
        codes::RDMAP_UNEXPECTED_OPCODE,
        Some((h, u.len())),
        None,
        &[],
    );
    fx.assert_memory_untouched();
}

#[test]
fn write_opcode_in_untagged_header() {
    let h = untagged(Opcode::Write as u8, 0, 1, 0);
    untagged_violation(
        Opts::default(),
        codes::RDMAP_UNEXPECTED_OPCODE,
        h,
        &[1; 8],
        &[],
    );
}

#[test]
fn send_invalidate_unknown_stag() {
    let mut fx = Fx::new(Opts::default());
    let h = send_inv(1, 0x00ff_ff00);
    let u = ulpdu(&h, &[1; 8]);
    fx.inject_one(&u);
    fx.assert_terminated(
        codes::RDMAP_CANNOT_INVALIDATE_PROT,
        Some((h, u.len())),
        None,
        &[],
    );
    // The Send's payload went to the receive buffer it was aimed at (that
    // buffer is flushed, not completed); nothing else changed.
    fx.assert_memory(0..0, &[0]);
    assert!(fx.p.b.ctx.mem().is_valid(fx.target.rkey));
}

#[test]
fn send_invalidate_foreign_pd() {
    let mut fx = Fx::new(Opts::default());
    let pd2 = fx.p.b.ctx.alloc_pd();
    let other =
        fx.p.b
            .ctx
            .reg_mr_owned(pd2, vec![0; 64].into_boxed_slice(), Access::REMOTE_WRITE)
            .unwrap();
    let h = send_inv(1, other.rkey);
    let u = ulpdu(&h, &[1; 8]);
    fx.inject_one(&u);
    fx.assert_terminated(
        codes::RDMAP_CANNOT_INVALIDATE_PROT,
        Some((h, u.len())),
        None,
        &[],
    );
    assert!(
        fx.p.b.ctx.mem().is_valid(other.rkey),
        "foreign STag invalidated"
    );
    fx.assert_memory(0..0, &[0]);
}

#[test]
fn reserved_bits_ignored_by_default() {
    let mut fx = Fx::new(Opts {
        sends: false,
        ..Opts::default()
    });
    let (mut w, _) = write_ulpdu(fx.target.rkey, fx.target.iova + 16, 0);
    w.ddp_reserved = 0xf;
    w.rdmap_reserved = 0x3;
    let mut s = send(1, 0);
    s.ddp_reserved = 0xf;
    s.rdmap_reserved = 0x3;
    s.buffer = iwarp::wire::ddp::Buffer::Untagged {
        inv_stag: 0xdead_beef, // RsvdULP of a plain Send
        qn: 0,
        msn: 1,
        mo: 0,
    };
    fx.inject(&[ulpdu(&w, &[0x11; 32]), ulpdu(&s, &[3; 8])]);
    assert_eq!(
        fx.p.b.state(),
        QpState::Rts,
        "B events: {:?}",
        fx.p.b.events
    );
    assert_eq!(fx.p.a.state(), QpState::Rts);
    assert!(fpdus_sent_by(&fx.p, End::B, fx.crc, fx.b_tx_markers).is_empty());
    let wcs = fx.p.b.completions();
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (RECV0, WcStatus::Success));
    assert_eq!(wcs[0].invalidated_stag, None);
    fx.assert_memory(16..48, &[0]);
    assert_eq!(&fx.bytes(&fx.target)[16..48], &[0x11; 32]);
    assert_eq!(&fx.bytes(&fx.rbuf[0])[..8], &[3; 8]);
}

#[test]
fn reserved_bits_strict() {
    let mut fx = Fx::new(Opts {
        qp: QpConfig {
            strict_reserved: true,
            ..QpConfig::default()
        },
        ..Opts::default()
    });
    let (mut h, _) = write_ulpdu(fx.target.rkey, fx.target.iova, 0);
    h.rdmap_reserved = 0x1;
    let u = ulpdu(&h, &[0x11; 32]);
    fx.inject_one(&u);
    fx.assert_terminated(codes::RDMAP_UNSPECIFIED_OP, Some((h, u.len())), None, &[]);
    fx.assert_memory_untouched();
}

#[test]
fn truncated_ddp_header() {
    // A ULPDU of 10 bytes: shorter than the 18-byte untagged header.
    let mut fx = Fx::new(Opts::default());
    let full = ulpdu(&send(1, 0), &[]);
    fx.inject(&[full[..10].to_vec()]);
    fx.assert_terminated(codes::RDMAP_CATASTROPHIC_STREAM, None, None, &[]);
    fx.assert_memory_untouched();
}

#[test]
fn truncated_read_request_header() {
    // A Read Request whose ULPDU ends inside the RDMAP header.
    let mut fx = Fx::new(Opts::default());
    let (h, _, u) = rr(1, fx.target.rkey, fx.target.iova);
    let short = u[..30].to_vec();
    fx.inject_one(&short);
    fx.assert_terminated(
        codes::RDMAP_CATASTROPHIC_STREAM,
        Some((h, short.len())),
        None,
        &[],
    );
    fx.assert_memory_untouched();
}

// ---- MPA (full operation) ------------------------------------------------------

#[test]
fn mpa_ulpdu_longer_than_max() {
    // The framing layer refuses a length field above the receiver's limit
    // before any of the FPDU is seen: the core reports MPA_MARKER.
    let mut fx = Fx::new(Opts {
        qp: QpConfig {
            rx_max_ulpdu: 64,
            ..QpConfig::default()
        },
        ..Opts::default()
    });
    let (_, u) = write_ulpdu(fx.target.rkey, fx.target.iova, 100);
    fx.inject(&[u]);
    fx.assert_terminated(codes::MPA_MARKER, None, None, &[]);
    fx.assert_memory_untouched();
}

#[test]
fn mpa_bad_crc() {
    let crc = Config {
        crc: true,
        ..Config::default()
    };
    let mut fx = Fx::new(Opts {
        a: crc.clone(),
        b: crc,
        ..Opts::default()
    });
    assert!(fx.crc);
    let (_, u) = write_ulpdu(fx.target.rkey, fx.target.iova + 64, 32);
    let mut bytes = fx.frame(&[u]);
    bytes[2 + 14 + 5] ^= 0x01; // a payload byte
    fx.inject_raw(&bytes);
    // No completion reports the Write (a Write has none at B; none of B's
    // work requests completes successfully either).
    fx.assert_terminated(codes::MPA_CRC, None, None, &[]);
    assert_eq!(fx.p.b.ctx.qp_stats(fx.p.b.qp).unwrap().crc_errors, 1);
    // Payload is placed as it streams in (before the CRC is known); only
    // the span the Write named may have changed.
    fx.assert_memory(64..96, &[]);
}

#[test]
fn mpa_bad_crc_send_not_completed() {
    let crc = Config {
        crc: true,
        ..Config::default()
    };
    let mut fx = Fx::new(Opts {
        a: crc.clone(),
        b: crc,
        ..Opts::default()
    });
    let mut bytes = fx.frame(&[ulpdu(&send(1, 0), &[5; 16])]);
    bytes[2 + 18 + 3] ^= 0x80;
    fx.inject_raw(&bytes);
    fx.assert_terminated(codes::MPA_CRC, None, None, &[]);
    fx.assert_memory(0..0, &[0]);
}

fn markers_to_b() -> Opts {
    Opts {
        b: Config {
            markers: true,
            ..Config::default()
        },
        ..Opts::default()
    }
}

#[test]
fn mpa_bad_marker_inside_fpdu() {
    let mut fx = Fx::new(markers_to_b());
    assert!(!fx.b_tx_markers);
    // 600 bytes of payload: the FPDU spans the marker at stream offset 512.
    let (_, u) = write_ulpdu(fx.target.rkey, fx.target.iova, 600);
    let mut bytes = fx.frame(&[u]);
    assert_eq!(&bytes[..4], &[0, 0, 0, 0], "first marker");
    let good = u16::from_be_bytes([bytes[514], bytes[515]]);
    assert_eq!(
        good,
        512 - 4,
        "marker at 512 points back to the length field"
    );
    bytes[514..516].copy_from_slice(&(good + 8).to_be_bytes());
    fx.inject_raw(&bytes);
    fx.assert_terminated(codes::MPA_MARKER, None, None, &[]);
    // Payload before the marker may have been placed; nothing else.
    fx.assert_memory(0..600, &[]);
}

#[test]
fn mpa_bad_first_marker() {
    // The marker at stream offset 0 precedes the first length field.
    let mut fx = Fx::new(markers_to_b());
    let (_, u) = write_ulpdu(fx.target.rkey, fx.target.iova, 32);
    let mut bytes = fx.frame(&[u]);
    bytes[3] = 4;
    fx.inject_raw(&bytes);
    fx.assert_terminated(codes::MPA_MARKER, None, None, &[]);
    fx.assert_memory_untouched();
}

#[test]
fn mpa_no_matching_rtr() {
    // A asks for peer-to-peer mode with a zero-length Write RTR; the first
    // FPDU B sees is a Send instead.
    let a = Config {
        p2p: true,
        rtr: RtrSet::only(RtrType::Write),
        ..Config::default()
    };
    let mut p = Pair::new(QpConfig::default(), Chunking::whole(1 << 16));
    p.start(a, &[], Config::default());
    // Deliver A's request by hand so the crafted FPDU reaches B before A's
    // own RTR (which A queues once the reply arrives).
    let mut buf = vec![0u8; 1024];
    let n = p.a.ctx.poll_transmit(p.a.qp, &mut buf);
    p.inject(End::B, &buf[..n]);
    let mut fx = Fx::with_pair(p, 2, true);
    let h = send(1, 0);
    let u = ulpdu(&h, &[]);
    fx.inject_one(&u);
    let neg =
        fx.p.a
            .ctx
            .qp(fx.p.a.qp)
            .unwrap()
            .negotiated()
            .cloned()
            .unwrap();
    assert_eq!(neg.rtr, Some(RtrType::Write));
    fx.assert_terminated(codes::MPA_NO_MATCHING_RTR, Some((h, u.len())), None, &[]);
    fx.assert_memory_untouched();
}

// ---- The peer's EOF --------------------------------------------------------------

#[test]
fn eof_mid_message() {
    let mut fx = Fx::new(Opts {
        sends: false,
        ..Opts::default()
    });
    let mut first = send(1, 0);
    first.last = false;
    fx.inject(&[ulpdu(&first, &[1; 32])]);
    assert_eq!(fx.p.b.state(), QpState::Rts);
    assert!(fx.p.b.completions().is_empty());
    fx.p.b.ctx.handle_eof(fx.p.b.qp);
    fx.p.drive();
    assert_eq!(fx.p.b.state(), QpState::Error);
    assert!(
        fx.p.b.events.contains(&QpEvent::Disconnected),
        "{:?}",
        fx.p.b.events
    );
    assert!(!fx
        .p
        .b
        .events
        .iter()
        .any(|e| matches!(e, QpEvent::LocalTerminate(_))));
    let wcs = fx.p.b.completions();
    assert_flushed_except(&wcs, &[], &fx.posted);
    // No Terminate after EOF.
    assert!(fpdus_sent_by(&fx.p, End::B, fx.crc, fx.b_tx_markers).is_empty());
    fx.assert_memory(0..0, &[0]);
}

// ---- MPA connection setup ----------------------------------------------------------

/// An MPA request frame.
fn request(revision: u8, private_data: &[u8]) -> Vec<u8> {
    let f = FrameRepr {
        kind: FrameKind::Request,
        markers: false,
        crc: false,
        reject: false,
        enhanced: false,
        reserved: 0,
        revision,
        private_data,
    };
    let mut v = vec![0; f.buffer_len()];
    f.emit(&mut v);
    v
}

/// B listens (A stays idle) with WRs posted; `bytes` arrive; checks that the
/// setup fails with `err`, B is in Error, every WR is flushed and B sent
/// nothing.
fn handshake_failure(bytes: &[u8], advance: Option<Duration>, err: HandshakeError) {
    let mut p = Pair::new(QpConfig::default(), Chunking::whole(1 << 16));
    p.b.ctx.listen(p.b.qp, Config::default(), p.now).unwrap();
    let fx = Fx::with_pair(p, 2, true);
    let Fx { mut p, posted, .. } = fx;
    if !bytes.is_empty() {
        p.inject(End::B, bytes);
    }
    p.drive();
    if let Some(d) = advance {
        p.advance(d);
        p.drive();
    }
    assert_eq!(p.b.events, vec![QpEvent::ConnectFailed(err)], "B events");
    assert_eq!(p.b.state(), QpState::Error);
    assert_flushed_except(&p.b.completions(), &[], &posted);
    assert!(sent_by(&p, End::B).is_empty(), "B answered");
    assert!(p.b.ctx.wants_close(p.b.qp));
}

#[test]
fn mpa_bad_key() {
    let mut r = request(1, &[]);
    r[10] ^= 0x20;
    handshake_failure(&r, None, HandshakeError::InvalidKey);
}

#[test]
fn mpa_private_data_too_long() {
    let mut r = request(1, &[]);
    r[18..20].copy_from_slice(&513u16.to_be_bytes());
    r.extend_from_slice(&[0; 513]);
    handshake_failure(&r, None, HandshakeError::InvalidFrame);
}

#[test]
fn mpa_garbage_before_request() {
    let mut g = b"GET / HTTP/1.1\r\n".to_vec();
    g.extend_from_slice(&request(1, &[]));
    handshake_failure(&g, None, HandshakeError::InvalidKey);
}

#[test]
fn mpa_unsupported_revision() {
    handshake_failure(&request(3, &[]), None, HandshakeError::UnsupportedRevision);
}

#[test]
fn mpa_revision_zero() {
    handshake_failure(&request(0, &[]), None, HandshakeError::UnsupportedRevision);
}

#[test]
fn mpa_handshake_timeout() {
    handshake_failure(&[], Some(Duration::from_secs(11)), HandshakeError::Timeout);
}

#[test]
fn mpa_handshake_timeout_partial_request() {
    let r = request(1, &[]);
    handshake_failure(
        &r[..12],
        Some(Duration::from_secs(11)),
        HandshakeError::Timeout,
    );
}

// ---- RFC 7306: Atomic Requests and Responses, Immediate Data ---------------

/// An Atomic Request (queue 1) header and ULPDU for `req`.
fn atomic(msn: u32, req: &AtomicRequest) -> (HeaderRepr, Vec<u8>) {
    let h = untagged(Opcode::AtomicRequest as u8, 1, msn, 0);
    let mut body = vec![0; AtomicRequest::LEN];
    req.emit(&mut body);
    (h, ulpdu(&h, &body))
}

fn atomic_violation(code: TermCode, req: impl FnOnce(&Fx) -> AtomicRequest) {
    let mut fx = Fx::new(Opts::default());
    let (h, u) = atomic(1, &req(&fx));
    fx.inject_one(&u);
    // §8.1: the DDP header is copied, the RDMA header field left zero.
    fx.assert_terminated(code, Some((h, u.len())), None, &[]);
    fx.assert_memory_untouched();
}

#[test]
fn atomic_request_without_the_atomic_right() {
    // The target allows remote reads and writes, not atomics.
    atomic_violation(codes::RDMAP_ACCESS_RIGHTS, |fx| {
        AtomicRequest::fetch_add(1, fx.target.rkey, fx.target.iova, 1, 0)
    });
}

#[test]
fn atomic_request_invalid_stag() {
    atomic_violation(codes::RDMAP_INVALID_STAG, |fx| {
        AtomicRequest::fetch_add(1, fx.target.rkey ^ 1, fx.target.iova, 1, 0)
    });
}

#[test]
fn atomic_request_not_64_bit_aligned() {
    // §8.2: Remote Operation Error, catastrophic error localized to the
    // stream.
    atomic_violation(codes::RDMAP_CATASTROPHIC_STREAM, |fx| {
        AtomicRequest::fetch_add(1, fx.target.rkey, fx.target.iova + 4, 1, 0)
    });
}

#[test]
fn atomic_request_reserved_aopcode() {
    atomic_violation(codes::RDMAP_UNEXPECTED_OPCODE, |fx| AtomicRequest {
        aopcode: 1,
        ..AtomicRequest::fetch_add(1, fx.target.rkey, fx.target.iova, 1, 0)
    });
}

#[test]
fn atomic_request_with_payload() {
    let mut fx = Fx::new(Opts::default());
    let (h, mut u) = atomic(1, &AtomicRequest::fetch_add(1, 0, 0, 1, 0));
    u.extend_from_slice(&[0; 8]);
    fx.inject_one(&u);
    fx.assert_terminated(codes::DDP_U_MSG_TOO_LONG, Some((h, u.len())), None, &[]);
    fx.assert_memory_untouched();
}

#[test]
fn atomic_request_cut_short() {
    let mut fx = Fx::new(Opts::default());
    let (h, mut u) = atomic(1, &AtomicRequest::fetch_add(1, 0, 0, 1, 0));
    u.truncate(u.len() - 8);
    fx.inject_one(&u);
    fx.assert_terminated(
        codes::RDMAP_CATASTROPHIC_STREAM,
        Some((h, u.len())),
        None,
        &[],
    );
    fx.assert_memory_untouched();
}

#[test]
fn atomic_requests_beyond_the_ird() {
    // IRD 1 (the default): two requests before any response. Atomic and
    // Read Requests share the IRD.
    let mut fx = Fx::new(Opts::default());
    let all = Access::LOCAL_WRITE | Access::REMOTE_ATOMIC;
    let word = fx.p.b.reg_with(&[0; 8], all);
    let (_, u1) = atomic(1, &AtomicRequest::fetch_add(1, word.rkey, word.iova, 1, 0));
    let (h2, _, u2) = rr(2, word.rkey, word.iova);
    fx.inject(&[u1, u2.clone()]);
    fx.assert_terminated(
        codes::RDMAP_CATASTROPHIC_STREAM,
        Some((h2, u2.len())),
        Some(ReadRequest {
            sink_stag: 0x4242,
            sink_to: 0,
            size: 16,
            src_stag: word.rkey,
            src_to: word.iova,
        }),
        &[],
    );
    // The first request was queued, never performed: the Error state
    // dropped it.
    assert_eq!(fx.p.b.bytes(&word), &[0; 8]);
}

#[test]
fn atomic_target_deregistered_before_the_response() {
    // The request is valid when it arrives; the region goes away before
    // the response is generated. §8.1: an error found while creating a
    // message; the Terminate carries no headers.
    let mut fx = Fx::new(Opts::default());
    let word =
        fx.p.b
            .reg_with(&[0; 8], Access::LOCAL_WRITE | Access::REMOTE_ATOMIC);
    let (_, u) = atomic(1, &AtomicRequest::fetch_add(1, word.rkey, word.iova, 1, 0));
    let bytes = fx.crafter.fpdu(&u);
    let qp = fx.p.b.qp;
    let b = &mut fx.p.b;
    assert_eq!(b.ctx.handle_input(qp, &bytes, Instant::ZERO), bytes.len());
    assert!(b.ctx.dereg_mr(word.lkey).is_ok());
    fx.p.drive();
    fx.assert_terminated(codes::RDMAP_INVALID_STAG, None, None, &[]);
    fx.assert_memory_untouched();
}

#[test]
fn read_source_deregistered_before_the_response() {
    // As above, for an RDMA Read: the Terminate carries the Read Request
    // header it could not answer.
    let mut fx = Fx::new(Opts::default());
    let src = fx.p.b.reg_with(&[3; 16], Access::REMOTE_READ);
    let (_, r, u) = rr(1, src.rkey, src.iova);
    let bytes = fx.crafter.fpdu(&u);
    let qp = fx.p.b.qp;
    let b = &mut fx.p.b;
    assert_eq!(b.ctx.handle_input(qp, &bytes, Instant::ZERO), bytes.len());
    assert!(b.ctx.dereg_mr(src.lkey).is_ok());
    fx.p.drive();
    fx.assert_terminated(codes::RDMAP_INVALID_STAG, None, Some(r), &[]);
    fx.assert_memory_untouched();
}

#[test]
fn atomic_response_without_request() {
    // Queue 3's buffers are the Atomic Requests outstanding: none.
    let h = untagged(Opcode::AtomicResponse as u8, 3, 1, 0);
    untagged_violation(
        Opts::default(),
        codes::DDP_U_INVALID_MSN_NO_BUFFER,
        h,
        &[0; AtomicResponse::LEN],
        &[],
    );
}

#[test]
fn atomic_request_on_the_send_queue() {
    let h = untagged(Opcode::AtomicRequest as u8, 0, 1, 0);
    untagged_violation(
        Opts::default(),
        codes::RDMAP_UNEXPECTED_OPCODE,
        h,
        &[0; AtomicRequest::LEN],
        &[],
    );
}

#[test]
fn immediate_data_of_other_than_8_bytes() {
    // §6.3: exactly 8 bytes. Fewer end the segment inside the header.
    let h = untagged(Opcode::ImmediateData as u8, 0, 1, 0);
    untagged_violation(
        Opts::default(),
        codes::RDMAP_CATASTROPHIC_STREAM,
        h,
        &[1; 4],
        &[],
    );
    untagged_violation(Opts::default(), codes::DDP_U_MSG_TOO_LONG, h, &[1; 12], &[]);
}

#[test]
fn immediate_data_inside_a_send() {
    // The first segment of a Send (MSN 1), then Immediate Data with the
    // same MSN at the Send's next offset: Immediate Data is a message of
    // its own, at offset 0.
    let mut fx = Fx::new(Opts::default());
    let mut first = send(1, 0);
    first.last = false;
    let h = untagged(Opcode::ImmediateData as u8, 0, 1, 8);
    let u = ulpdu(&h, &[1; 8]);
    fx.inject(&[ulpdu(&first, &[2; 8]), u.clone()]);
    fx.assert_terminated(codes::DDP_U_INVALID_MO, Some((h, u.len())), None, &[]);
    fx.assert_memory(0..0, &[0]);
}

#[test]
fn immediate_data_without_a_receive_buffer() {
    let h = untagged(Opcode::ImmediateDataSolicited as u8, 0, 1, 0);
    untagged_violation(
        Opts {
            recvs: 0,
            ..Opts::default()
        },
        codes::DDP_U_INVALID_MSN_NO_BUFFER,
        h,
        &[1; 8],
        &[],
    );
}
