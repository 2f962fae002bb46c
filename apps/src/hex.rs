//! Hex strings for the command-line tools (private data on the command
//! line and in their output).

/// Lower-case hex digits of `b`, two per byte, no separators.
pub fn encode(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Bytes of a hex string (either case, no separators). The empty string
/// and `-` both mean no bytes.
pub fn decode(s: &str) -> Result<Vec<u8>, String> {
    if s == "-" {
        return Ok(Vec::new());
    }
    if !s.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits ({})", s.len()));
    }
    s.as_bytes()
        .chunks(2)
        .map(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .filter(|p| p.bytes().all(|c| c.is_ascii_hexdigit()))
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| format!("not a hex byte: {:?}", String::from_utf8_lossy(pair)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&all)).unwrap(), all);
        assert_eq!(encode(&[0x0a, 0xff]), "0aff");
        assert_eq!(decode("0AfF").unwrap(), [0x0a, 0xff]);
    }

    #[test]
    fn empty_and_invalid() {
        assert_eq!(decode("").unwrap(), Vec::<u8>::new());
        assert_eq!(decode("-").unwrap(), Vec::<u8>::new());
        assert!(decode("abc").is_err());
        assert!(decode("zz").is_err());
        assert!(decode("+1").is_err());
        assert!(decode("é1").is_err());
    }
}
