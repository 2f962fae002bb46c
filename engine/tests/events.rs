//! Event descriptors: completion notifications (`Cq::req_notify`,
//! `Cq::event_fd`), connection requests (`Listener::event_fd`) and
//! connection events (`Qp::event_fd`), watched with poll(2) and epoll, on
//! two kernel-backend devices connected over loopback TCP.
//!
//! Every wait is bounded by a generous timeout; nothing asserts timing.
//! "Not readable" is checked only where nothing can make the descriptor
//! readable any more.

mod common;

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::readable;
use iwarp_engine::{
    Access, Backend, CmError, CmEvent, ConnParams, ConnRequest, Connecting, Cq, Device,
    DeviceConfig, Listener, Mr, Pd, Progress, Qp, QpInit, QpState, RecvWr, SendOp, SendWr,
    WcOpcode, WcStatus, WorkCompletion, EMPTY_WC,
};

const WAIT: Duration = Duration::from_secs(30);
const THREAD: Progress = Progress::Thread { cpu: None };

fn open(progress: Progress) -> Device {
    Device::open(
        Backend::Kernel,
        DeviceConfig {
            progress,
            seed: Some(5),
            busy_poll: false,
        },
    )
    .unwrap()
}

const FOREVER: u16 = 30_000;

struct Side {
    _dev: Device,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

impl Side {
    fn wait_one(&self) -> WorkCompletion {
        let mut wc = [EMPTY_WC; 1];
        assert_eq!(self.cq.wait(&mut wc, Some(WAIT)), 1, "no completion");
        wc[0]
    }

