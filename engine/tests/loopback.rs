//! Two devices in one process, connected over loopback TCP (kernel
//! backend) or over an in-process link (the AF_XDP engine without the
//! kernel).
//!
//! Every wait is bounded by a generous timeout; nothing asserts timing.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::readable;
use iwarp_engine::xdp::{link, XdpConfig};
use iwarp_engine::{
    Access, Backend, CmError, CmEvent, ConnParams, Cq, Device, DeviceConfig, HandleCounts,
    ListenOptions, Mr, Pd, Progress, Qp, QpInit, QpState, RecvWr, RtrSet, RtrType, SendOp, SendWr,
    Sge, WcOpcode, WcStatus, WorkCompletion, EMPTY_WC,
};

const WAIT: Duration = Duration::from_secs(30);
const SIZES: [usize; 7] = [1, 7, 1000, 16 * 1024 + 3, 65537, 1 << 20, 4 << 20];

fn any_addr() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Both devices have a progress thread.
    Thread,
    /// Both devices are manual: the client is driven only by its own
    /// blocking calls, the server by a driver thread (and its calls).
    Manual,
}

/// Drives a manual device until dropped.
struct Driver {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Driver {
    fn start(dev: &Device) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, d) = (stop.clone(), dev.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if d.progress() == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        });
        Self {
            stop,
            handle: Some(handle),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            h.join().unwrap();
        }
    }
}

struct Side {
    qp: Qp,
    pd: Pd,
    cq: Cq,
    dev: Device,
}

impl Side {
    fn mr(&self, len: usize) -> Mr {
        self.dev
            .reg_mr(
                &self.pd,
                len,
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
            .unwrap()
    }

    fn wait_one(&self) -> WorkCompletion {
        let mut wc = [EMPTY_WC; 1];
        assert_eq!(self.cq.wait(&mut wc, Some(WAIT)), 1, "no completion");
        wc[0]
    }
}

struct Conn {
    client: Side,
    server: Side,
    _driver: Option<Driver>,
}

fn open(manual: bool) -> Device {
    let progress = if manual {
        Progress::Manual
    } else {
        Progress::Thread { cpu: None }
    };
    Device::open(
        Backend::Kernel,
        DeviceConfig {
            progress,
            seed: Some(7),
            busy_poll: false,
        },
    )
    .unwrap()
}

fn init(dev: &Device) -> (Pd, Cq, QpInit) {
    init_sized(dev, 128)
}

fn init_sized(dev: &Device, depth: usize) -> (Pd, Cq, QpInit) {
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(1024);
    let init = QpInit::new(&pd, &cq, depth);
    (pd, cq, init)
}

/// Connect a client and a server device; `server_params` is what the
/// server accepts with.
fn connect(mode: Mode, client_params: ConnParams, server_params: ConnParams) -> Conn {
    connect_sized(mode, client_params, server_params, 128)
}

/// [`connect`] with the client's queues `client_depth` deep.
fn connect_sized(
    mode: Mode,
    client_params: ConnParams,
    server_params: ConnParams,
    client_depth: usize,
) -> Conn {
    connect_via(
        mode,
        (any_addr(), ListenOptions::default()),
        any_addr().ip(),
        (client_params, server_params),
        client_depth,
    )
}

/// [`connect_sized`] with the server listening on `listen` and the
/// client dialling `dial` on the listener's port.
fn connect_via(
    mode: Mode,
    listen: (SocketAddr, ListenOptions),
    dial: IpAddr,
    (client_params, server_params): (ConnParams, ConnParams),
    client_depth: usize,
) -> Conn {
    let manual = mode == Mode::Manual;
    let (cdev, sdev) = (open(manual), open(manual));
    let driver = manual.then(|| Driver::start(&sdev));
    let listener = sdev.listen_with(listen.0, listen.1).unwrap();
    let addr = SocketAddr::new(dial, listener.local_addr().port());
    let (spd, scq, sinit) = init(&sdev);
    let server = std::thread::spawn(move || {
        let req = listener.get_request(Some(WAIT)).unwrap();
        req.accept(sinit, server_params).unwrap()
    });
    let (cpd, ccq, cinit) = init_sized(&cdev, client_depth);
    let cqp = cdev.connect(addr, cinit, client_params).unwrap();
    let sqp = server.join().unwrap();
    Conn {
        client: Side {
            qp: cqp,
            pd: cpd,
            cq: ccq,
            dev: cdev,
        },
        server: Side {
            qp: sqp,
            pd: spd,
            cq: scq,
            dev: sdev,
        },
        _driver: driver,
    }
}

#[test]
fn connect_accept_private_data() {
    for mode in [Mode::Thread, Mode::Manual] {
        let manual = mode == Mode::Manual;
        let (cdev, sdev) = (open(manual), open(manual));
        let _driver = manual.then(|| Driver::start(&sdev));
        let listener = sdev.listen(any_addr()).unwrap();
        let addr = listener.local_addr();
        let (_spd, _scq, sinit) = init(&sdev);
        let server = std::thread::spawn(move || {
            let req = listener.get_request(Some(WAIT)).unwrap();
            assert_eq!(req.private_data(), b"hello from the client");
            assert_eq!(req.request().revision, 2);
            assert!(req.request().ird_ord.is_some());
            let peer = req.peer_addr();
            let params = ConnParams {
                private_data: b"hello from the server".to_vec(),
                ird: 8,
                ord: 4,
                ..ConnParams::default()
            };
            let qp = req.accept(sinit, params).unwrap();
            assert_eq!(qp.state(), QpState::Rts);
            assert_eq!(qp.peer_addr(), peer);
            (qp, peer)
        });
        let (_cpd, _ccq, cinit) = init(&cdev);
        let params = ConnParams {
            private_data: b"hello from the client".to_vec(),
            ..ConnParams::default()
        };
        let cqp = cdev.connect(addr, cinit, params).unwrap();
        let (sqp, peer) = server.join().unwrap();
        assert_eq!(cqp.state(), QpState::Rts, "{mode:?}");
        assert_eq!(cqp.peer_private_data(), b"hello from the server");
        assert_eq!(sqp.peer_private_data(), b"hello from the client");
        assert_eq!(cqp.peer_addr(), addr);
        assert_eq!(cqp.local_addr(), peer);
        assert_eq!(sqp.local_addr(), addr);
        // IRD/ORD: the server clamps to the request (16/16) and advertises
        // 8/4; the client's ORD is capped by the server's IRD.
        let (cn, sn) = (cqp.negotiated(), sqp.negotiated());
        assert_eq!((sn.ird, sn.ord), (8, 4));
        assert_eq!((cn.ird, cn.ord), (16, 8));
        assert!(!cn.crc && !sn.crc);
        assert_eq!(cqp.poll_event(), None);
    }
}

/// Send/Recv, RDMA Write (then a Send, so the data is placed when the
/// receive completes) and RDMA Read of every size, data verified.
fn transfers(c: &Conn) {
    let max = *SIZES.iter().max().unwrap();
    let (cli, srv) = (&c.client, &c.server);
    let cmr = cli.mr(max);
    let smr = srv.mr(max);
    for (round, &len) in SIZES.iter().enumerate() {
        let seed = round as u8;
        // Send/Recv.
        let data = pattern(len, seed);
        cmr.write(0, &data);
        srv.qp
            .post_recv(&RecvWr {
                wr_id: 100 + round as u64,
                sgl: &[smr.sge(0, max)],
            })
            .unwrap();
        cli.qp
            .post_send(&SendWr {
                wr_id: 200 + round as u64,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sgl: &[cmr.sge(0, len)],
                signaled: true,
            })
            .unwrap();
        let wc = cli.wait_one();
        assert_eq!(
            (wc.wr_id, wc.status),
            (200 + round as u64, WcStatus::Success)
        );
        let wc = srv.wait_one();
        assert_eq!(wc.status, WcStatus::Success, "recv {len}");
        assert_eq!((wc.opcode, wc.byte_len as usize), (WcOpcode::Recv, len));
        let mut got = vec![0; len];
        smr.read(0, &mut got);
        assert!(got == data, "send/recv of {len} bytes");

        // RDMA Write, then a Send that completes after placement.
        let data = pattern(len, seed.wrapping_add(100));
        cmr.write(0, &data);
        srv.qp
            .post_recv(&RecvWr {
                wr_id: 300,
                sgl: &[],
            })
            .unwrap();
        cli.qp
            .post_send(&SendWr {
                wr_id: 400,
                op: SendOp::Write {
                    remote_addr: smr.addr(),
                    rkey: smr.rkey(),
                },
                sgl: &[cmr.sge(0, len)],
                signaled: true,
            })
            .unwrap();
        cli.qp
            .post_send(&SendWr {
                wr_id: 401,
                op: SendOp::Send {
                    solicited: true,
                    invalidate: None,
                },
                sgl: &[],
                signaled: false,
            })
            .unwrap();
        let wc = cli.wait_one();
        assert_eq!((wc.wr_id, wc.status), (400, WcStatus::Success));
        let wc = srv.wait_one();
        assert_eq!((wc.wr_id, wc.status), (300, WcStatus::Success));
        let mut got = vec![0; len];
        smr.read(0, &mut got);
        assert!(got == data, "write of {len} bytes");
        assert_eq!(smr.read_byte(len - 1), data[len - 1]);
        assert!(smr.wait_byte(len - 1, data[len - 1], Some(WAIT)));

        // RDMA Read of the server's buffer into the client's.
        let data = pattern(len, seed.wrapping_add(200));
        smr.write(0, &data);
        cmr.write(0, &vec![0; len]);
        cli.qp
            .post_send(&SendWr {
                wr_id: 500,
                op: SendOp::Read {
                    remote_addr: smr.addr(),
                    rkey: smr.rkey(),
                },
                sgl: &[cmr.sge(0, len)],
                signaled: true,
            })
            .unwrap();
        let wc = cli.wait_one();
        assert_eq!((wc.wr_id, wc.status), (500, WcStatus::Success));
        assert_eq!(wc.opcode, WcOpcode::RdmaRead);
        let mut got = vec![0; len];
        cmr.read(0, &mut got);
        assert!(got == data, "read of {len} bytes");
    }
}

/// RFC 7306 through the device API: FetchAdd and CompareSwap on the
/// server's memory, and Immediate Data into a posted receive.
fn atomics_and_immediate_data(c: &Conn) {
    let (cli, srv) = (&c.client, &c.server);
    let word = srv
        .dev
        .reg_mr(&srv.pd, 16, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC)
        .unwrap();
    assert_eq!(word.addr() % 8, 0);
    word.write(0, &40u64.to_ne_bytes());
    let sink = cli.dev.reg_mr(&cli.pd, 8, Access::LOCAL_WRITE).unwrap();
    let value = |mr: &Mr| {
        let mut b = [0u8; 8];
        mr.read(0, &mut b);
        u64::from_ne_bytes(b)
    };
    let ops = [
        (
            SendOp::FetchAdd {
                remote_addr: word.addr(),
                rkey: word.rkey(),
                add: 2,
                add_mask: 0,
            },
            WcOpcode::AtomicFetchAdd,
            40,
            42,
        ),
        (
            SendOp::CompareSwap {
                remote_addr: word.addr(),
                rkey: word.rkey(),
                compare: 42,
                compare_mask: u64::MAX,
                swap: 7,
                swap_mask: u64::MAX,
            },
            WcOpcode::AtomicCompareSwap,
            42,
            7,
        ),
    ];
    for (i, (op, opcode, orig, after)) in ops.into_iter().enumerate() {
        cli.qp
            .post_send(&SendWr {
                wr_id: 600 + i as u64,
                op,
                sgl: &[sink.sge(0, 8)],
                signaled: true,
            })
            .unwrap();
        let wc = cli.wait_one();
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
            (600 + i as u64, WcStatus::Success, opcode, 8)
        );
        assert_eq!((value(&sink), value(&word)), (orig, after));
    }
    srv.qp
        .post_recv(&RecvWr {
            wr_id: 700,
            sgl: &[],
        })
        .unwrap();
    cli.qp
        .post_send(&SendWr {
            wr_id: 701,
            op: SendOp::ImmediateData {
                data: 0xfeed_f00d_0000_0001,
                solicited: false,
            },
            sgl: &[],
            signaled: true,
        })
        .unwrap();
    let wc = cli.wait_one();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (701, WcStatus::Success, WcOpcode::ImmediateData)
    );
    let wc = srv.wait_one();
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm_data),
        (
            700,
            WcStatus::Success,
            WcOpcode::Recv,
            0,
            Some(0xfeed_f00d_0000_0001)
        )
    );
}

