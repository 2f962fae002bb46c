//! An AF_XDP socket and its UMEM, registered by the engine itself.
//!
//! The engine registers the UMEM in unaligned-chunk mode
//! (`XDP_UMEM_UNALIGNED_CHUNK_FLAG`): a fill-ring address may be any
//! offset of the area, not only a multiple of the chunk size. That is
//! what lets [`super::umem::Frames`] lay its receive chunks out so that
//! the data parts of consecutive chunks touch, and a frame the kernel
//! splits over several of them (multi-buffer, `XDP_USE_SG`) lies in one
//! piece. The socket binds in zero-copy mode where the driver offers it
//! and falls back to copy mode (which is what veth offers), reporting
//! which one it got.
//!
//! The four rings are the kernel's single-producer single-consumer
//! rings: the producer and consumer positions are shared words of the
//! mapping, read with acquire and written with release ordering, the
//! descriptors in between belong to whichever side the positions say.

use std::ffi::CString;
use std::io;
use std::marker::PhantomData;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// What the kernel reserves in front of every received frame
/// (`XDP_PACKET_HEADROOM`); the UMEM's own headroom is 0.
pub(crate) const XDP_HEADROOM: u32 = 256;

/// `SO_PREFER_BUSY_POLL` (asm-generic/socket.h, Linux 5.11).
const SO_PREFER_BUSY_POLL: libc::c_int = 69;
/// `SO_BUSY_POLL_BUDGET` (asm-generic/socket.h, Linux 5.11).
const SO_BUSY_POLL_BUDGET: libc::c_int = 70;

/// A receive or transmit descriptor (`struct xdp_desc`).
pub(crate) type Desc = libc::xdp_desc;

/// An anonymous shared mapping, unmapped on drop.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    /// `len` bytes of `fd` at `offset` (`None`: anonymous memory).
    fn new(len: usize, fd: Option<RawFd>, offset: libc::off_t) -> io::Result<Self> {
        let (flags, fd) = match fd {
            Some(fd) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd),
            None => (
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
            ),
        };
        // SAFETY: a fresh mapping chosen by the kernel; it aliases nothing
        // of this process (a ring mapping is shared with the kernel only).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave NULL"))?;
        Ok(Self { ptr, len })
    }
}

// SAFETY: the mapping is plain memory owned by this value; which side
// (kernel or user space) may touch which part of it is kept by the rings
// and their owner, not by the thread that holds it.
unsafe impl Send for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `Mapping::new` with this length
        // and nothing refers to it once its owner is dropped.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// The UMEM: one area of anonymous memory the kernel and the engine
/// share. The kernel writes received frames into the chunks user space
/// put in the fill ring and reads transmitted ones from the chunks in
/// the tx ring; [`super::umem::Frames`] keeps track of which is whose.
#[derive(Debug)]
pub(crate) struct Area {
    map: Mapping,
}

// SAFETY: the area hands out bytes only through its unsafe methods, whose
// callers own the range they touch (the ring protocol moves each chunk
// between exactly one owner at a time); threads sharing an area (the two
// ends of an in-process link) keep to that.
unsafe impl Sync for Area {}

impl Area {
    pub(crate) fn new(len: usize) -> io::Result<Self> {
        Ok(Self {
            map: Mapping::new(len, None, 0)?,
        })
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.map.len
    }

    /// `len` bytes at `offset`, to read.
    ///
    /// # Safety
    ///
    /// `offset..offset + len` lies in the area, and neither the kernel
    /// (the range is in no ring) nor a mutable borrow writes it while the
    /// slice lives.
    pub(crate) unsafe fn bytes(&self, offset: u64, len: usize) -> &[u8] {
        debug_assert!(offset as usize + len <= self.map.len);
        // SAFETY: in bounds and unshared, by the caller's contract.
        unsafe { std::slice::from_raw_parts(self.map.ptr.as_ptr().add(offset as usize), len) }
    }

    /// `len` bytes at `offset`, to write.
    ///
    /// # Safety
    ///
    /// As [`Self::bytes`], and nothing else reads the range while the
    /// slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self, offset: u64, len: usize) -> &mut [u8] {
        debug_assert!(offset as usize + len <= self.map.len);
        // SAFETY: in bounds and exclusively the caller's, by its contract.
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr.as_ptr().add(offset as usize), len) }
    }
}

