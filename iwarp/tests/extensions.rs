//! RFC 7306 between two of our QPs over the in-memory [`Pair`]: FetchAdd
//! and CompareSwap (masked and plain), Immediate Data after an RDMA Write,
//! the IRD/ORD they share with RDMA Read, response order, and the errors a
//! requester sees. The checks each rule makes on a hostile peer's messages
//! are in `tests/negative.rs`.

mod common_ops;

use common_ops::*;
use iwarp::cq::{WcOpcode, WcStatus};
use iwarp::error::codes;
use iwarp::mem::{Access, MrInfo};
use iwarp::mpa::handshake::Config;
use iwarp::qp::{PostError, QpConfig, QpEvent, QpState, SendOp, SendWr, Sge};
use iwarp::testing::{Chunking, End, Pair};
use iwarp::verbs::VerbsError;

fn atomic_rights() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_ATOMIC
}

/// A's 8-byte sink and B's 64-bit word holding `init` (native order, as
/// an application on B would store it), at offset 8 of a 24-byte region.
fn word(p: &mut Pair, init: u64) -> (MrInfo, MrInfo) {
    let sink = p.a.reg(8, Access::LOCAL_WRITE);
    let mut bytes = [0u8; 24];
    bytes[8..16].copy_from_slice(&init.to_ne_bytes());
    let target = p.b.reg_with(&bytes, atomic_rights());
    (sink, target)
}

fn value(p: &Pair, mr: &MrInfo, end: End, off: usize) -> u64 {
    let s = match end {
        End::A => &p.a,
        End::B => &p.b,
    };
    u64::from_ne_bytes(s.bytes(mr)[off..off + 8].try_into().unwrap())
}

/// Post one atomic from A on B's word, drive, and return the original
/// value A received.
fn atomic(p: &mut Pair, sink: &MrInfo, op: SendOp, wr_id: u64) -> u64 {
    post_send(p.side(End::A), wr_id, op, &[sge(sink, 0, 8)], true);
    p.drive();
    let opcode = match op {
        SendOp::FetchAdd { .. } => WcOpcode::AtomicFetchAdd,
        _ => WcOpcode::AtomicCompareSwap,
    };
    one_wc(p.side(End::A), wr_id, opcode, Some(8));
    assert!(
        p.b.completions().is_empty(),
        "the responder's ULP sees nothing"
    );
    value(p, sink, End::A, 0)
}

fn fetch_add(target: &MrInfo, add: u64, add_mask: u64) -> SendOp {
    SendOp::FetchAdd {
        remote_addr: target.iova + 8,
        rkey: target.rkey,
        add,
        add_mask,
    }
}

fn compare_swap(target: &MrInfo, compare: u64, swap: u64) -> SendOp {
    SendOp::CompareSwap {
        remote_addr: target.iova + 8,
        rkey: target.rkey,
        compare,
        compare_mask: u64::MAX,
        swap,
        swap_mask: u64::MAX,
    }
}

fn pair(crc: bool, markers: bool, chunking: Chunking) -> Pair {
    Pair::connected(
        QpConfig::default(),
        chunking,
        mpa(2, crc, markers),
        mpa(2, crc, markers),
    )
}

