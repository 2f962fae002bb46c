//! Asynchronous events of QPs (`Qp::poll_async_event`,
//! `Qp::wait_async_event`, `Qp::async_event_fd`) on two kernel-backend
//! devices connected over loopback TCP: an RDMA Write to an STag that
//! names nothing makes the responder terminate (its QP raises an access
//! error, the requester's a fatal error and its Write completes in
//! error); an orderly disconnect raises nothing; a QP on a shared receive
//! queue raises "last WQE reached" when it leaves RTS, after the error
//! event if there is one.
//!
//! Every wait is bounded by a generous timeout; nothing asserts timing.
//! "Nothing more raised" is checked once the connection event that raises
//! the events has been seen (they are queued with it): `Disconnected`
//! after an orderly close, the Terminate after an error.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::readable;
use iwarp_engine::{
    Access, Backend, CmEvent, ConnParams, Cq, Device, DeviceConfig, Mr, Pd, Progress, Qp,
    QpAsyncEvent, QpInit, RecvWr, SendOp, SendWr, Srq, WcStatus, EMPTY_WC,
};

const WAIT: Duration = Duration::from_secs(30);

fn open() -> Device {
    Device::open(
        Backend::Kernel,
        DeviceConfig {
            progress: Progress::Thread { cpu: None },
            seed: Some(9),
            busy_poll: false,
        },
    )
    .unwrap()
}

struct Side {
    _dev: Device,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    _srq: Option<Srq>,
}

/// A connected client and server; the server's QP takes its receives
/// from a shared receive queue when `srq`.
fn pair(srq: bool) -> (Side, Side) {
    let (cdev, sdev) = (open(), open());
    let l = sdev
        .listen("127.0.0.1:0".parse::<SocketAddr>().unwrap())
        .unwrap();
    let addr = l.local_addr();
    let (spd, scq) = (sdev.alloc_pd(), sdev.create_cq(64));
    let smr = sdev.reg_mr(&spd, 64, Access::LOCAL_WRITE).unwrap();
    let mut sinit = QpInit::new(&spd, &scq, 16);
    let ssrq = srq.then(|| {
        let s = sdev.create_srq(&spd, 16, 0).unwrap();
        s.post_recv(&RecvWr {
            wr_id: 1,
            sgl: &[smr.sge(0, 64)],
        })
        .unwrap();
        s
    });
    sinit.srq = ssrq.clone();
    let server = std::thread::spawn(move || {
        let req = l.get_request(Some(WAIT)).unwrap();
        let qp = req.accept(sinit, ConnParams::default()).unwrap();
        (qp, smr)
    });
    let (cpd, ccq) = (cdev.alloc_pd(), cdev.create_cq(64));
    let cmr = cdev.reg_mr(&cpd, 64, Access::LOCAL_WRITE).unwrap();
    let cqp = cdev
        .connect(addr, QpInit::new(&cpd, &ccq, 16), ConnParams::default())
        .unwrap();
    let (sqp, smr) = server.join().unwrap();
    (
        Side {
            _dev: cdev,
            _pd: cpd,
            cq: ccq,
            qp: cqp,
            mr: cmr,
            _srq: None,
        },
        Side {
            _dev: sdev,
            _pd: spd,
            cq: scq,
            qp: sqp,
            mr: smr,
            _srq: ssrq,
        },
    )
}

/// An RDMA Write from `c` to an rkey that names nothing on the server,
/// followed by a signaled Send that the Terminate fails.
fn write_to_invalid_stag(c: &Side) {
    c.qp.post_send(&SendWr {
        wr_id: 5,
        op: SendOp::Write {
            remote_addr: 0,
            rkey: 0x7fff_ff00,
        },
        sgl: &[c.mr.sge(0, 8)],
        signaled: false,
    })
    .unwrap();
    c.qp.post_send(&SendWr {
        wr_id: 6,
        op: SendOp::Read {
            remote_addr: 0,
            rkey: 0x7fff_ff01,
        },
        sgl: &[c.mr.sge(8, 8)],
        signaled: true,
    })
    .unwrap();
}

/// Wait for a connection event of `qp` that `end` accepts.
fn wait_cm(qp: &Qp, end: impl Fn(&CmEvent) -> bool) {
    loop {
        match qp.wait_event(WAIT) {
            Some(ev) if end(&ev) => return,
            Some(_) => {}
            None => panic!("no such connection event"),
        }
    }
}

/// Wait for `Disconnected` among the connection events of `qp`.
fn wait_closed(qp: &Qp) {
    wait_cm(qp, |ev| *ev == CmEvent::Disconnected);
}

/// Wait for the Terminate (sent or received) among the connection events
/// of `qp`: the events it raises are queued with it.
fn wait_terminated(qp: &Qp) {
    wait_cm(qp, |ev| {
        matches!(ev, CmEvent::LocalTerminate(_) | CmEvent::RemoteTerminate(_))
    });
}

