//! The kernel-socket transport: the protocol core driven over `std::net`
//! TCP sockets in non-blocking mode.
//!
//! [`KernelIo`] holds every socket of a device that runs on kernel TCP;
//! it is the [`crate::runtime::Transport`] of the device's engine
//! ([`crate::runtime::Engine`], behind one mutex,
//! [`crate::runtime::Shared::engine`]). Connection setup locks it and
//! calls the core directly; work requests do not take it: they go through
//! per-QP lock-free queues ([`crate::post`]) that a pass empties into the
//! core first. Either way the caller then
//! [`crate::runtime::Shared::kick`]s the progress thread. The I/O of a
//! progress pass ([`KernelIo::pass`]) visits each connection with
//! something to do (its socket reported ready, its QP touched by the
//! application, its core timer due: `crate::slots`): it reads into a
//! reused buffer and feeds the core, writes what the core transmits
//! (keeping what the socket did not take) and turns QP events into
//! connection-manager state; the engine then moves completions into the
//! application's queues.
//!
//! Sleeping and edge-triggered readiness ([`KernelIo::readiness`]) are
//! described in `docs/design.md` ("Threading and progress").

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;

use iwarp::cq::QpId;
use iwarp::time::{Duration as CoreDuration, Instant as CoreInstant};
use iwarp::verbs::Context;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Registry, Token};

use crate::post::Posted;
use crate::runtime::established::{Driven, Ending, Stream, Transmitted};
use crate::runtime::lifecycle::{self, Accepting, Fed, Reply};
use crate::runtime::{ConnShared, ListenShared, Sock};
use crate::slots::{slotted_without_qp, ConnSlots, Slotted};

/// Size of the receive buffer and of the largest transmit batch.
const IO_BUF: usize = 256 * 1024;
/// The bytes the connections' backlogs may hold together: the bytes a
/// connection takes from the core per transmit batch are this over the
/// connections with a backlog (one more than them), between
/// [`TX_BATCH_MIN`] and [`IO_BUF`]. What a socket does not take of a
/// batch waits in the connection's backlog, so the batch bounds it; what
/// the core keeps costs nothing (it builds FPDUs from the application's
/// memory as it is asked for them). One connection sends in whole
/// [`IO_BUF`] batches; a thousand that all push back keep 16 KiB each.
const TX_SHARE: usize = 4 << 20;
/// The smallest transmit batch: a whole FPDU of the largest size.
const TX_BATCH_MIN: usize = 16 * 1024;
/// A connection's backlog buffer is freed once empty if it grew past this.
const OUT_KEEP: usize = 16 * 1024;
/// Reads (and transmit batches) per socket and pass, for fairness.
const IO_BUDGET: usize = 8;

/// A connection driven by the core.
#[derive(Debug)]
struct Conn {
    /// The core's side of the connection.
    core: Driven,
    sock: Option<TcpStream>,
    /// Bytes from `poll_transmit` the socket has not taken yet, from
    /// `out_pos` on (allocated only while the socket pushes back).
    out: Vec<u8>,
    out_pos: usize,
    /// Counted in [`KernelIo::backlogged`]: `out` holds bytes.
    backlogged: bool,
    /// Received bytes the core has not consumed yet.
    input: Vec<u8>,
    /// The application no longer holds the QP: destroy it once closed.
    orphan: bool,
    /// The socket's poll token.
    token: Token,
    /// On the list of connections the next pass visits.
    hot: bool,
    /// The core timer of the QP's entry in the timer heap.
    timer: Option<CoreInstant>,
}

impl Slotted for Conn {
    type Key = Token;
    fn key(&self) -> Token {
        self.token
    }
    fn qp(&self) -> Option<QpId> {
        Some(self.core.qp())
    }
    fn hot(&mut self) -> &mut bool {
        &mut self.hot
    }
    fn timer(&mut self) -> &mut Option<CoreInstant> {
        &mut self.timer
    }
}

/// An accepted TCP connection whose MPA request is still arriving:
/// visited when its socket becomes readable or its handshake deadline
/// passes.
#[derive(Debug)]
struct Pending {
    sock: TcpStream,
    peer: SocketAddr,
    acc: Accepting,
    token: Token,
    hot: bool,
    timer: Option<CoreInstant>,
}

