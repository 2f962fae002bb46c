//! FPDU alignment (RFC 5044 §8): a transport that cuts its segments where
//! `Context::poll_transmit_within` stopped gets segments that begin with
//! an FPDU and end with one, for every kind of message, with markers on
//! and off, also when a segment's room is split over two buffers (a
//! transmit ring wrapping round).

use iwarp::mem::Access;
use iwarp::mpa::framing::{RxDeframer, RxItem};
use iwarp::mpa::handshake::Config;
use iwarp::qp::{QpConfig, RecvWr, SendOp, SendWr, Sge};
use iwarp::testing::{Chunking, Pair, Side};

/// One segment's worth from `side`: at most `seg` bytes of whole FPDUs.
/// With `split`, the room is offered as two buffers cut at `split`.
fn segment(side: &mut Side, seg: usize, split: Option<usize>) -> Vec<u8> {
    let mut out = vec![0u8; seg];
    let first = split.unwrap_or(seg).min(seg);
    let n = side
        .ctx
        .poll_transmit_within(side.qp, &mut out[..first], seg);
    let mut len = n;
    if n == first && first < seg {
        len += side
            .ctx
            .poll_transmit_within(side.qp, &mut out[first..], seg - first);
    }
    out.truncate(len);
    out
}

/// Feed one segment to an independent deframer and check that it held
/// whole FPDUs only, each with a good CRC. Returns the FPDU count.
fn check_segment(deframer: &mut RxDeframer, seg: &[u8], max: usize) -> usize {
    assert!(seg.len() <= max, "segment of {} > {max}", seg.len());
    assert!(deframer.at_boundary(), "segment does not start an FPDU");
    let (mut off, mut fpdus) = (0, 0);
    while off < seg.len() {
        let (n, item) = deframer.next(&seg[off..]).expect("well framed");
        off += n;
        if let Some(RxItem::End { crc_ok }) = item {
            assert!(crc_ok);
            fpdus += 1;
        }
    }
    assert!(deframer.at_boundary(), "segment ends inside an FPDU");
    fpdus
}

fn run(markers: bool, emss: usize, split_seed: u64) {
    let mpa = Config {
        crc: true,
        markers,
        ..Config::default()
    };
    let cfg = QpConfig {
        emss,
        ..QpConfig::default()
    };
    let mut p = Pair::connected(cfg, Chunking::whole(1 << 16), mpa.clone(), mpa);
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let src_bytes: Vec<u8> = (0..40_000u32).map(|i| (i * 7) as u8).collect();
    let src = p.a.reg_with(&src_bytes, access);
    let dst = p.b.reg(40_000, access);
    let recv = p.b.reg(4096, access);
    let back = p.a.reg(40_000, access);
    for i in 0..4 {
        let sge = Sge {
            addr: recv.iova + i * 1024,
            len: 1024,
            lkey: recv.lkey,
        };
        p.b.ctx
            .post_recv(
                p.b.qp,
                &RecvWr {
                    wr_id: i,
                    sgl: &[sge],
                },
            )
            .unwrap();
    }
    // Small and large Writes and Sends back to back (short last FPDUs
    // followed by the next message), then a Read whose response B sends.
    let ops: [(SendOp, u64, u32); 7] = [
        (write(&dst, 0), 0, 10_000),
        (send(), 100, 3),
        (write(&dst, 10_000), 200, 700),
        (send(), 300, 1000),
        (write(&dst, 20_000), 1000, 1),
        (send(), 400, 0),
        (
            SendOp::Read {
                remote_addr: dst.iova,
                rkey: dst.rkey,
            },
            0,
            30_000,
        ),
    ];
    for (i, (op, off, len)) in ops.into_iter().enumerate() {
        let (addr, lkey) = if matches!(op, SendOp::Read { .. }) {
            (back.iova, back.lkey)
        } else {
            (src.iova + off, src.lkey)
        };
        p.a.ctx
            .post_send(
                p.a.qp,
                &SendWr {
                    wr_id: i as u64,
                    op,
                    sgl: &[Sge { addr, len, lkey }],
                    signaled: true,
                },
            )
            .unwrap();
    }
    let mut rx_b = RxDeframer::new(true, markers, 65535);
    let mut rx_a = RxDeframer::new(true, markers, 65535);
    let mut rng = split_seed | 1;
    let mut split = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (split_seed != 0).then_some((rng % emss as u64) as usize)
    };
    let (mut segments, mut fpdus) = (0, 0);
    for _ in 0..10_000 {
        let ab = segment(&mut p.a, emss, split());
        let ba = segment(&mut p.b, emss, split());
        if ab.is_empty() && ba.is_empty() {
            break;
        }
        for (seg, deframer, to) in [(&ab, &mut rx_b, &mut p.b), (&ba, &mut rx_a, &mut p.a)] {
            if seg.is_empty() {
                continue;
            }
            segments += 1;
            fpdus += check_segment(deframer, seg, emss);
            let used = to.ctx.handle_input(to.qp, seg, p.now);
            assert_eq!(used, seg.len());
        }
    }
    let wa = p.a.completions();
    assert_eq!(wa.len(), ops.len(), "{wa:?} {:?}", p.a.events);
    assert!(wa.iter().all(|c| c.status == iwarp::cq::WcStatus::Success));
    assert_eq!(p.b.completions().len(), 3);
    assert_eq!(&p.b.bytes(&dst)[..10_000], &src_bytes[..10_000]);
    assert_eq!(&p.a.bytes(&back)[..30_000], &p.b.bytes(&dst)[..30_000]);
    // Segments were filled: a message's short last FPDU is followed by
    // the start of the next one, cut to fit (the 3 B and 700 B messages
    // and the control messages ride along whole).
    assert!(fpdus >= segments, "{fpdus} FPDUs in {segments} segments");
    let payload = 10_000 + 3 + 700 + 1000 + 1 + 30_000;
    assert!(
        segments <= payload / (emss - 64) + 4,
        "{segments} segments for {payload} bytes at EMSS {emss}"
    );
}

