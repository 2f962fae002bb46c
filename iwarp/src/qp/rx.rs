//! Receive: validation and placement of inbound DDP segments (RFC 5041
//! §7, RFC 5040 §5–7).
//!
//! The MPA deframer hands over each FPDU's ULPDU in pieces (markers
//! stripped). The first bytes are gathered into a small header buffer;
//! once the DDP/RDMAP header (and for Read Requests, Terminates and the
//! RFC 7306 messages, the RDMAP header after DDP's) is complete it is
//! validated, and the payload that follows is copied straight into the
//! target region: the tagged buffer named by STag/TO, or the posted
//! receive buffer at the message offset.
//!
//! A violation found in a header is acted on only at the end of the FPDU,
//! after the CRC: a corrupted header is reported as the CRC error it is.
//! Completions are produced only for FPDUs whose CRC checked.

use crate::cq::{WcOpcode, WcStatus, WorkCompletion};
use crate::error::{codes, Layer, TermCode};
use crate::mem::{Access, MemError, Span};
use crate::mpa::framing::{RxDeframer, RxItem};
use crate::mpa::handshake::{Negotiated, RtrType};
use crate::wire::ddp::{Buffer, HeaderRepr, DDP_VERSION, UNTAGGED_HEADER_LEN};
use crate::wire::rdmap::{
    AtomicRequest, AtomicResponse, Opcode, ReadRequest, IMMEDIATE_LEN, QN_ATOMIC_RESPONSE,
    QN_READ_REQUEST, QN_SEND, QN_TERMINATE, RDMAP_VERSION, UNTAGGED_QUEUES,
};
use crate::wire::terminate::TerminateRepr;

use super::tx::{rdmap_mem_code, IrqEntry, HBUF};
use super::{Env, Qp, QpEvent, QpState, ATOMIC_LEN};

/// A protocol violation: what goes into the Terminate message.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Violation {
    pub(crate) code: TermCode,
    /// The offending segment's DDP header, when known.
    pub(crate) ddp_hdr: Option<HeaderRepr>,
    /// The offending Read Request header, when that is what failed.
    pub(crate) rdma_hdr: Option<ReadRequest>,
    /// The offending segment's length (ULPDU length).
    pub(crate) seg_len: u16,
    /// Status for the receive work request the message was aimed at.
    pub(crate) recv_status: Option<WcStatus>,
}

impl Violation {
    pub(crate) fn plain(code: TermCode) -> Self {
        Self {
            code,
            ddp_hdr: None,
            rdma_hdr: None,
            seg_len: 0,
            recv_status: None,
        }
    }
}

/// What the payload of the current segment is for.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// Header still incomplete.
    Header,
    /// Tagged placement.
    Tagged(Span),
    /// Into the head receive buffer, starting at this message offset.
    Recv { offset: u64 },
    /// No payload expected (Read Request, Terminate, zero-length).
    Nothing,
    /// A violation was found: discard until the end of the FPDU.
    Reject(Violation),
}

/// Receive state of a QP.
#[derive(Debug)]
pub(super) struct Rx {
    deframer: Option<RxDeframer>,
    hbuf: [u8; HBUF],
    hlen: usize,
    hneed: usize,
    ulpdu_len: usize,
    target: Target,
    hdr: Option<HeaderRepr>,
    /// Next expected MSN per untagged queue.
    expect_msn: [u32; UNTAGGED_QUEUES],
    /// Bytes received so far of the Send message in progress.
    send_received: u64,
    first_fpdu_seen: bool,
    expect_rtr: Option<RtrType>,
    /// The segment being received is the peer's RTR message.
    rtr: Option<RtrType>,
}

impl Default for Rx {
    fn default() -> Self {
        Self {
            deframer: None,
            hbuf: [0; HBUF],
            hlen: 0,
            hneed: 0,
            ulpdu_len: 0,
            target: Target::Header,
            hdr: None,
            expect_msn: [1; UNTAGGED_QUEUES],
            send_received: 0,
            first_fpdu_seen: false,
            expect_rtr: None,
            rtr: None,
        }
    }
}