#[test]
fn atomics_under_every_mpa_setting_and_cut_anywhere() {
    for (crc, markers) in [(false, false), (true, false), (false, true), (true, true)] {
        for chunking in [Chunking::whole(1 << 16), Chunking::random(7, 3)] {
            let mut p = pair(crc, markers, chunking);
            let (sink, target) = word(&mut p, 40);
            // FetchAdd returns the value before and adds.
            assert_eq!(atomic(&mut p, &sink, fetch_add(&target, 2, 0), 1), 40);
            assert_eq!(value(&p, &target, End::B, 8), 42);
            // A plain 64-bit add wraps.
            assert_eq!(
                atomic(&mut p, &sink, fetch_add(&target, u64::MAX, 0), 2),
                42
            );
            assert_eq!(value(&p, &target, End::B, 8), 41);
            // CompareSwap: a miss leaves the word, a hit swaps it; the
            // original comes back either way.
            assert_eq!(atomic(&mut p, &sink, compare_swap(&target, 7, 9), 3), 41);
            assert_eq!(value(&p, &target, End::B, 8), 41);
            assert_eq!(atomic(&mut p, &sink, compare_swap(&target, 41, 9), 4), 41);
            assert_eq!(value(&p, &target, End::B, 8), 9);
            // Nothing around the word moved.
            let b = p.b.bytes(&target);
            assert_eq!((&b[..8], &b[16..]), (&[0u8; 8][..], &[0u8; 8][..]));
            assert_eq!(p.a.state(), QpState::Rts);
            assert_eq!(p.b.state(), QpState::Rts);
        }
    }
}

#[test]
fn masked_fetch_add_keeps_fields_apart() {
    let mut p = pair(true, false, Chunking::whole(1 << 16));
    // Four 16-bit counters; the lowest is about to wrap.
    let (sink, target) = word(&mut p, 0x0004_0003_0002_ffff);
    let add = 0x0001_0001_0001_0001;
    let mask = 0x8000_8000_8000_8000;
    let orig = atomic(&mut p, &sink, fetch_add(&target, add, mask), 1);
    assert_eq!(orig, 0x0004_0003_0002_ffff);
    assert_eq!(value(&p, &target, End::B, 8), 0x0005_0004_0003_0000);
}

#[test]
fn masked_compare_swap_swaps_only_the_masked_bits() {
    let mut p = pair(false, false, Chunking::whole(1 << 16));
    // A lock word: low byte is the lock, the rest a version left alone.
    let (sink, target) = word(&mut p, 0x1234_5678_9abc_de00);
    let op = SendOp::CompareSwap {
        remote_addr: target.iova + 8,
        rkey: target.rkey,
        compare: 0,
        compare_mask: 0xff,
        swap: 0x01,
        swap_mask: 0xff,
    };
    assert_eq!(atomic(&mut p, &sink, op, 1), 0x1234_5678_9abc_de00);
    assert_eq!(value(&p, &target, End::B, 8), 0x1234_5678_9abc_de01);
    // Taken: the same request now fails and changes nothing.
    assert_eq!(atomic(&mut p, &sink, op, 2), 0x1234_5678_9abc_de01);
    assert_eq!(value(&p, &target, End::B, 8), 0x1234_5678_9abc_de01);
}

/// A pair whose IRD and ORD are `depth`.
fn ord_pair(depth: u16, crc: bool, chunking: Chunking) -> Pair {
    let cfg = Config {
        ird: depth,
        ord: depth,
        ..mpa(2, crc, false)
    };
    Pair::connected(QpConfig::default(), chunking, cfg.clone(), cfg)
}

/// Post `n` requests from A on the word at offset 8 of `target`: a Read
/// after every two FetchAdds of 1, each into a sink of its own, returned
/// in posting order.
fn post_atomics_and_reads(p: &mut Pair, target: &MrInfo, n: usize) -> Vec<MrInfo> {
    let sinks: Vec<MrInfo> = (0..n).map(|_| p.a.reg(8, Access::LOCAL_WRITE)).collect();
    for (i, s) in sinks.iter().enumerate() {
        let op = if i % 3 == 2 {
            SendOp::Read {
                remote_addr: target.iova + 8,
                rkey: target.rkey,
            }
        } else {
            fetch_add(target, 1, 0)
        };
        post_send(p.side(End::A), i as u64, op, &[sge(s, 0, 8)], true);
    }
    sinks
}

