//! The AF_XDP backend in two network namespaces joined by veth
//! (`scripts/lib/topology.sh`, pid-based names, 198.18.0.0/15): AF_XDP ↔
//! AF_XDP and AF_XDP ↔ kernel sockets, RDMA Write/Read/Send of 1 B ..
//! 1 MiB verified byte for byte with CRC on, and no XDP program left on
//! the interface after the device is dropped.
//!
//! Needs root; without it every test prints a note and returns. Each side
//! runs on its own thread that entered its namespace before opening the
//! device (the progress thread inherits the namespace). Every wait is
//! bounded; nothing asserts timing (the throughput line is informational).

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use iwarp_engine::xdp::{AttachMode, RawTcp, TX_FLUSH_FRAMES};
use iwarp_engine::{
    Access, Backend, ConnParams, Cq, Device, DeviceConfig, Mr, Progress, Qp, QpInit, RecvWr,
    SendOp, SendWr, WcOpcode, WcStatus, XdpConfig, EMPTY_WC,
};
use iwarp_tcp::smoltcp::phy::{Device as _, TxToken as _};
use iwarp_tcp::smoltcp::time::Instant as SmolInstant;

use common::{is_root, pattern, readable, spawn_in, Topo, IP_A, IP_B};

const WAIT: Duration = Duration::from_secs(20);
const SIZES: [usize; 6] = [1, 7, 1000, 16 * 1024 + 3, 65537, 1 << 20];
/// Messages of one FPDU each (MTU 1500, markers and CRC on).
const SMALL: [usize; 4] = [1, 7, 1000, 1400];
/// Messages of one FPDU each at MTU 9000.
const SMALL_9000: [usize; 4] = [1, 7, 3000, 8000];
const MR_LEN: usize = 1 << 20;
const PORT: u16 = 7174;
/// The largest IP MTU of a veth link.
const LARGEST_MTU: usize = 65535;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Xdp,
    Kernel,
}

/// How a test runs.
#[derive(Clone, Debug)]
struct Opts {
    /// AF_XDP devices busy-poll.
    busy: bool,
    /// Time a stream of 64 KiB writes.
    stream: bool,
    mtu: usize,
    /// Capture the client's traffic (AF_XDP client only).
    pcap: Option<PathBuf>,
    /// Ask for MPA markers (both directions).
    markers: bool,
    /// The server drops its listener right after accepting: the
    /// connection must keep working (its port stays steered).
    close_listener: bool,
    /// Message sizes of the Write/Read/Send round.
    sizes: &'static [usize],
    /// The AF_XDP engines' TCP settings.
    tcp: iwarp_tcp::Config,
    /// How the AF_XDP engines' steering programs attach.
    attach: AttachMode,
    /// Both veth ends checksum on transmit (`ethtool -K tx on`): the
    /// AF_XDP engines offload TCP checksums through Tx metadata.
    tx_csum: bool,
}

impl Opts {
    fn new(mtu: usize) -> Self {
        Self {
            busy: false,
            stream: false,
            mtu,
            pcap: None,
            markers: false,
            close_listener: false,
            sizes: &SIZES,
            tcp: iwarp_tcp::Config::default(),
            attach: AttachMode::Native,
            tx_csum: false,
        }
    }
}

fn backend(kind: Kind, dev: &str, ip: Ipv4Addr, o: &Opts, pcap: Option<PathBuf>) -> Backend {
    match kind {
        Kind::Kernel => Backend::Kernel,
        Kind::Xdp => {
            let mut c = XdpConfig::new(dev, ip, 24);
            c.attach = o.attach;
            c.busy_poll = o.busy;
            c.mtu = o.mtu;
            c.pcap = pcap;
            c.tcp = o.tcp;
            Backend::AfXdp(c)
        }
    }
}

fn open(b: Backend) -> Device {
    let cfg = DeviceConfig {
        progress: Progress::Thread { cpu: None },
        seed: None,
        busy_poll: false,
    };
    Device::open(b, cfg).expect("open device")
}

fn init(cq: &Cq, pd: &iwarp_engine::Pd) -> QpInit {
    QpInit {
        pd: pd.clone(),
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        sq_depth: 128,
        rq_depth: 8,
        sig_all: false,
        srq: None,
    }
}

fn params(o: &Opts) -> ConnParams {
    ConnParams {
        crc: true,
        markers: o.markers,
        timeout: Duration::from_secs(10),
        ..ConnParams::default()
    }
}

fn wait_one(cq: &Cq) -> iwarp_engine::WorkCompletion {
    let mut wc = [EMPTY_WC; 1];
    let n = cq.wait(&mut wc, Some(WAIT));
    assert_eq!(n, 1, "no completion within {WAIT:?}");
    assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    wc[0]
}

/// What the client asks the server to check.
enum Cmd {
    /// The first `len` bytes of the server's region hold `pattern(len, seed)`.
    CheckWrite(usize, u8),
    /// A Send of `pattern(len, seed)` arrives.
    ExpectSend(usize, u8),
    /// Immediate Data carrying this arrives.
    ExpectImmediate(u64),
    Done,
}

/// The server's region and what the client needs to reach it.
struct Offer {
    addr: SocketAddr,
    rkey: u32,
    remote_addr: u64,
}

struct Server {
    qp: Qp,
    cq: Cq,
    mr: Mr,
    recv: Mr,
    dev: Device,
}

