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

/// A server process: its stderr lines arrive on `rx`, its stdout is
/// read to the end by `stdout` (a server with `-v` prints every ping,
/// and one blocked on a full pipe would stall its connections).
struct Server {
    child: Child,
    rx: mpsc::Receiver<String>,
    stdout: std::thread::JoinHandle<String>,
}

/// Start a server on 127.0.0.1 with `-d` and wait until it listens.
fn server(port: u16, extra: &[&str]) -> Server {
    server_at("127.0.0.1", port, extra)
}

/// [`server`] bound to `addr`.
fn server_at(addr: &str, port: u16, extra: &[&str]) -> Server {
    let mut child = Command::new(RPING)
        .args(["-s", "-a", addr, "-p", &port.to_string(), "-d"])
        .args(["--timeout", "20"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
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
    Server { child, rx, stdout }
}

fn client(port: u16, extra: &[&str]) -> Output {
    client_to("127.0.0.1", port, extra)
}

/// [`client`] connecting to `addr`.
fn client_to(addr: &str, port: u16, extra: &[&str]) -> Output {
    let timeout: &[&str] = if extra.contains(&"--timeout") {
        &[]
    } else {
        &["--timeout", "20"]
    };
    Command::new(RPING)
        .args(["-c", "-a", addr, "-p", &port.to_string()])
        .args(timeout)
        .args(extra)
        .output()
        .unwrap()
}

/// Wait for the server; returns (status code, stdout, stderr).
fn finish(srv: Server) -> (Option<i32>, String, String) {
    let Server {
        mut child,
        rx,
        stdout,
    } = srv;
    let status = child.wait().unwrap();
    // Every line up to the end of the pipe: the reader thread drops its
    // sender at EOF, which ends the iteration (the process has exited, so
    // EOF comes; the last lines may still be in flight when it exits).
    let stderr: Vec<String> = rx.iter().collect();
    (status.code(), stdout.join().unwrap(), stderr.join("\n"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ping_pong(crc: bool, (on, to): (&str, &str)) {
    let port = free_port();
    let flags: &[&str] = if crc { &["--crc"] } else { &[] };
    let srv = server_at(on, port, &[&["-v", "-C", "10"], flags].concat());
    let c = client_to(to, port, &[&["-C", "10", "-V", "-v", "-d"], flags].concat());
    let (code, sout, serr) = finish(srv);
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

const V4: (&str, &str) = ("127.0.0.1", "127.0.0.1");

#[test]
fn ten_pings_crc_off() {
    ping_pong(false, V4);
}

#[test]
fn ten_pings_crc_on() {
    ping_pong(true, V4);
}

#[test]
fn ten_pings_over_ipv6() {
    ping_pong(true, ("::1", "::1"));
}

/// A server on the IPv6 wildcard serves an IPv4 client.
#[test]
fn ten_pings_ipv6_wildcard_server_ipv4_client() {
    ping_pong(false, ("::", "127.0.0.1"));
}

#[test]
fn large_pings_validate() {
    let port = free_port();
    let srv = server(port, &[]);
    let c = client(port, &["-C", "3", "-V", "-S", "65535"]);
    let (code, _, serr) = finish(srv);
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
    let srv = server(port, &["-C", "100"]);
    let c = client(port, &["-C", "3", "-V"]);
    assert_eq!(c.status.code(), Some(0), "{}", text(&c.stderr));
    let (code, _, serr) = finish(srv);
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

/// A child killed when dropped: a client pinging for ever must not outlive
/// a failed test.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A client process started in the background.
fn spawn_client(port: u16, extra: &[&str]) -> Child {
    Command::new(RPING)
        .args(["-c", "-a", "127.0.0.1", "-p", &port.to_string()])
        .args(["--timeout", "20"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Asserts a client run succeeded with `pings` verified pings printed.
fn assert_pings(c: &Output, pings: usize, who: &str) {
    let out = text(&c.stdout);
    assert_eq!(
        c.status.code(),
        Some(0),
        "{who}: {out}\n{}",
        text(&c.stderr)
    );
    assert_eq!(out.lines().count(), pings, "{who}: {out}");
    assert!(
        out.lines().all(|l| l.starts_with("ping data: rdma-ping-")),
        "{who}: {out}"
    );
}

/// `-P`: one server process serves clients one after another, then
/// several at once (each with its own ping size), then one more; every
/// ping is verified and the server exits cleanly after `--max-conns`.
#[test]
fn persistent_server_sequential_then_concurrent() {
    const SEQUENTIAL: usize = 3;
    const CONCURRENT: usize = 4;
    let total = SEQUENTIAL + CONCURRENT + 1;
    let port = free_port();
    let srv = server(port, &["-P", "--max-conns", &total.to_string(), "-v"]);
    for i in 0..SEQUENTIAL {
        let c = client(port, &["-C", "5", "-V", "-v"]);
        assert_pings(&c, 5, &format!("sequential client {i}"));
    }
    let sizes = ["64", "1000", "4096", "65535"];
    let clients: Vec<Child> = sizes
        .iter()
        .take(CONCURRENT)
        .map(|s| spawn_client(port, &["-C", "20", "-V", "-v", "-S", s]))
        .collect();
    for (c, size) in clients.into_iter().zip(sizes) {
        let out = c.wait_with_output().unwrap();
        assert_pings(&out, 20, &format!("concurrent client -S {size}"));
    }
    // Still answering after the concurrent ones.
    let c = client(port, &["-C", "5", "-V", "-v"]);
    assert_pings(&c, 5, "last client");
    let (code, sout, serr) = finish(srv);
    assert_eq!(code, Some(0), "server: {serr}");
    let pings = SEQUENTIAL * 5 + CONCURRENT * 20 + 5;
    assert_eq!(sout.lines().count(), pings, "{sout}");
    assert!(sout
        .lines()
        .all(|l| l.starts_with("server ping data: rdma-ping-")));
    assert!(
        serr.contains(&format!(
            "persistent server done: {total} connections, 0 failed"
        )),
        "{serr}"
    );
    for n in 1..=total {
        assert!(
            serr.contains(&format!("rping[{n}]: server DISCONNECT EVENT...")),
            "connection {n}: {serr}"
        );
    }
}

/// `-P`: clients that stop early, break the protocol or die mid-run do not
/// end the server: each failure is reported with its connection number,
/// and well-behaved clients before, between, during and after them are
/// served. The exit status is the first failure's (6, the early stop).
#[test]
fn persistent_server_survives_failing_clients() {
    let port = free_port();
    let srv = server(port, &["-P", "--max-conns", "6", "-C", "10"]);
    // 1: well-behaved.
    let c = client(port, &["-C", "10", "-V", "-v"]);
    assert_pings(&c, 10, "client 1");
    // 2: disconnects after 3 of the 10 pings the server expects.
    let c = client(port, &["-C", "3", "-V", "-v"]);
    assert_pings(&c, 3, "client 2");
    // 3: a hostile peer: a Send with an MSN two ahead.
    let p = Command::new(env!("CARGO_BIN_EXE_iwarp-probe"))
        .args(["--connect", &format!("127.0.0.1:{port}")])
        .args(["--peer", "rping", "--scenario", "msn-gap"])
        .output()
        .unwrap();
    let pout = text(&p.stdout);
    assert_eq!(p.status.code(), Some(0), "probe: {pout}{}", text(&p.stderr));
    assert!(
        pout.contains("scenario msn-gap: terminate"),
        "probe: {pout}"
    );
    // 4: pings without end and is killed while 5 runs alongside it.
    let mut endless = KillOnDrop(spawn_client(port, &["-C", "0", "-V", "-v"]));
    let mut lines = BufReader::new(endless.0.stdout.take().unwrap()).lines();
    for _ in 0..3 {
        let line = lines.next().expect("client 4 pings").unwrap();
        assert!(line.starts_with("ping data: rdma-ping-"), "{line}");
    }
    let c = client(port, &["-C", "10", "-V", "-v"]);
    assert_pings(&c, 10, "client 5 (alongside 4)");
    endless.0.kill().unwrap();
    endless.0.wait().unwrap();
    // 6: still served afterwards.
    let c = client(port, &["-C", "10", "-V", "-v"]);
    assert_pings(&c, 10, "client 6");
    let (code, _, serr) = finish(srv);
    assert_eq!(code, Some(6), "server: {serr}");
    assert!(
        serr.contains("rping: connection 2 from 127.0.0.1:")
            && serr.contains("mid-run after 3 of 10 pings"),
        "{serr}"
    );
    assert!(
        serr.contains("rping: connection 3 from 127.0.0.1:")
            && serr.contains("we sent Terminate (DDP: untagged buffer, invalid MSN"),
        "{serr}"
    );
    // Client 4's end: a failure (more or fewer pings than 10) unless the
    // kill came exactly after the 10th.
    assert!(
        serr.contains("rping: persistent server done: 6 connections, 3 failed (2, 3, 4)")
            || serr.contains("rping: persistent server done: 6 connections, 2 failed (2, 3)"),
        "{serr}"
    );
    for n in [1, 5, 6] {
        assert!(
            serr.contains(&format!("rping[{n}]: server DISCONNECT EVENT... 10 pings")),
            "connection {n}: {serr}"
        );
    }
    assert!(serr.contains("the first: connection 2"), "{serr}");
}

#[test]
fn persistent_flags_need_a_server() {
    let c = client(1, &["-P"]);
    assert_eq!(c.status.code(), Some(2), "{}", text(&c.stderr));
    let out = Command::new(RPING)
        .args(["-s", "--max-conns", "2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}