/// One of the four rings of the socket, mapped from the kernel.
#[derive(Debug)]
struct Ring<T> {
    /// Keeps the ring mapped while the pointers below are in use.
    _map: Mapping,
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    flags: NonNull<AtomicU32>,
    descs: NonNull<T>,
    mask: u32,
    size: u32,
    /// Producer rings: the next slot to write; consumer rings: the next
    /// slot to read.
    head: u32,
    /// Producer rings: the consumer position plus `size` (the first slot
    /// not free), as last read; consumer rings: the producer position as
    /// last read.
    limit: u32,
    _t: PhantomData<T>,
}

// SAFETY: the ring is owned by one engine (one thread at a time); its
// pointers lead into the mapping the ring owns.
unsafe impl<T: Send> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    fn map(
        fd: RawFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: libc::off_t,
        producer: bool,
    ) -> io::Result<Self> {
        let len = off.desc as usize + size as usize * size_of::<T>();
        let map = Mapping::new(len, Some(fd), pgoff)?;
        let at = |o: u64| -> NonNull<u8> {
            // SAFETY: the kernel's offsets lie inside the mapping it sized.
            unsafe { map.ptr.add(o as usize) }
        };
        let mut ring = Self {
            producer: at(off.producer).cast(),
            consumer: at(off.consumer).cast(),
            flags: at(off.flags).cast(),
            descs: at(off.desc).cast(),
            _map: map,
            mask: size - 1,
            size,
            head: 0,
            limit: 0,
            _t: PhantomData,
        };
        if producer {
            ring.head = ring.producer().load(Ordering::Relaxed);
            ring.limit = ring.consumer().load(Ordering::Acquire).wrapping_add(size);
        } else {
            ring.head = ring.consumer().load(Ordering::Relaxed);
            ring.limit = ring.producer().load(Ordering::Acquire);
        }
        Ok(ring)
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: a u32 word of the mapping, aligned by the kernel, alive
        // as long as `self.map`.
        unsafe { self.producer.as_ref() }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as `producer`.
        unsafe { self.consumer.as_ref() }
    }

    /// Producer side: how many slots are free, at most `want` (reading
    /// the consumer position only when the cached one shows fewer).
    fn free(&mut self, want: u32) -> u32 {
        let free = self.limit.wrapping_sub(self.head);
        if free >= want {
            return want;
        }
        self.limit = self
            .consumer()
            .load(Ordering::Acquire)
            .wrapping_add(self.size);
        self.limit.wrapping_sub(self.head).min(want)
    }

    /// Producer side: the free slots, read from the consumer position.
    fn free_exact(&mut self) -> u32 {
        self.free(self.size)
    }

    /// Producer side: write the `i`th slot past the head (a free one).
    fn put(&mut self, i: u32, v: T) {
        let slot = self.head.wrapping_add(i) & self.mask;
        // SAFETY: `slot` < `size`, inside the descriptor array; the slot
        // is free (the caller checked `free`), so the kernel does not
        // read it until `submit` publishes it.
        unsafe { self.descs.as_ptr().add(slot as usize).write_volatile(v) }
    }

    /// Producer side: publish `n` written slots.
    fn submit(&mut self, n: u32) {
        self.head = self.head.wrapping_add(n);
        self.producer().store(self.head, Ordering::Release);
    }

    /// Consumer side: how many slots hold entries, at most `want`.
    fn available(&mut self, want: u32) -> u32 {
        let mut n = self.limit.wrapping_sub(self.head);
        if n < want {
            self.limit = self.producer().load(Ordering::Acquire);
            n = self.limit.wrapping_sub(self.head);
        }
        n.min(want)
    }

    /// Consumer side: the `i`th entry past the head (an available one).
    fn get(&self, i: u32) -> T {
        let slot = self.head.wrapping_add(i) & self.mask;
        // SAFETY: `slot` < `size`; the entry was published by the
        // kernel (the caller checked `available`) and is not rewritten
        // until `release` hands the slot back.
        unsafe { self.descs.as_ptr().add(slot as usize).read_volatile() }
    }

    /// Consumer side: hand `n` read slots back.
    fn release(&mut self, n: u32) {
        self.head = self.head.wrapping_add(n);
        self.consumer().store(self.head, Ordering::Release);
    }

    /// Whether the kernel asks to be woken (`XDP_RING_NEED_WAKEUP`).
    fn needs_wakeup(&self) -> bool {
        // SAFETY: as `producer`.
        let flags = unsafe { self.flags.as_ref() };
        flags.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }
}

