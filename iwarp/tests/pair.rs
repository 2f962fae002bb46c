//! End-to-end tests over the in-memory [`Pair`]: every operation under every
//! MPA setting, RTR in peer-to-peer mode, private data, IRD/ORD, completion
//! ordering, disconnect, and stream-splitting invariance (proptest).

mod common_ops;

use common_ops::*;
use iwarp::cq::{WcOpcode, WcStatus};
use iwarp::mem::{Access, MrInfo};
use iwarp::mpa::framing::mulpdu;
use iwarp::mpa::handshake::{
    Config, HandshakeError, RtrSet, RtrType, MAX_ULP_PRIVATE_DATA_ENHANCED,
};
use iwarp::qp::{QpConfig, QpEvent, QpState, SendOp, MAX_SGE};
use iwarp::testing::{Chunking, End, Pair};
use iwarp::verbs::VerbsError;
use iwarp::wire::ddp::{TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
use proptest::prelude::*;

const EMSS: usize = 1460;
const BIG: usize = 100_000;

fn tx_fpdus(p: &mut Pair, e: End) -> u64 {
    let s = p.side(e);
    s.ctx.qp_stats(s.qp).expect("qp").tx_fpdus
}

/// A Send of `data` from `from`, received into a fresh region; checks both
/// completions and the bytes. Returns the receive completion.
fn send_one(
    p: &mut Pair,
    from: End,
    op: SendOp,
    data: &[u8],
    wr_id: u64,
) -> iwarp::cq::WorkCompletion {
    let to = other(from);
    let dst = p.side(to).reg(data.len() + 8, Access::LOCAL_WRITE);
    post_recv(p.side(to), wr_id + 1000, &[sge(&dst, 0, data.len() + 8)]);
    let src = p.side(from).reg_with(data, Access::NONE);
    let sgl = if data.is_empty() {
        vec![]
    } else {
        vec![sge(&src, 0, data.len())]
    };
    post_send(p.side(from), wr_id, op, &sgl, true);
    p.drive();
    one_wc(p.side(from), wr_id, WcOpcode::Send, None);
    let wc = one_wc(
        p.side(to),
        wr_id + 1000,
        WcOpcode::Recv,
        Some(data.len() as u32),
    );
    let got = p.side(to).bytes(&dst);
    assert_eq!(&got[..data.len()], data, "send of {} bytes", data.len());
    assert!(got[data.len()..].iter().all(|&b| b == 0), "overrun");
    wc
}

fn write_one(p: &mut Pair, from: End, data: &[u8], wr_id: u64) {
    let to = other(from);
    let dst = p.side(to).reg(data.len() + 16, rw());
    let src = p.side(from).reg_with(data, Access::NONE);
    post_send(
        p.side(from),
        wr_id,
        SendOp::Write {
            remote_addr: dst.iova + 8,
            rkey: dst.rkey,
        },
        &[sge(&src, 0, data.len())],
        true,
    );
    p.drive();
    one_wc(p.side(from), wr_id, WcOpcode::RdmaWrite, None);
    assert!(p.side(to).completions().is_empty());
    let got = p.side(to).bytes(&dst);
    assert!(got[..8].iter().all(|&b| b == 0));
    assert_eq!(&got[8..8 + data.len()], data, "write of {}", data.len());
    assert!(got[8 + data.len()..].iter().all(|&b| b == 0));
}

fn read_one(p: &mut Pair, from: End, data: &[u8], wr_id: u64) {
    let to = other(from);
    let src = p.side(to).reg_with(data, Access::REMOTE_READ);
    let sink = p.side(from).reg(data.len(), Access::LOCAL_WRITE);
    post_send(
        p.side(from),
        wr_id,
        SendOp::Read {
            remote_addr: src.iova,
            rkey: src.rkey,
        },
        &[sge(&sink, 0, data.len())],
        true,
    );
    p.drive();
    one_wc(
        p.side(from),
        wr_id,
        WcOpcode::RdmaRead,
        Some(data.len() as u32),
    );
    assert!(p.side(to).completions().is_empty());
    assert_eq!(p.side(from).bytes(&sink), data, "read of {}", data.len());
}

/// Every operation from `from` to its peer. Returns an STag of the peer
/// that a Send with Invalidate invalidated.
fn all_ops(p: &mut Pair, from: End, markers_tx: bool) -> MrInfo {
    let to = other(from);
    let m = mulpdu(EMSS, markers_tx).max(64);
    let send_fill = m - UNTAGGED_HEADER_LEN;
    let write_fill = m - TAGGED_HEADER_LEN;
    let mut id = 1;
    let mut next = || {
        id += 1;
        id
    };

    // Sends of every size class; count FPDUs at the boundary sizes.
    for (len, fpdus) in [
        (0, Some(1)),
        (1, Some(1)),
        (send_fill, Some(1)),
        (send_fill + 1, Some(2)),
        (BIG, Some(BIG.div_ceil(send_fill) as u64)),
    ] {
        let before = tx_fpdus(p, from);
        let wc = send_one(p, from, SEND, &pattern(len, len as u64), next());
        assert!(!wc.solicited && wc.invalidated_stag.is_none(), "{wc:?}");
        if let Some(n) = fpdus {
            assert_eq!(tx_fpdus(p, from) - before, n, "FPDUs of a {len}-byte Send");
        }
    }

    // Solicited Event.
    let wc = send_one(
        p,
        from,
        SendOp::Send {
            solicited: true,
            invalidate: None,
        },
        &pattern(300, 3),
        next(),
    );
    assert!(wc.solicited && wc.invalidated_stag.is_none(), "{wc:?}");

    // Send with Invalidate, and with SE and Invalidate.
    let mut invalidated = None;
    for solicited in [false, true] {
        let victim = p.side(to).reg(64, rw());
        assert!(p.side(to).ctx.mem().is_valid(victim.rkey));
        let wc = send_one(
            p,
            from,
            SendOp::Send {
                solicited,
                invalidate: Some(victim.rkey),
            },
            &pattern(2000, 4),
            next(),
        );
        assert_eq!(wc.solicited, solicited, "{wc:?}");
        assert_eq!(wc.invalidated_stag, Some(victim.rkey), "{wc:?}");
        assert!(!p.side(to).ctx.mem().is_valid(victim.rkey));
        invalidated = Some(victim);
    }

    // RDMA Write and Read of every size class.
    for len in [0, 1, write_fill, write_fill + 1, BIG] {
        let before = tx_fpdus(p, from);
        write_one(p, from, &pattern(len, 10 + len as u64), next());
        if len == write_fill {
            assert_eq!(tx_fpdus(p, from) - before, 1);
        }
        if len == write_fill + 1 {
            assert_eq!(tx_fpdus(p, from) - before, 2);
        }
    }
    for len in [1, write_fill, write_fill + 1, BIG] {
        read_one(p, from, &pattern(len, 20 + len as u64), next());
    }

    // Multi-SGE gather (Write and Send) and scatter (receive).
    let parts: Vec<Vec<u8>> = (0..MAX_SGE)
        .map(|i| pattern(100 + 1500 * i, 30 + i as u64))
        .collect();
    let all: Vec<u8> = parts.concat();
    let srcs: Vec<MrInfo> = parts
        .iter()
        .map(|d| {
            let mut v = vec![0u8; 5];
            v.extend_from_slice(d);
            p.side(from).reg_with(&v, Access::NONE)
        })
        .collect();
    let gather: Vec<_> = srcs
        .iter()
        .zip(&parts)
        .map(|(mr, d)| sge(mr, 5, d.len()))
        .collect();
    let dst = p.side(to).reg(all.len(), rw());
    let wid = next();
    post_send(
        p.side(from),
        wid,
        SendOp::Write {
            remote_addr: dst.iova,
            rkey: dst.rkey,
        },
        &gather,
        true,
    );
    p.drive();
    one_wc(p.side(from), wid, WcOpcode::RdmaWrite, None);
    assert_eq!(p.side(to).bytes(&dst), &all[..]);
    // Scatter into MAX_SGE pieces of two regions, odd offsets and sizes.
    let r1 = p.side(to).reg(all.len(), Access::LOCAL_WRITE);
    let r2 = p.side(to).reg(all.len(), Access::LOCAL_WRITE);
    let cuts = [all.len() / 7, all.len() / 3, all.len() / 2 + 11, all.len()];
    let mut scatter = Vec::new();
    let mut prev = 0;
    for (i, &c) in cuts.iter().enumerate() {
        let mr = if i % 2 == 0 { &r1 } else { &r2 };
        scatter.push(sge(mr, prev, c - prev));
        prev = c;
    }
    assert_eq!(scatter.len(), MAX_SGE);
    let rid = next();
    post_recv(p.side(to), rid, &scatter);
    let sid = next();
    post_send(p.side(from), sid, SEND, &gather, true);
    p.drive();
    one_wc(p.side(from), sid, WcOpcode::Send, None);
    one_wc(p.side(to), rid, WcOpcode::Recv, Some(all.len() as u32));
    let (b1, b2) = (
        p.side(to).bytes(&r1).to_vec(),
        p.side(to).bytes(&r2).to_vec(),
    );
    let mut prev = 0;
    for (i, &c) in cuts.iter().enumerate() {
        let b = if i % 2 == 0 { &b1 } else { &b2 };
        assert_eq!(&b[prev..c], &all[prev..c], "scatter element {i}");
        prev = c;
    }

    // Local Invalidate.
    let mine = p.side(from).reg(64, rw());
    let lid = next();
    post_send(
        p.side(from),
        lid,
        SendOp::LocalInvalidate { stag: mine.lkey },
        &[],
        true,
    );
    p.drive();
    one_wc(p.side(from), lid, WcOpcode::LocalInvalidate, None);
    assert!(!p.side(from).ctx.mem().is_valid(mine.lkey));

    assert_eq!(p.a.state(), QpState::Rts);
    assert_eq!(p.b.state(), QpState::Rts);
    invalidated.expect("an invalidated STag")
}

fn check_negotiated(p: &Pair, rev: u8, crc: bool, m_ab: bool, m_ba: bool) {
    for (e, tx, rx) in [(End::A, m_ab, m_ba), (End::B, m_ba, m_ab)] {
        let s = match e {
            End::A => &p.a,
            End::B => &p.b,
        };
        let (n, _) = established(s);
        assert_eq!(n.revision, rev, "{e:?} {n:?}");
        assert_eq!(n.crc, crc, "{e:?} {n:?}");
        assert_eq!(n.markers_tx, tx, "{e:?} {n:?}");
        assert_eq!(n.markers_rx, rx, "{e:?} {n:?}");
        assert!(!n.p2p && n.rtr.is_none(), "{e:?} {n:?}");
        assert_eq!(s.ctx.qp(s.qp).and_then(|q| q.negotiated()), Some(&n));
    }
}

fn run_matrix(crc: bool, m_ab: bool, m_ba: bool, rev: u8) {
    // A asks for markers in what it receives (B->A), B in what it receives.
    let mut p = Pair::connected(
        QpConfig::default(),
        Chunking::whole(1 << 16),
        mpa(rev, crc, m_ba),
        mpa(rev, crc, m_ab),
    );
    check_negotiated(&p, rev, crc, m_ab, m_ba);
    let inv_at_b = all_ops(&mut p, End::A, m_ab);
    let inv_at_a = all_ops(&mut p, End::B, m_ba);
    assert!(!p.a.ctx.mem().is_valid(inv_at_a.rkey));
    // The STag B invalidated no longer admits a Read: B terminates and
    // A's Read fails with a remote access error.
    let sink = p.a.reg(3, Access::LOCAL_WRITE);
    post_send(
        &mut p.a,
        999,
        SendOp::Read {
            remote_addr: inv_at_b.iova,
            rkey: inv_at_b.rkey,
        },
        &[sge(&sink, 0, 3)],
        true,
    );
    p.drive();
    let wcs = p.a.completions();
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status),
        (999, WcStatus::RemoteAccessError),
        "{wcs:?}"
    );
    assert!(
        p.a.events
            .iter()
            .any(|e| matches!(e, QpEvent::RemoteTerminate(_))),
        "{:?}",
        p.a.events
    );
    assert!(p.b.bytes(&inv_at_b).iter().all(|&b| b == 0));
    assert!(
        p.b.events
            .iter()
            .any(|e| matches!(e, QpEvent::LocalTerminate(_))),
        "{:?}",
        p.b.events
    );
    assert_eq!(p.a.state(), QpState::Error);
    assert_eq!(p.b.state(), QpState::Error);
}

