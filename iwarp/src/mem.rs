//! Memory regions and the STag table (RFC 5040 §5, RFC 5041 §5).
//!
//! An STag is `index << 8 | key`: the index selects a slot of the table,
//! the 8-bit key is drawn at random for every registration, so a stale or
//! guessed STag is rejected with high probability even when its slot is
//! reused. Every access by the peer (tagged placement, RDMA Read source)
//! and every local scatter/gather element goes through [`MemTable::check`],
//! which enforces, in this order: the STag names a valid region, the region
//! belongs to the QP's protection domain, the access right is granted, the
//! offset does not wrap, and the span lies inside the region.
//!
//! A region's bytes are either owned by the table ([`MemTable::register_owned`],
//! safe) or live in memory the application registered by address
//! ([`MemTable::register`], `unsafe`: the caller promises the memory outlives
//! the registration). This module is the only place in the crate that
//! touches raw memory.
#![allow(unsafe_code)]

use core::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Access rights of a memory region, a bit set combined with `|`. Local
/// reads (gather for Send, Write and Read Response) are always allowed;
/// every other use needs its right, or the access fails with
/// [`MemError::AccessRights`].
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Access(u8);

impl Access {
    /// No access beyond local reads.
    pub const NONE: Self = Self(0);
    /// The local QP may write into the region (receive buffers, RDMA Read sinks).
    pub const LOCAL_WRITE: Self = Self(1);
    /// The peer may read the region with RDMA Read.
    pub const REMOTE_READ: Self = Self(2);
    /// The peer may write the region with RDMA Write.
    pub const REMOTE_WRITE: Self = Self(4);
    /// The peer may run atomic operations (RFC 7306 §5) on the region.
    pub const REMOTE_ATOMIC: Self = Self(8);

    /// Whether every right in `other` is granted by `self`.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw bits: `LOCAL_WRITE` 1, `REMOTE_READ` 2, `REMOTE_WRITE` 4,
    /// `REMOTE_ATOMIC` 8.
    pub const fn bits(self) -> u8 {
        self.0
    }
}

impl core::ops::BitOr for Access {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Self::LOCAL_WRITE, "LOCAL_WRITE"),
            (Self::REMOTE_READ, "REMOTE_READ"),
            (Self::REMOTE_WRITE, "REMOTE_WRITE"),
            (Self::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ];
        let mut first = true;
        f.write_str("Access(")?;
        for (a, n) in names {
            if self.contains(a) {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(n)?;
                first = false;
            }
        }
        f.write_str(")")
    }
}

/// A protection domain: regions and QPs of one PD only see each other.
/// Index and generation in a `u32`, as [`crate::cq::QpId`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PdId(u32);

crate::slab::handle_impl!(PdId);

/// What a registration returns: the keys and the address space of the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrInfo {
    /// The STag used in local scatter/gather elements.
    pub lkey: u32,
    /// The STag advertised to the peer (the same STag: iWARP has one).
    pub rkey: u32,
    /// The tagged offset of the region's first byte.
    pub iova: u64,
    /// Length of the region in bytes; valid tagged offsets are
    /// `iova..iova + len`.
    pub len: usize,
}

/// Why an access to registered memory was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemError {
    /// No valid region has this STag (never registered, deregistered,
    /// invalidated, or wrong key).
    InvalidStag,
    /// The region belongs to another protection domain.
    NotAssociated,
    /// The region does not grant the access right.
    AccessRights,
    /// The span does not lie within the region.
    BaseBounds,
    /// Offset plus length wraps the 64-bit tagged offset space.
    ToWrap,
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::InvalidStag => "invalid STag",
            Self::NotAssociated => "STag not associated with this protection domain",
            Self::AccessRights => "access rights violation",
            Self::BaseBounds => "base or bounds violation",
            Self::ToWrap => "tagged offset wraps",
        })
    }
}

impl core::error::Error for MemError {}

/// A span of a region that passed [`MemTable::check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    index: u32,
    /// The key of the registration checked: a span kept while its region
    /// is deregistered and the slot reused reaches nothing.
    key: u8,
    offset: usize,
    len: usize,
}