/// The sizes and mode an [`Xsk`] is made with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct XskLayout {
    /// Bytes of the UMEM area.
    pub(crate) area: usize,
    /// Chunk size (a power of two, 2048 or 4096).
    pub(crate) chunk: u32,
    /// Entries of the fill and rx rings (a power of two).
    pub(crate) rx_ring: u32,
    /// Entries of the tx and completion rings (a power of two).
    pub(crate) tx_ring: u32,
    /// Bind with `XDP_USE_SG`: frames may span several chunks.
    pub(crate) multi_buffer: bool,
    /// Bytes of Tx metadata in front of each transmitted descriptor (0:
    /// none).
    pub(crate) tx_metadata: u32,
}

/// How the socket was bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BindMode {
    /// The driver moves frames in and out of the UMEM itself.
    ZeroCopy,
    /// The kernel copies each frame between its own buffers and the
    /// UMEM; why zero-copy was refused.
    Copy { zero_copy_refused: String },
    /// No socket: one end of an in-process link, whose frames the other
    /// end reads in place.
    Link,
}

/// An AF_XDP socket bound to one receive queue, with its UMEM and rings.
///
/// Fields drop in order: the rings are unmapped, the socket closed
/// (the kernel lets go of the UMEM), then the area is unmapped.
#[derive(Debug)]
pub(crate) struct Xsk {
    fill: Ring<u64>,
    comp: Ring<u64>,
    rx: Ring<Desc>,
    tx: Ring<Desc>,
    fd: OwnedFd,
    pub(crate) area: Area,
    pub(crate) mode: BindMode,
}

fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, v: &T) -> io::Result<()> {
    // SAFETY: `v` is a live value of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (v as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn getsockopt<T: Plain>(fd: RawFd, name: libc::c_int) -> io::Result<T> {
    // SAFETY: all zero bytes are a valid `T` (`Plain`).
    let mut v: T = unsafe { std::mem::zeroed() };
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: `v` is writable for `len` bytes; the kernel writes at most
    // `len` and says how many.
    let r =
        unsafe { libc::getsockopt(fd, libc::SOL_XDP, name, (&mut v as *mut T).cast(), &mut len) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

/// An `InvalidInput` error saying `what`.
pub(crate) fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.into())
}

/// A C struct of integers that `getsockopt` fills in.
///
/// # Safety
///
/// All zero bytes are a valid value of the type.
unsafe trait Plain: Copy {}
// SAFETY: structs of `u64` words only.
unsafe impl Plain for libc::xdp_statistics {}
// SAFETY: as above.
unsafe impl Plain for libc::xdp_mmap_offsets {}

