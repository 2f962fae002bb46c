//! MPA connection setup (RFC 5044 §7.1, RFC 6581): the request/reply
//! exchange for initiator and responder, sans-IO.
//!
//! Drive it like every state machine of this crate: feed received bytes to
//! [`Handshake::handle_input`], send what [`Handshake::poll_transmit`]
//! returns, take [`Event`]s from [`Handshake::poll_event`] and call
//! [`Handshake::handle_timeout`] at [`Handshake::poll_timeout`].
//! `handle_input` never consumes past the end of the peer's frame: the
//! bytes after it are FPDUs and stay with the caller.
//!
//! # Negotiation rules
//!
//! * **CRC** (RFC 5044): used in both directions if either frame has C
//!   set. The responder echoes the initiator's C bit (like Linux siw), so
//!   its reply shows the outcome.
//! * **Markers** (RFC 5044): per direction. M in a frame means its sender
//!   wants markers in the stream it receives: `markers_tx` = peer's M,
//!   `markers_rx` = our [`Config::markers`].
//! * **Revision**: a rev 2 endpoint sends RFC 6581 enhanced frames (Rev 2
//!   and the enhanced bit, IRD/ORD words first in the private data). The
//!   responder replies with `min(own, request's)` revision and includes the
//!   IRD/ORD words only if the request had them and it speaks rev 2. A rev
//!   2 initiator accepts a rev 1 reply, or a rev 2 reply without the
//!   enhanced bit (RFC 6581 only defines the IRD/ORD words when that bit
//!   is set; without it the private data is all ULP data): no IRD/ORD
//!   exchange, P2P off. Rev 0 and revisions above 2 (or above the
//!   initiator's own) are [`HandshakeError::UnsupportedRevision`].
//! * **IRD/ORD** (enhanced only): `Negotiated::ird` is the IRD we
//!   advertised and `Negotiated::ord` is `min(our configured ORD, peer's
//!   advertised IRD)`, so our ORD never exceeds the peer's IRD. The
//!   responder clamps to the request like siw does: it advertises
//!   `ird = min(config.ird, request ORD)`, `ord = min(config.ord, request
//!   IRD)`. The initiator advertises its configured values and fails with
//!   [`HandshakeError::InsufficientIrd`] if the reply's ORD exceeds its IRD
//!   or if the chosen RTR is an RDMA Read but its ORD ended up 0. Without
//!   the exchange (rev 1) the configured values are returned as they are.
//! * **P2P and RTR** (enhanced only): the initiator with [`Config::p2p`]
//!   sets P2P and offers the RTR types of [`Config::rtr`]. The responder
//!   follows the initiator's P2P choice (its own `p2p` flag is not used)
//!   and picks exactly one type from the intersection of offered and its
//!   acceptable [`Config::rtr`], preferring Write, then Send, then Read
//!   (Read only if the IRD it advertises is at least 1). No common type:
//!   the responder queues a reply with R=1 and fails with
//!   [`HandshakeError::NoMatchingRtr`]. The initiator fails with the same
//!   error if an enhanced reply to a P2P request does not carry P2P and
//!   exactly one offered RTR type, or carries P2P unasked.
//! * **Private data**: the private data field holds at most 512 bytes
//!   ([`MAX_PRIVATE_DATA`]); in an enhanced frame the 4 IRD/ORD bytes count
//!   toward it (RFC 6581), leaving [`MAX_ULP_PRIVATE_DATA_ENHANCED`] = 508
//!   bytes for the ULP. Longer ULP data is refused by
//!   [`Handshake::initiator`], [`Handshake::accept`] and
//!   [`Handshake::reject`] with [`HandshakeError::PrivateDataTooLong`]; a
//!   received PD_Length above 512 is [`HandshakeError::InvalidFrame`].
//! * **Timeout**: one deadline, `now + timeout` at construction, for the
//!   whole exchange including the transmission of our own frame.

use core::fmt;
use std::collections::VecDeque;

use crate::error::{codes, TermCode};
use crate::time::{Duration, Instant};
use crate::wire::mpa::{
    FrameKind, FrameRepr, IrdOrd, HEADER_LEN, MAX_PRIVATE_DATA, REPLY_KEY, REQUEST_KEY,
};

/// ULP private data limit of an enhanced (RFC 6581) frame: 512 minus the 4
/// IRD/ORD bytes.
pub const MAX_ULP_PRIVATE_DATA_ENHANCED: usize = MAX_PRIVATE_DATA - IrdOrd::LEN;

/// The kind of ready-to-receive (RTR) message of RFC 6581 P2P mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RtrType {
    /// A zero-length Send.
    Send,
    /// A zero-length RDMA Write.
    Write,
    /// A zero-length RDMA Read.
    Read,
}

/// A set of RTR types: the RTR flags of the RFC 6581 IRD/ORD words (the
/// "Send" flag in the IRD word, "Write" and "Read" in the ORD word).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RtrSet {
    /// A zero-length Send may serve as RTR.
    pub send: bool,
    /// A zero-length RDMA Write may serve as RTR.
    pub write: bool,
    /// A zero-length RDMA Read may serve as RTR.
    pub read: bool,
}

impl RtrSet {
    /// All three types.
    pub const ALL: Self = Self {
        send: true,
        write: true,
        read: true,
    };

    /// Whether no type is in the set.
    pub fn is_empty(&self) -> bool {
        !(self.send || self.write || self.read)
    }

    /// Whether `t` is in the set.
    pub fn contains(&self, t: RtrType) -> bool {
        match t {
            RtrType::Send => self.send,
            RtrType::Write => self.write,
            RtrType::Read => self.read,
        }
    }

    /// The set holding just `t`.
    pub fn only(t: RtrType) -> Self {
        Self {
            send: t == RtrType::Send,
            write: t == RtrType::Write,
            read: t == RtrType::Read,
        }
    }

    fn from_words(w: &IrdOrd) -> Self {
        Self {
            send: w.rtr_send,
            write: w.rtr_write,
            read: w.rtr_read,
        }
    }

    fn count(&self) -> usize {
        usize::from(self.send) + usize::from(self.write) + usize::from(self.read)
    }
}

