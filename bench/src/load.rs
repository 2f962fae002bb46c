//! System load of a transfer, two ways (after Dalessandro, Devulapalli
//! and Wyckoff, "Design and Implementation of the iWarp Protocol in
//! Software", 2005, figures 3 and 4):
//!
//! * **Background task** ([`Background`]): on each side's core a thread
//!   at nice 19 and `SCHED_IDLE` counts loop iterations; it only runs
//!   when nothing else on that core wants to. Its rate during the
//!   transfer against its rate with the cores idle gives the share of
//!   the core the transfer took ([`slowdown`]). A side that spins shows
//!   about 100 % whatever it does.
//! * **Per-core accounting** ([`CpuTimes`], from `/proc/stat`): user,
//!   system, irq and softirq time of each side's core over the transfer,
//!   per GB moved. The background task runs at nice 19, so its time lands
//!   in the `nice` column, which is left out.
//!
//! Both read whole cores: anything else that runs on them (the machine is
//! shared) counts too.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::rdma::{self, Moved};
use crate::report::Record;
use crate::sock;
use crate::topo::Topology;
use crate::Config;

/// Clock ticks of `/proc/stat` per second (`USER_HZ`, 100 on Linux for
/// every architecture this runs on).
pub const USER_HZ: f64 = 100.0;

/// One core's line of `/proc/stat`, in clock ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// Ticks in user mode at nice 0 or below.
    pub user: u64,
    /// User mode at positive nice (the background task).
    pub nice: u64,
    /// Kernel mode (system calls and the like).
    pub system: u64,
    /// Ticks idle.
    pub idle: u64,
    /// Ticks idle with I/O outstanding.
    pub iowait: u64,
    /// Ticks servicing hard interrupts.
    pub irq: u64,
    /// Soft interrupts (network receive and transmit processing).
    pub softirq: u64,
    /// Ticks another guest ran while this virtual CPU waited
    /// (hypervisor steal time).
    pub steal: u64,
}

impl CpuTimes {
    /// `self - earlier`, field by field (0 where a counter went back).
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            user: self.user.saturating_sub(earlier.user),
            nice: self.nice.saturating_sub(earlier.nice),
            system: self.system.saturating_sub(earlier.system),
            idle: self.idle.saturating_sub(earlier.idle),
            iowait: self.iowait.saturating_sub(earlier.iowait),
            irq: self.irq.saturating_sub(earlier.irq),
            softirq: self.softirq.saturating_sub(earlier.softirq),
            steal: self.steal.saturating_sub(earlier.steal),
        }
    }

    /// The ticks the measured work can have used: user + system + irq +
    /// softirq (not nice: the background task).
    pub fn busy(&self) -> u64 {
        self.user + self.system + self.irq + self.softirq
    }

    /// Every tick counted, whatever it was spent on.
    pub fn total(&self) -> u64 {
        self.busy() + self.nice + self.idle + self.iowait + self.steal
    }

    /// The share of the ticks spent in soft interrupts (the kernel's
    /// network processing), from 0 to 1; `None` without a tick.
    pub fn softirq_share(&self) -> Option<f64> {
        let total = self.total();
        (total > 0).then(|| self.softirq as f64 / total as f64)
    }
}

/// The per-core lines (`cpuN ...`) of a `/proc/stat` text: (N, times).
/// Lines that do not parse are skipped; missing trailing columns (old
/// kernels) read as 0.
pub fn parse_proc_stat(text: &str) -> Vec<(usize, CpuTimes)> {
    text.lines()
        .filter_map(|line| {
            let mut it = line.split_ascii_whitespace();
            let n: usize = it.next()?.strip_prefix("cpu")?.parse().ok()?;
            let v: Vec<u64> = it.map_while(|x| x.parse().ok()).take(8).collect();
            if v.len() < 4 {
                return None;
            }
            let g = |i: usize| v.get(i).copied().unwrap_or(0);
            Some((
                n,
                CpuTimes {
                    user: g(0),
                    nice: g(1),
                    system: g(2),
                    idle: g(3),
                    iowait: g(4),
                    irq: g(5),
                    softirq: g(6),
                    steal: g(7),
                },
            ))
        })
        .collect()
}

