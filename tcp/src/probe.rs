//! Zero-window probes, a bounded number unanswered at a time.
//!
//! A connection whose peer's window is closed, with bytes waiting and
//! nothing in flight, sends nothing but zero-window probes, and each probe
//! is a frame of the peer's receive ring beyond the windows it offers.
//! Thousands of connections probe together: bytes written into an empty
//! transmit buffer facing a closed window make smoltcp probe at once (it
//! starts that timer from its clock's zero), so connections writing at
//! one instant probe at that instant; and connections whose windows
//! closed in one pass keep probing in the same pass, a timeout apart.
//! The gate lets [`PROBE_LIMIT`] probes be unanswered at once: a write or
//! a timer that would make a connection probe asks for a turn first. A
//! turn returns when the connection hears from the peer, when the
//! connection goes, or [`PROBE_ANSWER_WAIT`] after it was taken; the
//! connections without one wait in order, not visited. The probes so
//! leave at the pace at which the peer answers them.
//!
//! The gate keeps the queues and the count; the stack keeps each
//! connection's [`Probe`] and checks the entries it gets back against it
//! (an entry outlives a probe that ended early or a connection that left).

use smoltcp::time::{Duration, Instant};
use std::collections::VecDeque;

/// The most zero-window probes unanswered at once: a quarter of what an
/// AF_XDP engine with default settings keeps beyond the windows it offers
/// (1024 of its 4096 frames).
pub const PROBE_LIMIT: usize = 256;

/// How long a turn waits for its probe's answer before it returns.
pub const PROBE_ANSWER_WAIT: Duration = Duration::from_millis(20);

/// Where a connection stands with the gate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Probe {
    /// No probe held back or unanswered.
    #[default]
    None,
    /// Its probe waits for a turn (the bytes are queued, the connection
    /// is not visited for them).
    Waiting,
    /// Its probe holds a turn, until the instant given at the latest.
    Out(Instant),
}

/// The turns of zero-window probes.
#[derive(Debug)]
pub(crate) struct ProbeGate<K> {
    /// Turns held.
    out: usize,
    /// Turns taken, by the instant they return at the latest (oldest
    /// first, as every turn waits the same time).
    taken: VecDeque<(Instant, K)>,
    /// Probes waiting for a turn, in the order they asked.
    waiting: VecDeque<K>,
}

impl<K> Default for ProbeGate<K> {
    fn default() -> Self {
        Self {
            out: 0,
            taken: VecDeque::new(),
            waiting: VecDeque::new(),
        }
    }
}

impl<K: Copy> ProbeGate<K> {
    /// A probe of `k` asks to leave at `now`: it takes a turn, or waits.
    pub fn ask(&mut self, k: K, now: Instant) -> Probe {
        if self.out < PROBE_LIMIT {
            self.take(k, now)
        } else {
            self.waiting.push_back(k);
            Probe::Waiting
        }
    }

    /// A turn for `k`, taken at `now`.
    pub fn take(&mut self, k: K, now: Instant) -> Probe {
        self.out += 1;
        let until = now + PROBE_ANSWER_WAIT;
        self.taken.push_back((until, k));
        Probe::Out(until)
    }

    /// The probe that stood at `p` is over: answered, or its connection
    /// gone. A turn it held returns.
    pub fn end(&mut self, p: Probe) {
        if let Probe::Out(_) = p {
            self.out -= 1;
        }
    }

    /// The oldest turn due back by `now`, taken out of the list: the
    /// caller ends the probe if the connection still stands at `Out` with
    /// that instant.
    pub fn expired(&mut self, now: Instant) -> Option<(Instant, K)> {
        let &(until, _) = self.taken.front()?;
        if until > now {
            return None;
        }
        self.taken.pop_front()
    }

    /// The probe that waited longest, while a turn is free: the caller
    /// gives it a turn ([`ProbeGate::take`]) if the connection still
    /// stands at `Waiting`.
    pub fn next_waiting(&mut self) -> Option<K> {
        if self.out < PROBE_LIMIT {
            self.waiting.pop_front()
        } else {
            None
        }
    }

    /// When the gate has work at the latest: at once when a probe waits
    /// and a turn is free, else when the oldest turn is due back while
    /// probes wait.
    pub fn due(&self) -> Option<Instant> {
        if self.waiting.is_empty() {
            None
        } else if self.out < PROBE_LIMIT {
            Some(Instant::ZERO)
        } else {
            self.taken.front().map(|&(until, _)| until)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_are_bounded_and_return_in_order() {
        let mut gate = ProbeGate::default();
        let t0 = Instant::from_millis(5);
        let mut probes: Vec<Probe> = (0..PROBE_LIMIT + 2).map(|k| gate.ask(k, t0)).collect();
        assert!(probes[..PROBE_LIMIT]
            .iter()
            .all(|p| *p == Probe::Out(t0 + PROBE_ANSWER_WAIT)));
        assert_eq!(probes[PROBE_LIMIT..], [Probe::Waiting, Probe::Waiting]);
        assert_eq!(gate.next_waiting(), None);
        assert_eq!(gate.due(), Some(t0 + PROBE_ANSWER_WAIT));
        // An answer returns one turn: the first waiting probe takes it.
        gate.end(std::mem::take(&mut probes[3]));
        assert_eq!(gate.due(), Some(Instant::ZERO));
        assert_eq!(gate.next_waiting(), Some(PROBE_LIMIT));
        let t1 = t0 + Duration::from_millis(1);
        probes[PROBE_LIMIT] = gate.take(PROBE_LIMIT, t1);
        assert_eq!(gate.next_waiting(), None);
        // Unanswered turns come back oldest first once due.
        assert_eq!(gate.expired(t0), None);
        let due = t0 + PROBE_ANSWER_WAIT;
        let mut back = Vec::new();
        while let Some((until, k)) = gate.expired(due) {
            back.push(k);
            if probes[k] == Probe::Out(until) {
                gate.end(std::mem::take(&mut probes[k]));
            }
        }
        assert_eq!(back, (0..PROBE_LIMIT).collect::<Vec<_>>());
        // Probe 3 ended before: its entry came back without a second end.
        assert_eq!(gate.next_waiting(), Some(PROBE_LIMIT + 1));
        assert_eq!(gate.next_waiting(), None, "nothing else waits");
        assert_eq!(gate.due(), None);
        assert_eq!(
            gate.expired(t1 + PROBE_ANSWER_WAIT),
            Some((t1 + PROBE_ANSWER_WAIT, PROBE_LIMIT))
        );
    }
}
