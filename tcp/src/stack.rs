//! [`Stack`]: a user-space TCP/IPv4 endpoint over one Ethernet
//! `phy::Device`, sans-IO: time comes in as an argument, the device is the
//! only way bytes enter or leave.
//!
//! smoltcp walks every socket of a `SocketSet` for every frame it receives
//! and on every egress round, which is fine for the few sockets it was made
//! for and linear in the connection count for a server. So the stack
//! dispatches itself, with smoltcp's public API:
//!
//! * **One small interface per connection.** Each connection owns a smoltcp
//!   `Interface` on an IP medium and a `SocketSet` holding its one socket.
//!   The stack owns the Ethernet layer: it strips the header of a received
//!   frame and writes the header of a frame sent, with the next hop's
//!   address it resolved once for the connection.
//! * **A flow table** (`flow.rs`): each received frame's (remote address,
//!   remote port, local port) finds its connection in constant time, with
//!   a hash keyed per table; a SYN to a listening port that finds no
//!   connection creates one. Everything else (ARP, ICMP, segments of no
//!   connection, which get a reset) goes to a control interface without
//!   sockets.
//! * **Work-driven passes.** A connection is visited when it has something
//!   to do: a frame arrived for it, the application queued data or closed
//!   it, a read freed window space, or its timer is due. Timers live in a
//!   heap of each connection's next deadline, taken from smoltcp's own
//!   `poll_at`; the deadline is also kept in the connection's slot, so
//!   that an entry whose deadline moved or whose connection left is
//!   told from the dense slots alone. No step of a poll or of a frame's
//!   handling walks the connections.
//! * **Listening without a backlog walk.** A listening port keeps its
//!   half-open connections in arrival order, at most
//!   [`Config::half_open`]: a SYN past that drops the oldest (counted). An
//!   established connection waits in the accept queue, at most
//!   [`Config::backlog`]; one that completes its handshake while the queue
//!   is full is reset (counted), like a SYN that finds it full.
//! * **Slots that are reused.** Connections live in a slab whose slots
//!   carry a generation: a [`ConnId`] of a released connection names
//!   nothing, even after its slot holds another connection.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;

use smoltcp::iface::{Config as IfaceConfig, Interface, PollResult};
use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};
use smoltcp::socket::tcp::{self, CongestionControl, State};
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr, HardwareAddress, IpAddress, IpCidr, IpEndpoint, IpProtocol, Ipv4Address,
    Ipv4Cidr, Ipv4Packet, TcpPacket,
};

use crate::config::{Config, SHARED_BUFFER_MIN};
use crate::flow::FlowTable;
use crate::pages::Buffers;
use crate::port::{tcp_mss, Flow, Port, WindowShare};
use crate::probe::{Probe, ProbeGate};

/// How long a static neighbour entry lives in the control interface's
/// cache before it is refreshed (smoltcp's entries expire after 60 s).
const NEIGHBOR_REFRESH: Duration = Duration::from_secs(30);

/// How often an ARP request for a next hop that has not answered is sent
/// again.
const ARP_RETRY: Duration = Duration::from_secs(1);

/// Most next-hop addresses learnt from ARP that are remembered.
const LEARNT_CAP: usize = 4096;

/// smoltcp's assumption when the peer's SYN carried no MSS option.
const DEFAULT_REMOTE_MSS: usize = 536;

/// The smallest segment [`Stack::send_segment`] offers a writer, whatever
/// the peer's MSS: the iWARP layer's smallest full FPDU fits (a peer that
/// announces less gets segments that split FPDUs, not a stall).
const MIN_SEGMENT_LIMIT: usize = 128;

/// Length of an Ethernet header.
const ETH_HEADER: usize = 14;

/// Receive buffers cut to a connection's part of the shared frames
/// ([`Config::window_frames`]) are whole pages of this size.
const PAGE: usize = 4096;

/// A connection of a [`Stack`]: its slot and the slot's generation. A
/// released connection's id names nothing, also after the slot was reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId {
    index: u32,
    generation: u32,
}

/// Why an operation of [`Stack`] failed. A failed call changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// No such connection (never existed, or released).
    UnknownConnection,
    /// [`Stack::listen`] on a port that already has a listener.
    AlreadyListening,
    /// The port or address cannot be used (zero port, unspecified address).
    Unaddressable,
    /// The connection is in a state that does not allow the operation
    /// (for example sending after close, or after a reset).
    InvalidState,
    /// The peer closed its direction and every byte has been read.
    Finished,
    /// The stack holds [`Config::max_connections`] connections, the flow
    /// is taken, or the system maps no memory for a connection's buffers.
    Exhausted,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::UnknownConnection => "unknown connection",
            Self::AlreadyListening => "port already listening",
            Self::Unaddressable => "unaddressable endpoint",
            Self::InvalidState => "invalid connection state",
            Self::Finished => "peer closed the stream",
            Self::Exhausted => "no connection slot for the flow",
        })
    }
}

impl std::error::Error for Error {}

/// Buckets of [`Counters::frame_runs`].
pub const FRAME_RUN_BUCKETS: usize = 8;

/// The bucket of [`Counters::frame_runs`] a run of `len` frames (at
/// least 1) goes to.
fn frame_run_bucket(len: u64) -> usize {
    (len.max(1).ilog2() as usize).min(FRAME_RUN_BUCKETS - 1)
}

/// Stack counters since the stack was created (monotonic, never reset).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Frames received from the device.
    pub rx_frames: u64,
    /// Bytes of those frames, Ethernet header included.
    pub rx_bytes: u64,
    /// Frames handed to the device.
    pub tx_frames: u64,
    /// Bytes of those frames, Ethernet header included.
    pub tx_bytes: u64,
    /// Polls that stopped ingress at [`Config::ingress_budget`].
    pub ingress_budget_hits: u64,
    /// Connection visits that stopped egress at [`Config::egress_budget`].
    pub egress_budget_hits: u64,
    /// Polls whose egress stopped because the device had no frame to
    /// send into: the connections not visited yet wait for the next poll
    /// instead of each finding the device full.
    pub egress_device_full: u64,
    /// Visits not listed for [`Stack::take_active`]: nothing to read,
    /// no change of state, and an application with nothing to write
    /// ([`Stack::set_writer_idle`]) or one that writes whole segments
    /// ([`Stack::send_segment`]) with bytes queued or in flight and less
    /// than a segment of room beyond them.
    pub writer_waits: u64,
    /// Connections opened with [`Stack::connect`].
    pub connects: u64,
    /// Connections that reached Established from a listening port.
    pub accepted: u64,
    /// Connections that ended without the FIN exchange (RST or timeout).
    pub resets: u64,
    /// Half-open passive connections that fell back (RST in SYN-RECEIVED).
    pub half_open_dropped: u64,
    /// Half-open passive connections dropped for a newer SYN past
    /// [`Config::half_open`].
    pub half_open_evicted: u64,
    /// SYNs and handshakes refused because the accept queue held
    /// [`Config::backlog`] connections.
    pub backlog_full: u64,
    /// SYNs dropped because the flow table was full.
    pub flow_table_full: u64,
    /// Frames handed to the control interface (ARP, ICMP, segments of no
    /// connection).
    pub control_frames: u64,
    /// Synthetic ARP replies injected for static neighbours.
    pub neighbor_refreshes: u64,
    /// ARP requests sent for next hops of new connections.
    pub arp_requests: u64,
    /// Bare acknowledgements sent with the highest sequence number sent
    /// instead of smoltcp's rewound one (during its resending after a
    /// retransmission timeout), which the peer would drop.
    pub acks_renumbered: u64,
    /// Segments whose receive window was cut to the connection's share of
    /// [`Config::window_frames`].
    pub windows_cut: u64,
    /// Window updates the stack sent itself: pure acknowledgements that
    /// reopen the window of a connection the shared frames held closed
    /// ([`Config::window_frames`]).
    pub window_updates: u64,
    /// Of those, updates sent again because the peer sent nothing into
    /// the reopened window within 20–30 ms (the first may have been
    /// lost, and the peer's persist timer waits a second or more).
    pub window_updates_repeated: u64,
    /// The credit a waiting connection is granted at its turn now, in
    /// bytes: what peers lately used of their turns (0 when windows are
    /// not cut).
    pub turn_bytes: u64,
    /// Turns whose peer filled them (it had more to send).
    pub turns_filled: u64,
    /// Turns left with part of them unused (their peer sent something,
    /// then nothing for 40–50 ms while other connections waited, or for
    /// a second).
    pub turns_unfilled: u64,
    /// Of those, turns ended after 40–50 ms: the rest of each was
    /// retracted for the connections waiting.
    pub turns_ended_quiet: u64,
    /// Zero-window updates sent again, one, two and four seconds apart,
    /// to connections whose windows were retracted within three seconds
    /// of their peers' last data or of a grant (a peer that went quiet
    /// for a loss starts probing on one).
    pub retraction_nudges: u64,
    /// Windows retracted: their peers left them unused for a second, or
    /// the rest of a turn for 40–50 ms, while other connections waited
    /// for credit, and a window update closed them
    /// ([`Config::window_frames`]).
    pub windows_retracted: u64,
    /// Segments that arrived at a closed window, each in a frame of its
    /// own: zero-window probes (a byte past the window, or Linux's
    /// segment one before our acknowledgement) and data sent before the
    /// peer learnt that its window closed.
    pub closed_window_segments: u64,
    /// Zero-window probes that waited for a turn ([`PROBE_LIMIT`](crate::PROBE_LIMIT)).
    pub probes_delayed: u64,
    /// Turns of zero-window probes that came back unanswered
    /// ([`PROBE_ANSWER_WAIT`](crate::PROBE_ANSWER_WAIT)).
    pub probes_unanswered: u64,
    /// Connection visits: a connection's egress and state, for frames,
    /// timers or calls that concerned it.
    pub conn_visits: u64,
    /// Frames for a connection other than the one the connection frame
    /// before them went to: with many connections, how often a frame
    /// finds its connection's state out of the cache.
    pub conn_switches: u64,
    /// The runs of consecutive connection frames that went to one
    /// connection, by length: `frame_runs[k]` counts runs of `2^k` to
    /// `2^(k+1) - 1` frames (1, 2–3, 4–7, … the last bucket open-ended).
    /// A run is counted when a frame for another connection ends it.
    pub frame_runs: [u64; FRAME_RUN_BUCKETS],
    /// Times a quiet connection's socket buffers were given back to the
    /// system ([`Config::idle_release`]).
    pub idle_releases: u64,
    /// Bytes of whole pages given back in those.
    pub idle_released_bytes: u64,
}

