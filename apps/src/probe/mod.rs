//! A hostile-peer conformance probe: speaks raw MPA/DDP/RDMAP over a plain
//! TCP connection, sends one scripted protocol violation per connection
//! and reports how the peer reacted (an MPA reject, a Terminate with its
//! layer/etype/code, a TCP close or reset, or nothing).
//!
//! Peers:
//!
//! * [`PeerKind::Target`]: our own test target ([`target`]). The probe
//!   connects, sends a *hello* Send (MSN 1) as its first FPDU, and the target
//!   answers with one Send, the advertisement ([`Advert`]): magic
//!   [`ADVERT_MAGIC`], a count byte, then per region kind (u8), STag (u32),
//!   TO (u64), length (u32), all big endian. The target mirrors the probe's
//!   M bit (it wants markers when the probe does) and CRC is on when the
//!   probe asks for it.
//! * [`PeerKind::Rping`]: librdmacm's rping. As client (`rping -s` peer) the
//!   probe sends no hello: the violation is its first FPDU; as
//!   server (`rping -c` peer) the probe receives the client's advertisement
//!   (addr u64, rkey u32, size u32) in the first Send: one read/write
//!   region to violate.

pub mod conn;
pub mod target;

use std::fmt;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use iwarp::error::{codes, TermCode};
use iwarp::wire::mpa::{FrameKind, FrameRepr, IrdOrd};
use iwarp::wire::rdmap::{Opcode, QN_SEND};

use conn::{fetch_add_request, read_mpa_frame, read_request, send, ulpdu, untagged, write, Wire};

/// First bytes of the target's advertisement.
pub const ADVERT_MAGIC: &[u8; 8] = b"IWPROBE1";
/// The probe's hello to the target.
pub const HELLO: &[u8; 16] = b"IWPROBE-HELLO\0\0\0";

/// How the peer reacted to a scenario, as the probe saw it on the TCP
/// connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reaction {
    /// MPA reply with R=0: the connection was accepted.
    Accepted,
    /// MPA Reply with R=1: the connection was rejected.
    Rejected,
    /// A Terminate message (`bits` = layer/etype/code as on the wire).
    Terminate {
        /// The first 16 bits of the Terminate Control field.
        bits: u16,
        /// The layer, error type and code decoded, if the layer nibble
        /// names a known layer.
        code: Option<TermCode>,
    },
    /// TCP FIN without a Terminate.
    Closed,
    /// TCP reset.
    Reset,
    /// Nothing arrived before [`Options::timeout`].
    Silence,
    /// Bytes the probe could not decode, described in the string.
    Garbled(String),
}

impl fmt::Display for Reaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Accepted => f.write_str("accepted (MPA reply, R=0)"),
            Self::Rejected => f.write_str("MPA reject (reply with R=1)"),
            Self::Terminate { bits, code } => {
                let name = code.map_or("unknown layer", TermCode::name);
                let (layer, etype) = (bits >> 12, (bits >> 8) & 0xf);
                write!(
                    f,
                    "terminate {bits:#06x}: layer={layer} etype={etype} code={:#04x} ({name})",
                    bits & 0xff
                )?;
                if layer != etype {
                    // Layer and etype nibbles exchanged, as a sender that
                    // lays the Terminate Control field out with
                    // little-endian bitfields puts them on the wire.
                    let swapped = (etype << 12) | (layer << 8) | (bits & 0xff);
                    let name = TermCode::from_bits(swapped).map_or("unknown layer", TermCode::name);
                    write!(f, "; nibble-swapped: layer={etype} etype={layer} ({name})")?;
                }
                Ok(())
            }
            Self::Closed => f.write_str("TCP close (FIN), no Terminate"),
            Self::Reset => f.write_str("TCP reset"),
            Self::Silence => f.write_str("nothing within the timeout"),
            Self::Garbled(s) => write!(f, "undecodable: {s}"),
        }
    }
}

/// Our stack's expected reaction to a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The connection is accepted.
    Accepted,
    /// TCP close without any MPA reply or Terminate.
    Closed,
    /// This Terminate.
    Term(TermCode),
}

