//! `iwarp-probe`: a hostile-peer conformance probe for iWARP listeners and
//! initiators (see `iwarp_apps::probe`).
//!
//! ```text
//! iwarp-probe --list
//! iwarp-probe --connect 127.0.0.1:7174 [--peer target|rping] [--scenario NAME]... | all
//! iwarp-probe --listen 0.0.0.0:7174 --peer rping --scenario NAME...   (one connection each)
//! iwarp-probe target --listen 127.0.0.1:7175 [--count N]
//! ```
//!
//! One line per scenario: `scenario NAME: REACTION`, or `scenario NAME:
//! skipped: ...` / `scenario NAME: probe failed: ...`. Exit status 0 unless
//! the probe itself failed on a scenario (1) or the arguments are wrong (2).

use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use iwarp_apps::probe::{self, target, Options, PeerKind, ProbeError, SCENARIOS};
use iwarp_engine::{Backend, Device, DeviceConfig, Progress};

/// Hostile-peer iWARP conformance probe.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// List the scenarios and exit.
    #[arg(long)]
    list: bool,
    /// List the scenarios as tab-separated name, summary, RFC expectation
    /// and our stack's reaction, and exit.
    #[arg(long)]
    list_tsv: bool,
    /// Connect to this listener (initiator role).
    #[arg(long, conflicts_with = "listen")]
    connect: Option<SocketAddr>,
    /// Listen here and wait for an initiator per scenario (responder role).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// The peer's application protocol.
    #[arg(long, value_enum, default_value_t = Peer::Target)]
    peer: Peer,
    /// Scenario to run (repeatable; `all` for every one).
    #[arg(long = "scenario", short = 's')]
    scenarios: Vec<String>,
    /// Seconds to wait for each step and for the reaction.
    #[arg(long, default_value_t = 3.0)]
    timeout: f64,
    /// Seconds to wait for an initiator (listen role).
    #[arg(long, default_value_t = 30.0)]
    accept_timeout: f64,
    /// Retries of a stream scenario whose connection setup was refused,
    /// reset or rejected (a peer restarting its listener).
    #[arg(long, default_value_t = 0)]
    setup_retries: u32,
    /// Milliseconds between the MPA reply and our first FPDU.
    #[arg(long, default_value_t = 100)]
    first_send_delay: u64,
    /// The stack's log on stderr at debug level (`RUST_LOG`, when set,
    /// chooses its filter instead).
    #[arg(short = 'd', long = "debug", global = true)]
    debug: bool,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the test target on our stack (kernel TCP backend).
    Target {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:7175")]
        listen: SocketAddr,
        /// Connections to serve (0: forever).
        #[arg(long, default_value_t = 0)]
        count: usize,
        /// Seconds to wait for each connection and for its end.
        #[arg(long, default_value_t = 30.0)]
        timeout: f64,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Peer {
    /// Our test target (`iwarp-probe target`).
    Target,
    /// librdmacm's rping (server with --connect, client with --listen).
    Rping,
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::from_secs(3))
}

fn run_target(listen: SocketAddr, count: usize, timeout: Duration) -> ExitCode {
    let dev = match Device::open(
        Backend::Kernel,
        DeviceConfig {
            progress: Progress::Thread { cpu: None },
            seed: None,
            busy_poll: false,
        },
    ) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("iwarp-probe: open device: {e}");
            return ExitCode::from(1);
        }
    };
    let listener = match dev.listen(listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("iwarp-probe: listen on {listen}: {e}");
            return ExitCode::from(1);
        }
    };
    eprintln!("iwarp-probe: target listening on {}", listener.local_addr());
    let mut served = 0;
    while count == 0 || served < count {
        match target::serve_one(&dev, &listener, timeout) {
            Ok(r) => println!(
                "target: established={} advertised={} local_terminate={} remote_terminate={} state={:?} recvs {} ok {} flushed {} errors {:?} modified {:?}",
                r.established,
                r.advertised,
                r.local_terminate.map_or("-".into(), |c| format!("{c:?}")),
                r.remote_terminate.map_or("-".into(), |c| format!("{c:?}")),
                r.final_state,
                r.recvs_posted,
                r.recvs_ok,
                r.flushed,
                r.errors,
                r.modified
            ),
            Err(e) => println!("target: no connection: {e}"),
        }
        served += 1;
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let args = Args::parse();
    iwarp_apps::logging::init("iwarp-probe", args.debug);
    if let Some(Cmd::Target {
        listen,
        count,
        timeout,
    }) = args.cmd
    {
        return run_target(listen, count, secs(timeout));
    }
    if args.list_tsv {
        for s in SCENARIOS {
            println!("{}\t{}\t{}\t{}", s.name, s.summary, s.rfc, s.expect);
        }
        return ExitCode::SUCCESS;
    }
    if args.list {
        for s in SCENARIOS {
            println!("{:24} {}", s.name, s.summary);
        }
        return ExitCode::SUCCESS;
    }
    let mut list = Vec::new();
    for name in &args.scenarios {
        if name == "all" {
            list.extend(SCENARIOS.iter());
        } else if let Some(s) = probe::scenario(name) {
            list.push(s);
        } else {
            eprintln!("iwarp-probe: unknown scenario '{name}' (see --list)");
            return ExitCode::from(2);
        }
    }
    if list.is_empty() {
        eprintln!("iwarp-probe: no --scenario given (see --list)");
        return ExitCode::from(2);
    }
    let opts = Options {
        peer: match args.peer {
            Peer::Target => PeerKind::Target,
            Peer::Rping => PeerKind::Rping,
        },
        timeout: secs(args.timeout),
        first_send_delay: Duration::from_millis(args.first_send_delay),
        setup_retries: args.setup_retries,
    };
    let listener = match args.listen.map(TcpListener::bind).transpose() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("iwarp-probe: listen: {e}");
            return ExitCode::from(2);
        }
    };
    if listener.is_none() && args.connect.is_none() {
        eprintln!("iwarp-probe: give --connect ADDR or --listen ADDR");
        return ExitCode::from(2);
    }
    if let Some(l) = &listener {
        if let Ok(a) = l.local_addr() {
            eprintln!("iwarp-probe: listening on {a}");
        }
    }
    let mut broke = false;
    for s in list {
        let r = match (&listener, args.connect) {
            (Some(l), _) => probe::run_server(s, l, &opts, secs(args.accept_timeout), &mut |_| {}),
            (None, Some(addr)) => probe::run_client(s, addr, &opts, &mut |_| {}),
            (None, None) => unreachable!("checked above"),
        };
        match r {
            Ok(o) => {
                let skipped = if o.skipped > 0 {
                    format!(" (after {} other FPDUs)", o.skipped)
                } else {
                    String::new()
                };
                println!("scenario {}: {}{skipped}", s.name, o.reaction);
            }
            Err(e @ ProbeError::Unsupported(_)) => println!("scenario {}: skipped: {e}", s.name),
            Err(e) => {
                broke = true;
                println!("scenario {}: {e}", s.name);
            }
        }
    }
    if broke {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
