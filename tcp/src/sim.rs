//! An in-memory Ethernet link between two [`Stack`]s, for tests and
//! demos: deterministic, seeded faults, and pcap output.
//!
//! Each stack runs on a [`SimPort`], a `phy::Device` made of two frame
//! queues. [`Sim`] owns both stacks and the two directions of the wire
//! ("lanes"). A frame a stack transmits goes through the fault injector
//! (drop, duplicate, reorder by extra delay, bit flip in the TCP payload
//! with or without fixing the TCP checksum), is serialised at the link
//! rate, and arrives after the latency. Nothing reads a clock: the
//! simulated time jumps to the next stack deadline or link arrival when
//! nothing else can happen ([`Sim::run`]). The same seed gives the same
//! run, frame for frame.
//!
//! ```
//! use iwarp_tcp::sim::{LinkConfig, Sim, Step};
//! use iwarp_tcp::Config;
//! let mut sim = Sim::new(Config::default(), Config::default(), LinkConfig::default());
//! sim.b.listen(7174).unwrap();
//! let a = sim.a.connect((Sim::IP_B, 7174), 40000).unwrap();
//! let limit = sim.now + smoltcp::time::Duration::from_secs(1);
//! let mut b = None;
//! sim.run(limit, |s| {
//!     b = b.or_else(|| s.b.accept(7174));
//!     if b.is_some() { Step::Done } else { Step::Idle }
//! })
//! .unwrap();
//! assert!(sim.a.is_established(a));
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io::Write;

use smoltcp::phy::{
    self, Checksum, ChecksumCapabilities, Device, DeviceCapabilities, Medium, PcapLinkType,
    PcapSink,
};
use smoltcp::time::{Duration, Instant};
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, IpAddress, IpProtocol, Ipv4Address,
    Ipv4Packet, TcpPacket,
};

use crate::{Config, Stack};

/// A `phy::Device` made of a receive queue and a transmit queue that the
/// owner fills and drains.
#[derive(Debug)]
pub struct SimPort {
    /// Frames waiting to be received by the stack.
    pub rx: VecDeque<Vec<u8>>,
    /// Frames the stack transmitted.
    pub tx: VecDeque<Vec<u8>>,
    mtu: usize,
    tx_limit: usize,
}

impl SimPort {
    /// A port with Ethernet frames of at most `mtu` bytes (header
    /// included, as smoltcp counts it: 1514 for a 1500-byte IP MTU).
    pub fn new(mtu: usize) -> Self {
        Self {
            rx: VecDeque::new(),
            tx: VecDeque::new(),
            mtu,
            tx_limit: 4096,
        }
    }

    /// How many sent frames the port holds at most (4096 by default):
    /// past that it has no frame for the stack to send into until the
    /// owner drains `tx` (as [`Sim`] does after each poll).
    pub fn set_tx_limit(&mut self, frames: usize) {
        self.tx_limit = frames;
    }
}

/// Receive token of a [`SimPort`].
#[derive(Debug)]
pub struct SimRx(Vec<u8>);

/// Transmit token of a [`SimPort`].
#[derive(Debug)]
pub struct SimTx<'a>(&'a mut VecDeque<Vec<u8>>);

impl phy::RxToken for SimRx {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        f(&self.0)
    }
}

impl phy::TxToken for SimTx<'_> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        let mut buf = vec![0; len];
        let r = f(&mut buf);
        self.0.push_back(buf);
        r
    }
}

impl Device for SimPort {
    type RxToken<'a> = SimRx;
    type TxToken<'a> = SimTx<'a>;

    fn receive(&mut self, _timestamp: Instant) -> Option<(SimRx, SimTx<'_>)> {
        let frame = self.rx.pop_front()?;
        Some((SimRx(frame), SimTx(&mut self.tx)))
    }

    fn transmit(&mut self, _timestamp: Instant) -> Option<SimTx<'_>> {
        (self.tx.len() < self.tx_limit).then_some(SimTx(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.mtu;
        let mut sum = ChecksumCapabilities::default();
        sum.ipv4 = Checksum::Both;
        sum.tcp = Checksum::Both;
        caps.checksum = sum;
        caps
    }
}

/// Seeded faults, each a probability per frame in `0.0..=1.0`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// Drop the frame.
    pub drop: f64,
    /// Deliver it twice.
    pub duplicate: f64,
    /// Hold it back by [`Faults::reorder_delay`] so later frames overtake it.
    pub reorder: f64,
    /// Extra delay of a reordered frame.
    pub reorder_delay: Duration,
    /// Flip one bit of the TCP payload (frames without payload are left
    /// alone).
    pub corrupt: f64,
    /// After a flip, recompute the TCP checksum so that TCP accepts the
    /// damaged bytes (only an upper-layer check such as MPA's CRC32c can
    /// catch it); otherwise the receiver's checksum check drops the frame.
    pub fix_checksum: bool,
}

