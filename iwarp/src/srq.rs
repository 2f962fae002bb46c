//! Shared receive queues (verbs SRQ semantics).
//!
//! An [`Srq`] is one queue of posted receives that any number of QPs of
//! the same context and protection domain take from. A QP created on an
//! SRQ ([`crate::verbs::Context::create_qp_with_srq`]) has no receive
//! queue of its own: every message that consumes a posted receive
//! (untagged queue 0: Send, Send with Solicited Event, Send with
//! Invalidate and their combination, Immediate Data) takes the oldest
//! entry of the SRQ at its first segment (message offset 0) and holds it
//! until its last segment completes it, on the QP's receive CQ with the
//! QP's id. A message that finds the SRQ empty is what a message that
//! finds an empty receive queue is: DDP untagged error "invalid MSN - no
//! buffer available", a Terminate, and the QP moves to Error.
//!
//! **Limit.** An SRQ armed with a limit `n > 0` raises one
//! [`SrqEvent::LimitReached`] when taking a receive leaves fewer than `n`
//! posted (the check is made when a receive is taken, as
//! `IBV_EVENT_SRQ_LIMIT_REACHED`); the limit then disarms and stays off
//! until [`crate::verbs::Context::modify_srq`] arms it again. A limit of 0
//! is disarmed.
//!
//! **Errors and destruction** follow verbs: a QP attached to an SRQ that
//! moves to Error flushes only the receive it holds (the one its message
//! in progress took), on its own CQ; the receives still in the SRQ stay
//! there for the other QPs. An SRQ cannot be destroyed while QPs are
//! attached ([`crate::verbs::VerbsError::Busy`]); destroying it discards
//! the receives no QP took, without completions (an SRQ has no CQ).

use std::collections::VecDeque;

use crate::mem::PdId;
use crate::qp::{PostError, RecvWr};

/// Identifies a shared receive queue within a [`crate::verbs::Context`]:
/// a slot and the generation of its occupant, so a handle of a destroyed
/// SRQ never names the one that reuses its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqId {
    slot: u32,
    generation: u32,
}

/// Asynchronous events of a shared receive queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SrqEvent {
    /// Fewer receives than the armed limit are posted; the limit is
    /// disarmed (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    LimitReached,
}

/// A shared receive queue. See the module documentation.
#[derive(Debug)]
pub struct Srq {
    pd: PdId,
    capacity: usize,
    /// The armed limit; 0: disarmed.
    limit: u32,
    entries: VecDeque<crate::qp::RqEntry>,
    /// QPs created on this SRQ and not destroyed.
    attached: usize,
    events: VecDeque<SrqEvent>,
}

impl Srq {
    fn new(pd: PdId, capacity: usize, limit: u32) -> Self {
        Self {
            pd,
            capacity,
            limit,
            entries: VecDeque::with_capacity(capacity),
            attached: 0,
            events: VecDeque::new(),
        }
    }

    /// The protection domain.
    pub fn pd(&self) -> PdId {
        self.pd
    }

    /// The most receives it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The armed limit (0: disarmed).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Receives posted and not taken by a QP.
    pub fn occupancy(&self) -> usize {
        self.entries.len()
    }

    /// QPs attached.
    pub fn attached(&self) -> usize {
        self.attached
    }

    pub(crate) fn post(&mut self, wr: &RecvWr<'_>) -> Result<(), PostError> {
        let entry = crate::qp::RqEntry::new(wr)?;
        if self.entries.len() >= self.capacity {
            return Err(PostError::QueueFull);
        }
        self.entries.push_back(entry);
        Ok(())
    }

    /// Take the oldest receive for a QP's message; fires the limit event
    /// when fewer than the armed limit remain.
    pub(crate) fn take(&mut self) -> Option<crate::qp::RqEntry> {
        let e = self.entries.pop_front()?;
        if self.limit > 0 && self.entries.len() < self.limit as usize {
            self.limit = 0;
            self.events.push_back(SrqEvent::LimitReached);
        }
        Some(e)
    }
}

/// Whether `capacity` and `limit` are valid for an SRQ, as
/// `ibv_create_srq`/`ibv_modify_srq` check them: a capacity of at least
/// one, a limit no larger than it.
fn check_limit(capacity: usize, limit: u32) -> bool {
    capacity > 0 && limit as usize <= capacity
}

/// Shared receive queues of a context: slots reused with a new
/// generation, so the table stays as large as the most SRQs alive at once.
#[derive(Debug, Default)]
pub struct SrqTable(Vec<(u32, Option<Srq>)>);

impl SrqTable {
    /// The queue named by `id`.
    pub fn get(&self, id: SrqId) -> Option<&Srq> {
        match self.0.get(id.slot as usize)? {
            (g, Some(s)) if *g == id.generation => Some(s),
            _ => None,
        }
    }

    /// The queue named by `id`, mutable.
    pub(crate) fn get_mut(&mut self, id: SrqId) -> Option<&mut Srq> {
        match self.0.get_mut(id.slot as usize)? {
            (g, Some(s)) if *g == id.generation => Some(s),
            _ => None,
        }
    }

    /// A new queue; `None` when `capacity` is 0 or `limit` exceeds it.
    pub(crate) fn create(&mut self, pd: PdId, capacity: usize, limit: u32) -> Option<SrqId> {
        if !check_limit(capacity, limit) {
            return None;
        }
        let srq = Some(Srq::new(pd, capacity, limit));
        if let Some(slot) = self.0.iter().position(|(_, s)| s.is_none()) {
            let e = &mut self.0[slot];
            e.0 = e.0.wrapping_add(1);
            e.1 = srq;
            return Some(SrqId {
                slot: slot as u32,
                generation: e.0,
            });
        }
        self.0.push((0, srq));
        Some(SrqId {
            slot: self.0.len() as u32 - 1,
            generation: 0,
        })
    }

    /// Arm (`limit > 0`) or disarm (0) the limit; false when it exceeds
    /// the capacity.
    pub(crate) fn set_limit(&mut self, id: SrqId, limit: u32) -> Option<bool> {
        let s = self.get_mut(id)?;
        if !check_limit(s.capacity, limit) {
            return Some(false);
        }
        s.limit = limit;
        Some(true)
    }

    pub(crate) fn attach(&mut self, id: SrqId) {
        if let Some(s) = self.get_mut(id) {
            s.attached += 1;
        }
    }

    pub(crate) fn detach(&mut self, id: SrqId) {
        if let Some(s) = self.get_mut(id) {
            s.attached = s.attached.saturating_sub(1);
        }
    }

    /// Remove a queue with no QP attached; returns the receives it
    /// discarded. `Err(true)`: QPs are attached; `Err(false)`: no such
    /// queue.
    pub(crate) fn destroy(&mut self, id: SrqId) -> Result<usize, bool> {
        match self.get(id) {
            None => return Err(false),
            Some(s) if s.attached > 0 => return Err(true),
            Some(_) => {}
        }
        let s = self.0[id.slot as usize].1.take();
        Ok(s.map_or(0, |s| s.entries.len()))
    }

    /// The next event of `id`.
    pub(crate) fn poll_event(&mut self, id: SrqId) -> Option<SrqEvent> {
        self.get_mut(id)?.events.pop_front()
    }
}
