//! [`Stack`]: one smoltcp `Interface` and its TCP sockets over any
//! `phy::Device`, sans-IO: time comes in as an argument, the device is
//! the only way bytes enter or leave.

use std::collections::{HashMap, VecDeque};
use std::fmt;

use crate::hash::HandleHash;

use smoltcp::iface::{Config as IfaceConfig, Interface, PollIngressSingleResult, PollResult};
use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::phy::{Device, Medium};
use smoltcp::socket::tcp::{self, CongestionControl, State};
use smoltcp::socket::AnySocket;
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr, HardwareAddress, IpAddress, IpCidr, IpEndpoint, Ipv4Address,
};

use crate::config::Config;
use crate::port::{tcp_mss, Flow, Port};

/// How long a static neighbour entry lives in smoltcp's cache before it is
/// refreshed (smoltcp's entries expire after 60 s).
const NEIGHBOR_REFRESH: Duration = Duration::from_secs(30);

/// smoltcp's assumption when the peer's SYN carried no MSS option.
const DEFAULT_REMOTE_MSS: usize = 536;

/// The smallest segment [`Stack::send_segment`] offers a writer, whatever
/// the peer's MSS: the iWARP layer's smallest full FPDU fits (a peer that
/// announces less gets segments that split FPDUs, not a stall).
const MIN_SEGMENT_LIMIT: usize = 128;

/// A connection of a [`Stack`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(SocketHandle);

/// Why an operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// No such connection (never existed, or released).
    UnknownConnection,
    /// The port already listens.
    AlreadyListening,
    /// The port or address cannot be used (zero port, unspecified address).
    Unaddressable,
    /// The connection is in a state that does not allow the operation
    /// (for example sending after close, or after a reset).
    InvalidState,
    /// The peer closed its direction and every byte has been read.
    Finished,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::UnknownConnection => "unknown connection",
            Self::AlreadyListening => "port already listening",
            Self::Unaddressable => "unaddressable endpoint",
            Self::InvalidState => "invalid connection state",
            Self::Finished => "peer closed the stream",
        })
    }
}

impl std::error::Error for Error {}

/// Stack counters (monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Frames received from the device.
    pub rx_frames: u64,
    /// Bytes of those frames.
    pub rx_bytes: u64,
    /// Frames handed to the device.
    pub tx_frames: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// Polls that stopped ingress at [`Config::ingress_budget`].
    pub ingress_budget_hits: u64,
    /// Polls that stopped egress at [`Config::egress_budget`].
    pub egress_budget_hits: u64,
    /// Connections opened with [`Stack::connect`].
    pub connects: u64,
    /// Connections that reached Established from a listening port.
    pub accepted: u64,
    /// Connections that ended without the FIN exchange (RST or timeout).
    pub resets: u64,
    /// Half-open passive connections that fell back (RST in SYN-RECEIVED).
    pub half_open_dropped: u64,
    /// Times a port stopped listening because its backlog was full.
    pub backlog_full: u64,
    /// Synthetic ARP replies injected for static neighbours.
    pub neighbor_refreshes: u64,
    /// Bare acknowledgements sent with the highest sequence number sent
    /// instead of smoltcp's rewound one (during its resending after a
    /// retransmission timeout), which the peer would drop.
    pub acks_renumbered: u64,
}

/// What the stack knows about one connection beyond smoltcp's state.
#[derive(Clone, Copy, Debug)]
struct Conn {
    last: State,
    established: bool,
    fin_received: bool,
    reset: bool,
    local_port: u16,
    remote: Option<(Ipv4Address, u16)>,
    /// Bytes queued into the socket so far (mod 2^32), for
    /// [`Stack::unsent`].
    written: u32,
    /// [`Stack::send_segment`] last queued less than a full segment:
    /// smoltcp will put the start of whatever follows into that segment,
    /// so nothing more is queued until it has left.
    short_tail: bool,
    /// Nagle's rule is on for the socket (see [`Stack::hold_full`]).
    nagle: bool,
    /// The effective MSS, learnt from the SYNs once established (the
    /// device wrapper keeps the shift of the peer's window field).
    peer_emss: Option<usize>,
}

impl Conn {
    /// The effective MSS, once established.
    fn emss(&self) -> Option<usize> {
        self.peer_emss.filter(|_| self.established)
    }

    /// The key of the device wrapper's tables, once the peer is known.
    fn flow(&self) -> Option<Flow> {
        self.remote.map(|(ip, port)| (ip, port, self.local_port))
    }

    fn new(state: State, local_port: u16) -> Self {
        Self {
            last: state,
            established: false,
            fin_received: false,
            reset: false,
            local_port,
            remote: None,
            written: 0,
            short_tail: false,
            nagle: false,
            peer_emss: None,
        }
    }
}

#[derive(Debug)]
struct Listener {
    port: u16,
    /// The socket currently in Listen, if the backlog allows one.
    socket: Option<SocketHandle>,
    /// Passive connections past Listen, not yet Established.
    half_open: Vec<SocketHandle>,
    /// Established, waiting for [`Stack::accept`].
    ready: VecDeque<SocketHandle>,
}

