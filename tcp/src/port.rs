//! The device wrapper a [`Stack`](crate::Stack) puts around the caller's
//! `phy::Device`: it counts frames, lets the stack inject frames into its
//! own ingress (the synthetic ARP replies behind static neighbour
//! entries), and reads the MSS option of every SYN that arrives, because
//! smoltcp keeps the peer's MSS private and the iWARP layer needs the
//! effective MSS to size its FPDUs. It also reads the sequence numbers of
//! the segments smoltcp sends ([`SentTable`]), for the same reason: a
//! writer that keeps records inside segments must know when everything it
//! queued has left, which smoltcp does not say, and how much smoltcp's
//! congestion window takes (mirrored from the same segments, `cwnd.rs`).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};

use smoltcp::phy::{self, Device, DeviceCapabilities};
use smoltcp::time::Instant;
use smoltcp::wire::{
    EthernetFrame, EthernetProtocol, IpAddress, IpProtocol, Ipv4Address, Ipv4Packet, TcpPacket,
    TcpSeqNumber, IPV4_HEADER_LEN, TCP_HEADER_LEN,
};

use crate::cwnd::{self, Received, Reno};
use crate::hash::FlowHash;

/// How many peers' SYN options are remembered: one entry per connection
/// being set up or open; past it the SYNs of new flows are not read (their
/// connections fall back to the defaults a SYN without options gives).
const MSS_TABLE_CAP: usize = 1 << 17;

/// Frame counters, updated by the tokens.
#[derive(Debug, Default)]
pub(crate) struct PortCounters {
    pub rx_frames: Cell<u64>,
    pub rx_bytes: Cell<u64>,
    pub tx_frames: Cell<u64>,
    pub tx_bytes: Cell<u64>,
    pub acks_renumbered: Cell<u64>,
    /// Segments whose window field was cut to the connection's share of
    /// the receive frames ([`WindowShare`]).
    pub windows_cut: Cell<u64>,
}

fn bump(c: &Cell<u64>, n: u64) {
    c.set(c.get().wrapping_add(n));
}

/// A connection as the tables key it: (remote address, remote port, local
/// port).
pub(crate) type Flow = (Ipv4Address, u16, u16);

/// Options of a peer's SYN.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SynOptions {
    pub mss: Option<u16>,
    window_scale: Option<u8>,
}

impl SynOptions {
    /// The shift the peer's window field is scaled by: its SYN's window
    /// scale option, 0 without one (smoltcp offers scaling in every SYN
    /// it opens with and answers in kind, so the peer's option decides).
    pub(crate) fn window_shift(&self) -> u8 {
        self.window_scale.unwrap_or(0).min(14)
    }
}

/// Options seen in the peers' SYNs: (remote address, remote port, local
/// port) → MSS and window scale.
#[derive(Debug, Default)]
pub(crate) struct MssTable {
    entries: HashMap<Flow, SynOptions, FlowHash>,
}

impl MssTable {
    /// The options of the last SYN seen on `flow`.
    pub(crate) fn get(&self, flow: Flow) -> Option<SynOptions> {
        self.entries.get(&flow).copied()
    }

    fn forget(&mut self, flow: Flow) {
        self.entries.remove(&flow);
    }

    fn put(&mut self, key: Flow, options: SynOptions) {
        if let Some(old) = self.entries.get_mut(&key) {
            old.mss = options.mss.or(old.mss);
            old.window_scale = options.window_scale;
        } else if self.entries.len() < MSS_TABLE_CAP {
            self.entries.insert(key, options);
        }
    }

    /// Look at one received segment; remember the options if it is a
    /// valid SYN (a SYN without an MSS keeps the one seen before).
    fn observe(&mut self, seg: &Segment<'_>) {
        let tcp = &seg.tcp;
        if !tcp.syn() || !tcp.verify_checksum(&IpAddress::Ipv4(seg.src), &IpAddress::Ipv4(seg.dst))
        {
            return;
        }
        if let Ok(summary) = tcp.options_summary() {
            let options = SynOptions {
                mss: summary.max_segment_size,
                window_scale: summary.window_scale,
            };
            self.put(seg.flow, options);
        }
    }
}

/// How many connections [`SentTable`] follows at most. Entries leave with
/// their connection; past this many (which a stack never has open), new
/// connections are not followed and [`Stack::unsent`] knows nothing of
/// them.
///
/// [`Stack::unsent`]: crate::Stack::unsent
const SENT_TABLE_CAP: usize = 1 << 16;

/// Sequence space one connection has sent, from its own segments, and
/// the peer's acknowledgement and window, from the peer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sent {
    /// Sequence number of the first data byte (our ISN + 1).
    pub start: u32,
    /// One past the highest data byte sent so far.
    pub next: u32,
    /// The highest acknowledgement number seen (at most `next`).
    pub una: u32,
    /// The window field of the segment that brought `una` (unscaled);
    /// `None` until the peer acknowledged anything.
    pub window: Option<u16>,
    /// The shift of the peer's window field, once established.
    pub window_shift: u8,
    /// The window scale option of our SYN.
    our_scale: Option<u8>,
    /// The shift of our window field, once established (ours if the peer
    /// offered scaling too, else 0).
    our_shift: u8,
    /// smoltcp's congestion window, mirrored when the socket runs Reno.
    reno: Option<Reno>,
    /// The right edge of the receive window we last advertised
    /// (acknowledgement + window), once established.
    rx_edge: Option<u32>,
    /// The [`WindowShare`] period in which the peer last sent data.
    rx_period: u64,
    /// Bytes the peer may send beyond what we acknowledged, as we last
    /// advertised (counted in [`WindowShare`]'s total).
    rx_open: usize,
}

