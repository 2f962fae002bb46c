//! Result statistics of iwarp-perf, computed the way perftest's report
//! code does (bw peak over post/completion time pairs; latency from the
//! gaps between consecutive posts).

use std::time::{Duration, Instant};

use iwarp_apps::proto::perftest::{BwReport, BwUnit, LatDurStats, LatStats};

/// Largest number of start indices the peak search visits (it is
/// quadratic; beyond this the start index is sampled).
const PEAK_STARTS: usize = 20_000;

/// Bandwidth report of `tposted.len()` operations of `size` bytes:
/// `tposted[i]` when operation `i` was posted, `tcompleted[j]` when the
/// `j`th completion arrived. The peak is perftest's: the smallest average
/// time per operation over every window from post `i` to completion `j`
/// (`j` on a `cq_mod` boundary, or the last one).
pub fn bw_report(
    size: u64,
    tposted: &[Instant],
    tcompleted: &[Instant],
    cq_mod: usize,
    unit: BwUnit,
) -> BwReport {
    let total = tposted.len().min(tcompleted.len());
    let mut r = BwReport {
        size,
        iters: total as u64,
        ..BwReport::default()
    };
    if total == 0 {
        return r;
    }
    let cq_mod = cq_mod.max(1);
    let span = |i: usize, j: usize| {
        tcompleted[j]
            .saturating_duration_since(tposted[i])
            .as_secs_f64()
    };
    let mut opt = f64::MAX;
    let step = total.div_ceil(PEAK_STARTS).max(1);
    for i in (0..total).step_by(step) {
        let mut j = (i + 1).div_ceil(cq_mod) * cq_mod - 1;
        while j < total {
            opt = opt.min(span(i, j) / (j - i + 1) as f64);
            j += cq_mod;
        }
        opt = opt.min(span(i, total - 1) / (total - i) as f64);
    }
    let elapsed = span(0, total - 1);
    let bytes = size as f64 * total as f64;
    if opt > 0.0 && opt < f64::MAX {
        r.bw_peak = unit.from_bytes_per_sec(size as f64 / opt);
    }
    if elapsed > 0.0 {
        r.bw_avg = unit.from_bytes_per_sec(bytes / elapsed);
        r.msg_rate = total as f64 / elapsed / 1e6;
    }
    r
}

/// Receiver-side bandwidth (send_bw server): `count` messages of `size`
/// bytes between the first and the last receive; no peak (0, as perftest).
pub fn rx_bw_report(
    size: u64,
    count: u64,
    first: Instant,
    last: Instant,
    unit: BwUnit,
) -> BwReport {
    let elapsed = last.saturating_duration_since(first).as_secs_f64();
    let mut r = BwReport {
        size,
        iters: count,
        ..BwReport::default()
    };
    if elapsed > 0.0 {
        r.bw_avg = unit.from_bytes_per_sec(size as f64 * count as f64 / elapsed);
        r.msg_rate = count as f64 / elapsed / 1e6;
    }
    r
}

/// Latency statistics from the post times of `iters` operations: the gaps
/// between consecutive posts (one round trip each), divided by
/// `rtt_factor` (2 for write/send latency, which report half a round
/// trip; 1 for read latency), in microseconds.
pub fn lat_stats(size: u64, iters: u64, stamps: &[Instant], rtt_factor: f64) -> LatStats {
    let mut d: Vec<f64> = stamps
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]).as_secs_f64() * 1e6 / rtt_factor)
        .collect();
    let mut s = LatStats {
        size,
        iters,
        ..LatStats::default()
    };
    let m = d.len();
    if m == 0 {
        return s;
    }
    d.sort_by(f64::total_cmp);
    s.min = d[0];
    s.max = d[m - 1];
    s.typical = if m.is_multiple_of(2) {
        (d[m / 2 - 1] + d[m / 2]) / 2.0
    } else {
        d[m / 2]
    };
    s.avg = d.iter().sum::<f64>() / m as f64;
    s.stdev = (d.iter().map(|x| (x - s.avg).powi(2)).sum::<f64>() / m as f64).sqrt();
    let pct = |p: f64| d[((m as f64 * p).ceil() as usize).min(m) - 1];
    s.p99 = pct(0.99);
    s.p999 = pct(0.999);
    s
}

/// perftest's `-D` clock: once started, `margin` of warm-up, then the
/// sample (`duration - 2 * margin`), then `margin` more during which the
/// test still runs, then the end. Only operations that complete during
/// the sample are counted.
#[derive(Clone, Copy, Debug)]
pub struct DurationClock {
    start: Option<Instant>,
    margin: Duration,
    duration: Duration,
}

impl DurationClock {
    /// A clock of `duration` seconds with `margin` seconds at both ends
    /// (`duration > 2 * margin`), not yet started.
    pub fn new(duration: u64, margin: u64) -> Self {
        Self {
            start: None,
            margin: Duration::from_secs(margin),
            duration: Duration::from_secs(duration),
        }
    }

