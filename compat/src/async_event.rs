//! The context's asynchronous events (`ibv_get_async_event`,
//! `ibv_ack_async_event`, `async_fd`).
//!
//! The context's `async_fd` is an epoll instance over the engine's event
//! fds of the SRQs ([`iwarp_engine::Srq::event_fd`]) and of the connected
//! QPs ([`iwarp_engine::Qp::async_event_fd`]), each a semaphore eventfd
//! with one count per queued engine event, and each entry's data naming
//! its object (`Source`). So `async_fd` is readable exactly while an
//! event waits, and `ibv_get_async_event` waits on it (blocking, or EAGAIN
//! when the application made it non-blocking) and takes the event from the
//! object it names. No thread moves events: the engine's progress counts
//! them on the eventfd when it queues them.
//!
//! SRQ events: `IBV_EVENT_SRQ_LIMIT_REACHED` with `element.srq`. QP events,
//! with `element.qp`: `IBV_EVENT_QP_FATAL`, `IBV_EVENT_QP_ACCESS_ERR` and
//! `IBV_EVENT_QP_REQ_ERR` when the connection fails (a Terminate sent or
//! received, the connection lost; see [`QpAsyncEvent`]), and
//! `IBV_EVENT_QP_LAST_WQE_REACHED` when a QP on an SRQ leaves RTS.
//!
//! The ack contract of verbs: every QP event handed out is counted on its
//! QP until `ibv_ack_async_event` acks it, and `ibv_destroy_qp` waits
//! until all are acked (events not yet handed out are dropped with the
//! QP). `DISPATCH` orders the hand-out against the destroy: a QP is
//! looked up, its event taken and counted under it, and `ibv_destroy_qp`
//! stops the hand-out and later frees the QP under it, so no event of a
//! destroyed QP is handed out and no QP is freed while an event is
//! counted on it. The data path takes none of these locks.

use std::ffi::c_int;
use std::os::fd::RawFd;
use std::ptr::null_mut;
use std::sync::Mutex;

use iwarp_engine::{QpAsyncEvent, SrqEvent};

use crate::qp::qp_obj;
use crate::srq::srq_obj;
use crate::sys::*;
use crate::{lock, set_errno};

/// Held while an event is handed out or acked, and while
/// `ibv_destroy_qp` stops a QP's events or frees it.
pub(crate) static DISPATCH: Mutex<()> = Mutex::new(());

/// The object an entry of `async_fd` stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Srq(*mut ibv_srq),
    Qp(*mut ibv_qp),
}

/// Tag of a QP's entry data (handles are at least 8-aligned).
const QP_TAG: u64 = 1;

impl Source {
    fn data(self) -> u64 {
        match self {
            Self::Srq(p) => p as u64,
            Self::Qp(p) => p as u64 | QP_TAG,
        }
    }

    fn of(data: u64) -> Self {
        if data & QP_TAG != 0 {
            Self::Qp((data & !QP_TAG) as *mut ibv_qp)
        } else {
            Self::Srq(data as *mut ibv_srq)
        }
    }
}

/// Add the event fd `fd` of `src` to the context's `async_fd`.
pub(crate) fn watch(async_fd: RawFd, fd: RawFd, src: Source) -> std::io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: src.data(),
    };
    // SAFETY: plain syscall; `ev` is a valid epoll_event.
    if unsafe { libc::epoll_ctl(async_fd, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Take the event fd `fd` out of the context's `async_fd`.
pub(crate) fn unwatch(async_fd: RawFd, fd: RawFd) {
    // SAFETY: plain syscall (an fd not in the set fails harmlessly).
    unsafe { libc::epoll_ctl(async_fd, libc::EPOLL_CTL_DEL, fd, null_mut()) };
}

/// The verbs event of an engine QP event.
fn qp_event_type(ev: QpAsyncEvent) -> ibv_event_type {
    match ev {
        QpAsyncEvent::AccessError => IBV_EVENT_QP_ACCESS_ERR,
        QpAsyncEvent::RequestError => IBV_EVENT_QP_REQ_ERR,
        QpAsyncEvent::LastWqeReached => IBV_EVENT_QP_LAST_WQE_REACHED,
        _ => IBV_EVENT_QP_FATAL,
    }
}

/// The next event of `src`, if it is live and has one (the caller holds
/// [`DISPATCH`]).
fn take(src: Source) -> Option<ibv_async_event> {
    match src {
        Source::Srq(p) => {
            let SrqEvent::LimitReached = srq_obj(p)?.take_event()?;
            Some(ibv_async_event {
                element: ibv_async_event__bindgen_ty_1 { srq: p },
                event_type: IBV_EVENT_SRQ_LIMIT_REACHED,
            })
        }
        Source::Qp(p) => {
            let ev = qp_obj(p)?.hand_out_event()?;
            Some(ibv_async_event {
                element: ibv_async_event__bindgen_ty_1 { qp: p },
                event_type: qp_event_type(ev),
            })
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    ctx: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    if !crate::verbs::is_context(ctx) || event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the library's context.
    let fd = unsafe { (*ctx).async_fd };
    let nonblocking = crate::nonblocking(fd);
    loop {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        let timeout = if nonblocking { 0 } else { -1 };
        // SAFETY: one epoll_event of room.
        let n = unsafe { libc::epoll_wait(fd, &mut ev, 1, timeout) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return -1;
        }
        if n == 0 {
            set_errno(libc::EAGAIN);
            return -1;
        }
        let Some(e) = take(Source::of(ev.u64)) else {
            // Destroyed meanwhile, or another thread took the event.
            continue;
        };
        // SAFETY: the caller's out parameter.
        unsafe { *event = e };
        return 0;
    }
}

/// Acks an event: a QP's count of events handed out and not acked goes
/// down (its `ibv_destroy_qp` waits for 0). An SRQ's event holds nothing
/// to release.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: the caller's event, as `ibv_get_async_event` filled it.
    let e = unsafe { &*event };
    let qp_event = matches!(
        e.event_type,
        IBV_EVENT_QP_FATAL
            | IBV_EVENT_QP_ACCESS_ERR
            | IBV_EVENT_QP_REQ_ERR
            | IBV_EVENT_QP_LAST_WQE_REACHED
    );
    if qp_event {
        let _g = lock(&DISPATCH);
        // SAFETY: the union's member for these event types.
        if let Some(q) = qp_obj(unsafe { e.element.qp }) {
            q.ack_event();
        }
    }
}
