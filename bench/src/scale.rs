//! Many queue pairs on one engine core: side b is one AF_XDP engine
//! (manual progress, its thread spinning on one core) that accepts N
//! connections; side a opens N QPs to it (kernel-socket or AF_XDP
//! engine, one thread on the other core) and keeps a window of RDMA
//! Writes outstanding on every QP, posting round robin as completions
//! come back. Measures the aggregate throughput and the process's
//! resident memory before and after the N QPs are set up (both engines
//! live in this process: the difference is both sides' user-space
//! memory per QP; the kernel's socket buffers are not in it).

use std::io;
use std::net::SocketAddr;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

use iwarp_engine::{
    Access, Backend, ConnParams, Device, DeviceConfig, Progress, Qp, QpInit, SendOp, SendWr,
    WcStatus, XdpConfig, EMPTY_WC,
};

use crate::rdma::{retry_open, WAIT};
use crate::topo::{spawn_in, Topology, Veth, XDP_B};

fn err(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

/// The backend of the sending side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Sender {
    /// Kernel-socket engine (its socket buffers are kernel memory).
    Kernel,
    /// AF_XDP engine (both sides' smoltcp buffers are in the RSS).
    Afxdp,
}

/// What a scale run does.
#[derive(Clone, Copy, Debug)]
pub struct ScaleParams {
    /// Bytes per RDMA Write.
    pub size: usize,
    /// Outstanding writes per QP.
    pub window: usize,
    /// Seconds of counted traffic.
    pub secs: f64,
    /// Seconds of traffic before counting starts; counting also waits
    /// until every QP has seen a write complete (at most [`WAIT`] longer).
    pub warmup: f64,
    /// Backend of side a.
    pub sender: Sender,
    /// UMEM frames of the AF_XDP engines.
    pub frames: u32,
    /// Size side b's TCP buffers so N windows fit its fill ring
    /// (`iwarp_tcp::Config::fit_rx_frames`) instead of the defaults.
    pub fit: bool,
    /// Bound side b's receive buffers together by its fill ring
    /// (`iwarp_tcp::Config::rx_budget`): first come, first served.
    pub budget: bool,
    /// Receive frames side b's windows share
    /// (`iwarp_tcp::Config::window_frames`; `None`: the engine's default).
    pub window_frames: Option<usize>,
}

