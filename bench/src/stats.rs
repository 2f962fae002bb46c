//! Summary statistics of a set of samples.

use serde::{Deserialize, Serialize};

/// Mean, sample standard deviation, nearest-rank percentiles and extremes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Sample standard deviation (n - 1 in the denominator; 0 for one sample).
    pub stddev: f64,
    /// Smallest sample.
    pub min: f64,
    /// Median (nearest rank).
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

/// The `p`-th percentile (0 < p <= 100) of sorted samples, nearest-rank
/// method: the smallest sample with at least p % of the samples at or
/// below it.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    let i = rank.clamp(1, sorted.len()) - 1;
    sorted.get(i).copied()
}

/// Summarise `samples` (NaNs are ignored); `None` without samples.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    let mut s: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let mean = s.iter().sum::<f64>() / n as f64;
    let var = if n > 1 {
        s.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64
    } else {
        0.0
    };
    Some(Summary {
        n,
        mean,
        stddev: var.sqrt(),
        min: s[0],
        p50: percentile(&s, 50.0)?,
        p99: percentile(&s, 99.0)?,
        max: s[n - 1],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_has_no_summary() {
        assert_eq!(summarize(&[]), None);
        assert_eq!(summarize(&[f64::NAN]), None);
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn one_sample() {
        let s = summarize(&[3.5]).unwrap();
        assert_eq!((s.n, s.mean, s.stddev), (1, 3.5, 0.0));
        assert_eq!((s.min, s.p50, s.p99, s.max), (3.5, 3.5, 3.5, 3.5));
    }

    #[test]
    fn known_values() {
        // 2, 4, 4, 4, 5, 5, 7, 9: mean 5, sample variance 32 / 7.
        let s = summarize(&[9.0, 4.0, 2.0, 4.0, 5.0, 4.0, 5.0, 7.0]).unwrap();
        assert_eq!(s.n, 8);
        assert!((s.mean - 5.0).abs() < 1e-12);
        assert!((s.stddev - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert_eq!((s.min, s.max), (2.0, 9.0));
        assert_eq!(s.p50, 4.0);
        assert_eq!(s.p99, 9.0);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        let s = summarize(&v).unwrap();
        assert_eq!((s.p50, s.p99), (50.0, 99.0));
    }

    #[test]
    fn order_and_nan_do_not_matter() {
        let a = summarize(&[3.0, 1.0, 2.0]).unwrap();
        let b = summarize(&[2.0, f64::NAN, 1.0, 3.0]).unwrap();
        assert_eq!(a, b);
    }
}
