//! [`Engine`]: the state of one device behind its lock — the verbs
//! [`Context`], the clock, the application's completion queues, shared
//! receive queues and released objects — and its [`Transport`], the I/O
//! of one backend: kernel sockets ([`KernelIo`]) or the AF_XDP engines
//! ([`XdpSet`]). The engine owns what both backends share (moving
//! completions and SRQ events to the application, freeing released
//! objects); each transport owns only its sockets and their connections.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_queue::SegQueue;

use iwarp::cq::{CqId, QpId};
use iwarp::srq::SrqId;
use iwarp::time::Instant as CoreInstant;
use iwarp::verbs::{Context, VerbsError};
use mio::net::TcpListener;
use mio::{Events, Registry, Token};

use super::{lock, ConnShared, CqQueue, ListenShared, Released, Sock, SrqEvents};
use crate::cm::CmError;
use crate::kernel::KernelIo;
use crate::post::Posted;
use crate::xdp::set::{XdpRef, XdpSet};

/// The I/O of a device: one of the two backends, chosen when the device
/// opens. Calls dispatch on it once per operation or pass, never per
/// frame.
// One per device, inside the engine's mutex: matching on it reaches the
// transport's state in place, where a box would add an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Transport {
    /// Kernel TCP sockets, driven through mio.
    Kernel(KernelIo),
    /// The AF_XDP engines, one per receive queue, each with its own
    /// user-space TCP.
    Xdp(XdpSet),
}

impl Transport {
    /// The application changed `qp`: the transport visits it at its next
    /// pass.
    fn touch_qp(&mut self, qp: QpId) {
        match self {
            Self::Kernel(k) => k.touch_qp(qp),
            Self::Xdp(x) => x.touch_qp(qp),
        }
    }
}

/// The state of one device. See the module documentation.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) ctx: Context,
    /// The core clock's origin.
    pub(crate) epoch: std::time::Instant,
    pub(crate) io: Transport,
    /// The application's completion queues, by core CQ.
    cqs: HashMap<CqId, Arc<CqQueue>>,
    /// CQs whose application queue was full with completions left in the
    /// core: visited again at the next pass (and the application's poll
    /// of one kicks the engine).
    cq_backlog: Vec<CqId>,
    /// Scratch list of the CQs a pass visits.
    cq_visit: Vec<CqId>,
    /// PDs and CQs the application released ([`Released`]).
    pub(crate) released: Arc<SegQueue<Released>>,
    /// QPs with work requests queued by application threads
    /// ([`crate::post`]).
    pub(crate) posted: Arc<Posted>,
    /// Released PDs and CQs the core still refused, because QPs not yet
    /// destroyed use them: tried again on every pass until freed.
    dying: Vec<Released>,
    /// Shared receive queues the application holds, with their event
    /// queues.
    srqs: Vec<(SrqId, Arc<SrqEvents>)>,
    /// Shared receive queues the application dropped while core QPs
    /// (closing connections) were still attached: destroyed once they
    /// are gone.
    dying_srqs: Vec<SrqId>,
    /// Passes run.
    pub(crate) passes: u64,
}

impl Engine {
    /// A device on kernel sockets registered with `registry` (see
    /// [`Self::set_xdp`] for AF_XDP).
    pub(crate) fn new(seed: u64, registry: Registry) -> Self {
        Self {
            ctx: Context::new(seed),
            epoch: std::time::Instant::now(),
            io: Transport::Kernel(KernelIo::new(registry)),
            cqs: HashMap::new(),
            cq_backlog: Vec::new(),
            cq_visit: Vec::new(),
            released: Arc::new(SegQueue::new()),
            posted: Arc::default(),
            dying: Vec::new(),
            srqs: Vec::new(),
            dying_srqs: Vec::new(),
            passes: 0,
        }
    }

    /// The core's clock: time since the device was opened.
    pub(crate) fn now(&self) -> CoreInstant {
        let us = self.epoch.elapsed().as_micros();
        CoreInstant::from_micros(u64::try_from(us).unwrap_or(u64::MAX))
    }