impl Expect {
    /// Whether `r` is this expectation (a reset counts as a close).
    pub fn matches(self, r: &Reaction) -> bool {
        match (self, r) {
            (Self::Accepted, Reaction::Accepted) => true,
            (Self::Closed, Reaction::Closed | Reaction::Reset) => true,
            (Self::Term(c), Reaction::Terminate { bits, .. }) => c.to_bits() == *bits,
            _ => false,
        }
    }
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Accepted => f.write_str("accepted (MPA reply, R=0)"),
            Self::Closed => f.write_str("TCP close, no reply or Terminate"),
            Self::Term(c) => write!(
                f,
                "Terminate {}/{}/{:#04x} ({})",
                c.layer as u8,
                c.etype,
                c.code,
                c.name()
            ),
        }
    }
}

/// A region kind of the target's advertisement: the access rights and
/// validity the probe's scenarios test the peer's STag checks against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegionKind {
    /// Remote read and write allowed.
    ReadWrite = 1,
    /// Remote read only: an RDMA Write to it is a remote protection error.
    ReadOnly = 2,
    /// Remote write only: an RDMA Read of it is a remote protection error.
    WriteOnly = 3,
    /// Read/write, but registered in another PD than the QP's.
    OtherPd = 4,
    /// Read/write, invalidated by the target before advertising it.
    Invalidated = 5,
}

impl RegionKind {
    /// All kinds, in advertisement order.
    pub const ALL: [Self; 5] = [
        Self::ReadWrite,
        Self::ReadOnly,
        Self::WriteOnly,
        Self::OtherPd,
        Self::Invalidated,
    ];

    fn from_raw(b: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u8 == b)
    }
}

/// One advertised region: what the probe needs to aim tagged messages at
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Its rights and validity.
    pub kind: RegionKind,
    /// Its STag, the Data Sink or Data Source STag of tagged messages
    /// aimed at it.
    pub stag: u32,
    /// Tagged offset of its first byte.
    pub to: u64,
    /// Length in bytes; valid tagged offsets are `to..to + len`.
    pub len: u32,
}

/// The regions a peer advertised.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Advert {
    /// The regions, in the order advertised.
    pub regions: Vec<Region>,
}

const ENTRY_LEN: usize = 17;

impl Advert {
    /// Encode the advertisement as the payload of the target's first Send:
    /// a magic, a count byte, then per region its kind (1 byte), STag (4),
    /// tagged offset (8) and length (4), big endian. At most 255 regions
    /// are encoded.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = ADVERT_MAGIC.to_vec();
        v.push(u8::try_from(self.regions.len()).unwrap_or(u8::MAX));
        for r in self.regions.iter().take(usize::from(u8::MAX)) {
            v.push(r.kind as u8);
            v.extend_from_slice(&r.stag.to_be_bytes());
            v.extend_from_slice(&r.to.to_be_bytes());
            v.extend_from_slice(&r.len.to_be_bytes());
        }
        v
    }

    /// Decode the target's advertisement; `None` if malformed.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let rest = b.strip_prefix(ADVERT_MAGIC.as_slice())?;
        let (&n, mut rest) = rest.split_first()?;
        let mut regions = Vec::new();
        for _ in 0..n {
            let e = rest.get(..ENTRY_LEN)?;
            rest = &rest[ENTRY_LEN..];
            regions.push(Region {
                kind: RegionKind::from_raw(e[0])?,
                stag: u32::from_be_bytes(e[1..5].try_into().ok()?),
                to: u64::from_be_bytes(e[5..13].try_into().ok()?),
                len: u32::from_be_bytes(e[13..17].try_into().ok()?),
            });
        }
        Some(Self { regions })
    }

    /// Decode an rping advertisement (addr u64, rkey u32, size u32): one
    /// read/write region.
    pub fn from_rping(b: &[u8]) -> Option<Self> {
        let info = crate::proto::rping::RdmaInfo::parse(b).ok()?;
        Some(Self {
            regions: vec![Region {
                kind: RegionKind::ReadWrite,
                stag: info.rkey,
                to: info.addr,
                len: info.size,
            }],
        })
    }

    /// The region of `kind`, if advertised.
    pub fn get(&self, kind: RegionKind) -> Option<Region> {
        self.regions.iter().copied().find(|r| r.kind == kind)
    }
}

