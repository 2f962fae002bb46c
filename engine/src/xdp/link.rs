//! The in-process link: two engines in one process joined by lock-free
//! rings instead of an interface ([`Backend::Link`](crate::Backend::Link)).
//!
//! Both ends' transmit slots lie in one shared area. A frame one end's
//! smoltcp writes into a transmit slot is *lent* to the other end: the
//! slot's address goes into the other end's receive queue, the other
//! end's smoltcp reads the frame where it was written, and the address
//! comes back through the sender's completion queue when it is done —
//! the tx and completion rings of an AF_XDP socket with the kernel and
//! the wire taken out. No byte is copied between the ends, no system
//! call is made while both ends poll, and TCP transmit checksums are
//! left to the receiver's one verifying pass (as a NIC's transmit
//! offload leaves them): what the link measures is the stack's own cost
//! per frame and per byte, the ceiling a zero-copy NIC would leave.
//!
//! A frame is one queue entry (its transmit slot holds it in one piece at
//! any MTU), so a frame is never seen half-written. An end that goes to
//! sleep says so ([`End::arm`]); the other end then writes its eventfd
//! after queueing a frame or returning one.

use std::fmt;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

use super::umem::{Layout, TX_META};
use super::xsk::{invalid, Area};
use super::XdpConfig;
use crate::event::EventFd;

/// One end of an in-process link, with the configuration of the engine
/// that runs on it ([`link`] makes both).
#[derive(Clone)]
pub struct LinkEnd {
    cfg: XdpConfig,
    pub(crate) end: End,
}

impl LinkEnd {
    /// The configuration of this end's engine.
    pub fn config(&self) -> &XdpConfig {
        &self.cfg
    }

    /// Which end: 0 or 1.
    pub fn side(&self) -> usize {
        self.end.side
    }
}

impl fmt::Debug for LinkEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinkEnd")
            .field("side", &self.end.side)
            .field("ip", &self.cfg.ip)
            .field("mtu", &self.cfg.mtu)
            .finish_non_exhaustive()
    }
}

impl PartialEq for LinkEnd {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.end.shared, &other.end.shared) && self.end.side == other.end.side
    }
}

impl Eq for LinkEnd {}

/// An in-process link between two engines configured by `a` and `b`
/// (their interface names, attach modes, queues, busy-polled socket and
/// ring settings are not used; `a.mtu` and `b.mtu` must be equal, as on
/// a wire). Each end opens one device
/// ([`Device::open`](crate::Device::open) with
/// [`Backend::Link`](crate::Backend::Link)); an end is used by one open
/// device at a time. Without a MAC address an end takes `02:00` followed
/// by its IPv4 address.
pub fn link(a: XdpConfig, b: XdpConfig) -> io::Result<(LinkEnd, LinkEnd)> {
    if a.mtu != b.mtu {
        return Err(invalid(format!(
            "the link's ends have MTUs {} and {}",
            a.mtu, b.mtu
        )));
    }
    if a.ip == b.ip {
        return Err(invalid(format!(
            "both ends of the link have address {}",
            a.ip
        )));
    }
    let la = layout(&a, 0)?;
    let lb = layout(&b, (la.area() as u64).next_multiple_of(4096))?;
    let area = Area::new(lb.area())?;
    let half = |me: &Layout, other: &Layout| -> io::Result<Half> {
        Ok(Half {
            // An end's queues hold every frame the other end (`rx`) and
            // this one (`done`) can have in flight, each holding a
            // transmit slot: a push never finds them full.
            rx: ArrayQueue::new(other.tx_slots.max(1) as usize),
            done: ArrayQueue::new(me.tx_slots.max(1) as usize),
            sleepy: AtomicBool::new(false),
            event: EventFd::new(0)?,
            open: AtomicBool::new(false),
        })
    };
    let halves = [half(&la, &lb)?, half(&lb, &la)?];
    let shared = Arc::new(Shared {
        area,
        layouts: [la, lb],
        halves,
    });
    let end = |cfg: XdpConfig, side: usize| {
        let mut cfg = cfg;
        if cfg.mac.is_none() {
            let ip = cfg.ip.octets();
            cfg.mac = Some([0x02, 0x00, ip[0], ip[1], ip[2], ip[3]]);
        }
        LinkEnd {
            cfg,
            end: End {
                side,
                shared: shared.clone(),
            },
        }
    };
    Ok((end(a, 0), end(b, 1)))
}

/// The transmit slots of the end configured by `cfg`, from `origin` of
/// the shared area on (an end receives into the other's slots, so it
/// has no receive chunks).
fn layout(cfg: &XdpConfig, origin: u64) -> io::Result<Layout> {
    let mut l = Layout::new(cfg.frames, cfg.frame_size(), cfg.frame_len(), TX_META)?;
    l.set_rings(None, cfg.tx_ring)?;
    l.rx_slots = 0;
    l.tx_base = origin;
    Ok(l)
}

/// What both ends share.
struct Shared {
    /// Both ends' transmit slots.
    area: Area,
    layouts: [Layout; 2],
    /// What each end receives and gets back.
    halves: [Half; 2],
}

/// The queues into one end.
struct Half {
    /// Frames for this end (address in the area, length), lent by the
    /// other end.
    rx: ArrayQueue<(u64, u32)>,
    /// Addresses of this end's frames the other end is done with.
    done: ArrayQueue<u64>,
    /// This end is (about to be) asleep: the other end writes `event`
    /// after its next push.
    sleepy: AtomicBool,
    event: EventFd,
    /// An engine runs on this end.
    open: AtomicBool,
}

