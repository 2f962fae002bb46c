//! The backend-neutral runtime of a device: what the application and the
//! progress threads share ([`Shared`]), the progress loop and its
//! sleeping, the device state behind the lock with its transport
//! ([`Engine`], [`Transport`]), the first stage of an accepted
//! connection ([`lifecycle`]) and the core's side of an established one
//! ([`established`]), and the queues between the engine and the
//! application — completions ([`CqQueue`]), connection requests
//! ([`ListenShared`]), connection-manager state ([`ConnShared`]) and
//! shared-receive-queue events ([`SrqEvents`]). The I/O of each backend
//! lives in [`crate::kernel`] (kernel sockets) and [`crate::xdp`]
//! (AF_XDP).

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crossbeam_queue::{ArrayQueue, SegQueue};

use iwarp::cq::{CqId, QpId, WorkCompletion};
use iwarp::mem::PdId;
use iwarp::mpa::handshake::{ConnectRequest, Handshake, HandshakeError, Negotiated};
use iwarp::qp::QpEvent;
use iwarp::srq::SrqEvent;
use iwarp::time::Instant as CoreInstant;
use iwarp::verbs::Context;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::cm::{CmError, CmEvent, QpAsyncEvent};
use crate::event::LazyEventFd;
use crate::post::Posted;
use crate::xdp::set::XdpRef;

mod engine;
pub(crate) mod established;
pub(crate) mod lifecycle;

pub(crate) use engine::{Engine, Transport};

/// The waker's token; sockets get tokens from 1 on.
const WAKER: Token = Token(0);
/// The AF_XDP sockets' tokens count down from here (the waker's token is
/// 0, kernel sockets count up from 1).
pub(crate) const XSK: Token = Token(usize::MAX);
/// The progress threads time one pass in this many
/// ([`XdpStats::io_ns`](crate::xdp::XdpStats::io_ns)).
const TIMED_EVERY: u64 = 64;
/// Upper bound of one sleep of a thread that drives a manual device.
const MANUAL_SLICE: Duration = Duration::from_millis(10);

/// Lock a mutex, ignoring poisoning (the protected state stays consistent:
/// no engine code panics while holding a lock on peer input).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The application-side queue of one completion queue: a bounded
/// lock-free queue (crossbeam's `ArrayQueue`) the engine pushes into and
/// the application pops from, so polling a CQ takes no lock at all. The
/// mutex and condition variable only serve blocking waits: a waiter
/// counts itself in `sleepers` before it looks at the queue, and the
/// engine, after pushing, wakes the condition variable (under the mutex)
/// only when someone counts as sleeping.
#[derive(Debug)]
pub(crate) struct CqQueue {
    pub(crate) q: ArrayQueue<WorkCompletion>,
    pub(crate) sleep: Mutex<()>,
    pub(crate) cv: Condvar,
    pub(crate) sleepers: AtomicUsize,
    /// The completion channel: one count per notification raised
    /// ([`CqQueue::notify`]); created by the first `Cq::event_fd` or
    /// `Cq::req_notify`.
    pub(crate) event: LazyEventFd,
    /// Set by the engine when the queue was full and the core CQ kept
    /// completions: the application's next poll kicks the engine.
    pub(crate) backlogged: AtomicBool,
}

impl CqQueue {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            q: ArrayQueue::new(capacity.max(1)),
            sleep: Mutex::new(()),
            cv: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            event: LazyEventFd::default(),
            backlogged: AtomicBool::new(false),
        }
    }

    /// The core CQ raised a notification (armed by `Cq::req_notify`, which
    /// created the eventfd): count it.
    pub(crate) fn notify(&self) {
        self.event.add();
    }

    /// Pop up to `out.len()` completions into `out`, oldest first.
    pub(crate) fn pop_into(&self, out: &mut [WorkCompletion]) -> usize {
        let mut n = 0;
        for slot in out.iter_mut() {
            let Some(wc) = self.q.pop() else { break };
            *slot = wc;
            n += 1;
        }
        n
    }

    /// After pushing: wake blocked waiters, if any.
    pub(crate) fn wake(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = lock(&self.sleep);
            self.cv.notify_all();
        }
    }
}

