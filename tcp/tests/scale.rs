//! Many connections on one stack: dispatch through the flow table, visits
//! only for connections with work, listening under a SYN flood, slots
//! and flows that are given back.

mod common;

use common::{connect, data, idle_for, one_way_on, sharing_frames, sharing_frames_seeded, PORT};
use iwarp_tcp::sim::{Faults, LinkConfig, Sim, Step};
use iwarp_tcp::{Config, ConnId, Error, FRAME_RUN_BUCKETS, MIN_BUFFER, PROBE_LIMIT};
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::time::Duration;
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, IpProtocol, Ipv4Address,
    Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr, TcpSeqNumber,
};

/// Small buffers: thousands of connections in one test process; room
/// for all of them to be half open at once (they connect in one burst).
fn small() -> Config {
    Config {
        rx_buffer: 4096,
        tx_buffer: 4096,
        half_open: 4096,
        ..Config::default()
    }
}

/// Open `n` connections from A to B's port and accept them all.
fn open_many(sim: &mut Sim, n: u16) -> Vec<(ConnId, ConnId)> {
    let _ = sim.b.listen(PORT);
    let ours: Vec<ConnId> = (0..n)
        .map(|i| sim.a.connect((Sim::IP_B, PORT), 20000 + i).unwrap())
        .collect();
    let mut theirs = Vec::new();
    let limit = sim.now + Duration::from_secs(10);
    sim.run(limit, |s| {
        while let Some(b) = s.b.accept(PORT) {
            theirs.push(b);
        }
        if theirs.len() == ours.len() && ours.iter().all(|&a| s.a.is_established(a)) {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    // Pair them by B's view of the peer's port.
    let mut pairs = Vec::new();
    for &b in &theirs {
        let (_, remote) = sim.b.endpoints(b).unwrap();
        pairs.push((ours[usize::from(remote.port - 20000)], b));
    }
    pairs.sort();
    pairs
}

#[test]
fn thousands_of_connections_each_move_verified_data() {
    let mut sim = Sim::new(small(), small(), LinkConfig::default());
    let pairs = open_many(&mut sim, 2000);
    assert_eq!(pairs.len(), 2000);
    assert_eq!(sim.b.connection_count(), 2000);
    assert_eq!(sim.b.flow_count(), 2000);
    let msgs: Vec<Vec<u8>> = (0..pairs.len()).map(|i| data(300, i as u64)).collect();
    for (i, &(a, _)) in pairs.iter().enumerate() {
        assert_eq!(sim.a.send_slice(a, &msgs[i]), Ok(300));
    }
    let mut got = vec![Vec::new(); pairs.len()];
    let limit = sim.now + Duration::from_secs(10);
    sim.run(limit, |s| {
        let mut done = true;
        for (i, &(_, b)) in pairs.iter().enumerate() {
            let _ = s.b.recv(b, |buf| {
                got[i].extend_from_slice(buf);
                buf.len()
            });
            done &= got[i].len() == msgs[i].len();
        }
        if done {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    assert_eq!(got, msgs, "each connection got its own bytes");
    assert_eq!(
        sim.b.counters().control_frames,
        2,
        "only the neighbour ARP replies"
    );
}

/// Traffic on one connection visits that connection, whatever else is
/// open: the stack's work per pass does not grow with idle connections.
#[test]
fn idle_connections_cost_no_visits() {
    let visits_for_exchange = |idle: u16| {
        let mut sim = Sim::new(small(), small(), LinkConfig::default());
        let pairs = open_many(&mut sim, idle + 1);
        // Let every handshake's delayed ACKs and timers run out.
        idle_for(&mut sim, Duration::from_secs(2));
        let (a, b) = pairs[0];
        let before = (sim.a.counters().conn_visits, sim.b.counters().conn_visits);
        let msg = data(3000, 7);
        let mut off = 0;
        let mut got = Vec::new();
        let limit = sim.now + Duration::from_secs(5);
        sim.run(limit, |s| {
            if off < msg.len() {
                off += s.a.send_slice(a, &msg[off..]).unwrap();
            }
            let _ = s.b.recv(b, |buf| {
                got.extend_from_slice(buf);
                buf.len()
            });
            if got.len() == msg.len() {
                Step::Done
            } else {
                Step::Idle
            }
        })
        .unwrap();
        assert_eq!(got, msg);
        (
            sim.a.counters().conn_visits - before.0,
            sim.b.counters().conn_visits - before.1,
        )
    };
    let alone = visits_for_exchange(0);
    let crowded = visits_for_exchange(1000);
    assert!(alone.0 > 0 && alone.1 > 0);
    assert_eq!(alone, crowded, "visits with 1000 idle connections open");
}

/// A device out of transmit frames ends the pass's egress: the
/// connections still waiting to send are visited at a later pass, not
/// each on every pass only to find the device full, so a pass costs what
/// the device can take rather than the number of connections with data.
#[test]
fn connections_waiting_for_a_transmit_frame_are_not_visited_each_pass() {
    const CONNS: u16 = 200;
    const FRAMES_PER_POLL: usize = 4;
    let mut sim = Sim::new(small(), small(), LinkConfig::default());
    let pairs = open_many(&mut sim, CONNS);
    idle_for(&mut sim, Duration::from_secs(2));
    sim.a.device_mut().set_tx_limit(FRAMES_PER_POLL);
    let msg = data(3000, 11);
    for &(a, _) in &pairs {
        assert_eq!(sim.a.send_slice(a, &msg).unwrap(), msg.len());
    }
    let before = sim.a.counters();
    let mut got = vec![Vec::new(); pairs.len()];
    let mut polls = 0u64;
    let limit = sim.now + Duration::from_secs(30);
    sim.run(limit, |s| {
        polls += 1;
        for (i, &(_, b)) in pairs.iter().enumerate() {
            let _ = s.b.recv(b, |buf| {
                got[i].extend_from_slice(buf);
                buf.len()
            });
        }
        if got.iter().all(|g| g.len() == msg.len()) {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    assert!(
        got.iter().all(|g| *g == msg),
        "every connection's bytes arrived"
    );
    let after = sim.a.counters();
    let visits = after.conn_visits - before.conn_visits;
    let sent = after.tx_frames - before.tx_frames;
    assert!(after.egress_device_full > before.egress_device_full);
    // About a visit for each frame sent and each acknowledgement
    // received (about 500 in all); a visit for each connection waiting
    // for a frame, at each poll, makes more than 10,000.
    assert!(
        visits <= 2 * sent + u64::from(CONNS),
        "{visits} visits for {sent} frames sent in {polls} polls"
    );
}

#[test]
fn a_released_connection_id_names_nothing_after_its_slot_is_reused() {
    let mut sim = Sim::new(small(), small(), LinkConfig::default());
    let (a, _) = connect(&mut sim, 40000, Duration::from_secs(1));
    sim.a.abort(a).unwrap();
    sim.poll();
    sim.a.release(a).unwrap();
    let (again, _) = connect(&mut sim, 40001, Duration::from_secs(1));
    assert_ne!(again, a);
    assert_eq!(sim.a.connection_count(), 1);
    // The old id reaches neither the new connection nor anything else.
    assert_eq!(sim.a.state(a), None);
    assert_eq!(sim.a.send_slice(a, b"x"), Err(Error::UnknownConnection));
    assert_eq!(sim.a.recv(a, |b| b.len()), Err(Error::UnknownConnection));
    assert_eq!(sim.a.close(a), Err(Error::UnknownConnection));
    assert_eq!(sim.a.release(a), Err(Error::UnknownConnection));
    assert!(sim.a.is_established(again));
    assert_eq!(sim.a.send_slice(again, b"x"), Ok(1));
}

#[test]
fn connections_that_close_give_back_slots_and_flows() {
    let mut sim = Sim::new(small(), small(), LinkConfig::default());
    sim.b.listen(PORT).unwrap();
    for round in 0..50u16 {
        let pairs: Vec<_> = (0..20u16)
            .map(|i| connect(&mut sim, 30000 + round * 20 + i, Duration::from_secs(1)))
            .collect();
        for &(a, b) in &pairs {
            sim.a.close(a).unwrap();
            sim.b.close(b).unwrap();
        }
        let limit = sim.now + Duration::from_secs(5);
        sim.run(limit, |s| {
            if pairs
                .iter()
                .all(|&(a, b)| s.a.is_closed(a) && s.b.is_closed(b))
            {
                Step::Done
            } else {
                Step::Idle
            }
        })
        .unwrap();
        for &(a, b) in &pairs {
            sim.a.release(a).unwrap();
            sim.b.release(b).unwrap();
        }
        assert_eq!(sim.b.connection_count(), 0);
        assert_eq!(sim.b.flow_count(), 0);
        assert_eq!(sim.a.connection_count(), 0);
    }
    assert_eq!(sim.b.counters().accepted, 1000);
}

#[test]
fn a_full_flow_table_refuses_new_connections() {
    let b = Config {
        max_connections: 8,
        ..small()
    };
    let mut sim = Sim::new(small(), b, LinkConfig::default());
    sim.b.listen(PORT).unwrap();
    let clients: Vec<_> = (0..10)
        .map(|i| sim.a.connect((Sim::IP_B, PORT), 41000 + i).unwrap())
        .collect();
    let limit = sim.now + Duration::from_secs(5);
    sim.run(limit, |s| {
        if clients
            .iter()
            .all(|&c| s.a.is_established(c) || s.a.is_reset(c))
        {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    let est = clients.iter().filter(|&&c| sim.a.is_established(c)).count();
    assert_eq!(est, 8);
    assert_eq!(sim.b.counters().flow_table_full, 2);
    assert_eq!(sim.b.flow_count(), 8);
}

/// A SYN from `ip:port` (a host that never answers) to B's port.
fn syn_frame(ip: Ipv4Address, port: u16) -> Vec<u8> {
    let tcp = TcpRepr {
        src_port: port,
        dst_port: PORT,
        control: TcpControl::Syn,
        seq_number: TcpSeqNumber(i32::from(port) * 1000),
        ack_number: None,
        window_len: 1000,
        window_scale: None,
        max_seg_size: Some(1460),
        sack_permitted: false,
        sack_ranges: [None; 3],
        timestamp: None,
        payload: &[],
    };
    let ip_repr = Ipv4Repr {
        src_addr: ip,
        dst_addr: Sim::IP_B,
        next_header: IpProtocol::Tcp,
        payload_len: tcp.buffer_len(),
        hop_limit: 64,
    };
    let eth = EthernetRepr {
        src_addr: EthernetAddress([0x02, 0, 0x5e, 0, 0, 0x63]),
        dst_addr: Sim::MAC_B,
        ethertype: EthernetProtocol::Ipv4,
    };
    let mut buf = vec![0; 14 + ip_repr.buffer_len() + tcp.buffer_len()];
    let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
    eth.emit(&mut f);
    let caps = ChecksumCapabilities::default();
    let mut p = Ipv4Packet::new_unchecked(f.payload_mut());
    ip_repr.emit(&mut p, &caps);
    let mut t = TcpPacket::new_unchecked(p.payload_mut());
    tcp.emit(&mut t, &ip.into(), &Sim::IP_B.into(), &caps);
    buf
}

#[test]
fn a_half_open_flood_drops_the_oldest_and_clients_still_connect() {
    let b = Config {
        half_open: 16,
        ..small()
    };
    let mut sim = Sim::new(small(), b, LinkConfig::default());
    sim.b.listen(PORT).unwrap();
    let flooder = Ipv4Address::new(198, 18, 0, 99);
    let mut next = 1000u16;
    let mut flood = |sim: &mut Sim, n: u16| {
        for _ in 0..n {
            sim.b.device_mut().rx.push_back(syn_frame(flooder, next));
            next = next.checked_add(1).unwrap_or(1000);
        }
    };
    flood(&mut sim, 100);
    sim.poll();
    assert_eq!(sim.b.half_open(PORT), 16);
    assert_eq!(sim.b.counters().half_open_evicted, 84);
    // A client connects while the flood goes on.
    let a = sim.a.connect((Sim::IP_B, PORT), 40000).unwrap();
    let mut accepted = None;
    let limit = sim.now + Duration::from_secs(5);
    let mut next_flood = sim.now;
    sim.run(limit, |s| {
        // Eight SYNs every round trip of the link (100 µs): half the
        // half-open limit arrives while the client's handshake is open.
        if s.now >= next_flood {
            next_flood = s.now + Duration::from_micros(25);
            flood(s, 2);
            return Step::IdleUntil(next_flood);
        }
        accepted = accepted.or_else(|| s.b.accept(PORT));
        if accepted.is_some() && s.a.is_established(a) {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    let (_, remote) = sim.b.endpoints(accepted.unwrap()).unwrap();
    assert_eq!(remote.port, 40000);
    assert!(sim.b.half_open(PORT) <= 16);
    // Half-open connections, the client's and the accepted one: no more.
    assert!(
        sim.b.connection_count() <= 17,
        "{}",
        sim.b.connection_count()
    );
    sim.b.unlisten(PORT);
    assert_eq!(sim.b.connection_count(), 1, "the accepted one stays");
}

/// A `Write` into a buffer the test keeps.
#[derive(Clone, Default)]
struct Shared(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The frames of a classic pcap file.
fn pcap_frames(pcap: &[u8]) -> Vec<&[u8]> {
    pcap_records(pcap).into_iter().map(|(_, f)| f).collect()
}

/// The frames of a classic pcap file with their times.
fn pcap_records(pcap: &[u8]) -> Vec<(Duration, &[u8])> {
    let word = |at: usize| u32::from_le_bytes(pcap[at..at + 4].try_into().unwrap());
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let time =
            Duration::from_secs(word(at).into()) + Duration::from_micros(word(at + 4).into());
        let len = word(at + 8) as usize;
        out.push((time, &pcap[at + 16..at + 16 + len]));
        at += 16 + len;
    }
    out
}

/// Many connections streaming into one stack whose windows share a few
/// frames (`Config::window_frames`): the windows they hold open together
/// stay within the frames' bytes instead of a full socket buffer each, a
/// window's right edge moves back only when a window update retracts it
/// (a zero window), and every byte arrives. Each keeps sending until
/// every one has received `LEN` bytes: a peer that stops leaves its
/// window unused, which is retracted a second later if others wait (the
/// next test closes its connections instead).
#[test]
fn streaming_connections_share_the_receive_frames() {
    const N: u16 = 64;
    const FRAMES: usize = 256;
    const LEN: usize = 64 * 1024;
    let mut sim = sharing_frames(FRAMES);
    let capture = Shared::default();
    sim.capture(Box::new(capture.clone()), iwarp_tcp::sim::Capture::Sent);
    let pairs = open_many(&mut sim, N);
    let msgs: Vec<Vec<u8>> = (0..pairs.len()).map(|i| data(16 * LEN, i as u64)).collect();
    let mut sent = vec![0; pairs.len()];
    let mut got = vec![Vec::new(); pairs.len()];
    let limit = sim.now + Duration::from_secs(30);
    sim.run(limit, |s| {
        let mut done = true;
        for (i, &(a, b)) in pairs.iter().enumerate() {
            sent[i] += s.a.send_slice(a, &msgs[i][sent[i]..]).unwrap_or(0);
            let _ = s.b.recv(b, |buf| {
                got[i].extend_from_slice(buf);
                buf.len()
            });
            done &= got[i].len() >= LEN;
        }
        if done {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    sim.finish_capture();
    for (i, (got, msg)) in got.iter().zip(&msgs).enumerate() {
        assert!(sent[i] < msg.len(), "connection {i} ran out of data");
        assert!(msg.starts_with(got), "connection {i} got its own bytes");
    }
    assert!(sim.b.counters().windows_cut > 0);
    let mss = sim.b.local_mss();
    let (most, _) = windows_on_the_wire(&capture.0.borrow());
    // Each window alone could be smoltcp's 256 KiB; together they stay
    // within the frames.
    let bound = FRAMES * mss;
    assert!(most <= bound, "{most} bytes open at once, bound {bound}");
}

/// Connections come one after another while the frames are held; each
/// peer sends one short message (as an MPA request is) and then nothing
/// for seconds, and then all of them stream at once. The windows their
/// peers left unused are retracted for the connections that wait, not
/// left open past the frames to be filled when every peer starts at
/// once: the windows B holds open on the wire never add up to more than
/// the frames, and every byte arrives.
#[test]
fn windows_left_unused_are_retracted_within_the_frames() {
    const N: u16 = 32;
    const FRAMES: usize = 8;
    let mut sim = sharing_frames(FRAMES);
    let mss = sim.b.local_mss();
    let capture = Shared::default();
    sim.capture(Box::new(capture.clone()), iwarp_tcp::sim::Capture::Sent);
    let pairs = open_many(&mut sim, N);
    for (i, &(a, b)) in pairs.iter().enumerate() {
        let hello = data(100, i as u64);
        assert_eq!(one_way_on(&mut sim, a, b, &hello), hello);
        idle_for(&mut sim, Duration::from_millis(100));
    }
    idle_for(&mut sim, Duration::from_secs(3));
    stream_each(&mut sim, &pairs, 8 * mss, false);
    sim.finish_capture();
    let counters = sim.b.counters();
    assert!(counters.windows_retracted > 0, "{counters:?}");
    let (most, _) = windows_on_the_wire(&capture.0.borrow());
    let bound = FRAMES * mss;
    assert!(most <= bound, "{most} bytes open at once, bound {bound}");
}

/// B's windows on the wire, from a capture of the segments both send
/// (from before the connections opened): the most bytes they held open
/// at once (from each connection's first acknowledgement after its
/// SYN-ACK, whose window is not cut; none once B has acknowledged the
/// peer's FIN), and how many of B's segments closed a window. A right
/// edge never moves back but in a retraction: a pure acknowledgement
/// with a zero window.
fn windows_on_the_wire(pcap: &[u8]) -> (usize, usize) {
    // Per connection (A's port): B's window shift, the acknowledgement
    // number that covers A's FIN, the right edge B offered and the bytes
    // it holds open; their sum at every segment of B's.
    let mut shift: std::collections::HashMap<u16, u8> = Default::default();
    let mut fin: std::collections::HashMap<u16, u32> = Default::default();
    let mut edges: std::collections::HashMap<u16, (u32, usize)> = Default::default();
    let (mut open, mut most, mut closed_windows) = (0usize, 0usize, 0usize);
    for frame in pcap_frames(pcap) {
        let eth = EthernetFrame::new_checked(frame).unwrap();
        let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
            continue;
        };
        let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
        if ip.src_addr() != Sim::IP_B {
            if tcp.fin() {
                let end = tcp.seq_number().0 as u32 + tcp.payload().len() as u32 + 1;
                fin.insert(tcp.src_port(), end);
            }
            continue;
        }
        if tcp.rst() || !tcp.ack() {
            continue;
        }
        let port = tcp.dst_port();
        if tcp.syn() {
            let repr = TcpRepr::parse(
                &tcp,
                &Sim::IP_B.into(),
                &ip.dst_addr().into(),
                &ChecksumCapabilities::ignored(),
            )
            .unwrap();
            shift.insert(port, repr.window_scale.unwrap_or(0));
            continue;
        }
        let ack = tcp.ack_number().0 as u32;
        let window = usize::from(tcp.window_len()) << shift[&port];
        closed_windows += usize::from(window == 0);
        let edge = ack.wrapping_add(window as u32);
        let finished = fin
            .get(&port)
            .is_some_and(|&f| ack.wrapping_sub(f) as i32 >= 0);
        let held = if finished { 0 } else { window };
        if let Some(&(before, was)) = edges.get(&port) {
            let retracted = window == 0 && tcp.payload().is_empty();
            assert!(
                edge.wrapping_sub(before) as i32 >= 0 || retracted,
                "port {port}: right edge moved back from {before} to {edge}"
            );
            open -= was;
        }
        edges.insert(port, (edge, held));
        open += held;
        most = most.max(open);
    }
    (most, closed_windows)
}

/// A sends `len` bytes of its own on each of `pairs` (and closes once
/// they are sent, if `close`) while B reads, until B has them all (60 s
/// of simulated time at most): each connection gets its own bytes.
fn stream_each(sim: &mut Sim, pairs: &[(ConnId, ConnId)], len: usize, close: bool) {
    let msgs: Vec<Vec<u8>> = (0..pairs.len()).map(|i| data(len, i as u64)).collect();
    let mut sent = vec![0; pairs.len()];
    let mut closed = vec![false; pairs.len()];
    let mut got = vec![Vec::new(); pairs.len()];
    let limit = sim.now + Duration::from_secs(60);
    sim.run(limit, |s| {
        let mut done = true;
        for (i, &(a, b)) in pairs.iter().enumerate() {
            if sent[i] < len {
                sent[i] += s.a.send_slice(a, &msgs[i][sent[i]..]).unwrap_or(0);
            } else if close && !closed[i] {
                s.a.close(a).unwrap();
                closed[i] = true;
            }
            let _ = s.b.recv(b, |buf| {
                got[i].extend_from_slice(buf);
                buf.len()
            });
            done &= got[i].len() == len;
        }
        if done {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    assert!(got == msgs, "each connection got its own bytes");
}

/// More connections stream into one stack at once than its windows share
/// frames (`Config::window_frames`), each closing when it has sent: a
/// connection's window may close (the others hold the frames) and reopens
/// when a peer's filled window or FIN frees credit, by a window update
/// the stack sends itself. Every byte arrives and every connection
/// finishes (none starves), no right edge moves back, and the windows B
/// holds open on the wire (from its first acknowledgement after the
/// SYN-ACK, whose window is not cut; none once it has acknowledged the
/// peer's FIN) never add up to more than the frames.
#[test]
fn more_receivers_than_frames_take_turns_within_the_frames() {
    const N: u16 = 48;
    const FRAMES: usize = 16;
    let mut sim = sharing_frames(FRAMES);
    let mss = sim.b.local_mss();
    let len = 20 * mss + 100;
    let capture = Shared::default();
    sim.capture(Box::new(capture.clone()), iwarp_tcp::sim::Capture::Sent);
    let pairs = open_many(&mut sim, N);
    stream_each(&mut sim, &pairs, len, true);
    sim.finish_capture();
    let counters = sim.b.counters();
    assert!(counters.windows_cut > 0);
    assert!(counters.window_updates > 0, "{counters:?}");
    let (most, closed_windows) = windows_on_the_wire(&capture.0.borrow());
    assert!(closed_windows > 0, "some windows were closed");
    assert!(
        most <= FRAMES * mss,
        "{most} bytes open at once, frames {}",
        FRAMES * mss
    );
}

/// A window a peer leaves unused is retracted for the connections
/// waiting for credit on time although no frame arrives: B polls by the time the
/// share's next step is due (`Stack::poll_at`), as the engine gates its
/// polls (`Sim::gate_polls`). Connection 1's peer sends a few bytes and
/// stops, its window holding all of B's frames; connection 2's peer has
/// more to send than its first window took, and waits. The data arrives
/// as soon as with polls every round, by a window update B sends itself,
/// not in answer to the peer's zero-window probe, which backs off to a
/// minute.
#[test]
fn a_window_its_peer_leaves_unused_is_retracted_without_a_frame_arriving() {
    const FRAMES: usize = 4;
    let took = |gated: bool| {
        let mut sim = sharing_frames(FRAMES);
        sim.gate_polls(gated);
        let (a1, b1) = connect(&mut sim, 40000, Duration::from_secs(5));
        // B acknowledges the few bytes with a window of the whole pool,
        // which their peer leaves unused.
        let few = data(100, 1);
        assert_eq!(one_way_on(&mut sim, a1, b1, &few), few);
        idle_for(&mut sim, Duration::from_millis(50));
        let (a2, b2) = connect(&mut sim, 40001, Duration::from_secs(5));
        let len = 128 * sim.b.local_mss();
        let out = data(len, 2);
        let (mut sent, mut got) = (0, Vec::new());
        let start = sim.now;
        let limit = sim.now + Duration::from_secs(120);
        sim.run(limit, |s| {
            let mut progress = false;
            if sent < len {
                let n = s.a.send_slice(a2, &out[sent..]).unwrap();
                sent += n;
                progress |= n > 0;
            }
            let _ = s.b.recv(b2, |buf| {
                got.extend_from_slice(buf);
                progress |= !buf.is_empty();
                buf.len()
            });
            if got.len() == len {
                Step::Done
            } else if progress {
                Step::Progress
            } else {
                Step::Idle
            }
        })
        .unwrap_or_else(|e| panic!("gated {gated}: {e}; got {} of {len}", got.len()));
        assert_eq!(got, out);
        // The credit reached connection 2 by a window update B sent on
        // its own (a grant answering a frame of the peer's, such as a
        // zero-window probe, rides on that frame's acknowledgement).
        let counters = sim.b.counters();
        assert!(counters.window_updates > 0, "gated {gated}");
        assert!(counters.windows_retracted > 0, "gated {gated}");
        sim.now - start
    };
    let every = took(false);
    let gated = took(true);
    assert!(
        gated.total_micros() * 10 <= every.total_micros() * 11,
        "gated polls took {gated}, polls every round {every}"
    );
}

/// More connections stream into one stack than its windows share frames,
/// over a link that loses 3 % of the frames each way, under 64 seeds of
/// the losses. A peer whose segment is lost may go quiet for a
/// retransmission timeout, a second or more (doubled for each lost
/// retransmission), long enough for its window to be retracted while
/// others wait; smoltcp, whose timeout then fires into a closed window,
/// sends nothing more until a segment arrives. Such a connection (its
/// peer sent lately, or it was granted credit lately) is nudged, its
/// zero window sent again one, three and seven seconds later, on which
/// its peer starts probing and the probe queues it for credit; a window holding data past a hole is not
/// retracted; a window granted past a hole reaches past what arrived
/// (a probe's byte) by a segment, so that the peer has room for new
/// data. Every byte arrives and every connection finishes.
#[test]
fn peers_quiet_after_a_loss_get_their_window_back() {
    const N: u16 = 48;
    const FRAMES: usize = 16;
    let (mut retracted, mut nudged) = (0, 0);
    for seed in 1..=64 {
        let mut sim = sharing_frames_seeded(FRAMES, seed);
        let mss = sim.b.local_mss();
        let pairs = open_many(&mut sim, N);
        sim.set_faults(Faults::loss(0.03));
        stream_each(&mut sim, &pairs, 40 * mss, true);
        let counters = sim.b.counters();
        retracted += counters.windows_retracted;
        nudged += counters.retraction_nudges;
    }
    assert!(retracted > 0 && nudged > 0, "{retracted} {nudged}");
}

/// Bytes written into a connection whose peer's window is closed, with
/// nothing else queued or in flight, leave as a zero-window probe at once.
/// When many connections write at one instant, at most `PROBE_LIMIT` of
/// their probes are unanswered at any time, not all of them together;
/// each connection probes, and once B reads, every byte arrives.
#[test]
fn zero_window_probes_of_many_writes_wait_for_answers() {
    probes_wait_for_answers(false);
}

/// Connections whose windows closed at one instant with bytes waiting
/// probe on smoltcp's timers, set at that instant: at most `PROBE_LIMIT`
/// of their probes are unanswered at any time too.
#[test]
fn zero_window_probes_of_many_timers_wait_for_answers() {
    probes_wait_for_answers(true);
}

/// `3 * PROBE_LIMIT` connections fill B's windows (B reads nothing), with
/// two bytes more than the windows (`queued`: the probes are on smoltcp's
/// timers) or with those bytes written once the windows closed (two
/// writes into each closed window, all at one instant: the second finds
/// the probe of the first waiting). Each write is followed by
/// `egress_now`, which sends a probe only when it has its turn. Walks the
/// frames in the order they were sent: a probe is A's segment with
/// payload, answered by B's next segment on its connection (sent before A
/// hears it, so the count is at most what A had unanswered).
fn probes_wait_for_answers(queued: bool) {
    const N: u16 = 3 * PROBE_LIMIT as u16;
    let b_cfg = Config {
        rx_buffer: MIN_BUFFER,
        ..small()
    };
    // No serialisation delay: the windows close at about one instant.
    let link = LinkConfig {
        latency: Duration::from_millis(2),
        rate_bps: 0,
        ..LinkConfig::default()
    };
    let mut sim = Sim::new(small(), b_cfg, link);
    let pairs = open_many(&mut sim, N);
    // smoltcp's first probe on a write is due a retransmission timeout
    // after its clock's zero: at once only past that.
    idle_for(&mut sim, Duration::from_secs(1));
    let capture = Shared::default();
    sim.capture(Box::new(capture.clone()), iwarp_tcp::sim::Capture::Sent);
    const EXTRA: usize = 2;
    let fill = data(MIN_BUFFER + EXTRA, 1);
    let before = if queued { fill.len() } else { MIN_BUFFER };
    let mut sent = vec![0; pairs.len()];
    let limit = sim.now + Duration::from_secs(10);
    sim.run(limit, |s| {
        for (i, &(a, _)) in pairs.iter().enumerate() {
            sent[i] += s.a.send_slice(a, &fill[sent[i]..before]).unwrap();
            s.a.egress_now(a, s.now);
        }
        let waiting = pairs
            .iter()
            .all(|&(a, _)| s.a.send_queue(a) == if queued { EXTRA } else { 0 });
        if waiting && sent.iter().all(|&n| n == before) {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    if queued {
        idle_for(&mut sim, Duration::from_secs(3));
    } else {
        let mut more = vec![false; pairs.len()];
        let limit = sim.now + Duration::from_secs(2);
        sim.run(limit, |s| {
            for (i, &(a, _)) in pairs.iter().enumerate() {
                if !more[i] {
                    let one = s.a.send_slice(a, &fill[before..before + 1]).unwrap();
                    // Sent at once unless the probe waits for its turn.
                    s.a.egress_now(a, s.now);
                    let two = s.a.send_slice(a, &fill[before + 1..]).unwrap();
                    s.a.egress_now(a, s.now);
                    assert_eq!(one + two, EXTRA);
                    more[i] = true;
                }
            }
            if more.iter().all(|&m| m) && pairs.iter().all(|&(a, _)| s.a.send_queue(a) == EXTRA) {
                Step::Done
            } else {
                Step::Idle
            }
        })
        .unwrap();
        idle_for(&mut sim, Duration::from_millis(50));
    }
    sim.finish_capture();
    let pcap = capture.0.borrow();
    let mut records = pcap_records(&pcap);
    records.sort_by_key(|&(time, _)| time);
    let mut out = std::collections::HashSet::new();
    let mut probed = std::collections::HashSet::new();
    let mut most = 0;
    let mut probes = 0u64;
    for (_, frame) in records {
        let eth = EthernetFrame::new_checked(frame).unwrap();
        let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
        let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
        if ip.src_addr() == Sim::IP_A && tcp.payload().len() == 1 {
            out.insert(tcp.src_port());
            probed.insert(tcp.src_port());
            probes += 1;
            most = most.max(out.len());
        } else if ip.src_addr() == Sim::IP_B {
            out.remove(&tcp.dst_port());
        }
    }
    assert_eq!(probed.len(), usize::from(N), "connections that probed");
    assert!(
        most > PROBE_LIMIT / 2 && most <= PROBE_LIMIT,
        "{most} probes unanswered at once"
    );
    let delayed = sim.a.counters().probes_delayed;
    // Each probe that waited counts once, however often its connection
    // wrote or its timer fired while it waited.
    assert!(
        delayed >= u64::from(N) - PROBE_LIMIT as u64 && delayed <= probes,
        "{delayed} probes delayed, {probes} sent"
    );
    // B reads: every byte arrives.
    let mut got = vec![0; pairs.len()];
    let limit = sim.now + Duration::from_secs(30);
    sim.run(limit, |s| {
        for (i, &(_, b)) in pairs.iter().enumerate() {
            let _ = s.b.recv(b, |buf| {
                got[i] += buf.len();
                buf.len()
            });
        }
        if got.iter().all(|&n| n == fill.len()) {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
}

/// More connections than the frames have turns for stream into one stack
/// at once and stop, their connections left open (no FIN returns their
/// credit), each ending with a tail shorter than a turn. The rest of each
/// last turn is retracted 40–50 ms after its peer's last segment, a short
/// one, while others wait; turns follow what peers used of theirs. Every
/// byte arrives within a second of simulated time (with the rest of each
/// turn held until it had gone unused for a second, this took 6 s).
#[test]
fn tails_shorter_than_a_turn_drain_in_short_turns() {
    const N: u16 = 256;
    const FRAMES: usize = 64;
    let mut sim = sharing_frames(FRAMES);
    let mss = sim.b.local_mss();
    let len = 200 * mss + 300;
    let pairs = open_many(&mut sim, N);
    let start = sim.now;
    stream_each(&mut sim, &pairs, len, false);
    let counters = sim.b.counters();
    assert!(
        counters.turns_filled > 0 && counters.turns_ended_quiet > 0,
        "{counters:?}"
    );
    let took = sim.now - start;
    assert!(
        took < Duration::from_secs(1),
        "the tails took {took} to arrive (simulated time)"
    );
}

#[test]
fn conn_switches_count_frames_that_change_connection() {
    let mut sim = Sim::new(Config::default(), Config::default(), LinkConfig::default());
    let pairs = open_many(&mut sim, 2);
    // `msgs[i]` goes from A to B over pair `i`; B reads what arrives.
    let receive = |sim: &mut Sim, msgs: [&[u8]; 2]| {
        let before = sim.b.counters();
        let mut got = [Vec::new(), Vec::new()];
        for (&(a, _), msg) in pairs.iter().zip(msgs) {
            assert_eq!(sim.a.send_slice(a, msg), Ok(msg.len()));
        }
        let limit = sim.now + Duration::from_secs(10);
        sim.run(limit, |s| {
            for (i, &(_, b)) in pairs.iter().enumerate() {
                let _ = s.b.recv(b, |buf| {
                    got[i].extend_from_slice(buf);
                    buf.len()
                });
            }
            if got.iter().zip(msgs).all(|(g, m)| g.len() == m.len()) {
                Step::Done
            } else {
                Step::Idle
            }
        })
        .unwrap();
        let after = sim.b.counters();
        let runs: Vec<u64> = (0..FRAME_RUN_BUCKETS)
            .map(|k| after.frame_runs[k] - before.frame_runs[k])
            .collect();
        (
            after.rx_frames - before.rx_frames,
            after.conn_switches - before.conn_switches,
            runs,
        )
    };
    let msg = data(8 * 1024, 1);
    // One connection's frames: at most the one switch to it, which ends
    // the run before it (the handshakes' frames came before).
    let (frames, switches, runs) = receive(&mut sim, [&msg, b""]);
    assert!(frames >= 5, "{frames} frames");
    assert!(switches <= 1, "{switches} switches in {frames} frames");
    assert_eq!(runs.iter().sum::<u64>(), switches, "runs {runs:?}");
    // Both connections' frames: at least a switch to each. Every switch
    // ends a run; the first ends the run of at least five frames above
    // (4–7 frames or longer).
    let (frames, switches, runs) = receive(&mut sim, [&msg, &msg]);
    assert!(
        (2..=frames).contains(&switches),
        "{switches} switches in {frames} frames"
    );
    assert_eq!(runs.iter().sum::<u64>(), switches, "runs {runs:?}");
    assert!(runs[2..].iter().sum::<u64>() >= 1, "runs {runs:?}");
}

/// Each visit that moves a connection's deadline pushes a timer entry,
/// and the deadline itself is kept in the connection's slot: entries of
/// moved deadlines and of released connections are told apart from
/// there and never outnumber the live ones for long. A released
/// connection's entry is dropped when the heap is next looked at, and
/// the connection that takes its slot runs on timers of its own.
#[test]
fn stale_timer_entries_are_dropped() {
    let quiet = Config {
        idle_release: None,
        ..small()
    };
    let mut sim = Sim::new(quiet, quiet, LinkConfig::default());
    let pairs = open_many(&mut sim, 32);
    for round in 0..40u8 {
        let mut got = vec![0usize; pairs.len()];
        for &(a, _) in &pairs {
            assert_eq!(sim.a.send_slice(a, &[round; 300]), Ok(300));
        }
        let limit = sim.now + Duration::from_secs(5);
        sim.run(limit, |s| {
            for (i, &(_, b)) in pairs.iter().enumerate() {
                got[i] += s.b.recv(b, |buf| buf.len()).unwrap();
            }
            let live = s.a.connection_count();
            assert!(
                s.a.timer_entries() <= 3 * live + 64,
                "{} timer entries for {live} connections",
                s.a.timer_entries()
            );
            if got.iter().all(|&n| n == 300) {
                Step::Done
            } else {
                Step::Idle
            }
        })
        .unwrap();
    }
    // Let every acknowledgement and delayed-ACK timer run out.
    idle_for(&mut sim, Duration::from_secs(2));
    let _ = sim.a.poll_at(sim.now);
    assert_eq!(sim.a.timer_entries(), 0);
    // One connection's segment is lost: its retransmission timer is the
    // heap's one entry.
    sim.set_faults(Faults::loss(1.0));
    let (x, _) = pairs[7];
    assert_eq!(sim.a.send_slice(x, b"lost"), Ok(4));
    sim.poll();
    let rto = sim.a.poll_at(sim.now).expect("a retransmission timer");
    assert!(rto > sim.now);
    assert_eq!(sim.a.timer_entries(), 1);
    // Released with its timer running, the connection's entry is stale:
    // the next look at the heap drops it.
    sim.a.release(x).unwrap();
    let _ = sim.a.poll_at(sim.now);
    assert_eq!(sim.a.timer_entries(), 0);
    // The next connection takes the slot and has deadlines of its own.
    sim.set_faults(Faults::default());
    let (y, b) = connect(&mut sim, 40000, Duration::from_secs(1));
    assert_eq!(one_way_on(&mut sim, y, b, b"again"), b"again");
}
