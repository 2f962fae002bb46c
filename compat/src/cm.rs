//! librdmacm: event channels, CM IDs and the connection lifecycle over the
//! engine's connection manager.
//!
//! An event channel's fd (`rdma_event_channel.fd`) is an epoll instance
//! whose one member is an eventfd readable while the channel holds an
//! event: it polls as librdmacm's does, and `rdma_get_cm_event` takes one
//! event, waiting for it or failing with EAGAIN when the application made
//! the fd non-blocking.
//!
//! Events come from the calling thread (ADDR_RESOLVED, ROUTE_RESOLVED,
//! ESTABLISHED of an accept, the outcome of a connect refused on the spot)
//! or from the channel's worker: one thread per channel, started with it
//! and joined when it is destroyed, waiting in `epoll_wait` on the engine
//! descriptors of the IDs bound to the channel and on an eventfd of its
//! own (to stop it, or to have it look at a new connect's deadline). A
//! listening ID's [`Listener::event_fd`] brings connection requests
//! (CONNECT_REQUEST, with a new ID), a connecting ID's
//! [`Connecting::event_fd`] moves the engine's non-blocking connect on
//! (ESTABLISHED, REJECTED, UNREACHABLE, CONNECT_ERROR), a connected ID's
//! [`Qp::event_fd`] brings the connection's end (DISCONNECTED). A worker
//! wakes only for those descriptors, and at the deadline of a connect
//! under way.
//!
//! The watched descriptors of all channels are one table under one lock,
//! indexed by ID, by connecting QP and by each channel's connect
//! deadlines, so that no wake and no call walks other IDs' entries.
//! A worker handles a descriptor with the lock held and only while its
//! entry is in the table; `rdma_destroy_id`, `rdma_migrate_id` and
//! `ibv_destroy_qp` change the table under the same lock (and drop the
//! events an ID has queued), so once they return no worker touches the ID
//! or QP or queues an event for it.
//!
//! An ID created without a channel is synchronous, as in librdmacm: it has
//! a channel of its own, and the calls that produce an event
//! (`rdma_resolve_addr`, `rdma_resolve_route`, `rdma_connect`,
//! `rdma_accept`, `rdma_disconnect`, `rdma_get_request`) wait for it, keep
//! it in `id->event` until the next such call, and fail as the event says.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::io;
use std::mem::size_of;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iwarp_engine::{
    CmError, ConnParams, ConnRequest, Connecting, ListenOptions, Listener, Negotiated, Qp, QpInit,
};

use crate::config::CONNECT_RETRY_PAUSE;
use crate::qp::EarlyRecv;
use crate::sys::*;
use crate::verbs::{
    self, global, ibv_alloc_pd, ibv_create_comp_channel, ibv_create_cq, ibv_create_qp,
    ibv_destroy_comp_channel, ibv_destroy_cq, ibv_destroy_qp, qp_by_num, recv_wrs, QpObj,
};
use crate::{is_live, lock, nonblocking, obj, register, reregister, set_errno, unregister, Kind};

fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

fn errno() -> c_int {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

// ---------------------------------------------------------- descriptors

/// A non-blocking eventfd (not a semaphore: one read clears it).
fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd(2) takes no pointers.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened, owned by nothing else.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

fn epoll() -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1(2) takes no pointers.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened, owned by nothing else.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// Watch `fd` for input in the epoll set `ep`, reported with `token`.
fn epoll_add(ep: RawFd, fd: RawFd, token: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: token,
    };
    // SAFETY: both descriptors are open; `ev` is a live local.
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn epoll_del(ep: RawFd, fd: RawFd) {
    // SAFETY: both descriptors are open; DEL takes no event.
    unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_DEL, fd, null_mut()) };
}

/// Add one to an eventfd (it becomes readable).
fn signal(fd: &OwnedFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a live local to our eventfd.
    unsafe { libc::write(fd.as_raw_fd(), (&raw const one).cast(), 8) };
}

/// Clear a non-blocking eventfd.
fn clear(fd: &OwnedFd) {
    let mut v = 0u64;
    // SAFETY: reads 8 bytes into a live local from our eventfd.
    unsafe { libc::read(fd.as_raw_fd(), (&raw mut v).cast(), 8) };
}

// ---------------------------------------------------------- event channels

/// The part of an event channel its worker and its IDs share.
struct ChanShared {
    /// The application's descriptor: an epoll instance over `ready`.
    app: OwnedFd,
    /// Readable while `q` holds an event.
    ready: OwnedFd,
    /// Queued events (`EventObj` addresses), oldest first.
    q: Mutex<VecDeque<usize>>,
    /// The worker's epoll set: `ctl` and the watched descriptors.
    ep: OwnedFd,
    /// Wakes the worker: to stop, or to look at a new connect's
    /// deadline.
    ctl: OwnedFd,
    stop: AtomicBool,
    /// IDs on the channel.
    ids: AtomicI32,
}

/// The token of a channel's control eventfd in its worker's epoll set
/// (watched descriptors have tokens from 1).
const CTL: u64 = 0;

impl ChanShared {
    /// Queue an event.
    fn push(&self, ev: Box<EventObj>) {
        let p = Box::into_raw(ev);
        register(p, Kind::CmEvent);
        let mut q = lock(&self.q);
        if q.is_empty() {
            signal(&self.ready);
        }
        q.push_back(p as usize);
    }

    /// Queue events taken from another channel, in their order.
    fn put(&self, evs: Vec<usize>) {
        if evs.is_empty() {
            return;
        }
        let mut q = lock(&self.q);
        if q.is_empty() {
            signal(&self.ready);
        }
        q.extend(evs);
    }

    /// Take the oldest event.
    fn pop(&self) -> Option<usize> {
        let mut q = lock(&self.q);
        let p = q.pop_front()?;
        if q.is_empty() {
            clear(&self.ready);
        }
        Some(p)
    }

    /// Take the queued events `pick` selects, in their order.
    fn take(&self, pick: impl Fn(&rdma_cm_event) -> bool) -> Vec<usize> {
        let mut q = lock(&self.q);
        let mut out = Vec::new();
        q.retain(|&p| {
            // SAFETY: queued events are live leaked Boxes, freed only
            // after they leave the queue.
            if pick(unsafe { &(*(p as *const EventObj)).raw }) {
                out.push(p);
                false
            } else {
                true
            }
        });
        if q.is_empty() && !out.is_empty() {
            clear(&self.ready);
        }
        out
    }

    /// The next event: waits for one, or EAGAIN when `block` is false.
    fn wait(&self, block: bool) -> Result<usize, c_int> {
        loop {
            if let Some(p) = self.pop() {
                return Ok(p);
            }
            if !block {
                return Err(libc::EAGAIN);
            }
            let mut pfd = libc::pollfd {
                fd: self.ready.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd of an open descriptor. EINTR and
            // concurrent takers only loop again.
            unsafe { libc::poll(&mut pfd, 1, -1) };
        }
    }
}

impl Drop for ChanShared {
    fn drop(&mut self) {
        for p in lock(&self.q).drain(..) {
            free_event(p);
        }
    }
}

/// Free a queued, never delivered event.
fn free_event(p: usize) {
    if unregister(p as *const EventObj, Kind::CmEvent) {
        // SAFETY: registered until now: a leaked Box<EventObj>, freed once.
        drop(unsafe { Box::from_raw(p as *mut EventObj) });
    }
}

/// An event channel: the application's struct, the shared part and the
/// worker, stopped and joined when the channel is dropped.
#[repr(C)]
struct Channel {
    raw: rdma_event_channel,
    shared: Arc<ChanShared>,
    worker: Option<JoinHandle<()>>,
}

impl Channel {
    fn new() -> io::Result<Box<Self>> {
        let ready = eventfd()?;
        let app = epoll()?;
        epoll_add(app.as_raw_fd(), ready.as_raw_fd(), 0)?;
        let ep = epoll()?;
        let ctl = eventfd()?;
        epoll_add(ep.as_raw_fd(), ctl.as_raw_fd(), CTL)?;
        let shared = Arc::new(ChanShared {
            app,
            ready,
            q: Mutex::new(VecDeque::new()),
            ep,
            ctl,
            stop: AtomicBool::new(false),
            ids: AtomicI32::new(0),
        });
        let s = shared.clone();
        let worker = std::thread::Builder::new()
            .name("iwarp-compat-cm".into())
            .spawn(move || run(&s))?;
        let c = Box::new(Self {
            raw: rdma_event_channel {
                fd: shared.app.as_raw_fd(),
            },
            shared,
            worker: Some(worker),
        });
        // A channel destroyed at this address before is gone for good;
        // calls on the address are this channel's now, registered or not
        // (a synchronous ID's channel is not).
        unregister(c.raw_ptr(), Kind::DestroyedChannel);
        Ok(c)
    }

