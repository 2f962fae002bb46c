//! Unidirectional RDMA Write bandwidth: per round, the sender keeps a
//! window of writes of one size outstanding; the receiver polls the last
//! byte of the round's last write and answers with a 4-byte RDMA Write,
//! which stops the sender's clock. Per configuration and size, plus the
//! ceilings: a kernel TCP stream (large writes) and a bare smoltcp stream
//! over the same AF_XDP path. Needs root.

use clap::Parser;
use iwarp_bench::progress::Progress;
use iwarp_bench::report::{self, Record, Report};
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
}

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
        rounds: c.n.unwrap_or(if c.quick { 2 } else { 5 }),
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
        ]);
        v
    });
    let cpus = c.cpus();
    println!("command: {}", report::command_line());
    println!(
        "{}, CPUs {cpus:?}, {} rounds per size of {} B (at most {} messages), depth {}; payload Gb/s",
        topo.veth, p.rounds, p.bytes, p.max_msgs, p.depth
    );
    let mut recs: Vec<Record> = Vec::new();
    let bar = Progress::new(configs.len() * sizes.len(), cli.quiet);
    for cfg in configs {
        bar.start(&format!("bandwidth: {}", cfg.name()));
        recs.extend(bandwidth(&topo, cpus, cfg, &sizes, p));
        bar.done(sizes.len());
    }
    bar.finish();
    drop(topo);
    println!();
    print!("{}", report::table(&recs));
    println!("(smoltcp-raw: a byte stream without messages; tcp-stream: size = write size)");
    let rep = Report::new("iwarp-bw", c.veth(), cpus, recs);
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
        assert!(Cli::try_parse_from(["x", "--mtu", "9000"]).is_err());
        assert!(Cli::try_parse_from(["x", "--sizes", "4", "--sweep", "1..4"]).is_err());
    }
}
