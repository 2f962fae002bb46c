//! The device's configuration, read once from the environment when the
//! device is first opened.
//!
//! | variable | values | default | what |
//! |---|---|---|---|
//! | `IWARP_COMPAT_BACKEND` | `kernel`, `afxdp` | `kernel` | the engine's backend: kernel TCP sockets (unprivileged), or AF_XDP with the user-space TCP (root) |
//! | `IWARP_COMPAT_CRC` | `0`, `1` | `0` | ask for MPA CRC32c on every connection (used if either side asks) |
//! | `IWARP_COMPAT_MARKERS` | `0`, `1` | `0` | ask the peer for MPA markers |
//! | `IWARP_COMPAT_P2P` | `0`, `1` | `1` | connections the library initiates ask for RFC 6581 peer-to-peer mode ([`Config::conn_params`]) |
//! | `IWARP_COMPAT_CONNECT_DELAY` | milliseconds, 0 to 10000 | `0` | `rdma_connect`: hold the ESTABLISHED event this long after the connection is established, so the application's first message leaves that much later (Linux siw 6.1 as responder loses its first RDMA Read Request when the initiator's first FPDU arrives within a millisecond of its MPA Reply; librdmacm's `rping` over a kernel RNIC sends about 8 ms after it) |
//! | `IWARP_COMPAT_CONNECT_RETRY` | milliseconds, 0 to 60000 | `0` | `rdma_connect`: a connect the peer refuses (TCP reset: nobody listens) is tried again every 100 ms for this long before REJECTED is reported (perftest's client connects its test QP as soon as the handshake lets it, while its server listens only after the handshake, and perftest's own retry reuses the IDs it has destroyed) |
//! | `IWARP_COMPAT_CPU` | a CPU number | not pinned | pin the engine's progress thread (AF_XDP: the first engine's, unless `IWARP_COMPAT_XDP_CPUS` names one) |
//! | `IWARP_COMPAT_BUSY_POLL` | `0`, `1` | `0` | the progress threads spin instead of sleeping |
//!
//! With `IWARP_COMPAT_BACKEND=afxdp` (read only then):
//!
//! | variable | values | default | what |
//! |---|---|---|---|
//! | `IWARP_COMPAT_XDP_IF` | an interface name | none: required | the interface, in the process's network namespace |
//! | `IWARP_COMPAT_XDP_IP` | `ADDR/PREFIX` (IPv4) | the interface's first IPv4 address and its prefix | the engine's own address: it takes the TCP traffic of its ports and the ARP for it |
//! | `IWARP_COMPAT_XDP_GATEWAY` | an IPv4 address inside the prefix | none: only peers on the prefix | the default gateway |
//! | `IWARP_COMPAT_XDP_QUEUES` | receive queue numbers, comma-separated | `0` | one engine (AF_XDP socket, UMEM, TCP stack, progress thread) per queue |
//! | `IWARP_COMPAT_XDP_CPUS` | CPU numbers, comma-separated | not pinned | pin engine *i*'s progress thread to the *i*-th CPU |
//! | `IWARP_COMPAT_XDP_MODE` | `auto`, `native`, `generic` (or `skb`) | `auto` | how the steering XDP program attaches: driver mode, skb mode, or driver mode falling back to skb |
//! | `IWARP_COMPAT_XDP_MTU` | bytes, 576 to 65535 | the interface's MTU | the engine's IP MTU |
//! | `IWARP_COMPAT_XDP_FRAMES` | a count, 64 to 1048576 | `4096` | UMEM frames per engine (half for receiving) |
//! | `IWARP_COMPAT_XDP_PCAP` | a file | none | write every frame the engine receives or sends to this pcap file |
//!
//! An unknown backend or a malformed value makes opening the device fail
//! (`ibv_get_device_list` lists no device, errno ENODEV; `rdma_*` calls
//! fail with ENODEV), with one line on stderr saying which variable.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use iwarp_engine::xdp::AttachMode;
use iwarp_engine::{Backend, ConnParams, DeviceConfig, Progress, XdpConfig};

