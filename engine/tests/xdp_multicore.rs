//! Multi-core AF_XDP devices (one engine per receive queue) over a veth
//! pair with two queues per end (`scripts/lib/topology.sh up ... 2`):
//! several connections, each doing RDMA Write, Read and Send (both
//! directions) verified byte for byte; the connections must land on both
//! engines, and no XDP program may be left once the devices are dropped.
//!
//! Needs root; without it every test prints a note and returns. Every
//! wait is bounded; nothing asserts timing (throughput lines are
//! informational).

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::{mpsc, Arc, Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};

use iwarp_engine::xdp::AttachMode;
use iwarp_engine::{
    Access, Backend, ConnParams, Cq, Device, DeviceConfig, Progress, Qp, QpInit, RecvWr, SendOp,
    SendWr, Stats, WcOpcode, WcStatus, WorkCompletion, XdpConfig, EMPTY_WC,
};

use common::{is_root, pattern, spawn_in, Topo, IP_A, IP_B};

const WAIT: Duration = Duration::from_secs(20);
const SIZES: [usize; 4] = [1, 1000, 16 * 1024 + 3, 65537];
const MR_LEN: usize = 128 * 1024;
const PORT: u16 = 7174;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// AF_XDP with this many engines (queues 0..n).
    Xdp(u32),
    Kernel,
}

/// A device of `kind` on veth `dev`, its progress thread (engine 0's)
/// pinned to `cpu` and, with `pin_engines`, AF_XDP engine i to core i.
fn open_on(kind: Kind, dev: &str, ip: Ipv4Addr, cpu: Option<usize>, pin_engines: bool) -> Device {
    let backend = match kind {
        Kind::Kernel => Backend::Kernel,
        Kind::Xdp(n) => {
            let mut c = XdpConfig::new(dev, ip, 24);
            c.attach = AttachMode::Native;
            // Measurements only: IWARP_MC_BUSY=1 busy-polls; IWARP_MC_PIN
            // pins engine i to core i on the client, core 1 - i (`cross`)
            // or i (`same`) on the server; one engine: client core 0,
            // server core 1.
            c.busy_poll = std::env::var_os("IWARP_MC_BUSY").is_some();
            if let Ok(pin) = std::env::var("IWARP_MC_PIN") {
                let server = dev == "xb";
                c.cpus = match (n, server, pin.as_str()) {
                    (1, false, _) => vec![0],
                    (1, true, _) => vec![1],
                    (_, true, "cross") => (0..n as usize).rev().collect(),
                    _ => (0..n as usize).collect(),
                };
            }
            if pin_engines {
                c.cpus = (0..n as usize).collect();
            }
            c.frames = 2048;
            // Up to 16 SYNs in one burst may land on one engine.
            c.tcp.backlog = 32;
            if n > 1 {
                c.queues = (0..n).collect();
            }
            Backend::AfXdp(c)
        }
    };
    let cfg = DeviceConfig {
        progress: Progress::Thread { cpu },
        seed: None,
        busy_poll: false,
    };
    Device::open(backend, cfg).expect("open device")
}

fn init(dev: &Device, cq: &Cq) -> QpInit {
    QpInit {
        pd: dev.alloc_pd(),
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        sq_depth: 64,
        rq_depth: 8,
        sig_all: false,
        srq: None,
    }
}

/// Wait for one successful completion of `op`.
fn wait_op(cq: &Cq, op: WcOpcode) -> WorkCompletion {
    let mut wc = [EMPTY_WC; 1];
    let n = cq.wait(&mut wc, Some(WAIT));
    assert_eq!(n, 1, "no completion within {WAIT:?}");
    assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    assert_eq!(wc[0].opcode, op, "{:?}", wc[0]);
    wc[0]
}

/// Connection ids whose server side reached a point: posted its first
/// receive (the client's first Send waits for it: a Send without a posted
/// receive is the client's error, answered with a Terminate), or received
/// the Send that ends a stream (the client keeps its device open until
/// then: dropping a device resets its connections).
#[derive(Default)]
struct Ready {
    ids: Mutex<Vec<u8>>,
    cv: Condvar,
}

impl Ready {
    fn set(&self, id: u8) {
        self.ids.lock().unwrap().push(id);
        self.cv.notify_all();
    }

