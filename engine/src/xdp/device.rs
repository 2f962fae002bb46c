//! [`XskDevice`]: a `smoltcp::phy::Device` over the UMEM.
//!
//! A receive token borrows one received frame: smoltcp reads it in place
//! in the UMEM (a multi-buffer frame too: its chunks lie one after the
//! other, see `umem`), and its chunks are recycled (to the fill ring, at
//! the next refill) as soon as the token is consumed. A transmit token
//! takes a free transmit slot, lets smoltcp write the frame straight into
//! it and queues it for the tx ring (submitted by [`Frames::tx_burst`],
//! one descriptor per chunk). No frame is copied between the UMEM and
//! smoltcp's own buffers.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io::{self, BufWriter};
use std::ops::RangeInclusive;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::umem::{rx_bytes, tx_bytes, Frames, Layout, RingCounters, RxFrame};
use super::xsk::Area;
use crossbeam_queue::ArrayQueue;
use iwarp_capture::pcap::PcapWriter;
use iwarp_tcp::smoltcp::phy::{self, Checksum, DeviceCapabilities, Medium};
use iwarp_tcp::smoltcp::time::Instant;
use iwarp_tcp::Stack;

/// Ethernet header length (smoltcp's MTU of an Ethernet device counts it).
pub(crate) const ETH_HEADER: usize = 14;

/// A pcap file (classic format, Ethernet link type) of every frame the
/// device receives or transmits.
#[derive(Debug)]
pub(crate) struct Pcap {
    out: PcapWriter<BufWriter<File>>,
}

impl Pcap {
    pub(crate) fn create(path: &Path) -> io::Result<Self> {
        let out = PcapWriter::new(BufWriter::new(File::create(path)?))?;
        Ok(Self { out })
    }

    fn record(&mut self, ts: Instant, frame: &[u8]) {
        let us = ts.total_micros().max(0) as u64;
        // A failing capture must not disturb the data path.
        let _ = self.out.record(us, frame);
    }

    pub(crate) fn flush(&mut self) {
        let _ = self.out.flush();
    }
}

/// Multi-core: which engine a received TCP segment belongs to, by its
/// destination (local) port.
#[derive(Debug, Default)]
pub(crate) struct Forward {
    /// Ports every engine listens on (their segments stay where the
    /// receive queue put them).
    pub(crate) listening: Vec<u16>,
    /// The other engines' ephemeral port parts, by engine index.
    pub(crate) others: Vec<(usize, RangeInclusive<u16>)>,
    /// Every engine's inbox, by engine index.
    pub(crate) inboxes: Vec<Arc<Inbox>>,
    /// This engine's index.
    pub(crate) me: usize,
    /// The device's passive connections and their engines.
    pub(crate) flows: Arc<Flows>,
    /// The passive connections this engine owns (checked without a lock).
    mine: HashSet<FlowKey>,
    /// Passive connections other engines own, as read from `flows`
    /// (checked without a lock; emptied when `flows` forgets one).
    theirs: HashMap<FlowKey, usize>,
    /// `flows`' generation `theirs` was read at.
    theirs_gen: u64,
}

/// Frames one engine's inbox holds at most; a frame forwarded to a full
/// inbox is dropped (counted), and TCP sends it again.
pub(crate) const INBOX_FRAMES: usize = 512;

/// A received frame copied out of the UMEM it arrived in.
#[derive(Debug)]
pub(crate) struct FrameBuf {
    len: usize,
    data: Box<[u8]>,
}

impl FrameBuf {
    fn bytes(&self) -> &[u8] {
        &self.data[..self.len]
    }
}

/// Frames other engines received for one engine. A fixed set of buffers,
/// allocated once, cycles between `free` and `ready`: a sender takes a
/// free buffer, copies the frame in and queues it; the owner hands it to
/// smoltcp and gives it back. Both queues are lock-free, so forwarding a
/// frame takes neither a lock nor an allocation.
#[derive(Debug)]
pub(crate) struct Inbox {
    ready: ArrayQueue<FrameBuf>,
    free: ArrayQueue<FrameBuf>,
}