#[derive(Debug)]
struct Listening {
    sock: TcpListener,
    shared: Arc<ListenShared>,
}

/// A socket that only has bytes left to send before it is closed (an MPA
/// reply rejecting a request): visited when it becomes writable.
#[derive(Debug)]
struct Lingering {
    sock: TcpStream,
    reply: Reply,
    token: Token,
    hot: bool,
    timer: Option<CoreInstant>,
}

/// A closed connection whose FIN is queued behind its last bytes (a
/// Terminate, or an MPA reply rejecting a request): its input is read and
/// discarded until the peer closes or `until` passes. Closing a socket
/// with unread input makes Linux send a RST, which can overtake what was
/// still queued. Visited when the socket becomes readable or `until`
/// passes.
#[derive(Debug)]
struct Draining {
    sock: TcpStream,
    until: CoreInstant,
    token: Token,
    hot: bool,
    timer: Option<CoreInstant>,
}

/// How long a closed connection's input is drained at most.
const DRAIN: CoreDuration = CoreDuration::from_secs(2);

slotted_without_qp!(Pending, Token, token);
slotted_without_qp!(Lingering, Token, token);
slotted_without_qp!(Draining, Token, token);

/// The kernel-socket transport of a device: its sockets and the
/// connections over them. See the module documentation.
#[derive(Debug)]
pub(crate) struct KernelIo {
    registry: Registry,
    next_token: usize,
    /// The connections the core drives, the ones the next pass visits
    /// (readiness, the application's posts, due timers), their QPs'
    /// timers.
    conns: ConnSlots<Conn>,
    /// Slots of connections the application dropped whose socket a
    /// visit of this pass found closed: [`Self::reap`] destroys their QPs.
    finished: Vec<usize>,
    /// Accepted connections whose MPA request is arriving, lingering
    /// replies and draining sockets; a pass visits those whose socket
    /// became ready or whose deadline passed.
    pending: ConnSlots<Pending>,
    listeners: Vec<Listening>,
    lingering: ConnSlots<Lingering>,
    draining: ConnSlots<Draining>,
    /// Visits of `pending`, `lingering` and `draining` entries and of
    /// connections the application dropped.
    pub(crate) lifecycle_visits: u64,
    rx_buf: Vec<u8>,
    /// Where `poll_transmit` writes; what a socket does not take moves to
    /// its connection's `out`.
    tx_buf: Vec<u8>,
    /// Connections whose `out` holds bytes (see [`TX_SHARE`]).
    backlogged: usize,
    /// QPs whose queued work requests a drain moved into the core in the
    /// middle of a pass: visited at the next.
    touched: Vec<QpId>,
}

impl KernelIo {
    /// Sockets register with `registry` (the device's poller).
    pub(crate) fn new(registry: Registry) -> Self {
        Self {
            registry,
            next_token: 1,
            conns: ConnSlots::default(),
            finished: Vec::new(),
            pending: ConnSlots::default(),
            listeners: Vec::new(),
            lingering: ConnSlots::default(),
            draining: ConnSlots::default(),
            lifecycle_visits: 0,
            rx_buf: vec![0; IO_BUF],
            tx_buf: vec![0; IO_BUF],
            backlogged: 0,
            touched: Vec::new(),
        }
    }

    fn token(&mut self) -> Token {
        let t = Token(self.next_token);
        self.next_token += 1;
        t
    }

    pub(crate) fn add_listener(&mut self, mut sock: TcpListener) -> io::Result<Arc<ListenShared>> {
        let token = self.token();
        self.registry
            .register(&mut sock, token, Interest::READABLE)?;
        let shared = Arc::new(ListenShared::default());
        self.listeners.push(Listening {
            sock,
            shared: shared.clone(),
        });
        Ok(shared)
    }

    /// Stop listening: close the socket and every connection whose request
    /// has not reached the application yet.
    pub(crate) fn remove_listener(&mut self, shared: &Arc<ListenShared>) {
        let registry = &self.registry;
        self.listeners.retain_mut(|l| {
            let keep = !Arc::ptr_eq(&l.shared, shared);
            if !keep {
                let _ = registry.deregister(&mut l.sock);
            }
            keep
        });
        self.pending.retain(|p| {
            let keep = !Arc::ptr_eq(p.acc.listener(), shared);
            if !keep {
                let _ = registry.deregister(&mut p.sock);
            }
            keep
        });
    }