#[test]
fn atomics_and_immediate_data_thread_mode() {
    atomics_and_immediate_data(&connect(
        Mode::Thread,
        ConnParams::default(),
        ConnParams::default(),
    ));
}

#[test]
fn atomics_and_immediate_data_manual_mode() {
    atomics_and_immediate_data(&connect(
        Mode::Manual,
        ConnParams::default(),
        ConnParams::default(),
    ));
}

/// How the engines of a link test make progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LinkMode {
    /// Progress threads that spin (the engine's default).
    Spin,
    /// Progress threads that sleep when idle: the other end wakes them.
    Sleep,
    /// Manual progress (as [`Mode::Manual`]).
    Manual,
}

/// Connect a client and a server over an in-process link at `mtu`,
/// CRC on.
fn connect_link(mode: LinkMode, mtu: usize) -> Conn {
    let end = |last: u8| {
        let mut c = XdpConfig::new("link", Ipv4Addr::new(198, 18, 0, last), 24);
        c.mtu = mtu;
        c.busy_poll = mode == LinkMode::Spin;
        c
    };
    let (a, b) = link(end(1), end(2)).unwrap();
    let progress = if mode == LinkMode::Manual {
        Progress::Manual
    } else {
        Progress::Thread { cpu: None }
    };
    let cfg = DeviceConfig {
        progress,
        seed: Some(7),
        busy_poll: false,
    };
    let cdev = Device::open(Backend::Link(a), cfg).unwrap();
    let sdev = Device::open(Backend::Link(b.clone()), cfg).unwrap();
    assert!(
        Device::open(Backend::Link(b), DeviceConfig::default()).is_err(),
        "an end serves one device"
    );
    let driver = (mode == LinkMode::Manual).then(|| Driver::start(&sdev));
    let listener = sdev.listen("198.18.0.2:7174".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let (spd, scq, sinit) = init(&sdev);
    let crc = ConnParams {
        crc: true,
        ..ConnParams::default()
    };
    let accepted = crc.clone();
    let server = std::thread::spawn(move || {
        let req = listener.get_request(Some(WAIT)).unwrap();
        req.accept(sinit, accepted).unwrap()
    });
    let (cpd, ccq, cinit) = init(&cdev);
    let cqp = cdev.connect(addr, cinit, crc).unwrap();
    let sqp = server.join().unwrap();
    Conn {
        client: Side {
            qp: cqp,
            pd: cpd,
            cq: ccq,
            dev: cdev,
        },
        server: Side {
            qp: sqp,
            pd: spd,
            cq: scq,
            dev: sdev,
        },
        _driver: driver,
    }
}

/// Every operation byte-verified over an in-process link at `mtu`, and
/// the frames that crossed it: lent (no copy), the TCP checksums left to
/// the receiver, none lost.
fn link_transfers(mode: LinkMode, mtu: usize) {
    let c = connect_link(mode, mtu);
    transfers(&c);
    atomics_and_immediate_data(&c);
    for dev in [&c.client.dev, &c.server.dev] {
        let x = dev.stats().xdp.expect("the link runs the AF_XDP engine");
        let r = x.rings;
        assert!(x.tx_csum_offload && !x.zero_copy, "{x:?}");
        assert!(r.rx_frames > 100 && r.tx_frames > 100, "{r:?}");
        assert!(
            r.rx_csum_completed > 100,
            "checksums finished by the receiver: {r:?}"
        );
        assert_eq!(
            (r.rx_csum_bad, r.tx_unreached, r.rx_bad_frames),
            (0, 0, 0),
            "{r:?}"
        );
    }
}

/// The AF_XDP engine serves IPv4: an IPv6 listen or connect fails with
/// `AddressFamily`, and `[::]` without `v6_only` is its IPv4 wildcard.
#[test]
fn afxdp_engine_refuses_ipv6_by_family() {
    let end = |last: u8| XdpConfig::new("link", Ipv4Addr::new(198, 18, 0, last), 24);
    let (a, _b) = link(end(1), end(2)).unwrap();
    let dev = Device::open(Backend::Link(a), DeviceConfig::default()).unwrap();
    let wild = SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0));
    let only = ListenOptions { v6_only: true };
    assert_eq!(
        dev.listen("[2001:2::1]:7174".parse().unwrap()).unwrap_err(),
        CmError::AddressFamily
    );
    assert_eq!(
        dev.listen_with(wild, only).unwrap_err(),
        CmError::AddressFamily
    );
    let l = dev.listen(wild).unwrap();
    assert!(l.local_addr().is_ipv4() && l.local_addr().port() != 0);
    let (_pd, _cq, init) = init(&dev);
    let to = "[2001:2::2]:7174".parse().unwrap();
    assert_eq!(
        dev.connect(to, init, ConnParams::default()).unwrap_err(),
        CmError::AddressFamily
    );
}