fn serve(
    kind: Kind,
    o: Opts,
    offer: mpsc::Sender<Offer>,
    cmds: mpsc::Receiver<Cmd>,
    ok: mpsc::Sender<()>,
) {
    let listen_ip = if kind == Kind::Xdp {
        Ipv4Addr::UNSPECIFIED
    } else {
        IP_B
    };
    let dev = open(backend(kind, "xb", IP_B, &o, None));
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(256);
    let mr = dev
        .reg_mr(
            &pd,
            MR_LEN,
            Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
        )
        .unwrap();
    let recv = dev.reg_mr(&pd, MR_LEN, Access::LOCAL_WRITE).unwrap();
    let l = dev
        .listen(SocketAddr::new(listen_ip.into(), PORT))
        .expect("listen");
    offer
        .send(Offer {
            addr: SocketAddr::new(IP_B.into(), l.local_addr().port()),
            rkey: mr.rkey(),
            remote_addr: mr.addr(),
        })
        .unwrap();
    let req = l.get_request(Some(WAIT)).expect("connection request");
    assert!(req.request().crc);
    assert_eq!(req.request().markers, o.markers);
    let qp = req.accept(init(&cq, &pd), params(&o)).expect("accept");
    assert!(qp.negotiated().crc);
    if o.close_listener {
        drop(l);
    }
    let s = Server {
        qp,
        cq,
        mr,
        recv,
        dev,
    };
    let post_recv = |s: &Server| {
        s.qp.post_recv(&RecvWr {
            wr_id: 7,
            sgl: &[s.recv.sge(0, MR_LEN)],
        })
        .unwrap()
    };
    post_recv(&s);
    while let Ok(cmd) = cmds.recv_timeout(Duration::from_secs(60)) {
        match cmd {
            Cmd::CheckWrite(len, seed) => {
                let mut got = vec![0; len];
                s.mr.read(0, &mut got);
                assert!(got == pattern(len, seed), "RDMA Write of {len} B differs");
            }
            Cmd::ExpectSend(len, seed) => {
                let wc = wait_one(&s.cq);
                assert_eq!((wc.opcode, wc.byte_len as usize), (WcOpcode::Recv, len));
                let mut got = vec![0; len];
                s.recv.read(0, &mut got);
                assert!(got == pattern(len, seed), "Send of {len} B differs");
                post_recv(&s);
            }
            Cmd::ExpectImmediate(data) => {
                let wc = wait_one(&s.cq);
                assert_eq!(
                    (wc.opcode, wc.byte_len, wc.imm_data),
                    (WcOpcode::Recv, 0, Some(data))
                );
                post_recv(&s);
            }
            Cmd::Done => break,
        }
        ok.send(()).unwrap();
    }
    println!("server stats: {:?}", s.dev.stats());
    if kind == Kind::Xdp {
        assert_kicks_follow_frames(&s.dev);
    }
}

/// The kernel is kicked for frames in the tx ring it has not taken (at
/// most a batch per `sendto` in copy mode), not while frames it took
/// wait for their completions: never more kicks than frames sent.
fn assert_kicks_follow_frames(dev: &Device) {
    let rings = dev.stats().xdp.expect("AF_XDP counters").rings;
    assert!(
        rings.tx_kicks <= rings.tx_frames,
        "{} kicks for {} frames sent",
        rings.tx_kicks,
        rings.tx_frames
    );
}