/// What the stack knows about one connection beyond smoltcp's state.
struct Conn {
    iface: Interface,
    sockets: SocketSet<'static>,
    handle: SocketHandle,
    last: State,
    established: bool,
    fin_received: bool,
    reset: bool,
    local_port: u16,
    remote: (Ipv4Address, u16),
    /// The Ethernet address frames to the peer go to (the peer's or the
    /// gateway's); `None` while ARP has not answered.
    next_hop_mac: Option<EthernetAddress>,
    /// Bytes queued into the socket so far (mod 2^32), for
    /// [`Stack::unsent`].
    written: u32,
    /// [`Stack::send_segment`] last queued less than a full segment:
    /// smoltcp will put the start of whatever follows into that segment,
    /// so nothing more is queued until it has left.
    short_tail: bool,
    /// Nagle's rule is on for the socket (see [`hold_full`]).
    nagle: bool,
    /// The application writes whole segments ([`Stack::send_segment`]):
    /// it waits for the peer's window, not for free transmit buffer.
    segmented: bool,
    /// The application said it has nothing to write
    /// ([`Stack::set_writer_idle`]) and has written nothing since.
    writer_idle: bool,
    /// The socket acknowledges every segment at once (see [`quick_ack`]).
    quick_ack: bool,
    /// The effective MSS, learnt from the SYNs once established.
    peer_emss: Option<usize>,
    /// Passive and not yet established: the listening port.
    half_open_on: Option<u16>,
    /// Not the application's: reset by the stack, released once closed.
    orphan: bool,
    /// In the work list.
    queued: bool,
    /// In the list of connections [`Stack::take_active`] hands out.
    active: bool,
    /// Receive buffer bytes, counted against [`Config::rx_budget`].
    rx_capacity: usize,
    /// The last visit that found data in a buffer or changed the state.
    visited: Instant,
    /// In the queue of connections [`Core::release_idle`] looks at.
    idle_queued: bool,
    /// Its zero-window probe's turn ([`crate::probe`]).
    probe: Probe,
    /// The memory of the socket's receive and transmit buffers. Declared
    /// after `sockets`, so dropped after the socket that uses it.
    buffers: Buffers,
}

impl Conn {
    fn socket(&self) -> &tcp::Socket<'static> {
        self.sockets.get::<tcp::Socket<'static>>(self.handle)
    }

    fn socket_mut(&mut self) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket<'static>>(self.handle)
    }

    /// The effective MSS, once established.
    fn emss(&self) -> Option<usize> {
        self.peer_emss.filter(|_| self.established)
    }

    /// The key of the flow table and of the device wrapper's tables.
    fn flow(&self) -> Flow {
        (self.remote.0, self.remote.1, self.local_port)
    }

    /// Whether the peer's FIN has arrived, from what was tracked and the
    /// socket's present state.
    fn fin_received_now(&self) -> bool {
        self.fin_received || fin_state(self.socket().state())
    }
}

/// A listening port.
#[derive(Debug, Default)]
struct Listener {
    /// Half-open connections in arrival order (entries of connections that
    /// were established or released since are skipped when met).
    half_open: VecDeque<ConnId>,
    /// How many of `half_open` are still half open.
    half_open_count: usize,
    /// Established, waiting for [`Stack::accept`].
    ready: VecDeque<ConnId>,
}

/// A slot of the connection slab.
struct Slot {
    generation: u32,
    /// The deadline of the heap entry that stands for the connection.
    /// Kept here rather than in the connection, so that the timer heap
    /// tells its stale entries (and rebuilds itself) from these dense
    /// slots, without reading thousands of connections out of the cache.
    /// Cleared when the connection is removed, so a reused slot starts
    /// with none.
    deadline: Option<Instant>,
    conn: Option<Box<Conn>>,
}

/// Everything of a [`Stack`] but the device, so that a frame borrowed from
/// the device can be handed to a connection.
struct Core {
    config: Config,
    /// The control interface: ARP, ICMP, resets for segments of no
    /// connection; it has no sockets.
    control: Interface,
    control_sockets: SocketSet<'static>,
    /// The device's capabilities (as the device wrapper cuts its MTU).
    eth_caps: DeviceCapabilities,
    /// What a connection's interface sees of the device: the same on an IP
    /// medium, less the Ethernet header.
    ip_caps: DeviceCapabilities,
    /// The instant of the last poll (new interfaces start there).
    now: Instant,
    mac: EthernetAddress,
    ip: Ipv4Address,
    prefix: u8,
    gateway: Option<Ipv4Address>,
    /// Static neighbours, given by [`Stack::add_neighbor`].
    neighbors: Vec<(Ipv4Address, EthernetAddress)>,
    neighbor_refresh_at: Instant,
    /// Next hops learnt from ARP and from SYNs.
    learnt: HashMap<Ipv4Address, EthernetAddress, crate::hash::FlowHash>,
    /// Connections waiting for ARP to answer for their next hop.
    arp_wait: Vec<ConnId>,
    arp_retry_at: Instant,
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
    flows: FlowTable<ConnId>,
    listeners: HashMap<u16, Listener>,
    /// Entries in the listeners' accept queues, together: a caller that
    /// asks every pass finds out without a lookup that none waits.
    ready: usize,
    /// Connections to visit at the next poll.
    work: Vec<ConnId>,
    /// Connections [`Stack::take_active`] hands out.
    active: Vec<ConnId>,
    /// Each connection's next deadline; entries whose connection moved its
    /// deadline or left are skipped when met.
    timers: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    /// Receive buffer bytes all connections hold.
    rx_held: usize,
    /// Seeds of the connections' interfaces (initial sequence numbers).
    next_seed: u64,
    counters: Counters,
    /// Something was queued for egress since the last poll (data, a FIN,
    /// a reset, a SYN): see [`Stack::egress_due`].
    egress_due: bool,
    /// Flows of connections that left, for the device wrapper's tables.
    forgotten: Vec<Flow>,
    /// Connections visited since their buffers were last given back, by
    /// the time they were queued ([`Config::idle_release`]).
    idle: VecDeque<(Instant, ConnId)>,
    /// The turns of zero-window probes.
    probes: ProbeGate<ConnId>,
    /// The connection the last connection frame went to.
    last_frame_conn: Option<ConnId>,
    /// Frames of the run that frame belongs to ([`Counters::frame_runs`]).
    frame_run: u64,
}

/// A user-space TCP/IPv4 stack over one Ethernet device. See the module
/// documentation for its structure and the crate documentation for the
/// polling order.
pub struct Stack<D: Device> {
    port: Port<D>,
    core: Core,
}

impl<D: Device> fmt::Debug for Stack<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stack")
            .field("mac", &self.core.mac)
            .field("ip", &self.core.ip)
            .field("connections", &self.core.live)
            .field("counters", &self.counters())
            .finish_non_exhaustive()
    }
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
    /// The peer's window is closed and nothing is in flight: whatever
    /// smoltcp sends next is a zero-window probe.
    fn window_closed(&self) -> bool {
        self.room == Some(0) && self.in_flight == 0
    }

    /// Bytes written now make smoltcp probe at once: nothing was queued
    /// (its probe timer starts from its clock's zero).
    fn probes_on_write(&self) -> bool {
        self.window_closed() && self.unsent == 0
    }

    /// The connection's timer is a zero-window probe: bytes wait.
    fn probes_on_timer(&self) -> bool {
        self.window_closed() && self.unsent > 0
    }

    /// Whether a writer of whole segments can do nothing until an
    /// acknowledgement or a window update comes, whose visit lists it
    /// again: bytes are queued or in flight, and the room beyond what is
    /// queued holds less than a segment. (With nothing queued or in
    /// flight, the writer may send one segment regardless, and no
    /// acknowledgement is owed to it.)
    fn writer_waits(&self) -> bool {
        let (Some(mss), Some(room)) = (self.emss, self.room) else {
            return false;
        };
        let sendable = room.min(self.cwnd_room.unwrap_or(usize::MAX));
        self.unsent + self.in_flight > 0 && sendable.saturating_sub(self.unsent) < mss
    }

    /// Whether Nagle's rule should hold the queue (see
    /// [`hold_full`]): a full segment waits at its head and at
    /// least two are in flight.
    fn holds_full(&self) -> bool {
        self.emss
            .is_some_and(|emss| self.unsent >= emss && self.in_flight >= 2 * emss)
    }
}

// ---------------------------------------------------------------------
// Devices through which a connection's interface sees the port.

/// A token type no device hands out.
enum Never {}

impl phy::RxToken for Never {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, _: F) -> R {
        match self {}
    }
}

impl phy::TxToken for Never {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, _: usize, _: F) -> R {
        match self {}
    }
}

/// A device that only tells its capabilities (to create an interface).
struct CapsOnly(DeviceCapabilities);

impl Device for CapsOnly {
    type RxToken<'a> = Never;
    type TxToken<'a> = Never;

