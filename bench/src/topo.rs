//! Two network namespaces joined by a veth pair (`scripts/lib/topology.sh`,
//! embedded), threads that run inside them, and teardown on every exit
//! path: drop (normal return and panics that unwind), and SIGINT, SIGTERM
//! or SIGHUP through [`install_teardown`].
//!
//! Addresses (198.18.0.0/15, benchmarking range): the kernel ends of the
//! veth are [`KERNEL_A`] and [`KERNEL_B`]; the AF_XDP engines own
//! [`XDP_A`] and [`XDP_B`] on the same link (the steering program passes
//! everything else to the kernel), so one topology serves every
//! configuration of a run. The kernel ends get [`KERNEL_A6`] and
//! [`KERNEL_B6`] when a configuration over IPv6 runs
//! ([`Topology::ipv6`]).

use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;

use iwarp_engine::xdp::{AttachMode, XdpConfig};
use nix::sched::{setns, CloneFlags};

/// Kernel address of side a (veth `xa`).
pub const KERNEL_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// Kernel address of side b (veth `xb`).
pub const KERNEL_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// Kernel IPv6 address of side a (2001:2::/48, the IPv6 benchmarking
/// range).
pub const KERNEL_A6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 1);
/// Kernel IPv6 address of side b.
pub const KERNEL_B6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 2);
/// Prefix length of the IPv6 addresses.
pub const PREFIX6: u8 = 64;
/// The AF_XDP engine's address on side a.
pub const XDP_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 11);
/// The AF_XDP engine's address on side b.
pub const XDP_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 12);
/// Prefix length of every address above.
pub const PREFIX: u8 = 24;
/// The interface in namespace a.
pub const IF_A: &str = "xa";
/// The interface in namespace b.
pub const IF_B: &str = "xb";

const SCRIPT: &str = include_str!("../../scripts/lib/topology.sh");

/// Tags of topologies that are up (for the signal handler).
static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<String>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

fn run_script(args: &[&str]) -> io::Result<std::process::Output> {
    let path = std::env::temp_dir().join(format!("iwarp-bench-topology-{}.sh", std::process::id()));
    std::fs::write(&path, SCRIPT)?;
    let out = Command::new("bash").arg(&path).args(args).output();
    let _ = std::fs::remove_file(&path);
    out
}

fn down(tag: &str) {
    let _ = run_script(&["down", tag]);
}

/// Namespaces `iwx-<pid>-<n>-a` / `-b` joined by veth `xa` <-> `xb`;
/// deleted on drop.
#[derive(Debug)]
pub struct Topology {
    tag: String,
    /// Namespace of side a.
    pub ns_a: String,
    /// Namespace of side b.
    pub ns_b: String,
    /// The veth pair as the AF_XDP engines use it.
    pub veth: Veth,
    /// Whether [`Topology::ipv6`] gave the kernel ends their IPv6
    /// addresses (its outcome, once).
    ipv6: std::sync::OnceLock<Result<(), String>>,
}

/// The veth pair as the AF_XDP engines use it: its MTU and how their XDP
/// programs attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Veth {
    /// MTU of the veth pair.
    pub mtu: usize,
    /// How the steering programs attach (`--xdp-mode`).
    pub attach: AttachMode,
    /// The engines' AF_XDP sockets busy-poll the driver
    /// (`--xsk-busy-poll`: `XdpConfig::socket_busy_poll`).
    pub socket_busy_poll: bool,
}

impl std::fmt::Display for Veth {
    /// `MTU 1500, XDP generic mode`: how run headers describe the pair.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MTU {}, XDP {} mode", self.mtu, self.mode())?;
        if self.socket_busy_poll {
            write!(f, ", AF_XDP sockets busy-polled")?;
        }
        Ok(())
    }
}

impl Veth {
    /// The attach mode as reports name it: `generic`, `native`, `auto`.
    pub fn mode(&self) -> String {
        format!("{:?}", self.attach).to_lowercase()
    }

    /// The AF_XDP configuration of side a or b on this pair: its end of
    /// the veth, its address, the MTU and attach mode, no busy polling
    /// (the benchmarks choose their progress mode per configuration).
    pub fn xdp(&self, side_b: bool) -> XdpConfig {
        let (ifname, ip) = if side_b { (IF_B, XDP_B) } else { (IF_A, XDP_A) };
        let mut c = XdpConfig::new(ifname, ip, PREFIX);
        c.attach = self.attach;
        c.busy_poll = false;
        c.mtu = self.mtu;
        c.socket_busy_poll = self.socket_busy_poll.then(Default::default);
        c
    }
}

impl Topology {
    /// Create the namespaces with kernel addresses [`KERNEL_A`] and
    /// [`KERNEL_B`] at `veth.mtu` (68..=65535).
    pub fn up(veth: Veth) -> io::Result<Self> {
        let mtu = veth.mtu;
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "b{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        live().push(tag.clone());
        let t = Self {
            ns_a: format!("iwx-{tag}-a"),
            ns_b: format!("iwx-{tag}-b"),
            tag,
            veth,
            ipv6: std::sync::OnceLock::new(),
        };
        let cidr = |a: Ipv4Addr| format!("{a}/{PREFIX}");
        let out = run_script(&[
            "up",
            &t.tag,
            &mtu.to_string(),
            &cidr(KERNEL_A),
            &cidr(KERNEL_B),
        ])?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "topology up: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(t)
    }

