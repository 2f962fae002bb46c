//! An in-memory connected pair of QPs for tests, demos and benchmarks.
//!
//! Two [`Context`]s, one QP each, joined by two byte pipes that stand for
//! the TCP connection. [`Pair::drive`] moves bytes until nothing moves;
//! the sizes of transmit buffers and of received chunks are drawn from a
//! seeded generator ([`Chunking`]), so a test can show that any split of
//! the stream yields the same placement and completions. Every byte that
//! crosses is recorded in order ([`Pair::transcript`]) for the pcap oracle.

use crate::cq::{CqId, QpId, WorkCompletion};
use crate::mem::{Access, MrInfo, PdId};
use crate::mpa::framing::{FramingError, RxDeframer, RxItem};
use crate::mpa::handshake::Config as MpaConfig;
use crate::qp::{QpConfig, QpEvent, QpState};
use crate::time::{Duration, Instant};
use crate::verbs::Context;

/// Every ULPDU of an MPA stream with its CRC verdict, and the error that
/// ended the stream if one did.
pub type Deframed = (Vec<(Vec<u8>, bool)>, Option<FramingError>);

/// Deframe `stream` with `rx`, cut into pieces of the sizes `cut` returns
/// (at least 1, at most what is left); with `whole`,
/// [`RxDeframer::next_whole`] is tried before each [`RxDeframer::next`].
/// The same stream must deframe to the same result either way (the
/// framing proptests and the `mpa_frame` fuzz target check that).
///
/// # Panics
/// If `next_whole` returns an FPDU while one is partly received (a
/// deframer bug).
pub fn deframe_all(
    rx: &mut RxDeframer,
    stream: &[u8],
    mut cut: impl FnMut() -> usize,
    whole: bool,
) -> Deframed {
    let (mut out, mut cur) = (Vec::new(), Vec::new());
    let mut rest = stream;
    while !rest.is_empty() {
        let k = cut().clamp(1, rest.len());
        let mut chunk = &rest[..k];
        rest = &rest[k..];
        while !chunk.is_empty() {
            if whole {
                if let Some((n, u, ok)) = rx.next_whole(chunk) {
                    assert!(cur.is_empty(), "next_whole inside an FPDU");
                    out.push((u.to_vec(), ok));
                    chunk = &chunk[n..];
                    continue;
                }
            }
            match rx.next(chunk) {
                Ok((n, item)) => {
                    match item {
                        Some(RxItem::Data(d)) => cur.extend_from_slice(d),
                        Some(RxItem::End { crc_ok }) => {
                            out.push((std::mem::take(&mut cur), crc_ok));
                        }
                        _ => {}
                    }
                    chunk = &chunk[n..];
                }
                Err(e) => return (out, Some(e)),
            }
        }
    }
    (out, None)
}

/// How the pipes cut the stream.
#[derive(Clone, Copy, Debug)]
pub struct Chunking {
    /// Largest transmit buffer offered to `poll_transmit`.
    pub max_tx: usize,
    /// Largest piece handed to `handle_input`.
    pub max_rx: usize,
    /// Draw sizes at random in `1..=max` (else always `max`).
    pub random: bool,
    /// Seed of the size generator.
    pub seed: u64,
}

impl Chunking {
    /// Whole buffers of `n` bytes.
    pub const fn whole(n: usize) -> Self {
        Self {
            max_tx: n,
            max_rx: n,
            random: false,
            seed: 1,
        }
    }

    /// Random sizes up to `max`.
    pub const fn random(max: usize, seed: u64) -> Self {
        Self {
            max_tx: max,
            max_rx: max,
            random: true,
            seed,
        }
    }
}

impl Default for Chunking {
    fn default() -> Self {
        Self::whole(64 * 1024)
    }
}

/// Which end of the pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The MPA initiator (TCP client).
    A,
    /// The MPA responder (TCP server).
    B,
}

/// One end: a context with one PD, one CQ and one QP.
#[derive(Debug)]
pub struct Side {
    /// The context.
    pub ctx: Context,
    /// The protection domain.
    pub pd: PdId,
    /// The CQ used for both send and receive completions.
    pub cq: CqId,
    /// The QP.
    pub qp: QpId,
    /// Events drained from the QP so far.
    pub events: Vec<QpEvent>,
    /// Bytes sent but not yet consumed by the other side.
    inbox: Vec<u8>,
    eof_sent: bool,
}