    fn wait(&self, id: u8) {
        let g = self.ids.lock().unwrap();
        let (_g, t) = self
            .cv
            .wait_timeout_while(g, WAIT, |ids| !ids.contains(&id))
            .unwrap();
        assert!(!t.timed_out(), "conn {id}: the server never got ready");
    }
}

/// Accept `n` connections; each gets its own region (offered in the MPA
/// reply's private data: address, rkey) and a thread that echoes every
/// Send after checking it. Returns the device's stats once every echo
/// thread is done.
fn serve(
    kind: Kind,
    n: usize,
    up: mpsc::Sender<SocketAddr>,
    streams: usize,
    ready: Arc<Ready>,
    done: Arc<Ready>,
    pin_engines: bool,
) -> Stats {
    let dev = open_on(kind, "xb", IP_B, None, pin_engines);
    let listen_ip = match kind {
        Kind::Xdp(_) => Ipv4Addr::UNSPECIFIED,
        Kind::Kernel => IP_B,
    };
    let l = dev
        .listen(SocketAddr::new(listen_ip.into(), PORT))
        .expect("listen");
    up.send(SocketAddr::new(IP_B.into(), l.local_addr().port()))
        .unwrap();
    let mut threads = Vec::new();
    for _ in 0..n {
        let req = l.get_request(Some(WAIT)).expect("connection request");
        let id = req.private_data().first().copied().expect("client index");
        let cq = dev.create_cq(64);
        let qi = init(&dev, &cq);
        let region = dev
            .reg_mr(
                &qi.pd,
                MR_LEN,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
        let recv = dev.reg_mr(&qi.pd, MR_LEN, Access::LOCAL_WRITE).unwrap();
        let echo = dev.reg_mr(&qi.pd, MR_LEN, Access::LOCAL_WRITE).unwrap();
        let mut pd = region.addr().to_be_bytes().to_vec();
        pd.extend_from_slice(&region.rkey().to_be_bytes());
        let params = ConnParams {
            private_data: pd,
            crc: true,
            ..ConnParams::default()
        };
        let qp = req.accept(qi, params).expect("accept");
        let (ready, done) = (ready.clone(), done.clone());
        threads.push(std::thread::spawn(move || {
            let post_recv = |qp: &Qp| {
                qp.post_recv(&RecvWr {
                    wr_id: 7,
                    sgl: &[recv.sge(0, MR_LEN)],
                })
                .unwrap()
            };
            post_recv(&qp);
            ready.set(id);
            for (i, &len) in SIZES.iter().enumerate() {
                let wc = wait_op(&cq, WcOpcode::Recv);
                assert_eq!(wc.byte_len as usize, len);
                let mut got = vec![0; len];
                recv.read(0, &mut got);
                let seed = id.wrapping_mul(16).wrapping_add(i as u8 + 100);
                assert!(
                    got == pattern(len, seed),
                    "conn {id}: Send of {len} B differs"
                );
                post_recv(&qp);
                echo.write(0, &got);
                qp.post_send(&SendWr {
                    wr_id: 9,
                    op: SendOp::Send {
                        solicited: false,
                        invalidate: None,
                    },
                    sgl: &[echo.sge(0, len)],
                    signaled: true,
                })
                .unwrap();
                wait_op(&cq, WcOpcode::Send);
            }
            // The client's stream of Writes (if any) ends with a Send.
            if streams > 0 {
                wait_op(&cq, WcOpcode::Recv);
                done.set(id);
            }
            // Keep the QP until the client is done with it.
            qp.wait_event(WAIT);
            drop(region);
        }));
    }
    for t in threads {
        t.join().expect("echo thread");
    }
    let s = dev.stats();
    drop(l);
    drop(dev);
    s
}

/// Connection `id`: Write, Read back, Send and its echo, for each size;
/// then, with `stream_bytes` > 0, a stream of 64 KiB Writes.
fn run_conn(
    dev: &Device,
    addr: SocketAddr,
    id: u8,
    stream_bytes: usize,
    go: &Barrier,
    ready: &Ready,
    finished: &Ready,
) -> f64 {
    let cq = dev.create_cq(64);
    let qi = init(dev, &cq);
    let src = dev.reg_mr(&qi.pd, MR_LEN, Access::LOCAL_WRITE).unwrap();
    let dst = dev.reg_mr(&qi.pd, MR_LEN, Access::LOCAL_WRITE).unwrap();
    let params = ConnParams {
        private_data: vec![id],
        crc: true,
        ..ConnParams::default()
    };
    let qp = dev.connect(addr, qi, params).expect("connect");
    let pd = qp.peer_private_data();
    let remote_addr = u64::from_be_bytes(pd[..8].try_into().unwrap());
    let rkey = u32::from_be_bytes(pd[8..12].try_into().unwrap());
    ready.wait(id);
    for (i, &len) in SIZES.iter().enumerate() {
        let seed = id.wrapping_mul(16).wrapping_add(i as u8);
        src.write(0, &pattern(len, seed));
        qp.post_send(&SendWr {
            wr_id: 1,
            op: SendOp::Write { remote_addr, rkey },
            sgl: &[src.sge(0, len)],
            signaled: true,
        })
        .unwrap();
        wait_op(&cq, WcOpcode::RdmaWrite);
        qp.post_send(&SendWr {
            wr_id: 2,
            op: SendOp::Read { remote_addr, rkey },
            sgl: &[dst.sge(0, len)],
            signaled: true,
        })
        .unwrap();
        wait_op(&cq, WcOpcode::RdmaRead);
        let mut got = vec![0; len];
        dst.read(0, &mut got);
        assert!(
            got == pattern(len, seed),
            "conn {id}: Read of {len} B differs"
        );
        let seed = seed.wrapping_add(100);
        src.write(0, &pattern(len, seed));
        qp.post_recv(&RecvWr {
            wr_id: 4,
            sgl: &[dst.sge(0, MR_LEN)],
        })
        .unwrap();
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
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let mut wc = [EMPTY_WC; 2];
            let n = cq.wait(&mut wc, Some(WAIT));
            assert!(n > 0, "conn {id}: no completion");
            for w in &wc[..n] {
                if w.status != WcStatus::Success {
                    let mut evs = Vec::new();
                    while let Some(e) = qp.poll_event() {
                        evs.push(e);
                    }
                    panic!("conn {id}: {w:?}, events {evs:?}, stats {:?}", dev.stats());
                }
                seen.push(w.opcode);
            }
        }
        assert!(seen.contains(&WcOpcode::Send) && seen.contains(&WcOpcode::Recv));
        let mut got = vec![0; len];
        dst.read(0, &mut got);
        assert!(
            got == pattern(len, seed),
            "conn {id}: echo of {len} B differs"
        );
    }
    let mut secs = 0.0;
    if stream_bytes > 0 {
        const CHUNK: usize = 64 * 1024;
        const WINDOW: usize = 16;
        go.wait();
        let start = Instant::now();
        let total = stream_bytes / CHUNK;
        let (mut posted, mut done) = (0, 0);
        let mut wcs = [EMPTY_WC; 16];
        while done < total {
            while posted < total && posted - done < WINDOW {
                qp.post_send(&SendWr {
                    wr_id: posted as u64,
                    op: SendOp::Write { remote_addr, rkey },
                    sgl: &[src.sge(0, CHUNK)],
                    signaled: true,
                })
                .unwrap();
                posted += 1;
            }
            let n = cq.wait(&mut wcs, Some(WAIT));
            assert!(n > 0, "conn {id}: stream stalled");
            assert!(wcs[..n].iter().all(|w| w.status == WcStatus::Success));
            done += n;
        }
        secs = start.elapsed().as_secs_f64();
        qp.post_send(&SendWr {
            wr_id: 5,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: &[src.sge(0, 1)],
            signaled: true,
        })
        .unwrap();
        wait_op(&cq, WcOpcode::Send);
        finished.wait(id);
    }
    secs
}