impl Faults {
    /// Drop `p` of the frames.
    pub fn loss(p: f64) -> Self {
        Self {
            drop: p,
            ..Self::default()
        }
    }

    /// Drop, duplicate and reorder `p` of the frames each, holding a
    /// reordered frame back by 200 µs.
    pub fn mixed(p: f64) -> Self {
        Self {
            drop: p,
            duplicate: p,
            reorder: p,
            reorder_delay: Duration::from_micros(200),
            ..Self::default()
        }
    }
}

/// Where the pcap sees frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capture {
    /// As the stacks sent them, before any fault (every transmission,
    /// retransmissions included, each once).
    Sent,
    /// As they arrive, after the faults (no lost frames, duplicates twice,
    /// reordered, flipped bits).
    Delivered,
    /// As sent, but each byte of a TCP stream only in its first
    /// transmission: retransmissions are left out, and one that also
    /// carries new bytes is trimmed to them (headers and checksums
    /// rewritten). Every stream appears exactly once and in order, which
    /// is what dissectors that reassemble upper-layer PDUs (tshark's MPA)
    /// need; TCP-level loss recovery is not visible in this view.
    FirstTransmission,
}

/// Link settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkConfig {
    /// One-way propagation delay.
    pub latency: Duration,
    /// Bits per second; 0: no serialisation delay.
    pub rate_bps: u64,
    /// Ethernet frame size limit of A's port, and of B's unless
    /// [`LinkConfig::mtu_b`] says otherwise (header included).
    pub mtu: usize,
    /// B's frame size limit, when it differs from A's.
    pub mtu_b: Option<usize>,
    /// Faults, the same both ways.
    pub faults: Faults,
    /// Seed of the fault generator.
    pub seed: u64,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            latency: Duration::from_micros(50),
            rate_bps: 10_000_000_000,
            mtu: 1514,
            mtu_b: None,
            faults: Faults::default(),
            seed: 1,
        }
    }
}

/// What happened on one direction of the link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaneStats {
    /// Frames the sender transmitted.
    pub sent: u64,
    /// Frames delivered to the receiver (duplicates included).
    pub delivered: u64,
    /// Frames dropped.
    pub dropped: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Frames held back.
    pub reordered: u64,
    /// Frames with a flipped bit.
    pub corrupted: u64,
    /// TCP payload bytes sent (retransmissions included).
    pub payload_bytes: u64,
    /// Largest amount of data in flight seen: highest sequence number sent
    /// minus highest acknowledgement number seen coming back, in bytes.
    pub max_in_flight: u64,
}

#[derive(Debug)]
struct Lane {
    queue: BTreeMap<(Instant, u64), Vec<u8>>,
    free_at: Instant,
    stats: LaneStats,
    /// Highest sequence number sent (end of data), once seen.
    snd_max: Option<u32>,
    /// Highest ACK number the other way.
    ack_max: Option<u32>,
    /// End of the sequence space written to a first-transmission capture.
    captured_to: Option<u32>,
}

impl Lane {
    fn new() -> Self {
        Self {
            queue: BTreeMap::new(),
            free_at: Instant::ZERO,
            stats: LaneStats::default(),
            snd_max: None,
            ack_max: None,
            captured_to: None,
        }
    }
}

/// Why [`Sim::run`] stopped without the application being done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimError {
    /// The simulated clock would pass the limit.
    TimeLimit(Instant),
    /// No deadline anywhere and nothing to do: nothing can ever change.
    Stalled(Instant),
    /// Too many rounds without the clock moving.
    Livelock(Instant),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TimeLimit(t) => write!(f, "simulated time limit reached at {t}"),
            Self::Stalled(t) => write!(f, "simulation stalled at {t}"),
            Self::Livelock(t) => write!(f, "livelock at {t}"),
        }
    }
}

impl std::error::Error for SimError {}

/// What the application did in one round of [`Sim::run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Finished: `run` returns.
    Done,
    /// Moved something: run another round at the same time.
    Progress,
    /// Nothing to do until the network changes.
    Idle,
    /// Nothing to do until the network changes or this time.
    IdleUntil(Instant),
}