/// What the scenario does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attack {
    BadKey,
    ReservedBits,
    PdTooLong,
    Garbage,
    Truncated,
    BadUlpduLen,
    BadCrc,
    BadMarker,
    UnknownStag,
    OtherPd,
    Invalidated,
    ToOutside,
    WriteReadOnly,
    ReadNoAccess,
    MsnGap,
    BadQn,
    ReadOverIrd,
    RtrMismatch,
    AtomicUnaligned,
    AtomicNoRight,
}

/// One named scenario.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    /// Name for `--scenario`.
    pub name: &'static str,
    /// What the probe sends.
    pub summary: &'static str,
    /// What the RFCs expect of the peer.
    pub rfc: &'static str,
    /// Our stack's reaction (asserted by the tests).
    pub expect: Expect,
    attack: Attack,
}

impl Scenario {
    /// The scenario breaks the MPA request (no FPDU is sent).
    pub fn is_mpa(&self) -> bool {
        matches!(
            self.attack,
            Attack::BadKey | Attack::ReservedBits | Attack::PdTooLong | Attack::Garbage
        )
    }

    /// The advertised region the scenario needs (None: none).
    pub fn needs(&self) -> Option<RegionKind> {
        match self.attack {
            Attack::UnknownStag
            | Attack::ToOutside
            | Attack::ReadOverIrd
            | Attack::AtomicUnaligned
            | Attack::AtomicNoRight => Some(RegionKind::ReadWrite),
            Attack::OtherPd => Some(RegionKind::OtherPd),
            Attack::Invalidated => Some(RegionKind::Invalidated),
            Attack::WriteReadOnly => Some(RegionKind::ReadOnly),
            Attack::ReadNoAccess => Some(RegionKind::WriteOnly),
            _ => None,
        }
    }

    fn crc(&self) -> bool {
        self.attack == Attack::BadCrc
    }

    fn markers(&self) -> bool {
        self.attack == Attack::BadMarker
    }

    fn p2p(&self) -> bool {
        self.attack == Attack::RtrMismatch
    }
}

macro_rules! sc {
    ($name:literal, $attack:ident, $expect:expr, $summary:literal, $rfc:literal) => {
        Scenario {
            name: $name,
            summary: $summary,
            rfc: $rfc,
            expect: $expect,
            attack: Attack::$attack,
        }
    };
}