/// What a scale run measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScaleResult {
    /// Aggregate payload Gb/s of the writes side a saw complete over
    /// the counted seconds (for the kernel sender: taken into its socket
    /// buffers).
    pub gbps: f64,
    /// Gb/s side b received over the counted seconds (the Ethernet frames
    /// its engine took in, headers included): the aggregate measured
    /// where the data lands, which does not depend on when whole writes
    /// complete (at 10,000 QPs with four 64 KiB writes each, one round
    /// of writes takes seconds).
    pub rx_gbps: f64,
    /// Process RSS (KiB) with both devices open, before any QP.
    pub rss_before: u64,
    /// Process RSS (KiB) with the N QPs connected.
    pub rss_setup: u64,
    /// Process RSS (KiB) after the traffic.
    pub rss_traffic: u64,
    /// Process RSS (KiB) once the writes completed (see
    /// [`Self::stuck_writes`]), side b received nothing for a second (or
    /// 5 s passed), and the connections stayed quiet for twice the
    /// stacks' `idle_release` (the AF_XDP engines give quiet connections'
    /// buffer pages back).
    pub rss_idle: u64,
    /// Writes side a posted that had not completed `2 * WAIT` after the
    /// counted traffic ended (the quiet period starts then regardless).
    pub stuck_writes: usize,
    /// Side b's configured smoltcp receive + transmit buffer per
    /// connection (KiB): the most one gets (a receive buffer is cut to
    /// the connection's part of the shared frames).
    pub tcp_buffers: f64,
    /// Frames side b's AF_XDP socket dropped (rx ring full or fill ring
    /// empty) over the run.
    pub rx_dropped: u64,
    /// Side b's receive cost per frame (ns): the time of its engine
    /// passes that did work during the counted seconds, over the frames
    /// it received meanwhile (idle passes of the spinning thread left
    /// out; the warm-up, in which each connection's receive ring is first
    /// written and its pages faulted in, too).
    pub rx_frame_ns: f64,
    /// Side a's send cost per KiB written (ns): the time of its loop
    /// rounds that did work (an engine pass that did work, or
    /// completions to repost) during the counted seconds, over the KiB of
    /// the writes that completed meanwhile.
    pub tx_kib_ns: f64,
    /// Connections side a opened per second, one after the other (each
    /// connect returns once the MPA exchange is done): the time of its
    /// connect loop over N.
    pub connect_rate: f64,
    /// The share of the counted seconds side a spent in rounds that did
    /// work (see [`Self::tx_kib_ns`]) and side b in passes that did work
    /// (see [`Self::rx_frame_ns`]), from 0 to 1. A side whose share stays
    /// well below 1 waited for the other, or for the network.
    pub work: [f64; 2],
    /// The share of side a's and side b's cores (when pinned) spent in
    /// soft interrupts over side b's counted seconds: the kernel's
    /// network processing (TCP, veth, generic XDP), which takes its time
    /// from the thread on that core.
    pub softirq: Option<[f64; 2]>,
    /// Page faults of side a's and side b's threads during the counted
    /// seconds: pages of the connections' buffers touched for the first
    /// time. At thousands of QPs the first touches go on past the
    /// warm-up, and the counted seconds carry their cost.
    pub faults: [u64; 2],
}

/// `VmRSS` (KiB) of a `/proc/self/status` text.
pub fn parse_rss(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_ascii_whitespace().next()?.parse().ok())
}

/// This process's resident set (KiB).
pub fn rss() -> io::Result<u64> {
    parse_rss(&std::fs::read_to_string("/proc/self/status")?)
        .ok_or_else(|| err("no VmRSS in /proc/self/status"))
}

/// `(after - before) / n` in KiB (0 if memory went down).
pub fn per_qp(before: u64, after: u64, n: usize) -> f64 {
    after.saturating_sub(before) as f64 / n.max(1) as f64
}

fn xdp(veth: Veth, side_b: bool, frames: u32) -> XdpConfig {
    let mut c = veth.xdp(side_b);
    c.frames = frames;
    c
}

fn manual(seed: u64) -> DeviceConfig {
    DeviceConfig {
        progress: Progress::Manual,
        seed: Some(seed),
        busy_poll: false,
    }
}

/// How long side b receives nothing before its connections' quiet
/// period starts.
const RX_SILENCE: Duration = Duration::from_secs(1);

/// The longest side b waits for that silence.
const RX_SILENCE_MAX: Duration = Duration::from_secs(5);

/// Spin `dev`'s engine until a message arrives on `rx`.
fn spin_recv<T>(dev: &Device, rx: &Receiver<T>, timeout: Duration) -> io::Result<T> {
    spin_recv_timed(dev, rx, timeout).map(|(t, _)| t)
}

/// Side b's passes while [`spin_recv_timed`] waited.
#[derive(Clone, Copy, Debug, Default)]
struct Spun {
    /// Time in passes that did work.
    busy: Duration,
    /// Passes.
    passes: u64,
    /// Passes that did work.
    worked: u64,
}

/// [`spin_recv`], also returning the passes it ran and the time spent in
/// those that did work.
fn spin_recv_timed<T>(dev: &Device, rx: &Receiver<T>, timeout: Duration) -> io::Result<(T, Spun)> {
    let start = Instant::now();
    let mut spun = Spun::default();
    loop {
        match rx.try_recv() {
            Ok(t) => return Ok((t, spun)),
            Err(TryRecvError::Disconnected) => return Err(err("the other side is gone")),
            Err(TryRecvError::Empty) if start.elapsed() > timeout => {
                return Err(err("the other side did not answer"))
            }
            Err(TryRecvError::Empty) => {
                let t = Instant::now();
                spun.passes += 1;
                if dev.progress() > 0 {
                    spun.busy += t.elapsed();
                    spun.worked += 1;
                }
            }
        }
    }
}

