//! The UMEM of one AF_XDP socket, its four rings and the frame pool.
//!
//! The area holds two parts:
//!
//! * **receive chunks**, `rx_slots` of them. In copy mode chunk `s`
//!   starts at `s × (chunk − 256)`: the kernel writes a frame after the
//!   256 bytes of XDP headroom, so the data part of each chunk ends where
//!   the next one's begins, and a frame the kernel spreads over several
//!   chunks taken from the fill ring in order lies in one piece of the
//!   area. smoltcp reads it there, as it reads a frame of one chunk. The
//!   fill ring is stocked in slot order for that; a frame whose chunks
//!   do not follow each other (at the wrap from the last slot to the
//!   first, or in zero-copy mode, where chunks are page-aligned and a
//!   driver may recycle them in any order) is gathered into a buffer of
//!   the device, counted in [`RingCounters::rx_gathered`].
//! * **transmit slots**, each as long as the largest frame rounded up to
//!   whole chunks: smoltcp writes a frame into one slot in one piece,
//!   and the tx ring gets one descriptor per chunk of it
//!   (`XDP_PKT_CONTD` on all but the last).
//!
//! Ownership of a chunk or slot moves between user space and the kernel
//! only through the rings; each is in exactly one place at a time:
//!
//! * free (user space, unused: `rx_free`, `tx_free`),
//! * the fill ring (the kernel may write a received frame into it),
//! * a received frame in the device's queue or in `recycle` (user space,
//!   holding received bytes),
//! * `tx_pending` (user space, written by smoltcp, not submitted yet),
//! * the tx ring until the completion ring hands every chunk of the slot
//!   back.
//!
//! Every unsafe ring or area call below relies on that invariant: memory
//! passed to the kernel is not touched again until it comes back, and
//! every address lies in this one area.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;

use iwarp_tcp::csum::Checked;

use super::link::End;
use super::xsk::{invalid, Area, BindMode, Desc, Xsk, XskLayout, XDP_HEADROOM};

/// Most frames taken from the rx ring per burst, as many as smoltcp's
/// ingress budget takes per poll (`iwarp_tcp::Config::ingress_budget`).
/// A pass also walks every connection, so with many connections the frames
/// one pass handles pay for that walk: at 64, a sender of 1024 QPs spent
/// most of its core in such walks for every 64 acknowledgements.
pub(crate) const RX_BURST: usize = 256;
/// Most `sendto` kicks per transmit burst (copy mode sends at most 32
/// frames per call).
const MAX_KICKS: usize = 16;
/// Frames written for transmit after which the device submits them (and
/// kicks the kernel) during the engine's pass rather than at its end
/// (counted in [`RingCounters::tx_early_bursts`]). In copy mode the
/// kernel reads each frame back to copy it into an skb: a pass that
/// sends turns for many connections writes hundreds of frames, and the
/// socket-buffer bytes they were copied from with them, so by the pass's
/// end the first frames have left the core's cache (`bench/README.md`,
/// "Many connections").
pub const TX_FLUSH_FRAMES: usize = 64;

/// Counters of the rings (monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingCounters {
    /// Frames taken from the rx ring.
    pub rx_frames: u64,
    /// Of those, frames that spanned several chunks (multi-buffer).
    pub rx_multi_buffer: u64,
    /// Multi-buffer frames whose chunks did not lie one after the other,
    /// copied into one buffer before smoltcp read them.
    pub rx_gathered: u64,
    /// Received frames dropped because their descriptors were
    /// inconsistent: a chunk outside the receive part of the UMEM or not
    /// at a chunk's data start, a part of a frame shorter than a chunk
    /// before its last, more parts than the largest frame needs, or a
    /// length that differs from the IPv4 header's. Never placed.
    pub rx_bad_frames: u64,
    /// Multi-buffer frames dropped because no gather buffer was free.
    pub rx_gather_full: u64,
    /// Frames submitted to the tx ring.
    pub tx_frames: u64,
    /// Frames returned by the completion ring.
    pub tx_completed: u64,
    /// `sendto` calls that kicked transmission.
    pub tx_kicks: u64,
    /// Frames dropped on transmit because no free frame was left.
    pub tx_no_frame: u64,
    /// Passes that found the fill ring without a free frame to add.
    pub fill_starved: u64,
    /// Receive chunks the fill ring's order passed over because they were
    /// not back while the ring ran low.
    pub fill_skipped: u64,
    /// Fill-ring wake-ups (`poll`) the kernel asked for.
    pub fill_wakeups: u64,
    /// Received TCP segments whose checksum a virtual peer left partial
    /// (checksum offload) and the engine finished
    /// (`iwarp_tcp::csum::check`).
    pub rx_csum_completed: u64,
    /// Received TCP segments whose checksum failed, dropped before the
    /// stack: the device tells smoltcp that it verifies TCP checksums.
    pub rx_csum_bad: u64,
    /// Transmit bursts submitted during a pass because
    /// [`TX_FLUSH_FRAMES`] frames were waiting.
    pub tx_early_bursts: u64,
    /// TCP segments sent with a checksum request in their Tx metadata
    /// (the kernel or the interface finishes the checksum).
    pub tx_csum_offloaded: u64,
    /// Busy polls (`recvfrom`) of passes that found the rx ring empty
    /// ([`XdpConfig::socket_busy_poll`](super::XdpConfig::socket_busy_poll)).
    pub rx_busy_polls: u64,
    /// In-process link: frames sent while no engine ran on the other end
    /// (dropped, as on a wire without a receiver).
    pub tx_unreached: u64,
}

/// Where the UMEM's parts lie and how large they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Chunk size.
    pub(crate) chunk: u32,
    /// Distance between two receive chunks: `chunk − 256` in copy mode
    /// (their data parts touch), `chunk` in zero-copy mode.
    pub(crate) stride: u64,
    /// Receive chunks.
    pub(crate) rx_slots: u32,
    /// The largest frame (Ethernet header included).
    pub(crate) frame_len: usize,
    /// Most chunks a received frame takes.
    pub(crate) rx_parts: usize,
    /// Where the transmit slots start.
    pub(crate) tx_base: u64,
    /// Bytes of one transmit slot (whole chunks).
    pub(crate) tx_slot: u64,
    /// Transmit slots.
    pub(crate) tx_slots: u32,
    /// Entries of the fill and rx rings.
    pub(crate) rx_ring: u32,
    /// Entries of the tx and completion rings.
    pub(crate) tx_ring: u32,
    /// Bytes of AF_XDP Tx metadata in front of every transmitted frame
    /// ([`TX_META`] or 0).
    pub(crate) tx_meta: u32,
    /// Most descriptors a transmitted frame takes.
    pub(crate) tx_parts: usize,
}

