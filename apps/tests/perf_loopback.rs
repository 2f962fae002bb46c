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
    run_pair_to("127.0.0.1", test, extra)
}

/// [`run_pair`] with the client connecting to `host` (the server
/// listens on every address of both families).
fn run_pair_to(host: &str, test: &str, extra: &[&str]) -> (Output, Output) {
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
        .arg(host)
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
    check_to("127.0.0.1", test, extra, server_row);
}

/// [`check`] with the client connecting to `host`.
fn check_to(host: &str, test: &str, extra: &[&str], server_row: bool) {
    let (s, c) = run_pair_to(host, test, extra);
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
fn write_bw_and_send_lat_over_ipv6() {
    check_to("::1", "write_bw", &["-s", "4096", "-n", "50"], true);
    check_to("::1", "send_lat", &["-n", "50"], true);
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

/// The value of `key` in a JSON row (numbers and `true`/`false` as
/// text, strings without their quotes).
fn field<'a>(row: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("\"{key}\":");
    let rest = &row[row.find(&pat)? + pat.len()..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim_matches('"'))
}

fn num(row: &str, key: &str) -> f64 {
    field(row, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {key} in {row}"))
}

/// The JSON rows of a run whose both sides exit 0.
fn json_pair(test: &str, extra: &[&str]) -> (Vec<String>, Vec<String>) {
    let mut args = extra.to_vec();
    args.push("--json");
    let (s, c) = run_pair(test, &args);
    assert!(c.status.success(), "{test} client failed:\n{}", show(&c));
    assert!(s.status.success(), "{test} server failed:\n{}", show(&s));
    let lines = |o: &Output| -> Vec<String> {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    };
    (lines(&s), lines(&c))
}

/// `-b`: both sides send `n` messages per QP at once; each prints one row
/// with the sum of both directions, and its JSON row carries each side's
/// own count and average. Each side's own numbers are the other's remote
/// ones (the report went both ways), and both directions moved every
/// message.
fn check_bidirectional(test: &str, extra: &[&str], per_side: u64) {
    let (s, c) = json_pair(test, extra);
    assert_eq!(s.len(), 1, "{test} server: {s:?}");
    assert_eq!(c.len(), 1, "{test} client: {c:?}");
    let (s, c) = (&s[0], &c[0]);
    for (row, side) in [(s, "server"), (c, "client")] {
        assert_eq!(field(row, "side"), Some(side), "{row}");
        assert_eq!(field(row, "bidirectional"), Some("true"), "{row}");
        assert_eq!(num(row, "local_iterations") as u64, per_side, "{row}");
        assert_eq!(num(row, "remote_iterations") as u64, per_side, "{row}");
        assert_eq!(num(row, "iterations") as u64, per_side, "{row}");
        assert!(num(row, "local_bw_average") > 0.0, "{row}");
        assert!(num(row, "remote_bw_average") > 0.0, "{row}");
        let sum = num(row, "local_bw_average") + num(row, "remote_bw_average");
        assert!((num(row, "bw_average") - sum).abs() < 1e-3, "{row}");
    }
    assert_eq!(field(s, "local_bw_average"), field(c, "remote_bw_average"));
    assert_eq!(field(c, "local_bw_average"), field(s, "remote_bw_average"));
}

#[test]
fn bidirectional_write_bw() {
    check_bidirectional("write_bw", &["-b", "-s", "4096", "-n", "50"], 50);
}

#[test]
fn bidirectional_write_bw_two_qps_all_sizes() {
    // -a: one row per size on each side, every one bidirectional.
    let (s, c) = json_pair("write_bw", &["-b", "-a", "-n", "8", "-q", "2"]);
    assert_eq!(s.len(), 23, "{s:?}");
    assert_eq!(c.len(), 23, "{c:?}");
    for (i, (sr, cr)) in s.iter().zip(&c).enumerate() {
        for row in [sr, cr] {
            assert_eq!(num(row, "bytes") as u64, 2 << i, "{row}");
            assert_eq!(num(row, "local_iterations") as u64, 16, "{row}");
            assert_eq!(num(row, "remote_iterations") as u64, 16, "{row}");
        }
    }
}

#[test]
fn bidirectional_read_bw() {
    check_bidirectional("read_bw", &["-b", "-s", "4096", "-n", "50"], 50);
}

#[test]
fn bidirectional_send_bw() {
    // More messages than the receive depth: both directions run on
    // credits.
    check_bidirectional("send_bw", &["-b", "-s", "1024", "-n", "1200"], 1200);
}

/// `-D`: a run of a duration; the row counts what completed in the
/// sample, so it is not empty.
#[test]
fn duration_write_bw() {
    let (s, c) = json_pair("write_bw", &["-D", "3", "-f", "1", "-s", "4096"]);
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(c.len(), 1, "{c:?}");
    let iters = num(&c[0], "iterations");
    assert!(iters > 0.0, "{}", c[0]);
    assert!(num(&c[0], "bw_average") > 0.0, "{}", c[0]);
    assert_eq!(num(&c[0], "bw_peak"), 0.0, "{}", c[0]);
    assert_eq!(
        (num(&c[0], "duration_s"), num(&c[0], "margin_s")),
        (3.0, 1.0)
    );
    // The server prints the client's report.
    assert_eq!(num(&s[0], "iterations"), iters, "{}", s[0]);
}

#[test]
fn duration_bidirectional_send_bw() {
    // send_bw -b -D: each side counts both directions, no report.
    let (s, c) = json_pair("send_bw", &["-b", "-D", "2", "-s", "4096"]);
    for rows in [&s, &c] {
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert!(num(&rows[0], "iterations") > 0.0, "{}", rows[0]);
        assert_eq!(field(&rows[0], "bidirectional"), Some("true"));
        assert_eq!(field(&rows[0], "local_iterations"), None);
    }
}

#[test]
fn duration_send_lat() {
    let (s, c) = json_pair("send_lat", &["-D", "2", "-s", "64"]);
    for rows in [&s, &c] {
        assert_eq!(rows.len(), 1, "{rows:?}");
        let row = &rows[0];
        assert!(num(row, "iterations") > 0.0, "{row}");
        assert!(
            num(row, "t_avg_usec") > 0.0 && num(row, "tps_average") > 0.0,
            "{row}"
        );
        assert_eq!(num(row, "duration_s"), 2.0, "{row}");
    }
    // The table: perftest's duration header and row.
    let (s, c) = run_pair("write_lat", &["-D", "2"]);
    assert!(s.status.success() && c.status.success(), "{}", show(&c));
    let out = String::from_utf8_lossy(&c.stdout);
    assert!(
        out.contains(" #bytes        #iterations       t_avg[usec]    tps average\n"),
        "{out}"
    );
    let r = rows(&c);
    assert_eq!(r.len(), 1, "{out}");
    let n: u64 = r[0].split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(n > 0, "{out}");
}

#[test]
fn duration_read_lat() {
    let (s, c) = json_pair("read_lat", &["-D", "2"]);
    assert!(s.is_empty(), "{s:?}");
    assert_eq!(c.len(), 1, "{c:?}");
    assert!(num(&c[0], "iterations") > 0.0, "{}", c[0]);
}

#[test]
fn bidirectional_and_duration_refusals() {
    for (test, args, why) in [
        (
            "write_lat",
            &["-b"][..],
            "-b (bidirectional) is for bandwidth tests only",
        ),
        (
            "write_bw",
            &["-D", "2", "-a"][..],
            "-D (duration) does not run with -a",
        ),
        (
            "send_bw",
            &["-D", "2", "-f", "1"][..],
            "the duration (-D) must exceed twice the margin (-f)",
        ),
    ] {
        let c = perf_client(test, "1", args);
        assert!(!c.status.success(), "{test} {args:?}");
        assert!(
            String::from_utf8_lossy(&c.stderr).contains(why),
            "{test} {args:?}: {}",
            show(&c)
        );
    }
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