impl Sent {
    /// Data bytes sent at least once.
    pub(crate) fn bytes(&self) -> u32 {
        self.next.wrapping_sub(self.start)
    }

    /// Bytes sent and not yet acknowledged.
    pub(crate) fn in_flight(&self) -> u32 {
        self.next.wrapping_sub(self.una)
    }

    /// smoltcp's congestion window, if it is mirrored; `None` when the
    /// socket runs without congestion control.
    pub(crate) fn congestion_window(&self) -> Option<usize> {
        self.reno.map(|r| r.window())
    }

    /// Bytes the peer may send beyond what we acknowledged, as we last
    /// advertised it; `None` before we acknowledged anything.
    pub(crate) fn rx_window(&self) -> Option<usize> {
        self.rx_edge.map(|_| self.rx_open)
    }
}

/// How long a connection counts as receiving after its last data
/// segment: between one and two of these periods.
const SHARE_PERIOD_MS: i64 = 10;

/// The receive frames shared by the connections
/// ([`Config::window_frames`](crate::Config::window_frames)): the windows
/// all connections have open together stay within `frames × mss` bytes,
/// so the peers together cannot have more in flight than the device has
/// frames to receive into. A connection is offered what the others leave
/// open, at most its fair part, `frames × mss / receiving` (the
/// connections that received data lately), and at least one MSS, so no
/// window closes for want of credit (past `frames` connections that do
/// receive, that floor is what exceeds the frames). smoltcp advertises
/// its whole free buffer and cannot be told less, so the window field of
/// each segment it sends is cut on the way out; the right edge
/// (acknowledgement + window) never moves back (RFC 9293 §3.8.6: a
/// receiver must not shrink the window), so a share that shrinks takes
/// effect as the peer fills what it was offered.
#[derive(Debug, Default)]
pub(crate) struct WindowShare {
    /// Receive frames to share; 0: windows are not cut.
    frames: usize,
    /// Payload bytes per frame (the local MSS).
    mss: usize,
    /// The current period (milliseconds / [`SHARE_PERIOD_MS`]).
    period: Cell<u64>,
    /// Connections that received data in the current period and the one
    /// before it.
    now_count: Cell<usize>,
    before_count: Cell<usize>,
    /// Bytes the connections' windows hold open together (as last
    /// advertised).
    open: Cell<usize>,
}

impl WindowShare {
    pub(crate) fn new(frames: usize, mss: usize) -> Self {
        Self {
            frames,
            mss: mss.max(1),
            ..Self::default()
        }
    }

    /// Move the period forward to `now`.
    pub(crate) fn tick(&self, now: Instant) {
        let p = (now.total_millis().max(0) / SHARE_PERIOD_MS) as u64;
        let cur = self.period.get();
        if p == cur {
            return;
        }
        let before = if p == cur + 1 {
            self.now_count.get()
        } else {
            0
        };
        self.before_count.set(before);
        self.now_count.set(0);
        self.period.set(p);
    }

    /// A connection last seen receiving in `period` received data.
    fn receiving(&self, period: &mut u64) {
        let cur = self.period.get();
        if *period != cur {
            *period = cur;
            self.now_count.set(self.now_count.get() + 1);
        }
    }

    /// Whether windows are cut at all.
    pub(crate) fn cuts(&self) -> bool {
        self.frames > 0
    }

    /// Bytes one receiving connection may be offered: its fair part.
    fn bytes(&self) -> Option<usize> {
        if self.frames == 0 {
            return None;
        }
        let receiving = (self.now_count.get() + self.before_count.get()).max(1);
        Some((self.frames * self.mss / receiving).max(self.mss))
    }

    /// Bytes a connection whose window holds `mine` open may be offered:
    /// its fair part, within what the others leave, in whole segments, at
    /// least one. A part of a segment would only make the peer send a
    /// short segment to fill it (a frame for half the bytes), which is
    /// the small window increment RFC 9293 §3.8.6.2.2 has the receiver
    /// avoid.
    fn offer(&self, mine: usize) -> Option<usize> {
        let fair = self.bytes()?;
        let others = self.open.get().saturating_sub(mine);
        let left = (self.frames * self.mss).saturating_sub(others);
        Some((fair.min(left) / self.mss * self.mss).max(self.mss))
    }

    /// A connection's open window went from `old` to `new` bytes.
    fn reopen(&self, old: usize, new: usize) {
        self.open
            .set(self.open.get().saturating_sub(old).saturating_add(new));
    }
}

/// The window field a segment of ours should carry instead of `field`
/// (scaled by `shift`), acknowledging `ack`: at most `share` bytes, but
/// never less than what reaches the right edge advertised before
/// (`edge`). `None`: keep the field.
fn cut_window(field: u16, shift: u8, ack: u32, edge: Option<u32>, share: usize) -> Option<u16> {
    let offered = usize::from(field) << shift;
    let keep = edge
        .map(|e| e.wrapping_sub(ack) as i32)
        .filter(|&d| d > 0)
        .map_or(0, |d| d as usize);
    let want = share.max(keep);
    if want >= offered {
        return None;
    }
    // Round up: the edge must not move back by a fraction of a unit.
    let unit = 1usize << shift;
    let cut = want.div_ceil(unit);
    u16::try_from(cut).ok().filter(|&c| c < field)
}

