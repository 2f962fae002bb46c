//! iwarp-perf: perftest's `ib_*` bandwidth and latency tools over the
//! iWARP stack (kernel-socket backend), speaking perftest's `-R` (RDMA CM)
//! connection setup and parameter exchange byte for byte, so either side
//! can be the real `ib_write_bw -R`, `ib_read_lat -R`, ... (see
//! `apps/src/proto/perftest.rs` and `docs/interop-protocols.md`).
//!
//! One binary, one subcommand per tool. Without an address it is the
//! server; with one, the client (like perftest). perftest's server serves
//! one client; with `--persistent [N]` ours serves one client after
//! another (N runs, or for ever), each run printing its own results.
//! perftest's `-b` (bidirectional bw tests) and `-D`/`-f` (run for a
//! duration, measured between margins) work as perftest's and with it.

#[path = "../perf/stats.rs"]
mod stats;

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use iwarp_apps::backend::BackendArgs;
use iwarp_apps::proto::perftest::{
    self as pt, BwReport, BwUnit, Exchange, LatDurStats, LatStats, PingpongDest, Side, Test, Verb,
};
use iwarp_engine::{
    Access, Backend, CmError, CmEvent, ConnParams, ConnRequest, Cq, Device, DeviceConfig, Listener,
    Mr, Progress, Qp, QpInit, QpState, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion, EMPTY_WC,
};

type Res<T> = Result<T, String>;

/// Largest message size of `-a` (perftest: 2^1 .. 2^23).
const MAX_ALL_SIZE: u64 = 1 << 23;
/// How long a wait for the peer may take before the test fails.
const PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// write_lat: how long one wait for the peer's byte spins before the run's
/// end and [`PEER_TIMEOUT`] are checked.
const POLL_SLICE: Duration = Duration::from_millis(1);
/// Client: how long refused connects are retried (perftest's server
/// listens for the data connections only after answering the first sync).
const CONNECT_RETRY: Duration = Duration::from_secs(10);
/// Pause between the comm connection's establishment and our first Send
/// (client).
const FIRST_SEND_DELAY: Duration = Duration::from_millis(300);
/// Server: how often a wait for a data connection checks that the
/// client's comm connection is still up.
const ALIVE_CHECK: Duration = Duration::from_millis(100);
/// Persistent server: how long the connections of a finished run may take
/// to close before the count of those left is reported.
const RELEASE_WAIT: Duration = Duration::from_secs(5);
/// How long we let the peer close first at the end.
const PEER_CLOSE_WAIT: Duration = Duration::from_millis(1000);
/// Comm-connection buffer: receive at 0, send at `COMM_MSG`.
const COMM_MSG: usize = 64;
const COMM_RECV: u64 = 1;
const COMM_SEND: u64 = 2;
/// Data-CQ wr_id tags.
const TAG_RECV: u64 = 1 << 62;
const TAG_CREDIT: u64 = 1 << 61;
/// Credit buffer layout: one 64-byte credit word slot per QP, then a
/// ring of 4-byte credit sources.
const CREDIT_SLOT: usize = 64;
const CREDIT_RING: usize = 256;
/// Receives kept posted by the latency tests.
const LAT_RX: usize = 16;

/// perftest's ib_* tools over this iWARP stack.
///
/// Each subcommand mirrors the perftest tool of the same name
/// (write_bw = ib_write_bw, ..., send_lat = ib_send_lat) and talks to it:
/// run `ib_write_bw -R` on one side and `iwarp-perf write_bw` on the
/// other. Without an address the tool is the server and waits for one
/// client (single-shot, like perftest; `--persistent` serves one client
/// after another); with the server's address it is the client. Results
/// are printed in perftest's format.
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    test: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// RDMA Write bandwidth (mirrors ib_write_bw -R).
    #[command(name = "write_bw")]
    WriteBw(Opts),
    /// RDMA Write latency, half round trip (mirrors ib_write_lat -R).
    #[command(name = "write_lat")]
    WriteLat(Opts),
    /// RDMA Read bandwidth (mirrors ib_read_bw -R).
    #[command(name = "read_bw")]
    ReadBw(Opts),
    /// RDMA Read latency, full round trip (mirrors ib_read_lat -R).
    #[command(name = "read_lat")]
    ReadLat(Opts),
    /// Send bandwidth with perftest's iWARP receive credits (mirrors
    /// ib_send_bw -R).
    #[command(name = "send_bw")]
    SendBw(Opts),
    /// Send latency, half round trip (mirrors ib_send_lat -R).
    #[command(name = "send_lat")]
    SendLat(Opts),
}

/// The options of every test (perftest's names and meanings).
#[derive(Args, Debug, Clone)]
struct Opts {
    /// Server address (host or IP). Absent: run as the server.
    address: Option<String>,
    /// Message size in bytes (default 65536 for bw tests, 2 for latency).
    #[arg(short = 's', long = "size", value_parser = clap::value_parser!(u64).range(1..=(1u64 << 30)))]
    size: Option<u64>,
    /// Iterations (default 5000 for bw tests, 1000 for latency).
    #[arg(short = 'n', long = "iters", value_parser = clap::value_parser!(u64).range(1..=(1u64 << 32)))]
    iters: Option<u64>,
    /// Run all sizes 2, 4, ..., 2^23 (both sides must give it).
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Number of data QPs (connections); bw tests only.
    #[arg(short = 'q', long = "qp", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    qps: u32,
    /// Send queue depth of bw tests (default 128, at most -n).
    #[arg(short = 't', long = "tx-depth", value_parser = clap::value_parser!(u32).range(1..=4096))]
    tx_depth: Option<u32>,
    /// Max inline data: accepted for compatibility; this stack has no
    /// inline sends, the data is sent as normal (non-inline) data.
    #[arg(short = 'I', long = "inline_size")]
    inline_size: Option<u32>,
    /// Poll as perftest does: completions (and write_lat's incoming byte,
    /// and the comm connection's messages, where a bandwidth server waits
    /// for the whole run) in a loop that never yields the core. Without
    /// it, bandwidth tests
    /// sleep until a completion arrives and the latency tests' polling
    /// loops yield the core every 256 empty polls.
    #[arg(long)]
    spin: bool,
    /// The engine's progress thread spins between passes (`on`) or sleeps
    /// until there is work (`off`). Default: on for the latency tests,
    /// off for the bandwidth tests.
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    busy_poll: Option<String>,
    /// Bidirectional (bandwidth tests): both sides issue the test's
    /// traffic at once and each prints the sum of both directions
    /// (perftest's -b; both sides must give it).
    #[arg(short = 'b', long = "bidirectional")]
    bidirectional: bool,
    /// Run for SECS seconds instead of -n iterations, counting what
    /// completes between the margins at both ends (perftest's -D; both
    /// sides must give it; not with -a).
    #[arg(short = 'D', long = "duration", value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    duration: Option<u64>,
    /// With -D: seconds at the start and at the end of the run that are
    /// not measured (default: a quarter of the duration, rounded down;
    /// the duration must exceed twice the margin).
    #[arg(short = 'f', long = "margin", value_name = "SECS")]
    margin: Option<u64>,
    /// Report bandwidth in Gb/s instead of MB/s.
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// TCP port of the server (both connections).
    #[arg(short = 'p', long = "port", default_value_t = pt::DEFAULT_PORT)]
    port: u16,
    /// Connect through the RDMA CM: accepted and always implied (an iWARP
    /// QP is only connected through the CM / MPA exchange).
    #[arg(short = 'R', long = "rdma_cm")]
    rdma_cm: bool,
    /// Outstanding RDMA Reads (IRD/ORD of the data connections) for the
    /// read tests.
    #[arg(short = 'o', long = "outs", default_value_t = pt::SIW_OUT_READS as u16, value_parser = clap::value_parser!(u16).range(1..=128))]
    out_reads: u16,
    /// Ask for MPA CRC32c on every connection (the peer must accept it).
    #[arg(long)]
    crc: bool,
    /// Print one JSON object per result row on stdout instead of the
    /// table.
    #[arg(long)]
    json: bool,
    /// Debug output on stderr (not perftest's -d, which names a device).
    #[arg(short = 'd', long = "debug")]
    debug: bool,
    /// Server: keep serving. After a client's test ends (or fails), wait
    /// for the next client and run the test again, each run with its own
    /// connections, queues and memory and its own results; N ends the
    /// server after N runs, without N it serves for ever (perftest's
    /// server serves one client). One client at a time: a client that
    /// connects during another's run waits for it (perftest's protocol
    /// names no client: one from the same address must not connect in
    /// the moment another opens its data connections).
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "0")]
    persistent: Option<u64>,
    #[command(flatten)]
    backend: BackendArgs,
}

/// Everything a run needs, resolved from the options.
#[derive(Debug, Clone)]
struct Cfg {
    test: Test,
    side: Side,
    server: Option<String>,
    sizes: Vec<u64>,
    max_size: u64,
    iters: u64,
    qps: u32,
    tx_depth: u32,
    rx_depth: u32,
    out_reads: u16,
    /// `-b` (bandwidth tests only).
    bidir: bool,
    /// `-D`: duration and margin in seconds.
    duration: Option<(u64, u64)>,
    unit: BwUnit,
    port: u16,
    crc: bool,
    json: bool,
    debug: bool,
    /// Persistent server: `Some(0)` serves for ever, `Some(n)` n runs.
    persistent: Option<u64>,
    backend: Backend,
    /// `--spin`: poll without yielding, as perftest.
    spin: bool,
    /// The engine's progress thread spins between passes.
    busy_poll: bool,
}

