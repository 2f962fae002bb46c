//! The backend-agnostic front: devices, protection domains, completion
//! queues, memory regions and queue pairs.

use std::alloc::Layout;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iwarp::cq::{CqId, QpId, WorkCompletion};
use iwarp::mem::{Access, MrInfo, PdId};
use iwarp::mpa::handshake::Negotiated;
use iwarp::qp::{PostError, QpConfig, QpEvent, QpState, RecvWr, SendWr, Sge};
use iwarp::srq::{SrqEvent, SrqId};
use iwarp::verbs::{Context, HandleCounts, VerbsError};
use mio::net::TcpStream;

use crate::cm::{CmError, CmEvent, ConnParams, ListenOptions, Listener, QpAsyncEvent};
use crate::event::{poll_until, wait_for as wait_fd, Epoll, EventFd};
use crate::kernel::{self, emss_of};
use crate::log::{conn_event, conn_span, device_span};
use crate::post::WorkQueues;
use crate::runtime::{
    lock, ConnShared, CqQueue, Released, Request, Shared, Sleeper, Sock, SrqEvents,
};
use crate::xdp::set::XdpRef;
use crate::xdp::worker::XdpIo;
use crate::xdp::{EngineStats, XdpConfig, XdpStats};

/// Which I/O backend runs the protocol core.
// Built once per `Device::open`: its size does not matter, and boxing the
// configuration would change the application API.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Kernel TCP sockets (`std::net`), polled with epoll.
    Kernel,
    /// AF_XDP on one interface queue with the user-space TCP (smoltcp)
    /// and the steering XDP program. Needs root (CAP_NET_ADMIN, CAP_BPF,
    /// CAP_IPC_LOCK); opened in the calling thread's network namespace.
    AfXdp(XdpConfig),
    /// One end of an in-process link ([`crate::xdp::link`]): the AF_XDP
    /// engine (smoltcp, the same rings and frame pool) with the kernel
    /// and the wire taken out, its frames lent to the engine on the other
    /// end in the same process. Needs no privilege; measures the stack's
    /// own cost per frame and per byte.
    Link(crate::xdp::LinkEnd),
}

/// Counters of a device, readable while it runs ([`Device::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Passes of the progress engine run so far (monotonic).
    pub passes: u64,
    /// Connections driven by the protocol core.
    pub connections: usize,
    /// Visits so far of connections outside the protocol core's hands:
    /// accepted ones whose MPA request is still arriving, outgoing TCP
    /// connects (AF_XDP), sockets closing after a reject reply or a
    /// Terminate, connections the application dropped that are still
    /// closing. A pass visits only those with something to do (ready,
    /// or past a deadline), so idle ones add nothing.
    pub lifecycle_visits: u64,
    /// The user-space TCP's counters (AF_XDP backend).
    pub tcp: Option<iwarp_tcp::Counters>,
    /// Rings, steering program and kernel socket counters (AF_XDP
    /// backend; of the first engine).
    pub xdp: Option<XdpStats>,
    /// AF_XDP backend: each engine's counters (one per receive queue).
    pub engines: Vec<EngineStats>,
    /// Objects alive in the core: PDs, CQs, QPs (including those still
    /// closing after the application dropped them) and memory regions.
    pub live: HandleCounts,
    /// Slots of the core's tables: the most objects alive at once (freed
    /// slots are reused).
    pub slots: HandleCounts,
}

/// Who runs the progress engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// A progress thread owned by the device, pinned to `cpu` if given.
    Thread {
        /// The CPU (as numbered by the kernel) to pin the thread to;
        /// `None`: not pinned.
        cpu: Option<usize>,
    },
    /// The application calls [`Device::progress`]. Blocking calls
    /// (connect, accept, [`Cq::wait`], ...) drive the engine themselves
    /// while they wait.
    Manual,
}

/// How to open a device, beside its [`Backend`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Who runs the progress engine: a thread of the device, or the
    /// application.
    pub progress: Progress,
    /// STag key seed (`None`: drawn from the OS's randomness).
    pub seed: Option<u64>,
    /// The progress thread spins instead of sleeping in poll(2).
    pub busy_poll: bool,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            progress: Progress::Thread { cpu: None },
            seed: None,
            busy_poll: false,
        }
    }
}

#[derive(Debug)]
struct DeviceInner {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        let _entered = self.shared.span.enter();
        self.shared.stop();
        for t in lock(&self.threads).drain(..) {
            let _ = t.join();
        }
        self.shared.engine().shutdown();
        tracing::info!(parent: &self.shared.span, "device closed");
    }
}

/// An RDMA device: one verbs context and its progress engine. Cloning
/// gives another handle to the same device; dropping the last handle
/// stops the progress thread (joins it) and closes every connection.
#[derive(Clone, Debug)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

