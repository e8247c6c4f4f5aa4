//! The ownership table's layout in Envoy shared data: block hash → owning pods (up to
//! [`WAYS`]), bounded.
//!
//! Envoy's shared data has no delete, no expiry and no key listing, and every read is a host
//! call that copies the whole value into the VM (a few µs each in V8). So the table is a fixed
//! array of small keys, never more: memory stays flat however many distinct prompts arrive.
//! Each key is a *bucket* of [`WAYS`] entries (a set-associative table): a block hashes to
//! one bucket and may sit in any of its ways, so one read answers "who owns this block" and
//! one compare-and-swap write updates it — the ways are always consistent with each other.
//! A new entry takes the way already holding the same (block, pod), else an empty way, else
//! replaces the *oldest* entry. So a block can have up to four owners at once (a hot prefix
//! spilled over the pods its load needs), and a fifth replaces the oldest.
//! Entries carry the block hash itself, so a way that now holds another block is simply a
//! miss.
//!
//! Entry layout (little-endian): `block hash u64 | stamp u64 | generation u64 | pod address`.
//! The generation is the owning pod's cache generation when the entry was written (it changes
//! when the pod restarts or clears its cache), so a whole pod's entries expire at once without
//! listing keys. Bucket value: for each way a `u16` length (0 = empty) followed by that many
//! bytes of entry; ways missing at the end are empty. An empty or malformed value is an
//! empty bucket.

use crate::block::BlockHash;

/// Entries per bucket: the most owners one block can have.
pub const WAYS: usize = 4;

/// Longest pod address accepted in an entry.
pub const MAX_POD_ADDR: usize = 255;

/// One decoded entry (one way of a bucket).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub hash: BlockHash,
    /// From when the pod holds the block (router clock, nanoseconds): when the entry was
    /// written, or — when the router sent the pod a prompt it still had to compute — when that
    /// prefill is predicted to end (brought forward when the pod's answer starts sooner).
    /// Lookups skip entries not yet ready; older entries are replaced first.
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

/// The ways of one bucket.
pub type Bucket = [Option<Entry>; WAYS];

/// An empty bucket.
pub const EMPTY: Bucket = [const { None }; WAYS];

/// Encodes a bucket's value.
pub fn encode_bucket(b: &Bucket) -> Vec<u8> {
    let mut v = Vec::with_capacity(WAYS * (2 + HEADER + 16));
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
    let mut out: Bucket = EMPTY;
    let mut rest = v;
    for way in &mut out {
        let Some((len, tail)) = rest.split_first_chunk::<2>() else {
            break;
        };
        let len = usize::from(u16::from_le_bytes(*len));
        let Some((entry, tail)) = tail.split_at_checked(len) else {
            return EMPTY;
        };
        *way = Entry::decode(entry);
        rest = tail;
    }
    out
}

