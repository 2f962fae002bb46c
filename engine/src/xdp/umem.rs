//! The UMEM of one AF_XDP socket, its four rings and the frame pool.
//!
//! Ownership of a frame moves between user space and the kernel only
//! through the rings; a [`FrameDesc`] is in exactly one place at a time:
//!
//! * `free` (user space, unused),
//! * the fill ring (the kernel may write a received frame into it),
//! * the received batch / `recycle` (user space, holding received bytes),
//! * `tx_pending` (user space, written by smoltcp, not submitted yet),
//! * the tx ring until the completion ring hands it back.
//!
//! Every unsafe ring call below relies on that invariant: a descriptor
//! passed to the kernel is not touched again until it comes back, and all
//! descriptors belong to this one UMEM.

use std::collections::VecDeque;
use std::ffi::CString;
use std::io;
use std::num::NonZeroU32;
use std::os::fd::{AsRawFd, RawFd};

use iwarp_tcp::csum::Checked;
use xsk_rs::config::{
    BindFlags, FrameSize, Interface, LibxdpFlags, QueueSize, SocketConfig, UmemConfig,
};
use xsk_rs::socket::{RxQueue, Socket, TxQueue};
use xsk_rs::umem::frame::FrameDesc;
use xsk_rs::umem::{CompQueue, FillQueue, Umem};

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
}

/// The UMEM, its rings and the frames user space owns.
pub(crate) struct Frames {
    // The queues hold the socket; the UMEM goes with the last of them.
    rx: RxQueue,
    tx: TxQueue,
    fq: FillQueue,
    cq: CompQueue,
    pub(crate) umem: Umem,
    /// Frames owned by user space and unused.
    pub(crate) free: Vec<FrameDesc>,
    /// Received frames smoltcp is done with.
    pub(crate) recycle: Vec<FrameDesc>,
    /// Frames written for transmit, not yet in the tx ring.
    pub(crate) tx_pending: VecDeque<FrameDesc>,
    /// `tx_pending` length at which the frames are submitted during the
    /// pass: [`TX_FLUSH_FRAMES`] more than the last burst left behind
    /// (a full tx ring does not make every frame written try again).
    flush_at: usize,
    /// Frames in the fill ring.
    in_fill: usize,
    fill_size: usize,
    /// Frames in the tx ring or not yet completed.
    in_tx: usize,
    /// Slots of the tx ring.
    tx_size: u32,
    /// A frame was wanted for transmit and none was free; cleared when
    /// completions return frames.
    starved: bool,
    scratch: Vec<FrameDesc>,
    /// Bytes of data each frame holds.
    pub(crate) frame_mtu: usize,
    pub(crate) counters: RingCounters,
}

impl std::fmt::Debug for Frames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frames")
            .field("free", &self.free.len())
            .field("in_fill", &self.in_fill)
            .field("in_tx", &self.in_tx)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

fn size(n: u32) -> io::Result<QueueSize> {
    QueueSize::new(n).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
}

impl Frames {
    /// A UMEM of `frames` frames of `frame_size` bytes (a power of two,
    /// at most 4096), and an AF_XDP socket bound to `ifname` queue
    /// `queue` in copy or zero-copy mode as the driver allows, without
    /// libxdp's own XDP program. Half the frames go to the fill ring.
    pub(crate) fn new(ifname: &str, queue: u32, frames: u32, frame_size: u32) -> io::Result<Self> {
        let ring = (frames / 2).next_power_of_two().max(64);
        let frames = NonZeroU32::new(frames.max(2 * ring))
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let umem_config = UmemConfig::builder()
            .frame_size(
                FrameSize::new(frame_size)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?,
            )
            .fill_queue_size(size(ring)?)
            .comp_queue_size(size(ring)?)
            .build()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let frame_mtu = umem_config.mtu() as usize;
        let (umem, descs) =
            Umem::new(umem_config, frames, false).map_err(|e| io::Error::other(e.to_string()))?;
        let config = SocketConfig::builder()
            .rx_queue_size(size(ring)?)
            .tx_queue_size(size(ring)?)
            .libxdp_flags(LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD)
            .bind_flags(BindFlags::XDP_USE_NEED_WAKEUP)
            .build();
        let name = Interface::new(
            CString::new(ifname).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
        );
        // SAFETY: the UMEM was just created and is used by this socket only.
        let (tx, rx, fq_cq) = unsafe { Socket::new(config, &umem, &name, queue) }
            .map_err(|e| io::Error::other(e.to_string()))?;
        let (fq, cq) = fq_cq.ok_or_else(|| io::Error::other("no fill/completion rings"))?;
        let mut me = Self {
            rx,
            tx,
            fq,
            cq,
            umem,
            free: descs,
            recycle: Vec::with_capacity(RX_BURST),
            tx_pending: VecDeque::with_capacity(ring as usize),
            flush_at: TX_FLUSH_FRAMES,
            in_fill: 0,
            fill_size: ring as usize,
            in_tx: 0,
            tx_size: ring,
            starved: false,
            scratch: vec![FrameDesc::default(); ring as usize],
            frame_mtu,
            counters: RingCounters::default(),
        };
        me.refill();
        Ok(me)
    }

