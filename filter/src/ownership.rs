//! The ownership table in Envoy shared data: which pod computed which block.
//!
//! Layout and replacement rules live in `prefix_core::table`; this is the thin part that
//! reads and writes buckets through [`Store`], with compare-and-swap so Envoy's worker
//! threads never lose each other's updates silently.
//!
//! Host calls dominate the routing cost after tokenizing (each copies a value across the VM
//! boundary), so one `OwnershipTable` lives for one routing decision and remembers the buckets
//! it has read: the lookup's reads are reused when the same prompt's blocks are recorded, and
//! a write that loses a race to another worker re-reads and retries once.

use crate::host::{SetOutcome, Store};
use prefix_core::table::{
    decode_bucket, encode_bucket, pick_way, Bucket, Entry, TableLayout, EMPTY,
};
use prefix_core::BlockHash;
use std::cell::RefCell;
use std::collections::HashMap;

/// What recording a prompt's blocks did to the table.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecordStats {
    pub written: u32,
    /// Entries that held another block and were overwritten (capacity pressure).
    pub replaced: u32,
    /// Ways that were empty before.
    pub filled: u32,
    /// Writes lost to concurrent writers (CAS mismatch twice) or a host failure.
    pub conflicts: u32,
}

/// A bucket as last read: its ways and the CAS token of that read.
type Read = (Bucket, Option<u32>);

pub struct OwnershipTable<'a, H: Store> {
    host: &'a H,
    layout: &'a TableLayout,
    /// Buckets read during this decision (bucket index → contents and CAS).
    seen: RefCell<HashMap<u64, Read>>,
}

impl<'a, H: Store> OwnershipTable<'a, H> {
    pub fn new(host: &'a H, layout: &'a TableLayout) -> Self {
        OwnershipTable {
            host,
            layout,
            seen: RefCell::new(HashMap::new()),
        }
    }

    fn fetch(&self, b: u64) -> Read {
        let read = match self.host.shared_get(&self.layout.key(b)) {
            Some((v, cas)) => (decode_bucket(&v), cas),
            None => (EMPTY, None),
        };
        self.seen.borrow_mut().insert(b, read.clone());
        read
    }

    /// The bucket as this table last saw it (reading it on first use).
    fn read(&self, b: u64) -> Read {
        let seen = self.seen.borrow().get(&b).cloned();
        seen.unwrap_or_else(|| self.fetch(b))
    }

    /// Writes `bucket` if nobody changed it since `cas`; forgets the cached copy either way
    /// (a successful write gets a new CAS token this table does not know).
    fn write(&self, b: u64, bucket: &Bucket, cas: Option<u32>) -> SetOutcome {
        self.seen.borrow_mut().remove(&b);
        self.host
            .shared_set(&self.layout.key(b), &encode_bucket(bucket), cas)
    }

    /// The entries for `h` (owning pods and their generations then): at most
    /// [`prefix_core::table::WAYS`].
    pub fn owners(&self, h: BlockHash) -> Bucket {
        let (ways, _) = self.read(self.layout.bucket(h));
        ways.map(|e| e.filter(|e| e.hash == h))
    }

    /// The most recently recorded entry for `h`, if any.
    #[cfg(test)]
    pub fn owner(&self, h: BlockHash) -> Option<Entry> {
        self.owners(h).into_iter().flatten().max_by_key(|e| e.stamp)
    }

    /// Forgets blocks `pod` no longer holds (entries now owned by another pod are kept).
    pub fn remove(&self, hashes: &[BlockHash], pod: &str) -> u32 {
        let mut removed = 0;
        for &h in hashes {
            let b = self.layout.bucket(h);
            for _attempt in 0..2 {
                let (mut ways, cas) = self.fetch(b);
                let mut gone = 0;
                for way in &mut ways {
                    if way.as_ref().is_some_and(|e| e.hash == h && e.pod == pod) {
                        *way = None;
                        gone += 1;
                    }
                }
                if gone == 0 {
                    break;
                }
                if self.write(b, &ways, cas) == SetOutcome::Written {
                    removed += gone;
                    break;
                }
            }
        }
        removed
    }

