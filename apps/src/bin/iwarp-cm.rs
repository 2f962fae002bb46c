//! `iwarp-cm`: a connection-manager exerciser (in the spirit of
//! librdmacm's `ucmatose`) on this project's iWARP stack, kernel TCP
//! backend. It sets up one connection with MPA private data in both
//! directions and prints what the peer sent; no data transfer.
//!
//! ```text
//! iwarp-cm server [-a ADDR] -p PORT [--reject] [--pdata HEX] [--crc] [--timeout SECS]
//! iwarp-cm client  -a ADDR  -p PORT [--pdata HEX] [--crc] [--timeout SECS]
//! ```
//!
//! The server takes one connection request, prints its private data, then
//! accepts it (replying with `--pdata`) and waits for the client to
//! disconnect, or with `--reject` rejects it with `--pdata`. The client
//! connects with `--pdata`, prints the private data of the accept or of the
//! reject, and disconnects.
//!
//! Output on stdout, one line each (the same lines as the VM-side peer
//! `scripts/interop/cm_peer.c`):
//!
//! ```text
//! PDATA-RECV <len> <hex>   the peer's request (server) or accept reply (client)
//! REJECTED <len> <hex>     the peer rejected (client)
//! ESTABLISHED              the connection is up
//! DISCONNECTED             the peer disconnected (server)
//! ```
//!
//! `<hex>` is `-` when there is no private data. Private data is the ULP
//! part only: the 4 MPA v2 IRD/ORD bytes in front of it are the stack's.
//! More than 508 bytes (512 minus the IRD/ORD words, RFC 5044/6581) is
//! refused before anything is sent.
//!
//! Exit status:
//!
//! | status | meaning |
//! | --- | --- |
//! | 0 | success (also: the server sent its reject) |
//! | 1 | other error |
//! | 2 | bad command line |
//! | 3 | connection refused or unreachable |
//! | 4 | rejected by the peer (`REJECTED` printed) |
//! | 5 | timeout: TCP connect, MPA exchange, waiting for a request or the disconnect |
//! | 6 | MPA failed: invalid frame, negotiation mismatch, the peer closed or reset the connection during setup |
//! | 7 | the private data is longer than MPA allows (refused locally, nothing sent) |

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args as ClapArgs, Parser, Subcommand};
use iwarp::mpa::handshake::MAX_ULP_PRIVATE_DATA_ENHANCED;
use iwarp_apps::hex;
use iwarp_engine::{Backend, CmError, CmEvent, ConnParams, Device, DeviceConfig, QpInit};

/// iWARP connection-manager exerciser: one connection with MPA private
/// data both ways, printed as hex.
#[derive(Parser, Debug)]
#[command(
    about,
    disable_version_flag = true,
    after_help = "Output: 'PDATA-RECV <len> <hex>', 'REJECTED <len> <hex>' ('-' for none), \
                  'ESTABLISHED', 'DISCONNECTED'.\n\
                  Exit status: 0 success, 1 other error, 2 bad command line, \
                  3 refused or unreachable, 4 rejected by the peer, 5 timeout, \
                  6 MPA failed (invalid frame, mismatch, peer closed during setup), \
                  7 private data too long (refused locally)."
)]
struct Cli {
    #[command(subcommand)]
    role: Role,
    /// The stack's log on stderr at debug level (`RUST_LOG`, when set,
    /// chooses its filter instead).
    #[arg(short = 'd', long = "debug", global = true)]
    debug: bool,
}