/// An object the application released (the last clone of its handle was
/// dropped): the engine frees it in the core on its next pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Released {
    Pd(PdId),
    Cq(CqId),
}

/// The asynchronous events of one shared receive queue, shared with the
/// application's `Srq`: the engine moves them out of the core each pass.
/// `event` counts the events queued in `m` (`Srq::event_fd`); it changes
/// only under `m`.
#[derive(Debug, Default)]
pub(crate) struct SrqEvents {
    pub(crate) m: Mutex<VecDeque<SrqEvent>>,
    pub(crate) cv: Condvar,
    pub(crate) event: LazyEventFd,
}

impl SrqEvents {
    /// Queue `ev` (the caller holds `m`, as `q`) and count it.
    pub(crate) fn push(&self, q: &mut VecDeque<SrqEvent>, ev: SrqEvent) {
        q.push_back(ev);
        self.event.add();
    }

    /// Take the oldest event and its count (the caller holds `m`).
    pub(crate) fn pop(&self, q: &mut VecDeque<SrqEvent>) -> Option<SrqEvent> {
        let ev = q.pop_front();
        if ev.is_some() {
            self.event.take();
        }
        ev
    }
}

/// Connection-manager state of one QP, shared with the application's `Qp`.
///
/// `event` counts the events queued in `m` (`Qp::event_fd`), `async_event`
/// the asynchronous events (`Qp::async_event_fd`), and `setup` becomes
/// readable once the connect's outcome is known (`Connecting::event_fd`);
/// all change only under `m`.
#[derive(Debug, Default)]
pub(crate) struct ConnShared {
    pub(crate) m: Mutex<ConnInfo>,
    pub(crate) cv: Condvar,
    pub(crate) event: LazyEventFd,
    /// One count each time `tcp` or `setup` is set.
    pub(crate) setup: LazyEventFd,
    pub(crate) async_event: LazyEventFd,
}

impl ConnShared {
    /// The state of a new connection; `on_srq`: its QP takes receives
    /// from a shared receive queue.
    pub(crate) fn new(on_srq: bool) -> Self {
        let s = Self::default();
        lock(&s.m).on_srq = on_srq;
        s
    }

    /// Queue `ev` (the caller holds `m`, as `info`) and count it, with the
    /// asynchronous events it raises ([`QpAsyncEvent`]).
    pub(crate) fn push(&self, info: &mut ConnInfo, ev: CmEvent) {
        let raised = match &ev {
            CmEvent::LocalTerminate(t) => Some(QpAsyncEvent::of_local_terminate(*t)),
            CmEvent::RemoteTerminate(_) | CmEvent::Error(_) | CmEvent::CqOverrun => {
                Some(QpAsyncEvent::Fatal)
            }
            CmEvent::Disconnected => None,
        };
        // Only the first error raises one, and none after an orderly
        // close (ours or the peer's).
        if let Some(a) = raised.filter(|_| !info.failed && !info.closed) {
            info.failed = true;
            self.push_async(info, a);
        }
        if matches!(ev, CmEvent::Disconnected) {
            info.closed = true;
        }
        // Every connection event ends RTS: the QP takes no more receives.
        if info.on_srq && !info.last_wqe {
            info.last_wqe = true;
            self.push_async(info, QpAsyncEvent::LastWqeReached);
        }
        info.events.push_back(ev);
        self.event.add();
    }

    fn push_async(&self, info: &mut ConnInfo, ev: QpAsyncEvent) {
        info.async_events.push_back(ev);
        self.async_event.add();
    }

    /// The application closes the connection: errors met while it closes
    /// raise no asynchronous event (the caller holds `m`, as `info`).
    pub(crate) fn closing(&self, info: &mut ConnInfo) {
        info.closed = true;
    }

