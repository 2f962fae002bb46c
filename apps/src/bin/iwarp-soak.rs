//! iwarp-soak: a long run of one AF_XDP engine serving many QPs, then the
//! peer killed mid-transfer and an engine restarted after a crash. Run by
//! `scripts/soak`, which builds two network namespaces joined by veth and
//! starts `iwarp-soak run` in the server's namespace.
//!
//! * `run` (server, namespace b, interface `xb`): opens one AF_XDP engine
//!   whose progress thread is pinned to one core, listens, and spawns the
//!   client (`ip netns exec A iwarp-soak client …`) as a child process. It
//!   accepts every QP, verifies every Send it receives and samples its own
//!   RSS. After the soak it asks the client for its report, kills it with
//!   SIGKILL mid-transfer and measures how long its QPs take to reach
//!   Error with every posted receive flushed. Then it checks that the dead
//!   client's XDP socket is gone, starts a second client on the same
//!   interface (its steering program must replace the stale one), lets it
//!   run a few seconds and checks that nothing is left on the interface
//!   after it exits. It prints a summary with PASS/FAIL per property and
//!   exits non-zero on any FAIL.
//! * `client` (namespace a, interface `xa`): an AF_XDP engine opening N QPs
//!   to the server and running, on every QP, RDMA Write → RDMA Read of the
//!   same bytes (compared) → Send (verified by the server) of assorted
//!   sizes, until killed or `--seconds` pass. It reports progress and RSS
//!   on stdout every 2 s and on request (a `report` line on stdin).
//!
//! RSS is judged stable when, after a warm-up of the first 20 % of the
//! samples, the last sample is at most the first warm sample plus a margin
//! (max(4 MiB, 5 %)) and the largest sample of the second half of the
//! warm samples is at most the largest of the first half plus the same
//! margin (no upward trend).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write as _};
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use iwarp_apps::{errln, outln};
use iwarp_engine::xdp::AttachMode;
use iwarp_engine::{
    Access, Backend, ConnParams, Cq, Device, DeviceConfig, Mr, Progress, Qp, QpInit, QpState,
    RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, XdpConfig, EMPTY_WC,
};
use iwarp_tcp::smoltcp::time::Duration as TcpDuration;

type Res<T> = Result<T, String>;

const IP_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const PORT: u16 = 7174;
/// Server region per QP (the client's RDMA Write / Read target).
const SLOT: usize = 64 * 1024;
/// RDMA Write / Read sizes.
const RDMA_SIZES: [usize; 8] = [1, 7, 512, 1460, 4096, 9000, 16387, 65536];
/// Send sizes (the first 12 bytes say who sent what).
const SEND_SIZES: [usize; 6] = [12, 64, 1000, 1460, 4000, 16387];
/// Receive buffer: the largest Send.
const RECV_LEN: usize = 16 * 1024 + 64;
/// Largest reply Send of the server.
const REPLY_MAX: usize = 1024;
/// wr_id bit of the server's reply Sends.
const REPLY_TAG: u64 = 1 << 63;
/// Receives the server keeps posted per QP.
const RECVS: usize = 2;
/// Keep-alive interval and abort timeout of the user-space TCP: a peer
/// that stops answering is declared dead after `TCP_TIMEOUT`.
const KEEP_ALIVE: Duration = Duration::from_secs(1);
const TCP_TIMEOUT: Duration = Duration::from_secs(5);
/// RSS sampling period.
const SAMPLE: Duration = Duration::from_secs(2);
/// Progress line period.
const PRINT: Duration = Duration::from_secs(60);
/// QPs the restart check opens.
const RESTART_QPS: usize = 4;
/// How long the restart check runs.
const RESTART_SECS: f64 = 4.0;

#[derive(Parser, Debug)]
#[command(about = "soak run of the AF_XDP engine (see scripts/soak)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// The stack's log on stderr at debug level (`RUST_LOG`, when set,
    /// chooses its filter instead).
    #[arg(short = 'd', long = "debug", global = true)]
    debug: bool,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// The server and the orchestration (in namespace b, interface xb).
    Run(RunArgs),
    /// The client (in namespace a, interface xa); spawned by `run`.
    Client(ClientArgs),
}

#[derive(Args, Debug, Clone)]
struct RunArgs {
    /// The client's namespace.
    #[arg(long)]
    ns_a: String,
    /// Soak duration in minutes (fractions allowed).
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// QPs between client and server.
    #[arg(long, default_value_t = 1000)]
    qps: usize,
    /// A QP with an operation outstanding and no completion for this many
    /// seconds is stalled.
    #[arg(long, default_value_t = 10.0)]
    stall_secs: f64,
    /// Core of the server's progress thread.
    #[arg(long, default_value_t = 0)]
    cpu: usize,
    /// Core of the client's progress thread.
    #[arg(long, default_value_t = 1)]
    client_cpu: usize,
}

#[derive(Args, Debug, Clone)]
struct ClientArgs {
    #[arg(long)]
    addr: SocketAddr,
    #[arg(long)]
    rkey: u32,
    /// Tagged address of the server region's byte 0.
    #[arg(long)]
    raddr: u64,
    /// First server slot this client may use.
    #[arg(long, default_value_t = 0)]
    first_slot: usize,
    #[arg(long)]
    qps: usize,
    /// Stop (cleanly) after this many seconds; without it, run until
    /// killed.
    #[arg(long)]
    seconds: Option<f64>,
    #[arg(long, default_value_t = 10.0)]
    stall_secs: f64,
    #[arg(long, default_value_t = 1)]
    cpu: usize,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.debug && std::env::var_os("RUST_LOG").is_none() {
        // The client processes `run` spawns inherit the filter.
        std::env::set_var("RUST_LOG", iwarp_apps::logging::DEBUG_FILTER);
    }
    iwarp_apps::logging::init("iwarp-soak", cli.debug);
    let r = match cli.cmd {
        Cmd::Run(a) => run(&a),
        Cmd::Client(a) => client(&a),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            errln!("iwarp-soak: {e}");
            ExitCode::from(2)
        }
    }
}

