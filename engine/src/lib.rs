//! The I/O side of the stack: the application-facing verbs and connection
//! manager API, served by interchangeable backends. The kernel-socket
//! backend ([`Backend::Kernel`]) runs the sans-IO protocol core
//! ([`iwarp`]) over ordinary TCP sockets; the AF_XDP backend
//! ([`Backend::AfXdp`], module [`xdp`]) runs it over smoltcp on an AF_XDP
//! socket, behind the same API.
//!
//! * [`Device`]: one verbs context and its progress engine (a thread, or
//!   [`Device::progress`] called by the application).
//! * [`Pd`], [`Cq`], [`Mr`], [`Qp`]: protection domains, completion queues
//!   (with a blocking [`Cq::wait`]), registered memory owned by the
//!   region, and connected queue pairs whose posts fail synchronously
//!   without taking the device lock.
//! * [`Srq`]: shared receive queues, one queue of posted receives for
//!   many QPs ([`QpInit::srq`]), with the limit event of verbs
//!   ([`SrqEvent::LimitReached`], [`Srq::wait_event`], [`Srq::event_fd`]). It lives in the
//!   device's one verbs context, so QPs of every engine of a multi-core
//!   AF_XDP device take from it under the device lock; posts reach it
//!   through a lock-free queue, as a QP's do.
//! * [`Listener`], [`ConnRequest`], [`ConnParams`], [`CmError`],
//!   [`CmEvent`]: connection setup (TCP plus the MPA exchange) and the
//!   events of an established connection.
//! * [`QpAsyncEvent`]: the asynchronous events of verbs for a QP
//!   ([`Qp::poll_async_event`], [`Qp::async_event_fd`]): it went to Error
//!   because of a Terminate or a lost connection (fatal, access error,
//!   request error), or, on a shared receive queue, it left RTS.
//!
//! How the backends work — the data path, one engine pass, threading and
//! sleeping, the queues between application threads and the engine,
//! several engines per device, many connections — is described once, in
//! `docs/design.md` of the repository.
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
//!     srq: None,
//! };
//! let qp = dev.connect("198.18.0.2:4791".parse()?, init, ConnParams::default())?;
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
mod event;
mod kernel;
mod log;
mod post;
mod runtime;
mod slots;
pub mod xdp;

pub use cm::{CmError, CmEvent, ConnParams, ConnRequest, ListenOptions, Listener, QpAsyncEvent};
pub use device::{
    Backend, Connecting, Cq, Device, DeviceConfig, Mr, Pd, Progress, Qp, QpInit, Srq, Stats,
};
/// The protocol core, for its types ([`iwarp::qp::SendWr`],
/// [`iwarp::cq::WorkCompletion`], [`iwarp::mem::Access`], ...).
pub use iwarp;
pub use iwarp::cq::{WcOpcode, WcStatus, WorkCompletion};
pub use iwarp::mem::Access;
pub use iwarp::mpa::handshake::{ConnectRequest, HandshakeError, Negotiated, RtrSet, RtrType};
pub use iwarp::qp::{PostError, QpState, RecvWr, SendOp, SendWr, Sge};
pub use iwarp::srq::SrqEvent;
pub use iwarp::verbs::HandleCounts;
pub use xdp::{EngineStats, XdpConfig, XdpStats};

/// The Rust code blocks of the workspace's `README.md`, compiled (and
/// those not marked `no_run` run) as doc tests of this crate.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// A placeholder completion for initialising the buffers passed to
/// [`Cq::poll`] and [`Cq::wait`].
pub const EMPTY_WC: WorkCompletion = WorkCompletion {
    wr_id: 0,
    status: WcStatus::Success,
    opcode: WcOpcode::Send,
    byte_len: 0,
    qp: iwarp::cq::QpId::from_raw(0),
    invalidated_stag: None,
    solicited: false,
    imm_data: None,
};
