//! Attaches the steering program to a veth end inside a pair of network
//! namespaces the test creates (unique, pid-based names, 198.18.0.0/15
//! addresses) and checks what the counters and an AF_XDP socket see.
//!
//! Needs root; without it every test prints a note and returns.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket};
use std::num::NonZeroU32;
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use iwarp_bpf::{ActiveMode, AttachMode, Counters, Error, SteerConfig, Steering};
use nix::sched::{setns, CloneFlags};

const IP_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// A port of the engine.
const STEERED: u16 = 7174;
/// A port that is not.
const OTHER: u16 = 9;

fn is_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    println!("note: not root, skipping (namespaces, veth and XDP need CAP_NET_ADMIN/CAP_BPF)");
    false
}

fn run(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two namespaces `a` and `b` joined by veth `va` (198.18.0.1/24, in `a`)
/// and `vb` (198.18.0.2/24, in `b`). Dropping deletes both namespaces, so a
/// failing test tears its topology down too.
struct Topo {
    a: String,
    b: String,
    va: String,
    vb: String,
}

impl Topo {
    fn new() -> Self {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let id = format!(
            "{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let t = Self {
            a: format!("iwbpf-{id}-a"),
            b: format!("iwbpf-{id}-b"),
            va: "va".into(),
            vb: "vb".into(),
        };
        // Guard first: the namespaces go even if a later step fails.
        run(&["ip", "netns", "add", &t.a]);
        run(&["ip", "netns", "add", &t.b]);
        for ns in [&t.a, &t.b] {
            // No IPv6 chatter (router solicitations) in the counters;
            // /proc/sys/net is the one of the writing thread's namespace.
            in_ns(ns, || {
                for key in ["all", "default"] {
                    let k = format!("/proc/sys/net/ipv6/conf/{key}/disable_ipv6");
                    std::fs::write(&k, "1").unwrap_or_else(|e| panic!("{k}: {e}"));
                }
            });
            run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        run(&[
            "ip", "-n", &t.a, "link", "add", &t.va, "type", "veth", "peer", "name", &t.vb, "netns",
            &t.b,
        ]);
        for (ns, dev, ip) in [(&t.a, &t.va, IP_A), (&t.b, &t.vb, IP_B)] {
            run(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                dev,
            ]);
            run(&["ip", "-n", ns, "link", "set", dev, "up"]);
        }
        t
    }

    /// `ip link show` of `va` (shows `xdp`/`xdpgeneric` and the program id).
    fn link_a(&self) -> String {
        run(&["ip", "-n", &self.a, "link", "show", "dev", &self.va])
    }

    /// Forgets what `b` learnt of `a`'s MAC address.
    fn flush_neigh_b(&self) {
        run(&["ip", "-n", &self.b, "neigh", "flush", "dev", &self.vb]);
    }

    /// One UDP datagram from `b` to `a` (not TCP: never the engine's).
    fn udp_from_b(&self) {
        in_ns(&self.b, || {
            let sock = UdpSocket::bind((IP_B, 0)).expect("UDP socket");
            sock.send_to(b"not tcp", (IP_A, OTHER)).expect("UDP send");
        })
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Runs `f` on a thread that has entered namespace `ns`.
fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    let file = File::open(format!("/run/netns/{ns}")).expect("namespace file");
    std::thread::scope(|s| {
        s.spawn(|| {
            setns(file.as_fd(), CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("namespace thread")
    })
}

/// A TCP connect from `b` to `a`; true if it got any answer (accepted or
/// refused), false on timeout.
fn connect_from_b(t: &Topo, port: u16, timeout: Duration) -> bool {
    in_ns(&t.b, || {
        let to = SocketAddr::V4(SocketAddrV4::new(IP_A, port));
        match TcpStream::connect_timeout(&to, timeout) {
            Ok(_) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionRefused,
        }
    })
}

fn engine_config() -> SteerConfig {
    SteerConfig::new()
        .addr(IP_A)
        .port(STEERED)
        .ports(40000..=40010)
}

/// The peer end carries a program too (native XDP on veth wants both ends
/// to): ours, steering nothing.
fn attach_peer(t: &Topo) -> Steering {
    in_ns(&t.b, || {
        Steering::attach(t.vb.as_str(), AttachMode::Native, &SteerConfig::new())
            .expect("attach on the peer end")
    })
}

fn delta(s: &Steering, before: &Counters) -> Counters {
    s.counters().expect("counters").since(before)
}

#[test]
fn native_mode_counts_steered_and_passed_traffic() {
    if !is_root() {
        return;
    }
    let t = Topo::new();
    let _peer = attach_peer(&t);
    in_ns(&t.a, || {
        let s = Steering::attach(t.va.as_str(), AttachMode::Native, &engine_config())
            .expect("attach native");
        assert_eq!(s.mode(), ActiveMode::Native);
        let link = t.link_a();
        assert!(
            link.contains(&format!("prog/xdp id {}", s.prog_id())),
            "{link}"
        );

        // ARP, UDP and TCP to another port: not the engine's. The UDP
        // datagram waits for ARP in front of the SYN, so the refused
        // connect means all three went through.
        let c0 = s.counters().unwrap();
        t.udp_from_b();
        assert!(connect_from_b(&t, OTHER, Duration::from_secs(2)));
        let d = delta(&s, &c0);
        assert!(d.passed >= 3, "ARP, UDP, SYN passed: {d:?}");
        assert_eq!((d.redirected, d.no_xsk, d.dropped), (0, 0, 0), "{d:?}");

        // TCP to a steered port, no socket in the slot: bpf_redirect_map's
        // fallback (XDP_PASS) hands it to the kernel, which refuses it.
        let c0 = s.counters().unwrap();
        assert!(connect_from_b(&t, STEERED, Duration::from_secs(2)));
        let d = delta(&s, &c0);
        assert!(d.no_xsk >= 1, "SYN matched, no socket: {d:?}");
        assert_eq!((d.redirected, d.dropped), (0, 0), "{d:?}");

        // An explicit port range.
        let c0 = s.counters().unwrap();
        assert!(connect_from_b(&t, 40005, Duration::from_secs(2)));
        assert!(delta(&s, &c0).no_xsk >= 1);

        // TCP to another port: passed.
        let c0 = s.counters().unwrap();
        assert!(connect_from_b(&t, OTHER, Duration::from_secs(2)));
        let d = delta(&s, &c0);
        assert!(d.passed >= 1, "{d:?}");
        assert_eq!((d.no_xsk, d.redirected), (0, 0), "{d:?}");

        // All-TCP mode takes that port too.
        s.update_config(&SteerConfig::new().addr(IP_A).all_tcp(true))
            .unwrap();
        let c0 = s.counters().unwrap();
        assert!(connect_from_b(&t, OTHER, Duration::from_secs(2)));
        assert!(delta(&s, &c0).no_xsk >= 1);

        // Drop mode: the kernel never sees the SYN, the connect times out.
        s.update_config(&engine_config().drop_without_xsk(true))
            .unwrap();
        let c0 = s.counters().unwrap();
        assert!(!connect_from_b(&t, STEERED, Duration::from_millis(300)));
        let d = delta(&s, &c0);
        assert!(d.dropped >= 1, "{d:?}");
        assert_eq!(d.no_xsk, 0, "{d:?}");

        // ARP option: the request for our address is the engine's; with no
        // socket it still reaches the kernel, which answers.
        s.update_config(&engine_config().arp(true)).unwrap();
        t.flush_neigh_b();
        let c0 = s.counters().unwrap();
        assert!(connect_from_b(&t, OTHER, Duration::from_secs(2)));
        let d = delta(&s, &c0);
        assert!(d.no_xsk >= 1, "ARP request matched: {d:?}");
        assert!(d.passed >= 1, "SYN to another port passed: {d:?}");
    });
}

#[test]
fn generic_and_auto_modes() {
    if !is_root() {
        return;
    }
    let t = Topo::new();
    in_ns(&t.a, || {
        let s = Steering::attach(t.va.as_str(), AttachMode::Generic, &engine_config())
            .expect("attach generic");
        assert_eq!(s.mode(), ActiveMode::Generic);
        assert!(t.link_a().contains("xdpgeneric"), "{}", t.link_a());
        let c0 = s.counters().unwrap();
        assert!(connect_from_b(&t, STEERED, Duration::from_secs(2)));
        assert!(connect_from_b(&t, OTHER, Duration::from_secs(2)));
        let d = delta(&s, &c0);
        assert!(d.no_xsk >= 1 && d.passed >= 1, "{d:?}");
        drop(s);
        assert!(!t.link_a().contains("xdp"), "{}", t.link_a());

        // veth has native XDP: Auto takes it.
        let s = Steering::attach(t.va.as_str(), AttachMode::Auto, &engine_config())
            .expect("attach auto");
        assert_eq!(s.mode(), ActiveMode::Native);
    });
}

#[test]
fn detach_leaves_no_program() {
    if !is_root() {
        return;
    }
    let t = Topo::new();
    in_ns(&t.a, || {
        let s = Steering::attach(t.va.as_str(), AttachMode::Native, &engine_config()).unwrap();
        let id = s.prog_id();
        assert!(
            t.link_a().contains(&format!("prog/xdp id {id}")),
            "{}",
            t.link_a()
        );
        s.detach().expect("detach");
        assert!(!t.link_a().contains("xdp"), "{}", t.link_a());

        let s = Steering::attach(t.va.as_str(), AttachMode::Generic, &engine_config()).unwrap();
        drop(s);
        assert!(!t.link_a().contains("xdp"), "{}", t.link_a());
    });
    // Dropped on another thread than the one that attached: still detached
    // in the right namespace.
    let s = in_ns(&t.a, || {
        Steering::attach(t.va.as_str(), AttachMode::Native, &engine_config()).unwrap()
    });
    assert!(t.link_a().contains("xdp"));
    drop(s);
    assert!(!t.link_a().contains("xdp"), "{}", t.link_a());
}

#[test]
fn stale_program_after_a_crash_is_replaced() {
    if !is_root() {
        return;
    }
    let t = Topo::new();
    in_ns(&t.a, || {
        // A "crash": the handle is forgotten, the program stays attached.
        let old = Steering::attach(t.va.as_str(), AttachMode::Native, &engine_config()).unwrap();
        let old_id = old.prog_id();
        std::mem::forget(old);
        assert!(t.link_a().contains(&format!("id {old_id}")));

        let s = Steering::attach(t.va.as_str(), AttachMode::Native, &engine_config())
            .expect("attach over a stale program");
        assert_ne!(s.prog_id(), old_id);
        assert!(
            t.link_a().contains(&format!("id {}", s.prog_id())),
            "{}",
            t.link_a()
        );
        // Still steering.
        let c0 = s.counters().unwrap();
        assert!(connect_from_b(&t, STEERED, Duration::from_secs(2)));
        assert!(delta(&s, &c0).no_xsk >= 1);

        // A stale native program and a new generic one: native and generic
        // cannot coexist, the stale one goes.
        let native_id = s.prog_id();
        std::mem::forget(s);
        let s = Steering::attach(t.va.as_str(), AttachMode::Generic, &engine_config())
            .expect("generic attach over a stale native program");
        let link = t.link_a();
        assert!(
            link.contains("xdpgeneric") && !link.contains(&format!("id {native_id}")),
            "{link}"
        );
        drop(s);
        assert!(!t.link_a().contains("xdp"), "{}", t.link_a());
    });
}

#[test]
fn unknown_interface_is_an_error() {
    if !is_root() {
        return;
    }
    let t = Topo::new();
    in_ns(&t.a, || {
        // `vb` lives in the other namespace.
        let r = Steering::attach(t.vb.as_str(), AttachMode::Auto, &engine_config());
        assert!(matches!(r, Err(Error::Interface(..))), "{r:?}");
    });
}

mod xsk {
    //! A real AF_XDP socket in the XSKMAP: the steered frames arrive on it.

    use super::*;
    use std::ffi::CString;
    use xsk_rs::config::{Interface, LibxdpFlags, QueueSize, SocketConfig, UmemConfig};
    use xsk_rs::socket::{RxQueue, Socket};
    use xsk_rs::umem::frame::FrameDesc;
    use xsk_rs::umem::{FillQueue, Umem};

    const FRAMES: u32 = 64;

    pub(super) struct Xsk {
        umem: Umem,
        // Kept alive: the socket goes with the last of its queues.
        _fq: FillQueue,
        rx: RxQueue,
    }

    impl Xsk {
        /// An AF_XDP socket on `dev` queue 0, without libxdp's own program
        /// (`INHIBIT_PROG_LOAD`), its fill ring stocked with every frame.
        pub(super) fn bind(dev: &str) -> Self {
            let (umem, descs) = Umem::new(
                UmemConfig::default(),
                NonZeroU32::new(FRAMES).unwrap(),
                false,
            )
            .expect("UMEM");
            let config = SocketConfig::builder()
                .rx_queue_size(QueueSize::new(FRAMES).unwrap())
                .tx_queue_size(QueueSize::new(FRAMES).unwrap())
                .libxdp_flags(LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD)
                .build();
            let name = Interface::new(CString::new(dev).expect("interface name"));
            // SAFETY: the UMEM is not shared with any other socket.
            let (_tx, rx, fq_cq) =
                unsafe { Socket::new(config, &umem, &name, 0) }.expect("AF_XDP socket");
            let (mut fq, _cq) = fq_cq.expect("fill and completion rings");
            // SAFETY: the descriptors come from this UMEM and are in no
            // other ring.
            let n = unsafe { fq.produce(&descs) };
            assert_eq!(n, descs.len());
            Self { umem, _fq: fq, rx }
        }

        pub(super) fn fd(&self) -> &impl std::os::fd::AsRawFd {
            self.rx.fd()
        }

        /// Frames received within `timeout_ms`, copied out.
        pub(super) fn recv(&mut self, timeout_ms: i32) -> Vec<Vec<u8>> {
            let mut descs = vec![FrameDesc::default(); FRAMES as usize];
            // SAFETY: the descriptors are filled in by this socket's rx ring,
            // which only hands out frames of this UMEM.
            let n = unsafe { self.rx.poll_and_consume(&mut descs, timeout_ms) }.expect("poll");
            descs[..n]
                .iter()
                // SAFETY: each descriptor is a frame of this UMEM that the
                // kernel has handed back and nothing writes to now.
                .map(|d| unsafe { self.umem.data(d) }.contents().to_vec())
                .collect()
        }
    }
}

/// Ethertype of an Ethernet frame.
fn ethertype(frame: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(frame.get(12..14)?.try_into().ok()?))
}

/// (destination port, flags) of an IPv4/TCP frame.
fn tcp_dst_and_flags(frame: &[u8]) -> Option<(u16, u8)> {
    let ihl = usize::from(frame.get(14)? & 0x0f) * 4;
    let tcp = frame.get(14 + ihl..)?;
    Some((
        u16::from_be_bytes(tcp.get(2..4)?.try_into().ok()?),
        *tcp.get(13)?,
    ))
}

#[test]
fn af_xdp_socket_receives_the_steered_frames() {
    if !is_root() {
        return;
    }
    let t = Topo::new();
    let _peer = attach_peer(&t);
    in_ns(&t.a, || {
        let s = Steering::attach(t.va.as_str(), AttachMode::Native, &engine_config())
            .expect("attach native");
        let mut xsk = xsk::Xsk::bind(&t.va);
        s.set_xsk(0, xsk.fd()).expect("socket into the XSKMAP");

        // Let b learn a's MAC first (ARP goes to the kernel by default).
        assert!(connect_from_b(&t, OTHER, Duration::from_secs(2)));
        let c0 = s.counters().unwrap();
        // The SYN goes to the socket: the kernel never answers.
        assert!(!connect_from_b(&t, STEERED, Duration::from_millis(300)));
        let frames = xsk.recv(1000);
        let d = delta(&s, &c0);
        assert!(d.redirected >= 1, "{d:?}");
        assert_eq!((d.no_xsk, d.dropped), (0, 0), "{d:?}");
        let syn = frames
            .iter()
            .find(|f| ethertype(f) == Some(0x0800))
            .expect("an IPv4 frame on the socket");
        let (port, flags) = tcp_dst_and_flags(syn).expect("a TCP header");
        assert_eq!(port, STEERED);
        assert_eq!(flags & 0x12, 0x02, "a SYN");

        // Not the engine's: the kernel answers, the socket sees nothing.
        let c0 = s.counters().unwrap();
        t.udp_from_b();
        assert!(connect_from_b(&t, OTHER, Duration::from_secs(2)));
        assert_eq!(delta(&s, &c0).redirected, 0);
        assert!(xsk.recv(0).is_empty());

        // ARP option: b's request for a's address lands on the socket.
        s.update_config(&engine_config().arp(true)).unwrap();
        t.flush_neigh_b();
        assert!(
            !connect_from_b(&t, OTHER, Duration::from_secs(1)),
            "the kernel never sees the ARP request"
        );
        let frames = xsk.recv(1000);
        let arp = frames
            .iter()
            .find(|f| ethertype(f) == Some(0x0806))
            .expect("an ARP frame on the socket");
        // Target protocol address: a's.
        assert_eq!(arp.get(38..42), Some(&IP_A.octets()[..]));

        // Emptied slot: back to the kernel.
        s.update_config(&engine_config()).unwrap();
        s.remove_xsk(0).unwrap();
        s.remove_xsk(0).expect("removing twice is fine");
        let c0 = s.counters().unwrap();
        assert!(connect_from_b(&t, STEERED, Duration::from_secs(2)));
        let d = delta(&s, &c0);
        assert!(d.no_xsk >= 1 && d.redirected == 0, "{d:?}");
        assert!(matches!(s.set_xsk(64, xsk.fd()), Err(Error::Queue(64))));
    });
}
