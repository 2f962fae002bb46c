//! Terminate error classification (RFC 5040 §7, RFC 5041 §7, RFC 5044 §8,
//! RFC 6581 §3).
//!
//! Every protocol violation the core detects maps to exactly one
//! [`TermCode`]: the layer that detected it, the error type within that
//! layer, and the error code. The values are the ones carried in the
//! Terminate Control field of a Terminate message.

use core::fmt;

/// The layer that detected an error (Terminate Control "Layer" nibble).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Layer {
    /// RDMAP (RFC 5040).
    Rdmap = 0,
    /// DDP (RFC 5041).
    Ddp = 1,
    /// The lower layer protocol: MPA over TCP (RFC 5044).
    Llp = 2,
}

impl Layer {
    /// The layer for a raw nibble, if it names one.
    pub fn from_raw(raw: u8) -> Option<Self> {
        match raw {
            0 => Some(Self::Rdmap),
            1 => Some(Self::Ddp),
            2 => Some(Self::Llp),
            _ => None,
        }
    }

    /// The layer's name: "RDMAP", "DDP" or "LLP".
    pub fn name(self) -> &'static str {
        match self {
            Self::Rdmap => "RDMAP",
            Self::Ddp => "DDP",
            Self::Llp => "LLP",
        }
    }
}

/// A Terminate error: layer, error type and error code.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TermCode {
    /// The layer that detected the error.
    pub layer: Layer,
    /// The error type within that layer (4 bits).
    pub etype: u8,
    /// The error code (8 bits).
    pub code: u8,
}

impl TermCode {
    const fn new(layer: Layer, etype: u8, code: u8) -> Self {
        Self { layer, etype, code }
    }

    /// A human-readable name of the error, as the RFCs name it.
    pub fn name(self) -> &'static str {
        use self::codes::*;
        match self {
            RDMAP_INVALID_STAG => "RDMAP: invalid STag",
            RDMAP_BASE_BOUNDS => "RDMAP: base or bounds violation",
            RDMAP_ACCESS_RIGHTS => "RDMAP: access rights violation",
            RDMAP_STAG_NOT_ASSOC => "RDMAP: STag not associated with RDMAP stream",
            RDMAP_TO_WRAP => "RDMAP: TO wrap",
            RDMAP_CANNOT_INVALIDATE_PROT => "RDMAP: STag cannot be invalidated",
            RDMAP_INVALID_VERSION => "RDMAP: invalid RDMAP version",
            RDMAP_UNEXPECTED_OPCODE => "RDMAP: unexpected opcode",
            RDMAP_CATASTROPHIC_STREAM => "RDMAP: catastrophic error, localized to RDMAP stream",
            RDMAP_CATASTROPHIC_GLOBAL => "RDMAP: catastrophic error, global",
            RDMAP_CANNOT_INVALIDATE_OP => "RDMAP: STag cannot be invalidated",
            RDMAP_UNSPECIFIED_OP => "RDMAP: unspecified remote operation error",
            RDMAP_LOCAL_CATASTROPHIC => "RDMAP: local catastrophic error",
            DDP_LOCAL_CATASTROPHIC => "DDP: local catastrophic error",
            DDP_T_INVALID_STAG => "DDP: tagged buffer, invalid STag",
            DDP_T_BASE_BOUNDS => "DDP: tagged buffer, base or bounds violation",
            DDP_T_STAG_NOT_ASSOC => "DDP: tagged buffer, STag not associated with DDP stream",
            DDP_T_TO_WRAP => "DDP: tagged buffer, TO wrap",
            DDP_T_INVALID_VERSION => "DDP: tagged buffer, invalid DDP version",
            DDP_U_INVALID_QN => "DDP: untagged buffer, invalid QN",
            DDP_U_INVALID_MSN_NO_BUFFER => {
                "DDP: untagged buffer, invalid MSN - no buffer available"
            }
            DDP_U_INVALID_MSN_RANGE => "DDP: untagged buffer, invalid MSN - MSN range",
            DDP_U_INVALID_MO => "DDP: untagged buffer, invalid MO",
            DDP_U_MSG_TOO_LONG => "DDP: untagged buffer, DDP message too long",
            DDP_U_INVALID_VERSION => "DDP: untagged buffer, invalid DDP version",
            MPA_TCP_CONNECTION => "MPA: TCP connection error",
            MPA_CRC => "MPA: CRC error",
            MPA_MARKER => "MPA: marker and ULPDU length field mismatch",
            MPA_INVALID_REQ_REP => "MPA: invalid MPA request or reply frame",
            MPA_LOCAL_CATASTROPHIC => "MPA: local catastrophic error",
            MPA_INSUFFICIENT_IRD => "MPA: insufficient IRD resources",
            MPA_NO_MATCHING_RTR => "MPA: no matching RTR model",
            _ => "unknown error",
        }
    }

    /// The three fields packed as in the first 16 bits of the Terminate
    /// Control field: layer (4), etype (4), code (8).
    pub fn to_bits(self) -> u16 {
        (u16::from(self.layer as u8) << 12)
            | (u16::from(self.etype & 0xf) << 8)
            | u16::from(self.code)
    }

    /// Unpack 16 bits of a Terminate Control field; `None` for an unknown layer.
    pub fn from_bits(bits: u16) -> Option<Self> {
        let layer = Layer::from_raw((bits >> 12) as u8)?;
        Some(Self::new(layer, ((bits >> 8) & 0xf) as u8, bits as u8))
    }
}