    /// Records `pod` (at cache `generation`) as an owner of every block in `hashes`, from
    /// now on, or from `ready_at` (router clock, ns) if given: the time its prefill of those
    /// blocks is predicted to end. Until then lookups do not count the pod as an owner, so
    /// requests sent meanwhile do not pile onto a pod that is still computing the prefix
    /// (they would compute it again there: nothing is cached yet). An entry already there
    /// becomes ready at the earlier of the two times (the pod's own `BlockStored` makes a
    /// pending entry ready at once).
    pub fn record(
        &self,
        hashes: &[BlockHash],
        pod: &str,
        generation: u64,
        ready_at: Option<u64>,
    ) -> RecordStats {
        let now = self.host.now_nanos();
        self.record_into(hashes, pod, generation, (now, ready_at), &mut Vec::new())
    }

    /// [`OwnershipTable::record`], also appending to `not_ready` the hashes that count as the
    /// pod's only from a time still to come (what its answer's first bytes settle; a block
    /// it already holds needs nothing, so a repeated prompt's answer reads nothing). `at`: the
    /// router clock now (the caller's one read per prompt: its blocks age together) and the
    /// optional ready time.
    pub fn record_into(
        &self,
        hashes: &[BlockHash],
        pod: &str,
        generation: u64,
        at: (u64, Option<u64>),
        not_ready: &mut Vec<BlockHash>,
    ) -> RecordStats {
        let mut stats = RecordStats::default();
        let (now, ready_at) = at;
        let stamp = ready_at.unwrap_or(now);
        for &h in hashes {
            let b = self.layout.bucket(h);
            // the first attempt may use this decision's earlier read; a lost race re-reads
            let mut outcome = SetOutcome::Failed;
            for attempt in 0..2 {
                let earlier = if attempt == 0 {
                    self.seen.borrow().get(&b).cloned()
                } else {
                    None
                };
                // a key that did not exist cannot be written with compare-and-swap (Envoy
                // inserts last-writer-wins), so only an existing bucket's read is reused
                let (mut ways, cas) = match earlier {
                    Some((ways, Some(cas))) => (ways, Some(cas)),
                    _ => self.fetch(b),
                };
                let i = pick_way(h, pod, &ways);
                let old = ways[i].take();
                if let Some(e) = old.as_ref().filter(|e| {
                    e.hash == h && e.pod == pod && e.generation == generation && e.stamp <= stamp
                }) {
                    if e.stamp > now {
                        not_ready.push(h);
                    }
                    outcome = SetOutcome::Written;
                    break; // already recorded, and ready no later
                }
                ways[i] = Some(Entry {
                    hash: h,
                    stamp,
                    generation,
                    pod: pod.to_owned(),
                });
                outcome = self.write(b, &ways, cas);
                if outcome == SetOutcome::Written {
                    stats.written += 1;
                    if stamp > now {
                        not_ready.push(h);
                    }
                    match old {
                        Some(e) if e.hash != h => stats.replaced += 1,
                        None => stats.filled += 1,
                        _ => {}
                    }
                    break;
                }
                if outcome == SetOutcome::Failed {
                    break;
                }
            }
            if outcome != SetOutcome::Written {
                stats.conflicts += 1;
            }
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fake::FakeHost;

    #[test]
    fn record_lookup_remove() {
        let host = FakeHost::default();
        let layout = TableLayout::new("t", 1024);
        let t = OwnershipTable::new(&host, &layout);
        let hs: Vec<BlockHash> = (1..=5).map(|i| BlockHash(i * 1_000_003)).collect();
        let owner = |h| t.owner(h).map(|e| (e.pod, e.generation));
        assert_eq!(owner(hs[0]), None);
        let s = t.record(&hs, "127.0.0.1:1", 0, None);
        assert_eq!((s.written, s.filled), (5, 5));
        assert!(hs
            .iter()
            .all(|&h| owner(h) == Some(("127.0.0.1:1".into(), 0))));
        // re-recording the same owner writes nothing; a new generation replaces its entry;
        // other pods become more owners, and a fifth replaces the oldest of the four
        assert_eq!(t.record(&hs, "127.0.0.1:1", 0, None).written, 0);
        assert_eq!(t.record(&hs[1..2], "127.0.0.1:1", 7, None).written, 1);
        assert_eq!(owner(hs[1]), Some(("127.0.0.1:1".into(), 7)));
        assert_eq!(t.record(&hs[..1], "127.0.0.1:2", 0, None).written, 1);
        assert_eq!(owner(hs[0]), Some(("127.0.0.1:2".into(), 0)), "newest");
        let pods = |h| {
            let mut v: Vec<String> = t.owners(h).into_iter().flatten().map(|e| e.pod).collect();
            v.sort();
            v
        };
        assert_eq!(pods(hs[0]), ["127.0.0.1:1", "127.0.0.1:2"]);
        for p in ["127.0.0.1:3", "127.0.0.1:4"] {
            assert_eq!(t.record(&hs[..1], p, 0, None).written, 1);
        }
        assert_eq!(pods(hs[0]).len(), 4);
        assert_eq!(t.record(&hs[..1], "127.0.0.1:5", 0, None).written, 1);
        assert_eq!(
            pods(hs[0]),
            ["127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4", "127.0.0.1:5"]
        );
        // removal only forgets the named pod's entries
        assert_eq!(t.remove(&hs[..2], "127.0.0.1:1"), 1);
        assert_eq!(owner(hs[1]), None);
        assert_eq!(t.remove(&hs[..1], "127.0.0.1:3"), 1);
        assert_eq!(pods(hs[0]), ["127.0.0.1:2", "127.0.0.1:4", "127.0.0.1:5"]);
    }

    #[test]
    fn bounded_and_oldest_replaced() {
        let host = FakeHost::default();
        let layout = TableLayout::new("t", 16);
        let t = OwnershipTable::new(&host, &layout);
        let key = |i: u64| BlockHash(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut replaced = 0;
        for i in 0..1000u64 {
            replaced += t.record(&[key(i)], "127.0.0.1:1", 0, None).replaced;
        }
        assert!(
            host.data.borrow().len() as u64 <= layout.buckets(),
            "never more keys than buckets"
        );
        assert!(replaced > 900);
        // the newest block is always findable
        assert_eq!(
            t.owner(key(999)).map(|e| e.pod).as_deref(),
            Some("127.0.0.1:1")
        );
    }

    #[test]
    fn one_read_per_block_per_decision() {
        let host = FakeHost::default();
        let layout = TableLayout::new("t", 1 << 16);
        let hs: Vec<BlockHash> = (1..=16).map(|i| BlockHash(i * 0x9E37_79B9)).collect();
        // a cold prompt on buckets that never existed: read again right before each write
        // (no compare-and-swap protects a new key), written once
        let cold = OwnershipTable::new(&host, &layout);
        assert!(hs.iter().all(|&h| cold.owners(h) == EMPTY));
        assert_eq!(cold.record(&hs, "127.0.0.1:1", 0, None).written, 16);
        assert_eq!(host.shared_calls(), (32, 16));
        // the same prompt again (a fresh decision): the lookup's reads serve the record,
        // which has nothing to write
        let warm = OwnershipTable::new(&host, &layout);
        assert!(hs.iter().all(|&h| warm.owners(h)[0].is_some()));
        assert_eq!(warm.record(&hs, "127.0.0.1:1", 0, None).written, 0);
        assert_eq!(host.shared_calls(), (48, 16));
        // a second pod joins as an owner: existing buckets, so one read and one write each
        let other = OwnershipTable::new(&host, &layout);
        assert!(hs.iter().all(|&h| other.owners(h)[1].is_none()));
        assert_eq!(other.record(&hs, "127.0.0.1:2", 0, None).written, 16);
        assert_eq!(host.shared_calls(), (64, 32));
        // recording without a lookup (the poller applying events): one read per block
        let fresh: Vec<BlockHash> = (17..=24).map(|i| BlockHash(i * 0x9E37_79B9)).collect();
        assert_eq!(
            OwnershipTable::new(&host, &layout)
                .record(&fresh, "127.0.0.1:1", 0, None)
                .written,
            8
        );
        assert_eq!(host.shared_calls(), (72, 40));
    }

    #[test]
    fn a_lost_race_is_retried_on_a_fresh_read() {
        let host = FakeHost::default();
        let layout = TableLayout::new("t", 64);
        let mine = OwnershipTable::new(&host, &layout);
        let h = BlockHash(5);
        let pods = |h| {
            let mut v: Vec<String> = OwnershipTable::new(&host, &layout)
                .owners(h)
                .into_iter()
                .flatten()
                .map(|e| e.pod)
                .collect();
            v.sort();
            v
        };
        // the bucket did not exist at our lookup; another worker creates it before we record
        assert_eq!(mine.owners(h), EMPTY);
        OwnershipTable::new(&host, &layout).record(&[h], "127.0.0.1:2", 0, None);
        let s = mine.record(&[h], "127.0.0.1:1", 0, None);
        assert_eq!((s.written, s.conflicts), (1, 0));
        assert_eq!(pods(h), ["127.0.0.1:1", "127.0.0.1:2"], "both owners kept");
        // the bucket existed at our lookup and changed before we record: CAS fails, retry
        let g = BlockHash(6);
        for p in ["127.0.0.1:3", "127.0.0.1:4", "127.0.0.1:5"] {
            OwnershipTable::new(&host, &layout).record(&[g], p, 0, None);
        }
        let mine = OwnershipTable::new(&host, &layout);
        assert!(mine.owners(g)[0].is_some());
        OwnershipTable::new(&host, &layout).record(&[g], "127.0.0.1:2", 0, None);
        let s = mine.record(&[g], "127.0.0.1:1", 0, None);
        assert_eq!((s.written, s.conflicts), (1, 0));
        assert_eq!(
            pods(g),
            ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:4", "127.0.0.1:5"],
            "the oldest owner (3) is replaced, the concurrent one (2) kept"
        );
    }

    #[test]
    fn cas_conflict_is_counted_not_lost_silently() {
        struct Racy(FakeHost);
        impl Store for Racy {
            fn shared_get(&self, k: &str) -> Option<(Vec<u8>, Option<u32>)> {
                self.0.shared_get(k)
            }
            fn shared_set(&self, k: &str, v: &[u8], cas: Option<u32>) -> SetOutcome {
                // another worker writes between our read and our write
                self.0
                    .shared_set(k, b"interleaved-garbage-from-elsewhere", None);
                self.0.shared_set(k, v, cas)
            }
            fn now_nanos(&self) -> u64 {
                self.0.now_nanos()
            }
        }
        let host = Racy(FakeHost::default());
        let layout = TableLayout::new("t", 64);
        let t = OwnershipTable::new(&host, &layout);
        // creates the key (no CAS on new keys)
        t.record(&[BlockHash(7)], "127.0.0.1:1", 0, None);
        // a new generation rewrites that existing key, racing the other worker
        let s = t.record(&[BlockHash(7)], "127.0.0.1:1", 1, None);
        assert_eq!(s.conflicts, 1);
    }

    #[test]
    fn a_pending_entry_becomes_ready_at_the_earlier_time() {
        let host = FakeHost::default();
        let layout = TableLayout::new("t", 64);
        let t = OwnershipTable::new(&host, &layout);
        let h = BlockHash(42);
        let stamp = |t: &OwnershipTable<'_, FakeHost>| t.owner(h).map(|e| e.stamp);
        let now = host.now_nanos();
        assert_eq!(t.record(&[h], "127.0.0.1:1", 0, Some(now + 500)).written, 1);
        assert_eq!(
            stamp(&t),
            Some(now + 500),
            "pending: ready when the prefill ends"
        );
        assert_eq!(
            t.record(&[h], "127.0.0.1:1", 0, Some(now + 900)).written,
            0,
            "a later prediction does not postpone it"
        );
        let fresh = OwnershipTable::new(&host, &layout);
        assert_eq!(
            fresh.record(&[h], "127.0.0.1:1", 0, None).written,
            1,
            "the pod's own event makes it ready now"
        );
        assert!(stamp(&fresh).is_some_and(|s| s <= host.now_nanos()));
        assert_eq!(fresh.record(&[h], "127.0.0.1:1", 0, None).written, 0);
    }
}