/// Every scenario, in run order.
pub const SCENARIOS: &[Scenario] = &[
    sc!("bad-mpa-key", BadKey, Expect::Closed,
        "MPA request whose key reads \"MPA ID Req Fxame\"",
        "RFC 5044 7.1: not an MPA request; close the TCP connection, no reply"),
    sc!("reserved-bits", ReservedBits, Expect::Accepted,
        "MPA request with the 4 reserved flag bits set",
        "RFC 5044 7.1: Res is ignored on receive; accept"),
    sc!("pd-too-long", PdTooLong, Expect::Closed,
        "MPA request with PD_Length 513 (and 513 bytes)",
        "RFC 5044 7.1: PD_Length > 512 is an invalid frame; close, no reply"),
    sc!("garbage-before-request", Garbage, Expect::Closed,
        "\"GET / HTTP/1.1\\r\\n\" before a valid MPA request",
        "RFC 5044 7.1: the key does not match; close, no reply"),
    sc!("truncated-frame", Truncated, Expect::Closed,
        "half of a Send FPDU, then TCP FIN",
        "RFC 5044 8 / RFC 5040 5.3: stream lost mid-FPDU; QP to Error, no Terminate can be delivered"),
    sc!("bad-ulpdu-length", BadUlpduLen, Expect::Term(codes::RDMAP_CATASTROPHIC_STREAM),
        "FPDU with ULPDU_Length 2 (shorter than any DDP header)",
        "RFC 5041 7 / RFC 5040 7: no valid DDP segment; Terminate (code left to the implementation)"),
    sc!("bad-crc", BadCrc, Expect::Term(codes::MPA_CRC),
        "CRC negotiated, a Send whose CRC field is wrong",
        "RFC 5044 4.4, 8: Terminate LLP/MPA CRC error (2/0/0x02)"),
    sc!("bad-marker", BadMarker, Expect::Term(codes::MPA_MARKER),
        "markers negotiated, a Send whose marker has a wrong FPDUPTR",
        "RFC 5044 4.3, 8: Terminate LLP/MPA marker mismatch (2/0/0x03)"),
    sc!("unknown-stag", UnknownStag, Expect::Term(codes::DDP_T_INVALID_STAG),
        "RDMA Write to the advertised STag with another key",
        "RFC 5041 7.2: Terminate DDP tagged, invalid STag (1/1/0x00)"),
    sc!("stag-other-pd", OtherPd, Expect::Term(codes::DDP_T_STAG_NOT_ASSOC),
        "RDMA Write to a region of another PD",
        "RFC 5041 7.2: Terminate DDP tagged, STag not associated with the stream (1/1/0x02)"),
    sc!("invalidated-stag", Invalidated, Expect::Term(codes::DDP_T_INVALID_STAG),
        "RDMA Write to a region the target invalidated",
        "RFC 5041 7.2: Terminate DDP tagged, invalid STag (1/1/0x00)"),
    sc!("to-outside-region", ToOutside, Expect::Term(codes::DDP_T_BASE_BOUNDS),
        "RDMA Write of 32 bytes starting 16 bytes before the region's end",
        "RFC 5041 7.2: Terminate DDP tagged, base or bounds violation (1/1/0x01)"),
    sc!("write-read-only", WriteReadOnly, Expect::Term(codes::RDMAP_ACCESS_RIGHTS),
        "RDMA Write to a remote-read-only region",
        "RFC 5040 7: Terminate RDMAP remote protection, access rights (0/1/0x02)"),
    sc!("read-no-remote-read", ReadNoAccess, Expect::Term(codes::RDMAP_ACCESS_RIGHTS),
        "RDMA Read Request of a region without remote read access",
        "RFC 5040 7: Terminate RDMAP remote protection, access rights (0/1/0x02)"),
    sc!("msn-gap", MsnGap, Expect::Term(codes::DDP_U_INVALID_MSN_RANGE),
        "Send with an MSN two ahead of the expected one",
        "RFC 5041 7.2: Terminate DDP untagged, invalid MSN range (1/2/0x03)"),
    sc!("bad-queue-number", BadQn, Expect::Term(codes::DDP_U_INVALID_QN),
        "Send on DDP queue 5",
        "RFC 5041 7.2: Terminate DDP untagged, invalid QN (1/2/0x01)"),
    sc!("read-over-ird", ReadOverIrd, Expect::Term(codes::RDMAP_CATASTROPHIC_STREAM),
        "4 Read Requests at once with IRD 1",
        "RFC 5040 6.4: more Read Requests than IRD is an error; Terminate (RDMAP catastrophic, stream)"),
    sc!("rtr-mismatch", RtrMismatch, Expect::Term(codes::MPA_NO_MATCHING_RTR),
        "P2P offering only the Write RTR, then a zero-length Send as RTR",
        "RFC 6581 3: Terminate LLP/MPA no matching RTR model (2/0/0x07)"),
    sc!("atomic-unaligned", AtomicUnaligned, Expect::Term(codes::RDMAP_CATASTROPHIC_STREAM),
        "RFC 7306 FetchAdd on a word 4 bytes off 64-bit alignment in the read/write region",
        "RFC 7306 8.2: Terminate RDMAP remote operation, catastrophic error localized to the stream (0/2/0x07); a peer without RFC 7306: unexpected opcode (0/2/0x06)"),
    sc!("atomic-no-atomic-right", AtomicNoRight, Expect::Term(codes::RDMAP_ACCESS_RIGHTS),
        "RFC 7306 FetchAdd on an aligned word of the read/write region (no remote-atomic right)",
        "RFC 7306 5 with RFC 5040 7: the region is not registered for atomics; Terminate RDMAP remote protection, access rights (0/1/0x02); a peer without RFC 7306: unexpected opcode (0/2/0x06)"),
];