/// What the environment asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The engine's backend.
    pub backend: Backend,
    /// The engine's progress thread.
    pub device: DeviceConfig,
    /// MPA CRC requested on every connection.
    pub crc: bool,
    /// MPA markers requested on every connection.
    pub markers: bool,
    /// RFC 6581 peer-to-peer mode asked for by the connections the
    /// library initiates.
    pub p2p: bool,
    /// How long `rdma_connect` holds the ESTABLISHED event back.
    pub connect_delay: Duration,
    /// How long `rdma_connect` tries again a connect the peer refused.
    pub connect_retry: Duration,
}

/// The pause between two attempts of a refused connect
/// (`IWARP_COMPAT_CONNECT_RETRY`).
pub const CONNECT_RETRY_PAUSE: Duration = Duration::from_millis(100);

/// What the configuration takes from an interface when the environment
/// leaves it out ([`Iface::of`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Iface {
    /// The interface's first IPv4 address and its prefix length.
    pub ipv4: Option<(Ipv4Addr, u8)>,
    /// The interface's MTU.
    pub mtu: usize,
}

impl Iface {
    /// Read interface `name` of the calling thread's network namespace:
    /// its addresses through `getifaddrs` (netlink), its MTU from
    /// `/sys/class/net/NAME/mtu` (sysfs as mounted for the namespace, as
    /// `ip netns exec` does).
    pub fn of(name: &str) -> Result<Self, String> {
        let path = format!("/sys/class/net/{name}/mtu");
        let mtu = std::fs::read_to_string(&path)
            .map_err(|e| format!("IWARP_COMPAT_XDP_IF={name}: {path}: {e}"))?
            .trim()
            .parse::<usize>()
            .map_err(|e| format!("IWARP_COMPAT_XDP_IF={name}: {path}: {e}"))?;
        let addrs = nix::ifaddrs::getifaddrs()
            .map_err(|e| format!("IWARP_COMPAT_XDP_IF={name}: getifaddrs: {e}"))?;
        let ipv4 = addrs.filter(|a| a.interface_name == name).find_map(|a| {
            let ip = a.address?.as_sockaddr_in()?.ip();
            let mask = a.netmask?.as_sockaddr_in()?.ip();
            Some((ip, u32::from(mask).leading_ones() as u8))
        });
        Ok(Self { ipv4, mtu })
    }
}

fn flag(name: &str, get: &impl Fn(&str) -> Option<String>) -> Result<bool, String> {
    match get(name).as_deref() {
        None | Some("0") | Some("") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(format!("{name}={v}: expected 0 or 1")),
    }
}