/// Connect, then Write/Read/Send each size; optionally time a stream of
/// 64 KiB RDMA Writes.
fn client(
    kind: Kind,
    o: Opts,
    offer: Offer,
    cmds: mpsc::Sender<Cmd>,
    ok: mpsc::Receiver<()>,
) -> Device {
    let dev = open(backend(kind, "xa", IP_A, &o, o.pcap.clone()));
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(256);
    let src = dev.reg_mr(&pd, MR_LEN, Access::LOCAL_WRITE).unwrap();
    let dst = dev.reg_mr(&pd, MR_LEN, Access::LOCAL_WRITE).unwrap();
    // Connected through the non-blocking path, driven by its descriptor.
    let mut connecting = dev
        .connect_start(offer.addr, init(&cq, &pd), params(&o), &[])
        .expect("connect");
    let deadline = Instant::now() + WAIT;
    let qp = loop {
        assert!(Instant::now() < deadline, "no connect outcome");
        if readable(connecting.event_fd(), 100) {
            if let Some(r) = connecting.poll() {
                break r.expect("connect");
            }
        }
    };
    assert!(qp.negotiated().crc);
    assert_eq!(qp.negotiated().markers_rx, o.markers);
    let sync = |c: Cmd| {
        cmds.send(c).unwrap();
        ok.recv_timeout(WAIT).expect("server check");
    };
    // The first completion after the arm raises one notification.
    cq.req_notify(false).unwrap();
    for (i, &len) in o.sizes.iter().enumerate() {
        let seed = i as u8 * 3 + 1;
        src.write(0, &pattern(len, seed));
        qp.post_send(&SendWr {
            wr_id: 1,
            op: SendOp::Write {
                remote_addr: offer.remote_addr,
                rkey: offer.rkey,
            },
            sgl: &[src.sge(0, len)],
            signaled: true,
        })
        .unwrap();
        assert_eq!(wait_one(&cq).opcode, WcOpcode::RdmaWrite);
        // Raised by the engine before it hands the completion over.
        assert_eq!(cq.get_event(), i == 0, "one notification per arm");
        qp.post_send(&SendWr {
            wr_id: 2,
            op: SendOp::Read {
                remote_addr: offer.remote_addr,
                rkey: offer.rkey,
            },
            sgl: &[dst.sge(0, len)],
            signaled: true,
        })
        .unwrap();
        assert_eq!(wait_one(&cq).opcode, WcOpcode::RdmaRead);
        let mut got = vec![0; len];
        dst.read(0, &mut got);
        assert!(got == pattern(len, seed), "RDMA Read of {len} B differs");
        // The Read Response follows the Write's placement: the server's
        // region holds it now.
        sync(Cmd::CheckWrite(len, seed));
        let seed = seed.wrapping_add(100);
        src.write(0, &pattern(len, seed));
        qp.post_send(&SendWr {
            wr_id: 3,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: &[src.sge(0, len)],
            signaled: true,
        })
        .unwrap();
        assert_eq!(wait_one(&cq).opcode, WcOpcode::Send);
        sync(Cmd::ExpectSend(len, seed));
    }
    // RFC 7306 over the same path: atomics on the first word of the
    // server's region, each returning what the one before left, then
    // Immediate Data.
    let sink = dev.reg_mr(&pd, 8, Access::LOCAL_WRITE).unwrap();
    let atomic = |op: SendOp, opcode: WcOpcode| {
        qp.post_send(&SendWr {
            wr_id: 4,
            op,
            sgl: &[sink.sge(0, 8)],
            signaled: true,
        })
        .unwrap();
        let wc = wait_one(&cq);
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len),
            (WcStatus::Success, opcode, 8)
        );
        let mut b = [0u8; 8];
        sink.read(0, &mut b);
        u64::from_ne_bytes(b)
    };
    let fetch_add = |add| SendOp::FetchAdd {
        remote_addr: offer.remote_addr,
        rkey: offer.rkey,
        add,
        add_mask: 0,
    };
    let first = atomic(fetch_add(0), WcOpcode::AtomicFetchAdd);
    assert_eq!(atomic(fetch_add(5), WcOpcode::AtomicFetchAdd), first);
    let cas = SendOp::CompareSwap {
        remote_addr: offer.remote_addr,
        rkey: offer.rkey,
        compare: first.wrapping_add(5),
        compare_mask: u64::MAX,
        swap: 1,
        swap_mask: u64::MAX,
    };
    assert_eq!(
        atomic(cas, WcOpcode::AtomicCompareSwap),
        first.wrapping_add(5)
    );
    assert_eq!(atomic(fetch_add(0), WcOpcode::AtomicFetchAdd), 1);
    qp.post_send(&SendWr {
        wr_id: 5,
        op: SendOp::ImmediateData {
            data: 0x1234_5678_9abc_def0,
            solicited: true,
        },
        sgl: &[],
        signaled: true,
    })
    .unwrap();
    assert_eq!(wait_one(&cq).opcode, WcOpcode::ImmediateData);
    sync(Cmd::ExpectImmediate(0x1234_5678_9abc_def0));
    if o.stream {
        const CHUNK: usize = 64 * 1024;
        const TOTAL: usize = 256 << 20;
        const WINDOW: usize = 32;
        let start = Instant::now();
        let (mut posted, mut done) = (0, 0);
        let mut wcs = [EMPTY_WC; 32];
        while done < TOTAL / CHUNK {
            while posted < TOTAL / CHUNK && posted - done < WINDOW {
                let off = (posted * CHUNK) % MR_LEN;
                qp.post_send(&SendWr {
                    wr_id: posted as u64,
                    op: SendOp::Write {
                        remote_addr: offer.remote_addr + off as u64,
                        rkey: offer.rkey,
                    },
                    sgl: &[src.sge(off, CHUNK)],
                    signaled: true,
                })
                .unwrap();
                posted += 1;
            }
            let n = cq.wait(&mut wcs, Some(WAIT));
            assert!(n > 0, "stream stalled");
            assert!(wcs[..n].iter().all(|w| w.status == WcStatus::Success));
            done += n;
            if start.elapsed() > Duration::from_secs(30) {
                break;
            }
        }
        let secs = start.elapsed().as_secs_f64();
        let bytes = done * CHUNK;
        println!(
            "64 KiB RDMA Write stream {kind:?} (MTU {}, busy-poll {}): {} MiB in {secs:.2} s = {:.2} Gb/s",
            o.mtu,
            o.busy,
            bytes >> 20,
            bytes as f64 * 8.0 / secs / 1e9
        );
    }
    cmds.send(Cmd::Done).unwrap();
    println!("client stats: {:?}", dev.stats());
    drop(qp);
    dev
}