impl Inbox {
    /// An inbox of [`INBOX_FRAMES`] buffers of `frame_len` bytes.
    pub(crate) fn new(frame_len: usize) -> Self {
        Self::with_frames(INBOX_FRAMES, frame_len)
    }

    fn with_frames(frames: usize, frame_len: usize) -> Self {
        let free = ArrayQueue::new(frames.max(1));
        for _ in 0..frames.max(1) {
            let b = FrameBuf {
                len: 0,
                data: vec![0; frame_len].into_boxed_slice(),
            };
            // The queue holds exactly `frames`.
            let _ = free.push(b);
        }
        Self {
            ready: ArrayQueue::new(frames.max(1)),
            free,
        }
    }

    /// Copy `frame` in; false (the frame is dropped) when every buffer is
    /// in use or the frame does not fit one.
    fn push(&self, frame: &[u8]) -> bool {
        let Some(mut b) = self.free.pop() else {
            return false;
        };
        if frame.len() > b.data.len() {
            self.give_back(b);
            return false;
        }
        b.data[..frame.len()].copy_from_slice(frame);
        b.len = frame.len();
        // `ready` holds as many as there are buffers: never full.
        match self.ready.push(b) {
            Ok(()) => true,
            Err(b) => {
                self.give_back(b);
                false
            }
        }
    }

    /// Move the queued frames to `out` (the owner's).
    fn drain_into(&self, out: &mut VecDeque<FrameBuf>) -> usize {
        let mut n = 0;
        while let Some(b) = self.ready.pop() {
            out.push_back(b);
            n += 1;
        }
        n
    }

    /// A buffer whose frame was handled is free again.
    fn give_back(&self, b: FrameBuf) {
        // `free` holds as many as there are buffers: never full.
        let _ = self.free.push(b);
    }
}

/// Take a burst off the rx ring (refilling the fill ring) and poll
/// smoltcp, unless nothing was received and nothing is due
/// (`Stack::needs_poll`: most passes of a spinning engine then skip the
/// walk over every socket). Returns the work done.
pub(crate) fn rx_and_poll(stack: &mut Stack<XskDevice>, now: Instant) -> usize {
    let dev = stack.device_mut();
    let mut work = dev.rx_burst();
    if (dev.rx_queued() > 0 || stack.needs_poll(now)) && stack.poll(now) {
        work += 1;
    }
    work
}

fn q_lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A passive connection seen from our side: (remote IPv4 address as a
/// big-endian `u32`, remote port, local port).
pub(crate) type FlowKey = (u32, u16, u16);

/// Most passive connections the shared flow table remembers (a SYN flood
/// must not grow it without bound; beyond it, new connections stay on the
/// queue their SYN arrived on, unprotected against a queue change).
const MAX_FLOWS: usize = 1 << 16;

/// Which engine owns each passive connection of a multi-core device. An
/// engine registers a connection when its SYN arrives (the engine of that
/// queue accepts it); a later segment of it arriving on another queue (a
/// kernel peer re-draws its transmit hash after a retransmission timeout)
/// is handed to the owner instead of reaching the listener there, which
/// would answer with a reset.
#[derive(Debug, Default)]
pub(crate) struct Flows {
    map: Mutex<HashMap<FlowKey, usize>>,
    /// Bumped whenever a connection is forgotten: the engines' copies of
    /// other engines' entries (`Forward::theirs`) are then stale.
    gen: AtomicU64,
}

/// Where a received frame goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dest {
    /// This engine.
    Here,
    /// Another engine (index).
    There(usize),
    /// Every engine (ARP: each smoltcp stack resolves and answers for
    /// itself).
    Everywhere,
}

impl Forward {
    /// Where an Ethernet frame received on this engine's queue goes.
    fn dest(&mut self, frame: &[u8]) -> Dest {
        self.owner(frame).unwrap_or(Dest::Here)
    }

