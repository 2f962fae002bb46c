//! The connection manager: listening, connecting, accepting and rejecting,
//! and the events of an established connection.
//!
//! # How accept works
//!
//! The core QP runs the MPA exchange itself, but the QP can only be
//! created once the application names its PD, CQs and queue depths in
//! [`ConnRequest::accept`]. So the engine parses the MPA request of an
//! accepted TCP connection with a standalone
//! [`Handshake::responder`](iwarp::mpa::handshake::Handshake::responder)
//! (one that accepts any offer) and keeps the request frame's bytes
//! exactly as received, reading nothing beyond them that it would not
//! also keep. [`Listener::get_request`] hands out the request; `accept`
//! then creates the core QP with the application's resources, starts it as
//! responder (`Context::listen`), replays the same request bytes into it
//! and calls `Context::accept`: negotiation (IRD/ORD, RTR, CRC, markers)
//! happens in the core with the application's [`ConnParams`]. `reject`
//! uses the standalone responder to build the reply with R=1, which the
//! engine sends before closing the socket.

use core::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iwarp::error::TermCode;
use iwarp::mpa::handshake::{self, ConnectRequest, HandshakeError, RtrSet};
use iwarp::qp::RecvWr;
use iwarp::verbs::VerbsError;

use crate::device::{Qp, QpInit};
use crate::runtime::{lock, ListenShared, Request, Shared, Sock};

/// Connection parameters: what we offer (initiator) or accept with
/// (responder).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnParams {
    /// ULP private data of our MPA frame (at most 508 bytes at revision 2,
    /// 512 at revision 1).
    pub private_data: Vec<u8>,
    /// IRD: the most RDMA Read and Atomic Requests from the peer we serve
    /// at once (RFC 6581 IRD; Linux siw supports up to 128).
    pub ird: u16,
    /// ORD: the most RDMA Read and Atomic Requests we keep outstanding at
    /// the peer (RFC 6581 ORD).
    pub ord: u16,
    /// Set the MPA C flag: ask for CRC32c on every FPDU (used in both
    /// directions if either side asks).
    pub crc: bool,
    /// Set the MPA M flag: ask the peer to put markers every 512 bytes
    /// of the stream we receive (RFC 5044 §4.3).
    pub markers: bool,
    /// MPA revision: 1, or 2 for RFC 6581 enhanced connection setup.
    pub revision: u8,
    /// Initiator: request RFC 6581 peer-to-peer mode.
    pub p2p: bool,
    /// Initiator: RTR types offered; responder: RTR types acceptable.
    pub rtr: RtrSet,
    /// Bound on the TCP connect plus the MPA exchange together.
    pub timeout: Duration,
    /// Responder: send without waiting for the initiator's first FPDU
    /// (against RFC 5044 §7.1.2; see
    /// [`iwarp::mpa::handshake::Config::responder_sends_first`]).
    pub responder_sends_first: bool,
}

impl Default for ConnParams {
    fn default() -> Self {
        Self {
            private_data: Vec::new(),
            ird: 16,
            ord: 16,
            crc: false,
            markers: false,
            revision: 2,
            p2p: false,
            rtr: RtrSet::ALL,
            timeout: Duration::from_secs(10),
            responder_sends_first: false,
        }
    }
}

impl ConnParams {
    /// The core's handshake configuration; `timeout` is what is left of
    /// `self.timeout`.
    pub(crate) fn mpa_config(&self, timeout: Duration) -> handshake::Config {
        handshake::Config {
            revision: self.revision,
            crc: self.crc,
            markers: self.markers,
            ird: self.ird,
            ord: self.ord,
            p2p: self.p2p,
            rtr: self.rtr,
            timeout,
            responder_sends_first: self.responder_sends_first,
        }
    }
}