/// The times of `cpus` now (a CPU not found reads as zeros).
pub fn read_cpus(cpus: [usize; 2]) -> io::Result<[CpuTimes; 2]> {
    let all = parse_proc_stat(&std::fs::read_to_string("/proc/stat")?);
    let get = |c: usize| {
        all.iter()
            .find(|(n, _)| *n == c)
            .map(|(_, t)| *t)
            .unwrap_or_default()
    };
    Ok([get(cpus[0]), get(cpus[1])])
}

/// The slow-down of the background task: `1 - loaded / idle` (0: the
/// transfer took nothing from it, 1: it never ran). Not clamped: a
/// negative value means the idle rate was measured on a busier core.
/// `None` without an idle rate.
pub fn slowdown(idle_rate: f64, loaded_rate: f64) -> Option<f64> {
    (idle_rate > 0.0 && idle_rate.is_finite() && loaded_rate.is_finite())
        .then(|| 1.0 - loaded_rate / idle_rate)
}

/// CPU-seconds per GB (10^9 bytes) from `ticks` over `bytes`.
pub fn cpu_per_gb(ticks: u64, bytes: u64) -> Option<f64> {
    (bytes > 0).then(|| ticks as f64 / USER_HZ / (bytes as f64 / 1e9))
}

/// Background counting threads, one per side's core, at nice 19 and
/// `SCHED_IDLE`; stopped on drop.
#[derive(Debug)]
pub struct Background {
    counts: [Arc<AtomicU64>; 2],
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// Iterations of the background loop between two counter updates.
const CHUNK: u64 = 4096;

fn lower_priority(tid: i32) -> io::Result<()> {
    let run = |cmd: &str, args: &[&str]| -> io::Result<()> {
        let out = std::process::Command::new(cmd).args(args).output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "{cmd}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    };
    let t = tid.to_string();
    run("chrt", &["--idle", "-p", "0", &t])?;
    run("renice", &["-n", "19", "-p", &t])
}

impl Background {
    /// Start the counters on `cpus` (a failure to lower a thread's
    /// priority is an error: the method means nothing without it).
    pub fn start(cpus: [usize; 2]) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
        let mut threads = Vec::new();
        let (tx, rx) = std::sync::mpsc::channel();
        for (i, &cpu) in cpus.iter().enumerate() {
            let (stop, count, tx) = (stop.clone(), counts[i].clone(), tx.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("bg-{cpu}"))
                    .spawn(move || {
                        crate::topo::pin(cpu);
                        let _ = tx.send(nix::unistd::gettid().as_raw());
                        let mut x = 1u64;
                        while !stop.load(Ordering::Relaxed) {
                            for _ in 0..CHUNK {
                                x = std::hint::black_box(
                                    x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1),
                                );
                            }
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                    })?,
            );
        }
        let bg = Self {
            counts,
            stop,
            threads,
        };
        for _ in 0..2 {
            let tid = rx
                .recv_timeout(Duration::from_secs(5))
                .map_err(|_| io::Error::other("background thread did not start"))?;
            lower_priority(tid)?;
        }
        Ok(bg)
    }

    /// The counters now.
    pub fn counts(&self) -> [u64; 2] {
        [
            self.counts[0].load(Ordering::Relaxed),
            self.counts[1].load(Ordering::Relaxed),
        ]
    }

    /// A probe for the threads of a run.
    pub fn probe(&self, cpus: [usize; 2]) -> Probe {
        Probe {
            cpus,
            counts: self.counts.clone(),
        }
    }

