//! Result statistics of iwarp-perf, computed the way perftest's report
//! code does (bw peak over post/completion time pairs; latency from the
//! gaps between consecutive posts).

use std::time::Instant;

use iwarp_apps::proto::perftest::{BwReport, BwUnit, LatStats};

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
