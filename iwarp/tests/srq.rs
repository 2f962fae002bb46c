//! Shared receive queues: many QPs of one context receiving from one SRQ.
//!
//! A star of in-memory connections: one server context whose QPs are all
//! attached to one SRQ (each with its own receive CQ), and one client
//! context per QP. Bytes move in small pieces, link after link, so the
//! segments of the clients' messages interleave at the server.

use iwarp::cq::{CqId, QpId, WcOpcode, WcStatus, WorkCompletion};
use iwarp::error::{codes, etype, Layer};
use iwarp::mem::{Access, MrInfo, PdId};
use iwarp::mpa::handshake::Config;
use iwarp::qp::{PostError, QpConfig, QpEvent, QpState, RecvWr, SendOp, SendWr, Sge};
use iwarp::srq::{SrqEvent, SrqId};
use iwarp::testing::{Chunking, Pair};
use iwarp::time::Instant;
use iwarp::verbs::{Context, VerbsError};

/// Size of each receive buffer the server posts.
const RBUF: usize = 512;

struct Client {
    ctx: Context,
    pd: PdId,
    cq: CqId,
    qp: QpId,
    events: Vec<QpEvent>,
}

struct Star {
    ctx: Context,
    pd: PdId,
    srq: SrqId,
    /// The server's QPs, one per client.
    qps: Vec<QpId>,
    /// Each server QP's receive CQ.
    rcqs: Vec<CqId>,
    events: Vec<Vec<QpEvent>>,
    clients: Vec<Client>,
    /// One region holding every receive buffer, `RBUF` bytes apart.
    rbufs: MrInfo,
    /// Largest piece moved per link per step.
    piece: usize,
}

fn qp_config() -> QpConfig {
    // Small FPDUs: a 300-byte Send takes three segments.
    QpConfig {
        emss: 128,
        ..QpConfig::default()
    }
}

impl Star {
    /// `n` connected clients; the SRQ holds `capacity` receives, limit
    /// armed at `limit`.
    fn new(n: usize, capacity: usize, limit: u32) -> Self {
        let mut ctx = Context::new(7);
        let pd = ctx.alloc_pd();
        let srq = ctx.create_srq(pd, capacity, limit).unwrap();
        let scq = ctx.create_cq(1024);
        let rbufs = ctx
            .reg_mr_owned(
                pd,
                vec![0; 64 * RBUF].into_boxed_slice(),
                Access::LOCAL_WRITE,
            )
            .unwrap();
        let mut star = Self {
            pd,
            srq,
            qps: Vec::new(),
            rcqs: Vec::new(),
            events: Vec::new(),
            clients: Vec::new(),
            rbufs,
            piece: 100,
            ctx,
        };
        for i in 0..n {
            let rcq = star.ctx.create_cq(1024);
            let qp = star
                .ctx
                .create_qp_with_srq(pd, scq, rcq, srq, qp_config())
                .unwrap();
            star.ctx
                .listen(qp, Config::default(), Instant::ZERO)
                .unwrap();
            let mut c = Context::new(100 + i as u64);
            let cpd = c.alloc_pd();
            let ccq = c.create_cq(1024);
            let cqp = c.create_qp(cpd, ccq, ccq, qp_config()).unwrap();
            c.connect(cqp, Config::default(), &[], Instant::ZERO)
                .unwrap();
            star.qps.push(qp);
            star.rcqs.push(rcq);
            star.events.push(Vec::new());
            star.clients.push(Client {
                ctx: c,
                pd: cpd,
                cq: ccq,
                qp: cqp,
                events: Vec::new(),
            });
        }
        star.drive();
        for (i, &qp) in star.qps.iter().enumerate() {
            assert_eq!(star.ctx.qp_state(qp), Some(QpState::Rts), "server QP {i}");
        }
        star
    }