fn pair(server: Kind, client_kind: Kind, o: Opts) {
    let topo = Topo::up(
        o.mtu,
        (client_kind == Kind::Kernel).then_some(IP_A),
        (server == Kind::Kernel).then_some(IP_B),
        1,
    );
    if o.tx_csum {
        for (ns, dev) in [(&topo.a, "xa"), (&topo.b, "xb")] {
            let st = std::process::Command::new("ip")
                .args(["netns", "exec", ns, "ethtool", "-K", dev, "tx", "on"])
                .output()
                .expect("ethtool");
            assert!(st.status.success(), "ethtool -K {dev} tx on: {st:?}");
        }
    }
    let (offer_tx, offer_rx) = mpsc::channel();
    let (cmd_tx, cmd_rx) = mpsc::channel();
    let (ok_tx, ok_rx) = mpsc::channel();
    let so = o.clone();
    let attach = o.attach;
    let tx_csum = o.tx_csum;
    let srv = spawn_in(&topo.b, move || serve(server, so, offer_tx, cmd_rx, ok_tx));
    let offer = offer_rx.recv_timeout(WAIT).expect("server up");
    let cli = spawn_in(&topo.a, move || {
        client(client_kind, o, offer, cmd_tx, ok_rx)
    });
    let dev = cli.join().expect("client");
    srv.join().expect("server");
    if client_kind == Kind::Xdp {
        assert_kicks_follow_frames(&dev);
        // The checksum offload where the interface checksums on
        // transmit, and its fallback (smoltcp) where it does not.
        let x = dev.stats().xdp.expect("AF_XDP counters");
        assert_eq!(x.tx_csum_offload, tx_csum, "{x:?}");
        assert_eq!(x.rings.tx_csum_offloaded > 0, tx_csum, "{x:?}");
        assert!(!x.zero_copy, "veth binds in copy mode: {x:?}");
        let show = topo.link(&topo.a, "xa");
        assert!(show.contains("xdp"), "attached while open: {show}");
        // `ip link` names a generic-mode program `xdpgeneric`.
        let generic = show.contains("xdpgeneric");
        assert_eq!(generic, attach == AttachMode::Generic, "{attach:?}: {show}");
    }
    drop(dev);
    topo.assert_no_program();
}

#[test]
fn xdp_to_xdp_write_read_send() {
    if !is_root() {
        return;
    }
    let o = Opts {
        stream: true,
        ..Opts::new(1500)
    };
    pair(Kind::Xdp, Kind::Xdp, o);
}

/// Both engines in generic (skb) mode, the benchmarks' default on veth:
/// the same operations, verified byte for byte, and the same clean exit
/// (`pair` checks that no `xdpgeneric` program is left either).
#[test]
fn xdp_to_xdp_generic_mode_write_read_send() {
    if !is_root() {
        return;
    }
    let o = Opts {
        stream: true,
        attach: AttachMode::Generic,
        ..Opts::new(1500)
    };
    pair(Kind::Xdp, Kind::Xdp, o);
}

/// Busy-polling workers, MTU 3506 (4 KiB UMEM frames).
#[test]
fn xdp_to_xdp_busy_poll_mtu_3506() {
    if !is_root() {
        return;
    }
    let o = Opts {
        busy: true,
        stream: true,
        ..Opts::new(3506)
    };
    pair(Kind::Xdp, Kind::Xdp, o);
}

/// Jumbo frames (MTU 9000): each frame spans three UMEM chunks
/// (multi-buffer AF_XDP both ways), in native mode, where veth takes the
/// MTU only because the steering program is frags-aware.
#[test]
fn xdp_to_xdp_multi_buffer_mtu_9000() {
    if !is_root() {
        return;
    }
    let o = Opts {
        stream: true,
        ..Opts::new(9000)
    };
    pair(Kind::Xdp, Kind::Xdp, o);
}

/// The same in generic mode, with markers (a marker every 512 bytes of
/// the stream falls inside and across the chunks of a frame).
#[test]
fn xdp_to_xdp_multi_buffer_generic_mode_markers_mtu_9000() {
    if !is_root() {
        return;
    }
    let o = Opts {
        stream: true,
        markers: true,
        attach: AttachMode::Generic,
        ..Opts::new(9000)
    };
    pair(Kind::Xdp, Kind::Xdp, o);
}

/// The largest MTU veth takes (65535: `ip link` refuses more) and IPv4
/// carries (a 16-bit total length): a frame spans 18 receive chunks
/// and 17 transmit descriptors, the most a copy-mode transmit takes.
#[test]
fn xdp_to_xdp_multi_buffer_largest_mtu() {
    if !is_root() {
        return;
    }
    let o = Opts {
        stream: true,
        attach: AttachMode::Generic,
        ..Opts::new(LARGEST_MTU)
    };
    pair(Kind::Xdp, Kind::Xdp, o);
}

/// TCP transmit checksums offloaded through AF_XDP Tx metadata (both
/// veth ends checksum on transmit): the kernel sends each segment with a
/// partial checksum, the receiving engine finishes it (counted), and
/// every byte arrives; at MTU 1500 and with multi-buffer frames.
#[test]
fn xdp_to_xdp_tx_checksum_offload() {
    if !is_root() {
        return;
    }
    for mtu in [1500, 9000] {
        let o = Opts {
            tx_csum: true,
            stream: true,
            ..Opts::new(mtu)
        };
        pair(Kind::Xdp, Kind::Xdp, o);
    }
}

/// The offload against a kernel TCP peer, which takes the partial
/// checksums as they come (the kernel's own `CHECKSUM_PARTIAL` path).
#[test]
fn xdp_client_kernel_server_tx_checksum_offload() {
    if !is_root() {
        return;
    }
    let o = Opts {
        tx_csum: true,
        ..Opts::new(1500)
    };
    pair(Kind::Kernel, Kind::Xdp, o);
}

