//! Queue pairs: the RDMAP/DDP data path over one MPA connection.
//!
//! A [`Qp`] owns the MPA handshake until it completes, then the transmit
//! state machine (`tx`: segmentation of work requests into FPDUs) and the
//! receive state machine (`rx`: validation and placement of inbound
//! segments). Both are resumable at any byte boundary of the TCP stream.
//!
//! The QP is driven through [`crate::verbs::Context`], which lends it the
//! memory table and the completion queues. Inputs are `handle_*`, outputs
//! `poll_*`, as in quinn-proto.
//!
//! State machine (RFC 5040 §6 / iWARP verbs):
//!
//! ```text
//! Idle --connect/listen--> Connecting --MPA done--> Rts --disconnect--> Closing --> Error
//!                               |                    |
//!                               +--failure-----------+--violation--> Terminate --sent--> Error
//!                                                    +--Terminate received / EOF--------> Error
//! ```
//! Entering Error flushes every outstanding work request.
//!
//! The QP reports its connection's lifecycle, every Terminate sent or
//! received and every failure as `tracing` events (nothing per FPDU).
//! They are attributed to the span its owner sets with
//! [`crate::verbs::Context::set_qp_span`] (the engine's `conn` span), to
//! the current span when none is set. Events are not I/O: with no
//! subscriber installed they cost a relaxed load each.

/// A `tracing` event at level `$lvl` in the QP's span `$span` (the
/// current span if it is none).
macro_rules! qp_event {
    ($span:expr, $lvl:ident, $($arg:tt)+) => {
        if $span.is_none() {
            tracing::event!(tracing::Level::$lvl, $($arg)+)
        } else {
            tracing::event!(parent: &$span, tracing::Level::$lvl, $($arg)+)
        }
    };
}

/// A `tracing` event about the Terminate code `$t`: the layer, error
/// type and code as numbers and names.
macro_rules! term_event {
    ($span:expr, $lvl:ident, $t:expr, $($arg:tt)+) => {{
        let t: TermCode = $t;
        qp_event!(
            $span,
            $lvl,
            layer = t.layer as u8,
            layer_name = t.layer.name(),
            etype = t.etype,
            code = t.code,
            name = t.name(),
            $($arg)+
        )
    }};
}

mod rx;
mod tx;

use std::collections::VecDeque;

use crate::cq::{CqId, QpId, WcOpcode, WcStatus, WorkCompletion};
use crate::error::TermCode;
use crate::mem::{MemTable, PdId};
use crate::mpa::handshake::{self, ConnectRequest, Handshake, HandshakeError, Negotiated};
use crate::srq::{SrqId, SrqTable};
use crate::time::Instant;
use crate::verbs::CqTable;

/// The most scatter/gather elements a work request may carry.
pub const MAX_SGE: usize = 4;

/// The length of an atomic operation's word and of its local SGE.
pub const ATOMIC_LEN: u64 = 8;

/// A scatter/gather element: `len` bytes at address `addr` of the region
/// whose local key is `lkey`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Address in the region's tagged-offset space.
    pub addr: u64,
    /// Length in bytes; `addr..addr + len` must lie inside the region.
    pub len: u32,
    /// The region's local key (its STag), as [`crate::mem`] returns it at
    /// registration.
    pub lkey: u32,
}

