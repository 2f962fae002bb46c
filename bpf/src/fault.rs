//! A seeded fault injector for tests: drops, corrupts, duplicates and
//! reorders IPv4/TCP segments on one interface (`src/bpf/fault.bpf.c`).
//!
//! | hook | program | faults | sees |
//! |---|---|---|---|
//! | XDP on the interface | `iwarp_fault_xdp` | drop, corrupt | frames the interface receives |
//! | tc clsact egress on the interface | `iwarp_fault_tc` | duplicate, delay | frames the interface sends |
//! | tc clsact ingress on the detour's far end | `iwarp_fault_detour` | — | delayed frames |
//!
//! XDP can neither clone nor hold a frame, so duplication and delay live on
//! tc egress: a duplicate is a `bpf_clone_redirect` to the same egress; a
//! delayed frame is redirected into a *detour* veth pair whose receive side
//! queues it on the CPU backlog and whose ingress program sends it back out
//! of the interface ([`FaultConfig::delay_passes`] times round). Later
//! frames of the same flow overtake it: reordering by a few frames per pass,
//! not by a fixed time. (Earliest-departure-time delay with the `fq` qdisc
//! or netem would give fixed delays; neither is built into the kernel the
//! tests run on.)
//!
//! Corruption flips one byte of the TCP payload of a segment that carries
//! payload, and fixes the TCP checksum up incrementally (RFC 1624), so the
//! receiving TCP accepts the segment: only a check above TCP (the MPA CRC)
//! can catch it. The frame must arrive with a complete checksum (an AF_XDP
//! sender, or a kernel sender whose interface has tx checksumming off).
//!
//! Decisions come from a per-CPU xorshift64* generator per hook, seeded from
//! [`FaultConfig::seed`] and the CPU; [`FaultInjector::set_config`] reseeds.
//! With a fixed seed a run is reproducible as far as the order of frames on
//! each CPU is.
//!
//! Placement: one XDP program per interface, so the injector goes on an
//! interface the AF_XDP engine does not use, e.g. the middle namespace's
//! ends of a `a — m — b` topology whose middle bridges the two veth pairs:
//! an injector on the middle end facing `a` drops/corrupts `a → b` (XDP) and
//! duplicates/delays `b → a` (tc egress). AF_XDP transmit in copy mode
//! bypasses tc egress on its own interface, another reason to inject in the
//! middle.

use std::fmt;
use std::fs::File;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, OpenObject, TcHook, TcHookBuilder, Xdp, XdpFlags};
use libbpf_rs::{TC_EGRESS, TC_INGRESS};

use crate::{bpf, in_netns, resolve, ActiveMode, AttachMode, Error, Interface, Result, THIS_NETNS};

#[allow(clippy::all, unused_qualifications, elided_lifetimes_in_paths)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/fault.skel.rs"));
}

use skel::{FaultSkel, FaultSkelBuilder};

/// Parts per million: a rate of `PPM` applies to every segment.
pub const PPM: u32 = 1_000_000;
/// Most passes through the detour for one delayed frame.
pub const MAX_DELAY_PASSES: u8 = 15;

// Byte layout of `struct fault_config` (fault.bpf.c).
const CFG_SIZE: usize = 48;
// Handle and priority of our tc filters.
const TC_HANDLE: u32 = 0xfa17;
const TC_PRIORITY: u32 = 1;

/// What to inject. Rates are in parts per million of the TCP segments that
/// match the port filter, per hook.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultConfig {
    /// Generator seed; 0 seeds from the kernel's random numbers.
    pub seed: u64,
    /// Received segments dropped (XDP).
    pub drop_ppm: u32,
    /// Received segments with payload whose payload gets one byte flipped,
    /// checksum fixed up (XDP).
    pub corrupt_ppm: u32,
    /// Most corruptions per [`FaultInjector::set_config`] (0: no limit).
    pub corrupt_limit: u32,
    /// Sent segments duplicated (tc egress).
    pub duplicate_ppm: u32,
    /// Sent segments sent round the detour (tc egress; needs a detour).
    pub delay_ppm: u32,
    /// Passes through the detour per delayed segment, 1 ..=
    /// [`MAX_DELAY_PASSES`].
    pub delay_passes: u8,
    /// Only segments from or to this TCP port (`None`: all TCP).
    pub port: Option<u16>,
}