impl Xsk {
    /// A socket on `ifname` queue `queue` with a fresh UMEM of
    /// `layout.area` bytes, registered with unaligned chunks and no
    /// transmit metadata; bound zero-copy where the driver can, else in
    /// copy mode.
    pub(crate) fn new(ifname: &str, queue: u32, layout: XskLayout) -> io::Result<Self> {
        let XskLayout {
            area,
            chunk,
            rx_ring,
            tx_ring,
            multi_buffer,
            tx_metadata,
        } = layout;
        if !chunk.is_power_of_two() || !(2048..=4096).contains(&chunk) {
            return Err(invalid(format!("chunk size {chunk}: 2048 or 4096")));
        }
        if !rx_ring.is_power_of_two() || !tx_ring.is_power_of_two() {
            return Err(invalid("ring sizes are powers of two"));
        }
        let name = CString::new(ifname).map_err(|e| invalid(e.to_string()))?;
        // SAFETY: a NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: plain socket creation.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just created and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let area = Area::new(area)?;
        let meta_flag = if tx_metadata > 0 {
            libc::XDP_UMEM_TX_METADATA_LEN
        } else {
            0
        };
        let reg = libc::xdp_umem_reg {
            addr: area.map.ptr.as_ptr() as u64,
            len: area.len() as u64,
            chunk_size: chunk,
            headroom: 0,
            flags: libc::XDP_UMEM_UNALIGNED_CHUNK_FLAG | meta_flag,
            tx_metadata_len: tx_metadata,
        };
        match setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg) {
            Err(e) if tx_metadata > 0 && e.raw_os_error() == Some(libc::EINVAL) => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("the kernel takes no AF_XDP Tx metadata (Linux 6.11 or later): {e}"),
                ));
            }
            r => r?,
        }
        setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_FILL_RING, &rx_ring)?;
        setsockopt(raw, libc::SOL_XDP, libc::XDP_UMEM_COMPLETION_RING, &tx_ring)?;
        setsockopt(raw, libc::SOL_XDP, libc::XDP_RX_RING, &rx_ring)?;
        setsockopt(raw, libc::SOL_XDP, libc::XDP_TX_RING, &tx_ring)?;
        let off = getsockopt::<libc::xdp_mmap_offsets>(raw, libc::XDP_MMAP_OFFSETS)?;
        let fill = Ring::map(
            raw,
            &off.fr,
            rx_ring,
            libc::XDP_UMEM_PGOFF_FILL_RING as _,
            true,
        )?;
        let comp = Ring::map(
            raw,
            &off.cr,
            tx_ring,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING as _,
            false,
        )?;
        let rx = Ring::map(raw, &off.rx, rx_ring, libc::XDP_PGOFF_RX_RING, false)?;
        let tx = Ring::map(raw, &off.tx, tx_ring, libc::XDP_PGOFF_TX_RING, true)?;
        let base = libc::XDP_USE_NEED_WAKEUP | if multi_buffer { libc::XDP_USE_SG } else { 0 };
        let mode = match bind(raw, ifindex, queue, base | libc::XDP_ZEROCOPY) {
            Ok(()) => BindMode::ZeroCopy,
            Err(zc) => {
                bind(raw, ifindex, queue, base | libc::XDP_COPY).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("AF_XDP bind to {ifname} queue {queue}: {e} (zero-copy: {zc})"),
                    )
                })?;
                BindMode::Copy {
                    zero_copy_refused: zc.to_string(),
                }
            }
        };
        Ok(Self {
            fill,
            comp,
            rx,
            tx,
            fd,
            area,
            mode,
        })
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Turn on preferred busy polling: `usecs` per poll, `budget` frames.
    pub(crate) fn set_busy_poll(&self, usecs: u32, budget: u16) -> io::Result<()> {
        let one: libc::c_int = 1;
        let usecs = libc::c_int::try_from(usecs).map_err(|_| invalid("busy-poll time"))?;
        let budget = libc::c_int::from(budget);
        for (name, v) in [
            (SO_PREFER_BUSY_POLL, one),
            (libc::SO_BUSY_POLL, usecs),
            (SO_BUSY_POLL_BUDGET, budget),
        ] {
            setsockopt(self.fd(), libc::SOL_SOCKET, name, &v)?;
        }
        Ok(())
    }

    /// Run the driver's receive processing on this core (busy polling:
    /// `recvfrom` with no buffer, not waiting).
    pub(crate) fn rx_busy_poll(&self) {
        // SAFETY: a zero-length receive on our own socket; the kernel
        // writes nothing to user memory.
        unsafe {
            libc::recvfrom(
                self.fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
        }
    }

    /// The kernel's counters of this socket (`XDP_STATISTICS`).
    pub(crate) fn statistics(&self) -> io::Result<libc::xdp_statistics> {
        getsockopt(self.fd(), libc::XDP_STATISTICS)
    }

    /// Put up to `addrs.len()` chunk addresses into the fill ring;
    /// returns how many went in.
    ///
    /// # Safety
    ///
    /// Each address starts a chunk of the area that user space owns and
    /// does not touch again until the rx ring hands it back.
    pub(crate) unsafe fn fill(&mut self, addrs: impl ExactSizeIterator<Item = u64>) -> usize {
        let n = self.fill.free(addrs.len() as u32);
        for (i, a) in addrs.take(n as usize).enumerate() {
            self.fill.put(i as u32, a);
        }
        if n > 0 {
            self.fill.submit(n);
        }
        n as usize
    }

    /// Room in the fill ring, at most `want`.
    pub(crate) fn fill_room(&mut self, want: usize) -> usize {
        self.fill.free(want as u32) as usize
    }

    /// Whether the kernel wants a `poll` to take from the fill ring.
    pub(crate) fn fill_needs_wakeup(&self) -> bool {
        self.fill.needs_wakeup()
    }

    /// Received descriptors available, at most `want`.
    pub(crate) fn rx_available(&mut self, want: usize) -> usize {
        self.rx.available(want as u32) as usize
    }

    /// The `i`th available received descriptor, its address an offset
    /// of the area (the kernel reports a chunk's start and, in the top
    /// 16 bits, where in it the data begins).
    pub(crate) fn rx_get(&self, i: usize) -> Desc {
        let mut d = self.rx.get(i as u32);
        d.addr = unaligned_addr(d.addr);
        d
    }

    /// Hand `n` read receive descriptors back to the kernel (their
    /// chunks stay user space's).
    pub(crate) fn rx_release(&mut self, n: usize) {
        if n > 0 {
            self.rx.release(n as u32);
        }
    }

    /// Free slots of the tx ring, at most `want`.
    pub(crate) fn tx_room(&mut self, want: usize) -> usize {
        self.tx.free(want as u32) as usize
    }

    /// Whether the tx ring holds descriptors the kernel has not taken
    /// (read from its consumer position).
    pub(crate) fn tx_ring_holds(&mut self) -> bool {
        self.tx.free_exact() < self.tx.size
    }

    /// Write descriptor `i` past the tx ring's head (within `tx_room`).
    ///
    /// # Safety
    ///
    /// The descriptor covers bytes of the area that user space wrote and
    /// does not touch until the completion ring returns them.
    pub(crate) unsafe fn tx_put(&mut self, i: usize, d: Desc) {
        self.tx.put(i as u32, d);
    }

    /// Publish `n` written tx descriptors.
    pub(crate) fn tx_submit(&mut self, n: usize) {
        if n > 0 {
            self.tx.submit(n as u32);
        }
    }

    /// Whether a transmit needs a `sendto` to start.
    pub(crate) fn tx_needs_wakeup(&self) -> bool {
        self.tx.needs_wakeup()
    }

    /// Kick transmission (`sendto` with no data).
    pub(crate) fn tx_wakeup(&self) -> io::Result<()> {
        // SAFETY: a zero-length send on our own socket.
        let r = unsafe {
            libc::sendto(
                self.fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            // The kernel is busy or out of buffers: the frames stay in the
            // ring for the next kick.
            return match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN) => Ok(()),
                _ => Err(e),
            };
        }
        Ok(())
    }

    /// Wake the kernel's receive side (`poll` with no timeout).
    pub(crate) fn rx_wakeup(&self) {
        let mut p = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no timeout.
        unsafe {
            libc::poll(&mut p, 1, 0);
        }
    }

    /// Completed transmit addresses available, at most `want`.
    pub(crate) fn comp_available(&mut self, want: usize) -> usize {
        self.comp.available(want as u32) as usize
    }

    /// The `i`th available completed address.
    pub(crate) fn comp_get(&self, i: usize) -> u64 {
        self.comp.get(i as u32)
    }

    /// Hand `n` read completion slots back.
    pub(crate) fn comp_release(&mut self, n: usize) {
        if n > 0 {
            self.comp.release(n as u32);
        }
    }
}

