//! `iwarp-cm` server against `iwarp-cm` client over 127.0.0.1 (the built
//! binary, kernel TCP backend): private data both ways, in a reject, at
//! the MPA limit, and the local refusal beyond it.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const CM: &str = env!("CARGO_BIN_EXE_iwarp-cm");

/// A port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `n` bytes of a pattern, as hex.
fn pat(n: usize, seed: usize) -> String {
    (0..n)
        .map(|i| format!("{:02x}", (i * seed + n) & 0xff))
        .collect()
}

/// The `<len> <hex>` part a tool prints for `n` bytes `hex`.
fn shown(n: usize, hex: &str) -> String {
    if n == 0 {
        "0 -".to_string()
    } else {
        format!("{n} {hex}")
    }
}

/// Start a server on 127.0.0.1 and wait until it listens.
fn server(port: u16, extra: &[&str]) -> Child {
    server_at(&["-a", "127.0.0.1"], port, extra)
}

/// [`server`] with `addr` (`-a ADDR`, or nothing: every address).
fn server_at(addr: &[&str], port: u16, extra: &[&str]) -> Child {
    let mut child = Command::new(CM)
        .arg("server")
        .args(addr)
        .args(["-p", &port.to_string()])
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
    child
}

fn client(port: u16, extra: &[&str]) -> Output {
    client_to("127.0.0.1", port, extra)
}

/// [`client`] connecting to `addr`.
fn client_to(addr: &str, port: u16, extra: &[&str]) -> Output {
    Command::new(CM)
        .args(["client", "-a", addr, "-p", &port.to_string()])
        .args(["--timeout", "20"])
        .args(extra)
        .output()
        .unwrap()
}

/// The `<len> <hex>` of the first `tag` line.
fn field(out: &[u8], tag: &str) -> Option<String> {
    String::from_utf8_lossy(out)
        .lines()
        .find_map(|l| l.strip_prefix(tag)?.strip_prefix(' ').map(str::to_string))
}

fn accept_case(ours: usize, theirs: usize, extra: &[&str]) {
    accept_case_at((&["-a", "127.0.0.1"], "127.0.0.1"), ours, theirs, extra);
}

/// [`accept_case`] with the server's `-a` and the client's address.
fn accept_case_at((on, to): (&[&str], &str), ours: usize, theirs: usize, extra: &[&str]) {
    let (c_pd, s_pd) = (pat(ours, 7), pat(theirs, 13));
    let port = free_port();
    let mut args = vec!["--pdata", s_pd.as_str()];
    args.extend_from_slice(extra);
    let srv = server_at(on, port, &args);
    let mut args = vec!["--pdata", c_pd.as_str()];
    args.extend_from_slice(extra);
    let cli = client_to(to, port, &args);
    let srv = srv.wait_with_output().unwrap();
    assert_eq!(cli.status.code(), Some(0), "{cli:?}");
    assert_eq!(srv.status.code(), Some(0), "{srv:?}");
    assert_eq!(field(&srv.stdout, "PDATA-RECV"), Some(shown(ours, &c_pd)));
    assert_eq!(field(&cli.stdout, "PDATA-RECV"), Some(shown(theirs, &s_pd)));
    let out = String::from_utf8_lossy(&srv.stdout);
    assert!(out.contains("ESTABLISHED\nDISCONNECTED\n"), "{out}");
}

#[test]
fn accept_without_private_data() {
    accept_case(0, 0, &[]);
}

#[test]
fn accept_with_private_data_both_ways_crc() {
    accept_case(1, 256, &["--crc"]);
}

#[test]
fn accept_with_private_data_over_ipv6() {
    accept_case_at((&["-a", "::1"], "::1"), 40, 60, &["--crc"]);
}

/// With no `-a` the server listens on every address of both families.
#[test]
fn server_on_every_address_takes_ipv4_and_ipv6_clients() {
    accept_case_at((&[], "127.0.0.1"), 5, 6, &[]);
    accept_case_at((&[], "::1"), 5, 6, &[]);
}

#[test]
fn accept_at_the_mpa_limit() {
    accept_case(508, 508, &[]);
}

#[test]
fn reject_with_private_data() {
    let (c_pd, s_pd) = (pat(3, 7), pat(100, 13));
    let port = free_port();
    let srv = server(port, &["--reject", "--pdata", &s_pd]);
    let cli = client(port, &["--pdata", &c_pd]);
    let srv = srv.wait_with_output().unwrap();
    assert_eq!(srv.status.code(), Some(0), "{srv:?}");
    assert_eq!(cli.status.code(), Some(4), "{cli:?}");
    assert_eq!(field(&srv.stdout, "PDATA-RECV"), Some(shown(3, &c_pd)));
    assert_eq!(field(&cli.stdout, "REJECTED"), Some(shown(100, &s_pd)));
}

#[test]
fn over_the_mpa_limit_is_refused_locally() {
    // Nothing listens: had the client connected, it would exit 3.
    let port = free_port();
    let cli = client(port, &["--pdata", &pat(509, 1)]);
    assert_eq!(cli.status.code(), Some(7), "{cli:?}");
    let err = String::from_utf8_lossy(&cli.stderr);
    assert!(
        err.contains("509 bytes of private data: MPA allows at most 508"),
        "{err}"
    );
    let srv = Command::new(CM)
        .args(["server", "-p", "0", "--pdata", &pat(509, 1)])
        .output()
        .unwrap();
    assert_eq!(srv.status.code(), Some(7), "{srv:?}");
}

#[test]
fn refused_and_bad_hex() {
    let cli = client(free_port(), &[]);
    assert_eq!(cli.status.code(), Some(3), "{cli:?}");
    let cli = client(free_port(), &["--pdata", "abc"]);
    assert_eq!(cli.status.code(), Some(2), "{cli:?}");
}
