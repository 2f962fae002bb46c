//! The probe's test target on our stack: accepts one connection, registers
//! the regions of [`RegionKind`] (each between two guard regions), waits for
//! the probe's hello, invalidates the [`RegionKind::Invalidated`] region,
//! advertises all of them in one Send ([`Advert`]) and then records what
//! happens to the QP: the Terminate it sent, its final state, the flushed
//! work requests and every byte of a region or guard that changed.

use std::time::{Duration, Instant};

use iwarp_engine::{
    Access, CmError, CmEvent, ConnParams, Cq, Device, Listener, Mr, Pd, QpInit, QpState, RecvWr,
    SendOp, SendWr, Sge, WcStatus, EMPTY_WC,
};

use iwarp::error::TermCode;

use super::{Advert, Region, RegionKind, HELLO};

/// Length of every advertised region and of every guard.
pub const REGION_LEN: usize = 4096;
/// Receives the target posts before the probe's first FPDU.
pub const RECVS: usize = 4;
/// Length of each receive buffer.
pub const RECV_LEN: usize = 1024;
/// Fill byte of the advertised regions.
pub const REGION_FILL: u8 = 0x5a;
/// Fill byte of the guards.
pub const GUARD_FILL: u8 = 0xa5;

const WR_ADVERT: u64 = 100;
const WR_INVALIDATE: u64 = 101;

/// What happened to the target's side of one connection.
#[derive(Clone, Debug, Default)]
pub struct TargetReport {
    /// The MPA exchange completed (the QP reached RTS).
    pub established: bool,
    /// The probe's hello arrived and the advertisement was sent.
    pub advertised: bool,
    /// The Terminate our QP sent.
    pub local_terminate: Option<TermCode>,
    /// A Terminate the probe sent.
    pub remote_terminate: Option<TermCode>,
    /// The QP saw the peer's close (or a close after its Terminate).
    pub disconnected: bool,
    /// QP state at the end.
    pub final_state: Option<QpState>,
    /// Receives posted in total.
    pub recvs_posted: usize,
    /// Receives completed successfully (the hello, ...).
    pub recvs_ok: usize,
    /// Work requests completed with a flush status.
    pub flushed: usize,
    /// Work requests completed with another error status.
    pub errors: Vec<(u64, WcStatus)>,
    /// Regions or guards with a changed byte: (name, first changed offset).
    pub modified: Vec<(String, usize)>,
}

impl TargetReport {
    /// Every posted receive completed: the hello successfully, all others
    /// flushed, and no guard or region byte changed.
    pub fn clean_teardown(&self) -> bool {
        self.final_state == Some(QpState::Error)
            && self.recvs_ok + self.flushed >= self.recvs_posted
            && self.modified.is_empty()
    }
}

/// A region with its two guards.
struct Guarded {
    kind: RegionKind,
    before: Mr,
    region: Mr,
    after: Mr,
}

fn fill(mr: &Mr, b: u8) {
    mr.write(0, &vec![b; mr.len()]);
}

fn first_change(mr: &Mr, b: u8) -> Option<usize> {
    let mut got = vec![0u8; mr.len()];
    mr.read(0, &mut got);
    got.iter().position(|&x| x != b)
}

/// The registered memory of one connection.
struct Memory {
    regions: Vec<Guarded>,
    recv: Mr,
    send: Mr,
}

impl Memory {
    fn new(dev: &Device, pd: &Pd, other: &Pd) -> std::io::Result<Self> {
        let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let mut regions = Vec::new();
        for kind in RegionKind::ALL {
            let (rpd, access) = match kind {
                RegionKind::ReadWrite | RegionKind::Invalidated => (pd, rw),
                RegionKind::ReadOnly => (pd, Access::LOCAL_WRITE | Access::REMOTE_READ),
                RegionKind::WriteOnly => (pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
                RegionKind::OtherPd => (other, rw),
            };
            // Guards are registered right before and after the region, in
            // the region's PD, without remote access.
            let before = dev.reg_mr(rpd, REGION_LEN, Access::LOCAL_WRITE)?;
            let region = dev.reg_mr(rpd, REGION_LEN, access)?;
            let after = dev.reg_mr(rpd, REGION_LEN, Access::LOCAL_WRITE)?;
            fill(&before, GUARD_FILL);
            fill(&region, REGION_FILL);
            fill(&after, GUARD_FILL);
            regions.push(Guarded {
                kind,
                before,
                region,
                after,
            });
        }
        Ok(Self {
            regions,
            recv: dev.reg_mr(pd, RECVS * RECV_LEN, Access::LOCAL_WRITE)?,
            send: dev.reg_mr(pd, 1024, Access::LOCAL_WRITE)?,
        })
    }

    fn advert(&self) -> Advert {
        Advert {
            regions: self
                .regions
                .iter()
                .map(|g| Region {
                    kind: g.kind,
                    stag: g.region.rkey(),
                    to: g.region.addr(),
                    len: u32::try_from(g.region.len()).unwrap_or(u32::MAX),
                })
                .collect(),
        }
    }

    fn modified(&self) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        for g in &self.regions {
            for (what, mr, b) in [
                ("guard before", &g.before, GUARD_FILL),
                ("region", &g.region, REGION_FILL),
                ("guard after", &g.after, GUARD_FILL),
            ] {
                if let Some(off) = first_change(mr, b) {
                    out.push((format!("{what} {:?}", g.kind), off));
                }
            }
        }
        out
    }
}