impl Cfg {
    fn new(test: Test, o: Opts) -> Res<Self> {
        if !test.is_bw() && o.qps != 1 {
            return Err("-q is for bandwidth tests only".into());
        }
        if o.persistent.is_some() && o.address.is_some() {
            return Err("--persistent is for the server (no address)".into());
        }
        if o.bidirectional && !test.is_bw() {
            return Err("-b (bidirectional) is for bandwidth tests only".into());
        }
        let duration = match o.duration {
            Some(d) => {
                if o.all {
                    return Err("-D (duration) does not run with -a".into());
                }
                let margin = o.margin.unwrap_or(d / 4);
                if d <= margin.saturating_mul(2) {
                    return Err("the duration (-D) must exceed twice the margin (-f)".into());
                }
                Some((d, margin))
            }
            None => None,
        };
        let iters = o.iters.unwrap_or_else(|| test.default_iters());
        let size = o.size.unwrap_or_else(|| test.default_size());
        let sizes: Vec<u64> = if o.all {
            (1..24).map(|i| 1u64 << i).collect()
        } else {
            vec![size]
        };
        let max_size = sizes.iter().copied().max().unwrap_or(size);
        if o.all && max_size != MAX_ALL_SIZE {
            return Err("internal: -a sizes".into());
        }
        // perftest caps the depths at -n only when it counts iterations.
        let cap = if duration.is_some() { u64::MAX } else { iters };
        let tx_depth = if test.is_bw() {
            let t = o.tx_depth.unwrap_or(pt::DEFAULT_TX_DEPTH_BW);
            let t = u64::from(t).min(cap) as u32;
            if test.verb() == Verb::Read {
                t.min(u32::from(o.out_reads))
            } else {
                t
            }
        } else {
            pt::DEFAULT_TX_DEPTH_LAT
        };
        let rx_depth = u64::from(pt::DEFAULT_RX_DEPTH_SEND_BW).min(cap) as u32;
        Ok(Self {
            test,
            side: if o.address.is_some() {
                Side::Client
            } else {
                Side::Server
            },
            server: o.address,
            sizes,
            max_size,
            iters,
            qps: o.qps,
            tx_depth,
            rx_depth,
            out_reads: o.out_reads,
            bidir: o.bidirectional,
            duration,
            unit: if o.report_gbits {
                BwUnit::Gbps
            } else {
                BwUnit::MBps
            },
            port: o.port,
            crc: o.crc,
            json: o.json,
            debug: o.debug,
            persistent: o.persistent,
            backend: o.backend.backend()?,
            spin: o.spin,
            busy_poll: o.busy_poll.as_deref().map_or(!test.is_bw(), |v| v == "on"),
        })
    }

    fn dbg(&self, msg: impl FnOnce() -> String) {
        if self.debug {
            eprintln!("iwarp-perf: {}", msg());
        }
    }

    fn out(&self, text: &str) {
        if !self.json {
            print!("{text}");
        }
    }

    fn name(&self) -> &'static str {
        self.test.command().trim_start_matches("ib_")
    }

    /// A fresh `-D` clock (not started), if the run has a duration.
    fn clock(&self) -> Option<stats::DurationClock> {
        self.duration.map(|(d, m)| stats::DurationClock::new(d, m))
    }

    /// How long a comm-connection wait for the peer may take: the peer
    /// may be measuring for the whole duration meanwhile.
    fn comm_timeout(&self) -> Duration {
        PEER_TIMEOUT + Duration::from_secs(self.duration.map_or(0, |(d, _)| d))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (test, opts) = match cli.test {
        Cmd::WriteBw(o) => (Test::WriteBw, o),
        Cmd::WriteLat(o) => (Test::WriteLat, o),
        Cmd::ReadBw(o) => (Test::ReadBw, o),
        Cmd::ReadLat(o) => (Test::ReadLat, o),
        Cmd::SendBw(o) => (Test::SendBw, o),
        Cmd::SendLat(o) => (Test::SendLat, o),
    };
    let _ = (opts.inline_size, opts.rdma_cm);
    iwarp_apps::logging::init("iwarp-perf", opts.debug);
    let result = Cfg::new(test, opts).and_then(|cfg| match (cfg.side, cfg.persistent) {
        (Side::Server, Some(runs)) => serve_persistent(&cfg, runs),
        _ => run(&cfg),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iwarp-perf: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------
// Comm connection: strictly alternating Sends of at most 56 bytes.

struct Comm {
    qp: Qp,
    cq: Cq,
    mr: Mr,
    side: Side,
    stash: Vec<WorkCompletion>,
    /// How long a wait for the peer may take.
    timeout: Duration,
    /// `--spin`: wait by polling without yielding, as perftest's own
    /// comm connection does (a bw server spends the whole run there).
    spin: bool,
}

/// `wc` if it succeeded; otherwise the error of a peer that went away.
fn ok_wc(wc: WorkCompletion) -> Res<WorkCompletion> {
    if wc.status == WcStatus::Success {
        Ok(wc)
    } else {
        Err(format!(
            "comm: {:?} completed with {:?} (peer gone?)",
            wc.opcode, wc.status
        ))
    }
}

impl Comm {
    /// `qp` was connected with [`Self::recv_sge`] posted (`COMM_RECV`).
    fn new(qp: Qp, cq: Cq, mr: Mr, side: Side, timeout: Duration, spin: bool) -> Self {
        Self {
            qp,
            cq,
            mr,
            side,
            stash: Vec::new(),
            timeout,
            spin,
        }
    }

    /// The receive buffer; the first receive is posted before the
    /// connection is up, since perftest's client sends at once.
    fn recv_sge(mr: &Mr) -> [Sge; 1] {
        [mr.sge(0, COMM_MSG)]
    }

    fn post_recv(&self) -> Res<()> {
        self.qp
            .post_recv(&RecvWr {
                wr_id: COMM_RECV,
                sgl: &Self::recv_sge(&self.mr),
            })
            .map_err(|e| format!("comm: post_recv: {e:?}"))
    }

    /// The next completion with `wr_id`, stashing others. A failed
    /// completion ends the wait with an error, unless the one awaited
    /// succeeded in the same batch: the receive reposted after the last
    /// message is flushed when the peer disconnects right after it, which
    /// can reach the queue together with that message's completion.
    fn wait(&mut self, wr_id: u64) -> Res<WorkCompletion> {
        // The awaited one if it came before; else a failure that came
        // before ends this wait as it would have ended the earlier one.
        let stashed = self.stash.iter().position(|w| w.wr_id == wr_id);
        let stashed = stashed.or_else(|| {
            self.stash
                .iter()
                .position(|w| w.status != WcStatus::Success)
        });
        if let Some(i) = stashed {
            return ok_wc(self.stash.remove(i));
        }
        let deadline = Instant::now() + self.timeout;
        let mut wcs = [EMPTY_WC; 4];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("comm: timed out waiting for the peer".into());
            }
            let n = if self.spin {
                // Back to the deadline check at least once a second.
                let until = Instant::now() + left.min(Duration::from_secs(1));
                spin_wcs_until(&self.cq, &mut wcs, Some(until), false)?
            } else {
                self.cq.wait(&mut wcs, Some(left))
            };
            let mut found = None;
            let mut failed = None;
            for wc in &wcs[..n] {
                if wc.status != WcStatus::Success && failed.is_none() {
                    failed = Some(*wc);
                }
                if wc.wr_id == wr_id && found.is_none() {
                    found = Some(*wc);
                } else {
                    self.stash.push(*wc);
                }
            }
            if let Some(wc) = found.or(failed) {
                return ok_wc(wc);
            }
        }
    }

    fn send(&mut self, msg: &[u8]) -> Res<()> {
        self.mr.write(COMM_MSG, msg);
        self.qp
            .post_send(&SendWr {
                wr_id: COMM_SEND,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sgl: &[self.mr.sge(COMM_MSG, msg.len())],
                signaled: true,
            })
            .map_err(|e| format!("comm: post_send: {e:?}"))?;
        self.wait(COMM_SEND).map(|_| ())
    }

    fn recv(&mut self) -> Res<Vec<u8>> {
        let wc = self.wait(COMM_RECV)?;
        let len = (wc.byte_len as usize).min(COMM_MSG);
        let mut b = vec![0; len];
        self.mr.read(0, &mut b);
        self.post_recv()?;
        Ok(b)
    }

    /// One exchange: the client sends first, the server answers. `before
    /// answer` runs on the server between receiving and answering.
    fn exchange_with(
        &mut self,
        msg: &[u8],
        before_answer: impl FnOnce() -> Res<()>,
    ) -> Res<Vec<u8>> {
        match self.side {
            Side::Client => {
                self.send(msg)?;
                self.recv()
            }
            Side::Server => {
                let r = self.recv()?;
                before_answer()?;
                self.send(msg)?;
                Ok(r)
            }
        }
    }

    fn exchange(&mut self, msg: &[u8]) -> Res<Vec<u8>> {
        self.exchange_with(msg, || Ok(()))
    }
}

// ---------------------------------------------------------------------------
// Data QPs and their memory.

struct Data {
    qps: Vec<Qp>,
    cq: Cq,
    /// `2 * q` slots: we send from / read into slot `j`, the peer uses
    /// slot `q + j` (advertised).
    mr: Mr,
    slot: usize,
    /// send_bw credits: word `j` at `j * CREDIT_SLOT`, then the source
    /// ring.
    credit: Mr,
    my: Vec<PingpongDest>,
    rem: Vec<PingpongDest>,
    /// `--spin`: poll without yielding, as perftest.
    spin: bool,
}

impl Data {
    /// Wait for completions (sleeping, or polling with `--spin`), failing
    /// after `PEER_TIMEOUT` without any.
    fn wait_wcs(&self, out: &mut [WorkCompletion]) -> Res<usize> {
        if self.spin {
            spin_wcs(&self.cq, out, false)
        } else {
            wait_wcs(&self.cq, out)
        }
    }

    fn region(&self, j: usize) -> usize {
        (self.qps.len() + j) * self.slot
    }
}

/// Parameters of the comm exchange both sides settled on.
#[derive(Clone, Copy, Debug)]
struct Agreed {
    cycle_buffer: u64,
    cache_line: u64,
}

fn data_init(cfg: &Cfg, pd: &iwarp_engine::Pd, cq: &Cq) -> QpInit {
    let sq = cfg.tx_depth as usize + 16;
    let rq = cfg.rx_depth.max(LAT_RX as u32) as usize + 16;
    QpInit {
        pd: pd.clone(),
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        sq_depth: sq,
        rq_depth: rq,
        sig_all: false,
        srq: None,
    }
}

/// MPA parameters of the data connections. write_lat's server writes
/// first, which RFC 5044 §7.1.2 forbids a responder before it received
/// the initiator's first FPDU. As client we ask for RFC 6581 peer-to-peer
/// mode, whose ready-to-receive message (a zero-length RDMA Write) is that
/// first FPDU (stock siw accepts it as responder); as server, facing
/// perftest's client which sends nothing first, we lift the rule for this
/// connection (`responder_sends_first`), as siw does. The first write goes
/// out only after the comm-connection exchange, long after the MPA reply.
fn data_params(cfg: &Cfg) -> ConnParams {
    let (ird, ord) = cfg.test.data_ird_ord(cfg.out_reads);
    let write_lat = cfg.test == Test::WriteLat;
    ConnParams {
        ird,
        ord,
        p2p: write_lat && cfg.side == Side::Client,
        responder_sends_first: write_lat && cfg.side == Side::Server,
        crc: cfg.crc,
        timeout: Duration::from_secs(20),
        ..ConnParams::default()
    }
}

fn comm_params(cfg: &Cfg) -> ConnParams {
    ConnParams {
        ird: 0,
        ord: 0,
        crc: cfg.crc,
        timeout: Duration::from_secs(20),
        ..ConnParams::default()
    }
}

fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x9e37_79b9_7f4a_7c15);
    h.finish()
}

