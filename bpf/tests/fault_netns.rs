//! The fault injector on the middle namespace of `topology.sh up3`
//! (a — m — b, unique pid-based names, 198.18.0.0/15), with kernel TCP at
//! both ends: each fault shows up in the kernel's own TCP counters, so the
//! mechanisms (XDP drop and corrupt, tc clone and detour) are verified
//! independently of the iWARP stack.
//!
//! Needs root; without it every test prints a note and returns.

#[path = "../../engine/tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use iwarp_bpf::{AttachMode, FaultConfig, FaultCounters, FaultInjector, Interface};

use common::{is_root, spawn_in, Topo, IP_A, IP_B};

const PORT: u16 = 5001;
const LEN: usize = 8 << 20;

/// The namespace's TCP counters (`/proc/net/snmp` Tcp, `/proc/net/netstat`
/// TcpExt), read from a thread inside it.
fn tcp_counters(ns: &str) -> HashMap<String, u64> {
    spawn_in(ns, || {
        let mut m = HashMap::new();
        for file in ["snmp", "netstat"] {
            let text = std::fs::read_to_string(format!("/proc/thread-self/net/{file}")).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for pair in lines.chunks(2) {
                let [names, values] = pair else { continue };
                let mut n = names.split_whitespace();
                let prefix = n.next().unwrap_or("").trim_end_matches(':').to_owned();
                for (name, value) in n.zip(values.split_whitespace().skip(1)) {
                    if let Ok(v) = value.parse() {
                        m.insert(format!("{prefix}.{name}"), v);
                    }
                }
            }
        }
        m
    })
    .join()
    .unwrap()
}

fn data() -> Vec<u8> {
    (0..LEN).map(|i| (i * 7 + (i >> 11)) as u8).collect()
}

/// Injectors on both middle ends (XDP faults on frames leaving a/b, tc
/// faults on frames going to a/b), `cfg` on both; streams `LEN` bytes a →
/// b over kernel TCP and returns what b received, both injectors'
/// counters, and the TCP counters of a and b.
fn stream(cfg: FaultConfig) -> (Vec<u8>, [FaultCounters; 2], [HashMap<String, u64>; 2]) {
    let topo = Topo::up3(1500, Some(IP_A), Some(IP_B));
    let (ns_a, ns_b, ns_m) = (topo.ns('a'), topo.ns('b'), topo.ns('m'));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = spawn_in(&ns_b, move || {
        let l = TcpListener::bind((IP_B, PORT)).unwrap();
        ready_tx.send(()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        got
    });
    ready_rx.recv().unwrap();
    let (inj_tx, inj_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let middle = spawn_in(&ns_m, move || {
        let detour = |n: &str, f: &str| Some((Interface::from(n), Interface::from(f)));
        let a = FaultInjector::attach("ma", detour("da0", "da1"), AttachMode::Native, &cfg)
            .expect("attach on ma");
        let b = FaultInjector::attach("mb", detour("db0", "db1"), AttachMode::Native, &cfg)
            .expect("attach on mb");
        inj_tx.send(()).unwrap();
        done_rx.recv().unwrap();
        let counters = [a.counters().unwrap(), b.counters().unwrap()];
        a.detach().expect("detach ma");
        b.detach().expect("detach mb");
        counters
    });
    inj_rx.recv().unwrap();
    spawn_in(&ns_a, || {
        let mut s =
            TcpStream::connect_timeout(&SocketAddr::from((IP_B, PORT)), Duration::from_secs(20))
                .unwrap();
        s.write_all(&data()).unwrap();
    })
    .join()
    .unwrap();
    let got = server.join().unwrap();
    done_tx.send(()).unwrap();
    let counters = middle.join().unwrap();
    let m = topo.ns('m');
    let show = Command::new("ip")
        .args(["-n", &m, "link", "show", "dev", "ma"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&show.stdout).contains("xdp"),
        "XDP left after detach"
    );
    let tc = Command::new("tc")
        .args(["-n", &m, "qdisc", "show", "dev", "mb"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&tc.stdout).contains("clsact"),
        "clsact left after detach"
    );
    (got, counters, [tcp_counters(&ns_a), tcp_counters(&ns_b)])
}

fn get(m: &HashMap<String, u64>, k: &str) -> u64 {
    *m.get(k).unwrap_or_else(|| panic!("no counter {k}"))
}

/// Drops make the sender retransmit, duplicates make the receiver see old
/// data (D-SACK), detours make it queue out of order; data intact.
#[test]
fn drop_duplicate_reorder_seen_by_kernel_tcp() {
    if !is_root() {
        return;
    }
    let cfg = FaultConfig {
        drop_ppm: 10_000,
        duplicate_ppm: 10_000,
        delay_ppm: 20_000,
        delay_passes: 2,
        port: Some(PORT),
        ..FaultConfig::new(0x5eed)
    };
    let (got, [ma, mb], [a, b]) = stream(cfg);
    println!("ma: {ma:?}\nmb: {mb:?}");
    assert!(got == data(), "stream differs");
    // a → b: XDP on ma, tc egress on mb.
    assert!(ma.dropped > 0 && mb.duplicated > 0 && mb.delayed > 0);
    assert_eq!(mb.detour_passes, 2 * mb.delayed);
    assert_eq!(ma.errors + mb.errors, 0);
    let retrans = get(&a, "Tcp.RetransSegs");
    let dsack = get(&b, "TcpExt.TCPDSACKOldSent") + get(&b, "TcpExt.TCPDSACKOfoSent");
    let ofo = get(&b, "TcpExt.TCPOFOQueue");
    println!("a RetransSegs {retrans}, b D-SACKs sent {dsack}, b OFO-queued {ofo}");
    assert!(retrans > 0, "no retransmission");
    assert!(dsack > 0, "no duplicate seen");
    assert!(ofo > 0, "no reordering seen");
}

/// Corruption with the checksum fixed up: the receiving kernel TCP counts
/// no checksum error and delivers the flipped bytes.
#[test]
fn corruption_passes_tcp_checksum() {
    if !is_root() {
        return;
    }
    let cfg = FaultConfig {
        corrupt_ppm: 2_000,
        port: Some(PORT),
        ..FaultConfig::new(0xc0de)
    };
    let (got, [ma, _], [a, b]) = stream(cfg);
    println!("ma: {ma:?}");
    assert!(ma.corrupted > 0);
    assert_eq!(got.len(), LEN);
    let want = data();
    let differing = got.iter().zip(&want).filter(|(x, y)| x != y).count() as u64;
    let retrans = get(&a, "Tcp.RetransSegs");
    println!(
        "{differing} bytes differ, {} corruptions, a RetransSegs {retrans}",
        ma.corrupted
    );
    assert_eq!(get(&b, "Tcp.InCsumErrors"), 0, "the checksum fix-up failed");
    // Each corruption flips one byte, and TCP accepts the flipped segment
    // (its checksum was fixed up), so the flip is delivered, unless the
    // segment was a retransmission of bytes that had already arrived (a
    // tail loss probe, say): the receiver drops such a duplicate. So at
    // most one flip per segment side a sent again goes undelivered.
    assert!(differing > 0 && differing <= ma.corrupted);
    assert!(
        ma.corrupted - differing <= retrans,
        "{} flips not delivered, {retrans} segments sent again",
        ma.corrupted - differing
    );
}