/// Bytes the engine registers for AF_XDP Tx metadata in front of a
/// transmitted frame: `struct xsk_tx_metadata` (flags, then the checksum
/// request's start and offset; 24 bytes since Linux 6.14 added a launch
/// time, 16 before), a multiple of 8 as the kernel wants.
pub(crate) const TX_META: u32 = 24;

impl Layout {
    /// The layout for `frames` frames (half to receive, half to
    /// transmit, as many chunks as a frame of `frame_len` bytes takes
    /// each) in chunks of `chunk` bytes.
    /// `tx_meta` bytes of Tx metadata go in front of every transmitted
    /// frame, and in front of each of its descriptors (the kernel checks
    /// every descriptor with the metadata length), so a descriptor
    /// carries at most `chunk − tx_meta` bytes of it.
    pub(crate) fn new(frames: u32, chunk: u32, frame_len: usize, tx_meta: u32) -> io::Result<Self> {
        if !(chunk == 2048 || chunk == 4096) {
            return Err(invalid(format!("chunk size {chunk}: 2048 or 4096")));
        }
        let data = (chunk - XDP_HEADROOM) as usize;
        let rx_parts = frame_len.div_ceil(data).max(1);
        let tx_parts = frame_len.div_ceil((chunk - tx_meta) as usize).max(1);
        if rx_parts > MAX_PARTS || frame_len > 65_535 + 14 {
            return Err(invalid(format!(
                "a frame of {frame_len} bytes does not fit {MAX_PARTS} chunks of {chunk}"
            )));
        }
        // Frames a direction holds: half of `frames`, as many as fit
        // MAX_DIRECTION_BYTES of frames of this size.
        let fit = (MAX_DIRECTION_BYTES / frame_len.max(1)).max(64) as u32;
        let half = (frames / 2)
            .next_power_of_two()
            .max(64)
            .min(prev_power_of_two(fit));
        let rx_ring = (half as usize * rx_parts).next_power_of_two().min(MAX_RING) as u32;
        let tx_ring = (half as usize * tx_parts).next_power_of_two().min(MAX_RING) as u32;
        // Beyond what the fill ring holds, the frames of the bursts the
        // device holds: the slot the fill ring takes next is then
        // always back.
        let rx_slots = rx_ring + held_slots(half, rx_parts);
        let tx_slot = (u64::from(tx_meta) + frame_len as u64).next_multiple_of(u64::from(chunk));
        let tx_slots = (tx_ring / tx_parts as u32).max(1);
        let tx_base = tx_base(rx_slots, chunk);
        Ok(Self {
            chunk,
            stride: u64::from(chunk - XDP_HEADROOM),
            rx_slots,
            frame_len,
            rx_parts,
            tx_base,
            tx_slot,
            tx_slots,
            rx_ring,
            tx_ring,
            tx_meta,
            tx_parts,
        })
    }

    /// Ring sizes other than the derived ones (powers of two); the
    /// receive chunks follow the fill ring's, the transmit slots the tx
    /// ring's.
    pub(crate) fn set_rings(&mut self, rx: Option<u32>, tx: Option<u32>) -> io::Result<()> {
        let bad = |n: u32| !n.is_power_of_two() || n < 64 || n as usize > MAX_RING;
        if rx.is_some_and(bad) || tx.is_some_and(bad) {
            return Err(invalid(format!(
                "ring sizes {rx:?}/{tx:?}: powers of two from 64 to {MAX_RING}"
            )));
        }
        if let Some(rx) = rx {
            self.rx_ring = rx;
            self.rx_slots = rx + held_slots(rx / self.rx_parts as u32, self.rx_parts);
            self.tx_base = tx_base(self.rx_slots, self.chunk);
        }
        if let Some(tx) = tx {
            self.tx_ring = tx;
            self.tx_slots = (tx / self.tx_parts as u32).max(1);
        }
        Ok(())
    }

    /// Bytes of the area.
    pub(crate) fn area(&self) -> usize {
        (self.tx_base + self.tx_slot * u64::from(self.tx_slots)) as usize
    }

    /// Whether a frame takes several chunks.
    pub(crate) fn multi_buffer(&self) -> bool {
        self.rx_parts > 1 || self.tx_parts > 1
    }

    /// Data bytes of one receive chunk.
    fn data(&self) -> u64 {
        u64::from(self.chunk - XDP_HEADROOM)
    }

    /// The fill-ring address of receive chunk `slot`.
    fn rx_addr(&self, slot: u32) -> u64 {
        u64::from(slot) * self.stride
    }

    /// The slot whose data part starts at `addr` (a received
    /// descriptor's address), if one does.
    fn rx_slot(&self, addr: u64) -> Option<u32> {
        let off = addr.checked_sub(u64::from(XDP_HEADROOM))?;
        let slot = off / self.stride;
        (off % self.stride == 0 && slot < u64::from(self.rx_slots)).then_some(slot as u32)
    }

    /// Where transmit slot `slot` starts (its metadata, then its frame).
    fn tx_addr(&self, slot: u32) -> u64 {
        self.tx_base + u64::from(slot) * self.tx_slot
    }

    /// The tx slot an address of a transmit chunk belongs to.
    fn tx_slot_of(&self, addr: u64) -> Option<u32> {
        let off = addr.checked_sub(self.tx_base)?;
        let slot = off / self.tx_slot;
        (slot < u64::from(self.tx_slots)).then_some(slot as u32)
    }
}

/// Where the transmit slots start after `rx_slots` receive chunks: sized
/// for the zero-copy stride (`chunk`), the larger one, page-aligned.
fn tx_base(rx_slots: u32, chunk: u32) -> u64 {
    (u64::from(rx_slots) * u64::from(chunk)).next_multiple_of(4096)
}

/// Bytes of frames one direction of the UMEM holds at most by default
/// (at MTU 65535 that is 512 frames, not 2048).
const MAX_DIRECTION_BYTES: usize = 32 << 20;

/// The largest power of two at most `n` (`n` ≥ 1).
fn prev_power_of_two(n: u32) -> u32 {
    1 << (31 - n.max(1).leading_zeros())
}

/// Receive chunks beyond the fill ring's: those of the frames the device
/// holds between bursts (at most two bursts, at most a direction's
/// frames), so the chunk the fill ring takes next is always back.
fn held_slots(frames: u32, parts: usize) -> u32 {
    ((2 * RX_BURST).min(frames as usize) * parts) as u32
}

