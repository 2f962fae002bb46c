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

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::phy::{self, Device, DeviceCapabilities};
use smoltcp::time::Instant;
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, IpAddress, IpProtocol,
    Ipv4Address, Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr, TcpSeqNumber,
    IPV4_HEADER_LEN, TCP_HEADER_LEN,
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
    /// Window updates sent for connections granted credit
    /// ([`WindowShare`]).
    pub window_updates: Cell<u64>,
}

impl PortCounters {
    /// A frame of `len` bytes went to the device.
    fn transmitted(&self, len: usize) {
        bump(&self.tx_frames, 1);
        bump(&self.tx_bytes, len as u64);
    }
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
    /// advertised (counted in [`WindowShare`]'s total; 0 once the peer's
    /// FIN is acknowledged: nothing more can come).
    rx_open: usize,
    /// The acknowledgement number of our last segment.
    rx_ack: u32,
    /// We opened the connection (our SYN carried no acknowledgement).
    initiated: bool,
    /// Our first acknowledgement (of this number) offered a segment
    /// beyond the connection's share (see [`WindowShare`]): the first
    /// one that acknowledges data of the peer takes back what the peer
    /// left of it.
    floored: Option<u32>,
    /// One past the highest data byte that arrived from the peer (of
    /// segments within a window of our last acknowledgement).
    rx_end: u32,
    /// smoltcp's own right edge as of our last segment (its
    /// acknowledgement + its window field): what its buffer takes.
    smol_edge: u32,
    /// The ticket of the connection's place in [`WindowShare`]'s wait
    /// queue, while it waits for credit.
    wait: Option<u64>,
    /// Credit was granted: a window update is due ([`SentTable::updates`]).
    update_due: bool,
    /// The period the last window update for credit granted was queued
    /// in, until the peer sends data ([`WindowShare::unanswered`]).
    granted: Option<u64>,
    /// Window updates sent again since the last grant.
    repeats: u8,
    /// The period of the last grant of credit (`u64::MAX`: none yet).
    last_grant: u64,
    /// The peer sent data up to the right edge we advertised (or probed
    /// past it) since its last grant: it has more to send than it was
    /// offered, and is granted a turn ([`SentTable::grant`]).
    filled: bool,
    /// The window (bytes beyond the acknowledgement) of the turn granted
    /// last, until the peer fills it or leaves the rest unused for
    /// [`UNUSED_PERIODS`]: what the peer then used of it is a sample of
    /// [`WindowShare::demand`].
    turn: Option<usize>,
    /// The sequence number after our FIN, once we sent one.
    fin_end: Option<u32>,
    /// The acknowledgement number that covers the peer's FIN, once one
    /// arrived.
    peer_fin: Option<u32>,
    /// The window is parked: its peer left it unused for
    /// [`UNUSED_PERIODS`] while no connection waited, so it is the first
    /// to be retracted once one does; the period it was parked in (its
    /// entry in [`WindowShare`]'s parked queue).
    parked: Option<u64>,
    /// The window is being retracted ([`SentTable::retract`]): the bytes
    /// it held when the window update that closes it was queued. They
    /// stay counted until that update leaves, so that no other window is
    /// opened with them before the peer is told.
    retracting: Option<usize>,
    /// The [`WindowShare`] period in which the peer last sent data or the
    /// connection was granted credit.
    touched: u64,
    /// The connection has an entry in [`WindowShare`]'s holder queue.
    holding: bool,
    /// The connection has an entry in [`WindowShare`]'s queue of turns
    /// watched for a peer gone quiet ([`QUIET_PERIODS`]).
    watched: bool,
    /// The period of the connection's entry in [`WindowShare`]'s nudge
    /// queue and the nudges sent so far, while its peer may have gone
    /// quiet for a loss behind a retracted window ([`SentTable::release`]).
    nudge: Option<(u64, u8)>,
    /// The longest payload the peer has sent.
    rx_longest: usize,
    /// A data segment that starts past our last acknowledgement arrived
    /// inside the window: it follows data not yet acknowledged, or a
    /// hole ([`Self::holds_out_of_order`]). Cleared once all that arrived
    /// is acknowledged.
    rx_held: bool,
    /// The peer's last data segment was shorter than its longest: what it
    /// had to send ran out there (smoltcp and Linux send a short segment
    /// only when no more bytes wait behind it). A peer whose last
    /// segment was a full one may have more on its way, lost.
    rx_short: bool,
    /// Our Ethernet address, the next hop's and our IP address, from our
    /// last segment: the headers of a window update.
    hdr: Option<(EthernetAddress, EthernetAddress, Ipv4Address)>,
}

impl Sent {
    /// Our window field's shift once the peer's SYN (or SYN-ACK) is
    /// known: ours if the peer offered scaling too (`peer_scales`), else
    /// 0 (RFC 7323 §2.2).
    fn settle_our_shift(&mut self, peer_scales: bool) {
        self.our_shift = if peer_scales {
            self.our_scale.unwrap_or(0).min(14)
        } else {
            0
        };
    }

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

    /// The peer sent data in period `cur` or the `periods` before it
    /// ([`WindowShare`]'s periods).
    fn received_within(&self, periods: u64, cur: u64) -> bool {
        stamped_within(self.rx_period, periods, cur)
    }

    /// Credit was granted in period `cur` or the `periods` before it.
    fn granted_within(&self, periods: u64, cur: u64) -> bool {
        stamped_within(self.last_grant, periods, cur)
    }

    /// Data arrived beyond our last acknowledgement: bytes smoltcp may
    /// hold out of order in its receive buffer, or has yet to
    /// acknowledge.
    pub(crate) fn holds_unacknowledged(&self) -> bool {
        self.arrived_beyond_ack() > 0
    }

    /// Data arrived past our last acknowledgement inside the window we
    /// advertised and is not yet acknowledged (a probe's byte past the
    /// window's edge is not counted). Data that arrived in order is
    /// acknowledged within the delayed-ACK time, so for a connection
    /// whose peer has been quiet longer this means a hole: smoltcp holds
    /// the data out of order, and the peer resends the hole into this
    /// window.
    fn holds_out_of_order(&self) -> bool {
        self.rx_held && self.arrived_beyond_ack() > 0
    }

    /// Bytes from our last acknowledgement to the end of the data that
    /// arrived (0 if that lies behind it, or a buffer's reach ahead).
    fn arrived_beyond_ack(&self) -> usize {
        Some(self.beyond_ack(self.rx_end))
            .filter(|&n| n <= crate::MAX_BUFFER)
            .unwrap_or(0)
    }

    /// The bytes of its window [`WindowShare`] counts.
    fn counted(&self) -> usize {
        self.rx_open
    }

    /// Bytes the peer may send beyond what we acknowledged, as we last
    /// advertised it; `None` before we acknowledged anything.
    pub(crate) fn rx_window(&self) -> Option<usize> {
        self.rx_edge.map(|_| self.rx_open)
    }

    /// Bytes from our last acknowledgement to `edge` (0 if it lies
    /// behind).
    fn beyond_ack(&self, edge: u32) -> usize {
        (edge.wrapping_sub(self.rx_ack) as i32).max(0) as usize
    }

    /// The window field (scaled by our shift) that reaches the right edge
    /// we advertised; `None` before we acknowledged anything.
    fn edge_field(&self) -> Option<u16> {
        let open = self.beyond_ack(self.rx_edge?);
        Some((open >> self.our_shift).min(usize::from(u16::MAX)) as u16)
    }
}

/// How long a connection counts as receiving after its last data
/// segment: between one and two of these periods.
const SHARE_PERIOD_MS: i64 = 10;

/// After how many periods without data a window counts as unused
/// ([`WindowShare`]): one second, far beyond the time a busy peer takes
/// to use its window (at 4096 connections sharing 1536 frames a
/// connection's turn comes every few tens of milliseconds), so that
/// only the window of a peer that stopped sending is retracted.
const UNUSED_PERIODS: u64 = 100;

/// After how many periods without data a turn its peer used part of
/// counts as ended while connections wait ([`SentTable::end_quiet_turns`]):
/// 40–50 ms. A peer with more to send fills the window it was offered in
/// one flight, or, held back by its congestion window, goes on within a
/// round trip of our acknowledgement; one that stopped part way had less
/// to send than its turn (its stream ended, or its application writes no
/// faster), and the rest of its turn would otherwise stay held for
/// [`UNUSED_PERIODS`] while the waiting connections wait behind it.
const QUIET_PERIODS: u64 = 5;

/// Most window updates [`Port::send_window_updates`] sends per call (per
/// [`Stack::poll`](crate::Stack::poll)). Updates come in waves: the
/// connections opened together retract, are nudged and repeat together,
/// thousands in one period. Sent back to back, such a wave reaches the
/// peer faster than a busy peer takes frames off its receive ring, and
/// it drops them (and the data among them) once its fill ring runs dry;
/// a few dozen per poll interleave with the peer's passes, and still
/// send hundreds of thousands a second.
const UPDATES_PER_CALL: usize = 64;

/// How many periods after its retraction a connection whose peer sent
/// data lately is first nudged ([`SentTable::release`]): one second,
/// smoltcp's least retransmission timeout. Each further nudge waits twice
/// as long as the one before, as the peer's timeout doubles each time it
/// fires.
const NUDGE_PERIODS: u64 = 100;

/// How many nudges such a connection is sent at most: three, 1 + 2 + 4
/// seconds, for a peer whose data and two retransmissions were lost.
const MAX_NUDGES: u8 = 3;

/// How lately a peer must have sent data, or been granted a window, for
/// its retracted connection to be nudged: three seconds (an unused window
/// is retracted one to two [`UNUSED_PERIODS`] after its peer last sent).
const NUDGE_RECENT_PERIODS: u64 = 3 * UNUSED_PERIODS;

/// After how many periods a window update the peer did not answer with
/// data is sent again (20–30 ms: a peer with data answers within its
/// round trip and a pass; one whose update was lost would otherwise wait
/// for its persist timer, a second or more with smoltcp, 200 ms or more
/// with Linux, while the credit stays held).
const REPEAT_PERIODS: u64 = 3;

/// The weight of one turn in [`WindowShare::demand`]: 1/8, so that a
/// change in what peers use of their turns shows within a few dozen
/// turns (a fraction of a second when they matter, thousands of
/// connections taking turns).
const DEMAND_WEIGHT: usize = 8;

/// How often a window update is sent again at most (a peer that has
/// nothing to send costs that many pure acknowledgements per grant).
const MAX_REPEATS: u8 = 2;

/// The most segments a connection is granted at its turn while others
/// wait ([`WindowShare::turn`]): a window update, 32 segments and 16
/// delayed acknowledgements instead of a window update and an
/// acknowledgement for every segment, as windows of one segment each
/// cost once a thousand connections share the frames. Longer turns let
/// the peer send more per visit of its connection, which with a
/// thousand connections and more costs it far more than the segments
/// (a visit's connection state is no longer in the cache), and a
/// 64 KiB message takes two turns instead of three: 32 received 11 %
/// more than 16 at 1024 QPs and about as much at 10,000, where the
/// writes completed more evenly (`iwarp-scale --sender afxdp`); 64 (45
/// with the 64 KiB buffer of a shared window) received no more at 1024
/// and less at 10,000.
const TURN_SEGMENTS: usize = 32;