    fn raw_ptr(&self) -> *mut rdma_event_channel {
        (&raw const self.raw).cast_mut()
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        signal(&self.shared.ctl);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    if let Err(e) = global() {
        set_errno(e);
        return null_mut();
    }
    let c = match Channel::new() {
        Ok(c) => c,
        Err(e) => {
            set_errno(e.raw_os_error().unwrap_or(libc::EMFILE));
            return null_mut();
        }
    };
    let p = Box::into_raw(c);
    register(p, Kind::EventChannel);
    p.cast()
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    let Some(c) = obj::<_, Channel>(ch, Kind::EventChannel) else {
        return;
    };
    // IDs still on the channel keep it (librdmacm requires them destroyed
    // first).
    if c.shared.ids.load(Ordering::SeqCst) > 0 {
        return;
    }
    let taken = if nonblocking(c.raw.fd) {
        unregister(ch, Kind::EventChannel)
    } else {
        // A later blocking call on this address waits (see
        // rdma_get_cm_event) until a new object takes the address.
        reregister(ch, Kind::EventChannel, Kind::DestroyedChannel)
    };
    if taken {
        // SAFETY: registered as a channel until now: a leaked
        // Box<Channel>, freed once (its worker is joined).
        drop(unsafe { Box::from_raw(ch.cast::<Channel>()) });
    }
}

/// An event and the private data it points to.
#[repr(C)]
struct EventObj {
    raw: rdma_cm_event,
    pdata: Vec<u8>,
    /// The ID this event counts against until it is acknowledged (see
    /// [`IdObj::unacked`]), once `rdma_get_cm_event` handed it out.
    counted: AtomicUsize,
}

impl EventObj {
    /// The ID an event counts against, as librdmacm counts it: a
    /// connection request against the listening ID, others against
    /// their own.
    fn owner(&self) -> *mut rdma_cm_id {
        if self.raw.event == RDMA_CM_EVENT_CONNECT_REQUEST {
            self.raw.listen_id
        } else {
            self.raw.id
        }
    }
}

/// `responder_resources` and `initiator_depth` of an ESTABLISHED event, as
/// the kernel's iWARP connection manager gives them: the QP's negotiated
/// ORD and IRD in that order (its `initiator_depth` carries the IRD).
fn established_resources(n: &Negotiated) -> (u16, u16) {
    (n.ord, n.ird)
}

/// An event for `id`; `resources_depth` is the `responder_resources` and
/// `initiator_depth` of its connection parameters.
fn event(
    id: *mut rdma_cm_id,
    listen_id: *mut rdma_cm_id,
    kind: rdma_cm_event_type,
    status: c_int,
    pdata: Vec<u8>,
    resources_depth: (u16, u16),
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
        counted: AtomicUsize::new(0),
    });
    let conn = rdma_conn_param {
        private_data: if e.pdata.is_empty() {
            std::ptr::null()
        } else {
            e.pdata.as_ptr().cast()
        },
        private_data_len: e.pdata.len().min(255) as u8,
        responder_resources: resources_depth.0.min(255) as u8,
        initiator_depth: resources_depth.1.min(255) as u8,
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
    let Some(c) = obj::<_, Channel>(ch, Kind::EventChannel) else {
        if is_live(ch, Kind::DestroyedChannel) {
            // A blocking channel destroyed before this call came (rping's
            // CM thread asks for the next event while the main thread
            // tears down) delivers no event, as it delivers none to a
            // call that was already waiting: the call waits until the
            // process ends.
            loop {
                std::thread::park();
            }
        }
        crate::exit::wait_if_exiting();
        return fail(libc::EINVAL);
    };
    if out.is_null() {
        return fail(libc::EINVAL);
    }
    let block = !nonblocking(c.raw.fd);
    // Another thread may destroy the channel while this call waits (rping
    // leaves its CM thread waiting when it exits): the call holds its own
    // reference to the queue, not the channel's.
    let shared = c.shared.clone();
    match shared.wait(block) {
        Ok(p) => {
            // SAFETY: taken from the queue: a live event, now the
            // application's.
            let e = unsafe { &*(p as *const EventObj) };
            let owner = e.owner();
            if let Some(o) = id_obj(owner) {
                *lock(&o.unacked) += 1;
                e.counted.store(owner as usize, Ordering::SeqCst);
            }
            // SAFETY: the caller's out parameter.
            unsafe { *out = p as *mut rdma_cm_event };
            0
        }
        Err(e) => fail(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(ev: *mut rdma_cm_event) -> c_int {
    if !unregister(ev, Kind::CmEvent) {
        return fail(libc::EINVAL);
    }
    // SAFETY: registered until now: a leaked Box<EventObj>, freed once.
    let e = unsafe { Box::from_raw(ev.cast::<EventObj>()) };
    let owner = e.counted.load(Ordering::SeqCst) as *mut rdma_cm_id;
    // The owner waits in rdma_destroy_id for this acknowledgement, so it
    // is still live.
    if let Some(o) = id_obj(owner) {
        let mut n = lock(&o.unacked);
        *n = n.saturating_sub(1);
        o.acked.notify_all();
    }
    drop(e);
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

// ---------------------------------------------------------- the workers

/// What a watched descriptor belongs to.
enum What {
    /// A listening ID's listener ([`Listener::event_fd`]).
    Listen { l: Listener },
    /// A connect under way ([`Connecting::event_fd`]) with the QP it
    /// connects (a `QpObj` address: the entry goes when the QP is
    /// destroyed) and the receives posted before it.
    Connect {
        c: Box<Connecting>,
        qp: usize,
        early: Vec<EarlyRecv>,
        deadline: Instant,
        retry: Option<Box<Retry>>,
    },
    /// An established connection ([`Qp::event_fd`]).
    Connected(Weak<Qp>),
}

/// `IWARP_COMPAT_CONNECT_RETRY`: what a refused connect starts again
/// with, and until when.
struct Retry {
    dst: SocketAddr,
    init: QpInit,
    params: ConnParams,
    until: Instant,
}

impl Retry {
    /// Start the connect again if the peer refused it and the time is not
    /// up, after [`CONNECT_RETRY_PAUSE`] (which the caller spends
    /// waiting).
    fn again(&self, e: &CmError, early: &[EarlyRecv]) -> Option<Result<Connecting, CmError>> {
        if !matches!(e, CmError::ConnectionRefused) || Instant::now() >= self.until {
            return None;
        }
        std::thread::sleep(CONNECT_RETRY_PAUSE);
        let g = global().ok()?;
        Some(g.dev.connect_start(
            self.dst,
            self.init.clone(),
            self.params.clone(),
            &recv_wrs(early),
        ))
    }
}

/// A watched descriptor: a duplicate of the engine's, owned here, so it
/// stays the same file until the entry is removed.
struct Watch {
    /// The ID (an `IdObj` address).
    id: usize,
    /// The channel whose worker watches it and that gets its events.
    chan: Arc<ChanShared>,
    fd: OwnedFd,
    what: What,
}

/// The watched descriptors of every channel, with the indexes that let
/// each operation find its entries without walking the others: an ID's
/// entries, a QP's connect, and each channel's connect deadlines in
/// order.
#[derive(Default)]
struct Watches {
    next: u64,
    map: HashMap<u64, Watch>,
    /// The tokens of each ID's entries (`IdObj` address → tokens).
    by_id: HashMap<usize, Vec<u64>>,
    /// The token of each QP's connect under way (`QpObj` address).
    by_qp: HashMap<usize, u64>,
    /// The connects under way of each channel (`ChanShared` address), by
    /// deadline.
    deadlines: HashMap<usize, BTreeSet<(Instant, u64)>>,
}

/// The watched descriptors of every channel.
fn watches() -> &'static Mutex<Watches> {
    static W: OnceLock<Mutex<Watches>> = OnceLock::new();
    W.get_or_init(Default::default)
}

/// The key of a channel in [`Watches::deadlines`].
fn chan_key(chan: &Arc<ChanShared>) -> usize {
    Arc::as_ptr(chan) as usize
}

impl Watches {
    /// Watch `fd` for `id` in `chan`'s worker; on failure `what` comes
    /// back.
    fn add(
        &mut self,
        id: usize,
        chan: &Arc<ChanShared>,
        fd: OwnedFd,
        what: What,
    ) -> Result<(), (io::Error, What)> {
        self.next += 1;
        let token = self.next;
        if let Err(e) = epoll_add(chan.ep.as_raw_fd(), fd.as_raw_fd(), token) {
            return Err((e, what));
        }
        if let What::Connect { qp, deadline, .. } = what {
            self.by_qp.insert(qp, token);
            self.deadlines
                .entry(chan_key(chan))
                .or_default()
                .insert((deadline, token));
            // The worker learns the connect's deadline.
            signal(&chan.ctl);
        }
        self.by_id.entry(id).or_default().push(token);
        self.map.insert(
            token,
            Watch {
                id,
                chan: chan.clone(),
                fd,
                what,
            },
        );
        Ok(())
    }

    fn remove(&mut self, token: u64) -> Option<Watch> {
        let w = self.map.remove(&token)?;
        epoll_del(w.chan.ep.as_raw_fd(), w.fd.as_raw_fd());
        if let Some(ts) = self.by_id.get_mut(&w.id) {
            ts.retain(|&t| t != token);
            if ts.is_empty() {
                self.by_id.remove(&w.id);
            }
        }
        if let What::Connect { qp, deadline, .. } = w.what {
            self.by_qp.remove(&qp);
            self.forget_deadline(chan_key(&w.chan), deadline, token);
        }
        Some(w)
    }

    fn forget_deadline(&mut self, chan: usize, deadline: Instant, token: u64) {
        if let Some(d) = self.deadlines.get_mut(&chan) {
            d.remove(&(deadline, token));
            if d.is_empty() {
                self.deadlines.remove(&chan);
            }
        }
    }

    /// The tokens of `id`'s entries.
    fn of_id(&self, id: usize) -> Vec<u64> {
        self.by_id.get(&id).cloned().unwrap_or_default()
    }

    /// Entry `token` is watched by `new`'s worker from now on (the caller
    /// moves its descriptor between the epoll sets).
    fn rechan(&mut self, token: u64, new: &Arc<ChanShared>) {
        let Some(w) = self.map.get_mut(&token) else {
            return;
        };
        let old = std::mem::replace(&mut w.chan, new.clone());
        if let What::Connect { deadline, .. } = w.what {
            self.forget_deadline(chan_key(&old), deadline, token);
            self.deadlines
                .entry(chan_key(new))
                .or_default()
                .insert((deadline, token));
        }
    }

    /// When the worker of `chan` must look at a connect whose descriptor
    /// stays quiet (its timeout).
    fn next_deadline(&self, chan: &Arc<ChanShared>) -> Option<Instant> {
        let d = self.deadlines.get(&chan_key(chan))?;
        d.first().map(|&(at, _)| at)
    }

    /// The connects of `chan` whose deadline is `now` or earlier.
    fn due(&self, chan: &Arc<ChanShared>, now: Instant) -> Vec<u64> {
        self.deadlines
            .get(&chan_key(chan))
            .map_or_else(Vec::new, |d| {
                d.iter()
                    .take_while(|&&(at, _)| at <= now)
                    .map(|&(_, t)| t)
                    .collect()
            })
    }
}

/// A channel's worker.
fn run(ch: &Arc<ChanShared>) {
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 16];
    loop {
        // Checked before each wait: `stop` is set before `ctl` is
        // signalled, so a signal cleared below with the stop unseen is
        // seen here.
        if ch.stop.load(Ordering::SeqCst) {
            return;
        }
        let deadline = lock(watches()).next_deadline(ch);
        let ms = deadline.map_or(-1, |d| {
            let left = d.saturating_duration_since(Instant::now());
            c_int::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(c_int::MAX)
        });
        // SAFETY: `evs` has room for 16 events; the epoll fd is open.
        let n = unsafe { libc::epoll_wait(ch.ep.as_raw_fd(), evs.as_mut_ptr(), 16, ms) };
        for e in evs.iter().take(usize::try_from(n).unwrap_or(0)) {
            let token = e.u64;
            if token == CTL {
                clear(&ch.ctl);
            } else {
                handle(token);
            }
        }
        if n == 0 {
            // A connect's deadline: its poll reports the timeout.
            let now = Instant::now();
            let due = lock(watches()).due(ch, now);
            for t in due {
                handle(t);
            }
        }
    }
}

/// A watched descriptor is readable (or a connect's deadline passed).
fn handle(token: u64) {
    let mut g = lock(watches());
    let Some(w) = g.map.get_mut(&token) else {
        // Removed since epoll reported it.
        return;
    };
    let (id, chan) = (w.id, w.chan.clone());
    match &mut w.what {
        What::Listen { l } => {
            while let Ok(req) = l.get_request(Some(Duration::ZERO)) {
                conn_request(id, &chan, req);
            }
        }
        What::Connect { c, .. } => {
            if let Some(r) = c.poll() {
                let w = g.remove(token).expect("found above");
                connect_done(&mut g, w, r);
            }
        }
        What::Connected(weak) => {
            let Some(q) = weak.upgrade() else {
                // The QP is destroyed.
                g.remove(token);
                return;
            };
            // Every connection event ends the connection: an orderly
            // close, a Terminate either way, the connection lost, a CQ
            // overrun. Each gives DISCONNECTED, once, as the kernel's
            // iWARP connection manager does when the connection closes.
            if q.poll_event().is_some() {
                chan.push(event(
                    id as *mut rdma_cm_id,
                    null_mut(),
                    RDMA_CM_EVENT_DISCONNECTED,
                    0,
                    Vec::new(),
                    (0, 0),
                ));
                g.remove(token);
            }
        }
    }
}

/// A connection request on a listening ID: a new ID (on the listening
/// ID's channel, or a channel of its own when the listening ID is
/// synchronous) and CONNECT_REQUEST.
fn conn_request(parent: usize, chan: &Arc<ChanShared>, req: ConnRequest) {
    // SAFETY: the listening ID is live while its entry is in the table
    // (the caller holds the table's lock).
    let p = unsafe { &*(parent as *const IdObj) };
    let (local, peer) = (req.local_addr(), req.peer_addr());
    let (ird, ord) = req
        .request()
        .ird_ord
        .map(|w| (w.ird, w.ord))
        .unwrap_or((1, 1));
    let pdata = req.private_data().to_vec();
    let on = if p.sync.load(Ordering::SeqCst) {
        None
    } else {
        Some((p.raw.channel, chan.clone()))
    };
    let child = match new_id(on, p.raw.context, p.raw.ps) {
        Ok(c) => c,
        // Dropping the request closes the connection.
        Err(_) => return,
    };
    // SAFETY: just created, not yet handed out.
    let c = unsafe { &mut *child };
    set_src(&mut c.raw, local);
    set_dst(&mut c.raw, peer);
    {
        let mut st = lock(&c.st);
        st.src = Some(local);
        st.dst = Some(peer);
        st.req = Some(req);
    }
    // The peer's ORD is what we serve; its IRD bounds what we issue.
    chan.push(event(
        c.ptr(),
        parent as *mut rdma_cm_id,
        RDMA_CM_EVENT_CONNECT_REQUEST,
        0,
        pdata,
        (ord, ird),
    ));
}

/// The outcome of a connect: ESTABLISHED (and the connection watched), or
/// the event of the failure.
fn connect_done(g: &mut Watches, w: Watch, r: Result<Qp, CmError>) {
    let What::Connect {
        qp, early, retry, ..
    } = w.what
    else {
        return;
    };
    // SAFETY: the QP is live while its connect is in the table
    // (ibv_destroy_qp removes it under the table's lock, held by the
    // caller).
    let q = unsafe { &*(qp as *const QpObj) };
    let id = w.id as *mut rdma_cm_id;
    match r {
        Ok(engine_qp) => {
            // IWARP_COMPAT_CONNECT_DELAY (0 unless set; the workers pause
            // meanwhile).
            if let Ok(g) = global() {
                std::thread::sleep(g.cfg.connect_delay);
            }
            let engine_qp = q.finish_connect(engine_qp);
            let n = engine_qp.negotiated();
            // The port the connection took (the address resolved had 0).
            let local = engine_qp.local_addr();
            {
                // SAFETY: the ID is live while its entry was in the table.
                let mut st = lock(&unsafe { &*(w.id as *const IdObj) }.st);
                st.connected = true;
                st.src = Some(local);
            }
            // SAFETY: the live ID; the application waits for this
            // connect's event and reads its address after it.
            unsafe { set_src(&mut *id, local) };
            w.chan.push(event(
                id,
                null_mut(),
                RDMA_CM_EVENT_ESTABLISHED,
                0,
                engine_qp.peer_private_data(),
                established_resources(&n),
            ));
            let watched = match engine_qp.event_fd().try_clone_to_owned() {
                Ok(fd) => g
                    .add(
                        w.id,
                        &w.chan,
                        fd,
                        What::Connected(Arc::downgrade(&engine_qp)),
                    )
                    .map_err(|(e, _)| e),
                Err(e) => Err(e),
            };
            if watched.is_err() {
                // Out of descriptors: the connection cannot be followed.
                engine_qp.disconnect();
                q.set_state(IBV_QPS_ERR);
            }
        }
        Err(e) => {
            // IWARP_COMPAT_CONNECT_RETRY: a refused connect starts again
            // (the workers pause meanwhile).
            if let Some(Ok(c)) = retry.as_ref().and_then(|rt| rt.again(&e, &early)) {
                if let Ok(fd) = c.event_fd().try_clone_to_owned() {
                    let deadline = Instant::now()
                        + retry
                            .as_ref()
                            .map_or(Duration::ZERO, |rt| rt.params.timeout);
                    let what = What::Connect {
                        c: Box::new(c),
                        qp,
                        early,
                        deadline,
                        retry,
                    };
                    match g.add(w.id, &w.chan, fd, what) {
                        Ok(()) => return,
                        Err((_, What::Connect { early, .. })) => {
                            q.fail_connect(early);
                            w.chan.push(failure_event(id, &e));
                            return;
                        }
                        Err(_) => return,
                    }
                }
            }
            q.fail_connect(early);
            w.chan.push(failure_event(id, &e));
        }
    }
}

/// The event of a failed connect, as the kernel's iWARP connection
/// manager reports it: REJECTED for a reset or refused connection or an
/// MPA reject (with its private data), UNREACHABLE for a timeout,
/// CONNECT_ERROR for anything else; the status is the negative errno.
fn failure_event(id: *mut rdma_cm_id, e: &CmError) -> Box<EventObj> {
    let (kind, pdata) = match e {
        CmError::Rejected { private_data } => (RDMA_CM_EVENT_REJECTED, private_data.clone()),
        CmError::ConnectionRefused => (RDMA_CM_EVENT_REJECTED, Vec::new()),
        CmError::Unreachable | CmError::Timeout | CmError::MpaTimeout => {
            (RDMA_CM_EVENT_UNREACHABLE, Vec::new())
        }
        _ => (RDMA_CM_EVENT_CONNECT_ERROR, Vec::new()),
    };
    event(id, null_mut(), kind, -cm_errno(e), pdata, (0, 0))
}

/// `ibv_destroy_qp` is destroying `qp`: a connect of it is abandoned (its
/// ID gets CONNECT_ERROR with −ECONNABORTED) and no worker touches the QP
/// after this returns.
pub(crate) fn forget_qp(qp: *const ibv_qp) {
    let mut g = lock(watches());
    if let Some(t) = g.by_qp.get(&(qp as usize)).copied() {
        if let Some(w) = g.remove(t) {
            w.chan.push(event(
                w.id as *mut rdma_cm_id,
                null_mut(),
                RDMA_CM_EVENT_CONNECT_ERROR,
                -libc::ECONNABORTED,
                Vec::new(),
                (0, 0),
            ));
        }
    }
}

// ---------------------------------------------------------------- IDs

#[derive(Default)]
struct IdState {
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    addr_resolved: bool,
    route_resolved: bool,
    listening: bool,
    /// A connection request waiting for rdma_accept or rdma_reject.
    req: Option<ConnRequest>,
    connected: bool,
    /// rdma_disconnect was called (a synchronous ID waits once).
    disconnected: bool,
    /// A passive endpoint's QP attributes, for the IDs of
    /// rdma_get_request (rdma_create_ep).
    qp_init: Option<ibv_qp_init_attr>,
    /// Private data put before the application's in rdma_connect
    /// (`ai_connect` of rdma_create_ep's address).
    connect_pdata: Vec<u8>,
    /// `RDMA_OPTION_ID_AFONLY` is set: a listener on an IPv6 address
    /// takes IPv6 connections only (`IPV6_V6ONLY`); without it one on
    /// `[::]` takes IPv4 ones too, as a Linux socket does.
    af_only: bool,
}

#[repr(C)]
struct IdObj {
    raw: rdma_cm_id,
    /// The channel events go to (changed by rdma_migrate_id under the
    /// table's lock).
    chan: Mutex<Arc<ChanShared>>,
    /// The channel of a synchronous ID, made with it.
    own: Mutex<Option<Box<Channel>>>,
    sync: AtomicBool,
    st: Mutex<IdState>,
    /// Events `rdma_get_cm_event` handed out for this ID and not yet
    /// acknowledged: `rdma_destroy_id` waits for them, as librdmacm's
    /// does (a thread that is still handling one keeps the ID until it
    /// acknowledges).
    unacked: Mutex<u32>,
    acked: Condvar,
}

impl IdObj {
    fn ptr(&self) -> *mut rdma_cm_id {
        (&raw const self.raw).cast_mut()
    }

    fn chan(&self) -> Arc<ChanShared> {
        lock(&self.chan).clone()
    }

    fn push(&self, ev: Box<EventObj>) {
        self.chan().push(ev);
    }

    /// Wait until every event handed out for the ID is acknowledged.
    fn wait_acked(&self) {
        let mut n = lock(&self.unacked);
        while *n > 0 {
            n = self.acked.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The library's protection domain for IDs given none (librdmacm's
/// per-device default PD), allocated once.
fn default_pd(ctx: *mut ibv_context) -> Result<*mut ibv_pd, c_int> {
    static PD: OnceLock<Result<usize, c_int>> = OnceLock::new();
    PD.get_or_init(|| {
        // SAFETY: our context.
        let p = unsafe { ibv_alloc_pd(ctx) };
        if p.is_null() {
            Err(errno())
        } else {
            Ok(p as usize)
        }
    })
    .as_ref()
    .map(|&p| p as *mut ibv_pd)
    .map_err(|e| *e)
}

/// A new ID on `chan` (the application's pointer and the shared part), or
/// synchronous with a channel of its own (`None`).
fn new_id(
    chan: Option<(*mut rdma_event_channel, Arc<ChanShared>)>,
    context: *mut c_void,
    ps: rdma_port_space,
) -> Result<*mut IdObj, c_int> {
    let ctx = the_context()?;
    let pd = default_pd(ctx)?;
    let (own, raw_ch, shared) = match chan {
        Some((r, s)) => (None, r, s),
        None => {
            let c = Channel::new().map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
            let (r, s) = (c.raw_ptr(), c.shared.clone());
            (Some(c), r, s)
        }
    };
    shared.ids.fetch_add(1, Ordering::SeqCst);
    let sync = own.is_some();
    let o = Box::new(IdObj {
        raw: rdma_cm_id {
            verbs: ctx,
            channel: raw_ch,
            context,
            ps,
            port_num: 1,
            qp_type: IBV_QPT_RC,
            pd,
            ..Default::default()
        },
        chan: Mutex::new(shared),
        own: Mutex::new(own),
        sync: AtomicBool::new(sync),
        st: Mutex::new(IdState::default()),
        unacked: Mutex::new(0),
        acked: Condvar::new(),
    });
    let p = Box::into_raw(o);
    register(p, Kind::CmId);
    Ok(p)
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
    let on = if ch.is_null() {
        // Synchronous.
        None
    } else {
        let Some(c) = obj::<_, Channel>(ch, Kind::EventChannel) else {
            return fail(libc::EINVAL);
        };
        Some((ch, c.shared.clone()))
    };
    if ps != RDMA_PS_TCP {
        return fail(libc::EOPNOTSUPP);
    }
    if let Err(e) = global() {
        return fail(e);
    }
    match new_id(on, context, ps) {
        Ok(p) => {
            // SAFETY: the caller's out parameter.
            unsafe { *id = p.cast() };
            0
        }
        Err(e) => fail(e),
    }
}

/// Ack the event a synchronous ID keeps in `id->event`.
///
/// # Safety
/// `id` is a live ID.
unsafe fn ack_kept(id: *mut rdma_cm_id) {
    // SAFETY: the live ID (the caller's).
    let ev = unsafe { (*id).event };
    if !ev.is_null() {
        // SAFETY: an event this library handed out; refused if not live.
        unsafe {
            rdma_ack_cm_event(ev);
            (*id).event = null_mut();
        }
    }
}

/// For a synchronous ID, wait for the event of the call just made, keep
/// it in `id->event` (acking the one kept before) and fail as it says,
/// as librdmacm does; 0 at once for an ID on a channel.
fn complete(id: *mut rdma_cm_id, o: &IdObj) -> c_int {
    if !o.sync.load(Ordering::SeqCst) {
        return 0;
    }
    // SAFETY: the live ID.
    unsafe { ack_kept(id) };
    let p = match o.chan().wait(true) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    // SAFETY: the live ID; `p` is a live event, now the application's.
    let e = unsafe {
        (*id).event = p as *mut rdma_cm_event;
        &(*(p as *const EventObj)).raw
    };
    if e.status == 0 {
        0
    } else if e.event == RDMA_CM_EVENT_REJECTED {
        fail(libc::ECONNREFUSED)
    } else {
        fail(e.status.abs())
    }
}

fn id_obj<'a>(id: *mut rdma_cm_id) -> Option<&'a IdObj> {
    obj::<_, IdObj>(id, Kind::CmId)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    // Events handed out for the ID are acknowledged first (librdmacm:
    // rdma_destroy_id blocks until then).
    if let Some(o) = id_obj(id) {
        o.wait_acked();
    }
    if !unregister(id, Kind::CmId) {
        return fail(libc::EINVAL);
    }
    // SAFETY: registered until now: a leaked Box<IdObj>, freed below.
    let o = unsafe { &*id.cast::<IdObj>() };
    // Stop watching its descriptors and drop its undelivered events (and
    // the connection requests queued for it), under the table's lock: no
    // worker touches the ID afterwards.
    let (gone, evs) = {
        let mut g = lock(watches());
        let mut gone = Vec::new();
        for t in g.of_id(id as usize) {
            if let Some(w) = g.remove(t) {
                if let What::Connect { qp, early, .. } = w.what {
                    // SAFETY: the QP is live while its connect is in the
                    // table.
                    unsafe { &*(qp as *const QpObj) }.fail_connect(early);
                } else {
                    gone.push(w);
                }
            }
        }
        let evs = o.chan().take(|e| e.id == id || e.listen_id == id);
        (gone, evs)
    };
    drop(gone);
    for p in evs {
        // SAFETY: taken from the queue, not yet freed.
        let e = unsafe { &(*(p as *const EventObj)).raw };
        if e.event == RDMA_CM_EVENT_CONNECT_REQUEST && e.listen_id == id {
            // SAFETY: the request's new ID, never handed out.
            unsafe { rdma_destroy_id(e.id) };
        }
        free_event(p);
    }
    // SAFETY: the ID, still allocated.
    unsafe { ack_kept(id) };
    // SAFETY: a leaked Box<IdObj>, freed once; no worker uses it. Its own
    // channel (synchronous ID) is dropped here, outside the table's lock,
    // which its worker may be waiting for.
    let b = unsafe { Box::from_raw(id.cast::<IdObj>()) };
    b.chan().ids.fetch_sub(1, Ordering::SeqCst);
    drop(b);
    0
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

fn to_sockaddr_in6(a: SocketAddrV6) -> sockaddr_in6 {
    let mut sin6 = sockaddr_in6 {
        sin6_family: libc::AF_INET6 as sa_family_t,
        sin6_port: a.port().to_be(),
        sin6_flowinfo: a.flowinfo().to_be(),
        sin6_scope_id: a.scope_id(),
        ..Default::default()
    };
    sin6.sin6_addr.__in6_u.__u6_addr8 = a.ip().octets();
    sin6
}

/// A socket address (IPv4 or IPv6) from the application's `sockaddr`.
///
/// # Safety
/// `sa` is null or points to a socket address of its family's size.
unsafe fn parse_addr(sa: *const sockaddr) -> Result<Option<SocketAddr>, c_int> {
    if sa.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's socket address.
    let family = c_int::from(unsafe { (*sa).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*sa.cast::<sockaddr_in>() };
            Ok(Some(SocketAddr::from((
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            ))))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let sin6 = unsafe { &*sa.cast::<sockaddr_in6>() };
            // SAFETY: every view of the address union is 16 plain bytes.
            let octets = unsafe { sin6.sin6_addr.__in6_u.__u6_addr8 };
            Ok(Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(octets),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            ))))
        }
        _ => Err(libc::EAFNOSUPPORT),
    }
}

fn set_src(raw: &mut rdma_cm_id, a: SocketAddr) {
    let u = &mut raw.route.addr.__bindgen_anon_1;
    match a {
        SocketAddr::V4(v4) => u.src_sin = to_sockaddr_in(v4),
        SocketAddr::V6(v6) => u.src_sin6 = to_sockaddr_in6(v6),
    }
}

fn set_dst(raw: &mut rdma_cm_id, a: SocketAddr) {
    let u = &mut raw.route.addr.__bindgen_anon_2;
    match a {
        SocketAddr::V4(v4) => u.dst_sin = to_sockaddr_in(v4),
        SocketAddr::V6(v6) => u.dst_sin6 = to_sockaddr_in6(v6),
    }
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
    let opts = ListenOptions {
        v6_only: st.af_only,
    };
    let l = match g.dev.listen_with(src, opts) {
        Ok(l) => l,
        Err(CmError::Io(k)) => {
            return fail(
                io::Error::from(k)
                    .raw_os_error()
                    .unwrap_or(libc::EADDRINUSE),
            )
        }
        Err(CmError::AddressFamily) => return fail(libc::EAFNOSUPPORT),
        Err(_) => return fail(libc::EADDRINUSE),
    };
    // The address bound, with the port the listener has (the AF_XDP
    // engine serves `[::]` as IPv4's wildcard).
    let bound = SocketAddr::new(src.ip(), l.local_addr().port());
    let fd = match l.event_fd().try_clone_to_owned() {
        Ok(fd) => fd,
        Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EMFILE)),
    };
    st.src = Some(bound);
    st.listening = true;
    drop(st);
    // SAFETY: the live ID.
    unsafe { set_src(&mut *id, bound) };
    let chan = o.chan();
    if let Err((e, _)) = lock(watches()).add(id as usize, &chan, fd, What::Listen { l }) {
        lock(&o.st).listening = false;
        return fail(e.raw_os_error().unwrap_or(libc::EMFILE));
    }
    0
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
    // The AF_XDP engine's own address, else the source the kernel would
    // route from.
    let engine_ip = global().ok().and_then(|g| g.cfg.local_ip());
    let s = s
        .or(engine_ip
            .filter(|_| d.is_ipv4())
            .map(|ip| SocketAddr::from((ip, 0))))
        .or_else(|| {
            let any = match d {
                SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
                SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
            };
            let u = std::net::UdpSocket::bind(any).ok()?;
            u.connect(d).ok()?;
            Some(SocketAddr::new(u.local_addr().ok()?.ip(), 0))
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
    o.push(event(
        id,
        null_mut(),
        RDMA_CM_EVENT_ADDR_RESOLVED,
        0,
        Vec::new(),
        (0, 0),
    ));
    complete(id, o)
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
    o.push(event(
        id,
        null_mut(),
        RDMA_CM_EVENT_ROUTE_RESOLVED,
        0,
        Vec::new(),
        (0, 0),
    ));
    complete(id, o)
}

/// Destroy the CQs and completion channels the library made for the ID's
/// QP.
///
/// # Safety
/// `id` is a live ID.
unsafe fn destroy_cqs(id: *mut rdma_cm_id) {
    // SAFETY: the live ID; its CQs and channels are the library's.
    unsafe {
        let r = &mut *id;
        if !r.recv_cq.is_null() {
            ibv_destroy_cq(r.recv_cq);
        }
        if !r.send_cq.is_null() && r.send_cq != r.recv_cq {
            ibv_destroy_cq(r.send_cq);
        }
        r.recv_cq = null_mut();
        r.send_cq = null_mut();
        if !r.recv_cq_channel.is_null() {
            ibv_destroy_comp_channel(r.recv_cq_channel);
        }
        if !r.send_cq_channel.is_null() && r.send_cq_channel != r.recv_cq_channel {
            ibv_destroy_comp_channel(r.send_cq_channel);
        }
        r.recv_cq_channel = null_mut();
        r.send_cq_channel = null_mut();
    }
}

/// A CQ of `size` entries with a completion channel of its own, its
/// context the ID (what `rdma_get_send_comp`/`rdma_get_recv_comp` of
/// rdma_verbs.h expect).
///
/// # Safety
/// `id` is a live ID.
unsafe fn make_cq(id: *mut rdma_cm_id, size: u32) -> Option<(*mut ibv_comp_channel, *mut ibv_cq)> {
    // SAFETY: the live ID's context.
    let ctx = unsafe { (*id).verbs };
    // SAFETY: our context.
    let ch = unsafe { ibv_create_comp_channel(ctx) };
    if ch.is_null() {
        return None;
    }
    let n = c_int::try_from(size).unwrap_or(c_int::MAX);
    // SAFETY: our context and channel.
    let cq = unsafe { ibv_create_cq(ctx, n, id.cast(), ch, 0) };
    if cq.is_null() {
        let e = errno();
        // SAFETY: made just above, unused.
        unsafe { ibv_destroy_comp_channel(ch) };
        set_errno(e);
        return None;
    }
    Some((ch, cq))
}

/// The QP attributes `rdma_create_qp` and `rdma_create_qp_ex` complete
/// for an ID without a QP, as librdmacm does: the CQs `send_cq`/`recv_cq`
/// leave out (null) are made, one per direction with a completion channel
/// each (their sizes the queue depths), and a QP without an SRQ of its
/// own takes the ID's (`rdma_create_srq`).
///
/// # Safety
/// `id` is null or a handle the application passed.
unsafe fn id_qp_attr(
    id: *mut rdma_cm_id,
    send_cq: &mut *mut ibv_cq,
    recv_cq: &mut *mut ibv_cq,
    srq: &mut *mut ibv_srq,
    cap: &ibv_qp_cap,
) -> Result<(), c_int> {
    let (send_wr, recv_wr) = (cap.max_send_wr, cap.max_recv_wr);
    let Some(o) = id_obj(id) else {
        return Err(libc::EINVAL);
    };
    if !o.raw.qp.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the live ID, used by this thread.
    let r = unsafe { &mut *id };
    if recv_cq.is_null() && r.recv_cq.is_null() && recv_wr > 0 {
        // SAFETY: the live ID.
        let Some((ch, cq)) = (unsafe { make_cq(id, recv_wr) }) else {
            return Err(errno());
        };
        (r.recv_cq_channel, r.recv_cq) = (ch, cq);
    }
    if send_cq.is_null() && r.send_cq.is_null() && send_wr > 0 {
        // SAFETY: the live ID.
        let Some((ch, cq)) = (unsafe { make_cq(id, send_wr) }) else {
            let e = errno();
            // SAFETY: the live ID.
            unsafe { destroy_cqs(id) };
            return Err(e);
        };
        (r.send_cq_channel, r.send_cq) = (ch, cq);
    }
    if recv_cq.is_null() {
        *recv_cq = r.recv_cq;
    }
    if send_cq.is_null() {
        *send_cq = r.send_cq;
    }
    if srq.is_null() {
        *srq = r.srq;
    }
    Ok(())
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
    {
        // SAFETY: the caller's attributes.
        let a = unsafe { &mut *attr };
        // SAFETY: the application's handle.
        if let Err(e) =
            unsafe { id_qp_attr(id, &mut a.send_cq, &mut a.recv_cq, &mut a.srq, &a.cap) }
        {
            return fail(e);
        }
    }
    create_id_qp(id, pd, |pd| {
        // SAFETY: forwarded with the caller's attributes.
        unsafe { ibv_create_qp(pd, attr) }
    })
}

/// The QP of `id` made by `create` in `pd` (or the ID's PD), in INIT; the
/// CQs `id_cqs` made are destroyed if it fails.
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
    let pd = if pd.is_null() { o.raw.pd } else { pd };
    let qp = create(pd);
    if qp.is_null() {
        let e = errno();
        // SAFETY: the live ID.
        unsafe { destroy_cqs(id) };
        return fail(e);
    }
    if let Some(q) = obj::<_, QpObj>(qp, Kind::Qp) {
        q.set_state(IBV_QPS_INIT);
    }
    // SAFETY: the live ID, used by this thread.
    unsafe {
        (*id).qp = qp;
        (*id).pd = pd;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    let Some(o) = id_obj(id) else {
        return;
    };
    let qp = o.raw.qp;
    // SAFETY: the ID's QP, then its library-made CQs.
    unsafe {
        if !qp.is_null() {
            ibv_destroy_qp(qp);
            (*id).qp = null_mut();
        }
        destroy_cqs(id);
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
        CmError::AddressFamily => libc::EAFNOSUPPORT,
        CmError::Timeout | CmError::MpaTimeout => libc::ETIMEDOUT,
        CmError::Closed => libc::ECONNRESET,
        CmError::Io(k) => io::Error::from(*k).raw_os_error().unwrap_or(libc::EIO),
        _ => libc::ECONNABORTED,
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
    let qp = match req.accept_with_recvs(init, params, &recv_wrs(&early)) {
        Ok(qp) => q.finish_connect(qp),
        Err(e) => {
            q.fail_connect(early);
            return fail(cm_errno(&e));
        }
    };
    let n = qp.negotiated();
    let fd = match qp.event_fd().try_clone_to_owned() {
        Ok(fd) => fd,
        Err(e) => {
            qp.disconnect();
            q.set_state(IBV_QPS_ERR);
            return fail(e.raw_os_error().unwrap_or(libc::EMFILE));
        }
    };
    lock(&o.st).connected = true;
    let chan = o.chan();
    chan.push(event(
        id,
        null_mut(),
        RDMA_CM_EVENT_ESTABLISHED,
        0,
        Vec::new(),
        established_resources(&n),
    ));
    let watched = lock(watches()).add(id as usize, &chan, fd, What::Connected(Arc::downgrade(&qp)));
    if let Err((e, _)) = watched {
        qp.disconnect();
        q.set_state(IBV_QPS_ERR);
        return fail(e.raw_os_error().unwrap_or(libc::EMFILE));
    }
    complete(id, o)
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
    let mut params = match conn_params(param) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    {
        let st = lock(&o.st);
        if !st.connect_pdata.is_empty() {
            let mut p = st.connect_pdata.clone();
            p.extend_from_slice(&params.private_data);
            params.private_data = p;
        }
    }
    let Ok(g) = global() else {
        return fail(libc::ENODEV);
    };
    let Some((init, early)) = q.begin_connect() else {
        return fail(libc::EINVAL);
    };
    let chan = o.chan();
    let retry = (!g.cfg.connect_retry.is_zero()).then(|| {
        Box::new(Retry {
            dst,
            init: init.clone(),
            params: params.clone(),
            until: Instant::now() + g.cfg.connect_retry,
        })
    });
    let timeout = params.timeout;
    let mut started = g.dev.connect_start(dst, init, params, &recv_wrs(&early));
    // Refused on the spot (loopback): with IWARP_COMPAT_CONNECT_RETRY the
    // call itself waits and starts again.
    while let (Err(e), Some(rt)) = (&started, &retry) {
        match rt.again(e, &early) {
            Some(r) => started = r,
            None => break,
        }
    }
    let deadline = Instant::now() + timeout;
    match started {
        Ok(c) => {
            let fd = match c.event_fd().try_clone_to_owned() {
                Ok(fd) => fd,
                Err(e) => {
                    q.fail_connect(early);
                    return fail(e.raw_os_error().unwrap_or(libc::EMFILE));
                }
            };
            let what = What::Connect {
                c: Box::new(c),
                qp: (q as *const QpObj) as usize,
                early,
                deadline,
                retry,
            };
            let watched = lock(watches()).add(id as usize, &chan, fd, what);
            if let Err((e, what)) = watched {
                // Dropping the connect abandons it.
                if let What::Connect { early, .. } = what {
                    q.fail_connect(early);
                }
                return fail(e.raw_os_error().unwrap_or(libc::EMFILE));
            }
        }
        Err(e) => {
            // Refused on the spot: reported as an event all the same.
            q.fail_connect(early);
            chan.push(failure_event(id, &e));
        }
    }
    complete(id, o)
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
    // A synchronous ID waits for DISCONNECTED, once.
    if std::mem::replace(&mut lock(&o.st).disconnected, true) {
        return 0;
    }
    complete(id, o)
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
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    let Some(o) = id_obj(id) else {
        return fail(libc::EINVAL);
    };
    let (level, optname) = (level as u32, optname as u32);
    // The ID options are accepted: the type of service and the ACK
    // timeout have no counterpart on these connections and listeners
    // always reuse addresses; AFONLY decides whether a listener on an
    // IPv6 address takes IPv4 connections (`IdState::af_only`). Their
    // values are checked as the kernel checks them.
    let size = match (level, optname) {
        (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS | RDMA_OPTION_ID_ACK_TIMEOUT) => size_of::<u8>(),
        (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY) => size_of::<c_int>(),
        // InfiniBand path records mean nothing to an iWARP ID.
        (RDMA_OPTION_IB, _) => return fail(libc::EINVAL),
        _ => return fail(libc::ENOSYS),
    };
    if optval.is_null() || optlen != size {
        return fail(libc::EINVAL);
    }
    if (level, optname) == (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) {
        // SAFETY: an int, as checked above.
        lock(&o.st).af_only = unsafe { optval.cast::<c_int>().read_unaligned() } != 0;
    }
    0
}

/// Move `id` to the channel `(raw, new)`; the caller holds the table's
/// lock. Its watched descriptors go to the new channel's worker, its
/// undelivered events (and the connection requests queued for it, whose
/// new IDs share its channel) to the new channel's queue.
///
/// # Safety
/// `id` is a live ID.
unsafe fn move_id(
    g: &mut Watches,
    id: *mut rdma_cm_id,
    raw: *mut rdma_event_channel,
    new: &Arc<ChanShared>,
) {
    // SAFETY: the live ID.
    let o = unsafe { &*id.cast::<IdObj>() };
    let old = o.chan();
    if Arc::ptr_eq(&old, new) {
        return;
    }
    for t in g.of_id(id as usize) {
        let w = g.map.get(&t).expect("indexed");
        epoll_del(old.ep.as_raw_fd(), w.fd.as_raw_fd());
        // The same file again, with room in a new set: a failure would
        // leave it unwatched, which epoll_ctl does not do for ADD of a
        // descriptor just removed.
        let _ = epoll_add(new.ep.as_raw_fd(), w.fd.as_raw_fd(), t);
        g.rechan(t, new);
    }
    let evs = old.take(|e| (e.id == id && e.listen_id.is_null()) || e.listen_id == id);
    for &p in &evs {
        // SAFETY: taken from the queue, live.
        let e = unsafe { &(*(p as *const EventObj)).raw };
        if e.event == RDMA_CM_EVENT_CONNECT_REQUEST && e.listen_id == id {
            // SAFETY: the request's new ID, never handed out.
            let c = unsafe { &*e.id.cast::<IdObj>() };
            if Arc::ptr_eq(&c.chan(), &old) {
                // SAFETY: as above.
                unsafe { move_id(g, e.id, raw, new) };
            }
        }
    }
    new.put(evs);
    // The new worker learns the deadlines of connects it took over.
    signal(&new.ctl);
    old.ids.fetch_sub(1, Ordering::SeqCst);
    new.ids.fetch_add(1, Ordering::SeqCst);
    *lock(&o.chan) = new.clone();
    // SAFETY: the live ID; readers of `channel` in workers hold the
    // table's lock, as the caller does.
    unsafe { (*id).channel = raw };
}

#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    ch: *mut rdma_event_channel,
) -> c_int {
    let Some(o) = id_obj(id) else {
        return fail(libc::EINVAL);
    };
    let was_sync = o.sync.load(Ordering::SeqCst);
    if ch.is_null() && was_sync {
        return fail(libc::EINVAL);
    }
    let (own, raw, new) = if ch.is_null() {
        // Synchronous from now on, with a channel of its own.
        match Channel::new() {
            Ok(c) => {
                let (r, s) = (c.raw_ptr(), c.shared.clone());
                (Some(c), r, s)
            }
            Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EMFILE)),
        }
    } else {
        match obj::<_, Channel>(ch, Kind::EventChannel) {
            Some(c) => (None, ch, c.shared.clone()),
            None => return fail(libc::EINVAL),
        }
    };
    {
        let mut g = lock(watches());
        // SAFETY: the live ID.
        unsafe { move_id(&mut g, id, raw, &new) };
        o.sync.store(own.is_some(), Ordering::SeqCst);
    }
    if was_sync {
        // SAFETY: the live ID.
        unsafe { ack_kept(id) };
    }
    // The channel it had of its own is dropped (its worker joined) outside
    // the table's lock.
    let old_own = std::mem::replace(&mut *lock(&o.own), own);
    drop(old_own);
    // As librdmacm: the call returns once the events handed out for the
    // ID are acknowledged, so none of them is still being handled on the
    // old channel.
    o.wait_acked();
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    if id.is_null() || res.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's address information.
    let r = unsafe { &*res };
    if r.ai_qp_type != IBV_QPT_RC as c_int {
        return fail(libc::EOPNOTSUPP);
    }
    let mut cm = null_mut();
    // SAFETY: a synchronous ID.
    if unsafe {
        rdma_create_id(
            null_mut(),
            &mut cm,
            null_mut(),
            r.ai_port_space as rdma_port_space,
        )
    } != 0
    {
        return -1;
    }
    let ok = if r.ai_flags as u32 & RAI_PASSIVE != 0 {
        // SAFETY: the new ID and the caller's address.
        let bound = unsafe { rdma_bind_addr(cm, r.ai_src_addr) } == 0;
        if bound {
            let o = id_obj(cm).expect("created above");
            if !pd.is_null() {
                // SAFETY: the new ID, not yet handed out.
                unsafe { (*cm).pd = pd };
            }
            if !attr.is_null() {
                // SAFETY: the caller's attributes.
                let mut a = unsafe { *attr };
                a.qp_type = IBV_QPT_RC;
                lock(&o.st).qp_init = Some(a);
            }
        }
        bound
    } else {
        // SAFETY: the new ID, the caller's addresses and attributes.
        unsafe {
            rdma_resolve_addr(cm, r.ai_src_addr, r.ai_dst_addr, 2000) == 0
                && rdma_resolve_route(cm, 2000) == 0
                && (attr.is_null() || {
                    (*attr).qp_type = IBV_QPT_RC;
                    rdma_create_qp(cm, pd, attr) == 0
                })
        }
    };
    if !ok {
        let e = errno();
        // SAFETY: the new ID.
        unsafe { rdma_destroy_ep(cm) };
        return fail(e);
    }
    if r.ai_connect_len > 0 && !r.ai_connect.is_null() {
        let o = id_obj(cm).expect("created above");
        // SAFETY: `ai_connect_len` bytes at `ai_connect`.
        lock(&o.st).connect_pdata =
            unsafe { std::slice::from_raw_parts(r.ai_connect.cast::<u8>(), r.ai_connect_len) }
                .to_vec();
    }
    // SAFETY: the caller's out parameter.
    unsafe { *id = cm };
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    let Some(o) = id_obj(listen) else {
        return fail(libc::EINVAL);
    };
    if id.is_null() || !o.sync.load(Ordering::SeqCst) {
        return fail(libc::EINVAL);
    }
    // SAFETY: the live ID.
    unsafe { ack_kept(listen) };
    let p = match o.chan().wait(true) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    // SAFETY: a live event, now the application's.
    let e = unsafe { &(*(p as *const EventObj)).raw };
    let err = if e.event == RDMA_CM_EVENT_REJECTED {
        Some(libc::ECONNREFUSED)
    } else if e.status != 0 {
        Some(e.status.abs())
    } else if e.event != RDMA_CM_EVENT_CONNECT_REQUEST {
        Some(libc::EINVAL)
    } else {
        None
    };
    if let Some(err) = err {
        // SAFETY: the live ID keeps the event.
        unsafe { (*listen).event = p as *mut rdma_cm_event };
        return fail(err);
    }
    let child = e.id;
    let init = lock(&o.st).qp_init;
    if let Some(mut a) = init {
        // SAFETY: the request's new ID; a copy of the stored attributes.
        if unsafe { rdma_create_qp(child, o.raw.pd, &mut a) } != 0 {
            let err = errno();
            // SAFETY: the live ID keeps the event.
            unsafe { (*listen).event = p as *mut rdma_cm_event };
            return fail(err);
        }
    }
    // SAFETY: the caller's out parameter; the new ID keeps the event.
    unsafe {
        *id = child;
        (*child).event = p as *mut rdma_cm_event;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    if !is_live(id, Kind::CmId) {
        return;
    }
    // SAFETY: forwarded; the live ID.
    unsafe {
        rdma_destroy_qp(id);
        rdma_destroy_srq(id);
        rdma_destroy_id(id);
    }
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

/// The SRQ of `id` (`id->srq`), made with `ibv_create_srq` in `pd` or,
/// when it is NULL, the ID's PD. QPs the ID creates afterwards without an
/// SRQ of their own take it, as in librdmacm.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    let Some(o) = id_obj(id) else {
        return fail(libc::EINVAL);
    };
    if attr.is_null() || !o.raw.srq.is_null() {
        return fail(libc::EINVAL);
    }
    let pd = if pd.is_null() { o.raw.pd } else { pd };
    // SAFETY: forwarded with the caller's attributes; the PD is checked
    // there.
    let srq = unsafe { crate::srq::ibv_create_srq(pd, attr) };
    if srq.is_null() {
        return fail(errno());
    }
    // SAFETY: the live ID, used by this thread.
    unsafe { (*id).srq = srq };
    0
}

/// `rdma_create_srq` with extended attributes: basic SRQs only (XRC and
/// tag-matching ones fail with EOPNOTSUPP, as `ibv_create_srq_ex` does).
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    if !is_live(id, Kind::CmId) || attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    let known = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
    if a.comp_mask & !known != 0
        || (a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE != 0 && a.srq_type != IBV_SRQT_BASIC)
    {
        return fail(libc::EOPNOTSUPP);
    }
    let pd = if a.comp_mask & IBV_SRQ_INIT_ATTR_PD != 0 {
        a.pd
    } else {
        null_mut()
    };
    // SAFETY: `ibv_srq_init_attr` is the start of `ibv_srq_init_attr_ex`
    // (verbs.h's ibv_create_srq_ex makes the same cast).
    unsafe { rdma_create_srq(id, pd, attr.cast()) }
}