impl Device {
    /// Open a device on `backend` and, with [`Progress::Thread`], start its
    /// progress thread(s).
    ///
    /// Errors: the [`io::Error`] of the step that failed: creating the
    /// epoll instance and its waker, or, for AF_XDP, reading the
    /// interface's MAC address, attaching the steering program, creating
    /// a UMEM and its AF_XDP socket, or opening a capture file.
    pub fn open(backend: Backend, cfg: DeviceConfig) -> io::Result<Self> {
        let seed = cfg.seed.unwrap_or_else(|| {
            let mut h = RandomState::new().build_hasher();
            h.write_u64(0x1a2b_3c4d);
            h.finish()
        });
        let threaded = matches!(cfg.progress, Progress::Thread { .. });
        let backend_name = match &backend {
            Backend::Kernel => "kernel",
            Backend::AfXdp(_) => "af_xdp",
            Backend::Link(_) => "link",
        };
        let span = device_span(backend_name);
        let _entered = span.enter();
        let mut shared = Shared::new(seed, threaded, cfg.busy_poll)?;
        shared.span = span.clone();
        // Engines 1.. of a multi-core AF_XDP device and the cores their
        // threads are pinned to.
        let mut extra: Vec<(XdpRef, Option<usize>)> = Vec::new();
        // Engine 0 of a multi-core device (a single engine runs its whole
        // pass under the device lock, as the kernel backend).
        let mut first: Option<XdpRef> = None;
        let mut cpu0 = match cfg.progress {
            Progress::Thread { cpu } => cpu,
            Progress::Manual => None,
        };
        let xdp = match &backend {
            Backend::Kernel => None,
            Backend::AfXdp(xcfg) => Some((xcfg, None)),
            Backend::Link(end) => Some((end.config(), Some(end))),
        };
        if let Some((xcfg, link)) = xdp {
            let mut e = shared.engine();
            let now = e.now();
            let opened = match link {
                Some(end) => vec![XdpIo::open_link(end, now, seed)?],
                None => XdpIo::open_all(xcfg, now, seed)?,
            };
            let engines: Vec<XdpRef> = opened
                .into_iter()
                .map(|x| Arc::new(Mutex::new(x)))
                .collect();
            extra = engines
                .iter()
                .enumerate()
                .skip(1)
                .map(|(k, x)| (x.clone(), xcfg.cpus.get(k).copied()))
                .collect();
            if engines.len() > 1 {
                first = engines.first().cloned();
            }
            e.set_xdp(engines);
            drop(e);
            if xcfg.busy_poll {
                shared.set_busy_poll(true);
            }
            if let Some(&c) = xcfg.cpus.first() {
                cpu0 = Some(c);
            }
        }
        let shared = Arc::new(shared);
        // Dropping the device on an error path stops the threads started.
        let dev = Self {
            inner: Arc::new(DeviceInner {
                shared: shared.clone(),
                threads: Mutex::new(Vec::new()),
            }),
        };
        tracing::info!(
            backend = backend_name,
            progress = ?cfg.progress,
            busy_poll = cfg.busy_poll,
            engines = extra.len() + 1,
            "device opened"
        );
        if !threaded {
            return Ok(dev);
        }
        let mut sleepers = Vec::new();
        let mut polls = Vec::new();
        for _ in &extra {
            let (s, p) = Sleeper::new()?;
            sleepers.push(s);
            polls.push(p);
        }
        shared.set_sleepers(sleepers.clone());
        let s = shared.clone();
        let t = std::thread::Builder::new()
            .name("iwarp-progress".into())
            .spawn(move || {
                if let Some(cpu) = cpu0 {
                    pin(cpu);
                }
                let _entered = s.span.enter();
                tracing::info!(engine = 0, cpu = ?cpu0, "progress thread started");
                s.run(first);
                tracing::info!(engine = 0, "progress thread stopped");
            })?;
        lock(&dev.inner.threads).push(t);
        for (k, ((x, cpu), (sleeper, poll))) in extra
            .into_iter()
            .zip(sleepers.into_iter().zip(polls))
            .enumerate()
        {
            let s = shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("iwarp-progress-{}", k + 1))
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        pin(cpu);
                    }
                    let _entered = s.span.enter();
                    tracing::info!(engine = k + 1, cpu = ?cpu, "progress thread started");
                    s.run_engine(k + 1, x, poll, &sleeper);
                    tracing::info!(engine = k + 1, "progress thread stopped");
                })?;
            lock(&dev.inner.threads).push(t);
        }
        Ok(dev)
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    /// One pass of the engine; returns the work done (0: nothing moved).
    /// Needed in [`Progress::Manual`] mode; harmless otherwise.
    pub fn progress(&self) -> usize {
        self.shared().progress()
    }

    /// Counters: engine passes and, with AF_XDP, the TCP, ring, steering
    /// and socket counters. Takes the engine lock briefly.
    pub fn stats(&self) -> Stats {
        let e = self.shared().engine();
        let mut s = Stats {
            passes: e.passes,
            connections: e.conn_count(),
            lifecycle_visits: e.lifecycle_visits(),
            live: e.ctx.live(),
            slots: e.ctx.slots(),
            ..Stats::default()
        };
        let engines = e.xdp().map_or(&[][..], |x| x.engines());
        if let Some(x) = engines.first() {
            let (tcp, xdp) = lock(x).stats();
            s.tcp = Some(tcp);
            s.xdp = Some(xdp);
        }
        s.engines = engines.iter().map(|x| lock(x).engine_stats()).collect();
        s
    }

    /// Allocate a protection domain; the core frees it once the last
    /// clone of the handle, the last region registered with it and the
    /// last QP created with it are gone.
    pub fn alloc_pd(&self) -> Pd {
        let mut e = self.shared().engine();
        let id = e.ctx.alloc_pd();
        let life = Life::new(self.shared(), &e.released, Released::Pd(id));
        Pd {
            id,
            shared: self.shared().clone(),
            life,
        }
    }

    /// Create a completion queue holding up to `capacity` completions the
    /// application has not polled (and as many again inside the core).
    /// The core frees it once the last clone of the handle and the last
    /// QP that uses it are gone.
    pub fn create_cq(&self, capacity: usize) -> Cq {
        let q = Arc::new(CqQueue::new(capacity));
        let mut e = self.shared().engine();
        let id = e.ctx.create_cq(capacity);
        e.add_cq(id, q.clone());
        let life = Life::new(self.shared(), &e.released, Released::Cq(id));
        Cq {
            id,
            q,
            shared: self.shared().clone(),
            _life: life,
        }
    }

    /// Create a shared receive queue of `capacity` receives in `pd`, its
    /// limit armed at `limit` (0: disarmed); see [`Srq`]. Fails with
    /// `InvalidInput` when `capacity` is 0, `limit` exceeds it, or `pd`
    /// belongs to another device.
    pub fn create_srq(&self, pd: &Pd, capacity: usize, limit: u32) -> io::Result<Srq> {
        if !Arc::ptr_eq(&pd.shared, self.shared()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the PD belongs to another device",
            ));
        }
        let ev = Arc::new(SrqEvents::default());
        let mut e = self.shared().engine();
        let id = e
            .ctx
            .create_srq(pd.id, capacity, limit)
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err))?;
        e.add_srq(id, ev.clone());
        Ok(Srq {
            inner: Arc::new(SrqInner {
                shared: self.shared().clone(),
                id,
                pd: pd.id,
                wq: Arc::new(WorkQueues::srq(id, capacity)),
                ev,
            }),
        })
    }

    /// Register a zeroed, page-aligned buffer of `len` bytes owned by the
    /// returned [`Mr`]; deregistered and freed when it is dropped.
    pub fn reg_mr(&self, pd: &Pd, len: usize, access: Access) -> io::Result<Mr> {
        if !Arc::ptr_eq(&pd.shared, self.shared()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the PD belongs to another device",
            ));
        }
        let layout = Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            return Err(io::ErrorKind::OutOfMemory.into());
        };
        // SAFETY: the allocation is valid for `len` bytes until `Mr::drop`,
        // which deregisters the region (under the engine lock) before it
        // frees the memory; the engine never frees it. The application only
        // reaches the bytes through `Mr::write`/`Mr::read`, which hold the
        // engine lock, so the core's copies never race with them.
        let info = unsafe {
            self.shared()
                .engine()
                .ctx
                .reg_mr(pd.id, ptr.as_ptr(), len, access)
        };
        match info {
            Ok(info) => Ok(Mr {
                shared: self.shared().clone(),
                _pd: pd.life.clone(),
                ptr,
                owned: Some(layout),
                info,
                placed: self.shared().engine().ctx.mem().placements(),
            }),
            Err(_) => {
                // SAFETY: allocated above with `layout`, never registered.
                unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
                Err(io::Error::other("the memory table is full"))
            }
        }
    }

    /// Register `len` bytes of the application's memory at `addr`, whose
    /// tagged offsets start at `iova` (as `ibv_reg_mr_iova2`; pass the
    /// address as `iova` for `ibv_reg_mr`): byte `k` is tagged offset
    /// `iova + k`, in local SGEs ([`Mr::sge`]) and in the peer's RDMA
    /// Writes and Reads. The returned [`Mr`] does not own the memory:
    /// dropping it deregisters the region (under the engine lock; the
    /// stack never touches the memory afterwards) and frees nothing.
    /// [`Mr::read`] and [`Mr::write`] work on it as on a region of
    /// [`Self::reg_mr`].
    ///
    /// What the application may rely on when it reads memory the peer
    /// writes: the bytes of a message are in place once its completion
    /// (or a later completion of the same QP) has been polled, as with
    /// RDMA hardware; before that they may be partly placed. See
    /// `docs/design.md` ("Application memory and event descriptors").
    ///
    /// Errors: `InvalidInput` when `pd` belongs to another device or `addr`
    /// is null with a non-zero `len`; `Other` when the memory table is
    /// full.
    ///
    /// # Safety
    /// `[addr, addr + len)` must be valid for reads and writes, and stay
    /// so, until the returned [`Mr`] is dropped. While it is registered
    /// the stack reads and writes those bytes from its own thread at any
    /// time (placing what the peer sends, reading what the peer or a
    /// local work request fetches), always holding the device's engine
    /// lock: the application must not hold Rust references (`&`/`&mut`)
    /// to that memory while the region is registered, and it reaches the
    /// bytes only through raw pointers at moments the stack cannot touch
    /// them (no work request and no peer access outstanding on them, e.g.
    /// after the completion that ends such an access), or through
    /// [`Mr::read`] and [`Mr::write`].
    pub unsafe fn reg_user_mr(
        &self,
        pd: &Pd,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> io::Result<Mr> {
        if !Arc::ptr_eq(&pd.shared, self.shared()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the PD belongs to another device",
            ));
        }
        // A zero-length region still needs a non-null base for `Mr`; it
        // is never dereferenced.
        let ptr = match NonNull::new(addr) {
            Some(p) => p,
            None if len == 0 => NonNull::dangling(),
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a null address with a non-zero length",
                ))
            }
        };
        // SAFETY: the caller promises `[addr, addr + len)` stays valid for
        // reads and writes until the `Mr` is dropped, whose `Drop`
        // deregisters it under the engine lock, and holds no references to
        // it; the core touches the bytes only under that same lock.
        let info = unsafe {
            self.shared()
                .engine()
                .ctx
                .reg_mr_iova(pd.id, ptr.as_ptr(), len, iova, access)
        };
        match info {
            Ok(info) => Ok(Mr {
                shared: self.shared().clone(),
                _pd: pd.life.clone(),
                ptr,
                owned: None,
                info,
                placed: self.shared().engine().ctx.mem().placements(),
            }),
            Err(_) => Err(io::Error::other("the memory table is full")),
        }
    }

    /// Listen on `addr` (port 0: the OS picks one, see
    /// [`Listener::local_addr`]) with the default [`ListenOptions`]: a
    /// listener on the IPv6 wildcard `[::]` also takes IPv4 connections,
    /// as a Linux socket does.
    pub fn listen(&self, addr: SocketAddr) -> Result<Listener, CmError> {
        self.listen_with(addr, ListenOptions::default())
    }

    /// [`Self::listen`] with `opts`.
    pub fn listen_with(&self, addr: SocketAddr, opts: ListenOptions) -> Result<Listener, CmError> {
        let mut e = self.shared().engine();
        if e.xdp().is_some() {
            // The AF_XDP engine serves IPv4: a dual-stack wildcard is its
            // IPv4 wildcard.
            let addr = match addr {
                SocketAddr::V6(a) if a.ip().is_unspecified() && !opts.v6_only => {
                    SocketAddr::from(([0, 0, 0, 0], a.port()))
                }
                _ => addr,
            };
            let (ls, addr) = e.listen_xdp(addr)?;
            drop(e);
            tracing::info!(parent: &self.shared().span, %addr, "listening");
            self.shared().kick();
            return Ok(Listener {
                shared: self.shared().clone(),
                ls,
                addr,
            });
        }
        drop(e);
        let (sock, addr) = kernel::listen_socket(addr, opts.v6_only).map_err(CmError::from)?;
        let ls = self
            .shared()
            .engine()
            .add_listener(sock)
            .map_err(|e| CmError::Io(e.kind()))?;
        tracing::info!(parent: &self.shared().span, %addr, "listening");
        self.shared().kick();
        Ok(Listener {
            shared: self.shared().clone(),
            ls,
            addr,
        })
    }

    /// Connect to `addr`: TCP connect, then the MPA exchange as initiator.
    /// Blocks until the connection is established or fails;
    /// `params.timeout` bounds both steps together.
    ///
    /// Receives posted on the returned QP may come too late for a peer
    /// that sends as soon as the connection is up (RFC 6581 peer-to-peer
    /// mode): [`Self::connect_with_recvs`] posts them first.
    pub fn connect(&self, addr: SocketAddr, qp: QpInit, params: ConnParams) -> Result<Qp, CmError> {
        self.connect_with_recvs(addr, qp, params, &[])
    }

    /// [`Self::connect`] with `recvs` posted on the new QP before the MPA
    /// exchange starts, as verbs applications post receives before
    /// `rdma_connect`: the peer's first Send always finds a buffer. It is
    /// [`Self::connect_start`] followed by a wait for the outcome.
    pub fn connect_with_recvs(
        &self,
        addr: SocketAddr,
        qp: QpInit,
        params: ConnParams,
        recvs: &[RecvWr<'_>],
    ) -> Result<Qp, CmError> {
        self.connect_start(addr, qp, params, recvs)?.wait()
    }

    /// Start connecting to `addr` without blocking: the TCP connect, then
    /// the MPA exchange as initiator with `recvs` posted on the new QP
    /// first (see [`Self::connect_with_recvs`]); `params.timeout` bounds
    /// both steps together. [`Connecting::poll`] moves the connect on and
    /// yields the outcome once; [`Connecting::event_fd`] is readable
    /// whenever `poll` has something to do.
    ///
    /// Errors found at once: `qp` of another device, a QP the core cannot
    /// create, a TCP connect refused on the spot.
    pub fn connect_start(
        &self,
        addr: SocketAddr,
        qp: QpInit,
        params: ConnParams,
        recvs: &[RecvWr<'_>],
    ) -> Result<Connecting, CmError> {
        let deadline = Instant::now() + params.timeout;
        check_init(self.shared(), &qp)?;
        tracing::debug!(parent: &self.shared().span, peer = %addr, "connect started");
        let conn = Arc::new(ConnShared::new(qp.srq.is_some()));
        let xdp = self.shared().engine().xdp().is_some();
        let phase = if xdp {
            let (sock, local) = self.shared().engine().dial_xdp(addr, conn.clone())?;
            self.shared().kick();
            Phase::XdpTcp { sock, local }
        } else {
            let sock = TcpStream::connect(addr).map_err(|e| {
                tracing::debug!(peer = %addr, error = %e, "connect failed: TCP");
                CmError::from(e)
            })?;
            Phase::KernelTcp(sock)
        };
        Ok(Connecting {
            shared: self.shared().clone(),
            addr,
            init: qp,
            params,
            recvs: recvs.iter().map(|wr| (wr.wr_id, wr.sgl.to_vec())).collect(),
            conn,
            deadline,
            epoll: std::sync::OnceLock::new(),
            phase,
        })
    }
}

/// Where a [`Connecting`] stands.
#[derive(Debug)]
enum Phase {
    /// The kernel backend's non-blocking TCP connect is under way.
    KernelTcp(TcpStream),
    /// The AF_XDP engine's TCP connect is under way (the engine reports
    /// its outcome in the connection's shared state).
    XdpTcp { sock: Sock, local: SocketAddr },
    /// The core QP runs the MPA exchange over the connection.
    Mpa { id: QpId, local: SocketAddr },
    /// The outcome was handed out.
    Done,
}

/// A connect under way ([`Device::connect_start`]). Dropping it before
/// the outcome abandons the connect (the connection is closed).
#[derive(Debug)]
pub struct Connecting {
    shared: Arc<Shared>,
    addr: SocketAddr,
    init: QpInit,
    params: ConnParams,
    /// The receives to post before the MPA exchange (wr_id, SGEs).
    recvs: Vec<(u64, Vec<Sge>)>,
    conn: Arc<ConnShared>,
    /// When the connect fails with [`CmError::Timeout`] if the TCP
    /// connect has not finished (the MPA exchange has the core's timer).
    deadline: Instant,
    /// The descriptor of [`Connecting::event_fd`], made on first use.
    epoll: std::sync::OnceLock<Epoll>,
    phase: Phase,
}

impl Connecting {
    /// A descriptor readable whenever [`Self::poll`] has something to do,
    /// for poll(2) or epoll: while the kernel backend's TCP connect runs,
    /// once it has finished (connected or failed); then once the outcome
    /// of the AF_XDP TCP connect or of the MPA exchange is known. Call
    /// `poll` when it is readable: a readable descriptor with `poll`
    /// returning `None` means the connect moved to its next step. With
    /// [`Progress::Manual`] the engine runs only in [`Device::progress`]
    /// (the timeout of `params` is checked by `poll`). It is an epoll
    /// instance; the application must not change its set. Made on the
    /// first call.
    ///
    /// Panics if the descriptors cannot be created (the process is out of
    /// file descriptors).
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        if self.epoll.get().is_none() {
            let ep = Epoll::new().expect("an epoll instance for the connect");
            let i = lock(&self.conn.m);
            // The outcomes reported and not yet taken by `poll`.
            let ready = match self.phase {
                Phase::XdpTcp { .. } => usize::from(i.tcp.is_some()),
                Phase::Mpa { .. } => usize::from(i.setup.is_some()),
                Phase::KernelTcp(_) | Phase::Done => 0,
            };
            let fd = self
                .conn
                .setup
                .get_or_create(|| ready)
                .expect("an eventfd for the connect");
            drop(i);
            ep.add(fd.as_fd(), libc::EPOLLIN)
                .expect("an eventfd added to epoll");
            if let Phase::KernelTcp(sock) = &self.phase {
                ep.add(borrow_sock(sock), libc::EPOLLOUT)
                    .expect("a socket added to epoll");
            }
            let _ = self.epoll.set(ep);
        }
        self.epoll.get().expect("set above").as_fd()
    }

    /// Move the connect on; the outcome once it is known (afterwards
    /// `None` again). Never blocks; with [`Progress::Manual`] it does not
    /// run the engine either.
    pub fn poll(&mut self) -> Option<Result<Qp, CmError>> {
        let r = self.step();
        if r.is_some() {
            self.phase = Phase::Done;
        }
        r
    }

    /// Block until the outcome is known.
    fn wait(mut self) -> Result<Qp, CmError> {
        loop {
            if let Some(r) = self.poll() {
                return r;
            }
            match &self.phase {
                Phase::KernelTcp(sock) => {
                    // The kernel connects without the engine.
                    wait_fd(borrow_sock(sock), libc::POLLOUT, Some(self.deadline));
                }
                Phase::XdpTcp { .. } => {
                    let _ = self.shared.wait_for(
                        &self.conn.m,
                        &self.conn.cv,
                        Some(self.deadline),
                        |i| i.tcp.is_some().then_some(()),
                    );
                }
                Phase::Mpa { .. } => {
                    // The core's handshake deadline fires first
                    // (MpaTimeout); ours is a backstop.
                    let backstop = self.deadline + Duration::from_secs(1);
                    let r =
                        self.shared
                            .wait_for(&self.conn.m, &self.conn.cv, Some(backstop), |i| {
                                i.setup.is_some().then_some(())
                            });
                    if r.is_none() {
                        self.phase = Phase::Done;
                        return Err(CmError::Timeout);
                    }
                }
                Phase::Done => return Err(CmError::Closed),
            }
        }
    }

    fn step(&mut self) -> Option<Result<Qp, CmError>> {
        match &self.phase {
            Phase::KernelTcp(sock) => {
                let connected = match sock.take_error() {
                    Ok(Some(e)) | Err(e) => Err(e),
                    Ok(None) => match sock.peer_addr() {
                        Ok(_) => Ok(true),
                        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
                        Err(e) => Err(e),
                    },
                };
                match connected {
                    Err(e) => {
                        tracing::debug!(peer = %self.addr, error = %e, "connect failed: TCP");
                        Some(Err(CmError::from(e)))
                    }
                    Ok(false) if Instant::now() >= self.deadline => {
                        tracing::debug!(peer = %self.addr, "connect failed: TCP timeout");
                        Some(Err(CmError::Timeout))
                    }
                    Ok(false) => None,
                    Ok(true) => {
                        let Phase::KernelTcp(sock) =
                            std::mem::replace(&mut self.phase, Phase::Done)
                        else {
                            unreachable!("matched above")
                        };
                        if let Some(ep) = self.epoll.get() {
                            ep.remove(borrow_sock(&sock));
                        }
                        if let Err(e) = sock.set_nodelay(true) {
                            return Some(Err(CmError::Io(e.kind())));
                        }
                        let local = match sock.local_addr() {
                            Ok(a) => kernel::canonical(a),
                            Err(e) => return Some(Err(CmError::Io(e.kind()))),
                        };
                        let emss = emss_of(&sock);
                        self.start_mpa(Sock::Kernel(sock), local, emss)
                    }
                }
            }
            Phase::XdpTcp { .. } => {
                let tcp = {
                    let mut i = lock(&self.conn.m);
                    let t = i.tcp.take();
                    if t.is_some() {
                        self.conn.setup.take();
                    }
                    t
                };
                match tcp {
                    Some(Ok(emss)) => {
                        let Phase::XdpTcp { sock, local } =
                            std::mem::replace(&mut self.phase, Phase::Done)
                        else {
                            unreachable!("matched above")
                        };
                        self.start_mpa(sock, local, emss.clamp(512, 16384))
                    }
                    Some(Err(e)) => Some(Err(e)),
                    None if Instant::now() >= self.deadline => {
                        let Phase::XdpTcp { sock, .. } =
                            std::mem::replace(&mut self.phase, Phase::Done)
                        else {
                            unreachable!("matched above")
                        };
                        self.shared.engine().drop_sock(sock);
                        self.shared.kick();
                        Some(Err(CmError::Timeout))
                    }
                    None => None,
                }
            }
            Phase::Mpa { id, local } => {
                let (id, local) = (*id, *local);
                let setup = {
                    let i = lock(&self.conn.m);
                    let s = i.setup.clone();
                    if s.is_some() {
                        self.conn.setup.take();
                    }
                    s
                }?;
                if let Err(err) = &setup {
                    conn_event!(self.shared.engine().ctx, id, DEBUG, error = %err, "connect failed");
                }
                let qp = Qp {
                    shared: self.shared.clone(),
                    id,
                    wq: Arc::new(WorkQueues::new(
                        id,
                        self.init.sq_depth,
                        self.init.rq_depth_in_engine(),
                        self.recvs.len(),
                    )),
                    conn: self.conn.clone(),
                    local,
                    peer: self.addr,
                    srq: self.init.srq.clone(),
                };
                Some(setup.map(|()| qp))
            }
            Phase::Done => None,
        }
    }

    /// The TCP connection is up: create the core QP, post the receives,
    /// start the MPA exchange and hand the connection to the engine.
    fn start_mpa(
        &mut self,
        sock: Sock,
        local: SocketAddr,
        emss: usize,
    ) -> Option<Result<Qp, CmError>> {
        let shared = self.shared.clone();
        let left = self.deadline.saturating_duration_since(Instant::now());
        let mut e = shared.engine();
        let now = e.now();
        let id = match self.init.create_in(&mut e.ctx, emss) {
            Ok(id) => id,
            Err(err) => {
                tracing::debug!(peer = %self.addr, error = %err, "connect failed: no QP");
                e.drop_sock(sock);
                return Some(Err(err.into()));
            }
        };
        let _ = e
            .ctx
            .set_qp_span(id, conn_span(&shared.span, id, local, self.addr));
        let recvs: Vec<RecvWr<'_>> = self
            .recvs
            .iter()
            .map(|(wr_id, sgl)| RecvWr { wr_id: *wr_id, sgl })
            .collect();
        let p = &self.params;
        if let Err(err) = post_recvs(&mut e.ctx, id, &recvs)
            .and_then(|()| e.ctx.connect(id, p.mpa_config(left), &p.private_data, now))
        {
            let _ = e.ctx.destroy_qp(id);
            e.drop_sock(sock);
            return Some(Err(err.into()));
        }
        if let Err(err) = e.add_conn(id, sock, Vec::new(), self.conn.clone()) {
            e.release_qp(id);
            return Some(Err(CmError::Io(err.kind())));
        }
        drop(e);
        shared.kick();
        self.phase = Phase::Mpa { id, local };
        None
    }
}