/// Most chunks a frame may take: one Ethernet frame of 64 KiB in data
/// parts of 1792 bytes.
const MAX_PARTS: usize = 37;
/// Largest ring the engine asks for.
const MAX_RING: usize = 1 << 16;

/// A received frame the device holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RxFrame {
    /// Bytes of the frame.
    pub(crate) len: u32,
    pub(crate) at: RxAt,
}

/// Where a received frame's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RxAt {
    /// In the area from `addr`, in `slots` receive chunks from `slot` on.
    Umem { addr: u64, slot: u32, slots: u16 },
    /// In-process link: in the other end's transmit slot at `addr`, lent
    /// until given back.
    Lent { addr: u64 },
    /// In gather buffer `n` (its chunks are free again).
    Gathered(u16),
}

/// What one received descriptor run turned into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parsed {
    /// A frame in consecutive chunks from `slot`, its data in one piece.
    Whole { slot: u32, slots: u16, len: u32 },
    /// A frame whose chunks do not follow each other (read from the
    /// descriptors again to gather).
    Scattered { len: u32 },
    /// Inconsistent descriptors: counted, chunks recycled, never placed.
    Bad,
}

/// Judge the descriptors of one frame (all but the last with
/// `XDP_PKT_CONTD`). Only checks what can be checked without reading the
/// frame.
fn parse(layout: &Layout, descs: &[Desc]) -> Parsed {
    let data = layout.data();
    let mut len = 0u64;
    let mut run = true;
    let mut first = 0;
    for (i, d) in descs.iter().enumerate() {
        let Some(slot) = layout.rx_slot(d.addr) else {
            return Parsed::Bad;
        };
        let last = i + 1 == descs.len();
        if u64::from(d.len) > data || (!last && u64::from(d.len) != data) || d.len == 0 {
            return Parsed::Bad;
        }
        if i == 0 {
            first = slot;
        } else if slot != first.wrapping_add(i as u32) || layout.stride != data {
            run = false;
        }
        len += u64::from(d.len);
    }
    if descs.len() > layout.rx_parts || len > layout.frame_len as u64 || descs.is_empty() {
        return Parsed::Bad;
    }
    let len = len as u32;
    if run {
        Parsed::Whole {
            slot: first,
            slots: descs.len() as u16,
            len,
        }
    } else {
        Parsed::Scattered { len }
    }
}

/// What one more received descriptor makes of the frame being read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// More parts follow (`XDP_PKT_CONTD`).
    More,
    /// `parts` holds a whole frame: its last part, or one part more than
    /// the largest frame takes (then judged bad, and the parts after it
    /// up to its last are skipped).
    Frame,
    /// `parts` holds a part of a frame that had too many: drop it.
    Skipped,
}

/// Add received descriptor `d` to `parts`, the frame being read; `max`
/// is the most parts a frame takes, `skipping` whether the parts read are
/// the rest of a frame that had more.
fn cut(parts: &mut Vec<Desc>, skipping: &mut bool, max: usize, d: Desc) -> Cut {
    let more = d.options & libc::XDP_PKT_CONTD != 0;
    parts.push(d);
    if *skipping {
        *skipping = more;
        return Cut::Skipped;
    }
    if more && parts.len() <= max {
        return Cut::More;
    }
    *skipping = more;
    Cut::Frame
}

/// Whether a multi-buffer frame's length is what its IPv4 header says
/// (other frames: nothing to check here).
fn length_matches(frame: &[u8]) -> bool {
    match frame.get(12..14) {
        Some([0x08, 0x00]) => {}
        _ => return true,
    }
    match frame.get(16..18) {
        Some(&[hi, lo]) => usize::from(u16::from_be_bytes([hi, lo])) + 14 == frame.len(),
        _ => false,
    }
}

/// The UMEM, its rings and the chunks user space owns.
pub(crate) struct Frames {
    port: Port,
    pub(crate) layout: Layout,
    /// Receive chunks user space owns and does not use.
    rx_free: Vec<bool>,
    /// The slot the fill ring takes next (slot order keeps multi-buffer
    /// frames in one piece).
    fill_next: u32,
    /// The receive chunks one refill puts into the fill ring.
    fill_slots: Vec<u32>,
    /// Received frames smoltcp is done with.
    pub(crate) recycle: Vec<RxFrame>,
    /// Gather buffers (multi-buffer frames in scattered chunks) and the
    /// free ones.
    pub(crate) gather: Vec<Box<[u8]>>,
    gather_free: Vec<u16>,
    /// Transmit slots user space owns and does not use.
    pub(crate) tx_free: Vec<u32>,
    /// Chunks of each transmit slot the kernel has not completed.
    tx_out: Vec<u8>,
    /// Frames written for transmit (slot, length), not yet in the tx ring.
    pub(crate) tx_pending: VecDeque<(u32, u32)>,
    /// `tx_pending` length at which the frames are submitted during the
    /// pass: [`TX_FLUSH_FRAMES`] more than the last burst left behind
    /// (a full tx ring does not make every frame written try again).
    flush_at: usize,
    /// Chunks in the fill ring.
    in_fill: usize,
    /// Transmit slots in the tx ring or not yet completed.
    in_tx: usize,
    /// A frame was wanted for transmit and none was free; cleared when
    /// completions return frames.
    starved: bool,
    /// Received descriptors of the frame being read.
    descs: Vec<Desc>,
    /// The parts read belong to a frame with more parts than the largest
    /// frame takes: skip them up to its last (see [`cut`]).
    skipping: bool,
    /// Preferred busy polling is on: a burst that finds the rx ring
    /// empty runs the driver's receive processing.
    busy_poll: bool,
    /// `None`: TCP transmit checksums are offloaded through Tx metadata;
    /// else why not (smoltcp computes them).
    pub(crate) csum_offload: Option<String>,
    pub(crate) counters: RingCounters,
}

/// What moves the frames: an AF_XDP socket (the kernel) or one end of
/// an in-process link.
// One per engine; boxing the socket would put an indirection in front of
// every ring access.
#[allow(clippy::large_enum_variant)]
enum Port {
    Socket(Xsk),
    Link(End),
}

/// The area of `port`'s frames.
fn area_of(port: &Port) -> &Area {
    match port {
        Port::Socket(x) => &x.area,
        Port::Link(e) => e.area(),
    }
}

/// The bind mode an in-process link reports.
static LINK_MODE: BindMode = BindMode::Link;

/// How to make a [`Frames`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Options {
    pub(crate) frames: u32,
    pub(crate) chunk: u32,
    pub(crate) frame_len: usize,
    /// Fill/rx and tx/completion ring entries, if not the layout's.
    pub(crate) rx_ring: Option<u32>,
    pub(crate) tx_ring: Option<u32>,
    /// Preferred busy polling: microseconds and budget.
    pub(crate) busy_poll: Option<(u32, u16)>,
    /// Offload TCP transmit checksums where the kernel and interface can.
    pub(crate) csum_offload: bool,
}