impl Rx {
    pub(super) fn setup(&mut self, n: &Negotiated, max_ulpdu: usize, responder: bool) {
        self.deframer = Some(RxDeframer::new(n.crc, n.markers_rx, max_ulpdu));
        self.expect_msn = [1; UNTAGGED_QUEUES];
        self.expect_rtr = if responder && n.p2p { n.rtr } else { None };
    }

    pub(super) fn first_fpdu_seen(&self) -> bool {
        self.first_fpdu_seen
    }
}

/// The DDP tagged-buffer error code for a memory check failure on a
/// placement target (RFC 5041 §7.2; access rights are RDMAP's, RFC 5040 §7.2).
fn ddp_tagged_code(e: MemError) -> TermCode {
    match e {
        MemError::InvalidStag => codes::DDP_T_INVALID_STAG,
        MemError::NotAssociated => codes::DDP_T_STAG_NOT_ASSOC,
        MemError::AccessRights => codes::RDMAP_ACCESS_RIGHTS,
        MemError::BaseBounds => codes::DDP_T_BASE_BOUNDS,
        MemError::ToWrap => codes::DDP_T_TO_WRAP,
    }
}

/// The work-completion status for the request a peer's Terminate names.
fn status_for_remote(code: TermCode) -> WcStatus {
    use crate::error::etype;
    match (code.layer, code.etype) {
        (Layer::Rdmap, etype::RDMAP_REMOTE_PROTECTION) | (Layer::Ddp, etype::DDP_TAGGED) => {
            WcStatus::RemoteAccessError
        }
        (Layer::Ddp, etype::DDP_UNTAGGED) => WcStatus::RemoteInvalidRequestError,
        _ => WcStatus::RemoteOperationError,
    }
}

impl Qp {
    /// Consume stream bytes in RDMA mode. Returns bytes consumed (all of
    /// them: after a failure the rest is discarded).
    pub(super) fn rx_input(&mut self, input: &[u8], env: &mut Env<'_>) -> usize {
        let mut off = 0;
        while off < input.len() && matches!(self.state, QpState::Rts | QpState::Closing) {
            let Some(deframer) = self.rx.deframer.as_mut() else {
                break;
            };
            // A whole FPDU in the input (the usual case: FPDUs aligned
            // with segments) in one step; the same items as below.
            if let Some((n, ulpdu, crc_ok)) = deframer.next_whole(&input[off..]) {
                off += n;
                self.rx_start(ulpdu.len() as u16);
                self.rx_data(ulpdu, env);
                if !matches!(self.state, QpState::Rts | QpState::Closing) {
                    break;
                }
                self.rx_end(crc_ok, env);
                continue;
            }
            match deframer.next(&input[off..]) {
                Err(e) => {
                    self.local_violation(Violation::plain(e.term_code()), env);
                    break;
                }
                Ok((n, item)) => {
                    off += n;
                    match item {
                        Some(RxItem::Start { ulpdu_len }) => self.rx_start(ulpdu_len),
                        Some(RxItem::Data(d)) => self.rx_data(d, env),
                        Some(RxItem::End { crc_ok }) => self.rx_end(crc_ok, env),
                        None if n == 0 => break,
                        None => {}
                    }
                }
            }
        }
        input.len()
    }

    fn rx_start(&mut self, ulpdu_len: u16) {
        let rx = &mut self.rx;
        rx.ulpdu_len = usize::from(ulpdu_len);
        rx.hlen = 0;
        rx.hneed = 1.min(rx.ulpdu_len);
        rx.hdr = None;
        rx.target = Target::Header;
    }

    fn rx_data(&mut self, mut d: &[u8], env: &mut Env<'_>) {
        while !d.is_empty() {
            match self.rx.target {
                Target::Header => {
                    let rx = &mut self.rx;
                    let take = (rx.hneed - rx.hlen).min(d.len());
                    rx.hbuf[rx.hlen..rx.hlen + take].copy_from_slice(&d[..take]);
                    rx.hlen += take;
                    d = &d[take..];
                    if rx.hlen == rx.hneed {
                        self.rx_header_progress(env);
                    }
                }
                Target::Tagged(span) => {
                    let n = env.mem.write(span, d);
                    self.stats.rx_payload += n as u64;
                    self.rx.target = Target::Tagged(span.advance(n));
                    d = &d[n..];
                    if n == 0 {
                        // More payload than the header announced cannot
                        // happen (the length field bounds it); be safe.
                        return;
                    }
                }
                Target::Recv { offset } => {
                    let n = match self.place_recv(offset, d, env) {
                        Ok(n) => n,
                        Err(v) => {
                            self.rx.target = Target::Reject(v);
                            continue;
                        }
                    };
                    self.stats.rx_payload += n as u64;
                    self.rx.target = Target::Recv {
                        offset: offset + n as u64,
                    };
                    d = &d[n..];
                }
                Target::Nothing | Target::Reject(_) => return,
            }
        }
    }

