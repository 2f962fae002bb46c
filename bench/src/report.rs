//! Results: every raw sample as JSON (serde_json) and a text table.

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::stats::{summarize, Summary};
use crate::topo::Veth;

/// One measured series.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    /// Configuration name (`afxdp-crc-on`, `tcp-busypoll`, ...).
    pub config: String,
    /// Message size in bytes (for streams: the write size).
    pub size: usize,
    /// What the samples are (`half_rtt`, `bandwidth`).
    pub metric: String,
    /// Unit of the samples (`us`, `Gb/s`).
    pub unit: String,
    /// Messages per sample (bandwidth rounds), 1 for latency.
    pub messages: usize,
    /// Summary of `samples`.
    pub summary: Option<Summary>,
    /// Every sample, in the order measured.
    pub samples: Vec<f64>,
    /// The error, if this configuration failed.
    pub error: Option<String>,
    /// Queue pairs used (scale runs), if it is a parameter of the series.
    #[serde(default)]
    pub qps: Option<usize>,
}

impl Record {
    /// A record of `samples`.
    pub fn new(config: &str, size: usize, metric: &str, unit: &str, samples: Vec<f64>) -> Self {
        Self {
            config: config.into(),
            size,
            metric: metric.into(),
            unit: unit.into(),
            messages: 1,
            summary: summarize(&samples),
            samples,
            error: None,
            qps: None,
        }
    }

    /// A record of a failed configuration.
    pub fn failed(config: &str, size: usize, metric: &str, unit: &str, e: &io::Error) -> Self {
        let mut r = Self::new(config, size, metric, unit, Vec::new());
        r.error = Some(e.to_string());
        r
    }

    /// The median, if there are samples.
    pub fn p50(&self) -> Option<f64> {
        self.summary.map(|s| s.p50)
    }
}

/// Add `new` to `all`: samples of a series already there (same config,
/// size, metric and QP count) are appended to it (a failure marks it
/// failed).
pub fn merge(all: &mut Vec<Record>, new: Vec<Record>) {
    for r in new {
        match all.iter_mut().find(|x| {
            x.config == r.config && x.size == r.size && x.metric == r.metric && x.qps == r.qps
        }) {
            Some(x) => {
                x.samples.extend_from_slice(&r.samples);
                x.summary = summarize(&x.samples);
                if x.error.is_none() {
                    x.error = r.error;
                }
            }
            None => all.push(r),
        }
    }
}

/// The whole output of one run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// The bench binary that wrote the report (`iwarp-lat`, ...).
    pub tool: String,
    /// The command line of the run, arguments joined by spaces.
    pub command: String,
    /// IP MTU of the veth pair, in bytes.
    pub mtu: usize,
    /// How the engines' XDP programs attached (`generic`, `native`); a
    /// report without the field is read as native.
    #[serde(default = "native")]
    pub xdp_mode: String,
    /// The CPUs side a and side b are pinned to (`None`: not pinned).
    pub cpus: (Option<usize>, Option<usize>),
    /// How the engines are driven and what the baselines do.
    pub notes: Vec<String>,
    /// Every measured series, in the order measured.
    pub records: Vec<Record>,
    /// Derived figures (ratios), if any.
    pub ratios: Vec<Ratio>,
}

impl Report {
    /// `records` of `tool`, with the command line and the notes every
    /// bench binary shares; no ratios.
    pub fn new(
        tool: &str,
        veth: Veth,
        cpus: (Option<usize>, Option<usize>),
        records: Vec<Record>,
    ) -> Self {
        Self {
            tool: tool.into(),
            command: command_line(),
            mtu: veth.mtu,
            xdp_mode: veth.mode(),
            cpus,
            notes: crate::notes(),
            records,
            ratios: Vec::new(),
        }
    }
}

fn native() -> String {
    "native".into()
}

/// A ratio of two configurations against a target: within one run, the
/// median of the ratios of the pairs measured in the same pass (the
/// pairing cancels the machine's drift between passes), with their
/// spread in `per_pass`; a ratio read from one series each is
/// [`Ratio::new`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ratio {
    /// What is compared, e.g. `4 B half RTT afxdp-crc-off / tcp-busypoll
    /// (medians)`.
    pub name: String,
    /// The ratio (`None` if a side is missing or the denominator is not
    /// positive).
    pub value: Option<f64>,
    /// How `value` is held against `target`: `<=` or `>=`.
    pub op: String,
    /// The bound the ratio should meet.
    pub target: f64,
    /// Whether `value op target` holds (`None` without a value).
    pub met: Option<bool>,
    /// The ratio within each pass of a run that interleaves its
    /// configurations (empty for a ratio of two series): `value` is
    /// their median, and how far they spread is how far the ratio moves
    /// with the machine's load.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_pass: Vec<f64>,
}

impl Ratio {
    /// `num / den` against `op target`.
    pub fn new(name: &str, num: Option<f64>, den: Option<f64>, op: &str, target: f64) -> Self {
        let value = match (num, den) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        let met = value.map(|v| if op == "<=" { v <= target } else { v >= target });
        Self {
            name: name.into(),
            value,
            op: op.into(),
            target,
            met,
            per_pass: Vec::new(),
        }
    }
}