impl Options {
    /// What `cfg` asks of its engines' sockets.
    pub(crate) fn of(cfg: &super::XdpConfig) -> Self {
        Self {
            frames: cfg.frames,
            chunk: cfg.frame_size(),
            frame_len: cfg.frame_len(),
            rx_ring: cfg.rx_ring,
            tx_ring: cfg.tx_ring,
            busy_poll: cfg.socket_busy_poll.map(|b| (b.usecs, b.budget)),
            csum_offload: cfg.tx_csum_offload,
        }
    }
}

impl std::fmt::Debug for Frames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frames")
            .field("layout", &self.layout)
            .field("mode", self.mode())
            .field("tx_free", &self.tx_free.len())
            .field("in_fill", &self.in_fill)
            .field("in_tx", &self.in_tx)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl Frames {
    /// A UMEM for `o.frames` frames of up to `o.frame_len` bytes in
    /// chunks of `o.chunk` bytes (2048 or 4096), and an AF_XDP socket
    /// bound to `ifname` queue `queue`, zero-copy where the driver can,
    /// else in copy mode, multi-buffer when a frame takes more than one
    /// chunk.
    pub(crate) fn new(ifname: &str, queue: u32, o: &Options) -> io::Result<Self> {
        let Options {
            frames,
            chunk,
            frame_len,
            ..
        } = *o;
        let make = |tx_meta: u32| -> io::Result<(Layout, Xsk)> {
            let mut layout = Layout::new(frames, chunk, frame_len, tx_meta)?;
            layout.set_rings(o.rx_ring, o.tx_ring)?;
            let xsk = Xsk::new(
                ifname,
                queue,
                XskLayout {
                    area: layout.area(),
                    chunk,
                    rx_ring: layout.rx_ring,
                    tx_ring: layout.tx_ring,
                    multi_buffer: layout.multi_buffer(),
                    tx_metadata: tx_meta,
                },
            )?;
            Ok((layout, xsk))
        };
        // Tx metadata (the checksum offload) where the kernel takes it and
        // the interface checksums on transmit; the reason where not.
        let mut csum = if o.csum_offload {
            tx_csum_offload(ifname)
        } else {
            Err("turned off".into())
        };
        let mut made = None;
        if csum.is_ok() {
            match make(TX_META) {
                Ok((l, x)) if x.mode == BindMode::ZeroCopy && l.multi_buffer() => {
                    // Every descriptor needs the metadata's room in front
                    // of it within its page, which a zero-copy frame of
                    // several chunks written in one piece does not leave.
                    // The socket is closed (dropped here) before the next
                    // one binds the same queue.
                    csum = Err("zero-copy multi-buffer frames carry no metadata".into());
                }
                Ok(m) => made = Some(m),
                Err(e) if e.kind() == io::ErrorKind::Unsupported => csum = Err(e.to_string()),
                Err(e) => return Err(e),
            }
        }
        let (mut layout, xsk) = match made {
            Some(m) => m,
            None => make(0)?,
        };
        if xsk.mode == BindMode::ZeroCopy {
            // Page-aligned chunks: a driver maps each one for DMA.
            layout.stride = u64::from(chunk);
        }
        if let Some((usecs, budget)) = o.busy_poll {
            xsk.set_busy_poll(usecs, budget)?;
        }
        let gathers = if layout.rx_parts > 1 { RX_BURST } else { 0 };
        let mut me = Self::with(Port::Socket(xsk), layout, gathers);
        me.busy_poll = o.busy_poll.is_some();
        me.csum_offload = csum.err();
        me.refill();
        Ok(me)
    }

    /// The frame pool of `layout` over `port`, every slot free, with
    /// `gathers` gather buffers; no busy polling, checksums offloaded.
    fn with(port: Port, layout: Layout, gathers: usize) -> Self {
        Self {
            port,
            rx_free: vec![true; layout.rx_slots as usize],
            fill_next: 0,
            fill_slots: Vec::with_capacity(layout.rx_ring as usize),
            recycle: Vec::with_capacity(2 * RX_BURST),
            gather: (0..gathers)
                .map(|_| vec![0u8; layout.frame_len].into_boxed_slice())
                .collect(),
            gather_free: (0..gathers as u16).rev().collect(),
            tx_free: (0..layout.tx_slots).rev().collect(),
            tx_out: vec![0; layout.tx_slots as usize],
            tx_pending: VecDeque::with_capacity(layout.tx_slots as usize),
            flush_at: TX_FLUSH_FRAMES,
            in_fill: 0,
            in_tx: 0,
            starved: false,
            descs: Vec::with_capacity(layout.rx_parts + 1),
            skipping: false,
            busy_poll: false,
            csum_offload: None,
            counters: RingCounters::default(),
            layout,
        }
    }

    /// Frames on end `end` of an in-process link: its transmit slots,
    /// and the other end's frames lent to it. TCP transmit checksums are
    /// left to the receiving end (nothing else would compute them).
    pub(crate) fn link(end: &End) -> io::Result<Self> {
        let layout = end.layout();
        end.open()?;
        Ok(Self::with(Port::Link(end.clone()), layout, 0))
    }

    /// The socket's file descriptor (for the XSKMAP); on a link, the
    /// end's eventfd.
    pub(crate) fn fd(&self) -> RawFd {
        match &self.port {
            Port::Socket(x) => x.fd(),
            Port::Link(e) => e.fd(),
        }
    }

    /// The descriptor a thread about to sleep waits on: the socket
    /// (readable when frames arrive), or the link end's eventfd, armed
    /// (the other end writes it after its next frame).
    pub(crate) fn sleep_fd(&self) -> RawFd {
        match &self.port {
            Port::Socket(x) => x.fd(),
            Port::Link(e) => e.arm(),
        }
    }

    /// How the socket was bound.
    pub(crate) fn mode(&self) -> &BindMode {
        match &self.port {
            Port::Socket(x) => &x.mode,
            Port::Link(_) => &LINK_MODE,
        }
    }

    /// Whether the socket is bound in zero-copy mode.
    pub(crate) fn zero_copy(&self) -> bool {
        *self.mode() == BindMode::ZeroCopy
    }

    /// Frames the fill ring holds when full (chunks over chunks per
    /// frame).
    pub(crate) fn fill_frames(&self) -> usize {
        self.layout.rx_ring as usize / self.layout.rx_parts
    }

    /// The kernel's socket statistics.
    pub(crate) fn xdp_statistics(&self) -> Option<libc::xdp_statistics> {
        match &self.port {
            Port::Socket(x) => x.statistics().ok(),
            Port::Link(_) => None,
        }
    }

    /// The bytes of received frame `f`.
    pub(crate) fn bytes(&self, f: &RxFrame) -> &[u8] {
        rx_bytes(area_of(&self.port), &self.gather, f)
    }

    /// The parts the device's tokens borrow at once.
    pub(crate) fn split(&mut self) -> Split<'_> {
        Split {
            area: area_of(&self.port),
            gather: &self.gather,
            recycle: &mut self.recycle,
            tx_free: &mut self.tx_free,
            tx_pending: &mut self.tx_pending,
            counters: &mut self.counters,
            layout: self.layout,
        }
    }

    /// Take up to [`RX_BURST`] received frames into `out`, whole: the
    /// descriptors of a frame whose last part has not arrived stay in the
    /// ring.
    pub(crate) fn rx_burst(&mut self, out: &mut VecDeque<RxFrame>) -> usize {
        let xsk = match &mut self.port {
            Port::Socket(x) => x,
            Port::Link(_) => return self.link_rx_burst(out),
        };
        let want = RX_BURST * self.layout.rx_parts;
        let mut avail = xsk.rx_available(want);
        if avail == 0 && self.busy_poll {
            self.counters.rx_busy_polls += 1;
            xsk.rx_busy_poll();
            avail = xsk.rx_available(want);
        }
        let mut used = 0;
        let mut frames = 0;
        let mut i = 0;
        while i < avail && frames < RX_BURST {
            let Port::Socket(xsk) = &self.port else {
                break;
            };
            let d = xsk.rx_get(i);
            i += 1;
            match cut(&mut self.descs, &mut self.skipping, self.layout.rx_parts, d) {
                Cut::More => {}
                Cut::Skipped => {
                    self.free_descs();
                    self.in_fill = self.in_fill.saturating_sub(self.descs.len());
                    self.descs.clear();
                    used = i;
                }
                Cut::Frame => {
                    used = i;
                    frames += 1;
                    self.take_frame(out);
                    self.descs.clear();
                }
            }
        }
        // An unfinished frame's parts are read again next time.
        self.descs.clear();
        if let Port::Socket(xsk) = &mut self.port {
            xsk.rx_release(used);
        }
        self.counters.rx_frames += frames as u64;
        frames
    }

    /// [`Self::rx_burst`] on a link: the frames the other end lent.
    fn link_rx_burst(&mut self, out: &mut VecDeque<RxFrame>) -> usize {
        let Port::Link(end) = &self.port else {
            return 0;
        };
        let mut frames = 0;
        while frames < RX_BURST {
            let Some((addr, len)) = end.receive() else {
                break;
            };
            frames += 1;
            let frame = RxFrame {
                len,
                at: RxAt::Lent { addr },
            };
            let mut checks = Checks {
                area: end.area(),
                gather: &mut self.gather,
                counters: &mut self.counters,
                recycle: &mut self.recycle,
            };
            checks.frame(frame, false, out);
        }
        self.counters.rx_frames += frames as u64;
        frames
    }

    /// Turn the descriptors in `self.descs` (one frame) into a frame in
    /// `out`, or drop them.
    fn take_frame(&mut self, out: &mut VecDeque<RxFrame>) {
        let n = self.descs.len();
        self.in_fill = self.in_fill.saturating_sub(n);
        if n > 1 {
            self.counters.rx_multi_buffer += 1;
        }
        let frame = match parse(&self.layout, &self.descs) {
            Parsed::Whole { slot, slots, len } => {
                let addr = self.layout.rx_addr(slot) + u64::from(XDP_HEADROOM);
                RxFrame {
                    len,
                    at: RxAt::Umem { addr, slot, slots },
                }
            }
            Parsed::Scattered { len } => match self.gather_frame(len) {
                Some(g) => {
                    self.counters.rx_gathered += 1;
                    RxFrame {
                        len,
                        at: RxAt::Gathered(g),
                    }
                }
                None => {
                    self.counters.rx_gather_full += 1;
                    self.free_descs();
                    return;
                }
            },
            Parsed::Bad => {
                self.counters.rx_bad_frames += 1;
                self.free_descs();
                return;
            }
        };
        let mut checks = Checks {
            area: area_of(&self.port),
            gather: &mut self.gather,
            counters: &mut self.counters,
            recycle: &mut self.recycle,
        };
        checks.frame(frame, n > 1, out);
    }

    /// Copy the scattered parts in `self.descs` into a free gather buffer
    /// and free their chunks.
    fn gather_frame(&mut self, len: u32) -> Option<u16> {
        let g = self.gather_free.pop()?;
        let buf = &mut self.gather[usize::from(g)];
        let mut at = 0;
        for d in &self.descs {
            let n = d.len as usize;
            // SAFETY: `parse` checked the descriptor lies in a receive
            // chunk's data part; the chunk is user space's (the rx ring
            // handed it over) until freed below.
            let src = unsafe { area_of(&self.port).bytes(d.addr, n) };
            buf[at..at + n].copy_from_slice(src);
            at += n;
        }
        debug_assert_eq!(at, len as usize);
        self.free_descs();
        Some(g)
    }

    /// Free the chunks of the descriptors in `self.descs` that lie in
    /// the receive part.
    fn free_descs(&mut self) {
        for d in &self.descs {
            if let Some(slot) = self.layout.rx_slot(d.addr) {
                if let Some(f) = self.rx_free.get_mut(slot as usize) {
                    *f = true;
                }
            }
        }
    }

    /// Give consumed frames back and top the fill ring up, in slot
    /// order.
    pub(crate) fn refill(&mut self) {
        if let Port::Link(end) = &self.port {
            if !self.recycle.is_empty() {
                for f in self.recycle.drain(..) {
                    if let RxAt::Lent { addr } = f.at {
                        end.give_back(addr);
                    }
                }
                end.wake_peer();
            }
            return;
        }
        for f in self.recycle.drain(..) {
            match f.at {
                RxAt::Umem { slot, slots, .. } => {
                    for k in 0..u32::from(slots) {
                        let s = (slot + k) % self.layout.rx_slots;
                        self.rx_free[s as usize] = true;
                    }
                }
                RxAt::Gathered(g) => self.gather_free.push(g),
                RxAt::Lent { .. } => {}
            }
        }
        let Port::Socket(xsk) = &mut self.port else {
            return;
        };
        let room = (self.layout.rx_ring as usize).saturating_sub(self.in_fill);
        let room = xsk.fill_room(room);
        let slots = self.layout.rx_slots;
        // A slot that is not back stops the fill ring's order, unless the
        // ring runs low: then the slots after it go in (a driver that
        // keeps chunks to itself, or a chunk the kernel never returned,
        // must not starve the ring; frames across the gap are gathered).
        let low = self.in_fill < self.layout.rx_ring as usize / 4;
        let mut s = self.fill_next;
        let mut looked = 0;
        while self.fill_slots.len() < room && looked < slots {
            looked += 1;
            if self.rx_free[s as usize] {
                self.rx_free[s as usize] = false;
                self.fill_slots.push(s);
            } else if !low {
                break;
            } else {
                self.counters.fill_skipped += 1;
            }
            s = (s + 1) % slots;
        }
        if self.fill_slots.is_empty() {
            if room > 0 {
                self.counters.fill_starved += 1;
            }
            return;
        }
        let layout = self.layout;
        let addrs = self.fill_slots.iter().map(|&slot| layout.rx_addr(slot));
        // SAFETY: the slots were free (user space's, unused) and are
        // marked taken above; they are not touched until the rx ring
        // hands them back.
        let done = unsafe { xsk.fill(addrs) };
        if let Some(&first) = self.fill_slots.get(done) {
            // The ring had less room than it said: those slots stay free,
            // and the order resumes at the first of them.
            for &slot in &self.fill_slots[done..] {
                self.rx_free[slot as usize] = true;
            }
            s = first;
        }
        self.fill_slots.clear();
        self.fill_next = s;
        self.in_fill += done;
        if xsk.fill_needs_wakeup() {
            self.counters.fill_wakeups += 1;
            xsk.rx_wakeup();
        }
    }

    /// Reclaim transmitted slots from the completion ring.
    fn reclaim(&mut self) {
        if self.in_tx == 0 {
            return;
        }
        let mut slots = 0;
        let mut done = |addr: u64| {
            let Some(slot) = self.layout.tx_slot_of(addr) else {
                return;
            };
            let left = &mut self.tx_out[slot as usize];
            *left = left.saturating_sub(1);
            if *left == 0 {
                self.tx_free.push(slot);
                slots += 1;
            }
        };
        match &mut self.port {
            Port::Socket(xsk) => {
                let n = xsk.comp_available(self.layout.tx_ring as usize);
                for i in 0..n {
                    done(xsk.comp_get(i));
                }
                xsk.comp_release(n);
            }
            Port::Link(end) => {
                while let Some(addr) = end.completed() {
                    done(addr);
                }
            }
        }
        self.starved &= slots == 0;
        self.in_tx -= slots.min(self.in_tx);
        self.counters.tx_completed += slots as u64;
    }

    /// Submit written frames to the tx ring and kick the kernel while the
    /// ring holds frames it has not taken (copy mode transmits only inside
    /// `sendto`, at most a batch a call); reclaim the completion ring
    /// first and after each kick. Frames the kernel took and has not
    /// completed need no kick: their completions come when the kernel
    /// lets the copies go (in copy mode when the receiving side frees
    /// them, often on another core), and a `sendto` in the meantime
    /// finds an empty ring and only costs a system call.
    pub(crate) fn tx_burst(&mut self) -> usize {
        if let Port::Link(_) = self.port {
            self.reclaim();
            let sent = self.link_submit();
            self.flush_at = self.tx_pending.len() + TX_FLUSH_FRAMES;
            return sent;
        }
        let mut sent = 0;
        for _ in 0..MAX_KICKS {
            self.reclaim();
            let done = self.submit();
            sent += done;
            let Port::Socket(xsk) = &mut self.port else {
                break;
            };
            if self.in_tx == 0 || !xsk.tx_needs_wakeup() || !xsk.tx_ring_holds() {
                break;
            }
            let before = self.counters.tx_completed;
            self.counters.tx_kicks += 1;
            if xsk.tx_wakeup().is_err() {
                break;
            }
            self.reclaim();
            if self.counters.tx_completed == before && self.tx_pending.is_empty() {
                // Nothing moved (the kernel is busy): try next pass.
                break;
            }
        }
        self.flush_at = self.tx_pending.len() + TX_FLUSH_FRAMES;
        sent
    }

    /// Put as many pending frames into the tx ring as it has room for,
    /// one descriptor per `chunk − tx_meta` bytes.
    fn submit(&mut self) -> usize {
        let Port::Socket(xsk) = &mut self.port else {
            return 0;
        };
        let meta = u64::from(self.layout.tx_meta);
        let piece = u64::from(self.layout.chunk) - meta;
        let room = xsk.tx_room(self.layout.tx_ring as usize);
        let mut used = 0;
        let mut frames = 0;
        while let Some(&(slot, len)) = self.tx_pending.get(frames) {
            let parts = u64::from(len).div_ceil(piece).max(1) as usize;
            if used + parts > room {
                break;
            }
            let base = self.layout.tx_addr(slot) + meta;
            let mut left = u64::from(len);
            for k in 0..parts {
                let n = left.min(piece);
                left -= n;
                let mut options = if k + 1 < parts {
                    libc::XDP_PKT_CONTD
                } else {
                    0
                };
                if k == 0 && meta > 0 {
                    // The kernel reads the metadata in front of a frame's
                    // first descriptor (its flags may ask for nothing).
                    options |= libc::XDP_TX_METADATA;
                }
                let d = Desc {
                    addr: base + k as u64 * piece,
                    len: n as u32,
                    options,
                };
                // SAFETY: the slot was written by a transmit token and is
                // user space's until the completion ring returns each of
                // its chunks (`tx_out`).
                unsafe { xsk.tx_put(used + k, d) };
            }
            self.tx_out[slot as usize] = parts as u8;
            used += parts;
            frames += 1;
        }
        xsk.tx_submit(used);
        self.tx_pending.drain(..frames);
        self.in_tx += frames;
        self.counters.tx_frames += frames as u64;
        frames
    }

    /// [`Self::submit`] on a link: lend every pending frame to the other
    /// end (its queue holds all of them), then wake it if it sleeps.
    fn link_submit(&mut self) -> usize {
        let Port::Link(end) = &self.port else {
            return 0;
        };
        let meta = u64::from(self.layout.tx_meta);
        let mut frames = 0;
        for (slot, len) in self.tx_pending.drain(..) {
            frames += 1;
            if end.send(self.layout.tx_addr(slot) + meta, len) {
                self.tx_out[slot as usize] = 1;
                self.in_tx += 1;
            } else {
                self.counters.tx_unreached += 1;
                self.tx_free.push(slot);
            }
        }
        if frames > 0 {
            end.wake_peer();
        }
        self.counters.tx_frames += frames as u64;
        frames
    }

    /// Submit the frames written so far before the pass ends, once
    /// [`TX_FLUSH_FRAMES`] wait; counted in
    /// [`RingCounters::tx_early_bursts`].
    pub(crate) fn tx_burst_if_due(&mut self) {
        if self.tx_pending.len() >= self.flush_at {
            self.counters.tx_early_bursts += 1;
            self.tx_burst();
        }
    }

    /// Whether transmission needs more passes: frames written and not in
    /// the tx ring yet, frames in the ring the kernel has not taken, or
    /// frames in flight that a transmit waits for (none was free). Other
    /// frames the kernel took come back through the completion ring on
    /// their own, reclaimed by the next tx burst, refill or frame taken.
    pub(crate) fn tx_busy(&mut self) -> bool {
        let holds = match &mut self.port {
            Port::Socket(xsk) => xsk.tx_ring_holds(),
            Port::Link(_) => false,
        };
        !self.tx_pending.is_empty() || (self.in_tx > 0 && (self.starved || holds))
    }

    /// Whether a transmit slot is free, reclaiming completions if none
    /// is.
    pub(crate) fn has_free(&mut self) -> bool {
        if self.tx_free.is_empty() {
            self.reclaim();
        }
        let free = !self.tx_free.is_empty();
        self.starved |= !free;
        free
    }
}

