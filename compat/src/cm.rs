//! librdmacm: event channels, CM IDs and the connection lifecycle over the
//! engine's connection manager.
//!
//! An event channel's fd is a semaphore eventfd with one count per queued
//! event: it blocks, polls and honours O_NONBLOCK as librdmacm's does, and
//! `rdma_get_cm_event` reads one count and takes one event. Events come
//! from the calling thread (ADDR_RESOLVED, ROUTE_RESOLVED, ESTABLISHED of
//! an accept) or from a worker thread of the ID: a listening ID's thread
//! takes the engine's connection requests (CONNECT_REQUEST, with a new
//! ID), a connecting ID's thread drives the engine's non-blocking connect
//! (ESTABLISHED, REJECTED, UNREACHABLE, CONNECT_ERROR), and a connected
//! ID's thread waits for the connection's end (DISCONNECTED). Workers wake
//! every 100 ms to see whether their ID is being destroyed;
//! `rdma_destroy_id` stops and joins them.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::size_of;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use iwarp_engine::{CmError, CmEvent, ConnParams, ConnRequest, Listener, Qp};

use crate::sys::*;
use crate::verbs::{
    self, global, ibv_alloc_pd, ibv_create_qp, ibv_destroy_qp, qp_by_num, recv_wrs, QpObj,
    STOP_POLL,
};
use crate::{is_live, lock, obj, register, set_errno, unregister, Kind};

fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

// ---------------------------------------------------------- event channels

/// The part of an event channel its IDs' workers share.
struct ChanShared {
    fd: c_int,
    q: Mutex<VecDeque<usize>>,
    ids: AtomicI32,
}

impl ChanShared {
    /// Queue an event and count it on the fd.
    fn push(&self, ev: Box<EventObj>) {
        let p = Box::into_raw(ev);
        register(p, Kind::CmEvent);
        lock(&self.q).push_back(p as usize);
        let one = 1u64;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(self.fd, (&raw const one).cast(), 8) };
    }
}

impl Drop for ChanShared {
    fn drop(&mut self) {
        for p in lock(&self.q).drain(..) {
            if unregister(p as *const EventObj, Kind::CmEvent) {
                // SAFETY: a queued, never delivered event: freed once.
                drop(unsafe { Box::from_raw(p as *mut EventObj) });
            }
        }
        // SAFETY: our eventfd, closed once.
        unsafe { libc::close(self.fd) };
    }
}

#[repr(C)]
struct ChannelObj {
    raw: rdma_event_channel,
    shared: Arc<ChanShared>,
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    if let Err(e) = global() {
        set_errno(e);
        return null_mut();
    }
    // SAFETY: plain syscall; errno is set on failure.
    let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return null_mut();
    }
    let p = Box::into_raw(Box::new(ChannelObj {
        raw: rdma_event_channel { fd },
        shared: Arc::new(ChanShared {
            fd,
            q: Mutex::new(VecDeque::new()),
            ids: AtomicI32::new(0),
        }),
    }));
    register(p, Kind::EventChannel);
    p.cast()
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    let Some(c) = obj::<_, ChannelObj>(ch, Kind::EventChannel) else {
        return;
    };
    // IDs still on the channel keep it (librdmacm requires them destroyed
    // first).
    if c.shared.ids.load(Ordering::SeqCst) > 0 {
        return;
    }
    if unregister(ch, Kind::EventChannel) {
        // SAFETY: registered until now: a leaked Box<ChannelObj>, freed
        // once.
        drop(unsafe { Box::from_raw(ch.cast::<ChannelObj>()) });
    }
}

/// An event and the private data it points to.
#[repr(C)]
struct EventObj {
    raw: rdma_cm_event,
    pdata: Vec<u8>,
}