/// AF_XDP at MTU 9000 against kernel sockets both ways.
#[test]
fn xdp_and_kernel_multi_buffer_mtu_9000() {
    if !is_root() {
        return;
    }
    pair(Kind::Kernel, Kind::Xdp, Opts::new(9000));
    pair(Kind::Xdp, Kind::Kernel, Opts::new(9000));
}

/// A pass that writes more frames than a burst hands them to the kernel
/// as it goes, [`TX_FLUSH_FRAMES`] at a time, and the rest at its end:
/// in copy mode the kernel reads each frame back, best while it is still
/// in the cache.
#[test]
fn xdp_device_submits_frames_during_a_long_pass() {
    if !is_root() {
        return;
    }
    let topo = Topo::up(1500, None, Some(IP_B), 1);
    spawn_in(&topo.a, || {
        let mut raw = RawTcp::open(&XdpConfig::new("xa", IP_A, 24), &[]).expect("AF_XDP socket");
        let frames = 3 * TX_FLUSH_FRAMES + 10;
        let dev = raw.stack().device_mut();
        for i in 0..frames {
            let tx = dev
                .transmit(SmolInstant::from_micros(0))
                .expect("a free frame");
            // Broadcast on the test's own veth pair, an EtherType for
            // local experiments (IEEE 802): namespace b drops it.
            tx.consume(60, |f| {
                f.fill(0);
                f[..6].fill(0xff);
                f[12..14].copy_from_slice(&[0x88, 0xb5]);
                f[14] = i as u8;
            });
        }
        let rings = raw.ring_counters();
        assert_eq!(
            (rings.tx_early_bursts, rings.tx_frames),
            (3, 3 * TX_FLUSH_FRAMES as u64),
            "{rings:?}"
        );
        raw.transmit();
        assert_eq!(raw.ring_counters().tx_frames, frames as u64);
    })
    .join()
    .expect("sender");
}

/// Whether tshark is there to judge `pcap`; if not, says so and removes it.
fn tshark_ready(pcap: &std::path::Path) -> bool {
    let ready = iwarp_capture::tshark::available();
    if !ready {
        eprintln!("note: tshark not installed; skipping the decode check");
        let _ = std::fs::remove_file(pcap);
    }
    ready
}

/// Remove a judged capture unless `XDP_KEEP_PCAP` is set.
fn drop_capture(pcap: &std::path::Path) {
    if std::env::var_os("XDP_KEEP_PCAP").is_none() {
        let _ = std::fs::remove_file(pcap);
    }
}

/// Markers and CRC on: tshark (an independent decoder) reads the AF_XDP
/// client's capture of a ping-pong exchange of single-FPDU messages, and
/// every FPDU decodes, with markers stripped where RFC 5044 puts them and
/// a good CRC. Larger messages are left out on purpose: smoltcp cuts
/// segments by its congestion window without regard to FPDU boundaries
/// (legal: the receiver, ours or siw, reassembles, and markers exist for
/// that case), but tshark's MPA dissector assumes every segment starts
/// an FPDU and loses the stream after the first cut.
#[test]
fn xdp_to_xdp_markers_crc_capture_decodes_in_tshark() {
    markers_crc_capture(1500, &SMALL);
}

/// The same at MTU 9000, with messages of one FPDU of up to 8000 bytes:
/// frames of three UMEM chunks each way, markers inside and across them.
#[test]
fn xdp_to_xdp_markers_crc_capture_decodes_in_tshark_mtu_9000() {
    markers_crc_capture(9000, &SMALL_9000);
}

fn markers_crc_capture(mtu: usize, sizes: &'static [usize]) {
    if !is_root() {
        return;
    }
    let pcap = std::env::temp_dir().join(format!("iwarp-xdp-mk-{mtu}-{}.pcap", std::process::id()));
    let o = Opts {
        pcap: Some(pcap.clone()),
        markers: true,
        sizes,
        ..Opts::new(mtu)
    };
    pair(Kind::Xdp, Kind::Xdp, o);
    if !tshark_ready(&pcap) {
        return;
    }
    let r = iwarp_capture::tshark::analyze(&pcap).expect("tshark");
    drop_capture(&pcap);
    println!("tshark: {r:?}");
    // Every size is written, read (request and response) and sent.
    assert!(r.fpdus >= 4 * sizes.len(), "{} FPDUs", r.fpdus);
    assert_eq!(
        (r.good_crc, r.bad_crc, r.crc_absent),
        (r.fpdus, 0, 0),
        "{r:?}"
    );
    assert_eq!(r.malformed, 0, "{r:?}");
    assert!(r.expert_errors.is_empty(), "{:?}", r.expert_errors);
    for op in ["Send", "Write", "Read Request", "Read Response"] {
        assert!(r.opcodes.iter().any(|o| o.contains(op)), "no {op}: {r:?}");
    }
}

