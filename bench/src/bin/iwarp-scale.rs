//! Aggregate RDMA Write throughput and memory per QP with many queue
//! pairs on one AF_XDP engine core (side b, the receiver); side a opens
//! the QPs (kernel-socket engine by default) and keeps a window of writes
//! outstanding on each, posting round robin. Prints the ratio of the
//! largest QP count's aggregate to the 1-QP aggregate. Needs root.

use clap::Parser;
use iwarp_bench::report::{self, Ratio, Record, Report};
use iwarp_bench::scale::{self, ScaleParams, Sender};
use iwarp_bench::{next_port, parse_size, Common};

#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    common: Common,
    /// QP counts (default 1,16,256,1024; --quick: 1,16).
    #[arg(long, value_delimiter = ',')]
    qps: Option<Vec<usize>>,
    /// Bytes per RDMA Write.
    #[arg(long, value_parser = parse_size, default_value = "64K")]
    size: usize,
    /// Outstanding writes per QP.
    #[arg(short = 'w', long, default_value_t = 4)]
    window: usize,
    /// Seconds of counted traffic per QP count (default 3; --quick: 1).
    #[arg(long)]
    secs: Option<f64>,
    /// Seconds of traffic before counting (default 1; --quick: 0.3), and
    /// at least until every QP has seen a write complete (at 10,000 QPs
    /// one round of writes takes seconds).
    #[arg(long)]
    warmup: Option<f64>,
    /// Backend of the sending side.
    #[arg(long, value_enum, default_value = "kernel")]
    sender: Sender,
    /// UMEM frames of the AF_XDP engines.
    #[arg(long, default_value_t = 4096)]
    frames: u32,
    /// Size the receiver's TCP buffers so N windows fit its fill ring
    /// (rx frames x MSS / N) instead of the default 256 KiB.
    #[arg(long)]
    fit_window: bool,
    /// Bound the receiver's TCP buffers together by its fill ring (rx
    /// frames x MSS): each connection gets the default or what the
    /// others leave, at least 4 KiB.
    #[arg(long, conflicts_with = "fit_window")]
    rx_budget: bool,
    /// Receive frames the receiver's windows share
    /// (`iwarp_tcp::Config::window_frames`; default: half its fill
    /// ring; 0: windows are not cut).
    #[arg(long)]
    window_frames: Option<usize>,
    /// With the kernel sender, leave the kernel's processing of the
    /// frames side a receives where veth runs it: in side b's `sendto`,
    /// on side b's core. By default it is steered to side a's CPU (RPS),
    /// as on a host of its own.
    #[arg(long)]
    no_steer: bool,
    /// Skip the kernel TCP baseline (N kernel TCP connections between
    /// the same two cores, run after each QP count: the platform's own
    /// aggregate at that count).
    #[arg(long)]
    no_baseline: bool,
}

/// The target of the aggregate ratio at `n` QPs to one QP's: at least
/// 0.9 at 1024, 0.8 at 10,000, and 0.8 at any other largest count.
fn aggregate_target(n: usize, max: usize) -> Option<f64> {
    match n {
        1024 => Some(0.9),
        10_000 => Some(0.8),
        _ if n == max => Some(0.8),
        _ => None,
    }
}

/// `num[i] / den[i]` for each pass both have.
fn per_pass(num: Option<&Record>, den: Option<&Record>) -> Vec<f64> {
    match (num, den) {
        (Some(a), Some(b)) => a
            .samples
            .iter()
            .zip(&b.samples)
            .filter(|(_, d)| **d > 0.0)
            .map(|(n, d)| n / d)
            .collect(),
        _ => Vec::new(),
    }
}

/// The series of the kernel TCP baseline.
const TCP_STREAMS: &str = "tcp-streams";

/// Ratios of the passes, for a line of output.
fn fmt_passes(v: &[f64]) -> String {
    let s: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
    format!("[{}]", s.join(" "))
}