    /// The AF_XDP engines, if the device runs on them.
    pub(crate) fn xdp(&self) -> Option<&XdpSet> {
        match &self.io {
            Transport::Xdp(x) => Some(x),
            Transport::Kernel(_) => None,
        }
    }

    /// Use the AF_XDP backend's engines. Their sockets join the epoll set
    /// only while a thread sleeps in it ([`super::sleep_armed`]).
    pub(crate) fn set_xdp(&mut self, engines: Vec<XdpRef>) {
        self.io = Transport::Xdp(XdpSet::new(engines));
    }

    pub(crate) fn add_cq(&mut self, id: CqId, q: Arc<CqQueue>) {
        self.cqs.insert(id, q);
    }

    pub(crate) fn add_srq(&mut self, id: SrqId, ev: Arc<SrqEvents>) {
        self.srqs.push((id, ev));
    }

    /// The application dropped its last handle of `srq` (and every QP
    /// handle on it): destroy it now, or once the core QPs of the
    /// connections still closing are destroyed.
    pub(crate) fn drop_srq(&mut self, srq: SrqId) {
        self.srqs.retain(|(id, _)| *id != srq);
        if self.ctx.destroy_srq(srq) == Err(VerbsError::Busy) {
            self.dying_srqs.push(srq);
        }
    }

    /// Move the core's SRQ events to the application's queues; destroy
    /// dropped SRQs whose QPs are gone.
    fn move_srq_events(&mut self) -> usize {
        let mut work = 0;
        for (id, ev) in &self.srqs {
            let mut moved = false;
            while let Some(e) = self.ctx.poll_srq_event(*id) {
                ev.push(&mut lock(&ev.m), e);
                moved = true;
                work += 1;
            }
            if moved {
                ev.cv.notify_all();
            }
        }
        if !self.dying_srqs.is_empty() {
            let ctx = &mut self.ctx;
            self.dying_srqs
                .retain(|&id| ctx.destroy_srq(id) == Err(VerbsError::Busy));
        }
        work
    }

    /// Listen on kernel socket `sock`.
    pub(crate) fn add_listener(&mut self, sock: TcpListener) -> io::Result<Arc<ListenShared>> {
        match &mut self.io {
            Transport::Kernel(k) => k.add_listener(sock),
            Transport::Xdp(_) => Err(io::ErrorKind::Unsupported.into()),
        }
    }

    /// Listen on every AF_XDP engine (one queue of requests).
    pub(crate) fn listen_xdp(
        &mut self,
        addr: SocketAddr,
    ) -> Result<(Arc<ListenShared>, SocketAddr), CmError> {
        match &mut self.io {
            Transport::Xdp(x) => x.listen(addr),
            Transport::Kernel(_) => Err(CmError::Closed),
        }
    }

    /// Start an outgoing connection on the AF_XDP engines.
    pub(crate) fn dial_xdp(
        &mut self,
        addr: SocketAddr,
        conn: Arc<ConnShared>,
    ) -> Result<(Sock, SocketAddr), CmError> {
        match &mut self.io {
            Transport::Xdp(x) => x.dial(addr, conn),
            Transport::Kernel(_) => Err(CmError::Closed),
        }
    }

    /// Stop listening: close the listener and every connection whose
    /// request has not reached the application yet.
    pub(crate) fn remove_listener(&mut self, shared: &Arc<ListenShared>) {
        match &mut self.io {
            Transport::Kernel(k) => k.remove_listener(shared),
            Transport::Xdp(x) => x.remove_listener(shared),
        }
    }

