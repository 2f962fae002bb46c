//! Quiet connections give their socket buffers' pages back
//! (`Config::idle_release`), never while a buffer holds data the socket
//! will read again.

mod common;

use common::{connect, data, idle_for, one_way_on};
use iwarp_tcp::sim::{LinkConfig, Sim, Step};
use iwarp_tcp::Config;
use smoltcp::time::Duration;
use smoltcp::wire::{EthernetFrame, Ipv4Packet, TcpPacket};

#[test]
fn quiet_connections_give_their_buffer_pages_back() {
    let config = Config::default();
    let after = config.idle_release.unwrap();
    let mut sim = Sim::new(config, config, LinkConfig::default());
    let (a, b) = connect(&mut sim, 40000, Duration::from_secs(5));
    let out = data(1 << 20, 3);
    assert!(one_way_on(&mut sim, a, b, &out) == out);
    // Busy the whole time: nothing given back yet.
    assert_eq!(sim.b.counters().idle_releases, 0);
    // Quiet for two periods: each side gives its buffers back once.
    idle_for(&mut sim, after * 2 + Duration::from_millis(10));
    for (side, s) in [("A", &sim.a), ("B", &sim.b)] {
        let c = s.counters();
        assert_eq!(c.idle_releases, 1, "{side}: {c:?}");
        assert!(c.idle_released_bytes > 0, "{side}: {c:?}");
    }
    // Quiet on: nothing more to give back until the connection is used.
    idle_for(&mut sim, after * 3);
    assert_eq!(sim.b.counters().idle_releases, 1);
    // The pages come back as the rings write them; the bytes are whole.
    let out = data(1 << 20, 4);
    assert!(one_way_on(&mut sim, a, b, &out) == out);
    idle_for(&mut sim, after * 2 + Duration::from_millis(10));
    assert_eq!(sim.b.counters().idle_releases, 2);
}

/// The sequence number of a TCP segment from A in `frame`, with its
/// payload length.
fn segment(frame: &[u8]) -> Option<(u32, usize)> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    (ip.src_addr() == Sim::IP_A).then(|| (tcp.seq_number().0 as u32, tcp.payload().len()))
}

/// B receives the second and third segments of a message while the
/// first (and every copy of it) is lost for longer than B's idle period:
/// B holds them out of order, and gives back nothing while it does.
/// Once the first arrives, the message reads whole.
#[test]
fn data_held_out_of_order_is_not_given_back() {
    let after = Duration::from_millis(50);
    let b_config = Config {
        idle_release: Some(after),
        ..Config::default()
    };
    let mut sim = Sim::new(Config::default(), b_config, LinkConfig::default());
    let (a, b) = connect(&mut sim, 40000, Duration::from_secs(5));
    let out = data(3 * 1460, 5);
    assert_eq!(sim.a.send_slice(a, &out).unwrap(), out.len());
    let mut first = None;
    let lost_until = sim.now + Duration::from_secs(3);
    let mut got = Vec::new();
    let mut released_while_held = None;
    let limit = sim.now + Duration::from_secs(30);
    sim.run(limit, |s| {
        let now = s.now;
        s.b.device_mut().rx.retain(|f| match segment(f) {
            Some((seq, len)) if len > 0 => {
                let first = *first.get_or_insert(seq);
                seq != first || now >= lost_until
            }
            _ => true,
        });
        if now < lost_until && now > lost_until - Duration::from_millis(100) {
            released_while_held.get_or_insert(s.b.counters().idle_releases);
        }
        let m =
            s.b.recv(b, |buf| {
                got.extend_from_slice(buf);
                buf.len()
            })
            .unwrap();
        if got.len() == out.len() {
            Step::Done
        } else if m > 0 {
            Step::Progress
        } else {
            Step::IdleUntil(lost_until)
        }
    })
    .unwrap();
    assert_eq!(released_while_held, Some(0));
    assert!(got == out, "the message arrived changed");
    // Read and acknowledged: now the buffers go back.
    idle_for(&mut sim, after * 2 + Duration::from_millis(10));
    assert!(sim.b.counters().idle_releases > 0);
}

/// Frames that move no data (A's keep-alives every quarter of the idle
/// period, and B's acknowledgements of them, as a nudge of a retracted
/// window would be) leave a quiet connection quiet: each side gives its
/// buffers back once the data stopped.
#[test]
fn frames_without_data_leave_a_connection_quiet() {
    let after = Duration::from_millis(400);
    let config = Config {
        idle_release: Some(after),
        keep_alive: Some(after / 4),
        ..Config::default()
    };
    let mut sim = Sim::new(config, config, LinkConfig::default());
    let (a, b) = connect(&mut sim, 40000, Duration::from_secs(5));
    let out = data(1 << 16, 3);
    assert!(one_way_on(&mut sim, a, b, &out) == out);
    let sent = (sim.a.counters().tx_frames, sim.b.counters().tx_frames);
    idle_for(&mut sim, after * 3);
    let (ca, cb) = (sim.a.counters(), sim.b.counters());
    assert!(
        ca.tx_frames >= sent.0 + 4 && cb.tx_frames >= sent.1 + 4,
        "keep-alives and their answers: {ca:?} {cb:?}"
    );
    assert_eq!(ca.idle_releases, 1, "A: {ca:?}");
    assert_eq!(cb.idle_releases, 1, "B: {cb:?}");
}

/// Connections whose peers sent one short message each and then nothing
/// (as an MPA exchange leaves the side that only sends) wait in the
/// shared frames' queue for credit that is granted a turn at a time and
/// held a second when unused: the queue drains slower than the idle
/// period. Waiting for credit with nothing received for the idle period
/// is quiet: every connection gives its buffers back.
#[test]
fn connections_waiting_for_credit_without_data_are_quiet() {
    let after = Duration::from_millis(300);
    let b_config = Config {
        window_frames: Some(4),
        idle_release: Some(after),
        ..Config::default()
    };
    let mut sim = Sim::new(Config::default(), b_config, LinkConfig::default());
    let n = 12;
    let conns: Vec<_> = (0..n)
        .map(|i| connect(&mut sim, 40000 + i as u16, Duration::from_secs(5)))
        .collect();
    for (i, &(a, b)) in conns.iter().enumerate() {
        let out = data(100, 10 + i as u64);
        assert!(one_way_on(&mut sim, a, b, &out) == out);
    }
    idle_for(&mut sim, after * 3);
    let c = sim.b.counters();
    assert_eq!(c.idle_releases, n as u64, "B: {c:?}");
}