/// Two stacks joined by a simulated link. See the module documentation.
pub struct Sim {
    /// Stack A (198.18.0.1).
    pub a: Stack<SimPort>,
    /// Stack B (198.18.0.2).
    pub b: Stack<SimPort>,
    /// The simulated clock.
    pub now: Instant,
    link: LinkConfig,
    lanes: [Lane; 2],
    rng: u64,
    seq: u64,
    pcap: Option<(Box<dyn Write>, Capture)>,
    gated: bool,
}

impl fmt::Debug for Sim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sim")
            .field("now", &self.now)
            .field("a_to_b", &self.lanes[0].stats)
            .field("b_to_a", &self.lanes[1].stats)
            .finish_non_exhaustive()
    }
}

impl Sim {
    /// Address of stack A.
    pub const IP_A: Ipv4Address = Ipv4Address::new(198, 18, 0, 1);
    /// Address of stack B.
    pub const IP_B: Ipv4Address = Ipv4Address::new(198, 18, 0, 2);
    /// MAC of stack A.
    pub const MAC_A: EthernetAddress = EthernetAddress([0x02, 0, 0x5e, 0, 0, 1]);
    /// MAC of stack B.
    pub const MAC_B: EthernetAddress = EthernetAddress([0x02, 0, 0x5e, 0, 0, 2]);

    /// Two stacks in 198.18.0.0/24 that know each other as static
    /// neighbours, at time zero.
    pub fn new(a: Config, b: Config, link: LinkConfig) -> Self {
        let now = Instant::ZERO;
        let mut sa = Stack::new(
            SimPort::new(link.mtu),
            Self::MAC_A,
            Self::IP_A,
            24,
            None,
            a,
            now,
        );
        let mut sb = Stack::new(
            SimPort::new(link.mtu_b.unwrap_or(link.mtu)),
            Self::MAC_B,
            Self::IP_B,
            24,
            None,
            b,
            now,
        );
        sa.add_neighbor(Self::IP_B, Self::MAC_B);
        sb.add_neighbor(Self::IP_A, Self::MAC_A);
        Self {
            a: sa,
            b: sb,
            now,
            link,
            lanes: [Lane::new(), Lane::new()],
            rng: link.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            seq: 0,
            pcap: None,
            gated: false,
        }
    }

    /// Poll a stack only when a frame waits for it or
    /// [`Stack::needs_poll`] says so, as the AF_XDP engine does (off: every
    /// round polls both). A stack that stays quiet while it has something
    /// to say then shows up as a stall or a timer-driven recovery.
    pub fn gate_polls(&mut self, on: bool) {
        self.gated = on;
    }

    /// Write every frame into `sink` as a classic pcap (Ethernet), seen
    /// at `at`.
    pub fn capture(&mut self, mut sink: Box<dyn Write>, at: Capture) {
        sink.global_header(PcapLinkType::Ethernet);
        self.pcap = Some((sink, at));
    }

    /// Flush and drop the pcap sink.
    pub fn finish_capture(&mut self) {
        if let Some((mut sink, _)) = self.pcap.take() {
            PcapSink::flush(&mut sink);
        }
    }

    /// Change the faults (for example: a clean handshake, then loss).
    pub fn set_faults(&mut self, faults: Faults) {
        self.link.faults = faults;
    }

    /// Statistics of the A→B direction.
    pub fn a_to_b(&self) -> LaneStats {
        self.lanes[0].stats
    }

    /// Statistics of the B→A direction.
    pub fn b_to_a(&self) -> LaneStats {
        self.lanes[1].stats
    }

    fn next_u64(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// One round at the current time: poll both stacks, put what they
    /// sent on the wire, deliver what is due. Returns whether anything
    /// happened.
    pub fn poll(&mut self) -> bool {
        let now = self.now;
        let gated = self.gated;
        let wants = |s: &Stack<SimPort>| !gated || !s.device().rx.is_empty() || s.needs_poll(now);
        let mut did = false;
        if wants(&self.a) {
            did |= self.a.poll(now);
        }
        if wants(&self.b) {
            did |= self.b.poll(now);
        }
        for dir in 0..2 {
            loop {
                let port = if dir == 0 {
                    self.a.device_mut()
                } else {
                    self.b.device_mut()
                };
                let Some(frame) = port.tx.pop_front() else {
                    break;
                };
                did = true;
                self.send(dir, frame);
            }
        }
        for dir in 0..2 {
            while let Some(entry) = self.lanes[dir].queue.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                let frame = entry.remove();
                did = true;
                self.lanes[dir].stats.delivered += 1;
                self.record(Capture::Delivered, &frame);
                let port = if dir == 0 {
                    self.b.device_mut()
                } else {
                    self.a.device_mut()
                };
                port.rx.push_back(frame);
            }
        }
        did
    }