#[test]
fn link_transfers_mtu_1500() {
    link_transfers(LinkMode::Spin, 1500);
}

#[test]
fn link_transfers_mtu_9000() {
    link_transfers(LinkMode::Spin, 9000);
}

#[test]
fn link_transfers_largest_mtu() {
    link_transfers(LinkMode::Sleep, 65535);
}

#[test]
fn link_transfers_sleeping_threads() {
    link_transfers(LinkMode::Sleep, 1500);
}

#[test]
fn link_transfers_manual_mode() {
    link_transfers(LinkMode::Manual, 9000);
}

#[test]
fn transfers_thread_mode() {
    let c = connect(Mode::Thread, ConnParams::default(), ConnParams::default());
    transfers(&c);
}

#[test]
fn transfers_manual_mode() {
    let c = connect(Mode::Manual, ConnParams::default(), ConnParams::default());
    transfers(&c);
}

#[test]
fn transfers_busy_poll() {
    let cdev = Device::open(
        Backend::Kernel,
        DeviceConfig {
            progress: Progress::Thread { cpu: Some(0) },
            seed: None,
            busy_poll: true,
        },
    )
    .unwrap();
    let sdev = open(false);
    let listener = sdev.listen(any_addr()).unwrap();
    let addr = listener.local_addr();
    let (spd, scq, sinit) = init(&sdev);
    let server = std::thread::spawn(move || {
        let req = listener.get_request(Some(WAIT)).unwrap();
        req.accept(sinit, ConnParams::default()).unwrap()
    });
    let (cpd, ccq, cinit) = init(&cdev);
    let cqp = cdev.connect(addr, cinit, ConnParams::default()).unwrap();
    let sqp = server.join().unwrap();
    let c = Conn {
        client: Side {
            qp: cqp,
            pd: cpd,
            cq: ccq,
            dev: cdev,
        },
        server: Side {
            qp: sqp,
            pd: spd,
            cq: scq,
            dev: sdev,
        },
        _driver: None,
    };
    transfers(&c);
}

#[test]
fn crc_if_either_side_asks_and_markers() {
    let cases = [
        // (client crc, server crc, client markers, server markers)
        (true, false, false, false),
        (false, true, false, false),
        (false, false, true, false),
        (true, true, true, true),
    ];
    for (i, &(ccrc, scrc, cmark, smark)) in cases.iter().enumerate() {
        let mode = if i % 2 == 0 {
            Mode::Thread
        } else {
            Mode::Manual
        };
        let c = connect(
            mode,
            ConnParams {
                crc: ccrc,
                markers: cmark,
                ..ConnParams::default()
            },
            ConnParams {
                crc: scrc,
                markers: smark,
                ..ConnParams::default()
            },
        );
        let (cn, sn) = (c.client.qp.negotiated(), c.server.qp.negotiated());
        assert_eq!(cn.crc, ccrc || scrc);
        assert_eq!(sn.crc, ccrc || scrc);
        assert_eq!((cn.markers_rx, cn.markers_tx), (cmark, smark));
        assert_eq!((sn.markers_rx, sn.markers_tx), (smark, cmark));
        transfers(&c);
    }
}

/// Over IPv6 loopback: every operation of every size, with CRC and
/// markers in both directions and without, the QPs' addresses IPv6.
#[test]
fn ipv6_transfers_and_mpa_modes() {
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, 0));
    for (mode, crc, markers) in [(Mode::Thread, false, false), (Mode::Manual, true, true)] {
        let params = ConnParams {
            crc,
            markers,
            private_data: b"over IPv6".to_vec(),
            ..ConnParams::default()
        };
        let c = connect_via(
            mode,
            (v6, ListenOptions::default()),
            v6.ip(),
            (params.clone(), params),
            128,
        );
        for qp in [&c.client.qp, &c.server.qp] {
            assert_eq!(qp.local_addr().ip(), v6.ip());
            assert_eq!(qp.peer_addr().ip(), v6.ip());
            assert_eq!(qp.peer_private_data(), b"over IPv6");
            let n = qp.negotiated();
            assert_eq!((n.crc, n.markers_rx, n.markers_tx), (crc, markers, markers));
        }
        assert_eq!(c.client.qp.local_addr(), c.server.qp.peer_addr());
        transfers(&c);
    }
}

/// A listener on `[::]` takes IPv4 and IPv6 connections and reports an
/// IPv4 peer as IPv4; with `v6_only` it refuses IPv4.
#[test]
fn dual_stack_and_v6_only_listeners() {
    let wild = SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0));
    let v4 = IpAddr::from(Ipv4Addr::LOCALHOST);
    let v6 = IpAddr::from(Ipv6Addr::LOCALHOST);
    for dial in [v4, v6] {
        let c = connect_via(
            Mode::Thread,
            (wild, ListenOptions::default()),
            dial,
            (ConnParams::default(), ConnParams::default()),
            16,
        );
        for qp in [&c.client.qp, &c.server.qp] {
            assert_eq!(qp.local_addr().ip(), dial);
            assert_eq!(qp.peer_addr().ip(), dial);
        }
        assert_eq!(c.client.qp.local_addr(), c.server.qp.peer_addr());
        assert_eq!(c.server.qp.local_addr(), c.client.qp.peer_addr());
        send_one(&c.client, &c.server, 300, 9);
    }
    let only = ListenOptions { v6_only: true };
    let c = connect_via(
        Mode::Thread,
        (wild, only),
        v6,
        (ConnParams::default(), ConnParams::default()),
        16,
    );
    send_one(&c.client, &c.server, 300, 9);
    let sdev = open(false);
    let listener = sdev.listen_with(wild, only).unwrap();
    let cdev = open(false);
    let (_pd, _cq, cinit) = init(&cdev);
    let to_v4 = SocketAddr::new(v4, listener.local_addr().port());
    let err = cdev
        .connect(to_v4, cinit, ConnParams::default())
        .unwrap_err();
    assert_eq!(err, CmError::ConnectionRefused);
}

/// One Send of `len` bytes (a pattern from `seed`) from `client` to
/// `server`, both completions successful and the bytes checked.
fn send_one(client: &Side, server: &Side, len: usize, seed: u8) {
    let msg = pattern(len, seed);
    let (cmr, smr) = (client.mr(len), server.mr(len));
    cmr.write(0, &msg);
    server
        .qp
        .post_recv(&RecvWr {
            wr_id: 1,
            sgl: &[smr.sge(0, len)],
        })
        .unwrap();
    client
        .qp
        .post_send(&SendWr {
            wr_id: 2,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: &[cmr.sge(0, len)],
            signaled: true,
        })
        .unwrap();
    let wc = server.wait_one();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len as usize),
        (1, WcStatus::Success, len)
    );
    assert_eq!(client.wait_one().status, WcStatus::Success);
    let mut got = vec![0; len];
    smr.read(0, &mut got);
    assert_eq!(got, msg);
}

/// A reject carries its private data, over IPv4 and IPv6.
#[test]
fn reject_with_private_data() {
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, 0));
    for (mode, on) in [
        (Mode::Thread, any_addr()),
        (Mode::Manual, any_addr()),
        (Mode::Thread, v6),
    ] {
        let manual = mode == Mode::Manual;
        let (cdev, sdev) = (open(manual), open(manual));
        let _driver = manual.then(|| Driver::start(&sdev));
        let listener = sdev.listen(on).unwrap();
        let addr = listener.local_addr();
        assert_eq!(addr.ip(), on.ip());
        let server = std::thread::spawn(move || {
            let req = listener.get_request(Some(WAIT)).unwrap();
            assert_eq!(req.peer_addr().ip(), addr.ip());
            req.reject(b"go away").unwrap();
            listener
        });
        let (_pd, _cq, cinit) = init(&cdev);
        let err = cdev
            .connect(addr, cinit, ConnParams::default())
            .unwrap_err();
        assert_eq!(
            err,
            CmError::Rejected {
                private_data: b"go away".to_vec()
            }
        );
        drop(server.join().unwrap());
    }
}

/// The reject reply leaves even when the device is dropped right after
/// `reject` returns (the reply is still queued then).
#[test]
fn reject_then_device_dropped() {
    for _ in 0..20 {
        let (cdev, sdev) = (open(false), open(false));
        let listener = sdev.listen(any_addr()).unwrap();
        let addr = listener.local_addr();
        let server = std::thread::spawn(move || {
            let req = listener.get_request(Some(WAIT)).unwrap();
            req.reject(b"bye").unwrap();
            drop(listener);
            drop(sdev);
        });
        let (_pd, _cq, cinit) = init(&cdev);
        let err = cdev
            .connect(addr, cinit, ConnParams::default())
            .unwrap_err();
        assert_eq!(
            err,
            CmError::Rejected {
                private_data: b"bye".to_vec()
            }
        );
        server.join().unwrap();
    }
}