/// `n` connections from `client` to `server`, run concurrently; returns
/// (client stats, server stats).
fn run(server: Kind, client: Kind, n: usize, stream_bytes: usize) -> (Stats, Stats) {
    run_with(server, client, n, stream_bytes, false)
}

/// `run`; with `move_queue` (a kernel client), the client's veth sends on
/// the tx queue numbered like the sending core (XPS: tx-0 ← CPU 0, tx-1 ←
/// CPU 1), its connections are opened on CPU 0 and its progress thread,
/// which writes their data, runs on CPU 1: every connection moves from
/// queue 0 to queue 1 after its handshake. The server's engine i runs on
/// core i, so the client's answers to it (ACK-clocked data sent from the
/// softirq of the core its segment arrived on) keep to that rule too.
fn run_with(
    server: Kind,
    client: Kind,
    n: usize,
    stream_bytes: usize,
    move_queue: bool,
) -> (Stats, Stats) {
    let queues = match (server, client) {
        (Kind::Xdp(a), Kind::Xdp(b)) => a.max(b),
        (Kind::Xdp(a), _) | (_, Kind::Xdp(a)) => a,
        _ => 1,
    };
    let topo = Topo::up(
        1500,
        (client == Kind::Kernel).then_some(IP_A),
        (server == Kind::Kernel).then_some(IP_B),
        queues,
    );
    if move_queue {
        for (q, mask) in [(0, 1), (1, 2)] {
            let st = Command::new("ip")
                .args(["netns", "exec", &topo.a, "sh", "-c"])
                .arg(format!(
                    "echo {mask} > /sys/class/net/xa/queues/tx-{q}/xps_cpus"
                ))
                .status()
                .expect("xps");
            assert!(st.success(), "setting XPS failed");
        }
        // A SYN sent before the server's address is resolved waits in the
        // neighbour queue and leaves from the core that receives the ARP
        // reply, not the connecting one: resolve it statically first.
        let mac = Command::new("ip")
            .args(["netns", "exec", &topo.b, "cat", "/sys/class/net/xb/address"])
            .output()
            .expect("server MAC");
        let mac = String::from_utf8_lossy(&mac.stdout).trim().to_string();
        let st = Command::new("ip")
            .args(["-n", &topo.a, "neigh", "replace"])
            .args([
                &IP_B.to_string(),
                "lladdr",
                &mac,
                "dev",
                "xa",
                "nud",
                "permanent",
            ])
            .status()
            .expect("ip neigh");
        assert!(st.success(), "static neighbour for {IP_B} ({mac:?}) failed");
    }
    let (up_tx, up_rx) = mpsc::channel();
    let streams = usize::from(stream_bytes > 0);
    let ready = Arc::new(Ready::default());
    let done = Arc::new(Ready::default());
    let (r, d) = (ready.clone(), done.clone());
    let srv = spawn_in(&topo.b, move || {
        serve(server, n, up_tx, streams, r, d, move_queue)
    });
    let addr = up_rx.recv_timeout(WAIT).expect("server up");
    let cli = spawn_in(&topo.a, move || {
        let dev = open_on(client, "xa", IP_A, move_queue.then_some(1), false);
        let go = Arc::new(Barrier::new(n));
        let start = Instant::now();
        let conns: Vec<_> = (0..n)
            .map(|i| {
                let (dev, go) = (dev.clone(), go.clone());
                let (ready, done) = (ready.clone(), done.clone());
                std::thread::spawn(move || {
                    if move_queue {
                        pin(0);
                    }
                    run_conn(&dev, addr, i as u8, stream_bytes, &go, &ready, &done)
                })
            })
            .collect();
        let secs: Vec<f64> = conns
            .into_iter()
            .map(|t| t.join().expect("connection"))
            .collect();
        if stream_bytes > 0 {
            let wall = secs.iter().copied().fold(0.0, f64::max);
            println!(
                "{n} connections x {} MiB of 64 KiB RDMA Writes, client {client:?} -> server {server:?}: {:.2} Gb/s aggregate",
                stream_bytes >> 20,
                (n * stream_bytes) as f64 * 8.0 / wall / 1e9
            );
        }
        println!("client done in {:.2} s", start.elapsed().as_secs_f64());
        let s = dev.stats();
        drop(dev);
        s
    });
    let cs = cli.join().expect("client");
    let ss = srv.join().expect("server");
    topo.assert_no_program();
    for (who, s) in [("client", &cs), ("server", &ss)] {
        for e in &s.engines {
            println!(
                "{who} engine on queue {}: {} accepted, {} opened, rx {} tx {} frames, forwarded out {} in {}; ms in I/O {}, waiting for the device lock {}, holding it {}",
                e.queue, e.tcp.accepted, e.tcp.connects, e.tcp.rx_frames, e.tcp.tx_frames, e.forwarded_out, e.forwarded_in,
                e.io_ns / 1_000_000, e.lock_wait_ns / 1_000_000, e.core_ns / 1_000_000
            );
        }
    }
    (cs, ss)
}