    fn record_first(&mut self, dir: usize, frame: &[u8]) {
        if !matches!(self.pcap, Some((_, Capture::FirstTransmission))) {
            return;
        }
        let now = self.now;
        let Some(trimmed) = first_transmission(&mut self.lanes[dir].captured_to, frame) else {
            return;
        };
        if let Some((sink, _)) = &mut self.pcap {
            sink.packet(now, trimmed.as_deref().unwrap_or(frame));
        }
    }

    fn record(&mut self, at: Capture, frame: &[u8]) {
        if let Some((sink, want)) = &mut self.pcap {
            if *want == at {
                sink.packet(self.now, frame);
            }
        }
    }

    fn send(&mut self, dir: usize, mut frame: Vec<u8>) {
        self.record(Capture::Sent, &frame);
        self.record_first(dir, &frame);
        self.track(dir, &frame);
        let f = self.link.faults;
        let now = self.now;
        let lane = &mut self.lanes[dir];
        lane.stats.sent += 1;
        // Serialisation: the frame occupies the wire after the previous one.
        let start = lane.free_at.max(now);
        let tx_time = if self.link.rate_bps == 0 {
            Duration::ZERO
        } else {
            Duration::from_micros((frame.len() as u64 * 8 * 1_000_000).div_ceil(self.link.rate_bps))
        };
        lane.free_at = start + tx_time;
        let mut arrive = lane.free_at + self.link.latency;
        if self.chance(f.drop) {
            self.lanes[dir].stats.dropped += 1;
            return;
        }
        if self.chance(f.reorder) {
            self.lanes[dir].stats.reordered += 1;
            arrive += f.reorder_delay;
        }
        if self.chance(f.corrupt) && self.flip(&mut frame, f.fix_checksum) {
            self.lanes[dir].stats.corrupted += 1;
        }
        if self.chance(f.duplicate) {
            self.lanes[dir].stats.duplicated += 1;
            self.seq += 1;
            self.lanes[dir]
                .queue
                .insert((arrive, self.seq), frame.clone());
        }
        self.seq += 1;
        self.lanes[dir].queue.insert((arrive, self.seq), frame);
    }

    /// Flip one bit of the TCP payload. Returns false if there is none.
    fn flip(&mut self, frame: &mut [u8], fix: bool) -> bool {
        let r = self.next_u64();
        let Some((src, dst, tcp_off, payload_off, tcp_len)) = tcp_layout(frame) else {
            return false;
        };
        let payload_len = tcp_len - (payload_off - tcp_off);
        if payload_len == 0 {
            return false;
        }
        let byte = payload_off + (r % payload_len as u64) as usize;
        frame[byte] ^= 1 << ((r >> 32) % 8);
        if fix {
            let mut tcp = TcpPacket::new_unchecked(&mut frame[tcp_off..tcp_off + tcp_len]);
            tcp.fill_checksum(&IpAddress::Ipv4(src), &IpAddress::Ipv4(dst));
        }
        true
    }

    /// Follow sequence and acknowledgement numbers for the in-flight figure.
    fn track(&mut self, dir: usize, frame: &[u8]) {
        let Some((_, _, tcp_off, payload_off, tcp_len)) = tcp_layout(frame) else {
            return;
        };
        let Ok(tcp) = TcpPacket::new_checked(&frame[tcp_off..tcp_off + tcp_len]) else {
            return;
        };
        let payload = (tcp_len - (payload_off - tcp_off)) as u32;
        let lane = &mut self.lanes[dir];
        lane.stats.payload_bytes += u64::from(payload);
        if payload > 0 {
            let end = (tcp.seq_number().0 as u32).wrapping_add(payload);
            lane.snd_max = Some(match lane.snd_max {
                Some(m) if (end.wrapping_sub(m) as i32) <= 0 => m,
                _ => end,
            });
        }
        let ack = tcp.ack().then(|| tcp.ack_number().0 as u32);
        if let Some(ack) = ack {
            let other = &mut self.lanes[1 - dir];
            other.ack_max = Some(match other.ack_max {
                Some(m) if (ack.wrapping_sub(m) as i32) <= 0 => m,
                _ => ack,
            });
        }
        for lane in &mut self.lanes {
            if let (Some(s), Some(a)) = (lane.snd_max, lane.ack_max) {
                let d = s.wrapping_sub(a) as i32;
                if d > 0 {
                    lane.stats.max_in_flight = lane.stats.max_in_flight.max(d as u64);
                }
            }
        }
    }