/// What one side offers or accepts in the MPA Request/Reply exchange.
#[derive(Clone, Debug)]
pub struct Config {
    /// MPA revision: 1, or 2 for RFC 6581 enhanced connection setup.
    pub revision: u8,
    /// Set the C flag: ask for CRC32c on every FPDU (used in both
    /// directions if either side asks).
    pub crc: bool,
    /// Set the M flag: ask the peer to insert markers in the stream this
    /// side receives (RFC 5044 §4.3).
    pub markers: bool,
    /// IRD offered: the most RDMA Read and Atomic Requests this side
    /// serves at once as responder (at most 0x3fff).
    pub ird: u16,
    /// ORD offered: the most RDMA Read and Atomic Requests this side keeps
    /// outstanding as requester (at most 0x3fff).
    pub ord: u16,
    /// Rev 2 initiator: request peer-to-peer mode (needs an RTR type).
    pub p2p: bool,
    /// Initiator: RTR types offered; responder: RTR types acceptable.
    pub rtr: RtrSet,
    /// Time allowed for the whole exchange, from `initiator`/`responder`
    /// to the connection being set up; past it the handshake fails with
    /// [`HandshakeError::Timeout`].
    pub timeout: Duration,
    /// Responder: send FPDUs without waiting for the initiator's first one.
    /// RFC 5044 §7.1.2 forbids this, and it is off by default; some peers
    /// rely on it anyway (perftest's `ib_write_lat`, whose server writes
    /// first, works between two siw drivers because siw does not enforce
    /// the rule). With it on, leave the initiator time to process the MPA
    /// reply before the first FPDU: siw as initiator fails a connection
    /// whose first FPDU arrives together with the reply.
    pub responder_sends_first: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            revision: 2,
            crc: false,
            markers: false,
            ird: 1,
            ord: 1,
            p2p: false,
            rtr: RtrSet::ALL,
            timeout: Duration::from_secs(10),
            responder_sends_first: false,
        }
    }
}

/// What a successful MPA exchange settled, seen from this side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// Revision of the reply (the lower of both sides').
    pub revision: u8,
    /// CRC32c on every FPDU, both directions (either side set C).
    pub crc: bool,
    /// The peer asked for markers: we insert them in what we send.
    pub markers_tx: bool,
    /// We asked for markers: the peer inserts them.
    pub markers_rx: bool,
    /// This side's IRD after the exchange: the most Read and Atomic
    /// Requests it serves at once.
    pub ird: u16,
    /// Our ORD after the exchange (never above the peer's IRD).
    pub ord: u16,
    /// RFC 6581 peer-to-peer mode: the initiator sends `rtr` first.
    pub p2p: bool,
    /// The chosen RTR type (P2P only).
    pub rtr: Option<RtrType>,
}

/// The peer's MPA Request, as the responder sees it before it accepts or
/// rejects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The request's Rev field (1 or 2).
    pub revision: u8,
    /// The request's C flag: the initiator asked for CRC32c.
    pub crc: bool,
    /// The request's M flag: the initiator wants markers in what it
    /// receives.
    pub markers: bool,
    /// The RFC 6581 IRD/ORD words, if the request is enhanced.
    pub ird_ord: Option<IrdOrd>,
    /// The ULP private data (IRD/ORD words stripped).
    pub private_data: Vec<u8>,
}

/// A handshake event, in the order they occur, from `poll_event`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Responder: the request arrived; call `accept` or `reject`.
    ConnectRequest(ConnectRequest),
    /// Both roles: the connection is set up. `private_data` is the peer's
    /// ULP private data (IRD/ORD words stripped).
    Established {
        /// What the exchange settled.
        negotiated: Negotiated,
        /// The peer's ULP private data (IRD/ORD words stripped).
        private_data: Vec<u8>,
    },
    /// Initiator: the peer replied with R=1.
    Rejected {
        /// The ULP private data of the rejecting Reply (IRD/ORD words
        /// stripped).
        private_data: Vec<u8>,
    },
    /// The handshake failed; close the connection after sending what
    /// `poll_transmit` still returns.
    Failed(HandshakeError),
}

/// Why a handshake failed (or an API call was refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandshakeError {
    /// [`Config::timeout`] passed before the exchange completed.
    Timeout,
    /// The peer's frame does not start with the expected key.
    InvalidKey,
    /// The peer's frame is malformed (PD_Length > 512, R in a request,
    /// missing IRD/ORD words in an enhanced frame).
    InvalidFrame,
    /// The private data given exceeds 512 bytes, or 508
    /// ([`MAX_ULP_PRIVATE_DATA_ENHANCED`]) with IRD/ORD words.
    PrivateDataTooLong,
    /// Revision 0, above 2, or a reply above the request's revision.
    UnsupportedRevision,
    /// No RTR type both sides accept (RFC 6581).
    NoMatchingRtr,
    /// The IRD/ORD exchange left this side unable to proceed (RFC 6581):
    /// the reply's ORD exceeds the initiator's IRD, or the chosen RTR is an
    /// RDMA Read while the initiator's ORD is 0.
    InsufficientIrd,
    /// The call does not fit the current state (e.g. `accept` twice).
    NotExpected,
}

impl HandshakeError {
    /// The Terminate code (layer LLP, MPA error type) a Terminate for this
    /// error carries (RFC 5044 §8, RFC 6581).
    pub fn term_code(self) -> TermCode {
        match self {
            Self::Timeout
            | Self::InvalidKey
            | Self::InvalidFrame
            | Self::PrivateDataTooLong
            | Self::UnsupportedRevision => codes::MPA_INVALID_REQ_REP,
            Self::NoMatchingRtr => codes::MPA_NO_MATCHING_RTR,
            Self::InsufficientIrd => codes::MPA_INSUFFICIENT_IRD,
            Self::NotExpected => codes::MPA_LOCAL_CATASTROPHIC,
        }
    }
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Timeout => "MPA handshake timed out",
            Self::InvalidKey => "invalid MPA request/reply key",
            Self::InvalidFrame => "invalid MPA request/reply frame",
            Self::PrivateDataTooLong => "MPA private data too long",
            Self::UnsupportedRevision => "unsupported MPA revision",
            Self::NoMatchingRtr => "no matching RTR model",
            Self::InsufficientIrd => "insufficient IRD resources",
            Self::NotExpected => "operation not expected in this handshake state",
        })
    }
}

impl core::error::Error for HandshakeError {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Initiator,
    Responder,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Waiting for (the rest of) the peer's frame.
    AwaitFrame,
    /// Responder: request received, waiting for accept/reject.
    AwaitAccept,
    Established,
    /// Rejected (by us or the peer): no connection.
    Rejected,
    Failed,
}

/// What the responder keeps from the request until `accept`/`reject`.
#[derive(Clone, Copy, Debug)]
struct PendingReply {
    revision: u8,
    enhanced: bool,
    peer_crc: bool,
    peer_markers: bool,
    peer_words: Option<IrdOrd>,
    rtr: Option<RtrType>,
}

/// The MPA request/reply state machine of one connection.
#[derive(Debug)]
pub struct Handshake {
    role: Role,
    config: Config,
    deadline: Instant,
    state: State,
    rx: Vec<u8>,
    tx: Vec<u8>,
    tx_pos: usize,
    events: VecDeque<Event>,
    negotiated: Option<Negotiated>,
    pending: Option<PendingReply>,
    peer_private_data: Vec<u8>,
}

fn clamp_rev(rev: u8) -> u8 {
    rev.clamp(1, 2)
}

impl Handshake {
    fn new(role: Role, mut config: Config, now: Instant) -> Self {
        config.ird = config.ird.min(IrdOrd::MAX);
        config.ord = config.ord.min(IrdOrd::MAX);
        Self {
            role,
            deadline: now + config.timeout,
            config,
            state: State::AwaitFrame,
            rx: Vec::new(),
            tx: Vec::new(),
            tx_pos: 0,
            events: VecDeque::new(),
            negotiated: None,
            pending: None,
            peer_private_data: Vec::new(),
        }
    }