    /// One step on link `i`: a piece each way, then events.
    fn step(&mut self, i: usize) -> usize {
        let mut buf = vec![0u8; self.piece];
        let c = &mut self.clients[i];
        let qp = self.qps[i];
        let mut moved = 0;
        let n = c.ctx.poll_transmit(c.qp, &mut buf);
        if n > 0 {
            assert_eq!(self.ctx.handle_input(qp, &buf[..n], Instant::ZERO), n);
        }
        moved += n;
        let n = self.ctx.poll_transmit(qp, &mut buf);
        if n > 0 {
            assert_eq!(c.ctx.handle_input(c.qp, &buf[..n], Instant::ZERO), n);
        }
        moved += n;
        while let Some(ev) = self.ctx.poll_event(qp) {
            if let QpEvent::ConnectRequest(_) = ev {
                self.ctx.accept(qp, &[]).unwrap();
                moved += 1;
            }
            self.events[i].push(ev);
        }
        while let Some(ev) = c.ctx.poll_event(c.qp) {
            c.events.push(ev);
        }
        moved
    }

    /// Step every link in turn until nothing moves.
    fn drive(&mut self) {
        for _ in 0..100_000 {
            let mut moved = 0;
            for i in 0..self.clients.len() {
                moved += self.step(i);
            }
            if moved == 0 {
                return;
            }
        }
        panic!("the star did not quiesce");
    }

    /// Post receive `k` (buffer `k`, `wr_id` 1000 + k) to the SRQ.
    fn post(&mut self, k: usize) {
        let wr = RecvWr {
            wr_id: 1000 + k as u64,
            sgl: &[Sge {
                addr: self.rbufs.iova + (k * RBUF) as u64,
                len: RBUF as u32,
                lkey: self.rbufs.lkey,
            }],
        };
        self.ctx.post_srq_recv(self.srq, &wr).unwrap();
    }

    /// Client `i` sends `op` with `payload` (registered on the fly).
    fn send(&mut self, i: usize, wr_id: u64, op: SendOp, payload: &[u8]) {
        let c = &mut self.clients[i];
        let sgl = if payload.is_empty() {
            vec![]
        } else {
            let mr = c
                .ctx
                .reg_mr_owned(c.pd, payload.to_vec().into_boxed_slice(), Access::NONE)
                .unwrap();
            vec![Sge {
                addr: mr.iova,
                len: payload.len() as u32,
                lkey: mr.lkey,
            }]
        };
        c.ctx
            .post_send(
                c.qp,
                &SendWr {
                    wr_id,
                    op,
                    sgl: &sgl,
                    signaled: true,
                },
            )
            .unwrap();
    }

    fn recv_completions(&mut self, i: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        while let Some(wc) = self.ctx.cq(self.rcqs[i]).and_then(|cq| cq.poll_one()) {
            out.push(wc);
        }
        out
    }

    fn client_completions(&mut self, i: usize) -> Vec<WorkCompletion> {
        let c = &mut self.clients[i];
        let mut out = Vec::new();
        while let Some(wc) = c.ctx.cq(c.cq).and_then(|cq| cq.poll_one()) {
            out.push(wc);
        }
        out
    }

    /// The bytes of receive buffer `k`.
    fn rbuf(&self, k: usize) -> &[u8] {
        &self.ctx.mem().owned_bytes(self.rbufs.lkey).unwrap()[k * RBUF..(k + 1) * RBUF]
    }
}

fn send() -> SendOp {
    SendOp::Send {
        solicited: false,
        invalidate: None,
    }
}

/// Message `m` of client `i`: 300 bytes (three segments) of one value.
fn message(i: usize, m: usize) -> Vec<u8> {
    vec![(16 * i + m + 1) as u8; 300]
}