fn pin(cpu: usize) {
    let id = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.id == cpu)
        .expect("core to pin to");
    assert!(core_affinity::set_for_current(id), "pinning failed");
}

/// Every engine accepted (server) or opened (client) connections of its
/// own, and all `n` are accounted for.
fn assert_spread(who: &str, s: &Stats, engines: usize, n: u64) {
    assert_eq!(s.engines.len(), engines, "{who}: {s:?}");
    let mut total = 0;
    for e in &s.engines {
        let c = e.tcp.accepted + e.tcp.connects;
        assert!(
            c > 0,
            "{who}: no connection landed on the engine of queue {}: {e:?}",
            e.queue
        );
        total += c;
    }
    assert_eq!(total, n, "{who}: {s:?}");
}

/// Kernel TCP clients (16 connections, each its own source port) to a
/// two-engine AF_XDP server: the peer's transmit hash picks the queue of
/// each connection; the engine of that queue accepts and drives it.
#[test]
fn kernel_clients_two_engine_server() {
    if !is_root() {
        return;
    }
    let (_, ss) = run(Kind::Xdp(2), Kind::Kernel, 16, 0);
    assert_spread("server", &ss, 2, 16);
}

/// Kernel TCP clients whose connections change queue after the handshake
/// (see `run_with`): the engine that accepted each connection (queue 0)
/// keeps driving it, the other one hands it every later segment.
#[test]
fn kernel_clients_changing_queue_two_engine_server() {
    if !is_root() {
        return;
    }
    if core_affinity::get_core_ids().unwrap_or_default().len() < 2 {
        println!("note: fewer than 2 cores, skipping");
        return;
    }
    let (_, ss) = run_with(Kind::Xdp(2), Kind::Kernel, 8, 0, true);
    let (e0, e1) = (&ss.engines[0], &ss.engines[1]);
    // Almost every SYN leaves on CPU 0 (a retransmission may leave from
    // a timer elsewhere); the data segments of the connections queue 0
    // accepted arrive on queue 1 and are handed over.
    assert_eq!(e0.tcp.accepted + e1.tcp.accepted, 8, "{ss:?}");
    assert!(e0.tcp.accepted > 0, "{ss:?}");
    assert!(e1.forwarded_out > 4 * e0.tcp.accepted, "{ss:?}");
    assert_eq!(e0.forward_dropped + e1.forward_dropped, 0, "{ss:?}");
    assert_eq!(e0.tcp.resets + e1.tcp.resets, 0, "{ss:?}");
}

