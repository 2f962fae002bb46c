//! Handles of the verbs context: slots are reused, and a stale handle of
//! each kind (QP, CQ, PD, STag) is rejected once another object took its
//! slot; the tables stay bounded over many create/destroy cycles.

use iwarp::cq::QpId;
use iwarp::error::codes;
use iwarp::mem::Access;
use iwarp::mpa::handshake::Config;
use iwarp::qp::{QpConfig, QpEvent, QpState, RecvWr, SendOp, SendWr, Sge};
use iwarp::slab::MAX_GENERATION;
use iwarp::testing::{Chunking, Pair};
use iwarp::verbs::{Context, HandleCounts, VerbsError};

fn recv<'a>(wr_id: u64, sgl: &'a [Sge]) -> RecvWr<'a> {
    RecvWr { wr_id, sgl }
}

#[test]
fn stale_qp_is_rejected_after_its_slot_is_reused() {
    let mut ctx = Context::new(1);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16);
    let old = ctx.create_qp(pd, cq, cq, QpConfig::default()).unwrap();
    ctx.destroy_qp(old).unwrap();
    let new = ctx.create_qp(pd, cq, cq, QpConfig::default()).unwrap();
    assert_eq!(new.index(), old.index(), "the slot is reused");
    assert_ne!(new, old);
    assert_ne!(new.raw(), old.raw());

    let mr = ctx
        .reg_mr_owned(pd, vec![0; 64].into_boxed_slice(), Access::LOCAL_WRITE)
        .unwrap();
    let sgl = [Sge {
        addr: mr.iova,
        len: 64,
        lkey: mr.lkey,
    }];
    let bad = Err(VerbsError::InvalidHandle);
    assert_eq!(ctx.post_recv(old, &recv(1, &sgl)), bad);
    let send = SendWr {
        wr_id: 2,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl: &sgl,
        signaled: true,
    };
    assert_eq!(ctx.post_send(old, &send), bad);
    assert_eq!(
        ctx.connect(old, Config::default(), &[], Default::default()),
        bad
    );
    assert!(ctx.qp(old).is_none());
    assert_eq!(ctx.qp_state(old), None);
    assert_eq!(ctx.qp_occupancy(old), None);
    assert_eq!(ctx.poll_transmit(old, &mut [0; 64]), 0);
    assert_eq!(ctx.handle_input(old, b"garbage", Default::default()), 7);
    ctx.disconnect(old);
    ctx.handle_eof(old);
    assert_eq!(ctx.destroy_qp(old), bad);

    // None of it reached the QP in the slot.
    assert_eq!(ctx.qp_state(new), Some(QpState::Idle));
    assert_eq!(ctx.qp_occupancy(new), Some((0, 0)));
    ctx.post_recv(new, &recv(3, &sgl)).unwrap();
    assert_eq!(ctx.qp_occupancy(new), Some((0, 1)));
    assert_eq!(ctx.qp(new).map(|q| q.id()), Some(new));
}

#[test]
fn stale_cq_is_rejected_after_its_slot_is_reused() {
    let mut ctx = Context::new(2);
    let pd = ctx.alloc_pd();
    let old = ctx.create_cq(4);
    ctx.destroy_cq(old).unwrap();
    let new = ctx.create_cq(8);
    assert_eq!(new.index(), old.index());
    assert_ne!(new, old);
    assert!(ctx.cq(old).is_none());
    assert_eq!(ctx.poll_cq(old, &mut []), 0);
    assert_eq!(ctx.destroy_cq(old), Err(VerbsError::InvalidHandle));
    assert_eq!(
        ctx.create_qp(pd, old, new, QpConfig::default()),
        Err(VerbsError::InvalidHandle)
    );
    assert_eq!(
        ctx.create_qp(pd, new, old, QpConfig::default()),
        Err(VerbsError::InvalidHandle)
    );
    assert_eq!(ctx.cq(new).map(|c| c.capacity()), Some(8));
    assert_eq!(ctx.live().cqs, 1);
}

