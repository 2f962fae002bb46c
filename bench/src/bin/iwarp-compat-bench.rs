//! What `libiwarp_compat.so` costs: rdma-core's `ib_write_lat -s 4` and
//! `ib_write_bw -s 65536` (perftest, `-R`), both ends preloaded with the
//! library, against the project's `iwarp-perf write_lat` / `write_bw` with
//! the same sizes and iterations, on loopback with the kernel-socket
//! backend (the same engine and path under both). Both applications
//! poll in a loop that never yields the core, their CQ and the comm
//! connection a bandwidth server waits on (`iwarp-perf --spin`, as
//! perftest does), and
//! the engine's progress thread behaves the same under both
//! (`--busy-poll`, default off: with fewer than four cores, two spinning
//! applications and two spinning progress threads measure the scheduler).
//! Rounds alternate which pair runs first; each figure is the median of
//! the rounds. Prints
//! ratio = native latency / library latency and library bandwidth /
//! native bandwidth (1.0: the library costs nothing measurable).
//!
//! Needs perftest (`scripts/setup` installs it) and release builds of the
//! library and of `iwarp-perf`: `cargo build --release -p iwarp-compat`
//! and `cargo build --release -p iwarp-apps --bin iwarp-perf` (one
//! command with a `--bin` filter would leave the library unbuilt).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;

#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Tiny runs (200 iterations, one round): a smoke run.
    #[arg(long)]
    quick: bool,
    /// Rounds of each pair (default 5; --quick: 1).
    #[arg(long)]
    rounds: Option<usize>,
    /// Iterations per run (default 5000; --quick: 200).
    #[arg(short = 'n', long)]
    iters: Option<usize>,
    /// The library (default: libiwarp_compat.so beside this binary).
    #[arg(long)]
    lib: Option<PathBuf>,
    /// iwarp-perf (default: beside this binary).
    #[arg(long)]
    perf: Option<PathBuf>,
    /// Extra arguments for both perftest ends (e.g. --use_old_post_send).
    #[arg(long, allow_hyphen_values = true)]
    perftest_args: Option<String>,
    /// The engine's progress thread spins between passes (on) or sleeps
    /// until there is work (off), under both.
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"], default_value = "off")]
    busy_poll: String,
    /// First TCP port; each run takes the next.
    #[arg(long, default_value_t = 19515)]
    port: u16,
    /// Seconds a run may take before it counts as failed.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

/// One of the two comparisons.
#[derive(Clone, Copy, Debug)]
struct Test {
    /// iwarp-perf's test name; perftest's binary is `ib_<name>`.
    name: &'static str,
    size: usize,
    /// Latency (t_avg, lower is better) or bandwidth (BW average).
    latency: bool,
}

const TESTS: [Test; 2] = [
    Test {
        name: "write_lat",
        size: 4,
        latency: true,
    },
    Test {
        name: "write_bw",
        size: 65536,
        latency: false,
    },
];

/// Which side of the comparison runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Under {
    /// `iwarp-perf` at both ends.
    Native,
    /// perftest at both ends, preloaded with the library.
    Library,
}

struct Setup {
    lib: PathBuf,
    perf: PathBuf,
    perftest_args: Vec<String>,
    busy_poll: bool,
    iters: usize,
    timeout: Duration,
    port: u16,
}

