//! The XDP program that steers the stack's traffic to AF_XDP sockets, and its loader;
//! and a seeded fault injector for tests ([`FaultInjector`]).
//!
//! `src/bpf/steer.bpf.c` is compiled by `build.rs` (libbpf-cargo) and embedded
//! as a skeleton generated into `OUT_DIR`. [`Steering::attach`] loads it,
//! attaches it to one interface and hands out the three maps through a safe
//! API:
//!
//! | map | type | key → value |
//! |---|---|---|
//! | `xsks` | `XSKMAP`, [`MAX_QUEUES`] entries | receive queue → AF_XDP socket fd ([`Steering::set_xsk`]) |
//! | `steer_cfg` | `ARRAY`, 1 entry | 0 → [`SteerConfig`] ([`Steering::update_config`]) |
//! | `counters` | `PERCPU_ARRAY` | [`Counter`] → per-CPU `u64` ([`Steering::counters`]) |
//!
//! # What is steered
//!
//! IPv4/TCP to one of the configured local addresses whose destination
//! (local) port lies in a configured range, or every such TCP segment in
//! "all TCP" mode. The engine's ephemeral ports for active opens must lie in
//! a configured range too, since replies are matched by their destination
//! port. IP fragments are steered only in "all TCP" mode (a non-first
//! fragment has no port to match). Everything else, IPv6 and 802.1Q-tagged
//! frames included, is passed to the kernel.
//!
//! # ARP
//!
//! By default ARP goes to the kernel: the stack's address is then configured
//! on the interface and the engine reads the kernel's neighbour table (or the
//! peers have static entries). With [`SteerConfig::arp`] the program also
//! redirects Ethernet/IPv4 ARP whose target protocol address is a configured
//! address — requests for it and replies to it — so a user-space stack can
//! answer and learn by itself; the kernel then never sees them.
//!
//! # Stale programs
//!
//! The program is attached through netlink (`bpf_xdp_attach`), which outlives
//! the process, so a crashed engine leaves its program on the interface.
//! [`Steering::attach`] attaches with `XDP_FLAGS_UPDATE_IF_NOEXIST`, so it never
//! replaces a program silently. When the interface already carries a program
//! (in either mode) whose name is [`PROG_NAME`], it is taken as a stale one of
//! ours, detached, and the new one attached; any other program is left alone
//! and the attach fails with [`Error::Busy`]. The name cannot tell a crashed
//! engine from a live one, so there is one [`Steering`] per interface: a
//! second attach takes over. Dropping a [`Steering`] detaches its program,
//! unless something else has replaced it meanwhile, and does so in the
//! network namespace it was attached in (interface indices are per
//! namespace), whichever thread drops it.
//!
//! Between detaching the stale program and attaching the new one, frames go
//! to the kernel; a restart has no socket to receive them anyway.
//!
//! ```no_run
//! use iwarp_bpf::{AttachMode, SteerConfig, Steering};
//!
//! let config = SteerConfig::new()
//!     .addr("198.18.0.1".parse().unwrap())
//!     .port(7174)
//!     .ports(49152..=65535);
//! let steering = Steering::attach("veth0", AttachMode::Auto, &config)?;
//! // steering.set_xsk(0, &xsk_fd)?;
//! println!("{:?}", steering.counters()?);
//! # Ok::<(), iwarp_bpf::Error>(())
//! ```

#![warn(missing_docs)]

use std::fmt;
use std::fs::File;
use std::mem::MaybeUninit;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;

use nix::sched::{setns, CloneFlags};

use libbpf_rs::query::ProgInfoIter;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, OpenObject, Xdp, XdpFlags};

#[allow(clippy::all, unused_qualifications, elided_lifetimes_in_paths)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/steer.skel.rs"));
}

use skel::{SteerSkel, SteerSkelBuilder};

mod fault;
pub use fault::{FaultConfig, FaultCounters, FaultInjector, MAX_DELAY_PASSES, PPM};

