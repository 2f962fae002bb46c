//! [`XdpIo`]: the AF_XDP engine's state and one pass over it.
//!
//! One pass ([`XdpIo::io_in`], [`XdpIo::drive`], [`XdpIo::io_out`], the
//! clock read once by the caller) visits only the connections with
//! something to do; its steps are listed in `docs/design.md` ("One pass
//! of the AF_XDP engine").

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::Arc;

use iwarp::cq::QpId;
use iwarp::time::{Duration as CoreDuration, Instant as CoreInstant};
use iwarp::verbs::Context;
use iwarp_bpf::{SteerConfig, Steering};
use iwarp_tcp::smoltcp::time::Instant as SmolInstant;
use iwarp_tcp::smoltcp::wire::{EthernetAddress, IpAddress, IpEndpoint};
use iwarp_tcp::{ConnId, Error as TcpError, Stack};

use super::device::{FlowKey, Flows, Inbox, Pcap, XskDevice};
use super::link::LinkEnd;
use super::umem::{Frames, Options};
use super::xsk::BindMode;
use super::{XdpConfig, XdpStats};
use crate::cm::CmError;
use crate::runtime::established::{Driven, Ending, Stream, Transmitted};
use crate::runtime::lifecycle::{self, Accepting, Fed, Reply};
use crate::runtime::{lock, ConnShared, ListenShared, Sock};
use crate::slots::{slotted_without_qp, ConnSlots, Slotted};

/// How long a dropped connection may take to finish its close before it is
/// reset.
const LINGER: CoreDuration = CoreDuration::from_secs(5);

/// Most segment rounds per pass ([`XdpIo::segment_rounds`]): a round
/// follows each segment a connection had to send alone (45 for a 64 KiB
/// message at MTU 1500 when less than two segments are in flight).
const SEGMENT_ROUNDS: usize = 64;

fn smol(now: CoreInstant) -> SmolInstant {
    SmolInstant::from_micros(i64::try_from(now.total_micros()).unwrap_or(i64::MAX))
}

fn core(t: SmolInstant) -> CoreInstant {
    CoreInstant::from_micros(u64::try_from(t.total_micros()).unwrap_or(0))
}

#[derive(Debug)]
struct Listening {
    port: u16,
    shared: Arc<ListenShared>,
}

/// An accepted connection whose MPA request is still arriving: visited
/// when the stack lists it active or its handshake deadline passes.
#[derive(Debug)]
struct Pending {
    conn: ConnId,
    acc: Accepting,
    hot: bool,
    timer: Option<CoreInstant>,
}

/// An outgoing TCP connect in progress: visited when the stack lists it
/// active.
#[derive(Debug)]
struct Dial {
    conn: ConnId,
    shared: Arc<ConnShared>,
    hot: bool,
    timer: Option<CoreInstant>,
}

/// A connection driven by the core.
#[derive(Debug)]
struct Conn {
    /// The core's side of the connection.
    core: Driven,
    conn: ConnId,
    /// Our FIN is queued.
    closing: bool,
    /// The TCP connection is gone (closed, reset, released).
    gone: bool,
    orphan: Option<CoreInstant>,
    /// On the list of connections the next pass visits.
    hot: bool,
    /// The core timer of the QP's entry in the timer heap.
    timer: Option<CoreInstant>,
}

impl Slotted for Conn {
    type Key = ConnId;
    fn key(&self) -> ConnId {
        self.conn
    }
    fn qp(&self) -> Option<QpId> {
        Some(self.core.qp())
    }
    fn hot(&mut self) -> &mut bool {
        &mut self.hot
    }
    fn timer(&mut self) -> &mut Option<CoreInstant> {
        &mut self.timer
    }
}

/// A connection that only sends bytes and closes (a reject reply):
/// visited when the stack lists it active or [`LINGER`] after its first
/// visit.
#[derive(Debug)]
struct Lingering {
    conn: ConnId,
    reply: Reply,
    since: Option<CoreInstant>,
    hot: bool,
    timer: Option<CoreInstant>,
}

slotted_without_qp!(Pending, ConnId, conn);
slotted_without_qp!(Dial, ConnId, conn);
slotted_without_qp!(Lingering, ConnId, conn);

/// The steering program of a device, shared by its engines: each engine
/// publishes the ports it needs steered, the program's configuration is
/// their union (plus the whole ephemeral range).
pub(crate) struct Steer {
    inner: std::sync::Mutex<SteerState>,
}

struct SteerState {
    steering: Option<Steering>,
    ip: Ipv4Addr,
    ephemeral: RangeInclusive<u16>,
    /// Ports outside the ephemeral range, per engine.
    ports: Vec<Vec<u16>>,
    current: SteerConfig,
}

impl Steer {
    /// The steering of `engines` engines of `cfg` through `steering`
    /// (`None`: no program, as on an in-process link), configured with
    /// the base ports.
    fn new(steering: Option<Steering>, cfg: &XdpConfig, engines: usize) -> Arc<Self> {
        Arc::new(Self {
            inner: std::sync::Mutex::new(SteerState {
                steering,
                ip: cfg.ip,
                ephemeral: cfg.ephemeral_ports.clone(),
                ports: vec![Vec::new(); engines],
                current: Self::base(cfg.ip, &cfg.ephemeral_ports),
            }),
        })
    }

    fn base(ip: Ipv4Addr, ephemeral: &RangeInclusive<u16>) -> SteerConfig {
        SteerConfig::new()
            .addr(ip)
            .ports(ephemeral.clone())
            .arp(true)
    }

