//! (filled in by the wire-format change)