/// The receive frames shared by the connections
/// ([`Config::window_frames`](crate::Config::window_frames)): the windows
/// all connections hold open together stay within `frames × mss` bytes
/// (the pool), so the peers together cannot have more in flight than the
/// device has frames to receive into, however many connections there
/// are (but for a segment of each connection we opened, from its
/// handshake to its peer's first answer; see the SYN-ACK below).
///
/// smoltcp advertises its whole free buffer and cannot be told less, so
/// the window field of each segment it sends is cut on the way out; the
/// right edge (acknowledgement + window) never moves back (RFC 9293
/// §3.8.6: a receiver must not shrink the window), so a share that
/// shrinks takes effect as the peer fills what it was offered.
///
/// * A connection is offered what the others leave of the pool, at most
///   its fair part, `frames × mss / (receiving + waiting)` (the
///   connections that received data lately and those waiting for
///   credit) but at least a turn ([`turn`](Self::turn)), in whole
///   segments. The offer may be zero: the connection then advertises no
///   window beyond its edge. Past `frames / turn` receiving connections
///   they take turns: a few hold a turn's window each while the others
///   wait, and each segment of a turn costs less than a one-segment
///   window shared by all would (the per-segment work of a connection,
///   its acknowledgement and the window update are paid per turn).
/// * A connection whose window is held below one segment by the pool
///   (smoltcp's own window would allow more) joins a FIFO wait queue.
///   While any connection waits, no window grows on its own: a window
///   shrinks as its peer fills it, and the credit it frees goes to the
///   waiting connections in their order, a fair part each (whole
///   segments, smoltcp's own window permitting), once a turn's worth is
///   free; a connection whose peer has not sent up to the edge it was
///   offered gets one segment instead ([`Sent::filled`]).
/// * A turn granted to a waiting connection is as long as what peers
///   lately used of theirs ([`demand`](Self::demand)), at most
///   [`TURN_SEGMENTS`]: a turn its peer fills counts whole (it had
///   more), one left unused counts what its peer used (if anything: a
///   turn left untouched may be one whose window update was lost). When
///   thousands of connections finish at once, each peer with a tail
///   shorter than a turn, the rest of each turn stays held until it is
///   retracted; shorter turns then serve many more of them per second, and
///   turns filled again lengthen them back. Offers to connections that
///   do not wait stay at least the longest turn: a window of one segment
///   per round trip is what turns exist to avoid.
/// * A connection that is granted credit is sent a window update at
///   once: a pure acknowledgement the device wrapper builds itself
///   ([`SentTable::window_update`]), because smoltcp sends none for a
///   window it does not know was closed, and the peer's persist timer
///   would wait hundreds of milliseconds. A peer that sends nothing into
///   the reopened window for [`REPEAT_PERIODS`] is sent it again, at
///   most [`MAX_REPEATS`] times: the update may have been lost (a pure
///   acknowledgement is not retransmitted).
/// * Credit comes back when a peer fills its window and we acknowledge
///   it, when the peer's FIN is acknowledged, and when the connection
///   is gone. A window a peer leaves unused stays held until it has been
///   unused for [`UNUSED_PERIODS`], with two exceptions while others
///   wait: a turn whose peer sent part of it, ending in a short segment
///   (it had no more), and then nothing for [`QUIET_PERIODS`]
///   ([`SentTable::end_quiet_turns`]); and a grant whose window update
///   went unanswered however often it was sent. Then, if a connection
///   waits, it is retracted ([`SentTable::retract`]): a window update moves its right
///   edge back to the acknowledgement, a zero window, and the credit
///   goes to the waiting ones. If none waits it is parked, still held,
///   and retracted, oldest first, as soon as one waits and less than a
///   turn is free. A retracted window is the one exception to the right
///   edge never moving back. RFC 9293 §3.8.6 has a sender robust
///   against it: smoltcp takes the window of every acceptable segment,
///   Linux a zero window from an acknowledgement that repeats its
///   sequence number. It is what keeps the windows within the pool:
///   a window left open past it, once its peer starts sending, would
///   make the device drop frames (thousands of idle connections, each
///   with a turn's window open, start sending at once). A peer with more
///   to send into a retracted window probes it (its persist timer); our
///   acknowledgement of the probe queues the connection for credit. One
///   whose peer sent lately is nudged one, three and seven seconds later
///   ([`SentTable::nudge`]): its peer may have gone quiet for a loss,
///   and smoltcp then waits for a segment before it probes. A window
///   holding data past a hole is not retracted.
/// * A SYN's window is left alone: a connection takes its share from
///   its first acknowledgement after the handshake on. That lets the
///   first message of a connecting peer (an MPA request) in however the
///   frames are held. A connection we open needs the same for its peer's
///   first message, which answers the one our first acknowledgement
///   carries (an MPA reply): that acknowledgement's window is at least
///   one segment, held frames or not, and the first acknowledgement of
///   the peer's data takes back what the peer left of a segment its
///   share did not hold (its right edge moves back to what the share
///   allows). Cut to nothing,
///   the connection would wait for its reply until a window that an idle
///   connection holds has gone unused for a second and is retracted.
///
/// Every step is constant time per segment or event: the queue is a
/// FIFO whose stale entries (connections gone or restarted) are skipped
/// when they come up and compacted away when they outnumber the live
/// ones.
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
    /// advertised, or granted).
    open: Cell<usize>,
    /// Connections waiting for credit, in their order, with their ticket
    /// (an entry whose ticket the connection no longer holds is stale).
    queue: RefCell<VecDeque<(Flow, u64)>>,
    /// Connections holding a ticket.
    waiting: Cell<usize>,
    /// The next ticket.
    tickets: Cell<u64>,
    /// Connections whose window is counted, each once, with the period
    /// they were queued in: oldest first.
    holders: RefCell<VecDeque<(Flow, u64)>>,
    /// The period since which the first waiting connection waits for a
    /// turn's worth of credit to come free.
    short_since: Cell<Option<u64>>,
    /// Connections sent a window update, with the period it was queued
    /// in, oldest first: an entry whose period the connection no longer
    /// holds in [`Sent::granted`] is stale.
    unanswered: RefCell<VecDeque<(Flow, u64)>>,
    /// Window updates sent again.
    pub(crate) repeated: Cell<u64>,
    /// Turns filled by their peers, and turns left partly unused.
    pub(crate) turns_filled: Cell<u64>,
    pub(crate) turns_unfilled: Cell<u64>,
    /// Connections whose window went unused while none waited, with the
    /// period they were parked in, oldest first: an entry whose period
    /// the connection no longer holds in [`Sent::parked`] is stale.
    parked: RefCell<VecDeque<(Flow, u64)>>,
    /// Connections holding [`Sent::parked`].
    parked_count: Cell<usize>,
    /// Connections granted a turn, with the period from which to check
    /// whether its peer went quiet part way ([`Sent::watched`]), oldest
    /// first.
    quiet: RefCell<VecDeque<(Flow, u64)>>,
    /// Turns ended early because their peers went quiet part way
    /// ([`QUIET_PERIODS`]).
    pub(crate) quiet_turns: Cell<u64>,
    /// Connections whose windows were retracted soon after their peers
    /// last sent, to be nudged ([`SentTable::release`]), with the period
    /// they were queued in, oldest first, one queue for each nudge (the
    /// n-th waits `NUDGE_PERIODS << n`): an entry whose period the
    /// connection no longer holds in [`Sent::nudge`] is stale.
    nudges: [RefCell<VecDeque<(Flow, u64)>>; MAX_NUDGES as usize],
    /// Nudges sent.
    pub(crate) nudged: Cell<u64>,
    /// Windows retracted ([`SentTable::retract`]).
    pub(crate) retracted: Cell<u64>,
    /// Segments that arrived at a closed window: zero-window probes, and
    /// data sent before the peer learnt that its window closed.
    pub(crate) closed_segments: Cell<u64>,
    /// The bytes of the windows being retracted, whose updates have not
    /// left yet ([`Sent::retracting`]).
    pending: Cell<usize>,
    /// The bytes a peer uses of its turn, a moving average over the turns
    /// that ended ([`Self::turn_used`]; a filled turn counts as a whole
    /// one): `None` before any ended.
    demand: Cell<Option<usize>>,
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

    /// The pool's bytes.
    fn pool(&self) -> usize {
        self.frames.saturating_mul(self.mss)
    }

    /// Pool bytes no window holds.
    fn free(&self) -> usize {
        self.pool().saturating_sub(self.open.get())
    }

    /// The most segments of a turn: [`TURN_SEGMENTS`], but at most an
    /// eighth of the pool (so that several connections hold turns at once
    /// and one peer's round trip does not idle the pool), at least one.
    fn turn_segments(&self) -> usize {
        TURN_SEGMENTS.min(self.frames / 8).max(1)
    }

    /// The longest turn, in bytes: [`Self::turn_segments`] segments.
    fn longest_turn(&self) -> usize {
        self.turn_segments() * self.mss
    }

    /// The credit a waiting connection whose peer filled its window is
    /// granted at its turn: what peers lately used of their turns
    /// ([`Self::demand`]), in whole segments, at most the longest turn, at
    /// least one segment.
    fn turn(&self) -> usize {
        let most = self.turn_segments();
        let demand = self.demand.get().unwrap_or(self.longest_turn());
        demand.div_ceil(self.mss).clamp(1, most) * self.mss
    }

    /// [`Self::turn`] for the counters: 0 when windows are not cut.
    pub(crate) fn turn_bytes(&self) -> u64 {
        if self.cuts() {
            self.turn() as u64
        } else {
            0
        }
    }

    /// A turn ended with its peer having used `used` bytes of it
    /// (`None`: the peer filled it and had more): one sample of
    /// [`Self::demand`].
    fn turn_used(&self, used: Option<usize>) {
        let counter = match used {
            None => &self.turns_filled,
            Some(_) => &self.turns_unfilled,
        };
        counter.set(counter.get() + 1);
        let most = self.longest_turn();
        let sample = used.map_or(most, |u| u.min(most));
        let demand = self.demand.get().unwrap_or(most);
        self.demand.set(Some(
            (demand * (DEMAND_WEIGHT - 1) + sample) / DEMAND_WEIGHT,
        ));
    }

    /// Whether the first waiting connection may be granted less than a
    /// turn: the credit free has stayed short of one for a whole period
    /// (windows their peers leave unused hold the rest, and they only
    /// come back when retracted).
    fn short_for_long(&self) -> bool {
        self.short_until().is_some_and(|p| p <= self.period.get())
    }

    /// The period from which [`Self::short_for_long`] holds, while the
    /// first waiting connection waits for a turn's worth.
    fn short_until(&self) -> Option<u64> {
        self.short_since.get().map(|p| p.saturating_add(2))
    }

    /// Bytes one connection may hold: its fair part of the pool among
    /// the connections that received lately and those waiting, at least
    /// the longest turn.
    fn bytes(&self) -> Option<usize> {
        if self.frames == 0 {
            return None;
        }
        let receiving =
            (self.now_count.get() + self.before_count.get() + self.waiting.get()).max(1);
        Some((self.pool() / receiving).max(self.longest_turn()))
    }

    /// Bytes a connection whose window holds `mine` open may be offered
    /// beyond its acknowledgement: its fair part, within what the others
    /// leave, in whole segments; nothing while others wait for credit, or
    /// when the others leave it less than a turn (its edge stays where it
    /// is, see [`cut_window`]: the window is used up and the connection
    /// waits for a turn). A part of a
    /// segment would only make the peer send a short segment to fill it
    /// (a frame for half the bytes), which is the small window increment
    /// RFC 9293 §3.8.6.2.2 has the receiver avoid.
    fn offer(&self, mine: usize) -> Option<usize> {
        let fair = self.bytes()?;
        if self.waiting.get() > 0 {
            return Some(0);
        }
        let others = self.open.get().saturating_sub(mine);
        let left = self.pool().saturating_sub(others);
        if left < fair.min(self.turn()) {
            // The others hold the pool: a window slid along with each
            // acknowledgement would stay a few segments wide, every
            // segment or two acknowledged on its own. It is used up
            // instead, and the connection waits for a turn.
            return Some(0);
        }
        Some(fair.min(left) / self.mss * self.mss)
    }

    /// A connection's open window went from `old` to `new` bytes.
    fn reopen(&self, old: usize, new: usize) {
        self.open
            .set(self.open.get().saturating_sub(old).saturating_add(new));
    }

    /// Put the connection of `flow` (`s`) at the end of the wait queue,
    /// unless it waits already.
    fn enqueue(&self, flow: Flow, s: &mut Sent) {
        if s.wait.is_some() {
            return;
        }
        let ticket = self.tickets.get();
        self.tickets.set(ticket.wrapping_add(1));
        s.wait = Some(ticket);
        self.waiting.set(self.waiting.get() + 1);
        self.queue.borrow_mut().push_back((flow, ticket));
    }

    /// Drop the wait and parked queues' stale entries once they
    /// outnumber the live ones (amortised constant time: each compaction
    /// at least halves a queue).
    fn compact(&self, entries: &HashMap<Flow, Sent, FlowHash>) {
        let mut queue = self.queue.borrow_mut();
        if queue.len() > 2 * self.waiting.get() + 64 {
            queue.retain(|(f, t)| entries.get(f).is_some_and(|s| s.wait == Some(*t)));
        }
        let mut parked = self.parked.borrow_mut();
        if parked.len() > 2 * self.parked_count.get() + 64 {
            parked.retain(|(f, p)| entries.get(f).is_some_and(|s| s.parked == Some(*p)));
        }
    }

    /// The window of the connection of `flow` (`s`) went unused while no
    /// connection waited: park it (again, if it is parked).
    fn park(&self, flow: Flow, s: &mut Sent) {
        let cur = self.period.get();
        if s.parked.replace(cur).is_none() {
            self.parked_count.set(self.parked_count.get() + 1);
        }
        self.parked.borrow_mut().push_back((flow, cur));
    }

    /// The connection `s` is no longer parked (its entry in the parked
    /// queue becomes stale).
    fn unpark(&self, s: &mut Sent) {
        if s.parked.take().is_some() {
            self.parked_count
                .set(self.parked_count.get().saturating_sub(1));
        }
    }

    /// The connection `s` left the table (it is gone, or its SYN was sent
    /// again): its window is no longer counted, and it leaves the wait
    /// and parked queues and any retraction under way.
    fn remove(&self, s: &mut Sent) {
        self.reopen(s.counted(), 0);
        self.leave(s);
        self.unpark(s);
        self.keep(s);
    }

    /// The retraction of `s`'s window, if one is under way, is called
    /// off (its peer sends again, or the connection is gone): its window
    /// update, if still queued, carries the window as it stands.
    fn keep(&self, s: &mut Sent) {
        if let Some(n) = s.retracting.take() {
            self.pending.set(self.pending.get().saturating_sub(n));
        }
    }

    /// The connection of `flow` (`s`) holds a counted window: queue it
    /// for the idle check unless it is queued.
    fn hold(&self, flow: Flow, s: &mut Sent) {
        if !s.holding {
            s.holding = true;
            self.holders
                .borrow_mut()
                .push_back((flow, self.period.get()));
        }
    }

    /// The connection of `flow` (`s`) holds a turn: queue it for the
    /// quiet check from period `from` on, unless it is queued.
    fn watch(&self, flow: Flow, s: &mut Sent, from: u64) {
        if !s.watched {
            s.watched = true;
            self.quiet.borrow_mut().push_back((flow, from));
        }
    }

    /// The connection `s` gives up its place in the queue (its entry
    /// there becomes stale).
    fn leave(&self, s: &mut Sent) {
        if s.wait.take().is_some() {
            self.waiting.set(self.waiting.get().saturating_sub(1));
        }
    }
}

