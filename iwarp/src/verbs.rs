//! The verbs context: owner of protection domains, memory regions,
//! completion queues, shared receive queues and queue pairs of one engine.
//!
//! Objects are named by small copyable handles ([`PdId`], [`CqId`],
//! [`QpId`], STags); the context lends each QP the memory table and the
//! CQs while it runs, so nothing is shared or reference-counted.
//!
//! PDs, CQs and QPs live in generational slabs ([`crate::slab`]): a
//! destroyed object's slot is reused, so the tables stay as large as the
//! most objects alive at once, and a handle carries its slot's generation,
//! so a stale handle names nothing (calls with it fail with
//! [`VerbsError::InvalidHandle`] or do nothing) rather than reaching the
//! object that took the slot. STags do the same with their key
//! ([`crate::mem`]). A PD cannot be deallocated while QPs or regions use
//! it, nor a CQ destroyed while QPs use it ([`VerbsError::Busy`]). A backend
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
use crate::slab::Slab;
use crate::srq::SrqTable;
use crate::time::Instant;

mod shared_rq;

/// Why a verbs call on a [`Context`] failed. A failed call changes
/// nothing, except where a method says otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerbsError {
    /// The handle (or STag) names no live object: it was never issued, or
    /// its object is destroyed and the slot's generation moved on.
    InvalidHandle,
    /// A table (memory, PDs, CQs or QPs) is full.
    NoResources,
    /// The object is still in use: a PD by QPs or memory regions, a CQ by
    /// QPs, an SRQ by QPs attached to it.
    Busy,
    /// The QP refused a work request; the request is not queued and
    /// produces no completion.
    Post(PostError),
    /// A connection-setup call (`connect`, `listen`, `accept`, `reject`)
    /// was refused; [`HandshakeError::NotExpected`] when the QP is not in
    /// the state the call needs.
    Connect(HandshakeError),
    /// An argument is out of range (e.g. an SRQ limit above its capacity,
    /// or a QP and its SRQ in different protection domains).
    InvalidArgument,
}

impl core::fmt::Display for VerbsError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::InvalidHandle => f.write_str("invalid handle"),
            Self::NoResources => f.write_str("out of resources"),
            Self::Busy => f.write_str("in use"),
            Self::Post(e) => write!(f, "post failed: {e}"),
            Self::Connect(e) => write!(f, "connection setup failed: {e}"),
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

/// Completion queues of a context, named by [`CqId`].
#[derive(Debug, Default)]
pub struct CqTable {
    slots: Slab<CqSlot>,
    /// The queues that received a completion since the last
    /// [`Context::take_ready_cqs`], each once, in the order they first
    /// did.
    ready: Vec<CqId>,
}

#[derive(Debug)]
struct CqSlot {
    cq: Cq,
    /// References from QPs (a QP using it for both queues counts twice).
    users: u32,
    /// Listed in [`CqTable::ready`].
    listed: bool,
}

impl CqTable {
    /// The queue named by `id`, `None` for a stale or unknown handle.
    pub fn get_mut(&mut self, id: CqId) -> Option<&mut Cq> {
        self.slots.get_mut(id.key()).map(|s| &mut s.cq)
    }

    /// Append `wc` to queue `id` and list the queue as ready. Returns
    /// `false` for an unknown queue or an overrun (see [`Cq::push`]).
    pub fn push(&mut self, id: CqId, wc: WorkCompletion) -> bool {
        let Some(slot) = self.slots.get_mut(id.key()) else {
            return false;
        };
        if !slot.listed {
            slot.listed = true;
            self.ready.push(id);
        }
        slot.cq.push(wc)
    }
}

/// A live protection domain.
#[derive(Debug, Default)]
struct PdSlot {
    /// QPs of the PD (its regions are counted by the memory table).
    qps: u32,
}

/// A QP and the objects it holds on to.
#[derive(Debug)]
struct QpSlot {
    /// Boxed: a vacant slot costs a pointer, not a whole QP.
    qp: Box<Qp>,
    pd: PdId,
    send_cq: CqId,
    recv_cq: CqId,
}

/// Live objects, or slots, of each table of a [`Context`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandleCounts {
    /// Protection domains.
    pub pds: usize,
    /// Completion queues.
    pub cqs: usize,
    /// Queue pairs.
    pub qps: usize,
    /// Memory regions (registered STags).
    pub mrs: usize,
}

/// A device context. See the module documentation.
#[derive(Debug)]
pub struct Context {
    mem: MemTable,
    cqs: CqTable,
    qps: Slab<QpSlot>,
    pds: Slab<PdSlot>,
    srqs: SrqTable,
}

