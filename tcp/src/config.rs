//! Stack and socket settings, chosen for iWARP.

use smoltcp::socket::tcp::CongestionControl;
use smoltcp::time::Duration;

/// Largest receive buffer smoltcp accepts (RFC 7323: window ≤ 2^30).
pub const MAX_BUFFER: usize = 1 << 30;

/// Smallest buffer [`Config::fit_rx_frames`] will choose: a few segments.
pub const MIN_BUFFER: usize = 4 * 1024;

/// Smallest receive buffer [`Config::window_frames`] cuts a new
/// connection's to: enough for a connection that ends up receiving alone
/// to keep a few tens of segments in flight (on veth a 64 KiB window
/// moves about 70 % of what a 256 KiB one does), while a thousand
/// connections touch a quarter of the memory 256 KiB buffers would.
pub const SHARED_BUFFER_MIN: usize = 64 * 1024;

/// Settings of a [`Stack`](crate::Stack) and of every socket it opens.
///
/// The defaults are the iWARP choices:
///
/// * **Nagle off.** The iWARP layer writes whole FPDUs and a small one (a
///   Read Request, a short Send) must leave at once; RFC 5044 §8 asks for
///   it too.
/// * **Delayed ACK 1 ms.** smoltcp already ACKs at once as soon as more
///   than one MSS is unacknowledged, so the delay only applies to a lone
///   tail segment. Most iWARP exchanges answer such a segment (Read
///   Request → Read Response, Send → reply), and the answer carries the
///   ACK; 1 ms saves those pure ACKs (each one costs a copy-mode AF_XDP
///   transmit, ~1.5 µs of the sender's core) while staying far below the
///   1 s minimum RTO and the smoltcp default of 10 ms, which would hold a
///   sender's buffer space for a long time when nobody answers. A
///   connection whose window is cut below two segments
///   ([`window_frames`](Config::window_frames)) acknowledges each
///   segment at once: its peer cannot send the second one.
/// * **Reno congestion control, set on every socket.** On a LAN with an
///   RTT of tens of µs Reno reaches the window in a few round trips;
///   CUBIC's cubic growth pays off on long fat paths, and smoltcp makes
///   it the silent default as soon as the `socket-tcp-cubic` feature is
///   on anywhere in the build, so the choice is explicit. Without any
///   congestion control smoltcp collapses after drops.
/// * **Window scaling** follows from the buffer size: smoltcp derives the
///   shift from the receive buffer's capacity and offers it in the SYN;
///   256 KiB buffers give a shift of 3 and a window four times what fits
///   in 16 bits.
/// * **No TCP timestamps**: smoltcp uses them only with a generator, and
///   without them no option eats into the MSS, so FPDUs fill segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Receive buffer of each connection (bytes), the most the advertised
    /// window can reach. At most [`MAX_BUFFER`]. With
    /// [`window_frames`](Self::window_frames), a new connection gets no
    /// more than its part of the frames while the connections open then
    /// all receive (rounded up to whole pages, at least
    /// [`SHARED_BUFFER_MIN`]): smoltcp's receive ring moves through its
    /// whole buffer whatever the window, so the rest would only be
    /// faulted in and cleared. A connection keeps its buffer for its life.
    pub rx_buffer: usize,
    /// Transmit buffer of each connection (bytes).
    pub tx_buffer: usize,
    /// Receive-buffer bytes all sockets of the stack may hold together
    /// (the sum of the windows they can advertise): a new socket gets
    /// `rx_buffer` cut to what the others leave, at least
    /// [`MIN_BUFFER`], for as long as it lives. `None`: no bound.
    pub rx_budget: Option<usize>,
    /// Receive frames the connections' windows share: the frames the
    /// device can receive into before the stack takes any (the AF_XDP
    /// engine's fill ring). The windows all connections hold open
    /// together stay within `window_frames × MSS` bytes, so the peers
    /// together keep no more in flight than there are frames to receive
    /// it into, however many connections there are. A connection is
    /// offered at most its fair part (`window_frames × MSS` over the
    /// connections that received data in the last 10–20 ms and those
    /// waiting, but at least a turn: 32 segments, at most an eighth of
    /// the frames), in whole segments, and only what the others leave:
    /// the offer may be nothing, and its window closes. A connection held
    /// below one segment waits in a FIFO queue; credit freed by a peer
    /// that filled its window, by an acknowledged FIN, by a connection
    /// that is gone, or by a window its peer left unused for a second
    /// (retracted: a window update closes it, once a connection waits)
    /// goes to the waiting connections in order, a turn's worth at a time (less only when
    /// no more has come free for a whole period; one segment to a
    /// connection whose peer has not filled a window it was offered),
    /// each sent a window update at once (a pure
    /// acknowledgement the stack builds itself, counted in
    /// [`Counters::window_updates`](crate::Counters::window_updates)).
    /// smoltcp's own window, when smaller, stands. The right edge of a
    /// window moves back only in a retraction, so a shrinking share takes
    /// effect as the peers fill what they were offered. The window of a SYN or
    /// SYN-ACK is not cut: a connection takes its share from its first
    /// acknowledgement after the handshake on. `None`: the AF_XDP
    /// engine fills in half its fill ring (the rest takes what arrives
    /// beyond the windows: the burst it holds until its next refill,
    /// acknowledgements, window updates, probes, retransmissions), a
    /// stack on its own cuts nothing; `Some(0)`: windows are never cut.
    pub window_frames: Option<usize>,
    /// Nagle's algorithm: hold back small segments while data is
    /// unacknowledged. Off by default, so each FPDU leaves at once.
    pub nagle: bool,
    /// Delayed-ACK timeout; `None` ACKs every segment at once.
    pub ack_delay: Option<Duration>,
    /// The congestion control algorithm of every socket (Reno by default).
    pub congestion: CongestionControl,
    /// Most frames handled per [`Stack::poll`](crate::Stack::poll) on
    /// ingress (smoltcp's "DoS warning": unbounded ingress starves the
    /// rest of the loop). The default, 256, bounds a poll to a few hundred
    /// microseconds of ingress.
    pub ingress_budget: usize,
    /// Most bytes of frames handled per [`Stack::poll`](crate::Stack::poll)
    /// on ingress (the frame that crosses it is the last). A poll
    /// acknowledges what it took and the engine's pass hands it to the
    /// application before the next poll takes more, so a sender keeps
    /// sending while the receiver works through a window's worth: with a
    /// batch as large as the window, the two would take turns, each idle
    /// while the other works. The default, 64 KiB, is a quarter of the
    /// default receive buffer (seven frames at MTU 9000, 45 at MTU 1500).
    pub ingress_bytes: usize,
    /// Most segments one connection sends per visit of
    /// [`Stack::poll`](crate::Stack::poll) (counted in
    /// `egress_budget_hits` when reached).
    pub egress_budget: usize,
    /// Established connections per listening port that may wait for
    /// [`Stack::accept`](crate::Stack::accept) (the accept queue); a SYN
    /// or a handshake that finds it full is answered with a reset.
    pub backlog: usize,
    /// Half-open connections per listening port (SYN received, handshake
    /// not complete); a SYN past it drops the oldest, so a flood of SYNs
    /// that never complete cannot keep others from connecting.
    pub half_open: usize,
    /// Connections the stack holds at most (the flow table's capacity);
    /// a SYN past it is answered with a reset, a connect fails.
    pub max_connections: usize,
    /// Abort a connection whose peer has not acknowledged for this long.
    pub timeout: Option<Duration>,
    /// Interval between TCP keep-alive probes on an idle connection;
    /// `None`: no keep-alives.
    pub keep_alive: Option<Duration>,
    /// Seed of smoltcp's generator (initial sequence numbers, ephemeral
    /// choices): fixed for reproducible runs.
    pub seed: u64,
    /// How long a connection stays quiet (no visit that found data in one
    /// of its buffers or changed its state: frames that move no data,
    /// such as keep-alives or window updates, leave it quiet) before the
    /// stack gives the pages of its socket buffers back to the system, if
    /// they hold nothing it will read again: no unread or unacknowledged data, nothing that arrived
    /// beyond our acknowledgement. A connection waiting for its turn of
    /// [`window_frames`](Self::window_frames) whose peer sent nothing for
    /// that long is quiet too. Its buffers stay mapped; a page
    /// comes back, zeroed, when the ring next writes it (a fault per page
    /// as traffic resumes). A quiet connection is released between one
    /// and two of these after its last visit, counted in
    /// [`Counters::idle_releases`](crate::Counters::idle_releases).
    /// `None`: buffers stay resident.
    pub idle_release: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            rx_buffer: 256 * 1024,
            tx_buffer: 256 * 1024,
            rx_budget: None,
            window_frames: None,
            nagle: false,
            ack_delay: Some(Duration::from_millis(1)),
            congestion: CongestionControl::Reno,
            ingress_budget: 256,
            ingress_bytes: 64 * 1024,
            egress_budget: 64,
            backlog: 1024,
            half_open: 1024,
            max_connections: 1 << 16,
            timeout: None,
            keep_alive: None,
            seed: 0x5eed_1a2b,
            idle_release: Some(Duration::from_secs(10)),
        }
    }
}