/// A number of `name` within `range`, if set.
fn number<T>(
    name: &str,
    range: std::ops::RangeInclusive<T>,
    what: &str,
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<T>, String>
where
    T: std::str::FromStr + PartialOrd,
{
    let Some(v) = get(name) else {
        return Ok(None);
    };
    match v.parse::<T>() {
        Ok(n) if range.contains(&n) => Ok(Some(n)),
        _ => Err(format!("{name}={v}: expected {what}")),
    }
}

/// A comma-separated list of numbers of `name`, if set (no entry empty,
/// none twice).
fn list<T>(
    name: &str,
    what: &str,
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<Vec<T>>, String>
where
    T: std::str::FromStr + PartialEq,
{
    let Some(v) = get(name) else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for part in v.split(',') {
        match part.trim().parse::<T>() {
            Ok(n) if !out.contains(&n) => out.push(n),
            _ => return Err(format!("{name}={v}: expected {what}, comma-separated")),
        }
    }
    Ok(Some(out))
}

/// An IPv4 address of `name`, if set.
fn ipv4(name: &str, get: &impl Fn(&str) -> Option<String>) -> Result<Option<Ipv4Addr>, String> {
    let Some(v) = get(name) else {
        return Ok(None);
    };
    v.parse()
        .map(Some)
        .map_err(|_| format!("{name}={v}: expected an IPv4 address"))
}

/// `ADDR/PREFIX` of `name`, if set.
fn cidr(
    name: &str,
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<(Ipv4Addr, u8)>, String> {
    let Some(v) = get(name) else {
        return Ok(None);
    };
    let bad = || format!("{name}={v}: expected ADDR/PREFIX (IPv4, prefix 0 to 32)");
    let (a, p) = v.split_once('/').ok_or_else(bad)?;
    let ip: Ipv4Addr = a.parse().map_err(|_| bad())?;
    match p.parse::<u8>() {
        Ok(prefix) if prefix <= 32 => Ok(Some((ip, prefix))),
        _ => Err(bad()),
    }
}

/// Whether `a` and `b` share the first `prefix` bits.
fn same_net(a: Ipv4Addr, b: Ipv4Addr, prefix: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    u32::from(a) & mask == u32::from(b) & mask
}

/// The AF_XDP backend's configuration from the `IWARP_COMPAT_XDP_*`
/// variables, with what they leave out from `iface`.
fn xdp_config(
    get: &impl Fn(&str) -> Option<String>,
    iface: impl Fn(&str) -> Result<Iface, String>,
    busy_poll: bool,
) -> Result<XdpConfig, String> {
    let ifname = match get("IWARP_COMPAT_XDP_IF") {
        Some(v) if !v.is_empty() && v.len() < 16 && !v.contains(['/', ' ']) => v,
        Some(v) => {
            return Err(format!(
                "IWARP_COMPAT_XDP_IF={v}: expected an interface name"
            ))
        }
        None => {
            return Err(
                "IWARP_COMPAT_BACKEND=afxdp needs IWARP_COMPAT_XDP_IF (the interface)".to_string(),
            )
        }
    };
    let ip = cidr("IWARP_COMPAT_XDP_IP", get)?;
    let mtu = number(
        "IWARP_COMPAT_XDP_MTU",
        576..=65535,
        "an MTU from 576 to 65535",
        get,
    )?;
    let info = if ip.is_none() || mtu.is_none() {
        Some(iface(&ifname)?)
    } else {
        None
    };
    let (ip, prefix) = match (ip, &info) {
        (Some(a), _) => a,
        (None, Some(Iface { ipv4: Some(a), .. })) => *a,
        (None, _) => {
            return Err(format!(
                "IWARP_COMPAT_XDP_IP is not set and interface {ifname} has no IPv4 address"
            ))
        }
    };
    let mut cfg = XdpConfig::new(ifname, ip, prefix);
    cfg.mtu = match (mtu, &info) {
        (Some(m), _) => m,
        (None, Some(i)) => i.mtu,
        (None, None) => cfg.mtu,
    };
    cfg.busy_poll = busy_poll;
    if let Some(gw) = ipv4("IWARP_COMPAT_XDP_GATEWAY", get)? {
        if !same_net(gw, ip, prefix) || gw == ip {
            return Err(format!(
                "IWARP_COMPAT_XDP_GATEWAY={gw}: not another address of {ip}/{prefix}"
            ));
        }
        cfg.gateway = Some(gw);
    }
    match list::<u32>("IWARP_COMPAT_XDP_QUEUES", "queue numbers", get)? {
        None => {}
        Some(q) if q.len() == 1 => cfg.queue = q[0],
        Some(q) => cfg.queues = q,
    }
    if let Some(c) = list::<usize>("IWARP_COMPAT_XDP_CPUS", "CPU numbers", get)? {
        cfg.cpus = c;
    }
    cfg.attach = match get("IWARP_COMPAT_XDP_MODE").as_deref() {
        None | Some("auto") => AttachMode::Auto,
        Some("native") => AttachMode::Native,
        Some("generic" | "skb") => AttachMode::Generic,
        Some(v) => {
            return Err(format!(
                "IWARP_COMPAT_XDP_MODE={v}: expected auto, native, generic or skb"
            ))
        }
    };
    if let Some(n) = number(
        "IWARP_COMPAT_XDP_FRAMES",
        64..=1 << 20,
        "a frame count from 64 to 1048576",
        get,
    )? {
        cfg.frames = n;
    }
    match get("IWARP_COMPAT_XDP_PCAP") {
        None => {}
        Some(v) if v.is_empty() => {
            return Err("IWARP_COMPAT_XDP_PCAP=: expected a file name".to_string())
        }
        Some(v) => cfg.pcap = Some(PathBuf::from(v)),
    }
    Ok(cfg)
}

impl Config {
    /// Read the configuration through `get` (the environment, or a map in
    /// tests), with the AF_XDP interface's address and MTU from the
    /// system ([`Iface::of`]) where the environment leaves them out.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        Self::from_lookups(get, Iface::of)
    }

    /// [`Self::from_lookup`] with the interface read through `iface`.
    pub fn from_lookups(
        get: impl Fn(&str) -> Option<String>,
        iface: impl Fn(&str) -> Result<Iface, String>,
    ) -> Result<Self, String> {
        let cpu = number("IWARP_COMPAT_CPU", 0..=usize::MAX, "a CPU number", &get)?;
        let busy_poll = flag("IWARP_COMPAT_BUSY_POLL", &get)?;
        let backend = match get("IWARP_COMPAT_BACKEND").as_deref() {
            None | Some("kernel") => Backend::Kernel,
            Some("afxdp") => Backend::AfXdp(xdp_config(&get, iface, busy_poll)?),
            Some(v) => {
                return Err(format!(
                    "IWARP_COMPAT_BACKEND={v}: expected kernel or afxdp"
                ))
            }
        };
        Ok(Self {
            backend,
            device: DeviceConfig {
                progress: Progress::Thread { cpu },
                busy_poll,
                ..DeviceConfig::default()
            },
            crc: flag("IWARP_COMPAT_CRC", &get)?,
            markers: flag("IWARP_COMPAT_MARKERS", &get)?,
            p2p: get("IWARP_COMPAT_P2P").is_none() || flag("IWARP_COMPAT_P2P", &get)?,
            connect_delay: Duration::from_millis(
                number(
                    "IWARP_COMPAT_CONNECT_DELAY",
                    0..=10_000,
                    "milliseconds from 0 to 10000",
                    &get,
                )?
                .unwrap_or(0),
            ),
            connect_retry: Duration::from_millis(
                number(
                    "IWARP_COMPAT_CONNECT_RETRY",
                    0..=60_000,
                    "milliseconds from 0 to 60000",
                    &get,
                )?
                .unwrap_or(0),
            ),
        })
    }

    /// Read the configuration from the process environment.
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The AF_XDP engine's own address (`None` on the kernel backend,
    /// whose connections leave from the address the kernel routes from).
    pub fn local_ip(&self) -> Option<Ipv4Addr> {
        match &self.backend {
            Backend::AfXdp(x) => Some(x.ip),
            Backend::Link(end) => Some(end.config().ip),
            Backend::Kernel => None,
        }
    }

    /// The connection parameters every connection starts from.
    ///
    /// Unless `IWARP_COMPAT_P2P=0`, connections the library initiates ask
    /// for RFC 6581 peer-to-peer mode: the initiator's first FPDU is a
    /// ready-to-receive message, so the responder, which RFC 5044 §7.1.2
    /// keeps silent until that first FPDU arrives, may send first
    /// (perftest's `ib_write_lat` server writes before its client does).
    /// A responder without P2P answers without it and the connection goes
    /// on as in RFC 5044.
    pub fn conn_params(&self) -> ConnParams {
        ConnParams {
            crc: self.crc,
            markers: self.markers,
            p2p: self.p2p,
            ..ConnParams::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, String> {
        let m = map(pairs);
        Config::from_lookup(|k| m.get(k).cloned())
    }

    /// The configuration with interface `veth0` (198.18.7.1/24, MTU 1500)
    /// standing in for the system's; other interfaces do not exist.
    fn xcfg(pairs: &[(&str, &str)]) -> Result<Config, String> {
        let m = map(pairs);
        Config::from_lookups(
            |k| m.get(k).cloned(),
            |name| match name {
                "veth0" => Ok(Iface {
                    ipv4: Some((Ipv4Addr::new(198, 18, 7, 1), 24)),
                    mtu: 1500,
                }),
                "bare0" => Ok(Iface {
                    ipv4: None,
                    mtu: 3506,
                }),
                _ => Err(format!("IWARP_COMPAT_XDP_IF={name}: no such interface")),
            },
        )
    }

    fn xdp(pairs: &[(&str, &str)]) -> XdpConfig {
        let mut all = vec![("IWARP_COMPAT_BACKEND", "afxdp")];
        all.extend_from_slice(pairs);
        match xcfg(&all) {
            Ok(Config {
                backend: Backend::AfXdp(x),
                ..
            }) => x,
            other => panic!("{pairs:?}: {other:?}"),
        }
    }

    fn xdp_err(pairs: &[(&str, &str)]) -> String {
        let mut all = vec![("IWARP_COMPAT_BACKEND", "afxdp")];
        all.extend_from_slice(pairs);
        match xcfg(&all) {
            Err(e) => e,
            Ok(c) => panic!("{pairs:?} accepted: {c:?}"),
        }
    }

    #[test]
    fn defaults_are_the_kernel_backend_without_crc_or_markers() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.backend, Backend::Kernel);
        assert_eq!(c.device.progress, Progress::Thread { cpu: None });
        assert!(!c.crc && !c.markers && !c.device.busy_poll);
        assert!(c.conn_params().p2p);
        assert_eq!(c.connect_delay, Duration::ZERO);
        assert_eq!(c.connect_retry, Duration::ZERO);
        assert_eq!(c.local_ip(), None);
    }

    #[test]
    fn variables_are_honoured_and_bad_values_refused() {
        let c = cfg(&[
            ("IWARP_COMPAT_CRC", "1"),
            ("IWARP_COMPAT_MARKERS", "1"),
            ("IWARP_COMPAT_CPU", "1"),
            ("IWARP_COMPAT_BUSY_POLL", "1"),
        ])
        .unwrap();
        assert!(c.crc && c.markers && c.device.busy_poll);
        assert_eq!(c.device.progress, Progress::Thread { cpu: Some(1) });
        assert!(c.conn_params().crc && c.conn_params().markers);
        assert!(c.conn_params().p2p);
        let c = cfg(&[("IWARP_COMPAT_P2P", "0")]).unwrap();
        assert!(!c.p2p && !c.conn_params().p2p);
        assert!(cfg(&[("IWARP_COMPAT_P2P", "1")]).unwrap().conn_params().p2p);
        assert!(cfg(&[("IWARP_COMPAT_P2P", "no")]).is_err());
        assert_eq!(
            cfg(&[("IWARP_COMPAT_CONNECT_DELAY", "20")])
                .unwrap()
                .connect_delay,
            Duration::from_millis(20)
        );
        assert!(cfg(&[("IWARP_COMPAT_CONNECT_DELAY", "-1")]).is_err());
        assert!(cfg(&[("IWARP_COMPAT_CONNECT_DELAY", "10001")]).is_err());
        assert_eq!(
            cfg(&[("IWARP_COMPAT_CONNECT_RETRY", "5000")])
                .unwrap()
                .connect_retry,
            Duration::from_secs(5)
        );
        assert!(cfg(&[("IWARP_COMPAT_CONNECT_RETRY", "60001")]).is_err());
        assert!(cfg(&[("IWARP_COMPAT_CONNECT_RETRY", "soon")]).is_err());
        assert!(cfg(&[("IWARP_COMPAT_BACKEND", "xdp")]).is_err());
        assert!(cfg(&[("IWARP_COMPAT_CRC", "yes")]).is_err());
        assert!(cfg(&[("IWARP_COMPAT_CPU", "x")]).is_err());
    }

    #[test]
    fn the_kernel_backend_reads_no_xdp_variable() {
        let c = xcfg(&[
            ("IWARP_COMPAT_BACKEND", "kernel"),
            ("IWARP_COMPAT_XDP_IF", "no-such-if"),
            ("IWARP_COMPAT_XDP_MODE", "bogus"),
        ])
        .unwrap();
        assert_eq!(c.backend, Backend::Kernel);
    }

    #[test]
    fn afxdp_takes_address_prefix_and_mtu_from_the_interface() {
        let x = xdp(&[("IWARP_COMPAT_XDP_IF", "veth0")]);
        let mut want = XdpConfig::new("veth0", Ipv4Addr::new(198, 18, 7, 1), 24);
        want.busy_poll = false;
        assert_eq!(x, want);
        assert_eq!(x.mtu, 1500);
        assert_eq!(x.attach, AttachMode::Auto);
        let c = xcfg(&[
            ("IWARP_COMPAT_BACKEND", "afxdp"),
            ("IWARP_COMPAT_XDP_IF", "veth0"),
        ])
        .unwrap();
        assert_eq!(c.local_ip(), Some(Ipv4Addr::new(198, 18, 7, 1)));
        assert_eq!(c.device.progress, Progress::Thread { cpu: None });
        assert!(!c.device.busy_poll);
    }

    #[test]
    fn afxdp_variables_reach_the_engine_config() {
        let x = xdp(&[
            ("IWARP_COMPAT_XDP_IF", "bare0"),
            ("IWARP_COMPAT_XDP_IP", "198.18.9.3/16"),
            ("IWARP_COMPAT_XDP_GATEWAY", "198.18.0.1"),
            ("IWARP_COMPAT_XDP_QUEUES", "0,1"),
            ("IWARP_COMPAT_XDP_CPUS", "1, 0"),
            ("IWARP_COMPAT_XDP_MODE", "skb"),
            ("IWARP_COMPAT_XDP_FRAMES", "8192"),
            ("IWARP_COMPAT_XDP_PCAP", "/tmp/x.pcap"),
            ("IWARP_COMPAT_BUSY_POLL", "1"),
        ]);
        assert_eq!(x.ifname, "bare0");
        assert_eq!((x.ip, x.prefix), (Ipv4Addr::new(198, 18, 9, 3), 16));
        assert_eq!(x.gateway, Some(Ipv4Addr::new(198, 18, 0, 1)));
        assert_eq!(x.queues, vec![0, 1]);
        assert_eq!(x.cpus, vec![1, 0]);
        assert_eq!(x.attach, AttachMode::Generic);
        assert_eq!(x.frames, 8192);
        assert_eq!(x.mtu, 3506, "the interface's MTU");
        assert_eq!(x.pcap, Some(PathBuf::from("/tmp/x.pcap")));
        assert!(x.busy_poll);

        let x = xdp(&[
            ("IWARP_COMPAT_XDP_IF", "veth0"),
            ("IWARP_COMPAT_XDP_QUEUES", "3"),
            ("IWARP_COMPAT_XDP_MODE", "native"),
            ("IWARP_COMPAT_XDP_MTU", "3506"),
        ]);
        assert_eq!((x.queue, x.queues.len()), (3, 0));
        assert_eq!(x.attach, AttachMode::Native);
        assert_eq!(x.mtu, 3506);
        assert_eq!(x.ip, Ipv4Addr::new(198, 18, 7, 1));
        assert_eq!(
            xdp(&[
                ("IWARP_COMPAT_XDP_IF", "veth0"),
                ("IWARP_COMPAT_XDP_MODE", "generic")
            ])
            .attach,
            AttachMode::Generic
        );
        assert_eq!(
            xdp(&[
                ("IWARP_COMPAT_XDP_IF", "veth0"),
                ("IWARP_COMPAT_XDP_MODE", "auto")
            ])
            .attach,
            AttachMode::Auto
        );
    }

    #[test]
    fn address_and_mtu_given_need_no_interface_lookup() {
        // "gone0" fails the lookup; with both given it is not looked up
        // (opening the device then finds out whether it exists).
        let x = xdp(&[
            ("IWARP_COMPAT_XDP_IF", "gone0"),
            ("IWARP_COMPAT_XDP_IP", "198.18.0.3/24"),
            ("IWARP_COMPAT_XDP_MTU", "1500"),
        ]);
        assert_eq!((x.ifname.as_str(), x.mtu), ("gone0", 1500));
        assert!(xdp_err(&[
            ("IWARP_COMPAT_XDP_IF", "gone0"),
            ("IWARP_COMPAT_XDP_IP", "198.18.0.3/24"),
        ])
        .contains("no such interface"));
    }

    #[test]
    fn afxdp_bad_values_name_their_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[], "IWARP_COMPAT_XDP_IF"),
            (&[("IWARP_COMPAT_XDP_IF", "")], "IWARP_COMPAT_XDP_IF"),
            (
                &[("IWARP_COMPAT_XDP_IF", "a-name-over-15-bytes")],
                "IWARP_COMPAT_XDP_IF",
            ),
            (&[("IWARP_COMPAT_XDP_IF", "bare0")], "IWARP_COMPAT_XDP_IP"),
            (&[("IWARP_COMPAT_XDP_IF", "nope0")], "IWARP_COMPAT_XDP_IF"),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_XDP_IP", "198.18.0.3"),
                ],
                "IWARP_COMPAT_XDP_IP",
            ),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_XDP_IP", "198.18.0.3/33"),
                ],
                "IWARP_COMPAT_XDP_IP",
            ),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_XDP_IP", "::1/64"),
                ],
                "IWARP_COMPAT_XDP_IP",
            ),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_XDP_GATEWAY", "10.0.0.1"),
                ],
                "IWARP_COMPAT_XDP_GATEWAY",
            ),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_XDP_GATEWAY", "198.18.7.1"),
                ],
                "IWARP_COMPAT_XDP_GATEWAY",
            ),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_XDP_GATEWAY", "gw"),
                ],
                "IWARP_COMPAT_XDP_GATEWAY",
            ),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_XDP_QUEUES", ""),
                ],
                "IWARP_COMPAT_XDP_QUEUES",
            ),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_XDP_QUEUES", "0,0"),
                ],
                "IWARP_COMPAT_XDP_QUEUES",
            ),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_XDP_QUEUES", "0,x"),
                ],
                "IWARP_COMPAT_XDP_QUEUES",
            ),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_XDP_CPUS", "-1"),
                ],
                "IWARP_COMPAT_XDP_CPUS",
            ),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_XDP_MODE", "drv"),
                ],
                "IWARP_COMPAT_XDP_MODE",
            ),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_XDP_MTU", "65536"),
                ],
                "IWARP_COMPAT_XDP_MTU",
            ),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_XDP_MTU", "big"),
                ],
                "IWARP_COMPAT_XDP_MTU",
            ),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_XDP_FRAMES", "8"),
                ],
                "IWARP_COMPAT_XDP_FRAMES",
            ),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_XDP_PCAP", ""),
                ],
                "IWARP_COMPAT_XDP_PCAP",
            ),
            (
                &[
                    ("IWARP_COMPAT_XDP_IF", "veth0"),
                    ("IWARP_COMPAT_BUSY_POLL", "on"),
                ],
                "IWARP_COMPAT_BUSY_POLL",
            ),
        ];
        for (pairs, var) in cases {
            let e = xdp_err(pairs);
            assert!(e.contains(var), "{pairs:?}: {e:?} does not name {var}");
        }
    }

    #[test]
    fn the_systems_loopback_interface_is_read() {
        // Every network namespace has `lo`, 127.0.0.1/8.
        let lo = Iface::of("lo").unwrap();
        assert_eq!(lo.ipv4, Some((Ipv4Addr::LOCALHOST, 8)));
        assert!(lo.mtu >= 1500);
        assert!(Iface::of("iwarp-none0").is_err());
    }
}
