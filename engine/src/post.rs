//! Work requests on their way from application threads to the engine.
//!
//! `Qp::post_send` / `Qp::post_recv` do not take the device lock: they
//! check the work request, reserve a place against the QP's depth and push
//! it onto the QP's own lock-free queue (a crossbeam `ArrayQueue` as deep
//! as the QP's queue), then list the QP on the device's [`Posted`] list
//! if it is not listed yet and wake the engine. The engine, under its
//! lock, moves what was queued into the core, receives before sends: at
//! the start of every pass, and again whenever it has taken input from
//! the network after that. A receive posted before the peer sent the
//! message it is for is so in the core before the message is, as with a
//! receive queue the hardware reads when the message arrives.
//!
//! Errors stay synchronous: the checks that depend only on the work request
//! ([`SendWr::check`]) run at post time, and `QueueFull` is exact. A QP's
//! `used` count is every entry queued here or handed to the core and not
//! known to be retired; it rises at post time and falls when a post finds
//! it at the depth and settles it under the lock against the core's
//! occupancy. So a full queue costs a lock once per refill, never per post.
//! Posting to a QP in Error completes with a flush once the
//! engine has moved the request (the next pass).
//!
//! A shared receive queue's posts travel the same way: its `WorkQueues`
//! name the SRQ instead of a QP and have a receive queue only, as deep as
//! the SRQ; settling reads the SRQ's occupancy in the core.
//!
//! With manual progress the posting threads are the engine's only
//! drivers, and the hop through the queues is pure cost on the latency
//! path (a 4-byte RDMA Write ping-pong pays it once per half round trip).
//! There a post that takes the device lock without waiting uses
//! [`WorkQueues::post_send_now`] / [`WorkQueues::post_recv_now`]: the same
//! checks and reservation, then whatever is queued moves into the core and
//! the new request follows it, so per-thread order holds either way.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_queue::{ArrayQueue, SegQueue};
use iwarp::cq::QpId;
use iwarp::qp::{PostError, RecvWr, SendOp, SendWr, Sge, MAX_SGE};
use iwarp::srq::SrqId;
use iwarp::verbs::Context;

/// Listed queues whose work requests one [`Posted::drain`] moves into
/// the core at most.
const POSTED_PER_DRAIN: usize = 4096;

/// The device's list of the QPs (and shared receive queues) with work
/// requests queued: application threads list them without the device
/// lock, the engine drains them under it.
#[derive(Debug, Default)]
pub(crate) struct Posted(SegQueue<Arc<WorkQueues>>);

impl Posted {
    /// List `wq`, unless it is listed already.
    pub(crate) fn list(&self, wq: &Arc<WorkQueues>) {
        if wq.mark_listed() {
            self.0.push(wq.clone());
        }
    }

    /// Nothing is listed.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Move the work requests of the listed queues into the core (device
    /// lock), calling `touch` with every QP that got some. Returns how
    /// many moved. Bounded: queues listed again while this runs wait for
    /// the next drain rather than keep it going.
    pub(crate) fn drain(&self, ctx: &mut Context, mut touch: impl FnMut(QpId)) -> usize {
        let mut n = 0;
        for _ in 0..POSTED_PER_DRAIN {
            let Some(q) = self.0.pop() else {
                break;
            };
            n += q.drain(ctx);
            if let Some(qp) = q.qp() {
                touch(qp);
            }
        }
        n
    }
}

/// Where the queued work requests go in the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dest {
    /// A QP: sends and receives.
    Qp(QpId),
    /// A shared receive queue: receives only (its send queue has depth 0).
    Srq(SrqId),
}

/// A send-queue work request with its gather list copied.
#[derive(Clone, Copy, Debug)]
struct QueuedSend {
    wr_id: u64,
    op: SendOp,
    sgl: [Sge; MAX_SGE],
    nsge: u8,
    signaled: bool,
}

/// A receive work request with its scatter list copied.
#[derive(Clone, Copy, Debug)]
struct QueuedRecv {
    wr_id: u64,
    sgl: [Sge; MAX_SGE],
    nsge: u8,
}