    /// An initiator; queues the MPA request carrying `private_data`.
    ///
    /// Errors: `UnsupportedRevision` unless `config.revision` is 1 or 2;
    /// `PrivateDataTooLong` beyond 512 bytes (508 for revision 2);
    /// `NoMatchingRtr` for revision 2 with `p2p` and an empty `rtr` set.
    pub fn initiator(
        config: Config,
        private_data: &[u8],
        now: Instant,
    ) -> Result<Self, HandshakeError> {
        if !(1..=2).contains(&config.revision) {
            return Err(HandshakeError::UnsupportedRevision);
        }
        let enhanced = config.revision == 2;
        let p2p = enhanced && config.p2p;
        if p2p && config.rtr.is_empty() {
            return Err(HandshakeError::NoMatchingRtr);
        }
        let mut hs = Self::new(Role::Initiator, config, now);
        let words = enhanced.then(|| {
            let rtr = if p2p {
                hs.config.rtr
            } else {
                RtrSet::default()
            };
            IrdOrd {
                ird: hs.config.ird,
                ord: hs.config.ord,
                p2p,
                rtr_send: rtr.send,
                rtr_write: rtr.write,
                rtr_read: rtr.read,
            }
        });
        hs.tx = build_frame(
            FrameKind::Request,
            hs.config.markers,
            hs.config.crc,
            false,
            hs.config.revision,
            words,
            private_data,
        )?;
        Ok(hs)
    }

    /// A responder waiting for the MPA request. A `config.revision`
    /// outside 1..=2 is clamped into it.
    pub fn responder(mut config: Config, now: Instant) -> Self {
        config.revision = clamp_rev(config.revision);
        Self::new(Role::Responder, config, now)
    }

    fn fail(&mut self, e: HandshakeError) -> HandshakeError {
        self.state = State::Failed;
        self.events.push_back(Event::Failed(e));
        e
    }

    /// Feed bytes received from the peer. Returns how many were consumed:
    /// never more than up to the end of the peer's request/reply (0 once
    /// it has been received). On a protocol error the handshake fails:
    /// the error is returned and also reported as [`Event::Failed`].
    pub fn handle_input(&mut self, input: &[u8], now: Instant) -> Result<usize, HandshakeError> {
        if self.state != State::AwaitFrame {
            return Ok(0);
        }
        if now >= self.deadline {
            return Err(self.fail(HandshakeError::Timeout));
        }
        let key: &[u8; 16] = match self.role {
            Role::Initiator => REPLY_KEY,
            Role::Responder => REQUEST_KEY,
        };
        let mut consumed = 0;
        let mut input = input;
        // The key, checked byte by byte so garbage fails at once.
        while self.rx.len() < key.len() {
            let Some((&b, rest)) = input.split_first() else {
                return Ok(consumed);
            };
            if b != key[self.rx.len()] {
                return Err(self.fail(HandshakeError::InvalidKey));
            }
            self.rx.push(b);
            input = rest;
            consumed += 1;
        }
        // The rest of the header.
        if self.rx.len() < HEADER_LEN {
            let n = (HEADER_LEN - self.rx.len()).min(input.len());
            self.rx.extend_from_slice(&input[..n]);
            input = &input[n..];
            consumed += n;
            if self.rx.len() < HEADER_LEN {
                return Ok(consumed);
            }
        }
        let Ok(total) = FrameRepr::frame_len(&self.rx) else {
            return Err(self.fail(HandshakeError::InvalidFrame));
        };
        let n = total.saturating_sub(self.rx.len()).min(input.len());
        self.rx.extend_from_slice(&input[..n]);
        consumed += n;
        if self.rx.len() < total {
            return Ok(consumed);
        }
        let rx = core::mem::take(&mut self.rx);
        let result = match FrameRepr::parse(&rx) {
            Ok(frame) => match self.role {
                Role::Responder => self.on_request(&frame),
                Role::Initiator => self.on_reply(&frame),
            },
            Err(_) => Err(HandshakeError::InvalidFrame),
        };
        match result {
            Ok(()) => Ok(consumed),
            Err(e) => {
                if self.state != State::Failed {
                    self.fail(e);
                }
                Err(e)
            }
        }
    }

    fn on_request(&mut self, frame: &FrameRepr<'_>) -> Result<(), HandshakeError> {
        if !(1..=2).contains(&frame.revision) {
            return Err(HandshakeError::UnsupportedRevision);
        }
        if frame.reject {
            return Err(HandshakeError::InvalidFrame);
        }
        let (peer_words, ulp) = split_words(frame)?;
        let revision = frame.revision.min(self.config.revision);
        let enhanced = peer_words.is_some() && revision == 2;
        let mut pending = PendingReply {
            revision,
            enhanced,
            peer_crc: frame.crc,
            peer_markers: frame.markers,
            peer_words,
            rtr: None,
        };
        if let (true, Some(w)) = (enhanced, peer_words) {
            if w.p2p {
                let ird = self.config.ird.min(w.ord);
                let offered = RtrSet::from_words(&w);
                let ok = self.config.rtr;
                pending.rtr = [RtrType::Write, RtrType::Send, RtrType::Read]
                    .into_iter()
                    .find(|&t| {
                        offered.contains(t) && ok.contains(t) && (t != RtrType::Read || ird > 0)
                    });
                if pending.rtr.is_none() {
                    // Reply with R=1 before failing (RFC 6581).
                    self.pending = Some(pending);
                    self.queue_reply(true, &[])?;
                    return Err(self.fail(HandshakeError::NoMatchingRtr));
                }
            }
        }
        self.pending = Some(pending);
        self.peer_private_data = ulp.to_vec();
        self.state = State::AwaitAccept;
        self.events.push_back(Event::ConnectRequest(ConnectRequest {
            revision: frame.revision,
            crc: frame.crc,
            markers: frame.markers,
            ird_ord: peer_words,
            private_data: ulp.to_vec(),
        }));
        Ok(())
    }

    /// Our IRD/ORD as the responder advertises them.
    fn responder_ird_ord(&self, p: &PendingReply) -> (u16, u16) {
        match (p.enhanced, p.peer_words) {
            (true, Some(w)) => (self.config.ird.min(w.ord), self.config.ord.min(w.ird)),
            _ => (self.config.ird, self.config.ord),
        }
    }

    fn queue_reply(&mut self, reject: bool, private_data: &[u8]) -> Result<(), HandshakeError> {
        let p = self.pending.ok_or(HandshakeError::NotExpected)?;
        let (ird, ord) = self.responder_ird_ord(&p);
        let rtr = p.rtr.map(RtrSet::only).unwrap_or_default();
        let words = p.enhanced.then_some(IrdOrd {
            ird,
            ord,
            p2p: p.rtr.is_some() && !reject,
            rtr_send: rtr.send && !reject,
            rtr_write: rtr.write && !reject,
            rtr_read: rtr.read && !reject,
        });
        self.tx = build_frame(
            FrameKind::Reply,
            self.config.markers,
            self.config.crc || p.peer_crc,
            reject,
            p.revision,
            words,
            private_data,
        )?;
        self.tx_pos = 0;
        Ok(())
    }

