//! The RDMA side of every engine configuration: one code path for both
//! backends (only [`Backend`] differs). Each side's application thread
//! drives its own engine ([`Progress::Manual`]): it spins on
//! [`Device::progress`] while it polls the last byte of its buffer, so a
//! run has exactly one spinning thread per side, each on its own core.

use std::io;
use std::net::SocketAddr;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::time::{Duration, Instant};

use iwarp_engine::xdp::{LinkEnd, XdpConfig};
use iwarp_engine::{
    Access, Backend, ConnParams, Cq, Device, DeviceConfig, Listener, Mr, Pd, Progress, Qp, QpInit,
    SendOp, SendWr, WcStatus, EMPTY_WC,
};

use crate::topo::{Topology, Veth, KERNEL_B, KERNEL_B6, XDP_B};

/// How long any single wait may take before the run fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// Which engine backend, with which MPA options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Engine {
    /// AF_XDP (user-space TCP) or kernel sockets.
    pub xdp: bool,
    /// MPA CRC.
    pub crc: bool,
    /// MPA markers.
    pub markers: bool,
    /// AF_XDP: keep FPDUs inside TCP segments (`XdpConfig::align_fpdus`).
    pub align: bool,
    /// A second QP on the same two devices, with the MPA CRC the other
    /// way ([`spray_paired_a`] alternates between the two).
    pub paired: bool,
    /// AF_XDP engines on an in-process link instead of the veth pair
    /// (both sides in this process, no kernel between them).
    pub link: bool,
    /// The kernel-socket engine over IPv6 ([`KERNEL_B6`]).
    pub ipv6: bool,
}