// ---------------------------------------------------------------- common

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// RSS samples (KiB) and the stability rule of the module documentation.
#[derive(Default)]
struct Rss {
    samples: Vec<u64>,
}

struct RssVerdict {
    start: u64,
    warm: u64,
    max: u64,
    end: u64,
    stable: bool,
}

impl Rss {
    fn verdict(&self) -> RssVerdict {
        let s = &self.samples;
        let start = s.first().copied().unwrap_or(0);
        let end = s.last().copied().unwrap_or(0);
        let max = s.iter().copied().max().unwrap_or(0);
        let skip = (s.len() / 5).min(s.len().saturating_sub(1));
        let warm_s = &s[skip..];
        let warm = warm_s.first().copied().unwrap_or(0);
        let margin = (4 * 1024).max(warm / 20);
        let (h1, h2) = warm_s.split_at(warm_s.len() / 2);
        let m1 = h1.iter().copied().max().unwrap_or(warm);
        let m2 = h2.iter().copied().max().unwrap_or(0);
        let stable = !s.is_empty() && end <= warm + margin && m2 <= m1 + margin;
        RssVerdict {
            start,
            warm,
            max,
            end,
            stable,
        }
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn xdp_config(ifname: &str, ip: Ipv4Addr, qps: usize) -> XdpConfig {
    let mut c = XdpConfig::new(ifname, ip, 24);
    c.attach = AttachMode::Native;
    // Sleep in epoll when idle: the machine is shared.
    c.busy_poll = false;
    // Windows that all QPs together cannot overrun the fill ring with:
    // the smallest window (MIN_BUFFER) is a few segments, and each QP's
    // own data in flight brings ACK frames back, so many QPs need more
    // than the default frames (half of them fill the ring). With data
    // segments only (no room for ACKs) 1000 QPs still ran the ring dry
    // when the engine's core was busy elsewhere: losses, RTO backoff,
    // QPs without a completion for over 10 s.
    let mss = c.mtu - 40;
    let segs = iwarp_tcp::MIN_BUFFER.div_ceil(mss) + 2;
    let need = (2 * qps * segs).next_power_of_two();
    c.frames = c.frames.max(u32::try_from(need).unwrap_or(u32::MAX));
    c.tcp = c.tcp.fit_rx_frames(c.frames as usize / 2, mss, qps);
    c.tcp.keep_alive = Some(TcpDuration::from_millis(KEEP_ALIVE.as_millis() as u64));
    c.tcp.timeout = Some(TcpDuration::from_millis(TCP_TIMEOUT.as_millis() as u64));
    c
}

fn open(ifname: &str, ip: Ipv4Addr, qps: usize, cpu: usize) -> Res<Device> {
    let cfg = DeviceConfig {
        progress: Progress::Thread { cpu: Some(cpu) },
        seed: None,
        busy_poll: false,
    };
    Device::open(Backend::AfXdp(xdp_config(ifname, ip, qps)), cfg)
        .map_err(|e| format!("open AF_XDP engine on {ifname}: {e}"))
}

fn params() -> ConnParams {
    ConnParams {
        crc: true,
        timeout: Duration::from_secs(20),
        ..ConnParams::default()
    }
}

fn init(cq: &Cq, pd: &iwarp_engine::Pd) -> QpInit {
    QpInit {
        pd: pd.clone(),
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        sq_depth: 4,
        rq_depth: RECVS + 2,
        sig_all: false,
        srq: None,
    }
}

/// Byte `i` of the pattern with `seed`.
fn pat(i: usize, seed: u32) -> u8 {
    let x = (i as u32).wrapping_mul(0x9e37_79b1) ^ seed.wrapping_mul(0x85eb_ca6b);
    (x ^ (x >> 13) ^ (i >> 8) as u32) as u8
}

/// The server's reply to Send number `seq`: `seq`, then a pattern.
fn reply_for(seq: u32) -> Vec<u8> {
    let len = [8, 100, 1000][(seq % 3) as usize];
    let mut b = vec![0; len];
    b[..4].copy_from_slice(&seq.to_be_bytes());
    fill(&mut b[4..], seq ^ 0x5eed);
    b
}

fn reply_ok(got: &[u8], seq: u32) -> bool {
    got == reply_for(seq)
}

fn fill(buf: &mut [u8], seed: u32) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pat(i, seed);
    }
}

/// The XDP program id attached to `dev` (`ip link` in this namespace).
fn xdp_prog_id(ns: Option<&str>, dev: &str) -> Option<u64> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = ns {
        cmd.args(["-n", ns]);
    }
    let out = cmd.args(["-d", "link", "show", "dev", dev]).output().ok()?;
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    let words: Vec<&str> = s.split_whitespace().collect();
    // "prog/xdp id N" (native) or "prog/xdpgeneric id N".
    words
        .windows(3)
        .find(|w| w[0].starts_with("prog/xdp") && w[1] == "id")
        .and_then(|w| w[2].parse().ok())
}

/// XDP (AF_XDP) sockets open in namespace `ns`: the "sockets" column of
/// its `/proc/net/protocols` (per namespace; `ss --xdp` needs
/// CONFIG_XDP_SOCKETS_DIAG, which kernels may lack).
fn xsk_count(ns: &str) -> Option<usize> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat", "/proc/net/protocols"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next() == Some("XDP")).then(|| w.nth(1)?.parse().ok())?
    })
}