/// Destroy the ID's SRQ, if it has one.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    let Some(o) = id_obj(id) else {
        return;
    };
    let srq = o.raw.srq;
    if srq.is_null() {
        return;
    }
    // SAFETY: the ID's SRQ; the live ID, used by this thread.
    unsafe {
        crate::srq::ibv_destroy_srq(srq);
        (*id).srq = null_mut();
    }
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

/// The contexts IDs resolve to (the one device's), in a NULL-terminated
/// `malloc`ed array that `rdma_free_devices` frees; NULL with `ENODEV`
/// when the device cannot be opened.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    let ctx = the_context();
    if !num.is_null() {
        // SAFETY: the caller's out parameter.
        unsafe { *num = c_int::from(ctx.is_ok()) };
    }
    let ctx = match ctx {
        Ok(c) => c,
        Err(e) => {
            set_errno(e);
            return null_mut();
        }
    };
    // SAFETY: calloc of two slots: the context and the terminating NULL.
    let list = unsafe { libc::calloc(2, size_of::<*mut ibv_context>()) }.cast::<*mut ibv_context>();
    if list.is_null() {
        set_errno(libc::ENOMEM);
        return null_mut();
    }
    // SAFETY: the first of the two slots.
    unsafe { *list = ctx };
    list
}

#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: calloc'ed by rdma_get_devices (free of null does nothing).
    unsafe { libc::free(list.cast()) };
}