impl fmt::Debug for TermCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TermCode({:?}/{}/{:#04x} \"{}\")",
            self.layer,
            self.etype,
            self.code,
            self.name()
        )
    }
}

impl fmt::Display for TermCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl core::error::Error for TermCode {}

/// Error types within each layer.
pub mod etype {
    /// RDMAP: local catastrophic error.
    pub const RDMAP_LOCAL_CATASTROPHIC: u8 = 0;
    /// RDMAP: remote protection error.
    pub const RDMAP_REMOTE_PROTECTION: u8 = 1;
    /// RDMAP: remote operation error.
    pub const RDMAP_REMOTE_OPERATION: u8 = 2;
    /// DDP: local catastrophic error.
    pub const DDP_LOCAL_CATASTROPHIC: u8 = 0;
    /// DDP: tagged buffer error.
    pub const DDP_TAGGED: u8 = 1;
    /// DDP: untagged buffer error.
    pub const DDP_UNTAGGED: u8 = 2;
    /// LLP: MPA error.
    pub const LLP_MPA: u8 = 0;
}

/// Every Terminate code the core generates or recognises.
pub mod codes {
    use super::etype;
    use super::{Layer, TermCode};

    macro_rules! code {
        ($(#[$m:meta])* $name:ident = $layer:ident, $etype:expr, $code:expr) => {
            $(#[$m])*
            pub const $name: TermCode = TermCode::new(Layer::$layer, $etype, $code);
        };
    }

    code!(/// RDMAP local catastrophic error.
        RDMAP_LOCAL_CATASTROPHIC = Rdmap, etype::RDMAP_LOCAL_CATASTROPHIC, 0x00);
    code!(/// Invalid STag.
        RDMAP_INVALID_STAG = Rdmap, etype::RDMAP_REMOTE_PROTECTION, 0x00);
    code!(/// Base or bounds violation.
        RDMAP_BASE_BOUNDS = Rdmap, etype::RDMAP_REMOTE_PROTECTION, 0x01);
    code!(/// Access rights violation.
        RDMAP_ACCESS_RIGHTS = Rdmap, etype::RDMAP_REMOTE_PROTECTION, 0x02);
    code!(/// STag not associated with RDMAP stream (e.g. wrong PD).
        RDMAP_STAG_NOT_ASSOC = Rdmap, etype::RDMAP_REMOTE_PROTECTION, 0x03);
    code!(/// TO wrap.
        RDMAP_TO_WRAP = Rdmap, etype::RDMAP_REMOTE_PROTECTION, 0x04);
    code!(/// STag cannot be invalidated (protection error type).
        RDMAP_CANNOT_INVALIDATE_PROT = Rdmap, etype::RDMAP_REMOTE_PROTECTION, 0x09);
    code!(/// Invalid RDMAP version.
        RDMAP_INVALID_VERSION = Rdmap, etype::RDMAP_REMOTE_OPERATION, 0x05);
    code!(/// Unexpected opcode.
        RDMAP_UNEXPECTED_OPCODE = Rdmap, etype::RDMAP_REMOTE_OPERATION, 0x06);
    code!(/// Catastrophic error, localized to RDMAP stream.
        RDMAP_CATASTROPHIC_STREAM = Rdmap, etype::RDMAP_REMOTE_OPERATION, 0x07);
    code!(/// Catastrophic error, global.
        RDMAP_CATASTROPHIC_GLOBAL = Rdmap, etype::RDMAP_REMOTE_OPERATION, 0x08);
    code!(/// STag cannot be invalidated (operation error type).
        RDMAP_CANNOT_INVALIDATE_OP = Rdmap, etype::RDMAP_REMOTE_OPERATION, 0x09);
    code!(/// Unspecified remote operation error.
        RDMAP_UNSPECIFIED_OP = Rdmap, etype::RDMAP_REMOTE_OPERATION, 0xff);

    code!(/// DDP local catastrophic error.
        DDP_LOCAL_CATASTROPHIC = Ddp, etype::DDP_LOCAL_CATASTROPHIC, 0x00);
    code!(/// Tagged buffer: invalid STag.
        DDP_T_INVALID_STAG = Ddp, etype::DDP_TAGGED, 0x00);
    code!(/// Tagged buffer: base or bounds violation.
        DDP_T_BASE_BOUNDS = Ddp, etype::DDP_TAGGED, 0x01);
    code!(/// Tagged buffer: STag not associated with DDP stream.
        DDP_T_STAG_NOT_ASSOC = Ddp, etype::DDP_TAGGED, 0x02);
    code!(/// Tagged buffer: TO wrap.
        DDP_T_TO_WRAP = Ddp, etype::DDP_TAGGED, 0x03);
    code!(/// Tagged buffer: invalid DDP version.
        DDP_T_INVALID_VERSION = Ddp, etype::DDP_TAGGED, 0x04);
    code!(/// Untagged buffer: invalid QN.
        DDP_U_INVALID_QN = Ddp, etype::DDP_UNTAGGED, 0x01);
    code!(/// Untagged buffer: invalid MSN, no buffer available.
        DDP_U_INVALID_MSN_NO_BUFFER = Ddp, etype::DDP_UNTAGGED, 0x02);
    code!(/// Untagged buffer: invalid MSN, MSN range.
        DDP_U_INVALID_MSN_RANGE = Ddp, etype::DDP_UNTAGGED, 0x03);
    code!(/// Untagged buffer: invalid MO.
        DDP_U_INVALID_MO = Ddp, etype::DDP_UNTAGGED, 0x04);
    code!(/// Untagged buffer: DDP message too long for the buffer.
        DDP_U_MSG_TOO_LONG = Ddp, etype::DDP_UNTAGGED, 0x05);
    code!(/// Untagged buffer: invalid DDP version.
        DDP_U_INVALID_VERSION = Ddp, etype::DDP_UNTAGGED, 0x06);

    code!(/// MPA: TCP connection error (the stream was lost).
        MPA_TCP_CONNECTION = Llp, etype::LLP_MPA, 0x01);
    code!(/// MPA: CRC error.
        MPA_CRC = Llp, etype::LLP_MPA, 0x02);
    code!(/// MPA: marker and ULPDU length field mismatch.
        MPA_MARKER = Llp, etype::LLP_MPA, 0x03);
    code!(/// MPA: invalid MPA request or reply frame.
        MPA_INVALID_REQ_REP = Llp, etype::LLP_MPA, 0x04);
    code!(/// MPA (RFC 6581): local catastrophic error.
        MPA_LOCAL_CATASTROPHIC = Llp, etype::LLP_MPA, 0x05);
    code!(/// MPA (RFC 6581): insufficient IRD resources.
        MPA_INSUFFICIENT_IRD = Llp, etype::LLP_MPA, 0x06);
    code!(/// MPA (RFC 6581): no matching RTR model.
        MPA_NO_MATCHING_RTR = Llp, etype::LLP_MPA, 0x07);
}

#[cfg(test)]
mod tests {
    use super::codes::*;
    use super::*;

    #[test]
    fn bits_round_trip() {
        for c in [
            RDMAP_INVALID_STAG,
            DDP_U_INVALID_MSN_RANGE,
            MPA_CRC,
            RDMAP_UNSPECIFIED_OP,
        ] {
            assert_eq!(TermCode::from_bits(c.to_bits()), Some(c));
        }
        assert_eq!(MPA_CRC.to_bits(), 0x2002);
        assert_eq!(DDP_U_INVALID_MSN_RANGE.to_bits(), 0x1203);
        assert_eq!(TermCode::from_bits(0x3000), None);
    }
}