// ---------------------------------------------------------------- client

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Write,
    Read,
    Send,
}

struct Slot {
    qp: Qp,
    step: Step,
    len: usize,
    seed: u32,
    seq: u32,
    rng: u64,
    last: Instant,
    stalled: bool,
    dead: bool,
    /// Step::Send: our Send completed / the server's reply arrived.
    sent: bool,
    replied: bool,
}

impl Slot {
    fn next_rand(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[derive(Default)]
struct ClientStats {
    writes: u64,
    reads: u64,
    sends: u64,
    /// The server's Sends received.
    replies: u64,
    bytes: u64,
    errors: u64,
    verify_fail: u64,
    stalled_qps: u64,
    max_gap: Duration,
    /// Which QP had the longest gap, and in which step.
    max_gap_at: String,
}

impl ClientStats {
    fn ops(&self) -> u64 {
        self.writes + self.reads + self.sends + self.replies
    }
}

struct Client<'a> {
    a: &'a ClientArgs,
    src: Mr,
    dst: Mr,
    /// The server's replies, one REPLY_MAX slot per QP.
    rbuf: Mr,
    slots: Vec<Slot>,
    st: ClientStats,
}

impl Client<'_> {
    fn post(&mut self, i: usize) {
        let s = &mut self.slots[i];
        let off = i * SLOT;
        let remote = self.a.raddr + ((self.a.first_slot + i) * SLOT) as u64;
        let wr_id = i as u64;
        let r = match s.step {
            Step::Write => {
                let r = s.next_rand();
                s.len = RDMA_SIZES[(r % RDMA_SIZES.len() as u64) as usize];
                s.seed = (r >> 32) as u32;
                let mut buf = vec![0; s.len];
                fill(&mut buf, s.seed);
                self.src.write(off, &buf);
                s.qp.post_send(&SendWr {
                    wr_id,
                    op: SendOp::Write {
                        remote_addr: remote,
                        rkey: self.a.rkey,
                    },
                    sgl: &[self.src.sge(off, s.len)],
                    signaled: true,
                })
            }
            Step::Read => {
                self.dst.write(off, &vec![0; s.len]);
                s.qp.post_send(&SendWr {
                    wr_id,
                    op: SendOp::Read {
                        remote_addr: remote,
                        rkey: self.a.rkey,
                    },
                    sgl: &[self.dst.sge(off, s.len)],
                    signaled: true,
                })
            }
            Step::Send => {
                let r = s.next_rand();
                s.len = SEND_SIZES[(r % SEND_SIZES.len() as u64) as usize];
                s.seed = (r >> 32) as u32;
                s.seq = s.seq.wrapping_add(1);
                let mut buf = vec![0; s.len];
                buf[0..4].copy_from_slice(&((self.a.first_slot + i) as u32).to_be_bytes());
                buf[4..8].copy_from_slice(&s.seq.to_be_bytes());
                buf[8..12].copy_from_slice(&s.seed.to_be_bytes());
                fill(&mut buf[12..], s.seed);
                self.src.write(off, &buf);
                s.sent = false;
                s.replied = false;
                // The reply's receive first: the server answers every Send
                // after re-posting its own receive, and we send again only
                // after the reply, so neither side ever lacks a receive
                // (iWARP has no receiver-not-ready retry).
                let r = s.qp.post_recv(&RecvWr {
                    wr_id,
                    sgl: &[self.rbuf.sge(i * REPLY_MAX, REPLY_MAX)],
                });
                if let Err(e) = r {
                    if !s.dead {
                        errln!("soak-client: QP {i}: post_recv: {e:?}");
                        self.st.errors += 1;
                        s.dead = true;
                    }
                    return;
                }
                s.qp.post_send(&SendWr {
                    wr_id,
                    op: SendOp::Send {
                        solicited: false,
                        invalidate: None,
                    },
                    sgl: &[self.src.sge(off, s.len)],
                    signaled: true,
                })
            }
        };
        if let Err(e) = r {
            if !s.dead {
                errln!("soak-client: QP {i}: post {:?}: {e:?}", s.step);
                self.st.errors += 1;
                s.dead = true;
            }
        }
    }

    fn complete(&mut self, wc: &WorkCompletion, now: Instant) {
        let i = wc.wr_id as usize;
        let Some(s) = self.slots.get_mut(i) else {
            self.st.errors += 1;
            return;
        };
        let gap = now.saturating_duration_since(s.last);
        if gap > self.st.max_gap {
            self.st.max_gap = gap;
            self.st.max_gap_at = format!("qp{i}:{:?}/{:?}", s.step, wc.opcode);
        }
        s.last = now;
        if wc.status != WcStatus::Success {
            if !s.dead {
                errln!("soak-client: QP {i}: {:?}", wc);
                self.st.errors += 1;
                s.dead = true;
            }
            return;
        }
        if wc.opcode == WcOpcode::Recv {
            self.st.bytes += u64::from(wc.byte_len);
        } else {
            self.st.bytes += s.len as u64;
        }
        s.step = match (s.step, wc.opcode) {
            (Step::Write, WcOpcode::RdmaWrite) => {
                self.st.writes += 1;
                Step::Read
            }
            (Step::Read, WcOpcode::RdmaRead) => {
                self.st.reads += 1;
                let mut got = vec![0; s.len];
                self.dst.read(i * SLOT, &mut got);
                if got.iter().enumerate().any(|(j, &b)| b != pat(j, s.seed)) {
                    errln!("soak-client: QP {i}: Read of {} B differs", s.len);
                    self.st.verify_fail += 1;
                }
                Step::Send
            }
            (Step::Send, WcOpcode::Send | WcOpcode::Recv) => {
                if wc.opcode == WcOpcode::Send {
                    self.st.sends += 1;
                    s.sent = true;
                } else {
                    self.st.replies += 1;
                    s.replied = true;
                    let len = wc.byte_len as usize;
                    let mut got = vec![0; len];
                    self.rbuf.read(i * REPLY_MAX, &mut got);
                    if !reply_ok(&got, s.seq) {
                        errln!("soak-client: QP {i}: reply of {len} B differs");
                        self.st.verify_fail += 1;
                    }
                }
                if !(s.sent && s.replied) {
                    return;
                }
                Step::Write
            }
            (step, op) => {
                errln!("soak-client: QP {i}: {op:?} completion in step {step:?}");
                self.st.errors += 1;
                s.dead = true;
                return;
            }
        };
        self.post(i);
    }