macro_rules! matrix {
    ($($name:ident: crc $crc:expr, ab $ab:expr, ba $ba:expr, rev $rev:expr;)*) => {
        $(
            #[test]
            fn $name() {
                run_matrix($crc, $ab, $ba, $rev);
            }
        )*
    };
}

matrix! {
    matrix_crc_off_markers_ab_off_ba_off_rev1: crc false, ab false, ba false, rev 1;
    matrix_crc_off_markers_ab_off_ba_off_rev2: crc false, ab false, ba false, rev 2;
    matrix_crc_off_markers_ab_off_ba_on_rev1: crc false, ab false, ba true, rev 1;
    matrix_crc_off_markers_ab_off_ba_on_rev2: crc false, ab false, ba true, rev 2;
    matrix_crc_off_markers_ab_on_ba_off_rev1: crc false, ab true, ba false, rev 1;
    matrix_crc_off_markers_ab_on_ba_off_rev2: crc false, ab true, ba false, rev 2;
    matrix_crc_off_markers_ab_on_ba_on_rev1: crc false, ab true, ba true, rev 1;
    matrix_crc_off_markers_ab_on_ba_on_rev2: crc false, ab true, ba true, rev 2;
    matrix_crc_on_markers_ab_off_ba_off_rev1: crc true, ab false, ba false, rev 1;
    matrix_crc_on_markers_ab_off_ba_off_rev2: crc true, ab false, ba false, rev 2;
    matrix_crc_on_markers_ab_off_ba_on_rev1: crc true, ab false, ba true, rev 1;
    matrix_crc_on_markers_ab_off_ba_on_rev2: crc true, ab false, ba true, rev 2;
    matrix_crc_on_markers_ab_on_ba_off_rev1: crc true, ab true, ba false, rev 1;
    matrix_crc_on_markers_ab_on_ba_off_rev2: crc true, ab true, ba false, rev 2;
    matrix_crc_on_markers_ab_on_ba_on_rev1: crc true, ab true, ba true, rev 1;
    matrix_crc_on_markers_ab_on_ba_on_rev2: crc true, ab true, ba true, rev 2;
}