/// Name of the XDP program in the kernel; identifies a stale program of ours.
pub const PROG_NAME: &str = "iwarp_steer";
/// Entries of the XSKMAP: receive queues `0..MAX_QUEUES` can be steered.
pub const MAX_QUEUES: u32 = 64;
/// Most local IPv4 addresses a [`SteerConfig`] can hold.
pub const MAX_ADDRS: usize = 4;
/// Most port ranges a [`SteerConfig`] can hold.
pub const MAX_PORT_RANGES: usize = 16;

// Flags of `struct steer_config` (steer.bpf.c).
const F_ALL_TCP: u32 = 1 << 0;
const F_ARP: u32 = 1 << 1;
const F_DROP_NO_XSK: u32 = 1 << 2;
// Byte layout of `struct steer_config`: four-byte aligned, no padding.
const CFG_ADDRS: usize = 8;
const CFG_N_RANGES: usize = CFG_ADDRS + 4 * MAX_ADDRS;
const CFG_RANGES: usize = CFG_N_RANGES + 4;
const CFG_SIZE: usize = CFG_RANGES + 4 * MAX_PORT_RANGES;

/// How to attach the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    /// Driver (native) mode, `XDP_FLAGS_DRV_MODE`. On veth the peer end
    /// needs an XDP program too before frames reach it in this mode.
    Native,
    /// Generic (skb) mode, `XDP_FLAGS_SKB_MODE`: works on every interface.
    Generic,
    /// Native, falling back to generic when the driver refuses.
    Auto,
}

/// The mode a program actually runs in, as the kernel reports it after
/// attaching (with [`AttachMode::Auto`], the mode the driver accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveMode {
    /// Driver (native) mode.
    Native,
    /// Generic (skb) mode.
    Generic,
}

impl ActiveMode {
    fn flags(self) -> XdpFlags {
        match self {
            Self::Native => XdpFlags::DRV_MODE,
            Self::Generic => XdpFlags::SKB_MODE,
        }
    }
}

/// The interface to attach to: a name or an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interface {
    /// Interface name, resolved in the calling thread's network namespace.
    Name(String),
    /// Interface index, as `if_nametoindex` returns it.
    Index(u32),
}

impl From<&str> for Interface {
    fn from(name: &str) -> Self {
        Self::Name(name.to_owned())
    }
}

impl From<String> for Interface {
    fn from(name: String) -> Self {
        Self::Name(name)
    }
}

impl From<u32> for Interface {
    fn from(index: u32) -> Self {
        Self::Index(index)
    }
}

/// What belongs to the engine. Built with the chained setters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SteerConfig {
    /// The engine's local IPv4 addresses (at most [`MAX_ADDRS`]).
    pub addrs: Vec<Ipv4Addr>,
    /// Local TCP port ranges, inclusive (at most [`MAX_PORT_RANGES`]).
    pub ports: Vec<RangeInclusive<u16>>,
    /// Steer all TCP to the addresses, whatever the port.
    pub all_tcp: bool,
    /// Also steer ARP whose target address is one of the addresses.
    pub arp: bool,
    /// Drop the engine's frames when their queue has no socket, instead of
    /// passing them to the kernel (which would answer a SYN with a RST).
    pub drop_without_xsk: bool,
}

impl SteerConfig {
    /// Nothing steered: every frame goes to the kernel.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a local address.
    pub fn addr(mut self, addr: Ipv4Addr) -> Self {
        self.addrs.push(addr);
        self
    }

    /// Adds one local port.
    pub fn port(self, port: u16) -> Self {
        self.ports(port..=port)
    }

    /// Adds a range of local ports.
    pub fn ports(mut self, range: RangeInclusive<u16>) -> Self {
        self.ports.push(range);
        self
    }

    /// Steers all TCP to the addresses (ports are then ignored).
    pub fn all_tcp(mut self, on: bool) -> Self {
        self.all_tcp = on;
        self
    }