/// What each connection has sent: (remote address, remote port, local
/// port) → [`Sent`], kept from the SYN (or SYN-ACK) on. Shared by the
/// transmit tokens (segments we send) and the receive tokens
/// (acknowledgements), hence the `RefCell`.
#[derive(Debug, Default)]
pub(crate) struct SentTable {
    entries: RefCell<HashMap<Flow, Sent, FlowHash>>,
    /// The sockets run smoltcp's Reno: mirror its congestion window.
    pub mirror_reno: bool,
    /// The receive frames the connections' windows share.
    pub share: WindowShare,
}

/// How a segment we send is changed on its way out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Rewrite {
    /// A stale bare acknowledgement's sequence number ([`renumber_ack`]).
    seq: Option<u32>,
    /// The window field cut to the connection's share.
    window: Option<u16>,
}

impl Rewrite {
    fn any(&self) -> bool {
        self.seq.is_some() || self.window.is_some()
    }
}

impl SentTable {
    pub(crate) fn get(&self, flow: Flow) -> Option<Sent> {
        self.entries.borrow().get(&flow).copied()
    }

    /// The connection is established: the peer's SYN told its MSS option
    /// and window shift.
    pub(crate) fn set_peer(&self, flow: Flow, syn: SynOptions) {
        if let Some(s) = self.entries.borrow_mut().get_mut(&flow) {
            s.window_shift = syn.window_shift();
            s.our_shift = match syn.window_scale {
                Some(_) => s.our_scale.unwrap_or(0).min(14),
                None => 0,
            };
            if let Some(r) = &mut s.reno {
                r.on_peer_syn(syn.mss);
            }
        }
    }

    fn forget(&self, flow: Flow) {
        if let Some(s) = self.entries.borrow_mut().remove(&flow) {
            self.share.reopen(s.rx_open, 0);
        }
    }

    /// Look at one frame we send. A SYN starts (or, sent again, restarts)
    /// its connection's entry; a data segment moves `next` forward (a
    /// retransmission does not); every segment of a followed connection
    /// goes to the congestion window's mirror. Returns how the segment is
    /// to be changed: the sequence number a stale bare acknowledgement
    /// should carry instead of its own (see [`renumber_ack`]) and the
    /// window field cut to the connection's share ([`WindowShare`]).
    fn observe_sent(&self, seg: &Segment<'_>) -> Rewrite {
        let (key, tcp) = (seg.flow, &seg.tcp);
        let seq = tcp.seq_number().0 as u32;
        let mut entries = self.entries.borrow_mut();
        if tcp.syn() {
            let start = seq.wrapping_add(1);
            if entries.len() < SENT_TABLE_CAP || entries.contains_key(&key) {
                let sent = Sent {
                    start,
                    next: start,
                    una: start,
                    window: None,
                    window_shift: 0,
                    our_scale: tcp.options_summary().ok().and_then(|o| o.window_scale),
                    our_shift: 0,
                    reno: self.mirror_reno.then(Reno::default),
                    rx_edge: None,
                    rx_period: u64::MAX,
                    rx_open: 0,
                };
                // A SYN sent again restarts the entry: what the old one
                // held open is no longer counted.
                if let Some(old) = entries.insert(key, sent) {
                    self.share.reopen(old.rx_open, 0);
                }
            }
            return Rewrite::default();
        }
        let len = tcp.payload().len() as u32;
        let Some(s) = entries.get_mut(&key) else {
            return Rewrite::default();
        };
        let mut out = Rewrite::default();
        if tcp.ack() && !tcp.rst() {
            let ack = tcp.ack_number().0 as u32;
            let field = tcp.window_len();
            if let Some(offer) = self.share.offer(s.rx_open) {
                out.window = cut_window(field, s.our_shift, ack, s.rx_edge, offer);
            }
            let open = usize::from(out.window.unwrap_or(field)) << s.our_shift;
            s.rx_edge = Some(ack.wrapping_add(open as u32));
            self.share.reopen(s.rx_open, open);
            s.rx_open = open;
        }
        if let Some(r) = &mut s.reno {
            let seg = cwnd::Sent {
                seq,
                len,
                ack_window: tcp.ack().then(|| {
                    let window = u32::from(tcp.window_len()) << s.our_shift;
                    (tcp.ack_number().0 as u32, window)
                }),
            };
            r.on_sent(seg, s.una, s.next);
        }
        if len == 0 {
            out.seq = renumber_ack(tcp, s);
            return out;
        }
        let end = seq.wrapping_add(len);
        if (end.wrapping_sub(s.next) as i32) > 0 {
            s.next = end;
        }
        out
    }

    /// Look at one frame we receive: an acknowledgement of a followed
    /// connection that lies between what was acknowledged and what was
    /// sent moves `una` and takes the segment's window. The checksum is
    /// not verified (the stack drops a corrupt segment later): a wrong
    /// window only costs alignment until the next acknowledgement. The
    /// congestion window's mirror takes every acknowledgement, a segment
    /// without data only with a good checksum (a corrupt one could count
    /// as a duplicate acknowledgement).
    fn observe_received(&self, seg: &Segment<'_>) {
        let (key, tcp) = (seg.flow, &seg.tcp);
        if !tcp.ack() || tcp.rst() {
            return;
        }
        let mut entries = self.entries.borrow_mut();
        let Some(s) = entries.get_mut(&key) else {
            return;
        };
        let ack = tcp.ack_number().0 as u32;
        if !tcp.payload().is_empty() {
            self.share.receiving(&mut s.rx_period);
        }
        if let Some(r) = &mut s.reno {
            let len = tcp.payload().len() as u32;
            if len > 0 || tcp.verify_checksum(&IpAddress::Ipv4(seg.src), &IpAddress::Ipv4(seg.dst))
            {
                // smoltcp scales every window but a SYN's.
                let shift = if tcp.syn() { 0 } else { s.window_shift };
                let seg = Received {
                    seq: tcp.seq_number().0 as u32,
                    len,
                    ack,
                    window: usize::from(tcp.window_len()) << shift,
                };
                r.on_received(seg, s.una, s.next);
            }
        }
        // A SYN's window is never scaled: leave it for the next segment.
        if tcp.syn() {
            return;
        }
        if ack.wrapping_sub(s.una) <= s.next.wrapping_sub(s.una) {
            s.una = ack;
            s.window = Some(tcp.window_len());
        }
    }
}