    /// Engine `engine` now needs `ports` (outside the ephemeral range)
    /// steered. The map is written only when the union changed.
    fn publish(&self, engine: usize, ports: Vec<u16>) {
        let mut g = lock(&self.inner);
        let st = &mut *g;
        if let Some(p) = st.ports.get_mut(engine) {
            *p = ports;
        }
        let mut all: Vec<u16> = st.ports.iter().flatten().copied().collect();
        all.retain(|p| !st.ephemeral.contains(p));
        all.sort_unstable();
        all.dedup();
        let mut cfg = Self::base(st.ip, &st.ephemeral);
        for p in all {
            cfg = cfg.port(p);
        }
        if cfg.ports == st.current.ports {
            return;
        }
        if let Some(s) = &st.steering {
            if s.update_config(&cfg).is_ok() {
                st.current = cfg;
            }
        }
    }

    /// Whether one more port outside the ephemeral range fits the
    /// program's configuration.
    fn can_add(&self, port: u16) -> bool {
        let g = lock(&self.inner);
        g.ephemeral.contains(&port) || g.current.ports.len() < iwarp_bpf::MAX_PORT_RANGES
    }

    fn mode(&self) -> Option<iwarp_bpf::ActiveMode> {
        lock(&self.inner).steering.as_ref().map(|s| s.mode())
    }

    fn counters(&self) -> iwarp_bpf::Counters {
        lock(&self.inner)
            .steering
            .as_ref()
            .and_then(|s| s.counters().ok())
            .unwrap_or_default()
    }

    /// Detach the program (before the sockets close).
    pub(crate) fn detach(&self) {
        if let Some(s) = lock(&self.inner).steering.take() {
            match s.detach() {
                Ok(()) => tracing::info!("XDP steering program detached"),
                Err(e) => tracing::warn!(error = %e, "XDP detach failed"),
            }
        }
    }
}

impl Drop for Steer {
    fn drop(&mut self) {
        self.detach();
    }
}

/// The AF_XDP engine's state: its AF_XDP socket, smoltcp and the
/// connections on top of it (one per receive queue).
pub(crate) struct XdpIo {
    // Dropped first: the program leaves the interface before the socket
    // and the UMEM are closed (the device also detaches it explicitly).
    steer: Arc<Steer>,
    /// Index among the device's engines.
    index: usize,
    queue: u32,
    stack: Stack<XskDevice>,
    ip: Ipv4Addr,
    /// This engine's part of the ephemeral ports.
    ephemeral: RangeInclusive<u16>,
    next_port: u16,
    listeners: Vec<Listening>,
    /// Accepted connections whose MPA request is arriving, connects in
    /// progress, lingering replies: a pass visits those the stack listed
    /// active or whose deadline passed.
    pending: ConnSlots<Pending>,
    dials: ConnSlots<Dial>,
    /// The connections the core drives, the ones the next pass visits,
    /// their QPs' timers.
    conns: ConnSlots<Conn>,
    /// Slots of connections the application dropped that a visit of
    /// this pass found closed or past [`LINGER`]: [`Self::reap`]
    /// destroys their QPs.
    finished: Vec<usize>,
    /// The stack's active connections of the current pass.
    active: Vec<ConnId>,
    /// Local ports of accepted connections (they stay steered after their
    /// listener is gone), with how many connections use each.
    local_ports: HashMap<u16, usize>,
    lingering: ConnSlots<Lingering>,
    /// Visits of `pending`, `dials` and `lingering` entries and of
    /// connections the application dropped.
    pub(crate) lifecycle_visits: u64,
    /// [`super::EngineStats::visits`], [`super::EngineStats::idle_visits`].
    visits: u64,
    idle_visits: u64,
    /// A connection or listener went away: recompute the steered ports.
    steer_dirty: bool,
    /// Multi-core: the flow keys of accepted connections, forgotten in the
    /// shared flow table when they are released.
    passive: HashMap<ConnId, FlowKey>,
    /// Outgoing connections from `dial` until the device adds them
    /// (`add_conn`) or drops them: they count as load.
    opening: std::collections::HashSet<ConnId>,
    /// Keep FPDUs inside TCP segments ([`XdpConfig::align_fpdus`]).
    ///
    /// [`XdpConfig::align_fpdus`]: super::XdpConfig::align_fpdus
    align: bool,
    /// Connections that queued a segment this pass and may have more.
    tx_more: Vec<usize>,
    pub(crate) passes: u64,
    /// Time split of the multi-core passes: (I/O, device-lock wait, core)
    /// in nanoseconds.
    pub(crate) timing: (u64, u64, u64),
}

impl std::fmt::Debug for XdpIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpIo")
            .field("index", &self.index)
            .field("queue", &self.queue)
            .field("ip", &self.ip)
            .field("conns", &self.conns.len())
            .finish_non_exhaustive()
    }
}

pub(crate) fn mac_of(ifname: &str) -> std::io::Result<[u8; 6]> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(std::io::Error::from)?;
    addrs
        .filter(|a| a.interface_name == ifname)
        .find_map(|a| a.address?.as_link_addr()?.addr())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no MAC address for interface {ifname:?}"),
            )
        })
}

