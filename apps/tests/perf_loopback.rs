//! iwarp-perf server ↔ iwarp-perf client over 127.0.0.1 for all six tests:
//! both exit 0 and print a result row (the read_lat server, passive like
//! perftest's, prints none); and `--persistent` servers serving one client
//! after another.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_iwarp-perf");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn run_pair(test: &str, extra: &[&str]) -> (Output, Output) {
    let port = free_port().to_string();
    let mut args = vec![test, "-p", &port];
    args.extend_from_slice(extra);
    let server = Command::new(BIN)
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn server");
    // The client retries refused connects while the server starts.
    std::thread::sleep(Duration::from_millis(100));
    let client = Command::new(BIN)
        .arg(test)
        .arg("127.0.0.1")
        .args(&args[1..])
        .output()
        .expect("run client");
    let server = server.wait_with_output().expect("server output");
    (server, client)
}

fn rows(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.parse::<u64>().is_ok())
        })
        .map(str::to_owned)
        .collect()
}

fn check(test: &str, extra: &[&str], server_row: bool) {
    let (s, c) = run_pair(test, extra);
    let show = |o: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(c.status.success(), "{test} client failed:\n{}", show(&c));
    assert!(s.status.success(), "{test} server failed:\n{}", show(&s));
    let cr = rows(&c);
    assert_eq!(cr.len(), 1, "{test} client rows:\n{}", show(&c));
    let size = extra
        .iter()
        .position(|a| *a == "-s")
        .map(|i| extra[i + 1])
        .unwrap_or("2");
    assert!(cr[0].trim_start().starts_with(size), "{}", cr[0]);
    if server_row {
        assert_eq!(rows(&s).len(), 1, "{test} server rows:\n{}", show(&s));
    }
}

#[test]
fn write_bw() {
    check("write_bw", &["-s", "4096", "-n", "50"], true);
}

#[test]
fn write_bw_two_qps_gbits() {
    check(
        "write_bw",
        &["-s", "1024", "-n", "20", "-q", "2", "--report_gbits"],
        true,
    );
}

#[test]
fn read_bw() {
    check("read_bw", &["-s", "4096", "-n", "50"], true);
}

#[test]
fn send_bw() {
    check("send_bw", &["-s", "4096", "-n", "50"], true);
}

#[test]
fn write_lat() {
    check("write_lat", &["-s", "2", "-n", "50"], true);
}

#[test]
fn read_lat() {
    check("read_lat", &["-s", "64", "-n", "50"], false);
}

#[test]
fn send_lat() {
    check("send_lat", &["-s", "64", "-n", "50"], true);
}