// ---- RTR in peer-to-peer mode ----------------------------------------------

fn rtr_p2p(t: RtrType) {
    let a = Config {
        revision: 2,
        p2p: true,
        rtr: RtrSet::only(t),
        ..Config::default()
    };
    let b = Config {
        revision: 2,
        ..Config::default()
    };
    let mut p = Pair::new(QpConfig::default(), Chunking::whole(1 << 16));
    // Receives posted before the connection: the RTR must not take one.
    let ra = p.a.reg(4096, Access::LOCAL_WRITE);
    post_recv(&mut p.a, 1, &[sge(&ra, 0, 4096)]);
    let rb = p.b.reg(4096, Access::LOCAL_WRITE);
    post_recv(&mut p.b, 2, &[sge(&rb, 0, 4096)]);
    p.start(a, &[], b);
    p.drive();
    assert_eq!(p.a.state(), QpState::Rts, "{:?}", p.a.events);
    assert_eq!(p.b.state(), QpState::Rts, "{:?}", p.b.events);
    for s in [&p.a, &p.b] {
        let (n, _) = established(s);
        assert!(n.p2p, "{n:?}");
        assert_eq!(n.rtr, Some(t), "{n:?}");
        assert_eq!(n.revision, 2);
    }
    // The RTR crossed (and, for a Read, its zero-length response) ...
    let sa = p.a.ctx.qp_stats(p.a.qp).unwrap();
    let sb = p.b.ctx.qp_stats(p.b.qp).unwrap();
    assert_eq!((sa.tx_fpdus, sb.rx_fpdus), (1, 1), "{sa:?} {sb:?}");
    let resp = u64::from(t == RtrType::Read);
    assert_eq!((sb.tx_fpdus, sa.rx_fpdus), (resp, resp), "{sa:?} {sb:?}");
    // ... but the application saw nothing.
    assert!(p.a.completions().is_empty());
    assert!(p.b.completions().is_empty());
    for s in [&p.a, &p.b] {
        assert!(
            s.events
                .iter()
                .all(|e| matches!(e, QpEvent::Established { .. } | QpEvent::ConnectRequest(_))),
            "{:?}",
            s.events
        );
    }
    // The pre-posted receives take the first real Sends.
    let msg = pattern(1000, 7);
    let src = p.a.reg_with(&msg, Access::NONE);
    post_send(&mut p.a, 3, SEND, &[sge(&src, 0, 1000)], true);
    let src = p.b.reg_with(&msg[..500], Access::NONE);
    post_send(&mut p.b, 4, SEND, &[sge(&src, 0, 500)], true);
    p.drive();
    let wa = keys(&p.a.completions());
    let wb = keys(&p.b.completions());
    assert!(
        wa.contains(&(3, WcStatus::Success, WcOpcode::Send, 1000)),
        "{wa:?}"
    );
    assert!(
        wa.contains(&(1, WcStatus::Success, WcOpcode::Recv, 500)),
        "{wa:?}"
    );
    assert!(
        wb.contains(&(4, WcStatus::Success, WcOpcode::Send, 500)),
        "{wb:?}"
    );
    assert!(
        wb.contains(&(2, WcStatus::Success, WcOpcode::Recv, 1000)),
        "{wb:?}"
    );
    assert_eq!((wa.len(), wb.len()), (2, 2));
    assert_eq!(&p.b.bytes(&rb)[..1000], &msg[..]);
    assert_eq!(&p.a.bytes(&ra)[..500], &msg[..500]);
    // Everything else works both ways.
    for from in [End::A, End::B] {
        send_one(&mut p, from, SEND, &pattern(5000, 8), 10);
        write_one(&mut p, from, &pattern(7000, 9), 11);
        read_one(&mut p, from, &pattern(9000, 10), 12);
    }
}