/// A user-space TCP/IPv4 stack over one Ethernet device. See the crate
/// documentation for the polling order.
pub struct Stack<D: Device> {
    port: Port<D>,
    iface: Interface,
    sockets: SocketSet<'static>,
    config: Config,
    mac: EthernetAddress,
    ip: Ipv4Address,
    neighbors: Vec<(Ipv4Address, EthernetAddress)>,
    neighbor_refresh_at: Instant,
    listeners: Vec<Listener>,
    conns: HashMap<SocketHandle, Conn, HandleHash>,
    counters: Counters,
    /// Something was queued for egress since the last poll (data, a FIN,
    /// a reset, a SYN): see [`Stack::egress_due`].
    egress_due: bool,
    /// Connections whose socket has Nagle's rule on ([`Stack::hold_full`]).
    nagled: Vec<SocketHandle>,
    /// Set by a poll that found nothing to do: until this instant (`None`:
    /// no timer at all) a poll without new frames has nothing to do
    /// either, unless a call below changed a socket ([`Stack::stir`]).
    quiet: Option<Option<Instant>>,
}

impl<D: Device> fmt::Debug for Stack<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stack")
            .field("mac", &self.mac)
            .field("ip", &self.ip)
            .field("connections", &self.conns.len())
            .field("counters", &self.counters())
            .finish_non_exhaustive()
    }
}

/// The MSS the device's MTU allows (a multiple of 4, see `Port`).
fn local_mss<D: Device>(port: &Port<D>) -> usize {
    tcp_mss(port.capabilities().max_transmission_unit)
}

/// See [`Stack::segment_room`].
#[derive(Clone, Copy)]
struct SegmentRoom {
    /// The connection's effective MSS (`None` before it is established).
    emss: Option<usize>,
    /// [`Conn::short_tail`].
    short_tail: bool,
    /// Queued bytes not sent even once.
    unsent: usize,
    /// Sent bytes not acknowledged.
    in_flight: usize,
    /// What the peer's last window leaves beyond them; `None` before its
    /// first acknowledgement.
    room: Option<usize>,
    /// What smoltcp's congestion window leaves beyond the bytes in
    /// flight (`usize::MAX` without congestion control); `None` when the
    /// window is not known (a controller the wrapper does not mirror).
    cwnd_room: Option<usize>,
}

impl SegmentRoom {
    /// Whether Nagle's rule should hold the queue (see
    /// [`Stack::hold_full`]): a full segment waits at its head and at
    /// least two are in flight.
    fn holds_full(&self) -> bool {
        self.emss
            .is_some_and(|emss| self.unsent >= emss && self.in_flight >= 2 * emss)
    }
}

/// Drop what the device wrapper's tables hold for a connection.
fn forget<D>(port: &mut Port<D>, c: &Conn) {
    if let Some(flow) = c.flow() {
        port.forget(flow);
    }
}

impl<D: Device> Stack<D> {
    /// A stack on `device` with address `ip/prefix` and an optional default
    /// gateway (which must lie inside that prefix). Panics if the device
    /// is not an Ethernet device.
    pub fn new(
        device: D,
        mac: EthernetAddress,
        ip: Ipv4Address,
        prefix: u8,
        gateway: Option<Ipv4Address>,
        config: Config,
        now: Instant,
    ) -> Self {
        let mut port = Port::new(device);
        port.sent.mirror_reno = config.congestion == CongestionControl::Reno;
        port.tcp_checksum = port.inner.capabilities().checksum.tcp.tx();
        assert_eq!(
            port.inner.capabilities().medium,
            Medium::Ethernet,
            "the stack runs over Ethernet devices"
        );
        let mut ic = IfaceConfig::new(HardwareAddress::Ethernet(mac));
        ic.random_seed = config.seed;
        let mut iface = Interface::new(ic, &mut port, now);
        iface.update_ip_addrs(|a| {
            // A fresh interface has room for at least one address.
            let _ = a.push(IpCidr::new(IpAddress::Ipv4(ip), prefix));
        });
        if let Some(gw) = gateway {
            // The route table has room for the default route.
            let _ = iface.routes_mut().add_default_ipv4_route(gw);
        }
        Self {
            port,
            iface,
            sockets: SocketSet::new(Vec::new()),
            config,
            mac,
            ip,
            neighbors: Vec::new(),
            neighbor_refresh_at: now,
            listeners: Vec::new(),
            conns: HashMap::default(),
            counters: Counters::default(),
            egress_due: false,
            nagled: Vec::new(),
            quiet: None,
        }
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Our IPv4 address.
    pub fn ip(&self) -> Ipv4Address {
        self.ip
    }

    /// Our MAC address.
    pub fn mac(&self) -> EthernetAddress {
        self.mac
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.port.inner
    }

    /// The device, mutably (for example to move frames in a simulation).
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.port.inner
    }

    /// Counters.
    pub fn counters(&self) -> Counters {
        let c = &self.port.counters;
        Counters {
            rx_frames: c.rx_frames.get(),
            rx_bytes: c.rx_bytes.get(),
            tx_frames: c.tx_frames.get(),
            tx_bytes: c.tx_bytes.get(),
            acks_renumbered: c.acks_renumbered.get(),
            ..self.counters
        }
    }