fn write(dst: &iwarp::mem::MrInfo, off: u64) -> SendOp {
    SendOp::Write {
        remote_addr: dst.iova + off,
        rkey: dst.rkey,
    }
}

fn send() -> SendOp {
    SendOp::Send {
        solicited: false,
        invalidate: None,
    }
}

#[test]
fn segments_hold_whole_fpdus() {
    for markers in [false, true] {
        for emss in [536, 1448, 1460, 3466, 8948] {
            run(markers, emss, 0);
        }
    }
}

#[test]
fn segments_split_over_two_buffers_hold_whole_fpdus() {
    for markers in [false, true] {
        for seed in 1..=8 {
            run(markers, 1448, seed);
            run(markers, 3466, seed * 31);
        }
    }
}

/// An FPDU that does not fit the limit is cut to fill it when at least
/// 512 bytes of payload fit, and waits otherwise.
#[test]
fn an_fpdu_is_cut_to_fill_the_limit_or_waits() {
    let mpa = Config {
        crc: true,
        ..Config::default()
    };
    let mut p = Pair::connected(
        QpConfig::default(),
        Chunking::whole(1 << 16),
        mpa.clone(),
        mpa,
    );
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let src = p.a.reg_with(&[5u8; 1000], access);
    let dst = p.b.reg(1000, access);
    p.a.ctx
        .post_send(
            p.a.qp,
            &SendWr {
                wr_id: 1,
                op: write(&dst, 0),
                sgl: &[Sge {
                    addr: src.iova,
                    len: 1000,
                    lkey: src.lkey,
                }],
                signaled: true,
            },
        )
        .unwrap();
    let mut out = vec![0u8; 2000];
    // Room for less than `MIN_CUT` (512) bytes of payload: the FPDU waits.
    assert_eq!(p.a.ctx.poll_transmit_within(p.a.qp, &mut out, 300), 0);
    // Room for 1000 bytes: the FPDU is cut to fill it exactly.
    let first = p.a.ctx.poll_transmit_within(p.a.qp, &mut out, 1000);
    assert_eq!(first, 1000);
    assert_eq!(p.b.ctx.handle_input(p.b.qp, &out[..first], p.now), first);
    // The rest of the message in a second FPDU.
    let rest = p.a.ctx.poll_transmit_within(p.a.qp, &mut out, 2000);
    assert!(rest > 0 && rest < 100, "{rest}");
    assert_eq!(p.b.ctx.handle_input(p.b.qp, &out[..rest], p.now), rest);
    p.drive();
    assert_eq!(p.b.bytes(&dst), &[5u8; 1000][..]);
    let wc = p.a.completions();
    assert_eq!(wc.len(), 1, "{wc:?}");
}