#[test]
fn json_rows() {
    let (s, c) = run_pair("send_lat", &["-n", "10", "--json"]);
    assert!(s.status.success() && c.status.success());
    let out = String::from_utf8_lossy(&c.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert!(lines[0].starts_with("{\"test\":\"send_lat\",\"side\":\"client\",\"bytes\":2,"));
    assert!(lines[0].ends_with('}'));
}

fn show(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A server process, killed if the test fails before it ends (a
/// persistent server short of its runs waits for ever).
struct ServerProc(Option<Child>);

impl ServerProc {
    fn wait_with_output(mut self) -> std::io::Result<Output> {
        self.0.take().expect("waited once").wait_with_output()
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A `--persistent N` server of `test` on a port of its own.
fn persistent_server(test: &str, runs: u32, extra: &[&str]) -> (ServerProc, String) {
    let port = free_port().to_string();
    let child = Command::new(BIN)
        .args([test, "-p", &port, "--persistent", &runs.to_string()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn server");
    (ServerProc(Some(child)), port)
}

fn perf_client(test: &str, port: &str, extra: &[&str]) -> Output {
    Command::new(BIN)
        .args([test, "127.0.0.1", "-p", port])
        .args(extra)
        .output()
        .expect("run client")
}

/// The server's per-run lines on stderr: `run N from ADDR: ...`.
fn run_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with("iwarp-perf: run "))
        .map(str::to_owned)
        .collect()
}

/// Two persistent servers (write_bw and send_lat: perftest's protocol
/// does not name the test, so a server runs one) serve alternating
/// clients, three each; every run prints its own result row on both
/// sides and leaves no connection open on the server's device.
#[test]
fn persistent_servers_serve_client_after_client() {
    const RUNS: u32 = 3;
    let bw_args = ["-s", "4096", "-n", "50"];
    let lat_args = ["-s", "64", "-n", "50"];
    let (bw, bw_port) = persistent_server("write_bw", RUNS, &bw_args);
    let (lat, lat_port) = persistent_server("send_lat", RUNS, &lat_args);
    for i in 0..RUNS {
        for (test, port, args, size) in [
            ("write_bw", &bw_port, &bw_args, "4096"),
            ("send_lat", &lat_port, &lat_args, "64"),
        ] {
            let c = perf_client(test, port, args);
            assert!(c.status.success(), "{test} client {i}:\n{}", show(&c));
            let r = rows(&c);
            assert_eq!(r.len(), 1, "{test} client {i}:\n{}", show(&c));
            assert!(r[0].trim_start().starts_with(size), "{}", r[0]);
        }
    }
    for (test, server) in [("write_bw", bw), ("send_lat", lat)] {
        let s = server.wait_with_output().expect("server output");
        assert!(s.status.success(), "{test} server:\n{}", show(&s));
        assert_eq!(
            rows(&s).len(),
            RUNS as usize,
            "{test} server:\n{}",
            show(&s)
        );
        let runs = run_lines(&s);
        assert_eq!(runs.len(), RUNS as usize, "{test} server:\n{}", show(&s));
        for (n, line) in runs.iter().enumerate() {
            assert!(
                line.starts_with(&format!("iwarp-perf: run {} from 127.0.0.1:", n + 1))
                    && line.ends_with(": done, 0 connections open"),
                "{test} server: {line}"
            );
        }
    }
}

/// A client killed in the middle of its measurement fails its run only:
/// the persistent server reports it, releases its connections and serves
/// the next client; it exits with failure after its runs because one
/// failed.
#[test]
fn persistent_server_survives_a_killed_client() {
    let args = ["-s", "65536", "-n", "20"];
    let (server, port) = persistent_server("write_bw", 3, &args);
    let c = perf_client("write_bw", &port, &args);
    assert!(c.status.success(), "client 1:\n{}", show(&c));
    // Enough iterations to outlast the test; killed once it measures.
    let mut doomed = Command::new(BIN)
        .args(["write_bw", "127.0.0.1", "-p", &port])
        .args(["-s", "65536", "-n", "100000000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn client 2");
    let out = BufReader::new(doomed.stdout.take().unwrap());
    let mut measuring = false;
    for line in out.lines() {
        if line.expect("client 2 output").contains("#bytes") {
            measuring = true;
            break;
        }
    }
    assert!(measuring, "client 2 never started measuring");
    doomed.kill().expect("kill client 2");
    doomed.wait().expect("reap client 2");
    let c = perf_client("write_bw", &port, &args);
    assert!(c.status.success(), "client 3:\n{}", show(&c));
    assert_eq!(rows(&c).len(), 1, "client 3:\n{}", show(&c));
    let s = server.wait_with_output().expect("server output");
    assert!(!s.status.success(), "server:\n{}", show(&s));
    let runs = run_lines(&s);
    assert_eq!(runs.len(), 3, "server:\n{}", show(&s));
    assert!(
        runs[0].ends_with(": done, 0 connections open"),
        "{}",
        runs[0]
    );
    assert!(
        runs[1].starts_with("iwarp-perf: run 2 from 127.0.0.1:")
            && runs[1].contains(": failed: ")
            && runs[1].ends_with("; 0 connections open"),
        "{}",
        runs[1]
    );
    assert!(
        runs[2].ends_with(": done, 0 connections open"),
        "{}",
        runs[2]
    );
    assert_eq!(rows(&s).len(), 2, "server:\n{}", show(&s));
    assert!(
        String::from_utf8_lossy(&s.stderr).contains("iwarp-perf: 1 of 3 runs failed"),
        "server:\n{}",
        show(&s)
    );
}

#[test]
fn persistent_is_for_the_server() {
    let c = perf_client("write_bw", "1", &["--persistent"]);
    assert!(!c.status.success());
    assert!(
        String::from_utf8_lossy(&c.stderr).contains("--persistent is for the server"),
        "{}",
        show(&c)
    );
}

/// Clients that connect while another's run is under way wait for it and
/// are served one after another, each with its own two data connections
/// (all from 127.0.0.1: told apart from the running client's data
/// connections because they were there before its first sync).
#[test]
fn persistent_server_queues_clients_that_come_at_once() {
    const WAITING: usize = 3;
    let args = ["-s", "4096", "-n", "50", "-q", "2"];
    let (server, port) = persistent_server("write_bw", WAITING as u32 + 1, &args);
    let mut first = Command::new(BIN)
        .args(["write_bw", "127.0.0.1", "-p", &port])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn client 1");
    // Client 1 prints its addresses once its data connections are up.
    let mut out = BufReader::new(first.stdout.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).expect("client 1 output") == 0 {
            panic!("client 1 ended before its data connections:\n{seen}");
        }
        seen.push_str(&line);
        if line.contains("local address") {
            break;
        }
    }
    let waiting: Vec<Child> = (0..WAITING)
        .map(|_| {
            Command::new(BIN)
                .args(["write_bw", "127.0.0.1", "-p", &port])
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn a waiting client")
        })
        .collect();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("client 1 output");
    let status = first.wait().expect("client 1");
    assert!(status.success(), "client 1:\n{seen}{rest}");
    assert_eq!(
        rest.lines()
            .filter(|l| l.trim_start().starts_with("4096 "))
            .count(),
        1,
        "client 1:\n{seen}{rest}"
    );
    for (i, c) in waiting.into_iter().enumerate() {
        let c = c.wait_with_output().expect("waiting client");
        assert!(c.status.success(), "client {}:\n{}", i + 2, show(&c));
        assert_eq!(rows(&c).len(), 1, "client {}:\n{}", i + 2, show(&c));
    }
    let s = server.wait_with_output().expect("server output");
    assert!(s.status.success(), "server:\n{}", show(&s));
    assert_eq!(rows(&s).len(), WAITING + 1, "server:\n{}", show(&s));
    let runs = run_lines(&s);
    assert_eq!(runs.len(), WAITING + 1, "server:\n{}", show(&s));
    assert!(
        runs.iter()
            .all(|l| l.ends_with(": done, 0 connections open")),
        "server:\n{}",
        show(&s)
    );
}