#[test]
fn connection_refused() {
    // A port nobody listens on: bind, note it, close.
    let port = std::net::TcpListener::bind(any_addr())
        .unwrap()
        .local_addr()
        .unwrap();
    for manual in [false, true] {
        let dev = open(manual);
        let (_pd, _cq, init) = init(&dev);
        let err = dev.connect(port, init, ConnParams::default()).unwrap_err();
        assert_eq!(err, CmError::ConnectionRefused);
    }
}

#[test]
fn mpa_timeout() {
    // Accepts the TCP connection and never answers the MPA request.
    let raw = std::net::TcpListener::bind(any_addr()).unwrap();
    let addr = raw.local_addr().unwrap();
    let holder = std::thread::spawn(move || {
        let mut socks = Vec::new();
        for _ in 0..2 {
            socks.push(raw.accept().unwrap().0);
        }
        socks
    });
    for manual in [false, true] {
        let dev = open(manual);
        let (_pd, _cq, init) = init(&dev);
        let params = ConnParams {
            timeout: Duration::from_millis(500),
            ..ConnParams::default()
        };
        let start = Instant::now();
        let err = dev.connect(addr, init, params).unwrap_err();
        assert_eq!(err, CmError::MpaTimeout);
        // A generous bound: the wait ends (no timing assert beyond that).
        assert!(start.elapsed() < WAIT);
    }
    drop(holder.join().unwrap());
}

/// The peer goes away while large Writes are outstanding: every WR
/// completes (flushed if not done), the QP reaches Error, and an event is
/// delivered.
fn peer_vanishes(drop_device: bool) {
    let (cdev, sdev) = (open(false), open(true));
    let listener = sdev.listen(any_addr()).unwrap();
    let addr = listener.local_addr();
    let (spd, _scq, sinit) = init(&sdev);
    let connected = Arc::new(AtomicBool::new(false));
    let flag = connected.clone();
    let sdev2 = sdev.clone();
    let server = std::thread::spawn(move || {
        let req = listener.get_request(Some(WAIT)).unwrap();
        let qp = req.accept(sinit, ConnParams::default()).unwrap();
        // Send the reply, then stop driving the device: the server reads
        // nothing more, so the client's Writes back up.
        while !flag.load(Ordering::SeqCst) {
            sdev2.progress();
            std::thread::sleep(Duration::from_millis(1));
        }
        qp
    });
    let (cpd, ccq, cinit) = init(&cdev);
    let cqp = cdev.connect(addr, cinit, ConnParams::default()).unwrap();
    connected.store(true, Ordering::SeqCst);
    let sqp = server.join().unwrap();
    let len = 4 << 20;
    let smr = sdev.reg_mr(&spd, len, Access::REMOTE_WRITE).unwrap();
    let cmr = cdev.reg_mr(&cpd, len, Access::LOCAL_WRITE).unwrap();
    let n = 32u64;
    for i in 0..n {
        cqp.post_send(&SendWr {
            wr_id: i,
            op: SendOp::Write {
                remote_addr: smr.addr(),
                rkey: smr.rkey(),
            },
            sgl: &[cmr.sge(0, len)],
            signaled: true,
        })
        .unwrap();
    }
    if drop_device {
        drop(sdev);
        drop(smr);
        drop(sqp);
    } else {
        drop(sqp);
        // Let the graceful close reach the socket.
        for _ in 0..100 {
            sdev.progress();
        }
    }
    let mut wcs = vec![EMPTY_WC; 64];
    let mut seen = Vec::new();
    while (seen.len() as u64) < n {
        let k = ccq.wait(&mut wcs, Some(WAIT));
        assert!(k > 0, "only {} of {n} completions", seen.len());
        seen.extend_from_slice(&wcs[..k]);
    }
    let mut flushed = 0;
    for (i, wc) in seen.iter().enumerate() {
        assert_eq!(wc.wr_id, i as u64, "completions in posting order");
        assert_eq!(wc.opcode, WcOpcode::RdmaWrite);
        match wc.status {
            WcStatus::Success => assert_eq!(flushed, 0, "success after a flush"),
            WcStatus::WrFlushError => flushed += 1,
            s => panic!("unexpected status {s:?}"),
        }
    }
    assert!(
        flushed > 0,
        "the server read nothing: some Writes were outstanding"
    );
    assert_eq!(cqp.state(), QpState::Error);
    let ev = cqp.wait_event(WAIT).expect("an event");
    assert!(
        matches!(ev, CmEvent::Disconnected | CmEvent::Error(_)),
        "{ev:?}"
    );
    // Posting now completes at once with a flush.
    cqp.post_send(&SendWr {
        wr_id: 99,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl: &[],
        signaled: true,
    })
    .unwrap();
    let mut wc = [EMPTY_WC; 1];
    assert_eq!(ccq.wait(&mut wc, Some(WAIT)), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (99, WcStatus::WrFlushError));
}

#[test]
fn peer_device_dropped_mid_transfer() {
    peer_vanishes(true);
}

#[test]
fn peer_qp_dropped_mid_transfer() {
    peer_vanishes(false);
}

#[test]
fn cq_wait_blocks_and_wakes() {
    for mode in [Mode::Thread, Mode::Manual] {
        let c = connect(mode, ConnParams::default(), ConnParams::default());
        let smr = c.server.mr(64);
        // Nothing arrives: a bounded wait returns 0.
        let mut wc = [EMPTY_WC; 4];
        assert_eq!(
            c.server.cq.wait(&mut wc, Some(Duration::from_millis(50))),
            0
        );
        c.server
            .qp
            .post_recv(&RecvWr {
                wr_id: 7,
                sgl: &[smr.sge(0, 64)],
            })
            .unwrap();
        let Conn { client, server, .. } = c;
        let waiter = std::thread::spawn(move || {
            let mut wc = [EMPTY_WC; 4];
            let n = server.cq.wait(&mut wc, None);
            (n, wc[0], server, smr)
        });
        // The completion arrives from another thread while `waiter` sleeps.
        std::thread::sleep(Duration::from_millis(100));
        let cmr = client.mr(64);
        cmr.write(0, b"wake up");
        client
            .qp
            .post_send(&SendWr {
                wr_id: 1,
                op: SendOp::Send {
                    solicited: true,
                    invalidate: None,
                },
                sgl: &[cmr.sge(0, 7)],
                signaled: true,
            })
            .unwrap();
        assert_eq!(client.wait_one().status, WcStatus::Success);
        let (n, wc, _server, smr) = waiter.join().unwrap();
        assert_eq!(n, 1, "{mode:?}");
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (7, WcStatus::Success, 7)
        );
        let mut got = [0; 7];
        smr.read(0, &mut got);
        assert_eq!(&got, b"wake up");
    }
}

#[test]
fn p2p_rtr_mismatch() {
    for mode in [Mode::Thread, Mode::Manual] {
        let manual = mode == Mode::Manual;
        let (cdev, sdev) = (open(manual), open(manual));
        let _driver = manual.then(|| Driver::start(&sdev));
        let listener = sdev.listen(any_addr()).unwrap();
        let addr = listener.local_addr();
        let (_spd, _scq, sinit) = init(&sdev);
        let server = std::thread::spawn(move || {
            let req = listener.get_request(Some(WAIT)).unwrap();
            let params = ConnParams {
                rtr: RtrSet::only(RtrType::Write),
                ..ConnParams::default()
            };
            req.accept(sinit, params).unwrap_err()
        });
        let (_pd, _cq, cinit) = init(&cdev);
        let params = ConnParams {
            p2p: true,
            rtr: RtrSet::only(RtrType::Read),
            ..ConnParams::default()
        };
        let err = cdev.connect(addr, cinit, params).unwrap_err();
        // The responder replies with R=1 (RFC 6581): on the wire the
        // initiator sees a rejection without private data.
        assert_eq!(
            err,
            CmError::Rejected {
                private_data: Vec::new()
            },
            "{mode:?}"
        );
        assert_eq!(
            server.join().unwrap(),
            CmError::Mpa(iwarp_engine::HandshakeError::NoMatchingRtr)
        );
    }
}

#[test]
fn p2p_connects_with_a_common_rtr() {
    let c = connect(
        Mode::Thread,
        ConnParams {
            p2p: true,
            rtr: RtrSet::only(RtrType::Read),
            ..ConnParams::default()
        },
        ConnParams::default(),
    );
    assert_eq!(c.client.qp.negotiated().rtr, Some(RtrType::Read));
    assert_eq!(c.server.qp.negotiated().rtr, Some(RtrType::Read));
    transfers(&c);
}

