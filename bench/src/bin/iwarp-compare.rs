//! The one-run side-by-side: 4 B RDMA Write latency over AF_XDP against
//! kernel TCP (busy-poll and blocking) and against a bare smoltcp
//! ping-pong on the same AF_XDP path (the floor the RDMA layers sit on),
//! 64 KiB RDMA Write bandwidth with
//! CRC on and off against a bare smoltcp stream on the same AF_XDP path
//! and a kernel TCP stream, the kernel-socket engine and kernel TCP with
//! its offloads, and the ratios against their targets: each the median
//! of the ratios within the passes of one run, with their spread (the
//! pairing cancels the machine's drift). The CRC's cost is judged on two QPs of one
//! engine pair whose rounds alternate (`afxdp-crc-on-paired`): separate
//! runs seconds apart differ by more than the CRC costs on a shared
//! machine. Needs root.

use clap::Parser;
use iwarp_bench::report::{self, Ratio, Record, Report};
use iwarp_bench::{bandwidth, latency, BwParams, Common, Config};

#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    common: Common,
    /// Ping-pong iterations not counted.
    #[arg(long)]
    warmup: Option<usize>,
    /// Bytes per bandwidth round.
    #[arg(long, value_parser = iwarp_bench::parse_size)]
    bytes: Option<usize>,
    /// Passes over all configurations (each ratio is the median of its
    /// per-pass values; the table pools every pass's samples).
    #[arg(long)]
    passes: Option<usize>,
    /// Outstanding RDMA Writes in the bandwidth runs.
    #[arg(short = 'q', long, default_value_t = 32)]
    depth: usize,
    /// Also the kernel-socket engine over IPv6 beside IPv4 (the AF_XDP
    /// engine serves IPv4 only): IPv6's cost at 4 B and 64 KiB.
    #[arg(long)]
    ipv6: bool,
}

/// One ratio: `num / den` of `metric` within each pass, against
/// `op target`; `judged`: a target (otherwise printed for information).
struct Spec {
    name: &'static str,
    metric: &'static str,
    num: Config,
    den: Config,
    op: &'static str,
    target: f64,
    judged: bool,
}

const LAT: &str = "half_rtt";
const BW: &str = "bandwidth";

/// The targets first, then ratios printed for information.
#[rustfmt::skip]
const SPECS: [Spec; 12] = [
    Spec { name: "4 B half RTT afxdp-crc-off / tcp-busypoll", metric: LAT, num: Config::AfxdpCrcOff, den: Config::TcpBusypoll, op: "<=", target: 0.8, judged: true },
    Spec { name: "4 B half RTT afxdp-crc-off / smoltcp-raw (the RDMA layers' cost)", metric: LAT, num: Config::AfxdpCrcOff, den: Config::SmoltcpRaw, op: "<=", target: 1.1, judged: true },
    Spec { name: "64 KiB write bw afxdp-crc-on / kernel-crc-on (the two engines)", metric: BW, num: Config::AfxdpCrcOn, den: Config::KernelCrcOn, op: ">=", target: 1.2, judged: true },
    Spec { name: "64 KiB write bw afxdp-crc-on-paired / afxdp-crc-off-paired (one engine pair)", metric: BW, num: Config::AfxdpCrcOnPaired, den: Config::AfxdpCrcOffPaired, op: ">=", target: 0.95, judged: true },
    Spec { name: "64 KiB write bw afxdp-crc-on / tcp-stream-offload", metric: BW, num: Config::AfxdpCrcOn, den: Config::TcpStreamOffload, op: ">=", target: 0.5, judged: false },
    Spec { name: "64 KiB write bw afxdp-crc-on / smoltcp-raw", metric: BW, num: Config::AfxdpCrcOn, den: Config::SmoltcpRaw, op: ">=", target: 0.9, judged: false },
    Spec { name: "64 KiB write bw afxdp-crc-on / afxdp-crc-off (separate runs)", metric: BW, num: Config::AfxdpCrcOn, den: Config::AfxdpCrcOff, op: ">=", target: 0.95, judged: false },
    Spec { name: "4 B half RTT smoltcp-raw / tcp-busypoll (the transport's floor)", metric: LAT, num: Config::SmoltcpRaw, den: Config::TcpBusypoll, op: "<=", target: 0.6, judged: false },
    Spec { name: "4 B half RTT afxdp-crc-on / tcp-busypoll", metric: LAT, num: Config::AfxdpCrcOn, den: Config::TcpBusypoll, op: "<=", target: 0.8, judged: false },
    Spec { name: "4 B half RTT afxdp-crc-off / tcp-blocking", metric: LAT, num: Config::AfxdpCrcOff, den: Config::TcpBlocking, op: "<=", target: 0.6, judged: false },
    Spec { name: "64 KiB write bw afxdp-crc-on / afxdp-crc-on-stream (FPDU alignment)", metric: BW, num: Config::AfxdpCrcOn, den: Config::AfxdpCrcOnStream, op: ">=", target: 0.95, judged: false },
    Spec { name: "64 KiB write bw afxdp-crc-on / tcp-stream", metric: BW, num: Config::AfxdpCrcOn, den: Config::TcpStream, op: ">=", target: 0.9, judged: false },
];

