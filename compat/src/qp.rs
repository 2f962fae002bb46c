//! Queue pairs: creation (`ibv_create_qp`, the extended context's
//! `create_qp_ex`), state, the legacy post API (`ops.post_send`,
//! `ops.post_recv`), the extended post API of `struct ibv_qp_ex`
//! (`ibv_wr_start` … `ibv_wr_complete`) and inline data.
//!
//! A QP handle is the address of the library's QP object in an arena of
//! QPs: its first field is the `ibv_qp_ex`, whose first field is the
//! `ibv_qp`, so `ibv_qp *`, `ibv_qp_ex *` and the object share one
//! address, as `ibv_qp_to_qp_ex` and the `wr_*` function pointers expect.
//! The data path checks handles in the arena, without a process-wide
//! lock; the registry of live objects also lists QPs, for the control
//! path.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::{null_mut, NonNull};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use iwarp_engine::iwarp;
use iwarp_engine::{
    Access, Mr, Pd, PostError, Qp, QpAsyncEvent, QpInit, QpState, RecvWr, SendOp, SendWr, Sge,
};

use crate::arena::Arena;
use crate::async_event::Source;
use crate::srq::{srq_obj, SrqObj};
use crate::sys::*;
use crate::verbs::{cq_obj, global, CqObj, PdObj};
use crate::{fail_at, is_live, lock, obj, register, set_errno, unregister, Kind};

/// The most inline data one work request carries (`cap.max_inline_data`
/// of every QP).
pub const MAX_INLINE: usize = 256;

/// The operations of the extended post API the engine performs
/// (`send_ops_flags` of `ibv_qp_init_attr_ex`).
const SUPPORTED_SEND_OPS: u64 = (IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_SEND_WITH_INV) as u64;

/// The send flags of a work request this library honours.
const KNOWN_SEND_FLAGS: u32 =
    IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE;

/// A receive posted before the connection exists, passed to the engine
/// when it connects or accepts.
pub(crate) struct EarlyRecv {
    wr_id: u64,
    sgl: Vec<Sge>,
}

enum QpConn {
    /// Not connected: receives wait here.
    Idle(Vec<EarlyRecv>),
    /// The connect or accept runs; receives posted meanwhile wait here.
    Connecting(Vec<EarlyRecv>),
    Connected(Arc<Qp>),
}

/// A queue pair: its attributes until the connection manager connects
/// it, then the engine's QP.
#[repr(C)]
pub(crate) struct QpObj {
    /// The application reads `qp_base.state` (libibverbs keeps it
    /// current) and writes `wr_id` and `wr_flags` before each `wr_*`
    /// operation, so the struct is shared with it.
    raw: UnsafeCell<ibv_qp_ex>,
    init: QpInit,
    cap: ibv_qp_cap,
    conn: Mutex<QpConn>,
    /// The engine QP once connected (never unset): the data path reads it
    /// without a lock.
    connected: OnceLock<Arc<Qp>>,
    state: AtomicU32,
    /// The engine QP's number in the core, for work completions.
    core_id: AtomicU32,
    /// `send_ops_flags` of an extended QP (0: created without them).
    send_ops: u64,
    /// The extended post API's work requests between `wr_start` and
    /// `wr_complete`.
    batch: Mutex<Batch>,
    /// Where inline data waits for the engine, made at the first inline
    /// work request.
    inline: Mutex<Option<InlineRing>>,
    /// Its asynchronous events handed out and not acked
    /// ([`crate::async_event`]).
    events: Mutex<Handed>,
    /// Signalled when an event is acked.
    acked: Condvar,
}

/// See [`QpObj::events`].
#[derive(Default)]
struct Handed {
    unacked: usize,
    /// `ibv_destroy_qp` began: no more events are handed out.
    stopped: bool,
}

// SAFETY: `raw` is the rdma-core struct the application shares; the
// library writes only `qp_base.state` after creation (a plain integer,
// stored volatile) and reads the rest; every other field is Sync.
unsafe impl Sync for QpObj {}
// SAFETY: as for Sync; the raw pointers in `raw` are the application's
// handles, not owned.
unsafe impl Send for QpObj {}

/// Every QP, for the data path's lock-free handle checks.
static QPS: Arena<QpObj> = Arena::new();

/// The live QP at `qp` (data path: no process-wide lock).
pub(crate) fn qp_obj<'a>(qp: *const ibv_qp) -> Option<&'a QpObj> {
    QPS.get(qp.cast())
}

static NEXT_QPN: AtomicU32 = AtomicU32::new(1);

impl QpObj {
    pub(crate) fn raw(&self) -> &ibv_qp {
        // SAFETY: the application writes only `wr_id` and `wr_flags` of
        // the extended struct (read through `ex_wr_fields`), the library
        // only `qp_base.state` (volatile, `set_state`); the rest is
        // read-only after creation.
        unsafe { &(*self.raw.get()).qp_base }
    }

    /// `wr_id` and `wr_flags` as the application set them for the next
    /// `wr_*` operation.
    fn ex_wr_fields(&self) -> (u64, u32) {
        let p = self.raw.get();
        // SAFETY: plain integers of the live struct, written by the
        // calling thread before its call.
        unsafe {
            (
                (&raw const (*p).wr_id).read_volatile(),
                (&raw const (*p).wr_flags).read_volatile(),
            )
        }
    }

    pub(crate) fn set_state(&self, s: ibv_qp_state) {
        self.state.store(s, Ordering::SeqCst);
        // SAFETY: the QP is live; the field is a plain integer the
        // application reads as libibverbs's `qp->state`.
        unsafe { (&raw mut (*self.raw.get()).qp_base.state).write_volatile(s) };
    }