/// What verifying a received frame touches of a [`Frames`].
struct Checks<'a> {
    area: &'a Area,
    gather: &'a mut [Box<[u8]>],
    counters: &'a mut RingCounters,
    recycle: &'a mut Vec<RxFrame>,
}

impl Checks<'_> {
    /// Queue received `frame` in `out` if its length (`parts`: it came
    /// in several) and TCP checksum verify; else count and recycle it.
    fn frame(&mut self, frame: RxFrame, parts: bool, out: &mut VecDeque<RxFrame>) {
        let data = rx_bytes_mut(self.area, self.gather, &frame);
        if parts && !length_matches(data) {
            self.counters.rx_bad_frames += 1;
            self.recycle.push(frame);
            return;
        }
        match iwarp_tcp::csum::check(data) {
            Checked::Completed => self.counters.rx_csum_completed += 1,
            Checked::Corrupt => {
                self.counters.rx_csum_bad += 1;
                self.recycle.push(frame);
                return;
            }
            Checked::Valid | Checked::NotTcp => {}
        }
        out.push_back(frame);
    }
}

impl Drop for Frames {
    /// A link end goes back to the link, with the frames it holds of the
    /// other end's.
    fn drop(&mut self) {
        if let Port::Link(end) = &self.port {
            let end = end.clone();
            self.refill();
            end.close();
        }
    }
}