    /// Forget passive connection `key` (released).
    pub(crate) fn forget(&mut self, key: FlowKey) {
        self.mine.remove(&key);
        if self.others.is_empty() {
            return;
        }
        let mut map = q_lock(&self.flows.map);
        if map.get(&key) == Some(&self.me) {
            map.remove(&key);
            self.flows.gen.fetch_add(1, Ordering::Release);
        }
    }

    fn owner(&mut self, frame: &[u8]) -> Option<Dest> {
        if self.others.is_empty() {
            return None;
        }
        match frame.get(12..14)? {
            [0x08, 0x06] => return Some(Dest::Everywhere),
            [0x08, 0x00] => {}
            _ => return None,
        }
        let ip = frame.get(ETH_HEADER..)?;
        let (&vihl, &proto) = (ip.first()?, ip.get(9)?);
        let frag = u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]) & 0x3fff;
        if vihl >> 4 != 4 || proto != 6 || frag != 0 {
            return None;
        }
        let tcp = ip.get(usize::from(vihl & 0x0f) * 4..)?;
        let port = u16::from_be_bytes([*tcp.get(2)?, *tcp.get(3)?]);
        let listening = self.listening.contains(&port);
        if !listening {
            // Outgoing connections: each engine has its own local ports.
            if let Some((j, _)) = self.others.iter().find(|(_, r)| r.contains(&port)) {
                return Some(Dest::There(*j));
            }
        }
        let src = u32::from_be_bytes([*ip.get(12)?, *ip.get(13)?, *ip.get(14)?, *ip.get(15)?]);
        let key = (src, u16::from_be_bytes([*tcp.first()?, *tcp.get(1)?]), port);
        if self.mine.contains(&key) {
            return None;
        }
        let syn_only = tcp.get(13)? & 0x12 == 0x02;
        let gen = self.flows.gen.load(Ordering::Acquire);
        if gen != self.theirs_gen {
            self.theirs.clear();
            self.theirs_gen = gen;
        }
        if let Some(&j) = self.theirs.get(&key) {
            return Some(Dest::There(j));
        }
        let mut map = q_lock(&self.flows.map);
        match map.get(&key) {
            Some(&j) if j != self.me => {
                self.theirs.insert(key, j);
                Some(Dest::There(j))
            }
            Some(_) => {
                self.mine.insert(key);
                None
            }
            None => {
                if listening && syn_only && map.len() < MAX_FLOWS {
                    map.insert(key, self.me);
                    self.mine.insert(key);
                }
                None
            }
        }
    }
}

/// The AF_XDP socket as a smoltcp Ethernet device.
pub(crate) struct XskDevice {
    pub(crate) frames: Frames,
    /// The received burst not yet handed to smoltcp.
    rx: VecDeque<RxFrame>,
    /// IP MTU.
    mtu: usize,
    pcap: Option<RefCell<Pcap>>,
    /// Where a frame goes when no UMEM frame is free (it is dropped).
    scratch: Vec<u8>,
    /// Multi-core: the ports of the other engines.
    pub(crate) forward: Forward,
    /// A frame went to another engine's inbox since the last
    /// [`Self::take_forwarded`].
    forwarded: bool,
    /// Frames other engines received for this one (handed to smoltcp
    /// before the UMEM's; their buffers go back to this engine's inbox).
    inbox: VecDeque<FrameBuf>,
    pub(crate) forwarded_out: u64,
    pub(crate) forwarded_in: u64,
    /// Frames for another engine dropped because its inbox was full.
    pub(crate) forward_dropped: u64,
}

impl Drop for XskDevice {
    /// The received frames not handed to smoltcp go back with the rest
    /// (on a link, to the end that lent them).
    fn drop(&mut self) {
        self.frames.recycle.extend(self.rx.drain(..));
    }
}

impl std::fmt::Debug for XskDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskDevice")
            .field("frames", &self.frames)
            .field("rx", &self.rx.len())
            .field("mtu", &self.mtu)
            .finish_non_exhaustive()
    }
}