#[derive(Subcommand, Debug)]
enum Role {
    /// Take one connection request; accept or reject it.
    Server {
        /// Address to bind (default: any).
        #[arg(short = 'a')]
        addr: Option<String>,
        /// Reject the request (with --pdata) instead of accepting it.
        #[arg(long)]
        reject: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Connect, print the reply's private data, disconnect.
    Client {
        /// Address to connect to.
        #[arg(short = 'a')]
        addr: String,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(ClapArgs, Debug)]
struct Common {
    /// TCP port.
    #[arg(short = 'p')]
    port: u16,
    /// Private data to send (hex; empty or '-' for none).
    #[arg(long, value_name = "HEX", default_value = "", value_parser = parse_pdata)]
    pdata: Pdata,
    /// Ask for MPA CRC32c.
    #[arg(long)]
    crc: bool,
    /// Bound of every wait (TCP connect + MPA, the request, the
    /// disconnect), in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    timeout: f64,
}

/// Private data from the command line.
#[derive(Clone, Debug)]
struct Pdata(Vec<u8>);

fn parse_pdata(s: &str) -> Result<Pdata, String> {
    hex::decode(s).map(Pdata)
}

mod status {
    pub const OTHER: u8 = 1;
    pub const REFUSED: u8 = 3;
    pub const REJECTED: u8 = 4;
    pub const TIMEOUT: u8 = 5;
    pub const MPA: u8 = 6;
    pub const TOO_LONG: u8 = 7;
}

/// A failure: exit status and its one-line message.
struct Fail(u8, String);

/// `PDATA-RECV` / `REJECTED` line.
fn print_pdata(tag: &str, pd: &[u8]) {
    let h = if pd.is_empty() {
        "-".to_string()
    } else {
        hex::encode(pd)
    };
    println!("{tag} {} {h}", pd.len());
}

/// The exit status of a failed connection setup.
fn cm_status(e: &CmError) -> u8 {
    match e {
        CmError::ConnectionRefused | CmError::Unreachable => status::REFUSED,
        CmError::Rejected { .. } => status::REJECTED,
        CmError::Timeout | CmError::MpaTimeout => status::TIMEOUT,
        CmError::Mpa(_) | CmError::Closed => status::MPA,
        CmError::Io(ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted) => status::MPA,
        _ => status::OTHER,
    }
}

fn cm_fail(what: &str, e: &CmError) -> Fail {
    Fail(cm_status(e), format!("{what}: {e}"))
}

/// Refuse private data MPA cannot carry before anything goes on the wire.
fn check_len(pd: &[u8]) -> Result<(), Fail> {
    if pd.len() > MAX_ULP_PRIVATE_DATA_ENHANCED {
        return Err(Fail(
            status::TOO_LONG,
            format!(
                "{} bytes of private data: MPA allows at most {MAX_ULP_PRIVATE_DATA_ENHANCED} \
                 (512 minus the 4 MPA v2 IRD/ORD bytes); nothing sent",
                pd.len()
            ),
        ));
    }
    Ok(())
}

fn timeout_of(c: &Common) -> Result<Duration, Fail> {
    Duration::try_from_secs_f64(c.timeout)
        .map_err(|e| Fail(status::OTHER, format!("--timeout {}: {e}", c.timeout)))
}

fn open() -> Result<(Device, QpInit), Fail> {
    let dev = Device::open(Backend::Kernel, DeviceConfig::default())
        .map_err(|e| Fail(status::OTHER, format!("open device: {e}")))?;
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(8);
    let init = QpInit {
        pd,
        send_cq: cq.clone(),
        recv_cq: cq,
        sq_depth: 4,
        rq_depth: 4,
        sig_all: false,
        srq: None,
    };
    Ok((dev, init))
}

fn params(c: &Common, timeout: Duration) -> ConnParams {
    ConnParams {
        private_data: c.pdata.0.clone(),
        crc: c.crc,
        timeout,
        ..ConnParams::default()
    }
}

fn run_client(addr: &str, c: &Common) -> Result<(), Fail> {
    check_len(&c.pdata.0)?;
    let timeout = timeout_of(c)?;
    let peer: SocketAddr = (addr, c.port)
        .to_socket_addrs()
        .map_err(|e| Fail(status::REFUSED, format!("{addr}: {e}")))?
        .next()
        .ok_or_else(|| Fail(status::REFUSED, format!("{addr}: no address")))?;
    let (dev, init) = open()?;
    eprintln!(
        "iwarp-cm: connecting to {peer} with {} bytes of private data",
        c.pdata.0.len()
    );
    let qp = match dev.connect(peer, init, params(c, timeout)) {
        Ok(qp) => qp,
        Err(CmError::Rejected { private_data }) => {
            print_pdata("REJECTED", &private_data);
            return Err(Fail(
                status::REJECTED,
                format!("{peer}: rejected by the peer"),
            ));
        }
        Err(e) => return Err(cm_fail(&format!("connect to {peer}"), &e)),
    };
    print_pdata("PDATA-RECV", &qp.peer_private_data());
    println!("ESTABLISHED");
    let n = qp.negotiated();
    eprintln!("iwarp-cm: connected: MPA rev {} crc {}", n.revision, n.crc);
    qp.disconnect();
    Ok(())
}

fn run_server(addr: Option<&str>, reject: bool, c: &Common) -> Result<(), Fail> {
    check_len(&c.pdata.0)?;
    let timeout = timeout_of(c)?;
    let ip: IpAddr = match addr {
        Some(a) => a
            .parse()
            .map_err(|e| Fail(status::OTHER, format!("-a {a}: {e}")))?,
        None => Ipv6Addr::UNSPECIFIED.into(),
    };
    let bind = SocketAddr::new(ip, c.port);
    let (dev, init) = open()?;
    let listener = dev
        .listen(bind)
        .map_err(|e| Fail(status::OTHER, format!("listen on {bind}: {e}")))?;
    eprintln!("iwarp-cm: listening on {}", listener.local_addr());
    let req = listener
        .get_request(Some(timeout))
        .map_err(|e| cm_fail("waiting for a connection request", &e))?;
    let peer = req.peer_addr();
    print_pdata("PDATA-RECV", req.private_data());
    if reject {
        req.reject(&c.pdata.0)
            .map_err(|e| cm_fail(&format!("reject {peer}"), &e))?;
        // The reject frame is written by an engine pass; a device dropped
        // before that pass closes the socket without it. Run passes here
        // until the engine is idle (the frame is out).
        for _ in 0..100 {
            if dev.progress() == 0 {
                break;
            }
        }
        eprintln!(
            "iwarp-cm: rejected {peer} with {} bytes of private data",
            c.pdata.0.len()
        );
        return Ok(());
    }
    let qp = req
        .accept(init, params(c, timeout))
        .map_err(|e| cm_fail(&format!("accept {peer}"), &e))?;
    drop(listener);
    println!("ESTABLISHED");
    let n = qp.negotiated();
    eprintln!("iwarp-cm: connected: MPA rev {} crc {}", n.revision, n.crc);
    match qp.wait_event(timeout) {
        Some(CmEvent::Disconnected) => {
            println!("DISCONNECTED");
            Ok(())
        }
        Some(ev) => Err(Fail(
            status::OTHER,
            format!("{peer}: unexpected event {ev:?} instead of a disconnect"),
        )),
        None => Err(Fail(
            status::TIMEOUT,
            format!("{peer}: no disconnect within {timeout:?}"),
        )),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    iwarp_apps::logging::init("iwarp-cm", cli.debug);
    let result = match &cli.role {
        Role::Server {
            addr,
            reject,
            common,
        } => run_server(addr.as_deref(), *reject, common),
        Role::Client { addr, common } => run_client(addr, common),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail(code, msg)) => {
            eprintln!("iwarp-cm: {msg}");
            ExitCode::from(code)
        }
    }
}