impl Drop for Connecting {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::XdpTcp { sock, .. } => {
                self.shared.engine().drop_sock(sock);
                self.shared.kick();
            }
            Phase::Mpa { id, .. } => {
                self.shared.engine().release_qp(id);
                self.shared.kick();
            }
            Phase::KernelTcp(_) | Phase::Done => {}
        }
    }
}

/// The descriptor of a kernel socket.
fn borrow_sock(sock: &TcpStream) -> BorrowedFd<'_> {
    std::os::fd::AsFd::as_fd(sock)
}

/// Pin the current thread to core `cpu` (best effort).
fn pin(cpu: usize) {
    if let Some(id) = core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.id == cpu)
    {
        core_affinity::set_for_current(id);
    }
}

/// Queue a work request with `push` on `wq` (a QP's or an SRQ's queues);
/// when the queue is full as far as it knows, learn what the core
/// retired (under the lock) and try once more. With manual progress, a
/// post that finds the device lock free hands the request to the core at
/// once with `now` (see [`Qp::post_send`]).
fn post_via(
    shared: &Arc<Shared>,
    wq: &Arc<WorkQueues>,
    push: impl Fn(&WorkQueues) -> Result<(), Option<PostError>>,
    now: impl Fn(&WorkQueues, &mut Context) -> Result<(), Option<PostError>>,
) -> Result<(), PostError> {
    if !shared.threaded {
        if let Ok(mut e) = shared.engine.try_lock() {
            let r = match now(wq, &mut e.ctx) {
                Err(None) => {
                    wq.settle(&e.ctx);
                    now(wq, &mut e.ctx)
                }
                r => r,
            };
            if let Some(qp) = wq.qp() {
                e.touch_qp(qp);
            }
            drop(e);
            r.map_err(|e| e.unwrap_or(PostError::QueueFull))?;
            shared.kick();
            return Ok(());
        }
    }
    match push(wq) {
        Ok(()) => {}
        Err(Some(e)) => return Err(e),
        Err(None) => {
            {
                let mut e = shared.engine();
                wq.drain(&mut e.ctx);
                wq.settle(&e.ctx);
                if let Some(qp) = wq.qp() {
                    e.touch_qp(qp);
                }
            }
            push(wq).map_err(|e| e.unwrap_or(PostError::QueueFull))?;
        }
    }
    shared.posted.list(wq);
    shared.kick();
    Ok(())
}