impl FaultConfig {
    /// A configuration that injects no faults, with generator seed `seed`
    /// (0: seeded from the kernel's random numbers) and one detour pass
    /// per delayed segment.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            delay_passes: 1,
            ..Self::default()
        }
    }

    fn to_bytes(&self, generation: u32, detour: u32) -> Result<[u8; CFG_SIZE]> {
        let rates = [
            self.drop_ppm,
            self.corrupt_ppm,
            self.duplicate_ppm,
            self.delay_ppm,
        ];
        if rates.iter().any(|&r| r > PPM) {
            return Err(Error::Config("a rate above 1_000_000 ppm"));
        }
        if !(1..=MAX_DELAY_PASSES).contains(&self.delay_passes) {
            return Err(Error::Config("delay_passes outside 1..=15"));
        }
        let mut b = [0u8; CFG_SIZE];
        b[0..8].copy_from_slice(&self.seed.to_ne_bytes());
        let words = [
            generation,
            self.drop_ppm,
            self.corrupt_ppm,
            self.duplicate_ppm,
            self.delay_ppm,
            u32::from(self.delay_passes),
            detour,
            self.corrupt_limit,
        ];
        for (chunk, w) in b[8..40].chunks_exact_mut(4).zip(words) {
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
        b[40..42].copy_from_slice(&self.port.unwrap_or(0).to_ne_bytes());
        Ok(b)
    }
}

/// The injector's counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounters {
    /// TCP segments matching the filter seen by XDP (received).
    pub rx_seen: u64,
    /// Received segments the XDP hook dropped.
    pub dropped: u64,
    /// Received segments the XDP hook corrupted (one payload byte flipped,
    /// TCP checksum fixed up).
    pub corrupted: u64,
    /// TCP segments matching the filter seen on tc egress (sent).
    pub tx_seen: u64,
    /// Sent segments the tc egress hook duplicated.
    pub duplicated: u64,
    /// Sent segments the tc egress hook sent round the detour.
    pub delayed: u64,
    /// Passes through the detour, over all delayed segments.
    pub detour_passes: u64,
    /// Duplications whose `bpf_clone_redirect` call failed: no copy is
    /// sent, the original segment goes on.
    pub errors: u64,
}

impl FaultCounters {
    /// Counts since `earlier` (saturating).
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            rx_seen: self.rx_seen.saturating_sub(earlier.rx_seen),
            dropped: self.dropped.saturating_sub(earlier.dropped),
            corrupted: self.corrupted.saturating_sub(earlier.corrupted),
            tx_seen: self.tx_seen.saturating_sub(earlier.tx_seen),
            duplicated: self.duplicated.saturating_sub(earlier.duplicated),
            delayed: self.delayed.saturating_sub(earlier.delayed),
            detour_passes: self.detour_passes.saturating_sub(earlier.detour_passes),
            errors: self.errors.saturating_sub(earlier.errors),
        }
    }
}

/// The injector, loaded and attached to one interface (and optionally a
/// detour). Dropping it detaches everything, in the network namespace it
/// was attached in.
///
/// It owns the clsact qdiscs of the interface and of the detour's far end:
/// detaching removes them.
pub struct FaultInjector {
    skel: FaultSkel<'static>,
    netns: File,
    ifindex: i32,
    detour: Option<(i32, i32)>,
    mode: ActiveMode,
    xdp_prog_id: u32,
    generation: std::sync::atomic::AtomicU32,
}

impl fmt::Debug for FaultInjector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultInjector")
            .field("ifindex", &self.ifindex)
            .field("detour", &self.detour)
            .field("mode", &self.mode)
            .finish()
    }
}

