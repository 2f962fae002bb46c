//! [`XdpSet`]: the AF_XDP transport of a device — its engines
//! ([`XdpIo`], one per receive queue, each behind its own lock), which
//! engine drives each QP, and the QPs the application changed since each
//! engine's last pass.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use iwarp::cq::QpId;
use iwarp::time::Instant as CoreInstant;
use iwarp::verbs::Context;
use iwarp_tcp::ConnId;
use mio::Token;

use super::worker::XdpIo;
use crate::cm::CmError;
use crate::post::Posted;
use crate::runtime::{lock, ConnShared, ListenShared, Sock, XSK};

/// An AF_XDP engine behind its own lock (taken after the device's, never
/// before it): a multi-core device's progress threads run their engine's
/// I/O steps holding only that lock.
pub(crate) type XdpRef = Arc<Mutex<XdpIo>>;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct XdpSet {
    /// The engines, one per receive queue; empty once the device shut
    /// down.
    engines: Vec<XdpRef>,
    /// Round-robin start of the engine choice of outgoing connections.
    next_dial: usize,
    /// The engine that drives each QP of a connection.
    homes: HashMap<QpId, usize>,
    /// Per engine, the QPs the application changed since its last pass
    /// ([`Self::touch_qp`]).
    touched: Vec<Vec<QpId>>,
    /// QPs the engines destroyed in the current pass.
    reaped: Vec<QpId>,
}

impl XdpSet {
    pub(crate) fn new(engines: Vec<XdpRef>) -> Self {
        Self {
            touched: vec![Vec::new(); engines.len()],
            engines,
            next_dial: 0,
            homes: HashMap::new(),
            reaped: Vec::new(),
        }
    }

    /// The engines.
    pub(crate) fn engines(&self) -> &[XdpRef] {
        &self.engines
    }

    /// Listen on every engine (one queue of requests).
    pub(crate) fn listen(
        &mut self,
        addr: SocketAddr,
    ) -> Result<(Arc<ListenShared>, SocketAddr), CmError> {
        let first = self.engines.first().ok_or(CmError::Closed)?;
        let port = lock(first).listen_port(addr)?;
        let shared = Arc::new(ListenShared::default());
        let mut bound = None;
        for k in 0..self.engines.len() {
            let r = lock(&self.engines[k]).listen(port, &shared);
            match r {
                Ok(a) => bound = Some(a),
                Err(e) => {
                    for x in &self.engines[..k] {
                        lock(x).remove_listener(&shared);
                    }
                    return Err(e);
                }
            }
        }
        Ok((shared, bound.ok_or(CmError::Closed)?))
    }

    /// Start an outgoing connection on the least-loaded engine (ties:
    /// round robin).
    pub(crate) fn dial(
        &mut self,
        addr: SocketAddr,
        conn: Arc<ConnShared>,
    ) -> Result<(Sock, SocketAddr), CmError> {
        let n = self.engines.len();
        if n == 0 {
            return Err(CmError::Closed);
        }
        let start = self.next_dial % n;
        self.next_dial = self.next_dial.wrapping_add(1);
        let k = (0..n)
            .map(|i| (start + i) % n)
            .min_by_key(|&k| lock(&self.engines[k]).load())
            .unwrap_or(0);
        let (cid, local) = lock(&self.engines[k]).dial(addr, conn)?;
        Ok((Sock::Xdp(k, cid), local))
    }

    /// Stop listening: close every connection whose request has not
    /// reached the application yet.
    pub(crate) fn remove_listener(&mut self, shared: &Arc<ListenShared>) {
        for x in &self.engines {
            lock(x).remove_listener(shared);
        }
        for r in shared.drain() {
            if let Sock::Xdp(k, c) = r.sock {
                self.drop_sock(k, c);
            }
        }
    }

    /// Drive `qp` over connection `conn` of engine `k`.
    pub(crate) fn add_conn(
        &mut self,
        qp: QpId,
        k: usize,
        conn: ConnId,
        shared: Arc<ConnShared>,
    ) -> io::Result<()> {
        let x = self.engines.get(k).ok_or(io::ErrorKind::NotConnected)?;
        lock(x).add_conn(qp, conn, shared);
        self.homes.insert(qp, k);
        Ok(())
    }

    /// The application dropped `qp`: returns false if no engine drives
    /// it (the caller destroys it).
    pub(crate) fn release_qp(&mut self, qp: QpId, now: CoreInstant) -> bool {
        self.engines.iter().any(|x| lock(x).release_qp(qp, now))
    }

    /// Turn pending QP events of `qp` into connection-manager state now.
    pub(crate) fn pass_events(&mut self, ctx: &mut Context, qp: QpId) {
        for x in &self.engines {
            lock(x).pass_events(ctx, qp);
        }
    }

