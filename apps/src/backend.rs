//! The backend choice every tool offers: the kernel-socket backend by
//! default, or the AF_XDP engine on a given interface (`--xdp IFNAME
//! --xdp-ip ADDR/PREFIX`), with one flattened set of clap flags.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use iwarp_engine::xdp::AttachMode;
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
    /// AF_XDP: how the steering program attaches. `generic` is the faster
    /// mode on veth when the kernel peer sends no TSO/GSO packets larger
    /// than a frame; `auto` tries native first.
    #[arg(long, value_enum, default_value_t = XdpMode::Auto, requires = "xdp")]
    pub xdp_mode: XdpMode,
}

/// `--xdp-mode`: the engine's [`AttachMode`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum XdpMode {
    /// Native, falling back to generic when the driver refuses.
    #[default]
    Auto,
    /// Driver mode only.
    Native,
    /// Skb mode.
    Generic,
}

impl From<XdpMode> for AttachMode {
    fn from(m: XdpMode) -> Self {
        match m {
            XdpMode::Auto => Self::Auto,
            XdpMode::Native => Self::Native,
            XdpMode::Generic => Self::Generic,
        }
    }
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
        cfg.attach = self.xdp_mode.into();
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
    fn xdp_mode_reaches_the_config() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            b: BackendArgs,
        }
        use clap::Parser;
        let parse = |extra: &[&str]| {
            let mut args = vec!["x", "--xdp", "lo", "--xdp-ip", "198.18.0.1/24"];
            args.extend_from_slice(extra);
            match Cli::try_parse_from(args).unwrap().b.backend() {
                Ok(Backend::AfXdp(c)) => c.attach,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(parse(&[]), AttachMode::Auto);
        assert_eq!(parse(&["--xdp-mode", "generic"]), AttachMode::Generic);
        assert_eq!(parse(&["--xdp-mode", "native"]), AttachMode::Native);
        assert!(Cli::try_parse_from(["x", "--xdp-mode", "generic"]).is_err());
    }

    #[test]
    fn kernel_by_default() {
        assert!(matches!(
            BackendArgs::default().backend(),
            Ok(Backend::Kernel)
        ));
    }
}
