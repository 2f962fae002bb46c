//! The verbs context: owner of protection domains, memory regions,
//! completion queues, shared receive queues and queue pairs of one engine.
//!
//! Objects are named by small copyable handles ([`PdId`], [`CqId`],
//! [`QpId`], STags); the context lends each QP the memory table and the
//! CQs while it runs, so nothing is shared or reference-counted. A backend
//! (the AF_XDP engine, the kernel-socket backend, or the in-memory
//! [`crate::testing::Pair`]) owns a context and moves bytes between each
//! QP and its TCP connection:
//!
//! ```text
//! loop {
//!     ctx.handle_input(qp, &received, now);     // bytes from TCP
//!     ctx.poll_transmit(qp, &mut buf, now);     // bytes for TCP
//!     while let Some(ev) = ctx.poll_event(qp) { .. }
//!     ctx.poll_cq(cq, &mut wcs);
//! }
//! ```

use crate::cq::{Cq, CqId, QpId, WorkCompletion};
use crate::mem::{Access, MemTable, MrInfo, PdId};
use crate::mpa::handshake::{self, HandshakeError};
use crate::qp::{PostError, Qp, QpConfig, QpEvent, QpState, QpStats, RecvWr, SendWr};
use crate::srq::SrqTable;
use crate::time::Instant;

mod shared_rq;

/// Why a verbs call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerbsError {
    /// The handle names no live object.
    InvalidHandle,
    /// The memory table is full.
    NoResources,
    /// Posting a work request failed.
    Post(PostError),
    /// A connection-setup call failed.
    Connect(HandshakeError),
    /// The object is in use (an SRQ with QPs attached).
    Busy,
    /// An argument is out of range (e.g. an SRQ limit above its capacity,
    /// or a QP and its SRQ in different protection domains).
    InvalidArgument,
}

impl core::fmt::Display for VerbsError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::InvalidHandle => f.write_str("invalid handle"),
            Self::NoResources => f.write_str("out of resources"),
            Self::Post(e) => write!(f, "post failed: {e}"),
            Self::Connect(e) => write!(f, "connection setup failed: {e}"),
            Self::Busy => f.write_str("object in use"),
            Self::InvalidArgument => f.write_str("invalid argument"),
        }
    }
}

impl core::error::Error for VerbsError {}

impl From<PostError> for VerbsError {
    fn from(e: PostError) -> Self {
        Self::Post(e)
    }
}

impl From<HandshakeError> for VerbsError {
    fn from(e: HandshakeError) -> Self {
        Self::Connect(e)
    }
}

/// Completion queues of a context, indexed by [`CqId`].
#[derive(Debug, Default)]
pub struct CqTable(Vec<Option<Cq>>);

impl CqTable {
    /// The queue named by `id`.
    pub fn get_mut(&mut self, id: CqId) -> Option<&mut Cq> {
        self.0.get_mut(id.0 as usize)?.as_mut()
    }
}

/// A device context. See the module documentation.
#[derive(Debug)]
pub struct Context {
    mem: MemTable,
    cqs: CqTable,
    qps: Vec<Option<Qp>>,
    next_pd: u32,
    srqs: SrqTable,
}

impl Context {
    /// A context; `seed` seeds the STag key generator.
    pub fn new(seed: u64) -> Self {
        Self {
            mem: MemTable::new(seed),
            cqs: CqTable::default(),
            qps: Vec::new(),
            next_pd: 1,
            srqs: SrqTable::default(),
        }
    }

    /// Allocate a protection domain.
    pub fn alloc_pd(&mut self) -> PdId {
        let pd = PdId(self.next_pd);
        self.next_pd += 1;
        pd
    }

    /// Register a buffer owned by the context.
    pub fn reg_mr_owned(
        &mut self,
        pd: PdId,
        buf: Box<[u8]>,
        access: Access,
    ) -> Result<MrInfo, VerbsError> {
        self.mem
            .register_owned(pd, buf, access)
            .map_err(|_| VerbsError::NoResources)
    }