impl Side {
    fn new(seed: u64, config: QpConfig) -> Self {
        let mut ctx = Context::new(seed);
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(4096);
        let qp = ctx.create_qp(pd, cq, cq, config).expect("fresh CQ");
        Self {
            ctx,
            pd,
            cq,
            qp,
            events: Vec::new(),
            inbox: Vec::new(),
            eof_sent: false,
        }
    }

    /// Register a zeroed buffer of `len` bytes owned by the context.
    pub fn reg(&mut self, len: usize, access: Access) -> MrInfo {
        self.ctx
            .reg_mr_owned(self.pd, vec![0; len].into_boxed_slice(), access)
            .expect("memory table has room")
    }

    /// Register a buffer with the given contents.
    pub fn reg_with(&mut self, bytes: &[u8], access: Access) -> MrInfo {
        self.ctx
            .reg_mr_owned(self.pd, bytes.to_vec().into_boxed_slice(), access)
            .expect("memory table has room")
    }

    /// The bytes of an owned region.
    pub fn bytes(&self, mr: &MrInfo) -> &[u8] {
        self.ctx.mem().owned_bytes(mr.lkey).unwrap_or(&[])
    }

    /// Drain all completions.
    pub fn completions(&mut self) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        while let Some(wc) = self.ctx.cq(self.cq).and_then(|cq| cq.poll_one()) {
            out.push(wc);
        }
        out
    }

    /// The QP's state.
    pub fn state(&self) -> QpState {
        self.ctx.qp_state(self.qp).unwrap_or(QpState::Error)
    }
}

/// Two connected QPs. See the module documentation.
#[derive(Debug)]
pub struct Pair {
    /// The initiator.
    pub a: Side,
    /// The responder.
    pub b: Side,
    /// The current time; [`Pair::drive`] does not advance it.
    pub now: Instant,
    /// How the stream is cut.
    pub chunking: Chunking,
    /// Accept connection requests automatically (with `accept_data`).
    pub auto_accept: bool,
    /// Private data the responder accepts with.
    pub accept_data: Vec<u8>,
    rng: u64,
    transcript: Vec<(End, Vec<u8>)>,
}

impl Pair {
    /// Two unconnected QPs.
    pub fn new(config: QpConfig, chunking: Chunking) -> Self {
        Self {
            a: Side::new(0xa11ce, config.clone()),
            b: Side::new(0xb0b, config),
            now: Instant::ZERO,
            chunking,
            auto_accept: true,
            accept_data: Vec::new(),
            rng: chunking.seed | 1,
            transcript: Vec::new(),
        }
    }

    /// Two QPs connected through the MPA exchange with the given settings.
    /// Panics if the exchange does not establish.
    pub fn connected(config: QpConfig, chunking: Chunking, a: MpaConfig, b: MpaConfig) -> Self {
        let mut p = Self::new(config, chunking);
        p.start(a, &[], b);
        p.drive();
        assert_eq!(
            p.a.state(),
            QpState::Rts,
            "initiator events: {:?}",
            p.a.events
        );
        assert_eq!(
            p.b.state(),
            QpState::Rts,
            "responder events: {:?}",
            p.b.events
        );
        p
    }

    /// Start the MPA exchange: `a` connects with `private_data`, `b` listens.
    pub fn start(&mut self, a: MpaConfig, private_data: &[u8], b: MpaConfig) {
        self.b.ctx.listen(self.b.qp, b, self.now).expect("listen");
        self.a
            .ctx
            .connect(self.a.qp, a, private_data, self.now)
            .expect("connect");
    }

    /// The side named by `end`.
    pub fn side(&mut self, end: End) -> &mut Side {
        match end {
            End::A => &mut self.a,
            End::B => &mut self.b,
        }
    }

    fn size(&mut self, max: usize) -> usize {
        if !self.chunking.random || max <= 1 {
            return max.max(1);
        }
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        1 + (x % max as u64) as usize
    }

    /// Move bytes both ways until nothing moves. Returns bytes moved.
    pub fn drive(&mut self) -> usize {
        let mut total = 0;
        for _ in 0..1_000_000 {
            let moved = self.step(End::A) + self.step(End::B);
            total += moved;
            if moved == 0 {
                return total;
            }
        }
        panic!("pair did not quiesce (livelock)");
    }

