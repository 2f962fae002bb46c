//! A generational slab: the table behind the verbs handles.
//!
//! Objects live in slots of a `Vec`; a freed slot goes on a free list and
//! the next insertion reuses it, so a table's size follows the number of
//! objects alive at once, not the number ever created. Each slot counts
//! its occupants: the [`Key`] an insertion returns carries the slot's
//! index and that occupant's generation, and every lookup compares both,
//! so a key kept after its object was removed names nothing, even once
//! another object took the slot.
//!
//! # Packing
//!
//! A [`Key`] is one `u32`: the low [`INDEX_BITS`] (20) bits are the slot
//! index, the high [`GENERATION_BITS`] (12) bits the generation. A table
//! holds at most 2^20 objects at once. Generations run from 1 to
//! [`MAX_GENERATION`] (4095) and then start again at 1; generation 0 is
//! never issued, so the raw value 0 is never a live key.
//!
//! # Wrap-around
//!
//! Slots are not retired when their generation wraps: retiring would let
//! the table grow by one slot every 4095 reuses, forever. Instead the free
//! list is first-in first-out, so a freed slot is taken again only after
//! every slot freed before it, and a stale key is rejected until its slot
//! has been reused 4095 times (at least 4095 insertions, and 4095 times
//! the number of free slots when there are several). After that many
//! reuses of the same slot the stale key names the slot's occupant again.
//!
//! No method panics, whatever the key.

use std::collections::VecDeque;

/// Bits of a [`Key`] that hold the slot index.
pub const INDEX_BITS: u32 = 20;
/// Bits of a [`Key`] that hold the generation.
pub const GENERATION_BITS: u32 = 32 - INDEX_BITS;
/// The most slots a table has (2^20).
pub const MAX_SLOTS: u32 = 1 << INDEX_BITS;
/// The largest generation; the one after it is 1.
pub const MAX_GENERATION: u16 = (1 << GENERATION_BITS) - 1;

const INDEX_MASK: u32 = MAX_SLOTS - 1;

/// Names one occupant of one slot: index and generation, packed into a
/// `u32` (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(u32);

impl Key {
    /// The key of generation `generation` of slot `index`; both are cut
    /// to their widths.
    pub const fn new(index: u32, generation: u16) -> Self {
        Self((index & INDEX_MASK) | ((generation as u32) << INDEX_BITS))
    }

    /// The key with this packed value.
    pub const fn from_raw(raw: u32) -> Self {
        Self(raw)
    }

    /// The packed value.
    pub const fn raw(self) -> u32 {
        self.0
    }

    /// The slot index.
    pub const fn index(self) -> u32 {
        self.0 & INDEX_MASK
    }

    /// The generation.
    pub const fn generation(self) -> u16 {
        (self.0 >> INDEX_BITS) as u16
    }
}

/// The generation after `g` (1 after [`MAX_GENERATION`]; never 0).
const fn next_generation(g: u16) -> u16 {
    if g >= MAX_GENERATION {
        1
    } else {
        g + 1
    }
}

#[derive(Debug)]
struct Slot<T> {
    /// The generation of the occupant, or of the last one when vacant
    /// (0: never occupied).
    generation: u16,
    value: Option<T>,
}