    /// Drive `qp` over `sock`; `input` are bytes already received.
    pub(crate) fn add_conn(
        &mut self,
        qp: QpId,
        mut sock: TcpStream,
        input: Vec<u8>,
        shared: Arc<ConnShared>,
    ) -> io::Result<()> {
        let token = self.token();
        self.registry
            .register(&mut sock, token, Interest::READABLE | Interest::WRITABLE)?;
        self.conns.insert(Conn {
            core: Driven::new(qp, shared),
            sock: Some(sock),
            out: Vec::new(),
            out_pos: 0,
            backlogged: false,
            input,
            orphan: false,
            token,
            hot: false,
            timer: None,
        });
        Ok(())
    }

    /// The application dropped its handle of `qp` (already disconnected
    /// in the core): destroy the core QP once the socket is closed.
    /// Returns false if no connection drives `qp` (the caller destroys
    /// it).
    pub(crate) fn release_qp(&mut self, qp: QpId) -> bool {
        let Some(i) = self.conns.of_qp(qp) else {
            return false;
        };
        if let Some(c) = self.conns.get_mut(i) {
            c.orphan = true;
        }
        // The visit closes the socket or finds it closed.
        self.conns.mark(i);
        true
    }

    /// Turn pending QP events of `qp` into connection-manager state now.
    pub(crate) fn pass_events(&mut self, ctx: &mut Context, qp: QpId) {
        if let Some(c) = self.conns.of_qp(qp).and_then(|i| self.conns.get(i)) {
            c.core.events(ctx);
        }
    }

    /// Send `bytes`, then close `sock`.
    pub(crate) fn linger(&mut self, mut sock: TcpStream, bytes: Vec<u8>) {
        let token = self.token();
        if self
            .registry
            .register(&mut sock, token, Interest::WRITABLE)
            .is_ok()
        {
            self.lingering.insert(Lingering {
                sock,
                reply: Reply::new(bytes),
                token,
                hot: false,
                timer: None,
            });
        }
    }

    /// Close every socket (the device is going away).
    pub(crate) fn shutdown(&mut self, ctx: &mut Context, now: CoreInstant) {
        for c in self.conns.iter_mut() {
            if let Some(mut s) = c.sock.take() {
                let _ = self.registry.deregister(&mut s);
                let _ = s.shutdown(Shutdown::Both);
            }
            c.core.shut(ctx);
        }
        self.listeners.clear();
        self.pending.clear();
        // A reject reply still queued goes out before its socket closes.
        self.lingering.mark_all();
        self.pump_lingering(now);
        self.lingering.clear();
    }

