//! The report of a `scripts/bench` run in the shape of the seed paper's
//! experiments (Dalessandro, Devulapalli, Wyckoff, "Design and
//! Implementation of the iWarp Protocol in Software", PDCS 2005): Table 1
//! (latency), Figure 2 (throughput over message size), Figures 3 and 4
//! (system load) and scale, from the JSON files of one run directory,
//! with PNG charts ([`crate::plot`]), the ratios against the project's
//! targets and, where a target is missed, a `perf` profile grouped by
//! component ([`crate::profile`]). Every figure shown is read from the
//! run's files; the only numbers not measured are the paper's, quoted
//! and labelled as such.

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use serde::Serialize;

use crate::plot::{self, Series};
use crate::profile::{self, Entry};
use crate::report::{size_str, Ratio, Record, Report};

/// The input files of a run directory, by section.
pub const INPUTS: [(&str, &str); 5] = [
    ("lat", "lat.json"),
    ("bw", "bw.json"),
    ("bw-jumbo", "bw-9000.json"),
    ("load", "load.json"),
    ("scale", "scale.json"),
];

/// Latency configurations in Table 1's row order.
pub const LAT_ROWS: [&str; 7] = [
    "afxdp-crc-off",
    "afxdp-crc-on",
    "afxdp-crc-markers",
    "kernel-crc-off",
    "kernel-crc-on",
    "tcp-blocking",
    "tcp-busypoll",
];

/// Bandwidth configurations that do not depend on a message size.
pub const CEILINGS: [&str; 3] = ["tcp-stream", "tcp-stream-offload", "smoltcp-raw"];

/// What the paper itself reports that could be found (its abstract).
pub const PAPER_REF: &str = "D. Dalessandro, A. Devulapalli, P. Wyckoff, \"Design and Implementation of the iWarp Protocol in Software\", Proc. IASTED PDCS 2005 (ACTA Press, paper 22345)";

/// A perf profile of one short run.
#[derive(Clone, Debug, Serialize)]
pub struct Profile {
    /// Which section it explains (`lat`, `bw`, `scale`).
    pub name: String,
    /// The profiled command, if the file says.
    pub command: Option<String>,
    /// Self time per symbol.
    #[serde(skip)]
    pub entries: Vec<Entry>,
    /// Percent per component, largest first.
    pub components: Vec<(String, f64)>,
}

/// Everything a run directory holds.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// `lat.json` (iwarp-lat).
    pub lat: Option<Report>,
    /// `bw.json` (iwarp-bw).
    pub bw: Option<Report>,
    /// `bw-9000.json` (iwarp-bw at MTU 9000: the AF_XDP engine, the
    /// in-process link and the baselines at jumbo frames).
    pub bw_jumbo: Option<Report>,
    /// `load.json` (iwarp-load).
    pub load: Option<Report>,
    /// `scale.json` (iwarp-scale).
    pub scale: Option<Report>,
    /// `profile-*.txt`: `perf report --stdio` texts.
    pub profiles: Vec<Profile>,
    /// Files that exist but could not be read.
    pub problems: Vec<String>,
}

impl Run {
    /// Read the files of `dir`; missing ones are left `None`.
    pub fn load(dir: &Path) -> Self {
        let mut run = Self::default();
        for (key, file) in INPUTS {
            let path = dir.join(file);
            if !path.exists() {
                continue;
            }
            let r = std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|s| serde_json::from_str::<Report>(&s).map_err(|e| e.to_string()));
            match r {
                Ok(rep) => *run.slot(key) = Some(rep),
                Err(e) => run.problems.push(format!("{}: {e}", path.display())),
            }
        }
        for name in ["lat", "bw", "scale", "load"] {
            let path = dir.join(format!("profile-{name}.txt"));
            if let Ok(text) = std::fs::read_to_string(&path) {
                run.profiles.push(profile_of(name, &text));
            }
        }
        run
    }

    fn slot(&mut self, key: &str) -> &mut Option<Report> {
        match key {
            "lat" => &mut self.lat,
            "bw" => &mut self.bw,
            "bw-jumbo" => &mut self.bw_jumbo,
            "load" => &mut self.load,
            _ => &mut self.scale,
        }
    }
}

/// A profile from a `perf report --stdio` text; a line
/// `# command: ...` names the profiled command.
pub fn profile_of(name: &str, text: &str) -> Profile {
    let command = text
        .lines()
        .find_map(|l| l.strip_prefix("# command: "))
        .map(str::to_string);
    let entries = profile::parse(text);
    let components = profile::by_component(&entries)
        .into_iter()
        .map(|(c, p)| (c.to_string(), p))
        .collect();
    Profile {
        name: name.into(),
        command,
        entries,
        components,
    }
}

fn find<'a>(
    rep: &'a Option<Report>,
    config: &str,
    metric: &str,
    size: Option<usize>,
) -> Option<&'a Record> {
    rep.as_ref()?.records.iter().find(|r| {
        r.config == config
            && r.metric == metric
            && size.is_none_or(|s| r.size == s)
            && r.error.is_none()
    })
}

fn p50(rep: &Option<Report>, config: &str, metric: &str, size: Option<usize>) -> Option<f64> {
    find(rep, config, metric, size).and_then(Record::p50)
}