    /// Take the oldest asynchronous event and its count (the caller holds
    /// `m`).
    pub(crate) fn pop_async(&self, info: &mut ConnInfo) -> Option<QpAsyncEvent> {
        let ev = info.async_events.pop_front();
        if ev.is_some() {
            self.async_event.take();
        }
        ev
    }

    /// Report the outcome of an AF_XDP TCP connect (unless one is there)
    /// and wake its waiter.
    pub(crate) fn set_tcp(&self, r: Result<usize, CmError>) {
        let mut i = lock(&self.m);
        if i.tcp.is_none() {
            i.tcp = Some(r);
            self.setup.add();
        }
        drop(i);
        self.cv.notify_all();
    }

    /// Take the oldest event and its count (the caller holds `m`).
    pub(crate) fn pop(&self, info: &mut ConnInfo) -> Option<CmEvent> {
        let ev = info.events.pop_front();
        if ev.is_some() {
            self.event.take();
        }
        ev
    }
}

/// See [`ConnShared`].
#[derive(Debug, Default)]
pub(crate) struct ConnInfo {
    /// `None` while the MPA exchange runs.
    pub(crate) setup: Option<Result<(), CmError>>,
    pub(crate) negotiated: Option<Negotiated>,
    pub(crate) peer_private_data: Vec<u8>,
    pub(crate) events: VecDeque<CmEvent>,
    /// AF_XDP: the outcome of the TCP connect (the effective MSS).
    pub(crate) tcp: Option<Result<usize, CmError>>,
    /// Asynchronous events ([`ConnShared::push`]).
    pub(crate) async_events: VecDeque<QpAsyncEvent>,
    /// The QP takes receives from a shared receive queue.
    pub(crate) on_srq: bool,
    /// An error raised its asynchronous event.
    pub(crate) failed: bool,
    /// The connection closed in order, or the application closes it.
    pub(crate) closed: bool,
    /// `QpAsyncEvent::LastWqeReached` was raised.
    pub(crate) last_wqe: bool,
}

/// The transport of a connection: a kernel socket or a connection of the
/// AF_XDP engine's user-space TCP.
#[derive(Debug)]
pub(crate) enum Sock {
    Kernel(TcpStream),
    /// (engine index, connection).
    Xdp(usize, iwarp_tcp::ConnId),
}

/// A TCP connection whose MPA request has arrived, waiting for the
/// application's decision (the socket is no longer polled).
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) sock: Sock,
    pub(crate) peer: SocketAddr,
    pub(crate) local: SocketAddr,
    pub(crate) emss: usize,
    /// The standalone responder that parsed the request (used to reject).
    pub(crate) hs: Handshake,
    pub(crate) request: ConnectRequest,
    /// The request frame exactly as received.
    pub(crate) frame: Vec<u8>,
    /// Bytes received after the frame.
    pub(crate) rest: Vec<u8>,
}

/// Connection requests of one listener, shared with the application's
/// `Listener`.
/// Connection requests of one listener, from the engine to the
/// application: an unbounded lock-free queue (crossbeam's `SegQueue`);
/// the mutex and condition variable only serve blocking waits, with the
/// sleeper count of [`CqQueue`].
///
/// `event` counts the queued requests (`Listener::event_fd`): it is
/// created, added to and taken from under `sleep`, as requests are
/// pushed ([`ListenShared::push`]) and popped ([`ListenShared::pop`]).
#[derive(Debug, Default)]
pub(crate) struct ListenShared {
    pub(crate) q: SegQueue<Request>,
    pub(crate) sleep: Mutex<()>,
    pub(crate) cv: Condvar,
    pub(crate) sleepers: AtomicUsize,
    pub(crate) event: LazyEventFd,
}

