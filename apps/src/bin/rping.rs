//! `rping`: a wire-compatible implementation of librdmacm's `rping`
//! example (rdma-core `librdmacm/examples/rping.c`) on this project's iWARP
//! stack (kernel TCP backend). The protocol lives in
//! [`iwarp_apps::proto::rping`]; see `docs/interop-protocols.md`.
//!
//! ```text
//! rping -s [-a ADDR] [-p PORT] [-C COUNT] [-S SIZE] [-v] [-V] [-d]   server
//!          [-P [--max-conns N]]                                       persistent server
//! rping -c  -a ADDR  [-p PORT] [-C COUNT] [-S SIZE] [-v] [-V] [-d]   client
//!       [--crc] [--markers] [--timeout SECS] [--first-send-delay MS]
//! ```
//!
//! `--crc` asks for MPA CRC32c, `--markers` for MPA markers (Linux siw
//! rejects such a request), `--timeout` bounds connection setup and every
//! wait for the peer. `--first-send-delay` (client, default 20 ms) works
//! around a Linux siw responder race, see its help text.
//!
//! The server serves one connection and exits when the client disconnects.
//! With `-P` (librdmacm's persistent server mode) it accepts connection
//! after connection and serves each on a thread of its own with its own
//! PD, CQ, QP and buffers, several at once; a connection that fails
//! (early disconnect, protocol error, hostile peer) is reported on stderr
//! as `rping: connection N from ADDR: ...` and the server goes on.
//! `--max-conns N` (ours; librdmacm's server never exits) bounds it: after
//! N connection requests it waits for their end and exits, 0 when every
//! connection succeeded, else with the status of the first that failed.
//! Unlike librdmacm's rping (whose server ignores `-C`), our server with
//! `-C COUNT` expects exactly COUNT pings: a disconnect before that is a
//! mid-run disconnect. Without `-C`, a disconnect between two pings is a
//! clean end and one in the middle of a ping is a mid-run disconnect.
//!
//! Exit status:
//!
//! | status | meaning |
//! | --- | --- |
//! | 0 | success |
//! | 1 | other error (local resources, peer protocol error, inactivity timeout) |
//! | 2 | bad command line |
//! | 3 | connection failed: refused, unreachable, TCP connect timeout |
//! | 4 | MPA failed: the peer rejected (private data printed in hex), MPA timeout, invalid MPA frame, negotiation mismatch |
//! | 5 | `-V` validation failed |
//! | 6 | the peer disconnected in the middle of the run (the number of work requests completed with a flush status is printed) |

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Parser;
use iwarp_apps::backend::BackendArgs;
use iwarp_apps::proto::rping::{
    self, echo_len, fill_ping, Client, ClientAction, RdmaInfo, Server, ServerAction, GO_AHEAD,
};
use iwarp_apps::{errln, outln};
use iwarp_engine::{
    Access, Backend, CmError, CmEvent, ConnParams, ConnRequest, Cq, Device, DeviceConfig, Listener,
    Mr, Pd, Qp, QpInit, QpState, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
    EMPTY_WC,
};