    fn send(&self, wr_id: u64, solicited: bool) {
        self.qp
            .post_send(&SendWr {
                wr_id,
                op: SendOp::Send {
                    solicited,
                    invalidate: None,
                },
                sgl: &[self.mr.sge(0, 8)],
                signaled: true,
            })
            .unwrap();
    }
}

/// A client with a progress thread and a server with `server` progress,
/// connected; the server has `recvs` receives posted before the reply.
fn pair(server: Progress, recvs: usize) -> (Side, Side) {
    let (cdev, sdev) = (open(THREAD), open(server));
    let l = sdev
        .listen("127.0.0.1:0".parse::<SocketAddr>().unwrap())
        .unwrap();
    let addr = l.local_addr();
    let (spd, scq) = (sdev.alloc_pd(), sdev.create_cq(64));
    let smr = sdev
        .reg_mr(&spd, 64, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    let sinit = QpInit::new(&spd, &scq, 16);
    let connected = Arc::new(AtomicBool::new(false));
    let (done, sdev2) = (connected.clone(), sdev.clone());
    let server = std::thread::spawn(move || {
        let req = l.get_request(Some(WAIT)).unwrap();
        let sge = [smr.sge(0, 64)];
        let wrs: Vec<RecvWr<'_>> = (0..recvs)
            .map(|k| RecvWr {
                wr_id: 1000 + k as u64,
                sgl: &sge,
            })
            .collect();
        let qp = req
            .accept_with_recvs(sinit, ConnParams::default(), &wrs)
            .unwrap();
        // A manual server sends its reply when driven.
        while !done.load(Ordering::Acquire) {
            if sdev2.progress() == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        (qp, smr)
    });
    let (cpd, ccq) = (cdev.alloc_pd(), cdev.create_cq(64));
    let cmr = cdev.reg_mr(&cpd, 64, Access::LOCAL_WRITE).unwrap();
    let cqp = cdev
        .connect(addr, QpInit::new(&cpd, &ccq, 16), ConnParams::default())
        .unwrap();
    connected.store(true, Ordering::Release);
    let (sqp, smr) = server.join().unwrap();
    (
        Side {
            _dev: cdev,
            _pd: cpd,
            cq: ccq,
            qp: cqp,
            mr: cmr,
        },
        Side {
            _dev: sdev,
            _pd: spd,
            cq: scq,
            qp: sqp,
            mr: smr,
        },
    )
}

/// The client reads the server's region: once it completes, the server
/// has handled everything the client sent before. The client's other
/// completions met on the way are dropped.
fn fence(c: &Side, s: &Side) {
    c.qp.post_send(&SendWr {
        wr_id: 77,
        op: SendOp::Read {
            remote_addr: s.mr.addr(),
            rkey: s.mr.rkey(),
        },
        sgl: &[c.mr.sge(32, 8)],
        signaled: true,
    })
    .unwrap();
    loop {
        let wc = c.wait_one();
        assert_eq!(wc.status, WcStatus::Success);
        if wc.wr_id == 77 {
            return;
        }
    }
}

#[test]
fn one_notification_per_arm_and_none_for_queued_completions() {
    let (c, s) = pair(THREAD, 8);
    let fd = s.cq.event_fd();
    assert!(!s.cq.get_event(), "nothing armed, nothing raised");
    s.cq.req_notify(false).unwrap();
    c.send(1, false);
    assert!(readable(fd, FOREVER), "the Send raised a notification");
    assert!(s.cq.get_event());
    assert!(!s.cq.get_event(), "one count per notification");
    let wc = s.wait_one();
    assert_eq!((wc.opcode, wc.status), (WcOpcode::Recv, WcStatus::Success));
    // Not re-armed: a second Send raises nothing.
    c.send(2, false);
    fence(&c, &s);
    // Arming with that completion already queued raises nothing either.
    s.cq.req_notify(false).unwrap();
    assert_eq!(s.wait_one().wr_id, 1001);
    assert!(!readable(fd, 0));
    assert!(!s.cq.get_event());
    // The next completion after the arm does.
    c.send(3, false);
    assert!(s.cq.wait_event(Some(WAIT)));
    assert_eq!(s.wait_one().wr_id, 1002);
    assert!(!readable(fd, 0));
}

#[test]
fn solicited_only_fires_on_solicited_sends() {
    let (c, s) = pair(THREAD, 8);
    let fd = s.cq.event_fd();
    s.cq.req_notify(true).unwrap();
    c.send(1, false);
    let wc = s.wait_one();
    assert!(!wc.solicited);
    fence(&c, &s);
    assert!(!readable(fd, 0), "an unsolicited Send raises nothing");
    c.send(2, true);
    assert!(readable(fd, FOREVER));
    assert!(s.cq.get_event());
    let wc = s.wait_one();
    assert!(wc.solicited);
    assert!(!s.cq.get_event());
}

#[test]
fn solicited_only_fires_once_on_flushed_receives() {
    let (c, s) = pair(THREAD, 4);
    s.cq.req_notify(true).unwrap();
    // The client leaves: the server's four receives are flushed.
    c.qp.disconnect();
    assert!(
        s.cq.wait_event(Some(WAIT)),
        "an error completion raises one"
    );
    for k in 0..4 {
        let wc = s.wait_one();
        assert_eq!((wc.wr_id, wc.status), (1000 + k, WcStatus::WrFlushError));
    }
    assert!(!s.cq.get_event(), "exactly once per arm");
    assert!(!readable(s.cq.event_fd(), 0));
}

#[test]
fn manual_progress_raises_within_progress() {
    let (c, s) = pair(Progress::Manual, 8);
    s.cq.req_notify(false).unwrap();
    c.send(1, true);
    // The waiting thread drives the server's engine.
    assert!(s.cq.wait_event(Some(WAIT)));
    assert_eq!(s.wait_one().wr_id, 1000);
    assert!(!s.cq.get_event());
    drop(c);
}

/// An epoll set watching `fds`, tokens their indices.
struct Epoll(std::os::fd::OwnedFd);

impl Epoll {
    fn new(fds: &[BorrowedFd<'_>]) -> Self {
        use std::os::fd::FromRawFd;
        // SAFETY: no pointers.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        // SAFETY: just opened, owned by nothing else.
        let ep = unsafe { std::os::fd::OwnedFd::from_raw_fd(ep) };
        for (k, fd) in fds.iter().enumerate() {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: k as u64,
            };
            // SAFETY: valid descriptors and event.
            let r = unsafe {
                libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev)
            };
            assert_eq!(r, 0);
        }
        Self(ep)
    }

    /// The tokens ready within `ms` milliseconds.
    fn wait(&self, ms: i32) -> Vec<u64> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
        // SAFETY: `evs` holds 8 events.
        let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), evs.as_mut_ptr(), 8, ms) };
        assert!(n >= 0);
        let mut v: Vec<u64> = evs[..n as usize].iter().map(|e| e.u64).collect();
        v.sort_unstable();
        v
    }
}