    /// The verbs state: the connection manager's until the QP is
    /// connected, then the engine QP's, mapped as the kernel's iWARP
    /// providers map theirs (closing: SQD, terminating: SQE).
    pub(crate) fn state(&self) -> ibv_qp_state {
        match self.connected.get().map(|q| q.state()) {
            Some(QpState::Error) => IBV_QPS_ERR,
            Some(QpState::Terminate) => IBV_QPS_SQE,
            Some(QpState::Closing) => IBV_QPS_SQD,
            Some(QpState::Rts) => IBV_QPS_RTS,
            Some(QpState::Idle | QpState::Connecting) | None => self.state.load(Ordering::SeqCst),
        }
    }

    /// Start connecting: the attributes and the receives posted so far,
    /// or `None` if the QP is already connecting or connected.
    pub(crate) fn begin_connect(&self) -> Option<(QpInit, Vec<EarlyRecv>)> {
        let mut c = lock(&self.conn);
        match &mut *c {
            QpConn::Idle(early) => {
                let early = std::mem::take(early);
                *c = QpConn::Connecting(Vec::new());
                Some((self.init.clone(), early))
            }
            _ => None,
        }
    }

    /// The CQs the QP completes on (one, when both are the same).
    fn cqs(&self) -> impl Iterator<Item = &CqObj> {
        let r = self.raw();
        let same = r.send_cq == r.recv_cq;
        cq_obj(r.send_cq)
            .into_iter()
            .chain(cq_obj(r.recv_cq).filter(|_| !same))
    }

    /// The connect or accept succeeded: receives posted meanwhile follow
    /// the early ones.
    pub(crate) fn finish_connect(&self, qp: Qp) -> Arc<Qp> {
        let qp = Arc::new(qp);
        let mut c = lock(&self.conn);
        if let QpConn::Connecting(late) = &*c {
            for r in late {
                let _ = qp.post_recv(&RecvWr {
                    wr_id: r.wr_id,
                    sgl: &r.sgl,
                });
            }
        }
        for cq in self.cqs() {
            cq.map_qp_num(qp.id().raw(), Some(self.raw().qp_num));
        }
        self.core_id.store(qp.id().raw(), Ordering::SeqCst);
        *c = QpConn::Connected(qp.clone());
        let _ = self.connected.set(qp.clone());
        // Its asynchronous events reach the context's `async_fd` (an
        // epoll instance that cannot take it — out of memory — leaves the
        // QP without them).
        let _ = crate::async_event::watch(
            self.async_fd(),
            qp.async_event_fd().as_raw_fd(),
            Source::Qp(self.raw.get().cast()),
        );
        self.set_state(IBV_QPS_RTS);
        qp
    }

    /// The context's `async_fd`.
    fn async_fd(&self) -> RawFd {
        // SAFETY: the QP's context is the library's own (checked at
        // creation); it lives as long as the process.
        unsafe { (*self.raw().context).async_fd }
    }

    /// Hand out the QP's next asynchronous event, if any, and count it
    /// until it is acked (the caller holds [`crate::async_event::DISPATCH`]).
    pub(crate) fn hand_out_event(&self) -> Option<QpAsyncEvent> {
        let mut h = lock(&self.events);
        if h.stopped {
            return None;
        }
        let ev = self.connected.get()?.poll_async_event()?;
        h.unacked += 1;
        Some(ev)
    }

    /// The application acked one of the QP's events.
    pub(crate) fn ack_event(&self) {
        let mut h = lock(&self.events);
        h.unacked = h.unacked.saturating_sub(1);
        self.acked.notify_all();
    }