#[test]
fn rtr_p2p_send() {
    rtr_p2p(RtrType::Send);
}

#[test]
fn rtr_p2p_write() {
    rtr_p2p(RtrType::Write);
}

#[test]
fn rtr_p2p_read() {
    rtr_p2p(RtrType::Read);
}

/// Bytes `end` sent, per transcript chunk prefix.
fn sent_by(p: &Pair, end: End) -> usize {
    p.transcript()
        .iter()
        .filter(|(e, _)| *e == end)
        .map(|(_, b)| b.len())
        .sum()
}

#[test]
fn responder_sends_nothing_before_initiators_first_fpdu() {
    const FRAME: usize = 20 + 4; // MPA header plus the RFC 6581 words
    for chunking in [Chunking::whole(1 << 16), Chunking::random(7, 5)] {
        let mut p = Pair::new(QpConfig::default(), chunking);
        // B's Send is posted before the connection exists.
        let msg = pattern(3000, 1);
        let src = p.b.reg_with(&msg, Access::NONE);
        post_send(&mut p.b, 1, SEND, &[sge(&src, 0, 3000)], true);
        let dst_a = p.a.reg(3000, Access::LOCAL_WRITE);
        post_recv(&mut p.a, 2, &[sge(&dst_a, 0, 3000)]);
        let dst_b = p.b.reg(100, Access::LOCAL_WRITE);
        post_recv(&mut p.b, 3, &[sge(&dst_b, 0, 100)]);
        p.start(mpa(2, false, false), &[], mpa(2, false, false));
        p.drive();
        assert_eq!(p.a.state(), QpState::Rts);
        assert_eq!(p.b.state(), QpState::Rts);
        // Only the MPA frames crossed.
        assert_eq!(sent_by(&p, End::A), FRAME);
        assert_eq!(sent_by(&p, End::B), FRAME);
        assert!(p.a.completions().is_empty() && p.b.completions().is_empty());
        // A's first FPDU (a 100-byte Send) releases B.
        let data = pattern(100, 2);
        let src_a = p.a.reg_with(&data, Access::NONE);
        post_send(&mut p.a, 4, SEND, &[sge(&src_a, 0, 100)], true);
        p.drive();
        let first_fpdu = 2 + UNTAGGED_HEADER_LEN + 100 + 4; // no pad needed
        let (mut a_sent, mut b_sent) = (0, 0);
        for (e, bytes) in p.transcript() {
            match e {
                End::A => a_sent += bytes.len(),
                End::B => {
                    if b_sent >= FRAME {
                        assert!(
                            a_sent >= FRAME + first_fpdu,
                            "B sent an FPDU before A's first one was complete: a_sent {a_sent} b_sent {b_sent} {chunking:?}"
                        );
                    }
                    b_sent += bytes.len();
                }
            }
        }
        assert!(b_sent > FRAME);
        let wa = keys(&p.a.completions());
        assert!(
            wa.contains(&(2, WcStatus::Success, WcOpcode::Recv, 3000)),
            "{wa:?}"
        );
        assert!(
            wa.contains(&(4, WcStatus::Success, WcOpcode::Send, 100)),
            "{wa:?}"
        );
        let wb = keys(&p.b.completions());
        assert!(
            wb.contains(&(1, WcStatus::Success, WcOpcode::Send, 3000)),
            "{wb:?}"
        );
        assert!(
            wb.contains(&(3, WcStatus::Success, WcOpcode::Recv, 100)),
            "{wb:?}"
        );
        assert_eq!(p.a.bytes(&dst_a), &msg[..]);
        assert_eq!(p.b.bytes(&dst_b), &data[..]);
    }
}

// ---- private data ------------------------------------------------------------

fn private_data_roundtrip(rev: u8, n: usize) {
    let req = pattern(n, 100 + n as u64);
    let acc = pattern(n, 200 + n as u64);
    let mut p = Pair::new(QpConfig::default(), Chunking::random(97, n as u64));
    p.accept_data = acc.clone();
    p.start(mpa(rev, true, false), &req, mpa(rev, false, true));
    p.drive();
    assert_eq!(
        p.a.state(),
        QpState::Rts,
        "rev {rev} n {n}: {:?}",
        p.a.events
    );
    assert_eq!(
        p.b.state(),
        QpState::Rts,
        "rev {rev} n {n}: {:?}",
        p.b.events
    );
    let cr =
        p.b.events
            .iter()
            .find_map(|e| match e {
                QpEvent::ConnectRequest(r) => Some(r.clone()),
                _ => None,
            })
            .expect("ConnectRequest");
    assert_eq!(cr.private_data, req, "rev {rev} n {n}");
    assert_eq!(cr.revision, rev);
    assert_eq!(cr.ird_ord.is_some(), rev == 2);
    assert_eq!(established(&p.a).1, acc, "rev {rev} n {n}");
    assert_eq!(established(&p.b).1, req, "rev {rev} n {n}");
    // The stream right after the frames is framed correctly.
    send_one(&mut p, End::A, SEND, &pattern(3000, 1), 1);
    send_one(&mut p, End::B, SEND, &pattern(3000, 2), 2);
}

#[test]
fn private_data_rev1_0_1_256_512() {
    for n in [0, 1, 256, 512] {
        private_data_roundtrip(1, n);
    }
}

#[test]
fn private_data_rev2_0_1_256_508() {
    assert_eq!(MAX_ULP_PRIVATE_DATA_ENHANCED, 508);
    for n in [0, 1, 256, 508] {
        private_data_roundtrip(2, n);
    }
}