/// A listener with `n` requests waiting, from clients blocked in connect
/// on their own threads (each gets its QP once accepted).
fn requests(n: usize) -> (Device, Listener, Vec<std::thread::JoinHandle<Qp>>) {
    let sdev = open(THREAD);
    let l = sdev
        .listen("127.0.0.1:0".parse::<SocketAddr>().unwrap())
        .unwrap();
    let addr = l.local_addr();
    let clients = (0..n)
        .map(|_| {
            std::thread::spawn(move || {
                let dev = open(THREAD);
                let (pd, cq) = (dev.alloc_pd(), dev.create_cq(8));
                dev.connect(addr, QpInit::new(&pd, &cq, 4), ConnParams::default())
                    .unwrap()
            })
        })
        .collect();
    (sdev, l, clients)
}

#[test]
fn listener_fd_counts_waiting_requests() {
    let (sdev, l, clients) = requests(2);
    let fd = l.event_fd();
    let ep = Epoll::new(&[fd]);
    let (pd, cq) = (sdev.alloc_pd(), sdev.create_cq(8));
    let mut qps = Vec::new();
    for _ in 0..2 {
        assert_eq!(ep.wait(i32::from(FOREVER)), vec![0]);
        let req = l.get_request(Some(Duration::ZERO)).unwrap();
        qps.push(req.accept(QpInit::new(&pd, &cq, 4), ConnParams::default()));
    }
    for c in clients {
        c.join().unwrap();
    }
    assert!(qps.iter().all(Result::is_ok));
    assert!(ep.wait(0).is_empty(), "both requests taken");
    assert!(!readable(fd, 0));
}

#[test]
fn qp_fd_counts_connection_events() {
    let (c, s) = pair(THREAD, 2);
    let cfd = c.qp.event_fd();
    let sfd = s.qp.event_fd();
    let cq_fd = s.cq.event_fd();
    s.cq.req_notify(true).unwrap();
    let ep = Epoll::new(&[cfd, sfd, cq_fd]);
    assert!(ep.wait(0).is_empty());
    // An RDMA Write to an rkey that names nothing: the server sends a
    // Terminate, both sides report it, and the server's receives flush.
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
    let mut seen = Vec::new();
    while seen != [0, 1, 2] {
        let r = ep.wait(i32::from(FOREVER));
        assert!(!r.is_empty());
        seen.extend(r);
        seen.sort_unstable();
        seen.dedup();
    }
    assert!(matches!(
        c.qp.poll_event(),
        Some(CmEvent::RemoteTerminate(_))
    ));
    assert!(matches!(
        s.qp.poll_event(),
        Some(CmEvent::LocalTerminate(_))
    ));
    assert!(s.cq.get_event());
    // A descriptor readable means an event is waiting (whatever else the
    // closing connection reports).
    for qp in [&c.qp, &s.qp] {
        while readable(qp.event_fd(), 0) {
            assert!(qp.poll_event().is_some());
        }
    }
}