impl XdpIo {
    /// Open the device's engines: one AF_XDP socket (own UMEM) and
    /// smoltcp stack per receive queue of `cfg`, one steering program
    /// (attached in the calling thread's network namespace) whose XSKMAP
    /// holds every socket at its queue. `seed` (the device's) varies the
    /// TCP initial sequence numbers and the first ephemeral port, so two
    /// engines never start alike (RFC 6528, RFC 6056).
    pub(crate) fn open_all(
        cfg: &XdpConfig,
        now: CoreInstant,
        seed: u64,
    ) -> std::io::Result<Vec<Self>> {
        let io_err = |e: iwarp_bpf::Error| std::io::Error::other(e.to_string());
        let mac = match cfg.mac {
            Some(m) => m,
            None => mac_of(&cfg.ifname)?,
        };
        let queues = cfg.engine_queues();
        let n = queues.len();
        let mut sorted = queues.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != n {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a receive queue is listed twice",
            ));
        }
        let parts: Vec<RangeInclusive<u16>> = (0..n)
            .map(|i| cfg.ephemeral_part(i, n))
            .collect::<Option<_>>()
            .filter(|_| *cfg.ephemeral_ports.start() != 0)
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "the ephemeral port range is empty or smaller than the engine count",
                )
            })?;
        let base = Steer::base(cfg.ip, &cfg.ephemeral_ports);
        let steering = Steering::attach(cfg.ifname.as_str(), cfg.attach, &base).map_err(|e| {
            tracing::debug!(ifname = %cfg.ifname, attach = ?cfg.attach, error = %e, "XDP attach failed");
            io_err(e)
        })?;
        tracing::info!(
            ifname = %cfg.ifname,
            attach = ?cfg.attach,
            mode = ?steering.mode(),
            prog_id = steering.prog_id(),
            "XDP steering program attached"
        );
        let steer = Steer::new(Some(steering), cfg, n);
        let frame_len = cfg.frame_len();
        let inboxes: Vec<Arc<Inbox>> = (0..n).map(|_| Arc::new(Inbox::new(frame_len))).collect();
        let flows = Arc::new(Flows::default());
        let mut engines = Vec::with_capacity(n);
        for (index, (&queue, part)) in queues.iter().zip(&parts).enumerate() {
            let frames = Frames::new(&cfg.ifname, queue, &Options::of(cfg))?;
            if let BindMode::Copy { zero_copy_refused } = frames.mode() {
                tracing::info!(
                    ifname = %cfg.ifname,
                    queue,
                    reason = %zero_copy_refused,
                    "zero-copy AF_XDP refused by the driver: copy mode"
                );
            }
            match &frames.csum_offload {
                None => {
                    tracing::info!(ifname = %cfg.ifname, queue, "TCP transmit checksums offloaded (Tx metadata)")
                }
                Some(why) => {
                    tracing::info!(ifname = %cfg.ifname, queue, why = %why, "TCP transmit checksums computed by smoltcp")
                }
            }
            // Only the first engine captures.
            let pcap = match (index, cfg.pcap.as_deref()) {
                (0, Some(p)) => Some(Pcap::create(p)?),
                _ => None,
            };
            let mut dev = XskDevice::new(frames, cfg.mtu, pcap)?;
            dev.forward.others = parts
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != index)
                .map(|(j, r)| (j, r.clone()))
                .collect();
            dev.forward.inboxes = inboxes.clone();
            dev.forward.flows = flows.clone();
            dev.forward.me = index;
            engines.push(Self::engine(
                cfg, index, queue, part, dev, mac, &steer, now, seed,
            )?);
        }
        Ok(engines)
    }

    /// Engine `index` over `dev` on receive queue `queue`, with local
    /// ports `part` and the device's steering `steer`.
    #[allow(clippy::too_many_arguments)]
    fn engine(
        cfg: &XdpConfig,
        index: usize,
        queue: u32,
        part: &RangeInclusive<u16>,
        dev: XskDevice,
        mac: [u8; 6],
        steer: &Arc<Steer>,
        now: CoreInstant,
        seed: u64,
    ) -> std::io::Result<Self> {
        let io_err = |e: iwarp_bpf::Error| std::io::Error::other(e.to_string());
        let fill_frames = dev.frames.fill_frames();
        let fd = dev.frames.fd();
        let multi_buffer = dev.frames.layout.multi_buffer();
        let zero_copy = dev.frames.zero_copy();
        let mut tcp = cfg.tcp;
        tcp.seed ^= seed ^ (index as u64).rotate_left(17);
        // Half the frames stock the fill ring; the windows share half
        // of those. The rest takes what arrives beyond the windows: the
        // burst the engine holds until its next refill, the peers'
        // acknowledgements and window updates, zero-window probes and
        // retransmissions.
        if tcp.window_frames.is_none() {
            tcp.window_frames = Some(fill_frames / 2);
        }
        let stack = Stack::new(
            dev,
            EthernetAddress(mac),
            cfg.ip,
            cfg.prefix,
            cfg.gateway,
            tcp,
            smol(now),
        );
        let (lo, hi) = (*part.start(), *part.end());
        let span = u64::from(hi - lo) + 1;
        let first_port = lo + (seed.rotate_left(29) % span) as u16;
        {
            let g = lock(&steer.inner);
            if let Some(s) = &g.steering {
                s.set_xsk(queue, &RawFd(fd)).map_err(io_err)?;
            }
        }
        tracing::info!(
            ifname = %cfg.ifname,
            queue,
            engine = index,
            ip = %cfg.ip,
            mtu = cfg.mtu,
            frames = cfg.frames,
            frame_size = cfg.frame_size(),
            multi_buffer,
            zero_copy,
            ephemeral_ports = ?part,
            "AF_XDP socket bound"
        );
        Ok(Self {
            steer: steer.clone(),
            index,
            queue,
            stack,
            ip: cfg.ip,
            ephemeral: part.clone(),
            next_port: first_port,
            listeners: Vec::new(),
            pending: ConnSlots::default(),
            dials: ConnSlots::default(),
            conns: ConnSlots::default(),
            finished: Vec::new(),
            active: Vec::new(),
            local_ports: HashMap::new(),
            lingering: ConnSlots::default(),
            lifecycle_visits: 0,
            visits: 0,
            idle_visits: 0,
            steer_dirty: false,
            passive: HashMap::new(),
            opening: std::collections::HashSet::new(),
            align: cfg.align_fpdus,
            tx_more: Vec::new(),
            passes: 0,
            timing: (0, 0, 0),
        })
    }

    /// The engine on end `end` of an in-process link: no interface, no
    /// steering program.
    pub(crate) fn open_link(end: &LinkEnd, now: CoreInstant, seed: u64) -> std::io::Result<Self> {
        let cfg = end.config();
        let mac = cfg
            .mac
            .ok_or_else(|| std::io::Error::other("a link end without a MAC address"))?;
        let steer = Steer::new(None, cfg, 1);
        let frames = Frames::link(&end.end)?;
        let pcap = cfg.pcap.as_deref().map(Pcap::create).transpose()?;
        let dev = XskDevice::new(frames, cfg.mtu, pcap)?;
        tracing::info!(side = end.side(), ip = %cfg.ip, mtu = cfg.mtu, "in-process link end opened");
        Self::engine(cfg, 0, 0, &cfg.ephemeral_ports, dev, mac, &steer, now, seed)
    }

    /// Index among the device's engines.
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// The device's steering program (shared by its engines).
    pub(crate) fn steer(&self) -> &Arc<Steer> {
        &self.steer
    }

    /// Whether this engine handed frames to other engines since the last
    /// call (their threads may sleep: wake them).
    pub(crate) fn take_forwarded(&mut self) -> bool {
        self.stack.device_mut().take_forwarded()
    }

    /// Connections (and connects in progress) this engine drives.
    pub(crate) fn load(&self) -> usize {
        self.conns.len() + self.opening.len() + self.pending.len()
    }

    /// What a thread about to sleep for this engine waits on
    /// ([`Frames::sleep_fd`]).
    pub(crate) fn fd(&self) -> i32 {
        self.stack.device().frames.sleep_fd()
    }

    pub(crate) fn stats(&self) -> (iwarp_tcp::Counters, XdpStats) {
        let dev = self.stack.device();
        let mut x = XdpStats {
            mode: self.steer.mode(),
            rings: dev.counters(),
            steering: self.steer.counters(),
            ..XdpStats::default()
        };
        x.zero_copy = dev.frames.zero_copy();
        x.multi_buffer = dev.frames.layout.multi_buffer();
        x.tx_csum_offload = dev.frames.csum_offload.is_none();
        if let Some(s) = dev.frames.xdp_statistics() {
            x.rx_dropped = s.rx_dropped;
            x.rx_ring_full = s.rx_ring_full;
            x.rx_fill_ring_empty = s.rx_fill_ring_empty_descs;
            x.rx_invalid_descs = s.rx_invalid_descs;
            x.tx_invalid_descs = s.tx_invalid_descs;
            x.tx_ring_empty = s.tx_ring_empty_descs;
        }
        (self.stack.counters(), x)
    }

    pub(crate) fn engine_stats(&self) -> super::EngineStats {
        let (tcp, xdp) = self.stats();
        let dev = self.stack.device();
        super::EngineStats {
            queue: self.queue,
            passes: self.passes,
            connections: self.conns.len(),
            visits: self.visits,
            idle_visits: self.idle_visits,
            tcp,
            tcp_connections: self.stack.connection_count(),
            flows: self.stack.flow_count(),
            xdp,
            forwarded_out: dev.forwarded_out,
            forwarded_in: dev.forwarded_in,
            forward_dropped: dev.forward_dropped,
            io_ns: self.timing.0,
            lock_wait_ns: self.timing.1,
            core_ns: self.timing.2,
        }
    }

    pub(crate) fn conn_count(&self) -> usize {
        self.conns.len()
    }

    fn port_in_use(&self, port: u16) -> bool {
        self.listeners.iter().any(|l| l.port == port)
    }

    /// The next ephemeral port (round robin, skipping listening ones).
    fn ephemeral_port(&mut self) -> u16 {
        let (lo, hi) = (*self.ephemeral.start(), *self.ephemeral.end());
        loop {
            let p = self.next_port;
            self.next_port = if p >= hi { lo } else { p + 1 };
            if !self.port_in_use(p) {
                return p;
            }
        }
    }

    /// Steer the ephemeral range, every listening port, and the local
    /// port of every accepted connection still alive on a port nobody
    /// listens on any more (a server that accepted and closed its listener
    /// keeps its connections). The map is written only when the set
    /// changed.
    fn update_steering(&mut self) {
        self.steer_dirty = false;
        let mut ports: Vec<u16> = self.listeners.iter().map(|l| l.port).collect();
        ports.extend(self.local_ports.keys());
        let listening: Vec<u16> = self.listeners.iter().map(|l| l.port).collect();
        self.stack.device_mut().forward.listening = listening;
        ports.sort_unstable();
        ports.dedup();
        self.steer.publish(self.index, ports);
    }

    /// Check a listen address (our address or unspecified) and resolve
    /// port 0 to one of this engine's ephemeral ports.
    pub(crate) fn listen_port(&mut self, addr: SocketAddr) -> Result<u16, CmError> {
        let ok_ip = match addr.ip() {
            std::net::IpAddr::V4(ip) => ip.is_unspecified() || ip == self.ip,
            std::net::IpAddr::V6(_) => return Err(CmError::AddressFamily),
        };
        if !ok_ip {
            return Err(CmError::Io(std::io::ErrorKind::AddrNotAvailable));
        }
        Ok(match addr.port() {
            0 => self.ephemeral_port(),
            p => p,
        })
    }

    /// Listen on `port` (from [`Self::listen_port`]); requests go to
    /// `shared` (every engine of a device listens, into one queue).
    pub(crate) fn listen(
        &mut self,
        port: u16,
        shared: &Arc<ListenShared>,
    ) -> Result<SocketAddr, CmError> {
        if self.port_in_use(port) {
            return Err(CmError::Io(std::io::ErrorKind::AddrInUse));
        }
        if !self.steer.can_add(port) {
            return Err(CmError::Io(std::io::ErrorKind::AddrNotAvailable));
        }
        self.stack
            .listen(port)
            .map_err(|_| CmError::Io(std::io::ErrorKind::AddrInUse))?;
        self.listeners.push(Listening {
            port,
            shared: shared.clone(),
        });
        self.update_steering();
        Ok(SocketAddr::new(self.ip.into(), port))
    }

    /// Stop listening: close the port and every connection whose request
    /// the application has not taken.
    pub(crate) fn remove_listener(&mut self, shared: &Arc<ListenShared>) {
        let Some(i) = self
            .listeners
            .iter()
            .position(|l| Arc::ptr_eq(&l.shared, shared))
        else {
            return;
        };
        let l = self.listeners.swap_remove(i);
        self.stack.unlisten(l.port);
        let stack = &mut self.stack;
        let mut gone = Vec::new();
        self.pending.retain(|p| {
            let keep = !Arc::ptr_eq(p.acc.listener(), shared);
            if !keep {
                let _ = stack.abort(p.conn);
                gone.push(p.conn);
            }
            keep
        });
        for conn in gone {
            self.add_lingering(conn, Vec::new());
        }
        // The device resets the requests queued in `shared` (they may
        // belong to other engines).
        self.update_steering();
    }

    /// Reset a connection nobody will use (a dropped request, an
    /// abandoned dial) and forget it once the reset left.
    pub(crate) fn drop_sock(&mut self, sock: Sock) {
        if let Sock::Xdp(_, c) = sock {
            let _ = self.stack.abort(c);
            if let Some(i) = self.dials.of_key(c) {
                self.dials.remove(i);
            }
            self.opening.remove(&c);
            self.add_lingering(c, Vec::new());
        }
    }

    /// Send `out` on `conn`, then close it (once per connection).
    fn add_lingering(&mut self, conn: ConnId, out: Vec<u8>) {
        if self.lingering.of_key(conn).is_none() {
            self.lingering.insert(Lingering {
                conn,
                reply: Reply::new(out),
                since: None,
                hot: false,
                timer: None,
            });
        }
    }

    /// Start a TCP connect to `addr`; the pass reports the outcome in
    /// `shared`'s `tcp` field.
    pub(crate) fn dial(
        &mut self,
        addr: SocketAddr,
        shared: Arc<ConnShared>,
    ) -> Result<(ConnId, SocketAddr), CmError> {
        let std::net::IpAddr::V4(ip) = addr.ip() else {
            return Err(CmError::AddressFamily);
        };
        let port = self.ephemeral_port();
        let conn = self
            .stack
            .connect((ip, addr.port()), port)
            .map_err(|_| CmError::Unreachable)?;
        self.dials.insert(Dial {
            conn,
            shared,
            hot: false,
            timer: None,
        });
        self.opening.insert(conn);
        // The reply may arrive on another queue: the other engines forward
        // this engine's ports here.
        Ok((conn, SocketAddr::new(self.ip.into(), port)))
    }

    /// Drive `qp` over `conn`.
    pub(crate) fn add_conn(&mut self, qp: QpId, conn: ConnId, shared: Arc<ConnShared>) {
        self.opening.remove(&conn);
        self.conns.insert(Conn {
            core: Driven::new(qp, shared),
            conn,
            closing: false,
            gone: false,
            orphan: None,
            hot: false,
            timer: None,
        });
    }

    /// Visit the connection in slot `i` at the next pass.
    fn mark(&mut self, i: usize) {
        self.conns.mark(i);
    }

    /// The application changed `qp` (posted to it, disconnected it):
    /// visit its connection at the next pass.
    pub(crate) fn touch_qp(&mut self, qp: QpId) {
        if let Some(i) = self.conns.of_qp(qp) {
            self.mark(i);
        }
    }

    /// Mark the connections with something to do: the stack's active
    /// ones (driven, accepted, dialing or lingering), the QPs the
    /// application touched, due core timers.
    fn gather(&mut self, touched: &[QpId], now: CoreInstant) {
        let mut active = std::mem::take(&mut self.active);
        self.stack.take_active(&mut active);
        for id in active.drain(..) {
            if let Some(i) = self.conns.of_key(id) {
                self.mark(i);
            } else if let Some(i) = self.pending.of_key(id) {
                self.pending.mark(i);
            } else if let Some(i) = self.dials.of_key(id) {
                self.dials.mark(i);
            } else if let Some(i) = self.lingering.of_key(id) {
                self.lingering.mark(i);
            }
        }
        self.active = active;
        for &qp in touched {
            self.touch_qp(qp);
        }
        self.conns.fire(now);
    }

    /// Send `bytes` on `sock`, then close it.
    pub(crate) fn linger(&mut self, sock: Sock, bytes: Vec<u8>) {
        if let Sock::Xdp(_, conn) = sock {
            self.add_lingering(conn, bytes);
        }
    }

    /// The application dropped `qp`: returns false if the engine does not
    /// drive it (the caller destroys it).
    pub(crate) fn release_qp(&mut self, qp: QpId, now: CoreInstant) -> bool {
        let Some(i) = self.conns.of_qp(qp) else {
            return false;
        };
        if let Some(c) = self.conns.get_mut(i) {
            c.orphan.get_or_insert(now);
        }
        // The visit closes the connection or finds it closed, and sets
        // its deadline.
        self.mark(i);
        true
    }

    pub(crate) fn pass_events(&mut self, ctx: &mut Context, qp: QpId) {
        if let Some(c) = self.conns.of_qp(qp).and_then(|i| self.conns.get(i)) {
            c.core.events(ctx);
        }
    }

    /// The earliest of smoltcp's and the connections' timers.
    pub(crate) fn next_deadline(&mut self, now: CoreInstant) -> Option<CoreInstant> {
        let tcp = self.stack.poll_at(smol(now)).map(core);
        let qps = self.conns.next_timer();
        let hot = (self.conns.any_hot()
            || self.pending.any_hot()
            || self.dials.any_hot()
            || self.lingering.any_hot())
        .then_some(now);
        let pending = self.pending.next_timer();
        let lingering = self.lingering.next_timer();
        [pending, lingering, qps, tcp, hot]
            .into_iter()
            .flatten()
            .min()
    }

    /// Reset every connection and send the resets (the device is closing).
    pub(crate) fn shutdown(&mut self, ctx: &mut Context, now: CoreInstant) {
        for c in self.conns.iter_mut() {
            let _ = self.stack.abort(c.conn);
            c.core.shut(ctx);
        }
        for p in self.pending.iter() {
            let _ = self.stack.abort(p.conn);
        }
        for d in self.dials.iter() {
            let _ = self.stack.abort(d.conn);
            d.shared.set_tcp(Err(CmError::Closed));
        }
        // A reject reply still queued goes out with this last poll.
        self.lingering.mark_all();
        self.pump_lingering(now);
        self.stack.poll(smol(now));
        let dev = self.stack.device_mut();
        dev.tx_burst();
        dev.flush_capture();
    }

    /// Steps 1-2 of a pass (no core state involved: a multi-core device
    /// runs them without the device lock).
    pub(crate) fn io_in(&mut self, now: CoreInstant) -> usize {
        self.passes += 1;
        super::device::rx_and_poll(&mut self.stack, smol(now))
    }

    /// Steps 3-4: everything that touches the core's context. `touched`:
    /// QPs the application changed since the last pass (those of other
    /// engines are skipped); the QPs this pass destroyed go to `reaped`.
    pub(crate) fn drive(
        &mut self,
        ctx: &mut Context,
        now: CoreInstant,
        touched: &[QpId],
        reaped: &mut Vec<QpId>,
    ) -> usize {
        self.gather(touched, now);
        let mut work = self.accept_new(now);
        work += self.pump_pending(now);
        work += self.pump_dials();
        let hot = self.conns.take_hot();
        for &i in &hot {
            work += self.pump_conn(ctx, i, now);
            let Some(c) = self.conns.get(i) else {
                continue;
            };
            // A dropped connection: reaped once closed or at its deadline.
            let linger = c.orphan.map(|since| since + LINGER);
            if let Some(at) = linger {
                self.lifecycle_visits += 1;
                if c.gone || at <= now {
                    self.finished.push(i);
                    continue;
                }
            }
            let timer = ctx
                .poll_timeout(c.core.qp())
                .into_iter()
                .chain(linger)
                .min();
            self.conns.schedule(i, timer);
        }
        self.conns.give_back(hot);
        work += self.segment_rounds(ctx, now);
        work += self.pump_lingering(now);
        work + self.reap(ctx, reaped)
    }

    /// Steps 5-6 (as [`Self::io_in`], without the device lock).
    pub(crate) fn io_out(&mut self, now: CoreInstant) -> usize {
        let mut work = 0;
        // Egress for what the pass queued; a pass that queued nothing left
        // the first poll's egress complete.
        if self.stack.egress_due() && self.stack.poll(smol(now)) {
            work += 1;
        }
        let dev = self.stack.device_mut();
        work += dev.tx_burst();
        if dev.frames.tx_busy() || dev.rx_queued() > 0 {
            work += 1;
        }
        if self.steer_dirty {
            self.update_steering();
        }
        work
    }

    fn accept_new(&mut self, now: CoreInstant) -> usize {
        let mut work = 0;
        for l in &self.listeners {
            while let Some(conn) = self.stack.accept(l.port) {
                work += 1;
                if let Some((
                    local,
                    IpEndpoint {
                        addr: IpAddress::Ipv4(ip),
                        port,
                    },
                )) = self.stack.endpoints(conn)
                {
                    let key = (u32::from_be_bytes(ip.octets()), port, local.port);
                    tracing::debug!(peer = %to_std(IpAddress::Ipv4(ip), port), "TCP connection accepted");
                    self.passive.insert(conn, key);
                    *self.local_ports.entry(local.port).or_default() += 1;
                }
                let acc = Accepting::new(l.shared.clone(), now);
                let deadline = acc.deadline();
                let i = self.pending.insert(Pending {
                    conn,
                    acc,
                    hot: false,
                    timer: None,
                });
                self.pending.schedule(i, deadline);
            }
        }
        work
    }

    /// Read MPA requests (exactly the request's bytes: what follows stays
    /// in the socket until the QP exists) of the accepted connections
    /// the stack listed active or whose deadline passed; hand complete
    /// ones over.
    fn pump_pending(&mut self, now: CoreInstant) -> usize {
        let mut work = 0;
        self.pending.fire(now);
        let hot = self.pending.take_hot();
        for &i in &hot {
            work += self.pump_one_pending(i, now);
        }
        self.pending.give_back(hot);
        work
    }

    fn pump_one_pending(&mut self, i: usize, now: CoreInstant) -> usize {
        let mut work = 0;
        let Some(p) = self.pending.get_mut(i) else {
            return 0;
        };
        self.lifecycle_visits += 1;
        let mut failed = p.acc.expired(now);
        let mut reason = if failed {
            Some("timed out waiting for the MPA request".to_string())
        } else {
            None
        };
        let mut request = None;
        if !failed {
            let acc = &mut p.acc;
            let r = self.stack.recv(p.conn, |b| {
                if request.is_some() || failed {
                    return 0;
                }
                let (used, fed) = acc.feed(b, now);
                match fed {
                    Fed::More => {}
                    Fed::Request(req) => request = Some(req),
                    Fed::Failed(e) => {
                        failed = true;
                        reason = Some(e);
                    }
                }
                used
            });
            match r {
                Ok(n) => work += n,
                Err(e) => {
                    failed = true;
                    reason.get_or_insert_with(|| format!("{e:?}"));
                }
            }
            if self.stack.is_reset(p.conn) {
                failed = true;
                reason.get_or_insert_with(|| "reset by the peer".to_string());
            }
        }
        if failed {
            let Some(p) = self.pending.remove(i) else {
                return work;
            };
            let peer = self
                .stack
                .endpoints(p.conn)
                .map(|(_, r)| to_std(r.addr, r.port));
            lifecycle::dropped(peer, reason.as_deref().unwrap_or("unknown"));
            self.drop_sock(Sock::Xdp(self.index, p.conn));
            return work + 1;
        }
        let Some(request) = request else {
            // The next visit comes with new bytes (the stack lists the
            // connection active) or the deadline.
            let deadline = p.acc.deadline();
            self.pending.schedule(i, deadline);
            return work;
        };
        let Some(p) = self.pending.remove(i) else {
            return work;
        };
        work += 1;
        let (local, peer) = match self.stack.endpoints(p.conn) {
            Some((l, r)) => (to_std(l.addr, l.port), to_std(r.addr, r.port)),
            None => {
                self.drop_sock(Sock::Xdp(self.index, p.conn));
                return work;
            }
        };
        let emss = self
            .stack
            .emss(p.conn)
            .unwrap_or_else(|| self.stack.local_mss());
        let sock = Sock::Xdp(self.index, p.conn);
        p.acc
            .hand_over(request, sock, peer, local, emss, Vec::new());
        work
    }

    /// Report the outcome of the connects the stack listed active.
    fn pump_dials(&mut self) -> usize {
        let mut work = 0;
        let hot = self.dials.take_hot();
        for &i in &hot {
            let Some(d) = self.dials.get(i) else {
                continue;
            };
            self.lifecycle_visits += 1;
            let stack = &mut self.stack;
            let outcome = if stack.is_established(d.conn) {
                Ok(stack.emss(d.conn).unwrap_or_else(|| stack.local_mss()))
            } else if stack.is_reset(d.conn) || stack.is_closed(d.conn) {
                self.opening.remove(&d.conn);
                let _ = stack.release(d.conn);
                tracing::debug!("connect failed: TCP connection refused or reset");
                Err(CmError::ConnectionRefused)
            } else {
                continue;
            };
            if let Some(d) = self.dials.remove(i) {
                work += 1;
                d.shared.set_tcp(outcome);
            }
        }
        self.dials.give_back(hot);
        work
    }

    fn pump_conn(&mut self, ctx: &mut Context, i: usize, now: CoreInstant) -> usize {
        let Some(c) = self.conns.get_mut(i) else {
            return 0;
        };
        let mut io = XdpStream {
            stack: &mut self.stack,
            passive: &mut self.passive,
            local_ports: &mut self.local_ports,
            conn: c.conn,
            closing: &mut c.closing,
            gone: &mut c.gone,
            align: self.align,
            segments: false,
            more: false,
            now: smol(now),
        };
        let work = c.core.visit(ctx, &mut io, now);
        self.visits += 1;
        self.idle_visits += u64::from(work == 0);
        let (segments, more) = (io.segments, io.more);
        if segments {
            self.tx_more.push(i);
        }
        if more && !c.gone {
            self.mark(i);
        }
        work
    }

    /// FPDU alignment: a connection queues whole segments
    /// ([`Stack::send_segment`]) and, after one it had to send alone, waits
    /// until smoltcp has sent it. While some queued segments this pass and
    /// may have more, smoltcp sends a round and they queue the next, up to
    /// [`SEGMENT_ROUNDS`] rounds (or until the transmit frames run out,
    /// which leaves a segment unsent and stops its connection).
    fn segment_rounds(&mut self, ctx: &mut Context, now: CoreInstant) -> usize {
        let mut work = 0;
        for _ in 0..SEGMENT_ROUNDS {
            if self.tx_more.is_empty() {
                break;
            }
            self.stack.poll_egress(smol(now));
            let (conns, stack) = (&self.conns, &mut self.stack);
            self.tx_more.retain(|&i| {
                let Some(c) = conns.get(i) else {
                    return false;
                };
                if c.closing || c.gone || !ctx.may_transmit(c.core.qp()) {
                    return false;
                }
                let n = send_segments(stack, ctx, c.core.qp(), c.conn).unwrap_or(0);
                work += n;
                n > 0
            });
        }
        // Connections that still had segments to queue go on next pass.
        let more = std::mem::take(&mut self.tx_more);
        for &i in &more {
            self.mark(i);
        }
        self.tx_more = more;
        self.tx_more.clear();
        work
    }

    /// Send what the lingering connections the stack listed active (or
    /// whose deadline passed) have left; close them once sent; forget
    /// them once closed, reset, or [`LINGER`] after their first visit.
    fn pump_lingering(&mut self, now: CoreInstant) -> usize {
        let mut work = 0;
        let mut released = false;
        self.lingering.fire(now);
        let hot = self.lingering.take_hot();
        for &i in &hot {
            let Some(l) = self.lingering.get_mut(i) else {
                continue;
            };
            self.lifecycle_visits += 1;
            let stack = &mut self.stack;
            let since = *l.since.get_or_insert(now);
            if !l.reply.sent() {
                let conn = l.conn;
                if let Ok(n) = l.reply.write(|rest| stack.send_slice(conn, rest)) {
                    work += n;
                }
                if l.reply.sent() {
                    let _ = stack.close(conn);
                }
            }
            let done = stack.is_closed(l.conn)
                || stack.is_reset(l.conn)
                || stack.state(l.conn).is_none()
                || now.saturating_duration_since(since) >= LINGER;
            if !done {
                self.lingering.schedule(i, Some(since + LINGER));
                continue;
            }
            let conn = l.conn;
            let _ = stack.abort(conn);
            release(stack, &mut self.passive, &mut self.local_ports, conn);
            self.lingering.remove(i);
            released = true;
            work += 1;
        }
        self.lingering.give_back(hot);
        if released {
            self.steer_dirty = true;
        }
        work
    }

    /// Destroy the QPs of the connections the application dropped that
    /// this pass's visits found closed or past their deadline (those
    /// reset first); the destroyed QPs go to `reaped`. Dropped
    /// connections still closing wait for the visit the stack's activity
    /// or their deadline brings.
    fn reap(&mut self, ctx: &mut Context, reaped: &mut Vec<QpId>) -> usize {
        let mut n = 0;
        let mut finished = std::mem::take(&mut self.finished);
        for i in finished.drain(..) {
            let Some(c) = self.conns.get_mut(i) else {
                continue;
            };
            if c.orphan.is_none() {
                continue;
            }
            if !c.gone {
                let _ = self.stack.abort(c.conn);
                release(
                    &mut self.stack,
                    &mut self.passive,
                    &mut self.local_ports,
                    c.conn,
                );
                c.gone = true;
            }
            c.core.shut(ctx);
            let _ = ctx.destroy_qp(c.core.qp());
            reaped.push(c.core.qp());
            self.conns.remove(i);
            n += 1;
        }
        self.finished = finished;
        if n > 0 {
            self.steer_dirty = true;
        }
        n
    }
}