/// The sequence number a bare acknowledgement of ours (`tcp`, with no
/// data) should carry instead of its own, if any; `s` is its connection's.
///
/// After a retransmission timeout smoltcp rewinds its send sequence to the
/// oldest unacknowledged byte and resends from there, and its bare
/// acknowledgements carry that rewound number meanwhile. A peer that
/// received more drops them as lying before its receive window (RFC 9293
/// §3.10.7.4; Linux and smoltcp both do), acknowledgement included. When
/// both ends are in timeout recovery at once, each drops the other's
/// acknowledgements and resends forever. A bare acknowledgement is sent
/// with the highest sequence number sent instead, as RFC 9293 asks
/// (SND.NXT) and Linux does; not while the peer's window is closed (a
/// zero-window probe's byte may not have been taken).
fn renumber_ack(tcp: &TcpPacket<&[u8]>, s: &Sent) -> Option<u32> {
    if !tcp.ack() || tcp.fin() || tcp.rst() {
        return None;
    }
    let seq = tcp.seq_number().0 as u32;
    let behind = (s.next.wrapping_sub(seq) as i32) > 0;
    (behind && s.window != Some(0)).then_some(s.next)
}

/// A TCP/IPv4 segment in an Ethernet frame the device sends or receives.
struct Segment<'a> {
    /// The connection it belongs to, keyed from our side.
    flow: Flow,
    src: Ipv4Address,
    dst: Ipv4Address,
    tcp: TcpPacket<&'a [u8]>,
}

impl<'a> Segment<'a> {
    /// Parse `frame`, one we send (`outgoing`) or receive; `None` for
    /// anything but an unfragmented TCP/IPv4 segment. Never panics on any
    /// input.
    fn parse(frame: &'a [u8], outgoing: bool) -> Option<Self> {
        let eth = EthernetFrame::new_checked(frame).ok()?;
        if eth.ethertype() != EthernetProtocol::Ipv4 {
            return None;
        }
        let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
        if ip.next_header() != IpProtocol::Tcp || ip.more_frags() || ip.frag_offset() != 0 {
            return None;
        }
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        let ip_start = EthernetFrame::<&[u8]>::header_len();
        let tcp_bytes = frame
            .get(ip_start + usize::from(ip.header_len())..ip_start + usize::from(ip.total_len()))?;
        let tcp = TcpPacket::new_checked(tcp_bytes).ok()?;
        let flow = if outgoing {
            (dst, tcp.dst_port(), tcp.src_port())
        } else {
            (src, tcp.src_port(), tcp.dst_port())
        };
        Some(Self {
            flow,
            src,
            dst,
            tcp,
        })
    }
}

/// The wrapper device. See the module documentation.
#[derive(Debug)]
pub(crate) struct Port<D> {
    pub inner: D,
    pub inject: VecDeque<Vec<u8>>,
    pub mss: MssTable,
    pub sent: SentTable,
    pub counters: PortCounters,
    /// smoltcp fills the TCP checksum of what it sends (the device's
    /// capabilities say so).
    pub tcp_checksum: bool,
}

impl<D> Port<D> {
    pub(crate) fn new(inner: D) -> Self {
        Self {
            tcp_checksum: true,
            inner,
            inject: VecDeque::new(),
            mss: MssTable::default(),
            sent: SentTable::default(),
            counters: PortCounters::default(),
        }
    }

    /// A connection is gone: drop what the tables hold for it.
    pub(crate) fn forget(&mut self, flow: Flow) {
        self.mss.forget(flow);
        self.sent.forget(flow);
    }
}

/// Receive token: a frame from the device, or one the stack injected.
pub(crate) enum PortRx<'a, R> {
    Device {
        token: R,
        mss: &'a mut MssTable,
        sent: &'a SentTable,
        counters: &'a PortCounters,
    },
    Injected(Vec<u8>),
}

impl<R: phy::RxToken> phy::RxToken for PortRx<'_, R> {
    fn consume<T, F>(self, f: F) -> T
    where
        F: FnOnce(&[u8]) -> T,
    {
        match self {
            Self::Device {
                token,
                mss,
                sent,
                counters,
            } => token.consume(|buf| {
                bump(&counters.rx_frames, 1);
                bump(&counters.rx_bytes, buf.len() as u64);
                if let Some(seg) = Segment::parse(buf, false) {
                    mss.observe(&seg);
                    sent.observe_received(&seg);
                }
                f(buf)
            }),
            Self::Injected(frame) => f(&frame),
        }
    }

    fn meta(&self) -> phy::PacketMeta {
        match self {
            Self::Device { token, .. } => token.meta(),
            Self::Injected(_) => phy::PacketMeta::default(),
        }
    }
}