/// The operation of a send-queue work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// A Send; with `solicited` the Solicited Event variant, with
    /// `invalidate` the Send with Invalidate variant (the peer invalidates
    /// that STag).
    Send {
        /// Set the Solicited Event flag.
        solicited: bool,
        /// The STag the peer invalidates on receipt, carried in the
        /// Invalidate STag field (Send with Invalidate, RFC 5040 §6.10).
        invalidate: Option<u32>,
    },
    /// An RDMA Write of the SGEs to `remote_addr` in the peer's region `rkey`.
    Write {
        /// Tagged offset at the peer.
        remote_addr: u64,
        /// The peer's STag.
        rkey: u32,
    },
    /// An RDMA Read from `remote_addr` in the peer's region `rkey` into
    /// the single local SGE.
    Read {
        /// Tagged offset at the peer.
        remote_addr: u64,
        /// The peer's STag.
        rkey: u32,
    },
    /// Invalidate a local STag, in send-queue order.
    LocalInvalidate {
        /// The STag to invalidate.
        stag: u32,
    },
    /// Immediate Data (RFC 7306 §6): 8 bytes that complete one of the
    /// peer's posted receives (`WorkCompletion::imm_data`), with no SGEs.
    /// Posted after an RDMA Write, it completes at the peer only once the
    /// Write is placed: the Write with Immediate of other verbs.
    ImmediateData {
        /// The 8 bytes, sent as a big-endian number.
        data: u64,
        /// Set the Solicited Event flag.
        solicited: bool,
    },
    /// FetchAdd (RFC 7306 §5.1.1) on the 64-bit word at `remote_addr`
    /// (8-byte aligned) in the peer's region `rkey`, which must allow
    /// remote atomics. The word's value before the addition lands in the
    /// single 8-byte local SGE, in native byte order.
    FetchAdd {
        /// Tagged offset at the peer.
        remote_addr: u64,
        /// The peer's STag.
        rkey: u32,
        /// Added to the word.
        add: u64,
        /// Each set bit ends a field whose carry out is dropped (0: one
        /// 64-bit addition).
        add_mask: u64,
    },
    /// CompareSwap (RFC 7306 §5.1.2): where the word at `remote_addr`
    /// equals `compare` in the bits of `compare_mask`, its bits in
    /// `swap_mask` become those of `swap`. The value before lands in the
    /// single 8-byte local SGE, as for [`SendOp::FetchAdd`]. Masks of all
    /// ones make the plain compare-and-swap.
    CompareSwap {
        /// Tagged offset at the peer.
        remote_addr: u64,
        /// The peer's STag.
        rkey: u32,
        /// Compared with the word.
        compare: u64,
        /// The bits compared.
        compare_mask: u64,
        /// Written into the word when the comparison holds.
        swap: u64,
        /// The bits written.
        swap_mask: u64,
    },
}

impl SendOp {
    /// Whether the operation waits for a response from the peer (RDMA
    /// Read and the atomics), which counts against the ORD.
    pub fn awaits_response(&self) -> bool {
        matches!(
            self,
            Self::Read { .. } | Self::FetchAdd { .. } | Self::CompareSwap { .. }
        )
    }
}

/// A send-queue work request (`ibv_send_wr`): one RDMAP operation and its
/// local buffers. The SGE array is copied when it is posted.
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// The application's identifier, returned in the work completion.
    pub wr_id: u64,
    /// The RDMAP operation and its remote parameters.
    pub op: SendOp,
    /// Local buffers (gather list for Send/Write, the sink for Read).
    pub sgl: &'a [Sge],
    /// Produce a completion on success (errors always complete).
    pub signaled: bool,
}

/// A receive-queue work request (`ibv_recv_wr`): a buffer for one incoming
/// untagged message (Send or Immediate Data), consumed in posting order.
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    /// The application's identifier, returned in the work completion.
    pub wr_id: u64,
    /// Buffers an incoming Send is scattered into.
    pub sgl: &'a [Sge],
}

impl SendWr<'_> {
    /// The checks of `post_send` that depend on the work request alone
    /// (not on the queue): for a caller that queues work requests before
    /// they reach the QP and must still fail bad ones synchronously.
    /// Returns the message length.
    pub fn check(&self) -> Result<u64, PostError> {
        let len = sgl_len(self.sgl)?;
        let sgl_ok = match self.op {
            SendOp::Read { .. } => self.sgl.len() == 1,
            SendOp::FetchAdd { .. } | SendOp::CompareSwap { .. } => {
                self.sgl.len() == 1 && len == ATOMIC_LEN
            }
            SendOp::ImmediateData { .. } => self.sgl.is_empty(),
            _ => true,
        };
        if !sgl_ok {
            return Err(PostError::InvalidSgl);
        }
        Ok(len)
    }
}

impl RecvWr<'_> {
    /// The checks of `post_recv` that depend on the work request alone;
    /// see [`SendWr::check`]. Returns the buffers' total length.
    pub fn check(&self) -> Result<u64, PostError> {
        sgl_len(self.sgl)
    }
}

/// Why `post_send` or `post_recv` refused a work request. A refused request
/// is not queued and produces no completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostError {
    /// The send or receive queue already holds its depth
    /// ([`QpConfig::sq_depth`], [`QpConfig::rq_depth`]) of outstanding
    /// work requests.
    QueueFull,
    /// More than [`MAX_SGE`] elements, a Read with other than one, an
    /// atomic with other than one of 8 bytes, or Immediate Data with any.
    InvalidSgl,
    /// The total length exceeds what one message may carry (2^32 - 1).
    TooLong,
    /// The QP is in a state that does not accept this work request. The
    /// protocol core never returns it: a QP queues work requests posted
    /// before RTS and completes those posted after it with a flush status.
    InvalidState,
    /// The QP takes its receives from a shared receive queue: receives
    /// are posted there, not to the QP.
    SrqAttached,
}

