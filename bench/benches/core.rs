//! Throughput of the sans-IO protocol core alone (no I/O, one core).
//!
//! * `placement`: side B of a connected in-memory pair consumes a
//!   pre-generated stream of RDMA Write FPDUs with `handle_input`, in
//!   64 KiB pieces: `cold`, 16 MiB of payload, read from memory; `warm`,
//!   256 KiB, resident in L2 as freshly received bytes are. The stream is replayed on every
//!   iteration: with markers off each FPDU is self-contained (tagged
//!   writes carry no sequence state), so replaying it is valid.
//! * `framing`: side A drains a batch of posted RDMA Writes with
//!   `poll_transmit` into a reused 64 KiB buffer (posting is not timed).
//!
//! Throughput is payload bytes (wire bytes are a few percent more).
//! Parameters: write size 4 KiB / 64 KiB, CRC off / on, EMSS 1460
//! (MTU 1500) / 8960 (MTU 9000 class).
//!
//! Run: `cargo bench -p iwarp-bench --bench core -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::time::{Duration, Instant as StdInstant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use iwarp::mem::{Access, MrInfo};
use iwarp::mpa::handshake::Config;
use iwarp::qp::{PostError, QpConfig, QpState, SendOp, SendWr, Sge};
use iwarp::testing::{Chunking, Pair};
use iwarp::time::Instant;
use iwarp::verbs::VerbsError;

/// Payload of one placement stream, cold: 16 MiB, far beyond the caches,
/// so every byte comes from memory.
const STREAM_PAYLOAD: usize = 16 << 20;
/// Payload of one placement stream, warm: 256 KiB, which stays in L2 as
/// the bytes a socket or the user-space TCP's ring just handed over do.
const WARM_PAYLOAD: usize = 256 << 10;
/// Payload of one framing batch.
const TX_BATCH_PAYLOAD: usize = 2 << 20;
/// Size of the pieces fed to `handle_input` and of the transmit buffer.
const CHUNK: usize = 64 << 10;

#[derive(Clone, Copy)]
struct Case {
    size: usize,
    crc: bool,
    emss: usize,
}

impl Case {
    fn all() -> Vec<Self> {
        let mut v = Vec::new();
        for emss in [1460, 8960] {
            for size in [4 << 10, 64 << 10] {
                for crc in [false, true] {
                    v.push(Self { size, crc, emss });
                }
            }
        }
        v
    }

    fn id(&self) -> String {
        format!(
            "{}KiB/crc-{}/emss-{}",
            self.size >> 10,
            if self.crc { "on" } else { "off" },
            self.emss
        )
    }
}

/// A connected pair, A's source region (a byte pattern) and B's
/// remotely writable destination region, both `case.size` bytes.
struct Setup {
    pair: Pair,
    src: MrInfo,
    dst: MrInfo,
    pattern: Vec<u8>,
}

fn setup(case: Case, sq_depth: usize) -> Setup {
    let qp = QpConfig {
        emss: case.emss,
        sq_depth,
        ..QpConfig::default()
    };
    let mpa = Config {
        crc: case.crc,
        ..Config::default()
    };
    let mut pair = Pair::connected(qp, Chunking::whole(CHUNK), mpa.clone(), mpa);
    let pattern: Vec<u8> = (0..case.size)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect();
    let src = pair.a.reg_with(&pattern, Access::NONE);
    let dst = pair.b.reg(case.size, Access::REMOTE_WRITE);
    Setup {
        pair,
        src,
        dst,
        pattern,
    }
}

/// Post up to `count` unsignaled writes of `src` to `dst` on A; returns
/// how many were accepted before the send queue filled.
fn post_writes(s: &mut Setup, count: usize) -> usize {
    let sge = [Sge {
        addr: s.src.iova,
        len: s.src.len as u32,
        lkey: s.src.lkey,
    }];
    let wr = SendWr {
        wr_id: 0,
        op: SendOp::Write {
            remote_addr: s.dst.iova,
            rkey: s.dst.rkey,
        },
        sgl: &sge,
        signaled: false,
    };
    for i in 0..count {
        match s.pair.a.ctx.post_send(s.pair.a.qp, &wr) {
            Ok(()) => {}
            Err(VerbsError::Post(PostError::QueueFull)) => return i,
            Err(e) => panic!("post_send: {e}"),
        }
    }
    count
}

