//! Typed arenas for the objects the data path reaches (QPs, CQs): a
//! handle is validated by an address check and a flag in its slot, with
//! no process-wide lock.
//!
//! The slots live in chunks that are never returned to the allocator; a
//! destroyed object's slot is marked dead and reused by a later create of
//! the same kind. So a handle can be checked without being trusted: a
//! pointer outside every chunk of the arena, or not at a slot boundary,
//! is refused without being read, and one at a slot boundary always
//! points to a slot whose `live` flag may be read, whether the object was
//! destroyed or not. Chunks are found through atomics; the arena's mutex
//! is taken only to create and destroy.

use std::cell::UnsafeCell;
use std::mem::{size_of, MaybeUninit};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::Mutex;

use crate::lock;

/// Slots in the first chunk; chunk `i` has `FIRST << i`.
const FIRST: usize = 64;
/// Chunks at most: `FIRST * (2^CHUNKS - 1)` slots in all.
const CHUNKS: usize = 24;

/// One object's place: the object first (its address is the handle),
/// then whether it is live.
#[repr(C)]
pub(crate) struct Slot<T> {
    value: UnsafeCell<MaybeUninit<T>>,
    live: AtomicBool,
}

impl<T> Slot<T> {
    fn empty() -> Self {
        Self {
            value: UnsafeCell::new(MaybeUninit::uninit()),
            live: AtomicBool::new(false),
        }
    }
}

struct State {
    /// Slots handed out so far, in chunk order.
    used: usize,
    /// Dead slots, by index, for reuse.
    free: Vec<usize>,
}

/// An arena of `T`s (see the module documentation).
pub(crate) struct Arena<T> {
    chunks: [AtomicPtr<Slot<T>>; CHUNKS],
    state: Mutex<State>,
}

// SAFETY: the arena hands out shared references to `T`s (hence `T: Sync`)
// and moves `T`s in and out of its slots from any thread (`T: Send`); its
// own state is behind atomics and a mutex.
unsafe impl<T: Send + Sync> Sync for Arena<T> {}
// SAFETY: as for `Sync`.
unsafe impl<T: Send + Sync> Send for Arena<T> {}

/// The chunk and position within it of slot `index`.
fn locate(index: usize) -> (usize, usize) {
    // Chunk c starts at FIRST * (2^c - 1).
    let c = (index / FIRST + 1).ilog2() as usize;
    (c, index - FIRST * ((1 << c) - 1))
}

impl<T> Arena<T> {
    pub(crate) const fn new() -> Self {
        Self {
            chunks: [const { AtomicPtr::new(null_mut()) }; CHUNKS],
            state: Mutex::new(State {
                used: 0,
                free: Vec::new(),
            }),
        }
    }

    fn slot(&self, index: usize) -> &Slot<T> {
        let (c, i) = locate(index);
        let base = self.chunks[c].load(Ordering::Acquire);
        // SAFETY: slot `index` was handed out, so its chunk exists (it was
        // stored before the slot's index was counted in `used`), holds
        // `FIRST << c` slots and is never freed.
        unsafe { &*base.add(i) }
    }

    /// Put `v` in a slot; its address is the handle.
    pub(crate) fn insert(&self, v: T) -> *mut T {
        let mut st = lock(&self.state);
        let index = match st.free.pop() {
            Some(i) => i,
            None => {
                let i = st.used;
                let (c, pos) = locate(i);
                assert!(c < CHUNKS, "arena exhausted");
                if pos == 0 {
                    let chunk: Box<[Slot<T>]> = (0..FIRST << c).map(|_| Slot::empty()).collect();
                    // Leaked: slots outlive every handle (module docs).
                    let p = Box::into_raw(chunk).cast::<Slot<T>>();
                    self.chunks[c].store(p, Ordering::Release);
                }
                st.used += 1;
                i
            }
        };
        let s = self.slot(index);
        // SAFETY: the slot is dead (fresh or freed), so nothing else reads
        // its value (`get` checks `live` first); the state lock keeps
        // other inserts and takes away.
        unsafe { (*s.value.get()).write(v) };
        s.live.store(true, Ordering::Release);
        s.value.get().cast()
    }

