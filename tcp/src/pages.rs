//! The pages of idle connections' socket buffers, given back to the
//! system.
//!
//! smoltcp's socket buffers are fixed for a socket's life, and its rings
//! move through the whole buffer under traffic, so a connection that has
//! gone quiet keeps every page its traffic touched. Once a connection's
//! buffers hold nothing it will read again (see
//! [`Config::idle_release`](crate::Config::idle_release)), the stack
//! hands their whole pages back with `madvise(MADV_DONTNEED)`: the
//! memory stays allocated, and a page comes back, zeroed, when the ring
//! next writes it.

use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::OnceLock;

use nix::sys::mman::{madvise, MmapAdvise};
use nix::unistd::{sysconf, SysconfVar};

/// Where a socket buffer lies: a part of the heap block of the `Vec` the
/// socket owns (its bytes, and for [`buffer`]'s the spare page after
/// them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    addr: usize,
    len: usize,
}

impl Span {
    /// The bytes of `buf` (its length), which then moves into its socket
    /// (moving a `Vec` leaves its heap block where it is; the ring never
    /// grows it).
    #[cfg(test)]
    fn of(buf: &mut Vec<u8>) -> Self {
        Self {
            addr: buf.as_mut_ptr().expose_provenance(),
            len: buf.len(),
        }
    }

    /// The whole pages inside the span: its first page-aligned address
    /// and length, if it holds a page.
    fn pages(&self, page: usize) -> Option<(usize, usize)> {
        let start = self.addr.checked_next_multiple_of(page)?;
        let end = (self.addr + self.len) / page * page;
        (end > start).then(|| (start, end - start))
    }
}

/// A zeroed socket buffer of `len` bytes, with where it lies. Its heap
/// block holds a page more, never used: the page the buffer ends in then
/// belongs to the buffer alone and can be given back whole (a ring moves
/// through its whole buffer).
pub(crate) fn buffer(len: usize) -> (Vec<u8>, Span) {
    let slack = page_size().unwrap_or(0);
    let mut buf = vec![0; len + slack];
    buf.truncate(len);
    let span = Span {
        addr: buf.as_mut_ptr().expose_provenance(),
        len: len + slack,
    };
    (buf, span)
}

/// The system's page size (a power of two); `None` if it is unknown,
/// and then nothing is released.
fn page_size() -> Option<usize> {
    static PAGE: OnceLock<Option<usize>> = OnceLock::new();
    *PAGE.get_or_init(|| {
        let p = sysconf(SysconfVar::PAGE_SIZE).ok()??;
        usize::try_from(p).ok().filter(|p| p.is_power_of_two())
    })
}

/// Give the whole pages of `span` back to the system; returns how many
/// bytes (0 if the span holds no whole page or the call failed).
///
/// # Safety
///
/// `span` came with a buffer from [`buffer`] that is still alive (its
/// socket has not been dropped), no reference into it is live, and none
/// of its bytes is read again before it is written: the contents of its
/// pages become zeros.
pub(crate) unsafe fn release(span: Span) -> usize {
    let Some((start, len)) = page_size().and_then(|p| span.pages(p)) else {
        return 0;
    };
    let (Some(ptr), Some(_)) = (
        NonNull::new(std::ptr::with_exposed_provenance_mut::<u8>(start)),
        NonZeroUsize::new(len),
    ) else {
        return 0;
    };
    // SAFETY: the range is whole pages inside the live heap block of a
    // socket buffer (the caller's contract), which belongs to no other
    // object, and no reference into it is live. MADV_DONTNEED on private
    // anonymous memory (the heap's) only replaces the pages' contents
    // with zeros, and nothing reads those bytes before writing them.
    match unsafe { madvise(ptr.cast(), len, MmapAdvise::MADV_DONTNEED) } {
        Ok(()) => len,
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_pages_inside_a_span() {
        let s = Span {
            addr: 4096 + 10,
            len: 3 * 4096,
        };
        assert_eq!(s.pages(4096), Some((8192, 2 * 4096)));
        let aligned = Span {
            addr: 8192,
            len: 8192,
        };
        assert_eq!(aligned.pages(4096), Some((8192, 8192)));
        let small = Span {
            addr: 4000,
            len: 4096,
        };
        assert_eq!(small.pages(4096), None);
    }

    /// A buffer is as long as asked; its span reaches a page further, so
    /// the page it ends in is a whole page of the span (for a buffer that
    /// starts on an earlier page).
    #[test]
    fn a_buffer_owns_the_page_it_ends_in() {
        let page = page_size().unwrap();
        for len in [64 * 1024, 256 * 1024, 10 * page + 100, 3 * page] {
            let (buf, span) = buffer(len);
            assert_eq!(buf.len(), len);
            assert!(buf.capacity() >= len + page);
            let end = buf.as_ptr().addr() + len;
            let (start, n) = span.pages(page).unwrap();
            assert!(start + n >= end.next_multiple_of(page), "{len}");
            assert!(start + n <= buf.as_ptr().addr() + buf.capacity(), "{len}");
        }
    }

    /// Released pages read as zeros and leave the process's resident
    /// set; written again, they hold what is written.
    #[test]
    fn released_pages_leave_the_resident_set_and_come_back_zeroed() {
        let page = page_size().unwrap();
        let mut buf = vec![0u8; 256 * page];
        let span = Span::of(&mut buf);
        buf.fill(0xa5);
        // Pages of `b` present in memory: bit 63 of their entries in
        // /proc/self/pagemap.
        let resident = |b: &[u8]| -> usize {
            use std::io::{Read, Seek, SeekFrom};
            let first = b.as_ptr().addr() / page;
            let last = (b.as_ptr().addr() + b.len() - 1) / page;
            let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
            f.seek(SeekFrom::Start(first as u64 * 8)).unwrap();
            let mut e = vec![0u8; (last - first + 1) * 8];
            f.read_exact(&mut e).unwrap();
            e.chunks(8)
                .filter(|&c| u64::from_le_bytes(c.try_into().unwrap()) >> 63 == 1)
                .count()
        };
        let before = resident(&buf);
        // SAFETY: `buf` is alive, not borrowed during the call, and read
        // below only as the zeros the release leaves.
        let n = unsafe { release(span) };
        assert_eq!(n % page, 0);
        assert!(n >= 254 * page, "released {n}");
        let after = resident(&buf);
        assert!(after + 250 <= before, "resident pages {before} -> {after}");
        let (start, len) = span.pages(page).unwrap();
        let off = start - buf.as_ptr().addr();
        assert!(buf[off..off + len].iter().all(|&b| b == 0));
        buf.fill(7);
        assert!(buf.iter().all(|&b| b == 7));
    }
}