/// The scenario named `name`.
pub fn scenario(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}

/// Which peer protocol runs above RDMAP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerKind {
    /// Our test target ([`target`]).
    Target,
    /// librdmacm's rping server (`rping -s`), whose first Send advertises
    /// one read/write buffer.
    Rping,
}

/// Probe settings shared by every scenario.
#[derive(Clone, Debug)]
pub struct Options {
    /// The peer's application protocol.
    pub peer: PeerKind,
    /// How long to wait for each step and for the reaction.
    pub timeout: Duration,
    /// Pause between the MPA reply and our first FPDU (the peer posts its
    /// receives after accepting).
    pub first_send_delay: Duration,
    /// Initiator: how often to retry a stream scenario whose setup was
    /// refused, reset, closed or rejected.
    pub setup_retries: u32,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            peer: PeerKind::Target,
            timeout: Duration::from_secs(3),
            first_send_delay: Duration::from_millis(100),
            setup_retries: 0,
        }
    }
}

/// When the probe calls the hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Connected, before the violation is sent.
    BeforeAttack,
    /// The violation is sent, the reaction not read yet.
    AfterAttack,
}

/// A scenario that ran: the peer's reaction.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// What the peer did.
    pub reaction: Reaction,
    /// FPDUs the peer sent that were skipped while waiting.
    pub skipped: usize,
}

/// Why a scenario did not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeError {
    /// The peer does not offer what the scenario needs.
    Unsupported(String),
    /// The probe itself failed (or the peer failed before the violation).
    Failed(String),
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unsupported(s) => write!(f, "not applicable: {s}"),
            Self::Failed(s) => write!(f, "probe failed: {s}"),
        }
    }
}

fn failed(what: &str, r: impl fmt::Display) -> ProbeError {
    ProbeError::Failed(format!("{what}: {r}"))
}

/// Our MPA request for `s` (with the scenario's corruption applied).
fn request_bytes(s: &Scenario) -> Vec<u8> {
    let words = IrdOrd {
        ird: 1,
        ord: 1,
        p2p: s.p2p(),
        rtr_send: false,
        rtr_write: s.p2p(),
        rtr_read: false,
    };
    let mut pd = [0u8; IrdOrd::LEN];
    words.emit(&mut pd);
    let f = FrameRepr {
        kind: FrameKind::Request,
        markers: s.markers(),
        crc: s.crc(),
        reject: false,
        enhanced: true,
        reserved: 0,
        revision: 2,
        private_data: &pd,
    };
    let mut v = vec![0u8; f.buffer_len()];
    f.emit(&mut v);
    match s.attack {
        Attack::BadKey => v[13] = b'x',
        Attack::ReservedBits => v[16] |= 0x0f,
        Attack::PdTooLong => {
            v[18..20].copy_from_slice(&513u16.to_be_bytes());
            v.resize(20 + 513, 0);
        }
        Attack::Garbage => {
            let mut g = b"GET / HTTP/1.1\r\n".to_vec();
            g.extend_from_slice(&v);
            v = g;
        }
        _ => {}
    }
    v
}

/// Connect to `addr`, retrying a refused connection until `deadline` (a
/// peer that restarts its listener between connections).
fn connect(addr: SocketAddr, deadline: Instant) -> Result<TcpStream, ProbeError> {
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                if Instant::now() >= deadline {
                    return Err(failed(&format!("connect to {addr}"), e));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(failed(&format!("connect to {addr}"), e)),
        }
    }
}

/// Run `s` as the initiator against the listener at `addr`. `hook` runs
/// at each [`Phase`]. A connection refused, reset, closed or rejected
/// during setup of a scenario that does not break the request itself is
/// retried up to [`Options::setup_retries`] times (a peer application that
/// restarts its listener between connections); the last such reaction is
/// the outcome.
pub fn run_client(
    s: &Scenario,
    addr: SocketAddr,
    opts: &Options,
    hook: &mut dyn FnMut(Phase),
) -> Result<Outcome, ProbeError> {
    let mut tries = 0;
    loop {
        match client_once(s, addr, opts, hook)? {
            Ok(o) => return Ok(o),
            Err(r) if tries >= opts.setup_retries => return Ok(outcome(r, 0)),
            Err(_) => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(300));
            }
        }
    }
}

