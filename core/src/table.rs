//! The ownership table's layout in Envoy shared data: block hash → owning pods (up to two),
//! bounded.
//!
//! Envoy's shared data has no delete, no expiry and no key listing, and every read copies the
//! whole value. So the table is a fixed array of `capacity` small keys (slots), never more:
//! memory stays flat however many distinct prompts arrive. Each block hash has two candidate
//! slots (two independent hash functions); a block is found in either, and a new block takes
//! an empty candidate or else replaces the *older* of the two entries. Values carry the block
//! hash itself, so a slot that now holds another block is simply a miss.
//!
//! Value layout (little-endian): `block hash u64 | stamp u64 | generation u64 | pod address`.
//! The generation is the owning pod's cache generation when the entry was written (it changes
//! when the pod restarts or clears its cache), so a whole pod's entries expire at once without
//! listing keys. An empty value is an empty slot.

use crate::block::BlockHash;

/// Longest pod address accepted in a slot value.
pub const MAX_POD_ADDR: usize = 255;

/// One decoded slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub hash: BlockHash,
    /// When the entry was written (router clock, nanoseconds); older entries are replaced first.
    pub stamp: u64,
    /// The pod's cache generation when written.
    pub generation: u64,
    pub pod: String,
}

const HEADER: usize = 24;

impl Entry {
    pub fn encode(&self) -> Vec<u8> {
        let pod = self.pod.as_bytes();
        let pod = &pod[..pod.len().min(MAX_POD_ADDR)];
        let mut v = Vec::with_capacity(HEADER + pod.len());
        v.extend_from_slice(&self.hash.0.to_le_bytes());
        v.extend_from_slice(&self.stamp.to_le_bytes());
        v.extend_from_slice(&self.generation.to_le_bytes());
        v.extend_from_slice(pod);
        v
    }

    /// `None` for empty or malformed values (treated as an empty slot).
    pub fn decode(v: &[u8]) -> Option<Entry> {
        if v.len() <= HEADER || v.len() > HEADER + MAX_POD_ADDR {
            return None;
        }
        let word = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(v.get(i..i + 8)?.try_into().ok()?))
        };
        let pod = std::str::from_utf8(v.get(HEADER..)?).ok()?.to_owned();
        Some(Entry {
            hash: BlockHash(word(0)?),
            stamp: word(8)?,
            generation: word(16)?,
            pod,
        })
    }
}

/// Addressing of a table with a fixed number of slots under a key namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableLayout {
    namespace: String,
    capacity: u64,
}

impl TableLayout {
    /// `capacity` ≥ 1 slots under `namespace` (which should name the table's configuration,
    /// so a differently configured router never reads misaligned slots).
    pub fn new(namespace: &str, capacity: u64) -> Self {
        TableLayout {
            namespace: format!("{namespace}/{capacity}/"),
            capacity: capacity.max(1),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The two candidate slots of `h` (equal only when capacity is 1 or by coincidence).
    pub fn slots(&self, h: BlockHash) -> [u64; 2] {
        let a = h.0 % self.capacity;
        let b = h.0.rotate_left(32).wrapping_mul(0x9E37_79B9_7F4A_7C15) % self.capacity;
        [a, b]
    }

    pub fn key(&self, slot: u64) -> String {
        format!("{}{slot}", self.namespace)
    }
}

/// Where to record `pod` as an owner of `h`: the candidate already holding `h` for `pod`, else
/// an empty one, else the one with the older entry. `current` holds the decoded candidates in
/// slot order.
///
/// So a block can have two owners at once (one per candidate slot): when load sends a prompt
/// to a second pod, that pod is added and the first one stays known, and the router can
/// choose between two warm pods. A third owner replaces the older of the two.
pub fn pick_slot(h: BlockHash, pod: &str, current: [Option<&Entry>; 2]) -> usize {
    if let Some(i) = current
        .iter()
        .position(|e| e.is_some_and(|e| e.hash == h && e.pod == pod))
    {
        return i;
    }
    if let Some(i) = current.iter().position(Option::is_none) {
        return i;
    }
    match current {
        [Some(a), Some(b)] if b.stamp < a.stamp => 1,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(h: u64, stamp: u64) -> Entry {
        Entry {
            hash: BlockHash(h),
            stamp,
            generation: 3,
            pod: "127.0.0.1:8001".into(),
        }
    }

    #[test]
    fn encode_round_trip_and_garbage() {
        let x = e(42, 7);
        assert_eq!(Entry::decode(&x.encode()), Some(x));
        assert_eq!(Entry::decode(b""), None);
        assert_eq!(Entry::decode(&[0u8; 24]), None);
        let mut bad = e(1, 1).encode();
        bad.push(0xff);
        assert_eq!(Entry::decode(&bad), None);
    }

    #[test]
    fn slots_in_range() {
        let t = TableLayout::new("ns", 100);
        for i in 0..1000u64 {
            let [a, b] = t.slots(BlockHash(i.wrapping_mul(0x1234_5678_9abc_def1)));
            assert!(a < 100 && b < 100);
        }
        assert_eq!(t.key(5), "ns/100/5");
        assert_eq!(TableLayout::new("ns", 0).capacity(), 1);
    }

    #[test]
    fn pick_prefers_same_then_empty_then_oldest() {
        let h = BlockHash(9);
        let p = "127.0.0.1:8001";
        assert_eq!(pick_slot(h, p, [Some(&e(1, 5)), Some(&e(9, 1))]), 1);
        assert_eq!(pick_slot(h, p, [Some(&e(1, 5)), None]), 1);
        assert_eq!(pick_slot(h, p, [None, Some(&e(1, 5))]), 0);
        assert_eq!(pick_slot(h, p, [Some(&e(1, 5)), Some(&e(2, 3))]), 1);
        assert_eq!(pick_slot(h, p, [Some(&e(1, 2)), Some(&e(2, 3))]), 0);
        // another pod's entry for the same block is a second owner, not a replacement
        let other = Entry {
            pod: "127.0.0.1:8002".into(),
            ..e(9, 1)
        };
        assert_eq!(pick_slot(h, p, [Some(&other), None]), 1);
        assert_eq!(pick_slot(h, p, [Some(&other), Some(&e(9, 4))]), 1);
        // two other owners: the older one is replaced
        let third = Entry {
            pod: "127.0.0.1:8003".into(),
            ..e(9, 7)
        };
        assert_eq!(pick_slot(h, p, [Some(&third), Some(&other)]), 1);
    }
}