/// Connect, retrying refused / dropped attempts for a while.
fn connect_retry(
    dev: &Device,
    addr: SocketAddr,
    init: &QpInit,
    params: &ConnParams,
    recvs: &[RecvWr<'_>],
    cfg: &Cfg,
) -> Res<Qp> {
    let start = Instant::now();
    loop {
        match dev.connect_with_recvs(addr, init.clone(), params.clone(), recvs) {
            Ok(qp) => return Ok(qp),
            Err(e @ (CmError::ConnectionRefused | CmError::Closed | CmError::Rejected { .. }))
                if start.elapsed() < CONNECT_RETRY =>
            {
                cfg.dbg(|| format!("connect to {addr}: {e}; retrying"));
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(format!("connect to {addr}: {e}")),
        }
    }
}

/// `host`'s first IPv4 address, else its first (a name with both
/// families resolves as the library's `rdma_getaddrinfo` does).
fn resolve(host: &str, port: u16) -> Res<SocketAddr> {
    let all: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| format!("{host}: no address"))
}

// ---------------------------------------------------------------------------
// The run: comm script, data connections, measurement, report.

/// One step of our script: a comm exchange or a measurement of sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Ex(Exchange),
    Measure(Vec<u64>),
}

/// perftest's script ([`pt::script_with`]), expanded for send_bw with
/// several QPs (dests of all QPs, dest 0, dests of all QPs, dest 0) and
/// for `-a`: send_bw repeats "dest 0, measure, (bidirectional: report),
/// dest 0" per size; bidirectional write_bw / read_bw repeat "dest 0,
/// measure, dest 0, report" per size; the others measure every size in
/// one go.
fn steps(cfg: &Cfg) -> Vec<Step> {
    let bidir = cfg.bidir && cfg.test.is_bw();
    let base = pt::script_with(cfg.test, cfg.qps, bidir, cfg.duration.is_some());
    let report = || (0..BwReport::FIELDS as u8).map(|field| Step::Ex(Exchange::Report { field }));
    let dest0 = || Step::Ex(Exchange::Dest { qp: 0 });
    let mut v = Vec::new();
    if cfg.test == Test::SendBw {
        let q = cfg.qps;
        for s in base {
            match s {
                Exchange::Dest { .. } | Exchange::Measure | Exchange::Report { .. } => {}
                s => v.push(Step::Ex(s)),
            }
        }
        v.extend((0..q).map(|qp| Step::Ex(Exchange::Dest { qp })));
        v.push(dest0());
        v.extend((0..q).map(|qp| Step::Ex(Exchange::Dest { qp })));
        for (i, &size) in cfg.sizes.iter().enumerate() {
            v.push(dest0());
            v.push(Step::Measure(vec![size]));
            if bidir && cfg.duration.is_none() {
                v.extend(report());
            }
            if i + 1 < cfg.sizes.len() {
                v.push(dest0());
            }
        }
        if cfg.sizes.len() > 1 {
            // perftest: the per-size dest after the last size, then close.
            v.push(dest0());
        }
        v.push(dest0());
        return v;
    }
    if bidir && cfg.sizes.len() > 1 {
        // Up to the sync dest before the measurement, which each size
        // repeats.
        let m = base
            .iter()
            .position(|s| *s == Exchange::Measure)
            .unwrap_or(base.len());
        v.extend(base[..m.saturating_sub(1)].iter().map(|&s| Step::Ex(s)));
        for &size in &cfg.sizes {
            v.push(dest0());
            v.push(Step::Measure(vec![size]));
            v.push(dest0());
            v.extend(report());
        }
        v.push(dest0());
        return v;
    }
    for s in base {
        match s {
            Exchange::Measure => v.push(Step::Measure(cfg.sizes.clone())),
            s => v.push(Step::Ex(s)),
        }
    }
    v
}

fn open_device(cfg: &Cfg) -> Res<Device> {
    Device::open(
        cfg.backend.clone(),
        DeviceConfig {
            progress: Progress::Thread { cpu: None },
            seed: None,
            busy_poll: cfg.busy_poll,
        },
    )
    .map_err(|e| format!("open device: {e}"))
}

/// The server's listening side. Both connections of a run come to the
/// same port, so a persistent server keeps one listener for all runs and
/// tells a run's data connections from the next client's comm connection
/// by when and whence they come: a client opens its data connections only
/// once it has the answer to its first sync, so every request queued
/// before that answer, and every later one from another address, is the
/// comm connection of a later run. (perftest's protocol names no client:
/// one from the same address whose request arrives while another opens
/// its data connections would be taken for one of them.)
struct Accepting {
    /// `None` once a single-shot server has its data connections.
    listener: Option<Listener>,
    /// Keep listening after a run's data connections (persistent).
    keep: bool,
    /// The comm connections of later runs: requests queued before a
    /// run's first sync was answered, and requests from another address
    /// while the run waited for its data connections.
    later: VecDeque<ConnRequest>,
}

impl Accepting {
    fn listen(cfg: &Cfg, dev: &Device, keep: bool) -> Res<Self> {
        let l = dev
            .listen(SocketAddr::from((Ipv6Addr::UNSPECIFIED, cfg.port)))
            .map_err(|e| format!("listen on port {}: {e}", cfg.port))?;
        cfg.dbg(|| format!("listening on {}", l.local_addr()));
        Ok(Self {
            listener: Some(l),
            keep,
            later: VecDeque::new(),
        })
    }

    fn listener(&self) -> Res<&Listener> {
        self.listener
            .as_ref()
            .ok_or_else(|| "internal: no listener".to_string())
    }

    /// The comm connection request of the next run (waits for ever).
    fn next_comm(&mut self, cfg: &Cfg) -> Res<ConnRequest> {
        cfg.out(
            "\n************************************\n* Waiting for client to connect... *\n************************************\n",
        );
        flush();
        if let Some(req) = self.later.pop_front() {
            return Ok(req);
        }
        self.listener()?
            .get_request(None)
            .map_err(|e| format!("waiting for a client: {e}"))
    }

    /// The next data connection request from `ip` (the comm connection's
    /// peer); requests from elsewhere wait for a later run. Fails early
    /// when `alive` says the client is gone.
    fn next_data(&mut self, cfg: &Cfg, ip: IpAddr, alive: impl Fn() -> bool) -> Res<ConnRequest> {
        let deadline = Instant::now() + PEER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("{}", CmError::Timeout));
            }
            match self.listener()?.get_request(Some(left.min(ALIVE_CHECK))) {
                Ok(req) if req.peer_addr().ip() == ip => return Ok(req),
                Ok(req) => {
                    cfg.dbg(|| format!("request from {} kept for a later run", req.peer_addr()));
                    self.later.push_back(req);
                }
                Err(CmError::Timeout) => {
                    if !alive() {
                        return Err("the client closed its comm connection".into());
                    }
                }
                Err(e) => return Err(format!("{e}")),
            }
        }
    }

    /// Before the answer to a run's first sync: every request already
    /// queued is the comm connection of a later run.
    fn defer_queued(&mut self, cfg: &Cfg) -> Res<()> {
        let l = self.listener()?;
        let mut queued = Vec::new();
        while let Ok(req) = l.get_request(Some(Duration::ZERO)) {
            cfg.dbg(|| format!("request from {} kept for a later run", req.peer_addr()));
            queued.push(req);
        }
        self.later.extend(queued);
        Ok(())
    }

    /// The run has its data connections: a single-shot server stops
    /// listening.
    fn data_done(&mut self) {
        if !self.keep {
            self.listener = None;
        }
    }
}

fn run(cfg: &Cfg) -> Res<()> {
    let dev = open_device(cfg)?;
    let r = if cfg.server.is_some() {
        run_test(cfg, &dev, None)
    } else {
        Accepting::listen(cfg, &dev, false).and_then(|mut acc| {
            let req = acc.next_comm(cfg)?;
            run_test(cfg, &dev, Some((&mut acc, req)))
        })
    };
    if r.is_err() {
        print_counters(&dev);
    }
    r
}