/// One connection of [`run_client`]; `Ok(Err(reaction))` if the setup of a
/// stream scenario failed with `reaction`.
fn client_once(
    s: &Scenario,
    addr: SocketAddr,
    opts: &Options,
    hook: &mut dyn FnMut(Phase),
) -> Result<Result<Outcome, Reaction>, ProbeError> {
    let mut stream = connect(addr, Instant::now() + opts.timeout * 3)?;
    let req = request_bytes(s);
    if s.is_mpa() {
        hook(Phase::BeforeAttack);
    }
    if let Err(e) = stream.write_all(&req) {
        return Ok(Err(failed_io(&e)));
    }
    if s.is_mpa() {
        hook(Phase::AfterAttack);
    }
    let deadline = Instant::now() + opts.timeout;
    let setup = |r: Reaction| {
        if s.is_mpa() {
            Ok(Ok(outcome(r, 0)))
        } else {
            Ok(Err(r))
        }
    };
    let (frame, rest) = match read_mpa_frame(&mut stream, deadline) {
        Ok(x) => x,
        Err(r @ (Reaction::Closed | Reaction::Reset)) => return setup(r),
        Err(r) => return Ok(Ok(outcome(r, 0))),
    };
    let Ok(rep) = FrameRepr::parse(&frame) else {
        return Ok(Ok(outcome(Reaction::Garbled("MPA reply".into()), 0)));
    };
    if rep.kind != FrameKind::Reply {
        return Ok(Ok(outcome(
            Reaction::Garbled("MPA frame is not a reply".into()),
            0,
        )));
    }
    if rep.reject {
        return setup(Reaction::Rejected);
    }
    if s.is_mpa() {
        return Ok(Ok(outcome(Reaction::Accepted, 0)));
    }
    let mut w = Wire::new(stream, s.crc() || rep.crc, rep.markers, s.markers(), rest);
    std::thread::sleep(opts.first_send_delay);
    // Our target answers a hello with its advertisement. rping's server
    // has exactly one receive posted and would answer an advertisement
    // with an RDMA Read: the violation is the first FPDU it sees.
    let advert = if s.p2p() || opts.peer == PeerKind::Rping {
        Advert::default()
    } else {
        let msn = w.send_msn;
        w.send_ulpdu(&send(QN_SEND, msn, HELLO))
            .map_err(|r| failed("sending the hello", r))?;
        w.send_msn += 1;
        let b = w
            .next_send(Instant::now() + opts.timeout)
            .map_err(|r| failed("waiting for the advertisement", r))?;
        Advert::decode(&b).ok_or_else(|| failed("advertisement", "malformed"))?
    };
    attack(s, &mut w, &advert, opts, hook).map(Ok)
}

fn failed_io(e: &std::io::Error) -> Reaction {
    match e.kind() {
        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe => Reaction::Reset,
        _ => Reaction::Garbled(format!("write: {e}")),
    }
}