impl ListenShared {
    /// Queue a request, count it on the eventfd and wake a blocked
    /// `get_request`, if any.
    pub(crate) fn push(&self, req: Request) {
        let _g = lock(&self.sleep);
        self.q.push(req);
        self.event.add();
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.cv.notify_all();
        }
    }

    /// Take the oldest request, and its count on the eventfd; the caller
    /// holds `sleep`.
    pub(crate) fn pop(&self) -> Option<Request> {
        let r = self.q.pop();
        if r.is_some() {
            self.event.take();
        }
        r
    }

    /// Take every queued request.
    pub(crate) fn drain(&self) -> Vec<Request> {
        std::iter::from_fn(|| self.q.pop()).collect()
    }
}

pub(crate) fn push_event(shared: &ConnShared, ev: CmEvent) {
    shared.push(&mut lock(&shared.m), ev);
    shared.cv.notify_all();
}

/// Turn the QP's events into connection-manager state.
pub(crate) fn drain_events(ctx: &mut Context, qp: QpId, shared: &ConnShared) -> usize {
    let mut n = 0;
    while let Some(ev) = ctx.poll_event(qp) {
        n += 1;
        let mut info = lock(&shared.m);
        let known = info.setup.is_some();
        match ev {
            QpEvent::ConnectRequest(_) => {}
            QpEvent::Established {
                negotiated,
                private_data,
            } => {
                info.negotiated = Some(negotiated);
                info.peer_private_data = private_data;
                info.setup = Some(Ok(()));
            }
            QpEvent::Rejected { private_data } => {
                info.setup = Some(Err(CmError::Rejected { private_data }));
            }
            QpEvent::ConnectFailed(e) => {
                info.setup = Some(Err(match e {
                    HandshakeError::Timeout => CmError::MpaTimeout,
                    e => CmError::Mpa(e),
                }));
            }
            QpEvent::Disconnected => {
                if info.setup.is_none() {
                    info.setup = Some(Err(CmError::Closed));
                } else {
                    shared.push(&mut info, CmEvent::Disconnected);
                }
            }
            QpEvent::LocalTerminate(t) => shared.push(&mut info, CmEvent::LocalTerminate(t)),
            QpEvent::RemoteTerminate(t) => shared.push(&mut info, CmEvent::RemoteTerminate(t)),
            QpEvent::CqOverrun => shared.push(&mut info, CmEvent::CqOverrun),
        }
        if !known && info.setup.is_some() {
            shared.setup.add();
        }
        drop(info);
        shared.cv.notify_all();
    }
    n
}

/// What the application and the progress thread share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) engine: Mutex<Engine>,
    /// The poller, while no progress thread owns it (manual progress).
    poll: Mutex<Option<(Poll, Events)>>,
    waker: Waker,
    /// A progress thread runs the engine.
    pub(crate) threaded: bool,
    busy_poll: bool,
    /// Work was submitted since the progress thread's last pass.
    dirty: AtomicBool,
    /// The progress thread is (about to be) asleep in the poller.
    sleeping: AtomicBool,
    stop: AtomicBool,
    /// Application threads waiting for the engine lock (a busy-polling
    /// progress thread steps aside for them).
    waiters: AtomicUsize,
    /// The engine's clock origin.
    epoch: std::time::Instant,
    /// Multi-core AF_XDP: how the progress threads of engines 1.. sleep.
    sleepers: std::sync::OnceLock<Vec<Arc<Sleeper>>>,
    /// QPs with work requests queued by application threads
    /// ([`crate::post`]); the engine's own handle on the list is
    /// [`Engine::posted`].
    pub(crate) posted: Arc<Posted>,
    /// The device's span ([`crate::log::device_span`]).
    pub(crate) span: tracing::Span,
}

