//! `CmError::Unreachable`: a connect from a network namespace that has no
//! route to the peer (only loopback, created by this test and deleted even
//! when it fails) fails at once with the typed error. Root only.

use std::fs::File;
use std::os::fd::AsFd;
use std::process::Command;

use iwarp_engine::{Backend, CmError, ConnParams, Device, DeviceConfig, QpInit};
use nix::sched::{setns, CloneFlags};

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn connect_without_a_route_is_unreachable() {
    if !nix::unistd::geteuid().is_root() {
        println!("note: not root, skipping (needs a network namespace)");
        return;
    }
    let ns = Netns(format!("iwu{}", std::process::id()));
    let ok = Command::new("ip")
        .args(["netns", "add", &ns.0])
        .status()
        .expect("ip");
    assert!(ok.success());
    let _ = Command::new("ip")
        .args(["-n", &ns.0, "link", "set", "lo", "up"])
        .status();
    let file = File::open(format!("/run/netns/{}", ns.0)).expect("namespace file");
    let r = std::thread::spawn(move || {
        setns(file.as_fd(), CloneFlags::CLONE_NEWNET).expect("setns");
        let dev = Device::open(Backend::Kernel, DeviceConfig::default()).expect("device");
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(16);
        let init = QpInit {
            pd,
            send_cq: cq.clone(),
            recv_cq: cq,
            sq_depth: 4,
            rq_depth: 4,
            sig_all: false,
            srq: None,
        };
        dev.connect(
            "198.18.0.99:7174".parse().unwrap(),
            init,
            ConnParams::default(),
        )
        .map(|_| ())
    })
    .join()
    .expect("thread");
    assert_eq!(r, Err(CmError::Unreachable));
}