impl Setup {
    fn command(&self, t: Test, under: Under, port: u16, server: bool) -> Command {
        let mut args = vec![
            "-s".to_string(),
            t.size.to_string(),
            "-n".to_string(),
            self.iters.to_string(),
            "-p".to_string(),
            port.to_string(),
        ];
        let mut cmd = match under {
            Under::Native => {
                let mut c = Command::new(&self.perf);
                c.arg(t.name)
                    .arg("--spin")
                    .arg("--busy-poll")
                    .arg(if self.busy_poll { "on" } else { "off" });
                c
            }
            Under::Library => {
                let mut c = Command::new(format!("ib_{}", t.name));
                c.env("LD_PRELOAD", &self.lib)
                    .env(
                        "IWARP_COMPAT_BUSY_POLL",
                        if self.busy_poll { "1" } else { "0" },
                    )
                    .arg("-R");
                args.extend(self.perftest_args.iter().cloned());
                c
            }
        };
        cmd.args(args);
        if !server {
            cmd.arg("127.0.0.1");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// Run one server/client pair; the client's figure.
    fn run(&mut self, t: Test, under: Under) -> Result<f64, String> {
        let port = self.port;
        self.port = self.port.wrapping_add(1).max(1024);
        let what = format!("{} {under:?}", t.name);
        let mut server = self
            .command(t, under, port, true)
            .spawn()
            .map_err(|e| format!("{what}: server: {e}"))?;
        let deadline = Instant::now() + self.timeout;
        let result = (|| {
            while !listening(port) {
                if Instant::now() > deadline || server.try_wait().ok().flatten().is_some() {
                    return Err(format!("{what}: the server never listened on {port}"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let mut client = self
                .command(t, under, port, false)
                .spawn()
                .map_err(|e| format!("{what}: client: {e}"))?;
            let out = finish(&mut client, deadline).map_err(|e| format!("{what}: client {e}"))?;
            finish(&mut server, deadline).map_err(|e| format!("{what}: server {e}"))?;
            figure(&out, t).ok_or_else(|| format!("{what}: no result row in:\n{out}"))
        })();
        // Only the processes this run started, by their handles.
        if server.try_wait().ok().flatten().is_none() {
            let _ = server.kill();
            let _ = server.wait();
        }
        result
    }
}

/// Wait for `child` until `deadline`; its stdout if it exited 0.
fn finish(child: &mut Child, deadline: Instant) -> Result<String, String> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut out = String::new();
                let mut err = String::new();
                if let Some(mut o) = child.stdout.take() {
                    let _ = o.read_to_string(&mut out);
                }
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                return if status.success() {
                    Ok(out)
                } else {
                    Err(format!("exited with {status}:\n{out}{err}"))
                };
            }
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("timed out".into());
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Whether a socket listens on TCP `port` (IPv4 or IPv6), from procfs.
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|s| {
            s.lines().skip(1).any(|l| {
                let mut cols = l.split_whitespace();
                let local = cols.nth(1).unwrap_or("");
                let state = cols.nth(1).unwrap_or("");
                local.ends_with(&want) && state == "0A"
            })
        })
    })
}

/// The figure of perftest's result row (`#bytes #iterations ...`):
/// t_avg (6th column) of a latency row, BW average (4th) of a bandwidth
/// row.
fn figure(out: &str, t: Test) -> Option<f64> {
    let col = if t.latency { 5 } else { 3 };
    out.lines().find_map(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        let bytes: usize = cols.first()?.parse().ok()?;
        let _iters: usize = cols.get(1)?.parse().ok()?;
        (bytes == t.size)
            .then(|| cols.get(col)?.parse().ok())
            .flatten()
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn beside_me(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default()
        .join(name)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut s = Setup {
        lib: cli
            .lib
            .clone()
            .unwrap_or_else(|| beside_me("libiwarp_compat.so")),
        perf: cli.perf.clone().unwrap_or_else(|| beside_me("iwarp-perf")),
        perftest_args: cli
            .perftest_args
            .as_deref()
            .unwrap_or("")
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        busy_poll: cli.busy_poll == "on",
        iters: cli.iters.unwrap_or(if cli.quick { 200 } else { 5000 }),
        timeout: Duration::from_secs(cli.timeout),
        port: cli.port,
    };
    for p in [&s.lib, &s.perf] {
        if !p.exists() {
            eprintln!(
                "iwarp-compat-bench: {} is missing (cargo build --release -p iwarp-compat -p iwarp-apps --bin iwarp-perf)",
                p.display()
            );
            return ExitCode::from(2);
        }
    }
    let rounds = cli.rounds.unwrap_or(if cli.quick { 1 } else { 5 }).max(1);
    println!(
        "iwarp-compat-bench: {rounds} round(s) of {} iterations, loopback, kernel-socket backend, busy polling {}",
        s.iters, cli.busy_poll
    );
    let mut failed = false;
    for t in TESTS {
        let (mut native, mut library) = (Vec::new(), Vec::new());
        for r in 0..rounds {
            let order = if r % 2 == 0 {
                [Under::Native, Under::Library]
            } else {
                [Under::Library, Under::Native]
            };
            for under in order {
                match s.run(t, under) {
                    Ok(v) => match under {
                        Under::Native => native.push(v),
                        Under::Library => library.push(v),
                    },
                    Err(e) => {
                        eprintln!("iwarp-compat-bench: {e}");
                        failed = true;
                    }
                }
            }
        }
        if native.is_empty() || library.is_empty() {
            continue;
        }
        let (n, l) = (median(&mut native), median(&mut library));
        let (unit, ratio) = if t.latency {
            ("t_avg usec", n / l)
        } else {
            ("BW average MB/s", l / n)
        };
        println!(
            "{:<9} -s {:<6} {unit:<16} iwarp-perf {n:>10.2}  ib_{} under the library {l:>10.2}  ratio {ratio:.3}",
            t.name, t.size, t.name
        );
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