/// A driven connection's TCP connection during one visit: the [`Stream`]
/// its core's visit reads and writes.
struct XdpStream<'a> {
    stack: &'a mut Stack<XskDevice>,
    passive: &'a mut HashMap<ConnId, FlowKey>,
    local_ports: &'a mut HashMap<u16, usize>,
    conn: ConnId,
    closing: &'a mut bool,
    gone: &'a mut bool,
    /// Queue whole segments ([`XdpIo::segment_rounds`]).
    align: bool,
    /// Segments were queued and the QP may have more: the connection
    /// takes part in this pass's segment rounds.
    segments: bool,
    /// The transmit buffer filled up and may hide more to send: the
    /// connection comes back at the next pass.
    more: bool,
    /// The pass's clock, for the segments sent at once
    /// ([`Stack::egress_now`]).
    now: SmolInstant,
}

impl Stream for XdpStream<'_> {
    fn gone(&self) -> bool {
        *self.gone
    }

    fn receive(
        &mut self,
        ctx: &mut Context,
        core: &Driven,
        now: CoreInstant,
    ) -> (usize, Option<Ending>) {
        let mut work = 0;
        match self.stack.recv(self.conn, |b| core.input(ctx, b, now)) {
            Ok(n) => work = n,
            Err(TcpError::Finished) => return (0, Some(Ending::Fin)),
            Err(_) => {}
        }
        if self.stack.is_reset(self.conn) {
            let reset = std::io::ErrorKind::ConnectionReset;
            return (work, Some(Ending::Failed(reset, "reset by the peer")));
        }
        (work, None)
    }

    fn transmit(&mut self, ctx: &mut Context, qp: QpId) -> Transmitted {
        let mut t = Transmitted {
            drained: true,
            ..Transmitted::default()
        };
        // A QP with nothing to send gets something only from a request
        // (the application's, which touches it) or from what it receives
        // (which lists the connection): the stack need not list it for
        // acknowledgements, window updates and probes.
        let idle = !ctx.may_transmit(qp);
        self.stack.set_writer_idle(self.conn, idle);
        if idle || self.stack.is_reset(self.conn) {
            return t;
        }
        let sent = if self.align {
            send_segments(self.stack, ctx, qp, self.conn)
        } else {
            self.stack.send(self.conn, |b| ctx.poll_transmit(qp, b))
        };
        if let Ok(n) = sent {
            if n > 0 {
                self.stack.egress_now(self.conn, self.now);
            }
            t.work = n;
            self.segments = self.align && n > 0 && ctx.may_transmit(qp);
            // A full buffer may hide more to send.
            t.drained = n == 0 || self.stack.state(self.conn).is_none();
            self.more = !t.drained && !self.align;
        }
        t
    }

    fn closing(&self) -> bool {
        *self.closing
    }

    /// Queue our FIN; a failed connection (reset) has nothing to send.
    fn close(&mut self, failed: bool) {
        if !failed {
            let _ = self.stack.close(self.conn);
        }
        *self.closing = true;
    }

    /// Once closed (or reset after our FIN), the connection is released.
    fn closed(&mut self) -> Option<bool> {
        let (stack, conn) = (&mut *self.stack, self.conn);
        if *self.gone || !(stack.is_closed(conn) || (*self.closing && stack.is_reset(conn))) {
            return None;
        }
        *self.gone = true;
        let reset = stack.is_reset(conn);
        release(stack, self.passive, self.local_ports, conn);
        Some(reset)
    }
}