    /// The receive the message at offset `mo` goes into: the head of the
    /// receive queue. A QP on a shared receive queue takes the SRQ's
    /// oldest at the message's first segment and holds it in its own
    /// queue until the last segment completes it (or Error flushes it).
    fn recv_head(&mut self, mo: u32, env: &mut Env<'_>) -> Option<super::RqEntry> {
        if self.rq.is_empty() && mo == 0 {
            if let Some(srq) = self.srq {
                let e = env.srqs.get_mut(srq)?.take()?;
                self.rq.push_back(e);
            }
        }
        self.rq.front().copied()
    }

    /// Scatter `d` into the head receive buffer at message offset `offset`.
    fn place_recv(&mut self, offset: u64, d: &[u8], env: &mut Env<'_>) -> Result<usize, Violation> {
        let rq = self
            .rq
            .front()
            .copied()
            .ok_or(Violation::plain(codes::DDP_U_INVALID_MSN_NO_BUFFER))?;
        let mut pos = offset;
        for s in &rq.sgl[..usize::from(rq.nsge)] {
            let len = u64::from(s.len);
            if pos >= len {
                pos -= len;
                continue;
            }
            let n = ((len - pos) as usize).min(d.len());
            let span = env
                .mem
                .check(
                    s.lkey,
                    self.pd,
                    s.addr.wrapping_add(pos),
                    n,
                    Access::LOCAL_WRITE,
                )
                .map_err(|_| Violation {
                    recv_status: Some(WcStatus::LocalProtectionError),
                    ..Violation::plain(codes::RDMAP_LOCAL_CATASTROPHIC)
                })?;
            return Ok(env.mem.write(span, &d[..n]));
        }
        Err(Violation {
            recv_status: Some(WcStatus::LocalLengthError),
            ..Violation::plain(codes::DDP_U_MSG_TOO_LONG)
        })
    }

    /// The header buffer reached `hneed` bytes: learn how long the header
    /// is, or validate it when complete.
    fn rx_header_progress(&mut self, env: &mut Env<'_>) {
        let rx = &mut self.rx;
        if rx.hlen == 1 {
            rx.hneed = HeaderRepr::header_len_for(rx.hbuf[0]).min(rx.ulpdu_len);
            return;
        }
        if rx.hdr.is_none() {
            let Ok(hdr) = HeaderRepr::parse(&rx.hbuf[..rx.hlen]) else {
                return; // incomplete: reported at the end of the FPDU
            };
            rx.hdr = Some(hdr);
            let untagged = !matches!(hdr.buffer, Buffer::Tagged { .. });
            let extra = match Opcode::from_raw(hdr.opcode) {
                _ if !untagged => 0,
                Some(Opcode::ReadRequest) => ReadRequest::LEN,
                Some(Opcode::AtomicRequest) => AtomicRequest::LEN,
                Some(Opcode::AtomicResponse) => AtomicResponse::LEN,
                Some(Opcode::ImmediateData | Opcode::ImmediateDataSolicited) => IMMEDIATE_LEN,
                Some(Opcode::Terminate) => HBUF - UNTAGGED_HEADER_LEN,
                _ => 0,
            };
            if extra > 0 {
                rx.hneed = (rx.hlen + extra).min(rx.ulpdu_len);
                if rx.hneed > rx.hlen {
                    return;
                }
            }
        }
        self.rx.target = match self.rx_validate(env) {
            Ok(t) => t,
            Err(v) => Target::Reject(v),
        };
    }