    /// The counting rate (chunks per second) of each core over `d`.
    pub fn rates(&self, d: Duration) -> [f64; 2] {
        let (c0, t0) = (self.counts(), Instant::now());
        std::thread::sleep(d);
        let (c1, dt) = (self.counts(), t0.elapsed().as_secs_f64());
        [0, 1].map(|i| c1[i].saturating_sub(c0[i]) as f64 / dt)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Takes [`Snap`]s (from any thread).
#[derive(Clone, Debug)]
pub struct Probe {
    cpus: [usize; 2],
    counts: [Arc<AtomicU64>; 2],
}

/// The clock, both cores' times and both background counters at one
/// moment.
#[derive(Clone, Copy, Debug)]
pub struct Snap {
    /// The monotonic clock when the snapshot was taken.
    pub at: Instant,
    /// `/proc/stat` of side a's and side b's core.
    pub cpu: [CpuTimes; 2],
    /// Background counters of side a's and side b's core.
    pub bg: [u64; 2],
}

impl Probe {
    /// A snapshot now (zeros if `/proc/stat` cannot be read).
    pub fn snap(&self) -> Snap {
        Snap {
            at: Instant::now(),
            cpu: read_cpus(self.cpus).unwrap_or_default(),
            bg: [0, 1].map(|i| self.counts[i].load(Ordering::Relaxed)),
        }
    }
}

/// What one side cost over a transfer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SideLoad {
    /// Core time used, by column.
    pub times: CpuTimes,
    /// Background slow-down (None without an idle rate).
    pub slowdown: Option<f64>,
}

/// The load of both sides between `a` and `b`, given the background
/// task's idle rates.
pub fn loads(a: &Snap, b: &Snap, idle: [f64; 2]) -> [SideLoad; 2] {
    let dt = b.at.saturating_duration_since(a.at).as_secs_f64();
    [0, 1].map(|i| {
        let rate = if dt > 0.0 {
            b.bg[i].saturating_sub(a.bg[i]) as f64 / dt
        } else {
            f64::NAN
        };
        SideLoad {
            times: b.cpu[i].since(&a.cpu[i]),
            slowdown: slowdown(idle[i], rate),
        }
    })
}

/// How the engines of a measured run are driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Drive {
    /// Manual progress: each side's application thread spins on
    /// `Device::progress` (as in `iwarp-lat` and `iwarp-bw`).
    Spin,
    /// The engine's own progress thread on the side's core, sleeping in
    /// epoll when idle; the application thread blocks in `Cq::wait`.
    Sleep,
}

/// How long a measured run lasts.
#[derive(Clone, Copy, Debug)]
pub struct LoadParams {
    /// Seconds of traffic.
    pub secs: f64,
    /// Seconds of measuring the background task's idle rate before it.
    pub idle_secs: f64,
    /// Outstanding RDMA Writes.
    pub depth: usize,
}

/// The series name of `config` driven by `drive` (`-sleep` appended for
/// engines with their own threads; the TCP baseline has one name).
pub fn series(config: Config, drive: Drive) -> String {
    match (config.engine(), drive) {
        (Some(_), Drive::Sleep) => format!("{}-sleep", config.name()),
        _ => config.name(),
    }
}

