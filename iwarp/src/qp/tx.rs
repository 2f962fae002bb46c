//! Transmit: segmentation of messages into FPDUs (RFC 5041 §5, RFC 5040 §5).
//!
//! One message is sent at a time, chosen at message boundaries in this
//! order: a queued Terminate, the RTR message (peer-to-peer mode), RDMA
//! Read and Atomic Responses (in request order), then the send queue.
//! Each FPDU carries at most MULPDU bytes of ULPDU (DDP/RDMAP header plus
//! payload), so that it fits one TCP segment. Payload is copied from registered memory straight into the
//! caller's buffer by the MPA framer, which adds markers and the CRC on the
//! way. Output can stop at any byte and resume on the next call.

use crate::cq::{WcOpcode, WcStatus};
use crate::error::{codes, TermCode};
use crate::mem::{Access, MemError, Span};
use crate::mpa::framing::{self, TxFramer};
use crate::mpa::handshake::{Negotiated, RtrType};
use crate::wire::ddp::{Buffer, HeaderRepr, DDP_VERSION};
use crate::wire::rdmap::{
    AtomicRequest, AtomicResponse, Opcode, ReadRequest, IMMEDIATE_LEN, QN_ATOMIC_RESPONSE,
    QN_READ_REQUEST, QN_SEND, QN_TERMINATE, RDMAP_VERSION, UNTAGGED_QUEUES,
};
use crate::wire::terminate::TerminateRepr;

use super::rx::Violation;
use super::{Env, Inflight, Qp, QpState, SendOp, Sge, ATOMIC_LEN, MAX_SGE};

/// Room for the largest header: an untagged DDP header plus the largest
/// Terminate body (control, segment length, a DDP header and a Read
/// Request header).
pub(super) const HBUF: usize = 96;

/// The least payload an FPDU cut short to fill a segment carries (see
/// `tx_next_fpdu`); with less room the FPDU waits for the next segment.
const MIN_CUT: usize = 512;

/// An RDMA Read we sent and whose response we await.
#[derive(Clone, Copy, Debug)]
pub(super) struct OrqEntry {
    /// The in-flight work request, or `None` for the RTR read.
    pub(super) seq: Option<u64>,
    pub(super) sink_stag: u32,
    pub(super) sink_to: u64,
    pub(super) len: u32,
    pub(super) received: u64,
}

/// An Atomic Request we sent and whose response we await.
#[derive(Clone, Copy, Debug)]
pub(super) struct AtomicOrqEntry {
    /// The in-flight work request.
    pub(super) seq: u64,
    /// The Request Identifier the response must echo.
    pub(super) req_id: u32,
    /// Where the original value goes.
    pub(super) sink: Sge,
}

/// A request we received and must answer, in the order received: RFC 7306
/// §7 keeps Read and Atomic Responses in request order, and performs an
/// atomic operation only when its response is generated, after every
/// response before it.
#[derive(Clone, Copy, Debug)]
pub(super) enum IrqEntry {
    /// An RDMA Read Request.
    Read(ReadRequest),
    /// An Atomic Request, validated on arrival.
    Atomic(AtomicRequest),
}

#[derive(Clone, Copy, Debug)]
enum Payload {
    None,
    /// Local gather list of a Send or Write.
    Sgl {
        sges: [Sge; MAX_SGE],
        nsge: u8,
        idx: u8,
        off: u32,
    },
    /// The source of a Read Response.
    Region {
        stag: u32,
        to: u64,
    },
}

#[derive(Clone, Copy, Debug)]
struct Msg {
    hdr: HeaderRepr,
    body: [u8; HBUF],
    body_len: usize,
    total: u64,
    sent: u64,
    payload: Payload,
    /// The in-flight work request this message completes.
    seq: Option<u64>,
    /// Completes its work request when its last byte is out.
    completes_on_send: bool,
    terminate: bool,
}

