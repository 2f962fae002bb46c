//! The engine's `tracing` output over loopback (kernel backend): a
//! connection's lifecycle events, from the core and from the engine, on
//! the application's and the progress threads, belong to the `conn` span
//! of that QP; device start and stop are logged in the device's span.
//!
//! Progress threads are other threads, so this test binary installs one
//! global capturing subscriber; tests running in parallel pick out their
//! own records by something unique to them (their connection's addresses,
//! their thread, their device's span). As root, the AF_XDP backend's
//! attach is checked too, in namespaces of its own.

mod common;

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use iwarp_capture::log::{Capture, Record as Rec};
use iwarp_engine::xdp::AttachMode;
use iwarp_engine::{
    Backend, CmEvent, ConnParams, Device, DeviceConfig, Progress, QpInit, XdpConfig,
};
use tracing::Level;
use tracing_subscriber::layer::SubscriberExt;

const WAIT: Duration = Duration::from_secs(30);

/// The process-wide capturing subscriber, installed once.
fn capture() -> &'static Capture {
    static CAP: OnceLock<Capture> = OnceLock::new();
    CAP.get_or_init(|| {
        let cap = Capture::default();
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(cap.clone()))
            .expect("no other global subscriber in this test binary");
        cap
    })
}

fn records(keep: impl Fn(&Rec) -> bool) -> Vec<Rec> {
    capture().records(keep)
}

