//! The established stage of a connection, the same on both transports:
//! [`Driven`], the core's side of a connection the core drives (its QP,
//! its connection-manager state, whether the core saw the stream end),
//! and [`Driven::visit`], the steps of a visit in their order — a due
//! timer, the bytes received, the end or failure of the stream, what the
//! core transmits, the QP's events for the connection manager, and when
//! to close. A transport only moves bytes between its sockets and the
//! core, through its [`Stream`].

use std::io;
use std::sync::Arc;

use iwarp::cq::QpId;
use iwarp::time::Instant as CoreInstant;
use iwarp::verbs::Context;

use super::{drain_events, push_event, ConnShared};
use crate::cm::{CmError, CmEvent};
use crate::log::conn_event;

/// How a stream ended, as a visit's read found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The peer closed its direction (its FIN), and every byte was read.
    Fin,
    /// The stream failed: a reset or an I/O error (`kind`), `why` for the
    /// log.
    Failed(io::ErrorKind, &'static str),
}

/// What a visit's write made of the core's transmit queue.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Transmitted {
    /// Bytes moved (a measure of the work done).
    pub(crate) work: usize,
    /// Everything the core had to send has left the transport's hands
    /// (the socket took it): a close the core asks for may go ahead.
    pub(crate) drained: bool,
    /// The stream failed while writing.
    pub(crate) failed: Option<io::ErrorKind>,
}