/// rping over this project's iWARP stack: RDMA ping-pong, wire-compatible
/// with librdmacm's rping.
#[derive(Parser, Debug, Clone)]
#[command(
    about,
    disable_version_flag = true,
    after_help = "Exit status: 0 success, 1 other error, 2 bad command line, \
                  3 connection failed (refused, unreachable, TCP timeout), \
                  4 MPA failed (reject, timeout, invalid frame), 5 -V validation failed, \
                  6 peer disconnected mid-run."
)]
struct Args {
    /// Run as server.
    #[arg(
        short = 's',
        conflicts_with = "client",
        required_unless_present = "client"
    )]
    server: bool,
    /// Run as client.
    #[arg(short = 'c')]
    client: bool,
    /// Persistent server: accept connections for ever and serve each on
    /// a thread of its own (several at once); a failed connection is
    /// reported and does not end the server.
    #[arg(short = 'P', conflicts_with = "client")]
    persistent: bool,
    /// Persistent server: stop accepting after N connections, wait for
    /// them to end and exit (0 when all succeeded, else the status of the
    /// first that failed).
    #[arg(long, value_name = "N", requires = "persistent",
          value_parser = clap::value_parser!(u64).range(1..))]
    max_conns: Option<u64>,
    /// Address to bind (server; default any) or connect to (client).
    #[arg(short = 'a')]
    addr: Option<String>,
    /// TCP port.
    #[arg(short = 'p', default_value_t = rping::DEFAULT_PORT)]
    port: u16,
    /// Number of pings (client: 0 = forever; server: pings expected
    /// before the client disconnects, 0 = any).
    #[arg(short = 'C', default_value_t = 0)]
    count: u64,
    /// Ping data size in bytes (23..=65535).
    #[arg(short = 'S', default_value_t = rping::DEFAULT_SIZE,
          value_parser = parse_size)]
    size: usize,
    /// Print the ping data.
    #[arg(short = 'v')]
    verbose: bool,
    /// Validate the ping data (client).
    #[arg(short = 'V')]
    validate: bool,
    /// Debug output on stderr, with the stack's log at debug level
    /// (`RUST_LOG`, when set, chooses the log's filter instead).
    #[arg(short = 'd')]
    debug: bool,
    /// Ask for MPA CRC32c.
    #[arg(long)]
    crc: bool,
    /// Ask for MPA markers.
    #[arg(long)]
    markers: bool,
    /// Bound of connection setup (TCP connect + MPA exchange) and of any
    /// wait for the peer during the run, in seconds. The server waits
    /// forever for a connection unless this is given.
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Client: wait this long after the connection is established before
    /// the first Send. Linux siw (6.1) as responder loses its first RDMA
    /// Read Request most of the time when the initiator's first FPDU
    /// arrives within a millisecond of its MPA Reply; librdmacm's rping
    /// sends ~8 ms after the Reply. 0 disables the wait.
    #[arg(long, value_name = "MS", default_value_t = 20)]
    first_send_delay: u64,
    #[command(flatten)]
    backend: BackendArgs,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{e}"))?;
    if rping::size_is_valid(n) {
        Ok(n)
    } else {
        Err(format!(
            "Invalid size {n} (valid range is {} to {})",
            rping::MIN_SIZE,
            rping::MAX_SIZE
        ))
    }
}

/// Exit statuses (see the module documentation).
mod status {
    pub const OTHER: u8 = 1;
    pub const CONNECT: u8 = 3;
    pub const MPA: u8 = 4;
    pub const VALIDATION: u8 = 5;
    pub const DISCONNECT: u8 = 6;
}

/// A failure: exit status and its one-line message.
struct Fail(u8, String);

type Res<T> = Result<T, Fail>;

fn other(msg: impl Into<String>) -> Fail {
    Fail(status::OTHER, msg.into())
}

/// The message and exit status of a failed connection setup.
fn cm_fail(what: &str, e: &CmError) -> Fail {
    match e {
        CmError::ConnectionRefused
        | CmError::Unreachable
        | CmError::AddressFamily
        | CmError::Timeout => Fail(status::CONNECT, format!("{what}: {e}")),
        CmError::Rejected { private_data } => {
            let pd = if private_data.is_empty() {
                "none".to_string()
            } else {
                iwarp_apps::hex::encode(private_data)
            };
            Fail(
                status::MPA,
                format!("{what}: MPA reject from the peer (private data: {pd})"),
            )
        }
        CmError::MpaTimeout => Fail(status::MPA, format!("{what}: MPA timeout")),
        CmError::Mpa(_) | CmError::Closed => Fail(status::MPA, format!("{what}: {e}")),
        _ => other(format!("{what}: {e}")),
    }
}