    fn receive(&mut self, _: Instant) -> Option<(Never, Never)> {
        None
    }

    fn transmit(&mut self, _: Instant) -> Option<Never> {
        None
    }

    fn capabilities(&self) -> DeviceCapabilities {
        self.0.clone()
    }
}

/// A received frame (or the IP packet in it), lent to an interface.
struct SliceRx<'a>(&'a [u8]);

impl phy::RxToken for SliceRx<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.0)
    }
}

/// A transmit token of the port; for a connection's interface it writes the
/// Ethernet header (source, destination) before the IP packet.
struct EthTx<T> {
    token: T,
    header: Option<(EthernetAddress, EthernetAddress)>,
}

impl<T: phy::TxToken> phy::TxToken for EthTx<T> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        match self.header {
            None => self.token.consume(len, f),
            Some((src, dst)) => self.token.consume(len + ETH_HEADER, |buf| {
                let mut frame = EthernetFrame::new_unchecked(&mut *buf);
                frame.set_src_addr(src);
                frame.set_dst_addr(dst);
                frame.set_ethertype(EthernetProtocol::Ipv4);
                f(&mut buf[ETH_HEADER..])
            }),
        }
    }

    fn set_meta(&mut self, meta: phy::PacketMeta) {
        self.token.set_meta(meta);
    }
}

/// One received frame and the transmit token that came with it.
struct Ingress<'f, T> {
    frame: Option<&'f [u8]>,
    tx: Option<EthTx<T>>,
    caps: &'f DeviceCapabilities,
}

impl<'f, T: phy::TxToken> Device for Ingress<'f, T> {
    type RxToken<'a>
        = SliceRx<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = EthTx<T>
    where
        Self: 'a;

    fn receive(&mut self, _: Instant) -> Option<(SliceRx<'_>, EthTx<T>)> {
        let frame = self.frame.take()?;
        Some((SliceRx(frame), self.tx.take()?))
    }

    fn transmit(&mut self, _: Instant) -> Option<EthTx<T>> {
        self.tx.take()
    }

    fn capabilities(&self) -> DeviceCapabilities {
        self.caps.clone()
    }
}

/// The port as a connection's interface sends through it.
struct Egress<'p, P> {
    port: &'p mut P,
    header: (EthernetAddress, EthernetAddress),
    caps: &'p DeviceCapabilities,
}

impl<P: Device> Device for Egress<'_, P> {
    type RxToken<'a>
        = Never
    where
        Self: 'a;
    type TxToken<'a>
        = EthTx<P::TxToken<'a>>
    where
        Self: 'a;

    fn receive(&mut self, _: Instant) -> Option<(Never, Self::TxToken<'_>)> {
        None
    }

    fn transmit(&mut self, timestamp: Instant) -> Option<Self::TxToken<'_>> {
        let header = Some(self.header);
        self.port
            .transmit(timestamp)
            .map(|token| EthTx { token, header })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        self.caps.clone()
    }
}

/// What a received frame is, for dispatch.
enum Class {
    /// A TCP segment to our address.
    Tcp {
        flow: Flow,
        /// A SYN without ACK, RST or FIN: may open a connection.
        opens: bool,
        src_mac: EthernetAddress,
    },
    /// An ARP packet from `ip` at `mac`.
    Arp(Ipv4Address, EthernetAddress),
    /// Anything else.
    Other,
}

fn classify(frame: &[u8], us: Ipv4Address) -> Class {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return Class::Other;
    };
    match eth.ethertype() {
        EthernetProtocol::Arp => {
            match ArpPacket::new_checked(eth.payload()).and_then(|p| ArpRepr::parse(&p)) {
                Ok(ArpRepr::EthernetIpv4 {
                    source_hardware_addr,
                    source_protocol_addr,
                    ..
                }) => Class::Arp(source_protocol_addr, source_hardware_addr),
                _ => Class::Other,
            }
        }
        EthernetProtocol::Ipv4 => {
            let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
                return Class::Other;
            };
            if ip.next_header() != IpProtocol::Tcp
                || ip.dst_addr() != us
                || ip.more_frags()
                || ip.frag_offset() != 0
            {
                return Class::Other;
            }
            let Some(bytes) = ip
                .payload()
                .get(..usize::from(ip.total_len()).saturating_sub(usize::from(ip.header_len())))
            else {
                return Class::Other;
            };
            let Ok(tcp) = TcpPacket::new_checked(bytes) else {
                return Class::Other;
            };
            Class::Tcp {
                flow: (ip.src_addr(), tcp.src_port(), tcp.dst_port()),
                opens: tcp.syn() && !tcp.ack() && !tcp.rst() && !tcp.fin(),
                src_mac: eth.src_addr(),
            }
        }
        _ => Class::Other,
    }
}

/// A 64-bit mix (SplitMix64's finaliser): per-connection interface seeds.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Whether a visit of connection `id`, whose probe stands at `probe`,
/// waits for a turn of the zero-window probe gate (`crate::probe`). A
/// visit that would probe (`probes`) while the connection holds no turn
/// asks for one; a probe that starts waiting counts once in
/// [`Counters::probes_delayed`], however often its connection writes or
/// its timer fires while it waits.
fn probe_waits(
    gate: &mut ProbeGate<ConnId>,
    probe: &mut Probe,
    probes: bool,
    id: ConnId,
    now: Instant,
    counters: &mut Counters,
) -> bool {
    if probes && *probe == Probe::None {
        *probe = gate.ask(id, now);
        if *probe == Probe::Waiting {
            counters.probes_delayed += 1;
        }
    }
    *probe == Probe::Waiting
}

