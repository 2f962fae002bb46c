//! Completion queues and work completions.
//!
//! A [`Cq`] is a bounded ring of [`WorkCompletion`]s shared by any number of
//! queue pairs. It also carries the notification state an application uses
//! to sleep instead of spinning: after [`Cq::req_notify`], the next matching
//! completion raises an event that a backend turns into a wake-up
//! (a completion channel).

use std::collections::VecDeque;

/// Identifies a queue pair within a [`crate::verbs::Context`]: a slot
/// index and a generation packed into a `u32` ([`crate::slab`]), so the
/// handle of a destroyed QP never names the QP that reuses its slot. The
/// packed value ([`QpId::raw`]) is the QP number applications print and
/// exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QpId(u32);

crate::slab::handle_impl!(QpId);

/// Identifies a completion queue within a [`crate::verbs::Context`]:
/// index and generation, as [`QpId`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CqId(u32);

crate::slab::handle_impl!(CqId);

/// The outcome of a work request, as the verbs name it. Local errors are
/// found by this QP; remote ones are reported by the peer in a Terminate
/// message (RFC 5040 §4.8) and mapped from its layer and error type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// The operation completed: a Send, Write or Immediate Data is handed to
    /// TCP whole, a Read or Atomic has its response placed, a receive holds
    /// the whole message.
    Success,
    /// A local length check failed (e.g. a received message was longer
    /// than the posted receive buffer).
    LocalLengthError,
    /// A local scatter/gather element failed its memory check.
    LocalProtectionError,
    /// The work request is not valid for this QP (e.g. too many SGEs for a
    /// Read, an opcode the QP does not support).
    LocalQpOperationError,
    /// The peer reported a protection error (Terminate: remote protection
    /// or tagged buffer error).
    RemoteAccessError,
    /// The peer reported an error that is neither a protection error nor an
    /// untagged buffer error (RDMAP remote operation or catastrophic
    /// errors, DDP catastrophic errors, MPA errors).
    RemoteOperationError,
    /// The peer reported that the request was invalid (untagged buffer
    /// errors, e.g. no receive buffer posted).
    RemoteInvalidRequestError,
    /// The QP entered the Error state before the request completed.
    WrFlushError,
    /// A fatal error that none of the above describes.
    GeneralError,
}

/// What kind of work request completed: send-queue operations by the verb
/// posted, receive-queue completions as [`WcOpcode::Recv`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A Send (any variant) from the send queue.
    Send,
    /// An RDMA Write: the data is handed to TCP (RDMAP gives no
    /// acknowledgement of placement at the peer).
    RdmaWrite,
    /// An RDMA Read: the whole Read Response is placed in the local buffer.
    RdmaRead,
    /// A Local Invalidate: the STag no longer grants access.
    LocalInvalidate,
    /// Immediate Data sent (RFC 7306 §6).
    ImmediateData,
    /// A FetchAdd (RFC 7306 §5.1.1): the original value is in the local
    /// buffer.
    AtomicFetchAdd,
    /// A CompareSwap (RFC 7306 §5.1.2): the original value is in the local
    /// buffer.
    AtomicCompareSwap,
    /// A receive: an incoming Send was placed into a posted receive
    /// buffer, or Immediate Data consumed it (`imm_data` is set).
    Recv,
}

/// One entry of a completion queue: the result of one signalled work
/// request, or of one received message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The application's identifier of the work request.
    pub wr_id: u64,
    /// The outcome. Unless it is [`WcStatus::Success`], only `wr_id`,
    /// `opcode` and `qp` carry information.
    pub status: WcStatus,
    /// The kind of work request that completed.
    pub opcode: WcOpcode,
    /// Bytes the request covered: for a receive, the length of the message
    /// placed; for a send-queue request, the total length of its
    /// scatter/gather list.
    pub byte_len: u32,
    /// The QP the work request was posted to, or, for a receive from a
    /// shared receive queue, the QP the message arrived on.
    pub qp: QpId,
    /// For receives of Send with Invalidate: the STag the peer invalidated.
    pub invalidated_stag: Option<u32>,
    /// For receives: the Send carried the Solicited Event flag.
    pub solicited: bool,
    /// For receives consumed by Immediate Data (RFC 7306 §6): its 8 bytes,
    /// as a big-endian number (the order they had on the wire).
    pub imm_data: Option<u64>,
}