impl Config {
    /// Size the receive buffers against a receive-frame budget: with
    /// `connections` connections sharing `rx_frames` frames of which each
    /// carries at most `mss` payload bytes, a window of `rx_frames × mss /
    /// connections` per connection is the most the peers can have in
    /// flight at once, so an AF_XDP fill ring of `rx_frames` cannot run
    /// dry from TCP data alone. Rounded down to a multiple of `mss`,
    /// clamped to [`MIN_BUFFER`]`..=`[`MAX_BUFFER`]. The transmit buffer
    /// is set to the same size (what the peer's equal window can take).
    ///
    /// The clamp wins over the bound once `connections` × [`MIN_BUFFER`]
    /// exceeds `rx_frames` × `mss`: then the ring can run dry again (1000
    /// connections on 2048 fill frames of 1460 bytes did, dropping frames
    /// and costing retransmission timeouts). Give the engine at least
    /// `connections` × ⌈[`MIN_BUFFER`] / `mss`⌉ receive frames, plus room
    /// for the ACKs of what the connections send.
    pub fn fit_rx_frames(mut self, rx_frames: usize, mss: usize, connections: usize) -> Self {
        let mss = mss.max(1);
        let per_conn = rx_frames.saturating_mul(mss) / connections.max(1);
        let size = (per_conn / mss * mss).clamp(MIN_BUFFER, MAX_BUFFER);
        self.rx_buffer = size;
        self.tx_buffer = size;
        self
    }

    /// The window scale shift smoltcp will offer for `rx_buffer`.
    pub fn window_shift(&self) -> u8 {
        let bits = usize::BITS - self.rx_buffer.leading_zeros();
        bits.saturating_sub(16) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_rx_frames_keeps_window_within_frames() {
        let c = Config::default().fit_rx_frames(4096, 1460, 4);
        assert_eq!(c.rx_buffer, 1024 * 1460);
        assert!(c.rx_buffer * 4 <= 4096 * 1460);
        let c = Config::default().fit_rx_frames(10, 1460, 100);
        assert_eq!(c.rx_buffer, MIN_BUFFER);
        let c = Config::default().fit_rx_frames(usize::MAX, 9000, 1);
        assert_eq!(c.rx_buffer, MAX_BUFFER);
        let c = Config::default().fit_rx_frames(100, 0, 0);
        assert!(c.rx_buffer >= MIN_BUFFER);
    }

    #[test]
    fn default_window_needs_scaling() {
        let c = Config::default();
        assert!(c.rx_buffer > 65535);
        assert_eq!(c.window_shift(), 3);
        assert!(!c.nagle);
        assert_eq!(c.congestion, CongestionControl::Reno);
    }
}
