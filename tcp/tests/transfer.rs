//! Bulk transfers over the simulated link, byte for byte, with and
//! without faults.

mod common;

use common::bulk;
use iwarp_tcp::sim::{Faults, LinkConfig};
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
            drop: 0.01,
            duplicate: 0.01,
            reorder: 0.01,
            reorder_delay: Duration::from_micros(200),
            corrupt: 0.005,
            fix_checksum: false,
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