/// Why connection setup failed.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmError {
    /// Nobody listens at the address (TCP RST).
    ConnectionRefused,
    /// No route to the network or host.
    Unreachable,
    /// The backend does not serve the address's family (the AF_XDP
    /// engine serves IPv4 only; `EAFNOSUPPORT` from a socket).
    AddressFamily,
    /// The TCP connect timed out, or a wait ran out of time.
    Timeout,
    /// The MPA exchange did not finish within the timeout.
    MpaTimeout,
    /// The peer rejected the connection with an MPA Reply whose R flag is
    /// set.
    Rejected {
        /// The ULP private data of the rejecting MPA Reply.
        private_data: Vec<u8>,
    },
    /// The MPA exchange failed: an invalid frame or a negotiation mismatch
    /// (`NoMatchingRtr`, `InsufficientIrd`, ...).
    Mpa(HandshakeError),
    /// The peer closed the connection during setup.
    Closed,
    /// A socket call failed with an error none of the variants above
    /// describes.
    Io(io::ErrorKind),
    /// A verbs call failed (e.g. a PD or CQ of another device).
    Verbs(VerbsError),
}

impl fmt::Display for CmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ConnectionRefused => f.write_str("connection refused"),
            Self::Unreachable => f.write_str("network or host unreachable"),
            Self::AddressFamily => {
                f.write_str("address family not served (the AF_XDP engine serves IPv4 only)")
            }
            Self::Timeout => f.write_str("timed out"),
            Self::MpaTimeout => f.write_str("MPA exchange timed out"),
            Self::Rejected { private_data } => {
                write!(
                    f,
                    "rejected by the peer ({} bytes of private data)",
                    private_data.len()
                )
            }
            Self::Mpa(e) => write!(f, "MPA exchange failed: {e}"),
            Self::Closed => f.write_str("the peer closed the connection during setup"),
            Self::Io(k) => write!(f, "socket error: {k}"),
            Self::Verbs(e) => write!(f, "verbs error: {e}"),
        }
    }
}

impl std::error::Error for CmError {}

impl From<io::Error> for CmError {
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ECONNREFUSED) => return Self::ConnectionRefused,
            Some(libc::ENETUNREACH | libc::EHOSTUNREACH) => return Self::Unreachable,
            Some(libc::EAFNOSUPPORT) => return Self::AddressFamily,
            Some(libc::ETIMEDOUT) => return Self::Timeout,
            _ => {}
        }
        match e.kind() {
            io::ErrorKind::ConnectionRefused => Self::ConnectionRefused,
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Self::Timeout,
            k => Self::Io(k),
        }
    }
}

impl From<VerbsError> for CmError {
    fn from(e: VerbsError) -> Self {
        match e {
            VerbsError::Connect(HandshakeError::Timeout) => Self::MpaTimeout,
            VerbsError::Connect(h) => Self::Mpa(h),
            e => Self::Verbs(e),
        }
    }
}

/// Something that happened to an established connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmEvent {
    /// The connection closed (our disconnect, or the peer's EOF).
    Disconnected,
    /// We detected a protocol violation and sent a Terminate.
    LocalTerminate(TermCode),
    /// The peer sent a Terminate (RFC 5040 §4.8) with this error; the QP
    /// is in Error.
    RemoteTerminate(TermCode),
    /// A socket error ended the connection (followed by `Disconnected`).
    Error(CmError),
    /// A completion queue overflowed; the QP moved to Error.
    CqOverrun,
}