    fn on_reply(&mut self, frame: &FrameRepr<'_>) -> Result<(), HandshakeError> {
        if !(1..=self.config.revision).contains(&frame.revision) {
            return Err(HandshakeError::UnsupportedRevision);
        }
        if frame.reject {
            let pd = if frame.enhanced && frame.revision == 2 {
                frame.private_data.get(IrdOrd::LEN..).unwrap_or(&[])
            } else {
                frame.private_data
            };
            self.state = State::Rejected;
            self.events.push_back(Event::Rejected {
                private_data: pd.to_vec(),
            });
            return Ok(());
        }
        let (words, ulp) = split_words(frame)?;
        let asked_p2p = self.config.revision == 2 && self.config.p2p;
        let (ird, ord, rtr) = match words {
            Some(w) => {
                if w.ord > self.config.ird {
                    return Err(HandshakeError::InsufficientIrd);
                }
                let ord = self.config.ord.min(w.ird);
                let chosen = RtrSet::from_words(&w);
                let rtr = if asked_p2p {
                    let t = [RtrType::Write, RtrType::Send, RtrType::Read]
                        .into_iter()
                        .find(|&t| chosen.contains(t));
                    match t {
                        Some(t) if w.p2p && chosen.count() == 1 && self.config.rtr.contains(t) => {
                            Some(t)
                        }
                        _ => return Err(HandshakeError::NoMatchingRtr),
                    }
                } else if w.p2p {
                    return Err(HandshakeError::NoMatchingRtr);
                } else {
                    None
                };
                if rtr == Some(RtrType::Read) && ord == 0 {
                    return Err(HandshakeError::InsufficientIrd);
                }
                (self.config.ird, ord, rtr)
            }
            None => (self.config.ird, self.config.ord, None),
        };
        let negotiated = Negotiated {
            revision: frame.revision,
            crc: self.config.crc || frame.crc,
            markers_tx: frame.markers,
            markers_rx: self.config.markers,
            ird,
            ord,
            p2p: rtr.is_some(),
            rtr,
        };
        self.establish(negotiated, ulp.to_vec());
        Ok(())
    }

    fn establish(&mut self, negotiated: Negotiated, private_data: Vec<u8>) {
        self.state = State::Established;
        self.negotiated = Some(negotiated.clone());
        self.events.push_back(Event::Established {
            negotiated,
            private_data,
        });
    }

    fn check_accept(&self, private_data: &[u8]) -> Result<PendingReply, HandshakeError> {
        if self.role != Role::Responder || self.state != State::AwaitAccept {
            return Err(HandshakeError::NotExpected);
        }
        let p = self.pending.ok_or(HandshakeError::NotExpected)?;
        let max = if p.enhanced {
            MAX_ULP_PRIVATE_DATA_ENHANCED
        } else {
            MAX_PRIVATE_DATA
        };
        if private_data.len() > max {
            return Err(HandshakeError::PrivateDataTooLong);
        }
        Ok(p)
    }

    /// Responder, after [`Event::ConnectRequest`]: accept the connection
    /// and queue the reply. [`Event::Established`] follows at once;
    /// [`Self::is_done`] once the reply is transmitted. On
    /// `PrivateDataTooLong` nothing changes and the call may be retried.
    pub fn accept(&mut self, private_data: &[u8]) -> Result<(), HandshakeError> {
        let p = self.check_accept(private_data)?;
        self.queue_reply(false, private_data)?;
        let (ird, ord) = self.responder_ird_ord(&p);
        let negotiated = Negotiated {
            revision: p.revision,
            crc: self.config.crc || p.peer_crc,
            markers_tx: p.peer_markers,
            markers_rx: self.config.markers,
            ird,
            ord,
            p2p: p.rtr.is_some(),
            rtr: p.rtr,
        };
        let pd = core::mem::take(&mut self.peer_private_data);
        self.establish(negotiated, pd);
        Ok(())
    }

    /// Responder, after [`Event::ConnectRequest`]: refuse the connection
    /// with a reply carrying R=1. Close the TCP connection once
    /// `poll_transmit` has returned the reply.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), HandshakeError> {
        self.check_accept(private_data)?;
        self.queue_reply(true, private_data)?;
        self.state = State::Rejected;
        Ok(())
    }

    /// Copy the next bytes of our pending frame into `out`; returns how
    /// many. Resumable at any boundary.
    pub fn poll_transmit(&mut self, out: &mut [u8]) -> usize {
        let rest = self.tx.get(self.tx_pos..).unwrap_or(&[]);
        let n = rest.len().min(out.len());
        out[..n].copy_from_slice(&rest[..n]);
        self.tx_pos += n;
        n
    }

    /// Bytes of our frame not yet returned by `poll_transmit`.
    pub(crate) fn tx_remaining(&self) -> usize {
        self.tx.len().saturating_sub(self.tx_pos)
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The deadline, while the handshake is still in progress.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::AwaitFrame | State::AwaitAccept => Some(self.deadline),
            State::Established if !self.is_done() => Some(self.deadline),
            _ => None,
        }
    }

    /// Fail with [`HandshakeError::Timeout`] if `now` is at or past the
    /// deadline and the handshake is not done. Harmless otherwise.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.poll_timeout().is_some_and(|d| now >= d) {
            self.negotiated = None;
            self.fail(HandshakeError::Timeout);
        }
    }

    /// The negotiated parameters, once established.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.negotiated.as_ref()
    }

    /// Established and our own frame completely transmitted.
    pub fn is_done(&self) -> bool {
        self.state == State::Established && self.tx_pos >= self.tx.len()
    }

    /// The handshake ended without a connection (rejected by either side,
    /// failed or timed out). Send what `poll_transmit` still returns, then
    /// close the TCP connection.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Rejected | State::Failed)
    }
}

/// Split an enhanced frame's private data into IRD/ORD words and ULP data.
/// A frame counts as enhanced if it is rev 2 with the enhanced bit.
fn split_words<'a>(frame: &FrameRepr<'a>) -> Result<(Option<IrdOrd>, &'a [u8]), HandshakeError> {
    if frame.revision == 2 && frame.enhanced {
        let words = IrdOrd::parse(frame.private_data).map_err(|_| HandshakeError::InvalidFrame)?;
        let ulp = frame.private_data.get(IrdOrd::LEN..).unwrap_or(&[]);
        Ok((Some(words), ulp))
    } else {
        Ok((None, frame.private_data))
    }
}