/// FPDU alignment (RFC 5044 §8): in the AF_XDP client's capture of the
/// Write/Read/Send round, 1 B to 1 MiB, CRC on, tshark decodes the FPDUs
/// also with TCP reassembly off, segment by segment, because each segment
/// starts with an FPDU and holds whole ones, both directions. Congestion
/// control is the default, Reno (segments are queued within its window,
/// slow start included), and the transmit rings do not wrap (smoltcp cuts
/// a segment at the ring's end); what may still split an FPDU is a
/// retransmission (smoltcp re-cuts at the MSS). Markers are off here:
/// tshark miscounts the markers of an FPDU that ends right where a marker
/// is due, which aligned segments meet all the time (the markers test
/// above keeps to messages of one FPDU).
#[test]
fn xdp_to_xdp_segments_hold_whole_fpdus() {
    if !is_root() {
        return;
    }
    let pcap = std::env::temp_dir().join(format!("iwarp-xdp-al-{}.pcap", std::process::id()));
    // A transmit ring larger than the run sends, so that it never wraps:
    // tshark's reassembly can lose an FPDU split at the wrap.
    let tcp = iwarp_tcp::Config {
        tx_buffer: 4 << 20,
        ..iwarp_tcp::Config::default()
    };
    let o = Opts {
        pcap: Some(pcap.clone()),
        tcp,
        ..Opts::new(1500)
    };
    pair(Kind::Xdp, Kind::Xdp, o);
    if !tshark_ready(&pcap) {
        return;
    }
    let whole = iwarp_capture::tshark::analyze(&pcap).expect("tshark");
    let alone = iwarp_capture::tshark::analyze_segments(&pcap).expect("tshark");
    let resent =
        iwarp_capture::tshark::count(&pcap, "tcp.analysis.retransmission").expect("tshark");
    drop_capture(&pcap);
    println!(
        "{} of {} FPDUs decode segment by segment; {resent} retransmissions",
        alone.fpdus, whole.fpdus
    );
    let bytes: usize = SIZES.iter().sum();
    assert!(whole.fpdus >= 3 * bytes / 1460, "{whole:?}");
    assert_eq!(
        (whole.good_crc, whole.bad_crc),
        (whole.fpdus, 0),
        "{whole:?}"
    );
    assert_eq!((alone.bad_crc, alone.malformed), (0, 0), "{alone:?}");
    // Writes and Sends one way, Read Responses the other.
    let wraps = 3 * bytes / tcp.tx_buffer + 2;
    assert!(
        whole.fpdus - alone.fpdus <= wraps + resent,
        "{} FPDUs split (ring wraps {wraps}, retransmissions {resent})",
        whole.fpdus - alone.fpdus
    );
}

#[test]
fn xdp_client_kernel_server() {
    if !is_root() {
        return;
    }
    let pcap = std::env::temp_dir().join(format!("iwarp-xdp-{}.pcap", std::process::id()));
    let o = Opts {
        pcap: Some(pcap.clone()),
        ..Opts::new(1500)
    };
    pair(Kind::Kernel, Kind::Xdp, o);
    // The capture: a pcap header and the frames, among them the MPA
    // request (its key starts the stream of the connection).
    let bytes = std::fs::read(&pcap).expect("capture written");
    let _ = std::fs::remove_file(&pcap);
    assert_eq!(bytes.get(..4), Some(&0xa1b2_c3d4u32.to_le_bytes()[..]));
    assert!(
        bytes.len() > 24 + (1 << 20),
        "{} bytes captured",
        bytes.len()
    );
    let key = b"MPA ID Req Frame";
    assert!(bytes.windows(key.len()).any(|w| w == key), "no MPA request");
}

#[test]
fn kernel_client_xdp_server() {
    if !is_root() {
        return;
    }
    let o = Opts {
        close_listener: true,
        ..Opts::new(1500)
    };
    pair(Kind::Xdp, Kind::Kernel, o);
}

/// A kernel TCP client to an AF_XDP server in generic mode: the kernel's
/// segments reach the engine through the receiving stack's generic XDP
/// hook instead of veth's NAPI (the topology has TSO/GSO off, which
/// generic mode needs: its frames hold one MTU).
#[test]
fn kernel_client_xdp_server_generic_mode() {
    if !is_root() {
        return;
    }
    let o = Opts {
        attach: AttachMode::Generic,
        ..Opts::new(1500)
    };
    pair(Kind::Xdp, Kind::Kernel, o);
}