#[test]
fn graceful_disconnect_reaches_the_peer() {
    let c = connect(Mode::Thread, ConnParams::default(), ConnParams::default());
    let smr = c.server.mr(16);
    c.server
        .qp
        .post_recv(&RecvWr {
            wr_id: 5,
            sgl: &[smr.sge(0, 16)],
        })
        .unwrap();
    c.client.qp.disconnect();
    assert_eq!(c.client.qp.wait_event(WAIT), Some(CmEvent::Disconnected));
    assert_eq!(c.server.qp.wait_event(WAIT), Some(CmEvent::Disconnected));
    let wc = c.server.wait_one();
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::WrFlushError));
    assert_eq!(c.server.qp.state(), QpState::Error);
}

#[test]
fn post_errors_are_synchronous() {
    let c = connect(Mode::Thread, ConnParams::default(), ConnParams::default());
    let mr = c.client.mr(16);
    let sges = [mr.sge(0, 1); 5];
    let err = c
        .client
        .qp
        .post_send(&SendWr {
            wr_id: 1,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: &sges,
            signaled: true,
        })
        .unwrap_err();
    assert_eq!(err, iwarp_engine::PostError::InvalidSgl);
}

/// Send `send_len` bytes from offset 32 of `mr` (wr_id `ids.1`), look at
/// the CQ only after a while, and find the send and the receive posted
/// before the connection (wr_id `ids.0`, into offset 0) both complete,
/// the receive holding `expect`.
fn send_then_look_late(qp: &Qp, cq: &Cq, mr: &Mr, ids: (u64, u64), send_len: usize, expect: &[u8]) {
    // Late wake-up of the receiving thread.
    const LATE: Duration = Duration::from_millis(300);
    qp.post_send(&SendWr {
        wr_id: ids.1,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl: &[mr.sge(32, send_len)],
        signaled: true,
    })
    .unwrap();
    std::thread::sleep(LATE);
    let mut wcs = [EMPTY_WC; 2];
    let mut got = Vec::new();
    while got.len() < 2 {
        let n = cq.wait(&mut wcs, Some(WAIT));
        assert!(n > 0, "no completion");
        got.extend_from_slice(&wcs[..n]);
    }
    got.sort_by_key(|w| w.wr_id);
    assert_eq!(
        got.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(ids.0, WcStatus::Success), (ids.1, WcStatus::Success)]
    );
    assert_eq!(got[0].byte_len as usize, expect.len());
    let mut b = vec![0; expect.len()];
    mr.read(0, &mut b);
    assert_eq!(b, expect);
}

/// Receives handed to `accept_with_recvs` / `connect_with_recvs` are posted
/// before the peer can send: a Send issued the moment the connection is
/// up finds its buffer even though the receiving thread looks only much
/// later (as a descheduled application would). Posted after `accept`
/// returns, the same receive would come too late and the QP would
/// terminate (DDP: no buffer).
#[test]
fn receives_posted_before_the_connection_catch_the_first_send() {
    let (cdev, sdev) = (open(false), open(false));
    let listener = sdev.listen(any_addr()).unwrap();
    let addr = listener.local_addr();
    let (spd, scq, sinit) = init(&sdev);
    let smr = sdev.reg_mr(&spd, 64, Access::LOCAL_WRITE).unwrap();
    smr.write(32, b"from the responder");
    let server = std::thread::spawn(move || {
        // A receive the QP cannot take fails the accept synchronously.
        let req = listener.get_request(Some(WAIT)).unwrap();
        let bad = [smr.sge(0, 1); 5];
        let err = req
            .accept_with_recvs(
                sinit.clone(),
                ConnParams::default(),
                &[RecvWr {
                    wr_id: 9,
                    sgl: &bad,
                }],
            )
            .unwrap_err();
        assert_eq!(
            err,
            CmError::Verbs(iwarp::verbs::VerbsError::Post(
                iwarp_engine::PostError::InvalidSgl
            ))
        );
        // The client's retry: accepted with a receive already posted.
        let req = listener.get_request(Some(WAIT)).unwrap();
        let qp = req
            .accept_with_recvs(
                sinit,
                ConnParams::default(),
                &[RecvWr {
                    wr_id: 1,
                    sgl: &[smr.sge(0, 32)],
                }],
            )
            .unwrap();
        // The responder sends first as soon as the initiator's RTR is in
        // (RFC 6581 peer-to-peer mode).
        send_then_look_late(&qp, &scq, &smr, (1, 2), 18, b"from the first");
        qp
    });
    let (cpd, ccq, cinit) = init(&cdev);
    let cmr = cdev.reg_mr(&cpd, 64, Access::LOCAL_WRITE).unwrap();
    cmr.write(32, b"from the first");
    let p2p = ConnParams {
        p2p: true,
        ..ConnParams::default()
    };
    // The first request is refused by the failed accept.
    let first = cdev.connect(addr, cinit.clone(), p2p.clone());
    assert!(first.is_err(), "{first:?}");
    let qp = cdev
        .connect_with_recvs(
            addr,
            cinit,
            p2p,
            &[RecvWr {
                wr_id: 3,
                sgl: &[cmr.sge(0, 32)],
            }],
        )
        .unwrap();
    send_then_look_late(&qp, &ccq, &cmr, (3, 4), 14, b"from the responder");
    let sqp = server.join().unwrap();
    assert_eq!((qp.state(), sqp.state()), (QpState::Rts, QpState::Rts));
}

fn write_wr(wr_id: u64, sgl: &[Sge], remote_addr: u64, rkey: u32) -> SendWr<'_> {
    SendWr {
        wr_id,
        op: SendOp::Write { remote_addr, rkey },
        sgl,
        signaled: true,
    }
}

/// `QueueFull` is exact although work requests reach the engine through
/// a queue: with nobody driving the client, the fifth post on a 4-deep
/// send queue fails; once the engine has retired one, a post succeeds.
#[test]
fn queue_full_is_exact_and_frees_as_work_retires() {
    let c = connect_sized(
        Mode::Manual,
        ConnParams::default(),
        ConnParams::default(),
        4,
    );
    let (cli, srv) = (&c.client, &c.server);
    let src = cli.mr(64);
    src.write(0, &pattern(64, 3));
    let dst = srv.mr(64);
    let sgls: Vec<[Sge; 1]> = (0..5).map(|i| [src.sge(8 * i, 8)]).collect();
    let wr = |i: u64| write_wr(i, &sgls[i as usize], dst.addr() + 8 * i, dst.rkey());
    for i in 0..4 {
        cli.qp.post_send(&wr(i)).unwrap();
    }
    assert_eq!(
        cli.qp.post_send(&wr(4)),
        Err(iwarp_engine::PostError::QueueFull)
    );
    // The client's engine runs only in this wait.
    let first = cli.wait_one();
    assert_eq!((first.wr_id, first.status), (0, WcStatus::Success));
    cli.qp.post_send(&wr(4)).unwrap();
    let mut ids = vec![first.wr_id];
    while ids.len() < 5 {
        ids.push(cli.wait_one().wr_id);
    }
    assert_eq!(ids, [0, 1, 2, 3, 4]);
    // A Read behind the Writes returns what they placed.
    let back = cli.mr(40);
    cli.qp
        .post_send(&SendWr {
            wr_id: 9,
            op: SendOp::Read {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
            },
            sgl: &[back.sge(0, 40)],
            signaled: true,
        })
        .unwrap();
    assert_eq!(cli.wait_one().status, WcStatus::Success);
    let mut got = [0; 40];
    back.read(0, &mut got);
    assert_eq!(&got[..], &pattern(64, 3)[..40]);
}

/// Application threads post to one QP at once while its progress thread
/// runs, each retrying on `QueueFull`: every work request completes
/// exactly once, in order per thread, and the last writes are in place.
#[test]
fn concurrent_posters_on_one_qp() {
    concurrent_posters(Mode::Thread);
}

/// [`concurrent_posters_on_one_qp`] with manual progress, driven by the
/// thread that waits for the completions: a post that finds the device
/// lock free hands its request to the core at once, one that finds it
/// taken queues it, and the two kinds keep each thread's order.
#[test]
fn concurrent_posters_on_one_qp_manual_progress() {
    concurrent_posters(Mode::Manual);
}