impl Span {
    /// Length of the span in bytes.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether the span is empty.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first `n` bytes of the span skipped.
    pub fn advance(self, n: usize) -> Self {
        let n = n.min(self.len);
        Self {
            index: self.index,
            key: self.key,
            offset: self.offset + n,
            len: self.len - n,
        }
    }
}

struct Region {
    key: u8,
    pd: PdId,
    base: *mut u8,
    len: usize,
    iova: u64,
    access: Access,
    valid: bool,
    /// Keeps an owned buffer alive; `base` points into it.
    owned: Option<Box<[u8]>>,
}

/// The STag table of one device context: every registered region with its
/// protection domain, access rights and validity. An STag is the slot
/// index shifted left by 8 with an 8-bit key below, the key changing each
/// time a slot is reused, so a stale STag names nothing.
pub struct MemTable {
    slots: Vec<Option<Region>>,
    /// The key last used in each slot, so that a reused slot gets another.
    last_key: Vec<u8>,
    free: Vec<u32>,
    rng: u64,
    /// Advanced after every write into a region ([`MemTable::placements`]).
    placed: Arc<AtomicU64>,
}

// SAFETY: the raw pointers in the table point either into buffers the table
// owns (moved with it) or into memory the registrant promised stays valid
// until deregistration, whichever thread the table lives on.
unsafe impl Send for MemTable {}

/// The largest slot index an STag can carry (24 bits): at most this many
/// regions are registered at once.
pub const MAX_INDEX: u32 = (1 << 24) - 1;