    /// The index of the slot at `p`, if `p` is a slot boundary of one of
    /// the arena's chunks. Reads only the chunk table.
    fn index_of(&self, p: *const T) -> Option<usize> {
        let addr = p as usize;
        let size = size_of::<Slot<T>>();
        let mut start = 0;
        for (c, chunk) in self.chunks.iter().enumerate() {
            let base = chunk.load(Ordering::Acquire);
            if base.is_null() {
                return None;
            }
            let n = FIRST << c;
            let b = base as usize;
            if addr >= b && addr < b + n * size {
                let off = addr - b;
                return off.is_multiple_of(size).then_some(start + off / size);
            }
            start += n;
        }
        None
    }

    /// The live object at `p`: `None` for a pointer that is not one of
    /// the arena's slots or a slot whose object was destroyed.
    ///
    /// The reference stays valid until the object is taken away: the
    /// application's contract (verbs(7): an object is not destroyed while
    /// another thread uses it).
    pub(crate) fn get<'a>(&self, p: *const T) -> Option<&'a T> {
        let i = self.index_of(p)?;
        let s = self.slot(i);
        if !s.live.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: live: the value was written before `live` was set
        // (Release/Acquire); the chunk is never freed.
        Some(unsafe { (*s.value.get()).assume_init_ref() })
    }

    /// Take the object at `p` out of the arena (destroy), if live.
    pub(crate) fn take(&self, p: *const T) -> Option<T> {
        let mut st = lock(&self.state);
        let i = self.index_of(p)?;
        let s = self.slot(i);
        if !s.live.swap(false, Ordering::AcqRel) {
            return None;
        }
        st.free.push(i);
        // SAFETY: it was live and is now dead, so this is its one move
        // out; `get` no longer hands it out.
        Some(unsafe { (*s.value.get()).assume_init_read() })
    }

    /// Call `f` on every live object (control path: under the arena's
    /// lock, so none is taken away meanwhile).
    pub(crate) fn find(&self, mut f: impl FnMut(*mut T, &T) -> bool) -> Option<*mut T> {
        let st = lock(&self.state);
        for i in 0..st.used {
            let s = self.slot(i);
            if s.live.load(Ordering::Acquire) {
                // SAFETY: live, and the lock keeps it from being taken.
                let v = unsafe { (*s.value.get()).assume_init_ref() };
                if f(s.value.get().cast(), v) {
                    return Some(s.value.get().cast());
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_map_to_chunks() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(FIRST - 1), (0, FIRST - 1));
        assert_eq!(locate(FIRST), (1, 0));
        assert_eq!(locate(3 * FIRST - 1), (1, 2 * FIRST - 1));
        assert_eq!(locate(3 * FIRST), (2, 0));
    }

    #[test]
    fn handles_are_checked_without_trust() {
        static A: Arena<u64> = Arena::new();
        let ps: Vec<*mut u64> = (0..200u64).map(|i| A.insert(i)).collect();
        for (i, &p) in ps.iter().enumerate() {
            assert_eq!(A.get(p).copied(), Some(i as u64));
        }
        // Inside a chunk but not at a slot boundary; outside every chunk.
        assert!(A.get(ps[3].cast::<u8>().wrapping_add(1).cast()).is_none());
        let local = 7u64;
        assert!(A.get(&local).is_none());
        assert!(A.get(std::ptr::null()).is_none());
        // Destroyed: refused, taken once; its slot is reused.
        assert_eq!(A.take(ps[5]), Some(5));
        assert!(A.get(ps[5]).is_none());
        assert_eq!(A.take(ps[5]), None);
        let again = A.insert(99);
        assert_eq!(again, ps[5]);
        assert_eq!(A.get(again).copied(), Some(99));
        assert_eq!(A.find(|_, v| *v == 150), Some(ps[150]));
        assert_eq!(A.find(|_, v| *v == 1000), None);
    }
}