    /// `ibv_destroy_qp`: no more events are handed out; wait until every
    /// event handed out is acked.
    fn retire_events(&self) {
        {
            let _g = lock(&crate::async_event::DISPATCH);
            lock(&self.events).stopped = true;
            if let Some(e) = self.connected.get() {
                crate::async_event::unwatch(self.async_fd(), e.async_event_fd().as_raw_fd());
            }
        }
        let mut h = lock(&self.events);
        while h.unacked > 0 {
            h = self.acked.wait(h).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The connect or accept failed: the QP is in error, its receives wait
    /// again (a later connect may use them).
    pub(crate) fn fail_connect(&self, early: Vec<EarlyRecv>) {
        let mut c = lock(&self.conn);
        let mut all = early;
        if let QpConn::Connecting(late) = &mut *c {
            all.append(late);
        }
        *c = QpConn::Idle(all);
        self.set_state(IBV_QPS_ERR);
    }

    pub(crate) fn engine_qp(&self) -> Option<Arc<Qp>> {
        self.connected.get().cloned()
    }

    /// Post a work request whose data is copied now (inline): `parts`
    /// are the bytes, at most [`MAX_INLINE`] in all.
    fn post_inline(
        &self,
        e: &Qp,
        wr_id: u64,
        op: SendOp,
        signaled: bool,
        parts: &[(*const u8, usize)],
    ) -> Result<(), c_int> {
        let total: usize = parts.iter().map(|p| p.1).sum();
        if total > MAX_INLINE {
            return Err(libc::EINVAL);
        }
        let mut r = lock(&self.inline);
        if r.is_none() {
            *r = Some(InlineRing::new(&self.init.pd, self.init.sq_depth)?);
        }
        let Some(ring) = r.as_mut() else {
            return Err(libc::ENOMEM);
        };
        let slot = ring.slot(ring.next);
        let mut at = 0;
        for &(src, len) in parts {
            if len > 0 {
                // SAFETY: `src` is valid for `len` bytes (the application's
                // buffer, ibv_post_send(3) / ibv_wr_set_inline_data(3), or
                // the batch's copy); the slot holds MAX_INLINE bytes and
                // the engine is not reading it (InlineRing).
                unsafe { std::ptr::copy_nonoverlapping(src, slot.add(at), len) };
                at += len;
            }
        }
        let sge = [Sge {
            addr: slot as u64,
            len: total as u32,
            lkey: ring.lkey(),
        }];
        let sgl: &[Sge] = if total == 0 { &[] } else { &sge };
        e.post_send(&SendWr {
            wr_id,
            op,
            sgl,
            signaled,
        })
        .map_err(post_errno)?;
        ring.next = (ring.next + 1) % ring.slots;
        Ok(())
    }
}

/// Buffers of a QP's inline data: one slot of [`MAX_INLINE`] bytes per
/// send-queue entry and one more, registered with the QP's PD, used in
/// posting order.
///
/// Inline work requests are copied into slot `k mod (depth + 1)` and
/// posted under the ring's lock, in order. The send queue retires its
/// entries in order and holds at most `depth` of them, so when the k-th
/// inline request is copied, the one that last used its slot (k − depth
/// − 1, with at least `depth` requests posted after it) is retired and
/// the engine no longer reads that slot.
struct InlineRing {
    base: NonNull<u8>,
    layout: Layout,
    slots: usize,
    next: usize,
    mr: Option<Mr>,
}

// SAFETY: the ring owns its allocation; it is used under its QP's mutex.
unsafe impl Send for InlineRing {}

impl InlineRing {
    fn new(pd: &Pd, depth: usize) -> Result<Self, c_int> {
        let slots = depth.checked_add(1).ok_or(libc::ENOMEM)?;
        let len = slots.checked_mul(MAX_INLINE).ok_or(libc::ENOMEM)?;
        let layout = Layout::from_size_align(len, 64).map_err(|_| libc::ENOMEM)?;
        // SAFETY: a non-zero size (slots >= 1).
        let base = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or(libc::ENOMEM)?;
        let g = global().inspect_err(|_| {
            // SAFETY: allocated just above with `layout`.
            unsafe { dealloc(base.as_ptr(), layout) };
        })?;
        // SAFETY: the allocation is valid until `drop`, which drops the
        // `Mr` before freeing it; the library writes a slot only while the
        // engine does not read it (see the type's documentation) and holds
        // no reference to the bytes.
        let mr = unsafe {
            g.dev
                .reg_user_mr(pd, base.as_ptr(), len, base.as_ptr() as u64, Access::NONE)
        };
        match mr {
            Ok(mr) => Ok(Self {
                base,
                layout,
                slots,
                next: 0,
                mr: Some(mr),
            }),
            Err(_) => {
                // SAFETY: allocated just above with `layout`, never shared.
                unsafe { dealloc(base.as_ptr(), layout) };
                Err(libc::ENOMEM)
            }
        }
    }

    fn slot(&self, i: usize) -> *mut u8 {
        // SAFETY: i < slots, so the slot lies within the allocation.
        unsafe { self.base.as_ptr().add(i * MAX_INLINE) }
    }

    fn lkey(&self) -> u32 {
        self.mr.as_ref().map_or(0, Mr::lkey)
    }
}

impl Drop for InlineRing {
    fn drop(&mut self) {
        // Deregistered first: the engine touches the bytes no more.
        drop(self.mr.take());
        // SAFETY: allocated in `new` with `layout`, freed once.
        unsafe { dealloc(self.base.as_ptr(), self.layout) };
    }
}

/// The receives as the engine takes them.
pub(crate) fn recv_wrs(early: &[EarlyRecv]) -> Vec<RecvWr<'_>> {
    early
        .iter()
        .map(|r| RecvWr {
            wr_id: r.wr_id,
            sgl: &r.sgl,
        })
        .collect()
}

/// Whether the capacities asked for are possible; the receive ones do
/// not matter on an SRQ (`on_srq`).
fn qp_cap_ok(cap: &ibv_qp_cap, on_srq: bool) -> bool {
    cap.max_send_sge as usize <= iwarp::qp::MAX_SGE
        && cap.max_inline_data as usize <= MAX_INLINE
        && cap.max_send_wr >= 1
        && cap.max_send_wr <= c_int::MAX as u32
        && (on_srq
            || (cap.max_recv_sge as usize <= iwarp::qp::MAX_SGE
                && cap.max_recv_wr >= 1
                && cap.max_recv_wr <= c_int::MAX as u32))
}

/// Create an RC QP in `pd`; `send_ops` non-zero makes it an extended QP
/// (`ibv_qp_to_qp_ex`, the `wr_*` operations).
///
/// # Safety
/// `a` holds the application's CQ and SRQ handles (checked here).
unsafe fn create_qp(pd: *mut ibv_pd, a: &mut ibv_qp_init_attr, send_ops: u64) -> *mut ibv_qp {
    let Some(p) = obj::<_, PdObj>(pd, Kind::Pd) else {
        set_errno(libc::EINVAL);
        return null_mut();
    };
    if a.qp_type != IBV_QPT_RC {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    // An SRQ of the same PD, if any: the QP's receives come from it.
    let srq = if a.srq.is_null() {
        None
    } else {
        match obj::<_, SrqObj>(a.srq, Kind::Srq) {
            Some(s) if s.pd() == pd => Some(s),
            _ => {
                set_errno(libc::EINVAL);
                return null_mut();
            }
        }
    };
    let (Some(scq), Some(rcq)) = (cq_obj(a.send_cq), cq_obj(a.recv_cq)) else {
        set_errno(libc::EINVAL);
        return null_mut();
    };
    if !qp_cap_ok(&a.cap, srq.is_some()) {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // The actual capacity (ibv_create_qp(3)): inline data up to the
    // device's limit whatever was asked; no receive queue of its own on
    // an SRQ.
    a.cap.max_inline_data = MAX_INLINE as u32;
    if srq.is_some() {
        a.cap.max_recv_wr = 0;
        a.cap.max_recv_sge = 0;
    }
    let init = QpInit {
        pd: p.pd.clone(),
        send_cq: scq.cq.clone(),
        recv_cq: rcq.cq.clone(),
        sq_depth: a.cap.max_send_wr as usize,
        rq_depth: a.cap.max_recv_wr as usize,
        sig_all: a.sq_sig_all != 0,
        srq: srq.map(|s| s.srq.clone()),
    };
    let mut raw = ibv_qp_ex {
        qp_base: ibv_qp {
            context: p.raw.context,
            qp_context: a.qp_context,
            pd,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            qp_num: NEXT_QPN.fetch_add(1, Ordering::SeqCst),
            state: IBV_QPS_RESET,
            qp_type: IBV_QPT_RC,
            ..Default::default()
        },
        ..Default::default()
    };
    if send_ops != 0 {
        ex::fill_ops(&mut raw);
    }
    let q = QPS.insert(QpObj {
        raw: UnsafeCell::new(raw),
        init,
        cap: a.cap,
        conn: Mutex::new(QpConn::Idle(Vec::new())),
        connected: OnceLock::new(),
        state: AtomicU32::new(IBV_QPS_RESET),
        core_id: AtomicU32::new(u32::MAX),
        send_ops,
        batch: Mutex::new(Batch::default()),
        inline: Mutex::new(None),
        events: Mutex::new(Handed::default()),
        acked: Condvar::new(),
    });
    // Counted as `QpObj::cqs` lists them (a CQ for both queues once).
    p.users.fetch_add(1, Ordering::SeqCst);
    scq.users.fetch_add(1, Ordering::SeqCst);
    if a.send_cq != a.recv_cq {
        rcq.users.fetch_add(1, Ordering::SeqCst);
    }
    if let Some(s) = srq {
        s.attach();
    }
    register(q, Kind::Qp);
    q.cast()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    if attr.is_null() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: the caller's attributes.
    unsafe { create_qp(pd, &mut *attr, 0) }
}

/// The extended context's `create_qp_ex`, which the inline
/// `ibv_create_qp_ex` of verbs.h calls (and `rdma_create_qp_ex`): RC QPs
/// in a PD, optionally with `send_ops_flags` for the `wr_*` API.
pub(crate) unsafe extern "C" fn create_qp_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    if attr.is_null() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    let known =
        IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if a.comp_mask & !known != 0 {
        // XRC domains, TSO, RSS tables: not provided.
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
        set_errno(libc::EOPNOTSUPP);
        return null_mut();
    }
    let send_ops = if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 {
        if a.send_ops_flags & !SUPPORTED_SEND_OPS != 0 {
            // Immediate data of InfiniBand's kind, memory windows, TSO,
            // atomic write.
            set_errno(libc::EOPNOTSUPP);
            return null_mut();
        }
        // An extended QP even with no operation named.
        a.send_ops_flags | 1 << 63
    } else {
        0
    };
    if let Some(p) = obj::<_, PdObj>(a.pd, Kind::Pd) {
        if p.raw.context != ctx {
            set_errno(libc::EINVAL);
            return null_mut();
        }
    }
    let mut init = ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    // SAFETY: the caller's handles, checked by `create_qp`.
    let q = unsafe { create_qp(a.pd, &mut init, send_ops) };
    a.cap = init.cap;
    q
}

/// The extended view of a QP created with `send_ops_flags`; NULL for
/// any other (rdma-core's answer for a QP without it).
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    match qp_obj(qp) {
        Some(q) if q.send_ops != 0 => q.raw.get(),
        Some(_) => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
        None => {
            set_errno(libc::EINVAL);
            null_mut()
        }
    }
}

/// The live QP whose number is `qpn` (for `rdma_accept`/`rdma_connect`
/// with a QP the application created itself).
pub(crate) fn qp_by_num(qpn: u32) -> Option<*mut ibv_qp> {
    QPS.find(|_, q| q.raw().qp_num == qpn).map(|q| q.cast())
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    if !is_live(qp, Kind::Qp) {
        return libc::EINVAL;
    }
    // A connect of the QP is abandoned; no CM worker uses it afterwards.
    crate::cm::forget_qp(qp);
    // The QP's asynchronous events handed out are acked first.
    if let Some(q) = qp_obj(qp) {
        q.retire_events();
    }
    if !unregister(qp, Kind::Qp) {
        return libc::EINVAL;
    }
    let Some(b) = ({
        let _g = lock(&crate::async_event::DISPATCH);
        QPS.take(qp.cast())
    }) else {
        return libc::EINVAL;
    };
    let id = b.core_id.load(Ordering::SeqCst);
    for cq in b.cqs() {
        if id != u32::MAX {
            cq.map_qp_num(id, None);
        }
        // The CQs and the PD outlive the QP (their destroy refuses
        // while it lives).
        cq.users.fetch_sub(1, Ordering::SeqCst);
    }
    if let Some(p) = obj::<_, PdObj>(b.raw().pd, Kind::Pd) {
        p.users.fetch_sub(1, Ordering::SeqCst);
    }
    let srq = b.raw().srq;
    drop(b);
    // Detached once the engine QP (and its handle of the SRQ) is gone.
    if let Some(s) = srq_obj(srq) {
        s.detach();
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    let Some(q) = obj::<_, QpObj>(qp, Kind::Qp) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &*attr };
    if mask as u32 & IBV_QP_STATE != 0 {
        let to = a.qp_state;
        match to {
            IBV_QPS_RESET | IBV_QPS_INIT | IBV_QPS_RTR | IBV_QPS_RTS => {
                // Connected QPs stay in RTS: the connection manager owns
                // the transitions of the engine's QP.
                if q.engine_qp().is_none() {
                    q.set_state(to);
                }
            }
            IBV_QPS_ERR | IBV_QPS_SQE => {
                if let Some(e) = q.engine_qp() {
                    e.disconnect();
                }
                q.set_state(IBV_QPS_ERR);
            }
            _ => return libc::EINVAL,
        }
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    let Some(q) = obj::<_, QpObj>(qp, Kind::Qp) else {
        return libc::EINVAL;
    };
    if attr.is_null() || init.is_null() {
        return libc::EINVAL;
    }
    let st = q.state();
    // As libibverbs's ibv_query_qp: `qp->state` follows what was read.
    q.set_state(st);
    // SAFETY: the caller's out parameters.
    unsafe {
        *attr = ibv_qp_attr {
            qp_state: st,
            cur_qp_state: st,
            cap: q.cap,
            qp_access_flags: IBV_ACCESS_LOCAL_WRITE
                | IBV_ACCESS_REMOTE_WRITE
                | IBV_ACCESS_REMOTE_READ,
            port_num: 1,
            ..Default::default()
        };
        *init = ibv_qp_init_attr {
            qp_context: q.raw().qp_context,
            send_cq: q.raw().send_cq,
            recv_cq: q.raw().recv_cq,
            srq: q.raw().srq,
            cap: q.cap,
            qp_type: IBV_QPT_RC,
            sq_sig_all: c_int::from(q.init.sig_all),
        };
    }
    0
}

pub(crate) fn post_errno(e: PostError) -> c_int {
    match e {
        PostError::QueueFull => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

/// The SGEs of a work request.
///
/// # Safety
/// `sg_list` points to `num_sge` SGEs when `num_sge > 0`.
pub(crate) unsafe fn sgl_of(sg_list: *const ibv_sge, num_sge: c_int) -> Result<Vec<Sge>, c_int> {
    if num_sge < 0 || num_sge as usize > iwarp::qp::MAX_SGE || (num_sge > 0 && sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    if num_sge == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the caller's array of `num_sge` entries.
    let s = unsafe { std::slice::from_raw_parts(sg_list, num_sge as usize) };
    Ok(s.iter()
        .map(|s| Sge {
            addr: s.addr,
            len: s.length,
            lkey: s.lkey,
        })
        .collect())
}

/// Whether an operation may carry inline data (Sends and Writes).
fn takes_inline(op: &SendOp) -> bool {
    matches!(op, SendOp::Send { .. } | SendOp::Write { .. })
}

/// The engine's operation for a send work request.
fn send_op(wr: &ibv_send_wr) -> Result<SendOp, c_int> {
    let solicited = wr.send_flags & IBV_SEND_SOLICITED != 0;
    // SAFETY (for the union reads below): the unions hold plain integers;
    // every bit pattern is valid, and the opcode says which one is meant.
    let (rdma, atomic, inv) = unsafe {
        (
            wr.wr.rdma,
            wr.wr.atomic,
            wr.__bindgen_anon_1.invalidate_rkey,
        )
    };
    Ok(match wr.opcode {
        IBV_WR_SEND => SendOp::Send {
            solicited,
            invalidate: None,
        },
        IBV_WR_SEND_WITH_INV => SendOp::Send {
            solicited,
            invalidate: Some(inv),
        },
        IBV_WR_RDMA_WRITE => SendOp::Write {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_RDMA_READ => SendOp::Read {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => {
            fetch_add(atomic.rkey, atomic.remote_addr, atomic.compare_add)
        }
        IBV_WR_ATOMIC_CMP_AND_SWP => cmp_swp(
            atomic.rkey,
            atomic.remote_addr,
            atomic.compare_add,
            atomic.swap,
        ),
        IBV_WR_LOCAL_INV => SendOp::LocalInvalidate { stag: inv },
        IBV_WR_RDMA_WRITE_WITH_IMM
        | IBV_WR_SEND_WITH_IMM
        | IBV_WR_BIND_MW
        | IBV_WR_TSO
        | IBV_WR_ATOMIC_WRITE
        | IBV_WR_DRIVER1 => return Err(libc::EOPNOTSUPP),
        _ => return Err(libc::EINVAL),
    })
}

fn fetch_add(rkey: u32, remote_addr: u64, add: u64) -> SendOp {
    SendOp::FetchAdd {
        remote_addr,
        rkey,
        add,
        add_mask: 0,
    }
}

fn cmp_swp(rkey: u32, remote_addr: u64, compare: u64, swap: u64) -> SendOp {
    SendOp::CompareSwap {
        remote_addr,
        rkey,
        compare,
        compare_mask: u64::MAX,
        swap,
        swap_mask: u64::MAX,
    }
}

/// `ops.post_send`, reached through the inline `ibv_post_send`.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    mut wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    let fail = |wr: *mut ibv_send_wr, e: c_int| {
        // SAFETY: `bad` is the caller's out parameter.
        unsafe { fail_at(bad, wr, e) }
    };
    let Some(q) = qp_obj(qp) else {
        return fail(wr, libc::EINVAL);
    };
    let Some(e) = q.connected.get() else {
        return fail(wr, libc::EINVAL);
    };
    while let Some(w) = NonNull::new(wr) {
        // SAFETY: the caller's list of work requests.
        let w = unsafe { w.as_ref() };
        if w.send_flags & !KNOWN_SEND_FLAGS != 0 {
            return fail(wr, libc::EINVAL);
        }
        let op = match send_op(w) {
            Ok(o) => o,
            Err(err) => return fail(wr, err),
        };
        // SAFETY: the work request's SGE array.
        let sgl = match unsafe { sgl_of(w.sg_list, w.num_sge) } {
            Ok(s) => s,
            Err(err) => return fail(wr, err),
        };
        let signaled = w.send_flags & IBV_SEND_SIGNALED != 0;
        let r = if w.send_flags & IBV_SEND_INLINE != 0 {
            if !takes_inline(&op) {
                return fail(wr, libc::EINVAL);
            }
            // Inline: the SGEs' bytes are copied now, their lkeys are not
            // used (ibv_post_send(3)).
            let parts: Vec<(*const u8, usize)> = sgl
                .iter()
                .map(|s| (s.addr as usize as *const u8, s.len as usize))
                .collect();
            q.post_inline(e, w.wr_id, op, signaled, &parts)
        } else {
            e.post_send(&SendWr {
                wr_id: w.wr_id,
                op,
                sgl: &sgl,
                signaled,
            })
            .map_err(post_errno)
        };
        if let Err(err) = r {
            return fail(wr, err);
        }
        wr = w.next;
    }
    0
}

/// `ops.post_recv`, reached through the inline `ibv_post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    mut wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let fail = |wr: *mut ibv_recv_wr, e: c_int| {
        // SAFETY: `bad` is the caller's out parameter.
        unsafe { fail_at(bad, wr, e) }
    };
    let Some(q) = qp_obj(qp) else {
        return fail(wr, libc::EINVAL);
    };
    if q.init.srq.is_some() {
        // Its receives come from the SRQ (ibv_post_srq_recv).
        return fail(wr, libc::EINVAL);
    }
    while let Some(w) = NonNull::new(wr) {
        // SAFETY: the caller's list of work requests.
        let w = unsafe { w.as_ref() };
        // SAFETY: the work request's SGE array.
        let sgl = match unsafe { sgl_of(w.sg_list, w.num_sge) } {
            Ok(s) => s,
            Err(err) => return fail(wr, err),
        };
        let rwr = RecvWr {
            wr_id: w.wr_id,
            sgl: &sgl,
        };
        if let Err(err) = rwr.check() {
            return fail(wr, post_errno(err));
        }
        if let Some(e) = q.connected.get() {
            if let Err(err) = e.post_recv(&rwr) {
                return fail(wr, post_errno(err));
            }
            wr = w.next;
            continue;
        }
        let mut c = lock(&q.conn);
        match &mut *c {
            QpConn::Connected(e) => {
                let e = e.clone();
                drop(c);
                if let Err(err) = e.post_recv(&rwr) {
                    return fail(wr, post_errno(err));
                }
            }
            QpConn::Idle(v) | QpConn::Connecting(v) => {
                if v.len() >= q.init.rq_depth {
                    return fail(wr, libc::ENOMEM);
                }
                v.push(EarlyRecv {
                    wr_id: w.wr_id,
                    sgl,
                });
            }
        }
        wr = w.next;
    }
    0
}

/// One work request of the extended API, built by a `wr_*` operation and
/// its setters.
struct PendingWr {
    wr_id: u64,
    signaled: bool,
    op: SendOp,
    /// Its SGEs in [`Batch::sges`].
    sges: Range<usize>,
    /// Its inline data in [`Batch::data`], once set.
    inline: Option<Range<usize>>,
    /// A setter gave its data (SGEs or inline).
    has_data: bool,
}

/// The work requests between `wr_start` and `wr_complete`; the first
/// error makes `wr_complete` post none of them.
#[derive(Default)]
struct Batch {
    open: bool,
    err: c_int,
    wrs: Vec<PendingWr>,
    sges: Vec<Sge>,
    data: Vec<u8>,
}

impl Batch {
    fn clear(&mut self) {
        self.err = 0;
        self.wrs.clear();
        self.sges.clear();
        self.data.clear();
    }

    fn fail(&mut self, e: c_int) {
        if self.err == 0 {
            self.err = e;
        }
    }

    /// The work request the setters apply to: the last one, while it has
    /// no data.
    fn current(&mut self) -> Option<&mut PendingWr> {
        match self.wrs.last_mut() {
            Some(w) if !w.has_data => Some(w),
            _ => None,
        }
    }
}

/// The `wr_*` function pointers of `struct ibv_qp_ex`.
mod ex {
    use super::*;

    pub(super) fn fill_ops(raw: &mut ibv_qp_ex) {
        raw.wr_start = Some(wr_start);
        raw.wr_complete = Some(wr_complete);
        raw.wr_abort = Some(wr_abort);
        raw.wr_send = Some(wr_send);
        raw.wr_send_inv = Some(wr_send_inv);
        raw.wr_send_imm = Some(wr_send_imm);
        raw.wr_rdma_write = Some(wr_rdma_write);
        raw.wr_rdma_write_imm = Some(wr_rdma_write_imm);
        raw.wr_rdma_read = Some(wr_rdma_read);
        raw.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
        raw.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
        raw.wr_local_inv = Some(wr_local_inv);
        raw.wr_bind_mw = Some(wr_bind_mw);
        raw.wr_send_tso = Some(wr_send_tso);
        raw.wr_atomic_write = Some(wr_atomic_write);
        raw.wr_set_sge = Some(wr_set_sge);
        raw.wr_set_sge_list = Some(wr_set_sge_list);
        raw.wr_set_inline_data = Some(wr_set_inline_data);
        raw.wr_set_inline_data_list = Some(wr_set_inline_data_list);
        raw.wr_set_ud_addr = Some(wr_set_ud_addr);
        raw.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    }

    /// Run `f` on the batch of the extended QP at `qp`, if it is one.
    fn with_batch<R>(qp: *mut ibv_qp_ex, f: impl FnOnce(&QpObj, &mut Batch) -> R) -> Option<R> {
        let q = qp_obj(qp.cast()).filter(|q| q.send_ops != 0)?;
        let mut b = lock(&q.batch);
        Some(f(q, &mut b))
    }

    /// A new work request of operation `op` (`bit`: its `send_ops_flags`
    /// bit), with the QP's `wr_id` and `wr_flags`.
    fn push(qp: *mut ibv_qp_ex, bit: u32, op: impl FnOnce(bool) -> Result<SendOp, c_int>) {
        with_batch(qp, |q, b| {
            if !b.open {
                b.fail(libc::EINVAL);
                return;
            }
            let (wr_id, flags) = q.ex_wr_fields();
            if flags & !KNOWN_SEND_FLAGS != 0 {
                b.fail(libc::EINVAL);
                return;
            }
            if q.send_ops & u64::from(bit) == 0 {
                // Not among the operations the QP was created for.
                b.fail(libc::EOPNOTSUPP);
                return;
            }
            match op(flags & IBV_SEND_SOLICITED != 0) {
                Ok(op) => {
                    let at = b.sges.len();
                    b.wrs.push(PendingWr {
                        wr_id,
                        signaled: flags & IBV_SEND_SIGNALED != 0,
                        op,
                        sges: at..at,
                        inline: None,
                        // Local Invalidate has no data to set.
                        has_data: matches!(op, SendOp::LocalInvalidate { .. }),
                    })
                }
                Err(e) => b.fail(e),
            }
        });
    }

    unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
        with_batch(qp, |_, b| {
            b.clear();
            b.open = true;
        });
    }

    unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
        with_batch(qp, |_, b| {
            b.clear();
            b.open = false;
        });
    }

    unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
        with_batch(qp, |q, b| {
            let r = complete(q, b);
            b.clear();
            b.open = false;
            r
        })
        .unwrap_or(libc::EINVAL)
    }