    /// Send `bytes` on connection `conn` of engine `k`, then close it.
    pub(crate) fn linger(&mut self, k: usize, conn: ConnId, bytes: Vec<u8>) {
        if let Some(x) = self.engines.get(k) {
            lock(x).linger(Sock::Xdp(k, conn), bytes);
        }
    }

    /// Close connection `conn` of engine `k`, which nobody will use.
    pub(crate) fn drop_sock(&mut self, k: usize, conn: ConnId) {
        if let Some(x) = self.engines.get(k) {
            lock(x).drop_sock(Sock::Xdp(k, conn));
        }
    }

    /// Reset every connection, detach the steering program and close the
    /// engines (the device is going away).
    pub(crate) fn shutdown(&mut self, ctx: &mut Context, now: CoreInstant) {
        let engines = std::mem::take(&mut self.engines);
        for x in &engines {
            lock(x).shutdown(ctx, now);
        }
        // The program leaves the interface before the sockets and the
        // UMEMs close (the progress threads holding the engines are
        // joined: these are the last references).
        if let Some(x) = engines.first() {
            lock(x).steer().detach();
        }
    }

    /// When the next timer is due, if any (of engine `which` only, if
    /// given).
    pub(crate) fn next_deadline(
        &mut self,
        which: Option<usize>,
        now: CoreInstant,
    ) -> Option<CoreInstant> {
        self.engines
            .iter()
            .enumerate()
            .filter(|(k, _)| which.is_none_or(|w| w == *k))
            .filter_map(|(_, x)| lock(x).next_deadline(now))
            .min()
    }

    /// The sockets of engine `which` (every engine: `None`) with their
    /// poll tokens, counting down from [`XSK`].
    pub(crate) fn fds(&self, which: Option<usize>) -> Vec<(Token, i32)> {
        self.engines
            .iter()
            .enumerate()
            .filter(|&(k, _)| which.is_none_or(|w| w == k))
            .map(|(k, x)| (Token(XSK.0 - k), lock(x).fd()))
            .collect()
    }

    /// Every engine's whole pass under the device lock (manual progress,
    /// or a device of one engine): every engine's input, then the work
    /// requests `posted` into the core (a receive posted before the peer
    /// sent the message it is for is in the core before the message), then
    /// each engine's steps on the core, then every engine's output.
    pub(crate) fn run_all(
        &mut self,
        ctx: &mut Context,
        now: CoreInstant,
        posted: &Posted,
    ) -> usize {
        let mut work: usize = self.engines.iter().map(|x| lock(x).io_in(now)).sum();
        work += posted.drain(ctx, |qp| self.touch_qp(qp));
        for k in 0..self.engines.len() {
            let touched = self.touched.get_mut(k).map(std::mem::take);
            let touched = touched.unwrap_or_default();
            let x = &self.engines[k];
            work += lock(x).drive(ctx, now, &touched, &mut self.reaped);
            self.give_back(k, touched);
        }
        work += self
            .engines
            .iter()
            .map(|x| lock(x).io_out(now))
            .sum::<usize>();
        self.forget_reaped();
        work
    }

    /// The steps of engine `x`'s pass that touch the core's context
    /// ([`XdpIo::drive`]), with the QPs the application touched for it.
    pub(crate) fn drive(&mut self, ctx: &mut Context, x: &XdpRef, now: CoreInstant) -> usize {
        let mut g = lock(x);
        let k = g.index();
        let touched = self.touched.get_mut(k).map(std::mem::take);
        let touched = touched.unwrap_or_default();
        let work = g.drive(ctx, now, &touched, &mut self.reaped);
        drop(g);
        self.give_back(k, touched);
        self.forget_reaped();
        work
    }

    /// Visits of the engines' connections outside the core's hands.
    pub(crate) fn lifecycle_visits(&self) -> u64 {
        self.engines.iter().map(|x| lock(x).lifecycle_visits).sum()
    }

    /// Connections driven by the core.
    pub(crate) fn conn_count(&self) -> usize {
        self.engines.iter().map(|x| lock(x).conn_count()).sum()
    }

    /// The application changed `qp` (posted to it, disconnected it): the
    /// engine that drives it visits it at its next pass.
    pub(crate) fn touch_qp(&mut self, qp: QpId) {
        if let Some(&k) = self.homes.get(&qp) {
            if let Some(t) = self.touched.get_mut(k) {
                t.push(qp);
            }
        }
    }

    /// The touched list of engine `k` was handled: keep its allocation
    /// (entries added meanwhile stay).
    fn give_back(&mut self, k: usize, mut list: Vec<QpId>) {
        if let Some(t) = self.touched.get_mut(k) {
            if t.is_empty() {
                list.clear();
                *t = list;
            }
        }
    }

    /// The engines destroyed these QPs: they have no home any more.
    fn forget_reaped(&mut self) {
        for qp in self.reaped.drain(..) {
            self.homes.remove(&qp);
        }
    }
}