#[test]
fn stale_pd_is_rejected_after_its_slot_is_reused() {
    let mut ctx = Context::new(3);
    let cq = ctx.create_cq(4);
    let old = ctx.alloc_pd();
    ctx.dealloc_pd(old).unwrap();
    let new = ctx.alloc_pd();
    assert_eq!(new.index(), old.index());
    assert_ne!(new, old);
    let bad = Err(VerbsError::InvalidHandle);
    assert_eq!(
        ctx.reg_mr_owned(old, vec![0; 8].into_boxed_slice(), Access::NONE)
            .map(|_| ()),
        bad
    );
    let mut backing = [0u8; 8];
    // SAFETY: not registered (the PD is stale); nothing keeps the pointer.
    let r = unsafe { ctx.reg_mr(old, backing.as_mut_ptr(), 8, Access::NONE) };
    assert_eq!(r.map(|_| ()), bad);
    assert_eq!(
        ctx.create_qp(old, cq, cq, QpConfig::default()).map(|_| ()),
        bad
    );
    assert_eq!(ctx.dealloc_pd(old), bad);
    assert_eq!(ctx.live().mrs, 0);
    // The PD in the slot works.
    let mr = ctx
        .reg_mr_owned(new, vec![0; 8].into_boxed_slice(), Access::NONE)
        .unwrap();
    let qp = ctx.create_qp(new, cq, cq, QpConfig::default()).unwrap();
    assert_eq!(ctx.dealloc_pd(new), Err(VerbsError::Busy));
    ctx.destroy_qp(qp).unwrap();
    assert_eq!(ctx.dealloc_pd(new), Err(VerbsError::Busy), "the region");
    ctx.dereg_mr(mr.lkey).unwrap();
    ctx.dealloc_pd(new).unwrap();
}

#[test]
fn cq_in_use_cannot_be_destroyed() {
    let mut ctx = Context::new(4);
    let pd = ctx.alloc_pd();
    let (scq, rcq) = (ctx.create_cq(4), ctx.create_cq(4));
    let a = ctx.create_qp(pd, scq, rcq, QpConfig::default()).unwrap();
    let b = ctx.create_qp(pd, rcq, rcq, QpConfig::default()).unwrap();
    assert_eq!(ctx.destroy_cq(scq), Err(VerbsError::Busy));
    assert_eq!(ctx.destroy_cq(rcq), Err(VerbsError::Busy));
    ctx.destroy_qp(a).unwrap();
    ctx.destroy_cq(scq).unwrap();
    assert_eq!(ctx.destroy_cq(rcq), Err(VerbsError::Busy));
    ctx.destroy_qp(b).unwrap();
    ctx.destroy_cq(rcq).unwrap();
    ctx.dealloc_pd(pd).unwrap();
    assert_eq!(ctx.live(), HandleCounts::default());
}

