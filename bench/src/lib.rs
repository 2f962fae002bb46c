//! Benchmarks of the stack.
//!
//! # Criterion: the protocol core alone
//!
//! `benches/core.rs` measures the sans-IO protocol core alone, on one
//! core and without any I/O: receive-side placement of RDMA Write FPDUs
//! (`handle_input`) and transmit-side framing (`poll_transmit`).
//!
//! # Binaries: the whole stack in two network namespaces
//!
//! `iwarp-lat`, `iwarp-bw` and `iwarp-compare` (in `src/bin/`) run, as
//! root, in two namespaces they create ([`topo`]): veth, MTU 1500 up to
//! 65535 (frames above a UMEM chunk are multi-buffer), kernel addresses 198.18.0.1/.2 and AF_XDP engine addresses
//! 198.18.0.11/.12. Each side runs on its own thread in its own namespace,
//! pinned to its own core; each side's application thread drives its own
//! engine (manual progress, spinning), so a run has one busy thread per
//! core. The RDMA side ([`rdma`]) is one code path for every engine
//! configuration: only the backend and the MPA options differ. Baselines:
//! kernel TCP with std sockets ([`sock`]) and a bare smoltcp stream over
//! the engine's AF_XDP socket ([`raw`]). Results: [`stats`], [`report`];
//! progress on stderr: [`progress`].
//!
//! # The report of a run
//!
//! `iwarp-report` (no root) turns the JSON files of a `scripts/bench` run
//! into a markdown report in the shape of the seed paper's experiments
//! ([`paper`]), PNG charts ([`plot`]) and a grouping of `perf` profiles by
//! component of the stack ([`profile`]).
#![warn(missing_docs)]

pub mod accept;
pub mod echo;
pub mod load;
pub mod paper;
pub mod plot;
pub mod profile;
pub mod progress;
pub mod raw;
pub mod rdma;
pub mod report;
pub mod scale;
pub mod sock;
pub mod stats;
pub mod streams;
pub mod topo;

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU16, Ordering};

use clap::{Args, ValueEnum};
use iwarp_engine::xdp::AttachMode;

use crate::rdma::Engine;
use crate::report::Record;
use crate::topo::{Topology, Veth};

/// A configuration to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Config {
    /// RDMA over the AF_XDP engine, MPA CRC off.
    AfxdpCrcOff,
    /// RDMA over the AF_XDP engine, MPA CRC on.
    AfxdpCrcOn,
    /// RDMA over the AF_XDP engine, MPA CRC and markers on.
    AfxdpCrcMarkers,
    /// `afxdp-crc-on` with FPDU alignment off: the engine writes FPDUs
    /// as a plain byte stream and smoltcp cuts it at the MSS.
    AfxdpCrcOnStream,
    /// RDMA over the kernel-socket engine, MPA CRC off.
    KernelCrcOff,
    /// RDMA over the kernel-socket engine, MPA CRC on.
    KernelCrcOn,
    /// `kernel-crc-off` over IPv6.
    KernelCrcOffIpv6,
    /// `kernel-crc-on` over IPv6.
    KernelCrcOnIpv6,
    /// Kernel TCP, blocking reads.
    TcpBlocking,
    /// Kernel TCP, nonblocking reads retried in a spin loop.
    TcpBusypoll,
    /// Kernel TCP stream, large blocking writes (bandwidth ceiling).
    TcpStream,
    /// The same stream with TX checksum offload, TSO and GSO on for its
    /// run (the other configurations run with them off).
    TcpStreamOffload,
    /// smoltcp over the engine's AF_XDP socket: a stream (bandwidth
    /// ceiling) or a ping-pong (latency floor).
    SmoltcpRaw,
    /// Bandwidth only: `afxdp-crc-on` as one of two QPs of one engine
    /// pair, the other `afxdp-crc-off-paired`; the rounds alternate
    /// between them, so load changes of the machine fall on both alike
    /// (either name measures both).
    AfxdpCrcOnPaired,
    /// Bandwidth only: the CRC-off QP of `afxdp-crc-on-paired`.
    AfxdpCrcOffPaired,
    /// RDMA over the AF_XDP engine on an in-process link (two engines in
    /// one process, frames lent between them, no kernel), MPA CRC off:
    /// the stack's own ceiling.
    LinkCrcOff,
    /// The in-process link, MPA CRC on.
    LinkCrcOn,
}