/// The records of one measured run: per side (`NAME/sender`,
/// `NAME/receiver`) CPU-seconds per GB (total and split) and the
/// background slow-down, plus the run's throughput (`NAME`).
pub fn records(name: &str, size: usize, moved: &Moved<Snap>, idle: [f64; 2]) -> Vec<Record> {
    let l = loads(&moved.start, &moved.end, idle);
    let dt = moved
        .end
        .at
        .saturating_duration_since(moved.start.at)
        .as_secs_f64();
    let mut out = Vec::new();
    let gbps = if dt > 0.0 {
        moved.bytes as f64 * 8.0 / dt / 1e9
    } else {
        f64::NAN
    };
    out.push(Record::new(name, size, "throughput", "Gb/s", vec![gbps]));
    for (side, sl) in ["sender", "receiver"].iter().zip(l) {
        let cfg = format!("{name}/{side}");
        let per = |t: u64| cpu_per_gb(t, moved.bytes).unwrap_or(f64::NAN);
        let t = sl.times;
        for (metric, ticks) in [
            ("cpu_per_gb", t.busy()),
            ("cpu_per_gb_user", t.user),
            ("cpu_per_gb_system", t.system),
            ("cpu_per_gb_softirq", t.softirq),
        ] {
            out.push(Record::new(
                &cfg,
                size,
                metric,
                "cpu_s/GB",
                vec![per(ticks)],
            ));
        }
        out.push(Record::new(
            &cfg,
            size,
            "bg_slowdown",
            "fraction",
            vec![sl.slowdown.unwrap_or(f64::NAN)],
        ));
    }
    out
}