// Work request identifiers.
const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;
const WR_READ: u64 = 3;
const WR_WRITE: u64 = 4;

/// One connection's QP and CQ, with the bookkeeping of outstanding work
/// requests needed to report flushes.
struct Conn {
    qp: Qp,
    cq: Cq,
    outstanding: usize,
    timeout: Duration,
    debug: bool,
    /// Prefix of debug lines: `rping`, or `rping[N]` for connection N of
    /// a persistent server.
    tag: String,
    events: Vec<CmEvent>,
}

/// How a wait for a completion ended.
enum Next {
    Wc(WorkCompletion),
    /// The connection went down (event seen, or a flushed completion
    /// `first`); drain with [`Conn::drain`].
    Down(Option<WorkCompletion>),
}

/// What both roles open before connecting: the device, its PD and CQ,
/// and the buffers of the 16-byte advertisement messages.
struct Resources {
    dev: Device,
    pd: Pd,
    cq: Cq,
    recv_buf: Mr,
    send_buf: Mr,
}

impl Resources {
    fn open(backend: Backend) -> Res<Self> {
        let dev = Device::open(backend, DeviceConfig::default())
            .map_err(|e| other(format!("open device: {e}")))?;
        Self::on(dev)
    }

    /// A PD, a CQ and the advertisement buffers of their own on `dev`
    /// (each connection of a persistent server has its own).
    fn on(dev: Device) -> Res<Self> {
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(2 * rping::SQ_DEPTH as usize);
        let recv_buf = reg(&dev, &pd, RdmaInfo::LEN, Access::LOCAL_WRITE)?;
        let send_buf = reg(&dev, &pd, RdmaInfo::LEN, Access::NONE)?;
        Ok(Self {
            dev,
            pd,
            cq,
            recv_buf,
            send_buf,
        })
    }
}

impl Conn {
    /// Where rping's one receive lands: the start of `mr`.
    fn recv_sge(mr: &Mr) -> [Sge; 1] {
        [mr.sge(0, RdmaInfo::LEN)]
    }