    /// Drive `qp` over `sock`; `input` are bytes already received.
    pub(crate) fn add_conn(
        &mut self,
        qp: QpId,
        sock: Sock,
        input: Vec<u8>,
        shared: Arc<ConnShared>,
    ) -> io::Result<()> {
        match (&mut self.io, sock) {
            (Transport::Kernel(k), Sock::Kernel(s)) => k.add_conn(qp, s, input, shared),
            (Transport::Xdp(x), Sock::Xdp(i, c)) => x.add_conn(qp, i, c, shared),
            _ => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    /// The application dropped its handle of `qp`: close gracefully and
    /// destroy the core QP once the connection is closed.
    pub(crate) fn release_qp(&mut self, qp: QpId) {
        self.ctx.disconnect(qp);
        let now = self.now();
        let driven = match &mut self.io {
            Transport::Kernel(k) => k.release_qp(qp),
            Transport::Xdp(x) => x.release_qp(qp, now),
        };
        if !driven {
            let _ = self.ctx.destroy_qp(qp);
        }
    }

    /// Turn pending QP events of `qp` into connection-manager state now.
    pub(crate) fn pass_events(&mut self, qp: QpId) {
        match &mut self.io {
            Transport::Kernel(k) => k.pass_events(&mut self.ctx, qp),
            Transport::Xdp(x) => x.pass_events(&mut self.ctx, qp),
        }
    }

    /// Send `bytes`, then close `sock`.
    pub(crate) fn linger(&mut self, sock: Sock, bytes: Vec<u8>) {
        match (&mut self.io, sock) {
            (Transport::Kernel(k), Sock::Kernel(s)) => k.linger(s, bytes),
            (Transport::Xdp(x), Sock::Xdp(i, c)) => x.linger(i, c, bytes),
            _ => {}
        }
    }

    /// Close a connection nobody will use.
    pub(crate) fn drop_sock(&mut self, sock: Sock) {
        if let (Transport::Xdp(x), Sock::Xdp(i, c)) = (&mut self.io, sock) {
            x.drop_sock(i, c);
        }
    }

    /// Close every connection (the device is going away).
    pub(crate) fn shutdown(&mut self) {
        let now = self.now();
        match &mut self.io {
            Transport::Kernel(k) => k.shutdown(&mut self.ctx, now),
            Transport::Xdp(x) => x.shutdown(&mut self.ctx, now),
        }
        self.move_completions();
    }

    /// When the next timer is due, if any (of AF_XDP engine `which`
    /// only, if given).
    pub(crate) fn next_deadline(&mut self, which: Option<usize>) -> Option<CoreInstant> {
        let now = self.now();
        match &mut self.io {
            Transport::Kernel(k) => k.next_deadline(now),
            Transport::Xdp(x) => x.next_deadline(which, now),
        }
    }

    /// The time until the next timer, capped at `cap`.
    fn sleep_for(&mut self, which: Option<usize>, cap: Option<Duration>) -> Option<Duration> {
        let timer = self
            .next_deadline(which)
            .map(|d| d.saturating_duration_since(self.now()));
        match (timer, cap) {
            (Some(t), Some(c)) => Some(t.min(c)),
            (t, c) => t.or(c),
        }
    }

    /// What a thread about to sleep for AF_XDP engine `which` (every
    /// engine: `None`) waits for: the earliest timer ([`Self::sleep_for`]
    /// with `cap`) and the engines' sockets with their tokens, for
    /// [`super::sleep_armed`].
    pub(crate) fn sleep_plan(
        &mut self,
        which: Option<usize>,
        cap: Option<Duration>,
    ) -> (Option<Duration>, Vec<(Token, i32)>) {
        let fds = match &self.io {
            Transport::Xdp(x) => x.fds(which),
            Transport::Kernel(_) => Vec::new(),
        };
        (self.sleep_for(which, cap), fds)
    }

    /// One progress pass, the clock read once. Returns a measure of the
    /// work done (0: nothing happened, the caller may sleep).
    /// With the AF_XDP backend: every engine, all steps under the device
    /// lock (manual progress; the progress threads use
    /// [`super::Shared::pass_engine`]). Either backend moves the work
    /// requests the application queued into the core after it takes
    /// input from the network and before the core sees that input.
    pub(crate) fn pass(&mut self) -> usize {
        let now = self.now();
        self.passes += 1;
        match &mut self.io {
            Transport::Xdp(x) => {
                let work = x.run_all(&mut self.ctx, now, &self.posted);
                work + self.move_completions()
            }
            Transport::Kernel(k) => {
                let work = k.pass(&mut self.ctx, now, &self.posted);
                let work = work + self.move_completions();
                match &mut self.io {
                    Transport::Kernel(k) => work + k.reap(&mut self.ctx),
                    Transport::Xdp(_) => work,
                }
            }
        }
    }

    /// Free in the core the PDs and CQs the application released; those
    /// QPs still use wait in `dying` (a QP lingers after its handle is
    /// dropped, until its connection closes). Returns how many were freed.
    fn free_released(&mut self) -> usize {
        if self.dying.is_empty() && self.released.is_empty() {
            return 0;
        }
        let mut todo = std::mem::take(&mut self.dying);
        while let Some(r) = self.released.pop() {
            todo.push(r);
        }
        let mut freed = 0;
        for r in todo {
            let result = match r {
                Released::Pd(pd) => self.ctx.dealloc_pd(pd),
                Released::Cq(cq) => self.ctx.destroy_cq(cq).inspect(|()| {
                    self.cqs.remove(&cq);
                }),
            };
            match result {
                Ok(()) => freed += 1,
                Err(VerbsError::Busy) => self.dying.push(r),
                Err(_) => {}
            }
        }
        freed
    }

    /// Move completions from the core's CQs into the application's queues
    /// (and SRQ events into theirs). A queue holding `capacity` entries
    /// takes no more: the core's CQ fills and eventually overruns, as a
    /// verbs CQ would. Then free what the application released.
    pub(crate) fn move_completions(&mut self) -> usize {
        let mut work = self.free_released();
        work += self.move_srq_events();
        // Only the CQs given completions since the last pass, and those
        // left with a full application queue: never every CQ.
        let mut visit = std::mem::take(&mut self.cq_visit);
        visit.clear();
        for id in self.cq_backlog.drain(..) {
            if let Some(q) = self.cqs.get(&id) {
                q.backlogged.store(false, Ordering::SeqCst);
            }
            visit.push(id);
        }
        self.ctx.take_ready_cqs(&mut visit);
        for &id in &visit {
            let Some(q) = self.cqs.get(&id) else {
                continue;
            };
            let Some(core) = self.ctx.cq(id) else {
                continue;
            };
            if core.is_empty() {
                continue;
            }
            // A notification armed by `Cq::req_notify` fired on a
            // completion pushed since the last pass: counted before the
            // completions become visible to the application.
            if core.take_event() {
                q.notify();
            }
            if Arc::strong_count(q) == 1 {
                // Nobody holds the queue any more: discard.
                while core.poll_one().is_some() {}
                continue;
            }
            let mut n = 0;
            while !q.q.is_full() {
                let Some(wc) = core.poll_one() else { break };
                // Only this thread pushes: there is room.
                let _ = q.q.push(wc);
                n += 1;
            }
            if !core.is_empty() && !q.backlogged.swap(true, Ordering::SeqCst) {
                self.cq_backlog.push(id);
            }
            if n > 0 {
                work += n;
                q.wake();
            }
        }
        self.cq_visit = visit;
        work
    }

    /// Connections driven by the core.
    pub(crate) fn conn_count(&self) -> usize {
        match &self.io {
            Transport::Kernel(k) => k.conn_count(),
            Transport::Xdp(x) => x.conn_count(),
        }
    }

    /// The application changed `qp` (posted to it, disconnected it): the
    /// transport visits it at its next pass.
    pub(crate) fn touch_qp(&mut self, qp: QpId) {
        self.io.touch_qp(qp);
    }

    /// Move the work requests queued on the posted list into the core
    /// ([`Posted::drain`]); the QPs that got some are visited. Returns
    /// how many moved.
    pub(crate) fn drain_posted(&mut self) -> usize {
        let io = &mut self.io;
        self.posted.drain(&mut self.ctx, |qp| io.touch_qp(qp))
    }

    /// Visits of connections outside the core's hands so far: accepted
    /// ones whose MPA request is arriving, outgoing TCP connects,
    /// lingering and draining sockets.
    pub(crate) fn lifecycle_visits(&self) -> u64 {
        match &self.io {
            Transport::Kernel(k) => k.lifecycle_visits,
            Transport::Xdp(x) => x.lifecycle_visits(),
        }
    }

    /// Kernel backend: sockets the poller reported ready.
    pub(crate) fn readiness(&mut self, events: &Events) {
        if let Transport::Kernel(k) = &mut self.io {
            k.readiness(events);
        }
    }
}