/// Two-engine AF_XDP client (connections alternate between the engines)
/// to a two-engine AF_XDP server.
#[test]
fn two_engine_client_two_engine_server() {
    if !is_root() {
        return;
    }
    let (cs, ss) = run(Kind::Xdp(2), Kind::Xdp(2), 8, 0);
    assert_spread("client", &cs, 2, 8);
    assert_spread("server", &ss, 2, 8);
}

/// Two-engine AF_XDP client to a kernel TCP server: the server's replies
/// come back on whatever queue its transmit hash picks; frames for the
/// other engine's ports are forwarded to it.
#[test]
fn two_engine_client_kernel_server() {
    if !is_root() {
        return;
    }
    let (cs, _) = run(Kind::Kernel, Kind::Xdp(2), 8, 0);
    assert_spread("client", &cs, 2, 8);
    // About half the replies arrive on the other engine's queue.
    let fwd: u64 = cs.engines.iter().map(|e| e.forwarded_in).sum();
    println!("client frames forwarded between engines: {fwd}");
}

/// Aggregate 64 KiB RDMA Write throughput, one engine vs two (four
/// connections; both sides share the machine's cores). Informational:
/// `cargo test --release --test xdp_multicore -- --ignored --nocapture`.
#[test]
#[ignore]
fn write_throughput_one_vs_two_engines() {
    if !is_root() {
        return;
    }
    for n in [1, 2] {
        run(Kind::Xdp(n), Kind::Xdp(n), 4, 64 << 20);
    }
}