/// FPDU alignment: `qp`'s next whole segments into its TCP connection.
fn send_segments(
    stack: &mut Stack<XskDevice>,
    ctx: &mut Context,
    qp: QpId,
    conn: ConnId,
) -> Result<usize, TcpError> {
    stack.send_segment(conn, |b, limit| ctx.poll_transmit_within(qp, b, limit))
}

/// Release `conn` and, if it was accepted, forget it in the device's
/// flow table.
fn release(
    stack: &mut Stack<XskDevice>,
    passive: &mut HashMap<ConnId, FlowKey>,
    local_ports: &mut HashMap<u16, usize>,
    conn: ConnId,
) {
    if let Some(key) = passive.remove(&conn) {
        stack.device_mut().forget(key);
        if let Some(n) = local_ports.get_mut(&key.2) {
            *n -= 1;
            if *n == 0 {
                local_ports.remove(&key.2);
            }
        }
    }
    let _ = stack.release(conn);
}

#[allow(unreachable_patterns)]
fn to_std(addr: IpAddress, port: u16) -> SocketAddr {
    match addr {
        IpAddress::Ipv4(a) => SocketAddr::new(a.into(), port),
        _ => SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port),
    }
}

/// A raw descriptor as `AsRawFd` (for the XSKMAP update).
pub(crate) struct RawFd(pub(crate) i32);

impl std::os::fd::AsRawFd for RawFd {
    fn as_raw_fd(&self) -> i32 {
        self.0
    }
}