    /// Steers ARP for the addresses too.
    pub fn arp(mut self, on: bool) -> Self {
        self.arp = on;
        self
    }

    /// Drops the engine's frames on queues without a socket.
    pub fn drop_without_xsk(mut self, on: bool) -> Self {
        self.drop_without_xsk = on;
        self
    }

    /// The map value: `struct steer_config` of steer.bpf.c.
    fn to_bytes(&self) -> Result<[u8; CFG_SIZE]> {
        if self.addrs.len() > MAX_ADDRS {
            return Err(Error::Config("more than MAX_ADDRS addresses"));
        }
        if self.ports.len() > MAX_PORT_RANGES {
            return Err(Error::Config("more than MAX_PORT_RANGES port ranges"));
        }
        if self.ports.iter().any(|r| r.start() > r.end()) {
            return Err(Error::Config("empty port range"));
        }
        let mut flags = 0;
        if self.all_tcp {
            flags |= F_ALL_TCP;
        }
        if self.arp {
            flags |= F_ARP;
        }
        if self.drop_without_xsk {
            flags |= F_DROP_NO_XSK;
        }
        let mut out = [0u8; CFG_SIZE];
        let mut put = |at: usize, bytes: &[u8]| out[at..at + bytes.len()].copy_from_slice(bytes);
        put(0, &flags.to_ne_bytes());
        // Lengths are bounded by the checks above.
        put(4, &(self.addrs.len() as u32).to_ne_bytes());
        for (i, addr) in self.addrs.iter().enumerate() {
            // Network byte order, as in the IPv4 header.
            put(CFG_ADDRS + 4 * i, &addr.octets());
        }
        put(CFG_N_RANGES, &(self.ports.len() as u32).to_ne_bytes());
        for (i, range) in self.ports.iter().enumerate() {
            put(CFG_RANGES + 4 * i, &range.start().to_ne_bytes());
            put(CFG_RANGES + 4 * i + 2, &range.end().to_ne_bytes());
        }
        Ok(out)
    }
}

/// The program's counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// The engine's frames handed to an AF_XDP socket.
    pub redirected: u64,
    /// Frames that are not the engine's, passed to the kernel.
    pub passed: u64,
    /// The engine's frames whose queue had no socket, passed to the kernel.
    pub no_xsk: u64,
    /// The engine's frames whose queue had no socket, dropped
    /// ([`SteerConfig::drop_without_xsk`]).
    pub dropped: u64,
    /// Truncated or malformed IPv4/TCP/ARP headers, passed to the kernel.
    pub malformed: u64,
}

impl Counters {
    /// Counts since `earlier` (saturating, for counters read in that order).
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            redirected: self.redirected.saturating_sub(earlier.redirected),
            passed: self.passed.saturating_sub(earlier.passed),
            no_xsk: self.no_xsk.saturating_sub(earlier.no_xsk),
            dropped: self.dropped.saturating_sub(earlier.dropped),
            malformed: self.malformed.saturating_sub(earlier.malformed),
        }
    }
}

/// Index of each counter in the `counters` map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// [`Counters::redirected`].
    Redirected = 0,
    /// [`Counters::passed`].
    Passed = 1,
    /// [`Counters::no_xsk`].
    NoXsk = 2,
    /// [`Counters::dropped`].
    Dropped = 3,
    /// [`Counters::malformed`].
    Malformed = 4,
}

impl Counter {
    const ALL: [Self; 5] = [
        Self::Redirected,
        Self::Passed,
        Self::NoXsk,
        Self::Dropped,
        Self::Malformed,
    ];
}

