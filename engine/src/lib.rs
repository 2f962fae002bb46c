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
//!   ([`SrqEvent::LimitReached`], [`Srq::wait_event`]). It lives in the
//!   device's one verbs context, so QPs of every engine of a multi-core
//!   AF_XDP device take from it under the device lock; posts reach it
//!   through a lock-free queue, as a QP's do.
//! * [`Listener`], [`ConnRequest`], [`ConnParams`], [`CmError`],
//!   [`CmEvent`]: connection setup (TCP plus the MPA exchange) and the
//!   events of an established connection.
//!
//! # Design of the kernel backend
//!
//! * **Threading.** Each [`Device`] owns one engine: the verbs context of
//!   the core plus every socket, behind one mutex. With
//!   [`Progress::Thread`] a progress thread (optionally pinned) runs passes
//!   over the connections with work and sleeps in epoll (mio) when a pass
//!   did nothing;
//!   posts and new connections wake it through a `mio::Waker` (only when
//!   it sleeps). With `busy_poll` it spins instead. With
//!   [`Progress::Manual`] the application calls [`Device::progress`];
//!   blocking calls ([`Device::connect`], [`Listener::get_request`],
//!   [`Cq::wait`], [`Qp::wait_event`]) then drive the engine themselves and
//!   sleep in epoll between passes.
//! * **Queues, not the lock, between application and engine.** A post
//!   checks its work request, reserves a place against the QP's depth and
//!   pushes it onto the QP's crossbeam `ArrayQueue`; each pass first
//!   moves every listed QP's requests into the core. Post errors stay
//!   synchronous (`QueueFull` is exact: a post that finds the queue at its
//!   depth settles under the lock against what the core retired). With
//!   [`Progress::Manual`] no other thread runs passes, so a post that finds
//!   the engine lock free hands its request to the core itself (behind
//!   anything queued), and the next pass sends it without first moving it
//!   through the queues; a post that finds the lock taken queues. Each
//!   pass moves completions from the core's CQ into the [`Cq`]'s own
//!   `ArrayQueue`, so [`Cq::poll`] takes no lock and [`Cq::wait`] sleeps
//!   on a condition variable; connection requests come through a
//!   `SegQueue` per listener. Connection setup, [`Qp::disconnect`],
//!   [`Mr::write`] and [`Mr::read`] take the engine lock: the core only
//!   touches registered memory while holding it.
//! * **Receives before the peer can send.**
//!   [`ConnRequest::accept_with_recvs`] and [`Device::connect_with_recvs`]
//!   post receives on the new QP before the MPA reply (or request)
//!   leaves, as verbs applications post before `rdma_accept`.
//! * **Accept.** See the [`ConnRequest`] documentation: the request is
//!   parsed by a standalone MPA responder, and the core QP, created at
//!   accept time with the application's resources, replays the request
//!   bytes exactly as received.
//! * **FPDU size.** Each QP's EMSS is the socket's `TCP_MAXSEG`, clamped to
//!   512..=16384 bytes; `TCP_NODELAY` is on.
//!
//! # Design of the AF_XDP backend
//!
//! * **Same front, same locking.** The AF_XDP state ([`xdp`]'s `XdpIo`)
//!   lives inside the kernel backend's engine, behind the same mutex, and
//!   the same progress thread (or [`Device::progress`]) runs its passes,
//!   with the same queues to and from application threads; a
//!   busy-polling progress thread steps aside between passes while an
//!   application thread waits for the lock (setup, memory access).
//! * **One pass** (the clock read once): rx burst of at most 64 frames and
//!   fill-ring refill; smoltcp ingress (bounded) and egress, skipped when
//!   no frame came in and nothing is due (`Stack::needs_poll`); new
//!   connections and MPA requests; for each connection with work (the
//!   stack's active ones, touched QPs, due timers: `docs/design.md`)
//!   `Stack::recv`
//!   straight into `Context::handle_input` and, when the QP may have
//!   bytes (`Context::may_transmit`), `Context::poll_transmit_within`
//!   straight into `Stack::send_segment`: whole segments of whole FPDUs;
//!   rounds of smoltcp egress (`Stack::poll_egress`) and the next segments
//!   of each connection that may have more, up to 64 rounds; smoltcp
//!   egress into UMEM frames; tx burst (completions reclaimed first,
//!   `sendto` only while the tx ring holds frames and `needs_wakeup` says
//!   so).
//! * **FPDU alignment** ([`XdpConfig::align_fpdus`], on by default): every
//!   segment starts with an FPDU and holds only whole ones (RFC 5044 §8),
//!   so a receiver can place each segment on its own; an FPDU that does
//!   not fit the rest of a segment is cut to fill it, and segments are
//!   queued within smoltcp's congestion window, which `iwarp_tcp` mirrors
//!   (slow start and loss recovery included). What still cuts a segment
//!   short is the end of smoltcp's transmit ring (once per ring's worth)
//!   and its retransmissions, which it re-cuts at the MSS.
//!   `docs/testing.md`, "FPDU alignment", has the design and the counts.
//!   The kernel backend cannot align: the kernel's TCP segments as it
//!   likes.
//! * **Sleeping.** [`XdpConfig::busy_poll`] (default on) spins; otherwise
//!   the thread sleeps in epoll on the AF_XDP socket, the waker and the
//!   earliest timer (smoltcp `poll_at`, the core's `poll_timeout`). The
//!   socket joins the epoll set only while the thread sleeps: a socket
//!   in an epoll set makes every frame it receives walk a wait queue
//!   under irq-saving locks, on veth in the sending core's softirq.
//! * **Frames.** 2 KiB UMEM frames up to MTU 1500 (4 KiB above, up to
//!   veth's 3506), 4096 frames: half stock the fill ring, the rest are
//!   for transmit. No copy between UMEM and smoltcp: the tokens read and
//!   write frames in place.
//! * **Addresses and ARP.** The engine owns its IPv4 address: the steering
//!   program redirects TCP to that address on the listening ports and the
//!   ephemeral range of outgoing connections, and ARP for it; smoltcp
//!   answers ARP and resolves peers itself. Dropping the device resets
//!   open connections, detaches the program and closes socket and UMEM.
//! * **Multi-core** ([`XdpConfig::queues`]): one engine (AF_XDP socket,
//!   UMEM, smoltcp, pinned progress thread) per receive queue behind one
//!   device; see [`xdp`] for how connections are spread and owned.
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
mod kernel;
mod post;
mod slots;
pub mod xdp;

pub use cm::{CmError, CmEvent, ConnParams, ConnRequest, Listener};
pub use device::{Backend, Cq, Device, DeviceConfig, Mr, Pd, Progress, Qp, QpInit, Srq, Stats};
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