    /// rping's one receive (into [`Self::recv_sge`]); the first is posted
    /// by `connect_with_recvs` / `accept_with_recvs` before the peer can
    /// send.
    fn recv_wr(sgl: &[Sge; 1]) -> RecvWr<'_> {
        RecvWr {
            wr_id: WR_RECV,
            sgl,
        }
    }

    /// A connected QP with its first [`Self::recv_wr`] posted.
    fn start(qp: Qp, cq: Cq, timeout: Duration, debug: bool, tag: &str) -> Self {
        Self {
            qp,
            cq,
            outstanding: 1,
            timeout,
            debug,
            tag: tag.to_string(),
            events: Vec::new(),
        }
    }

    fn post_recv(&mut self, mr: &Mr) -> Res<()> {
        self.qp
            .post_recv(&Self::recv_wr(&Self::recv_sge(mr)))
            .map_err(|e| other(format!("post receive: {e}")))?;
        self.outstanding += 1;
        Ok(())
    }

    fn post_send(&mut self, wr_id: u64, op: SendOp, mr: &Mr, len: usize) -> Res<()> {
        self.qp
            .post_send(&SendWr {
                wr_id,
                op,
                sgl: &[mr.sge(0, len)],
                signaled: true,
            })
            .map_err(|e| other(format!("post {}: {e}", wr_name(wr_id))))?;
        self.outstanding += 1;
        Ok(())
    }

    fn poll_events(&mut self) -> bool {
        let mut down = false;
        while let Some(ev) = self.qp.poll_event() {
            if self.debug {
                errln!("{}: cm event {ev:?}", self.tag);
            }
            down |= matches!(
                ev,
                CmEvent::Disconnected
                    | CmEvent::Error(_)
                    | CmEvent::RemoteTerminate(_)
                    | CmEvent::LocalTerminate(_)
                    | CmEvent::CqOverrun
            );
            self.events.push(ev);
        }
        down
    }

    /// The next completion; a flushed completion or a connection event
    /// ends the wait with [`Next::Down`].
    fn next(&mut self) -> Res<Next> {
        let start = Instant::now();
        let mut wc = [EMPTY_WC; 1];
        loop {
            if self.cq.wait(&mut wc, Some(Duration::from_millis(50))) == 1 {
                self.outstanding = self.outstanding.saturating_sub(1);
                let wc = wc[0];
                if self.debug {
                    errln!(
                        "{}: completion {} {:?} {} bytes",
                        self.tag,
                        wr_name(wc.wr_id),
                        wc.status,
                        wc.byte_len
                    );
                }
                return Ok(match wc.status {
                    WcStatus::Success => Next::Wc(wc),
                    WcStatus::WrFlushError => Next::Down(Some(wc)),
                    s => {
                        return Err(other(format!(
                            "{} work request failed: {s:?} (QP {:?})",
                            wr_name(wc.wr_id),
                            self.qp.state()
                        )))
                    }
                });
            }
            if self.poll_events() {
                return Ok(Next::Down(None));
            }
            if start.elapsed() > self.timeout {
                return Err(other(format!(
                    "no progress for {:.1} s (QP {:?}, {} work requests outstanding)",
                    self.timeout.as_secs_f64(),
                    self.qp.state(),
                    self.outstanding
                )));
            }
        }
    }

    /// After the connection went down: collect the remaining completions.
    /// Returns (work requests outstanding when it went down, how many of
    /// them completed with a flush status, the QP state).
    fn drain(&mut self, first: Option<WorkCompletion>) -> (usize, usize, QpState) {
        let total = self.outstanding + usize::from(first.is_some());
        let mut flushed = usize::from(first.is_some());
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut wc = [EMPTY_WC; 16];
        while self.outstanding > 0 && Instant::now() < deadline {
            let n = self.cq.wait(&mut wc, Some(Duration::from_millis(50)));
            for w in &wc[..n] {
                if self.debug {
                    errln!(
                        "{}: completion {} {:?}",
                        self.tag,
                        wr_name(w.wr_id),
                        w.status
                    );
                }
                self.outstanding = self.outstanding.saturating_sub(1);
                if w.status == WcStatus::WrFlushError {
                    flushed += 1;
                }
            }
        }
        self.poll_events();
        (total, flushed, self.qp.state())
    }

    fn peer_reason(&self) -> String {
        self.events
            .iter()
            .find_map(|e| match e {
                CmEvent::RemoteTerminate(t) => Some(format!("peer sent Terminate ({t})")),
                CmEvent::LocalTerminate(t) => Some(format!("we sent Terminate ({t})")),
                CmEvent::Error(e) => Some(format!("connection error: {e}")),
                _ => None,
            })
            .unwrap_or_else(|| "peer disconnected".to_string())
    }
}

fn wr_name(wr_id: u64) -> &'static str {
    match wr_id {
        WR_RECV => "receive",
        WR_SEND => "send",
        WR_READ => "RDMA read",
        WR_WRITE => "RDMA write",
        _ => "unknown",
    }
}

fn resolve(addr: &str, port: u16) -> Res<SocketAddr> {
    (addr, port)
        .to_socket_addrs()
        .map_err(|e| Fail(status::CONNECT, format!("{addr}: {e}")))?
        .next()
        .ok_or_else(|| Fail(status::CONNECT, format!("{addr}: no address")))
}

fn qp_init(pd: &Pd, cq: &Cq) -> QpInit {
    QpInit {
        pd: pd.clone(),
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        sq_depth: rping::SQ_DEPTH as usize,
        rq_depth: rping::RQ_DEPTH as usize,
        sig_all: false,
        srq: None,
    }
}