/// For [`Stack::send_segment`]: what the connection has queued, sent and
/// may send, as far as the device wrapper saw its segments.
fn segment_room<D>(port: &Port<D>, config: &Config, c: &Conn) -> Option<SegmentRoom> {
    let sent = port.sent.get(c.flow())?;
    // A FIN takes a sequence number too: clamp at zero.
    let unsent = (c.written.wrapping_sub(sent.bytes()) as i32).max(0) as usize;
    let in_flight = sent.in_flight() as usize;
    let shift = sent.window_shift;
    let room = sent
        .window
        .map(|w| (usize::from(w) << shift).saturating_sub(in_flight));
    let cwnd_room = match config.congestion {
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

/// Switch Nagle's rule for `c` (never with [`Config::nagle`], which keeps
/// it on everywhere); returns whether it is on by this.
fn set_nagle(config: &Config, c: &mut Conn, hold: bool) -> bool {
    if config.nagle {
        return false;
    }
    if c.nagle != hold {
        c.nagle = hold;
        c.socket_mut().set_nagle_enabled(hold);
    }
    hold
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
fn hold_full<D>(port: &Port<D>, config: &Config, c: &mut Conn) -> bool {
    let hold = segment_room(port, config, c).is_some_and(|r| r.holds_full());
    set_nagle(config, c, hold)
}

/// Switch the connection's delayed acknowledgement by the window it
/// last offered (after each visit): when that leaves the peer less than
/// two full segments, the peer cannot send the second segment that would
/// end the delay, so a delayed acknowledgement only holds it back for the
/// whole delay (with the windows cut to a share of the frames, a window
/// that is the last segment of a turn, or all a small pool leaves);
/// such a connection acknowledges each segment at its visit, as RFC 9293
/// §3.8.6.3 lets a receiver do, and one that received several segments
/// since the last visit still acknowledges them together. Wider windows
/// keep [`Config::ack_delay`], under which smoltcp acknowledges at the
/// second full segment.
fn quick_ack<D>(port: &Port<D>, config: &Config, c: &mut Conn) {
    if config.ack_delay.is_none() || !port.sent.share.cuts() {
        return;
    }
    let Some(emss) = c.emss() else {
        return;
    };
    let quick = port
        .sent
        .get(c.flow())
        .and_then(|s| s.rx_window())
        .is_some_and(|w| w < 2 * emss);
    if quick != c.quick_ack {
        c.quick_ack = quick;
        let delay = if quick { None } else { config.ack_delay };
        c.socket_mut().set_ack_delay(delay);
    }
}

/// The connection `id` names in `slots`, if its slot still holds it (the
/// field-level twin of [`Core::conn`], for callers that borrow other
/// fields of the core at the same time).
fn slot_conn(slots: &[Slot], id: ConnId) -> Option<&Conn> {
    let slot = slots.get(id.index as usize)?;
    if slot.generation != id.generation {
        return None;
    }
    slot.conn.as_deref()
}

/// [`slot_conn`], mutably.
fn slot_conn_mut(slots: &mut [Slot], id: ConnId) -> Option<&mut Conn> {
    slot_parts_mut(slots, id).map(|(_, c)| c)
}

/// [`slot_conn_mut`], with the deadline its slot keeps for it.
fn slot_parts_mut(slots: &mut [Slot], id: ConnId) -> Option<(&mut Option<Instant>, &mut Conn)> {
    let slot = slots.get_mut(id.index as usize)?;
    if slot.generation != id.generation {
        return None;
    }
    let Slot { deadline, conn, .. } = slot;
    Some((deadline, conn.as_deref_mut()?))
}

/// The deadline of the connection `id` names, as its slot keeps it;
/// `None` if it has none or is gone. Reads the slot only.
fn slot_deadline(slots: &[Slot], id: ConnId) -> Option<Instant> {
    let slot = slots.get(id.index as usize)?;
    if slot.generation != id.generation || slot.conn.is_none() {
        return None;
    }
    slot.deadline
}

impl Core {
    fn conn(&self, id: ConnId) -> Option<&Conn> {
        slot_conn(&self.slots, id)
    }

    fn conn_mut(&mut self, id: ConnId) -> Option<&mut Conn> {
        slot_conn_mut(&mut self.slots, id)
    }

    /// Visit the connection at the next poll.
    fn touch(&mut self, id: ConnId) {
        if let Some(c) = self.conn_mut(id) {
            if !c.queued {
                c.queued = true;
                self.work.push(id);
            }
        }
    }

    /// The first hop towards `ip`: itself on our prefix, else the gateway.
    fn next_hop(&self, ip: Ipv4Address) -> Ipv4Address {
        let net = Ipv4Cidr::new(self.ip, self.prefix);
        if net.contains_addr(&ip) {
            ip
        } else {
            self.gateway.unwrap_or(ip)
        }
    }

    /// The Ethernet address of `hop`, if known.
    fn resolve(&self, hop: Ipv4Address) -> Option<EthernetAddress> {
        self.neighbors
            .iter()
            .find(|(ip, _)| *ip == hop)
            .map(|(_, mac)| *mac)
            .or_else(|| self.learnt.get(&hop).copied())
    }

    /// `ip` is at `mac` (from ARP): remember it if it is on our prefix and
    /// let the connections that waited for it go.
    fn learn(&mut self, ip: Ipv4Address, mac: EthernetAddress) {
        if !mac.is_unicast() || !Ipv4Cidr::new(self.ip, self.prefix).contains_addr(&ip) {
            return;
        }
        if self.learnt.len() < LEARNT_CAP || self.learnt.contains_key(&ip) {
            self.learnt.insert(ip, mac);
        }
        if self.arp_wait.is_empty() {
            return;
        }
        let waiting = std::mem::take(&mut self.arp_wait);
        for id in waiting {
            let Some(hop) = self.conn(id).map(|c| self.next_hop(c.remote.0)) else {
                continue;
            };
            if hop != ip {
                self.arp_wait.push(id);
                continue;
            }
            if let Some(c) = self.conn_mut(id) {
                c.next_hop_mac = Some(mac);
            }
            self.touch(id);
        }
    }

    /// The receive buffer of a new connection: [`Config::rx_buffer`], cut
    /// to its part of the shared receive frames (see
    /// [`Config::window_frames`]) and to what the others leave of
    /// [`Config::rx_budget`].
    fn rx_size(&self) -> usize {
        let mut want = self.config.rx_buffer.min(crate::MAX_BUFFER);
        if let Some(part) = self.shared_part() {
            want = want.min(part);
        }
        let Some(budget) = self.config.rx_budget else {
            return want;
        };
        want.min(budget.saturating_sub(self.rx_held))
            .max(crate::MIN_BUFFER)
    }

    /// With [`Config::window_frames`]: the receive buffer a new connection
    /// needs for the window it can be offered while the connections open
    /// now all receive, the frames' bytes over their number with this
    /// one, rounded up to whole pages, at least [`SHARED_BUFFER_MIN`].
    /// smoltcp's receive ring moves through the whole buffer whatever the
    /// window, so every page of a larger one would be written (faulted in
    /// and cleared) without ever holding more than the window.
    fn shared_part(&self) -> Option<usize> {
        let frames = self.config.window_frames.filter(|&f| f > 0)?;
        let mss = tcp_mss(self.eth_caps.max_transmission_unit).max(1);
        let part = frames.saturating_mul(mss) / (self.live + 1);
        Some(
            part.div_ceil(PAGE)
                .saturating_mul(PAGE)
                .max(SHARED_BUFFER_MIN),
        )
    }

    /// A connection for `flow` with a fresh socket (which `setup` listens
    /// or connects), in a free slot and the flow table.
    fn add_conn(
        &mut self,
        flow: Flow,
        next_hop_mac: Option<EthernetAddress>,
        setup: impl FnOnce(&mut Interface, &mut tcp::Socket<'static>) -> Result<(), Error>,
    ) -> Result<ConnId, Error> {
        if self.flows.get(&flow).is_some() || self.flows.len() >= self.flows.capacity() {
            return Err(Error::Exhausted);
        }
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let Ok(i) = u32::try_from(self.slots.len()) else {
                    return Err(Error::Exhausted);
                };
                self.slots.push(Slot {
                    generation: 0,
                    deadline: None,
                    conn: None,
                });
                i
            }
        };
        let id = ConnId {
            index,
            generation: self.slots[index as usize].generation,
        };
        let mut ic = IfaceConfig::new(HardwareAddress::Ip);
        self.next_seed = self.next_seed.wrapping_add(1);
        ic.random_seed = mix(self.config.seed ^ mix(self.next_seed));
        let mut iface = Interface::new(ic, &mut CapsOnly(self.ip_caps.clone()), self.now);
        let (ip, prefix) = (self.ip, self.prefix);
        iface.update_ip_addrs(|a| {
            // A fresh interface has room for at least one address.
            let _ = a.push(IpCidr::new(IpAddress::Ipv4(ip), prefix));
        });
        // The stack writes the Ethernet header: any route will do for a
        // peer off our prefix.
        let _ = iface
            .routes_mut()
            .add_default_ipv4_route(self.gateway.unwrap_or(flow.0));
        let rx_capacity = self.rx_size();
        // SAFETY (of `new_socket`'s contract): the socket is dropped
        // first if `setup` fails; otherwise it goes into the connection's
        // `sockets` and never leaves it, and `buffers` is declared after
        // `sockets` in `Conn`, so the socket is dropped first.
        let Some((mut s, buffers)) = (unsafe { new_socket(&self.config, rx_capacity) }) else {
            self.free.push(index);
            return Err(Error::Exhausted);
        };
        if let Err(e) = setup(&mut iface, &mut s) {
            drop(s);
            drop(buffers);
            self.free.push(index);
            return Err(e);
        }
        let mut sockets = SocketSet::new(Vec::with_capacity(1));
        let handle = sockets.add(s);
        let conn = Conn {
            last: sockets.get::<tcp::Socket<'static>>(handle).state(),
            iface,
            sockets,
            handle,
            established: false,
            fin_received: false,
            reset: false,
            local_port: flow.2,
            remote: (flow.0, flow.1),
            next_hop_mac,
            written: 0,
            short_tail: false,
            nagle: false,
            segmented: false,
            writer_idle: false,
            quick_ack: false,
            peer_emss: None,
            half_open_on: None,
            orphan: false,
            queued: false,
            active: false,
            probe: Probe::None,
            rx_capacity,
            visited: self.now,
            idle_queued: false,
            buffers,
        };
        if self.flows.insert(flow, id).is_err() {
            self.free.push(index);
            return Err(Error::Exhausted);
        }
        self.slots[index as usize].conn = Some(Box::new(conn));
        self.rx_held += rx_capacity;
        self.live += 1;
        Ok(id)
    }

    /// Take a connection out: its slot's generation moves on (a slot whose
    /// generation ran out is retired), its flow and tables go.
    fn remove(&mut self, id: ConnId) -> Option<Box<Conn>> {
        let slot = self.slots.get_mut(id.index as usize)?;
        if slot.generation != id.generation {
            return None;
        }
        let c = slot.conn.take()?;
        slot.deadline = None;
        slot.generation = slot.generation.wrapping_add(1);
        if slot.generation != 0 {
            self.free.push(id.index);
        }
        if self.flows.get(&c.flow()) == Some(&id) {
            self.flows.remove(&c.flow());
        }
        // The device wrapper's tables are emptied by the stack after the
        // frame in hand (its tokens hold them meanwhile).
        self.forgotten.push(c.flow());
        if let Some(l) = c.half_open_on.and_then(|p| self.listeners.get_mut(&p)) {
            l.half_open_count = l.half_open_count.saturating_sub(1);
        }
        self.rx_held = self.rx_held.saturating_sub(c.rx_capacity);
        self.probes.end(c.probe);
        self.live -= 1;
        if c.next_hop_mac.is_none() {
            self.arp_wait.retain(|w| *w != id);
        }
        Some(c)
    }

    /// A SYN for a listening port that no connection owns: a new passive
    /// connection, or `None` when the port refuses it (the control
    /// interface then answers with a reset).
    fn open_passive(&mut self, flow: Flow, src_mac: EthernetAddress) -> Option<ConnId> {
        let local = flow.2;
        let l = self.listeners.get_mut(&local)?;
        if l.ready.len() >= self.config.backlog {
            self.counters.backlog_full += 1;
            return None;
        }
        if self.flows.len() >= self.flows.capacity() {
            self.counters.flow_table_full += 1;
            return None;
        }
        // Past the limit the oldest half-open connection makes room.
        let limit = self.config.half_open.max(1);
        loop {
            let l = self.listeners.get_mut(&local)?;
            if l.half_open_count < limit {
                break;
            }
            let Some(old) = l.half_open.pop_front() else {
                break;
            };
            if self
                .conn(old)
                .is_some_and(|c| c.half_open_on == Some(local))
            {
                // Counted off the listener by the removal.
                self.remove(old);
                self.counters.half_open_evicted += 1;
            }
        }
        let id = self
            .add_conn(flow, Some(src_mac), |_, s| {
                s.listen(local).map_err(|_| Error::Unaddressable)
            })
            .ok()?;
        let l = self.listeners.get_mut(&local)?;
        l.half_open.push_back(id);
        l.half_open_count += 1;
        if l.half_open.len() > 2 * l.half_open_count + 16 {
            let slots = &self.slots;
            l.half_open
                .retain(|&h| slot_conn(slots, h).is_some_and(|c| c.half_open_on == Some(local)));
        }
        if let Some(c) = self.conn_mut(id) {
            c.half_open_on = Some(local);
        }
        Some(id)
    }

    /// Hand one received frame to whoever it belongs to.
    fn dispatch<T: phy::TxToken>(&mut self, frame: &[u8], tx: T, now: Instant) {
        let conn = match classify(frame, self.ip) {
            Class::Tcp {
                flow,
                opens,
                src_mac,
            } => match self.flows.get(&flow).copied() {
                Some(id) => Some((id, src_mac)),
                None if opens && self.listeners.contains_key(&flow.2) => {
                    self.open_passive(flow, src_mac).map(|id| (id, src_mac))
                }
                None => None,
            },
            Class::Arp(ip, mac) => {
                self.learn(ip, mac);
                None
            }
            Class::Other => None,
        };
        if let Some((id, src_mac)) = conn {
            let (mac, caps) = (self.mac, &self.ip_caps);
            let slot = self.slots.get_mut(id.index as usize);
            if let Some(c) = slot.and_then(|s| s.conn.as_deref_mut()) {
                let hop = *c.next_hop_mac.get_or_insert(src_mac);
                // The peer answered: any probe's turn returns.
                self.probes.end(std::mem::take(&mut c.probe));
                let mut dev = Ingress {
                    frame: frame.get(ETH_HEADER..),
                    tx: Some(EthTx {
                        token: tx,
                        header: Some((mac, hop)),
                    }),
                    caps,
                };
                c.iface.poll_ingress_single(now, &mut dev, &mut c.sockets);
                if self.last_frame_conn.replace(id) != Some(id) {
                    self.counters.conn_switches += 1;
                    if self.frame_run > 0 {
                        self.counters.frame_runs[frame_run_bucket(self.frame_run)] += 1;
                    }
                    self.frame_run = 0;
                }
                self.frame_run += 1;
                self.touch(id);
                return;
            }
        }
        self.counters.control_frames += 1;
        let mut dev = Ingress {
            frame: Some(frame),
            tx: Some(EthTx {
                token: tx,
                header: None,
            }),
            caps: &self.eth_caps,
        };
        self.control
            .poll_ingress_single(now, &mut dev, &mut self.control_sockets);
    }

    /// Up to `rounds` egress rounds of one connection; whether it sent
    /// anything, and whether it stopped at the limit.
    fn egress<D: Device>(
        &mut self,
        port: &mut Port<D>,
        id: ConnId,
        rounds: usize,
        now: Instant,
    ) -> (bool, bool) {
        let (mac, config, caps) = (self.mac, &self.config, &self.ip_caps);
        let Some(c) = slot_conn_mut(&mut self.slots, id) else {
            return (false, false);
        };
        let Some(hop) = c.next_hop_mac else {
            return (false, false);
        };
        let mut sent = false;
        for _ in 0..rounds {
            if c.nagle {
                hold_full(port, config, c);
            }
            let mut dev = Egress {
                port: &mut *port,
                header: (mac, hop),
                caps,
            };
            match c.iface.poll_egress(now, &mut dev, &mut c.sockets) {
                PollResult::None => return (sent, false),
                PollResult::SocketStateChanged => sent = true,
            }
        }
        (sent, true)
    }

    /// After a visit: follow the connection's state (established, FIN,
    /// reset; the listener's queues), schedule its next deadline and list
    /// it for [`Stack::take_active`]. Returns whether its state changed.
    fn settle<D>(&mut self, port: &mut Port<D>, id: ConnId, now: Instant) -> bool {
        let local_mss = tcp_mss(self.eth_caps.max_transmission_unit);
        let Some(c) = slot_conn_mut(&mut self.slots, id) else {
            return false;
        };
        quick_ack(port, &self.config, c);
        let state = c.socket().state();
        let changed = state != c.last;
        let mut reset = false;
        if changed {
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
                    if !orderly && !c.reset && c.half_open_on.is_none() && !c.orphan {
                        c.reset = true;
                        reset = true;
                    }
                }
                _ => {}
            }
            if c.established && c.peer_emss.is_none() {
                let flow = c.flow();
                let syn = port.mss.get(flow).unwrap_or_default();
                let remote = syn.mss.map_or(DEFAULT_REMOTE_MSS, usize::from);
                c.peer_emss = Some(local_mss.min(remote));
                port.sent.set_peer(flow, syn);
            }
            c.last = state;
        }
        let (half_open_on, orphan) = (c.half_open_on, c.orphan);
        if reset {
            self.counters.resets += 1;
        }
        if let Some(local) = half_open_on {
            match state {
                State::SynReceived => {}
                State::Listen | State::Closed => {
                    // Reset during the handshake: smoltcp returns such a
                    // socket to Listen.
                    self.remove(id);
                    self.counters.half_open_dropped += 1;
                    return true;
                }
                _ => {
                    if !self.establish_passive(id, local) {
                        return true;
                    }
                }
            }
        }
        if orphan {
            if state == State::Closed {
                self.remove(id);
            } else {
                self.touch(id);
            }
            return changed;
        }
        let idle_release = self.config.idle_release.is_some();
        let Some((deadline, c)) = slot_parts_mut(&mut self.slots, id) else {
            return changed;
        };
        // A visit that leaves data in either buffer is activity; one for
        // a frame that moved none (a pure acknowledgement, a window
        // update, a nudge of a retracted window) leaves a quiet
        // connection quiet.
        let s = c.socket();
        if changed || s.recv_queue() > 0 || s.send_queue() > 0 {
            c.visited = now;
        }
        let idle_queue = idle_release && !std::mem::replace(&mut c.idle_queued, true);
        let mut due = false;
        let mut timer = None;
        match c.iface.poll_at(now, &c.sockets) {
            Some(t) if t <= now => due = true,
            Some(t) => {
                if *deadline != Some(t) {
                    *deadline = Some(t);
                    timer = Some(t);
                }
            }
            None => *deadline = None,
        }
        // A visit that brought no data and changed no state gives the
        // application nothing to read, and nothing to write if it has
        // nothing ([`Stack::set_writer_idle`]); a writer of whole
        // segments has nothing to do either until the room beyond what
        // is queued reaches a segment, or nothing is queued or in flight
        // any more (see [`SegmentRoom::writer_waits`]).
        let writer_waits = !changed
            && c.socket().recv_queue() == 0
            && (c.writer_idle
                || (c.segmented
                    && segment_room(port, &self.config, c).is_some_and(|r| r.writer_waits())));
        if writer_waits {
            self.counters.writer_waits += 1;
        } else if !std::mem::replace(&mut c.active, true) {
            self.active.push(id);
        }
        if let Some(t) = timer {
            self.timers.push(Reverse((t, id.index, id.generation)));
        }
        if idle_queue {
            self.idle.push_back((now, id));
        }
        if due {
            self.touch(id);
        }
        changed
    }

    /// When [`Self::release_idle`] has a connection to look at.
    fn idle_due(&self) -> Option<Instant> {
        let after = self.config.idle_release?;
        self.idle.front().map(|&(queued, _)| queued + after)
    }

    /// Give back the buffer pages of each connection that no visit has
    /// touched for [`Config::idle_release`] and whose buffers hold
    /// nothing it will read again; look at one that was visited, or still
    /// holds data, a period later.
    fn release_idle<D>(&mut self, port: &Port<D>, now: Instant) {
        let Some(after) = self.config.idle_release else {
            return;
        };
        while let Some(&(queued, id)) = self.idle.front() {
            if queued + after > now {
                break;
            }
            self.idle.pop_front();
            let Some(c) = slot_conn_mut(&mut self.slots, id) else {
                continue;
            };
            if c.visited + after > now {
                self.idle.push_back((now, id));
                continue;
            }
            // Without the wrapper's entry (its table is full) nothing
            // tells whether data waits out of order: the buffers stay.
            let Some(sent) = port.sent.get(c.flow()) else {
                c.idle_queued = false;
                continue;
            };
            let s = c.socket();
            // A connection waiting for its turn of the shared frames
            // whose peer sent nothing for `after` is quiet too (its peer
            // may have shown data once, such as an MPA message, and no
            // more): the turn, when it comes, takes the pages again.
            let holds = s.recv_queue() > 0 || s.send_queue() > 0 || sent.holds_unacknowledged();
            if holds {
                self.idle.push_back((now, id));
                continue;
            }
            c.idle_queued = false;
            // SAFETY: the buffers are this connection's socket's; the
            // stack holds `&mut self`, so the socket is not using them;
            // and they hold nothing the socket reads before writing it: no
            // unread or unsent data, nothing unacknowledged either way, so
            // no out-of-order data either.
            let bytes = unsafe { c.buffers.release() };
            self.counters.idle_releases += 1;
            self.counters.idle_released_bytes += bytes as u64;
        }
    }

    /// A passive connection finished its handshake: to the accept queue,
    /// or reset when the queue is full (then `false`).
    fn establish_passive(&mut self, id: ConnId, local: u16) -> bool {
        if let Some(c) = self.conn_mut(id) {
            c.half_open_on = None;
        }
        let backlog = self.config.backlog;
        let Some(l) = self.listeners.get_mut(&local) else {
            return true;
        };
        l.half_open_count = l.half_open_count.saturating_sub(1);
        if l.ready.len() >= backlog {
            self.counters.backlog_full += 1;
            if let Some(c) = self.conn_mut(id) {
                c.socket_mut().abort();
                c.orphan = true;
            }
            self.touch(id);
            return false;
        }
        l.ready.push_back(id);
        self.ready += 1;
        self.counters.accepted += 1;
        true
    }

    /// Turns of zero-window probes: those unanswered past their
    /// time come back, and the probes that waited take the free ones (their
    /// connections are visited).
    fn admit_probes(&mut self, now: Instant) {
        while let Some((until, id)) = self.probes.expired(now) {
            if let Some(c) = slot_conn_mut(&mut self.slots, id) {
                if c.probe == Probe::Out(until) {
                    self.probes.end(std::mem::take(&mut c.probe));
                    self.counters.probes_unanswered += 1;
                }
            }
        }
        while let Some(id) = self.probes.next_waiting() {
            if let Some(c) = slot_conn_mut(&mut self.slots, id) {
                if c.probe == Probe::Waiting {
                    c.probe = self.probes.take(id, now);
                    self.touch(id);
                }
            }
        }
    }

    /// Move connections whose deadline has come to the work list.
    fn fire_timers<D>(&mut self, port: &Port<D>, now: Instant) {
        while let Some(&Reverse((t, index, generation))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let id = ConnId { index, generation };
            let Some((deadline, c)) = slot_parts_mut(&mut self.slots, id) else {
                continue;
            };
            if *deadline != Some(t) {
                continue;
            }
            *deadline = None;
            // A visit now would probe the peer's closed window: the probe
            // takes a turn first (`crate::probe`).
            let probes = c.probe == Probe::None
                && segment_room(port, &self.config, c).is_some_and(|r| r.probes_on_timer());
            if !probe_waits(
                &mut self.probes,
                &mut c.probe,
                probes,
                id,
                now,
                &mut self.counters,
            ) {
                self.touch(id);
            }
        }
        // Entries of moved deadlines and of released connections: rebuild
        // once they outnumber the live ones (amortised over the pushes).
        if self.timers.len() > 2 * self.live + 64 {
            let slots = &self.slots;
            self.timers.retain(|&Reverse((t, index, generation))| {
                slot_deadline(slots, ConnId { index, generation }) == Some(t)
            });
        }
    }

    /// The earliest live deadline, dropping stale entries on the way.
    fn next_timer(&mut self) -> Option<Instant> {
        while let Some(&Reverse((t, index, generation))) = self.timers.peek() {
            if slot_deadline(&self.slots, ConnId { index, generation }) == Some(t) {
                return Some(t);
            }
            self.timers.pop();
        }
        None
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
        let eth_caps = port.capabilities();
        port.sent.share = WindowShare::new(
            config.window_frames.unwrap_or(0),
            tcp_mss(eth_caps.max_transmission_unit),
        );
        let mut ip_caps = eth_caps.clone();
        ip_caps.medium = Medium::Ip;
        ip_caps.max_transmission_unit = eth_caps.max_transmission_unit - ETH_HEADER;
        let mut ic = IfaceConfig::new(HardwareAddress::Ethernet(mac));
        ic.random_seed = config.seed;
        let mut control = Interface::new(ic, &mut port, now);
        control.update_ip_addrs(|a| {
            // A fresh interface has room for at least one address.
            let _ = a.push(IpCidr::new(IpAddress::Ipv4(ip), prefix));
        });
        if let Some(gw) = gateway {
            // The route table has room for the default route.
            let _ = control.routes_mut().add_default_ipv4_route(gw);
        }
        let core = Core {
            flows: FlowTable::new(config.max_connections),
            config,
            control,
            control_sockets: SocketSet::new(Vec::new()),
            eth_caps,
            ip_caps,
            now,
            mac,
            ip,
            prefix,
            gateway,
            neighbors: Vec::new(),
            neighbor_refresh_at: now,
            learnt: HashMap::default(),
            arp_wait: Vec::new(),
            arp_retry_at: now,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            listeners: HashMap::new(),
            ready: 0,
            work: Vec::new(),
            active: Vec::new(),
            timers: BinaryHeap::new(),
            rx_held: 0,
            next_seed: 0,
            counters: Counters::default(),
            egress_due: false,
            forgotten: Vec::new(),
            idle: VecDeque::new(),
            probes: ProbeGate::default(),
            last_frame_conn: None,
            frame_run: 0,
        };
        Self { port, core }
    }

    /// The settings the stack was created with.
    pub fn config(&self) -> &Config {
        &self.core.config
    }

    /// The stack's own IPv4 address.
    pub fn ip(&self) -> Ipv4Address {
        self.core.ip
    }

    /// The stack's own Ethernet (MAC) address.
    pub fn mac(&self) -> EthernetAddress {
        self.core.mac
    }

    /// The device the stack sends and receives frames through.
    pub fn device(&self) -> &D {
        &self.port.inner
    }

    /// The device, mutably (for example to move frames in a simulation).
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.port.inner
    }

    /// A snapshot of the stack's counters.
    pub fn counters(&self) -> Counters {
        let c = &self.port.counters;
        Counters {
            rx_frames: c.rx_frames.get(),
            rx_bytes: c.rx_bytes.get(),
            tx_frames: c.tx_frames.get(),
            tx_bytes: c.tx_bytes.get(),
            acks_renumbered: c.acks_renumbered.get(),
            windows_cut: c.windows_cut.get(),
            window_updates: c.window_updates.get(),
            window_updates_repeated: self.port.sent.share.repeated.get(),
            turn_bytes: self.port.sent.share.turn_bytes(),
            turns_filled: self.port.sent.share.turns_filled.get(),
            turns_unfilled: self.port.sent.share.turns_unfilled.get(),
            turns_ended_quiet: self.port.sent.share.quiet_turns.get(),
            retraction_nudges: self.port.sent.share.nudged.get(),
            windows_retracted: self.port.sent.share.retracted.get(),
            closed_window_segments: self.port.sent.share.closed_segments.get(),
            ..self.core.counters
        }
    }

    /// Open connections (any state, until released).
    pub fn connection_count(&self) -> usize {
        self.core.live
    }

    /// Entries of the timer heap, stale ones included (deadlines that
    /// moved, connections released): at most about twice the open
    /// connections, for tests and diagnostics.
    pub fn timer_entries(&self) -> usize {
        self.core.timers.len()
    }

    /// Entries of the flow table (one per open connection).
    pub fn flow_count(&self) -> usize {
        self.core.flows.len()
    }

    /// Half-open connections of a listening port.
    pub fn half_open(&self, port: u16) -> usize {
        self.core
            .listeners
            .get(&port)
            .map_or(0, |l| l.half_open_count)
    }

    /// A static neighbour: `ip` is at `mac`, without asking ARP. ARP stays
    /// enabled for every other address. The entry is also fed to the
    /// control interface as a synthetic ARP reply at the next poll and
    /// refreshed before smoltcp's cache would expire it. `ip` must be
    /// inside our prefix.
    pub fn add_neighbor(&mut self, ip: Ipv4Address, mac: EthernetAddress) {
        self.core.neighbors.retain(|(i, _)| *i != ip);
        self.core.neighbors.push((ip, mac));
        let reply = self.arp_frame(ArpOperation::Reply, ip, mac);
        self.port.inject.push_back(reply);
        self.core.counters.neighbor_refreshes += 1;
    }

    /// An ARP reply from `ip` at `mac` to us, or our request for `ip`.
    fn arp_frame(&self, op: ArpOperation, ip: Ipv4Address, mac: EthernetAddress) -> Vec<u8> {
        let (us, our_ip) = (self.core.mac, self.core.ip);
        let (arp, eth) = match op {
            ArpOperation::Request => (
                ArpRepr::EthernetIpv4 {
                    operation: op,
                    source_hardware_addr: us,
                    source_protocol_addr: our_ip,
                    target_hardware_addr: EthernetAddress([0; 6]),
                    target_protocol_addr: ip,
                },
                EthernetRepr {
                    src_addr: us,
                    dst_addr: EthernetAddress::BROADCAST,
                    ethertype: EthernetProtocol::Arp,
                },
            ),
            _ => (
                ArpRepr::EthernetIpv4 {
                    operation: op,
                    source_hardware_addr: mac,
                    source_protocol_addr: ip,
                    target_hardware_addr: us,
                    target_protocol_addr: our_ip,
                },
                EthernetRepr {
                    src_addr: mac,
                    dst_addr: us,
                    ethertype: EthernetProtocol::Arp,
                },
            ),
        };
        let mut buf = vec![0; eth.buffer_len() + arp.buffer_len()];
        let mut frame = EthernetFrame::new_unchecked(&mut buf[..]);
        eth.emit(&mut frame);
        arp.emit(&mut ArpPacket::new_unchecked(frame.payload_mut()));
        buf
    }

    /// Listen on `port`. Incoming connections show up in [`Stack::accept`];
    /// the port keeps listening after each one.
    pub fn listen(&mut self, port: u16) -> Result<(), Error> {
        if port == 0 {
            return Err(Error::Unaddressable);
        }
        if self.core.listeners.contains_key(&port) {
            return Err(Error::AlreadyListening);
        }
        self.core.listeners.insert(port, Listener::default());
        Ok(())
    }

    /// Stop listening on `port`. Connections already accepted stay; half
    /// open and unaccepted ones are dropped.
    pub fn unlisten(&mut self, port: u16) {
        let Some(l) = self.core.listeners.remove(&port) else {
            return;
        };
        // Entries of connections established since are skipped: those
        // are in the accept queue or the application's.
        for id in l.half_open {
            if self
                .core
                .conn(id)
                .is_some_and(|c| c.half_open_on == Some(port))
            {
                self.core.remove(id);
            }
        }
        self.core.ready -= l.ready.len();
        for id in l.ready {
            self.core.remove(id);
        }
        self.flush_forgotten();
    }

    /// Take one established connection that arrived on `port`.
    pub fn accept(&mut self, port: u16) -> Option<ConnId> {
        while self.core.ready > 0 {
            let id = self.core.listeners.get_mut(&port)?.ready.pop_front()?;
            self.core.ready -= 1;
            if self.core.conn(id).is_some() {
                return Some(id);
            }
        }
        None
    }

    /// Open a connection to `remote` from `local_port`.
    pub fn connect(
        &mut self,
        remote: (Ipv4Address, u16),
        local_port: u16,
    ) -> Result<ConnId, Error> {
        if remote.1 == 0 || local_port == 0 || remote.0.is_unspecified() {
            return Err(Error::Unaddressable);
        }
        let hop = self.core.next_hop(remote.0);
        let mac = self.core.resolve(hop);
        let ep = IpEndpoint::new(IpAddress::Ipv4(remote.0), remote.1);
        let id = self
            .core
            .add_conn((remote.0, remote.1, local_port), mac, |iface, s| {
                s.connect(iface.context(), ep, local_port)
                    .map_err(|e| match e {
                        tcp::ConnectError::Unaddressable => Error::Unaddressable,
                        _ => Error::InvalidState,
                    })
            })?;
        if mac.is_none() {
            self.core.arp_wait.push(id);
            self.core.arp_retry_at = self.core.now;
        }
        self.core.counters.connects += 1;
        self.core.egress_due = true;
        self.core.touch(id);
        Ok(id)
    }

    fn conn_mut(&mut self, conn: ConnId) -> Result<&mut Conn, Error> {
        self.core.conn_mut(conn).ok_or(Error::UnknownConnection)
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
        let c = self.conn_mut(conn)?;
        let fin = c.fin_received;
        let s = c.socket_mut();
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
        // next segment carries the new one, and no visit is owed.
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
            self.core.touch(conn);
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
        let probe = self.segment_room(conn).is_some_and(|r| r.probes_on_write());
        self.send_limited(conn, usize::MAX, probe, |buf, _| f(buf))
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
            // Only the first write can meet an empty buffer.
            let probe = total == 0 && r.probes_on_write();
            let (n, wrapped) = self.send_limited(conn, limit, probe, &mut f)?;
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
        if let Some(c) = self.core.conn_mut(conn) {
            c.short_tail = short_tail;
            c.segmented = true;
        }
        let queued = SegmentRoom {
            unsent: r.unsent + total,
            ..r
        };
        self.set_nagle(conn, queued.holds_full());
        Ok(total)
    }

    /// Switch Nagle's rule for `conn`; returns whether it is on by this.
    fn set_nagle(&mut self, conn: ConnId, hold: bool) -> bool {
        let Core { config, slots, .. } = &mut self.core;
        slot_conn_mut(slots, conn).is_some_and(|c| set_nagle(config, c, hold))
    }

    /// For [`Stack::send_segment`]: what the connection has queued, sent
    /// and may send, as far as the device wrapper saw its segments.
    fn segment_room(&self, conn: ConnId) -> Option<SegmentRoom> {
        segment_room(&self.port, &self.core.config, self.core.conn(conn)?)
    }

    /// [`Stack::send`] with at most `limit` bytes, passing the writer how
    /// many of them are left; `probe`: bytes written make smoltcp probe at
    /// once ([`SegmentRoom::probes_on_write`], from the caller's room).
    /// Returns the bytes written and whether they wrapped round the end of
    /// the ring.
    fn send_limited<F: FnMut(&mut [u8], usize) -> usize>(
        &mut self,
        conn: ConnId,
        limit: usize,
        probe: bool,
        mut f: F,
    ) -> Result<(usize, bool), Error> {
        let Core {
            slots,
            probes,
            now,
            counters,
            ..
        } = &mut self.core;
        let c = slot_conn_mut(slots, conn).ok_or(Error::UnknownConnection)?;
        let s = c.socket_mut();
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
        c.written = c.written.wrapping_add(total as u32);
        if total > 0 {
            c.writer_idle = false;
        }
        // A probe leaves when it has a turn: the connection is visited
        // then (see `crate::probe`).
        if total > 0 && !probe_waits(probes, &mut c.probe, probe, conn, *now, counters) {
            self.core.egress_due = true;
            self.core.touch(conn);
        }
        Ok((total, wrapped))
    }

    /// Bytes queued into the connection that smoltcp has not sent even
    /// once yet (in flight or acknowledged bytes do not count). `None` for
    /// a connection whose segments the stack does not follow.
    pub fn unsent(&self, conn: ConnId) -> Option<usize> {
        self.segment_room(conn).map(|r| r.unsent)
    }

    /// Copy `data` into the transmit ring, as much as fits; returns the
    /// bytes copied. Errors as [`Stack::send`].
    pub fn send_slice(&mut self, conn: ConnId, data: &[u8]) -> Result<usize, Error> {
        let mut off = 0;
        self.send(conn, |buf| {
            let n = buf.len().min(data.len() - off);
            buf[..n].copy_from_slice(&data[off..off + n]);
            off += n;
            n
        })
    }

    /// Copy received bytes into `out`, as many as are there and fit;
    /// returns the bytes copied. Errors as [`Stack::recv`].
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
        self.conn_mut(conn)?.socket_mut().close();
        self.core.egress_due = true;
        self.core.touch(conn);
        Ok(())
    }

    /// Abort the connection (RST at the next poll).
    pub fn abort(&mut self, conn: ConnId) -> Result<(), Error> {
        self.conn_mut(conn)?.socket_mut().abort();
        self.core.egress_due = true;
        self.core.touch(conn);
        Ok(())
    }

    /// Forget a connection and free its buffers, its slot and its flow. A
    /// connection that is still open is dropped without telling the peer;
    /// call it after [`Stack::is_closed`], or after [`Stack::abort`] and a
    /// poll.
    pub fn release(&mut self, conn: ConnId) -> Result<(), Error> {
        let r = self.core.remove(conn).map(drop);
        self.flush_forgotten();
        r.ok_or(Error::UnknownConnection)
    }

    /// The application has nothing to write on `conn` (`idle`), or may
    /// have again. While it has nothing, a frame that brings no data to
    /// read and changes no state (an acknowledgement, a window update, a
    /// zero-window probe) does not list the connection for
    /// [`Stack::take_active`]: it gives the application nothing to do.
    /// Anything written ([`Stack::send`], [`Stack::send_segment`]) ends
    /// it. An application that gets something to write (a request of its
    /// own, a timer) visits the connection by its own account.
    pub fn set_writer_idle(&mut self, conn: ConnId, idle: bool) {
        if let Some(c) = self.core.conn_mut(conn) {
            c.writer_idle = idle;
        }
    }

    /// smoltcp's TCP state of the connection, `None`
    /// for an unknown or released connection.
    pub fn state(&self, conn: ConnId) -> Option<State> {
        self.core.conn(conn).map(|c| c.socket().state())
    }

    /// The connection's receive buffer (the most its window can reach):
    /// [`Config::rx_buffer`], or less under [`Config::rx_budget`].
    pub fn rx_capacity(&self, conn: ConnId) -> Option<usize> {
        self.core.conn(conn).map(|c| c.socket().recv_capacity())
    }

    /// Whether the connection is established (data may flow both ways).
    pub fn is_established(&self, conn: ConnId) -> bool {
        self.state(conn) == Some(State::Established)
    }

    /// The peer closed its direction and every byte was read.
    pub fn is_eof(&self, conn: ConnId) -> bool {
        self.core
            .conn(conn)
            .is_some_and(|c| c.fin_received_now() && c.socket().recv_queue() == 0)
    }

    /// The connection ended without the FIN exchange: the peer reset it,
    /// we aborted it, or it timed out.
    pub fn is_reset(&self, conn: ConnId) -> bool {
        self.core.conn(conn).is_some_and(|c| c.reset)
    }

    /// The connection is fully closed (nothing more will happen on it).
    pub fn is_closed(&self, conn: ConnId) -> bool {
        matches!(self.state(conn), Some(State::Closed | State::TimeWait))
    }

    /// Received bytes waiting in the receive ring to be read (0 for an
    /// unknown connection).
    pub fn recv_queue(&self, conn: ConnId) -> usize {
        self.core.conn(conn).map_or(0, |c| c.socket().recv_queue())
    }

    /// Bytes in the transmit ring not yet acknowledged by the peer.
    pub fn send_queue(&self, conn: ConnId) -> usize {
        self.core.conn(conn).map_or(0, |c| c.socket().send_queue())
    }

    /// The connection's local and remote address and port, `None` for an
    /// unknown connection or one not bound yet.
    pub fn endpoints(&self, conn: ConnId) -> Option<(IpEndpoint, IpEndpoint)> {
        let s = self.core.conn(conn)?.socket();
        Some((s.local_endpoint()?, s.remote_endpoint()?))
    }

    /// The effective MSS of an established connection: the most payload
    /// one segment carries, min(our MTU's MSS, the peer's SYN MSS) less
    /// options (none: no timestamps). The iWARP layer sizes FPDUs
    /// (MULPDU) from it. `None` before the handshake completes.
    pub fn emss(&self, conn: ConnId) -> Option<usize> {
        self.core.conn(conn)?.emss()
    }

    /// The MSS our MTU allows (what our SYNs announce).
    pub fn local_mss(&self) -> usize {
        tcp_mss(self.core.eth_caps.max_transmission_unit)
    }

    /// Process up to [`Config::ingress_budget`] received frames (and
    /// [`Config::ingress_bytes`] bytes), each
    /// handed to its connection through the flow table (a SYN to a
    /// listening port opens one), then visit the connections that have
    /// something to do: frames arrived, data queued, a close, a read that
    /// may reopen the window, a timer due. A visit lets the connection
    /// send (up to [`Config::egress_budget`] segments) and follows its
    /// state. Returns whether anything happened (a frame in or out, or a
    /// state change); call again while it returns true, then sleep until
    /// [`Stack::poll_at`].
    pub fn poll(&mut self, now: Instant) -> bool {
        self.core.now = now;
        self.port.sent.tick(now);
        let mut did = false;
        if !self.core.neighbors.is_empty() && now >= self.core.neighbor_refresh_at {
            self.core.neighbor_refresh_at = now + NEIGHBOR_REFRESH;
            let frames: Vec<_> = self
                .core
                .neighbors
                .iter()
                .map(|&(ip, mac)| self.arp_frame(ArpOperation::Reply, ip, mac))
                .collect();
            self.core.counters.neighbor_refreshes += frames.len() as u64;
            self.port.inject.extend(frames);
        }
        self.ask_arp(now);
        let mut budget_hit = true;
        let mut bytes = 0;
        for _ in 0..self.core.config.ingress_budget {
            if bytes >= self.core.config.ingress_bytes {
                break;
            }
            let Self { port, core } = self;
            let Some((rx, tx)) = port.receive(now) else {
                budget_hit = false;
                break;
            };
            did = true;
            phy::RxToken::consume(rx, |frame| {
                bytes += frame.len();
                core.dispatch(frame, tx, now)
            });
            self.flush_forgotten();
        }
        if budget_hit {
            self.core.counters.ingress_budget_hits += 1;
        }
        self.core.fire_timers(&self.port, now);
        self.core.admit_probes(now);
        if matches!(
            self.core
                .control
                .poll_egress(now, &mut self.port, &mut self.core.control_sockets),
            PollResult::SocketStateChanged
        ) {
            did = true;
        }
        self.core.control.poll_maintenance(now);
        self.core.egress_due = false;
        self.port.tx_refused = false;
        let work = std::mem::take(&mut self.core.work);
        for (k, &id) in work.iter().enumerate() {
            if self.port.tx_refused {
                // The device has no frame: the connections not visited
                // stay listed (and queued) for the next poll, ahead of
                // those this one visited and listed again.
                self.core.counters.egress_device_full += 1;
                let visited = std::mem::take(&mut self.core.work);
                self.core.work.extend_from_slice(&work[k..]);
                self.core.work.extend(visited);
                break;
            }
            let Some(c) = self.core.conn_mut(id) else {
                continue;
            };
            c.queued = false;
            self.core.counters.conn_visits += 1;
            let rounds = self.core.config.egress_budget;
            let (sent, hit) = self.core.egress(&mut self.port, id, rounds, now);
            if hit {
                self.core.counters.egress_budget_hits += 1;
            }
            did |= sent;
            did |= self.core.settle(&mut self.port, id, now);
        }
        // The list's allocation is kept for the next poll.
        let mut work = work;
        work.clear();
        if self.core.work.is_empty() {
            self.core.work = work;
        }
        self.flush_forgotten();
        did |= self.port.send_window_updates(now);
        self.core.release_idle(&self.port, now);
        did
    }

    /// One round of egress: each connection with work sends at most one
    /// segment. Lets a writer that queues a segment at a time
    /// ([`Stack::send_segment`]) queue the next; [`Stack::poll`] still
    /// follows for timers and state. Returns whether a connection sent.
    pub fn poll_egress(&mut self, now: Instant) -> bool {
        // Connections released since they were listed are gone for good.
        let Core { work, slots, .. } = &mut self.core;
        work.retain(|&id| slot_conn(slots, id).is_some());
        let mut sent = false;
        self.port.tx_refused = false;
        for i in 0..self.core.work.len() {
            if self.port.tx_refused {
                break;
            }
            let id = self.core.work[i];
            sent |= self.core.egress(&mut self.port, id, 1, now).0;
        }
        sent
    }

    /// Let one connection send what it has queued, up to
    /// [`Config::egress_budget`] segments, now rather than at the next
    /// [`Stack::poll`], which still visits it (for its state, its timers
    /// and whatever this left). A writer that has just queued a turn's
    /// worth sends it while the bytes are still in its core's cache: one
    /// that queues for many connections before the poll sends them would
    /// read the first ones back from memory. `now` is the caller's
    /// clock, as for [`Stack::poll_egress`]: a caller that skips polls
    /// while it has no work ([`Stack::needs_poll`]) may come here long
    /// after the last one, and segments stamped with that poll's time
    /// would start their retransmission timer in the past and give
    /// smoltcp a round trip as long as the idle time. A zero-window probe
    /// that waits for its turn ([`Counters::probes_delayed`]) still
    /// waits. Returns whether the connection sent anything.
    pub fn egress_now(&mut self, conn: ConnId, now: Instant) -> bool {
        match self.core.conn(conn) {
            Some(c) if c.probe != Probe::Waiting => {}
            _ => return false,
        }
        self.port.tx_refused = false;
        let rounds = self.core.config.egress_budget;
        self.core.egress(&mut self.port, conn, rounds, now).0
    }

    /// Whether [`Stack::poll`] may have work at `now` although no frame
    /// arrived: a connection was touched by a call (queued data, a close,
    /// a read that may have reopened a closing window) or its timer is
    /// due, or the stack has frames of its own to send. A caller that
    /// checked its device for frames skips the poll otherwise.
    pub fn needs_poll(&self, now: Instant) -> bool {
        let c = &self.core;
        !c.work.is_empty()
            || c.egress_due
            || !self.port.inject.is_empty()
            || self.port.sent.updates_due()
            || c.timers.peek().is_some_and(|Reverse((t, _, _))| *t <= now)
            || (!c.arp_wait.is_empty() && now >= c.arp_retry_at)
            || (!c.neighbors.is_empty() && now >= c.neighbor_refresh_at)
            || c.idle_due().is_some_and(|t| t <= now)
            || self.port.sent.due_by(now)
            || c.probes.due().is_some_and(|t| t <= now)
    }

    /// Whether data, a FIN, a reset or a SYN was queued since the last
    /// [`Stack::poll`]: a caller that polled before filling the transmit
    /// rings needs another poll only then (timers and ACKs wait for the
    /// next pass or [`Stack::poll_at`]).
    pub fn egress_due(&self) -> bool {
        self.core.egress_due
    }

    /// When to poll next at the latest (`now` or earlier: at once).
    pub fn poll_at(&mut self, now: Instant) -> Option<Instant> {
        if self.needs_poll(now) {
            return Some(now);
        }
        let c = &mut self.core;
        let control = c.control.poll_at(now, &c.control_sockets);
        let refresh = (!c.neighbors.is_empty()).then_some(c.neighbor_refresh_at);
        let arp = (!c.arp_wait.is_empty()).then_some(c.arp_retry_at);
        let share = self.port.sent.due();
        let probes = c.probes.due();
        [
            c.next_timer(),
            control,
            refresh,
            arp,
            c.idle_due(),
            share,
            probes,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Connections that had something happen since the last call (frames,
    /// a timer, a call of the application's), each once, into `out`: the
    /// ones a caller's pass has to look at besides those it has work for.
    pub fn take_active(&mut self, out: &mut Vec<ConnId>) {
        for id in self.core.active.drain(..) {
            if let Some(c) = slot_conn_mut(&mut self.core.slots, id) {
                c.active = false;
                out.push(id);
            }
        }
    }

    /// Empty the device wrapper's tables of the connections that left.
    fn flush_forgotten(&mut self) {
        for flow in self.core.forgotten.drain(..) {
            self.port.forget(flow);
        }
    }

    /// Ask ARP for the next hops new connections wait for, once per
    /// [`ARP_RETRY`].
    fn ask_arp(&mut self, now: Instant) {
        if self.core.arp_wait.is_empty() || now < self.core.arp_retry_at {
            return;
        }
        self.core.arp_retry_at = now + ARP_RETRY;
        let mut hops: Vec<Ipv4Address> = Vec::new();
        for &id in &self.core.arp_wait {
            if let Some(c) = self.core.conn(id) {
                let hop = self.core.next_hop(c.remote.0);
                if !hops.contains(&hop) {
                    hops.push(hop);
                }
            }
        }
        for hop in hops {
            let frame = self.arp_frame(ArpOperation::Request, hop, self.core.mac);
            if let Some(tx) = self.port.transmit(now) {
                phy::TxToken::consume(tx, frame.len(), |buf| buf.copy_from_slice(&frame));
                self.core.counters.arp_requests += 1;
            }
        }
    }
}

/// States reached only after the peer's FIN.
fn fin_state(state: State) -> bool {
    matches!(
        state,
        State::CloseWait | State::LastAck | State::Closing | State::TimeWait
    )
}

/// A socket with the stack's settings and a receive buffer of `rx_size`,
/// and the memory of its buffers; `None` if the system maps none.
///
/// # Safety
///
/// The socket is dropped before the [`Buffers`] (see [`Buffers::map`]).
unsafe fn new_socket(config: &Config, rx_size: usize) -> Option<(tcp::Socket<'static>, Buffers)> {
    // SAFETY: the caller's contract is `map`'s.
    let (buffers, rx, tx) = unsafe { Buffers::map(rx_size, config.tx_buffer) }?;
    let mut s = tcp::Socket::new(tcp::SocketBuffer::new(rx), tcp::SocketBuffer::new(tx));
    s.set_nagle_enabled(config.nagle);
    s.set_ack_delay(config.ack_delay);
    s.set_congestion_control(config.congestion);
    s.set_timeout(config.timeout);
    s.set_keep_alive(config.keep_alive);
    Some((s, buffers))
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
        let _ = write!(find, "{:?}", self.core.conn(conn)?.socket());
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
        let flow = self.core.conn(conn)?.flow();
        self.port.sent.get(flow)?.congestion_window()
    }
}

#[cfg(test)]
mod frame_run_tests {
    use super::{frame_run_bucket, FRAME_RUN_BUCKETS};

    #[test]
    fn runs_go_to_their_power_of_two() {
        let last = FRAME_RUN_BUCKETS - 1;
        for (len, bucket) in [
            (1, 0),
            (2, 1),
            (3, 1),
            (4, 2),
            (7, 2),
            (8, 3),
            (31, 4),
            (32, 5),
        ] {
            assert_eq!(frame_run_bucket(len), bucket, "a run of {len}");
        }
        assert_eq!(frame_run_bucket(1 << last), last);
        assert_eq!(frame_run_bucket((1 << last) - 1), last - 1);
        assert_eq!(frame_run_bucket(u64::MAX), last);
    }
}
