//! The flow table: (remote address, remote port, local port) → the
//! connection that owns the flow, looked up for every received frame.
//!
//! A peer chooses its own address and port, so the table hashes with a
//! key drawn per table ([`FlowHash`]): without the key a peer cannot aim
//! its flows at one bucket and turn lookups linear. The table is capped as
//! well: past [`FlowTable::capacity`] an insert is refused, and the stack
//! drops the SYN that asked for it (counted), so a flood cannot grow the
//! table without bound. Lookup, insert and removal take time independent
//! of the number of entries.

use std::collections::HashMap;
use std::hash::BuildHasher;

use crate::hash::FlowHash;
use crate::port::Flow;

/// Why [`FlowTable::insert`] refused an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InsertError {
    /// The table holds [`FlowTable::capacity`] flows.
    Full,
    /// The flow already has an owner.
    Exists,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct FlowTable<V, S = FlowHash> {
    map: HashMap<Flow, V, S>,
    capacity: usize,
}

impl<V> FlowTable<V> {
    /// An empty table for at most `capacity` flows, with a fresh key.
    pub(crate) fn new(capacity: usize) -> Self {
        Self::with_hasher(capacity, FlowHash::default())
    }
}

impl<V, S: BuildHasher> FlowTable<V, S> {
    /// An empty table hashing with `hasher`.
    pub(crate) fn with_hasher(capacity: usize, hasher: S) -> Self {
        Self {
            map: HashMap::with_hasher(hasher),
            capacity,
        }
    }

    /// The owner of `flow`.
    pub(crate) fn get(&self, flow: &Flow) -> Option<&V> {
        self.map.get(flow)
    }

    /// Give `flow` to `value`; refused when the flow has an owner or the
    /// table is full.
    pub(crate) fn insert(&mut self, flow: Flow, value: V) -> Result<(), InsertError> {
        if self.map.contains_key(&flow) {
            return Err(InsertError::Exists);
        }
        if self.map.len() >= self.capacity {
            return Err(InsertError::Full);
        }
        self.map.insert(flow, value);
        Ok(())
    }

    /// Take `flow` out; its owner, if it had one.
    pub(crate) fn remove(&mut self, flow: &Flow) -> Option<V> {
        let v = self.map.remove(flow);
        // A table that emptied after a burst gives its memory back.
        if self.map.capacity() > 64 && self.map.len() * 8 < self.map.capacity() {
            self.map.shrink_to(self.map.len() * 2);
        }
        v
    }

    /// Flows in the table.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// The most flows the table takes.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smoltcp::wire::Ipv4Address;
    use std::hash::{BuildHasherDefault, Hasher};

    fn flow(i: u32) -> Flow {
        (
            Ipv4Address::from_bits(0xc612_0000 | (i >> 16)),
            i as u16,
            7174,
        )
    }

    #[test]
    fn lookups_find_their_own_flow_only() {
        let mut t = FlowTable::new(10_000);
        for i in 0..5000 {
            t.insert(flow(i), i).unwrap();
        }
        assert_eq!(t.len(), 5000);
        for i in 0..5000 {
            assert_eq!(t.get(&flow(i)), Some(&i));
        }
        // The same ports on another local port, or swapped, are other flows.
        let (ip, rp, lp) = flow(7);
        assert_eq!(t.get(&(ip, lp, rp)), None);
        assert_eq!(t.get(&(ip, rp, lp + 1)), None);
        assert_eq!(t.insert(flow(7), 0), Err(InsertError::Exists));
        assert_eq!(
            t.get(&flow(7)),
            Some(&7),
            "a refused insert changes nothing"
        );
        assert_eq!(t.remove(&flow(7)), Some(7));
        assert_eq!(t.get(&flow(7)), None);
        assert_eq!(t.remove(&flow(7)), None);
    }

    /// Every flow in one bucket: the answers stay right.
    #[derive(Default)]
    struct Collide;
    impl Hasher for Collide {
        fn finish(&self) -> u64 {
            42
        }
        fn write(&mut self, _: &[u8]) {}
    }

    #[test]
    fn colliding_flows_stay_apart() {
        let mut t = FlowTable::with_hasher(1000, BuildHasherDefault::<Collide>::default());
        for i in 0..200 {
            t.insert(flow(i), i).unwrap();
        }
        for i in (0..200).step_by(2) {
            assert_eq!(t.remove(&flow(i)), Some(i));
        }
        for i in 0..200 {
            let want = (i % 2 == 1).then_some(i);
            assert_eq!(t.get(&flow(i)).copied(), want);
        }
    }

    #[test]
    fn capacity_refuses_past_the_limit_and_frees_on_removal() {
        let mut t = FlowTable::new(3);
        for i in 0..3 {
            t.insert(flow(i), ()).unwrap();
        }
        assert_eq!(t.insert(flow(3), ()), Err(InsertError::Full));
        assert_eq!(t.get(&flow(3)), None);
        assert_eq!(t.capacity(), 3);
        t.remove(&flow(0));
        t.insert(flow(3), ()).unwrap();
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn the_key_differs_per_table() {
        // Flows a peer picks to share a bucket in one table do not share
        // one in another: the same flows spread differently.
        let flows: Vec<Flow> = (0..64).map(flow).collect();
        let buckets =
            |h: &FlowHash| -> Vec<u64> { flows.iter().map(|f| h.hash_one(f) & 1023).collect() };
        let (a, b) = (FlowHash::default(), FlowHash::default());
        assert_ne!(buckets(&a), buckets(&b));
        assert_eq!(buckets(&a), buckets(&a.clone()));
    }

    #[test]
    fn removal_gives_memory_back() {
        let mut t = FlowTable::new(1 << 20);
        for i in 0..20_000 {
            t.insert(flow(i), i).unwrap();
        }
        let full = t.map.capacity();
        for i in 0..20_000 {
            t.remove(&flow(i));
        }
        assert!(
            t.map.capacity() * 16 < full,
            "{} of {full}",
            t.map.capacity()
        );
    }
}
