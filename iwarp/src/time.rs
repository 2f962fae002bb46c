//! Time as the protocol core sees it: a monotonic instant passed in by the
//! caller. The core never reads a clock.

use core::ops::{Add, Sub};
pub use core::time::Duration;

/// A point in time, in microseconds since an arbitrary epoch chosen by the
/// caller (usually the start of the process).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant {
    micros: u64,
}

impl Instant {
    /// The epoch.
    pub const ZERO: Self = Self { micros: 0 };

    /// An instant `micros` microseconds after the epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Self { micros }
    }

    /// An instant `millis` milliseconds after the epoch.
    pub const fn from_millis(millis: u64) -> Self {
        Self {
            micros: millis * 1000,
        }
    }

    /// Microseconds since the epoch.
    pub const fn total_micros(self) -> u64 {
        self.micros
    }

    /// Time elapsed since `earlier`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Self) -> Duration {
        Duration::from_micros(self.micros.saturating_sub(earlier.micros))
    }
}

impl Add<Duration> for Instant {
    type Output = Self;
    fn add(self, rhs: Duration) -> Self {
        let add = u64::try_from(rhs.as_micros()).unwrap_or(u64::MAX);
        Self {
            micros: self.micros.saturating_add(add),
        }
    }
}

impl Sub<Duration> for Instant {
    type Output = Self;
    fn sub(self, rhs: Duration) -> Self {
        let sub = u64::try_from(rhs.as_micros()).unwrap_or(u64::MAX);
        Self {
            micros: self.micros.saturating_sub(sub),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_millis(5);
        assert_eq!((t + Duration::from_millis(2)).total_micros(), 7000);
        assert_eq!(t - Duration::from_secs(1), Instant::ZERO);
        assert_eq!(
            t.saturating_duration_since(Instant::from_millis(9)),
            Duration::ZERO
        );
        assert_eq!(
            Instant::from_micros(u64::MAX) + Duration::from_secs(1),
            Instant::from_micros(u64::MAX)
        );
    }
}
