//! [`ConnSlots`]: the connections a transport holds, in slots that stay
//! put, found in constant time by their transport handle (a kernel
//! socket's poll token, a user-space TCP connection) and, once the core
//! drives them, by their QP; the list of slots the next pass visits; and
//! a heap of deadlines (a QP's core timer, a handshake's or a closing
//! socket's deadline) that puts a slot on that list when it is due. A
//! pass visits the slots on the list only, so its cost follows the
//! connections with something to do, not the connections held.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hash;

use iwarp::cq::QpId;
use iwarp::time::Instant;

/// A connection as [`ConnSlots`] keeps it.
pub(crate) trait Slotted {
    /// The transport's handle of the connection.
    type Key: Copy + Eq + Hash;
    fn key(&self) -> Self::Key;
    /// The QP the core drives over the connection, if any.
    fn qp(&self) -> Option<QpId>;
    /// The flag that says the slot is on the visit list.
    fn hot(&mut self) -> &mut bool;
    /// The deadline of the slot's entry in the timer heap.
    fn timer(&mut self) -> &mut Option<Instant>;
}

/// `impl Slotted` for a connection of the lifecycle outside the core (no
/// QP), kept by `$field` of type `$key`, with `hot` and `timer` fields.
macro_rules! slotted_without_qp {
    ($t:ty, $key:ty, $field:ident) => {
        impl $crate::slots::Slotted for $t {
            type Key = $key;
            fn key(&self) -> $key {
                self.$field
            }
            fn qp(&self) -> Option<iwarp::cq::QpId> {
                None
            }
            fn hot(&mut self) -> &mut bool {
                &mut self.hot
            }
            fn timer(&mut self) -> &mut Option<iwarp::time::Instant> {
                &mut self.timer
            }
        }
    };
}
pub(crate) use slotted_without_qp;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct ConnSlots<C: Slotted> {
    slots: Vec<Option<C>>,
    free: Vec<usize>,
    by_key: HashMap<C::Key, usize>,
    by_qp: HashMap<QpId, usize>,
    /// Slots the next pass visits.
    hot: Vec<usize>,
    /// Per slot, how many times it was filled: the heap's entries of an
    /// earlier occupant are stale.
    gens: Vec<u32>,
    /// (deadline, slot, generation): entries whose slot moved its
    /// deadline or changed hands are skipped when met.
    timers: BinaryHeap<Reverse<(Instant, usize, u32)>>,
}

impl<C: Slotted> Default for ConnSlots<C> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            by_key: HashMap::new(),
            by_qp: HashMap::new(),
            hot: Vec::new(),
            gens: Vec::new(),
            timers: BinaryHeap::new(),
        }
    }
}