#[test]
fn many_qps_receive_sends_from_one_srq() {
    let mut s = Star::new(4, 32, 0);
    for k in 0..12 {
        s.post(k);
    }
    // Three multi-segment Sends from each client, all in flight at once:
    // their segments interleave at the server.
    for m in 0..3 {
        for i in 0..4 {
            s.send(i, m as u64, send(), &message(i, m));
        }
    }
    s.drive();
    assert_eq!(s.ctx.srq_occupancy(s.srq), Some(0));
    let mut taken = Vec::new();
    for i in 0..4 {
        let wcs = s.recv_completions(i);
        assert_eq!(wcs.len(), 3, "client {i}'s Sends complete on QP {i}'s CQ");
        for (m, wc) in wcs.iter().enumerate() {
            assert_eq!(wc.status, WcStatus::Success);
            assert_eq!(wc.opcode, WcOpcode::Recv);
            assert_eq!(wc.qp, s.qps[i], "the consuming QP's id");
            assert_eq!(wc.byte_len, 300);
            let k = (wc.wr_id - 1000) as usize;
            assert_eq!(&s.rbuf(k)[..300], &message(i, m)[..], "buffer {k}");
            assert!(s.rbuf(k)[300..].iter().all(|&b| b == 0));
            taken.push(k);
        }
        let sent = s.client_completions(i);
        assert_eq!(sent.len(), 3);
        assert!(sent.iter().all(|wc| wc.status == WcStatus::Success));
    }
    taken.sort_unstable();
    assert_eq!(taken, (0..12).collect::<Vec<_>>(), "each receive used once");
}

#[test]
fn every_receive_consuming_message_takes_from_the_srq() {
    let mut s = Star::new(3, 8, 0);
    for k in 0..4 {
        s.post(k);
    }
    let inv = s
        .ctx
        .reg_mr_owned(s.pd, vec![0; 64].into_boxed_slice(), Access::REMOTE_WRITE)
        .unwrap();
    s.send(
        0,
        1,
        SendOp::Send {
            solicited: true,
            invalidate: None,
        },
        b"solicited",
    );
    s.drive();
    s.send(
        1,
        2,
        SendOp::ImmediateData {
            data: 0x0102_0304_0506_0708,
            solicited: false,
        },
        &[],
    );
    s.drive();
    s.send(
        2,
        3,
        SendOp::Send {
            solicited: false,
            invalidate: Some(inv.rkey),
        },
        b"invalidate",
    );
    s.drive();
    let wc0 = s.recv_completions(0);
    let wc1 = s.recv_completions(1);
    let wc2 = s.recv_completions(2);
    assert_eq!(wc0.len(), 1);
    assert_eq!((wc0[0].wr_id, wc0[0].qp), (1000, s.qps[0]));
    assert!(wc0[0].solicited);
    assert_eq!(&s.rbuf(0)[..9], b"solicited");
    assert_eq!(wc1.len(), 1);
    assert_eq!((wc1[0].wr_id, wc1[0].qp), (1001, s.qps[1]));
    assert_eq!(wc1[0].imm_data, Some(0x0102_0304_0506_0708));
    assert_eq!(wc2.len(), 1);
    assert_eq!((wc2[0].wr_id, wc2[0].qp), (1002, s.qps[2]));
    assert_eq!(wc2[0].invalidated_stag, Some(inv.rkey));
    assert!(!s.ctx.mem().is_valid(inv.rkey));
    assert_eq!(s.ctx.srq_occupancy(s.srq), Some(1));
}

#[test]
fn limit_event_fires_once_and_again_only_after_rearming() {
    let mut s = Star::new(2, 16, 3);
    for k in 0..6 {
        s.post(k);
    }
    let mut next = 0;
    let mut take = |s: &mut Star, n: usize| {
        for _ in 0..n {
            let i = next % 2;
            s.send(i, next as u64, send(), &[next as u8; 40]);
            s.drive();
            next += 1;
        }
    };
    // 6 -> 3 posted: not below the limit.
    take(&mut s, 3);
    assert_eq!(s.ctx.srq_occupancy(s.srq), Some(3));
    assert_eq!(s.ctx.poll_srq_event(s.srq), None);
    // 3 -> 2: below; one event, and the limit disarms.
    take(&mut s, 1);
    assert_eq!(s.ctx.poll_srq_event(s.srq), Some(SrqEvent::LimitReached));
    assert_eq!(s.ctx.poll_srq_event(s.srq), None);
    assert_eq!(s.ctx.srq(s.srq).map(|q| q.limit()), Some(0));
    // 2 -> 1: disarmed, nothing.
    take(&mut s, 1);
    assert_eq!(s.ctx.poll_srq_event(s.srq), None);
    // Refill to 5, re-arm at 2.
    for k in 6..10 {
        s.post(k);
    }
    assert_eq!(
        s.ctx.modify_srq(s.srq, 17),
        Err(VerbsError::InvalidArgument),
        "a limit above the capacity"
    );
    s.ctx.modify_srq(s.srq, 2).unwrap();
    take(&mut s, 3);
    assert_eq!(s.ctx.srq_occupancy(s.srq), Some(2));
    assert_eq!(s.ctx.poll_srq_event(s.srq), None);
    take(&mut s, 1);
    assert_eq!(s.ctx.poll_srq_event(s.srq), Some(SrqEvent::LimitReached));
    assert_eq!(s.ctx.poll_srq_event(s.srq), None);
    // Disarmed by 0: the last receive goes without an event.
    s.ctx.modify_srq(s.srq, 0).unwrap();
    take(&mut s, 1);
    assert_eq!(s.ctx.srq_occupancy(s.srq), Some(0));
    assert_eq!(s.ctx.poll_srq_event(s.srq), None);
    let total: usize = (0..2).map(|i| s.recv_completions(i).len()).sum();
    assert_eq!(total, 10);
}