#[test]
fn qp_fd_created_after_an_event_is_readable() {
    let (c, s) = pair(THREAD, 0);
    c.qp.disconnect();
    // The server's QP leaves RTS in the pass that queues the event (under
    // the engine lock `state` takes); the descriptor, created only then,
    // starts with the events already queued.
    let dl = std::time::Instant::now() + WAIT;
    while s.qp.state() == QpState::Rts {
        assert!(std::time::Instant::now() < dl, "the QP stays in RTS");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(readable(s.qp.event_fd(), FOREVER));
    assert_eq!(s.qp.poll_event(), Some(CmEvent::Disconnected));
    assert!(!readable(s.qp.event_fd(), 0));
}

/// Drive `c` by its descriptor until the outcome (with `dev`'s engine
/// run by this thread when it is manual).
fn finish(c: &mut Connecting, dev: Option<&Device>) -> Result<Qp, CmError> {
    let dl = std::time::Instant::now() + WAIT;
    loop {
        assert!(std::time::Instant::now() < dl, "no outcome");
        let ms = match dev {
            Some(d) => {
                d.progress();
                1
            }
            None => FOREVER,
        };
        if readable(c.event_fd(), ms) {
            if let Some(r) = c.poll() {
                assert!(c.poll().is_none(), "the outcome comes once");
                return r;
            }
        }
    }
}

/// A server device listening, and a thread that hands its first request
/// and a `QpInit` of the server device to `f`.
fn listen_and(
    f: impl FnOnce(ConnRequest, QpInit, Device) -> Option<Qp> + Send + 'static,
) -> (SocketAddr, std::thread::JoinHandle<Option<Qp>>, Device) {
    let sdev = open(THREAD);
    let l = sdev
        .listen("127.0.0.1:0".parse::<SocketAddr>().unwrap())
        .unwrap();
    let addr = l.local_addr();
    let (pd, cq) = (sdev.alloc_pd(), sdev.create_cq(8));
    let init = QpInit::new(&pd, &cq, 4);
    let d = sdev.clone();
    let t = std::thread::spawn(move || f(l.get_request(Some(WAIT)).unwrap(), init, d));
    (addr, t, sdev)
}

#[test]
fn connect_start_reports_through_its_descriptor() {
    for manual in [false, true] {
        // The server sends as soon as it may: the receive posted by
        // `connect_start` must be there.
        let (addr, t, _sdev) = listen_and(|req, init, dev| {
            let mr = dev.reg_mr(&init.pd, 4, Access::LOCAL_WRITE).unwrap();
            let cq = init.send_cq.clone();
            let qp = req.accept(init, ConnParams::default()).unwrap();
            qp.post_send(&SendWr {
                wr_id: 1,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sgl: &[mr.sge(0, 4)],
                signaled: true,
            })
            .unwrap();
            // The region stays registered until the Send is out.
            let mut wc = [EMPTY_WC; 1];
            assert_eq!(cq.wait(&mut wc, Some(WAIT)), 1);
            assert_eq!(wc[0].status, WcStatus::Success);
            Some(qp)
        });
        let cdev = open(if manual { Progress::Manual } else { THREAD });
        let (pd, cq) = (cdev.alloc_pd(), cdev.create_cq(8));
        let rbuf = cdev.reg_mr(&pd, 16, Access::LOCAL_WRITE).unwrap();
        let sge = [rbuf.sge(0, 16)];
        let recvs = [RecvWr {
            wr_id: 42,
            sgl: &sge,
        }];
        // Peer-to-peer mode (RFC 6581): the responder may send first once
        // the initiator's RTR is in.
        let params = ConnParams {
            p2p: true,
            ..ConnParams::default()
        };
        let mut c = cdev
            .connect_start(addr, QpInit::new(&pd, &cq, 4), params, &recvs)
            .unwrap();
        let qp = finish(&mut c, manual.then_some(&cdev)).unwrap();
        assert_eq!(qp.state(), QpState::Rts);
        let sqp = t.join().unwrap().unwrap();
        let mut wc = [EMPTY_WC; 1];
        let dl = std::time::Instant::now() + WAIT;
        while cq.poll(&mut wc) == 0 {
            assert!(std::time::Instant::now() < dl, "no receive");
            cdev.progress();
        }
        assert_eq!((wc[0].wr_id, wc[0].status), (42, WcStatus::Success));
        drop((rbuf, qp, sqp));
    }
}

#[test]
fn connect_start_reports_failures() {
    // Refused: a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let cdev = open(THREAD);
    let (pd, cq) = (cdev.alloc_pd(), cdev.create_cq(8));
    match cdev.connect_start(port, QpInit::new(&pd, &cq, 4), ConnParams::default(), &[]) {
        Ok(mut c) => assert_eq!(
            finish(&mut c, None).unwrap_err(),
            CmError::ConnectionRefused
        ),
        Err(e) => assert_eq!(e, CmError::ConnectionRefused),
    }
    // Rejected by the server, with its private data.
    let (addr, t, _sdev) = listen_and(|req, _, _| {
        req.reject(b"no").unwrap();
        None
    });
    let mut c = cdev
        .connect_start(addr, QpInit::new(&pd, &cq, 4), ConnParams::default(), &[])
        .unwrap();
    assert_eq!(
        finish(&mut c, None).unwrap_err(),
        CmError::Rejected {
            private_data: b"no".to_vec()
        }
    );
    assert!(t.join().unwrap().is_none());
    // Abandoned before the outcome: dropping it is all it takes.
    let (addr, t, _sdev2) = listen_and(|req, init, _| req.accept(init, ConnParams::default()).ok());
    let c = cdev
        .connect_start(addr, QpInit::new(&pd, &cq, 4), ConnParams::default(), &[])
        .unwrap();
    drop(c);
    drop(t);
}