impl XskDevice {
    /// `mtu` is the IP MTU; a frame of `mtu` + 14 bytes must fit a UMEM
    /// frame.
    pub(crate) fn new(frames: Frames, mtu: usize, pcap: Option<Pcap>) -> io::Result<Self> {
        if mtu + ETH_HEADER > frames.layout.frame_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "MTU {mtu} does not fit a UMEM frame of {} data bytes",
                    frames.layout.frame_len
                ),
            ));
        }
        Ok(Self {
            frames,
            rx: VecDeque::with_capacity(2 * super::umem::RX_BURST),
            mtu,
            pcap: pcap.map(RefCell::new),
            scratch: Vec::new(),
            forward: Forward::default(),
            forwarded: false,
            inbox: VecDeque::with_capacity(INBOX_FRAMES),
            forwarded_out: 0,
            forwarded_in: 0,
            forward_dropped: 0,
        })
    }

    /// Take a burst from the rx ring; give consumed frames back to the
    /// fill ring. Returns the frames received.
    pub(crate) fn rx_burst(&mut self) -> usize {
        // Frames still queued from an earlier burst (smoltcp's ingress
        // budget) are handed out first.
        let before = self.rx.len();
        let n = if before < super::umem::RX_BURST {
            self.frames.rx_burst(&mut self.rx)
        } else {
            0
        };
        if n > 0 && !self.forward.others.is_empty() {
            self.forward_foreign(before);
        }
        self.frames.refill();
        let fwd = match self.forward.inboxes.get(self.forward.me) {
            Some(i) => i.drain_into(&mut self.inbox),
            None => 0,
        };
        self.forwarded_in += fwd as u64;
        n + fwd
    }

    /// Forget passive connection `key` (released).
    pub(crate) fn forget(&mut self, key: FlowKey) {
        self.forward.forget(key);
    }

    /// Whether frames went to other engines since the last call.
    pub(crate) fn take_forwarded(&mut self) -> bool {
        std::mem::take(&mut self.forwarded)
    }

    /// Copy the frames from `self.rx[from..]` that belong to another
    /// engine into the outbox and recycle their UMEM frames.
    fn forward_foreign(&mut self, from: usize) {
        let mut i = from;
        while i < self.rx.len() {
            let frame = self.rx[i];
            let data = self.frames.bytes(&frame);
            match self.forward.dest(data) {
                Dest::Here => i += 1,
                Dest::There(owner) => {
                    if let Some(inbox) = self.forward.inboxes.get(owner) {
                        if inbox.push(data) {
                            self.forwarded = true;
                            self.forwarded_out += 1;
                        } else {
                            self.forward_dropped += 1;
                        }
                    }
                    if let Some(d) = self.rx.remove(i) {
                        self.frames.recycle.push(d);
                    }
                }
                Dest::Everywhere => {
                    for (j, _) in &self.forward.others {
                        if let Some(inbox) = self.forward.inboxes.get(*j) {
                            if inbox.push(data) {
                                self.forwarded = true;
                            } else {
                                self.forward_dropped += 1;
                            }
                        }
                    }
                    i += 1;
                }
            }
        }
    }

    /// Received frames not yet given to smoltcp.
    pub(crate) fn rx_queued(&self) -> usize {
        self.rx.len() + self.inbox.len()
    }

    /// Submit what smoltcp wrote; recycle what it read.
    pub(crate) fn tx_burst(&mut self) -> usize {
        let n = self.frames.tx_burst();
        self.frames.refill();
        n
    }

    pub(crate) fn counters(&self) -> RingCounters {
        self.frames.counters
    }

    pub(crate) fn flush_capture(&mut self) {
        if let Some(p) = &self.pcap {
            p.borrow_mut().flush();
        }
    }
}