/// Why loading, attaching or configuring the steering program failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The interface name does not resolve in this network namespace.
    Interface(String, std::io::Error),
    /// The configuration does not fit the program's map.
    Config(&'static str),
    /// A queue number outside `0..MAX_QUEUES`.
    Queue(u32),
    /// Another (not ours) XDP program is attached to the interface.
    Busy {
        /// Its program id.
        prog_id: u32,
        /// Its name, as the kernel reports it.
        name: String,
    },
    /// A libbpf call failed; the string says which step.
    Bpf(&'static str, libbpf_rs::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Interface(name, e) => write!(f, "interface {name:?}: {e}"),
            Self::Config(what) => write!(f, "steering config: {what}"),
            Self::Queue(q) => write!(f, "queue {q} outside 0..{MAX_QUEUES}"),
            Self::Busy { prog_id, name } => {
                write!(
                    f,
                    "interface carries another XDP program: id {prog_id} {name:?}"
                )
            }
            Self::Bpf(step, e) => write!(f, "{step}: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Interface(_, e) => Some(e),
            Self::Bpf(_, e) => Some(e),
            _ => None,
        }
    }
}

/// The result of a loader call: the value, or the [`Error`] of the step
/// that failed.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn bpf(step: &'static str) -> impl FnOnce(libbpf_rs::Error) -> Error {
    move |e| Error::Bpf(step, e)
}

/// The steering program, loaded and attached to one interface. Dropping it
/// detaches the program.
pub struct Steering {
    skel: SteerSkel<'static>,
    /// The network namespace the program was attached in: interface indices
    /// are per namespace, so detaching must happen there too.
    netns: File,
    ifindex: i32,
    mode: ActiveMode,
    prog_id: u32,
}

impl fmt::Debug for Steering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Steering")
            .field("ifindex", &self.ifindex)
            .field("mode", &self.mode)
            .field("prog_id", &self.prog_id)
            .finish()
    }
}

impl Steering {
    /// Loads the program with `config`, replaces a stale program of ours on
    /// the interface if there is one, and attaches in `mode`.
    pub fn attach(
        interface: impl Into<Interface>,
        mode: AttachMode,
        config: &SteerConfig,
    ) -> Result<Self> {
        let ifindex = resolve(&interface.into())?;
        let netns = File::open(THIS_NETNS).map_err(|e| Error::Interface(THIS_NETNS.into(), e))?;
        let cfg = config.to_bytes()?;

        let skel = load(&cfg)?;
        let prog_fd = skel.progs.iwarp_steer.as_fd();
        let prog_id = libbpf_rs::Program::id_from_fd(prog_fd).map_err(bpf("program id"))?;
        let xdp = Xdp::new(prog_fd);

        remove_stale(&xdp, ifindex)?;
        let attach = |m: ActiveMode| xdp.attach(ifindex, XdpFlags::UPDATE_IF_NOEXIST | m.flags());
        let mode = match mode {
            AttachMode::Native => attach(ActiveMode::Native)
                .map(|()| ActiveMode::Native)
                .map_err(bpf("attach in native mode"))?,
            AttachMode::Generic => attach(ActiveMode::Generic)
                .map(|()| ActiveMode::Generic)
                .map_err(bpf("attach in generic mode"))?,
            AttachMode::Auto => match attach(ActiveMode::Native) {
                Ok(()) => ActiveMode::Native,
                Err(_) => attach(ActiveMode::Generic)
                    .map(|()| ActiveMode::Generic)
                    .map_err(bpf("attach in generic mode (native refused)"))?,
            },
        };
        Ok(Self {
            skel,
            netns,
            ifindex,
            mode,
            prog_id,
        })
    }