/// A Send and an RDMA Write to an STag whose region was deregistered and
/// whose slot a new registration took: the peer rejects the Write and the
/// new region keeps its bytes.
#[test]
fn stale_stag_is_rejected_after_its_slot_is_reused() {
    let mut p = Pair::connected(
        QpConfig::default(),
        Chunking::whole(1 << 16),
        Config::default(),
        Config::default(),
    );
    let old = p.b.reg(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    p.b.ctx.dereg_mr(old.lkey).unwrap();
    let new = p.b.reg(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    assert_eq!(new.rkey >> 8, old.rkey >> 8, "the slot is reused");
    assert_ne!(new.rkey, old.rkey);
    assert_eq!(
        p.b.ctx.dereg_mr(old.lkey).map(|_| ()),
        Err(VerbsError::InvalidHandle)
    );
    assert!(!p.b.ctx.mem().is_valid(old.rkey));

    let src = p.a.reg_with(&[0xab; 64], Access::NONE);
    p.a.ctx
        .post_send(
            p.a.qp,
            &SendWr {
                wr_id: 1,
                op: SendOp::Write {
                    remote_addr: old.iova,
                    rkey: old.rkey,
                },
                sgl: &[Sge {
                    addr: src.iova,
                    len: 64,
                    lkey: src.lkey,
                }],
                signaled: true,
            },
        )
        .unwrap();
    p.drive();
    assert_eq!(p.b.bytes(&new), &[0; 64]);
    assert!(
        p.a.events
            .contains(&QpEvent::RemoteTerminate(codes::DDP_T_INVALID_STAG)),
        "{:?}",
        p.a.events
    );
    assert_eq!(p.b.state(), QpState::Error);
}

/// 100,000 cycles of a connection's objects (PD, CQ, region, QP): the
/// tables keep one slot each, and the first QP's handle stays stale for
/// the whole window of the generation counter.
#[test]
fn tables_stay_bounded_over_create_destroy_cycles() {
    let mut ctx = Context::new(5);
    let mut first: Option<QpId> = None;
    for i in 0..100_000u32 {
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(4);
        let mr = ctx
            .reg_mr_owned(pd, vec![0; 16].into_boxed_slice(), Access::LOCAL_WRITE)
            .unwrap();
        let config = QpConfig {
            sq_depth: 2,
            rq_depth: 2,
            ..QpConfig::default()
        };
        let qp = ctx.create_qp(pd, cq, cq, config).unwrap();
        if let Some(f) = first {
            if i < u32::from(MAX_GENERATION) {
                assert_ne!(qp, f);
                assert!(ctx.qp(f).is_none(), "cycle {i}");
            }
        } else {
            first = Some(qp);
        }
        ctx.destroy_qp(qp).unwrap();
        ctx.dereg_mr(mr.lkey).unwrap();
        ctx.destroy_cq(cq).unwrap();
        ctx.dealloc_pd(pd).unwrap();
    }
    assert_eq!(ctx.live(), HandleCounts::default());
    let one = HandleCounts {
        pds: 1,
        cqs: 1,
        qps: 1,
        mrs: 1,
    };
    assert_eq!(ctx.slots(), one);
}

/// Many objects alive at once, then all destroyed, twice: the second
/// round reuses the first round's slots.
#[test]
fn slots_follow_the_peak_not_the_total() {
    let mut ctx = Context::new(6);
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4);
    for _ in 0..2 {
        let qps: Vec<_> = (0..500)
            .map(|_| ctx.create_qp(pd, cq, cq, QpConfig::default()).unwrap())
            .collect();
        for qp in qps {
            ctx.destroy_qp(qp).unwrap();
        }
    }
    assert_eq!((ctx.live().qps, ctx.slots().qps), (0, 500));
    ctx.destroy_cq(cq).unwrap();
    ctx.dealloc_pd(pd).unwrap();
}

#[test]
fn only_queues_given_completions_are_listed_ready_each_once() {
    let mut p = Pair::connected(
        QpConfig::default(),
        Chunking::whole(65536),
        Config::default(),
        Config::default(),
    );
    let idle_cq = p.a.ctx.create_cq(8);
    let mut ready = Vec::new();
    p.a.ctx.take_ready_cqs(&mut ready);
    p.b.ctx.take_ready_cqs(&mut ready);
    ready.clear();

    let src = p.a.reg_with(&[7; 32], Access::LOCAL_WRITE);
    let dst = p.b.reg(64, Access::LOCAL_WRITE);
    let (a_sgl, b_sgl) = (
        [Sge {
            addr: src.iova,
            len: 32,
            lkey: src.lkey,
        }],
        [Sge {
            addr: dst.iova,
            len: 64,
            lkey: dst.lkey,
        }],
    );
    for i in 0..3 {
        p.b.ctx.post_recv(p.b.qp, &recv(i, &b_sgl)).unwrap();
        let send = SendWr {
            wr_id: 10 + i,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: &a_sgl,
            signaled: true,
        };
        p.a.ctx.post_send(p.a.qp, &send).unwrap();
    }
    p.drive();

    // Three completions on each side: each side's one queue, listed once.
    p.a.ctx.take_ready_cqs(&mut ready);
    assert_eq!(ready, [p.a.cq], "the idle queue {idle_cq:?} is not listed");
    ready.clear();
    p.b.ctx.take_ready_cqs(&mut ready);
    assert_eq!(ready, [p.b.cq]);
    assert_eq!(p.b.completions().len(), 3);

    // Taken: nothing is listed until the next completion.
    ready.clear();
    p.a.ctx.take_ready_cqs(&mut ready);
    p.b.ctx.take_ready_cqs(&mut ready);
    assert!(ready.is_empty());
}
