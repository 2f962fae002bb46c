//! What the library does when the process exits.
//!
//! On the kernel backend the kernel closes the process's sockets. On the
//! AF_XDP backend the TCP connections live in the process, and exiting
//! ends them where they stand: a FIN still queued behind an
//! application's `rdma_disconnect` never leaves, and the peer waits on a
//! connection nobody serves. So the library's finalizer (an `.fini_array`
//! entry, run by `exit` while the progress threads still run) lets the
//! engine finish its connections first: it waits until the device drives
//! none, at most [`EXIT_GRACE`]. Connections the application left
//! established are still open at the deadline and end with the process.
//!
//! The application's other threads run on meanwhile. One still waiting
//! for CM events on a channel the main thread has destroyed (rping's CM
//! thread) would find the channel gone and end the process with its own
//! error status; while the finalizer waits, a call on a destroyed channel
//! waits for the process's end instead ([`wait_if_exiting`]), as the
//! thread would have without the wait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use iwarp_engine::Backend;

/// The longest the finalizer waits for the connections to close.
pub const EXIT_GRACE: Duration = Duration::from_secs(1);

/// How often the finalizer looks.
const EXIT_POLL: Duration = Duration::from_millis(2);

#[used]
#[link_section = ".fini_array"]
static AT_EXIT: extern "C" fn() = at_exit;

/// The finalizer is waiting for the connections.
static EXITING: AtomicBool = AtomicBool::new(false);

extern "C" fn at_exit() {
    let Some(g) = crate::verbs::opened() else {
        return;
    };
    if matches!(g.cfg.backend, Backend::AfXdp(_)) {
        EXITING.store(true, Ordering::SeqCst);
        drain(|| g.dev.stats().connections, EXIT_GRACE);
    }
}

/// While the process exits, block the calling thread until it ends;
/// otherwise return at once.
pub(crate) fn wait_if_exiting() {
    while EXITING.load(Ordering::SeqCst) {
        std::thread::park();
    }
}

/// Wait until `count` reports 0 or `grace` has passed; returns the last
/// count.
fn drain(count: impl Fn() -> usize, grace: Duration) -> usize {
    let deadline = Instant::now() + grace;
    loop {
        let n = count();
        if n == 0 || Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(EXIT_POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn drain_returns_once_the_count_is_zero() {
        let left = Cell::new(3_usize);
        let n = drain(
            || {
                left.set(left.get().saturating_sub(1));
                left.get()
            },
            Duration::from_secs(3600),
        );
        assert_eq!((n, left.get()), (0, 0));
    }

    #[test]
    fn drain_gives_up_at_the_deadline() {
        let looks = Cell::new(0);
        let n = drain(
            || {
                looks.set(looks.get() + 1);
                2
            },
            Duration::ZERO,
        );
        assert_eq!((n, looks.get()), (2, 1));
    }
}