/// A table of `T` named by generation-checked [`Key`]s. See the module
/// documentation.
#[derive(Debug)]
pub struct Slab<T> {
    slots: Vec<Slot<T>>,
    /// Vacant slots, oldest vacated first.
    free: VecDeque<u32>,
    len: usize,
    max_slots: u32,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Slab<T> {
    /// An empty table of up to [`MAX_SLOTS`] slots.
    pub const fn new() -> Self {
        Self::with_max_slots(MAX_SLOTS)
    }

    /// An empty table of up to `max` slots (at most [`MAX_SLOTS`]).
    pub const fn with_max_slots(max: u32) -> Self {
        Self {
            slots: Vec::new(),
            free: VecDeque::new(),
            len: 0,
            max_slots: if max < MAX_SLOTS { max } else { MAX_SLOTS },
        }
    }

    /// Insert `value`; `None` when every slot is taken.
    pub fn insert(&mut self, value: T) -> Option<Key> {
        self.insert_with(|_| value)
    }

    /// Insert the value `f` makes from its key (for objects that know
    /// their own name); `None`, without calling `f`, when every slot is
    /// taken.
    pub fn insert_with(&mut self, f: impl FnOnce(Key) -> T) -> Option<Key> {
        let index = match self.free.pop_front() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.slots.len())
                    .ok()
                    .filter(|&i| i < self.max_slots)?;
                self.slots.push(Slot {
                    generation: 0,
                    value: None,
                });
                i
            }
        };
        let slot = self.slots.get_mut(index as usize)?;
        slot.generation = next_generation(slot.generation);
        let key = Key::new(index, slot.generation);
        slot.value = Some(f(key));
        self.len += 1;
        Some(key)
    }

    fn slot(&self, key: Key) -> Option<&Slot<T>> {
        self.slots
            .get(key.index() as usize)
            .filter(|s| s.generation == key.generation())
    }

    /// The object named by `key`, if it is still there.
    pub fn get(&self, key: Key) -> Option<&T> {
        self.slot(key)?.value.as_ref()
    }

    /// The object named by `key`, mutable.
    pub fn get_mut(&mut self, key: Key) -> Option<&mut T> {
        self.slots
            .get_mut(key.index() as usize)
            .filter(|s| s.generation == key.generation())?
            .value
            .as_mut()
    }

    /// Whether `key` names a live object.
    pub fn contains(&self, key: Key) -> bool {
        self.get(key).is_some()
    }

    /// Remove the object named by `key`; its slot becomes free.
    pub fn remove(&mut self, key: Key) -> Option<T> {
        let slot = self
            .slots
            .get_mut(key.index() as usize)
            .filter(|s| s.generation == key.generation())?;
        let value = slot.value.take()?;
        self.free.push_back(key.index());
        self.len -= 1;
        Some(value)
    }

    /// Live objects.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no object is live.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Slots allocated: the most objects that were ever live at once.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// The live objects and their keys, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (Key, &T)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            let key = Key::new(u32::try_from(i).ok()?, s.generation);
            Some((key, s.value.as_ref()?))
        })
    }
}