#[derive(Clone, Copy, Debug)]
struct Fpdu {
    hbuf: [u8; HBUF],
    hlen: usize,
    hoff: usize,
    payload_left: usize,
    last: bool,
}

impl Fpdu {
    /// `c` more payload bytes of `msg` went into this FPDU.
    fn put(&mut self, msg: &mut Msg, c: usize) {
        advance(&mut msg.payload, c);
        msg.sent += c as u64;
        self.payload_left -= c;
    }
}

/// Transmit state of a QP.
#[derive(Debug, Default)]
pub(super) struct Tx {
    framer: Option<TxFramer>,
    mulpdu: usize,
    msn: [u32; UNTAGGED_QUEUES],
    ord: usize,
    ird: usize,
    msg: Option<Msg>,
    fpdu: Option<Fpdu>,
    rtr: Option<RtrType>,
    /// A Terminate queued (rare: boxed, off the hot transmit state).
    terminate: Option<Box<Msg>>,
    /// The error the queued Terminate reports.
    terminate_code: Option<TermCode>,
    terminate_sent: bool,
    aborted: bool,
    pub(super) next_seq: u64,
}

impl Tx {
    pub(super) fn setup(&mut self, n: &Negotiated, emss: usize, initiator: bool) {
        self.framer = Some(TxFramer::new(n.crc, n.markers_tx));
        self.mulpdu = framing::mulpdu(emss, n.markers_tx).max(64);
        self.msn = [1; UNTAGGED_QUEUES];
        self.ord = usize::from(n.ord);
        self.ird = usize::from(n.ird);
        self.rtr = if initiator && n.p2p { n.rtr } else { None };
    }

    /// A message, an FPDU, an RTR or a Terminate waits to go out.
    pub(super) fn has_pending(&self) -> bool {
        self.fpdu.is_some()
            || self.msg.is_some()
            || self.rtr.is_some()
            || (self.terminate.is_some() && !self.terminate_sent)
    }

    /// An FPDU is partly written.
    pub(super) fn busy(&self) -> bool {
        self.fpdu.is_some() || (self.terminate.is_some() && !self.terminate_sent)
    }

    pub(super) fn ird(&self) -> usize {
        self.ird
    }

    /// Whether a Read or Atomic Response is being sent (counts against IRD).
    pub(super) fn sending_response(&self) -> bool {
        self.msg.is_some_and(|m| {
            m.hdr.opcode == Opcode::ReadResponse as u8
                || m.hdr.opcode == Opcode::AtomicResponse as u8
        })
    }

    /// Drop queued messages; the FPDU being written is still completed so
    /// the stream stays well-framed.
    pub(super) fn abort_messages(&mut self) {
        self.aborted = true;
        if self.fpdu.is_none() {
            self.msg = None;
        }
    }

    /// Queue a Terminate message for `v`. Returns false when none can be
    /// sent (not in RDMA mode yet, or one was queued already).
    pub(super) fn queue_terminate(&mut self, v: &Violation) -> bool {
        if self.terminate.is_some() || self.terminate_sent || self.framer.is_none() {
            return false;
        }
        let repr = TerminateRepr {
            code: Some(v.code),
            raw_code_bits: v.code.to_bits(),
            ddp_seg_len: v.ddp_hdr.map(|_| v.seg_len),
            ddp_header: v.ddp_hdr,
            rdmap_header: v.rdma_hdr,
        };
        let mut body = [0u8; HBUF];
        let body_len = repr
            .buffer_len()
            .min(HBUF - crate::wire::ddp::UNTAGGED_HEADER_LEN);
        repr.emit(&mut body[..body_len]);
        let hdr = untagged(
            Opcode::Terminate,
            QN_TERMINATE,
            self.next_msn(QN_TERMINATE),
            0,
        );
        self.terminate_code = Some(v.code);
        self.terminate = Some(Box::new(Msg {
            hdr,
            body,
            body_len,
            total: 0,
            sent: 0,
            payload: Payload::None,
            seq: None,
            completes_on_send: false,
            terminate: true,
        }));
        true
    }