/// The target of a 64 KiB RDMA Write's bandwidth over the AF_XDP engine
/// against kernel TCP with its offloads (`tcp-stream-offload`) at `mtu`:
/// judged with jumbo frames only, where the engine's frames are as large
/// as the link allows (at least 0.5 × from MTU 9000, 0.8 × at 65535).
pub fn offload_target(mtu: usize) -> Option<f64> {
    match mtu {
        65535.. => Some(0.8),
        9000.. => Some(0.5),
        _ => None,
    }
}

impl Config {
    /// A bandwidth ceiling without messages (a byte stream): its records
    /// carry its write size, not a message size.
    pub fn is_stream(self) -> bool {
        matches!(
            self,
            Self::SmoltcpRaw | Self::TcpStream | Self::TcpStreamOffload
        )
    }

    /// The name on the command line.
    pub fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default()
    }

    /// The engine of an RDMA configuration.
    pub fn engine(self) -> Option<Engine> {
        let e = |xdp, crc, markers| {
            Some(Engine {
                xdp,
                crc,
                markers,
                align: true,
                paired: false,
                link: false,
                ipv6: false,
            })
        };
        match self {
            Self::AfxdpCrcOff => e(true, false, false),
            Self::AfxdpCrcOn => e(true, true, false),
            Self::AfxdpCrcMarkers => e(true, true, true),
            Self::AfxdpCrcOnStream => Some(Engine {
                align: false,
                ..e(true, true, false)?
            }),
            Self::KernelCrcOff => e(false, false, false),
            Self::KernelCrcOn => e(false, true, false),
            Self::KernelCrcOffIpv6 | Self::KernelCrcOnIpv6 => Some(Engine {
                ipv6: true,
                ..e(false, self == Self::KernelCrcOnIpv6, false)?
            }),
            Self::LinkCrcOff | Self::LinkCrcOn => Some(Engine {
                link: true,
                ..e(true, self == Self::LinkCrcOn, false)?
            }),
            _ => None,
        }
    }

    /// The configurations of `iwarp-lat` (and the per-size ones of
    /// `iwarp-bw`).
    pub const MESSAGE: [Self; 7] = [
        Self::AfxdpCrcOff,
        Self::AfxdpCrcOn,
        Self::AfxdpCrcMarkers,
        Self::KernelCrcOff,
        Self::KernelCrcOn,
        Self::TcpBlocking,
        Self::TcpBusypoll,
    ];
}

/// Options every binary takes.
#[derive(Args, Clone, Debug)]
pub struct Common {
    /// Write every raw sample and the summaries to FILE as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// MTU of the veth pair, 576 up to 65535 (the veth and IPv4 limit;
    /// the engines take frames above a UMEM chunk in several chunks).
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u16).range(576..))]
    pub mtu: u16,
    /// Samples per series (iterations, or bandwidth rounds).
    #[arg(short = 'n', long)]
    pub n: Option<usize>,
    /// A few iterations of tiny sizes (smoke run).
    #[arg(long)]
    pub quick: bool,
    /// CPUs of side a and side b, e.g. 0,1 (default: the first two available).
    #[arg(long, value_parser = parse_cpus)]
    pub cpus: Option<CpuPair>,
    /// How the AF_XDP engines' XDP programs attach to the veth pair.
    #[arg(long, value_enum, default_value_t = XdpMode::Generic)]
    pub xdp_mode: XdpMode,
    /// Preferred busy polling on the engines' AF_XDP sockets (20 µs,
    /// budget 64): an empty rx ring runs the driver's receive processing
    /// on the engine's core.
    #[arg(long)]
    pub xsk_busy_poll: bool,
}

/// XDP attach mode of the engines in a benchmark run.
///
/// On veth, generic mode is the faster one: the peer's transmit hands its
/// skb to the receiving stack directly, while native mode queues it for
/// the receiving veth's NAPI poll, which copies it into a page-pool page
/// before the program runs (`docs/design.md`, "XDP attach mode on veth").
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum XdpMode {
    /// Skb mode (`XDP_FLAGS_SKB_MODE`).
    Generic,
    /// Driver mode (`XDP_FLAGS_DRV_MODE`).
    Native,
}

impl XdpMode {
    /// The engine's attach mode.
    pub fn attach(self) -> AttachMode {
        match self {
            Self::Generic => AttachMode::Generic,
            Self::Native => AttachMode::Native,
        }
    }
}

/// The CPUs of side a and side b.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuPair(pub usize, pub usize);

/// `A,B`: two CPU numbers.
pub fn parse_cpus(s: &str) -> Result<CpuPair, String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("--cpus {s:?} is not A,B"))?;
    let p = |x: &str| x.trim().parse().map_err(|_| format!("bad CPU {x:?}"));
    Ok(CpuPair(p(a)?, p(b)?))
}

