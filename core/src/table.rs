//! The ownership table's layout in Envoy shared data: block hash → owning pods (up to two),
//! bounded.
//!
//! Envoy's shared data has no delete, no expiry and no key listing, and every read is a host
//! call that copies the whole value into the VM (a few µs each in V8). So the table is a fixed
//! array of small keys, never more: memory stays flat however many distinct prompts arrive.
//! Each key is a *bucket* of two entries (a 2-way set-associative table): a block hashes to
//! one bucket and may sit in either way, so one read answers "who owns this block" and one
//! compare-and-swap write updates it — the two ways are always consistent with each other.
//! A new entry takes the way already holding the same (block, pod), else an empty way, else
//! replaces the *older* entry. So a block can have two owners at once, and a third replaces
//! the older of them. Entries carry the block hash itself, so a way that now holds another
//! block is simply a miss.
//!
//! Entry layout (little-endian): `block hash u64 | stamp u64 | generation u64 | pod address`.
//! The generation is the owning pod's cache generation when the entry was written (it changes
//! when the pod restarts or clears its cache), so a whole pod's entries expire at once without
//! listing keys. Bucket value: for each of the two ways a `u16` length (0 = empty) followed by
//! that many bytes of entry. An empty or malformed value is an empty bucket.

use crate::block::BlockHash;

/// Longest pod address accepted in an entry.
pub const MAX_POD_ADDR: usize = 255;

/// One decoded entry (one way of a bucket).
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

    /// `None` for empty or malformed values (treated as an empty way).
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

/// The two ways of one bucket.
pub type Bucket = [Option<Entry>; 2];

/// Encodes a bucket's value.
pub fn encode_bucket(b: &Bucket) -> Vec<u8> {
    let mut v = Vec::with_capacity(2 * (2 + HEADER + 16));
    for way in b {
        let e = way.as_ref().map(Entry::encode).unwrap_or_default();
        // an entry is at most HEADER + MAX_POD_ADDR bytes, well inside u16
        v.extend_from_slice(&(e.len() as u16).to_le_bytes());
        v.extend_from_slice(&e);
    }
    v
}

/// Decodes a bucket's value; empty or malformed values are an empty bucket, a malformed way
/// is an empty way.
pub fn decode_bucket(v: &[u8]) -> Bucket {
    let mut out: Bucket = [None, None];
    let mut rest = v;
    for way in &mut out {
        let Some((len, tail)) = rest.split_first_chunk::<2>() else {
            break;
        };
        let len = usize::from(u16::from_le_bytes(*len));
        let Some((entry, tail)) = tail.split_at_checked(len) else {
            return [None, None];
        };
        *way = Entry::decode(entry);
        rest = tail;
    }
    out
}

/// Addressing of a table of `capacity` entries (two per bucket) under a key namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableLayout {
    namespace: String,
    buckets: u64,
}

impl TableLayout {
    /// Room for `capacity` ≥ 1 entries under `namespace` (which should name the table's
    /// configuration, so a differently configured router never reads misaligned buckets).
    pub fn new(namespace: &str, capacity: u64) -> Self {
        TableLayout {
            namespace: format!("{namespace}/{capacity}/"),
            buckets: capacity.max(1).div_ceil(2),
        }
    }

    /// Number of buckets (shared-data keys) the table can ever use.
    pub fn buckets(&self) -> u64 {
        self.buckets
    }

    /// The bucket of `h`. Block hashes are XXH3 output, so the low bits are already uniform;
    /// the multiply only guards against a weak hash in tests.
    pub fn bucket(&self, h: BlockHash) -> u64 {
        h.0.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(32) % self.buckets
    }

    pub fn key(&self, bucket: u64) -> String {
        format!("{}{bucket}", self.namespace)
    }
}

/// Which way of its bucket records `pod` as an owner of `h`: the way already holding `h` for
/// `pod`, else an empty one, else the one with the older entry.
///
/// So a block can have two owners at once: when load sends a prompt to a second pod, that
/// pod is added and the first one stays known, and the router can choose between two warm
/// pods. A third owner replaces the older of the two.
pub fn pick_way(h: BlockHash, pod: &str, current: [Option<&Entry>; 2]) -> usize {
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
    fn buckets_in_range() {
        let t = TableLayout::new("ns", 100);
        assert_eq!(t.buckets(), 50);
        for i in 0..1000u64 {
            assert!(t.bucket(BlockHash(i.wrapping_mul(0x1234_5678_9abc_def1))) < 50);
        }
        assert_eq!(t.key(5), "ns/100/5");
        assert_eq!(TableLayout::new("ns", 0).buckets(), 1);
        assert_eq!(TableLayout::new("ns", 1).buckets(), 1);
        assert_eq!(TableLayout::new("ns", 3).buckets(), 2);
    }

    #[test]
    fn bucket_round_trip_and_garbage() {
        let full: Bucket = [Some(e(1, 2)), Some(e(3, 4))];
        assert_eq!(decode_bucket(&encode_bucket(&full)), full);
        let half: Bucket = [None, Some(e(3, 4))];
        assert_eq!(decode_bucket(&encode_bucket(&half)), half);
        assert_eq!(decode_bucket(b""), [None, None]);
        assert_eq!(decode_bucket(&encode_bucket(&[None, None])), [None, None]);
        // a length running past the end is a malformed value: empty bucket
        let mut cut = encode_bucket(&full);
        cut.truncate(cut.len() - 1);
        assert_eq!(decode_bucket(&cut)[0], None);
        assert_eq!(decode_bucket(&[0xff, 0xff, 1, 2, 3]), [None, None]);
        // golden: the exact bytes other implementations must agree on
        let one: Bucket = [
            Some(Entry {
                hash: BlockHash(0x0102),
                stamp: 3,
                generation: 4,
                pod: "p".into(),
            }),
            None,
        ];
        let mut want = vec![25, 0, 2, 1, 0, 0, 0, 0, 0, 0, 3];
        want.extend([0; 7]);
        want.push(4);
        want.extend([0; 7]);
        want.extend(b"p");
        want.extend([0, 0]);
        assert_eq!(encode_bucket(&one), want);
    }

    #[test]
    fn pick_prefers_same_then_empty_then_oldest() {
        let h = BlockHash(9);
        let p = "127.0.0.1:8001";
        assert_eq!(pick_way(h, p, [Some(&e(1, 5)), Some(&e(9, 1))]), 1);
        assert_eq!(pick_way(h, p, [Some(&e(1, 5)), None]), 1);
        assert_eq!(pick_way(h, p, [None, Some(&e(1, 5))]), 0);
        assert_eq!(pick_way(h, p, [Some(&e(1, 5)), Some(&e(2, 3))]), 1);
        assert_eq!(pick_way(h, p, [Some(&e(1, 2)), Some(&e(2, 3))]), 0);
        // another pod's entry for the same block is a second owner, not a replacement
        let other = Entry {
            pod: "127.0.0.1:8002".into(),
            ..e(9, 1)
        };
        assert_eq!(pick_way(h, p, [Some(&other), None]), 1);
        assert_eq!(pick_way(h, p, [Some(&other), Some(&e(9, 4))]), 1);
        // two other owners: the older one is replaced
        let third = Entry {
            pod: "127.0.0.1:8003".into(),
            ..e(9, 7)
        };
        assert_eq!(pick_way(h, p, [Some(&third), Some(&other)]), 1);
    }
}