/// With `--ipv6`: the same engine over IPv6 against IPv4.
#[rustfmt::skip]
const IPV6_SPECS: [Spec; 2] = [
    Spec { name: "64 KiB write bw kernel-crc-on-ipv6 / kernel-crc-on (IPv6's cost)", metric: BW, num: Config::KernelCrcOnIpv6, den: Config::KernelCrcOn, op: ">=", target: 0.97, judged: false },
    Spec { name: "4 B half RTT kernel-crc-off-ipv6 / kernel-crc-off (IPv6's cost)", metric: LAT, num: Config::KernelCrcOffIpv6, den: Config::KernelCrcOff, op: "<=", target: 1.03, judged: false },
];

/// The target of `spec` at `mtu`: the kernel-TCP-with-offloads ratio
/// follows [`iwarp_bench::offload_target`].
fn judged_at(spec: &Spec, mtu: usize) -> (f64, bool) {
    if spec.den == Config::TcpStreamOffload {
        return iwarp_bench::offload_target(mtu).map_or((spec.target, false), |t| (t, true));
    }
    (spec.target, spec.judged)
}

/// The size a spec's series has in the records (`None`: a stream, whose
/// size is its write size).
fn spec_size(metric: &str, cfg: Config) -> Option<usize> {
    match metric {
        LAT => Some(4),
        _ if cfg.is_stream() => None,
        _ => Some(64 << 10),
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let c = &cli.common;
    let topo = match iwarp_bench::start("iwarp-compare", c.veth()) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let quick = c.quick;
    let passes = cli.passes.unwrap_or(if quick { 1 } else { 3 }).max(1);
    let n = c.n.unwrap_or(if quick { 50 } else { 10_000 });
    let warmup = cli.warmup.unwrap_or(if quick { 10 } else { 1_000 });
    let rounds = c.n.unwrap_or(if quick { 2 } else { 5 });
    let bw = BwParams {
        depth: cli.depth,
        rounds,
        bytes: cli.bytes.unwrap_or(if quick { 1 << 20 } else { 64 << 20 }),
        max_msgs: 1 << 20,
        stream_chunk: 64 << 10,
    };
    let cpus = c.cpus();
    println!("command: {}", report::command_line());
    println!(
        "{}, CPUs {:?}, {passes} passes of: latency n={n} (+{warmup} warm-up), bandwidth {rounds} rounds of {} B, depth {}",
        topo.veth,
        cpus,
        bw.bytes,
        bw.depth
    );
    let mut recs: Vec<Record> = Vec::new();
    let mut passes_recs: Vec<Vec<Record>> = Vec::new();
    for pass in 1..=passes {
        let mut this: Vec<Record> = Vec::new();
        let v6_lat: &[Config] = if cli.ipv6 {
            &[Config::KernelCrcOff, Config::KernelCrcOffIpv6]
        } else {
            &[]
        };
        let v6_bw: &[Config] = if cli.ipv6 {
            &[Config::KernelCrcOnIpv6]
        } else {
            &[]
        };
        for &cfg in [
            Config::AfxdpCrcOff,
            Config::AfxdpCrcOn,
            Config::SmoltcpRaw,
            Config::TcpBusypoll,
            Config::TcpBlocking,
        ]
        .iter()
        .chain(v6_lat)
        {
            eprintln!("pass {pass}/{passes}: latency 4 B: {}", cfg.name());
            report::merge(&mut this, latency(&topo, cpus, cfg, &[4], warmup, n));
        }
        for &cfg in [
            Config::AfxdpCrcOn,
            Config::AfxdpCrcOff,
            Config::AfxdpCrcOnPaired,
            Config::AfxdpCrcOnStream,
            Config::KernelCrcOn,
            Config::SmoltcpRaw,
            Config::TcpStream,
            Config::TcpStreamOffload,
        ]
        .iter()
        .chain(v6_bw)
        {
            eprintln!("pass {pass}/{passes}: bandwidth 64 KiB: {}", cfg.name());
            report::merge(&mut this, bandwidth(&topo, cpus, cfg, &[64 << 10], bw));
        }
        report::merge(&mut recs, this.clone());
        passes_recs.push(this);
    }
    drop(topo);
    let mtu = usize::from(c.mtu);
    let v6_specs: &[Spec] = if cli.ipv6 { &IPV6_SPECS } else { &[] };
    let ratios: Vec<(Ratio, bool)> = SPECS
        .iter()
        .chain(v6_specs)
        .map(|spec| {
            let series = |cfg: Config| {
                move |recs: &[Record]| {
                    report::pass_p50(recs, &cfg.name(), spec.metric, spec_size(spec.metric, cfg))
                }
            };
            let values = report::per_pass(&passes_recs, series(spec.num), series(spec.den));
            let (target, judged) = judged_at(spec, mtu);
            (Ratio::paired(spec.name, values, spec.op, target), judged)
        })
        .collect();
    println!();
    print!("{}", report::table(&recs));
    println!();
    print!("{}", report::ratio_table(&ratios));
    println!("\ncommand: {}", report::command_line());
    let rep = Report {
        ratios: ratios.into_iter().map(|(r, _)| r).collect(),
        ..Report::new("iwarp-compare", c.veth(), cpus, recs)
    };
    report::finish(c.json.as_deref(), &rep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use iwarp_engine::xdp::AttachMode;

    #[test]
    fn the_targets_lead_and_every_ratio_compares_two_configurations() {
        let judged: Vec<_> = SPECS.iter().map(|s| s.judged).collect();
        assert_eq!(judged.iter().filter(|&&j| j).count(), 4);
        assert!(judged.windows(2).all(|w| w[0] || !w[1]), "targets first");
        assert!(IPV6_SPECS.iter().all(|s| !s.judged));
        for s in SPECS.iter().chain(&IPV6_SPECS) {
            assert_ne!(s.num, s.den, "{}", s.name);
            assert!(s.name.contains(&s.num.name()) && s.name.contains(&s.den.name()));
            assert!(s.metric == LAT || s.metric == BW);
        }
    }

    #[test]
    fn the_offload_ratio_is_judged_with_jumbo_frames() {
        let spec = SPECS
            .iter()
            .find(|s| s.den == Config::TcpStreamOffload)
            .unwrap();
        assert_eq!(judged_at(spec, 1500), (0.5, false));
        assert_eq!(judged_at(spec, 9000), (0.5, true));
        assert_eq!(judged_at(spec, 65535), (0.8, true));
        assert_eq!(judged_at(&SPECS[0], 9000), (0.8, true));
        assert_eq!(spec_size(BW, Config::TcpStreamOffload), None);
        assert_eq!(spec_size(BW, Config::KernelCrcOn), Some(64 << 10));
        assert_eq!(spec_size(LAT, Config::SmoltcpRaw), Some(4));
    }

    #[test]
    fn cli_parses() {
        Cli::command().debug_assert();
        let c = Cli::try_parse_from(["x", "--quick", "--mtu", "3506", "--bytes", "1M"]).unwrap();
        assert_eq!(
            (c.common.quick, c.common.mtu, c.bytes),
            (true, 3506, Some(1 << 20))
        );
        assert_eq!(c.common.veth().attach, AttachMode::Generic);
        let c =
            Cli::try_parse_from(["x", "--cpus", "0,1", "-n", "5", "--xdp-mode", "native"]).unwrap();
        assert_eq!(c.common.cpus(), (Some(0), Some(1)));
        assert_eq!(c.common.veth().attach, AttachMode::Native);
        assert_eq!(c.common.veth().mtu, 1500);
    }
}