    fn next_msn(&mut self, qn: u32) -> u32 {
        let slot = &mut self.msn[qn as usize];
        let m = *slot;
        *slot = slot.wrapping_add(1);
        m
    }
}

fn untagged(op: Opcode, qn: u32, msn: u32, inv_stag: u32) -> HeaderRepr {
    HeaderRepr {
        last: true,
        ddp_version: DDP_VERSION,
        ddp_reserved: 0,
        rdmap_version: RDMAP_VERSION,
        rdmap_reserved: 0,
        opcode: op as u8,
        buffer: Buffer::Untagged {
            inv_stag,
            qn,
            msn,
            mo: 0,
        },
    }
}

fn tagged(op: Opcode, stag: u32, to: u64) -> HeaderRepr {
    HeaderRepr {
        last: true,
        ddp_version: DDP_VERSION,
        ddp_reserved: 0,
        rdmap_version: RDMAP_VERSION,
        rdmap_reserved: 0,
        opcode: op as u8,
        buffer: Buffer::Tagged { stag, to },
    }
}

impl Msg {
    fn new(hdr: HeaderRepr, total: u64, payload: Payload) -> Self {
        Self {
            hdr,
            body: [0; HBUF],
            body_len: 0,
            total,
            sent: 0,
            payload,
            seq: None,
            completes_on_send: false,
            terminate: false,
        }
    }

    fn with_read_request(mut self, req: &ReadRequest) -> Self {
        req.emit(&mut self.body[..ReadRequest::LEN]);
        self.body_len = ReadRequest::LEN;
        self
    }

    fn with_atomic_request(mut self, req: &AtomicRequest) -> Self {
        req.emit(&mut self.body[..AtomicRequest::LEN]);
        self.body_len = AtomicRequest::LEN;
        self
    }

    fn with_atomic_response(mut self, resp: &AtomicResponse) -> Self {
        resp.emit(&mut self.body[..AtomicResponse::LEN]);
        self.body_len = AtomicResponse::LEN;
        self
    }

    fn with_immediate(mut self, data: u64) -> Self {
        self.body[..IMMEDIATE_LEN].copy_from_slice(&data.to_be_bytes());
        self.body_len = IMMEDIATE_LEN;
        self
    }
}

/// The RDMAP error code for a memory check failure on an RDMA Read source.
pub(super) fn rdmap_mem_code(e: MemError) -> TermCode {
    match e {
        MemError::InvalidStag => codes::RDMAP_INVALID_STAG,
        MemError::NotAssociated => codes::RDMAP_STAG_NOT_ASSOC,
        MemError::AccessRights => codes::RDMAP_ACCESS_RIGHTS,
        MemError::BaseBounds => codes::RDMAP_BASE_BOUNDS,
        MemError::ToWrap => codes::RDMAP_TO_WRAP,
    }
}

impl Qp {
    fn can_send(&self) -> bool {
        // RFC 5044 §7.1.2: the responder sends no FPDU before it received
        // and validated the initiator's first one. A Terminate for a
        // violation found in that FPDU still goes out.
        self.role == super::Role::Initiator
            || self.responder_sends_first
            || self.rx.first_fpdu_seen()
            || self.state == QpState::Terminate
    }