/// Copy a checked list (at most [`MAX_SGE`] elements).
fn copy_sgl(sgl: &[Sge]) -> ([Sge; MAX_SGE], u8) {
    let mut out = [Sge::default(); MAX_SGE];
    let n = sgl.len().min(MAX_SGE);
    out[..n].copy_from_slice(&sgl[..n]);
    (out, n as u8)
}

/// One work queue (send or receive) of a QP, application side.
#[derive(Debug)]
struct Queue<T> {
    q: ArrayQueue<T>,
    depth: usize,
    /// Entries queued or in the core and not known to be retired.
    used: AtomicUsize,
    /// Entries handed to the core and not known to be retired; changed
    /// only under the device lock.
    in_core: AtomicUsize,
}

impl<T> Queue<T> {
    fn new(depth: usize, in_core: usize) -> Self {
        Self {
            q: ArrayQueue::new(depth.max(1)),
            depth,
            used: AtomicUsize::new(in_core),
            in_core: AtomicUsize::new(in_core),
        }
    }

    /// Take a place if one is free as far as `used` knows.
    fn reserve(&self) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                (u < self.depth).then_some(u + 1)
            })
            .is_ok()
    }

    /// Queue `e` in a reserved place. `Err(None)`: full as far as `used`
    /// knows (the caller settles and retries once).
    fn push(&self, e: T) -> Result<(), Option<PostError>> {
        if !self.reserve() {
            return Err(None);
        }
        if self.q.push(e).is_err() {
            // Cannot happen while `used` bounds the queue; be exact anyway.
            self.used.fetch_sub(1, Ordering::SeqCst);
            return Err(Some(PostError::QueueFull));
        }
        Ok(())
    }

    /// Give back the places of entries the core retired (device lock).
    fn settle(&self, occupancy: usize) {
        let in_core = self.in_core.load(Ordering::SeqCst);
        let retired = in_core.saturating_sub(occupancy);
        self.in_core.store(in_core - retired, Ordering::SeqCst);
        self.used.fetch_sub(retired, Ordering::SeqCst);
    }

    /// Move every queued entry into the core with `post` (device lock).
    fn drain(&self, mut post: impl FnMut(&T)) -> usize {
        let mut n = 0;
        while let Some(e) = self.q.pop() {
            post(&e);
            n += 1;
        }
        if n > 0 {
            self.in_core.fetch_add(n, Ordering::SeqCst);
        }
        n
    }
}

/// The work queues of one QP (or the receive queue of one shared
/// receive queue) between its application threads and the engine.
/// Shared by the `Qp` (`Srq`) handle and the device's posted list.
#[derive(Debug)]
pub(crate) struct WorkQueues {
    dest: Dest,
    sq: Queue<QueuedSend>,
    rq: Queue<QueuedRecv>,
    /// On the device's posted list (or about to be taken off it).
    listed: AtomicBool,
    /// The QP was released: nothing more reaches the core.
    closed: AtomicBool,
}

impl WorkQueues {
    /// Queues of depths `sq_depth`/`rq_depth` for core QP `qp`, which
    /// already holds `recvs_in_core` receives.
    pub(crate) fn new(qp: QpId, sq_depth: usize, rq_depth: usize, recvs_in_core: usize) -> Self {
        Self::with_dest(Dest::Qp(qp), sq_depth, rq_depth, recvs_in_core)
    }

    /// The receive queue of core SRQ `srq`, of `capacity` receives.
    pub(crate) fn srq(srq: SrqId, capacity: usize) -> Self {
        Self::with_dest(Dest::Srq(srq), 0, capacity, 0)
    }

