//! Half round trip of an RDMA Write ping-pong in which each side polls the
//! last byte of its buffer (A writes `size` bytes into B's buffer, B sees
//! the last byte change and writes them back; half RTT = RTT / 2), per
//! configuration and size, next to kernel TCP ping-pongs of the same
//! sizes. Needs root.

use clap::Parser;
use iwarp_bench::progress::Progress;
use iwarp_bench::report::{self, Record, Report};
use iwarp_bench::{latency, parse_size, parse_sweep, Common, Config};

#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    common: Common,
    /// No progress bar or progress lines on stderr.
    #[arg(long)]
    quiet: bool,
    /// Message sizes, e.g. 4,64K.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, conflicts_with = "sweep")]
    sizes: Option<Vec<usize>>,
    /// Powers of two from LO to HI, e.g. 1..1M.
    #[arg(long, value_parser = parse_sweep)]
    sweep: Option<iwarp_bench::Sweep>,
    /// Configurations, e.g. afxdp-crc-off,tcp-busypoll (default: all).
    #[arg(long, value_delimiter = ',', value_enum)]
    config: Option<Vec<Config>>,
    /// Iterations not counted, per size.
    #[arg(long)]
    warmup: Option<usize>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let c = &cli.common;
    let topo = match iwarp_bench::start("iwarp-lat", c.veth()) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let sizes = iwarp_bench::sizes(
        &cli.sizes,
        &cli.sweep,
        if c.quick { &[4, 4096] } else { &[4, 64 << 10] },
    );
    let n = c.n.unwrap_or(if c.quick { 20 } else { 10_000 });
    let warmup = cli.warmup.unwrap_or(if c.quick { 5 } else { 1_000 });
    let configs: Vec<Config> = cli
        .config
        .clone()
        .unwrap_or_else(|| Config::MESSAGE.to_vec());
    let cpus = c.cpus();
    println!("command: {}", report::command_line());
    println!(
        "{}, CPUs {cpus:?}, n={n} (+{warmup} warm-up), half round trips in µs",
        topo.veth
    );
    let mut recs: Vec<Record> = Vec::new();
    let bar = Progress::new(configs.len() * sizes.len(), cli.quiet);
    for cfg in configs {
        bar.start(&format!("latency: {}", cfg.name()));
        recs.extend(latency(&topo, cpus, cfg, &sizes, warmup, n));
        bar.done(sizes.len());
    }
    bar.finish();
    drop(topo);
    println!();
    print!("{}", report::table(&recs));
    let rep = Report::new("iwarp-lat", c.veth(), cpus, recs);
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
        assert_eq!(
            Cli::try_parse_from(["x", "--mtu", "9000"])
                .unwrap()
                .common
                .mtu,
            9000
        );
        assert!(Cli::try_parse_from(["x", "--mtu", "575"]).is_err());
        assert!(Cli::try_parse_from(["x", "--sizes", "4", "--sweep", "1..4"]).is_err());
    }
}