/// A handle on one side of the link.
#[derive(Clone)]
pub(crate) struct End {
    side: usize,
    shared: Arc<Shared>,
}

impl End {
    fn me(&self) -> &Half {
        &self.shared.halves[self.side]
    }

    fn peer(&self) -> &Half {
        &self.shared.halves[1 - self.side]
    }

    /// Claim the end for one engine.
    pub(crate) fn open(&self) -> io::Result<()> {
        if self.me().open.swap(true, Ordering::AcqRel) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("end {} of the link is in use", self.side),
            ));
        }
        Ok(())
    }

    /// Let the end go (its engine closed): the frames the other end
    /// lent and this one did not read go back to it.
    pub(crate) fn close(&self) {
        while let Some((addr, _)) = self.me().rx.pop() {
            self.give_back(addr);
        }
        while self.me().done.pop().is_some() {}
        self.me().open.store(false, Ordering::Release);
    }

    /// The shared area.
    pub(crate) fn area(&self) -> &Area {
        &self.shared.area
    }

    /// This end's part of the area.
    pub(crate) fn layout(&self) -> Layout {
        self.shared.layouts[self.side]
    }

    /// The next frame lent to this end.
    pub(crate) fn receive(&self) -> Option<(u64, u32)> {
        self.me().rx.pop()
    }

    /// Lend frame `addr`, `len` bytes, to the other end; false if it is
    /// not there (no engine runs on it; the queue holds every frame in
    /// flight).
    pub(crate) fn send(&self, addr: u64, len: u32) -> bool {
        self.peer().open.load(Ordering::Acquire) && self.peer().rx.push((addr, len)).is_ok()
    }

    /// Give a frame the other end lent back to it.
    pub(crate) fn give_back(&self, addr: u64) {
        // Never full: it holds every slot of the other end.
        let _ = self.peer().done.push(addr);
    }

    /// The next of this end's frames given back.
    pub(crate) fn completed(&self) -> Option<u64> {
        self.me().done.pop()
    }

    /// Whether frames or completions wait for this end.
    pub(crate) fn has_input(&self) -> bool {
        !self.me().rx.is_empty() || !self.me().done.is_empty()
    }

    /// After pushes to the other end: wake it if it sleeps.
    pub(crate) fn wake_peer(&self) {
        let p = self.peer();
        // Pairs with the fence in `arm`: either this end sees the flag,
        // or the other end sees what was pushed before it sleeps.
        fence(Ordering::SeqCst);
        if p.sleepy.load(Ordering::Relaxed) && p.sleepy.swap(false, Ordering::AcqRel) {
            p.event.add();
        }
    }

    /// The end's eventfd.
    pub(crate) fn fd(&self) -> i32 {
        self.me().event.as_raw_fd()
    }

    /// The end's engine is about to sleep: returns the descriptor that
    /// becomes readable when the other end pushes (readable at once if
    /// something waits already).
    pub(crate) fn arm(&self) -> i32 {
        let me = self.me();
        while me.event.take() {}
        me.sleepy.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.has_input() && me.sleepy.swap(false, Ordering::AcqRel) {
            me.event.add();
        }
        me.event.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn cfg(last: u8, mtu: usize) -> XdpConfig {
        let mut c = XdpConfig::new("link", Ipv4Addr::new(198, 18, 0, last), 24);
        c.mtu = mtu;
        c
    }

    #[test]
    fn the_ends_slots_do_not_overlap_and_fit_the_area() {
        for mtu in [1500, 9000, 65535 - 14] {
            let (a, b) = link(cfg(1, mtu), cfg(2, mtu)).unwrap();
            let (la, lb) = (a.end.layout(), b.end.layout());
            assert_eq!(la.rx_slots, 0);
            assert!(la.area() as u64 <= lb.tx_base, "{mtu}");
            assert!(lb.area() <= a.end.area().len(), "{mtu}");
            assert!(la.tx_slot as usize >= la.frame_len + TX_META as usize);
            assert_eq!(a.config().mac, Some([2, 0, 198, 18, 0, 1]));
        }
    }

    #[test]
    fn a_link_needs_one_mtu_and_two_addresses() {
        assert!(link(cfg(1, 1500), cfg(2, 9000)).is_err());
        assert!(link(cfg(1, 1500), cfg(1, 1500)).is_err());
    }

    #[test]
    fn frames_are_lent_and_given_back_and_a_sleeper_is_woken() {
        let (a, b) = link(cfg(1, 1500), cfg(2, 1500)).unwrap();
        a.end.open().unwrap();
        assert!(a.end.open().is_err(), "an end serves one engine");
        // Nobody on the other end: nothing is lent.
        assert!(!a.end.send(4096, 60));
        b.end.open().unwrap();
        let fd = b.end.arm();
        assert!(a.end.send(4096, 60));
        a.end.wake_peer();
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        assert_eq!(
            unsafe { libc::poll(&mut p, 1, 0) },
            1,
            "the sleeper is woken"
        );
        assert_eq!(b.end.receive(), Some((4096, 60)));
        assert_eq!(b.end.receive(), None);
        b.end.give_back(4096);
        assert_eq!(a.end.completed(), Some(4096));
        // Arming with input waiting is readable at once.
        assert!(a.end.send(8192, 60));
        let fd = b.end.arm();
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 1);
        b.end.close();
        assert!(b.end.receive().is_none());
        assert_eq!(
            a.end.completed(),
            Some(8192),
            "closing gives back what was lent"
        );
        b.end.open().unwrap();
    }
}
