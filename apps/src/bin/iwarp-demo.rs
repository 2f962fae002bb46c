//! In-memory demonstration of the sans-IO iWARP core.
//!
//! Two QPs are joined by in-memory byte pipes ([`iwarp::testing::Pair`]);
//! no network is involved. For each configuration the pair connects
//! (MPA exchange with private data both ways), then runs a Send, an RDMA
//! Write and an RDMA Read of a few sizes and checks every byte, and the
//! RFC 7306 operations (FetchAdd, CompareSwap, Immediate Data) and checks
//! their values. A last run times 64 KiB RDMA Writes with CRC on through
//! both QPs on this thread.

use std::process::ExitCode;
use std::time::Instant as StdInstant;

use clap::Parser;
use iwarp::cq::{WcOpcode, WcStatus, WorkCompletion};
use iwarp::mem::{Access, MrInfo};
use iwarp::mpa::handshake::{Config, RtrSet};
use iwarp::qp::{PostError, QpConfig, QpEvent, QpState, RecvWr, SendOp, SendWr, Sge};
use iwarp::testing::{Chunking, Pair};
use iwarp::time::Instant;
use iwarp::verbs::VerbsError;

/// In-memory demonstration of the iWARP protocol core (no network).
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Largest message size in bytes for the Send/Write/Read checks (the
    /// others are 1 B and 4 KiB).
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u32).range(1..=(64 << 20)))]
    size: u32,
    /// Number of 64 KiB RDMA Writes in the throughput measurement.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    iterations: u32,
    /// Print only the summary.
    #[arg(long)]
    quiet: bool,
    /// The core's log on stderr at debug level (`RUST_LOG`, when set,
    /// chooses its filter instead).
    #[arg(short = 'd', long = "debug")]
    debug: bool,
}

/// One configuration of the table.
struct Setup {
    label: &'static str,
    crc: bool,
    markers: bool,
    p2p: bool,
}

const SETUPS: [Setup; 5] = [
    Setup {
        label: "rev2 crc- mrk-",
        crc: false,
        markers: false,
        p2p: false,
    },
    Setup {
        label: "rev2 crc+ mrk-",
        crc: true,
        markers: false,
        p2p: false,
    },
    Setup {
        label: "rev2 crc- mrk+",
        crc: false,
        markers: true,
        p2p: false,
    },
    Setup {
        label: "rev2 crc+ mrk+",
        crc: true,
        markers: true,
        p2p: false,
    },
    Setup {
        label: "rev2 crc+ p2p-rtr",
        crc: true,
        markers: false,
        p2p: true,
    },
];

/// FPDUs sent (both sides) and wire bytes (both directions) of one step.
#[derive(Clone, Copy, Default)]
struct Cost {
    fpdus: u64,
    wire: usize,
}

fn counters(p: &Pair) -> Cost {
    let tx = |s: &iwarp::testing::Side| s.ctx.qp_stats(s.qp).map_or(0, |st| st.tx_fpdus);
    Cost {
        fpdus: tx(&p.a) + tx(&p.b),
        wire: p.transcript().iter().map(|(_, b)| b.len()).sum(),
    }
}