impl core::fmt::Display for PostError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Self::QueueFull => "queue full",
            Self::InvalidSgl => "invalid scatter/gather list",
            Self::TooLong => "message too long",
            Self::InvalidState => "QP state does not accept work requests",
            Self::SrqAttached => "the QP receives from a shared receive queue",
        })
    }
}

impl core::error::Error for PostError {}

/// The state of a queue pair (RFC 5040 §6 and the verbs QP states; see the
/// module documentation for the transitions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Created, not connected: work requests can be posted and wait for
    /// the connection.
    Idle,
    /// The MPA Request/Reply exchange (RFC 5044 §7, RFC 6581) is under way.
    Connecting,
    /// Ready to send (and receive): MPA full operation phase, RDMAP
    /// messages flow both ways.
    Rts,
    /// A graceful close is draining the transmit side.
    Closing,
    /// A protocol violation was found and a Terminate message (RFC 5040
    /// §4.8) is being sent; then the QP enters Error.
    Terminate,
    /// Failed or closed; every work request completes with a flush status.
    Error,
}

/// Connection events a QP reports to its owner, in order, through
/// `poll_event`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QpEvent {
    /// Responder: an MPA request arrived; accept or reject it.
    ConnectRequest(ConnectRequest),
    /// The connection is in RDMA mode. `private_data` is the peer's.
    Established {
        /// What the MPA exchange settled: CRC, markers, IRD/ORD, RTR.
        negotiated: Negotiated,
        /// The private data of the peer's MPA Request or Reply (IRD/ORD
        /// words removed).
        private_data: Vec<u8>,
    },
    /// Initiator: the peer rejected the connection.
    Rejected {
        /// The private data of the peer's rejecting MPA Reply (IRD/ORD
        /// words removed).
        private_data: Vec<u8>,
    },
    /// The MPA exchange failed; the QP is in Error.
    ConnectFailed(HandshakeError),
    /// We detected a protocol violation and sent (are sending) a Terminate.
    LocalTerminate(TermCode),
    /// The peer sent a Terminate with this error; the QP is in Error and
    /// its outstanding work requests are flushed.
    RemoteTerminate(TermCode),
    /// The connection closed (graceful disconnect or the peer's EOF).
    Disconnected,
    /// A completion queue overflowed; the QP moved to Error.
    CqOverrun,
}

/// Configuration of a queue pair, fixed at creation.
#[derive(Clone, Debug)]
pub struct QpConfig {
    /// Send queue depth: the most send-queue work requests outstanding
    /// (posted and not yet completed).
    pub sq_depth: usize,
    /// Receive queue depth: the most receives posted and not yet consumed.
    pub rq_depth: usize,
    /// The effective TCP MSS: FPDUs are sized so one fits a segment.
    pub emss: usize,
    /// The largest ULPDU accepted from the peer.
    pub rx_max_ulpdu: usize,
    /// Reject segments with reserved header bits set (RFC 5041/5040 say
    /// receivers ignore them; a conformance tester may want otherwise).
    pub strict_reserved: bool,
    /// Complete every send-queue work request, signaled or not.
    pub sig_all: bool,
}

impl Default for QpConfig {
    fn default() -> Self {
        Self {
            sq_depth: 256,
            rq_depth: 256,
            emss: 1460,
            rx_max_ulpdu: 65535,
            strict_reserved: false,
            sig_all: false,
        }
    }
}

/// Counters of one QP since its creation (monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpStats {
    /// FPDUs framed for transmission.
    pub tx_fpdus: u64,
    /// FPDUs received whose CRC (if negotiated) and headers were valid.
    pub rx_fpdus: u64,
    /// Payload bytes sent (Send, Write and Read Response data).
    pub tx_payload: u64,
    /// Payload bytes placed into local buffers (Send, Write and Read
    /// Response data).
    pub rx_payload: u64,
    /// FPDUs received with a bad MPA CRC32c; each one terminates the
    /// connection.
    pub crc_errors: u64,
}

#[derive(Clone, Copy, Debug)]
struct SqEntry {
    wr_id: u64,
    op: SendOp,
    sgl: [Sge; MAX_SGE],
    nsge: u8,
    len: u64,
    signaled: bool,
}