    /// Give the kernel ends [`KERNEL_A6`] and [`KERNEL_B6`] (and nothing
    /// else of IPv6: no link-local address, no router solicitations, no
    /// duplicate address detection), once; the topology comes up with
    /// IPv6 off, so that runs without an IPv6 configuration (and what
    /// they start, such as MPI's address discovery) see IPv4 only.
    pub fn ipv6(&self) -> io::Result<()> {
        self.ipv6
            .get_or_init(|| {
                for (ns, dev, ip) in [
                    (&self.ns_a, IF_A, KERNEL_A6),
                    (&self.ns_b, IF_B, KERNEL_B6),
                ] {
                    let script = format!(
                        "for k in addr_gen_mode=1 accept_ra=0 router_solicitations=0 accept_dad=0 disable_ipv6=0; do \
                         sysctl -qw net.ipv6.conf.{dev}.$k || exit 1; done; \
                         ip -6 addr add {ip}/{PREFIX6} dev {dev} nodad"
                    );
                    netns_exec(ns, &["sh", "-c", &script], &format!("IPv6 on {dev}"))
                        .map_err(|e| e.to_string())?;
                }
                Ok(())
            })
            .clone()
            .map_err(io::Error::other)
    }
}

impl Topology {
    /// Turn TX checksum offload, TSO and GSO on or off on both kernel
    /// ends. The topology comes up with them off (the AF_XDP engines need
    /// whole, checksummed frames); a kernel-only configuration may turn
    /// them on for its run and must turn them off again before an engine
    /// runs on the link.
    pub fn offloads(&self, on: bool) -> io::Result<()> {
        let v = if on { "on" } else { "off" };
        for (ns, dev) in [(&self.ns_a, IF_A), (&self.ns_b, IF_B)] {
            netns_exec(
                ns,
                &["ethtool", "-K", dev, "tx", v, "tso", v, "gso", v],
                &format!("ethtool -K {dev} offloads {v}"),
            )?;
        }
        Ok(())
    }

    /// Steer the kernel's processing of the frames side a's end receives
    /// (`xa`) to `cpu` with Receive Packet Steering, as a host of its own
    /// would run it on its own CPU. veth otherwise runs it in the context
    /// of whoever sent the frame: a kernel TCP sender's acknowledgement
    /// processing, and the segments that it releases, inside side b's
    /// `sendto`, on side b's core.
    pub fn steer_a(&self, cpu: usize) -> io::Result<()> {
        let mask = rps_mask(cpu);
        let script = format!(
            "for q in /sys/class/net/{IF_A}/queues/rx-*; do echo {mask} > \"$q/rps_cpus\" || exit 1; done"
        );
        netns_exec(
            &self.ns_a,
            &["sh", "-c", &script],
            &format!("rps_cpus of {IF_A}"),
        )
    }
}

/// Run `args` in namespace `ns`; a failure is an error that starts with
/// `what` and carries the command's stderr.
fn netns_exec(ns: &str, args: &[&str], what: &str) -> io::Result<()> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The `rps_cpus` mask of one CPU: hexadecimal words of 32 CPUs, the
/// highest first, separated by commas.
fn rps_mask(cpu: usize) -> String {
    let words = cpu / 32 + 1;
    (0..words)
        .rev()
        .map(|w| {
            let bits: u32 = if w == cpu / 32 { 1 << (cpu % 32) } else { 0 };
            format!("{bits:08x}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl Drop for Topology {
    fn drop(&mut self) {
        down(&self.tag);
        live().retain(|t| t != &self.tag);
    }
}

/// Block SIGINT, SIGTERM and SIGHUP in the calling thread (call it first
/// in `main`, before any thread exists, so every thread inherits the
/// mask) and start a thread that waits for them, deletes every live
/// topology and exits with status 130.
pub fn install_teardown() -> io::Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGHUP);
    set.thread_block().map_err(io::Error::from)?;
    std::thread::Builder::new()
        .name("teardown".into())
        .spawn(move || {
            if let Ok(sig) = set.wait() {
                eprintln!("\n{sig}: deleting the namespaces");
                let tags: Vec<String> = live().clone();
                for t in &tags {
                    down(t);
                }
                std::process::exit(130);
            }
        })?;
    Ok(())
}

/// Pin the calling thread to `cpu`; failures are reported, not fatal.
pub fn pin(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    let ok = set.set(cpu).is_ok()
        && nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).is_ok();
    if !ok {
        eprintln!("note: could not pin a thread to CPU {cpu}");
    }
}

/// Run `f` on a new thread that entered network namespace `ns` and is
/// pinned to `cpu`.
pub fn spawn_in<T: Send + 'static>(
    ns: &str,
    cpu: Option<usize>,
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<JoinHandle<io::Result<T>>> {
    let file = File::open(format!("/run/netns/{ns}"))?;
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            setns(file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            if let Some(c) = cpu {
                pin(c);
            }
            Ok(f())
        })
}

/// The CPUs of the two sides: the first two the process may run on
/// (`None` for both if there is only one).
pub fn default_cpus() -> (Option<usize>, Option<usize>) {
    let Ok(set) = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) else {
        return (None, None);
    };
    let cpus: Vec<usize> = (0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .take(2)
        .collect();
    match cpus[..] {
        [a, b] => (Some(a), Some(b)),
        _ => (None, None),
    }
}

/// Whether the process runs as root (namespaces, veth, XDP need it).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[cfg(test)]
mod tests {
    use super::rps_mask;

    #[test]
    fn rps_masks_name_one_cpu() {
        assert_eq!(rps_mask(0), "00000001");
        assert_eq!(rps_mask(5), "00000020");
        assert_eq!(rps_mask(31), "80000000");
        assert_eq!(rps_mask(32), "00000001,00000000");
        assert_eq!(rps_mask(70), "00000040,00000000,00000000");
    }
}