/// Period `stamp` (`u64::MAX`: never) is `cur` or one of the `periods`
/// before it.
fn stamped_within(stamp: u64, periods: u64, cur: u64) -> bool {
    stamp != u64::MAX && stamp.saturating_add(periods) >= cur
}

/// The oldest entry of a queue of (connection, period queued in), taken
/// off if it was queued `age` periods or more before `cur`.
fn pop_due(queue: &RefCell<VecDeque<(Flow, u64)>>, age: u64, cur: u64) -> Option<(Flow, u64)> {
    let mut queue = queue.borrow_mut();
    let &(flow, stamp) = queue.front()?;
    (stamp.saturating_add(age) <= cur).then(|| {
        queue.pop_front();
        (flow, stamp)
    })
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
    /// Connections granted credit whose window update is due, in the
    /// order of the grants.
    updates: RefCell<VecDeque<Flow>>,
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
            s.settle_our_shift(syn.window_scale.is_some());
            if let Some(r) = &mut s.reno {
                r.on_peer_syn(syn.mss);
            }
        }
    }

    fn forget(&self, flow: Flow) {
        let mut entries = self.entries.borrow_mut();
        if let Some(mut s) = entries.remove(&flow) {
            self.share.remove(&mut s);
            self.grant(&mut entries);
        }
    }

    /// Queue a window update for the connection of `flow` (`s`), unless
    /// one is queued already.
    fn queue_update(&self, flow: Flow, s: &mut Sent) {
        if !s.update_due {
            s.update_due = true;
            self.updates.borrow_mut().push_back(flow);
        }
    }

    /// The window update of `flow` taken from the queue could not be
    /// sent: it is due first again.
    fn requeue(&self, flow: Flow) {
        if let Some(s) = self.entries.borrow_mut().get_mut(&flow) {
            s.update_due = true;
            self.updates.borrow_mut().push_front(flow);
        }
    }

    /// Move the share's period forward to `now`; retract (or, while none
    /// waits, park) the windows of the connections whose peers left them
    /// unused for [`UNUSED_PERIODS`] (the
    /// holder queue's oldest entries, each checked once per that time
    /// it holds a window and the peer sends: amortised constant time per
    /// received segment) and give the credit to the waiting ones.
    pub(crate) fn tick(&self, now: Instant) {
        let share = &self.share;
        let before = share.period.get();
        share.tick(now);
        let cur = share.period.get();
        if cur == before {
            return;
        }
        let mut entries = self.entries.borrow_mut();
        self.nudge(&mut entries);
        let mut freed = share.short_for_long()
            | self.repeat_unanswered(&mut entries)
            | self.end_quiet_turns(&mut entries);
        while let Some((flow, _)) = pop_due(&share.holders, UNUSED_PERIODS, cur) {
            let Some(s) = entries.get_mut(&flow) else {
                continue;
            };
            if !s.holding {
                continue;
            }
            if (s.touched.saturating_add(UNUSED_PERIODS) > cur || s.holds_out_of_order())
                && s.counted() > 0
            {
                // Touched since it was queued, or holding data past a
                // hole that the peer retransmits into this window (into
                // a closed one smoltcp sends nothing, and a peer quiet
                // that long is not nudged): check again later.
                share.holders.borrow_mut().push_back((flow, cur));
                continue;
            }
            s.holding = false;
            // A turn its peer sent nothing into tells nothing of what
            // peers use: its window update may have been lost.
            if let Some(turn) = s.turn.take() {
                let used = turn.saturating_sub(s.counted());
                if used > 0 {
                    share.turn_used(Some(used));
                }
            }
            if s.counted() == 0 {
                continue;
            }
            if share.waiting.get() > 0 {
                self.retract(flow, s);
                freed = true;
            } else {
                share.park(flow, s);
            }
        }
        if freed {
            self.grant(&mut entries);
        }
    }

    /// End the turns whose peers sent part of them and then nothing for
    /// [`QUIET_PERIODS`], with all that arrived acknowledged, while
    /// connections wait: the rest of each is retracted, and what the peer
    /// used is a sample of [`WindowShare::demand`]. Returns whether any
    /// was. The watched turns' oldest entries, each checked once per
    /// [`QUIET_PERIODS`] its turn stays open: amortised constant time
    /// per turn granted and received segment.
    fn end_quiet_turns(&self, entries: &mut HashMap<Flow, Sent, FlowHash>) -> bool {
        let share = &self.share;
        let cur = share.period.get();
        let mut ended = false;
        while let Some((flow, _)) = pop_due(&share.quiet, QUIET_PERIODS, cur) {
            let Some(s) = entries.get_mut(&flow) else {
                continue;
            };
            let Some(turn) = s.turn.filter(|_| s.watched && s.retracting.is_none()) else {
                s.watched = false;
                continue;
            };
            let used = turn.saturating_sub(s.counted());
            if used == 0 || s.counted() == 0 {
                // Untouched (its window update may have been lost: it is
                // sent again, and the window held for `UNUSED_PERIODS`),
                // or used up.
                s.watched = false;
                continue;
            }
            if !s.rx_short {
                // Its last segment was a full one: the next may have
                // been lost, and the peer retransmits it into this
                // window when its timeout fires (smoltcp sends nothing
                // into a closed one). Held for `UNUSED_PERIODS`.
                s.watched = false;
                continue;
            }
            let quiet_since = s.touched.saturating_add(QUIET_PERIODS);
            if quiet_since > cur || share.waiting.get() == 0 || s.holds_unacknowledged() {
                // Data came lately, none needs the credit, or the peer
                // waits for our acknowledgement: look again later.
                let from = if quiet_since > cur { s.touched } else { cur };
                share.quiet.borrow_mut().push_back((flow, from));
                continue;
            }
            s.watched = false;
            share.turn_used(Some(used));
            share.quiet_turns.set(share.quiet_turns.get() + 1);
            self.retract(flow, s);
            ended = true;
        }
        ended
    }

    /// Retract the window of the connection of `flow` (`s`), which its
    /// peer left unused: a window update is queued like a grant's, and
    /// when it leaves (or a segment of the connection carries it) the
    /// right edge moves back to the acknowledgement, a zero window, and
    /// the credit returns to the pool ([`Self::release`]).
    fn retract(&self, flow: Flow, s: &mut Sent) {
        let share = &self.share;
        // What the peer used of a turn is sampled, if at all, by the
        // caller: a retracted window is no turn.
        s.turn = None;
        share.unpark(s);
        if s.retracting.is_some() {
            return;
        }
        let n = s.counted();
        s.retracting = Some(n);
        share.pending.set(share.pending.get() + n);
        s.granted = None;
        self.queue_update(flow, s);
    }

    /// The window update of `s`'s retraction (of `flow`) is leaving:
    /// close its window at our last acknowledgement and give its credit
    /// back. Returns whether there was one.
    ///
    /// A connection whose peer sent data, or that was granted credit,
    /// within [`NUDGE_RECENT_PERIODS`] is then nudged ([`Self::nudge`]).
    /// Its peer may have gone quiet because its data (perhaps sent into
    /// the grant) was lost and it waits for its retransmission timeout
    /// (doubled each time a retransmission is lost too); smoltcp, whose
    /// timeout then fires into a closed window, sends nothing more (no
    /// retransmission, no probe) until a segment arrives. One whose peer
    /// has been quiet longer is not.
    fn release(&self, flow: Flow, s: &mut Sent) -> bool {
        let share = &self.share;
        let Some(n) = s.retracting.take() else {
            return false;
        };
        share.pending.set(share.pending.get().saturating_sub(n));
        share.reopen(s.counted(), 0);
        s.rx_open = 0;
        s.rx_edge = Some(s.rx_ack);
        share.retracted.set(share.retracted.get() + 1);
        let cur = share.period.get();
        if s.received_within(NUDGE_RECENT_PERIODS, cur)
            || s.granted_within(NUDGE_RECENT_PERIODS, cur)
        {
            s.nudge = Some((cur, 0));
            share.nudges[0].borrow_mut().push_back((flow, cur));
        }
        true
    }

    /// Retract parked windows, oldest first, while a connection waits and
    /// less than a turn is free or on its way back.
    fn reclaim(&self, entries: &mut HashMap<Flow, Sent, FlowHash>) {
        let share = &self.share;
        while share.waiting.get() > 0 && share.free() + share.pending.get() < share.turn() {
            let Some((flow, stamp)) = share.parked.borrow_mut().pop_front() else {
                break;
            };
            let Some(s) = entries.get_mut(&flow).filter(|s| s.parked == Some(stamp)) else {
                continue;
            };
            if s.counted() == 0 {
                share.unpark(s);
                continue;
            }
            self.retract(flow, s);
        }
    }

    /// Nudge the connections whose windows were retracted soon after
    /// their peers last sent ([`Self::release`]): each is sent its window
    /// update again (a zero window) [`NUDGE_PERIODS`] after the
    /// retraction, and again after twice as long as the time before,
    /// [`MAX_NUDGES`] times at most, until its peer sends. A smoltcp peer whose retransmission timeout
    /// fired into the closed window takes the segment as its cue to
    /// start probing; its probe shows that it has data, and the
    /// connection waits for credit like any other. This costs a pure
    /// acknowledgement where a segment of the pool held for a second
    /// would cost a frame, and most such peers have nothing more to
    /// send. The queue's oldest entries: constant time per nudge.
    fn nudge(&self, entries: &mut HashMap<Flow, Sent, FlowHash>) {
        let share = &self.share;
        let cur = share.period.get();
        for (n, queue) in share.nudges.iter().enumerate() {
            while let Some((flow, stamp)) = pop_due(queue, NUDGE_PERIODS << n, cur) {
                let Some(s) = entries.get_mut(&flow) else {
                    continue;
                };
                if s.nudge != Some((stamp, n as u8)) {
                    continue;
                }
                let answered = s.rx_period != u64::MAX && s.rx_period > stamp;
                if answered || s.wait.is_some() || s.rx_open > 0 || s.retracting.is_some() {
                    s.nudge = None;
                    continue;
                }
                share.nudged.set(share.nudged.get() + 1);
                s.nudge = None;
                if let Some(next) = share.nudges.get(n + 1) {
                    s.nudge = Some((cur, n as u8 + 1));
                    next.borrow_mut().push_back((flow, cur));
                }
                self.queue_update(flow, s);
            }
        }
    }

    /// Queue again the window updates the peers have not answered with
    /// data for [`REPEAT_PERIODS`] while their windows are still open,
    /// each at most [`MAX_REPEATS`] times (the queue's oldest entries:
    /// constant time per update sent).
    fn repeat_unanswered(&self, entries: &mut HashMap<Flow, Sent, FlowHash>) -> bool {
        let share = &self.share;
        let cur = share.period.get();
        let mut retracted = false;
        while let Some((flow, stamp)) = pop_due(&share.unanswered, REPEAT_PERIODS, cur) {
            let Some(s) = entries.get_mut(&flow) else {
                continue;
            };
            if s.granted != Some(stamp) {
                continue;
            }
            if s.repeats >= MAX_REPEATS || s.rx_open == 0 {
                s.granted = None;
                // Unanswered however often it was sent: its peer has
                // nothing to send, or has gone quiet for a loss. Those
                // waiting get the credit; the second kind is nudged
                // ([`Self::release`]).
                if s.rx_open > 0 && share.waiting.get() > 0 {
                    self.retract(flow, s);
                    retracted = true;
                }
                continue;
            }
            s.repeats += 1;
            s.granted = Some(cur);
            share.unanswered.borrow_mut().push_back((flow, cur));
            share.repeated.set(share.repeated.get() + 1);
            self.queue_update(flow, s);
        }
        retracted
    }

    /// When [`Self::tick`] has a step to take that comes with time alone
    /// (no frame need arrive): a window to check for use, a window
    /// update to send again, or the first waiting connection's wait for a
    /// turn's worth of credit to end while less is free. A stack polls by
    /// then (`Stack::poll_at`), or a window held by a peer that stopped
    /// sending would stay held, and the connections waiting behind it
    /// would wait for their peers' zero-window probes, which back off to
    /// a minute. The earliest is the next period: a step due now was
    /// taken when this one began.
    pub(crate) fn due(&self) -> Option<Instant> {
        let share = &self.share;
        let unused = share
            .holders
            .borrow()
            .front()
            .map(|&(_, p)| p.saturating_add(UNUSED_PERIODS));
        let repeat = share
            .unanswered
            .borrow()
            .front()
            .map(|&(_, p)| p.saturating_add(REPEAT_PERIODS));
        let quiet = share
            .quiet
            .borrow()
            .front()
            .map(|&(_, p)| p.saturating_add(QUIET_PERIODS));
        let nudge = share
            .nudges
            .iter()
            .enumerate()
            .filter_map(|(n, q)| {
                q.borrow()
                    .front()
                    .map(|&(_, p)| p.saturating_add(NUDGE_PERIODS << n))
            })
            .min();
        let short = share
            .short_until()
            .filter(|_| share.waiting.get() > 0 && share.free() >= share.mss);
        let period = [unused, repeat, quiet, nudge, short]
            .into_iter()
            .flatten()
            .min()?
            .max(share.period.get().saturating_add(1));
        Some(Instant::from_millis(
            i64::try_from(period)
                .unwrap_or(i64::MAX)
                .saturating_mul(SHARE_PERIOD_MS),
        ))
    }

    /// Whether a step of [`Self::due`] is due at `now`: never before the
    /// next period begins (what `due` returns is at least that), which
    /// a caller that asks every pass learns without looking at the queues.
    pub(crate) fn due_by(&self, now: Instant) -> bool {
        let next = self.share.period.get().saturating_add(1);
        let next = i64::try_from(next)
            .unwrap_or(i64::MAX)
            .saturating_mul(SHARE_PERIOD_MS);
        now.total_millis() >= next && self.due().is_some_and(|t| t <= now)
    }

    /// Whether a window update is due ([`Port::send_window_updates`]).
    pub(crate) fn updates_due(&self) -> bool {
        !self.updates.borrow().is_empty()
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
        let len = tcp.payload().len() as u32;
        let mut out = Rewrite::default();
        if tcp.syn() {
            if entries.len() >= SENT_TABLE_CAP && !entries.contains_key(&key) {
                return out;
            }
            let start = seq.wrapping_add(1);
            // A SYN-ACK acknowledges the peer's SYN: its data follows.
            let acked = if tcp.ack() {
                tcp.ack_number().0 as u32
            } else {
                0
            };
            let mut sent = Sent {
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
                parked: None,
                retracting: None,
                touched: self.share.period.get(),
                holding: false,
                watched: false,
                nudge: None,
                rx_longest: 0,
                rx_short: false,
                rx_held: false,
                rx_ack: acked,
                initiated: !tcp.ack(),
                floored: None,
                rx_end: acked,
                smol_edge: 0,
                wait: None,
                update_due: false,
                granted: None,
                repeats: 0,
                last_grant: u64::MAX,
                filled: false,
                turn: None,
                fin_end: None,
                peer_fin: None,
                hdr: Some((seg.src_mac, seg.dst_mac, seg.src)),
            };
            // A SYN sent again restarts the entry: what the old one held
            // open is no longer counted, its place in the queue is lost.
            if let Some(mut old) = entries.remove(&key) {
                self.share.remove(&mut old);
                // A simultaneous open: our SYN-ACK follows our SYN.
                sent.initiated |= old.initiated;
            }
            // A SYN's window (never scaled) is left alone: the connection
            // takes its share from its first acknowledgement on. Cut to
            // nothing while the frames are held, it would keep a new
            // connection from even sending its first message (the MPA
            // request) until a window that an idle connection holds has
            // gone unused for a second and is retracted.
            entries.insert(key, sent);
            self.grant(&mut entries);
            self.share.compact(&entries);
            return out;
        }
        let Some(s) = entries.get_mut(&key) else {
            return out;
        };
        s.hdr = Some((seg.src_mac, seg.dst_mac, seg.src));
        if tcp.fin() {
            s.fin_end = Some(seq.wrapping_add(len).wrapping_add(1));
        }
        let (held, waited) = (s.counted(), s.wait.is_some());
        if tcp.ack() && !tcp.rst() {
            out.window = self.advertise(key, s, tcp);
        }
        // A connection that starts waiting takes back parked windows.
        let reclaim = !waited && s.wait.is_some() && self.share.parked_count.get() > 0;
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
        let freed = s.counted() < held;
        if len == 0 {
            out.seq = renumber_ack(tcp, s);
        } else {
            let end = seq.wrapping_add(len);
            if (end.wrapping_sub(s.next) as i32) > 0 {
                s.next = end;
            }
        }
        if freed || reclaim {
            self.grant(&mut entries);
        }
        self.share.compact(&entries);
        self.fold_update(key, &mut entries, &mut out);
        out
    }

    /// Credit granted to the connection of `flow` while its own segment
    /// (changed as `out` says) is on its way out: that segment carries
    /// the new window and no separate update is sent.
    fn fold_update(
        &self,
        flow: Flow,
        entries: &mut HashMap<Flow, Sent, FlowHash>,
        out: &mut Rewrite,
    ) {
        let Some(s) = entries.get_mut(&flow) else {
            return;
        };
        if !s.update_due {
            return;
        }
        let released = self.release(flow, s);
        if let Some(field) = s.edge_field() {
            s.update_due = false;
            out.window = Some(field);
        }
        if released {
            self.grant(entries);
        }
    }

    /// Our segment `tcp` of the connection `s` (of `flow`) acknowledges:
    /// cut its window field to the connection's share, note what it
    /// holds open and put the connection in the wait queue if the pool
    /// holds it below one segment. Returns the new window field, if cut.
    fn advertise(&self, flow: Flow, s: &mut Sent, tcp: &TcpPacket<&[u8]>) -> Option<u16> {
        let ack = tcp.ack_number().0 as u32;
        let field = tcp.window_len();
        // smoltcp scales every window but a SYN's.
        let shift = if tcp.syn() { 0 } else { s.our_shift };
        let smol = usize::from(field) << shift;
        s.rx_ack = ack;
        if s.arrived_beyond_ack() == 0 {
            // What arrived is all acknowledged (or nothing has yet).
            s.rx_end = ack;
            s.rx_held = false;
        }
        s.smol_edge = ack.wrapping_add(smol as u32);
        let first = s.rx_edge.is_none();
        let mss = self.share.mss;
        let offer = self.share.offer(s.counted());
        // The first window of a connection we opened: at least a segment,
        // for its peer's answer; the first acknowledgement of the answer
        // takes back what the peer left of a segment its share did not
        // hold (see [`WindowShare`]).
        let floor = if first && s.initiated { mss } else { 0 };
        let edge = match s.floored {
            Some(at) if at != ack => {
                s.floored = None;
                None
            }
            _ => s.rx_edge,
        };
        if offer.is_some_and(|o| o < floor) {
            s.floored = Some(ack);
        }
        let cut = offer.and_then(|offer| cut_window(field, shift, ack, edge, offer.max(floor)));
        let open = usize::from(cut.unwrap_or(field)) << shift;
        s.rx_edge = Some(ack.wrapping_add(open as u32));
        // Past the peer's FIN nothing more can come: the window holds
        // nothing, and the connection waits for nothing.
        let finished = s.peer_fin.is_some_and(|f| ack.wrapping_sub(f) as i32 >= 0);
        let held = if finished { 0 } else { open };
        self.share.reopen(s.counted(), held);
        s.rx_open = held;
        if held > 0 {
            self.share.hold(flow, s);
        }
        // A connection waits for credit when its peer has shown it has
        // data: it filled its window or probed it, or sent lately. A new
        // one waits too: its peer's first message (such as an MPA reply)
        // needs a window. One whose peer shows nothing does not, or
        // every connection that only sends would take a segment of the
        // pool at its turn, hold it unused for a second and have it
        // retracted, over and over.
        let lately = s.received_within(1, self.share.period.get());
        if finished {
            self.share.leave(s);
        } else if self.share.cuts()
            && open < mss
            && smol >= open + mss
            && (first || s.filled || lately)
        {
            self.share.enqueue(flow, s);
        }
        cut
    }

    /// Give the pool's free credit to the waiting connections, in their
    /// order, while a turn's worth is free (or what the first one's
    /// smoltcp window takes, if less): each gets its fair part (whole
    /// segments, within smoltcp's own window), its right edge moves, and
    /// its window update is queued. A connection whose smoltcp window has
    /// no room for a segment beyond what it holds leaves the queue with
    /// nothing (its application is not reading; smoltcp's own window
    /// update brings it back).
    fn grant(&self, entries: &mut HashMap<Flow, Sent, FlowHash>) {
        let share = &self.share;
        let Some(fair) = share.bytes() else {
            return;
        };
        self.reclaim(entries);
        let (mss, turn) = (share.mss, share.turn());
        while share.free() >= mss {
            let Some((flow, ticket)) = share.queue.borrow().front().copied() else {
                share.short_since.set(None);
                break;
            };
            let Some(s) = entries.get_mut(&flow).filter(|s| s.wait == Some(ticket)) else {
                share.queue.borrow_mut().pop_front();
                continue;
            };
            let (open, room) = match s.rx_edge {
                Some(edge) => (s.beyond_ack(edge), s.beyond_ack(s.smol_edge)),
                None => (0, 0),
            };
            // A turn for a peer that filled its window (its fair part
            // while peers use whole turns); one segment for one that
            // showed no more to send (a connection that came while the
            // frames were held): such a window is likely to go unused,
            // holding its credit for a second until it is retracted.
            let most = match (s.filled, turn < share.longest_turn()) {
                (false, _) => mss,
                (true, true) => turn,
                (true, false) => fair,
            };
            // Data that arrived past a hole (a lost segment, or a probe's
            // byte past the edge): the window reaches past it by a
            // segment (within half the pool, which is free at some
            // point). At an edge short of it the peer may have no room
            // for anything new, and smoltcp, which stops its
            // retransmission timer when a zero window opens, would then
            // never resend the hole.
            let past = match s.arrived_beyond_ack().saturating_sub(open) {
                0 => 0,
                n => ((n + mss).div_ceil(mss) * mss).min(share.pool() / 2 / mss * mss),
            };
            let want = most.max(past).min(room.saturating_sub(open)) / mss * mss;
            let short = share.free() < want.min(turn) && !share.short_for_long();
            if want > 0 && (short || share.free() < past.min(want)) {
                // The first in line waits for a turn's worth, for a
                // period at most.
                if share.short_since.get().is_none() {
                    share.short_since.set(Some(share.period.get()));
                }
                break;
            }
            share.short_since.set(None);
            share.queue.borrow_mut().pop_front();
            share.leave(s);
            let amount = want.min(share.free()) / mss * mss;
            self.open_to(flow, s, open, amount);
        }
    }

    /// Grant `amount` bytes of credit to the connection of `flow` (`s`),
    /// whose window holds `open`: its right edge moves (in whole units
    /// of its window scale) and its window update is queued. Returns
    /// whether the window grew.
    fn open_to(&self, flow: Flow, s: &mut Sent, open: usize, amount: usize) -> bool {
        let share = &self.share;
        // Whole units of the window scale, within the field.
        let shift = s.our_shift;
        let field = ((open + amount) >> shift).min(usize::from(u16::MAX));
        let new_open = field << shift;
        if amount == 0 || new_open <= open {
            return false;
        }
        share.reopen(s.counted(), new_open);
        s.rx_open = new_open;
        share.unpark(s);
        s.touched = share.period.get();
        share.hold(flow, s);
        s.rx_edge = Some(s.rx_ack.wrapping_add(new_open as u32));
        let cur = share.period.get();
        s.granted = Some(cur);
        s.last_grant = cur;
        s.repeats = 0;
        s.turn = s.filled.then_some(new_open);
        if s.turn.is_some() {
            share.watch(flow, s, cur);
        }
        s.filled = false;
        share.unanswered.borrow_mut().push_back((flow, cur));
        self.queue_update(flow, s);
        true
    }

    /// The window update due for the connection of `flow`, if any: a pure
    /// acknowledgement with our next sequence number (after our FIN, if
    /// sent), the acknowledgement number and right edge last advertised,
    /// and the headers of the connection's last segment. `None` if the
    /// connection is gone or has nothing due. A retraction's update
    /// closes the window as it leaves, and the credit goes to the waiting
    /// connections then ([`Self::release`]).
    fn window_update(&self, flow: Flow) -> Option<WindowUpdate> {
        let mut entries = self.entries.borrow_mut();
        let s = entries.get_mut(&flow)?;
        if !std::mem::take(&mut s.update_due) {
            return None;
        }
        let released = self.release(flow, s);
        let update = match (s.hdr, s.edge_field()) {
            (Some((src_mac, dst_mac, src_ip)), Some(field)) => Some(WindowUpdate {
                src_mac,
                dst_mac,
                src_ip,
                dst_ip: flow.0,
                src_port: flow.2,
                dst_port: flow.1,
                seq: s.fin_end.unwrap_or(s.next),
                ack: s.rx_ack,
                window: field,
            }),
            _ => None,
        };
        if released {
            self.grant(&mut entries);
        }
        update
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
        if tcp.syn() {
            // The peer's SYN-ACK: smoltcp scales our window field from
            // the acknowledgement that ends the handshake on, which
            // leaves in the same poll, before the stack settles the
            // connection's options ([`Self::set_peer`]).
            let options = tcp.options_summary().ok();
            s.settle_our_shift(options.and_then(|o| o.window_scale).is_some());
            if s.initiated && s.rx_edge.is_none() {
                // The peer's data starts after its SYN. Our SYN
                // acknowledged nothing, so nothing marked that before,
                // and a mark left at 0 can lie within a buffer's reach
                // ahead of the peer's sequence numbers: data counted as
                // arrived and never acknowledged.
                let first = (tcp.seq_number().0 as u32).wrapping_add(1);
                s.rx_ack = first;
                s.rx_end = first;
            }
        }
        let ack = tcp.ack_number().0 as u32;
        let seq = tcp.seq_number().0 as u32;
        let closed = s.rx_open == 0 && s.rx_edge.is_some() && s.peer_fin.is_none();
        if closed && !(tcp.payload().is_empty() && seq == s.rx_ack) {
            let n = &self.share.closed_segments;
            n.set(n.get() + 1);
        }
        if tcp.payload().is_empty() && s.rx_open == 0 && (s.rx_ack.wrapping_sub(seq) as i32) > 0 {
            // A zero-window probe as Linux sends it: no data, the
            // sequence number one before what we acknowledged. Its peer
            // has data for the closed window.
            s.filled = true;
        }
        if !tcp.payload().is_empty() {
            let len = tcp.payload().len();
            s.rx_longest = s.rx_longest.max(len);
            s.rx_short = len < s.rx_longest;
            self.share.receiving(&mut s.rx_period);
            self.share.unpark(s);
            self.share.keep(s);
            s.touched = self.share.period.get();
            s.granted = None;
            let end = seq.wrapping_add(tcp.payload().len() as u32);
            if seq.wrapping_sub(s.rx_ack) as i32 > 0
                && s.rx_edge
                    .is_some_and(|edge| edge.wrapping_sub(end) as i32 >= 0)
            {
                s.rx_held = true;
            }
            if s.rx_edge
                .is_some_and(|edge| end.wrapping_sub(edge) as i32 >= 0)
            {
                s.filled = true;
                if s.turn.take().is_some() {
                    self.share.turn_used(None);
                }
            }
            // A segment's end up to a buffer's reach past our
            // acknowledgement (anything further is outside every window
            // smoltcp offers, and a corrupted sequence number no mark).
            let ahead = s.beyond_ack(end);
            if ahead <= crate::MAX_BUFFER && ahead > s.arrived_beyond_ack() {
                s.rx_end = end;
            }
        }
        if tcp.fin() && tcp.verify_checksum(&IpAddress::Ipv4(seg.src), &IpAddress::Ipv4(seg.dst)) {
            // The acknowledgement that covers it.
            let len = tcp.payload().len() as u32 + u32::from(tcp.syn());
            let seq = tcp.seq_number().0 as u32;
            s.peer_fin = Some(seq.wrapping_add(len).wrapping_add(1));
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

/// A window update the device wrapper sends for a connection granted
/// credit ([`WindowShare`]): a pure acknowledgement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WindowUpdate {
    src_mac: EthernetAddress,
    dst_mac: EthernetAddress,
    src_ip: Ipv4Address,
    dst_ip: Ipv4Address,
    src_port: u16,
    dst_port: u16,
    seq: u32,
    ack: u32,
    /// The window field (scaled by our shift).
    window: u16,
}

impl WindowUpdate {
    /// Its frame's length.
    fn len(&self) -> usize {
        EthernetFrame::<&[u8]>::header_len() + IPV4_HEADER_LEN + TCP_HEADER_LEN
    }

    /// Write the frame into `buf` (of [`len`](Self::len) bytes), its
    /// checksums as `caps` say the device leaves them to us.
    fn emit(&self, buf: &mut [u8], caps: &ChecksumCapabilities) {
        let tcp = TcpRepr {
            src_port: self.src_port,
            dst_port: self.dst_port,
            control: TcpControl::None,
            seq_number: TcpSeqNumber(self.seq as i32),
            ack_number: Some(TcpSeqNumber(self.ack as i32)),
            window_len: self.window,
            window_scale: None,
            max_seg_size: None,
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload: &[],
        };
        let ip = Ipv4Repr {
            src_addr: self.src_ip,
            dst_addr: self.dst_ip,
            next_header: IpProtocol::Tcp,
            payload_len: tcp.buffer_len(),
            hop_limit: 64,
        };
        let eth = EthernetRepr {
            src_addr: self.src_mac,
            dst_addr: self.dst_mac,
            ethertype: EthernetProtocol::Ipv4,
        };
        let mut frame = EthernetFrame::new_unchecked(buf);
        eth.emit(&mut frame);
        let mut packet = Ipv4Packet::new_unchecked(frame.payload_mut());
        ip.emit(&mut packet, caps);
        let mut segment = TcpPacket::new_unchecked(packet.payload_mut());
        tcp.emit(
            &mut segment,
            &IpAddress::Ipv4(self.src_ip),
            &IpAddress::Ipv4(self.dst_ip),
            caps,
        );
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
    src_mac: EthernetAddress,
    dst_mac: EthernetAddress,
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
            src_mac: eth.src_addr(),
            dst_mac: eth.dst_addr(),
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
    /// The device had no frame for a frame to send since this was last
    /// cleared (the stack clears it at the start of each egress).
    pub tx_refused: bool,
}

impl<D> Port<D> {
    pub(crate) fn new(inner: D) -> Self {
        Self {
            tcp_checksum: true,
            tx_refused: false,
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

    /// Send the window updates due ([`WindowShare`]), in the order the
    /// credit was granted, at most [`UPDATES_PER_CALL`] and as far as the
    /// device takes frames (the rest wait for the next call). Returns
    /// whether one was sent.
    pub(crate) fn send_window_updates(&mut self, now: Instant) -> bool
    where
        D: Device,
    {
        if !self.sent.updates_due() {
            return false;
        }
        let caps = self.inner.capabilities().checksum;
        let mut sent = false;
        for _ in 0..UPDATES_PER_CALL {
            let Some(flow) = self.sent.updates.borrow().front().copied() else {
                break;
            };
            self.sent.updates.borrow_mut().pop_front();
            let Some(update) = self.sent.window_update(flow) else {
                continue;
            };
            // Straight to the device: the table already holds what the
            // update says, and the window it carries is not smoltcp's (as
            // the table's record of smoltcp's own window, it would hide
            // the room smoltcp has).
            let Some(tx) = self.inner.transmit(now) else {
                self.tx_refused = true;
                self.sent.requeue(flow);
                break;
            };
            self.counters.transmitted(update.len());
            phy::TxToken::consume(tx, update.len(), |buf| update.emit(buf, &caps));
            bump(&self.counters.window_updates, 1);
            sent = true;
        }
        sent
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

/// Change the TCP segment in `frame` as `how` says, its checksum updated
/// if smoltcp fills checksums.
fn rewrite(frame: &mut [u8], how: Rewrite, checksum: bool) {
    let ip_start = EthernetFrame::<&[u8]>::header_len();
    let Some(ip_bytes) = frame.get_mut(ip_start..) else {
        return;
    };
    let Ok(mut ip) = Ipv4Packet::new_checked(ip_bytes) else {
        return;
    };
    let tcp_len = usize::from(ip.total_len()).saturating_sub(usize::from(ip.header_len()));
    let Some(tcp_bytes) = ip.payload_mut().get_mut(..tcp_len) else {
        return;
    };
    let Ok(mut tcp) = TcpPacket::new_checked(tcp_bytes) else {
        return;
    };
    // The checksum is updated for the changed fields alone (RFC 1624),
    // not summed again over the payload: nearly every data segment has
    // its window cut once many connections share the frames.
    let mut sum = tcp.checksum();
    if let Some(seq) = how.seq {
        let old = tcp.seq_number().0 as u32;
        sum = csum_replace(sum, (old >> 16) as u16, (seq >> 16) as u16);
        sum = csum_replace(sum, old as u16, seq as u16);
        tcp.set_seq_number(TcpSeqNumber(seq as i32));
    }
    if let Some(window) = how.window {
        sum = csum_replace(sum, tcp.window_len(), window);
        tcp.set_window_len(window);
    }
    if checksum {
        tcp.set_checksum(sum);
    }
}

/// The Internet checksum `sum` of data in which the 16-bit word `old`
/// became `new` (RFC 1624, eqn. 3: `~(~sum + ~old + new)`, in ones'
/// complement arithmetic).
fn csum_replace(sum: u16, old: u16, new: u16) -> u16 {
    let mut acc = u32::from(!sum) + u32::from(!old) + u32::from(new);
    acc = (acc & 0xffff) + (acc >> 16);
    acc = (acc & 0xffff) + (acc >> 16);
    !(acc as u16)
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
                counters.transmitted(len);
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
        let Some(token) = self.inner.transmit(timestamp) else {
            self.tx_refused = true;
            return None;
        };
        Some(PortTx::Device {
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
        // Nothing left: nothing, the window closes; the holders keep
        // theirs.
        share.reopen(0, 2000);
        assert_eq!(share.offer(0), Some(0));
        assert_eq!(share.offer(2000), Some(2000));
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

    /// The connection PEER:`port` ↔ US:7174: its key and a segment of it
    /// (`segment` with the peer's port replaced).
    fn flow(port: u16) -> Flow {
        (PEER, port, 7174)
    }

    fn seg_of(
        port: u16,
        outgoing: bool,
        syn: bool,
        seq: u32,
        ack: Option<u32>,
        window: u16,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut f = segment(outgoing, syn, seq, ack, window, payload);
        let at = if outgoing { 36 } else { 34 };
        f[at..at + 2].copy_from_slice(&port.to_be_bytes());
        let (src, dst) = if outgoing { (US, PEER) } else { (PEER, US) };
        TcpPacket::new_unchecked(&mut f[34..])
            .fill_checksum(&IpAddress::Ipv4(src), &IpAddress::Ipv4(dst));
        f
    }

    /// Send `frame` through the table as the transmit token does; the
    /// window field it leaves with (its checksum checked).
    fn send(t: &SentTable, frame: &[u8]) -> u16 {
        let mut f = frame.to_vec();
        let how = t.observe_sent(&Segment::parse(&f, true).unwrap());
        rewrite(&mut f, how, true);
        let seg = Segment::parse(&f, true).unwrap();
        assert!(seg
            .tcp
            .verify_checksum(&IpAddress::Ipv4(US), &IpAddress::Ipv4(PEER)));
        seg.tcp.window_len()
    }

    /// The window updates due, in order, as (port, seq, ack, window).
    fn updates(t: &SentTable) -> Vec<(u16, u32, u32, u16)> {
        let mut out = Vec::new();
        loop {
            let Some(flow) = t.updates.borrow_mut().pop_front() else {
                break;
            };
            if let Some(u) = t.window_update(flow) {
                assert_eq!((u.src_ip, u.dst_ip, u.src_port), (US, PEER, 7174));
                out.push((u.dst_port, u.seq, u.ack, u.window));
            }
        }
        out
    }

    /// A connection of the table established by a SYN-ACK of ours
    /// (unscaled, left alone) and acknowledged by the first segment after
    /// it, which carries smoltcp's window of 60000: the window that one
    /// left with.
    fn establish(t: &SentTable, port: u16) -> u16 {
        assert_eq!(
            send(t, &seg_of(port, true, true, 999, Some(1), 60000, &[])),
            60000
        );
        send(t, &seg_of(port, true, false, 1000, Some(1), 60000, &[]))
    }

    /// A wave of window updates leaves [`UPDATES_PER_CALL`] at a time, in
    /// the order they were queued, each call taking the next ones.
    #[test]
    fn window_updates_leave_a_bounded_number_per_call() {
        let mut port = Port::new(crate::sim::SimPort::new(1514));
        port.sent = SentTable {
            share: WindowShare::new(1 << 16, 1000),
            ..SentTable::default()
        };
        let n = 2 * UPDATES_PER_CALL + 5;
        let ports: Vec<u16> = (0..n).map(|i| 40000 + i as u16).collect();
        for &p in &ports {
            establish(&port.sent, p);
            let mut entries = port.sent.entries.borrow_mut();
            port.sent
                .queue_update(flow(p), entries.get_mut(&flow(p)).unwrap());
        }
        let now = Instant::from_millis(0);
        let mut calls = Vec::new();
        while port.sent.updates_due() {
            assert!(port.send_window_updates(now));
            let sent: Vec<u16> = port
                .inner
                .tx
                .drain(..)
                .map(|f| Segment::parse(&f, true).unwrap().tcp.dst_port())
                .collect();
            calls.push(sent);
        }
        let sizes: Vec<usize> = calls.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![UPDATES_PER_CALL, UPDATES_PER_CALL, 5]);
        assert_eq!(calls.concat(), ports);
        assert!(!port.send_window_updates(now));
    }

    #[test]
    fn segments_of_a_connection_carry_its_share() {
        let t = SentTable {
            share: WindowShare::new(4, 1000),
            ..SentTable::default()
        };
        // One connection: all four frames, from its SYN-ACK on.
        assert_eq!(establish(&t, 40000), 4000);
        rx(
            &t,
            &seg_of(40000, false, false, 1, Some(1000), 100, &[1; 10]),
        );
        assert_eq!(
            send(&t, &seg_of(40000, true, false, 1000, Some(11), 60000, &[])),
            4000
        );
        // smoltcp's own window is smaller: it stands.
        assert_eq!(
            send(&t, &seg_of(40000, true, false, 1000, Some(11), 3000, &[])),
            3000
        );
        assert_eq!(t.share.open.get(), 3000);
        // Another connection gets what is left; a third nothing: its
        // window is closed and it waits.
        assert_eq!(establish(&t, 40001), 1000);
        assert_eq!(establish(&t, 40002), 0);
        assert_eq!(t.share.waiting.get(), 1);
        // While it waits, no window grows: the first one's edge (11 +
        // 3000) holds, what its peer filled comes back and goes to the
        // waiting one, with a window update.
        assert_eq!(
            send(
                &t,
                &seg_of(40000, true, false, 1000, Some(1011), 60000, &[])
            ),
            2000
        );
        assert_eq!(updates(&t), vec![(40002, 1000, 1, 1000)]);
        assert_eq!(t.share.waiting.get(), 0);
        assert_eq!(t.share.open.get(), 4000);
        // A SYN sent again restarts a connection: its open window is no
        // longer counted.
        assert_eq!(establish(&t, 40001), 1000, "what it held is free again");
        assert_eq!(t.share.open.get(), 4000);
        assert_eq!(establish(&t, 40003), 0);
        // A connection that goes gives its window to the one waiting.
        t.forget(flow(40001));
        assert_eq!(updates(&t), vec![(40003, 1000, 1, 1000)]);
        assert_eq!((t.share.open.get(), t.share.waiting.get()), (4000, 0));
    }

    /// The checksum of a rewritten segment, updated for the changed
    /// fields alone, is the one summed over the whole segment: for any
    /// payload, sequence number and window, old and new.
    #[test]
    fn a_rewritten_segment_keeps_a_valid_checksum() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..2000 {
            let len = (next() % 1500) as usize;
            let payload: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let (seq, window) = (next() as u32, next() as u16);
            let mut f = segment(true, false, seq, Some(next() as u32), window, &payload);
            let how = Rewrite {
                seq: (i % 3 != 0).then(|| next() as u32),
                window: (i % 3 != 1).then(|| [0, u16::MAX, next() as u16][i / 3 % 3]),
            };
            rewrite(&mut f, how, true);
            let seg = Segment::parse(&f, true).unwrap();
            assert!(seg
                .tcp
                .verify_checksum(&IpAddress::Ipv4(US), &IpAddress::Ipv4(PEER)));
            assert_eq!(seg.tcp.seq_number().0 as u32, how.seq.unwrap_or(seq));
            assert_eq!(seg.tcp.window_len(), how.window.unwrap_or(window));
        }
    }

    /// The peer's SYN-ACK to our SYN (sequence number 999) from `port`:
    /// its ISN, window field and window scale option, an MSS of 1000.
    fn peer_synack(port: u16, isn: u32, window: u16, scale: Option<u8>) -> Vec<u8> {
        let synack = TcpRepr {
            src_port: port,
            dst_port: 7174,
            control: TcpControl::Syn,
            seq_number: TcpSeqNumber(isn as i32),
            ack_number: Some(TcpSeqNumber(1000)),
            window_len: window,
            window_scale: scale,
            max_seg_size: Some(1000),
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload: &[],
        };
        frame(PEER, US, &synack, false)
    }

    /// A connection we open holds nothing unacknowledged once its
    /// handshake is done and what its peer sent is acknowledged, wherever
    /// the peer's sequence numbers start: one whose peer started in the
    /// last quarter of the sequence space used to count data as arrived
    /// beyond every acknowledgement, for good, and its quiet buffers
    /// were never given back.
    #[test]
    fn a_connection_we_open_holds_nothing_once_acknowledged() {
        for (port, isn) in [
            (40000, 0x1000_0000u32),
            (40001, 0xF000_0000),
            (40002, u32::MAX),
        ] {
            let t = SentTable {
                share: WindowShare::new(64, 1000),
                ..SentTable::default()
            };
            let held = |t: &SentTable| t.get(flow(port)).unwrap().holds_unacknowledged();
            send(&t, &seg_of(port, true, true, 999, None, 60000, &[]));
            rx(&t, &peer_synack(port, isn, 60000, None));
            let first = isn.wrapping_add(1);
            send(
                &t,
                &seg_of(port, true, false, 1000, Some(first), 60000, &[]),
            );
            assert!(!held(&t), "ISN {isn:#x}: after the handshake");
            // The peer's answer, held until we acknowledge it.
            rx(
                &t,
                &seg_of(port, false, false, first, Some(1000), 60000, &[1; 20]),
            );
            assert!(held(&t), "ISN {isn:#x}: the answer, not yet acknowledged");
            let after = first.wrapping_add(20);
            send(
                &t,
                &seg_of(port, true, false, 1000, Some(after), 60000, &[]),
            );
            assert!(!held(&t), "ISN {isn:#x}: the answer acknowledged");
        }
    }

    /// A connection we open is offered a segment by the acknowledgement
    /// that ends its handshake, however the frames are held, so that its
    /// peer's answer to its first message can come; past that answer it
    /// waits for credit like the others.
    #[test]
    fn a_connection_we_open_gets_a_segment_for_its_peers_answer() {
        let t = SentTable {
            share: WindowShare::new(4, 1000),
            ..SentTable::default()
        };
        // Connections the peer opened: the first holds the whole pool,
        // the next gets nothing and waits.
        assert_eq!(establish(&t, 40000), 4000);
        assert_eq!(establish(&t, 40001), 0);
        assert_eq!(t.share.waiting.get(), 1);
        // One we open: our SYN carries no acknowledgement (its window is
        // left alone); the acknowledgement of the peer's SYN-ACK, with
        // our first message, offers a segment.
        assert_eq!(
            send(&t, &seg_of(40002, true, true, 999, None, 60000, &[])),
            60000
        );
        assert_eq!(
            send(&t, &seg_of(40002, true, false, 1000, Some(1), 60000, &[])),
            1000
        );
        // Our first message, which acknowledges nothing new, keeps it.
        assert_eq!(
            send(
                &t,
                &seg_of(40002, true, false, 1000, Some(1), 60000, &[5; 30])
            ),
            1000
        );
        assert_eq!(t.share.waiting.get(), 1, "it does not wait yet");
        // The answer arrives; our acknowledgement takes back the rest of
        // that segment (the share holds nothing for it): the connection
        // now waits, and the pool holds no more than its frames.
        rx(
            &t,
            &seg_of(40002, false, false, 1, Some(1030), 100, &[1; 20]),
        );
        assert_eq!(
            send(&t, &seg_of(40002, true, false, 1030, Some(21), 60000, &[])),
            0
        );
        assert_eq!(t.share.waiting.get(), 2);
        assert_eq!(t.share.open.get(), 4000);
        // A connection the peer opened gets no such segment.
        assert_eq!(establish(&t, 40003), 0);
        // With window scaling: the peer's SYN-ACK offers scaling, so
        // smoltcp scales the acknowledgement that follows in the same
        // poll, before the stack settles the options; the segment is
        // offered in units of the scale (1000 bytes = 250 × 4).
        send(&t, &seg_of(40004, true, true, 999, None, 60000, &[]));
        t.entries
            .borrow_mut()
            .get_mut(&flow(40004))
            .unwrap()
            .our_scale = Some(2);
        rx(&t, &peer_synack(40004, 0, 100, Some(3)));
        assert_eq!(
            send(
                &t,
                &seg_of(40004, true, false, 1000, Some(1), 15000, &[5; 30])
            ),
            250
        );
    }

    /// More connections than frames: a connection's share may be zero;
    /// credit freed by a peer that filled its window goes to the waiting
    /// connections in their order, each with a window update carrying
    /// our next sequence number, the acknowledgement and the reopened
    /// window (scaled); a connection whose segment is leaving when it is
    /// granted credit carries the window itself.
    #[test]
    fn a_held_pool_closes_windows_and_freed_credit_reopens_them_in_order() {
        let t = SentTable {
            share: WindowShare::new(2, 1000),
            ..SentTable::default()
        };
        // Scaled by 2: the SYN-ACKs offer window scale 2 (the test's
        // segments carry none, so set it as smoltcp's SYN-ACK would).
        for port in 40000..40004 {
            send(&t, &seg_of(port, true, true, 999, Some(1), 60000, &[]));
            t.entries
                .borrow_mut()
                .get_mut(&flow(port))
                .unwrap()
                .our_scale = Some(2);
            let syn = SynOptions {
                mss: Some(1000),
                window_scale: Some(2),
            };
            t.set_peer(flow(port), syn);
            send(&t, &seg_of(port, true, false, 1000, Some(1), 15000, &[]));
        }
        // The first one takes the whole pool (nobody received yet); the
        // others wait, in their order.
        let open: Vec<usize> = (40000..40004)
            .map(|p| t.get(flow(p)).unwrap().rx_window().unwrap())
            .collect();
        assert_eq!(open, vec![2000, 0, 0, 0]);
        let order = |t: &SentTable| -> Vec<u16> {
            t.share.queue.borrow().iter().map(|(f, _)| f.1).collect()
        };
        assert_eq!(order(&t), vec![40001, 40002, 40003]);
        // Our data moves our sequence number, which an update carries.
        send(
            &t,
            &seg_of(40002, true, false, 1000, Some(1), 15000, &[7; 300]),
        );
        // 40000's peer sends a segment; smoltcp acknowledges it (window
        // 15000 × 4): the edge stays, the window shrinks to what is left
        // and the freed frame goes to 40001, with an update.
        rx(
            &t,
            &seg_of(40000, false, false, 1, Some(1000), 100, &[1; 1000]),
        );
        assert_eq!(
            send(
                &t,
                &seg_of(40000, true, false, 1000, Some(1001), 15000, &[])
            ),
            250
        );
        assert_eq!(updates(&t), vec![(40001, 1000, 1, 250)]);
        // It fills the rest: its window closes, the frame goes to 40002,
        // and 40000 queues behind 40003.
        assert_eq!(
            send(
                &t,
                &seg_of(40000, true, false, 1000, Some(2001), 15000, &[])
            ),
            0
        );
        assert_eq!(updates(&t), vec![(40002, 1300, 1, 250)]);
        assert_eq!(order(&t), vec![40003, 40000]);
        // 40001's peer fills its window: 40003 is next.
        rx(
            &t,
            &seg_of(40001, false, false, 1, Some(1000), 100, &[1; 1000]),
        );
        send(
            &t,
            &seg_of(40001, true, false, 1000, Some(1001), 15000, &[]),
        );
        assert_eq!(updates(&t), vec![(40003, 1000, 1, 250)]);
        assert_eq!(order(&t), vec![40000, 40001]);
        // Never more open than the frames.
        assert_eq!(t.share.open.get(), 2000);
        // A window update leaves through the table like any segment:
        // nothing changes.
        let u = WindowUpdate {
            src_mac: EthernetAddress([2, 0, 0, 0, 0, 2]),
            dst_mac: EthernetAddress([2, 0, 0, 0, 0, 1]),
            src_ip: US,
            dst_ip: PEER,
            src_port: 7174,
            dst_port: 40003,
            seq: 1000,
            ack: 1,
            window: 250,
        };
        let mut frame = vec![0; u.len()];
        u.emit(&mut frame, &ChecksumCapabilities::default());
        let seg = Segment::parse(&frame, true).unwrap();
        assert!(seg.tcp.ack() && !seg.tcp.syn() && seg.tcp.payload().is_empty());
        assert_eq!(send(&t, &frame), 250);
        assert_eq!(t.share.open.get(), 2000);
        // A zero-window probe of 40000's peer: smoltcp takes the byte and
        // acknowledges it; the window stays closed (nothing is free).
        assert_eq!(
            send(
                &t,
                &seg_of(40000, true, false, 1000, Some(2002), 15000, &[])
            ),
            0
        );
        assert_eq!(updates(&t), vec![]);

        // Credit a connection frees while it waits behind others: they
        // get their part first, it the rest, in the window of the very
        // segment that freed it (no separate update).
        let t = SentTable {
            share: WindowShare::new(2, 1000),
            ..SentTable::default()
        };
        assert_eq!(establish(&t, 40000), 2000);
        assert_eq!(establish(&t, 40001), 0);
        rx(
            &t,
            &seg_of(40000, false, false, 1, Some(1000), 100, &[1; 2000]),
        );
        assert_eq!(
            send(
                &t,
                &seg_of(40000, true, false, 1000, Some(2001), 60000, &[])
            ),
            1000
        );
        assert_eq!(updates(&t), vec![(40001, 1000, 1, 1000)]);
        assert_eq!(t.share.open.get(), 2000);
    }

    /// A connection that is gone or whose peer's FIN is acknowledged
    /// gives its credit back, and a waiting one that is gone leaves the
    /// queue: the next one gets the credit.
    #[test]
    fn closing_connections_return_credit_and_leave_the_queue() {
        let t = SentTable {
            share: WindowShare::new(1, 1000),
            ..SentTable::default()
        };
        for port in 40000..40003 {
            establish(&t, port);
        }
        assert_eq!(t.share.waiting.get(), 2);
        // 40001 waits first, but goes: it leaves the queue.
        t.forget(flow(40001));
        assert_eq!(t.share.waiting.get(), 1);
        assert_eq!(updates(&t), vec![]);
        // 40000's peer sends its FIN; our acknowledgement of it frees the
        // window although its edge stays: 40002 gets it.
        rx(
            &t,
            &seg_of(40000, false, false, 1, Some(1000), 100, &[1; 10]),
        );
        let mut fin = seg_of(40000, false, false, 11, Some(1000), 100, &[]);
        fin[47] |= 0x01;
        let mut p = TcpPacket::new_unchecked(&mut fin[34..]);
        p.fill_checksum(&IpAddress::Ipv4(PEER), &IpAddress::Ipv4(US));
        rx(&t, &fin);
        assert_eq!(
            send(&t, &seg_of(40000, true, false, 1000, Some(12), 60000, &[])),
            989
        );
        assert_eq!(updates(&t), vec![(40002, 1000, 1, 1000)]);
        assert_eq!(t.share.open.get(), 1000);
        // 40002 goes: everything is free, nobody waits.
        t.forget(flow(40002));
        assert_eq!((t.share.open.get(), t.share.waiting.get()), (0, 0));
        // Stale queue entries are dropped once they outnumber the live
        // ones: connections that come and go while the pool is held.
        let t = SentTable {
            share: WindowShare::new(1, 1000),
            ..SentTable::default()
        };
        establish(&t, 1);
        for port in 2..1000u16 {
            establish(&t, port);
            t.forget(flow(port));
        }
        assert_eq!(t.share.waiting.get(), 0);
        assert!(
            t.share.queue.borrow().len() <= 66,
            "{}",
            t.share.queue.borrow().len()
        );
    }

    /// A window whose peer sends nothing for `UNUSED_PERIODS` while
    /// another connection waits is retracted: a window update closes it
    /// (its right edge moves back to the acknowledgement), its credit goes
    /// to the waiting connection, and it is counted again once the
    /// connection advertises anew; a connection that receives keeps its
    /// window.
    #[test]
    fn an_unused_window_is_retracted_for_waiting_connections() {
        let t = held_by_40000(2);
        let p = SHARE_PERIOD_MS;
        let unused = UNUSED_PERIODS as i64;
        // 40000's peer sends: it is not idle. smoltcp acknowledges, the
        // edge stays.
        t.tick(Instant::from_millis(p));
        rx(
            &t,
            &seg_of(40000, false, false, 1, Some(1000), 100, &[1; 10]),
        );
        assert_eq!(
            send(&t, &seg_of(40000, true, false, 1000, Some(11), 60000, &[])),
            1990
        );
        t.tick(Instant::from_millis(unused * p));
        t.tick(Instant::from_millis(unused * p + p / 2));
        assert_eq!(updates(&t), vec![]);
        // A whole `UNUSED_PERIODS` without: its window is retracted (a
        // zero window at our last acknowledgement), 40001 gets of the
        // pool what a peer that has not filled a window gets: a segment.
        t.tick(Instant::from_millis((unused + 1) * p));
        assert_eq!(updates(&t), vec![]);
        let retracted_at = 2 * unused * p;
        t.tick(Instant::from_millis(retracted_at));
        assert_eq!(
            updates(&t),
            vec![(40000, 1000, 11, 0), (40001, 1000, 1, 1000)]
        );
        assert_eq!(t.share.open.get(), 1000);
        assert_eq!(t.share.retracted.get(), 1);
        // 40000's peer sent lately: it may wait for a retransmission
        // timeout, which fires into the closed window. It is nudged, its
        // zero window sent again, `NUDGE_PERIODS` later, and again after
        // twice as long while its peer sends nothing, holding no credit.
        t.forget(flow(40001));
        assert_eq!(t.share.open.get(), 0);
        let nudge = NUDGE_PERIODS as i64 * p;
        t.tick(Instant::from_millis(retracted_at + nudge - p));
        assert_eq!(updates(&t), vec![]);
        t.tick(Instant::from_millis(retracted_at + nudge));
        assert_eq!(updates(&t), vec![(40000, 1000, 11, 0)]);
        t.tick(Instant::from_millis(retracted_at + 3 * nudge - p));
        assert_eq!(updates(&t), vec![]);
        t.tick(Instant::from_millis(retracted_at + 3 * nudge));
        assert_eq!(updates(&t), vec![(40000, 1000, 11, 0)]);
        // Its peer answers with a probe (smoltcp's: a byte past the
        // window): no third nudge. With the pool free, our
        // acknowledgement of the probe opens its window.
        rx(&t, &seg_of(40000, false, false, 11, Some(1000), 100, &[2]));
        assert_eq!(
            send(&t, &seg_of(40000, true, false, 1000, Some(11), 60000, &[])),
            2000
        );
        t.tick(Instant::from_millis(retracted_at + 7 * nudge));
        assert_eq!(updates(&t), vec![]);
        assert_eq!(t.share.nudged.get(), 2);
    }

    /// A window its peer leaves unused while no connection waits stays
    /// held, parked: nothing is sent, nothing is due. The first
    /// connection that then waits takes it back at once: the parked
    /// window is retracted (oldest first), and its credit goes to the
    /// waiting connection as the update that closes it leaves, not
    /// before.
    #[test]
    fn a_parked_window_is_retracted_when_a_connection_waits() {
        let t = SentTable {
            share: WindowShare::new(2, 1000),
            ..SentTable::default()
        };
        t.tick(Instant::from_millis(0));
        assert_eq!(establish(&t, 40000), 2000);
        let p = SHARE_PERIOD_MS;
        t.tick(Instant::from_millis(UNUSED_PERIODS as i64 * p));
        assert_eq!(updates(&t), vec![]);
        assert_eq!((t.share.open.get(), t.due()), (2000, None));
        assert_eq!(t.share.parked_count.get(), 1);
        // 40001 comes: held out at first, it waits, and takes the parked
        // credit: a segment (its peer has shown nothing more).
        assert_eq!(establish(&t, 40001), 0);
        assert_eq!(t.share.open.get(), 2000);
        assert_eq!(
            updates(&t),
            vec![(40000, 1000, 1, 0), (40001, 1000, 1, 1000)]
        );
        assert_eq!((t.share.open.get(), t.share.waiting.get()), (1000, 0));
        assert_eq!(t.share.parked_count.get(), 0);
        // A parked window whose peer sends again is no longer parked: the
        // next connection that waits finds nothing to take back.
        t.tick(Instant::from_millis(2 * UNUSED_PERIODS as i64 * p));
        assert_eq!(t.share.parked_count.get(), 1);
        // (The tick also repeated 40001's unanswered update.)
        assert_eq!(updates(&t), vec![(40001, 1000, 1, 1000)]);
        rx(
            &t,
            &seg_of(40001, false, false, 1, Some(1000), 100, &[1; 10]),
        );
        assert_eq!(t.share.parked_count.get(), 0);
        assert_eq!(establish(&t, 40002), 1000);
        assert_eq!(updates(&t), vec![]);
        assert_eq!(establish(&t, 40003), 0);
        assert_eq!(updates(&t), vec![]);
        assert_eq!(t.share.waiting.get(), 1);
    }

    /// A connection waits for credit only when its peer has shown data
    /// to send: a new one (at its first acknowledgement), or one whose
    /// peer filled or probed its window or sent lately. One whose peer
    /// only acknowledges what we send does not wait, or it would take a
    /// segment of the pool at its turn and leave it unused. A probe as
    /// Linux sends it (no data, the sequence number before our
    /// acknowledgement) shows data.
    #[test]
    fn only_connections_whose_peers_have_data_wait() {
        let t = held_by_40000(1);
        assert_eq!(t.share.waiting.get(), 1);
        let p = SHARE_PERIOD_MS;
        t.tick(Instant::from_millis(UNUSED_PERIODS as i64 * p));
        assert_eq!(
            updates(&t),
            vec![(40000, 1000, 1, 0), (40001, 1000, 1, 1000)]
        );
        // 40000 sends data of its own; its peer has sent nothing: its
        // window stays closed and it does not wait.
        assert_eq!(
            send(
                &t,
                &seg_of(40000, true, false, 1000, Some(1), 60000, &[5; 100])
            ),
            0
        );
        assert_eq!(t.share.waiting.get(), 0);
        // Its peer probes the closed window (a segment at a closed
        // window); our acknowledgement of the probe puts it in the queue.
        assert_eq!(t.share.closed_segments.get(), 0);
        rx(&t, &seg_of(40000, false, false, 0, Some(1100), 100, &[]));
        assert_eq!(t.share.closed_segments.get(), 1);
        assert_eq!(
            send(&t, &seg_of(40000, true, false, 1100, Some(1), 60000, &[])),
            0
        );
        assert_eq!(t.share.waiting.get(), 1);
    }

    /// The steps the share takes with time alone say when they are due
    /// ([`SentTable::due`]): the check of a held window for use, each
    /// repeat of an unanswered window update, and nothing once no window
    /// is held or unanswered.
    #[test]
    fn the_share_says_when_its_next_step_is_due() {
        let t = held_by_40000(2);
        let p = SHARE_PERIOD_MS;
        let at = |periods: u64| Some(Instant::from_millis(periods as i64 * p));
        // 40000 holds the pool since period 0: it is looked at after
        // UNUSED_PERIODS.
        assert_eq!(t.due(), at(UNUSED_PERIODS));
        // Not before: nothing happens at the period before.
        t.tick(Instant::from_millis((UNUSED_PERIODS as i64 - 1) * p));
        assert_eq!(updates(&t), vec![]);
        assert_eq!(t.due(), at(UNUSED_PERIODS));
        // Then it is retracted and 40001 is granted a segment; the
        // update's repeats come every REPEAT_PERIODS, MAX_REPEATS of them.
        t.tick(Instant::from_millis(UNUSED_PERIODS as i64 * p));
        assert_eq!(
            updates(&t),
            vec![(40000, 1000, 1, 0), (40001, 1000, 1, 1000)]
        );
        let mut cur = UNUSED_PERIODS;
        for _ in 0..MAX_REPEATS {
            assert_eq!(t.due(), at(cur + REPEAT_PERIODS));
            cur += REPEAT_PERIODS;
            t.tick(Instant::from_millis(cur as i64 * p));
            assert_eq!(updates(&t), vec![(40001, 1000, 1, 1000)]);
        }
        // The last repeat gives up at its turn; 40001's window is looked
        // at UNUSED_PERIODS after its grant, and parked then (its peer
        // sent nothing, none waits): nothing is due.
        assert_eq!(t.due(), at(cur + REPEAT_PERIODS));
        cur += REPEAT_PERIODS;
        t.tick(Instant::from_millis(cur as i64 * p));
        assert_eq!(updates(&t), vec![]);
        assert_eq!(t.due(), at(2 * UNUSED_PERIODS));
        t.tick(Instant::from_millis(2 * UNUSED_PERIODS as i64 * p));
        assert_eq!((t.share.open.get(), t.due()), (1000, None));
        assert_eq!(t.share.parked_count.get(), 1);
        // A step that came due while the table was not ticked is due at
        // once (the next period), not in the past.
        let t = held_by_40000(2);
        t.share.period.set(5 * UNUSED_PERIODS);
        assert_eq!(t.due(), at(5 * UNUSED_PERIODS + 1));
    }

    /// A table of `frames` frames of 1000 bytes where 40000 holds the
    /// pool and 40001 waits.
    fn held_by_40000(frames: usize) -> SentTable {
        let t = SentTable {
            share: WindowShare::new(frames, 1000),
            ..SentTable::default()
        };
        t.tick(Instant::from_millis(0));
        assert_eq!(usize::from(establish(&t, 40000)), frames * 1000);
        assert_eq!(establish(&t, 40001), 0);
        t
    }

    /// A table of 32 frames of 1000 bytes where 40000 holds the pool and
    /// 40001 and 40002 wait, in that order.
    fn pool_held_by_40000() -> SentTable {
        let t = held_by_40000(32);
        assert_eq!(establish(&t, 40002), 0);
        assert_eq!(t.share.waiting.get(), 2);
        // Their peers have more to send: each probes its closed window.
        for port in [40001, 40002] {
            rx(&t, &seg_of(port, false, false, 1, Some(1000), 100, &[7]));
        }
        t
    }

    /// [`pool_held_by_40000`] after 40000's peer filled eight segments: a
    /// turn each for 40001 and 40002, their window updates sent.
    fn two_turns_granted() -> SentTable {
        let t = pool_held_by_40000();
        for k in 1..=8u32 {
            fill_40000(&t, k);
        }
        let turn = |port| (port, 1000, 1, 4000);
        assert_eq!(updates(&t), vec![turn(40001), turn(40002)]);
        t
    }

    /// 40000's peer sends its `k`-th segment (from 1) and we acknowledge
    /// it: the window that acknowledgement left with.
    fn fill_40000(t: &SentTable, k: u32) -> u16 {
        let data = seg_of(
            40000,
            false,
            false,
            1 + (k - 1) * 1000,
            Some(1000),
            100,
            &[7; 1000],
        );
        rx(t, &data);
        send(
            t,
            &seg_of(40000, true, false, 1000, Some(1 + k * 1000), 60000, &[]),
        )
    }

    /// A connection is offered what the others' windows leave, up to its
    /// fair part, while that is a turn or more; less than a turn, its
    /// window is not slid along with its acknowledgements (a few segments
    /// wide, each segment or two acknowledged on its own) but used up,
    /// and it waits for a turn.
    #[test]
    fn less_than_a_turn_left_is_not_offered() {
        let share = WindowShare::new(32, 1000);
        assert_eq!(share.turn(), 4000);
        // Alone: the pool, its fair part.
        share.open.set(2000);
        assert_eq!(share.offer(2000), Some(32_000));
        // Two receiving: half the pool at most, what the other leaves.
        share.now_count.set(2);
        assert_eq!(share.offer(2000), Some(16_000));
        share.open.set(30_000);
        assert_eq!(share.offer(2000), Some(4000));
        // The other holds all but three segments: nothing, the edge stays.
        share.open.set(31_000);
        assert_eq!(share.offer(2000), Some(0));
        // Sixteen receiving: a turn, the least fair part.
        share.now_count.set(16);
        share.open.set(2000);
        assert_eq!(share.offer(2000), Some(4000));
    }

    /// Credit that comes back a segment at a time goes to the first
    /// waiting connection as a turn ([`WindowShare::turn`]: four of these
    /// 32 frames), not one segment per acknowledgement; credit that stays
    /// short of a turn for a whole period is granted as it is.
    #[test]
    fn waiting_connections_are_granted_whole_turns() {
        let t = pool_held_by_40000();
        assert_eq!(t.share.turn(), 4000);
        // 40000's peer fills four segments, acknowledged one by one (the
        // edge stays: the window shrinks as it fills).
        for k in 1..=4u32 {
            let window = fill_40000(&t, k);
            assert_eq!(usize::from(window), 32000 - 1000 * k as usize);
            if k < 4 {
                assert_eq!(updates(&t), vec![], "no grant of a part of a turn");
            }
        }
        assert_eq!(updates(&t), vec![(40001, 1000, 1, 4000)]);
        assert_eq!(t.share.free(), 0);
        // Two segments come back and nothing more follows for a whole
        // period: they are granted to 40002 as they are.
        for k in 5..=6u32 {
            fill_40000(&t, k);
        }
        assert_eq!(t.share.free(), 2000);
        t.tick(Instant::from_millis(SHARE_PERIOD_MS));
        assert_eq!(updates(&t), vec![]);
        t.tick(Instant::from_millis(2 * SHARE_PERIOD_MS));
        assert_eq!(updates(&t), vec![(40002, 1000, 1, 2000)]);
    }

    /// A turn is as long as what peers lately used of theirs: turns left
    /// mostly unused shorten them, down to one segment, and filled ones
    /// lengthen them again, up to the most.
    #[test]
    fn turns_follow_what_peers_use_of_them() {
        let share = WindowShare::new(32, 1000);
        assert_eq!(share.turn(), 4000);
        share.turn_used(Some(1000));
        assert_eq!(share.demand.get(), Some(3625));
        assert_eq!(
            share.turn(),
            4000,
            "a segment's worth of difference at least"
        );
        for _ in 0..100 {
            share.turn_used(Some(1000));
        }
        assert_eq!(share.turn(), 1000);
        // A peer that used nothing still gets a segment.
        share.turn_used(Some(0));
        assert_eq!(share.turn(), 1000);
        // Filled turns: the peers had more.
        share.turn_used(None);
        assert_eq!(share.turn(), 2000);
        for _ in 0..100 {
            share.turn_used(None);
        }
        assert_eq!(share.turn(), 4000);
        // What a peer used beyond the most counts as the most.
        share.turn_used(Some(50_000));
        assert_eq!(share.turn(), 4000);
    }

    /// While peers use less than the longest turn, a waiting connection
    /// is granted what they use (in whole segments), once that much is
    /// free.
    #[test]
    fn waiting_connections_are_granted_what_peers_use() {
        let t = pool_held_by_40000();
        t.share.demand.set(Some(1500));
        assert_eq!(t.share.turn(), 2000);
        fill_40000(&t, 1);
        assert_eq!(updates(&t), vec![], "a part of a turn");
        fill_40000(&t, 2);
        assert_eq!(updates(&t), vec![(40001, 1000, 1, 2000)]);
        fill_40000(&t, 3);
        fill_40000(&t, 4);
        assert_eq!(updates(&t), vec![(40002, 1000, 1, 2000)]);
    }

    /// A turn ends as a sample of what peers use: the whole turn when its
    /// peer fills it, what the peer used when it is left unused; a window
    /// that was no turn is no sample.
    #[test]
    fn a_turn_counts_what_its_peer_used() {
        let t = two_turns_granted();
        let p = SHARE_PERIOD_MS;
        // 40002's peer fills its turn: a whole one.
        rx(
            &t,
            &seg_of(40002, false, false, 1, Some(1000), 100, &[7; 4000]),
        );
        assert_eq!(t.share.demand.get(), Some(4000));
        // 40001's peer sends a segment of its four and stops; its
        // acknowledgement keeps the edge (40003 waits, its peer probes).
        assert_eq!(establish(&t, 40003), 0);
        rx(&t, &seg_of(40003, false, false, 1, Some(1000), 100, &[7]));
        rx(
            &t,
            &seg_of(40001, false, false, 1, Some(1000), 100, &[7; 1000]),
        );
        assert_eq!(
            send(
                &t,
                &seg_of(40001, true, false, 1000, Some(1001), 60000, &[])
            ),
            3000
        );
        assert_eq!(t.share.demand.get(), Some(4000));
        // Retracted after UNUSED_PERIODS: it used one segment. 40000's
        // window, retracted then too, was no turn.
        t.tick(Instant::from_millis(UNUSED_PERIODS as i64 * p));
        assert_eq!(t.share.demand.get(), Some((7 * 4000 + 1000) / 8));
        // 40003's peer probed: with the credit retracted it gets a turn
        // (four segments still: 3625 bytes rounded up), sends nothing into
        // it, and its turn, retracted in turn, is no sample.
        let _ = updates(&t);
        t.tick(Instant::from_millis((UNUSED_PERIODS as i64 + 1) * p));
        assert!(t.get(flow(40003)).is_some_and(|s| s.turn.is_some()));
        t.tick(Instant::from_millis((2 * UNUSED_PERIODS as i64 + 1) * p));
        assert!(t.get(flow(40003)).is_some_and(|s| s.turn.is_none()));
        assert_eq!(t.share.demand.get(), Some((7 * 4000 + 1000) / 8));
    }

    /// A turn whose peer sent part of it, ending with a short segment (it
    /// had no more), and then nothing for [`QUIET_PERIODS`] ends while
    /// another connection waits: the rest is retracted and what the peer
    /// used is a sample of the demand. A turn whose peer's last segment
    /// was a full one stays held: more may have been lost on the way.
    #[test]
    fn a_turn_its_peer_stops_short_in_ends_after_a_quiet_while() {
        let t = two_turns_granted();
        let p = SHARE_PERIOD_MS;
        assert_eq!(establish(&t, 40003), 0);
        rx(&t, &seg_of(40003, false, false, 1, Some(1000), 100, &[7]));
        // 40001's peer: a segment and a short one, acknowledged.
        rx(
            &t,
            &seg_of(40001, false, false, 1, Some(1000), 100, &[7; 1000]),
        );
        rx(
            &t,
            &seg_of(40001, false, false, 1001, Some(1000), 100, &[7; 500]),
        );
        assert_eq!(
            send(
                &t,
                &seg_of(40001, true, false, 1000, Some(1501), 60000, &[])
            ),
            2500
        );
        // 40002's peer: one full segment, acknowledged.
        rx(
            &t,
            &seg_of(40002, false, false, 1, Some(1000), 100, &[7; 1000]),
        );
        send(
            &t,
            &seg_of(40002, true, false, 1000, Some(1001), 60000, &[]),
        );
        // The credit the acknowledgements freed, short of a turn for a
        // while, goes to 40003; 40004 waits.
        assert_eq!(establish(&t, 40004), 0);
        rx(&t, &seg_of(40004, false, false, 1, Some(1000), 100, &[7]));
        let mut got = Vec::new();
        for m in 1..QUIET_PERIODS as i64 {
            t.tick(Instant::from_millis(m * p));
            got.extend(updates(&t));
        }
        assert_eq!(got, vec![(40003, 1000, 1, 2000)]);
        t.tick(Instant::from_millis(QUIET_PERIODS as i64 * p));
        // (40003's update, unanswered, is sent again meanwhile.)
        assert_eq!(
            updates(&t),
            vec![(40003, 1000, 1, 2000), (40001, 1000, 1501, 0)]
        );
        assert_eq!(t.share.quiet_turns.get(), 1);
        assert_eq!(t.share.demand.get(), Some((7 * 4000 + 1500) / 8));
        assert_eq!(t.get(flow(40001)).and_then(|s| s.rx_window()), Some(0));
        assert_eq!(t.get(flow(40002)).and_then(|s| s.rx_window()), Some(3000));
    }

    /// A window update sent again and again without an answer: its peer
    /// has nothing to send, or went quiet for a loss (and is nudged).
    /// While another connection waits, the window is retracted once the
    /// last repeat went unanswered, not after [`UNUSED_PERIODS`].
    #[test]
    fn an_unanswered_grant_is_retracted_for_waiting_connections() {
        let t = two_turns_granted();
        let p = SHARE_PERIOD_MS;
        rx(
            &t,
            &seg_of(40001, false, false, 1, Some(1000), 100, &[7; 1000]),
        );
        assert_eq!(establish(&t, 40003), 0);
        rx(&t, &seg_of(40003, false, false, 1, Some(1000), 100, &[7]));
        let mut got = Vec::new();
        for m in 1..=(i64::from(MAX_REPEATS) + 1) * REPEAT_PERIODS as i64 {
            t.tick(Instant::from_millis(m * p));
            got.extend(updates(&t));
        }
        let mut want = vec![(40002, 1000, 1, 4000); usize::from(MAX_REPEATS)];
        want.push((40002, 1000, 1, 0));
        want.push((40003, 1000, 1, 4000));
        assert_eq!(got, want);
        assert_eq!(t.share.retracted.get(), 1);
        // Its peer probed lately (what followed may have been lost): it
        // is nudged a second after the retraction, its zero window sent
        // again.
        let retracted = (i64::from(MAX_REPEATS) + 1) * REPEAT_PERIODS as i64;
        let mut nudges = Vec::new();
        for m in retracted + 1..=retracted + NUDGE_PERIODS as i64 {
            t.tick(Instant::from_millis(m * p));
            nudges.extend(updates(&t).into_iter().filter(|u| u.0 == 40002));
            assert_eq!(nudges.is_empty(), m < retracted + NUDGE_PERIODS as i64);
        }
        assert_eq!(nudges, vec![(40002, 1000, 1, 0)]);
        assert_eq!(t.share.nudged.get(), 1);
    }

    /// A waiting connection whose peer has not filled a window (it came
    /// while the pool was held) is granted one segment, not a turn.
    #[test]
    fn a_peer_that_showed_no_more_data_is_granted_a_segment() {
        let t = held_by_40000(32);
        fill_40000(&t, 1);
        assert_eq!(updates(&t), vec![(40001, 1000, 1, 1000)]);
    }

    /// A window update the peer does not answer with data is sent again
    /// after [`REPEAT_PERIODS`], at most [`MAX_REPEATS`] times; one the
    /// peer answers is not.
    #[test]
    fn unanswered_window_updates_are_sent_again() {
        let t = two_turns_granted();
        let p = SHARE_PERIOD_MS;
        // 40001's peer uses its window; 40002's stays silent.
        rx(
            &t,
            &seg_of(40001, false, false, 1, Some(1000), 100, &[7; 1000]),
        );
        for m in 1..REPEAT_PERIODS as i64 {
            t.tick(Instant::from_millis(m * p));
            assert_eq!(updates(&t), vec![]);
        }
        let mut repeats = Vec::new();
        for m in REPEAT_PERIODS as i64..=4 * REPEAT_PERIODS as i64 {
            t.tick(Instant::from_millis(m * p));
            repeats.extend(updates(&t));
        }
        assert_eq!(
            repeats,
            vec![(40002, 1000, 1, 4000); usize::from(MAX_REPEATS)]
        );
        assert_eq!(t.share.repeated.get(), u64::from(MAX_REPEATS));
    }

    /// A peer that sends beyond the window we advertised (smoltcp takes
    /// it when its buffer has room and acknowledges past our edge), or
    /// probes a closed window: the counts neither underflow nor panic,
    /// and the window stays closed while the pool is held.
    #[test]
    fn data_past_our_edge_keeps_the_counts_sound() {
        let t = SentTable {
            share: WindowShare::new(1, 1000),
            ..SentTable::default()
        };
        establish(&t, 40000);
        assert_eq!(establish(&t, 40001), 0);
        // 40001's peer sends 1 byte (a probe), then 5000 bytes it was
        // never offered; smoltcp acknowledges them.
        assert_eq!(
            send(&t, &seg_of(40001, true, false, 1000, Some(2), 60000, &[])),
            0
        );
        assert_eq!(
            send(
                &t,
                &seg_of(40001, true, false, 1000, Some(5002), 60000, &[])
            ),
            0
        );
        assert_eq!(t.share.open.get(), 1000);
        assert_eq!(t.get(flow(40001)).unwrap().rx_window(), Some(0));
        // The holder's peer acknowledges past its edge too.
        send(
            &t,
            &seg_of(40000, true, false, 1000, Some(9001), 60000, &[]),
        );
        assert_eq!(updates(&t), vec![(40001, 1000, 5002, 1000)]);
        assert_eq!(t.share.open.get(), 1000);
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