    /// A static neighbour: `ip` is at `mac`, without asking ARP. ARP stays
    /// enabled for every other address. The entry is fed to smoltcp as a
    /// synthetic ARP reply at the next poll and refreshed before smoltcp's
    /// cache would expire it. `ip` must be inside our prefix.
    pub fn add_neighbor(&mut self, ip: Ipv4Address, mac: EthernetAddress) {
        self.stir();
        self.neighbors.retain(|(i, _)| *i != ip);
        self.neighbors.push((ip, mac));
        self.port.inject.push_back(self.arp_reply(ip, mac));
        self.counters.neighbor_refreshes += 1;
    }

    fn arp_reply(&self, ip: Ipv4Address, mac: EthernetAddress) -> Vec<u8> {
        let arp = ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            source_hardware_addr: mac,
            source_protocol_addr: ip,
            target_hardware_addr: self.mac,
            target_protocol_addr: self.ip,
        };
        let eth = EthernetRepr {
            src_addr: mac,
            dst_addr: self.mac,
            ethertype: EthernetProtocol::Arp,
        };
        let mut buf = vec![0; eth.buffer_len() + arp.buffer_len()];
        let mut frame = EthernetFrame::new_unchecked(&mut buf[..]);
        eth.emit(&mut frame);
        arp.emit(&mut ArpPacket::new_unchecked(frame.payload_mut()));
        buf
    }

    /// Listen on `port`. Incoming connections show up in [`Stack::accept`];
    /// the port keeps listening after each one (up to the backlog).
    pub fn listen(&mut self, port: u16) -> Result<(), Error> {
        self.stir();
        if port == 0 {
            return Err(Error::Unaddressable);
        }
        if self.listeners.iter().any(|l| l.port == port) {
            return Err(Error::AlreadyListening);
        }
        let mut l = Listener {
            port,
            socket: None,
            half_open: Vec::new(),
            ready: VecDeque::new(),
        };
        arm(&mut self.sockets, &self.config, &mut l)?;
        self.listeners.push(l);
        Ok(())
    }

    /// Stop listening on `port`. Connections already accepted stay; half
    /// open and unaccepted ones are aborted.
    pub fn unlisten(&mut self, port: u16) {
        self.stir();
        let Some(i) = self.listeners.iter().position(|l| l.port == port) else {
            return;
        };
        let l = self.listeners.swap_remove(i);
        for h in l.socket.into_iter().chain(l.half_open).chain(l.ready) {
            if let Some(c) = self.conns.remove(&h) {
                forget(&mut self.port, &c);
            }
            self.sockets.remove(h);
        }
    }

    /// Take one established connection that arrived on `port`.
    pub fn accept(&mut self, port: u16) -> Option<ConnId> {
        let l = self.listeners.iter_mut().find(|l| l.port == port)?;
        let h = l.ready.pop_front()?;
        if l.socket.is_none() {
            // The backlog has room again.
            let _ = arm(&mut self.sockets, &self.config, l);
            self.quiet = None;
        }
        Some(ConnId(h))
    }

    /// Open a connection to `remote` from `local_port`.
    pub fn connect(
        &mut self,
        remote: (Ipv4Address, u16),
        local_port: u16,
    ) -> Result<ConnId, Error> {
        let mut s = new_socket(&self.config, rx_size(&self.sockets, &self.config));
        let ep = IpEndpoint::new(IpAddress::Ipv4(remote.0), remote.1);
        s.connect(self.iface.context(), ep, local_port)
            .map_err(|e| match e {
                tcp::ConnectError::Unaddressable => Error::Unaddressable,
                _ => Error::InvalidState,
            })?;
        let state = s.state();
        let h = self.sockets.add(s);
        let mut c = Conn::new(state, local_port);
        c.remote = Some(remote);
        self.conns.insert(h, c);
        self.counters.connects += 1;
        self.egress_due = true;
        Ok(ConnId(h))
    }

    fn socket(&mut self, conn: ConnId) -> Result<&mut tcp::Socket<'static>, Error> {
        if !self.conns.contains_key(&conn.0) {
            return Err(Error::UnknownConnection);
        }
        Ok(self.sockets.get_mut::<tcp::Socket<'static>>(conn.0))
    }

    /// Read from the connection's receive ring: `f` sees the received bytes
    /// (the largest contiguous piece, then the rest after a wrap) and
    /// returns how many it consumed. Returns the total consumed; `Ok(0)`
    /// before the connection is established or when nothing is there.
    /// `Err(Finished)` once the peer has closed and everything was read.
    pub fn recv<F: FnMut(&[u8]) -> usize>(
        &mut self,
        conn: ConnId,
        mut f: F,
    ) -> Result<usize, Error> {
        let fin = self
            .conns
            .get(&conn.0)
            .ok_or(Error::UnknownConnection)?
            .fin_received;
        let s = self.socket(conn)?;
        if matches!(
            s.state(),
            State::SynSent | State::SynReceived | State::Listen
        ) {
            return Ok(0);
        }
        // smoltcp announces a grown window once it is twice the one the
        // peer last heard of (less what arrived since), which is never
        // more than the free space before this read. With half the ring
        // or more free, the peer's window is still open: an ACK for its
        // next segment carries the new one, and no poll is owed.
        let tight = s.recv_capacity() - s.recv_queue() < s.recv_capacity() / 2;
        let mut total = 0;
        for _ in 0..2 {
            if !s.can_recv() {
                break;
            }
            let r = s.recv(|buf| {
                let n = f(buf).min(buf.len());
                (n, (n, n == buf.len()))
            });
            match r {
                Ok((n, whole)) => {
                    total += n;
                    if !whole || n == 0 {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        if total == 0 && !s.may_recv() {
            return Err(if s.recv_queue() == 0 && (fin || fin_state(s.state())) {
                Error::Finished
            } else {
                Error::InvalidState
            });
        }
        if total > 0 && tight {
            // A window update may be due.
            self.stir();
        }
        Ok(total)
    }

    /// Write into the connection's transmit ring: `f` gets free space (the
    /// largest contiguous piece, then the rest after a wrap) and returns
    /// how many bytes it wrote there. Returns the total written; `Ok(0)`
    /// while the handshake is still going on.
    pub fn send<F: FnMut(&mut [u8]) -> usize>(
        &mut self,
        conn: ConnId,
        mut f: F,
    ) -> Result<usize, Error> {
        self.send_limited(conn, usize::MAX, |buf, _| f(buf))
            .map(|(n, _)| n)
    }

    /// Queue segments for a writer whose records (FPDUs) must not
    /// straddle segments (RFC 5044 §8, FPDU alignment). `f` gets free space
    /// and the bytes left in the segment, which may exceed the space when
    /// the ring wraps; it writes whole records up to that limit, and a
    /// record it split at the wrap is finished by the second call.
    ///
    /// smoltcp cuts a segment from its send pointer at the smallest of the
    /// MSS, the bytes queued, the peer's window and the congestion window,
    /// and says nothing of either window or of what it sent. The device
    /// wrapper reads that from the segments going out and the
    /// acknowledgements coming in, and mirrors smoltcp's Reno congestion
    /// window from them (`cwnd.rs`). So this queues one segment's worth at
    /// a time, as many as fill a whole segment each (smoltcp cuts exactly
    /// between those), and none after a shorter one until that has left
    /// (`Ok(0)` meanwhile); no more than the congestion window and the
    /// peer's last window leave (the latter unless nothing is in flight or
    /// queued: then one segment goes regardless, which smoltcp may send as
    /// a window probe), so the last segment of a call may be short. A
    /// segment then holds exactly what one writer call queued, slow start
    /// and loss recovery included. Retransmissions are smoltcp's and cut
    /// at the MSS; so is a segment across the end of the transmit ring.
    ///
    /// Call again after [`Stack::poll_egress`] to queue more after a short
    /// segment. A connection the wrapper does not follow gets
    /// [`Stack::send`]'s plain stream.
    pub fn send_segment<F: FnMut(&mut [u8], usize) -> usize>(
        &mut self,
        conn: ConnId,
        mut f: F,
    ) -> Result<usize, Error> {
        let Some(r) = self.segment_room(conn) else {
            return self.send(conn, |buf| f(buf, usize::MAX));
        };
        let Some(emss) = r.emss else {
            return Ok(0);
        };
        // Full segments back to back while the congestion window is known
        // (nothing is queued beyond it), or else while Nagle's rule can
        // keep it from cutting them (see `hold_full`).
        let batch = r.cwnd_room.is_some() || r.in_flight >= 2 * emss;
        if r.unsent > 0 && (r.short_tail || r.unsent % emss != 0 || !batch) {
            return Ok(0);
        }
        let segment = emss.max(MIN_SEGMENT_LIMIT);
        let mut total = 0;
        let mut short_tail = r.short_tail;
        loop {
            // One segment regardless when nothing else is out or queued.
            let free = r.unsent == 0 && total == 0 && r.in_flight == 0;
            let limit = match r.room {
                Some(room) if !free => segment.min(room.saturating_sub(r.unsent + total)),
                _ => segment,
            };
            // Within the congestion window, so that smoltcp sends all of
            // it: a segment it cuts there shifts the cuts behind it.
            let limit = limit.min(
                r.cwnd_room
                    .map_or(usize::MAX, |c| c.saturating_sub(r.unsent + total)),
            );
            if limit == 0 {
                break;
            }
            let (n, wrapped) = self.send_limited(conn, limit, &mut f)?;
            total += n;
            if n == 0 {
                break;
            }
            // smoltcp also cuts at the end of its ring: a segment queued
            // across it shifts the cuts of any queued after it.
            let full = n == emss && !wrapped;
            short_tail = !full;
            if !full || !batch {
                break;
            }
        }
        if let Some(c) = self.conns.get_mut(&conn.0) {
            c.short_tail = short_tail;
        }
        let queued = SegmentRoom {
            unsent: r.unsent + total,
            ..r
        };
        self.set_nagle(conn, queued.holds_full());
        Ok(total)
    }

    /// smoltcp cuts a segment at its congestion window, and a cut shifts
    /// the cuts of every full segment queued after it. Nothing is queued
    /// beyond the mirrored window; Nagle's rule is the net for a window
    /// that is not mirrored, or that the mirror got wrong (from a corrupt
    /// segment with data, whose checksum it does not check): with it,
    /// smoltcp sends a segment shorter than the MSS only when nothing is in
    /// flight. So it is on while a full segment waits at the head of the
    /// queue, and off for a short last one (which would otherwise wait for
    /// every acknowledgement) and while less than two segments are in
    /// flight (the peer may hold its acknowledgement of a lone one for its
    /// delayed-ACK time); then a cut is left to happen and the next
    /// segments start aligned again.
    /// Checked after queueing and before every egress round.
    fn hold_full(&mut self, conn: ConnId) -> bool {
        let hold = self.segment_room(conn).is_some_and(|r| r.holds_full());
        self.set_nagle(conn, hold)
    }

    /// Switch Nagle's rule for `conn` (never with [`Config::nagle`], which
    /// keeps it on everywhere); returns whether it is on by this.
    fn set_nagle(&mut self, conn: ConnId, hold: bool) -> bool {
        if self.config.nagle {
            return false;
        }
        let Some(c) = self.conns.get_mut(&conn.0) else {
            return false;
        };
        if c.nagle != hold {
            c.nagle = hold;
            self.sockets
                .get_mut::<tcp::Socket<'static>>(conn.0)
                .set_nagle_enabled(hold);
            if hold {
                self.nagled.push(conn.0);
            }
        }
        hold
    }

    /// [`Stack::hold_full`] for every connection that has Nagle's rule on.
    fn release_tails(&mut self) {
        let mut i = 0;
        while i < self.nagled.len() {
            if self.hold_full(ConnId(self.nagled[i])) {
                i += 1;
            } else {
                self.nagled.swap_remove(i);
            }
        }
    }

    /// For [`Stack::send_segment`]: what the connection has queued, sent
    /// and may send, as far as the device wrapper saw its segments.
    fn segment_room(&self, conn: ConnId) -> Option<SegmentRoom> {
        let c = self.conns.get(&conn.0)?;
        let sent = self.port.sent.get(c.flow()?)?;
        // A FIN takes a sequence number too: clamp at zero.
        let unsent = (c.written.wrapping_sub(sent.bytes()) as i32).max(0) as usize;
        let in_flight = sent.in_flight() as usize;
        let shift = sent.window_shift;
        let room = sent
            .window
            .map(|w| (usize::from(w) << shift).saturating_sub(in_flight));
        let cwnd_room = match self.config.congestion {
            CongestionControl::None => Some(usize::MAX),
            _ => sent
                .congestion_window()
                .map(|w| w.saturating_sub(in_flight)),
        };
        Some(SegmentRoom {
            emss: c.emss(),
            short_tail: c.short_tail,
            unsent,
            in_flight,
            room,
            cwnd_room,
        })
    }

    /// [`Stack::send`] with at most `limit` bytes, passing the writer how
    /// many of them are left. Returns the bytes written and whether they
    /// wrapped round the end of the ring.
    fn send_limited<F: FnMut(&mut [u8], usize) -> usize>(
        &mut self,
        conn: ConnId,
        limit: usize,
        mut f: F,
    ) -> Result<(usize, bool), Error> {
        let s = self.socket(conn)?;
        if matches!(s.state(), State::SynSent | State::SynReceived) {
            return Ok((0, false));
        }
        if !s.may_send() {
            return Err(Error::InvalidState);
        }
        let mut total = 0;
        let mut wrapped = false;
        for round in 0..2 {
            if !s.can_send() || total >= limit {
                break;
            }
            let left = limit - total;
            let r = s.send(|buf| {
                let room = buf.len().min(left);
                let n = f(&mut buf[..room], left).min(room);
                (n, (n, n == buf.len()))
            });
            match r {
                Ok((n, whole)) => {
                    total += n;
                    wrapped |= round > 0 && n > 0;
                    if !whole || n == 0 {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        if let Some(c) = self.conns.get_mut(&conn.0) {
            c.written = c.written.wrapping_add(total as u32);
        }
        self.egress_due |= total > 0;
        Ok((total, wrapped))
    }

    /// Bytes queued into the connection that smoltcp has not sent even
    /// once yet (in flight or acknowledged bytes do not count). `None` for
    /// a connection whose segments the stack does not follow.
    pub fn unsent(&self, conn: ConnId) -> Option<usize> {
        self.segment_room(conn).map(|r| r.unsent)
    }

    /// Copy `data` into the transmit ring (as much as fits).
    pub fn send_slice(&mut self, conn: ConnId, data: &[u8]) -> Result<usize, Error> {
        let mut off = 0;
        self.send(conn, |buf| {
            let n = buf.len().min(data.len() - off);
            buf[..n].copy_from_slice(&data[off..off + n]);
            off += n;
            n
        })
    }

    /// Copy received bytes into `out`.
    pub fn recv_slice(&mut self, conn: ConnId, out: &mut [u8]) -> Result<usize, Error> {
        let mut off = 0;
        self.recv(conn, |buf| {
            let n = buf.len().min(out.len() - off);
            out[off..off + n].copy_from_slice(&buf[..n]);
            off += n;
            n
        })
    }

    /// Close our direction (FIN after the queued data).
    pub fn close(&mut self, conn: ConnId) -> Result<(), Error> {
        self.socket(conn)?.close();
        self.egress_due = true;
        Ok(())
    }

    /// Abort the connection (RST at the next poll).
    pub fn abort(&mut self, conn: ConnId) -> Result<(), Error> {
        self.socket(conn)?.abort();
        self.egress_due = true;
        Ok(())
    }

    /// Forget a connection and free its buffers. A connection that is
    /// still open is dropped without telling the peer; call it after
    /// [`Stack::is_closed`], or after [`Stack::abort`] and a poll.
    pub fn release(&mut self, conn: ConnId) -> Result<(), Error> {
        self.stir();
        let c = self.conns.remove(&conn.0).ok_or(Error::UnknownConnection)?;
        forget(&mut self.port, &c);
        self.sockets.remove(conn.0);
        Ok(())
    }

    /// smoltcp's state of the connection.
    pub fn state(&self, conn: ConnId) -> Option<State> {
        self.conns
            .get(&conn.0)
            .map(|_| self.sockets.get::<tcp::Socket<'static>>(conn.0).state())
    }

    /// The connection's receive buffer (the most its window can reach):
    /// [`Config::rx_buffer`], or less under [`Config::rx_budget`].
    pub fn rx_capacity(&self, conn: ConnId) -> Option<usize> {
        self.conns.get(&conn.0).map(|_| {
            self.sockets
                .get::<tcp::Socket<'static>>(conn.0)
                .recv_capacity()
        })
    }

    /// Whether the connection is established (data may flow both ways).
    pub fn is_established(&self, conn: ConnId) -> bool {
        self.state(conn) == Some(State::Established)
    }

    /// The peer closed its direction and every byte was read.
    pub fn is_eof(&self, conn: ConnId) -> bool {
        let Some(c) = self.conns.get(&conn.0) else {
            return false;
        };
        let s = self.sockets.get::<tcp::Socket<'static>>(conn.0);
        c.fin_received_now(s) && s.recv_queue() == 0
    }

    /// The connection ended without the FIN exchange: the peer reset it,
    /// we aborted it, or it timed out.
    pub fn is_reset(&self, conn: ConnId) -> bool {
        self.conns.get(&conn.0).is_some_and(|c| c.reset)
    }

    /// The connection is fully closed (nothing more will happen on it).
    pub fn is_closed(&self, conn: ConnId) -> bool {
        matches!(self.state(conn), Some(State::Closed | State::TimeWait))
    }

    /// Bytes waiting in the receive ring.
    pub fn recv_queue(&self, conn: ConnId) -> usize {
        self.conns.get(&conn.0).map_or(0, |_| {
            self.sockets
                .get::<tcp::Socket<'static>>(conn.0)
                .recv_queue()
        })
    }

    /// Bytes in the transmit ring not yet acknowledged by the peer.
    pub fn send_queue(&self, conn: ConnId) -> usize {
        self.conns.get(&conn.0).map_or(0, |_| {
            self.sockets
                .get::<tcp::Socket<'static>>(conn.0)
                .send_queue()
        })
    }

    /// Local and remote endpoints.
    pub fn endpoints(&self, conn: ConnId) -> Option<(IpEndpoint, IpEndpoint)> {
        self.conns.get(&conn.0)?;
        let s = self.sockets.get::<tcp::Socket<'static>>(conn.0);
        Some((s.local_endpoint()?, s.remote_endpoint()?))
    }

    /// The effective MSS of an established connection: the most payload
    /// one segment carries, min(our MTU's MSS, the peer's SYN MSS) less
    /// options (none: no timestamps). The iWARP layer sizes FPDUs
    /// (MULPDU) from it. `None` before the handshake completes.
    pub fn emss(&self, conn: ConnId) -> Option<usize> {
        self.conns.get(&conn.0)?.emss()
    }

    /// The MSS our MTU allows (what our SYNs announce).
    pub fn local_mss(&self) -> usize {
        local_mss(&self.port)
    }

    /// Process up to [`Config::ingress_budget`] received frames, hand new
    /// passive connections to their listeners, then let every socket send
    /// (up to [`Config::egress_budget`] rounds). Returns whether anything
    /// happened (a frame in or out, or a state change); call again while it
    /// returns true, then sleep until [`Stack::poll_at`].
    pub fn poll(&mut self, now: Instant) -> bool {
        self.quiet = None;
        let mut did = false;
        if now >= self.neighbor_refresh_at {
            self.neighbor_refresh_at = now + NEIGHBOR_REFRESH;
            let frames: Vec<_> = self
                .neighbors
                .iter()
                .map(|&(ip, mac)| self.arp_reply(ip, mac))
                .collect();
            self.counters.neighbor_refreshes += frames.len() as u64;
            self.port.inject.extend(frames);
        }
        let mut budget_hit = true;
        for _ in 0..self.config.ingress_budget {
            match self
                .iface
                .poll_ingress_single(now, &mut self.port, &mut self.sockets)
            {
                PollIngressSingleResult::None => {
                    budget_hit = false;
                    break;
                }
                PollIngressSingleResult::PacketProcessed => did = true,
                PollIngressSingleResult::SocketStateChanged => {
                    did = true;
                    self.update_listeners();
                }
            }
        }
        if budget_hit {
            self.counters.ingress_budget_hits += 1;
        }
        self.update_listeners();
        self.egress_due = false;
        let mut budget_hit = true;
        for _ in 0..self.config.egress_budget {
            self.release_tails();
            match self
                .iface
                .poll_egress(now, &mut self.port, &mut self.sockets)
            {
                PollResult::None => {
                    budget_hit = false;
                    break;
                }
                PollResult::SocketStateChanged => did = true,
            }
        }
        if budget_hit {
            self.counters.egress_budget_hits += 1;
        }
        self.iface.poll_maintenance(now);
        did |= self.update_conns();
        if !budget_hit && !self.egress_due {
            let at = self.poll_at(now);
            if at.is_none_or(|t| t > now) {
                self.quiet = Some(at);
            }
        }
        did
    }

    /// One round of egress: each socket sends at most one segment. Lets
    /// a writer that queues a segment at a time ([`Stack::send_segment`])
    /// queue the next; [`Stack::poll`] still follows for timers and state.
    /// Returns whether a socket's state may have changed.
    pub fn poll_egress(&mut self, now: Instant) -> bool {
        self.release_tails();
        matches!(
            self.iface
                .poll_egress(now, &mut self.port, &mut self.sockets),
            PollResult::SocketStateChanged
        )
    }

    /// Whether [`Stack::poll`] may have work at `now` although no frame
    /// arrived: false after a poll that processed what had arrived and
    /// left nothing to send, until a timer of smoltcp's is due or a call
    /// changed a socket (queued data, a close, a read that may have
    /// reopened a closing window). A caller that checked its device for
    /// frames skips the poll (and its walk over every socket) otherwise.
    pub fn needs_poll(&self, now: Instant) -> bool {
        match self.quiet {
            None => true,
            Some(at) => {
                self.egress_due || !self.port.inject.is_empty() || at.is_some_and(|t| now >= t)
            }
        }
    }

    /// A socket changed outside [`Stack::poll`]: the next poll must run.
    fn stir(&mut self) {
        self.quiet = None;
    }

    /// Whether data, a FIN, a reset or a SYN was queued since the last
    /// [`Stack::poll`]: a caller that polled before filling the transmit
    /// rings needs another poll only then (timers and ACKs wait for the
    /// next pass or [`Stack::poll_at`]).
    pub fn egress_due(&self) -> bool {
        self.egress_due
    }

    /// When to poll next at the latest (`now` or earlier: at once).
    pub fn poll_at(&mut self, now: Instant) -> Option<Instant> {
        if !self.port.inject.is_empty() {
            return Some(now);
        }
        let t = self.iface.poll_at(now, &self.sockets);
        let refresh = (!self.neighbors.is_empty()).then_some(self.neighbor_refresh_at);
        match (t, refresh) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Move passive sockets that left Listen to their listener's half-open
    /// list and re-arm the port; hand established ones to `accept`.
    fn update_listeners(&mut self) {
        for l in &mut self.listeners {
            if let Some(h) = l.socket {
                let s = self.sockets.get::<tcp::Socket<'static>>(h);
                if s.state() != State::Listen {
                    let mut c = Conn::new(s.state(), l.port);
                    c.remote = s
                        .remote_endpoint()
                        .and_then(|ep| Some((v4(ep.addr)?, ep.port)));
                    self.conns.insert(h, c);
                    l.half_open.push(h);
                    l.socket = None;
                    if l.half_open.len() + l.ready.len() < self.config.backlog {
                        let _ = arm(&mut self.sockets, &self.config, l);
                    } else {
                        self.counters.backlog_full += 1;
                    }
                }
            }
            let mut i = 0;
            while i < l.half_open.len() {
                let h = l.half_open[i];
                let state = self.sockets.get::<tcp::Socket<'static>>(h).state();
                match state {
                    State::SynReceived => i += 1,
                    State::Listen | State::Closed => {
                        // Reset during the handshake: smoltcp returns such a
                        // socket to Listen; the port has its own listener.
                        l.half_open.swap_remove(i);
                        if let Some(c) = self.conns.remove(&h) {
                            forget(&mut self.port, &c);
                        }
                        self.sockets.remove(h);
                        self.counters.half_open_dropped += 1;
                    }
                    _ => {
                        l.half_open.swap_remove(i);
                        l.ready.push_back(h);
                        self.counters.accepted += 1;
                    }
                }
            }
            if l.socket.is_none() && l.half_open.len() + l.ready.len() < self.config.backlog {
                let _ = arm(&mut self.sockets, &self.config, l);
            }
        }
    }

    /// Track transitions: established, FIN received, reset.
    fn update_conns(&mut self) -> bool {
        let mut changed = false;
        for (h, c) in &mut self.conns {
            let s = self.sockets.get::<tcp::Socket<'static>>(*h);
            let state = s.state();
            if state == c.last {
                continue;
            }
            changed = true;
            if c.remote.is_none() {
                c.remote = s
                    .remote_endpoint()
                    .and_then(|ep| Some((v4(ep.addr)?, ep.port)));
            }
            match state {
                State::Established => c.established = true,
                State::CloseWait | State::LastAck | State::Closing | State::TimeWait => {
                    c.established = true;
                    if matches!(state, State::CloseWait | State::LastAck)
                        || matches!(c.last, State::CloseWait | State::LastAck)
                    {
                        c.fin_received = true;
                    }
                    if matches!(state, State::Closing | State::TimeWait) {
                        c.fin_received = true;
                    }
                }
                State::Closed => {
                    let orderly =
                        matches!(c.last, State::LastAck | State::TimeWait | State::Closing);
                    if !orderly && !c.reset {
                        c.reset = true;
                        self.counters.resets += 1;
                    }
                }
                _ => {}
            }
            if c.established && c.peer_emss.is_none() {
                if let Some(flow) = c.flow() {
                    let syn = self.port.mss.get(flow).unwrap_or_default();
                    let remote = syn.mss.map_or(DEFAULT_REMOTE_MSS, usize::from);
                    c.peer_emss = Some(local_mss(&self.port).min(remote));
                    self.port.sent.set_peer(flow, syn);
                }
            }
            c.last = state;
        }
        changed
    }
}

impl Conn {
    /// Whether the peer's FIN has arrived, from what was tracked and the
    /// socket's present state.
    fn fin_received_now(&self, s: &tcp::Socket<'_>) -> bool {
        self.fin_received || fin_state(s.state())
    }
}

/// States reached only after the peer's FIN.
fn fin_state(state: State) -> bool {
    matches!(
        state,
        State::CloseWait | State::LastAck | State::Closing | State::TimeWait
    )
}

/// The IPv4 address, if it is one (other families may be compiled in by
/// another crate's smoltcp features).
#[allow(unreachable_patterns)]
fn v4(addr: IpAddress) -> Option<Ipv4Address> {
    match addr {
        IpAddress::Ipv4(a) => Some(a),
        _ => None,
    }
}

/// The receive buffer of a new socket: [`Config::rx_buffer`], cut to what
/// the sockets in `sockets` leave of [`Config::rx_budget`].
fn rx_size(sockets: &SocketSet<'static>, config: &Config) -> usize {
    let want = config.rx_buffer.min(crate::MAX_BUFFER);
    let Some(budget) = config.rx_budget else {
        return want;
    };
    let held: usize = sockets
        .iter()
        .filter_map(|(_, s)| tcp::Socket::downcast(s))
        .map(tcp::Socket::recv_capacity)
        .sum();
    want.min(budget.saturating_sub(held)).max(crate::MIN_BUFFER)
}

/// A socket with the stack's settings and a receive buffer of `rx_size`.
fn new_socket(config: &Config, rx_size: usize) -> tcp::Socket<'static> {
    let rx = tcp::SocketBuffer::new(vec![0; rx_size]);
    let tx = tcp::SocketBuffer::new(vec![0; config.tx_buffer]);
    let mut s = tcp::Socket::new(rx, tx);
    s.set_nagle_enabled(config.nagle);
    s.set_ack_delay(config.ack_delay);
    s.set_congestion_control(config.congestion);
    s.set_timeout(config.timeout);
    s.set_keep_alive(config.keep_alive);
    s
}

/// A fresh listening socket for `l`'s port.
fn arm(sockets: &mut SocketSet<'static>, config: &Config, l: &mut Listener) -> Result<(), Error> {
    let mut s = new_socket(config, rx_size(sockets, config));
    s.listen(l.port).map_err(|e| match e {
        tcp::ListenError::Unaddressable => Error::Unaddressable,
        _ => Error::InvalidState,
    })?;
    l.socket = Some(sockets.add(s));
    Ok(())
}

#[cfg(test)]
impl<D: Device> Stack<D> {
    /// smoltcp's own congestion window of `conn` (Reno only), read from
    /// the socket's `Debug` output: the judge of the mirror.
    pub(crate) fn smoltcp_cwnd(&self, conn: ConnId) -> Option<usize> {
        use std::fmt::Write;
        /// Keeps what follows the controller's name; stops the formatting
        /// once the number has come.
        struct Find(Option<String>);
        impl Write for Find {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                const KEY: &str = "Reno { cwnd: ";
                match &mut self.0 {
                    None if s.contains(KEY) || s == "Reno" => self.0 = Some(String::from(s)),
                    None => {}
                    Some(text) => text.push_str(s),
                }
                match self
                    .0
                    .as_deref()
                    .and_then(|t| t.find(KEY).map(|i| &t[i + KEY.len()..]))
                {
                    Some(rest) if rest.contains(|c: char| !c.is_ascii_digit()) => Err(fmt::Error),
                    _ => Ok(()),
                }
            }
        }
        let mut find = Find(None);
        let _ = write!(
            find,
            "{:?}",
            self.sockets.get::<tcp::Socket<'static>>(conn.0)
        );
        let text = find.0?;
        let at = text.find("Reno { cwnd: ")? + "Reno { cwnd: ".len();
        text[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    }

    /// The device wrapper's mirror of it.
    pub(crate) fn mirrored_cwnd(&self, conn: ConnId) -> Option<usize> {
        let flow = self.conns.get(&conn.0)?.flow()?;
        self.port.sent.get(flow)?.congestion_window()
    }
}