/// One measured run of `config` at `size` bytes per message: the idle
/// rate of the background task (the better of `p.idle_secs` before and
/// after), and `p.secs` of traffic with both methods running.
pub fn measure(
    topo: &Topology,
    cpus: [usize; 2],
    bg: &Background,
    config: Config,
    drive: Drive,
    size: usize,
    p: LoadParams,
) -> Vec<Record> {
    let name = series(config, drive);
    let idle_for = Duration::from_secs_f64(p.idle_secs);
    let before = bg.rates(idle_for);
    let probe = bg.probe(cpus);
    let cp = (Some(cpus[0]), Some(cpus[1]));
    let port = crate::next_port();
    let r = match config.engine() {
        Some(e) => {
            let sleep = drive == Drive::Sleep;
            let (depth, secs) = (p.depth, p.secs);
            rdma::run_pair_with(
                topo,
                cp,
                e,
                sleep,
                port,
                size,
                size,
                depth + 8,
                move |s| rdma::stream_a(s, size, depth, secs, sleep, || probe.snap()),
                move |s| rdma::stream_b(s, secs, sleep),
            )
        }
        None if config == Config::TcpStream => {
            sock::timed_stream(topo, cp, port, size, p.secs, move || probe.snap())
        }
        None => Err(io::Error::other(format!(
            "{} has no load test",
            config.name()
        ))),
    };
    // The idle rate: the better of the windows just before and just
    // after the traffic (on a shared machine a neighbour may have taken
    // the core during one of them).
    let after = bg.rates(idle_for);
    let idle = [0, 1].map(|i| before[i].max(after[i]));
    match r {
        Ok(m) => records(&name, size, &m, idle),
        Err(e) => {
            let mut v = vec![Record::failed(&name, size, "throughput", "Gb/s", &e)];
            for side in ["sender", "receiver"] {
                v.push(Record::failed(
                    &format!("{name}/{side}"),
                    size,
                    "cpu_per_gb",
                    "cpu_s/GB",
                    &e,
                ));
            }
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  2255 34 2290 22625563 6290 127 456 0 0 0
cpu0 1132 34 1441 11311718 3675 127 438 7 0 0
cpu1 1123 0 849 11313845 2614 0 18
cpu2 x 1 2 3
intr 114930548 113199788 3 0 5 263 0 4 [... lots more numbers ...]
ctxt 1990473
btime 1062191376
";

    #[test]
    fn proc_stat_parses_core_lines() {
        let v = parse_proc_stat(STAT);
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(v[0].0, 0);
        let c0 = v[0].1;
        assert_eq!(
            (c0.user, c0.nice, c0.system, c0.idle),
            (1132, 34, 1441, 11311718)
        );
        assert_eq!(
            (c0.iowait, c0.irq, c0.softirq, c0.steal),
            (3675, 127, 438, 7)
        );
        // Seven columns: steal reads as 0.
        assert_eq!(v[1].0, 1);
        assert_eq!((v[1].1.softirq, v[1].1.steal), (18, 0));
        assert!(parse_proc_stat("cpu0 1 2\n").is_empty());
        assert!(parse_proc_stat("").is_empty());
    }

    #[test]
    fn busy_leaves_out_nice_and_idle() {
        let a = CpuTimes {
            user: 10,
            nice: 100,
            system: 20,
            idle: 1000,
            iowait: 5,
            irq: 1,
            softirq: 4,
            steal: 2,
        };
        let mut b = a;
        b.user += 30;
        b.nice += 70;
        b.system += 50;
        b.softirq += 20;
        b.irq += 1;
        let d = b.since(&a);
        assert_eq!(d.busy(), 101);
        assert_eq!(d.nice, 70);
        assert_eq!(d.total(), 171);
        assert_eq!(d.softirq_share(), Some(20.0 / 171.0));
        assert_eq!(CpuTimes::default().softirq_share(), None);
        // A counter going back (CPU hot-unplug) reads as 0, no overflow.
        assert_eq!(a.since(&b).user, 0);
    }

    #[test]
    fn slowdown_arithmetic() {
        assert_eq!(slowdown(100.0, 100.0), Some(0.0));
        assert_eq!(slowdown(100.0, 0.0), Some(1.0));
        assert_eq!(slowdown(200.0, 50.0), Some(0.75));
        assert_eq!(
            slowdown(100.0, 110.0).map(|x| (x * 100.0).round()),
            Some(-10.0)
        );
        assert_eq!(slowdown(0.0, 10.0), None);
        assert_eq!(slowdown(f64::NAN, 10.0), None);
        assert_eq!(slowdown(10.0, f64::NAN), None);
    }

    #[test]
    fn cpu_per_gb_arithmetic() {
        // 150 ticks = 1.5 s over 3 GB.
        assert_eq!(cpu_per_gb(150, 3_000_000_000), Some(0.5));
        assert_eq!(cpu_per_gb(10, 0), None);
    }

    #[test]
    fn loads_of_two_snaps() {
        let t0 = Instant::now();
        let mut c = CpuTimes::default();
        let a = Snap {
            at: t0,
            cpu: [c; 2],
            bg: [0, 0],
        };
        c.user = 50;
        let b = Snap {
            at: t0 + Duration::from_secs(2),
            cpu: [c, CpuTimes::default()],
            bg: [100, 400],
        };
        let l = loads(&a, &b, [200.0, 200.0]);
        assert_eq!(l[0].times.user, 50);
        assert_eq!(l[0].slowdown, Some(0.75));
        assert_eq!(l[1].slowdown, Some(0.0));
        assert_eq!(loads(&a, &b, [0.0, 1.0])[0].slowdown, None);
        let m = Moved {
            bytes: 2_000_000_000,
            start: a,
            end: b,
        };
        let r = records("x", 4096, &m, [200.0, 200.0]);
        assert_eq!(r.len(), 11);
        assert_eq!((r[0].metric.as_str(), r[0].samples[0]), ("throughput", 8.0));
        let find = |c: &str, m: &str| {
            r.iter()
                .find(|x| x.config == c && x.metric == m)
                .map(|x| x.samples[0])
        };
        // 0.5 s of user time over 2 GB.
        assert_eq!(find("x/sender", "cpu_per_gb"), Some(0.25));
        assert_eq!(find("x/sender", "cpu_per_gb_user"), Some(0.25));
        assert_eq!(find("x/receiver", "bg_slowdown"), Some(0.0));
        assert!(r.iter().all(|x| x.size == 4096));
    }

    #[test]
    fn series_names() {
        assert_eq!(series(Config::AfxdpCrcOn, Drive::Spin), "afxdp-crc-on");
        assert_eq!(
            series(Config::AfxdpCrcOn, Drive::Sleep),
            "afxdp-crc-on-sleep"
        );
        assert_eq!(series(Config::TcpStream, Drive::Sleep), "tcp-stream");
    }
}