/// Addressing of a table of `capacity` entries ([`WAYS`] per bucket) under a key namespace.
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
            buckets: capacity.max(1).div_ceil(WAYS as u64),
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
/// `pod`, else an empty one, else the one with the oldest entry (the first of equals).
///
/// So a block can have several owners at once: when load sends a prompt to another pod, that
/// pod is added and the earlier ones stay known, and the router can choose among warm pods.
/// An owner beyond [`WAYS`] replaces the oldest.
pub fn pick_way(h: BlockHash, pod: &str, current: &Bucket) -> usize {
    if let Some(i) = current
        .iter()
        .position(|e| e.as_ref().is_some_and(|e| e.hash == h && e.pod == pod))
    {
        return i;
    }
    if let Some(i) = current.iter().position(Option::is_none) {
        return i;
    }
    current
        .iter()
        .enumerate()
        .min_by_key(|(i, e)| (e.as_ref().map_or(0, |e| e.stamp), *i))
        .map_or(0, |(i, _)| i)
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
        assert_eq!(t.buckets(), 25);
        for i in 0..1000u64 {
            assert!(t.bucket(BlockHash(i.wrapping_mul(0x1234_5678_9abc_def1))) < 25);
        }
        assert_eq!(t.key(5), "ns/100/5");
        assert_eq!(TableLayout::new("ns", 0).buckets(), 1);
        assert_eq!(TableLayout::new("ns", 1).buckets(), 1);
        assert_eq!(TableLayout::new("ns", 5).buckets(), 2);
    }

    #[test]
    fn bucket_round_trip_and_garbage() {
        let full: Bucket = [Some(e(1, 2)), Some(e(3, 4)), Some(e(5, 6)), Some(e(7, 8))];
        assert_eq!(decode_bucket(&encode_bucket(&full)), full);
        let half: Bucket = [None, Some(e(3, 4)), None, Some(e(5, 1))];
        assert_eq!(decode_bucket(&encode_bucket(&half)), half);
        assert_eq!(decode_bucket(b""), EMPTY);
        assert_eq!(decode_bucket(&encode_bucket(&EMPTY)), EMPTY);
        // a length running past the end is a malformed value: empty bucket
        let mut cut = encode_bucket(&full);
        cut.truncate(cut.len() - 1);
        assert_eq!(decode_bucket(&cut)[0], None);
        assert_eq!(decode_bucket(&[0xff, 0xff, 1, 2, 3]), EMPTY);
        // a value with fewer ways (ways missing at the end are empty)
        let two = [encode_bucket(&full)[..2 * (2 + 24 + 14)].to_vec()].concat();
        assert_eq!(
            decode_bucket(&two),
            [Some(e(1, 2)), Some(e(3, 4)), None, None]
        );
        // golden: the exact bytes other implementations must agree on
        let one: Bucket = [
            Some(Entry {
                hash: BlockHash(0x0102),
                stamp: 3,
                generation: 4,
                pod: "p".into(),
            }),
            None,
            None,
            None,
        ];
        let mut want = vec![25, 0, 2, 1, 0, 0, 0, 0, 0, 0, 3];
        want.extend([0; 7]);
        want.push(4);
        want.extend([0; 7]);
        want.extend(b"p");
        want.extend([0; 2 * (WAYS - 1)]);
        assert_eq!(encode_bucket(&one), want);
    }

    #[test]
    fn pick_prefers_same_then_empty_then_oldest() {
        let h = BlockHash(9);
        let p = "127.0.0.1:8001";
        let b = |ways: [Option<Entry>; WAYS]| ways;
        let full = |a, b_, c, d| b([Some(a), Some(b_), Some(c), Some(d)]);
        assert_eq!(pick_way(h, p, &full(e(1, 5), e(9, 1), e(2, 0), e(3, 0))), 1);
        assert_eq!(pick_way(h, p, &b([Some(e(1, 5)), None, None, None])), 1);
        assert_eq!(
            pick_way(
                h,
                p,
                &b([Some(e(1, 5)), Some(e(2, 5)), None, Some(e(3, 1))])
            ),
            2
        );
        assert_eq!(pick_way(h, p, &full(e(1, 5), e(2, 3), e(3, 4), e(4, 6))), 1);
        assert_eq!(pick_way(h, p, &full(e(1, 2), e(2, 3), e(3, 2), e(4, 9))), 0);
        // other pods' entries for the same block are more owners, not replacements
        let owner = |port: u16, stamp: u64| Entry {
            pod: format!("127.0.0.1:{port}"),
            ..e(9, stamp)
        };
        assert_eq!(
            pick_way(h, p, &b([Some(owner(8002, 1)), None, None, None])),
            1
        );
        assert_eq!(
            pick_way(
                h,
                p,
                &full(owner(8002, 1), owner(8003, 2), owner(8004, 0), e(9, 4))
            ),
            3
        );
        // four other owners: the oldest is replaced
        assert_eq!(
            pick_way(
                h,
                p,
                &full(
                    owner(8002, 7),
                    owner(8003, 2),
                    owner(8004, 5),
                    owner(8005, 3)
                )
            ),
            1
        );
    }
}