impl Common {
    /// The veth pair as `--mtu` and `--xdp-mode` set it up.
    pub fn veth(&self) -> Veth {
        Veth {
            mtu: self.mtu.into(),
            attach: self.xdp_mode.attach(),
            socket_busy_poll: self.xsk_busy_poll,
        }
    }

    /// The CPUs of side a and b.
    pub fn cpus(&self) -> (Option<usize>, Option<usize>) {
        match self.cpus {
            Some(CpuPair(a, b)) => (Some(a), Some(b)),
            None => topo::default_cpus(),
        }
    }
}

/// A size: a number with an optional K, M suffix (powers of 1024).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, mul) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    let n: usize = digits.parse().map_err(|_| format!("bad size {s:?}"))?;
    let v = n
        .checked_mul(mul)
        .ok_or_else(|| format!("size {s:?} too large"))?;
    if v == 0 || v > 1 << 30 {
        return Err(format!("size {s:?} outside 1..=1G"));
    }
    Ok(v)
}

/// The sizes of a sweep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sweep(pub Vec<usize>);

/// A sweep `LO..HI`: LO, then the powers of two above it up to HI.
pub fn parse_sweep(s: &str) -> Result<Sweep, String> {
    let (lo, hi) = s
        .split_once("..")
        .ok_or_else(|| format!("sweep {s:?} is not LO..HI"))?;
    let (lo, hi) = (parse_size(lo)?, parse_size(hi)?);
    if lo > hi {
        return Err(format!("sweep {s:?}: LO > HI"));
    }
    let mut v = Vec::new();
    let mut x = lo.next_power_of_two();
    if x != lo {
        v.push(lo);
    }
    while x <= hi {
        v.push(x);
        x *= 2;
    }
    Ok(Sweep(v))
}

/// Sizes from `--sizes` or `--sweep`, else `default`.
pub fn sizes(list: &Option<Vec<usize>>, sweep: &Option<Sweep>, default: &[usize]) -> Vec<usize> {
    match (list, sweep) {
        (Some(l), _) => l.clone(),
        (None, Some(s)) => s.0.clone(),
        _ => default.to_vec(),
    }
}

/// A fresh port for each connection of a run (kernel ports may linger
/// in TIME_WAIT).
pub fn next_port() -> u16 {
    static PORT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 1000) as u16 * 10;
    base + PORT.fetch_add(1, Ordering::Relaxed) % 10_000
}

/// Half round trips of `config` for `sizes`: one record per size (a
/// failure gives failed records, and the run goes on).
pub fn latency(
    topo: &Topology,
    cpus: (Option<usize>, Option<usize>),
    config: Config,
    sizes: &[usize],
    warmup: usize,
    n: usize,
) -> Vec<Record> {
    let max = sizes.iter().copied().max().unwrap_or(1);
    let port = next_port();
    let sv = sizes.to_vec();
    let r: io::Result<Vec<Vec<f64>>> = match config {
        Config::SmoltcpRaw => raw::pingpong(topo, cpus, port, sv, warmup, n),
        Config::TcpBlocking | Config::TcpBusypoll => sock::pingpong(
            topo,
            cpus,
            port,
            config == Config::TcpBusypoll,
            sv,
            warmup,
            n,
        ),
        c => match c.engine() {
            Some(e) => {
                let sb = sv.clone();
                rdma::run_pair(
                    topo,
                    cpus,
                    e,
                    port,
                    max,
                    max,
                    16,
                    move |s| rdma::pingpong_a(s, &sv, warmup, n),
                    move |s| rdma::pingpong_b(s, &sb, warmup, n),
                )
            }
            None => Err(io::Error::other(format!(
                "{} has no latency test",
                c.name()
            ))),
        },
    };
    let name = config.name();
    match r {
        Ok(v) => sizes
            .iter()
            .zip(v)
            .map(|(&s, samples)| Record::new(&name, s, "half_rtt", "us", samples))
            .collect(),
        Err(e) => sizes
            .iter()
            .map(|&s| Record::failed(&name, s, "half_rtt", "us", &e))
            .collect(),
    }
}

/// How much a bandwidth round moves.
#[derive(Clone, Copy, Debug)]
pub struct BwParams {
    /// Outstanding writes.
    pub depth: usize,
    /// Rounds (samples) per size.
    pub rounds: usize,
    /// Bytes per round (at most `max_msgs` messages).
    pub bytes: usize,
    /// Most messages per round.
    pub max_msgs: usize,
    /// Write size of the kernel TCP stream ceiling.
    pub stream_chunk: usize,
}

