//! Helpers shared by the integration tests.
#![allow(dead_code)]

use iwarp_tcp::sim::{LinkConfig, Sim, Step};
use iwarp_tcp::{Config, ConnId};
use smoltcp::time::{Duration, Instant};

pub const PORT: u16 = 7174;

/// `len` seeded pseudo-random bytes.
pub fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Connect A to B's listening port; returns (A's conn, B's conn).
pub fn connect(sim: &mut Sim, local_port: u16, limit: Duration) -> (ConnId, ConnId) {
    if sim.b.listen(PORT).is_err() {
        // already listening
    }
    let a = sim.a.connect((Sim::IP_B, PORT), local_port).unwrap();
    let mut b = None;
    let limit = sim.now + limit;
    sim.run(limit, |s| {
        b = b.or_else(|| s.b.accept(PORT));
        if b.is_some() && s.a.is_established(a) {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    (a, b.unwrap())
}

/// Send `out` from `a` on A to `b` on B and read it there (within 10 s);
/// returns what arrived.
pub fn one_way_on(sim: &mut Sim, a: ConnId, b: ConnId, out: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut sent = 0;
    let limit = sim.now + Duration::from_secs(10);
    sim.run(limit, |s| {
        sent += s.a.send_slice(a, &out[sent..]).unwrap();
        s.b.recv(b, |buf| {
            got.extend_from_slice(buf);
            buf.len()
        })
        .unwrap();
        if got.len() == out.len() {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    got
}

/// Read `len` bytes on `b` on B, sent already (within 5 s); returns
/// them.
pub fn recv_on(sim: &mut Sim, b: ConnId, len: usize) -> Vec<u8> {
    let mut got = Vec::new();
    let limit = sim.now + Duration::from_secs(5);
    sim.run(limit, |s| {
        let _ = s.b.recv(b, |buf| {
            got.extend_from_slice(buf);
            buf.len()
        });
        if got.len() == len {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    got
}

/// A simulation whose B's windows share `frames` receive frames
/// ([`Config::window_frames`]); A, the rest of B's configuration and the
/// link are the defaults.
pub fn sharing_frames(frames: usize) -> Sim {
    sharing_frames_seeded(frames, LinkConfig::default().seed)
}

/// [`sharing_frames`] over a link whose faults follow `seed`.
pub fn sharing_frames_seeded(frames: usize, seed: u64) -> Sim {
    let b_cfg = Config {
        window_frames: Some(frames),
        ..Config::default()
    };
    let link = LinkConfig {
        seed,
        ..LinkConfig::default()
    };
    Sim::new(Config::default(), b_cfg, link)
}

/// Let the simulated time run for `d` with nothing to send.
pub fn idle_for(sim: &mut Sim, d: Duration) {
    let until = sim.now + d;
    let r = sim.run(until + Duration::from_secs(1), |s| {
        if s.now >= until {
            Step::Done
        } else {
            Step::IdleUntil(until)
        }
    });
    r.unwrap();
}

/// Outcome of a bulk transfer.
#[derive(Debug)]
pub struct Bulk {
    pub sim: Sim,
    pub took: Duration,
}

/// Send `len` bytes each way at once over a fresh sim, verify them byte
/// for byte, then close both ways and check the orderly end.
/// With `both_at_once`, both directions run at the same time; otherwise
/// A→B first, then B→A.
pub fn bulk(
    config: Config,
    link: LinkConfig,
    len: usize,
    both_at_once: bool,
    limit: Duration,
) -> Bulk {
    let mut sim = Sim::new(config, config, link);
    let (ca, cb) = connect(&mut sim, 40000, limit);
    let start = sim.now;
    let out_a = data(len, 1);
    let out_b = data(len, 2);
    let (mut sent_a, mut sent_b, mut got_a, mut got_b) = (0, 0, 0, 0);
    let mut closed = false;
    let limit_at = sim.now + limit;
    let r = sim.run(limit_at, |s| {
        let mut progress = false;
        if sent_a < len {
            let n = s.a.send_slice(ca, &out_a[sent_a..]).unwrap();
            sent_a += n;
            progress |= n > 0;
        }
        if sent_b < len && (both_at_once || got_b == len) {
            let n = s.b.send_slice(cb, &out_b[sent_b..]).unwrap();
            sent_b += n;
            progress |= n > 0;
        }
        let n =
            s.b.recv(cb, |buf| {
                assert_eq!(buf, &out_a[got_b..got_b + buf.len()], "A→B at {got_b}");
                got_b += buf.len();
                buf.len()
            })
            .unwrap_or(0);
        let m =
            s.a.recv(ca, |buf| {
                assert_eq!(buf, &out_b[got_a..got_a + buf.len()], "B→A at {got_a}");
                got_a += buf.len();
                buf.len()
            })
            .unwrap_or(0);
        progress |= n + m > 0;
        if got_a == len && got_b == len && !closed {
            s.a.close(ca).unwrap();
            s.b.close(cb).unwrap();
            closed = true;
            progress = true;
        }
        if closed && s.a.is_eof(ca) && s.b.is_eof(cb) {
            return Step::Done;
        }
        if progress {
            Step::Progress
        } else {
            Step::Idle
        }
    });
    if let Err(e) = r {
        panic!(
            "{e}: sent {sent_a}/{sent_b} got {got_b}/{got_a} of {len}; {:?} {:?}",
            sim.a_to_b(),
            sim.b_to_a()
        );
    }
    assert_eq!((got_a, got_b), (len, len));
    assert!(!sim.a.is_reset(ca) && !sim.b.is_reset(cb));
    assert_eq!(sim.a.recv(ca, |b| b.len()), Err(iwarp_tcp::Error::Finished));
    let took = sim.now - start;
    Bulk { sim, took }
}

pub fn at(secs: u64) -> Instant {
    Instant::from_secs(secs as i64)
}