    /// The interface index the program is attached to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex as u32
    }

    /// The mode the program runs in.
    pub fn mode(&self) -> ActiveMode {
        self.mode
    }

    /// The kernel's id of the attached program.
    pub fn prog_id(&self) -> u32 {
        self.prog_id
    }

    /// Steers the engine's frames received on `queue` to the AF_XDP socket
    /// `xsk` (bound to this interface and queue).
    pub fn set_xsk(&self, queue: u32, xsk: &impl AsRawFd) -> Result<()> {
        if queue >= MAX_QUEUES {
            return Err(Error::Queue(queue));
        }
        let fd = xsk.as_raw_fd() as u32;
        self.skel
            .maps
            .xsks
            .update(&queue.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
            .map_err(bpf("set an XSKMAP entry"))
    }

    /// Empties the XSKMAP slot of `queue` (no error if it was empty).
    pub fn remove_xsk(&self, queue: u32) -> Result<()> {
        if queue >= MAX_QUEUES {
            return Err(Error::Queue(queue));
        }
        match self.skel.maps.xsks.delete(&queue.to_ne_bytes()) {
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            r => r.map_err(bpf("clear an XSKMAP entry")),
        }
    }

    /// Replaces the configuration; frames already in flight may see either.
    pub fn update_config(&self, config: &SteerConfig) -> Result<()> {
        let cfg = config.to_bytes()?;
        self.skel
            .maps
            .steer_cfg
            .update(&0u32.to_ne_bytes(), &cfg, MapFlags::ANY)
            .map_err(bpf("write the config map"))
    }

    /// The counters, summed over CPUs.
    pub fn counters(&self) -> Result<Counters> {
        read_counters(&self.skel)
    }

    /// Detaches the program now, reporting errors (dropping does the same
    /// silently).
    pub fn detach(self) -> Result<()> {
        // Drop runs afterwards and finds nothing of ours attached.
        self.detach_ref()
    }

    fn detach_ref(&self) -> Result<()> {
        let prog_fd = self.skel.progs.iwarp_steer.as_fd();
        in_netns(&self.netns, || self.detach_here(prog_fd))
            .map_err(|e| Error::Interface("network namespace of the attach".into(), e))?
    }

    /// Detaches, in the network namespace of the attach.
    fn detach_here(&self, prog_fd: BorrowedFd<'_>) -> Result<()> {
        let xdp = Xdp::new(prog_fd);
        let q = xdp
            .query(self.ifindex, XdpFlags::NONE)
            .map_err(bpf("query the interface"))?;
        let current = match self.mode {
            ActiveMode::Native => q.drv_prog_id,
            ActiveMode::Generic => q.skb_prog_id,
        };
        // Someone replaced us (a newer engine after `attach`): leave it.
        if current != self.prog_id {
            return Ok(());
        }
        xdp.detach(self.ifindex, self.mode.flags())
            .map_err(bpf("detach"))
    }
}

impl Drop for Steering {
    fn drop(&mut self) {
        // The interface may be gone already (namespace deleted): nothing to do.
        let _ = self.detach_ref();
    }
}

/// Opens and loads the program (verifier included) with `cfg` in its config
/// map; attaches nothing.
fn load(cfg: &[u8; CFG_SIZE]) -> Result<SteerSkel<'static>> {
    // The skeleton borrows its object storage for its whole life; the
    // storage is one pointer-sized `OpenObject` slot (the libbpf object
    // itself is freed when the skeleton drops), leaked once per load.
    let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    let open = SteerSkelBuilder::default()
        .open(storage)
        .map_err(bpf("open the BPF object"))?;
    let skel = open.load().map_err(bpf("load the XDP program"))?;
    skel.maps
        .steer_cfg
        .update(&0u32.to_ne_bytes(), cfg, MapFlags::ANY)
        .map_err(bpf("write the config map"))?;
    Ok(skel)
}

/// Sums the per-CPU counters of a loaded program.
fn read_counters(skel: &SteerSkel<'_>) -> Result<Counters> {
    let mut sums = [0u64; Counter::ALL.len()];
    for (sum, which) in sums.iter_mut().zip(Counter::ALL) {
        let per_cpu = skel
            .maps
            .counters
            .lookup_percpu(&(which as u32).to_ne_bytes(), MapFlags::ANY)
            .map_err(bpf("read the counters"))?
            .unwrap_or_default();
        *sum = per_cpu
            .iter()
            .filter_map(|v| v.get(..8)?.try_into().ok())
            .map(u64::from_ne_bytes)
            .fold(0u64, u64::wrapping_add);
    }
    let [redirected, passed, no_xsk, dropped, malformed] = sums;
    Ok(Counters {
        redirected,
        passed,
        no_xsk,
        dropped,
        malformed,
    })
}