/// Whether TCP transmit checksums of `ifname` are worth offloading
/// through Tx metadata: the interface checksums on transmit (else the
/// kernel would compute each one in software, no cheaper than smoltcp).
/// Whether the kernel takes the metadata is asked when the UMEM is
/// registered.
fn tx_csum_offload(ifname: &str) -> Result<(), String> {
    match super::xsk::tx_checksumming(ifname) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("{ifname} has transmit checksumming off")),
        Err(e) => Err(format!("{ifname}'s transmit checksumming unknown: {e}")),
    }
}

/// Borrows of a [`Frames`]' parts, for one receive and one transmit
/// token.
pub(crate) struct Split<'a> {
    pub(crate) area: &'a Area,
    pub(crate) gather: &'a [Box<[u8]>],
    pub(crate) recycle: &'a mut Vec<RxFrame>,
    pub(crate) tx_free: &'a mut Vec<u32>,
    pub(crate) tx_pending: &'a mut VecDeque<(u32, u32)>,
    pub(crate) counters: &'a mut RingCounters,
    pub(crate) layout: Layout,
}

/// The bytes of received frame `f`, in the area or a gather buffer.
pub(crate) fn rx_bytes<'a>(area: &'a Area, gather: &'a [Box<[u8]>], f: &RxFrame) -> &'a [u8] {
    match f.at {
        // SAFETY: a received frame's chunks are user space's until it is
        // recycled, and nothing writes them meanwhile; `parse` checked
        // that they lie in the area. A lent frame is the other end's
        // transmit slot, which that end leaves alone until it is given
        // back, at an address of its layout inside the shared area.
        RxAt::Umem { addr, .. } | RxAt::Lent { addr } => unsafe {
            area.bytes(addr, f.len as usize)
        },
        RxAt::Gathered(g) => &gather[usize::from(g)][..f.len as usize],
    }
}

