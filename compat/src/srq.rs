//! Shared receive queues (`ibv_create_srq`, `ibv_modify_srq`,
//! `ibv_query_srq`, `ibv_destroy_srq`, `ops.post_srq_recv`).
//!
//! An SRQ handle is the address of the library's SRQ object in an arena
//! of SRQs, so `ibv_post_srq_recv` checks it without a process-wide lock,
//! as posting to a QP does. The engine's [`Srq`] holds the receives; QPs
//! created with `init_attr.srq` take theirs from it. Its event fd
//! ([`Srq::event_fd`]) is in the context's `async_fd`
//! ([`crate::async_event`]).

use std::ffi::c_int;
use std::os::fd::AsRawFd;
use std::ptr::{null_mut, NonNull};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use iwarp_engine::iwarp;
use iwarp_engine::{RecvWr, Srq, SrqEvent};

use crate::arena::Arena;
use crate::async_event::Source;
use crate::qp::{post_errno, sgl_of};
use crate::sys::*;
use crate::verbs::{global, PdObj};
use crate::{fail_at, obj, register, set_errno, unregister, Kind};

/// A shared receive queue.
#[repr(C)]
pub(crate) struct SrqObj {
    raw: ibv_srq,
    pub(crate) srq: Srq,
    max_wr: u32,
    max_sge: u32,
    /// The armed limit as the application last set it; 0 once its event
    /// is taken (the engine disarms it when it fires).
    limit: AtomicU32,
    /// QPs created on the SRQ and not destroyed.
    attached: AtomicUsize,
}

// SAFETY: `raw` holds the application's handles (context, PD,
// srq_context) as plain values the library never dereferences without
// checking them, and a mutex and condition variable that only the
// application uses; the rest is Sync.
unsafe impl Sync for SrqObj {}
// SAFETY: as for Sync.
unsafe impl Send for SrqObj {}

/// Every SRQ, for the data path's lock-free handle checks.
static SRQS: Arena<SrqObj> = Arena::new();

/// The live SRQ at `srq` (no process-wide lock).
pub(crate) fn srq_obj<'a>(srq: *const ibv_srq) -> Option<&'a SrqObj> {
    SRQS.get(srq.cast())
}

impl SrqObj {
    /// The PD the SRQ was created in.
    pub(crate) fn pd(&self) -> *mut ibv_pd {
        self.raw.pd
    }

    /// A QP was created on the SRQ.
    pub(crate) fn attach(&self) {
        self.attached.fetch_add(1, Ordering::SeqCst);
    }

    /// A QP created on the SRQ was destroyed.
    pub(crate) fn detach(&self) {
        self.attached.fetch_sub(1, Ordering::SeqCst);
    }