fn conn_params(args: &Args, timeout: Duration) -> ConnParams {
    ConnParams {
        ird: rping::IRD_ORD,
        ord: rping::IRD_ORD,
        crc: args.crc,
        markers: args.markers,
        timeout,
        ..ConnParams::default()
    }
}

fn reg(dev: &Device, pd: &Pd, len: usize, access: Access) -> Res<Mr> {
    dev.reg_mr(pd, len, access)
        .map_err(|e| other(format!("register memory: {e}")))
}

fn report_connected(args: &Args, qp: &Qp, tag: &str) {
    if args.debug {
        let n = qp.negotiated();
        errln!(
            "{tag}: connected {} -> {}: MPA rev {} crc {} markers tx {} rx {} ird {} ord {}",
            qp.local_addr(),
            qp.peer_addr(),
            n.revision,
            if n.crc { "on" } else { "off" },
            n.markers_tx,
            n.markers_rx,
            n.ird,
            n.ord
        );
    }
}

/// The "peer disconnected mid-run" failure after draining.
fn mid_run(conn: &mut Conn, first: Option<WorkCompletion>, done: String) -> Fail {
    let (total, flushed, state) = conn.drain(first);
    let reason = conn.peer_reason();
    Fail(
        status::DISCONNECT,
        format!(
            "{reason} mid-run after {done}: QP {state:?}, {flushed} of {total} outstanding work requests completed with a flush status"
        ),
    )
}

fn run_client(args: &Args, timeout: Duration) -> Res<()> {
    let addr = args
        .addr
        .as_deref()
        .ok_or_else(|| Fail(2, "the client needs -a ADDR".into()))?;
    let peer = resolve(addr, args.port)?;
    let Resources {
        dev,
        pd,
        cq,
        recv_buf,
        send_buf,
    } = Resources::open(args.backend.backend().map_err(|e| Fail(2, e))?)?;
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let rdma_buf = reg(&dev, &pd, args.size, rw)?;
    let start_buf = reg(&dev, &pd, args.size, rw)?;
    if args.debug {
        errln!("rping: connecting to {peer}");
    }
    let sge = Conn::recv_sge(&recv_buf);
    let qp = dev
        .connect_with_recvs(
            peer,
            qp_init(&pd, &cq),
            conn_params(args, timeout),
            &[Conn::recv_wr(&sge)],
        )
        .map_err(|e| cm_fail(&format!("connect to {peer}"), &e))?;
    report_connected(args, &qp, "rping");
    let mut conn = Conn::start(qp, cq, timeout, args.debug, "rping");
    // See `--first-send-delay`: give a Linux siw responder time to finish
    // its accept before our first FPDU arrives.
    std::thread::sleep(Duration::from_millis(args.first_send_delay));

    let mut client = Client::new(if args.count == 0 {
        None
    } else {
        Some(args.count)
    });
    let mut ping = vec![0u8; args.size];
    let mut got = vec![0u8; args.size];
    let mut action = client.start();
    loop {
        match action {
            ClientAction::AdvertiseStart { iteration } => {
                fill_ping(&mut ping, iteration);
                start_buf.write(0, &ping);
                let info = RdmaInfo {
                    addr: start_buf.addr(),
                    rkey: start_buf.rkey(),
                    size: args.size as u32,
                };
                send_buf.write(0, &info.to_bytes());
                conn.post_send(WR_SEND, send_op(), &send_buf, RdmaInfo::LEN)?;
                action = client.advance();
            }
            ClientAction::AdvertiseRdma => {
                let info = RdmaInfo {
                    addr: rdma_buf.addr(),
                    rkey: rdma_buf.rkey(),
                    size: args.size as u32,
                };
                send_buf.write(0, &info.to_bytes());
                conn.post_send(WR_SEND, send_op(), &send_buf, RdmaInfo::LEN)?;
                action = client.advance();
            }
            ClientAction::WaitRecv => match conn.next()? {
                Next::Wc(wc) if wc.opcode == WcOpcode::Recv => {
                    conn.post_recv(&recv_buf)?;
                    action = client
                        .on_recv(wc.byte_len as usize)
                        .map_err(|_| other(format!("Received bogus data, size {}", wc.byte_len)))?;
                }
                Next::Wc(_) => {}
                Next::Down(first) => {
                    return Err(mid_run(
                        &mut conn,
                        first,
                        format!("{} pings", client.completed()),
                    ))
                }
            },
            ClientAction::Check { iteration } => {
                rdma_buf.read(0, &mut got);
                if args.validate && got != ping {
                    return Err(Fail(
                        status::VALIDATION,
                        format!("data mismatch in ping {iteration}!"),
                    ));
                }
                if args.verbose {
                    outln!("{}", rping::client_line(&got));
                }
                action = client.advance();
            }
            ClientAction::Disconnect => break,
        }
    }
    conn.qp.disconnect();
    // Wait for our close to complete (bounded).
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        conn.poll_events();
        if conn.events.contains(&CmEvent::Disconnected) {
            break;
        }
        if let Some(e) = conn.qp.wait_event(Duration::from_millis(50)) {
            if args.debug {
                errln!("rping: cm event {e:?}");
            }
            conn.events.push(e);
        }
    }
    let (total, flushed, state) = conn.drain(None);
    if args.debug {
        errln!(
            "rping: client DISCONNECT EVENT... QP {state:?}, {flushed} of {total} outstanding work requests flushed"
        );
    }
    Ok(())
}

