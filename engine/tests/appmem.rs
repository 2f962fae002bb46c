//! Regions over the application's own memory (`Device::reg_user_mr`), on
//! two kernel-backend devices connected over loopback TCP.
//!
//! Every wait is bounded by a generous timeout; nothing asserts timing.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use iwarp_engine::iwarp::error::{codes, TermCode};
use iwarp_engine::{
    Access, Backend, CmEvent, ConnParams, Cq, Device, DeviceConfig, Mr, Pd, Progress, Qp, QpInit,
    SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion, EMPTY_WC,
};

const WAIT: Duration = Duration::from_secs(30);

fn all() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE
}

fn open(progress: Progress) -> Device {
    Device::open(
        Backend::Kernel,
        DeviceConfig {
            progress,
            seed: Some(11),
            busy_poll: false,
        },
    )
    .unwrap()
}

struct Side {
    dev: Device,
    pd: Pd,
    cq: Cq,
    qp: Qp,
}

impl Side {
    fn wait_one(&self) -> WorkCompletion {
        let mut wc = [EMPTY_WC; 1];
        assert_eq!(self.cq.wait(&mut wc, Some(WAIT)), 1, "no completion");
        wc[0]
    }

    /// Register `buf` with tagged offsets from `iova`.
    fn reg(&self, buf: &mut [u8], iova: u64) -> Mr {
        // SAFETY: `buf` outlives the region in every test (each test
        // drops the `Mr` first), and the tests touch it only after the
        // completions of the operations on it, through raw copies.
        unsafe {
            self.dev
                .reg_user_mr(&self.pd, buf.as_mut_ptr(), buf.len(), iova, all())
        }
        .unwrap()
    }
}

/// A client and a server device with progress threads, connected.
fn pair() -> (Side, Side) {
    pair_with(THREAD, THREAD)
}

const THREAD: Progress = Progress::Thread { cpu: None };

/// A client and a server device, connected (a manual server is driven
/// by the thread that accepts).
fn pair_with(client: Progress, server: Progress) -> (Side, Side) {
    let (cdev, sdev) = (open(client), open(server));
    let l = sdev
        .listen("127.0.0.1:0".parse::<SocketAddr>().unwrap())
        .unwrap();
    let addr = l.local_addr();
    let (spd, scq) = (sdev.alloc_pd(), sdev.create_cq(64));
    let sinit = QpInit::new(&spd, &scq, 16);
    let connected = Arc::new(AtomicBool::new(false));
    let (done, sdev2) = (connected.clone(), sdev.clone());
    let server = std::thread::spawn(move || {
        let req = l.get_request(Some(WAIT)).unwrap();
        let qp = req.accept(sinit, ConnParams::default()).unwrap();
        // A manual server sends its reply when driven.
        while !done.load(Ordering::Acquire) {
            if sdev2.progress() == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        qp
    });
    let (cpd, ccq) = (cdev.alloc_pd(), cdev.create_cq(64));
    let cqp = cdev
        .connect(addr, QpInit::new(&cpd, &ccq, 16), ConnParams::default())
        .unwrap();
    connected.store(true, Ordering::Release);
    let sqp = server.join().unwrap();
    (
        Side {
            dev: cdev,
            pd: cpd,
            cq: ccq,
            qp: cqp,
        },
        Side {
            dev: sdev,
            pd: spd,
            cq: scq,
            qp: sqp,
        },
    )
}

fn write_wr(wr_id: u64, sge: &[iwarp_engine::Sge], remote_addr: u64, rkey: u32) -> SendWr<'_> {
    SendWr {
        wr_id,
        op: SendOp::Write { remote_addr, rkey },
        sgl: sge,
        signaled: true,
    }
}

/// The first Terminate reported on `qp` (remote or local).
fn terminate(qp: &Qp) -> (bool, TermCode) {
    loop {
        match qp.wait_event(WAIT) {
            Some(CmEvent::RemoteTerminate(c)) => return (true, c),
            Some(CmEvent::LocalTerminate(c)) => return (false, c),
            Some(_) => continue,
            None => panic!("no Terminate"),
        }
    }
}

#[test]
fn rdma_write_and_read_reach_application_memory_at_its_iova() {
    let (c, s) = pair();
    let len = 70_000;
    let mut cbuf = vec![0u8; 2 * len];
    let mut sbuf = vec![0u8; len];
    // Tagged offsets unrelated to the addresses.
    let (ciova, siova) = (0x10_0000_0000u64, 0x7000u64);
    let cmr = c.reg(&mut cbuf, ciova);
    let smr = s.reg(&mut sbuf, siova);
    assert_eq!(cmr.addr(), ciova);
    assert_eq!(smr.addr(), siova);
    assert_eq!(cmr.len(), 2 * len);
    let sge = cmr.sge(0, 10);
    assert_eq!(sge.addr, ciova);

    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
    cmr.write(0, &data);
    // RDMA Write from the client's memory into the server's, 3 bytes in.
    let sgl = [cmr.sge(0, len - 3)];
    c.qp.post_send(&write_wr(1, &sgl, siova + 3, smr.rkey()))
        .unwrap();
    let wc = c.wait_one();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (1, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    // The server learns of the Write by a Send that follows it.
    let mut token = vec![0u8; 8];
    let tmr = s.reg(&mut token, 0);
    s.qp.post_recv(&iwarp_engine::RecvWr {
        wr_id: 9,
        sgl: &[tmr.sge(0, 8)],
    })
    .unwrap();
    c.qp.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl: &[cmr.sge(0, 8)],
        signaled: true,
    })
    .unwrap();
    assert_eq!(c.wait_one().status, WcStatus::Success);
    let wc = s.wait_one();
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::Success));
    let mut got = vec![0u8; len];
    smr.read(0, &mut got);
    assert_eq!(&got[..3], &[0, 0, 0]);
    assert!(got[3..] == data[..len - 3], "the Write landed at iova + 3");

    // RDMA Read of the server's memory into the second half of the
    // client's.
    smr.write(0, &data);
    c.qp.post_send(&SendWr {
        wr_id: 3,
        op: SendOp::Read {
            remote_addr: siova,
            rkey: smr.rkey(),
        },
        sgl: &[cmr.sge(len, len)],
        signaled: true,
    })
    .unwrap();
    let wc = c.wait_one();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (3, WcStatus::Success, WcOpcode::RdmaRead)
    );
    drop((cmr, smr, tmr));
    // The regions are gone: the test's own memory holds the bytes.
    assert!(cbuf[len..] == data[..], "the Read landed in the Vec");
    assert!(sbuf[..] == data[..]);
    assert_eq!(&token[..], &data[..8]);
}