    /// Write FPDUs into `out`, starting none whose wire length exceeds
    /// what is left of `limit` (see [`Context::poll_transmit_within`]).
    /// Returns bytes written.
    ///
    /// [`Context::poll_transmit_within`]: crate::verbs::Context::poll_transmit_within
    pub(super) fn tx_output(&mut self, out: &mut [u8], limit: usize, env: &mut Env<'_>) -> usize {
        if self.tx.framer.is_none() || !self.can_send() {
            return 0;
        }
        let mut n = 0;
        loop {
            let room = limit.saturating_sub(n);
            if !self.tx_fpdu_fits(room) {
                // Set up by a call with other room, and not a byte of it
                // is out: plan it again for this room.
                self.tx.fpdu = None;
                if let Some(framer) = self.tx.framer.as_mut() {
                    framer.cancel();
                }
            }
            if self.tx.fpdu.is_none() && !self.tx_next_fpdu(room, env) {
                break;
            }
            if !self.tx_fpdu_fits(room) {
                // Stays set up; a later call with more room sends it.
                break;
            }
            let (w, done) = self.tx_fpdu_bytes(&mut out[n..], env);
            n += w;
            if !done {
                break;
            }
            self.tx_fpdu_done(env);
        }
        n
    }

    /// Whether the FPDU set up fits in `room` bytes; one partly written
    /// always does (it is finished first).
    fn tx_fpdu_fits(&self, room: usize) -> bool {
        let unwritten = self.tx.framer.as_ref().and_then(TxFramer::unwritten_len);
        unwritten.is_none_or(|len| len <= room)
    }

    /// Set up the next FPDU: continue the current message or start one.
    /// An FPDU that would not fit in `room` bytes carries less payload, so
    /// that it fills the room, if that still leaves it [`MIN_CUT`] bytes of
    /// payload: a transport that keeps FPDUs inside segments then fills
    /// every segment (a message's short last FPDU is followed by the start
    /// of the next message) instead of sending one short segment per
    /// message.
    fn tx_next_fpdu(&mut self, room: usize, env: &mut Env<'_>) -> bool {
        if self.tx.terminate_sent {
            return false;
        }
        if self.tx.aborted {
            self.tx.msg = None;
        }
        if self.tx.msg.is_none() {
            match self.tx.terminate.take() {
                Some(t) => self.tx.msg = Some(*t),
                None => {
                    if !matches!(self.state, QpState::Rts | QpState::Closing)
                        || !self.tx_start_message(env)
                    {
                        // A violation found while starting a message (a
                        // Read or Atomic Response whose region went away)
                        // queued a Terminate: it goes out now.
                        match self.tx.terminate.take() {
                            Some(t) => self.tx.msg = Some(*t),
                            None => return false,
                        }
                    }
                }
            }
        }
        let Some(msg) = self.tx.msg.as_mut() else {
            return false;
        };
        let hdr_len = msg.hdr.header_len() + msg.body_len;
        let most = self.tx.mulpdu.saturating_sub(hdr_len).max(1);
        let left = msg.total - msg.sent;
        let mut chunk = (left.min(most as u64)) as usize;
        if let Some(framer) = self.tx.framer.as_ref() {
            if framer.wire_len(hdr_len + chunk) > room {
                let fits = framer
                    .ulpdu_fitting(room)
                    .map_or(0, |u| u.saturating_sub(hdr_len));
                if fits >= MIN_CUT {
                    chunk = fits;
                }
            }
        }
        let last = msg.sent + chunk as u64 == msg.total;
        let mut hdr = msg.hdr;
        hdr.last = last;
        hdr.buffer = match hdr.buffer {
            Buffer::Tagged { stag, to } => Buffer::Tagged {
                stag,
                to: to.wrapping_add(msg.sent),
            },
            Buffer::Untagged {
                inv_stag, qn, msn, ..
            } => Buffer::Untagged {
                inv_stag,
                qn,
                msn,
                mo: msg.sent as u32,
            },
        };
        let mut f = Fpdu {
            hbuf: [0; HBUF],
            hlen: hdr_len,
            hoff: 0,
            payload_left: chunk,
            last,
        };
        let h = hdr.header_len();
        hdr.emit(&mut f.hbuf[..h]);
        f.hbuf[h..hdr_len].copy_from_slice(&msg.body[..msg.body_len]);
        let ulpdu = hdr_len + chunk;
        if let Some(framer) = self.tx.framer.as_mut() {
            framer.start(ulpdu as u16);
        }
        self.tx.fpdu = Some(f);
        true
    }