    /// When the next timer is due, if any.
    pub(crate) fn next_deadline(&mut self, now: CoreInstant) -> Option<CoreInstant> {
        let hot = (self.conns.any_hot()
            || self.pending.any_hot()
            || self.lingering.any_hot()
            || self.draining.any_hot())
        .then_some(now);
        [
            self.conns.next_timer(),
            self.pending.next_timer(),
            self.draining.next_timer(),
            hot,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The I/O of one progress pass at `now`: move the work requests
    /// `posted` into the core, accept, read MPA requests, visit the
    /// connections with something to do, write lingering replies, drain
    /// closed sockets. The caller then moves completions and
    /// [`Self::reap`]s. Returns a measure of the work done.
    pub(crate) fn pass(&mut self, ctx: &mut Context, now: CoreInstant, posted: &Posted) -> usize {
        let mut work = self.drain_posted(ctx, posted);
        work += self.accept_new(now);
        work += self.pump_pending(now);
        self.conns.fire(now);
        let hot = self.conns.take_hot();
        for &i in &hot {
            work += self.pump_conn(ctx, i, now, posted);
            let Some(c) = self.conns.get(i) else {
                continue;
            };
            if c.orphan {
                self.lifecycle_visits += 1;
                if c.sock.is_none() {
                    self.finished.push(i);
                    continue;
                }
            }
            let timer = ctx.poll_timeout(c.core.qp());
            self.conns.schedule(i, timer);
        }
        self.conns.give_back(hot);
        while let Some(qp) = self.touched.pop() {
            self.touch_qp(qp);
        }
        work += self.pump_lingering(now);
        self.pump_draining(now);
        work
    }

    /// Move the work requests `posted` into the core; their QPs'
    /// connections are visited in this pass.
    fn drain_posted(&mut self, ctx: &mut Context, posted: &Posted) -> usize {
        let conns = &mut self.conns;
        posted.drain(ctx, |qp| mark_qp(conns, qp))
    }

    fn accept_new(&mut self, now: CoreInstant) -> usize {
        let mut work = 0;
        for li in 0..self.listeners.len() {
            loop {
                let (mut sock, peer) = match self.listeners[li].sock.accept() {
                    Ok((sock, peer)) => (sock, canonical(peer)),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break, // WouldBlock, or a connection reset before accept
                };
                work += 1;
                tracing::debug!(%peer, "TCP connection accepted");
                let _ = sock.set_nodelay(true);
                let token = self.token();
                if self
                    .registry
                    .register(&mut sock, token, Interest::READABLE)
                    .is_err()
                {
                    continue;
                }
                let acc = Accepting::new(self.listeners[li].shared.clone(), now);
                let deadline = acc.deadline();
                let i = self.pending.insert(Pending {
                    sock,
                    peer,
                    acc,
                    token,
                    hot: false,
                    timer: None,
                });
                self.pending.schedule(i, deadline);
            }
        }
        work
    }

    /// Read MPA requests of the accepted connections whose socket became
    /// readable or whose deadline passed; hand complete ones to their
    /// listener.
    fn pump_pending(&mut self, now: CoreInstant) -> usize {
        let mut work = 0;
        self.pending.fire(now);
        let hot = self.pending.take_hot();
        for &i in &hot {
            work += self.pump_one_pending(i, now);
        }
        self.pending.give_back(hot);
        work
    }

    fn pump_one_pending(&mut self, i: usize, now: CoreInstant) -> usize {
        let mut work = 0;
        let Some(p) = self.pending.get_mut(i) else {
            return 0;
        };
        self.lifecycle_visits += 1;
        let mut outcome = None;
        if p.acc.expired(now) {
            outcome = Some(Err("timed out waiting for the MPA request".to_string()));
        }
        while outcome.is_none() {
            // Small reads: what follows the request stays in the socket
            // until the QP exists.
            let mut s: &TcpStream = &p.sock;
            match s.read(&mut self.rx_buf[..4096]) {
                Ok(0) => outcome = Some(Err("closed by the peer".to_string())),
                Ok(n) => {
                    work += n;
                    let chunk = &self.rx_buf[..n];
                    match p.acc.feed(chunk, now) {
                        (_, Fed::More) => {}
                        (used, Fed::Request(req)) => {
                            outcome = Some(Ok((req, chunk[used..].to_vec())));
                        }
                        (_, Fed::Failed(reason)) => outcome = Some(Err(reason)),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => outcome = Some(Err(e.to_string())),
            }
        }
        let Some(r) = outcome else {
            // Readiness is edge-triggered and the socket is read dry: the
            // next visit comes with new bytes or the deadline.
            let deadline = p.acc.deadline();
            self.pending.schedule(i, deadline);
            return work;
        };
        let Some(mut p) = self.pending.remove(i) else {
            return work;
        };
        let _ = self.registry.deregister(&mut p.sock);
        work += 1;
        match r {
            Ok((request, rest)) => {
                let local = p.sock.local_addr().map_or(p.peer, canonical);
                let emss = emss_of(&p.sock);
                p.acc
                    .hand_over(request, Sock::Kernel(p.sock), p.peer, local, emss, rest);
            }
            Err(reason) => lifecycle::dropped(Some(p.peer), &reason),
        }
        work
    }

    fn pump_conn(
        &mut self,
        ctx: &mut Context,
        i: usize,
        now: CoreInstant,
        posted: &Posted,
    ) -> usize {
        let batch = (TX_SHARE / (self.backlogged + 1)).clamp(TX_BATCH_MIN, IO_BUF);
        let Some(c) = self.conns.get_mut(i) else {
            return 0;
        };
        let mut io = KernelStream {
            sock: &mut c.sock,
            out: &mut c.out,
            out_pos: &mut c.out_pos,
            input: &mut c.input,
            rx_buf: &mut self.rx_buf,
            tx_buf: &mut self.tx_buf[..batch],
            registry: &self.registry,
            posted,
            touched: &mut self.touched,
            again: false,
            closed: None,
            drain: None,
        };
        let work = c.core.visit(ctx, &mut io, now);
        let (again, drain) = (io.again, io.drain.take());
        let backlog = c.out_pos < c.out.len();
        if backlog != c.backlogged {
            c.backlogged = backlog;
            if backlog {
                self.backlogged += 1;
            } else {
                self.backlogged -= 1;
            }
        }
        if again && c.sock.is_some() {
            self.conns.mark(i);
        }
        if let Some(s) = drain {
            self.start_draining(s, now);
        }
        work
    }

    /// Send our FIN after what is queued and drain `sock` from `now` on
    /// (see [`Draining`]); a socket that cannot take the FIN, or cannot be
    /// registered, is shut down at once.
    fn start_draining(&mut self, mut sock: TcpStream, now: CoreInstant) {
        if sock.shutdown(Shutdown::Write).is_err() {
            let _ = sock.shutdown(Shutdown::Both);
            return;
        }
        let token = self.token();
        if self
            .registry
            .register(&mut sock, token, Interest::READABLE)
            .is_err()
        {
            let _ = sock.shutdown(Shutdown::Both);
            return;
        }
        let until = now + DRAIN;
        let i = self.draining.insert(Draining {
            sock,
            until,
            token,
            hot: false,
            timer: None,
        });
        self.draining.schedule(i, Some(until));
    }

    /// Read and discard the input of the closed connections whose socket
    /// became readable or whose deadline passed, until the peer's FIN, an
    /// error or the deadline; then drop them.
    fn pump_draining(&mut self, now: CoreInstant) {
        self.draining.fire(now);
        if !self.draining.any_hot() {
            return;
        }
        let mut buf = [0u8; 4096];
        let hot = self.draining.take_hot();
        for &i in &hot {
            let Some(d) = self.draining.get_mut(i) else {
                continue;
            };
            self.lifecycle_visits += 1;
            let keep = loop {
                match (&mut &d.sock).read(&mut buf) {
                    Ok(0) => break false,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break now < d.until,
                    Err(_) => break false,
                }
            };
            if keep {
                let until = d.until;
                self.draining.schedule(i, Some(until));
            } else if let Some(mut d) = self.draining.remove(i) {
                let _ = self.registry.deregister(&mut d.sock);
            }
        }
        self.draining.give_back(hot);
    }

    /// Write what the lingering sockets that became writable have left; a
    /// socket whose bytes all left gets its FIN and drains its input (see
    /// [`Draining`]).
    fn pump_lingering(&mut self, now: CoreInstant) -> usize {
        let mut work = 0;
        let hot = self.lingering.take_hot();
        for &i in &hot {
            let Some(l) = self.lingering.get_mut(i) else {
                continue;
            };
            self.lifecycle_visits += 1;
            // Some(true): all written; Some(false): the socket failed.
            let done = match l.reply.write(|b| write_some(&l.sock, b)) {
                Ok(n) => {
                    work += n;
                    l.reply.sent().then_some(true)
                }
                Err(_) => Some(false),
            };
            let Some(written) = done else {
                // The socket's writable edge brings it back.
                continue;
            };
            if let Some(mut l) = self.lingering.remove(i) {
                let _ = self.registry.deregister(&mut l.sock);
                if written {
                    self.start_draining(l.sock, now);
                }
                work += 1;
            }
        }
        self.lingering.give_back(hot);
        work
    }

    /// Destroy the core QPs of the connections the application dropped
    /// that this pass's visits found closed (those still closing wait
    /// for the visit their socket's readiness or their QP's timer
    /// brings).
    pub(crate) fn reap(&mut self, ctx: &mut Context) -> usize {
        let mut n = 0;
        let mut finished = std::mem::take(&mut self.finished);
        for i in finished.drain(..) {
            if !self
                .conns
                .get(i)
                .is_some_and(|c| c.orphan && c.sock.is_none())
            {
                continue;
            }
            if let Some(c) = self.conns.remove(i) {
                self.backlogged -= usize::from(c.backlogged);
                c.core.events(ctx);
                let _ = ctx.destroy_qp(c.core.qp());
                n += 1;
            }
        }
        self.finished = finished;
        n
    }

    /// Connections driven by the core.
    pub(crate) fn conn_count(&self) -> usize {
        self.conns.len()
    }

    /// The application changed `qp` (posted to it, disconnected it): its
    /// connection is visited at the next pass.
    pub(crate) fn touch_qp(&mut self, qp: QpId) {
        mark_qp(&mut self.conns, qp);
    }

    /// Sockets the poller reported ready: their connections (accepted,
    /// driven, lingering or draining) are visited at the next pass.
    pub(crate) fn readiness(&mut self, events: &Events) {
        for ev in events {
            let t = ev.token();
            if let Some(i) = self.conns.of_key(t) {
                self.conns.mark(i);
            } else if let Some(i) = self.pending.of_key(t) {
                self.pending.mark(i);
            } else if let Some(i) = self.lingering.of_key(t) {
                self.lingering.mark(i);
            } else if let Some(i) = self.draining.of_key(t) {
                self.draining.mark(i);
            }
        }
    }
}

/// A driven connection's socket and buffers during one visit: the
/// [`Stream`] its core's visit reads and writes.
struct KernelStream<'a> {
    sock: &'a mut Option<TcpStream>,
    out: &'a mut Vec<u8>,
    out_pos: &'a mut usize,
    input: &'a mut Vec<u8>,
    rx_buf: &'a mut [u8],
    /// Where `poll_transmit` writes: one transmit batch (see
    /// [`TX_SHARE`]).
    tx_buf: &'a mut [u8],
    registry: &'a Registry,
    posted: &'a Posted,
    touched: &'a mut Vec<QpId>,
    /// Readiness is edge-triggered: the visit left bytes in the socket
    /// (its budget spent, or the core's input still full) or more to
    /// send, so the connection comes back at the next pass.
    again: bool,
    /// Closed by this visit: `Some(reset)`.
    closed: Option<bool>,
    /// Closed after what was sent: its FIN goes out and its input is
    /// drained ([`Draining`]).
    drain: Option<TcpStream>,
}

impl Stream for KernelStream<'_> {
    fn gone(&self) -> bool {
        self.sock.is_none()
    }

    fn receive(
        &mut self,
        ctx: &mut Context,
        core: &Driven,
        now: CoreInstant,
    ) -> (usize, Option<Ending>) {
        let Some(sock) = self.sock.as_ref() else {
            return (0, None);
        };
        let mut work = 0;
        if !self.input.is_empty() {
            let used = core.input(ctx, self.input, now);
            self.input.drain(..used.min(self.input.len()));
            work += used;
            if !self.input.is_empty() {
                // Read no more until the core takes what it holds.
                self.again = used > 0;
                return (work, None);
            }
        }
        let mut s: &TcpStream = sock;
        self.again = true;
        for _ in 0..IO_BUDGET {
            match s.read(self.rx_buf) {
                Ok(0) => {
                    self.again = false;
                    return (work, Some(Ending::Fin));
                }
                Ok(n) => {
                    work += n;
                    // A receive posted before the peer sent these bytes
                    // is queued by now: it reaches the core before they
                    // do.
                    if !self.posted.is_empty() {
                        let touched = &mut *self.touched;
                        work += self.posted.drain(ctx, |q| touched.push(q));
                    }
                    let used = core.input(ctx, &self.rx_buf[..n], now);
                    if used < n {
                        self.input.extend_from_slice(&self.rx_buf[used..n]);
                        self.again = used > 0;
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.again = false;
                    break;
                }
                Err(e) => {
                    self.again = false;
                    return (work, Some(Ending::Failed(e.kind(), "I/O error")));
                }
            }
        }
        (work, None)
    }

    /// What the socket did not take last time, then fresh bytes from the
    /// core, written from the engine's buffer; what the socket does not
    /// take waits in `out`.
    fn transmit(&mut self, ctx: &mut Context, qp: QpId) -> Transmitted {
        let mut t = Transmitted::default();
        let Some(s) = self.sock.as_ref() else {
            t.drained = true;
            return t;
        };
        // The socket took less than offered: its writable event brings
        // the connection back.
        let mut pushed_back = false;
        'out: for _ in 0..IO_BUDGET {
            if *self.out_pos < self.out.len() {
                match write_some(s, &self.out[*self.out_pos..]) {
                    Ok(n) => {
                        *self.out_pos += n;
                        t.work += n;
                    }
                    Err(kind) => {
                        t.failed = Some(kind);
                        break;
                    }
                }
                if *self.out_pos < self.out.len() {
                    pushed_back = true;
                    break;
                }
                *self.out_pos = 0;
                self.out.clear();
                if self.out.capacity() > OUT_KEEP {
                    *self.out = Vec::new();
                }
            }
            let n = ctx.poll_transmit(qp, self.tx_buf);
            if n == 0 {
                t.drained = true;
                break;
            }
            let mut pos = 0;
            while pos < n {
                match write_some(s, &self.tx_buf[pos..n]) {
                    Ok(0) => {
                        self.out.extend_from_slice(&self.tx_buf[pos..n]);
                        pushed_back = true;
                        break 'out;
                    }
                    Ok(k) => {
                        pos += k;
                        t.work += k;
                    }
                    Err(kind) => {
                        t.failed = Some(kind);
                        break 'out;
                    }
                }
            }
        }
        // The budget ran out with more to send.
        self.again |= t.failed.is_none() && !t.drained && !pushed_back;
        t
    }

    /// A kernel socket closes within the visit that closes it.
    fn closing(&self) -> bool {
        false
    }

    /// A failed socket is shut down at once (a reset socket carries
    /// nothing more); otherwise its FIN follows what it holds and its
    /// input is drained.
    fn close(&mut self, failed: bool) {
        if let Some(mut s) = self.sock.take() {
            let _ = self.registry.deregister(&mut s);
            if failed {
                let _ = s.shutdown(Shutdown::Both);
            } else {
                self.drain = Some(s);
            }
            self.closed = Some(failed);
        }
        *self.out = Vec::new();
        *self.out_pos = 0;
        *self.input = Vec::new();
    }

    fn closed(&mut self) -> Option<bool> {
        self.closed.take()
    }
}

/// A non-blocking listening socket on `addr` and the address it got
/// (the port the OS picked for port 0). On an IPv6 address it takes
/// IPv4 connections too unless `v6_only` (`IPV6_V6ONLY`, set either way
/// so that the system default does not decide).
pub(crate) fn listen_socket(
    addr: SocketAddr,
    v6_only: bool,
) -> io::Result<(TcpListener, SocketAddr)> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(v6_only)?;
    }
    s.bind(&addr.into())?;
    s.listen(libc::SOMAXCONN)?;
    s.set_nonblocking(true)?;
    let std = std::net::TcpListener::from(s);
    let addr = std.local_addr()?;
    Ok((TcpListener::from_std(std), addr))
}