#[test]
fn private_data_too_long_is_refused() {
    let too_long = Err(VerbsError::Connect(HandshakeError::PrivateDataTooLong));
    for (rev, max) in [(1u8, 512usize), (2, 508)] {
        // In the request.
        let mut p = Pair::new(QpConfig::default(), Chunking::default());
        let r =
            p.a.ctx
                .connect(p.a.qp, mpa(rev, false, false), &vec![1; max + 1], p.now);
        assert_eq!(r, too_long, "rev {rev}");
        assert_eq!(p.a.state(), QpState::Idle);
        // In the accept and in the reject; then the largest allowed works.
        let mut p = Pair::new(QpConfig::default(), Chunking::default());
        p.auto_accept = false;
        p.start(mpa(rev, false, false), &[], mpa(rev, false, false));
        p.drive();
        assert!(matches!(p.b.events[..], [QpEvent::ConnectRequest(_)]));
        assert_eq!(p.b.ctx.accept(p.b.qp, &vec![2; max + 1]), too_long);
        assert_eq!(p.b.ctx.reject(p.b.qp, &vec![2; max + 1]), too_long);
        let acc = pattern(max, 5);
        p.b.ctx.accept(p.b.qp, &acc).expect("accept");
        p.drive();
        assert_eq!(p.a.state(), QpState::Rts, "{:?}", p.a.events);
        assert_eq!(p.b.state(), QpState::Rts, "{:?}", p.b.events);
        assert_eq!(established(&p.a).1, acc);
        send_one(&mut p, End::A, SEND, &pattern(10, 1), 1);
    }
}

#[test]
fn reject_with_private_data() {
    for rev in [1, 2] {
        let mut p = Pair::new(QpConfig::default(), Chunking::default());
        p.auto_accept = false;
        // Work requests posted during setup are flushed by the reject.
        let buf = p.a.reg(100, rw());
        post_send(&mut p.a, 1, SEND, &[sge(&buf, 0, 10)], true);
        post_recv(&mut p.a, 2, &[sge(&buf, 0, 100)]);
        let bbuf = p.b.reg(100, rw());
        post_recv(&mut p.b, 3, &[sge(&bbuf, 0, 100)]);
        post_send(&mut p.b, 4, SEND, &[sge(&bbuf, 0, 10)], true);
        p.start(mpa(rev, false, false), b"hello", mpa(rev, false, false));
        p.drive();
        assert!(p.a.completions().is_empty() && p.b.completions().is_empty());
        let data = pattern(77, 9);
        p.b.ctx.reject(p.b.qp, &data).expect("reject");
        p.drive();
        assert!(
            p.a.events.contains(&QpEvent::Rejected {
                private_data: data.clone()
            }),
            "{:?}",
            p.a.events
        );
        assert_eq!(p.a.state(), QpState::Error);
        assert_eq!(p.b.state(), QpState::Error);
        let mut wa = keys(&p.a.completions());
        wa.sort_by_key(|k| k.0);
        assert_eq!(
            wa,
            vec![
                (1, WcStatus::WrFlushError, WcOpcode::Send, 0),
                (2, WcStatus::WrFlushError, WcOpcode::Recv, 0)
            ]
        );
        let mut wb = keys(&p.b.completions());
        wb.sort_by_key(|k| k.0);
        assert_eq!(
            wb,
            vec![
                (3, WcStatus::WrFlushError, WcOpcode::Recv, 0),
                (4, WcStatus::WrFlushError, WcOpcode::Send, 0)
            ]
        );
        assert!(!p
            .b
            .events
            .iter()
            .any(|e| matches!(e, QpEvent::Established { .. })));
    }
}

// ---- IRD/ORD -------------------------------------------------------------------

#[test]
fn ord_limits_outstanding_reads() {
    for (a_ord, b_ird) in [(1u16, 1u16), (3, 8), (2, 2), (8, 3)] {
        for chunking in [Chunking::whole(1 << 20), Chunking::random(300, 11)] {
            let a = Config {
                ord: a_ord,
                ..Config::default()
            };
            let b = Config {
                ird: b_ird,
                ..Config::default()
            };
            let mut p = Pair::connected(QpConfig::default(), chunking, a, b);
            let ord = a_ord.min(b_ird);
            assert_eq!(established(&p.a).0.ord, ord);
            assert_eq!(established(&p.b).0.ird, ord);
            let data = pattern(200_000, 3);
            let src = p.b.reg_with(&data, Access::REMOTE_READ);
            let sink = p.a.reg(data.len(), Access::LOCAL_WRITE);
            let sizes = [
                1usize, 5000, 0, 20_000, 3, 70_000, 1460, 0, 9000, 40_000, 7, 12,
            ];
            let mut off = 0;
            let mut expect = Vec::new();
            for (i, &len) in sizes.iter().enumerate() {
                post_send(
                    &mut p.a,
                    i as u64,
                    SendOp::Read {
                        remote_addr: src.iova + off as u64,
                        rkey: src.rkey,
                    },
                    &[sge(&sink, off, len)],
                    true,
                );
                expect.push((i as u64, WcStatus::Success, WcOpcode::RdmaRead, len as u32));
                off += len;
            }
            p.drive();
            assert_eq!(
                keys(&p.a.completions()),
                expect,
                "ord {ord} {:?}",
                p.b.events
            );
            assert_eq!(&p.a.bytes(&sink)[..off], &data[..off]);
            assert!(p.b.completions().is_empty());
            assert_eq!(p.a.state(), QpState::Rts);
            assert_eq!(p.b.state(), QpState::Rts, "{:?}", p.b.events);
        }
    }
}

// ---- completion ordering ---------------------------------------------------------