    /// Pick the next message to send, if any.
    fn tx_start_message(&mut self, env: &mut Env<'_>) -> bool {
        if let Some(rtr) = self.tx.rtr.take() {
            let msg = match rtr {
                RtrType::Send => {
                    let msn = self.tx.next_msn(QN_SEND);
                    Msg::new(untagged(Opcode::Send, QN_SEND, msn, 0), 0, Payload::None)
                }
                RtrType::Write => Msg::new(tagged(Opcode::Write, 0, 0), 0, Payload::None),
                RtrType::Read => {
                    let req = ReadRequest {
                        sink_stag: 0,
                        sink_to: 0,
                        size: 0,
                        src_stag: 0,
                        src_to: 0,
                    };
                    self.orq.push_back(OrqEntry {
                        seq: None,
                        sink_stag: 0,
                        sink_to: 0,
                        len: 0,
                        received: 0,
                    });
                    let msn = self.tx.next_msn(QN_READ_REQUEST);
                    Msg::new(
                        untagged(Opcode::ReadRequest, QN_READ_REQUEST, msn, 0),
                        0,
                        Payload::None,
                    )
                    .with_read_request(&req)
                }
            };
            self.tx.msg = Some(msg);
            return true;
        }
        if let Some(irq) = self.irq.pop_front() {
            let r = match irq {
                IrqEntry::Read(r) => r,
                IrqEntry::Atomic(a) => return self.tx_atomic_response(&a, env),
            };
            let msg = Msg::new(
                tagged(Opcode::ReadResponse, r.sink_stag, r.sink_to),
                u64::from(r.size),
                Payload::Region {
                    stag: r.src_stag,
                    to: r.src_to,
                },
            );
            if r.size > 0 {
                // The region may have been invalidated since the request.
                if let Err(e) = env.mem.check(
                    r.src_stag,
                    self.pd,
                    r.src_to,
                    r.size as usize,
                    Access::REMOTE_READ,
                ) {
                    self.local_violation(
                        Violation {
                            code: rdmap_mem_code(e),
                            ddp_hdr: None,
                            rdma_hdr: Some(r),
                            seg_len: 0,
                            recv_status: None,
                        },
                        env,
                    );
                    return false;
                }
            }
            self.tx.msg = Some(msg);
            return true;
        }
        loop {
            let Some(e) = self.sq.front().copied() else {
                return false;
            };
            if e.op.awaits_response() && self.orq.len() + self.aorq.len() >= self.tx.ord {
                return false; // wait for a Read or Atomic Response
            }
            self.sq.pop_front();
            let seq = self.tx.next_seq;
            self.tx.next_seq += 1;
            self.inflight.push_back(Inflight {
                seq,
                wr_id: e.wr_id,
                opcode: super::sq_opcode(&e.op),
                byte_len: e.len as u32,
                signaled: e.signaled,
                status: None,
            });
            // Local buffers must be valid before anything goes out.
            let need = match e.op {
                SendOp::Read { .. } | SendOp::FetchAdd { .. } | SendOp::CompareSwap { .. } => {
                    Access::LOCAL_WRITE
                }
                _ => Access::NONE,
            };
            let bad = e.sges().iter().any(|s| {
                env.mem
                    .check(s.lkey, self.pd, s.addr, s.len as usize, need)
                    .is_err()
            });
            if bad && !matches!(e.op, SendOp::LocalInvalidate { .. }) {
                self.set_inflight_status(seq, WcStatus::LocalProtectionError);
                self.local_violation(Violation::plain(codes::RDMAP_LOCAL_CATASTROPHIC), env);
                return false;
            }
            let sgl = Payload::Sgl {
                sges: e.sgl,
                nsge: e.nsge,
                idx: 0,
                off: 0,
            };
            let mut msg = match e.op {
                SendOp::Send {
                    solicited,
                    invalidate,
                } => {
                    let op = match (solicited, invalidate.is_some()) {
                        (false, false) => Opcode::Send,
                        (false, true) => Opcode::SendInvalidate,
                        (true, false) => Opcode::SendSolicited,
                        (true, true) => Opcode::SendSolicitedInvalidate,
                    };
                    let msn = self.tx.next_msn(QN_SEND);
                    Msg::new(
                        untagged(op, QN_SEND, msn, invalidate.unwrap_or(0)),
                        e.len,
                        sgl,
                    )
                }
                SendOp::Write { remote_addr, rkey } => {
                    Msg::new(tagged(Opcode::Write, rkey, remote_addr), e.len, sgl)
                }
                SendOp::Read { remote_addr, rkey } => {
                    let sink = e.sgl[0];
                    let req = ReadRequest {
                        sink_stag: sink.lkey,
                        sink_to: sink.addr,
                        size: sink.len,
                        src_stag: rkey,
                        src_to: remote_addr,
                    };
                    self.orq.push_back(OrqEntry {
                        seq: Some(seq),
                        sink_stag: sink.lkey,
                        sink_to: sink.addr,
                        len: sink.len,
                        received: 0,
                    });
                    let msn = self.tx.next_msn(QN_READ_REQUEST);
                    Msg::new(
                        untagged(Opcode::ReadRequest, QN_READ_REQUEST, msn, 0),
                        0,
                        Payload::None,
                    )
                    .with_read_request(&req)
                }
                SendOp::ImmediateData { data, solicited } => {
                    let op = if solicited {
                        Opcode::ImmediateDataSolicited
                    } else {
                        Opcode::ImmediateData
                    };
                    let msn = self.tx.next_msn(QN_SEND);
                    Msg::new(untagged(op, QN_SEND, msn, 0), 0, Payload::None).with_immediate(data)
                }
                SendOp::FetchAdd {
                    remote_addr,
                    rkey,
                    add,
                    add_mask,
                } => self.tx_atomic_request(
                    seq,
                    e.sgl[0],
                    AtomicRequest::fetch_add(seq as u32, rkey, remote_addr, add, add_mask),
                ),
                SendOp::CompareSwap {
                    remote_addr,
                    rkey,
                    compare,
                    compare_mask,
                    swap,
                    swap_mask,
                } => self.tx_atomic_request(
                    seq,
                    e.sgl[0],
                    AtomicRequest::compare_swap(
                        seq as u32,
                        rkey,
                        remote_addr,
                        (compare, compare_mask),
                        (swap, swap_mask),
                    ),
                ),
                SendOp::LocalInvalidate { stag } => {
                    let status = match env.mem.invalidate(stag, self.pd) {
                        Ok(()) => WcStatus::Success,
                        Err(_) => WcStatus::LocalProtectionError,
                    };
                    self.set_inflight_status(seq, status);
                    self.drain_inflight(env);
                    if status != WcStatus::Success {
                        self.enter_error(env);
                        self.wants_close = true;
                        return false;
                    }
                    continue;
                }
            };
            msg.seq = Some(seq);
            msg.completes_on_send = !e.op.awaits_response();
            self.tx.msg = Some(msg);
            return true;
        }
    }

