//! The backend choice every tool offers: the kernel-socket backend by
//! default, or the AF_XDP engine on a given interface (`--xdp IFNAME
//! --xdp-ip ADDR/PREFIX`), with one flattened set of clap flags.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use clap::Args;
use iwarp_engine::{Backend, XdpConfig};

/// Flags that select and configure the backend.
#[derive(Args, Debug, Clone, Default)]
pub struct BackendArgs {
    /// Run over the AF_XDP engine on this interface instead of kernel
    /// TCP (needs root; the stack then owns `--xdp-ip`).
    #[arg(long, value_name = "IFNAME", requires = "xdp_ip")]
    pub xdp: Option<String>,
    /// The AF_XDP engine's own address and prefix, e.g. 198.18.0.1/24
    /// (not the kernel's address of the interface).
    #[arg(long, value_name = "ADDR/PREFIX", value_parser = parse_cidr, requires = "xdp")]
    pub xdp_ip: Option<(Ipv4Addr, u8)>,
    /// AF_XDP: receive queue to bind.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub xdp_queue: u32,
    /// AF_XDP: write every frame of the engine to this pcap file.
    #[arg(long, value_name = "FILE", requires = "xdp")]
    pub xdp_pcap: Option<PathBuf>,
}

impl BackendArgs {
    /// The backend these flags select. The AF_XDP engine takes the MTU
    /// of the interface.
    pub fn backend(&self) -> Result<Backend, String> {
        let (Some(ifname), Some((ip, prefix))) = (&self.xdp, self.xdp_ip) else {
            return Ok(Backend::Kernel);
        };
        let mut cfg = XdpConfig::new(ifname.clone(), ip, prefix);
        cfg.queue = self.xdp_queue;
        cfg.pcap = self.xdp_pcap.clone();
        let path = format!("/sys/class/net/{ifname}/mtu");
        let mtu = std::fs::read_to_string(&path)
            .map_err(|e| format!("{path}: {e}"))?
            .trim()
            .parse::<usize>()
            .map_err(|e| format!("{path}: {e}"))?;
        cfg.mtu = mtu;
        Ok(Backend::AfXdp(cfg))
    }

    /// Whether the AF_XDP engine is selected.
    pub fn is_xdp(&self) -> bool {
        self.xdp.is_some()
    }
}

/// Parses `ADDR/PREFIX`.
pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (a, p) = s
        .split_once('/')
        .ok_or_else(|| format!("{s}: expected ADDR/PREFIX"))?;
    let ip: Ipv4Addr = a.parse().map_err(|e| format!("{a}: {e}"))?;
    let prefix: u8 = p.parse().map_err(|e| format!("{p}: {e}"))?;
    if prefix > 32 {
        return Err(format!("{prefix}: prefix over 32"));
    }
    Ok((ip, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr() {
        assert_eq!(
            parse_cidr("198.18.0.1/24"),
            Ok((Ipv4Addr::new(198, 18, 0, 1), 24))
        );
        assert!(parse_cidr("198.18.0.1").is_err());
        assert!(parse_cidr("198.18.0.1/33").is_err());
        assert!(parse_cidr("x/24").is_err());
    }

    #[test]
    fn kernel_by_default() {
        assert!(matches!(
            BackendArgs::default().backend(),
            Ok(Backend::Kernel)
        ));
    }
}