/// What the engine saw, for a failure's report (not prefixed `iwarp-perf:
/// `, which scripts take for the error line).
fn print_counters(dev: &Device) {
    eprintln!("iwarp-perf counters at the failure: {:?}", dev.stats());
}

/// `--persistent`: run the test with one client after another on one
/// device and one listener, each run with resources of its own that are
/// released before the next (the line `run N ...: K connections open`
/// on stderr reports what is left on the device, 0 when all is
/// released). A failed run is reported and the server goes on. `runs`
/// 0 serves for ever; otherwise the server exits after `runs` runs,
/// successfully when none failed.
fn serve_persistent(cfg: &Cfg, runs: u64) -> Res<()> {
    let dev = open_device(cfg)?;
    let mut acc = Accepting::listen(cfg, &dev, true)?;
    let mut n = 0u64;
    let mut failed = 0u64;
    while runs == 0 || n < runs {
        let req = acc.next_comm(cfg)?;
        n += 1;
        let peer = req.peer_addr();
        let result = run_test(cfg, &dev, Some((&mut acc, req)));
        let open = wait_released(&dev);
        match result {
            Ok(()) => eprintln!("iwarp-perf: run {n} from {peer}: done, {open} connections open"),
            Err(e) => {
                failed += 1;
                eprintln!("iwarp-perf: run {n} from {peer}: failed: {e}; {open} connections open");
                print_counters(&dev);
            }
        }
    }
    if failed == 0 {
        Ok(())
    } else {
        Err(format!("{failed} of {n} runs failed"))
    }
}

/// Wait (bounded) until the device drives no connection any more: the
/// QPs of a finished run are gone once their close completes. Returns
/// how many are left.
fn wait_released(dev: &Device) -> usize {
    let deadline = Instant::now() + RELEASE_WAIT;
    loop {
        let open = dev.stats().connections;
        if open == 0 || Instant::now() >= deadline {
            return open;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One run of the test on `dev`: as the client (`server` is `None`), or
/// as the server with the comm connection's request and the listener
/// its data connections come to. Everything the run creates (PD, CQs,
/// QPs, memory) is released when it returns.
fn run_test(cfg: &Cfg, dev: &Device, mut server: Option<(&mut Accepting, ConnRequest)>) -> Res<()> {
    let dev = dev.clone();
    let pd = dev.alloc_pd();

    // Comm connection.
    let comm_cq = dev.create_cq(16);
    let comm_init = QpInit {
        pd: pd.clone(),
        send_cq: comm_cq.clone(),
        recv_cq: comm_cq.clone(),
        sq_depth: 4,
        rq_depth: 4,
        sig_all: false,
        srq: None,
    };
    let comm_mr = dev
        .reg_mr(&pd, 2 * COMM_MSG, Access::LOCAL_WRITE)
        .map_err(|e| format!("reg_mr: {e}"))?;
    let comm_sge = Comm::recv_sge(&comm_mr);
    let comm_recv = [RecvWr {
        wr_id: COMM_RECV,
        sgl: &comm_sge,
    }];
    let mut acc: Option<&mut Accepting> = None;
    let mut client_ip: Option<IpAddr> = None;
    let server_addr;
    let comm_qp = match &cfg.server {
        Some(host) => {
            let addr = resolve(host, cfg.port)?;
            server_addr = Some(addr);
            cfg.dbg(|| format!("connecting to {addr}"));
            let qp = connect_retry(&dev, addr, &comm_init, &comm_params(cfg), &comm_recv, cfg)?;
            // Linux siw as responder misses an FPDU that arrives while its
            // accept is still finishing (seen: our first Send 0.1 ms after
            // its MPA Reply, never answered). perftest's own client is
            // slower than that; give the responder a moment.
            std::thread::sleep(FIRST_SEND_DELAY);
            qp
        }
        None => {
            server_addr = None;
            let (a, req) = server.take().ok_or("internal: no listener")?;
            cfg.dbg(|| format!("comm request from {}", req.peer_addr()));
            client_ip = Some(req.peer_addr().ip());
            let qp = req
                .accept_with_recvs(comm_init, comm_params(cfg), &comm_recv)
                .map_err(|e| format!("accept: {e}"))?;
            // The data connections come to the same port: keep listening.
            acc = Some(a);
            qp
        }
    };
    let mut comm = Comm::new(
        comm_qp,
        comm_cq,
        comm_mr,
        cfg.side,
        cfg.comm_timeout(),
        cfg.spin,
    );

    // Data resources (the buffer holds the largest size).
    let q = if cfg.test.is_bw() {
        cfg.qps as usize
    } else {
        1
    };
    let cq_cap = q * (cfg.tx_depth as usize + cfg.rx_depth.max(LAT_RX as u32) as usize + 64);
    let data_cq = dev.create_cq(cq_cap);
    let mut agreed = Agreed {
        cycle_buffer: u64::from(pt::CYCLE_BUFFER),
        cache_line: u64::from(pt::CACHE_LINE),
    };
    let mut data: Option<Data> = None;
    let mut peer_report: Option<BwReport> = None;
    let mut my_report = BwReport::default();
    let mut report_msgs: Vec<Vec<u8>> = Vec::new();
    let mut printed_header = false;
    let steps = steps(cfg);
    let mut syncs = 0;
    for (idx, step) in steps.iter().enumerate() {
        let next_is_measure = matches!(steps.get(idx + 1), Some(Step::Measure(_)));
        match step {
            Step::Ex(Exchange::Version) => {
                let r = comm.exchange(&pt::VersionMsg::new(pt::VERSION).0)?;
                let v = pt::VersionMsg::parse(&r).map_err(|e| format!("version: {e:?}"))?;
                cfg.dbg(|| format!("peer version {:?}", v.text()));
                if v.number() < pt::MIN_PEER_VERSION {
                    return Err(format!("peer version {:?} is too old", v.text()));
                }
            }
            Step::Ex(Exchange::CycleBuffer) => {
                let r = comm.exchange(&pt::encode_u32(pt::CYCLE_BUFFER))?;
                let v = pt::parse_u32(&r).map_err(|e| format!("cycle buffer: {e:?}"))?;
                agreed.cycle_buffer = agreed.cycle_buffer.max(u64::from(v));
            }
            Step::Ex(Exchange::CacheLine) => {
                let r = comm.exchange(&pt::encode_u32(pt::CACHE_LINE))?;
                let v = pt::parse_u32(&r).map_err(|e| format!("cache line: {e:?}"))?;
                agreed.cache_line = agreed.cache_line.max(u64::from(v));
            }
            Step::Ex(Exchange::Mtu) => {
                let r = comm.exchange(&pt::encode_mtu(pt::SIW_MTU_ENUM))?;
                let m = pt::parse_mtu(&r).map_err(|e| format!("mtu: {e:?}"))?;
                cfg.dbg(|| format!("peer mtu enum {m}"));
            }
            Step::Ex(Exchange::Sync) => {
                syncs += 1;
                // Our server listens (the comm listener) before answering;
                // what it holds then is not this run's.
                let zero = PingpongDest::default().to_bytes();
                comm.exchange_with(&zero, || match acc.as_deref_mut() {
                    Some(a) if syncs == 1 => a.defer_queued(cfg),
                    _ => Ok(()),
                })?;
                cfg.dbg(|| format!("sync {syncs}"));
            }
            Step::Ex(Exchange::ConnectData) => {
                let slot = pt::buff_size(cfg.max_size, agreed.cycle_buffer) as usize;
                let mr = dev
                    .reg_mr(
                        &pd,
                        2 * q * slot,
                        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
                    )
                    .map_err(|e| format!("reg_mr: {e}"))?;
                fill_random(&mr, q * slot);
                let credit = dev
                    .reg_mr(
                        &pd,
                        q * CREDIT_SLOT + 4 * CREDIT_RING,
                        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                    )
                    .map_err(|e| format!("reg_mr: {e}"))?;
                let init = data_init(cfg, &pd, &data_cq);
                let mut qps = Vec::with_capacity(q);
                for j in 0..q {
                    let qp = match (server_addr, acc.as_deref_mut(), client_ip) {
                        (Some(addr), _, _) => {
                            connect_retry(&dev, addr, &init, &data_params(cfg), &[], cfg)?
                        }
                        (None, Some(a), Some(ip)) => {
                            let comm_qp = &comm.qp;
                            let req = a
                                .next_data(cfg, ip, || {
                                    !matches!(comm_qp.state(), QpState::Error | QpState::Closing)
                                })
                                .map_err(|e| format!("waiting for data connection {j}: {e}"))?;
                            req.accept(init.clone(), data_params(cfg))
                                .map_err(|e| format!("accept data connection {j}: {e}"))?
                        }
                        _ => return Err("internal: no listener".into()),
                    };
                    cfg.dbg(|| format!("data connection {j}: {:?}", qp.negotiated()));
                    qps.push(qp);
                }
                let psn = random_u64();
                let my: Vec<PingpongDest> = (0..q)
                    .map(|j| {
                        let (rkey, vaddr) = if cfg.test == Test::SendBw {
                            (credit.rkey(), credit.addr() + (j * CREDIT_SLOT) as u64)
                        } else {
                            (mr.rkey(), mr.addr() + ((q + j) * slot) as u64)
                        };
                        PingpongDest {
                            lid: 0,
                            out_reads: if cfg.test.verb() == Verb::Read {
                                u32::from(cfg.out_reads)
                            } else {
                                1
                            },
                            qpn: qps[j].id().raw(),
                            psn: ((psn >> (j * 3)) & 0x00ff_ffff) as u32,
                            rkey,
                            vaddr,
                            gid: [0; 16],
                            srqn: 0,
                            gid_index: 0,
                        }
                    })
                    .collect();
                data = Some(Data {
                    rem: vec![PingpongDest::default(); q],
                    my,
                    qps,
                    cq: data_cq.clone(),
                    mr,
                    slot,
                    credit,
                    spin: cfg.spin,
                });
                if let Some(a) = acc.as_deref_mut() {
                    a.data_done();
                }
                let d = data.as_ref().expect("just set");
                let mut s = pt::info_block_with(
                    cfg.test,
                    cfg.side,
                    &pt::InfoOpts {
                        num_qps: q as u32,
                        tx_depth: cfg.tx_depth,
                        out_reads: u32::from(cfg.out_reads),
                        bidirectional: cfg.bidir,
                        rx_depth: cfg.rx_depth,
                    },
                );
                for m in &d.my {
                    s.push_str(&pt::address_lines(true, m));
                }
                cfg.out(&s);
            }
            Step::Ex(Exchange::Dest { qp }) => {
                let d = data.as_mut().ok_or("internal: dest before data")?;
                let j = *qp as usize;
                let mine = d.my.get(j).copied().ok_or("internal: qp index")?;
                if next_is_measure {
                    let size = match steps.get(idx + 1) {
                        Some(Step::Measure(s)) => s.first().copied().unwrap_or(cfg.max_size),
                        _ => cfg.max_size,
                    };
                    prepare(cfg, d, size)?;
                    if !printed_header {
                        printed_header = true;
                        let mut s = String::new();
                        for r in &d.rem {
                            s.push_str(&pt::address_lines(false, r));
                        }
                        s.push_str(pt::RESULT_LINE);
                        s.push('\n');
                        s.push_str(if cfg.test.is_bw() {
                            pt::bw_header(cfg.unit)
                        } else if cfg.duration.is_some() {
                            pt::LAT_DUR_HEADER
                        } else {
                            pt::LAT_HEADER
                        });
                        s.push('\n');
                        cfg.out(&s);
                    }
                }
                let r = comm.exchange(&mine.to_bytes())?;
                let rd = PingpongDest::parse(&r).map_err(|e| format!("dest: {e:?}"))?;
                if let Some(slot) = d.rem.get_mut(j) {
                    *slot = rd;
                }
                cfg.dbg(|| format!("dest {j}: {rd:?}"));
            }
            Step::Ex(Exchange::Measure) => return Err("internal: bare measure step".into()),
            Step::Measure(sizes) => {
                let d = data.as_ref().ok_or("internal: measure before data")?;
                flush();
                // Bidirectional: the row is printed after the report
                // exchange (send_bw with -D has none: its own row).
                let own_row = !cfg.bidir || (cfg.test == Test::SendBw && cfg.duration.is_some());
                for &size in sizes {
                    match measure(cfg, d, size, agreed)? {
                        Outcome::Bw(r) => {
                            my_report = r;
                            if own_row {
                                print_bw(cfg, &r, None);
                            }
                        }
                        Outcome::Lat(s) => print_lat(cfg, &s),
                        Outcome::LatDur(s) => print_lat_dur(cfg, &s),
                        Outcome::None => {}
                    }
                }
            }
            Step::Ex(Exchange::Report { field }) => {
                let msgs = my_report.to_messages();
                let mine = match cfg.side {
                    Side::Server if !cfg.bidir => {
                        // perftest's server answers with its never-filled
                        // report.
                        [0; BwReport::FIELD_LEN]
                    }
                    _ => msgs[usize::from(*field) % BwReport::FIELDS],
                };
                let r = comm.exchange(&mine)?;
                report_msgs.push(r);
                if report_msgs.len() == BwReport::FIELDS {
                    let m: Vec<&[u8]> = report_msgs.iter().map(Vec::as_slice).collect();
                    let rep = BwReport::from_messages([m[0], m[1], m[2], m[3], m[4]])
                        .map_err(|e| format!("report: {e:?}"))?;
                    report_msgs.clear();
                    peer_report = Some(rep);
                    if cfg.bidir {
                        print_bw(cfg, &my_report, Some(&rep));
                    } else if cfg.side == Side::Server {
                        print_bw(cfg, &rep, None);
                    }
                }
            }
        }
    }
    cfg.out(&format!("{}\n", pt::RESULT_LINE));
    flush();
    let _ = peer_report;

    // Close: let the peer close first (Linux siw fails perftest's last
    // send completion when our FIN comes right behind its final answer),
    // then data connections first, then comm.
    let deadline = Instant::now() + PEER_CLOSE_WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match comm.qp.wait_event(left) {
            Some(CmEvent::Disconnected) | None => break,
            Some(ev) => cfg.dbg(|| format!("comm event: {ev:?}")),
        }
    }
    let mut qps: Vec<&Qp> = Vec::new();
    if let Some(d) = &data {
        qps.extend(d.qps.iter());
    }
    for qp in &qps {
        qp.disconnect();
    }
    comm.qp.disconnect();
    qps.push(&comm.qp);
    let deadline = Instant::now() + Duration::from_secs(3);
    for qp in qps {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match qp.wait_event(left) {
                Some(CmEvent::Disconnected) | None => break,
                Some(ev) => cfg.dbg(|| format!("event at close: {ev:?}")),
            }
        }
    }
    Ok(())
}

fn flush() {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
}

fn fill_random(mr: &Mr, len: usize) {
    let mut x = random_u64() | 1;
    let mut buf = vec![0u8; len.min(1 << 20)];
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let mut off = 0;
    while off < len {
        let n = buf.len().min(len - off);
        mr.write(off, &buf[..n]);
        off += n;
    }
}

fn json_num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.6}")
    } else {
        "0".into()
    }
}