/// An iWARP connection needs no notice of the QP's first receive (the
/// kernel's rdma_notify acts on InfiniBand only): 0 once the ID has a
/// connection manager endpoint (a listener, a connection request, a
/// connection), EINVAL before, as the kernel answers.
#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: ibv_event_type) -> c_int {
    let Some(o) = id_obj(id) else {
        return fail(libc::EINVAL);
    };
    let st = lock(&o.st);
    if st.connected || st.listening || st.req.is_some() {
        0
    } else {
        fail(libc::EINVAL)
    }
}

// ---------------------------------------------------------- addrinfo

/// A `malloc`ed copy of the `len` bytes of the socket address `sa`
/// (`rdma_freeaddrinfo` frees it), or null when there is none or memory
/// ran out.
///
/// # Safety
/// `sa` is null or points to `len` readable bytes.
unsafe fn copy_sockaddr(sa: *const sockaddr, len: socklen_t) -> *mut sockaddr {
    if sa.is_null() || len == 0 {
        return null_mut();
    }
    // SAFETY: plain allocation, filled below.
    let p = unsafe { libc::malloc(len as usize) }.cast::<sockaddr>();
    if !p.is_null() {
        // SAFETY: `len` bytes at `sa` (the caller's) and at `p` (fresh).
        unsafe { std::ptr::copy_nonoverlapping(sa.cast::<u8>(), p.cast::<u8>(), len as usize) };
    }
    p
}