    /// Register `len` bytes at `addr`; tagged offsets are the addresses.
    ///
    /// # Safety
    /// See [`MemTable::register`]: the memory must stay valid until
    /// deregistered, and the application must not hold references to it
    /// while the peer may write it.
    #[allow(unsafe_code)]
    pub unsafe fn reg_mr(
        &mut self,
        pd: PdId,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MrInfo, VerbsError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.mem.register(pd, addr, len, addr as u64, access) }
            .ok_or(VerbsError::NoResources)
    }

    /// Deregister a region; returns the buffer of an owned one.
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<Option<Box<[u8]>>, VerbsError> {
        self.mem
            .deregister(lkey)
            .map_err(|_| VerbsError::InvalidHandle)
    }

    /// The memory table (read access: region bytes, validity).
    pub fn mem(&self) -> &MemTable {
        &self.mem
    }

    /// The memory table, mutable (e.g. to fill an owned buffer).
    pub fn mem_mut(&mut self) -> &mut MemTable {
        &mut self.mem
    }

    /// Create a completion queue of `capacity` entries.
    pub fn create_cq(&mut self, capacity: usize) -> CqId {
        let id = CqId(self.cqs.0.len() as u32);
        self.cqs.0.push(Some(Cq::new(capacity)));
        id
    }

    /// The completion queue named by `id`.
    pub fn cq(&mut self, id: CqId) -> Option<&mut Cq> {
        self.cqs.get_mut(id)
    }

    /// Poll up to `out.len()` completions.
    pub fn poll_cq(&mut self, id: CqId, out: &mut [WorkCompletion]) -> usize {
        self.cqs.get_mut(id).map_or(0, |cq| cq.poll(out))
    }

    /// Create a queue pair.
    pub fn create_qp(
        &mut self,
        pd: PdId,
        send_cq: CqId,
        recv_cq: CqId,
        config: QpConfig,
    ) -> Result<QpId, VerbsError> {
        if self.cqs.get_mut(send_cq).is_none() || self.cqs.get_mut(recv_cq).is_none() {
            return Err(VerbsError::InvalidHandle);
        }
        let id = QpId(self.qps.len() as u32);
        self.qps
            .push(Some(Qp::new(id, pd, send_cq, recv_cq, config)));
        Ok(id)
    }

    /// Destroy a queue pair (without flushing: destroy after Error).
    pub fn destroy_qp(&mut self, qp: QpId) -> Result<(), VerbsError> {
        let q = self
            .qps
            .get_mut(qp.0 as usize)
            .and_then(Option::take)
            .ok_or(VerbsError::InvalidHandle)?;
        if let Some(srq) = q.srq() {
            self.srqs.detach(srq);
        }
        Ok(())
    }

    /// The queue pair named by `qp`.
    pub fn qp(&self, qp: QpId) -> Option<&Qp> {
        self.qps.get(qp.0 as usize)?.as_ref()
    }

    fn with_qp<R>(
        &mut self,
        qp: QpId,
        f: impl FnOnce(&mut Qp, &mut crate::qp::Env<'_>) -> R,
    ) -> Result<R, VerbsError> {
        let q = self
            .qps
            .get_mut(qp.0 as usize)
            .and_then(Option::as_mut)
            .ok_or(VerbsError::InvalidHandle)?;
        let mut env = crate::qp::Env {
            mem: &mut self.mem,
            cqs: &mut self.cqs,
            srqs: &mut self.srqs,
        };
        Ok(f(q, &mut env))
    }

    /// Start the MPA exchange as initiator (the TCP connection is up).
    pub fn connect(
        &mut self,
        qp: QpId,
        config: handshake::Config,
        private_data: &[u8],
        now: Instant,
    ) -> Result<(), VerbsError> {
        self.with_qp(qp, |q, _| q.connect(config, private_data, now))?
            .map_err(VerbsError::from)
    }

    /// Wait for the peer's MPA request as responder (a TCP connection was
    /// accepted).
    pub fn listen(
        &mut self,
        qp: QpId,
        config: handshake::Config,
        now: Instant,
    ) -> Result<(), VerbsError> {
        self.with_qp(qp, |q, _| q.listen(config, now))?
            .map_err(VerbsError::from)
    }

    /// Accept the peer's connection request.
    pub fn accept(&mut self, qp: QpId, private_data: &[u8]) -> Result<(), VerbsError> {
        self.with_qp(qp, |q, env| q.accept(private_data, env))?
            .map_err(VerbsError::from)
    }

    /// Reject the peer's connection request.
    pub fn reject(&mut self, qp: QpId, private_data: &[u8]) -> Result<(), VerbsError> {
        self.with_qp(qp, |q, env| q.reject(private_data, env))?
            .map_err(VerbsError::from)
    }

    /// Post a send-queue work request.
    pub fn post_send(&mut self, qp: QpId, wr: &SendWr<'_>) -> Result<(), VerbsError> {
        self.with_qp(qp, |q, env| q.post_send(wr, env))?
            .map_err(VerbsError::from)
    }

    /// Post a receive work request.
    pub fn post_recv(&mut self, qp: QpId, wr: &RecvWr<'_>) -> Result<(), VerbsError> {
        self.with_qp(qp, |q, env| q.post_recv(wr, env))?
            .map_err(VerbsError::from)
    }

    /// Feed bytes from the TCP stream; returns how many were consumed.
    pub fn handle_input(&mut self, qp: QpId, input: &[u8], now: Instant) -> usize {
        self.with_qp(qp, |q, env| q.handle_input(input, now, env))
            .unwrap_or(input.len())
    }

    /// The TCP stream reached its end (the peer closed or reset it).
    pub fn handle_eof(&mut self, qp: QpId) {
        let _ = self.with_qp(qp, |q, env| q.handle_eof(env));
    }

    /// Write bytes for the TCP stream into `out`; returns how many. Stops
    /// at any byte when `out` is full; the next call continues there.
    pub fn poll_transmit(&mut self, qp: QpId, out: &mut [u8]) -> usize {
        self.poll_transmit_within(qp, out, usize::MAX)
    }

    /// Like [`Context::poll_transmit`], for a transport that keeps FPDUs
    /// inside TCP segments (RFC 5044 §8, FPDU alignment): no FPDU is
    /// started that would not end within `limit` bytes of the start of
    /// `out`. `limit` may exceed `out.len()` when the segment continues in
    /// a second buffer (a ring wrapping round): an FPDU that fits the
    /// limit but not `out` is written in part, and the next call, with
    /// the second buffer and the rest of the limit, finishes it first.
    /// An FPDU larger than `limit` waits, so a caller passes at least the
    /// effective MSS the QP was set up with.
    pub fn poll_transmit_within(&mut self, qp: QpId, out: &mut [u8], limit: usize) -> usize {
        self.with_qp(qp, |q, env| q.poll_transmit(out, limit, env))
            .unwrap_or(0)
    }

    /// The next connection or error event of `qp`.
    pub fn poll_event(&mut self, qp: QpId) -> Option<QpEvent> {
        self.with_qp(qp, |q, _| q.poll_event()).ok().flatten()
    }

    /// When `handle_timeout` must be called next.
    pub fn poll_timeout(&self, qp: QpId) -> Option<Instant> {
        self.qp(qp)?.poll_timeout()
    }

    /// Run timers due at `now`.
    pub fn handle_timeout(&mut self, qp: QpId, now: Instant) {
        let _ = self.with_qp(qp, |q, env| q.handle_timeout(now, env));
    }

    /// Close the connection: outstanding work requests are flushed.
    pub fn disconnect(&mut self, qp: QpId) {
        let _ = self.with_qp(qp, |q, env| q.disconnect(env));
    }

    /// The state of `qp`.
    pub fn qp_state(&self, qp: QpId) -> Option<QpState> {
        self.qp(qp).map(Qp::state)
    }

    /// `qp`'s send-queue entries not yet retired (queued or in flight)
    /// and receives not yet consumed: what counts against its depths.
    pub fn qp_occupancy(&self, qp: QpId) -> Option<(usize, usize)> {
        self.qp(qp).map(|q| (q.sq_occupancy(), q.rq_occupancy()))
    }

    /// Counters of `qp`.
    pub fn qp_stats(&self, qp: QpId) -> Option<QpStats> {
        self.qp(qp).map(Qp::stats)
    }

    /// Whether [`Context::poll_transmit`] may have bytes for `qp`: when
    /// false, an owner polling every connection on every pass can skip
    /// the call (and the transport buffer it would lend).
    pub fn may_transmit(&self, qp: QpId) -> bool {
        self.qp(qp).is_some_and(Qp::may_transmit)
    }

    /// Whether the owner should close `qp`'s TCP connection.
    pub fn wants_close(&self, qp: QpId) -> bool {
        self.qp(qp).is_some_and(Qp::wants_close)
    }
}
