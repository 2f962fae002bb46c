//! Scaffolding shared by the tests that run in network namespaces
//! (`xdp_netns`, `xdp_multicore`, `faults`, and the iwarp-bpf crate's
//! `fault_netns`, which includes this file by path): the root check, the
//! topology script, namespaces deleted on drop (so a failing test tears
//! its topology down too), threads inside a namespace, and the test
//! pattern; and for every test that waits on the engine's event fds,
//! [`readable`].
//!
//! Each test binary uses a part of it.
#![allow(dead_code)]

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags};
use nix::sched::{setns, CloneFlags};

/// The kernel ends of the veth pair (`xa` in namespace a, `xb` in b).
pub const IP_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const IP_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

/// Whether `fd` is readable within `ms` milliseconds (poll(2); a signal
/// that interrupts the wait counts as not readable).
pub fn readable(fd: BorrowedFd<'_>, ms: u16) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    match poll(&mut fds, ms) {
        Ok(n) => {
            n == 1
                && fds[0]
                    .revents()
                    .is_some_and(|r| r.contains(PollFlags::POLLIN))
        }
        Err(Errno::EINTR) => false,
        Err(e) => panic!("poll: {e}"),
    }
}

/// Whether the test can run; prints why it skips otherwise.
pub fn is_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    println!("note: not root, skipping (namespaces, veth, tc, XDP and AF_XDP need root)");
    false
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/lib/topology.sh")
}

/// Namespaces `a` and `b` (and `m` between them for [`Topo::up3`]) from
/// `scripts/lib/topology.sh`, named after the process id and a counter;
/// deleted on drop.
pub struct Topo {
    tag: String,
    /// Namespace a (veth `xa`).
    pub a: String,
    /// Namespace b (veth `xb`).
    pub b: String,
}

impl Topo {
    /// a — b over one veth pair with `queues` rx/tx queues per end.
    pub fn up(mtu: usize, addr_a: Option<Ipv4Addr>, addr_b: Option<Ipv4Addr>, queues: u32) -> Self {
        let q = queues.to_string();
        Self::create(&["up"], mtu, addr_a, addr_b, &[&q])
    }

    /// a — m — b: the middle namespace forwards (fault injection).
    pub fn up3(mtu: usize, addr_a: Option<Ipv4Addr>, addr_b: Option<Ipv4Addr>) -> Self {
        Self::create(&["up3"], mtu, addr_a, addr_b, &[])
    }

    fn create(
        cmd: &[&str],
        mtu: usize,
        addr_a: Option<Ipv4Addr>,
        addr_b: Option<Ipv4Addr>,
        extra: &[&str],
    ) -> Self {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let cidr = |a: Option<Ipv4Addr>| a.map(|a| format!("{a}/24")).unwrap_or_default();
        let out = Command::new("bash")
            .arg(script())
            .args(cmd)
            .args([tag.as_str(), &mtu.to_string(), &cidr(addr_a), &cidr(addr_b)])
            .args(extra)
            .output()
            .expect("topology.sh");
        assert!(
            out.status.success(),
            "topology {cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self {
            a: format!("iwx-{tag}-a"),
            b: format!("iwx-{tag}-b"),
            tag,
        }
    }

    /// The namespace `which` ('a', 'm' or 'b').
    pub fn ns(&self, which: char) -> String {
        format!("iwx-{}-{which}", self.tag)
    }

    /// `ip link show dev DEV` in namespace `ns`.
    pub fn link(&self, ns: &str, dev: &str) -> String {
        let out = Command::new("ip")
            .args(["-n", ns, "link", "show", "dev", dev])
            .output()
            .expect("ip link");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Neither veth end has an XDP program left.
    pub fn assert_no_program(&self) {
        for (ns, link) in [(&self.a, "xa"), (&self.b, "xb")] {
            let show = self.link(ns, link);
            assert!(!show.contains("xdp"), "an XDP program is left: {show}");
        }
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .args(["down", &self.tag])
            .status();
    }
}

/// Runs `f` on a thread that entered namespace `ns`.
pub fn spawn_in<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let file = File::open(format!("/run/netns/{ns}")).expect("namespace file");
    std::thread::spawn(move || {
        setns(file.as_fd(), CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
}

/// A test pattern of `len` bytes, different for every `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}
