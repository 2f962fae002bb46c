//! Many connections on one AF_XDP engine: thousands of clients (on an
//! AF_XDP device of their own) each connect (MPA exchange included), send a message the server
//! checks and echoes with its own, and check the echo. The server's engine
//! finds each frame's connection through its flow table and visits only
//! the connections with work, so its passes stay short however many are
//! open; the test checks the data and the counts, never the timing.
//!
//! `IWARP_SCALE_CONNS` sets the connection count (default 4096). Needs
//! root; without it the test prints a note and returns.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{mpsc, Arc, Barrier};
use std::time::Duration;

use iwarp_engine::xdp::AttachMode;
use iwarp_engine::{
    Access, Backend, ConnParams, Cq, Device, DeviceConfig, Pd, Progress, QpInit, RecvWr, SendOp,
    SendWr, Stats, WcOpcode, WcStatus, XdpConfig, EMPTY_WC,
};

use common::{is_root, pattern, spawn_in, Topo, IP_A, IP_B};

const WAIT: Duration = Duration::from_secs(60);

/// The tests of this file one at a time: each loads both cores, and one
/// measures the process's resident memory.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
const LEN: usize = 64;
const PORT: u16 = 7174;

fn conns() -> usize {
    std::env::var("IWARP_SCALE_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096)
}

/// The message of connection `idx` (`echo`: the server's answer): its
/// index, then a pattern of its own.
fn msg(idx: usize, echo: bool) -> Vec<u8> {
    let mut m = pattern(LEN, (idx as u8) ^ if echo { 0x5a } else { 0 });
    m[..4].copy_from_slice(&(idx as u32).to_be_bytes());
    m[4] = u8::from(echo);
    m
}

fn init(pd: &Pd, cq: &Cq) -> QpInit {
    QpInit {
        pd: pd.clone(),
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        sq_depth: 4,
        rq_depth: 2,
        sig_all: false,
        srq: None,
    }
}

/// Post connection `idx`'s Send of `sge`.
fn send(qp: &iwarp_engine::Qp, idx: usize, sge: iwarp_engine::Sge) {
    qp.post_send(&SendWr {
        wr_id: idx as u64,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl: &[sge],
        signaled: true,
    })
    .unwrap();
}

/// Wait until `want` Recv and `want` Send completions arrived on `cq`;
/// `on_recv` checks each receive (its `wr_id` is the connection index).
fn complete(cq: &Cq, want: usize, mut on_recv: impl FnMut(usize)) {
    let (mut recvs, mut sends) = (0, 0);
    let mut wcs = [EMPTY_WC; 64];
    while recvs < want || sends < want {
        let n = cq.wait(&mut wcs, Some(WAIT));
        assert!(
            n > 0,
            "no completion within {WAIT:?} ({recvs} recvs, {sends} sends)"
        );
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            match wc.opcode {
                WcOpcode::Recv => {
                    assert_eq!(wc.byte_len as usize, LEN);
                    on_recv(wc.wr_id as usize);
                    recvs += 1;
                }
                WcOpcode::Send => sends += 1,
                other => panic!("unexpected completion {other:?}"),
            }
        }
    }
}

/// An AF_XDP device on veth `dev` with small socket buffers (a few
/// segments each), its progress thread sleeping when idle.
fn open_xdp(dev: &str, ip: Ipv4Addr) -> Device {
    let mut c = XdpConfig::new(dev, ip, 24);
    c.attach = AttachMode::Native;
    c.busy_poll = false;
    c.tcp.rx_buffer = 16 * 1024;
    c.tcp.tx_buffer = 16 * 1024;
    let cfg = DeviceConfig {
        progress: Progress::Thread { cpu: None },
        seed: None,
        busy_poll: false,
    };
    Device::open(Backend::AfXdp(c), cfg).expect("open AF_XDP device")
}

