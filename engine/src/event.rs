//! Event descriptors: the semaphore eventfds through which completion
//! notifications ([`crate::Cq::event_fd`]), connection requests
//! ([`crate::Listener::event_fd`]), connection-manager events
//! ([`crate::Qp::event_fd`]) and connect outcomes
//! ([`crate::Connecting::event_fd`]) reach applications that wait in
//! poll(2) or epoll.
//!
//! Each is an eventfd opened with `EFD_SEMAPHORE | EFD_NONBLOCK |
//! EFD_CLOEXEC`: one count per queued item, so the descriptor is readable
//! exactly while an item is waiting, and each read takes one count. Counts
//! are added and taken under the lock that guards the items themselves,
//! so the two always agree.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A semaphore eventfd (see the module documentation).
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl EventFd {
    /// A new eventfd holding `count`.
    pub(crate) fn new(count: usize) -> io::Result<Self> {
        let init = u32::try_from(count).unwrap_or(u32::MAX);
        let flags = libc::EFD_SEMAPHORE | libc::EFD_NONBLOCK | libc::EFD_CLOEXEC;
        // SAFETY: eventfd(2) takes no pointers.
        let fd = unsafe { libc::eventfd(init, flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Add one count (the descriptor becomes readable).
    pub(crate) fn add(&self) {
        let one = 1u64.to_ne_bytes();
        loop {
            // SAFETY: writes 8 bytes from a live local buffer.
            let r = unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
            // Only EINTR is retried: the count cannot reach the eventfd's
            // limit (2^64 - 2) from queued items.
            if r >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return;
            }
        }
    }

    /// Take one count if there is one (never blocks).
    pub(crate) fn take(&self) -> bool {
        let mut buf = [0u8; 8];
        loop {
            // SAFETY: reads at most 8 bytes into a live local buffer.
            let r = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if r == 8 {
                return true;
            }
            if r >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return false;
            }
        }
    }

    /// Wait in poll(2) until the descriptor is readable or `deadline`
    /// passes (`None`: no limit); true when readable. Takes nothing.
    pub(crate) fn wait_readable(&self, deadline: Option<Instant>) -> bool {
        wait_for(self.0.as_fd(), libc::POLLIN, deadline)
    }

    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Wait in poll(2) until `fd` reports one of `events` (or an error or
/// hang-up) or `deadline` passes (`None`: no limit); true when it did.
pub(crate) fn wait_for(
    fd: BorrowedFd<'_>,
    events: libc::c_short,
    deadline: Option<Instant>,
) -> bool {
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                // Rounded up: a wait never ends before the deadline.
                let ms = left.as_nanos().div_ceil(1_000_000);
                i32::try_from(ms).unwrap_or(i32::MAX)
            }
        };
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid `pollfd`, the count passed is 1.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r > 0 {
            return true;
        }
        if r == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return false;
        }
    }
}

/// An epoll instance (level-triggered, read interest): one descriptor
/// readable while any of its members is.
#[derive(Debug)]
pub(crate) struct Epoll(OwnedFd);

impl Epoll {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: epoll_create1(2) takes no pointers.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Watch `fd` for `events` (`EPOLLIN`, `EPOLLOUT`).
    pub(crate) fn add(&self, fd: BorrowedFd<'_>, events: libc::c_int) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: events as u32,
            u64: 0,
        };
        // SAFETY: both descriptors are open; `ev` is a live local.
        let r = unsafe {
            libc::epoll_ctl(
                self.0.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd.as_raw_fd(),
                &mut ev,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Stop watching `fd`.
    pub(crate) fn remove(&self, fd: BorrowedFd<'_>) {
        // SAFETY: both descriptors are open; a null event is allowed for
        // EPOLL_CTL_DEL.
        let _ = unsafe {
            libc::epoll_ctl(
                self.0.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd.as_raw_fd(),
                std::ptr::null_mut(),
            )
        };
    }

    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// An [`EventFd`] created on first use.
#[derive(Debug, Default)]
pub(crate) struct LazyEventFd(OnceLock<EventFd>);

impl LazyEventFd {
    /// The eventfd, if created.
    pub(crate) fn get(&self) -> Option<&EventFd> {
        self.0.get()
    }

    /// The eventfd, created with `count` if it does not exist yet. The
    /// caller holds the lock of the items counted, so `count` is exact.
    pub(crate) fn get_or_create(&self, count: impl FnOnce() -> usize) -> io::Result<&EventFd> {
        if let Some(fd) = self.0.get() {
            return Ok(fd);
        }
        let fd = EventFd::new(count())?;
        // A concurrent creator under the same lock cannot exist; without
        // one, the first wins and this one is closed.
        let _ = self.0.set(fd);
        Ok(self.0.get().expect("set above"))
    }

    /// Add one count if the eventfd exists.
    pub(crate) fn add(&self) {
        if let Some(fd) = self.0.get() {
            fd.add();
        }
    }

    /// Take one count if the eventfd exists.
    pub(crate) fn take(&self) {
        if let Some(fd) = self.0.get() {
            fd.take();
        }
    }
}

/// Wait until `ready` yields a value, with a progress thread sleeping on
/// `fd` in poll(2) between looks; `None` once `timeout` passes.
pub(crate) fn poll_until<R>(
    fd: &EventFd,
    timeout: Option<Duration>,
    mut ready: impl FnMut() -> Option<R>,
) -> Option<R> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        if let Some(r) = ready() {
            return Some(r);
        }
        if !fd.wait_readable(deadline) {
            return ready();
        }
    }
}