fn concurrent_posters(mode: Mode) {
    const THREADS: u64 = 4;
    const PER: u64 = 500;
    let c = connect_sized(mode, ConnParams::default(), ConnParams::default(), 8);
    let (cli, srv) = (&c.client, &c.server);
    let src = cli.mr((THREADS * PER * 8) as usize);
    for t in 0..THREADS {
        for k in 0..PER {
            let off = ((t * PER + k) * 8) as usize;
            src.write(off, &(t << 32 | k).to_le_bytes());
        }
    }
    let dst = srv.mr((THREADS * 8) as usize);
    let full = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (qp, src, dst, full) = (&cli.qp, &src, &dst, &full);
            s.spawn(move || {
                for k in 0..PER {
                    let id = t * PER + k;
                    let sgl = [src.sge(id as usize * 8, 8)];
                    let wr = write_wr(id, &sgl, dst.addr() + t * 8, dst.rkey());
                    loop {
                        match qp.post_send(&wr) {
                            Ok(()) => break,
                            Err(iwarp_engine::PostError::QueueFull) => {
                                full.fetch_add(1, Ordering::Relaxed);
                                std::thread::yield_now();
                            }
                            Err(e) => panic!("post: {e}"),
                        }
                    }
                }
            });
        }
        let mut next = [0u64; THREADS as usize];
        let mut wcs = [EMPTY_WC; 32];
        let mut n = 0;
        while n < THREADS * PER {
            let k = cli.cq.wait(&mut wcs, Some(WAIT));
            assert!(k > 0, "{n} of {} completions", THREADS * PER);
            for wc in &wcs[..k] {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                let (t, i) = (wc.wr_id / PER, wc.wr_id % PER);
                assert_eq!(i, next[t as usize], "thread {t}: out of order or twice");
                next[t as usize] += 1;
            }
            n += k as u64;
        }
    });
    assert!(
        full.load(Ordering::Relaxed) > 0,
        "an 8-deep queue under 4 posting threads never filled"
    );
    let back = cli.mr((THREADS * 8) as usize);
    cli.qp
        .post_send(&SendWr {
            wr_id: u64::MAX,
            op: SendOp::Read {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
            },
            sgl: &[back.sge(0, (THREADS * 8) as usize)],
            signaled: true,
        })
        .unwrap();
    assert_eq!(cli.wait_one().status, WcStatus::Success);
    for t in 0..THREADS {
        let mut b = [0; 8];
        back.read((t * 8) as usize, &mut b);
        assert_eq!(u64::from_le_bytes(b), t << 32 | (PER - 1), "thread {t}");
    }
}

/// Several QPs of one server device share one SRQ: each client's Sends
/// land in receives taken from it in posting order, complete on the
/// consuming QP's own receive CQ with that QP's id, and the limit event
/// fires once at the watermark and again only after re-arming. A client
/// whose Send finds the SRQ empty is terminated as with an empty receive
/// queue; the other QPs go on.
fn srq_shared_by_several_qps(mode: Mode) {
    const QPS: usize = 3;
    const MSGS: usize = 3;
    const LEN: usize = 20_000; // two FPDUs at the clamped MSS
    const RBUF: usize = 32 * 1024;
    let manual = mode == Mode::Manual;
    let (cdev, sdev) = (open(manual), open(manual));
    // The test waits on the server's CQs only: both devices need a driver.
    let drivers = manual.then(|| (Driver::start(&cdev), Driver::start(&sdev)));
    let listener = sdev.listen(any_addr()).unwrap();
    let addr = listener.local_addr();
    let spd = sdev.alloc_pd();
    let scq = sdev.create_cq(1024);
    assert!(
        sdev.create_srq(&spd, 16, 17).is_err(),
        "limit above capacity"
    );
    let srq = sdev.create_srq(&spd, 16, 4).unwrap();
    assert!(!readable(srq.event_fd(), 0), "no event yet");
    let rbufs = sdev.reg_mr(&spd, 16 * RBUF, Access::LOCAL_WRITE).unwrap();
    let post = |k: usize| {
        srq.post_recv(&RecvWr {
            wr_id: 1000 + k as u64,
            sgl: &[rbufs.sge(k * RBUF, RBUF)],
        })
        .unwrap();
    };
    for k in 0..QPS * MSGS {
        post(k);
    }
    let rcqs: Vec<Cq> = (0..QPS).map(|_| sdev.create_cq(64)).collect();
    let inits: Vec<QpInit> = rcqs
        .iter()
        .map(|rcq| QpInit {
            pd: spd.clone(),
            send_cq: scq.clone(),
            recv_cq: rcq.clone(),
            sq_depth: 8,
            rq_depth: 8,
            sig_all: false,
            srq: Some(srq.clone()),
        })
        .collect();
    let server = std::thread::spawn(move || {
        inits
            .into_iter()
            .map(|init| {
                let req = listener.get_request(Some(WAIT)).unwrap();
                req.accept(init, ConnParams::default()).unwrap()
            })
            .collect::<Vec<Qp>>()
    });
    let cpd = cdev.alloc_pd();
    let ccq = cdev.create_cq(256);
    let mut clients = Vec::new();
    for _ in 0..QPS {
        let init = QpInit {
            pd: cpd.clone(),
            send_cq: ccq.clone(),
            recv_cq: ccq.clone(),
            sq_depth: 8,
            rq_depth: 8,
            sig_all: false,
            srq: None,
        };
        clients.push(cdev.connect(addr, init, ConnParams::default()).unwrap());
    }
    let sqps = server.join().unwrap();
    // Accepted in connection order: server QP i talks to client i.
    for (c, s) in clients.iter().zip(&sqps) {
        assert_eq!(c.local_addr(), s.peer_addr());
        assert!(s.srq().is_some());
    }
    let probe = RecvWr {
        wr_id: 1,
        sgl: &[rbufs.sge(0, 16)],
    };
    assert_eq!(
        sqps[0].post_recv(&probe),
        Err(iwarp_engine::PostError::SrqAttached)
    );
    // Every client sends its messages; they interleave at the server.
    let src = cdev.reg_mr(&cpd, QPS * MSGS * LEN, Access::NONE).unwrap();
    for m in 0..MSGS {
        for (i, c) in clients.iter().enumerate() {
            let n = m * QPS + i;
            src.write(n * LEN, &pattern(LEN, (16 * i + m) as u8));
            c.post_send(&SendWr {
                wr_id: n as u64,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sgl: &[src.sge(n * LEN, LEN)],
                signaled: true,
            })
            .unwrap();
        }
    }
    let mut used = Vec::new();
    let mut buf = vec![0; LEN];
    for (i, (rcq, sqp)) in rcqs.iter().zip(&sqps).enumerate() {
        for m in 0..MSGS {
            let mut wc = [EMPTY_WC; 1];
            assert_eq!(rcq.wait(&mut wc, Some(WAIT)), 1, "QP {i} message {m}");
            let wc = wc[0];
            assert_eq!(wc.status, WcStatus::Success);
            assert_eq!(wc.opcode, WcOpcode::Recv);
            assert_eq!(wc.qp, sqp.id(), "the consuming QP's id");
            assert_eq!(wc.byte_len as usize, LEN);
            let k = (wc.wr_id - 1000) as usize;
            rbufs.read(k * RBUF, &mut buf);
            assert_eq!(buf, pattern(LEN, (16 * i + m) as u8), "buffer {k}");
            used.push(k);
        }
    }
    used.sort_unstable();
    assert_eq!(used, (0..QPS * MSGS).collect::<Vec<_>>());
    // 9 posted, limit 4: the 6th receive taken left 3. One event.
    assert_eq!(
        srq.wait_event(WAIT),
        Some(iwarp_engine::SrqEvent::LimitReached)
    );
    assert_eq!(srq.poll_event(), None, "the limit disarmed");
    assert_eq!(srq.posted(), 0);
    // Re-armed at 2 with 3 posted: the second Send leaves 1.
    for k in 0..3 {
        post(k);
    }
    srq.arm_limit(2).unwrap();
    for n in 0..2 {
        clients[n]
            .post_send(&SendWr {
                wr_id: 100 + n as u64,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sgl: &[src.sge(0, 10)],
                signaled: true,
            })
            .unwrap();
        let mut wc = [EMPTY_WC; 1];
        assert_eq!(rcqs[n].wait(&mut wc, Some(WAIT)), 1);
        assert_eq!((wc[0].qp, wc[0].status), (sqps[n].id(), WcStatus::Success));
    }
    // This time through the event fd: readable with the event queued,
    // not once it is taken.
    let fd = srq.event_fd();
    assert!(
        readable(fd, WAIT.as_millis().try_into().unwrap_or(u16::MAX)),
        "the event's count"
    );
    assert_eq!(srq.poll_event(), Some(iwarp_engine::SrqEvent::LimitReached));
    assert!(!readable(fd, 0), "the count went with the event");
    assert_eq!(srq.poll_event(), None);
    // Client 2's Send takes the last receive, then client 0's finds none.
    for n in [2, 0] {
        clients[n]
            .post_send(&SendWr {
                wr_id: 200 + n as u64,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sgl: &[src.sge(0, 10)],
                signaled: true,
            })
            .unwrap();
        if n == 2 {
            let mut wc = [EMPTY_WC; 1];
            assert_eq!(rcqs[2].wait(&mut wc, Some(WAIT)), 1);
            assert_eq!((wc[0].qp, wc[0].status), (sqps[2].id(), WcStatus::Success));
        }
    }
    let code = loop {
        match clients[0].wait_event(WAIT) {
            Some(CmEvent::RemoteTerminate(code)) => break code,
            Some(_) => continue,
            None => panic!("no Terminate"),
        }
    };
    assert_eq!(code, iwarp::error::codes::DDP_U_INVALID_MSN_NO_BUFFER);
    assert_eq!(sqps[1].state(), QpState::Rts, "the other QPs go on");
    drop(clients);
    drop(sqps);
    drop(drivers);
}