/// Sleep in `poll` for at most `timeout` with the AF_XDP sockets `fds` in
/// its epoll set for that time only.
///
/// A socket in an epoll set keeps an entry in its wait queue, and every
/// frame the kernel puts on its rx ring walks that queue
/// (`sk_data_ready`, then `ep_poll_callback` under two irq-saving locks)
/// whether or not a thread sleeps. On veth the receive runs in the
/// sending core's softirq, so a permanently registered socket slowed the
/// *peer's* bulk sender: about 0.4 of the 5 µs it spent per frame in a
/// 64 KiB RDMA Write bandwidth run (`perf record` of `iwarp-bw`). Adding a socket reports it
/// readable at once if frames arrived since the last pass (epoll checks
/// readiness when a file is added), so none is slept through.
fn sleep_armed(
    poll: &mut Poll,
    events: &mut Events,
    timeout: Option<Duration>,
    fds: &[(Token, i32)],
) -> Woke {
    let registry = poll.registry();
    let mut armed = 0;
    for &(token, fd) in fds {
        if registry
            .register(&mut mio::unix::SourceFd(&fd), token, Interest::READABLE)
            .is_err()
        {
            break;
        }
        armed += 1;
    }
    // A socket that could not be added cannot wake us: poll once, then
    // let the caller's next pass look at it.
    let (timeout, woke) = if armed < fds.len() {
        (Some(Duration::ZERO), Woke::Unarmed)
    } else {
        (timeout, Woke::Timeout)
    };
    let woke = match poll.poll(events, timeout) {
        Ok(()) if !events.is_empty() => Woke::Ready,
        _ => woke,
    };
    for &(_, fd) in &fds[..armed] {
        let _ = poll.registry().deregister(&mut mio::unix::SourceFd(&fd));
    }
    woke
}

/// Why [`sleep_armed`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Woke {
    /// A source in the poller is ready (a socket, the waker): `events`
    /// lists them.
    Ready,
    /// The timeout passed (or a signal interrupted the sleep) with
    /// nothing ready.
    Timeout,
    /// A socket could not be added: the poller was only looked at, not
    /// slept in.
    Unarmed,
}

/// How the progress thread of an AF_XDP engine other than the first
/// sleeps: its own poller (its socket and a waker).
#[derive(Debug)]
pub(crate) struct Sleeper {
    waker: Waker,
    sleeping: AtomicBool,
    dirty: AtomicBool,
}

impl Sleeper {
    /// A poller woken by [`Shared::kick`] and, while the thread sleeps,
    /// by its engine's AF_XDP socket ([`sleep_armed`]).
    pub(crate) fn new() -> io::Result<(Arc<Self>, Poll)> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let s = Arc::new(Self {
            waker,
            sleeping: AtomicBool::new(false),
            dirty: AtomicBool::new(false),
        });
        Ok((s, poll))
    }
}

