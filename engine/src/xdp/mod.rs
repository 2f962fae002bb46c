//! The AF_XDP backend: the protocol core over smoltcp over an AF_XDP
//! socket, with the `iwarp-bpf` steering program in front of it.
//!
//! * `umem`: the UMEM, the fill/completion/rx/tx rings and the frame
//!   pool.
//! * `device`: `XskDevice`, a `smoltcp::phy::Device` whose tokens read
//!   and write UMEM frames in place, with an optional pcap capture.
//! * `link`: the in-process link ([`link`], [`LinkEnd`]): two engines
//!   in one process, each end's frames lent to the other in place.
//! * `raw`: [`RawTcp`], the user-space TCP alone over the same socket
//!   (transport ceiling for benchmarks).
//! * `worker`: `XdpIo`, the state one engine pass works on (its input,
//!   the steps on the core, its output), and the connection manager's
//!   side of it.
//! * `set`: `XdpSet`, the device's engines as one transport of the
//!   runtime (`crate::runtime::Transport`).
//!
//! Threading, locking and sleeping live in the runtime (`crate::runtime`);
//! one pass, UMEM frames, the engine's address and ARP, and one engine per
//! receive queue ([`XdpConfig::queues`]) are described in `docs/design.md`
//! of the repository. [`Stats::engines`](crate::Stats::engines) has one
//! [`EngineStats`] per engine.

pub(crate) mod device;
mod link;
mod raw;
pub(crate) mod set;
pub(crate) mod umem;
pub(crate) mod worker;
pub(crate) mod xsk;

use std::net::Ipv4Addr;
use std::ops::RangeInclusive;
use std::path::PathBuf;

pub use iwarp_bpf::{ActiveMode, AttachMode, Counters as SteerCounters};
pub use link::{link, LinkEnd};
pub use raw::RawTcp;
pub use umem::{RingCounters, TX_FLUSH_FRAMES};

/// How to open an AF_XDP device ([`Backend::AfXdp`](crate::Backend::AfXdp)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpConfig {
    /// The interface (in the network namespace of the thread calling
    /// [`Device::open`](crate::Device::open)).
    pub ifname: String,
    /// The receive queue the engine serves (one worker, one queue), when
    /// `queues` is empty.
    pub queue: u32,
    /// Multi-core: one engine per receive queue listed here (each its own
    /// AF_XDP socket, UMEM, smoltcp stack and progress thread; see the
    /// module documentation). Empty (the default): one engine on `queue`.
    pub queues: Vec<u32>,
    /// Multi-core: the core engine `i`'s progress thread is pinned to
    /// (`cpus[i]`; an engine without an entry is not pinned, except engine
    /// 0, which follows [`Progress::Thread`](crate::Progress::Thread)'s
    /// `cpu`).
    pub cpus: Vec<usize>,
    /// The engine's own IPv4 address: it answers ARP for it; the kernel's
    /// interface may have another address or none.
    pub ip: Ipv4Addr,
    /// Prefix length of `ip`'s network (peers outside it go through
    /// `gateway`).
    pub prefix: u8,
    /// Default gateway for peers outside `ip/prefix`; it must lie inside
    /// the prefix. `None`: only peers on the prefix are reachable.
    pub gateway: Option<Ipv4Addr>,
    /// Our MAC address (`None`: the interface's).
    pub mac: Option<[u8; 6]>,
    /// IP MTU; at most the interface's. A frame longer than one UMEM
    /// chunk (MTU above 3826) is received and sent in several chunks
    /// (multi-buffer AF_XDP, Linux 6.6 and later); the steering program
    /// is frags-aware, so veth takes such MTUs in native mode too.
    pub mtu: usize,
    /// UMEM frames (half for the fill ring, half for transmit); a frame
    /// takes as many chunks as its length needs.
    pub frames: u32,
    /// Local ports of outgoing connections (and of `listen` on port 0);
    /// split into equal disjoint parts, one per engine, with several
    /// queues.
    pub ephemeral_ports: RangeInclusive<u16>,
    /// How to attach the steering XDP program: native (driver), generic
    /// (skb), or native with a fallback to generic.
    pub attach: AttachMode,
    /// The progress thread spins instead of sleeping in epoll (the AF_XDP
    /// default; [`DeviceConfig::busy_poll`](crate::DeviceConfig) also
    /// turns it on).
    pub busy_poll: bool,
    /// Preferred busy polling on the AF_XDP socket (`SO_PREFER_BUSY_POLL`,
    /// `SO_BUSY_POLL`, `SO_BUSY_POLL_BUDGET`): a pass that finds the rx
    /// ring empty runs the driver's receive processing (NAPI) on the
    /// engine's core through a `recvfrom`, instead of waiting for the
    /// interrupt and softirq to do it elsewhere. `None` (the default): off;
    /// see `docs/nic.md` for when it pays.
    pub socket_busy_poll: Option<SocketBusyPoll>,
    /// Offload TCP transmit checksums through AF_XDP Tx metadata (Linux
    /// 6.11 and later) where the interface checksums on transmit: smoltcp
    /// then leaves the pseudo-header sum in the field and the interface
    /// (copy mode: the kernel's `CHECKSUM_PARTIAL`) finishes it. Where the
    /// kernel or the interface cannot, or with `false`, smoltcp computes
    /// them; [`XdpStats::tx_csum_offload`] tells which, the log why.
    pub tx_csum_offload: bool,
    /// Entries of the fill and rx rings (a power of two; `None`: as many
    /// as half the frames take in chunks).
    pub rx_ring: Option<u32>,
    /// Entries of the tx and completion rings (a power of two; `None`: as
    /// many as half the frames take in chunks).
    pub tx_ring: Option<u32>,
    /// Write every frame the engine receives or sends to this pcap file.
    pub pcap: Option<PathBuf>,
    /// The settings of each engine's user-space TCP stack.
    pub tcp: iwarp_tcp::Config,
    /// Keep FPDUs inside TCP segments (RFC 5044 §8): every segment starts
    /// with an FPDU and holds only whole ones; each connection hands
    /// smoltcp whole segments, within the peer's window, and FPDUs are cut
    /// to fill them. Segments are still cut short by smoltcp's congestion
    /// window in slow start and loss recovery, at the end of its transmit
    /// ring and in its retransmissions (see the crate documentation). Off:
    /// FPDUs are written as a plain byte stream, and smoltcp cuts it at
    /// the MSS.
    pub align_fpdus: bool,
}