    fn with_dest(dest: Dest, sq_depth: usize, rq_depth: usize, recvs_in_core: usize) -> Self {
        Self {
            dest,
            sq: Queue::new(sq_depth, 0),
            rq: Queue::new(rq_depth, recvs_in_core),
            listed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    /// Queue a send. `Err(None)`: full as far as the queue knows, the
    /// caller settles and retries once.
    pub(crate) fn push_send(&self, wr: &SendWr<'_>) -> Result<(), Option<PostError>> {
        wr.check().map_err(Some)?;
        let (sgl, nsge) = copy_sgl(wr.sgl);
        self.sq.push(QueuedSend {
            wr_id: wr.wr_id,
            op: wr.op,
            sgl,
            nsge,
            signaled: wr.signaled,
        })
    }

    /// Queue a receive; as [`Self::push_send`].
    pub(crate) fn push_recv(&self, wr: &RecvWr<'_>) -> Result<(), Option<PostError>> {
        wr.check().map_err(Some)?;
        let (sgl, nsge) = copy_sgl(wr.sgl);
        self.rq.push(QueuedRecv {
            wr_id: wr.wr_id,
            sgl,
            nsge,
        })
    }

    /// [`Self::push_send`] for a caller holding the device lock: what is
    /// queued moves into the core first, then `wr` follows it at once.
    pub(crate) fn post_send_now(
        &self,
        wr: &SendWr<'_>,
        ctx: &mut Context,
    ) -> Result<(), Option<PostError>> {
        wr.check().map_err(Some)?;
        self.post_now(&self.sq, ctx, |ctx| self.post_send_core(ctx, wr))
    }

    /// [`Self::post_send_now`] for a receive.
    pub(crate) fn post_recv_now(
        &self,
        wr: &RecvWr<'_>,
        ctx: &mut Context,
    ) -> Result<(), Option<PostError>> {
        wr.check().map_err(Some)?;
        self.post_now(&self.rq, ctx, |ctx| self.post_recv_core(ctx, wr))
    }

    /// Hand a checked send to the core.
    fn post_send_core(&self, ctx: &mut Context, wr: &SendWr<'_>) {
        if let Dest::Qp(qp) = self.dest {
            let _ = ctx.post_send(qp, wr);
        }
    }

    /// Hand a checked receive to the core.
    fn post_recv_core(&self, ctx: &mut Context, wr: &RecvWr<'_>) {
        let _ = match self.dest {
            Dest::Qp(qp) => ctx.post_recv(qp, wr),
            Dest::Srq(srq) => ctx.post_srq_recv(srq, wr),
        };
    }

    /// Take a place in `q`, move what is queued into the core, then hand
    /// the checked request to it with `post` (device lock). As in
    /// [`Self::drain`], the core accepts it (or the QP is gone already).
    fn post_now<T>(
        &self,
        q: &Queue<T>,
        ctx: &mut Context,
        post: impl FnOnce(&mut Context),
    ) -> Result<(), Option<PostError>> {
        if !q.reserve() {
            return Err(None);
        }
        self.drain_queued(ctx);
        if !self.closed.load(Ordering::SeqCst) {
            post(ctx);
        }
        q.in_core.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// [`Self::drain`] if anything is queued (a request posted at the same
    /// time by another thread may go either side of the caller's).
    fn drain_queued(&self, ctx: &mut Context) {
        if !self.sq.q.is_empty() || !self.rq.q.is_empty() {
            self.drain(ctx);
        }
    }

    /// Mark listed; true if the caller must put the queues on the posted
    /// list.
    fn mark_listed(&self) -> bool {
        !self.listed.swap(true, Ordering::SeqCst)
    }

    /// Move everything queued into the core (device lock). Returns how
    /// many work requests moved.
    pub(crate) fn drain(&self, ctx: &mut Context) -> usize {
        // Unlisted first: a post racing with this drain either is seen
        // below or lists the queues again.
        self.listed.store(false, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            while self.rq.q.pop().is_some() {}
            while self.sq.q.pop().is_some() {}
            return 0;
        }
        // The checks passed at post time and the depths were reserved:
        // the core accepts every one (or the QP is gone already).
        let mut n = self.rq.drain(|r| {
            self.post_recv_core(
                ctx,
                &RecvWr {
                    wr_id: r.wr_id,
                    sgl: &r.sgl[..usize::from(r.nsge)],
                },
            );
        });
        n += self.sq.drain(|s| {
            self.post_send_core(
                ctx,
                &SendWr {
                    wr_id: s.wr_id,
                    op: s.op,
                    sgl: &s.sgl[..usize::from(s.nsge)],
                    signaled: s.signaled,
                },
            );
        });
        n
    }

    /// The QP the queues feed (`None`: a shared receive queue).
    pub(crate) fn qp(&self) -> Option<QpId> {
        match self.dest {
            Dest::Qp(qp) => Some(qp),
            Dest::Srq(_) => None,
        }
    }

    /// Learn what the core retired since the last settle (device lock,
    /// after [`Self::drain`]).
    pub(crate) fn settle(&self, ctx: &Context) {
        let (sq, rq) = match self.dest {
            Dest::Qp(qp) => ctx.qp_occupancy(qp).unwrap_or((0, 0)),
            Dest::Srq(srq) => (0, ctx.srq_occupancy(srq).unwrap_or(0)),
        };
        self.sq.settle(sq);
        self.rq.settle(rq);
    }

    /// The QP is being released: later drains drop what is queued.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iwarp::mem::Access;
    use iwarp::mpa::handshake::Config;
    use iwarp::qp::QpConfig;
    use iwarp::testing::{Chunking, Pair};

    fn pair() -> Pair {
        Pair::connected(
            QpConfig::default(),
            Chunking::whole(4096),
            Config::default(),
            Config::default(),
        )
    }

    fn write(wr_id: u64, sgl: &[Sge], remote_addr: u64, rkey: u32) -> SendWr<'_> {
        SendWr {
            wr_id,
            op: SendOp::Write { remote_addr, rkey },
            sgl,
            signaled: true,
        }
    }

    /// A request handed to the core at once goes behind what was queued
    /// before it, and both count against the depth until the core
    /// retires them.
    #[test]
    fn post_now_follows_the_queued_and_counts_against_the_depth() {
        let mut p = pair();
        let first = p.a.reg_with(&[1; 8], Access::NONE);
        let second = p.a.reg_with(&[2; 8], Access::NONE);
        let dst = p.b.reg(8, Access::REMOTE_WRITE);
        let one = |mr: &iwarp::mem::MrInfo| {
            [Sge {
                addr: mr.iova,
                len: 8,
                lkey: mr.lkey,
            }]
        };
        let (s1, s2) = (one(&first), one(&second));
        let wr = |wr_id, sgl| write(wr_id, sgl, dst.iova, dst.rkey);
        let wq = WorkQueues::new(p.a.qp, 2, 1, 0);
        wq.push_send(&wr(1, &s1)).unwrap();
        wq.post_send_now(&wr(2, &s2), &mut p.a.ctx).unwrap();
        // Both are in the core, in posting order; the queue is at its depth.
        assert_eq!(p.a.ctx.qp_occupancy(p.a.qp), Some((2, 0)));
        assert!(wq.sq.q.is_empty());
        assert_eq!(
            wq.post_send_now(&wr(3, &s1), &mut p.a.ctx),
            Err(None),
            "a third request on a 2-deep queue"
        );
        p.drive();
        assert_eq!(p.b.bytes(&dst), &[2; 8], "the later write lands last");
        let ids: Vec<u64> = p.a.completions().iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, [1, 2]);
        // Settled against the core, both places are free again.
        wq.settle(&p.a.ctx);
        wq.post_send_now(&wr(3, &s1), &mut p.a.ctx).unwrap();
        wq.push_send(&wr(4, &s1)).unwrap();
        assert_eq!(wq.push_send(&wr(5, &s1)), Err(None));
    }

    /// A receive handed to the core at once takes a place as a queued one
    /// does; invalid requests fail before taking one.
    #[test]
    fn post_recv_now_checks_and_counts() {
        let mut p = pair();
        let buf = p.a.reg(16, Access::LOCAL_WRITE);
        let sgl = [Sge {
            addr: buf.iova,
            len: 16,
            lkey: buf.lkey,
        }];
        let wq = WorkQueues::new(p.a.qp, 1, 1, 0);
        let too_many = [sgl[0]; MAX_SGE + 1];
        assert_eq!(
            wq.post_recv_now(
                &RecvWr {
                    wr_id: 0,
                    sgl: &too_many
                },
                &mut p.a.ctx
            ),
            Err(Some(PostError::InvalidSgl))
        );
        wq.post_recv_now(
            &RecvWr {
                wr_id: 1,
                sgl: &sgl,
            },
            &mut p.a.ctx,
        )
        .unwrap();
        assert_eq!(p.a.ctx.qp_occupancy(p.a.qp), Some((0, 1)));
        assert_eq!(
            wq.push_recv(&RecvWr {
                wr_id: 2,
                sgl: &sgl
            }),
            Err(None)
        );
    }
}