/// Kernel TCP clients (16 connections, spread by their transmit hash) to
/// a two-engine AF_XDP server whose QPs all take their receives from one
/// shared receive queue: the SRQ lives in the device's one verbs context,
/// so QPs of both engines consume from it. Each client's two Sends (three
/// FPDUs each) land whole in receives from the SRQ, complete on the
/// consuming QP's own CQ with its id, and the limit event fires once.
#[test]
fn kernel_clients_share_one_srq_on_a_two_engine_server() {
    if !is_root() {
        return;
    }
    const N: usize = 16;
    const MSGS: usize = 2;
    const LEN: usize = 3000;
    const RBUF: usize = 4096;
    let topo = Topo::up(1500, Some(IP_A), None, 2);
    let (up_tx, up_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let srv = spawn_in(&topo.b, move || {
        let dev = open_on(Kind::Xdp(2), "xb", IP_B, None, false);
        let pd = dev.alloc_pd();
        let scq = dev.create_cq(256);
        let srq = dev.create_srq(&pd, 64, 8).expect("srq");
        let rbufs = dev
            .reg_mr(&pd, N * MSGS * RBUF, Access::LOCAL_WRITE)
            .unwrap();
        for k in 0..N * MSGS {
            srq.post_recv(&RecvWr {
                wr_id: 1000 + k as u64,
                sgl: &[rbufs.sge(k * RBUF, RBUF)],
            })
            .unwrap();
        }
        let l = dev
            .listen(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT))
            .expect("listen");
        up_tx
            .send(SocketAddr::new(IP_B.into(), l.local_addr().port()))
            .unwrap();
        let mut conns = Vec::new();
        for _ in 0..N {
            let req = l.get_request(Some(WAIT)).expect("connection request");
            let id = req.private_data().first().copied().expect("client index");
            let rcq = dev.create_cq(16);
            let init = QpInit {
                pd: pd.clone(),
                send_cq: scq.clone(),
                recv_cq: rcq.clone(),
                sq_depth: 8,
                rq_depth: 8,
                sig_all: false,
                srq: Some(srq.clone()),
            };
            let params = ConnParams {
                crc: true,
                ..ConnParams::default()
            };
            let qp = req.accept(init, params).expect("accept");
            conns.push((id, qp, rcq));
        }
        let mut used = Vec::new();
        for (id, qp, rcq) in &conns {
            for m in 0..MSGS {
                let wc = wait_op(rcq, WcOpcode::Recv);
                assert_eq!(wc.qp, qp.id(), "conn {id}: the consuming QP's id");
                assert_eq!(wc.byte_len as usize, LEN);
                let k = (wc.wr_id - 1000) as usize;
                let mut got = vec![0; LEN];
                rbufs.read(k * RBUF, &mut got);
                let seed = id.wrapping_mul(16).wrapping_add(m as u8);
                assert!(got == pattern(LEN, seed), "conn {id}: Send {m} differs");
                used.push(k);
            }
        }
        used.sort_unstable();
        assert_eq!(used, (0..N * MSGS).collect::<Vec<_>>());
        // 32 posted, limit 8: the 25th receive taken left 7.
        assert_eq!(
            srq.wait_event(WAIT),
            Some(iwarp_engine::SrqEvent::LimitReached)
        );
        assert_eq!(srq.poll_event(), None, "the limit disarmed");
        assert_eq!(srq.posted(), 0);
        done_tx.send(()).unwrap();
        let s = dev.stats();
        drop(conns);
        drop(l);
        drop(dev);
        s
    });
    let addr = up_rx.recv_timeout(WAIT).expect("server up");
    let cli = spawn_in(&topo.a, move || {
        let dev = open_on(Kind::Kernel, "xa", IP_A, None, false);
        let cq = dev.create_cq(256);
        let pd = dev.alloc_pd();
        let src = dev.reg_mr(&pd, N * MSGS * LEN, Access::NONE).unwrap();
        let mut qps = Vec::new();
        for i in 0..N {
            let init = QpInit {
                pd: pd.clone(),
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                sq_depth: 8,
                rq_depth: 8,
                sig_all: false,
                srq: None,
            };
            let params = ConnParams {
                private_data: vec![i as u8],
                crc: true,
                ..ConnParams::default()
            };
            qps.push(dev.connect(addr, init, params).expect("connect"));
        }
        for m in 0..MSGS {
            for (i, qp) in qps.iter().enumerate() {
                let n = m * N + i;
                let seed = (i as u8).wrapping_mul(16).wrapping_add(m as u8);
                src.write(n * LEN, &pattern(LEN, seed));
                qp.post_send(&SendWr {
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
        for _ in 0..N * MSGS {
            wait_op(&cq, WcOpcode::Send);
        }
        // Dropping the device resets its connections: wait for the server.
        done_rx.recv_timeout(WAIT).expect("server done");
        drop(qps);
        drop(dev);
    });
    cli.join().expect("client");
    let ss = srv.join().expect("server");
    topo.assert_no_program();
    assert_spread("server", &ss, 2, N as u64);
}