impl Ratio {
    /// The median of `per_pass` (each `num / den` of one pass) against
    /// `op target`.
    pub fn paired(name: &str, per_pass: Vec<f64>, op: &str, target: f64) -> Self {
        let value = median(&per_pass);
        let mut r = Self::new(name, value, value.map(|_| 1.0), op, target);
        r.per_pass = per_pass;
        r
    }

    /// The smallest and largest per-pass ratio.
    pub fn spread(&self) -> Option<(f64, f64)> {
        let lo = self.per_pass.iter().copied().reduce(f64::min)?;
        let hi = self.per_pass.iter().copied().reduce(f64::max)?;
        Some((lo, hi))
    }
}

/// The median of `v` (the mean of the middle two for an even count).
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    Some(if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    })
}

/// The median of one series of a pass: `config`'s `metric` at `size`
/// (`None`: any size, for the stream ceilings, whose size is their write
/// size).
pub fn pass_p50(recs: &[Record], config: &str, metric: &str, size: Option<usize>) -> Option<f64> {
    recs.iter()
        .filter(|r| r.error.is_none())
        .find(|r| r.config == config && r.metric == metric && size.is_none_or(|s| r.size == s))
        .and_then(Record::p50)
}

/// Each pass's `num / den` where both were measured.
pub fn per_pass(
    passes: &[Vec<Record>],
    num: impl Fn(&[Record]) -> Option<f64>,
    den: impl Fn(&[Record]) -> Option<f64>,
) -> Vec<f64> {
    passes
        .iter()
        .filter_map(|p| match (num(p), den(p)) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        })
        .collect()
}

/// The rows of a ratio table: name, median of the per-pass ratios, their
/// spread, the target (`judged`) or `(info)`, met or missed, and every
/// pass's value.
pub fn ratio_table(ratios: &[(Ratio, bool)]) -> String {
    let mut rows = vec![vec![
        "ratio (median of per-pass pairs)".to_string(),
        "value".into(),
        "spread".into(),
        "target".into(),
        "".into(),
        "per pass".into(),
    ]];
    for (r, judged) in ratios {
        rows.push(vec![
            r.name.clone(),
            r.value.map_or("-".into(), |v| format!("{v:.3}")),
            r.spread()
                .map_or("-".into(), |(lo, hi)| format!("{lo:.2}-{hi:.2}")),
            if *judged {
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
            r.per_pass
                .iter()
                .map(|v| format!("{v:.2}"))
                .collect::<Vec<_>>()
                .join(" "),
        ]);
    }
    render(&rows)
}

/// The command line as one string.
pub fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// Write `r` as pretty JSON to `path`.
pub fn write_json(path: &Path, r: &Report) -> io::Result<()> {
    let s = serde_json::to_string_pretty(r).map_err(io::Error::other)?;
    std::fs::write(path, s + "\n")
}

/// The end of every bench binary: write `r` to `json` if one was asked
/// for, then the exit status: failure if a series failed or the file
/// could not be written.
pub fn finish(json: Option<&Path>, r: &Report) -> std::process::ExitCode {
    if let Some(path) = json {
        if let Err(e) = write_json(path, r) {
            eprintln!("{}: {}: {e}", r.tool, path.display());
            return std::process::ExitCode::FAILURE;
        }
    }
    if r.records.iter().any(|x| x.error.is_some()) {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}

/// Human size: 4, 64K, 1M; 0 (a byte stream without messages): "-".
pub fn size_str(n: usize) -> String {
    if n == 0 {
        "-".into()
    } else if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}M", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}K", n >> 10)
    } else {
        n.to_string()
    }
}

fn num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.1}")
    } else if v >= 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A table of the records: one row each.
pub fn table(records: &[Record]) -> String {
    let head = [
        "config", "size", "unit", "n", "mean", "stddev", "p50", "p99", "min", "max",
    ];
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    for r in records {
        let mut row = vec![r.config.clone(), size_str(r.size), r.unit.clone()];
        match (&r.summary, &r.error) {
            (_, Some(e)) => row.push(format!("FAILED: {e}")),
            (Some(s), None) => {
                row.push(s.n.to_string());
                for v in [s.mean, s.stddev, s.p50, s.p99, s.min, s.max] {
                    row.push(num(v));
                }
            }
            (None, None) => row.push("no samples".into()),
        }
        rows.push(row);
    }
    render(&rows)
}