    /// Count QPs whose outstanding operation has waited too long.
    fn scan_stalls(&mut self, now: Instant) -> usize {
        let bound = Duration::from_secs_f64(self.a.stall_secs);
        let mut now_stalled = 0;
        for (i, s) in self.slots.iter_mut().enumerate() {
            if s.dead {
                continue;
            }
            let waiting = now.saturating_duration_since(s.last);
            if waiting > self.st.max_gap {
                self.st.max_gap_at = format!(
                    "qp{i}:{:?}(sent={},replied={}),waiting",
                    s.step, s.sent, s.replied
                );
            }
            if waiting > bound {
                now_stalled += 1;
                if !s.stalled {
                    s.stalled = true;
                    self.st.stalled_qps += 1;
                }
            }
            self.st.max_gap = self.st.max_gap.max(waiting);
        }
        now_stalled
    }

    fn line(&self, kind: &str, t: f64, rss: &Rss, stalled_now: usize, dev: &Device) -> String {
        let v = rss.verdict();
        format!(
            "{kind} t={t:.1} qps={} ops={} writes={} reads={} sends={} replies={} bytes={} errors={} verify_fail={} stalled_now={stalled_now} stalled_qps={} max_gap_ms={} max_gap_at={} {} dead={} rss_start={} rss_warm={} rss_max={} rss_end={} rss_stable={}",
            self.slots.len(),
            self.st.ops(),
            self.st.writes,
            self.st.reads,
            self.st.sends,
            self.st.replies,
            self.st.bytes,
            self.st.errors,
            self.st.verify_fail,
            self.st.stalled_qps,
            self.st.max_gap.as_millis(),
            if self.st.max_gap_at.is_empty() {
                "-"
            } else {
                &self.st.max_gap_at
            },
            dev_counters(dev),
            self.slots.iter().filter(|s| s.dead).count(),
            v.start,
            v.warm,
            v.max,
            v.end,
            v.stable,
        )
    }
}

/// Drop counters of an AF_XDP device, as `key=value` words.
fn dev_counters(dev: &Device) -> String {
    let st = dev.stats();
    let Some(x) = st.xdp else {
        return String::new();
    };
    format!(
        "rx_dropped={} rx_ring_full={} fill_ring_empty={} fill_starved={} tx_no_frame={} ingress_budget_hits={}",
        x.rx_dropped,
        x.rx_ring_full,
        x.rx_fill_ring_empty,
        x.rings.fill_starved,
        x.rings.tx_no_frame,
        st.tcp.map_or(0, |t| t.ingress_budget_hits)
    )
}

