//! Hashing for the tables looked up on every frame and every pass.
//!
//! std's SipHash costs tens of nanoseconds per lookup, paid per frame by
//! the flow table and by the device wrapper's tables, which need no
//! cryptographic hash. Flows carry the peer's address and port, which a
//! peer chooses, so [`FlowHash`], a multiply-and-fold hash, is keyed per
//! table (random initial state and multiplier): without the key a peer
//! cannot aim its connections at one bucket. (The tables are capped as
//! well.)

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// The 64-bit golden-ratio multiplier (Fibonacci hashing).
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// Keyed hashing for flows (see the module documentation): each table
/// draws its own initial state and multiplier.
#[derive(Clone, Debug)]
pub(crate) struct FlowHash {
    seed: u64,
    key: u64,
}

impl Default for FlowHash {
    fn default() -> Self {
        // std seeds every RandomState from the OS once per thread and
        // varies it per instance; hashing constants with it yields fresh
        // random words.
        let r = RandomState::new();
        Self {
            seed: r.hash_one(GOLDEN),
            // Odd, and never a small number.
            key: r.hash_one(!GOLDEN) | (1 << 63) | 1,
        }
    }
}

impl BuildHasher for FlowHash {
    type Hasher = FoldHasher;

    fn build_hasher(&self) -> FoldHasher {
        FoldHasher {
            state: self.seed,
            key: self.key,
        }
    }
}

/// Each word written is mixed in by a folded 64×64→128-bit multiply by
/// the table's key (the high and low halves XORed), which spreads every
/// input bit over the whole result.
pub(crate) struct FoldHasher {
    state: u64,
    key: u64,
}

impl FoldHasher {
    fn mix(&mut self, word: u64) {
        let p = u128::from(self.state ^ word) * u128::from(self.key);
        self.state = (p as u64) ^ ((p >> 64) as u64);
    }
}

impl Hasher for FoldHasher {
    fn finish(&self) -> u64 {
        self.state
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            // The length keeps "ab" and "ab\0" apart.
            self.mix(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.mix(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.mix(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.mix(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::wire::Ipv4Address;
    use std::collections::HashSet;

    type Flow = (Ipv4Address, u16, u16);

    fn hash(b: &FlowHash, f: Flow) -> u64 {
        b.hash_one(f)
    }

    #[test]
    fn flows_differing_in_one_field_hash_apart() {
        let b = FlowHash::default();
        let base = (Ipv4Address::new(198, 18, 0, 1), 40000, 7174);
        let mut seen = HashSet::new();
        seen.insert(hash(&b, base));
        for i in 1..=1000u16 {
            assert!(seen.insert(hash(&b, (base.0, base.1.wrapping_add(i), base.2))));
            assert!(seen.insert(hash(&b, (base.0, base.1, base.2.wrapping_add(i)))));
            let ip = Ipv4Address::from_bits(base.0.to_bits() + u32::from(i));
            assert!(seen.insert(hash(&b, (ip, base.1, base.2))));
        }
        // Ports swapped are another flow.
        assert_ne!(hash(&b, base), hash(&b, (base.0, base.2, base.1)));
    }

    #[test]
    fn tables_are_seeded_apart() {
        let f = (Ipv4Address::new(198, 18, 0, 1), 40000, 7174);
        let seeds: HashSet<u64> = (0..8).map(|_| hash(&FlowHash::default(), f)).collect();
        assert_eq!(seeds.len(), 8, "each table draws its own seed");
        let b = FlowHash::default();
        assert_eq!(hash(&b, f), hash(&b.clone(), f), "one table hashes alike");
    }

    #[test]
    fn byte_strings_of_different_length_differ() {
        let b = FlowHash::default();
        assert_ne!(b.hash_one(&b"ab"[..]), b.hash_one(&b"ab\0"[..]));
        assert_ne!(b.hash_one(&[0u8; 8][..]), b.hash_one(&[0u8; 16][..]));
    }
}