impl Context {
    /// A context; `seed` seeds the STag key generator.
    pub fn new(seed: u64) -> Self {
        Self {
            mem: MemTable::new(seed),
            cqs: CqTable::default(),
            qps: Slab::new(),
            pds: Slab::new(),
            srqs: SrqTable::default(),
        }
    }

    /// Allocate a protection domain. When the PD table is full, the
    /// handle returned names nothing (every use of it fails with
    /// [`VerbsError::InvalidHandle`]); [`Context::try_alloc_pd`] says so.
    pub fn alloc_pd(&mut self) -> PdId {
        self.try_alloc_pd().unwrap_or(PdId::from_raw(0))
    }

    /// Allocate a protection domain, or fail with
    /// [`VerbsError::NoResources`] when the PD table is full.
    pub fn try_alloc_pd(&mut self) -> Result<PdId, VerbsError> {
        self.pds
            .insert(PdSlot::default())
            .map(PdId::from_key)
            .ok_or(VerbsError::NoResources)
    }

    /// Deallocate a protection domain; its slot is reused. Fails with
    /// [`VerbsError::Busy`] while QPs or memory regions use it.
    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<(), VerbsError> {
        let slot = self.pds.get(pd.key()).ok_or(VerbsError::InvalidHandle)?;
        if slot.qps > 0 || self.mem.has_pd(pd) {
            return Err(VerbsError::Busy);
        }
        self.pds.remove(pd.key());
        Ok(())
    }

    fn check_pd(&self, pd: PdId) -> Result<(), VerbsError> {
        if self.pds.contains(pd.key()) {
            Ok(())
        } else {
            Err(VerbsError::InvalidHandle)
        }
    }

    /// The number of live objects in each table.
    pub fn live(&self) -> HandleCounts {
        HandleCounts {
            pds: self.pds.len(),
            cqs: self.cqs.slots.len(),
            qps: self.qps.len(),
            mrs: self.mem.len(),
        }
    }

    /// Slots of each table: the most objects alive at once, which bounds
    /// the memory the tables keep.
    pub fn slots(&self) -> HandleCounts {
        HandleCounts {
            pds: self.pds.slots(),
            cqs: self.cqs.slots.slots(),
            qps: self.qps.slots(),
            mrs: self.mem.slots(),
        }
    }

    /// Register a buffer the context takes ownership of, with `access`
    /// rights, in protection domain `pd`; tagged offsets start at the
    /// buffer's address. The returned [`MrInfo`] carries the STag used as
    /// both lkey and rkey. [`Context::dereg_mr`] gives the buffer back.
    ///
    /// Errors: [`VerbsError::InvalidHandle`] for an unknown `pd`;
    /// [`VerbsError::NoResources`] when the memory table is full (the
    /// buffer is dropped).
    pub fn reg_mr_owned(
        &mut self,
        pd: PdId,
        buf: Box<[u8]>,
        access: Access,
    ) -> Result<MrInfo, VerbsError> {
        self.check_pd(pd)?;
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
        self.check_pd(pd)?;
        // SAFETY: forwarded from the caller.
        unsafe { self.reg_mr_iova(pd, addr, len, addr as u64, access) }
    }

    /// Register `len` bytes at `addr` whose tagged offsets start at `iova`
    /// (as `ibv_reg_mr_iova2`): byte `k` of the region is tagged offset
    /// `iova + k`, for local SGEs and for the peer's tagged messages.
    ///
    /// Errors: [`VerbsError::InvalidHandle`] for an unknown `pd`;
    /// [`VerbsError::NoResources`] when the memory table is full.
    ///
    /// # Safety
    /// As [`Context::reg_mr`] (see [`MemTable::register`]).
    #[allow(unsafe_code)]
    pub unsafe fn reg_mr_iova(
        &mut self,
        pd: PdId,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrInfo, VerbsError> {
        self.check_pd(pd)?;
        // SAFETY: forwarded from the caller.
        unsafe { self.mem.register(pd, addr, len, iova, access) }.ok_or(VerbsError::NoResources)
    }

    /// Deregister a region; returns the buffer of an owned one. Its slot
    /// is reused, with another key: the old STag stays invalid.
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

    /// Create a completion queue of `capacity` entries. When the CQ
    /// table is full, the handle returned names nothing;
    /// [`Context::try_create_cq`] says so.
    pub fn create_cq(&mut self, capacity: usize) -> CqId {
        self.try_create_cq(capacity).unwrap_or(CqId::from_raw(0))
    }

    /// Create a completion queue of `capacity` entries, or fail with
    /// [`VerbsError::NoResources`] when the CQ table is full.
    pub fn try_create_cq(&mut self, capacity: usize) -> Result<CqId, VerbsError> {
        let slot = CqSlot {
            cq: Cq::new(capacity),
            users: 0,
            listed: false,
        };
        self.cqs
            .slots
            .insert(slot)
            .map(CqId::from_key)
            .ok_or(VerbsError::NoResources)
    }

    /// Destroy a completion queue (with the completions it holds); its
    /// slot is reused. Fails with [`VerbsError::Busy`] while QPs use it.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<(), VerbsError> {
        let slot = self
            .cqs
            .slots
            .get(cq.key())
            .ok_or(VerbsError::InvalidHandle)?;
        if slot.users > 0 {
            return Err(VerbsError::Busy);
        }
        self.cqs.slots.remove(cq.key());
        Ok(())
    }