fn err(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

fn backend(e: Engine, side_b: bool, veth: Veth, end: Option<&LinkEnd>) -> Backend {
    if let Some(end) = end {
        return Backend::Link(end.clone());
    }
    if !e.xdp {
        return Backend::Kernel;
    }
    Backend::AfXdp(xdp_config(e, side_b, veth))
}

fn xdp_config(e: Engine, side_b: bool, veth: Veth) -> XdpConfig {
    let mut c = veth.xdp(side_b);
    c.align_fpdus = e.align;
    c
}

fn params(e: Engine, crc: bool) -> ConnParams {
    ConnParams {
        crc,
        markers: e.markers,
        timeout: Duration::from_secs(10),
        ..ConnParams::default()
    }
}

/// Open with retries for up to 3 s: the kernel releases a closed AF_XDP
/// socket (and its UMEM) on the interface's queue asynchronously, so an
/// open right after the previous configuration's close can fail.
pub fn retry_open<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let start = Instant::now();
    loop {
        match f() {
            Ok(t) => return Ok(t),
            Err(e) if start.elapsed() > Duration::from_secs(3) => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// A remote buffer: where the peer may write.
#[derive(Clone, Copy, Debug)]
struct Remote {
    addr: u64,
    rkey: u32,
}

/// One connected side.
pub struct Side {
    dev: Device,
    cq: Cq,
    qp: Qp,
    /// With [`Engine::paired`]: the QP with the CRC the other way, to the
    /// same buffers.
    alt: Option<Qp>,
    /// Remotely writable; the peer's writes land here.
    buf: Mr,
    /// Source of our writes.
    src: Mr,
    peer: Remote,
    /// Side b's listener, kept open: the AF_XDP engine stops steering a
    /// listening port to its socket when the listener is dropped, also
    /// for connections accepted on it.
    _listener: Option<Listener>,
    /// Rendezvous with the other side's thread.
    tx: Sender<()>,
    rx: Receiver<()>,
}

/// What the thread of side b hands to side a before it accepts.
struct Offer {
    addr: SocketAddr,
    remote: Remote,
}

/// The channels that join the two sides' threads.
pub struct Link {
    offer_tx: Option<Sender<Offer>>,
    offer_rx: Option<Receiver<Offer>>,
    back_tx: Option<Sender<Remote>>,
    back_rx: Option<Receiver<Remote>>,
    meet_tx: Sender<()>,
    meet_rx: Receiver<()>,
    /// The side's end of an in-process link ([`Engine::link`]).
    end: Option<LinkEnd>,
}

/// Links for side a and side b.
pub fn link() -> (Link, Link) {
    let (offer_tx, offer_rx) = mpsc::channel();
    let (back_tx, back_rx) = mpsc::channel();
    let (a_tx, b_rx) = mpsc::channel();
    let (b_tx, a_rx) = mpsc::channel();
    (
        Link {
            offer_tx: None,
            offer_rx: Some(offer_rx),
            back_tx: Some(back_tx),
            back_rx: None,
            meet_tx: a_tx,
            meet_rx: a_rx,
            end: None,
        },
        Link {
            offer_tx: Some(offer_tx),
            offer_rx: None,
            back_tx: None,
            back_rx: Some(back_rx),
            meet_tx: b_tx,
            meet_rx: b_rx,
            end: None,
        },
    )
}

fn init(pd: Pd, cq: &Cq, sq_depth: usize) -> QpInit {
    QpInit {
        pd,
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        sq_depth,
        rq_depth: 4,
        sig_all: false,
        srq: None,
    }
}

impl Side {
    /// Open the device of side a or b (in the calling thread's
    /// namespace), register a `len`-byte target and a `src_len`-byte
    /// source, and connect (a) or accept (b) on `port`.
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        e: Engine,
        side_b: bool,
        veth: Veth,
        port: u16,
        len: usize,
        src_len: usize,
        sq_depth: usize,
        l: Link,
    ) -> io::Result<Self> {
        Self::connect_with(e, side_b, veth, port, len, src_len, sq_depth, l, None)
    }

    /// [`Side::connect`] with a choice of progress: `None` is manual
    /// progress (the application thread spins); `Some(cpu)` is the
    /// engine's own progress thread, pinned to `cpu` and sleeping in
    /// epoll when idle (`busy_poll` off, AF_XDP in wakeup mode).
    #[allow(clippy::too_many_arguments)]
    pub fn connect_with(
        e: Engine,
        side_b: bool,
        veth: Veth,
        port: u16,
        len: usize,
        src_len: usize,
        sq_depth: usize,
        l: Link,
        thread: Option<Option<usize>>,
    ) -> io::Result<Self> {
        let cfg = DeviceConfig {
            progress: match thread {
                None => Progress::Manual,
                Some(cpu) => Progress::Thread { cpu },
            },
            seed: Some(if side_b { 2 } else { 1 }),
            busy_poll: false,
        };
        let dev = retry_open(|| Device::open(backend(e, side_b, veth, l.end.as_ref()), cfg))?;
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(2 * sq_depth + 64);
        let buf = dev.reg_mr(&pd, len.max(8), Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        let src = dev.reg_mr(&pd, src_len.max(8), Access::LOCAL_WRITE)?;
        let mine = Remote {
            addr: buf.addr(),
            rkey: buf.rkey(),
        };
        let qi = init(pd, &cq, sq_depth);
        let mut listener = None;
        let mut dialled = None;
        let (qp, peer) = if side_b {
            let ip = match (e.xdp, e.ipv6) {
                (true, _) => XDP_B.into(),
                (false, false) => KERNEL_B.into(),
                (false, true) => KERNEL_B6.into(),
            };
            let lis = dev
                .listen(SocketAddr::new(ip, port))
                .map_err(|x| err(format!("listen: {x}")))?;
            l.offer_tx
                .as_ref()
                .ok_or_else(|| err("link"))?
                .send(Offer {
                    addr: lis.local_addr(),
                    remote: mine,
                })
                .map_err(|_| err("side a is gone"))?;
            let req = lis
                .get_request(Some(WAIT))
                .map_err(|x| err(format!("get_request: {x}")))?;
            let qp = req
                .accept(qi.clone(), params(e, e.crc))
                .map_err(|x| err(format!("accept: {x}")))?;
            // Drive the engine while waiting: the reply and what follows
            // only leave in a pass (manual progress).
            let back = l.back_rx.as_ref().ok_or_else(|| err("link"))?;
            let start = Instant::now();
            let peer = loop {
                match back.try_recv() {
                    Ok(r) => break r,
                    Err(TryRecvError::Disconnected) => return Err(err("side a is gone")),
                    Err(TryRecvError::Empty) if start.elapsed() > WAIT => {
                        return Err(err("no buffer from side a"))
                    }
                    Err(TryRecvError::Empty) => {
                        dev.progress();
                    }
                }
            };
            listener = Some(lis);
            (qp, peer)
        } else {
            let offer = l
                .offer_rx
                .as_ref()
                .ok_or_else(|| err("link"))?
                .recv_timeout(WAIT)
                .map_err(|_| err("side b did not listen"))?;
            let qp = dev
                .connect(offer.addr, qi.clone(), params(e, e.crc))
                .map_err(|x| err(format!("connect: {x}")))?;
            l.back_tx
                .as_ref()
                .ok_or_else(|| err("link"))?
                .send(mine)
                .map_err(|_| err("side b is gone"))?;
            dialled = Some(offer.addr);
            (qp, offer.remote)
        };
        // The second QP goes to the same listener and buffers: a connects
        // again once b has its buffer (the exchange above), b accepts.
        let alt = match (e.paired, listener.as_ref(), dialled) {
            (false, _, _) => None,
            (true, Some(lis), _) => {
                let req = lis
                    .get_request(Some(WAIT))
                    .map_err(|x| err(format!("get_request: {x}")))?;
                let qp = req
                    .accept(qi, params(e, !e.crc))
                    .map_err(|x| err(format!("accept: {x}")))?;
                Some(qp)
            }
            (true, None, Some(addr)) => Some(
                dev.connect(addr, qi, params(e, !e.crc))
                    .map_err(|x| err(format!("connect: {x}")))?,
            ),
            (true, None, None) => return Err(err("no address to connect to")),
        };
        for (q, crc) in std::iter::once((&qp, e.crc)).chain(alt.iter().map(|q| (q, !e.crc))) {
            let n = q.negotiated();
            if n.crc != crc || n.markers_tx != e.markers || n.markers_rx != e.markers {
                return Err(err(format!("negotiated {n:?}, wanted {e:?} (crc {crc})")));
            }
        }
        Ok(Self {
            dev,
            cq,
            qp,
            alt,
            buf,
            src,
            peer,
            _listener: listener,
            tx: l.meet_tx,
            rx: l.meet_rx,
        })
    }

    /// Wait for the other side to get here too, driving the engine (so
    /// what we posted keeps moving).
    pub fn meet(&self) -> io::Result<()> {
        self.tx
            .send(())
            .map_err(|_| err("the other side is gone"))?;
        let start = Instant::now();
        loop {
            match self.rx.try_recv() {
                Ok(()) => return Ok(()),
                Err(TryRecvError::Disconnected) => return Err(err("the other side is gone")),
                Err(TryRecvError::Empty) => {}
            }
            if self.dev.progress() == 0 && start.elapsed() > WAIT {
                return Err(err("the other side did not arrive"));
            }
        }
    }

    /// [`Side::meet`] without spinning: blocks on the other side (for a
    /// side whose engine has its own progress thread).
    pub fn meet_blocking(&self, timeout: Duration) -> io::Result<()> {
        self.tx
            .send(())
            .map_err(|_| err("the other side is gone"))?;
        self.rx
            .recv_timeout(timeout)
            .map_err(|_| err("the other side did not arrive"))
    }

    /// Spin until the byte at `off` of our buffer is `v`, driving the
    /// engine (a manual device: `Mr::wait_byte` runs its passes).
    fn spin_byte(&self, off: usize, v: u8) -> io::Result<()> {
        if self.buf.wait_byte(off, v, Some(WAIT)) {
            return Ok(());
        }
        self.check_cq()?;
        Err(err(format!(
            "byte {off} never became {v} (state {:?}, {:?})",
            self.qp.state(),
            self.dev.stats()
        )))
    }

    /// Fails on a completion with an error status; returns successes.
    fn check_cq(&self) -> io::Result<usize> {
        let mut wc = [EMPTY_WC; 64];
        let n = self.cq.poll(&mut wc);
        if let Some(w) = wc[..n].iter().find(|w| w.status != WcStatus::Success) {
            return Err(err(format!("completion error {w:?}")));
        }
        Ok(n)
    }

    fn write(&self, src_off: usize, dst_off: usize, len: usize, signaled: bool) -> io::Result<()> {
        self.write_on(false, src_off, dst_off, len, signaled)
    }

    /// The QP, or with `alt` the paired one ([`Engine::paired`]).
    fn lane(&self, alt: bool) -> io::Result<&Qp> {
        match (alt, &self.alt) {
            (false, _) => Ok(&self.qp),
            (true, Some(q)) => Ok(q),
            (true, None) => Err(err("no paired QP")),
        }
    }

    /// [`Side::write`] on the QP of [`Side::lane`].
    fn write_on(
        &self,
        alt: bool,
        src_off: usize,
        dst_off: usize,
        len: usize,
        signaled: bool,
    ) -> io::Result<()> {
        self.lane(alt)?
            .post_send(&SendWr {
                wr_id: src_off as u64,
                op: SendOp::Write {
                    remote_addr: self.peer.addr + dst_off as u64,
                    rkey: self.peer.rkey,
                },
                sgl: &[self.src.sge(src_off, len)],
                signaled,
            })
            .map_err(|x| err(format!("post_send: {x:?}")))
    }

    /// Like `write`, from our target buffer (the echo of what arrived).
    fn echo(&self, len: usize) -> io::Result<()> {
        self.qp
            .post_send(&SendWr {
                wr_id: 0,
                op: SendOp::Write {
                    remote_addr: self.peer.addr,
                    rkey: self.peer.rkey,
                },
                sgl: &[self.buf.sge(0, len)],
                signaled: false,
            })
            .map_err(|x| err(format!("post_send: {x:?}")))
    }

    /// Disconnect and let the engine finish for a moment.
    pub fn close(self) {
        self.qp.disconnect();
        if let Some(q) = &self.alt {
            q.disconnect();
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(20) {
            self.dev.progress();
        }
        debug_stats(&self.dev);
    }
}

/// With `IWARP_BENCH_DEBUG` set: print `dev`'s counters, named after the
/// calling thread (the side).
pub fn debug_stats(dev: &Device) {
    if std::env::var_os("IWARP_BENCH_DEBUG").is_some() {
        eprintln!(
            "{}: {:#?}",
            std::thread::current().name().unwrap_or("?"),
            dev.stats()
        );
    }
}

/// Value of iteration `i` in a last-byte protocol: never 0 (the reset
/// value) and different from the previous iteration's.
pub fn tag(i: usize) -> u8 {
    (i % 255) as u8 + 1
}

/// RDMA Write ping-pong, side a: for each size, `warmup + n` round trips
/// (a writes `size` bytes into b's buffer, b sees the last byte change
/// and writes them back); returns the half round trips in µs after the
/// warm-up, per size.
pub fn pingpong_a(s: &Side, sizes: &[usize], warmup: usize, n: usize) -> io::Result<Vec<Vec<f64>>> {
    let mut out = Vec::new();
    for &size in sizes {
        let last = size - 1;
        s.meet()?;
        s.buf.write(last, &[0]);
        s.meet()?;
        let mut v = Vec::with_capacity(n);
        for i in 0..warmup + n {
            let t = tag(i);
            s.src.write(last, &[t]);
            let t0 = Instant::now();
            s.write(0, 0, size, false)?;
            s.spin_byte(last, t)?;
            let dt = t0.elapsed();
            if i >= warmup {
                v.push(dt.as_secs_f64() * 1e6 / 2.0);
            }
        }
        s.check_cq()?;
        out.push(v);
    }
    s.meet()?;
    Ok(out)
}

/// The ping-pong, side b: echoes each arrival.
pub fn pingpong_b(s: &Side, sizes: &[usize], warmup: usize, n: usize) -> io::Result<()> {
    for &size in sizes {
        let last = size - 1;
        s.meet()?;
        s.buf.write(last, &[0]);
        s.meet()?;
        for i in 0..warmup + n {
            s.spin_byte(last, tag(i))?;
            s.echo(size)?;
        }
        s.check_cq()?;
    }
    s.meet()
}

/// One bandwidth measurement of one size.
#[derive(Clone, Debug)]
pub struct BwResult {
    /// Writes per round.
    pub count: usize,
    /// Gb/s of payload, per round.
    pub gbps: Vec<f64>,
}

/// Writes per round of `size` bytes: `bytes / size`, at least 1, at most
/// `max_msgs`.
pub fn count_for(size: usize, bytes: usize, max_msgs: usize) -> usize {
    (bytes / size.max(1)).clamp(1, max_msgs.max(1))
}

/// Unidirectional RDMA Write spray, side a (sender): per size, `rounds`
/// rounds of `count_for(..)` writes with at most `depth` outstanding;
/// the last write of a round carries a tag in its last byte; the round
/// ends when b's 4-byte answer (an RDMA Write) arrives.
pub fn spray_a(
    s: &Side,
    sizes: &[usize],
    depth: usize,
    rounds: usize,
    bytes: usize,
    max_msgs: usize,
) -> io::Result<Vec<BwResult>> {
    let mut out = Vec::new();
    let mut r = 0usize;
    for &size in sizes {
        let count = count_for(size, bytes, max_msgs);
        let mut gbps = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            gbps.push(spray_round_a(s, false, size, count, depth, tag(r))?);
            r += 1;
        }
        out.push(BwResult { count, gbps });
    }
    s.meet()?;
    Ok(out)
}

/// The spray, side b (receiver): polls the last byte of the last write,
/// then answers with a 4-byte RDMA Write.
pub fn spray_b(s: &Side, sizes: &[usize], rounds: usize) -> io::Result<()> {
    let mut r = 0usize;
    for &size in sizes {
        for _ in 0..rounds {
            spray_round_b(s, false, size, tag(r))?;
            r += 1;
        }
    }
    s.meet()
}

/// Which QP goes first in round `r` of a paired spray: the two take
/// turns, so neither always follows the other.
pub fn paired_order(r: usize) -> [bool; 2] {
    if r.is_multiple_of(2) {
        [false, true]
    } else {
        [true, false]
    }
}

/// [`spray_a`] of one size over both QPs of an [`Engine::paired`] side:
/// every round sprays on each QP once, in [`paired_order`]. Returns the
/// results of the QP with the engine's CRC setting, then of the other.
pub fn spray_paired_a(
    s: &Side,
    size: usize,
    depth: usize,
    rounds: usize,
    bytes: usize,
    max_msgs: usize,
) -> io::Result<[BwResult; 2]> {
    let count = count_for(size, bytes, max_msgs);
    let mut gbps = [Vec::with_capacity(rounds), Vec::with_capacity(rounds)];
    let mut t = 0usize;
    for r in 0..rounds {
        for alt in paired_order(r) {
            gbps[usize::from(alt)].push(spray_round_a(s, alt, size, count, depth, tag(t))?);
            t += 1;
        }
    }
    s.meet()?;
    let [a, b] = gbps;
    Ok([BwResult { count, gbps: a }, BwResult { count, gbps: b }])
}

/// [`spray_b`] for [`spray_paired_a`].
pub fn spray_paired_b(s: &Side, size: usize, rounds: usize) -> io::Result<()> {
    let mut t = 0usize;
    for r in 0..rounds {
        for alt in paired_order(r) {
            spray_round_b(s, alt, size, tag(t))?;
            t += 1;
        }
    }
    s.meet()
}

/// One spray round on the QP of `s.lane(alt)`, side a; returns Gb/s.
fn spray_round_a(
    s: &Side,
    alt: bool,
    size: usize,
    count: usize,
    depth: usize,
    t: u8,
) -> io::Result<f64> {
    s.meet()?;
    s.buf.write(3, &[0]);
    s.src.write(size - 1, &[0]);
    s.src.write(2 * size - 1, &[t]);
    s.meet()?;
    let t0 = Instant::now();
    let (mut posted, mut done) = (0usize, 0usize);
    let mut spins = 0u32;
    while done < count {
        while posted < count && posted - done < depth {
            let src = if posted + 1 == count { size } else { 0 };
            s.write_on(alt, src, 0, size, true)?;
            posted += 1;
        }
        s.dev.progress();
        done += s.check_cq()?;
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096) && t0.elapsed() > WAIT {
            return Err(err("spray stalled"));
        }
    }
    s.spin_byte(3, t)?;
    let dt = t0.elapsed().as_secs_f64();
    Ok((count * size) as f64 * 8.0 / dt / 1e9)
}

/// One spray round, side b: the answer goes back on the same QP.
fn spray_round_b(s: &Side, alt: bool, size: usize, t: u8) -> io::Result<()> {
    s.meet()?;
    s.buf.write(size - 1, &[0]);
    s.src.write(0, &[0, 0, 0, t]);
    s.meet()?;
    s.spin_byte(size - 1, t)?;
    s.write_on(alt, 0, 0, 4, false)
}

/// What a timed stream moved.
#[derive(Clone, Copy, Debug)]
pub struct Moved<T> {
    /// Payload bytes of the writes completed between `start` and `end`.
    pub bytes: u64,
    /// Taken when the stream started.
    pub start: T,
    /// Taken when it stopped.
    pub end: T,
}

/// A timed unidirectional RDMA Write stream, side a (sender): `size`-byte
/// writes with at most `depth` outstanding for `secs` seconds; `mark` is
/// called at the start and at the end. With `sleep` the thread waits for
/// completions in [`Cq::wait`] (the engine's own thread runs it),
/// otherwise it spins on [`Device::progress`].
pub fn stream_a<T>(
    s: &Side,
    size: usize,
    depth: usize,
    secs: f64,
    sleep: bool,
    mut mark: impl FnMut() -> T,
) -> io::Result<Moved<T>> {
    let meet = |s: &Side| {
        if sleep {
            s.meet_blocking(WAIT)
        } else {
            s.meet()
        }
    };
    meet(s)?;
    let dur = Duration::from_secs_f64(secs);
    let mut wc = [EMPTY_WC; 64];
    let (mut posted, mut done) = (0u64, 0u64);
    let start = mark();
    let t0 = Instant::now();
    let mut spins = 0u32;
    let mut last_done = Instant::now();
    while t0.elapsed() < dur {
        while posted - done < depth as u64 {
            s.write(0, 0, size, true)?;
            posted += 1;
        }
        let n = if sleep {
            s.cq.wait(&mut wc, Some(Duration::from_millis(100)))
        } else {
            s.dev.progress();
            s.cq.poll(&mut wc)
        };
        if let Some(w) = wc[..n].iter().find(|w| w.status != WcStatus::Success) {
            return Err(err(format!("completion error {w:?}")));
        }
        done += n as u64;
        if n > 0 {
            last_done = Instant::now();
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1024) && last_done.elapsed() > WAIT {
            return Err(err("stream stalled"));
        }
    }
    let end = mark();
    let bytes = done * size as u64;
    meet(s)?;
    Ok(Moved { bytes, start, end })
}

/// The timed stream, side b (receiver): waits for side a to start and
/// to finish, spinning on [`Device::progress`] or (`sleep`) blocked
/// while the engine's own thread works.
pub fn stream_b(s: &Side, secs: f64, sleep: bool) -> io::Result<()> {
    for _ in 0..2 {
        if sleep {
            s.meet_blocking(WAIT + Duration::from_secs_f64(secs))?;
        } else {
            s.meet()?;
        }
    }
    Ok(())
}

/// Run side a's `fa` and side b's `fb` in their namespaces on their CPUs
/// over a connection of engine `e`.
#[allow(clippy::too_many_arguments)]
pub fn run_pair<A: Send + 'static>(
    topo: &Topology,
    cpus: (Option<usize>, Option<usize>),
    e: Engine,
    port: u16,
    len: usize,
    src_len: usize,
    sq_depth: usize,
    fa: impl FnOnce(&Side) -> io::Result<A> + Send + 'static,
    fb: impl FnOnce(&Side) -> io::Result<()> + Send + 'static,
) -> io::Result<A> {
    run_pair_with(topo, cpus, e, false, port, len, src_len, sq_depth, fa, fb)
}

/// [`run_pair`], with the engines' own progress threads (`threads`:
/// pinned to each side's CPU, sleeping when idle) instead of manual
/// progress.
#[allow(clippy::too_many_arguments)]
pub fn run_pair_with<A: Send + 'static>(
    topo: &Topology,
    cpus: (Option<usize>, Option<usize>),
    e: Engine,
    threads: bool,
    port: u16,
    len: usize,
    src_len: usize,
    sq_depth: usize,
    fa: impl FnOnce(&Side) -> io::Result<A> + Send + 'static,
    fb: impl FnOnce(&Side) -> io::Result<()> + Send + 'static,
) -> io::Result<A> {
    let (mut la, mut lb) = link();
    let veth = topo.veth;
    if e.ipv6 {
        topo.ipv6()?;
    }
    if e.link {
        let (a, b) =
            iwarp_engine::xdp::link(xdp_config(e, false, veth), xdp_config(e, true, veth))?;
        (la.end, lb.end) = (Some(a), Some(b));
    }
    let (ta, tb) = if threads {
        (Some(cpus.0), Some(cpus.1))
    } else {
        (None, None)
    };
    let hb = crate::topo::spawn_in(&topo.ns_b, cpus.1, "side-b", move || {
        let s = Side::connect_with(e, true, veth, port, len, src_len, sq_depth, lb, tb)?;
        let r = fb(&s);
        s.close();
        r
    })?;
    let ha = crate::topo::spawn_in(&topo.ns_a, cpus.0, "side-a", move || {
        let s = Side::connect_with(e, false, veth, port, len, src_len, sq_depth, la, ta)?;
        let r = fa(&s);
        s.close();
        r
    })?;
    let ra = ha.join().map_err(|_| err("side a panicked"))?;
    let rb = hb.join().map_err(|_| err("side b panicked"))?;
    match (ra?, rb?) {
        (Ok(a), Ok(())) => Ok(a),
        (Err(e), Ok(())) | (Ok(_), Err(e)) => Err(e),
        (Err(a), Err(b)) => Err(err(format!("side a: {a}; side b: {b}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_rounds_take_turns() {
        let firsts: Vec<bool> = (0..6).map(|r| paired_order(r)[0]).collect();
        assert_eq!(firsts, [false, true, false, true, false, true]);
        for r in 0..6 {
            let o = paired_order(r);
            assert_ne!(o[0], o[1], "each QP once per round");
        }
    }

    #[test]
    fn tags_never_zero_and_always_change() {
        for i in 0..1000 {
            assert_ne!(tag(i), 0);
            assert_ne!(tag(i), tag(i + 1));
        }
    }

    #[test]
    fn counts_are_bounded() {
        assert_eq!(count_for(1, 1 << 20, 1000), 1000);
        assert_eq!(count_for(65536, 1 << 20, 1000), 16);
        assert_eq!(count_for(1 << 21, 1 << 20, 1000), 1);
        assert_eq!(count_for(0, 10, 0), 1);
    }
}