/// Post `recvs` on a QP that is not connected yet.
fn post_recvs(ctx: &mut Context, id: QpId, recvs: &[RecvWr<'_>]) -> Result<(), VerbsError> {
    recvs.iter().try_for_each(|wr| ctx.post_recv(id, wr))
}

fn check_init(shared: &Arc<Shared>, qp: &QpInit) -> Result<(), CmError> {
    let same = |s: &Arc<Shared>| Arc::ptr_eq(s, shared);
    if !(same(&qp.pd.shared) && same(&qp.send_cq.shared) && same(&qp.recv_cq.shared)) {
        return Err(CmError::Verbs(VerbsError::InvalidHandle));
    }
    match &qp.srq {
        Some(s) if !same(&s.inner.shared) => Err(CmError::Verbs(VerbsError::InvalidHandle)),
        Some(s) if s.inner.pd != qp.pd.id => Err(CmError::Verbs(VerbsError::InvalidArgument)),
        _ => Ok(()),
    }
}

/// Shared by the clones of a [`Pd`] or [`Cq`] (and, for a PD, by its
/// regions): dropping the last one hands the object to the engine, which
/// frees it in the core on its next pass.
#[derive(Debug)]
struct Life {
    shared: Arc<Shared>,
    released: Arc<crossbeam_queue::SegQueue<Released>>,
    what: Released,
}

impl Life {
    fn new(
        shared: &Arc<Shared>,
        released: &Arc<crossbeam_queue::SegQueue<Released>>,
        what: Released,
    ) -> Arc<Self> {
        Arc::new(Self {
            shared: shared.clone(),
            released: released.clone(),
            what,
        })
    }
}

impl Drop for Life {
    fn drop(&mut self) {
        // No engine lock here: a handle may drop while it is held.
        self.released.push(self.what);
        self.shared.kick();
    }
}

/// A protection domain: memory regions and QPs of one PD only reach each
/// other (RFC 5040 STag validation checks the PD). Clones share it; it
/// lives while any clone, region or QP of it does.
#[derive(Clone, Debug)]
pub struct Pd {
    id: PdId,
    shared: Arc<Shared>,
    life: Arc<Life>,
}

impl Pd {
    /// This object's handle in the protocol core's
    /// [`iwarp::verbs::Context`].
    pub fn id(&self) -> PdId {
        self.id
    }
}

/// A completion queue. Clones share the queue.
#[derive(Clone, Debug)]
pub struct Cq {
    id: CqId,
    q: Arc<CqQueue>,
    shared: Arc<Shared>,
    _life: Arc<Life>,
}

impl Cq {
    /// Move up to `out.len()` completions into `out`, oldest first;
    /// returns how many. Never blocks (in [`Progress::Manual`] mode it
    /// does not run the engine either: call [`Device::progress`]).
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        let n = self.q.pop_into(out);
        self.made_room(n);
        n
    }

    /// `n` completions were taken: if the engine left completions in the
    /// core because the queue was full, it moves them now.
    fn made_room(&self, n: usize) {
        if n > 0 && self.q.backlogged.load(Ordering::SeqCst) {
            self.shared.kick();
        }
    }

    /// Block until at least one completion is there (returns how many were
    /// moved into `out`, at least 1) or `timeout` passes (returns 0).
    /// Sleeps on a condition variable: no spinning.
    pub fn wait(&self, out: &mut [WorkCompletion], timeout: Option<Duration>) -> usize {
        if out.is_empty() {
            return 0;
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        // Counted before the first look at the queue (SeqCst, as the
        // engine's push-then-load): either the engine sees a sleeper and
        // wakes it, or this waiter sees the completion.
        self.q.sleepers.fetch_add(1, Ordering::SeqCst);
        let r = self
            .shared
            .wait_for(&self.q.sleep, &self.q.cv, deadline, |_| {
                let n = self.q.pop_into(out);
                (n > 0).then_some(n)
            })
            .unwrap_or(0);
        self.q.sleepers.fetch_sub(1, Ordering::SeqCst);
        self.made_room(r);
        r
    }

    /// Arm the completion notification, as `ibv_req_notify_cq`: the next
    /// completion the engine adds to the queue (with `solicited_only`: the
    /// next receive of a Send with the Solicited Event flag, or the next
    /// unsuccessful completion, RFC 5040 §5.3 and `IBV_SEND_SOLICITED`)
    /// raises one notification on [`Self::event_fd`] and disarms.
    /// Completions already in the queue raise nothing; arming again
    /// before it fires changes nothing but `solicited_only`. The
    /// notification is raised by the engine thread that moves the
    /// completion (with [`Progress::Manual`]: within [`Device::progress`]).
    ///
    /// Errors: the eventfd cannot be created.
    pub fn req_notify(&self, solicited_only: bool) -> io::Result<()> {
        self.channel()?;
        let mut e = self.shared.engine();
        if let Some(core) = e.ctx.cq(self.id) {
            core.req_notify(solicited_only);
        }
        Ok(())
    }

    /// The completion channel: an eventfd (`EFD_SEMAPHORE | EFD_NONBLOCK |
    /// EFD_CLOEXEC`) holding one count per notification raised (see
    /// [`Self::req_notify`]), for poll(2) or epoll; [`Self::get_event`]
    /// takes one. Created on the first call (or by `req_notify`).
    ///
    /// Panics if the eventfd cannot be created (the process is out of file
    /// descriptors).
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.channel()
            .expect("an eventfd for the completion channel")
            .as_fd()
    }

    fn channel(&self) -> io::Result<&EventFd> {
        // Before any notification can be raised: the count starts at 0.
        self.q.event.get_or_create(|| 0)
    }

    /// Take one notification if one was raised (as `ibv_get_cq_event`,
    /// without blocking): true if there was one. Never blocks, and does
    /// not run a manual device's engine.
    pub fn get_event(&self) -> bool {
        self.q.event.get().is_some_and(EventFd::take)
    }

    /// Wait up to `timeout` (`None`: no limit) for a notification and take
    /// it: true if one came. With a progress thread it sleeps in poll(2)
    /// on [`Self::event_fd`]; with [`Progress::Manual`] the waiting thread
    /// drives the engine.
    pub fn wait_event(&self, timeout: Option<Duration>) -> bool {
        let Ok(fd) = self.channel() else {
            return false;
        };
        if self.shared.threaded {
            return poll_until(fd, timeout, || fd.take().then_some(())).is_some();
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        self.shared
            .wait_for(&self.q.sleep, &self.q.cv, deadline, |_| {
                fd.take().then_some(())
            })
            .is_some()
    }

    /// This object's handle in the protocol core's
    /// [`iwarp::verbs::Context`].
    pub fn id(&self) -> CqId {
        self.id
    }
}

/// A registered memory region: a zeroed, page-aligned buffer it owns
/// ([`Device::reg_mr`]), or application memory it does not own
/// ([`Device::reg_user_mr`]).
///
/// The bytes are reached with [`Self::write`] and [`Self::read`], which
/// take the device's engine lock: the stack only touches registered
/// memory while holding that lock, so these copies never race with data
/// the peer places. Out-of-range offsets are the application's bug: they
/// panic.
#[derive(Debug)]
pub struct Mr {
    shared: Arc<Shared>,
    /// The region keeps its PD alive.
    _pd: Arc<Life>,
    ptr: NonNull<u8>,
    /// The layout of the buffer the region owns; `None`: the
    /// application's memory ([`Device::reg_user_mr`]).
    owned: Option<Layout>,
    info: MrInfo,
    /// The device's placement counter ([`Mr::placements`]).
    placed: Arc<AtomicU64>,
}

// SAFETY: the bytes are either an allocation `Mr` owns (like a
// `Box<[u8]>`) or memory the application promised valid and free of Rust
// references for the region's life (`Device::reg_user_mr`); every access
// to them, the stack's and `Mr`'s, holds the engine's mutex.
unsafe impl Send for Mr {}
// SAFETY: see `Send`; `&Mr` methods only copy under the engine lock.
unsafe impl Sync for Mr {}

impl Mr {
    /// The local key: the STag to put in [`iwarp::qp::Sge::lkey`].
    pub fn lkey(&self) -> u32 {
        self.info.lkey
    }

    /// The remote key: the STag to advertise to the peer for its RDMA
    /// Write, Read or Atomic operations (the same STag as [`Self::lkey`]).
    pub fn rkey(&self) -> u32 {
        self.info.rkey
    }

    /// The tagged offset of byte 0: the buffer's address for
    /// [`Device::reg_mr`] (as `ibv_reg_mr`), the `iova` given to
    /// [`Device::reg_user_mr`].
    pub fn addr(&self) -> u64 {
        self.info.iova
    }

    /// Length of the region in bytes.
    pub fn len(&self) -> usize {
        self.info.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.info.len == 0
    }

    fn check(&self, offset: usize, len: usize) {
        let end = offset.checked_add(len);
        assert!(
            end.is_some_and(|e| e <= self.info.len),
            "range {offset}+{len} outside the {}-byte region",
            self.info.len
        );
    }

    /// The SGE of `len` bytes at `offset`. Panics if out of range or if
    /// `len` exceeds `u32::MAX`.
    pub fn sge(&self, offset: usize, len: usize) -> Sge {
        self.check(offset, len);
        Sge {
            addr: self.info.iova + offset as u64,
            len: u32::try_from(len).expect("an SGE holds at most 4 GiB - 1"),
            lkey: self.info.lkey,
        }
    }

    /// Copy `src` into the region at `offset`. Panics if out of range.
    pub fn write(&self, offset: usize, src: &[u8]) {
        self.check(offset, src.len());
        let _engine = self.shared.engine();
        // SAFETY: in bounds (checked above) of memory valid for the
        // region's life (an allocation this `Mr` owns, or the promise made
        // to `reg_user_mr`); the engine lock is held, so the stack does not
        // access the region concurrently; `src` is a distinct Rust borrow
        // and cannot overlap memory that is never handed out as a
        // reference.
        unsafe {
            core::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len())
        };
    }

    /// Copy bytes of the region at `offset` into `dst`. Panics if out of
    /// range.
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        self.check(offset, dst.len());
        let _engine = self.shared.engine();
        // SAFETY: as in `write`, with the copy going the other way.
        unsafe {
            core::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
    }

    /// The byte at `offset`, read under the engine lock (as
    /// [`Self::read`]). Panics if out of range.
    pub fn read_byte(&self, offset: usize) -> u8 {
        let mut b = [0];
        self.read(offset, &mut b);
        b[0]
    }

    /// The device's placement counter: it advances after the stack
    /// writes into any region of the device (placed payload, RDMA Read
    /// Response data, atomic results). Reading it takes no lock (an
    /// `Acquire` load); an unchanged value means nothing was placed in
    /// between, so a byte read before is still current.
    pub fn placements(&self) -> u64 {
        self.placed.load(Ordering::Acquire)
    }

    /// Wait until the byte at `offset` is `value` (true) or `timeout`
    /// passes (false; `None`: no limit), for polling the last byte of an
    /// incoming RDMA Write (latency benchmarks). Spins: it reads the byte
    /// (under the engine lock, never racing with placement) at the start
    /// and each time [`Self::placements`] moves, and otherwise only
    /// watches the counter. With [`Progress::Manual`] it drives the engine
    /// while it spins. Panics if out of range.
    pub fn wait_byte(&self, offset: usize, value: u8, timeout: Option<Duration>) -> bool {
        self.check(offset, 1);
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut seen = None;
        let mut spins = 0u32;
        loop {
            if !self.shared.threaded {
                self.shared.progress();
            }
            let now = self.placements();
            if seen != Some(now) {
                seen = Some(now);
                if self.read_byte_spinning(offset) == value {
                    return true;
                }
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return false;
                }
                if self.shared.threaded {
                    std::thread::yield_now();
                }
            }
            std::hint::spin_loop();
        }
    }

    /// [`Self::read_byte`] that spins for the engine lock rather than
    /// sleeping on it: the progress thread holds it only for the rest of
    /// its pass, shorter than a sleep and a wake-up.
    fn read_byte_spinning(&self, offset: usize) -> u8 {
        for _ in 0..10_000 {
            if let Ok(_engine) = self.shared.engine.try_lock() {
                // SAFETY: as in `read` (in bounds, checked by the caller;
                // the engine lock is held).
                return unsafe { self.ptr.as_ptr().add(offset).read() };
            }
            std::hint::spin_loop();
        }
        self.read_byte(offset)
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // Deregister first, under the lock: afterwards the stack cannot
        // reach the memory.
        let _ = self.shared.engine().ctx.dereg_mr(self.info.lkey);
        if let Some(layout) = self.owned {
            // SAFETY: allocated in `Device::reg_mr` with `layout`, and no
            // longer registered.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// What a new QP is made of: its protection domain, completion queues
/// and queue depths.
#[derive(Clone, Debug)]
pub struct QpInit {
    /// Its protection domain: the regions its work requests and the peer's
    /// tagged messages may reach.
    pub pd: Pd,
    /// The completion queue of its send-queue work requests.
    pub send_cq: Cq,
    /// The completion queue of its receives.
    pub recv_cq: Cq,
    /// Send queue depth: the most send-queue work requests outstanding.
    pub sq_depth: usize,
    /// Receive queue depth: the most receives posted and not yet
    /// consumed.
    pub rq_depth: usize,
    /// Complete every send-queue work request, signaled or not.
    pub sig_all: bool,
    /// Take receives from this shared receive queue (same device and
    /// PD) instead of a receive queue of the QP's own: `rq_depth` is then
    /// not used, and [`Qp::post_recv`] fails with
    /// [`PostError::SrqAttached`].
    pub srq: Option<Srq>,
}

impl QpInit {
    /// A QP of `pd` whose send and receive completions both go to `cq`,
    /// with send and receive queues `depth` deep, completing only
    /// signaled sends, with a receive queue of its own.
    pub fn new(pd: &Pd, cq: &Cq, depth: usize) -> Self {
        Self {
            pd: pd.clone(),
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            sq_depth: depth,
            rq_depth: depth,
            sig_all: false,
            srq: None,
        }
    }

    /// Create the core QP this describes.
    fn create_in(&self, ctx: &mut Context, emss: usize) -> Result<QpId, VerbsError> {
        let (pd, scq, rcq) = (self.pd.id, self.send_cq.id, self.recv_cq.id);
        match &self.srq {
            Some(s) => ctx.create_qp_with_srq(pd, scq, rcq, s.inner.id, self.config(emss)),
            None => ctx.create_qp(pd, scq, rcq, self.config(emss)),
        }
    }

    /// The depth of the engine's receive queue for the QP: none on an SRQ.
    fn rq_depth_in_engine(&self) -> usize {
        if self.srq.is_some() {
            0
        } else {
            self.rq_depth
        }
    }

    fn config(&self, emss: usize) -> QpConfig {
        QpConfig {
            sq_depth: self.sq_depth,
            rq_depth: self.rq_depth,
            emss,
            sig_all: self.sig_all,
            ..QpConfig::default()
        }
    }
}

/// A connected queue pair. Dropping it disconnects.
#[derive(Debug)]
pub struct Qp {
    shared: Arc<Shared>,
    id: QpId,
    /// Work requests on their way to the engine ([`crate::post`]).
    wq: Arc<WorkQueues>,
    conn: Arc<ConnShared>,
    local: SocketAddr,
    peer: SocketAddr,
    /// The shared receive queue the QP takes receives from (kept alive
    /// as long as the QP).
    srq: Option<Srq>,
}

impl Qp {
    /// Responder side of [`crate::ConnRequest::accept`].
    pub(crate) fn accept(
        shared: &Arc<Shared>,
        req: Request,
        init: QpInit,
        params: &ConnParams,
        recvs: &[RecvWr<'_>],
    ) -> Result<Self, CmError> {
        check_init(shared, &init)?;
        let conn = Arc::new(ConnShared::new(init.srq.is_some()));
        let mut e = shared.engine();
        let now = e.now();
        let id = init.create_in(&mut e.ctx, req.emss).inspect_err(|err| {
            tracing::debug!(peer = %req.peer, error = %err, "accept failed: no QP");
        })?;
        let _ = e
            .ctx
            .set_qp_span(id, conn_span(&shared.span, id, req.local, req.peer));
        let mut result = post_recvs(&mut e.ctx, id, recvs)
            .and_then(|()| e.ctx.listen(id, params.mpa_config(params.timeout), now));
        if result.is_ok() {
            // Replay the request exactly as received.
            e.ctx.handle_input(id, &req.frame, now);
            let mut failed = None;
            while let Some(ev) = e.ctx.poll_event(id) {
                if let QpEvent::ConnectFailed(err) = ev {
                    failed = Some(VerbsError::Connect(err));
                }
            }
            result = match failed {
                Some(err) => Err(err),
                None => e.ctx.accept(id, &params.private_data),
            };
        }
        let result = result.map_err(CmError::from);
        // Even a failed QP may have a reply to send (R=1 on a negotiation
        // mismatch): the engine sends it and closes.
        if let Err(err) = e.add_conn(id, req.sock, req.rest, conn.clone()) {
            e.release_qp(id);
            return Err(CmError::Io(err.kind()));
        }
        if let Err(err) = result {
            conn_event!(e.ctx, id, DEBUG, error = %err, "accept failed");
            e.release_qp(id);
            drop(e);
            shared.kick();
            return Err(err);
        }
        // Established: the event is already queued.
        e.pass_events(id);
        drop(e);
        shared.kick();
        Ok(Self {
            shared: shared.clone(),
            id,
            wq: Arc::new(WorkQueues::new(
                id,
                init.sq_depth,
                init.rq_depth_in_engine(),
                recvs.len(),
            )),
            conn,
            local: req.local,
            peer: req.peer,
            srq: init.srq,
        })
    }

    /// Post a send-queue work request. Errors are synchronous; the request
    /// reaches the engine through the QP's lock-free queue, or with manual
    /// progress and the engine lock free straight into the core (see the
    /// crate documentation).
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<(), PostError> {
        self.post(|q| q.push_send(wr), |q, ctx| q.post_send_now(wr, ctx))
    }

    /// Post a receive work request. Errors are synchronous; a QP on a
    /// shared receive queue refuses it ([`PostError::SrqAttached`]).
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<(), PostError> {
        if self.srq.is_some() {
            return Err(PostError::SrqAttached);
        }
        self.post(|q| q.push_recv(wr), |q, ctx| q.post_recv_now(wr, ctx))
    }

    /// The shared receive queue the QP takes its receives from.
    pub fn srq(&self) -> Option<&Srq> {
        self.srq.as_ref()
    }

    /// Queue with `push`; when the queue is full as far as it knows, learn
    /// what the core retired (under the lock) and try once more.
    ///
    /// With manual progress the application's threads run the engine
    /// themselves, so a post that finds the device lock free hands the
    /// request to the core at once (`now`, behind anything queued before
    /// it) instead of queuing it for the next pass to move; one that finds
    /// the lock taken queues it.
    fn post(
        &self,
        push: impl Fn(&WorkQueues) -> Result<(), Option<PostError>>,
        now: impl Fn(&WorkQueues, &mut Context) -> Result<(), Option<PostError>>,
    ) -> Result<(), PostError> {
        post_via(&self.shared, &self.wq, push, now)
    }

    /// Graceful close: outstanding work requests are flushed, the TCP
    /// connection is closed. Work requests posted before are handed to
    /// the QP first (and flushed with the rest).
    pub fn disconnect(&self) {
        self.conn.closing(&mut lock(&self.conn.m));
        {
            let mut e = self.shared.engine();
            self.wq.drain(&mut e.ctx);
            e.ctx.disconnect(self.id);
            e.touch_qp(self.id);
        }
        self.shared.kick();
    }

    /// The QP's state in the protocol core.
    pub fn state(&self) -> QpState {
        self.shared
            .engine()
            .ctx
            .qp_state(self.id)
            .unwrap_or(QpState::Error)
    }

    /// What the MPA exchange settled: revision, CRC, markers per
    /// direction, IRD/ORD and the RTR type.
    pub fn negotiated(&self) -> Negotiated {
        lock(&self.conn.m)
            .negotiated
            .clone()
            .expect("a Qp is handed out established")
    }

    /// The peer's ULP private data from the MPA exchange.
    pub fn peer_private_data(&self) -> Vec<u8> {
        lock(&self.conn.m).peer_private_data.clone()
    }

    /// The local address and port of the QP's TCP connection.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The peer's address and port of the QP's TCP connection.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The next connection event, if any.
    pub fn poll_event(&self) -> Option<CmEvent> {
        self.conn.pop(&mut lock(&self.conn.m))
    }

    /// Wait up to `timeout` for the next connection event.
    pub fn wait_event(&self, timeout: Duration) -> Option<CmEvent> {
        let deadline = Instant::now() + timeout;
        self.shared
            .wait_for(&self.conn.m, &self.conn.cv, Some(deadline), |i| {
                self.conn.pop(i)
            })
    }

    /// A descriptor readable while a connection event waits for
    /// [`Self::poll_event`], for poll(2) or epoll: a semaphore eventfd
    /// (`EFD_SEMAPHORE | EFD_NONBLOCK | EFD_CLOEXEC`) holding one count per
    /// queued event, taken by `poll_event` and `wait_event` with the event.
    /// The application must not read it itself. Created on the first call.
    /// With [`Progress::Manual`], events arrive with [`Device::progress`].
    ///
    /// Panics if the eventfd cannot be created (the process is out of file
    /// descriptors).
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        let i = lock(&self.conn.m);
        let fd = self
            .conn
            .event
            .get_or_create(|| i.events.len())
            .expect("an eventfd for the QP");
        fd.as_fd()
    }

    /// The next asynchronous event ([`QpAsyncEvent`]: the QP went to
    /// Error because of an error, or a QP on a shared receive queue left
    /// RTS), if any. Never blocks.
    pub fn poll_async_event(&self) -> Option<QpAsyncEvent> {
        self.conn.pop_async(&mut lock(&self.conn.m))
    }

    /// Wait up to `timeout` for the next asynchronous event.
    pub fn wait_async_event(&self, timeout: Duration) -> Option<QpAsyncEvent> {
        let deadline = Instant::now() + timeout;
        self.shared
            .wait_for(&self.conn.m, &self.conn.cv, Some(deadline), |i| {
                self.conn.pop_async(i)
            })
    }

    /// A descriptor readable while an asynchronous event waits for
    /// [`Self::poll_async_event`], for poll(2) or epoll: a semaphore
    /// eventfd (`EFD_SEMAPHORE | EFD_NONBLOCK | EFD_CLOEXEC`) holding one
    /// count per queued event, taken by `poll_async_event` and
    /// `wait_async_event` with the event. The application must not read
    /// it itself. Created on the first call. With [`Progress::Manual`],
    /// events arrive with [`Device::progress`].
    ///
    /// Panics if the eventfd cannot be created (the process is out of file
    /// descriptors).
    pub fn async_event_fd(&self) -> BorrowedFd<'_> {
        let i = lock(&self.conn.m);
        let fd = self
            .conn
            .async_event
            .get_or_create(|| i.async_events.len())
            .expect("an eventfd for the QP's asynchronous events");
        fd.as_fd()
    }

    /// This object's handle in the protocol core's
    /// [`iwarp::verbs::Context`].
    pub fn id(&self) -> QpId {
        self.id
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        {
            let mut e = self.shared.engine();
            self.wq.drain(&mut e.ctx);
            self.wq.close();
            e.release_qp(self.id);
        }
        self.shared.kick();
    }
}

/// A shared receive queue: one queue of posted receives that the QPs
/// created on it ([`QpInit::srq`]) take from, whichever engine drives
/// them (the device has one verbs context, shared by its engines). See
/// [`iwarp::srq`] for the semantics: each message that consumes a
/// receive takes the oldest at its first segment and completes on the
/// consuming QP's receive CQ; an empty SRQ terminates that QP's
/// connection as an empty receive queue would; the limit event fires once
/// and must be re-armed with [`Self::arm_limit`].
///
/// Posts go through a lock-free queue to the engine, as a QP's do
/// ([`Qp::post_recv`]): errors are synchronous and `QueueFull` is exact.
/// Clones share the queue. The SRQ is destroyed when the last handle
/// (QPs on it hold one each) is dropped, after the core QPs of closing
/// connections are gone; receives no QP took are discarded.
#[derive(Clone, Debug)]
pub struct Srq {
    inner: Arc<SrqInner>,
}

#[derive(Debug)]
struct SrqInner {
    shared: Arc<Shared>,
    id: SrqId,
    pd: PdId,
    wq: Arc<WorkQueues>,
    ev: Arc<SrqEvents>,
}

impl Srq {
    /// Post a receive work request. Errors are synchronous.
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<(), PostError> {
        let i = &*self.inner;
        post_via(
            &i.shared,
            &i.wq,
            |q| q.push_recv(wr),
            |q, ctx| q.post_recv_now(wr, ctx),
        )
    }

    /// Arm the limit at `limit` (0: disarm), as `ibv_modify_srq` with
    /// `IBV_SRQ_LIMIT`: one [`SrqEvent::LimitReached`] when taking a
    /// receive leaves fewer than `limit` posted. Receives posted before
    /// the call count. `InvalidInput` when `limit` exceeds the capacity.
    pub fn arm_limit(&self, limit: u32) -> io::Result<()> {
        let i = &*self.inner;
        let mut e = i.shared.engine();
        i.wq.drain(&mut e.ctx);
        e.ctx
            .modify_srq(i.id, limit)
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err))
    }

    /// Receives posted and not yet taken by a QP (takes the engine lock).
    pub fn posted(&self) -> usize {
        let i = &*self.inner;
        let mut e = i.shared.engine();
        i.wq.drain(&mut e.ctx);
        e.ctx.srq_occupancy(i.id).unwrap_or(0)
    }

    /// The next asynchronous event, if any. Never blocks (in
    /// [`Progress::Manual`] mode events arrive with [`Device::progress`]).
    pub fn poll_event(&self) -> Option<SrqEvent> {
        let ev = &self.inner.ev;
        ev.pop(&mut lock(&ev.m))
    }

    /// Wait up to `timeout` for the next asynchronous event.
    pub fn wait_event(&self, timeout: Duration) -> Option<SrqEvent> {
        let i = &*self.inner;
        let deadline = Instant::now() + timeout;
        i.shared
            .wait_for(&i.ev.m, &i.ev.cv, Some(deadline), |q| i.ev.pop(q))
    }

    /// A descriptor readable while an asynchronous event waits for
    /// [`Self::poll_event`], for poll(2) or epoll: a semaphore eventfd
    /// (`EFD_SEMAPHORE | EFD_NONBLOCK | EFD_CLOEXEC`) holding one count per
    /// queued event, taken by `poll_event` and `wait_event` with the event.
    /// The application must not read it itself. Created on the first call.
    /// With [`Progress::Manual`], events arrive with [`Device::progress`].
    ///
    /// Panics if the eventfd cannot be created (the process is out of file
    /// descriptors).
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        let ev = &self.inner.ev;
        let q = lock(&ev.m);
        let fd = ev
            .event
            .get_or_create(|| q.len())
            .expect("an eventfd for the SRQ");
        fd.as_fd()
    }

    /// This object's handle in the protocol core's
    /// [`iwarp::verbs::Context`].
    pub fn id(&self) -> SrqId {
        self.inner.id
    }
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // No QP handle holds the SRQ any more: what is still queued is
        // discarded with it.
        self.wq.close();
        self.shared.engine().drop_srq(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::ConnParams;

    fn manual() -> Device {
        let cfg = DeviceConfig {
            progress: Progress::Manual,
            seed: Some(1),
            busy_poll: false,
        };
        Device::open(Backend::Kernel, cfg).unwrap()
    }

    fn init(dev: &Device) -> QpInit {
        let cq = dev.create_cq(16);
        QpInit {
            pd: dev.alloc_pd(),
            send_cq: cq.clone(),
            recv_cq: cq,
            sq_depth: 4,
            rq_depth: 4,
            sig_all: false,
            srq: None,
        }
    }

    /// Progress both devices until `f` holds (bounded).
    fn drive_until(a: &Device, b: &Device, mut f: impl FnMut() -> bool) {
        for _ in 0..20_000 {
            if f() {
                return;
            }
            a.progress();
            b.progress();
            std::thread::sleep(Duration::from_micros(100));
        }
        panic!("condition not reached");
    }

    /// A QP of `a` (made with `ia`) connected to one of `b` (with `ib`),
    /// both devices manual.
    fn connected(a: &Device, b: &Device, ia: QpInit, ib: QpInit) -> (Qp, Qp) {
        let l = b.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr();
        let b2 = b.clone();
        let t = std::thread::spawn(move || {
            let req = l.get_request(Some(Duration::from_secs(30))).unwrap();
            let qp = req.accept(ib, ConnParams::default()).unwrap();
            // Keep driving until the client is through.
            for _ in 0..50 {
                b2.progress();
                std::thread::sleep(Duration::from_millis(1));
            }
            qp
        });
        let qa = a.connect(addr, ia, ConnParams::default()).unwrap();
        (qa, t.join().unwrap())
    }

    #[test]
    fn dropped_qps_are_destroyed_after_close() {
        let (a, b) = (manual(), manual());
        let (qa, qb) = connected(&a, &b, init(&a), init(&b));
        assert_eq!(a.inner.shared.engine().conn_count(), 1);
        assert_eq!(b.inner.shared.engine().conn_count(), 1);
        drop(qa);
        drop(qb);
        drive_until(&a, &b, || {
            a.inner.shared.engine().conn_count() == 0 && b.inner.shared.engine().conn_count() == 0
        });
    }

    /// A receive queued because the poster found the device lock taken
    /// (a pass under way) is in the core before the Send it is for, when
    /// that pass reads the Send: a pass moves the queued work requests
    /// into the core before the core sees the input it reads.
    #[test]
    fn a_pass_moves_queued_receives_before_the_input_it_reads() {
        let (a, b) = (manual(), manual());
        let (ia, ib) = (init(&a), init(&b));
        let (pda, pdb, cqa, cqb) = (
            ia.pd.clone(),
            ib.pd.clone(),
            ia.send_cq.clone(),
            ib.recv_cq.clone(),
        );
        let (qa, qb) = connected(&a, &b, ia, ib);
        let src = a.reg_mr(&pda, 8, Access::LOCAL_WRITE).unwrap();
        let dst = b.reg_mr(&pdb, 8, Access::LOCAL_WRITE).unwrap();
        src.write(0, b"in time!");
        qa.post_send(&SendWr {
            wr_id: 1,
            op: iwarp::qp::SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sgl: &[src.sge(0, 8)],
            signaled: true,
        })
        .unwrap();
        // Only a runs: b reads nothing before the receive is posted.
        let mut wc = [crate::EMPTY_WC; 1];
        for _ in 0..20_000 {
            if cqa.poll(&mut wc) == 1 {
                break;
            }
            a.progress();
            std::thread::sleep(Duration::from_micros(100));
        }
        assert_eq!((wc[0].wr_id, wc[0].status), (1, crate::WcStatus::Success));
        // The Send is on its way to b; b's engine lock is taken, as by a
        // progress pass, when the receive for it is posted.
        {
            let mut e = b.inner.shared.engine();
            qb.post_recv(&RecvWr {
                wr_id: 7,
                sgl: &[dst.sge(0, 8)],
            })
            .unwrap();
            b.inner
                .shared
                .pass_when_ready(&mut e, Duration::from_secs(30));
        }
        drive_until(&a, &b, || cqb.poll(&mut wc) == 1);
        assert_eq!((wc[0].wr_id, wc[0].status), (7, crate::WcStatus::Success));
        let mut got = [0; 8];
        dst.read(0, &mut got);
        assert_eq!(&got, b"in time!");
        assert_eq!(qb.state(), QpState::Rts);
    }

    #[test]
    fn mr_is_zeroed_aligned_and_bounds_checked() {
        let dev = manual();
        let pd = dev.alloc_pd();
        let mr = dev.reg_mr(&pd, 10_000, Access::LOCAL_WRITE).unwrap();
        assert_eq!(mr.addr() % 4096, 0);
        assert_eq!(mr.len(), 10_000);
        let mut buf = vec![1; 10_000];
        mr.read(0, &mut buf);
        assert!(buf.iter().all(|&b| b == 0));
        mr.write(9_998, &[5, 6]);
        assert_eq!(mr.read_byte(9_999), 6);
        assert!(mr.wait_byte(9_998, 5, None));
        assert!(!mr.wait_byte(9_998, 6, Some(Duration::from_millis(1))));
        let sge = mr.sge(10, 20);
        assert_eq!(
            (sge.addr, sge.len, sge.lkey),
            (mr.addr() + 10, 20, mr.lkey())
        );
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mr.write(9_999, &[1, 2])));
        assert!(r.is_err());
        let other = manual().alloc_pd();
        assert!(dev.reg_mr(&other, 16, Access::LOCAL_WRITE).is_err());
        let empty = dev.reg_mr(&pd, 0, Access::LOCAL_WRITE).unwrap();
        assert!(empty.is_empty());
    }
}