impl MemTable {
    /// An empty table. `seed` seeds the key generator (deterministic tests).
    pub fn new(seed: u64) -> Self {
        Self {
            // Slot 0 is never used: STag 0 stays invalid.
            slots: vec![None],
            last_key: vec![0],
            free: Vec::new(),
            rng: seed | 1,
            placed: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The table's placement counter: advanced, with `Release` ordering,
    /// after every write into a region ([`MemTable::write`]: placed
    /// payload, RDMA Read Response data, atomic results). Another thread
    /// that sees it change knows that something was placed since it last
    /// looked, without touching the table. It carries no data: reading the
    /// bytes still needs whatever keeps the table's writes out (the lock
    /// the table lives behind).
    pub fn placements(&self) -> Arc<AtomicU64> {
        self.placed.clone()
    }

    fn next_key(&mut self) -> u8 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
    }

    fn insert(&mut self, mut region: Region) -> Result<MrInfo, Region> {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let Some(i) = u32::try_from(self.slots.len())
                    .ok()
                    .filter(|&i| i <= MAX_INDEX)
                else {
                    return Err(region);
                };
                self.slots.push(None);
                self.last_key.push(0);
                i
            }
        };
        let mut key = self.next_key();
        // A reused slot gets a key different from its previous one.
        if self.last_key[index as usize] == key {
            key = key.wrapping_add(1);
        }
        self.last_key[index as usize] = key;
        region.key = key;
        let stag = index << 8 | u32::from(key);
        let info = MrInfo {
            lkey: stag,
            rkey: stag,
            iova: region.iova,
            len: region.len,
        };
        self.slots[index as usize] = Some(region);
        Ok(info)
    }

    /// Register `len` bytes at `addr`, with tagged offsets starting at `iova`.
    /// Returns `None` when the table is full.
    ///
    /// # Safety
    /// `addr` must be valid for reads and writes of `len` bytes until the
    /// region is deregistered (or the table dropped). While the region is
    /// registered, the stack may write into it whenever the peer sends data
    /// to it: the application must not hold Rust references to that memory
    /// across such writes (read it after the work completion, or with
    /// volatile reads).
    pub unsafe fn register(
        &mut self,
        pd: PdId,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Option<MrInfo> {
        self.insert(Region {
            key: 0,
            pd,
            base: addr,
            len,
            iova,
            access,
            valid: true,
            owned: None,
        })
        .ok()
    }

    /// Register a buffer the table takes ownership of; tagged offsets start
    /// at the buffer's address, as with `ibv_reg_mr`. Returns the buffer back
    /// when the table is full.
    pub fn register_owned(
        &mut self,
        pd: PdId,
        mut buf: Box<[u8]>,
        access: Access,
    ) -> Result<MrInfo, Box<[u8]>> {
        let base = buf.as_mut_ptr();
        let len = buf.len();
        let region = Region {
            key: 0,
            pd,
            base,
            len,
            iova: base as u64,
            access,
            valid: true,
            owned: Some(buf),
        };
        self.insert(region).map_err(|r| r.owned.unwrap_or_default())
    }

    fn slot(&self, stag: u32) -> Option<&Region> {
        let r = self.slots.get((stag >> 8) as usize)?.as_ref()?;
        (r.key == stag as u8).then_some(r)
    }

    fn slot_mut(&mut self, stag: u32) -> Option<&mut Region> {
        let r = self.slots.get_mut((stag >> 8) as usize)?.as_mut()?;
        (r.key == stag as u8).then_some(r)
    }

    /// Remove a region. Returns its buffer if the table owned it.
    pub fn deregister(&mut self, stag: u32) -> Result<Option<Box<[u8]>>, MemError> {
        self.slot(stag).ok_or(MemError::InvalidStag)?;
        let index = stag >> 8;
        let region = self.slots[index as usize]
            .take()
            .ok_or(MemError::InvalidStag)?;
        self.free.push(index);
        Ok(region.owned)
    }

    /// Invalidate an STag (Local Invalidate, or Send with Invalidate from a
    /// peer of the same protection domain). The region stays registered
    /// but no access through the STag succeeds any more.
    pub fn invalidate(&mut self, stag: u32, pd: PdId) -> Result<(), MemError> {
        let r = self.slot_mut(stag).ok_or(MemError::InvalidStag)?;
        if !r.valid {
            return Err(MemError::InvalidStag);
        }
        if r.pd != pd {
            return Err(MemError::NotAssociated);
        }
        r.valid = false;
        Ok(())
    }

    /// Whether `stag` names a valid (registered, not invalidated) region.
    pub fn is_valid(&self, stag: u32) -> bool {
        self.slot(stag).is_some_and(|r| r.valid)
    }

    /// Check an access of `len` bytes at tagged offset `to` through `stag`
    /// by a QP of protection domain `pd` needing `need`.
    pub fn check(
        &self,
        stag: u32,
        pd: PdId,
        to: u64,
        len: usize,
        need: Access,
    ) -> Result<Span, MemError> {
        let r = self
            .slot(stag)
            .filter(|r| r.valid)
            .ok_or(MemError::InvalidStag)?;
        if r.pd != pd {
            return Err(MemError::NotAssociated);
        }
        if !r.access.contains(need) {
            return Err(MemError::AccessRights);
        }
        let end = to.checked_add(len as u64).ok_or(MemError::ToWrap)?;
        if to < r.iova || end > r.iova.saturating_add(r.len as u64) {
            return Err(MemError::BaseBounds);
        }
        Ok(Span {
            index: stag >> 8,
            key: stag as u8,
            offset: (to - r.iova) as usize,
            len,
        })
    }

    fn region_of(&self, span: Span) -> Option<&Region> {
        let r = self.slots.get(span.index as usize)?.as_ref()?;
        if r.key != span.key {
            return None;
        }
        let end = span.offset.checked_add(span.len)?;
        (end <= r.len).then_some(r)
    }

    /// Copy `src` into the start of `span` (at most `span.len()` bytes).
    /// Returns the number of bytes copied (0 if the region went away).
    pub fn write(&mut self, span: Span, src: &[u8]) -> usize {
        let Some(r) = self.region_of(span) else {
            return 0;
        };
        let n = src.len().min(span.len);
        // SAFETY: `region_of` checked `offset + len <= r.len`, and `base` is
        // valid for writes of `r.len` bytes (owned buffer, or the promise
        // made to `register`). `src` cannot overlap: it is borrowed shared
        // while the table is borrowed exclusively, and registered memory is
        // never handed out as a Rust reference while `&mut self` exists.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), r.base.add(span.offset), n) };
        // Only `&mut self` writes the counter: no read-modify-write needed.
        let next = self.placed.load(Ordering::Relaxed).wrapping_add(1);
        self.placed.store(next, Ordering::Release);
        n
    }

    /// The bytes of `span`, for transmit.
    pub fn read(&self, span: Span) -> &[u8] {
        let Some(r) = self.region_of(span) else {
            return &[];
        };
        // SAFETY: bounds checked by `region_of`; the memory is valid for
        // reads while registered; the returned slice borrows `self`, so no
        // `write` (which needs `&mut self`) can happen while it lives.
        unsafe { core::slice::from_raw_parts(r.base.add(span.offset), span.len) }
    }

    /// The bytes of an owned region, whole (`None` for regions registered
    /// by address or unknown STags).
    pub fn owned_bytes(&self, stag: u32) -> Option<&[u8]> {
        self.slot(stag)?.owned.as_deref()
    }

    /// The bytes of an owned region, mutable.
    pub fn owned_bytes_mut(&mut self, stag: u32) -> Option<&mut [u8]> {
        self.slot_mut(stag)?.owned.as_deref_mut()
    }

    /// Number of registered regions.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Slots of the table: the most regions registered at once (a
    /// deregistered region's slot is reused by the next registration).
    pub fn slots(&self) -> usize {
        self.slots.len() - 1
    }

    /// Whether a region of protection domain `pd` is registered.
    pub fn has_pd(&self, pd: PdId) -> bool {
        self.slots.iter().flatten().any(|r| r.pd == pd)
    }

    /// Whether no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for MemTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemTable")
            .field("regions", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PD: PdId = PdId::from_raw(1);

    fn table_with(len: usize, access: Access) -> (MemTable, MrInfo) {
        let mut t = MemTable::new(7);
        let mr = t
            .register_owned(PD, vec![0u8; len].into_boxed_slice(), access)
            .unwrap();
        (t, mr)
    }

    #[test]
    fn check_order_and_errors() {
        let (t, mr) = table_with(100, Access::REMOTE_WRITE);
        assert!(t
            .check(mr.rkey, PD, mr.iova, 100, Access::REMOTE_WRITE)
            .is_ok());
        assert_eq!(
            t.check(mr.rkey ^ 1, PD, mr.iova, 1, Access::REMOTE_WRITE),
            Err(MemError::InvalidStag)
        );
        assert_eq!(
            t.check(0, PD, 0, 0, Access::NONE),
            Err(MemError::InvalidStag)
        );
        assert_eq!(
            t.check(mr.rkey, PdId::from_raw(2), mr.iova, 1, Access::REMOTE_WRITE),
            Err(MemError::NotAssociated)
        );
        assert_eq!(
            t.check(mr.rkey, PD, mr.iova, 1, Access::REMOTE_READ),
            Err(MemError::AccessRights)
        );
        assert_eq!(
            t.check(mr.rkey, PD, mr.iova + 1, 100, Access::REMOTE_WRITE),
            Err(MemError::BaseBounds)
        );
        assert_eq!(
            t.check(mr.rkey, PD, mr.iova - 1, 1, Access::REMOTE_WRITE),
            Err(MemError::BaseBounds)
        );
        assert_eq!(
            t.check(mr.rkey, PD, u64::MAX, 2, Access::REMOTE_WRITE),
            Err(MemError::ToWrap)
        );
    }

    #[test]
    fn writes_advance_the_placement_counter() {
        let (mut t, mr) = table_with(16, Access::REMOTE_WRITE);
        let placed = t.placements();
        assert_eq!(placed.load(Ordering::Acquire), 0);
        let span = t
            .check(mr.rkey, PD, mr.iova, 4, Access::REMOTE_WRITE)
            .unwrap();
        t.write(span, b"abcd");
        t.write(span, b"ef");
        assert_eq!(placed.load(Ordering::Acquire), 2);
        // A span of a region deregistered since writes nothing and
        // advances nothing.
        t.deregister(mr.lkey).unwrap();
        assert_eq!(t.write(span, b"gh"), 0);
        assert_eq!(placed.load(Ordering::Acquire), 2);
    }

    #[test]
    fn write_read_and_invalidate() {
        let (mut t, mr) = table_with(16, Access::REMOTE_WRITE | Access::REMOTE_READ);
        let span = t
            .check(mr.rkey, PD, mr.iova + 4, 4, Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(t.write(span, b"abcdefg"), 4);
        assert_eq!(&t.owned_bytes(mr.lkey).unwrap()[..10], b"\0\0\0\0abcd\0\0");
        assert_eq!(t.read(span.advance(1)), b"bcd");
        assert_eq!(
            t.invalidate(mr.rkey, PdId::from_raw(9)),
            Err(MemError::NotAssociated)
        );
        t.invalidate(mr.rkey, PD).unwrap();
        assert!(!t.is_valid(mr.rkey));
        assert_eq!(
            t.check(mr.rkey, PD, mr.iova, 1, Access::REMOTE_WRITE),
            Err(MemError::InvalidStag)
        );
        assert_eq!(t.invalidate(mr.rkey, PD), Err(MemError::InvalidStag));
    }

    #[test]
    fn reused_slot_gets_new_key() {
        let mut t = MemTable::new(3);
        for _ in 0..300 {
            let a = t
                .register_owned(PD, vec![0u8; 4].into_boxed_slice(), Access::NONE)
                .unwrap();
            assert_ne!(a.lkey, 0);
            t.deregister(a.lkey).unwrap();
            let b = t
                .register_owned(PD, vec![0u8; 4].into_boxed_slice(), Access::NONE)
                .unwrap();
            assert_eq!(a.lkey >> 8, b.lkey >> 8);
            assert_ne!(a.lkey, b.lkey);
            assert_eq!(
                t.check(a.lkey, PD, a.iova, 0, Access::NONE),
                Err(MemError::InvalidStag)
            );
            t.deregister(b.lkey).unwrap();
        }
    }

    #[test]
    fn span_of_a_deregistered_region_reaches_nothing() {
        let (mut t, old) = table_with(8, Access::REMOTE_WRITE);
        let span = t
            .check(old.rkey, PD, old.iova, 8, Access::REMOTE_WRITE)
            .unwrap();
        t.deregister(old.lkey).unwrap();
        let new = t
            .register_owned(PD, vec![0u8; 8].into_boxed_slice(), Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(new.lkey >> 8, old.lkey >> 8, "the slot is reused");
        assert_eq!(t.write(span, &[1; 8]), 0);
        assert!(t.read(span).is_empty());
        assert_eq!(t.owned_bytes(new.lkey).unwrap(), &[0; 8]);
        assert_eq!(t.deregister(old.lkey), Err(MemError::InvalidStag));
        assert!(t.is_valid(new.lkey));
    }

    #[test]
    fn deregistration_frees_the_slot() {
        let mut t = MemTable::new(5);
        let keep = t
            .register_owned(PD, vec![0u8; 4].into_boxed_slice(), Access::NONE)
            .unwrap();
        for _ in 0..10_000 {
            let a = t
                .register_owned(PD, vec![0u8; 4].into_boxed_slice(), Access::NONE)
                .unwrap();
            t.deregister(a.lkey).unwrap();
        }
        assert_eq!((t.len(), t.slots()), (1, 2));
        assert!(t.has_pd(PD));
        t.deregister(keep.lkey).unwrap();
        assert!(!t.has_pd(PD));
        assert!(t.is_empty());
    }

    #[test]
    fn registered_by_address() {
        let mut backing = [0u8; 8];
        let mut t = MemTable::new(1);
        // SAFETY: `backing` outlives the table in this test.
        let mr = unsafe { t.register(PD, backing.as_mut_ptr(), 8, 0x1000, Access::LOCAL_WRITE) }
            .unwrap();
        let span = t
            .check(mr.lkey, PD, 0x1006, 2, Access::LOCAL_WRITE)
            .unwrap();
        assert_eq!(t.write(span, &[9, 9]), 2);
        assert!(t.owned_bytes(mr.lkey).is_none());
        drop(t);
        assert_eq!(backing, [0, 0, 0, 0, 0, 0, 9, 9]);
    }
}
