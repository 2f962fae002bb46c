//! Socket buffers in pages of their own, given back while their
//! connection is quiet and unmapped when it goes.
//!
//! smoltcp's socket buffers are fixed for a socket's life, and its rings
//! move through the whole buffer under traffic, so a connection that has
//! gone quiet keeps every page its traffic touched. Each connection's two
//! buffers therefore lie in one anonymous mapping of whole pages that no
//! other object shares (no allocator header sits in their first page):
//! once the buffers hold nothing the socket will read again (see
//! [`Config::idle_release`](crate::Config::idle_release)), the stack
//! hands every page back with `madvise(MADV_DONTNEED)` (the mapping
//! stays; a page comes back, zeroed, when the ring next writes it), and
//! dropping the connection unmaps them. A page is resident only once the
//! ring writes it, so a fresh connection costs no page of its buffers.

use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::OnceLock;

use nix::sys::mman::{madvise, mmap_anonymous, munmap, MapFlags, MmapAdvise, ProtFlags};
use nix::unistd::{sysconf, SysconfVar};

/// One connection's receive and transmit buffers: an anonymous mapping,
/// the receive buffer at its start and the transmit buffer on the first
/// page after the receive buffer's last. Unmapped when dropped.
#[derive(Debug)]
pub(crate) struct Buffers {
    /// The mapping's first byte (page-aligned; its provenance exposed).
    addr: NonZeroUsize,
    /// Bytes mapped: whole pages.
    len: usize,
}

impl Buffers {
    /// Map zeroed buffers of `rx` and `tx` bytes, returned as the slices
    /// the socket rings own; `None` if the system refuses the mapping.
    ///
    /// # Safety
    ///
    /// The slices stay valid only while the returned `Buffers` lives: the
    /// caller ends every use of them (drops the socket that holds them)
    /// before it drops the `Buffers`.
    pub(crate) unsafe fn map(
        rx: usize,
        tx: usize,
    ) -> Option<(Self, &'static mut [u8], &'static mut [u8])> {
        let page = page_size();
        let tx_at = rx.checked_next_multiple_of(page)?;
        let len = tx_at
            .checked_add(tx.checked_next_multiple_of(page)?)?
            .max(page);
        // SAFETY: a fresh private anonymous mapping at an address the
        // kernel picks overlaps no memory of the process.
        let addr = unsafe {
            mmap_anonymous(
                None,
                NonZeroUsize::new(len)?,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }
        .ok()?
        .cast::<u8>();
        let buffers = Self {
            addr: addr.expose_provenance(),
            len,
        };
        // SAFETY: the mapping is `len` bytes, readable, writable and
        // zero-filled, and `rx <= tx_at` and `tx_at + tx <= len`: the two
        // slices lie inside it and do not overlap. Nothing else refers to
        // the mapping, and the caller's contract keeps the slices' use
        // within the mapping's life.
        let (r, t) = unsafe {
            (
                std::slice::from_raw_parts_mut(addr.as_ptr(), rx),
                std::slice::from_raw_parts_mut(addr.as_ptr().add(tx_at), tx),
            )
        };
        Some((buffers, r, t))
    }

    /// Give every page of both buffers back to the system; returns how
    /// many bytes (0 if the call failed).
    ///
    /// # Safety
    ///
    /// Nothing uses the slices during the call, and none of their bytes
    /// is read again before it is written: their contents become zeros.
    pub(crate) unsafe fn release(&self) -> usize {
        // SAFETY: the range is this mapping's, private and anonymous, which
        // belongs to no other object; MADV_DONTNEED only replaces its
        // pages' contents with zeros, which the caller's contract allows.
        match unsafe { madvise(self.start(), self.len, MmapAdvise::MADV_DONTNEED) } {
            Ok(()) => self.len,
            Err(_) => 0,
        }
    }

    /// The mapping's first byte.
    fn start(&self) -> NonNull<std::ffi::c_void> {
        NonNull::with_exposed_provenance(self.addr)
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        // SAFETY: the mapping is this object's, mapped in `map` with this
        // length, and by `map`'s contract nothing uses the slices into it
        // any more. A failure leaves the pages mapped; nothing else refers
        // to them.
        let _ = unsafe { munmap(self.start(), self.len) };
    }
}

/// The system's page size (a power of two; 4096 if the system does not
/// say).
fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        sysconf(SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|p| usize::try_from(p).ok())
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of `b` present in memory: bit 63 of their entries in
    /// /proc/self/pagemap.
    fn resident(b: &[u8]) -> usize {
        use std::io::{Read, Seek, SeekFrom};
        let page = page_size();
        let first = b.as_ptr().addr() / page;
        let last = (b.as_ptr().addr() + b.len() - 1) / page;
        let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
        f.seek(SeekFrom::Start(first as u64 * 8)).unwrap();
        let mut e = vec![0u8; (last - first + 1) * 8];
        f.read_exact(&mut e).unwrap();
        e.chunks(8)
            .filter(|&c| u64::from_le_bytes(c.try_into().unwrap()) >> 63 == 1)
            .count()
    }

    /// Each buffer starts on a page of its own and is as long as asked;
    /// the two do not overlap; the mapping is whole pages.
    #[test]
    fn buffers_start_on_pages_of_their_own() {
        let page = page_size();
        for (rx, tx) in [(64 * 1024, 256 * 1024), (10 * page + 100, 3 * page), (1, 0)] {
            // SAFETY: the slices are dropped before the buffers (end of
            // the iteration, declared after them).
            let (b, r, t) = unsafe { Buffers::map(rx, tx) }.unwrap();
            assert_eq!((r.len(), t.len()), (rx, tx));
            assert_eq!(r.as_ptr().addr() % page, 0);
            assert_eq!(t.as_ptr().addr() % page, 0);
            assert!(r.as_ptr().addr() + rx <= t.as_ptr().addr());
            assert_eq!(b.len % page, 0);
            assert_eq!(
                b.len,
                (rx.next_multiple_of(page) + tx.next_multiple_of(page)).max(page)
            );
            assert!(r.iter().chain(t.iter()).all(|&x| x == 0));
        }
    }

    /// A mapping the system refuses, or sizes that overflow, give `None`
    /// (the stack refuses the connection) rather than a panic.
    #[test]
    fn refused_mappings_are_none() {
        for (rx, tx) in [(1 << 60, 4096), (usize::MAX, 0), (4096, usize::MAX - 100)] {
            // SAFETY: nothing is mapped, so there are no slices to outlive it.
            assert!(unsafe { Buffers::map(rx, tx) }.is_none(), "{rx} {tx}");
        }
    }

    /// A fresh mapping holds no page until written; released pages read
    /// as zeros and leave the resident set; written again, they hold what
    /// is written.
    #[test]
    fn pages_are_resident_once_written_and_leave_when_released() {
        let page = page_size();
        // SAFETY: `r` and `t` are last used before `b` drops at the end.
        let (b, r, t) = unsafe { Buffers::map(64 * page, 32 * page) }.unwrap();
        assert_eq!(resident(r) + resident(t), 0);
        r.fill(0xa5);
        t.fill(0x5a);
        assert_eq!(resident(r) + resident(t), 96);
        // SAFETY: the slices are not used during the call and read below
        // only as the zeros the release leaves.
        let n = unsafe { b.release() };
        assert_eq!(n, 96 * page);
        assert_eq!(resident(r) + resident(t), 0);
        assert!(r.iter().chain(t.iter()).all(|&x| x == 0));
        r.fill(7);
        assert!(r.iter().all(|&x| x == 7));
        assert_eq!(resident(r), 64);
    }
}