impl FaultInjector {
    /// Loads the programs with `config` and attaches them: XDP (in `mode`)
    /// and tc egress on `interface`; with `detour` = `(near, far)`, the two
    /// ends of a veth pair in this namespace, delayed frames go out of
    /// `near` and the detour program on `far`'s ingress sends them back.
    /// Fails with [`Error::Busy`]-like errors when the interface carries
    /// an XDP program already.
    pub fn attach(
        interface: impl Into<Interface>,
        detour: Option<(Interface, Interface)>,
        mode: AttachMode,
        config: &FaultConfig,
    ) -> Result<Self> {
        let ifindex = resolve(&interface.into())?;
        let detour = match detour {
            Some((near, far)) => Some((resolve(&near)?, resolve(&far)?)),
            None => None,
        };
        let netns = File::open(THIS_NETNS).map_err(|e| Error::Interface(THIS_NETNS.into(), e))?;
        let cfg = config.to_bytes(1, detour.map_or(0, |(near, _)| near as u32))?;
        let skel = load(&cfg)?;
        let xdp_fd = skel.progs.iwarp_fault_xdp.as_fd();
        let xdp_prog_id = libbpf_rs::Program::id_from_fd(xdp_fd).map_err(bpf("program id"))?;
        let xdp = Xdp::new(xdp_fd);
        let attach = |m: ActiveMode| xdp.attach(ifindex, XdpFlags::UPDATE_IF_NOEXIST | m.flags());
        let mode = match mode {
            AttachMode::Native => attach(ActiveMode::Native)
                .map(|()| ActiveMode::Native)
                .map_err(bpf("attach XDP in native mode"))?,
            AttachMode::Generic => attach(ActiveMode::Generic)
                .map(|()| ActiveMode::Generic)
                .map_err(bpf("attach XDP in generic mode"))?,
            AttachMode::Auto => match attach(ActiveMode::Native) {
                Ok(()) => ActiveMode::Native,
                Err(_) => attach(ActiveMode::Generic)
                    .map(|()| ActiveMode::Generic)
                    .map_err(bpf("attach XDP in generic mode (native refused)"))?,
            },
        };
        let me = Self {
            skel,
            netns,
            ifindex,
            detour,
            mode,
            xdp_prog_id,
            generation: 1.into(),
        };
        // From here on, Drop undoes whatever part got attached.
        me.attach_tc(me.skel.progs.iwarp_fault_tc.as_fd(), ifindex, TC_EGRESS)?;
        if let Some((_, far)) = detour {
            me.attach_tc(me.skel.progs.iwarp_fault_detour.as_fd(), far, TC_INGRESS)?;
        }
        Ok(me)
    }

    fn attach_tc(&self, prog: BorrowedFd<'_>, ifindex: i32, point: u32) -> Result<()> {
        let mut hook = tc_hook(prog, ifindex, point);
        hook.create().map_err(bpf("create the clsact qdisc"))?;
        hook.attach().map_err(bpf("attach the tc program"))?;
        Ok(())
    }

    /// The interface index of the attach.
    pub fn ifindex(&self) -> u32 {
        self.ifindex as u32
    }

    /// The mode the XDP program runs in.
    pub fn mode(&self) -> ActiveMode {
        self.mode
    }

    /// Replaces the configuration and reseeds the generators; the
    /// corruption limit starts afresh. Frames in flight may see either.
    pub fn set_config(&self, config: &FaultConfig) -> Result<()> {
        use std::sync::atomic::Ordering;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let cfg = config.to_bytes(generation, self.detour.map_or(0, |(near, _)| near as u32))?;
        self.skel
            .maps
            .fault_state
            .update(&0u32.to_ne_bytes(), &0u64.to_ne_bytes(), MapFlags::ANY)
            .map_err(bpf("reset the fault state"))?;
        self.skel
            .maps
            .fault_cfg
            .update(&0u32.to_ne_bytes(), &cfg, MapFlags::ANY)
            .map_err(bpf("write the config map"))
    }

    /// The counters, summed over CPUs.
    pub fn counters(&self) -> Result<FaultCounters> {
        read_counters(&self.skel)
    }

    /// Detaches now, reporting the first error (dropping does the same
    /// silently).
    pub fn detach(self) -> Result<()> {
        self.detach_ref()
    }

    fn detach_ref(&self) -> Result<()> {
        in_netns(&self.netns, || self.detach_here())
            .map_err(|e| Error::Interface("network namespace of the attach".into(), e))?
    }

    fn detach_here(&self) -> Result<()> {
        let mut first: Result<()> = Ok(());
        let mut keep = |r: Result<()>| {
            if first.is_ok() {
                first = r;
            }
        };
        let xdp_fd = self.skel.progs.iwarp_fault_xdp.as_fd();
        let xdp = Xdp::new(xdp_fd);
        match xdp.query(self.ifindex, XdpFlags::NONE) {
            Ok(q) => {
                let current = match self.mode {
                    ActiveMode::Native => q.drv_prog_id,
                    ActiveMode::Generic => q.skb_prog_id,
                };
                if current == self.xdp_prog_id {
                    keep(
                        xdp.detach(self.ifindex, self.mode.flags())
                            .map_err(bpf("detach XDP")),
                    );
                }
            }
            Err(e) => keep(Err(Error::Bpf("query the interface", e))),
        }
        let tc_fd = self.skel.progs.iwarp_fault_tc.as_fd();
        let mut ifaces = vec![self.ifindex];
        ifaces.extend(self.detour.map(|(_, far)| far));
        for ifindex in ifaces {
            // Ingress and egress together: deletes the clsact qdisc and
            // with it our filter.
            let mut hook = tc_hook(tc_fd, ifindex, TC_INGRESS | TC_EGRESS);
            match hook.destroy() {
                Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => {}
                r => keep(r.map_err(bpf("remove the clsact qdisc"))),
            }
        }
        first
    }
}

