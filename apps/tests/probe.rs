//! Every probe scenario against our stack (engine, kernel TCP backend, on
//! 127.0.0.1 with ephemeral ports): the exact reaction on the wire, the
//! target QP in Error with every outstanding work request flushed, no byte
//! of a region or guard changed, and a second, well-behaved connection on
//! the same device completing a Write and a Read before, during and after
//! the attack.

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use iwarp_apps::probe::{self, target, Expect, Options, Phase, Reaction};
use iwarp_engine::{
    Access, Backend, ConnParams, Cq, Device, DeviceConfig, Mr, Progress, Qp, QpInit, QpState,
    SendOp, SendWr, WcStatus, EMPTY_WC,
};

const TIMEOUT: Duration = Duration::from_secs(10);

fn device() -> Device {
    Device::open(
        Backend::Kernel,
        DeviceConfig {
            progress: Progress::Thread { cpu: None },
            seed: Some(0x5eed),
            busy_poll: false,
        },
    )
    .unwrap()
}

fn init(dev: &Device, pd: &iwarp_engine::Pd, cq: &Cq) -> QpInit {
    let _ = dev;
    QpInit {
        pd: pd.clone(),
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        sq_depth: 8,
        rq_depth: 2,
        sig_all: false,
        srq: None,
    }
}

/// A well-behaved connection between two QPs of the same device: the
/// initiator writes a pattern into the responder's region and reads it back.
struct Good {
    client: Qp,
    _server: Qp,
    cq: Cq,
    src: Mr,
    dst: Mr,
    remote: Mr,
}