fn delta(before: Cost, after: Cost) -> Cost {
    Cost {
        fpdus: after.fpdus - before.fpdus,
        wire: after.wire - before.wire,
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

fn fill(side: &mut iwarp::testing::Side, mr: &MrInfo, bytes: &[u8]) {
    let buf = side
        .ctx
        .mem_mut()
        .owned_bytes_mut(mr.lkey)
        .expect("owned region");
    buf.fill(0);
    buf[..bytes.len()].copy_from_slice(bytes);
}

fn sge(mr: &MrInfo, len: usize) -> [Sge; 1] {
    [Sge {
        addr: mr.iova,
        len: len as u32,
        lkey: mr.lkey,
    }]
}

fn one_ok(wcs: &[WorkCompletion], opcode: WcOpcode, byte_len: Option<usize>) -> bool {
    matches!(wcs, [wc] if wc.status == WcStatus::Success
        && wc.opcode == opcode
        && byte_len.is_none_or(|n| wc.byte_len as usize == n))
}

/// The regions of one run, sized for the largest message.
struct Regions {
    /// A: source of Send and Write.
    a_src: MrInfo,
    /// A: sink of Read.
    a_sink: MrInfo,
    /// B: receive buffer and Write target.
    b_dst: MrInfo,
    /// B: source of Read.
    b_src: MrInfo,
    /// A: where an atomic's original value lands.
    a_word: MrInfo,
    /// B: the 64-bit word the atomics work on.
    b_word: MrInfo,
}

impl Regions {
    /// Every region, for messages of up to `max` bytes.
    fn new(p: &mut Pair, max: usize) -> Self {
        Self {
            a_src: p.a.reg(max, Access::NONE),
            a_sink: p.a.reg(max, Access::LOCAL_WRITE),
            b_dst: p.b.reg(max, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
            b_src: p.b.reg(max, Access::REMOTE_READ),
            a_word: p.a.reg(8, Access::LOCAL_WRITE),
            b_word: p.b.reg(8, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Send,
    Write,
    Read,
}

/// Run one operation of `len` bytes; returns its cost and whether every
/// byte and completion checked.
fn run_op(p: &mut Pair, r: &Regions, op: Op, len: usize, seed: u8) -> (Cost, bool) {
    let data = pattern(len, seed);
    let before = counters(p);
    let posted = match op {
        Op::Send => {
            fill(&mut p.a, &r.a_src, &data);
            fill(&mut p.b, &r.b_dst, &[]);
            let rsg = sge(&r.b_dst, r.b_dst.len);
            let ssg = sge(&r.a_src, len);
            p.b.ctx
                .post_recv(
                    p.b.qp,
                    &RecvWr {
                        wr_id: 10,
                        sgl: &rsg,
                    },
                )
                .and_then(|()| {
                    p.a.ctx.post_send(
                        p.a.qp,
                        &SendWr {
                            wr_id: 1,
                            op: SendOp::Send {
                                solicited: false,
                                invalidate: None,
                            },
                            sgl: &ssg,
                            signaled: true,
                        },
                    )
                })
        }
        Op::Write => {
            fill(&mut p.a, &r.a_src, &data);
            fill(&mut p.b, &r.b_dst, &[]);
            let ssg = sge(&r.a_src, len);
            p.a.ctx.post_send(
                p.a.qp,
                &SendWr {
                    wr_id: 2,
                    op: SendOp::Write {
                        remote_addr: r.b_dst.iova,
                        rkey: r.b_dst.rkey,
                    },
                    sgl: &ssg,
                    signaled: true,
                },
            )
        }
        Op::Read => {
            fill(&mut p.b, &r.b_src, &data);
            fill(&mut p.a, &r.a_sink, &[]);
            let ssg = sge(&r.a_sink, len);
            p.a.ctx.post_send(
                p.a.qp,
                &SendWr {
                    wr_id: 3,
                    op: SendOp::Read {
                        remote_addr: r.b_src.iova,
                        rkey: r.b_src.rkey,
                    },
                    sgl: &ssg,
                    signaled: true,
                },
            )
        }
    };
    if posted.is_err() {
        return (Cost::default(), false);
    }
    p.drive();
    let cost = delta(before, counters(p));
    let wa = p.a.completions();
    let wb = p.b.completions();
    let ok = match op {
        Op::Send => {
            one_ok(&wa, WcOpcode::Send, None)
                && one_ok(&wb, WcOpcode::Recv, Some(len))
                && p.b.bytes(&r.b_dst)[..len] == data[..]
                && p.b.bytes(&r.b_dst)[len..].iter().all(|&b| b == 0)
        }
        Op::Write => {
            one_ok(&wa, WcOpcode::RdmaWrite, None)
                && wb.is_empty()
                && p.b.bytes(&r.b_dst)[..len] == data[..]
                && p.b.bytes(&r.b_dst)[len..].iter().all(|&b| b == 0)
        }
        Op::Read => {
            one_ok(&wa, WcOpcode::RdmaRead, Some(len))
                && wb.is_empty()
                && p.a.bytes(&r.a_sink)[..len] == data[..]
        }
    };
    let ok = ok && p.a.state() == QpState::Rts && p.b.state() == QpState::Rts;
    (cost, ok)
}

/// FetchAdd, CompareSwap and Immediate Data from A to B; returns their
/// cost and whether every value and completion checked.
fn run_rfc7306(p: &mut Pair, r: &Regions, seed: u8) -> (Cost, bool) {
    let start = u64::from(seed) << 32 | 0xffff_fff0;
    // The FetchAdd below: the high counter + 1, the low one wrapped to 0x10.
    let added = (u64::from(seed) + 1) << 32 | 0x10;
    fill(&mut p.b, &r.b_word, &start.to_ne_bytes());
    let before = counters(p);
    let word = |p: &Pair, mr: &MrInfo, a: bool| {
        let s = if a { &p.a } else { &p.b };
        s.bytes(mr)
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_ne_bytes)
    };
    let sink = sge(&r.a_word, 8);
    let mut ok = true;
    let ops = [
        // Two 32-bit counters: the low one wraps without carrying into
        // the high one.
        (
            SendOp::FetchAdd {
                remote_addr: r.b_word.iova,
                rkey: r.b_word.rkey,
                add: 0x0000_0001_0000_0020,
                add_mask: 0x8000_0000_8000_0000,
            },
            WcOpcode::AtomicFetchAdd,
            start,
            added,
        ),
        (
            SendOp::CompareSwap {
                remote_addr: r.b_word.iova,
                rkey: r.b_word.rkey,
                compare: added,
                compare_mask: u64::MAX,
                swap: 7,
                swap_mask: u64::MAX,
            },
            WcOpcode::AtomicCompareSwap,
            added,
            7,
        ),
    ];
    for (op, opcode, orig, after) in ops {
        let posted = p.a.ctx.post_send(
            p.a.qp,
            &SendWr {
                wr_id: 4,
                op,
                sgl: &sink,
                signaled: true,
            },
        );
        p.drive();
        ok &= posted.is_ok()
            && one_ok(&p.a.completions(), opcode, Some(8))
            && p.b.completions().is_empty()
            && word(p, &r.a_word, true) == orig
            && word(p, &r.b_word, false) == after;
    }
    let posted =
        p.b.ctx
            .post_recv(
                p.b.qp,
                &RecvWr {
                    wr_id: 11,
                    sgl: &[],
                },
            )
            .and_then(|()| {
                p.a.ctx.post_send(
                    p.a.qp,
                    &SendWr {
                        wr_id: 5,
                        op: SendOp::ImmediateData {
                            data: start,
                            solicited: true,
                        },
                        sgl: &[],
                        signaled: true,
                    },
                )
            });
    p.drive();
    let wb = p.b.completions();
    ok &= posted.is_ok()
        && one_ok(&p.a.completions(), WcOpcode::ImmediateData, Some(0))
        && one_ok(&wb, WcOpcode::Recv, Some(0))
        && wb.first().and_then(|w| w.imm_data) == Some(start);
    let ok = ok && p.a.state() == QpState::Rts && p.b.state() == QpState::Rts;
    (delta(before, counters(p)), ok)
}

fn mpa_config(s: &Setup) -> Config {
    Config {
        revision: 2,
        crc: s.crc,
        markers: s.markers,
        p2p: s.p2p,
        rtr: RtrSet::ALL,
        ..Config::default()
    }
}

/// Connect with private data both ways; returns the pair, the cost of
/// the exchange, whether the private data arrived intact, and a note.
fn connect(s: &Setup) -> (Pair, Cost, bool, String) {
    let a_pd = b"hello from A".to_vec();
    let b_pd = b"B accepts".to_vec();
    let mut p = Pair::new(QpConfig::default(), Chunking::whole(64 << 10));
    p.accept_data = b_pd.clone();
    p.start(mpa_config(s), &a_pd, mpa_config(s));
    p.drive();
    let cost = counters(&p);
    let got_req = p.b.events.iter().any(
        |e| matches!(e, QpEvent::ConnectRequest(r) if r.private_data == a_pd && r.revision == 2),
    );
    let mut note = String::new();
    let a_est = p.a.events.iter().find_map(|e| match e {
        QpEvent::Established {
            negotiated,
            private_data,
        } => Some((negotiated.clone(), private_data.clone())),
        _ => None,
    });
    let b_est = p.b.events.iter().find_map(|e| match e {
        QpEvent::Established { private_data, .. } => Some(private_data.clone()),
        _ => None,
    });
    let ok = match (&a_est, &b_est) {
        (Some((n, a_got)), Some(b_got)) => {
            note = format!(
                "pd {}B/{}B crc={} mrk={}/{}{}",
                a_pd.len(),
                b_pd.len(),
                u8::from(n.crc),
                u8::from(n.markers_tx),
                u8::from(n.markers_rx),
                n.rtr.map(|r| format!(" rtr={r:?}")).unwrap_or_default()
            );
            got_req
                && *a_got == b_pd
                && *b_got == a_pd
                && n.crc == s.crc
                && n.markers_tx == s.markers
                && n.p2p == s.p2p
                && (n.rtr.is_some() == s.p2p)
        }
        _ => false,
    };
    let ok = ok && p.a.state() == QpState::Rts && p.b.state() == QpState::Rts;
    (p, cost, ok, note)
}

fn human(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}KiB", n >> 10),
        n => format!("{n}B"),
    }
}

/// Time `iterations` 64 KiB RDMA Writes with CRC on, A's transmit and
/// B's receive path alternating on this thread. Returns payload bytes per
/// second, or `None` if the placed bytes did not check.
fn throughput(iterations: u32) -> Option<f64> {
    const LEN: usize = 64 << 10;
    let crc = Config {
        crc: true,
        ..Config::default()
    };
    let mut p = Pair::connected(QpConfig::default(), Chunking::whole(LEN), crc.clone(), crc);
    let data = pattern(LEN, 0x5a);
    let src = p.a.reg_with(&data, Access::NONE);
    let dst = p.b.reg(LEN, Access::REMOTE_WRITE);
    let sgl = sge(&src, LEN);
    let wr = SendWr {
        wr_id: 0,
        op: SendOp::Write {
            remote_addr: dst.iova,
            rkey: dst.rkey,
        },
        sgl: &sgl,
        signaled: false,
    };
    let mut buf = vec![0u8; LEN];
    let mut left = iterations;
    let t = StdInstant::now();
    while left > 0 {
        match p.a.ctx.post_send(p.a.qp, &wr) {
            Ok(()) => {
                left -= 1;
                continue;
            }
            Err(VerbsError::Post(PostError::QueueFull)) => {}
            Err(_) => return None,
        }
        pump(&mut p, &mut buf);
    }
    pump(&mut p, &mut buf);
    let secs = t.elapsed().as_secs_f64();
    let stats = p.b.ctx.qp_stats(p.b.qp)?;
    let ok = stats.rx_payload == u64::from(iterations) * LEN as u64
        && stats.crc_errors == 0
        && p.b.state() == QpState::Rts
        && p.b.bytes(&dst) == &data[..];
    ok.then(|| stats.rx_payload as f64 / secs)
}

fn pump(p: &mut Pair, buf: &mut [u8]) {
    loop {
        let n = p.a.ctx.poll_transmit(p.a.qp, buf);
        if n == 0 {
            return;
        }
        p.b.ctx.handle_input(p.b.qp, &buf[..n], Instant::ZERO);
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    iwarp_apps::logging::init("iwarp-demo", args.debug);
    let mut sizes = vec![1usize, 4096, args.size as usize];
    sizes.sort_unstable();
    sizes.dedup();
    let max = *sizes.last().unwrap_or(&1);
    let mut all_ok = true;
    if !args.quiet {
        println!("iWARP core, in-memory pair (no network); MPA rev 2, EMSS 1460.");
        println!("Cells: FPDUs sent / wire bytes (both directions), per message size.");
        let mut head = format!("{:<18} {:<7}", "config", "op");
        for &s in &sizes {
            head += &format!(" {:>17}", human(s));
        }
        println!("{head}  verified");
    }
    for (i, s) in SETUPS.iter().enumerate() {
        let (mut p, cost, ok, note) = connect(s);
        all_ok &= ok;
        if !args.quiet {
            println!(
                "{:<18} {:<7} {:>17} {note}  {}",
                s.label,
                "connect",
                format!("{} / {}", cost.fpdus, cost.wire),
                yes(ok)
            );
        }
        if !ok {
            continue;
        }
        let r = Regions::new(&mut p, max);
        for (name, op) in [("send", Op::Send), ("write", Op::Write), ("read", Op::Read)] {
            let mut row = format!("{:<18} {name:<7}", s.label);
            let mut row_ok = true;
            for (j, &len) in sizes.iter().enumerate() {
                let seed = (i * 16 + j) as u8 ^ (op as u8) << 6;
                let (c, ok) = run_op(&mut p, &r, op, len, seed);
                row_ok &= ok;
                row += &format!(" {:>17}", format!("{} / {}", c.fpdus, c.wire));
            }
            all_ok &= row_ok;
            if !args.quiet {
                println!("{row}  {}", yes(row_ok));
            }
        }
        let (c, ok) = run_rfc7306(&mut p, &r, i as u8);
        all_ok &= ok;
        if !args.quiet {
            println!(
                "{:<18} {:<7} {:>17}  (FetchAdd, CompareSwap, Immediate Data; 8 B each)  {}",
                s.label,
                "rfc7306",
                format!("{} / {}", c.fpdus, c.wire),
                yes(ok)
            );
        }
    }
    match throughput(args.iterations) {
        Some(bps) => println!(
            "in-memory core throughput (not network): {:.2} GB/s payload, {} x 64KiB RDMA Write, \
             CRC on, EMSS 1460, TX framing + RX placement on one thread",
            bps / 1e9,
            args.iterations
        ),
        None => {
            all_ok = false;
            println!("in-memory core throughput: placement check FAILED");
        }
    }
    println!(
        "verification: {}",
        if all_ok { "all passed" } else { "FAILED" }
    );
    if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn yes(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "NO"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setup_verifies() {
        for s in &SETUPS {
            let (mut p, _, ok, _) = connect(s);
            assert!(ok, "{}", s.label);
            let r = Regions::new(&mut p, 5000);
            for op in [Op::Send, Op::Write, Op::Read] {
                for len in [1, 4096, 5000] {
                    let (c, ok) = run_op(&mut p, &r, op, len, 3);
                    assert!(ok && c.fpdus > 0 && c.wire > len, "{}", s.label);
                }
            }
            let (c, ok) = run_rfc7306(&mut p, &r, 9);
            assert!(ok && c.fpdus == 5, "{}", s.label);
        }
    }

    #[test]
    fn a_refused_write_is_reported() {
        let (mut p, _, ok, _) = connect(&SETUPS[1]);
        assert!(ok);
        let r = Regions {
            // No REMOTE_WRITE: the peer's Write must be refused.
            b_dst: p.b.reg(64, Access::LOCAL_WRITE),
            ..Regions::new(&mut p, 64)
        };
        let (_, ok) = run_op(&mut p, &r, Op::Write, 64, 1);
        assert!(!ok);
    }

    #[test]
    fn a_refused_atomic_is_reported() {
        let (mut p, _, ok, _) = connect(&SETUPS[0]);
        assert!(ok);
        let r = Regions {
            // No REMOTE_ATOMIC: the peer's FetchAdd must be refused.
            b_word: p.b.reg(8, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
            ..Regions::new(&mut p, 64)
        };
        let (_, ok) = run_rfc7306(&mut p, &r, 1);
        assert!(!ok);
    }

    #[test]
    fn throughput_run_checks_placement() {
        assert!(throughput(4).is_some());
    }
}