    /// The message of an atomic work request, whose response is awaited
    /// with its local sink.
    fn tx_atomic_request(&mut self, seq: u64, sink: Sge, req: AtomicRequest) -> Msg {
        self.aorq.push_back(AtomicOrqEntry {
            seq,
            req_id: req.req_id,
            sink,
        });
        let msn = self.tx.next_msn(QN_READ_REQUEST);
        Msg::new(
            untagged(Opcode::AtomicRequest, QN_READ_REQUEST, msn, 0),
            0,
            Payload::None,
        )
        .with_atomic_request(&req)
    }

    /// Perform a validated Atomic Request on the target and queue its
    /// response (RFC 7306 §5). The region may have been invalidated or
    /// deregistered since the request arrived: that is an error found while
    /// creating the response, whose Terminate carries no headers (§8.1).
    fn tx_atomic_response(&mut self, a: &AtomicRequest, env: &mut Env<'_>) -> bool {
        let span = match env.mem.check(
            a.stag,
            self.pd,
            a.to,
            ATOMIC_LEN as usize,
            Access::REMOTE_ATOMIC,
        ) {
            Ok(s) => s,
            Err(e) => {
                self.local_violation(Violation::plain(rdmap_mem_code(e)), env);
                return false;
            }
        };
        let Ok(word) = <[u8; 8]>::try_from(env.mem.read(span)) else {
            self.local_violation(Violation::plain(codes::RDMAP_LOCAL_CATASTROPHIC), env);
            return false;
        };
        // The operation runs in the target memory's byte order (§5.1).
        let orig = u64::from_ne_bytes(word);
        let Some(new) = a.apply(orig) else {
            // Reserved AOpCodes were refused on arrival.
            self.local_violation(Violation::plain(codes::RDMAP_UNEXPECTED_OPCODE), env);
            return false;
        };
        if new != orig {
            env.mem.write(span, &new.to_ne_bytes());
        }
        let msn = self.tx.next_msn(QN_ATOMIC_RESPONSE);
        let resp = AtomicResponse {
            req_id: a.req_id,
            orig,
        };
        self.tx.msg = Some(
            Msg::new(
                untagged(Opcode::AtomicResponse, QN_ATOMIC_RESPONSE, msn, 0),
                0,
                Payload::None,
            )
            .with_atomic_response(&resp),
        );
        true
    }