/// An asynchronous event of a QP ([`Qp::poll_async_event`]), as verbs
/// reports them (`ibv_get_async_event` with `element.qp`).
///
/// The engine raises one of the first three, once, when the QP goes to
/// Error because of something the application did not ask for: a
/// Terminate it sent ([`CmEvent::LocalTerminate`]: the kind follows the
/// Terminate's error, see [`Self::of_local_terminate`]), a Terminate the
/// peer sent ([`CmEvent::RemoteTerminate`]), the connection lost
/// ([`CmEvent::Error`]) or a completion queue overrun
/// ([`CmEvent::CqOverrun`]). An orderly close — [`Qp::disconnect`], or the
/// peer's — raises none of them, and nothing that happens after it does.
/// [`Self::LastWqeReached`] follows, once, on a QP created on a shared
/// receive queue, whatever ended the connection.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpAsyncEvent {
    /// The QP is in Error: a protocol error, a Terminate from the peer,
    /// the connection lost (`IBV_EVENT_QP_FATAL`).
    Fatal,
    /// The QP is in Error: the peer's message broke the protection of
    /// our memory — an invalid STag, a base or bounds or access-rights
    /// violation, an STag of another PD (`IBV_EVENT_QP_ACCESS_ERR`).
    AccessError,
    /// The QP is in Error: the peer's message was an invalid request — an
    /// unexpected opcode, a Read Request beyond our IRD, an untagged
    /// message with an invalid queue, sequence number, offset or length
    /// (`IBV_EVENT_QP_REQ_ERR`).
    RequestError,
    /// A QP on a shared receive queue left RTS: it takes no receive from
    /// the queue any more (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    LastWqeReached,
}

impl QpAsyncEvent {
    /// The event of a Terminate the QP sent with `code`: RDMAP remote
    /// protection errors and DDP tagged-buffer errors (STag, bounds,
    /// association, TO wrap) are access errors; RDMAP remote operation
    /// errors and DDP untagged-buffer errors (but "no buffer available",
    /// which is the QP's own receive queue running dry) and DDP version
    /// errors are request errors; the rest (local catastrophic errors,
    /// MPA errors) are fatal.
    pub fn of_local_terminate(code: TermCode) -> Self {
        use iwarp::error::{codes, etype, Layer};
        match (code.layer, code.etype) {
            (Layer::Rdmap, etype::RDMAP_REMOTE_PROTECTION) => Self::AccessError,
            (Layer::Rdmap, etype::RDMAP_REMOTE_OPERATION) => Self::RequestError,
            (Layer::Ddp, etype::DDP_TAGGED) if code == codes::DDP_T_INVALID_VERSION => {
                Self::RequestError
            }
            (Layer::Ddp, etype::DDP_TAGGED) => Self::AccessError,
            (Layer::Ddp, etype::DDP_UNTAGGED) if code == codes::DDP_U_INVALID_MSN_NO_BUFFER => {
                Self::Fatal
            }
            (Layer::Ddp, etype::DDP_UNTAGGED) => Self::RequestError,
            _ => Self::Fatal,
        }
    }
}

/// How [`crate::Device::listen_with`] listens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListenOptions {
    /// A listener on an IPv6 address takes IPv6 connections only
    /// (`IPV6_V6ONLY`); by default one on `[::]` also takes IPv4
    /// connections, whose addresses the QPs report as IPv4.
    pub v6_only: bool,
}

/// A listening TCP socket. Dropping it closes the socket and every
/// connection whose request was not taken with [`Self::get_request`].
#[derive(Debug)]
pub struct Listener {
    pub(crate) shared: Arc<Shared>,
    pub(crate) ls: Arc<ListenShared>,
    pub(crate) addr: SocketAddr,
}

impl Listener {
    /// The bound address (with the port the OS chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The next connection whose TCP connection is accepted and whose MPA
    /// request has arrived. `None` waits forever;
    /// [`CmError::Timeout`] when `timeout` passes first.
    pub fn get_request(&self, timeout: Option<Duration>) -> Result<ConnRequest, CmError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        self.ls.sleepers.fetch_add(1, Ordering::SeqCst);
        let req = self
            .shared
            .wait_for(&self.ls.sleep, &self.ls.cv, deadline, |_| self.ls.pop());
        self.ls.sleepers.fetch_sub(1, Ordering::SeqCst);
        req.map(|req| ConnRequest {
            shared: self.shared.clone(),
            req: Some(req),
        })
        .ok_or(CmError::Timeout)
    }

    /// A descriptor readable while a connection request waits for
    /// [`Self::get_request`], for poll(2) or epoll: a semaphore eventfd
    /// (`EFD_SEMAPHORE | EFD_NONBLOCK | EFD_CLOEXEC`) holding one count per
    /// queued request, taken by `get_request` with the request. The
    /// application must not read it itself. Created on the first call.
    ///
    /// Panics if the eventfd cannot be created (the process is out of file
    /// descriptors).
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        let _g = lock(&self.ls.sleep);
        self.ls
            .event
            .get_or_create(|| self.ls.q.len())
            .expect("an eventfd for the listener")
            .as_fd()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.shared.engine().remove_listener(&self.ls);
        drop(self.ls.drain());
    }
}