/// The Terminate an empty (own) receive queue gets, from a plain pair.
fn empty_rq_terminate() -> iwarp::error::TermCode {
    let mut p = Pair::connected(
        QpConfig::default(),
        Chunking::whole(1 << 16),
        Config::default(),
        Config::default(),
    );
    let src = p.a.reg_with(&[1; 40], Access::NONE);
    p.a.ctx
        .post_send(
            p.a.qp,
            &SendWr {
                wr_id: 1,
                op: send(),
                sgl: &[Sge {
                    addr: src.iova,
                    len: 40,
                    lkey: src.lkey,
                }],
                signaled: true,
            },
        )
        .unwrap();
    p.drive();
    let code = p.b.events.iter().find_map(|e| match e {
        QpEvent::LocalTerminate(c) => Some(*c),
        _ => None,
    });
    code.expect("an empty receive queue terminates")
}

#[test]
fn an_empty_srq_terminates_as_an_empty_receive_queue() {
    let mut s = Star::new(3, 8, 0);
    s.post(0);
    s.send(0, 1, send(), &[1; 40]);
    s.drive();
    assert_eq!(s.recv_completions(0).len(), 1);
    // Client 1 finds the SRQ empty.
    s.send(1, 2, send(), &[2; 40]);
    s.drive();
    let local = s.events[1].iter().find_map(|e| match e {
        QpEvent::LocalTerminate(c) => Some(*c),
        _ => None,
    });
    let remote = s.clients[1].events.iter().find_map(|e| match e {
        QpEvent::RemoteTerminate(c) => Some(*c),
        _ => None,
    });
    assert_eq!(local, Some(codes::DDP_U_INVALID_MSN_NO_BUFFER));
    assert_eq!(remote, local, "the Terminate on the wire");
    let code = local.unwrap();
    assert_eq!(
        (code.layer, code.etype, code.code),
        (Layer::Ddp, etype::DDP_UNTAGGED, 0x02)
    );
    assert_eq!(local, Some(empty_rq_terminate()));
    assert_eq!(s.ctx.qp_state(s.qps[1]), Some(QpState::Error));
    assert!(s.recv_completions(1).is_empty(), "it held no receive");
    // The Send completed as it left; the Terminate moves the client to
    // Error.
    assert_eq!(
        s.clients[1].ctx.qp_state(s.clients[1].qp),
        Some(QpState::Error)
    );
    // The other QPs go on: receives posted later serve them, not the
    // failed QP.
    s.post(1);
    s.send(2, 3, send(), &[3; 40]);
    s.drive();
    let wcs = s.recv_completions(2);
    assert_eq!(wcs.len(), 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].qp, wcs[0].status),
        (1001, s.qps[2], WcStatus::Success)
    );
    assert_eq!(s.ctx.qp_state(s.qps[0]), Some(QpState::Rts));
}