impl XdpConfig {
    /// Defaults for interface `ifname` and address `ip/prefix`: queue 0,
    /// MTU 1500, 4096 frames, ephemeral ports 49152..=65535, attach mode
    /// Auto, busy-polling, no capture, FPDUs aligned with segments.
    pub fn new(ifname: impl Into<String>, ip: Ipv4Addr, prefix: u8) -> Self {
        Self {
            ifname: ifname.into(),
            queue: 0,
            queues: Vec::new(),
            cpus: Vec::new(),
            ip,
            prefix,
            gateway: None,
            mac: None,
            mtu: 1500,
            frames: 4096,
            ephemeral_ports: 49152..=65535,
            attach: AttachMode::Auto,
            busy_poll: true,
            socket_busy_poll: None,
            tx_csum_offload: true,
            rx_ring: None,
            tx_ring: None,
            pcap: None,
            tcp: iwarp_tcp::Config::default(),
            align_fpdus: true,
        }
    }

    /// The receive queues, one engine each.
    pub(crate) fn engine_queues(&self) -> Vec<u32> {
        if self.queues.is_empty() {
            vec![self.queue]
        } else {
            self.queues.clone()
        }
    }

    /// Engine `i`'s share of the ephemeral ports: `n` contiguous, disjoint
    /// parts of `ephemeral_ports` (the last one takes the remainder).
    /// `None` if a part would be empty.
    pub(crate) fn ephemeral_part(&self, i: usize, n: usize) -> Option<RangeInclusive<u16>> {
        let (lo, hi) = (
            u32::from(*self.ephemeral_ports.start()),
            u32::from(*self.ephemeral_ports.end()),
        );
        let n = u32::try_from(n).ok().filter(|&n| n > 0)?;
        let i = u32::try_from(i).ok().filter(|&i| i < n)?;
        if hi < lo || hi - lo + 1 < n {
            return None;
        }
        let each = (hi - lo + 1) / n;
        let start = lo + i * each;
        let end = if i + 1 == n { hi } else { start + each - 1 };
        Some(u16::try_from(start).ok()?..=u16::try_from(end).ok()?)
    }

    /// The largest Ethernet frame: the MTU and the Ethernet header.
    pub(crate) fn frame_len(&self) -> usize {
        self.mtu + device::ETH_HEADER
    }

    /// UMEM chunk size: the smallest power of two holding an MTU-sized
    /// Ethernet frame after the 256 bytes of XDP headroom, at most a
    /// page (larger frames take several chunks).
    pub(crate) fn frame_size(&self) -> u32 {
        if self.frame_len() + xsk::XDP_HEADROOM as usize <= 2048 {
            2048
        } else {
            4096
        }
    }
}

/// Preferred busy polling of an AF_XDP socket ([`XdpConfig::socket_busy_poll`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketBusyPoll {
    /// `SO_BUSY_POLL`: microseconds one busy poll may spin in the driver.
    pub usecs: u32,
    /// `SO_BUSY_POLL_BUDGET`: most frames one busy poll processes.
    pub budget: u16,
}

impl Default for SocketBusyPoll {
    /// 20 µs, 64 frames (a NAPI poll's usual budget).
    fn default() -> Self {
        Self {
            usecs: 20,
            budget: 64,
        }
    }
}