/// librdmacm's address translation: `node` and `service` through
/// getaddrinfo(3) in the hints' family (IPv4 and IPv6; on the AF_XDP
/// engine, which serves IPv4, an unspecified family means IPv4), the
/// first IPv4 address (else the first) becoming the source of a passive
/// result and the destination otherwise; with both NULL, the hints'
/// flags, family, QP type, port space and destination address. Either
/// way the hints' source address is taken where the result has none
/// (libfabric passes its endpoints' addresses that way).
#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's hints, if any.
    let h = unsafe { hints.as_ref() };
    let flags = h.map_or(0, |h| h.ai_flags as u32);
    let mut ai = Box::new(rdma_addrinfo {
        ai_flags: flags as c_int,
        ai_family: libc::AF_INET,
        ai_qp_type: IBV_QPT_RC as c_int,
        ai_port_space: RDMA_PS_TCP as c_int,
        ..Default::default()
    });
    if let Some(h) = h {
        if h.ai_qp_type != 0 {
            ai.ai_qp_type = h.ai_qp_type;
        }
        if h.ai_port_space != 0 {
            ai.ai_port_space = h.ai_port_space;
        }
    }
    if !node.is_null() || !service.is_null() {
        let family = match h.map_or(libc::AF_UNSPEC, |h| h.ai_family) {
            libc::AF_UNSPEC if global().is_ok_and(|g| g.cfg.local_ip().is_some()) => libc::AF_INET,
            f @ (libc::AF_UNSPEC | libc::AF_INET | libc::AF_INET6) => f,
            _ => return fail(libc::EAFNOSUPPORT),
        };
        // SAFETY: an all-zero addrinfo is valid hints.
        let mut ghints: libc::addrinfo = unsafe { std::mem::zeroed() };
        ghints.ai_family = family;
        ghints.ai_socktype = libc::SOCK_STREAM;
        if flags & RAI_PASSIVE != 0 {
            ghints.ai_flags |= libc::AI_PASSIVE;
        }
        if flags & RAI_NUMERICHOST != 0 {
            ghints.ai_flags |= libc::AI_NUMERICHOST;
        }
        let mut gres: *mut libc::addrinfo = null_mut();
        // SAFETY: C strings or null from the caller; `gres` receives a
        // list freed below.
        let r = unsafe { libc::getaddrinfo(node, service, &ghints, &mut gres) };
        if r != 0 || gres.is_null() {
            set_errno(libc::ENODEV);
            return r;
        }
        // The first IPv4 entry, else the first: a name with both
        // families (`localhost`, which libfabric binds its passive
        // endpoints to) resolves as it did before IPv6 was served.
        let mut pick = gres;
        let mut p = gres;
        while !p.is_null() {
            // SAFETY: an entry of the list getaddrinfo returned.
            let e = unsafe { &*p };
            if e.ai_family == libc::AF_INET {
                pick = p;
                break;
            }
            p = e.ai_next;
        }
        // SAFETY: an entry of the list getaddrinfo returned, its address
        // `ai_addrlen` bytes long.
        let (addr, len, family) =
            unsafe { ((*pick).ai_addr, (*pick).ai_addrlen, (*pick).ai_family) };
        ai.ai_family = family;
        // SAFETY: as above.
        let copy = unsafe { copy_sockaddr(addr.cast(), len) };
        // SAFETY: the list from getaddrinfo.
        unsafe { libc::freeaddrinfo(gres) };
        if copy.is_null() {
            return fail(libc::ENOMEM);
        }
        if flags & RAI_PASSIVE != 0 {
            ai.ai_src_addr = copy;
            ai.ai_src_len = len;
        } else {
            ai.ai_dst_addr = copy;
            ai.ai_dst_len = len;
        }
    } else if let Some(h) = h {
        ai.ai_family = h.ai_family;
        if h.ai_dst_len != 0 {
            // SAFETY: the hints' address of `ai_dst_len` bytes.
            ai.ai_dst_addr = unsafe { copy_sockaddr(h.ai_dst_addr, h.ai_dst_len) };
            if ai.ai_dst_addr.is_null() {
                return fail(libc::ENOMEM);
            }
            ai.ai_dst_len = h.ai_dst_len;
        }
    }
    if let Some(h) = h.filter(|h| h.ai_src_len != 0 && ai.ai_src_len == 0) {
        // SAFETY: the hints' address of `ai_src_len` bytes.
        ai.ai_src_addr = unsafe { copy_sockaddr(h.ai_src_addr, h.ai_src_len) };
        if ai.ai_src_addr.is_null() {
            // SAFETY: the result built here, its addresses malloc'ed.
            unsafe { rdma_freeaddrinfo(Box::into_raw(ai)) };
            return fail(libc::ENOMEM);
        }
        ai.ai_src_len = h.ai_src_len;
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
        // SAFETY: the addresses were malloc'ed by copy_sockaddr (free of
        // null does nothing).
        unsafe {
            libc::free(ai.ai_src_addr.cast());
            libc::free(ai.ai_dst_addr.cast());
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
    // SAFETY: the application's handle.
    if let Err(e) = unsafe { id_qp_attr(id, &mut a.send_cq, &mut a.recv_cq, &mut a.srq, &a.cap) } {
        return fail(e);
    }
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
