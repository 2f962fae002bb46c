//! (filled in by the framing change)
