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
//! Then, as root with Open MPI and NetPIPE installed (`--mpi auto`, the
//! default), what an MPI user asks: NetPIPE's `NPopenmpi` at 8 B
//! (one-way latency) and 1 MiB (bandwidth), two ranks, over the library
//! (`pml cm`, `mtl ofi`, libfabric's `verbs;ofi_rxm`, each rank
//! preloaded) against Open MPI's own TCP transport (`pml ob1`, `btl
//! tcp,self`) on the same path: both ranks in a network namespace of the
//! run's own (libfabric skips loopback interfaces), on its veth address.
//! Rounds alternate which transport runs first; each ratio is the median
//! of the per-round ratios (TCP latency / library latency, library
//! bandwidth / TCP bandwidth: above 1, the library is faster), printed
//! with its spread.
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
use iwarp_bench::report::{median, ratio_table, Ratio};
use iwarp_bench::topo::{self, Topology, Veth, IF_A};
use iwarp_engine::xdp::AttachMode;

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
    /// NetPIPE over Open MPI, the library against `btl tcp`: `auto` runs
    /// it as root when `mpirun` and `NPopenmpi` are installed, `on`
    /// fails without them.
    #[arg(long, value_name = "auto|on|off", value_parser = ["auto", "on", "off"], default_value = "auto")]
    mpi: String,
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

/// Which transport carries Open MPI's messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    /// `pml cm` + `mtl ofi` over libfabric's `verbs;ofi_rxm` on the
    /// library.
    Library,
    /// `pml ob1` + `btl tcp,self`: Open MPI's own sockets.
    Tcp,
}

/// NetPIPE over Open MPI: two ranks in the namespace of side a of a
/// topology of the run's own (deleted when this is dropped).
struct Mpi {
    topo: Topology,
    lib: PathBuf,
    busy_poll: bool,
    dir: PathBuf,
    timeout: Duration,
}

impl Mpi {
    fn new(lib: &Path, busy_poll: bool, timeout: Duration) -> Result<Self, String> {
        topo::install_teardown().map_err(|e| e.to_string())?;
        let topo = Topology::up(Veth {
            mtu: 1500,
            attach: AttachMode::Generic,
            socket_busy_poll: false,
        })
        .map_err(|e| e.to_string())?;
        let dir = std::env::temp_dir().join(format!("iwarp-compat-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Self {
            topo,
            lib: lib.to_path_buf(),
            busy_poll,
            dir,
            timeout,
        })
    }

    /// NetPIPE's figures at `size` bytes: (Mb/s, one-way µs).
    fn run(&self, tr: Transport, size: usize) -> Result<(f64, f64), String> {
        let what = format!("NPopenmpi {size} B {tr:?}");
        let out = self.dir.join(format!("np-{tr:?}-{size}.out"));
        let _ = std::fs::remove_file(&out);
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.topo.ns_a, "mpirun"]).args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "2",
        ]);
        match tr {
            Transport::Library => {
                c.args(["--mca", "pml", "cm", "--mca", "mtl", "ofi"])
                    .args(["--mca", "mtl_ofi_provider_include", "verbs;ofi_rxm"])
                    .args(["--mca", "btl", "self", "-x"])
                    .arg(format!("LD_PRELOAD={}", self.lib.display()))
                    .arg("-x")
                    .arg(format!("FI_VERBS_IFACE={IF_A}"))
                    .arg("-x")
                    .arg(format!(
                        "IWARP_COMPAT_BUSY_POLL={}",
                        u8::from(self.busy_poll)
                    ));
            }
            Transport::Tcp => {
                c.args(["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"])
                    .args(["--mca", "btl_tcp_if_include", IF_A]);
            }
        }
        let n = size.to_string();
        c.args(["NPopenmpi", "-l", &n, "-u", &n, "-p", "0", "-o"])
            .arg(&out)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().map_err(|e| format!("{what}: mpirun: {e}"))?;
        finish(&mut child, Instant::now() + self.timeout).map_err(|e| format!("{what}: {e}"))?;
        let text = std::fs::read_to_string(&out).map_err(|e| format!("{what}: {e}"))?;
        netpipe_row(&text, size).ok_or_else(|| format!("{what}: no {size} B row in:\n{text}"))
    }
}