    /// The completion queue named by `id`.
    pub fn cq(&mut self, id: CqId) -> Option<&mut Cq> {
        self.cqs.get_mut(id)
    }

    /// The completion queues that received a completion (or an overrun)
    /// since the last call, each once, appended to `out`: what a poller
    /// moving completions out of the core visits, instead of every queue.
    pub fn take_ready_cqs(&mut self, out: &mut Vec<CqId>) {
        for id in self.cqs.ready.drain(..) {
            if let Some(slot) = self.cqs.slots.get_mut(id.key()) {
                slot.listed = false;
                out.push(id);
            }
        }
    }

    /// Poll up to `out.len()` completions.
    pub fn poll_cq(&mut self, id: CqId, out: &mut [WorkCompletion]) -> usize {
        self.cqs.get_mut(id).map_or(0, |cq| cq.poll(out))
    }

    /// Create a queue pair in `pd` whose send-queue and receive
    /// completions go to `send_cq` and `recv_cq` (which may be the same
    /// queue). The QP starts [`QpState::Idle`]; [`Context::connect`] or
    /// [`Context::listen`] starts the MPA exchange once the TCP connection
    /// is up.
    ///
    /// Errors: [`VerbsError::InvalidHandle`] for an unknown PD or CQ;
    /// [`VerbsError::NoResources`] when the QP table is full.
    pub fn create_qp(
        &mut self,
        pd: PdId,
        send_cq: CqId,
        recv_cq: CqId,
        config: QpConfig,
    ) -> Result<QpId, VerbsError> {
        self.check_pd(pd)?;
        if self.cqs.get_mut(send_cq).is_none() || self.cqs.get_mut(recv_cq).is_none() {
            return Err(VerbsError::InvalidHandle);
        }
        let key = self
            .qps
            .insert_with(|key| QpSlot {
                qp: Box::new(Qp::new(QpId::from_key(key), pd, send_cq, recv_cq, config)),
                pd,
                send_cq,
                recv_cq,
            })
            .ok_or(VerbsError::NoResources)?;
        self.hold(pd, send_cq, recv_cq, true);
        Ok(QpId::from_key(key))
    }

    /// Count a QP's references to its PD and CQs in (`take`) or out.
    fn hold(&mut self, pd: PdId, send_cq: CqId, recv_cq: CqId, take: bool) {
        let count = |n: &mut u32| {
            *n = if take {
                n.saturating_add(1)
            } else {
                n.saturating_sub(1)
            }
        };
        if let Some(p) = self.pds.get_mut(pd.key()) {
            count(&mut p.qps);
        }
        for cq in [send_cq, recv_cq] {
            if let Some(c) = self.cqs.slots.get_mut(cq.key()) {
                count(&mut c.users);
            }
        }
    }

    /// Destroy a queue pair (without flushing: destroy after Error); its
    /// slot is reused.
    pub fn destroy_qp(&mut self, qp: QpId) -> Result<(), VerbsError> {
        let slot = self.qps.remove(qp.key()).ok_or(VerbsError::InvalidHandle)?;
        self.hold(slot.pd, slot.send_cq, slot.recv_cq, false);
        if let Some(srq) = slot.qp.srq() {
            self.srqs.detach(srq);
        }
        Ok(())
    }

    /// The queue pair named by `qp`, `None` for a stale or unknown handle.
    pub fn qp(&self, qp: QpId) -> Option<&Qp> {
        self.qps.get(qp.key()).map(|s| &*s.qp)
    }

    /// Attribute the `tracing` events of `qp` to `span` (the owner's
    /// connection span): see [`crate::qp`].
    pub fn set_qp_span(&mut self, qp: QpId, span: tracing::Span) -> Result<(), VerbsError> {
        let slot = self
            .qps
            .get_mut(qp.key())
            .ok_or(VerbsError::InvalidHandle)?;
        slot.qp.set_span(span);
        Ok(())
    }

