//! The stages of a connection's lifecycle around the established one
//! ([`super::established`]), the same on both transports:
//! [`Accepting`], an accepted TCP connection whose MPA request is
//! arriving, parsed by a standalone responder until the request is whole,
//! the connection fails or the handshake deadline passes, then handed to
//! its listener as a [`Request`]; and [`Reply`], the last bytes of a
//! connection no QP drives (an MPA reply rejecting a request), sent
//! before it closes. The transports only move bytes between their
//! sockets and these stages.

use std::net::SocketAddr;
use std::sync::Arc;

use iwarp::mpa::handshake::{self, ConnectRequest, Handshake};
use iwarp::time::Instant as CoreInstant;

use super::{ListenShared, Request, Sock};

/// What [`Accepting::feed`] made of the bytes.
#[derive(Debug)]
pub(crate) enum Fed {
    /// The request is not whole yet.
    More,
    /// The request is whole; the bytes after it were not used.
    Request(ConnectRequest),
    /// Not an MPA request: the connection is dropped.
    Failed(String),
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Accepting {
    hs: Handshake,
    /// The request frame as received so far.
    frame: Vec<u8>,
    listener: Arc<ListenShared>,
}

impl Accepting {
    /// A connection `listener` accepted at `now`. Its request is parsed
    /// by a responder that accepts any offer: the application's
    /// parameters decide at accept time, when the core QP replays the
    /// same bytes.
    pub(crate) fn new(listener: Arc<ListenShared>, now: CoreInstant) -> Self {
        let config = handshake::Config {
            ird: iwarp::wire::mpa::IrdOrd::MAX,
            ord: iwarp::wire::mpa::IrdOrd::MAX,
            rtr: handshake::RtrSet::ALL,
            ..handshake::Config::default()
        };
        Self {
            hs: Handshake::responder(config, now),
            frame: Vec::new(),
            listener,
        }
    }

    /// When the request must have arrived.
    pub(crate) fn deadline(&self) -> Option<CoreInstant> {
        self.hs.poll_timeout()
    }

    /// Whether the deadline passed at `now`.
    pub(crate) fn expired(&self, now: CoreInstant) -> bool {
        self.deadline().is_some_and(|d| now >= d)
    }

    pub(crate) fn listener(&self) -> &Arc<ListenShared> {
        &self.listener
    }

    /// Take received `bytes`: returns how many belong to the request (the
    /// rest stays with the caller) and what they made.
    pub(crate) fn feed(&mut self, bytes: &[u8], now: CoreInstant) -> (usize, Fed) {
        match self.hs.handle_input(bytes, now) {
            Ok(used) => {
                self.frame.extend_from_slice(&bytes[..used]);
                match self.hs.poll_event() {
                    Some(handshake::Event::ConnectRequest(req)) => (used, Fed::Request(req)),
                    _ => (used, Fed::More),
                }
            }
            Err(e) => (0, Fed::Failed(e.to_string())),
        }
    }

    /// Queue the whole request for the application: the connection
    /// `sock` between `local` and `peer`, with effective MSS `emss` and
    /// `rest`, the bytes received after the request.
    pub(crate) fn hand_over(
        self,
        request: ConnectRequest,
        sock: Sock,
        peer: SocketAddr,
        local: SocketAddr,
        emss: usize,
        rest: Vec<u8>,
    ) {
        tracing::debug!(%peer, "MPA request queued for the listener");
        self.listener.push(Request {
            sock,
            peer,
            local,
            emss,
            hs: self.hs,
            request,
            frame: self.frame,
            rest,
        });
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Reply {
    out: Vec<u8>,
    pos: usize,
}

impl Reply {
    pub(crate) fn new(out: Vec<u8>) -> Self {
        Self { out, pos: 0 }
    }

    /// Every byte was written.
    pub(crate) fn sent(&self) -> bool {
        self.pos >= self.out.len()
    }

    /// Write what is left through `write`, which returns how many of the
    /// bytes it is offered it took (0: no room now), until every byte
    /// left or no room is left. Returns the bytes written; an error of
    /// `write` ends the writing.
    pub(crate) fn write<E>(
        &mut self,
        mut write: impl FnMut(&[u8]) -> Result<usize, E>,
    ) -> Result<usize, E> {
        let mut n = 0;
        while !self.sent() {
            let k = write(&self.out[self.pos..])?.min(self.out.len() - self.pos);
            if k == 0 {
                break;
            }
            self.pos += k;
            n += k;
        }
        Ok(n)
    }
}

/// Log a connection dropped before its MPA request came.
pub(crate) fn dropped(peer: Option<SocketAddr>, reason: &str) {
    match peer {
        Some(peer) => tracing::warn!(%peer, reason, "connection dropped before its MPA request"),
        None => tracing::warn!(reason, "connection dropped before its MPA request"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply goes out in the pieces the socket takes, stops while it
    /// has no room, resumes where it stopped, and ends at its last byte;
    /// an error ends the writing.
    #[test]
    fn a_reply_is_written_in_what_the_socket_takes() {
        let bytes: Vec<u8> = (0..10).collect();
        let mut reply = Reply::new(bytes.clone());
        let mut wire = Vec::new();
        let mut room = 4;
        let n = reply.write(|b: &[u8]| -> Result<usize, ()> {
            let k = b.len().min(3).min(room);
            wire.extend_from_slice(&b[..k]);
            room -= k;
            Ok(k)
        });
        assert_eq!(n, Ok(4));
        assert!(!reply.sent());
        let n = reply.write(|b: &[u8]| -> Result<usize, ()> {
            wire.extend_from_slice(b);
            Ok(b.len())
        });
        assert_eq!(n, Ok(6));
        assert!(reply.sent());
        assert_eq!(wire, bytes);
        assert_eq!(reply.write(|_| Err(())), Ok(0), "nothing is left to write");

        let mut failing = Reply::new(vec![1, 2, 3]);
        assert_eq!(failing.write(|_| Err("reset")), Err("reset"));
        assert!(!failing.sent());
    }

    /// A request that arrives in pieces is whole at its last byte, and
    /// the bytes after it are left to the caller; bytes that are no
    /// request fail the connection; the deadline is the handshake's.
    #[test]
    fn a_request_in_pieces_then_the_rest_left_over() {
        let now = CoreInstant::from_micros(0);
        let mut acc = Accepting::new(Arc::new(ListenShared::default()), now);
        assert!(acc.deadline().is_some_and(|d| d > now));
        let mut request = b"MPA ID Req Frame".to_vec();
        request.extend([0x40, 1, 0, 2, b'h', b'i']);
        let (used, fed) = acc.feed(&request[..10], now);
        assert_eq!(used, 10);
        assert!(matches!(fed, Fed::More), "{fed:?}");
        let mut tail = request[10..].to_vec();
        tail.extend([0xaa; 5]);
        let (used, fed) = acc.feed(&tail, now);
        assert_eq!(used, request.len() - 10, "the rest is not the request's");
        let Fed::Request(req) = fed else {
            panic!("{fed:?}")
        };
        assert_eq!(req.private_data, b"hi");
        assert_eq!(acc.frame, request);

        let mut other = Accepting::new(Arc::new(ListenShared::default()), now);
        let (_, fed) = other.feed(b"GET / HTTP/1.1\r\n\r\nxxxx", now);
        assert!(matches!(fed, Fed::Failed(_)), "{fed:?}");

        let waiting = Accepting::new(Arc::new(ListenShared::default()), now);
        let deadline = waiting.deadline().unwrap();
        assert!(!waiting.expired(now));
        assert!(waiting.expired(deadline));
    }
}