/// Transmit token: counts what goes out, notes what each connection
/// sent and renumbers stale bare acknowledgements
/// ([`renumber_ack`]). An injected frame comes with a token
/// that discards (smoltcp answers no ARP reply, so it stays unused).
pub(crate) enum PortTx<'a, T> {
    Device {
        token: T,
        counters: &'a PortCounters,
        sent: &'a SentTable,
        /// smoltcp fills the TCP checksum (the device does not).
        tcp_checksum: bool,
    },
    Discard,
}

/// Change the TCP segment in `frame` as `how` says, its checksum refilled
/// if smoltcp fills checksums.
fn rewrite(frame: &mut [u8], how: Rewrite, checksum: bool) {
    let ip_start = EthernetFrame::<&[u8]>::header_len();
    let Some(ip_bytes) = frame.get_mut(ip_start..) else {
        return;
    };
    let Ok(mut ip) = Ipv4Packet::new_checked(ip_bytes) else {
        return;
    };
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    let tcp_len = usize::from(ip.total_len()).saturating_sub(usize::from(ip.header_len()));
    let Some(tcp_bytes) = ip.payload_mut().get_mut(..tcp_len) else {
        return;
    };
    let Ok(mut tcp) = TcpPacket::new_checked(tcp_bytes) else {
        return;
    };
    if let Some(seq) = how.seq {
        tcp.set_seq_number(TcpSeqNumber(seq as i32));
    }
    if let Some(window) = how.window {
        tcp.set_window_len(window);
    }
    if checksum {
        tcp.fill_checksum(&IpAddress::Ipv4(src), &IpAddress::Ipv4(dst));
    }
}

impl<T: phy::TxToken> phy::TxToken for PortTx<'_, T> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        match self {
            Self::Device {
                token,
                counters,
                sent,
                tcp_checksum,
            } => {
                bump(&counters.tx_frames, 1);
                bump(&counters.tx_bytes, len as u64);
                token.consume(len, |buf| {
                    let r = f(buf);
                    let how = Segment::parse(buf, true)
                        .map(|seg| sent.observe_sent(&seg))
                        .unwrap_or_default();
                    if how.any() {
                        rewrite(buf, how, tcp_checksum);
                        bump(&counters.acks_renumbered, u64::from(how.seq.is_some()));
                        bump(&counters.windows_cut, u64::from(how.window.is_some()));
                    }
                    r
                })
            }
            Self::Discard => f(&mut vec![0; len]),
        }
    }

    fn set_meta(&mut self, meta: phy::PacketMeta) {
        if let Self::Device { token, .. } = self {
            token.set_meta(meta)
        }
    }
}

impl<D: Device> Device for Port<D> {
    type RxToken<'a>
        = PortRx<'a, D::RxToken<'a>>
    where
        Self: 'a;
    type TxToken<'a>
        = PortTx<'a, D::TxToken<'a>>
    where
        Self: 'a;

    fn receive(&mut self, timestamp: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let counters = &self.counters;
        if let Some(frame) = self.inject.pop_front() {
            return Some((PortRx::Injected(frame), PortTx::Discard));
        }
        let (rx, tx) = self.inner.receive(timestamp)?;
        Some((
            PortRx::Device {
                token: rx,
                mss: &mut self.mss,
                sent: &self.sent,
                counters,
            },
            PortTx::Device {
                token: tx,
                counters,
                sent: &self.sent,
                tcp_checksum: self.tcp_checksum,
            },
        ))
    }

    fn transmit(&mut self, timestamp: Instant) -> Option<Self::TxToken<'_>> {
        let (counters, sent, tcp_checksum) = (&self.counters, &self.sent, self.tcp_checksum);
        self.inner.transmit(timestamp).map(|token| PortTx::Device {
            token,
            counters,
            sent,
            tcp_checksum,
        })
    }

    /// The device's, with the MTU cut so that the TCP MSS is a multiple
    /// of 4 (at most 3 bytes less). An FPDU is a multiple of 4 long, so
    /// only then does a full FPDU fill a full segment, and a writer that
    /// keeps FPDUs inside segments can queue several full ones at once:
    /// smoltcp cuts exactly between them.
    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = self.inner.capabilities();
        if caps.medium == phy::Medium::Ethernet {
            caps.max_transmission_unit -= tcp_mss(caps.max_transmission_unit) % 4;
        }
        caps
    }
}