/// `a` with an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, what a dual-
/// stack listener reports for an IPv4 peer) written as the IPv4 address
/// it is.
pub(crate) fn canonical(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(ip) => SocketAddr::from((ip, v6.port())),
            None => a,
        },
        SocketAddr::V4(_) => a,
    }
}

/// The largest FPDU we send on `sock`: the TCP MSS (`TCP_MAXSEG`), at
/// most 16 KiB (loopback reports ~64 KiB), at least 512 bytes.
pub(crate) fn emss_of(sock: &TcpStream) -> usize {
    socket2::SockRef::from(sock)
        .mss()
        .ok()
        .and_then(|m| usize::try_from(m).ok())
        .filter(|&m| m > 0)
        .unwrap_or(1460)
        .clamp(512, 16384)
}

/// Write what `s` takes of `buf` now: `Ok(0)` if it would block.
fn write_some(mut s: &TcpStream, buf: &[u8]) -> Result<usize, io::ErrorKind> {
    loop {
        match s.write(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
            Err(e) => return Err(e.kind()),
        }
    }
}

/// Visit `qp`'s connection at the next pass, if it has one.
fn mark_qp(conns: &mut ConnSlots<Conn>, qp: QpId) {
    if let Some(i) = conns.of_qp(qp) {
        conns.mark(i);
    }
}
