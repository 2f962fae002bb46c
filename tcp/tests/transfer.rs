//! Bulk transfers over the simulated link, byte for byte, with and
//! without faults.

mod common;

use common::bulk;
use iwarp_tcp::sim::{Faults, LinkConfig, Sim, Step};
use iwarp_tcp::Config;
use smoltcp::time::Duration;

const LEN: usize = 10 << 20;

fn report(name: &str, b: &common::Bulk) {
    eprintln!(
        "{name}: {} simulated, {:.1} Mb/s each way; A→B {:?}; B→A {:?}",
        b.took,
        (LEN as f64 * 8.0) / (b.took.total_micros() as f64),
        b.sim.a_to_b(),
        b.sim.b_to_a()
    );
}

#[test]
fn ten_mb_each_way_clean() {
    let b = bulk(
        Config::default(),
        LinkConfig::default(),
        LEN,
        true,
        Duration::from_secs(10),
    );
    report("clean", &b);
    assert_eq!(b.sim.a_to_b().dropped, 0);
}

#[test]
fn ten_mb_each_way_1pct_loss_reorder_dup() {
    let link = LinkConfig {
        faults: Faults {
            corrupt: 0.005,
            ..Faults::mixed(0.01)
        },
        seed: 11,
        ..LinkConfig::default()
    };
    let b = bulk(
        Config::default(),
        link,
        LEN,
        false,
        Duration::from_secs(120),
    );
    report("1%", &b);
    let s = b.sim.a_to_b();
    assert!(s.dropped > 0 && s.duplicated > 0 && s.reordered > 0 && s.corrupted > 0);
}

#[test]
fn ten_mb_each_way_5pct_loss_reorder_dup() {
    let link = LinkConfig {
        faults: Faults {
            drop: 0.05,
            duplicate: 0.02,
            reorder: 0.02,
            reorder_delay: Duration::from_micros(300),
            corrupt: 0.0,
            fix_checksum: false,
        },
        seed: 55,
        ..LinkConfig::default()
    };
    let b = bulk(
        Config::default(),
        link,
        LEN,
        false,
        Duration::from_secs(6000),
    );
    report("5%", &b);
    let s = b.sim.b_to_a();
    assert!(s.dropped > 0 && s.duplicated > 0 && s.reordered > 0);
}

/// Both ends in timeout recovery at once. After a retransmission timeout
/// smoltcp resends from the oldest unacknowledged byte, and its bare
/// acknowledgements would carry that rewound sequence number; a peer that
/// has received more drops them as lying before its window. With small
/// rings, both directions busy and this link (its seed gives such a
/// moment, one second in), each end dropped the other's acknowledgements
/// and resent the same segment at every timeout until the time limit. The
/// device wrapper sends them with the highest sequence number sent.
#[test]
fn both_ends_recover_from_timeouts_at_once() {
    let config = Config {
        rx_buffer: 16 << 10,
        tx_buffer: 16 << 10,
        ..Config::default()
    };
    let link = LinkConfig {
        faults: Faults::mixed(0.01),
        seed: 24,
        ..LinkConfig::default()
    };
    let mut sim = Sim::new(config, config, link);
    let (a, b) = common::connect(&mut sim, 40000, Duration::from_secs(5));
    let len = 512 << 10;
    let out = [common::data(len, 1), common::data(len, 2)];
    let (mut sent, mut got) = ([0usize; 2], [Vec::new(), Vec::new()]);
    let limit = sim.now + Duration::from_secs(30);
    let r = sim.run(limit, |s| {
        let mut moved = false;
        let ends = [(&mut s.a, a), (&mut s.b, b)];
        for (i, (stack, conn)) in ends.into_iter().enumerate() {
            let src = &out[i][sent[i]..];
            let mut off = 0;
            let n = stack
                .send_segment(conn, |buf, left| {
                    let n = buf.len().min(left).min(src.len() - off) & !3;
                    buf[..n].copy_from_slice(&src[off..off + n]);
                    off += n;
                    n
                })
                .unwrap();
            sent[i] += n;
            let into = &mut got[i];
            let r = stack
                .recv(conn, |buf| {
                    into.extend_from_slice(buf);
                    buf.len()
                })
                .unwrap();
            moved |= n + r > 0;
        }
        if got[0].len() == len && got[1].len() == len {
            Step::Done
        } else if moved {
            Step::Progress
        } else {
            Step::Idle
        }
    });
    let renumbered = (
        sim.a.counters().acks_renumbered,
        sim.b.counters().acks_renumbered,
    );
    eprintln!(
        "at {}: bare acknowledgements renumbered {renumbered:?}",
        sim.now
    );
    r.unwrap_or_else(|e| panic!("{e}: got {} and {} of {len}", got[0].len(), got[1].len()));
    assert!(got[0] == out[1] && got[1] == out[0]);
    assert!(renumbered.0 + renumbered.1 > 0);
}