    /// Validate a complete header against the RFC rules, in the order the
    /// RFCs list them: DDP, then RDMAP, then the buffer.
    fn rx_validate(&mut self, env: &mut Env<'_>) -> Result<Target, Violation> {
        let Some(hdr) = self.rx.hdr else {
            return Err(Violation::plain(codes::RDMAP_CATASTROPHIC_STREAM));
        };
        let payload = self.rx.ulpdu_len - self.rx.hlen;
        let seg_len = self.rx.ulpdu_len.min(usize::from(u16::MAX)) as u16;
        let v = |code| Violation {
            code,
            ddp_hdr: Some(hdr),
            rdma_hdr: None,
            seg_len,
            recv_status: None,
        };
        let tagged = matches!(hdr.buffer, Buffer::Tagged { .. });
        if hdr.ddp_version != DDP_VERSION {
            return Err(v(if tagged {
                codes::DDP_T_INVALID_VERSION
            } else {
                codes::DDP_U_INVALID_VERSION
            }));
        }
        if self.config.strict_reserved && (hdr.ddp_reserved != 0 || hdr.rdmap_reserved != 0) {
            return Err(v(codes::RDMAP_UNSPECIFIED_OP));
        }
        if hdr.rdmap_version != RDMAP_VERSION {
            return Err(v(codes::RDMAP_INVALID_VERSION));
        }
        // Untagged: the queue number is DDP's to check before RDMAP looks
        // at the opcode.
        if let Buffer::Untagged { qn, .. } = hdr.buffer {
            if qn > QN_ATOMIC_RESPONSE {
                return Err(v(codes::DDP_U_INVALID_QN));
            }
        }
        let op = Opcode::from_raw(hdr.opcode).ok_or(v(codes::RDMAP_UNEXPECTED_OPCODE))?;
        if op.is_tagged() != tagged {
            return Err(v(codes::RDMAP_UNEXPECTED_OPCODE));
        }
        if let Some(rtr) = self.rx.expect_rtr.take() {
            let ok = match rtr {
                RtrType::Send => op == Opcode::Send && payload == 0 && hdr.last,
                RtrType::Write => op == Opcode::Write && payload == 0 && hdr.last,
                RtrType::Read => op == Opcode::ReadRequest,
            };
            if !ok {
                return Err(v(codes::MPA_NO_MATCHING_RTR));
            }
            self.rx.rtr = Some(rtr);
        }
        match hdr.buffer {
            Buffer::Tagged { stag, to } => match op {
                Opcode::Write => {
                    if payload == 0 {
                        return Ok(Target::Nothing);
                    }
                    env.mem
                        .check(stag, self.pd, to, payload, Access::REMOTE_WRITE)
                        .map(Target::Tagged)
                        .map_err(|e| v(ddp_tagged_code(e)))
                }
                _ => {
                    // Read Response: must answer the oldest outstanding Read.
                    let Some(o) = self.orq.front().copied() else {
                        return Err(v(codes::RDMAP_UNEXPECTED_OPCODE));
                    };
                    if stag != o.sink_stag {
                        return Err(v(codes::DDP_T_INVALID_STAG));
                    }
                    let expect_to = o.sink_to.wrapping_add(o.received);
                    if to != expect_to || o.received + payload as u64 > u64::from(o.len) {
                        return Err(v(codes::DDP_T_BASE_BOUNDS));
                    }
                    if payload == 0 {
                        return Ok(Target::Nothing);
                    }
                    env.mem
                        .check(stag, self.pd, to, payload, Access::LOCAL_WRITE)
                        .map(Target::Tagged)
                        .map_err(|e| v(ddp_tagged_code(e)))
                }
            },
            Buffer::Untagged { qn, msn, mo, .. } => {
                if op.queue() != Some(qn) {
                    return Err(v(codes::RDMAP_UNEXPECTED_OPCODE));
                }
                if msn != self.rx.expect_msn[qn as usize] {
                    return Err(v(codes::DDP_U_INVALID_MSN_RANGE));
                }
                match qn {
                    QN_SEND => {
                        if u64::from(mo) != self.rx.send_received {
                            return Err(v(codes::DDP_U_INVALID_MO));
                        }
                        if self.rx.rtr == Some(RtrType::Send) {
                            return Ok(Target::Nothing);
                        }
                        if op.is_immediate() {
                            // RFC 7306 §6.3: exactly 8 bytes, a message of
                            // its own.
                            self.rx_untagged_body(hdr, IMMEDIATE_LEN, &v)?;
                        }
                        let Some(rq) = self.recv_head(mo, env) else {
                            return Err(v(codes::DDP_U_INVALID_MSN_NO_BUFFER));
                        };
                        if u64::from(mo) + payload as u64 > rq.len {
                            return Err(Violation {
                                recv_status: Some(WcStatus::LocalLengthError),
                                ..v(codes::DDP_U_MSG_TOO_LONG)
                            });
                        }
                        Ok(Target::Recv {
                            offset: u64::from(mo),
                        })
                    }
                    QN_READ_REQUEST if op == Opcode::AtomicRequest => {
                        self.rx_validate_atomic_request(hdr, v, env)
                    }
                    QN_ATOMIC_RESPONSE => self.rx_validate_atomic_response(hdr, v, env),
                    QN_READ_REQUEST => {
                        let req =
                            ReadRequest::parse(self.rx_untagged_body(hdr, ReadRequest::LEN, &v)?)
                                .map_err(|_| v(codes::RDMAP_CATASTROPHIC_STREAM))?;
                        let rv = |code| Violation {
                            rdma_hdr: Some(req),
                            ..v(code)
                        };
                        if self.irq_full() {
                            return Err(rv(codes::RDMAP_CATASTROPHIC_STREAM));
                        }
                        if req.size > 0 {
                            env.mem
                                .check(
                                    req.src_stag,
                                    self.pd,
                                    req.src_to,
                                    req.size as usize,
                                    Access::REMOTE_READ,
                                )
                                .map_err(|e| rv(rdmap_mem_code(e)))?;
                        }
                        Ok(Target::Nothing)
                    }
                    _ => {
                        if mo != 0 {
                            return Err(v(codes::DDP_U_INVALID_MO));
                        }
                        Ok(Target::Nothing)
                    }
                }
            }
        }
    }

