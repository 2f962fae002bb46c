//! The transport ceiling of the AF_XDP path: a one-directional smoltcp
//! stream between two [`RawTcp`]s (the engine's own UMEM, rings, frame
//! sizing and TCP settings, without the protocol core). Like the RDMA
//! runs, each side's thread drives its own stack, pinned to its core.
//! Payload is copied in on the sending side and out on the receiving
//! side, as the RDMA path copies from and into registered memory. The
//! same pair ping-pongs for the transport's latency floor.

use std::io;
use std::time::Instant;

use iwarp_engine::xdp::RawTcp;
use iwarp_tcp::ConnId;

use crate::echo::{echo_each, time_echoes};
use crate::rdma::{retry_open, WAIT};
use crate::topo::{spawn_in, Topology, XDP_B};

fn err(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
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
        if spins.is_multiple_of(4096) && start.elapsed() > WAIT {
            return Err(err(format!("smoltcp stream: {what} timed out")));
        }
    }
    Ok(())
}

/// Open both sides, connect a to b, and run `fa` on a's thread and `fb`
/// on b's (each with its `RawTcp` and the connection); returns what `fa`
/// returns.
fn pair<A: Send + 'static>(
    topo: &Topology,
    cpus: (Option<usize>, Option<usize>),
    port: u16,
    fa: impl FnOnce(&mut RawTcp, ConnId) -> io::Result<A> + Send + 'static,
    fb: impl FnOnce(&mut RawTcp, ConnId) -> io::Result<()> + Send + 'static,
) -> io::Result<A> {
    let veth = topo.veth;
    let (tx, rx) = std::sync::mpsc::channel();
    let hb = spawn_in(&topo.ns_b, cpus.1, "raw-b", move || -> io::Result<()> {
        let mut t = retry_open(|| RawTcp::open(&veth.xdp(true), &[port]))?;
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
        fb(&mut t, conn)?;
        // Let the last bytes leave (and be acknowledged).
        let t0 = Instant::now();
        while t0.elapsed() < std::time::Duration::from_millis(20) {
            t.poll();
        }
        if std::env::var_os("IWARP_BENCH_DEBUG").is_some() {
            eprintln!("smoltcp-raw side b: {:?}", t.stack().counters());
        }
        Ok(())
    })?;
    rx.recv_timeout(WAIT)
        .map_err(|_| err("smoltcp side b did not start"))?;
    let ha = spawn_in(&topo.ns_a, cpus.0, "raw-a", move || -> io::Result<A> {
        let mut t = retry_open(|| RawTcp::open(&veth.xdp(false), &[]))?;
        let conn = t
            .stack()
            .connect((XDP_B, port), 50_000)
            .map_err(|e| err(format!("connect: {e:?}")))?;
        spin_until(&mut t, "connect", |t| t.stack().is_established(conn))?;
        let r = fa(&mut t, conn)?;
        if std::env::var_os("IWARP_BENCH_DEBUG").is_some() {
            eprintln!("smoltcp-raw side a: {:?}", t.ring_counters());
        }
        Ok(r)
    })?;
    let ra = ha.join().map_err(|_| err("smoltcp side a panicked"))?;
    let rb = hb.join().map_err(|_| err("smoltcp side b panicked"))?;
    let a = ra??;
    rb??;
    Ok(a)
}

/// Send all of `data`, driving the stack.
fn send_all(t: &mut RawTcp, conn: ConnId, data: &[u8]) -> io::Result<()> {
    let mut sent = 0;
    let mut failed = false;
    spin_until(t, "send", |t| {
        match t.stack().send_slice(conn, &data[sent..]) {
            Ok(n) => sent += n,
            Err(_) => failed = true,
        }
        failed || sent == data.len()
    })?;
    if failed {
        return Err(err("send failed"));
    }
    Ok(())
}

/// Receive exactly `out.len()` bytes, driving the stack.
fn recv_exact(t: &mut RawTcp, conn: ConnId, out: &mut [u8]) -> io::Result<()> {
    let mut got = 0;
    let mut failed = false;
    spin_until(t, "receive", |t| {
        match t.stack().recv_slice(conn, &mut out[got..]) {
            Ok(n) => got += n,
            Err(_) => failed = true,
        }
        failed || got == out.len()
    })?;
    if failed {
        return Err(err("receive failed"));
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
    pair(
        topo,
        cpus,
        port,
        move |t, conn| {
            let src: Vec<u8> = (0..1 << 20).map(|i| i as u8).collect();
            let mut v = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let t0 = Instant::now();
                let mut sent = 0usize;
                spin_until(t, "send", |t| {
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
                recv_exact(t, conn, &mut [0u8; 4])?;
                v.push(total as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e9);
            }
            Ok(v)
        },
        move |t, conn| {
            let mut dst = vec![0u8; 1 << 20];
            for _ in 0..rounds {
                let mut got = 0usize;
                let mut failed = false;
                spin_until(t, "receive", |t| {
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
                send_all(t, conn, &[0, 0, 0, 1])?;
            }
            Ok(())
        },
    )
}

/// Ping-pong on the bare transport, the floor under the RDMA engine's
/// latency: side a sends `size` bytes, side b echoes them once all
/// arrived; per size, `warmup + n` exchanges, half round trips in µs of
/// the last `n` (as [`rdma::pingpong_a`](crate::rdma::pingpong_a)).
pub fn pingpong(
    topo: &Topology,
    cpus: (Option<usize>, Option<usize>),
    port: u16,
    sizes: Vec<usize>,
    warmup: usize,
    n: usize,
) -> io::Result<Vec<Vec<f64>>> {
    let sb = sizes.clone();
    pair(
        topo,
        cpus,
        port,
        move |t, conn| {
            time_echoes(&sizes, warmup, n, |out, echo| {
                send_all(t, conn, out)?;
                recv_exact(t, conn, echo)
            })
        },
        move |t, conn| {
            echo_each(&sb, warmup + n, |buf| {
                recv_exact(t, conn, buf)?;
                send_all(t, conn, buf)
            })
        },
    )
}