/// Whether `ifname` checksums transmitted TCP segments itself
/// (`ethtool -k`'s tx-checksumming): where it does not, the kernel
/// computes a partial checksum in software before the frame leaves.
pub(crate) fn tx_checksumming(ifname: &str) -> io::Result<bool> {
    /// `struct ifreq` with the `ifr_data` member of its union.
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        data: *mut libc::c_void,
        _rest: [u8; 16],
    }
    /// `struct ethtool_value`.
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_GTXCSUM: u32 = 0x16;
    let name = ifname.as_bytes();
    if name.len() >= libc::IFNAMSIZ {
        return Err(invalid(format!("interface name {ifname:?} too long")));
    }
    let mut value = EthtoolValue {
        cmd: ETHTOOL_GTXCSUM,
        data: 0,
    };
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: (&mut value as *mut EthtoolValue).cast(),
        _rest: [0; 16],
    };
    req.name[..name.len()].copy_from_slice(name);
    // SAFETY: a datagram socket only to carry the ioctl.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just created and owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: `req` is a valid ifreq whose data points at `value`, both
    // alive across the call; the kernel writes `value` only.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), SIOCETHTOOL, &mut req) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value.data != 0)
}

/// The area offset an unaligned-mode descriptor address stands for.
pub(crate) fn unaligned_addr(a: u64) -> u64 {
    (a & libc::XSK_UNALIGNED_BUF_ADDR_MASK).wrapping_add(a >> libc::XSK_UNALIGNED_BUF_OFFSET_SHIFT)
}

fn bind(fd: RawFd, ifindex: u32, queue: u32, flags: u16) -> io::Result<()> {
    let sa = libc::sockaddr_xdp {
        sxdp_family: libc::AF_XDP as u16,
        sxdp_flags: flags,
        sxdp_ifindex: ifindex,
        sxdp_queue_id: queue,
        sxdp_shared_umem_fd: 0,
    };
    // SAFETY: a valid sockaddr_xdp of the size passed.
    let r = unsafe {
        libc::bind(
            fd,
            (&sa as *const libc::sockaddr_xdp).cast(),
            size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