#[test]
fn a_failed_read_among_atomics_completes_in_order_and_flushes_the_rest() {
    // ORD/IRD 2: Reads and atomics share it. The region allows atomics
    // only, so the third request, a Read, makes B terminate: the two
    // atomics before it completed, it failed, the rest are flushed.
    let mut p = ord_pair(2, true, Chunking::whole(1 << 16));
    let (_, target) = word(&mut p, 100);
    let sinks = post_atomics_and_reads(&mut p, &target, 6);
    p.drive();
    let wcs = p.a.completions();
    let got: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        got,
        vec![
            (0, WcStatus::Success),
            (1, WcStatus::Success),
            (2, WcStatus::RemoteAccessError),
            (3, WcStatus::WrFlushError),
            (4, WcStatus::WrFlushError),
            (5, WcStatus::WrFlushError),
        ]
    );
    assert_eq!(value(&p, &sinks[0], End::A, 0), 100);
    assert_eq!(value(&p, &sinks[1], End::A, 0), 101);
    assert_eq!(value(&p, &target, End::B, 8), 102);
}

#[test]
fn reads_and_atomics_interleave_in_order() {
    let mut p = ord_pair(3, false, Chunking::random(64, 11));
    let mut init = [0u8; 24];
    init[8..16].copy_from_slice(&100u64.to_ne_bytes());
    let target = p.b.reg_with(&init, atomic_rights() | Access::REMOTE_READ);
    let sinks = post_atomics_and_reads(&mut p, &target, 9);
    p.drive();
    let wcs = p.a.completions();
    let got: Vec<(u64, WcStatus, WcOpcode)> =
        wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    let want: Vec<(u64, WcStatus, WcOpcode)> = (0..9)
        .map(|i| {
            let op = if i % 3 == 2 {
                WcOpcode::RdmaRead
            } else {
                WcOpcode::AtomicFetchAdd
            };
            (i, WcStatus::Success, op)
        })
        .collect();
    assert_eq!(got, want);
    // Each Read sees every atomic before it and none after (RFC 7306 §7).
    let seen: Vec<u64> = sinks.iter().map(|s| value(&p, s, End::A, 0)).collect();
    assert_eq!(seen, vec![100, 101, 102, 102, 103, 104, 104, 105, 106]);
    assert_eq!(value(&p, &target, End::B, 8), 106);
}

#[test]
fn atomic_on_a_region_without_the_right_fails_at_the_requester() {
    let mut p = pair(true, false, Chunking::whole(1 << 16));
    let sink = p.a.reg(8, Access::LOCAL_WRITE);
    let target =
        p.b.reg_with(&[5; 8], Access::REMOTE_WRITE | Access::REMOTE_READ);
    post_send(
        p.side(End::A),
        1,
        SendOp::FetchAdd {
            remote_addr: target.iova,
            rkey: target.rkey,
            add: 1,
            add_mask: 0,
        },
        &[sge(&sink, 0, 8)],
        true,
    );
    p.drive();
    let wcs = p.a.completions();
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status, wcs[0].opcode),
        (1, WcStatus::RemoteAccessError, WcOpcode::AtomicFetchAdd)
    );
    assert!(p
        .a
        .events
        .contains(&QpEvent::RemoteTerminate(codes::RDMAP_ACCESS_RIGHTS)));
    assert_eq!(p.b.bytes(&target), &[5; 8]);
    assert_eq!(p.a.bytes(&sink), &[0; 8]);
}

