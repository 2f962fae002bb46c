//! Unidirectional RDMA Write bandwidth: per round, the sender keeps a
//! window of writes of one size outstanding; the receiver polls the last
//! byte of the round's last write and answers with a 4-byte RDMA Write,
//! which stops the sender's clock. Per configuration and size, plus the
//! ceilings: a kernel TCP stream (large writes) and a bare smoltcp stream
//! over the same AF_XDP path. The configurations take turns in passes;
//! each AF_XDP configuration's ratio to each baseline (`--against`) is the
//! median of its per-pass ratios, printed with their spread. Needs root.

use clap::Parser;
use iwarp_bench::progress::Progress;
use iwarp_bench::report::{self, Ratio, Record, Report};
use iwarp_bench::{bandwidth, parse_size, parse_sweep, BwParams, Common, Config};

#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    common: Common,
    /// No progress bar or progress lines on stderr.
    #[arg(long)]
    quiet: bool,
    /// Message sizes, e.g. 4K,64K.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, conflicts_with = "sweep")]
    sizes: Option<Vec<usize>>,
    /// Powers of two from LO to HI, e.g. 1..1M.
    #[arg(long, value_parser = parse_sweep)]
    sweep: Option<iwarp_bench::Sweep>,
    /// Configurations (default: all, ceilings included).
    #[arg(long, value_delimiter = ',', value_enum)]
    config: Option<Vec<Config>>,
    /// Outstanding RDMA Writes.
    #[arg(short = 'q', long, default_value_t = 32)]
    depth: usize,
    /// Bytes per round (per size; at most --max-msgs messages).
    #[arg(long, value_parser = parse_size)]
    bytes: Option<usize>,
    /// Most messages per round.
    #[arg(long)]
    max_msgs: Option<usize>,
    /// Write size of the kernel TCP stream ceiling.
    #[arg(long, value_parser = parse_size, default_value = "128K")]
    stream_chunk: usize,
    /// Passes over all configurations (default 3, 1 with --quick); -n
    /// rounds each per pass.
    #[arg(long)]
    passes: Option<usize>,
    /// Baselines the AF_XDP configurations' ratios are taken against
    /// (those of them that run).
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "kernel-crc-on,tcp-stream-offload"
    )]
    against: Vec<Config>,
}

/// The target of `num / den` at message size `size` and `mtu`, if it is
/// one: the AF_XDP engine at least 1.2 × the kernel-socket engine (CRC on
/// both), and at least 0.5 × kernel TCP with its offloads from MTU 9000
/// (0.8 × at the largest MTU), 64 KiB writes.
fn target(num: Config, den: Config, size: usize, mtu: usize) -> Option<f64> {
    if num != Config::AfxdpCrcOn || size != 64 << 10 {
        return None;
    }
    match den {
        Config::KernelCrcOn => Some(1.2),
        Config::TcpStreamOffload => iwarp_bench::offload_target(mtu),
        _ => None,
    }
}

