//! The transport ceiling of the AF_XDP path: a one-directional smoltcp
//! stream between two [`RawTcp`]s (the engine's own UMEM, rings, frame
//! sizing and TCP settings, without the protocol core). Like the RDMA
//! runs, each side's thread drives its own stack, pinned to its core.
//! Payload is copied in on the sending side and out on the receiving
//! side, as the RDMA path copies from and into registered memory.

use std::io;
use std::time::Instant;

use iwarp_engine::xdp::{AttachMode, RawTcp};
use iwarp_engine::XdpConfig;

use crate::rdma::{retry_open, WAIT};
use crate::topo::{spawn_in, Topology, IF_A, IF_B, PREFIX, XDP_A, XDP_B};

fn err(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

fn config(side_b: bool, mtu: usize) -> XdpConfig {
    let (ifname, ip) = if side_b { (IF_B, XDP_B) } else { (IF_A, XDP_A) };
    let mut c = XdpConfig::new(ifname, ip, PREFIX);
    c.attach = AttachMode::Native;
    c.mtu = mtu;
    c
}

fn spin_until(
    t: &mut RawTcp,
    what: &str,
    mut f: impl FnMut(&mut RawTcp) -> bool,
) -> io::Result<()> {
    let start = Instant::now();
    let mut spins = 0u32;
    while !f(t) {
        t.poll();
        spins = spins.wrapping_add(1);
        if spins % 4096 == 0 && start.elapsed() > WAIT {
            return Err(err(format!("smoltcp stream: {what} timed out")));
        }
    }
    Ok(())
}

/// Per round, side a sends `total` bytes; side b reads them and answers
/// 4 bytes. Returns Gb/s of payload per round.
pub fn stream(
    topo: &Topology,
    cpus: (Option<usize>, Option<usize>),
    port: u16,
    total: usize,
    rounds: usize,
) -> io::Result<Vec<f64>> {
    let mtu = topo.mtu;
    let (tx, rx) = std::sync::mpsc::channel();
    let hb = spawn_in(&topo.ns_b, cpus.1, "raw-b", move || -> io::Result<()> {
        let mut t = retry_open(|| RawTcp::open(&config(true, mtu), &[port]))?;
        t.stack()
            .listen(port)
            .map_err(|e| err(format!("listen: {e:?}")))?;
        let _ = tx.send(());
        let mut conn = None;
        spin_until(&mut t, "accept", |t| {
            conn = t.stack().accept(port);
            conn.is_some()
        })?;
        let conn = conn.ok_or_else(|| err("accept"))?;
        let mut dst = vec![0u8; 1 << 20];
        for _ in 0..rounds {
            let mut got = 0usize;
            let mut failed = false;
            spin_until(&mut t, "receive", |t| {
                let mut pos = got % dst.len();
                match t.stack().recv(conn, |b| {
                    let n = b.len().min(total - got).min(dst.len() - pos);
                    dst[pos..pos + n].copy_from_slice(&b[..n]);
                    pos = (pos + n) % dst.len();
                    got += n;
                    n
                }) {
                    Ok(_) => {}
                    Err(_) => failed = true,
                }
                failed || got >= total
            })?;
            if failed {
                return Err(err("receive failed"));
            }
            let mut sent = 0;
            spin_until(&mut t, "answer", |t| {
                sent += t
                    .stack()
                    .send_slice(conn, &[0, 0, 0, 1][sent..])
                    .unwrap_or(0);
                sent == 4
            })?;
        }
        // Let the last answer leave (and be acknowledged).
        let t0 = Instant::now();
        while t0.elapsed() < std::time::Duration::from_millis(20) {
            t.poll();
        }
        if std::env::var_os("IWARP_BENCH_DEBUG").is_some() {
            eprintln!("smoltcp-raw receiver: {:?}", t.stack().counters());
        }
        Ok(())
    })?;
    rx.recv_timeout(WAIT)
        .map_err(|_| err("smoltcp side b did not start"))?;
    let ha = spawn_in(
        &topo.ns_a,
        cpus.0,
        "raw-a",
        move || -> io::Result<Vec<f64>> {
            let mut t = retry_open(|| RawTcp::open(&config(false, mtu), &[]))?;
            let conn = t
                .stack()
                .connect((XDP_B, port), 50_000)
                .map_err(|e| err(format!("connect: {e:?}")))?;
            spin_until(&mut t, "connect", |t| t.stack().is_established(conn))?;
            let src: Vec<u8> = (0..1 << 20).map(|i| i as u8).collect();
            let mut v = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let t0 = Instant::now();
                let mut sent = 0usize;
                spin_until(&mut t, "send", |t| {
                    let mut pos = sent % src.len();
                    let r = t.stack().send(conn, |b| {
                        let n = b.len().min(total - sent).min(src.len() - pos);
                        b[..n].copy_from_slice(&src[pos..pos + n]);
                        pos = (pos + n) % src.len();
                        sent += n;
                        n
                    });
                    r.is_err() || sent >= total
                })?;
                let mut ack = [0u8; 4];
                let mut got = 0;
                spin_until(&mut t, "answer", |t| {
                    got += t.stack().recv_slice(conn, &mut ack[got..]).unwrap_or(0);
                    got == 4
                })?;
                v.push(total as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e9);
            }
            if std::env::var_os("IWARP_BENCH_DEBUG").is_some() {
                eprintln!("smoltcp-raw sender: {:?}", t.ring_counters());
            }
            Ok(v)
        },
    )?;
    let ra = ha.join().map_err(|_| err("smoltcp side a panicked"))?;
    let rb = hb.join().map_err(|_| err("smoltcp side b panicked"))?;
    let a = ra??;
    rb??;
    Ok(a)
}