impl SqEntry {
    fn sges(&self) -> &[Sge] {
        &self.sgl[..usize::from(self.nsge)]
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct RqEntry {
    wr_id: u64,
    sgl: [Sge; MAX_SGE],
    nsge: u8,
    len: u64,
}

impl RqEntry {
    /// A checked receive, its list copied.
    pub(crate) fn new(wr: &RecvWr<'_>) -> Result<Self, PostError> {
        let len = wr.check()?;
        let (sgl, nsge) = copy_sgl(wr.sgl);
        Ok(Self {
            wr_id: wr.wr_id,
            sgl,
            nsge,
            len,
        })
    }
}

/// A send-queue work request that started and awaits (in-order) completion.
#[derive(Clone, Copy, Debug)]
struct Inflight {
    seq: u64,
    wr_id: u64,
    opcode: WcOpcode,
    byte_len: u32,
    signaled: bool,
    status: Option<WcStatus>,
}

/// The total length of a valid scatter/gather list.
fn sgl_len(sgl: &[Sge]) -> Result<u64, PostError> {
    if sgl.len() > MAX_SGE {
        return Err(PostError::InvalidSgl);
    }
    let len: u64 = sgl.iter().map(|s| u64::from(s.len)).sum();
    if len > u64::from(u32::MAX) {
        return Err(PostError::TooLong);
    }
    Ok(len)
}

/// A list [`sgl_len`] accepted, copied into a work-queue entry.
fn copy_sgl(sgl: &[Sge]) -> ([Sge; MAX_SGE], u8) {
    let mut out = [Sge::default(); MAX_SGE];
    out[..sgl.len()].copy_from_slice(sgl);
    (out, sgl.len() as u8)
}

/// What the QP borrows from its context while it runs.
pub(crate) struct Env<'a> {
    pub(crate) mem: &'a mut MemTable,
    pub(crate) cqs: &'a mut CqTable,
    pub(crate) srqs: &'a mut SrqTable,
}

/// Role in the MPA exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Initiator,
    Responder,
}

/// A queue pair. See the module documentation.
#[derive(Debug)]
pub struct Qp {
    id: QpId,
    pd: PdId,
    send_cq: CqId,
    recv_cq: CqId,
    config: QpConfig,
    state: QpState,
    role: Role,
    /// The MPA exchange, until it is done (boxed: no visit after it
    /// touches it).
    handshake: Option<Box<Handshake>>,
    negotiated: Option<Negotiated>,
    sq: VecDeque<SqEntry>,
    /// Posted receives; on a QP attached to a shared receive queue, the
    /// one (at most) the message in progress took from it.
    rq: VecDeque<RqEntry>,
    /// The shared receive queue receives come from, if any.
    srq: Option<SrqId>,
    inflight: VecDeque<Inflight>,
    orq: VecDeque<tx::OrqEntry>,
    /// Atomic Requests sent whose responses are awaited, oldest first.
    aorq: VecDeque<tx::AtomicOrqEntry>,
    irq: VecDeque<tx::IrqEntry>,
    events: VecDeque<QpEvent>,
    tx: tx::Tx,
    rx: rx::Rx,
    stats: QpStats,
    wants_close: bool,
    /// The MPA frame may not be completely transmitted yet.
    hs_tx_pending: bool,
    /// See [`handshake::Config::responder_sends_first`].
    responder_sends_first: bool,
    /// The span its events belong to (none: the current span).
    span: tracing::Span,
}

impl Qp {
    pub(crate) fn new(id: QpId, pd: PdId, send_cq: CqId, recv_cq: CqId, config: QpConfig) -> Self {
        Self {
            id,
            pd,
            send_cq,
            recv_cq,
            state: QpState::Idle,
            role: Role::Initiator,
            handshake: None,
            negotiated: None,
            sq: VecDeque::with_capacity(config.sq_depth),
            rq: VecDeque::with_capacity(config.rq_depth),
            srq: None,
            inflight: VecDeque::with_capacity(config.sq_depth),
            orq: VecDeque::new(),
            aorq: VecDeque::new(),
            irq: VecDeque::new(),
            events: VecDeque::new(),
            tx: tx::Tx::default(),
            rx: rx::Rx::default(),
            stats: QpStats::default(),
            wants_close: false,
            hs_tx_pending: false,
            responder_sends_first: false,
            span: tracing::Span::none(),
            config,
        }
    }

    /// The QP's identifier.
    pub fn id(&self) -> QpId {
        self.id
    }

    /// The span the QP's events belong to ([`tracing::Span::none`] until
    /// the owner sets one).
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    pub(crate) fn set_span(&mut self, span: tracing::Span) {
        self.span = span;
    }

