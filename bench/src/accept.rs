//! Connection setup rate: side b's server accepts N connections from
//! `clients` threads on side a, each opening its share one after another
//! (for the RDMA servers the MPA exchange is part of every connection:
//! a client's `connect` returns once the MPA reply arrived). The rate is
//! N over the time from the clients' start to the last connection; every
//! connection stays open until the count is reached. The client side is
//! the same for both RDMA servers (a kernel-socket device with its
//! progress thread), so they compare as servers; kernel TCP's accept rate
//! (plain `connect`/`accept`, no MPA) is the baseline of the same run.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use iwarp_engine::{Backend, ConnParams, Device, DeviceConfig, Progress, QpInit, XdpConfig};

use crate::rdma::{retry_open, WAIT};
use crate::topo::{spawn_in, Topology, KERNEL_B, XDP_B};

fn err(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

/// The server of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Server {
    /// Kernel TCP, `accept` only: the baseline.
    KernelTcp,
    /// The RDMA engine on kernel sockets.
    Kernel,
    /// The RDMA engine on AF_XDP.
    Afxdp,
}

impl Server {
    /// The name in tables and records.
    pub fn name(self) -> &'static str {
        match self {
            Self::KernelTcp => "kernel-tcp",
            Self::Kernel => "kernel",
            Self::Afxdp => "afxdp",
        }
    }
}

fn threaded(cpu: Option<usize>) -> DeviceConfig {
    DeviceConfig {
        progress: Progress::Thread { cpu },
        seed: None,
        busy_poll: false,
    }
}

fn qp_init(dev: &Device) -> QpInit {
    let cq = dev.create_cq(8);
    QpInit {
        pd: dev.alloc_pd(),
        send_cq: cq.clone(),
        recv_cq: cq,
        sq_depth: 2,
        rq_depth: 2,
        sig_all: false,
        srq: None,
    }
}

/// One run: `n` connections from `clients` threads; returns connections
/// per second.
pub fn run(
    topo: &Topology,
    cpus: (Option<usize>, Option<usize>),
    server: Server,
    n: usize,
    clients: usize,
    port: u16,
    xdp: XdpConfig,
) -> io::Result<f64> {
    let clients = clients.clamp(1, n.max(1));
    let (up_tx, up_rx) = mpsc::channel::<SocketAddr>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let hb = spawn_in(&topo.ns_b, cpus.1, "accept-b", move || -> io::Result<()> {
        match server {
            Server::KernelTcp => {
                let l = TcpListener::bind(SocketAddr::new(KERNEL_B.into(), port))?;
                up_tx
                    .send(l.local_addr()?)
                    .map_err(|_| err("side a is gone"))?;
                let mut held = Vec::with_capacity(n);
                for _ in 0..n {
                    held.push(l.accept()?.0);
                }
                let _ = done_rx.recv_timeout(WAIT);
                Ok(())
            }
            Server::Kernel | Server::Afxdp => {
                let (backend, ip) = if server == Server::Afxdp {
                    (Backend::AfXdp(xdp.clone()), XDP_B)
                } else {
                    (Backend::Kernel, KERNEL_B)
                };
                let dev = retry_open(|| Device::open(backend.clone(), threaded(cpus.1)))?;
                let l = dev
                    .listen(SocketAddr::new(ip.into(), port))
                    .map_err(|e| err(format!("listen: {e}")))?;
                up_tx
                    .send(l.local_addr())
                    .map_err(|_| err("side a is gone"))?;
                let mut held = Vec::with_capacity(n);
                for i in 0..n {
                    let req = l
                        .get_request(Some(WAIT))
                        .map_err(|e| err(format!("request {i}: {e}")))?;
                    held.push(
                        req.accept(qp_init(&dev), ConnParams::default())
                            .map_err(|e| err(format!("accept {i}: {e}")))?,
                    );
                }
                let _ = done_rx.recv_timeout(WAIT);
                Ok(())
            }
        }
    })?;
    let addr = up_rx
        .recv_timeout(WAIT)
        .map_err(|_| err("the server did not listen"))?;
    let ha = spawn_in(
        &topo.ns_a,
        cpus.0,
        "accept-a",
        move || -> io::Result<f64> {
            let dev = match server {
                Server::KernelTcp => None,
                _ => Some(retry_open(|| {
                    Device::open(Backend::Kernel, threaded(cpus.0))
                })?),
            };
            let go = Arc::new(Barrier::new(clients + 1));
            let threads: Vec<_> = (0..clients)
                .map(|k| {
                    let (dev, go) = (dev.clone(), go.clone());
                    let share = n / clients + usize::from(k < n % clients);
                    std::thread::spawn(
                        move || -> io::Result<(Vec<TcpStream>, Vec<iwarp_engine::Qp>)> {
                            let (mut socks, mut qps) = (Vec::new(), Vec::new());
                            go.wait();
                            for _ in 0..share {
                                match &dev {
                                    None => socks.push(TcpStream::connect_timeout(&addr, WAIT)?),
                                    Some(d) => qps.push(
                                        d.connect(addr, qp_init(d), ConnParams::default())
                                            .map_err(|e| err(format!("connect: {e}")))?,
                                    ),
                                }
                            }
                            Ok((socks, qps))
                        },
                    )
                })
                .collect();
            go.wait();
            let start = Instant::now();
            let mut held = Vec::new();
            for t in threads {
                held.push(t.join().map_err(|_| err("a client thread panicked"))??);
            }
            let secs = start.elapsed().as_secs_f64();
            drop(held);
            // Let the closes leave before the device goes.
            std::thread::sleep(Duration::from_millis(50));
            Ok(n as f64 / secs)
        },
    )?;
    let rate = ha.join().map_err(|_| err("side a panicked"))?;
    let _ = done_tx.send(());
    let rb = hb.join().map_err(|_| err("side b panicked"))?;
    let rate = rate??;
    rb??;
    Ok(rate)
}