    /// Whether the responses owed (queued, and the one being sent) have
    /// reached the IRD: Read and Atomic Requests share it (RFC 7306 §5).
    fn irq_full(&self) -> bool {
        self.irq.len() + usize::from(self.tx.sending_response()) >= self.tx.ird()
    }

    /// The checks RFC 7306 §5 and §8.2 ask of an incoming Atomic Request
    /// (queue 1); the operation itself waits for its turn among the
    /// responses (see `tx_atomic_response`).
    fn rx_validate_atomic_request(
        &self,
        hdr: HeaderRepr,
        v: impl Fn(TermCode) -> Violation,
        env: &Env<'_>,
    ) -> Result<Target, Violation> {
        let body = self.rx_untagged_body(hdr, AtomicRequest::LEN, &v)?;
        let req = AtomicRequest::parse(body).map_err(|_| v(codes::RDMAP_CATASTROPHIC_STREAM))?;
        if self.irq_full() {
            return Err(v(codes::RDMAP_CATASTROPHIC_STREAM));
        }
        if req.op().is_none() {
            return Err(v(codes::RDMAP_UNEXPECTED_OPCODE));
        }
        if req.to % ATOMIC_LEN != 0 {
            return Err(v(codes::RDMAP_CATASTROPHIC_STREAM));
        }
        env.mem
            .check(
                req.stag,
                self.pd,
                req.to,
                ATOMIC_LEN as usize,
                Access::REMOTE_ATOMIC,
            )
            .map_err(|e| v(rdmap_mem_code(e)))?;
        Ok(Target::Nothing)
    }

    /// An incoming Atomic Response (queue 3) must answer the oldest Atomic
    /// Request outstanding, whose sink must still take the value.
    fn rx_validate_atomic_response(
        &self,
        hdr: HeaderRepr,
        v: impl Fn(TermCode) -> Violation,
        env: &Env<'_>,
    ) -> Result<Target, Violation> {
        let body = self.rx_untagged_body(hdr, AtomicResponse::LEN, &v)?;
        let resp = AtomicResponse::parse(body).map_err(|_| v(codes::RDMAP_CATASTROPHIC_STREAM))?;
        // Queue 3's buffers are the requests outstanding.
        let Some(o) = self.aorq.front() else {
            return Err(v(codes::DDP_U_INVALID_MSN_NO_BUFFER));
        };
        if resp.req_id != o.req_id {
            return Err(v(codes::RDMAP_CATASTROPHIC_STREAM));
        }
        env.mem
            .check(
                o.sink.lkey,
                self.pd,
                o.sink.addr,
                ATOMIC_LEN as usize,
                Access::LOCAL_WRITE,
            )
            .map_err(|_| v(codes::RDMAP_LOCAL_CATASTROPHIC))?;
        Ok(Target::Nothing)
    }