/// Which completions raise a notification after [`Cq::req_notify`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notify {
    /// Not armed: completions raise no notification.
    Off,
    /// Armed by `req_notify(false)`: the next completion of any kind raises
    /// one notification and disarms.
    Any,
    /// The next solicited receive completion, or any unsuccessful one.
    Solicited,
}

/// A completion queue: a bounded FIFO of [`WorkCompletion`]s, oldest
/// first, with the notification state of `ibv_req_notify_cq`.
#[derive(Debug)]
pub struct Cq {
    entries: VecDeque<WorkCompletion>,
    capacity: usize,
    notify: Notify,
    event: bool,
    overruns: u64,
}

impl Cq {
    /// A queue that holds up to `capacity` completions.
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: VecDeque::with_capacity(capacity),
            capacity,
            notify: Notify::Off,
            event: false,
            overruns: 0,
        }
    }

    /// Append a completion. Returns `false` (and counts an overrun) when
    /// the queue is full: the completion is lost, and the QP that produced
    /// it must be moved to Error by the caller.
    pub fn push(&mut self, wc: WorkCompletion) -> bool {
        if self.entries.len() >= self.capacity {
            self.overruns += 1;
            return false;
        }
        let fire = match self.notify {
            Notify::Off => false,
            Notify::Any => true,
            Notify::Solicited => wc.solicited || wc.status != WcStatus::Success,
        };
        if fire {
            self.notify = Notify::Off;
            self.event = true;
        }
        self.entries.push_back(wc);
        true
    }

    /// Move up to `out.len()` completions into `out`, oldest first.
    pub fn poll(&mut self, out: &mut [WorkCompletion]) -> usize {
        let n = out.len().min(self.entries.len());
        for (slot, wc) in out.iter_mut().zip(self.entries.drain(..n)) {
            *slot = wc;
        }
        n
    }

    /// Take the oldest completion, `None` if the queue is empty.
    pub fn poll_one(&mut self) -> Option<WorkCompletion> {
        self.entries.pop_front()
    }

    /// Arm the notification: the next completion (with `solicited_only`,
    /// the next solicited receive or unsuccessful completion) sets the
    /// event [`Cq::take_event`] reports, once. Completions already queued
    /// do not fire it.
    pub fn req_notify(&mut self, solicited_only: bool) {
        self.notify = if solicited_only {
            Notify::Solicited
        } else {
            Notify::Any
        };
    }

    /// Whether a notification fired since the last call (and clear it).
    pub fn take_event(&mut self) -> bool {
        core::mem::take(&mut self.event)
    }

    /// The number of completions waiting to be polled.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no completion is waiting.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The most completions the queue holds; one more is an overrun.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Completions lost because the queue was full.
    pub fn overruns(&self) -> u64 {
        self.overruns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(id: u64, solicited: bool) -> WorkCompletion {
        WorkCompletion {
            wr_id: id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            qp: QpId::from_raw(0),
            invalidated_stag: None,
            solicited,
            imm_data: None,
        }
    }

    #[test]
    fn bounded_fifo() {
        let mut cq = Cq::new(2);
        assert!(cq.push(wc(1, false)));
        assert!(cq.push(wc(2, false)));
        assert!(!cq.push(wc(3, false)));
        assert_eq!(cq.overruns(), 1);
        let mut out = [wc(0, false); 4];
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!((out[0].wr_id, out[1].wr_id), (1, 2));
        assert!(cq.poll_one().is_none());
    }

    #[test]
    fn notification_modes() {
        let mut cq = Cq::new(8);
        cq.push(wc(1, false));
        assert!(!cq.take_event(), "not armed");
        cq.req_notify(true);
        cq.push(wc(2, false));
        assert!(!cq.take_event(), "unsolicited does not fire");
        cq.push(wc(3, true));
        assert!(cq.take_event());
        cq.push(wc(4, true));
        assert!(!cq.take_event(), "one-shot");
        cq.req_notify(false);
        cq.push(wc(5, false));
        assert!(cq.take_event());
    }
}