    /// The shared receive queue the QP takes its receives from.
    pub fn srq(&self) -> Option<SrqId> {
        self.srq
    }

    /// Take receives from `srq` from now on (set once, at creation).
    pub(crate) fn set_srq(&mut self, srq: SrqId) {
        self.srq = Some(srq);
    }

    /// The current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Send-queue entries not yet retired: queued or in flight.
    pub fn sq_occupancy(&self) -> usize {
        self.sq.len() + self.inflight.len()
    }

    /// Posted receives not yet consumed (attached to a shared receive
    /// queue: the one the message in progress holds, if any).
    pub fn rq_occupancy(&self) -> usize {
        self.rq.len()
    }

    /// Counters.
    pub fn stats(&self) -> QpStats {
        self.stats
    }

    /// What the MPA exchange settled, once established.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.negotiated.as_ref()
    }

    /// Whether the owner should close the TCP connection now (after
    /// transmitting what [`Context::poll_transmit`] still yields).
    ///
    /// [`Context::poll_transmit`]: crate::verbs::Context::poll_transmit
    pub fn wants_close(&self) -> bool {
        self.wants_close && !self.tx.busy() && self.handshake_tx_idle()
    }

    fn handshake_tx_idle(&self) -> bool {
        !self.hs_tx_pending
    }

    // ---- connection setup -------------------------------------------------

    pub(crate) fn connect(
        &mut self,
        config: handshake::Config,
        private_data: &[u8],
        now: Instant,
    ) -> Result<(), HandshakeError> {
        if self.state != QpState::Idle {
            return Err(HandshakeError::NotExpected);
        }
        let (revision, crc, markers, p2p) =
            (config.revision, config.crc, config.markers, config.p2p);
        let (ird, ord) = (config.ird, config.ord);
        self.handshake = Some(Box::new(Handshake::initiator(config, private_data, now)?));
        self.role = Role::Initiator;
        self.state = QpState::Connecting;
        qp_event!(
            self.span,
            DEBUG,
            revision,
            crc,
            markers,
            p2p,
            ird,
            ord,
            private_data_len = private_data.len(),
            "connect: MPA request queued"
        );
        Ok(())
    }

    pub(crate) fn listen(
        &mut self,
        config: handshake::Config,
        now: Instant,
    ) -> Result<(), HandshakeError> {
        if self.state != QpState::Idle {
            return Err(HandshakeError::NotExpected);
        }
        self.responder_sends_first = config.responder_sends_first;
        self.handshake = Some(Box::new(Handshake::responder(config, now)));
        self.role = Role::Responder;
        self.state = QpState::Connecting;
        qp_event!(self.span, DEBUG, "accept: awaiting the MPA request");
        Ok(())
    }

    pub(crate) fn accept(
        &mut self,
        private_data: &[u8],
        env: &mut Env<'_>,
    ) -> Result<(), HandshakeError> {
        let hs = self.handshake.as_mut().ok_or(HandshakeError::NotExpected)?;
        hs.accept(private_data)?;
        qp_event!(
            self.span,
            DEBUG,
            private_data_len = private_data.len(),
            "connection accepted: MPA reply queued"
        );
        self.pump_handshake(env);
        Ok(())
    }

    pub(crate) fn reject(
        &mut self,
        private_data: &[u8],
        env: &mut Env<'_>,
    ) -> Result<(), HandshakeError> {
        let hs = self.handshake.as_mut().ok_or(HandshakeError::NotExpected)?;
        hs.reject(private_data)?;
        qp_event!(
            self.span,
            INFO,
            reason = "rejected by the application",
            "connection rejected: MPA reply with Reject queued"
        );
        self.pump_handshake(env);
        self.enter_error(env);
        self.wants_close = true;
        self.hs_tx_pending = true;
        Ok(())
    }

    /// Move handshake events into QP events and state.
    fn pump_handshake(&mut self, env: &mut Env<'_>) {
        while let Some(ev) = self
            .handshake
            .as_deref_mut()
            .and_then(Handshake::poll_event)
        {
            match ev {
                handshake::Event::ConnectRequest(req) => {
                    qp_event!(
                        self.span,
                        DEBUG,
                        revision = req.revision,
                        crc = req.crc,
                        markers = req.markers,
                        enhanced = req.ird_ord.is_some(),
                        private_data_len = req.private_data.len(),
                        "MPA request received"
                    );
                    self.events.push_back(QpEvent::ConnectRequest(req))
                }
                handshake::Event::Established {
                    negotiated,
                    private_data,
                } => {
                    self.tx
                        .setup(&negotiated, self.config.emss, self.role == Role::Initiator);
                    self.rx.setup(
                        &negotiated,
                        self.config.rx_max_ulpdu,
                        self.role == Role::Responder,
                    );
                    if self.role == Role::Initiator {
                        qp_event!(self.span, DEBUG, "MPA reply received");
                    }
                    qp_event!(
                        self.span,
                        INFO,
                        role = if self.role == Role::Initiator { "initiator" } else { "responder" },
                        revision = negotiated.revision,
                        crc = negotiated.crc,
                        markers_tx = negotiated.markers_tx,
                        markers_rx = negotiated.markers_rx,
                        ird = negotiated.ird,
                        ord = negotiated.ord,
                        p2p = negotiated.p2p,
                        rtr = ?negotiated.rtr,
                        "connection established (RTS)"
                    );
                    self.negotiated = Some(negotiated.clone());
                    self.state = QpState::Rts;
                    self.events.push_back(QpEvent::Established {
                        negotiated,
                        private_data,
                    });
                }
                handshake::Event::Rejected { private_data } => {
                    qp_event!(
                        self.span,
                        INFO,
                        reason = "rejected by the peer",
                        private_data_len = private_data.len(),
                        "connection rejected: MPA reply with Reject received"
                    );
                    self.events.push_back(QpEvent::Rejected { private_data });
                    self.enter_error(env);
                    self.wants_close = true;
                }
                handshake::Event::Failed(e) => {
                    qp_event!(
                        self.span,
                        WARN,
                        error = %e,
                        "connection failed: MPA exchange"
                    );
                    self.events.push_back(QpEvent::ConnectFailed(e));
                    self.enter_error(env);
                    self.wants_close = true;
                }
            }
        }
    }

    // ---- work requests ---------------------------------------------------

    pub(crate) fn post_send(
        &mut self,
        wr: &SendWr<'_>,
        env: &mut Env<'_>,
    ) -> Result<(), PostError> {
        let len = wr.check()?;
        let (sgl, nsge) = copy_sgl(wr.sgl);
        if self.sq_occupancy() >= self.config.sq_depth {
            return Err(PostError::QueueFull);
        }
        let entry = SqEntry {
            wr_id: wr.wr_id,
            op: wr.op,
            sgl,
            nsge,
            len,
            signaled: wr.signaled || self.config.sig_all,
        };
        match self.state {
            QpState::Idle | QpState::Connecting | QpState::Rts => {
                self.sq.push_back(entry);
                Ok(())
            }
            QpState::Error | QpState::Terminate | QpState::Closing => {
                // Verbs: posting to a QP in Error completes with a flush.
                let wc = self.flush_wc(entry.wr_id, sq_opcode(&entry.op));
                self.complete(self.send_cq, wc, env);
                Ok(())
            }
        }
    }

    pub(crate) fn post_recv(
        &mut self,
        wr: &RecvWr<'_>,
        env: &mut Env<'_>,
    ) -> Result<(), PostError> {
        if self.srq.is_some() {
            return Err(PostError::SrqAttached);
        }
        let len = wr.check()?;
        let (sgl, nsge) = copy_sgl(wr.sgl);
        if self.rq.len() >= self.config.rq_depth {
            return Err(PostError::QueueFull);
        }
        if self.state == QpState::Error {
            let wc = self.flush_wc(wr.wr_id, WcOpcode::Recv);
            self.complete(self.recv_cq, wc, env);
            return Ok(());
        }
        self.rq.push_back(RqEntry {
            wr_id: wr.wr_id,
            sgl,
            nsge,
            len,
        });
        Ok(())
    }

    // ---- completions and errors ------------------------------------------

    /// The completion of a work request flushed by the Error state.
    fn flush_wc(&self, wr_id: u64, opcode: WcOpcode) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status: WcStatus::WrFlushError,
            opcode,
            byte_len: 0,
            qp: self.id,
            invalidated_stag: None,
            solicited: false,
            imm_data: None,
        }
    }

    fn complete(&mut self, cq: CqId, wc: WorkCompletion, env: &mut Env<'_>) {
        let ok = env.cqs.push(cq, wc);
        if !ok && self.state != QpState::Error {
            qp_event!(self.span, WARN, cq = ?cq, "completion queue overrun");
            self.events.push_back(QpEvent::CqOverrun);
            self.enter_error(env);
            self.wants_close = true;
        }
    }

    /// Emit completions of finished send-queue requests, in posting order.
    fn drain_inflight(&mut self, env: &mut Env<'_>) {
        while let Some(front) = self.inflight.front() {
            let Some(status) = front.status else { break };
            let f = *front;
            self.inflight.pop_front();
            if f.signaled || status != WcStatus::Success {
                let wc = WorkCompletion {
                    wr_id: f.wr_id,
                    status,
                    opcode: f.opcode,
                    byte_len: f.byte_len,
                    qp: self.id,
                    invalidated_stag: None,
                    solicited: false,
                    imm_data: None,
                };
                self.complete(self.send_cq, wc, env);
            }
        }
    }

    /// Mark the oldest unfinished in-flight request with `status` (used when
    /// the peer terminates the connection because of it).
    fn fail_oldest_inflight(&mut self, status: WcStatus) {
        if let Some(f) = self.inflight.iter_mut().find(|f| f.status.is_none()) {
            f.status = Some(status);
        }
    }

    /// Move to Error and flush every outstanding work request.
    fn enter_error(&mut self, env: &mut Env<'_>) {
        if self.state != QpState::Terminate {
            self.state = QpState::Error;
        }
        let mut flushed = self.sq.len() + self.rq.len();
        for f in self.inflight.iter_mut() {
            if f.status.is_none() {
                f.status = Some(WcStatus::WrFlushError);
                flushed += 1;
            }
        }
        qp_event!(
            self.span,
            DEBUG,
            state = ?self.state,
            flushed,
            "QP to Error: outstanding work requests flushed"
        );
        self.drain_inflight(env);
        self.orq.clear();
        self.aorq.clear();
        self.irq.clear();
        self.tx.abort_messages();
        while let Some(e) = self.sq.pop_front() {
            let wc = self.flush_wc(e.wr_id, sq_opcode(&e.op));
            self.complete(self.send_cq, wc, env);
        }
        while let Some(e) = self.rq.pop_front() {
            let wc = self.flush_wc(e.wr_id, WcOpcode::Recv);
            self.complete(self.recv_cq, wc, env);
        }
    }

    /// A protocol violation was detected locally: queue a Terminate, report
    /// it, and flush.
    fn local_violation(&mut self, v: rx::Violation, env: &mut Env<'_>) {
        if matches!(self.state, QpState::Terminate | QpState::Error) {
            return;
        }
        self.events.push_back(QpEvent::LocalTerminate(v.code));
        if let Some(status) = v.recv_status {
            // The receive buffer the offending message was aimed at.
            if let Some(e) = self.rq.pop_front() {
                let wc = WorkCompletion {
                    wr_id: e.wr_id,
                    status,
                    opcode: WcOpcode::Recv,
                    byte_len: 0,
                    qp: self.id,
                    invalidated_stag: None,
                    solicited: false,
                    imm_data: None,
                };
                self.complete(self.recv_cq, wc, env);
            }
        }
        self.state = if self.tx.queue_terminate(&v) {
            term_event!(
                self.span,
                DEBUG,
                v.code,
                "protocol violation: Terminate queued"
            );
            QpState::Terminate
        } else {
            term_event!(
                self.span,
                WARN,
                v.code,
                "protocol violation: no Terminate can be sent"
            );
            QpState::Error
        };
        self.enter_error(env);
        self.wants_close = true;
    }

    // ---- I/O ---------------------------------------------------------------

    /// Feed bytes received from the TCP stream. Returns how many were
    /// consumed; fewer than offered only while the MPA exchange waits for
    /// the application (a responder that has not accepted yet).
    pub(crate) fn handle_input(&mut self, input: &[u8], now: Instant, env: &mut Env<'_>) -> usize {
        let mut used = 0;
        if self.state == QpState::Connecting {
            let Some(hs) = self.handshake.as_mut() else {
                return 0;
            };
            let r = hs.handle_input(input, now);
            self.pump_handshake(env);
            match r {
                Ok(n) => used = n,
                Err(_) => return input.len(),
            }
            if self.state != QpState::Rts {
                return used;
            }
        }
        match self.state {
            QpState::Rts => {
                used += self.rx_input(&input[used..], env);
                input.len().min(used)
            }
            // Nothing more is processed once the QP is closing or failed.
            _ => input.len(),
        }
    }

    /// The peer closed its side of the TCP connection.
    pub(crate) fn handle_eof(&mut self, env: &mut Env<'_>) {
        match self.state {
            QpState::Error | QpState::Terminate => {}
            _ => {
                qp_event!(self.span, INFO, state = ?self.state, "connection closed by the peer");
                self.events.push_back(QpEvent::Disconnected);
                self.enter_error(env);
            }
        }
        self.wants_close = true;
    }

    /// Begin a graceful close: flush every outstanding work request, let
    /// the FPDU being sent finish (the QP stays in Closing until it has),
    /// then move to Error and ask the owner to close the TCP connection.
    pub(crate) fn disconnect(&mut self, env: &mut Env<'_>) {
        match self.state {
            QpState::Error | QpState::Terminate | QpState::Closing => {}
            _ => {
                qp_event!(self.span, INFO, state = ?self.state, "disconnect");
                self.events.push_back(QpEvent::Disconnected);
                self.enter_error(env);
                if self.tx.busy() {
                    self.state = QpState::Closing;
                }
            }
        }
        self.wants_close = true;
    }

    /// Whether [`Context::poll_transmit`] may have bytes: false means it
    /// certainly has none (nothing queued, in progress or owed).
    ///
    /// [`Context::poll_transmit`]: crate::verbs::Context::poll_transmit
    pub fn may_transmit(&self) -> bool {
        self.handshake.is_some()
            || self.tx.has_pending()
            || !self.irq.is_empty()
            || !self.sq.is_empty()
    }

    /// Write the next bytes for the TCP stream into `out`; returns how
    /// many. No FPDU is started whose wire length exceeds what is left of
    /// `limit` (`usize::MAX`: no such bound).
    pub(crate) fn poll_transmit(
        &mut self,
        out: &mut [u8],
        limit: usize,
        env: &mut Env<'_>,
    ) -> usize {
        let mut n = 0;
        if let Some(hs) = self.handshake.as_mut() {
            let before = hs.tx_remaining();
            n += hs.poll_transmit(out);
            let sent = before > 0 && hs.tx_remaining() == 0;
            let (done, reject) = (hs.is_done(), hs.is_closed());
            if sent {
                let frame = match self.role {
                    Role::Initiator => "request",
                    Role::Responder => "reply",
                };
                qp_event!(self.span, DEBUG, frame, reject, "MPA frame sent");
            }
            self.hs_tx_pending = n == out.len();
            if n == out.len() {
                return n;
            }
            self.pump_handshake(env);
            if done && self.state != QpState::Connecting {
                // Established and our frame is out: the handshake has
                // nothing more to do.
                self.handshake = None;
            }
            if !done && self.state == QpState::Connecting {
                return n;
            }
        }
        if matches!(
            self.state,
            QpState::Rts | QpState::Closing | QpState::Terminate | QpState::Error
        ) {
            n += self.tx_output(&mut out[n..], limit.saturating_sub(n), env);
        }
        n
    }

    /// The next deadline, if any.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            QpState::Connecting => self.handshake.as_deref().and_then(Handshake::poll_timeout),
            _ => None,
        }
    }

    /// Handle timers due at `now`.
    pub(crate) fn handle_timeout(&mut self, now: Instant, env: &mut Env<'_>) {
        if self.state == QpState::Connecting {
            if let Some(hs) = self.handshake.as_mut() {
                hs.handle_timeout(now);
            }
            self.pump_handshake(env);
        }
    }

    /// The next event.
    pub(crate) fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }
}

fn sq_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send { .. } => WcOpcode::Send,
        SendOp::Write { .. } => WcOpcode::RdmaWrite,
        SendOp::Read { .. } => WcOpcode::RdmaRead,
        SendOp::LocalInvalidate { .. } => WcOpcode::LocalInvalidate,
        SendOp::ImmediateData { .. } => WcOpcode::ImmediateData,
        SendOp::FetchAdd { .. } => WcOpcode::AtomicFetchAdd,
        SendOp::CompareSwap { .. } => WcOpcode::AtomicCompareSwap,
    }
}

#[cfg(test)]
mod tests {
    /// A visit of a connection touches its QP's transmit and receive
    /// state; the parts no visit after setup or an error touches (the MPA
    /// exchange, a queued Terminate) are boxed, so that a server's
    /// thousands of QPs stay small. Inlining one of them again grows a QP
    /// by a quarter.
    #[test]
    fn cold_parts_stay_out_of_line() {
        let qp = size_of::<super::Qp>();
        assert!(qp <= 1280, "Qp is {qp} bytes");
        assert!(size_of::<super::tx::Tx>() <= 512);
    }
}