impl Drop for Mpi {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// NetPIPE's output row (`bytes Mb/s seconds`) for `size`: (Mb/s, µs).
fn netpipe_row(text: &str, size: usize) -> Option<(f64, f64)> {
    text.lines().find_map(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        (cols.first()?.parse::<usize>().ok()? == size).then_some(())?;
        Some((
            cols.get(1)?.parse().ok()?,
            cols.get(2)?.parse::<f64>().ok()? * 1e6,
        ))
    })
}

/// The NetPIPE comparison, `rounds` rounds; false if a run failed.
fn mpi_comparison(m: &Mpi, rounds: usize) -> bool {
    let mut ok = true;
    let mut ratios = Vec::new();
    for (size, latency) in [(8, true), (1 << 20, false)] {
        let mut per_round = Vec::new();
        let (mut lib, mut tcp) = (Vec::new(), Vec::new());
        for r in 0..rounds {
            let order = alternate(r, [Transport::Library, Transport::Tcp]);
            let mut got = [None, None];
            for tr in order {
                match m.run(tr, size) {
                    Ok((mbps, us)) => got[tr as usize] = Some(if latency { us } else { mbps }),
                    Err(e) => {
                        eprintln!("iwarp-compat-bench: {e}");
                        ok = false;
                    }
                }
            }
            if let [Some(l), Some(t)] = got {
                lib.push(l);
                tcp.push(t);
                per_round.push(if latency { t / l } else { l / t });
            }
        }
        let (unit, name) = if latency {
            ("one-way us", "NPopenmpi 8 B latency: btl tcp / the library")
        } else {
            ("Mb/s", "NPopenmpi 1 MiB bandwidth: the library / btl tcp")
        };
        if let (Some(l), Some(t)) = (median(&lib), median(&tcp)) {
            println!(
                "NPopenmpi {size:>7} B {unit:<10} btl tcp {t:>10.2}  the library (verbs;ofi_rxm) {l:>10.2}"
            );
        }
        ratios.push((Ratio::paired(name, per_round, ">=", 1.0), false));
    }
    print!("{}", ratio_table(&ratios));
    ok
}

/// The two sides of a comparison in round `r`'s order: as given in even
/// rounds, swapped in odd ones.
fn alternate<T>(r: usize, mut pair: [T; 2]) -> [T; 2] {
    if r % 2 == 1 {
        pair.swap(0, 1);
    }
    pair
}

fn have(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
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
            let order = alternate(r, [Under::Native, Under::Library]);
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
        let (Some(n), Some(l)) = (median(&native), median(&library)) else {
            continue;
        };
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
    let tools = have("mpirun") && have("NPopenmpi");
    match (cli.mpi.as_str(), topo::is_root() && tools) {
        ("off", _) => {}
        ("auto", false) => println!(
            "iwarp-compat-bench: NetPIPE over Open MPI skipped (it needs root for its namespace, mpirun and NPopenmpi)"
        ),
        ("on", false) => {
            eprintln!("iwarp-compat-bench: --mpi on needs root, mpirun and NPopenmpi");
            failed = true;
        }
        _ => {
            println!(
                "iwarp-compat-bench: NPopenmpi, two ranks, Open MPI over the library (verbs;ofi_rxm) and over btl tcp, {rounds} round(s)"
            );
            match Mpi::new(&s.lib, s.busy_poll, s.timeout) {
                Ok(m) => failed |= !mpi_comparison(&m, rounds),
                Err(e) => {
                    eprintln!("iwarp-compat-bench: {e}");
                    failed = true;
                }
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