#[test]
fn send_queue_completes_in_posting_order() {
    for sig_all in [false, true] {
        let config = QpConfig {
            sig_all,
            ..QpConfig::default()
        };
        let mut p = Pair::connected(
            config,
            Chunking::random(1000, 2),
            Config::default(),
            Config::default(),
        );
        let data = pattern(BIG, 1);
        let src_b = p.b.reg_with(&data, Access::REMOTE_READ);
        let target = p.b.reg(100, rw());
        let rbuf = p.b.reg(200, Access::LOCAL_WRITE);
        post_recv(&mut p.b, 100, &[sge(&rbuf, 0, 100)]);
        post_recv(&mut p.b, 101, &[sge(&rbuf, 100, 100)]);
        let sink = p.a.reg(BIG, Access::LOCAL_WRITE);
        let small = p.a.reg_with(&pattern(10, 2), Access::NONE);
        let inv = p.a.reg(10, rw());
        let read = SendOp::Read {
            remote_addr: src_b.iova,
            rkey: src_b.rkey,
        };
        post_send(&mut p.a, 1, read, &[sge(&sink, 0, BIG)], true);
        post_send(&mut p.a, 2, SEND, &[sge(&small, 0, 10)], true);
        let write = SendOp::Write {
            remote_addr: target.iova,
            rkey: target.rkey,
        };
        post_send(&mut p.a, 3, write, &[sge(&small, 0, 10)], true);
        post_send(&mut p.a, 4, SEND, &[sge(&small, 0, 10)], false); // unsignaled
        post_send(&mut p.a, 5, write, &[sge(&small, 0, 5)], false); // unsignaled
        post_send(
            &mut p.a,
            6,
            SendOp::LocalInvalidate { stag: inv.lkey },
            &[],
            true,
        );
        p.drive();
        let got: Vec<_> =
            p.a.completions()
                .iter()
                .map(|w| (w.wr_id, w.status, w.opcode))
                .collect();
        let mut want = vec![
            (1, WcStatus::Success, WcOpcode::RdmaRead),
            (2, WcStatus::Success, WcOpcode::Send),
            (3, WcStatus::Success, WcOpcode::RdmaWrite),
            (4, WcStatus::Success, WcOpcode::Send),
            (5, WcStatus::Success, WcOpcode::RdmaWrite),
            (6, WcStatus::Success, WcOpcode::LocalInvalidate),
        ];
        if !sig_all {
            want.retain(|w| w.0 != 4 && w.0 != 5);
        }
        assert_eq!(got, want, "sig_all {sig_all}");
        assert_eq!(p.a.bytes(&sink), &data[..]);
        assert_eq!(
            keys(&p.b.completions()),
            vec![
                (100, WcStatus::Success, WcOpcode::Recv, 10),
                (101, WcStatus::Success, WcOpcode::Recv, 10)
            ]
        );
    }
}

#[test]
fn unsignaled_failure_still_completes() {
    let mut p = Pair::connected(
        QpConfig::default(),
        Chunking::default(),
        Config::default(),
        Config::default(),
    );
    let sink = p.a.reg(10, Access::LOCAL_WRITE);
    let small = p.a.reg_with(&[1; 10], Access::NONE);
    post_send(&mut p.a, 1, SEND, &[sge(&small, 0, 0)], false);
    post_send(
        &mut p.a,
        2,
        SendOp::Read {
            remote_addr: 0,
            rkey: 0x1234_5600,
        },
        &[sge(&sink, 0, 10)],
        false,
    );
    post_send(&mut p.a, 3, SEND, &[sge(&small, 0, 10)], true);
    let rbuf = p.b.reg(10, Access::LOCAL_WRITE);
    post_recv(&mut p.b, 10, &[sge(&rbuf, 0, 10)]);
    post_recv(&mut p.b, 11, &[sge(&rbuf, 0, 10)]);
    p.drive();
    // The unsignaled Send is silent; the unsignaled Read fails and
    // completes; the signaled Send behind it completes after it (it went
    // out before the Terminate arrived, or was flushed by it).
    let wa = keys(&p.a.completions());
    assert_eq!(wa.len(), 2, "{wa:?}");
    assert_eq!(
        (wa[0].0, wa[0].1),
        (2, WcStatus::RemoteAccessError),
        "{wa:?}"
    );
    assert_eq!(wa[1].0, 3, "{wa:?}");
    assert!(
        matches!(wa[1].1, WcStatus::Success | WcStatus::WrFlushError),
        "{wa:?}"
    );
    assert_eq!(p.a.state(), QpState::Error);
}

// ---- disconnect --------------------------------------------------------------

#[test]
fn disconnect_flushes_and_peer_sees_disconnected() {
    for initiator in [true, false] {
        let mut p = Pair::connected(
            QpConfig::default(),
            Chunking::default(),
            Config::default(),
            Config::default(),
        );
        // Let the initiator's first FPDU through so both may send.
        send_one(&mut p, End::A, SEND, &[1, 2, 3], 50);
        let (me, peer) = if initiator {
            (End::A, End::B)
        } else {
            (End::B, End::A)
        };
        let big = p.side(me).reg_with(&pattern(BIG, 1), rw());
        let pbuf = p.side(peer).reg(BIG, rw());
        post_recv(p.side(peer), 20, &[sge(&pbuf, 0, 10)]);
        post_recv(p.side(peer), 21, &[sge(&pbuf, 0, 10)]);
        post_recv(p.side(me), 10, &[sge(&big, 0, 10)]);
        post_send(p.side(me), 1, SEND, &[sge(&big, 0, BIG)], true);
        let read = SendOp::Read {
            remote_addr: pbuf.iova,
            rkey: pbuf.rkey,
        };
        post_send(p.side(me), 2, read, &[sge(&big, 0, 100)], true);
        let write = SendOp::Write {
            remote_addr: pbuf.iova,
            rkey: pbuf.rkey,
        };
        post_send(p.side(me), 3, write, &[sge(&big, 0, 100)], false);
        let s = p.side(me);
        s.ctx.disconnect(s.qp);
        assert_eq!(s.state(), QpState::Error);
        assert_eq!(
            keys(&s.completions()),
            vec![
                (1, WcStatus::WrFlushError, WcOpcode::Send, 0),
                (2, WcStatus::WrFlushError, WcOpcode::RdmaRead, 0),
                (3, WcStatus::WrFlushError, WcOpcode::RdmaWrite, 0),
                (10, WcStatus::WrFlushError, WcOpcode::Recv, 0),
            ]
        );
        p.drive();
        let ps = p.side(peer);
        assert!(
            ps.events.contains(&QpEvent::Disconnected),
            "{:?}",
            ps.events
        );
        assert_eq!(ps.state(), QpState::Error);
        assert_eq!(
            keys(&ps.completions()),
            vec![
                (20, WcStatus::WrFlushError, WcOpcode::Recv, 0),
                (21, WcStatus::WrFlushError, WcOpcode::Recv, 0),
            ]
        );
        assert!(p.side(me).events.contains(&QpEvent::Disconnected));
        assert!(p.side(me).completions().is_empty());
        // Posting after the close completes with a flush at once.
        post_send(p.side(peer), 30, SEND, &[], true);
        assert_eq!(
            keys(&p.side(peer).completions()),
            vec![(30, WcStatus::WrFlushError, WcOpcode::Send, 0)]
        );
        assert!(p.side(peer).bytes(&pbuf).iter().all(|&b| b == 0));
    }
}