fn client(a: &ClientArgs) -> Res<bool> {
    let dev = open("xa", IP_A, a.qps, a.cpu)?;
    let prog = xdp_prog_id(None, "xa");
    outln!("xdp prog_id={}", prog.map_or(-1, |p| p as i64));
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(a.qps * 8 + 64);
    let len = a.qps * SLOT;
    let src = dev
        .reg_mr(&pd, len, Access::LOCAL_WRITE)
        .map_err(|e| format!("reg_mr: {e}"))?;
    let dst = dev
        .reg_mr(&pd, len, Access::LOCAL_WRITE)
        .map_err(|e| format!("reg_mr: {e}"))?;
    let rbuf = dev
        .reg_mr(&pd, a.qps * REPLY_MAX, Access::LOCAL_WRITE)
        .map_err(|e| format!("reg_mr: {e}"))?;
    let t0 = Instant::now();
    let mut slots = Vec::with_capacity(a.qps);
    for i in 0..a.qps {
        let qp = dev
            .connect(a.addr, init(&cq, &pd), params())
            .map_err(|e| format!("connect QP {i}: {e}"))?;
        slots.push(Slot {
            qp,
            step: Step::Write,
            len: 0,
            seed: 0,
            seq: 0,
            rng: 0x9e37_79b9_7f4a_7c15 ^ ((a.first_slot + i) as u64 + 1).wrapping_mul(0x1234_5679),
            last: Instant::now(),
            stalled: false,
            dead: false,
            sent: false,
            replied: false,
        });
    }
    outln!(
        "connected qps={} secs={:.2}",
        a.qps,
        t0.elapsed().as_secs_f64()
    );
    // stdin: "report" asks for a report line.
    let (cmd_tx, cmd_rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::stdin().lock().lines() {
            let Ok(l) = l else { break };
            if cmd_tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut c = Client {
        a,
        src,
        dst,
        rbuf,
        slots,
        st: ClientStats::default(),
    };
    let start = Instant::now();
    for s in &mut c.slots {
        s.last = start;
    }
    for i in 0..a.qps {
        c.post(i);
    }
    let mut rss = Rss::default();
    rss.samples.push(rss_kib());
    let mut next_sample = start + SAMPLE;
    let mut wcs = vec![EMPTY_WC; 256];
    let end = a.seconds.map(|s| start + Duration::from_secs_f64(s));
    loop {
        let n = cq.wait(&mut wcs, Some(Duration::from_millis(100)));
        let now = Instant::now();
        for wc in &wcs[..n] {
            c.complete(wc, now);
        }
        if now >= next_sample {
            next_sample += SAMPLE;
            rss.samples.push(rss_kib());
            let stalled = c.scan_stalls(now);
            let t = now.duration_since(start).as_secs_f64();
            outln!("{}", c.line("stat", t, &rss, stalled, &dev));
        }
        while let Ok(cmd) = cmd_rx.try_recv() {
            if cmd.trim() == "report" {
                let stalled = c.scan_stalls(now);
                rss.samples.push(rss_kib());
                let t = now.duration_since(start).as_secs_f64();
                outln!("{}", c.line("report", t, &rss, stalled, &dev));
            }
        }
        if end.is_some_and(|e| now >= e) {
            break;
        }
    }
    let now = Instant::now();
    let stalled = c.scan_stalls(now);
    rss.samples.push(rss_kib());
    let t = now.duration_since(start).as_secs_f64();
    outln!("{}", c.line("report", t, &rss, stalled, &dev));
    let ok = c.st.errors == 0 && c.st.verify_fail == 0 && c.st.stalled_qps == 0;
    for s in &c.slots {
        s.qp.disconnect();
    }
    drop(c);
    drop(dev);
    Ok(ok)
}

// ---------------------------------------------------------------- server

struct SrvQp {
    qp: Qp,
    /// Receives posted and not completed.
    outstanding: usize,
    /// Which client generation the QP belongs to (0: the soak client).
    gen: u8,
}

struct Server {
    dev: Device,
    cq: Cq,
    pd: iwarp_engine::Pd,
    recv: Mr,
    /// Reply sources, one REPLY_MAX slot per QP.
    reply: Mr,
    qps: Vec<SrvQp>,
    recvs_ok: u64,
    replies_ok: u64,
    verify_fail: u64,
    errors: u64,
    flushed: u64,
    /// Client generations whose QPs are expected to fail (bit per
    /// generation): their errors are not counted.
    dead_gens: u8,
    cap: usize,
}

impl Server {
    /// Where receive buffer `buf` of QP `q` starts.
    fn recv_off(q: usize, buf: usize) -> usize {
        (q * RECVS + buf) * RECV_LEN
    }

    fn post_recv(&mut self, q: usize, buf: usize) -> bool {
        let off = Self::recv_off(q, buf);
        let r = self.qps[q].qp.post_recv(&RecvWr {
            wr_id: (q * RECVS + buf) as u64,
            sgl: &[self.recv.sge(off, RECV_LEN)],
        });
        match r {
            Ok(()) => {
                self.qps[q].outstanding += 1;
                true
            }
            Err(_) => false,
        }
    }

    fn accept_ready(&mut self, l: &iwarp_engine::Listener, wait: Duration, gen: u8) -> Res<usize> {
        let mut n = 0;
        while let Ok(req) = l.get_request(Some(if n == 0 { wait } else { Duration::ZERO })) {
            if self.qps.len() >= self.cap {
                let _ = req.reject(b"full");
                continue;
            }
            // The receives are posted before the reply: the client may
            // send at once.
            let q = self.qps.len();
            let sges: Vec<[Sge; 1]> = (0..RECVS)
                .map(|b| [self.recv.sge(Self::recv_off(q, b), RECV_LEN)])
                .collect();
            let recvs: Vec<RecvWr<'_>> = sges
                .iter()
                .enumerate()
                .map(|(b, sgl)| RecvWr {
                    wr_id: (q * RECVS + b) as u64,
                    sgl,
                })
                .collect();
            let qp = req
                .accept_with_recvs(init(&self.cq, &self.pd), params(), &recvs)
                .map_err(|e| format!("accept: {e}"))?;
            self.qps.push(SrvQp {
                qp,
                outstanding: RECVS,
                gen,
            });
            n += 1;
        }
        Ok(n)
    }

    fn complete(&mut self, wc: &WorkCompletion) {
        if wc.wr_id & REPLY_TAG != 0 {
            let q = (wc.wr_id & !REPLY_TAG) as usize;
            let gen = self.qps.get(q).map_or(0, |sq| sq.gen);
            if wc.status == WcStatus::Success && wc.opcode == WcOpcode::Send {
                self.replies_ok += 1;
            } else if self.dead_gens & (1 << gen) == 0 {
                errln!("soak-server: QP {q}: {wc:?}");
                self.errors += 1;
            }
            return;
        }
        let q = wc.wr_id as usize / RECVS;
        let b = wc.wr_id as usize % RECVS;
        let Some(sq) = self.qps.get_mut(q) else {
            self.errors += 1;
            return;
        };
        sq.outstanding = sq.outstanding.saturating_sub(1);
        if wc.status != WcStatus::Success {
            if wc.status == WcStatus::WrFlushError {
                self.flushed += 1;
            }
            if self.dead_gens & (1 << sq.gen) == 0 {
                errln!("soak-server: QP {q}: {wc:?}");
                self.errors += 1;
            }
            return;
        }
        if wc.opcode != WcOpcode::Recv {
            self.errors += 1;
            return;
        }
        let len = wc.byte_len as usize;
        let mut buf = vec![0; len];
        self.recv.read((q * RECVS + b) * RECV_LEN, &mut buf);
        let seq = match buf.get(4..8) {
            Some(&[a, b, c, d]) => u32::from_be_bytes([a, b, c, d]),
            _ => 0,
        };
        let ok = len >= 12 && {
            let seed = u32::from_be_bytes([buf[8], buf[9], buf[10], buf[11]]);
            buf[12..]
                .iter()
                .enumerate()
                .all(|(i, &x)| x == pat(i, seed))
        };
        if ok {
            self.recvs_ok += 1;
        } else {
            errln!("soak-server: QP {q}: Send of {len} B differs");
            self.verify_fail += 1;
        }
        let dead = self.dead_gens & (1 << self.qps[q].gen) != 0;
        if !self.post_recv(q, b) {
            if !dead {
                self.errors += 1;
            }
            return;
        }
        // Re-posted first: now the client may send again.
        let r = reply_for(seq);
        self.reply.write(q * REPLY_MAX, &r);
        let sent = self.qps[q].qp.post_send(&SendWr {
            wr_id: REPLY_TAG | q as u64,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: &[self.reply.sge(q * REPLY_MAX, r.len())],
            signaled: true,
        });
        if sent.is_err() && !dead {
            self.errors += 1;
        }
    }

    fn poll(&mut self, wcs: &mut [WorkCompletion], wait: Option<Duration>) -> usize {
        let n = match wait {
            Some(w) => self.cq.wait(wcs, Some(w)),
            None => self.cq.poll(wcs),
        };
        for wc in &wcs[..n] {
            self.complete(wc);
        }
        n
    }
}

/// A client child: its stdin (for `report`), and its stdout lines.
struct ClientProc {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

fn spawn_client(
    ns: &str,
    addr: SocketAddr,
    mr: &Mr,
    first_slot: usize,
    qps: usize,
    seconds: Option<f64>,
    a: &RunArgs,
) -> Res<ClientProc> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .arg(exe)
        .arg("client")
        .args(["--addr", &addr.to_string()])
        .args(["--rkey", &mr.rkey().to_string()])
        .args(["--raddr", &mr.addr().to_string()])
        .args(["--first-slot", &first_slot.to_string()])
        .args(["--qps", &qps.to_string()])
        .args(["--stall-secs", &a.stall_secs.to_string()])
        .args(["--cpu", &a.client_cpu.to_string()]);
    if let Some(s) = seconds {
        cmd.args(["--seconds", &s.to_string()]);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn client: {e}"))?;
    let stdin = child.stdin.take().ok_or("client stdin")?;
    let stdout = child.stdout.take().ok_or("client stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    Ok(ClientProc {
        child,
        stdin,
        lines: rx,
    })
}

fn kv(line: &str) -> HashMap<String, String> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn num(m: &HashMap<String, String>, k: &str) -> u64 {
    m.get(k).and_then(|v| v.parse().ok()).unwrap_or(u64::MAX)
}

struct Summary {
    rows: Vec<(String, bool, String)>,
}

impl Summary {
    fn check(&mut self, name: &str, ok: bool, detail: String) {
        outln!(
            "soak: {} {name}: {detail}",
            if ok { "PASS" } else { "FAIL" }
        );
        self.rows.push((name.to_string(), ok, detail));
    }
}

fn run(a: &RunArgs) -> Res<bool> {
    let qps = a.qps.max(1);
    let mut sum = Summary { rows: Vec::new() };
    let dev = open("xb", IP_B, qps + RESTART_QPS, a.cpu)?;
    let pd = dev.alloc_pd();
    let cap = qps + RESTART_QPS;
    let cq = dev.create_cq(cap * (RECVS + 2) + 64);
    let region = dev
        .reg_mr(
            &pd,
            cap * SLOT,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .map_err(|e| format!("reg_mr: {e}"))?;
    let recv = dev
        .reg_mr(&pd, cap * RECVS * RECV_LEN, Access::LOCAL_WRITE)
        .map_err(|e| format!("reg_mr: {e}"))?;
    let reply = dev
        .reg_mr(&pd, cap * REPLY_MAX, Access::LOCAL_WRITE)
        .map_err(|e| format!("reg_mr: {e}"))?;
    let l = dev
        .listen(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), PORT))
        .map_err(|e| format!("listen: {e}"))?;
    let addr = SocketAddr::new(IP_B.into(), PORT);
    let mut s = Server {
        dev,
        cq,
        pd,
        recv,
        reply,
        qps: Vec::with_capacity(cap),
        recvs_ok: 0,
        replies_ok: 0,
        verify_fail: 0,
        errors: 0,
        flushed: 0,
        dead_gens: 0,
        cap,
    };
    outln!(
        "soak: server on xb ({IP_B}:{PORT}, progress on core {}), {qps} QPs, {} min, stall bound {} s, TCP keep-alive {:?} / timeout {:?}",
        a.cpu, a.minutes, a.stall_secs, KEEP_ALIVE, TCP_TIMEOUT
    );
    let mut rss = Rss::default();
    let mut wcs = vec![EMPTY_WC; 256];

    // ---- connect
    let mut cl = spawn_client(&a.ns_a, addr, &region, 0, qps, None, a)?;
    let t0 = Instant::now();
    let connect_deadline = t0 + Duration::from_secs(60) + Duration::from_millis(100 * qps as u64);
    let mut client_prog = None;
    while s.qps.len() < qps && Instant::now() < connect_deadline {
        s.accept_ready(&l, Duration::from_millis(20), 0)?;
        s.poll(&mut wcs, None);
        while let Ok(line) = cl.lines.try_recv() {
            if let Some(p) = line.strip_prefix("xdp prog_id=") {
                client_prog = p.parse::<i64>().ok();
            }
        }
        if let Ok(Some(st)) = cl.child.try_wait() {
            return Err(format!("client exited during connect: {st}"));
        }
    }
    let connect_secs = t0.elapsed().as_secs_f64();
    sum.check(
        "connect",
        s.qps.len() == qps,
        format!(
            "{} of {qps} QPs accepted in {connect_secs:.1} s (client AF_XDP, prog id {})",
            s.qps.len(),
            client_prog.unwrap_or(-1)
        ),
    );
    if s.qps.len() < qps {
        let _ = cl.child.kill();
        let _ = cl.child.wait();
        return Ok(false);
    }

    // ---- soak
    let soak = Duration::from_secs_f64(a.minutes * 60.0);
    let start = Instant::now();
    let mut next_sample = start;
    let mut next_print = start + PRINT;
    while start.elapsed() < soak {
        let _ = s.accept_ready(&l, Duration::ZERO, 0);
        s.poll(&mut wcs, Some(Duration::from_millis(50)));
        let now = Instant::now();
        if now >= next_sample {
            next_sample += SAMPLE;
            rss.samples.push(rss_kib());
        }
        while let Ok(line) = cl.lines.try_recv() {
            if line.starts_with("stat") && now >= next_print {
                next_print += PRINT;
                outln!(
                    "soak: {:.0} s: server rss {} recvs {}; client {line}",
                    start.elapsed().as_secs_f64(),
                    mib(rss_kib()),
                    s.recvs_ok
                );
            }
        }
        if let Ok(Some(st)) = cl.child.try_wait() {
            return Err(format!("client exited during the soak: {st}"));
        }
    }
    rss.samples.push(rss_kib());
    // The client's report, then SIGKILL while its QPs are busy.
    writeln!(cl.stdin, "report").map_err(|e| format!("client stdin: {e}"))?;
    let report_deadline = Instant::now() + Duration::from_secs(30);
    let mut report = None;
    while report.is_none() && Instant::now() < report_deadline {
        s.poll(&mut wcs, Some(Duration::from_millis(20)));
        while let Ok(line) = cl.lines.try_recv() {
            if line.starts_with("report") {
                report = Some(line);
            }
        }
    }
    let report = report.ok_or("no report from the client")?;
    let r = kv(&report);
    outln!("soak: client report: {report}");
    let ops = num(&r, "ops");
    sum.check(
        "operations",
        ops > 0
            && num(&r, "errors") == 0
            && num(&r, "verify_fail") == 0
            && s.errors == 0
            && s.verify_fail == 0,
        format!(
            "{ops} verified operations in {:.1} min over {qps} QPs (client writes {}, reads {}, sends {}, replies received {}, {:.1} GiB; server verified {} Sends, sent {} replies); errors client {} server {}, mismatches client {} server {}",
            a.minutes,
            num(&r, "writes"),
            num(&r, "reads"),
            num(&r, "sends"),
            num(&r, "replies"),
            num(&r, "bytes") as f64 / f64::from(1u32 << 30),
            s.recvs_ok,
            s.replies_ok,
            num(&r, "errors"),
            s.errors,
            num(&r, "verify_fail"),
            s.verify_fail
        ),
    );
    sum.check(
        "no stalled QP",
        num(&r, "stalled_qps") == 0,
        format!(
            "{} QPs went more than {} s without a completion (longest gap {} ms, at {}); frames dropped: client rx ring full {} / fill ring empty {}, server {}",
            num(&r, "stalled_qps"),
            a.stall_secs,
            num(&r, "max_gap_ms"),
            r.get("max_gap_at").map_or("-", String::as_str),
            num(&r, "rx_ring_full"),
            num(&r, "fill_ring_empty"),
            dev_counters(&s.dev)
        ),
    );
    let v = rss.verdict();
    sum.check(
        "server RSS stable",
        v.stable,
        format!(
            "start {} (after connect), after warm-up {}, max {}, end {} ({} samples every {:?})",
            mib(v.start),
            mib(v.warm),
            mib(v.max),
            mib(v.end),
            rss.samples.len(),
            SAMPLE
        ),
    );
    sum.check(
        "client RSS stable",
        r.get("rss_stable").is_some_and(|v| v == "true"),
        format!(
            "start {}, after warm-up {}, max {}, end {}",
            mib(num(&r, "rss_start")),
            mib(num(&r, "rss_warm")),
            mib(num(&r, "rss_max")),
            mib(num(&r, "rss_end"))
        ),
    );

    // ---- the peer killed mid-transfer
    // Let traffic run again for a moment so operations are in flight.
    let before = s.recvs_ok;
    let resume = Instant::now();
    while resume.elapsed() < Duration::from_millis(500) {
        s.poll(&mut wcs, Some(Duration::from_millis(20)));
    }
    let pid = cl.child.id();
    s.dead_gens |= 1;
    cl.child
        .kill()
        .map_err(|e| format!("kill client {pid}: {e}"))?;
    let killed = Instant::now();
    let _ = cl.child.wait();
    let bound = KEEP_ALIVE + TCP_TIMEOUT + Duration::from_secs(5);
    let mut flushed_at = None;
    while killed.elapsed() < bound * 2 {
        s.poll(&mut wcs, Some(Duration::from_millis(10)));
        let all = s
            .qps
            .iter()
            .filter(|q| q.gen == 0)
            .all(|q| q.qp.state() == QpState::Error && q.outstanding == 0);
        if all {
            flushed_at = Some(killed.elapsed());
            break;
        }
    }
    let in_error = s
        .qps
        .iter()
        .filter(|q| q.gen == 0 && q.qp.state() == QpState::Error)
        .count();
    let left: usize = s
        .qps
        .iter()
        .filter(|q| q.gen == 0)
        .map(|q| q.outstanding)
        .sum();
    sum.check(
        "peer SIGKILL: QPs to Error, WRs flushed",
        flushed_at.is_some_and(|t| t <= bound),
        format!(
            "client pid {pid} killed while busy ({} Sends received in its last 0.5 s); {in_error} of {qps} QPs in Error, {} receives flushed, {left} outstanding, after {} (bound: keep-alive {:?} + timeout {:?} + 5 s)",
            s.recvs_ok - before,
            s.flushed,
            flushed_at.map_or("never".into(), |t| format!("{:.2} s", t.as_secs_f64())),
            KEEP_ALIVE,
            TCP_TIMEOUT
        ),
    );

    // ---- engine restart after a crash
    let stale = xdp_prog_id(Some(&a.ns_a), "xa");
    let xsk_after_kill = xsk_count(&a.ns_a);
    let mut cl2 = spawn_client(
        &a.ns_a,
        addr,
        &region,
        qps,
        RESTART_QPS,
        Some(RESTART_SECS),
        a,
    )?;
    // Its QPs end with the client (disconnect, then flushed receives).
    s.dead_gens |= 2;
    let t = Instant::now();
    let mut new_prog = None;
    let mut report2 = None;
    let mut xsk_running = None;
    let status = loop {
        s.accept_ready(&l, Duration::from_millis(10), 1)?;
        s.poll(&mut wcs, None);
        while let Ok(line) = cl2.lines.try_recv() {
            if let Some(p) = line.strip_prefix("xdp prog_id=") {
                new_prog = p.parse::<i64>().ok();
            } else if line.starts_with("connected") {
                xsk_running = xsk_count(&a.ns_a);
            } else if line.starts_with("report") {
                report2 = Some(line);
            }
        }
        if let Ok(Some(st)) = cl2.child.try_wait() {
            break Some(st);
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = cl2.child.kill();
            let _ = cl2.child.wait();
            break None;
        }
    };
    while let Ok(line) = cl2.lines.recv_timeout(Duration::from_millis(200)) {
        if line.starts_with("report") {
            report2 = Some(line);
        }
    }
    let after = xdp_prog_id(Some(&a.ns_a), "xa");
    let xsk_end = xsk_count(&a.ns_a);
    let r2 = report2.as_deref().map(kv).unwrap_or_default();
    let ops2 = num(&r2, "ops");
    let restart_ok = status.is_some_and(|s| s.success())
        && stale.is_some()
        && new_prog.is_some_and(|p| p > 0 && Some(p as u64) != stale)
        && ops2 > 0
        && ops2 != u64::MAX
        && num(&r2, "errors") == 0
        && xsk_after_kill == Some(0)
        && xsk_running == Some(1)
        && after.is_none()
        && xsk_end == Some(0);
    sum.check(
        "restart after SIGKILL",
        restart_ok,
        format!(
            "stale XDP program id {} after the kill, XDP sockets left {}; new engine attached program id {} ({} XDP socket), {RESTART_QPS} QPs ran {} verified operations, exit {}; afterwards XDP program {}, XDP sockets {}",
            stale.map_or("none".into(), |p| p.to_string()),
            xsk_after_kill.map_or("?".into(), |n| n.to_string()),
            new_prog.unwrap_or(-1),
            xsk_running.map_or("?".into(), |n| n.to_string()),
            if ops2 == u64::MAX { 0 } else { ops2 },
            status.map_or("none (killed)".into(), |s| s.to_string()),
            after.map_or("none".into(), |p| format!("id {p}")),
            xsk_end.map_or("?".into(), |n| n.to_string()),
        ),
    );
    outln!("soak: server stats: {:?}", s.dev.stats());
    drop(l);
    drop(s);

    let ok = sum.rows.iter().all(|r| r.1);
    outln!("\nsoak summary ({qps} QPs, {} min):", a.minutes);
    for (name, pass, _) in &sum.rows {
        outln!("  {:4}  {name}", if *pass { "PASS" } else { "FAIL" });
    }
    outln!(
        "  RSS rule: after a warm-up of the first 20 % of samples, end <= first warm sample + max(4 MiB, 5 %), and max of the second half of warm samples <= max of the first half + the same margin"
    );
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(samples: &[u64]) -> RssVerdict {
        Rss {
            samples: samples.to_vec(),
        }
        .verdict()
    }

    #[test]
    fn rss_rule() {
        // Growth during the warm-up only, then flat: stable.
        let v = verdict(&[
            10_000, 50_000, 60_000, 60_100, 60_000, 60_200, 60_100, 60_000, 60_100, 60_000,
        ]);
        assert!(v.stable);
        assert_eq!((v.start, v.max, v.end), (10_000, 60_200, 60_000));
        // A steady climb after the warm-up: not stable.
        let climb: Vec<u64> = (0..20).map(|i| 100_000 + i * 3_000).collect();
        assert!(!verdict(&climb).stable);
        // Ends low but peaked late (upward trend in the second half).
        let v = verdict(&[
            50_000, 50_000, 50_000, 50_000, 50_000, 50_000, 50_000, 90_000, 50_000, 50_000,
        ]);
        assert!(!v.stable);
        assert!(!verdict(&[]).stable);
        assert!(verdict(&[7]).stable);
    }

    #[test]
    fn replies_and_patterns() {
        for seq in 0..6 {
            let r = reply_for(seq);
            assert!(r.len() <= REPLY_MAX);
            assert!(reply_ok(&r, seq));
            assert!(!reply_ok(&r, seq + 3));
        }
        let mut a = vec![0; 300];
        fill(&mut a, 1);
        let mut b = vec![0; 300];
        fill(&mut b, 2);
        assert_ne!(a, b);
        assert!(SEND_SIZES.iter().all(|&n| (12..=RECV_LEN).contains(&n)));
        assert!(RDMA_SIZES.iter().all(|&n| n <= SLOT));
    }
}
