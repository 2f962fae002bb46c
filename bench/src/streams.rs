//! Kernel TCP with many connections: the platform's own aggregate at a
//! connection count, measured beside `iwarp-scale`'s RDMA figures in the
//! same run. Side a opens N kernel TCP connections from its namespace to
//! a listener in side b's and writes `size`-byte chunks into every one
//! as it turns writable; side b reads every one as it turns readable.
//! Both are one thread pinned to its side's core, driven by an
//! edge-triggered epoll set, as a kernel-socket server of many clients
//! is. Each socket's send and receive buffer is the RDMA window
//! (`window × size`), the bytes an RDMA QP of the same run keeps
//! outstanding.
//!
//! Side b runs in a child process (the benchmark binary again, with
//! [`RECEIVER_FLAG`]): each side then needs only its own connections'
//! descriptors, so 10,000 connections fit an open-file limit of 20,000.

use std::io::{self, BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::socket::{setsockopt, sockopt};

use crate::rdma::WAIT;
use crate::scale::ScaleParams;
use crate::sock::accept_n;
use crate::topo::{pin, spawn_in, Topology, KERNEL_B};

fn err(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

/// Side a's phases, as side b sees them.
const WARMING: u8 = 0;
const COUNTING: u8 = 1;
const DONE: u8 = 2;

/// How long one `epoll_wait` blocks before the phase is looked at
/// again (ms).
const TICK_MS: u8 = 1;

/// Raise this process's open-file limit towards `want` descriptors (both
/// sides' sockets live in one process): the hard limit too where the
/// process may (`CAP_SYS_RESOURCE`), else up to the hard limit. Returns
/// the limit in force.
pub fn raise_fd_limit(want: u64) -> io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= want {
        return Ok(soft);
    }
    if setrlimit(Resource::RLIMIT_NOFILE, want, hard.max(want)).is_ok() {
        return Ok(want);
    }
    let most = hard.min(want);
    setrlimit(Resource::RLIMIT_NOFILE, most, hard)?;
    Ok(most)
}

/// The descriptors a run of `n` connections needs in each side's
/// process beside the rest of it.
pub fn fds_needed(n: usize) -> u64 {
    n as u64 + 512
}

/// Register every socket of `socks` with a new epoll set, edge-triggered
/// for `flags`, each under its index.
fn epoll_of(socks: &[TcpStream], flags: EpollFlags) -> io::Result<Epoll> {
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    for (i, s) in socks.iter().enumerate() {
        ep.add(s, EpollEvent::new(flags | EpollFlags::EPOLLET, i as u64))?;
    }
    Ok(ep)
}

/// Side b: read every connection as it turns readable; the payload Gb/s
/// received while side a counted.
fn receive(socks: &[TcpStream], phase: &AtomicU8) -> io::Result<f64> {
    let ep = epoll_of(socks, EpollFlags::EPOLLIN)?;
    let mut events = vec![EpollEvent::empty(); 256];
    let mut buf = vec![0u8; 256 << 10];
    let mut bytes = 0u64;
    let mut mark: Option<(u64, Instant)> = None;
    let start = Instant::now();
    loop {
        let k = ep.wait(&mut events, TICK_MS)?;
        for ev in &events[..k] {
            let mut s = &socks[ev.data() as usize];
            loop {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(m) => bytes += m as u64,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        match phase.load(Ordering::Acquire) {
            COUNTING if mark.is_none() => mark = Some((bytes, Instant::now())),
            DONE => {
                let (from, at) = mark.ok_or_else(|| err("side a never counted"))?;
                let secs = at.elapsed().as_secs_f64();
                return Ok((bytes - from) as f64 * 8.0 / secs.max(1e-9) / 1e9);
            }
            _ if start.elapsed() > 3 * WAIT => return Err(err("side a never finished")),
            _ => {}
        }
    }
}

/// Side a: write `size`-byte chunks into every connection as it turns
/// writable, `p.warmup` seconds, then `p.secs` counted (the phase tells
/// side b when).
fn send(socks: &[TcpStream], phase: &AtomicU8, p: ScaleParams) -> io::Result<()> {
    let ep = epoll_of(socks, EpollFlags::EPOLLOUT)?;
    let mut events = vec![EpollEvent::empty(); 256];
    let src = vec![0xa5u8; p.size];
    // Bytes of the current chunk each connection has written.
    let mut at = vec![0usize; socks.len()];
    let warm = Duration::from_secs_f64(p.warmup);
    let count = Duration::from_secs_f64(p.secs);
    let t0 = Instant::now();
    let mut counting: Option<Instant> = None;
    loop {
        match counting {
            None if t0.elapsed() >= warm => {
                counting = Some(Instant::now());
                phase.store(COUNTING, Ordering::Release);
            }
            Some(c) if c.elapsed() >= count => {
                phase.store(DONE, Ordering::Release);
                return Ok(());
            }
            _ => {}
        }
        let k = ep.wait(&mut events, TICK_MS)?;
        for ev in &events[..k] {
            let i = ev.data() as usize;
            let mut s = &socks[i];
            loop {
                match s.write(&src[at[i]..]) {
                    Ok(m) => at[i] = (at[i] + m) % p.size,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

/// The option that makes a benchmark binary side b's receiver
/// ([`receiver_main`]); [`run`] starts it.
pub const RECEIVER_FLAG: &str = "--streams-receiver";

/// Side b's process, in its namespace: `args` are the address to listen
/// on, the connection count, the socket buffer size and the CPU to pin
/// to (`-`: none). It prints `listening` once bound, reads side a's
/// phases from stdin (`c`: counting, `d`: done), and prints the Gb/s it
/// received while side a counted (or `error: …`).
pub fn receiver_main(args: &[String]) -> std::process::ExitCode {
    match receiver(args) {
        Ok(gbps) => {
            println!("{gbps}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            println!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn receiver(args: &[String]) -> io::Result<f64> {
    let [addr, n, buffer, cpu] = args else {
        return Err(err(format!("{RECEIVER_FLAG} ADDR N BUFFER CPU")));
    };
    let bad = |what: &str| err(format!("{RECEIVER_FLAG}: bad {what}"));
    let addr: SocketAddr = addr.parse().map_err(|_| bad("address"))?;
    let n: usize = n.parse().map_err(|_| bad("count"))?;
    let buffer: usize = buffer.parse().map_err(|_| bad("buffer size"))?;
    if let Ok(c) = cpu.parse::<usize>() {
        pin(c);
    }
    raise_fd_limit(fds_needed(n))?;
    let l = TcpListener::bind(addr)?;
    // Accepted sockets inherit it, with the window scale it implies.
    setsockopt(&l, sockopt::RcvBuf, &buffer)?;
    l.set_nonblocking(true)?;
    println!("listening");
    io::stdout().flush()?;
    // Side a's phases arrive on stdin.
    let phase = Arc::new(AtomicU8::new(WARMING));
    let seen = phase.clone();
    std::thread::spawn(move || {
        for b in io::stdin().lock().bytes() {
            match b {
                Ok(b'c') => seen.store(COUNTING, Ordering::Release),
                Ok(b'd') | Err(_) => break,
                Ok(_) => {}
            }
        }
        seen.store(DONE, Ordering::Release);
    });
    let socks = accept_n(&l, n, 3 * WAIT)?;
    for s in &socks {
        s.set_nonblocking(true)?;
    }
    receive(&socks, &phase)
}

/// Side b's process ([`receiver_main`]), killed if dropped before it
/// finished.
struct Receiver {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Receiver {
    fn start(
        topo: &Topology,
        cpu: Option<usize>,
        addr: SocketAddr,
        n: usize,
        buffer: usize,
    ) -> io::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &topo.ns_b])
            .arg(exe)
            .arg(RECEIVER_FLAG)
            .arg(addr.to_string())
            .arg(n.to_string())
            .arg(buffer.to_string())
            .arg(cpu.map_or("-".into(), |c| c.to_string()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or_else(|| err("no stdout"))?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            stdin,
            lines,
        })
    }

    /// The next line it prints, within `timeout`.
    fn line(&self, timeout: Duration) -> io::Result<String> {
        let l = self
            .lines
            .recv_timeout(timeout)
            .map_err(|_| err("side b's process said nothing"))?;
        match l.strip_prefix("error: ") {
            Some(e) => Err(err(format!("side b: {e}"))),
            None => Ok(l),
        }
    }

    fn tell(&mut self, b: u8) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = s.write_all(&[b]).and_then(|()| s.flush());
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// One run of `n` kernel TCP connections: the payload Gb/s side b
/// received in the counted seconds.
pub fn run(
    topo: &Topology,
    cpus: (Option<usize>, Option<usize>),
    n: usize,
    port: u16,
    p: ScaleParams,
) -> io::Result<f64> {
    let addr = SocketAddr::new(KERNEL_B.into(), port);
    let buffer = p.size.saturating_mul(p.window).min(i32::MAX as usize);
    let mut b = Receiver::start(topo, cpus.1, addr, n, buffer)?;
    if b.line(WAIT)? != "listening" {
        return Err(err("side b did not listen"));
    }
    let phase = Arc::new(AtomicU8::new(WARMING));
    let in_a = phase.clone();
    let ha = spawn_in(
        &topo.ns_a,
        cpus.0,
        "streams-a",
        move || -> io::Result<()> {
            let sent = (|| {
                let mut socks = Vec::with_capacity(n);
                for _ in 0..n {
                    let s = TcpStream::connect_timeout(&addr, WAIT)?;
                    setsockopt(&s, sockopt::SndBuf, &buffer)?;
                    s.set_nonblocking(true)?;
                    socks.push(s);
                }
                send(&socks, &in_a, p)
            })();
            // Side b stops at DONE, also when this side failed.
            in_a.store(DONE, Ordering::Release);
            sent
        },
    )?;
    // Side a's phases go to side b's process as they change.
    let mut told = WARMING;
    while told != DONE {
        let now = phase.load(Ordering::Acquire);
        if now != told {
            if now == COUNTING {
                b.tell(b'c');
            }
            told = now;
        } else {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    b.tell(b'd');
    let ra = ha.join().map_err(|_| err("side a panicked"))?;
    let rb = b.line(WAIT).and_then(|l| {
        l.parse::<f64>()
            .map_err(|_| err(format!("side b printed {l:?}")))
    });
    match (ra?, rb) {
        (Ok(()), Ok(gbps)) => Ok(gbps),
        (Err(e), _) => Err(e),
        (Ok(()), Err(e)) => Err(e),
    }
}
