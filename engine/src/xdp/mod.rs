//! The AF_XDP backend: the protocol core over smoltcp over an AF_XDP
//! socket, with the `iwarp-bpf` steering program in front of it.
//!
//! * `umem`: the UMEM, the fill/completion/rx/tx rings and the frame
//!   pool.
//! * `device`: `XskDevice`, a `smoltcp::phy::Device` whose tokens read
//!   and write UMEM frames in place, with an optional pcap capture.
//! * `raw`: [`RawTcp`], the user-space TCP alone over the same socket
//!   (transport ceiling for benchmarks).
//! * `worker`: `XdpIo`, the state one engine pass works on
//!   (`XdpIo::run_once`), and the connection manager's side of it.
//!
//! Threading, locking and sleeping are the kernel backend's (see
//! `kernel.rs`): the engine state sits behind the device's one mutex, the
//! progress thread (or [`Device::progress`](crate::Device::progress))
//! runs passes, application calls lock it and call the core directly. The
//! AF_XDP socket's descriptor is registered in the same epoll set, so a
//! thread that does not busy-poll sleeps until a frame arrives, a timer
//! (smoltcp's `poll_at`, the core's `poll_timeout`) is due, or an
//! application call kicks it.

pub(crate) mod device;
mod raw;
pub(crate) mod umem;
pub(crate) mod worker;

use std::net::Ipv4Addr;
use std::ops::RangeInclusive;
use std::path::PathBuf;

pub use iwarp_bpf::{ActiveMode, AttachMode, Counters as SteerCounters};
pub use raw::RawTcp;
pub use umem::RingCounters;

/// How to open an AF_XDP device ([`Backend::AfXdp`](crate::Backend::AfXdp)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpConfig {
    /// The interface (in the network namespace of the thread calling
    /// [`Device::open`](crate::Device::open)).
    pub ifname: String,
    /// The receive queue the engine serves (one worker, one queue).
    pub queue: u32,
    /// The engine's own IPv4 address: it answers ARP for it; the kernel's
    /// interface may have another address or none.
    pub ip: Ipv4Addr,
    /// Prefix length of `ip`'s network (peers outside it go through
    /// `gateway`).
    pub prefix: u8,
    /// Default gateway, inside the prefix.
    pub gateway: Option<Ipv4Addr>,
    /// Our MAC address (`None`: the interface's).
    pub mac: Option<[u8; 6]>,
    /// IP MTU; at most the interface's (veth native XDP: at most 3506).
    pub mtu: usize,
    /// UMEM frames (half for the fill ring, half for transmit).
    pub frames: u32,
    /// Local ports of outgoing connections (and of `listen` on port 0).
    pub ephemeral_ports: RangeInclusive<u16>,
    /// How to attach the steering program.
    pub attach: AttachMode,
    /// The progress thread spins instead of sleeping in epoll (the AF_XDP
    /// default; [`DeviceConfig::busy_poll`](crate::DeviceConfig) also
    /// turns it on).
    pub busy_poll: bool,
    /// Write every frame the engine receives or sends to this pcap file.
    pub pcap: Option<PathBuf>,
    /// The user-space TCP's settings.
    pub tcp: iwarp_tcp::Config,
}

impl XdpConfig {
    /// Defaults for interface `ifname` and address `ip/prefix`: queue 0,
    /// MTU 1500, 4096 frames, ephemeral ports 49152..=65535, attach mode
    /// Auto, busy-polling, no capture.
    pub fn new(ifname: impl Into<String>, ip: Ipv4Addr, prefix: u8) -> Self {
        Self {
            ifname: ifname.into(),
            queue: 0,
            ip,
            prefix,
            gateway: None,
            mac: None,
            mtu: 1500,
            frames: 4096,
            ephemeral_ports: 49152..=65535,
            attach: AttachMode::Auto,
            busy_poll: true,
            pcap: None,
            tcp: iwarp_tcp::Config::default(),
        }
    }

    /// UMEM frame size: the smallest power of two holding an MTU-sized
    /// Ethernet frame after the 256 bytes of XDP headroom.
    pub(crate) fn frame_size(&self) -> u32 {
        if self.mtu + 14 + 256 <= 2048 {
            2048
        } else {
            4096
        }
    }
}

/// Counters of the AF_XDP side (monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpStats {
    /// The mode the steering program runs in.
    pub mode: Option<ActiveMode>,
    /// Ring and frame-pool counters.
    pub rings: RingCounters,
    /// The steering program's counters.
    pub steering: SteerCounters,
    /// Kernel: frames dropped for lack of rx ring space or other reasons.
    pub rx_dropped: u64,
    /// Kernel: frames dropped because the rx ring was full.
    pub rx_ring_full: u64,
    /// Kernel: times the fill ring was found empty.
    pub rx_fill_ring_empty: u64,
    /// Kernel: invalid rx descriptors.
    pub rx_invalid_descs: u64,
    /// Kernel: invalid tx descriptors.
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
}