#[test]
fn error_flushes_only_the_receive_the_qp_holds() {
    let mut s = Star::new(2, 8, 0);
    for k in 0..3 {
        s.post(k);
    }
    // The first segments of client 0's message reach the server, not the
    // last: QP 0 holds receive 0.
    s.send(0, 1, send(), &message(0, 0));
    s.piece = 150;
    for _ in 0..2 {
        s.step(0);
    }
    assert_eq!(s.ctx.srq_occupancy(s.srq), Some(2));
    assert_eq!(s.ctx.qp_occupancy(s.qps[0]), Some((0, 1)));
    s.ctx.disconnect(s.qps[0]);
    let wcs = s.recv_completions(0);
    assert_eq!(wcs.len(), 1);
    assert_eq!(
        (wcs[0].wr_id, wcs[0].qp, wcs[0].status),
        (1000, s.qps[0], WcStatus::WrFlushError)
    );
    assert_eq!(s.ctx.srq_occupancy(s.srq), Some(2), "the rest stay");
    assert!(s.recv_completions(1).is_empty());
    s.send(1, 2, send(), &[9; 40]);
    s.drive();
    let wcs = s.recv_completions(1);
    assert_eq!((wcs[0].wr_id, wcs[0].qp), (1001, s.qps[1]));
}

#[test]
fn posting_to_a_qp_on_an_srq_is_refused() {
    let mut s = Star::new(1, 4, 0);
    let wr = RecvWr {
        wr_id: 1,
        sgl: &[Sge {
            addr: s.rbufs.iova,
            len: 16,
            lkey: s.rbufs.lkey,
        }],
    };
    assert_eq!(
        s.ctx.post_recv(s.qps[0], &wr),
        Err(VerbsError::Post(PostError::SrqAttached))
    );
    assert_eq!(s.ctx.qp_occupancy(s.qps[0]), Some((0, 0)));
    // The SRQ's own checks: its capacity.
    for k in 0..4 {
        s.post(k);
    }
    assert_eq!(
        s.ctx.post_srq_recv(s.srq, &wr),
        Err(VerbsError::Post(PostError::QueueFull))
    );
}

#[test]
fn destroy_is_refused_while_qps_are_attached() {
    let mut s = Star::new(2, 4, 0);
    s.post(0);
    s.post(1);
    assert_eq!(s.ctx.destroy_srq(s.srq), Err(VerbsError::Busy));
    assert_eq!(s.ctx.srq(s.srq).map(|q| q.attached()), Some(2));
    s.ctx.destroy_qp(s.qps[0]).unwrap();
    assert_eq!(s.ctx.destroy_srq(s.srq), Err(VerbsError::Busy));
    s.ctx.destroy_qp(s.qps[1]).unwrap();
    // The two receives no QP took are discarded.
    assert_eq!(s.ctx.destroy_srq(s.srq), Ok(2));
    assert_eq!(s.ctx.destroy_srq(s.srq), Err(VerbsError::InvalidHandle));
    // A new SRQ may reuse the slot; the old handle stays dead.
    let again = s.ctx.create_srq(s.pd, 4, 0).unwrap();
    assert_ne!(again, s.srq);
    assert_eq!(s.ctx.srq_occupancy(s.srq), None);
    assert_eq!(s.ctx.srq_occupancy(again), Some(0));
}

#[test]
fn srq_arguments_are_checked() {
    let mut ctx = Context::new(1);
    let pd = ctx.alloc_pd();
    let other = ctx.alloc_pd();
    let cq = ctx.create_cq(4);
    assert_eq!(ctx.create_srq(pd, 0, 0), Err(VerbsError::InvalidArgument));
    assert_eq!(ctx.create_srq(pd, 4, 5), Err(VerbsError::InvalidArgument));
    let srq = ctx.create_srq(pd, 4, 4).unwrap();
    assert_eq!(
        ctx.create_qp_with_srq(other, cq, cq, srq, QpConfig::default()),
        Err(VerbsError::InvalidArgument),
        "a QP in another PD"
    );
    assert_eq!(ctx.srq(srq).map(|q| q.attached()), Some(0));
    assert_eq!(ctx.destroy_srq(srq), Ok(0));
}