/// The scale record of `metric` at `qps` (the first configuration that
/// has both 1 and `qps`).
fn scale_at(rep: &Option<Report>, metric: &str, qps: usize) -> Option<f64> {
    let recs = &rep.as_ref()?.records;
    let ok = |r: &&Record| r.metric == metric && r.error.is_none();
    let cfg = recs
        .iter()
        .filter(ok)
        .find(|r| {
            r.qps == Some(1)
                && recs
                    .iter()
                    .filter(ok)
                    .any(|x| x.config == r.config && x.qps == Some(qps))
        })?
        .config
        .clone();
    recs.iter()
        .filter(ok)
        .find(|r| r.config == cfg && r.qps == Some(qps))
        .and_then(Record::p50)
}

/// The targets of the issue, each with the section whose profile
/// explains a miss.
pub fn targets(run: &Run) -> Vec<(&'static str, Ratio)> {
    let k64 = Some(64 << 10);
    vec![
        (
            "lat",
            Ratio::new(
                "4 B half RTT afxdp-crc-off / tcp-busypoll (medians)",
                p50(&run.lat, "afxdp-crc-off", "half_rtt", Some(4)),
                p50(&run.lat, "tcp-busypoll", "half_rtt", Some(4)),
                "<=",
                0.6,
            ),
        ),
        (
            "bw",
            Ratio::new(
                "64 KiB write bw afxdp-crc-on / smoltcp-raw (medians)",
                p50(&run.bw, "afxdp-crc-on", "bandwidth", k64),
                p50(&run.bw, "smoltcp-raw", "bandwidth", None),
                ">=",
                0.9,
            ),
        ),
        ("bw", crc_ratio(run)),
        ("scale", {
            // The rate side b received; reports without it: the
            // writes side a saw complete.
            let at = |q| {
                scale_at(&run.scale, "received_bw", q)
                    .or_else(|| scale_at(&run.scale, "aggregate_bw", q))
            };
            Ratio::new(
                "aggregate bw 1024 QPs / 1 QP (medians)",
                at(1024),
                at(1),
                ">=",
                0.8,
            )
        }),
    ]
}

/// CRC on / off at 64 KiB: from the two QPs of one engine pair
/// (`afxdp-crc-on-paired`) when the run has them, otherwise from the
/// separately run configurations.
fn crc_ratio(run: &Run) -> Ratio {
    let k64 = Some(64 << 10);
    let paired = (
        p50(&run.bw, "afxdp-crc-on-paired", "bandwidth", k64),
        p50(&run.bw, "afxdp-crc-off-paired", "bandwidth", k64),
    );
    let (name, on, off) = match paired {
        (Some(on), Some(off)) => (
            "64 KiB write bw afxdp-crc-on-paired / afxdp-crc-off-paired (medians, one engine pair)",
            Some(on),
            Some(off),
        ),
        _ => (
            "64 KiB write bw afxdp-crc-on / afxdp-crc-off (medians)",
            p50(&run.bw, "afxdp-crc-on", "bandwidth", k64),
            p50(&run.bw, "afxdp-crc-off", "bandwidth", k64),
        ),
    };
    Ratio::new(name, on, off, ">=", 0.95)
}

/// Sections with a missed target (each once, in order).
pub fn missed(run: &Run) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = Vec::new();
    for (sec, r) in targets(run) {
        if r.met == Some(false) && !v.contains(&sec) {
            v.push(sec);
        }
    }
    v
}

fn num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else if v.abs() >= 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = format!("| {} |\n|", head.join(" | "));
    for _ in head {
        s.push_str("---|");
    }
    s.push('\n');
    for r in rows {
        let _ = writeln!(s, "| {} |", r.join(" | "));
    }
    s
}

fn method(out: &mut String, rep: &Report) {
    let _ = writeln!(
        out,
        "*Method:* `{}` — {} (MTU {}, XDP {} mode, CPUs {}).\n",
        rep.command.trim(),
        rep.tool,
        rep.mtu,
        rep.xdp_mode,
        match rep.cpus {
            (Some(a), Some(b)) => format!("{a} and {b}"),
            _ => "unpinned".into(),
        }
    );
    for n in &rep.notes {
        let _ = writeln!(out, "- {n}");
    }
    out.push('\n');
}

fn not_run(out: &mut String, file: &str) {
    let _ = writeln!(out, "**not run** (no `{file}` in this run directory).\n");
}

fn failures(out: &mut String, rep: &Report) {
    let failed: Vec<&Record> = rep.records.iter().filter(|r| r.error.is_some()).collect();
    if failed.is_empty() {
        return;
    }
    let _ = writeln!(out, "Failed series in this run:\n");
    for r in failed {
        let _ = writeln!(
            out,
            "- {} {} {}: {}",
            r.config,
            size_str(r.size),
            r.metric,
            r.error.as_deref().unwrap_or("")
        );
    }
    out.push('\n');
}

/// Sizes of `metric` records, ascending.
fn sizes_of(rep: &Report, metric: &str, skip: &[&str]) -> Vec<usize> {
    let mut s: Vec<usize> = rep
        .records
        .iter()
        .filter(|r| r.metric == metric && !skip.contains(&r.config.as_str()))
        .map(|r| r.size)
        .collect();
    s.sort_unstable();
    s.dedup();
    s
}

/// Configurations of `metric` records, in first-seen order.
fn configs_of(rep: &Report, metric: &str, skip: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for r in &rep.records {
        if r.metric == metric && !skip.contains(&r.config.as_str()) && !v.contains(&r.config) {
            v.push(r.config.clone());
        }
    }
    v
}