impl Shared {
    pub(crate) fn new(seed: u64, threaded: bool, busy_poll: bool) -> io::Result<Self> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let registry = poll.registry().try_clone()?;
        let engine = Engine::new(seed, registry);
        let (epoch, posted) = (engine.epoch, engine.posted.clone());
        Ok(Self {
            engine: Mutex::new(engine),
            epoch,
            poll: Mutex::new(Some((poll, Events::with_capacity(256)))),
            waker,
            threaded,
            busy_poll,
            dirty: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            waiters: AtomicUsize::new(0),
            sleepers: std::sync::OnceLock::new(),
            posted,
            span: tracing::Span::none(),
        })
    }

    pub(crate) fn engine(&self) -> MutexGuard<'_, Engine> {
        if let Ok(g) = self.engine.try_lock() {
            return g;
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let g = lock(&self.engine);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        g
    }

    /// Busy-poll with the AF_XDP backend: spin instead of sleeping.
    pub(crate) fn set_busy_poll(&mut self, on: bool) {
        self.busy_poll = on;
    }

    /// New work for the engine: wake the progress thread if it sleeps.
    pub(crate) fn kick(&self) {
        self.dirty.store(true, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            let _ = self.waker.wake();
        }
        for s in self.sleepers.get().map_or(&[][..], Vec::as_slice) {
            s.dirty.store(true, Ordering::SeqCst);
            if s.sleeping.load(Ordering::SeqCst) {
                let _ = s.waker.wake();
            }
        }
    }

    /// Set the sleepers of engines 1.. (once, before their threads run).
    pub(crate) fn set_sleepers(&self, s: Vec<Arc<Sleeper>>) {
        let _ = self.sleepers.set(s);
    }

    /// One pass of a progress thread. Kernel backend: [`Engine::pass`].
    /// AF_XDP: the pass of engine `x` alone, its I/O steps (rx burst and
    /// smoltcp ingress; smoltcp egress and tx burst) under the engine's
    /// own lock, only the steps that touch the core's context under the
    /// device lock; wakes the other engines' threads if it forwarded
    /// frames to them.
    fn pass_engine(&self, x: Option<&XdpRef>) -> usize {
        let Some(x) = x else {
            return self.progress();
        };
        let now = self.now();
        // One pass in `TIMED_EVERY` has its steps timed (and counted that
        // many times): the others read the clock once.
        let clock = |on: bool| on.then(std::time::Instant::now);
        let (mut work, timed, t0, t1) = {
            let mut g = lock(x);
            let timed = g.passes.is_multiple_of(TIMED_EVERY);
            let t0 = clock(timed);
            let work = g.io_in(now);
            (work, timed, t0, clock(timed))
        };
        let t2;
        {
            let mut e = self.engine();
            t2 = clock(timed);
            work += e.drain_posted();
            e.passes += 1;
            let e = &mut *e;
            if let Transport::Xdp(set) = &mut e.io {
                work += set.drive(&mut e.ctx, x, now);
            }
            work += e.move_completions();
        }
        let t3 = clock(timed);
        let mut g = lock(x);
        work += g.io_out(now);
        let forwarded = g.take_forwarded();
        if let (Some(t0), Some(t1), Some(t2), Some(t3)) = (t0, t1, t2, t3) {
            let ns = |d: Duration| {
                u64::try_from(d.as_nanos())
                    .unwrap_or(u64::MAX)
                    .saturating_mul(TIMED_EVERY)
            };
            g.timing.0 += ns(t1 - t0) + ns(t3.elapsed());
            g.timing.1 += ns(t2 - t1);
            g.timing.2 += ns(t3 - t2);
        }
        drop(g);
        if forwarded {
            self.kick();
        }
        work
    }

    /// The core's clock (as [`Engine::now`], without its lock).
    fn now(&self) -> CoreInstant {
        let us = self.epoch.elapsed().as_micros();
        CoreInstant::from_micros(u64::try_from(us).unwrap_or(u64::MAX))
    }

    /// The progress thread of AF_XDP engine `k` ≥ 1.
    pub(crate) fn run_engine(&self, k: usize, x: XdpRef, mut poll: Poll, sleeper: &Sleeper) {
        let mut events = Events::with_capacity(16);
        while !self.stop.load(Ordering::SeqCst) {
            sleeper.dirty.store(false, Ordering::SeqCst);
            let work = self.pass_engine(Some(&x));
            self.step_aside();
            if work > 0 {
                continue;
            }
            if self.busy_poll {
                std::hint::spin_loop();
                continue;
            }
            sleeper.sleeping.store(true, Ordering::SeqCst);
            if !sleeper.dirty.load(Ordering::SeqCst) && !self.stop.load(Ordering::SeqCst) {
                let (timeout, fds) = self.engine().sleep_plan(Some(k), None);
                sleep_armed(&mut poll, &mut events, timeout, &fds);
            }
            sleeper.sleeping.store(false, Ordering::SeqCst);
        }
    }

    /// One progress pass.
    pub(crate) fn progress(&self) -> usize {
        let mut e = self.engine();
        // Manual progress of the kernel backend: the sockets that became
        // ready (a thread asleep in the poller hands over what it saw
        // when it wakes).
        let kernel = matches!(e.io, Transport::Kernel(_));
        if let Some(mut g) = self.poll.try_lock().ok().filter(|_| kernel) {
            if let Some((poll, events)) = g.as_mut() {
                let _ = poll.poll(events, Some(Duration::ZERO));
                e.readiness(events);
            }
        }
        e.pass()
    }

    /// Let application threads waiting for the engine lock take it before
    /// the next pass (an unlock followed by an immediate lock would
    /// otherwise starve them).
    fn step_aside(&self) {
        for _ in 0..20_000 {
            if self.waiters.load(Ordering::Relaxed) == 0 {
                return;
            }
            std::hint::spin_loop();
        }
        std::thread::yield_now();
    }

    /// Ask the progress thread to stop.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.sleeping.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        for s in self.sleepers.get().map_or(&[][..], Vec::as_slice) {
            let _ = s.waker.wake();
        }
    }

    /// The progress thread's loop (of AF_XDP engine 0 `x`, if given).
    pub(crate) fn run(&self, x: Option<XdpRef>) {
        let Some((mut poll, mut events)) = lock(&self.poll).take() else {
            return;
        };
        let kernel = x.is_none() && matches!(self.engine().io, Transport::Kernel(_));
        while !self.stop.load(Ordering::SeqCst) {
            self.dirty.store(false, Ordering::SeqCst);
            // `x`: engine 0 of a multi-core AF_XDP device; otherwise the
            // whole pass under the device lock (kernel backend, one
            // AF_XDP engine). The kernel backend first learns which
            // sockets became ready, without waiting.
            let work = if kernel {
                let _ = poll.poll(&mut events, Some(Duration::ZERO));
                let mut e = self.engine();
                e.readiness(&events);
                e.pass()
            } else {
                self.pass_engine(x.as_ref())
            };
            self.step_aside();
            if work > 0 {
                continue;
            }
            if self.busy_poll {
                std::hint::spin_loop();
                continue;
            }
            self.sleeping.store(true, Ordering::SeqCst);
            if !self.dirty.load(Ordering::SeqCst) && !self.stop.load(Ordering::SeqCst) {
                let (timeout, fds) = self.engine().sleep_plan(Some(0), None);
                sleep_armed(&mut poll, &mut events, timeout, &fds);
                if kernel {
                    self.engine().readiness(&events);
                }
            }
            self.sleeping.store(false, Ordering::SeqCst);
        }
        *lock(&self.poll) = Some((poll, events));
    }

    /// Manual progress: sleep until a socket is ready, a timer is due, or
    /// at most `max` (and at most a short slice, so that conditions
    /// another thread creates are seen).
    fn idle_wait(&self, max: Duration) {
        let cap = max.min(MANUAL_SLICE);
        let (timeout, fds) = self.engine().sleep_plan(None, Some(cap));
        let timeout = timeout.unwrap_or(cap);
        match self.poll.try_lock() {
            Ok(mut g) => match g.as_mut() {
                Some((poll, events)) => {
                    sleep_armed(poll, events, Some(timeout), &fds);
                    self.engine().readiness(events);
                }
                None => std::thread::sleep(timeout),
            },
            // Another thread sleeps in the poller and drives the engine.
            Err(_) => std::thread::sleep(timeout.min(Duration::from_millis(1))),
        }
    }

    /// Block until `f` yields a value or `deadline` passes. With a
    /// progress thread this waits on `cv` (no spinning); a manual device
    /// is driven by the waiting thread itself, which sleeps in the poller
    /// between passes.
    pub(crate) fn wait_for<T, R>(
        &self,
        m: &Mutex<T>,
        cv: &Condvar,
        deadline: Option<std::time::Instant>,
        mut f: impl FnMut(&mut T) -> Option<R>,
    ) -> Option<R> {
        if self.threaded {
            let mut g = lock(m);
            loop {
                if let Some(r) = f(&mut g) {
                    return Some(r);
                }
                match deadline {
                    None => g = cv.wait(g).unwrap_or_else(|e| e.into_inner()),
                    Some(d) => {
                        let left = d.saturating_duration_since(std::time::Instant::now());
                        if left.is_zero() {
                            return None;
                        }
                        g = cv
                            .wait_timeout(g, left)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
            }
        }
        loop {
            self.progress();
            if let Some(r) = f(&mut lock(m)) {
                return Some(r);
            }
            let left = match deadline {
                None => MANUAL_SLICE,
                Some(d) => d.saturating_duration_since(std::time::Instant::now()),
            };
            if left.is_zero() {
                return None;
            }
            self.idle_wait(left);
        }
    }
}

#[cfg(test)]
impl Shared {
    /// The kernel backend's pass of a thread that holds the device lock
    /// as `e`: learn which sockets became ready (waiting up to `wait` for
    /// one), then [`Engine::pass`].
    pub(crate) fn pass_when_ready(&self, e: &mut Engine, wait: Duration) -> usize {
        if let Some((poll, events)) = lock(&self.poll).as_mut() {
            let _ = poll.poll(events, Some(wait));
            e.readiness(events);
        }
        e.pass()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixDatagram;

    /// The bound of a wait for something that happens at once: it only
    /// turns a regression into a failure instead of a hang.
    const WAIT_BOUND: Duration = Duration::from_secs(30);

    fn tokens(events: &Events) -> Vec<Token> {
        events.iter().map(|e| e.token()).collect()
    }

    /// Nothing ready: the sleep ends at its timeout, no event. A socket
    /// readable before the sleep wakes it (epoll looks at readiness when
    /// the socket is added), and it leaves the epoll set afterwards:
    /// adding it again succeeds.
    #[test]
    fn sleep_armed_sees_earlier_readiness_and_disarms() {
        let mut poll = Poll::new().unwrap();
        let mut events = Events::with_capacity(4);
        let (a, b) = UnixDatagram::pair().unwrap();
        let fds = [(XSK, b.as_raw_fd())];

        let woke = sleep_armed(&mut poll, &mut events, Some(Duration::ZERO), &fds);
        assert_eq!(woke, Woke::Timeout);
        assert!(events.is_empty());

        a.send(b"frame").unwrap();
        // Sleeping through the frame would end at the timeout instead.
        let woke = sleep_armed(&mut poll, &mut events, Some(WAIT_BOUND), &fds);
        assert_eq!(woke, Woke::Ready, "slept through");
        assert_eq!(tokens(&events), [XSK]);

        // Not registered any more: a second registration is accepted.
        let fd = b.as_raw_fd();
        poll.registry()
            .register(&mut mio::unix::SourceFd(&fd), XSK, Interest::READABLE)
            .expect("the socket left the epoll set after the sleep");
    }

    /// A kick (the waker) ends a sleep without a timeout, with the
    /// sockets armed.
    #[test]
    fn sleep_armed_is_woken_by_a_kick() {
        let mut poll = Poll::new().unwrap();
        let mut events = Events::with_capacity(4);
        let waker = Arc::new(Waker::new(poll.registry(), WAKER).unwrap());
        let (_a, b) = UnixDatagram::pair().unwrap();
        let fds = [(XSK, b.as_raw_fd())];
        let kicker = {
            let waker = waker.clone();
            std::thread::spawn(move || waker.wake().unwrap())
        };
        let woke = sleep_armed(&mut poll, &mut events, None, &fds);
        kicker.join().unwrap();
        assert_eq!(woke, Woke::Ready);
        assert_eq!(tokens(&events), [WAKER]);
    }

    /// A socket that cannot be added (a closed descriptor) turns the
    /// sleep into a look at the poller: even a sleep without a timeout
    /// returns, as unarmed. (The sleep runs on a thread of its own so
    /// that a regression shows as a failure, not a hung test.)
    #[test]
    fn sleep_armed_does_not_block_on_a_socket_it_cannot_add() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut poll = Poll::new().unwrap();
            let mut events = Events::with_capacity(4);
            let woke = sleep_armed(&mut poll, &mut events, None, &[(XSK, -1)]);
            let _ = tx.send((woke, events.is_empty()));
        });
        assert_eq!(rx.recv_timeout(WAIT_BOUND), Ok((Woke::Unarmed, true)));
    }
}