#[test]
fn srq_shared_by_several_qps_thread_mode() {
    srq_shared_by_several_qps(Mode::Thread);
}

#[test]
fn srq_shared_by_several_qps_manual_mode() {
    srq_shared_by_several_qps(Mode::Manual);
}

/// Poll `f` until it holds; panics after [`WAIT`].
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn released_pds_and_cqs_free_their_slots() {
    let dev = open(true);
    let first = dev.alloc_pd().id();
    dev.progress();
    for _ in 0..10_000 {
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(4);
        let mr = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
        drop((mr, cq, pd));
        dev.progress();
    }
    let s = dev.stats();
    assert_eq!(s.live, Default::default(), "{s:?}");
    let one = HandleCounts {
        pds: 1,
        cqs: 1,
        qps: 0,
        mrs: 1,
    };
    assert_eq!(s.slots, one, "{s:?}");
    // A region keeps its PD: the PD is freed after the region.
    let pd = dev.alloc_pd();
    assert_eq!(pd.id().index(), first.index(), "the slot is reused");
    assert_ne!(pd.id(), first);
    let mr = dev.reg_mr(&pd, 64, Access::LOCAL_WRITE).unwrap();
    drop(pd);
    dev.progress();
    assert_eq!((dev.stats().live.pds, dev.stats().live.mrs), (1, 1));
    drop(mr);
    dev.progress();
    assert_eq!(dev.stats().live, Default::default());
}

/// Connections opened and closed one after another, each with its own
/// PD, CQ and region on both sides: once they are closed, both devices'
/// tables are back to empty, the server's QP slot is reused by every
/// connection (with a new generation each time), and no table grew past
/// one connection's objects.
#[test]
fn server_returns_to_baseline_after_connections_close() {
    const CYCLES: usize = 20;
    let (cdev, sdev) = (open(false), open(false));
    let mut listener = sdev.listen(any_addr()).unwrap();
    let addr = listener.local_addr();
    let mut ids = Vec::new();
    for i in 0..CYCLES {
        let (spd, scq, sinit) = init_sized(&sdev, 4);
        let server = std::thread::spawn(move || {
            let req = listener.get_request(Some(WAIT)).unwrap();
            (req.accept(sinit, ConnParams::default()).unwrap(), listener)
        });
        let (cpd, ccq, cinit) = init_sized(&cdev, 4);
        let cqp = cdev.connect(addr, cinit, ConnParams::default()).unwrap();
        let (sqp, l) = server.join().unwrap();
        let server = Side {
            qp: sqp,
            pd: spd,
            cq: scq,
            dev: sdev.clone(),
        };
        let client = Side {
            qp: cqp,
            pd: cpd,
            cq: ccq,
            dev: cdev.clone(),
        };
        send_one(&client, &server, 8, i as u8);
        ids.push(server.qp.id());
        drop((client, server));
        for dev in [&cdev, &sdev] {
            eventually("tables empty after the close", || {
                dev.stats().live == Default::default()
            });
        }
        listener = l;
    }
    for dev in [&cdev, &sdev] {
        let s = dev.stats();
        assert_eq!(s.connections, 0);
        let one = HandleCounts {
            pds: 1,
            cqs: 1,
            qps: 1,
            mrs: 1,
        };
        assert_eq!(s.slots, one, "{s:?}");
    }
    assert!(ids.iter().all(|id| id.index() == ids[0].index()), "{ids:?}");
    for (k, id) in ids.iter().enumerate() {
        assert!(!ids[..k].contains(id), "{id:?} issued twice");
    }
}

/// Many connections on the kernel backend (no root: loopback): 1000
/// connections from one device to another, each sending a message the
/// server checks and answers; the server's passes visit the connections
/// whose sockets became ready, so each exchange finishes however many
/// others are open. Both progress modes (manual: a driver thread per
/// device).
fn many_connections(mode: Mode) {
    const N: usize = 1000;
    const LEN: usize = 32;
    let manual = mode == Mode::Manual;
    let (cdev, sdev) = (open(manual), open(manual));
    // The test waits on one device at a time: manual devices each get a
    // driver.
    let _drivers = manual.then(|| (Driver::start(&sdev), Driver::start(&cdev)));
    let listener = sdev.listen(any_addr()).unwrap();
    let addr = listener.local_addr();
    // Room for every connection's two completions: nobody polls the
    // client's queue until every connection is open.
    let (spd, scq) = (sdev.alloc_pd(), sdev.create_cq(2 * N + 64));
    let (cpd, ccq) = (cdev.alloc_pd(), cdev.create_cq(2 * N + 64));
    let big = |dev: &Device, pd: &Pd| dev.reg_mr(pd, N * LEN, Access::LOCAL_WRITE).unwrap();
    let (srecv, sout) = (big(&sdev, &spd), big(&sdev, &spd));
    let (crecv, cout) = (big(&cdev, &cpd), big(&cdev, &cpd));
    let qinit = |pd: &Pd, cq: &Cq| QpInit {
        pd: pd.clone(),
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        sq_depth: 4,
        rq_depth: 2,
        sig_all: false,
        srq: None,
    };
    let msg = |i: usize, answer: bool| {
        let mut m = pattern(LEN, i as u8 ^ u8::from(answer));
        m[..4].copy_from_slice(&(i as u32).to_be_bytes());
        m
    };
    let send = |qp: &Qp, i: usize, sge: Sge| {
        qp.post_send(&SendWr {
            wr_id: i as u64,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: &[sge],
            signaled: true,
        })
        .unwrap()
    };
    let mut client_qps = Vec::new();
    let mut server_qps = Vec::new();
    for i in 0..N {
        let params = ConnParams {
            private_data: (i as u32).to_be_bytes().to_vec(),
            ..ConnParams::default()
        };
        let crecv_wr = RecvWr {
            wr_id: i as u64,
            sgl: &[crecv.sge(i * LEN, LEN)],
        };
        let (ci, si) = (qinit(&cpd, &ccq), qinit(&spd, &scq));
        let (srecv, l) = (&srecv, &listener);
        let (cqp, sqp) = std::thread::scope(|s| {
            let server = s.spawn(move || {
                let req = l.get_request(Some(WAIT)).unwrap();
                let rwr = RecvWr {
                    wr_id: i as u64,
                    sgl: &[srecv.sge(i * LEN, LEN)],
                };
                req.accept_with_recvs(si, ConnParams::default(), &[rwr])
                    .unwrap()
            });
            let cqp = cdev
                .connect_with_recvs(addr, ci, params, &[crecv_wr])
                .unwrap();
            (cqp, server.join().unwrap())
        });
        cout.write(i * LEN, &msg(i, false));
        send(&cqp, i, cout.sge(i * LEN, LEN));
        client_qps.push(cqp);
        server_qps.push(sqp);
    }
    // Wait for N receives and N sends on `cq`; `on_recv` checks each
    // receive (its work request id is the connection's index).
    let complete = |who: &str, cq: &Cq, mut on_recv: Box<dyn FnMut(usize) + '_>| {
        let mut wcs = [EMPTY_WC; 32];
        let (mut recvs, mut sends) = (0, 0);
        while recvs < N || sends < N {
            let n = cq.wait(&mut wcs, Some(WAIT));
            assert!(n > 0, "{who}: {recvs} receives, {sends} sends");
            for wc in &wcs[..n] {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                if wc.opcode == WcOpcode::Recv {
                    on_recv(wc.wr_id as usize);
                    recvs += 1;
                } else {
                    sends += 1;
                }
            }
        }
    };
    let check = |mr: &Mr, i: usize, answer: bool| {
        let mut got = vec![0; LEN];
        mr.read(i * LEN, &mut got);
        assert_eq!(got, msg(i, answer), "connection {i}");
    };
    // The server answers each message it checked.
    complete(
        "server",
        &scq,
        Box::new(|i| {
            check(&srecv, i, false);
            sout.write(i * LEN, &msg(i, true));
            send(&server_qps[i], i, sout.sge(i * LEN, LEN));
        }),
    );
    complete("client", &ccq, Box::new(|i| check(&crecv, i, true)));
    assert_eq!(sdev.stats().connections, N);
    drop(client_qps);
    drop(server_qps);
    for dev in [&cdev, &sdev] {
        eventually("every connection gone", || dev.stats().connections == 0);
    }
}