/// The in-process link's target (one core per side, CRC on, 64 KiB
/// writes, from MTU 9000): 40 Gb/s.
const LINK_GBPS: f64 = 40.0;
const LINK_SIZE: usize = 64 << 10;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let c = &cli.common;
    let topo = match iwarp_bench::start("iwarp-bw", c.veth()) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let sizes = iwarp_bench::sizes(
        &cli.sizes,
        &cli.sweep,
        if c.quick {
            &[64, 64 << 10]
        } else {
            &[4 << 10, 64 << 10, 1 << 20]
        },
    );
    let p = BwParams {
        depth: cli.depth.max(1),
        rounds: c.n.unwrap_or(2),
        bytes: cli
            .bytes
            .unwrap_or(if c.quick { 1 << 20 } else { 64 << 20 }),
        max_msgs: cli.max_msgs.unwrap_or(if c.quick { 200 } else { 50_000 }),
        stream_chunk: cli.stream_chunk,
    };
    let configs: Vec<Config> = cli.config.clone().unwrap_or_else(|| {
        let mut v = Config::MESSAGE.to_vec();
        v.extend([
            Config::AfxdpCrcOnPaired,
            Config::TcpStream,
            Config::TcpStreamOffload,
            Config::SmoltcpRaw,
            Config::LinkCrcOff,
            Config::LinkCrcOn,
        ]);
        v
    });
    let passes = cli.passes.unwrap_or(if c.quick { 1 } else { 3 }).max(1);
    let cpus = c.cpus();
    println!("command: {}", report::command_line());
    println!(
        "{}, CPUs {cpus:?}, {passes} passes of {} rounds per size of {} B (at most {} messages), depth {}; payload Gb/s",
        topo.veth, p.rounds, p.bytes, p.max_msgs, p.depth
    );
    let mut recs: Vec<Record> = Vec::new();
    let mut pass_recs: Vec<Vec<Record>> = Vec::new();
    let bar = Progress::new(passes * configs.len() * sizes.len(), cli.quiet);
    for pass in 1..=passes {
        let mut this = Vec::new();
        for &cfg in &configs {
            bar.start(&format!("pass {pass}/{passes}: bandwidth: {}", cfg.name()));
            this.extend(bandwidth(&topo, cpus, cfg, &sizes, p));
            bar.done(sizes.len());
        }
        report::merge(&mut recs, this.clone());
        pass_recs.push(this);
    }
    bar.finish();
    drop(topo);
    let mtu = usize::from(c.mtu);
    let mut ratios: Vec<(Ratio, bool)> = Vec::new();
    // The in-process link's target: an absolute rate (there is no kernel
    // to pair it with), each pass's p50 over the rate.
    if configs.contains(&Config::LinkCrcOn) && sizes.contains(&LINK_SIZE) {
        let name = Config::LinkCrcOn.name();
        let values = report::per_pass(
            &pass_recs,
            |r| report::pass_p50(r, &name, "bandwidth", Some(LINK_SIZE)),
            |_| Some(LINK_GBPS),
        );
        let what = format!("64K write bw {name} / {LINK_GBPS} Gb/s");
        let judged = mtu >= 9000;
        ratios.push((Ratio::paired(&what, values, ">=", 1.0), judged));
    }
    let engines = |c: &&Config| c.name().starts_with("afxdp") || c.name().starts_with("link");
    for &num in configs.iter().filter(engines) {
        for &den in cli.against.iter().filter(|d| configs.contains(d)) {
            for &size in &sizes {
                let den_size = (!den.is_stream()).then_some(size);
                let values = report::per_pass(
                    &pass_recs,
                    |r| report::pass_p50(r, &num.name(), "bandwidth", Some(size)),
                    |r| report::pass_p50(r, &den.name(), "bandwidth", den_size),
                );
                let name = format!(
                    "{} write bw {} / {}",
                    report::size_str(size),
                    num.name(),
                    den.name()
                );
                let t = target(num, den, size, mtu);
                ratios.push((
                    Ratio::paired(&name, values, ">=", t.unwrap_or(0.0)),
                    t.is_some(),
                ));
            }
        }
    }
    // Targets first.
    ratios.sort_by_key(|(_, judged)| !judged);
    println!();
    print!("{}", report::table(&recs));
    println!("(smoltcp-raw: a byte stream without messages; tcp-stream: size = write size)");
    if !ratios.is_empty() {
        println!();
        print!("{}", report::ratio_table(&ratios));
    }
    let rep = Report {
        ratios: ratios.into_iter().map(|(r, _)| r).collect(),
        ..Report::new("iwarp-bw", c.veth(), cpus, recs)
    };
    report::finish(c.json.as_deref(), &rep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_parses() {
        Cli::command().debug_assert();
        let c = Cli::try_parse_from(["x", "--sweep", "1..1M", "-n", "3", "--quick"]).unwrap();
        assert_eq!(iwarp_bench::sizes(&c.sizes, &c.sweep, &[]).len(), 21);
        let c = Cli::try_parse_from([
            "x",
            "--sizes",
            "4,64K",
            "--config",
            "afxdp-crc-on,tcp-busypoll",
            "--mtu",
            "3506",
            "--json",
            "out.json",
        ])
        .unwrap();
        assert_eq!(iwarp_bench::sizes(&c.sizes, &c.sweep, &[]), vec![4, 65536]);
        assert_eq!(c.config.unwrap().len(), 2);
        let c = Cli::try_parse_from(["x", "--mtu", "65535", "--passes", "5"]).unwrap();
        assert_eq!((c.common.mtu, c.passes), (65535, Some(5)));
        assert_eq!(
            c.against,
            vec![Config::KernelCrcOn, Config::TcpStreamOffload]
        );
        assert!(Cli::try_parse_from(["x", "--mtu", "575"]).is_err());
        assert!(Cli::try_parse_from(["x", "--sizes", "4", "--sweep", "1..4"]).is_err());
    }

    #[test]
    fn targets_follow_the_mtu() {
        let (on, k64) = (Config::AfxdpCrcOn, 64 << 10);
        assert_eq!(target(on, Config::KernelCrcOn, k64, 1500), Some(1.2));
        assert_eq!(target(on, Config::TcpStreamOffload, k64, 1500), None);
        assert_eq!(target(on, Config::TcpStreamOffload, k64, 9000), Some(0.5));
        assert_eq!(target(on, Config::TcpStreamOffload, k64, 65535), Some(0.8));
        assert_eq!(target(on, Config::KernelCrcOn, 4096, 1500), None);
        assert_eq!(
            target(Config::AfxdpCrcOff, Config::KernelCrcOn, k64, 1500),
            None
        );
        assert!(Config::TcpStreamOffload.is_stream() && !Config::KernelCrcOn.is_stream());
    }
}
