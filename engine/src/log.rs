//! The engine's `tracing` spans and events.
//!
//! Each device has a `dev` span (a number unique in the process, the
//! backend): its progress threads run inside it, and so does
//! [`crate::Device::open`]. Each connection gets a `conn` span (QP index
//! and generation, local and peer address), a child of its device's,
//! when its core QP is created; the core's events about that QP
//! ([`iwarp::qp`]) and the engine's own are attributed to it through
//! `parent:`, so the data path never enters or leaves a span. Both spans
//! are at WARN level: they are enabled whenever a warning of theirs is,
//! and cost nothing when no subscriber is installed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use iwarp::cq::QpId;
use tracing::Span;

/// The span of a new device with backend `backend`.
pub(crate) fn device_span(backend: &'static str) -> Span {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    tracing::warn_span!("dev", id, backend)
}

/// The span of the connection of `qp` on the device of span `dev`.
pub(crate) fn conn_span(dev: &Span, qp: QpId, local: SocketAddr, peer: SocketAddr) -> Span {
    tracing::warn_span!(
        parent: dev,
        "conn",
        qp = qp.index(),
        qp_gen = qp.generation(),
        %local,
        %peer
    )
}

/// A `tracing` event at level `$lvl` in the span of the connection of
/// QP `$qp` of the core context `$ctx` (the current span if it has none).
macro_rules! conn_event {
    ($ctx:expr, $qp:expr, $lvl:ident, $($arg:tt)+) => {
        match $ctx.qp($qp).map(|q| q.span()).filter(|s| !s.is_none()) {
            Some(span) => tracing::event!(parent: span, tracing::Level::$lvl, $($arg)+),
            None => tracing::event!(tracing::Level::$lvl, $($arg)+),
        }
    };
}
pub(crate) use conn_event;