/// The AF_XDP engine's connections outside the core's hands that have
/// nothing to do cost its passes nothing: kernel clients whose MPA
/// request does not come, and rejected ones that neither read on nor
/// close (the engine lingers on them until the FIN exchange finishes or
/// its deadline), are visited when the stack lists them active, not by
/// every pass (`Stats::lifecycle_visits`). Frames still arriving during
/// the idle passes (a peer's delayed ACK) or a deadline passing (a
/// machine stalled for seconds) account for a few visits per connection
/// at most; the bounds allow that and no more.
#[test]
fn xdp_idle_handshakes_and_lingering_are_not_visited_per_pass() {
    if !is_root() {
        return;
    }
    const N: usize = 16;
    const PASSES: usize = 200;
    let topo = Topo::up(1500, Some(IP_A), None, 1);
    let (step_tx, step_rx) = mpsc::channel::<&'static str>();
    let (done_tx, done_rx) = mpsc::channel::<&'static str>();
    let srv = spawn_in(&topo.b, move || {
        let o = Opts::new(1500);
        let dev = Device::open(
            backend(Kind::Xdp, "xb", IP_B, &o, None),
            DeviceConfig {
                progress: Progress::Manual,
                seed: None,
                busy_poll: false,
            },
        )
        .expect("open device");
        let l = dev
            .listen(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT))
            .expect("listen");
        let visits = || dev.stats().lifecycle_visits;
        // Drive the device until the client reports `what`.
        let until = |what: &str| {
            let end = Instant::now() + WAIT;
            loop {
                match step_rx.try_recv() {
                    Ok(s) => {
                        assert_eq!(s, what);
                        return;
                    }
                    Err(mpsc::TryRecvError::Empty) => {}
                    Err(e) => panic!("{what}: {e}"),
                }
                assert!(Instant::now() < end, "{what}");
                if dev.progress() == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        };
        // Let late frames (delayed ACKs) arrive and be handled.
        let settle = || {
            let end = Instant::now() + Duration::from_millis(300);
            while Instant::now() < end {
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
        until("connected");
        settle();
        let added = idle_passes();
        assert!(
            added <= 2 * N as u64,
            "{N} idle handshakes: {added} visits in {PASSES} passes"
        );
        done_tx.send("measured").unwrap();
        for _ in 0..N {
            let req = l.get_request(Some(WAIT)).expect("request");
            req.reject(b"no").unwrap();
        }
        until("rejected");
        settle();
        let added = idle_passes();
        assert!(
            added <= 4 * N as u64,
            "{N} idle handshakes and {N} lingering rejects: {added} visits in {PASSES} passes"
        );
        done_tx.send("measured").unwrap();
    });
    let cli = spawn_in(&topo.a, move || {
        use std::io::{Read, Write};
        let addr = SocketAddr::new(IP_B.into(), PORT);
        let connect = || std::net::TcpStream::connect_timeout(&addr, WAIT).expect("connect");
        let silent: Vec<_> = (0..N).map(|_| connect()).collect();
        step_tx.send("connected").unwrap();
        assert_eq!(done_rx.recv_timeout(WAIT), Ok("measured"));
        let mut request = b"MPA ID Req Frame".to_vec();
        request.extend([0x40, 1, 0, 0]);
        let mut rejected: Vec<_> = (0..N)
            .map(|_| {
                let mut s = connect();
                s.write_all(&request).unwrap();
                s
            })
            .collect();
        for s in &mut rejected {
            s.set_read_timeout(Some(WAIT)).unwrap();
            let mut reply = [0u8; 20];
            s.read_exact(&mut reply).expect("reject reply");
            assert_eq!(&reply[..16], b"MPA ID Rep Frame");
        }
        step_tx.send("rejected").unwrap();
        assert_eq!(done_rx.recv_timeout(WAIT), Ok("measured"));
        drop((silent, rejected));
    });
    cli.join().expect("client");
    srv.join().expect("server");
}

/// Connections the application dropped while their kernel peer keeps
/// them half-open (it takes our FIN but neither reads nor closes) cost
/// the AF_XDP engine's passes nothing: each is visited when the stack
/// lists it active or when its linger deadline is due
/// (`Stats::lifecycle_visits` counts visits of dropped connections), and
/// the deadline's visit resets it and destroys its QP.
#[test]
fn xdp_dropped_connections_still_closing_are_not_visited_per_pass() {
    if !is_root() {
        return;
    }
    const N: usize = 16;
    const PASSES: usize = 200;
    let topo = Topo::up(1500, Some(IP_A), None, 1);
    let (step_tx, step_rx) = mpsc::channel::<&'static str>();
    let (done_tx, done_rx) = mpsc::channel::<&'static str>();
    let srv = spawn_in(&topo.b, move || {
        let o = Opts::new(1500);
        let dev = Device::open(
            backend(Kind::Xdp, "xb", IP_B, &o, None),
            DeviceConfig {
                progress: Progress::Manual,
                seed: None,
                busy_poll: false,
            },
        )
        .expect("open device");
        let l = dev
            .listen(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT))
            .expect("listen");
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(1024);
        let visits = || dev.stats().lifecycle_visits;
        let until = |what: &str, done: &dyn Fn() -> bool| {
            let end = Instant::now() + WAIT;
            while !done() {
                assert!(Instant::now() < end, "{what}");
                if dev.progress() == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        };
        // Let late frames (the peers' ACKs of our FIN) arrive and be
        // handled.
        let settle = || {
            let end = Instant::now() + Duration::from_millis(300);
            while Instant::now() < end {
                dev.progress();
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        let qps: Vec<Qp> = (0..N)
            .map(|_| {
                let req = l.get_request(Some(WAIT)).expect("request");
                req.accept(init(&cq, &pd), ConnParams::default())
                    .expect("accept")
            })
            .collect();
        until("every reply delivered", &|| step_rx.try_recv().is_ok());
        drop(qps);
        settle();
        assert_eq!(
            dev.stats().connections,
            N,
            "the dropped connections are still closing"
        );
        let before = visits();
        for _ in 0..PASSES {
            dev.progress();
        }
        let added = visits() - before;
        assert!(
            added <= 2 * N as u64,
            "{N} dropped connections still closing: {added} visits in {PASSES} passes"
        );
        until("every dropped connection reaped at its deadline", &|| {
            dev.stats().connections == 0
        });
        done_tx.send("reaped").unwrap();
    });
    let cli = spawn_in(&topo.a, move || {
        use std::io::{Read, Write};
        let addr = SocketAddr::new(IP_B.into(), PORT);
        let mut request = b"MPA ID Req Frame".to_vec();
        request.extend([0x40, 1, 0, 0]);
        let mut clients: Vec<_> = (0..N)
            .map(|_| {
                let mut s = std::net::TcpStream::connect_timeout(&addr, WAIT).expect("connect");
                s.write_all(&request).unwrap();
                s
            })
            .collect();
        for s in &mut clients {
            s.set_read_timeout(Some(WAIT)).unwrap();
            let mut reply = [0u8; 20];
            s.read_exact(&mut reply).expect("accept reply");
            assert_eq!(&reply[..16], b"MPA ID Rep Frame");
        }
        step_tx.send("replied").unwrap();
        // Half-open until the server reaped every connection.
        assert_eq!(done_rx.recv_timeout(2 * WAIT), Ok("reaped"));
        drop(clients);
    });
    cli.join().expect("client");
    srv.join().expect("server");
}

/// The AF_XDP device verifies TCP checksums itself (smoltcp does not check
/// them again): a SYN whose checksum is wrong, sent from a raw socket, is
/// counted and dropped before the stack (no half-open connection, nothing
/// to accept), while a kernel TCP client's connection to the same port
/// (veth may leave its checksums partial: finished on receive) carries
/// its bytes intact.
#[test]
fn xdp_device_drops_segments_whose_checksum_fails() {
    use iwarp_tcp::smoltcp::phy::ChecksumCapabilities;
    use iwarp_tcp::smoltcp::wire::{IpAddress, TcpControl, TcpPacket, TcpRepr, TcpSeqNumber};
    use nix::sys::socket::{
        sendto, socket, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn,
    };
    use std::io::Write;
    use std::net::SocketAddrV4;
    use std::os::fd::AsRawFd;
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    const P: u16 = 7175;
    let topo = Topo::up(1500, Some(IP_A), Some(IP_B), 1);
    let (up_tx, up_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let want = pattern(100_000, 9);
    let expect = want.clone();
    let server = spawn_in(&topo.b, move || {
        let mut raw =
            RawTcp::open(&XdpConfig::new("xb", IP_B, 24), &[P]).expect("AF_XDP TCP on xb");
        raw.stack().listen(P).expect("listen");
        up_tx.send(()).unwrap();
        // The corrupt SYN: counted, and the stack never sees it (no frame
        // in, no SYN-ACK out, no connection). Only frames steered to the
        // engine (ARP for its address, TCP to it) reach it, and the
        // client's ARP exchange is over before its SYN leaves.
        let until = Instant::now() + WAIT;
        let mut before = raw.stack().counters();
        while raw.ring_counters().rx_csum_bad == 0 && Instant::now() < until {
            before = raw.stack().counters();
            raw.poll();
        }
        assert_eq!(raw.ring_counters().rx_csum_bad, 1, "the corrupt SYN");
        for _ in 0..100 {
            raw.poll();
        }
        let after = raw.stack().counters();
        assert_eq!(after.rx_frames, before.rx_frames, "frames the stack got");
        assert_eq!(after.tx_frames, before.tx_frames, "frames the stack sent");
        assert_eq!(raw.stack().half_open(P), 0);
        assert!(raw.stack().accept(P).is_none());
        go_tx.send(()).unwrap();
        // The kernel client's bytes.
        let mut got = Vec::new();
        let mut conn = None;
        let until = Instant::now() + WAIT;
        while got.len() < expect.len() && Instant::now() < until {
            raw.poll();
            conn = conn.or_else(|| raw.stack().accept(P));
            if let Some(c) = conn {
                let _ = raw.stack().recv(c, |b| {
                    got.extend_from_slice(b);
                    b.len()
                });
            }
        }
        assert!(
            got == expect,
            "{} of {} bytes, or different",
            got.len(),
            expect.len()
        );
        raw.ring_counters()
    });
    up_rx.recv_timeout(WAIT).expect("server up");
    let client = spawn_in(&topo.a, move || {
        let fd = socket(
            AddressFamily::Inet,
            SockType::Raw,
            SockFlag::empty(),
            SockProtocol::Tcp,
        )
        .expect("raw socket");
        let syn = TcpRepr {
            src_port: 40000,
            dst_port: P,
            control: TcpControl::Syn,
            seq_number: TcpSeqNumber(1),
            ack_number: None,
            window_len: 1024,
            window_scale: None,
            max_seg_size: Some(1460),
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload: &[],
        };
        let mut seg = vec![0; syn.header_len()];
        let mut packet = TcpPacket::new_unchecked(&mut seg[..]);
        let (a, b) = (IpAddress::Ipv4(IP_A), IpAddress::Ipv4(IP_B));
        syn.emit(&mut packet, &a, &b, &ChecksumCapabilities::default());
        let bad = packet.checksum() ^ 0x0101;
        packet.set_checksum(bad);
        let to = SockaddrIn::from(SocketAddrV4::new(IP_B, P));
        sendto(fd.as_raw_fd(), &seg, &to, MsgFlags::empty()).expect("send the SYN");
        go_rx.recv_timeout(WAIT).expect("the corrupt SYN dropped");
        let mut s = std::net::TcpStream::connect((IP_B, P)).expect("connect");
        s.write_all(&want).expect("write");
    });
    client.join().expect("client");
    let counters = server.join().expect("server");
    println!(
        "segments with a partial checksum finished: {}",
        counters.rx_csum_completed
    );
}
