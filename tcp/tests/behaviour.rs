//! Configuration in effect (window scaling, no Nagle, MSS), connection
//! management (listen re-armed, backlog, EOF, reset), faults and
//! determinism, over the simulated link.

mod common;

use common::{bulk, connect, data, one_way_on, recv_on, sharing_frames, PORT};
use iwarp_tcp::sim::{Faults, LinkConfig, Sim, Step};
use iwarp_tcp::{Config, Error, State};
use smoltcp::time::Duration;

fn one_way(sim: &mut Sim, len: usize) -> Vec<u8> {
    let (a, b) = connect(sim, 40000, Duration::from_secs(5));
    let out = data(len, 7);
    let mut got = Vec::with_capacity(len);
    let mut sent = 0;
    let limit = sim.now + Duration::from_secs(60);
    sim.run(limit, |s| {
        let n = s.a.send_slice(a, &out[sent..]).unwrap();
        sent += n;
        let m =
            s.b.recv(b, |buf| {
                got.extend_from_slice(buf);
                buf.len()
            })
            .unwrap();
        if got.len() == len {
            Step::Done
        } else if n + m > 0 {
            Step::Progress
        } else {
            Step::Idle
        }
    })
    .unwrap();
    got
}

/// A long, fast link: the bandwidth-delay product is far above 64 KiB.
fn long_link() -> LinkConfig {
    LinkConfig {
        latency: Duration::from_millis(2),
        rate_bps: 10_000_000_000,
        ..LinkConfig::default()
    }
}

#[test]
fn window_scaling_allows_more_than_64k_in_flight() {
    let mut sim = Sim::new(Config::default(), Config::default(), long_link());
    let got = one_way(&mut sim, 4 << 20);
    assert_eq!(got, data(4 << 20, 7));
    let in_flight = sim.a_to_b().max_in_flight;
    assert!(in_flight > 65535, "{in_flight}");
    assert!(
        in_flight <= Config::default().rx_buffer as u64,
        "{in_flight}"
    );
}

#[test]
fn small_buffer_bounds_what_is_in_flight() {
    let small = Config {
        rx_buffer: 32 * 1024,
        tx_buffer: 32 * 1024,
        ..Config::default()
    };
    let mut sim = Sim::new(small, small, long_link());
    let got = one_way(&mut sim, 1 << 20);
    assert_eq!(got.len(), 1 << 20);
    let in_flight = sim.a_to_b().max_in_flight;
    assert!(in_flight <= 32 * 1024, "{in_flight}");
}

/// Returns the A→B payload bytes on the wire after each of two 10-byte
/// writes, with no time passing (the first is not acknowledged yet).
fn two_small_writes(config: Config) -> (u64, u64) {
    let mut sim = Sim::new(config, config, LinkConfig::default());
    let (a, _b) = connect(&mut sim, 40000, Duration::from_secs(1));
    // Let the handshake's last ACK land and settle.
    let limit = sim.now + Duration::from_millis(10);
    let _ = sim.run(limit, |_| Step::Idle);
    let before = sim.a_to_b().payload_bytes;
    assert_eq!(sim.a.send_slice(a, &[1; 10]), Ok(10));
    sim.poll();
    let first = sim.a_to_b().payload_bytes - before;
    assert_eq!(sim.a.send_slice(a, &[2; 10]), Ok(10));
    sim.poll();
    let second = sim.a_to_b().payload_bytes - before;
    (first, second)
}

#[test]
fn no_nagle_small_writes_leave_at_once() {
    assert_eq!(two_small_writes(Config::default()), (10, 20));
    // With Nagle the second write waits for the first one's ACK.
    let nagle = Config {
        nagle: true,
        ..Config::default()
    };
    assert_eq!(two_small_writes(nagle), (10, 10));
}

#[test]
fn emss_is_the_smaller_mss_of_both_ends() {
    let link = LinkConfig {
        mtu: 9014,
        mtu_b: Some(4110),
        ..LinkConfig::default()
    };
    let mut sim = Sim::new(Config::default(), Config::default(), link);
    assert_eq!(sim.a.local_mss(), 8960);
    assert_eq!(sim.b.local_mss(), 4056);
    let (a, b) = connect(&mut sim, 40000, Duration::from_secs(1));
    assert_eq!(sim.a.emss(a), Some(4056));
    assert_eq!(sim.b.emss(b), Some(4056));
    // Segments on the wire respect it.
    let got = one_way_on(&mut sim, a, b, &data(200_000, 9));
    assert_eq!(got, data(200_000, 9));
    let s = sim.a_to_b();
    assert!(s.sent >= 200_000 / 4056);
}