#[test]
fn user_regions_check_their_pd() {
    let (c, s) = pair();
    let mut buf = vec![0u8; 64];
    // A PD of another device.
    let other = c.dev.alloc_pd();
    // SAFETY: `buf` outlives every region of it in this test.
    let r = unsafe { s.dev.reg_user_mr(&other, buf.as_mut_ptr(), 64, 0, all()) };
    assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
    // SAFETY: as above (a null address is refused before any use).
    let r = unsafe { s.dev.reg_user_mr(&s.pd, std::ptr::null_mut(), 64, 0, all()) };
    assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
    // A region of another PD of the server's device: the peer's Write
    // with its rkey is a protection error (STag not associated with the
    // stream's PD).
    let pd2 = s.dev.alloc_pd();
    // SAFETY: as above.
    let mr = unsafe { s.dev.reg_user_mr(&pd2, buf.as_mut_ptr(), 64, 0x100, all()) }.unwrap();
    let mut src = vec![5u8; 16];
    let cmr = c.reg(&mut src, 0x2000);
    let sgl = [cmr.sge(0, 16)];
    c.qp.post_send(&write_wr(1, &sgl, 0x100, mr.rkey()))
        .unwrap();
    assert_eq!(terminate(&c.qp), (true, codes::DDP_T_STAG_NOT_ASSOC));
    assert_eq!(terminate(&s.qp), (false, codes::DDP_T_STAG_NOT_ASSOC));
    drop((mr, cmr));
    assert!(buf.iter().all(|&b| b == 0), "nothing was placed");
}

#[test]
fn dropping_a_user_region_deregisters_it() {
    let (c, s) = pair();
    let mut buf = vec![0u8; 64];
    let smr = s.reg(&mut buf, 0x4000);
    let rkey = smr.rkey();
    let mut src = vec![7u8; 16];
    let cmr = c.reg(&mut src, 0);
    let sgl = [cmr.sge(0, 16)];
    // Reachable while registered.
    c.qp.post_send(&write_wr(1, &sgl, 0x4000, rkey)).unwrap();
    assert_eq!(c.wait_one().status, WcStatus::Success);
    // A Read completes only after the Write before it was placed.
    let sgl2 = [cmr.sge(0, 16)];
    c.qp.post_send(&SendWr {
        wr_id: 2,
        op: SendOp::Read {
            remote_addr: 0x4000,
            rkey,
        },
        sgl: &sgl2,
        signaled: true,
    })
    .unwrap();
    assert_eq!(c.wait_one().status, WcStatus::Success);
    drop(smr);
    assert_eq!(&buf[..16], &[7; 16]);
    buf.fill(0);
    // The old rkey names nothing: the Write is refused and the memory,
    // still the test's, is untouched.
    c.qp.post_send(&write_wr(3, &sgl, 0x4000, rkey)).unwrap();
    assert_eq!(terminate(&c.qp), (true, codes::DDP_T_INVALID_STAG));
    assert_eq!(terminate(&s.qp), (false, codes::DDP_T_INVALID_STAG));
    drop(cmr);
    assert!(buf.iter().all(|&b| b == 0), "nothing placed after dereg");
}

/// `Mr::wait_byte` sees the last byte of an RDMA Write land, with a
/// progress thread and with manual progress (which it drives itself).
#[test]
fn wait_byte_sees_an_incoming_write() {
    for server in [THREAD, Progress::Manual] {
        let (c, s) = pair_with(THREAD, server);
        let len = 5000;
        let mut sbuf = vec![0u8; len];
        let smr = s.reg(&mut sbuf, 0x9000);
        let mut cbuf: Vec<u8> = (0..len).map(|i| (i % 200) as u8 + 1).collect();
        let cmr = c.reg(&mut cbuf, 0);
        assert!(!smr.wait_byte(len - 1, 0xee, Some(Duration::from_millis(1))));
        for round in 0..3u8 {
            let last = 0xf0 + round;
            cmr.write(len - 1, &[last]);
            let sgl = [cmr.sge(0, len)];
            c.qp.post_send(&write_wr(u64::from(round), &sgl, 0x9000, smr.rkey()))
                .unwrap();
            assert!(smr.wait_byte(len - 1, last, Some(WAIT)), "round {round}");
            // In order: everything before the last byte is there.
            let mut got = vec![0u8; len];
            smr.read(0, &mut got);
            let mut want: Vec<u8> = (0..len).map(|i| (i % 200) as u8 + 1).collect();
            want[len - 1] = last;
            assert!(got == want, "round {round}");
            assert_eq!(c.wait_one().status, WcStatus::Success);
        }
        drop((smr, cmr));
        drop((c, s));
        assert_eq!(sbuf[len - 1], 0xf2);
    }
}