fn build_frame(
    kind: FrameKind,
    markers: bool,
    crc: bool,
    reject: bool,
    revision: u8,
    words: Option<IrdOrd>,
    ulp: &[u8],
) -> Result<Vec<u8>, HandshakeError> {
    let mut pd = Vec::with_capacity(IrdOrd::LEN + ulp.len());
    if let Some(w) = words {
        pd.extend_from_slice(&[0; IrdOrd::LEN]);
        w.emit(&mut pd);
    }
    pd.extend_from_slice(ulp);
    if pd.len() > MAX_PRIVATE_DATA {
        return Err(HandshakeError::PrivateDataTooLong);
    }
    let frame = FrameRepr {
        kind,
        markers,
        crc,
        reject,
        enhanced: words.is_some(),
        reserved: 0,
        revision,
        private_data: &pd,
    };
    let mut out = vec![0; frame.buffer_len()];
    frame.emit(&mut out);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Instant = Instant::ZERO;

    /// siw-rping.pcapng frame 1: MPA Request, rev 2 enhanced, IRD/ORD 1/1.
    const SIW_REQUEST: [u8; 24] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d,
        0x65, 0x10, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01,
    ];
    /// siw-rping.pcapng frame 2: MPA Reply, rev 2 enhanced, IRD/ORD 1/1.
    const SIW_REPLY: [u8; 24] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6d,
        0x65, 0x10, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01,
    ];
    /// siw-crc-rping-ib_write_bw.pcapng: the reply echoing C (flags 0x50).
    const SIW_CRC_REPLY: [u8; 24] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6d,
        0x65, 0x50, 0x02, 0x00, 0x04, 0x00, 0x01, 0x00, 0x01,
    ];

    fn frame(kind: FrameKind, flags: u8, rev: u8, pd: &[u8]) -> Vec<u8> {
        let mut v = kind.key().to_vec();
        v.push(flags);
        v.push(rev);
        v.extend_from_slice(&u16::try_from(pd.len()).unwrap().to_be_bytes());
        v.extend_from_slice(pd);
        v
    }

    fn drain(hs: &mut Handshake, chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = vec![0; chunk];
        loop {
            let n = hs.poll_transmit(&mut buf);
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    /// Feed `bytes` in chunks of `split`; returns total consumed or error.
    fn feed(hs: &mut Handshake, bytes: &[u8], split: usize) -> Result<usize, HandshakeError> {
        let mut total = 0;
        for chunk in bytes.chunks(split) {
            let n = hs.handle_input(chunk, T0)?;
            total += n;
            if n < chunk.len() {
                break;
            }
        }
        Ok(total)
    }

    fn events(hs: &mut Handshake) -> Vec<Event> {
        core::iter::from_fn(|| hs.poll_event()).collect()
    }

    struct Outcome {
        init: Result<Negotiated, Event>,
        resp: Result<Negotiated, Event>,
        request: Option<ConnectRequest>,
        init_pd: Vec<u8>,
        resp_pd: Vec<u8>,
    }

    fn last_outcome(evs: Vec<Event>) -> (Result<Negotiated, Event>, Vec<u8>) {
        match evs.into_iter().last() {
            Some(Event::Established {
                negotiated,
                private_data,
            }) => (Ok(negotiated), private_data),
            Some(e) => (Err(e), Vec::new()),
            None => (Err(Event::Failed(HandshakeError::NotExpected)), Vec::new()),
        }
    }

    /// Run initiator and responder against each other in memory, moving
    /// bytes in chunks of `split` (and trailing FPDU bytes after each
    /// frame, which must not be consumed).
    fn run(icfg: Config, rcfg: Config, ipd: &[u8], rpd: &[u8], split: usize) -> Outcome {
        let mut init = Handshake::initiator(icfg, ipd, T0).unwrap();
        let mut resp = Handshake::responder(rcfg, T0);
        let mut req = drain(&mut init, split);
        let req_len = req.len();
        req.extend_from_slice(b"FPDU");
        let consumed = feed(&mut resp, &req, split);
        let mut request = None;
        let resp_events = events(&mut resp);
        let mut resp_events_all = resp_events.clone();
        if let Some(Event::ConnectRequest(r)) = resp_events.first() {
            assert_eq!(consumed, Ok(req_len));
            request = Some(r.clone());
            resp.accept(rpd).unwrap();
            resp_events_all.extend(events(&mut resp));
        }
        let mut rep = drain(&mut resp, split);
        let rep_len = rep.len();
        if rep_len > 0 {
            rep.extend_from_slice(b"FPDU");
            let c = feed(&mut init, &rep, split);
            if c.is_ok() {
                assert_eq!(c, Ok(rep_len));
            }
        }
        let (init_res, init_pd) = last_outcome(events(&mut init));
        let (resp_res, resp_pd) = last_outcome(resp_events_all);
        if init_res.is_ok() {
            assert!(init.is_done());
            assert_eq!(init.poll_timeout(), None);
            assert_eq!(init.negotiated(), init_res.as_ref().ok());
        }
        if resp_res.is_ok() {
            assert!(resp.is_done());
        }
        Outcome {
            init: init_res,
            resp: resp_res,
            request,
            init_pd,
            resp_pd,
        }
    }

    #[test]
    fn default_pair_any_split() {
        for split in [1, 2, 3, 7, 19, 20, 21, 23, 1000] {
            let o = run(
                Config::default(),
                Config::default(),
                b"hello",
                b"world!",
                split,
            );
            let expect = Negotiated {
                revision: 2,
                crc: false,
                markers_tx: false,
                markers_rx: false,
                ird: 1,
                ord: 1,
                p2p: false,
                rtr: None,
            };
            assert_eq!(o.init, Ok(expect.clone()));
            assert_eq!(o.resp, Ok(expect));
            assert_eq!(o.init_pd, b"world!");
            assert_eq!(o.resp_pd, b"hello");
            let r = o.request.unwrap();
            assert_eq!(r.private_data, b"hello");
            assert_eq!(r.ird_ord.map(|w| (w.ird, w.ord)), Some((1, 1)));
        }
    }

    #[test]
    fn crc_negotiation() {
        for (ic, rc) in [(false, false), (true, false), (false, true), (true, true)] {
            let o = run(
                Config {
                    crc: ic,
                    ..Config::default()
                },
                Config {
                    crc: rc,
                    ..Config::default()
                },
                &[],
                &[],
                5,
            );
            assert_eq!(o.init.unwrap().crc, ic || rc);
            assert_eq!(o.resp.unwrap().crc, ic || rc);
        }
    }

    #[test]
    fn markers_per_direction() {
        let o = run(
            Config {
                markers: true,
                ..Config::default()
            },
            Config::default(),
            &[],
            &[],
            64,
        );
        let (i, r) = (o.init.unwrap(), o.resp.unwrap());
        assert!(i.markers_rx && !i.markers_tx);
        assert!(r.markers_tx && !r.markers_rx);
        let o = run(
            Config::default(),
            Config {
                markers: true,
                ..Config::default()
            },
            &[],
            &[],
            64,
        );
        let (i, r) = (o.init.unwrap(), o.resp.unwrap());
        assert!(i.markers_tx && !i.markers_rx);
        assert!(r.markers_rx && !r.markers_tx);
    }

    #[test]
    fn ird_ord_clamping() {
        let icfg = Config {
            ird: 4,
            ord: 8,
            ..Config::default()
        };
        let rcfg = Config {
            ird: 2,
            ord: 16,
            ..Config::default()
        };
        let o = run(icfg, rcfg, &[], &[], 3);
        // Responder: ird = min(2, 8) = 2, ord = min(16, 4) = 4.
        let r = o.resp.unwrap();
        assert_eq!((r.ird, r.ord), (2, 4));
        // Initiator: ird as advertised, ord = min(8, 2) = 2.
        let i = o.init.unwrap();
        assert_eq!((i.ird, i.ord), (4, 2));
        assert!(i.ord <= r.ird && r.ord <= i.ird);
    }

    #[test]
    fn initiator_insufficient_ird() {
        // The reply's ORD (5) exceeds our IRD (1).
        let mut init = Handshake::initiator(Config::default(), &[], T0).unwrap();
        drain(&mut init, 100);
        let rep = frame(FrameKind::Reply, 0x10, 2, &[0x00, 0x01, 0x00, 0x05]);
        assert_eq!(
            init.handle_input(&rep, T0),
            Err(HandshakeError::InsufficientIrd)
        );
        assert_eq!(
            events(&mut init),
            vec![Event::Failed(HandshakeError::InsufficientIrd)]
        );
        assert!(init.is_closed() && init.negotiated().is_none());
        assert_eq!(
            HandshakeError::InsufficientIrd.term_code(),
            codes::MPA_INSUFFICIENT_IRD
        );
        // Read RTR chosen but the peer's IRD 0 leaves our ORD at 0.
        let cfg = Config {
            p2p: true,
            ..Config::default()
        };
        let mut init = Handshake::initiator(cfg, &[], T0).unwrap();
        let rep = frame(FrameKind::Reply, 0x10, 2, &[0x80, 0x00, 0x40, 0x01]);
        assert_eq!(
            init.handle_input(&rep, T0),
            Err(HandshakeError::InsufficientIrd)
        );
    }

    fn p2p_run(offer: RtrSet, accept: RtrSet) -> Outcome {
        run(
            Config {
                p2p: true,
                rtr: offer,
                ..Config::default()
            },
            Config {
                rtr: accept,
                ..Config::default()
            },
            &[],
            &[],
            4,
        )
    }

    #[test]
    fn p2p_rtr_choice() {
        let wr = RtrSet {
            write: true,
            read: true,
            send: false,
        };
        let o = p2p_run(wr, RtrSet::ALL);
        let (i, r) = (o.init.unwrap(), o.resp.unwrap());
        assert!(i.p2p && r.p2p);
        assert_eq!((i.rtr, r.rtr), (Some(RtrType::Write), Some(RtrType::Write)));
        let sr = RtrSet {
            send: true,
            read: true,
            write: false,
        };
        let o = p2p_run(sr, RtrSet::ALL);
        assert_eq!(o.init.unwrap().rtr, Some(RtrType::Send));
        let o = p2p_run(RtrSet::ALL, RtrSet::only(RtrType::Read));
        assert_eq!(o.init.unwrap().rtr, Some(RtrType::Read));
        assert_eq!(o.resp.unwrap().rtr, Some(RtrType::Read));
        // Not asked for: no P2P even if the responder accepts all.
        let o = run(Config::default(), Config::default(), &[], &[], 4);
        assert!(!o.init.unwrap().p2p);
    }

    /// The siw `peer_to_peer=1` words: request `80 01 c0 01` gets a reply
    /// `80 01 80 01` (Write RTR) from us too.
    #[test]
    fn p2p_siw_words() {
        let mut resp = Handshake::responder(Config::default(), T0);
        let req = frame(FrameKind::Request, 0x10, 2, &[0x80, 0x01, 0xc0, 0x01]);
        assert_eq!(resp.handle_input(&req, T0), Ok(24));
        assert!(matches!(events(&mut resp)[..], [Event::ConnectRequest(_)]));
        resp.accept(&[]).unwrap();
        let rep = drain(&mut resp, 100);
        assert_eq!(&rep[20..], &[0x80, 0x01, 0x80, 0x01]);
    }

    #[test]
    fn p2p_no_matching_rtr() {
        let o = p2p_run(
            RtrSet::only(RtrType::Read),
            RtrSet {
                send: true,
                write: true,
                read: false,
            },
        );
        assert_eq!(o.resp, Err(Event::Failed(HandshakeError::NoMatchingRtr)));
        // The responder replied with R=1 before failing.
        assert_eq!(
            o.init,
            Err(Event::Rejected {
                private_data: vec![]
            })
        );
        assert_eq!(
            HandshakeError::NoMatchingRtr.term_code(),
            codes::MPA_NO_MATCHING_RTR
        );

        // The responder's reject reply on the wire.
        let mut resp = Handshake::responder(
            Config {
                rtr: RtrSet::default(),
                ..Config::default()
            },
            T0,
        );
        let req = frame(FrameKind::Request, 0x10, 2, &[0x80, 0x01, 0xc0, 0x01]);
        assert_eq!(
            resp.handle_input(&req, T0),
            Err(HandshakeError::NoMatchingRtr)
        );
        assert!(resp.is_closed());
        assert_eq!(resp.poll_timeout(), None);
        let rep = drain(&mut resp, 7);
        assert_eq!(rep, frame(FrameKind::Reply, 0x30, 2, &[0, 1, 0, 1]));

        // Initiator: a reply choosing a type we did not offer.
        let cfg = Config {
            p2p: true,
            rtr: RtrSet::only(RtrType::Send),
            ..Config::default()
        };
        let mut init = Handshake::initiator(cfg.clone(), &[], T0).unwrap();
        let rep = frame(FrameKind::Reply, 0x10, 2, &[0x80, 0x01, 0x80, 0x01]);
        assert_eq!(
            init.handle_input(&rep, T0),
            Err(HandshakeError::NoMatchingRtr)
        );
        // ... or no P2P in the reply at all.
        let mut init = Handshake::initiator(cfg, &[], T0).unwrap();
        let rep = frame(FrameKind::Reply, 0x10, 2, &[0x00, 0x01, 0x00, 0x01]);
        assert_eq!(
            init.handle_input(&rep, T0),
            Err(HandshakeError::NoMatchingRtr)
        );
        // P2P without any RTR type is refused at construction.
        let bad = Config {
            p2p: true,
            rtr: RtrSet::default(),
            ..Config::default()
        };
        assert_eq!(
            Handshake::initiator(bad, &[], T0).err(),
            Some(HandshakeError::NoMatchingRtr)
        );
    }

    #[test]
    fn rev1_peers() {
        let rev1 = Config {
            revision: 1,
            ..Config::default()
        };
        // Rev 2 initiator, rev 1 responder.
        let p2p = Config {
            p2p: true,
            ird: 3,
            ord: 5,
            ..Config::default()
        };
        let o = run(p2p, rev1.clone(), b"abc", b"def", 2);
        let i = o.init.unwrap();
        assert_eq!(i.revision, 1);
        assert!(!i.p2p && i.rtr.is_none());
        assert_eq!((i.ird, i.ord), (3, 5));
        assert_eq!(o.init_pd, b"def");
        // The rev 1 responder still strips the enhanced request's IRD/ORD words.
        assert_eq!(o.resp_pd, b"abc");
        // Rev 1 initiator, rev 2 responder: rev 1 reply, no IRD/ORD words.
        let mut init = Handshake::initiator(rev1, b"xyz", T0).unwrap();
        let req = drain(&mut init, 100);
        assert_eq!(req, frame(FrameKind::Request, 0, 1, b"xyz"));
        let mut resp = Handshake::responder(Config::default(), T0);
        resp.handle_input(&req, T0).unwrap();
        match &events(&mut resp)[..] {
            [Event::ConnectRequest(r)] => {
                assert_eq!(r.revision, 1);
                assert_eq!(r.ird_ord, None);
                assert_eq!(r.private_data, b"xyz");
            }
            e => panic!("{e:?}"),
        }
        resp.accept(b"ok").unwrap();
        let rep = drain(&mut resp, 100);
        assert_eq!(rep, frame(FrameKind::Reply, 0, 1, b"ok"));
        init.handle_input(&rep, T0).unwrap();
        assert!(init.is_done());
        assert_eq!(init.negotiated().unwrap().revision, 1);
    }

    /// A rev 2 frame without the enhanced bit carries no IRD/ORD words.
    #[test]
    fn rev2_without_enhanced_bit() {
        let mut resp = Handshake::responder(Config::default(), T0);
        let req = frame(FrameKind::Request, 0, 2, b"abcd");
        resp.handle_input(&req, T0).unwrap();
        match &events(&mut resp)[..] {
            [Event::ConnectRequest(r)] => {
                assert_eq!((r.revision, r.ird_ord), (2, None));
                assert_eq!(r.private_data, b"abcd");
            }
            e => panic!("{e:?}"),
        }
        resp.accept(&[]).unwrap();
        assert_eq!(drain(&mut resp, 100), frame(FrameKind::Reply, 0, 2, &[]));

        let mut init = Handshake::initiator(Config::default(), &[], T0).unwrap();
        let rep = frame(FrameKind::Reply, 0, 2, &[0x80, 0x01, 0x80, 0x01]);
        init.handle_input(&rep, T0).unwrap();
        match &events(&mut init)[..] {
            [Event::Established {
                negotiated,
                private_data,
            }] => {
                assert!(!negotiated.p2p);
                assert_eq!(private_data, &[0x80, 0x01, 0x80, 0x01]);
            }
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn private_data_limits() {
        let big = [7u8; 513];
        let init = |rev, n| {
            Handshake::initiator(
                Config {
                    revision: rev,
                    ..Config::default()
                },
                &big[..n],
                T0,
            )
            .err()
        };
        assert_eq!(init(2, MAX_ULP_PRIVATE_DATA_ENHANCED), None);
        assert_eq!(init(2, 509), Some(HandshakeError::PrivateDataTooLong));
        assert_eq!(init(1, 512), None);
        assert_eq!(init(1, 513), Some(HandshakeError::PrivateDataTooLong));

        // Full-size private data both ways, one byte at a time.
        let o = run(
            Config::default(),
            Config::default(),
            &big[..508],
            &big[..508],
            1,
        );
        assert_eq!(o.init_pd.len(), 508);
        assert_eq!(o.resp_pd.len(), 508);

        // accept() with too much: refused, retry possible.
        let mut init = Handshake::initiator(Config::default(), &[], T0).unwrap();
        let mut resp = Handshake::responder(Config::default(), T0);
        resp.handle_input(&drain(&mut init, 100), T0).unwrap();
        assert_eq!(
            resp.accept(&big[..509]),
            Err(HandshakeError::PrivateDataTooLong)
        );
        assert_eq!(
            resp.reject(&big[..509]),
            Err(HandshakeError::PrivateDataTooLong)
        );
        resp.accept(&big[..508]).unwrap();

        // A received PD_Length above 512.
        let mut resp = Handshake::responder(Config::default(), T0);
        let mut req = frame(FrameKind::Request, 0x10, 2, &[]);
        req[18..20].copy_from_slice(&513u16.to_be_bytes());
        assert_eq!(
            resp.handle_input(&req, T0),
            Err(HandshakeError::InvalidFrame)
        );
        assert_eq!(
            events(&mut resp),
            vec![Event::Failed(HandshakeError::InvalidFrame)]
        );
    }

    #[test]
    fn invalid_frames() {
        // R set in a request.
        let mut resp = Handshake::responder(Config::default(), T0);
        let req = frame(FrameKind::Request, 0x30, 2, &[0, 1, 0, 1]);
        assert_eq!(
            resp.handle_input(&req, T0),
            Err(HandshakeError::InvalidFrame)
        );
        // Enhanced but shorter than the IRD/ORD words.
        let mut resp = Handshake::responder(Config::default(), T0);
        let req = frame(FrameKind::Request, 0x10, 2, &[0, 1]);
        assert_eq!(
            resp.handle_input(&req, T0),
            Err(HandshakeError::InvalidFrame)
        );
        let mut init = Handshake::initiator(Config::default(), &[], T0).unwrap();
        let rep = frame(FrameKind::Reply, 0x10, 2, &[]);
        assert_eq!(
            init.handle_input(&rep, T0),
            Err(HandshakeError::InvalidFrame)
        );
        assert_eq!(
            HandshakeError::InvalidFrame.term_code(),
            codes::MPA_INVALID_REQ_REP
        );
    }

    #[test]
    fn bad_keys() {
        // A request key where a reply is expected.
        let mut init = Handshake::initiator(Config::default(), &[], T0).unwrap();
        assert_eq!(
            init.handle_input(&SIW_REQUEST, T0),
            Err(HandshakeError::InvalidKey)
        );
        assert_eq!(
            events(&mut init),
            vec![Event::Failed(HandshakeError::InvalidKey)]
        );
        assert_eq!(init.handle_input(&SIW_REPLY, T0), Ok(0));
        // A reply key at the responder.
        let mut resp = Handshake::responder(Config::default(), T0);
        assert_eq!(
            resp.handle_input(&SIW_REPLY, T0),
            Err(HandshakeError::InvalidKey)
        );
        // Garbage before the request fails on its first byte.
        let mut resp = Handshake::responder(Config::default(), T0);
        assert_eq!(
            resp.handle_input(b"GET / HTTP/1.1\r\n", T0),
            Err(HandshakeError::InvalidKey)
        );
        let mut resp = Handshake::responder(Config::default(), T0);
        let mut bytes = b"\0".to_vec();
        bytes.extend_from_slice(&SIW_REQUEST);
        assert_eq!(
            resp.handle_input(&bytes, T0),
            Err(HandshakeError::InvalidKey)
        );
        // Byte by byte: a mismatch late in the key.
        let mut resp = Handshake::responder(Config::default(), T0);
        let mut bytes = SIW_REQUEST;
        bytes[15] = b'E';
        for b in &bytes[..15] {
            assert_eq!(resp.handle_input(&[*b], T0), Ok(1));
        }
        assert_eq!(
            resp.handle_input(&bytes[15..], T0),
            Err(HandshakeError::InvalidKey)
        );
    }

    #[test]
    fn unsupported_revisions() {
        for rev in [0u8, 3, 255] {
            let mut resp = Handshake::responder(Config::default(), T0);
            let req = frame(FrameKind::Request, 0, rev, &[]);
            assert_eq!(
                resp.handle_input(&req, T0),
                Err(HandshakeError::UnsupportedRevision)
            );
            let mut init = Handshake::initiator(Config::default(), &[], T0).unwrap();
            let rep = frame(FrameKind::Reply, 0, rev, &[]);
            assert_eq!(
                init.handle_input(&rep, T0),
                Err(HandshakeError::UnsupportedRevision)
            );
            let bad = Config {
                revision: rev,
                ..Config::default()
            };
            assert_eq!(
                Handshake::initiator(bad, &[], T0).err(),
                Some(HandshakeError::UnsupportedRevision)
            );
        }
        // A rev 2 reply to a rev 1 request.
        let rev1 = Config {
            revision: 1,
            ..Config::default()
        };
        let mut init = Handshake::initiator(rev1, &[], T0).unwrap();
        assert_eq!(
            init.handle_input(&SIW_REPLY, T0),
            Err(HandshakeError::UnsupportedRevision)
        );
    }

    #[test]
    fn timeouts() {
        let t1 = Instant::from_millis(1000);
        let cfg = Config {
            timeout: Duration::from_secs(2),
            ..Config::default()
        };
        let deadline = Instant::from_millis(3000);
        let mut init = Handshake::initiator(cfg.clone(), &[], t1).unwrap();
        assert_eq!(init.poll_timeout(), Some(deadline));
        init.handle_timeout(Instant::from_millis(2999));
        assert_eq!(init.poll_event(), None);
        init.handle_timeout(deadline);
        assert_eq!(
            events(&mut init),
            vec![Event::Failed(HandshakeError::Timeout)]
        );
        assert_eq!(init.poll_timeout(), None);
        init.handle_timeout(Instant::from_millis(9999));
        assert_eq!(init.poll_event(), None);

        // Responder waiting for accept times out too.
        let mut resp = Handshake::responder(cfg.clone(), t1);
        resp.handle_input(&SIW_REQUEST, t1).unwrap();
        assert_eq!(resp.poll_timeout(), Some(deadline));
        resp.handle_timeout(deadline);
        assert_eq!(resp.accept(&[]), Err(HandshakeError::NotExpected));

        // Established but reply not yet sent: deadline still reported.
        let mut resp = Handshake::responder(cfg.clone(), t1);
        resp.handle_input(&SIW_REQUEST, t1).unwrap();
        resp.accept(&[]).unwrap();
        assert!(!resp.is_done());
        assert_eq!(resp.poll_timeout(), Some(deadline));
        drain(&mut resp, 10);
        assert!(resp.is_done());
        assert_eq!(resp.poll_timeout(), None);
        resp.handle_timeout(deadline);
        assert!(resp.negotiated().is_some());

        // Input at or after the deadline fails.
        let mut resp = Handshake::responder(cfg, t1);
        assert_eq!(
            resp.handle_input(&SIW_REQUEST, deadline),
            Err(HandshakeError::Timeout)
        );
    }

    #[test]
    fn siw_request_and_reply_bytes() {
        // Our default initiator sends exactly what siw sends.
        let mut init = Handshake::initiator(Config::default(), &[], T0).unwrap();
        assert_eq!(drain(&mut init, 5), SIW_REQUEST);
        // ... and takes siw's reply, leaving the first FPDU alone.
        let mut bytes = SIW_REPLY.to_vec();
        bytes.extend_from_slice(&[0x00, 0x22, 0x41, 0x43]);
        assert_eq!(init.handle_input(&bytes, T0), Ok(24));
        assert!(init.is_done());
        assert_eq!(init.handle_input(&bytes[24..], T0), Ok(0));

        // Our default responder answers siw's request like siw does.
        let mut resp = Handshake::responder(Config::default(), T0);
        assert_eq!(resp.handle_input(&SIW_REQUEST, T0), Ok(24));
        assert_eq!(
            events(&mut resp),
            vec![Event::ConnectRequest(ConnectRequest {
                revision: 2,
                crc: false,
                markers: false,
                ird_ord: Some(IrdOrd {
                    ird: 1,
                    ord: 1,
                    ..IrdOrd::default()
                }),
                private_data: vec![],
            })]
        );
        resp.accept(&[]).unwrap();
        assert_eq!(drain(&mut resp, 3), SIW_REPLY);

        // The CRC capture: C echoed by siw -> CRC on.
        let cfg = Config {
            crc: true,
            ..Config::default()
        };
        let mut init = Handshake::initiator(cfg, &[], T0).unwrap();
        assert_eq!(drain(&mut init, 100)[16], 0x50);
        init.handle_input(&SIW_CRC_REPLY, T0).unwrap();
        assert!(init.negotiated().unwrap().crc);
    }

    #[test]
    fn reject_by_responder() {
        let mut init = Handshake::initiator(Config::default(), b"hi", T0).unwrap();
        let mut resp = Handshake::responder(Config::default(), T0);
        resp.handle_input(&drain(&mut init, 100), T0).unwrap();
        events(&mut resp);
        resp.reject(b"go away").unwrap();
        assert!(resp.is_closed() && !resp.is_done());
        assert_eq!(resp.accept(&[]), Err(HandshakeError::NotExpected));
        let rep = drain(&mut resp, 100);
        assert_eq!(rep[16], 0x30);
        init.handle_input(&rep, T0).unwrap();
        assert_eq!(
            events(&mut init),
            vec![Event::Rejected {
                private_data: b"go away".to_vec()
            }]
        );
        assert!(init.is_closed() && init.poll_timeout().is_none());
    }

    #[test]
    fn api_misuse() {
        let mut init = Handshake::initiator(Config::default(), &[], T0).unwrap();
        assert_eq!(init.accept(&[]), Err(HandshakeError::NotExpected));
        assert_eq!(init.reject(&[]), Err(HandshakeError::NotExpected));
        let mut resp = Handshake::responder(Config::default(), T0);
        assert_eq!(resp.accept(&[]), Err(HandshakeError::NotExpected));
        resp.handle_input(&SIW_REQUEST, T0).unwrap();
        resp.accept(&[]).unwrap();
        assert_eq!(resp.accept(&[]), Err(HandshakeError::NotExpected));
        assert_eq!(resp.reject(&[]), Err(HandshakeError::NotExpected));
        assert_eq!(
            HandshakeError::NotExpected.term_code(),
            codes::MPA_LOCAL_CATASTROPHIC
        );
        assert!(!HandshakeError::Timeout.to_string().is_empty());
    }
}