#[test]
fn emss_unknown_before_established() {
    let mut sim = Sim::new(Config::default(), Config::default(), LinkConfig::default());
    sim.b.listen(PORT).unwrap();
    let a = sim.a.connect((Sim::IP_B, PORT), 40000).unwrap();
    assert_eq!(sim.a.emss(a), None);
    assert_eq!(sim.a.state(a), Some(State::SynSent));
    assert_eq!(sim.a.send_slice(a, b"early"), Ok(0));
    assert_eq!(sim.a.recv(a, |b| b.len()), Ok(0));
}

#[test]
fn listener_rearms_and_backlog_limits() {
    let config = Config {
        backlog: 2,
        ..Config::default()
    };
    let mut sim = Sim::new(config, config, LinkConfig::default());
    sim.b.listen(PORT).unwrap();
    assert_eq!(sim.b.listen(PORT), Err(Error::AlreadyListening));
    let clients: Vec<_> = (0..3)
        .map(|i| sim.a.connect((Sim::IP_B, PORT), 41000 + i).unwrap())
        .collect();
    let limit = sim.now + Duration::from_secs(5);
    sim.run(limit, |s| {
        // The third completes its handshake on the client's side; the
        // server, its accept queue full, answers with a reset.
        let done = clients
            .iter()
            .all(|&c| s.a.is_established(c) || s.a.is_reset(c));
        let reset = clients.iter().filter(|&&c| s.a.is_reset(c)).count();
        if done && reset == 1 && s.b.counters().accepted == 2 {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    let est = clients.iter().filter(|&&c| sim.a.is_established(c)).count();
    let reset = clients.iter().filter(|&&c| sim.a.is_reset(c)).count();
    assert_eq!((est, reset), (2, 1), "{:?}", sim.b.counters());
    assert_eq!(sim.b.counters().backlog_full, 1);
    let first = sim.b.accept(PORT).unwrap();
    let second = sim.b.accept(PORT).unwrap();
    assert_ne!(first, second);
    assert_eq!(sim.b.accept(PORT), None);
    assert_eq!(sim.b.counters().accepted, 2);
    // Accepting made room: the port listens again.
    let late = sim.a.connect((Sim::IP_B, PORT), 42000).unwrap();
    let mut third = None;
    let limit = sim.now + Duration::from_secs(5);
    sim.run(limit, |s| {
        third = third.or_else(|| s.b.accept(PORT));
        if third.is_some() && s.a.is_established(late) {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    let (local, remote) = sim.b.endpoints(third.unwrap()).unwrap();
    assert_eq!((local.port, remote.port), (PORT, 42000));
}

#[test]
fn eof_and_half_close() {
    let mut sim = Sim::new(Config::default(), Config::default(), LinkConfig::default());
    let (a, b) = connect(&mut sim, 40000, Duration::from_secs(1));
    sim.a.send_slice(a, b"last words").unwrap();
    sim.a.close(a).unwrap();
    let mut got = Vec::new();
    let limit = sim.now + Duration::from_secs(1);
    sim.run(limit, |s| {
        let _ = s.b.recv(b, |buf| {
            got.extend_from_slice(buf);
            buf.len()
        });
        if s.b.is_eof(b) {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    assert_eq!(got, b"last words");
    assert_eq!(sim.b.recv(b, |x| x.len()), Err(Error::Finished));
    // B's direction is still open.
    assert_eq!(sim.b.send_slice(b, b"reply"), Ok(5));
    sim.b.close(b).unwrap();
    let mut reply = Vec::new();
    let limit = sim.now + Duration::from_secs(30);
    sim.run(limit, |s| {
        let _ = s.a.recv(a, |buf| {
            reply.extend_from_slice(buf);
            buf.len()
        });
        if s.a.is_eof(a) && s.b.is_closed(b) && s.a.is_closed(a) {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    assert_eq!(reply, b"reply");
    assert!(!sim.a.is_reset(a) && !sim.b.is_reset(b));
    sim.a.release(a).unwrap();
    assert_eq!(sim.a.release(a), Err(Error::UnknownConnection));
    assert_eq!(sim.a.state(a), None);
}

#[test]
fn reset_is_detected() {
    let mut sim = Sim::new(Config::default(), Config::default(), LinkConfig::default());
    let (a, b) = connect(&mut sim, 40000, Duration::from_secs(1));
    sim.a.abort(a).unwrap();
    let limit = sim.now + Duration::from_secs(1);
    sim.run(limit, |s| {
        if s.b.is_reset(b) {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    assert!(sim.a.is_reset(a));
    assert!(!sim.b.is_eof(b));
    assert_eq!(sim.b.send_slice(b, b"x"), Err(Error::InvalidState));
    assert_eq!(sim.b.recv(b, |x| x.len()), Err(Error::InvalidState));
    assert_eq!(sim.b.counters().resets, 1);
}

#[test]
fn connect_to_closed_port_is_reset() {
    let mut sim = Sim::new(Config::default(), Config::default(), LinkConfig::default());
    let a = sim.a.connect((Sim::IP_B, 9), 40000).unwrap();
    let limit = sim.now + Duration::from_secs(1);
    sim.run(limit, |s| {
        if s.a.is_reset(a) {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
}

/// Flips with a fixed TCP checksum get through TCP (only a CRC above can
/// see them); flips with a broken checksum are dropped and retransmitted.
#[test]
fn bit_flips_with_and_without_checksum_fix() {
    for fix in [false, true] {
        let link = LinkConfig {
            faults: Faults {
                corrupt: 0.05,
                fix_checksum: fix,
                ..Faults::default()
            },
            seed: 3,
            ..LinkConfig::default()
        };
        let mut sim = Sim::new(Config::default(), Config::default(), link);
        let got = one_way(&mut sim, 1 << 20);
        let want = data(1 << 20, 7);
        assert!(sim.a_to_b().corrupted > 0);
        let differ = got.iter().zip(&want).filter(|(x, y)| x != y).count();
        if fix {
            assert!(differ > 0, "damaged bytes reach the application");
        } else {
            assert_eq!(differ, 0, "the TCP checksum catches every flip");
        }
    }
}

#[test]
fn same_seed_same_run() {
    let link = LinkConfig {
        faults: Faults {
            drop: 0.02,
            duplicate: 0.01,
            reorder: 0.01,
            reorder_delay: Duration::from_micros(100),
            ..Faults::default()
        },
        seed: 99,
        ..LinkConfig::default()
    };
    let r1 = bulk(
        Config::default(),
        link,
        256 * 1024,
        true,
        Duration::from_secs(120),
    );
    let r2 = bulk(
        Config::default(),
        link,
        256 * 1024,
        true,
        Duration::from_secs(120),
    );
    assert_eq!(r1.took, r2.took);
    assert_eq!(r1.sim.a_to_b(), r2.sim.a_to_b());
    assert_eq!(r1.sim.b_to_a(), r2.sim.b_to_a());
    assert_eq!(r1.sim.a.counters(), r2.sim.a.counters());
}

#[test]
fn counters_and_static_neighbours() {
    let mut sim = Sim::new(Config::default(), Config::default(), LinkConfig::default());
    let (a, _b) = connect(&mut sim, 40000, Duration::from_secs(1));
    // Idle for longer than smoltcp's neighbour lifetime: the static
    // entry is refreshed, so sending needs no ARP.
    let limit = sim.now + Duration::from_secs(200);
    let _ = sim.run(limit, |_| Step::Idle);
    let before = sim.a_to_b().sent;
    sim.a.send_slice(a, b"still there").unwrap();
    sim.poll();
    assert_eq!(sim.a_to_b().sent, before + 1, "data, not an ARP request");
    let c = sim.a.counters();
    assert!(c.neighbor_refreshes >= 6, "{c:?}");
    assert_eq!(c.connects, 1);
    assert_eq!(c.tx_frames, sim.a_to_b().sent);
    assert!(c.rx_frames > 0 && c.rx_bytes > 0 && c.tx_bytes > 0);
}

/// After a poll that left nothing to send, `needs_poll` is false (the
/// engine then skips smoltcp's walk over its sockets) until one of
/// smoltcp's timers is due or a call changed a socket: queued data, or
/// received bytes consumed from a ring at least half full (a window
/// update may be due). A few bytes read from a nearly empty ring owe the
/// peer nothing.
#[test]
fn needs_poll_after_an_idle_poll() {
    let mut sim = Sim::new(Config::default(), Config::default(), LinkConfig::default());
    let (a, b) = connect(&mut sim, 40000, Duration::from_secs(5));
    let settle = sim.now + Duration::from_millis(50);
    sim.run(settle + Duration::from_secs(1), |s| {
        if s.now >= settle {
            Step::Done
        } else {
            Step::IdleUntil(settle)
        }
    })
    .unwrap();
    let now = sim.now;
    while sim.a.poll(now) {}
    assert!(
        !sim.a.needs_poll(now),
        "idle after a poll with nothing to do"
    );
    // Queued data wakes it; once sent, the retransmission timer is what
    // is due next.
    assert_eq!(sim.a.send_slice(a, b"ping").unwrap(), 4);
    assert!(sim.a.needs_poll(now));
    while sim.a.poll(now) {}
    assert!(!sim.a.needs_poll(now));
    let rto = sim.a.poll_at(now).expect("a retransmission timer");
    assert!(rto > now);
    assert!(sim.a.needs_poll(rto), "a due timer needs a poll");
    // B consumes what arrives: right after that a poll is needed.
    let mut got = Vec::new();
    let limit = sim.now + Duration::from_secs(1);
    sim.run(limit, |s| {
        let n =
            s.b.recv(b, |buf| {
                got.extend_from_slice(buf);
                buf.len()
            })
            .unwrap();
        if n > 0 {
            assert!(
                !s.b.needs_poll(s.now),
                "4 bytes read from an empty 256 KiB ring: no window update due"
            );
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    assert_eq!(got, b"ping");
    // A poll that processes a segment and leaves nothing to send (its ACK
    // waits for the delayed-ACK timer) leaves the stack quiet at once.
    sim.a.send_slice(a, b"pong").unwrap();
    let limit = sim.now + Duration::from_secs(1);
    sim.run(limit, |s| {
        if s.b.device().rx.is_empty() {
            Step::Idle
        } else {
            Step::Done
        }
    })
    .unwrap();
    assert!(sim.b.poll(sim.now), "the segment was processed");
    assert!(
        !sim.b.needs_poll(sim.now),
        "quiet after a poll that did work"
    );
    assert!(sim.b.poll_at(sim.now).is_some_and(|t| t > sim.now));
}

/// The reader side of a zero window, with polls gated as the engine gates
/// them (`Sim::gate_polls`): a receiver whose small ring the sender
/// fills, and which then reads a piece every 50 µs, reopens the window
/// without waiting for the sender's window probes. Compared with the same
/// transfer polled every round, in simulated time.
#[test]
fn gated_polls_reopen_a_closed_window() {
    const LEN: usize = 256 * 1024;
    const RING: usize = 16 * 1024;
    let pace = Duration::from_micros(50);
    let took = |gated: bool, chunk: usize| {
        let b_cfg = Config {
            rx_buffer: RING,
            ..Config::default()
        };
        let mut sim = Sim::new(Config::default(), b_cfg, LinkConfig::default());
        sim.gate_polls(gated);
        let (a, b) = connect(&mut sim, 40000, Duration::from_secs(5));
        let out = data(LEN, 7);
        let (mut sent, mut got) = (0, 0);
        let mut full = false;
        let start = sim.now;
        let mut next_read = start;
        let limit = sim.now + Duration::from_secs(120);
        sim.run(limit, |s| {
            let mut progress = false;
            if sent < LEN {
                let n = s.a.send_slice(a, &out[sent..]).unwrap();
                sent += n;
                progress |= n > 0;
            }
            // Read only once the ring is full (less than a segment free),
            // then a piece at a time.
            full |= s.b.recv_queue(b) + 1460 > RING;
            if full && s.now >= next_read {
                let n =
                    s.b.recv(b, |buf| {
                        let n = buf.len().min(chunk - got % chunk);
                        assert_eq!(&buf[..n], &out[got..got + n]);
                        got += n;
                        n
                    })
                    .unwrap();
                if got % chunk == 0 || got == LEN {
                    next_read = s.now + pace;
                }
                progress |= n > 0;
            }
            if got == LEN {
                Step::Done
            } else if progress {
                Step::Progress
            } else if full {
                Step::IdleUntil(next_read.max(s.now))
            } else {
                Step::Idle
            }
        })
        .unwrap_or_else(|e| panic!("gated {gated}, chunk {chunk}: {e}; got {got} of {LEN}"));
        sim.now - start
    };
    for chunk in [512, 4096, RING] {
        let every = took(false, chunk);
        let gated = took(true, chunk);
        assert!(
            gated.total_micros() * 10 <= every.total_micros() * 11,
            "chunk {chunk}: gated polls took {gated}, polls every round {every}"
        );
    }
}

/// `rx_budget` bounds the receive buffers of all sockets together (the
/// sum of the windows peers can fill): each new socket gets `rx_buffer`
/// cut to what the others leave, at least `MIN_BUFFER`; a connection
/// with a cut buffer still moves data.
#[test]
fn rx_budget_bounds_the_sum_of_receive_buffers() {
    const BUF: usize = 64 * 1024;
    const BUDGET: usize = 160 * 1024;
    let b_cfg = Config {
        rx_buffer: BUF,
        rx_budget: Some(BUDGET),
        ..Config::default()
    };
    let mut sim = Sim::new(Config::default(), b_cfg, LinkConfig::default());
    let conns: Vec<_> = (0..4)
        .map(|i| connect(&mut sim, 40010 + i, Duration::from_secs(5)))
        .collect();
    let caps: Vec<usize> = conns
        .iter()
        .map(|&(_, b)| sim.b.rx_capacity(b).unwrap())
        .collect();
    // The listener's armed socket counts too; every socket took what the
    // others left.
    assert_eq!(caps[0], BUF, "{caps:?}");
    assert!(caps.windows(2).all(|w| w[1] <= w[0]), "{caps:?}");
    assert!(caps[2] < BUF, "{caps:?}");
    assert_eq!(caps[3], iwarp_tcp::MIN_BUFFER, "{caps:?}");
    assert!(
        caps[..3].iter().sum::<usize>() <= BUDGET,
        "{caps:?} over {BUDGET}"
    );
    // The connection left with the smallest buffer still moves data.
    let (a, b) = conns[3];
    assert_eq!(
        one_way_on(&mut sim, a, b, &data(200_000, 9)),
        data(200_000, 9)
    );
    // Without a budget every connection gets the full buffer.
    let mut free = Sim::new(
        Config::default(),
        Config {
            rx_buffer: BUF,
            ..Config::default()
        },
        LinkConfig::default(),
    );
    let (_, b) = connect(&mut free, 40020, Duration::from_secs(5));
    let (_, b2) = connect(&mut free, 40021, Duration::from_secs(5));
    assert_eq!(
        (free.b.rx_capacity(b), free.b.rx_capacity(b2)),
        (Some(BUF), Some(BUF))
    );
}

/// With `window_frames`, a new connection's receive buffer is its part
/// of the frames' bytes while the connections open then all receive
/// (whole pages, at least `SHARED_BUFFER_MIN`, at most `rx_buffer`): the
/// first ones get the whole buffer, later ones less, down to the floor;
/// a connection at the floor still moves data; without `window_frames`
/// nothing is cut.
#[test]
fn shared_frames_size_new_receive_buffers() {
    const FRAMES: usize = 200;
    let mut sim = sharing_frames(FRAMES);
    let mss = sim.b.local_mss();
    let conns: Vec<_> = (0..8)
        .map(|i| connect(&mut sim, 40030 + i, Duration::from_secs(5)))
        .collect();
    let caps: Vec<usize> = conns
        .iter()
        .map(|&(_, b)| sim.b.rx_capacity(b).unwrap())
        .collect();
    assert_eq!(caps[0], Config::default().rx_buffer, "{caps:?}");
    assert!(caps.windows(2).all(|w| w[1] <= w[0]), "{caps:?}");
    for (i, &cap) in caps.iter().enumerate() {
        assert_eq!(cap % 4096, 0, "{caps:?}");
        let part = (FRAMES * mss / (i + 1)).div_ceil(4096) * 4096;
        let want = part.clamp(iwarp_tcp::SHARED_BUFFER_MIN, Config::default().rx_buffer);
        assert_eq!(cap, want, "connection {i}: {caps:?}");
    }
    assert_eq!(caps[7], iwarp_tcp::SHARED_BUFFER_MIN, "{caps:?}");
    let (a, b) = conns[7];
    assert_eq!(
        one_way_on(&mut sim, a, b, &data(300_000, 9)),
        data(300_000, 9)
    );
    let mut free = Sim::new(Config::default(), Config::default(), LinkConfig::default());
    let opened: Vec<_> = (0..8)
        .map(|i| connect(&mut free, 40040 + i, Duration::from_secs(5)))
        .collect();
    let sizes: Vec<_> = opened.iter().map(|&(_, b)| free.b.rx_capacity(b)).collect();
    assert!(sizes
        .iter()
        .all(|&c| c == Some(Config::default().rx_buffer)));
}

/// A window cut to less than two segments (`window_frames`) is
/// acknowledged segment by segment: the peer cannot send the second
/// segment that would end smoltcp's delayed acknowledgement, so a stream
/// through a one-segment window takes about one round trip per segment on
/// the simulated link's clock, not one delay each. With the full window
/// the delay stands: a lone segment is acknowledged only after it.
#[test]
fn narrow_windows_are_acknowledged_at_once() {
    const SEGMENTS: usize = 100;
    let narrow = Config {
        window_frames: Some(1),
        ..Config::default()
    };
    let delay = narrow.ack_delay.unwrap();
    let mut sim = Sim::new(Config::default(), narrow, LinkConfig::default());
    let (a, b) = connect(&mut sim, 40050, Duration::from_secs(5));
    let len = SEGMENTS * sim.b.local_mss();
    let start = sim.now;
    assert_eq!(one_way_on(&mut sim, a, b, &data(len, 9)), data(len, 9));
    let took = sim.now - start;
    assert!(sim.b.counters().windows_cut > 0);
    assert!(
        took.total_micros() * 2 < delay.total_micros() * SEGMENTS as u64,
        "{SEGMENTS} segments through a one-segment window took {took} (delay {delay})"
    );
    // The full window keeps the delay for a lone segment.
    let mut wide = Sim::new(Config::default(), Config::default(), LinkConfig::default());
    let (a, b) = connect(&mut wide, 40051, Duration::from_secs(5));
    wide.a.send_slice(a, b"lone").unwrap();
    let start = wide.now;
    let limit = wide.now + Duration::from_secs(1);
    let mut got = 0;
    wide.run(limit, |s| {
        got += s.b.recv(b, |buf| buf.len()).unwrap();
        if got == 4 && s.a.send_queue(a) == 0 {
            Step::Done
        } else {
            Step::Idle
        }
    })
    .unwrap();
    assert!(
        wide.now - start >= delay,
        "acknowledged after {}",
        wide.now - start
    );
}

/// `egress_now` sends the segments a connection queued before any poll:
/// whole segments, all of them (the window is open), and a second call
/// finds nothing left; the bytes arrive intact.
#[test]
fn egress_now_sends_queued_segments_before_the_poll() {
    let no_cc = Config {
        congestion: iwarp_tcp::CongestionControl::None,
        ..Config::default()
    };
    let mut sim = Sim::new(no_cc, Config::default(), LinkConfig::default());
    let (a, b) = connect(&mut sim, 40000, Duration::from_secs(5));
    let emss = sim.a.emss(a).unwrap();
    let payload = data(3 * emss, 5);
    let mut off = 0;
    let n = sim
        .a
        .send_segment(a, |buf, limit| {
            let n = buf.len().min(limit).min(payload.len() - off);
            buf[..n].copy_from_slice(&payload[off..off + n]);
            off += n;
            n
        })
        .unwrap();
    assert_eq!(n, payload.len());
    let before = sim.a.device().tx.len();
    assert!(sim.a.egress_now(a, sim.now));
    let frames: Vec<usize> = sim
        .a
        .device()
        .tx
        .iter()
        .skip(before)
        .map(Vec::len)
        .collect();
    assert_eq!(frames.len(), 3, "{frames:?}");
    assert!(frames.iter().all(|&len| len == frames[0]), "{frames:?}");
    assert_eq!(sim.a.unsent(a), Some(0));
    assert!(!sim.a.egress_now(a, sim.now));
    assert!(recv_on(&mut sim, b, payload.len()) == payload);
}

/// `egress_now` stamps what it sends with the caller's clock, not with
/// that of the last poll: an engine polls only when it has work, and a
/// write after ten idle seconds must not start its retransmission timer
/// ten seconds in the past. A poll 10 ms after the send, with the
/// acknowledgement not back yet, resends nothing; the bytes arrive once.
#[test]
fn egress_now_sends_at_the_callers_time() {
    let mut sim = Sim::new(Config::default(), Config::default(), LinkConfig::default());
    let (a, b) = connect(&mut sim, 40000, Duration::from_secs(5));
    let emss = sim.a.emss(a).unwrap();
    let payload = data(emss, 6);
    let later = sim.now + Duration::from_secs(10);
    assert_eq!(sim.a.send_slice(a, &payload).unwrap(), payload.len());
    let before = sim.a.device().tx.len();
    assert!(sim.a.egress_now(a, later));
    let sent = sim.a.device().tx.len();
    assert_eq!(sent, before + 1);
    sim.a.poll(later + Duration::from_millis(10));
    assert_eq!(
        sim.a.device().tx.len(),
        sent,
        "a retransmission 10 ms after the send"
    );
    sim.now = later + Duration::from_millis(10);
    assert!(recv_on(&mut sim, b, payload.len()) == payload);
}

/// `send_segment` queues whole segments: full ones back to back (smoltcp
/// cuts exactly between them) as far as the congestion window goes, none
/// after a shorter one until it has left, and what `unsent` reports
/// follows. Without congestion control a whole message goes in one call;
/// with Reno the first call fills smoltcp's initial window of 2048 bytes
/// exactly: a full segment and a short one, both sent whole.
#[test]
fn send_segment_queues_whole_segments() {
    let no_cc = Config {
        congestion: iwarp_tcp::CongestionControl::None,
        ..Config::default()
    };
    for config in [no_cc, Config::default()] {
        queue_whole_segments(config);
    }
}

fn queue_whole_segments(config: Config) {
    let reno = config.congestion == iwarp_tcp::CongestionControl::Reno;
    let mut sim = Sim::new(config, Config::default(), LinkConfig::default());
    let (a, b) = connect(&mut sim, 40000, Duration::from_secs(5));
    let emss = sim.a.emss(a).unwrap();
    assert_eq!(emss % 4, 0, "the MSS is cut to a multiple of 4");
    assert_eq!(sim.a.unsent(a), Some(0));
    let frames_before = sim.a_to_b().sent;
    let payload = data(3 * emss + 100 + 3 * 1000, 9);
    let mut off = 0;
    // Records of `record` bytes, or as much as the limit takes, up to
    // offset `end` of the payload.
    let mut write = |buf: &mut [u8], limit: usize, record: usize, end: usize| {
        assert!(limit <= emss, "limit {limit} > EMSS {emss}");
        let want = limit.min(end - off);
        let want = if record <= want {
            want / record * record
        } else {
            want
        };
        let n = buf.len().min(want);
        buf[..n].copy_from_slice(&payload[off..off + n]);
        off += n;
        n
    };
    let first = 3 * emss + 100;
    // Reno's initial window takes a full segment and a short one; the
    // rest waits for their acknowledgement.
    let calls: &[usize] = if reno {
        &[2048, 2 * emss + 100 - (2048 - emss)]
    } else {
        &[first]
    };
    // Until everything queued is acknowledged.
    let drain = |sim: &mut Sim| {
        let limit = sim.now + Duration::from_secs(1);
        sim.run(limit, |s| {
            if s.a.unsent(a) == Some(0) && s.a.send_queue(a) == 0 {
                Step::Done
            } else {
                Step::Idle
            }
        })
        .unwrap();
    };
    for &queued in calls {
        drain(&mut sim);
        let n = sim
            .a
            .send_segment(a, |buf, limit| write(buf, limit, usize::MAX, first))
            .unwrap();
        assert_eq!(n, queued);
        assert_eq!(sim.a.unsent(a), Some(queued));
        // Nothing behind the short last segment until it has left.
        assert_eq!(sim.a.send_segment(a, |_, _| unreachable!()).unwrap(), 0);
        // A round of egress sends a segment.
        for _ in 0..queued.div_ceil(emss) {
            sim.a.poll_egress(sim.now);
        }
        assert_eq!(sim.a.unsent(a), Some(0));
    }
    // Records of 1000 bytes: one per segment (with Reno, the window has
    // grown past three of them).
    drain(&mut sim);
    let (record, end) = (1000, payload.len());
    let mut got = Vec::new();
    let limit = sim.now + Duration::from_secs(5);
    sim.run(limit, |s| {
        let n =
            s.a.send_segment(a, |buf, limit| write(buf, limit, record, end))
                .unwrap();
        assert!(n == 0 || n == record, "{n}");
        let _ = s.b.recv(b, |buf| {
            got.extend_from_slice(buf);
            buf.len()
        });
        if got.len() == payload.len() {
            Step::Done
        } else if n > 0 {
            Step::Progress
        } else {
            Step::Idle
        }
    })
    .unwrap();
    assert!(got == payload);
    assert_eq!(sim.a.unsent(a), Some(0));
    // A sent one segment per chunk, and nothing else: three full and a
    // short one (with Reno two full and two short, the first cut at the
    // initial window), then three records.
    let s = sim.a_to_b();
    assert_eq!(s.sent - frames_before, 7, "{s:?}");
}

/// A connection whose application has nothing to write
/// (`set_writer_idle`) is not listed for the acknowledgements of what it
/// wrote before: they give it nothing to do. Data from the peer and the
/// peer's FIN still list it. Without the flag, the same acknowledgements
/// list it.
#[test]
fn an_idle_writer_is_listed_only_for_data_and_state() {
    for idle in [false, true] {
        let mut sim = Sim::new(Config::default(), Config::default(), LinkConfig::default());
        let (a, b) = connect(&mut sim, 40000, Duration::from_secs(5));
        let mut active = Vec::new();
        sim.b.take_active(&mut active);
        // B writes 20 segments' worth, then has nothing more.
        let out = data(20 * 1460, 5);
        assert_eq!(sim.b.send_slice(b, &out).unwrap(), out.len());
        sim.b.set_writer_idle(b, idle);
        let (mut got, mut listed) = (Vec::new(), 0);
        let limit = sim.now + Duration::from_secs(10);
        sim.run(limit, |s| {
            active.clear();
            s.b.take_active(&mut active);
            listed += active.iter().filter(|&&c| c == b).count();
            let _ = s.a.recv(a, |buf| {
                got.extend_from_slice(buf);
                buf.len()
            });
            if got.len() == out.len() && s.b.send_queue(b) == 0 {
                Step::Done
            } else {
                Step::Idle
            }
        })
        .unwrap();
        assert!(got == out, "idle {idle}");
        if idle {
            assert_eq!(listed, 0, "listed for acknowledgements alone");
        } else {
            assert!(listed > 0, "the acknowledgements never listed it");
        }
        // The peer's data lists it, idle or not; so does the peer's FIN.
        let back = data(3000, 6);
        sim.a.send_slice(a, &back).unwrap();
        let limit = sim.now + Duration::from_secs(5);
        let mut data_listed = false;
        sim.run(limit, |s| {
            active.clear();
            s.b.take_active(&mut active);
            data_listed |= active.contains(&b);
            if s.b.recv_queue(b) == back.len() {
                Step::Done
            } else {
                Step::Idle
            }
        })
        .unwrap();
        assert!(data_listed, "idle {idle}: data did not list it");
        sim.a.close(a).unwrap();
        let mut fin_listed = false;
        sim.run(limit + Duration::from_secs(5), |s| {
            active.clear();
            s.b.take_active(&mut active);
            fin_listed |= active.contains(&b);
            if s.b.state(b) == Some(State::CloseWait) {
                Step::Done
            } else {
                Step::Idle
            }
        })
        .unwrap();
        assert!(fin_listed, "idle {idle}: the FIN did not list it");
    }
}

/// A writer of whole segments driven only by the connections
/// `take_active` lists (as the engine drives it) gets all its data
/// across a window of a few segments, and is listed only when it can
/// write: acknowledgements that leave it less than a segment of room
/// beyond what is queued and in flight do not list it. With every
/// acknowledgement listing it, most of its visits would find no room.
#[test]
fn a_segment_writer_is_listed_when_it_has_room() {
    for loss in [false, true] {
        let b_cfg = Config {
            rx_buffer: 6 * 1460,
            ..Config::default()
        };
        let mut link = LinkConfig::default();
        if loss {
            link.faults = Faults::loss(0.02);
        }
        let mut sim = Sim::new(Config::default(), b_cfg, link);
        let (a, b) = connect(&mut sim, 40000, Duration::from_secs(5));
        let payload = data(400 * 1460, 3);
        let (mut off, mut got) = (0, Vec::new());
        let (mut listed, mut idle) = (0u32, 0u32);
        let mut active = Vec::new();
        let limit = sim.now + Duration::from_secs(60);
        sim.run(limit, |s| {
            s.a.take_active(&mut active);
            let mut wrote = 0;
            if active.drain(..).any(|c| c == a) && off < payload.len() {
                listed += 1;
                wrote =
                    s.a.send_segment(a, |buf, limit| {
                        let n = buf.len().min(limit).min(payload.len() - off);
                        buf[..n].copy_from_slice(&payload[off..off + n]);
                        off += n;
                        n
                    })
                    .unwrap();
                idle += u32::from(wrote == 0);
            }
            let _ = s.b.recv(b, |buf| {
                got.extend_from_slice(buf);
                buf.len()
            });
            if got.len() == payload.len() {
                Step::Done
            } else if wrote > 0 {
                Step::Progress
            } else {
                Step::Idle
            }
        })
        .unwrap_or_else(|e| {
            panic!(
                "loss {loss}: stalled at {off} written, {} read: {e:?}",
                got.len()
            )
        });
        assert!(got == payload, "loss {loss}");
        let spared = sim.a.counters().writer_waits;
        assert!(spared > 0, "loss {loss}");
        assert!(
            idle * 5 < listed,
            "loss {loss}: {idle} of {listed} listings found no room ({spared} spared)"
        );
    }
}

/// A poll takes frames up to [`Config::ingress_bytes`] (the frame that
/// crosses it is the last) and leaves the rest queued for the next, so a
/// receiver acknowledges a batch before it takes the next one.
#[test]
fn a_poll_takes_at_most_ingress_bytes_of_frames() {
    let batch = 16 * 1024;
    let b_cfg = Config {
        ingress_bytes: batch,
        ..Config::default()
    };
    let mut sim = Sim::new(Config::default(), b_cfg, LinkConfig::default());
    let (a, b) = connect(&mut sim, 40000, Duration::from_secs(5));
    // Open A's congestion window first.
    let warm = data(1 << 20, 5);
    assert_eq!(one_way_on(&mut sim, a, b, &warm), warm);
    let out = data(128 * 1024, 3);
    let queued = sim.a.send_slice(a, &out).unwrap();
    let now = sim.now;
    sim.a.poll(now);
    let frames: Vec<Vec<u8>> = sim.a.device_mut().tx.drain(..).collect();
    let on_wire: usize = frames.iter().map(Vec::len).sum();
    assert!(on_wire > 3 * batch, "{} frames, {on_wire} B", frames.len());
    let largest = frames.iter().map(Vec::len).max().unwrap();
    sim.b.device_mut().rx.extend(frames);
    let hits = sim.b.counters().ingress_budget_hits;
    let mut got = Vec::new();
    let mut polls = 0;
    while !sim.b.device().rx.is_empty() {
        let before = sim.b.device().rx.len();
        let bytes: usize = sim.b.device().rx.iter().map(Vec::len).sum();
        sim.b.poll(now);
        let left: usize = sim.b.device().rx.iter().map(Vec::len).sum();
        let taken = bytes - left;
        assert!(sim.b.device().rx.len() < before, "a poll takes a frame");
        assert!(taken < batch + largest, "one poll took {taken} B");
        if left > 0 {
            assert!(taken >= batch, "a poll stopped early: {taken} B");
        }
        // Each batch is acknowledged by its own poll.
        assert!(!sim.b.device().tx.is_empty(), "poll {polls} sent no ACK");
        sim.b.device_mut().tx.clear();
        sim.b
            .recv(b, |buf| {
                got.extend_from_slice(buf);
                buf.len()
            })
            .unwrap();
        polls += 1;
    }
    assert!(polls >= 3, "{polls} polls");
    assert_eq!(sim.b.counters().ingress_budget_hits - hits, polls - 1);
    assert_eq!(got, out[..queued.min(got.len())]);
    assert!(got.len() >= on_wire / 2);
}