/// Run `s` as the responder: accept one connection on `listener`, reply,
/// take the initiator's first Send as the advertisement, then attack.
pub fn run_server(
    s: &Scenario,
    listener: &TcpListener,
    opts: &Options,
    accept_timeout: Duration,
    hook: &mut dyn FnMut(Phase),
) -> Result<Outcome, ProbeError> {
    if s.is_mpa() || s.p2p() {
        return Err(ProbeError::Unsupported(
            "breaks the MPA request: initiator only".into(),
        ));
    }
    let mut stream = accept(listener, accept_timeout)?;
    let deadline = Instant::now() + opts.timeout;
    let (frame, rest) =
        read_mpa_frame(&mut stream, deadline).map_err(|r| failed("reading the MPA request", r))?;
    let req = FrameRepr::parse(&frame).map_err(|e| failed("MPA request", e))?;
    if req.kind != FrameKind::Request {
        return Err(failed("MPA request", "not a request"));
    }
    let words = IrdOrd {
        ird: 1,
        ord: 1,
        ..IrdOrd::default()
    };
    let mut pd = [0u8; IrdOrd::LEN];
    words.emit(&mut pd);
    let enhanced = req.enhanced && req.revision == 2;
    let rep = FrameRepr {
        kind: FrameKind::Reply,
        markers: s.markers(),
        crc: s.crc() || req.crc,
        reject: false,
        enhanced,
        reserved: 0,
        revision: req.revision.clamp(1, 2),
        private_data: if enhanced { &pd } else { &[] },
    };
    let mut v = vec![0u8; rep.buffer_len()];
    rep.emit(&mut v);
    stream
        .write_all(&v)
        .map_err(|e| failed("sending the MPA reply", e))?;
    let mut w = Wire::new(stream, rep.crc, req.markers, s.markers(), rest);
    let b = w
        .next_send(Instant::now() + opts.timeout)
        .map_err(|r| failed("waiting for the advertisement", r))?;
    let advert = match opts.peer {
        PeerKind::Target => Advert::decode(&b),
        PeerKind::Rping => Advert::from_rping(&b),
    }
    .ok_or_else(|| failed("advertisement", "malformed"))?;
    attack(s, &mut w, &advert, opts, hook)
}

fn accept(listener: &TcpListener, timeout: Duration) -> Result<TcpStream, ProbeError> {
    listener
        .set_nonblocking(true)
        .map_err(|e| failed("listener", e))?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(|e| failed("accept", e))?;
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(failed("accept", "no initiator connected"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(failed("accept", e)),
        }
    }
}

fn outcome(reaction: Reaction, skipped: usize) -> Outcome {
    Outcome { reaction, skipped }
}

fn region(a: &Advert, kind: RegionKind) -> Result<Region, ProbeError> {
    a.get(kind)
        .ok_or_else(|| ProbeError::Unsupported(format!("the peer advertised no {kind:?} region")))
}

