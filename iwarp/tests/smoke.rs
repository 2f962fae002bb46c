use iwarp::cq::{WcOpcode, WcStatus};
use iwarp::mem::Access;
use iwarp::mpa::handshake::Config;
use iwarp::qp::{QpConfig, RecvWr, SendOp, SendWr, Sge};
use iwarp::testing::{Chunking, Pair};

#[test]
fn send_write_read() {
    let mut p = Pair::connected(
        QpConfig::default(),
        Chunking::whole(1 << 16),
        Config::default(),
        Config::default(),
    );
    let msg: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    let src = p.a.reg_with(&msg, Access::NONE);
    let dst = p.b.reg(
        8192,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    );
    p.b.ctx
        .post_recv(
            p.b.qp,
            &RecvWr {
                wr_id: 7,
                sgl: &[Sge {
                    addr: dst.iova,
                    len: 8192,
                    lkey: dst.lkey,
                }],
            },
        )
        .unwrap();
    p.a.ctx
        .post_send(
            p.a.qp,
            &SendWr {
                wr_id: 1,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sgl: &[Sge {
                    addr: src.iova,
                    len: 5000,
                    lkey: src.lkey,
                }],
                signaled: true,
            },
        )
        .unwrap();
    p.drive();
    let wa = p.a.completions();
    let wb = p.b.completions();
    assert_eq!(wa.len(), 1, "{wa:?} {:?}", p.a.events);
    assert_eq!(wa[0].status, WcStatus::Success);
    assert_eq!(wb.len(), 1, "{wb:?} {:?}", p.b.events);
    assert_eq!(wb[0].byte_len, 5000);
    assert_eq!(&p.b.bytes(&dst)[..5000], &msg[..]);
    // Write then read back.
    p.a.ctx
        .post_send(
            p.a.qp,
            &SendWr {
                wr_id: 2,
                op: SendOp::Write {
                    remote_addr: dst.iova + 100,
                    rkey: dst.rkey,
                },
                sgl: &[Sge {
                    addr: src.iova,
                    len: 3000,
                    lkey: src.lkey,
                }],
                signaled: true,
            },
        )
        .unwrap();
    let sink = p.a.reg(3000, Access::LOCAL_WRITE);
    p.a.ctx
        .post_send(
            p.a.qp,
            &SendWr {
                wr_id: 3,
                op: SendOp::Read {
                    remote_addr: dst.iova + 100,
                    rkey: dst.rkey,
                },
                sgl: &[Sge {
                    addr: sink.iova,
                    len: 3000,
                    lkey: sink.lkey,
                }],
                signaled: true,
            },
        )
        .unwrap();
    p.drive();
    let wa = p.a.completions();
    assert_eq!(
        wa.iter()
            .map(|w| (w.wr_id, w.opcode, w.status))
            .collect::<Vec<_>>(),
        vec![
            (2, WcOpcode::RdmaWrite, WcStatus::Success),
            (3, WcOpcode::RdmaRead, WcStatus::Success)
        ]
    );
    assert_eq!(p.a.bytes(&sink), &msg[..3000]);
}