    /// Start the clock at `now` (once; later calls change nothing).
    pub fn start(&mut self, now: Instant) {
        self.start.get_or_insert(now);
    }

    /// Whether `now` is in the sample.
    pub fn sampling(&self, now: Instant) -> bool {
        self.start.is_some_and(|t| {
            let e = now.saturating_duration_since(t);
            e >= self.margin && e < self.duration.saturating_sub(self.margin)
        })
    }

    /// Whether the run is over at `now` (never before the clock starts).
    pub fn ended(&self, now: Instant) -> bool {
        self.start
            .is_some_and(|t| now.saturating_duration_since(t) >= self.duration)
    }

    /// When the run ends (`None` before the start).
    pub fn end(&self) -> Option<Instant> {
        self.start.map(|t| t + self.duration)
    }

    /// Length of the sample in seconds.
    pub fn sample_secs(&self) -> f64 {
        self.duration.saturating_sub(2 * self.margin).as_secs_f64()
    }
}

/// Bandwidth report of a `-D` run: `count` operations of `size` bytes
/// completed during a sample of `secs` seconds; no peak (0, as perftest).
pub fn duration_bw_report(size: u64, count: u64, secs: f64, unit: BwUnit) -> BwReport {
    let mut r = BwReport {
        size,
        iters: count,
        ..BwReport::default()
    };
    if secs > 0.0 {
        r.bw_avg = unit.from_bytes_per_sec(size as f64 * count as f64 / secs);
        r.msg_rate = count as f64 / secs / 1e6;
    }
    r
}

/// Latency report of a `-D` run: `count` round trips (or one-way
/// operations, see `rtt_factor` in [`lat_stats`]) completed during a
/// sample of `secs` seconds.
pub fn duration_lat(size: u64, count: u64, secs: f64, rtt_factor: f64) -> LatDurStats {
    let mut s = LatDurStats {
        size,
        iters: count,
        ..LatDurStats::default()
    };
    if count > 0 && secs > 0.0 {
        s.t_avg = secs * 1e6 / rtt_factor / count as f64;
        s.tps = count as f64 / secs;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn latency_from_post_gaps() {
        let t0 = Instant::now();
        let us = |v: u64| t0 + Duration::from_micros(v);
        // Gaps 10, 30, 20 µs; halved.
        let s = lat_stats(64, 4, &[us(0), us(10), us(40), us(60)], 2.0);
        assert_eq!((s.size, s.iters), (64, 4));
        assert!((s.min - 5.0).abs() < 1e-9);
        assert!((s.max - 15.0).abs() < 1e-9);
        assert!((s.typical - 10.0).abs() < 1e-9);
        assert!((s.avg - 10.0).abs() < 1e-9);
        assert!((s.p99 - 15.0).abs() < 1e-9);
        assert_eq!(lat_stats(2, 1, &[t0], 1.0).max, 0.0);
    }

    #[test]
    fn duration_clock_phases() {
        let t0 = Instant::now();
        let s = |v: u64| t0 + Duration::from_millis(v);
        let mut c = DurationClock::new(4, 1);
        assert!(c.end().is_none() && !c.ended(s(10_000)) && !c.sampling(s(1500)));
        c.start(t0);
        c.start(s(500));
        assert!(!c.sampling(s(999)) && c.sampling(s(1000)) && c.sampling(s(2999)));
        assert!(!c.sampling(s(3000)) && !c.ended(s(3999)) && c.ended(s(4000)));
        assert_eq!(c.end(), Some(s(4000)));
        assert_eq!(c.sample_secs(), 2.0);
        let mut z = DurationClock::new(1, 0);
        z.start(t0);
        assert!(z.sampling(t0) && z.ended(s(1000)));
        let r = duration_bw_report(1 << 20, 10, 2.0, BwUnit::MBps);
        assert_eq!(
            (r.iters, r.bw_peak, r.bw_avg, r.msg_rate),
            (10, 0.0, 5.0, 5e-6)
        );
        let l = duration_lat(2, 1000, 2.0, 2.0);
        assert_eq!((l.iters, l.t_avg, l.tps), (1000, 1000.0, 500.0));
        assert_eq!(duration_lat(2, 0, 2.0, 1.0).t_avg, 0.0);
    }

    #[test]
    fn bandwidth_average_and_peak() {
        let t0 = Instant::now();
        let ms = |v: u64| t0 + Duration::from_millis(v);
        // Four 1 MiB ops posted at 0, completed at 1, 2, 3, 4 ms.
        let posted = [ms(0); 4];
        let done = [ms(1), ms(2), ms(3), ms(4)];
        let r = bw_report(1 << 20, &posted, &done, 1, BwUnit::MBps);
        assert_eq!(r.iters, 4);
        assert!((r.bw_avg - 1000.0).abs() < 1e-6);
        assert!((r.bw_peak - 1000.0).abs() < 1e-6);
        assert!((r.msg_rate - 0.001).abs() < 1e-9);
        let z = bw_report(8, &[], &[], 100, BwUnit::Gbps);
        assert_eq!((z.iters, z.bw_avg), (0, 0.0));
    }
}
