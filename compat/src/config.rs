//! The device's configuration, read once from the environment when the
//! device is first opened.
//!
//! | variable | values | default | what |
//! |---|---|---|---|
//! | `IWARP_COMPAT_BACKEND` | `kernel` | `kernel` | the engine's backend: kernel TCP sockets (unprivileged) |
//! | `IWARP_COMPAT_CRC` | `0`, `1` | `0` | ask for MPA CRC32c on every connection (used if either side asks) |
//! | `IWARP_COMPAT_MARKERS` | `0`, `1` | `0` | ask the peer for MPA markers |
//! | `IWARP_COMPAT_CPU` | a CPU number | not pinned | pin the engine's progress thread |
//! | `IWARP_COMPAT_BUSY_POLL` | `0`, `1` | `0` | the progress thread spins instead of sleeping |
//!
//! An unknown backend or a malformed value makes opening the device fail
//! (`ibv_get_device_list` lists no device, errno ENODEV; `rdma_*` calls
//! fail with ENODEV), with one line on stderr saying which variable.

use iwarp_engine::{Backend, ConnParams, DeviceConfig, Progress};

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
}

fn flag(name: &str, get: &impl Fn(&str) -> Option<String>) -> Result<bool, String> {
    match get(name).as_deref() {
        None | Some("0") | Some("") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(format!("{name}={v}: expected 0 or 1")),
    }
}

impl Config {
    /// Read the configuration through `get` (the environment, or a map in
    /// tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let backend = match get("IWARP_COMPAT_BACKEND").as_deref() {
            None | Some("kernel") => Backend::Kernel,
            Some(v) => return Err(format!("IWARP_COMPAT_BACKEND={v}: expected kernel")),
        };
        let cpu = match get("IWARP_COMPAT_CPU") {
            None => None,
            Some(v) => Some(
                v.parse::<usize>()
                    .map_err(|_| format!("IWARP_COMPAT_CPU={v}: expected a CPU number"))?,
            ),
        };
        Ok(Self {
            backend,
            device: DeviceConfig {
                progress: Progress::Thread { cpu },
                busy_poll: flag("IWARP_COMPAT_BUSY_POLL", &get)?,
                ..DeviceConfig::default()
            },
            crc: flag("IWARP_COMPAT_CRC", &get)?,
            markers: flag("IWARP_COMPAT_MARKERS", &get)?,
        })
    }

    /// Read the configuration from the process environment.
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The connection parameters every connection starts from.
    ///
    /// Connections the library initiates ask for RFC 6581 peer-to-peer
    /// mode: the initiator's first FPDU is a ready-to-receive message, so
    /// the responder, which RFC 5044 §7.1.2 keeps silent until that first
    /// FPDU arrives, may send first (perftest's `ib_write_lat` server
    /// writes before its client does). A responder without P2P answers
    /// without it and the connection goes on as in RFC 5044.
    pub fn conn_params(&self) -> ConnParams {
        ConnParams {
            crc: self.crc,
            markers: self.markers,
            p2p: true,
            ..ConnParams::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_are_the_kernel_backend_without_crc_or_markers() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.backend, Backend::Kernel);
        assert_eq!(c.device.progress, Progress::Thread { cpu: None });
        assert!(!c.crc && !c.markers && !c.device.busy_poll);
        assert!(c.conn_params().p2p);
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
        assert!(cfg(&[("IWARP_COMPAT_BACKEND", "afxdp")]).is_err());
        assert!(cfg(&[("IWARP_COMPAT_CRC", "yes")]).is_err());
        assert!(cfg(&[("IWARP_COMPAT_CPU", "x")]).is_err());
    }
}
