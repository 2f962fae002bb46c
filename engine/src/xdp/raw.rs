//! [`RawTcp`]: the user-space TCP over an AF_XDP socket without the
//! protocol core, for measuring what the transport alone achieves on the
//! same path (the ceiling of the RDMA engine's throughput).

use std::io;
use std::time::Instant;

use iwarp_bpf::{SteerConfig, Steering};
use iwarp_tcp::smoltcp::time::Instant as SmolInstant;
use iwarp_tcp::smoltcp::wire::EthernetAddress;
use iwarp_tcp::Stack;

use super::device::XskDevice;
use super::umem::{Frames, Options};
use super::worker::{mac_of, RawFd};
use super::XdpConfig;

/// smoltcp on an AF_XDP socket with the steering program in front, and
/// nothing else: the application drives the [`Stack`] itself and calls
/// [`RawTcp::poll`] in a loop. Opened in the calling thread's network
/// namespace; dropping it detaches the program and closes socket and
/// UMEM. The same UMEM, rings, frame sizing and TCP settings as
/// [`Backend::AfXdp`](crate::Backend::AfXdp).
pub struct RawTcp {
    // Dropped first: the program leaves before the socket closes.
    steering: Steering,
    stack: Stack<XskDevice>,
    epoch: Instant,
}

impl std::fmt::Debug for RawTcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawTcp")
            .field("steering", &self.steering)
            .field("stack", &self.stack)
            .finish()
    }
}

impl RawTcp {
    /// Open the socket and attach the program, steering TCP to `cfg.ip`
    /// on `cfg.ephemeral_ports` and `listen_ports`, and ARP for `cfg.ip`.
    /// `cfg.pcap` and `cfg.busy_poll` are ignored; the socket takes the
    /// engine's socket options (rings, socket busy polling, checksum
    /// offload).
    pub fn open(cfg: &XdpConfig, listen_ports: &[u16]) -> io::Result<Self> {
        let mac = match cfg.mac {
            Some(m) => m,
            None => mac_of(&cfg.ifname)?,
        };
        let frames = Frames::new(&cfg.ifname, cfg.queue, &Options::of(cfg))?;
        let dev = XskDevice::new(frames, cfg.mtu, None)?;
        let fd = dev.frames.fd();
        let epoch = Instant::now();
        let stack = Stack::new(
            dev,
            EthernetAddress(mac),
            cfg.ip,
            cfg.prefix,
            cfg.gateway,
            cfg.tcp,
            SmolInstant::from_micros(0),
        );
        let mut steer = SteerConfig::new()
            .addr(cfg.ip)
            .ports(cfg.ephemeral_ports.clone())
            .arp(true);
        for &p in listen_ports {
            steer = steer.port(p);
        }
        let io_err = |e: iwarp_bpf::Error| io::Error::other(e.to_string());
        let steering = Steering::attach(cfg.ifname.as_str(), cfg.attach, &steer).map_err(io_err)?;
        steering.set_xsk(cfg.queue, &RawFd(fd)).map_err(io_err)?;
        Ok(Self {
            steering,
            stack,
            epoch,
        })
    }

    /// The TCP stack (listen, accept, connect, send, recv).
    pub fn stack(&mut self) -> &mut Stack<impl iwarp_tcp::smoltcp::phy::Device> {
        &mut self.stack
    }

    /// The rings' and frame pool's counters.
    pub fn ring_counters(&self) -> super::RingCounters {
        self.stack.device().counters()
    }

    /// Send what the stack queued without looking at what arrived: one
    /// egress round of the connections with work, then a tx burst.
    /// Received frames stay in the ring (the kernel drops what does not
    /// fit): a peer that never answers, as a SYN flood's source is.
    pub fn transmit(&mut self) -> usize {
        let now = SmolInstant::from_micros(
            i64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(i64::MAX),
        );
        self.stack.poll_egress(now);
        self.stack.device_mut().tx_burst()
    }

    /// One pass: rx burst and fill-ring refill, smoltcp ingress and
    /// egress, tx burst. Returns a measure of the work done (0: idle).
    pub fn poll(&mut self) -> usize {
        let now = SmolInstant::from_micros(
            i64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(i64::MAX),
        );
        // As the engine's pass.
        let mut work = super::device::rx_and_poll(&mut self.stack, now);
        let dev = self.stack.device_mut();
        work += dev.tx_burst();
        if dev.frames.tx_busy() || dev.rx_queued() > 0 {
            work += 1;
        }
        work
    }
}
