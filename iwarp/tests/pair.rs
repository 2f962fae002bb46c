//! End-to-end tests over the in-memory [`Pair`]: every operation under every
//! MPA setting, RTR in peer-to-peer mode, private data, IRD/ORD, completion
//! ordering, disconnect, and stream-splitting invariance (proptest).

mod common_ops;

use common_ops::*;
use iwarp::cq::{WcOpcode, WcStatus};
use iwarp::mem::{Access, MrInfo};
use iwarp::mpa::framing::mulpdu;
use iwarp::qp::{QpConfig, QpEvent, QpState, SendOp, MAX_SGE};
use iwarp::testing::{Chunking, End, Pair};
use iwarp::wire::ddp::{TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};

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
