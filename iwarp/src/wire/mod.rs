//! Wire formats: zero-copy views and high-level representations.
//!
//! Two levels, as in smoltcp:
//!
//! * `Packet<T: AsRef<[u8]>>`-style views wrap a buffer. Construct them
//!   with `new_checked` on untrusted input; after that no accessor panics.
//! * `Repr` types are the checked, high-level form with `parse`, `emit` and
//!   `buffer_len`. `emit` writes into a caller-supplied buffer of at least
//!   `buffer_len()` bytes.
//!
//! Parsing untrusted bytes never panics; it returns [`Error`].

pub mod ddp;
pub mod marker;
pub mod mpa;
pub mod rdmap;
pub mod terminate;

use core::fmt;

/// Why bytes did not parse. Parsers return it for any input, never
/// panic; the protocol core turns it into the Terminate error its layer
/// assigns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The buffer is shorter than the format requires.
    Truncated,
    /// A field holds a value the format does not allow.
    Malformed,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated => f.write_str("truncated"),
            Self::Malformed => f.write_str("malformed"),
        }
    }
}

impl core::error::Error for Error {}

/// The result of a parse: the value, or the [`Error`] that stopped it.
pub type Result<T> = core::result::Result<T, Error>;