fn serve(n: usize, up: mpsc::Sender<SocketAddr>, done: Arc<Barrier>) -> Stats {
    let dev = open_xdp("xb", IP_B);
    let l = dev
        .listen(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT))
        .expect("listen");
    up.send(SocketAddr::new(IP_B.into(), PORT)).unwrap();
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(2 * n + 64);
    let recv = dev.reg_mr(&pd, n * LEN, Access::LOCAL_WRITE).unwrap();
    let out = dev.reg_mr(&pd, n * LEN, Access::LOCAL_WRITE).unwrap();
    let mut qps: Vec<Option<iwarp_engine::Qp>> = (0..n).map(|_| None).collect();
    for k in 0..n {
        let req = l
            .get_request(Some(WAIT))
            .unwrap_or_else(|e| panic!("request {k} of {n}: {e:?}, stats {:?}", dev.stats()));
        let idx = u32::from_be_bytes(req.private_data()[..4].try_into().unwrap()) as usize;
        assert!(idx < n && qps[idx].is_none(), "connection {idx} twice");
        let rwr = RecvWr {
            wr_id: idx as u64,
            sgl: &[recv.sge(idx * LEN, LEN)],
        };
        let qp = req
            .accept_with_recvs(init(&pd, &cq), ConnParams::default(), &[rwr])
            .expect("accept");
        qps[idx] = Some(qp);
    }
    assert_eq!(dev.stats().connections, n);
    complete(&cq, n, |idx| {
        let mut got = vec![0; LEN];
        recv.read(idx * LEN, &mut got);
        assert!(
            got == msg(idx, false),
            "connection {idx}: the message differs"
        );
        out.write(idx * LEN, &msg(idx, true));
        send(
            qps[idx].as_ref().expect("a QP"),
            idx,
            out.sge(idx * LEN, LEN),
        );
    });
    let stats = dev.stats();
    // The clients checked their echoes.
    done.wait();
    drop(qps);
    drop(l);
    stats
}

fn clients(n: usize, addr: SocketAddr, done: Arc<Barrier>) {
    let dev = open_xdp("xa", IP_A);
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(2 * n + 64);
    let recv = dev.reg_mr(&pd, n * LEN, Access::LOCAL_WRITE).unwrap();
    let out = dev.reg_mr(&pd, n * LEN, Access::LOCAL_WRITE).unwrap();
    let mut qps = Vec::with_capacity(n);
    for idx in 0..n {
        out.write(idx * LEN, &msg(idx, false));
        let params = ConnParams {
            private_data: (idx as u32).to_be_bytes().to_vec(),
            ..ConnParams::default()
        };
        let rwr = RecvWr {
            wr_id: idx as u64,
            sgl: &[recv.sge(idx * LEN, LEN)],
        };
        let qp = dev
            .connect_with_recvs(addr, init(&pd, &cq), params, &[rwr])
            .unwrap_or_else(|e| panic!("connection {idx}: {e:?}"));
        send(&qp, idx, out.sge(idx * LEN, LEN));
        qps.push(qp);
    }
    complete(&cq, n, |idx| {
        let mut got = vec![0; LEN];
        recv.read(idx * LEN, &mut got);
        assert!(got == msg(idx, true), "connection {idx}: the echo differs");
    });
    done.wait();
}

#[test]
fn thousands_of_connections_to_one_engine_each_move_verified_data() {
    if !is_root() {
        return;
    }
    let _one = serial();
    let n = conns();
    let topo = Topo::up(1500, Some(IP_A), Some(IP_B), 1);
    let (up_tx, up_rx) = mpsc::channel();
    let done = Arc::new(Barrier::new(2));
    let d = done.clone();
    let server = spawn_in(&topo.b, move || serve(n, up_tx, d));
    let addr = up_rx.recv_timeout(WAIT).expect("server up");
    let client = spawn_in(&topo.a, move || clients(n, addr, done));
    client.join().expect("clients");
    let stats = server.join().expect("server");
    let tcp = stats.tcp.expect("AF_XDP counters");
    println!(
        "{n} connections: {} accepted, {} engine passes, {} connection visits, {} frames in, {} frames to the control interface",
        tcp.accepted, stats.passes, tcp.conn_visits, tcp.rx_frames, tcp.control_frames
    );
    assert_eq!(stats.connections, n);
    assert_eq!(tcp.accepted, n as u64);
    assert_eq!(
        tcp.half_open_evicted + tcp.backlog_full + tcp.flow_table_full,
        0
    );
}