fn send_op() -> SendOp {
    SendOp::Send {
        solicited: false,
        invalidate: None,
    }
}

/// The single-shot server: one connection, then exit.
fn run_server(args: &Args, timeout: Duration, accept_timeout: Option<Duration>) -> Res<()> {
    let bind = resolve(args.addr.as_deref().unwrap_or("0.0.0.0"), args.port)?;
    let dev = Device::open(
        args.backend.backend().map_err(|e| Fail(2, e))?,
        DeviceConfig::default(),
    )
    .map_err(|e| other(format!("open device: {e}")))?;
    let listener = dev
        .listen(bind)
        .map_err(|e| other(format!("listen on {bind}: {e}")))?;
    if args.debug {
        errln!("rping: listening on {}", listener.local_addr());
    }
    let req = listener
        .get_request(accept_timeout)
        .map_err(|e| other(format!("waiting for a connection: {e}")))?;
    serve(args, dev, req, Some(listener), timeout, "rping")
}

/// The persistent server (`-P`, like librdmacm's rping): accept
/// connection after connection, each served on a thread of its own with
/// its own PD, CQ, QP and buffers, several at once. A connection that
/// fails is reported (`rping: connection N from ADDR: ...`) and the
/// server goes on. With `--max-conns N` the server stops accepting after
/// N connection requests, waits for their end and exits: 0 when every
/// connection succeeded, else the status of the first (in accept order)
/// that failed. With `--timeout`, a wait of that long for the next
/// connection ends the server the same way (status 1).
fn run_persistent(args: &Args, timeout: Duration, accept_timeout: Option<Duration>) -> Res<()> {
    let bind = resolve(args.addr.as_deref().unwrap_or("0.0.0.0"), args.port)?;
    let dev = Device::open(
        args.backend.backend().map_err(|e| Fail(2, e))?,
        DeviceConfig::default(),
    )
    .map_err(|e| other(format!("open device: {e}")))?;
    let listener = dev
        .listen(bind)
        .map_err(|e| other(format!("listen on {bind}: {e}")))?;
    if args.debug {
        errln!(
            "rping: listening on {} (persistent{})",
            listener.local_addr(),
            match args.max_conns {
                Some(n) => format!(", {n} connections"),
                None => String::new(),
            }
        );
    }
    let (done_tx, done_rx) = mpsc::channel::<(u64, Option<u8>)>();
    let mut threads: Vec<std::thread::JoinHandle<()>> = Vec::new();
    let mut accepted = 0u64;
    let mut idle = None;
    while args.max_conns.is_none_or(|max| accepted < max) {
        let req = match listener.get_request(accept_timeout) {
            Ok(req) => req,
            Err(e) => {
                idle = Some(other(format!(
                    "waiting for a connection after {accepted}: {e}"
                )));
                break;
            }
        };
        accepted += 1;
        let n = accepted;
        let peer = req.peer_addr();
        let (args, dev, done) = (args.clone(), dev.clone(), done_tx.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("rping-conn-{n}"))
            .spawn(move || {
                let tag = format!("rping[{n}]");
                let status = match serve(&args, dev, req, None, timeout, &tag) {
                    Ok(()) => None,
                    Err(Fail(code, msg)) => {
                        errln!("rping: connection {n} from {peer}: {msg}");
                        Some(code)
                    }
                };
                let _ = done.send((n, status));
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                errln!("rping: connection {n} from {peer}: no thread: {e}");
                let _ = done_tx.send((n, Some(status::OTHER)));
            }
        }
        // Reap the threads of connections that ended: a server that runs
        // for ever keeps only the live ones.
        let (live, ended): (Vec<_>, Vec<_>) = threads.drain(..).partition(|t| !t.is_finished());
        threads = live;
        for t in ended {
            let _ = t.join();
        }
    }
    drop(listener);
    drop(done_tx);
    for t in threads {
        let _ = t.join();
    }
    let mut results: Vec<(u64, Option<u8>)> = done_rx.iter().collect();
    results.sort_unstable();
    let failed: Vec<u64> = results.iter().filter_map(|&(n, s)| s.map(|_| n)).collect();
    if args.debug {
        errln!(
            "rping: persistent server done: {accepted} connections, {} failed{}",
            failed.len(),
            if failed.is_empty() {
                String::new()
            } else {
                format!(
                    " ({})",
                    failed
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
    }
    if let Some(f) = idle {
        return Err(f);
    }
    match results.iter().find_map(|&(n, s)| s.map(|c| (n, c))) {
        None => Ok(()),
        Some((n, code)) => Err(Fail(
            code,
            format!(
                "{} of {accepted} connections failed, the first: connection {n}",
                failed.len()
            ),
        )),
    }
}

/// Serve one connection request to its end: accept it with resources of
/// its own on `dev`, answer pings until the client disconnects, and
/// release everything (QP, CQ, PD, buffers) on return. `listener` (the
/// single-shot server's) closes once the connection is accepted.
fn serve(
    args: &Args,
    dev: Device,
    req: ConnRequest,
    listener: Option<Listener>,
    timeout: Duration,
    tag: &str,
) -> Res<()> {
    let Resources {
        dev,
        pd,
        cq,
        recv_buf,
        send_buf,
    } = Resources::on(dev)?;
    send_buf.write(0, &GO_AHEAD);
    // Sized for the largest ping any client may advertise.
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let rdma_len = rping::MAX_SIZE.max(args.size);
    let rdma_buf = reg(&dev, &pd, rdma_len, rw)?;
    if args.debug {
        let r = req.request();
        errln!(
            "{tag}: connection request from {}: MPA rev {} crc {} markers {} ird/ord {:?}",
            req.peer_addr(),
            r.revision,
            r.crc,
            r.markers,
            r.ird_ord
        );
    }
    let peer = req.peer_addr();
    // rping's client sends as soon as it is connected: the receive must
    // be there before our reply goes out.
    let sge = Conn::recv_sge(&recv_buf);
    let qp = req
        .accept_with_recvs(
            qp_init(&pd, &cq),
            conn_params(args, timeout),
            &[Conn::recv_wr(&sge)],
        )
        .map_err(|e| cm_fail(&format!("accept from {peer}"), &e))?;
    drop(listener);
    report_connected(args, &qp, tag);
    let mut conn = Conn::start(qp, cq, timeout, args.debug, tag);
    let mut server = Server::new();
    let mut read_len = 0usize;
    let mut buf = vec![0u8; rdma_len];
    loop {
        let wc = match conn.next() {
            Ok(Next::Wc(wc)) => wc,
            Ok(Next::Down(first)) => {
                let done = server.pings();
                let clean = server.is_idle() && (args.count == 0 || done == args.count);
                if clean {
                    let (total, flushed, state) = conn.drain(first);
                    if args.debug {
                        errln!(
                            "{tag}: server DISCONNECT EVENT... {done} pings, QP {state:?}, {flushed} of {total} outstanding work requests flushed"
                        );
                    }
                    return Ok(());
                }
                let done = if args.count == 0 {
                    format!("{done} pings")
                } else {
                    format!("{done} of {} pings", args.count)
                };
                return Err(mid_run(&mut conn, first, done));
            }
            // A timeout while idle with no count to reach is an error too:
            // the client neither pings nor disconnects.
            Err(f) => return Err(f),
        };
        let action = match wc.wr_id {
            WR_RECV => {
                let n = (wc.byte_len as usize).min(RdmaInfo::LEN);
                let mut msg = vec![0u8; n];
                recv_buf.read(0, &mut msg);
                conn.post_recv(&recv_buf)?;
                Some(server.on_recv(&msg).map_err(|_| {
                    other(format!(
                        "Received bogus data, size {} (advertisement out of order or malformed)",
                        wc.byte_len
                    ))
                })?)
            }
            WR_READ => {
                buf[..read_len].fill(0);
                rdma_buf.read(0, &mut buf[..read_len]);
                if args.verbose {
                    outln!("{}", rping::server_line(&buf[..read_len]));
                }
                Some(
                    server
                        .on_read_done()
                        .map_err(|_| other("unexpected RDMA read completion"))?,
                )
            }
            WR_WRITE => Some(
                server
                    .on_write_done()
                    .map_err(|_| other("unexpected RDMA write completion"))?,
            ),
            _ => None,
        };
        match action {
            Some(ServerAction::Read(info)) => {
                let len = info.size as usize;
                if len > rdma_len {
                    return Err(other(format!(
                        "the client advertised {len} bytes, more than {rdma_len}"
                    )));
                }
                read_len = len;
                conn.post_send(
                    WR_READ,
                    SendOp::Read {
                        remote_addr: info.addr,
                        rkey: info.rkey,
                    },
                    &rdma_buf,
                    len,
                )?;
            }
            Some(ServerAction::Write(info)) => {
                let len = echo_len(&buf[..read_len]).min(info.size as usize);
                conn.post_send(
                    WR_WRITE,
                    SendOp::Write {
                        remote_addr: info.addr,
                        rkey: info.rkey,
                    },
                    &rdma_buf,
                    len,
                )?;
            }
            Some(ServerAction::SendGoAhead) => {
                conn.post_send(WR_SEND, send_op(), &send_buf, RdmaInfo::LEN)?;
            }
            None => {}
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    iwarp_apps::logging::init("rping", args.debug);
    let secs = args.timeout.unwrap_or(10.0);
    if !(secs.is_finite() && secs > 0.0) {
        errln!("rping: --timeout must be a positive number of seconds");
        return ExitCode::from(2);
    }
    let timeout = Duration::from_secs_f64(secs);
    let result = if args.server && args.persistent {
        run_persistent(&args, timeout, args.timeout.map(|_| timeout))
    } else if args.server {
        run_server(&args, timeout, args.timeout.map(|_| timeout))
    } else {
        run_client(&args, timeout)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail(code, msg)) => {
            errln!("rping: {msg}");
            ExitCode::from(code)
        }
    }
}