/// An MPA connection request waiting for [`Self::accept`] or
/// [`Self::reject`]. Dropping it closes the connection without a reply.
///
/// How accepting works: the request was
/// parsed by a standalone responder; `accept` creates the core QP with the
/// application's PD, CQs and depths and replays the request bytes into it,
/// so negotiation uses the [`ConnParams`] given to `accept`.
#[derive(Debug)]
pub struct ConnRequest {
    shared: Arc<Shared>,
    req: Option<Request>,
}

impl ConnRequest {
    fn req(&self) -> &Request {
        self.req.as_ref().expect("taken only by accept/reject")
    }

    /// The initiator's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.req().peer
    }

    /// The local address the initiator connected to (on a wildcard
    /// listener, the address it chose).
    pub fn local_addr(&self) -> SocketAddr {
        self.req().local
    }

    /// The initiator's ULP private data.
    pub fn private_data(&self) -> &[u8] {
        &self.req().request.private_data
    }

    /// The request: revision, CRC and marker flags, IRD/ORD words.
    pub fn request(&self) -> &ConnectRequest {
        &self.req().request
    }

    /// Accept: create the QP, reply, and return it in RTS. Negotiation
    /// failures (e.g. [`HandshakeError::NoMatchingRtr`]: the reply then
    /// carries R=1) are [`CmError::Mpa`].
    ///
    /// The initiator may send as soon as it has the reply, before a
    /// receive posted on the returned QP is there:
    /// [`Self::accept_with_recvs`] posts receives first.
    pub fn accept(self, qp: QpInit, params: ConnParams) -> Result<Qp, CmError> {
        self.accept_with_recvs(qp, params, &[])
    }

    /// [`Self::accept`] with `recvs` posted on the new QP before the reply
    /// goes out, as verbs applications post receives before `rdma_accept`:
    /// the initiator's first Send always finds a buffer.
    pub fn accept_with_recvs(
        mut self,
        qp: QpInit,
        params: ConnParams,
        recvs: &[RecvWr<'_>],
    ) -> Result<Qp, CmError> {
        let req = self.req.take().expect("taken only once");
        Qp::accept(&self.shared, req, qp, &params, recvs)
    }

    /// Reject with `private_data`: reply with R=1 and close (the AF_XDP
    /// backend closes with a reset after a few seconds if the FIN exchange
    /// does not finish).
    pub fn reject(mut self, private_data: &[u8]) -> Result<(), CmError> {
        let mut req = self.req.take().expect("taken only once");
        req.hs.reject(private_data).map_err(CmError::Mpa)?;
        let mut frame = vec![0; 1024];
        let n = req.hs.poll_transmit(&mut frame);
        frame.truncate(n);
        tracing::info!(
            parent: &self.shared.span,
            peer = %req.peer,
            local = %req.local,
            reason = "rejected by the application",
            "connection request rejected: MPA reply with Reject queued"
        );
        self.shared.engine().linger(req.sock, frame);
        self.shared.kick();
        Ok(())
    }
}

impl Drop for ConnRequest {
    fn drop(&mut self) {
        // A kernel socket closes itself; a user-space TCP connection is
        // reset by the engine.
        if let Some(req) = self.req.take() {
            tracing::debug!(
                parent: &self.shared.span,
                peer = %req.peer,
                local = %req.local,
                "connection request dropped without a reply"
            );
            if let Sock::Xdp(..) = req.sock {
                self.shared.engine().drop_sock(req.sock);
                self.shared.kick();
            }
        }
    }
}