impl<C: Slotted> ConnSlots<C> {
    /// Add `c`, on the visit list; returns its slot.
    pub(crate) fn insert(&mut self, c: C) -> usize {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(None);
                self.gens.push(0);
                self.slots.len() - 1
            }
        };
        self.gens[i] = self.gens[i].wrapping_add(1);
        self.by_key.insert(c.key(), i);
        if let Some(qp) = c.qp() {
            self.by_qp.insert(qp, i);
        }
        self.slots[i] = Some(c);
        self.mark(i);
        i
    }

    /// Take the connection in slot `i` out.
    pub(crate) fn remove(&mut self, i: usize) -> Option<C> {
        let c = self.slots.get_mut(i)?.take()?;
        self.by_key.remove(&c.key());
        if let Some(qp) = c.qp() {
            self.by_qp.remove(&qp);
        }
        self.free.push(i);
        // A crowd that left gives its memory back.
        if self.by_key.is_empty() && self.slots.len() > 64 {
            *self = Self::default();
        }
        Some(c)
    }

    /// Take out every connection `keep` says no to.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&mut C) -> bool) {
        let mut i = 0;
        while i < self.slots.len() {
            if let Some(c) = self.slots[i].as_mut() {
                if !keep(c) {
                    self.remove(i);
                }
            }
            i += 1;
        }
    }

    /// Take out every connection.
    pub(crate) fn clear(&mut self) {
        *self = Self::default();
    }

    pub(crate) fn get(&self, i: usize) -> Option<&C> {
        self.slots.get(i)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut C> {
        self.slots.get_mut(i)?.as_mut()
    }

    /// The slot of the connection with transport handle `key`.
    pub(crate) fn of_key(&self, key: C::Key) -> Option<usize> {
        self.by_key.get(&key).copied()
    }

    /// The slot of the connection of `qp`.
    pub(crate) fn of_qp(&self, qp: QpId) -> Option<usize> {
        self.by_qp.get(&qp).copied()
    }

    /// Connections held.
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &C> {
        self.slots.iter().flatten()
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut C> {
        self.slots.iter_mut().flatten()
    }

    /// Visit slot `i` at the next pass.
    pub(crate) fn mark(&mut self, i: usize) {
        if let Some(c) = self.slots.get_mut(i).and_then(Option::as_mut) {
            let hot = c.hot();
            if !*hot {
                *hot = true;
                self.hot.push(i);
            }
        }
    }

    /// Visit every slot at the next pass.
    pub(crate) fn mark_all(&mut self) {
        for i in 0..self.slots.len() {
            self.mark(i);
        }
    }

    /// Whether a slot waits for a visit.
    pub(crate) fn any_hot(&self) -> bool {
        !self.hot.is_empty()
    }

    /// The slots to visit now (their flags cleared); marks from here on
    /// go to the next pass. Hand the list back with [`Self::give_back`].
    pub(crate) fn take_hot(&mut self) -> Vec<usize> {
        let hot = std::mem::take(&mut self.hot);
        for &i in &hot {
            if let Some(c) = self.slots.get_mut(i).and_then(Option::as_mut) {
                *c.hot() = false;
            }
        }
        hot
    }

    /// Keep the allocation of a visited list for the next pass.
    pub(crate) fn give_back(&mut self, mut list: Vec<usize>) {
        if self.hot.is_empty() {
            list.clear();
            self.hot = list;
        }
    }

    /// Slot `i`'s deadline (its QP's core timer, ...) is `t` now.
    pub(crate) fn schedule(&mut self, i: usize, t: Option<Instant>) {
        let Some(c) = self.slots.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        let timer = c.timer();
        if *timer != t {
            *timer = t;
            if let Some(t) = t {
                self.timers.push(Reverse((t, i, self.gens[i])));
            }
        }
    }

    /// Whether the heap's entry stands for the slot's present deadline.
    fn live(&mut self, t: Instant, i: usize, gen: u32) -> bool {
        self.gens.get(i) == Some(&gen)
            && self
                .slots
                .get_mut(i)
                .and_then(Option::as_mut)
                .is_some_and(|c| *c.timer() == Some(t))
    }

    /// Put the slots whose timer is due at `now` on the visit list.
    pub(crate) fn fire(&mut self, now: Instant) {
        while let Some(&Reverse((t, i, gen))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            if self.live(t, i, gen) {
                if let Some(c) = self.slots.get_mut(i).and_then(Option::as_mut) {
                    *c.timer() = None;
                }
                self.mark(i);
            }
        }
        // Stale entries: rebuild once they outnumber the live ones
        // (amortised over the pushes).
        if self.timers.len() > 2 * self.len() + 64 {
            let mut heap = std::mem::take(&mut self.timers).into_vec();
            heap.retain(|&Reverse((t, i, gen))| self.live(t, i, gen));
            self.timers = heap.into();
        }
    }

    /// The earliest timer, if any (stale entries dropped on the way).
    pub(crate) fn next_timer(&mut self) -> Option<Instant> {
        while let Some(&Reverse((t, i, gen))) = self.timers.peek() {
            if self.live(t, i, gen) {
                return Some(t);
            }
            self.timers.pop();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct C {
        key: u32,
        qp: Option<QpId>,
        hot: bool,
        timer: Option<Instant>,
    }

    impl Slotted for C {
        type Key = u32;
        fn key(&self) -> u32 {
            self.key
        }
        fn qp(&self) -> Option<QpId> {
            self.qp
        }
        fn hot(&mut self) -> &mut bool {
            &mut self.hot
        }
        fn timer(&mut self) -> &mut Option<Instant> {
            &mut self.timer
        }
    }

    fn c(key: u32) -> C {
        C {
            key,
            qp: Some(QpId::from_raw(key + 1000)),
            hot: false,
            timer: None,
        }
    }

    #[test]
    fn due_timers_mark_their_slot_once_and_moved_ones_not() {
        let mut s = ConnSlots::default();
        let a = s.insert(c(1));
        let b = s.insert(c(2));
        let hot = s.take_hot();
        s.give_back(hot);
        let at = |ms: u64| Instant::from_micros(ms * 1000);
        s.schedule(a, Some(at(10)));
        s.schedule(b, Some(at(20)));
        s.schedule(b, Some(at(30)));
        assert_eq!(s.next_timer(), Some(at(10)));
        s.fire(at(25));
        assert_eq!(s.take_hot(), vec![a], "b's deadline moved to 30");
        assert_eq!(s.next_timer(), Some(at(30)));
        s.remove(b);
        assert_eq!(s.next_timer(), None, "a left slot has no timer");
        s.fire(at(40));
        assert!(!s.any_hot());
    }

    #[test]
    fn found_by_key_and_qp_marked_once() {
        let mut s = ConnSlots::default();
        let a = s.insert(c(1));
        let b = s.insert(c(2));
        assert_eq!(s.of_key(2), Some(b));
        assert_eq!(s.of_qp(QpId::from_raw(1001)), Some(a));
        assert_eq!(s.take_hot(), vec![a, b], "new connections are visited");
        s.mark(b);
        s.mark(b);
        s.mark(a);
        assert_eq!(s.take_hot(), vec![b, a]);
        assert!(!s.any_hot());
        assert_eq!(s.remove(a).map(|c| c.key), Some(1));
        assert_eq!(s.of_key(1), None);
        assert_eq!(s.of_qp(QpId::from_raw(1001)), None);
        s.mark(a);
        assert!(!s.any_hot(), "an empty slot is never visited");
        let d = s.insert(c(3));
        assert_eq!(d, a, "the slot is reused");
        assert_eq!(s.len(), 2);
    }

    /// Connections the core does not drive yet (an accepted one waiting
    /// for its MPA request) or any more (a closing socket) have no QP:
    /// found by key only, visited when marked or due, not otherwise.
    #[test]
    fn entries_without_a_qp_wait_for_a_mark_or_their_deadline() {
        let mut s = ConnSlots::default();
        let at = |ms: u64| Instant::from_micros(ms * 1000);
        let a = s.insert(C { qp: None, ..c(1) });
        let b = s.insert(C { qp: None, ..c(2) });
        assert_eq!(s.of_key(1), Some(a));
        assert_eq!(s.of_qp(QpId::from_raw(1001)), None);
        assert_eq!(s.take_hot(), vec![a, b], "visited on arrival");
        s.schedule(a, Some(at(10)));
        s.fire(at(5));
        assert!(!s.any_hot(), "nothing to do before the deadline");
        s.mark(b);
        s.fire(at(10));
        assert_eq!(s.take_hot(), vec![b, a]);
        assert_eq!(s.next_timer(), None);
    }

    #[test]
    fn memory_returns_once_everyone_left() {
        let mut s = ConnSlots::default();
        let all: Vec<usize> = (0..1000).map(|k| s.insert(c(k))).collect();
        let hot = s.take_hot();
        s.give_back(hot);
        for i in all {
            s.remove(i);
        }
        assert_eq!(s.slots.capacity(), 0);
        assert_eq!(s.len(), 0);
    }
}
