//! Our rping server against our rping client over 127.0.0.1 (the built
//! binary, kernel TCP backend), plus the setup failures a client reports.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const RPING: &str = env!("CARGO_BIN_EXE_rping");

/// A port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start a server with `-d` and wait until it listens; returns the child
/// and a receiver of the rest of its stderr.
fn server(port: u16, extra: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(RPING)
        .args(["-s", "-a", "127.0.0.1", "-p", &port.to_string(), "-d"])
        .args(["--timeout", "20"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the server did not start listening");
        if line.contains("listening on") {
            break;
        }
    }
    (child, rx)
}

fn client(port: u16, extra: &[&str]) -> Output {
    let timeout: &[&str] = if extra.contains(&"--timeout") {
        &[]
    } else {
        &["--timeout", "20"]
    };
    Command::new(RPING)
        .args(["-c", "-a", "127.0.0.1", "-p", &port.to_string()])
        .args(timeout)
        .args(extra)
        .output()
        .unwrap()
}

/// Wait for the server; returns (status code, stdout, stderr).
fn finish(child: Child, rx: mpsc::Receiver<String>) -> (Option<i32>, String, String) {
    let out = child.wait_with_output().unwrap();
    // Every line up to the end of the pipe: the reader thread drops its
    // sender at EOF, which ends the iteration (the process has exited, so
    // EOF comes; the last lines may still be in flight when it exits).
    let stderr: Vec<String> = rx.iter().collect();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr.join("\n"),
    )
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ping_pong(crc: bool) {
    let port = free_port();
    let flags: &[&str] = if crc { &["--crc"] } else { &[] };
    let (srv, rx) = server(port, &[&["-v", "-C", "10"], flags].concat());
    let c = client(port, &[&["-C", "10", "-V", "-v", "-d"], flags].concat());
    let (code, sout, serr) = finish(srv, rx);
    let cout = text(&c.stdout);
    let cerr = text(&c.stderr);
    assert_eq!(c.status.code(), Some(0), "client: {cout}\n{cerr}");
    assert_eq!(code, Some(0), "server: {sout}\n{serr}");
    let want_crc = if crc { "crc on" } else { "crc off" };
    assert!(cerr.contains(want_crc), "client: {cerr}");
    assert!(serr.contains(want_crc), "server: {serr}");
    let lines: Vec<&str> = cout.lines().collect();
    assert_eq!(lines.len(), 10, "{cout}");
    assert_eq!(
        lines[0],
        "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
    );
    assert!(lines[9].starts_with("ping data: rdma-ping-9: JKL"));
    assert_eq!(sout.lines().count(), 10, "{sout}");
    assert!(sout
        .lines()
        .all(|l| l.starts_with("server ping data: rdma-ping-")));
}

#[test]
fn ten_pings_crc_off() {
    ping_pong(false);
}

#[test]
fn ten_pings_crc_on() {
    ping_pong(true);
}

#[test]
fn large_pings_validate() {
    let port = free_port();
    let (srv, rx) = server(port, &[]);
    let c = client(port, &["-C", "3", "-V", "-S", "65535"]);
    let (code, _, serr) = finish(srv, rx);
    assert_eq!(c.status.code(), Some(0), "{}", text(&c.stderr));
    assert_eq!(code, Some(0), "{serr}");
}

#[test]
fn refused_connection() {
    let port = free_port();
    let c = client(port, &["-C", "1"]);
    let err = text(&c.stderr);
    assert_eq!(c.status.code(), Some(3), "{err}");
    assert!(err.contains("connection refused"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn mpa_timeout() {
    // Accepts the TCP connection, never answers the MPA request.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = std::thread::spawn(move || l.accept().map(|(s, _)| s));
    let c = client(port, &["-C", "1", "--timeout", "1"]);
    let err = text(&c.stderr);
    assert_eq!(c.status.code(), Some(4), "{err}");
    assert!(err.contains("MPA timeout"), "{err}");
    drop(t.join());
}

#[test]
fn server_reports_early_disconnect() {
    // The server expects 100 pings; the client stops after 3.
    let port = free_port();
    let (srv, rx) = server(port, &["-C", "100"]);
    let c = client(port, &["-C", "3", "-V"]);
    assert_eq!(c.status.code(), Some(0), "{}", text(&c.stderr));
    let (code, _, serr) = finish(srv, rx);
    assert_eq!(code, Some(6), "{serr}");
    assert!(serr.contains("mid-run after 3 of 100 pings"), "{serr}");
    assert!(
        serr.contains("QP Error, 1 of 1 outstanding work requests completed with a flush status"),
        "{serr}"
    );
}

#[test]
fn bad_size_is_a_usage_error() {
    let c = client(1, &["-S", "22"]);
    assert_eq!(c.status.code(), Some(2));
    assert!(text(&c.stderr).contains("Invalid size 22"));
}
