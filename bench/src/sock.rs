//! Kernel TCP baselines with std sockets (`TCP_NODELAY` on): ping-pong
//! and one-directional streams, blocking or busy-polling. Busy-polling
//! here means a nonblocking socket whose `read` is retried in a spin
//! loop (`SO_BUSY_POLL` is not set: a veth has no NAPI queue to poll
//! from a socket).

use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::echo::{echo_each, time_echoes};
use crate::rdma::WAIT;
use crate::topo::{spawn_in, Topology, KERNEL_B};

fn err(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

fn read_full(s: &mut TcpStream, buf: &mut [u8], spin: bool) -> io::Result<()> {
    if !spin {
        return s.read_exact(buf);
    }
    let mut off = 0;
    let start = Instant::now();
    let mut spins = 0u32;
    while off < buf.len() {
        match s.read(&mut buf[off..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => off += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(4096) && start.elapsed() > WAIT {
                    return Err(ErrorKind::TimedOut.into());
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn write_full(s: &mut TcpStream, buf: &[u8], spin: bool) -> io::Result<()> {
    if !spin {
        return s.write_all(buf);
    }
    let mut off = 0;
    let start = Instant::now();
    while off < buf.len() {
        match s.write(&buf[off..]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => off += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                if start.elapsed() > WAIT {
                    return Err(ErrorKind::TimedOut.into());
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn prepare(s: &TcpStream, spin: bool) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(WAIT))?;
    s.set_write_timeout(Some(WAIT))?;
    s.set_nonblocking(spin)
}

/// Accept `n` connections on the non-blocking listener `l`, polling
/// it, within `timeout`. The streams are as `accept` returns them
/// (blocking).
pub(crate) fn accept_n(l: &TcpListener, n: usize, timeout: Duration) -> io::Result<Vec<TcpStream>> {
    let mut socks = Vec::with_capacity(n);
    let start = Instant::now();
    while socks.len() < n {
        match l.accept() {
            Ok((s, _)) => socks.push(s),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if start.elapsed() > timeout {
                    return Err(err(format!("{} of {n} connections came", socks.len())));
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(socks)
}

/// Run the server `fb` (side b, on its accepted stream) and client `fa`
/// (side a, connected to it) in their namespaces.
fn pair<A: Send + 'static>(
    topo: &Topology,
    cpus: (Option<usize>, Option<usize>),
    port: u16,
    fa: impl FnOnce(TcpStream) -> io::Result<A> + Send + 'static,
    fb: impl FnOnce(TcpStream) -> io::Result<()> + Send + 'static,
) -> io::Result<A> {
    let addr = SocketAddr::new(KERNEL_B.into(), port);
    let (tx, rx) = std::sync::mpsc::channel();
    let hb = spawn_in(&topo.ns_b, cpus.1, "tcp-b", move || -> io::Result<()> {
        let l = TcpListener::bind(addr)?;
        let _ = tx.send(());
        l.set_nonblocking(true)?;
        let s = accept_n(&l, 1, WAIT)?
            .pop()
            .ok_or_else(|| err("no connection"))?;
        fb(s)
    })?;
    rx.recv_timeout(WAIT)
        .map_err(|_| err("tcp server did not start"))?;
    let ha = spawn_in(&topo.ns_a, cpus.0, "tcp-a", move || {
        let s = TcpStream::connect_timeout(&addr, WAIT)?;
        fa(s)
    })?;
    let ra = ha.join().map_err(|_| err("tcp client panicked"))?;
    let rb = hb.join().map_err(|_| err("tcp server panicked"))?;
    let a = ra??;
    rb??;
    Ok(a)
}

/// Ping-pong of `size`-byte messages: half round trips in µs after the
/// warm-up, per size.
pub fn pingpong(
    topo: &Topology,
    cpus: (Option<usize>, Option<usize>),
    port: u16,
    spin: bool,
    sizes: Vec<usize>,
    warmup: usize,
    n: usize,
) -> io::Result<Vec<Vec<f64>>> {
    let sb = sizes.clone();
    pair(
        topo,
        cpus,
        port,
        move |mut s| {
            prepare(&s, spin)?;
            time_echoes(&sizes, warmup, n, |out, echo| {
                write_full(&mut s, out, spin)?;
                read_full(&mut s, echo, spin)
            })
        },
        move |mut s| {
            prepare(&s, spin)?;
            echo_each(&sb, warmup + n, |buf| {
                read_full(&mut s, buf, spin)?;
                write_full(&mut s, buf, spin)
            })
        },
    )
}

/// One-directional stream: per round, side a writes `count` writes of
/// `chunk` bytes, side b reads them all and answers 4 bytes, which stop
/// the clock. Returns Gb/s of payload per round.
#[allow(clippy::too_many_arguments)]
pub fn stream(
    topo: &Topology,
    cpus: (Option<usize>, Option<usize>),
    port: u16,
    spin: bool,
    chunk: usize,
    count: usize,
    rounds: usize,
) -> io::Result<Vec<f64>> {
    let total = chunk * count;
    pair(
        topo,
        cpus,
        port,
        move |mut s| {
            prepare(&s, spin)?;
            let src = vec![0xa5; chunk];
            let mut ack = [0u8; 4];
            let mut v = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let t0 = Instant::now();
                for _ in 0..count {
                    write_full(&mut s, &src, spin)?;
                }
                read_full(&mut s, &mut ack, spin)?;
                v.push(total as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e9);
            }
            Ok(v)
        },
        move |mut s| {
            prepare(&s, spin)?;
            let mut buf = vec![0; 256 << 10];
            for _ in 0..rounds {
                let mut got = 0;
                while got < total {
                    let want = (total - got).min(buf.len());
                    read_full(&mut s, &mut buf[..want], spin)?;
                    got += want;
                }
                write_full(&mut s, &[0, 0, 0, 1], spin)?;
            }
            Ok(())
        },
    )
}

/// A timed one-directional stream of blocking `chunk`-byte writes for
/// `secs` seconds (side a writes, side b reads until EOF); `mark` is
/// called at the start and at the end on side a's thread.
pub fn timed_stream<T: Send + 'static>(
    topo: &Topology,
    cpus: (Option<usize>, Option<usize>),
    port: u16,
    chunk: usize,
    secs: f64,
    mut mark: impl FnMut() -> T + Send + 'static,
) -> io::Result<crate::rdma::Moved<T>> {
    pair(
        topo,
        cpus,
        port,
        move |mut s| {
            prepare(&s, false)?;
            let src = vec![0xa5; chunk];
            let dur = Duration::from_secs_f64(secs);
            let mut bytes = 0u64;
            let start = mark();
            let t0 = Instant::now();
            while t0.elapsed() < dur {
                s.write_all(&src)?;
                bytes += chunk as u64;
            }
            let end = mark();
            s.shutdown(std::net::Shutdown::Write)?;
            let mut b = [0u8; 1];
            // Side b closes after EOF.
            let _ = s.read(&mut b)?;
            Ok(crate::rdma::Moved { bytes, start, end })
        },
        move |mut s| {
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(WAIT + Duration::from_secs_f64(secs)))?;
            let mut buf = vec![0; 256 << 10];
            while s.read(&mut buf)? > 0 {}
            Ok(())
        },
    )
}