    /// The earliest time something is due: a stack deadline or an arrival.
    pub fn next_event(&mut self) -> Option<Instant> {
        let now = self.now;
        [
            self.a.poll_at(now),
            self.b.poll_at(now),
            self.lanes[0].queue.keys().next().map(|k| k.0),
            self.lanes[1].queue.keys().next().map(|k| k.0),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Run rounds until `app` says [`Step::Done`], jumping the clock to
    /// the next event whenever neither the application nor the network
    /// can move. `app` runs first in every round, at the current time.
    pub fn run<F>(&mut self, limit: Instant, mut app: F) -> Result<(), SimError>
    where
        F: FnMut(&mut Self) -> Step,
    {
        let mut spins = 0u32;
        loop {
            let step = app(self);
            if step == Step::Done {
                return Ok(());
            }
            let mut progress = step == Step::Progress;
            progress |= self.poll();
            if progress {
                spins += 1;
                if spins > 1_000_000 {
                    return Err(SimError::Livelock(self.now));
                }
                continue;
            }
            spins = 0;
            let mut next = self.next_event();
            if let Step::IdleUntil(t) = step {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
            let Some(next) = next else {
                return Err(SimError::Stalled(self.now));
            };
            // A deadline not after now with nothing to do: smoltcp would
            // only repeat itself; step the clock by its granularity.
            let next = next.max(self.now + Duration::from_micros(1));
            if next > limit {
                return Err(SimError::TimeLimit(self.now));
            }
            self.now = next;
        }
    }
}

/// Where the TCP segment sits in an Ethernet/IPv4 frame:
/// (src, dst, TCP offset, payload offset, TCP length).
fn tcp_layout(frame: &[u8]) -> Option<(Ipv4Address, Ipv4Address, usize, usize, usize)> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    let ip_hdr = usize::from(ip.header_len());
    let tcp_len = usize::from(ip.total_len()).checked_sub(ip_hdr)?;
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    let tcp_off = EthernetFrame::<&[u8]>::header_len() + ip_hdr;
    let payload_off = tcp_off + usize::from(tcp.header_len());
    Some((ip.src_addr(), ip.dst_addr(), tcp_off, payload_off, tcp_len))
}

/// For [`Capture::FirstTransmission`]: `None` to leave the frame out,
/// `Some(None)` to write it as is, `Some(Some(f))` to write the trimmed `f`.
#[allow(clippy::option_option)]
fn first_transmission(captured_to: &mut Option<u32>, frame: &[u8]) -> Option<Option<Vec<u8>>> {
    let Some((src, dst, tcp_off, payload_off, tcp_len)) = tcp_layout(frame) else {
        return Some(None);
    };
    let tcp = TcpPacket::new_checked(&frame[tcp_off..tcp_off + tcp_len]).ok()?;
    let seq = tcp.seq_number().0 as u32;
    let payload = (tcp_len - (payload_off - tcp_off)) as u32;
    if tcp.syn() {
        *captured_to = Some(seq.wrapping_add(1));
        return Some(None);
    }
    let space = payload + u32::from(tcp.fin());
    let Some(to) = *captured_to else {
        return Some(None);
    };
    let end = seq.wrapping_add(space);
    if space == 0 {
        return Some(None); // a pure ACK
    }
    if end.wrapping_sub(to) as i32 <= 0 {
        return None; // nothing new
    }
    *captured_to = Some(end);
    let skip = to.wrapping_sub(seq) as i32;
    if skip <= 0 {
        return Some(None);
    }
    // Trim the first `skip` payload bytes.
    let skip = skip as usize;
    let mut out = Vec::with_capacity(frame.len() - skip);
    out.extend_from_slice(&frame[..payload_off]);
    out.extend_from_slice(frame.get(payload_off + skip..tcp_off + tcp_len)?);
    let ip_off = EthernetFrame::<&[u8]>::header_len();
    let mut ip = Ipv4Packet::new_unchecked(&mut out[ip_off..]);
    ip.set_total_len((tcp_off - ip_off + tcp_len - skip) as u16);
    ip.fill_checksum();
    let mut t = TcpPacket::new_unchecked(&mut out[tcp_off..]);
    t.set_seq_number(smoltcp::wire::TcpSeqNumber(to as i32));
    t.fill_checksum(&IpAddress::Ipv4(src), &IpAddress::Ipv4(dst));
    Some(Some(out))
}