/// Borrows one received frame.
pub(crate) struct XskRx<'a> {
    area: &'a Area,
    gather: &'a [Box<[u8]>],
    frame: Option<RxFrame>,
    /// A frame another engine received for this one, and the inbox its
    /// buffer goes back to.
    owned: Option<(FrameBuf, &'a Inbox)>,
    recycle: &'a mut Vec<RxFrame>,
    pcap: Option<&'a RefCell<Pcap>>,
    ts: Instant,
}

impl phy::RxToken for XskRx<'_> {
    fn consume<R, F>(mut self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        if let Some((frame, home)) = self.owned.take() {
            if let Some(p) = self.pcap {
                p.borrow_mut().record(self.ts, frame.bytes());
            }
            let r = f(frame.bytes());
            home.give_back(frame);
            return r;
        }
        let frame = self.frame.take().expect("consumed once");
        let data = rx_bytes(self.area, self.gather, &frame);
        if let Some(p) = self.pcap {
            p.borrow_mut().record(self.ts, data);
        }
        let r = f(data);
        self.recycle.push(frame);
        r
    }
}

impl Drop for XskRx<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.frame.take() {
            self.recycle.push(d);
        }
        if let Some((frame, home)) = self.owned.take() {
            home.give_back(frame);
        }
    }
}

/// Writes one frame into a free transmit slot.
pub(crate) struct XskTx<'a> {
    area: &'a Area,
    layout: Layout,
    free: &'a mut Vec<u32>,
    pending: &'a mut VecDeque<(u32, u32)>,
    counters: &'a mut RingCounters,
    scratch: &'a mut Vec<u8>,
    pcap: Option<&'a RefCell<Pcap>>,
    ts: Instant,
}

impl phy::TxToken for XskTx<'_> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        if len <= self.layout.frame_len {
            if let Some(slot) = self.free.pop() {
                // SAFETY: `slot` was in `free`: a transmit slot of this
                // UMEM that neither the kernel nor any other reference
                // uses until it is queued below.
                let bytes = unsafe { tx_bytes(self.area, &self.layout, slot) };
                let (meta, data) = bytes.split_at_mut(self.layout.tx_meta as usize);
                let data = &mut data[..len];
                let r = f(data);
                if !meta.is_empty() {
                    tx_metadata(meta, data, self.counters);
                }
                if let Some(p) = self.pcap {
                    p.borrow_mut().record(self.ts, data);
                }
                self.pending.push_back((slot, len as u32));
                return r;
            }
        }
        self.counters.tx_no_frame += 1;
        self.scratch.resize(len, 0);
        f(&mut self.scratch[..len])
    }
}

/// Fill in the Tx metadata in front of transmitted frame `data`: for a
/// TCP segment a checksum request (the field holds the pseudo-header
/// sum, the kernel or the interface finishes it), for anything else no
/// request.
fn tx_metadata(meta: &mut [u8], data: &mut [u8], counters: &mut RingCounters) {
    meta.fill(0);
    if let Some((start, offset)) = iwarp_tcp::csum::offload(data) {
        meta[..8].copy_from_slice(&u64::from(libc::XDP_TXMD_FLAGS_CHECKSUM).to_ne_bytes());
        meta[8..10].copy_from_slice(&start.to_ne_bytes());
        meta[10..12].copy_from_slice(&offset.to_ne_bytes());
        counters.tx_csum_offloaded += 1;
    }
}

impl phy::Device for XskDevice {
    type RxToken<'a> = XskRx<'a>;
    type TxToken<'a> = XskTx<'a>;

    fn receive(&mut self, ts: Instant) -> Option<(XskRx<'_>, XskTx<'_>)> {
        let home = self.forward.inboxes.get(self.forward.me);
        let owned = home.and_then(|h| Some((self.inbox.pop_front()?, &**h)));
        let frame = match owned {
            Some(_) => None,
            None => Some(self.rx.pop_front()?),
        };
        let parts = self.frames.split();
        let pcap = self.pcap.as_ref();
        Some((
            XskRx {
                area: parts.area,
                gather: parts.gather,
                frame,
                owned,
                recycle: parts.recycle,
                pcap,
                ts,
            },
            XskTx {
                area: parts.area,
                layout: parts.layout,
                free: parts.tx_free,
                pending: parts.tx_pending,
                counters: parts.counters,
                scratch: &mut self.scratch,
                pcap,
                ts,
            },
        ))
    }