fn series(
    rep: &Report,
    metric: &str,
    configs: &[String],
    pick: fn(&Record) -> Option<f64>,
) -> Vec<Series> {
    configs
        .iter()
        .map(|c| Series {
            name: c.clone(),
            points: rep
                .records
                .iter()
                .filter(|r| &r.config == c && r.metric == metric && r.size > 0)
                .filter_map(|r| pick(r).map(|v| (r.size as f64, v)))
                .collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect()
}

fn chart(out: &mut String, dir: &Path, file: &str, alt: &str, r: Result<(), String>) {
    match r {
        Ok(()) => {
            let _ = writeln!(out, "![{alt}]({file})\n");
        }
        Err(e) => {
            let _ = writeln!(out, "(chart `{file}` not drawn: {e})\n");
            let _ = std::fs::remove_file(dir.join(file));
        }
    }
}

fn latency(out: &mut String, dir: &Path, run: &Run) {
    out.push_str("## Latency (the paper's Table 1)\n\n");
    let Some(rep) = &run.lat else {
        return not_run(out, "lat.json");
    };
    method(out, rep);
    out.push_str(
        "Half round trip in µs over the samples after warm-up: mean ± sample standard \
         deviation, median (p50) and 99th percentile (nearest rank).\n\n",
    );
    let cell =
        |c: &str, s: usize| match find(&run.lat, c, "half_rtt", Some(s)).and_then(|r| r.summary) {
            Some(x) => vec![
                format!("{} ± {}", num(x.mean), num(x.stddev)),
                num(x.p50),
                num(x.p99),
                x.n.to_string(),
            ],
            None => vec!["–".into(), "–".into(), "–".into(), "–".into()],
        };
    let mut rows = Vec::new();
    let mut configs: Vec<String> = LAT_ROWS.iter().map(|s| s.to_string()).collect();
    for c in configs_of(rep, "half_rtt", &[]) {
        if !configs.contains(&c) {
            configs.push(c);
        }
    }
    for c in &configs {
        if !rep.records.iter().any(|r| &r.config == c) {
            continue;
        }
        let mut row = vec![format!("`{c}`")];
        row.extend(cell(c, 4));
        row.extend(cell(c, 64 << 10));
        rows.push(row);
    }
    out.push_str(&table(
        &[
            "configuration",
            "4 B mean ± sd",
            "4 B p50",
            "4 B p99",
            "n",
            "64 KiB mean ± sd",
            "64 KiB p50",
            "64 KiB p99",
            "n",
        ],
        &rows,
    ));
    out.push_str(
        "\n*The paper's Table 1:* its latency values could not be found in any source \
         available to this project (only the paper's abstract was), so no paper column is \
         shown rather than an invented one.\n\n",
    );
    let sizes = sizes_of(rep, "half_rtt", &[]);
    if sizes.len() > 2 {
        out.push_str("### Latency over message size (medians, µs)\n\n");
        let cfgs = configs_of(rep, "half_rtt", &[]);
        let mut head = vec!["size".to_string()];
        head.extend(cfgs.iter().cloned());
        let rows: Vec<Vec<String>> = sizes
            .iter()
            .map(|&s| {
                let mut row = vec![size_str(s)];
                for c in &cfgs {
                    row.push(p50(&run.lat, c, "half_rtt", Some(s)).map_or("–".into(), num));
                }
                row
            })
            .collect();
        let h: Vec<&str> = head.iter().map(String::as_str).collect();
        out.push_str(&table(&h, &rows));
        out.push('\n');
    }
    let s = series(
        rep,
        "half_rtt",
        &configs_of(rep, "half_rtt", &[]),
        Record::p50,
    );
    let r = plot::lines(
        &dir.join("latency.png"),
        "Half round trip vs message size (median)",
        "half round trip (µs, log)",
        &s,
        &[],
        true,
    );
    chart(out, dir, "latency.png", "latency vs message size", r);
    failures(out, rep);
}

fn throughput(out: &mut String, dir: &Path, run: &Run) {
    out.push_str("## Throughput (the paper's Figure 2)\n\n");
    let Some(rep) = &run.bw else {
        return not_run(out, "bw.json");
    };
    method(out, rep);
    out.push_str(
        "Payload Gb/s per round (median over rounds): a window of RDMA Writes of one size, \
         the receiver polls the last byte of the round's last write and answers with 4 bytes, \
         which stops the sender's clock. Kernel TCP rows (`tcp-*`) are a stream of writes of \
         that size. Ceilings that do not depend on the message size are listed below the \
         table and drawn dashed.\n\n",
    );
    let cfgs = configs_of(rep, "bandwidth", &CEILINGS);
    let sizes = sizes_of(rep, "bandwidth", &CEILINGS);
    let mut head = vec!["size".to_string()];
    head.extend(cfgs.iter().cloned());
    let rows: Vec<Vec<String>> = sizes
        .iter()
        .map(|&s| {
            let mut row = vec![size_str(s)];
            for c in &cfgs {
                row.push(p50(&run.bw, c, "bandwidth", Some(s)).map_or("–".into(), num));
            }
            row
        })
        .collect();
    let h: Vec<&str> = head.iter().map(String::as_str).collect();
    out.push_str(&table(&h, &rows));
    out.push('\n');
    let mut hl = Vec::new();
    let mut crow = Vec::new();
    for c in CEILINGS {
        if let Some(r) = find(&run.bw, c, "bandwidth", None) {
            if let Some(s) = r.summary {
                let what = match c {
                    "tcp-stream" => "kernel TCP stream, offloads off (TSO/GSO/tx csum)",
                    "tcp-stream-offload" => "kernel TCP stream, offloads on (TSO/GSO/tx csum)",
                    _ => "bare smoltcp stream over the same AF_XDP path",
                };
                crow.push(vec![
                    format!("`{c}`"),
                    what.to_string(),
                    size_str(r.size),
                    num(s.p50),
                    format!("{} ± {}", num(s.mean), num(s.stddev)),
                ]);
                hl.push((format!("{c} (ceiling)"), s.p50));
            }
        }
    }
    if !crow.is_empty() {
        out.push_str(&table(
            &["ceiling", "what", "write size", "Gb/s p50", "mean ± sd"],
            &crow,
        ));
        out.push('\n');
    }
    let s = series(rep, "bandwidth", &cfgs, Record::p50);
    let r = plot::lines(
        &dir.join("throughput.png"),
        "RDMA Write throughput vs message size (median)",
        "Gb/s",
        &s,
        &hl,
        false,
    );
    chart(out, dir, "throughput.png", "throughput vs message size", r);
    out.push_str(
        "*The paper's Figure 2:* its throughput values could not be found in any source \
         available to this project; its abstract says only that \"throughput does not \
         improve\" with software iWARP on the clients (quoted from the paper's abstract).\n\n",
    );
    failures(out, rep);
}

/// `bw-9000.json`: every bandwidth series at MTU 9000, the in-process
/// link's among them; its ratios are in the tools' table above.
fn jumbo(out: &mut String, run: &Run) {
    out.push_str("## Line rate: jumbo frames and the in-process link\n\n");
    let Some(rep) = &run.bw_jumbo else {
        return not_run(out, "bw-9000.json");
    };
    method(out, rep);
    out.push_str(
        "64 KiB RDMA Writes at MTU 9000 over the veth pair (`afxdp-*`, `kernel-*`), over the \
         in-process link (`link-*`: two engines in one process, no kernel: the stack's own \
         ceiling) and kernel TCP's stream with its offloads; payload Gb/s per round.\n\n",
    );
    let rows: Vec<Vec<String>> = rep
        .records
        .iter()
        .filter(|r| r.metric == "bandwidth" && r.error.is_none())
        .filter_map(|r| {
            let s = r.summary?;
            Some(vec![
                format!("`{}`", r.config),
                size_str(r.size),
                num(s.p50),
                format!("{} ± {}", num(s.mean), num(s.stddev)),
            ])
        })
        .collect();
    out.push_str(&table(&["config", "size", "Gb/s p50", "mean ± sd"], &rows));
    out.push('\n');
    failures(out, rep);
}

const LOAD_METRICS: [&str; 6] = [
    "cpu_per_gb",
    "cpu_per_gb_user",
    "cpu_per_gb_system",
    "cpu_per_gb_softirq",
    "throughput",
    "bg_slowdown",
];

fn load(out: &mut String, dir: &Path, run: &Run) {
    out.push_str("## System load (the paper's Figures 3 and 4)\n\n");
    out.push_str(&format!(
        "*Quoted from the paper's abstract* ({PAPER_REF}): with software iWARP on the \
         clients and an iWARP NIC in the server, \"sender system load is reduced from 35% to \
         5% and receiver load is reduced from 90% to under 5%\". Those are the paper's \
         figures for its hardware (a server RNIC against host TCP), not this machine's; the \
         per-configuration values of Figures 3 and 4 could not be found.\n\n"
    ));
    let Some(rep) = &run.load else {
        return not_run(out, "load.json");
    };
    method(out, rep);
    let mut cfgs_all: Vec<String> = Vec::new();
    for r in &rep.records {
        if LOAD_METRICS.contains(&r.metric.as_str()) && !cfgs_all.contains(&r.config) {
            cfgs_all.push(r.config.clone());
        }
    }
    let mut head = vec!["configuration".to_string()];
    let present: Vec<&str> = LOAD_METRICS
        .iter()
        .copied()
        .filter(|m| rep.records.iter().any(|r| r.metric == *m))
        .collect();
    for m in &present {
        let unit = rep
            .records
            .iter()
            .find(|r| r.metric == *m)
            .map(|r| r.unit.clone())
            .unwrap_or_default();
        head.push(format!("{m} ({unit})"));
    }
    let rows: Vec<Vec<String>> = cfgs_all
        .iter()
        .map(|c| {
            let mut row = vec![format!("`{c}`")];
            for m in &present {
                row.push(p50(&run.load, c, m, None).map_or("–".into(), num));
            }
            row
        })
        .collect();
    let h: Vec<&str> = head.iter().map(String::as_str).collect();
    out.push_str("Medians over the samples of each series.\n\n");
    out.push_str(&table(&h, &rows));
    out.push('\n');
    let bars: Vec<(String, f64)> = cfgs_all
        .iter()
        .filter_map(|c| p50(&run.load, c, "cpu_per_gb", None).map(|v| (c.clone(), v)))
        .collect();
    if !bars.is_empty() {
        let r = plot::bars(
            &dir.join("load.png"),
            "CPU time per GB moved (median)",
            "CPU seconds per GB",
            &bars,
        );
        chart(out, dir, "load.png", "CPU per GB", r);
    }
    let bars: Vec<(String, f64)> = cfgs_all
        .iter()
        .filter_map(|c| p50(&run.load, c, "bg_slowdown", None).map(|v| (c.clone(), v)))
        .collect();
    if !bars.is_empty() {
        let r = plot::bars(
            &dir.join("load-slowdown.png"),
            "Slowdown of a background computation (median)",
            "fraction",
            &bars,
        );
        chart(out, dir, "load-slowdown.png", "background slowdown", r);
    }
    failures(out, rep);
}

fn scale(out: &mut String, dir: &Path, run: &Run) {
    out.push_str("## Scale (queue pairs)\n\n");
    let Some(rep) = &run.scale else {
        return not_run(out, "scale.json");
    };
    method(out, rep);
    let mut qps: Vec<usize> = rep.records.iter().filter_map(|r| r.qps).collect();
    qps.sort_unstable();
    qps.dedup();
    let cfgs = {
        let mut v: Vec<String> = Vec::new();
        for r in &rep.records {
            if r.qps.is_some() && !v.contains(&r.config) {
                v.push(r.config.clone());
            }
        }
        v
    };
    let metrics: Vec<(String, String)> = {
        let mut v: Vec<(String, String)> = Vec::new();
        for r in &rep.records {
            if r.qps.is_some() && !v.iter().any(|m| m.0 == r.metric) {
                v.push((r.metric.clone(), r.unit.clone()));
            }
        }
        v
    };
    let mut head = vec!["configuration".to_string(), "QPs".to_string()];
    head.extend(metrics.iter().map(|(m, u)| format!("{m} ({u}) p50")));
    let mut rows = Vec::new();
    let mut bars = Vec::new();
    for c in &cfgs {
        for &q in &qps {
            let get = |m: &str| {
                rep.records
                    .iter()
                    .find(|r| &r.config == c && r.metric == m && r.qps == Some(q))
            };
            if metrics.iter().all(|(m, _)| get(m).is_none()) {
                continue;
            }
            let mut row = vec![format!("`{c}`"), q.to_string()];
            for (m, _) in &metrics {
                row.push(get(m).and_then(Record::p50).map_or("–".into(), num));
            }
            if let Some(v) = get("aggregate_bw").and_then(Record::p50) {
                bars.push((format!("{c} {q} QPs"), v));
            }
            rows.push(row);
        }
    }
    let h: Vec<&str> = head.iter().map(String::as_str).collect();
    out.push_str(&table(&h, &rows));
    out.push('\n');
    if !bars.is_empty() {
        let r = plot::bars(
            &dir.join("scale.png"),
            "Aggregate bandwidth over QPs (median)",
            "Gb/s",
            &bars,
        );
        chart(out, dir, "scale.png", "aggregate bandwidth by QPs", r);
    }
    failures(out, rep);
}

fn ratio_rows(ratios: &[(&str, Ratio)]) -> Vec<Vec<String>> {
    ratios
        .iter()
        .map(|(_, r)| {
            vec![
                r.name.clone(),
                r.value.map_or("–".into(), |v| format!("{v:.3}")),
                format!("{} {}", r.op, r.target),
                match r.met {
                    Some(true) => "met".into(),
                    Some(false) => "**missed**".into(),
                    None => "not measured".into(),
                },
            ]
        })
        .collect()
}

fn profiles(out: &mut String, run: &Run) {
    let miss = missed(run);
    out.push_str("## Where the time goes (profiles of missed targets)\n\n");
    if miss.is_empty() {
        out.push_str("No target was missed in this run (or none could be judged): no profile.\n\n");
        return;
    }
    out.push_str(
        "For each section with a missed target, `scripts/bench` ran a short run of the \
         binary under `perf record -e cpu-clock -g` (both sides' threads and the kernel work \
         on their cores); below, self time per symbol from `perf report --no-children`, \
         summed by component of the stack (inlined functions count for their caller).\n\n",
    );
    for sec in miss {
        let Some(p) = run.profiles.iter().find(|p| p.name == sec) else {
            let _ = writeln!(
                out,
                "### {}\n\nno profile recorded for this section.\n",
                section_title(sec)
            );
            continue;
        };
        let _ = writeln!(out, "### {}\n", section_title(sec));
        if let Some(c) = &p.command {
            let _ = writeln!(out, "Profiled: `{c}`\n");
        }
        if p.components.is_empty() {
            out.push_str("The profile has no samples.\n\n");
            continue;
        }
        let mut rows: Vec<Vec<String>> = p
            .components
            .iter()
            .map(|(c, v)| vec![c.clone(), format!("{v:.1} %")])
            .collect();
        let listed: f64 = p.components.iter().map(|c| c.1).sum();
        if listed < 99.95 {
            rows.push(vec![
                "(symbols below the listing threshold)".into(),
                format!("{:.1} %", 100.0 - listed),
            ]);
        }
        out.push_str(&table(&["component", "share of samples"], &rows));
        out.push('\n');
        if let Some((c, v)) = p.components.first() {
            let _ = writeln!(out, "Largest share: **{c}** ({v:.1} % of the samples).\n");
        }
        let kernel: f64 = p
            .components
            .iter()
            .filter(|c| c.0.starts_with("kernel"))
            .map(|c| c.1)
            .sum();
        let _ = writeln!(
            out,
            "All kernel parts together: {kernel:.1} % (cpu-clock samples taken while \
             interrupts were off land on the instruction that re-enables them, e.g. \
             `_raw_spin_unlock_irqrestore`: softirq work is partly counted there).\n"
        );
        if sec == "bw" {
            crc_note(out, run, p);
        }
        let mut top: Vec<&Entry> = p.entries.iter().collect();
        top.sort_by(|a, b| b.percent.total_cmp(&a.percent));
        let rows: Vec<Vec<String>> = top
            .iter()
            .take(15)
            .map(|e| {
                vec![
                    format!("{:.1} %", e.percent),
                    format!(
                        "`{}`",
                        profile::short_symbol(&e.symbol, 90).replace('`', "'")
                    ),
                    profile::component(&e.symbol, e.kernel).to_string(),
                ]
            })
            .collect();
        out.push_str(&table(&["self", "symbol", "component"], &rows));
        out.push('\n');
    }
}

/// What the profile says about the CRC on/off ratio, if it is missed.
fn crc_note(out: &mut String, run: &Run, p: &Profile) {
    let Some((_, r)) = targets(run)
        .into_iter()
        .find(|(_, r)| r.name.contains("/ afxdp-crc-off"))
    else {
        return;
    };
    let (Some(v), Some(false)) = (r.value, r.met) else {
        return;
    };
    let crc: f64 = p
        .components
        .iter()
        .filter(|c| c.0 == profile::COMPONENTS[2])
        .map(|c| c.1)
        .sum();
    let gap = (1.0 - v) * 100.0;
    let _ = writeln!(
        out,
        "CRC on/off: the CRC itself is {crc:.1} % of the samples of the CRC-on run, while \
         the measured on/off ratio ({v:.3}) implies {gap:.0} % less throughput with CRC \
         on; {}\n",
        if crc + 5.0 < gap {
            "computing the CRC explains only a small part of that gap, the rest is not CRC \
             arithmetic (variation between the separately measured series on this shared \
             machine is one candidate: `results.json` has every round)."
        } else {
            "the CRC computation is of the size of the gap."
        }
    );
}

fn section_title(sec: &str) -> &'static str {
    match sec {
        "lat" => "Latency: 4 B half round trip, afxdp-crc-off",
        "bw" => "Throughput: 64 KiB RDMA Writes, afxdp-crc-on",
        "scale" => "Scale: many QPs",
        _ => "Other",
    }
}

/// Write the charts into `dir` and return the markdown report.
pub fn render(run: &Run, dir: &Path) -> String {
    let mut out = String::new();
    out.push_str("# iWARP in software: benchmark report\n\n");
    let _ = writeln!(
        out,
        "The experiments of {PAPER_REF}, repeated on this machine with this project's stack, \
         side by side with kernel TCP. Every number below was measured in this run (every \
         raw sample is in `results.json` next to this report), except where a value is \
         explicitly marked as quoted from the paper.\n"
    );
    let _ = writeln!(
        out,
        "Files of this run: {}.\n",
        INPUTS
            .iter()
            .map(|(k, f)| {
                let have = match *k {
                    "lat" => run.lat.is_some(),
                    "bw" => run.bw.is_some(),
                    "bw-jumbo" => run.bw_jumbo.is_some(),
                    "load" => run.load.is_some(),
                    _ => run.scale.is_some(),
                };
                format!("`{f}` {}", if have { "read" } else { "not run" })
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    for p in &run.problems {
        let _ = writeln!(out, "- could not read {p}");
    }
    out.push_str("## Targets\n\n");
    let t = targets(run);
    out.push_str(&table(
        &["ratio", "value", "target", "verdict"],
        &ratio_rows(&t),
    ));
    out.push('\n');
    let tool_ratios: Vec<(&str, &Ratio)> =
        [&run.lat, &run.bw, &run.bw_jumbo, &run.load, &run.scale]
            .into_iter()
            .flatten()
            .flat_map(|r| r.ratios.iter().map(move |x| (r.tool.as_str(), x)))
            .collect();
    if !tool_ratios.is_empty() {
        out.push_str("Ratios the tools computed themselves:\n\n");
        let rows: Vec<Vec<String>> = tool_ratios
            .iter()
            .map(|(tool, r)| {
                vec![
                    tool.to_string(),
                    r.name.clone(),
                    r.value.map_or("–".into(), |v| format!("{v:.3}")),
                    format!("{} {}", r.op, r.target),
                    match r.met {
                        Some(true) => "met".into(),
                        Some(false) => "missed".into(),
                        None => "–".into(),
                    },
                ]
            })
            .collect();
        out.push_str(&table(
            &["tool", "ratio", "value", "target", "verdict"],
            &rows,
        ));
        out.push('\n');
    }
    latency(&mut out, dir, run);
    throughput(&mut out, dir, run);
    jumbo(&mut out, run);
    load(&mut out, dir, run);
    scale(&mut out, dir, run);
    profiles(&mut out, run);
    out.push_str("## Reference\n\n");
    let _ = writeln!(
        out,
        "{PAPER_REF}. Only its abstract could be found; the figures quoted above are from \
         that abstract."
    );
    out
}

/// Everything of the run in one JSON value (every raw sample).
pub fn combined(run: &Run) -> serde_json::Value {
    let targets: Vec<serde_json::Value> = targets(run)
        .into_iter()
        .map(|(sec, r)| serde_json::json!({ "section": sec, "ratio": r }))
        .collect();
    serde_json::json!({
        "generated_by": "iwarp-report",
        "paper": PAPER_REF,
        "targets": targets,
        "lat": run.lat,
        "bw": run.bw,
        "bw_jumbo": run.bw_jumbo,
        "load": run.load,
        "scale": run.scale,
        "profiles": run.profiles,
    })
}

/// Read `input`, write `report.md`, the charts and `results.json` into
/// `out`; returns the path of the report.
pub fn write(input: &Path, out: &Path) -> io::Result<std::path::PathBuf> {
    let run = Run::load(input);
    std::fs::create_dir_all(out)?;
    let md = render(&run, out);
    let path = out.join("report.md");
    std::fs::write(&path, md)?;
    let json = serde_json::to_string(&combined(&run)).map_err(io::Error::other)?;
    std::fs::write(out.join("results.json"), json + "\n")?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::write_json;

    fn rep(tool: &str, records: Vec<Record>) -> Report {
        Report {
            tool: tool.into(),
            command: format!("{tool} --quick"),
            mtu: 1500,
            xdp_mode: "generic".into(),
            cpus: (Some(0), Some(1)),
            notes: vec!["a note".into()],
            records,
            ratios: vec![],
        }
    }

    fn tmpdir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("iwarp-paper-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn synthetic(dir: &Path) {
        let lat = rep(
            "iwarp-lat",
            vec![
                Record::new("afxdp-crc-off", 4, "half_rtt", "us", vec![5.0, 6.0, 7.0]),
                Record::new("afxdp-crc-off", 65536, "half_rtt", "us", vec![50.0, 60.0]),
                Record::new("tcp-busypoll", 4, "half_rtt", "us", vec![7.0, 8.0, 9.0]),
                Record::new("tcp-busypoll", 65536, "half_rtt", "us", vec![40.0]),
            ],
        );
        write_json(&dir.join("lat.json"), &lat).unwrap();
        let bw = rep(
            "iwarp-bw",
            vec![
                Record::new("afxdp-crc-on", 4096, "bandwidth", "Gb/s", vec![2.0, 2.2]),
                Record::new("afxdp-crc-on", 65536, "bandwidth", "Gb/s", vec![3.0, 3.1]),
                Record::new("afxdp-crc-off", 65536, "bandwidth", "Gb/s", vec![3.1, 3.2]),
                Record::new("afxdp-crc-off", 4096, "bandwidth", "Gb/s", vec![2.5]),
                Record::new("smoltcp-raw", 0, "bandwidth", "Gb/s", vec![3.2]),
                Record::new("tcp-stream", 131072, "bandwidth", "Gb/s", vec![4.0]),
                Record::failed(
                    "kernel-crc-on",
                    4096,
                    "bandwidth",
                    "Gb/s",
                    &io::Error::other("boom"),
                ),
            ],
        );
        write_json(&dir.join("bw.json"), &bw).unwrap();
        let mut a = Record::new("afxdp-crc-on", 65536, "aggregate_bw", "Gb/s", vec![3.0]);
        a.qps = Some(1);
        let mut b = Record::new("afxdp-crc-on", 65536, "aggregate_bw", "Gb/s", vec![2.0]);
        b.qps = Some(1024);
        let mut m = Record::new("afxdp-crc-on", 65536, "mem_per_qp", "KiB", vec![300.0]);
        m.qps = Some(1024);
        write_json(&dir.join("scale.json"), &rep("iwarp-scale", vec![a, b, m])).unwrap();
        std::fs::write(
            dir.join("profile-lat.txt"),
            "# command: iwarp-lat --sizes 4\n    60.00%  [kernel.kallsyms]  [k] veth_xmit\n    40.00%  x  [.] smoltcp::iface::Interface::poll\n",
        )
        .unwrap();
    }

    #[test]
    fn targets_from_synthetic_run() {
        let d = tmpdir("targets");
        synthetic(&d);
        let run = Run::load(&d);
        assert!(run.load.is_none() && run.problems.is_empty());
        let t = targets(&run);
        assert_eq!(t[0].1.value, Some(6.0 / 8.0));
        assert_eq!(t[0].1.met, Some(false));
        assert_eq!(t[1].1.value, Some(3.0 / 3.2));
        assert_eq!(t[1].1.met, Some(true));
        assert_eq!(t[3].1.value, Some(2.0 / 3.0));
        assert_eq!(missed(&run), vec!["lat", "scale"]);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The scale ratio takes the rate side b received where the report
    /// has it.
    #[test]
    fn scale_ratio_prefers_the_received_rate() {
        let d = tmpdir("received");
        synthetic(&d);
        let mut recs = Vec::new();
        for (metric, one, many) in [("aggregate_bw", 3.0, 2.0), ("received_bw", 4.0, 3.6)] {
            for (q, v) in [(1, one), (1024, many)] {
                let mut r = Record::new("afxdp-crc-on", 65536, metric, "Gb/s", vec![v]);
                r.qps = Some(q);
                recs.push(r);
            }
        }
        write_json(&d.join("scale.json"), &rep("iwarp-scale", recs)).unwrap();
        let t = targets(&Run::load(&d));
        assert_eq!(t[3].1.value, Some(3.6 / 4.0));
        assert_eq!(t[3].1.met, Some(true));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn report_renders_with_charts() {
        let d = tmpdir("render");
        synthetic(&d);
        std::fs::write(d.join("load.json"), "{ not json").unwrap();
        let out = d.join("out");
        let path = write(&d, &out).unwrap();
        let md = std::fs::read_to_string(&path).unwrap();
        assert!(md.contains("## Latency (the paper's Table 1)"));
        assert!(md.contains("| `afxdp-crc-off` | 6.000 ± 1.000 | 6.000 | 7.000 | 3 |"));
        assert!(md.contains("**missed**"));
        assert!(md.contains("could not read"));
        assert!(md.contains("kernel-crc-on 4K bandwidth: boom"));
        assert!(md.contains("Largest share: **kernel [k]: AF_XDP / XDP / veth** (60.0 %"));
        assert!(md.contains("Profiled: `iwarp-lat --sizes 4`"));
        assert!(md.contains("| `afxdp-crc-on` | 1024 | 2.000 | 300.0 |"));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap())
                .unwrap();
        assert_eq!(v["bw"]["records"][0]["samples"][1], 2.2);
        if plot::load_font().is_ok() {
            for f in ["latency.png", "throughput.png", "scale.png"] {
                let n = std::fs::metadata(out.join(f)).map(|m| m.len()).unwrap_or(0);
                assert!(n > 1000, "{f}: {n} bytes");
                assert!(md.contains(&format!("]({f})")));
            }
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_crc_target_prefers_the_paired_qps() {
        let d = tmpdir("crc-paired");
        let mut recs = vec![
            Record::new("afxdp-crc-on", 65536, "bandwidth", "Gb/s", vec![2.0]),
            Record::new("afxdp-crc-off", 65536, "bandwidth", "Gb/s", vec![3.0]),
        ];
        write_json(&d.join("bw.json"), &rep("iwarp-bw", recs.clone())).unwrap();
        let r = crc_ratio(&Run::load(&d));
        assert!(
            r.name.contains("afxdp-crc-on / afxdp-crc-off"),
            "{}",
            r.name
        );
        assert_eq!(r.met, Some(false));
        recs.extend([
            Record::new("afxdp-crc-on-paired", 65536, "bandwidth", "Gb/s", vec![2.9]),
            Record::new(
                "afxdp-crc-off-paired",
                65536,
                "bandwidth",
                "Gb/s",
                vec![3.0],
            ),
        ]);
        write_json(&d.join("bw.json"), &rep("iwarp-bw", recs)).unwrap();
        let r = crc_ratio(&Run::load(&d));
        assert!(r.name.contains("paired"), "{}", r.name);
        assert_eq!(r.met, Some(true), "{r:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_jumbo_series_has_its_section_and_ratios() {
        let d = tmpdir("jumbo");
        let mut r = rep(
            "iwarp-bw",
            vec![Record::new(
                "link-crc-on",
                65536,
                "bandwidth",
                "Gb/s",
                vec![20.0, 24.0],
            )],
        );
        r.ratios = vec![Ratio::paired(
            "64K write bw link-crc-on / 40 Gb/s",
            vec![0.5, 0.6],
            ">=",
            1.0,
        )];
        write_json(&d.join("bw-9000.json"), &r).unwrap();
        let run = Run::load(&d);
        assert!(run.bw_jumbo.is_some() && run.bw.is_none());
        let md = render(&run, &d);
        assert!(md.contains("`bw-9000.json` read"), "{md}");
        assert!(md.contains("## Line rate: jumbo frames"), "{md}");
        assert!(md.contains("`link-crc-on`"), "{md}");
        assert!(md.contains("link-crc-on / 40 Gb/s"), "{md}");
        assert!(combined(&run)["bw_jumbo"]["records"][0]["samples"][1] == 24.0);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn missed_crc_target_is_explained_by_the_profile() {
        let d = tmpdir("crc");
        let bw = rep(
            "iwarp-bw",
            vec![
                Record::new("afxdp-crc-on", 65536, "bandwidth", "Gb/s", vec![2.0]),
                Record::new("afxdp-crc-off", 65536, "bandwidth", "Gb/s", vec![3.0]),
                Record::new("smoltcp-raw", 0, "bandwidth", "Gb/s", vec![3.0]),
            ],
        );
        write_json(&d.join("bw.json"), &bw).unwrap();
        std::fs::write(
            d.join("profile-bw.txt"),
            "    3.00%  x  [.] crc32c::hw_x86_64::crc32c\n    97.00%  [kernel.kallsyms]  [k] veth_xmit\n",
        )
        .unwrap();
        let run = Run::load(&d);
        assert_eq!(missed(&run), vec!["bw"]);
        let md = render(&run, &d);
        assert!(md.contains("CRC on/off: the CRC itself is 3.0 %"));
        assert!(md.contains("only a small part of that gap"));
        assert!(md.contains("All kernel parts together: 97.0 %"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn empty_directory_says_not_run() {
        let d = tmpdir("empty");
        let md = render(&Run::load(&d), &d);
        assert_eq!(md.matches("**not run**").count(), 5);
        assert!(md.contains("not measured"));
        assert!(missed(&Run::load(&d)).is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }
}