impl Good {
    fn new(dev: &Device) -> Self {
        let listener = dev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr();
        let pd = dev.alloc_pd();
        let scq = dev.create_cq(16);
        let remote = dev
            .reg_mr(
                &pd,
                256,
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
            .unwrap();
        let sinit = init(dev, &pd, &scq);
        let server = thread::spawn(move || {
            let req = listener.get_request(Some(TIMEOUT)).unwrap();
            req.accept(sinit, ConnParams::default()).unwrap()
        });
        let cq = dev.create_cq(16);
        let client = dev
            .connect(addr, init(dev, &pd, &cq), ConnParams::default())
            .unwrap();
        let src = dev.reg_mr(&pd, 256, Access::LOCAL_WRITE).unwrap();
        let dst = dev.reg_mr(&pd, 256, Access::LOCAL_WRITE).unwrap();
        Self {
            client,
            _server: server.join().unwrap(),
            cq,
            src,
            dst,
            remote,
        }
    }

    /// One Write and one Read of 64 bytes of `tag`; both must succeed.
    fn exchange(&self, tag: u8) {
        self.src.write(0, &[tag; 64]);
        self.client
            .post_send(&SendWr {
                wr_id: 1,
                op: SendOp::Write {
                    remote_addr: self.remote.addr(),
                    rkey: self.remote.rkey(),
                },
                sgl: &[self.src.sge(0, 64)],
                signaled: true,
            })
            .unwrap();
        self.client
            .post_send(&SendWr {
                wr_id: 2,
                op: SendOp::Read {
                    remote_addr: self.remote.addr(),
                    rkey: self.remote.rkey(),
                },
                sgl: &[self.dst.sge(0, 64)],
                signaled: true,
            })
            .unwrap();
        let mut got = 0;
        let mut wcs = [EMPTY_WC; 4];
        while got < 2 {
            let n = self.cq.wait(&mut wcs, Some(TIMEOUT));
            assert!(n > 0, "the good connection stalled");
            for wc in &wcs[..n] {
                assert_eq!(wc.status, WcStatus::Success, "good connection: {wc:?}");
            }
            got += n;
        }
        let mut back = [0u8; 64];
        self.dst.read(0, &mut back);
        assert_eq!(back, [tag; 64]);
        assert_eq!(self.client.state(), QpState::Rts);
    }
}

fn check(name: &str) {
    check_at(name, "127.0.0.1:0");
}

/// [`check`] with the target listening on `at`.
fn check_at(name: &str, at: &str) {
    let s = probe::scenario(name).expect("scenario exists");
    let dev = device();
    let good = Good::new(&dev);
    good.exchange(1);
    let listener = dev.listen(at.parse().unwrap()).unwrap();
    let addr: SocketAddr = listener.local_addr();
    // A connection whose MPA request is broken never reaches the target.
    let reaches_target = !s.is_mpa() || s.expect == Expect::Accepted;
    let tdev = dev.clone();
    let target = thread::spawn(move || {
        let report = reaches_target.then(|| target::serve_one(&tdev, &listener, TIMEOUT).unwrap());
        // Nothing else surfaced as a connection request.
        assert!(
            listener
                .get_request(Some(Duration::from_millis(300)))
                .is_err(),
            "a broken request reached the application"
        );
        report
    });
    let mut tag = 2u8;
    let mut hook = |_: Phase| {
        good.exchange(tag);
        tag += 1;
    };
    let opts = Options {
        timeout: TIMEOUT,
        ..Options::default()
    };
    let out = probe::run_client(s, addr, &opts, &mut hook).expect("the probe ran");
    assert!(
        s.expect.matches(&out.reaction),
        "{name}: expected {:?}, the stack did: {}",
        s.expect,
        out.reaction
    );
    let report = target.join().unwrap();
    good.exchange(0x77);
    let Some(r) = report else {
        assert!(matches!(out.reaction, Reaction::Closed | Reaction::Reset));
        return;
    };
    assert!(r.established, "{name}: {r:?}");
    assert!(r.errors.is_empty(), "{name}: {r:?}");
    assert!(r.modified.is_empty(), "{name}: bytes changed: {r:?}");
    assert_eq!(r.final_state, Some(QpState::Error), "{name}: {r:?}");
    assert_eq!(r.recvs_posted, target::RECVS);
    assert_eq!(
        r.recvs_ok + r.flushed,
        r.recvs_posted,
        "{name}: every outstanding receive is flushed: {r:?}"
    );
    assert!(r.flushed >= target::RECVS - 1, "{name}: {r:?}");
    assert_eq!(r.remote_terminate, None);
    match s.expect {
        Expect::Term(code) => {
            assert_eq!(r.local_terminate, Some(code), "{name}: {r:?}");
        }
        Expect::Closed | Expect::Accepted => {
            assert_eq!(r.local_terminate, None, "{name}: {r:?}");
            assert!(r.disconnected, "{name}: {r:?}");
        }
    }
    if s.needs().is_some() || s.expect == Expect::Accepted {
        assert!(
            r.advertised || s.expect == Expect::Accepted,
            "{name}: {r:?}"
        );
    }
}

/// The probe over IPv6: a broken MPA request and a DDP error that ends
/// in a Terminate.
#[test]
fn over_ipv6() {
    check_at("bad-mpa-key", "[::1]:0");
    check_at("unknown-stag", "[::1]:0");
}

macro_rules! scenarios {
    ($($f:ident = $name:literal,)*) => {
        $(#[test] fn $f() { check($name); })*

        #[test]
        fn every_scenario_has_a_test() {
            let tested = [$($name),*];
            for s in probe::SCENARIOS {
                assert!(tested.contains(&s.name), "no test for {}", s.name);
            }
        }
    };
}

scenarios! {
    bad_mpa_key = "bad-mpa-key",
    reserved_bits = "reserved-bits",
    pd_too_long = "pd-too-long",
    garbage_before_request = "garbage-before-request",
    truncated_frame = "truncated-frame",
    bad_ulpdu_length = "bad-ulpdu-length",
    bad_crc = "bad-crc",
    bad_marker = "bad-marker",
    unknown_stag = "unknown-stag",
    stag_other_pd = "stag-other-pd",
    invalidated_stag = "invalidated-stag",
    to_outside_region = "to-outside-region",
    write_read_only = "write-read-only",
    read_no_remote_read = "read-no-remote-read",
    msn_gap = "msn-gap",
    bad_queue_number = "bad-queue-number",
    read_over_ird = "read-over-ird",
    rtr_mismatch = "rtr-mismatch",
    atomic_unaligned = "atomic-unaligned",
    atomic_no_atomic_right = "atomic-no-atomic-right",
}