/// The calling thread's network namespace.
const THIS_NETNS: &str = "/proc/thread-self/ns/net";

/// Runs `f` in the network namespace `ns`: directly when the calling thread
/// is already there, else on a short-lived thread that enters it (`setns`
/// changes only the calling thread).
fn in_netns<T: Send>(ns: &File, f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    let want = ns.metadata()?;
    let here = std::fs::metadata(THIS_NETNS)?;
    if (want.dev(), want.ino()) == (here.dev(), here.ino()) {
        return Ok(f());
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("namespace thread panicked")))
    })
}

fn resolve(interface: &Interface) -> Result<i32> {
    let index = match interface {
        Interface::Index(i) => *i,
        Interface::Name(name) => nix::net::if_::if_nametoindex(name.as_str())
            .map_err(|e| Error::Interface(name.clone(), e.into()))?,
    };
    i32::try_from(index).map_err(|_| {
        Error::Interface(
            index.to_string(),
            std::io::Error::from(std::io::ErrorKind::InvalidInput),
        )
    })
}

/// Detaches a program named [`PROG_NAME`] from `ifindex` (in whichever mode
/// it runs); refuses with [`Error::Busy`] if another program is there.
fn remove_stale(xdp: &Xdp<'_>, ifindex: i32) -> Result<()> {
    let q = xdp
        .query(ifindex, XdpFlags::NONE)
        .map_err(bpf("query the interface"))?;
    // Offloaded (hw) programs are never ours: `None` makes them Busy.
    for (id, mode) in [
        (q.drv_prog_id, Some(XdpFlags::DRV_MODE)),
        (q.skb_prog_id, Some(XdpFlags::SKB_MODE)),
        (q.hw_prog_id, None),
    ] {
        if id == 0 {
            continue;
        }
        let name = ProgInfoIter::default()
            .find(|info| info.id == id)
            .map(|info| info.name.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some(mode) = mode.filter(|_| name == PROG_NAME) else {
            return Err(Error::Busy { prog_id: id, name });
        };
        xdp.detach(ifindex, mode)
            .map_err(bpf("detach a stale program"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_layout_matches_the_c_struct() {
        assert_eq!(CFG_SIZE, size_of::<skel::types::steer_config>());
        let cfg = SteerConfig::new()
            .addr(Ipv4Addr::new(198, 18, 0, 1))
            .port(7174)
            .ports(49152..=65535)
            .arp(true)
            .to_bytes()
            .unwrap();
        assert_eq!(cfg[0..4], F_ARP.to_ne_bytes());
        assert_eq!(cfg[4..8], 1u32.to_ne_bytes());
        assert_eq!(cfg[CFG_ADDRS..CFG_ADDRS + 4], [198, 18, 0, 1]);
        assert_eq!(cfg[CFG_N_RANGES..CFG_N_RANGES + 4], 2u32.to_ne_bytes());
        assert_eq!(cfg[CFG_RANGES..CFG_RANGES + 2], 7174u16.to_ne_bytes());
        assert_eq!(cfg[CFG_RANGES + 2..CFG_RANGES + 4], 7174u16.to_ne_bytes());
        assert_eq!(cfg[CFG_RANGES + 4..CFG_RANGES + 6], 49152u16.to_ne_bytes());
        assert_eq!(cfg[CFG_RANGES + 6..CFG_RANGES + 8], 65535u16.to_ne_bytes());
    }

    #[test]
    fn config_limits() {
        let mut c = SteerConfig::new();
        for i in 0..=MAX_ADDRS as u8 {
            c = c.addr(Ipv4Addr::new(198, 18, 0, i));
        }
        assert!(matches!(c.to_bytes(), Err(Error::Config(_))));
        let mut c = SteerConfig::new();
        for p in 0..=MAX_PORT_RANGES as u16 {
            c = c.port(p);
        }
        assert!(matches!(c.to_bytes(), Err(Error::Config(_))));
        #[allow(clippy::reversed_empty_ranges)]
        let c = SteerConfig::new().ports(10..=9);
        assert!(matches!(c.to_bytes(), Err(Error::Config(_))));
    }

    #[test]
    fn counters_since_saturates() {
        let a = Counters {
            redirected: 5,
            passed: 1,
            ..Counters::default()
        };
        let b = Counters {
            redirected: 7,
            ..Counters::default()
        };
        let d = b.since(&a);
        assert_eq!((d.redirected, d.passed), (2, 0));
    }

    /// The program run by the kernel on hand-made frames
    /// (`BPF_PROG_TEST_RUN`): no interface, no socket in the XSKMAP.
    mod prog_test_run {
        use super::*;
        use libbpf_rs::ProgramInput;

        const XDP_DROP: u32 = 1;
        const XDP_PASS: u32 = 2;
        const A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
        const OTHER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 9);

        fn config() -> SteerConfig {
            SteerConfig::new().addr(A).port(7174).ports(40000..=40010)
        }

        fn eth(ethertype: u16) -> Vec<u8> {
            let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
            f.extend_from_slice(&ethertype.to_be_bytes());
            f
        }

        /// IPv4 (with `opt_words` words of options) carrying `proto`, and a
        /// 20-byte TCP-like header to `port`.
        fn ipv4(dst: Ipv4Addr, proto: u8, port: u16, opt_words: u8, frag: u16) -> Vec<u8> {
            let mut f = eth(0x0800);
            let total = 20 + 4 * u16::from(opt_words) + 20;
            f.push(0x40 | (5 + opt_words));
            f.push(0);
            f.extend_from_slice(&total.to_be_bytes());
            f.extend_from_slice(&[0, 1]);
            f.extend_from_slice(&frag.to_be_bytes());
            f.extend_from_slice(&[64, proto, 0, 0]);
            f.extend_from_slice(&[198, 18, 0, 2]);
            f.extend_from_slice(&dst.octets());
            f.extend(std::iter::repeat_n(1u8, 4 * usize::from(opt_words)));
            f.extend_from_slice(&40000u16.to_be_bytes());
            f.extend_from_slice(&port.to_be_bytes());
            f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
            f
        }

        fn tcp(dst: Ipv4Addr, port: u16) -> Vec<u8> {
            ipv4(dst, 6, port, 0, 0x4000)
        }

        fn arp(tpa: Ipv4Addr) -> Vec<u8> {
            let mut f = eth(0x0806);
            f.extend_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
            f.extend_from_slice(&[0x02, 0, 0, 0, 0, 2, 198, 18, 0, 2]);
            f.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
            f.extend_from_slice(&tpa.octets());
            f
        }

        /// Runs `frame` through a fresh program with `config`: the action
        /// and the counters it moved.
        fn run(config: &SteerConfig, frame: &[u8]) -> (u32, Counters) {
            let skel = load(&config.to_bytes().unwrap()).expect("load");
            let input = ProgramInput {
                data_in: Some(frame),
                ..ProgramInput::default()
            };
            let out = skel.progs.iwarp_steer.test_run(input).expect("test run");
            (out.return_value, read_counters(&skel).unwrap())
        }

        fn is_root() -> bool {
            let root = nix::unistd::geteuid().is_root();
            if !root {
                println!("note: not root, skipping (loading BPF needs CAP_BPF)");
            }
            root
        }

        const ZERO: Counters = Counters {
            redirected: 0,
            passed: 0,
            no_xsk: 0,
            dropped: 0,
            malformed: 0,
        };
        const NO_XSK: Counters = Counters { no_xsk: 1, ..ZERO };
        const PASSED: Counters = Counters { passed: 1, ..ZERO };
        const MALFORMED: Counters = Counters {
            malformed: 1,
            ..ZERO
        };
        const DROPPED: Counters = Counters { dropped: 1, ..ZERO };

        #[test]
        fn classification() {
            if !is_root() {
                return;
            }
            let all_tcp = SteerConfig::new().addr(A).all_tcp(true);
            let with_arp = config().arp(true);
            let mut short_tcp = tcp(A, 7174);
            short_tcp.truncate(14 + 20 + 10);
            let mut short_ip = tcp(A, 7174);
            short_ip.truncate(14 + 12);
            let mut bad_ihl = tcp(A, 7174);
            bad_ihl[14] = 0x44;
            let mut short_arp = arp(A);
            short_arp.truncate(14 + 20);
            let mut vlan = eth(0x8100);
            vlan.extend_from_slice(&tcp(A, 7174)[12..]);
            let cases: [(&str, &SteerConfig, Vec<u8>, u32, Counters); 19] = [
                ("steered port", &config(), tcp(A, 7174), XDP_PASS, NO_XSK),
                ("port range", &config(), tcp(A, 40005), XDP_PASS, NO_XSK),
                ("range end", &config(), tcp(A, 40010), XDP_PASS, NO_XSK),
                ("past the range", &config(), tcp(A, 40011), XDP_PASS, PASSED),
                ("other port", &config(), tcp(A, 9), XDP_PASS, PASSED),
                (
                    "other address",
                    &config(),
                    tcp(OTHER_IP, 7174),
                    XDP_PASS,
                    PASSED,
                ),
                ("UDP", &config(), ipv4(A, 17, 7174, 0, 0), XDP_PASS, PASSED),
                (
                    "IP options",
                    &config(),
                    ipv4(A, 6, 7174, 3, 0),
                    XDP_PASS,
                    NO_XSK,
                ),
                (
                    "fragment",
                    &config(),
                    ipv4(A, 6, 7174, 0, 0x2000),
                    XDP_PASS,
                    PASSED,
                ),
                (
                    "fragment, all TCP",
                    &all_tcp,
                    ipv4(A, 6, 7174, 0, 0x2000),
                    XDP_PASS,
                    NO_XSK,
                ),
                ("all TCP", &all_tcp, tcp(A, 9), XDP_PASS, NO_XSK),
                (
                    "drop mode",
                    &config().drop_without_xsk(true),
                    tcp(A, 7174),
                    XDP_DROP,
                    DROPPED,
                ),
                ("truncated TCP", &config(), short_tcp, XDP_PASS, MALFORMED),
                ("truncated IPv4", &config(), short_ip, XDP_PASS, MALFORMED),
                ("IHL < 5", &config(), bad_ihl, XDP_PASS, MALFORMED),
                ("ARP, option off", &config(), arp(A), XDP_PASS, PASSED),
                ("ARP for us", &with_arp, arp(A), XDP_PASS, NO_XSK),
                (
                    "ARP for another",
                    &with_arp,
                    arp(OTHER_IP),
                    XDP_PASS,
                    PASSED,
                ),
                ("truncated ARP", &with_arp, short_arp, XDP_PASS, MALFORMED),
            ];
            for (what, config, frame, action, counters) in cases {
                assert_eq!(run(config, &frame), (action, counters), "{what}");
            }
            let more: [(&str, Vec<u8>); 3] = [
                ("802.1Q", vlan),
                ("IPv6", eth(0x86dd)),
                ("nothing configured", tcp(A, 7174)),
            ];
            for (what, frame) in more {
                let cfg = if what == "nothing configured" {
                    SteerConfig::new()
                } else {
                    config()
                };
                assert_eq!(run(&cfg, &frame), (XDP_PASS, PASSED), "{what}");
            }
        }
    }

    #[test]
    fn bad_queue_and_interface_are_errors() {
        let e = Steering::attach("no-such-if-xyz", AttachMode::Generic, &SteerConfig::new());
        assert!(matches!(e, Err(Error::Interface(..))));
    }
}