fn event(
    id: *mut rdma_cm_id,
    listen_id: *mut rdma_cm_id,
    kind: rdma_cm_event_type,
    status: c_int,
    pdata: Vec<u8>,
    ird_ord: (u16, u16),
) -> Box<EventObj> {
    let mut e = Box::new(EventObj {
        raw: rdma_cm_event {
            id,
            listen_id,
            event: kind,
            status,
            ..Default::default()
        },
        pdata,
    });
    let conn = rdma_conn_param {
        private_data: if e.pdata.is_empty() {
            std::ptr::null()
        } else {
            e.pdata.as_ptr().cast()
        },
        private_data_len: e.pdata.len().min(255) as u8,
        responder_resources: ird_ord.0.min(255) as u8,
        initiator_depth: ird_ord.1.min(255) as u8,
        ..Default::default()
    };
    e.raw.param.conn = conn;
    e
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_event,
) -> c_int {
    let Some(c) = obj::<_, ChannelObj>(ch, Kind::EventChannel) else {
        return fail(libc::EINVAL);
    };
    if out.is_null() {
        return fail(libc::EINVAL);
    }
    let mut v = 0u64;
    // SAFETY: reading 8 bytes from our eventfd: blocks until an event is
    // queued, or fails with EAGAIN when the application made it
    // non-blocking (errno is set by read).
    if unsafe { libc::read(c.raw.fd, (&raw mut v).cast(), 8) } != 8 {
        return -1;
    }
    let Some(p) = lock(&c.shared.q).pop_front() else {
        return fail(libc::EAGAIN);
    };
    // SAFETY: the caller's out parameter.
    unsafe { *out = p as *mut rdma_cm_event };
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(ev: *mut rdma_cm_event) -> c_int {
    if !unregister(ev, Kind::CmEvent) {
        return fail(libc::EINVAL);
    }
    // SAFETY: registered until now: a leaked Box<EventObj>, freed once.
    drop(unsafe { Box::from_raw(ev.cast::<EventObj>()) });
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_event_str(ev: rdma_cm_event_type) -> *const c_char {
    let s: &'static CStr = match ev {
        RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}

// ---------------------------------------------------------------- IDs

/// A thread of an ID, stopped and joined when the ID is destroyed.
struct Worker {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

#[derive(Default)]
struct IdState {
    src: Option<SocketAddrV4>,
    dst: Option<SocketAddrV4>,
    addr_resolved: bool,
    route_resolved: bool,
    listening: bool,
    /// A connection request waiting for rdma_accept or rdma_reject.
    req: Option<ConnRequest>,
    connected: bool,
}

#[repr(C)]
struct IdObj {
    raw: rdma_cm_id,
    chan: Arc<ChanShared>,
    st: Mutex<IdState>,
    workers: Mutex<Vec<Worker>>,
}

/// A raw pointer moved into a worker thread.
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: the pointee (an ID or QP) outlives the workers that hold it:
// rdma_destroy_id joins them before freeing, and applications destroy a
// QP only after its ID's connect finished (rdma_destroy_qp(3)).
unsafe impl<T> Send for SendPtr<T> {}

impl IdObj {
    fn spawn(&self, f: impl FnOnce(Arc<AtomicBool>) + Send + 'static) {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::Builder::new()
            .name("iwarp-compat-cm".into())
            .spawn(move || f(s))
            .expect("spawn a connection manager thread");
        lock(&self.workers).push(Worker { stop, handle });
    }

    fn ptr(&self) -> *mut rdma_cm_id {
        (&raw const self.raw).cast_mut()
    }
}

fn to_sockaddr_in(a: SocketAddrV4) -> sockaddr_in {
    sockaddr_in {
        sin_family: libc::AF_INET as sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// An IPv4 socket address from the application's `sockaddr`.
///
/// # Safety
/// `sa` is null or points to a socket address of its family's size.
unsafe fn parse_addr(sa: *const sockaddr) -> Result<Option<SocketAddrV4>, c_int> {
    if sa.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's socket address.
    let family = c_int::from(unsafe { (*sa).sa_family });
    if family != libc::AF_INET {
        return Err(libc::EAFNOSUPPORT);
    }
    // SAFETY: an AF_INET address is a sockaddr_in.
    let sin = unsafe { &*sa.cast::<sockaddr_in>() };
    Ok(Some(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
        u16::from_be(sin.sin_port),
    )))
}

fn set_src(raw: &mut rdma_cm_id, a: SocketAddrV4) {
    raw.route.addr.__bindgen_anon_1.src_sin = to_sockaddr_in(a);
}

fn set_dst(raw: &mut rdma_cm_id, a: SocketAddrV4) {
    raw.route.addr.__bindgen_anon_2.dst_sin = to_sockaddr_in(a);
}

fn new_id(
    chan_raw: *mut rdma_event_channel,
    chan: &Arc<ChanShared>,
    context: *mut c_void,
    ps: rdma_port_space,
    ctx: *mut ibv_context,
) -> *mut IdObj {
    let o = Box::new(IdObj {
        raw: rdma_cm_id {
            verbs: ctx,
            channel: chan_raw,
            context,
            ps,
            port_num: 1,
            qp_type: IBV_QPT_RC,
            ..Default::default()
        },
        chan: chan.clone(),
        st: Mutex::new(IdState::default()),
        workers: Mutex::new(Vec::new()),
    });
    chan.ids.fetch_add(1, Ordering::SeqCst);
    let p = Box::into_raw(o);
    register(p, Kind::CmId);
    p
}

fn the_context() -> Result<*mut ibv_context, c_int> {
    let dev = {
        let mut n = 0;
        // SAFETY: our own device list; freed below.
        let l = unsafe { verbs::ibv_get_device_list(&mut n) };
        if l.is_null() || n < 1 {
            if !l.is_null() {
                // SAFETY: allocated just above.
                unsafe { verbs::ibv_free_device_list(l) };
            }
            return Err(libc::ENODEV);
        }
        // SAFETY: one entry, then freed.
        let d = unsafe { *l };
        // SAFETY: allocated just above.
        unsafe { verbs::ibv_free_device_list(l) };
        d
    };
    // SAFETY: our device.
    let c = unsafe { verbs::ibv_open_device(dev) };
    if c.is_null() {
        Err(libc::ENODEV)
    } else {
        Ok(c)
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    ch: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    if ch.is_null() {
        // Synchronous IDs (no channel) are not supported.
        return fail(libc::EOPNOTSUPP);
    }
    let Some(c) = obj::<_, ChannelObj>(ch, Kind::EventChannel) else {
        return fail(libc::EINVAL);
    };
    if ps != RDMA_PS_TCP {
        return fail(libc::EOPNOTSUPP);
    }
    let ctx = match the_context() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let p = new_id(ch, &c.shared, context, ps, ctx);
    // SAFETY: the caller's out parameter.
    unsafe { *id = p.cast() };
    0
}

fn id_obj<'a>(id: *mut rdma_cm_id) -> Option<&'a IdObj> {
    obj::<_, IdObj>(id, Kind::CmId)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    let Some(o) = id_obj(id) else {
        return fail(libc::EINVAL);
    };
    let workers = std::mem::take(&mut *lock(&o.workers));
    for w in &workers {
        w.stop.store(true, Ordering::SeqCst);
    }
    for w in workers {
        let _ = w.handle.join();
    }
    if !unregister(id, Kind::CmId) {
        return fail(libc::EINVAL);
    }
    // SAFETY: registered until now: a leaked Box<IdObj>, freed once; its
    // workers are joined.
    let b = unsafe { Box::from_raw(id.cast::<IdObj>()) };
    b.chan.ids.fetch_sub(1, Ordering::SeqCst);
    drop(b);
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    let Some(o) = id_obj(id) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: the caller's address.
    let a = match unsafe { parse_addr(addr) } {
        Ok(Some(a)) => a,
        Ok(None) => return fail(libc::EINVAL),
        Err(e) => return fail(e),
    };
    lock(&o.st).src = Some(a);
    // SAFETY: the live ID; the application does not use it concurrently
    // with its own bind.
    unsafe { set_src(&mut *id, a) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    let Some(o) = id_obj(id) else {
        return fail(libc::EINVAL);
    };
    let Ok(g) = global() else {
        return fail(libc::ENODEV);
    };
    let mut st = lock(&o.st);
    let Some(src) = st.src else {
        return fail(libc::EINVAL);
    };
    if st.listening {
        return fail(libc::EINVAL);
    }
    let l = match g.dev.listen(SocketAddr::V4(src)) {
        Ok(l) => l,
        Err(CmError::Io(k)) => {
            return fail(
                std::io::Error::from(k)
                    .raw_os_error()
                    .unwrap_or(libc::EADDRINUSE),
            )
        }
        Err(_) => return fail(libc::EADDRINUSE),
    };
    let bound = match l.local_addr() {
        SocketAddr::V4(a) => a,
        SocketAddr::V6(_) => src,
    };
    st.src = Some(bound);
    st.listening = true;
    drop(st);
    // SAFETY: the live ID.
    unsafe { set_src(&mut *id, bound) };
    let me = SendPtr(id);
    o.spawn(move |stop| listen_worker(me, l, bound, stop));
    0
}

fn listen_worker(me: SendPtr<rdma_cm_id>, l: Listener, bound: SocketAddrV4, stop: Arc<AtomicBool>) {
    let me = me.0;
    while !stop.load(Ordering::SeqCst) {
        let req = match l.get_request(Some(STOP_POLL)) {
            Ok(r) => r,
            Err(CmError::Timeout) => continue,
            Err(_) => break,
        };
        // SAFETY: the listening ID outlives this worker (joined by
        // rdma_destroy_id).
        let parent = unsafe { &*me.cast::<IdObj>() };
        let peer = match req.peer_addr() {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => continue,
        };
        let (ird, ord) = req
            .request()
            .ird_ord
            .map(|w| (w.ird, w.ord))
            .unwrap_or((1, 1));
        let pdata = req.private_data().to_vec();
        let child = new_id(
            parent.raw.channel,
            &parent.chan,
            parent.raw.context,
            parent.raw.ps,
            parent.raw.verbs,
        );
        // SAFETY: just created, not yet handed out.
        let c = unsafe { &mut *child };
        set_src(&mut c.raw, bound);
        set_dst(&mut c.raw, peer);
        {
            let mut st = lock(&c.st);
            st.src = Some(bound);
            st.dst = Some(peer);
            st.req = Some(req);
        }
        // The peer's ORD is what we serve; its IRD bounds what we issue.
        parent.chan.push(event(
            c.ptr(),
            me,
            RDMA_CM_EVENT_CONNECT_REQUEST,
            0,
            pdata,
            (ord, ird),
        ));
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut sockaddr,
    dst: *mut sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    let Some(o) = id_obj(id) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: the caller's addresses.
    let (s, d) = match unsafe { (parse_addr(src), parse_addr(dst)) } {
        (Ok(s), Ok(Some(d))) => (s, d),
        (Err(e), _) | (_, Err(e)) => return fail(e),
        _ => return fail(libc::EINVAL),
    };
    // The source the kernel would route from.
    let s = s.or_else(|| {
        let u = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
        u.connect(d).ok()?;
        match u.local_addr().ok()? {
            SocketAddr::V4(a) => Some(SocketAddrV4::new(*a.ip(), 0)),
            SocketAddr::V6(_) => None,
        }
    });
    let mut st = lock(&o.st);
    st.dst = Some(d);
    if let Some(s) = s {
        st.src = Some(s);
    }
    st.addr_resolved = true;
    drop(st);
    // SAFETY: the live ID.
    unsafe {
        set_dst(&mut *id, d);
        if let Some(s) = s {
            set_src(&mut *id, s);
        }
    }
    o.chan.push(event(
        id,
        null_mut(),
        RDMA_CM_EVENT_ADDR_RESOLVED,
        0,
        Vec::new(),
        (0, 0),
    ));
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    let Some(o) = id_obj(id) else {
        return fail(libc::EINVAL);
    };
    let mut st = lock(&o.st);
    if !st.addr_resolved {
        return fail(libc::EINVAL);
    }
    st.route_resolved = true;
    drop(st);
    o.chan.push(event(
        id,
        null_mut(),
        RDMA_CM_EVENT_ROUTE_RESOLVED,
        0,
        Vec::new(),
        (0, 0),
    ));
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    create_id_qp(id, pd, |pd| {
        // SAFETY: forwarded with the caller's attributes.
        unsafe { ibv_create_qp(pd, attr) }
    })
}

/// The QP of `id` made by `create` in `pd` (or the ID's PD, allocated if
/// it has none), in INIT.
fn create_id_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    create: impl FnOnce(*mut ibv_pd) -> *mut ibv_qp,
) -> c_int {
    let Some(o) = id_obj(id) else {
        return fail(libc::EINVAL);
    };
    if !o.raw.qp.is_null() {
        return fail(libc::EINVAL);
    }
    let pd = if pd.is_null() {
        if o.raw.pd.is_null() {
            // SAFETY: the ID's context.
            let p = unsafe { ibv_alloc_pd(o.raw.verbs) };
            if p.is_null() {
                return -1;
            }
            // SAFETY: the live ID.
            unsafe { (*id).pd = p };
        }
        o.raw.pd
    } else {
        pd
    };
    let qp = create(pd);
    if qp.is_null() {
        return -1;
    }
    if let Some(q) = obj::<_, QpObj>(qp, Kind::Qp) {
        q.set_state(IBV_QPS_INIT);
    }
    // SAFETY: the live ID.
    unsafe { (*id).qp = qp };
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    let Some(o) = id_obj(id) else {
        return;
    };
    let qp = o.raw.qp;
    if !qp.is_null() {
        // SAFETY: the ID's QP.
        unsafe {
            ibv_destroy_qp(qp);
            (*id).qp = null_mut();
        }
    }
}

/// The ID's QP, or the one named by `param.qp_num`.
fn qp_of<'a>(o: &IdObj, param: *const rdma_conn_param) -> Option<&'a QpObj> {
    if !o.raw.qp.is_null() {
        return obj::<_, QpObj>(o.raw.qp, Kind::Qp);
    }
    if param.is_null() {
        return None;
    }
    // SAFETY: the caller's parameters.
    let n = unsafe { (*param).qp_num };
    qp_by_num(n).and_then(|q| obj::<_, QpObj>(q, Kind::Qp))
}

/// The engine's parameters for the application's.
fn conn_params(param: *const rdma_conn_param) -> Result<ConnParams, c_int> {
    let mut p = global()?.cfg.conn_params();
    if !param.is_null() {
        // SAFETY: the caller's parameters.
        let c = unsafe { &*param };
        if c.private_data_len > 0 {
            if c.private_data.is_null() {
                return Err(libc::EINVAL);
            }
            // SAFETY: `private_data_len` bytes at `private_data`.
            p.private_data = unsafe {
                std::slice::from_raw_parts(c.private_data.cast::<u8>(), c.private_data_len.into())
            }
            .to_vec();
        }
        p.ird = c.responder_resources.into();
        p.ord = c.initiator_depth.into();
    }
    Ok(p)
}

fn cm_errno(e: &CmError) -> c_int {
    match e {
        CmError::ConnectionRefused | CmError::Rejected { .. } => libc::ECONNREFUSED,
        CmError::Unreachable => libc::EHOSTUNREACH,
        CmError::Timeout | CmError::MpaTimeout => libc::ETIMEDOUT,
        CmError::Closed => libc::ECONNRESET,
        CmError::Io(k) => std::io::Error::from(*k).raw_os_error().unwrap_or(libc::EIO),
        _ => libc::ECONNABORTED,
    }
}

/// After the connection is established: wait for its end and report it
/// once as DISCONNECTED.
fn watch(me: *mut rdma_cm_id, chan: &ChanShared, qp: Weak<Qp>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let Some(q) = qp.upgrade() else {
            return;
        };
        if let Some(CmEvent::Disconnected) = q.wait_event(STOP_POLL) {
            chan.push(event(
                me,
                null_mut(),
                RDMA_CM_EVENT_DISCONNECTED,
                0,
                Vec::new(),
                (0, 0),
            ));
            return;
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    let Some(o) = id_obj(id) else {
        return fail(libc::EINVAL);
    };
    let Some(q) = qp_of(o, param) else {
        return fail(libc::EINVAL);
    };
    let params = match conn_params(param) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let Some(req) = lock(&o.st).req.take() else {
        return fail(libc::EINVAL);
    };
    let Some((init, early)) = q.begin_connect() else {
        lock(&o.st).req = Some(req);
        return fail(libc::EINVAL);
    };
    let r = req.accept_with_recvs(init, params, &recv_wrs(&early));
    match r {
        Ok(qp) => {
            let qp = q.finish_connect(qp);
            let n = qp.negotiated();
            lock(&o.st).connected = true;
            o.chan.push(event(
                id,
                null_mut(),
                RDMA_CM_EVENT_ESTABLISHED,
                0,
                Vec::new(),
                (n.ird, n.ord),
            ));
            let (me, chan, weak) = (SendPtr(id), o.chan.clone(), Arc::downgrade(&qp));
            o.spawn(move |stop| {
                let me = me;
                watch(me.0, &chan, weak, &stop)
            });
            0
        }
        Err(e) => {
            q.fail_connect(early);
            fail(cm_errno(&e))
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_reject(id: *mut rdma_cm_id, pdata: *const c_void, len: u8) -> c_int {
    let Some(o) = id_obj(id) else {
        return fail(libc::EINVAL);
    };
    if len > 0 && pdata.is_null() {
        return fail(libc::EINVAL);
    }
    let Some(req) = lock(&o.st).req.take() else {
        return fail(libc::EINVAL);
    };
    let data = if len == 0 {
        Vec::new()
    } else {
        // SAFETY: `len` bytes at `pdata`.
        unsafe { std::slice::from_raw_parts(pdata.cast::<u8>(), len.into()) }.to_vec()
    };
    match req.reject(&data) {
        Ok(()) => 0,
        Err(e) => fail(cm_errno(&e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    let Some(o) = id_obj(id) else {
        return fail(libc::EINVAL);
    };
    let dst = {
        let st = lock(&o.st);
        match (st.route_resolved, st.dst) {
            (true, Some(d)) => d,
            _ => return fail(libc::EINVAL),
        }
    };
    let Some(q) = qp_of(o, param) else {
        return fail(libc::EINVAL);
    };
    let params = match conn_params(param) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let Some((init, early)) = q.begin_connect() else {
        return fail(libc::EINVAL);
    };
    let Ok(g) = global() else {
        return fail(libc::ENODEV);
    };
    let (me, qp, chan) = (
        SendPtr(id),
        SendPtr((q as *const QpObj).cast_mut()),
        o.chan.clone(),
    );
    o.spawn(move |stop| {
        let (me, qp) = (me, qp);
        // SAFETY: the QP outlives the connect (see `SendPtr`).
        let q = unsafe { &*qp.0 };
        let r = match g
            .dev
            .connect_start(SocketAddr::V4(dst), init, params, &recv_wrs(&early))
        {
            Ok(mut c) => loop {
                if let Some(r) = c.poll() {
                    break r;
                }
                if stop.load(Ordering::SeqCst) {
                    // The ID is being destroyed: abandon the connect.
                    q.fail_connect(early);
                    return;
                }
                let mut pfd = libc::pollfd {
                    fd: c.event_fd().as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd of an open descriptor.
                unsafe { libc::poll(&mut pfd, 1, STOP_POLL.as_millis() as c_int) };
            },
            Err(e) => Err(e),
        };
        match r {
            Ok(engine_qp) => {
                let engine_qp = q.finish_connect(engine_qp);
                let n = engine_qp.negotiated();
                // SAFETY: the ID outlives its workers.
                lock(&unsafe { &*me.0.cast::<IdObj>() }.st).connected = true;
                chan.push(event(
                    me.0,
                    null_mut(),
                    RDMA_CM_EVENT_ESTABLISHED,
                    0,
                    engine_qp.peer_private_data(),
                    (n.ird, n.ord),
                ));
                let weak = Arc::downgrade(&engine_qp);
                drop(engine_qp);
                watch(me.0, &chan, weak, &stop);
            }
            Err(e) => {
                q.fail_connect(early);
                let (kind, pdata) = match &e {
                    CmError::Rejected { private_data } => {
                        (RDMA_CM_EVENT_REJECTED, private_data.clone())
                    }
                    CmError::ConnectionRefused => (RDMA_CM_EVENT_REJECTED, Vec::new()),
                    CmError::Unreachable | CmError::Timeout | CmError::MpaTimeout => {
                        (RDMA_CM_EVENT_UNREACHABLE, Vec::new())
                    }
                    _ => (RDMA_CM_EVENT_CONNECT_ERROR, Vec::new()),
                };
                chan.push(event(me.0, null_mut(), kind, -cm_errno(&e), pdata, (0, 0)));
            }
        }
    });
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    let Some(o) = id_obj(id) else {
        return fail(libc::EINVAL);
    };
    let Some(q) = obj::<_, QpObj>(o.raw.qp, Kind::Qp) else {
        return fail(libc::EINVAL);
    };
    let Some(e) = q.engine_qp() else {
        return fail(libc::EINVAL);
    };
    e.disconnect();
    q.set_state(IBV_QPS_ERR);
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    match id_obj(id) {
        Some(o) if lock(&o.st).connected => 0,
        _ => fail(libc::EINVAL),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    let Some(o) = id_obj(id) else {
        return fail(libc::EINVAL);
    };
    if attr.is_null() || mask.is_null() {
        return fail(libc::EINVAL);
    }
    let q = obj::<_, QpObj>(o.raw.qp, Kind::Qp);
    let connected = lock(&o.st).connected;
    let next = match q.map(|q| q.state()) {
        _ if connected => IBV_QPS_RTS,
        Some(IBV_QPS_INIT) => IBV_QPS_RTR,
        Some(IBV_QPS_RTR) | Some(IBV_QPS_RTS) => IBV_QPS_RTS,
        _ => IBV_QPS_INIT,
    };
    // SAFETY: the caller's out parameters.
    unsafe {
        *attr = ibv_qp_attr {
            qp_state: next,
            qp_access_flags: IBV_ACCESS_LOCAL_WRITE
                | IBV_ACCESS_REMOTE_WRITE
                | IBV_ACCESS_REMOTE_READ,
            port_num: 1,
            ..Default::default()
        };
        *mask = (IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT) as c_int;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    id_obj(id)
        .and_then(|o| lock(&o.st).src)
        .map_or(0, |a| a.port().to_be())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    id_obj(id)
        .and_then(|o| lock(&o.st).dst)
        .map_or(0, |a| a.port().to_be())
}

// ---------------------------------------------------------- unsupported

#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    _level: c_int,
    _optname: c_int,
    _optval: *mut c_void,
    _optlen: usize,
) -> c_int {
    fail(if is_live(id, Kind::CmId) {
        libc::EOPNOTSUPP
    } else {
        libc::EINVAL
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    _ch: *mut rdma_event_channel,
) -> c_int {
    fail(if is_live(id, Kind::CmId) {
        libc::EOPNOTSUPP
    } else {
        libc::EINVAL
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    _addr: *mut sockaddr,
    _context: *mut c_void,
) -> c_int {
    fail(if is_live(id, Kind::CmId) {
        libc::EOPNOTSUPP
    } else {
        libc::EINVAL
    })
}

/// rsockets are not provided.
#[no_mangle]
pub unsafe extern "C" fn rpoll(
    _fds: *mut libc::pollfd,
    _nfds: libc::nfds_t,
    _timeout: c_int,
) -> c_int {
    fail(libc::EOPNOTSUPP)
}

// ---------------------------------------------------------- addrinfo

#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null()) {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's hints, if any.
    let h = unsafe { hints.as_ref() };
    let flags = h.map_or(0, |h| h.ai_flags as u32);
    if h.is_some_and(|h| h.ai_family != 0 && h.ai_family != libc::AF_INET) {
        return fail(libc::EAFNOSUPPORT);
    }
    let passive = flags & RAI_PASSIVE != 0;
    // SAFETY: an all-zero addrinfo is valid hints.
    let mut ghints: libc::addrinfo = unsafe { std::mem::zeroed() };
    ghints.ai_family = libc::AF_INET;
    ghints.ai_socktype = libc::SOCK_STREAM;
    if passive {
        ghints.ai_flags |= libc::AI_PASSIVE;
    }
    if flags & RAI_NUMERICHOST != 0 {
        ghints.ai_flags |= libc::AI_NUMERICHOST;
    }
    let mut gres: *mut libc::addrinfo = null_mut();
    // SAFETY: C strings or null from the caller; `gres` receives a list
    // freed below.
    let r = unsafe { libc::getaddrinfo(node, service, &ghints, &mut gres) };
    if r != 0 || gres.is_null() {
        set_errno(libc::ENODEV);
        return r;
    }
    // SAFETY: the first entry of the list getaddrinfo returned (AF_INET:
    // a sockaddr_in).
    let sin = unsafe { *(*gres).ai_addr.cast::<sockaddr_in>() };
    // SAFETY: the list from getaddrinfo.
    unsafe { libc::freeaddrinfo(gres) };
    let addr = Box::into_raw(Box::new(sin)).cast::<sockaddr>();
    let len = size_of::<sockaddr_in>() as socklen_t;
    let mut ai = Box::new(rdma_addrinfo {
        ai_flags: flags as c_int,
        ai_family: libc::AF_INET,
        ai_qp_type: IBV_QPT_RC as c_int,
        ai_port_space: RDMA_PS_TCP as c_int,
        ..Default::default()
    });
    if passive {
        ai.ai_src_addr = addr;
        ai.ai_src_len = len;
    } else {
        ai.ai_dst_addr = addr;
        ai.ai_dst_len = len;
    }
    // SAFETY: the caller's out parameter.
    unsafe { *res = Box::into_raw(ai) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: a list built by rdma_getaddrinfo, freed once.
        let ai = unsafe { Box::from_raw(p) };
        for a in [ai.ai_src_addr, ai.ai_dst_addr] {
            if !a.is_null() {
                // SAFETY: allocated as a Box<sockaddr_in> above.
                drop(unsafe { Box::from_raw(a.cast::<sockaddr_in>()) });
            }
        }
        p = ai.ai_next;
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    let pd = if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
        a.pd
    } else {
        null_mut()
    };
    create_id_qp(id, pd, |pd| {
        // librdmacm's: the extended attributes with the ID's PD, through
        // the context's create_qp_ex.
        a.pd = pd;
        a.comp_mask |= IBV_QP_INIT_ATTR_PD;
        let ctx = id_obj(id).map_or(null_mut(), |o| o.raw.verbs);
        // SAFETY: the caller's attributes, with the ID's context.
        unsafe { crate::qp::create_qp_ex(ctx, a) }
    })
}

/// The synchronous endpoint API (`rdma_create_ep`, `rdma_get_request`)
/// is not provided.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    _res: *mut rdma_addrinfo,
    _pd: *mut ibv_pd,
    _attr: *mut ibv_qp_init_attr,
) -> c_int {
    fail(if id.is_null() {
        libc::EINVAL
    } else {
        libc::EOPNOTSUPP
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    _id: *mut *mut rdma_cm_id,
) -> c_int {
    fail(if is_live(listen, Kind::CmId) {
        libc::EOPNOTSUPP
    } else {
        libc::EINVAL
    })
}

/// Destroys what `rdma_create_ep` would have created: no ID ever comes
/// from it, so only IDs of `rdma_create_id` are destroyed here.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    // SAFETY: forwarded; a bad handle is refused there.
    unsafe {
        rdma_destroy_qp(id);
        rdma_destroy_id(id);
    }
}