/// Bandwidth of `config`: one record per size (the ceilings, which do
/// not depend on the message size, give one record).
pub fn bandwidth(
    topo: &Topology,
    cpus: (Option<usize>, Option<usize>),
    config: Config,
    sizes: &[usize],
    p: BwParams,
) -> Vec<Record> {
    let name = config.name();
    let port = next_port();
    let one = |size: usize, count: usize, r: io::Result<Vec<f64>>| {
        let mut rec = match r {
            Ok(v) => Record::new(&name, size, "bandwidth", "Gb/s", v),
            Err(e) => Record::failed(&name, size, "bandwidth", "Gb/s", &e),
        };
        rec.messages = count;
        vec![rec]
    };
    match config {
        Config::TcpStream => {
            let count = rdma::count_for(p.stream_chunk, p.bytes, p.max_msgs);
            one(
                p.stream_chunk,
                count,
                sock::stream(topo, cpus, port, false, p.stream_chunk, count, p.rounds),
            )
        }
        Config::TcpStreamOffload => {
            let count = rdma::count_for(p.stream_chunk, p.bytes, p.max_msgs);
            let r = topo.offloads(true).and_then(|()| {
                sock::stream(topo, cpus, port, false, p.stream_chunk, count, p.rounds)
            });
            let off = topo.offloads(false);
            one(p.stream_chunk, count, r.and_then(|v| off.map(|()| v)))
        }
        Config::SmoltcpRaw => one(0, 1, raw::stream(topo, cpus, port, p.bytes, p.rounds)),
        Config::AfxdpCrcOnPaired | Config::AfxdpCrcOffPaired => paired(topo, cpus, sizes, p),
        Config::TcpBlocking | Config::TcpBusypoll => sizes
            .iter()
            .flat_map(|&size| {
                let count = rdma::count_for(size, p.bytes, p.max_msgs);
                let spin = config == Config::TcpBusypoll;
                let r = sock::stream(topo, cpus, next_port(), spin, size, count, p.rounds);
                one(size, count, r)
            })
            .collect(),
        c => {
            let Some(e) = c.engine() else {
                return Vec::new();
            };
            let max = sizes.iter().copied().max().unwrap_or(1);
            let (sa, depth, rounds, bytes, msgs) =
                (sizes.to_vec(), p.depth, p.rounds, p.bytes, p.max_msgs);
            let sb = sa.clone();
            let r = rdma::run_pair(
                topo,
                cpus,
                e,
                port,
                max.max(4),
                2 * max,
                depth + 8,
                move |s| rdma::spray_a(s, &sa, depth, rounds, bytes, msgs),
                move |s| rdma::spray_b(s, &sb, rounds),
            );
            match r {
                Ok(v) => sizes
                    .iter()
                    .zip(v)
                    .map(|(&s, b)| bw_record(&name, s, Ok(b)))
                    .collect(),
                Err(e) => sizes
                    .iter()
                    .map(|&s| bw_record(&name, s, Err(&e)))
                    .collect(),
            }
        }
    }
}

/// The bandwidth record of `name` at `size`: the rounds of an RDMA spray,
/// or the error that ended its run.
fn bw_record(name: &str, size: usize, r: Result<rdma::BwResult, &io::Error>) -> Record {
    match r {
        Ok(b) => {
            let mut rec = Record::new(name, size, "bandwidth", "Gb/s", b.gbps);
            rec.messages = b.count;
            rec
        }
        Err(e) => Record::failed(name, size, "bandwidth", "Gb/s", e),
    }
}

/// `afxdp-crc-on-paired` and `afxdp-crc-off-paired`: per size one run of
/// [`rdma::spray_paired_a`] (the CRC-on QP first, the CRC-off QP added
/// to the same engines).
fn paired(
    topo: &Topology,
    cpus: (Option<usize>, Option<usize>),
    sizes: &[usize],
    p: BwParams,
) -> Vec<Record> {
    let e = Engine {
        paired: true,
        ..Config::AfxdpCrcOn.engine().expect("an RDMA configuration")
    };
    let names = [Config::AfxdpCrcOnPaired, Config::AfxdpCrcOffPaired].map(Config::name);
    let mut out = Vec::new();
    for &size in sizes {
        let (depth, rounds, bytes, msgs) = (p.depth, p.rounds, p.bytes, p.max_msgs);
        let r = rdma::run_pair(
            topo,
            cpus,
            e,
            next_port(),
            size.max(4),
            2 * size.max(4),
            depth + 8,
            move |s| rdma::spray_paired_a(s, size, depth, rounds, bytes, msgs),
            move |s| rdma::spray_paired_b(s, size, rounds),
        );
        match r {
            Ok(results) => out.extend(
                names
                    .iter()
                    .zip(results)
                    .map(|(name, b)| bw_record(name, size, Ok(b))),
            ),
            Err(e) => out.extend(names.iter().map(|name| bw_record(name, size, Err(&e)))),
        }
    }
    out
}