fn side_name(s: Side) -> &'static str {
    match s {
        Side::Client => "client",
        Side::Server => "server",
    }
}

/// A bw result row: `r` alone, or with `remote` (bidirectional) the sum
/// of both sides as perftest prints it. The JSON row of a bidirectional
/// run also carries both sides' own numbers, that of a `-D` run the
/// duration and margin.
fn print_bw(cfg: &Cfg, r: &BwReport, remote: Option<&BwReport>) {
    let row = match remote {
        Some(rem) => r.bidirectional(rem),
        None => *r,
    };
    if cfg.json {
        let unit = match cfg.unit {
            BwUnit::MBps => "MB/sec",
            BwUnit::Gbps => "Gb/sec",
        };
        let mut extra = String::new();
        if cfg.bidir {
            extra.push_str(",\"bidirectional\":true");
            if let Some(rem) = remote {
                extra.push_str(&format!(
                    ",\"local_iterations\":{},\"local_bw_average\":{},\"remote_iterations\":{},\"remote_bw_average\":{}",
                    r.iters,
                    json_num(r.bw_avg),
                    rem.iters,
                    json_num(rem.bw_avg)
                ));
            }
        }
        if let Some((d, m)) = cfg.duration {
            extra.push_str(&format!(",\"duration_s\":{d},\"margin_s\":{m}"));
        }
        println!(
            "{{\"test\":\"{}\",\"side\":\"{}\",\"bytes\":{},\"iterations\":{},\"bw_peak\":{},\"bw_average\":{},\"msg_rate_mpps\":{},\"unit\":\"{unit}\"{extra}}}",
            cfg.name(),
            side_name(cfg.side),
            row.size,
            row.iters,
            json_num(row.bw_peak),
            json_num(row.bw_avg),
            json_num(row.msg_rate)
        );
    } else {
        println!("{}", pt::bw_row(&row));
    }
    flush();
}

fn print_lat_dur(cfg: &Cfg, s: &LatDurStats) {
    if cfg.json {
        let (d, m) = cfg.duration.unwrap_or_default();
        println!(
            "{{\"test\":\"{}\",\"side\":\"{}\",\"bytes\":{},\"iterations\":{},\"t_avg_usec\":{},\"tps_average\":{},\"duration_s\":{d},\"margin_s\":{m}}}",
            cfg.name(),
            side_name(cfg.side),
            s.size,
            s.iters,
            json_num(s.t_avg),
            json_num(s.tps)
        );
    } else {
        println!("{}", pt::lat_dur_row(s));
    }
    flush();
}

fn print_lat(cfg: &Cfg, s: &LatStats) {
    if cfg.json {
        println!(
            "{{\"test\":\"{}\",\"side\":\"{}\",\"bytes\":{},\"iterations\":{},\"t_min_usec\":{},\"t_max_usec\":{},\"t_typical_usec\":{},\"t_avg_usec\":{},\"t_stdev_usec\":{},\"p99_usec\":{},\"p99_9_usec\":{}}}",
            cfg.name(),
            side_name(cfg.side),
            s.size,
            s.iters,
            json_num(s.min),
            json_num(s.max),
            json_num(s.typical),
            json_num(s.avg),
            json_num(s.stdev),
            json_num(s.p99),
            json_num(s.p999)
        );
    } else {
        println!("{}", pt::lat_row(s));
    }
    flush();
}

// ---------------------------------------------------------------------------
// Measurement.

enum Outcome {
    Bw(BwReport),
    Lat(LatStats),
    LatDur(LatDurStats),
    None,
}