fn cycles() -> usize {
    std::env::var("IWARP_SCALE_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// This process's resident memory, in KiB.
fn rss_kib() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// What a server holds: objects of the core, connections of the engine,
/// of its TCP and of its flow table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    live: iwarp_engine::HandleCounts,
    connections: usize,
    tcp_connections: usize,
    flows: usize,
}

fn held(dev: &Device) -> Held {
    let s = dev.stats();
    Held {
        live: s.live,
        connections: s.connections,
        tcp_connections: s.engines.iter().map(|e| e.tcp_connections).sum(),
        flows: s.engines.iter().map(|e| e.flows).sum(),
    }
}

/// Wait (bounded) until `dev` holds `want`.
fn settle(dev: &Device, want: Held) -> Held {
    let until = std::time::Instant::now() + WAIT;
    loop {
        let h = held(dev);
        if h == want || std::time::Instant::now() > until {
            return h;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Serve connections one at a time until the client says stop: each gets
/// its own PD, CQ, regions and QP, receives the client's message, echoes
/// it, and is dropped once the client disconnected. Reports what the
/// device holds once idle after `warm` connections and after all.
fn serve_cycles(
    up: mpsc::Sender<SocketAddr>,
    marks: mpsc::Receiver<()>,
    report: mpsc::Sender<(Held, usize)>,
) {
    let dev = open_xdp("xb", IP_B);
    let l = dev
        .listen(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT))
        .expect("listen");
    let idle = held(&dev);
    up.send(SocketAddr::new(IP_B.into(), PORT)).unwrap();
    loop {
        // The client asks for a report between its connections.
        if marks.try_recv().is_ok() {
            let h = settle(&dev, idle);
            report.send((h, rss_kib())).unwrap();
            continue;
        }
        let req = match l.get_request(Some(Duration::from_millis(50))) {
            Ok(r) => r,
            Err(_) => {
                if std::thread::panicking() {
                    return;
                }
                match marks.try_recv() {
                    Ok(()) => {
                        let h = settle(&dev, idle);
                        report.send((h, rss_kib())).unwrap();
                        continue;
                    }
                    Err(mpsc::TryRecvError::Disconnected) => return,
                    Err(mpsc::TryRecvError::Empty) => continue,
                }
            }
        };
        let idx = u32::from_be_bytes(req.private_data()[..4].try_into().unwrap()) as usize;
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(8);
        let recv = dev.reg_mr(&pd, LEN, Access::LOCAL_WRITE).unwrap();
        let out = dev.reg_mr(&pd, LEN, Access::LOCAL_WRITE).unwrap();
        let rwr = RecvWr {
            wr_id: idx as u64,
            sgl: &[recv.sge(0, LEN)],
        };
        let qp = req
            .accept_with_recvs(init(&pd, &cq), ConnParams::default(), &[rwr])
            .expect("accept");
        complete(&cq, 1, |i| {
            assert_eq!(i, idx);
            let mut got = vec![0; LEN];
            recv.read(0, &mut got);
            assert!(
                got == msg(idx, false),
                "connection {idx}: the message differs"
            );
            out.write(0, &msg(idx, true));
            send(&qp, idx, out.sge(0, LEN));
        });
        // The client disconnects once it checked the echo.
        loop {
            match qp.wait_event(WAIT) {
                Some(iwarp_engine::CmEvent::Disconnected) => break,
                Some(_) => {}
                None => panic!("connection {idx}: no disconnect"),
            }
        }
    }
}

/// One connection: connect, send the message, check the echo, disconnect.
fn cycle(dev: &Device, addr: SocketAddr, idx: usize) {
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(8);
    let recv = dev.reg_mr(&pd, LEN, Access::LOCAL_WRITE).unwrap();
    let out = dev.reg_mr(&pd, LEN, Access::LOCAL_WRITE).unwrap();
    out.write(0, &msg(idx, false));
    let params = ConnParams {
        private_data: (idx as u32).to_be_bytes().to_vec(),
        ..ConnParams::default()
    };
    let rwr = RecvWr {
        wr_id: idx as u64,
        sgl: &[recv.sge(0, LEN)],
    };
    let qp = dev
        .connect_with_recvs(addr, init(&pd, &cq), params, &[rwr])
        .unwrap_or_else(|e| panic!("connection {idx}: {e:?}"));
    send(&qp, idx, out.sge(0, LEN));
    complete(&cq, 1, |i| {
        assert_eq!(i, idx);
        let mut got = vec![0; LEN];
        recv.read(0, &mut got);
        assert!(got == msg(idx, true), "connection {idx}: the echo differs");
    });
    qp.disconnect();
    loop {
        match qp.wait_event(WAIT) {
            Some(iwarp_engine::CmEvent::Disconnected) => break,
            Some(_) => {}
            None => panic!("connection {idx}: no disconnect"),
        }
    }
}

/// 20,000 connect / verify / disconnect cycles against one server: once
/// its connections are gone, the server holds what it held before (core
/// objects, engine, TCP and flow-table entries: exactly), and the
/// process's resident memory is back within a stated tolerance of what
/// it was after a warm-up (allocator pools, the tables' high-water
/// slots).
#[test]
fn a_server_returns_to_its_baseline_after_thousands_of_connections() {
    if !is_root() {
        return;
    }
    /// Resident memory the process may have gained over the whole run:
    /// far below what one retained byte per connection of the run's
    /// connections' buffers would cost (each has 32 KiB of socket
    /// buffers on each side).
    const TOLERANCE_KIB: usize = 8 * 1024;
    let _one = serial();
    let total = cycles();
    let warm = (total / 10).max(1);
    let topo = Topo::up(1500, Some(IP_A), Some(IP_B), 1);
    let (up_tx, up_rx) = mpsc::channel();
    let (mark_tx, mark_rx) = mpsc::channel();
    let (report_tx, report_rx) = mpsc::channel();
    let server = spawn_in(&topo.b, move || serve_cycles(up_tx, mark_rx, report_tx));
    let addr = up_rx.recv_timeout(WAIT).expect("server up");
    let client = spawn_in(&topo.a, move || {
        let dev = open_xdp("xa", IP_A);
        let mut reports = Vec::new();
        for idx in 0..total {
            if idx == warm {
                mark_tx.send(()).unwrap();
                reports.push(report_rx.recv_timeout(WAIT).expect("report"));
            }
            cycle(&dev, addr, idx);
        }
        mark_tx.send(()).unwrap();
        reports.push(report_rx.recv_timeout(WAIT).expect("report"));
        let client_held = settle(
            &dev,
            Held {
                live: dev.stats().live,
                connections: 0,
                tcp_connections: 0,
                flows: 0,
            },
        );
        (reports, client_held)
    });
    let (reports, client_held) = client.join().expect("client");
    server.join().expect("server");
    let ((base, base_rss), (end, end_rss)) = (reports[0], reports[1]);
    println!(
        "{total} connections: server {base:?} after {warm}, {end:?} at the end; \
         RSS {base_rss} KiB after {warm}, {end_rss} KiB at the end"
    );
    assert_eq!(end, base, "the server holds what it held after the warm-up");
    assert_eq!(end.connections + end.tcp_connections + end.flows, 0);
    assert_eq!(client_held.connections + client_held.tcp_connections, 0);
    assert!(
        end_rss <= base_rss + TOLERANCE_KIB,
        "RSS grew from {base_rss} KiB to {end_rss} KiB over {} connections",
        total - warm
    );
}

/// The Ethernet address of `dev` in namespace `ns`.
fn mac_in(topo: &Topo, ns: &str, dev: &str) -> [u8; 6] {
    let show = topo.link(ns, dev);
    let hex = show
        .split("link/ether ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .expect("link/ether");
    let mut mac = [0; 6];
    for (b, h) in mac.iter_mut().zip(hex.split(':')) {
        *b = u8::from_str_radix(h, 16).expect("hex");
    }
    mac
}

/// SYNs from an address that never answers (a user-space TCP on its own
/// AF_XDP socket that sends and never reads), in bursts, until `stop`.
/// Returns how many were sent.
fn flood(server_mac: [u8; 6], stop: Arc<std::sync::atomic::AtomicBool>) -> usize {
    use std::sync::atomic::Ordering;
    let flooder = Ipv4Addr::new(198, 18, 0, 77);
    let mut c = XdpConfig::new("xa", flooder, 24);
    c.tcp.rx_buffer = 4096;
    c.tcp.tx_buffer = 4096;
    c.frames = 1024;
    let mut raw = iwarp_engine::xdp::RawTcp::open(&c, &[]).expect("flooder");
    let stack = raw.stack();
    stack.add_neighbor(IP_B, iwarp_tcp::smoltcp::wire::EthernetAddress(server_mac));
    let mut sent = 0;
    let mut port = 1024u16;
    while !stop.load(Ordering::SeqCst) {
        let mut burst = Vec::new();
        for _ in 0..64 {
            port = if port == u16::MAX { 1024 } else { port + 1 };
            if let Ok(id) = raw.stack().connect((IP_B, PORT), port) {
                burst.push(id);
            }
        }
        raw.transmit();
        for id in burst {
            let _ = raw.stack().release(id);
            sent += 1;
        }
        // About 6,000 SYNs a second: the half-open limit holds 1024, some
        // 170 ms of them, far longer than a handshake on a loaded machine.
        std::thread::sleep(Duration::from_millis(10));
    }
    sent
}

/// A flood of SYNs that never complete: the listening engine keeps at most
/// its half-open limit, dropping the oldest, and a client connects (MPA
/// exchange, a message and its echo checked) while the flood goes on.
#[test]
fn a_legitimate_client_connects_during_a_half_open_flood() {
    use std::sync::atomic::{AtomicBool, Ordering};
    if !is_root() {
        return;
    }
    let _one = serial();
    let topo = Topo::up(1500, Some(IP_A), Some(IP_B), 1);
    let server_mac = mac_in(&topo, &topo.b, "xb");
    let (up_tx, up_rx) = mpsc::channel();
    let (mark_tx, mark_rx) = mpsc::channel::<()>();
    let (report_tx, report_rx) = mpsc::channel();
    let server = spawn_in(&topo.b, move || {
        let dev = open_xdp("xb", IP_B);
        let l = dev
            .listen(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT))
            .expect("listen");
        up_tx.send(()).unwrap();
        // Wait until the flood is under way and has filled the half-open
        // list several times over.
        let until = std::time::Instant::now() + WAIT;
        loop {
            let t = dev.stats().tcp.expect("AF_XDP counters");
            if t.half_open_evicted > 4096 || std::time::Instant::now() > until {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        mark_tx.send(()).unwrap();
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(8);
        let recv = dev.reg_mr(&pd, LEN, Access::LOCAL_WRITE).unwrap();
        let out = dev.reg_mr(&pd, LEN, Access::LOCAL_WRITE).unwrap();
        let req = l.get_request(Some(WAIT)).expect("the client's request");
        let rwr = RecvWr {
            wr_id: 0,
            sgl: &[recv.sge(0, LEN)],
        };
        let qp = req
            .accept_with_recvs(init(&pd, &cq), ConnParams::default(), &[rwr])
            .expect("accept");
        complete(&cq, 1, |_| {
            let mut got = vec![0; LEN];
            recv.read(0, &mut got);
            assert!(got == msg(0, false), "the message differs");
            out.write(0, &msg(0, true));
            send(&qp, 0, out.sge(0, LEN));
        });
        let stats = dev.stats();
        report_tx.send(()).unwrap();
        qp.wait_event(WAIT);
        stats
    });
    up_rx.recv_timeout(WAIT).expect("server up");
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let flooder = spawn_in(&topo.a, move || flood(server_mac, s));
    mark_rx.recv_timeout(WAIT).expect("flood under way");
    let client = spawn_in(&topo.a, move || {
        let cfg = DeviceConfig {
            progress: Progress::Thread { cpu: None },
            seed: None,
            busy_poll: false,
        };
        let dev = Device::open(Backend::Kernel, cfg).expect("open kernel device");
        cycle(&dev, SocketAddr::new(IP_B.into(), PORT), 0);
    });
    let client_result = client.join();
    let _ = report_rx.recv_timeout(WAIT);
    stop.store(true, Ordering::SeqCst);
    let syns = flooder.join().expect("flooder");
    client_result.expect("client");
    let stats = server.join().expect("server");
    let tcp = stats.tcp.expect("AF_XDP counters");
    let half_open: usize = stats.engines.iter().map(|e| e.tcp_connections).sum();
    println!(
        "{syns} flood SYNs; server: {} half-open evicted, {} connections held at the end, {} accepted",
        tcp.half_open_evicted, half_open, tcp.accepted
    );
    assert!(tcp.half_open_evicted > 4096);
    // The half-open limit plus the client's connection.
    assert!(half_open <= iwarp_tcp::Config::default().half_open + 1);
}