/// Page faults of the calling thread so far (minor and major).
fn thread_faults() -> u64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_THREAD)
        .map(|u| (u.minor_page_faults() + u.major_page_faults()) as u64)
        .unwrap_or(0)
}

/// Frames side b's user-space TCP has received.
fn rx_frames(dev: &Device) -> u64 {
    dev.stats().engines.iter().map(|e| e.tcp.rx_frames).sum()
}

/// Bytes of those frames.
fn rx_bytes(dev: &Device) -> u64 {
    dev.stats().engines.iter().map(|e| e.tcp.rx_bytes).sum()
}

/// Side a's figures of a [`ScaleResult`].
struct SideA {
    gbps: f64,
    stuck_writes: usize,
    tx_kib_ns: f64,
    connect_rate: f64,
    /// Share of the counted seconds in rounds that did work.
    work: f64,
    /// Page faults of side a's thread in the counted seconds.
    faults: u64,
}

/// Side b's buffer as side a sees it.
#[derive(Clone, Copy, Debug)]
struct Target {
    addr: SocketAddr,
    va: u64,
    rkey: u32,
}

/// One run with `n` QPs.
pub fn run(
    topo: &Topology,
    cpus: (Option<usize>, Option<usize>),
    n: usize,
    port: u16,
    p: ScaleParams,
) -> io::Result<ScaleResult> {
    let veth = topo.veth;
    let (to_a, from_b) = mpsc::channel::<Target>();
    let (to_b, from_a) = mpsc::channel::<()>();
    let (back_a, b_says) = mpsc::channel::<()>();
    let hb = spawn_in(&topo.ns_b, cpus.1, "scale-b", move || -> io::Result<_> {
        let mut cfg = xdp(veth, true, p.frames);
        let mss = veth.mtu.saturating_sub(40);
        if p.fit {
            cfg.tcp = cfg.tcp.fit_rx_frames(p.frames as usize / 2, mss, n);
        }
        if p.budget {
            cfg.tcp.rx_budget = Some(p.frames as usize / 2 * mss);
        }
        cfg.tcp.window_frames = p.window_frames;
        let tcp_buffers = (cfg.tcp.rx_buffer + cfg.tcp.tx_buffer) as f64 / 1024.0;
        let dev = retry_open(|| Device::open(Backend::AfXdp(cfg.clone()), manual(2)))?;
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(64);
        let buf = dev.reg_mr(&pd, p.size, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        let lis = dev
            .listen(SocketAddr::new(XDP_B.into(), port))
            .map_err(|e| err(format!("listen: {e}")))?;
        to_a.send(Target {
            addr: lis.local_addr(),
            va: buf.addr(),
            rkey: buf.rkey(),
        })
        .map_err(|_| err("side a is gone"))?;
        // Side a has opened its device too.
        spin_recv(&dev, &from_a, WAIT)?;
        let rss_before = rss()?;
        let mut qps: Vec<Qp> = Vec::with_capacity(n);
        for i in 0..n {
            let req = lis
                .get_request(Some(WAIT))
                .map_err(|e| err(format!("get_request {i}: {e}")))?;
            let qi = QpInit {
                pd: pd.clone(),
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                sq_depth: 4,
                rq_depth: 4,
                sig_all: false,
                srq: None,
            };
            qps.push(
                req.accept(qi, ConnParams::default())
                    .map_err(|e| err(format!("accept {i}: {e}")))?,
            );
        }
        // Side a has all N connected.
        spin_recv(&dev, &from_a, WAIT)?;
        let rss_setup = rss()?;
        // With IWARP_BENCH_DEBUG: the counters after setup, to tell the
        // drops of the setup from those of the traffic.
        crate::rdma::debug_stats(&dev);
        let frames_before = rx_frames(&dev);
        back_a.send(()).map_err(|_| err("side a is gone"))?;
        let faults_before = thread_faults();
        // The traffic runs until side a says it counts, then until it
        // says it is done. Side b's cost is taken over the counted
        // seconds, as its bandwidth: the warm-up is where each
        // connection's receive ring is first written (its pages faulted
        // in).
        let ((), warm) =
            spin_recv_timed(&dev, &from_a, 2 * WAIT + Duration::from_secs_f64(p.warmup))?;
        let (bytes_before, counting) = (rx_bytes(&dev), Instant::now());
        let (frames_counting, faults_counting) = (rx_frames(&dev), thread_faults());
        let pinned = match cpus {
            (Some(a), Some(b)) => Some([a, b]),
            _ => None,
        };
        let cores_counting = pinned.and_then(|c| crate::load::read_cpus(c).ok());
        let ((), count) = spin_recv_timed(&dev, &from_a, WAIT + Duration::from_secs_f64(p.secs))?;
        let counted = counting.elapsed().as_secs_f64();
        let softirq = pinned.zip(cores_counting).and_then(|(c, before)| {
            let now = crate::load::read_cpus(c).ok()?;
            let share = |i: usize| now[i].since(&before[i]).softirq_share();
            Some([share(0)?, share(1)?])
        });
        let b_work = count.busy.as_secs_f64() / counted.max(f64::MIN_POSITIVE);
        let rx_gbps = rx_bytes(&dev).saturating_sub(bytes_before) as f64 * 8.0 / counted / 1e9;
        let frames_end = rx_frames(&dev);
        let frames = frames_end.saturating_sub(frames_counting);
        let rx_frame_ns = count.busy.as_nanos() as f64 / frames.max(1) as f64;
        let faults_end = thread_faults();
        let b_faults = faults_end.saturating_sub(faults_counting);
        if std::env::var_os("IWARP_BENCH_DEBUG").is_some() {
            let line = |what: &str, spun: &Spun, frames: u64, faults: u64| {
                let per = |x: f64| x / spun.worked.max(1) as f64;
                eprintln!(
                    "scale-b: {what}: {} passes, {} did work: {:.2} frames and {:.0} ns per pass that did work, {:.0} ns per frame; {faults} page faults",
                    spun.passes,
                    spun.worked,
                    per(frames as f64),
                    per(spun.busy.as_nanos() as f64),
                    spun.busy.as_nanos() as f64 / frames.max(1) as f64,
                );
            };
            line(
                "warm-up",
                &warm,
                frames_counting.saturating_sub(frames_before),
                faults_counting.saturating_sub(faults_before),
            );
            line("counted", &count, frames, b_faults);
        }
        let rss_traffic = rss()?;
        crate::rdma::debug_stats(&dev);
        let st = dev.stats();
        if qps.iter().any(|q| q.state() != iwarp_engine::QpState::Rts) {
            return Err(err(format!("a QP left RTS ({st:?})")));
        }
        // The writes side a posted have completed (or are counted as
        // stuck); the connections go quiet long enough to give their
        // buffers back.
        spin_recv(&dev, &from_a, 3 * WAIT)?;
        // A write completes on side a once its bytes are in flight (a
        // kernel socket took them), not once they arrived: the quiet
        // period starts when no frame has come in for a second, or after
        // at most `RX_SILENCE_MAX` (side a waits for the result `2 *
        // WAIT`).
        let (mut last, mut seen, waited) = (Instant::now(), rx_frames(&dev), Instant::now());
        while last.elapsed() < RX_SILENCE && waited.elapsed() < RX_SILENCE_MAX {
            if dev.progress() == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let now = rx_frames(&dev);
            if now != seen {
                (seen, last) = (now, Instant::now());
            }
        }
        let quiet = cfg.tcp.idle_release.map_or(Duration::ZERO, |d| {
            Duration::from_micros(2 * d.total_micros()) + Duration::from_millis(200)
        });
        let t = Instant::now();
        while t.elapsed() < quiet {
            if dev.progress() == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let rss_idle = rss()?;
        crate::rdma::debug_stats(&dev);
        back_a.send(()).map_err(|_| err("side a is gone"))?;
        drop(qps);
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(50) {
            dev.progress();
        }
        // Side b's part of the result; side a's figures are set below.
        Ok(ScaleResult {
            gbps: 0.0,
            rx_gbps,
            rss_before,
            rss_setup,
            rss_traffic,
            rss_idle,
            stuck_writes: 0,
            tcp_buffers,
            rx_dropped: st.xdp.map_or(0, |x| x.rx_dropped + x.rx_ring_full),
            rx_frame_ns,
            tx_kib_ns: 0.0,
            connect_rate: 0.0,
            work: [0.0, b_work],
            softirq,
            faults: [0, b_faults],
        })
    })?;
    let ha = spawn_in(
        &topo.ns_a,
        cpus.0,
        "scale-a",
        move || -> io::Result<SideA> {
            let backend = match p.sender {
                Sender::Kernel => Backend::Kernel,
                Sender::Afxdp => Backend::AfXdp(xdp(veth, false, p.frames)),
            };
            let dev = retry_open(|| Device::open(backend.clone(), manual(1)))?;
            let pd = dev.alloc_pd();
            let cq = dev.create_cq(n * p.window + 64);
            let src = dev.reg_mr(&pd, p.size, Access::LOCAL_WRITE)?;
            let t = from_b
                .recv_timeout(WAIT)
                .map_err(|_| err("side b did not listen"))?;
            to_b.send(()).map_err(|_| err("side b is gone"))?;
            let mut qps: Vec<Qp> = Vec::with_capacity(n);
            let connecting = Instant::now();
            for i in 0..n {
                let qi = QpInit {
                    pd: pd.clone(),
                    send_cq: cq.clone(),
                    recv_cq: cq.clone(),
                    sq_depth: p.window + 4,
                    rq_depth: 4,
                    sig_all: false,
                    srq: None,
                };
                qps.push(
                    dev.connect(t.addr, qi, ConnParams::default())
                        .map_err(|e| err(format!("connect {i}: {e}")))?,
                );
            }
            let connect_rate = n as f64 / connecting.elapsed().as_secs_f64();
            to_b.send(()).map_err(|_| err("side b is gone"))?;
            spin_recv(&dev, &b_says, WAIT)?;
            let post = |q: usize| {
                qps[q]
                    .post_send(&SendWr {
                        wr_id: q as u64,
                        op: SendOp::Write {
                            remote_addr: t.va,
                            rkey: t.rkey,
                        },
                        sgl: &[src.sge(0, p.size)],
                        signaled: true,
                    })
                    .map_err(|e| err(format!("post_send on QP {q}: {e:?}")))
            };
            for _ in 0..p.window {
                for q in 0..n {
                    post(q)?;
                }
            }
            let mut wc = vec![EMPTY_WC; 256];
            let t0 = Instant::now();
            let warm = Duration::from_secs_f64(p.warmup);
            let count = Duration::from_secs_f64(p.secs);
            let (mut counted, mut last) = (0u64, Instant::now());
            let mut counting: Option<Instant> = None;
            // Side a's rounds that did work while counting.
            let mut busy = Duration::ZERO;
            // This thread's page faults when the counting started.
            let mut faults_counting = 0;
            // QPs that have not seen a write complete yet.
            let mut cold = vec![true; n];
            let mut cold_left = n;
            loop {
                let round = Instant::now();
                let el = round.duration_since(t0);
                if counting.is_some_and(|c| c.elapsed() >= count) {
                    break;
                }
                if counting.is_none() && el >= warm && (cold_left == 0 || el >= warm + WAIT) {
                    counting = Some(Instant::now());
                    faults_counting = thread_faults();
                    to_b.send(()).map_err(|_| err("side b is gone"))?;
                }
                let worked = dev.progress();
                let k = cq.poll(&mut wc);
                if k > 0 {
                    last = Instant::now();
                } else if last.elapsed() > WAIT {
                    return Err(err(format!("stalled ({:?})", dev.stats())));
                }
                for w in &wc[..k] {
                    if w.status != WcStatus::Success {
                        return Err(err(format!("completion error {w:?}")));
                    }
                    if counting.is_some() {
                        counted += p.size as u64;
                    }
                    let q = w.wr_id as usize;
                    if cold.get(q).copied().unwrap_or(false) {
                        cold[q] = false;
                        cold_left -= 1;
                    }
                    post(q)?;
                }
                if counting.is_some() && (worked > 0 || k > 0) {
                    busy += round.elapsed();
                }
            }
            let dt = counting.map_or(0.0, |c| c.elapsed().as_secs_f64());
            let tx_kib_ns = busy.as_nanos() as f64 / (counted as f64 / 1024.0).max(1.0);
            let work = busy.as_secs_f64() / dt.max(f64::MIN_POSITIVE);
            let faults = thread_faults().saturating_sub(faults_counting);
            crate::rdma::debug_stats(&dev);
            to_b.send(()).map_err(|_| err("side b is gone"))?;
            // The writes still outstanding complete (those that have not
            // after `2 * WAIT` are counted); then side b waits for the
            // connections to go quiet (this side's engine runs meanwhile).
            let mut outstanding = n * p.window;
            let drained = Instant::now();
            while outstanding > 0 && drained.elapsed() < 2 * WAIT {
                dev.progress();
                let k = cq.poll(&mut wc);
                if let Some(w) = wc[..k].iter().find(|w| w.status != WcStatus::Success) {
                    return Err(err(format!("completion error {w:?}")));
                }
                outstanding = outstanding.saturating_sub(k);
            }
            to_b.send(()).map_err(|_| err("side b is gone"))?;
            spin_recv(&dev, &b_says, 2 * WAIT)?;
            // With IWARP_BENCH_DEBUG: this side's counters once quiet.
            crate::rdma::debug_stats(&dev);
            drop(qps);
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(50) {
                dev.progress();
            }
            let gbps = if dt > 0.0 {
                counted as f64 * 8.0 / dt / 1e9
            } else {
                0.0
            };
            Ok(SideA {
                gbps,
                stuck_writes: outstanding,
                tx_kib_ns,
                connect_rate,
                work,
                faults,
            })
        },
    )?;
    let ra = ha.join().map_err(|_| err("side a panicked"))?;
    let rb = hb.join().map_err(|_| err("side b panicked"))?;
    match (ra?, rb?) {
        (Ok(a), Ok(b)) => Ok(ScaleResult {
            gbps: a.gbps,
            stuck_writes: a.stuck_writes,
            tx_kib_ns: a.tx_kib_ns,
            connect_rate: a.connect_rate,
            work: [a.work, b.work[1]],
            faults: [a.faults, b.faults[1]],
            ..b
        }),
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
        (Err(a), Err(b)) => Err(err(format!("side a: {a}; side b: {b}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_parses() {
        let s = "Name:\tx\nVmPeak:\t  9000 kB\nVmRSS:\t    5120 kB\nRssAnon:\t 100 kB\n";
        assert_eq!(parse_rss(s), Some(5120));
        assert_eq!(parse_rss("Name: x\n"), None);
        assert_eq!(parse_rss("VmRSS: lots\n"), None);
    }

    #[test]
    fn per_qp_arithmetic() {
        assert_eq!(per_qp(1000, 1000 + 16 * 300, 16), 300.0);
        assert_eq!(per_qp(2000, 1000, 4), 0.0);
        assert_eq!(per_qp(0, 10, 0), 10.0);
    }
}