/// Before the last dest exchange of a measurement: post the receives
/// and reset the credit words (send tests; with `-b` send_bw does both on
/// both sides).
fn prepare(cfg: &Cfg, d: &Data, size: u64) -> Res<()> {
    match cfg.test {
        Test::SendBw => {
            if cfg.side == Side::Server || cfg.bidir {
                for (j, qp) in d.qps.iter().enumerate() {
                    for _ in 0..cfg.rx_depth {
                        post_recv(d, qp, j, size as usize)?;
                    }
                }
            }
            if cfg.side == Side::Client || cfg.bidir {
                for j in 0..d.qps.len() {
                    d.credit.write(j * CREDIT_SLOT, &[0; 4]);
                }
            }
        }
        Test::SendLat => {
            for _ in 0..LAT_RX as u64 {
                post_recv(d, &d.qps[0], 0, d.slot)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn post_recv(d: &Data, qp: &Qp, j: usize, len: usize) -> Res<()> {
    qp.post_recv(&RecvWr {
        wr_id: TAG_RECV | j as u64,
        sgl: &[d.mr.sge(d.region(j), len.min(d.slot))],
    })
    .map_err(|e| format!("post_recv: {e:?}"))
}

/// send_bw: RDMA-Write the credit `received` into the peer's credit word
/// of QP `j`, from the next slot of the source ring.
fn post_credit(d: &Data, j: usize, received: u64, ring: &mut usize) -> Res<()> {
    let q = d.qps.len();
    let src = q * CREDIT_SLOT + 4 * (*ring % CREDIT_RING);
    *ring += 1;
    d.credit.write(src, &pt::encode_credit(received as u32));
    d.qps[j]
        .post_send(&SendWr {
            wr_id: TAG_CREDIT | j as u64,
            op: SendOp::Write {
                remote_addr: d.rem[j].vaddr,
                rkey: d.rem[j].rkey,
            },
            sgl: &[d.credit.sge(src, 4)],
            signaled: true,
        })
        .map_err(|e| format!("credit write: {e:?}"))
}

/// The credit word the peer wrote for QP `j`.
fn credit_word(d: &Data, j: usize) -> u32 {
    let mut w = [0u8; 4];
    d.credit.read(j * CREDIT_SLOT, &mut w);
    pt::parse_credit(&w).unwrap_or(0)
}

fn measure(cfg: &Cfg, d: &Data, size: u64, agreed: Agreed) -> Res<Outcome> {
    match cfg.duration {
        Some((s, m)) => cfg.dbg(|| format!("measure {size} bytes for {s} s (margin {m} s)")),
        None => cfg.dbg(|| format!("measure {} bytes x {}", size, cfg.iters)),
    }
    match (cfg.test, cfg.side) {
        (Test::SendBw, _) if cfg.bidir => send_bi(cfg, d, size).map(Outcome::Bw),
        (Test::WriteBw | Test::ReadBw, Side::Server) if !cfg.bidir => Ok(Outcome::None),
        (Test::WriteBw | Test::ReadBw, _) | (Test::SendBw, Side::Client) => {
            bw_client(cfg, d, size, agreed).map(Outcome::Bw)
        }
        (Test::SendBw, Side::Server) => send_bw_server(cfg, d, size).map(Outcome::Bw),
        (Test::WriteLat, side) => write_lat(cfg, d, size, side),
        (Test::SendLat, side) => send_lat(cfg, d, size, side),
        (Test::ReadLat, Side::Client) => read_lat(cfg, d, size),
        (Test::ReadLat, Side::Server) => Ok(Outcome::None),
    }
}

fn check(wc: &WorkCompletion) -> Res<()> {
    if wc.status == WcStatus::Success {
        Ok(())
    } else {
        Err(format!(
            "{:?} (wr_id {:#x}) completed with {:?}",
            wc.opcode, wc.wr_id, wc.status
        ))
    }
}

/// Blocking wait for completions, failing after `PEER_TIMEOUT` without
/// any.
fn wait_wcs(cq: &Cq, out: &mut [WorkCompletion]) -> Res<usize> {
    match cq.wait(out, Some(PEER_TIMEOUT)) {
        0 => Err("timed out waiting for completions".into()),
        n => Ok(n),
    }
}

/// [`Mr::wait_byte`] without yielding the core (`--spin`): true once the
/// byte at `off` is `want`, false after `slice`.
fn spin_byte(mr: &Mr, off: usize, want: u8, slice: Duration) -> bool {
    let end = Instant::now() + slice;
    let mut seen = None;
    let mut spins = 0u32;
    loop {
        let placed = mr.placements();
        if seen != Some(placed) {
            seen = Some(placed);
            if mr.read_byte(off) == want {
                return true;
            }
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(256) && Instant::now() >= end {
            return false;
        }
        std::hint::spin_loop();
    }
}

/// Busy-polling wait (latency tests); with `yield_core`, the core is
/// yielded every 256 empty polls.
fn spin_wcs(cq: &Cq, out: &mut [WorkCompletion], yield_core: bool) -> Res<usize> {
    spin_wcs_until(cq, out, None, yield_core)
}

/// Busy-polling wait that gives up with 0 completions at `until` (the
/// end of a `-D` run) and fails after `PEER_TIMEOUT` without any.
fn spin_wcs_until(
    cq: &Cq,
    out: &mut [WorkCompletion],
    until: Option<Instant>,
    yield_core: bool,
) -> Res<usize> {
    let deadline = Instant::now() + PEER_TIMEOUT;
    let mut spins = 0u32;
    loop {
        let n = cq.poll(out);
        if n > 0 {
            return Ok(n);
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(256) {
            let now = Instant::now();
            if until.is_some_and(|u| now >= u) {
                return Ok(0);
            }
            if now > deadline {
                return Err("timed out waiting for completions".into());
            }
            if yield_core {
                std::thread::yield_now();
            }
        }
        std::hint::spin_loop();
    }
}

/// The bw sender: write_bw / read_bw (the client, and with `-b` the
/// server too) and send_bw's client. With `-D` it posts until the end of
/// the duration, counts the operations that complete during the sample
/// and then waits for those still outstanding.
fn bw_client(cfg: &Cfg, d: &Data, size: u64, agreed: Agreed) -> Res<BwReport> {
    let q = d.qps.len();
    let mut clock = cfg.clock();
    let n = if clock.is_some() { u64::MAX } else { cfg.iters };
    let depth = u64::from(cfg.tx_depth).max(1);
    let rx_depth = u64::from(cfg.rx_depth).max(1);
    let total = if clock.is_some() { 0 } else { n as usize * q };
    let verb = cfg.test.verb();
    let len = size as usize;
    let mut posted = vec![0u64; q];
    let mut done = vec![0u64; q];
    let mut completed = 0usize;
    let mut sampled = 0u64;
    let mut tposted = Vec::with_capacity(total);
    let mut tcompleted = Vec::with_capacity(total);
    let mut wcs = [EMPTY_WC; 64];
    let mut last_progress = Instant::now();
    if let Some(c) = clock.as_mut() {
        c.start(last_progress);
    }
    loop {
        match &clock {
            Some(c) if c.ended(Instant::now()) => break,
            None if completed >= total => break,
            _ => {}
        }
        let mut credit_blocked = false;
        for j in 0..q {
            while posted[j] < n && posted[j] - done[j] < depth {
                let op = match verb {
                    Verb::Send => {
                        let credit = credit_word(d, j);
                        if u64::from((posted[j] as u32).wrapping_sub(credit)) >= rx_depth {
                            credit_blocked = true;
                            break;
                        }
                        SendOp::Send {
                            solicited: false,
                            invalidate: None,
                        }
                    }
                    Verb::Write | Verb::Read => {
                        let off = pt::bw_remote_offset(
                            posted[j],
                            size,
                            agreed.cycle_buffer,
                            agreed.cache_line,
                        );
                        let remote_addr = d.rem[j].vaddr.wrapping_add(off);
                        let rkey = d.rem[j].rkey;
                        if verb == Verb::Write {
                            SendOp::Write { remote_addr, rkey }
                        } else {
                            SendOp::Read { remote_addr, rkey }
                        }
                    }
                };
                d.qps[j]
                    .post_send(&SendWr {
                        wr_id: j as u64,
                        op,
                        sgl: &[d.mr.sge(j * d.slot, len)],
                        signaled: true,
                    })
                    .map_err(|e| format!("post_send: {e:?}"))?;
                if clock.is_none() {
                    tposted.push(Instant::now());
                }
                posted[j] += 1;
            }
        }
        let k = if credit_blocked || clock.is_some() {
            d.cq.wait(&mut wcs, Some(Duration::from_millis(1)))
        } else {
            d.wait_wcs(&mut wcs)?
        };
        let now = Instant::now();
        if k > 0 {
            last_progress = now;
        } else if now.duration_since(last_progress) > PEER_TIMEOUT {
            return Err(if credit_blocked {
                "send_bw: no credits from the peer".into()
            } else {
                "timed out waiting for completions".into()
            });
        }
        for wc in &wcs[..k] {
            check(wc)?;
            if let Some(c) = done.get_mut(wc.wr_id as usize) {
                *c += 1;
                completed += 1;
                match &clock {
                    None => tcompleted.push(now),
                    Some(c) if c.sampling(now) => sampled += 1,
                    Some(_) => {}
                }
            }
        }
    }
    if let Some(c) = clock {
        let mut outstanding: u64 = posted.iter().zip(&done).map(|(p, d)| p - d).sum();
        while outstanding > 0 {
            let k = d.wait_wcs(&mut wcs)?;
            for wc in &wcs[..k] {
                check(wc)?;
                if (wc.wr_id as usize) < q {
                    outstanding -= 1;
                }
            }
        }
        return Ok(stats::duration_bw_report(
            size,
            sampled,
            c.sample_secs(),
            cfg.unit,
        ));
    }
    Ok(stats::bw_report(
        size,
        &tposted,
        &tcompleted,
        pt::DEFAULT_CQ_MOD as usize,
        cfg.unit,
    ))
}

/// send_bw's server: receives, reposts and credits. With `-D` the clock
/// starts at the first receive (as perftest's) and the receives
/// completed during the sample are counted.
fn send_bw_server(cfg: &Cfg, d: &Data, size: u64) -> Res<BwReport> {
    let q = d.qps.len();
    let mut clock = cfg.clock();
    let dur = clock.is_some();
    let n = if dur { u64::MAX } else { cfg.iters };
    let rx = u64::from(cfg.rx_depth);
    let every = rx / 3;
    let mut recvd = vec![0u64; q];
    let mut posted = vec![rx; q];
    let mut total = 0u64;
    let mut sampled = 0u64;
    let mut credits_out = 0usize;
    let mut ring = 0usize;
    // perftest's client starts sending when it has our pre-measure dest:
    // time from here (a receive-completion batch has no useful spread).
    let first = Instant::now();
    let mut last = first;
    let mut last_progress = first;
    let mut ended = false;
    let mut wcs = [EMPTY_WC; 64];
    while (!ended && total < n.saturating_mul(q as u64)) || credits_out > 0 {
        let k = if dur {
            d.cq.wait(&mut wcs, Some(Duration::from_millis(10)))
        } else {
            d.wait_wcs(&mut wcs)?
        };
        let now = Instant::now();
        if k > 0 {
            last_progress = now;
        } else if now.duration_since(last_progress) > PEER_TIMEOUT {
            return Err("timed out waiting for completions".into());
        }
        for wc in &wcs[..k] {
            check(wc)?;
            if wc.wr_id & TAG_CREDIT != 0 {
                credits_out = credits_out.saturating_sub(1);
                continue;
            }
            if wc.opcode != WcOpcode::Recv || ended {
                continue;
            }
            let j = (wc.wr_id & !TAG_RECV) as usize;
            if j >= q {
                continue;
            }
            last = now;
            recvd[j] += 1;
            total += 1;
            if let Some(c) = clock.as_mut() {
                c.start(now);
                if c.sampling(now) {
                    sampled += 1;
                }
            }
            if posted[j] < n {
                post_recv(d, &d.qps[j], j, size as usize)?;
                posted[j] += 1;
            }
            if (every > 0 && recvd[j].is_multiple_of(every)) || recvd[j] == n {
                post_credit(d, j, recvd[j], &mut ring)?;
                credits_out += 1;
            }
        }
        if let Some(c) = &clock {
            ended = c.ended(now);
        }
    }
    if let Some(c) = clock {
        return Ok(stats::duration_bw_report(
            size,
            sampled,
            c.sample_secs(),
            cfg.unit,
        ));
    }
    Ok(stats::rx_bw_report(size, total, first, last, cfg.unit))
}

/// Credit writes a side may have outstanding on a QP beyond the send
/// queue depth of its Sends (bidirectional send_bw).
const CREDIT_SLACK: u64 = 8;

/// Bidirectional send_bw (`-b`), both sides alike: each Sends to the
/// other with perftest's credits (paced by the peer's credit word, see
/// [`bw_client`]) while it receives, reposts and credits the peer's
/// Sends (see [`send_bw_server`]). The server starts sending at the
/// client's first message (perftest's `run_iter_bi`). Without `-D` a
/// side is done when it has sent and received `-n` messages per QP; its
/// own report is that of its Sends. With `-D` the client's clock starts
/// at once and the server's at its first receive; what is counted is
/// every Send and receive completed during the sample (perftest prints
/// that as the side's row, with no report exchange).
fn send_bi(cfg: &Cfg, d: &Data, size: u64) -> Res<BwReport> {
    let q = d.qps.len();
    let mut clock = cfg.clock();
    let dur = clock.is_some();
    let n = if dur { u64::MAX } else { cfg.iters };
    let depth = u64::from(cfg.tx_depth).max(1);
    let rx = u64::from(cfg.rx_depth).max(1);
    let every = (rx / 3).max(1);
    let len = size as usize;
    let mut posted = vec![0u64; q];
    let mut done = vec![0u64; q];
    let mut recvd = vec![0u64; q];
    let mut rposted = vec![rx; q];
    let mut credits_out = vec![0u64; q];
    let mut credit_due = vec![false; q];
    let mut ring = 0usize;
    let cap = if dur { 0 } else { n as usize * q };
    let mut tposted = Vec::with_capacity(cap);
    let mut tcompleted = Vec::with_capacity(cap);
    let mut sampled = 0u64;
    let mut sending = cfg.side == Side::Client;
    let mut last_progress = Instant::now();
    if sending {
        if let Some(c) = clock.as_mut() {
            c.start(last_progress);
        }
    }
    let mut wcs = [EMPTY_WC; 64];
    loop {
        let over = match &clock {
            Some(c) => c.ended(Instant::now()),
            None => (0..q).all(|j| done[j] >= n && recvd[j] >= n && credits_out[j] == 0),
        };
        if over {
            break;
        }
        for j in 0..q {
            let busy = posted[j] - done[j] + credits_out[j];
            if credit_due[j] && busy < depth + CREDIT_SLACK {
                post_credit(d, j, recvd[j], &mut ring)?;
                credits_out[j] += 1;
                credit_due[j] = false;
            }
            while sending && posted[j] < n && posted[j] - done[j] + credits_out[j] < depth {
                let credit = credit_word(d, j);
                if u64::from((posted[j] as u32).wrapping_sub(credit)) >= rx {
                    break;
                }
                d.qps[j]
                    .post_send(&SendWr {
                        wr_id: j as u64,
                        op: SendOp::Send {
                            solicited: false,
                            invalidate: None,
                        },
                        sgl: &[d.mr.sge(j * d.slot, len)],
                        signaled: true,
                    })
                    .map_err(|e| format!("post_send: {e:?}"))?;
                if !dur {
                    tposted.push(Instant::now());
                }
                posted[j] += 1;
            }
        }
        let k = d.cq.wait(&mut wcs, Some(Duration::from_millis(1)));
        let now = Instant::now();
        if k > 0 {
            last_progress = now;
        } else if now.duration_since(last_progress) > PEER_TIMEOUT {
            return Err("send_bw -b: no progress (messages or credits) from the peer".into());
        }
        for wc in &wcs[..k] {
            check(wc)?;
            let j = (wc.wr_id & !(TAG_RECV | TAG_CREDIT)) as usize;
            if j >= q {
                continue;
            }
            if wc.wr_id & TAG_CREDIT != 0 {
                credits_out[j] = credits_out[j].saturating_sub(1);
            } else if wc.opcode == WcOpcode::Recv {
                if !sending {
                    sending = true;
                    if let Some(c) = clock.as_mut() {
                        c.start(now);
                    }
                }
                recvd[j] += 1;
                if clock.is_some_and(|c| c.sampling(now)) {
                    sampled += 1;
                }
                if rposted[j] < n {
                    post_recv(d, &d.qps[j], j, len)?;
                    rposted[j] += 1;
                }
                if (recvd[j] % rx).is_multiple_of(every) {
                    credit_due[j] = true;
                }
            } else {
                done[j] += 1;
                match &clock {
                    None => tcompleted.push(now),
                    Some(c) if c.sampling(now) => sampled += 1,
                    Some(_) => {}
                }
            }
        }
    }
    if let Some(c) = clock {
        // What is still in flight completes: the peer's receives for our
        // Sends are posted (credits), our credit writes need nothing.
        let mut outstanding: u64 = (0..q).map(|j| posted[j] - done[j] + credits_out[j]).sum();
        while outstanding > 0 {
            let k = d.wait_wcs(&mut wcs)?;
            for wc in &wcs[..k] {
                check(wc)?;
                if wc.wr_id & TAG_RECV == 0 {
                    outstanding = outstanding.saturating_sub(1);
                }
            }
        }
        return Ok(stats::duration_bw_report(
            size,
            sampled,
            c.sample_secs(),
            cfg.unit,
        ));
    }
    Ok(stats::bw_report(
        size,
        &tposted,
        &tcompleted,
        pt::DEFAULT_CQ_MOD as usize,
        cfg.unit,
    ))
}

/// write_lat's ping-pong. With `-D` both sides start their clocks at
/// once, a wait for the peer's write ends at the end of the run, and the
/// writes completed during the sample are counted.
fn write_lat(cfg: &Cfg, d: &Data, size: u64, side: Side) -> Res<Outcome> {
    let mut clock = cfg.clock();
    let dur = clock.is_some();
    let n = if dur { u64::MAX } else { cfg.iters };
    let len = size as usize;
    let qp = &d.qps[0];
    let rem = d.rem[0];
    let poll_off = d.region(0) + len - 1;
    let mut stamps = Vec::with_capacity(if dur { 0 } else { n as usize });
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut outstanding = 0u64;
    let mut sampled = 0u64;
    let mut wcs = [EMPTY_WC; 16];
    if let Some(c) = clock.as_mut() {
        c.start(Instant::now());
    }
    'run: while dur || scnt < n || rcnt < n {
        if clock.is_some_and(|c| c.ended(Instant::now())) {
            break;
        }
        if rcnt < n && !(scnt == 0 && side == Side::Server) {
            rcnt += 1;
            let want = pt::write_lat_marker(rcnt);
            let deadline = Instant::now() + PEER_TIMEOUT;
            // Spins in slices, between which the run's end and the peer's
            // silence are checked.
            let arrived = |d: &Data| {
                if d.spin {
                    spin_byte(&d.mr, poll_off, want, POLL_SLICE)
                } else {
                    d.mr.wait_byte(poll_off, want, Some(POLL_SLICE))
                }
            };
            while !arrived(d) {
                let now = Instant::now();
                if clock.is_some_and(|c| c.ended(now)) {
                    break 'run;
                }
                if now > deadline {
                    let mut b = vec![0u8; len];
                    d.mr.read(d.region(0), &mut b);
                    return Err(format!(
                        "write_lat: no write {rcnt} from the peer (region {b:?})"
                    ));
                }
            }
        }
        if scnt < n {
            scnt += 1;
            d.mr.write(len - 1, &[pt::write_lat_marker(scnt)]);
            if !dur {
                stamps.push(Instant::now());
            }
            qp.post_send(&SendWr {
                wr_id: 0,
                op: SendOp::Write {
                    remote_addr: rem.vaddr,
                    rkey: rem.rkey,
                },
                sgl: &[d.mr.sge(0, len)],
                signaled: true,
            })
            .map_err(|e| format!("post_send: {e:?}"))?;
            outstanding += 1;
        }
        let k = d.cq.poll(&mut wcs);
        let now = Instant::now();
        for wc in &wcs[..k] {
            check(wc)?;
            outstanding = outstanding.saturating_sub(1);
            if clock.is_some_and(|c| c.sampling(now)) {
                sampled += 1;
            }
        }
    }
    while outstanding > 0 {
        let k = spin_wcs(&d.cq, &mut wcs, !d.spin)?;
        for wc in &wcs[..k] {
            check(wc)?;
            outstanding = outstanding.saturating_sub(1);
        }
    }
    Ok(match clock {
        Some(c) => Outcome::LatDur(stats::duration_lat(size, sampled, c.sample_secs(), 2.0)),
        None => Outcome::Lat(stats::lat_stats(size, n, &stamps, 2.0)),
    })
}

/// send_lat's ping-pong. With `-D` each side starts its clock at its
/// first receive (as perftest's) and counts the receives completed
/// during the sample.
fn send_lat(cfg: &Cfg, d: &Data, size: u64, side: Side) -> Res<Outcome> {
    let mut clock = cfg.clock();
    let dur = clock.is_some();
    let n = if dur { u64::MAX } else { cfg.iters };
    let len = size as usize;
    let qp = &d.qps[0];
    let mut stamps = Vec::with_capacity(if dur { 0 } else { n as usize });
    let mut wcs = [EMPTY_WC; 16];
    let mut sends_out = 0u64;
    let mut recvd = 0u64;
    let mut sent = 0u64;
    let mut sampled = 0u64;
    // Client: send, then wait for the answer; server: the other way round.
    loop {
        match &clock {
            Some(c) if c.ended(Instant::now()) => break,
            None if !(sent < n || recvd < n || sends_out > 0) => break,
            _ => {}
        }
        let may_send = sent < n
            && match side {
                Side::Client => recvd == sent,
                Side::Server => recvd > sent,
            };
        if may_send {
            if !dur {
                stamps.push(Instant::now());
            }
            qp.post_send(&SendWr {
                wr_id: 0,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sgl: &[d.mr.sge(0, len)],
                signaled: true,
            })
            .map_err(|e| format!("post_send: {e:?}"))?;
            sent += 1;
            sends_out += 1;
            continue;
        }
        let until = clock.and_then(|c| c.end());
        let k = spin_wcs_until(&d.cq, &mut wcs, until, !d.spin)?;
        let now = Instant::now();
        for wc in &wcs[..k] {
            check(wc)?;
            if wc.opcode == WcOpcode::Recv {
                recvd += 1;
                if let Some(c) = clock.as_mut() {
                    c.start(now);
                    if c.sampling(now) {
                        sampled += 1;
                    }
                }
                post_recv(d, qp, 0, d.slot)?;
            } else {
                sends_out = sends_out.saturating_sub(1);
            }
        }
    }
    while sends_out > 0 {
        let k = spin_wcs(&d.cq, &mut wcs, !d.spin)?;
        for wc in &wcs[..k] {
            check(wc)?;
            if wc.opcode != WcOpcode::Recv {
                sends_out -= 1;
            }
        }
    }
    Ok(match clock {
        Some(c) => Outcome::LatDur(stats::duration_lat(size, sampled, c.sample_secs(), 2.0)),
        None => Outcome::Lat(stats::lat_stats(size, n, &stamps, 2.0)),
    })
}

/// read_lat's reads, one at a time. With `-D` the reads completed during
/// the sample are counted.
fn read_lat(cfg: &Cfg, d: &Data, size: u64) -> Res<Outcome> {
    let mut clock = cfg.clock();
    let n = if clock.is_some() { u64::MAX } else { cfg.iters };
    let len = size as usize;
    let qp = &d.qps[0];
    let rem = d.rem[0];
    let mut stamps = Vec::with_capacity(if clock.is_some() { 0 } else { n as usize });
    let mut sampled = 0u64;
    let mut wcs = [EMPTY_WC; 4];
    if let Some(c) = clock.as_mut() {
        c.start(Instant::now());
    }
    let mut i = 0u64;
    while i < n {
        let now = Instant::now();
        if clock.is_some_and(|c| c.ended(now)) {
            break;
        }
        if clock.is_none() {
            stamps.push(now);
        }
        qp.post_send(&SendWr {
            wr_id: 0,
            op: SendOp::Read {
                remote_addr: rem.vaddr,
                rkey: rem.rkey,
            },
            sgl: &[d.mr.sge(0, len)],
            signaled: true,
        })
        .map_err(|e| format!("post_send: {e:?}"))?;
        let k = spin_wcs(&d.cq, &mut wcs, !d.spin)?;
        let now = Instant::now();
        for wc in &wcs[..k] {
            check(wc)?;
            if clock.is_some_and(|c| c.sampling(now)) {
                sampled += 1;
            }
        }
        i += 1;
    }
    Ok(match clock {
        Some(c) => Outcome::LatDur(stats::duration_lat(size, sampled, c.sample_secs(), 1.0)),
        None => {
            // One more stamp closes the last round trip.
            stamps.push(Instant::now());
            Outcome::Lat(stats::lat_stats(size, n, &stamps, 1.0))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(test: Test, args: &[&str]) -> Cfg {
        let mut v = vec!["iwarp-perf"];
        v.extend_from_slice(args);
        #[derive(Parser)]
        struct W {
            #[command(flatten)]
            o: Opts,
        }
        let w = W::try_parse_from(v).unwrap();
        Cfg::new(test, w.o).unwrap()
    }

    #[test]
    fn progress_and_polling_options() {
        let lat = cfg(Test::WriteLat, &[]);
        let bw = cfg(Test::WriteBw, &[]);
        assert!(
            lat.busy_poll && !bw.busy_poll,
            "default: spin for latency only"
        );
        assert!(!lat.spin && !bw.spin);
        let c = cfg(Test::WriteLat, &["--busy-poll", "off"]);
        assert!(!c.busy_poll);
        let c = cfg(Test::WriteBw, &["--busy-poll", "on", "--spin"]);
        assert!(c.busy_poll && c.spin);
    }

    #[test]
    fn steps_follow_perftest_script() {
        let c = cfg(Test::WriteBw, &["-n", "10"]);
        let s = steps(&c);
        assert_eq!(
            s.iter().filter(|s| matches!(s, Step::Measure(_))).count(),
            1
        );
        assert_eq!(s.len(), pt::script(Test::WriteBw, 1).len());
        // send_bw -q 1: identical to the captured script.
        let c = cfg(Test::SendBw, &["1.2.3.4"]);
        let want: Vec<Step> = pt::script(Test::SendBw, 1)
            .into_iter()
            .map(|e| match e {
                Exchange::Measure => Step::Measure(vec![65536]),
                e => Step::Ex(e),
            })
            .collect();
        assert_eq!(steps(&c), want);
        // -a send_bw: one measurement per size, each between two dests.
        let c = cfg(Test::SendBw, &["-a"]);
        let s = steps(&c);
        assert_eq!(
            s.iter().filter(|s| matches!(s, Step::Measure(_))).count(),
            23
        );
        let c = cfg(Test::WriteLat, &["-a"]);
        assert_eq!(c.sizes.first(), Some(&2));
        assert_eq!(c.max_size, MAX_ALL_SIZE);
    }

    #[test]
    fn steps_bidirectional() {
        let measures = |s: &[Step]| s.iter().filter(|s| matches!(s, Step::Measure(_))).count();
        let reports = |s: &[Step]| {
            s.iter()
                .filter(|s| matches!(s, Step::Ex(Exchange::Report { .. })))
                .count()
        };
        // One size: perftest's script_with as it is.
        for t in [Test::WriteBw, Test::ReadBw, Test::SendBw] {
            let c = cfg(t, &["-b", "-n", "10"]);
            let want = pt::script_with(t, 1, true, false);
            assert_eq!(steps(&c).len(), want.len(), "{t:?}");
        }
        // -a: each size between a dest and (write/read) a dest before
        // its report.
        let s = steps(&cfg(Test::WriteBw, &["-b", "-a"]));
        assert_eq!((measures(&s), reports(&s)), (23, 23 * 5));
        let i = s
            .iter()
            .position(|s| matches!(s, Step::Measure(_)))
            .unwrap();
        assert_eq!(s[i - 1], Step::Ex(Exchange::Dest { qp: 0 }));
        assert_eq!(s[i + 1], Step::Ex(Exchange::Dest { qp: 0 }));
        assert_eq!(s[i + 2], Step::Ex(Exchange::Report { field: 0 }));
        let plain = steps(&cfg(Test::WriteBw, &["-a"]));
        assert_eq!(s.len(), plain.len() - 8 + 23 * 8 + 1);
        let s = steps(&cfg(Test::SendBw, &["-b", "-a"]));
        assert_eq!((measures(&s), reports(&s)), (23, 23 * 5));
        // send_bw -b -D: no report.
        let s = steps(&cfg(Test::SendBw, &["-b", "-D", "2"]));
        assert_eq!((measures(&s), reports(&s)), (1, 0));
        let c = cfg(Test::SendBw, &["-D", "8", "-n", "10"]);
        assert_eq!(
            (c.duration, c.tx_depth, c.rx_depth),
            (Some((8, 2)), 128, 512)
        );
    }

    #[test]
    fn depths() {
        let c = cfg(Test::WriteBw, &["-n", "50"]);
        assert_eq!((c.tx_depth, c.rx_depth, c.side), (50, 50, Side::Server));
        let c = cfg(Test::ReadBw, &["-o", "16", "h"]);
        assert_eq!((c.tx_depth, c.side), (16, Side::Client));
        let c = cfg(Test::SendLat, &[]);
        assert_eq!((c.iters, c.sizes.as_slice()), (1000, &[2u64][..]));
    }
}