// ---- stream-splitting invariance (proptest) ------------------------------------

/// Largest message of the random workloads.
const SLOT: usize = 20_000;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Send,
    Write,
    Read,
    /// FetchAdd of `len + 1` on the word at the peer's target slot.
    FetchAdd,
    /// Immediate Data carrying `len`.
    Immediate,
}

#[derive(Clone, Copy, Debug)]
struct Op {
    kind: Kind,
    from_a: bool,
    len: usize,
    /// Offset in the source region.
    off: usize,
    signaled: bool,
}

/// Everything observable after a workload: region contents and the
/// completion sequences of both ends, per queue (send and receive
/// completions share one CQ, and how they interleave there depends on when
/// bytes arrive; each queue's own sequence must not).
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    regions: Vec<Vec<u8>>,
    wcs_a: [Vec<WcKey>; 2],
    wcs_b: [Vec<WcKey>; 2],
}

/// Send-queue and receive-queue completions, each in CQ order.
fn by_queue(wcs: Vec<WcKey>) -> [Vec<WcKey>; 2] {
    let (rq, sq) = wcs.into_iter().partition(|w| w.2 == WcOpcode::Recv);
    [sq, rq]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    (
        prop_oneof![
            3 => Just(Kind::Send),
            3 => Just(Kind::Write),
            3 => Just(Kind::Read),
            1 => Just(Kind::FetchAdd),
            1 => Just(Kind::Immediate),
        ],
        any::<bool>(),
        prop_oneof![Just(0usize), 1..64usize, 0..SLOT],
        0..SLOT,
        prop::bool::weighted(0.8),
    )
        .prop_map(|(kind, from_a, len, off, signaled)| Op {
            kind,
            from_a,
            len,
            off,
            signaled,
        })
}

#[allow(clippy::too_many_arguments)]
fn run_workload(
    ops: &[Op],
    seed: u64,
    crc: bool,
    m_ab: bool,
    m_ba: bool,
    rtr: RtrType,
    c: Chunking,
) -> Outcome {
    // Peer-to-peer mode: the initiator's RTR lets the responder send at
    // once, whatever the workload's first operation (RFC 5044 §7.1.2).
    let a = Config {
        p2p: true,
        rtr: RtrSet::only(rtr),
        ..mpa(2, crc, m_ba)
    };
    let mut p = Pair::connected(QpConfig::default(), c, a, mpa(2, crc, m_ab));
    let n = ops.len().max(1);
    // Per end: a source (2 slots of random data), a receive area, a
    // Write target and a Read sink, one slot per operation.
    let mut regs = Vec::new();
    for (i, e) in [End::A, End::B].into_iter().enumerate() {
        let s = p.side(e);
        let src = s.reg_with(&pattern(2 * SLOT, seed + i as u64), Access::REMOTE_READ);
        let recv = s.reg(n * SLOT, Access::LOCAL_WRITE);
        let target = s.reg_with(&target_init(n, seed, i), rw() | Access::REMOTE_ATOMIC);
        assert_eq!(target.iova % 8, 0, "allocator alignment");
        let sink = s.reg(n * SLOT, Access::LOCAL_WRITE);
        regs.push([src, recv, target, sink]);
    }
    let idx = |e: End| usize::from(e == End::B);
    for (i, op) in ops.iter().enumerate() {
        let (from, to) = if op.from_a {
            (End::A, End::B)
        } else {
            (End::B, End::A)
        };
        let [src, _, _, sink] = regs[idx(from)];
        let [peer_src, peer_recv, peer_target, _] = regs[idx(to)];
        let slot = i * SLOT;
        let wr = i as u64;
        match op.kind {
            Kind::Send => {
                post_recv(p.side(to), 1000 + wr, &[sge(&peer_recv, slot, SLOT)]);
                post_send(
                    p.side(from),
                    wr,
                    SEND,
                    &[sge(&src, op.off, op.len)],
                    op.signaled,
                );
            }
            Kind::Write => post_send(
                p.side(from),
                wr,
                SendOp::Write {
                    remote_addr: peer_target.iova + slot as u64,
                    rkey: peer_target.rkey,
                },
                &[sge(&src, op.off, op.len)],
                op.signaled,
            ),
            Kind::Read => post_send(
                p.side(from),
                wr,
                SendOp::Read {
                    remote_addr: peer_src.iova + op.off as u64,
                    rkey: peer_src.rkey,
                },
                &[sge(&sink, slot, op.len)],
                op.signaled,
            ),
            Kind::FetchAdd => post_send(
                p.side(from),
                wr,
                SendOp::FetchAdd {
                    remote_addr: peer_target.iova + slot as u64,
                    rkey: peer_target.rkey,
                    add: op.len as u64 + 1,
                    add_mask: 0,
                },
                &[sge(&sink, slot, 8)],
                op.signaled,
            ),
            Kind::Immediate => {
                post_recv(p.side(to), 1000 + wr, &[sge(&peer_recv, slot, SLOT)]);
                post_send(
                    p.side(from),
                    wr,
                    SendOp::ImmediateData {
                        data: op.len as u64,
                        solicited: false,
                    },
                    &[],
                    op.signaled,
                );
            }
        }
    }
    p.drive();
    assert_eq!(p.a.state(), QpState::Rts, "{:?}", p.a.events);
    assert_eq!(p.b.state(), QpState::Rts, "{:?}", p.b.events);
    let mut regions = Vec::new();
    for (i, e) in [End::A, End::B].into_iter().enumerate() {
        for mr in &regs[i] {
            regions.push(p.side(e).bytes(mr).to_vec());
        }
    }
    Outcome {
        regions,
        wcs_a: by_queue(keys(&p.a.completions())),
        wcs_b: by_queue(keys(&p.b.completions())),
    }
}

/// The initial contents of end `end`'s Write and atomic target.
fn target_init(n: usize, seed: u64, end: usize) -> Vec<u8> {
    pattern(n * SLOT, seed + 2 + end as u64)
}