/// Drain A's transmit side into `buf`; returns wire bytes.
fn drain(s: &mut Setup, buf: &mut [u8], mut sink: impl FnMut(&[u8])) -> usize {
    let mut total = 0;
    loop {
        let n = s.pair.a.ctx.poll_transmit(s.pair.a.qp, buf);
        if n == 0 {
            return total;
        }
        sink(&buf[..n]);
        total += n;
    }
}

fn feed(s: &mut Setup, stream: &[u8]) {
    let b = &mut s.pair.b;
    for piece in stream.chunks(CHUNK) {
        b.ctx.handle_input(b.qp, black_box(piece), Instant::ZERO);
    }
}

fn placement(c: &mut Criterion) {
    let mut g = c.benchmark_group("placement");
    for (case, payload) in Case::all()
        .into_iter()
        .flat_map(|c| [(c, STREAM_PAYLOAD), (c, WARM_PAYLOAD)])
    {
        let mut s = setup(case, 256);
        let count = payload / case.size;
        let mut stream = Vec::with_capacity(payload + payload / 8);
        let mut buf = vec![0u8; CHUNK];
        let mut posted = 0;
        while posted < count {
            posted += post_writes(&mut s, count - posted);
            drain(&mut s, &mut buf, |b| stream.extend_from_slice(b));
        }
        // Check once, untimed, that the stream places what it should.
        feed(&mut s, &stream);
        let stats = s.pair.b.ctx.qp_stats(s.pair.b.qp).expect("qp");
        assert_eq!(s.pair.b.state(), QpState::Rts, "{:?}", s.pair.b.events);
        assert_eq!(stats.rx_payload, payload as u64);
        assert_eq!(stats.crc_errors, 0);
        assert!(
            s.pair.b.bytes(&s.dst) == &s.pattern[..],
            "placement did not reproduce the source"
        );
        let before = stats.rx_fpdus;
        g.throughput(Throughput::Bytes(payload as u64));
        let temp = if payload == WARM_PAYLOAD {
            "warm"
        } else {
            "cold"
        };
        let id = format!("{}/{temp}", case.id());
        g.bench_function(BenchmarkId::from_parameter(id), |bch| {
            bch.iter(|| feed(&mut s, &stream));
        });
        // Every replay was accepted too, not dropped after an error.
        let after = s.pair.b.ctx.qp_stats(s.pair.b.qp).expect("qp");
        assert_eq!(s.pair.b.state(), QpState::Rts, "{:?}", s.pair.b.events);
        assert_eq!(after.rx_fpdus % before, 0);
        assert_eq!(after.crc_errors, 0);
    }
    g.finish();
}

fn framing(c: &mut Criterion) {
    let mut g = c.benchmark_group("framing");
    for case in Case::all() {
        let batch = TX_BATCH_PAYLOAD / case.size;
        let mut s = setup(case, batch);
        let mut buf = vec![0u8; CHUNK];
        // Check once that a batch frames all of its payload.
        assert_eq!(post_writes(&mut s, batch), batch);
        let wire = drain(&mut s, &mut buf, |_| {});
        let stats = s.pair.a.ctx.qp_stats(s.pair.a.qp).expect("qp");
        assert_eq!(stats.tx_payload, TX_BATCH_PAYLOAD as u64);
        assert!(wire > TX_BATCH_PAYLOAD);
        g.throughput(Throughput::Bytes(TX_BATCH_PAYLOAD as u64));
        g.bench_function(BenchmarkId::from_parameter(case.id()), |bch| {
            bch.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    assert_eq!(post_writes(&mut s, batch), batch);
                    let t = StdInstant::now();
                    black_box(drain(&mut s, &mut buf, |b| {
                        black_box(b);
                    }));
                    total += t.elapsed();
                }
                total
            });
        });
    }
    g.finish();
}