/// Left-aligned first column, right-aligned others; the last cell of a
/// short row is printed as is.
pub fn render(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut w = vec![0; cols];
    for r in rows {
        if r.len() == cols {
            for (i, c) in r.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            let pad = w[i].saturating_sub(c.chars().count());
            if i > 0 {
                line.push_str("  ");
            }
            if i == 0 {
                line.push_str(c);
                line.push_str(&" ".repeat(pad));
            } else if r.len() < cols && i == r.len() - 1 {
                line.push_str(c);
            } else {
                line.push_str(&" ".repeat(pad));
                line.push_str(c);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_paired_ratio_is_the_median_of_its_passes() {
        let r = Ratio::paired("x", vec![1.4, 0.9, 1.1], ">=", 1.0);
        assert_eq!(r.value, Some(1.1));
        assert_eq!(r.spread(), Some((0.9, 1.4)));
        assert_eq!(r.met, Some(true));
        let r = Ratio::paired("x", vec![0.5, 0.7], ">=", 1.0);
        assert_eq!(r.value, Some(0.6));
        assert_eq!(r.met, Some(false));
        let r = Ratio::paired("x", Vec::new(), "<=", 1.0);
        assert_eq!((r.value, r.met, r.spread()), (None, None, None));
        let pass = |a: f64, b: f64| {
            vec![
                Record::new("n", 4, "m", "u", vec![a]),
                Record::new("d", 8, "m", "u", vec![b]),
            ]
        };
        let passes = [pass(2.0, 1.0), pass(3.0, 2.0), vec![]];
        let v = per_pass(
            &passes,
            |r| pass_p50(r, "n", "m", Some(4)),
            |r| pass_p50(r, "d", "m", None),
        );
        assert_eq!(v, vec![2.0, 1.5]);
        assert_eq!(pass_p50(&passes[0], "d", "m", Some(4)), None);
    }

    #[test]
    fn merge_appends_samples_of_a_series() {
        let mut all = vec![Record::new("a", 4, "half_rtt", "us", vec![1.0])];
        merge(
            &mut all,
            vec![
                Record::new("a", 4, "half_rtt", "us", vec![3.0]),
                Record::new("a", 8, "half_rtt", "us", vec![5.0]),
            ],
        );
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].samples, vec![1.0, 3.0]);
        assert_eq!(all[0].summary.unwrap().mean, 2.0);
        merge(
            &mut all,
            vec![Record::failed(
                "a",
                8,
                "half_rtt",
                "us",
                &io::Error::other("x"),
            )],
        );
        assert!(all[1].error.is_some());
        // The same series at another QP count is another record.
        let at = |qps, v| Record {
            qps: Some(qps),
            ..Record::new("a", 4, "aggregate_bw", "Gb/s", vec![v])
        };
        merge(&mut all, vec![at(1, 4.0), at(16, 2.0), at(1, 6.0)]);
        assert_eq!(all.len(), 4);
        assert_eq!(all[2].samples, vec![4.0, 6.0]);
        assert_eq!(all[3].samples, vec![2.0]);
    }

    #[test]
    fn sizes_print_short() {
        assert_eq!(size_str(4), "4");
        assert_eq!(size_str(65536), "64K");
        assert_eq!(size_str(1 << 20), "1M");
        assert_eq!(size_str(1000), "1000");
        assert_eq!(size_str(0), "-");
    }

    #[test]
    fn ratios_judge_targets() {
        let r = Ratio::new("x", Some(3.0), Some(6.0), "<=", 0.6);
        assert_eq!((r.value, r.met), (Some(0.5), Some(true)));
        let r = Ratio::new("x", Some(8.0), Some(10.0), ">=", 0.9);
        assert_eq!(r.met, Some(false));
        let r = Ratio::new("x", None, Some(1.0), ">=", 0.9);
        assert_eq!((r.value, r.met), (None, None));
    }

    #[test]
    fn table_has_every_record_and_serializes() {
        let recs = vec![
            Record::new("a", 4, "half_rtt", "us", vec![1.0, 2.0, 3.0]),
            Record::failed("b", 64, "half_rtt", "us", &io::Error::other("boom")),
        ];
        let t = table(&recs);
        assert_eq!(t.lines().count(), 3);
        assert!(t.contains("FAILED: boom"));
        let rep = Report {
            tool: "t".into(),
            command: "t -n 1".into(),
            mtu: 1500,
            xdp_mode: "generic".into(),
            cpus: (Some(0), Some(1)),
            notes: vec![],
            records: recs,
            ratios: vec![],
        };
        let v: serde_json::Value = serde_json::to_value(&rep).unwrap();
        assert_eq!(v["records"][0]["samples"].as_array().unwrap().len(), 3);
        assert_eq!(v["records"][0]["summary"]["p50"], 2.0);
        assert_eq!(v["xdp_mode"], "generic");
        // A report written before the mode was recorded ran native.
        let mut old = v.clone();
        old.as_object_mut().unwrap().remove("xdp_mode");
        let back: Report = serde_json::from_value(old).unwrap();
        assert_eq!((back.xdp_mode.as_str(), back.mtu), ("native", 1500));
    }

    #[test]
    fn new_records_the_veth() {
        use iwarp_engine::xdp::AttachMode;
        let mut veth = Veth {
            mtu: 3506,
            attach: AttachMode::Native,
            socket_busy_poll: false,
        };
        let rep = Report::new("t", veth, (None, None), vec![]);
        assert_eq!((rep.mtu, rep.xdp_mode.as_str()), (3506, "native"));
        assert_eq!(veth.to_string(), "MTU 3506, XDP native mode");
        veth.socket_busy_poll = true;
        assert_eq!(
            veth.to_string(),
            "MTU 3506, XDP native mode, AF_XDP sockets busy-polled"
        );
    }
}