    /// One step each way, as [`Self::drive`] takes them, for a test that
    /// looks between steps. Returns bytes moved.
    pub fn drive_once(&mut self) -> usize {
        self.step(End::A) + self.step(End::B)
    }

    /// One step for `end`: transmit one buffer, deliver pending bytes to
    /// the other side, close when asked, drain events.
    fn step(&mut self, end: End) -> usize {
        let now = self.now;
        let max_tx = self.chunking.max_tx;
        let tx_size = self.size(max_tx);
        let mut buf = vec![0u8; tx_size];
        let (from, to) = match end {
            End::A => (&mut self.a, &mut self.b),
            End::B => (&mut self.b, &mut self.a),
        };
        let may = from.ctx.may_transmit(from.qp);
        let n = from.ctx.poll_transmit(from.qp, &mut buf);
        // What lets an engine skip idle connections must never hide bytes.
        assert!(
            may || n == 0,
            "may_transmit said no, poll_transmit gave {n} bytes"
        );
        let mut moved = n;
        if n > 0 {
            to.inbox.extend_from_slice(&buf[..n]);
            self.transcript.push((end, buf[..n].to_vec()));
        }
        // Deliver what `from` sent to `to`, in random-sized pieces.
        let (from, to) = match end {
            End::A => (&mut self.a, &mut self.b),
            End::B => (&mut self.b, &mut self.a),
        };
        let _ = from;
        let mut off = 0;
        let pending = core::mem::take(&mut to.inbox);
        while off < pending.len() {
            let max_rx = self.chunking.max_rx;
            let want = {
                let mut x = self.rng;
                if self.chunking.random && max_rx > 1 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    self.rng = x;
                    1 + (x % max_rx as u64) as usize
                } else {
                    max_rx.max(1)
                }
            };
            let to = match end {
                End::A => &mut self.b,
                End::B => &mut self.a,
            };
            let piece = &pending[off..pending.len().min(off + want)];
            let used = to.ctx.handle_input(to.qp, piece, now);
            off += used;
            moved += used;
            if used < piece.len() {
                break; // the receiver waits for the application
            }
        }
        let to = match end {
            End::A => &mut self.b,
            End::B => &mut self.a,
        };
        to.inbox.splice(0..0, pending[off..].iter().copied());
        // Events, auto-accept, and closes.
        for end in [End::A, End::B] {
            let accept = self.auto_accept;
            let data = self.accept_data.clone();
            let side = self.side(end);
            while let Some(ev) = side.ctx.poll_event(side.qp) {
                if accept {
                    if let QpEvent::ConnectRequest(_) = ev {
                        side.ctx.accept(side.qp, &data).expect("accept");
                        moved += 1;
                    }
                }
                side.events.push(ev);
            }
        }
        moved += self.propagate_close(end);
        moved
    }

    fn propagate_close(&mut self, end: End) -> usize {
        let (from, to) = match end {
            End::A => (&mut self.a, &mut self.b),
            End::B => (&mut self.b, &mut self.a),
        };
        if from.eof_sent || !from.ctx.wants_close(from.qp) || !to.inbox.is_empty() {
            return 0;
        }
        // Everything `from` will ever send has been delivered: close.
        let mut probe = [0u8; 1];
        if from.ctx.poll_transmit(from.qp, &mut probe) > 0 {
            to.inbox.push(probe[0]);
            self.transcript.push((end, probe.to_vec()));
            return 1;
        }
        from.eof_sent = true;
        to.ctx.handle_eof(to.qp);
        1
    }

    /// Advance the clock by `d` and run due timers on both sides.
    pub fn advance(&mut self, d: Duration) {
        self.now = self.now + d;
        let now = self.now;
        for end in [End::A, End::B] {
            let side = self.side(end);
            if side.ctx.poll_timeout(side.qp).is_some_and(|t| t <= now) {
                side.ctx.handle_timeout(side.qp, now);
            }
        }
    }

    /// Inject raw bytes into `to`'s input as if the peer had sent them.
    pub fn inject(&mut self, to: End, bytes: &[u8]) {
        let from = match to {
            End::A => End::B,
            End::B => End::A,
        };
        self.transcript.push((from, bytes.to_vec()));
        self.side(to).inbox.extend_from_slice(bytes);
    }

    /// Every chunk that crossed, in order, with its sender.
    pub fn transcript(&self) -> &[(End, Vec<u8>)] {
        &self.transcript
    }
}