/// Accept one connection on `listener` and run the target side of a
/// scenario on it. `timeout` bounds the wait for the request and for the
/// connection's end; `Err` only if no request arrived or accepting failed.
pub fn serve_one(
    dev: &Device,
    listener: &Listener,
    timeout: Duration,
) -> Result<TargetReport, CmError> {
    let req = listener.get_request(Some(timeout))?;
    let crc = req.request().crc;
    let markers = req.request().markers;
    let pd = dev.alloc_pd();
    let other = dev.alloc_pd();
    let cq: Cq = dev.create_cq(64);
    let mem = Memory::new(dev, &pd, &other).map_err(|e| CmError::Io(e.kind()))?;
    let params = ConnParams {
        crc,
        // The target wants markers exactly when the probe does.
        markers,
        ird: 1,
        ord: 1,
        timeout,
        ..ConnParams::default()
    };
    let init = QpInit {
        pd: pd.clone(),
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        sq_depth: 16,
        rq_depth: 2 * RECVS,
        sig_all: false,
        srq: None,
    };
    let mut report = TargetReport::default();
    // The receives are posted before the reply: a probe sends at once.
    let sges: Vec<[Sge; 1]> = (0..RECVS)
        .map(|i| [mem.recv.sge(i * RECV_LEN, RECV_LEN)])
        .collect();
    let recvs: Vec<RecvWr<'_>> = sges
        .iter()
        .enumerate()
        .map(|(i, sgl)| RecvWr {
            wr_id: i as u64,
            sgl,
        })
        .collect();
    let qp = req.accept_with_recvs(init, params, &recvs)?;
    report.established = true;
    report.recvs_posted = RECVS;
    let deadline = Instant::now() + timeout;
    let mut wcs = [EMPTY_WC; 16];
    let mut ended_at: Option<Instant> = None;
    loop {
        let n = cq.wait(&mut wcs, Some(Duration::from_millis(20)));
        for wc in &wcs[..n] {
            match wc.status {
                WcStatus::Success if wc.wr_id < RECVS as u64 => {
                    report.recvs_ok += 1;
                    let mut got = [0u8; 16];
                    mem.recv.read(wc.wr_id as usize * RECV_LEN, &mut got);
                    if !report.advertised && got == *HELLO && wc.byte_len == 16 {
                        report.advertised = advertise(&qp, &mem);
                    }
                }
                WcStatus::Success => {}
                WcStatus::WrFlushError => report.flushed += 1,
                s => report.errors.push((wc.wr_id, s)),
            }
        }
        while let Some(ev) = qp.poll_event() {
            match ev {
                CmEvent::LocalTerminate(c) => report.local_terminate = Some(c),
                CmEvent::RemoteTerminate(c) => report.remote_terminate = Some(c),
                CmEvent::Disconnected => report.disconnected = true,
                _ => {}
            }
        }
        let state = qp.state();
        let now = Instant::now();
        if state == QpState::Error && ended_at.is_none() {
            ended_at = Some(now);
        }
        // After the QP reached Error, give the flushes a moment to arrive;
        // stop early once every receive is accounted for.
        let all_in = report.recvs_ok + report.flushed + report.errors.len() >= report.recvs_posted;
        if let Some(t) = ended_at {
            if (all_in && n == 0) || now >= t + Duration::from_secs(1) {
                break;
            }
        }
        if now >= deadline {
            break;
        }
    }
    report.final_state = Some(qp.state());
    report.modified = mem.modified();
    drop(qp);
    Ok(report)
}

/// Invalidate the [`RegionKind::Invalidated`] region and send the
/// advertisement (both in send-queue order).
fn advertise(qp: &iwarp_engine::Qp, mem: &Memory) -> bool {
    if let Some(g) = mem
        .regions
        .iter()
        .find(|g| g.kind == RegionKind::Invalidated)
    {
        let wr = SendWr {
            wr_id: WR_INVALIDATE,
            op: SendOp::LocalInvalidate {
                stag: g.region.rkey(),
            },
            sgl: &[],
            signaled: false,
        };
        if qp.post_send(&wr).is_err() {
            return false;
        }
    }
    let a = mem.advert().encode();
    mem.send.write(0, &a);
    let sge = mem.send.sge(0, a.len());
    qp.post_send(&SendWr {
        wr_id: WR_ADVERT,
        op: SendOp::Send {
            solicited: false,
            invalidate: None,
        },
        sgl: &[sge],
        signaled: true,
    })
    .is_ok()
}
