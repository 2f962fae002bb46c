//! (filled in by the handshake change)