/// What every report says about how the run was made.
pub fn notes() -> Vec<String> {
    vec![
        "each side: one thread in its own namespace, pinned to its own CPU; RDMA engines in manual progress, driven by that thread (spinning)".into(),
        "AF_XDP: copy mode on veth, XDP attached as the run's xdp_mode says (--xdp-mode); kernel ends: tx checksum, TSO and GSO off (scripts/lib/topology.sh), except during tcp-stream-offload".into(),
        "tcp-busypoll: nonblocking socket, read() retried in a spin loop (SO_BUSY_POLL not set); tcp-blocking: blocking read()".into(),
        "latency: half round trip of a ping-pong, each side polls the last byte of its buffer".into(),
        "bandwidth: per round, the sender's clock stops when the receiver's 4-byte answer (RDMA Write / TCP bytes) arrives".into(),
    ]
}

/// How every bench binary begins: without root it says why and the run
/// ends successfully (`Err(SUCCESS)`); it installs the teardown of its
/// namespaces on SIGINT/SIGTERM/SIGHUP and creates the two-namespace
/// topology for `veth` (`Err(FAILURE)` after printing the error).
///
/// With `RUST_LOG` set, the stack's `tracing` log goes to stderr with that
/// filter (as in the tools of `apps`); without it nothing is installed and
/// the libraries stay silent.
pub fn start(tool: &str, veth: Veth) -> Result<Topology, std::process::ExitCode> {
    init_logging(tool);
    if !require_root(tool) {
        return Err(std::process::ExitCode::SUCCESS);
    }
    topo::install_teardown()
        .and_then(|()| Topology::up(veth))
        .map_err(|e| {
            eprintln!("{tool}: {e}");
            std::process::ExitCode::FAILURE
        })
}

/// Install a `tracing` subscriber on stderr if `RUST_LOG` is set.
pub fn init_logging(tool: &str) {
    let Some(spec) = std::env::var("RUST_LOG")
        .ok()
        .filter(|s| !s.trim().is_empty())
    else {
        return;
    };
    match tracing_subscriber::EnvFilter::try_new(&spec) {
        Ok(filter) => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(io::stderr)
                .try_init();
        }
        Err(e) => eprintln!("{tool}: invalid RUST_LOG {spec:?}: {e}; no log"),
    }
}

/// Whether the process runs as root (effective uid 0). Without root it
/// prints `<tool>: needs root (...); skipped` on stderr and returns
/// `false`, so the caller ends early and successfully; the smoke step of
/// `scripts/test` relies on that note.
pub fn require_root(tool: &str) -> bool {
    if topo::is_root() {
        return true;
    }
    eprintln!("{tool}: needs root (network namespaces, veth, XDP, AF_XDP); skipped");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4"), Ok(4));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert!(parse_size("0").is_err());
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999999999999M").is_err());
    }

    #[test]
    fn sweeps_are_powers_of_two() {
        assert_eq!(parse_sweep("1..8").unwrap().0, vec![1, 2, 4, 8]);
        assert_eq!(parse_sweep("1..1M").unwrap().0.len(), 21);
        assert_eq!(parse_sweep("3..16").unwrap().0, vec![3, 4, 8, 16]);
        assert!(parse_sweep("8..1").is_err());
        assert!(parse_sweep("8").is_err());
    }

    #[test]
    fn cpus_parse() {
        assert_eq!(parse_cpus("0,1"), Ok(CpuPair(0, 1)));
        assert!(parse_cpus("0").is_err());
        assert!(parse_cpus("0,x").is_err());
    }

    #[test]
    fn config_names_match_the_cli() {
        assert_eq!(Config::AfxdpCrcMarkers.name(), "afxdp-crc-markers");
        assert_eq!(Config::TcpBusypoll.name(), "tcp-busypoll");
        assert_eq!(Config::SmoltcpRaw.name(), "smoltcp-raw");
        assert!(Config::KernelCrcOn
            .engine()
            .is_some_and(|e| !e.xdp && e.crc));
        assert!(Config::TcpStream.engine().is_none());
    }
}