#[test]
fn immediate_data_after_a_write_completes_once_the_write_is_placed() {
    for (crc, markers) in [(false, false), (true, true)] {
        let mut p = pair(crc, markers, Chunking::random(5, 1));
        let data = pattern(3000, 7);
        let dst = p.b.reg(3000, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let src = p.a.reg_with(&data, Access::NONE);
        let rbuf = p.b.reg(16, Access::LOCAL_WRITE);
        post_recv(p.side(End::B), 50, &[sge(&rbuf, 0, 16)]);
        post_send(
            p.side(End::A),
            1,
            SendOp::Write {
                remote_addr: dst.iova,
                rkey: dst.rkey,
            },
            &[sge(&src, 0, 3000)],
            false,
        );
        post_send(
            p.side(End::A),
            2,
            SendOp::ImmediateData {
                data: 0x0102_0304_0506_0708,
                solicited: true,
            },
            &[],
            true,
        );
        // Step by step: whenever B's receive completes, the Write's bytes
        // are all in place.
        let mut recv = None;
        for _ in 0..10_000 {
            if p.drive_once() == 0 && recv.is_some() {
                break;
            }
            let wcs = p.b.completions();
            if let Some(wc) = wcs.first() {
                assert_eq!(p.b.bytes(&dst), &data[..]);
                recv = Some(*wc);
            }
        }
        let wc = recv.expect("a receive completion");
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
            (50, WcStatus::Success, WcOpcode::Recv, 0)
        );
        assert_eq!(wc.imm_data, Some(0x0102_0304_0506_0708));
        assert!(wc.solicited);
        assert_eq!(p.b.bytes(&rbuf), &[0; 16], "nothing placed in the buffer");
        one_wc(p.side(End::A), 2, WcOpcode::ImmediateData, Some(0));
    }
}

#[test]
fn immediate_data_and_sends_share_the_receive_queue_in_order() {
    let mut p = pair(false, false, Chunking::whole(1 << 16));
    let rbufs: Vec<MrInfo> = (0..3).map(|_| p.b.reg(8, Access::LOCAL_WRITE)).collect();
    for (i, r) in rbufs.iter().enumerate() {
        post_recv(p.side(End::B), 10 + i as u64, &[sge(r, 0, 8)]);
    }
    let src = p.a.reg_with(b"abcdefgh", Access::NONE);
    post_send(p.side(End::A), 1, SEND, &[sge(&src, 0, 8)], true);
    post_send(
        p.side(End::A),
        2,
        SendOp::ImmediateData {
            data: 77,
            solicited: false,
        },
        &[],
        true,
    );
    post_send(p.side(End::A), 3, SEND, &[sge(&src, 0, 4)], true);
    p.drive();
    let wcs = p.b.completions();
    let got: Vec<(u64, u32, Option<u64>)> = wcs
        .iter()
        .map(|w| (w.wr_id, w.byte_len, w.imm_data))
        .collect();
    assert_eq!(got, vec![(10, 8, None), (11, 0, Some(77)), (12, 4, None)]);
    assert_eq!(p.b.bytes(&rbufs[0]), b"abcdefgh");
    assert_eq!(p.b.bytes(&rbufs[1]), &[0; 8]);
    assert_eq!(p.a.completions().len(), 3);
}

#[test]
fn posting_checks_the_scatter_lists_of_the_new_operations() {
    let mut p = pair(false, false, Chunking::whole(1 << 16));
    let (sink, target) = word(&mut p, 0);
    let post = |p: &mut Pair, op: SendOp, sgl: &[Sge]| {
        p.a.ctx.post_send(
            p.a.qp,
            &SendWr {
                wr_id: 9,
                op,
                sgl,
                signaled: true,
            },
        )
    };
    let bad = Err(VerbsError::Post(PostError::InvalidSgl));
    // An atomic's sink is one SGE of exactly 8 bytes.
    assert_eq!(
        post(&mut p, fetch_add(&target, 1, 0), &[sge(&sink, 0, 4)]),
        bad
    );
    assert_eq!(post(&mut p, fetch_add(&target, 1, 0), &[]), bad);
    assert_eq!(
        post(
            &mut p,
            compare_swap(&target, 0, 1),
            &[sge(&sink, 0, 4), sge(&sink, 4, 4)]
        ),
        bad
    );
    // Immediate Data carries no SGEs.
    let imm = SendOp::ImmediateData {
        data: 1,
        solicited: false,
    };
    assert_eq!(post(&mut p, imm, &[sge(&sink, 0, 8)]), bad);
    assert_eq!(post(&mut p, imm, &[]), Ok(()));
}
