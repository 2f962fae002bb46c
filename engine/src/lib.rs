//! The I/O side of the stack: the application-facing verbs and connection
//! manager API, served by interchangeable backends. The kernel-socket
//! backend ([`Backend::Kernel`]) runs the sans-IO protocol core
//! ([`iwarp`]) over ordinary TCP sockets; the AF_XDP engine comes later
//! behind the same API.
//!
//! * [`Device`]: one verbs context and its progress engine (a thread, or
//!   [`Device::progress`] called by the application).
//! * [`Pd`], [`Cq`], [`Mr`], [`Qp`]: protection domains, completion queues
//!   (with a blocking [`Cq::wait`]), registered memory owned by the
//!   region, and connected queue pairs whose posts fail synchronously.
//! * [`Listener`], [`ConnRequest`], [`ConnParams`], [`CmError`],
//!   [`CmEvent`]: connection setup (TCP plus the MPA exchange) and the
//!   events of an established connection.
//!
//! # Design of the kernel backend
//!
//! * **Threading.** Each [`Device`] owns one engine: the verbs context of
//!   the core plus every socket, behind one mutex. With
//!   [`Progress::Thread`] a progress thread (optionally pinned) runs passes
//!   over all sockets and sleeps in epoll (mio) when a pass did nothing;
//!   posts and new connections wake it through a `mio::Waker` (only when
//!   it sleeps). With `busy_poll` it spins instead. With
//!   [`Progress::Manual`] the application calls [`Device::progress`];
//!   blocking calls ([`Device::connect`], [`Listener::get_request`],
//!   [`Cq::wait`], [`Qp::wait_event`]) then drive the engine themselves and
//!   sleep in epoll between passes.
//! * **Locking.** Posts lock the engine and call the core directly, so
//!   their errors are synchronous. Completions are moved by each pass from
//!   the core's CQ into the [`Cq`]'s own queue (mutex + condition
//!   variable), so [`Cq::wait`] sleeps without spinning and without holding
//!   the engine lock. [`Mr::write`] and [`Mr::read`] take the engine lock:
//!   the core only touches registered memory while holding it.
//! * **Accept.** See the [`ConnRequest`] documentation: the request is
//!   parsed by a standalone MPA responder, and the core QP, created at
//!   accept time with the application's resources, replays the request
//!   bytes exactly as received.
//! * **FPDU size.** Each QP's EMSS is the socket's `TCP_MAXSEG`, clamped to
//!   512..=16384 bytes; `TCP_NODELAY` is on.
//!
//! # Quickstart
//!
//! ```no_run
//! use iwarp_engine::{Backend, ConnParams, Device, DeviceConfig, QpInit, EMPTY_WC};
//! use iwarp_engine::iwarp::mem::Access;
//! use iwarp_engine::iwarp::qp::{SendOp, SendWr};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dev = Device::open(Backend::Kernel, DeviceConfig::default())?;
//! let pd = dev.alloc_pd();
//! let cq = dev.create_cq(256);
//! let init = QpInit {
//!     pd: pd.clone(),
//!     send_cq: cq.clone(),
//!     recv_cq: cq.clone(),
//!     sq_depth: 64,
//!     rq_depth: 64,
//!     sig_all: false,
//! };
//! let qp = dev.connect("192.0.2.1:4791".parse()?, init, ConnParams::default())?;
//! let mr = dev.reg_mr(&pd, 4096, Access::LOCAL_WRITE)?;
//! mr.write(0, b"hello");
//! // The peer told us its buffer's address and rkey out of band
//! // (e.g. in its MPA private data).
//! let (remote_addr, rkey) = (0x1000, 0x0102);
//! qp.post_send(&SendWr {
//!     wr_id: 1,
//!     op: SendOp::Write { remote_addr, rkey },
//!     sgl: &[mr.sge(0, 5)],
//!     signaled: true,
//! })?;
//! let mut wcs = [EMPTY_WC; 16];
//! let n = cq.wait(&mut wcs, None);
//! assert!(n >= 1);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod cm;
mod device;
mod kernel;
pub mod xdp;

pub use cm::{CmError, CmEvent, ConnParams, ConnRequest, Listener};
pub use device::{Backend, Cq, Device, DeviceConfig, Mr, Pd, Progress, Qp, QpInit, Stats};
/// The protocol core, for its types ([`iwarp::qp::SendWr`],
/// [`iwarp::cq::WorkCompletion`], [`iwarp::mem::Access`], ...).
pub use iwarp;
pub use iwarp::cq::{WcOpcode, WcStatus, WorkCompletion};
pub use iwarp::mem::Access;
pub use iwarp::mpa::handshake::{ConnectRequest, HandshakeError, Negotiated, RtrSet, RtrType};
pub use iwarp::qp::{PostError, QpState, RecvWr, SendOp, SendWr, Sge};
pub use xdp::{XdpConfig, XdpStats};

/// A placeholder completion for initialising the buffers passed to
/// [`Cq::poll`] and [`Cq::wait`].
pub const EMPTY_WC: WorkCompletion = WorkCompletion {
    wr_id: 0,
    status: WcStatus::Success,
    opcode: WcOpcode::Send,
    byte_len: 0,
    qp: iwarp::cq::QpId(0),
    invalidated_stag: None,
    solicited: false,
};