impl Drop for FaultInjector {
    fn drop(&mut self) {
        // The interfaces may be gone already (namespace deleted).
        let _ = self.detach_ref();
    }
}

fn tc_hook(prog: BorrowedFd<'_>, ifindex: i32, point: u32) -> TcHook {
    TcHookBuilder::new(prog)
        .ifindex(ifindex)
        .replace(false)
        .handle(TC_HANDLE)
        .priority(TC_PRIORITY)
        .hook(point)
}

fn load(cfg: &[u8; CFG_SIZE]) -> Result<FaultSkel<'static>> {
    // As for the steering program: one pointer-sized slot leaked per load.
    let storage: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
    let open = FaultSkelBuilder::default()
        .open(storage)
        .map_err(bpf("open the BPF object"))?;
    let skel = open.load().map_err(bpf("load the fault programs"))?;
    skel.maps
        .fault_cfg
        .update(&0u32.to_ne_bytes(), cfg, MapFlags::ANY)
        .map_err(bpf("write the config map"))?;
    Ok(skel)
}

fn read_counters(skel: &FaultSkel<'_>) -> Result<FaultCounters> {
    let mut sums = [0u64; 8];
    for (i, sum) in sums.iter_mut().enumerate() {
        let per_cpu = skel
            .maps
            .fault_counters
            .lookup_percpu(&(i as u32).to_ne_bytes(), MapFlags::ANY)
            .map_err(bpf("read the counters"))?
            .unwrap_or_default();
        *sum = per_cpu
            .iter()
            .filter_map(|v| v.get(..8)?.try_into().ok())
            .map(u64::from_ne_bytes)
            .fold(0u64, u64::wrapping_add);
    }
    let [rx_seen, dropped, corrupted, tx_seen, duplicated, delayed, detour_passes, errors] = sums;
    Ok(FaultCounters {
        rx_seen,
        dropped,
        corrupted,
        tx_seen,
        duplicated,
        delayed,
        detour_passes,
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use libbpf_rs::ProgramInput;

    const XDP_DROP: u32 = 1;
    const XDP_PASS: u32 = 2;

    #[test]
    fn config_layout_matches_the_c_struct() {
        assert_eq!(CFG_SIZE, size_of::<skel::types::fault_config>());
        let c = FaultConfig {
            drop_ppm: 10,
            corrupt_ppm: 20,
            corrupt_limit: 3,
            duplicate_ppm: 30,
            delay_ppm: 40,
            delay_passes: 2,
            port: Some(7174),
            ..FaultConfig::new(0x0102_0304_0506_0708)
        };
        let b = c.to_bytes(9, 77).unwrap();
        assert_eq!(b[0..8], 0x0102_0304_0506_0708u64.to_ne_bytes());
        let word = |i: usize| u32::from_ne_bytes(b[8 + 4 * i..12 + 4 * i].try_into().unwrap());
        assert_eq!(
            (0..8).map(word).collect::<Vec<_>>(),
            [9, 10, 20, 30, 40, 2, 77, 3]
        );
        assert_eq!(b[40..42], 7174u16.to_ne_bytes());
        let bad = FaultConfig {
            drop_ppm: PPM + 1,
            ..FaultConfig::new(1)
        };
        assert!(matches!(bad.to_bytes(1, 0), Err(Error::Config(_))));
        let bad = FaultConfig {
            delay_passes: 0,
            ..FaultConfig::new(1)
        };
        assert!(matches!(bad.to_bytes(1, 0), Err(Error::Config(_))));
    }

    fn is_root() -> bool {
        let root = nix::unistd::geteuid().is_root();
        if !root {
            println!("note: not root, skipping (loading BPF needs CAP_BPF)");
        }
        root
    }

    /// One's-complement sum of `data` as big-endian words.
    fn sum16(data: &[u8], mut acc: u32) -> u32 {
        for c in data.chunks(2) {
            acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
        while acc > 0xffff {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc
    }

    /// The TCP checksum over the segment of an Ethernet/IPv4 frame
    /// verifies (the one's-complement sum is 0xffff).
    fn tcp_checksum_ok(frame: &[u8]) -> bool {
        let ip = &frame[14..34];
        let tcp = &frame[34..];
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&ip[12..20]);
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
        sum16(tcp, sum16(&pseudo, 0)) == 0xffff
    }

    /// An Ethernet/IPv4/TCP frame with `payload`, correct TCP checksum.
    fn frame(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0];
        let total = (20 + 20 + payload.len()) as u16;
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[0, 1, 0x40, 0, 64, 6, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2]);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        f.extend_from_slice(payload);
        let mut pseudo = vec![198, 18, 0, 1, 198, 18, 0, 2, 0, 6];
        pseudo.extend_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
        let ck = !(sum16(&f[34..], sum16(&pseudo, 0)) as u16);
        f[50..52].copy_from_slice(&ck.to_be_bytes());
        assert!(tcp_checksum_ok(&f));
        f
    }

    fn run_xdp(skel: &FaultSkel<'_>, input: &[u8]) -> (u32, Vec<u8>) {
        let mut out = vec![0u8; input.len()];
        let r = skel
            .progs
            .iwarp_fault_xdp
            .test_run(ProgramInput {
                data_in: Some(input),
                data_out: Some(&mut out),
                ..ProgramInput::default()
            })
            .expect("test run");
        (r.return_value, out)
    }

    /// Every corruption flips exactly one payload byte and leaves a TCP
    /// checksum that verifies; headers and payload-less segments are left
    /// alone; the limit holds; the same seed flips the same bytes.
    #[test]
    fn corruption_keeps_the_checksum_valid() {
        if !is_root() {
            return;
        }
        let cfg = FaultConfig {
            corrupt_ppm: PPM,
            corrupt_limit: 150,
            ..FaultConfig::new(42)
        };
        let run = |cfg: &FaultConfig| {
            let skel = load(&cfg.to_bytes(1, 0).unwrap()).expect("load");
            let mut flips = Vec::new();
            for i in 0..200usize {
                let payload: Vec<u8> = (0..(1 + i * 7) % 1460 + 1)
                    .map(|j| (j * 13 + i) as u8)
                    .collect();
                let f = frame(7174, 50000, &payload);
                let (action, out) = run_xdp(&skel, &f);
                assert_eq!(action, XDP_PASS);
                assert!(tcp_checksum_ok(&out), "checksum after corruption #{i}");
                assert_eq!(out[..50], f[..50], "headers untouched");
                let diff: Vec<usize> = (54..f.len()).filter(|&k| out[k] != f[k]).collect();
                assert!(diff.len() <= 1);
                flips.push(diff.first().map(|&k| (k, out[k] ^ f[k])));
            }
            // No payload: not corrupted, not counted.
            let (_, out) = run_xdp(&skel, &frame(7174, 50000, &[]));
            assert!(tcp_checksum_ok(&out));
            let c = read_counters(&skel).unwrap();
            (flips, c)
        };
        // The generators are per CPU: stay on one for reproducible runs.
        let mut one = nix::sched::CpuSet::new();
        one.set(0).unwrap();
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &one).unwrap();
        let (flips, c) = run(&cfg);
        assert_eq!(flips.iter().filter(|f| f.is_some()).count(), 150);
        assert_eq!((c.rx_seen, c.corrupted, c.dropped), (201, 150, 0));
        let (again, _) = run(&cfg);
        assert_eq!(flips, again, "same seed, same faults");
        let (other, _) = run(&FaultConfig { seed: 43, ..cfg });
        assert_ne!(flips, other);
    }

    /// Drop rate and port filter.
    #[test]
    fn drop_rate_and_port_filter() {
        if !is_root() {
            return;
        }
        let cfg = FaultConfig {
            drop_ppm: 250_000,
            port: Some(7174),
            ..FaultConfig::new(7)
        };
        let skel = load(&cfg.to_bytes(1, 0).unwrap()).expect("load");
        let mut dropped = 0;
        for _ in 0..2000 {
            let (a, _) = run_xdp(&skel, &frame(50000, 7174, b"x"));
            dropped += u32::from(a == XDP_DROP);
            let (a, _) = run_xdp(&skel, &frame(50000, 7175, b"x"));
            assert_eq!(a, XDP_PASS, "other port");
        }
        // 25 % of 2000, within a wide margin.
        assert!((350..650).contains(&dropped), "{dropped}");
        let c = read_counters(&skel).unwrap();
        assert_eq!((c.rx_seen, c.dropped), (2000, u64::from(dropped)));
    }
}