/// One small RDMA Write through both protocol cores, as on the latency
/// path: A posts it, frames it (`poll_transmit`), B parses and places it
/// (`handle_input`). Per message, not per byte.
fn message(c: &mut Criterion) {
    let mut g = c.benchmark_group("message");
    for size in [4, 64] {
        for crc in [false, true] {
            let case = Case {
                size,
                crc,
                emss: 1460,
            };
            let mut s = setup(case, 16);
            let mut buf = vec![0u8; 4096];
            let mut hop = |s: &mut Setup| {
                assert_eq!(post_writes(s, 1), 1);
                let n = s.pair.a.ctx.poll_transmit(s.pair.a.qp, &mut buf);
                let b = &mut s.pair.b;
                b.ctx
                    .handle_input(b.qp, black_box(&buf[..n]), Instant::ZERO);
                n
            };
            let before = s.pair.b.ctx.qp_stats(s.pair.b.qp).expect("qp").rx_payload;
            assert!(hop(&mut s) > size);
            let stats = s.pair.b.ctx.qp_stats(s.pair.b.qp).expect("qp");
            assert_eq!(stats.rx_payload - before, size as u64);
            assert!(s.pair.b.bytes(&s.dst) == &s.pattern[..]);
            let id = format!("{size}B/crc-{}", if crc { "on" } else { "off" });
            g.bench_function(BenchmarkId::from_parameter(id), |bch| {
                bch.iter(|| hop(&mut s));
            });
            assert_eq!(s.pair.b.state(), QpState::Rts, "{:?}", s.pair.b.events);
        }
    }
    g.finish();
}

/// Ceilings for comparison, over the cold and the warm stream cut in 8960-byte pieces
/// like FPDUs: a plain copy of each piece (minus a 20-byte "header") into
/// a 64 KiB destination, and CRC32c alone.
fn reference(c: &mut Criterion) {
    let mut g = c.benchmark_group("reference");
    for (payload, temp) in [(STREAM_PAYLOAD, "cold"), (WARM_PAYLOAD, "warm")] {
        let stream: Vec<u8> = (0..payload).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; CHUNK];
        g.throughput(Throughput::Bytes(payload as u64));
        g.bench_function(format!("memcpy-8960/{temp}"), |bch| {
            bch.iter(|| {
                let mut at = 0;
                for piece in stream.chunks(8960) {
                    let body = piece.get(20..).unwrap_or(&[]);
                    if at + body.len() > dst.len() {
                        at = 0;
                    }
                    dst[at..at + body.len()].copy_from_slice(black_box(body));
                    at += body.len();
                }
                black_box(&dst);
            });
        });
        g.bench_function(format!("crc32c-8960/{temp}"), |bch| {
            bch.iter(|| {
                let mut acc = 0u32;
                for piece in stream.chunks(8960) {
                    acc ^= iwarp::crc::crc32c(black_box(piece));
                }
                acc
            });
        });
    }
    g.finish();
}

/// The two CRC32c crates over 64 KiB of warm bytes cut in pieces of one
/// size, each piece's CRC started from the one before (as the pieces of
/// one FPDU are chained), and the dispatch between them that MPA uses
/// (`iwarp::crc::Crc32c`, which picks by [`iwarp::crc::FOLD_FROM`]).
fn crc(c: &mut Criterion) {
    let mut g = c.benchmark_group("crc");
    let data: Vec<u8> = (0..CHUNK).map(|i| (i * 13 + 5) as u8).collect();
    g.throughput(Throughput::Bytes(CHUNK as u64));
    type Append = fn(u32, &[u8]) -> u32;
    let impls: [(&str, Append); 3] = [
        ("crc32c", iwarp::crc::serial_append),
        ("crc-fast", iwarp::crc::folded_append),
        ("mpa", |crc, bytes| {
            let mut c = iwarp::crc::Crc32c::from_value(crc);
            c.update(bytes);
            c.value()
        }),
    ];
    for size in [4usize, 28, 64, 128, 256, 384, 448, 512, 1448, 3440, 8960] {
        for (name, f) in impls {
            g.bench_function(format!("{name}/{size}"), |bch| {
                bch.iter(|| {
                    let mut acc = 0u32;
                    for piece in data.chunks(size) {
                        acc = f(acc, black_box(piece));
                    }
                    acc
                });
            });
        }
    }
    g.finish();
}

/// What verifying a received segment's TCP checksum costs
/// (`iwarp_tcp::csum::check`, which the AF_XDP device runs on every
/// frame): the one's-complement sum over a segment's worth of warm bytes
/// at MTU 1500, 9000 and 65535.
fn ones_sum(c: &mut Criterion) {
    let mut g = c.benchmark_group("ones-sum");
    let data: Vec<u8> = (0..65_536).map(|i| (i * 7 + 3) as u8).collect();
    for size in [1480usize, 8980, 65_515] {
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(format!("smoltcp/{size}"), |bch| {
            bch.iter(|| iwarp_tcp::smoltcp::wire::checksum::data(black_box(&data[..size])));
        });
    }
    g.finish();
}

criterion_group!(benches, placement, framing, message, reference, crc, ones_sum);
criterion_main!(benches);
