//! iwarp-perf server ↔ iwarp-perf client over 127.0.0.1 for all six tests:
//! both exit 0 and print a result row (the read_lat server, passive like
//! perftest's, prints none).

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
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