fn rx_bytes_mut<'a>(area: &'a Area, gather: &'a mut [Box<[u8]>], f: &RxFrame) -> &'a mut [u8] {
    match f.at {
        // SAFETY: as `rx_bytes`; the frame has just been taken from the
        // rx ring and nothing else refers to it yet.
        RxAt::Umem { addr, .. } | RxAt::Lent { addr } => unsafe {
            area.bytes_mut(addr, f.len as usize)
        },
        RxAt::Gathered(g) => &mut gather[usize::from(g)][..f.len as usize],
    }
}

/// The bytes of transmit slot `slot`, to write a frame into.
///
/// # Safety
///
/// The slot is user space's (taken from `tx_free`) and nothing else
/// refers to it while the slice lives.
#[allow(clippy::mut_from_ref)]
pub(crate) unsafe fn tx_bytes<'a>(area: &'a Area, layout: &Layout, slot: u32) -> &'a mut [u8] {
    let at = layout.tx_addr(slot);
    // SAFETY: inside the area (`Layout::area` counts every slot) and the
    // caller's alone.
    unsafe { area.bytes_mut(at, layout.tx_slot as usize) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(addr: u64, len: u32, more: bool) -> Desc {
        Desc {
            addr,
            len,
            options: if more { libc::XDP_PKT_CONTD } else { 0 },
        }
    }

    #[test]
    fn layout_for_jumbo_frames() {
        let l = Layout::new(4096, 4096, 9014, 0).unwrap();
        assert_eq!(l.rx_parts, 3);
        assert_eq!((l.tx_slot, l.tx_parts), (3 * 4096, 3));
        let m = Layout::new(4096, 4096, 9014, TX_META).unwrap();
        assert_eq!((m.tx_slot, m.tx_parts), (3 * 4096, 3));
        // 65535: 17 descriptors of 4072 bytes, the most a copy-mode
        // transmit takes.
        let m = Layout::new(4096, 4096, 65_549, TX_META).unwrap();
        assert_eq!((m.tx_slot, m.tx_parts, m.rx_parts), (17 * 4096, 17, 18));
        // The largest frames: 256 frames a direction, under 100 MiB.
        assert_eq!(m.rx_ring, 8192);
        assert!(m.area() < 100 << 20, "{} bytes", m.area());
        assert_eq!(prev_power_of_two(511), 256);
        assert_eq!(prev_power_of_two(512), 512);
        assert!(l.multi_buffer());
        assert_eq!(l.stride, 3840);
        assert_eq!(l.rx_ring, 8192);
        assert_eq!(l.tx_base % 4096, 0);
        assert!(l.tx_base >= u64::from(l.rx_slots) * 4096);
        let l = Layout::new(4096, 2048, 1514, TX_META).unwrap();
        assert_eq!((l.rx_parts, l.tx_slot, l.multi_buffer()), (1, 2048, false));
        assert_eq!(l.rx_ring, 2048);
        assert!(Layout::new(4096, 2048, 70_000, 0).is_err());
        let mut l = Layout::new(4096, 4096, 9014, 0).unwrap();
        l.set_rings(Some(1024), Some(512)).unwrap();
        assert_eq!((l.rx_ring, l.tx_ring, l.tx_slots), (1024, 512, 170));
        assert_eq!(l.rx_slots, 1024 + 341 * 3);
        assert!(l.tx_base >= u64::from(l.rx_slots) * 4096);
        assert!(l.set_rings(Some(1000), None).is_err());
        assert!(l.set_rings(None, Some(32)).is_err());
        assert!(Layout::new(4096, 1024, 1514, 0).is_err());
    }

    #[test]
    fn consecutive_chunks_make_one_piece() {
        let l = Layout::new(4096, 4096, 9014, 0).unwrap();
        let a = |s: u32| l.rx_addr(s) + 256;
        // Three consecutive slots, full but the last.
        let d = [
            desc(a(5), 3840, true),
            desc(a(6), 3840, true),
            desc(a(7), 1334, false),
        ];
        assert_eq!(
            parse(&l, &d),
            Parsed::Whole {
                slot: 5,
                slots: 3,
                len: 9014
            }
        );
        // Data parts touch: the second starts where the first ends.
        assert_eq!(a(5) + 3840, a(6));
        // At the wrap the chunks do not follow: gathered.
        let last = l.rx_slots - 1;
        let d = [desc(a(last), 3840, true), desc(a(0), 100, false)];
        assert_eq!(parse(&l, &d), Parsed::Scattered { len: 3940 });
        // One chunk: whole.
        assert_eq!(
            parse(&l, &[desc(a(9), 60, false)]),
            Parsed::Whole {
                slot: 9,
                slots: 1,
                len: 60
            }
        );
    }

    #[test]
    fn inconsistent_descriptors_are_bad() {
        let l = Layout::new(4096, 4096, 9014, 0).unwrap();
        let a = |s: u32| l.rx_addr(s) + 256;
        // A part past the receive chunks (into the tx part, past the area).
        let past = l.rx_addr(l.rx_slots) + 256;
        assert_eq!(parse(&l, &[desc(past, 100, false)]), Parsed::Bad);
        assert_eq!(parse(&l, &[desc(u64::MAX - 10, 100, false)]), Parsed::Bad);
        assert_eq!(
            parse(&l, &[desc(a(3), 3840, true), desc(past, 10, false)]),
            Parsed::Bad
        );
        // Not at a data part's start.
        assert_eq!(parse(&l, &[desc(a(3) + 1, 100, false)]), Parsed::Bad);
        assert_eq!(parse(&l, &[desc(10, 100, false)]), Parsed::Bad);
        // A short part before the last.
        assert_eq!(
            parse(&l, &[desc(a(3), 1000, true), desc(a(4), 10, false)]),
            Parsed::Bad
        );
        // Longer than a chunk's data, or empty.
        assert_eq!(parse(&l, &[desc(a(3), 3841, false)]), Parsed::Bad);
        assert_eq!(parse(&l, &[desc(a(3), 0, false)]), Parsed::Bad);
        // More parts than the largest frame takes (a continuation flag
        // on a frame's last descriptor joins it to the next frame).
        let d: Vec<Desc> = (0..4).map(|k| desc(a(k), 3840, k < 3)).collect();
        assert_eq!(parse(&l, &d), Parsed::Bad);
        // Longer than the largest frame.
        let d = [
            desc(a(0), 3840, true),
            desc(a(1), 3840, true),
            desc(a(2), 1335, false),
        ];
        assert_eq!(parse(&l, &d), Parsed::Bad);
    }

    #[test]
    fn a_frame_with_too_many_parts_is_cut_and_its_rest_skipped() {
        let (mut parts, mut skipping) = (Vec::new(), false);
        let mut feed = |more: bool| {
            let c = cut(&mut parts, &mut skipping, 3, desc(256, 3840, more));
            let n = parts.len();
            if c != Cut::More {
                parts.clear();
            }
            (c, n)
        };
        // A frame of three parts.
        assert_eq!(feed(true), (Cut::More, 1));
        assert_eq!(feed(true), (Cut::More, 2));
        assert_eq!(feed(false), (Cut::Frame, 3));
        // One of six: the fourth part ends it (judged bad by `parse`:
        // more parts than the largest frame), the rest is skipped up to
        // and with its last part.
        for _ in 0..3 {
            assert_eq!(feed(true).0, Cut::More);
        }
        assert_eq!(feed(true), (Cut::Frame, 4));
        assert_eq!(feed(true), (Cut::Skipped, 1));
        assert_eq!(feed(false), (Cut::Skipped, 1));
        // The next frame is read as usual.
        assert_eq!(feed(false), (Cut::Frame, 1));
    }

    #[test]
    fn unaligned_addresses_carry_the_data_offset_on_top() {
        use super::super::xsk::unaligned_addr;
        assert_eq!(unaligned_addr((256 << 48) | (3840 * 7)), 3840 * 7 + 256);
        assert_eq!(unaligned_addr(4096), 4096);
    }

    #[test]
    fn ipv4_length_must_match_a_multi_buffer_frame() {
        let mut f = vec![0u8; 9014];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[16..18].copy_from_slice(&9000u16.to_be_bytes());
        assert!(length_matches(&f));
        f[16..18].copy_from_slice(&8999u16.to_be_bytes());
        assert!(!length_matches(&f));
        f[16..18].copy_from_slice(&9001u16.to_be_bytes());
        assert!(!length_matches(&f));
        // Not IPv4: not judged here.
        f[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(length_matches(&f));
        // An IPv4 frame too short for the length field: bad.
        assert!(!length_matches(&[
            0x08, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00, 0x45
        ]));
    }
}