    /// Post the batch: nothing if a work request was refused while it was
    /// built or fails the engine's checks; otherwise in order, up to one
    /// the engine refuses (a full send queue).
    fn complete(q: &QpObj, b: &Batch) -> c_int {
        if !b.open {
            return libc::EINVAL;
        }
        if b.err != 0 {
            return b.err;
        }
        let Some(e) = q.connected.get() else {
            return libc::EINVAL;
        };
        for w in &b.wrs {
            if w.inline.is_some() {
                continue;
            }
            let wr = SendWr {
                wr_id: w.wr_id,
                op: w.op,
                sgl: &b.sges[w.sges.clone()],
                signaled: w.signaled,
            };
            if let Err(err) = wr.check() {
                return post_errno(err);
            }
        }
        for w in &b.wrs {
            let r = match &w.inline {
                Some(range) => {
                    let d = &b.data[range.clone()];
                    q.post_inline(e, w.wr_id, w.op, w.signaled, &[(d.as_ptr(), d.len())])
                }
                None => e
                    .post_send(&SendWr {
                        wr_id: w.wr_id,
                        op: w.op,
                        sgl: &b.sges[w.sges.clone()],
                        signaled: w.signaled,
                    })
                    .map_err(post_errno),
            };
            if let Err(err) = r {
                return err;
            }
        }
        0
    }

    unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
        push(qp, IBV_QP_EX_WITH_SEND, |solicited| {
            Ok(SendOp::Send {
                solicited,
                invalidate: None,
            })
        });
    }

    unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, rkey: u32) {
        push(qp, IBV_QP_EX_WITH_SEND_WITH_INV, |solicited| {
            Ok(SendOp::Send {
                solicited,
                invalidate: Some(rkey),
            })
        });
    }

    unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
        push(qp, IBV_QP_EX_WITH_RDMA_WRITE, |_| {
            Ok(SendOp::Write { remote_addr, rkey })
        });
    }

    unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
        push(qp, IBV_QP_EX_WITH_RDMA_READ, |_| {
            Ok(SendOp::Read { remote_addr, rkey })
        });
    }

    unsafe extern "C" fn wr_atomic_fetch_add(
        qp: *mut ibv_qp_ex,
        rkey: u32,
        remote_addr: u64,
        add: u64,
    ) {
        push(qp, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, |_| {
            Ok(fetch_add(rkey, remote_addr, add))
        });
    }

    unsafe extern "C" fn wr_atomic_cmp_swp(
        qp: *mut ibv_qp_ex,
        rkey: u32,
        remote_addr: u64,
        compare: u64,
        swap: u64,
    ) {
        push(qp, IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, |_| {
            Ok(cmp_swp(rkey, remote_addr, compare, swap))
        });
    }

    unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, rkey: u32) {
        push(qp, IBV_QP_EX_WITH_LOCAL_INV, |_| {
            Ok(SendOp::LocalInvalidate { stag: rkey })
        });
    }

    /// Operations the device does not perform: the batch fails with
    /// EOPNOTSUPP.
    fn unsupported(qp: *mut ibv_qp_ex) {
        with_batch(qp, |_, b| b.fail(libc::EOPNOTSUPP));
    }

    unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, _imm: __be32) {
        unsupported(qp);
    }

    unsafe extern "C" fn wr_rdma_write_imm(
        qp: *mut ibv_qp_ex,
        _rkey: u32,
        _remote_addr: u64,
        _imm: __be32,
    ) {
        unsupported(qp);
    }

    unsafe extern "C" fn wr_bind_mw(
        qp: *mut ibv_qp_ex,
        _mw: *mut ibv_mw,
        _rkey: u32,
        _info: *const ibv_mw_bind_info,
    ) {
        unsupported(qp);
    }

    unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _hdr: *mut c_void, _sz: u16, _mss: u16) {
        unsupported(qp);
    }

    unsafe extern "C" fn wr_atomic_write(
        qp: *mut ibv_qp_ex,
        _rkey: u32,
        _remote_addr: u64,
        _data: *const c_void,
    ) {
        unsupported(qp);
    }

    unsafe extern "C" fn wr_set_ud_addr(
        qp: *mut ibv_qp_ex,
        _ah: *mut ibv_ah,
        _qpn: u32,
        _qkey: u32,
    ) {
        unsupported(qp);
    }

    unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, _srqn: u32) {
        unsupported(qp);
    }

    /// Give the current work request its SGEs.
    ///
    /// # Safety
    /// `sges` is valid for `n` entries when `n > 0`.
    unsafe fn set_sges(qp: *mut ibv_qp_ex, n: usize, sges: *const ibv_sge) {
        with_batch(qp, |_, b| {
            if n > iwarp::qp::MAX_SGE || (n > 0 && sges.is_null()) {
                b.fail(libc::EINVAL);
                return;
            }
            let list = if n == 0 {
                &[][..]
            } else {
                // SAFETY: the caller's array of `n` SGEs.
                unsafe { std::slice::from_raw_parts(sges, n) }
            };
            if b.current().is_none() {
                b.fail(libc::EINVAL);
                return;
            }
            // Zero-length elements carry nothing (as providers drop them).
            for s in list.iter().filter(|s| s.length > 0) {
                b.sges.push(Sge {
                    addr: s.addr,
                    len: s.length,
                    lkey: s.lkey,
                });
            }
            let end = b.sges.len();
            if let Some(w) = b.current() {
                w.sges.end = end;
                w.has_data = true;
            }
        });
    }

    unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
        let s = ibv_sge { addr, length, lkey };
        // SAFETY: one SGE on the stack.
        unsafe { set_sges(qp, 1, &s) };
    }

    unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
        // SAFETY: the caller's array of `n` SGEs (ibv_wr_set_sge_list(3)).
        unsafe { set_sges(qp, n, list) };
    }

    /// Copy the current work request's inline data now.
    ///
    /// # Safety
    /// Every `(addr, len)` of `bufs` is valid for reads of `len` bytes.
    unsafe fn set_inline(qp: *mut ibv_qp_ex, bufs: &[(*const u8, usize)]) {
        with_batch(qp, |_, b| {
            let total = bufs.iter().try_fold(0usize, |t, p| t.checked_add(p.1));
            let Some(total) = total.filter(|&t| t <= MAX_INLINE) else {
                b.fail(libc::EINVAL);
                return;
            };
            if bufs.iter().any(|p| p.0.is_null() && p.1 > 0) {
                b.fail(libc::EINVAL);
                return;
            }
            let ok = b.current().is_some_and(|w| takes_inline(&w.op));
            if !ok {
                b.fail(libc::EINVAL);
                return;
            }
            let start = b.data.len();
            for &(p, len) in bufs {
                if len > 0 {
                    // SAFETY: the caller's buffer of `len` bytes.
                    b.data
                        .extend_from_slice(unsafe { std::slice::from_raw_parts(p, len) });
                }
            }
            let end = start + total;
            if let Some(w) = b.current() {
                w.inline = Some(start..end);
                w.has_data = true;
            }
        });
    }

    unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, len: usize) {
        // SAFETY: the caller's buffer (ibv_wr_set_inline_data(3)).
        unsafe { set_inline(qp, &[(addr.cast_const().cast(), len)]) };
    }

    unsafe extern "C" fn wr_set_inline_data_list(
        qp: *mut ibv_qp_ex,
        n: usize,
        list: *const ibv_data_buf,
    ) {
        if n > 0 && list.is_null() {
            with_batch(qp, |_, b| b.fail(libc::EINVAL));
            return;
        }
        let list = if n == 0 {
            &[][..]
        } else {
            // SAFETY: the caller's array of `n` buffers.
            unsafe { std::slice::from_raw_parts(list, n) }
        };
        let bufs: Vec<(*const u8, usize)> = list
            .iter()
            .map(|d| (d.addr.cast_const().cast(), d.length))
            .collect();
        // SAFETY: the caller's buffers (ibv_wr_set_inline_data_list(3)).
        unsafe { set_inline(qp, &bufs) };
    }
}