/// The accessors of a handle type that wraps a packed [`Key`] value.
macro_rules! handle_impl {
    ($t:ident) => {
        impl $t {
            /// The handle with this packed value (see [`crate::slab`]);
            /// a value that names no live object is rejected where used.
            pub const fn from_raw(raw: u32) -> Self {
                Self(raw)
            }

            /// The packed value: slot index and generation (see
            /// [`crate::slab`]); never 0 for a handle a context issued.
            pub const fn raw(self) -> u32 {
                self.0
            }

            /// The slot index.
            pub const fn index(self) -> u32 {
                $crate::slab::Key::from_raw(self.0).index()
            }

            /// The generation of the slot's occupant.
            pub const fn generation(self) -> u16 {
                $crate::slab::Key::from_raw(self.0).generation()
            }

            pub(crate) const fn key(self) -> $crate::slab::Key {
                $crate::slab::Key::from_raw(self.0)
            }

            pub(crate) const fn from_key(key: $crate::slab::Key) -> Self {
                Self(key.raw())
            }
        }
    };
}
pub(crate) use handle_impl;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing() {
        let k = Key::new(0x000a_bcde, 0x123);
        assert_eq!(k.raw(), 0x123a_bcde);
        assert_eq!((k.index(), k.generation()), (0xa_bcde, 0x123));
        assert_eq!(Key::from_raw(k.raw()), k);
        let cut = Key::new(u32::MAX, u16::MAX);
        assert_eq!((cut.index(), cut.generation()), (MAX_SLOTS - 1, 0xfff));
    }

    #[test]
    fn insert_get_remove() {
        let mut s = Slab::new();
        let a = s.insert("a").unwrap();
        let b = s.insert("b").unwrap();
        assert_ne!(a, b);
        assert_eq!((s.get(a), s.get(b)), (Some(&"a"), Some(&"b")));
        *s.get_mut(b).unwrap() = "B";
        assert_eq!(s.len(), 2);
        assert_eq!(s.remove(a), Some("a"));
        assert_eq!(s.remove(a), None, "removed twice");
        assert_eq!(s.get(a), None);
        assert!(s.get_mut(a).is_none());
        assert!(!s.contains(a));
        assert_eq!(s.len(), 1);
        let keys: Vec<_> = s.iter().map(|(k, v)| (k, *v)).collect();
        assert_eq!(keys, [(b, "B")]);
    }

    #[test]
    fn first_generation_is_one_and_raw_zero_is_dead() {
        let mut s = Slab::new();
        let k = s.insert(()).unwrap();
        assert_eq!((k.index(), k.generation()), (0, 1));
        assert!(!s.contains(Key::from_raw(0)));
        assert!(s.remove(Key::from_raw(0)).is_none());
    }

    #[test]
    fn stale_key_rejected_after_reuse() {
        let mut s = Slab::new();
        let old = s.insert(1).unwrap();
        s.remove(old).unwrap();
        let new = s.insert(2).unwrap();
        assert_eq!(new.index(), old.index(), "the slot is reused");
        assert_ne!(new, old);
        assert_eq!(s.get(old), None);
        assert!(s.get_mut(old).is_none());
        assert_eq!(s.remove(old), None);
        assert_eq!(s.get(new), Some(&2), "the stale remove left it alone");
    }

    #[test]
    fn any_key_is_safe() {
        let mut s = Slab::new();
        let k = s.insert(7u8).unwrap();
        for raw in [
            0,
            1,
            u32::MAX,
            k.raw() ^ 1,
            k.raw() + (1 << INDEX_BITS),
            1 << 19,
        ] {
            let key = Key::from_raw(raw);
            assert!(key == k || s.get(key).is_none());
            assert!(key == k || s.remove(key).is_none());
        }
        assert_eq!(s.get(k), Some(&7));
    }

    #[test]
    fn slots_stay_bounded_over_many_cycles() {
        let mut s = Slab::new();
        let mut live = VecDeque::new();
        for i in 0..100_000u32 {
            live.push_back(s.insert(i).unwrap());
            if live.len() > 8 {
                let k = live.pop_front().unwrap();
                assert!(s.remove(k).is_some());
            }
        }
        assert_eq!(s.len(), 8);
        assert!(s.slots() <= 9, "{} slots", s.slots());
    }

    #[test]
    fn full_table_refuses() {
        let mut s = Slab::with_max_slots(2);
        let a = s.insert(0).unwrap();
        s.insert(1).unwrap();
        let mut called = false;
        assert!(s
            .insert_with(|_| {
                called = true;
                2
            })
            .is_none());
        assert!(!called);
        s.remove(a);
        assert!(s.insert(3).is_some());
        assert_eq!(s.slots(), 2);
    }

    #[test]
    fn free_list_is_fifo() {
        let mut s = Slab::new();
        let keys: Vec<_> = (0..3).map(|i| s.insert(i).unwrap()).collect();
        s.remove(keys[1]);
        s.remove(keys[0]);
        s.remove(keys[2]);
        let order: Vec<_> = (0..3).map(|i| s.insert(i).unwrap().index()).collect();
        assert_eq!(order, [1, 0, 2]);
    }

    /// One slot reused again and again: every stale key of the last
    /// `MAX_GENERATION - 1` occupants is rejected; generation 0 is
    /// skipped on wrap; after exactly `MAX_GENERATION` reuses the first
    /// key comes back (the documented window).
    #[test]
    fn generation_wraps_without_zero() {
        let mut s = Slab::with_max_slots(1);
        let first = s.insert(0u32).unwrap();
        let mut seen = vec![first];
        s.remove(first).unwrap();
        for i in 1..u32::from(MAX_GENERATION) {
            let k = s.insert(i).unwrap();
            assert_eq!(k.index(), 0);
            assert_ne!(k.generation(), 0);
            for old in &seen {
                assert!(s.get(*old).is_none(), "stale {old:?} at step {i}");
            }
            seen.push(k);
            s.remove(k).unwrap();
        }
        assert_eq!(seen.last().unwrap().generation(), MAX_GENERATION);
        let wrapped = s.insert(u32::MAX).unwrap();
        assert_eq!(wrapped.generation(), 1);
        assert_eq!(wrapped, first, "the window is MAX_GENERATION reuses");
    }
}