/// What a correct run must produce, computed without the protocol.
fn check_expected(ops: &[Op], seed: u64, out: &Outcome) {
    let src = [pattern(2 * SLOT, seed), pattern(2 * SLOT, seed + 1)];
    let n = ops.len().max(1);
    // regions: per end [src, recv, target, sink]
    let mut want: Vec<Vec<u8>> = Vec::new();
    for (end, s) in src.iter().enumerate() {
        want.push(s.clone());
        want.push(vec![0; n * SLOT]);
        want.push(target_init(n, seed, end));
        want.push(vec![0; n * SLOT]);
    }
    let mut sends = [0usize; 2];
    let mut wcs: [Vec<WcKey>; 2] = [Vec::new(), Vec::new()];
    let mut recvs: [Vec<WcKey>; 2] = [Vec::new(), Vec::new()];
    for (i, op) in ops.iter().enumerate() {
        let (f, t) = if op.from_a { (0, 1) } else { (1, 0) };
        let slot = i * SLOT;
        let word =
            |w: &Vec<Vec<u8>>| u64::from_ne_bytes(w[t * 4 + 2][slot..slot + 8].try_into().unwrap());
        let (opcode, data, region) = match op.kind {
            Kind::FetchAdd => {
                let orig = word(&want);
                let new = orig.wrapping_add(op.len as u64 + 1);
                want[t * 4 + 2][slot..slot + 8].copy_from_slice(&new.to_ne_bytes());
                want[f * 4 + 3][slot..slot + 8].copy_from_slice(&orig.to_ne_bytes());
                if op.signaled {
                    wcs[f].push((i as u64, WcStatus::Success, WcOpcode::AtomicFetchAdd, 8));
                }
                continue;
            }
            Kind::Immediate => {
                if op.signaled {
                    wcs[f].push((i as u64, WcStatus::Success, WcOpcode::ImmediateData, 0));
                }
                sends[t] += 1;
                recvs[t].push((1000 + i as u64, WcStatus::Success, WcOpcode::Recv, 0));
                continue;
            }
            Kind::Send => (WcOpcode::Send, &src[f][op.off..op.off + op.len], t * 4 + 1),
            Kind::Write => (
                WcOpcode::RdmaWrite,
                &src[f][op.off..op.off + op.len],
                t * 4 + 2,
            ),
            Kind::Read => (
                WcOpcode::RdmaRead,
                &src[t][op.off..op.off + op.len],
                f * 4 + 3,
            ),
        };
        want[region][slot..slot + op.len].copy_from_slice(data);
        if op.signaled {
            wcs[f].push((i as u64, WcStatus::Success, opcode, op.len as u32));
        }
        if let Kind::Send = op.kind {
            sends[t] += 1;
            recvs[t].push((
                1000 + i as u64,
                WcStatus::Success,
                WcOpcode::Recv,
                op.len as u32,
            ));
        }
    }
    assert!(out.regions == want, "region contents differ from the model");
    for (end, [sq, rq]) in [&out.wcs_a, &out.wcs_b].into_iter().enumerate() {
        assert_eq!(sq, &wcs[end], "send queue of end {end}");
        assert_eq!(rq, &recvs[end], "receive queue of end {end}");
        assert_eq!(rq.len(), sends[end]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_stream_split_gives_identical_results(
        ops in prop::collection::vec(op_strategy(), 0..8),
        seed in any::<u64>(),
        max in prop_oneof![Just(1usize), 1..64usize, 1..70_000usize],
        chunk_seed in any::<u64>(),
        crc in any::<bool>(),
        m_ab in any::<bool>(),
        m_ba in any::<bool>(),
        rtr in prop_oneof![Just(RtrType::Send), Just(RtrType::Write), Just(RtrType::Read)],
    ) {
        let reference = run_workload(&ops, seed, crc, m_ab, m_ba, rtr, Chunking::whole(1 << 20));
        check_expected(&ops, seed, &reference);
        let split = run_workload(&ops, seed, crc, m_ab, m_ba, rtr, Chunking::random(max, chunk_seed));
        prop_assert!(split.regions == reference.regions, "region contents differ");
        prop_assert_eq!(&split.wcs_a, &reference.wcs_a);
        prop_assert_eq!(&split.wcs_b, &reference.wcs_b);
    }
}

#[test]
fn locally_invalidated_stag_refuses_the_peer() {
    let mut p = Pair::connected(
        QpConfig::default(),
        Chunking::default(),
        Config::default(),
        Config::default(),
    );
    send_one(&mut p, End::A, SEND, &[9; 4], 1); // releases the responder
    let mine = p.a.reg_with(&[7; 64], rw());
    post_send(
        &mut p.a,
        2,
        SendOp::LocalInvalidate { stag: mine.lkey },
        &[],
        true,
    );
    p.drive();
    one_wc(&mut p.a, 2, WcOpcode::LocalInvalidate, None);
    let sink = p.b.reg(64, Access::LOCAL_WRITE);
    post_send(
        &mut p.b,
        3,
        SendOp::Read {
            remote_addr: mine.iova,
            rkey: mine.rkey,
        },
        &[sge(&sink, 0, 64)],
        true,
    );
    p.drive();
    let wb = keys(&p.b.completions());
    assert_eq!(
        wb.iter().map(|w| (w.0, w.1)).collect::<Vec<_>>(),
        vec![(3, WcStatus::RemoteAccessError)],
        "{wb:?}"
    );
    assert!(p.b.bytes(&sink).iter().all(|&b| b == 0));
}

#[test]
fn crc_is_used_if_either_side_asks() {
    for (ca, cb) in [(true, false), (false, true)] {
        for rev in [1, 2] {
            let mut p = Pair::connected(
                QpConfig::default(),
                Chunking::random(50, 3),
                mpa(rev, ca, false),
                mpa(rev, cb, false),
            );
            assert!(established(&p.a).0.crc && established(&p.b).0.crc);
            send_one(&mut p, End::A, SEND, &pattern(4000, 1), 1);
            send_one(&mut p, End::B, SEND, &pattern(4000, 2), 2);
        }
    }
}