#[test]
fn many_connections_thread_mode() {
    many_connections(Mode::Thread);
}

#[test]
fn many_connections_manual_mode() {
    many_connections(Mode::Manual);
}

/// Connections outside the core's hands that have nothing to do cost the
/// passes nothing: accepted connections whose MPA request does not come,
/// and rejected ones whose reply went out while their peer stays silent
/// (their sockets drain until the peer's FIN), are visited when they
/// arrive or their socket becomes ready, not by every pass
/// (`Stats::lifecycle_visits`). A deadline passing during the idle
/// passes (a machine stalled for seconds) accounts for one visit per
/// connection at most, so the bound allows that and no more.
#[test]
fn idle_handshakes_and_draining_sockets_are_not_visited_per_pass() {
    use std::io::Write;
    const N: usize = 32;
    const PASSES: usize = 200;
    let dev = open(true);
    let listener = dev.listen(any_addr()).unwrap();
    let addr = listener.local_addr();
    let visits = || dev.stats().lifecycle_visits;
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let end = Instant::now() + WAIT;
        while !done() {
            assert!(Instant::now() < end, "{what}");
            dev.progress();
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let idle_passes = || {
        let before = visits();
        for _ in 0..PASSES {
            dev.progress();
        }
        visits() - before
    };

    // Silent clients: each is accepted and visited once, on arrival.
    let silent: Vec<std::net::TcpStream> = (0..N)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    until("every silent client accepted", &|| visits() >= N as u64);
    let added = idle_passes();
    assert!(
        added <= N as u64,
        "{N} idle handshakes: {added} visits in {PASSES} passes"
    );

    // Rejected clients that neither read nor close.
    let mut request = b"MPA ID Req Frame".to_vec();
    request.extend([0x40, 1, 0, 0]);
    let rejected: Vec<std::net::TcpStream> = (0..N)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(&request).unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    for _ in 0..N {
        let req = listener.get_request(Some(WAIT)).unwrap();
        req.reject(b"no").unwrap();
    }
    // A reply that reached its client left the server's lingering list
    // for its draining list in the same visit.
    until("every reject reply delivered", &|| {
        let mut buf = [0u8; 64];
        rejected
            .iter()
            .all(|s| s.peek(&mut buf).is_ok_and(|n| n >= 20))
    });
    // The passes that follow insertion visit each draining socket once.
    for _ in 0..4 {
        dev.progress();
    }
    let added = idle_passes();
    assert!(
        added <= 2 * N as u64,
        "{N} idle handshakes and {N} draining sockets: {added} visits in {PASSES} passes"
    );
    drop(silent);
}

/// Connections the application dropped while their peer keeps them open
/// (it neither reads nor closes, so what the QP still sends stays queued
/// and the socket stays open) are visited when their socket becomes
/// ready or their QP's timer is due, not by every pass
/// (`Stats::lifecycle_visits` counts visits of dropped connections).
///
/// A socket the engine found full may take more later (the longer the
/// wait, the more of them do), and a connection whose queued bytes then
/// all leave closes at once. So the test counts the connections still
/// closing and bounds their visits by the connections, not by the passes.
#[test]
fn dropped_connections_still_closing_are_not_visited_per_pass() {
    use std::io::Write;
    const N: usize = 16;
    const PASSES: usize = 200;
    const LEN: usize = 1 << 20;
    const SENDS: u64 = 8;
    let dev = open(true);
    let (pd, cq, _) = init(&dev);
    let mr = dev.reg_mr(&pd, LEN, Access::LOCAL_WRITE).unwrap();
    let visits = || dev.stats().lifecycle_visits;
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let end = Instant::now() + WAIT;
        while !done() {
            assert!(Instant::now() < end, "{what}");
            if dev.progress() == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    // Raw MPA responders that reply and then neither read nor close; a
    // small window: the QPs' sends fill it and the sockets.
    let raw = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    raw.set_recv_buffer_size(4096).unwrap();
    raw.bind(&any_addr().into()).unwrap();
    raw.listen(N as i32).unwrap();
    let raw: std::net::TcpListener = raw.into();
    let addr = raw.local_addr().unwrap();
    let peers = std::thread::spawn(move || {
        use std::io::Read;
        let mut reply = b"MPA ID Rep Frame".to_vec();
        reply.extend([0, 1, 0, 0]);
        (0..N)
            .map(|_| {
                let (mut s, _) = raw.accept().unwrap();
                s.set_read_timeout(Some(WAIT)).unwrap();
                let mut request = [0u8; 20];
                s.read_exact(&mut request).unwrap();
                s.write_all(&reply).unwrap();
                s
            })
            .collect::<Vec<std::net::TcpStream>>()
    });
    let params = ConnParams {
        revision: 1,
        ..ConnParams::default()
    };
    let qps: Vec<Qp> = (0..N)
        .map(|_| {
            dev.connect(addr, QpInit::new(&pd, &cq, 128), params.clone())
                .unwrap()
        })
        .collect();
    let clients = peers.join().unwrap();
    for qp in &qps {
        for k in 0..SENDS {
            qp.post_send(&SendWr {
                wr_id: k,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sgl: &[mr.sge(0, LEN)],
                signaled: false,
            })
            .unwrap();
        }
    }
    // Send until the sockets take no more, drop the QPs, and let their
    // connections take in the drop. A connection whose queued bytes had
    // all gone into its socket when its QP was dropped (the rest of its
    // sends are flushed) closes at once; the others stay closing.
    until("the sockets full", &|| dev.progress() == 0);
    drop(qps);
    until("the drops handled", &|| dev.progress() == 0);
    let closing = dev.stats().connections;
    assert!(closing > 0, "no dropped connection still closing");
    let before = visits();
    for _ in 0..PASSES {
        dev.progress();
    }
    // Visited per pass, even one of them would take `PASSES` visits.
    let added = visits() - before;
    assert!(
        added <= 2 * N as u64,
        "{closing} dropped connections still closing: {added} visits in {PASSES} passes"
    );
    // The peers close with unread bytes, which resets the connections:
    // the stuck output is abandoned and the connections are destroyed.
    drop(clients);
    until("the reset connections destroyed", &|| {
        dev.progress();
        dev.stats().connections == 0
    });
    assert_eq!(dev.stats().live.qps, 0);
}

/// A CQ whose application queue is full keeps the rest in the core; the
/// application's poll that makes room brings them over although nothing
/// else happens on the device (its progress thread sleeps otherwise).
#[test]
fn completions_left_behind_a_full_queue_follow_the_poll_that_makes_room() {
    let (cdev, sdev) = (open(false), open(false));
    let listener = sdev.listen(any_addr()).unwrap();
    let addr = listener.local_addr();
    let (spd, _scq, sinit) = init(&sdev);
    let server = std::thread::spawn(move || {
        let req = listener.get_request(Some(WAIT)).unwrap();
        req.accept(sinit, ConnParams::default()).unwrap()
    });
    let pd = cdev.alloc_pd();
    // 4 in the application's queue and 4 in the core's.
    let cq = cdev.create_cq(4);
    let qp = cdev
        .connect(addr, QpInit::new(&pd, &cq, 16), ConnParams::default())
        .unwrap();
    let sqp = server.join().unwrap();
    let src = cdev
        .reg_mr(&pd, 64, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    let dst = sdev
        .reg_mr(
            &spd,
            64,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let sgls: Vec<[Sge; 1]> = (0..8).map(|i| [src.sge(8 * i, 8)]).collect();
    // Four completions fill the application's queue; four more wait in
    // the core's. Each batch gets time to complete before the next (the
    // core's queue takes four per pass) and before the client polls.
    for batch in [0..4u64, 4..8] {
        for i in batch {
            qp.post_send(&write_wr(
                i,
                &sgls[i as usize],
                dst.addr() + 8 * i,
                dst.rkey(),
            ))
            .unwrap();
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut ids = Vec::new();
    let mut wc = [EMPTY_WC; 2];
    while ids.len() < 8 {
        let n = cq.wait(&mut wc, Some(WAIT));
        assert!(n > 0, "completions {ids:?} of 8, then none");
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::Success);
            ids.push(w.wr_id);
        }
    }
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
    assert_eq!(qp.state(), QpState::Rts);
    drop(sqp);
}