/// Send the violation of `s` on the established `w`, then wait for the
/// reaction.
fn attack(
    s: &Scenario,
    w: &mut Wire,
    advert: &Advert,
    opts: &Options,
    hook: &mut dyn FnMut(Phase),
) -> Result<Outcome, ProbeError> {
    let bytes: Vec<u8> = match s.attack {
        Attack::BadKey | Attack::ReservedBits | Attack::PdTooLong | Attack::Garbage => Vec::new(),
        Attack::Truncated => {
            let b = w.frame(&send(QN_SEND, w.send_msn, &[7; 16]));
            b[..b.len() / 2].to_vec()
        }
        // A length field, 2 ULPDU bytes (a DDP control byte pair), the
        // CRC field (zero: CRC is off here).
        Attack::BadUlpduLen => vec![0x00, 0x02, 0x41, 0x43, 0, 0, 0, 0],
        Attack::BadCrc => {
            let mut b = w.frame(&send(QN_SEND, w.send_msn, &[5; 16]));
            if let Some(last) = b.last_mut() {
                *last ^= 0x5a;
            }
            b
        }
        Attack::BadMarker => {
            let start = w.tx_position();
            let mut b = w.frame(&send(QN_SEND, w.send_msn, &[6; 600]));
            let first = (0..b.len()).find(|i| (start + *i as u64).is_multiple_of(512));
            match first.and_then(|i| b.get_mut(i + 3)) {
                Some(ptr) => *ptr ^= 0x10,
                None => return Err(failed("bad-marker", "no marker in the FPDU")),
            }
            b
        }
        Attack::MsnGap => w.frame(&send(QN_SEND, w.send_msn + 2, &[8; 16])),
        Attack::BadQn => w.frame(&send(5, 1, &[9; 16])),
        Attack::UnknownStag => {
            let r = region(advert, RegionKind::ReadWrite)?;
            w.frame(&write(r.stag ^ 0x01, r.to, 32))
        }
        Attack::OtherPd => {
            let r = region(advert, RegionKind::OtherPd)?;
            w.frame(&write(r.stag, r.to, 32))
        }
        Attack::Invalidated => {
            let r = region(advert, RegionKind::Invalidated)?;
            w.frame(&write(r.stag, r.to, 32))
        }
        Attack::ToOutside => {
            let r = region(advert, RegionKind::ReadWrite)?;
            let to = r.to.saturating_add(u64::from(r.len)).saturating_sub(16);
            w.frame(&write(r.stag, to, 32))
        }
        Attack::WriteReadOnly => {
            let r = region(advert, RegionKind::ReadOnly)?;
            w.frame(&write(r.stag, r.to, 32))
        }
        Attack::ReadNoAccess => {
            let r = region(advert, RegionKind::WriteOnly)?;
            w.frame(&read_request(w.rr_msn, r.stag, r.to, 16))
        }
        Attack::ReadOverIrd => {
            let r = region(advert, RegionKind::ReadWrite)?;
            let mut b = Vec::new();
            for i in 0..4 {
                b.extend(w.frame(&read_request(w.rr_msn + i, r.stag, r.to, r.len)));
            }
            b
        }
        Attack::AtomicUnaligned | Attack::AtomicNoRight => {
            let r = region(advert, RegionKind::ReadWrite)?;
            let aligned = r.to.next_multiple_of(8);
            let to = if s.attack == Attack::AtomicUnaligned {
                aligned + 4
            } else {
                aligned
            };
            w.frame(&fetch_add_request(w.rr_msn, r.stag, to))
        }
        Attack::RtrMismatch => {
            // A zero-length Send: an RTR type the responder did not choose.
            w.frame(&ulpdu(&untagged(Opcode::Send, QN_SEND, 1, 0), &[]))
        }
    };
    hook(Phase::BeforeAttack);
    if let Err(r) = w.write_raw(&bytes) {
        hook(Phase::AfterAttack);
        return Ok(outcome(r, w.skipped));
    }
    if s.attack == Attack::Truncated {
        w.shutdown_write();
    }
    hook(Phase::AfterAttack);
    let r = w.wait_reaction(Instant::now() + opts.timeout);
    Ok(outcome(r, w.skipped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use iwarp::wire::mpa::REQUEST_KEY;

    #[test]
    fn advert_round_trip() {
        let a = Advert {
            regions: RegionKind::ALL
                .iter()
                .enumerate()
                .map(|(i, &kind)| Region {
                    kind,
                    stag: 0x100 * i as u32 + 7,
                    to: 0x7f00_0000_0000 + i as u64,
                    len: 4096,
                })
                .collect(),
        };
        let b = a.encode();
        assert_eq!(Advert::decode(&b), Some(a));
        for n in 0..b.len() {
            assert_eq!(Advert::decode(&b[..n]), None);
        }
    }

    #[test]
    fn names_unique_and_requests() {
        for (i, s) in SCENARIOS.iter().enumerate() {
            assert!(SCENARIOS[..i].iter().all(|t| t.name != s.name));
            let r = request_bytes(s);
            match s.attack {
                Attack::BadKey => assert_ne!(&r[..16], REQUEST_KEY),
                Attack::Garbage => assert_eq!(&r[..4], b"GET "),
                Attack::PdTooLong => assert_eq!(r.len(), 533),
                _ => {
                    let f = FrameRepr::parse(&r).unwrap();
                    assert_eq!(f.reserved != 0, s.attack == Attack::ReservedBits);
                }
            }
        }
    }

    #[test]
    fn reaction_text() {
        let r = Reaction::Terminate {
            bits: codes::MPA_CRC.to_bits(),
            code: Some(codes::MPA_CRC),
        };
        assert_eq!(
            r.to_string(),
            "terminate 0x2002: layer=2 etype=0 code=0x02 (MPA: CRC error); \
             nibble-swapped: layer=0 etype=2 (unknown error)"
        );
        assert!(Expect::Term(codes::MPA_CRC).matches(&r));
        assert!(!Expect::Closed.matches(&r));
    }
}