    pub(super) fn set_inflight_status(&mut self, seq: u64, status: WcStatus) {
        // Requests enter at the back in sequence order and leave at the
        // front, so their sequence numbers are contiguous.
        let Some(front) = self.inflight.front() else {
            return;
        };
        let at = usize::try_from(seq.wrapping_sub(front.seq)).unwrap_or(usize::MAX);
        if let Some(f) = self.inflight.get_mut(at) {
            debug_assert_eq!(f.seq, seq);
            if f.status.is_none() {
                f.status = Some(status);
            }
        }
    }

    /// Write bytes of the current FPDU. Returns (written, FPDU complete).
    fn tx_fpdu_bytes(&mut self, out: &mut [u8], env: &mut Env<'_>) -> (usize, bool) {
        let (Some(f), Some(framer), Some(msg)) = (
            self.tx.fpdu.as_mut(),
            self.tx.framer.as_mut(),
            self.tx.msg.as_mut(),
        ) else {
            return (0, false);
        };
        // The whole FPDU at once when its payload is one span and it fits.
        if f.hoff == 0
            && framer.can_write_whole()
            && out.len() >= framer.wire_len(f.hlen + f.payload_left)
        {
            let span = match f.payload_left {
                0 => Some(None),
                left => next_span(&msg.payload, msg.sent, left, self.pd, env)
                    .filter(|s| s.len() == left)
                    .map(Some),
            };
            if let Some(span) = span {
                let src = span.map_or(&[][..], |s| env.mem.read(s));
                if let Some(w) = framer.write_whole(&f.hbuf[..f.hlen], src, out) {
                    self.stats.tx_payload += f.payload_left as u64;
                    f.hoff = f.hlen;
                    f.put(msg, f.payload_left);
                    return (w, true);
                }
            }
        }
        let mut n = 0;
        // Header (DDP/RDMAP header and any body).
        while f.hoff < f.hlen {
            let (c, w) = framer.put(&f.hbuf[f.hoff..f.hlen], &mut out[n..]);
            f.hoff += c;
            n += w;
            if c == 0 && w == 0 {
                return (n, false);
            }
        }
        // Payload straight from registered memory.
        while f.payload_left > 0 {
            let span = match next_span(&msg.payload, msg.sent, f.payload_left, self.pd, env) {
                Some(s) => s,
                None => {
                    // The memory went away mid-message (the application
                    // deregistered it): keep the stream framed with zeros.
                    let zeros = [0u8; 64];
                    let k = f.payload_left.min(zeros.len());
                    let (c, w) = framer.put(&zeros[..k], &mut out[n..]);
                    n += w;
                    f.put(msg, c);
                    if c == 0 && w == 0 {
                        return (n, false);
                    }
                    continue;
                }
            };
            let src = env.mem.read(span);
            let (c, w) = framer.put(src, &mut out[n..]);
            n += w;
            f.put(msg, c);
            self.stats.tx_payload += c as u64;
            if c < src.len() || (c == 0 && w == 0) {
                return (n, false);
            }
        }
        let (w, done) = framer.finish(&mut out[n..]);
        (n + w, done)
    }

