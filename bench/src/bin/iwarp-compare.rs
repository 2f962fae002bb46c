//! The one-run side-by-side: 4 B RDMA Write latency over AF_XDP against
//! kernel TCP (busy-poll and blocking) and against a bare smoltcp
//! ping-pong on the same AF_XDP path (the floor the RDMA layers sit on),
//! 64 KiB RDMA Write bandwidth with
//! CRC on and off against a bare smoltcp stream on the same AF_XDP path
//! and a kernel TCP stream, and the ratios against their targets
//! (medians of one run). Needs root.

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
    /// Passes over all configurations (the samples of every pass are
    /// pooled; interleaving spreads the machine's load changes evenly).
    #[arg(long)]
    passes: Option<usize>,
    /// Outstanding RDMA Writes in the bandwidth runs.
    #[arg(short = 'q', long, default_value_t = 32)]
    depth: usize,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let c = &cli.common;
    let topo = match iwarp_bench::start("iwarp-compare", c.mtu.into()) {
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
        "MTU {}, CPUs {:?}, {passes} passes of: latency n={n} (+{warmup} warm-up), bandwidth {rounds} rounds of {} B, depth {}",
        topo.mtu,
        cpus,
        bw.bytes,
        bw.depth
    );
    let mut recs: Vec<Record> = Vec::new();
    for pass in 1..=passes {
        for cfg in [
            Config::AfxdpCrcOff,
            Config::AfxdpCrcOn,
            Config::SmoltcpRaw,
            Config::TcpBusypoll,
            Config::TcpBlocking,
        ] {
            eprintln!("pass {pass}/{passes}: latency 4 B: {}", cfg.name());
            report::merge(&mut recs, latency(&topo, cpus, cfg, &[4], warmup, n));
        }
        for cfg in [
            Config::AfxdpCrcOn,
            Config::AfxdpCrcOff,
            Config::AfxdpCrcOnStream,
            Config::SmoltcpRaw,
            Config::TcpStream,
        ] {
            eprintln!("pass {pass}/{passes}: bandwidth 64 KiB: {}", cfg.name());
            report::merge(&mut recs, bandwidth(&topo, cpus, cfg, &[64 << 10], bw));
        }
    }
    drop(topo);
    let med = |cfg: Config, metric: &str| {
        recs.iter()
            .find(|r| r.config == cfg.name() && r.metric == metric)
            .and_then(Record::p50)
    };
    let ratios = vec![
        Ratio::new(
            "4 B half RTT afxdp-crc-off / tcp-busypoll",
            med(Config::AfxdpCrcOff, "half_rtt"),
            med(Config::TcpBusypoll, "half_rtt"),
            "<=",
            0.6,
        ),
        Ratio::new(
            "64 KiB write bw afxdp-crc-on / smoltcp-raw",
            med(Config::AfxdpCrcOn, "bandwidth"),
            med(Config::SmoltcpRaw, "bandwidth"),
            ">=",
            0.9,
        ),
        Ratio::new(
            "64 KiB write bw afxdp-crc-on / afxdp-crc-off",
            med(Config::AfxdpCrcOn, "bandwidth"),
            med(Config::AfxdpCrcOff, "bandwidth"),
            ">=",
            0.95,
        ),
    ];
    let info = vec![
        Ratio::new(
            "4 B half RTT smoltcp-raw / tcp-busypoll (the transport's floor)",
            med(Config::SmoltcpRaw, "half_rtt"),
            med(Config::TcpBusypoll, "half_rtt"),
            "<=",
            0.6,
        ),
        Ratio::new(
            "4 B half RTT afxdp-crc-off / smoltcp-raw (the RDMA layers' cost)",
            med(Config::AfxdpCrcOff, "half_rtt"),
            med(Config::SmoltcpRaw, "half_rtt"),
            "<=",
            1.0,
        ),
        Ratio::new(
            "4 B half RTT afxdp-crc-on / tcp-busypoll",
            med(Config::AfxdpCrcOn, "half_rtt"),
            med(Config::TcpBusypoll, "half_rtt"),
            "<=",
            0.6,
        ),
        Ratio::new(
            "4 B half RTT afxdp-crc-off / tcp-blocking",
            med(Config::AfxdpCrcOff, "half_rtt"),
            med(Config::TcpBlocking, "half_rtt"),
            "<=",
            0.6,
        ),
        Ratio::new(
            "64 KiB write bw afxdp-crc-on / afxdp-crc-on-stream (FPDU alignment)",
            med(Config::AfxdpCrcOn, "bandwidth"),
            med(Config::AfxdpCrcOnStream, "bandwidth"),
            ">=",
            0.95,
        ),
        Ratio::new(
            "64 KiB write bw afxdp-crc-on / tcp-stream",
            med(Config::AfxdpCrcOn, "bandwidth"),
            med(Config::TcpStream, "bandwidth"),
            ">=",
            0.9,
        ),
    ];
    println!();
    print!("{}", report::table(&recs));
    println!();
    let mut rows = vec![vec![
        "ratio (medians)".to_string(),
        "value".into(),
        "target".into(),
        "".into(),
    ]];
    for (r, judged) in ratios
        .iter()
        .map(|r| (r, true))
        .chain(info.iter().map(|r| (r, false)))
    {
        rows.push(vec![
            r.name.clone(),
            r.value.map_or("-".into(), |v| format!("{v:.3}")),
            if judged {
                format!("{} {}", r.op, r.target)
            } else {
                "(info)".into()
            },
            match (judged, r.met) {
                (false, _) => String::new(),
                (true, Some(true)) => "met".into(),
                (true, Some(false)) => "MISSED".into(),
                (true, None) => "n/a".into(),
            },
        ]);
    }
    print!("{}", report::render(&rows));
    println!("\ncommand: {}", report::command_line());
    let rep = Report {
        ratios: ratios.into_iter().chain(info).collect(),
        ..Report::new("iwarp-compare", c.mtu.into(), cpus, recs)
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
        let c = Cli::try_parse_from(["x", "--quick", "--mtu", "3506", "--bytes", "1M"]).unwrap();
        assert_eq!(
            (c.common.quick, c.common.mtu, c.bytes),
            (true, 3506, Some(1 << 20))
        );
        let c = Cli::try_parse_from(["x", "--cpus", "0,1", "-n", "5"]).unwrap();
        assert_eq!(c.common.cpus(), (Some(0), Some(1)));
    }
}