/// The byte stream of an established connection as one transport carries
/// it (a kernel socket, a user-space TCP connection): what a visit
/// ([`Driven::visit`]) asks of it. The transport moves bytes; the visit
/// decides what the core sees and when the connection closes.
pub(crate) trait Stream {
    /// The connection is gone (closed, reset or released): a visit only
    /// fires the QP's timer and reports its events.
    fn gone(&self) -> bool;
    /// Hand the core what arrived ([`Driven::input`]), as much as it
    /// takes now. Returns the bytes it took and how the stream ended, if
    /// it did.
    fn receive(
        &mut self,
        ctx: &mut Context,
        core: &Driven,
        now: CoreInstant,
    ) -> (usize, Option<Ending>);
    /// Move what the core transmits for `qp` into the socket.
    fn transmit(&mut self, ctx: &mut Context, qp: QpId) -> Transmitted;
    /// Our side is closing: the FIN is queued, nothing more is sent.
    fn closing(&self) -> bool;
    /// Close our side: after what was sent, or at once if the stream
    /// failed (`failed`).
    fn close(&mut self, failed: bool);
    /// The connection closed since the last call: `Some(reset)` once,
    /// where `reset` says it ended without the FIN exchange.
    fn closed(&mut self) -> Option<bool>;
}

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

    /// Fire the QP's core timer if it is due at `now` (before more input
    /// is looked at: a handshake past its deadline fails first).
    fn timer(&self, ctx: &mut Context, now: CoreInstant) -> usize {
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
    fn end(&mut self, ctx: &mut Context) -> usize {
        if std::mem::replace(&mut self.ended, true) {
            0
        } else {
            ctx.handle_eof(self.qp);
            1
        }
    }

    /// The stream failed (`why`: a reset, an I/O error): it ends, and the
    /// connection manager reports `kind`.
    fn failed(&mut self, ctx: &mut Context, kind: io::ErrorKind, why: &str) -> usize {
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
    fn closes(&self, ctx: &Context, drained: bool) -> bool {
        drained && ctx.wants_close(self.qp)
    }

    /// The connection is closed (`reset`: it was reset): the core sees
    /// the end of the stream, the QP's events go to the connection
    /// manager.
    fn closed(&mut self, ctx: &mut Context, reset: bool) -> usize {
        conn_event!(ctx, self.qp, DEBUG, reset, "TCP connection closed");
        1 + self.end(ctx) + self.events(ctx)
    }

    /// Visit the connection over `io` at `now`: fire a due timer, hand
    /// the core what arrived, send what it transmits, report the QP's
    /// events, close when the core asks (and everything it sent left) or
    /// at once when the stream failed. Returns a measure of the work done.
    pub(crate) fn visit(
        &mut self,
        ctx: &mut Context,
        io: &mut impl Stream,
        now: CoreInstant,
    ) -> usize {
        let mut work = self.timer(ctx, now);
        if io.gone() {
            return work + self.events(ctx);
        }
        let mut failed = None;
        if !self.ended {
            let (n, ending) = io.receive(ctx, self, now);
            work += n;
            match ending {
                Some(Ending::Fin) => work += self.end(ctx),
                Some(Ending::Failed(kind, why)) => failed = Some((kind, why)),
                None => {}
            }
        }
        let mut drained = true;
        if failed.is_none() && !io.closing() {
            let t = io.transmit(ctx, self.qp);
            work += t.work;
            drained = t.drained;
            failed = t.failed.map(|kind| (kind, "I/O error"));
        }
        if let Some((kind, why)) = failed {
            work += self.failed(ctx, kind, why);
        }
        work += self.events(ctx);
        if failed.is_some() {
            // What the core still had to send is abandoned: a failed
            // stream carries nothing more.
            io.close(true);
        } else if !io.closing() && self.closes(ctx, drained) {
            conn_event!(ctx, self.qp, DEBUG, "TCP connection closing");
            io.close(false);
            work += 1;
        }
        if let Some(reset) = io.closed() {
            work += self.closed(ctx, reset);
        }
        work
    }

    /// The device is going away: the stream ends for the core and the
    /// QP's events go to the connection manager.
    pub(crate) fn shut(&mut self, ctx: &mut Context) {
        self.end(ctx);
        self.events(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iwarp::mpa::handshake;
    use iwarp::qp::QpConfig;

    /// A transport's stream as a test scripts it: what the peer sent and
    /// how its stream ends, how many bytes the socket takes, and a record
    /// of what the visit asked of it.
    #[derive(Default)]
    struct Script {
        incoming: Vec<u8>,
        ending: Option<Ending>,
        /// Bytes the socket takes before it pushes back.
        room: usize,
        write_fails: Option<io::ErrorKind>,
        wire: Vec<u8>,
        receives: usize,
        transmits: usize,
        closes: Vec<bool>,
        closed: Option<bool>,
    }

    impl Stream for Script {
        fn gone(&self) -> bool {
            !self.closes.is_empty()
        }
        fn receive(
            &mut self,
            ctx: &mut Context,
            core: &Driven,
            now: CoreInstant,
        ) -> (usize, Option<Ending>) {
            self.receives += 1;
            let used = core.input(ctx, &self.incoming, now);
            self.incoming.drain(..used);
            (used, self.ending)
        }
        fn transmit(&mut self, ctx: &mut Context, qp: QpId) -> Transmitted {
            self.transmits += 1;
            if let Some(kind) = self.write_fails {
                return Transmitted {
                    failed: Some(kind),
                    ..Transmitted::default()
                };
            }
            if self.room == 0 {
                // The socket is full: nothing is asked of the core.
                return Transmitted::default();
            }
            let mut buf = vec![0; self.room];
            let n = ctx.poll_transmit(qp, &mut buf);
            self.room -= n;
            self.wire.extend_from_slice(&buf[..n]);
            Transmitted {
                work: n,
                // A full socket may hide more.
                drained: self.room > 0,
                failed: None,
            }
        }
        fn closing(&self) -> bool {
            false
        }
        fn close(&mut self, failed: bool) {
            self.closes.push(failed);
            self.closed = Some(failed);
        }
        fn closed(&mut self) -> Option<bool> {
            self.closed.take()
        }
    }

    /// A QP that has sent its MPA request, with its connection's state.
    fn dialing() -> (Context, Driven, CoreInstant) {
        let now = CoreInstant::from_micros(0);
        let mut ctx = Context::new(1);
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(16);
        let qp = ctx.create_qp(pd, cq, cq, QpConfig::default()).unwrap();
        ctx.connect(qp, handshake::Config::default(), b"", now)
            .unwrap();
        (ctx, Driven::new(qp, Arc::new(ConnShared::new(false))), now)
    }

    fn events(core: &Driven) -> Vec<CmEvent> {
        crate::runtime::lock(&core.shared.m)
            .events
            .iter()
            .cloned()
            .collect()
    }

    /// The core's bytes go out as the socket takes them; a close the core
    /// asks for waits until they all left, and the closed connection ends
    /// the stream for the core.
    #[test]
    fn a_close_waits_until_what_the_core_sent_left() {
        let (mut ctx, mut core, now) = dialing();
        let mut io = Script {
            room: 1 << 20,
            ..Script::default()
        };
        core.visit(&mut ctx, &mut io, now);
        assert!(io.wire.starts_with(b"MPA ID Req Frame"), "{:?}", io.wire);
        // The peer rejects: the core answers nothing more and asks to
        // close; with the socket full, the close waits.
        let mut reply = b"MPA ID Rep Frame".to_vec();
        reply.extend([0x20, io.wire[17], 0, 0]);
        io.incoming = reply;
        io.room = 0;
        core.visit(&mut ctx, &mut io, now);
        assert!(io.incoming.is_empty(), "the reply reached the core");
        assert!(ctx.wants_close(core.qp()));
        assert!(io.closes.is_empty(), "closed with the socket full");
        io.room = 1 << 20;
        core.visit(&mut ctx, &mut io, now);
        assert_eq!(io.closes, [false], "an orderly close once drained");
        assert!(core.ended, "the closed connection ended the stream");
        let visits = (io.receives, io.transmits);
        core.visit(&mut ctx, &mut io, now);
        assert_eq!(
            (io.receives, io.transmits),
            visits,
            "a gone stream is not used"
        );
    }

    /// A stream that fails while reading is closed at once, without the
    /// core's bytes being written; the connection manager hears of the
    /// failure. A failed write does the same.
    #[test]
    fn a_failed_stream_closes_at_once() {
        for on_write in [false, true] {
            let (mut ctx, mut core, now) = dialing();
            let kind = io::ErrorKind::ConnectionReset;
            let mut io = Script {
                room: 1 << 20,
                ..Script::default()
            };
            if on_write {
                io.write_fails = Some(kind);
            } else {
                io.ending = Some(Ending::Failed(kind, "reset by the peer"));
            }
            core.visit(&mut ctx, &mut io, now);
            assert_eq!(io.transmits, usize::from(on_write));
            assert!(io.wire.is_empty());
            assert_eq!(io.closes, [true], "closed at once");
            assert!(core.ended);
            assert!(
                events(&core).contains(&CmEvent::Error(CmError::Io(kind))),
                "{:?}",
                events(&core)
            );
        }
    }

    /// The peer's FIN reaches the core once: a stream that ended is not
    /// read again, while what the core transmits still goes out.
    #[test]
    fn the_end_of_the_stream_reaches_the_core_once() {
        let (mut ctx, mut core, now) = dialing();
        let mut io = Script {
            ending: Some(Ending::Fin),
            ..Script::default()
        };
        core.visit(&mut ctx, &mut io, now);
        assert!(core.ended);
        io.room = 1 << 20;
        core.visit(&mut ctx, &mut io, now);
        assert_eq!(io.receives, 1, "read again after its end");
        assert_eq!(io.transmits, 2);
    }
}