    /// The `len`-byte RDMAP header after an untagged DDP header of a
    /// message that is that header alone: offset 0, one segment, no
    /// payload (Read and Atomic Requests, Atomic Responses, Immediate
    /// Data).
    fn rx_untagged_body(
        &self,
        hdr: HeaderRepr,
        len: usize,
        v: &impl Fn(TermCode) -> Violation,
    ) -> Result<&[u8], Violation> {
        if let Buffer::Untagged { mo, .. } = hdr.buffer {
            if mo != 0 {
                return Err(v(codes::DDP_U_INVALID_MO));
            }
        }
        let start = hdr.header_len();
        let body = self
            .rx
            .hbuf
            .get(start..start + len)
            .filter(|_| self.rx.hlen >= start + len)
            .ok_or_else(|| v(codes::RDMAP_CATASTROPHIC_STREAM))?;
        if !hdr.last || self.rx.ulpdu_len > self.rx.hlen {
            return Err(v(codes::DDP_U_MSG_TOO_LONG));
        }
        Ok(body)
    }

    fn rx_end(&mut self, crc_ok: bool, env: &mut Env<'_>) {
        if !crc_ok {
            self.stats.crc_errors += 1;
            self.local_violation(Violation::plain(codes::MPA_CRC), env);
            return;
        }
        let target = self.rx.target;
        match target {
            Target::Reject(v) => {
                self.local_violation(v, env);
                return;
            }
            Target::Header => {
                // The ULPDU ended before its header did.
                let v = Violation {
                    ddp_hdr: self.rx.hdr,
                    seg_len: self.rx.ulpdu_len as u16,
                    ..Violation::plain(codes::RDMAP_CATASTROPHIC_STREAM)
                };
                self.local_violation(v, env);
                return;
            }
            Target::Tagged(_) | Target::Recv { .. } | Target::Nothing => {}
        }
        self.stats.rx_fpdus += 1;
        // Set only now: the FPDU is complete and validated.
        self.rx.first_fpdu_seen = true;
        let Some(hdr) = self.rx.hdr else { return };
        let payload = (self.rx.ulpdu_len - self.rx.hlen) as u64;
        let Some(op) = Opcode::from_raw(hdr.opcode) else {
            return;
        };
        let rtr = self.rx.rtr.take();
        match op {
            Opcode::Write => {}
            Opcode::ReadResponse => {
                let Some(o) = self.orq.front_mut() else {
                    return;
                };
                o.received += payload;
                if hdr.last {
                    let o = *o;
                    self.orq.pop_front();
                    if let Some(seq) = o.seq {
                        self.set_inflight_status(seq, WcStatus::Success);
                        self.drain_inflight(env);
                    }
                }
            }
            Opcode::Send
            | Opcode::SendInvalidate
            | Opcode::SendSolicited
            | Opcode::SendSolicitedInvalidate => {
                self.rx.send_received += payload;
                if !hdr.last {
                    return;
                }
                let total = core::mem::take(&mut self.rx.send_received);
                self.rx.expect_msn[QN_SEND as usize] =
                    self.rx.expect_msn[QN_SEND as usize].wrapping_add(1);
                if rtr == Some(RtrType::Send) {
                    return;
                }
                let mut invalidated = None;
                if let Buffer::Untagged { inv_stag, .. } = hdr.buffer {
                    if op.invalidates() {
                        if env.mem.invalidate(inv_stag, self.pd).is_err() {
                            let v = Violation {
                                ddp_hdr: Some(hdr),
                                seg_len: self.rx.ulpdu_len as u16,
                                ..Violation::plain(codes::RDMAP_CANNOT_INVALIDATE_PROT)
                            };
                            self.local_violation(v, env);
                            return;
                        }
                        invalidated = Some(inv_stag);
                    }
                }
                if let Some(rq) = self.rq.pop_front() {
                    let wc = WorkCompletion {
                        wr_id: rq.wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::Recv,
                        byte_len: total as u32,
                        qp: self.id,
                        invalidated_stag: invalidated,
                        solicited: op.solicited(),
                        imm_data: None,
                    };
                    self.complete(self.recv_cq, wc, env);
                }
            }
            Opcode::ImmediateData | Opcode::ImmediateDataSolicited => {
                self.rx.expect_msn[QN_SEND as usize] =
                    self.rx.expect_msn[QN_SEND as usize].wrapping_add(1);
                let start = hdr.header_len();
                let Some(data) = self
                    .rx
                    .hbuf
                    .get(start..start + IMMEDIATE_LEN)
                    .and_then(|b| <[u8; IMMEDIATE_LEN]>::try_from(b).ok())
                else {
                    return;
                };
                if let Some(rq) = self.rq.pop_front() {
                    let wc = WorkCompletion {
                        wr_id: rq.wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::Recv,
                        byte_len: 0,
                        qp: self.id,
                        invalidated_stag: None,
                        solicited: op.solicited(),
                        imm_data: Some(u64::from_be_bytes(data)),
                    };
                    self.complete(self.recv_cq, wc, env);
                }
            }
            Opcode::ReadRequest | Opcode::AtomicRequest => {
                self.rx.expect_msn[QN_READ_REQUEST as usize] =
                    self.rx.expect_msn[QN_READ_REQUEST as usize].wrapping_add(1);
                let body = &self.rx.hbuf[hdr.header_len()..self.rx.hlen];
                let entry = if op == Opcode::ReadRequest {
                    ReadRequest::parse(body).ok().map(IrqEntry::Read)
                } else {
                    AtomicRequest::parse(body).ok().map(IrqEntry::Atomic)
                };
                self.irq.extend(entry);
            }
            Opcode::AtomicResponse => {
                self.rx.expect_msn[QN_ATOMIC_RESPONSE as usize] =
                    self.rx.expect_msn[QN_ATOMIC_RESPONSE as usize].wrapping_add(1);
                let body = &self.rx.hbuf[hdr.header_len()..self.rx.hlen];
                let (Ok(resp), Some(o)) = (AtomicResponse::parse(body), self.aorq.pop_front())
                else {
                    return;
                };
                // Validated: the sink is writable; the value goes in native
                // byte order, as the responder's memory held it.
                if let Ok(span) = env.mem.check(
                    o.sink.lkey,
                    self.pd,
                    o.sink.addr,
                    ATOMIC_LEN as usize,
                    Access::LOCAL_WRITE,
                ) {
                    env.mem.write(span, &resp.orig.to_ne_bytes());
                }
                self.set_inflight_status(o.seq, WcStatus::Success);
                self.drain_inflight(env);
            }
            Opcode::Terminate => {
                self.rx.expect_msn[QN_TERMINATE as usize] =
                    self.rx.expect_msn[QN_TERMINATE as usize].wrapping_add(1);
                let start = hdr.header_len();
                let parsed = TerminateRepr::parse(&self.rx.hbuf[start..self.rx.hlen]).ok();
                let bits = parsed.map_or(0, |t| t.raw_code_bits);
                qp_event!(
                    self.span,
                    WARN,
                    layer = bits >> 12,
                    layer_name = Layer::from_raw((bits >> 12) as u8).map_or("unknown", Layer::name),
                    etype = (bits >> 8) & 0xf,
                    code = bits & 0xff,
                    name = TermCode::from_bits(bits).map_or("unknown error", TermCode::name),
                    malformed = parsed.is_none(),
                    "Terminate received"
                );
                let code = parsed
                    .and_then(|t| t.code)
                    .unwrap_or(codes::RDMAP_UNSPECIFIED_OP);
                self.events.push_back(QpEvent::RemoteTerminate(code));
                self.fail_oldest_inflight(status_for_remote(code));
                self.enter_error(env);
                self.wants_close = true;
            }
        }
    }
}