/// With the connection ended, `qp` holds no further asynchronous event
/// and its descriptor is quiet.
fn no_more(qp: &Qp) {
    assert_eq!(qp.poll_async_event(), None);
    assert!(!readable(qp.async_event_fd(), 0));
}

#[test]
fn invalid_stag_write_raises_access_error_at_the_responder() {
    let (c, s) = pair(false);
    // Created before the event: it becomes readable with it.
    let sfd = s.qp.async_event_fd();
    assert!(!readable(sfd, 0));
    write_to_invalid_stag(&c);
    assert!(readable(sfd, 30_000), "no event on the responder");
    assert_eq!(s.qp.poll_async_event(), Some(QpAsyncEvent::AccessError));
    // The requester: the work request behind the Write completes in
    // error, and the peer's Terminate makes its QP fatal.
    let mut wc = [EMPTY_WC; 1];
    assert_eq!(c.cq.wait(&mut wc, Some(WAIT)), 1, "no completion");
    assert_eq!(wc[0].wr_id, 6);
    assert_ne!(wc[0].status, WcStatus::Success);
    assert_eq!(c.qp.wait_async_event(WAIT), Some(QpAsyncEvent::Fatal));
    // One event per QP.
    wait_terminated(&c.qp);
    wait_terminated(&s.qp);
    no_more(&c.qp);
    no_more(&s.qp);
    let _ = s.cq.poll(&mut wc);
}

#[test]
fn orderly_disconnect_raises_nothing() {
    let (c, s) = pair(false);
    // The descriptors exist before the close, so anything raised would
    // count on them.
    let (cfd, sfd) = (c.qp.async_event_fd(), s.qp.async_event_fd());
    c.qp.disconnect();
    wait_closed(&c.qp);
    wait_closed(&s.qp);
    assert!(!readable(cfd, 0));
    assert!(!readable(sfd, 0));
    no_more(&c.qp);
    no_more(&s.qp);
}

#[test]
fn srq_qp_raises_last_wqe_reached_on_disconnect() {
    let (c, s) = pair(true);
    let sfd = s.qp.async_event_fd();
    c.qp.disconnect();
    assert!(readable(sfd, 30_000), "no event on the SRQ's QP");
    assert_eq!(s.qp.poll_async_event(), Some(QpAsyncEvent::LastWqeReached));
    wait_closed(&c.qp);
    wait_closed(&s.qp);
    no_more(&c.qp);
    no_more(&s.qp);
}

#[test]
fn srq_qp_raises_last_wqe_reached_after_its_error() {
    let (c, s) = pair(true);
    write_to_invalid_stag(&c);
    assert_eq!(s.qp.wait_async_event(WAIT), Some(QpAsyncEvent::AccessError));
    assert_eq!(
        s.qp.wait_async_event(WAIT),
        Some(QpAsyncEvent::LastWqeReached)
    );
    assert_eq!(c.qp.wait_async_event(WAIT), Some(QpAsyncEvent::Fatal));
    wait_terminated(&c.qp);
    wait_terminated(&s.qp);
    no_more(&c.qp);
    no_more(&s.qp);
}

#[test]
fn local_terminates_map_to_the_verbs_events() {
    use iwarp_engine::iwarp::error::codes::*;
    let of = QpAsyncEvent::of_local_terminate;
    for c in [
        DDP_T_INVALID_STAG,
        DDP_T_BASE_BOUNDS,
        DDP_T_STAG_NOT_ASSOC,
        DDP_T_TO_WRAP,
        RDMAP_INVALID_STAG,
        RDMAP_ACCESS_RIGHTS,
        RDMAP_BASE_BOUNDS,
    ] {
        assert_eq!(of(c), QpAsyncEvent::AccessError, "{c:?}");
    }
    for c in [
        RDMAP_UNEXPECTED_OPCODE,
        RDMAP_CATASTROPHIC_STREAM,
        RDMAP_INVALID_VERSION,
        DDP_T_INVALID_VERSION,
        DDP_U_INVALID_QN,
        DDP_U_INVALID_MSN_RANGE,
        DDP_U_INVALID_MO,
        DDP_U_MSG_TOO_LONG,
    ] {
        assert_eq!(of(c), QpAsyncEvent::RequestError, "{c:?}");
    }
    for c in [
        DDP_U_INVALID_MSN_NO_BUFFER,
        RDMAP_LOCAL_CATASTROPHIC,
        DDP_LOCAL_CATASTROPHIC,
        MPA_CRC,
        MPA_MARKER,
    ] {
        assert_eq!(of(c), QpAsyncEvent::Fatal, "{c:?}");
    }
}