    /// The current FPDU is completely written.
    fn tx_fpdu_done(&mut self, env: &mut Env<'_>) {
        let Some(f) = self.tx.fpdu.take() else { return };
        self.stats.tx_fpdus += 1;
        if self.state == QpState::Closing {
            // The FPDU that was on its way when the close began is out.
            self.state = QpState::Error;
            self.tx.msg = None;
            return;
        }
        if !f.last {
            return;
        }
        let Some(msg) = self.tx.msg.take() else {
            return;
        };
        if msg.terminate {
            if let Some(code) = self.tx.terminate_code {
                term_event!(self.span, WARN, code, "Terminate sent");
            }
            self.tx.terminate_sent = true;
            self.state = QpState::Error;
            return;
        }
        if msg.completes_on_send {
            if let Some(seq) = msg.seq {
                self.set_inflight_status(seq, WcStatus::Success);
                self.drain_inflight(env);
            }
        }
    }
}

/// The next contiguous source span of a message's payload, at most `max` bytes.
fn next_span(
    p: &Payload,
    sent: u64,
    max: usize,
    pd: crate::mem::PdId,
    env: &Env<'_>,
) -> Option<Span> {
    match *p {
        Payload::None => None,
        Payload::Region { stag, to } => {
            let to = to.checked_add(sent)?;
            env.mem.check(stag, pd, to, max, Access::REMOTE_READ).ok()
        }
        Payload::Sgl {
            sges,
            nsge,
            idx,
            off,
        } => {
            let s = sges[..usize::from(nsge)].get(usize::from(idx))?;
            let len = ((s.len - off) as usize).min(max);
            env.mem
                .check(
                    s.lkey,
                    pd,
                    s.addr.wrapping_add(u64::from(off)),
                    len,
                    Access::NONE,
                )
                .ok()
        }
    }
}

/// Move a gather-list cursor forward by `n` bytes.
fn advance(p: &mut Payload, mut n: usize) {
    if let Payload::Sgl {
        sges,
        nsge,
        idx,
        off,
    } = p
    {
        while n > 0 {
            let Some(s) = sges[..usize::from(*nsge)].get(usize::from(*idx)) else {
                return;
            };
            let left = (s.len - *off) as usize;
            if n < left {
                *off += n as u32;
                return;
            }
            n -= left;
            *idx += 1;
            *off = 0;
        }
        // Skip empty elements so the cursor rests on data.
        while sges[..usize::from(*nsge)]
            .get(usize::from(*idx))
            .is_some_and(|s| s.len == *off)
        {
            *idx += 1;
            *off = 0;
        }
    }
}

impl WcOpcode {
    /// Whether a completion of this opcode belongs to the send queue.
    pub fn is_send_queue(self) -> bool {
        !matches!(self, Self::Recv)
    }
}
