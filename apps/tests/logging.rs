//! The tools' log on stderr: `-d` turns on the project's debug events,
//! `RUST_LOG` chooses the filter (and wins over `-d`), and with neither a
//! run without failures logs nothing.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};

const DEMO: &str = env!("CARGO_BIN_EXE_iwarp-demo");
const RPING: &str = env!("CARGO_BIN_EXE_rping");

/// The lines of `out`'s stderr that the log subscriber wrote: an RFC 3339
/// UTC timestamp, then a level.
fn log_lines(out: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(out)
        .lines()
        .filter(|l| {
            let mut words = l.split_whitespace();
            let stamp = words.next().unwrap_or("");
            let level = words.next().unwrap_or("");
            stamp.len() > 20
                && stamp.starts_with("20")
                && stamp.ends_with('Z')
                && ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level)
        })
        .map(str::to_owned)
        .collect()
}

/// The in-memory demo (no network), quick settings.
fn demo(args: &[&str], rust_log: Option<&str>) -> Output {
    let mut cmd = Command::new(DEMO);
    cmd.args(["--quiet", "--size", "4096", "--iterations", "1"])
        .args(args);
    match rust_log {
        Some(v) => cmd.env("RUST_LOG", v),
        None => cmd.env_remove("RUST_LOG"),
    };
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    out
}

fn has(lines: &[String], level: &str, what: &str) -> bool {
    lines
        .iter()
        .any(|l| l.split_whitespace().nth(1) == Some(level) && l.contains(what))
}

#[test]
fn debug_flag_logs_the_cores_debug_events() {
    let out = demo(&["-d"], None);
    let lines = log_lines(&out.stderr);
    assert!(
        has(&lines, "DEBUG", "iwarp::qp: connect: MPA request queued"),
        "{lines:#?}"
    );
    assert!(
        has(&lines, "INFO", "connection established (RTS)"),
        "{lines:#?}"
    );
    // The tool's own output is unchanged: stdout only.
    assert!(String::from_utf8_lossy(&out.stdout).contains("verification: all passed"));
}

#[test]
fn rust_log_chooses_the_filter() {
    let lines = log_lines(&demo(&[], Some("iwarp::qp=debug")).stderr);
    assert!(has(&lines, "DEBUG", "MPA request received"), "{lines:#?}");
    // At info, no debug line; RUST_LOG wins over -d.
    let lines = log_lines(&demo(&["-d"], Some("iwarp=info")).stderr);
    assert!(
        has(&lines, "INFO", "connection established (RTS)"),
        "{lines:#?}"
    );
    assert!(!has(&lines, "DEBUG", ""), "{lines:#?}");
}

#[test]
fn without_flag_or_rust_log_nothing_is_logged() {
    let out = demo(&[], None);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    let out = demo(&[], Some(""));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn rping_debug_lines_carry_the_connection_span() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    // The server's own -d lines tell when it listens; RUST_LOG=off keeps
    // its log quiet.
    let mut srv = Command::new(RPING)
        .args(["-s", "-a", "127.0.0.1", "-p", &port, "-C", "1", "-d"])
        .args(["--timeout", "20"])
        .env("RUST_LOG", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(srv.stderr.take().unwrap());
    let mut server_err = Vec::new();
    loop {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "the server exited before listening"
        );
        server_err.extend_from_slice(line.as_bytes());
        if line.contains("listening on") {
            break;
        }
    }
    let reader = std::thread::spawn(move || {
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut err, &mut rest).unwrap();
        rest
    });
    let cli = Command::new(RPING)
        .args(["-c", "-a", "127.0.0.1", "-p", &port, "-C", "1", "-d"])
        .args(["--timeout", "20"])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(cli.status.success(), "{cli:?}");
    assert!(srv.wait().unwrap().success());
    server_err.extend(reader.join().unwrap());

    let lines = log_lines(&cli.stderr);
    let conn = format!("peer=127.0.0.1:{port}}}");
    for what in [
        "connect: MPA request queued",
        "MPA reply received",
        "connection established (RTS)",
        "disconnect",
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.contains(what) && l.contains("conn{qp=") && l.contains(&conn)),
            "{what:?} in the connection's span: {lines:#?}"
        );
    }
    assert!(has(&lines, "INFO", "device opened"), "{lines:#?}");
    // rping's own -d lines are still there, and the server logged nothing.
    assert!(String::from_utf8_lossy(&cli.stderr).contains("rping: connected 127.0.0.1:"));
    assert!(
        log_lines(&server_err).is_empty(),
        "{}",
        String::from_utf8_lossy(&server_err)
    );
    assert!(String::from_utf8_lossy(&server_err).contains("rping: connected"));
}