/// The TCP MSS of an Ethernet `mtu`: the frame without Ethernet, IPv4 and
/// TCP headers (no options).
pub(crate) fn tcp_mss(mtu: usize) -> usize {
    mtu.saturating_sub(EthernetFrame::<&[u8]>::header_len() + IPV4_HEADER_LEN + TCP_HEADER_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::phy::ChecksumCapabilities;
    use smoltcp::wire::{
        EthernetAddress, EthernetRepr, IpAddress, Ipv4Repr, TcpControl, TcpRepr, TcpSeqNumber,
    };

    fn rx_mss(t: &mut MssTable, frame: &[u8]) {
        if let Some(seg) = Segment::parse(frame, false) {
            t.observe(&seg);
        }
    }

    fn tx(t: &SentTable, frame: &[u8]) {
        if let Some(seg) = Segment::parse(frame, true) {
            t.observe_sent(&seg);
        }
    }

    fn rx(t: &SentTable, frame: &[u8]) {
        if let Some(seg) = Segment::parse(frame, false) {
            t.observe_received(&seg);
        }
    }

    const PEER: Ipv4Address = Ipv4Address::new(198, 18, 0, 1);
    const US: Ipv4Address = Ipv4Address::new(198, 18, 0, 2);

    fn syn(mss: Option<u16>, corrupt: bool) -> Vec<u8> {
        let tcp = TcpRepr {
            src_port: 40000,
            dst_port: 7174,
            control: TcpControl::Syn,
            seq_number: TcpSeqNumber(1),
            ack_number: None,
            window_len: 1000,
            window_scale: Some(3),
            max_seg_size: mss,
            sack_permitted: true,
            sack_ranges: [None; 3],
            timestamp: None,
            payload: &[],
        };
        frame(PEER, US, &tcp, corrupt)
    }

    /// A segment of the connection PEER:40000 ↔ US:7174; `outgoing`: ours.
    fn segment(
        outgoing: bool,
        syn: bool,
        seq: u32,
        ack: Option<u32>,
        window: u16,
        payload: &[u8],
    ) -> Vec<u8> {
        let (sp, dp) = if outgoing {
            (7174, 40000)
        } else {
            (40000, 7174)
        };
        let tcp = TcpRepr {
            src_port: sp,
            dst_port: dp,
            control: if syn {
                TcpControl::Syn
            } else {
                TcpControl::None
            },
            seq_number: TcpSeqNumber(seq as i32),
            ack_number: ack.map(|a| TcpSeqNumber(a as i32)),
            window_len: window,
            window_scale: None,
            max_seg_size: None,
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload,
        };
        let (src, dst) = if outgoing { (US, PEER) } else { (PEER, US) };
        frame(src, dst, &tcp, false)
    }

    fn frame(src: Ipv4Address, dst: Ipv4Address, tcp: &TcpRepr<'_>, corrupt: bool) -> Vec<u8> {
        let ip = Ipv4Repr {
            src_addr: src,
            dst_addr: dst,
            next_header: IpProtocol::Tcp,
            payload_len: tcp.buffer_len(),
            hop_limit: 64,
        };
        let eth = EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ethertype: EthernetProtocol::Ipv4,
        };
        let mut buf = vec![0xa5; eth.buffer_len() + ip.buffer_len() + tcp.buffer_len()];
        let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
        eth.emit(&mut f);
        let caps = ChecksumCapabilities::default();
        let mut p = Ipv4Packet::new_unchecked(f.payload_mut());
        ip.emit(&mut p, &caps);
        let mut t = TcpPacket::new_unchecked(p.payload_mut());
        tcp.emit(&mut t, &IpAddress::Ipv4(src), &IpAddress::Ipv4(dst), &caps);
        if corrupt {
            let n = buf.len();
            buf[n - 1] ^= 0x10;
        }
        buf
    }

    /// The MSS the table holds for PEER:40000 → 7174.
    fn mss_of(t: &MssTable) -> Option<u16> {
        t.get((PEER, 40000, 7174)).and_then(|o| o.mss)
    }

    #[test]
    fn snoops_mss_of_valid_syns_only() {
        let mut t = MssTable::default();
        rx_mss(&mut t, &syn(Some(1400), false));
        assert_eq!(mss_of(&t), Some(1400));
        rx_mss(&mut t, &syn(Some(500), true));
        assert_eq!(mss_of(&t), Some(1400), "bad checksum ignored");
        rx_mss(&mut t, &syn(None, false));
        assert_eq!(mss_of(&t), Some(1400));
        t.forget((PEER, 40000, 7174));
        assert_eq!(mss_of(&t), None);
    }

    #[test]
    fn follows_what_a_connection_sent_and_the_peer_acknowledged() {
        let t = SentTable::default();
        let isn = u32::MAX - 100; // the sequence space wraps below
        assert_eq!(t.get((PEER, 40000, 7174)), None);
        // Data before a SYN (a connection not followed) is ignored.
        tx(&t, &segment(true, false, 5, Some(1), 100, &[0; 10]));
        assert_eq!(t.get((PEER, 40000, 7174)), None);
        tx(&t, &segment(true, true, isn, Some(1), 100, &[]));
        let start = isn.wrapping_add(1);
        let s = t.get((PEER, 40000, 7174)).unwrap();
        assert_eq!(
            (s.start, s.next, s.una, s.window),
            (start, start, start, None)
        );
        tx(&t, &segment(true, false, start, Some(1), 100, &[0; 300]));
        tx(
            &t,
            &segment(
                true,
                false,
                start.wrapping_add(300),
                Some(1),
                100,
                &[0; 200],
            ),
        );
        // A retransmission does not move `next`.
        tx(&t, &segment(true, false, start, Some(1), 100, &[0; 300]));
        let s = t.get((PEER, 40000, 7174)).unwrap();
        assert_eq!((s.bytes(), s.in_flight()), (500, 500));
        // Acknowledgements: in range they count, beyond what was sent not.
        rx(
            &t,
            &segment(false, false, 1, Some(start.wrapping_add(300)), 77, &[]),
        );
        rx(
            &t,
            &segment(false, false, 1, Some(start.wrapping_add(501)), 99, &[]),
        );
        let s = t.get((PEER, 40000, 7174)).unwrap();
        assert_eq!((s.in_flight(), s.window), (200, Some(77)));
        // An old acknowledgement (reordered) does not move it back.
        rx(
            &t,
            &segment(false, false, 1, Some(start.wrapping_add(100)), 5, &[]),
        );
        assert_eq!(t.get((PEER, 40000, 7174)).unwrap().window, Some(77));
        rx(
            &t,
            &segment(false, false, 1, Some(start.wrapping_add(500)), 88, &[]),
        );
        let s = t.get((PEER, 40000, 7174)).unwrap();
        assert_eq!((s.in_flight(), s.window), (0, Some(88)));
        t.forget((PEER, 40000, 7174));
        assert_eq!(t.get((PEER, 40000, 7174)), None);
    }

    #[test]
    fn window_shift_from_the_peers_syn() {
        let mut t = MssTable::default();
        let shift = |t: &MssTable| t.get((PEER, 40000, 7174)).map_or(0, |o| o.window_shift());
        assert_eq!(shift(&t), 0);
        rx_mss(&mut t, &syn(Some(1400), false));
        assert_eq!(shift(&t), 3);
        assert_eq!(mss_of(&t), Some(1400));
    }

    #[test]
    fn a_cut_window_never_moves_the_right_edge_back() {
        // No earlier edge: cut to the share, rounded up to the unit.
        assert_eq!(cut_window(1000, 3, 0, None, 4000), Some(500));
        assert_eq!(cut_window(1000, 3, 0, None, 4001), Some(501));
        // The share is as large as smoltcp's window, or larger: untouched.
        assert_eq!(cut_window(500, 3, 0, None, 4000), None);
        assert_eq!(cut_window(500, 3, 0, None, 1 << 20), None);
        // An edge offered before is kept: 6000 bytes beyond ack 100.
        assert_eq!(cut_window(1000, 3, 100, Some(6100), 2000), Some(750));
        // ... across the sequence number wrap.
        let ack = u32::MAX - 99;
        assert_eq!(cut_window(1000, 3, ack, Some(5900), 2000), Some(750));
        // An edge behind the acknowledgement keeps nothing.
        assert_eq!(cut_window(1000, 0, 5000, Some(100), 300), Some(300));
        // Unscaled, and a closed window stays closed.
        assert_eq!(cut_window(60000, 0, 0, None, 1448), Some(1448));
        assert_eq!(cut_window(0, 3, 0, None, 1448), None);
    }

    #[test]
    fn receiving_connections_share_the_frames() {
        let share = WindowShare::new(100, 1000);
        share.tick(Instant::from_millis(0));
        // Nobody receiving yet: one connection could take it all.
        assert_eq!(share.bytes(), Some(100_000));
        let mut periods = [u64::MAX; 4];
        for p in &mut periods {
            share.receiving(p);
            // Counted once per period.
            share.receiving(p);
        }
        assert_eq!(share.bytes(), Some(25_000));
        // The next period still counts the last one's.
        share.tick(Instant::from_millis(SHARE_PERIOD_MS));
        share.receiving(&mut periods[0]);
        assert_eq!(share.bytes(), Some(20_000));
        // Two periods later only the connection still receiving counts.
        share.tick(Instant::from_millis(2 * SHARE_PERIOD_MS));
        assert_eq!(share.bytes(), Some(100_000));
        // Never less than one segment.
        let share = WindowShare::new(2, 1000);
        let mut periods = [u64::MAX; 10];
        for p in &mut periods {
            share.receiving(p);
        }
        assert_eq!(share.bytes(), Some(1000));
        // No frames to share: windows are left alone.
        assert_eq!(WindowShare::default().bytes(), None);
    }

    #[test]
    fn windows_open_together_stay_within_the_frames() {
        let share = WindowShare::new(10, 1000);
        share.tick(Instant::from_millis(0));
        // One connection holds 8000 open: another is offered the rest.
        share.reopen(0, 8000);
        assert_eq!(share.offer(0), Some(2000));
        // The first one itself may have its whole fair part again.
        assert_eq!(share.offer(8000), Some(10_000));
        // Nothing left: one MSS all the same, so no window closes.
        share.reopen(0, 2000);
        assert_eq!(share.offer(0), Some(1000));
        // A connection gone gives its part back.
        share.reopen(8000, 0);
        assert_eq!(share.offer(0), Some(8000));
        // Whole segments: of 2500 left, two.
        share.reopen(2000, 7500);
        assert_eq!(share.offer(0), Some(2000));
        // A fair part of one and a half segments: one.
        let share = WindowShare::new(3, 1000);
        let mut periods = [u64::MAX; 2];
        for p in &mut periods {
            share.receiving(p);
        }
        assert_eq!(share.bytes(), Some(1500));
        assert_eq!(share.offer(0), Some(1000));
    }

    #[test]
    fn segments_of_a_connection_carry_its_share() {
        let t = SentTable {
            share: WindowShare::new(4, 1000),
            ..SentTable::default()
        };
        // Established, unscaled (the SYNs carry no window scale).
        tx(&t, &segment(true, true, 999, Some(1), 60000, &[]));
        let window_of = |f: &[u8]| {
            let mut f = f.to_vec();
            let how = t.observe_sent(&Segment::parse(&f, true).unwrap());
            rewrite(&mut f, how, true);
            let seg = Segment::parse(&f, true).unwrap();
            assert!(seg
                .tcp
                .verify_checksum(&IpAddress::Ipv4(US), &IpAddress::Ipv4(PEER)));
            seg.tcp.window_len()
        };
        // One receiving connection: all four frames.
        rx(&t, &segment(false, false, 1, Some(1000), 100, &[1; 10]));
        assert_eq!(
            window_of(&segment(true, false, 1000, Some(11), 60000, &[])),
            4000
        );
        // smoltcp's own window is smaller: it stands.
        assert_eq!(
            window_of(&segment(true, false, 1000, Some(11), 3000, &[])),
            3000
        );
        // Three more connections receive: a quarter, but the edge offered
        // before (11 + 3000) holds until the peer reaches it.
        for port in [40001u16, 40002, 40003] {
            let mut f = segment(true, true, 999, Some(1), 60000, &[]);
            f[36..38].copy_from_slice(&port.to_be_bytes());
            tx(&t, &f);
            let mut f = segment(false, false, 1, Some(1000), 100, &[1; 10]);
            f[34..36].copy_from_slice(&port.to_be_bytes());
            rx(&t, &f);
        }
        assert_eq!(
            window_of(&segment(true, false, 1000, Some(1011), 60000, &[])),
            2000
        );
        assert_eq!(
            window_of(&segment(true, false, 1000, Some(3011), 60000, &[])),
            1000
        );
        // A SYN sent again restarts the connection: its open window is
        // no longer counted.
        assert_eq!(t.share.open.get(), 1000);
        tx(&t, &segment(true, true, 999, Some(1), 60000, &[]));
        assert_eq!(t.share.open.get(), 0);
    }

    #[test]
    fn a_stale_bare_acknowledgement_gets_the_highest_sequence_number_sent() {
        let t = SentTable::default();
        let renumber_to = |frame: &[u8]| t.observe_sent(&Segment::parse(frame, true).unwrap()).seq;
        tx(&t, &segment(true, true, 999, Some(1), 100, &[]));
        tx(&t, &segment(true, false, 1000, Some(1), 100, &[0; 500]));
        // Rewound after a timeout: the resending has got to 1200.
        let mut ack = segment(true, false, 1200, Some(1), 100, &[]);
        assert_eq!(renumber_to(&ack), Some(1500));
        rewrite(
            &mut ack,
            Rewrite {
                seq: Some(1500),
                window: None,
            },
            true,
        );
        let seg = Segment::parse(&ack, true).unwrap();
        assert_eq!(seg.tcp.seq_number(), TcpSeqNumber(1500));
        assert!(seg
            .tcp
            .verify_checksum(&IpAddress::Ipv4(US), &IpAddress::Ipv4(PEER)));
        // Up to date, or carrying data: left alone.
        assert_eq!(
            renumber_to(&segment(true, false, 1500, Some(1), 100, &[])),
            None
        );
        assert_eq!(
            renumber_to(&segment(true, false, 1200, Some(1), 100, &[0; 100])),
            None
        );
        // Not while the peer's window is closed: a zero-window probe's byte
        // may not have been taken.
        rx(&t, &segment(false, false, 1, Some(1200), 0, &[]));
        assert_eq!(
            renumber_to(&segment(true, false, 1200, Some(1), 100, &[])),
            None
        );
        rx(&t, &segment(false, false, 1, Some(1200), 50, &[]));
        assert_eq!(
            renumber_to(&segment(true, false, 1200, Some(1), 100, &[])),
            Some(1500)
        );
    }

    #[test]
    fn never_panics_on_garbage() {
        let mut t = MssTable::default();
        let sent = SentTable::default();
        tx(&sent, &segment(true, true, 1, None, 100, &[]));
        let good = syn(Some(1400), false);
        let data = segment(false, false, 1, Some(2), 100, &[1; 40]);
        for cut in 0..good.len() {
            rx_mss(&mut t, &good[..cut]);
        }
        for cut in 0..data.len() {
            tx(&sent, &data[..cut]);
            rx(&sent, &data[..cut]);
        }
        let mut x = 0x1234_5678u32;
        for len in 0..200 {
            let junk: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            rx_mss(&mut t, &junk);
            tx(&sent, &junk);
            rx(&sent, &junk);
        }
    }

    /// Any sequence of segments of a followed connection, however wild
    /// their numbers, windows and MSS: the congestion window's mirror
    /// and the renumbering never panic (overflow checks on in tests), and
    /// the window stays between an MSS and the largest peer window.
    #[test]
    fn the_mirror_never_panics_on_any_segments() {
        let mut x = 0x9e37_79b9u32;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for round in 0..50 {
            let sent = SentTable {
                mirror_reno: true,
                ..SentTable::default()
            };
            let isn = next();
            tx(&sent, &segment(true, true, isn, Some(1), 100, &[]));
            let mss = [0, 1, 48, 536, 1460, u16::MAX][round % 6];
            let syn = SynOptions {
                mss: Some(mss),
                window_scale: Some((next() % 16) as u8),
            };
            sent.set_peer((PEER, 40000, 7174), syn);
            let near = |r: u32, base: u32| match r % 4 {
                0 => base.wrapping_add(r % 3000),
                1 => base.wrapping_sub(r % 3000),
                _ => r,
            };
            for _ in 0..2000 {
                let r = next();
                let (outgoing, syn) = (r & 1 == 0, r & 0x30 == 0x30);
                let payload = vec![0u8; (next() % 1500) as usize * usize::from(r & 2 == 0)];
                let seq = near(next(), isn);
                let ack = (r & 4 == 0).then(|| near(next(), isn));
                let window = [0, 1, next() as u16][(next() % 3) as usize];
                let mut frame = segment(outgoing, syn, seq, ack, window, &payload);
                if outgoing {
                    let seg = Segment::parse(&frame, true).unwrap();
                    let how = sent.observe_sent(&seg);
                    if how.any() {
                        rewrite(&mut frame, how, true);
                    }
                } else {
                    rx(&sent, &frame);
                }
                let s = sent.get((PEER, 40000, 7174)).unwrap();
                let w = s.congestion_window().unwrap();
                assert!((48..=1 << 30).contains(&w), "{w}");
            }
        }
    }
}