    fn with_qp<R>(
        &mut self,
        qp: QpId,
        f: impl FnOnce(&mut Qp, &mut crate::qp::Env<'_>) -> R,
    ) -> Result<R, VerbsError> {
        let q = &mut self
            .qps
            .get_mut(qp.key())
            .ok_or(VerbsError::InvalidHandle)?
            .qp;
        let mut env = crate::qp::Env {
            mem: &mut self.mem,
            cqs: &mut self.cqs,
            srqs: &mut self.srqs,
        };
        Ok(f(q, &mut env))
    }

    /// Start the MPA exchange as initiator (the TCP connection is up): the
    /// MPA Request carrying `private_data` is queued for
    /// [`Context::poll_transmit`], and [`QpEvent::Established`],
    /// [`QpEvent::Rejected`] or [`QpEvent::ConnectFailed`] follows.
    ///
    /// Errors: [`VerbsError::Connect`] with `NotExpected` unless the QP is
    /// Idle, or with the configuration errors of
    /// [`handshake::Handshake::initiator`] (revision, private data length,
    /// RTR set).
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
    /// accepted); [`QpEvent::ConnectRequest`] reports it.
    ///
    /// Errors: [`VerbsError::Connect`] with `NotExpected` unless the QP is
    /// Idle.
    pub fn listen(
        &mut self,
        qp: QpId,
        config: handshake::Config,
        now: Instant,
    ) -> Result<(), VerbsError> {
        self.with_qp(qp, |q, _| q.listen(config, now))?
            .map_err(VerbsError::from)
    }

    /// Accept the peer's connection request: the MPA Reply carrying
    /// `private_data` is queued and the QP enters RTS
    /// ([`QpEvent::Established`]).
    ///
    /// Errors: [`VerbsError::Connect`] with `NotExpected` unless a
    /// [`QpEvent::ConnectRequest`] awaits an answer, or with
    /// `PrivateDataTooLong` beyond 512 bytes (508 with RFC 6581 IRD/ORD
    /// words); the call may then be retried.
    pub fn accept(&mut self, qp: QpId, private_data: &[u8]) -> Result<(), VerbsError> {
        self.with_qp(qp, |q, env| q.accept(private_data, env))?
            .map_err(VerbsError::from)
    }

    /// Reject the peer's connection request: an MPA Reply with the R flag
    /// set, carrying `private_data`, is queued; the QP enters Error and
    /// [`Context::wants_close`] turns true. Errors as [`Context::accept`].
    pub fn reject(&mut self, qp: QpId, private_data: &[u8]) -> Result<(), VerbsError> {
        self.with_qp(qp, |q, env| q.reject(private_data, env))?
            .map_err(VerbsError::from)
    }

    /// Post a send-queue work request. Requests run in posting order; ones
    /// posted before RTS wait for the connection, ones posted while the QP
    /// closes, terminates or is in Error complete at once with [`crate::cq::WcStatus::WrFlushError`].
    ///
    /// Errors: [`VerbsError::InvalidHandle`] for an unknown QP;
    /// [`VerbsError::Post`] with the [`PostError`] that describes a bad
    /// scatter/gather list or a full send queue.
    pub fn post_send(&mut self, qp: QpId, wr: &SendWr<'_>) -> Result<(), VerbsError> {
        self.with_qp(qp, |q, env| q.post_send(wr, env))?
            .map_err(VerbsError::from)
    }

    /// Post a receive work request: a buffer for the next incoming Send or
    /// Immediate Data, consumed in posting order (RFC 5041 untagged
    /// buffers, matched by MSN). In Error it completes at once with a
    /// flush status.
    ///
    /// Errors: [`VerbsError::InvalidHandle`] for an unknown QP;
    /// [`VerbsError::Post`] for a bad scatter/gather list, a full receive
    /// queue, or a QP attached to a shared receive queue.
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

    /// Run the QP's timers due at `now` (the MPA exchange deadline); an
    /// early or repeated call does nothing.
    pub fn handle_timeout(&mut self, qp: QpId, now: Instant) {
        let _ = self.with_qp(qp, |q, env| q.handle_timeout(now, env));
    }

    /// Close the connection: outstanding work requests are flushed.
    pub fn disconnect(&mut self, qp: QpId) {
        let _ = self.with_qp(qp, |q, env| q.disconnect(env));
    }

    /// The state of `qp`, `None` for an unknown handle.
    pub fn qp_state(&self, qp: QpId) -> Option<QpState> {
        self.qp(qp).map(Qp::state)
    }

    /// `qp`'s send-queue entries not yet retired (queued or in flight)
    /// and receives not yet consumed: what counts against its depths.
    pub fn qp_occupancy(&self, qp: QpId) -> Option<(usize, usize)> {
        self.qp(qp).map(|q| (q.sq_occupancy(), q.rq_occupancy()))
    }

    /// The counters of `qp`, `None` for an unknown handle.
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
