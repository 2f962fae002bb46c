//! The established stage of a connection, the same on both transports:
//! [`Driven`], the core's side of a connection the core drives (its QP,
//! its connection-manager state, whether the core saw the stream end)
//! and the steps of a visit that concern the core — a due timer, the
//! bytes received, the end or failure of the stream, the QP's events for
//! the connection manager, and when to close. The transports only move
//! bytes between their sockets and these steps.

use std::io;
use std::sync::Arc;

use iwarp::cq::QpId;
use iwarp::time::Instant as CoreInstant;
use iwarp::verbs::Context;

use super::{drain_events, push_event, ConnShared};
use crate::cm::{CmError, CmEvent};
use crate::log::conn_event;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Driven {
    qp: QpId,
    shared: Arc<ConnShared>,
    /// The core saw the end of the stream: the peer's FIN, a failure, or
    /// the connection closed.
    ended: bool,
}

impl Driven {
    pub(crate) fn new(qp: QpId, shared: Arc<ConnShared>) -> Self {
        Self {
            qp,
            shared,
            ended: false,
        }
    }

    pub(crate) fn qp(&self) -> QpId {
        self.qp
    }

    /// Whether the core saw the end of the stream (nothing more is read).
    pub(crate) fn ended(&self) -> bool {
        self.ended
    }

    /// Fire the QP's core timer if it is due at `now` (before more input
    /// is looked at: a handshake past its deadline fails first).
    pub(crate) fn timer(&self, ctx: &mut Context, now: CoreInstant) -> usize {
        if ctx.poll_timeout(self.qp).is_some_and(|d| d <= now) {
            ctx.handle_timeout(self.qp, now);
            1
        } else {
            0
        }
    }

    /// Hand received `bytes` to the core: how many it took (the rest
    /// waits until it has room).
    pub(crate) fn input(&self, ctx: &mut Context, bytes: &[u8], now: CoreInstant) -> usize {
        ctx.handle_input(self.qp, bytes, now)
    }

    /// The stream ended (the peer's FIN, or the connection closed): the
    /// core sees it once.
    pub(crate) fn end(&mut self, ctx: &mut Context) -> usize {
        if std::mem::replace(&mut self.ended, true) {
            0
        } else {
            ctx.handle_eof(self.qp);
            1
        }
    }

    /// The stream failed (`why`: a reset, an I/O error): it ends, and the
    /// connection manager reports `kind`.
    pub(crate) fn failed(&mut self, ctx: &mut Context, kind: io::ErrorKind, why: &str) -> usize {
        conn_event!(ctx, self.qp, WARN, error = ?kind, "connection dropped: {why}");
        self.end(ctx);
        push_event(&self.shared, CmEvent::Error(CmError::Io(kind)));
        1
    }

    /// Turn the QP's pending events into connection-manager state.
    pub(crate) fn events(&self, ctx: &mut Context) -> usize {
        drain_events(ctx, self.qp, &self.shared)
    }

    /// Whether the transport closes the connection now: the core asks,
    /// and what it sent has left (`drained`).
    pub(crate) fn closes(&self, ctx: &Context, drained: bool) -> bool {
        drained && ctx.wants_close(self.qp)
    }

    /// The connection is closed (`reset`: it was reset): the core sees
    /// the end of the stream, the QP's events go to the connection
    /// manager.
    pub(crate) fn closed(&mut self, ctx: &mut Context, reset: bool) -> usize {
        conn_event!(ctx, self.qp, DEBUG, reset, "TCP connection closed");
        1 + self.end(ctx) + self.events(ctx)
    }

    /// The device is going away: the stream ends for the core and the
    /// QP's events go to the connection manager.
    pub(crate) fn shut(&mut self, ctx: &mut Context) {
        self.end(ctx);
        self.events(ctx);
    }
}