/// Found by the rx_path fuzzer: when the initiator's very first bytes
/// after the MPA exchange break the framing (here a bad first marker), the
/// responder must still send its Terminate and reach Error.
#[test]
fn responder_terminates_on_broken_first_fpdu() {
    use iwarp::error::codes;
    use iwarp::qp::{QpEvent, QpState};
    use iwarp::testing::End;
    let b = Config {
        markers: true,
        ..Config::default()
    };
    let mut p = Pair::connected(
        QpConfig::default(),
        Chunking::whole(1 << 16),
        Config::default(),
        b,
    );
    // A marker must open the stream with FPDUPTR 0; this one points elsewhere.
    p.inject(
        End::B,
        &[0, 0, 0x41, 0x43, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    );
    p.drive();
    assert!(
        p.b.events
            .contains(&QpEvent::LocalTerminate(codes::MPA_MARKER)),
        "{:?}",
        p.b.events
    );
    assert_eq!(p.b.state(), QpState::Error);
    assert!(
        p.a.events
            .contains(&QpEvent::RemoteTerminate(codes::MPA_MARKER)),
        "{:?}",
        p.a.events
    );
    assert_eq!(p.a.state(), QpState::Error);
}

/// A graceful close that starts in the middle of an FPDU keeps the QP in
/// Closing until that FPDU is out, so the peer sees a well-framed stream.
#[test]
fn disconnect_mid_fpdu_drains_then_errors() {
    use iwarp::qp::{QpEvent, QpState};
    let mut p = Pair::connected(
        QpConfig::default(),
        Chunking::whole(1 << 16),
        Config::default(),
        Config::default(),
    );
    let src = p.a.reg(100_000, Access::NONE);
    let dst = p.b.reg(100_000, Access::REMOTE_WRITE);
    let wr = SendWr {
        wr_id: 9,
        op: SendOp::Write {
            remote_addr: dst.iova,
            rkey: dst.rkey,
        },
        sgl: &[Sge {
            addr: src.iova,
            len: 100_000,
            lkey: src.lkey,
        }],
        signaled: true,
    };
    p.a.ctx.post_send(p.a.qp, &wr).unwrap();
    let mut out = vec![0u8; 700];
    let first = p.a.ctx.poll_transmit(p.a.qp, &mut out);
    assert_eq!(first, 700, "a partial FPDU is on its way");
    p.a.ctx.disconnect(p.a.qp);
    assert_eq!(p.a.state(), QpState::Closing);
    assert!(!p.a.ctx.wants_close(p.a.qp));
    let mut stream = out[..first].to_vec();
    loop {
        let n = p.a.ctx.poll_transmit(p.a.qp, &mut out);
        if n == 0 {
            break;
        }
        stream.extend_from_slice(&out[..n]);
    }
    assert_eq!(p.a.state(), QpState::Error);
    assert!(p.a.ctx.wants_close(p.a.qp));
    let wcs = p.a.completions();
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::WrFlushError);
    assert_eq!(p.a.ctx.poll_event(p.a.qp), Some(QpEvent::Disconnected));
    // The peer accepts exactly one whole FPDU and stays in RTS.
    assert_eq!(p.b.ctx.handle_input(p.b.qp, &stream, p.now), stream.len());
    assert_eq!(p.b.state(), QpState::Rts);
    assert_eq!(p.b.ctx.qp_stats(p.b.qp).unwrap().rx_fpdus, 1);
}

/// RFC 5044 §7.1.2 holds the responder's FPDUs until the initiator's first
/// one arrived; `responder_sends_first` lifts that for peers that need it.
#[test]
fn responder_sends_first_only_when_asked() {
    for relaxed in [false, true] {
        let b = Config {
            responder_sends_first: relaxed,
            ..Config::default()
        };
        let mut p = Pair::connected(
            QpConfig::default(),
            Chunking::whole(1 << 16),
            Config::default(),
            b,
        );
        let src = p.b.reg_with(b"first!", Access::NONE);
        let dst = p.a.reg(6, Access::REMOTE_WRITE);
        let wr = SendWr {
            wr_id: 1,
            op: SendOp::Write {
                remote_addr: dst.iova,
                rkey: dst.rkey,
            },
            sgl: &[Sge {
                addr: src.iova,
                len: 6,
                lkey: src.lkey,
            }],
            signaled: true,
        };
        p.b.ctx.post_send(p.b.qp, &wr).unwrap();
        p.drive();
        let placed = p.a.bytes(&dst) == b"first!";
        assert_eq!(placed, relaxed, "relaxed={relaxed}");
        assert_eq!(p.b.completions().len(), usize::from(relaxed));
    }
}
