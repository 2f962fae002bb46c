//! System load of a unidirectional RDMA Write stream (after figures 3
//! and 4 of Dalessandro, Devulapalli and Wyckoff, 2005): per
//! configuration and message size, the sender's and the receiver's CPU
//! cost, measured two ways at once: a low-priority background task on
//! each side's core (its slow-down) and per-core `/proc/stat` accounting
//! (CPU-seconds per GB moved, split into user, system and softirq). The
//! engines run spinning (manual progress) and sleeping (their own
//! progress thread, epoll when idle); kernel TCP with blocking writes is
//! the baseline. Needs root.

use clap::Parser;
use iwarp_bench::load::{self, Background, Drive, LoadParams};
use iwarp_bench::report::{self, Record, Report};
use iwarp_bench::{parse_size, Common, Config};

#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    common: Common,
    /// Message sizes (default 4K,64K; --quick: 64K).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Option<Vec<usize>>,
    /// Configurations (default: afxdp-crc-off, afxdp-crc-on,
    /// kernel-crc-off, kernel-crc-on, tcp-stream).
    #[arg(long, value_delimiter = ',', value_enum)]
    config: Option<Vec<Config>>,
    /// How the engines are driven (default: spin,sleep).
    #[arg(long, value_delimiter = ',', value_enum)]
    drive: Option<Vec<Drive>>,
    /// Seconds of traffic per run (default 4; --quick: 1).
    #[arg(long)]
    secs: Option<f64>,
    /// Seconds of idle-rate measurement before and after each run
    /// (default 1; --quick: 0.3).
    #[arg(long)]
    idle_secs: Option<f64>,
    /// Outstanding RDMA Writes.
    #[arg(short = 'q', long, default_value_t = 32)]
    depth: usize,
}

const CONFIGS: [Config; 5] = [
    Config::AfxdpCrcOff,
    Config::AfxdpCrcOn,
    Config::KernelCrcOff,
    Config::KernelCrcOn,
    Config::TcpStream,
];

fn summary(recs: &[Record]) -> String {
    let mut rows = vec![[
        "config", "size", "Gb/s", "side", "cpu_s/GB", "user", "system", "softirq", "bg_slow",
    ]
    .map(String::from)
    .to_vec()];
    let p50 = |c: &str, size: usize, m: &str| {
        recs.iter()
            .find(|r| r.config == c && r.size == size && r.metric == m)
            .and_then(|r| r.p50().or(r.error.as_ref().map(|_| f64::NAN)))
    };
    let f = |v: Option<f64>, prec: usize| match v {
        Some(x) if x.is_nan() => "-".to_string(),
        Some(x) => format!("{x:.prec$}"),
        None => "-".to_string(),
    };
    for r in recs.iter().filter(|r| r.metric == "throughput") {
        if let Some(e) = &r.error {
            rows.push(vec![
                r.config.clone(),
                report::size_str(r.size),
                format!("FAILED: {e}"),
            ]);
            continue;
        }
        for side in ["sender", "receiver"] {
            let c = format!("{}/{side}", r.config);
            let slow = p50(&c, r.size, "bg_slowdown").map(|x| x * 100.0);
            rows.push(vec![
                r.config.clone(),
                report::size_str(r.size),
                f(r.p50(), 2),
                side.into(),
                f(p50(&c, r.size, "cpu_per_gb"), 3),
                f(p50(&c, r.size, "cpu_per_gb_user"), 3),
                f(p50(&c, r.size, "cpu_per_gb_system"), 3),
                f(p50(&c, r.size, "cpu_per_gb_softirq"), 3),
                f(slow, 0) + " %",
            ]);
        }
    }
    report::render(&rows)
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let c = &cli.common;
    let topo = match iwarp_bench::start("iwarp-load", c.veth()) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let sizes = cli.sizes.clone().unwrap_or_else(|| {
        if c.quick {
            vec![64 << 10]
        } else {
            vec![4 << 10, 64 << 10]
        }
    });
    let configs = cli.config.clone().unwrap_or_else(|| CONFIGS.to_vec());
    let drives = cli
        .drive
        .clone()
        .unwrap_or_else(|| vec![Drive::Spin, Drive::Sleep]);
    let p = LoadParams {
        secs: cli.secs.unwrap_or(if c.quick { 1.0 } else { 4.0 }),
        idle_secs: cli.idle_secs.unwrap_or(if c.quick { 0.3 } else { 1.0 }),
        depth: cli.depth.max(1),
    };
    let reps = c.n.unwrap_or(1).max(1);
    let cpus = c.cpus();
    let (Some(ca), Some(cb)) = cpus else {
        eprintln!("iwarp-load: needs two CPUs (--cpus A,B)");
        return std::process::ExitCode::FAILURE;
    };
    if ca == cb {
        eprintln!("iwarp-load: the two sides need different CPUs");
        return std::process::ExitCode::FAILURE;
    }
    let bg = match Background::start([ca, cb]) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("iwarp-load: background task: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!("command: {}", report::command_line());
    println!(
        "{}, CPUs {cpus:?}, {} s of traffic per run after {} s of idle rate, depth {}, {reps} run(s) each",
        topo.veth, p.secs, p.idle_secs, p.depth
    );
    let mut recs: Vec<Record> = Vec::new();
    for _ in 0..reps {
        for &cfg in &configs {
            for &drive in &drives {
                if cfg.engine().is_none() && drive != drives[0] {
                    continue;
                }
                for &size in &sizes {
                    eprintln!(
                        "load: {} {}",
                        load::series(cfg, drive),
                        report::size_str(size)
                    );
                    report::merge(
                        &mut recs,
                        load::measure(&topo, [ca, cb], &bg, cfg, drive, size, p),
                    );
                }
            }
        }
    }
    drop(topo);
    drop(bg);
    println!();
    print!("{}", summary(&recs));
    println!("(medians; cpu_s/GB: user + system + irq + softirq of the side's core per 10^9 bytes; bg_slow: background task's slow-down; -sleep: engines on their own sleeping progress threads)");
    let rep = {
        let mut notes = iwarp_bench::notes();
        notes.push("load: a thread at nice 19 / SCHED_IDLE pinned to each side's core counts loop iterations; bg_slowdown = 1 - rate during traffic / idle rate (the higher of a window just before and one just after the traffic, no traffic running)".into());
        notes.push("load: cpu_per_gb from /proc/stat of each side's core over the traffic (user + system + irq + softirq; the background task's time is in nice, left out); the whole core counts, other processes too".into());
        notes.push("load: NAME = manual progress, the side's thread spins; NAME-sleep = the engine's own progress thread (busy_poll off, epoll when idle), the application blocks in Cq::wait; tcp-stream = blocking writes and reads of the message size".into());
        Report {
            notes,
            ..Report::new("iwarp-load", c.veth(), cpus, recs)
        }
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
        let c = Cli::try_parse_from([
            "x",
            "--sizes",
            "4K,64K",
            "--config",
            "afxdp-crc-on,tcp-stream",
            "--drive",
            "sleep",
            "--secs",
            "2",
            "--quick",
        ])
        .unwrap();
        assert_eq!(c.sizes, Some(vec![4096, 65536]));
        assert_eq!(c.drive, Some(vec![Drive::Sleep]));
        assert!(Cli::try_parse_from(["x", "--drive", "nap"]).is_err());
    }
}