    /// The SRQ's next asynchronous event, if any.
    pub(crate) fn take_event(&self) -> Option<SrqEvent> {
        let ev = self.srq.poll_event()?;
        // Its one event fired: the engine disarmed the limit.
        self.limit.store(0, Ordering::SeqCst);
        Some(ev)
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    let Some(p) = obj::<_, PdObj>(pd, Kind::Pd) else {
        set_errno(libc::EINVAL);
        return null_mut();
    };
    if attr.is_null() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    let (max_wr, max_sge) = (a.attr.max_wr, a.attr.max_sge);
    if max_wr == 0 || max_wr > c_int::MAX as u32 || max_sge as usize > iwarp::qp::MAX_SGE {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    let Ok(g) = global() else {
        set_errno(libc::ENODEV);
        return null_mut();
    };
    let ctx = p.raw.context;
    // SAFETY: the PD's context is the library's own (checked when the PD
    // was allocated).
    let async_fd = unsafe { (*ctx).async_fd };
    // `srq_limit` is not used at creation (ibv_create_srq(3)): the limit
    // starts disarmed.
    let srq = match g.dev.create_srq(&p.pd, max_wr as usize, 0) {
        Ok(s) => s,
        Err(_) => {
            set_errno(libc::EINVAL);
            return null_mut();
        }
    };
    let fd = srq.event_fd().as_raw_fd();
    let o = SrqObj {
        raw: ibv_srq {
            context: ctx,
            srq_context: a.srq_context,
            pd,
            ..Default::default()
        },
        srq,
        max_wr,
        max_sge,
        limit: AtomicU32::new(0),
        attached: AtomicUsize::new(0),
    };
    let s = SRQS.insert(o);
    if crate::async_event::watch(async_fd, fd, Source::Srq(s.cast())).is_err() {
        drop(SRQS.take(s));
        return null_mut();
    }
    register(s, Kind::Srq);
    // The PD outlives the SRQ (its dealloc refuses while it lives).
    p.users.fetch_add(1, Ordering::SeqCst);
    // The actual attributes: as asked.
    a.attr.max_wr = max_wr;
    a.attr.max_sge = max_sge;
    s.cast()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    let Some(s) = obj::<_, SrqObj>(srq, Kind::Srq) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    let mask = mask as u32;
    if mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
        return libc::EINVAL;
    }
    if mask & IBV_SRQ_MAX_WR != 0 {
        // An SRQ is not resized (siw answers the same).
        return libc::EOPNOTSUPP;
    }
    if mask & IBV_SRQ_LIMIT != 0 {
        // SAFETY: the caller's attributes.
        let limit = unsafe { (*attr).srq_limit };
        if limit > s.max_wr || s.srq.arm_limit(limit).is_err() {
            return libc::EINVAL;
        }
        s.limit.store(limit, Ordering::SeqCst);
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    let Some(s) = obj::<_, SrqObj>(srq, Kind::Srq) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's out parameter.
    unsafe {
        *attr = ibv_srq_attr {
            max_wr: s.max_wr,
            max_sge: s.max_sge,
            srq_limit: s.limit.load(Ordering::SeqCst),
        }
    };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    let Some(s) = obj::<_, SrqObj>(srq, Kind::Srq) else {
        return libc::EINVAL;
    };
    if s.attached.load(Ordering::SeqCst) > 0 {
        return libc::EBUSY;
    }
    if !unregister(srq, Kind::Srq) {
        return libc::EINVAL;
    }
    let Some(b) = SRQS.take(srq.cast()) else {
        return libc::EINVAL;
    };
    // SAFETY: the context is the library's own (it lives as long as the
    // process).
    let async_fd = unsafe { (*b.raw.context).async_fd };
    crate::async_event::unwatch(async_fd, b.srq.event_fd().as_raw_fd());
    if let Some(p) = obj::<_, PdObj>(b.raw.pd, Kind::Pd) {
        p.users.fetch_sub(1, Ordering::SeqCst);
    }
    // The engine discards the receives no QP took.
    drop(b);
    0
}

/// `ops.post_srq_recv`, reached through the inline `ibv_post_srq_recv`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    mut wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let fail = |wr: *mut ibv_recv_wr, e: c_int| {
        // SAFETY: `bad` is the caller's out parameter.
        unsafe { fail_at(bad, wr, e) }
    };
    let Some(s) = srq_obj(srq) else {
        return fail(wr, libc::EINVAL);
    };
    while let Some(w) = NonNull::new(wr) {
        // SAFETY: the caller's list of work requests.
        let w = unsafe { w.as_ref() };
        if w.num_sge < 0 || w.num_sge as u32 > s.max_sge {
            return fail(wr, libc::EINVAL);
        }
        // SAFETY: the work request's SGE array.
        let sgl = match unsafe { sgl_of(w.sg_list, w.num_sge) } {
            Ok(l) => l,
            Err(err) => return fail(wr, err),
        };
        let rwr = RecvWr {
            wr_id: w.wr_id,
            sgl: &sgl,
        };
        if let Err(err) = s.srq.post_recv(&rwr) {
            return fail(wr, post_errno(err));
        }
        wr = w.next;
    }
    0
}