/// Counters of one engine of a multi-core AF_XDP device (one receive
/// queue).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// The interface receive queue the engine's AF_XDP socket is bound
    /// to.
    pub queue: u32,
    /// Passes of this engine's progress loop (monotonic).
    pub passes: u64,
    /// Connections the engine drives now (entries of its connection
    /// table).
    pub connections: usize,
    /// Visits of the connections the core drives (frames or a window
    /// arrived, the application posted, a timer was due).
    pub visits: u64,
    /// Of those, visits that moved no byte and changed nothing.
    pub idle_visits: u64,
    /// The counters of the engine's user-space TCP stack.
    pub tcp: iwarp_tcp::Counters,
    /// Connections its user-space TCP holds (any state, until released).
    pub tcp_connections: usize,
    /// Entries of the engine's flow table (4-tuple to connection).
    pub flows: usize,
    /// Its rings and socket counters (the steering counters are the
    /// device's, in every engine's entry).
    pub xdp: XdpStats,
    /// Frames that arrived on this engine's queue for a port of another
    /// engine, copied over to it.
    pub forwarded_out: u64,
    /// Frames other engines copied over to this one.
    pub forwarded_in: u64,
    /// Frames for another engine dropped because its inbox (a fixed set
    /// of buffers) was full; TCP sends them again.
    pub forward_dropped: u64,
    /// Multi-core progress threads: nanoseconds spent in the I/O steps
    /// (under the engine's own lock only). This and the next two are
    /// sampled: one pass in 64 is timed, and counted 64 times.
    pub io_ns: u64,
    /// Multi-core progress threads: nanoseconds spent waiting for the
    /// device lock (the engines serialize on the shared verbs context).
    pub lock_wait_ns: u64,
    /// Multi-core progress threads: nanoseconds spent holding the device
    /// lock (core work).
    pub core_ns: u64,
}

/// Counters of the AF_XDP side (monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpStats {
    /// The mode the steering program runs in, once attached.
    pub mode: Option<ActiveMode>,
    /// The socket is bound in zero-copy mode (the driver offers it);
    /// false: copy mode, the fallback (veth).
    pub zero_copy: bool,
    /// Frames may span several UMEM chunks (bound with `XDP_USE_SG`).
    pub multi_buffer: bool,
    /// TCP transmit checksums are offloaded through Tx metadata
    /// ([`XdpConfig::tx_csum_offload`]); false: smoltcp computes them.
    pub tx_csum_offload: bool,
    /// Counters of the four AF_XDP rings and the UMEM frame pool.
    pub rings: RingCounters,
    /// The steering XDP program's counters, summed over CPUs.
    pub steering: SteerCounters,
    /// Kernel: frames dropped for lack of rx ring space or other reasons.
    pub rx_dropped: u64,
    /// Kernel: frames dropped because the rx ring was full.
    pub rx_ring_full: u64,
    /// Kernel: times the fill ring was found empty.
    pub rx_fill_ring_empty: u64,
    /// Kernel (`XDP_STATISTICS`): rx descriptors the kernel found invalid.
    pub rx_invalid_descs: u64,
    /// Kernel (`XDP_STATISTICS`): tx descriptors the kernel found invalid
    /// (outside the UMEM or too long) and skipped.
    pub tx_invalid_descs: u64,
    /// Kernel: times the tx ring was found empty when kicked.
    pub tx_ring_empty: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_size_follows_the_mtu() {
        let mut c = XdpConfig::new("veth0", Ipv4Addr::new(198, 18, 0, 1), 24);
        assert_eq!((c.mtu, c.frame_size()), (1500, 2048));
        c.mtu = 1778;
        assert_eq!(c.frame_size(), 2048);
        c.mtu = 1779;
        assert_eq!(c.frame_size(), 4096);
        c.mtu = 3506;
        assert_eq!(c.frame_size(), 4096);
        assert!(c.busy_poll);
        assert_eq!(c.ephemeral_ports, 49152..=65535);
    }

    #[test]
    fn ephemeral_parts_are_disjoint_and_cover_the_range() {
        let mut c = XdpConfig::new("veth0", Ipv4Addr::new(198, 18, 0, 1), 24);
        assert_eq!(c.engine_queues(), vec![0]);
        assert_eq!(c.ephemeral_part(0, 1), Some(49152..=65535));
        assert_eq!(c.ephemeral_part(0, 2), Some(49152..=57343));
        assert_eq!(c.ephemeral_part(1, 2), Some(57344..=65535));
        assert_eq!(c.ephemeral_part(2, 2), None);
        c.ephemeral_ports = 1000..=1002;
        assert_eq!(c.ephemeral_part(0, 2), Some(1000..=1000));
        assert_eq!(c.ephemeral_part(1, 2), Some(1001..=1002));
        assert_eq!(c.ephemeral_part(0, 4), None);
        c.queues = vec![3, 1];
        assert_eq!(c.engine_queues(), vec![3, 1]);
    }
}