/// Wait (bounded) until the records `keep` selects include every message
/// of `want`; return them.
fn wait_for_messages(keep: impl Fn(&Rec) -> bool, want: &[&str]) -> Vec<Rec> {
    let deadline = Instant::now() + WAIT;
    loop {
        let recs = records(&keep);
        let missing: Vec<&&str> = want
            .iter()
            .filter(|m| !recs.iter().any(|r| r.message() == **m))
            .collect();
        if missing.is_empty() {
            return recs;
        }
        assert!(
            Instant::now() < deadline,
            "missing {missing:?} in {recs:#?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn open() -> Device {
    Device::open(
        Backend::Kernel,
        DeviceConfig {
            progress: Progress::Thread { cpu: None },
            seed: Some(11),
            busy_poll: false,
        },
    )
    .unwrap()
}

fn init(dev: &Device) -> QpInit {
    let pd = dev.alloc_pd();
    let cq = dev.create_cq(64);
    QpInit {
        pd,
        send_cq: cq.clone(),
        recv_cq: cq,
        sq_depth: 16,
        rq_depth: 16,
        sig_all: false,
        srq: None,
    }
}

/// The `conn` span of `r`, if its local and peer addresses are these.
fn in_conn(r: &Rec, local: SocketAddr, peer: SocketAddr) -> bool {
    r.span("conn").is_some_and(|f| {
        f.get("local") == Some(&local.to_string()) && f.get("peer") == Some(&peer.to_string())
    })
}

#[test]
fn connection_events_belong_to_the_span_of_their_qp() {
    capture();
    let (cdev, sdev) = (open(), open());
    let listener = sdev.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr();
    let sinit = init(&sdev);
    let server = std::thread::spawn(move || {
        let req = listener.get_request(Some(WAIT)).unwrap();
        let qp = req.accept(sinit, ConnParams::default()).unwrap();
        let id = qp.id();
        loop {
            match qp.wait_event(WAIT) {
                Some(CmEvent::Disconnected) => break,
                Some(_) => {}
                None => panic!("no disconnect"),
            }
        }
        id
    });
    let cqp = cdev
        .connect(addr, init(&cdev), ConnParams::default())
        .unwrap();
    let (cid, clocal) = (cqp.id(), cqp.local_addr());
    assert_eq!(cqp.peer_addr(), addr);
    cqp.disconnect();
    let sid = server.join().unwrap();

    let client = wait_for_messages(
        |r| in_conn(r, clocal, addr),
        &[
            "connect: MPA request queued",
            "MPA frame sent",
            "MPA reply received",
            "connection established (RTS)",
            "disconnect",
            "QP to Error: outstanding work requests flushed",
            "TCP connection closed",
        ],
    );
    let server = wait_for_messages(
        |r| in_conn(r, addr, clocal),
        &[
            "accept: awaiting the MPA request",
            "MPA request received",
            "connection accepted: MPA reply queued",
            "MPA frame sent",
            "connection established (RTS)",
            "connection closed by the peer",
            "TCP connection closed",
        ],
    );
    for (recs, id) in [(&client, cid), (&server, sid)] {
        for r in recs {
            let conn = r.span("conn").unwrap();
            assert_eq!(conn["qp"], id.index().to_string(), "{r:?}");
            assert_eq!(conn["qp_gen"], id.generation().to_string(), "{r:?}");
            // The connection's span is a child of its device's.
            assert_eq!(r.spans[0].0, "dev", "{r:?}");
            assert!(r.level >= Level::INFO, "a normal connection warns: {r:?}");
        }
    }
    // The events come from the application's threads and the progress
    // threads alike, and all of them carry the span.
    let threads: std::collections::HashSet<ThreadId> =
        client.iter().chain(&server).map(|r| r.thread).collect();
    assert!(threads.len() >= 2, "{threads:?}");
    drop((cqp, cdev, sdev));
}

#[test]
fn device_start_and_stop_are_logged_in_its_span() {
    capture();
    let me = std::thread::current().id();
    let dev = open();
    let opened = records(|r| r.thread == me && r.message() == "device opened");
    assert_eq!(opened.len(), 1, "{opened:#?}");
    let o = &opened[0];
    assert_eq!(o.level, Level::INFO);
    assert_eq!(o.fields["backend"], "kernel");
    let span = o.span("dev").expect("device span").clone();
    assert_eq!(span["backend"], "kernel");
    drop(dev);
    // Drop joined the progress thread: its records are in.
    let mine = records(|r| r.span("dev") == Some(&span));
    for m in [
        "device opened",
        "progress thread started",
        "progress thread stopped",
        "device closed",
    ] {
        assert_eq!(
            mine.iter().filter(|r| r.message() == m).count(),
            1,
            "{m:?} in {mine:#?}"
        );
    }
    let started = mine
        .iter()
        .find(|r| r.message() == "progress thread started")
        .unwrap();
    assert_ne!(started.thread, me);
}

#[test]
fn af_xdp_attach_and_detach_are_logged() {
    if !common::is_root() {
        return;
    }
    capture();
    let topo = common::Topo::up(1500, None, None, 1);
    let thread = common::spawn_in(&topo.b, || {
        let mut c = XdpConfig::new("xb", common::IP_B, 24);
        c.attach = AttachMode::Generic;
        let dev = Device::open(
            Backend::AfXdp(c),
            DeviceConfig {
                progress: Progress::Manual,
                seed: Some(3),
                busy_poll: false,
            },
        )
        .unwrap();
        drop(dev);
        std::thread::current().id()
    })
    .join()
    .unwrap();
    let mine = records(|r| r.thread == thread);
    let one = |m: &str| {
        let v: Vec<&Rec> = mine.iter().filter(|r| r.message() == m).collect();
        assert_eq!(v.len(), 1, "{m:?} in {mine:#?}");
        v[0].clone()
    };
    let attached = one("XDP steering program attached");
    assert_eq!(attached.level, Level::INFO);
    assert_eq!(attached.fields["ifname"], "xb");
    assert_eq!(attached.fields["attach"], "Generic");
    assert_eq!(attached.fields["mode"], "Generic");
    let bound = one("AF_XDP socket bound");
    assert_eq!(bound.fields["ifname"], "xb");
    assert_eq!(bound.fields["queue"], "0");
    assert_eq!(bound.fields["mtu"], "1500");
    let opened = one("device opened");
    assert_eq!(opened.fields["backend"], "af_xdp");
    // Attach and sockets belong to the device's span.
    assert_eq!(attached.span("dev"), opened.span("dev"));
    assert_eq!(bound.span("dev"), opened.span("dev"));
    let detached = one("XDP steering program detached");
    assert_eq!(detached.span("dev"), opened.span("dev"));
    one("device closed");
    topo.assert_no_program();
}