    /// The socket's file descriptor (for the XSKMAP and for epoll).
    pub(crate) fn fd(&self) -> RawFd {
        self.rx.fd().as_raw_fd()
    }

    /// The kernel's socket statistics.
    pub(crate) fn xdp_statistics(&self) -> Option<xsk_rs::socket::XdpStatistics> {
        self.rx.fd().xdp_statistics().ok()
    }

    /// Take up to [`RX_BURST`] received frames into `out`.
    pub(crate) fn rx_burst(&mut self, out: &mut VecDeque<FrameDesc>) -> usize {
        let want = RX_BURST.min(self.scratch.len());
        // SAFETY: the rx ring hands out frames of this UMEM only; they are
        // user space's until put into the fill or tx ring again.
        let n = unsafe { self.rx.consume(&mut self.scratch[..want]) };
        for desc in &mut self.scratch[..n] {
            // SAFETY: as above: the frame was just consumed from the rx
            // ring, belongs to this UMEM, and nothing else references it
            // until it is queued for smoltcp or recycled below.
            let mut data = unsafe { self.umem.data_mut(desc) };
            match iwarp_tcp::csum::check(data.contents_mut()) {
                Checked::Completed => self.counters.rx_csum_completed += 1,
                Checked::Corrupt => {
                    self.counters.rx_csum_bad += 1;
                    self.recycle.push(*desc);
                    continue;
                }
                Checked::Valid | Checked::NotTcp => {}
            }
            out.push_back(*desc);
        }
        self.in_fill = self.in_fill.saturating_sub(n);
        self.counters.rx_frames += n as u64;
        n
    }

    /// Give consumed frames back and top the fill ring up.
    pub(crate) fn refill(&mut self) {
        self.free.append(&mut self.recycle);
        let room = self.fill_size.saturating_sub(self.in_fill);
        if room == 0 {
            return;
        }
        if self.free.len() < room {
            // Transmitted frames the completion ring returned since.
            self.reclaim();
        }
        let n = room.min(self.free.len());
        if n == 0 {
            self.counters.fill_starved += 1;
            return;
        }
        let n = (self.fq.nb_free(n as u32) as usize).min(n);
        let from = self.free.len() - n;
        // SAFETY: these frames are user space's (in `free`), belong to this
        // UMEM, and leave `free` right after.
        let done = unsafe { self.fq.produce(&self.free[from..]) };
        if done > 0 {
            self.free.truncate(self.free.len() - done);
            self.in_fill += done;
        }
        if self.fq.needs_wakeup() {
            self.counters.fill_wakeups += 1;
            let _ = self.rx.poll(0);
        }
    }

    /// Reclaim transmitted frames from the completion ring.
    fn reclaim(&mut self) {
        if self.in_tx == 0 {
            return;
        }
        let want = self.in_tx.min(self.scratch.len());
        // SAFETY: the completion ring returns frames of this UMEM that the
        // kernel is done with.
        let n = unsafe { self.cq.consume(&mut self.scratch[..want]) };
        self.free.extend(self.scratch[..n].iter().copied());
        self.starved &= n == 0;
        self.in_tx -= n;
        self.counters.tx_completed += n as u64;
    }

    /// Whether the tx ring holds descriptors the kernel has not taken
    /// (read from its consumer position, not the cached one).
    fn tx_ring_holds(&mut self) -> bool {
        self.tx.nb_free_exact() < self.tx_size
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
        let mut sent = 0;
        for _ in 0..MAX_KICKS {
            self.reclaim();
            if !self.tx_pending.is_empty() {
                let (a, _) = self.tx_pending.as_slices();
                let n = (self.tx.nb_free(a.len() as u32) as usize).min(a.len());
                // SAFETY: frames written by this device's transmit tokens,
                // of this UMEM, user space's until the completion ring
                // returns them.
                let done = unsafe { self.tx.produce(&a[..n]) };
                self.tx_pending.drain(..done);
                self.in_tx += done;
                sent += done;
                self.counters.tx_frames += done as u64;
            }
            if self.in_tx == 0 || !self.tx.needs_wakeup() || !self.tx_ring_holds() {
                break;
            }
            let before = self.counters.tx_completed;
            self.counters.tx_kicks += 1;
            if self.tx.wakeup().is_err() {
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
        !self.tx_pending.is_empty() || (self.in_tx > 0 && (self.starved || self.tx_ring_holds()))
    }

    /// Take a free frame for transmit, reclaiming completions if needed.
    pub(crate) fn take_free(&mut self) -> Option<FrameDesc> {
        if self.free.is_empty() {
            self.reclaim();
        }
        let frame = self.free.pop();
        self.starved |= frame.is_none();
        frame
    }
}
