//! The verbs of shared receive queues ([`crate::srq`]).

use super::{Context, VerbsError};
use crate::cq::{CqId, QpId};
use crate::mem::PdId;
use crate::qp::{QpConfig, RecvWr};
use crate::srq::{Srq, SrqEvent, SrqId};

impl Context {
    /// Create a shared receive queue of `capacity` receives in `pd`, its
    /// limit armed at `limit` (0: disarmed). `InvalidArgument` when
    /// `capacity` is 0 or `limit` exceeds it.
    pub fn create_srq(
        &mut self,
        pd: PdId,
        capacity: usize,
        limit: u32,
    ) -> Result<SrqId, VerbsError> {
        if self.pds.get(pd.key()).is_none() {
            return Err(VerbsError::InvalidHandle);
        }
        self.srqs
            .create(pd, capacity, limit)
            .ok_or(VerbsError::InvalidArgument)
    }

    /// Arm the limit of `srq` at `limit` (0: disarm), as `ibv_modify_srq`
    /// with `IBV_SRQ_LIMIT`. `InvalidArgument` when it exceeds the
    /// capacity.
    pub fn modify_srq(&mut self, srq: SrqId, limit: u32) -> Result<(), VerbsError> {
        match self.srqs.set_limit(srq, limit) {
            None => Err(VerbsError::InvalidHandle),
            Some(false) => Err(VerbsError::InvalidArgument),
            Some(true) => Ok(()),
        }
    }

    /// Destroy `srq`. `Busy` while QPs are attached (destroy them first);
    /// the receives no QP took are discarded without completions.
    /// Returns how many were.
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<usize, VerbsError> {
        self.srqs.destroy(srq).map_err(|busy| {
            if busy {
                VerbsError::Busy
            } else {
                VerbsError::InvalidHandle
            }
        })
    }

    /// Post a receive to `srq`. `QueueFull` at its capacity.
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: &RecvWr<'_>) -> Result<(), VerbsError> {
        self.srqs
            .get_mut(srq)
            .ok_or(VerbsError::InvalidHandle)?
            .post(wr)
            .map_err(VerbsError::from)
    }

    /// The shared receive queue named by `srq`.
    pub fn srq(&self, srq: SrqId) -> Option<&Srq> {
        self.srqs.get(srq)
    }

    /// Receives posted to `srq` that no QP took yet.
    pub fn srq_occupancy(&self, srq: SrqId) -> Option<usize> {
        self.srqs.get(srq).map(Srq::occupancy)
    }

    /// The next asynchronous event of `srq`.
    pub fn poll_srq_event(&mut self, srq: SrqId) -> Option<SrqEvent> {
        self.srqs.poll_event(srq)
    }

    /// Create a queue pair that takes its receives from `srq` (in the
    /// same protection domain, else `InvalidArgument`); posting receives
    /// to the QP itself fails with [`crate::qp::PostError::SrqAttached`].
    /// `config.rq_depth` is not used. The SRQ cannot be destroyed while
    /// the QP exists.
    pub fn create_qp_with_srq(
        &mut self,
        pd: PdId,
        send_cq: CqId,
        recv_cq: CqId,
        srq: SrqId,
        config: QpConfig,
    ) -> Result<QpId, VerbsError> {
        let s = self.srqs.get(srq).ok_or(VerbsError::InvalidHandle)?;
        if s.pd() != pd {
            return Err(VerbsError::InvalidArgument);
        }
        let qp = self.create_qp(pd, send_cq, recv_cq, config)?;
        self.with_qp(qp, |q, _| q.set_srq(srq))?;
        self.srqs.attach(srq);
        Ok(qp)
    }
}