    fn transmit(&mut self, ts: Instant) -> Option<XskTx<'_>> {
        // The frames written so far go while still in the cache.
        self.frames.tx_burst_if_due();
        // No frame: smoltcp keeps the data and retries at the next poll.
        if !self.frames.has_free() {
            return None;
        }
        let parts = self.frames.split();
        Some(XskTx {
            area: parts.area,
            layout: parts.layout,
            free: parts.tx_free,
            pending: parts.tx_pending,
            counters: parts.counters,
            scratch: &mut self.scratch,
            pcap: self.pcap.as_ref(),
            ts,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = self.mtu + ETH_HEADER;
        caps.max_burst_size = Some(super::umem::RX_BURST);
        // The rx burst verifies every TCP checksum (and finishes partial
        // ones) and drops the segments that fail: smoltcp computes TCP
        // checksums on transmit only, and not even there when the kernel
        // or the interface finishes them (Tx metadata).
        caps.checksum.tcp = if self.frames.layout.tx_meta > 0 {
            Checksum::None
        } else {
            Checksum::Tx
        };
        caps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet/IPv4/TCP frame from 198.18.0.1:`sport` to `dport`.
    fn tcp_frame(sport: u16, dport: u16, flags: u8) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[14 + 9] = 6;
        f[14 + 12..14 + 16].copy_from_slice(&[198, 18, 0, 1]);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f[34 + 13] = flags;
        f
    }

    fn engine(me: usize, flows: &Arc<Flows>) -> Forward {
        let parts = [49152..=57343, 57344..=65535];
        Forward {
            listening: vec![7174],
            others: (0..2)
                .filter(|&j| j != me)
                .map(|j| (j, parts[j].clone()))
                .collect(),
            inboxes: Vec::new(),
            me,
            flows: flows.clone(),
            mine: HashSet::new(),
            theirs: HashMap::new(),
            theirs_gen: 0,
        }
    }

    #[test]
    fn frames_go_to_the_engine_that_owns_them() {
        let flows = Arc::new(Flows::default());
        let (mut e0, mut e1) = (engine(0, &flows), engine(1, &flows));
        // ARP: everyone; not IPv4/TCP or truncated: here.
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(e0.dest(&arp), Dest::Everywhere);
        assert_eq!(e0.dest(&[0u8; 10]), Dest::Here);
        assert_eq!(e0.dest(&tcp_frame(7174, 60000, 0x10)[..36]), Dest::Here);
        // Outgoing connections: by local port.
        assert_eq!(e0.dest(&tcp_frame(7174, 60000, 0x10)), Dest::There(1));
        assert_eq!(e1.dest(&tcp_frame(7174, 50000, 0x10)), Dest::There(0));
        assert_eq!(e0.dest(&tcp_frame(7174, 50000, 0x10)), Dest::Here);
        // A passive connection belongs to the engine that got its SYN.
        assert_eq!(e0.dest(&tcp_frame(40000, 7174, 0x02)), Dest::Here);
        assert_eq!(e1.dest(&tcp_frame(40000, 7174, 0x10)), Dest::There(0));
        assert_eq!(e1.dest(&tcp_frame(40000, 7174, 0x02)), Dest::There(0));
        assert_eq!(e0.dest(&tcp_frame(40000, 7174, 0x18)), Dest::Here);
        // Unknown non-SYN segments stay where they arrive.
        assert_eq!(e1.dest(&tcp_frame(40001, 7174, 0x10)), Dest::Here);
        // Released: the next connection with that 4-tuple is new.
        e0.forget((u32::from_be_bytes([198, 18, 0, 1]), 40000, 7174));
        assert_eq!(e1.dest(&tcp_frame(40000, 7174, 0x02)), Dest::Here);
        assert_eq!(e0.dest(&tcp_frame(40000, 7174, 0x10)), Dest::There(1));
    }

    #[test]
    fn the_inbox_cycles_a_fixed_set_of_buffers() {
        let inbox = Inbox::with_frames(4, 64);
        let mut out = VecDeque::with_capacity(4);
        let mut seen = HashSet::new();
        for round in 0..10u8 {
            // Three frames of a round fit; the buffers of earlier rounds
            // came back.
            for k in 0..3u8 {
                assert!(inbox.push(&[round, k, 0xee]));
            }
            assert_eq!(inbox.drain_into(&mut out), 3);
            for (k, b) in out.drain(..).enumerate() {
                assert_eq!(b.bytes(), &[round, k as u8, 0xee]);
                seen.insert(b.data.as_ptr() as usize);
                inbox.give_back(b);
            }
        }
        // Thirty frames went through the same four buffers.
        assert!(seen.len() <= 4, "{} buffers", seen.len());
        // Full: the fifth frame is refused until a buffer comes back.
        for k in 0..4u8 {
            assert!(inbox.push(&[k]));
        }
        assert!(!inbox.push(&[4]));
        assert_eq!(inbox.drain_into(&mut out), 4);
        inbox.give_back(out.pop_front().unwrap());
        assert!(inbox.push(&[5]));
        // A frame longer than a buffer is refused, its buffer kept.
        for b in out.drain(..) {
            inbox.give_back(b);
        }
        assert_eq!(inbox.drain_into(&mut out), 1);
        inbox.give_back(out.pop_front().unwrap());
        assert!(!inbox.push(&[0u8; 65]));
        for k in 0..4u8 {
            assert!(inbox.push(&[k]));
        }
    }

    #[test]
    fn other_engines_flows_are_read_once_until_one_is_forgotten() {
        let flows = Arc::new(Flows::default());
        let (mut e0, mut e1) = (engine(0, &flows), engine(1, &flows));
        let key = (u32::from_be_bytes([198, 18, 0, 1]), 40000, 7174);
        assert_eq!(e0.dest(&tcp_frame(40000, 7174, 0x02)), Dest::Here);
        // Engine 1 reads the owner once and keeps it.
        assert_eq!(e1.dest(&tcp_frame(40000, 7174, 0x10)), Dest::There(0));
        assert_eq!(e1.theirs.get(&key), Some(&0));
        // Later segments come from the copy, not the shared table (which
        // is changed behind its back here to tell the two apart).
        q_lock(&flows.map).insert(key, 7);
        assert_eq!(e1.dest(&tcp_frame(40000, 7174, 0x10)), Dest::There(0));
        q_lock(&flows.map).insert(key, 0);
        // Forgotten by its owner: the copies are stale, and a new
        // connection with the same 4-tuple may belong to engine 1.
        e0.forget(key);
        assert_eq!(e1.dest(&tcp_frame(40000, 7174, 0x02)), Dest::Here);
        assert!(e1.theirs.is_empty());
        assert_eq!(e0.dest(&tcp_frame(40000, 7174, 0x10)), Dest::There(1));
    }

    #[test]
    fn pcap_header_and_record() {
        let path =
            std::env::temp_dir().join(format!("iwarp-pcap-unit-{}.pcap", std::process::id()));
        let mut p = Pcap::create(&path).unwrap();
        p.record(Instant::from_micros(3_000_007), &[0xa5; 60]);
        p.flush();
        let b = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(b.len(), 24 + 16 + 60);
        assert_eq!(b[..4], 0xa1b2_c3d4u32.to_le_bytes());
        assert_eq!(b[20..24], 1u32.to_le_bytes(), "Ethernet link type");
        assert_eq!(b[24..28], 3u32.to_le_bytes());
        assert_eq!(b[28..32], 7u32.to_le_bytes());
        assert_eq!(b[32..36], 60u32.to_le_bytes());
        assert!(b[40..].iter().all(|&x| x == 0xa5));
    }
}