/// The series name: receiver backend and sender backend.
fn series(s: Sender, fit: bool, budget: bool, window_frames: Option<usize>) -> String {
    let base = match s {
        Sender::Kernel => "afxdp-rx/kernel-tx",
        Sender::Afxdp => "afxdp-rx/afxdp-tx",
    };
    let base = match window_frames {
        Some(n) => format!("{base}-wf{n}"),
        None => base.to_string(),
    };
    if fit {
        format!("{base}-fit")
    } else if budget {
        format!("{base}-budget")
    } else {
        base
    }
}

fn main() -> std::process::ExitCode {
    // Side b of the kernel TCP baseline, a process of its own.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(iwarp_bench::streams::RECEIVER_FLAG) {
        return iwarp_bench::streams::receiver_main(&args[2..]);
    }
    let cli = Cli::parse();
    let c = &cli.common;
    let topo = match iwarp_bench::start("iwarp-scale", c.veth()) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let counts = cli.qps.clone().unwrap_or_else(|| {
        if c.quick {
            vec![1, 16]
        } else {
            vec![1, 16, 256, 1024]
        }
    });
    let p = ScaleParams {
        size: cli.size,
        window: cli.window.max(1),
        secs: cli.secs.unwrap_or(if c.quick { 1.0 } else { 3.0 }),
        warmup: cli.warmup.unwrap_or(if c.quick { 0.3 } else { 1.0 }),
        sender: cli.sender,
        frames: cli.frames,
        fit: cli.fit_window,
        budget: cli.rx_budget,
        window_frames: cli.window_frames,
    };
    let reps = c.n.unwrap_or(1).max(1);
    let cpus = c.cpus();
    // The kernel sender's TCP runs on side a's core, as on a host of its
    // own (the AF_XDP sender's kernel only redirects and copies frames,
    // a NIC's work, which stays with whoever sent them).
    let steered = match (p.sender, cpus.0) {
        (Sender::Kernel, Some(cpu)) if !cli.no_steer => match topo.steer_a(cpu) {
            Ok(()) => Some(cpu),
            Err(e) => {
                eprintln!("error: steering side a's receive processing to CPU {cpu}: {e} (--no-steer runs without)");
                return std::process::ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    println!("command: {}", report::command_line());
    println!(
        "{}, CPUs {cpus:?}, {} B writes, window {} per QP, {} s counted after {} s, sender {:?}, {} UMEM frames, receiver TCP buffers {}, side a's receive processing {}",
        topo.veth, p.size, p.window, p.secs, p.warmup, p.sender, p.frames,
        if p.fit {
            "fitted to the fill ring"
        } else if p.budget {
            "bounded together by the fill ring"
        } else {
            "default"
        },
        match steered {
            Some(cpu) => format!("on CPU {cpu} (RPS)"),
            None => "where veth runs it".into(),
        }
    );
    let name = series(p.sender, p.fit, p.budget, p.window_frames);
    let baseline = !cli.no_baseline;
    let max = counts.iter().copied().max().unwrap_or(1);
    // Side a's sockets of the baseline (side b is a process of its own),
    // or the kernel sender's, live in this process.
    let fd_limit = match iwarp_bench::streams::raise_fd_limit(iwarp_bench::streams::fds_needed(max))
    {
        Ok(l) => l,
        Err(e) => {
            eprintln!("note: could not raise the open-file limit: {e}");
            0
        }
    };
    let mut recs: Vec<Record> = Vec::new();
    let mut rows = vec![[
        "qps",
        "Gb/s",
        "rx Gb/s",
        "RSS before",
        "RSS setup",
        "RSS traffic",
        "RSS idle",
        "KiB/QP setup",
        "KiB/QP traffic",
        "KiB/QP idle",
        "stuck writes",
        "tcp bufs KiB/QP",
        "rx drops",
        "ns/rx frame",
        "a ns/KiB",
        "work % a/b",
        "softirq % a/b",
        "faults a/b",
        "conn/s",
        "tcp Gb/s",
    ]
    .map(String::from)
    .to_vec()];
    for _ in 0..reps {
        for &n in &counts {
            eprintln!("scale: {n} QPs");
            let with = |mut r: Record| {
                r.qps = Some(n);
                r
            };
            let mut new = Vec::new();
            match scale::run(&topo, cpus, n, next_port(), p) {
                Ok(r) => {
                    let setup = scale::per_qp(r.rss_before, r.rss_setup, n);
                    let traffic = scale::per_qp(r.rss_before, r.rss_traffic, n);
                    let idle = scale::per_qp(r.rss_before, r.rss_idle, n);
                    rows.push(vec![
                        n.to_string(),
                        format!("{:.2}", r.gbps),
                        format!("{:.2}", r.rx_gbps),
                        r.rss_before.to_string(),
                        r.rss_setup.to_string(),
                        r.rss_traffic.to_string(),
                        r.rss_idle.to_string(),
                        format!("{setup:.1}"),
                        format!("{traffic:.1}"),
                        format!("{idle:.1}"),
                        r.stuck_writes.to_string(),
                        format!("{:.0}", r.tcp_buffers),
                        r.rx_dropped.to_string(),
                        format!("{:.0}", r.rx_frame_ns),
                        format!("{:.0}", r.tx_kib_ns),
                        format!("{:.0}/{:.0}", 100.0 * r.work[0], 100.0 * r.work[1]),
                        r.softirq.map_or("-".into(), |[a, b]| {
                            format!("{:.0}/{:.0}", 100.0 * a, 100.0 * b)
                        }),
                        format!("{}/{}", r.faults[0], r.faults[1]),
                        format!("{:.0}", r.connect_rate),
                    ]);
                    let need = iwarp_bench::streams::fds_needed(n);
                    let row = rows.last_mut().expect("just pushed");
                    if baseline && need > fd_limit {
                        eprintln!("scale: kernel TCP, {n} connections: skipped, the open-file limit ({fd_limit}) is below the {need} descriptors each side needs");
                        row.push("fd limit".into());
                    } else if baseline {
                        match iwarp_bench::streams::run(&topo, cpus, n, next_port(), p) {
                            Ok(g) => {
                                row.push(format!("{g:.2}"));
                                new.push(with(Record::new(
                                    TCP_STREAMS,
                                    p.size,
                                    "aggregate_bw",
                                    "Gb/s",
                                    vec![g],
                                )));
                            }
                            Err(e) => {
                                eprintln!("scale: kernel TCP, {n} connections: {e}");
                                row.push("FAILED".into());
                                new.push(with(Record::failed(
                                    TCP_STREAMS,
                                    p.size,
                                    "aggregate_bw",
                                    "Gb/s",
                                    &e,
                                )));
                            }
                        }
                    }
                    let rec = |cfg: &str, m: &str, u: &str, v: f64| {
                        with(Record::new(cfg, p.size, m, u, vec![v]))
                    };
                    new.push(rec(&name, "aggregate_bw", "Gb/s", r.gbps));
                    new.push(rec(&name, "received_bw", "Gb/s", r.rx_gbps));
                    new.push(rec(&name, "mem_per_qp", "KiB", setup));
                    new.push(rec(
                        &format!("{name}/after-traffic"),
                        "mem_per_qp",
                        "KiB",
                        traffic,
                    ));
                    new.push(rec(&format!("{name}/idle"), "mem_per_qp", "KiB", idle));
                    new.push(rec(
                        &format!("{name}/tcp-buffers"),
                        "mem_per_qp",
                        "KiB",
                        r.tcp_buffers,
                    ));
                    new.push(rec(&name, "rx_frame_cost", "ns", r.rx_frame_ns));
                    new.push(rec(&name, "tx_kib_cost", "ns", r.tx_kib_ns));
                    new.push(rec(&name, "connect_rate", "conn/s", r.connect_rate));
                    for (i, side) in ["side-a", "side-b"].into_iter().enumerate() {
                        let cfg = format!("{name}/{side}");
                        new.push(rec(&cfg, "work_share", "%", 100.0 * r.work[i]));
                        new.push(rec(&cfg, "page_faults", "faults", r.faults[i] as f64));
                        if let Some(share) = r.softirq {
                            new.push(rec(&cfg, "softirq_share", "%", 100.0 * share[i]));
                        }
                    }
                }
                Err(e) => {
                    eprintln!("scale: {n} QPs: {e}");
                    rows.push(vec![n.to_string(), format!("FAILED: {e}")]);
                    new.push(with(Record::failed(
                        &name,
                        p.size,
                        "aggregate_bw",
                        "Gb/s",
                        &e,
                    )));
                    new.push(with(Record::failed(&name, p.size, "mem_per_qp", "KiB", &e)));
                }
            }
            report::merge(&mut recs, new);
        }
    }
    drop(topo);
    println!();
    print!("{}", report::render(&rows));
    println!("(Gb/s: writes side a saw complete; rx Gb/s: frames side b received, headers included, over the same seconds; RSS in KiB of the whole process: both engines; KiB/QP = RSS difference / QPs; RSS idle: the writes complete (see stuck writes), side b received nothing for a second (or 5 s passed), and the connections quiet for twice the stacks' idle_release, after which the AF_XDP engines give their socket buffers' pages back; stuck writes: writes not complete 40 s after the counted traffic ended (the quiet period starts then regardless); tcp bufs = side b's configured smoltcp receive + transmit buffers per connection, the most one gets (a receive buffer is cut to the connection's part of the shared frames), allocated, resident only once touched; rx drops: frames side b's AF_XDP socket dropped; ns/rx frame: side b's time in engine passes that did work during the counted seconds / frames it received meanwhile; a ns/KiB: side a's time in rounds that did work (an engine pass that did work, or completions to repost) during the counted seconds / KiB of the writes that completed; work % a/b: the share of the counted seconds side a spent in rounds that did work / side b in passes that did work (a side well below 100 waited for the other or for the network); softirq % a/b: the share of side a's / side b's core in soft interrupts over the counted seconds, the kernel's network processing (TCP, veth, generic XDP), time the engine thread on that core did not get; faults a/b: page faults of side a's / side b's thread during the counted seconds (buffer pages touched for the first time); conn/s: connections side a opened one after the other per second, MPA exchange included; tcp Gb/s: payload side b received over N kernel TCP connections between the same cores, run right after (the platform's own aggregate at that count))");
    let record = |cfg: &str, m: &str, n: usize| {
        recs.iter()
            .find(|r| r.metric == m && r.qps == Some(n) && r.config == cfg)
    };
    // The median of the per-pass ratios: each pass's two counts ran
    // minutes apart at most, the passes further apart.
    let ratio = |label: &str, m: &str, n: usize, op: &str, target: f64| {
        let v = per_pass(record(&name, m, n), record(&name, m, 1));
        Ratio::paired(label, v, op, target)
    };
    let mut ratios = Vec::new();
    if counts.contains(&1) {
        for &n in counts.iter().filter(|&&n| n > 1) {
            if let Some(t) = aggregate_target(n, max) {
                ratios.push(ratio(
                    &format!("aggregate received {n} QPs / 1 QP"),
                    "received_bw",
                    n,
                    ">=",
                    t,
                ));
                ratios.push(ratio(
                    &format!("aggregate of completed writes {n} QPs / 1 QP"),
                    "aggregate_bw",
                    n,
                    ">=",
                    t,
                ));
            }
            if n == 10_000 || n == max {
                ratios.push(ratio(
                    &format!("receive cost per frame {n} QPs / 1 QP"),
                    "rx_frame_cost",
                    n,
                    "<=",
                    1.2,
                ));
            }
        }
    }
    // Side a's cost and the kernel TCP baseline have no target: the one
    // tells whether the sender or the receiver grew more expensive with
    // the QP count, the other what the platform itself keeps at that
    // count.
    if max > 1 && counts.contains(&1) {
        let tx = |n: usize| record(&name, "tx_kib_cost", n);
        match report::median(&per_pass(tx(max), tx(1))) {
            Some(v) => {
                println!("side a's send cost per KiB {max} QPs / 1 QP: {v:.2} (no target)",)
            }
            _ => println!("side a's send cost per KiB {max} QPs / 1 QP: n/a"),
        }
        if baseline {
            let tcp = |n: usize| record(TCP_STREAMS, "aggregate_bw", n);
            for &n in counts.iter().filter(|&&n| n > 1) {
                let ours = per_pass(
                    record(&name, "received_bw", n),
                    record(&name, "received_bw", 1),
                );
                let theirs = per_pass(tcp(n), tcp(1));
                match report::median(&theirs) {
                    Some(v) => println!(
                        "kernel TCP's aggregate {n} connections / 1: {v:.2} per pass {} (no target; RDMA received per pass {})",
                        fmt_passes(&theirs),
                        fmt_passes(&ours),
                    ),
                    _ => println!("kernel TCP's aggregate {n} connections / 1: n/a"),
                }
            }
        }
    }
    for r in &ratios {
        match r.value {
            Some(v) => println!(
                "ratio {}: {v:.2} per pass {} (target {} {}: {})",
                r.name,
                fmt_passes(&r.per_pass),
                r.op,
                r.target,
                if r.met == Some(true) {
                    "met"
                } else {
                    "not met"
                }
            ),
            None => println!("ratio {}: n/a", r.name),
        }
    }
    let rep = {
        let mut notes = iwarp_bench::notes();
        notes.push(format!("scale: side b = one AF_XDP engine in manual progress on one core (receiver); side a = {:?} engine (sender) on the other; every QP keeps {} writes of {} B outstanding, reposted as completions arrive", p.sender, p.window, p.size));
        notes.push(match steered {
            Some(cpu) => format!("scale: the kernel's processing of frames side a receives runs on side a's CPU {cpu} (rps_cpus of its veth end)"),
            None => "scale: the kernel's processing of frames side a receives runs where veth runs it (in the sender's context)".into(),
        });
        notes.push("scale: mem_per_qp = (process RSS with N QPs connected - RSS before any QP) / N, both engines in one process; /after-traffic: RSS after the traffic; /tcp-buffers: side b's smoltcp rx + tx buffer per connection (computed)".into());
        notes.push("scale: aggregate_bw = payload of the writes side a saw complete in the counted seconds (kernel sender: taken into its socket buffers); received_bw = bytes of the Ethernet frames side b's engine received in the same seconds".into());
        notes.push("scale: rx_frame_cost = side b's time in engine passes that did work (Device::progress > 0) during the counted seconds / frames its user-space TCP received meanwhile".into());
        if baseline {
            notes.push(format!("scale: tcp-streams = payload Gb/s side b read over N kernel TCP connections between the same cores (edge-triggered epoll on both sides, socket buffers of {} B), run right after each count", p.size * p.window));
        }
        notes.push("scale: tx_kib_cost = side a's time in loop rounds that did work (Device::progress > 0 or completions to repost) during the counted seconds / KiB of the writes that completed meanwhile".into());
        Report {
            notes,
            ratios,
            ..Report::new("iwarp-scale", c.veth(), cpus, recs)
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
        let c = Cli::try_parse_from(["x", "--qps", "1,16,1024", "--sender", "afxdp", "--quick"])
            .unwrap();
        assert_eq!(c.qps, Some(vec![1, 16, 1024]));
        assert_eq!(c.sender, Sender::Afxdp);
        assert_eq!(c.size, 65536);
        assert!(Cli::try_parse_from(["x", "--sender", "siw"]).is_err());
        assert!(!c.no_baseline);
        assert!(
            Cli::try_parse_from(["x", "--no-baseline"])
                .unwrap()
                .no_baseline
        );
    }

    #[test]
    fn targets_follow_the_counts() {
        assert_eq!(aggregate_target(1024, 10_000), Some(0.9));
        assert_eq!(aggregate_target(10_000, 10_000), Some(0.8));
        assert_eq!(aggregate_target(16, 16), Some(0.8));
        assert_eq!(aggregate_target(256, 10_000), None);
    }

    #[test]
    fn passes_pair_up() {
        let r = |v: Vec<f64>| Record::new("x", 1, "aggregate_bw", "Gb/s", v);
        let (a, b) = (r(vec![2.0, 3.0, 1.0]), r(vec![4.0, 0.0]));
        assert_eq!(per_pass(Some(&a), Some(&b)), vec![0.5]);
        assert_eq!(per_pass(Some(&a), None), Vec::<f64>::new());
        assert_eq!(fmt_passes(&[0.5, 1.25]), "[0.50 1.25]");
    }
}
